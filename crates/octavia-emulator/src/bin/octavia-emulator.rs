//! Standalone octavia-emulator for the sandbox, scripts and running the contract suite by URL.

use std::net::SocketAddr;

use clap::{Parser, ValueEnum};
use octavia_emulator::{LatencyProfile, OctaviaEmulator, OctaviaOptions};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Latency {
    Instant,
    AmphoraNoop,
}

#[derive(Debug, Parser)]
#[command(
    name = "octavia-emulator",
    about = "Octavia v2 load-balancer API emulator (test/sandbox only)"
)]
struct Args {
    /// Address to listen on (Octavia's API port by default).
    #[arg(long, default_value = "127.0.0.1:9876", env = "OCTAVIA_EMULATOR_LISTEN")]
    listen: SocketAddr,
    /// Latency profile: instant, or modelled on Octavia with the amphora noop drivers.
    #[arg(long, value_enum, default_value = "instant")]
    latency: Latency,
    /// IPv4 network VIPs are allocated from when a request names no address, e.g. 10.0.0.0/16.
    #[arg(long, default_value = "10.0.0.0/16")]
    vip_cidr: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let (net, prefix) = args
        .vip_cidr
        .split_once('/')
        .ok_or_else(|| anyhow::anyhow!("--vip-cidr {}: expected ADDRESS/PREFIX", args.vip_cidr))?;
    let vip_network = net
        .parse()
        .map_err(|e| anyhow::anyhow!("--vip-cidr {}: bad IPv4 address: {e}", args.vip_cidr))?;
    let vip_prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| (8..=30).contains(p))
        .ok_or_else(|| anyhow::anyhow!("--vip-cidr {}: prefix must be 8..=30", args.vip_cidr))?;
    let options = OctaviaOptions {
        listen: args.listen,
        latency: match args.latency {
            Latency::Instant => LatencyProfile::Instant,
            Latency::AmphoraNoop => LatencyProfile::AmphoraNoop,
        },
        vip_network,
        vip_prefix,
        ..OctaviaOptions::default()
    };
    let emu = OctaviaEmulator::start(options).await?;
    println!("octavia-emulator listening on {}", emu.url());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    emu.shutdown().await;
    Ok(())
}
