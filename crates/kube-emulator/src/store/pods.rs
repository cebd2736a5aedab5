//! The `pods/binding` subresource.

use serde_json::{Value, json};

use super::{EventType, State, Store, now};
use crate::error::{ApiError, ApiResult, Cause};

impl Store {
    /// `pods/binding`: assigns a node to a pod once.
    pub fn bind(&self, ns: &str, name: &str, body: &Value) -> ApiResult<Value> {
        let mut st = self.lock();
        let def = st
            .registry
            .find("", "v1", "pods")
            .ok_or_else(|| ApiError::internal("pods are not registered"))?;
        let node = body
            .pointer("/target/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let Some(node) = node else {
            return Err(ApiError::invalid(
                "",
                "Binding",
                "bindings",
                name,
                vec![Cause::required("target.name")],
            ));
        };
        let cur = st
            .get(&def, ns, name)
            .ok_or_else(|| ApiError::not_found("", "pods", name))?;
        if let Some(existing) = cur
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                &format!("pod {name} is already assigned to node \"{existing}\""),
            ));
        }
        let mut new = (*cur).clone();
        new["spec"]["nodeName"] = json!(node);
        st.set_host_ip(&mut new);
        let cond = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now()});
        match new
            .pointer_mut("/status/conditions")
            .and_then(Value::as_array_mut)
        {
            Some(conds) => {
                conds.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
                conds.push(cond);
            }
            None => new["status"]["conditions"] = json!([cond]),
        }
        st.commit(&def, ns, name, EventType::Modified, new, Some(cur), self);
        Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}))
    }
}

impl State {
    /// `status.hostIP`/`hostIPs` of a pod placed on a node: the node's InternalIP, as the kubelet
    /// reports it once the pod is on its node (upstream kuryr's pool driver keys pools by it). A
    /// node without an InternalIP leaves them unset.
    pub(super) fn set_host_ip(&self, pod: &mut Value) {
        let Some(node) = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        else {
            return;
        };
        let Some(nodes) = self.registry.find("", "v1", "nodes") else {
            return;
        };
        let Some(node) = self.get(&nodes, "", node) else {
            return;
        };
        let ip = node
            .pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .find(|x| x.get("type").and_then(Value::as_str) == Some("InternalIP"))
            })
            .and_then(|x| x.get("address"))
            .and_then(Value::as_str);
        if let Some(ip) = ip {
            pod["status"]["hostIP"] = json!(ip);
            pod["status"]["hostIPs"] = json!([{"ip": ip}]);
        }
    }
}
