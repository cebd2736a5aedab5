//! The OVN lab (`scripts/ovn-lab/ovn-lab.sh`: ML2/OVN neutron-server, two userspace-OVS chassis
//! joined by geneve) as the dataplane tests use it: the lab from the environment, one test at a
//! time on its chassis, pods wired through the real `kuryr-cni` and checked against what OVN
//! shows, and their removal. Shared by the dataplane and the Services tests.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use std::time::Instant;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kuryr_crds::KuryrPort;
use kuryr_neutron::{NeutronClient, SecurityGroupRuleCreate};
use serde_json::json;

use super::probe::{Expect, Probe, Proto};
use super::*;

pub const WAIT: Duration = Duration::from_secs(120);
pub const NS: &str = "e2e";
/// Probes get this long to see the first answer (ARP, OVN flows for a new port).
pub const PROBE_DEADLINE: Duration = Duration::from_secs(30);
/// How long a blocked probe must stay unanswered.
pub const BLOCKED_FOR: Duration = Duration::from_secs(3);
pub const APP_PORT: u16 = 8080;

/// The daemons of every test share the lab's two chassis namespaces; a daemon that starts while
/// another test's pods are plugged there would adopt (and clean up) their veths. One test at a
/// time.
pub static LAB_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub struct Lab {
    pub target: NeutronTarget,
    pub dir: PathBuf,
}

impl Lab {
    /// The lab from the environment; `None` (after saying why) when the test must skip.
    pub fn from_env() -> Result<Option<Self>> {
        let url = std::env::var("KURYR_TEST_OVN_NEUTRON_URL")
            .ok()
            .filter(|u| !u.trim().is_empty());
        let required = std::env::var("KURYR_TEST_REQUIRE_OVN").is_ok_and(|v| v.trim() == "1");
        let Some(url) = url else {
            if required {
                bail!(
                    "KURYR_TEST_REQUIRE_OVN=1 but KURYR_TEST_OVN_NEUTRON_URL is unset: the OVN dataplane tests \
                     must run (scripts/ovn-lab/ovn-lab.sh start prints the variables)"
                );
            }
            super::skip(
                "KURYR_TEST_OVN_NEUTRON_URL is unset (scripts/ovn-lab/ovn-lab.sh start starts the ML2/OVN \
                 lab; scripts/test-all.sh sets it)",
            );
            return Ok(None);
        };
        let dir = std::env::var_os("KURYR_TEST_OVN_LAB")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.ovn-lab")));
        ensure!(
            dir.join("nodes").is_dir(),
            "KURYR_TEST_OVN_LAB={} has no nodes/ (not an OVN lab state directory)",
            dir.display()
        );
        Ok(Some(Self {
            target: NeutronTarget::server("ovn-neutron-server", &url)?,
            dir,
        }))
    }

    pub fn client(&self) -> &NeutronClient {
        &self.target.client
    }

    /// The lab's two chassis as kuryr nodes, each with its daemon on the OVS binding.
    pub async fn nodes(&self, kube: &Kube) -> Result<[Node; 2]> {
        let mut out = Vec::new();
        for name in NODES {
            let d = self.dir.join("nodes").join(name);
            let netns =
                std::fs::read_to_string(d.join("netns")).with_context(|| format!("{}/netns", d.display()))?;
            let db = format!("unix:{}", d.join("db.sock").display());
            out.push(Node::start_ovs(name, kube, netns.trim(), &db).await?);
        }
        out.try_into().map_err(|_| anyhow::anyhow!("two nodes"))
    }

    /// Removes what an earlier, failed run left on the chassis: OVS port records of pods whose
    /// namespaces are gone (their veths went with them). The lab lock makes this safe: no other
    /// test has pods plugged right now.
    pub fn reset_chassis(&self) -> Result<()> {
        for name in NODES {
            let db = format!(
                "--db=unix:{}",
                self.dir.join("nodes").join(name).join("db.sock").display()
            );
            let out = Command::new("ovs-vsctl")
                .args([&db, "--timeout=10", "list-ports", BRIDGE])
                .output()?;
            ensure!(out.status.success(), "ovs-vsctl list-ports on {name}");
            for port in String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|p| !p.starts_with("ovn-"))
            {
                eprintln!("{name}: removing OVS port {port} left by an earlier run");
                Command::new("ovs-vsctl")
                    .args([&db, "--timeout=10", "--if-exists", "del-port", BRIDGE, port])
                    .status()?;
            }
        }
        Ok(())
    }

    pub fn ovn(&self, tool: &str, db: &str, args: &[&str]) -> Result<String> {
        let sock = self.dir.join("run").join(format!("{db}.sock"));
        let o = Command::new(tool)
            .arg(format!("--db=unix:{}", sock.display()))
            .args(args)
            .output()
            .with_context(|| format!("run {tool}"))?;
        ensure!(
            o.status.success(),
            "{tool} {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    }

    /// The chassis OVN bound the port to (southbound Port_Binding), if any.
    pub fn bound_chassis(&self, port_id: &str) -> Result<Option<String>> {
        let uuid = self.ovn(
            "ovn-sbctl",
            "sb",
            &[
                "--bare",
                "--columns=chassis",
                "find",
                "Port_Binding",
                &format!("logical_port={port_id}"),
            ],
        )?;
        if uuid.is_empty() {
            return Ok(None);
        }
        let name = self.ovn(
            "ovn-sbctl",
            "sb",
            &["--bare", "--columns=name", "list", "Chassis", &uuid],
        )?;
        Ok(Some(name))
    }

    /// Whether the northbound database still has the port's logical switch port.
    pub fn has_lsp(&self, port_id: &str) -> Result<bool> {
        let out = self.ovn(
            "ovn-nbctl",
            "nb",
            &[
                "--bare",
                "--columns=name",
                "find",
                "Logical_Switch_Port",
                &format!("name={port_id}"),
            ],
        )?;
        Ok(!out.is_empty())
    }
}

/// Security group rule shorthand (IPv4 unless `ethertype` says otherwise).
pub async fn allow(
    client: &NeutronClient,
    fx: &NeutronFixture,
    proto: Option<&str>,
    port: Option<u32>,
    ethertype: &str,
) -> Result<String> {
    let r = client
        .create_security_group_rule(&SecurityGroupRuleCreate {
            security_group_id: fx.sg.clone(),
            direction: "ingress".into(),
            ethertype: Some(ethertype.into()),
            protocol: proto.map(str::to_string),
            port_range_min: port,
            port_range_max: port,
            project_id: Some(fx.project.clone()),
            ..Default::default()
        })
        .await?;
    Ok(r.id)
}

/// A pod wired on the real dataplane.
pub struct Wired {
    pub sandbox: PodSandbox,
    pub node: usize,
    pub port_id: String,
    /// Every fixed IP of the port (one per subnet: IPv4 and IPv6 with dual stack).
    pub ips: Vec<IpAddr>,
    /// Host-side veth name (the OVS port).
    pub tap: String,
    pub add_latency: Duration,
}

impl Wired {
    pub fn ip(&self) -> IpAddr {
        self.ips[0]
    }
    pub fn path(&self) -> String {
        self.sandbox.netns.path()
    }
    pub fn name(&self) -> &str {
        &self.sandbox.name
    }
}

/// Creates the pod, ADDs it through `kuryr-cni` on its node and checks what OVN and the pod's
/// namespace show: port ACTIVE and bound as `ovs` to the node's chassis, the pod end with the
/// port's MAC and IP, the network's (geneve) MTU and TX checksum offload off.
pub async fn wire(lab: &Lab, kube: &Kube, nodes: &[Node; 2], name: &str, node: usize) -> Result<Wired> {
    wire_in(lab, kube, nodes, NS, name, node).await
}

pub async fn wire_in(
    lab: &Lab,
    kube: &Kube,
    nodes: &[Node; 2],
    ns: &str,
    name: &str,
    node: usize,
) -> Result<Wired> {
    let pod = create_pod(&kube.client, ns, name, nodes[node].name, json!({})).await?;
    wire_created(lab, kube, nodes, &pod, node).await
}

/// [`wire`] for a pod the caller created (with its own labels and container ports) on
/// `nodes[node]`.
pub async fn wire_created(
    lab: &Lab,
    kube: &Kube,
    nodes: &[Node; 2],
    pod: &Pod,
    node: usize,
) -> Result<Wired> {
    let ns = pod.metadata.namespace.as_deref().context("pod namespace")?;
    let name = pod.metadata.name.as_deref().context("pod name")?;
    let sandbox = PodSandbox::new(pod)?;
    let t = Instant::now();
    cni_add(&nodes[node], &sandbox).await?;
    let add_latency = t.elapsed();
    let kp = Api::<KuryrPort>::namespaced(kube.client.clone(), ns)
        .get(name)
        .await?;
    let (_, vif) = kp
        .status
        .as_ref()
        .and_then(|s| s.default_vif())
        .with_context(|| format!("{name}: KuryrPort without a default VIF"))?;
    let port = lab.client().get_port(vif.id()).await?;
    ensure!(
        port.status == "ACTIVE",
        "{name}: port {} is {}",
        port.id,
        port.status
    );
    ensure!(
        port.binding_vif_type == "ovs" && port.binding_host_id == nodes[node].name,
        "{name}: port bound as {:?} to {:?}",
        port.binding_vif_type,
        port.binding_host_id
    );
    let chassis = lab.bound_chassis(&port.id)?;
    ensure!(
        chassis.as_deref() == Some(nodes[node].name),
        "{name}: OVN bound port {} to chassis {chassis:?}, not {}",
        port.id,
        nodes[node].name
    );
    let ips = port
        .fixed_ips
        .iter()
        .map(|f| f.ip_address.parse::<IpAddr>())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    ensure!(!ips.is_empty(), "{name}: port without a fixed IP");
    let addrs = sandbox.netns.addrs()?;
    let eth0 = addrs
        .iter()
        .find(|(n, _, _)| n == "eth0")
        .with_context(|| format!("{name}: no eth0 in {addrs:?}"))?;
    ensure!(
        eth0.1 == port.mac_address,
        "{name}: eth0 MAC {} vs port {}",
        eth0.1,
        port.mac_address
    );
    for ip in &ips {
        ensure!(
            eth0.2.iter().any(|a| a.starts_with(&format!("{ip}/"))),
            "{name}: eth0 lacks {ip}: {:?}",
            eth0.2
        );
    }
    let net = lab.client().get_network(&port.network_id).await?;
    let mtu = link_mtu(&sandbox.netns.0, "eth0")?;
    ensure!(
        Some(mtu) == net.mtu,
        "{name}: eth0 MTU {mtu}, the geneve network's is {:?}",
        net.mtu
    );
    ensure!(
        !tx_checksum_on(&sandbox.netns.0, "eth0")?,
        "{name}: TX checksum offload is still on for eth0 (userspace OVS would forward partial checksums)"
    );
    let tap = vif.vif_name().to_string();
    ensure!(
        nodes[node].ovs_ports()?.contains(&tap),
        "{name}: {tap} is not a port of br-int on {}",
        nodes[node].name
    );
    Ok(Wired {
        sandbox,
        node,
        port_id: port.id,
        ips,
        tap,
        add_latency,
    })
}

pub fn link_mtu(netns: &str, ifname: &str) -> Result<u32> {
    let out = ip_ok(&["-n", netns, "-j", "link", "show", ifname])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    v[0]["mtu"]
        .as_u64()
        .and_then(|m| u32::try_from(m).ok())
        .with_context(|| format!("no mtu in {out}"))
}

pub fn tx_checksum_on(netns: &str, ifname: &str) -> Result<bool> {
    let o = Command::new("ip")
        .args(["netns", "exec", netns, "ethtool", "-k", ifname])
        .output()
        .context("run ethtool")?;
    ensure!(
        o.status.success(),
        "ethtool -k: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.starts_with("tx-checksumming:"))
        .with_context(|| format!("no tx-checksumming in {out}"))?;
    Ok(line.contains(": on"))
}

/// CNI DEL and the pod's deletion, then: no veth in the pod, no OVS port, no Neutron port and no
/// OVN logical switch port.
pub async fn remove(lab: &Lab, kube: &Kube, nodes: &[Node; 2], w: &Wired) -> Result<()> {
    cni_del(&nodes[w.node], &w.sandbox).await?;
    let left = w.sandbox.netns.links()?;
    ensure!(
        left == ["lo"],
        "{}: interfaces left after DEL: {left:?}",
        w.name()
    );
    ensure!(
        !nodes[w.node].ovs_ports()?.contains(&w.tap),
        "{}: OVS port {} left on {}",
        w.name(),
        w.tap,
        nodes[w.node].name
    );
    Api::<Pod>::namespaced(kube.client.clone(), &w.sandbox.namespace)
        .delete(w.name(), &DeleteParams::default())
        .await?;
    eventually("the pod's Neutron port deleted", WAIT, || async {
        match lab.client().get_port(&w.port_id).await {
            Err(e) if e.is_not_found() => Ok(Some(())),
            Err(e) => Err(e.into()),
            Ok(_) => Ok(None),
        }
    })
    .await?;
    eventually("the pod's OVN logical switch port deleted", WAIT, || async {
        Ok((!lab.has_lsp(&w.port_id)?).then_some(()))
    })
    .await
}

pub async fn assert_all_gone(lab: &Lab, kube: &Kube, fx: &NeutronFixture, nodes: &[Node; 2]) -> Result<()> {
    let kps = Api::<KuryrPort>::all(kube.client.clone());
    eventually("KuryrPorts gone", WAIT, || async {
        Ok(kps
            .list(&Default::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    eventually("every pod port deleted in Neutron", WAIT, || async {
        Ok(pod_ports(lab.client(), &fx.project)
            .await?
            .is_empty()
            .then_some(()))
    })
    .await?;
    for n in nodes {
        let left = n.leftover_links()?;
        ensure!(left.is_empty(), "{}: links left on the node: {left:?}", n.name);
        let ports = n.ovs_ports()?;
        ensure!(
            ports.is_empty(),
            "{}: OVS ports left on br-int: {ports:?}",
            n.name
        );
    }
    Ok(())
}

/// ICMP, TCP and UDP from every pod to every address of every other one.
pub fn full_mesh(pods: &[&Wired], expect: Expect) -> Vec<Probe> {
    let mut probes = Vec::new();
    for a in pods {
        for b in pods {
            if a.name() == b.name() {
                continue;
            }
            for ip in &b.ips {
                for proto in [Proto::Icmp, Proto::Tcp, Proto::Udp] {
                    probes.push(Probe::new(
                        format!("{} -> {}", a.name(), b.name()),
                        &a.path(),
                        proto,
                        *ip,
                        APP_PORT,
                        expect,
                    ));
                }
            }
        }
    }
    probes
}

/// The lab held by one test: the chassis cleaned of what an earlier run left, and no other test
/// of this process on them until dropped.
pub struct Session {
    pub lab: Lab,
    _serial: tokio::sync::MutexGuard<'static, ()>,
    /// The same across processes: test binaries (and worktrees) share one lab.
    _lab_lock: nix::fcntl::Flock<std::fs::File>,
}

/// Waits for the lab's lock file (`<lab>/test.lock`), held until the session ends.
async fn lock_lab(lab: &Lab) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = lab.dir.join("test.lock");
    tokio::task::spawn_blocking(move || {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| anyhow::anyhow!("lock {}: {e}", path.display()))
    })
    .await?
}

/// The lab for a test, or `None` (after saying why) when the test must skip.
pub async fn enter() -> Result<Option<Session>> {
    init_logs();
    let Some(lab) = Lab::from_env()? else {
        return Ok(None);
    };
    ensure!(
        can_netns(),
        "the OVN lab runs, but this process cannot create network namespaces"
    );
    cni_binary()?;
    let serial = LAB_LOCK.lock().await;
    let lab_lock = lock_lab(&lab).await?;
    lab.reset_chassis()?;
    Ok(Some(Session {
        lab,
        _serial: serial,
        _lab_lock: lab_lock,
    }))
}

/// Runs `body` against the lab with a fresh project, one test at a time, cleaning the project
/// up whatever happens.
#[allow(unused_macros)]
macro_rules! on_lab {
    ($cidrs:expr, |$lab:ident, $fx:ident| $body:expr) => {{
        let Some(session) = $crate::support::ovn_lab::enter().await? else {
            return Ok(());
        };
        let $lab = &session.lab;
        let $fx = $crate::support::neutron_fixture($lab.client(), $cidrs).await?;
        let result: Result<()> = async { $body }.await;
        $crate::support::cleanup_project($lab.client(), &$fx.project).await;
        result
    }};
}
#[allow(unused_imports)]
pub(crate) use on_lab;
