//! Prometheus metrics of the daemon (served on `[cni_daemon]` metrics port, 9655).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Millisecond buckets from a fast veth plug to the 60 s VIF wait.
pub const LATENCY_BUCKETS_MS: [f64; 14] = [
    1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabel {
    pub command: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub command: String,
    pub code: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabel {
    pub reason: String,
}

pub struct Metrics {
    registry: Registry,
    pub latency: Family<CommandLabel, Histogram>,
    pub errors: Family<ErrorLabel, Counter>,
    pub rejected: Family<RejectLabel, Counter>,
    pub adds_in_flight: Gauge,
    pub registry_entries: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kuryr_cni");
        let latency = Family::<CommandLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(LATENCY_BUCKETS_MS.iter().copied())
        });
        let errors = Family::<ErrorLabel, Counter>::default();
        let registry_entries = Gauge::default();
        let rejected = Family::<RejectLabel, Counter>::default();
        let adds_in_flight = Gauge::default();
        registry.register(
            "adds_in_flight",
            "ADD requests holding one of the [cni_daemon] max_concurrent_adds slots",
            adds_in_flight.clone(),
        );
        registry.register(
            "rejected_requests",
            "Requests and connections the daemon's servers turned away before any CNI command ran, by reason \
             (connections, evicted, header_timeout, body_timeout, malformed, too_large, not_found, \
             method_not_allowed, adds_busy)",
            rejected.clone(),
        );
        registry.register(
            "request_duration_milliseconds",
            "CNI request latency in the daemon, by command (ADD, DEL, CHECK)",
            latency.clone(),
        );
        registry.register(
            "errors",
            "CNI requests that failed, by command and CNI error code",
            errors.clone(),
        );
        registry.register(
            "registry_entries",
            "Pods known to the daemon's registry",
            registry_entries.clone(),
        );
        Self {
            registry,
            latency,
            errors,
            rejected,
            adds_in_flight,
            registry_entries,
        }
    }

    pub fn reject(&self, reason: &str) {
        self.rejected
            .get_or_create(&RejectLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// How many requests were turned away for `reason` so far.
    pub fn rejected(&self, reason: &str) -> u64 {
        self.rejected
            .get_or_create(&RejectLabel {
                reason: reason.to_string(),
            })
            .get()
    }

    pub fn observe(&self, command: &str, millis: f64, error_code: Option<u32>) {
        self.latency
            .get_or_create(&CommandLabel {
                command: command.to_string(),
            })
            .observe(millis);
        if let Some(code) = error_code {
            self.errors
                .get_or_create(&ErrorLabel {
                    command: command.to_string(),
                    code,
                })
                .inc();
        }
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
