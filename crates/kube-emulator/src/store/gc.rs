//! The garbage collector: the owner index and deleting (or orphaning) dependents of deleted owners.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    DeleteOpts, EventType, ObjRef, Propagation, State, Store, finalizers, meta_mut, meta_str, owner_uids,
};
use crate::resources::ResourceDef;

/// The finalizer of a foreground deletion.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

impl Store {
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
}

impl State {
    /// Keeps the uid and owner indexes in step with a write.
    pub(super) fn index(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        old: Option<&Value>,
        new: Option<&Value>,
    ) {
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

    /// Removes the ownerReferences to `uid` from its dependents (`propagationPolicy=Orphan`).
    pub(super) fn orphan_dependents(&mut self, uid: &str, store: &Store) {
        let deps: Vec<ObjRef> = self
            .dependents
            .get(uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        for dep in deps {
            let Some((def, obj)) = self.resolve(&dep) else {
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

    /// The definition and current object of an indexed reference, if both still exist.
    fn resolve(&self, r: &ObjRef) -> Option<(Arc<ResourceDef>, Arc<Value>)> {
        let def = self.registry.by_storage_key(&r.key)?;
        let obj = self.get(&def, &r.ns, &r.name)?;
        Some((def, obj))
    }

    /// Whether the object with this uid waits for its dependents (foreground deletion).
    pub(super) fn in_foreground_deletion(&self, uid: &str) -> bool {
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
    pub(super) fn collect(&mut self, uid: &str, store: &Store) {
        let deps: Vec<ObjRef> = self
            .dependents
            .get(uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        let Some(owner) = self.uids.get(uid).cloned() else {
            for dep in deps {
                let Some((def, obj)) = self.resolve(&dep) else {
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
            let Some((def, obj)) = self.resolve(&dep) else {
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
        let Some((def, cur)) = self.resolve(&owner) else {
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
