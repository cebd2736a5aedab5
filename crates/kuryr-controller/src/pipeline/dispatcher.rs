//! Dispatcher: routes an event to every consumer registered for its kind, in registration order.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use kube::core::GroupVersionKind;

use super::{Event, EventHandler};
use crate::error::Error;

#[derive(Default)]
pub struct Dispatcher {
    consumers: HashMap<GroupVersionKind, Vec<Arc<dyn EventHandler>>>,
}

impl Dispatcher {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&mut self, gvk: GroupVersionKind, consumer: Arc<dyn EventHandler>) {
        self.consumers.entry(gvk).or_default().push(consumer);
    }

    /// Kinds that have at least one consumer: the watcher starts one watch per kind.
    pub fn kinds(&self) -> impl Iterator<Item = &GroupVersionKind> {
        self.consumers.keys()
    }

    pub fn consumers(&self, gvk: &GroupVersionKind) -> &[Arc<dyn EventHandler>] {
        self.consumers.get(gvk).map(Vec::as_slice).unwrap_or_default()
    }
}

#[async_trait]
impl EventHandler for Dispatcher {
    /// Consumers are independent: one failing never stops the others (each is wrapped in
    /// LogExceptions by the pipeline builder, so errors rarely reach here at all).
    async fn handle(&self, event: Event) -> Result<(), Error> {
        let mut first_err = None;
        // The last consumer gets the event itself: nothing here holds its object while it works.
        if let Some((last, others)) = self.consumers(&event.gvk()).split_last() {
            for consumer in others {
                if let Err(e) = consumer.handle(event.clone()).await {
                    first_err.get_or_insert(e);
                }
            }
            if let Err(e) = last.handle(event).await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn name(&self) -> &str {
        "dispatcher"
    }
}
