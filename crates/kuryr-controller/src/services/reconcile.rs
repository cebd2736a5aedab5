//! The periodic check of every KuryrLoadBalancer against Octavia (upstream's `reconcile_loadbalancers`,
//! every 600 s by default) and the orphan sweep.
//!
//! - A recorded load balancer that is gone (deleted by hand) or in ERROR: its record is cleared (an ERROR one
//!   deleted first), and the `kuryrloadbalancer` handler, woken by the status change, builds it again.
//! - A recorded listener, pool or member missing from Octavia: the record is rebuilt from Octavia, so the
//!   handler's plan re-creates what is missing. One in ERROR under an ACTIVE load balancer (a provider's
//!   failed child operation, which no wait sees) is deleted first, then the same.
//! - A load balancer without kuryr-rs' tags (adopted from upstream): tagged, upstream's tags kept.
//! - Per deployment, a load balancer tagged as this cluster's whose KuryrLoadBalancer is gone or records
//!   another deployment, seen in two passes in a row (a Service created between the list calls is not
//!   mistaken for an orphan): deleted. The same for a floating IP on the deployment's `external_svc_net`
//!   whose description names this cluster and a Service without a KuryrLoadBalancer there (user-allocated
//!   floating IPs carry no such description and are never touched).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kuryr_crds::KuryrLoadBalancer;
use kuryr_neutron::ListFilter;
use kuryr_neutron::octavia::{ResourceUpdate, StatusTree};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::octavia::LbActor;
use super::public_ip;
use super::recorded::RecordedLb;
use crate::context::Context;
use crate::error::Error;
use crate::placement::record::recorded_deployment;

/// (deployment, load balancer name) of every live KuryrLoadBalancer -> the load balancers it may
/// own there: the one its status records, and one with its Service's cluster IP as VIP (made by
/// a pass that has not recorded it yet). Another of the same name (a Service deleted with its
/// finalizers stripped, then made again with a new cluster IP) is an orphan: it would hold the
/// old cluster IP in the service subnet for the new Service's whole life.
type Known = BTreeMap<(String, String), KnownLb>;

#[derive(Debug, Default)]
struct KnownLb {
    recorded: Option<String>,
    vip: Option<String>,
}

impl KnownLb {
    fn owns(&self, lb: &kuryr_neutron::octavia::LoadBalancer) -> bool {
        match (&self.recorded, &self.vip) {
            // Nothing to tell them apart by: every one of the name is spared.
            (None, None) => true,
            (recorded, vip) => {
                recorded.as_deref() == Some(lb.id.as_str())
                    || (vip.is_some() && lb.vip_address.as_deref() == vip.as_deref())
            }
        }
    }
}

/// What one pass found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub checked: usize,
    /// Records cleared because Octavia lost the load balancer or it went to ERROR.
    pub rebuilt: usize,
    /// Records refreshed because parts of the tree were missing.
    pub repaired: usize,
    pub orphans_deleted: usize,
    /// Load balancers given the tags they lacked (adopted from upstream).
    pub tagged: usize,
}

pub struct Reconciler {
    ctx: Arc<Context>,
    /// Orphan candidates of the previous pass (load balancer ids).
    suspects: BTreeSet<String>,
}

/// Whether Octavia's tree still has everything the record says.
fn tree_has_record(tree: &StatusTree, rec: &RecordedLb) -> bool {
    rec.listeners.values().all(|l| {
        let Some(tl) = tree.loadbalancer.listeners.iter().find(|t| t.id == l.id) else {
            return false;
        };
        match &l.pool {
            None => true,
            Some(p) => tl.pools.iter().find(|tp| tp.id == p.id).is_some_and(|tp| {
                p.members
                    .values()
                    .all(|m| tp.members.iter().any(|tm| tm.id == m.id))
            }),
        }
    })
}

impl Reconciler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            ctx,
            suspects: BTreeSet::new(),
        }
    }

    /// Runs a pass every `every` until `stop`.
    pub async fn run(mut self, every: Duration, stop: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.pass().await {
                Ok(p)
                    if p != Pass {
                        checked: p.checked,
                        ..Pass::default()
                    } =>
                {
                    tracing::info!(?p, "load balancer reconcile pass")
                }
                Ok(p) => tracing::debug!(?p, "load balancer reconcile pass"),
                Err(e) => {
                    tracing::warn!(error = %e, "load balancer reconcile pass failed; next pass retries")
                }
            }
        }
    }

    /// Clears the record of `klb` as this pass listed it: false when the handler wrote it since
    /// (a pass takes long on a large cluster, and members replaced or a load balancer rebuilt
    /// meanwhile are not what this pass judged), to be checked again in the next pass.
    async fn clear_record(&self, klb: &KuryrLoadBalancer) -> Result<bool, Error> {
        let api: Api<KuryrLoadBalancer> =
            Api::namespaced(self.ctx.kube.clone(), &klb.namespace().unwrap_or_default());
        let patch = json!({
            "metadata": {"resourceVersion": klb.resource_version()},
            "status": {"loadbalancer": null, "listeners": null, "pools": null, "members": null},
        });
        match api
            .patch(&klb.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// One pass over every deployment's load balancers.
    pub async fn pass(&mut self) -> Result<Pass, Error> {
        let mut out = Pass::default();
        let klbs = Api::<KuryrLoadBalancer>::all(self.ctx.kube.clone())
            .list(&ListParams::default())
            .await?;
        let mut known = Known::new();
        let mut errors = Vec::new();
        for klb in klbs
            .items
            .iter()
            .filter(|k| k.metadata.deletion_timestamp.is_none())
        {
            // Each load balancer is checked in the deployment its KuryrLoadBalancer records, and is
            // known there only: one of the same name in another deployment is an orphan.
            let deployment = recorded_deployment(klb);
            known.insert(
                (
                    deployment.clone(),
                    super::lb_name(&klb.namespace().unwrap_or_default(), &klb.name_any()),
                ),
                KnownLb {
                    recorded: RecordedLb::from_status(klb.status.as_ref()).map(|r| r.id),
                    vip: klb.spec.ip.clone(),
                },
            );
            // One load balancer that cannot be read or mended does not stop the others, nor the sweep.
            if let Err(e) = self.check(klb, &deployment, &mut out).await {
                errors.push(e);
            }
        }
        match self.sweep(&known).await {
            Ok(deleted) => out.orphans_deleted = deleted,
            Err(e) => errors.push(e),
        }
        Error::collect(errors).map(|()| out)
    }

    /// One KuryrLoadBalancer's load balancer: still there, not in ERROR, holding what the status
    /// records; else the record is cleared for the handler to rebuild or repair it.
    async fn check(&self, klb: &KuryrLoadBalancer, deployment: &str, out: &mut Pass) -> Result<(), Error> {
        let Some(rec) = RecordedLb::from_status(klb.status.as_ref()) else {
            return Ok(());
        };
        let Ok(client) = self.ctx.deployments.octavia(deployment) else {
            // A deployment no longer configured (drained by the handler) or without Octavia.
            return Ok(());
        };
        out.checked += 1;
        let lb = match client.get_load_balancer(&rec.id).await {
            Ok(lb) => lb,
            Err(e) if e.is_not_found() => {
                if self.clear_record(klb).await? {
                    tracing::warn!(lb = %rec.id, name = %rec.name, "load balancer deleted outside kuryr: re-creating it");
                    out.rebuilt += 1;
                }
                return Ok(());
            }
            Err(e) => return Err(Error::octavia("reconcile: reading a load balancer", e)),
        };
        if lb.provisioning_status == "ERROR" {
            tracing::warn!(lb = %rec.id, name = %rec.name, "load balancer in ERROR: replacing it");
            let actor = LbActor {
                client,
                waits: self.ctx.lb_waits(deployment)?,
                // Only deletes: creates nothing to tag.
                tags: lb.tags.clone(),
            };
            actor.delete(&rec.id).await?;
            if self.clear_record(klb).await? {
                out.rebuilt += 1;
            }
            return Ok(());
        }
        if lb.provisioning_status != "ACTIVE" {
            return Ok(());
        }
        // One upstream made and kuryr-rs adopted carries none of its tags: without them the orphan
        // sweep would never find it once its Service is gone, and each wait would read it alone.
        let (ns, name) = (klb.namespace().unwrap_or_default(), klb.name_any());
        let missing: Vec<String> = super::lb_tags(&self.ctx, &ns, &name)
            .into_iter()
            .filter(|t| !lb.tags.contains(t))
            .collect();
        if !missing.is_empty() {
            let tags: Vec<String> = lb.tags.iter().cloned().chain(missing).collect();
            let update = ResourceUpdate {
                tags: Some(tags),
                ..Default::default()
            };
            client
                .update_load_balancer(&rec.id, &update)
                .await
                .map_err(|e| Error::octavia("reconcile: tagging an adopted load balancer", e))?;
            tracing::info!(lb = %rec.id, name = %rec.name, "load balancer without kuryr-rs' tags (adopted): tagged");
            out.tagged += 1;
        }
        let tree = client
            .get_status_tree(&rec.id)
            .await
            .map_err(|e| Error::octavia("reconcile: reading a load balancer's tree", e))?;
        let actor = LbActor {
            client,
            waits: self.ctx.lb_waits(deployment)?,
            // Only deletes: creates nothing to tag.
            tags: lb.tags.clone(),
        };
        let failed = actor.delete_failed_parts(&rec.id, &tree).await?;
        if failed > 0 {
            tracing::warn!(lb = %rec.id, name = %rec.name, failed, "listeners, pools or members in ERROR deleted: making them again");
            if self.clear_record(klb).await? {
                out.repaired += 1;
            }
            return Ok(());
        }
        // An empty record of this load balancer: the handler adopts it by name and re-plans.
        if !tree_has_record(&tree, &rec) && self.clear_record(klb).await? {
            tracing::warn!(lb = %rec.id, name = %rec.name, "load balancer changed outside kuryr: repairing it");
            out.repaired += 1;
        }
        Ok(())
    }

    /// Orphans of every deployment; one deployment that cannot be swept does not stop the others.
    async fn sweep(&mut self, known: &Known) -> Result<usize, Error> {
        let mut suspects = BTreeSet::new();
        let mut deleted = 0;
        let mut errors = Vec::new();
        // Only where the cluster tag is confirmed this cluster's (cluster_claim.rs).
        for deployment in self.ctx.deployments.claimed_names() {
            match self.sweep_deployment(&deployment, known, &mut suspects).await {
                Ok(n) => deleted += n,
                Err(e) => errors.push(e),
            }
        }
        self.suspects = suspects;
        Error::collect(errors).map(|()| deleted)
    }

    /// Load balancers and pool floating IPs of `deployment` that no KuryrLoadBalancer knows, deleted
    /// once seen so in two passes.
    async fn sweep_deployment(
        &self,
        deployment: &str,
        known: &Known,
        suspects: &mut BTreeSet<String>,
    ) -> Result<usize, Error> {
        let cluster = kuryr_crds::names::neutron::cluster_tag(&self.ctx.cluster_id);
        let Ok(client) = self.ctx.deployments.octavia(deployment) else {
            return Ok(0);
        };
        let lbs = client
            .list_load_balancers(&ListFilter::new().tags([cluster.as_str()]))
            .await
            .map_err(|e| Error::octavia("orphan sweep: listing load balancers", e))?;
        let mut deleted = self.sweep_public_ips(deployment, known, suspects).await?;
        for lb in lbs {
            if known
                .get(&(deployment.to_string(), lb.name.clone()))
                .is_some_and(|k| k.owns(&lb))
                || !lb.tags.iter().any(|t| t.starts_with(super::SERVICE_TAG_PREFIX))
            {
                continue;
            }
            if self.suspects.contains(&lb.id) {
                tracing::info!(lb = %lb.id, name = %lb.name, "deleting orphaned load balancer");
                LbActor {
                    client,
                    waits: self.ctx.lb_waits(deployment)?,
                    tags: lb.tags.clone(),
                }
                .delete(&lb.id)
                .await?;
                deleted += 1;
            } else {
                suspects.insert(lb.id.clone());
            }
        }
        Ok(deleted)
    }

    /// Pool floating IPs of Services that are gone (see the module comment).
    async fn sweep_public_ips(
        &self,
        deployment: &str,
        known: &Known,
        suspects: &mut BTreeSet<String>,
    ) -> Result<usize, Error> {
        let Some(net) = self.ctx.config.service_options(deployment).external_svc_net else {
            return Ok(0);
        };
        let neutron = self.ctx.deployments.client(deployment)?;
        let fips = neutron
            .list_floatingips(&ListFilter::new().eq("floating_network_id", net))
            .await
            .map_err(|e| Error::openstack("orphan sweep: listing floating IPs", e))?;
        let mut deleted = 0;
        for fip in fips {
            let Some(service) = public_ip::service_of_description(&self.ctx.cluster_id, &fip.description)
            else {
                continue;
            };
            if known.contains_key(&(deployment.to_string(), service.to_string())) {
                continue;
            }
            if self.suspects.contains(&fip.id) {
                tracing::info!(fip = %fip.id, ip = %fip.floating_ip_address, %service, "deleting orphaned floating IP");
                match neutron.delete_floatingip(&fip.id).await {
                    Err(e) if !e.is_not_found() => {
                        return Err(Error::openstack("orphan sweep: deleting a floating IP", e));
                    }
                    _ => deleted += 1,
                }
            } else {
                suspects.insert(fip.id);
            }
        }
        Ok(deleted)
    }
}
