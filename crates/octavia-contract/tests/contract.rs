//! The Octavia contract suite against every available target (harness = false):
//! - `emulator`: the in-repo Octavia emulator (`crates/octavia-emulator`), started in-process;
//! - `octavia`: the real Octavia at `KURYR_TEST_OCTAVIA_URL` (skipped with a reason when unset, a failure when
//!   `KURYR_TEST_REQUIRE_OCTAVIA=1`).
//!
//! Env: `KURYR_CONTRACT_TARGETS=emulator,octavia` (default both), `KURYR_CONTRACT_CONCURRENCY` (default 3).
//! Positional args select cases by substring: `cargo test -p octavia-contract --test contract -- batch`.

use std::process::ExitCode;

use contract_harness::{Invocation, run_main};
use octavia_contract::{SuiteReport, default_options, run_suite};

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

fn report(r: &SuiteReport) -> bool {
    r.print();
    r.failed() > 0
}

fn main() -> ExitCode {
    let inv = match Invocation::from_env(&["emulator", "octavia"], default_options()) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = inv.options;
    run_main(async move {
        let mut failed = false;
        if !inv.targets.contains("emulator") {
            println!("contract-octavia[emulator]: skipped (not in KURYR_CONTRACT_TARGETS)");
        } else {
            match emulator::start().await {
                Ok(emu) => failed |= report(&run_suite("emulator", &emu.url(), &opts).await),
                Err(e) => {
                    println!("contract-octavia[emulator]: cannot start the emulator: {e}");
                    failed = true;
                }
            }
        }
        if !inv.targets.contains("octavia") {
            println!("contract-octavia[octavia]: skipped (not in KURYR_CONTRACT_TARGETS)");
        } else {
            match octavia_contract::env::real_octavia_url() {
                Ok(Some(url)) => failed |= report(&run_suite("octavia", &url, &opts).await),
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
    })
}
