//! Waiting for load balancers to leave PENDING_*, shared by every Service of a deployment.
//!
//! Each wait after an Octavia write registers its load balancer with the deployment's [`LbWaits`];
//! one background task ([`crate::batch_poller`], the mechanism of the ports' ACTIVE waits) asks
//! Octavia about every pending load balancer with ONE list call per poll and wakes each waiter as
//! its load balancer goes ACTIVE, ERROR or away. Octavia filters a list by one `id` only (a repeated
//! `id` is a 500 from its database layer), so the list selects by the Services' ownership tags:
//! `GET /v2/lbaas/loadbalancers?tags-any=<service tag>,<service tag>...`. A load balancer without
//! such a tag (one upstream made and kuryr-rs adopted) or missing from the answer (deleted) is read
//! on its own, which is also how its deletion is confirmed (404).
//!
//! A wait lasts `[neutron_defaults] lbaas_activation_timeout`, upstream's bound on the same wait.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use kuryr_neutron::ListFilter;
use kuryr_neutron::octavia::{LoadBalancer, OctaviaClient, OctaviaError};

use crate::batch_poller::{BatchPoller, BatchPollers, PollSettings, StatusSource, WaitEnd};

/// What a wait waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Active,
    Deleted,
}

/// One pending wait: the load balancer, the Service tag it carries (if any) and what it waits for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LbKey {
    pub id: String,
    pub tag: Option<String>,
    pub target: Target,
}

/// How a wait ended.
#[derive(Debug, Clone)]
pub enum Settled {
    Active(Box<LoadBalancer>),
    Deleted,
    /// Gone while ACTIVE was awaited.
    Gone,
    /// provisioning_status ERROR.
    Failed,
}

/// What one observation means for a wait; `None` keeps waiting.
pub fn settle(target: Target, lb: Option<&LoadBalancer>) -> Option<Settled> {
    let status = lb.map(|l| l.provisioning_status.as_str());
    match (target, status) {
        (Target::Deleted, None | Some("DELETED")) => Some(Settled::Deleted),
        (Target::Active, Some("ACTIVE")) => lb.map(|l| Settled::Active(Box::new(l.clone()))),
        (_, Some("ERROR")) => Some(Settled::Failed),
        (Target::Active, None | Some("DELETED")) => Some(Settled::Gone),
        _ => None,
    }
}

/// The keys a list by tags cannot answer for (no tag, or not in the answer), to be read one by one.
fn unanswered<'a>(keys: &'a [LbKey], listed: &[LoadBalancer]) -> Vec<&'a LbKey> {
    keys.iter()
        .filter(|k| k.tag.is_none() || !listed.iter().any(|l| l.id == k.id))
        .collect()
}

/// Load balancer states from one Octavia, by the batch.
pub struct LbStatuses(pub OctaviaClient);

#[async_trait]
impl StatusSource for LbStatuses {
    type Key = LbKey;
    type Outcome = Settled;
    type Error = OctaviaError;

    async fn poll(&self, keys: &[LbKey]) -> Result<Vec<(LbKey, Settled)>, OctaviaError> {
        let tags: BTreeSet<&str> = keys.iter().filter_map(|k| k.tag.as_deref()).collect();
        let listed = if tags.is_empty() {
            Vec::new()
        } else {
            self.0
                .list_load_balancers(&ListFilter::new().tags_any(&tags))
                .await?
        };
        let mut out = Vec::new();
        for k in keys {
            if let Some(lb) = listed.iter().find(|l| l.id == k.id)
                && let Some(s) = settle(k.target, Some(lb))
            {
                out.push((k.clone(), s));
            }
        }
        for k in unanswered(keys, &listed) {
            let lb = match self.0.get_load_balancer(&k.id).await {
                Ok(lb) => Some(lb),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e),
            };
            if let Some(s) = settle(k.target, lb.as_ref()) {
                out.push((k.clone(), s));
            }
        }
        Ok(out)
    }
}

/// The shared provisioning waits of one deployment's Octavia.
#[derive(Clone)]
pub struct LbWaits {
    poller: BatchPoller<LbStatuses>,
}

impl LbWaits {
    pub fn new(client: OctaviaClient, settings: PollSettings) -> Self {
        Self {
            poller: BatchPoller::new(LbStatuses(client), settings),
        }
    }

    /// Load balancers currently waited for.
    pub fn pending(&self) -> usize {
        self.poller.pending()
    }

    /// Waits for `id` (carrying the Service tag `tag`, if any) to be ACTIVE; `None` when it is gone.
    /// ERROR is [`OctaviaError::ProvisioningFailed`], running out of time [`OctaviaError::WaitTimeout`], as
    /// for [`OctaviaClient::wait_for_provisioning`].
    pub async fn active(&self, id: &str, tag: Option<&str>) -> Result<Option<LoadBalancer>, OctaviaError> {
        match self.wait(id, tag, Target::Active).await? {
            Settled::Active(lb) => Ok(Some(*lb)),
            Settled::Deleted | Settled::Gone => Ok(None),
            Settled::Failed => Err(OctaviaError::ProvisioningFailed {
                lb_id: id.to_string(),
                target: "ACTIVE",
            }),
        }
    }

    /// Waits for `id` to be gone.
    pub async fn deleted(&self, id: &str, tag: Option<&str>) -> Result<(), OctaviaError> {
        match self.wait(id, tag, Target::Deleted).await? {
            Settled::Deleted | Settled::Gone => Ok(()),
            Settled::Active(_) | Settled::Failed => Err(OctaviaError::ProvisioningFailed {
                lb_id: id.to_string(),
                target: "deletion",
            }),
        }
    }

    async fn wait(&self, id: &str, tag: Option<&str>, target: Target) -> Result<Settled, OctaviaError> {
        let key = LbKey {
            id: id.to_string(),
            tag: tag.map(str::to_string),
            target,
        };
        self.poller
            .wait(key)
            .await
            .map_err(|WaitEnd::TimedOut(waited)| OctaviaError::WaitTimeout {
                lb_id: id.to_string(),
                target: match target {
                    Target::Active => "ACTIVE",
                    Target::Deleted => "deletion",
                },
                last_status: "PENDING (lbaas_activation_timeout)".into(),
                waited,
            })
    }
}

/// The poll settings for load balancers: first look after 200 ms (a write is never done sooner),
/// backing off to 5 s (an amphora boot takes minutes), `lbaas_activation_timeout` per wait, Service tags
/// of about 40 bytes 40 to a call. A waiting Service parks: it holds little, and a hundred
/// amphorae booting must not keep pods out of their handlers.
pub fn settings(activation_timeout_s: u64) -> PollSettings {
    PollSettings {
        min: Duration::from_millis(200),
        max: Duration::from_secs(5),
        chunk: 40,
        wait: Duration::from_secs(activation_timeout_s.max(1)),
        parks: true,
    }
}

/// One [`LbWaits`] per deployment, made on first use.
pub struct LbWaitsByDeployment {
    pollers: BatchPollers<LbStatuses>,
}

impl LbWaitsByDeployment {
    pub fn new(settings: PollSettings) -> Self {
        Self {
            pollers: BatchPollers::new(settings),
        }
    }

    pub fn get(&self, deployment: &str, client: &OctaviaClient) -> LbWaits {
        let poller = self.pollers.get(deployment, || {
            Ok::<_, std::convert::Infallible>(LbStatuses(client.clone()))
        });
        match poller {
            Ok(poller) => LbWaits { poller },
            Err(never) => match never {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lb(id: &str, status: &str) -> LoadBalancer {
        LoadBalancer {
            id: id.into(),
            provisioning_status: status.into(),
            ..Default::default()
        }
    }

    #[test]
    fn waits_settle_on_the_target_or_a_failure() {
        assert!(settle(Target::Active, Some(&lb("a", "PENDING_CREATE"))).is_none());
        assert!(matches!(
            settle(Target::Active, Some(&lb("a", "ACTIVE"))),
            Some(Settled::Active(l)) if l.id == "a"
        ));
        assert!(matches!(
            settle(Target::Active, Some(&lb("a", "ERROR"))),
            Some(Settled::Failed)
        ));
        assert!(matches!(settle(Target::Active, None), Some(Settled::Gone)));
        assert!(settle(Target::Deleted, Some(&lb("a", "PENDING_DELETE"))).is_none());
        assert!(matches!(settle(Target::Deleted, None), Some(Settled::Deleted)));
        assert!(matches!(
            settle(Target::Deleted, Some(&lb("a", "DELETED"))),
            Some(Settled::Deleted)
        ));
    }

    #[test]
    fn untagged_and_unlisted_load_balancers_are_read_alone() {
        let key = |id: &str, tag: Option<&str>| LbKey {
            id: id.into(),
            tag: tag.map(str::to_string),
            target: Target::Active,
        };
        let keys = [key("a", Some("t1")), key("b", Some("t2")), key("c", None)];
        let left: Vec<_> = unanswered(&keys, &[lb("a", "ACTIVE")])
            .into_iter()
            .map(|k| k.id.as_str())
            .collect();
        assert_eq!(left, ["b", "c"]);
    }
}
