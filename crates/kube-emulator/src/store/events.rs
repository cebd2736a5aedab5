//! Watch events: the commit of every change, the bounded event history and the per-(resource, namespace) broadcast fan-out.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

use super::{State, Store, meta_mut, meta_str, owner_uids};
use crate::error::{ApiError, ApiResult};
use crate::resources::ResourceDef;

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

/// What a new watch starts with.
pub struct WatchStart {
    /// Replayed history or synthetic ADDED events, in order.
    pub initial: Vec<Arc<WatchEvent>>,
    pub rx: broadcast::Receiver<Arc<WatchEvent>>,
    /// Live events at or below this were already covered by `initial`.
    pub start_rv: u64,
    pub kill: watch::Receiver<u64>,
}

impl Store {
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

    /// Makes every resourceVersion issued so far too old to watch from (410 Gone).
    pub fn compact(&self) {
        self.lock().compact();
    }

    /// The next `n` lists that go on with a continue token each find the history compacted
    /// since their first page: a client paging slower than the server keeps history.
    pub fn compact_before_continued_lists(&self, n: u32) {
        self.compact_continued
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a continued list about to be served is one [`Self::compact_before_continued_lists`] asked for.
    pub(super) fn take_continued_compaction(&self) -> bool {
        self.compact_continued
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok()
    }

    /// Ends every open watch; clients reconnect from their last resourceVersion.
    pub fn drop_watches(&self) {
        self.kill.send_modify(|g| *g += 1);
    }
}

impl State {
    pub(super) fn compact(&mut self) {
        self.rv += 1;
        self.history.clear();
        self.history_start = self.rv;
    }

    /// Applies a change: next rv, store, indexes, history, fan-out.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn commit(
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
}
