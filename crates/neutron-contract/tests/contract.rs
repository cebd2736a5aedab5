//! The contract suite against every available target (harness = false):
//! - `emulator`: `neutron_emulator::Emulator` started in-process, agents on k8s-node-1, k8s-node-2 and
//!   k8s-node-hybrid (whose OVS agent plugs the hybrid way), as the lab's fake agent registers them;
//! - `neutron-server`: the real server at `KURYR_TEST_NEUTRON_URL` (skipped with a reason when unset, a failure when
//!   `KURYR_TEST_REQUIRE_NEUTRON=1`).
//!
//! Env: `KURYR_CONTRACT_TARGETS=emulator,neutron-server` (default both), `KURYR_CONTRACT_CONCURRENCY` (default 2).
//! Positional args select cases by substring: `cargo test -p neutron-contract --test contract -- trunk`.

use std::process::ExitCode;

use contract_harness::{Invocation, run_main};
use neutron_contract::{SuiteOptions, SuiteReport, run_suite};
use neutron_emulator::{AgentHosts, Emulator, EmulatorOptions};

fn report(r: &SuiteReport) -> bool {
    r.print();
    r.failed() > 0
}

fn main() -> ExitCode {
    let inv = match Invocation::from_env(&["emulator", "neutron-server"], SuiteOptions::default()) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = inv.options;
    run_main(async move {
        let mut failed = false;
        if inv.targets.contains("emulator") {
            let emu_opts = EmulatorOptions {
                agent_hosts: AgentHosts::Only(
                    ["k8s-node-1", "k8s-node-2", "k8s-node-hybrid"]
                        .map(String::from)
                        .into(),
                ),
                hybrid_plug_hosts: ["k8s-node-hybrid".to_string()].into(),
                ..EmulatorOptions::default()
            };
            match Emulator::start(emu_opts).await {
                Ok(emu) => {
                    failed |= report(&run_suite("emulator", &emu.url(), &opts).await);
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
        if !inv.targets.contains("neutron-server") {
            println!("contract[neutron-server]: skipped (not in KURYR_CONTRACT_TARGETS)");
        } else {
            match neutron_contract::env::real_neutron_url() {
                Ok(Some(url)) => failed |= report(&run_suite("neutron-server", &url, &opts).await),
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
    })
}
