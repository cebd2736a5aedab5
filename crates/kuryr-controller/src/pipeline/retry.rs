//! Retry: retryable failures (ResourceNotReady, transient OpenStack/Kubernetes errors) are retried with
//! exponential backoff and full jitter until a deadline. Before each retry the object is re-read; if
//! it is gone the event is dropped, otherwise the handler sees its current state.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kube::api::{DynamicObject, ObjectMeta};
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
    /// Full-jitter exponential backoff for the given attempt (0-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.initial.saturating_mul(1u32 << attempt.min(16));
        let cap = exp.min(self.max_interval);
        let jitter = rand::rng().random_range(0.5..=1.0);
        cap.mul_f64(jitter)
    }
}

/// The object's kind, name, namespace and uid, nothing else.
fn reference_of(obj: &DynamicObject) -> DynamicObject {
    DynamicObject {
        types: obj.types.clone(),
        metadata: ObjectMeta {
            name: obj.metadata.name.clone(),
            namespace: obj.metadata.namespace.clone(),
            uid: obj.metadata.uid.clone(),
            ..ObjectMeta::default()
        },
        data: serde_json::Value::Null,
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
    async fn handle(&self, mut event: Event) -> Result<(), Error> {
        let start = Instant::now();
        let mut attempt = 0u32;
        loop {
            let err = match self.inner.handle(event.clone()).await {
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
            tracing::debug!(handler = %self.name, object = %event.object_ref(), attempt, ?wait, error = %err,
                request_id = err.request_id(), "retrying");
            self.metrics.retry(&self.name);
            // Only what the re-read needs is kept through the wait: in a burst thousands of
            // objects back off at once (pods waiting for their pool), and their whole parsed
            // copies were most of the controller's memory.
            if event.event_type != EventType::Deleted {
                event.object = Arc::new(reference_of(&event.object));
            }
            // Backing off is waiting, not working: other objects get the worker slot meanwhile.
            super::idle(tokio::time::sleep(wait)).await;
            attempt += 1;
            // A DELETED event describes an object that is already gone: retry it as it was.
            if event.event_type != EventType::Deleted {
                let meta = &event.object.metadata;
                let name = meta.name.clone().unwrap_or_default();
                match self
                    .source
                    .get(&event.resource, meta.namespace.as_deref(), &name)
                    .await?
                {
                    None => {
                        tracing::debug!(handler = %self.name, object = %event.object_ref(), "gone while retrying; dropped");
                        return Ok(());
                    }
                    Some(fresh) if fresh.metadata.uid != event.object.metadata.uid => {
                        // Same name, new object: its own events will come through its own queue.
                        return Ok(());
                    }
                    Some(fresh) => event.object = Arc::new(fresh),
                }
            }
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}
