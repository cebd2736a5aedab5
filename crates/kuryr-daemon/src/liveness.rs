//! `/alive`: whether the kubelet should restart the daemon. As upstream, a daemon whose ADD and
//! DEL requests keep failing (`[cni_daemon] cni_failures_count`) or whose memory is over
//! `[cni_health_server] max_memory_usage` (MiB) is not alive. Unlike upstream, the failures are
//! consecutive internal ones: a success starts the count again, and a caller's bad request,
//! a pod gone or a timeout waiting for the controller count for nothing, so that a few
//! failures spread over weeks restart nobody.

use std::sync::atomic::{AtomicU32, Ordering};

/// The liveness state, shared by the API's routes and `/alive`.
#[derive(Debug)]
pub struct Liveness {
    /// Consecutive internal failures before `/alive` fails; 0 never fails on them.
    failures_limit: u32,
    /// MiB of resident memory over which `/alive` fails.
    max_memory_mib: Option<u64>,
    failures: AtomicU32,
}

impl Liveness {
    pub fn new(failures_limit: u32, max_memory_mib: Option<u64>) -> Self {
        Self {
            failures_limit,
            max_memory_mib,
            failures: AtomicU32::new(0),
        }
    }

    /// An ADD or DEL answered: a success starts the count again, a failure on the daemon's side
    /// (500) counts, any other failure (the caller's, a pod gone, a wait) leaves it as it is.
    pub fn record<T>(&self, result: &Result<T, crate::api::DaemonError>) {
        match result {
            Ok(_) => self.failures.store(0, Ordering::Relaxed),
            Err(crate::api::DaemonError::Internal(_)) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }

    /// Why the daemon is not alive, if it is not: `rss_mib` is its resident memory now.
    pub fn verdict(&self, rss_mib: Option<u64>) -> Option<String> {
        let failures = self.failures.load(Ordering::Relaxed);
        if self.failures_limit > 0 && failures >= self.failures_limit {
            return Some(format!(
                "{failures} ADD/DEL requests in a row failed ([cni_daemon] cni_failures_count = {})",
                self.failures_limit
            ));
        }
        match (self.max_memory_mib, rss_mib) {
            (Some(max), Some(rss)) if rss > max => Some(format!(
                "{rss} MiB resident, over [cni_health_server] max_memory_usage = {max}"
            )),
            _ => None,
        }
    }
}

/// This process' resident memory in MiB (`VmRSS` of /proc/self/status).
pub fn rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_internal_failures_and_memory_decide() {
        use crate::api::DaemonError;
        let failed = || Err::<(), _>(DaemonError::Internal("x".into()));
        let l = Liveness::new(3, Some(100));
        assert_eq!(l.verdict(Some(10)), None);
        l.record(&failed());
        l.record(&failed());
        l.record(&Ok(()));
        l.record(&failed());
        l.record(&failed());
        l.record(&Err::<(), _>(DaemonError::BadParams("x".into())));
        assert_eq!(l.verdict(Some(10)), None, "a success starts the count again");
        l.record(&failed());
        let why = l
            .verdict(Some(10))
            .expect("three in a row, a bad request not between");
        assert!(why.contains("cni_failures_count = 3"), "{why}");
        l.record(&Ok(()));
        assert_eq!(l.verdict(Some(10)), None);
        let why = l.verdict(Some(101)).expect("over the memory limit");
        assert!(why.contains("max_memory_usage = 100"), "{why}");
        let unlimited = Liveness::new(0, None);
        for _ in 0..10 {
            unlimited.record(&failed());
        }
        assert_eq!(unlimited.verdict(Some(u64::MAX)), None);
        assert!(rss_mib().is_some_and(|m| m > 0));
    }
}
