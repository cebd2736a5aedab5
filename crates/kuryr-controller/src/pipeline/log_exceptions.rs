//! LogExceptions: the last stop for a failure. It is logged with the Neutron request id, counted, and
//! swallowed so it never affects other objects or other handlers.

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{Event, EventHandler};
use crate::error::Error;
use crate::metrics::Metrics;

pub struct LogExceptions<H> {
    inner: H,
    name: String,
    metrics: Metrics,
    /// The term the handler runs in: a failure once it ended is the shutdown's, not the handler's
    /// (its Kubernetes client's workers stop under it).
    term: CancellationToken,
}

impl<H: EventHandler> LogExceptions<H> {
    pub fn new(inner: H, metrics: Metrics, term: CancellationToken) -> Self {
        let name = inner.name().to_string();
        Self {
            inner,
            name,
            metrics,
            term,
        }
    }
}

#[async_trait]
impl<H: EventHandler> EventHandler for LogExceptions<H> {
    async fn handle(&self, event: Event) -> Result<(), Error> {
        // Only what names the object is kept for the log: the handler frees the object itself.
        let event_type = event.event_type;
        let object = event.object_ref();
        if let Err(e) = self.inner.handle(event).await {
            // The object, or one it needs (its namespace, its KuryrPort), went away under the
            // handler: nothing is left to do and nobody to tell; the deletion's own events follow.
            if matches!(&e, Error::Gone(_)) || matches!(&e, Error::Kube(k) if crate::error::is_not_found(k)) {
                tracing::debug!(handler = %self.name, object = %object, error = %e, "object gone");
                return Ok(());
            }
            if self.term.is_cancelled() {
                // The next leader (or this process' next start) handles the object again.
                tracing::info!(handler = %self.name, object = %object, error = %e, "handler stopped with its term");
                return Ok(());
            }
            self.metrics.handler_failure(&self.name, e.label());
            if e.is_user_visible() {
                // Exhausted quota or addresses, bad input: the owner was told with an Event and
                // must act; an ERROR would page an operator for it.
                tracing::warn!(
                    handler = %self.name,
                    object = %object,
                    event = event_type.as_str(),
                    error = %e,
                    kind = e.label(),
                    request_id = e.request_id().unwrap_or("-"),
                    "handler gave up on a failure the object's owner must fix"
                );
                return Ok(());
            }
            tracing::error!(
                handler = %self.name,
                object = %object,
                event = event_type.as_str(),
                error = %e,
                kind = e.label(),
                request_id = e.request_id().unwrap_or("-"),
                "handler failed"
            );
        }
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{ApiResource, DynamicObject, ObjectMeta};

    use super::super::EventType;
    use super::*;

    struct Failing;

    #[async_trait]
    impl EventHandler for Failing {
        async fn handle(&self, _event: Event) -> Result<(), Error> {
            Err(Error::Config("the client's workers stopped".into()))
        }
        fn name(&self) -> &str {
            "failing"
        }
    }

    fn event() -> Event {
        let obj = DynamicObject {
            types: None,
            metadata: ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            },
            data: serde_json::json!({}),
        };
        Event::new(EventType::Added, Arc::new(ApiResource::erase::<Pod>(&())), obj)
    }

    /// A failure while the term runs is counted (and logged as an error); one after the term
    /// ended is the shutdown's (a clean shutdown logs no ERROR) and is not counted.
    #[tokio::test]
    async fn a_failure_after_the_term_ended_is_the_shutdown_s() {
        let metrics = Metrics::new();
        let term = CancellationToken::new();
        let h = LogExceptions::new(Failing, metrics.clone(), term.clone());
        h.handle(event()).await.unwrap();
        let counted = |m: &Metrics| {
            m.encode()
                .lines()
                .any(|l| l.contains("handler_failures") && l.contains("failing"))
        };
        assert!(counted(&metrics), "{}", metrics.encode());
        let metrics = Metrics::new();
        let h = LogExceptions::new(Failing, metrics.clone(), term.clone());
        term.cancel();
        h.handle(event()).await.unwrap();
        assert!(!counted(&metrics), "{}", metrics.encode());
    }
}
