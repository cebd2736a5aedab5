//! [`BindingStore`] on `KuryrProjectBinding` objects: one object per (project, group), so claims
//! on different keys never contend. A claim writes the status with the resourceVersion it read
//! (a concurrent claim gets 409 and re-reads); `spec.pinned` is the operator's.

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
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

pub fn name_of(key: &BindingKey) -> String {
    binding_name(&key.project, &key.group.id())
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

impl KubeStore {
    async fn get_object(&self, key: &BindingKey) -> Result<Option<KuryrProjectBinding>, Error> {
        let name = name_of(key);
        let Some(b) = self.api.get_opt(&name).await? else {
            return Ok(None);
        };
        if key_of(&b) != *key {
            return Err(Error::invalid(
                format!("KuryrProjectBinding {name} spec"),
                format!("holds the binding of {}, not of {key}", key_of(&b)),
            ));
        }
        Ok(Some(b))
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
            .replace_status(&name_of(key), &PostParams::default(), &updated)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn set_pinned(&self, key: &BindingKey, pinned: bool) -> Result<(), Error> {
        if self.get_object(key).await?.is_none() {
            return Err(Error::invalid("binding", format!("{key} has no binding")));
        }
        let patch = json!({"spec": {"pinned": pinned}});
        self.api
            .patch(&name_of(key), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}
