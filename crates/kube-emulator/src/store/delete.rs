//! Deletion: preconditions, finalizers, propagation policies and namespace termination.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    DeleteOpts, EventType, FOREGROUND_FINALIZER, ListOpts, Propagation, State, Store, finalizers, meta_mut,
    meta_str, now,
};
use crate::error::{ApiError, ApiResult};
use crate::resources::{ResourceDef, defs_from_crd};

impl Store {
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
}

impl State {
    pub(super) fn delete(
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
                mark_deleting(&mut out, foreground);
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
            mark_deleting(&mut new, foreground);
            meta_mut(&mut new).insert("generation".into(), json!(generation + 1));
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

    pub(super) fn namespace_terminating(&self, ns: &str) -> Option<bool> {
        let obj = self
            .objects
            .get("namespaces")?
            .get(&(String::new(), ns.to_string()))?;
        Some(meta_str(obj, "deletionTimestamp").is_some())
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

    pub(super) fn after_removal(&mut self, def: &ResourceDef, ns: &str, store: &Store) {
        if def.namespaced {
            self.finalize_namespace(ns, store);
        }
    }
}

/// Sets the deletion timestamp of an object that finalizers (or, with `foreground`, its
/// dependents) keep around for now.
fn mark_deleting(obj: &mut Value, foreground: bool) {
    let mut fins = finalizers(obj);
    let meta = meta_mut(obj);
    meta.insert("deletionTimestamp".into(), json!(now()));
    meta.insert("deletionGracePeriodSeconds".into(), json!(0));
    if foreground {
        fins.push(FOREGROUND_FINALIZER.to_string());
        meta.insert("finalizers".into(), json!(fins));
    }
}
