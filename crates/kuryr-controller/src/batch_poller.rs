//! Waiting for many OpenStack objects to settle, with one list call per poll for all of them.
//!
//! Each waiter registers a key with a [`BatchPoller`]; one background task asks the [`StatusSource`]
//! about every pending key at once (chunked so that URLs stay short) and wakes the waiters whose key
//! settled. A burst of N objects costs one list call per poll instead of N reads per retry round, and
//! a waiter learns its object settled within one poll interval instead of after a growing backoff.
//! Used for ports turning ACTIVE (`drivers::vif::active`) and load balancers leaving PENDING_*
//! (`services::provisioning`).
//!
//! The interval adapts ([`next_interval`]): short while keys keep settling or new ones arrive,
//! doubling while nothing changes, and never shorter than what a poll costs the server (its list
//! calls, each at the shortest time of the recent calls: the chunks of one poll are asked at once),
//! so a slow server is not asked more often than it answers. Not the last poll's time: on a
//! server whose workers take requests in turn, that is mostly the wait behind this controller's
//! other requests (port creates), and waiting as long again before the next poll doubled the wait
//! for ACTIVE of every port in a burst (docs/benchmarks.md).

use std::collections::HashMap;
use std::fmt::Display;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::locked::Locked;
use async_trait::async_trait;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// How often and in what batches the pending keys are checked.
#[derive(Clone, Copy, Debug)]
pub struct PollSettings {
    /// Interval while keys are settling (and right after a new key is registered).
    pub min: Duration,
    /// Interval after a long time without change.
    pub max: Duration,
    /// Keys per list call (the source's request must stay short: see
    /// [`crate::drivers::vif::IDS_PER_LIST`]).
    pub chunk: usize,
    /// How long one wait lasts before the waiter gives up.
    pub wait: Duration,
    /// Whether a waiter gives up its in-flight place in the pipeline while it waits
    /// ([`crate::pipeline::parked`]): for long waits on objects that hold little (load balancers
    /// take minutes), not for ports, whose waits the in-flight bound is there to keep few.
    pub parks: bool,
}

impl Default for PollSettings {
    /// `min` is a latency floor, not a request rate: the wait before a poll is never shorter
    /// than the last poll's calls took together, so a server answering in 50 ms is asked at most every 100 ms,
    /// one list call at a time. At 100 ms every pod of a burst against an instant Neutron waited
    /// about a poll for its port; at 20 ms the same burst wires about a third faster
    /// (docs/benchmarks.md).
    fn default() -> Self {
        Self {
            min: Duration::from_millis(20),
            max: Duration::from_secs(2),
            chunk: crate::drivers::vif::IDS_PER_LIST,
            wait: Duration::from_secs(20),
            parks: false,
        }
    }
}

/// The interval before the next poll: `min` when the last poll made progress (a key settled, or new
/// keys are waiting), otherwise double the current one up to `max`; never shorter than a poll
/// costs (`poll_cost`: its calls at the shortest recent call time).
pub fn next_interval(current: Duration, progressed: bool, poll_cost: Duration, s: &PollSettings) -> Duration {
    let base = if progressed {
        s.min
    } else {
        current.saturating_mul(2).clamp(s.min, s.max)
    };
    base.max(floor(poll_cost, s))
}

/// The shortest wait before the next poll: `min`, and never less than a poll costs (up to `max`), so
/// a slow server is not asked faster than it answers.
fn floor(poll_cost: Duration, s: &PollSettings) -> Duration {
    s.min.max(poll_cost.min(s.max))
}

/// Calls whose times are remembered; the shortest of them is what a call costs.
const CALLS_REMEMBERED: usize = 16;

/// The recent successful list calls' times.
#[derive(Default)]
struct CallTimes(std::collections::VecDeque<Duration>);

impl CallTimes {
    fn push(&mut self, took: Duration) {
        if self.0.len() == CALLS_REMEMBERED {
            self.0.pop_front();
        }
        self.0.push_back(took);
    }

    /// What a poll of `calls` list calls costs the server: the shortest recent call (its own
    /// cost, with the least queueing) for each.
    fn cost(&self, calls: usize) -> Duration {
        let call = self.0.iter().copied().min().unwrap_or_default();
        call.saturating_mul(u32::try_from(calls).unwrap_or(u32::MAX))
    }
}

/// What one poll asks of the server.
#[async_trait]
pub trait StatusSource: Send + Sync + 'static {
    /// What a waiter waits for (an object id, possibly with the state it waits for).
    type Key: Clone + Eq + Hash + Send + Sync + 'static;
    /// What a settled key tells its waiters.
    type Outcome: Clone + Send + 'static;
    type Error: Display + Send;

    /// One batched look at `keys`: the ones that settled, with their outcome. Keys not returned keep
    /// waiting.
    async fn poll(&self, keys: &[Self::Key]) -> Result<Vec<(Self::Key, Self::Outcome)>, Self::Error>;
}

/// Why a wait ended without an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// Not settled within [`PollSettings::wait`].
    TimedOut(Duration),
}

struct Pending<K, O> {
    waiters: HashMap<K, Vec<oneshot::Sender<O>>>,
    /// Keys registered since the last poll (the interval resets for them).
    fresh: bool,
    running: bool,
}

struct Inner<S: StatusSource> {
    source: S,
    settings: PollSettings,
    pending: Mutex<Pending<S::Key, S::Outcome>>,
    wake: Notify,
}

/// The shared waits on one source (one deployment's Neutron or Octavia).
pub struct BatchPoller<S: StatusSource> {
    inner: Arc<Inner<S>>,
}

impl<S: StatusSource> Clone for BatchPoller<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S: StatusSource> BatchPoller<S> {
    pub fn new(source: S, settings: PollSettings) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                settings,
                pending: Mutex::new(Pending {
                    waiters: HashMap::new(),
                    fresh: false,
                    running: false,
                }),
                wake: Notify::new(),
            }),
        }
    }

    pub fn settings(&self) -> PollSettings {
        self.inner.settings
    }

    pub fn source(&self) -> &S {
        &self.inner.source
    }

    /// Keys currently waited for.
    pub fn pending(&self) -> usize {
        self.inner.lock().waiters.len()
    }

    /// Waits until `key` settles; gives up after the settings' `wait`. The worker slot of the handler
    /// waiting goes to other objects meanwhile.
    pub async fn wait(&self, key: S::Key) -> Result<S::Outcome, WaitEnd> {
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.inner.lock();
            p.waiters.entry(key.clone()).or_default().push(tx);
            p.fresh = true;
            if !p.running {
                p.running = true;
                let inner = self.inner.clone();
                tokio::spawn(async move { inner.run().await });
            }
        }
        // Wakes a poller in a long idle interval; during a burst the permit is simply kept.
        self.inner.wake.notify_one();
        let wait = self.inner.settings.wait;
        let settled = tokio::time::timeout(wait, rx);
        let settled = if self.inner.settings.parks {
            crate::pipeline::parked(settled).await
        } else {
            crate::pipeline::idle(settled).await
        };
        match settled {
            Ok(Ok(outcome)) => Ok(outcome),
            // The poller stopped (shutdown) or the wait timed out.
            Ok(Err(_)) | Err(_) => {
                self.inner.forget_closed(&key);
                Err(WaitEnd::TimedOut(wait))
            }
        }
    }
}

impl<S: StatusSource> Inner<S> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending<S::Key, S::Outcome>> {
        self.pending.locked()
    }

    /// Drops waiters that gave up, so their keys are no longer asked about.
    fn forget_closed(&self, key: &S::Key) {
        let mut p = self.lock();
        if let Some(w) = p.waiters.get_mut(key) {
            w.retain(|tx| !tx.is_closed());
            if w.is_empty() {
                p.waiters.remove(key);
            }
        }
    }

    async fn run(self: Arc<Self>) {
        let s = self.settings;
        let mut interval = s.min;
        let mut call_times = CallTimes::default();
        let mut poll_cost = Duration::ZERO;
        loop {
            // A new object does not settle the instant it is made: it gets at least `min`. A key
            // registered during a long (idle) interval cuts it short to `min` from then - but not
            // to less than a poll costs: in a burst every registration wakes this task, and
            // a slow server must not be asked faster than it answers.
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = self.wake.notified() => tokio::time::sleep(floor(poll_cost, &s)).await,
            }
            let keys: Vec<S::Key> = {
                let mut p = self.lock();
                p.waiters.retain(|_, w| {
                    w.retain(|tx| !tx.is_closed());
                    !w.is_empty()
                });
                if p.waiters.is_empty() {
                    // Nothing to wait for: the next registration starts a new task.
                    p.running = false;
                    return;
                }
                p.fresh = false;
                p.waiters.keys().cloned().collect()
            };
            // The chunks are asked at once: a burst's few hundred keys are answered in one
            // round trip instead of one per chunk, and each waiter learns of its key that much
            // sooner. The floor stays the sum of the calls' times, what the server spent on the
            // poll: asking at once must not make a slow server be asked more often.
            let this = &*self;
            let calls = keys.chunks(s.chunk.max(1)).map(|chunk| async move {
                let started = Instant::now();
                let answer = this.source.poll(chunk).await;
                let took = started.elapsed();
                let mut settled = false;
                let ok = answer.is_ok();
                match answer {
                    Ok(done) => {
                        settled = !done.is_empty();
                        let mut p = this.lock();
                        for (key, outcome) in done {
                            for tx in p.waiters.remove(&key).unwrap_or_default() {
                                let _ = tx.send(outcome.clone());
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, keys = chunk.len(), "status poll failed; retrying");
                    }
                }
                (settled, took, ok)
            });
            let answers = futures::future::join_all(calls).await;
            let progressed = answers.iter().any(|(settled, _, _)| *settled);
            let took: Duration = answers.iter().map(|(_, took, _)| *took).sum();
            for (_, t, _) in answers.iter().filter(|(_, _, ok)| *ok) {
                call_times.push(*t);
            }
            poll_cost = call_times.cost(answers.len());
            let fresh = self.lock().fresh;
            interval = next_interval(interval, progressed || fresh, poll_cost, &s);
            tracing::debug!(
                keys = keys.len(),
                calls = answers.len(),
                took_ms = took.as_millis() as u64,
                next_ms = interval.as_millis() as u64,
                "status poll"
            );
        }
    }
}

/// One poller per deployment, made on first use.
pub struct BatchPollers<S: StatusSource> {
    settings: PollSettings,
    by_deployment: Mutex<HashMap<String, BatchPoller<S>>>,
}

impl<S: StatusSource> BatchPollers<S> {
    pub fn new(settings: PollSettings) -> Self {
        Self {
            settings,
            by_deployment: Mutex::new(HashMap::new()),
        }
    }

    /// The poller of `deployment`; `source` makes its source the first time.
    pub fn get<E>(
        &self,
        deployment: &str,
        source: impl FnOnce() -> Result<S, E>,
    ) -> Result<BatchPoller<S>, E> {
        let mut map = self.by_deployment.locked();
        if let Some(p) = map.get(deployment) {
            return Ok(p.clone());
        }
        let poller = BatchPoller::new(source()?, self.settings);
        map.insert(deployment.to_string(), poller.clone());
        Ok(poller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s() -> PollSettings {
        PollSettings {
            min: Duration::from_millis(100),
            max: Duration::from_secs(2),
            chunk: 80,
            wait: Duration::from_secs(20),
            parks: false,
        }
    }

    #[test]
    fn interval_is_short_while_keys_settle() {
        let i = next_interval(Duration::from_secs(1), true, Duration::from_millis(10), &s());
        assert_eq!(i, Duration::from_millis(100));
    }

    #[test]
    fn interval_doubles_up_to_max_while_nothing_changes() {
        let mut i = s().min;
        let mut seen = vec![];
        for _ in 0..8 {
            i = next_interval(i, false, Duration::from_millis(5), &s());
            seen.push(i.as_millis());
        }
        assert_eq!(seen, vec![200, 400, 800, 1600, 2000, 2000, 2000, 2000]);
    }

    #[test]
    fn interval_is_never_shorter_than_a_poll_costs() {
        let i = next_interval(Duration::from_millis(100), true, Duration::from_millis(700), &s());
        assert_eq!(i, Duration::from_millis(700));
        // ... but a hung call does not push it past max.
        let i = next_interval(Duration::from_millis(100), true, Duration::from_secs(30), &s());
        assert_eq!(i, Duration::from_secs(2));
    }

    /// What a test source recorded so far.
    fn snapshot<T: Clone>(m: &Mutex<Vec<T>>) -> Vec<T> {
        m.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Settles key k on poll number k; counts polls and the keys each saw.
    struct Countdown {
        polls: Mutex<Vec<usize>>,
    }

    #[async_trait]
    impl StatusSource for Countdown {
        type Key = u32;
        type Outcome = u32;
        type Error = String;
        async fn poll(&self, keys: &[u32]) -> Result<Vec<(u32, u32)>, String> {
            let mut polls = self.polls.locked();
            polls.push(keys.len());
            let n = u32::try_from(polls.len()).unwrap_or(u32::MAX);
            Ok(keys.iter().filter(|k| **k <= n).map(|k| (*k, k * 10)).collect())
        }
    }

    #[tokio::test]
    async fn waiters_share_polls_and_each_is_woken_when_its_key_settles() {
        let poller = BatchPoller::new(
            Countdown {
                polls: Mutex::new(Vec::new()),
            },
            PollSettings {
                min: Duration::from_millis(5),
                max: Duration::from_millis(20),
                ..s()
            },
        );
        let waits: Vec<_> = (1..=3u32)
            .map(|k| {
                let p = poller.clone();
                tokio::spawn(async move { p.wait(k).await })
            })
            .collect();
        for (k, w) in (1..=3u32).zip(waits) {
            assert_eq!(w.await.ok(), Some(Ok(k * 10)));
        }
        let polls = snapshot(&poller.source().polls);
        // One call per poll for every pending key; settled keys drop out.
        assert_eq!(polls, vec![3, 2, 1]);
        assert_eq!(poller.pending(), 0);
    }

    /// In a burst every new key wakes the poller; that must not make it ask a slow server more
    /// often than it answers: a poll starts at least poll time + max(min, poll cost) after the
    /// previous one.
    fn slow_poller(chunk: usize) -> BatchPoller<Scripted> {
        BatchPoller::new(
            scripted(vec![]),
            PollSettings {
                min: Duration::from_millis(20),
                chunk,
                wait: Duration::from_secs(5),
                ..s()
            },
        )
    }

    #[tokio::test(start_paused = true)]
    async fn new_keys_in_a_burst_do_not_poll_a_slow_server_faster_than_it_answers() {
        // One call per poll, so that the gaps below are between polls.
        let poller = slow_poller(1000);
        let mut waits = Vec::new();
        for k in 0..200u32 {
            let p = poller.clone();
            waits.push(tokio::spawn(async move { p.wait(k).await }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = snapshot(&poller.source().started);
        assert!(started.len() >= 3, "polls: {}", started.len());
        for pair in started.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(gap >= Duration::from_millis(400), "polls {gap:?} apart");
        }
        for w in waits {
            w.abort();
        }
    }

    /// The chunks of one poll are asked at once; the next poll waits what they took together.
    #[tokio::test(start_paused = true)]
    async fn a_polls_chunks_are_asked_at_once_and_their_time_summed() {
        let poller = slow_poller(10);
        let mut waits = Vec::new();
        for k in 0..30u32 {
            let p = poller.clone();
            waits.push(tokio::spawn(async move { p.wait(k).await }));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = snapshot(&poller.source().started);
        assert!(started.len() >= 6, "calls: {}", started.len());
        assert!(
            started[1] == started[0] && started[2] == started[0],
            "the three chunks of the first poll start together: {started:?}"
        );
        // 200 ms for the poll, then at least the 3 x 200 ms its calls took.
        let gap = started[3] - started[0];
        assert!(gap >= Duration::from_millis(800), "next poll after {gap:?}");
        assert!(started[4] == started[3] && started[5] == started[3]);
        for w in waits {
            w.abort();
        }
    }

    /// Answers each call after the next of `delays` (ms), then after 200 ms; never settles
    /// anything; records when each call started and ended.
    struct Scripted {
        delays: Mutex<Vec<u64>>,
        started: Mutex<Vec<Instant>>,
        ended: Mutex<Vec<Instant>>,
    }

    #[async_trait]
    impl StatusSource for Scripted {
        type Key = u32;
        type Outcome = ();
        type Error = String;
        async fn poll(&self, _keys: &[u32]) -> Result<Vec<(u32, ())>, String> {
            self.started.locked().push(Instant::now());
            let delay = {
                let mut d = self.delays.locked();
                if d.is_empty() { 200 } else { d.remove(0) }
            };
            tokio::time::sleep(Duration::from_millis(delay)).await;
            self.ended.locked().push(Instant::now());
            Ok(vec![])
        }
    }

    /// A poll that took long because it queued behind other requests at the server does not hold
    /// back the next one by as long again: the floor is what a poll costs (the shortest recent
    /// call).
    #[tokio::test(start_paused = true)]
    async fn a_poll_that_queued_does_not_space_out_the_next() {
        let poller = BatchPoller::new(
            scripted(vec![200, 1500, 200]),
            PollSettings {
                min: Duration::from_millis(20),
                wait: Duration::from_secs(10),
                ..s()
            },
        );
        let p = poller.clone();
        let wait = tokio::spawn(async move { p.wait(1).await });
        tokio::time::sleep(Duration::from_secs(3)).await;
        let started = snapshot(&poller.source().started);
        let ended = snapshot(&poller.source().ended);
        assert!(started.len() >= 3, "polls: {}", started.len());
        // After the first poll (200 ms) the next waits at least that.
        assert!(started[1] - ended[0] >= Duration::from_millis(200));
        // After the 1.5 s one: its own doubling interval (400 ms), not another 1.5 s.
        let gap = started[2] - ended[1];
        assert!(
            gap >= Duration::from_millis(200) && gap < Duration::from_millis(1000),
            "next poll {gap:?} after the slow one"
        );
        wait.abort();
    }

    fn scripted(delays: Vec<u64>) -> Scripted {
        Scripted {
            delays: Mutex::new(delays),
            started: Mutex::new(Vec::new()),
            ended: Mutex::new(Vec::new()),
        }
    }
}
