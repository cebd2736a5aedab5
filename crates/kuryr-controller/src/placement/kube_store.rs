//! [`BindingStore`] on `KuryrProjectBinding` objects: one object per (project, group), so claims
//! on different keys never contend. A claim writes the status with the resourceVersion it read
//! (a concurrent claim gets 409 and re-reads); `spec.pinned` is the operator's.

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kuryr_crds::names::annotations::UNUSED_SINCE;
use kuryr_crds::{
    BindingHistoryRow, KuryrProjectBinding, KuryrProjectBindingSpec, KuryrProjectBindingStatus, binding_name,
};
use serde_json::json;

use super::store::{BindingRecord, BindingState, BindingStore, now};
use super::{BindingKey, Group};
use crate::error::Error;

pub struct KubeStore {
    api: Api<KuryrProjectBinding>,
}

impl KubeStore {
    pub fn new(client: kube::Client) -> Self {
        Self {
            api: Api::all(client),
        }
    }
}

/// The object name of `key`'s binding. A group's text names its zone `az=<zone>`, so a group
/// without a zone whose affinity has the key `az` would print like a group with that zone
/// (`az=az1`) and take its object: such a group's name hashes its text behind a `,`, which no
/// group's text starts with (affinity keys are never empty).
pub fn name_of(key: &BindingKey) -> String {
    match affinity_says_az(&key.group) {
        true => binding_name(&key.project, &format!(",{}", key.group.id())),
        false => binding_name(&key.project, &key.group.id()),
    }
}

fn affinity_says_az(g: &Group) -> bool {
    g.availability_zone.is_none() && g.resource_affinity.contains_key("az")
}

/// Reads `key`'s binding object: under the name such a group had before it got a name of its
/// own, when the object there holds this key (it is the binding until [`move_to_own_name`]
/// deletes it: claims go there meanwhile, none is lost to a copy), else under [`name_of`].
pub async fn binding_object(
    api: &Api<KuryrProjectBinding>,
    key: &BindingKey,
) -> Result<Option<KuryrProjectBinding>, Error> {
    if affinity_says_az(&key.group)
        && let Some(b) = api.get_opt(&binding_name(&key.project, &key.group.id())).await?
        && key_of(&b) == *key
    {
        return Ok(Some(b));
    }
    let name = name_of(key);
    if let Some(b) = api.get_opt(&name).await? {
        if key_of(&b) != *key {
            return Err(Error::invalid(
                format!("KuryrProjectBinding {name} spec"),
                format!("holds the binding of {}, not of {key}", key_of(&b)),
            ));
        }
        return Ok(Some(b));
    }
    Ok(None)
}

pub fn key_of(b: &KuryrProjectBinding) -> BindingKey {
    BindingKey {
        project: b.spec.project_id.clone(),
        group: Group {
            availability_zone: b.spec.availability_zone.clone(),
            resource_affinity: b.spec.resource_affinity.clone(),
        },
    }
}

pub fn state_of(b: &KuryrProjectBinding) -> BindingState {
    let history = b
        .status
        .as_ref()
        .map(|s| {
            s.history
                .iter()
                .map(|r| BindingRecord {
                    deployment: r.deployment.clone(),
                    start: r.bound_at.clone(),
                    end: r.unbound_at.clone(),
                    why: r.why.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    BindingState {
        key: key_of(b),
        pinned: b.spec.pinned,
        history,
    }
}

fn status_of(st: &BindingState) -> KuryrProjectBindingStatus {
    KuryrProjectBindingStatus {
        deployment: st.current(),
        history: st
            .history
            .iter()
            .map(|r| BindingHistoryRow {
                deployment: r.deployment.clone(),
                bound_at: r.start.clone(),
                unbound_at: r.end.clone(),
                why: r.why.clone(),
            })
            .collect(),
    }
}

/// Moves a binding kept under the name its group shared with a zone's (see [`name_of`]) to its
/// own name, history and pin included, so that the zone's group can have its binding. The old
/// object stays the binding until it is deleted ([`binding_object`] reads it first), and it is
/// deleted only as it was copied: a claim landing on it meanwhile keeps it, and the next move
/// (at its next watch event) copies it again. Returns whether it moved.
pub async fn move_to_own_name(
    api: &Api<KuryrProjectBinding>,
    seen: &KuryrProjectBinding,
) -> Result<bool, Error> {
    let key = key_of(seen);
    let own = name_of(&key);
    let old = seen.name_any();
    if own == old || !affinity_says_az(&key.group) {
        return Ok(false);
    }
    // What the watch handed over may be behind a claim: copy what is there now.
    let Some(b) = api.get_opt(&old).await? else {
        return Ok(false);
    };
    if key_of(&b) != key {
        return Ok(false);
    }
    let fresh = KuryrProjectBinding {
        metadata: ObjectMeta {
            name: Some(own.clone()),
            labels: b.metadata.labels.clone(),
            annotations: b.metadata.annotations.clone(),
            ..Default::default()
        },
        spec: b.spec.clone(),
        status: None,
    };
    let mut copy = match api.create(&PostParams::default(), &fresh).await {
        Ok(c) => c,
        // Left by a move that did not finish: overwritten below (it is never read as the
        // binding while the old one is there).
        Err(kube::Error::Api(s)) if s.code == 409 => api.get(&own).await?,
        Err(e) => return Err(e.into()),
    };
    if copy.spec != b.spec {
        copy.spec = b.spec.clone();
        copy = api.replace(&own, &PostParams::default(), &copy).await?;
    }
    copy.status = b.status.clone();
    api.replace_status(&own, &PostParams::default(), &copy).await?;
    let dp = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: b.resource_version(),
            uid: b.uid(),
        }),
        ..Default::default()
    };
    match api.delete(&old, &dp).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

impl KubeStore {
    /// `key`'s binding object; one marked unused (see `retire.rs`) is unmarked as it is read,
    /// which changes its resourceVersion: a retirement decided before this read no longer
    /// deletes it. An unmark that fails for a while is an error (retried): going on with the
    /// marked object could let a pass in flight delete the binding being used. One refused
    /// (403: an operator's `kuryr bindings` without `patch`) goes on, as it cannot get better.
    async fn get_object(&self, key: &BindingKey) -> Result<Option<KuryrProjectBinding>, Error> {
        let Some(b) = binding_object(&self.api, key).await? else {
            return Ok(None);
        };
        if !b.annotations().contains_key(UNUSED_SINCE) {
            return Ok(Some(b));
        }
        let patch = json!({"metadata": {
            "resourceVersion": b.resource_version(),
            "annotations": {UNUSED_SINCE: null},
        }});
        match self
            .api
            .patch(&b.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(unmarked) => Ok(Some(unmarked)),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                binding_object(&self.api, key).await
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                tracing::warn!(binding = %b.name_any(), error = %s.message, "cannot unmark the binding in use");
                Ok(Some(b))
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[async_trait]
impl BindingStore for KubeStore {
    async fn get(&self, key: &BindingKey) -> Result<Option<BindingState>, Error> {
        Ok(self.get_object(key).await?.as_ref().map(state_of))
    }

    async fn list(&self) -> Result<Vec<BindingState>, Error> {
        let mut all: Vec<BindingState> = self
            .api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(state_of)
            .collect();
        all.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(all)
    }

    async fn claim(
        &self,
        key: &BindingKey,
        expected: Option<&str>,
        pinned: Option<bool>,
        new: &str,
        why: &str,
    ) -> Result<bool, Error> {
        let obj = match self.get_object(key).await? {
            Some(b) => b,
            None if expected.is_some() => return Ok(false),
            None => {
                let b = KuryrProjectBinding {
                    metadata: ObjectMeta {
                        name: Some(name_of(key)),
                        ..Default::default()
                    },
                    spec: KuryrProjectBindingSpec {
                        project_id: key.project.clone(),
                        availability_zone: key.group.availability_zone.clone(),
                        resource_affinity: key.group.resource_affinity.clone(),
                        pinned: false,
                    },
                    status: None,
                };
                match self.api.create(&PostParams::default(), &b).await {
                    Ok(b) => b,
                    Err(kube::Error::Api(s)) if s.code == 409 => return Ok(false),
                    Err(e) => return Err(e.into()),
                }
            }
        };
        let mut st = state_of(&obj);
        if st.current().as_deref() != expected || pinned.is_some_and(|p| p != st.pinned) {
            return Ok(false);
        }
        st.rebind(new, why, &now());
        let mut updated = obj.clone();
        updated.status = Some(status_of(&st));
        // The read resourceVersion travels with the object: a concurrent claim gets 409.
        match self
            .api
            .replace_status(&obj.name_any(), &PostParams::default(), &updated)
            .await
        {
            Ok(_) => Ok(true),
            // Changed since read, or deleted (moved to its own name, retired): read again.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn set_pinned(&self, key: &BindingKey, pinned: bool) -> Result<(), Error> {
        let Some(obj) = self.get_object(key).await? else {
            return Err(Error::invalid("binding", format!("{key} has no binding")));
        };
        let patch = json!({"spec": {"pinned": pinned}});
        self.api
            .patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}
