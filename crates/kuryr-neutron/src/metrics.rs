//! Observation hook: one call per API operation (after retries), so the controller can export Prometheus counters
//! and histograms without this crate depending on a metrics library.

use std::time::Duration;

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// Neutron answered with an error status.
    ApiError,
    /// No HTTP answer (connection refused/reset, timeout) or an undecodable one.
    TransportError,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::ApiError => "api_error",
            Self::TransportError => "transport_error",
        }
    }
}

/// One finished operation.
#[derive(Debug, Clone)]
pub struct CallRecord<'a> {
    /// Client operation name, e.g. `create_ports`.
    pub operation: &'a str,
    pub method: &'a str,
    pub outcome: Outcome,
    /// Final HTTP status, when there was an answer.
    pub status: Option<u16>,
    /// Neutron error type for `ApiError` outcomes.
    pub error_type: Option<&'a str>,
    /// Wall time including retries and waiting for a concurrency slot.
    pub latency: Duration,
    /// Number of HTTP attempts (1 = no retry).
    pub attempts: u32,
}

pub trait Metrics: Send + Sync + 'static {
    fn observe(&self, call: &CallRecord<'_>);
}

impl<F> Metrics for F
where
    F: Fn(&CallRecord<'_>) + Send + Sync + 'static,
{
    fn observe(&self, call: &CallRecord<'_>) {
        self(call)
    }
}
