//! A stale pod event after the controller's own finalizer write (the vif handler's race in a pod
//! burst): the finalizer patch's `test` fails on the stale copy, the helper reads the pod again
//! and finishes, and nothing is logged at ERROR, with the handler behind LogExceptions as in the
//! controller.
//!
//! One test in this binary: it installs the global subscriber (a thread-local one misses events
//! when other tests' threads register the same callsites first), and its cases run one after the
//! other so that each one's log lines are its own.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kuryr_controller::Error;
use kuryr_controller::k8s::{add_finalizer, remove_finalizer};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::pipeline::{Event, EventHandler, EventType, LogExceptions};
use kuryr_crds::names::finalizers;
use serde_json::json;

/// Every formatted log line, at every level.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
    /// Lines logged at ERROR level (not span fields that say "ERROR").
    fn errors(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("ERROR"))
            .map(str::to_string)
            .collect()
    }
    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

/// What the vif handler does first with a pod event: make sure the pod carries the finalizer.
struct AddsFinalizer(kube::Client);

#[async_trait]
impl EventHandler for AddsFinalizer {
    async fn handle(&self, event: Event) -> Result<(), Error> {
        let raw = serde_json::to_value(event.object.as_ref()).map_err(|e| Error::serialization("pod", e))?;
        let pod: Pod = serde_json::from_value(raw).map_err(|e| Error::serialization("pod", e))?;
        add_finalizer(&self.0, &pod, finalizers::POD).await?;
        Ok(())
    }
    fn name(&self) -> &str {
        "vif"
    }
}

async fn pod(client: &kube::Client, name: &str, finalizers: &[&str]) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "finalizers": finalizers},
        "spec": {"containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

fn stale_event(pod: &Pod) -> Event {
    let resource = Arc::new(ApiResource::erase::<Pod>(&()));
    let mut raw = serde_json::to_value(pod).unwrap();
    raw["apiVersion"] = json!("v1");
    raw["kind"] = json!("Pod");
    let stale: DynamicObject = serde_json::from_value(raw).unwrap();
    Event::new(EventType::Added, resource, stale)
}

#[tokio::test]
async fn finalizer_races_log_no_error() {
    let lines = Lines::default();
    let writer = lines.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let kube = kuryr_testbed::start_kube().await.unwrap();
    let client = kube.client.clone();
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let metrics = Metrics::new();
    let handler = LogExceptions::new(AddsFinalizer(client.clone()), metrics.clone(), Default::default());

    // 1. The first event adds the finalizer, then the (stale) creation event arrives.
    let created = pod(&client, "burst-0", &[]).await;
    add_finalizer(&client, &created, finalizers::POD).await.unwrap();
    lines.clear();
    handler.handle(stale_event(&created)).await.unwrap();
    let now = pods.get("burst-0").await.unwrap();
    assert_eq!(now.metadata.finalizers, Some(vec![finalizers::POD.to_string()]));
    let log = lines.text();
    assert!(log.contains("stale copy"), "the conflict was not met: {log}");
    assert_eq!(lines.errors(), Vec::<String>::new());

    // 2. Removal from a stale copy: another controller put its finalizer first meanwhile.
    let stale = pod(&client, "burst-1", &[finalizers::POD]).await;
    let mut fresh = pods.get("burst-1").await.unwrap();
    fresh.metadata.finalizers = Some(vec!["example.com/other".into(), finalizers::POD.into()]);
    pods.replace("burst-1", &PostParams::default(), &fresh)
        .await
        .unwrap();
    remove_finalizer(&client, &stale, finalizers::POD).await.unwrap();
    let now = pods.get("burst-1").await.unwrap();
    assert_eq!(
        now.metadata.finalizers,
        Some(vec!["example.com/other".to_string()])
    );

    // 3. The pod is gone before its finalizer could be added: nothing to do, nothing to report.
    let created = pod(&client, "burst-2", &[]).await;
    pods.delete("burst-2", &Default::default()).await.unwrap();
    lines.clear();
    handler.handle(stale_event(&created)).await.unwrap();
    let log = lines.text();
    assert!(log.contains("object gone"), "{log}");
    assert_eq!(lines.errors(), Vec::<String>::new());

    assert!(
        !metrics.encode().contains("handler=\"vif\""),
        "{}",
        metrics.encode()
    );
    kube.handle.shutdown().await.unwrap();
}
