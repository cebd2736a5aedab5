//! `meta.k8s.io/v1` Table output (what `kubectl get` asks for): CRD printer columns, sensible
//! columns for pods, namespaces, nodes and services, NAME/AGE for everything else.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::resources::{PrinterColumn, ResourceDef};

/// Evaluates the simple JSONPath subset printer columns use: `.a.b`, `.a[0].b`, `.a['x.y']`.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    let mut rest = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            if !key.is_empty() {
                cur = cur.get(key)?;
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let idx = r[..end].trim();
            let quoted = idx.trim_matches(|c| c == '\'' || c == '"');
            cur = if quoted.len() != idx.len() {
                cur.get(quoted)?
            } else {
                cur.get(idx.parse::<usize>().ok()?)?
            };
            rest = &r[end + 1..];
        } else {
            return None;
        }
    }
    Some(cur)
}

/// Go's `fmt.Sprintf("%v")` of decoded JSON, which is what the real server prints for object cells.
fn go_format(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(go_format).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            format!(
                "map[{}]",
                keys.iter()
                    .map(|k| format!("{k}:{}", go_format(&m[*k])))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        }
        other => other.to_string(),
    }
}

/// `k8s.io/apimachinery/pkg/util/duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    let s = secs.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y{}d", d / 365, d % 365)
    }
}

fn age(ts: Option<&Value>) -> Value {
    let Some(parsed) = ts
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<DateTime<Utc>>().ok())
    else {
        return json!("<unknown>");
    };
    json!(human_duration((Utc::now() - parsed).num_seconds()))
}

fn col(name: &str, type_: &str, format: &str, priority: i64) -> Value {
    json!({"name": name, "type": type_, "format": format, "description": "", "priority": priority})
}

fn str_or<'a>(v: &'a Value, ptr: &str, default: &'a str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or(default)
}

fn pod_cells(p: &Value) -> Vec<Value> {
    let containers = p
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let statuses = p.pointer("/status/containerStatuses").and_then(Value::as_array);
    let ready = statuses.map_or(0, |s| {
        s.iter()
            .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
            .count()
    });
    let restarts: i64 = statuses.map_or(0, |s| {
        s.iter()
            .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
            .sum()
    });
    let status = if p.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else {
        str_or(p, "/status/reason", str_or(p, "/status/phase", "Pending"))
    };
    vec![
        json!(p.pointer("/metadata/name")),
        json!(format!("{ready}/{containers}")),
        json!(status),
        json!(restarts),
        age(p.pointer("/metadata/creationTimestamp")),
        json!(str_or(p, "/status/podIP", "<none>")),
        json!(str_or(p, "/spec/nodeName", "<none>")),
        json!(str_or(p, "/status/nominatedNodeName", "<none>")),
        json!("<none>"),
    ]
}

fn node_ready(n: &Value) -> &'static str {
    let ready = n
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| {
            c.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
                .and_then(|c| c.get("status"))
                .and_then(Value::as_str)
        });
    if ready == Some("True") {
        "Ready"
    } else {
        "NotReady"
    }
}

/// The real server's Event columns (what `kubectl get events` prints), for a core-shaped Event:
/// the latest of series / lastTimestamp / eventTime is "Last Seen", the object is `kind/name`.
fn event_columns_and_cells(e: &Value) -> (Vec<Value>, Vec<Value>) {
    let ts = |ptrs: &[&str]| {
        ptrs.iter()
            .find_map(|p| e.pointer(p).filter(|v| v.as_str().is_some_and(|s| !s.is_empty())))
    };
    let last = ts(&["/series/lastObservedTime", "/lastTimestamp", "/eventTime"]);
    let first = ts(&["/firstTimestamp", "/eventTime"]);
    let object = format!(
        "{}/{}",
        str_or(e, "/involvedObject/kind", "").to_lowercase(),
        str_or(e, "/involvedObject/name", "")
    );
    let source = match (str_or(e, "/source/component", ""), str_or(e, "/source/host", "")) {
        ("", _) => [
            str_or(e, "/reportingComponent", ""),
            str_or(e, "/reportingInstance", ""),
        ]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(", "),
        (c, "") => c.to_string(),
        (c, h) => format!("{c}, {h}"),
    };
    let count = e
        .pointer("/series/count")
        .or_else(|| e.pointer("/count"))
        .and_then(Value::as_i64)
        .unwrap_or(1);
    (
        vec![
            col("Last Seen", "string", "", 0),
            col("Type", "string", "", 0),
            col("Reason", "string", "", 0),
            col("Object", "string", "", 0),
            col("Subobject", "string", "", 1),
            col("Source", "string", "", 1),
            col("Message", "string", "", 0),
            col("First Seen", "string", "", 1),
            col("Count", "string", "", 1),
            col("Name", "string", "name", 1),
        ],
        vec![
            age(last),
            json!(str_or(e, "/type", "")),
            json!(str_or(e, "/reason", "")),
            json!(object),
            json!(str_or(e, "/involvedObject/fieldPath", "")),
            json!(source),
            json!(str_or(e, "/message", "")),
            age(first),
            json!(count),
            json!(e.pointer("/metadata/name")),
        ],
    )
}

/// Column definitions and the row cells for one object of `def`.
fn columns_and_cells(def: &ResourceDef, obj: &Value) -> (Vec<Value>, Vec<Value>) {
    let name = json!(obj.pointer("/metadata/name"));
    let created = obj.pointer("/metadata/creationTimestamp");
    if def.custom {
        let mut cols = vec![col("Name", "string", "name", 0)];
        let mut cells = vec![name];
        for c in &def.columns {
            let PrinterColumn {
                name: cname,
                type_,
                format,
                json_path: path,
                priority,
                ..
            } = c;
            cols.push(col(cname, type_, format, *priority));
            let cell = match (json_path(obj, path), type_.as_str()) {
                (None, _) => Value::Null,
                (Some(v), "date") => age(Some(v)),
                (Some(v @ (Value::Number(_) | Value::Bool(_))), _) => v.clone(),
                (Some(v), _) => json!(go_format(v)),
            };
            cells.push(cell);
        }
        return (cols, cells);
    }
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "events") => event_columns_and_cells(obj),
        ("events.k8s.io", "events") => event_columns_and_cells(&crate::event_shapes::to_core(obj.clone())),
        ("", "pods") => (
            vec![
                col("Name", "string", "name", 0),
                col("Ready", "string", "", 0),
                col("Status", "string", "", 0),
                col("Restarts", "string", "", 0),
                col("Age", "string", "", 0),
                col("IP", "string", "", 1),
                col("Node", "string", "", 1),
                col("Nominated Node", "string", "", 1),
                col("Readiness Gates", "string", "", 1),
            ],
            pod_cells(obj),
        ),
        ("", "namespaces") => (
            vec![
                col("Name", "string", "name", 0),
                col("Status", "string", "", 0),
                col("Age", "string", "", 0),
            ],
            vec![name, json!(str_or(obj, "/status/phase", "Active")), age(created)],
        ),
        ("", "nodes") => (
            vec![
                col("Name", "string", "name", 0),
                col("Status", "string", "", 0),
                col("Roles", "string", "", 0),
                col("Age", "string", "", 0),
                col("Version", "string", "", 0),
            ],
            vec![
                name,
                json!(node_ready(obj)),
                json!("<none>"),
                age(created),
                json!(str_or(obj, "/status/nodeInfo/kubeletVersion", "")),
            ],
        ),
        ("", "services") => {
            let ports = obj.pointer("/spec/ports").and_then(Value::as_array).map(|ps| {
                ps.iter()
                    .map(|p| {
                        format!(
                            "{}/{}",
                            p.get("port").map(go_format).unwrap_or_default(),
                            str_or(p, "/protocol", "TCP")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            });
            (
                vec![
                    col("Name", "string", "name", 0),
                    col("Type", "string", "", 0),
                    col("Cluster-IP", "string", "", 0),
                    col("External-IP", "string", "", 0),
                    col("Port(s)", "string", "", 0),
                    col("Age", "string", "", 0),
                ],
                vec![
                    name,
                    json!(str_or(obj, "/spec/type", "ClusterIP")),
                    json!(str_or(obj, "/spec/clusterIP", "<none>")),
                    json!("<none>"),
                    json!(ports.filter(|p| !p.is_empty()).unwrap_or_else(|| "<none>".into())),
                    age(created),
                ],
            )
        }
        _ => (
            vec![col("Name", "string", "name", 0), col("Age", "string", "", 0)],
            vec![name, age(created)],
        ),
    }
}

fn row_object(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))})
}

/// A Table of `objects`; `include_object` is `None`, `Metadata` (default) or `Object`.
pub fn table(def: &ResourceDef, objects: &[&Value], list_meta: Value, include_object: &str) -> Value {
    let mut columns = None;
    let mut rows = Vec::with_capacity(objects.len());
    for obj in objects {
        let (cols, cells) = columns_and_cells(def, obj);
        columns.get_or_insert(cols);
        let mut row = json!({"cells": cells});
        match include_object {
            "None" => {}
            "Object" => row["object"] = (*obj).clone(),
            _ => row["object"] = row_object(obj),
        }
        rows.push(row);
    }
    let columns = columns.unwrap_or_else(|| columns_and_cells(def, &json!({})).0);
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "columnDefinitions": columns, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_and_go_format() {
        let obj = json!({"spec": {"a": [{"b": "x"}]}, "metadata": {"labels": {"k.io/x": "1", "a": "2"}}});
        assert_eq!(json_path(&obj, ".spec.a[0].b"), Some(&json!("x")));
        assert_eq!(json_path(&obj, ".metadata.labels['k.io/x']"), Some(&json!("1")));
        assert_eq!(go_format(&obj["metadata"]["labels"]), "map[a:2 k.io/x:1]");
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(190), "3m10s");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
    }
}
