#![allow(clippy::unwrap_used)]
//! The pipeline's semantics, tested without any API server. Every test runs on tokio's paused
//! clock: handler delays, retry backoffs and deadlines then advance in virtual time, only when
//! nothing else can run, so no outcome depends on how fast or loaded the machine is.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher::Event as WEvent;
use kuryr_controller::Error;
use kuryr_controller::k8s::ObjectSource;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::pipeline::{
    Async, Dispatcher, Event, EventHandler, EventType, LogExceptions, Retry, RetryPolicy,
};
use kuryr_controller::watcher::KnownObjects;
use tokio::sync::Mutex;

fn pod_resource() -> Arc<ApiResource> {
    Arc::new(ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()))
}

fn obj(name: &str, uid: &str, rv: &str) -> DynamicObject {
    let mut o = DynamicObject::new(name, &pod_resource()).within("default");
    o.metadata.uid = Some(uid.into());
    o.metadata.resource_version = Some(rv.into());
    o
}

fn ev(ty: EventType, name: &str, uid: &str, rv: &str) -> Event {
    Event::new(ty, pod_resource(), obj(name, uid, rv))
}

/// Records (object, rv) in handling order; sleeps per event to expose concurrency.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(String, String)>>,
    delay: Duration,
    in_flight: Mutex<HashMap<String, bool>>,
    overlapped: Mutex<bool>,
}

#[async_trait]
impl EventHandler for Recorder {
    async fn handle(&self, event: Event) -> Result<(), Error> {
        let name = event.object.metadata.name.clone().unwrap_or_default();
        {
            let mut f = self.in_flight.lock().await;
            if f.insert(name.clone(), true) == Some(true) {
                *self.overlapped.lock().await = true;
            }
        }
        tokio::time::sleep(self.delay).await;
        self.in_flight.lock().await.insert(name.clone(), false);
        let rv = event.object.metadata.resource_version.clone().unwrap_or_default();
        self.seen.lock().await.push((name, rv));
        Ok(())
    }
    fn name(&self) -> &str {
        "recorder"
    }
}

async fn wait_idle<H: EventHandler + 'static>(a: &Async<H>) {
    for _ in 0..500 {
        if a.depth().await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("async queues never drained");
}

#[tokio::test(start_paused = true)]
async fn async_keeps_per_object_order_and_coalesces_stale_events() {
    let rec = Arc::new(Recorder {
        delay: Duration::from_millis(30),
        ..Default::default()
    });
    let a = Async::new(rec.clone(), 8);
    // a: 1 is handled at once; 2, 3, 4 arrive while 1 runs -> only 4 (the newest) is handled next.
    a.handle(ev(EventType::Modified, "a", "uid-a", "1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    for rv in ["2", "3", "4"] {
        a.handle(ev(EventType::Modified, "a", "uid-a", rv)).await.unwrap();
    }
    a.handle(ev(EventType::Added, "b", "uid-b", "10")).await.unwrap();
    wait_idle(&a).await;
    let seen = rec.seen.lock().await.clone();
    let a_rvs: Vec<_> = seen
        .iter()
        .filter(|(n, _)| n == "a")
        .map(|(_, rv)| rv.as_str())
        .collect();
    assert_eq!(
        a_rvs,
        vec!["1", "4"],
        "stale events must be coalesced, order kept"
    );
    assert!(seen.iter().any(|(n, rv)| n == "b" && rv == "10"));
    assert!(
        !*rec.overlapped.lock().await,
        "one object's events must never run concurrently"
    );
    assert_eq!(a.stats().coalesced.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(a.depth().await, 0, "queues are dropped once empty");
}

#[tokio::test(start_paused = true)]
async fn async_handles_different_objects_concurrently() {
    let rec = Arc::new(Recorder {
        delay: Duration::from_millis(200),
        ..Default::default()
    });
    let a = Async::new(rec.clone(), 16);
    let start = tokio::time::Instant::now();
    for i in 0..10 {
        a.handle(ev(EventType::Added, &format!("p{i}"), &format!("u{i}"), "1"))
            .await
            .unwrap();
    }
    wait_idle(&a).await;
    assert_eq!(rec.seen.lock().await.len(), 10);
    // Sequential handling would need 2 s (virtual time: exactly 200 ms when concurrent).
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        start.elapsed()
    );
}

/// Fails with ResourceNotReady `fail_times` times, then succeeds; records the rv it saw each time.
struct Flaky {
    fail_times: Mutex<u32>,
    error: fn() -> Error,
    seen_rvs: Mutex<Vec<String>>,
}

#[async_trait]
impl EventHandler for Flaky {
    async fn handle(&self, event: Event) -> Result<(), Error> {
        self.seen_rvs
            .lock()
            .await
            .push(event.object.metadata.resource_version.clone().unwrap_or_default());
        let mut n = self.fail_times.lock().await;
        if *n > 0 {
            *n -= 1;
            return Err((self.error)());
        }
        Ok(())
    }
    fn name(&self) -> &str {
        "flaky"
    }
}

/// An object source that serves a fixed current state.
struct Source(Mutex<Option<DynamicObject>>);

#[async_trait]
impl ObjectSource for Source {
    async fn get(&self, _: &ApiResource, _: Option<&str>, _: &str) -> Result<Option<DynamicObject>, Error> {
        Ok(self.0.lock().await.clone())
    }
}

fn fast_policy() -> RetryPolicy {
    RetryPolicy {
        initial: Duration::from_millis(5),
        max_interval: Duration::from_millis(20),
        deadline: Duration::from_secs(5),
    }
}

#[tokio::test(start_paused = true)]
async fn retry_rereads_the_object_and_succeeds() {
    let flaky = Arc::new(Flaky {
        fail_times: Mutex::new(2),
        error: || Error::not_ready("vif not active"),
        seen_rvs: Mutex::default(),
    });
    let source = Arc::new(Source(Mutex::new(Some(obj("a", "uid-a", "7")))));
    let r = Retry::new(flaky.clone(), source, fast_policy(), Metrics::new());
    r.handle(ev(EventType::Modified, "a", "uid-a", "1"))
        .await
        .unwrap();
    assert_eq!(
        *flaky.seen_rvs.lock().await,
        vec!["1", "7", "7"],
        "retries see the re-read object"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_drops_the_event_when_the_object_is_gone() {
    let flaky = Arc::new(Flaky {
        fail_times: Mutex::new(100),
        error: || Error::not_ready("x"),
        seen_rvs: Mutex::default(),
    });
    let r = Retry::new(
        flaky.clone(),
        Arc::new(Source(Mutex::new(None))),
        fast_policy(),
        Metrics::new(),
    );
    r.handle(ev(EventType::Modified, "a", "uid-a", "1"))
        .await
        .unwrap();
    assert_eq!(flaky.seen_rvs.lock().await.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn retry_does_not_retry_permanent_errors_and_gives_up_at_the_deadline() {
    let flaky = Arc::new(Flaky {
        fail_times: Mutex::new(100),
        error: || Error::invalid("metadata.annotations", "bad json"),
        seen_rvs: Mutex::default(),
    });
    let source = Arc::new(Source(Mutex::new(Some(obj("a", "uid-a", "1")))));
    let r = Retry::new(flaky.clone(), source.clone(), fast_policy(), Metrics::new());
    let err = r
        .handle(ev(EventType::Modified, "a", "uid-a", "1"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }));
    assert_eq!(flaky.seen_rvs.lock().await.len(), 1);

    let flaky = Arc::new(Flaky {
        fail_times: Mutex::new(u32::MAX),
        error: || Error::not_ready("never"),
        seen_rvs: Mutex::default(),
    });
    let policy = RetryPolicy {
        deadline: Duration::from_millis(100),
        ..fast_policy()
    };
    let r = Retry::new(flaky.clone(), source, policy, Metrics::new());
    let err = r
        .handle(ev(EventType::Modified, "a", "uid-a", "1"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ResourceNotReady(_)));
    assert!(flaky.seen_rvs.lock().await.len() > 2);
}

/// Waits `wait` (an amphora booting), then fails once with a retryable error; succeeds after that.
struct SlowThenRace {
    wait: Duration,
    attempts: Mutex<u32>,
}

#[async_trait]
impl EventHandler for SlowThenRace {
    async fn handle(&self, _: Event) -> Result<(), Error> {
        let mut n = self.attempts.lock().await;
        *n += 1;
        if *n == 1 {
            tokio::time::sleep(self.wait).await;
            return Err(Error::not_ready("load balancer PENDING_UPDATE (409)"));
        }
        Ok(())
    }
    fn name(&self) -> &str {
        "slow"
    }
}

#[tokio::test(start_paused = true)]
async fn a_long_wait_by_design_does_not_use_up_the_retry_budget() {
    let source = Arc::new(Source(Mutex::new(Some(obj("a", "uid-a", "1")))));
    let default = RetryPolicy::default();
    let slow = || {
        Arc::new(SlowThenRace {
            wait: Duration::from_secs(250),
            attempts: Mutex::new(0),
        })
    };
    // Without the allowance, a 250 s activation wait leaves nothing of the 180 s budget.
    let h = slow();
    let r = Retry::new(h.clone(), source.clone(), default.clone(), Metrics::new());
    let err = r.handle(ev(EventType::Modified, "a", "uid-a", "1")).await;
    assert!(matches!(err, Err(Error::ResourceNotReady(_))), "{err:?}");
    assert_eq!(*h.attempts.lock().await, 1);

    let allowing = default.allowing(Duration::from_secs(300));
    assert_eq!(allowing.deadline, Duration::from_secs(480));
    let h = slow();
    let r = Retry::new(h.clone(), source, allowing, Metrics::new());
    r.handle(ev(EventType::Modified, "a", "uid-a", "1"))
        .await
        .unwrap();
    assert_eq!(*h.attempts.lock().await, 2, "retried after the slow wait");
}

#[tokio::test(start_paused = true)]
async fn log_exceptions_isolates_failures_between_handlers() {
    let metrics = Metrics::new();
    let failing = Arc::new(Flaky {
        fail_times: Mutex::new(1),
        error: || Error::invalid("spec", "boom"),
        seen_rvs: Mutex::default(),
    });
    let rec = Arc::new(Recorder::default());
    let mut d = Dispatcher::new();
    let gvk = kube::core::GroupVersionKind::gvk("", "v1", "Pod");
    d.register(
        gvk.clone(),
        Arc::new(LogExceptions::new(
            failing.clone(),
            metrics.clone(),
            Default::default(),
        )),
    );
    d.register(
        gvk,
        Arc::new(LogExceptions::new(
            rec.clone(),
            metrics.clone(),
            Default::default(),
        )),
    );
    d.handle(ev(EventType::Added, "a", "uid-a", "1")).await.unwrap();
    assert_eq!(rec.seen.lock().await.len(), 1, "the second handler still ran");
    let text = metrics.encode();
    assert!(
        text.contains("kuryr_handler_failures_total{handler=\"flaky\",kind=\"InvalidInput\"} 1"),
        "{text}"
    );
}

#[test]
fn known_objects_emit_deletes_for_objects_missing_after_a_relist() {
    for keep_state in [false, true] {
        let mut k = KnownObjects::new(keep_state);
        assert_eq!(k.apply(WEvent::Apply(obj("a", "ua", "1")))[0].0, EventType::Added);
        let mut b = obj("b", "ub", "2");
        b.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        b.data = serde_json::json!({"spec": {"nodeName": "n1"}});
        assert_eq!(k.apply(WEvent::Apply(b))[0].0, EventType::Added);
        assert_eq!(
            k.apply(WEvent::Apply(obj("a", "ua", "3")))[0].0,
            EventType::Modified
        );
        // Re-list after a 410: "a" unchanged, "b" deleted while we were away, "c" new.
        assert!(k.apply(WEvent::Init).is_empty());
        assert!(
            k.apply(WEvent::InitApply(obj("a", "ua", "3"))).is_empty(),
            "unchanged objects are not re-sent"
        );
        let c = k.apply(WEvent::InitApply(obj("c", "uc", "9")));
        assert_eq!(c[0].0, EventType::Added);
        let done = k.apply(WEvent::InitDone);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].0, EventType::Deleted);
        let gone = &done[0].1;
        assert_eq!(gone.metadata.name.as_deref(), Some("b"));
        assert_eq!(gone.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(gone.metadata.uid.as_deref(), Some("ub"));
        if keep_state {
            assert_eq!(
                gone.metadata.labels.as_ref().map(|l| l["app"].as_str()),
                Some("web")
            );
            assert!(!gone.data.is_null(), "the last state, whole");
        } else {
            assert!(gone.data.is_null(), "only the name, namespace and uid are known");
            assert_eq!(gone.metadata.labels, None);
        }
        assert_eq!(k.len(), 2);
    }
}

#[test]
fn known_objects_keep_and_pass_on_no_field_manager_bookkeeping() {
    let mut k = KnownObjects::new(true);
    let mut o = obj("a", "ua", "1");
    o.metadata.managed_fields = Some(vec![Default::default(); 3]);
    o.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
    o.data = serde_json::json!({"spec": {"nodeName": "n1", "containers": [{"name": "c"}]}, "status": {"phase": "Running"}});
    let out = k.apply(WEvent::Apply(o));
    assert_eq!(out[0].1.metadata.managed_fields, None);
    // What is kept (as compact JSON) comes back whole when a re-list finds the object gone.
    k.apply(WEvent::Init);
    let gone = k.apply(WEvent::InitDone);
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].1.metadata.managed_fields, None);
    assert_eq!(
        serde_json::to_value(&gone[0].1).unwrap(),
        serde_json::to_value(&out[0].1).unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn stopping_the_pipeline_ends_queued_and_running_handlers() {
    let rec = Arc::new(Recorder {
        delay: Duration::from_millis(500),
        ..Default::default()
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let a = Async::with_stop(rec.clone(), 1, stop.clone());
    for i in 0..3 {
        a.handle(ev(EventType::Added, &format!("p{i}"), &format!("u{i}"), "1"))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.cancel();
    wait_idle(&a).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    // A lost leader must not keep acting: nothing completes after the stop.
    assert!(rec.seen.lock().await.is_empty(), "{:?}", rec.seen.lock().await);
}

/// Fails "not ready" for every object named `stuck*`; records the others.
struct StuckOrRecord(Mutex<Vec<String>>);

#[async_trait]
impl EventHandler for StuckOrRecord {
    async fn handle(&self, event: Event) -> Result<(), Error> {
        let name = event.object.metadata.name.clone().unwrap_or_default();
        if name.starts_with("stuck") {
            return Err(Error::not_ready("quota"));
        }
        self.0.lock().await.push(name);
        Ok(())
    }
    fn name(&self) -> &str {
        "stuck-or-record"
    }
}

#[tokio::test(start_paused = true)]
async fn objects_backing_off_do_not_hold_the_worker_slots() {
    let handler = Arc::new(StuckOrRecord(Mutex::default()));
    let source = Arc::new(Source(Mutex::new(Some(obj("stuck-0", "uid-s0", "1")))));
    let policy = RetryPolicy {
        initial: Duration::from_secs(1),
        max_interval: Duration::from_secs(1),
        deadline: Duration::from_secs(30),
    };
    // One worker slot, and two objects that keep failing: the slot is free while they back off,
    // so "ok" is handled at once, not when a backoff ends (1 s; the slot passed on only then).
    let a = Async::new(Retry::new(handler.clone(), source, policy, Metrics::new()), 1);
    a.handle(ev(EventType::Added, "stuck-0", "uid-s0", "1"))
        .await
        .unwrap();
    a.handle(ev(EventType::Added, "stuck-1", "uid-s1", "1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.handle(ev(EventType::Added, "ok", "uid-ok", "1")).await.unwrap();
    for _ in 0..50 {
        if handler.0.lock().await.contains(&"ok".to_string()) {
            assert!(a.depth().await >= 1, "stuck-0 is still retrying");
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "an object behind two backing-off objects was not handled within 0.5 s: their backoff held the slot"
    );
}

/// The backlog the watcher's re-send waits on counts objects waiting for a worker, not the ones
/// being handled (a handler in its retry backoff holds no queued event).
#[tokio::test(start_paused = true)]
async fn the_backlog_counts_objects_waiting_for_a_worker() {
    let rec = Arc::new(Recorder {
        delay: Duration::from_millis(500),
        ..Default::default()
    });
    let a = Async::new(rec.clone(), 1);
    for i in 0..3 {
        a.handle(ev(EventType::Added, &format!("p{i}"), &format!("u{i}"), "1"))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // One handled (one worker), two waiting for it.
    assert_eq!(a.depth().await, 3);
    assert_eq!(a.backlog().await, 2);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!((a.depth().await, a.backlog().await), (0, 0));
}

/// An object waiting for a worker slot is kept as text and parsed again when a worker takes it:
/// nothing of it is lost, and a newer event that arrives while it waits replaces it.
#[tokio::test(start_paused = true)]
async fn an_event_waiting_for_a_slot_comes_back_whole_and_coalesces() {
    #[derive(Default)]
    struct Bodies(Mutex<Vec<(String, String, serde_json::Value)>>);
    #[async_trait]
    impl EventHandler for Bodies {
        async fn handle(&self, event: Event) -> Result<(), Error> {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let o = &event.object;
            self.0.lock().await.push((
                o.metadata.name.clone().unwrap_or_default(),
                o.metadata.resource_version.clone().unwrap_or_default(),
                o.data.clone(),
            ));
            Ok(())
        }
        fn name(&self) -> &str {
            "bodies"
        }
    }
    let seen = Arc::new(Bodies::default());
    let a = Async::new(seen.clone(), 1);
    a.handle(ev(EventType::Added, "busy", "u-busy", "1"))
        .await
        .unwrap();
    tokio::task::yield_now().await;
    for rv in ["1", "2"] {
        let mut o = obj("waiting", "u-w", rv);
        o.data = serde_json::json!({"spec": {"nodeName": "n1", "rv": rv}, "status": {"podIP": "10.0.0.7"}});
        a.handle(Event::new(EventType::Modified, pod_resource(), o))
            .await
            .unwrap();
    }
    assert_eq!(a.backlog().await, 1, "one object waits, with one pending event");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = seen.0.lock().await;
    assert_eq!(seen.len(), 2, "the stale event was replaced: {seen:?}");
    assert_eq!((seen[1].0.as_str(), seen[1].1.as_str()), ("waiting", "2"));
    assert_eq!(
        seen[1].2,
        serde_json::json!({"spec": {"nodeName": "n1", "rv": "2"}, "status": {"podIP": "10.0.0.7"}})
    );
}

/// The in-flight bound holds whatever the workers: with four slots and room for two, at most two
/// objects are in their handler at once, the others wait as queued events, and all are handled.
#[tokio::test(start_paused = true)]
async fn objects_in_their_handler_are_bounded_whatever_the_worker_slots() {
    #[derive(Default)]
    struct Waits {
        inside: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
        done: std::sync::atomic::AtomicUsize,
    }
    #[async_trait]
    impl EventHandler for Waits {
        async fn handle(&self, _event: Event) -> Result<(), Error> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.inside.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            kuryr_controller::pipeline::idle(tokio::time::sleep(Duration::from_secs(1))).await;
            self.inside.fetch_sub(1, SeqCst);
            self.done.fetch_add(1, SeqCst);
            Ok(())
        }
        fn name(&self) -> &str {
            "waits"
        }
    }
    let w = Arc::new(Waits::default());
    let a = Async::new(w.clone(), 4).with_max_in_flight(2);
    for i in 0..5 {
        a.handle(ev(EventType::Added, &format!("p{i}"), &format!("u{i}"), "1"))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(
        w.inside.load(SeqCst),
        2,
        "two in their handler, the others queued"
    );
    assert_eq!(a.backlog().await, 3);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(w.done.load(SeqCst), 5);
    assert_eq!(w.most.load(SeqCst), 2, "never more than two in their handler");
}

/// Objects beyond the in-flight bound wait without a task: they are served in arrival order by
/// the tasks that finish, a newer event for a waiting object replaces its pending one, and an
/// object that gets an event while its task runs is handled again by that same task.
#[tokio::test(start_paused = true)]
async fn waiting_objects_are_served_in_arrival_order_with_their_newest_event() {
    let rec = Arc::new(Recorder {
        delay: Duration::from_millis(100),
        ..Default::default()
    });
    let a = Async::new(rec.clone(), 1).with_max_in_flight(1);
    a.handle(ev(EventType::Added, "p0", "u0", "1")).await.unwrap();
    for (name, rv) in [("p1", "1"), ("p2", "1"), ("p3", "1"), ("p1", "2")] {
        a.handle(ev(EventType::Modified, name, &format!("u-{name}"), rv))
            .await
            .unwrap();
    }
    // p0 is in its handler; an event behind it is kept for the same task.
    tokio::time::sleep(Duration::from_millis(10)).await;
    a.handle(ev(EventType::Modified, "p0", "u0", "2")).await.unwrap();
    assert_eq!(a.depth().await, 4);
    assert_eq!(
        a.backlog().await,
        4,
        "p0's second event and the three waiting objects"
    );
    wait_idle(&a).await;
    let seen = rec.seen.lock().await.clone();
    let want: Vec<(String, String)> = [("p0", "1"), ("p0", "2"), ("p1", "2"), ("p2", "1"), ("p3", "1")]
        .iter()
        .map(|(n, r)| (n.to_string(), r.to_string()))
        .collect();
    assert_eq!(seen, want);
    assert!(!*rec.overlapped.lock().await);
    assert_eq!(a.depth().await, 0, "drained objects leave nothing behind");
}

/// Objects named `stuck*` sit out a long delay in [`parked`] (a retry's backoff), the others a
/// short wait on the server in [`idle`]; counts how many are in their handler outside a park.
#[derive(Default)]
struct Parks {
    working: std::sync::atomic::AtomicUsize,
    most_working: std::sync::atomic::AtomicUsize,
    done: Mutex<Vec<String>>,
}

#[async_trait]
impl EventHandler for Parks {
    async fn handle(&self, event: Event) -> Result<(), Error> {
        use std::sync::atomic::Ordering::SeqCst;
        let name = event.object.metadata.name.clone().unwrap_or_default();
        let now = self.working.fetch_add(1, SeqCst) + 1;
        self.most_working.fetch_max(now, SeqCst);
        if name.starts_with("stuck") {
            self.working.fetch_sub(1, SeqCst);
            kuryr_controller::pipeline::parked(tokio::time::sleep(Duration::from_secs(10))).await;
            let now = self.working.fetch_add(1, SeqCst) + 1;
            self.most_working.fetch_max(now, SeqCst);
        }
        kuryr_controller::pipeline::idle(tokio::time::sleep(Duration::from_secs(1))).await;
        self.working.fetch_sub(1, SeqCst);
        self.done.lock().await.push(name);
        Ok(())
    }
    fn name(&self) -> &str {
        "parks"
    }
}

/// A handler sitting out a delay gives its in-flight place to the objects waiting: two objects
/// stuck in a retry's backoff with room for two in flight do not keep four others out. Back
/// from the delay with no place free, a stuck object finishes beyond the bound; after all of it
/// the bound is what it was (neither a place lost nor one gained).
#[tokio::test(start_paused = true)]
async fn parked_objects_give_their_place_to_waiting_ones() {
    use std::sync::atomic::Ordering::SeqCst;
    let p = Arc::new(Parks::default());
    let a = Async::new(p.clone(), 8).with_max_in_flight(2);
    for name in ["stuck-0", "stuck-1", "a", "b", "c", "d"] {
        a.handle(ev(EventType::Added, name, &format!("u-{name}"), "1"))
            .await
            .unwrap();
    }
    // Both stuck objects parked at once: the four others went through two at a time.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        *p.done.lock().await,
        ["a", "b", "c", "d"],
        "the others did not wait for the stuck ones"
    );
    // More objects arrive just before the stuck ones wake, and take both places: the stuck
    // ones finish beyond the bound (two in flight, and the two back from their delay).
    tokio::time::sleep(Duration::from_millis(7300)).await;
    for name in ["e", "f", "g"] {
        a.handle(ev(EventType::Added, name, &format!("u-{name}"), "1"))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        p.working.load(SeqCst),
        4,
        "e and f in their places, both stuck ones beyond"
    );
    wait_idle(&a).await;
    let done = p.done.lock().await.clone();
    assert_eq!(done.len(), 9, "{done:?}");
    assert!(done.iter().any(|n| n == "stuck-0") && done.iter().any(|n| n == "stuck-1"));
    assert_eq!(p.most_working.load(SeqCst), 4);

    // The bound afterwards: five objects, never more than two in their handler at once.
    p.most_working.store(0, SeqCst);
    for i in 0..5 {
        a.handle(ev(
            EventType::Added,
            &format!("after-{i}"),
            &format!("u-after-{i}"),
            "1",
        ))
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(p.working.load(SeqCst), 2, "two places, as before the parks");
    wait_idle(&a).await;
    assert_eq!(p.most_working.load(SeqCst), 2);
    assert_eq!(p.done.lock().await.len(), 14);
}
