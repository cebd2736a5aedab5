//! Port pools (docs/architecture.md#port-pools): pre-created Neutron ports handed to pods without a Neutron
//! call, recycled on release, persisted as KuryrPortPool objects.
//!
//! - [`state`]: the pure decisions (refill, borrow, recycle, max, TTL), unit tested
//! - [`driver`]: [`driver::PoolDriver`], the `neutron` / `nested` pool drivers over a VIF driver
//! - [`recover`]: restart recovery from KuryrPortPools + KuryrPorts, cross-checked with Neutron
//! - [`persist`]: the coalescing KuryrPortPool writer and the recovery reader
//! - [`sweep`]: deletion of kuryr-tagged ports owned by nothing (two passes)
//! - [`nodes`]: the Node watch dropping the pools of deleted and re-created nodes
//! - [`api`]: the pool management HTTP API on a unix socket and its client
//!
//! [`PoolManager`] ties them together for the controller: it implements [`VifPool`] (routing
//! per pod VIF driver for `multi_pool`), and [`PoolManager::run`] recovers, then runs the
//! maintenance, flusher, sweep and API tasks.

pub mod api;
pub mod driver;
pub mod nodes;
pub mod persist;
pub mod recover;
pub mod state;
pub mod sweep;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kuryr_config::{KuryrConfig, PodVifDriver, VifPoolDriver, VifPoolSection};
use kuryr_crds::Vif;
use tokio_util::sync::CancellationToken;

use crate::context::Platform;
use crate::drivers::pool::{NoopPool, VifOrigin, VifPool};
use crate::drivers::vif::VifDriver;
use crate::drivers::{PodRef, PortSpec};
use crate::error::Error;
use crate::locked::Locked;
use driver::{PoolDriver, PoolKind, PoolOptions, PoolSummary};
use persist::Persister;

/// The least time a port may be held in use unrecorded before the books question it.
pub const IN_USE_GRACE: Duration = Duration::from_secs(30);

/// How long a leadership term's pool tasks may take to stop after the term ended, before they
/// are dropped mid-call (what they leave in Neutron is tagged: the next recovery adopts it).
pub const TERM_GRACE: Duration = Duration::from_secs(3);

/// Node label naming the pod VIF driver of a node's pods (upstream `multi_pool`).
pub const NODE_POD_VIF_LABEL: &str = "pod_vif";

/// The controller's pool driver (`[kubernetes] vif_pool_driver`), with its background tasks.
pub struct PoolManager {
    ctx: Arc<Platform>,
    name: &'static str,
    /// Pod VIF driver -> its pool driver (`noop` entries included).
    routes: BTreeMap<PodVifDriver, Arc<dyn VifPool>>,
    /// The route of `[kubernetes] pod_vif_driver` (or the first one).
    primary: Arc<dyn VifPool>,
    /// The pooling drivers among `routes`.
    pooled: Vec<Arc<PoolDriver>>,
    default_vif: PodVifDriver,
    multi: bool,
    /// node -> pod VIF driver (multi_pool), forgotten when the Node watch sees its label change.
    node_vif: Mutex<HashMap<String, PodVifDriver>>,
    persister: Arc<Persister>,
    ready: AtomicBool,
    api_socket: Mutex<Option<PathBuf>>,
    /// Held by [`PoolManager::run`] for one leadership term, so that a term's end (dropping its
    /// pools) never overlaps the next term's recovery.
    term: tokio::sync::Mutex<()>,
}

/// How long a port may be held in use, or exist, before its KuryrPort must record it, for an
/// update period of `period`: two periods, at least [`IN_USE_GRACE`].
pub fn in_use_grace(period: Duration) -> Duration {
    (period * 2).max(IN_USE_GRACE)
}

/// Builds the pool driver `[kubernetes] vif_pool_driver` names over `driver` (the pod VIF
/// driver). For `multi_pool` use [`build_multi`].
pub fn build(
    ctx: Arc<Platform>,
    driver: Arc<dyn VifDriver>,
    cfg: &VifPoolSection,
) -> Result<Arc<PoolManager>, Error> {
    let kind = ctx.config.kubernetes.vif_pool_driver;
    if kind == VifPoolDriver::MultiPool {
        return build_multi(ctx, vec![driver], cfg);
    }
    let vif_kind = driver.kind();
    let pool = pool_for(&ctx, kind, driver, cfg)?;
    let pooled = pool.1.into_iter().collect();
    PoolManager::new(
        ctx,
        kind.as_str(),
        BTreeMap::from([(vif_kind, pool.0)]),
        pooled,
        vif_kind,
        false,
    )
}

/// `multi_pool`: one pool driver per pod VIF driver, as `[vif_pool] vif_pool_mapping` (or the
/// deprecated `pools_vif_drivers`) maps them. `drivers` are the VIF drivers the mapping names;
/// pods are routed by their node's `pod_vif` label, else `[kubernetes] pod_vif_driver`.
pub fn build_multi(
    ctx: Arc<Platform>,
    drivers: Vec<Arc<dyn VifDriver>>,
    cfg: &VifPoolSection,
) -> Result<Arc<PoolManager>, Error> {
    let mut mapping: BTreeMap<PodVifDriver, VifPoolDriver> = cfg.vif_pool_mapping.clone();
    for (pool, vif) in &cfg.pools_vif_drivers {
        mapping.entry(*vif).or_insert(*pool);
    }
    if mapping.is_empty() {
        return Err(Error::Config(
            "[vif_pool] vif_pool_mapping must map pod VIF drivers to pool drivers for multi_pool".into(),
        ));
    }
    let mut routes = BTreeMap::new();
    let mut pooled = Vec::new();
    for (vif_name, pool_kind) in mapping {
        let driver = drivers
            .iter()
            .find(|d| d.kind() == vif_name)
            .cloned()
            .ok_or_else(|| {
                Error::Config(format!(
                    "[vif_pool] vif_pool_mapping names {}, but no such VIF driver was built",
                    vif_name.as_str()
                ))
            })?;
        if pool_kind == VifPoolDriver::MultiPool {
            return Err(Error::Config(format!(
                "[vif_pool] vif_pool_mapping: {} cannot map to multi_pool",
                vif_name.as_str()
            )));
        }
        let (pool, p) = pool_for(&ctx, pool_kind, driver, cfg)?;
        routes.insert(vif_name, pool);
        pooled.extend(p);
    }
    let default_vif = ctx.config.kubernetes.pod_vif_driver;
    PoolManager::new(ctx, "multi_pool", routes, pooled, default_vif, true)
}

/// A route and, when it pools, its pool driver.
type Route = (Arc<dyn VifPool>, Option<Arc<PoolDriver>>);

fn pool_for(
    ctx: &Arc<Platform>,
    kind: VifPoolDriver,
    driver: Arc<dyn VifDriver>,
    cfg: &VifPoolSection,
) -> Result<Route, Error> {
    let pool_kind = match kind {
        VifPoolDriver::Noop => return Ok((Arc::new(NoopPool::new(driver)), None)),
        VifPoolDriver::Neutron => PoolKind::Neutron,
        VifPoolDriver::Nested => PoolKind::Nested,
        VifPoolDriver::MultiPool => {
            return Err(Error::Config("multi_pool cannot nest".into()));
        }
    };
    let mut opts = PoolOptions::from_config(&ctx.config, ctx.deployments.clone(), ctx.metrics.clone());
    opts.limits = state::Limits::from_config(cfg);
    opts.update_frequency = Duration::from_secs(cfg.ports_pool_update_frequency.max(1));
    let d = PoolDriver::new(pool_kind, driver, opts)?;
    Ok((d.clone(), Some(d)))
}

fn api_socket(config: &KuryrConfig) -> Option<PathBuf> {
    // Upstream serves the pool manager only with `enable_manager`.
    config
        .kubernetes
        .enable_manager
        .then(|| PathBuf::from(&config.pool_manager.sock_file))
}

impl PoolManager {
    fn new(
        ctx: Arc<Platform>,
        name: &'static str,
        routes: BTreeMap<PodVifDriver, Arc<dyn VifPool>>,
        pooled: Vec<Arc<PoolDriver>>,
        default_vif: PodVifDriver,
        multi: bool,
    ) -> Result<Arc<Self>, Error> {
        let primary = routes
            .get(&default_vif)
            .or_else(|| routes.values().next())
            .cloned()
            .ok_or_else(|| Error::Config("no pool driver configured".into()))?;
        let persister = Arc::new(Persister::new(
            ctx.kube.clone(),
            ctx.config.kubernetes.controller_namespace.clone(),
        ));
        let api_socket = api_socket(&ctx.config);
        let ready = pooled.is_empty();
        Ok(Arc::new(Self {
            ctx,
            name,
            routes,
            primary,
            pooled,
            default_vif,
            multi,
            node_vif: Mutex::default(),
            persister,
            ready: AtomicBool::new(ready),
            api_socket: Mutex::new(api_socket),
            term: tokio::sync::Mutex::new(()),
        }))
    }

    /// Serves the pool management API on `path` instead of `[pool_manager] sock_file` (also
    /// without `enable_manager`); `None` disables it. Takes effect at [`PoolManager::run`].
    pub fn set_api_socket(&self, path: Option<PathBuf>) {
        *self.api_socket.locked() = path;
    }

    /// True once every pool has been recovered; until then requests answer ResourceNotReady.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The pooling drivers (none for `noop`).
    pub fn drivers(&self) -> &[Arc<PoolDriver>] {
        &self.pooled
    }

    /// Every pool of every driver.
    pub fn summaries(&self) -> Vec<PoolSummary> {
        self.pooled.iter().flat_map(|d| d.summaries()).collect()
    }

    /// The driver and key of the pool named `name`.
    pub fn find(&self, name: &str) -> Option<(Arc<PoolDriver>, state::Key)> {
        self.pooled
            .iter()
            .find_map(|d| d.key_by_name(name).map(|k| (d.clone(), k)))
    }

    async fn route_for_pod(&self, pod: &PodRef) -> Result<&Arc<dyn VifPool>, Error> {
        let vif = if self.multi {
            self.node_vif_driver(&pod.node).await?
        } else {
            self.default_vif
        };
        self.route(vif)
    }

    fn route(&self, vif_driver: PodVifDriver) -> Result<&Arc<dyn VifPool>, Error> {
        self.routes.get(&vif_driver).ok_or_else(|| {
            Error::Config(format!(
                "no pool driver for pod VIF driver {} (see [vif_pool] vif_pool_mapping)",
                vif_driver.as_str()
            ))
        })
    }

    /// The route of a VIF by the driver its origin names: release goes back to the pool that
    /// made the port even if the node's label changed since.
    fn route_of(&self, origin: &VifOrigin) -> Result<&Arc<dyn VifPool>, Error> {
        let kind = origin.driver.parse::<PodVifDriver>().map_err(|_| {
            Error::invalid(
                "KuryrPort status origin.driver",
                format!("{:?} is not a pod VIF driver", origin.driver),
            )
        })?;
        self.route(kind)
    }

    async fn node_vif_driver(&self, node: &str) -> Result<PodVifDriver, Error> {
        if let Some(v) = self.node_vif.locked().get(node) {
            return Ok(*v);
        }
        let n = Api::<Node>::all(self.ctx.kube.clone()).get(node).await?;
        let vif = match n.metadata.labels.as_ref().and_then(|l| l.get(NODE_POD_VIF_LABEL)) {
            Some(label) => label.parse::<PodVifDriver>().map_err(|_| {
                Error::invalid(
                    format!("node {node} label {NODE_POD_VIF_LABEL}"),
                    format!("{label:?} is not a pod VIF driver"),
                )
            })?,
            None => self.default_vif,
        };
        self.node_vif.locked().insert(node.to_string(), vif);
        Ok(vif)
    }

    /// Pre-population, for the kuryrnetwork handler once a namespace network
    /// and subnet exist: starts filling the pool of `spec` on every node up to
    /// `[vif_pool] ports_pool_min` (so `ports_pool_min = 0` turns it off), routed per node as
    /// pods are. Nodes whose route does not pool, or whose pool host cannot be found (a nested
    /// node without trunk), are skipped with a log line. Returns the pools a refill started for;
    /// ResourceNotReady while recovery runs (the handler retries).
    pub async fn prepopulate(&self, spec: &PortSpec) -> Result<Vec<String>, Error> {
        if !self.is_ready() {
            return Err(Error::not_ready("port pools are being recovered"));
        }
        if self.pooled.is_empty() || self.ctx.config.vif_pool.ports_pool_min == 0 {
            return Ok(Vec::new());
        }
        let nodes = Api::<Node>::all(self.ctx.kube.clone())
            .list(&kube::api::ListParams::default())
            .await?;
        let mut started = Vec::new();
        for node in nodes.items {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            let vif = if self.multi {
                self.node_vif_driver(name).await?
            } else {
                self.default_vif
            };
            let Some(driver) = self.pooled.iter().find(|d| d.vif().kind() == vif) else {
                continue;
            };
            match driver.prepopulate(name, spec).await {
                Ok(Some(pool)) => started.push(pool),
                Ok(None) => {}
                // The pools stopped serving (a term ended): the handler retries. A node not
                // ready for a pool (a nested node whose VM port is not found yet, a control
                // plane node on no worker subnet) is skipped like the others: it must not keep
                // the nodes after it unfilled and the network unpopulated.
                Err(e @ Error::ResourceNotReady(_)) if !self.is_ready() => return Err(e),
                Err(e @ Error::ResourceNotReady(_)) => {
                    tracing::info!(node = name, error = %e, "node's pool not pre-populated: no pool host yet")
                }
                Err(e) => tracing::warn!(node = name, error = %e, "cannot pre-populate the node's pool"),
            }
        }
        Ok(started)
    }

    /// A namespace network is being deleted: drops every pool on it, deleting their available
    /// and recyclable ports in Neutron and their KuryrPortPool objects, so that Neutron lets the
    /// network go. ResourceNotReady while recovery runs (the pools' content is unknown yet).
    pub async fn drop_network(&self, deployment: &str, network_id: &str) -> Result<(), Error> {
        self.drop_pools("network", network_id, |_, k| {
            k.deployment == deployment && k.network_id == network_id
        })
        .await
    }

    /// A security group is being deleted (its NetworkPolicy is gone): no pod will ask for a set
    /// of groups holding it again, so the pools keyed by it would keep their spare ports for
    /// good. They are dropped first, which also keeps a recycle from putting the group back on
    /// a port while it is being deleted.
    pub async fn drop_security_group(&self, security_group: &str) -> Result<(), Error> {
        self.drop_pools("security group", security_group, |_, k| {
            k.security_groups.iter().any(|g| g == security_group)
        })
        .await
    }

    async fn drop_pools(
        &self,
        why: &str,
        id: &str,
        which: impl Fn(&PoolDriver, &state::Key) -> bool,
    ) -> Result<(), Error> {
        if self.pooled.is_empty() {
            return Ok(());
        }
        if !self.is_ready() {
            return Err(Error::not_ready("port pools are being recovered"));
        }
        let mut first = None;
        for d in &self.pooled {
            match d.drop_where(|k| which(d, k)).await {
                Ok(names) => {
                    for name in names {
                        tracing::info!(pool = %name, because = why, id, "pool dropped: what it is keyed by is deleted");
                        if let Err(e) = self.persister.delete(&name).await {
                            // The reconcile pass deletes objects naming no pool.
                            tracing::warn!(pool = %name, error = %e, "could not delete KuryrPortPool");
                        }
                    }
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Recovers every pooling driver from the Kubernetes API and Neutron.
    pub async fn recover(&self) -> Result<(), Error> {
        let mut input = self.persister.load_recovery_input().await?;
        recover::name_legacy_drivers(&self.pooled, &mut input).await?;
        for d in &self.pooled {
            let report = d.recover(&input).await?;
            self.ctx.metrics.pool_event("recovered", report.adopted as u64);
        }
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// How long a port may be held in use before its KuryrPort must record it: a pass does not
    /// question ports taken more recently (a handler between taking a port and writing the
    /// KuryrPort status).
    pub fn in_use_grace(&self) -> Duration {
        in_use_grace(Duration::from_secs(
            self.ctx.config.vif_pool.ports_pool_update_frequency.max(1),
        ))
    }

    /// One pass over the books and the orphans (needs recovery done): ports the pools hold in
    /// use that no KuryrPort records are forgotten (two passes in a row, taken before
    /// [`PoolManager::in_use_grace`]); then the orphan sweep. Returns the deleted port ids.
    pub async fn sweep_once(&self, suspects: &mut sweep::Suspects) -> Result<Vec<String>, Error> {
        let listed_at = Timestamp::now();
        let recorded: HashSet<String> = self.persister.ports_in_use().await?;
        let grace = SignedDuration::try_from(self.in_use_grace()).unwrap_or(SignedDuration::MAX);
        let before = listed_at.checked_sub(grace).unwrap_or(listed_at);
        for d in &self.pooled {
            d.reconcile_in_use(&recorded, before);
        }
        // A refill in flight may have ports Neutron lists but no pool records yet, for as long as
        // Neutron takes to answer (seconds on a loaded server, more than a pass period): such a
        // pass could confirm them as orphans. Only ports created before `before` are swept, so
        // only a refill running since then holds the pass back (its suspects wait); younger
        // ones make younger ports. Skipping for any refill at all never swept a busy cluster,
        // where some refill is always running. A refill started after this check has no port
        // in that earlier pass' listing.
        if self
            .pooled
            .iter()
            .filter_map(|d| d.refilling_since())
            .any(|since| since <= before)
        {
            return Ok(Vec::new());
        }
        // Owned sets are read before Neutron is listed: a port created after this read is
        // unowned at most once before the next pass sees it owned.
        let mut owned = recorded;
        for d in &self.pooled {
            owned.extend(d.owned_ports().into_values().flatten());
        }
        let tag = kuryr_crds::names::neutron::cluster_tag(&self.ctx.cluster_id);
        let vifs = self.vif_drivers();
        let deleted = sweep::sweep(&self.ctx.deployments, &vifs, &tag, &owned, before, suspects).await?;
        self.ctx
            .metrics
            .pool_event("deleted_orphan", deleted.len() as u64);
        Ok(deleted)
    }

    /// One leadership term: recovers (retrying until it succeeds), then runs maintenance, the
    /// KuryrPortPool flusher, the orphan sweep and the management API until `stop`; then drops
    /// every pool ([`PoolManager::end_term`]), so that the next term recovers again from the
    /// KuryrPortPools, KuryrPorts and Neutron as the other leaders left them.
    ///
    /// Guarantee: once `stop` fires, no request is served from this term's pools, even while
    /// its tasks are still inside a Neutron call (a maintenance pass through a Neutron outage
    /// can take longer than the other replica needs to win the lease and hand those ports
    /// out); they get [`TERM_GRACE`] to finish (the KuryrPortPool flush) and are then dropped.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let _term = tokio::select! {
            _ = stop.cancelled() => return,
            t = self.term.lock() => t,
        };
        let serve = self.clone().serve_term(&stop);
        tokio::pin!(serve);
        tokio::select! {
            _ = &mut serve => {}
            _ = stop.cancelled() => {
                self.ready.store(false, Ordering::Release);
                self.pooled.iter().for_each(|d| d.stop_serving());
                if tokio::time::timeout(TERM_GRACE, &mut serve).await.is_err() {
                    tracing::info!(pool_driver = self.name, "pool tasks still busy at the end of the term; dropped");
                }
            }
        }
        self.end_term().await;
    }

    /// Leadership lost (or shutdown): forget every pool and answer ResourceNotReady until the
    /// next recovery. The KuryrPortPool objects stay: they are the next leader's input.
    pub async fn end_term(&self) {
        if self.pooled.is_empty() {
            return;
        }
        self.ready.store(false, Ordering::Release);
        for d in &self.pooled {
            d.reset();
        }
        self.persister.forget_created().await;
        tracing::info!(
            pool_driver = self.name,
            "port pools dropped until the next recovery"
        );
    }

    async fn serve_term(self: Arc<Self>, stop: &CancellationToken) {
        let mut backoff = Duration::from_secs(1);
        while !self.pooled.is_empty() && !self.is_ready() {
            let recovered = tokio::select! {
                _ = stop.cancelled() => return,
                r = self.recover() => r,
            };
            match recovered {
                // Recovered just as the term ended: serve nothing (`run` marks it unready).
                Ok(()) if stop.is_cancelled() => return,
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "port pool recovery failed; retrying");
                    // Recovery starts from empty drivers: drop what the failed attempt adopted.
                    self.pooled.iter().for_each(|d| d.reset());
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        let mut tasks = tokio::task::JoinSet::new();
        for d in &self.pooled {
            let (d1, s1) = (d.clone(), stop.clone());
            tasks.spawn(async move { d1.run_maintenance(s1).await });
            let (p, d2, s2) = (self.persister.clone(), d.clone(), stop.clone());
            tasks.spawn(async move { p.run(d2, s2).await });
        }
        if !self.pooled.is_empty() {
            let (me, s) = (self.clone(), stop.clone());
            tasks.spawn(async move { me.run_sweep(s).await });
            let (me, s) = (self.clone(), stop.clone());
            tasks.spawn(async move { me.watch_nodes(s).await });
        }
        let socket = self.api_socket.locked().clone();
        if let Some(path) = socket {
            let (me, s) = (self.clone(), stop.clone());
            tasks.spawn(async move {
                if let Err(e) = api::serve(me, &path, s).await {
                    tracing::error!(error = %e, path = %path.display(), "pool management API stopped");
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Every VIF driver that may have made a pod's port, once each: `multi_pool` may route some
    /// nodes to `noop`, whose driver no pool holds.
    pub fn vif_drivers(&self) -> Vec<Arc<dyn VifDriver>> {
        let mut vifs: Vec<Arc<dyn VifDriver>> = Vec::new();
        for v in self
            .pooled
            .iter()
            .map(|d| d.vif())
            .chain(self.routes.values().map(|r| r.vif_driver()))
        {
            if !vifs.iter().any(|known| known.name() == v.name()) {
                vifs.push(v.clone());
            }
        }
        vifs
    }

    async fn run_sweep(&self, stop: CancellationToken) {
        let period = Duration::from_secs(self.ctx.config.vif_pool.ports_pool_update_frequency.max(1));
        // A pass under way finishes: `run` gives the term's tasks TERM_GRACE.
        let mut passes = sweep::Passes::new(period);
        while passes.next(&stop).await {
            if let Err(e) = self.sweep_once(&mut passes.suspects).await {
                tracing::warn!(error = %e, "orphan sweep failed");
            }
            if let Err(e) = self.persister.reconcile(&self.pooled).await {
                tracing::warn!(error = %e, "KuryrPortPool reconcile failed");
            }
        }
    }
}

#[async_trait]
impl VifPool for PoolManager {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn request_vif(&self, pod: &PodRef, spec: &PortSpec) -> Result<(Vif, VifOrigin), Error> {
        if !self.is_ready() {
            return Err(Error::not_ready("port pools are being recovered"));
        }
        self.route_for_pod(pod).await?.request_vif(pod, spec).await
    }

    async fn release_vif(&self, vif: &Vif, origin: &VifOrigin, holder: &str) -> Result<(), Error> {
        if !self.is_ready() {
            return Err(Error::not_ready("port pools are being recovered"));
        }
        self.route_of(origin)?.release_vif(vif, origin, holder).await
    }

    async fn activate_vif(&self, origin: &VifOrigin, vif: &mut Vif) -> Result<(), Error> {
        self.route_of(origin)?.activate_vif(origin, vif).await
    }

    fn vif_driver(&self) -> &Arc<dyn VifDriver> {
        self.primary.vif_driver()
    }
}
