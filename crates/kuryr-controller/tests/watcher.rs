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

/// ConfigMaps watched into `sink`, with a 1 s reconcile period.
fn watch_config_maps(
    kube: &kube::Client,
    sink: Arc<dyn EventHandler>,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run_watch(
        kube.clone(),
        Arc::new(ApiResource::erase::<ConfigMap>(&())),
        WatchSelector::default(),
        Duration::from_secs(1),
        false,
        sink,
        Metrics::new(),
        stop.clone(),
    ))
}

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
    let task = watch_config_maps(&kube.client, seen.clone(), &stop);
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

/// A sink reporting a backlog the test sets.
#[derive(Default)]
struct Busy {
    seen: Seen,
    backlog: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl EventHandler for Busy {
    async fn handle(&self, e: Event) -> Result<(), Error> {
        self.seen.handle(e).await
    }
    fn name(&self) -> &str {
        "busy"
    }
    async fn backlog(&self) -> usize {
        self.backlog.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The periodic re-send waits while the pipeline is busy (it never queues every object at once
/// on top of a backlog), and goes on once the backlog is small; new events are never held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_resend_waits_for_a_busy_pipeline() -> anyhow::Result<()> {
    let kube = start_kube().await?;
    let cms: Api<ConfigMap> = Api::namespaced(kube.client.clone(), "default");
    for i in 0..3 {
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("busy-{i}")}}))?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let sink = Arc::new(Busy::default());
    sink.backlog.store(100_000, std::sync::atomic::Ordering::Relaxed);
    let stop = CancellationToken::new();
    let task = watch_config_maps(&kube.client, sink.clone(), &stop);
    let count = |ty: EventType| {
        let sink = sink.clone();
        async move {
            sink.seen
                .0
                .lock()
                .await
                .iter()
                .filter(|(t, n, _)| *t == ty && n.starts_with("busy-"))
                .count()
        }
    };
    // Three periods with a large backlog: the objects arrive, none is re-sent.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(count(EventType::Added).await, 3);
    assert_eq!(
        count(EventType::Modified).await,
        0,
        "re-sent into a busy pipeline"
    );
    // A change still goes through at once.
    let mut cm = cms.get("busy-0").await?;
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    cms.replace("busy-0", &PostParams::default(), &cm).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(EventType::Modified).await < 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(EventType::Modified).await, 1, "the change, not a re-send");
    // The backlog gone: every object is re-sent.
    sink.backlog.store(0, std::sync::atomic::Ordering::Relaxed);
    while count(EventType::Modified).await < 4 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await?;
    assert!(
        count(EventType::Modified).await >= 4,
        "the change and three re-sends"
    );
    Ok(())
}

/// A re-send paced by a busy pipeline can outlast the API server's history: its next page then
/// answers 410. It goes on from the same place with the token the server offers (objects are
/// re-sent as they are now), so every object is re-sent once before any is re-sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_outlasting_the_server_history_goes_on_where_it_was() -> anyhow::Result<()> {
    let kube = start_kube().await?;
    let cms: Api<ConfigMap> = Api::namespaced(kube.client.clone(), "default");
    // Three pages of the re-send (100 each).
    const N: usize = 250;
    for i in 0..N {
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("long-{i:03}")}}))?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let seen = Arc::new(Seen::default());
    let stop = CancellationToken::new();
    kube.handle.compact_before_continued_lists(2);
    let task = watch_config_maps(&kube.client, seen.clone(), &stop);
    let resent = |seen: Arc<Seen>| async move {
        seen.0
            .lock()
            .await
            .iter()
            .filter(|(t, n, _)| *t == EventType::Modified && n.starts_with("long-"))
            .map(|(_, n, _)| n.clone())
            .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while resent(seen.clone()).await.len() < N && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await?;
    let first_round: Vec<String> = resent(seen.clone()).await.into_iter().take(N).collect();
    let distinct: std::collections::BTreeSet<&String> = first_round.iter().collect();
    assert_eq!(
        distinct.len(),
        N,
        "every object re-sent once before any twice (the first {} re-sends)",
        first_round.len()
    );
    Ok(())
}
