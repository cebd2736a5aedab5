//! Patch semantics: JSON patch, JSON merge patch, strategic merge patch (for the built-in kinds'
//! keyed lists) and the field sets behind server-side apply.

use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};

/// The four PATCH content types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> ApiResult<Self> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/json-patch+json" => Ok(Self::Json),
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(Self::Apply),
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }
}

/// RFC 6902 patch; a failing `test` op is a 422, like the real server. As in the real server's
/// implementation, `test` against a missing path with value `null` passes (kube-rs' finalizer
/// helper relies on that to assert "no finalizers yet").
pub fn json_patch(doc: &mut Value, body: &Value) -> ApiResult<()> {
    let patch: json_patch::Patch = serde_json::from_value(body.clone())
        .map_err(|e| ApiError::bad_request(format!("json patch is not a valid list of operations: {e}")))?;
    let mut work = doc.clone();
    for (i, op) in patch.0.iter().enumerate() {
        if let json_patch::PatchOperation::Test(t) = op
            && t.value.is_null()
            && work.pointer(t.path.as_str()).is_none_or(Value::is_null)
        {
            continue;
        }
        json_patch::patch(&mut work, std::slice::from_ref(op)).map_err(|e| {
            let msg = format!(
                "operation {i} ({}) failed: {e}",
                serde_json::to_string(op).unwrap_or_default()
            );
            let mut err = ApiError::new(
                422,
                "Invalid",
                format!("the server rejected our request due to an error in our request: {msg}"),
            );
            err.details
                .causes
                .push(crate::error::Cause::invalid("patch", msg));
            err
        })?;
    }
    *doc = work;
    Ok(())
}

/// RFC 7386 merge patch.
pub fn merge_patch(doc: &mut Value, body: &Value) -> ApiResult<()> {
    if !body.is_object() {
        return Err(ApiError::bad_request("merge patch body must be a JSON object"));
    }
    json_patch::merge(doc, body);
    Ok(())
}

/// The merge key of a list field, from the patch tags of the core API types; `None` means the
/// list is atomic (replaced wholesale).
pub(crate) fn merge_key(field: &str, target: &[Value], patch: &[Value]) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" | "addresses" => "type",
        "ownerReferences" => "uid",
        "hostAliases" | "podIPs" | "hostIPs" => "ip",
        "taints" => "key",
        "topologySpreadConstraints" => "topologyKey",
        "ports" => {
            let has_container_port = target
                .iter()
                .chain(patch.iter())
                .any(|e| e.get("containerPort").is_some());
            if has_container_port {
                "containerPort"
            } else {
                "port"
            }
        }
        _ => return None,
    })
}

/// Primitive lists with `patchStrategy: merge` (union instead of replace).
fn primitive_merge(field: &str) -> bool {
    field == "finalizers"
}

/// Removes `$patch`, `$setElementOrder/...`, `$retainKeys`, `$deleteFromPrimitiveList/...` directives.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|e| e.get("$patch").is_none())
                .map(strip_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Strategic merge patch of `patch` into `target`.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> ApiResult<()> {
    let Value::Object(pm) = patch else {
        return Err(ApiError::bad_request(
            "strategic merge patch body must be a JSON object",
        ));
    };
    if pm.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip_directives(patch);
        return Ok(());
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(tm) = target else { return Ok(()) };
    for (k, v) in pm {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(remove)) = (tm.get_mut(field), v) {
                list.retain(|e| !remove.contains(e));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                tm.remove(k);
            }
            Value::Object(inner) if inner.get("$patch").and_then(Value::as_str) == Some("delete") => {
                tm.remove(k);
            }
            Value::Object(_) => {
                let slot = tm.entry(k.clone()).or_insert(Value::Null);
                strategic_merge(slot, v)?;
            }
            Value::Array(items) => {
                let merged = match tm.get(k) {
                    Some(Value::Array(existing)) => merge_list(k, existing, items)?,
                    _ => strip_directives(v),
                };
                tm.insert(k.clone(), merged);
            }
            other => {
                tm.insert(k.clone(), other.clone());
            }
        }
    }
    if let Some(Value::Array(keep)) = pm.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        tm.retain(|k, _| keep.contains(&k.as_str()) || pm.contains_key(k));
    }
    Ok(())
}

fn merge_list(field: &str, target: &[Value], patch: &[Value]) -> ApiResult<Value> {
    if patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(strip_directives(&Value::Array(patch.to_vec())));
    }
    if primitive_merge(field) {
        let mut out = target.to_vec();
        for e in patch {
            if !out.contains(e) {
                out.push(e.clone());
            }
        }
        return Ok(Value::Array(out));
    }
    let Some(key) = merge_key(field, target, patch) else {
        return Ok(strip_directives(&Value::Array(patch.to_vec())));
    };
    let mut out = target.to_vec();
    for e in patch {
        let Some(kv) = e.get(key) else {
            return Err(ApiError::bad_request(format!(
                "map: {e} does not contain declared merge key: {key} (field {field})"
            )));
        };
        let pos = out.iter().position(|t| t.get(key) == Some(kv));
        if e.get("$patch").and_then(Value::as_str) == Some("delete") {
            out.retain(|t| t.get(key) != Some(kv));
            continue;
        }
        match pos {
            Some(i) => strategic_merge(&mut out[i], e)?,
            None => out.push(strip_directives(e)),
        }
    }
    Ok(Value::Array(out))
}

/// The `fieldsV1` set of an applied configuration: maps become `f:` trees, lists are owned atomically.
pub fn field_set(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind" | "name" | "namespace"))
                .map(|(k, v)| (format!("f:{k}"), field_set(v)))
                .collect(),
        ),
        _ => Value::Object(Map::new()),
    }
}

/// Removes from `target` the fields a manager owned before (`old`) but no longer applies (`new`).
pub fn remove_dropped_fields(target: &mut Value, old: &Value, new: &Value) {
    let (Some(old), Some(Value::Object(tm))) = (old.as_object(), Some(target)) else {
        return;
    };
    for (fk, old_sub) in old {
        let Some(k) = fk.strip_prefix("f:") else { continue };
        match new.get(fk) {
            None => {
                tm.remove(k);
            }
            Some(new_sub) => {
                if let Some(t) = tm.get_mut(k)
                    && t.is_object()
                {
                    remove_dropped_fields(t, old_sub, new_sub);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merges_containers_by_name_and_deletes() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}
        ]}, "metadata": {"finalizers": ["f1"]}});
        let patch = json!({
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "metadata": {"finalizers": ["f2"]},
            "spec": {"containers": [
                {"name": "a", "env": [{"name": "Y", "value": "2"}]},
                {"name": "b", "$patch": "delete"},
                {"name": "c", "image": "c:1"}
            ]}
        });
        strategic_merge(&mut pod, &patch).expect("patch applies");
        assert_eq!(
            pod,
            json!({"spec": {"containers": [
                {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
                {"name": "c", "image": "c:1"}
            ]}, "metadata": {"finalizers": ["f1", "f2"]}})
        );
    }

    #[test]
    fn json_patch_test_failure_is_invalid() {
        let mut doc = json!({"metadata": {"finalizers": ["x"]}});
        let body = json!([{"op": "test", "path": "/metadata/finalizers", "value": ["y"]},
                          {"op": "remove", "path": "/metadata/finalizers/0"}]);
        let err = json_patch(&mut doc, &body).expect_err("test op must fail");
        assert_eq!(err.code, 422);
        assert_eq!(doc, json!({"metadata": {"finalizers": ["x"]}}));
    }

    #[test]
    fn apply_drops_fields_no_longer_applied() {
        let mut obj = json!({"metadata": {"labels": {"a": "1", "b": "2", "other": "x"}}});
        let old = field_set(&json!({"metadata": {"labels": {"a": "1", "b": "2"}}}));
        let new = field_set(&json!({"metadata": {"labels": {"a": "1"}}}));
        remove_dropped_fields(&mut obj, &old, &new);
        assert_eq!(obj, json!({"metadata": {"labels": {"a": "1", "other": "x"}}}));
    }
}
