//! ResourceEventHandler: the convenience interface for handlers of one Kubernetes kind.
//!
//! `on_present` for ADDED/MODIFIED, `on_finalize` once `deletionTimestamp` is set, `on_deleted` for
//! DELETED. A library user implements this trait and registers it; the pipeline does not change.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use kube::Resource;
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use serde::de::DeserializeOwned;

use super::{Event, EventHandler, EventType, Settled};
use crate::error::Error;

#[async_trait]
pub trait ResourceEventHandler: Send + Sync + 'static {
    type Object: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug + Send + Sync + 'static;

    /// The upstream handler name used in `[kubernetes] enabled_handlers`.
    fn name(&self) -> &'static str;

    async fn on_present(&self, _obj: &Self::Object) -> Result<(), Error> {
        Ok(())
    }

    async fn on_finalize(&self, _obj: &Self::Object) -> Result<(), Error> {
        Ok(())
    }

    async fn on_deleted(&self, _obj: &Self::Object) -> Result<(), Error> {
        Ok(())
    }

    /// Whether `on_deleted` reads the state of the deleted object (labels, spec) rather than
    /// only its name, namespace and uid. Only then does the watcher keep the last state of every
    /// object of the kind, so that a deletion found by a re-list (missed while the watch was
    /// down) still hands the handler the whole object; otherwise such a deletion is handed
    /// over as an object of that metadata alone, when the kind can be one (a Pod, a Namespace;
    /// not a kind with a required spec). A deletion the watch delivers always carries the
    /// object.
    fn keeps_last_state(&self) -> bool {
        false
    }

    /// Where the handler records the versions it finished on ([`Settled`]): events carrying
    /// such a version, its own last write coming back, are then not handled again.
    fn settled(&self) -> Option<&Settled> {
        None
    }

    /// Watch options for this kind (label/field selector), when the handler only cares about a subset.
    fn selector(&self) -> WatchSelector {
        WatchSelector::default()
    }

    /// An object of the kind that is being deleted but cannot be parsed (a hand edit, a schema of a
    /// newer release) must still be let go of, or what waits on its finalizer (its pod) waits for
    /// ever. The handler may rebuild a usable object from what it can read of `raw`, which then
    /// goes to [`on_finalize`](Self::on_finalize); `None` (the default) leaves the object with its
    /// finalizer until someone mends it (the Warning Event names the field).
    fn salvage(&self, _raw: serde_json::Value) -> Option<Self::Object> {
        None
    }

    /// Whether [`salvage`](Self::salvage) is implemented: only then is a deleting object's JSON
    /// kept while it is parsed (a copy the pod path's deletions should not pay for).
    const SALVAGES: bool = false;

    /// The longest one attempt may wait on OpenStack by design (a load balancer's activation). The
    /// pipeline's retry budget is lengthened by it: a slow but successful wait followed by a
    /// retryable failure (a 409 from a race) is retried, not given up on as if it had been failing
    /// all along.
    fn longest_wait(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// Label/field selectors for the watch of a kind. Handlers of the same kind share one watch, so the
/// pipeline only narrows it when all of them agree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchSelector {
    pub labels: Option<String>,
    pub fields: Option<String>,
}

/// The typed object of an event. An event no other handler shares (the usual case) is taken
/// apart and its JSON moved into the typed object, not copied: the watcher parsed it once already.
/// On failure, the error names the object (`namespace/name`) and the field, and comes with the
/// object's metadata (for an Event on it), built only then.
fn parse_typed<K: DeserializeOwned>(
    object: Arc<DynamicObject>,
) -> Result<K, (String, Box<kube::api::ObjectMeta>, String)> {
    let DynamicObject {
        types,
        metadata,
        data,
    } = Arc::try_unwrap(object).unwrap_or_else(|shared| (*shared).clone());
    let named = |e: String| {
        let name = metadata.name.as_deref().unwrap_or("<unnamed>");
        let reference = match metadata.namespace.as_deref() {
            Some(ns) => format!("{ns}/{name}"),
            None => name.to_string(),
        };
        (reference, Box::new(metadata.clone()), e)
    };
    let mut fields = match data {
        serde_json::Value::Object(fields) => fields,
        other => {
            let whole = DynamicObject {
                types,
                metadata: metadata.clone(),
                data: other,
            };
            return serde_json::to_value(&whole)
                .map_err(|e| e.to_string())
                .and_then(at_field)
                .map_err(named);
        }
    };
    if let Some(t) = types {
        fields.insert("apiVersion".into(), t.api_version.into());
        fields.insert("kind".into(), t.kind.into());
    }
    fields.insert(
        "metadata".into(),
        serde_json::to_value(&metadata).map_err(|e| named(e.to_string()))?,
    );
    at_field(serde_json::Value::Object(fields)).map_err(named)
}

/// `value` as a `K`; a failure names the field (`status.vifs.eth0.vif: ...`).
fn at_field<K: DeserializeOwned>(value: serde_json::Value) -> Result<K, String> {
    serde_path_to_error::deserialize(value).map_err(|e| match e.path().to_string() {
        p if p == "." => e.inner().to_string(),
        p => format!("{p}: {}", e.inner()),
    })
}

/// What an Event about the object of metadata `m` regards.
fn reference_of(
    m: &kube::api::ObjectMeta,
    resource: &ApiResource,
) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(resource.api_version.clone()),
        kind: Some(resource.kind.clone()),
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        ..Default::default()
    }
}

/// Adapts a typed [`ResourceEventHandler`] to the untyped pipeline.
pub struct Typed<H: ResourceEventHandler> {
    handler: Arc<H>,
    /// Where an object that cannot be parsed is reported, as a Warning Event on it.
    events: Option<kuryr_crds::events::Events>,
    _k: PhantomData<fn() -> H::Object>,
}

impl<H: ResourceEventHandler> Typed<H> {
    pub fn new(handler: Arc<H>) -> Self {
        Self {
            handler,
            events: None,
            _k: PhantomData,
        }
    }

    /// Objects of the kind that cannot be parsed become a Warning Event on them.
    pub fn telling(mut self, events: kuryr_crds::events::Events) -> Self {
        self.events = Some(events);
        self
    }

    pub fn api_resource() -> ApiResource {
        ApiResource::erase::<H::Object>(&())
    }

    pub fn gvk() -> GroupVersionKind {
        let ar = Self::api_resource();
        GroupVersionKind::gvk(&ar.group, &ar.version, &ar.kind)
    }

    pub fn selector(&self) -> WatchSelector {
        self.handler.selector()
    }

    pub fn keeps_last_state(&self) -> bool {
        self.handler.keeps_last_state()
    }
}

#[async_trait]
impl<H: ResourceEventHandler> EventHandler for Typed<H> {
    async fn handle(&self, event: Event) -> Result<(), Error> {
        if event.event_type == EventType::Deleted && event.object.data.is_null() {
            // A deletion found by a re-list, of which only the name, namespace and uid are known
            // (see `keeps_last_state`): handed over as an object of that metadata when the kind
            // has no required field besides it (a Pod, a Namespace), otherwise only forgotten.
            if let (Some(s), Some(uid)) = (self.handler.settled(), event.object.metadata.uid.as_deref()) {
                s.forget_uid(uid);
            }
            let bare = serde_json::json!({
                "apiVersion": event.resource.api_version,
                "kind": event.resource.kind,
                "metadata": event.object.metadata,
            });
            return match serde_json::from_value::<H::Object>(bare) {
                Ok(obj) => self.handler.on_deleted(&obj).await,
                Err(_) => {
                    tracing::debug!(handler = self.handler.name(), object = %event.object_ref(),
                        "deleted while the watch was down; no state kept to hand over");
                    Ok(())
                }
            };
        }
        let settled = self.handler.settled();
        // Before the object is parsed: most of a handler's own writes come back and end here.
        if event.event_type != EventType::Deleted
            && !event.resync
            && event.object.metadata.deletion_timestamp.is_none()
            && settled.is_some_and(|s| s.is_settled(event.object.as_ref()))
        {
            tracing::trace!(handler = self.handler.name(), object = %event.object_ref(), "own write; nothing to do");
            return Ok(());
        }
        let Event {
            event_type,
            resource,
            object,
            ..
        } = event;
        // Kept only for an object being deleted (few events), for `salvage` should it not parse.
        let deleting =
            (H::SALVAGES && event_type != EventType::Deleted && object.metadata.deletion_timestamp.is_some())
                .then(|| serde_json::to_value(object.as_ref()).ok())
                .flatten();
        // The handler works on the parsed object alone: the event's copy is consumed here.
        let obj: H::Object = match parse_typed(object) {
            Ok(obj) => obj,
            Err((reference, metadata, e)) => {
                let e = Error::invalid(reference, format!("cannot parse as {}: {e}", resource.kind));
                if let Some(events) = &self.events {
                    let regarding = reference_of(&metadata, &resource);
                    crate::k8s::publish_event_on(events, &regarding, true, e.label(), &e.to_string()).await;
                }
                if let Some(obj) = deleting.and_then(|raw| self.handler.salvage(raw)) {
                    tracing::warn!(handler = self.handler.name(), error = %e,
                        "finalizing from the parts that could be read");
                    return self.handler.on_finalize(&obj).await;
                }
                return Err(e);
            }
        };
        match event_type {
            EventType::Deleted => {
                if let Some(s) = settled {
                    s.forget(&obj);
                }
                self.handler.on_deleted(&obj).await
            }
            _ if obj.meta().deletion_timestamp.is_some() => self.handler.on_finalize(&obj).await,
            _ => self.handler.on_present(&obj).await,
        }
    }

    fn name(&self) -> &str {
        self.handler.name()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;
    use serde_json::json;

    use super::*;

    fn pod() -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"a": "b"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    #[test]
    fn an_events_object_parses_the_same_whether_it_is_shared_or_not() {
        let alone: Pod = parse_typed(Arc::new(pod())).unwrap();
        let shared = Arc::new(pod());
        let kept = shared.clone();
        let from_shared: Pod = parse_typed(shared).unwrap();
        assert_eq!(alone, from_shared);
        assert_eq!(
            kept.metadata.name.as_deref(),
            Some("p"),
            "the other holder's copy is intact"
        );
        assert_eq!(alone.name_any(), "p");
        assert_eq!(alone.labels().get("a").map(String::as_str), Some("b"));
        assert_eq!(alone.spec.unwrap().node_name.as_deref(), Some("n1"));
        assert_eq!(alone.status.unwrap().phase.as_deref(), Some("Running"));
    }

    #[test]
    fn an_object_that_does_not_parse_as_the_kind_is_an_error() {
        let mut bad = pod();
        bad.data["spec"]["containers"] = json!("not a list");
        let (reference, meta, e) = parse_typed::<Pod>(Arc::new(bad)).unwrap_err();
        assert_eq!(reference, "ns/p");
        assert_eq!(meta.name.as_deref(), Some("p"), "the metadata for an Event on it");
        assert!(e.contains("spec.containers"), "the field is named: {e}");
        assert!(e.to_string().contains("invalid type"), "{e}");
    }
}
