//! Test bed: the Kubernetes API emulator, Neutron targets, the controller,
//! CNI daemons on network-namespace "nodes" and the real `kuryr-cni` binary.
//!
//! The Neutron/Kubernetes parts come from the shared `kuryr-testbed` crate.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kuryr_config::KuryrConfig;
use kuryr_config::OvsPlugMode;
use kuryr_daemon::DaemonConfig;
use kuryr_neutron::NeutronClient;
use serde_json::{Value, json};

#[allow(unused_imports)]
pub use kuryr_testbed::{
    Controller, Kube, NODES, NeutronFixture, NeutronTarget, cleanup_project, eventually, init_logs,
    neutron_targets, start_kube,
};
#[allow(unused_imports)]
pub use kuryr_testbed::{create_pod, create_pod_with, skip, skip_hardware};

pub mod netpol_model;
pub mod ovn_lab;
pub mod probe;

/// Bridge the controller's VIFs name (`binding:vif_details.bridge_name`).
pub const BRIDGE: &str = "br-int";
/// The daemon's TCP address inside every node namespace.
pub const UPSTREAM_DAEMON_ADDRESS: &str = "127.0.0.1:5036";

/// A project with one network + subnet per cidr (the first is the pod subnet).
pub async fn neutron_fixture(client: &NeutronClient, cidrs: &[&str]) -> Result<NeutronFixture> {
    kuryr_testbed::neutron_fixture_subnets(client, cidrs).await
}

/// Ports of the project that kuryr-rs created for pods.
pub async fn pod_ports(client: &NeutronClient, project: &str) -> Result<Vec<kuryr_neutron::Port>> {
    let f = kuryr_neutron::ListFilter::new()
        .project_id(project)
        .device_owner("compute:kuryr");
    Ok(client.list_ports(&f).await?)
}

/// Bare-metal controller config: `neutron-vif`, no pool, `extra` lines in `[kubernetes]`.
pub fn controller_config(fx: &NeutronFixture, extra: &str) -> Arc<KuryrConfig> {
    kuryr_testbed::config(&format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
         cluster_id = e2e-{}\n{extra}\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nresource_tags = k8s,e2e\n",
        &fx.project[fx.project.len() - 8..],
        fx.project,
        fx.subnet,
        fx.sg
    ))
}

pub fn start_controller(kube: &Client, neutron: &NeutronTarget, cfg: Arc<KuryrConfig>) -> Controller {
    kuryr_testbed::start_controller(kube, neutron, cfg, "e2e")
}

pub async fn create_namespace(kube: &Client, name: &str) -> Result<()> {
    kuryr_testbed::create_namespace(kube, name, json!({})).await
}

// ---------------------------------------------------------------- namespaces

static N: AtomicU32 = AtomicU32::new(0);

/// Short unique names (interface names have 15 bytes).
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn ip(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().expect("run ip (iproute2)")
}

pub fn ip_ok(args: &[&str]) -> Result<String> {
    let o = ip(args);
    ensure!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Whether this process may create network namespaces (root + iproute2); [`skip`]s, saying why,
/// when not (a failure under `KURYR_TEST_REQUIRE_ALL=1`), and the caller returns.
#[track_caller]
pub fn can_netns() -> bool {
    let n = unique("kprobe");
    let ok = Command::new("ip")
        .args(["netns", "add", &n])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        ip(&["netns", "del", &n]);
    } else {
        skip("cannot create network namespaces (needs root and iproute2)");
    }
    ok
}

/// A named network namespace, deleted on drop (also when a test fails) unless it was only
/// borrowed ([`Ns::existing`]).
pub struct Ns(pub String, bool);

impl Ns {
    pub fn new(prefix: &str) -> Result<Self> {
        let n = unique(prefix);
        ip_ok(&["netns", "add", &n])?;
        let ns = Ns(n, true);
        ip_ok(&["-n", &ns.0, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A namespace someone else owns (a lab's node): used, never deleted.
    pub fn existing(name: &str) -> Result<Self> {
        ip_ok(&["-n", name, "link", "show", "lo"]).with_context(|| format!("network namespace {name}"))?;
        Ok(Ns(name.to_string(), false))
    }

    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }

    /// `ip -j addr` inside the namespace: (ifname, mac, ["ip/len", ...]).
    pub fn addrs(&self) -> Result<Vec<(String, String, Vec<String>)>> {
        let out = ip_ok(&["-n", &self.0, "-j", "addr"])?;
        let v: Value = serde_json::from_str(&out).context("ip -j addr output")?;
        Ok(v.as_array()
            .into_iter()
            .flatten()
            .map(|l| {
                let addrs = l["addr_info"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|a| a["scope"] != "link" && a["scope"] != "host")
                    .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or(""), a["prefixlen"]))
                    .collect();
                (
                    l["ifname"].as_str().unwrap_or("").to_string(),
                    l["address"].as_str().unwrap_or("").to_string(),
                    addrs,
                )
            })
            .collect())
    }

    /// Link names in the namespace.
    pub fn links(&self) -> Result<Vec<String>> {
        Ok(self.addrs()?.into_iter().map(|(n, _, _)| n).collect())
    }

    /// Default routes (`ip -j route show default`) as their device names.
    pub fn default_route_devs(&self) -> Result<Vec<String>> {
        let out = ip_ok(&["-n", &self.0, "-j", "route", "show", "default"])?;
        let v: Value = serde_json::from_str(&out).context("ip -j route output")?;
        Ok(v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["dev"].as_str().map(str::to_string))
            .collect())
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        if self.1 {
            ip(&["netns", "del", &self.0]);
        }
    }
}

pub(crate) fn enter_netns(path: &str) -> std::result::Result<(), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns {path}: {e}"))
}

/// TCP connectivity from namespace `from` to `addr` served in namespace `to`
/// (the machine has no ping). Retries for ~10 s: ARP, bridge learning.
pub fn reachable(from: &str, to: &str, addr: IpAddr) -> std::result::Result<(), String> {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let (tx, rx) = std::sync::mpsc::channel();
    let to = to.to_string();
    let server = std::thread::spawn(move || -> std::result::Result<(), String> {
        enter_netns(&to)?;
        let l = TcpListener::bind(SocketAddr::new(addr, 0)).map_err(|e| format!("bind {addr}: {e}"))?;
        tx.send(l.local_addr().map_err(|e| e.to_string())?.port())
            .map_err(|e| e.to_string())?;
        let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
        s.write_all(b"k").map_err(|e| e.to_string())
    });
    let port = match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(p) => p,
        Err(_) => {
            return Err(server
                .join()
                .map_err(|_| "server panicked".to_string())?
                .err()
                .unwrap_or_else(|| "server did not start".into()));
        }
    };
    let from = from.to_string();
    let client = std::thread::spawn(move || -> std::result::Result<(), String> {
        enter_netns(&from)?;
        let mut last = String::new();
        for _ in 0..40 {
            match TcpStream::connect_timeout(&SocketAddr::new(addr, port), Duration::from_secs(1)) {
                Ok(mut s) => {
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).map_err(|e| e.to_string())?;
                    return Ok(());
                }
                Err(e) => {
                    last = e.to_string();
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        }
        // Unblock the server's accept so its thread ends.
        let _ = TcpStream::connect_timeout(&SocketAddr::new(addr, port), Duration::from_millis(100));
        Err(format!("connect to {addr}:{port}: {last}"))
    });
    let r = client.join().map_err(|_| "client panicked".to_string())?;
    if r.is_ok() {
        server.join().map_err(|_| "server panicked".to_string())??;
    }
    r
}

// ---------------------------------------------------------------- nodes

/// A daemon (`kuryr_daemon::kube::run`, as the CLI runs it) on a runtime
/// whose threads live in the node's namespace.
struct DaemonThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl DaemonThread {
    fn stop(&mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow::anyhow!("daemon thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for DaemonThread {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// One node: a namespace with bridge `br-int`, its daemon and the API proxy.
pub struct Node {
    pub name: &'static str,
    pub ns: Ns,
    pub socket: PathBuf,
    api: SocketAddr,
    proxy: tokio::task::JoinHandle<()>,
    daemon: Option<DaemonThread>,
    /// `[sriov] physical_device_mappings` of the next daemon start.
    pub sriov_mappings: Vec<String>,
    /// The node's Open vSwitch database (`unix:<path>`) when its VIFs are plugged into a real
    /// OVS `br-int` (the OVN lab's chassis); `None`: a Linux bridge stands in for it.
    pub ovs_db: Option<String>,
    /// Links the node had before any pod (a lab node's bridges and underlay).
    baseline: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Node {
    pub async fn start(name: &'static str, kube: &Kube) -> Result<Self> {
        let ns = Ns::new("kn")?;
        ip_ok(&["-n", &ns.0, "link", "add", BRIDGE, "type", "bridge"])?;
        ip_ok(&["-n", &ns.0, "link", "set", BRIDGE, "up"])?;
        Self::with_ns(name, kube, ns, None).await
    }

    /// A node on an existing namespace whose `br-int` is a real Open vSwitch bridge reached
    /// through `ovs_db` (the OVN lab's chassis); its daemon plugs `VIFOpenVSwitch` VIFs with the
    /// OVS binding, as on a production node.
    pub async fn start_ovs(name: &'static str, kube: &Kube, netns: &str, ovs_db: &str) -> Result<Self> {
        Self::with_ns(name, kube, Ns::existing(netns)?, Some(ovs_db.to_string())).await
    }

    async fn with_ns(name: &'static str, kube: &Kube, ns: Ns, ovs_db: Option<String>) -> Result<Self> {
        let (api, proxy) = kube_emulator::netns::relay_from_netns(&ns.path(), kube.handle.addr()).await?;
        let dir = tempfile::tempdir()?;
        let baseline = ns.links()?;
        let mut node = Node {
            name,
            socket: dir.path().join("kuryr-daemon.sock"),
            ns,
            api,
            proxy,
            daemon: None,
            sriov_mappings: Vec::new(),
            ovs_db,
            baseline,
            _dir: dir,
        };
        node.start_daemon().await?;
        Ok(node)
    }

    /// The daemon's settings: API on the unix socket only, and OVS VIFs on
    /// the Linux bridge (no Open vSwitch on this machine; see OvsPlugMode).
    fn daemon_config(&self) -> DaemonConfig {
        let mut cfg = DaemonConfig::new(self.name);
        // Upstream's default address: each node has its own loopback, and upstream's own
        // plugin (which only speaks TCP to `[cni_daemon] bind_address`) can reach it.
        cfg.bind_address = UPSTREAM_DAEMON_ADDRESS.parse().expect("address");
        cfg.health_address = "127.0.0.1:0".parse().expect("address");
        cfg.metrics_address = "127.0.0.1:0".parse().expect("address");
        cfg.unix_socket = Some(self.socket.clone());
        cfg.vif_annotation_timeout = Duration::from_secs(120);
        match &self.ovs_db {
            Some(db) => {
                // Lab nodes are shared namespaces: no fixed TCP port to collide on.
                cfg.bind_address = "127.0.0.1:0".parse().expect("address");
                cfg.binding.ovs_plug = OvsPlugMode::Ovs;
                cfg.binding.ovs_db = Some(db.clone());
                cfg.binding.ovs_datapath_type = "netdev".into();
                // What a production daemon keeps on the host's tmpfs: a restarted daemon
                // tears down exactly what its predecessor plugged.
                cfg.state_dir = Some(self._dir.path().join("state"));
            }
            None => cfg.binding.ovs_plug = OvsPlugMode::LinuxBridge,
        }
        cfg
    }

    pub async fn start_daemon(&mut self) -> Result<()> {
        ensure!(self.daemon.is_none(), "daemon of {} already runs", self.name);
        let mut cfg = self.daemon_config();
        cfg.binding.sriov.options.physical_device_mappings =
            kuryr_config::OptionValue::parse_option(&self.sriov_mappings.join(","))
                .map_err(anyhow::Error::msg)?;
        let (path, api) = (self.ns.path(), self.api);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || -> Result<()> {
            enter_netns(&path).map_err(anyhow::Error::msg)?;
            // Worker threads are spawned from here and inherit the node namespace.
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let client = Client::try_from(kube::Config::new(format!("http://{api}").parse()?))?;
                kuryr_daemon::kube::run(cfg, client, async {
                    let _ = stop_rx.await;
                })
                .await
            })
        });
        self.daemon = Some(DaemonThread {
            stop: Some(stop_tx),
            thread: Some(thread),
        });
        // Ready when the socket accepts (a stale file from an earlier daemon refuses).
        let socket = self.socket.clone();
        eventually("the daemon's unix socket", Duration::from_secs(30), || {
            let socket = socket.clone();
            async move { Ok(std::os::unix::net::UnixStream::connect(&socket).ok().map(|_| ())) }
        })
        .await
    }

    /// Graceful stop of the daemon (pods stay plugged).
    pub async fn stop_daemon(&mut self) -> Result<()> {
        let Some(mut d) = self.daemon.take() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || d.stop()).await?
    }

    /// veth ends left in the node (everything but lo, the bridge, the uplink and what the
    /// node had before any pod).
    pub fn leftover_links(&self) -> Result<Vec<String>> {
        Ok(self
            .ns
            .links()?
            .into_iter()
            .filter(|l| l != "lo" && l != BRIDGE && !l.starts_with("kup") && !self.baseline.contains(l))
            .collect())
    }

    /// `ovs-vsctl list-ports br-int` of an OVS node, without OVN's tunnel ports.
    pub fn ovs_ports(&self) -> Result<Vec<String>> {
        let db = self.ovs_db.as_deref().context("not an Open vSwitch node")?;
        let out = Command::new("ovs-vsctl")
            .args([&format!("--db={db}"), "--timeout=10", "list-ports", BRIDGE])
            .output()
            .context("run ovs-vsctl")?;
        ensure!(
            out.status.success(),
            "ovs-vsctl list-ports: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|p| !p.starts_with("ovn-"))
            .map(str::to_string)
            .collect())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.daemon.take();
        self.proxy.abort();
    }
}

/// Two nodes whose `br-int` bridges are joined by a veth (`kup*`): one L2
/// segment, as Neutron's network would give them.
pub async fn two_nodes(kube: &Kube) -> Result<[Node; 2]> {
    let a = Node::start(NODES[0], kube).await?;
    let b = Node::start(NODES[1], kube).await?;
    let (la, lb) = (unique("kup"), unique("kup"));
    ip_ok(&[
        "link", "add", &la, "netns", &a.ns.0, "type", "veth", "peer", "name", &lb, "netns", &b.ns.0,
    ])?;
    ip_ok(&["-n", &a.ns.0, "link", "set", &la, "master", BRIDGE, "up"])?;
    ip_ok(&["-n", &b.ns.0, "link", "set", &lb, "master", BRIDGE, "up"])?;
    Ok([a, b])
}

// ---------------------------------------------------------------- the plugin

/// `kuryr-cni`, built once per test run (`cargo build -p kuryr-cni` into this
/// test's target directory).
pub fn cni_binary() -> Result<PathBuf> {
    static BIN: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        // target/<profile>/deps/<test> -> target/<profile>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .ok_or("test binary has no target directory")?;
        let target_dir = profile_dir.parent().ok_or("no target directory")?;
        let bin = profile_dir.join("kuryr-cni");
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "kuryr-cni", "--bin", "kuryr-cni", "--target-dir"])
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let out = cmd
            .output()
            .map_err(|e| format!("{cargo} build -p kuryr-cni: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cargo build -p kuryr-cni failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        if !bin.is_file() {
            return Err(format!("{} missing after cargo build", bin.display()));
        }
        Ok(bin)
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// What the plugin printed and how it exited.
pub struct CniOutput {
    pub success: bool,
    pub stdout: Value,
    pub stderr: String,
}

/// One pod as the runtime sees it: its sandbox namespace and container id.
pub struct PodSandbox {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub container: String,
    pub netns: Ns,
}

impl PodSandbox {
    pub fn new(pod: &Pod) -> Result<Self> {
        Ok(Self {
            namespace: pod.metadata.namespace.clone().context("pod namespace")?,
            name: pod.metadata.name.clone().context("pod name")?,
            uid: pod.metadata.uid.clone().context("pod uid")?,
            container: format!("c{}", uuid::Uuid::new_v4().simple()),
            netns: Ns::new("kpod")?,
        })
    }
}

/// Run `kuryr-cni` exactly as a container runtime does: CNI_* environment,
/// network config on stdin (daemon address from the config). Blocking, so
/// run it off the async workers.
pub async fn cni(node: &Node, command: &str, pod: &PodSandbox) -> Result<CniOutput> {
    let conf = json!({"cniVersion": "1.0.0", "name": "kuryr", "type": "kuryr-cni",
        "kuryr_daemon": format!("unix://{}", node.socket.display()), "kuryr_daemon_timeout": 150});
    exec_plugin(Command::new(cni_binary()?), command, pod, &conf).await
}

/// Runs a CNI plugin as a container runtime does: a clean environment with the CNI_* variables
/// of `pod`, the network config on stdin. Blocking work, run off the async workers.
pub async fn exec_plugin(
    mut plugin: Command,
    command: &str,
    pod: &PodSandbox,
    conf: &Value,
) -> Result<CniOutput> {
    let args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
        pod.namespace, pod.name, pod.container, pod.uid
    );
    plugin
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &pod.container)
        .env("CNI_NETNS", pod.netns.path())
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env("CNI_ARGS", args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let conf = conf.to_string();
    tokio::task::spawn_blocking(move || -> Result<CniOutput> {
        use std::io::Write;
        let mut child = plugin
            .spawn()
            .with_context(|| format!("spawn {:?}", plugin.get_program()))?;
        child
            .stdin
            .take()
            .context("plugin stdin")?
            .write_all(conf.as_bytes())?;
        let out = child.wait_with_output()?;
        Ok(CniOutput {
            success: out.status.success(),
            stdout: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    })
    .await?
}

/// CNI ADD that must succeed; returns the CNI result.
pub async fn cni_add(node: &Node, pod: &PodSandbox) -> Result<Value> {
    let out = cni(node, "ADD", pod).await?;
    ensure!(
        out.success,
        "ADD of {}/{} on {} failed: {} {}",
        pod.namespace,
        pod.name,
        node.name,
        out.stdout,
        out.stderr
    );
    Ok(out.stdout)
}

pub async fn cni_del(node: &Node, pod: &PodSandbox) -> Result<()> {
    let out = cni(node, "DEL", pod).await?;
    ensure!(
        out.success,
        "DEL of {}/{} on {} failed: {} {}",
        pod.namespace,
        pod.name,
        node.name,
        out.stdout,
        out.stderr
    );
    Ok(())
}
