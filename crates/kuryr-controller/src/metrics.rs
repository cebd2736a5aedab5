//! Prometheus metrics of the controller (exported on `[prometheus_exporter] controller_exporter_port`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels2 = Vec<(&'static str, String)>;

fn latency_buckets() -> impl Iterator<Item = f64> {
    // 5 ms .. ~80 s: from a pool hit to a cold nested trunk on a busy cloud.
    prometheus_client::metrics::histogram::exponential_buckets(0.005, 2.0, 15)
}

struct Inner {
    registry: Registry,
    handler_failures: Family<Labels2, Counter>,
    retries: Family<Labels2, Counter>,
    events: Family<Labels2, Counter>,
    queue_depth: Gauge,
    stage_latency: Family<Labels2, Histogram>,
    neutron_calls: Family<Labels2, Counter>,
    neutron_latency: Family<Labels2, Histogram>,
    octavia_calls: Family<Labels2, Counter>,
    octavia_latency: Family<Labels2, Histogram>,
    pool: Family<Labels2, Gauge>,
    pool_events: Family<Labels2, Counter>,
    deployment_usage: Family<Labels2, Gauge<f64, AtomicU64>>,
    deployment_usage_time: Family<Labels2, Gauge<f64, AtomicU64>>,
    deployment_usage_stale: Family<Labels2, Gauge>,
}

/// Cheap to clone; every clone reports into the same registry.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kuryr");
        let handler_failures = Family::<Labels2, Counter>::default();
        let retries = Family::<Labels2, Counter>::default();
        let events = Family::<Labels2, Counter>::default();
        let queue_depth = Gauge::default();
        let stage_latency =
            Family::<Labels2, Histogram>::new_with_constructor(|| Histogram::new(latency_buckets()));
        let neutron_calls = Family::<Labels2, Counter>::default();
        let neutron_latency =
            Family::<Labels2, Histogram>::new_with_constructor(|| Histogram::new(latency_buckets()));
        let octavia_calls = Family::<Labels2, Counter>::default();
        let octavia_latency =
            Family::<Labels2, Histogram>::new_with_constructor(|| Histogram::new(latency_buckets()));
        let pool = Family::<Labels2, Gauge>::default();
        let pool_events = Family::<Labels2, Counter>::default();
        let deployment_usage = Family::<Labels2, Gauge<f64, AtomicU64>>::default();
        let deployment_usage_time = Family::<Labels2, Gauge<f64, AtomicU64>>::default();
        let deployment_usage_stale = Family::<Labels2, Gauge>::default();
        registry.register(
            "handler_failures",
            "Handler failures by handler and error kind",
            handler_failures.clone(),
        );
        registry.register("handler_retries", "Retries by handler", retries.clone());
        registry.register(
            "watch_events",
            "Watch events received by kind and type",
            events.clone(),
        );
        registry.register(
            "queue_depth",
            "Objects with a pending or running pipeline queue",
            queue_depth.clone(),
        );
        registry.register(
            "pod_wiring_stage_seconds",
            "Pod wiring latency by stage (request, activate, total)",
            stage_latency.clone(),
        );
        registry.register(
            "neutron_calls",
            "Neutron API calls by operation and result",
            neutron_calls.clone(),
        );
        registry.register(
            "neutron_call_seconds",
            "Neutron API call latency by operation",
            neutron_latency.clone(),
        );
        registry.register(
            "octavia_calls",
            "Octavia API calls by operation and result",
            octavia_calls.clone(),
        );
        registry.register(
            "octavia_call_seconds",
            "Octavia API call latency by operation",
            octavia_latency.clone(),
        );
        registry.register("pool_ports", "Ports per pool and state", pool.clone());
        registry.register(
            "pool_events",
            "Pool hits, misses, refills, recycles and deletions",
            pool_events.clone(),
        );
        registry.register(
            "deployment_usage_ratio",
            "Measured usage of each OpenStack deployment by resource (ports of a project, ipv4 of the pod subnets, \
             fraction = what runs out first)",
            deployment_usage.clone(),
        );
        registry.register(
            "deployment_usage_measured_timestamp_seconds",
            "Unix time of each deployment's last good usage measurement",
            deployment_usage_time.clone(),
        );
        registry.register(
            "deployment_usage_stale",
            "1 when a deployment's usage figure is stale (its last measurement failed or timed out)",
            deployment_usage_stale.clone(),
        );
        Self(Arc::new(Inner {
            registry,
            handler_failures,
            retries,
            events,
            queue_depth,
            stage_latency,
            neutron_calls,
            neutron_latency,
            octavia_calls,
            octavia_latency,
            pool,
            pool_events,
            deployment_usage,
            deployment_usage_time,
            deployment_usage_stale,
        }))
    }

    pub fn handler_failure(&self, handler: &str, kind: &str) {
        self.0
            .handler_failures
            .get_or_create(&vec![
                ("handler", handler.to_string()),
                ("kind", kind.to_string()),
            ])
            .inc();
    }

    pub fn retry(&self, handler: &str) {
        self.0
            .retries
            .get_or_create(&vec![("handler", handler.to_string())])
            .inc();
    }

    pub fn watch_event(&self, kind: &str, event_type: &str) {
        self.0
            .events
            .get_or_create(&vec![
                ("kind", kind.to_string()),
                ("type", event_type.to_string()),
            ])
            .inc();
    }

    pub fn set_queue_depth(&self, depth: usize) {
        self.0.queue_depth.set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    pub fn stage(&self, stage: &'static str, took: Duration) {
        self.0
            .stage_latency
            .get_or_create(&vec![("stage", stage.to_string())])
            .observe(took.as_secs_f64());
    }

    pub fn neutron_call(&self, operation: &str, result: &str, took: Duration) {
        self.0
            .neutron_calls
            .get_or_create(&vec![
                ("operation", operation.to_string()),
                ("result", result.to_string()),
            ])
            .inc();
        self.0
            .neutron_latency
            .get_or_create(&vec![("operation", operation.to_string())])
            .observe(took.as_secs_f64());
    }

    pub fn octavia_call(&self, operation: &str, result: &str, took: Duration) {
        self.0
            .octavia_calls
            .get_or_create(&vec![
                ("operation", operation.to_string()),
                ("result", result.to_string()),
            ])
            .inc();
        self.0
            .octavia_latency
            .get_or_create(&vec![("operation", operation.to_string())])
            .observe(took.as_secs_f64());
    }

    pub fn pool_size(&self, pool: &str, state: &'static str, n: usize) {
        self.0
            .pool
            .get_or_create(&vec![("pool", pool.to_string()), ("state", state.to_string())])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Drops the size gauges of a pool that no longer exists (freed, or its network deleted), so
    /// that `pool_ports` shows only pools that hold ports.
    pub fn forget_pool(&self, pool: &str) {
        for state in ["available", "recyclable", "in_use"] {
            self.0
                .pool
                .remove(&vec![("pool", pool.to_string()), ("state", state.to_string())]);
        }
    }

    pub fn pool_event(&self, event: &'static str, n: u64) {
        self.0
            .pool_events
            .get_or_create(&vec![("event", event.to_string())])
            .inc_by(n);
    }

    /// One measured usage ratio of `deployment` (`resource`: `fraction`, `ipv4`, `ports:<project>`).
    pub fn deployment_usage(&self, deployment: &str, resource: &str, ratio: f64) {
        self.0
            .deployment_usage
            .get_or_create(&vec![
                ("deployment", deployment.to_string()),
                ("resource", resource.to_string()),
            ])
            .set(ratio);
    }

    /// When `deployment` was last measured, and whether its figure is stale.
    pub fn deployment_usage_state(&self, deployment: &str, measured_unix: Option<f64>, stale: bool) {
        let l = vec![("deployment", deployment.to_string())];
        if let Some(t) = measured_unix {
            self.0.deployment_usage_time.get_or_create(&l).set(t);
        }
        self.0
            .deployment_usage_stale
            .get_or_create(&l)
            .set(i64::from(stale));
    }

    /// Retries of `handler` so far.
    pub fn retries(&self, handler: &str) -> u64 {
        self.0
            .retries
            .get(&vec![("handler", handler.to_string())])
            .map_or(0, |c| c.get())
    }

    /// Neutron calls so far: operation -> result -> count (benchmarks and the sandbox's report).
    pub fn neutron_calls(&self) -> CallCounts {
        calls(&self.encode(), "kuryr_neutron_calls_total{")
    }

    /// Octavia calls so far, like [`Metrics::neutron_calls`].
    pub fn octavia_calls(&self) -> CallCounts {
        calls(&self.encode(), "kuryr_octavia_calls_total{")
    }

    /// Text exposition format for `/metrics`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.0.registry);
        out
    }
}

/// API calls by operation, then by result.
pub type CallCounts = BTreeMap<String, BTreeMap<String, u64>>;

/// Calls per operation, all results together.
pub fn per_operation(calls: &CallCounts) -> BTreeMap<String, u64> {
    calls
        .iter()
        .map(|(op, by_result)| (op.clone(), by_result.values().sum()))
        .collect()
}

/// The `{operation=..,result=..}` counters of one family from Prometheus text (whatever the
/// label order).
pub fn calls(prometheus_text: &str, prefix: &str) -> CallCounts {
    let mut out = CallCounts::new();
    for line in prometheus_text.lines() {
        let Some(rest) = line.strip_prefix(prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let mut operation = None;
        let mut result = None;
        for pair in labels.split(',') {
            if let Some((k, v)) = pair.split_once('=') {
                let v = v.trim_matches('"').to_string();
                match k.trim() {
                    "operation" => operation = Some(v),
                    "result" => result = Some(v),
                    _ => {}
                }
            }
        }
        if let (Some(op), Some(res)) = (operation, result) {
            // Counters are integers exposed as floats.
            *out.entry(op).or_default().entry(res).or_default() += value.round() as u64;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_counted_per_handler_and_exposed() {
        let m = Metrics::new();
        assert_eq!(m.retries("vif"), 0, "none yet");
        m.retry("vif");
        m.retry("vif");
        m.retry("kuryrport");
        assert_eq!(
            (m.retries("vif"), m.retries("kuryrport"), m.retries("pod_label")),
            (2, 1, 0)
        );
        assert!(
            m.encode()
                .contains(r#"kuryr_handler_retries_total{handler="vif"} 2"#)
        );
    }

    #[test]
    fn a_forgotten_pool_leaves_the_pool_gauges() {
        let m = Metrics::new();
        m.pool_size("pool-a", "available", 3);
        m.pool_size("pool-b", "in_use", 2);
        assert!(m.encode().contains("pool-a"));
        m.forget_pool("pool-a");
        let text = m.encode();
        assert!(!text.contains("pool-a"), "{text}");
        assert!(text.contains("pool-b"), "{text}");
    }
}
