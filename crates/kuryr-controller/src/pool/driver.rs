//! The `neutron` (bare metal) and `nested` (trunk) pool drivers: [`PoolDriver`] implements
//! [`VifPool`] on top of any [`VifDriver`], with the decisions of [`super::state`].
//!
//! - hit path: no Neutron call (a name/device id update only with `[kubernetes] port_debug`);
//! - refills run in background tasks, one bulk `request_vifs` per refill, the ports tagged with
//!   the pool tag in the same request (`PortOwner::Pool`);
//! - a request finding its pool empty starts a refill at once and waits for it at most
//!   [`REFILL_WAIT`], then answers ResourceNotReady (or the refill's quota / address exhaustion
//!   error, which the pod sees as an Event);
//! - [`PoolDriver::maintain`] is one maintenance pass (recycle, TTL, failed refills, port status).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kuryr_config::PodVifDriver;
use kuryr_crds::names::neutron as tags;
use kuryr_crds::{PoolKey, Vif};
use kuryr_neutron::{ListFilter, PortUpdate};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::recover::{Recovered, RecoveryInput, RecoveryReport};
use super::state::{
    Backoff, Entry, Key, Limits, PoolMeta, Pools, RecycleAction, RecycleOutcome, RecycleStep, Refill,
    RefillFailure, Released, Take,
};
use crate::drivers::pool::{VifOrigin, VifPool, holder, origin_for};
use crate::drivers::vif::{PortOwner, VifDriver};
use crate::drivers::{PodRef, PortSpec};
use crate::error::Error;
use crate::locked::Locked;
use crate::metrics::Metrics;
use crate::openstack::Deployments;

/// Which pool driver (`[kubernetes] vif_pool_driver`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// `neutron`: bare-metal ports bound to the node.
    Neutron,
    /// `nested`: subports of the node VM's trunk (or macvlan ports of the VM port).
    Nested,
}

impl PoolKind {
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Neutron => "neutron",
            PoolKind::Nested => "nested",
        }
    }

    /// Upstream pairs `neutron` with `neutron-vif` and `nested` with the nested VIF drivers.
    pub fn check_vif_driver(self, vif_driver: PodVifDriver) -> Result<(), Error> {
        let ok = match self {
            PoolKind::Neutron => vif_driver == PodVifDriver::NeutronVif,
            PoolKind::Nested => matches!(vif_driver, PodVifDriver::NestedVlan | PodVifDriver::NestedMacvlan),
        };
        if ok {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "vif_pool_driver {} cannot pool ports of pod_vif_driver {vif_driver}",
                self.name()
            )))
        }
    }
}

/// How long a request finding its pool empty waits for the refill it triggered before answering
/// ResourceNotReady. A bulk create takes 0.2-2 s on a real neutron-server: waiting hands the
/// port out as soon as it lands, where the pipeline's retry backoff (0.25 s doubling, jittered)
/// would add up to one more interval on top. Short, so that a slow or failing Neutron never holds
/// a handler slot for long.
pub const REFILL_WAIT: Duration = Duration::from_secs(2);

/// Released ports cleaned (or deleted) at once by a recycle pass: a real neutron-server serves
/// requests on several workers.
const RECYCLE_CONCURRENCY: usize = 8;

/// Everything a pool driver needs besides its VIF driver; [`PoolOptions::from_config`] reads
/// it from `kuryr.conf`.
#[derive(Clone)]
pub struct PoolOptions {
    pub deployments: Deployments,
    pub limits: Limits,
    pub port_debug: bool,
    /// `[neutron_defaults] network_device_mtu` (0 = the network's), for VIFs of recovered ports.
    pub mtu: u32,
    /// The cluster tag (`kuryr-rs.cluster=<id>`): recovery and the orphan sweep only ever look
    /// at ports carrying it and `kuryr-rs`.
    pub cluster_tag: String,
    pub metrics: Metrics,
    /// How long a request waits for the refill it triggered before answering ResourceNotReady.
    pub refill_wait: Duration,
    /// `[vif_pool] ports_pool_update_frequency`.
    pub update_frequency: Duration,
}

impl PoolOptions {
    pub fn from_config(
        config: &kuryr_config::KuryrConfig,
        deployments: Deployments,
        metrics: Metrics,
    ) -> Self {
        Self {
            deployments,
            limits: Limits::from_config(&config.vif_pool),
            port_debug: config.kubernetes.port_debug,
            mtu: config.neutron_defaults.network_device_mtu,
            cluster_tag: tags::cluster_tag(&config.kubernetes.cluster_id),
            metrics,
            refill_wait: REFILL_WAIT,
            update_frequency: Duration::from_secs(config.vif_pool.ports_pool_update_frequency.max(1)),
        }
    }
}

/// A pool driver: the pools of one pod VIF driver.
pub struct PoolDriver {
    me: Weak<PoolDriver>,
    kind: PoolKind,
    vif: Arc<dyn VifDriver>,
    opts: PoolOptions,
    state: Mutex<Pools<Vif>>,
    /// What a refill of each key creates (the last request's network and subnets).
    specs: Mutex<HashMap<Key, PortSpec>>,
    /// (deployment, node) -> pool host: a node's trunk never changes, and the hit path must
    /// not ask Neutron.
    hosts: Mutex<HashMap<(String, String), String>>,
    /// Bumped after every refill; requests waiting on an empty pool watch it.
    refilled: watch::Sender<u64>,
    /// Wakes the KuryrPortPool flusher.
    changed: Notify,
    /// Wakes maintenance for a recycle pass now: a release took a pool beyond `max`, which it
    /// may exceed for one update period at most, not until the next periodic pass ends.
    over_max: Notify,
    ready: AtomicBool,
    /// Bumped by [`PoolDriver::reset`]: a refill started before it lands nowhere.
    generation: AtomicU64,
    /// (deployment, project) -> when its port quota was last checked for a pool backing off
    /// after OverQuota.
    quota_checked: Mutex<HashMap<(String, String), Instant>>,
    /// Ports found in use by no KuryrPort in the last books pass (forgotten when the next pass
    /// finds them so again).
    unrecorded: Mutex<BTreeSet<String>>,
    /// Pool names whose sizes the metrics show.
    published: Mutex<BTreeSet<String>>,
    /// When each refill running now started, by a sequence number ([`PoolDriver::refilling_since`]).
    running: Mutex<BTreeMap<u64, Timestamp>>,
    refill_seq: AtomicU64,
}

/// A running refill's entry in [`PoolDriver`]'s `running`, removed however the refill ends.
struct Running<'a> {
    driver: &'a PoolDriver,
    id: u64,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.driver.running.locked().remove(&self.id);
    }
}

/// How often, at most, the port quota of a project is checked while one of its pools backs off
/// after OverQuota: capacity coming back (quota raised, ports freed) ends the backoff at once.
pub const QUOTA_CHECK: Duration = Duration::from_secs(5);

impl PoolDriver {
    pub fn new(kind: PoolKind, vif: Arc<dyn VifDriver>, opts: PoolOptions) -> Result<Arc<Self>, Error> {
        kind.check_vif_driver(vif.kind())?;
        let limits = opts.limits;
        Ok(Arc::new_cyclic(|me| Self {
            me: me.clone(),
            kind,
            vif,
            opts,
            state: Mutex::new(Pools::with_backoff(limits, Backoff::default(), rand::random())),
            specs: Mutex::default(),
            hosts: Mutex::default(),
            refilled: watch::Sender::new(0),
            changed: Notify::new(),
            over_max: Notify::new(),
            ready: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            quota_checked: Mutex::default(),
            unrecorded: Mutex::default(),
            running: Mutex::default(),
            refill_seq: AtomicU64::new(0),
            published: Mutex::default(),
        }))
    }

    pub fn kind(&self) -> PoolKind {
        self.kind
    }

    pub fn options(&self) -> &PoolOptions {
        &self.opts
    }

    pub fn vif(&self) -> &Arc<dyn VifDriver> {
        &self.vif
    }

    /// False until recovery (or [`PoolDriver::mark_ready`]) ran: until then requests answer
    /// ResourceNotReady, so nothing is created twice.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Starts serving without recovery (fresh pools; tests and the first start of a cluster).
    pub fn mark_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Stops serving at once, keeping the books until [`PoolDriver::reset`] (the term's tasks may
    /// still be finishing with them); requests waiting for a refill answer ResourceNotReady.
    pub fn stop_serving(&self) {
        self.ready.store(false, Ordering::Release);
        self.refilled.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Drops every pool and stops serving until the next recovery (leadership lost): while
    /// another replica leads it hands out, recycles and deletes these ports, so nothing held in
    /// memory stays true. Refills still in flight land nowhere; their tagged ports are adopted by
    /// the next recovery or deleted by the orphan sweep.
    pub fn reset(&self) {
        self.ready.store(false, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        *self.lock() = Pools::with_backoff(self.opts.limits, Backoff::default(), rand::random());
        self.specs().clear();
        self.unrecorded.locked().clear();
        // This replica no longer knows any pool: it shows none.
        self.publish_sizes();
        // Requests waiting for a refill re-check readiness and answer ResourceNotReady.
        self.refilled.send_modify(|g| *g = g.wrapping_add(1));
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Pools<Vif>> {
        // A panic while holding the lock leaves consistent bookkeeping (every method completes
        // its mutation before returning), so poisoning is not a reason to stop serving.
        self.state.locked()
    }

    fn specs(&self) -> MutexGuard<'_, HashMap<Key, PortSpec>> {
        self.specs.locked()
    }

    /// The KuryrPortPool key of a pool. Its `subnetId` is [`Key::subnet_id`]: the one subnet
    /// id, or for ports with addresses on several subnets their sorted ids comma-joined, which
    /// `recover::key_of` splits back into the same key.
    pub fn crd_key(&self, key: &Key) -> PoolKey {
        let nested = self.kind == PoolKind::Nested;
        PoolKey {
            deployment: key.deployment.clone(),
            host: (!nested).then(|| key.host.clone()),
            trunk_port_id: nested.then(|| key.host.clone()),
            trunk_ip: None,
            project_id: key.project_id.clone(),
            network_id: key.network_id.clone(),
            subnet_id: key.subnet_id(),
            security_group_ids: key.security_groups.clone(),
        }
    }

    /// The name (and pool tag) of `key`'s pool: as the books have it, else as a new one's.
    fn pool_name(&self, key: &Key) -> String {
        self.lock()
            .get(key)
            .map_or_else(|| self.meta_for(key).name, |p| p.meta.name.clone())
    }

    pub(super) fn meta_for(&self, key: &Key) -> PoolMeta {
        PoolMeta {
            name: self.crd_key(key).resource_name(),
            nested: self.kind == PoolKind::Nested,
        }
    }

    /// The pool key of a request: the spec's network, subnets and security groups on `host`.
    fn key_for(spec: &PortSpec, host: String) -> Result<Key, Error> {
        let key = Key::new(
            spec.deployment.clone(),
            host,
            spec.project_id.clone(),
            spec.network.id.clone(),
            spec.network.subnet_ids(),
            spec.security_groups.clone(),
        );
        if key.subnets.is_empty() {
            return Err(Error::invalid(
                "network.subnets",
                format!("network {} has no subnet to pool ports on", spec.network.id),
            ));
        }
        Ok(key)
    }

    async fn host_for(&self, deployment: &str, node: &str) -> Result<String, Error> {
        let k = (deployment.to_string(), node.to_string());
        if let Some(h) = self.hosts.locked().get(&k) {
            return Ok(h.clone());
        }
        let host = self.vif.pool_host(deployment, node).await?;
        self.hosts.locked().insert(k, host.clone());
        Ok(host)
    }

    /// Forgets the pool hosts found for `node` (its Node object is gone or was re-created) and
    /// what the VIF driver remembers of it. Returns the forgotten `(deployment, host)` pairs.
    pub async fn forget_node(&self, node: &str) -> Vec<(String, String)> {
        let mut forgotten = Vec::new();
        self.hosts.locked().retain(|(deployment, n), host| {
            let keep = n != node;
            if !keep {
                forgotten.push((deployment.clone(), host.clone()));
            }
            keep
        });
        self.vif.forget_node(node).await;
        forgotten
    }

    /// Forgets every pool host found and what the VIF driver remembers of nodes: a new
    /// leadership term starts from what the cloud says (another leader may have seen nodes go).
    pub async fn forget_nodes(&self) {
        self.hosts.locked().clear();
        self.vif.forget_nodes().await;
    }

    /// The distinct `(deployment, host)` pairs of this driver's pools.
    pub fn pool_hosts(&self) -> BTreeSet<(String, String)> {
        self.lock()
            .iter()
            .map(|(k, _)| (k.deployment.clone(), k.host.clone()))
            .collect()
    }

    pub(super) fn remember_spec(&self, key: &Key, spec: &PortSpec) {
        self.specs().insert(key.clone(), spec.clone());
    }

    /// Starts background refills (each is one bulk create).
    pub(super) fn start_refills(&self, refills: Vec<Refill>) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        for r in refills {
            let me = me.clone();
            tokio::spawn(async move { me.run_refill(r).await });
        }
    }

    async fn run_refill(self: Arc<Self>, r: Refill) {
        let started = Instant::now();
        let id = self.refill_seq.fetch_add(1, Ordering::Relaxed);
        self.running.locked().insert(id, Timestamp::now());
        let _running = Running { driver: &self, id };
        let generation = self.generation.load(Ordering::Acquire);
        let spec = self.specs().get(&r.key).cloned();
        let mut group_gone = false;
        // A refill takes what Neutron answers in one request's time (a queue of long bulks at
        // the server holds back every other request of this controller); what is still wanted
        // comes in the next refill, planned as this one lands.
        let n = if r.exact {
            r.n
        } else {
            r.n.min(self.opts.deployments.ports_per_request(&r.key.deployment).max(1))
        };
        let result = match spec {
            Some(spec) => self
                .vif
                .request_vifs(&spec, &r.key.host, &PortOwner::Pool { pool: r.name.clone() }, n)
                .await
                .map_err(|e| {
                    group_gone = e
                        .neutron()
                        .is_some_and(|n| n.is_kind(&kuryr_neutron::ErrorKind::SecurityGroupNotFound));
                    RefillFailure {
                        message: e.to_string(),
                        kind: e.label(),
                        user_visible: e.is_user_visible(),
                    }
                }),
            None => Err(RefillFailure::from(
                format!("no port spec known for pool {}", r.key).as_str(),
            )),
        };
        if self.generation.load(Ordering::Acquire) != generation {
            tracing::info!(pool = %r.key, "refill finished after the pools were dropped; its ports are left to recovery or the orphan sweep");
            return;
        }
        let now = Timestamp::now();
        let result = result.map(|vifs| {
            vifs.into_iter()
                .map(|v| Entry::new(v.id().to_string(), v, now))
                .collect::<Vec<_>>()
        });
        match &result {
            Ok(v) => {
                self.opts.metrics.pool_event("refill", 1);
                self.opts.metrics.pool_event("created", v.len() as u64);
                self.opts.metrics.stage("pool_refill", started.elapsed());
                tracing::info!(pool = %r.key, ports = v.len(), took = ?started.elapsed(), "pool refilled");
            }
            Err(e) => {
                self.opts.metrics.pool_event("refill_error", 1);
                tracing::warn!(pool = %r.key, error = %e.message, kind = e.kind, "pool refill failed");
            }
        }
        let (next, orphans) = {
            let mut st = self.lock();
            if st.get(&r.key).is_some() {
                (st.finish_refill(&r.key, result, now), Vec::new())
            } else {
                // The pool was dropped meanwhile (freed, or its network is being deleted).
                (
                    st.finish_refill(&r.key, Err("pool dropped".into()), now),
                    result.unwrap_or_default(),
                )
            }
        };
        for e in orphans {
            if let Err(err) = self
                .vif
                .release_vif(&r.key.deployment, &r.key.host, &e.data)
                .await
            {
                tracing::warn!(port = %e.port_id, error = %err, "could not delete a port refilled into a dropped pool");
            }
        }
        if group_gone {
            // One of the pool's security groups was deleted (its NetworkPolicy is gone, and
            // with it every pod's reason to ask for this key): the pool can never be refilled
            // and its spare ports lost that group. Dropped rather than retried; a pod still
            // asking re-creates it and gets this answer, until its groups are computed afresh.
            tracing::info!(pool = %r.key, "a security group of the pool is gone; pool dropped");
            if let Err(e) = self.drop_pool(&r.key).await {
                tracing::warn!(pool = %r.key, error = %e, "could not delete the spare ports of a dropped pool");
            }
        }
        self.refilled.send_modify(|g| *g = g.wrapping_add(1));
        self.touched();
        self.start_refills(next);
    }

    /// Rebuilds this driver's pools after a restart (`super::recover`), then marks it ready.
    /// Safe to call on an empty driver only.
    pub async fn recover(&self, input: &RecoveryInput) -> Result<RecoveryReport, Error> {
        let mut recovered = super::recover::recover(self, input).await?;
        // Before the pools serve: a borrow right after would retag a port itself.
        self.retag(std::mem::take(&mut recovered.retag)).await;
        Ok(self.install_recovered(recovered))
    }

    /// Makes the pool tags of recovered ports name the pools they were placed in. Best effort:
    /// a tag left behind only makes the next recovery prefer what Kubernetes records, as this
    /// one did.
    async fn retag(&self, ports: Vec<(String, String, tags::PoolRetag)>) {
        for (deployment, port, retag) in ports {
            let client = match self.opts.deployments.client(&deployment) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(port, error = %e, "cannot retag a recovered pool port");
                    continue;
                }
            };
            match apply_retag(client, &port, &retag).await {
                Ok(()) => tracing::info!(port, "recovered pool port retagged for the pool it was placed in"),
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::warn!(port, error = %e, "cannot retag a recovered pool port"),
            }
        }
    }

    /// Installs what recovery decided, in one step, and starts serving. Pools that hold nothing
    /// (objects left by an earlier configuration, or freed) are dropped; the reconcile pass
    /// deletes their objects.
    fn install_recovered(&self, r: Recovered) -> RecoveryReport {
        let mut report = r.report;
        let now = Timestamp::now();
        {
            let mut st = self.lock();
            for (key, meta) in r.pools {
                st.ensure(&key, || meta);
            }
            for (key, port, holder) in &r.in_use {
                st.mark_in_use(key, port, now, holder.as_deref());
            }
            for port in &r.unservable {
                st.mark_unservable(port);
            }
            for (key, (available, recyclable)) in r.adopted {
                st.adopt(&key, available, recyclable);
            }
            let keys: Vec<Key> = st.iter().map(|(k, _)| k.clone()).collect();
            report.dropped = keys.iter().filter(|k| st.remove_if_empty(k)).count();
        }
        for (key, spec) in &r.specs {
            self.remember_spec(key, spec);
        }
        self.mark_ready();
        self.publish_sizes();
        self.touched();
        tracing::info!(?report, pool_driver = self.kind.name(), "port pools recovered");
        // Spares beyond max (a lower max since, or ports adopted on a crash) go now, not at the
        // first maintenance pass.
        if let Some(me) = self.me.upgrade() {
            tokio::spawn(async move { me.trim().await });
        }
        report
    }

    /// Resolves once a pool changed since the last call (the KuryrPortPool flusher waits here).
    pub(super) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Something changed that the KuryrPortPool objects and metrics should show.
    pub(super) fn touched(&self) {
        self.changed.notify_one();
    }

    /// Exports pool sizes as metrics; pools gone since the last call lose their gauges.
    pub fn publish_sizes(&self) {
        let st = self.lock();
        let m = &self.opts.metrics;
        let mut names = BTreeSet::new();
        for (_, pool) in st.iter() {
            m.pool_size(&pool.meta.name, "available", pool.available_len());
            m.pool_size(&pool.meta.name, "recyclable", pool.recyclable_len());
            m.pool_size(&pool.meta.name, "in_use", pool.in_use().len());
            names.insert(pool.meta.name.clone());
        }
        let mut published = self.published.locked();
        for gone in published.difference(&names) {
            m.forget_pool(gone);
        }
        *published = names;
    }

    /// Hands a pooled port to `pod`; with `port_debug` it is renamed after the pod first.
    async fn hand_out(
        &self,
        pod: &PodRef,
        spec: &PortSpec,
        key: &Key,
        host: &str,
        vif: Vif,
    ) -> Result<(Vif, VifOrigin), Error> {
        if self.opts.port_debug {
            let client = self.opts.deployments.client(&key.deployment)?;
            let update = PortUpdate {
                name: Some(tags::pod_port_name(&pod.namespace, &pod.name)),
                // A subport's device id is its trunk's: only bare-metal ports name their pod.
                device_id: (self.kind == PoolKind::Neutron).then(|| pod.uid.clone()),
                ..PortUpdate::default()
            };
            if let Err(e) = client.update_port(vif.id(), &update).await {
                self.give_back(key, vif, &holder(&pod.namespace, &pod.name, &pod.uid));
                return Err(e.into());
            }
        }
        Ok((vif, origin_for(self.vif.as_ref(), spec, host)))
    }

    /// Puts a port that could not be handed out into the recyclable list (the next pass fixes
    /// its security groups and name).
    fn give_back(&self, key: &Key, mut vif: Vif, holder: &str) {
        let id = vif.id().to_string();
        vif.base_mut().active = false;
        if self
            .lock()
            .release(key, &id, vif, holder, Timestamp::now())
            .is_err()
        {
            tracing::warn!(port = %id, pool = %key, "pool vanished while handing out a port");
        }
        self.touched();
    }

    /// One maintenance pass: recycle released ports, apply the TTL, retry failed refills,
    /// refresh the status of available ports. Returns how many Neutron ports it deleted.
    pub async fn maintain(&self) -> usize {
        let mut deleted = self.recycle().await;
        deleted += self.apply_ttl().await;
        deleted += self.trim().await;
        self.check_quotas().await;
        let refills = self.lock().plan_refills_below_min(Timestamp::now());
        self.start_refills(refills);
        self.refresh_active().await;
        self.publish_sizes();
        self.touched();
        deleted
    }

    /// Returns released ports to their pools (or deletes them beyond `max`). A port goes back
    /// as it is when nothing about it changed since it was handed out (the hit path writes
    /// nothing without `port_debug`, and a policy may or may not have changed its groups): one
    /// status list per [`crate::drivers::vif::IDS_PER_LIST`] ports tells, instead of an update per port, which on a
    /// real neutron-server kept three hundred released ports out of use for a minute. What must
    /// be written is written [`RECYCLE_CONCURRENCY`] ports at a time.
    async fn recycle(&self) -> usize {
        let steps = self.lock().plan_recycle();
        if steps.is_empty() {
            return 0;
        }
        let unchanged = self.unchanged_ports(&steps).await;
        let outcomes: Vec<(RecycleOutcome, bool)> = futures::stream::iter(steps)
            .map(|step| {
                let unchanged = &unchanged;
                async move {
                    // Fenced: once this replica stops serving (its leadership term ended),
                    // another one may already hand these ports out; nothing more is written to
                    // them from here.
                    let outcome = if !self.is_ready() {
                        RecycleOutcome::Retry
                    } else {
                        match step.action {
                            RecycleAction::Return if unchanged.contains(&step.port_id) => {
                                RecycleOutcome::Returned
                            }
                            RecycleAction::Return => self.clean_port(&step.key, &step.port_id).await,
                            RecycleAction::Delete => self.delete_beyond_max(&step).await,
                        }
                    };
                    self.lock()
                        .finish_recycle(&step.key, &step.port_id, outcome, Timestamp::now());
                    (outcome, step.action == RecycleAction::Delete)
                }
            })
            .buffer_unordered(RECYCLE_CONCURRENCY)
            .collect()
            .await;
        let mut deleted = 0;
        for (outcome, delete) in outcomes {
            match outcome {
                RecycleOutcome::Returned => self.opts.metrics.pool_event("recycled", 1),
                RecycleOutcome::Dropped if delete => {
                    deleted += 1;
                    self.opts.metrics.pool_event("deleted_max", 1);
                }
                _ => {}
            }
        }
        deleted
    }

    /// The ports of `steps` to return that need no clean-up: still named as pool ports, with no
    /// device id on bare metal and exactly their pool's security groups. Empty when Neutron
    /// cannot be asked (every port is then cleaned).
    async fn unchanged_ports(&self, steps: &[RecycleStep<Vif>]) -> BTreeSet<String> {
        let mut by_deployment: BTreeMap<&str, Vec<&RecycleStep<Vif>>> = BTreeMap::new();
        for step in steps.iter().filter(|s| s.action == RecycleAction::Return) {
            by_deployment.entry(&step.key.deployment).or_default().push(step);
        }
        let mut unchanged = BTreeSet::new();
        for (deployment, steps) in by_deployment {
            let ids: Vec<&str> = steps.iter().map(|s| s.port_id.as_str()).collect();
            let filter = ListFilter::new().fields(["id", "name", "device_id", "security_groups", "tags"]);
            let listed = match self.list_by_ids(deployment, &ids, filter).await {
                Ok(listed) => listed,
                Err(e) => {
                    tracing::debug!(deployment, error = %e, "could not read released ports; cleaning them all");
                    continue;
                }
            };
            let listed: BTreeMap<&str, &kuryr_neutron::Port> =
                listed.iter().map(|p| (p.id.as_str(), p)).collect();
            for step in steps {
                let Some(port) = listed.get(step.port_id.as_str()) else {
                    continue;
                };
                let groups: BTreeSet<&String> = port.security_groups.iter().collect();
                let wanted: BTreeSet<&String> = step.key.security_groups.iter().collect();
                if port.name == tags::POOL_PORT_NAME
                    && (self.kind != PoolKind::Neutron || port.device_id.is_empty())
                    && groups == wanted
                    && tags::pool_retag(&port.tags, &self.pool_name(&step.key)).is_none()
                {
                    unchanged.insert(step.port_id.clone());
                }
            }
        }
        unchanged
    }

    async fn delete_beyond_max(&self, step: &RecycleStep<Vif>) -> RecycleOutcome {
        match self
            .vif
            .release_vif(&step.key.deployment, &step.key.host, &step.data)
            .await
        {
            Ok(()) => RecycleOutcome::Dropped,
            Err(e) => {
                tracing::warn!(port = %step.port_id, error = %e, "could not delete port beyond pool max");
                RecycleOutcome::Retry
            }
        }
    }

    /// A port borrowed from a sibling pool becomes `key`'s: its security groups, and its pool tag
    /// so that recovery and the books agree on where it belongs (it goes back to `key` on
    /// release). A crash before the tag write leaves the port counted by its KuryrPort's origin,
    /// which recovery prefers to the tag.
    async fn move_port(&self, key: &Key, port_id: &str) -> Result<(), Error> {
        let client = self.opts.deployments.client(&key.deployment)?;
        let update = PortUpdate {
            security_groups: Some(key.security_groups.clone()),
            ..PortUpdate::default()
        };
        let port = client.update_port(port_id, &update).await?;
        if let Some(retag) = tags::pool_retag(&port.tags, &self.meta_for(key).name) {
            apply_retag(client, port_id, &retag).await?;
        }
        Ok(())
    }

    /// Re-applies the pool's security groups and resets name (and device id on bare metal) in
    /// one update.
    async fn clean_port(&self, key: &Key, port_id: &str) -> RecycleOutcome {
        let client = match self.opts.deployments.client(&key.deployment) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(port = port_id, error = %e, "cannot recycle port");
                return RecycleOutcome::Retry;
            }
        };
        let update = PortUpdate {
            name: Some(tags::POOL_PORT_NAME.to_string()),
            device_id: (self.kind == PoolKind::Neutron).then(String::new),
            security_groups: Some(key.security_groups.clone()),
            ..PortUpdate::default()
        };
        let port = match client.update_port(port_id, &update).await {
            Ok(port) => port,
            Err(e) if e.is_not_found() => return RecycleOutcome::Dropped,
            Err(e) => {
                tracing::warn!(port = port_id, error = %e, "could not recycle port; retrying next pass");
                return RecycleOutcome::Retry;
            }
        };
        // A port given back after a move whose tag write Neutron applied though the client saw
        // it fail carries the borrower's tag: the pool's again, so recovery reads it alike.
        let Some(retag) = tags::pool_retag(&port.tags, &self.pool_name(key)) else {
            return RecycleOutcome::Returned;
        };
        match apply_retag(client, port_id, &retag).await {
            Ok(_) => RecycleOutcome::Returned,
            Err(e) => {
                tracing::warn!(port = port_id, error = %e, "could not retag recycled port; retrying next pass");
                RecycleOutcome::Retry
            }
        }
    }

    /// Deletes the available ports beyond `max` ([`Pools::plan_trim`]); a port whose deletion
    /// fails goes back to its pool for the next pass.
    pub async fn trim(&self) -> usize {
        let excess = self.lock().plan_trim();
        let mut deleted = 0;
        for (key, entry) in excess {
            // Fenced like recycling: a replica that stopped serving deletes nothing more.
            if !self.is_ready() {
                self.lock().put_back(&key, [entry]);
                continue;
            }
            match self
                .vif
                .release_vif(&key.deployment, &key.host, &entry.data)
                .await
            {
                Ok(()) => {
                    deleted += 1;
                    self.opts.metrics.pool_event("deleted_max", 1);
                }
                Err(e) => {
                    tracing::warn!(port = %entry.port_id, error = %e, "could not delete port beyond pool max");
                    self.lock().put_back(&key, [entry]);
                }
            }
        }
        if deleted > 0 {
            tracing::info!(
                deleted,
                pool_driver = self.kind.name(),
                "spare ports beyond ports_pool_max deleted"
            );
            self.publish_sizes();
            self.touched();
        }
        deleted
    }

    /// For every project with a pool backing off after OverQuota (at most once per
    /// [`QUOTA_CHECK`]): when Neutron reports room for ports again, those pools stop backing
    /// off and refill now. One quota read, never a port create, while the quota stays full.
    pub async fn check_quotas(&self) {
        let projects: BTreeSet<(String, String)> = {
            let st = self.lock();
            st.iter()
                .filter(|(_, p)| p.retry_at().is_some())
                .filter(|(_, p)| p.last_error().is_some_and(|(f, _)| f.kind == "OverQuota"))
                .map(|(k, _)| (k.deployment.clone(), k.project_id.clone()))
                .collect()
        };
        for (deployment, project) in projects {
            {
                let mut checked = self.quota_checked.locked();
                let due = checked
                    .get(&(deployment.clone(), project.clone()))
                    .is_none_or(|at| at.elapsed() >= QUOTA_CHECK);
                if !due {
                    continue;
                }
                checked.insert((deployment.clone(), project.clone()), Instant::now());
            }
            let Ok(client) = self.opts.deployments.client(&deployment) else {
                continue;
            };
            let room = match client.get_quota_details(&project).await {
                // No `port` entry: nothing says there is a limit (refills are not cut).
                Ok(q) => q.get("port").and_then(|u| u.available()),
                Err(e) => {
                    tracing::debug!(project, error = %e, "could not read the port quota");
                    continue;
                }
            };
            // `None`: unlimited.
            if room.is_none_or(|r| r > 0) {
                let room = room.map(|r| usize::try_from(r).unwrap_or(usize::MAX));
                let refills = self.lock().reset_backoff(
                    |k| k.deployment == deployment && k.project_id == project,
                    room,
                    Timestamp::now(),
                );
                if !refills.is_empty() {
                    tracing::info!(
                        project,
                        pools = refills.len(),
                        "port quota has room again; refilling"
                    );
                }
                self.start_refills(refills);
            }
        }
    }

    /// Compares the ports this driver holds in use with `recorded`, every port id the
    /// KuryrPorts list (read before this call). A port taken before `before` that no KuryrPort
    /// records in two passes in a row is held by no pod: it is forgotten (see
    /// [`Pools::forget_in_use`]). Returns the forgotten port ids.
    pub fn reconcile_in_use(
        &self,
        recorded: &std::collections::HashSet<String>,
        before: Timestamp,
    ) -> Vec<String> {
        let found = self.lock().unrecorded_in_use(recorded, before);
        let confirmed: Vec<String> = {
            let mut last = self.unrecorded.locked();
            let confirmed = found.intersection(&last).cloned().collect();
            *last = found;
            confirmed
        };
        let mut forgotten = Vec::new();
        for id in confirmed {
            if let Some(key) = self.lock().forget_in_use(&id) {
                tracing::warn!(port = %id, pool = %key, "port held in use by no KuryrPort; no longer counted (the orphan sweep deletes it)");
                forgotten.push(id);
            }
        }
        if !forgotten.is_empty() {
            self.opts
                .metrics
                .pool_event("forgotten_in_use", forgotten.len() as u64);
            self.publish_sizes();
            self.touched();
        }
        forgotten
    }

    async fn apply_ttl(&self) -> usize {
        let expired = self.lock().plan_ttl(Timestamp::now());
        let mut deleted = 0;
        for (key, entry) in expired {
            // Fenced like recycling; the port stays tagged, for the next recovery to count.
            if !self.is_ready() {
                continue;
            }
            match self
                .vif
                .release_vif(&key.deployment, &key.host, &entry.data)
                .await
            {
                Ok(()) => {
                    deleted += 1;
                    self.opts.metrics.pool_event("deleted_ttl", 1);
                }
                // Still tagged as ours and now in no pool: the orphan sweep deletes it.
                Err(e) => tracing::warn!(port = %entry.port_id, error = %e, "could not delete expired port"),
            }
        }
        deleted
    }

    /// The status of every inactive available port, by the batch: one port list per
    /// [`crate::drivers::vif::IDS_PER_LIST`] ports of a deployment (`id=...&status=ACTIVE&fields=id`), whatever the
    /// number of pools, so that a hit hands out an ACTIVE VIF and activation needs no Neutron
    /// call either. (One list per pool, as before, was a thousand requests a second with a
    /// thousand nodes refilling.)
    async fn refresh_active(&self) {
        let mut pending: BTreeMap<String, Vec<(String, Key)>> = BTreeMap::new();
        {
            let st = self.lock();
            for (key, pool) in st.iter() {
                for e in pool.available().filter(|e| !e.data.active()) {
                    pending
                        .entry(key.deployment.clone())
                        .or_default()
                        .push((e.port_id.clone(), key.clone()));
                }
            }
        }
        for (deployment, ports) in pending {
            let ids: Vec<&str> = ports.iter().map(|(id, _)| id.as_str()).collect();
            let filter = ListFilter::new().status("ACTIVE").fields(["id"]);
            match self.list_by_ids(&deployment, &ids, filter).await {
                Ok(listed) => {
                    let active: BTreeSet<String> = listed.into_iter().map(|p| p.id).collect();
                    let keys: BTreeSet<&Key> = ports.iter().map(|(_, k)| k).collect();
                    let mut st = self.lock();
                    for key in keys {
                        st.update_available(key, |e| {
                            if active.contains(&e.port_id) {
                                e.data.base_mut().active = true;
                            }
                        });
                    }
                }
                Err(e) => tracing::debug!(deployment, error = %e, "could not refresh port status"),
            }
        }
    }

    /// The ports of `deployment` among `ids` that pass `filter`: one list per [`crate::drivers::vif::IDS_PER_LIST`]
    /// ids.
    async fn list_by_ids(
        &self,
        deployment: &str,
        ids: &[&str],
        filter: ListFilter,
    ) -> Result<Vec<kuryr_neutron::Port>, Error> {
        let client = self.opts.deployments.client(deployment)?;
        crate::drivers::vif::ports_by_ids(client, ids, &filter).await
    }

    /// Runs [`PoolDriver::maintain`] every `ports_pool_update_frequency` until `stop`, and a
    /// recycle pass as soon as a release takes a pool beyond `max` (releases meanwhile share
    /// it).
    pub async fn run_maintenance(&self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.opts.update_frequency);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            let full = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => true,
                _ = self.over_max.notified() => false,
            };
            if !self.is_ready() {
                continue;
            }
            if full {
                self.maintain().await;
            } else {
                self.recycle().await;
                self.trim().await;
                self.publish_sizes();
                self.touched();
            }
        }
    }

    /// Pre-population (a namespace network was created): makes sure the pool of `spec` on
    /// `node` exists and starts filling it up to `ports_pool_min` (one bulk create; nothing
    /// when it already holds that many or `min` is 0). Returns the pool name when a refill
    /// started.
    pub async fn prepopulate(&self, node: &str, spec: &PortSpec) -> Result<Option<String>, Error> {
        if !self.is_ready() {
            return Err(Error::not_ready("port pools are being recovered"));
        }
        let host = self.host_for(&spec.deployment, node).await?;
        let key = Self::key_for(spec, host)?;
        self.remember_spec(&key, spec);
        let refill = {
            let mut st = self.lock();
            st.ensure(&key, || self.meta_for(&key));
            st.plan_refill(&key, Timestamp::now())
        };
        let name = refill.as_ref().map(|r| r.name.clone());
        self.start_refills(refill.into_iter().collect());
        self.touched();
        Ok(name)
    }

    /// Creates `n` ports for a pool now (pool management `populate`). `None`: a populate of the
    /// pool is already running, or the global cap is reached.
    pub fn populate(&self, key: &Key, n: usize) -> Result<bool, Error> {
        if !self.specs().contains_key(key) {
            return Err(Error::invalid("pool", format!("{key}: no port spec known yet")));
        }
        let r = self.lock().plan_populate(key, n);
        let started = r.is_some();
        self.start_refills(r.into_iter().collect());
        Ok(started)
    }

    /// Deletes every available port of a pool (pool management `free`). Returns how many.
    pub async fn free(&self, key: &Key) -> Result<usize, Error> {
        let drained = {
            let mut st = self.lock();
            let drained = st.drain_available(key);
            // A pool left with no port at all is gone (the next reconcile deletes its object);
            // dropped in the same lock so that maintenance cannot refill it meanwhile.
            st.remove_if_empty(key);
            drained
        };
        let mut deleted = 0;
        let mut first = None;
        for e in drained {
            match self.vif.release_vif(&key.deployment, &key.host, &e.data).await {
                Ok(()) => deleted += 1,
                Err(err) => {
                    tracing::warn!(port = %e.port_id, error = %err, "could not delete pooled port");
                    first.get_or_insert(err);
                }
            }
        }
        self.publish_sizes();
        self.touched();
        first.map_or(Ok(deleted), Err)
    }

    /// Forgets the pool of `key` and deletes its spare ports (its KuryrPortPool object was
    /// deleted or names a pool that is gone). Ports in use are deleted when released. A port that
    /// could not be deleted is tagged and owned by nothing: the orphan sweep retries it; the
    /// first such failure is returned.
    pub async fn drop_pool(&self, key: &Key) -> Result<(), Error> {
        let Some(spare) = self.lock().remove(key) else {
            return Ok(());
        };
        self.specs().remove(key);
        let mut first = None;
        for e in spare {
            if let Err(err) = self.vif.release_vif(&key.deployment, &key.host, &e.data).await {
                tracing::warn!(port = %e.port_id, error = %err, "could not delete port of a dropped pool");
                first.get_or_insert(err);
            }
        }
        self.publish_sizes();
        self.touched();
        first.map_or(Ok(()), Err)
    }

    /// Drops every pool whose key `which` selects (see [`PoolDriver::drop_pool`]). Returns the
    /// names of the dropped pools.
    pub async fn drop_where(&self, which: impl Fn(&Key) -> bool) -> Result<Vec<String>, Error> {
        let pools: Vec<(Key, String)> = self
            .lock()
            .iter()
            .filter(|(k, _)| which(k))
            .map(|(k, p)| (k.clone(), p.meta.name.clone()))
            .collect();
        let mut first = None;
        for (key, _) in &pools {
            if let Err(e) = self.drop_pool(key).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(pools.into_iter().map(|(_, n)| n).collect()), Err)
    }

    /// When the oldest refill running now started (its ports are created after that): Neutron may
    /// already list a refill's ports (a bulk create commits before it answers) while no pool records
    /// them yet. Kept apart from the pools' own `populating` mark, which goes with its pool: a refill
    /// of a pool removed meanwhile still runs, and its ports still come.
    pub fn refilling_since(&self) -> Option<Timestamp> {
        self.running.locked().values().min().copied()
    }

    /// Port ids this driver's pools account for, per deployment.
    pub fn owned_ports(&self) -> BTreeMap<String, BTreeSet<String>> {
        let st = self.lock();
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (k, p) in st.iter() {
            let ids = out.entry(k.deployment.clone()).or_default();
            ids.extend(p.available().map(|e| e.port_id.clone()));
            ids.extend(p.recyclable().map(|e| e.port_id.clone()));
            ids.extend(p.in_use().keys().cloned());
        }
        out
    }
}

/// What the pool management API and `kuryr pools` show about one pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSummary {
    /// KuryrPortPool name (also the pool tag on its ports).
    pub name: String,
    pub pool_driver: String,
    /// The pod VIF driver whose ports it holds (`multi_pool` may run two nested ones).
    #[serde(default)]
    pub vif_driver: String,
    pub deployment: String,
    /// Node (bare metal) or trunk / VM port (nested).
    pub host: String,
    pub project_id: String,
    pub network_id: String,
    pub subnet_id: String,
    pub security_groups: Vec<String>,
    pub available: usize,
    pub recyclable: usize,
    pub in_use: usize,
    pub populating: bool,
    /// Seconds the longest-waiting available port has been idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_available_secs: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refill: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_time: Option<String>,
    /// `show` only: every port with its state and age in seconds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortSummary>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortSummary {
    pub port_id: String,
    /// `available`, `recyclable` or `inUse`.
    pub state: String,
    pub age_secs: i64,
}

impl PoolDriver {
    fn summary(&self, key: &Key, pool: &super::state::Pool<Vif>, now: Timestamp, ports: bool) -> PoolSummary {
        let age = |t: Timestamp| now.duration_since(t).as_secs();
        let mut list = Vec::new();
        if ports {
            let mut push = |id: &str, state: &str, since: Timestamp| {
                list.push(PortSummary {
                    port_id: id.to_string(),
                    state: state.to_string(),
                    age_secs: age(since),
                })
            };
            pool.available()
                .for_each(|e| push(&e.port_id, "available", e.since));
            pool.recyclable()
                .for_each(|e| push(&e.port_id, "recyclable", e.since));
            pool.in_use()
                .iter()
                .for_each(|(id, held)| push(id, "inUse", held.since));
        }
        PoolSummary {
            name: pool.meta.name.clone(),
            pool_driver: self.kind.name().to_string(),
            vif_driver: self.vif.name().to_string(),
            deployment: key.deployment.clone(),
            host: key.host.clone(),
            project_id: key.project_id.clone(),
            network_id: key.network_id.clone(),
            subnet_id: key.subnet_id(),
            security_groups: key.security_groups.clone(),
            available: pool.available_len(),
            recyclable: pool.recyclable_len(),
            in_use: pool.in_use().len(),
            populating: pool.is_populating(),
            oldest_available_secs: pool.available().map(|e| age(e.since)).max(),
            last_refill: pool.last_refill().map(|t| t.to_string()),
            last_error: pool.last_error().map(|e| e.0.message.clone()),
            last_error_time: pool.last_error().map(|e| e.1.to_string()),
            ports: list,
        }
    }

    /// One pool with its ports.
    pub fn snapshot(&self, key: &Key) -> Option<PoolSummary> {
        let st = self.lock();
        let pool = st.get(key)?;
        Some(self.summary(key, pool, Timestamp::now(), true))
    }

    /// Every pool, without port lists.
    pub fn summaries(&self) -> Vec<PoolSummary> {
        let st = self.lock();
        let now = Timestamp::now();
        st.iter().map(|(k, p)| self.summary(k, p, now, false)).collect()
    }

    /// The key of the pool named `name`.
    pub fn key_by_name(&self, name: &str) -> Option<Key> {
        self.lock()
            .iter()
            .find(|(_, p)| p.meta.name == name)
            .map(|(k, _)| k.clone())
    }
}

/// What a request on an empty pool answers when its refill failed: quota or address exhaustion
/// as the OpenStack error itself (transient, so the pod is retried, and user-visible, so it gets
/// the same Event as without pools); anything else as ResourceNotReady.
fn refill_error(key: &Key, f: RefillFailure) -> Error {
    let message = format!("pool {key} could not be refilled: {}", f.message);
    if f.user_visible {
        Error::exhausted(f.kind, message)
    } else {
        Error::not_ready(message)
    }
}

/// The pool a released VIF goes back to. An origin written before origins recorded their
/// subnets (empty `subnets`) goes to the pool that has the port in use, else to the one pool
/// matching everything else; with several such pools (one per subnet) and none holding the port,
/// to no pool, so the port is deleted rather than pooled on a subnet it may not be on.
fn release_key(st: &Pools<Vif>, origin: &VifOrigin, port_id: &str) -> Key {
    let key = Key::new(
        origin.deployment.clone(),
        origin.host.clone(),
        origin.project_id.clone(),
        origin.network_id.clone(),
        origin.subnets.clone(),
        origin.security_groups.clone(),
    );
    // Recovery books a nested subport under the trunk it is on, which an operator may have
    // moved it to since its pod got it: it goes back where the books hold it.
    if let Some(owner) = st.owner_of(port_id).filter(|k| {
        let on_origin_host = Key {
            host: key.host.clone(),
            ..(*k).clone()
        };
        on_origin_host == key
    }) {
        return owner.clone();
    }
    if !key.subnets.is_empty() {
        return key;
    }
    let same = |k: &Key| k.same_network(&key) && k.security_groups == key.security_groups;
    if let Some(owner) = st.owner_of(port_id).filter(|k| same(k)) {
        return owner.clone();
    }
    let mut matching = st.iter().map(|(k, _)| k).filter(|k| same(k));
    match (matching.next(), matching.next()) {
        (Some(only), None) => only.clone(),
        _ => key,
    }
}

#[async_trait]
impl VifPool for PoolDriver {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    async fn request_vif(&self, pod: &PodRef, spec: &PortSpec) -> Result<(Vif, VifOrigin), Error> {
        if !self.is_ready() {
            return Err(Error::not_ready("port pools are being recovered"));
        }
        let host = self.host_for(&spec.deployment, &pod.node).await?;
        let key = Self::key_for(spec, host.clone())?;
        self.remember_spec(&key, spec);
        let deadline = Instant::now() + self.opts.refill_wait;
        let asked = Timestamp::now();
        let waiter = holder(&pod.namespace, &pod.name, &pod.uid);
        let mut missed = false;
        loop {
            let mut refilled = self.refilled.subscribe();
            if !self.is_ready() {
                return Err(Error::not_ready("port pools are being recovered"));
            }
            let taken = {
                let mut st = self.lock();
                st.ensure(&key, || self.meta_for(&key));
                st.take(&key, &waiter, Timestamp::now())
            };
            self.start_refills(taken.refills);
            match taken.take {
                Take::Hit(entry) => {
                    self.opts
                        .metrics
                        .pool_event(if missed { "miss" } else { "hit" }, 1);
                    self.touched();
                    return self.hand_out(pod, spec, &key, &host, entry.data).await;
                }
                Take::Borrowed { entry, from } => {
                    self.opts.metrics.pool_event("borrowed", 1);
                    self.touched();
                    tracing::debug!(port = %entry.port_id, from = %from, to = %key, "re-applying security groups of a sibling pool's port");
                    if let Err(e) = self.move_port(&key, &entry.port_id).await {
                        // Its tag may still name the donor: back there, to be cleaned.
                        self.give_back(&from, entry.data, &waiter);
                        return Err(e);
                    }
                    return self.hand_out(pod, spec, &key, &host, entry.data).await;
                }
                Take::Empty => {
                    missed = true;
                    let (failed, populating, backing_off) = {
                        let st = self.lock();
                        let pool = st.get(&key);
                        (
                            pool.and_then(|p| p.last_error().cloned()),
                            pool.is_some_and(|p| p.is_populating()),
                            pool.is_some_and(|p| p.retry_at().is_some()),
                        )
                    };
                    if backing_off && let Some(me) = self.me.upgrade() {
                        // Waiting pods notice a raised quota within QUOTA_CHECK, not only at
                        // the next maintenance pass.
                        tokio::spawn(async move { me.check_quotas().await });
                    }
                    // A failure since this request, or an earlier one with no refill running to
                    // wait for, is the answer; a refill still running at the deadline reports the
                    // earlier failure, so the pod keeps showing why it waits.
                    let left = deadline.saturating_duration_since(Instant::now());
                    match failed {
                        Some((f, at)) if at >= asked || !populating || left.is_zero() => {
                            return Err(refill_error(&key, f));
                        }
                        None if left.is_zero() => {
                            return Err(Error::not_ready(format!("pool {key} is empty; refilling")));
                        }
                        _ => {}
                    }
                    let _ = tokio::time::timeout(left, refilled.changed()).await;
                    if self.lock().get(&key).is_none() {
                        // Dropped meanwhile (a security group of its key is gone, or freed):
                        // asking again would re-create it; the caller retries with the pod's
                        // groups computed afresh.
                        return Err(Error::not_ready(format!("pool {key} was dropped while waiting")));
                    }
                }
            }
        }
    }

    async fn release_vif(&self, vif: &Vif, origin: &VifOrigin, holder: &str) -> Result<(), Error> {
        if origin.preserve {
            return Ok(());
        }
        let mut data = vif.clone();
        // The pod's interface is gone: Neutron will report the port DOWN until rebound.
        data.base_mut().active = false;
        let released = {
            let mut st = self.lock();
            let key = release_key(&st, origin, vif.id());
            st.release(&key, vif.id(), data, holder, Timestamp::now())
                .map(|r| (r, st.over_max(&key)))
        };
        match released {
            Ok((Released::Back, over_max)) => {
                self.opts.metrics.pool_event("released", 1);
                if over_max {
                    self.over_max.notify_one();
                }
                self.touched();
                Ok(())
            }
            Ok((Released::Already, _)) => Ok(()),
            Ok((Released::Stale { holder: now_held_by }, _)) => {
                // A retried finalizer of a pod whose port was recycled and handed on meanwhile.
                tracing::info!(port = %vif.id(), released_by = holder, held_by = %now_held_by,
                    "release of a port another pod holds now ignored");
                self.opts.metrics.pool_event("stale_release", 1);
                Ok(())
            }
            // No pool for it (config changed, or the pool was freed): nothing will reuse it.
            Err(_) => self.vif.release_vif(&origin.deployment, &origin.host, vif).await,
        }
    }

    async fn activate_vif(&self, origin: &VifOrigin, vif: &mut Vif) -> Result<(), Error> {
        self.vif.activate_vif(&origin.deployment, vif).await
    }

    fn vif_driver(&self) -> &Arc<dyn VifDriver> {
        &self.vif
    }
}

/// Makes a port's tags name its pool alone ([`tags::pool_retag`]): one tag at a time, so that a
/// tag written meanwhile by anyone else stays. A pool tag already gone is no failure.
async fn apply_retag(
    client: &kuryr_neutron::NeutronClient,
    port_id: &str,
    retag: &tags::PoolRetag,
) -> Result<(), kuryr_neutron::Error> {
    use kuryr_neutron::{ErrorKind, Taggable};
    if let Some(tag) = &retag.add {
        client.add_tag(Taggable::Port, port_id, tag).await?;
    }
    for tag in &retag.remove {
        match client.remove_tag(Taggable::Port, port_id, tag).await {
            Err(e) if e.kind() == Some(&ErrorKind::TagNotFound) => {}
            other => other?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_pair_with_upstream_vif_drivers() {
        assert!(
            PoolKind::Neutron
                .check_vif_driver(PodVifDriver::NeutronVif)
                .is_ok()
        );
        assert!(
            PoolKind::Neutron
                .check_vif_driver(PodVifDriver::NestedVlan)
                .is_err()
        );
        assert!(
            PoolKind::Nested
                .check_vif_driver(PodVifDriver::NestedVlan)
                .is_ok()
        );
        assert!(
            PoolKind::Nested
                .check_vif_driver(PodVifDriver::NestedMacvlan)
                .is_ok()
        );
        assert!(
            PoolKind::Nested
                .check_vif_driver(PodVifDriver::NeutronVif)
                .is_err()
        );
    }

    fn origin(subnets: &[&str]) -> VifOrigin {
        VifOrigin {
            deployment: "default".into(),
            host: "node-1".into(),
            project_id: "proj".into(),
            network_id: "net".into(),
            subnets: subnets.iter().map(|s| (*s).to_string()).collect(),
            security_groups: vec!["sg".into()],
            driver: "neutron-vif".into(),
            preserve: false,
        }
    }

    fn key(subnet: &str) -> Key {
        Key::new(
            "default",
            "node-1",
            "proj",
            "net",
            [subnet.to_string()],
            ["sg".to_string()],
        )
    }

    #[test]
    fn released_vifs_go_back_to_the_pool_of_their_subnets() {
        let meta = || PoolMeta {
            name: "p".into(),
            nested: false,
        };
        let mut st = Pools::<Vif>::new(Limits {
            min: 0,
            max: 0,
            batch: 1,
            ttl: None,
            max_concurrent_populate: 1,
            bulk: 10,
        });
        st.ensure(&key("a"), meta);
        assert_eq!(
            release_key(&st, &origin(&["b"]), "x"),
            key("b"),
            "recorded subnets win"
        );
        // An origin from before subnets were recorded: the one pool matching the rest.
        assert_eq!(release_key(&st, &origin(&[]), "x"), key("a"));
        // Two candidate pools: the one holding the port in use.
        st.ensure(&key("b"), meta);
        st.mark_in_use(&key("b"), "x", Timestamp::UNIX_EPOCH, None);
        assert_eq!(release_key(&st, &origin(&[]), "x"), key("b"));
        // Neither holds it: no pool (the port is deleted rather than pooled on a guess).
        assert!(release_key(&st, &origin(&[]), "y").subnets.is_empty());
    }
}
