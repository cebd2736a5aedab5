//! Test/sandbox stand-ins for the control-plane pieces that are not the API server: a scheduler,
//! a kubelet and the EndpointSlice controller ([`endpointslices`]). They are clients: they use only the in-process [`Store`] handle (the same
//! operations the HTTP API exposes: list, watch, `pods/binding`, status patch, create Event).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinHandle;

mod endpointslices;
pub use endpointslices::spawn_endpointslice_controller;

use crate::patch::PatchType;
use crate::selector::FieldSelector;
use crate::store::{EventType, ListOpts, Store, WriteOpts};

/// A running stand-in; stops when dropped.
pub struct StandIn {
    task: JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

fn node_ready(node: &Value) -> bool {
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        });
    ready && node.pointer("/spec/unschedulable").and_then(Value::as_bool) != Some(true)
}

fn selector_matches(pod: &Value, node: &Value) -> bool {
    let Some(sel) = pod.pointer("/spec/nodeSelector").and_then(Value::as_object) else {
        return true;
    };
    sel.iter()
        .all(|(k, v)| node.pointer("/metadata/labels").and_then(|l| l.get(k)) == Some(v))
}

/// Waits for the next change of the watched kind (or a tick), so loops re-scan without polling hard.
pub(crate) async fn next_change(rx: &mut tokio::sync::broadcast::Receiver<Arc<crate::store::WatchEvent>>) {
    let _ = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await;
}

/// Assigns `spec.nodeName` to pending pods via `pods/binding`: round-robin over Ready,
/// schedulable nodes, honouring `nodeSelector`.
pub fn spawn_scheduler(store: Arc<Store>) -> StandIn {
    let task = tokio::spawn(async move {
        let (Some(pods), Some(nodes)) = (store.find("", "v1", "pods"), store.find("", "v1", "nodes")) else {
            tracing::error!("scheduler stand-in: pods/nodes are not served");
            return;
        };
        let Ok(mut pod_rx) = store
            .watch(&pods, None, Some(store.resource_version()))
            .map(|w| w.rx)
        else {
            return;
        };
        let Ok(mut node_rx) = store
            .watch(&nodes, None, Some(store.resource_version()))
            .map(|w| w.rx)
        else {
            return;
        };
        let pending = match FieldSelector::parse("spec.nodeName=", &pods) {
            Ok(f) => ListOpts {
                fields: f,
                ..ListOpts::default()
            },
            Err(e) => {
                tracing::error!("scheduler stand-in: {e}");
                return;
            }
        };
        let mut next = 0usize;
        loop {
            let ready: Vec<Value> = store
                .list(&nodes, None, &ListOpts::default())
                .map(|p| {
                    p.items
                        .iter()
                        .filter(|n| node_ready(n))
                        .map(|n| (**n).clone())
                        .collect()
                })
                .unwrap_or_default();
            if let Ok(page) = store.list(&pods, None, &pending) {
                for pod in page
                    .items
                    .iter()
                    .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
                {
                    let fits: Vec<&Value> = ready.iter().filter(|n| selector_matches(pod, n)).collect();
                    if fits.is_empty() {
                        continue;
                    }
                    let node = fits[next % fits.len()];
                    next = next.wrapping_add(1);
                    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": str_at(pod, "/metadata/name")}, "target": {"apiVersion": "v1", "kind": "Node", "name": str_at(node, "/metadata/name")}});
                    if let Err(e) = store.bind(
                        str_at(pod, "/metadata/namespace"),
                        str_at(pod, "/metadata/name"),
                        &binding,
                    ) {
                        tracing::debug!("scheduler stand-in: binding failed: {e}");
                    }
                }
            }
            tokio::select! {
                _ = next_change(&mut pod_rx) => {}
                _ = next_change(&mut node_rx) => {}
            }
        }
    });
    StandIn { task }
}

/// What the kubelet stand-in asks its network callback to do for a pod.
pub type PodFuture = Pin<Box<dyn Future<Output = Result<Option<String>, String>> + Send>>;
/// Called with the pod when it lands on one of the kubelet's nodes; returns its IP (the CNI
/// result) or an error message (reported as an Event, retried).
pub type SetupFn = Arc<dyn Fn(Value) -> PodFuture + Send + Sync>;
/// Called with the last state of a deleted pod (CNI DEL).
pub type TeardownFn = Arc<dyn Fn(Value) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Runs pods bound to `nodes` (all nodes when empty): calls `setup`, then marks the pod Running
/// with the returned IP through the status subresource; calls `teardown` when a pod is deleted.
///
/// Like a real kubelet, every pod is started on its own: one pod whose setup waits (its port is
/// slow, or it is deleted meanwhile) never holds up the others. A pod deleted while its setup
/// runs has that setup cancelled; a failed setup is reported as an Event and retried.
pub fn spawn_kubelet(
    store: Arc<Store>,
    nodes: Vec<String>,
    setup: SetupFn,
    teardown: Option<TeardownFn>,
) -> StandIn {
    let task = tokio::spawn(async move {
        let Some(pods) = store.find("", "v1", "pods") else {
            return;
        };
        let Ok(mut rx) = store
            .watch(&pods, None, Some(store.resource_version()))
            .map(|w| w.rx)
        else {
            return;
        };
        let mine = |pod: &Value| {
            let node = str_at(pod, "/spec/nodeName");
            !node.is_empty() && (nodes.is_empty() || nodes.iter().any(|n| n == node))
        };
        // uid -> its setup (in flight, or done and Running); a failed one leaves to be retried.
        let mut started: HashMap<String, JoinHandle<()>> = HashMap::new();
        let (failed_tx, mut failed_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        loop {
            while let Ok(uid) = failed_rx.try_recv() {
                started.remove(&uid);
            }
            let page = store.list(&pods, None, &ListOpts::default());
            for pod in page.map(|p| p.items).unwrap_or_default() {
                let uid = str_at(&pod, "/metadata/uid").to_string();
                if !mine(&pod)
                    || str_at(&pod, "/status/phase") != "Pending"
                    || pod.pointer("/metadata/deletionTimestamp").is_some()
                    || started.contains_key(&uid)
                {
                    continue;
                }
                let run = start_pod(
                    store.clone(),
                    pods.clone(),
                    (*pod).clone(),
                    setup.clone(),
                    failed_tx.clone(),
                );
                started.insert(uid, tokio::spawn(run));
            }
            // Wait for a change; deletions among the changes get a teardown.
            let mut changes = Vec::new();
            if let Ok(Ok(ev)) = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
                changes.push(ev);
            }
            while let Ok(ev) = rx.try_recv() {
                changes.push(ev);
            }
            for ev in changes {
                if ev.type_ == EventType::Deleted && mine(&ev.object) {
                    if let Some(setup) = started.remove(str_at(&ev.object, "/metadata/uid")) {
                        setup.abort();
                    }
                    if let Some(t) = &teardown {
                        t((*ev.object).clone()).await;
                    }
                }
            }
        }
    });
    StandIn { task }
}

/// One pod's start: `setup`, then the Running status (or a Warning Event and its uid on
/// `failed`, so that the kubelet tries again).
async fn start_pod(
    store: Arc<Store>,
    pods: Arc<crate::resources::ResourceDef>,
    pod: Value,
    setup: SetupFn,
    failed: tokio::sync::mpsc::UnboundedSender<String>,
) {
    let (ns, name) = (
        str_at(&pod, "/metadata/namespace").to_string(),
        str_at(&pod, "/metadata/name").to_string(),
    );
    match setup(pod.clone()).await {
        Ok(ip) => {
            let containers: Vec<Value> = pod.pointer("/spec/containers").and_then(Value::as_array).map(|cs| cs.iter().map(|c| json!({"name": c.get("name"), "image": c.get("image"), "ready": true, "restartCount": 0, "started": true, "state": {"running": {"startedAt": now()}}})).collect()).unwrap_or_default();
            let mut status = json!({"phase": "Running", "startTime": now(), "containerStatuses": containers,
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"}, {"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "True"}]});
            if let Some(ip) = ip {
                status["podIP"] = json!(ip);
                status["podIPs"] = json!([{"ip": ip}]);
            }
            if let Err(e) = store.patch(
                &pods,
                &ns,
                &name,
                PatchType::Merge,
                json!({"status": status}),
                true,
                &WriteOpts::default(),
            ) {
                tracing::debug!("kubelet stand-in: status update of {ns}/{name} failed: {e}");
            }
        }
        Err(message) => {
            report(&store, &pod, &message);
            let _ = failed.send(str_at(&pod, "/metadata/uid").to_string());
        }
    }
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A `FailedCreatePodSandBox` Event, like the real kubelet posts when CNI ADD fails.
fn report(store: &Store, pod: &Value, message: &str) {
    let Some(events) = store.find("", "v1", "events") else {
        return;
    };
    let ns = str_at(pod, "/metadata/namespace");
    let event = json!({
        "metadata": {"generateName": format!("{}.", str_at(pod, "/metadata/name")), "namespace": ns},
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": ns, "name": str_at(pod, "/metadata/name"), "uid": str_at(pod, "/metadata/uid")},
        "reason": "FailedCreatePodSandBox", "message": message, "type": "Warning",
        "source": {"component": "kubelet", "host": str_at(pod, "/spec/nodeName")},
        "firstTimestamp": now(), "lastTimestamp": now(), "count": 1,
    });
    if let Err(e) = store.create(&events, ns, event, &WriteOpts::default()) {
        tracing::debug!("kubelet stand-in: posting event failed: {e}");
    }
}
