//! The object store: one lock around all state so every write gets the next global
//! resourceVersion, lands in the bounded watch history and is fanned out exactly once.
//!
//! Fan-out: one broadcast channel per (resource, namespace) plus one per resource for cluster-wide
//! watchers; each event is serialized once into a shared `Bytes` line.
//!
//! `Store` holds the lock and is the API; `State` is what the lock guards. One file per job: `events` (commit,
//! history, fan-out), `list`, `write` (create/update/patch and admission), `apply` (server-side apply), `delete`
//! (finalizers, propagation, namespaces), `gc` (owner index, garbage collector), `pods` (binding), `snapshot`.

mod apply;
mod delete;
mod events;
mod gc;
mod list;
mod options;
mod pods;
mod snapshot;
#[cfg(test)]
mod tests;
mod write;

pub use events::{EventType, WatchEvent, WatchStart, event_line};
pub use gc::FOREGROUND_FINALIZER;
pub use options::{DeleteOpts, FieldValidation, ListOpts, ListPage, Propagation, WriteOpts, WriteOutcome};

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, watch};

use crate::error::{ApiError, ApiResult};
use crate::resources::{Registry, ResourceDef};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ObjRef {
    key: String,
    ns: String,
    name: String,
}

type Objects = BTreeMap<(String, String), Arc<Value>>;

struct State {
    rv: u64,
    registry: Registry,
    objects: HashMap<String, Objects>,
    history: VecDeque<Arc<(String, Arc<WatchEvent>)>>,
    /// Watches may start from any rv >= this.
    history_start: u64,
    channels: HashMap<(String, Option<String>), broadcast::Sender<Arc<WatchEvent>>>,
    uids: HashMap<String, ObjRef>,
    dependents: HashMap<String, HashSet<ObjRef>>,
    /// uids the garbage collector must look at: deleted owners (their dependents may be
    /// orphaned) and owners in foreground deletion (their dependents may be gone).
    gc_queue: VecDeque<String>,
}

/// Tunables of the store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub history_limit: usize,
    pub channel_capacity: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            history_limit: 50_000,
            channel_capacity: 16_384,
        }
    }
}

/// The shared store.
pub struct Store {
    state: Mutex<State>,
    cfg: StoreConfig,
    kill: watch::Sender<u64>,
    /// Wakes the garbage collector task ([`Store::run_garbage_collector`]).
    gc_wake: tokio::sync::Notify,
    /// How many continued lists still find the history compacted just before they are served
    /// ([`Store::compact_before_continued_lists`]).
    compact_continued: std::sync::atomic::AtomicU32,
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        // Unreachable: ensured to be an object just above.
        _ => unreachable!("metadata was just made an object"),
    }
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|f| f.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|o| o.get("uid").and_then(Value::as_str).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

const BUILTIN_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

impl Store {
    pub fn new(cfg: StoreConfig) -> Self {
        let (kill, _) = watch::channel(0);
        let store = Self {
            state: Mutex::new(State {
                rv: 0,
                registry: Registry::new(),
                objects: HashMap::new(),
                history: VecDeque::new(),
                history_start: 0,
                channels: HashMap::new(),
                uids: HashMap::new(),
                dependents: HashMap::new(),
                gc_queue: VecDeque::new(),
            }),
            cfg,
            kill,
            gc_wake: tokio::sync::Notify::new(),
            compact_continued: std::sync::atomic::AtomicU32::new(0),
        };
        store.ensure_builtin_namespaces();
        store
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug in this crate; keep serving regardless.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ensure_builtin_namespaces(&self) {
        let Some(def) = self.lock().registry.find("", "v1", "namespaces") else {
            return;
        };
        for ns in BUILTIN_NAMESPACES {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            // AlreadyExists after a restore is expected.
            let _ = self.create(&def, "", body, &WriteOpts::default());
        }
    }

    pub fn registry(&self) -> Registry {
        self.lock().registry.clone()
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.lock().registry.find(group, version, plural)
    }

    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    pub fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> ApiResult<Arc<Value>> {
        let st = self.lock();
        st.get(def, ns, name)
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
    }

    /// The stored RBAC objects, for [`crate::rbac::allows`].
    pub fn rbac_policy(&self) -> crate::rbac::Policy {
        let st = self.lock();
        let all = |plural: &str| -> Vec<Arc<Value>> {
            let key = crate::error::qualified("rbac.authorization.k8s.io", plural);
            st.objects
                .get(&key)
                .map(|objects| objects.values().cloned().collect())
                .unwrap_or_default()
        };
        crate::rbac::Policy {
            cluster_roles: all("clusterroles"),
            cluster_role_bindings: all("clusterrolebindings"),
            roles: all("roles"),
            role_bindings: all("rolebindings"),
        }
    }
}

impl State {
    fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> Option<Arc<Value>> {
        let ns = if def.namespaced { ns } else { "" };
        self.objects
            .get(&def.storage_key())?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }
}
