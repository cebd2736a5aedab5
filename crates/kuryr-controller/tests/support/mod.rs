//! Test bed for controller integration tests: the Kubernetes API emulator (judged by kube-rs, the
//! controller's real client), CRDs applied, and Neutron targets - the in-repo emulator always, the
//! real neutron-server when `KURYR_TEST_NEUTRON_URL` is set (the README test command sets it).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, PostParams};
use kube_emulator::{KubeEmulator, KubeHandle, KubeOptions};
use kuryr_config::KuryrConfig;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_neutron::{ClientOptions, NeutronClient};
use neutron_emulator::{AgentHosts, Emulator, EmulatorHandle, EmulatorOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub const NODES: [&str; 2] = ["k8s-node-1", "k8s-node-2"];

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

/// One Neutron to run against.
pub struct NeutronTarget {
    pub name: &'static str,
    pub url: String,
    pub client: NeutronClient,
    _emulator: Option<EmulatorHandle>,
}

/// Every target available here: the emulator, and the real server when configured.
pub async fn neutron_targets() -> Result<Vec<NeutronTarget>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut out = vec![];
    let emu = Emulator::start(EmulatorOptions {
        active_delay: Duration::from_millis(50),
        agent_hosts: AgentHosts::Only(NODES.iter().map(|s| s.to_string()).collect()),
        ..EmulatorOptions::default()
    })
    .await?;
    let url = emu.url();
    out.push(NeutronTarget {
        name: "emulator",
        client: NeutronClient::new(&ClientOptions::noauth(&url))?,
        url,
        _emulator: Some(emu),
    });
    match std::env::var("KURYR_TEST_NEUTRON_URL") {
        Ok(url) if !url.is_empty() => out.push(NeutronTarget {
            name: "neutron-server",
            client: NeutronClient::new(&ClientOptions::noauth(&url))?,
            url,
            _emulator: None,
        }),
        _ => eprintln!(
            "KURYR_TEST_NEUTRON_URL unset: real neutron-server target skipped (scripts/test-all.sh sets it)"
        ),
    }
    Ok(out)
}

pub struct Kube {
    pub handle: KubeHandle,
    pub client: Client,
}

pub async fn start_kube() -> Result<Kube> {
    let handle = KubeEmulator::start(KubeOptions {
        nodes: NODES.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
    .await?;
    let client = Client::try_from(kube::Config::new(handle.url().parse()?))?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in kuryr_crds::generate::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .context("apply CRD")?;
    }
    Ok(Kube { handle, client })
}

/// Neutron resources of one test: its own project, network, subnet and security group.
pub struct NeutronFixture {
    pub project: String,
    pub network: String,
    pub subnet: String,
    pub sg: String,
    pub cidr: String,
}

pub async fn neutron_fixture(client: &NeutronClient, cidr: &str) -> Result<NeutronFixture> {
    let project = format!("kuryr-test-{}", uuid::Uuid::new_v4().simple());
    let net = client
        .create_network(&kuryr_neutron::NetworkCreate {
            name: Some("pods".into()),
            project_id: Some(project.clone()),
            ..Default::default()
        })
        .await?;
    let subnet = client
        .create_subnet(&kuryr_neutron::SubnetCreate {
            network_id: net.id.clone(),
            ip_version: 4,
            cidr: Some(cidr.into()),
            project_id: Some(project.clone()),
            name: Some("pods".into()),
            ..Default::default()
        })
        .await?;
    let sg = client
        .create_security_group(&kuryr_neutron::SecurityGroupCreate {
            name: "pods".into(),
            project_id: Some(project.clone()),
            ..Default::default()
        })
        .await?;
    Ok(NeutronFixture {
        project,
        network: net.id,
        subnet: subnet.id,
        sg: sg.id,
        cidr: cidr.into(),
    })
}

/// Removes whatever a test left in its project (ports first, then trunks, networks, groups).
pub async fn cleanup_project(client: &NeutronClient, project: &str) {
    use kuryr_neutron::ListFilter;
    let f = || ListFilter::new().project_id(project);
    if let Ok(trunks) = client.list_trunks(&f()).await {
        for t in trunks {
            let _ = client.delete_trunk(&t.id).await;
        }
    }
    if let Ok(ports) = client.list_ports(&f()).await {
        for p in ports {
            let _ = client.delete_port(&p.id).await;
        }
    }
    if let Ok(nets) = client.list_networks(&f()).await {
        for n in nets {
            let _ = client.delete_network(&n.id).await;
        }
    }
    if let Ok(sgs) = client.list_security_groups(&f()).await {
        for s in sgs {
            if s.name != "default" {
                let _ = client.delete_security_group(&s.id).await;
            }
        }
    }
}

pub fn config(ini: &str) -> Arc<KuryrConfig> {
    Arc::new(KuryrConfig::from_ini_str(ini).expect("test config").config)
}

/// A running controller; dropping `stop` (or calling `kill`) ends it.
pub struct Controller {
    pub stop: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
    pub metrics: Metrics,
}

impl Controller {
    /// Stops it abruptly, like SIGKILL: no lease hand-over, nothing flushed.
    pub fn kill(self) {
        self.task.abort();
    }
}

pub fn start_controller(
    kube: &Client,
    neutron: &NeutronTarget,
    cfg: Arc<KuryrConfig>,
    identity: &str,
) -> Controller {
    let metrics = Metrics::new();
    let deployments = Deployments::noauth(&neutron.url, &metrics).expect("neutron client");
    let mut opts = ControllerOptions::new(cfg, kube.clone(), deployments, metrics.clone());
    opts.health_addr = None;
    opts.metrics_addr = None;
    opts.identity = identity.to_string();
    let stop = CancellationToken::new();
    let s = stop.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = run(opts, s).await {
            panic!("controller failed: {e}");
        }
    });
    Controller { stop, task, metrics }
}

pub async fn create_namespace(kube: &Client, name: &str, annotations: serde_json::Value) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "annotations": annotations}
    }))?;
    Api::<Namespace>::all(kube.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

pub async fn create_pod(
    kube: &Client,
    ns: &str,
    name: &str,
    node: &str,
    annotations: serde_json::Value,
) -> Result<Pod> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    }))?;
    Ok(Api::<Pod>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?)
}

pub async fn set_node_ip(kube: &Client, node: &str, ip: &str) -> Result<()> {
    let api: Api<Node> = Api::all(kube.clone());
    let patch = json!({"status": {"addresses": [{"type": "InternalIP", "address": ip}]}});
    api.patch_status(
        node,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Polls `f` until it returns Some or the deadline passes.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out waiting for {what} (last error: {last_err:?})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
    /// `vif_pool` is the body of the `[vif_pool]` section.
    pub async fn new(kube: &Kube, fx: &NeutronFixture, vif_pool: &str) -> Result<Self> {
        match create_namespace(&kube.client, CONTROLLER_NS, json!({})).await {
            Ok(()) => {}
            Err(e) if e.to_string().contains("already exists") => {}
            Err(e) => return Err(e),
        }
        let cluster_id = format!("pool-{}", uuid::Uuid::new_v4().simple());
        let socket = std::env::temp_dir().join(format!("{cluster_id}.sock"));
        let ini = format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = neutron\n\
             cluster_id = {cluster_id}\ncontroller_namespace = {CONTROLLER_NS}\nenable_manager = true\n\
             [pool_manager]\nsock_file = {}\n[vif_pool]\n{vif_pool}\n\
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
