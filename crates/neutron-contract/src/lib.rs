//! neutron-contract: one behavioural suite for the Neutron API, run against the emulator and a real neutron-server.
//!
//! The suite only gets a base URL (noauth). Every case runs in its own project (`contract-<case>-<random>`), creates
//! its own network/subnet, and the project is swept afterwards whether the case passed or not. The real server is
//! the truth: a case asserts what neutron-server 29.0.0 does, and the emulator has to match.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let report = neutron_contract::run_suite("neutron-server", "http://127.0.0.1:9696", &Default::default()).await;
//! println!("{}", report.summary());
//! # Ok(()) }
//! ```

mod cases;
mod ctx;
pub mod env;

pub use cases::all_cases;
pub use contract_harness::{CaseContext, CaseOutcome, SuiteOptions, SuiteReport};
pub use ctx::Ctx;

/// One behavioural case of this suite.
pub type Case = contract_harness::Case<Ctx>;

/// The suite's prefix in summary lines: `contract[<target>]: N passed, M failed`.
pub const SUITE: &str = "contract";

impl CaseContext for Ctx {
    fn new(base_url: &str, case: &'static str) -> anyhow::Result<Self> {
        Ctx::new(base_url, case)
    }

    async fn sweep(&self) -> Vec<String> {
        Ctx::sweep(self).await
    }
}

/// Run every selected case against `base_url` (e.g. `http://127.0.0.1:9696`, API under `/v2.0`).
pub async fn run_suite(target: &str, base_url: &str, opts: &SuiteOptions) -> SuiteReport {
    contract_harness::run_suite(SUITE, target, base_url, all_cases(), opts).await
}
