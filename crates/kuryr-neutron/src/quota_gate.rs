//! Quota gate: once OpenStack refuses a create as over quota, further creates of that resource for
//! that project are answered here, without a call, until a probe gets through.
//!
//! Without it every object waiting for capacity (a namespace's network, a policy's security group,
//! a Service's load balancer) retries on its own schedule: a thousand of them are a thousand
//! refused creates per backoff period against a server that has already said no. With it, one
//! create per (resource, project) goes through at a time, at most once per probe interval
//! (exponential with jitter, 2 s doubling to [`MAX_PROBE_INTERVAL`], the handlers' own longest
//! retry wait); the others fail at once with
//! the same kind of error, so callers react as they would to the server's answer (Events, retry
//! with their own backoff). The first create that succeeds (the quota raised, or capacity freed)
//! opens the gate for everyone.
//!
//! Guarantees: a refused create closes the gate whatever its caller; a closed gate lets exactly
//! one create through per interval (the probe, whose answer decides); any success opens it.
//! Creates that name no project are not gated (Octavia's listeners, pools and members count
//! against their load balancer's project, which their bodies do not carry). A pool's bulk create
//! is never held and only its success is observed: a bulk refused for want of room for all its
//! ports says nothing of a single port.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// The longest wait between two probes of a closed gate: how late, at worst, a raised quota is
/// noticed by the creates held here.
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(15);
const FIRST_PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// A create let through: as the probe of a closed gate, or through an open one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub probe: bool,
}

/// Why a create was not sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub resource: String,
    pub project: String,
    /// Since when the gate has been closed.
    pub closed_for: Duration,
    /// Until the next probe may go.
    pub next_probe_in: Duration,
}

impl Held {
    /// The message of the error a held create answers with.
    pub fn message(&self) -> String {
        let project = if self.project.is_empty() {
            "the client's project"
        } else {
            self.project.as_str()
        };
        format!(
            "Quota exceeded for resources: ['{}'] (refused for {project} {} s ago; not sent again until a probe \
             gets through, next in {} s)",
            self.resource,
            self.closed_for.as_secs(),
            self.next_probe_in.as_secs().max(1)
        )
    }
}

#[derive(Debug)]
struct Closed {
    since: Instant,
    refusals: u32,
    next_probe: Instant,
}

/// Per client (one per deployment and service): the (resource, project) pairs refused as over quota.
#[derive(Debug, Default)]
pub struct QuotaGate {
    closed: Mutex<HashMap<(String, String), Closed>>,
}

fn probe_interval(refusals: u32) -> Duration {
    let exp = FIRST_PROBE_INTERVAL.saturating_mul(1u32 << refusals.saturating_sub(1).min(8));
    exp.min(MAX_PROBE_INTERVAL)
        .mul_f64(rand::rng().random_range(0.5..=1.0))
}

impl QuotaGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Closed>> {
        self.closed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// May a create of `resource` for `project` be sent now? A closed gate whose probe is due lets
    /// this one through as the probe (the next is not due before another interval).
    pub fn admit(&self, resource: &str, project: &str) -> Result<Pass, Held> {
        let mut closed = self.lock();
        let Some(c) = closed.get_mut(&(resource.to_owned(), project.to_owned())) else {
            return Ok(Pass { probe: false });
        };
        let now = Instant::now();
        if now >= c.next_probe {
            c.next_probe = now + probe_interval(c.refusals);
            return Ok(Pass { probe: true });
        }
        Err(Held {
            resource: resource.to_owned(),
            project: project.to_owned(),
            closed_for: now.saturating_duration_since(c.since),
            next_probe_in: c.next_probe.saturating_duration_since(now),
        })
    }

    /// What the answer to a create let through by `pass` says of the quota: `Some(true)` refused
    /// as over quota, `Some(false)` created, `None` neither (another failure says nothing of the
    /// quota). A refusal of a create sent while the gate was open and that finds it closed (one
    /// of a burst already in flight) is not counted again: only probes lengthen the interval.
    pub fn observe(&self, resource: &str, project: &str, pass: Pass, over_quota: Option<bool>) {
        let key = (resource.to_owned(), project.to_owned());
        match over_quota {
            Some(true) => {
                let now = Instant::now();
                let mut closed = self.lock();
                if let Some(c) = closed.get_mut(&key) {
                    if pass.probe {
                        c.refusals = c.refusals.saturating_add(1);
                        c.next_probe = now + probe_interval(c.refusals);
                    }
                    return;
                }
                closed.insert(
                    key,
                    Closed {
                        since: now,
                        refusals: 1,
                        next_probe: now + probe_interval(1),
                    },
                );
                tracing::info!(
                    resource,
                    project,
                    "over quota: further creates are held back until a probe gets through"
                );
            }
            Some(false) => {
                if let Some(c) = self.lock().remove(&key) {
                    tracing::info!(
                        resource,
                        project,
                        refusals = c.refusals,
                        closed_s = c.since.elapsed().as_secs(),
                        "quota has room again: creates go through"
                    );
                }
            }
            None => {}
        }
    }

    /// Whether creates of `resource` for `project` are being held back.
    pub fn is_closed(&self, resource: &str, project: &str) -> bool {
        self.lock()
            .contains_key(&(resource.to_owned(), project.to_owned()))
    }
}

/// The project a create body names (`project_id`, or the older `tenant_id`); "" when it names none
/// (the token's own project).
pub fn project_of(body: &serde_json::Value) -> String {
    ["project_id", "tenant_id"]
        .iter()
        .find_map(|k| body.get(*k).and_then(serde_json::Value::as_str))
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_refusal_holds_creates_back_and_lets_one_probe_through_per_interval() {
        let g = QuotaGate::default();
        let open = g.admit("network", "p").expect("open at first");
        assert!(!open.probe);
        g.observe("network", "p", open, Some(true));
        let held = g.admit("network", "p").expect_err("closed after a refusal");
        assert_eq!((held.resource.as_str(), held.project.as_str()), ("network", "p"));
        assert!(held.next_probe_in <= FIRST_PROBE_INTERVAL, "{held:?}");
        assert!(held.message().contains("['network']"), "{}", held.message());
        // Another project and another resource are not affected.
        assert!(g.admit("network", "q").is_ok());
        assert!(g.admit("security_group", "p").is_ok());

        // Refusals of creates sent before the gate closed do not lengthen the interval.
        for _ in 0..5 {
            g.observe("network", "p", open, Some(true));
        }
        tokio::time::advance(FIRST_PROBE_INTERVAL).await;
        let probe = g.admit("network", "p").expect("the probe goes");
        assert!(probe.probe);
        assert!(g.admit("network", "p").is_err(), "only one probe per interval");
        g.observe("network", "p", probe, Some(true));
        assert!(g.admit("network", "p").is_err(), "the probe was refused");
        g.observe("network", "p", probe, None);
        assert!(
            g.is_closed("network", "p"),
            "another failure says nothing of the quota"
        );
        g.observe("network", "p", probe, Some(false));
        assert!(g.admit("network", "p").is_ok(), "a success opens the gate");
        assert!(g.admit("network", "p").is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn probes_back_off_to_the_cap_while_refusals_go_on() {
        let g = QuotaGate::default();
        let mut sent = 0;
        // Ten simulated minutes of a caller trying every 100 ms while the quota stays full.
        for _ in 0..6000 {
            if let Ok(pass) = g.admit("port", "p") {
                sent += 1;
                g.observe("port", "p", pass, Some(true));
            }
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        // Intervals 2, 4, 8 s, then 15 s, each jittered down to half at the least: a few a minute.
        assert!((35..=90).contains(&sent), "{sent} creates sent in 10 minutes");
    }

    #[test]
    fn the_project_is_read_from_the_body() {
        let b = serde_json::json!({"name": "n", "project_id": "p1"});
        assert_eq!(project_of(&b), "p1");
        assert_eq!(project_of(&serde_json::json!({"tenant_id": "t"})), "t");
        assert_eq!(project_of(&serde_json::json!({"name": 3})), "");
    }
}
