//! The object store: one lock around all state so every write gets the next global
//! resourceVersion, lands in the bounded watch history and is fanned out exactly once.
//!
//! Fan-out: one broadcast channel per (resource, namespace) plus one per resource for cluster-wide
//! watchers; each event is serialized once into a shared `Bytes` line.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, watch};

use crate::error::{ApiError, ApiResult, Cause};
use crate::fields::{self, Entry, FieldSet};
use crate::patch::{self, PatchType};
use crate::resources::{Registry, ResourceDef, defs_from_crd};
use crate::schema;
use crate::selector::{FieldSelector, LabelSelector};

/// Watch event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change, shared by every watcher that receives it.
#[derive(Debug)]
pub struct WatchEvent {
    pub rv: u64,
    pub ns: String,
    pub type_: EventType,
    pub object: Arc<Value>,
    /// The object before the change: lets selector-filtered watchers turn MODIFIED into ADDED/DELETED.
    pub old: Option<Arc<Value>>,
    /// `{"type":..,"object":..}\n`, serialized once.
    pub line: Bytes,
}

/// Serializes a watch event line.
pub fn event_line(type_: &str, object: &Value) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(type_.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    // Serializing a serde_json::Value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut buf, object);
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
}

/// `fieldValidation` query parameter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

/// Options shared by create/update/patch.
#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    pub dry_run: bool,
    pub field_manager: Option<String>,
    /// `force=true` on an apply: take over fields other managers own instead of a 409.
    pub force: bool,
    pub field_validation: FieldValidation,
}

/// DELETE options (query parameters and the DeleteOptions body).
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub dry_run: bool,
    pub propagation: Propagation,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

/// `propagationPolicy` of a DELETE: what happens to the object's dependents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Propagation {
    /// The object goes now, the garbage collector deletes dependents afterwards.
    #[default]
    Background,
    /// The object waits (finalizer `foregroundDeletion`) until its blocking dependents are gone.
    Foreground,
    /// Dependents stay; their ownerReferences to the object are removed.
    Orphan,
}

/// The finalizer of a foreground deletion.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// List parameters.
#[derive(Debug, Clone, Default)]
pub struct ListOpts {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_: Option<String>,
}

/// The result of a write.
#[derive(Debug, Clone)]
pub struct WriteOutcome {
    pub object: Value,
    pub created: bool,
    pub warnings: Vec<String>,
}

/// A list page.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_: Option<String>,
    pub remaining: Option<u64>,
}

/// What a new watch starts with.
pub struct WatchStart {
    /// Replayed history or synthetic ADDED events, in order.
    pub initial: Vec<Arc<WatchEvent>>,
    pub rx: broadcast::Receiver<Arc<WatchEvent>>,
    /// Live events at or below this were already covered by `initial`.
    pub start_rv: u64,
    pub kill: watch::Receiver<u64>,
}

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

/// Everything except metadata (and status when it is a subresource): what `generation` tracks.
fn spec_part(def: &ResourceDef, obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Value::Object(m) = &mut v {
        m.remove("metadata");
        if def.status_subresource {
            m.remove("status");
        }
    }
    v
}

/// Equality for no-op detection: resourceVersion and managedFields timestamps do not count
/// (a change of field ownership does, as on the real server).
fn same_content(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(Value::Object(m)) = v.get_mut("metadata") {
            m.remove("resourceVersion");
            if let Some(Value::Array(entries)) = m.get_mut("managedFields") {
                for e in entries {
                    if let Value::Object(e) = e {
                        e.remove("time");
                    }
                }
            }
        }
        v
    };
    strip(a) == strip(b)
}

fn valid_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn random_suffix() -> String {
    uuid::Uuid::new_v4()
        .simple()
        .to_string()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(5)
        .collect()
}

fn encode_continue(ns: &str, name: &str, rv: u64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"ns": ns, "name": name, "rv": rv}).to_string())
}

fn decode_continue(token: &str) -> ApiResult<(String, String)> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    Ok((
        v.get("ns").and_then(Value::as_str).ok_or_else(bad)?.to_string(),
        v.get("name").and_then(Value::as_str).ok_or_else(bad)?.to_string(),
    ))
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

    /// Makes every resourceVersion issued so far too old to watch from (410 Gone).
    pub fn compact(&self) {
        let mut st = self.lock();
        st.rv += 1;
        st.history.clear();
        st.history_start = st.rv;
    }

    /// Ends every open watch; clients reconnect from their last resourceVersion.
    pub fn drop_watches(&self) {
        self.kill.send_modify(|g| *g += 1);
    }

    pub fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> ApiResult<Arc<Value>> {
        let st = self.lock();
        st.get(def, ns, name)
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
    }

    pub fn list(&self, def: &ResourceDef, ns: Option<&str>, opts: &ListOpts) -> ApiResult<ListPage> {
        let st = self.lock();
        let rv = st.rv;
        let Some(objs) = st.objects.get(&def.storage_key()) else {
            return Ok(ListPage {
                items: Vec::new(),
                resource_version: rv,
                continue_: None,
                remaining: None,
            });
        };
        let start = match &opts.continue_ {
            Some(token) => {
                let (cns, cname) = decode_continue(token)?;
                std::ops::Bound::Excluded((cns, cname))
            }
            None => std::ops::Bound::Included((ns.unwrap_or_default().to_string(), String::new())),
        };
        let matches = |((ons, _), obj): &(&(String, String), &Arc<Value>)| {
            ns.is_none_or(|n| n == ons) && opts.labels.matches(obj) && opts.fields.matches(obj)
        };
        let mut iter = objs
            .range((start, std::ops::Bound::Unbounded))
            .take_while(|((ons, _), _)| ns.is_none_or(|n| n == ons))
            .filter(matches);
        let mut items = Vec::new();
        let limit = opts.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut last = None;
        for (k, v) in iter.by_ref() {
            items.push(v.clone());
            last = Some(k.clone());
            if items.len() >= limit {
                break;
            }
        }
        let remaining = iter.count() as u64;
        let (continue_, remaining) = match (remaining, last) {
            (0, _) | (_, None) => (None, None),
            (n, Some((lns, lname))) => (Some(encode_continue(&lns, &lname, rv)), Some(n)),
        };
        Ok(ListPage {
            items,
            resource_version: rv,
            continue_,
            remaining,
        })
    }

    /// Subscribes a watcher; `from == None` means "send the current state as ADDED first".
    pub fn watch(&self, def: &ResourceDef, ns: Option<&str>, from: Option<u64>) -> ApiResult<WatchStart> {
        let mut st = self.lock();
        let key = def.storage_key();
        let mut initial = Vec::new();
        match from {
            Some(rv) => {
                if rv < st.history_start {
                    return Err(ApiError::gone(format!(
                        "too old resource version: {rv} ({})",
                        st.history_start
                    )));
                }
                // History is in rv order; only the tail newer than `rv` matters.
                let skip = st.history.partition_point(|e| e.1.rv <= rv);
                for e in st.history.iter().skip(skip) {
                    if e.0 == key && ns.is_none_or(|n| n == e.1.ns) {
                        initial.push(e.1.clone());
                    }
                }
            }
            None => {
                if let Some(objs) = st.objects.get(&key) {
                    let start = (ns.unwrap_or_default().to_string(), String::new());
                    for ((ons, _), obj) in objs
                        .range(start..)
                        .take_while(|((ons, _), _)| ns.is_none_or(|n| n == ons))
                    {
                        let rv = meta_str(obj, "resourceVersion")
                            .and_then(|r| r.parse().ok())
                            .unwrap_or(0);
                        initial.push(Arc::new(WatchEvent {
                            rv,
                            ns: ons.clone(),
                            type_: EventType::Added,
                            object: obj.clone(),
                            old: None,
                            line: event_line("ADDED", obj),
                        }));
                    }
                }
            }
        }
        let cap = self.cfg.channel_capacity;
        let rx = st
            .channels
            .entry((key, ns.map(String::from)))
            .or_insert_with(|| broadcast::channel(cap).0)
            .subscribe();
        Ok(WatchStart {
            initial,
            rx,
            start_rv: st.rv,
            kill: self.kill.subscribe(),
        })
    }

    pub fn create(
        &self,
        def: &ResourceDef,
        ns: &str,
        body: Value,
        opts: &WriteOpts,
    ) -> ApiResult<WriteOutcome> {
        let mut st = self.lock();
        st.create(def, ns, body, opts, self)
    }

    /// PUT (`status_only` for `.../status`).
    pub fn update(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        body: Value,
        status_only: bool,
        opts: &WriteOpts,
    ) -> ApiResult<WriteOutcome> {
        let mut st = self.lock();
        let mut body = body;
        check_body_identity(def, ns, name, &mut body)?;
        let cur = st
            .get(def, ns, name)
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        if let Some(rv) = meta_str(&body, "resourceVersion").filter(|r| !r.is_empty())
            && Some(rv) != meta_str(&cur, "resourceVersion")
        {
            return Err(ApiError::stale(&def.group, &def.plural, name));
        }
        st.update_existing(def, ns, &cur, body, status_only, opts, None, self)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        ptype: PatchType,
        body: Value,
        status_only: bool,
        opts: &WriteOpts,
    ) -> ApiResult<WriteOutcome> {
        let mut st = self.lock();
        if ptype == PatchType::Apply {
            return st.apply(def, ns, name, body, status_only, opts, self);
        }
        let cur = st
            .get(def, ns, name)
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        let mut doc = (*cur).clone();
        match ptype {
            PatchType::Json => patch::json_patch(&mut doc, &body)?,
            PatchType::Merge => patch::merge_patch(&mut doc, &body)?,
            // Custom resources have no patch tags: the merge patch is the faithful stand-in.
            PatchType::Strategic if def.custom => patch::merge_patch(&mut doc, &body)?,
            PatchType::Strategic => patch::strategic_merge(&mut doc, &body)?,
            PatchType::Apply => unreachable!("handled above"),
        }
        if meta_str(&doc, "resourceVersion") != meta_str(&cur, "resourceVersion") {
            return Err(ApiError::stale(&def.group, &def.plural, name));
        }
        if meta_str(&doc, "name") != Some(name) {
            return Err(ApiError::bad_request(format!(
                "metadata.name: the patch may not change the name (\"{name}\")"
            )));
        }
        st.update_existing(def, ns, &cur, doc, status_only, opts, None, self)
    }

    pub fn delete(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> ApiResult<(Value, bool)> {
        let mut st = self.lock();
        st.delete(def, ns, name, opts, self)
    }

    pub fn delete_collection(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        list: &ListOpts,
        opts: &DeleteOpts,
    ) -> ApiResult<Vec<Value>> {
        let page = self.list(
            def,
            ns,
            &ListOpts {
                limit: None,
                continue_: None,
                ..list.clone()
            },
        )?;
        let mut st = self.lock();
        let mut out = Vec::new();
        for obj in page.items {
            let (ons, oname) = (
                meta_str(&obj, "namespace").unwrap_or_default(),
                meta_str(&obj, "name").unwrap_or_default(),
            );
            match st.delete(def, ons, oname, opts, self) {
                Ok((o, _)) => out.push(o),
                // Deleted concurrently (e.g. by GC of an earlier item): nothing left to do.
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The garbage collector: runs until the store is dropped, handling what deletions queued
    /// (one object per lock acquisition, so it never holds up requests for long).
    pub async fn run_garbage_collector(self: Arc<Self>) {
        loop {
            self.gc_wake.notified().await;
            while self.collect_garbage_step() {
                tokio::task::yield_now().await;
            }
        }
    }

    /// Handles one queued uid; false when the queue is empty.
    pub fn collect_garbage_step(&self) -> bool {
        let mut st = self.lock();
        let Some(uid) = st.gc_queue.pop_front() else {
            return false;
        };
        st.collect(&uid, self);
        true
    }

    /// `pods/binding`: assigns a node to a pod once.
    pub fn bind(&self, ns: &str, name: &str, body: &Value) -> ApiResult<Value> {
        let mut st = self.lock();
        let def = st
            .registry
            .find("", "v1", "pods")
            .ok_or_else(|| ApiError::internal("pods are not registered"))?;
        let node = body
            .pointer("/target/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let Some(node) = node else {
            return Err(ApiError::invalid(
                "",
                "Binding",
                "bindings",
                name,
                vec![Cause::required("target.name")],
            ));
        };
        let cur = st
            .get(&def, ns, name)
            .ok_or_else(|| ApiError::not_found("", "pods", name))?;
        if let Some(existing) = cur
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                &format!("pod {name} is already assigned to node \"{existing}\""),
            ));
        }
        let mut new = (*cur).clone();
        new["spec"]["nodeName"] = json!(node);
        let cond = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now()});
        match new
            .pointer_mut("/status/conditions")
            .and_then(Value::as_array_mut)
        {
            Some(conds) => {
                conds.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
                conds.push(cond);
            }
            None => new["status"]["conditions"] = json!([cond]),
        }
        st.commit(&def, ns, name, EventType::Modified, new, Some(cur), self);
        Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}))
    }

    /// The whole state, for persistence.
    pub fn snapshot(&self) -> Value {
        let st = self.lock();
        let objects: Vec<&Value> = st
            .objects
            .values()
            .flat_map(|m| m.values().map(|v| v.as_ref()))
            .collect();
        json!({"resourceVersion": st.rv, "objects": objects})
    }

    /// Loads a snapshot written by [`Store::snapshot`] (CRDs first so their kinds resolve).
    pub fn restore(&self, snap: &Value) -> Result<(), String> {
        let objects = snap
            .get("objects")
            .and_then(Value::as_array)
            .ok_or("snapshot has no \"objects\" array")?;
        let rv = snap
            .get("resourceVersion")
            .and_then(Value::as_u64)
            .ok_or("snapshot has no numeric \"resourceVersion\"")?;
        let mut st = self.lock();
        st.objects.clear();
        st.uids.clear();
        st.dependents.clear();
        let is_crd = |o: &&Value| o.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition");
        let crds: Vec<&Value> = objects.iter().filter(is_crd).collect();
        st.registry.rebuild(crds.iter().copied());
        for obj in crds.into_iter().chain(objects.iter().filter(|o| !is_crd(o))) {
            let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
            let def = st
                .registry
                .group_versions()
                .filter(|((g, v), _)| g == group && v == version)
                .flat_map(|(_, defs)| defs.iter())
                .find(|d| d.kind == kind)
                .cloned()
                .ok_or_else(|| format!("snapshot object of unknown kind {api_version}/{kind}"))?;
            let ns = meta_str(obj, "namespace").unwrap_or_default().to_string();
            let name = meta_str(obj, "name")
                .ok_or_else(|| format!("snapshot {kind} without metadata.name"))?
                .to_string();
            st.index(&def.storage_key(), &ns, &name, None, Some(obj));
            st.objects
                .entry(def.storage_key())
                .or_default()
                .insert((ns, name), Arc::new(obj.clone()));
        }
        st.rv = rv;
        st.history.clear();
        st.history_start = rv;
        drop(st);
        self.ensure_builtin_namespaces();
        Ok(())
    }
}

/// Name/namespace in a PUT/apply body must agree with the URL.
fn check_body_identity(def: &ResourceDef, ns: &str, name: &str, body: &mut Value) -> ApiResult<()> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    match meta_str(body, "name") {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        Some(_) => {}
        None => {
            meta_mut(body).insert("name".into(), json!(name));
        }
    }
    if def.namespaced
        && let Some(bns) = meta_str(body, "namespace")
        && bns != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

impl State {
    fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> Option<Arc<Value>> {
        let ns = if def.namespaced { ns } else { "" };
        self.objects
            .get(&def.storage_key())?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    fn namespace_terminating(&self, ns: &str) -> Option<bool> {
        let obj = self
            .objects
            .get("namespaces")?
            .get(&(String::new(), ns.to_string()))?;
        Some(meta_str(obj, "deletionTimestamp").is_some())
    }

    /// Keeps the uid and owner indexes in step with a write.
    fn index(&mut self, key: &str, ns: &str, name: &str, old: Option<&Value>, new: Option<&Value>) {
        let r = ObjRef {
            key: key.to_string(),
            ns: ns.to_string(),
            name: name.to_string(),
        };
        if let Some(old) = old {
            for o in owner_uids(old) {
                if let Some(set) = self.dependents.get_mut(&o) {
                    set.remove(&r);
                    if set.is_empty() {
                        self.dependents.remove(&o);
                    }
                }
            }
            if new.is_none()
                && let Some(uid) = meta_str(old, "uid")
            {
                self.uids.remove(uid);
            }
        }
        if let Some(new) = new {
            for o in owner_uids(new) {
                self.dependents.entry(o).or_default().insert(r.clone());
            }
            if let Some(uid) = meta_str(new, "uid") {
                self.uids.insert(uid.to_string(), r.clone());
            }
        }
    }

    /// Applies a change: next rv, store, indexes, history, fan-out.
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        type_: EventType,
        mut obj: Value,
        old: Option<Arc<Value>>,
        store: &Store,
    ) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let key = def.storage_key();
        let ns = if def.namespaced {
            ns.to_string()
        } else {
            String::new()
        };
        self.index(
            &key,
            &ns,
            name,
            old.as_deref(),
            (type_ != EventType::Deleted).then_some(&obj),
        );
        if let Some(old) = &old {
            // A dependent that went away (or dropped its owner) may unblock a foreground deletion.
            let old_owners = owner_uids(old);
            if !old_owners.is_empty() && (type_ == EventType::Deleted || owner_uids(&obj) != old_owners) {
                for o in old_owners {
                    if self.in_foreground_deletion(&o) {
                        self.gc_queue.push_back(o);
                        store.gc_wake.notify_one();
                    }
                }
            }
        }
        let obj = Arc::new(obj);
        let slot = (ns.clone(), name.to_string());
        if type_ == EventType::Deleted {
            if let Some(m) = self.objects.get_mut(&key) {
                m.remove(&slot);
            }
            if let Some(uid) = meta_str(&obj, "uid")
                && self.dependents.contains_key(uid)
            {
                self.gc_queue.push_back(uid.to_string());
                store.gc_wake.notify_one();
            }
        } else {
            self.objects
                .entry(key.clone())
                .or_default()
                .insert(slot, obj.clone());
        }
        let ev = Arc::new(WatchEvent {
            rv,
            ns: ns.clone(),
            type_,
            line: event_line(type_.as_str(), &obj),
            object: obj.clone(),
            old,
        });
        self.history.push_back(Arc::new((key.clone(), ev.clone())));
        while self.history.len() > store.cfg.history_limit {
            if let Some(front) = self.history.pop_front() {
                self.history_start = front.1.rv;
            }
        }
        for chan in [(key.clone(), None), (key, Some(ns))] {
            if let Some(tx) = self.channels.get(&chan)
                && tx.send(ev.clone()).is_err()
            {
                // Nobody listens any more: drop the channel so idle kinds cost nothing.
                self.channels.remove(&chan);
            }
        }
        if def.is_crd() {
            let crds: Vec<Value> = self
                .objects
                .get("customresourcedefinitions.apiextensions.k8s.io")
                .map(|m| m.values().map(|v| (**v).clone()).collect())
                .unwrap_or_default();
            self.registry.rebuild(crds.iter());
        }
        obj
    }

    /// Validation and defaulting shared by create and update; returns warnings.
    fn admit(&self, def: &ResourceDef, obj: &mut Value, opts: &WriteOpts) -> ApiResult<Vec<String>> {
        let name = meta_str(obj, "name").unwrap_or_default().to_string();
        let invalid = |causes| ApiError::invalid(&def.group, &def.kind, &def.plural, &name, causes);
        let mut warnings = Vec::new();
        let mut causes = Vec::new();
        // Namespace names are DNS labels (no dots, at most 63 chars).
        let label_like = def.is_namespace();
        if !valid_dns_subdomain(&name) || (label_like && (name.len() > 63 || name.contains('.'))) {
            causes.push(Cause::invalid(
                "metadata.name",
                format!("Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
            ));
        }
        for field in ["labels", "annotations"] {
            if let Some(map) = obj
                .pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_object)
            {
                for (k, v) in map {
                    if !v.is_string() {
                        causes.push(Cause::type_invalid(
                            format!("metadata.{field}.{k}"),
                            "must be a string",
                        ));
                    }
                }
            }
        }
        if def.is_pod()
            && obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
        {
            causes.push(Cause::required("spec.containers"));
        }
        if def.is_crd() {
            defs_from_crd(obj)?;
        }
        if let Some(schema) = &def.schema {
            let unknown = schema::prune(obj, schema, "", true);
            if !unknown.is_empty() {
                match opts.field_validation {
                    FieldValidation::Strict => {
                        let list: Vec<String> =
                            unknown.iter().map(|u| format!("unknown field \"{u}\"")).collect();
                        return Err(ApiError::bad_request(format!(
                            "strict decoding error: {}",
                            list.join(", ")
                        )));
                    }
                    FieldValidation::Warn => {
                        warnings.extend(unknown.iter().map(|u| format!("unknown field \"{u}\"")))
                    }
                    FieldValidation::Ignore => {}
                }
            }
            schema::validate(obj, schema, "", &mut causes);
        }
        if causes.is_empty() {
            Ok(warnings)
        } else {
            Err(invalid(causes))
        }
    }

    fn create(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        mut body: Value,
        opts: &WriteOpts,
        store: &Store,
    ) -> ApiResult<WriteOutcome> {
        if !body.is_object() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        let api_version = def.api_version();
        if let Some(av) = body.get("apiVersion").and_then(Value::as_str)
            && av != api_version
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({api_version})"
            )));
        }
        if let Some(kind) = body.get("kind").and_then(Value::as_str)
            && kind != def.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                def.kind
            )));
        }
        body["apiVersion"] = json!(api_version);
        body["kind"] = json!(def.kind);
        let meta = meta_mut(&mut body);
        if meta.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
            match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => {
                    let generated = format!("{prefix}{}", random_suffix());
                    meta.insert("name".into(), json!(generated));
                }
                _ => {
                    return Err(ApiError::invalid(
                        &def.group,
                        &def.kind,
                        &def.plural,
                        "",
                        vec![Cause::required("metadata.name")],
                    ));
                }
            }
        }
        if def.namespaced {
            if let Some(bns) = meta.get("namespace").and_then(Value::as_str)
                && bns != ns
            {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        for server_owned in [
            "uid",
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta.remove(server_owned);
        }
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(now()));
        meta.insert("generation".into(), json!(1));
        if def.namespaced {
            match self.namespace_terminating(ns) {
                None => return Err(ApiError::not_found("", "namespaces", ns)),
                Some(true) => {
                    return Err(ApiError::forbidden(format!(
                        "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        crate::error::qualified(&def.group, &def.plural)
                    )));
                }
                Some(false) => {}
            }
        }
        if self.get(def, ns, &name).is_some() {
            return Err(ApiError::already_exists(&def.group, &def.plural, &name));
        }
        // Like the real registries: status is server-owned on create (nodes keep what the kubelet reports).
        if def.status_subresource
            && !(def.group.is_empty() && def.plural == "nodes")
            && let Value::Object(m) = &mut body
        {
            m.remove("status");
        }
        if def.is_pod() {
            body["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
        }
        if def.is_namespace() {
            body["status"] = json!({"phase": "Active"});
        }
        let warnings = self.admit(def, &mut body, opts)?;
        if let Some(fm) = opts.field_manager.as_deref().filter(|m| !m.is_empty())
            && body.pointer("/metadata/managedFields").is_none()
        {
            // The creator owns every field it set (status is the server's on create).
            let mut owned = body.clone();
            if def.status_subresource
                && let Value::Object(m) = &mut owned
            {
                m.remove("status");
            }
            let entry = Entry {
                manager: fm.to_string(),
                operation: "Update".into(),
                subresource: String::new(),
                api_version: api_version.clone(),
                time: None,
                set: fields::set_of(&owned, fields::Schema { builtin: !def.custom }),
                touched: true,
            };
            let rendered = fields::render(&[entry], &now());
            if rendered.as_array().is_some_and(|a| !a.is_empty()) {
                meta_mut(&mut body).insert("managedFields".into(), rendered);
            }
        }
        if def.is_crd() {
            body["status"] = crd_status(&body);
        }
        if opts.dry_run {
            return Ok(WriteOutcome {
                object: body,
                created: true,
                warnings,
            });
        }
        let obj = self.commit(def, ns, &name, EventType::Added, body, None, store);
        Ok(WriteOutcome {
            object: (*obj).clone(),
            created: true,
            warnings,
        })
    }

    /// The shared tail of PUT, PATCH and apply once `new` is the desired object.
    #[allow(clippy::too_many_arguments)]
    fn update_existing(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        cur: &Arc<Value>,
        new: Value,
        status_only: bool,
        opts: &WriteOpts,
        applied: Option<FieldSet>,
        store: &Store,
    ) -> ApiResult<WriteOutcome> {
        let name = meta_str(cur, "name").unwrap_or_default().to_string();
        let mut merged = if status_only {
            let mut m = (**cur).clone();
            match new.get("status") {
                Some(s) => m["status"] = s.clone(),
                None => {
                    if let Value::Object(o) = &mut m {
                        o.remove("status");
                    }
                }
            }
            m
        } else {
            let mut n = new;
            if def.status_subresource {
                match cur.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Value::Object(o) = &mut n {
                            o.remove("status");
                        }
                    }
                }
            }
            n
        };
        merged["apiVersion"] = json!(def.api_version());
        merged["kind"] = json!(def.kind);
        {
            let cur_meta = cur
                .get("metadata")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let meta = meta_mut(&mut merged);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
                "resourceVersion",
            ] {
                match cur_meta.get(f) {
                    Some(v) => meta.insert(f.into(), v.clone()),
                    None => meta.remove(f),
                };
            }
        }
        let warnings = self.admit(def, &mut merged, opts)?;
        // Field ownership: an update takes over what it changes, an apply may conflict.
        if applied.is_some()
            || opts.field_manager.is_some()
            || cur.pointer("/metadata/managedFields").is_some()
        {
            let entries = fields::track(
                fields::entries(cur),
                cur,
                &merged,
                fields::Schema { builtin: !def.custom },
                opts.field_manager.as_deref().filter(|m| !m.is_empty()),
                if status_only { "status" } else { "" },
                &def.api_version(),
                applied,
                opts.force,
            )?;
            let rendered = fields::render(&entries, &now());
            let meta = meta_mut(&mut merged);
            if rendered.as_array().is_some_and(Vec::is_empty) {
                meta.remove("managedFields");
            } else {
                meta.insert("managedFields".into(), rendered);
            }
        }
        let deleting = meta_str(cur, "deletionTimestamp").is_some();
        let fins = finalizers(&merged);
        if deleting {
            let old = finalizers(cur);
            if let Some(added) = fins.iter().find(|f| !old.contains(f)) {
                return Err(ApiError::invalid(
                    &def.group,
                    &def.kind,
                    &def.plural,
                    &name,
                    vec![Cause::forbidden(
                        "metadata.finalizers",
                        format!(
                            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{\"{added}\"}}"
                        ),
                    )],
                ));
            }
        }
        if same_content(&merged, cur) {
            return Ok(WriteOutcome {
                object: (**cur).clone(),
                created: false,
                warnings,
            });
        }
        if spec_part(def, &merged) != spec_part(def, cur) {
            let generation = cur
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut merged).insert("generation".into(), json!(generation + 1));
        }
        if opts.dry_run {
            return Ok(WriteOutcome {
                object: merged,
                created: false,
                warnings,
            });
        }
        let type_ = if deleting && fins.is_empty() {
            EventType::Deleted
        } else {
            EventType::Modified
        };
        let obj = self.commit(def, ns, &name, type_, merged, Some(cur.clone()), store);
        if type_ == EventType::Deleted {
            self.after_removal(def, ns, store);
        }
        Ok(WriteOutcome {
            object: (*obj).clone(),
            created: false,
            warnings,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn apply(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        mut body: Value,
        status_only: bool,
        opts: &WriteOpts,
        store: &Store,
    ) -> ApiResult<WriteOutcome> {
        let Some(manager) = opts.field_manager.clone().filter(|m| !m.is_empty()) else {
            return Err(ApiError::bad_request(
                "PATCH, application/apply-patch+yaml: fieldManager must be set",
            ));
        };
        check_body_identity(def, ns, name, &mut body)?;
        let rv = meta_str(&body, "resourceVersion").map(String::from);
        if let Some(Value::Object(m)) = body.get_mut("metadata") {
            m.remove("managedFields");
            m.remove("resourceVersion");
        }
        let mut applied = fields::set_of(&body, fields::Schema { builtin: !def.custom });
        if def.status_subresource {
            // The main resource ignores status and the status subresource everything else.
            applied.retain(|p| (p.first().map(String::as_str) == Some("f:status")) == status_only);
        }
        let subresource = if status_only { "status" } else { "" };
        let Some(cur) = self.get(def, ns, name) else {
            let entry = Entry {
                manager,
                operation: "Apply".into(),
                subresource: subresource.into(),
                api_version: def.api_version(),
                time: None,
                set: applied,
                touched: true,
            };
            meta_mut(&mut body).insert("managedFields".into(), fields::render(&[entry], &now()));
            return self.create(def, ns, body, opts, store);
        };
        if let Some(rv) = rv
            && Some(rv.as_str()) != meta_str(&cur, "resourceVersion")
        {
            return Err(ApiError::stale(&def.group, &def.plural, name));
        }
        let mut doc = (*cur).clone();
        // Fields this manager no longer applies go, unless another manager still owns them.
        let entries = fields::entries(&cur);
        let mine = |e: &&Entry| e.same_owner(&manager, "Apply", subresource);
        let last = entries
            .iter()
            .find(mine)
            .map(|e| e.set.clone())
            .unwrap_or_default();
        let others: Vec<&Entry> = entries.iter().filter(|e| !mine(e)).collect();
        fields::prune(&mut doc, &last, &applied, &others);
        if def.custom {
            // Custom resources: merge semantics (atomic lists), except ObjectMeta's keyed lists.
            let meta = match &mut body {
                Value::Object(m) => m.remove("metadata"),
                _ => None,
            };
            patch::merge_patch(&mut doc, &body)?;
            if let Some(meta) = meta {
                patch::strategic_merge(&mut doc["metadata"], &meta)?;
            }
        } else {
            patch::strategic_merge(&mut doc, &body)?
        }
        self.update_existing(def, ns, &cur, doc, status_only, opts, Some(applied), store)
    }

    fn delete(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
        store: &Store,
    ) -> ApiResult<(Value, bool)> {
        let cur = self
            .get(def, ns, name)
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        if let Some(uid) = &opts.precondition_uid
            && Some(uid.as_str()) != meta_str(&cur, "uid")
        {
            return Err(ApiError::conflict(
                &def.group,
                &def.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&cur, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && Some(rv.as_str()) != meta_str(&cur, "resourceVersion")
        {
            return Err(ApiError::conflict(
                &def.group,
                &def.plural,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&cur, "resourceVersion").unwrap_or_default()
                ),
            ));
        }
        if opts.dry_run {
            // The would-be result: marked for deletion while finalizers (or a foreground
            // deletion) hold it, otherwise the object as it is removed.
            let uid = meta_str(&cur, "uid").unwrap_or_default();
            let foreground = opts.propagation == Propagation::Foreground
                && self.dependents.get(uid).is_some_and(|d| !d.is_empty());
            let pending = !finalizers(&cur).is_empty() || foreground || def.is_namespace();
            let mut out = (*cur).clone();
            if pending && meta_str(&cur, "deletionTimestamp").is_none() {
                let meta = meta_mut(&mut out);
                meta.insert("deletionTimestamp".into(), json!(now()));
                meta.insert("deletionGracePeriodSeconds".into(), json!(0));
                if foreground {
                    let mut fins = finalizers(&cur);
                    fins.push(FOREGROUND_FINALIZER.to_string());
                    meta.insert("finalizers".into(), json!(fins));
                }
                if def.is_namespace() {
                    out["status"] = json!({"phase": "Terminating"});
                }
            }
            return Ok((out, !pending));
        }
        if def.is_namespace() {
            return Ok(self.delete_namespace(def, name, cur, store));
        }
        if def.is_crd() {
            // Custom resources of a deleted CRD go with it.
            if let Ok(defs) = defs_from_crd(&cur)
                && let Some(cr_def) = defs.first()
            {
                let key = cr_def.storage_key();
                let objs: Vec<((String, String), Arc<Value>)> = self
                    .objects
                    .get(&key)
                    .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                    .unwrap_or_default();
                for ((ons, oname), obj) in objs {
                    self.commit(
                        cr_def,
                        &ons,
                        &oname,
                        EventType::Deleted,
                        (*obj).clone(),
                        Some(obj),
                        store,
                    );
                }
            }
        }
        let uid = meta_str(&cur, "uid").unwrap_or_default().to_string();
        let has_dependents = self.dependents.get(&uid).is_some_and(|d| !d.is_empty());
        if opts.propagation == Propagation::Orphan && has_dependents {
            self.orphan_dependents(&uid, store);
        }
        let foreground = opts.propagation == Propagation::Foreground && has_dependents;
        if !finalizers(&cur).is_empty() || foreground {
            if meta_str(&cur, "deletionTimestamp").is_some() {
                return Ok(((*cur).clone(), false));
            }
            let mut new = (*cur).clone();
            let generation = cur
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let meta = meta_mut(&mut new);
            meta.insert("deletionTimestamp".into(), json!(now()));
            meta.insert("deletionGracePeriodSeconds".into(), json!(0));
            meta.insert("generation".into(), json!(generation + 1));
            if foreground {
                let mut fins = finalizers(&cur);
                fins.push(FOREGROUND_FINALIZER.to_string());
                meta.insert("finalizers".into(), json!(fins));
            }
            let obj = self.commit(def, ns, name, EventType::Modified, new, Some(cur), store);
            if foreground {
                self.gc_queue.push_back(uid);
                store.gc_wake.notify_one();
            }
            return Ok(((*obj).clone(), false));
        }
        let obj = self.commit(
            def,
            ns,
            name,
            EventType::Deleted,
            (*cur).clone(),
            Some(cur),
            store,
        );
        self.after_removal(def, ns, store);
        Ok(((*obj).clone(), true))
    }

    fn delete_namespace(
        &mut self,
        def: &ResourceDef,
        name: &str,
        cur: Arc<Value>,
        store: &Store,
    ) -> (Value, bool) {
        let mut latest = cur.clone();
        if meta_str(&cur, "deletionTimestamp").is_none() {
            let mut new = (*cur).clone();
            meta_mut(&mut new).insert("deletionTimestamp".into(), json!(now()));
            new["status"] = json!({"phase": "Terminating"});
            latest = self.commit(def, "", name, EventType::Modified, new, Some(cur), store);
        }
        let namespaced: Vec<Arc<ResourceDef>> = {
            let mut seen = HashSet::new();
            self.registry
                .all()
                .filter(|d| d.namespaced && seen.insert(d.storage_key()))
                .cloned()
                .collect()
        };
        for d in namespaced {
            let names: Vec<String> = self
                .objects
                .get(&d.storage_key())
                .map(|m| {
                    m.range((name.to_string(), String::new())..)
                        .take_while(|((n, _), _)| n == name)
                        .map(|((_, o), _)| o.clone())
                        .collect()
                })
                .unwrap_or_default();
            for o in names {
                // Errors cannot occur for objects just listed under the same lock.
                let _ = self.delete(&d, name, &o, &DeleteOpts::default(), store);
            }
        }
        match self.finalize_namespace(name, store) {
            Some(obj) => ((*obj).clone(), true),
            None => ((*latest).clone(), false),
        }
    }

    /// Removes a terminating namespace once nothing is left in it.
    fn finalize_namespace(&mut self, ns: &str, store: &Store) -> Option<Arc<Value>> {
        let cur = self
            .objects
            .get("namespaces")?
            .get(&(String::new(), ns.to_string()))?
            .clone();
        meta_str(&cur, "deletionTimestamp")?;
        let start = (ns.to_string(), String::new());
        let non_empty = self.objects.iter().any(|(k, m)| {
            k != "namespaces" && m.range(start.clone()..).next().is_some_and(|((n, _), _)| n == ns)
        });
        if non_empty {
            return None;
        }
        let def = self.registry.find("", "v1", "namespaces")?;
        Some(self.commit(&def, "", ns, EventType::Deleted, (*cur).clone(), Some(cur), store))
    }

    fn after_removal(&mut self, def: &ResourceDef, ns: &str, store: &Store) {
        if def.namespaced {
            self.finalize_namespace(ns, store);
        }
    }

    /// Removes the ownerReferences to `uid` from its dependents (`propagationPolicy=Orphan`).
    fn orphan_dependents(&mut self, uid: &str, store: &Store) {
        let deps: Vec<ObjRef> = self
            .dependents
            .get(uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        for dep in deps {
            let Some(def) = self.registry.by_storage_key(&dep.key) else {
                continue;
            };
            let Some(obj) = self.get(&def, &dep.ns, &dep.name) else {
                continue;
            };
            let mut new = (*obj).clone();
            let meta = meta_mut(&mut new);
            if let Some(Value::Array(refs)) = meta.get_mut("ownerReferences") {
                refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
                if refs.is_empty() {
                    meta.remove("ownerReferences");
                }
            }
            self.commit(
                &def,
                &dep.ns,
                &dep.name,
                EventType::Modified,
                new,
                Some(obj),
                store,
            );
        }
    }

    /// Whether the object with this uid waits for its dependents (foreground deletion).
    fn in_foreground_deletion(&self, uid: &str) -> bool {
        let Some(r) = self.uids.get(uid) else {
            return false;
        };
        self.objects
            .get(&r.key)
            .and_then(|m| m.get(&(r.ns.clone(), r.name.clone())))
            .is_some_and(|o| {
                meta_str(o, "deletionTimestamp").is_some()
                    && finalizers(o).iter().any(|f| f == FOREGROUND_FINALIZER)
            })
    }

    /// One garbage collector step for `uid`: if that object is gone, its dependents without any
    /// remaining owner are deleted (background); if it is in foreground deletion, its
    /// dependents are deleted and, once no blocking one (`blockOwnerDeletion`) is left, its
    /// `foregroundDeletion` finalizer is removed.
    fn collect(&mut self, uid: &str, store: &Store) {
        let deps: Vec<ObjRef> = self
            .dependents
            .get(uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        let Some(owner) = self.uids.get(uid).cloned() else {
            for dep in deps {
                let Some(def) = self.registry.by_storage_key(&dep.key) else {
                    continue;
                };
                let Some(obj) = self.get(&def, &dep.ns, &dep.name) else {
                    continue;
                };
                if owner_uids(&obj).iter().any(|o| self.uids.contains_key(o)) {
                    continue;
                }
                // Gone meanwhile (404) is fine.
                let _ = self.delete(&def, &dep.ns, &dep.name, &DeleteOpts::default(), store);
            }
            return;
        };
        if !self.in_foreground_deletion(uid) {
            return;
        }
        let mut blocked = false;
        for dep in deps {
            let Some(def) = self.registry.by_storage_key(&dep.key) else {
                continue;
            };
            let Some(obj) = self.get(&def, &dep.ns, &dep.name) else {
                continue;
            };
            let opts = DeleteOpts {
                propagation: Propagation::Foreground,
                ..DeleteOpts::default()
            };
            if meta_str(&obj, "deletionTimestamp").is_none() {
                let _ = self.delete(&def, &dep.ns, &dep.name, &opts, store);
            }
            let blocks = self.get(&def, &dep.ns, &dep.name).is_some_and(|o| {
                o.pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| {
                        refs.iter().any(|r| {
                            r.get("uid").and_then(Value::as_str) == Some(uid)
                                && r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true)
                        })
                    })
            });
            blocked |= blocks;
        }
        if blocked {
            return;
        }
        let Some(def) = self.registry.by_storage_key(&owner.key) else {
            return;
        };
        let Some(cur) = self.get(&def, &owner.ns, &owner.name) else {
            return;
        };
        let fins: Vec<String> = finalizers(&cur)
            .into_iter()
            .filter(|f| f != FOREGROUND_FINALIZER)
            .collect();
        let mut new = (*cur).clone();
        let meta = meta_mut(&mut new);
        if fins.is_empty() {
            meta.remove("finalizers");
        } else {
            meta.insert("finalizers".into(), json!(fins));
        }
        let type_ = if fins.is_empty() {
            EventType::Deleted
        } else {
            EventType::Modified
        };
        self.commit(&def, &owner.ns, &owner.name, type_, new, Some(cur), store);
        if type_ == EventType::Deleted {
            self.after_removal(&def, &owner.ns, store);
        }
    }
}

fn crd_status(crd: &Value) -> Value {
    let t = now();
    let storage: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    json!({
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": t},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": t},
        ],
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "storedVersions": storage,
    })
}
