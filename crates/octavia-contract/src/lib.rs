//! octavia-contract: one behavioural suite for the Octavia v2 API, run against the emulator and a real Octavia.
//!
//! The suite only gets a base URL (noauth). Every case works in its own project (`ct-<random>`; resource names carry the case); its
//! load balancers are cascade-deleted and its quota reset afterwards whether it passed or not. The real Octavia
//! (19.0.0, provider `amphora` on noop drivers, `scripts/octavia-lab/`) is the truth; the emulator has to match.

mod cases;
mod ctx;
pub mod env;

use std::time::Duration;

pub use cases::all_cases;
pub use contract_harness::{CaseContext, CaseOutcome, SuiteOptions, SuiteReport};
pub use ctx::Ctx;

/// One behavioural case of this suite.
pub type Case = contract_harness::Case<Ctx>;

/// The suite's prefix in summary lines: `contract-octavia[<target>]: N passed, M failed`.
pub const SUITE: &str = "contract-octavia";

/// Options for this suite: the lab's single worker provisions one flow at a time per load
/// balancer, so few cases at once.
pub fn default_options() -> SuiteOptions {
    SuiteOptions {
        concurrency: 3,
        case_timeout: Duration::from_secs(120),
        ..SuiteOptions::default()
    }
}

impl CaseContext for Ctx {
    fn new(base_url: &str, case: &'static str) -> anyhow::Result<Self> {
        Ctx::new(base_url, case)
    }

    async fn sweep(&self) -> Vec<String> {
        Ctx::sweep(self).await
    }
}

/// Run every selected case against `base_url` (e.g. `http://127.0.0.1:9876`, API under `/v2`).
pub async fn run_suite(target: &str, base_url: &str, opts: &SuiteOptions) -> SuiteReport {
    contract_harness::run_suite(SUITE, target, base_url, all_cases(), opts).await
}
