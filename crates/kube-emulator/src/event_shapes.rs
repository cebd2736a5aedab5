//! `core/v1` Events and `events.k8s.io/v1` Events are one resource in two shapes, as in the real
//! API server: both are stored once, in the core shape under the core `events` key, and every
//! request through `events.k8s.io` is converted on the way in and out. The conversion is a rename
//! of top-level fields (the same pairs as Kubernetes' own events/v1 conversion); everything else
//! (metadata, `reportingInstance`, `related`, `series`, `action`, `type`, `reason`, `eventTime`)
//! is shared as is.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::resources::ResourceDef;

/// (events.k8s.io/v1 name, core/v1 name).
const RENAMES: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedCount", "count"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedSource", "source"),
    ("reportingController", "reportingComponent"),
];

const CORE_API_VERSION: &str = "v1";
const EVENTS_GROUP: &str = "events.k8s.io";
const EVENTS_API_VERSION: &str = "events.k8s.io/v1";

/// Whether `def` is the `events.k8s.io` shape, served from the core storage.
pub fn is_events_v1(def: &ResourceDef) -> bool {
    def.group == EVENTS_GROUP && def.plural == "events"
}

fn core_name(v1: &str) -> Option<&'static str> {
    RENAMES.iter().find(|(a, _)| *a == v1).map(|(_, b)| *b)
}

fn v1_name(core: &str) -> Option<&'static str> {
    RENAMES.iter().find(|(_, b)| *b == core).map(|(a, _)| *a)
}

/// Renames top-level keys. A key that only exists in the target shape is dropped: it cannot
/// come from a valid source object, and keeping it would let it overwrite the converted field.
fn rename(obj: Map<String, Value>, to_core: bool, api_version: &str) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in obj {
        let (renamed, foreign) = if to_core {
            (core_name(&k), v1_name(&k).is_some())
        } else {
            (v1_name(&k), core_name(&k).is_some())
        };
        match (renamed, k.as_str()) {
            (Some(n), _) => {
                out.insert(n.to_string(), v);
            }
            (None, "apiVersion") => {
                out.insert(k, Value::String(api_version.to_string()));
            }
            (None, _) if foreign => {}
            (None, _) => {
                out.insert(k, v);
            }
        }
    }
    out
}

/// An events.k8s.io/v1 object or patch body in the core shape. Non-objects pass through so the
/// store reports them as it does for every other resource.
pub fn to_core(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(rename(m, true, CORE_API_VERSION)),
        other => other,
    }
}

/// A stored (core-shaped) Event in the events.k8s.io/v1 shape.
pub fn to_events_v1(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(rename(m.clone(), false, EVENTS_API_VERSION)),
        other => other.clone(),
    }
}

/// A JSON patch (RFC 6902) written against the events.k8s.io shape, for the core shape: only the
/// first segment of `path`/`from` names a renamed field.
pub fn json_patch_to_core(v: Value) -> Value {
    let Value::Array(ops) = v else { return v };
    let fix = |p: &str| -> String {
        let rest = p.strip_prefix('/').unwrap_or(p);
        let (first, tail) = rest.split_once('/').map_or((rest, None), |(a, b)| (a, Some(b)));
        match (core_name(first), tail) {
            (Some(n), Some(t)) => format!("/{n}/{t}"),
            (Some(n), None) => format!("/{n}"),
            (None, _) => p.to_string(),
        }
    };
    Value::Array(
        ops.into_iter()
            .map(|mut op| {
                for key in ["path", "from"] {
                    if let Some(p) = op.get(key).and_then(Value::as_str).map(&fix) {
                        op[key] = Value::String(p);
                    }
                }
                if op.get("path").and_then(Value::as_str) == Some("/apiVersion") && op.get("value").is_some()
                {
                    op["value"] = Value::String(CORE_API_VERSION.to_string());
                }
                op
            })
            .collect(),
    )
}

/// A field selector on events.k8s.io/v1 field names (`regarding.name`, `reportingController`)
/// rewritten to the core names the stored objects carry (`involvedObject.name`,
/// `reportingComponent`). Only a term's key is touched, so values are kept byte for byte.
pub fn field_selector_to_core(sel: &str) -> String {
    sel.split(',')
        .map(|term| {
            let key_end = term.find(['=', '!']).unwrap_or(term.len());
            let (key, rest) = term.split_at(key_end);
            let trimmed = key.trim();
            let core_key = match trimmed.split_once('.') {
                Some((head, tail)) => core_name(head).map(|n| format!("{n}.{tail}")),
                None => core_name(trimmed).map(String::from),
            };
            match core_key {
                Some(k) => format!("{k}{rest}"),
                None => term.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Errors about the shared storage name the core resource (`events "x" not found`); a request
/// through events.k8s.io gets them in its own group (`events.events.k8s.io "x" not found`), as
/// from the real server.
pub fn error_in_events_group(mut e: ApiError) -> ApiError {
    if e.details.group.is_none() && e.details.kind.as_deref() == Some("events") {
        e.details.group = Some(EVENTS_GROUP.to_string());
        e.message = e.message.replacen("events \"", "events.events.k8s.io \"", 1);
    }
    e
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn round_trip_renames_every_pair() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"name": "p"}, "note": "n", "deprecatedCount": 2, "reportingController": "c",
            "reportingInstance": "i", "series": {"count": 2}, "involvedObject": {"name": "ignored"}});
        let core = to_core(v1.clone());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "n");
        assert_eq!(core["count"], 2);
        assert_eq!(core["reportingComponent"], "c");
        assert!(core.get("regarding").is_none());
        let back = to_events_v1(&core);
        let mut expected = v1;
        expected.as_object_mut().map(|m| m.remove("involvedObject"));
        assert_eq!(back, expected);
    }

    #[test]
    fn selectors_and_json_patches_use_core_names() {
        assert_eq!(
            field_selector_to_core("regarding.name=a,type!=Normal,reportingController==x"),
            "involvedObject.name=a,type!=Normal,reportingComponent==x"
        );
        let p = json_patch_to_core(json!([{"op": "replace", "path": "/note", "value": "m"}]));
        assert_eq!(p[0]["path"], "/message");
    }
}
