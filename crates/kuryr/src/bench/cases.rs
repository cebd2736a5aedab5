//! The workloads: pods created and deleted straight in the emulator's store (so every HTTP
//! request the emulator counts is a controller's), and the time each pod's KuryrPort first shows
//! an active default VIF, seen on an in-process watch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use kube_emulator::resources::ResourceDef;
use kube_emulator::store::{DeleteOpts, ListOpts, Store, WriteOpts};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::bed::Layout;

/// When a pod's KuryrPort reached each stage, as the in-process watch saw it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Marks {
    /// The KuryrPort exists (the `vif` handler's part is done).
    pub created: Option<Instant>,
    /// Its `status.vifs` names ports (they exist in Neutron, not necessarily up).
    pub recorded: Option<Instant>,
    /// Its default VIF is active: the pod is wired.
    pub wired: Option<Instant>,
}

/// `namespace/name` -> when its KuryrPort reached each stage.
#[derive(Clone, Default)]
pub struct Wired(Arc<Mutex<HashMap<String, Marks>>>);

impl Wired {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Marks>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When `key`'s pod was wired.
    pub fn get(&self, key: &str) -> Option<Instant> {
        self.lock().get(key).and_then(|m| m.wired)
    }

    pub fn marks(&self, key: &str) -> Marks {
        self.lock().get(key).copied().unwrap_or_default()
    }

    fn note(&self, kp: &Value) {
        let key = object_key(kp);
        let now = Instant::now();
        let mut all = self.lock();
        let m = all.entry(key).or_default();
        m.created.get_or_insert(now);
        if m.recorded.is_none()
            && kp
                .pointer("/status/vifs")
                .and_then(Value::as_object)
                .is_some_and(|v| !v.is_empty())
        {
            m.recorded = Some(now);
        }
        if m.wired.is_none() && default_vif_active(kp) {
            m.wired = Some(now);
        }
    }
}

/// `namespace/name` of a stored object.
fn object_key(obj: &Value) -> String {
    let field = |f: &str| obj.pointer(f).and_then(Value::as_str).unwrap_or_default();
    format!("{}/{}", field("/metadata/namespace"), field("/metadata/name"))
}

/// Per stage before the last, the sorted times from each pod's creation to its KuryrPort
/// reaching it (the last, wired, is the run's latencies).
#[derive(Clone, Debug, Default)]
pub struct Stages {
    pub created: Vec<Duration>,
    pub recorded: Vec<Duration>,
}

impl Stages {
    pub fn of(wired: &Wired, created: &Created) -> Self {
        let mut out = Self::default();
        for (key, at) in created {
            let m = wired.marks(key);
            let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(*at));
            out.created.extend(since(m.created));
            out.recorded.extend(since(m.recorded));
        }
        out.created.sort();
        out.recorded.sort();
        out
    }
}

/// Whether a KuryrPort (either implementation's; both write upstream's layout) records an active
/// default VIF: `status.vifs.<ifname>` with `default: true` (or `eth0`), os-vif `active: true`.
pub fn default_vif_active(kp: &Value) -> bool {
    let Some(vifs) = kp.pointer("/status/vifs").and_then(Value::as_object) else {
        return false;
    };
    let default = vifs
        .values()
        .find(|v| v.get("default").and_then(Value::as_bool) == Some(true))
        .or_else(|| vifs.get("eth0"));
    default
        .and_then(|v| v.pointer("/vif/versioned_object.data/active"))
        .and_then(Value::as_bool)
        == Some(true)
}

/// Follows KuryrPorts until dropped.
pub struct Tracker {
    pub wired: Wired,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn track(store: Arc<Store>) -> anyhow::Result<Tracker> {
    let def = store
        .find("openstack.org", "v1", "kuryrports")
        .context("KuryrPorts are not served")?;
    let wired = Wired::default();
    let w = wired.clone();
    let task = tokio::spawn(async move {
        loop {
            // (Re)subscribe from the current state: a lagging receiver just lists again.
            let Ok(mut start) = store.watch(&def, None, None) else {
                return;
            };
            for ev in &start.initial {
                w.note(&ev.object);
            }
            loop {
                match start.rx.recv().await {
                    Ok(ev) => w.note(&ev.object),
                    Err(RecvError::Lagged(_)) => break,
                    Err(RecvError::Closed) => return,
                }
            }
        }
    });
    Ok(Tracker { wired, task })
}

/// Pods created by a workload: `namespace/name` -> when.
pub type Created = Vec<(String, Instant)>;

fn pod_body(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "kuryr-bench"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    })
}

/// Creates pod `i` of a workload (namespaces and nodes in turn).
pub fn create_pod(
    store: &Store,
    layout: &Layout,
    prefix: &str,
    i: usize,
) -> anyhow::Result<(String, Instant)> {
    let def = store.find("", "v1", "pods").context("pods are not served")?;
    let (ns, node) = layout.place(i);
    let name = format!("{prefix}-{i}");
    let at = Instant::now();
    store
        .create(&def, ns, pod_body(&name, node), &WriteOpts::default())
        .map_err(|e| anyhow::anyhow!("creating pod {ns}/{name}: {e}"))?;
    Ok((format!("{ns}/{name}"), at))
}

pub fn delete_pod(store: &Store, key: &str) -> anyhow::Result<()> {
    let def = store.find("", "v1", "pods").context("pods are not served")?;
    let (ns, name) = key.split_once('/').context("pod key is namespace/name")?;
    match store.delete(&def, ns, name, &DeleteOpts::default()) {
        Ok(_) => Ok(()),
        Err(e) if e.code == 404 => Ok(()),
        Err(e) => bail!("deleting pod {key}: {e}"),
    }
}

/// Creates `n` pods at once.
pub fn burst(store: &Store, layout: &Layout, prefix: &str, n: usize) -> anyhow::Result<Created> {
    (0..n).map(|i| create_pod(store, layout, prefix, i)).collect()
}

/// Waits until every created pod is wired or `deadline` passes; false on the deadline.
pub async fn wait_wired(wired: &Wired, created: &Created, deadline: Instant) -> bool {
    // Pods wired so far are not looked up again: tens of thousands of pods are checked
    // every 20 ms without taking a core from the controller being measured.
    let mut next = 0;
    loop {
        {
            let seen = wired.lock();
            while next < created.len() && seen.get(&created[next].0).is_some_and(|m| m.wired.is_some()) {
                next += 1;
            }
        }
        if next == created.len() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Create + delete at a steady rate: pod i is created at i/rate and deleted `lifetime` later
/// (deletes of pods not wired yet wait until they are, so each pod's wiring is measured).
pub async fn churn(
    store: &Store,
    layout: &Layout,
    wired: &Wired,
    rate: f64,
    total: usize,
    lifetime: Duration,
    deadline: Instant,
) -> anyhow::Result<Created> {
    let start = Instant::now();
    let mut created: Created = Vec::with_capacity(total);
    let mut deleted = 0usize;
    loop {
        let now = Instant::now();
        let due = ((now - start).as_secs_f64() * rate) as usize + 1;
        while created.len() < total.min(due) {
            created.push(create_pod(store, layout, "churn", created.len())?);
        }
        while deleted < created.len() {
            let (key, at) = &created[deleted];
            if now.duration_since(*at) < lifetime || wired.get(key).is_none() {
                break;
            }
            delete_pod(store, key)?;
            deleted += 1;
        }
        if created.len() == total && deleted == total {
            return Ok(created);
        }
        if now > deadline {
            return Ok(created);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Deletes every pod and waits until no pod and no KuryrPort is left (ports back in the pools).
pub async fn drain(store: &Store, deadline: Instant) -> anyhow::Result<()> {
    let pods = store.find("", "v1", "pods").context("pods are not served")?;
    let kps = store
        .find("openstack.org", "v1", "kuryrports")
        .context("KuryrPorts are not served")?;
    let list = |def: &ResourceDef| {
        store
            .list(def, None, &ListOpts::default())
            .map(|p| p.items)
            .map_err(|e| anyhow::anyhow!("listing {}: {e}", def.plural))
    };
    for p in list(pods.as_ref())? {
        delete_pod(store, &object_key(&p))?;
    }
    loop {
        let left = list(pods.as_ref())?.len() + list(kps.as_ref())?.len();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} pods and KuryrPorts still there after the drain deadline");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kp(vifs: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "n"}, "status": {"vifs": vifs}})
    }

    fn vif(active: bool) -> Value {
        json!({"versioned_object.name": "VIFOpenVSwitch", "versioned_object.data": {"id": "x", "active": active}})
    }

    #[tokio::test]
    async fn a_pod_counts_as_wired_only_once_its_default_vif_is_active() {
        let wired = Wired::default();
        let created: Created = vec![("n/p".to_string(), Instant::now())];
        wired.note(&kp(json!({})));
        wired.note(&kp(json!({"eth0": {"default": true, "vif": vif(false)}})));
        let m = wired.marks("n/p");
        assert!(m.created.is_some() && m.recorded.is_some());
        assert!(wired.get("n/p").is_none());
        assert!(!wait_wired(&wired, &created, Instant::now()).await);
        wired.note(&kp(json!({"eth0": {"default": true, "vif": vif(true)}})));
        assert!(wired.get("n/p").is_some());
        assert!(wait_wired(&wired, &created, Instant::now()).await);
        // The first time each stage was seen is kept.
        assert_eq!(wired.marks("n/p").created, m.created);
        let stages = Stages::of(&wired, &created);
        assert_eq!((stages.created.len(), stages.recorded.len()), (1, 1));
    }

    #[test]
    fn active_default_vif_in_upstreams_layout() {
        assert!(default_vif_active(&kp(
            json!({"eth0": {"default": true, "vif": vif(true)}})
        )));
        assert!(!default_vif_active(&kp(
            json!({"eth0": {"default": true, "vif": vif(false)}})
        )));
        // The default interface decides, not another active one.
        assert!(!default_vif_active(&kp(json!({
            "eth0": {"default": true, "vif": vif(false)}, "eth1": {"default": false, "vif": vif(true)}
        }))));
        assert!(default_vif_active(&kp(json!({"eth0": {"vif": vif(true)}}))));
        assert!(!default_vif_active(&json!({"metadata": {"name": "p"}})));
    }
}
