//! Retry: retryable failures (ResourceNotReady, transient OpenStack/Kubernetes errors) are retried with
//! exponential backoff and full jitter until a deadline. Before each retry the object is re-read; if
//! it is gone the event is dropped, otherwise the handler sees its current state.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use tokio::time::Instant;

use super::{Event, EventHandler, EventType};
use crate::error::Error;
use crate::k8s::ObjectSource;
use crate::metrics::Metrics;

#[derive(Clone, Debug)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max_interval: Duration,
    /// Give up (and let LogExceptions report it) after this long.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        // Upstream retries for 180 s; the same budget keeps the user-visible behaviour.
        Self {
            initial: Duration::from_millis(250),
            max_interval: Duration::from_secs(15),
            deadline: Duration::from_secs(180),
        }
    }
}

impl RetryPolicy {
    /// This policy for a handler one attempt of which may wait `longest_wait` by design: the deadline
    /// is lengthened by it, so that the wait does not use up the budget for retrying failures.
    pub fn allowing(&self, longest_wait: Duration) -> Self {
        Self {
            deadline: self.deadline.saturating_add(longest_wait),
            ..self.clone()
        }
    }

    /// Full-jitter exponential backoff for the given attempt (0-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.initial.saturating_mul(1u32 << attempt.min(16));
        let cap = exp.min(self.max_interval);
        let jitter = rand::rng().random_range(0.5..=1.0);
        cap.mul_f64(jitter)
    }
}

pub struct Retry<H> {
    inner: H,
    name: String,
    source: Arc<dyn ObjectSource>,
    policy: RetryPolicy,
    metrics: Metrics,
}

impl<H: EventHandler> Retry<H> {
    pub fn new(inner: H, source: Arc<dyn ObjectSource>, policy: RetryPolicy, metrics: Metrics) -> Self {
        let name = inner.name().to_string();
        Self {
            inner,
            name,
            source,
            policy,
            metrics,
        }
    }
}

#[async_trait]
impl<H: EventHandler> EventHandler for Retry<H> {
    async fn handle(&self, event: Event) -> Result<(), Error> {
        let start = Instant::now();
        let mut attempt = 0u32;
        let deleted = event.event_type == EventType::Deleted;
        // While the handler works only what names the object is kept here (a retry reads the
        // object afresh); a deletion cannot be read again, so a retry hands over the same event.
        let kept = if deleted { event.clone() } else { event.reference() };
        let mut next = event;
        loop {
            let err = match self.inner.handle(next).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if !err.is_retryable() {
                return Err(err);
            }
            let wait = err.retry_after().unwrap_or_else(|| self.policy.backoff(attempt));
            if start.elapsed().saturating_add(wait) > self.policy.deadline {
                return Err(err);
            }
            tracing::debug!(handler = %self.name, object = %kept.object_ref(), attempt, ?wait, error = %err,
                request_id = err.request_id(), "retrying");
            self.metrics.retry(&self.name);
            // Backing off is waiting, not working: other objects get the worker slot and the
            // in-flight place meanwhile.
            super::parked(tokio::time::sleep(wait)).await;
            attempt += 1;
            if deleted {
                next = kept.clone();
                continue;
            }
            let meta = &kept.object.metadata;
            let name = meta.name.clone().unwrap_or_default();
            match self
                .source
                .get(&kept.resource, meta.namespace.as_deref(), &name)
                .await?
            {
                None => {
                    tracing::debug!(handler = %self.name, object = %kept.object_ref(), "gone while retrying; dropped");
                    return Ok(());
                }
                Some(fresh) if fresh.metadata.uid != meta.uid => {
                    // Same name, new object: its own events will come through its own queue.
                    return Ok(());
                }
                Some(fresh) => {
                    next = Event {
                        object: Arc::new(fresh),
                        ..kept.clone()
                    };
                }
            }
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}
