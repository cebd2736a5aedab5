//! `pod_label` handler: a pod whose labels or addresses change moves in or out of the policies'
//! address groups (one `add_addresses`/`remove_addresses` per group it joins or leaves, rules
//! untouched) and its port onto the groups of the policies that now select it. Also the
//! namespace-label companion: a namespace relabelled changes which pods namespaceSelectors pick,
//! the Service companion: a Service made, changed or deleted changes which addresses the
//! policies' egress rules admit in front of their peers (its VIP), and the EndpointSlice
//! companion: the backends of a Service without a selector moved.
//! They feed what they see into the driver's tracker first, so policies are decided from the
//! watched state, not from a listing of the cluster per event. The Services selected by the policies
//! whose Neutron state moved, and those a relabelled pod backs, follow ([`PolicyFollowers`]).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use tokio::sync::Mutex;

use crate::context::Context;
use crate::error::Error;
use crate::handlers::service::PolicyFollowers;
use crate::pipeline::ResourceEventHandler;
use crate::policies::{PodInfo, PolicySpec};

/// A pod's labels and addresses.
type Seen = (BTreeMap<String, String>, Vec<IpAddr>);

pub struct PodLabelHandler {
    ctx: Arc<Context>,
    followers: PolicyFollowers,
    /// What each pod looked like when last acted on (by uid): status-only updates cost nothing.
    seen: Mutex<HashMap<String, Seen>>,
}

impl PodLabelHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            followers: PolicyFollowers::new(ctx.clone()),
            ctx,
            seen: Mutex::default(),
        }
    }
}

/// The Services selecting the pods of the policies whose Neutron state changed follow them.
async fn follow(followers: &PolicyFollowers, moved: Vec<PolicySpec>) -> Result<(), Error> {
    for spec in moved {
        followers
            .refresh(&spec.key.namespace, std::slice::from_ref(&spec.pod_selector))
            .await?;
    }
    Ok(())
}

#[async_trait]
impl ResourceEventHandler for PodLabelHandler {
    type Object = Pod;

    fn name(&self) -> &'static str {
        "pod_label"
    }

    async fn on_present(&self, pod: &Pod) -> Result<(), Error> {
        let driver = &self.ctx.drivers.network_policy;
        driver.observe_pod(pod).await;
        let uid = pod.uid().unwrap_or_default();
        let info = PodInfo::from_pod(pod);
        let now = (info.labels, info.ips);
        let before = self.seen.lock().await.get(&uid).cloned();
        if before.as_ref() == Some(&now) {
            return Ok(());
        }
        // A pod relabelled into a policy where its named port makes a group variant of its own
        // waits for that group, which the reconcile below creates: moved again after it.
        let synced = driver.sync_pod_ports(pod).await;
        let (_, moved) = driver.ensure_stale().await?;
        if synced.is_err() {
            driver.sync_pod_ports(pod).await?;
        }
        follow(&self.followers, moved).await?;
        // The pod's own groups may have changed, and with them those of the Services it backs.
        if before.as_ref().map(|b| &b.0) != Some(&now.0) {
            let ns = pod.namespace().unwrap_or_default();
            let labels: Vec<&BTreeMap<String, String>> = std::iter::once(&now.0)
                .chain(before.as_ref().map(|b| &b.0))
                .collect();
            self.followers.refresh_backed_by(&ns, &labels).await?;
        }
        self.seen.lock().await.insert(uid, now);
        Ok(())
    }

    async fn on_finalize(&self, pod: &Pod) -> Result<(), Error> {
        self.on_deleted(pod).await
    }

    async fn on_deleted(&self, pod: &Pod) -> Result<(), Error> {
        // Its addresses leave every group.
        self.seen.lock().await.remove(&pod.uid().unwrap_or_default());
        let driver = &self.ctx.drivers.network_policy;
        driver.forget_pod(pod).await;
        let (_, moved) = driver.ensure_stale().await?;
        follow(&self.followers, moved).await
    }
}

/// Namespace label changes for network policies (registered with `pod_label`).
pub struct NamespaceLabelHandler {
    ctx: Arc<Context>,
    followers: PolicyFollowers,
    seen: Mutex<HashMap<String, BTreeMap<String, String>>>,
}

impl NamespaceLabelHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            followers: PolicyFollowers::new(ctx.clone()),
            ctx,
            seen: Mutex::default(),
        }
    }
}

#[async_trait]
impl ResourceEventHandler for NamespaceLabelHandler {
    type Object = Namespace;

    fn name(&self) -> &'static str {
        "namespace_label"
    }

    async fn on_present(&self, ns: &Namespace) -> Result<(), Error> {
        let driver = &self.ctx.drivers.network_policy;
        driver.observe_namespace(ns).await;
        let labels = ns.labels().clone();
        if self.seen.lock().await.get(&ns.name_any()) == Some(&labels) {
            return Ok(());
        }
        let (_, moved) = driver.ensure_stale().await?;
        follow(&self.followers, moved).await?;
        self.seen.lock().await.insert(ns.name_any(), labels);
        Ok(())
    }

    async fn on_deleted(&self, ns: &Namespace) -> Result<(), Error> {
        self.seen.lock().await.remove(&ns.name_any());
        let driver = &self.ctx.drivers.network_policy;
        driver.forget_namespace(ns).await;
        let (_, moved) = driver.ensure_stale().await?;
        follow(&self.followers, moved).await
    }
}

/// The policies' pass after what they know of a Service changed, or after an earlier pass for
/// it failed: the retry runs it again although the tracker has nothing new for it.
struct ServicePass {
    ctx: Arc<Context>,
    followers: PolicyFollowers,
    /// Services whose change reached the tracker but whose policies' pass failed.
    unsettled: Mutex<std::collections::HashSet<(String, String)>>,
}

impl ServicePass {
    fn new(ctx: Arc<Context>) -> Self {
        Self {
            followers: PolicyFollowers::new(ctx.clone()),
            ctx,
            unsettled: Mutex::default(),
        }
    }

    async fn run(&self, key: (String, String), changed: bool) -> Result<(), Error> {
        let mut unsettled = self.unsettled.lock().await;
        if !changed && !unsettled.contains(&key) {
            return Ok(());
        }
        unsettled.insert(key.clone());
        drop(unsettled);
        let driver = &self.ctx.drivers.network_policy;
        let (_, moved) = driver.ensure_stale().await?;
        follow(&self.followers, moved).await?;
        self.unsettled.lock().await.remove(&key);
        Ok(())
    }
}

/// Services for network policies (registered with `pod_label`): the policies' egress rules admit
/// a Service's VIP in front of their peers, so a Service made after a policy is admitted when it
/// comes, not at the policy's next resync; and a policy's reconcile reads the Services from
/// here instead of listing every Service of the cluster.
pub struct ServiceLabelHandler {
    ctx: Arc<Context>,
    pass: ServicePass,
}

impl ServiceLabelHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        ctx.drivers.network_policy.feed_services();
        Self {
            pass: ServicePass::new(ctx.clone()),
            ctx,
        }
    }

    async fn pass(&self, svc: &Service, changed: bool) -> Result<(), Error> {
        let key = (svc.namespace().unwrap_or_default(), svc.name_any());
        self.pass.run(key, changed).await
    }
}

#[async_trait]
impl ResourceEventHandler for ServiceLabelHandler {
    type Object = Service;

    fn name(&self) -> &'static str {
        "service_label"
    }

    async fn on_present(&self, svc: &Service) -> Result<(), Error> {
        let changed = self.ctx.drivers.network_policy.observe_service(svc).await?;
        self.pass(svc, changed).await
    }

    /// A Service being deleted (kuryr's finalizer holds it while its load balancer goes) no
    /// longer counts, as a listing leaves it out.
    async fn on_finalize(&self, svc: &Service) -> Result<(), Error> {
        let changed = self.ctx.drivers.network_policy.forget_service(svc).await;
        self.pass(svc, changed).await
    }

    async fn on_deleted(&self, svc: &Service) -> Result<(), Error> {
        let changed = self.ctx.drivers.network_policy.forget_service(svc).await;
        self.pass(svc, changed).await
    }
}

/// The EndpointSlices of Services without a selector (registered with `pod_label`): an egress
/// rule to their backends (an ipBlock around an external database, the API servers behind
/// `kubernetes.default`) admits their VIP, so a backend that moves is followed when its slice
/// changes, not at the policy's next resync. Slices the Kubernetes controller manages belong to
/// Services with a selector, whose backends are pods: skipped without a lookup.
pub struct EndpointSliceLabelHandler {
    ctx: Arc<Context>,
    pass: ServicePass,
}

impl EndpointSliceLabelHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        ctx.drivers.network_policy.feed_endpoint_slices();
        Self {
            pass: ServicePass::new(ctx.clone()),
            ctx,
        }
    }

    async fn observe(&self, slice: &EndpointSlice) -> Result<(), Error> {
        let labels = slice.labels();
        if labels.get(MANAGED_BY).map(String::as_str) == Some(SLICE_CONTROLLER) {
            return Ok(());
        }
        let Some(service) = labels.get(crate::services::endpoints::SERVICE_NAME_LABEL) else {
            return Ok(());
        };
        let ns = slice.namespace().unwrap_or_default();
        let changed = self
            .ctx
            .drivers
            .network_policy
            .observe_endpoint_slices(&ns, service)
            .await?;
        self.pass.run((ns, service.clone()), changed).await
    }
}

/// The label naming who manages an EndpointSlice, and the Kubernetes controller's value (it
/// manages the slices of Services with a selector only).
const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const SLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";

#[async_trait]
impl ResourceEventHandler for EndpointSliceLabelHandler {
    type Object = EndpointSlice;

    fn name(&self) -> &'static str {
        "endpointslice_label"
    }

    /// A deletion found by a re-list must still name its Service (a slice's label): the tracker
    /// is no longer re-read per reconcile once slices are fed.
    fn keeps_last_state(&self) -> bool {
        true
    }

    async fn on_present(&self, slice: &EndpointSlice) -> Result<(), Error> {
        self.observe(slice).await
    }

    async fn on_deleted(&self, slice: &EndpointSlice) -> Result<(), Error> {
        self.observe(slice).await
    }
}
