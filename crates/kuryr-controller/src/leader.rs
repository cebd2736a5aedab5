//! Leader election on a `coordination.k8s.io/v1` Lease, so two controller replicas are safe:
//! only the holder runs the pipeline. A holder that stops renewing loses the lease after
//! `lease_duration`; a follower then takes over within one retry period.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::locked::Locked;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub retry_period: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: "kuryr-controller".to_string(),
            identity: identity.to_string(),
            // 10 s + 2 s retry keeps a hand-over under 15 s after the leader dies.
            lease_duration: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Pure decision: may `identity` take or keep the lease as it is now, the record having stayed
/// unchanged for `unchanged_for` as this replica measured it? Another holder's lease expires
/// when its record has not changed for its duration by this replica's own monotonic clock (as
/// client-go judges it), never by comparing the renew time, written by the holder's clock,
/// with ours: a replica whose clock ran a few seconds ahead would take a lease still being renewed.
pub fn may_hold(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> bool {
    let Some(spec) = spec else { return true };
    match spec.holder_identity.as_deref() {
        None | Some("") => true,
        Some(h) if h == identity => true,
        Some(_) => {
            let duration = u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(15);
            unchanged_for > Duration::from_secs(duration)
        }
    }
}

/// What identifies a lease record's state: any renewal or hand-over changes it.
type Record = (Option<String>, Option<MicroTime>, Option<MicroTime>, Option<i32>);

/// The lease record as last seen and when it was first seen so, by the local monotonic clock.
#[derive(Debug, Default)]
pub struct Observed {
    last: Option<(Record, Instant)>,
}

impl Observed {
    /// Notes the record read at `now`; returns how long it has stayed as it is.
    pub fn unchanged_for(&mut self, spec: Option<&LeaseSpec>, now: Instant) -> Duration {
        let record = spec.map_or_else(Default::default, |s| {
            (
                s.holder_identity.clone(),
                s.renew_time.clone(),
                s.acquire_time.clone(),
                s.lease_transitions,
            )
        });
        match &self.last {
            Some((seen, since)) if *seen == record => now.saturating_duration_since(*since),
            _ => {
                self.last = Some((record, now));
                Duration::ZERO
            }
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    observed: std::sync::Mutex<Observed>,
}

impl LeaderElector {
    pub fn new(client: kube::Client, cfg: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            observed: std::sync::Mutex::default(),
        }
    }

    fn spec(&self, now: Timestamp, acquire: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(15)),
            acquire_time: Some(acquire.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One round: take or renew the lease. Ok(true) while we hold it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, Error> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let unchanged_for = self
            .observed
            .locked()
            .unchanged_for(lease.spec.as_ref(), Instant::now());
        if !may_hold(lease.spec.as_ref(), &self.cfg.identity, unchanged_for) {
            return Ok(false);
        }
        let old = lease.spec.clone().unwrap_or_default();
        let ours = old.holder_identity.as_deref() == Some(self.cfg.identity.as_str());
        let transitions = old.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquire = if ours { old.acquire_time.clone() } else { None };
        lease.spec = Some(self.spec(now, acquire, transitions));
        // PUT with the resourceVersion we read: a concurrent candidate makes one of us get 409.
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Keeps electing until `stop`; publishes leadership changes on `tx`.
    pub async fn run(self, tx: watch::Sender<bool>, stop: CancellationToken) {
        let mut leader = false;
        let mut last_renew = tokio::time::Instant::now();
        // A leader steps down once it has not renewed for this long, well before the lease it
        // wrote can expire and a follower take over: two leaders must never act at once.
        let renew_deadline = self.cfg.lease_duration * 2 / 3;
        loop {
            let started = tokio::time::Instant::now();
            // A round that hangs (an API server that accepts but does not answer) must not keep
            // a leader leading past its deadline: it is bounded, and a timeout is a failure.
            let limit = if leader {
                renew_deadline.saturating_sub(last_renew.elapsed())
            } else {
                self.cfg.lease_duration
            };
            let result = match tokio::time::timeout(
                limit.max(Duration::from_millis(100)),
                self.try_acquire_or_renew(),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(Error::not_ready(format!("lease round took over {limit:?}"))),
            };
            let now_leader = match result {
                Ok(v) => {
                    if v {
                        // The renew time written is from before the call: count from then.
                        last_renew = started;
                    }
                    v
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease renewal failed");
                    leader && last_renew.elapsed() < renew_deadline
                }
            };
            if now_leader != leader {
                leader = now_leader;
                tracing::info!(identity = %self.cfg.identity, leader, "leadership changed");
                let _ = tx.send(leader);
            }
            tokio::select! {
                _ = stop.cancelled() => {
                    if leader {
                        // Hand over at once instead of making the next leader wait for expiry.
                        if let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await
                            && let Some(spec) = lease.spec.as_mut()
                            && spec.holder_identity.as_deref() == Some(self.cfg.identity.as_str())
                        {
                            spec.holder_identity = None;
                            let _ = self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await;
                        }
                        let _ = tx.send(false);
                    }
                    return;
                }
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
            }
        }
    }
}

/// When this replica's current leadership term began. An object created after it (by the API
/// server's clock, which may differ from ours by [`CLOCK_SKEW`]) was handled by no other leader:
/// whatever was done for it, this replica did and knows of.
#[derive(Debug, Default)]
pub struct Term {
    started: std::sync::Mutex<Option<Timestamp>>,
}

/// How far the API server's clock may be ahead of ours for [`Term::created_within`] to hold.
pub const CLOCK_SKEW: SignedDuration = SignedDuration::from_secs(10);

impl Term {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Timestamp>> {
        self.started.locked()
    }

    pub fn begin(&self, at: Timestamp) {
        *self.lock() = Some(at);
    }

    pub fn end(&self) {
        *self.lock() = None;
    }

    /// Whether an object with this `creationTimestamp` was surely created during the current
    /// term (false when none runs, and near its start).
    pub fn created_within(&self, created: Timestamp) -> bool {
        self.lock()
            .and_then(|s| s.checked_add(CLOCK_SKEW).ok())
            .is_some_and(|after| created > after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed_secs_ago: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(10),
            renew_time: Some(MicroTime(
                Timestamp::now() - SignedDuration::from_secs(renewed_secs_ago),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn only_objects_created_well_after_the_term_began_are_its_own() {
        let t = Term::default();
        let start = Timestamp::now();
        let later = start + SignedDuration::from_secs(11);
        assert!(!t.created_within(later), "no term runs");
        t.begin(start);
        assert!(t.created_within(later));
        assert!(
            !t.created_within(start),
            "created as the term began: maybe another leader's"
        );
        assert!(
            !t.created_within(start + SignedDuration::from_secs(9)),
            "within the clock skew"
        );
        t.end();
        assert!(!t.created_within(later));
    }

    #[test]
    fn lease_rules() {
        let fresh = Duration::from_secs(1);
        let stale = Duration::from_secs(11);
        assert!(may_hold(None, "a", fresh));
        assert!(may_hold(Some(&spec("a", 1)), "a", fresh), "holder renews");
        assert!(
            !may_hold(Some(&spec("b", 1)), "a", fresh),
            "fresh lease of another is respected"
        );
        assert!(
            may_hold(Some(&spec("b", 11)), "a", stale),
            "a lease left unrenewed for its duration is taken over"
        );
        assert!(
            !may_hold(Some(&spec("b", 30)), "a", fresh),
            "a renew time that looks old by this replica's clock (the holder's runs behind) is no expiry"
        );
    }

    #[test]
    fn a_lease_is_as_old_as_this_replica_has_seen_it_unchanged() {
        let mut seen = Observed::default();
        let t0 = Instant::now();
        let first = spec("b", 0);
        assert_eq!(seen.unchanged_for(Some(&first), t0), Duration::ZERO);
        let later = t0 + Duration::from_secs(4);
        assert_eq!(seen.unchanged_for(Some(&first), later), Duration::from_secs(4));
        // Renewed: counted again from when it was seen to change.
        let renewed = spec("b", -1);
        assert_eq!(seen.unchanged_for(Some(&renewed), later), Duration::ZERO);
        assert_eq!(
            seen.unchanged_for(Some(&renewed), later + Duration::from_secs(11)),
            Duration::from_secs(11)
        );
    }

    /// A proxy to `upstream` that forwards until `hang` is set; from then on it accepts
    /// connections and never answers, like an API server that is up but stuck.
    async fn stalling_proxy(
        upstream: std::net::SocketAddr,
        hang: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let mut held = vec![];
            while let Ok((mut conn, _)) = listener.accept().await {
                if hang.load(std::sync::atomic::Ordering::SeqCst) {
                    held.push(conn);
                    continue;
                }
                let hang = hang.clone();
                tokio::spawn(async move {
                    let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut conn, &mut up) => {}
                        // Kept-alive connections stall too: open, silent, forever.
                        _ = async {
                            while !hang.load(std::sync::atomic::Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        } => std::future::pending::<()>().await,
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_leader_whose_renewals_hang_steps_down_before_its_lease_expires() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let emu = kube_emulator::KubeEmulator::start(kube_emulator::KubeOptions::default())
            .await
            .expect("emulator");
        let hang = Arc::new(AtomicBool::new(false));
        let proxy = stalling_proxy(emu.addr(), hang.clone()).await;
        let config = kube::Config::new(format!("http://{proxy}").parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let cfg = LeaseConfig {
            lease_duration: Duration::from_secs(3),
            retry_period: Duration::from_millis(200),
            ..LeaseConfig::new("default", "a")
        };
        let (tx, mut rx) = watch::channel(false);
        let stop = CancellationToken::new();
        tokio::spawn(LeaderElector::new(client, cfg).run(tx, stop.clone()));
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|l| *l))
            .await
            .expect("became leader")
            .expect("elector alive");
        hang.store(true, Ordering::SeqCst);
        let stalled = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|l| !*l))
            .await
            .expect("stepped down")
            .expect("elector alive");
        assert!(
            stalled.elapsed() < Duration::from_secs(3),
            "stepped down after {:?}, when its lease (3 s) may already be another's",
            stalled.elapsed()
        );
        stop.cancel();
    }
}
