//! Test bed for the controller's integration tests: the shared `kuryr-testbed` plus what only the
//! pool tests need.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use kube::Client;
use kube::api::{Api, ListParams};
use kuryr_config::KuryrConfig;
use kuryr_controller::drivers::pool::{VifOrigin, VifPool};
use kuryr_controller::drivers::{PodRef, PortSpec};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pool::api;
use kuryr_controller::pool::driver::PoolSummary;
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_crds::{KuryrPort, Vif};
use kuryr_neutron::NeutronClient;
pub use kuryr_testbed::*;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The controller's platform on one Neutron without authentication (`url`), for tests that
/// drive handlers or drivers directly. No cluster_id claim is confirmed: a test that needs one
/// says so (`Deployments::set_claimed`, or `claim_cluster_id`).
pub fn noauth_platform(
    kube: &Client,
    url: &str,
    cfg: Arc<KuryrConfig>,
) -> Result<Arc<kuryr_controller::context::Platform>> {
    let metrics = Metrics::new();
    let deployments = Deployments::noauth(url, &metrics)?;
    Ok(Arc::new(kuryr_controller::context::Platform::new(
        kube.clone(),
        cfg,
        deployments,
        metrics,
    )))
}

/// Namespace of the controller's KuryrPortPool objects in the pool tests.
pub const CONTROLLER_NS: &str = "kuryr-system";

/// What a pooled controller needs: its config (`neutron` pool driver, a cluster id of its own so
/// that its orphan sweep never touches another test's ports on a shared neutron-server) and the
/// pool management API socket.
pub struct PoolBed {
    pub ini: String,
    pub socket: std::path::PathBuf,
    pub cluster_id: String,
}

impl PoolBed {
    /// Bare metal (`neutron-vif` through the `neutron` pool); `vif_pool` is the body of the
    /// `[vif_pool]` section.
    pub async fn new(kube: &Kube, fx: &NeutronFixture, vif_pool: &str) -> Result<Self> {
        Self::with_drivers(kube, fx, "neutron-vif", "neutron", "", vif_pool).await
    }

    /// Nested VLAN (`nested-vlan` through the `nested` pool) on VMs whose trunk parents are on
    /// `worker_subnet`.
    pub async fn nested(
        kube: &Kube,
        fx: &NeutronFixture,
        worker_subnet: &str,
        vif_pool: &str,
    ) -> Result<Self> {
        Self::nested_with(kube, fx, worker_subnet, "nested", vif_pool).await
    }

    /// Nested VLAN through `pool_driver` (`nested` or `noop`).
    pub async fn nested_with(
        kube: &Kube,
        fx: &NeutronFixture,
        worker_subnet: &str,
        pool_driver: &str,
        vif_pool: &str,
    ) -> Result<Self> {
        let nested = format!("[pod_vif_nested]\nworker_nodes_subnets = {worker_subnet}\n");
        Self::with_drivers(kube, fx, "nested-vlan", pool_driver, &nested, vif_pool).await
    }

    async fn with_drivers(
        kube: &Kube,
        fx: &NeutronFixture,
        vif_driver: &str,
        pool_driver: &str,
        extra: &str,
        vif_pool: &str,
    ) -> Result<Self> {
        match create_namespace(&kube.client, CONTROLLER_NS, json!({})).await {
            Ok(()) => {}
            Err(e) if e.to_string().contains("already exists") => {}
            Err(e) => return Err(e),
        }
        let cluster_id = format!("pool-{}", uuid::Uuid::new_v4().simple());
        let socket = std::env::temp_dir().join(format!("{cluster_id}.sock"));
        let ini = format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = {vif_driver}\nvif_pool_driver = {pool_driver}\n\
             cluster_id = {cluster_id}\ncontroller_namespace = {CONTROLLER_NS}\nenable_manager = true\n\
             [pool_manager]\nsock_file = {}\n[vif_pool]\n{vif_pool}\n{extra}\
             [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nresource_tags = k8s,test\n",
            socket.display(),
            fx.project,
            fx.subnet,
            fx.sg
        );
        Ok(Self {
            ini,
            socket,
            cluster_id,
        })
    }
}

/// How long the pool helpers wait for an outcome: generous, as a real neutron-server on a loaded
/// machine can take seconds per call.
const POOL_WAIT: Duration = Duration::from_secs(120);

/// A pooled port for `pod`, asking again while the pool answers a retryable error, as the
/// handler pipeline does: a pool being recovered, or a refill that outlasts the pool's short
/// refill wait (a cold pool's first request on a real neutron-server, whose bulk create may take
/// longer than that wait).
pub async fn pooled_vif<P: VifPool + ?Sized>(
    pool: &P,
    pod: &PodRef,
    spec: &PortSpec,
) -> Result<(Vif, VifOrigin)> {
    eventually(&format!("a pooled port for {}", pod.name), POOL_WAIT, || async {
        match pool.request_vif(pod, spec).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_retryable() => Ok(None),
            Err(e) => Err(anyhow::anyhow!("not retryable: {e}")),
        }
    })
    .await
}

/// The controller's only pool (through the management socket) once no refill runs and it holds
/// exactly `available` spare and `in_use` used ports: from then on it changes only when pods or
/// maintenance passes change it, so "nothing else was created" can be checked without sleeping.
pub async fn settled_pool(socket: &std::path::Path, available: usize, in_use: usize) -> Result<PoolSummary> {
    eventually(
        &format!("one settled pool with {available} available and {in_use} in use"),
        POOL_WAIT,
        || async {
            let mut pools = api::list_pools(socket).await?;
            let ok = pools.len() == 1
                && !pools[0].populating
                && pools[0].recyclable == 0
                && (pools[0].available, pools[0].in_use) == (available, in_use);
            Ok(ok.then(|| pools.remove(0)))
        },
    )
    .await
}

/// Ids of the kuryr-rs ports of a project (pool and pod ports alike).
pub async fn kuryr_ports(
    client: &NeutronClient,
    project: &str,
) -> Result<std::collections::BTreeSet<String>> {
    let f = kuryr_neutron::ListFilter::new()
        .project_id(project)
        .tags([kuryr_crds::names::neutron::TAG_MANAGED]);
    Ok(client.list_ports(&f).await?.into_iter().map(|p| p.id).collect())
}

/// A controller on a runtime of its own, so that [`IsolatedController::kill`] has SIGKILL
/// semantics: every task it spawned - detached ones included (per-object handler queues, pool
/// refills) - stops at once, nothing is flushed and no lease is handed over. Aborting the
/// JoinHandle of `run` ([`Controller::kill`]) leaves detached tasks running.
pub struct IsolatedController {
    rt: Option<tokio::runtime::Runtime>,
    pub stop: CancellationToken,
    exited: Arc<std::sync::atomic::AtomicBool>,
}

pub fn start_isolated_controller(
    kube_url: &str,
    neutron: &NeutronTarget,
    cfg: Arc<KuryrConfig>,
    identity: &str,
) -> Result<IsolatedController> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let stop = CancellationToken::new();
    let exited = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Clients spawn background tasks on the runtime that builds them: build them inside.
    let (kube_url, neutron_url, identity) = (kube_url.to_string(), neutron.url.clone(), identity.to_string());
    let (s, done) = (stop.clone(), exited.clone());
    rt.spawn(async move {
        let result = async {
            let kube = Client::try_from(kube::Config::new(kube_url.parse()?))?;
            let metrics = Metrics::new();
            let deployments = Deployments::noauth(&neutron_url, &metrics)?;
            let mut opts = ControllerOptions::new(cfg, kube, deployments, metrics);
            opts.health_addr = None;
            opts.metrics_addr = None;
            opts.identity = identity.clone();
            run(opts, s).await?;
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = result {
            eprintln!("controller {identity} failed: {e:#}");
        }
        done.store(true, std::sync::atomic::Ordering::Release);
    });
    Ok(IsolatedController {
        rt: Some(rt),
        stop,
        exited,
    })
}

impl IsolatedController {
    /// SIGKILL: the runtime is torn down without waiting for anything.
    pub fn kill(mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }

    /// Graceful stop: cancel, then give the controller 15 s to finish.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(rt) = self.rt.take() {
            let _ = tokio::task::spawn_blocking(move || rt.shutdown_timeout(Duration::from_secs(15))).await;
        }
    }

    pub fn has_exited(&self) -> bool {
        self.exited.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for IsolatedController {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Waits for exactly `n` KuryrPorts in `ns`, all with an active default VIF; their port ids.
pub async fn wait_active_ports(kube: &kube::Client, ns: &str, n: usize) -> Result<BTreeSet<String>> {
    let api = Api::<KuryrPort>::namespaced(kube.clone(), ns);
    eventually(
        &format!("{n} active KuryrPorts in {ns}"),
        Duration::from_secs(120),
        || async {
            let kps = api.list(&ListParams::default()).await?.items;
            let ids: BTreeSet<String> = kps
                .iter()
                .filter_map(|kp| kp.status.as_ref()?.default_vif())
                .filter(|(_, v)| v.active())
                .map(|(_, v)| v.id().to_string())
                .collect();
            Ok((kps.len() == n && ids.len() == n).then_some(ids))
        },
    )
    .await
}

/// The KuryrPort of `ns/pod` once it has `n` VIFs, all active.
pub async fn wired_kp(kube: &Client, ns: &str, pod: &str, n: usize) -> Result<KuryrPort> {
    let api = Api::<KuryrPort>::namespaced(kube.clone(), ns);
    eventually(
        &format!("{pod} wired with {n} VIFs"),
        Duration::from_secs(120),
        || async {
            let Some(kp) = api.get_opt(pod).await? else {
                return Ok(None);
            };
            let ok = kp
                .status
                .as_ref()
                .is_some_and(|s| s.vifs.len() == n && s.vifs.values().all(|v| v.vif.active()));
            Ok(ok.then_some(kp))
        },
    )
    .await
}

/// What the `namespace` subnet driver needs in `project`: a subnet pool over `prefix` handing
/// out a /26 per namespace, and the router namespace subnets are attached to.
pub async fn namespace_subnet_infra(
    neutron: &NeutronClient,
    project: &str,
    prefix: &str,
) -> Result<(kuryr_neutron::SubnetPool, kuryr_neutron::Router)> {
    let pool = neutron
        .create_subnetpool(&kuryr_neutron::SubnetPoolCreate {
            name: "ns-pool".into(),
            prefixes: vec![prefix.into()],
            default_prefixlen: Some(26),
            project_id: Some(project.to_string()),
            ..Default::default()
        })
        .await?;
    let router = neutron
        .create_router(&kuryr_neutron::RouterCreate {
            name: Some("pods".into()),
            project_id: Some(project.to_string()),
            ..Default::default()
        })
        .await?;
    Ok((pool, router))
}

/// Deletes pod `pod` and then namespace `ns`; waits until the namespace's Neutron network
/// `net_id` and its KuryrNetwork are gone.
pub async fn delete_namespace_and_wait(
    kube: &Client,
    neutron: &NeutronClient,
    ns: &str,
    pod: &str,
    net_id: &str,
) -> Result<()> {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::api::DeleteParams;
    let wait = Duration::from_secs(120);
    Api::<Pod>::namespaced(kube.clone(), ns)
        .delete(pod, &DeleteParams::default())
        .await?;
    Api::<Namespace>::all(kube.clone())
        .delete(ns, &DeleteParams::default())
        .await?;
    eventually("namespace network removed", wait, || async {
        Ok(neutron
            .get_network(net_id)
            .await
            .err()
            .filter(|e| e.is_not_found())
            .map(|_| ()))
    })
    .await?;
    let kns = Api::<kuryr_crds::KuryrNetwork>::namespaced(kube.clone(), ns);
    eventually("KuryrNetwork gone", wait, || async {
        Ok(kns.get_opt(ns).await?.is_none().then_some(()))
    })
    .await
}

/// Records the pod's port in its KuryrPort as the kuryrport handler does (recovery reads it).
pub async fn record_kuryrport(kube: &Client, pod: &PodRef, vif: &Vif, origin: &VifOrigin) -> Result<()> {
    let mut kp: KuryrPort = serde_json::from_value(json!({
        "apiVersion": "openstack.org/v1", "kind": "KuryrPort",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
        "spec": {"podUid": pod.uid, "podNodeName": pod.node},
    }))?;
    let mut entry = kuryr_crds::KuryrPortVif::new(true, vif.clone());
    entry.extra.insert(
        kuryr_controller::drivers::pool::ORIGIN_FIELD.into(),
        serde_json::to_value(origin)?,
    );
    kp.status = Some(kuryr_crds::KuryrPortStatus {
        vifs: [("eth0".to_string(), entry)].into_iter().collect(),
    });
    Api::<KuryrPort>::namespaced(kube.clone(), &pod.namespace)
        .create(&kube::api::PostParams::default(), &kp)
        .await?;
    Ok(())
}

/// A pod of the default namespace on the first node, asking a pool directly.
pub fn pool_pod(name: &str) -> PodRef {
    PodRef {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        node: NODES[0].into(),
    }
}

/// One leadership term of a pool manager: started, and ready once its recovery is done.
pub type PoolTerm = (CancellationToken, tokio::task::JoinHandle<()>);

pub async fn start_pool_term(m: &Arc<kuryr_controller::pool::PoolManager>) -> Result<PoolTerm> {
    let stop = CancellationToken::new();
    let task = tokio::spawn(m.clone().run(stop.clone()));
    eventually("pools recovered", Duration::from_secs(120), || async {
        Ok(m.is_ready().then_some(()))
    })
    .await?;
    Ok((stop, task))
}

/// Ends the term: its pools are dropped, as when leadership is lost.
pub async fn end_pool_term(term: PoolTerm) -> Result<()> {
    term.0.cancel();
    tokio::time::timeout(Duration::from_secs(120), term.1).await??;
    Ok(())
}
