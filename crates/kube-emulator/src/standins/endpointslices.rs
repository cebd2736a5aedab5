//! The EndpointSlice controller stand-in: one slice per Service with a selector, listing the pods it selects
//! that have an IP (ready per their `Ready` condition) and the Service's ports resolved to the pods' target
//! ports, as `kube-controller-manager` keeps it. The slice is owned by its Service, so the garbage collector
//! removes it with the Service. Services without a selector are left to whoever writes their slices.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{StandIn, next_change, str_at};
use crate::store::{ListOpts, Store, WriteOpts};

const SERVICE_NAME: &str = "kubernetes.io/service-name";
const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const CONTROLLER: &str = "endpointslice-controller.k8s.io";

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

fn selects(selector: &serde_json::Map<String, Value>, pod: &Value) -> bool {
    let labels = pod.pointer("/metadata/labels").and_then(Value::as_object);
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// A Service port's target port on `pod`: a number as is, a name through the pod's container ports.
fn target_port(port: &Value, pod: Option<&Value>) -> Option<i64> {
    match port.get("targetPort") {
        None => port.get("port").and_then(Value::as_i64),
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(name)) => pod?
            .pointer("/spec/containers")
            .and_then(Value::as_array)?
            .iter()
            .flat_map(|c| c.get("ports").and_then(Value::as_array).into_iter().flatten())
            .find(|p| p.get("name").and_then(Value::as_str) == Some(name.as_str()))
            .and_then(|p| p.get("containerPort").and_then(Value::as_i64)),
        Some(_) => None,
    }
}

/// The slice `svc` should have, or `None` when it has no selector (or is ExternalName/headless-less).
fn wanted(svc: &Value, pods: &[Arc<Value>]) -> Option<Value> {
    let selector = svc.pointer("/spec/selector").and_then(Value::as_object)?;
    if selector.is_empty() || str_at(svc, "/spec/type") == "ExternalName" {
        return None;
    }
    let ns = str_at(svc, "/metadata/namespace");
    let name = str_at(svc, "/metadata/name");
    let uid = str_at(svc, "/metadata/uid");
    let mut selected: Vec<&Value> = pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| str_at(p, "/metadata/namespace") == ns)
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|p| !str_at(p, "/status/podIP").is_empty())
        .filter(|p| selects(selector, p))
        .collect();
    selected.sort_by_key(|p| str_at(p, "/status/podIP").to_string());
    let endpoints: Vec<Value> = selected
        .iter()
        .map(|p| {
            json!({
                "addresses": [str_at(p, "/status/podIP")],
                "conditions": {"ready": pod_ready(p), "serving": pod_ready(p), "terminating": false},
                "nodeName": str_at(p, "/spec/nodeName"),
                "targetRef": {"kind": "Pod", "namespace": ns, "name": str_at(p, "/metadata/name"),
                              "uid": str_at(p, "/metadata/uid")},
            })
        })
        .collect();
    let ports: Vec<Value> = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|port| {
            let target = target_port(port, selected.first().copied())?;
            Some(json!({
                "name": port.get("name").and_then(Value::as_str).unwrap_or(""),
                "port": target,
                "protocol": port.get("protocol").and_then(Value::as_str).unwrap_or("TCP"),
            }))
        })
        .collect();
    let short_uid: String = uid.chars().take(5).collect();
    Some(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{name}-{short_uid}"), "namespace": ns,
            "labels": {SERVICE_NAME: name, MANAGED_BY: CONTROLLER},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": uid,
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    }))
}

/// Keeps every selector Service's EndpointSlice current.
pub fn spawn_endpointslice_controller(store: Arc<Store>) -> StandIn {
    let task = tokio::spawn(async move {
        let (Some(services), Some(pods), Some(slices)) = (
            store.find("", "v1", "services"),
            store.find("", "v1", "pods"),
            store.find("discovery.k8s.io", "v1", "endpointslices"),
        ) else {
            tracing::warn!(
                "endpointslice stand-in: services, pods or endpointslices are not served; not started"
            );
            return;
        };
        let watch = |def| {
            store
                .watch(def, None, Some(store.resource_version()))
                .map(|w| w.rx)
        };
        let (Ok(mut svc_rx), Ok(mut pod_rx)) = (watch(&services), watch(&pods)) else {
            return;
        };
        loop {
            let all_pods = store
                .list(&pods, None, &ListOpts::default())
                .map(|p| p.items)
                .unwrap_or_default();
            let existing: BTreeMap<(String, String), Arc<Value>> = store
                .list(&slices, None, &ListOpts::default())
                .map(|p| p.items)
                .unwrap_or_default()
                .into_iter()
                .filter(|s| {
                    str_at(s, &format!("/metadata/labels/{}", MANAGED_BY.replace('/', "~1"))) == CONTROLLER
                })
                .map(|s| {
                    (
                        (
                            str_at(&s, "/metadata/namespace").to_string(),
                            str_at(&s, "/metadata/name").to_string(),
                        ),
                        s,
                    )
                })
                .collect();
            for svc in store
                .list(&services, None, &ListOpts::default())
                .map(|p| p.items)
                .unwrap_or_default()
            {
                if svc.pointer("/metadata/deletionTimestamp").is_some() {
                    continue;
                }
                let Some(mut want) = wanted(&svc, &all_pods) else {
                    continue;
                };
                let ns = str_at(&want, "/metadata/namespace").to_string();
                let name = str_at(&want, "/metadata/name").to_string();
                let result = match existing.get(&(ns.clone(), name.clone())) {
                    None => store
                        .create(&slices, &ns, want, &WriteOpts::default())
                        .map(|_| ()),
                    Some(cur)
                        if cur.get("endpoints") == want.get("endpoints")
                            && cur.get("ports") == want.get("ports") =>
                    {
                        Ok(())
                    }
                    Some(cur) => {
                        want["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
                        store
                            .update(&slices, &ns, &name, want, false, &WriteOpts::default())
                            .map(|_| ())
                    }
                };
                if let Err(e) = result {
                    // A conflict with a concurrent writer or a namespace going away: the next round retries.
                    tracing::debug!("endpointslice stand-in: {ns}/{name}: {e}");
                }
            }
            tokio::select! {
                _ = next_change(&mut svc_rx) => {}
                _ = next_change(&mut pod_rx) => {}
            }
        }
    });
    StandIn { task }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: &str, app: &str, ready: bool) -> Arc<Value> {
        Arc::new(json!({
            "metadata": {"name": name, "namespace": "demo", "uid": format!("uid-{name}"), "labels": {"app": app}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "web", "containerPort": 8080}]}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        }))
    }

    #[test]
    fn selected_pods_with_ips_and_named_target_ports() {
        let svc = json!({
            "metadata": {"name": "web", "namespace": "demo", "uid": "abcdef12"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "web"}]}
        });
        let pods = vec![
            pod("b", "10.1.0.5", "web", false),
            pod("a", "10.1.0.4", "web", true),
            pod("x", "10.1.0.6", "other", true),
            pod("p", "", "web", true),
        ];
        let s = wanted(&svc, &pods).expect("slice");
        assert_eq!(s["metadata"]["name"], "web-abcde");
        let ips: Vec<&str> = s["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| e["addresses"][0].as_str().unwrap_or_default())
            .collect();
        assert_eq!(ips, ["10.1.0.4", "10.1.0.5"]);
        assert_eq!(s["endpoints"][1]["conditions"]["ready"], false);
        assert_eq!(s["ports"][0]["port"], 8080);
        assert_eq!(s["ports"][0]["name"], "http");
    }

    #[test]
    fn services_without_selector_are_left_alone() {
        let svc =
            json!({"metadata": {"name": "ext", "namespace": "demo", "uid": "u"}, "spec": {"ports": []}});
        assert!(wanted(&svc, &[]).is_none());
    }
}
