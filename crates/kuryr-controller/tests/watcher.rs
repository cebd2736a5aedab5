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

/// A sink whose backlog lets the re-send take `open` more batches, then holds it back.
struct Gate {
    seen: Seen,
    open: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl EventHandler for Gate {
    async fn handle(&self, e: Event) -> Result<(), Error> {
        self.seen.handle(e).await
    }
    fn name(&self) -> &str {
        "gate"
    }
    async fn backlog(&self) -> usize {
        use std::sync::atomic::Ordering::SeqCst;
        match self.open.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)) {
            Ok(_) => 0,
            Err(_) => 100_000,
        }
    }
}

/// A re-send's later pages are the API server's snapshot at its first page: an object deleted
/// or changed since is listed as it was. The re-send passes over those (the watch delivered the
/// change), or it would bring back a deleted object and an old version after the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_never_sends_an_object_older_than_the_watch_delivered() -> anyhow::Result<()> {
    use std::sync::atomic::Ordering::SeqCst;
    let kube = start_kube().await?;
    let cms: Api<ConfigMap> = Api::namespaced(kube.client.clone(), "default");
    // Three pages of the re-send (100 each).
    for i in 0..250 {
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("snap-{i:03}")}}))?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let sink = Arc::new(Gate {
        seen: Seen::default(),
        open: std::sync::atomic::AtomicUsize::new(1),
    });
    let stop = CancellationToken::new();
    let task = watch_config_maps(&kube.client, sink.clone(), &stop);
    let events = |sink: Arc<Gate>| async move { sink.seen.0.lock().await.clone() };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    // The first batch of the first page re-sent, then the re-send is held back.
    while !events(sink.clone())
        .await
        .iter()
        .any(|(t, n, _)| *t == EventType::Modified && n.starts_with("snap-"))
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cms.delete("snap-249", &Default::default()).await?;
    let mut cm = cms.get("snap-248").await?;
    let old_rv = cm.metadata.resource_version.clone().unwrap();
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    let new_rv = cms
        .replace("snap-248", &PostParams::default(), &cm)
        .await?
        .metadata
        .resource_version
        .unwrap();
    // The watch delivers both changes; then the re-send goes on through its snapshot.
    while !events(sink.clone())
        .await
        .iter()
        .any(|(t, n, _)| *t == EventType::Deleted && n == "snap-249")
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sink.open.store(usize::MAX, SeqCst);
    let resent = |events: &[(EventType, String, String)], name: &str| {
        events
            .iter()
            .filter(|(t, n, _)| *t == EventType::Modified && n == name)
            .count()
    };
    // Until the first re-send has reached the last object (snap-247 is re-sent once per period).
    while resent(&events(sink.clone()).await, "snap-247") < 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    task.await?;
    let all = events(sink.clone()).await;
    let deleted_at = all
        .iter()
        .position(|(t, n, _)| *t == EventType::Deleted && n == "snap-249")
        .expect("the deletion delivered");
    assert!(
        !all[deleted_at + 1..].iter().any(|(_, n, _)| n == "snap-249"),
        "a deleted object re-sent: {:?}",
        &all[deleted_at + 1..]
            .iter()
            .filter(|(_, n, _)| n == "snap-249")
            .collect::<Vec<_>>()
    );
    let changed_at = all
        .iter()
        .position(|(_, n, rv)| n == "snap-248" && *rv == new_rv)
        .expect("the change delivered");
    assert!(
        !all[changed_at..]
            .iter()
            .any(|(_, n, rv)| n == "snap-248" && *rv == old_rv),
        "an old version re-sent after the new one"
    );
    assert!(resent(&all, "snap-247") >= 1, "the re-send went on to the end");
    Ok(())
}

/// While the watch re-lists, what changed meanwhile is not known yet: an object deleted while
/// the watch was down is still held at its last version until the re-list is done. The re-send
/// waits for it, or it would send such an object again (a deleted pod wired again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_waits_while_the_watch_relists() -> anyhow::Result<()> {
    use std::sync::atomic::Ordering::SeqCst;
    let kube = start_kube().await?;
    let cms: Api<ConfigMap> = Api::namespaced(kube.client.clone(), "default");
    // Two pages of the re-send (100 each).
    for i in 0..150 {
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("rl-{i:03}")}}))?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let sink = Arc::new(Gate {
        seen: Seen::default(),
        open: std::sync::atomic::AtomicUsize::new(1),
    });
    let stop = CancellationToken::new();
    let task = watch_config_maps(&kube.client, sink.clone(), &stop);
    let events = |sink: Arc<Gate>| async move { sink.seen.0.lock().await.clone() };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    // The re-send read its first page and sent one batch of it (rl-000..031); then it is held back.
    let resending = |events: Vec<(EventType, String, String)>| {
        events
            .iter()
            .any(|(t, n, _)| *t == EventType::Modified && n.starts_with("rl-"))
    };
    while !resending(events(sink.clone()).await) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(resending(events(sink.clone()).await), "the re-send started");
    // The watch goes down and its history with it: it must re-list, and its lists are slow.
    kube.handle.hold_lists(true);
    let lists = || {
        kube.handle
            .requests()
            .snapshot()
            .get("list configmaps")
            .copied()
            .unwrap_or(0)
    };
    let before = lists();
    kube.handle.compact();
    kube.handle.drop_watches();
    cms.delete("rl-050", &Default::default()).await?;
    // The watch's re-list is under way (held): the re-send may go on as far as the pipeline goes.
    while lists() == before && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(lists() > before, "the watch re-listed");
    sink.open.store(usize::MAX, SeqCst);
    // Long enough for the rest of the first page (three batches, 20 ms apart) many times over.
    tokio::time::sleep(Duration::from_secs(1)).await;
    kube.handle.hold_lists(false);
    let resent = |events: &[(EventType, String, String)], name: &str| {
        events
            .iter()
            .filter(|(t, n, _)| *t == EventType::Modified && n == name)
            .count()
    };
    // Until the re-send has reached its second page.
    while resent(&events(sink.clone()).await, "rl-149") < 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    task.await?;
    let all = events(sink.clone()).await;
    assert!(
        all.iter()
            .any(|(t, n, _)| *t == EventType::Deleted && n == "rl-050"),
        "the re-list delivered the deletion"
    );
    assert_eq!(resent(&all, "rl-050"), 0, "a deleted object re-sent");
    assert!(
        resent(&all, "rl-099") >= 1,
        "the re-send went on through its first page"
    );
    assert!(resent(&all, "rl-149") >= 1, "the re-send went on to the end");
    Ok(())
}
