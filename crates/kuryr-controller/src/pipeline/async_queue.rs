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
//! of them wait, and a parsed object takes about ten times the bytes of its text.
//!
//! Only objects in flight have a task (at most the in-flight bound); the others wait as a key in
//! a FIFO, taken by the next task that drains its object. A waiting object so costs its key and
//! its compact event, not a task with its future.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use kube::api::{ApiResource, DynamicObject};
use tokio::sync::{Mutex, MutexGuard, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::{Event, EventHandler, EventType};
use crate::error::Error;

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
    fn new(event: Event, must_wait: bool) -> Self {
        if !must_wait {
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
            } => match serde_json::from_str::<DynamicObject>(&json) {
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

/// The worker permit of the object being handled, so that a handler waiting on a timer (Retry's
/// backoff) can give its slot to other objects instead of stalling them: a few dozen pods stuck
/// on quota must not stop every other pod from being wired.
struct WorkerSlot {
    workers: Arc<Semaphore>,
    permit: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
}

tokio::task_local! {
    static WORKER_SLOT: Arc<WorkerSlot>;
}

/// Runs `wait` without holding the Async worker permit of the current object (if any), and takes
/// a permit again before returning. The object's queue stays claimed, so its events stay ordered.
pub async fn idle<F: std::future::Future>(wait: F) -> F::Output {
    let Ok(slot) = WORKER_SLOT.try_with(Arc::clone) else {
        return wait.await;
    };
    // Dropped here, before the wait: that is what frees the slot for another object.
    let released = slot
        .permit
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .is_some();
    let out = wait.await;
    if released {
        // A closed semaphore only happens on shutdown; the handler then finishes without a slot.
        if let Ok(p) = slot.workers.clone().acquire_owned().await {
            *slot.permit.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        }
    }
    out
}

/// How many objects may be in their handler at once, counting those waiting without a slot:
/// enough that hundreds stuck on a full quota leave room for the others, few enough that the
/// handlers' state stays a few MB.
fn max_in_flight(max_concurrency: usize) -> usize {
    max_concurrency.max(1).saturating_mul(16).max(1024)
}

pub struct Async<H> {
    inner: Arc<H>,
    name: String,
    /// The objects' pending events and the ones waiting for a task.
    queues: Queues,
    workers: Arc<Semaphore>,
    /// Objects with a task, also while their handler waits in [`idle`] (without a worker slot):
    /// each holds its handler's state, so this bounds the memory of a burst in which thousands
    /// back off at once. Taken and given back only under the `queues` lock, so an object never
    /// waits in the FIFO while a permit is free.
    in_flight: Arc<Semaphore>,
    stats: Arc<AsyncStats>,
    /// Cancels every queue: a pipeline that stops (shutdown, lost leadership, or its task being
    /// dropped) must not leave handlers running behind the next leader's back.
    stop: CancellationToken,
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
            inner: Arc::new(inner),
            name,
            queues: Arc::default(),
            workers: Arc::new(Semaphore::new(max_concurrency.max(1))),
            in_flight: Arc::new(Semaphore::new(max_in_flight(max_concurrency))),
            stats: Arc::default(),
            stop,
        }
    }

    /// Sets how many objects may be in their handler at once, counting those waiting without a
    /// worker slot (default: 16x the workers, at least 1,024).
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.in_flight = Arc::new(Semaphore::new(n.max(1)));
        self
    }

    pub fn stats(&self) -> Arc<AsyncStats> {
        self.stats.clone()
    }

    /// Objects with a queue right now (being handled or waiting).
    pub async fn depth(&self) -> usize {
        self.queues.lock().await.pending.len()
    }

    /// One in-flight task: drains `key`, then the next waiting object, until none waits. Holds
    /// `in_flight` throughout; gives it back under the lock when nothing waits.
    async fn run_queue(
        key: String,
        in_flight: OwnedSemaphorePermit,
        inner: Arc<H>,
        queues: Queues,
        workers: Arc<Semaphore>,
        stats: Arc<AsyncStats>,
        stop: CancellationToken,
    ) {
        let run = async {
            let mut key = key;
            loop {
                let Some(mut q) = Self::drain(&key, &inner, &queues, &workers, &stats).await else {
                    return;
                };
                // Drained: drop the queue so memory follows live objects only.
                q.pending.remove(&key);
                match q.waiting.pop_front() {
                    Some(next) => key = next,
                    None => {
                        drop(in_flight);
                        return;
                    }
                }
            }
        };
        tokio::select! {
            _ = stop.cancelled() => {
                let mut q = queues.lock().await;
                q.pending.clear();
                q.waiting.clear();
            }
            _ = run => {}
        }
    }

    /// Handles `key`'s events until none is pending, and returns the lock under which it found
    /// none (so that no event can slip in between that and the key's removal); `None` on
    /// shutdown.
    async fn drain<'q>(
        key: &str,
        inner: &Arc<H>,
        queues: &'q Queues,
        workers: &Arc<Semaphore>,
        stats: &AsyncStats,
    ) -> Option<MutexGuard<'q, QueueState>> {
        loop {
            // The slot first, then the event: while this waits, a newer event for the object
            // still replaces the pending one, and the pending one stays compact. A closed
            // semaphore only happens on shutdown; stop quietly then.
            let permit = workers.clone().acquire_owned().await.ok()?;
            let pending = {
                let mut q = queues.lock().await;
                match q.pending.get_mut(key).and_then(Option::take) {
                    Some(p) => p,
                    None => return Some(q),
                }
            };
            let Some(event) = pending.into_event() else {
                continue;
            };
            let slot = Arc::new(WorkerSlot {
                workers: workers.clone(),
                permit: std::sync::Mutex::new(Some(permit)),
            });
            // LogExceptions wrappers below us normally swallow errors; one reaching here is logged
            // rather than lost.
            if let Err(e) = WORKER_SLOT.scope(slot, inner.handle(event)).await {
                tracing::error!(queue = %key, error = %e, "unhandled pipeline error");
            }
            stats.handled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[async_trait]
impl<H: EventHandler + 'static> EventHandler for Async<H> {
    async fn handle(&self, mut event: Event) -> Result<(), Error> {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        let key = event.group_key();
        let mut guard = self.queues.lock().await;
        let q = &mut *guard;
        match q.pending.get_mut(&key) {
            Some(pending) => {
                if let Some(old) = pending.take() {
                    // A re-send it replaces still asks for a full pass.
                    event.resync |= old.resync();
                    tracing::trace!(queue = %key, dropped = old.event_type().as_str(), "coalesced stale event");
                    self.stats.coalesced.fetch_add(1, Ordering::Relaxed);
                }
                // Behind a running handler (or a slot): it waits either way.
                *pending = Some(Pending::new(event, true));
            }
            None => match self.in_flight.clone().try_acquire_owned() {
                Ok(in_flight) => {
                    let must_wait = self.workers.available_permits() == 0;
                    q.pending
                        .insert(key.clone(), Some(Pending::new(event, must_wait)));
                    tokio::spawn(Self::run_queue(
                        key,
                        in_flight,
                        self.inner.clone(),
                        self.queues.clone(),
                        self.workers.clone(),
                        self.stats.clone(),
                        self.stop.clone(),
                    ));
                }
                Err(_) => {
                    q.pending.insert(key.clone(), Some(Pending::new(event, true)));
                    q.waiting.push_back(key);
                }
            },
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
        self.queues
            .lock()
            .await
            .pending
            .values()
            .filter(|p| p.is_some())
            .count()
    }
}
