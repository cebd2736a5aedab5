//! Small Kubernetes helpers shared by handlers: object re-reads, finalizers, Events.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::NamespaceResourceScope;
use kube::{Client, Resource, ResourceExt};
use kuryr_crds::events::Events;
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

/// Attempts at a finalizer patch; each one after the first re-reads the object.
const FINALIZER_ATTEMPTS: usize = 3;

/// The patch's `test` found the copy in hand stale (422 from JSON patch, 409 from a conflict).
fn stale_copy(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.code == 422)
}

/// Applies the JSON patch `build` makes from the object (`None`: nothing to do). The patch tests
/// the current finalizer list so that a concurrent writer is never clobbered; when that test
/// fails, the copy in hand was stale - usually a watch event older than our own previous write -
/// so the object is read again and the patch rebuilt from it, rather than failing the handler.
/// Returns what is read of the answer (`A`: the object as it is now, or
/// [`serde::de::IgnoredAny`] when the caller needs nothing of it); `None` when the object is
/// gone.
async fn patch_finalizers<K, A>(
    client: &Client,
    obj: &K,
    build: impl Fn(&K) -> Option<serde_json::Value>,
) -> Result<Option<Patched<K, A>>, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
    A: DeserializeOwned,
{
    let api = api_for(client, obj);
    let name = obj.name_any();
    let mut current = obj.clone();
    let mut attempt = 1;
    loop {
        let Some(patch) = build(&current) else {
            return Ok(Some(Patched::Unchanged(current)));
        };
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(|e| Error::serialization("finalizer patch", e))?;
        // What `Api::patch` sends, read into `A` instead of `K`.
        let mut request = kube::core::Request::new(api.resource_url())
            .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert("patch");
        match client.request::<A>(request).await {
            Ok(answer) => return Ok(Some(Patched::Written(answer))),
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) if stale_copy(&e) && attempt < FINALIZER_ATTEMPTS => {
                tracing::debug!(object = %name, error = %e, "finalizer patch on a stale copy; reading the object again");
                match api.get_opt(&name).await? {
                    Some(fresh) => current = fresh,
                    None => return Ok(None),
                }
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The outcome of [`patch_finalizers`]: the copy in hand needed no patch, or what was read of
/// the write's answer.
enum Patched<K, A> {
    Unchanged(K),
    Written(A),
}

/// Whether a create was refused because its namespace is being deleted (403, cause
/// `NamespaceTerminating`): the object that asked for it goes with the namespace, so there is
/// nothing left to do - a race with the namespace's deletion, not a failure.
pub fn is_namespace_terminating(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403
        && s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating")))
}

/// Adds `finalizer` unless present (see [`patch_finalizers`] for concurrent writers and stale
/// copies). An object that is gone is [`Error::Gone`].
pub async fn add_finalizer<K>(client: &Client, obj: &K, finalizer: &str) -> Result<K, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    let build = |o: &K| {
        if o.finalizers().iter().any(|f| f == finalizer) {
            return None;
        }
        Some(if o.meta().finalizers.is_none() {
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
            ])
        } else {
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": o.finalizers()},
                {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
            ])
        })
    };
    match patch_finalizers::<K, K>(client, obj, build).await? {
        Some(Patched::Unchanged(o) | Patched::Written(o)) => Ok(o),
        None => Err(Error::Gone(format!("{} {}", K::kind(&()), obj.name_any()))),
    }
}

/// Removes `finalizer` if present; an object that is already gone is success.
pub async fn remove_finalizer<K>(client: &Client, obj: &K, finalizer: &str) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    let build = |o: &K| {
        let idx = o.finalizers().iter().position(|f| f == finalizer)?;
        let path = format!("/metadata/finalizers/{idx}");
        Some(json!([
            {"op": "test", "path": path, "value": finalizer},
            {"op": "remove", "path": path},
        ]))
    };
    // Only whether it worked matters: the answer, a whole object (a pod's status and spec), is
    // not parsed into anything.
    patch_finalizers::<K, serde::de::IgnoredAny>(client, obj, build)
        .await
        .map(|_| ())
}

/// Records an Event on `obj` (see `kuryr_crds::events`). Failures are logged, never raised: an
/// Event is a courtesy and must not fail the handler.
pub async fn publish_event<K>(recorder: &Events, obj: &K, warning: bool, reason: &str, message: &str)
where
    K: Resource<DynamicType = ()>,
{
    publish_event_on(recorder, &obj.object_ref(&()), warning, reason, message).await;
}

/// [`publish_event`] on an object known by its reference.
pub async fn publish_event_on(
    recorder: &Events,
    regarding: &ObjectReference,
    warning: bool,
    reason: &str,
    message: &str,
) {
    if let Err(e) = kuryr_crds::events::publish(recorder, regarding, warning, reason, message, reason).await {
        tracing::warn!(reason, error = %e, "could not record event");
    }
}

/// A failure the object's owner must see (bad input, exhausted capacity, a request OpenStack refuses)
/// becomes a Warning Event on `regarding`. One that retrying cannot mend is then done with, logged at WARN:
/// the controller did its part and an ERROR would page an operator for a user's typo. The others go on to
/// the Retry handler.
pub async fn surface_user_error(
    recorder: &Events,
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
                    told = if recorder.enabled() { "Warning Event" } else { "none: use_events = False" },
                    "not acted on: the owner's to fix"
                );
                Ok(())
            }
        }
        other => other,
    }
}
