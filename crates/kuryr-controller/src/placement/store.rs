//! Where bindings live: a history per project (`deployment`, `start`, `end`), the open record being
//! the current binding. [`ConfigMapStore`] keeps it in the Kubernetes API so every controller
//! replica sees the same bindings; claims carry a resourceVersion precondition.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::error::Error;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingRecord {
    pub deployment: String,
    pub start: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
}

#[async_trait]
pub trait BindingStore: Send + Sync {
    async fn history(&self, project: &str) -> Result<Vec<BindingRecord>, Error>;

    async fn current(&self, project: &str) -> Result<Option<String>, Error> {
        Ok(self
            .history(project)
            .await?
            .into_iter()
            .rev()
            .find(|b| b.end.is_none())
            .map(|b| b.deployment))
    }

    /// Ends the binding to `expected` (if any) and opens one to `new`, only if the current binding
    /// is still `expected`. Ok(false) when someone else changed it first.
    async fn claim(&self, project: &str, expected: Option<&str>, new: &str) -> Result<bool, Error>;
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

fn rebind(history: &mut Vec<BindingRecord>, new: &str) {
    let t = now();
    for b in history.iter_mut().filter(|b| b.end.is_none()) {
        b.end = Some(t.clone());
    }
    history.push(BindingRecord {
        deployment: new.to_string(),
        start: t,
        end: None,
    });
}

/// In-process store (tests, single-replica setups without HA).
#[derive(Default)]
pub struct MemoryStore {
    data: Mutex<HashMap<String, Vec<BindingRecord>>>,
}

#[async_trait]
impl BindingStore for MemoryStore {
    async fn history(&self, project: &str) -> Result<Vec<BindingRecord>, Error> {
        Ok(self.data.lock().await.get(project).cloned().unwrap_or_default())
    }

    async fn claim(&self, project: &str, expected: Option<&str>, new: &str) -> Result<bool, Error> {
        let mut data = self.data.lock().await;
        let h = data.entry(project.to_string()).or_default();
        let cur = h
            .iter()
            .rev()
            .find(|b| b.end.is_none())
            .map(|b| b.deployment.as_str());
        if cur != expected {
            return Ok(false);
        }
        rebind(h, new);
        Ok(true)
    }
}

/// Bindings in ConfigMap `kuryr-project-bindings` of the controller namespace, one key per project
/// holding its JSON history.
pub struct ConfigMapStore {
    api: Api<ConfigMap>,
}

pub const CONFIGMAP_NAME: &str = "kuryr-project-bindings";

/// ConfigMap keys allow `[-._a-zA-Z0-9]`; project ids are hex/uuid, anything else is mapped.
fn key(project: &str) -> String {
    project
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl ConfigMapStore {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
        }
    }

    fn parse(cm: &ConfigMap, project: &str) -> Result<Vec<BindingRecord>, Error> {
        match cm.data.as_ref().and_then(|d| d.get(&key(project))) {
            None => Ok(vec![]),
            Some(raw) => serde_json::from_str(raw).map_err(|e| {
                Error::invalid(
                    format!("ConfigMap {CONFIGMAP_NAME} key {}", key(project)),
                    e.to_string(),
                )
            }),
        }
    }
}

#[async_trait]
impl BindingStore for ConfigMapStore {
    async fn history(&self, project: &str) -> Result<Vec<BindingRecord>, Error> {
        match self.api.get_opt(CONFIGMAP_NAME).await? {
            Some(cm) => Self::parse(&cm, project),
            None => Ok(vec![]),
        }
    }

    async fn claim(&self, project: &str, expected: Option<&str>, new: &str) -> Result<bool, Error> {
        let cm = self.api.get_opt(CONFIGMAP_NAME).await?;
        let mut history = match &cm {
            Some(cm) => Self::parse(cm, project)?,
            None => vec![],
        };
        let cur = history
            .iter()
            .rev()
            .find(|b| b.end.is_none())
            .map(|b| b.deployment.clone());
        if cur.as_deref() != expected {
            return Ok(false);
        }
        rebind(&mut history, new);
        let value =
            serde_json::to_string(&history).map_err(|e| Error::serialization("binding history", e))?;
        let result = match cm {
            Some(mut cm) => {
                cm.data
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key(project), value);
                // PUT keeps metadata.resourceVersion from the read: a concurrent claim gets 409.
                self.api
                    .replace(CONFIGMAP_NAME, &PostParams::default(), &cm)
                    .await
                    .map(|_| ())
            }
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(CONFIGMAP_NAME.into()),
                        ..Default::default()
                    },
                    data: Some(BTreeMap::from([(key(project), value)])),
                    ..Default::default()
                };
                self.api.create(&PostParams::default(), &cm).await.map(|_| ())
            }
        };
        match result {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}
