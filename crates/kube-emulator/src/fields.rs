//! Field ownership for server-side apply: the `fieldsV1` sets of `metadata.managedFields`, the
//! comparison of two objects by field path, and the conflict rules of the real apiserver's field
//! manager (structured-merge-diff), for the list types the kinds served here use:
//! associative lists keyed by their merge key (`containers` by `name`, ...), `finalizers` as a
//! set, every other list atomic. Custom resources' lists are atomic outside `metadata`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::error::{ApiError, Cause};
use crate::patch;

/// One path element as written in `fieldsV1`: `f:name`, `k:{"name":"c1"}` or `v:"value"`.
pub type Path = Vec<String>;
pub type FieldSet = BTreeSet<Path>;

/// Server-owned metadata fields never tracked by the field manager.
const IGNORED_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// How lists are treated while walking an object.
#[derive(Clone, Copy)]
pub struct Schema {
    /// Built-in kinds: lists with a known merge key are associative everywhere; custom resources
    /// only inside `metadata` (ObjectMeta is shared by every kind).
    pub builtin: bool,
}

/// The leaves of `obj` by path; `None` marks an associative or set list item (owned as a
/// whole, compared by presence only).
pub fn leaves(obj: &Value, schema: Schema) -> BTreeMap<Path, Option<&Value>> {
    let mut out = BTreeMap::new();
    if let Value::Object(m) = obj {
        for (k, v) in m {
            if matches!(k.as_str(), "apiVersion" | "kind") {
                continue;
            }
            if k == "metadata" {
                if let Value::Object(meta) = v {
                    for (mk, mv) in meta {
                        if IGNORED_META.contains(&mk.as_str()) {
                            continue;
                        }
                        let path = vec!["f:metadata".to_string(), format!("f:{mk}")];
                        walk(mk, mv, path, true, &mut out);
                    }
                }
                continue;
            }
            walk(k, v, vec![format!("f:{k}")], schema.builtin, &mut out);
        }
    }
    out
}

fn walk<'a>(field: &str, v: &'a Value, path: Path, keyed: bool, out: &mut BTreeMap<Path, Option<&'a Value>>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let mut p = path.clone();
                p.push(format!("f:{k}"));
                walk(k, child, p, keyed, out);
            }
        }
        Value::Array(items) if keyed && field == "finalizers" => {
            for item in items {
                let mut p = path.clone();
                p.push(format!("v:{item}"));
                out.insert(p, None);
            }
        }
        Value::Array(items) if keyed && !items.is_empty() => {
            let key = patch::merge_key(field, items, &[]);
            match key.filter(|k| items.iter().all(|i| i.get(k).is_some())) {
                Some(key) => {
                    for item in items {
                        let mut kv = Map::new();
                        kv.insert(key.to_string(), item.get(key).cloned().unwrap_or(Value::Null));
                        let mut p = path.clone();
                        p.push(format!("k:{}", Value::Object(kv)));
                        out.insert(p.clone(), None);
                        if let Value::Object(fields) = item {
                            for (k, child) in fields {
                                let mut cp = p.clone();
                                cp.push(format!("f:{k}"));
                                walk(k, child, cp, keyed, out);
                            }
                        }
                    }
                }
                None => {
                    out.insert(path, Some(v));
                }
            }
        }
        _ => {
            out.insert(path, Some(v));
        }
    }
}

/// The field set of an applied configuration (or of a whole object).
pub fn set_of(obj: &Value, schema: Schema) -> FieldSet {
    leaves(obj, schema).into_keys().collect()
}

/// Paths added or modified, and paths removed, going from `old` to `new`.
pub fn compare(old: &Value, new: &Value, schema: Schema) -> (FieldSet, FieldSet) {
    let a = leaves(old, schema);
    let b = leaves(new, schema);
    let changed = b
        .iter()
        .filter(|(p, v)| a.get(*p) != Some(*v))
        .map(|(p, _)| p.clone())
        .collect();
    let removed = a.keys().filter(|p| !b.contains_key(*p)).cloned().collect();
    (changed, removed)
}

/// `fieldsV1` tree of a set (`.` marks a path that is a member and has children).
pub fn to_fields_v1(set: &FieldSet) -> Value {
    #[derive(Default)]
    struct Node {
        member: bool,
        children: BTreeMap<String, Node>,
    }
    fn render(node: &Node) -> Value {
        let mut m: Map<String, Value> = node
            .children
            .iter()
            .map(|(k, c)| (k.clone(), render(c)))
            .collect();
        if node.member && !m.is_empty() {
            m.insert(".".into(), json!({}));
        }
        Value::Object(m)
    }
    let mut root = Node::default();
    for path in set {
        let mut node = &mut root;
        for tok in path {
            node = node.children.entry(tok.clone()).or_default();
        }
        node.member = true;
    }
    render(&root)
}

/// Parses a `fieldsV1` tree.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn rec(node: &Map<String, Value>, path: &mut Path, out: &mut FieldSet) {
        for (tok, child) in node {
            if tok == "." {
                out.insert(path.clone());
                continue;
            }
            path.push(tok.clone());
            match child {
                Value::Object(m) if !m.is_empty() => rec(m, path, out),
                _ => {
                    out.insert(path.clone());
                }
            }
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    if let Value::Object(m) = v {
        rec(m, &mut Vec::new(), &mut out);
    }
    out
}

/// `.spec.containers[name="c1"].image`, as the apiserver prints a path.
pub fn path_string(path: &Path) -> String {
    let mut s = String::new();
    for tok in path {
        if let Some(f) = tok.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = tok.strip_prefix("k:") {
            let parts: Vec<String> = match serde_json::from_str::<Value>(k) {
                Ok(Value::Object(m)) => m.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                _ => vec![k.to_string()],
            };
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = tok.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        } else {
            s.push_str(&format!("[{tok}]"));
        }
    }
    s
}

fn item_matches(item: &Value, tok: &str) -> bool {
    if let Some(k) = tok.strip_prefix("k:") {
        match serde_json::from_str::<Value>(k) {
            Ok(Value::Object(keys)) => keys.iter().all(|(k, v)| item.get(k) == Some(v)),
            _ => false,
        }
    } else if let Some(v) = tok.strip_prefix("v:") {
        serde_json::from_str::<Value>(v).is_ok_and(|v| &v == item)
    } else {
        false
    }
}

/// Removes the field at `path` from `obj` (a no-op when it is not there).
pub fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = obj;
    for tok in parents {
        let next = if let Some(f) = tok.strip_prefix("f:") {
            node.get_mut(f)
        } else {
            node.as_array_mut()
                .and_then(|a| a.iter_mut().find(|i| item_matches(i, tok)))
        };
        match next {
            Some(n) => node = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Value::Object(m) = node {
            m.remove(f);
        }
    } else if let Value::Array(a) = node {
        a.retain(|i| !item_matches(i, last));
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub subresource: String,
    pub api_version: String,
    pub time: Option<Value>,
    pub set: FieldSet,
    /// Changed by this request (gets a fresh timestamp).
    pub touched: bool,
}

impl Entry {
    pub fn same_owner(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }

    /// `"kubectl"`, `"kubectl-patch" using v1`, ... as the apiserver names a manager in conflicts.
    pub fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == "Update" {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }
}

/// The managedFields of an object.
pub fn entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|m| {
                    let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                    Entry {
                        manager: s("manager"),
                        operation: s("operation"),
                        subresource: s("subresource"),
                        api_version: s("apiVersion"),
                        time: m.get("time").cloned(),
                        set: m.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
                        touched: false,
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Renders entries back into `managedFields` (empty sets are dropped, like the real server).
pub fn render(entries: &[Entry], now: &str) -> Value {
    Value::Array(
        entries
            .iter()
            .filter(|e| !e.set.is_empty())
            .map(|e| {
                let mut m =
                    json!({"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version});
                match (&e.time, e.touched) {
                    (Some(t), false) => m["time"] = t.clone(),
                    _ => m["time"] = json!(now),
                }
                m["fieldsType"] = json!("FieldsV1");
                m["fieldsV1"] = to_fields_v1(&e.set);
                if !e.subresource.is_empty() {
                    m["subresource"] = json!(e.subresource);
                }
                m
            })
            .collect(),
    )
}

/// Whether `set` holds `path` or anything below it.
fn owns_within(set: &FieldSet, path: &Path) -> bool {
    set.range(path.clone()..)
        .next()
        .is_some_and(|p| p.starts_with(path))
}

/// Fields `manager` applied before (`last`) but no longer does (`now`): removed from `obj`
/// unless another manager still owns them (or something inside them).
pub fn prune(obj: &mut Value, last: &FieldSet, now: &FieldSet, others: &[&Entry]) {
    // In path order a list item comes before its fields: once it is gone they are too.
    let mut removed: Vec<&Path> = Vec::new();
    for p in last.difference(now) {
        if removed.iter().any(|r| p.starts_with(r)) || others.iter().any(|e| owns_within(&e.set, p)) {
            continue;
        }
        if is_item_key(p) {
            // The key of an item that stays (someone else owns part of it) stays too.
            continue;
        }
        remove_path(obj, p);
        removed.push(p);
    }
}

/// `[..., k:{"name":"c1"}, f:name]`: the merge key field of a list item.
fn is_item_key(p: &Path) -> bool {
    let [.., parent, last] = p.as_slice() else {
        return false;
    };
    match (parent.strip_prefix("k:"), last.strip_prefix("f:")) {
        (Some(keys), Some(field)) => serde_json::from_str::<Value>(keys)
            .ok()
            .is_some_and(|k| k.get(field).is_some()),
        _ => false,
    }
}

/// The conflict error of an apply, worded like the apiserver's.
pub fn conflict_error(conflicts: &[(String, Path)]) -> ApiError {
    let msg = if let [(manager, path)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {manager}: {}",
            path_string(path)
        )
    } else {
        let mut by_manager: BTreeMap<&str, Vec<&Path>> = BTreeMap::new();
        for (m, p) in conflicts {
            by_manager.entry(m).or_default().push(p);
        }
        let mut lines = Vec::new();
        for (m, paths) in by_manager {
            lines.push(format!("conflicts with {m}:"));
            lines.extend(paths.iter().map(|p| format!("- {}", path_string(p))));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let mut err = ApiError::new(409, "Conflict", msg);
    err.details.causes = conflicts
        .iter()
        .map(|(m, p)| Cause {
            field: path_string(p),
            reason: "FieldManagerConflict",
            message: format!("conflict with {m}"),
        })
        .collect();
    err
}

/// The ownership bookkeeping of one write, given the live object and the object about to be
/// stored. `applied` is the manager's applied field set for an apply, `None` for an update.
/// Returns the new entries, or the conflicts of an apply that is not forced.
#[allow(clippy::too_many_arguments)]
pub fn track(
    mut entries: Vec<Entry>,
    live: &Value,
    new: &Value,
    schema: Schema,
    manager: Option<&str>,
    subresource: &str,
    api_version: &str,
    applied: Option<FieldSet>,
    force: bool,
) -> Result<Vec<Entry>, ApiError> {
    let (changed, removed) = compare(live, new, schema);
    let operation = if applied.is_some() { "Apply" } else { "Update" };
    let me = |e: &Entry| manager.is_some_and(|m| e.same_owner(m, operation, subresource));
    let mut conflicts = Vec::new();
    for e in entries.iter().filter(|e| !me(e)) {
        for p in e.set.intersection(&changed) {
            conflicts.push((e.describe(), p.clone()));
        }
    }
    if applied.is_some() && !force && !conflicts.is_empty() {
        return Err(conflict_error(&conflicts));
    }
    for e in entries.iter_mut().filter(|e| !me(e)) {
        e.set.retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    if let Some(manager) = manager {
        let pos = entries.iter().position(me);
        let mut entry = match pos {
            Some(i) => entries.remove(i),
            None => Entry {
                manager: manager.to_string(),
                operation: operation.to_string(),
                subresource: subresource.to_string(),
                api_version: api_version.to_string(),
                time: None,
                set: FieldSet::new(),
                touched: true,
            },
        };
        let set = match applied {
            Some(set) => set,
            None => entry
                .set
                .union(&changed)
                .filter(|p| !removed.contains(*p))
                .cloned()
                .collect(),
        };
        if set != entry.set {
            entry.touched = true;
        }
        entry.set = set;
        entry.api_version = api_version.to_string();
        match pos {
            Some(i) => entries.insert(i, entry),
            None => entries.push(entry),
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUILTIN: Schema = Schema { builtin: true };

    #[test]
    fn fields_v1_round_trip_with_keyed_and_set_lists() {
        let pod = json!({"metadata": {"name": "p", "labels": {"a": "1"}, "finalizers": ["x"]},
            "spec": {"containers": [{"name": "c1", "image": "i", "args": ["a"]}]}});
        let set = set_of(&pod, BUILTIN);
        let v1 = to_fields_v1(&set);
        assert_eq!(
            v1,
            json!({"f:metadata": {"f:labels": {"f:a": {}}, "f:finalizers": {"v:\"x\"": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"c1\"}": {".": {}, "f:args": {}, "f:image": {}, "f:name": {}}}}})
        );
        assert_eq!(from_fields_v1(&v1), set);
        let image: Path = vec![
            "f:spec".into(),
            "f:containers".into(),
            "k:{\"name\":\"c1\"}".into(),
            "f:image".into(),
        ];
        assert_eq!(path_string(&image), ".spec.containers[name=\"c1\"].image");
        let mut p = pod.clone();
        remove_path(&mut p, &image);
        assert!(p.pointer("/spec/containers/0/image").is_none());
        remove_path(
            &mut p,
            &["f:metadata".into(), "f:finalizers".into(), "v:\"x\"".into()],
        );
        assert_eq!(p.pointer("/metadata/finalizers"), Some(&json!([])));
    }
}
