//! Small Kubernetes helpers shared by handlers: object re-reads, finalizers, Events.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::NamespaceResourceScope;
use kube::{Client, Resource, ResourceExt};
use kuryr_crds::events::Recorder;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

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
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| Error::serialization("finalizer patch", e))?;
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
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| Error::serialization("finalizer patch", e))?;
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

/// Records an Event on `obj` (see `kuryr_crds::events`). Failures are logged, never raised: an
/// Event is a courtesy and must not fail the handler.
pub async fn publish_event<K>(recorder: &Recorder, obj: &K, warning: bool, reason: &str, message: &str)
where
    K: Resource<DynamicType = ()>,
{
    let regarding = obj.object_ref(&());
    if let Err(e) = kuryr_crds::events::publish(recorder, &regarding, warning, reason, message, reason).await
    {
        tracing::warn!(reason, error = %e, "could not record event");
    }
}

/// A failure the object's owner must see (bad input, exhausted capacity, a request OpenStack refuses)
/// becomes a Warning Event on `regarding`. One that retrying cannot mend is then done with, logged at WARN:
/// the controller did its part and an ERROR would page an operator for a user's typo. The others go on to
/// the Retry handler.
pub async fn surface_user_error(
    recorder: &Recorder,
    regarding: &ObjectReference,
    result: Result<(), Error>,
) -> Result<(), Error> {
    match result {
        Err(e) if e.is_user_visible() => {
            let reason = e.label();
            if let Err(pe) =
                kuryr_crds::events::publish(recorder, regarding, true, reason, &e.to_string(), reason).await
            {
                tracing::warn!(reason, error = %pe, "could not record event");
            }
            if e.is_retryable() {
                Err(e)
            } else {
                tracing::warn!(
                    object = %format!(
                        "{}/{}",
                        regarding.namespace.as_deref().unwrap_or_default(),
                        regarding.name.as_deref().unwrap_or_default()
                    ),
                    error = %e,
                    kind = reason,
                    "not acted on: told the owner with a Warning Event"
                );
                Ok(())
            }
        }
        other => other,
    }
}
