//! octavia-contract: one behavioural suite for the Octavia v2 API, run against the emulator and a real Octavia.
//!
//! The suite only gets a base URL (noauth). Every case works in its own project (`ct-<random>`; resource names carry the case); its
//! load balancers are cascade-deleted and its quota reset afterwards whether it passed or not. The real Octavia
//! (19.0.0, provider `amphora` on noop drivers, `scripts/octavia-lab/`) is the truth; the emulator has to match.

mod cases;
mod ctx;
pub mod env;

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::StreamExt;

pub use cases::all_cases;
pub use ctx::Ctx;

pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + 'a>>;

#[derive(Clone, Copy)]
pub struct Case {
    pub name: &'static str,
    pub run: for<'a> fn(&'a Ctx) -> CaseFuture<'a>,
}

#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Cases run at once. The lab's single worker provisions one flow at a time per load balancer: keep it small.
    pub concurrency: usize,
    /// Run only cases whose name contains one of these substrings (empty = all).
    pub only: Vec<String>,
    pub case_timeout: Duration,
}

impl Default for SuiteOptions {
    fn default() -> Self {
        Self {
            concurrency: 3,
            only: Vec::new(),
            case_timeout: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, Clone)]
pub struct CaseOutcome {
    pub name: &'static str,
    pub result: Result<(), String>,
    pub duration: Duration,
    pub cleanup_errors: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct SuiteReport {
    pub target: String,
    pub outcomes: Vec<CaseOutcome>,
    pub duration: Duration,
}

impl SuiteReport {
    pub fn passed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.result.is_ok()).count()
    }

    pub fn failed(&self) -> usize {
        self.outcomes.len() - self.passed()
    }

    /// `contract-octavia[<target>]: N passed, M failed`
    pub fn summary(&self) -> String {
        format!(
            "contract-octavia[{}]: {} passed, {} failed",
            self.target,
            self.passed(),
            self.failed()
        )
    }

    pub fn failures(&self) -> Vec<String> {
        self.outcomes
            .iter()
            .filter_map(|o| o.result.as_ref().err().map(|e| format!("  FAIL {}: {e}", o.name)))
            .collect()
    }
}

/// Run every selected case against `base_url` (e.g. `http://127.0.0.1:9876`, API under `/v2`).
pub async fn run_suite(target: &str, base_url: &str, opts: &SuiteOptions) -> anyhow::Result<SuiteReport> {
    let started = Instant::now();
    let cases: Vec<Case> = all_cases()
        .into_iter()
        .filter(|c| opts.only.is_empty() || opts.only.iter().any(|o| c.name.contains(o.as_str())))
        .collect();
    let mut outcomes: Vec<CaseOutcome> = futures::stream::iter(cases)
        .map(|case| run_case(case, base_url, opts.case_timeout))
        .buffer_unordered(opts.concurrency.max(1))
        .collect()
        .await;
    let order: Vec<&str> = all_cases().iter().map(|c| c.name).collect();
    outcomes.sort_by_key(|o| order.iter().position(|n| *n == o.name));
    Ok(SuiteReport {
        target: target.to_owned(),
        outcomes,
        duration: started.elapsed(),
    })
}

pub async fn run_case(case: Case, base_url: &str, timeout: Duration) -> CaseOutcome {
    let started = Instant::now();
    let ctx = match Ctx::new(base_url, case.name) {
        Ok(c) => c,
        Err(e) => {
            return CaseOutcome {
                name: case.name,
                result: Err(format!("cannot build client: {e:#}")),
                duration: started.elapsed(),
                cleanup_errors: Vec::new(),
            };
        }
    };
    let result = match tokio::time::timeout(timeout, (case.run)(&ctx)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(_) => Err(format!("timed out after {timeout:?}")),
    };
    let duration = started.elapsed();
    let cleanup_errors = ctx.sweep().await;
    CaseOutcome {
        name: case.name,
        result,
        duration,
        cleanup_errors,
    }
}
