//! Small Kubernetes helpers shared by handlers: object re-reads, finalizers, Events.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::NamespaceResourceScope;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::Mutex;

use crate::error::{Error, is_not_found};

/// Where the Retry handler re-reads objects from. A trait so the pipeline is testable without a server.
#[async_trait]
pub trait ObjectSource: Send + Sync {
    async fn get(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<DynamicObject>, Error>;
}

#[async_trait]
impl ObjectSource for Client {
    async fn get(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<DynamicObject>, Error> {
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(self.clone(), ns, resource),
            None => Api::all_with(self.clone(), resource),
        };
        Ok(api.get_opt(name).await?)
    }
}

fn api_for<K>(client: &Client, obj: &K) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Api::namespaced(client.clone(), &obj.namespace().unwrap_or_default())
}

/// Adds `finalizer` unless present. JSON patch with a `test` op on the current list so that a
/// concurrent writer makes us fail (and retry) instead of clobbering its change.
pub async fn add_finalizer<K>(client: &Client, obj: &K, finalizer: &str) -> Result<K, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    if obj.finalizers().iter().any(|f| f == finalizer) {
        return Ok(obj.clone());
    }
    let patch = if obj.meta().finalizers.is_none() {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": obj.finalizers()},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])
    };
    let patch: json_patch::Patch = serde_json::from_value(patch).map_err(|e| Error::Config(e.to_string()))?;
    Ok(api_for(client, obj)
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await?)
}

/// Removes `finalizer` if present; a 404 means the object is already gone, which is success.
pub async fn remove_finalizer<K>(client: &Client, obj: &K, finalizer: &str) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    let Some(idx) = obj.finalizers().iter().position(|f| f == finalizer) else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{idx}");
    let patch = json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]);
    let patch: json_patch::Patch = serde_json::from_value(patch).map_err(|e| Error::Config(e.to_string()))?;
    match api_for(client, obj)
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// (object uid, reason) -> (Event name, count)
type EventIndex = HashMap<(String, String), (String, i32)>;

/// Publishes core/v1 Events (what `kubectl describe` shows). Repeats of the same reason on the same
/// object bump `count` on one Event instead of creating a new one each retry.
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    component: String,
    host: String,
    seen: Arc<Mutex<EventIndex>>,
}

impl EventRecorder {
    pub fn new(client: Client, component: impl Into<String>) -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_default();
        Self {
            client,
            component: component.into(),
            host,
            seen: Arc::default(),
        }
    }

    /// Records a Warning (or Normal) Event on `obj`. Failures to record are logged, never raised:
    /// an Event is a courtesy and must not fail the handler.
    pub async fn publish<K>(&self, obj: &K, warning: bool, reason: &str, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let Some(uid) = obj.meta().uid.clone() else { return };
        let ns = obj.meta().namespace.clone().unwrap_or_else(|| "default".into());
        let reference = ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: obj.meta().name.clone(),
            namespace: obj.meta().namespace.clone(),
            uid: Some(uid.clone()),
            resource_version: obj.meta().resource_version.clone(),
            field_path: None,
        };
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &ns);
        let now = Time(chrono_now());
        let key = (uid.clone(), reason.to_string());
        let existing = self.seen.lock().await.get(&key).cloned();
        if let Some((name, count)) = existing {
            let patch = json!({"count": count + 1, "lastTimestamp": now, "message": message});
            if api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                self.seen.lock().await.insert(key, (name, count + 1));
                return;
            }
        }
        let name = format!(
            "{}.{:x}",
            obj.meta().name.as_deref().unwrap_or("object"),
            rand::random::<u64>()
        );
        let ev = CoreEvent {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns),
                ..Default::default()
            },
            involved_object: reference,
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_string()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now.clone()),
            event_time: Some(MicroTime(now.0)),
            action: Some(reason.to_string()),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.host.clone()),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &ev).await {
            Ok(_) => {
                let mut seen = self.seen.lock().await;
                // Bounded: forget everything once large; worst case a repeat creates a new Event.
                if seen.len() > 10_000 {
                    seen.clear();
                }
                seen.insert(key, (name, 1));
            }
            Err(e) => tracing::warn!(reason, error = %e, "could not record event"),
        }
    }

    /// Forget dedup state of an object that is gone.
    pub async fn forget(&self, uid: &str) {
        self.seen.lock().await.retain(|(u, _), _| u != uid);
    }
}

fn chrono_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}
