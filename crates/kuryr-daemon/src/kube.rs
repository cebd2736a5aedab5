//! Kubernetes plumbing: the KuryrPort and Pod watchers feeding the
//! registry, Events on pods, API health.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event as WEvent};
use kube::{Api, Client};
use kuryr_crds::KuryrPort;
use kuryr_crds::events::{Events, Reporter};

use crate::daemon::{ApiHealth, PodEvents};
use crate::registry::{PodKey, Registry};

/// Feed `registry` from this node's KuryrPorts (label selector) until the
/// stream ends; watcher errors are retried with backoff by the caller loop.
///
/// Each object is read on its own: one KuryrPort this daemon cannot parse (a
/// hand edit, a VIF type of a newer controller) must not fail the whole list
/// and with it every pod of the node. It is kept as unreadable, so an ADD for
/// its pod fails at once naming the field, and a Warning Event on the pod says
/// why (once per distinct reason).
pub async fn watch_kuryrports(
    client: Client,
    node: &str,
    registry: Arc<Registry>,
    events: Arc<dyn PodEvents>,
) {
    let api: Api<DynamicObject> = Api::all_with(client, &ApiResource::erase::<KuryrPort>(&()));
    let cfg = watcher::Config::default().labels(&KuryrPort::node_selector(node));
    let mut buffer: Vec<KuryrPort> = Vec::new();
    let mut unreadable: Vec<(PodKey, String)> = Vec::new();
    let mut reported = Reported::default();
    let mut stream = watcher::watcher(api, cfg).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(WEvent::Apply(obj)) => match read_told(obj, &mut reported, events.as_ref()).await {
                Some(Ok(kp)) => registry.apply_kuryrport(kp),
                Some(Err(bad)) => registry.kuryrport_unreadable(&bad.key, &bad.why),
                None => {}
            },
            Ok(WEvent::Delete(obj)) => {
                if let Some(k) = object_key(&obj) {
                    reported.forget(&k);
                    registry.delete_kuryrport(&k);
                }
            }
            Ok(WEvent::Init) => {
                buffer.clear();
                unreadable.clear();
            }
            Ok(WEvent::InitApply(obj)) => match read_told(obj, &mut reported, events.as_ref()).await {
                Some(Ok(kp)) => buffer.push(kp),
                Some(Err(bad)) => unreadable.push((bad.key, bad.why)),
                None => {}
            },
            Ok(WEvent::InitDone) => {
                reported.0.retain(|k, _| unreadable.iter().any(|(u, _)| u == k));
                registry.replace_kuryrports(std::mem::take(&mut buffer), std::mem::take(&mut unreadable));
            }
            Err(e) => {
                tracing::warn!(error = %e, "KuryrPort watch failed, retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

/// [`read_kuryrport`], and the pod told (once per reason) when it cannot be read, or that it can
/// be again.
async fn read_told(
    obj: DynamicObject,
    reported: &mut Reported,
    events: &dyn PodEvents,
) -> Option<Result<KuryrPort, Unreadable>> {
    let read = read_kuryrport(obj)?;
    match &read {
        Ok(kp) => reported.fixed(kp),
        Err(bad) => reported.report(bad, events).await,
    }
    Some(read)
}

/// A KuryrPort that cannot be read, and why (the field named).
struct Unreadable {
    key: PodKey,
    pod_uid: Option<String>,
    why: String,
}

fn object_key(obj: &DynamicObject) -> Option<PodKey> {
    Some(PodKey::new(
        obj.metadata.namespace.clone()?,
        obj.metadata.name.clone()?,
    ))
}

/// The object as a KuryrPort, or why it is not one; `None` without a
/// namespace and name (nothing to key it by).
fn read_kuryrport(obj: DynamicObject) -> Option<Result<KuryrPort, Unreadable>> {
    let key = object_key(&obj)?;
    let pod_uid = obj.data["spec"]["podUid"].as_str().map(str::to_owned);
    let parsed = serde_json::to_value(obj)
        .map_err(|e| e.to_string())
        .and_then(|v| {
            serde_path_to_error::deserialize::<_, KuryrPort>(v).map_err(|e| match e.path().to_string() {
                p if p == "." => e.inner().to_string(),
                p => format!("{p}: {}", e.inner()),
            })
        });
    Some(parsed.map_err(|why| Unreadable { key, pod_uid, why }))
}

/// The reason last reported per pod, so a re-list or a resync does not post
/// the same Warning again.
#[derive(Default)]
struct Reported(HashMap<PodKey, String>);

impl Reported {
    async fn report(&mut self, bad: &Unreadable, events: &dyn PodEvents) {
        if self.0.get(&bad.key) == Some(&bad.why) {
            return;
        }
        tracing::warn!(kuryrport = %bad.key, reason = %bad.why, "cannot read KuryrPort; ADDs for its pod fail until it is fixed");
        let message = format!("KuryrPort {} cannot be read: {}", bad.key, bad.why);
        events
            .publish(
                &bad.key,
                bad.pod_uid.as_deref(),
                "KuryrPortInvalid",
                &message,
                true,
            )
            .await;
        self.0.insert(bad.key.clone(), bad.why.clone());
    }

    fn fixed(&mut self, kp: &KuryrPort) {
        if let Some(k) = PodKey::of(kp) {
            self.forget(&k);
        }
    }

    fn forget(&mut self, key: &PodKey) {
        self.0.remove(key);
    }
}

/// Watch this node's pods (field selector `spec.nodeName`) to learn when a
/// pod is gone, so that a waiting ADD answers 410 at once.
pub async fn watch_pods(client: Client, node: &str, registry: Arc<Registry>) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    track_pods(watcher::watcher(api, cfg).boxed(), &registry).await;
}

/// Feed pod deletions from a pod watch stream into `registry` until the
/// stream ends (see [`PodTracker`]).
pub async fn track_pods<E: std::fmt::Display>(
    mut stream: impl futures::Stream<Item = Result<WEvent<Pod>, E>> + Unpin,
    registry: &Registry,
) {
    let mut tracker = PodTracker::default();
    registry.pod_watch_started();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => tracker.on_event(ev, registry),
            Err(e) => {
                tracing::warn!(error = %e, "Pod watch failed, retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

/// What the pod watch knows about this node's pods: the UID under each
/// name. A DELETE is not the only proof that a pod is gone: after a re-list
/// (the watch expired, the connection dropped) pods deleted in the gap are
/// simply absent, and a name that comes back with another UID means the pod
/// with the old UID was deleted (a name is reused only once the old pod is
/// gone). Both are reported as deletions, so an ADD still waiting for such a
/// pod answers 410 at once instead of waiting out its timeout.
#[derive(Default)]
pub struct PodTracker {
    /// Pods of a re-list in progress (between `Init` and `InitDone`).
    relist: Option<HashMap<PodKey, String>>,
}

fn pod_key_uid(pod: &Pod) -> Option<(PodKey, String)> {
    let m = &pod.metadata;
    Some((PodKey::new(m.namespace.clone()?, m.name.clone()?), m.uid.clone()?))
}

impl PodTracker {
    /// Hands `ev` to `registry`, which keeps the UID under each name ([`Registry::pod_seen`]).
    pub fn on_event(&mut self, ev: WEvent<Pod>, registry: &Registry) {
        match ev {
            WEvent::Apply(pod) => {
                if let Some((key, uid)) = pod_key_uid(&pod) {
                    registry.pod_seen(&key, &uid);
                }
            }
            WEvent::Delete(pod) => {
                if let Some((key, uid)) = pod_key_uid(&pod) {
                    registry.pod_deleted(&key, &uid);
                }
            }
            WEvent::Init => self.relist = Some(HashMap::new()),
            WEvent::InitApply(pod) => {
                if let Some((key, uid)) = pod_key_uid(&pod) {
                    self.relist.get_or_insert_default().insert(key, uid);
                }
            }
            WEvent::InitDone => registry.pods_listed(self.relist.take().unwrap_or_default()),
        }
    }
}

/// Events through `events.k8s.io` with reporter `kuryr-daemon`/<node> (none with
/// `[kubernetes] use_events = False`).
pub struct KubeEvents {
    recorder: Events,
}

impl KubeEvents {
    pub fn new(client: Client, node: &str, enabled: bool) -> Self {
        let reporter = Reporter {
            controller: "kuryr-daemon".into(),
            instance: Some(node.to_string()),
        };
        Self {
            recorder: Events::new(client, reporter, enabled),
        }
    }
}

#[async_trait]
impl PodEvents for KubeEvents {
    async fn publish(&self, pod: &PodKey, pod_uid: Option<&str>, reason: &str, message: &str, warning: bool) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: pod_uid.map(str::to_string),
            ..Default::default()
        };
        // Events are best effort: never fail a CNI request over them.
        if let Err(e) =
            kuryr_crds::events::publish(&self.recorder, &reference, warning, reason, message, "CNIAdd").await
        {
            tracing::debug!(pod = %pod, error = %e, "could not post event");
        }
    }
}

pub struct KubeApiHealth(pub Client);

#[async_trait]
impl ApiHealth for KubeApiHealth {
    async fn check(&self) -> Result<(), String> {
        self.0
            .apiserver_version()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn pod_uid(&self, key: &PodKey) -> Result<Option<String>, String> {
        let pods: Api<Pod> = Api::namespaced(self.0.clone(), &key.namespace);
        match pods.get_opt(&key.name).await {
            Ok(Some(pod)) => pod
                .metadata
                .uid
                .map(Some)
                .ok_or_else(|| format!("pod {key} has no metadata.uid")),
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Run the daemon against a Kubernetes API until `shutdown` resolves: restore
/// attachments from host links, start both watchers and every server.
pub async fn run(
    config: crate::DaemonConfig,
    client: Client,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let node = config.node_name.clone();
    let events = KubeEvents::new(client.clone(), &node, config.use_events);
    let daemon = crate::Daemon::new(config, Arc::new(events), Arc::new(KubeApiHealth(client.clone())));
    let restored = daemon
        .restore_from_host()
        .await
        .context("reading plugged interfaces from the host")?;
    tracing::info!(restored, node = %node, "starting kuryr daemon");
    let kp_task = tokio::spawn({
        let (c, n, r) = (client.clone(), node.clone(), daemon.registry.clone());
        let events = daemon.events();
        async move { watch_kuryrports(c, &n, r, events).await }
    });
    let pod_task = tokio::spawn({
        let (c, n, r) = (client.clone(), node.clone(), daemon.registry.clone());
        async move { watch_pods(c, &n, r).await }
    });
    let servers = crate::server::start(daemon.clone())
        .await
        .context("starting the daemon's servers")?;
    shutdown.await;
    servers.shutdown().await;
    kp_task.abort();
    pod_task.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("default".into());
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(uid.into());
        p
    }

    #[test]
    fn pods_deleted_while_not_watching_are_reported_after_the_relist() {
        let r = Registry::new();
        let mut t = PodTracker::default();
        for ev in [
            WEvent::Init,
            WEvent::InitApply(pod("a", "ua")),
            WEvent::InitApply(pod("b", "ub")),
            WEvent::InitDone,
        ] {
            t.on_event(ev, &r);
        }
        assert!(!r.is_gone(&PodKey::new("default", "a"), "ua"));
        // The watch broke; "a" was deleted and "b" re-created meanwhile.
        for ev in [
            WEvent::Init,
            WEvent::InitApply(pod("b", "ub2")),
            WEvent::InitApply(pod("c", "uc")),
            WEvent::InitDone,
        ] {
            t.on_event(ev, &r);
        }
        assert!(r.is_gone(&PodKey::new("default", "a"), "ua"));
        assert!(r.is_gone(&PodKey::new("default", "b"), "ub"));
        assert!(!r.is_gone(&PodKey::new("default", "b"), "ub2"));
        assert!(!r.is_gone(&PodKey::new("default", "c"), "uc"));
    }

    #[test]
    fn a_name_back_with_another_uid_means_the_old_pod_is_gone() {
        let r = Registry::new();
        let mut t = PodTracker::default();
        t.on_event(WEvent::Apply(pod("s-0", "u1")), &r);
        t.on_event(WEvent::Apply(pod("s-0", "u1")), &r);
        assert!(!r.is_gone(&PodKey::new("default", "s-0"), "u1"));
        t.on_event(WEvent::Apply(pod("s-0", "u2")), &r);
        assert!(r.is_gone(&PodKey::new("default", "s-0"), "u1"));
        assert!(!r.is_gone(&PodKey::new("default", "s-0"), "u2"));
        t.on_event(WEvent::Delete(pod("s-0", "u2")), &r);
        assert!(r.is_gone(&PodKey::new("default", "s-0"), "u2"));
    }
}
