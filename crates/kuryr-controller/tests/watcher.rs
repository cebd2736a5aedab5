//! The watcher against the Kubernetes API emulator: events reach the pipeline, and the periodic
//! reconcile re-sends objects whose state did not change (healing handlers whose retries ran out).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, PostParams};
use kuryr_controller::Error;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::pipeline::{Event, EventHandler, EventType, WatchSelector};
use kuryr_controller::watcher::run_watch;
use kuryr_testbed::start_kube;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Seen(Mutex<Vec<(EventType, String, String)>>);

#[async_trait]
impl EventHandler for Seen {
    async fn handle(&self, e: Event) -> Result<(), Error> {
        let m = &e.object.metadata;
        self.0.lock().await.push((
            e.event_type,
            m.name.clone().unwrap_or_default(),
            m.resource_version.clone().unwrap_or_default(),
        ));
        Ok(())
    }
    fn name(&self) -> &str {
        "seen"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_reconcile_resends_unchanged_objects() -> anyhow::Result<()> {
    let kube = start_kube().await?;
    let cms: Api<ConfigMap> = Api::namespaced(kube.client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": "cm-1"}}))?;
    let created = cms.create(&PostParams::default(), &cm).await?;
    let rv = created.metadata.resource_version.clone().unwrap();
    let seen = Arc::new(Seen::default());
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_watch(
        kube.client.clone(),
        Arc::new(ApiResource::erase::<ConfigMap>(&())),
        WatchSelector::default(),
        Duration::from_secs(1),
        seen.clone(),
        Metrics::new(),
        stop.clone(),
    ));
    // Waits for the outcome (two re-sends of a 1 s period), however long a loaded machine takes.
    let mut events = vec![];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        events = seen.0.lock().await.clone();
        if events.iter().filter(|(_, n, _)| n == "cm-1").count() >= 3 {
            break;
        }
    }
    stop.cancel();
    task.await?;
    let mine: Vec<_> = events.iter().filter(|(_, n, _)| n == "cm-1").collect();
    assert_eq!(mine.first().map(|e| e.0), Some(EventType::Added), "{events:?}");
    assert!(mine.len() >= 3, "two periodic re-sends: {events:?}");
    assert!(
        mine[1..]
            .iter()
            .all(|(t, _, r)| *t == EventType::Modified && *r == rv),
        "re-sends carry the unchanged object: {events:?}"
    );
    Ok(())
}
