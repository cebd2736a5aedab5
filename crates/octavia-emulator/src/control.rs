//! Latency profiles, fault injection and per-operation statistics.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::WorkerDelays;

/// How slow the emulator is: API answer time per operation plus the controller worker's time to ACTIVE.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "profile")]
pub enum LatencyProfile {
    /// Answers at once and everything is ACTIVE at once (the next request already sees it).
    #[default]
    Instant,
    /// Modelled on Octavia with the amphora noop drivers: a load balancer is ACTIVE ~1.5 s after its create,
    /// listener/pool/member changes take 0.3-0.5 s.
    AmphoraNoop,
    Custom {
        #[serde(default)]
        api_ms: BTreeMap<String, u64>,
        #[serde(default)]
        worker: WorkerDelays,
    },
}

impl LatencyProfile {
    pub fn worker(&self) -> WorkerDelays {
        match self {
            LatencyProfile::Instant => WorkerDelays::default(),
            LatencyProfile::AmphoraNoop => WorkerDelays {
                lb_create_ms: 1500,
                lb_update_ms: 400,
                lb_delete_ms: 800,
                child_create_ms: 500,
                child_update_ms: 300,
                child_delete_ms: 400,
            },
            LatencyProfile::Custom { worker, .. } => *worker,
        }
    }

    /// API answer time of `op`: exact name, then `<resource>.*`, then `*.<action>`, then `*`.
    pub fn api_delay(&self, op: &str) -> Duration {
        let table: BTreeMap<String, u64> = match self {
            LatencyProfile::Instant => return Duration::ZERO,
            LatencyProfile::AmphoraNoop => [
                ("*.list", 40),
                ("*.get", 20),
                ("*.create", 90),
                ("*.update", 60),
                ("*.delete", 50),
                ("*", 20),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            LatencyProfile::Custom { api_ms, .. } => api_ms.clone(),
        };
        let (res, action) = op.split_once('.').unwrap_or((op, ""));
        let ms = table
            .get(op)
            .or_else(|| table.get(&format!("{res}.*")))
            .or_else(|| table.get(&format!("*.{action}")))
            .or_else(|| table.get("*"))
            .copied()
            .unwrap_or(0);
        Duration::from_millis(ms)
    }
}

/// One injected fault: matching calls fail with `status` (and/or wait `delay_ms` first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRule {
    /// `loadbalancer.create`, `member.*`, `*.delete` or `*`.
    pub operation: String,
    /// HTTP status of the failure; `None` only delays.
    #[serde(default)]
    pub status: Option<u16>,
    /// Fail only the next N matching calls; `None` = every one.
    #[serde(default)]
    pub count: Option<u64>,
    #[serde(default)]
    pub delay_ms: u64,
}

impl FaultRule {
    pub fn matches(&self, op: &str) -> bool {
        if self.operation == "*" || self.operation == op {
            return true;
        }
        match (self.operation.split_once('.'), op.split_once('.')) {
            (Some((r, "*")), Some((or, _))) => r == or,
            (Some(("*", a)), Some((_, oa))) => a == oa,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultConfig {
    #[serde(default)]
    pub rules: Vec<FaultRule>,
}

/// Calls per operation (`loadbalancer.create`, `member.batch_update`, ...), as `GET /control/stats` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub total_requests: u64,
    pub operations: BTreeMap<String, u64>,
    pub faults_injected: u64,
}

impl Stats {
    pub fn count(&self, op: &str) -> u64 {
        self.operations.get(op).copied().unwrap_or(0)
    }
}

pub struct Control {
    pub faults: FaultConfig,
    pub latency: LatencyProfile,
    pub stats: Stats,
}

impl Control {
    /// Counts the call; returns the extra delay and the injected status, if any.
    pub fn admit(&mut self, op: &str) -> (Duration, Option<u16>) {
        self.stats.total_requests += 1;
        *self.stats.operations.entry(op.to_string()).or_default() += 1;
        let mut delay = self.latency.api_delay(op);
        let mut status = None;
        for rule in self.faults.rules.iter_mut().filter(|r| r.matches(op)) {
            if rule.count == Some(0) {
                continue;
            }
            delay += Duration::from_millis(rule.delay_ms);
            if let Some(s) = rule.status
                && status.is_none()
            {
                status = Some(s);
                if let Some(n) = rule.count.as_mut() {
                    *n -= 1;
                }
            } else if rule.status.is_none()
                && let Some(n) = rule.count.as_mut()
            {
                *n -= 1;
            }
        }
        if status.is_some() {
            self.stats.faults_injected += 1;
        }
        (delay, status)
    }
}
