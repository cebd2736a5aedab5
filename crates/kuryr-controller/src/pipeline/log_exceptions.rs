//! LogExceptions: the last stop for a failure. It is logged with the Neutron request id, counted, and
//! swallowed so it never affects other objects or other handlers.

use async_trait::async_trait;

use super::{Event, EventHandler};
use crate::error::Error;
use crate::metrics::Metrics;

pub struct LogExceptions<H> {
    inner: H,
    name: String,
    metrics: Metrics,
}

impl<H: EventHandler> LogExceptions<H> {
    pub fn new(inner: H, metrics: Metrics) -> Self {
        let name = inner.name().to_string();
        Self { inner, name, metrics }
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
