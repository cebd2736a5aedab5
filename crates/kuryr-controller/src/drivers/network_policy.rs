//! `network_policy` driver: acts on what [`crate::policies`] decides. It reads the cluster into a
//! [`ClusterIndex`], reads a policy's security groups and address groups back from Neutron,
//! applies the diff, and keeps pods' ports on the groups of the policies that select them.
//!
//! Ownership in Neutron: every group of a policy has the description `kuryr-rs:<cluster
//! id>:<policy uid>`. Security groups also carry the cluster's resource tags plus
//! `kuryr-rs.knp=<policy uid>` and `kuryr-rs.variant=<variant>`; neutron refuses tags in the
//! create call, so a crash between create and tag leaves a group found by its description only,
//! which the next reconcile deletes. Address groups cannot carry tags at all; their name is the
//! model's key.
//!
//! Deployments: a policy's groups live in the one OpenStack deployment its KuryrNetworkPolicy
//! records (`openstack.org/kuryr-deployment`, set when the `policy` handler creates it, where the
//! namespace's pods are). Every apply, release and sweep goes there; a pod's port gets the groups
//! of its own port's deployment, since a group id of one cloud names nothing in another.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use kuryr_config::KuryrConfig;
use kuryr_crds::{KuryrNetworkPolicy, KuryrPort};
use kuryr_neutron::{
    AddressGroupCreate, ListFilter, NeutronClient, SecurityGroup, SecurityGroupCreate, SecurityGroupRule,
    SecurityGroupRuleCreate,
};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::drivers::address_groups::set_addresses;
use crate::drivers::port_groups::{Change, PortGroups};
use crate::drivers::project::ProjectDriver;
use crate::drivers::vif::ports_by_ids;
use crate::error::Error;
use crate::keyed_locks::{KeyedLocks, Turn};
use crate::locked::Locked;
use crate::openstack::{DEFAULT_DEPLOYMENT, Deployments};
use crate::placement::Binder;
use crate::placement::record::recorded_deployment;
use crate::policies::desired::BASE_VARIANT;
use crate::policies::{
    ActualGroup, ActualPolicy, AgKey, Cidr, ClusterIndex, DesiredPolicy, Direction, EtherType, Op, Options,
    PodInfo, PodSecurity, PolicyKey, PolicySpec, PolicyTracker, Protocol, Remote, Rule, ServiceInfo, desired,
    diff, pod_security,
};
use crate::pool::PoolManager;
use crate::wiring::record::recorded_vifs;

const TAG_POLICY: &str = "kuryr-rs.knp=";
const TAG_VARIANT: &str = "kuryr-rs.variant=";
const TAG_OPEN: &str = "kuryr-rs.np-open=";

/// What one reconcile of a policy left in Neutron.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    /// Security group id by variant.
    pub groups: BTreeMap<String, String>,
    /// The rules as Neutron holds them now, of every variant.
    pub rules: Vec<SecurityGroupRule>,
    pub notes: Vec<String>,
    /// Neutron writes this reconcile made.
    pub writes: usize,
}

pub struct NetworkPolicyDriver {
    kube: Client,
    deployments: Deployments,
    config: Arc<KuryrConfig>,
    tags: Vec<String>,
    cluster_id: String,
    /// The model's options, made on first use: their `host_cidrs` (ingress always allowed on
    /// isolated pods) are the CIDRs of `[pod_vif_nested] worker_nodes_subnets` (kubelet probes
    /// come from the nodes) and, with `[octavia_defaults] enforce_sg_rules`, of the service
    /// subnet (upstream's `_get_default_np_rules`), read from Neutron.
    options: tokio::sync::OnceCell<Options>,
    /// `[kubernetes] network_policy_project_driver`: the project of a policy's groups.
    projects: Arc<dyn ProjectDriver>,
    /// Maps a project to its id in each deployment (deployments with their own Keystone).
    placement: Option<Arc<Binder>>,
    /// The allow-all groups by (deployment, project id there, direction).
    open_groups: Mutex<HashMap<(String, String, &'static str), String>>,
    /// The deployment each policy's groups live in (by policy uid), as its KuryrNetworkPolicy
    /// records it: learned when the policy is ensured, and from one listing with the tracker.
    placed: Mutex<HashMap<String, String>>,
    /// The cluster and the live policies as the watches report them (filled by one listing on
    /// first use), and what each policy's last reconcile applied.
    tracker: Mutex<Option<PolicyTracker>>,
    /// One reconcile per policy at a time: the `kuryrnetworkpolicy` and `pod_label` handlers
    /// both reconcile policies, and two at once would both create the same groups.
    locks: KeyedLocks<String>,
    /// The port pools, keyed by sets of groups: a deleted group's pools go with it.
    pools: Option<Arc<PoolManager>>,
    /// Ports' group changes, one per port at a time; a group is deleted once none naming it runs.
    /// Shared with the releases of ports ([`Self::with_port_groups`]).
    port_groups: Arc<PortGroups>,
    /// Policies whose reconcile failed for a reason only their owner or an operator can mend
    /// (a quota, a deployment no longer configured), by uid, and until when the pod and
    /// namespace events leave them to their own handler's retries.
    held: std::sync::Mutex<HashMap<String, std::time::Instant>>,
    /// Whether Service events reach [`Self::observe_service`] (the `pod_label` handler's Service
    /// companion runs): a policy's reconcile then takes the Services from the tracker instead
    /// of listing every Service of the cluster.
    services_fed: std::sync::atomic::AtomicBool,
    /// Whether the EndpointSlice events of Services without a selector reach
    /// [`Self::observe_endpoint_slices`]: a reconcile then reads no slices at all.
    slices_fed: std::sync::atomic::AtomicBool,
    /// One read of a Service's EndpointSlices and its write into the tracker at a time, per
    /// Service: a Service event and a slice event read in one order and write in the other
    /// would leave the older backends.
    service_reads: KeyedLocks<(String, String)>,
}

/// How long [`NetworkPolicyDriver::ensure_stale`] leaves a policy that failed that way.
const HOLD: std::time::Duration = std::time::Duration::from_secs(30);

impl NetworkPolicyDriver {
    pub fn new(
        kube: Client,
        deployments: Deployments,
        config: Arc<KuryrConfig>,
        tags: Vec<String>,
        cluster_id: String,
        projects: Arc<dyn ProjectDriver>,
    ) -> Self {
        Self {
            kube,
            deployments,
            config,
            tags,
            cluster_id,
            projects,
            options: tokio::sync::OnceCell::new(),
            placement: None,
            open_groups: Mutex::default(),
            placed: Mutex::default(),
            tracker: Mutex::default(),
            locks: KeyedLocks::default(),
            pools: None,
            port_groups: Arc::default(),
            held: std::sync::Mutex::default(),
            services_fed: std::sync::atomic::AtomicBool::new(false),
            slices_fed: std::sync::atomic::AtomicBool::new(false),
            service_reads: KeyedLocks::default(),
        }
    }

    /// Drops what an earlier leadership term learned: the cluster as its watches saw it (a pod
    /// deleted while another replica led sent this one no event), where each policy's groups
    /// live, and the allow-all groups' ids (the other leader may have replaced them). The next
    /// use lists them afresh.
    pub async fn forget(&self) {
        *self.tracker.lock().await = None;
        self.placed.lock().await.clear();
        self.open_groups.lock().await.clear();
    }

    /// The port pools whose keys hold this driver's groups (see [`NetworkPolicyDriver::release`]).
    pub fn with_pools(mut self, pools: Option<Arc<PoolManager>>) -> Self {
        self.pools = pools;
        self
    }

    /// The controller's turns of ports' group changes, which releases of ports also wait for.
    pub fn with_port_groups(mut self, port_groups: Arc<PortGroups>) -> Self {
        self.port_groups = port_groups;
        self
    }

    /// Ingress always allowed from these prefixes (the nodes' subnets: kubelet probes).
    pub fn with_host_cidrs(mut self, cidrs: Vec<Cidr>) -> Self {
        self.options = tokio::sync::OnceCell::new_with(Some(Self::options_with(cidrs)));
        self
    }

    fn options_with(host_cidrs: Vec<Cidr>) -> Options {
        Options {
            host_cidrs,
            namespace_service_vips: true,
        }
    }

    /// The model's options, the subnets' prefixes read from Neutron on first use.
    async fn options(&self) -> Result<&Options, Error> {
        self.options
            .get_or_try_init(|| async {
                let mut hosts = self.read_node_cidrs().await?;
                if self.config.octavia_defaults.enforce_sg_rules {
                    hosts.extend(self.read_service_cidrs().await?);
                    hosts.sort();
                    hosts.dedup();
                }
                Ok(Self::options_with(hosts))
            })
            .await
    }

    /// The CIDRs of the configured node subnets, each looked up in the deployments in turn; one
    /// found in none is left out with a warning (a typo in kuryr.conf must not keep every policy
    /// from being applied).
    async fn read_node_cidrs(&self) -> Result<Vec<Cidr>, Error> {
        let mut cidrs = Vec::new();
        'subnets: for id in &self.config.pod_vif_nested.worker_nodes_subnets {
            // A deployment that cannot answer may not be the one holding the subnet: the others
            // are asked before it fails the read.
            let mut failed = None;
            for deployment in self.deployments.names() {
                let client = self.deployments.client(deployment)?;
                match client.get_subnet(id).await {
                    Ok(s) => {
                        cidrs.push(subnet_cidr(id, &s.cidr)?);
                        continue 'subnets;
                    }
                    Err(e) if e.is_not_found() => {}
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                return Err(e.into());
            }
            tracing::warn!(subnet = %id, "node subnet not found in any deployment: policies do not open ingress from it");
        }
        cidrs.sort();
        cidrs.dedup();
        Ok(cidrs)
    }

    /// The CIDRs of every deployment's service subnet, each read where it is configured. One that
    /// cannot be read is left out with a warning once another was read: the Services' range is the
    /// cluster's, the same in every deployment's subnet, and a deployment that is out must not keep
    /// policies elsewhere from being applied. With none read, the read fails (and is tried again at
    /// the next use: what is read is kept for good).
    async fn read_service_cidrs(&self) -> Result<Vec<Cidr>, Error> {
        let mut cidrs = Vec::new();
        let mut failed = Vec::new();
        for deployment in self.deployments.names() {
            let Some(id) = self.config.service_options(deployment).service_subnet else {
                continue;
            };
            let read = match self.deployments.client(deployment) {
                Ok(client) => match client.get_subnet(&id).await {
                    Ok(s) => subnet_cidr(&id, &s.cidr).map(Some),
                    Err(e) if e.is_not_found() => Ok(None),
                    Err(e) => Err(e.into()),
                },
                Err(e) => Err(e),
            };
            match read {
                Ok(Some(cidr)) => cidrs.push(cidr),
                Ok(None) => tracing::warn!(deployment, subnet = %id,
                    "service subnet not found: isolated pods do not open ingress from it"),
                Err(e) => failed.push((deployment, id, e)),
            }
        }
        if cidrs.is_empty()
            && let Some((_, _, e)) = failed.pop()
        {
            return Err(e);
        }
        for (deployment, id, e) in failed {
            tracing::warn!(deployment, subnet = %id, error = %e,
                "service subnet not read: the range read in another deployment stands for it");
        }
        cidrs.sort();
        cidrs.dedup();
        Ok(cidrs)
    }

    /// The placement's project mapping (a project's id in each deployment).
    pub fn with_placement(mut self, placement: Option<Arc<Binder>>) -> Self {
        self.placement = placement;
        self
    }

    fn client(&self, deployment: &str) -> Result<NeutronClient, Error> {
        Ok(self.deployments.client(deployment)?.clone())
    }

    /// Whether `deployment` is configured (a removed one's resources can only be drained).
    pub fn knows_deployment(&self, deployment: &str) -> bool {
        self.deployments.names().any(|d| d == deployment)
    }

    /// The project of the groups of policies (and pods) in `namespace`, as `deployment` names it.
    async fn project(&self, namespace: &str, deployment: &str) -> Result<String, Error> {
        let project = self.projects.project_for_namespace(namespace).await?;
        Ok(match &self.placement {
            Some(b) => b.project_id(deployment, &project).await?,
            None => project,
        })
    }

    /// The deployment of every policy that has a KuryrNetworkPolicy, by policy uid.
    async fn list_placed(&self) -> Result<HashMap<String, String>, Error> {
        Ok(Api::<KuryrNetworkPolicy>::all(self.kube.clone())
            .list(&ListParams::default())
            .await?
            .iter()
            .filter_map(|knp| Some((policy_uid(knp)?, recorded_deployment(knp))))
            .collect())
    }

    /// The deployment the policy `uid`'s groups live in, once its KuryrNetworkPolicy is known.
    async fn placed(&self, uid: &str) -> Option<String> {
        self.placed.lock().await.get(uid).cloned()
    }

    fn cluster_tag(&self) -> String {
        kuryr_crds::names::neutron::cluster_tag(&self.cluster_id)
    }

    fn ag_description(&self, uid: &str) -> String {
        format!("kuryr-rs:{}:{uid}", self.cluster_id)
    }

    /// The prefix of every address group description of this cluster (for the orphan sweep).
    pub fn ag_description_prefix(&self) -> String {
        format!("kuryr-rs:{}:", self.cluster_id)
    }

    /// Namespaces, pods and Services as the model reads them, listed from the API.
    pub async fn list_index(&self) -> Result<ClusterIndex, Error> {
        let lp = ListParams::default();
        let mut index = ClusterIndex::default();
        for ns in Api::<Namespace>::all(self.kube.clone()).list(&lp).await? {
            index.set_namespace(&ns);
        }
        for pod in Api::<Pod>::all(self.kube.clone()).list(&lp).await? {
            if pod.metadata.deletion_timestamp.is_none() {
                index.set_pod(&pod);
            }
        }
        self.list_services(&mut index).await?;
        Ok(index)
    }

    /// Replaces the index's Services with a fresh listing: the tracker's first fill, and every
    /// policy reconcile when no Service events reach the driver (see [`Self::feed_services`]).
    async fn list_services(&self, index: &mut ClusterIndex) -> Result<(), Error> {
        index.services.clear();
        for svc in Api::<Service>::all(self.kube.clone())
            .list(&ListParams::default())
            .await?
        {
            if svc.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let info = self
                .with_backends(
                    ServiceInfo::from_service(&svc),
                    &svc.namespace().unwrap_or_default(),
                    &svc.name_any(),
                )
                .await?;
            index
                .services
                .insert((svc.namespace().unwrap_or_default(), svc.name_any()), info);
        }
        Ok(())
    }

    /// `info` of the Service `ns/name` with its backends when it has no selector, from its
    /// EndpointSlices (one labelled list; such Services are few: `kubernetes.default`, the
    /// hand-made ones in front of what runs outside the cluster).
    async fn with_backends(&self, info: ServiceInfo, ns: &str, name: &str) -> Result<ServiceInfo, Error> {
        if info.selector.is_some() || info.vips.is_empty() {
            return Ok(info);
        }
        let slices = Api::<EndpointSlice>::namespaced(self.kube.clone(), ns)
            .list(&ListParams::default().labels(&format!(
                "{}={name}",
                crate::services::endpoints::SERVICE_NAME_LABEL,
            )))
            .await?;
        Ok(info.with_endpoint_slices(&slices.items))
    }

    /// Service events reach [`Self::observe_service`] and [`Self::forget_service`] from now on.
    pub fn feed_services(&self) {
        self.services_fed
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// A Service added or changed, as its watch event shows it (one being deleted goes to
    /// [`Self::forget_service`]); true when the policies' view of it changed (their reconciles
    /// may now admit other addresses).
    pub async fn observe_service(&self, svc: &Service) -> Result<bool, Error> {
        if self.tracker.lock().await.is_none() {
            return Ok(false);
        }
        let key = (svc.namespace().unwrap_or_default(), svc.name_any());
        let _turn = self.service_reads.lock(key.clone()).await;
        let info = self
            .with_backends(ServiceInfo::from_service(svc), &key.0, &key.1)
            .await?;
        Ok(self.set_tracked_service(key, Some(info)).await)
    }

    /// EndpointSlice events of Services without a selector reach
    /// [`Self::observe_endpoint_slices`] from now on.
    pub fn feed_endpoint_slices(&self) {
        self.slices_fed.store(true, std::sync::atomic::Ordering::Release);
    }

    /// An EndpointSlice of the Service `ns/name` changed or went: a Service the policies know
    /// without a selector has its backends read again (an egress rule to them admits its VIP);
    /// true when they changed. Others cost a lookup.
    pub async fn observe_endpoint_slices(&self, ns: &str, name: &str) -> Result<bool, Error> {
        let key = (ns.to_owned(), name.to_owned());
        let selectorless = |t: &PolicyTracker| {
            t.cluster()
                .services
                .get(&key)
                .filter(|i| i.selector.is_none() && !i.vips.is_empty())
                .cloned()
        };
        if self
            .tracker
            .lock()
            .await
            .as_ref()
            .and_then(selectorless)
            .is_none()
        {
            return Ok(false);
        }
        let _turn = self.service_reads.lock(key.clone()).await;
        // Again under the turn: a Service event may have given it a selector meanwhile.
        let Some(read) = self.tracker.lock().await.as_ref().and_then(selectorless) else {
            return Ok(false);
        };
        let info = self.with_backends(read, ns, name).await?;
        Ok(self.set_tracked_service(key, Some(info)).await)
    }

    /// A Service gone; true when the policies knew it.
    pub async fn forget_service(&self, svc: &Service) -> bool {
        let key = (svc.namespace().unwrap_or_default(), svc.name_any());
        self.set_tracked_service(key, None).await
    }

    /// Records what the policies know of the Service `key` (`None`: gone) when the tracker is
    /// filled; true when that changed.
    async fn set_tracked_service(&self, key: (String, String), info: Option<ServiceInfo>) -> bool {
        self.tracker
            .lock()
            .await
            .as_mut()
            .is_some_and(|t| t.set_service(key, info))
    }

    /// The Services a policy's reconcile reads: from the Service events when they are fed
    /// (the backends of those without a selector read again unless their EndpointSlices' events
    /// are fed too), else from one listing.
    async fn refresh_services(&self) -> Result<(), Error> {
        if !self.services_fed.load(std::sync::atomic::Ordering::Acquire) {
            let mut services = ClusterIndex::default();
            self.list_services(&mut services).await?;
            return self.with_tracker(|t| t.set_services(services.services)).await;
        }
        if self.slices_fed.load(std::sync::atomic::Ordering::Acquire) {
            // The tracker's first fill lists them, as every other kind.
            return self.with_tracker(|_| ()).await;
        }
        let selectorless: Vec<((String, String), ServiceInfo)> = self
            .with_tracker(|t| {
                t.cluster()
                    .services
                    .iter()
                    .filter(|(_, i)| i.selector.is_none() && !i.vips.is_empty())
                    .map(|(k, i)| (k.clone(), i.clone()))
                    .collect()
            })
            .await?;
        for ((ns, name), read) in selectorless {
            let info = self.with_backends(read.clone(), &ns, &name).await?;
            self.if_tracking(|t| {
                // Only if it is still as read: a Service event handled meanwhile stands.
                if t.cluster().services.get(&(ns.clone(), name.clone())) == Some(&read) {
                    t.set_service((ns, name), Some(info));
                }
            })
            .await;
        }
        Ok(())
    }

    /// Runs `f` on the tracker, filling it from one listing of namespaces, pods, Services and
    /// policies the first time; afterwards watch events keep it current.
    async fn with_tracker<T>(&self, f: impl FnOnce(&mut PolicyTracker) -> T) -> Result<T, Error> {
        let mut guard = self.tracker.lock().await;
        let tracker = match guard.take() {
            Some(t) => t,
            None => {
                let index = self.list_index().await?;
                let policies = self.list_policies().await?;
                let placed = self.list_placed().await?;
                let mut known = self.placed.lock().await;
                for (uid, deployment) in placed {
                    known.entry(uid).or_insert(deployment);
                }
                PolicyTracker::new(index, policies)
            }
        };
        let tracker = guard.insert(tracker);
        Ok(f(tracker))
    }

    /// Runs `f` on the tracker when it is filled; before that a change needs no recording (the
    /// filling lists it).
    async fn if_tracking(&self, f: impl FnOnce(&mut PolicyTracker)) {
        if let Some(t) = self.tracker.lock().await.as_mut() {
            f(t);
        }
    }

    /// A pod added, changed or being deleted, as its watch event shows it.
    pub async fn observe_pod(&self, pod: &Pod) {
        self.if_tracking(|t| t.observe_pod(pod)).await;
    }

    pub async fn forget_pod(&self, pod: &Pod) {
        self.if_tracking(|t| t.remove_pod(pod)).await;
    }

    pub async fn observe_namespace(&self, ns: &Namespace) {
        self.if_tracking(|t| t.observe_namespace(ns)).await;
    }

    pub async fn forget_namespace(&self, ns: &Namespace) {
        self.if_tracking(|t| t.set_namespace_labels(&ns.name_any(), None))
            .await;
    }

    /// Every live, valid policy of the cluster by uid.
    async fn list_policies(&self) -> Result<BTreeMap<String, PolicySpec>, Error> {
        let nps = Api::<NetworkPolicy>::all(self.kube.clone())
            .list(&ListParams::default())
            .await?;
        Ok(nps
            .iter()
            .filter(|np| np.metadata.deletion_timestamp.is_none())
            .filter_map(|np| Some((np.uid()?, PolicySpec::parse(np).ok()?)))
            .collect())
    }

    /// The valid, live policies of `namespace` with their uids (invalid ones are reported by the
    /// `policy` handler and enforce nothing).
    pub async fn policies_in(&self, namespace: &str) -> Result<Vec<(String, PolicySpec)>, Error> {
        let nps = Api::<NetworkPolicy>::namespaced(self.kube.clone(), namespace)
            .list(&ListParams::default())
            .await?;
        Ok(nps
            .iter()
            .filter(|np| np.metadata.deletion_timestamp.is_none())
            .filter_map(|np| Some((np.uid()?, PolicySpec::parse(np).ok()?)))
            .collect())
    }

    async fn lock(&self, uid: &str) -> Turn<'_, String> {
        self.locks.lock(uid.to_string()).await
    }

    /// Reads the policy's groups back from Neutron. A second group of the same variant or a
    /// second address group of the same key (left by a crash between create and record) is
    /// returned apart, for deletion.
    async fn actual_with_extras(
        &self,
        client: &NeutronClient,
        uid: &str,
    ) -> Result<(ActualPolicy, Vec<String>, Vec<String>), Error> {
        let (actual, sgs, ags) = self.read(client, uid).await?;
        let kept_sgs: BTreeSet<&String> = actual.groups.values().map(|g| &g.id).collect();
        let kept_ags: BTreeSet<&String> = actual.address_groups.values().map(|(id, _)| id).collect();
        let extra_sgs = sgs
            .iter()
            .map(|s| s.id.clone())
            .filter(|id| !kept_sgs.contains(id))
            .collect();
        let extra_ags = ags.into_iter().filter(|id| !kept_ags.contains(id)).collect();
        Ok((actual, extra_sgs, extra_ags))
    }

    /// Reads the policy's groups back from Neutron. Of two address groups of one key (two
    /// writers, or a crash between create and record), the one the policy's rules point at is
    /// kept: keeping the other would update its addresses while the rules, taken for right
    /// (same key), kept pointing at the copy, whose membership then never changed again and
    /// which could not be deleted (in use). Rules pointing at a copy not kept are foreign to
    /// the model, so the diff moves them to the kept group and the copy goes.
    async fn read(
        &self,
        client: &NeutronClient,
        uid: &str,
    ) -> Result<(ActualPolicy, Vec<SecurityGroup>, Vec<String>), Error> {
        let ags = client
            .list_address_groups(&ListFilter::new().eq("description", self.ag_description(uid)))
            .await?;
        let mut sgs = client
            .list_security_groups(&ListFilter::new().tags([self.cluster_tag(), format!("{TAG_POLICY}{uid}")]))
            .await?;
        for sg in client
            .list_security_groups(&ListFilter::new().eq("description", self.ag_description(uid)))
            .await?
        {
            if sgs.iter().all(|s| s.id != sg.id) {
                sgs.push(sg);
            }
        }
        let mut pointed: HashMap<&str, usize> = HashMap::new();
        for r in sgs.iter().flat_map(|sg| &sg.security_group_rules) {
            if let Some(ag) = &r.remote_address_group_id {
                *pointed.entry(ag.as_str()).or_default() += 1;
            }
        }
        let mut actual = ActualPolicy::default();
        for ag in &ags {
            let addrs: BTreeSet<Cidr> = ag.addresses.iter().filter_map(|a| a.parse().ok()).collect();
            let refs = |id: &str| pointed.get(id).copied().unwrap_or(0);
            match actual.address_groups.entry(AgKey(ag.name.clone())) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert((ag.id.clone(), addrs));
                }
                std::collections::btree_map::Entry::Occupied(mut e) => {
                    if refs(&ag.id) > refs(&e.get().0) {
                        e.insert((ag.id.clone(), addrs));
                    }
                }
            }
        }
        let keys: HashMap<String, AgKey> = actual
            .address_groups
            .iter()
            .map(|(k, (id, _))| (id.clone(), k.clone()))
            .collect();
        for sg in &sgs {
            // Untagged: left between create and tag; returned as an extra for deletion.
            let Some(variant) = sg.tags.iter().find_map(|t| t.strip_prefix(TAG_VARIANT)) else {
                continue;
            };
            let variant = variant.to_string();
            let rules = sg
                .security_group_rules
                .iter()
                .map(|r| (r.id.clone(), rule_of(r, &keys)))
                .collect();
            actual.groups.entry(variant).or_insert(ActualGroup {
                id: sg.id.clone(),
                rules,
            });
        }
        let ag_ids = ags.into_iter().map(|a| a.id).collect();
        Ok((actual, sgs, ag_ids))
    }

    /// Makes Neutron match `spec` for the policy `uid` in `deployment`, the one its
    /// KuryrNetworkPolicy records (read back and diffed whatever was applied before: this is also
    /// the periodic repair); returns what is there afterwards.
    pub async fn ensure(&self, uid: &str, deployment: &str, spec: &PolicySpec) -> Result<Applied, Error> {
        self.placed
            .lock()
            .await
            .insert(uid.to_string(), deployment.to_string());
        self.refresh_services().await?;
        self.with_tracker(|t| t.set_policy(uid, spec.clone())).await?;
        self.reconcile(uid, true)
            .await?
            .ok_or_else(|| Error::not_ready(format!("NetworkPolicy {} being released", spec.key)))
    }

    /// One policy against the tracker's current state, under the policy's lock (so the last
    /// reconcile to run uses the latest state). Unless `force`, a policy whose desired state is
    /// what its last reconcile applied is left alone (`None`).
    async fn reconcile(&self, uid: &str, force: bool) -> Result<Option<Applied>, Error> {
        let options = self.options().await?;
        let _guard = self.lock(uid).await;
        let decided = self
            .with_tracker(|t| {
                let spec = t.policies.get(uid)?.clone();
                let want = desired(&spec, t.cluster(), options);
                let unchanged = t.applied(uid) == Some(&want);
                Some((spec, want, unchanged))
            })
            .await?;
        let Some((spec, want, unchanged)) = decided else {
            return Ok(None);
        };
        if unchanged && !force {
            return Ok(None);
        }
        // Not placed yet: its KuryrNetworkPolicy's first ensure applies it.
        let Some(deployment) = self.placed(uid).await else {
            return Ok(None);
        };
        match self.apply(uid, &deployment, &spec.key, &want).await {
            Ok(a) => {
                self.if_tracking(|t| t.record_applied(uid, want)).await;
                self.held.locked().remove(uid);
                Ok(Some(a))
            }
            Err(e) => {
                self.if_tracking(|t| t.forget_applied(uid)).await;
                Err(e)
            }
        }
    }

    /// After a pod or namespace changed: the policies whose desired state moved, each
    /// reconciled (usually only address-group updates follow); the others cost nothing.
    /// Returns the writes made.
    pub async fn ensure_all(&self) -> Result<usize, Error> {
        Ok(self.ensure_stale().await?.0)
    }

    /// [`Self::ensure_all`], also returning the policies whose Neutron state it changed (the
    /// Services they select may admit other sources now). Called for every pod and namespace
    /// event: a policy failing for a reason a retry of that event cannot mend (its project's
    /// quota, a deployment gone from kuryr.conf) is logged and left to its own handler (whose
    /// retries and resyncs tell its owner) for [`HOLD`], not returned: one broken policy must
    /// not fail, and re-run at, every event of the cluster. Transient failures are returned.
    pub async fn ensure_stale(&self) -> Result<(usize, Vec<PolicySpec>), Error> {
        let options = self.options().await?;
        let now = std::time::Instant::now();
        let held: HashSet<String> = {
            let mut held = self.held.locked();
            held.retain(|_, until| *until > now);
            held.keys().cloned().collect()
        };
        let stale: Vec<(String, PolicySpec)> = self
            .with_tracker(|t| {
                t.stale(options)
                    .into_iter()
                    .filter(|(uid, _, _)| !held.contains(uid))
                    .map(|(uid, spec, _)| (uid, spec))
                    .collect()
            })
            .await?;
        let mut writes = 0;
        let mut moved = vec![];
        let mut errors = vec![];
        for (uid, spec) in stale {
            match self.reconcile(&uid, false).await {
                Ok(Some(a)) if a.writes > 0 => {
                    writes += a.writes;
                    moved.push(spec);
                }
                Ok(_) => {}
                Err(e) if e.is_user_visible() || !e.is_retryable() => {
                    tracing::warn!(policy = %uid, error = %e, kind = e.label(), "policy not applied; left to its own handler for now");
                    self.held.locked().insert(uid, std::time::Instant::now() + HOLD);
                }
                Err(e) => errors.push(e),
            }
        }
        match errors.len() {
            0 => Ok((writes, moved)),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Multiple(errors)),
        }
    }

    /// [`Self::adopt`] for the group the policy's KuryrNetworkPolicy records, if it records one;
    /// true when a group was taken over.
    async fn adopt_upstream(&self, uid: &str, deployment: &str, key: &PolicyKey) -> Result<bool, Error> {
        let knp = Api::<KuryrNetworkPolicy>::namespaced(self.kube.clone(), &key.namespace)
            .get_opt(&key.name)
            .await?;
        let Some(sg) = knp.and_then(|k| k.status).and_then(|s| s.security_group_id) else {
            return Ok(false);
        };
        self.adopt(uid, deployment, &sg).await
    }

    /// Takes over a group an earlier controller (upstream kuryr) made for this policy, so it is
    /// reconciled instead of duplicated; true when it tagged one.
    async fn adopt(&self, uid: &str, deployment: &str, sg_id: &str) -> Result<bool, Error> {
        let client = self.client(deployment)?;
        let sg = match client.get_security_group(sg_id).await {
            Ok(sg) => sg,
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if sg.tags.iter().any(|t| t.starts_with(TAG_POLICY)) {
            return Ok(false);
        }
        let mut tags = sg.tags.clone();
        tags.extend(self.tags.iter().cloned());
        tags.extend([
            format!("{TAG_POLICY}{uid}"),
            format!("{TAG_VARIANT}{BASE_VARIANT}"),
        ]);
        tags.sort();
        tags.dedup();
        client
            .replace_tags(kuryr_neutron::Taggable::SecurityGroup, sg_id, &tags)
            .await?;
        Ok(true)
    }

    /// Makes Neutron hold `want` for the policy `uid`; the caller holds the policy's lock.
    async fn apply(
        &self,
        uid: &str,
        deployment: &str,
        key: &PolicyKey,
        want: &DesiredPolicy,
    ) -> Result<Applied, Error> {
        let client = self.client(deployment)?;
        let project = self.project(&key.namespace, deployment).await?;
        let (mut actual, mut extra_sgs, mut extra_ags) = self.actual_with_extras(&client, uid).await?;
        // About to create the policy's first group: a KuryrNetworkPolicy upstream wrote names the
        // group to take over instead. Whichever path applies the policy first (its own handler, or
        // a pod's change seen before it) adopts it, so no second group is ever made.
        if !actual.groups.contains_key(BASE_VARIANT) && self.adopt_upstream(uid, deployment, key).await? {
            (actual, extra_sgs, extra_ags) = self.actual_with_extras(&client, uid).await?;
        }
        for id in &extra_sgs {
            self.delete_group(&client, deployment, id, None).await?;
        }
        let ops = diff(want, &actual);
        let mut groups: BTreeMap<String, String> = actual
            .groups
            .iter()
            .map(|(v, g)| (v.clone(), g.id.clone()))
            .collect();
        let mut ags: BTreeMap<AgKey, String> = actual
            .address_groups
            .iter()
            .map(|(k, (id, _))| (k.clone(), id.clone()))
            .collect();
        let writes = ops.len();
        for op in ops {
            match op {
                Op::CreateGroup { variant } => {
                    let mut tags = self.tags.clone();
                    tags.extend([format!("{TAG_POLICY}{uid}"), format!("{TAG_VARIANT}{variant}")]);
                    let sg = client
                        .create_security_group(&SecurityGroupCreate {
                            // A policy's name may be 253 characters: cut to what Neutron takes.
                            name: format!("sg-{}-{}", key.namespace, key.name)
                                .chars()
                                .take(kuryr_crds::names::neutron::MAX_LEN)
                                .collect(),
                            project_id: Some(project.clone()),
                            description: Some(self.ag_description(uid)),
                            ..Default::default()
                        })
                        .await?;
                    // Neutron adds allow-all egress rules to a new group; a policy group starts
                    // closed and gets exactly the model's rules. Tagged only then: a tagged group
                    // is one a pod may be given, and it must not open egress meanwhile (a crash
                    // before the tagging leaves it found by its description).
                    for r in &sg.security_group_rules {
                        ignore_not_found(client.delete_security_group_rule(&r.id).await)?;
                    }
                    client
                        .replace_tags(kuryr_neutron::Taggable::SecurityGroup, &sg.id, &tags)
                        .await?;
                    groups.insert(variant, sg.id);
                }
                Op::CreateAddressGroup {
                    key: ag_key,
                    addresses,
                } => {
                    let ag = client
                        .create_address_group(&AddressGroupCreate {
                            name: ag_key.0.clone(),
                            project_id: Some(project.clone()),
                            description: Some(self.ag_description(uid)),
                            addresses: addresses.iter().map(ToString::to_string).collect(),
                        })
                        .await?;
                    ags.insert(ag_key, ag.id);
                }
                Op::DeleteRule { id, .. } => ignore_not_found(client.delete_security_group_rule(&id).await)?,
                Op::RemoveAddresses { id, addresses, .. } => {
                    set_addresses(&client, &id, &addresses, false).await?
                }
                Op::AddAddresses { id, addresses, .. } => {
                    set_addresses(&client, &id, &addresses, true).await?
                }
                Op::CreateRule { variant, rule } => {
                    let sg = groups
                        .get(&variant)
                        .ok_or_else(|| Error::not_ready(format!("security group of {key} ({variant})")))?;
                    let req = rule_request(sg, &project, &rule, &ags)?;
                    match client.create_security_group_rule(&req).await {
                        // Not any 409: OverQuota is one too, and must fail the reconcile.
                        Err(e) if e.is_kind(&kuryr_neutron::ErrorKind::SecurityGroupRuleExists) => {}
                        r => {
                            r?;
                        }
                    }
                }
                Op::DeleteAddressGroup { id, .. } => {
                    ignore_not_found(client.delete_address_group(&id).await)?
                }
                Op::DeleteGroup { variant, id } => {
                    // A variant no pod resolves to any more (a named port edited): its pods wait
                    // on the base variant, still isolated, until they are moved to their own.
                    let base = groups.get(BASE_VARIANT).cloned();
                    self.delete_group(&client, deployment, &id, base.as_deref())
                        .await?;
                    groups.remove(&variant);
                }
            }
        }
        for id in &extra_ags {
            // Only in use by rules of groups deleted above or replaced by the diff.
            match client.delete_address_group(id).await {
                Err(e) if e.status() == Some(409) => {
                    tracing::warn!(id, "duplicate address group still in use")
                }
                r => ignore_not_found(r)?,
            }
        }
        let mut rules = vec![];
        for id in groups.values() {
            rules.extend(client.get_security_group(id).await?.security_group_rules);
        }
        Ok(Applied {
            groups,
            rules,
            notes: want.notes.clone(),
            writes,
        })
    }

    /// Deletes everything `deployment`'s Neutron holds for the policy `uid`, taking its groups
    /// off ports first.
    pub async fn release(&self, uid: &str, deployment: &str) -> Result<(), Error> {
        let client = self.client(deployment)?;
        let _guard = self.lock(uid).await;
        // A stray copy elsewhere (the sweep) leaves the policy alone where it lives.
        let home = {
            let mut placed = self.placed.lock().await;
            match placed.get(uid) {
                Some(d) if d != deployment => false,
                _ => {
                    placed.remove(uid);
                    true
                }
            }
        };
        if home {
            // Under the lock: a reconcile that runs after this finds no policy to apply.
            self.if_tracking(|t| t.remove_policy(uid)).await;
        }
        let (_, sgs, ags) = self.read(&client, uid).await?;
        let mut errors = vec![];
        for g in &sgs {
            if let Err(e) = self.delete_group(&client, deployment, &g.id, None).await {
                errors.push(e);
            }
        }
        // Rules went with their groups; the address groups are free now.
        for id in &ags {
            if let Err(e) = ignore_not_found(client.delete_address_group(id).await) {
                errors.push(e);
            }
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Multiple(errors)),
        }
    }

    /// Deletes the one group an upstream-written KuryrNetworkPolicy names and that was never
    /// adopted (its policy went before kuryr-rs applied it: no owner reference names the policy,
    /// so no tag can find its groups), as upstream would have on deletion.
    pub async fn release_unadopted(&self, deployment: &str, sg: &str) -> Result<(), Error> {
        let client = self.client(deployment)?;
        self.delete_group(&client, deployment, sg, None).await
    }

    /// Takes `sg` off its ports (replaced by `replacement` if given, see [`without_group`]) and
    /// deletes it, once no change of a port's groups naming it is still being written (see
    /// [`PortGroups`]). A port given the group again in between (a pool recycling a port onto
    /// it, a pod's port sync) makes Neutron answer 409 SecurityGroupInUse: that is a race to
    /// retry, detaching again, not a failure.
    async fn delete_group(
        &self,
        client: &NeutronClient,
        deployment: &str,
        sg: &str,
        replacement: Option<&str>,
    ) -> Result<(), Error> {
        if let Some(pools) = &self.pools {
            pools.drop_security_group(sg).await?;
        }
        self.detach(client, deployment, sg, replacement).await?;
        self.port_groups.settled(sg).await;
        match client.delete_security_group(sg).await {
            Err(e) if e.is_kind(&kuryr_neutron::ErrorKind::SecurityGroupInUse) => Err(Error::not_ready(
                format!("security group {sg} was put back on a port while being deleted"),
            )),
            r => ignore_not_found(r),
        }
    }

    /// Takes `sg` off every port that has it, `replacement` in its place if given; a port left
    /// with no group gets the defaults. Each port is read again in its turn: the listing may
    /// predate a change of its groups.
    async fn detach(
        &self,
        client: &NeutronClient,
        deployment: &str,
        sg: &str,
        replacement: Option<&str>,
    ) -> Result<(), Error> {
        let defaults = self.config.deployment_defaults(deployment).pod_security_groups;
        for port in client
            .list_ports(&ListFilter::new().eq("security_groups", sg))
            .await?
        {
            self.port_groups
                .change(client, &port.id, |now| {
                    match without_group(&now.security_groups, sg, replacement, &defaults) {
                        Some(groups) => Change::Set(groups),
                        None => Change::Keep,
                    }
                })
                .await?;
        }
        Ok(())
    }

    /// The security groups a pod's ports in `deployment` must have, from its labels and named
    /// ports alone (so it is known before the pod has an address or a port). A selecting policy
    /// whose groups live in another deployment is an error naming both: its group ids mean
    /// nothing here, and leaving it out would let in what the policy denies.
    pub async fn pod_groups(&self, deployment: &str, pod: &Pod) -> Result<Vec<String>, Error> {
        let mut known = self
            .namespace_policies(&pod.namespace().unwrap_or_default())
            .await?;
        self.groups_of(&mut known, deployment, pod).await
    }

    /// What deciding the groups of `namespace`'s pods needs, read once for any number of them.
    async fn namespace_policies(&self, namespace: &str) -> Result<NamespacePolicies, Error> {
        let policies = self.policies_in(namespace).await?;
        Ok(NamespacePolicies {
            namespace: namespace.to_string(),
            uids: policies.iter().map(|(u, s)| (s.key.clone(), u.clone())).collect(),
            specs: policies.into_iter().map(|(_, s)| s).collect(),
            placed: None,
            groups: HashMap::new(),
        })
    }

    /// [`Self::pod_groups`] with what `known` holds: where the policies' groups live is listed
    /// at the first pod a policy selects, and each group is looked up once.
    async fn groups_of(
        &self,
        known: &mut NamespacePolicies,
        deployment: &str,
        pod: &Pod,
    ) -> Result<Vec<String>, Error> {
        let ns = known.namespace.clone();
        let client = self.client(deployment)?;
        match pod_security(&ns, &PodInfo::from_pod(pod), &known.specs) {
            PodSecurity::Unselected => {
                let defaults = self.config.deployment_defaults(deployment).pod_security_groups;
                if !defaults.is_empty() {
                    return Ok(defaults);
                }
                Ok(vec![
                    self.open_group(&client, deployment, &ns, Direction::Ingress)
                        .await?,
                    self.open_group(&client, deployment, &ns, Direction::Egress)
                        .await?,
                ])
            }
            PodSecurity::Selected {
                groups,
                open_ingress,
                open_egress,
            } => {
                if known.placed.is_none() {
                    known.placed = Some(
                        Api::<KuryrNetworkPolicy>::namespaced(self.kube.clone(), &ns)
                            .list(&ListParams::default())
                            .await?
                            .iter()
                            .filter_map(|knp| Some((policy_uid(knp)?, recorded_deployment(knp))))
                            .collect(),
                    );
                }
                let none = HashMap::new();
                let placed = known.placed.as_ref().unwrap_or(&none);
                let mut out = vec![];
                for (key, variant) in groups {
                    let uid = known.uids.get(&key).cloned().unwrap_or_default();
                    let there = placed.get(&uid).ok_or_else(|| {
                        Error::not_ready(format!("KuryrNetworkPolicy of NetworkPolicy {key}"))
                    })?;
                    if there != deployment {
                        return Err(Error::invalid(
                            format!("NetworkPolicy {key}"),
                            format!(
                                "selects this pod, whose port is in OpenStack deployment {deployment:?}, but its \
                                 security groups live in deployment {there:?} (recorded on its KuryrNetworkPolicy): \
                                 a group of one cloud cannot be put on a port of another, and the pod is not wired \
                                 without it"
                            ),
                        ));
                    }
                    let cached = (deployment.to_string(), uid.clone(), variant.clone());
                    if let Some(id) = known.groups.get(&cached) {
                        out.push(id.clone());
                        continue;
                    }
                    let tags = [
                        self.cluster_tag(),
                        format!("{TAG_POLICY}{uid}"),
                        format!("{TAG_VARIANT}{variant}"),
                    ];
                    let sg = client
                        .list_security_groups(&ListFilter::new().tags(tags))
                        .await?
                        .into_iter()
                        .next()
                        .ok_or_else(|| Error::not_ready(format!("security group of NetworkPolicy {key}")))?;
                    known.groups.insert(cached, sg.id.clone());
                    out.push(sg.id);
                }
                if open_ingress {
                    out.push(
                        self.open_group(&client, deployment, &ns, Direction::Ingress)
                            .await?,
                    );
                }
                if open_egress {
                    out.push(
                        self.open_group(&client, deployment, &ns, Direction::Egress)
                            .await?,
                    );
                }
                out.sort();
                out.dedup();
                Ok(out)
            }
        }
    }

    /// The project's allow-all group of one direction, for pods whose policies leave it open.
    async fn open_group(
        &self,
        client: &NeutronClient,
        deployment: &str,
        namespace: &str,
        dir: Direction,
    ) -> Result<String, Error> {
        let project = self.project(namespace, deployment).await?;
        let name = dir.neutron();
        let key = (deployment.to_string(), project.clone(), name);
        let mut cache = self.open_groups.lock().await;
        if let Some(id) = cache.get(&key) {
            return Ok(id.clone());
        }
        let tag = format!("{TAG_OPEN}{name}");
        let found = client
            .list_security_groups(
                &ListFilter::new()
                    .project_id(&project)
                    .tags([self.cluster_tag(), tag.clone()]),
            )
            .await?
            .into_iter()
            .next();
        let id = match found {
            Some(sg) => {
                self.deployments.adoptable(deployment, || {
                    format!("allow-all {name} security group {}", sg.id)
                })?;
                sg.id
            }
            None => {
                let mut tags = self.tags.clone();
                tags.push(tag);
                let group_name = format!("kuryr-rs-np-open-{name}");
                // Neutron takes no tags in the create: the description says whose it is, so that
                // one a crash left untagged is found and finished, not made again.
                let description = format!("kuryr-rs-np-open:{}:{name}", self.cluster_id);
                let leftover = client
                    .list_security_groups(&ListFilter::new().project_id(&project).name(group_name.clone()))
                    .await?
                    .into_iter()
                    .find(|sg| sg.description == description);
                let sg = match leftover {
                    Some(sg) => {
                        self.deployments.adoptable(deployment, || {
                            format!("untagged allow-all {name} security group {}", sg.id)
                        })?;
                        tracing::info!(group = %sg.id, direction = name, "finishing an allow-all group a crash left untagged");
                        sg
                    }
                    None => {
                        client
                            .create_security_group(&SecurityGroupCreate {
                                name: group_name,
                                project_id: Some(project.clone()),
                                description: Some(description),
                                ..Default::default()
                            })
                            .await?
                    }
                };
                // All of its direction, from anywhere, both families; nothing of the other. Not
                // left to Neutron's default rules: an operator's template may give a new group
                // no egress at all (and a finished leftover may lack some).
                let (stale, missing) = open_rules_plan(&sg.security_group_rules, name);
                for id in stale {
                    ignore_not_found(client.delete_security_group_rule(&id).await)?;
                }
                for eth in missing {
                    let r = client
                        .create_security_group_rule(&SecurityGroupRuleCreate {
                            security_group_id: sg.id.clone(),
                            direction: name.into(),
                            ethertype: Some(eth.into()),
                            project_id: Some(project.clone()),
                            ..Default::default()
                        })
                        .await;
                    match r {
                        // Not any 409: OverQuota is one too, and must fail the reconcile.
                        Err(e) if e.is_kind(&kuryr_neutron::ErrorKind::SecurityGroupRuleExists) => {}
                        r => {
                            r?;
                        }
                    }
                }
                // Tagged once complete: a group found by its tags has its rules.
                client
                    .replace_tags(kuryr_neutron::Taggable::SecurityGroup, &sg.id, &tags)
                    .await?;
                sg.id
            }
        };
        cache.insert(key, id.clone());
        Ok(id)
    }

    /// Puts the pod's ports on the groups its policies give it: one port update per port whose
    /// groups differ, none otherwise. Returns the number of updates.
    pub async fn sync_pod_ports(&self, pod: &Pod) -> Result<usize, Error> {
        let ns = pod.namespace().unwrap_or_default();
        let Some(kp) = Api::<KuryrPort>::namespaced(self.kube.clone(), &ns)
            .get_opt(&pod.name_any())
            .await?
        else {
            return Ok(0);
        };
        if kp.metadata.deletion_timestamp.is_some() {
            return Ok(0);
        }
        let mut known = self.namespace_policies(&ns).await?;
        let wanted = self.wanted_of(&mut known, &kp, pod).await?;
        self.put_on_groups(wanted).await
    }

    /// The pod's ports (as its KuryrPort `kp` records them) with the groups its policies give it.
    async fn wanted_of(
        &self,
        known: &mut NamespacePolicies,
        kp: &KuryrPort,
        pod: &Pod,
    ) -> Result<Vec<Wanted>, Error> {
        let mut wanted = Vec::new();
        for (deployment, ids) in default_ports(kp) {
            let mut want = self.groups_of(known, &deployment, pod).await?;
            want.sort();
            wanted.extend(ids.into_iter().map(|id| Wanted {
                deployment: deployment.clone(),
                port: id,
                groups: want.clone(),
                holder: (known.namespace.clone(), kp.name_any()),
            }));
        }
        Ok(wanted)
    }

    /// [`Self::sync_pod_ports`] for every pod of `namespace` (a policy of it made, changed or
    /// deleted), at a cost that does not grow with its pods times its policies: its pods,
    /// KuryrPorts and policies are listed once, each group looked up once, the ports read in
    /// lists of [`crate::drivers::vif::IDS_PER_LIST`] ids, and only a port whose groups differ is read again and
    /// written (in its turn, after any other change of it). A pod whose groups cannot be
    /// decided does not keep the others where they were: every failure is returned.
    pub async fn sync_namespace_ports(&self, namespace: &str) -> Result<usize, Error> {
        let lp = ListParams::default();
        let pods = Api::<Pod>::namespaced(self.kube.clone(), namespace)
            .list(&lp)
            .await?;
        let kps: HashMap<String, KuryrPort> = Api::<KuryrPort>::namespaced(self.kube.clone(), namespace)
            .list(&lp)
            .await?
            .into_iter()
            .filter(|kp| kp.metadata.deletion_timestamp.is_none())
            .map(|kp| (kp.name_any(), kp))
            .collect();
        let mut known = self.namespace_policies(namespace).await?;
        let mut errors = Vec::new();
        let mut wanted = Vec::new();
        for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let Some(kp) = kps.get(&pod.name_any()) else {
                continue;
            };
            match self.wanted_of(&mut known, kp, pod).await {
                Ok(w) => wanted.extend(w),
                Err(e) => errors.push(e),
            }
        }
        let updates = match self.put_on_groups(wanted).await {
            Ok(n) => n,
            Err(e) => {
                errors.push(e);
                0
            }
        };
        Error::collect(errors).map(|()| updates)
    }

    /// Puts each wanted port on its groups: the ports of a deployment are read in lists, and
    /// those that differ changed in their turn (read again there: the list may be older than a
    /// change made since), once their KuryrPort, read again in that turn, still holds them: a
    /// pod deleted since the listing has its port released, maybe back in a pool, where the
    /// groups of the pod it served must not follow it (the release waits for the turn). A port
    /// that is gone is no change.
    async fn put_on_groups(&self, wanted: Vec<Wanted>) -> Result<usize, Error> {
        let mut by_deployment: BTreeMap<String, Vec<Wanted>> = BTreeMap::new();
        for w in wanted {
            by_deployment.entry(w.deployment.clone()).or_default().push(w);
        }
        let mut errors = Vec::new();
        let mut updates = 0;
        for (deployment, ports) in by_deployment {
            let client = match self.client(&deployment) {
                Ok(c) => c,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let ids: Vec<&str> = ports.iter().map(|w| w.port.as_str()).collect();
            let have: HashMap<String, Vec<String>> =
                match ports_by_ids(&client, &ids, &ListFilter::new()).await {
                    Ok(list) => list
                        .into_iter()
                        .map(|p| {
                            let mut groups = p.security_groups;
                            groups.sort();
                            (p.id, groups)
                        })
                        .collect(),
                    Err(e) => {
                        errors.push(e);
                        continue;
                    }
                };
            for Wanted {
                port: id,
                groups: want,
                holder: (ns, name),
                ..
            } in ports
            {
                if have.get(&id).is_none_or(|groups| *groups == want) {
                    continue;
                }
                let kps = Api::<KuryrPort>::namespaced(self.kube.clone(), &ns);
                let still_held = || async {
                    let holder = kps.get_opt(&name).await?;
                    Ok(holder.is_some_and(|kp| {
                        kp.metadata.deletion_timestamp.is_none()
                            && default_ports(&kp).values().flatten().any(|p| *p == id)
                    }))
                };
                let written = self
                    .port_groups
                    .change_if(&client, &id, still_held, |port| {
                        let mut now = port.security_groups.clone();
                        now.sort();
                        if now == want {
                            Change::Keep
                        } else {
                            Change::Set(want.clone())
                        }
                    })
                    .await;
                match written {
                    Ok(w) => updates += usize::from(w),
                    Err(e) => errors.push(e),
                }
            }
        }
        Error::collect(errors).map(|()| updates)
    }

    /// `service_security_groups_driver = policy`: the groups of the policies that select a
    /// Service's backends (`selector` in `namespace`), as upstream gives the load balancer's
    /// VIP port; the defaults for a Service without selector or without selected backends.
    pub async fn service_groups(
        &self,
        deployment: &str,
        namespace: &str,
        selector: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<String>, Error> {
        let defaults = self.config.deployment_defaults(deployment).pod_security_groups;
        if selector.is_empty() {
            return Ok(defaults);
        }
        let pods = Api::<Pod>::namespaced(self.kube.clone(), namespace)
            .list(&ListParams::default())
            .await?;
        let mut known = self.namespace_policies(namespace).await?;
        let mut out = BTreeSet::new();
        for pod in pods.iter().filter(|p| {
            let labels = p.labels();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        }) {
            out.extend(self.groups_of(&mut known, deployment, pod).await?);
        }
        if out.is_empty() {
            return Ok(defaults);
        }
        Ok(out.into_iter().collect())
    }

    /// Where each policy's groups are known: (policy uid, deployment) of every
    /// KuryrNetworkPolicy, those being deleted too (their groups are the `kuryrnetworkpolicy`
    /// handler's to release), and of what this controller ensured.
    async fn known_groups(&self) -> Result<Known, Error> {
        let placed = self.list_placed().await?;
        let mut known = Known {
            unplaced: BTreeSet::new(),
            placed: placed.iter().map(|(u, d)| (u.clone(), d.clone())).collect(),
        };
        known.placed.extend(
            self.placed
                .lock()
                .await
                .iter()
                .map(|(u, d)| (u.clone(), d.clone())),
        );
        // A live policy no KuryrNetworkPolicy places (one without an owner reference) keeps its
        // groups everywhere: nobody knows where they belong.
        for np in Api::<NetworkPolicy>::all(self.kube.clone())
            .list(&ListParams::default())
            .await?
        {
            if let Some(uid) = np.uid()
                && !placed.contains_key(&uid)
            {
                known.unplaced.insert(uid);
            }
        }
        Ok(known)
    }

    /// Releases the security groups and address groups of this cluster that no policy places
    /// where they are: left by a policy force-deleted while no controller ran, or by a reconcile
    /// that raced the release (e.g. a deposed leader finishing its work). Each deployment is swept
    /// apart: a group is known only in the deployment its KuryrNetworkPolicy records. A group is
    /// only released when it is unknown in a listing taken after it was seen, so a policy created
    /// during the sweep is never mistaken for a gone one. Returns the groups' policies released.
    pub async fn sweep_orphans(&self) -> Result<usize, Error> {
        let before = self.known_groups().await?;
        let mut candidates: BTreeSet<(String, String)> = BTreeSet::new();
        let prefix = self.ag_description_prefix();
        // Only where the cluster tag is confirmed this cluster's (cluster_claim.rs).
        let deployments = self.deployments.claimed_names();
        let mut errors = vec![];
        for deployment in &deployments {
            let found = self.policies_with_groups(deployment, &prefix).await;
            match found {
                Ok(uids) => candidates.extend(
                    uids.into_iter()
                        .map(|u| (u, deployment.clone()))
                        .filter(|(u, d)| !before.contains(u, d)),
                ),
                // One unreachable cloud does not keep the others from being swept.
                Err(e) => errors.push(e),
            }
        }
        let mut released = 0;
        if !candidates.is_empty() {
            let after = self.known_groups().await?;
            for (uid, deployment) in candidates.iter().filter(|(u, d)| !after.contains(u, d)) {
                match self.release(uid, deployment).await {
                    Ok(()) => released += 1,
                    Err(e) => errors.push(e),
                }
            }
        }
        match errors.len() {
            0 => Ok(released),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Multiple(errors)),
        }
    }

    /// The uids of the policies this cluster has groups of in `deployment`.
    async fn policies_with_groups(&self, deployment: &str, prefix: &str) -> Result<BTreeSet<String>, Error> {
        let client = self.client(deployment)?;
        let mut uids = BTreeSet::new();
        for sg in client
            .list_security_groups(&ListFilter::new().tags([self.cluster_tag()]))
            .await?
        {
            if let Some(uid) = sg.tags.iter().find_map(|t| t.strip_prefix(TAG_POLICY)) {
                uids.insert(uid.to_string());
            }
        }
        for ag in client.list_address_groups(&ListFilter::new()).await? {
            if let Some(uid) = ag.description.strip_prefix(prefix) {
                uids.insert(uid.to_string());
            }
        }
        Ok(uids)
    }

    /// The orphan sweep every `every` while leading (`periodic::sweeps`). A failed pass (a
    /// group put back on a port by a write still in flight from a crashed leader, Neutron
    /// unreachable) is tried again sooner.
    pub async fn run_sweeps(self: Arc<Self>, every: Duration, stop: CancellationToken) {
        crate::periodic::sweeps("policy groups", every, stop, || self.sweep_orphans()).await
    }
}

/// Where policies' groups belong, for the orphan sweep.
struct Known {
    /// (policy uid, deployment) pairs recorded by KuryrNetworkPolicies.
    placed: BTreeSet<(String, String)>,
    /// Live policies without a KuryrNetworkPolicy placing them: known in every deployment.
    unplaced: BTreeSet<String>,
}

impl Known {
    fn contains(&self, uid: &str, deployment: &str) -> bool {
        self.unplaced.contains(uid) || self.placed.contains(&(uid.to_string(), deployment.to_string()))
    }
}

/// The owning NetworkPolicy's uid: what a KuryrNetworkPolicy's Neutron groups are tagged with.
pub fn policy_uid(knp: &KuryrNetworkPolicy) -> Option<String> {
    knp.owner_references()
        .iter()
        .find(|o| o.kind == "NetworkPolicy")
        .map(|o| o.uid.clone())
}

/// What an allow-all group of `direction` lacks and holds too much of: the ids of the rules to
/// delete (any of the other direction), and the ethertypes whose "all from anywhere" rule of
/// `direction` is missing.
fn open_rules_plan(rules: &[SecurityGroupRule], direction: &str) -> (Vec<String>, Vec<&'static str>) {
    let stale = rules
        .iter()
        .filter(|r| r.direction != direction)
        .map(|r| r.id.clone())
        .collect();
    let all = |r: &&SecurityGroupRule, eth: &str| {
        r.direction == direction
            && r.ethertype == eth
            && r.protocol.is_none()
            && r.port_range_min.is_none()
            && r.remote_ip_prefix.is_none()
            && r.remote_group_id.is_none()
            && r.remote_address_group_id.is_none()
    };
    let missing = ["IPv4", "IPv6"]
        .into_iter()
        .filter(|eth| !rules.iter().any(|r| all(&r, eth)))
        .collect();
    (stale, missing)
}

fn ignore_not_found(r: Result<(), kuryr_neutron::Error>) -> Result<(), Error> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        r => r.map_err(Error::from),
    }
}

/// A Neutron rule in the model's terms.
/// A port's groups once `sg` leaves them (`None`: it has not got it): `replacement` takes its
/// place if given; otherwise what is left, or `defaults` when nothing is.
fn without_group(
    now: &[String],
    sg: &str,
    replacement: Option<&str>,
    defaults: &[String],
) -> Option<Vec<String>> {
    if !now.iter().any(|s| s == sg) {
        return None;
    }
    let mut left: Vec<String> = now.iter().filter(|s| *s != sg).cloned().collect();
    if let Some(r) = replacement
        && !left.iter().any(|s| s == r)
    {
        left.push(r.to_string());
    }
    Some(if left.is_empty() { defaults.to_vec() } else { left })
}

/// A rule's protocol as Neutron shows it (a name, or the IP protocol number Neutron also takes):
/// `Ok(None)` for every protocol, `Err` for one the model never asks for (ICMP, a rule added by
/// hand), which must not be taken for "every protocol".
fn protocol_of(p: Option<&str>) -> Result<Option<Protocol>, String> {
    let Some(p) = p.filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let named = match p {
        "6" => "TCP",
        "17" => "UDP",
        "132" => "SCTP",
        other => other,
    };
    Protocol::parse(&named.to_ascii_uppercase())
        .map(Some)
        .ok_or_else(|| format!("protocol {p}"))
}

fn rule_of(r: &SecurityGroupRule, keys: &HashMap<String, AgKey>) -> Rule {
    let protocol = protocol_of(r.protocol.as_deref());
    let remote = match (
        &r.remote_address_group_id,
        &r.remote_ip_prefix,
        &r.remote_group_id,
    ) {
        (Some(ag), _, _) => keys
            .get(ag)
            .cloned()
            .map(Remote::Group)
            .unwrap_or_else(|| Remote::Foreign(ag.clone())),
        (None, Some(p), _) => p
            .parse()
            .map(Remote::Prefix)
            .unwrap_or_else(|_| Remote::Foreign(p.clone())),
        (None, None, Some(g)) => Remote::Foreign(g.clone()),
        (None, None, None) => Remote::Any,
    };
    // A protocol the model does not know makes the rule one no desired rule equals: the
    // reconcile deletes it rather than counting it as an allow-all.
    let remote = match &protocol {
        Err(p) => Remote::Foreign(p.clone()),
        Ok(_) => remote,
    };
    Rule {
        direction: if r.direction == "egress" {
            Direction::Egress
        } else {
            Direction::Ingress
        },
        ethertype: if r.ethertype == "IPv6" {
            EtherType::V6
        } else {
            EtherType::V4
        },
        protocol: protocol.unwrap_or(None),
        ports: match (r.port_range_min, r.port_range_max) {
            (Some(a), Some(b)) => Some((u16::try_from(a).unwrap_or(0), u16::try_from(b).unwrap_or(0))),
            _ => None,
        },
        remote,
    }
}

fn rule_request(
    sg: &str,
    project: &str,
    rule: &Rule,
    ags: &BTreeMap<AgKey, String>,
) -> Result<SecurityGroupRuleCreate, Error> {
    let mut req = SecurityGroupRuleCreate {
        security_group_id: sg.to_string(),
        direction: rule.direction.neutron().into(),
        ethertype: Some(rule.ethertype.neutron().into()),
        protocol: rule.protocol.map(|p| p.neutron().to_string()),
        port_range_min: rule.ports.map(|p| u32::from(p.0)),
        port_range_max: rule.ports.map(|p| u32::from(p.1)),
        project_id: Some(project.to_string()),
        description: Some("kuryr-rs NetworkPolicy".into()),
        ..Default::default()
    };
    match &rule.remote {
        Remote::Any => {}
        Remote::Prefix(c) => req.remote_ip_prefix = Some(c.to_string()),
        Remote::Group(k) => {
            let id = ags
                .get(k)
                .ok_or_else(|| Error::not_ready(format!("address group {}", k.0)))?;
            req.remote_address_group_id = Some(id.clone());
        }
        Remote::Foreign(_) => return Err(Error::invalid("rule", "a foreign remote is never desired")),
    }
    Ok(req)
}

/// What deciding the groups of one namespace's pods needs ([`NetworkPolicyDriver::groups_of`]).
struct NamespacePolicies {
    namespace: String,
    specs: Vec<PolicySpec>,
    uids: HashMap<PolicyKey, String>,
    /// Policy uid -> the deployment its groups live in; listed at the first selected pod.
    placed: Option<HashMap<String, String>>,
    /// (deployment, policy uid, variant) -> security group id, as looked up.
    groups: HashMap<(String, String, String), String>,
}

/// A port and the groups its pod's policies give it.
struct Wanted {
    deployment: String,
    port: String,
    /// Sorted.
    groups: Vec<String>,
    /// (namespace, name) of the KuryrPort holding the port.
    holder: (String, String),
}

/// A KuryrPort's default-interface ports by the deployment each was made in (upstream
/// KuryrPorts record none: the default one).
fn default_ports(kp: &KuryrPort) -> BTreeMap<String, Vec<String>> {
    let mut ports: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for v in recorded_vifs(kp).into_iter().filter(|v| v.default) {
        let deployment = v
            .origin
            .map_or_else(|| DEFAULT_DEPLOYMENT.to_string(), |o| o.deployment);
        ports.entry(deployment).or_default().push(v.vif.id().to_string());
    }
    ports
}

/// A subnet's `cidr`, parsed.
fn subnet_cidr(id: &str, cidr: &str) -> Result<Cidr, Error> {
    cidr.parse::<Cidr>()
        .map_err(|e| Error::invalid(format!("subnet {id}"), format!("cidr {cidr:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allow_all_group_gets_its_rules_whatever_neutron_gave_it() {
        let r = |id: &str, direction: &str, eth: &str, prefix: Option<&str>| SecurityGroupRule {
            id: id.into(),
            direction: direction.into(),
            ethertype: eth.into(),
            remote_ip_prefix: prefix.map(str::to_string),
            ..Default::default()
        };
        // Neutron's usual defaults: all egress of both families.
        let defaults = [r("e4", "egress", "IPv4", None), r("e6", "egress", "IPv6", None)];
        assert_eq!(open_rules_plan(&defaults, "egress"), (vec![], vec![]));
        assert_eq!(
            open_rules_plan(&defaults, "ingress"),
            (vec!["e4".to_string(), "e6".to_string()], vec!["IPv4", "IPv6"])
        );
        // An operator's template with no egress, or a narrower one: the egress group is made whole.
        assert_eq!(open_rules_plan(&[], "egress"), (vec![], vec!["IPv4", "IPv6"]));
        let narrow = [r("n4", "egress", "IPv4", Some("10.0.0.0/8"))];
        assert_eq!(open_rules_plan(&narrow, "egress"), (vec![], vec!["IPv4", "IPv6"]));
    }

    fn rule(protocol: Option<&str>) -> SecurityGroupRule {
        SecurityGroupRule {
            direction: "ingress".into(),
            ethertype: "IPv4".into(),
            protocol: protocol.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn a_group_leaving_a_port_gives_way_to_its_replacement_else_to_what_is_left() {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let defaults = v(&["default"]);
        // An old variant: the pod waits on the base variant, not on the (open) defaults.
        assert_eq!(
            without_group(&v(&["old"]), "old", Some("base"), &defaults),
            Some(v(&["base"]))
        );
        assert_eq!(
            without_group(&v(&["old", "base"]), "old", Some("base"), &defaults),
            Some(v(&["base"]))
        );
        // A policy deleted: its pods go back to their other groups, or to the defaults.
        assert_eq!(
            without_group(&v(&["gone", "other"]), "gone", None, &defaults),
            Some(v(&["other"]))
        );
        assert_eq!(
            without_group(&v(&["gone"]), "gone", None, &defaults),
            Some(defaults.clone())
        );
        assert_eq!(without_group(&v(&["other"]), "gone", None, &defaults), None);
    }

    #[test]
    fn a_protocol_the_model_does_not_know_is_never_read_as_every_protocol() {
        let keys = HashMap::new();
        let any = rule_of(&rule(None), &keys);
        assert_eq!((any.protocol, &any.remote), (None, &Remote::Any));
        for (p, want) in [
            ("tcp", Protocol::Tcp),
            ("6", Protocol::Tcp),
            ("UDP", Protocol::Udp),
            ("132", Protocol::Sctp),
        ] {
            let r = rule_of(&rule(Some(p)), &keys);
            assert_eq!((r.protocol, &r.remote), (Some(want), &Remote::Any), "{p}");
        }
        for p in ["icmp", "1", "vrrp"] {
            let r = rule_of(&rule(Some(p)), &keys);
            assert!(
                matches!(&r.remote, Remote::Foreign(f) if f.contains(p)),
                "{p}: {r:?}"
            );
            assert_ne!(r, any, "{p} is not every protocol");
        }
    }
}
