//! Standalone neutron-emulator for the sandbox and scripts.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use neutron_emulator::{AgentHosts, Emulator, EmulatorOptions, LatencyProfile};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Latency {
    None,
    Real,
}

#[derive(Debug, Parser)]
#[command(
    name = "neutron-emulator",
    about = "Neutron v2.0 API emulator (test/sandbox only)"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9696", env = "NEUTRON_EMULATOR_LISTEN")]
    listen: SocketAddr,
    /// Latency profile: none, or the real server's measured medians.
    #[arg(long, value_enum, default_value = "none")]
    latency: Latency,
    /// Milliseconds between a port being bound and it turning ACTIVE.
    #[arg(long, default_value_t = 0)]
    active_delay_ms: u64,
    /// Serve at most N requests at once (the real uWSGI has 2 processes).
    #[arg(long)]
    workers: Option<usize>,
    /// Hosts with an L2 agent (repeatable); other hosts get binding_failed. Default: every host binds.
    #[arg(long = "agent-host")]
    agent_hosts: Vec<String>,
    /// Send `Connection: close` like the real uWSGI setup.
    #[arg(long)]
    connection_close: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let options = EmulatorOptions {
        listen: args.listen,
        latency: match args.latency {
            Latency::None => LatencyProfile::None,
            Latency::Real => LatencyProfile::RealServer,
        },
        active_delay: Duration::from_millis(args.active_delay_ms),
        workers: args.workers,
        agent_hosts: if args.agent_hosts.is_empty() {
            AgentHosts::Any
        } else {
            AgentHosts::Only(args.agent_hosts.into_iter().collect::<BTreeSet<_>>())
        },
        connection_close: args.connection_close,
        ..EmulatorOptions::default()
    };
    let emu = Emulator::start(options).await?;
    println!("neutron-emulator listening on {}", emu.url());
    // Scripts stop it with SIGTERM, terminals with Ctrl-C: both shut down gracefully.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    emu.shutdown().await;
    Ok(())
}
