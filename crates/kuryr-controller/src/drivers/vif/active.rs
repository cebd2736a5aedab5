//! Waiting for ports to turn ACTIVE, shared by every pod of a deployment.
//!
//! Each pod's wait registers its port with the deployment's [`ActivePoller`]; one background task
//! asks Neutron about every pending port at once (`GET /v2.0/ports?id=a&id=b&...&fields=id&
//! fields=status`, chunked so that URLs stay short) and wakes the waiters whose port is ACTIVE.
//! A burst of N pods costs one list call per poll instead of N port reads per retry round, and
//! a pod learns its port is up within one poll interval instead of after a growing backoff.
//!
//! The interval adapts ([`next_interval`]): short while ports keep turning ACTIVE or new ones
//! arrive, doubling while nothing changes, and never shorter than the last poll took, so a slow
//! Neutron is not asked more often than it answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kuryr_neutron::{ListFilter, NeutronClient};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::error::Error;
use crate::openstack::Deployments;

/// How often and in what batches the pending ports are checked.
#[derive(Clone, Copy, Debug)]
pub struct PollSettings {
    /// Interval while ports are turning ACTIVE (and right after a new port is registered).
    pub min: Duration,
    /// Interval after a long time without change (an agent that is down).
    pub max: Duration,
    /// Port ids per list call: 36-character UUIDs make about 40 bytes each in the query, so 80
    /// stay well under the 4 KiB request line a uWSGI-served neutron-server accepts by default.
    pub chunk: usize,
    /// How long one wait lasts before the caller gets ResourceNotReady (and retries later).
    pub wait: Duration,
}

impl Default for PollSettings {
    fn default() -> Self {
        Self {
            min: Duration::from_millis(100),
            max: Duration::from_secs(2),
            chunk: 80,
            wait: Duration::from_secs(20),
        }
    }
}

/// The interval before the next poll: `min` when the last poll made progress (a port turned
/// ACTIVE or went away, or new ports are waiting), otherwise double the current one up to `max`;
/// never shorter than the last poll took.
pub fn next_interval(current: Duration, progressed: bool, last_poll: Duration, s: &PollSettings) -> Duration {
    let base = if progressed {
        s.min
    } else {
        current.saturating_mul(2).clamp(s.min, s.max)
    };
    base.max(last_poll.min(s.max))
}

/// What a poll learned about one pending port.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Active,
    /// Not in Neutron's answer: the port was deleted.
    Gone,
}

#[derive(Default)]
struct Pending {
    waiters: HashMap<String, Vec<oneshot::Sender<Outcome>>>,
    /// Ports registered since the last poll (the interval resets for them).
    fresh: bool,
    running: bool,
}

struct Inner {
    client: NeutronClient,
    settings: PollSettings,
    pending: Mutex<Pending>,
    wake: Notify,
}

/// The shared ACTIVE checks of one deployment.
#[derive(Clone)]
pub struct ActivePoller {
    inner: Arc<Inner>,
}

impl ActivePoller {
    pub fn new(client: NeutronClient, settings: PollSettings) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                settings,
                pending: Mutex::new(Pending::default()),
                wake: Notify::new(),
            }),
        }
    }

    /// Ports currently waited for.
    pub fn pending(&self) -> usize {
        self.inner.lock().waiters.len()
    }

    /// Waits until Neutron reports `port_id` ACTIVE. ResourceNotReady after the settings' `wait`,
    /// NotFound-like OpenStack error when the port is gone.
    pub async fn wait_active(&self, port_id: &str) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.inner.lock();
            p.waiters.entry(port_id.to_string()).or_default().push(tx);
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
        // Waiting is not working: the handler's worker slot goes to other objects meanwhile.
        let outcome = crate::pipeline::idle(tokio::time::timeout(wait, rx)).await;
        match outcome {
            Ok(Ok(Outcome::Active)) => Ok(()),
            Ok(Ok(Outcome::Gone)) => Err(Error::not_ready(format!("port {port_id} is gone from Neutron"))),
            // The poller stopped (shutdown) or the wait timed out.
            Ok(Err(_)) | Err(_) => {
                self.inner.forget_closed(port_id);
                Err(Error::not_ready(format!(
                    "port {port_id} is not ACTIVE after {}s",
                    wait.as_secs()
                )))
            }
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops waiters that gave up, so their ports are no longer asked about.
    fn forget_closed(&self, port_id: &str) {
        let mut p = self.lock();
        if let Some(w) = p.waiters.get_mut(port_id) {
            w.retain(|tx| !tx.is_closed());
            if w.is_empty() {
                p.waiters.remove(port_id);
            }
        }
    }

    async fn run(self: Arc<Self>) {
        let s = self.settings;
        let mut interval = s.min;
        loop {
            // A new port is not ACTIVE the instant it is created: it gets at least `min`. A port
            // registered during a long (idle) interval cuts it short to `min` from then.
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = self.wake.notified() => tokio::time::sleep(s.min).await,
            }
            let ids: Vec<String> = {
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
            let started = Instant::now();
            let mut progressed = false;
            for chunk in ids.chunks(s.chunk.max(1)) {
                match self.poll(chunk).await {
                    Ok(done) => {
                        progressed |= !done.is_empty();
                        let mut p = self.lock();
                        for (id, outcome) in done {
                            for tx in p.waiters.remove(&id).unwrap_or_default() {
                                let _ = tx.send(outcome.clone());
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, ports = chunk.len(), "port status poll failed; retrying");
                    }
                }
            }
            let fresh = self.lock().fresh;
            interval = next_interval(interval, progressed || fresh, started.elapsed(), &s);
        }
    }

    /// One list call for `ids`: which of them are ACTIVE or gone.
    async fn poll(&self, ids: &[String]) -> Result<Vec<(String, Outcome)>, kuryr_neutron::Error> {
        let mut filter = ListFilter::new();
        for id in ids {
            filter = filter.id(id.clone());
        }
        let ports = self.client.list_ports(&filter.fields(["id", "status"])).await?;
        let mut out = Vec::new();
        for id in ids {
            match ports.iter().find(|p| &p.id == id) {
                Some(p) if p.is_active() => out.push((id.clone(), Outcome::Active)),
                Some(_) => {}
                None => out.push((id.clone(), Outcome::Gone)),
            }
        }
        Ok(out)
    }
}

/// One [`ActivePoller`] per deployment, made on first use.
pub struct ActivePollers {
    deployments: Deployments,
    settings: PollSettings,
    by_deployment: Mutex<HashMap<String, ActivePoller>>,
}

impl ActivePollers {
    pub fn new(deployments: Deployments, settings: PollSettings) -> Self {
        Self {
            deployments,
            settings,
            by_deployment: Mutex::new(HashMap::new()),
        }
    }

    pub fn get(&self, deployment: &str) -> Result<ActivePoller, Error> {
        let mut map = self.by_deployment.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(deployment) {
            return Ok(p.clone());
        }
        let poller = ActivePoller::new(self.deployments.client(deployment)?.clone(), self.settings);
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
        }
    }

    #[test]
    fn interval_is_short_while_ports_turn_active() {
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
    fn interval_is_never_shorter_than_the_last_poll() {
        let i = next_interval(Duration::from_millis(100), true, Duration::from_millis(700), &s());
        assert_eq!(i, Duration::from_millis(700));
        // ... but a hung call does not push it past max.
        let i = next_interval(Duration::from_millis(100), true, Duration::from_secs(30), &s());
        assert_eq!(i, Duration::from_secs(2));
    }
}
