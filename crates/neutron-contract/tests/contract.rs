//! The contract suite against every available target (harness = false):
//! - `emulator`: `neutron_emulator::Emulator` started in-process, agents on k8s-node-1 and k8s-node-2;
//! - `neutron-server`: the real server at `KURYR_TEST_NEUTRON_URL` (skipped with a reason when unset, a failure when
//!   `KURYR_TEST_REQUIRE_NEUTRON=1`).
//!
//! Env: `KURYR_CONTRACT_TARGETS=emulator,neutron-server` (default both), `KURYR_CONTRACT_CONCURRENCY` (default 2).
//! Positional args select cases by substring: `cargo test -p neutron-contract --test contract -- trunk`.

use std::collections::BTreeSet;
use std::process::ExitCode;

use neutron_contract::{SuiteOptions, SuiteReport, run_suite};
use neutron_emulator::{AgentHosts, Emulator, EmulatorOptions};

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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let targets: BTreeSet<String> = std::env::var("KURYR_CONTRACT_TARGETS")
        .unwrap_or_else(|_| "emulator,neutron-server".into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    let concurrency = match std::env::var("KURYR_CONTRACT_CONCURRENCY")
        .ok()
        .map(|v| v.parse::<usize>())
    {
        None => 2,
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
        if targets.contains("emulator") {
            let emu_opts = EmulatorOptions {
                agent_hosts: AgentHosts::Only(["k8s-node-1", "k8s-node-2"].map(String::from).into()),
                ..EmulatorOptions::default()
            };
            match Emulator::start(emu_opts).await {
                Ok(emu) => {
                    match run_suite("emulator", &emu.url(), &opts).await {
                        Ok(r) => {
                            print_report(&r);
                            failed |= r.failed() > 0;
                        }
                        Err(e) => {
                            println!("contract[emulator]: suite error: {e:#}");
                            failed = true;
                        }
                    }
                    emu.shutdown().await;
                }
                Err(e) => {
                    println!("contract[emulator]: cannot start the emulator: {e:#}");
                    failed = true;
                }
            }
        } else {
            println!("contract[emulator]: skipped (not in KURYR_CONTRACT_TARGETS)");
        }
        if !targets.contains("neutron-server") {
            println!("contract[neutron-server]: skipped (not in KURYR_CONTRACT_TARGETS)");
        } else {
            match neutron_contract::env::real_neutron_url() {
                Ok(Some(url)) => match run_suite("neutron-server", &url, &opts).await {
                    Ok(r) => {
                        print_report(&r);
                        failed |= r.failed() > 0;
                    }
                    Err(e) => {
                        println!("contract[neutron-server]: suite error: {e:#}");
                        failed = true;
                    }
                },
                Ok(None) => println!(
                    "contract[neutron-server]: skipped: {}",
                    neutron_contract::env::skip_reason()
                ),
                Err(e) => {
                    println!("contract[neutron-server]: FAILED: {e}");
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
