//! The daemon core: CNI ADD / DEL / CHECK / GC over the registry and the
//! binding drivers. HTTP and Kubernetes plumbing live in `server` and `kube`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kuryr_crds::{KuryrPort, Vif};
use serde_json::Value;
use tokio::time::Instant;

use crate::api::{CniParams, Command, DaemonError};
use crate::binding::{BindingConfig, BindingDrivers, BindingError, PlugSpec, PlugTarget, TeardownError};
use crate::metrics::Metrics;
use crate::netlink::{NetNs, Netlink};
use crate::registry::{Attachment, Entry, PodKey, Registry, Wait};
use crate::server::ServerLimits;
use crate::state::{Record, StateDir};
use crate::vif;

/// Daemon settings; `kuryr-config`'s `[cni_daemon]`, `[binding]` and
/// `[neutron_defaults]` sections map onto it.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// This node's name (KuryrPorts labelled `kuryr.openstack.org/nodeName=<node>`).
    pub node_name: String,
    /// `[cni_daemon] bind_address` (127.0.0.1:5036).
    pub bind_address: SocketAddr,
    /// Optional unix socket serving the same API.
    pub unix_socket: Option<PathBuf>,
    /// `/ready` and `/alive` (8090).
    pub health_address: SocketAddr,
    /// Prometheus `/metrics` (9655).
    pub metrics_address: SocketAddr,
    /// `[cni_daemon] vif_annotation_timeout` (60 s): ADD waits this long for
    /// VIFs to appear (an ADD slot included), and again for them to become active.
    pub vif_annotation_timeout: Duration,
    /// `[cni_daemon] netns_proc_dir`: when the daemon runs in a container
    /// with the host's /proc mounted elsewhere, `/proc/...` netns paths are
    /// looked up under this directory instead.
    pub netns_proc_dir: Option<PathBuf>,
    /// Where each pod's attachment is kept on disk ([`crate::state`]) so
    /// that a restarted daemon can tear down every kind of binding. `None`
    /// (tests, sandbox): only host link aliases survive a restart.
    pub state_dir: Option<PathBuf>,
    pub binding: BindingConfig,
    /// Connections, in-flight ADDs, read timeouts and sizes of the API.
    pub limits: ServerLimits,
    /// `[kubernetes] use_events`: whether the pods' Events are posted.
    pub use_events: bool,
    /// `[cni_daemon] cni_failures_count`: ADD/DEL failing in a row before `/alive` fails.
    pub failures_before_restart: u32,
    /// `[cni_health_server] max_memory_usage` (MiB; unset: no limit).
    pub max_memory_mib: Option<u64>,
}

/// The state directory of `kuryr daemon`: on a tmpfs, since a reboot ends
/// every attachment (mount it from the host when the daemon runs in a pod).
pub const DEFAULT_STATE_DIR: &str = "/run/kuryr/cni-daemon";

impl DaemonConfig {
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            bind_address: SocketAddr::from(([127, 0, 0, 1], 5036)),
            unix_socket: None,
            health_address: SocketAddr::from(([0, 0, 0, 0], 8090)),
            metrics_address: SocketAddr::from(([0, 0, 0, 0], 9655)),
            vif_annotation_timeout: Duration::from_secs(60),
            netns_proc_dir: None,
            state_dir: None,
            binding: BindingConfig::default(),
            limits: ServerLimits::default(),
            use_events: true,
            failures_before_restart: 3,
            max_memory_mib: None,
        }
    }

    /// Settings from `kuryr.conf`: `[cni_daemon]` (bind_address,
    /// vif_annotation_timeout, netns_proc_dir), `[cni_health_server] port`,
    /// `[prometheus_exporter] cni_exporter_port`, `[binding] link_iface`,
    /// `[neutron_defaults] ovs_bridge`, `[binding] ovs_db/ovs_datapath_type/ovs_plug_mode/
    /// pod_tx_checksum_offload`,
    /// `[sriov] physical_device_mappings/enable_pod_resource_service/kubelet_root_dir/
    /// physnet_resource_mappings/device_plugin_resource_prefix`. Health and metrics listen on all
    /// addresses, as upstream's. Attachments are kept in [`DEFAULT_STATE_DIR`].
    pub fn from_kuryr_config(cfg: &kuryr_config::KuryrConfig, node_name: impl Into<String>) -> Self {
        let mut out = Self::new(node_name);
        out.bind_address = cfg.cni_daemon.bind_address;
        out.limits = ServerLimits::from_kuryr_config(&cfg.cni_daemon);
        out.vif_annotation_timeout = Duration::from_secs(cfg.cni_daemon.vif_annotation_timeout);
        out.netns_proc_dir = cfg.cni_daemon.netns_proc_dir.as_ref().map(PathBuf::from);
        out.state_dir = Some(PathBuf::from(DEFAULT_STATE_DIR));
        out.use_events = cfg.kubernetes.use_events;
        out.failures_before_restart = cfg.cni_daemon.cni_failures_count;
        out.max_memory_mib = u64::try_from(cfg.cni_health_server.max_memory_usage).ok();
        out.health_address = SocketAddr::from(([0, 0, 0, 0], cfg.cni_health_server.port));
        out.metrics_address = SocketAddr::from(([0, 0, 0, 0], cfg.prometheus_exporter.cni_exporter_port));
        out.binding.link_iface = Some(cfg.binding.link_iface.clone()).filter(|s| !s.is_empty());
        out.binding.ovs_bridge = cfg.neutron_defaults.ovs_bridge.clone();
        out.binding.ovs_timeout_secs = u32::try_from(cfg.cni_daemon.pyroute2_timeout).unwrap_or(u32::MAX);
        out.binding.ovs_db = cfg.binding.ovs_db.clone().filter(|s| !s.is_empty());
        out.binding.ovs_datapath_type = cfg.binding.ovs_datapath_type.as_str().to_string();
        out.binding.ovs_plug = cfg.binding.ovs_plug_mode;
        // Checked when kuryr.conf loaded: a bad mapping never gets this far.
        out.binding.sriov.options = cfg.sriov.clone();
        out.binding.pod_tx_checksum = match cfg.binding.pod_tx_checksum_offload {
            kuryr_config::PodTxChecksumOffload::Auto => crate::binding::TxChecksumMode::Auto,
            kuryr_config::PodTxChecksumOffload::Off => crate::binding::TxChecksumMode::Off,
            kuryr_config::PodTxChecksumOffload::On => crate::binding::TxChecksumMode::On,
        };
        out
    }
}

/// Posts Kubernetes Events on pods (a no-op or recorder in tests).
#[async_trait]
pub trait PodEvents: Send + Sync {
    async fn publish(&self, pod: &PodKey, pod_uid: Option<&str>, reason: &str, message: &str, warning: bool);
}

/// The Kubernetes API as the daemon asks it: whether it answers (for `/ready`), and a pod's UID.
#[async_trait]
pub trait ApiHealth: Send + Sync {
    async fn check(&self) -> Result<(), String>;

    /// The UID of the pod named `key` (`None`: there is no such pod), read from the API (for an ADD
    /// whose runtime passes no `K8S_POD_UID`, as upstream GETs the pod). An error leaves the ADD
    /// to the pod watch's cache.
    async fn pod_uid(&self, key: &PodKey) -> Result<Option<String>, String> {
        Err(format!("no pod lookup here for {key}"))
    }
}

pub struct NoEvents;

#[async_trait]
impl PodEvents for NoEvents {
    async fn publish(&self, _: &PodKey, _: Option<&str>, _: &str, _: &str, _: bool) {}
}

/// Answer of a successful ADD.
pub struct AddResult {
    /// The default VIF as os-vif JSON (upstream body).
    pub vif: Value,
    /// CNI result for every interface (kuryr-rs extension).
    pub result: Value,
}

pub struct Daemon {
    pub config: DaemonConfig,
    pub registry: Arc<Registry>,
    pub metrics: Metrics,
    drivers: BindingDrivers,
    state: Option<StateDir>,
    events: Arc<dyn PodEvents>,
    api: Arc<dyn ApiHealth>,
    /// In-flight ADDs (`limits.max_concurrent_adds`).
    add_slots: tokio::sync::Semaphore,
    /// What `/alive` answers.
    pub liveness: crate::liveness::Liveness,
    /// Serialises requests for one pod; entries are dropped when idle.
    pod_locks: Mutex<HashMap<PodKey, Arc<tokio::sync::Mutex<()>>>>,
}

/// Releases the per-pod lock and drops its map entry when nobody waits on it.
struct PodLock<'a> {
    daemon: &'a Daemon,
    key: PodKey,
    lock: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for PodLock<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut locks = self.daemon.pod_locks.lock().unwrap_or_else(|p| p.into_inner());
        // Two references: the map's and ours.
        if Arc::strong_count(&self.lock) <= 2 {
            locks.remove(&self.key);
        }
    }
}

/// One of `max_concurrent_adds`, counted in `adds_in_flight` while held.
struct AddSlot<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl<'a> AddSlot<'a> {
    fn new(
        permit: tokio::sync::SemaphorePermit<'a>,
        gauge: &prometheus_client::metrics::gauge::Gauge,
    ) -> Self {
        gauge.inc();
        Self {
            _permit: permit,
            gauge: gauge.clone(),
        }
    }
}

impl Drop for AddSlot<'_> {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// A failed plug: 504 / try again later (upstream's answer to a VLAN ID conflict) for what goes by
/// itself, 500 for the rest.
fn plug_error(ifname: &str, driver: &str, e: BindingError) -> DaemonError {
    let msg = format!("plugging {ifname} ({driver}): {e}");
    match e {
        BindingError::Busy { .. } => DaemonError::Timeout(msg),
        _ => internal(msg),
    }
}

/// The longest an Event may hold a CNI request.
const EVENT_BOUND: Duration = Duration::from_secs(2);

/// What an ADD leaves of the plugin's timeout for its timeout Event and its answer's way back:
/// 3 s, or a quarter of a shorter timeout (a 2 s timeout still leaves its waits 1.5 s).
fn answer_margin(timeout: Duration) -> Duration {
    Duration::from_secs(3).min(timeout / 4)
}

/// `config_kuryr.kuryr_daemon_timeout`: how long the plugin waits for this ADD's answer (the
/// kuryr-rs plugin always sends the one it uses; upstream's, which waits for ever, none).
fn client_timeout(config: &Value) -> Result<Option<Duration>, DaemonError> {
    match config.get("kuryr_daemon_timeout") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
            .map(|s| Some(Duration::from_secs_f64(s)))
            .ok_or_else(|| {
                DaemonError::BadParams(
                    "config_kuryr: kuryr_daemon_timeout must be a number of seconds from above 0 to 86400"
                        .into(),
                )
            }),
    }
}

fn internal(e: impl std::fmt::Display) -> DaemonError {
    DaemonError::Internal(e.to_string())
}

impl Daemon {
    /// Where the daemon posts its Events (its watchers post there too).
    pub fn events(&self) -> Arc<dyn PodEvents> {
        self.events.clone()
    }

    pub fn new(config: DaemonConfig, events: Arc<dyn PodEvents>, api: Arc<dyn ApiHealth>) -> Arc<Self> {
        Arc::new(Self {
            drivers: BindingDrivers::new(&config.binding),
            state: config.state_dir.clone().map(StateDir::new),
            add_slots: tokio::sync::Semaphore::new(config.limits.max_concurrent_adds.max(1)),
            liveness: crate::liveness::Liveness::new(config.failures_before_restart, config.max_memory_mib),
            config,
            registry: Arc::new(Registry::new()),
            metrics: Metrics::new(),
            events,
            api,
            pod_locks: Mutex::new(HashMap::new()),
        })
    }

    async fn lock_pod(&self, key: &PodKey) -> PodLock<'_> {
        let lock = {
            let mut locks = self.pod_locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(key.clone()).or_default().clone()
        };
        let guard = lock.clone().lock_owned().await;
        PodLock {
            daemon: self,
            key: key.clone(),
            lock,
            guard: Some(guard),
        }
    }

    /// Number of pods currently holding a per-pod lock (for leak tests).
    pub fn pod_lock_count(&self) -> usize {
        self.pod_locks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn netns_path(&self, path: &str) -> String {
        match (&self.config.netns_proc_dir, path.strip_prefix("/proc/")) {
            (Some(dir), Some(rest)) => dir.join(rest).to_string_lossy().into_owned(),
            _ => path.to_string(),
        }
    }

    /// The pod's VIFs as plug specs, default first. The default VIF is
    /// named `ifname` (CNI_IFNAME), others keep their `status.vifs` key.
    fn specs_for(&self, kp: &KuryrPort, ifname: &str) -> Result<Vec<PlugSpec>, DaemonError> {
        let status = kp
            .status
            .as_ref()
            .ok_or_else(|| internal("KuryrPort has no status"))?;
        let mut specs = Vec::new();
        if let Some((_, v)) = status.default_vif() {
            specs.push(vif::plug_spec(v, ifname, true, &self.config.binding).map_err(internal)?);
        }
        for (name, v) in status.additional_vifs() {
            if name == ifname {
                return Err(internal(format!(
                    "additional VIF {name} has the name CNI_IFNAME gives the default interface"
                )));
            }
            specs.push(vif::plug_spec(v, name, false, &self.config.binding).map_err(internal)?);
        }
        Ok(specs)
    }

    /// UID check; static pods are exempt (the kubelet's UID differs from the
    /// mirror pod's).
    fn uid_matches(kp: &KuryrPort, uid: Option<&str>) -> bool {
        kp.spec.pod_static || uid.is_none_or(|u| u == kp.spec.pod_uid)
    }

    fn decide<T>(
        &self,
        key: &PodKey,
        entry: Option<&Entry>,
        uid: Option<&str>,
        ready: impl Fn(&KuryrPort) -> Option<T>,
    ) -> Wait<Result<T, DaemonError>> {
        if let Some(uid) = uid
            && self.registry.is_gone(key, uid)
        {
            return Wait::Fail(Err(DaemonError::PodGone(format!(
                "pod {key} ({uid}) was deleted"
            ))));
        }
        if uid.is_none() && self.registry.pods_awaited() {
            // No UID from the runtime, and the pod watch has not listed this node's pods yet:
            // the KuryrPort under the name may be a deleted pod's.
            return Wait::Pending;
        }
        let Some(e) = entry else { return Wait::Pending };
        if let (Some(gone), Some(uid)) = (&e.gone_uid, uid)
            && gone == uid
        {
            return Wait::Fail(Err(DaemonError::PodGone(format!("pod {uid} was deleted"))));
        }
        if let Some(why) = &e.unreadable {
            // Waiting would only time out: nothing here can make it readable.
            return Wait::Fail(Err(DaemonError::Internal(format!(
                "KuryrPort {key} cannot be read: {why}"
            ))));
        }
        match &e.kuryrport {
            // A deleted pod's KuryrPort (its finalizer still running) never serves an ADD, also
            // one that knows no UID to compare: the pod made again under the name gets its own.
            Some(kp) if e.gone_uid.as_deref() == Some(kp.spec.pod_uid.as_str()) => Wait::Pending,
            Some(kp) if self.registry.is_gone(key, &kp.spec.pod_uid) => Wait::Pending,
            Some(kp) if Self::uid_matches(kp, uid) => match ready(kp) {
                Some(t) => Wait::Ready(Ok(t)),
                None => Wait::Pending,
            },
            _ => Wait::Pending,
        }
    }

    /// The UID of the pod an ADD is for: `K8S_POD_UID` or the one [`Self::pin_pod_uid`] read, or,
    /// when neither the API nor the pod watch knew one at the start, the pod watch's now.
    fn pod_uid(&self, p: &CniParams) -> Option<String> {
        p.pod_uid.clone().or_else(|| self.registry.pod_uid(&p.key))
    }

    /// For a runtime that passes no `K8S_POD_UID`: the pod's UID read once at the start, as
    /// upstream GETs the pod, so that the whole ADD is about that one pod (a deletion mid-wait is a
    /// 410 at once; a re-created pod under the name never gets the old one's ports). The API
    /// first; the pod watch's cache when the API cannot be asked; no pod at all is a 410.
    async fn pin_pod_uid(&self, p: &mut CniParams, deadline: Instant) -> Result<(), DaemonError> {
        if p.pod_uid.is_some() {
            return Ok(());
        }
        let asked = tokio::time::timeout_at(deadline, self.api.pod_uid(&p.key)).await;
        p.pod_uid = match asked {
            Ok(Ok(Some(uid))) => Some(uid),
            Ok(Ok(None)) => {
                return Err(DaemonError::PodGone(format!("pod {} does not exist", p.key)));
            }
            Ok(Err(e)) => {
                tracing::debug!(pod = %p.key, error = %e, "pod not read from the API: its UID is the pod watch's");
                self.registry.pod_uid(&p.key)
            }
            Err(_) => self.registry.pod_uid(&p.key),
        };
        Ok(())
    }

    fn timeout_error(&self, p: &CniParams, last: Option<Entry>, what: &str, waited: Duration) -> DaemonError {
        let uid = self.pod_uid(p);
        let uid = uid.as_deref();
        match last.and_then(|e| e.kuryrport) {
            Some(kp) if !Self::uid_matches(&kp, uid) => DaemonError::PodGone(format!(
                "pod UID mismatch: CNI_ARGS K8S_POD_UID={} but KuryrPort {} is for pod {}",
                uid.unwrap_or_default(),
                p.key,
                kp.spec.pod_uid
            )),
            _ => DaemonError::Timeout(format!(
                "timed out after {waited:.1?} waiting for {what} of pod {}",
                p.key
            )),
        }
    }

    /// CNI ADD.
    pub async fn add(self: &Arc<Self>, body: &[u8]) -> Result<AddResult, DaemonError> {
        let started = std::time::Instant::now();
        let res = self.add_inner(body).await;
        self.record("ADD", started, &res);
        res
    }

    fn record<T>(&self, command: &str, started: std::time::Instant, res: &Result<T, DaemonError>) {
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        self.metrics
            .observe(command, ms, res.as_ref().err().map(DaemonError::code));
        self.metrics
            .registry_entries
            .set(i64::try_from(self.registry.len()).unwrap_or(i64::MAX));
    }

    /// Wait until the pod's KuryrPort is `ready`, posting the `waiting`
    /// Event (reason, message) once the wait starts; a timeout posts a
    /// Warning of the third reason and names `what` was waited for.
    async fn wait_for_kuryrport(
        &self,
        p: &CniParams,
        deadline: Instant,
        what: &str,
        waiting: (&str, &str, &str),
        ready: impl Fn(&KuryrPort) -> Option<KuryrPort>,
    ) -> Result<KuryrPort, DaemonError> {
        let uid = p.pod_uid.as_deref();
        let (reason, message, timed_out) = waiting;
        let began = Instant::now();
        let answer = self
            .registry
            .wait_for(
                &p.key,
                deadline,
                |e| self.decide(&p.key, e, self.pod_uid(p).as_deref(), &ready),
                || self.tell(&p.key, uid, reason, message, false),
            )
            .await;
        match answer {
            Ok(Ok(res) | Err(res)) => res,
            Err(last) => {
                let e = self.timeout_error(p, last, what, deadline.saturating_duration_since(began));
                self.tell(&p.key, uid, timed_out, &e.to_string(), true).await;
                Err(e)
            }
        }
    }

    /// An Event on the pod, a courtesy: given [`EVENT_BOUND`] at most, so that
    /// an API server slow to take it never holds a CNI answer.
    async fn tell(&self, pod: &PodKey, uid: Option<&str>, reason: &str, message: &str, warning: bool) {
        let sent = self.events.publish(pod, uid, reason, message, warning);
        if tokio::time::timeout(EVENT_BOUND, sent).await.is_err() {
            tracing::debug!(pod = %pod, reason, "event not taken in time: dropped");
        }
    }

    /// The (mapped) netns path names something: checked before any wait, so
    /// a request that can never succeed is answered at once.
    fn netns_exists(&self, path: &str) -> Result<(), DaemonError> {
        let mapped = self.netns_path(path);
        std::fs::symlink_metadata(&mapped)
            .map(|_| ())
            .map_err(|e| DaemonError::BadParams(format!("CNI_NETNS {mapped:?}: {e}")))
    }

    /// `ns` is not the daemon's own network namespace (the host's): an ADD clears leftovers by
    /// name there and a DEL deletes by name, so a host link named CNI_IFNAME would go.
    fn refuse_own_netns(&self, path: &str, ns: &NetNs) -> Result<(), DaemonError> {
        let own = NetNs::current().and_then(|o| o.inode()).map_err(internal)?;
        match ns.inode() {
            Ok(id) if id == own => Err(DaemonError::BadParams(format!(
                "CNI_NETNS {path:?} is the daemon's own network namespace, not a pod's"
            ))),
            _ => Ok(()),
        }
    }

    /// [`Self::refuse_own_netns`] for a path, before any wait; one that does not open is left to
    /// the step that opens it.
    fn refuse_own_netns_path(&self, path: &str) -> Result<(), DaemonError> {
        let mapped = self.netns_path(path);
        match NetNs::open(&mapped) {
            Ok(ns) => self.refuse_own_netns(path, &ns),
            Err(_) => Ok(()),
        }
    }

    /// Step 2 of an ADD: every VIF plugged under the pod's lock and the attachment recorded, or
    /// what this ADD plugged undone. The specs plugged.
    async fn plug(&self, p: &CniParams, kp: &KuryrPort) -> Result<Vec<PlugSpec>, DaemonError> {
        let lock = self.lock_pod(&p.key).await;
        let specs = self.specs_for(kp, &p.req.ifname)?;
        let netns_path = self.netns_path(&p.req.netns);
        let netns =
            NetNs::open(&netns_path).map_err(|e| DaemonError::BadParams(format!("CNI_NETNS: {e}")))?;
        // Again on the handle plugged into: the path may name another namespace since the check.
        self.refuse_own_netns(&p.req.netns, &netns)?;
        let tag = p.key.owner_tag(&p.req.container_id);
        let pod_uid = kp.spec.pod_uid.clone();
        let target = PlugTarget {
            netns: Some(&netns),
            pod_uid: &pod_uid,
            owner_tag: Some(&tag),
        };
        for (i, spec) in specs.iter().enumerate() {
            let driver = self.drivers.for_kind(&spec.kind);
            if let Err(e) = driver.setup(spec, &target).await {
                // Undo what this ADD plugged; report the setup error.
                for done in specs[..=i].iter().rev() {
                    if let Err(te) = self.drivers.for_kind(&done.kind).teardown(done, &target).await {
                        tracing::warn!(pod = %p.key, error = %te, "cleanup after failed ADD");
                    }
                }
                return Err(plug_error(&spec.ifname, driver.name(), e));
            }
        }
        let attachment = Attachment {
            container_id: p.req.container_id.clone(),
            netns: Some(netns_path.clone()),
            netns_id: netns.inode().ok(),
            host_ifnames: specs.iter().map(|s| s.host_ifname.clone()).collect(),
            specs: specs.clone(),
        };
        if let Some(old) = self.registry.get(&p.key).and_then(|e| e.attachment)
            && old.container_id != attachment.container_id
        {
            self.teardown_superseded(&p.key, old, &attachment.host_ifnames)
                .await;
        }
        if let Some(state) = &self.state
            && let Err(e) = state.save(&Record::new(&p.key, &pod_uid, &attachment))
        {
            // The pod works; only a restart in its lifetime would fall back
            // to host link aliases (veths only) for its DEL.
            tracing::error!(pod = %p.key, error = %e, "could not record the attachment");
        }
        self.registry.set_attachment(&p.key, attachment);

        drop(lock);
        Ok(specs)
    }

    async fn add_inner(self: &Arc<Self>, body: &[u8]) -> Result<AddResult, DaemonError> {
        let mut p = CniParams::parse(body)?;
        p.validate(Command::Add)?;
        self.netns_exists(&p.req.netns)?;
        self.refuse_own_netns_path(&p.req.netns)?;
        // The plugin hangs up after its timeout: every wait ends in time for the answer (and the
        // timeout's Warning Event) to reach it before that.
        let started = Instant::now();
        let answer_by =
            client_timeout(&p.req.config_kuryr)?.map(|t| started + t.saturating_sub(answer_margin(t)));
        let bounded = |d: Instant| answer_by.map_or(d, |b| d.min(b));
        // The per-pod lock is held only while plugging, never during the
        // waits, so a DEL (or the kubelet's retry) is not stuck behind them.
        let deadline = bounded(started + self.config.vif_annotation_timeout);
        let _slot = match tokio::time::timeout_at(deadline, self.add_slots.acquire()).await {
            Ok(Ok(permit)) => AddSlot::new(permit, &self.metrics.adds_in_flight),
            Ok(Err(e)) => return Err(internal(e)),
            Err(_) => {
                self.metrics.reject("adds_busy");
                return Err(DaemonError::Timeout(format!(
                    "{} ADDs in flight: no slot for pod {} within {:.1?}",
                    self.config.limits.max_concurrent_adds,
                    p.key,
                    deadline.saturating_duration_since(started)
                )));
            }
        };
        // In a slot: at most max_concurrent_adds of these reads at once.
        self.pin_pod_uid(&mut p, deadline).await?;

        // 1. the KuryrPort carries VIFs (the Event goes out as the wait starts)
        let kp = self
            .wait_for_kuryrport(
                &p,
                deadline,
                "the KuryrPort's VIFs",
                // The timeout's reason is upstream's (its Warning is what alerts watch for).
                (
                    "CNIWaitingForVIFs",
                    "Waiting for Neutron ports to be created for the pod",
                    "CNITimeoutKuryrPortRegistry",
                ),
                |kp| kp.vifs().filter(|v| !v.is_empty()).map(|_| kp.clone()),
            )
            .await?;

        // 2. plug every VIF, in a task of its own: a client gone mid-plug (the runtime killed the
        // plugin, its sandbox given up) drops this request, and must not cut the plug short
        // between an interface made and its record, which the runtime's DEL goes by.
        let specs = {
            let (this, p, kp) = (self.clone(), p.clone(), kp.clone());
            tokio::spawn(async move { this.plug(&p, &kp).await })
                .await
                .map_err(internal)??
        };

        // 3. every VIF active, within a timeout of its own, as upstream waits for each: VIFs
        // that came late (the controller behind a burst) still get their ports the time to go
        // ACTIVE, instead of a 504 and the sandbox made again.
        let kp = self
            .wait_for_kuryrport(
                &p,
                bounded(Instant::now() + self.config.vif_annotation_timeout),
                "VIF activation",
                // Upstream's reasons.
                (
                    "CNIWaitingForActiveVIFs",
                    "Waiting for Neutron ports to become ACTIVE",
                    "CNITimedOutWaitingForActiveVIFs",
                ),
                |kp| kp.status.as_ref().filter(|s| s.all_active()).map(|_| kp.clone()),
            )
            .await?;
        // A DEL may have run while we waited: then there is nothing to report.
        let still_ours = self
            .registry
            .get(&p.key)
            .and_then(|e| e.attachment)
            .is_some_and(|a| a.container_id == p.req.container_id);
        if !still_ours {
            return Err(DaemonError::PodGone(format!(
                "container {} of pod {} was deleted while waiting for VIF activation",
                p.req.container_id, p.key
            )));
        }
        let status = kp
            .status
            .as_ref()
            .ok_or_else(|| internal("KuryrPort lost its status"))?;
        let (_, default_vif) = status
            .default_vif()
            .ok_or_else(|| internal("KuryrPort has no default VIF"))?;
        let vif_json = default_vif.to_primitive().map_err(internal)?;
        let all: Vec<&Vif> = status.vifs.values().map(|v| &v.vif).collect();
        let result = vif::cni_result(&specs, &p.req.netns, &vif::dns_servers(&all));
        Ok(AddResult {
            vif: vif_json,
            result,
        })
    }

    /// CNI DEL: idempotent; a DEL for a container other than the one ADD
    /// recorded is stale and touches nothing.
    pub async fn del(&self, body: &[u8]) -> Result<(), DaemonError> {
        let started = std::time::Instant::now();
        let res = self.del_inner(body).await;
        self.record("DEL", started, &res);
        res
    }

    async fn del_inner(&self, body: &[u8]) -> Result<(), DaemonError> {
        let p = CniParams::parse(body)?;
        p.validate(Command::Del)?;
        // No refusal of a path that names the daemon's own namespace here: a DEL must go through
        // (the kubelet retries a refused one for ever, a reused pid's path can name a host
        // process), and that namespace gets host-side cleanup only (below).
        let _lock = self.lock_pod(&p.key).await;
        let entry = self.registry.get(&p.key);
        let attachment = entry.as_ref().and_then(|e| e.attachment.clone());
        // An empty CNI_CONTAINERID names no container either: stale too, as upstream's
        // (`reg_ci != CNI_CONTAINERID`), never the pod's current attachment.
        if let Some(att) = &attachment
            && att.container_id != p.req.container_id
        {
            tracing::info!(pod = %p.key, stale = %p.req.container_id, current = %att.container_id, "ignoring stale DEL");
            return Ok(());
        }
        let specs = match &attachment {
            Some(att) if !att.specs.is_empty() => att.specs.clone(),
            _ => match entry.as_ref().and_then(|e| e.kuryrport.clone()) {
                Some(kp) if p.req.ifname.is_empty() => self.specs_for(&kp, "eth0").unwrap_or_default(),
                Some(kp) => self.specs_for(&kp, &p.req.ifname).unwrap_or_default(),
                None => Vec::new(),
            },
        };
        let netns_path = match (
            p.req.netns.as_str(),
            attachment.as_ref().and_then(|a| a.netns.clone()),
        ) {
            ("", Some(recorded)) => recorded,
            (given, _) => self.netns_path(given),
        };
        // A namespace that is already gone leaves only host-side cleanup; so does another one
        // now at the recorded path (a reused pid's `/proc/<pid>/ns/net`, a name made again):
        // its interfaces are not this pod's.
        let recorded = attachment
            .as_ref()
            .filter(|a| a.netns.as_deref() == Some(netns_path.as_str()));
        let netns = if netns_path.is_empty() {
            None
        } else {
            NetNs::open(&netns_path).ok().filter(|ns| {
                if self.refuse_own_netns(&netns_path, ns).is_err() {
                    // A recorded path that names the daemon's own namespace now is not the pod's.
                    tracing::info!(pod = %p.key, netns = %netns_path, "the recorded path is the daemon's own namespace now: host side only");
                    return false;
                }
                let plugged = recorded.and_then(|a| a.netns_id);
                let same = plugged.is_none() || ns.inode().ok() == plugged;
                if !same {
                    tracing::info!(pod = %p.key, netns = %netns_path, "another namespace is at the recorded path now: host side only");
                }
                same
            })
        };
        let uid = entry
            .as_ref()
            .and_then(|e| e.kuryrport.as_ref().map(|k| k.spec.pod_uid.clone()))
            .unwrap_or_default();
        // The container whose interfaces go: host ends plugged for another since are left.
        let container = attachment
            .as_ref()
            .map(|a| a.container_id.as_str())
            .filter(|c| !c.is_empty())
            .unwrap_or(&p.req.container_id);
        let owner = (!container.is_empty()).then(|| p.key.owner_tag(container));
        let target = PlugTarget {
            netns: netns.as_ref(),
            pod_uid: &uid,
            owner_tag: owner.as_deref(),
        };
        // Typed up to the HTTP answer, which can only carry text.
        let mut errors: Vec<BindingError> = Vec::new();
        for spec in specs.iter().rev() {
            if let Err(TeardownError(e)) = self.drivers.for_kind(&spec.kind).teardown(spec, &target).await {
                errors.extend(e);
            }
        }
        // Nothing known of the pod (no record, no KuryrPort: its state file lost, the KuryrPort
        // gone first): the interface the runtime names goes from the container's namespace, as
        // upstream cleans up - a nested VLAN device left there holds its VLAN id on the VM.
        if specs.is_empty()
            && attachment.is_none()
            && let Some(ns) = netns.as_ref()
        {
            let ifname = if p.req.ifname.is_empty() {
                "eth0"
            } else {
                p.req.ifname.as_str()
            };
            crate::binding::delete_netns_link(ns, ifname, None, &mut errors).await;
        }
        // Attachments restored from host link aliases only know link names:
        // remove the links and any OVS port named after them.
        if specs.is_empty()
            && let Some(att) = &attachment
        {
            let names = owned_links(&att.host_ifnames, owner.as_deref()).await;
            let bridged = delete_host_links(&names, &mut errors).await;
            self.drivers
                .ovs()
                .remove_ports_of_unknown_links(&names, &bridged, &mut errors)
                .await;
        }
        if let Err(e) = TeardownError::into_result(errors) {
            tracing::warn!(pod = %p.key, error = ?e, "DEL left errors");
            return Err(internal(format!("DEL of {}: {e}", p.key)));
        }
        if let Some(state) = &self.state {
            state.remove(&p.key).map_err(internal)?;
        }
        self.registry.clear_attachment(&p.key);
        Ok(())
    }

    /// Another container of the pod's name was plugged and its DEL has not come (a pod force-deleted
    /// and made again, a StatefulSet's): this ADD takes the pod's one record, and that DEL will be
    /// answered as stale, so what only the old container had on the host (its veth and OVS port,
    /// for another Neutron port) goes now. Interfaces the new attachment re-made under the same
    /// names (the same pod in a new sandbox) are left alone. Failures are logged: the new pod is
    /// plugged, and the old container's namespace takes its side of the veths when it goes.
    async fn teardown_superseded(&self, key: &PodKey, old: Attachment, kept: &[String]) {
        let gone = |name: &String| !kept.contains(name);
        let specs: Vec<PlugSpec> = old.specs.into_iter().filter(|s| gone(&s.host_ifname)).collect();
        let names: Vec<String> = old.host_ifnames.into_iter().filter(gone).collect();
        if specs.is_empty() && names.is_empty() {
            return;
        }
        tracing::info!(pod = %key, container = %old.container_id, interfaces = ?names, "tearing down the host side of a superseded container");
        // Host side only: the old container's namespace is the runtime's. Host ends plugged for
        // another pod since (the old port handed on) are left.
        let owner = key.owner_tag(&old.container_id);
        let target = PlugTarget {
            netns: None,
            pod_uid: "",
            owner_tag: Some(&owner),
        };
        let mut errors: Vec<BindingError> = Vec::new();
        if specs.is_empty() {
            let names = owned_links(&names, Some(&owner)).await;
            let bridged = delete_host_links(&names, &mut errors).await;
            self.drivers
                .ovs()
                .remove_ports_of_unknown_links(&names, &bridged, &mut errors)
                .await;
        }
        for spec in specs.iter().rev() {
            if let Err(TeardownError(e)) = self.drivers.for_kind(&spec.kind).teardown(spec, &target).await {
                errors.extend(e);
            }
        }
        if let Err(e) = TeardownError::into_result(errors) {
            tracing::warn!(pod = %key, error = ?e, "superseded container's interfaces left behind");
        }
    }

    /// CNI CHECK (kuryr-rs extension): every interface is still as plugged.
    pub async fn check(&self, body: &[u8]) -> Result<(), DaemonError> {
        let started = std::time::Instant::now();
        let res = self.check_inner(body).await;
        self.record("CHECK", started, &res);
        res
    }

    async fn check_inner(&self, body: &[u8]) -> Result<(), DaemonError> {
        let p = CniParams::parse(body)?;
        p.validate(Command::Check)?;
        self.netns_exists(&p.req.netns)?;
        self.refuse_own_netns_path(&p.req.netns)?;
        let entry = self.registry.get(&p.key);
        if let (Some(gone), Some(uid)) = (
            entry.as_ref().and_then(|e| e.gone_uid.clone()),
            p.pod_uid.as_deref(),
        ) && gone == uid
        {
            return Err(DaemonError::PodGone(format!("pod {} was deleted", p.key)));
        }
        let specs = match entry.as_ref().and_then(|e| e.attachment.clone()) {
            Some(att) if att.container_id == p.req.container_id && !att.specs.is_empty() => att.specs,
            Some(att) if att.container_id == p.req.container_id => match entry.and_then(|e| e.kuryrport) {
                Some(kp) => self.specs_for(&kp, &p.req.ifname)?,
                None => return Err(internal(format!("no KuryrPort for {}", p.key))),
            },
            _ => {
                return Err(internal(format!(
                    "container {} of pod {} is not plugged by this daemon",
                    p.req.container_id, p.key
                )));
            }
        };
        let netns = NetNs::open(&self.netns_path(&p.req.netns))
            .map_err(|e| DaemonError::BadParams(format!("CNI_NETNS: {e}")))?;
        let target = PlugTarget::new(&netns, "");
        for spec in &specs {
            self.drivers
                .for_kind(&spec.kind)
                .check(spec, &target)
                .await
                .map_err(internal)?;
        }
        Ok(())
    }

    /// CNI GC (kuryr-rs extension): tear down every attachment whose
    /// container is not in `config_kuryr["cni.dev/valid-attachments"]`.
    pub async fn gc(&self, body: &[u8]) -> Result<usize, DaemonError> {
        let req = crate::api::CniRequest::from_json(body)?;
        let valid = match req.config_kuryr.get("cni.dev/valid-attachments") {
            // Read as "nothing is valid" it would tear down every pod of the node; the CNI spec
            // has the runtime always send it, so its absence is a bad request.
            None => {
                return Err(DaemonError::BadParams(
                    "config_kuryr: cni.dev/valid-attachments is missing (an empty list, not none, means no attachment is valid)".into(),
                ));
            }
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.get("containerID")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| {
                            DaemonError::BadParams(
                                "cni.dev/valid-attachments[].containerID is missing".into(),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => {
                return Err(DaemonError::BadParams(
                    "cni.dev/valid-attachments must be a list".into(),
                ));
            }
        };
        let mut removed = 0;
        let mut errors = Vec::new();
        for (key, att) in self.registry.attachments() {
            if valid.contains(&att.container_id) {
                continue;
            }
            let body = serde_json::json!({
                "CNI_CONTAINERID": att.container_id,
                "CNI_NETNS": att.netns.clone().unwrap_or_default(),
                "CNI_ARGS": format!("K8S_POD_NAMESPACE={};K8S_POD_NAME={}", key.namespace, key.name),
            });
            match self.del(body.to_string().as_bytes()).await {
                Ok(()) => removed += 1,
                Err(e) => errors.push(e.to_string()),
            }
        }
        if errors.is_empty() {
            Ok(removed)
        } else {
            Err(internal(errors.join("; ")))
        }
    }

    /// Readiness: CAP_NET_ADMIN and a reachable Kubernetes API.
    pub async fn ready(&self) -> Result<(), DaemonError> {
        if !has_cap_net_admin() {
            return Err(DaemonError::NotReady("the daemon lacks CAP_NET_ADMIN".into()));
        }
        self.api
            .check()
            .await
            .map_err(|e| DaemonError::NotReady(format!("Kubernetes API unreachable: {e}")))
    }

    /// Rebuild attachments after a restart: the state directory has every
    /// binding as plugged (veth, OVS, nested VLAN/macvlan, SR-IOV); host
    /// link aliases written at ADD cover veths plugged without one (no state
    /// directory, or a crash between plugging and recording). Keeps
    /// stale-DEL detection and lets DEL tear everything down even when the
    /// KuryrPort is gone. Returns how many pods were restored.
    pub async fn restore_from_host(&self) -> Result<usize, DaemonError> {
        let mut found: HashMap<PodKey, Attachment> = HashMap::new();
        if let Some(state) = &self.state {
            let (records, errors) = state.load_all();
            for e in errors {
                tracing::error!(error = %e, "skipping an unreadable attachment record");
            }
            for r in records {
                found.insert(r.key(), r.attachment());
            }
        }
        let host = Netlink::current().map_err(internal)?;
        for link in host.list_links().await.map_err(internal)? {
            let Some((key, container)) = link.alias.as_deref().and_then(PodKey::parse_owner_tag) else {
                continue;
            };
            let att = found.entry(key).or_insert_with(|| Attachment {
                container_id: container,
                netns: None,
                netns_id: None,
                specs: Vec::new(),
                host_ifnames: Vec::new(),
            });
            // A recorded attachment already names its links.
            if att.specs.is_empty() && !att.host_ifnames.contains(&link.name) {
                att.host_ifnames.push(link.name);
            }
        }
        let n = found.len();
        for (key, att) in found {
            if self.registry.get(&key).and_then(|e| e.attachment).is_none() {
                self.registry.set_attachment(&key, att);
            }
        }
        Ok(n)
    }
}

/// `names` less the host links another container owns now (their alias names
/// another kuryr owner than `owner`): plugged for another pod since, under the
/// same Neutron port's interface name.
async fn owned_links(names: &[String], owner: Option<&str>) -> Vec<String> {
    let (Some(owner), Ok(host)) = (owner, Netlink::current()) else {
        return names.to_vec();
    };
    let mut owned = Vec::with_capacity(names.len());
    for name in names {
        let alias = match host.link_by_name(name).await {
            Ok(Some(l)) => l.alias,
            _ => None,
        };
        match alias {
            Some(a) if a != owner && PodKey::parse_owner_tag(&a).is_some() => {
                tracing::info!(link = %name, owner = %a, "host end plugged for another container since: left alone");
            }
            _ => owned.push(name.clone()),
        }
    }
    owned
}

/// Delete host links by name; returns the names that were Linux bridges or enslaved
/// to one (so were never OVS ports).
async fn delete_host_links(names: &[String], errors: &mut Vec<BindingError>) -> Vec<String> {
    let mut bridged = Vec::new();
    let host = match Netlink::current() {
        Ok(h) => h,
        Err(e) => {
            errors.push(e.into());
            return bridged;
        }
    };
    // All are looked at before any goes: a bridge deleted first would leave its ports unenslaved.
    let mut found = Vec::new();
    for name in names {
        match host.link_by_name(name).await {
            Ok(Some(l)) => {
                // A Linux bridge (an OVS hybrid plug's, which carries its pod's alias) and the
                // ports of one were never OVS ports.
                let is_bridge = |kind: Option<&str>| kind == Some("bridge");
                let on_bridge = match l.master {
                    Some(master) => host
                        .link_by_index(master)
                        .await
                        .ok()
                        .flatten()
                        .is_some_and(|m| is_bridge(m.kind.as_deref())),
                    None => false,
                };
                if on_bridge || is_bridge(l.kind.as_deref()) {
                    bridged.push(name.clone());
                }
                found.push(l.index);
            }
            Ok(None) => {}
            Err(e) => errors.push(e.into()),
        }
    }
    for index in found {
        if let Err(e) = host.delete_link(index).await
            && e.errno() != Some(libc::ENODEV)
        {
            errors.push(e.into());
        }
    }
    bridged
}

/// CAP_NET_ADMIN (bit 12) in the effective set, from /proc/self/status.
pub fn has_cap_net_admin() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 12) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_plugin_timeout_still_leaves_the_waits_most_of_it() {
        assert_eq!(answer_margin(Duration::from_secs(180)), Duration::from_secs(3));
        assert_eq!(answer_margin(Duration::from_secs(12)), Duration::from_secs(3));
        assert_eq!(answer_margin(Duration::from_secs(2)), Duration::from_millis(500));
        assert!(answer_margin(Duration::from_millis(1)) < Duration::from_millis(1));
    }

    #[test]
    fn a_vlan_id_still_held_is_try_again_later_as_upstream() {
        let busy = plug_error(
            "eth0",
            "nested-vlan",
            BindingError::Busy {
                driver: "nested-vlan",
                reason: "VLAN ID 7 on ens4 is still in use".into(),
            },
        );
        assert_eq!((busy.code(), busy.status().as_u16()), (11, 504));
        assert!(busy.to_string().contains("VLAN ID 7"), "{busy}");
        let other = plug_error(
            "eth0",
            "bridge",
            BindingError::InvalidVif {
                field: "mtu".into(),
                message: "0".into(),
            },
        );
        assert_eq!((other.code(), other.status().as_u16()), (999, 500));
    }

    #[test]
    fn config_from_kuryr_conf_defaults() {
        let mut k = kuryr_config::KuryrConfig::default();
        k.binding.link_iface = "ens4".into();
        let c = DaemonConfig::from_kuryr_config(&k, "n1");
        assert_eq!(c.bind_address, SocketAddr::from(([127, 0, 0, 1], 5036)));
        assert_eq!(c.vif_annotation_timeout, Duration::from_secs(60));
        assert_eq!(c.health_address.port(), 8090);
        assert_eq!(c.metrics_address.port(), 9655);
        assert_eq!(c.binding.link_iface.as_deref(), Some("ens4"));
        assert_eq!(c.binding.ovs_bridge, "br-int");
        assert_eq!(c.binding.ovs_plug, kuryr_config::OvsPlugMode::Ovs);
        let k = kuryr_config::KuryrConfig::from_ini_str(
            "[sriov]\nphysical_device_mappings = physnet1:ens1f0,physnet1:ens1f1\nkubelet_root_dir = /k\n",
        )
        .expect("loads")
        .config;
        let c = DaemonConfig::from_kuryr_config(&k, "n1");
        assert_eq!(
            c.binding.sriov.options.pfs_of_physnet("physnet1"),
            Some(&["ens1f0".to_string(), "ens1f1".to_string()][..])
        );
        assert_eq!(c.binding.sriov.options.kubelet_root_dir, "/k");
        assert_eq!(
            DaemonConfig::from_kuryr_config(&kuryr_config::KuryrConfig::default(), "n")
                .binding
                .link_iface,
            None
        );
    }

    #[test]
    fn config_from_kuryr_conf_ovs_options() {
        let ini = "[binding]\novs_db = unix:/run/ovs/db.sock\novs_datapath_type = netdev\novs_plug_mode = linux_bridge\n";
        let k = kuryr_config::KuryrConfig::from_ini_str(ini)
            .expect("loads")
            .config;
        let c = DaemonConfig::from_kuryr_config(&k, "n1");
        assert_eq!(c.binding.ovs_db.as_deref(), Some("unix:/run/ovs/db.sock"));
        assert_eq!(c.binding.ovs_datapath_type, "netdev");
        assert_eq!(c.binding.ovs_plug, kuryr_config::OvsPlugMode::LinuxBridge);
        assert_eq!(c.binding.pod_tx_checksum, crate::binding::TxChecksumMode::Auto);
        let bad = kuryr_config::KuryrConfig::from_ini_str("[binding]\novs_plug_mode = vpp\n");
        assert!(bad.is_err_and(|e| e.to_string().contains("ovs_plug_mode")));
        for (value, mode) in [
            ("off", crate::binding::TxChecksumMode::Off),
            ("on", crate::binding::TxChecksumMode::On),
            ("auto", crate::binding::TxChecksumMode::Auto),
        ] {
            let k = kuryr_config::KuryrConfig::from_ini_str(&format!(
                "[binding]\npod_tx_checksum_offload = {value}\n"
            ))
            .expect("loads")
            .config;
            assert_eq!(
                DaemonConfig::from_kuryr_config(&k, "n1").binding.pod_tx_checksum,
                mode
            );
        }
        let bad = kuryr_config::KuryrConfig::from_ini_str("[binding]\npod_tx_checksum_offload = maybe\n");
        assert!(bad.is_err_and(|e| e.to_string().contains("pod_tx_checksum_offload")));
    }
}
