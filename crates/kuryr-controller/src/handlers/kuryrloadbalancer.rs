//! `kuryrloadbalancer` handler: makes Octavia hold what a KuryrLoadBalancer's spec asks for and records it in
//! the status (upstream's layout), with the fewest calls (`crate::services::plan`). On deletion the load
//! balancer goes with everything under it (one cascade delete), then the Service's finalizer.
//!
//! Crash safety: before creating, a load balancer with the Service's name and VIP is looked up and adopted,
//! so a controller killed between Octavia's answer and the status write never makes a second one.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kuryr_config::MemberMode;
use kuryr_crds::names::finalizers;
use kuryr_crds::{KuryrLoadBalancer, KuryrLoadBalancerStatus};
use serde_json::json;

use crate::context::Context;
use crate::error::{Error, is_not_found};
use crate::k8s::{add_finalizer, remove_finalizer, surface_user_error};
use crate::locked::Locked;
use crate::pipeline::ResourceEventHandler;
use crate::placement::record::recorded_deployment;
use crate::services::desired::{self, DesiredLb, Inputs, MemberSubnets};
use crate::services::octavia::{LbActor, Refused};
use crate::services::plan::{ListenerKey, plan};
use crate::services::public_ip::{self, External, PublicIps};
use crate::services::recorded::RecordedLb;
use crate::services::{lb_name, lb_tags, service_tag};

pub struct KuryrLoadBalancerHandler {
    ctx: Arc<Context>,
    /// Listeners Octavia refused, per KuryrLoadBalancer uid, with what was asked ([`asked`]): not
    /// asked for again while the spec asks the same (the Warning Event told the user; asking again
    /// would only repeat it), asked again once the user changed it (a fixed timeout annotation).
    refused: Mutex<HashMap<String, BTreeMap<ListenerKey, String>>>,
    /// `[pod_vif_nested] worker_nodes_subnets` of each deployment, with their CIDRs (read once).
    node_subnets: tokio::sync::Mutex<HashMap<String, Vec<(ipnet::IpNet, String)>>>,
    /// Endpoints left out for want of a member subnet, per KuryrLoadBalancer uid, as last told.
    skipped: Mutex<HashMap<String, BTreeSet<String>>>,
    /// KuryrLoadBalancers whose public IP was seen on the recorded VIP port since this process
    /// started and since their last failed pass. A pass that rebuilt the load balancer and failed
    /// (or crashed) before re-pointing the IP leaves a record that already names the new VIP
    /// port: only looking at the IP finds it detached.
    ip_checked: Mutex<HashSet<String>>,
    /// When a KuryrLoadBalancer (uid) first left endpoints waiting for their namespace's network.
    waiting_since: Mutex<HashMap<String, std::time::Instant>>,
}

impl KuryrLoadBalancerHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            ctx,
            refused: Mutex::default(),
            node_subnets: tokio::sync::Mutex::default(),
            skipped: Mutex::default(),
            ip_checked: Mutex::default(),
            waiting_since: Mutex::default(),
        }
    }

    /// The worker nodes' subnets in `deployment` (the members of host-network pods in L2 member
    /// mode). One a deployment does not have is left out, with a warning the first time.
    async fn node_subnets(&self, deployment: &str) -> Result<Vec<(ipnet::IpNet, String)>, Error> {
        let mut cache = self.node_subnets.lock().await;
        if let Some(known) = cache.get(deployment) {
            return Ok(known.clone());
        }
        let client = self.ctx.deployments.client(deployment)?;
        let mut found = Vec::new();
        for id in &self.ctx.config.pod_vif_nested.worker_nodes_subnets {
            match client.get_subnet(id).await {
                Ok(s) => match s.cidr.parse::<ipnet::IpNet>() {
                    Ok(net) => found.push((net, s.id)),
                    Err(e) => {
                        tracing::warn!(subnet = %id, cidr = %s.cidr, error = %e, "worker node subnet with an unreadable cidr")
                    }
                },
                Err(e) if e.is_not_found() => {
                    tracing::warn!(subnet = %id, deployment, "[pod_vif_nested] worker_nodes_subnets entry not found in this deployment")
                }
                Err(e) => return Err(Error::openstack("reading a worker nodes' subnet", e)),
            }
        }
        cache.insert(deployment.to_string(), found.clone());
        Ok(found)
    }

    fn tags(&self, klb: &KuryrLoadBalancer) -> Vec<String> {
        lb_tags(&self.ctx, &klb.namespace().unwrap_or_default(), &klb.name_any())
    }

    /// Whether `klb`'s deployment is still configured; when it is not, says so on the Service (what
    /// was left there) and the caller lets go of the object: nothing can reach that cloud any more.
    async fn configured(&self, klb: &KuryrLoadBalancer, deployment: &str) -> bool {
        if self.ctx.deployments.client(deployment).is_ok() {
            return true;
        }
        let lb = klb
            .status
            .as_ref()
            .and_then(|s| s.loadbalancer.as_ref())
            .map(|lb| lb.id.as_str())
            .unwrap_or("-");
        let msg = format!(
            "OpenStack deployment {deployment:?} is no longer configured: load balancer {lb} was left in it"
        );
        tracing::warn!(klb = %format!("{}/{}", klb.namespace().unwrap_or_default(), klb.name_any()), deployment, "{msg}");
        self.event(klb, true, "DeploymentRemoved", &msg).await;
        false
    }

    /// The Service this KuryrLoadBalancer stands for, as an Event's subject (Events go to the Service, where
    /// users look, as upstream did).
    fn service_ref(klb: &KuryrLoadBalancer) -> ObjectReference {
        let uid = klb
            .owner_references()
            .iter()
            .find(|r| r.kind == "Service")
            .map(|r| r.uid.clone());
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            name: Some(klb.name_any()),
            namespace: klb.namespace(),
            uid,
            ..Default::default()
        }
    }

    async fn event(&self, klb: &KuryrLoadBalancer, warning: bool, reason: &str, note: &str) {
        let r = Self::service_ref(klb);
        if let Err(e) = kuryr_crds::events::publish(&self.ctx.events, &r, warning, reason, note, reason).await
        {
            tracing::warn!(reason, error = %e, "could not record event");
        }
    }

    /// Member subnets: the VIP subnet in L3 mode (routed), the pod's own subnet in L2 mode. Also the
    /// namespaces of endpoints whose network is not known yet (L2 with per-namespace subnets): their
    /// members are left out of this pass, which the caller retries for them once it is done, so one
    /// such endpoint does not hold up the others (upstream skipped the member too).
    async fn desired(
        &self,
        klb: &KuryrLoadBalancer,
        deployment: &str,
    ) -> Result<(DesiredLb, BTreeSet<String>), Error> {
        let ns = klb.namespace().unwrap_or_default();
        let name = klb.name_any();
        let vip_subnet = klb.spec.subnet_id.clone().unwrap_or_default();
        let mut subnets: Vec<(ipnet::IpNet, String)> = Vec::new();
        let mut waiting = BTreeSet::new();
        if self.ctx.config.octavia_defaults.member_mode == MemberMode::L2 {
            let namespaces: BTreeSet<String> = klb
                .spec
                .endpoint_slices
                .iter()
                .flat_map(|s| &s.endpoints)
                .filter_map(|e| e.target_ref.as_ref().and_then(|r| r.namespace.clone()))
                .chain(std::iter::once(ns.clone()))
                .collect();
            for pod_ns in namespaces {
                let found = self
                    .ctx
                    .drivers
                    .subnets
                    .network_for_namespace(deployment, &pod_ns)
                    .await;
                // The Service's own namespace without a network yet: the whole pass waits for it, as
                // its pods do. Another namespace's endpoints wait alone.
                let info = match found {
                    Err(e) if pod_ns != ns && matches!(e, Error::ResourceNotReady(_) | Error::Gone(_)) => {
                        tracing::debug!(namespace = %pod_ns, error = %e, "endpoints of a namespace without a known network wait");
                        waiting.insert(pod_ns);
                        continue;
                    }
                    found => found?,
                };
                for s in &info.subnets {
                    if let Ok(net) = s.cidr.parse::<ipnet::IpNet>() {
                        subnets.push((net, s.id.clone()));
                    }
                }
            }
        }
        // L2 with no pod subnet known falls back to L3 rather than serving nothing.
        let member_subnets = if subnets.is_empty() {
            MemberSubnets::Vip(vip_subnet)
        } else {
            subnets.extend(self.node_subnets(deployment).await?);
            MemberSubnets::Pod(subnets)
        };
        let member_subnet = |ip: &str| member_subnets.of(ip);
        let algorithm = self.ctx.config.octavia_defaults.lb_algorithm.as_str().to_string();
        let mut d = desired::desired(
            &klb.spec,
            &Inputs {
                namespace: &ns,
                name: &name,
                lb_algorithm: &algorithm,
                member_subnet: &member_subnet,
            },
        )?;
        if let Some(refused) = self.refused.locked().get(&klb.uid().unwrap_or_default()) {
            d.listeners
                .retain(|k, l| refused.get(k).is_none_or(|was| *was != asked(l)));
        }
        self.tell_skipped(klb, &d.skipped, &waiting).await;
        Ok((d, waiting))
    }

    /// A `KuryrSkipMember` Warning Event (upstream's) on the Service when endpoints are left out for
    /// want of a member subnet, once per change of what is left out.
    async fn tell_skipped(
        &self,
        klb: &KuryrLoadBalancer,
        skipped: &BTreeSet<String>,
        waiting: &BTreeSet<String>,
    ) {
        let uid = klb.uid().unwrap_or_default();
        let fresh = {
            let mut told = self.skipped.locked();
            if skipped.is_empty() {
                told.remove(&uid);
                false
            } else {
                told.insert(uid, skipped.clone()).as_ref() != Some(skipped)
            }
        };
        if fresh {
            let list: Vec<&str> = skipped.iter().map(String::as_str).collect();
            let msg = if waiting.is_empty() {
                format!(
                    "Endpoints {} of Service {}/{} are on no pod subnet and no [pod_vif_nested] worker_nodes_subnets \
                     subnet: no member is made for them (member_mode = L2)",
                    list.join(", "),
                    klb.namespace().unwrap_or_default(),
                    klb.name_any()
                )
            } else {
                let namespaces: Vec<&str> = waiting.iter().map(String::as_str).collect();
                format!(
                    "Endpoints {} of Service {}/{} are on no subnet known yet: no member is made for them \
                     (member_mode = L2); namespaces {} have no network yet (KuryrNetwork): their endpoints join \
                     once it has a subnet",
                    list.join(", "),
                    klb.namespace().unwrap_or_default(),
                    klb.name_any(),
                    namespaces.join(", ")
                )
            };
            tracing::warn!("{msg}");
            self.event(klb, true, "KuryrSkipMember", &msg).await;
        }
    }

    fn public_ips<'a>(&'a self, klb: &KuryrLoadBalancer, deployment: &str) -> Result<PublicIps<'a>, Error> {
        let options = self.ctx.config.service_options(deployment);
        Ok(PublicIps {
            neutron: self.ctx.deployments.client(deployment)?,
            external: External {
                network: options.external_svc_net,
                subnet: options.external_svc_subnet,
            },
            tags: self.tags(klb),
            description: public_ip::description(
                &self.ctx.cluster_id,
                &klb.namespace().unwrap_or_default(),
                &klb.name_any(),
            ),
        })
    }

    /// Brings `status.service_pub_ip_info` to what the spec asks for.
    async fn reconcile_public_ip(
        &self,
        klb: &KuryrLoadBalancer,
        deployment: &str,
        status: &mut KuryrLoadBalancerStatus,
        vip_moved: bool,
    ) -> Result<(), Error> {
        let step = public_ip::decide(
            klb.spec.type_.as_deref(),
            klb.spec.lb_ip.as_deref(),
            status.service_pub_ip_info.as_ref(),
        );
        let want = match step {
            public_ip::Step::Nothing => {
                let vip_port = status.loadbalancer.as_ref().map(|lb| lb.port_id.clone());
                let uid = klb.uid().unwrap_or_default();
                let checked = self.ip_checked.locked().contains(&uid);
                if klb.spec.type_.as_deref() != Some("LoadBalancer") {
                    // No LoadBalancer (any more), no public IP recorded, and still one may exist:
                    // made by a controller killed before recording it, then the type changed. It
                    // keeps the Service reachable from outside and the orphan sweep spares it while
                    // the Service exists: looked for once per term (a list only where
                    // `external_svc_net` is set) and deleted.
                    if !checked {
                        self.public_ips(klb, deployment)?.release_own().await?;
                        self.ip_checked.locked().insert(uid);
                    }
                    return Ok(());
                }
                if let (Some(info), Some(port)) = (status.service_pub_ip_info.clone(), vip_port)
                    && !port.is_empty()
                    && (vip_moved || !checked)
                {
                    if !self.public_ips(klb, deployment)?.ensure_on(&info, &port).await? {
                        // Deleted behind kuryr's back: the next pass acquires another.
                        status.service_pub_ip_info = None;
                        return Err(Error::not_ready(format!(
                            "public IP {} of the load balancer is gone",
                            info.ip_addr
                        )));
                    }
                    self.ip_checked.locked().insert(uid);
                }
                return Ok(());
            }
            public_ip::Step::Release(old) => {
                let vip_port = status.loadbalancer.as_ref().map(|lb| lb.port_id.as_str());
                self.public_ips(klb, deployment)?.release(&old, vip_port).await?;
                status.service_pub_ip_info = None;
                return Ok(());
            }
            public_ip::Step::Acquire(want) => want,
            public_ip::Step::Replace { old, new } => {
                let ips = self.public_ips(klb, deployment)?;
                let vip_port = status.loadbalancer.as_ref().map(|lb| lb.port_id.as_str());
                // The new one is looked up before the old one goes: a loadBalancerIP that names
                // no free floating IP is an error on the Service, which keeps its address.
                ips.check_wanted(&new, vip_port.unwrap_or_default()).await?;
                ips.release(&old, vip_port).await?;
                status.service_pub_ip_info = None;
                new
            }
        };
        let driver = self.ctx.config.kubernetes.service_public_ip_driver.as_str();
        if driver != "neutron_floating_ip" {
            return Err(Error::invalid(
                "[kubernetes] service_public_ip_driver",
                format!(
                    "{driver:?} is not a public IP driver kuryr-rs has (upstream's: neutron_floating_ip)"
                ),
            ));
        }
        let vip_port = status
            .loadbalancer
            .as_ref()
            .map(|lb| lb.port_id.clone())
            .unwrap_or_default();
        if vip_port.is_empty() {
            // No load balancer yet: its VIP port is what the floating IP goes to.
            return Ok(());
        }
        let project = klb.spec.project_id.clone().unwrap_or_default();
        let info = self
            .public_ips(klb, deployment)?
            .acquire(&want, &project, &vip_port)
            .await?;
        status.service_pub_ip_info = Some(info);
        Ok(())
    }

    /// The Service's `status.loadBalancer.ingress`: the public IP, or nothing.
    async fn write_service_ingress(&self, klb: &KuryrLoadBalancer, ip: Option<&str>) -> Result<(), Error> {
        let api: Api<Service> = Api::namespaced(self.ctx.kube.clone(), &klb.namespace().unwrap_or_default());
        let Some(svc) = api.get_opt(&klb.name_any()).await? else {
            return Ok(());
        };
        let current: Vec<String> = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .map(|i| i.iter().filter_map(|x| x.ip.clone()).collect())
            .unwrap_or_default();
        let wanted: Vec<String> = ip.map(str::to_string).into_iter().collect();
        if current == wanted {
            return Ok(());
        }
        let ingress: Vec<_> = wanted.iter().map(|ip| json!({ "ip": ip })).collect();
        let patch = json!({ "status": { "loadBalancer": { "ingress": ingress } } });
        match api
            .patch_status(&klb.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// After a failed pass: what it made before failing (a listener, its pool) is in Octavia but
    /// not in the record, and planned again from the record it would be created again, which
    /// Octavia refuses (409, the port is taken) for ever. The tree is read back into the record
    /// instead, so the next pass plans from what is there. Best effort: the pass' own error is
    /// what is retried.
    async fn record_what_octavia_has(
        &self,
        actor: &LbActor<'_>,
        klb: &KuryrLoadBalancer,
        desired: &DesiredLb,
    ) {
        let read = async {
            let Some(lb) = actor.find(desired).await? else {
                return Ok(None);
            };
            actor.read_found(&lb, desired).await.map(Some)
        };
        match read.await {
            Ok(Some(mut recorded)) => {
                // What the pass may not have sent is not recorded as done.
                if let Some(prev) = RecordedLb::from_status(klb.status.as_ref()) {
                    recorded.unshown_from(&prev);
                }
                let mut status = klb.status.clone().unwrap_or_default();
                recorded.write_status(&mut status);
                if let Err(e) = self.write_status(klb, &status).await {
                    tracing::debug!(klb = %klb.name_any(), error = %e, "could not record the load balancer after a failed pass");
                }
            }
            Ok(None) => self.forget_gone_lb(actor, klb).await,
            Err(e) => {
                tracing::debug!(klb = %klb.name_any(), error = %e, "could not read the load balancer back after a failed pass");
            }
        }
    }

    /// No usable load balancer is there (one in ERROR was just deleted, or one was deleted by
    /// hand mid-pass): while the record names the gone one, every retry acts on its listeners and
    /// pools, and Octavia's 404 is not retried. The record is dropped (the public IP kept) so that
    /// the retry builds a new one. A recorded load balancer that still stands (a replacement
    /// whose delete failed) stays recorded: forgetting it would leak it.
    async fn forget_gone_lb(&self, actor: &LbActor<'_>, klb: &KuryrLoadBalancer) {
        let Some(rec) = RecordedLb::from_status(klb.status.as_ref()) else {
            return;
        };
        let gone = match actor.client.get_load_balancer(&rec.id).await {
            Ok(lb) => matches!(lb.provisioning_status.as_str(), "DELETED" | "PENDING_DELETE"),
            Err(e) => e.is_not_found(),
        };
        if !gone {
            return;
        }
        tracing::info!(klb = %klb.name_any(), lb = %rec.id, "the recorded load balancer is gone: building another");
        let mut status = klb.status.clone().unwrap_or_default();
        status.loadbalancer = None;
        status.listeners.clear();
        status.pools.clear();
        status.members.clear();
        if let Err(e) = self.write_status(klb, &status).await {
            tracing::debug!(klb = %klb.name_any(), error = %e, "could not drop the record of a gone load balancer");
        }
    }

    async fn write_status(
        &self,
        klb: &KuryrLoadBalancer,
        status: &KuryrLoadBalancerStatus,
    ) -> Result<(), Error> {
        let api: Api<KuryrLoadBalancer> =
            Api::namespaced(self.ctx.kube.clone(), &klb.namespace().unwrap_or_default());
        let mut status =
            serde_json::to_value(status).map_err(|e| Error::serialization("KuryrLoadBalancer status", e))?;
        if let Some(map) = status.as_object_mut() {
            // A merge patch keeps what it does not mention: what the record no longer has (a
            // released public IP, the last member of a Service gone to no endpoints) is cleared.
            for key in [
                "listeners",
                "loadbalancer",
                "members",
                "pools",
                "service_pub_ip_info",
            ] {
                map.entry(key).or_insert(serde_json::Value::Null);
            }
        }
        let patch = json!({ "status": status });
        match api
            .patch(&klb.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[async_trait]
impl ResourceEventHandler for KuryrLoadBalancerHandler {
    type Object = KuryrLoadBalancer;

    fn name(&self) -> &'static str {
        "kuryrloadbalancer"
    }

    /// One pass may wait a whole `lbaas_activation_timeout` for an amphora to boot.
    fn longest_wait(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.ctx.config.neutron_defaults.lbaas_activation_timeout)
    }

    async fn on_present(&self, klb: &KuryrLoadBalancer) -> Result<(), Error> {
        let result = self.present(klb).await;
        surface_user_error(&self.ctx.events, &Self::service_ref(klb), result).await
    }

    async fn on_finalize(&self, klb: &KuryrLoadBalancer) -> Result<(), Error> {
        self.finalize(klb).await
    }
}

/// How long a pass that left endpoints waiting for their namespace's network is retried (with
/// the pipeline's backoff) for them; after that they join at the next pass (any event of the
/// KuryrLoadBalancer, the periodic resync), and nothing fails: the network may never come (its
/// namespace's own handler reports why), and a retry given up is an ERROR.
const WAITING_RETRIED: std::time::Duration = std::time::Duration::from_secs(60);

impl KuryrLoadBalancerHandler {
    async fn present(&self, klb: &KuryrLoadBalancer) -> Result<(), Error> {
        let mut klb = add_finalizer(&self.ctx.kube, klb, finalizers::KURYRLOADBALANCER).await?;
        let deployment = recorded_deployment(&klb);
        if !self.configured(&klb, &deployment).await {
            return Ok(());
        }
        let client = self.ctx.deployments.octavia(&deployment)?;
        let (mut desired, mut waiting) = self.desired(&klb, &deployment).await?;
        let mut recorded = RecordedLb::from_status(klb.status.as_ref());
        let mut steps = plan(recorded.as_ref(), &desired);
        if !steps.is_empty() {
            // The event may carry a stale record: a periodic resync lists every object and queues it
            // behind the run in flight, which then writes a newer status; acting on the listed copy
            // repeated that run's Octavia writes (the real Octavia: 106 batch member updates for 100
            // endpoint changes). Before writing to Octavia, plan against the object as it is now.
            let api: Api<KuryrLoadBalancer> =
                Api::namespaced(self.ctx.kube.clone(), &klb.namespace().unwrap_or_default());
            let Some(now) = api.get_opt(&klb.name_any()).await? else {
                return Ok(());
            };
            if now.resource_version() != klb.resource_version() {
                if now.metadata.deletion_timestamp.is_some() {
                    return Ok(());
                }
                klb = now;
                (desired, waiting) = self.desired(&klb, &deployment).await?;
                recorded = RecordedLb::from_status(klb.status.as_ref());
                steps = plan(recorded.as_ref(), &desired);
            }
        }
        if steps.is_empty() {
            self.present_public_ip(&klb, &deployment, None).await?;
            return self.still_waiting(&klb, &waiting);
        }
        tracing::debug!(klb = %format!("{}/{}", klb.namespace().unwrap_or_default(), klb.name_any()), ?steps, "reconciling load balancer");
        let actor = LbActor {
            client,
            waits: self.ctx.lb_waits(&deployment)?,
            tags: self.tags(&klb),
        };
        let had_lb = recorded.is_some();
        let mut refused = Vec::new();
        let result = actor.apply(recorded, &desired, &steps, &mut refused).await;
        self.note_refused(&klb, &desired, &refused).await;
        let applied = match result {
            Ok(applied) => applied,
            Err(e) => {
                self.unchecked(&klb);
                // A pool or listener Octavia put in ERROR under an ACTIVE load balancer refuses
                // every write for good: deleted now, made again by the retry (the periodic
                // reconcile would only find it minutes later, every member update failing meanwhile).
                let repaired = match &e {
                    Error::LoadBalancer { source, .. } if source.is_immutable() => {
                        match actor.repair_failed_parts(&desired).await {
                            Ok(n) => n,
                            Err(r) => {
                                tracing::debug!(klb = %klb.name_any(), error = %r, "could not look for parts in ERROR");
                                0
                            }
                        }
                    }
                    _ => 0,
                };
                self.record_what_octavia_has(&actor, &klb, &desired).await;
                if repaired > 0 {
                    tracing::warn!(klb = %klb.name_any(), repaired, error = %e, "listeners, pools or members in ERROR deleted: making them again");
                    return Err(Error::not_ready(format!(
                        "{repaired} parts of the load balancer in ERROR deleted, the retry makes them again: {e}"
                    )));
                }
                // A recorded part deleted outside kuryr (a pool, the load balancer): the record was
                // just made to say what Octavia has, and the retry builds the rest. Not an error.
                if let Error::LoadBalancer { source, .. } = &e
                    && source.is_not_found()
                {
                    return Err(Error::not_ready(format!(
                        "part of the load balancer is gone, the retry makes it again: {e}"
                    )));
                }
                return Err(e);
            }
        };
        // A port served now is asked for again after a later change back to what was refused
        // before (only the last refusal of a port stands).
        if let Some(refused) = self.refused.locked().get_mut(&klb.uid().unwrap_or_default()) {
            refused.retain(|k, _| !applied.recorded.listeners.contains_key(k));
        }
        let mut status = klb.status.clone().unwrap_or_default();
        applied.recorded.write_status(&mut status);
        self.write_status(&klb, &status).await?;
        let public = self.present_public_ip(&klb, &deployment, Some(status)).await;
        // Asked again at each pass (the record keeps what the pool has): the Events fold into a series.
        for k in &applied.kept_persistence {
            self.event(
                &klb,
                true,
                "KuryrSessionAffinityUnsupported",
                &format!(
                    "Service port {}/{} keeps its session affinity: Octavia refused the change: {}",
                    k.key.1, k.key.0, k.reason
                ),
            )
            .await;
        }
        if applied.created || !had_lb {
            self.event(&klb, false, "KuryrEnsuredLB", "Load balancer provisioned")
                .await;
        }
        public?;
        self.still_waiting(&klb, &waiting)
    }

    /// Ports the provider refused in a pass (also one that failed later): not asked for again
    /// while the spec asks the same, and a Warning Event on the Service for each.
    async fn note_refused(&self, klb: &KuryrLoadBalancer, desired: &DesiredLb, refused: &[Refused]) {
        for r in refused {
            self.refused
                .locked()
                .entry(klb.uid().unwrap_or_default())
                .or_default()
                .insert(
                    r.key.clone(),
                    desired.listeners.get(&r.key).map(asked).unwrap_or_default(),
                );
            self.event(
                klb,
                true,
                "KuryrServicePortUnsupported",
                &format!(
                    "Service port {}/{} is not served: Octavia refused {}",
                    r.key.1, r.key.0, r.reason
                ),
            )
            .await;
        }
    }

    /// A pass that served what it could and left endpoints waiting for their namespace's
    /// network: retried for them for [`WAITING_RETRIED`] from the first such pass.
    fn still_waiting(&self, klb: &KuryrLoadBalancer, waiting: &BTreeSet<String>) -> Result<(), Error> {
        let uid = klb.uid().unwrap_or_default();
        let mut since = self.waiting_since.locked();
        if waiting.is_empty() {
            since.remove(&uid);
            return Ok(());
        }
        let first = *since.entry(uid).or_insert_with(std::time::Instant::now);
        let list: Vec<&str> = waiting.iter().map(String::as_str).collect();
        if first.elapsed() < WAITING_RETRIED {
            return Err(Error::not_ready(format!(
                "endpoints in namespaces {} wait for their KuryrNetwork",
                list.join(", ")
            )));
        }
        tracing::debug!(namespaces = %list.join(", "), "endpoints still wait for their namespace's network: left to the next pass");
        Ok(())
    }

    /// The public IP part of `present`, on `status` as just written (or as the object has it).
    async fn present_public_ip(
        &self,
        klb: &KuryrLoadBalancer,
        deployment: &str,
        status: Option<KuryrLoadBalancerStatus>,
    ) -> Result<(), Error> {
        let mut status = status.unwrap_or_else(|| klb.status.clone().unwrap_or_default());
        let before = status.service_pub_ip_info.clone();
        let port_of = |s: Option<&KuryrLoadBalancerStatus>| {
            s.and_then(|s| s.loadbalancer.as_ref())
                .map(|lb| lb.port_id.clone())
        };
        // A load balancer replaced or rebuilt (deleted by hand, in ERROR) has a new VIP port.
        let vip_moved = port_of(klb.status.as_ref()) != port_of(Some(&status));
        let result = self
            .reconcile_public_ip(klb, deployment, &mut status, vip_moved)
            .await;
        if status.service_pub_ip_info != before {
            self.write_status(klb, &status).await?;
        }
        // The ingress follows the status even when the pass failed: an address released (replaced by
        // one whose acquire failed) must not stay advertised, as it may soon be another tenant's. A
        // Service kuryr gives no address (no external network configured, an unknown driver) keeps
        // what another implementation advertises for it.
        let ip = status.service_pub_ip_info.as_ref().map(|i| i.ip_addr.as_str());
        let offered = result.is_ok() && klb.spec.type_.as_deref() == Some("LoadBalancer");
        if ip.is_some() || before.is_some() || offered {
            self.write_service_ingress(klb, ip).await?;
        }
        if result.is_err() {
            self.unchecked(klb);
        }
        result
    }

    /// The public IP is looked at again in the next pass.
    fn unchecked(&self, klb: &KuryrLoadBalancer) {
        self.ip_checked.locked().remove(&klb.uid().unwrap_or_default());
    }

    async fn finalize(&self, klb: &KuryrLoadBalancer) -> Result<(), Error> {
        let ns = klb.namespace().unwrap_or_default();
        let name = klb.name_any();
        let deployment = recorded_deployment(klb);
        if !self.configured(klb, &deployment).await {
            return self.release_finalizers(klb).await;
        }
        let client = self.ctx.deployments.octavia(&deployment)?;
        let actor = LbActor {
            client,
            waits: self.ctx.lb_waits(&deployment)?,
            tags: self.tags(klb),
        };
        // The public IP first: a pool one is deleted, a user one given back (disassociated); one a crash
        // left unrecorded is found by its description.
        let ips = self.public_ips(klb, &deployment)?;
        let recorded_ip = klb.status.as_ref().and_then(|s| s.service_pub_ip_info.as_ref());
        if let Some(info) = recorded_ip {
            let vip_port = klb
                .status
                .as_ref()
                .and_then(|s| s.loadbalancer.as_ref())
                .map(|lb| lb.port_id.as_str());
            ips.release(info, vip_port).await?;
        }
        let had_ip = ips.release_own().await? > 0 || recorded_ip.is_some();
        // A Service that stays (made NodePort or ExternalName) no longer has that address. Only
        // what kuryr wrote is cleared: another class' implementation owns its own ingress.
        if had_ip {
            self.write_service_ingress(klb, None).await?;
        }
        if let Some(rec) = RecordedLb::from_status(klb.status.as_ref()) {
            actor.delete(&rec.id).await?;
        }
        // One made before a crash that never reached the status.
        let lbs = client
            .list_load_balancers(&kuryr_neutron::ListFilter::new().name(lb_name(&ns, &name)))
            .await
            .map_err(|e| Error::octavia("looking up load balancers to release", e))?;
        // This cluster's by both tags (another cluster's Service of the same name in the same
        // project has its own cluster tag), and only where that tag is this cluster's.
        let ours = service_tag(&ns, &name);
        let cluster = kuryr_crds::names::neutron::cluster_tag(&self.ctx.cluster_id);
        for lb in lbs
            .iter()
            .filter(|lb| lb.tags.contains(&ours) && lb.tags.contains(&cluster))
        {
            self.ctx.deployments.adoptable(&deployment, || {
                format!("load balancer {} of Service {ns}/{name}", lb.id)
            })?;
            actor.delete(&lb.id).await?;
        }
        self.release_finalizers(klb).await
    }

    /// The KuryrLoadBalancer's finalizer, then its Service's.
    async fn release_finalizers(&self, klb: &KuryrLoadBalancer) -> Result<(), Error> {
        remove_finalizer(&self.ctx.kube, klb, finalizers::KURYRLOADBALANCER).await?;
        let uid = klb.uid().unwrap_or_default();
        self.refused.locked().remove(&uid);
        self.skipped.locked().remove(&uid);
        self.waiting_since.locked().remove(&uid);
        self.unchecked(klb);
        let services: Api<Service> =
            Api::namespaced(self.ctx.kube.clone(), &klb.namespace().unwrap_or_default());
        if let Some(svc) = services.get_opt(&klb.name_any()).await? {
            remove_finalizer(&self.ctx.kube, &svc, finalizers::SERVICE).await?;
        }
        Ok(())
    }
}

/// What a listener asks of Octavia, its members aside (they change without making a refused
/// listener acceptable).
fn asked(l: &crate::services::desired::DesiredListener) -> String {
    let mut l = l.clone();
    l.pool.members.clear();
    format!("{l:?}")
}
