//! Latency profiles, fault injection and request statistics: the knobs tests and benchmarks turn.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// One classified API call, e.g. `port.create_bulk` with `items = 50`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// `<resource>.<action>`: `port.create`, `port.create_bulk`, `port.update`, `trunk.add_subports`, `quota.get`...
    pub name: String,
    /// Ports in a bulk create, subports in add/remove_subports; 1 otherwise.
    pub items: usize,
    /// The call binds ports to a host (create with `binding:host_id`, update setting it): the real server is
    /// slower for those.
    pub binds: bool,
}

impl Op {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            items: 1,
            binds: false,
        }
    }
}

/// Cost of one operation: `base + per_item * items (+ bind_per_item * items when binding)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpLatency {
    #[serde(default)]
    pub base_ms: u64,
    #[serde(default)]
    pub per_item_ms: u64,
    #[serde(default)]
    pub bind_per_item_ms: u64,
}

impl OpLatency {
    pub const fn fixed(ms: u64) -> Self {
        Self {
            base_ms: ms,
            per_item_ms: 0,
            bind_per_item_ms: 0,
        }
    }

    pub fn delay(&self, op: &Op) -> Duration {
        let items = op.items.max(1) as u64;
        let mut ms = self
            .base_ms
            .saturating_add(self.per_item_ms.saturating_mul(items));
        if op.binds {
            ms = ms.saturating_add(self.bind_per_item_ms.saturating_mul(items));
        }
        Duration::from_millis(ms)
    }
}

/// Per-operation latencies; an operation not listed falls back to `<resource>.*`, then `*.<action>`, then `default`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyTable {
    #[serde(default)]
    pub default: OpLatency,
    #[serde(default)]
    pub ops: BTreeMap<String, OpLatency>,
}

impl LatencyTable {
    pub fn lookup(&self, op: &Op) -> OpLatency {
        if let Some(l) = self.ops.get(&op.name) {
            return *l;
        }
        if let Some((res, action)) = op.name.split_once('.') {
            if let Some(l) = self.ops.get(&format!("{res}.*")) {
                return *l;
            }
            if let Some(l) = self.ops.get(&format!("*.{action}")) {
                return *l;
            }
        }
        self.default
    }

    /// Medians measured against neutron-server 29.0.0 on a 2-core machine (docs: shared notes, real-neutron).
    pub fn real_server() -> Self {
        let ops: [(&str, OpLatency); 22] = [
            (
                "port.create",
                OpLatency {
                    base_ms: 150,
                    per_item_ms: 0,
                    bind_per_item_ms: 58,
                },
            ),
            // Bulk: ~105 ms per unbound port, ~180 ms per bound port (10 -> ~1.1/1.9 s, 50 -> ~5.3/9 s).
            (
                "port.create_bulk",
                OpLatency {
                    base_ms: 30,
                    per_item_ms: 105,
                    bind_per_item_ms: 75,
                },
            ),
            (
                "port.update",
                OpLatency {
                    base_ms: 124,
                    per_item_ms: 0,
                    bind_per_item_ms: 147,
                },
            ),
            ("port.delete", OpLatency::fixed(105)),
            ("port.get", OpLatency::fixed(16)),
            ("port.list", OpLatency::fixed(150)),
            ("port.tags", OpLatency::fixed(56)),
            ("trunk.create", OpLatency::fixed(120)),
            (
                "trunk.add_subports",
                OpLatency {
                    base_ms: 80,
                    per_item_ms: 21,
                    bind_per_item_ms: 0,
                },
            ),
            ("trunk.remove_subports", OpLatency::fixed(19)),
            ("trunk.delete", OpLatency::fixed(100)),
            ("network_ip_availability.get", OpLatency::fixed(17)),
            ("network_ip_availability.list", OpLatency::fixed(25)),
            ("*.get", OpLatency::fixed(16)),
            ("*.list", OpLatency::fixed(40)),
            ("*.create", OpLatency::fixed(120)),
            ("*.update", OpLatency::fixed(110)),
            ("*.delete", OpLatency::fixed(100)),
            ("*.tags", OpLatency::fixed(56)),
            ("router.add_router_interface", OpLatency::fixed(250)),
            ("router.remove_router_interface", OpLatency::fixed(200)),
            ("quota.details", OpLatency::fixed(30)),
        ];
        Self {
            default: OpLatency::fixed(20),
            ops: ops.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }
}

/// How slow the emulator answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "profile", content = "table")]
pub enum LatencyProfile {
    /// Answer as fast as possible (tests).
    #[default]
    None,
    /// The medians of the real neutron-server on these machines.
    RealServer,
    /// A custom table.
    Custom(LatencyTable),
}

impl LatencyProfile {
    pub fn table(&self) -> Option<LatencyTable> {
        match self {
            LatencyProfile::None => None,
            LatencyProfile::RealServer => Some(LatencyTable::real_server()),
            LatencyProfile::Custom(t) => Some(t.clone()),
        }
    }
}

/// Injected failure for some operations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultRule {
    /// `port.create`, `port.create*` (prefix), `port.*`, `*.delete` or `*`.
    pub operation: String,
    /// Probability (0..=1) that a matching request fails.
    #[serde(default)]
    pub rate: f64,
    /// Deterministic alternative to `rate`: fail every Nth matching request (1 = all).
    #[serde(default)]
    pub every_nth: Option<u64>,
    /// HTTP status of the failure: 500 (HTTPInternalServerError) or 503 (service unavailable), or any other.
    #[serde(default = "default_fault_status")]
    pub status: u16,
    /// Adds `Retry-After: N` to the failure.
    #[serde(default)]
    pub retry_after_secs: Option<u64>,
    /// Stop injecting after this many failures.
    #[serde(default)]
    pub max_count: Option<u64>,
    /// Perform the operation, then answer with the failure anyway (a lost reply: the client must reconcile).
    #[serde(default)]
    pub after_commit: bool,
    /// Every matching request waits this long before it is carried out, failing or not (a rule
    /// with neither `rate` nor `every_nth` only delays). The request is carried out even when its
    /// client is gone meanwhile, as behind uWSGI: a client killed while it waits leaves a write
    /// that lands after it.
    #[serde(default)]
    pub delay_ms: u64,
}

fn default_fault_status() -> u16 {
    500
}

impl FaultRule {
    /// Fails every matching request with 500.
    pub fn always(operation: &str, status: u16) -> Self {
        Self {
            operation: operation.to_string(),
            rate: 0.0,
            every_nth: Some(1),
            status,
            retry_after_secs: None,
            max_count: None,
            after_commit: false,
            delay_ms: 0,
        }
    }

    /// Delays every matching request by `delay` and fails none.
    pub fn delay(operation: &str, delay: Duration) -> Self {
        Self {
            every_nth: None,
            delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            ..Self::always(operation, 500)
        }
    }

    /// Fails a fraction of matching requests.
    pub fn with_rate(operation: &str, rate: f64, status: u16) -> Self {
        Self {
            rate,
            every_nth: None,
            ..Self::always(operation, status)
        }
    }

    pub fn matches(&self, op: &str) -> bool {
        if self.operation == "*" || self.operation == op {
            return true;
        }
        // `port.create*` covers `port.create` and `port.create_bulk`.
        if let Some(prefix) = self.operation.strip_suffix('*')
            && !prefix.ends_with('.')
        {
            return op.starts_with(prefix);
        }
        match (self.operation.split_once('.'), op.split_once('.')) {
            (Some((r, "*")), Some((or, _))) => r == or,
            (Some(("*", a)), Some((_, oa))) => a == oa,
            _ => false,
        }
    }
}

/// How an outage looks to clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutageMode {
    /// Every API request answers 503.
    #[default]
    Unavailable,
    /// New connections are accepted and dropped at once (the client sees a reset / closed connection).
    /// Already established keep-alive connections keep working; start the emulator with
    /// `connection_close: true` (like the real uWSGI) so every request opens a new connection.
    Reset,
}

/// A full outage, starting when configured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outage {
    #[serde(default)]
    pub mode: OutageMode,
    /// Length of the outage; `None` = until the faults are changed.
    #[serde(default)]
    pub duration_ms: Option<u64>,
}

/// The whole fault configuration, as accepted by `set_faults` and `PUT /_emulator/faults`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultConfig {
    #[serde(default)]
    pub rules: Vec<FaultRule>,
    #[serde(default)]
    pub outage: Option<Outage>,
    /// Seed of the rate-based coin flips (reproducible runs).
    #[serde(default)]
    pub seed: Option<u64>,
}

/// Request counters, as returned by `stats()` and `GET /_emulator/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// API requests received (admin endpoints excluded).
    pub total_requests: u64,
    /// Requests per operation name (`port.create`, `port.create_bulk`, `port.list`, ...).
    pub operations: BTreeMap<String, u64>,
    /// Ports created through `POST /ports` (single and bulk; counted even when an `after_commit` fault hid it).
    pub ports_created: u64,
    /// Failures injected by fault rules or outages.
    pub faults_injected: u64,
    /// Of those, replies lost after the operation was done (`after_commit` rules).
    #[serde(default)]
    pub lost_replies: u64,
    /// Simulated service time of all requests (what the latency profile made them take), in ms:
    /// with `workers` slots, a load of `busy_ms` cannot be served faster than `busy_ms / workers`.
    #[serde(default)]
    pub busy_ms: u64,
}

impl Stats {
    pub fn count(&self, op: &str) -> u64 {
        self.operations.get(op).copied().unwrap_or(0)
    }
}

/// A decided failure for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedFault {
    pub status: u16,
    pub retry_after_secs: Option<u64>,
    pub after_commit: bool,
}

/// Mutable runtime controls.
pub struct Control {
    pub faults: FaultConfig,
    outage_until: Option<Option<Instant>>,
    rule_matches: Vec<u64>,
    rule_injected: Vec<u64>,
    rng: StdRng,
    pub latency: Option<LatencyTable>,
    pub stats: Stats,
}

impl Control {
    pub fn new(faults: FaultConfig, latency: &LatencyProfile) -> Self {
        let mut c = Self {
            faults: FaultConfig::default(),
            outage_until: None,
            rule_matches: Vec::new(),
            rule_injected: Vec::new(),
            rng: StdRng::seed_from_u64(0),
            latency: latency.table(),
            stats: Stats::default(),
        };
        c.set_faults(faults);
        c
    }

    pub fn set_faults(&mut self, faults: FaultConfig) {
        self.outage_until = faults
            .outage
            .map(|o| o.duration_ms.map(|ms| Instant::now() + Duration::from_millis(ms)));
        self.rule_matches = vec![0; faults.rules.len()];
        self.rule_injected = vec![0; faults.rules.len()];
        self.rng = match faults.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        self.faults = faults;
    }

    /// The outage mode in force now, if any.
    pub fn outage(&mut self) -> Option<OutageMode> {
        let mode = self.faults.outage?.mode;
        match self.outage_until {
            Some(Some(until)) if Instant::now() >= until => {
                self.outage_until = None;
                self.faults.outage = None;
                None
            }
            Some(_) => Some(mode),
            None => None,
        }
    }

    /// Counts the request and decides whether it fails.
    pub fn admit(&mut self, op: &Op) -> Option<InjectedFault> {
        self.stats.total_requests += 1;
        *self.stats.operations.entry(op.name.clone()).or_default() += 1;
        if self.outage() == Some(OutageMode::Unavailable) {
            self.stats.faults_injected += 1;
            return Some(InjectedFault {
                status: 503,
                retry_after_secs: None,
                after_commit: false,
            });
        }
        for (i, rule) in self.faults.rules.iter().enumerate() {
            if !rule.matches(&op.name) {
                continue;
            }
            if rule.max_count.is_some_and(|max| self.rule_injected[i] >= max) {
                continue;
            }
            self.rule_matches[i] += 1;
            let fire = match rule.every_nth {
                Some(n) if n > 0 => self.rule_matches[i].is_multiple_of(n),
                _ => rule.rate > 0.0 && self.rng.random::<f64>() < rule.rate,
            };
            if fire {
                self.rule_injected[i] += 1;
                self.stats.faults_injected += 1;
                if rule.after_commit {
                    self.stats.lost_replies += 1;
                }
                return Some(InjectedFault {
                    status: rule.status,
                    retry_after_secs: rule.retry_after_secs,
                    after_commit: rule.after_commit,
                });
            }
        }
        None
    }

    /// The simulated service time of `op` (the latency profile's).
    pub fn delay(&self, op: &Op) -> Duration {
        self.latency
            .as_ref()
            .map(|t| t.lookup(op).delay(op))
            .unwrap_or_default()
    }

    /// What the fault rules matching `op` add before it is carried out.
    pub fn rule_delay(&self, op: &Op) -> Duration {
        let ms: u64 = self
            .faults
            .rules
            .iter()
            .filter(|r| r.delay_ms > 0 && r.matches(&op.name))
            .map(|r| r.delay_ms)
            .sum();
        Duration::from_millis(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_matching_and_every_nth() {
        let mut c = Control::new(
            FaultConfig {
                rules: vec![FaultRule {
                    every_nth: Some(2),
                    ..FaultRule::always("port.*", 503)
                }],
                ..Default::default()
            },
            &LatencyProfile::None,
        );
        let create = Op::new("port.create");
        let net = Op::new("network.create");
        assert!(c.admit(&create).is_none());
        assert_eq!(c.admit(&create).map(|f| f.status), Some(503));
        assert!(c.admit(&net).is_none());
        assert!(c.admit(&net).is_none());
        assert_eq!(c.stats.count("port.create"), 2);
        assert_eq!(c.stats.faults_injected, 1);
        assert!(FaultRule::always("*.delete", 500).matches("trunk.delete"));
        assert!(!FaultRule::always("*.delete", 500).matches("trunk.create"));
        assert!(FaultRule::always("port.create*", 500).matches("port.create_bulk"));
        assert!(FaultRule::always("port.create*", 500).matches("port.create"));
        assert!(!FaultRule::always("port.create*", 500).matches("port.update"));
    }

    #[test]
    fn real_profile_scales_with_bulk_size_and_binding() {
        let t = LatencyTable::real_server();
        let mut op = Op::new("port.create_bulk");
        op.items = 10;
        let unbound = t.lookup(&op).delay(&op);
        op.binds = true;
        let bound = t.lookup(&op).delay(&op);
        assert!(bound > unbound);
        op.items = 50;
        assert!(t.lookup(&op).delay(&op) > bound);
        assert_eq!(t.lookup(&Op::new("subnet.get")), OpLatency::fixed(16));
    }
}
