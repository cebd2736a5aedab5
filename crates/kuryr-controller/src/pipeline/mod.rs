//! The handler pipeline (docs/architecture.md#handler-pipeline).
//!
//! ```text
//! Watcher --> Async (per-object queue, coalescing) --> Dispatcher (by kind)
//!                                                       '--> LogExceptions(Retry(handler)) for each handler
//! ```
//!
//! Events carry `DynamicObject`s so that one pipeline serves every kind; typed handlers
//! ([`ResourceEventHandler`]) are adapted with [`Typed`], which parses the object once per event.

mod async_queue;
mod builder;
mod dispatcher;
mod log_exceptions;
mod resource;
mod retry;
mod settled;
pub mod watched;

use std::sync::Arc;

use async_trait::async_trait;
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;

pub use async_queue::{Async, AsyncStats, idle, parked};
pub use builder::{ControllerPipeline, RegisteredHandler};
pub use dispatcher::Dispatcher;
pub use log_exceptions::LogExceptions;
pub use resource::{ResourceEventHandler, Typed, WatchSelector};
pub use retry::{Retry, RetryPolicy};
pub use settled::{Settled, Version};

use crate::error::Error;

/// What happened to an object, as the watcher saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One watch event flowing through the pipeline.
#[derive(Clone, Debug)]
pub struct Event {
    pub event_type: EventType,
    pub resource: Arc<ApiResource>,
    pub object: Arc<DynamicObject>,
    /// Sent by the watcher's periodic re-send, not by a change: always handled in full (see
    /// [`Settled`]).
    pub resync: bool,
}

impl Event {
    pub fn new(event_type: EventType, resource: Arc<ApiResource>, object: DynamicObject) -> Self {
        Self {
            event_type,
            resource,
            object: Arc::new(object),
            resync: false,
        }
    }

    /// The periodic re-send of an unchanged object.
    pub fn resync(resource: Arc<ApiResource>, object: DynamicObject) -> Self {
        Self {
            resync: true,
            ..Self::new(EventType::Modified, resource, object)
        }
    }

    /// The event with its object cut down to what names it (kind, name, namespace, uid): what a
    /// wrapper keeps while the handler works, so that the object is freed once the handler has
    /// parsed it (a burst holds a thousand objects in their handlers at once).
    pub fn reference(&self) -> Self {
        let obj = &self.object;
        Self {
            event_type: self.event_type,
            resource: self.resource.clone(),
            object: Arc::new(DynamicObject {
                types: obj.types.clone(),
                metadata: kube::api::ObjectMeta {
                    name: obj.metadata.name.clone(),
                    namespace: obj.metadata.namespace.clone(),
                    uid: obj.metadata.uid.clone(),
                    ..Default::default()
                },
                data: serde_json::Value::Null,
            }),
            resync: self.resync,
        }
    }

    pub fn gvk(&self) -> GroupVersionKind {
        GroupVersionKind::gvk(&self.resource.group, &self.resource.version, &self.resource.kind)
    }

    /// `namespace/name` (or `name` for cluster-scoped objects), for logs.
    pub fn object_ref(&self) -> String {
        let name = self.object.metadata.name.as_deref().unwrap_or("<unnamed>");
        match self.object.metadata.namespace.as_deref() {
            Some(ns) => format!("{}/{ns}/{name}", self.resource.kind),
            None => format!("{}/{name}", self.resource.kind),
        }
    }

    /// The Async handler's "thread group": one queue per object. The UID keeps a re-created object
    /// (same name, new UID) apart from its predecessor; objects without a UID fall back to their name.
    pub fn group_key(&self) -> String {
        match self.object.metadata.uid.as_deref() {
            Some(uid) => format!("{}/{uid}", self.resource.kind),
            None => self.object_ref(),
        }
    }
}

/// Anything that consumes pipeline events. Wrappers (Async, Retry, LogExceptions, Dispatcher) and
/// adapted [`ResourceEventHandler`]s all implement it, so they compose freely.
#[async_trait]
pub trait EventHandler: Send + Sync {
    async fn handle(&self, event: Event) -> Result<(), Error>;

    /// Name used in logs and metric labels.
    fn name(&self) -> &str;

    /// Objects accepted but not yet handled (a queueing handler's backlog; 0 for the others):
    /// what the watcher's periodic re-send waits on, so that it never holds every object at once.
    async fn backlog(&self) -> usize {
        0
    }
}

#[async_trait]
impl<T: EventHandler + ?Sized> EventHandler for Arc<T> {
    async fn handle(&self, event: Event) -> Result<(), Error> {
        (**self).handle(event).await
    }

    fn name(&self) -> &str {
        (**self).name()
    }

    async fn backlog(&self) -> usize {
        (**self).backlog().await
    }
}
