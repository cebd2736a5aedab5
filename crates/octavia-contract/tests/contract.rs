//! The Octavia contract suite against every available target (harness = false):
//! - `emulator`: the in-repo Octavia emulator (`crates/octavia-emulator`), started in-process;
//! - `octavia`: the real Octavia at `KURYR_TEST_OCTAVIA_URL` (skipped with a reason when unset, a failure when
//!   `KURYR_TEST_REQUIRE_OCTAVIA=1`).
//!
//! Env: `KURYR_CONTRACT_TARGETS=emulator,octavia` (default both), `KURYR_CONTRACT_CONCURRENCY` (default 3).
//! Positional args select cases by substring: `cargo test -p octavia-contract --test contract -- batch`.

use std::collections::BTreeSet;
use std::process::ExitCode;

use octavia_contract::{SuiteOptions, SuiteReport, run_suite};

/// The emulator, started in-process with the latency of the real noop-amphora Octavia (with no
/// latency nothing is ever PENDING_* and the immutability case could not hold).
mod emulator {
    use octavia_emulator::{OctaviaEmulator, OctaviaHandle, OctaviaOptions};

    pub async fn start() -> Result<OctaviaHandle, String> {
        OctaviaEmulator::start(OctaviaOptions::amphora_noop())
            .await
            .map_err(|e| e.to_string())
    }
}

fn print_report(r: &SuiteReport) {
    for o in &r.outcomes {
        let verdict = if o.result.is_ok() { "ok  " } else { "FAIL" };
        println!("  {verdict} {:<60} {:>7.2}s", o.name, o.duration.as_secs_f64());
        for c in &o.cleanup_errors {
            println!("       cleanup: {c}");
        }
    }
    println!("{}  ({:.1}s)", r.summary(), r.duration.as_secs_f64());
    for f in r.failures() {
        println!("{f}");
    }
}

async fn run_target(name: &str, url: &str, opts: &SuiteOptions) -> bool {
    match run_suite(name, url, opts).await {
        Ok(r) => {
            print_report(&r);
            r.failed() > 0
        }
        Err(e) => {
            println!("contract-octavia[{name}]: suite error: {e:#}");
            true
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let targets: BTreeSet<String> = std::env::var("KURYR_CONTRACT_TARGETS")
        .unwrap_or_else(|_| "emulator,octavia".into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    let concurrency = match std::env::var("KURYR_CONTRACT_CONCURRENCY")
        .ok()
        .map(|v| v.parse::<usize>())
    {
        None => 3,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("KURYR_CONTRACT_CONCURRENCY must be a positive integer");
            return ExitCode::FAILURE;
        }
    };
    let opts = SuiteOptions {
        concurrency,
        only: args,
        ..SuiteOptions::default()
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let failed = rt.block_on(async {
        let mut failed = false;
        if !targets.contains("emulator") {
            println!("contract-octavia[emulator]: skipped (not in KURYR_CONTRACT_TARGETS)");
        } else {
            match emulator::start().await {
                Ok(emu) => failed |= run_target("emulator", &emu.url(), &opts).await,
                Err(e) => {
                    println!("contract-octavia[emulator]: cannot start the emulator: {e}");
                    failed = true;
                }
            }
        }
        if !targets.contains("octavia") {
            println!("contract-octavia[octavia]: skipped (not in KURYR_CONTRACT_TARGETS)");
        } else {
            match octavia_contract::env::real_octavia_url() {
                Ok(Some(url)) => failed |= run_target("octavia", &url, &opts).await,
                Ok(None) => println!(
                    "contract-octavia[octavia]: skipped: {}",
                    octavia_contract::env::skip_reason()
                ),
                Err(e) => {
                    println!("contract-octavia[octavia]: FAILED: {e}");
                    failed = true;
                }
            }
        }
        failed
    });
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
