//! Create, update (PUT) and patch: admission (validation, defaulting, pruning), generation and no-op detection.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    EventType, FieldValidation, State, Store, WriteOpts, WriteOutcome, finalizers, meta_mut, meta_str, now,
};
use crate::error::{ApiError, ApiResult, Cause};
use crate::fields::{self, Entry, FieldSet};
use crate::patch::{self, PatchType};
use crate::resources::{ResourceDef, defs_from_crd};
use crate::schema;

/// Makes `to`'s status that of `from` (none if `from` has none).
fn copy_status(to: &mut Value, from: &Value) {
    match from.get("status") {
        Some(s) => to["status"] = s.clone(),
        None => {
            if let Value::Object(o) = to {
                o.remove("status");
            }
        }
    }
}

/// Name/namespace in a PUT/apply body must agree with the URL.
pub(super) fn check_body_identity(
    def: &ResourceDef,
    ns: &str,
    name: &str,
    body: &mut Value,
) -> ApiResult<()> {
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

/// Whether `a` and `b` are equal but for the keys `skip` (when both are objects), the values of
/// the other keys compared with `same`. Compared in place, without copying either: the store's
/// no-op and generation checks run on every write.
fn same_but(a: &Value, b: &Value, skip: &[&str], same: &dyn Fn(&str, &Value, &Value) -> bool) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let kept = |m: &serde_json::Map<String, Value>| m.keys().filter(|k| !skip.contains(&k.as_str())).count();
    kept(a) == kept(b)
        && a.iter()
            .filter(|(k, _)| !skip.contains(&k.as_str()))
            .all(|(k, av)| b.get(k).is_some_and(|bv| same(k, av, bv)))
}

fn equal(_: &str, a: &Value, b: &Value) -> bool {
    a == b
}

/// Whether anything but metadata (and status when it is a subresource) differs: what
/// `generation` tracks.
fn spec_differs(def: &ResourceDef, a: &Value, b: &Value) -> bool {
    let skip: &[&str] = if def.status_subresource {
        &["metadata", "status"]
    } else {
        &["metadata"]
    };
    !same_but(a, b, skip, &equal)
}

/// Equality for no-op detection: resourceVersion and managedFields timestamps do not count
/// (a change of field ownership does, as on the real server).
fn same_content(a: &Value, b: &Value) -> bool {
    let managed_fields = |a: &Value, b: &Value| match (a.as_array(), b.as_array()) {
        (Some(a), Some(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(ea, eb)| same_but(ea, eb, &["time"], &equal))
        }
        _ => a == b,
    };
    let metadata = |k: &str, a: &Value, b: &Value| match k {
        "managedFields" => managed_fields(a, b),
        _ => a == b,
    };
    same_but(a, b, &[], &|k, a, b| match k {
        "metadata" => same_but(a, b, &["resourceVersion"], &metadata),
        _ => a == b,
    })
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

impl Store {
    pub fn create(
        &self,
        def: &ResourceDef,
        ns: &str,
        body: Value,
        opts: &WriteOpts,
    ) -> ApiResult<WriteOutcome> {
        // As etcd3's store does: a copy of a read object must be stripped before it is created
        // again (its stale version would otherwise pass for a precondition).
        if meta_str(&body, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
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
        // Custom resources allow no unconditional update (built-in kinds mostly do).
        if def.custom && meta_str(&body, "resourceVersion").is_none_or(str::is_empty) {
            return Err(ApiError::invalid(
                &def.group,
                &def.kind,
                &def.plural,
                name,
                vec![Cause {
                    field: "metadata.resourceVersion".into(),
                    reason: "FieldValueInvalid",
                    message: "Invalid value: 0x0: must be specified for an update".into(),
                }],
            ));
        }
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
            // Custom resources have no patch tags: the API server refuses a strategic merge.
            PatchType::Strategic if def.custom => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: \
                     application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                ));
            }
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
}

impl State {
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
            schema::coerce_integers(obj, schema);
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

    pub(super) fn create(
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
                    return Err(ApiError::namespace_terminating(
                        &def.group,
                        &def.plural,
                        &name,
                        ns,
                    ));
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
            self.set_host_ip(&mut body);
        }
        if def.group.is_empty() && def.plural == "services" {
            self.allocate_cluster_ip(def, &name, &mut body)?;
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
                object: Arc::new(body),
                created: true,
                warnings,
            });
        }
        let obj = self.commit(def, ns, &name, EventType::Added, body, None, store);
        Ok(WriteOutcome {
            object: obj,
            created: true,
            warnings,
        })
    }

    /// The shared tail of PUT, PATCH and apply once `new` is the desired object.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn update_existing(
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
        // The status subresource writes only status; the main resource never does.
        let mut merged = if status_only {
            let mut m = (**cur).clone();
            copy_status(&mut m, &new);
            m
        } else {
            let mut n = new;
            if def.status_subresource {
                copy_status(&mut n, cur);
            }
            n
        };
        merged["apiVersion"] = json!(def.api_version());
        merged["kind"] = json!(def.kind);
        {
            let empty = serde_json::Map::new();
            let cur_meta = cur.get("metadata").and_then(Value::as_object).unwrap_or(&empty);
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
                object: cur.clone(),
                created: false,
                warnings,
            });
        }
        if spec_differs(def, &merged, cur) {
            let generation = cur
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut merged).insert("generation".into(), json!(generation + 1));
        }
        if opts.dry_run {
            return Ok(WriteOutcome {
                object: Arc::new(merged),
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
            object: obj,
            created: false,
            warnings,
        })
    }
}

/// Where the emulator's Service cluster IPs come from (`--service-cluster-ip-range` of a real API server):
/// 10.96.0.0/16, handed out from 10.96.0.10 up, so a Neutron service subnet of the same range holds them.
const SERVICE_RANGE: (u32, u32) = (0x0a60_000a, 0x0a60_ffff);

impl State {
    /// Gives a Service its cluster IP the way the API server does: none for ExternalName, "None" kept for
    /// headless, a requested one checked for conflicts, otherwise the lowest free one of the range.
    fn allocate_cluster_ip(&self, def: &ResourceDef, name: &str, body: &mut Value) -> ApiResult<()> {
        let ty = body
            .pointer("/spec/type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP");
        if ty == "ExternalName" {
            return Ok(());
        }
        let requested = body
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if requested == "None" {
            return Ok(());
        }
        let used: HashSet<String> = self
            .objects
            .get(&def.storage_key())
            .map(|objs| {
                objs.values()
                    .filter_map(|o| {
                        o.pointer("/spec/clusterIP")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let ip = if requested.is_empty() {
            let free = (SERVICE_RANGE.0..=SERVICE_RANGE.1)
                .map(|n| std::net::Ipv4Addr::from(n).to_string())
                .find(|ip| !used.contains(ip));
            free.ok_or_else(|| {
                ApiError::invalid(
                    &def.group,
                    &def.kind,
                    &def.plural,
                    name,
                    vec![Cause::invalid(
                        "spec.clusterIP",
                        "the service cluster IP range is full",
                    )],
                )
            })?
        } else if used.contains(&requested) {
            return Err(ApiError::invalid(
                &def.group,
                &def.kind,
                &def.plural,
                name,
                vec![Cause::invalid(
                    "spec.clusterIPs",
                    format!("failed to allocate IP {requested}: provided IP is already allocated"),
                )],
            ));
        } else {
            requested
        };
        if let Some(spec) = body.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("clusterIP".into(), json!(ip));
            spec.insert("clusterIPs".into(), json!([ip]));
        }
        Ok(())
    }
}
