//! Orphan sweep: pod ports (`compute:kuryr`, `trunk:subport`) tagged `kuryr-rs` and with this
//! cluster's tag that no pool and no KuryrPort owns, whatever the pool driver (with `noop`, the
//! ports of pods deleted while no controller ran with a finalizer forced off, or whose create
//! answered after its pod was gone). A port must be seen unowned in two consecutive passes, and
//! be older than the in-use grace by Neutron's `created_at`, before it is deleted, so a port
//! created between a Neutron call and its record (a refill or a bulk create landing, a KuryrPort
//! status being written) is never taken for a leak.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use std::sync::Arc;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kuryr_crds::names::device_owner::{COMPUTE_KURYR, TRUNK_SUBPORT};
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::{ListFilter, Port};

use tokio_util::sync::CancellationToken;

use super::persist::Persister;
use crate::context::Context;
use crate::drivers::vif::{VifDriver, detach_and_delete, subports_by_port};
use crate::error::Error;
use crate::openstack::Deployments;

/// Ports per Neutron list request.
const NEUTRON_PAGE: u32 = 500;

/// A pass lists every KuryrPort and every tagged port: at most this share of the time goes to it.
const DUTY: u32 = 20;
/// ...but a leak is looked for at least this often.
const LONGEST_PAUSE: Duration = Duration::from_secs(600);

/// The pause before the next pass: the pool update period, or longer when a pass is costly (tens
/// of thousands of ports), so that the sweep takes at most 1/[`DUTY`] of the time of the API
/// servers it lists, up to [`LONGEST_PAUSE`].
pub fn pause_after(period: Duration, last_pass: Duration) -> Duration {
    period.max(last_pass.saturating_mul(DUTY).min(LONGEST_PAUSE))
}

/// Ports seen unowned in the previous pass, per deployment.
#[derive(Debug, Default)]
pub struct Suspects {
    previous: HashMap<String, BTreeSet<String>>,
}

impl Suspects {
    /// Records this pass' unowned ports of `deployment`; returns the ones unowned in the
    /// previous pass too (to delete now).
    pub fn confirm(&mut self, deployment: &str, unowned: BTreeSet<String>) -> Vec<String> {
        let before = self.previous.remove(deployment).unwrap_or_default();
        let confirmed = unowned.intersection(&before).cloned().collect();
        self.previous.insert(deployment.to_string(), unowned);
        confirmed
    }
}

/// One sweep pass over every deployment. `owned` is everything pools and KuryrPorts account
/// for, read after the Neutron listing would be racy, so callers read it before. `vifs` (the
/// drivers that may have made the ports) release what they did outside a port before it is
/// deleted. Returns the deleted port ids.
pub async fn sweep(
    deployments: &Deployments,
    vifs: &[Arc<dyn VifDriver>],
    cluster_tag: &str,
    owned: &HashSet<String>,
    created_before: Timestamp,
    suspects: &mut Suspects,
) -> Result<Vec<String>, Error> {
    let mut deleted = Vec::new();
    // Only where the cluster tag is confirmed this cluster's (cluster_claim.rs).
    for deployment in deployments.claimed_names() {
        let client = deployments.client(&deployment)?;
        // A page at a time, keeping only the unowned ids: the cluster's ports can be tens of
        // thousands, and this runs every update period.
        let filter = ListFilter::new()
            .tags([tags::TAG_MANAGED, cluster_tag])
            .limit(NEUTRON_PAGE);
        let mut subports = HashSet::new();
        let mut unowned = BTreeSet::new();
        // The unowned pod ports themselves: their drivers may need more than the id to release them.
        let mut pod_ports: HashMap<String, Port> = HashMap::new();
        let mut marker: Option<String> = None;
        let mut restarts = 0;
        loop {
            let page = match client.list_ports_page(&filter, marker.as_deref()).await {
                Ok(page) => page,
                // The port the next page starts after was deleted meanwhile: list again.
                Err(e) if marker.is_some() && e.is_not_found() && restarts < 3 => {
                    restarts += 1;
                    (marker, subports, unowned) = (None, HashSet::new(), BTreeSet::new());
                    pod_ports.clear();
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let empty = page.items.is_empty();
            for p in page.items {
                if (p.device_owner == COMPUTE_KURYR || p.device_owner == TRUNK_SUBPORT)
                    && !owned.contains(&p.id)
                    && !created_after(p.created_at.as_deref(), created_before)
                {
                    if p.device_owner == TRUNK_SUBPORT {
                        subports.insert(p.id.clone());
                    }
                    unowned.insert(p.id.clone());
                    if p.device_owner == COMPUTE_KURYR {
                        pod_ports.insert(p.id.clone(), p);
                    }
                }
            }
            match page.next_marker {
                Some(m) if !empty && marker.as_deref() != Some(m.as_str()) => marker = Some(m),
                _ => break,
            }
        }
        let mut confirmed = suspects.confirm(&deployment, unowned);
        let releasing: Vec<Port> = confirmed.iter().filter_map(|id| pod_ports.remove(id)).collect();
        if !releasing.is_empty() {
            let mut kept = HashSet::new();
            for vif in vifs {
                kept.extend(vif.release_orphans(&deployment, &releasing).await);
            }
            // Still unowned next pass, so confirmed again then.
            confirmed.retain(|id| !kept.contains(id));
        }
        let trunks = if confirmed.iter().any(|id| subports.contains(id)) {
            subports_by_port(client).await?
        } else {
            HashMap::new()
        };
        for id in confirmed {
            let trunk = trunks.get(&id).map(|(t, _)| t.as_str());
            match detach_and_delete(client, &id, trunk).await {
                Ok(()) => {
                    tracing::info!(port = %id, deployment, "deleted orphaned kuryr-rs port");
                    deleted.push(id);
                }
                Err(e) => tracing::warn!(port = %id, error = %e, "could not delete orphaned port"),
            }
        }
    }
    Ok(deleted)
}

/// The pace of a sweep's passes: one every `period`, spaced out by [`pause_after`] when a pass is
/// costly; the suspects carried from one pass to the next.
pub struct Passes {
    period: Duration,
    started: Option<tokio::time::Instant>,
    pub suspects: Suspects,
}

impl Passes {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            started: None,
            suspects: Suspects::default(),
        }
    }

    /// Waits for the next pass; `false` once `stop` fires. A pass is what the caller does between
    /// two calls, and its duration sets the pause before the next.
    pub async fn next(&mut self, stop: &CancellationToken) -> bool {
        let last_pass = self.started.map(|s| s.elapsed()).unwrap_or_default();
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = tokio::time::sleep(pause_after(self.period, last_pass)) => {}
        }
        self.started = Some(tokio::time::Instant::now());
        true
    }
}

/// The sweep with the `noop` pool driver, for one leadership term: no pool owns a port there, so
/// what the KuryrPorts record is all that is owned.
pub async fn run_without_pools(ctx: Arc<Context>, stop: CancellationToken) {
    let persister = Persister::new(
        ctx.kube.clone(),
        ctx.config.kubernetes.controller_namespace.clone(),
    );
    let period = Duration::from_secs(ctx.config.vif_pool.ports_pool_update_frequency.max(1));
    let grace = SignedDuration::try_from(super::in_use_grace(period)).unwrap_or(SignedDuration::MAX);
    let tag = tags::cluster_tag(&ctx.cluster_id);
    let mut passes = Passes::new(period);
    while passes.next(&stop).await {
        let listed_at = Timestamp::now();
        // Read before Neutron is listed, as with pools (see `PoolManager::sweep_once`).
        let pass = async {
            let owned = persister.ports_in_use().await?;
            let before = listed_at.checked_sub(grace).unwrap_or(listed_at);
            let vifs = ctx.drivers.pod_vif_drivers();
            sweep(
                &ctx.deployments,
                &vifs,
                &tag,
                &owned,
                before,
                &mut passes.suspects,
            )
            .await
        };
        // No pool books to keep consistent: a term that ends stops the pass where it is.
        let swept = tokio::select! {
            _ = stop.cancelled() => return,
            r = pass => r,
        };
        match swept {
            Ok(deleted) => ctx.metrics.pool_event("deleted_orphan", deleted.len() as u64),
            Err(e) => tracing::warn!(error = %e, "orphan sweep failed"),
        }
    }
}

/// Whether Neutron's `created_at` (`2026-11-29T18:21:49Z`) is later than `t`. A port without
/// one (a Neutron that does not show it) counts as old: the two passes still guard it.
fn created_after(created_at: Option<&str>, t: Timestamp) -> bool {
    created_at
        .and_then(|c| {
            c.parse::<Timestamp>()
                .ok()
                .or_else(|| format!("{c}Z").parse::<Timestamp>().ok())
        })
        .is_some_and(|c| c > t)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn a_port_younger_than_the_grace_is_not_questioned() {
        let t: Timestamp = "2026-11-29T18:00:00Z".parse().unwrap();
        assert!(created_after(Some("2026-11-29T18:00:05Z"), t));
        assert!(
            created_after(Some("2026-11-29T18:00:05"), t),
            "Neutron without the zone"
        );
        assert!(!created_after(Some("2026-11-29T17:59:55Z"), t));
        assert!(!created_after(None, t), "unknown: the two passes guard it");
        assert!(!created_after(Some("yesterday"), t));
    }

    #[test]
    fn a_costly_pass_spaces_the_next_one_out() {
        let period = Duration::from_secs(1);
        assert_eq!(pause_after(period, Duration::ZERO), period);
        assert_eq!(
            pause_after(period, Duration::from_millis(20)),
            period,
            "cheap: every period"
        );
        assert_eq!(
            pause_after(period, Duration::from_millis(500)),
            Duration::from_secs(10)
        );
        assert_eq!(
            pause_after(Duration::from_secs(20), Duration::from_millis(500)),
            Duration::from_secs(20)
        );
        assert_eq!(pause_after(period, Duration::from_secs(300)), LONGEST_PAUSE);
        assert_eq!(
            pause_after(Duration::from_secs(900), Duration::from_secs(300)),
            Duration::from_secs(900)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn passes_keep_the_period_and_space_out_after_a_costly_pass() {
        let stop = CancellationToken::new();
        let mut passes = Passes::new(Duration::from_secs(1));
        let t0 = tokio::time::Instant::now();
        assert!(passes.next(&stop).await);
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(1),
            "first pass after one period"
        );
        // A pass of 500 ms: the next waits DUTY times that.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t1 = tokio::time::Instant::now();
        assert!(passes.next(&stop).await);
        assert_eq!(t1.elapsed(), Duration::from_secs(10));
        // A cheap pass: back to the period.
        let t2 = tokio::time::Instant::now();
        assert!(passes.next(&stop).await);
        assert_eq!(t2.elapsed(), Duration::from_secs(1));
        stop.cancel();
        assert!(!passes.next(&stop).await, "no pass once stopped");
    }

    #[test]
    fn deletes_only_ports_unowned_in_two_consecutive_passes() {
        let mut s = Suspects::default();
        assert!(
            s.confirm("default", set(&["a", "b"])).is_empty(),
            "first sighting"
        );
        // "a" got owned meanwhile (its KuryrPort was written); "c" is new.
        assert_eq!(s.confirm("default", set(&["b", "c"])), vec!["b".to_string()]);
        // Deployments are tracked separately.
        assert!(s.confirm("east", set(&["c"])).is_empty());
        assert_eq!(s.confirm("default", set(&["c"])), vec!["c".to_string()]);
        // An owned pass in between resets the count.
        assert!(s.confirm("default", set(&[])).is_empty());
        assert!(s.confirm("default", set(&["c"])).is_empty());
    }
}
