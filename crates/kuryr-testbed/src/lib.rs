//! Test only: the test bed shared by the controller's integration tests and the end-to-end tests.
//! The Kubernetes API emulator with the CRDs applied, the Neutron targets (the in-repo emulator
//! always, the real neutron-server when `KURYR_TEST_NEUTRON_URL` is set, required with
//! `KURYR_TEST_REQUIRE_NEUTRON=1`), per-test Neutron
//! fixtures, in-process controllers and polling helpers, and [`skip`]: how every test says why it
//! does not run (a failure under `KURYR_TEST_REQUIRE_ALL=1`).
#![allow(clippy::expect_used)]

pub mod skip;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_emulator::{KubeEmulator, KubeHandle, KubeOptions};
use kuryr_config::KuryrConfig;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_neutron::{ClientOptions, ListFilter, NeutronClient};
use neutron_emulator::{AgentHosts, Emulator, EmulatorHandle, EmulatorOptions};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use skip::{skip, skip_hardware};

/// The real server's fake OVS agent serves exactly these hosts (and [`HYBRID_PLUG_NODE`]).
pub const NODES: [&str; 2] = ["k8s-node-1", "k8s-node-2"];

/// The host whose OVS agent plugs the hybrid way (as with the iptables_hybrid firewall): ML2 binds
/// its ports with `ovs_hybrid_plug` (`scripts/neutron-lab/`'s `HYBRID_HOSTS`).
pub const HYBRID_PLUG_NODE: &str = "k8s-node-hybrid";

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

impl NeutronTarget {
    /// The emulator behind this target, when it is one.
    pub fn emulator(&self) -> Option<&EmulatorHandle> {
        self._emulator.as_ref()
    }

    /// A Neutron server this test bed did not start (another lab's, e.g. the ML2/OVN one).
    pub fn server(name: &'static str, url: &str) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(Self {
            name,
            client: NeutronClient::new(&ClientOptions::noauth(url))?,
            url: url.to_string(),
            _emulator: None,
        })
    }
}

/// Every target available here: the emulator, and the real server when configured.
pub async fn neutron_targets() -> Result<Vec<NeutronTarget>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut out = vec![];
    let emu = Emulator::start(EmulatorOptions {
        active_delay: Duration::from_millis(50),
        agent_hosts: AgentHosts::Only(
            NODES
                .iter()
                .chain(&[HYBRID_PLUG_NODE])
                .map(|s| s.to_string())
                .collect(),
        ),
        hybrid_plug_hosts: [HYBRID_PLUG_NODE.to_string()].into(),
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
    // KURYR_TEST_REQUIRE_NEUTRON=1 (scripts/test-all.sh) turns a missing URL into an error instead of a skip.
    match neutron_contract::env::real_neutron_url().map_err(anyhow::Error::msg)? {
        Some(url) => out.push(NeutronTarget {
            name: "neutron-server",
            client: NeutronClient::new(&ClientOptions::noauth(&url))?,
            url,
            _emulator: None,
        }),
        None => skip(format!(
            "the real neutron-server target: {}",
            neutron_contract::env::skip_reason()
        )),
    }
    Ok(out)
}

/// The real neutron-server's URL for `test`, which needs it; `None` after [`skip`] when
/// `KURYR_TEST_NEUTRON_URL` is unset. Panics when `KURYR_TEST_REQUIRE_NEUTRON=1` (or
/// `KURYR_TEST_REQUIRE_ALL=1`) and it is unset.
#[track_caller]
pub fn real_neutron_url(test: &str) -> Option<String> {
    match neutron_contract::env::real_neutron_url() {
        Ok(Some(url)) => Some(url),
        Ok(None) => {
            skip(format!("{test}: {}", neutron_contract::env::skip_reason()));
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

pub struct Kube {
    pub handle: KubeHandle,
    pub client: Client,
}

/// The Kubernetes API emulator with the two nodes and every kuryr CRD.
pub async fn start_kube() -> Result<Kube> {
    let handle = KubeEmulator::start(KubeOptions {
        nodes: NODES.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
    .await?;
    let client = Client::try_from(kube::Config::new(handle.url().parse()?))?;
    apply_crds(&client).await?;
    Ok(Kube { handle, client })
}

/// Creates every kuryr CRD through `client` (an emulator started with other options).
pub async fn apply_crds(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in kuryr_crds::generate::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .context("apply CRD")?;
    }
    Ok(())
}

/// One network with one subnet.
#[derive(Clone, Debug)]
pub struct SubnetFixture {
    pub network: String,
    pub subnet: String,
    pub cidr: String,
}

/// Neutron resources of one test: its own project, networks and a security group. `network`,
/// `subnet` and `cidr` are the first (pod) subnet's.
pub struct NeutronFixture {
    pub project: String,
    pub network: String,
    pub subnet: String,
    pub cidr: String,
    pub sg: String,
    pub subnets: Vec<SubnetFixture>,
}

/// A fixture with one pod subnet.
pub async fn neutron_fixture(client: &NeutronClient, cidr: &str) -> Result<NeutronFixture> {
    neutron_fixture_subnets(client, &[cidr]).await
}

/// A fixture with one network + subnet per cidr (the first is the pod subnet).
pub async fn neutron_fixture_subnets(client: &NeutronClient, cidrs: &[&str]) -> Result<NeutronFixture> {
    let project = format!("kuryr-test-{}", uuid::Uuid::new_v4().simple());
    let mut subnets = Vec::new();
    for (i, cidr) in cidrs.iter().enumerate() {
        let net = client
            .create_network(&kuryr_neutron::NetworkCreate {
                name: Some(format!("pods-{i}")),
                project_id: Some(project.clone()),
                ..Default::default()
            })
            .await?;
        let subnet = client
            .create_subnet(&kuryr_neutron::SubnetCreate {
                network_id: net.id.clone(),
                ip_version: 4,
                cidr: Some((*cidr).into()),
                project_id: Some(project.clone()),
                name: Some(format!("pods-{i}")),
                ..Default::default()
            })
            .await?;
        subnets.push(SubnetFixture {
            network: net.id,
            subnet: subnet.id,
            cidr: (*cidr).to_string(),
        });
    }
    let sg = client
        .create_security_group(&kuryr_neutron::SecurityGroupCreate {
            name: "pods".into(),
            project_id: Some(project.clone()),
            ..Default::default()
        })
        .await?;
    let first = subnets.first().cloned().context("at least one cidr")?;
    Ok(NeutronFixture {
        project,
        network: first.network,
        subnet: first.subnet,
        cidr: first.cidr,
        sg: sg.id,
        subnets,
    })
}

/// Removes whatever a test left in its project (trunks, ports, networks, groups).
pub async fn cleanup_project(client: &NeutronClient, project: &str) {
    let f = || ListFilter::new().project_id(project);
    if let Ok(trunks) = client.list_trunks(&f()).await {
        for t in trunks {
            // Neutron deletes neither a trunk whose parent is bound nor a port that is a subport.
            if let Ok(subports) = client.get_subports(&t.id).await
                && !subports.is_empty()
            {
                let ids: Vec<&str> = subports.iter().map(|s| s.port_id.as_str()).collect();
                let _ = client.remove_subports(&t.id, &ids).await;
            }
            let unbind = kuryr_neutron::PortUpdate {
                device_id: Some(String::new()),
                device_owner: Some(String::new()),
                binding_host_id: Some(String::new()),
                ..Default::default()
            };
            let _ = client.update_port(&t.port_id, &unbind).await;
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
    // After the groups: a rule naming an address group keeps it in use.
    if let Ok(ags) = client.list_address_groups(&f()).await {
        for a in ags {
            let _ = client.delete_address_group(&a.id).await;
        }
    }
}

/// A `kuryr.conf` from text (panics on a bad test config).
///
/// Without a `cluster_id` it gets one of this test's own (from the test's thread name and the
/// process): tests share the real neutron-server, where each test's Kubernetes emulator is
/// another cluster, and a cluster_id belongs to the one cluster that claimed it first.
pub fn config(ini: &str) -> Arc<KuryrConfig> {
    let mut config = KuryrConfig::from_ini_str(ini).expect("test config").config;
    if !ini.contains("cluster_id") {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::thread::current().name().hash(&mut h);
        std::process::id().hash(&mut h);
        config.kubernetes.cluster_id = format!("test-{:016x}", h.finish());
    }
    Arc::new(config)
}

/// Claims the platform's `cluster_id` in every deployment, as a leading controller does first:
/// for tests that drive pools or sweeps without one (these act only where the id is claimed).
pub async fn claim_cluster_id(platform: &Arc<kuryr_controller::context::Platform>) -> Result<()> {
    let claim = kuryr_controller::cluster_claim::ClusterClaim::new(platform.clone());
    // A claim made by a check is confirmed by the next one.
    for _ in 0..3 {
        if claim.check_all().await? {
            return Ok(());
        }
    }
    bail!("the cluster_id claim was not confirmed in every deployment")
}

/// The controller's context over the Neutron at `url` with `config`, its cluster id claimed:
/// what a test driving pools without a controller builds them on. Also returns the deployments
/// (the VIF drivers take them).
pub async fn claimed_platform(
    kube: &Client,
    config: Arc<KuryrConfig>,
    url: &str,
) -> Result<(Arc<kuryr_controller::context::Platform>, Deployments)> {
    let metrics = Metrics::new();
    let deployments = Deployments::noauth(url, &metrics)?;
    let platform = Arc::new(kuryr_controller::context::Platform::new(
        kube.clone(),
        config,
        deployments.clone(),
        metrics,
    ));
    claim_cluster_id(&platform).await?;
    Ok((platform, deployments))
}

/// The fixture's network (with its pod subnet) as the VIF drivers see it.
pub async fn network_info(
    neutron: &NeutronClient,
    fx: &NeutronFixture,
) -> Result<Arc<kuryr_controller::drivers::NetworkInfo>> {
    Ok(Arc::new(kuryr_controller::drivers::NetworkInfo {
        id: fx.network.clone(),
        name: String::new(),
        mtu: None,
        subnets: vec![neutron.get_subnet(&fx.subnet).await?],
    }))
}

/// A pod port of the fixture in the default deployment: its project, network and group.
pub async fn fixture_port_spec(
    neutron: &NeutronClient,
    fx: &NeutronFixture,
) -> Result<kuryr_controller::drivers::PortSpec> {
    Ok(kuryr_controller::drivers::PortSpec::new(
        "default",
        fx.project.clone(),
        network_info(neutron, fx).await?,
        vec![fx.sg.clone()],
    ))
}

/// A controller running in this process; dropping it stops it.
pub struct Controller {
    pub stop: CancellationToken,
    pub metrics: Metrics,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Controller {
    /// Stops it abruptly, as a crash would: its task is aborted and every task it spawned (handlers
    /// in flight, queues, pools) ends at its next await; no lease is handed over and nothing is
    /// flushed. A request already sent may still land, as after a real crash.
    pub async fn kill(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            // Gone before the token ends the rest: cancelling first would let the leader
            // elector hand its lease over, which a crash never does.
            let _ = t.await;
        }
        self.stop.cancel();
    }

    /// Graceful stop: cancel and wait for the controller to finish.
    pub async fn shutdown(mut self) -> Result<()> {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            t.await?;
        }
        Ok(())
    }

    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if self.task.is_some() {
            self.stop.cancel();
        }
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
    start_controller_with(kube, deployments, metrics, cfg, identity)
}

/// [`start_controller`] with the OpenStack clients given (e.g. with an Octavia client added).
pub fn start_controller_with(
    kube: &Client,
    deployments: Deployments,
    metrics: Metrics,
    cfg: Arc<KuryrConfig>,
    identity: &str,
) -> Controller {
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
    Controller {
        stop,
        metrics,
        task: Some(task),
    }
}

pub async fn create_namespace(kube: &Client, name: &str, annotations: Value) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "annotations": annotations}
    }))?;
    Api::<Namespace>::all(kube.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

pub async fn create_pod(kube: &Client, ns: &str, name: &str, node: &str, annotations: Value) -> Result<Pod> {
    create_pod_with(kube, ns, name, node, annotations, json!({})).await
}

/// A pod whose container asks for `resources` (`{"requests": .., "limits": ..}`).
pub async fn create_pod_with(
    kube: &Client,
    ns: &str,
    name: &str,
    node: &str,
    annotations: Value,
    resources: Value,
) -> Result<Pod> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox", "resources": resources}]}
    }))?;
    Ok(Api::<Pod>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?)
}

/// Nested nodes: a VM network and, per node in [`NODES`], a parent port with a trunk, bound to
/// the node as Nova does (trunk created while the parent is unbound), and the node's InternalIP
/// set to the parent's address so the nested drivers find the trunk.
pub struct VmTrunks {
    pub network: String,
    pub subnet: String,
    /// Trunk ids in [`NODES`] order.
    pub trunks: Vec<String>,
}

pub async fn vm_trunks(
    neutron: &NeutronClient,
    kube: &Client,
    project: &str,
    cidr: &str,
) -> Result<VmTrunks> {
    use kuryr_neutron::{NetworkCreate, SubnetCreate};
    let net = neutron
        .create_network(&NetworkCreate {
            name: Some("vms".into()),
            project_id: Some(project.to_string()),
            ..Default::default()
        })
        .await?;
    let subnet = neutron
        .create_subnet(&SubnetCreate {
            network_id: net.id.clone(),
            ip_version: 4,
            cidr: Some(cidr.to_string()),
            project_id: Some(project.to_string()),
            ..Default::default()
        })
        .await?;
    let mut trunks = Vec::new();
    for node in NODES {
        trunks.push(vm_trunk(neutron, kube, project, &net.id, node).await?);
    }
    Ok(VmTrunks {
        network: net.id,
        subnet: subnet.id,
        trunks,
    })
}

/// A node VM: a parent port on `network` with a trunk, bound to `node` as Nova does (trunk
/// created while the parent is unbound), and the node's InternalIP set to the parent's address
/// so the nested drivers find the trunk. Returns the trunk id.
pub async fn vm_trunk(
    neutron: &NeutronClient,
    kube: &Client,
    project: &str,
    network: &str,
    node: &str,
) -> Result<String> {
    use kuryr_neutron::{PortCreate, PortUpdate, TrunkCreate};
    let parent = neutron
        .create_port(&PortCreate {
            project_id: Some(project.to_string()),
            name: Some(format!("vm-{node}")),
            ..PortCreate::new(network.to_string())
        })
        .await?;
    let trunk = neutron
        .create_trunk(&TrunkCreate {
            port_id: parent.id.clone(),
            project_id: Some(project.to_string()),
            ..Default::default()
        })
        .await?;
    neutron
        .update_port(
            &parent.id,
            &PortUpdate {
                binding_host_id: Some(node.to_string()),
                device_owner: Some("compute:nova".into()),
                device_id: Some(format!("vm-{node}-{}", &parent.id[..8.min(parent.id.len())])),
                ..Default::default()
            },
        )
        .await?;
    let ip = parent
        .fixed_ips
        .first()
        .map(|f| f.ip_address.clone())
        .context("trunk parent port without a fixed IP")?;
    set_node_ip(kube, node, &ip).await?;
    Ok(trunk.id)
}

pub async fn set_node_ip(kube: &Client, node: &str, ip: &str) -> Result<()> {
    let api: Api<Node> = Api::all(kube.clone());
    let patch = json!({"status": {"addresses": [{"type": "InternalIP", "address": ip}]}});
    api.patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
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

#[cfg(test)]
mod tests {
    use super::skip::{REQUIRE_ALL_VAR, refusal};

    #[test]
    fn a_skip_fails_only_under_require_all() {
        for unset in [None, Some(""), Some("0"), Some(" 0 ")] {
            assert_eq!(refusal("no lab", unset), None, "{unset:?}");
        }
        let e = refusal("no lab here", Some("1")).expect("required");
        assert!(e.contains(REQUIRE_ALL_VAR) && e.contains("no lab here"), "{e}");
        let e = refusal("no lab", Some("yes")).expect("a typo must not pass as unset");
        assert!(e.contains("must be 0 or 1") && e.contains("\"yes\""), "{e}");
    }
}
