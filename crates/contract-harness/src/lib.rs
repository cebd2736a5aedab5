//! contract-harness: the runner shared by the API contract suites (`neutron-contract`,
//! `octavia-contract`). A suite is a list of [`Case`]s over its own context type; the runner gives
//! every case a fresh context (its own project), a time limit, and a sweep afterwards whether it
//! passed or not, runs cases concurrently and reports `<suite>[<target>]: N passed, M failed` -
//! the line `scripts/check-contract-summary.sh` compares between the emulator and the real server.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::StreamExt;

pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + 'a>>;

/// What a suite's per-case context must do: be built for one case against a base URL, and
/// delete everything the case created afterwards.
pub trait CaseContext: Sized + Send + Sync {
    fn new(base_url: &str, case: &'static str) -> anyhow::Result<Self>;

    /// Deletes what the case created; returns what could not be deleted (reported, not a
    /// failure of the case).
    fn sweep(&self) -> impl Future<Output = Vec<String>> + Send;
}

/// One behavioural case.
pub struct Case<C> {
    pub name: &'static str,
    pub run: for<'a> fn(&'a C) -> CaseFuture<'a>,
}

impl<C> Clone for Case<C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for Case<C> {}

#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Cases run at once (each in its own project). The real servers are CPU-bound on 2 cores:
    /// keep it small.
    pub concurrency: usize,
    /// Run only cases whose name contains one of these substrings (empty = all).
    pub only: Vec<String>,
    /// Per-case time limit (cleanup not included).
    pub case_timeout: Duration,
}

impl Default for SuiteOptions {
    fn default() -> Self {
        Self {
            concurrency: 2,
            only: Vec::new(),
            case_timeout: Duration::from_secs(180),
        }
    }
}

#[derive(Debug, Clone)]
pub struct CaseOutcome {
    pub name: &'static str,
    /// `Err` holds the failure message.
    pub result: Result<(), String>,
    pub duration: Duration,
    /// Resources the sweep could not delete (reported, not a failure of the case).
    pub cleanup_errors: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct SuiteReport {
    /// The suite's prefix in summary lines (`contract`, `contract-octavia`).
    pub suite: &'static str,
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

    /// `<suite>[<target>]: N passed, M failed`
    pub fn summary(&self) -> String {
        format!(
            "{}[{}]: {} passed, {} failed",
            self.suite,
            self.target,
            self.passed(),
            self.failed()
        )
    }

    /// Failures, one per line: `  FAIL <case>: <message>`.
    pub fn failures(&self) -> Vec<String> {
        self.outcomes
            .iter()
            .filter_map(|o| o.result.as_ref().err().map(|e| format!("  FAIL {}: {e}", o.name)))
            .collect()
    }

    /// Every case with its verdict and time, the summary line, then the failures.
    pub fn print(&self) {
        for o in &self.outcomes {
            let verdict = if o.result.is_ok() { "ok  " } else { "FAIL" };
            println!("  {verdict} {:<60} {:>7.2}s", o.name, o.duration.as_secs_f64());
            for c in &o.cleanup_errors {
                println!("       cleanup: {c}");
            }
        }
        println!("{}  ({:.1}s)", self.summary(), self.duration.as_secs_f64());
        for f in self.failures() {
            println!("{f}");
        }
    }
}

/// Runs every selected case of `cases` against `base_url`; the report keeps the cases' order.
pub async fn run_suite<C: CaseContext>(
    suite: &'static str,
    target: &str,
    base_url: &str,
    cases: Vec<Case<C>>,
    opts: &SuiteOptions,
) -> SuiteReport {
    let started = Instant::now();
    let order: Vec<&str> = cases.iter().map(|c| c.name).collect();
    let selected = cases
        .iter()
        .copied()
        .filter(|c| opts.only.is_empty() || opts.only.iter().any(|o| c.name.contains(o.as_str())));
    let mut outcomes: Vec<CaseOutcome> = futures::stream::iter(selected)
        .map(|case| run_case(case, base_url, opts.case_timeout))
        .buffer_unordered(opts.concurrency.max(1))
        .collect()
        .await;
    outcomes.sort_by_key(|o| order.iter().position(|n| *n == o.name));
    SuiteReport {
        suite,
        target: target.to_owned(),
        outcomes,
        duration: started.elapsed(),
    }
}

/// Runs one case in a fresh context and sweeps it afterwards.
pub async fn run_case<C: CaseContext>(case: Case<C>, base_url: &str, timeout: Duration) -> CaseOutcome {
    let started = Instant::now();
    let ctx = match C::new(base_url, case.name) {
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

/// What a suite's test binary reads from its command line and environment.
pub struct Invocation {
    /// `KURYR_CONTRACT_TARGETS` (comma list), or every target.
    pub targets: BTreeSet<String>,
    pub options: SuiteOptions,
}

impl Invocation {
    /// Positional arguments select cases by substring; `KURYR_CONTRACT_TARGETS` picks targets
    /// (default `all_targets`), `KURYR_CONTRACT_CONCURRENCY` the concurrency (default
    /// `options.concurrency`).
    pub fn from_env(all_targets: &[&str], options: SuiteOptions) -> Result<Self, String> {
        let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
        let targets = std::env::var("KURYR_CONTRACT_TARGETS")
            .unwrap_or_else(|_| all_targets.join(","))
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        let concurrency = match std::env::var("KURYR_CONTRACT_CONCURRENCY").ok() {
            None => options.concurrency,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => return Err("KURYR_CONTRACT_CONCURRENCY must be a positive integer".into()),
            },
        };
        Ok(Self {
            targets,
            options: SuiteOptions {
                concurrency,
                only,
                ..options
            },
        })
    }
}

/// Runs `body` on a multi-threaded runtime; its `true` means something failed.
pub fn run_main(body: impl Future<Output = bool>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) if !rt.block_on(body) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("cannot start tokio runtime: {e}");
            ExitCode::FAILURE
        }
    }
}
