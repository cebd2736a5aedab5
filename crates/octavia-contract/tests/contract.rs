//! The Octavia contract suite against every available target (harness = false):
//! - `emulator`: the Octavia emulator. Its crate (`crates/octavia-emulator`) is written on another branch; until it
//!   is in this workspace the target runs against an emulator started elsewhere when
//!   `KURYR_TEST_OCTAVIA_EMULATOR_URL` is set, and is skipped with that reason otherwise (see [`emulator`]);
//! - `octavia`: the real Octavia at `KURYR_TEST_OCTAVIA_URL` (skipped with a reason when unset, a failure when
//!   `KURYR_TEST_REQUIRE_OCTAVIA=1`).
//!
//! Env: `KURYR_CONTRACT_TARGETS=emulator,octavia` (default both), `KURYR_CONTRACT_CONCURRENCY` (default 3).
//! Positional args select cases by substring: `cargo test -p octavia-contract --test contract -- batch`.

use std::collections::BTreeSet;
use std::process::ExitCode;

use octavia_contract::{SuiteOptions, SuiteReport, run_suite};

/// The adapter between the suite and the emulator: where it listens. The one place to change when
/// `crates/octavia-emulator` joins the workspace: start it in-process here, as neutron-contract does, with
/// `OctaviaOptions { latency: LatencyProfile::AmphoraNoop, .. }` - with the `Instant` profile nothing is ever
/// PENDING_* and the 409 case cannot hold.
mod emulator {
    pub const URL_VAR: &str = "KURYR_TEST_OCTAVIA_EMULATOR_URL";

    pub struct Running {
        pub url: String,
    }

    /// `Ok(None)` = skip (with the printed reason), `Err` = cannot run.
    pub async fn start() -> Result<Option<Running>, String> {
        match std::env::var(URL_VAR).ok().filter(|u| !u.trim().is_empty()) {
            Some(url) => Ok(Some(Running { url })),
            None => Ok(None),
        }
    }

    pub fn skip_reason() -> String {
        format!(
            "crates/octavia-emulator is not in this workspace yet and {URL_VAR} is unset (point it at a running \
             emulator to check it)"
        )
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
                Ok(Some(emu)) => failed |= run_target("emulator", &emu.url, &opts).await,
                Ok(None) => println!("contract-octavia[emulator]: skipped: {}", emulator::skip_reason()),
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
