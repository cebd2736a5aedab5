//! Persistence: the whole state as one JSON document and back.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Store, meta_str};

impl Store {
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
            // Snapshots written before both Event shapes shared one storage may hold
            // events.k8s.io-shaped Events: they belong in the core storage, in the core shape.
            let converted;
            let (def, obj) = match st.registry.find("", "v1", "events") {
                Some(core) if crate::event_shapes::is_events_v1(&def) => {
                    converted = crate::event_shapes::to_core(obj.clone());
                    (core, &converted)
                }
                _ => (def, obj),
            };
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
