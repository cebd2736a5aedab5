//! Kubernetes plumbing: the KuryrPort and Pod watchers feeding the
//! registry, Events on pods, API health.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event as WEvent};
use kube::{Api, Client};
use kuryr_crds::KuryrPort;

use crate::daemon::{ApiHealth, PodEvents};
use crate::registry::{PodKey, Registry};

/// Feed `registry` from this node's KuryrPorts (label selector) until the
/// stream ends; watcher errors are retried with backoff by the caller loop.
pub async fn watch_kuryrports(client: Client, node: &str, registry: Arc<Registry>) {
    let api: Api<KuryrPort> = Api::all(client);
    let cfg = watcher::Config::default().labels(&KuryrPort::node_selector(node));
    let mut buffer: Vec<KuryrPort> = Vec::new();
    let mut stream = watcher::watcher(api, cfg).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(WEvent::Apply(kp)) => registry.apply_kuryrport(kp),
            Ok(WEvent::Delete(kp)) => {
                if let Some(k) = PodKey::of(&kp) {
                    registry.delete_kuryrport(&k);
                }
            }
            Ok(WEvent::Init) => buffer.clear(),
            Ok(WEvent::InitApply(kp)) => buffer.push(kp),
            Ok(WEvent::InitDone) => registry.replace_kuryrports(std::mem::take(&mut buffer)),
            Err(e) => {
                tracing::warn!(error = %e, "KuryrPort watch failed, retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

/// Watch this node's pods (field selector `spec.nodeName`) to learn when a
/// pod is gone, so that a waiting ADD answers 410 at once.
pub async fn watch_pods(client: Client, node: &str, registry: Arc<Registry>) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher::watcher(api, cfg).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(WEvent::Delete(pod)) => {
                if let (Some(ns), Some(name), Some(uid)) =
                    (pod.metadata.namespace, pod.metadata.name, pod.metadata.uid)
                {
                    registry.pod_deleted(&PodKey::new(ns, name), &uid);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "Pod watch failed, retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

/// Events through `events.k8s.io` with reporter `kuryr-daemon`/<node>.
pub struct KubeEvents {
    recorder: Recorder,
}

impl KubeEvents {
    pub fn new(client: Client, node: &str) -> Self {
        let reporter = Reporter {
            controller: "kuryr-daemon".into(),
            instance: Some(node.to_string()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
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
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(message.chars().take(1000).collect()),
            action: "CNIAdd".into(),
            secondary: None,
        };
        // Events are best effort: never fail a CNI request over them.
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
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
    let daemon = crate::Daemon::new(
        config,
        Arc::new(KubeEvents::new(client.clone(), &node)),
        Arc::new(KubeApiHealth(client.clone())),
    );
    let restored = daemon
        .restore_from_host()
        .await
        .context("reading plugged interfaces from the host")?;
    tracing::info!(restored, node = %node, "starting kuryr daemon");
    let kp_task = tokio::spawn({
        let (c, n, r) = (client.clone(), node.clone(), daemon.registry.clone());
        async move { watch_kuryrports(c, &n, r).await }
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
