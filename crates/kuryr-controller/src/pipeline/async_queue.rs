//! The Async handler: events of one object strictly in order, different objects concurrently.
//!
//! Each object gets a queue on demand, dropped once drained. Because every handler is level-based
//! (it acts on the object's current state, not on the diff), a queue holds at most ONE pending event:
//! a newer event for the same object replaces the pending one ("stale events coalesced"). Memory is
//! therefore bounded by the number of live objects, not by the event rate.
//!
//! An object's event is taken from its queue only once a worker slot is free, so an event that
//! arrives meanwhile still replaces it; and an event that has to wait for a slot is kept as
//! compact JSON, parsed again when a worker takes it. In a burst of ten thousand pods nearly all
//! of them wait, and a parsed object takes about ten times the bytes of its text. The first
//! [`PARSED_WAITING`] waiting events stay parsed: in a burst of a few hundred pods that is most of
//! them, and their round trip through text was 7% of the controller's instructions.
//!
//! Only objects in flight have a task (at most the in-flight bound); the others wait as a key in
//! a FIFO, taken by the next task that drains its object. A waiting object so costs its key and
//! its compact event, not a task with its future.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use kube::api::ApiResource;
use tokio::sync::{Mutex, MutexGuard, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::{Event, EventHandler, EventType};
use crate::error::Error;
use crate::locked::Locked;

/// Counters exposed as metrics.
#[derive(Debug, Default)]
pub struct AsyncStats {
    pub received: AtomicU64,
    pub coalesced: AtomicU64,
    pub handled: AtomicU64,
}

type Queues = Arc<Mutex<QueueState>>;

#[derive(Default)]
struct QueueState {
    /// object key -> its newest unhandled event; the key exists while the object is waiting or
    /// in flight.
    pending: HashMap<String, Option<Pending>>,
    /// Objects with an event and no task, in arrival order.
    waiting: VecDeque<String>,
    /// How many of the pending events are kept parsed.
    parsed: usize,
}

/// How many pending events may wait parsed: a few MB of objects at most (a parsed pod is about
/// 10 KB), against the serializing and parsing again of every one that waits.
const PARSED_WAITING: usize = 128;

impl QueueState {
    /// Stores `event` as `key`'s pending one (the caller took any earlier one), parsed unless it
    /// must wait and the parsed ones are at their budget.
    fn put(&mut self, key: &str, event: Event, must_wait: bool) {
        let pending = Pending::new(event, must_wait && self.parsed >= PARSED_WAITING);
        if matches!(pending, Pending::Parsed(_)) {
            self.parsed += 1;
        }
        match self.pending.get_mut(key) {
            Some(slot) => {
                debug_assert!(
                    slot.is_none(),
                    "an earlier event is taken before a newer one is put"
                );
                *slot = Some(pending);
            }
            None => {
                self.pending.insert(key.to_string(), Some(pending));
            }
        }
    }

    /// Takes `key`'s pending event, if any.
    fn take(&mut self, key: &str) -> Option<Pending> {
        let taken = self.pending.get_mut(key).and_then(Option::take);
        if matches!(taken, Some(Pending::Parsed(_))) {
            self.parsed -= 1;
        }
        taken
    }

    fn clear(&mut self) {
        self.pending.clear();
        self.waiting.clear();
        self.parsed = 0;
    }
}

/// An object's newest unhandled event.
enum Pending {
    /// A worker slot was free when it arrived: handed on as it is.
    Parsed(Event),
    /// It has to wait for a slot: kept as text.
    Compact {
        event_type: EventType,
        resource: Arc<ApiResource>,
        resync: bool,
        json: Box<str>,
    },
}

impl Pending {
    fn new(event: Event, compact: bool) -> Self {
        if !compact {
            return Self::Parsed(event);
        }
        // A DynamicObject (string keys, JSON values) always serializes; if it somehow did not,
        // the event is kept parsed rather than lost.
        match serde_json::to_string(&*event.object) {
            Ok(json) => Self::Compact {
                event_type: event.event_type,
                resource: event.resource,
                resync: event.resync,
                json: json.into_boxed_str(),
            },
            Err(_) => Self::Parsed(event),
        }
    }

    fn event_type(&self) -> EventType {
        match self {
            Self::Parsed(e) => e.event_type,
            Self::Compact { event_type, .. } => *event_type,
        }
    }

    fn resync(&self) -> bool {
        match self {
            Self::Parsed(e) => e.resync,
            Self::Compact { resync, .. } => *resync,
        }
    }

    fn into_event(self) -> Option<Event> {
        match self {
            Self::Parsed(e) => Some(e),
            Self::Compact {
                event_type,
                resource,
                resync,
                json,
            } => match super::watched::from_str(&json) {
                Ok(obj) => Some(Event {
                    resync,
                    ..Event::new(event_type, resource, obj)
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "a queued object does not parse back; skipped");
                    None
                }
            },
        }
    }
}

/// What an object's task holds, so that its handler can give some of it up while it waits: the
/// worker slot whenever it waits ([`idle`]), and also its in-flight place while it only sits out
/// a delay ([`parked`]).
struct Slots {
    workers: Arc<Semaphore>,
    worker: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
    /// The task's in-flight place; `None` while parked, and after a park that found no place
    /// free on waking (the task then ends with the object it is draining).
    place: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
    queue: Arc<dyn Places>,
}

impl Slots {
    fn take<T>(slot: &std::sync::Mutex<Option<T>>) -> Option<T> {
        slot.locked().take()
    }

    fn put<T>(slot: &std::sync::Mutex<Option<T>>, value: T) {
        *slot.locked() = Some(value);
    }
}

/// The queue's side of a park: an in-flight place handed on, or taken back.
trait Places: Send + Sync {
    /// Gives `place` to the first waiting object (a new task), or back if none waits.
    fn hand_on(self: Arc<Self>, place: OwnedSemaphorePermit) -> futures::future::BoxFuture<'static, ()>;
    /// A free in-flight place, if there is one.
    fn try_take(&self) -> Option<OwnedSemaphorePermit>;
}

tokio::task_local! {
    static SLOTS: Arc<Slots>;
}

/// Runs `wait` without holding the Async worker slot of the current object (if any), and takes
/// one again before returning. The object keeps its in-flight place and its queue, so its events
/// stay ordered and the handler state it holds stays within the in-flight bound.
pub async fn idle<F: std::future::Future>(wait: F) -> F::Output {
    let Ok(slots) = SLOTS.try_with(Arc::clone) else {
        return wait.await;
    };
    // Dropped here, before the wait: that is what frees the slot for another object.
    let released = Slots::take(&slots.worker).is_some();
    let out = wait.await;
    if released {
        // A closed semaphore only happens on shutdown; the handler then finishes without a slot.
        if let Ok(p) = slots.workers.clone().acquire_owned().await {
            Slots::put(&slots.worker, p);
        }
    }
    out
}

/// Like [`idle`], for a wait that is only a delay (a retry's backoff, a load balancer being
/// built): the object's in-flight place goes to the first waiting object meanwhile. An object
/// sitting out a delay holds little, and hundreds of them (pods of a project whose quota is
/// full) must not keep every other object out of its handler. On waking the handler takes a free
/// place if there is one, and otherwise goes on beyond the bound until the object's events are
/// drained: so the bound may be exceeded by objects back from a delay, never by new ones.
pub async fn parked<F: std::future::Future>(wait: F) -> F::Output {
    let Ok(slots) = SLOTS.try_with(Arc::clone) else {
        return wait.await;
    };
    let had_place = match Slots::take(&slots.place) {
        Some(place) => {
            slots.queue.clone().hand_on(place).await;
            true
        }
        None => false,
    };
    let out = idle(wait).await;
    if had_place && let Some(place) = slots.queue.try_take() {
        Slots::put(&slots.place, place);
    }
    out
}

/// How many objects may be in their handler at once, counting those waiting on the server
/// without a worker slot (a port becoming ACTIVE), not those parked: enough to keep the server
/// busy and its waits batched, few enough that a burst's handler state stays a few MB (a pod
/// waiting for its port holds about 10 KB). An object beyond the bound waits for a place until
/// one of those in flight is done, ACTIVE wait included: at 256 the last 44 pods of a 300-pod
/// burst started only once the first ports were up, and the burst wired 10% slower
/// (docs/benchmarks.md).
fn max_in_flight(max_concurrency: usize) -> usize {
    max_concurrency.max(1).saturating_mul(8).max(512)
}

/// What every task of one [`Async`] shares.
struct Shared<H> {
    inner: Arc<H>,
    /// The objects' pending events and the ones waiting for a task.
    queues: Queues,
    workers: Arc<Semaphore>,
    /// Objects with a task, also while their handler waits in [`idle`] (without a worker slot):
    /// each holds its handler's state, so this bounds the memory of a burst. Given back only
    /// under the `queues` lock, so an object never waits in the FIFO while a place is free.
    in_flight: Arc<Semaphore>,
    stats: Arc<AsyncStats>,
    /// Cancels every queue: a pipeline that stops (shutdown, lost leadership, or its task being
    /// dropped) must not leave handlers running behind the next leader's back.
    stop: CancellationToken,
}

impl<H: EventHandler + 'static> Places for Shared<H> {
    fn hand_on(self: Arc<Self>, place: OwnedSemaphorePermit) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut q = self.queues.lock().await;
            match q.waiting.pop_front() {
                Some(next) => self.spawn(next, place),
                // Given back under the lock: nothing waits.
                None => drop(place),
            }
        })
    }

    fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.in_flight.clone().try_acquire_owned().ok()
    }
}

impl<H: EventHandler + 'static> Shared<H> {
    fn spawn(self: &Arc<Self>, key: String, place: OwnedSemaphorePermit) {
        tokio::spawn(self.clone().run_queue(key, place));
    }

    /// One in-flight task: drains `key`, then the next waiting object, until none waits or the
    /// task has no place any more (see [`parked`]). Gives its place back under the lock when
    /// nothing waits.
    async fn run_queue(self: Arc<Self>, key: String, place: OwnedSemaphorePermit) {
        let queue: Arc<dyn Places> = self.clone();
        let slots = Arc::new(Slots {
            workers: self.workers.clone(),
            worker: std::sync::Mutex::new(None),
            place: std::sync::Mutex::new(Some(place)),
            queue,
        });
        let run = async {
            let mut key = key;
            loop {
                let Some(mut q) = self.drain(&key, &slots).await else {
                    return;
                };
                // Drained: drop the queue so memory follows live objects only.
                q.pending.remove(&key);
                let Some(place) = Slots::take(&slots.place) else {
                    // Back from a park beyond the bound: this task ends here.
                    return;
                };
                match q.waiting.pop_front() {
                    Some(next) => {
                        key = next;
                        Slots::put(&slots.place, place);
                    }
                    None => {
                        drop(place);
                        return;
                    }
                }
            }
        };
        tokio::select! {
            _ = self.stop.cancelled() => {
                self.queues.lock().await.clear();
            }
            _ = run => {}
        }
    }

    /// Handles `key`'s events until none is pending, and returns the lock under which it found
    /// none (so that no event can slip in between that and the key's removal); `None` on
    /// shutdown.
    async fn drain(&self, key: &str, slots: &Arc<Slots>) -> Option<MutexGuard<'_, QueueState>> {
        loop {
            // The slot first, then the event: while this waits, a newer event for the object
            // still replaces the pending one, and the pending one stays compact. A closed
            // semaphore only happens on shutdown; stop quietly then.
            let permit = self.workers.clone().acquire_owned().await.ok()?;
            let pending = {
                let mut q = self.queues.lock().await;
                match q.take(key) {
                    Some(p) => p,
                    None => return Some(q),
                }
            };
            let Some(event) = pending.into_event() else {
                continue;
            };
            Slots::put(&slots.worker, permit);
            // LogExceptions wrappers below us normally swallow errors; one reaching here is logged
            // rather than lost.
            if let Err(e) = SLOTS.scope(slots.clone(), self.inner.handle(event)).await {
                tracing::error!(queue = %key, error = %e, "unhandled pipeline error");
            }
            drop(Slots::take(&slots.worker));
            self.stats.handled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

pub struct Async<H> {
    shared: Arc<Shared<H>>,
    name: String,
}

impl<H: EventHandler + 'static> Async<H> {
    /// `max_concurrency` bounds how many objects are handled at once.
    pub fn new(inner: H, max_concurrency: usize) -> Self {
        Self::with_stop(inner, max_concurrency, CancellationToken::new())
    }

    /// Like [`Async::new`]; cancelling `stop` ends every queue, dropping in-flight handlers at
    /// their next await point.
    pub fn with_stop(inner: H, max_concurrency: usize, stop: CancellationToken) -> Self {
        let name = format!("async({})", inner.name());
        Self {
            shared: Arc::new(Shared {
                inner: Arc::new(inner),
                queues: Arc::default(),
                workers: Arc::new(Semaphore::new(max_concurrency.max(1))),
                in_flight: Arc::new(Semaphore::new(max_in_flight(max_concurrency))),
                stats: Arc::default(),
                stop,
            }),
            name,
        }
    }

    /// Sets how many objects may be in their handler at once, counting those waiting without a
    /// worker slot (default: 8x the workers, at least 512). Only before the first event.
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.in_flight = Arc::new(Semaphore::new(n.max(1)));
        }
        self
    }

    pub fn stats(&self) -> Arc<AsyncStats> {
        self.shared.stats.clone()
    }

    /// Objects with a queue right now (being handled or waiting).
    pub async fn depth(&self) -> usize {
        self.shared.queues.lock().await.pending.len()
    }
}

#[async_trait]
impl<H: EventHandler + 'static> EventHandler for Async<H> {
    async fn handle(&self, mut event: Event) -> Result<(), Error> {
        let shared = &self.shared;
        shared.stats.received.fetch_add(1, Ordering::Relaxed);
        let key = event.group_key();
        let mut guard = shared.queues.lock().await;
        let q = &mut *guard;
        if q.pending.contains_key(&key) {
            // A re-send it replaces still asks for a full pass.
            if let Some(old) = q.take(&key) {
                event.resync |= old.resync();
                tracing::trace!(queue = %key, dropped = old.event_type().as_str(), "coalesced stale event");
                shared.stats.coalesced.fetch_add(1, Ordering::Relaxed);
            }
            // Behind a running handler (or a slot): it waits either way.
            q.put(&key, event, true);
            return Ok(());
        }
        match shared.in_flight.clone().try_acquire_owned() {
            Ok(place) => {
                let must_wait = shared.workers.available_permits() == 0;
                q.put(&key, event, must_wait);
                shared.spawn(key, place);
            }
            Err(_) => {
                // Beyond the bound: a burst of thousands waits here, always as text.
                q.pending.insert(key.clone(), Some(Pending::new(event, true)));
                q.waiting.push_back(key);
            }
        }
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }

    /// Objects waiting for a worker (an event queued behind a running one or waiting for a
    /// slot): not the ones being handled (a handler waiting out its retry backoff holds no queued
    /// event), so a few hundred objects retrying on a full quota do not hold the watcher's
    /// re-send back.
    async fn backlog(&self) -> usize {
        self.shared
            .queues
            .lock()
            .await
            .pending
            .values()
            .filter(|p| p.is_some())
            .count()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DynamicObject, ObjectMeta};

    use super::*;

    fn event(name: &str) -> Event {
        let obj = DynamicObject {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            data: serde_json::json!({"spec": {"nodeName": "n1"}}),
        };
        Event::new(EventType::Added, Arc::new(ApiResource::erase::<Pod>(&())), obj)
    }

    fn compact(q: &QueueState) -> usize {
        q.pending
            .values()
            .filter(|p| matches!(p, Some(Pending::Compact { .. })))
            .count()
    }

    #[test]
    fn waiting_events_stay_parsed_up_to_the_budget_then_wait_as_text() {
        let mut q = QueueState::default();
        let n = PARSED_WAITING + 5;
        for i in 0..n {
            q.put(&format!("k{i}"), event(&format!("p{i}")), true);
        }
        assert_eq!(q.parsed, PARSED_WAITING);
        assert_eq!(compact(&q), 5);
        // One that need not wait is handed on parsed whatever the budget.
        q.put("free", event("free"), false);
        assert_eq!(q.parsed, PARSED_WAITING + 1);

        // A newer event replacing a parsed one frees its share, and (the budget being full)
        // waits as text; taking a parsed one frees its share.
        let old = q.take("k0");
        assert!(matches!(old, Some(Pending::Parsed(_))));
        q.put("k0", event("p0-newer"), true);
        assert_eq!(q.parsed, PARSED_WAITING);
        assert_eq!(compact(&q), 6);
        for (key, name) in [("free", "free"), ("k0", "p0-newer"), ("k1", "p1")] {
            let e = q.take(key).and_then(Pending::into_event).unwrap();
            assert_eq!(e.object.metadata.name.as_deref(), Some(name));
        }
        assert_eq!(q.parsed, PARSED_WAITING - 2);
        // The compact ones parse back to the same object.
        let back = q
            .take(&format!("k{}", n - 1))
            .and_then(Pending::into_event)
            .unwrap();
        assert_eq!(
            back.object.metadata.name.as_deref(),
            Some(format!("p{}", n - 1).as_str())
        );
        assert_eq!(back.object.data["spec"]["nodeName"], "n1");
        assert_eq!(q.parsed, PARSED_WAITING - 2, "a compact one is not counted");
        // Now under the budget: the next waiting event is kept parsed.
        q.put("late", event("late"), true);
        assert_eq!(q.parsed, PARSED_WAITING - 1);
        q.clear();
        assert_eq!(q.parsed, 0);
        assert!(q.pending.is_empty());
    }
}
