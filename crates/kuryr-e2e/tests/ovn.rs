//! The real OpenStack dataplane: the controller (neutron-vif) and one CNI daemon per chassis of
//! the OVN lab (`scripts/ovn-lab/ovn-lab.sh`: ML2/OVN neutron-server, two userspace-OVS chassis
//! joined by geneve). Pods are wired through the real `kuryr-cni` binary with the daemon's Open
//! vSwitch binding; their ports go ACTIVE because ovn-controller claimed them, and what is probed
//! between them (ICMP, TCP, UDP) crosses OVN's flows, security-group ACLs and the geneve tunnel.
//!
//! Needs `KURYR_TEST_OVN_NEUTRON_URL` (the lab's API) and `KURYR_TEST_OVN_LAB` (its state
//! directory); without them every test prints why it skips, unless `KURYR_TEST_REQUIRE_OVN=1`
//! (scripts/test-all.sh), which makes a missing lab an error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kuryr_crds::KuryrPort;
use kuryr_neutron::{NeutronClient, SecurityGroupRuleCreate};
use serde_json::json;
use support::probe::{Expect, Probe, Proto, Server, check_all};
use support::*;

const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "e2e";
/// Probes get this long to see the first answer (ARP, OVN flows for a new port).
const PROBE_DEADLINE: Duration = Duration::from_secs(30);
/// How long a blocked probe must stay unanswered.
const BLOCKED_FOR: Duration = Duration::from_secs(3);
const APP_PORT: u16 = 8080;

/// The daemons of every test share the lab's two chassis namespaces; a daemon that starts while
/// another test's pods are plugged there would adopt (and clean up) their veths. One test at a
/// time.
static LAB_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Lab {
    target: NeutronTarget,
    dir: PathBuf,
}

impl Lab {
    /// The lab from the environment; `None` (after saying why) when the test must skip.
    fn from_env() -> Result<Option<Self>> {
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
            eprintln!(
                "skipping: KURYR_TEST_OVN_NEUTRON_URL is unset (scripts/ovn-lab/ovn-lab.sh start starts the ML2/OVN \
                 lab; scripts/test-all.sh sets it)"
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

    fn client(&self) -> &NeutronClient {
        &self.target.client
    }

    /// The lab's two chassis as kuryr nodes, each with its daemon on the OVS binding.
    async fn nodes(&self, kube: &Kube) -> Result<[Node; 2]> {
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
    fn reset_chassis(&self) -> Result<()> {
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

    fn ovn(&self, tool: &str, db: &str, args: &[&str]) -> Result<String> {
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
    fn bound_chassis(&self, port_id: &str) -> Result<Option<String>> {
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
    fn has_lsp(&self, port_id: &str) -> Result<bool> {
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
async fn allow(
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
struct Wired {
    sandbox: PodSandbox,
    node: usize,
    port_id: String,
    /// Every fixed IP of the port (one per subnet: IPv4 and IPv6 with dual stack).
    ips: Vec<IpAddr>,
    /// Host-side veth name (the OVS port).
    tap: String,
    add_latency: Duration,
}

impl Wired {
    fn ip(&self) -> IpAddr {
        self.ips[0]
    }
    fn path(&self) -> String {
        self.sandbox.netns.path()
    }
    fn name(&self) -> &str {
        &self.sandbox.name
    }
}

/// Creates the pod, ADDs it through `kuryr-cni` on its node and checks what OVN and the pod's
/// namespace show: port ACTIVE and bound as `ovs` to the node's chassis, the pod end with the
/// port's MAC and IP, the network's (geneve) MTU and TX checksum offload off.
async fn wire(lab: &Lab, kube: &Kube, nodes: &[Node; 2], name: &str, node: usize) -> Result<Wired> {
    wire_in(lab, kube, nodes, NS, name, node).await
}

async fn wire_in(
    lab: &Lab,
    kube: &Kube,
    nodes: &[Node; 2],
    ns: &str,
    name: &str,
    node: usize,
) -> Result<Wired> {
    let pod = create_pod(&kube.client, ns, name, nodes[node].name, json!({})).await?;
    let sandbox = PodSandbox::new(&pod)?;
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

fn link_mtu(netns: &str, ifname: &str) -> Result<u32> {
    let out = ip_ok(&["-n", netns, "-j", "link", "show", ifname])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    v[0]["mtu"]
        .as_u64()
        .and_then(|m| u32::try_from(m).ok())
        .with_context(|| format!("no mtu in {out}"))
}

fn tx_checksum_on(netns: &str, ifname: &str) -> Result<bool> {
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
async fn remove(lab: &Lab, kube: &Kube, nodes: &[Node; 2], w: &Wired) -> Result<()> {
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

async fn assert_all_gone(lab: &Lab, kube: &Kube, fx: &NeutronFixture, nodes: &[Node; 2]) -> Result<()> {
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
fn full_mesh(pods: &[&Wired], expect: Expect) -> Vec<Probe> {
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

/// Runs `body` against the lab with a fresh project, one test at a time, cleaning the project
/// up whatever happens.
macro_rules! on_lab {
    ($cidrs:expr, |$lab:ident, $fx:ident| $body:expr) => {{
        init_logs();
        let Some($lab) = Lab::from_env()? else {
            return Ok(());
        };
        ensure!(
            can_netns(),
            "the OVN lab runs, but this process cannot create network namespaces"
        );
        cni_binary()?;
        let _serial = LAB_LOCK.lock().await;
        $lab.reset_chassis()?;
        let $fx = neutron_fixture($lab.client(), $cidrs).await?;
        let result: Result<()> = async { $body }.await;
        cleanup_project($lab.client(), &$fx.project).await;
        result
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_pods_on_two_chassis_reach_each_other_over_geneve_and_a_deleted_pod_is_gone() -> Result<()> {
    on_lab!(&["10.81.0.0/24"], |lab, fx| {
        allow(lab.client(), &fx, None, None, "IPv4").await?;
        let kube = start_kube().await?;
        let _ctrl = start_controller(&kube.client, &lab.target, controller_config(&fx, ""));
        create_namespace(&kube.client, NS).await?;
        let nodes = lab.nodes(&kube).await?;
        let mut pods = Vec::new();
        for i in 0..4 {
            pods.push(wire(&lab, &kube, &nodes, &format!("pod-{i}"), i % 2).await?);
        }
        let servers = pods
            .iter()
            .map(|p| Server::start(&p.path(), APP_PORT))
            .collect::<Result<Vec<_>>>()?;
        let all: Vec<&Wired> = pods.iter().collect();
        let t = Instant::now();
        check_all(&full_mesh(&all, Expect::Open), PROBE_DEADLINE)?;
        eprintln!(
            "4 pods on 2 chassis: CNI ADD {:?}; every pair answered ICMP, TCP and UDP within {:?}",
            pods.iter().map(|p| p.add_latency).collect::<Vec<_>>(),
            t.elapsed()
        );

        // A deleted pod loses its port (Neutron, OVN, OVS) and with it its connectivity.
        let gone = pods.remove(3);
        let gone_ip = gone.ip();
        remove(&lab, &kube, &nodes, &gone).await?;
        let rest: Vec<&Wired> = pods.iter().collect();
        check_all(&full_mesh(&rest, Expect::Open), PROBE_DEADLINE)?;
        check_all(
            &[Probe::new(
                "pod-0 -> deleted pod-3",
                &pods[0].path(),
                Proto::Icmp,
                gone_ip,
                0,
                Expect::Closed,
            )],
            BLOCKED_FOR,
        )?;
        drop(servers);
        for p in &pods {
            remove(&lab, &kube, &nodes, p).await?;
        }
        assert_all_gone(&lab, &kube, &fx, &nodes).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn security_group_without_an_ingress_rule_for_tcp_80_blocks_it_and_allows_the_allowed_port()
-> Result<()> {
    on_lab!(&["10.82.0.0/24"], |lab, fx| {
        // The pods' group: ICMP and TCP 8080 in, nothing for 80.
        allow(lab.client(), &fx, Some("icmp"), None, "IPv4").await?;
        allow(lab.client(), &fx, Some("tcp"), Some(u32::from(APP_PORT)), "IPv4").await?;
        let kube = start_kube().await?;
        let _ctrl = start_controller(&kube.client, &lab.target, controller_config(&fx, ""));
        create_namespace(&kube.client, NS).await?;
        let nodes = lab.nodes(&kube).await?;
        let client = wire(&lab, &kube, &nodes, "client", 0).await?;
        let web = wire(&lab, &kube, &nodes, "web", 1).await?;
        let _s80 = Server::start(&web.path(), 80)?;
        let _s8080 = Server::start(&web.path(), APP_PORT)?;
        let probe = |port: u16, expect: Expect| {
            Probe::new(
                format!("client -> web:{port}"),
                &client.path(),
                Proto::Tcp,
                web.ip(),
                port,
                expect,
            )
        };
        check_all(
            &[
                Probe::new(
                    "client -> web (icmp)",
                    &client.path(),
                    Proto::Icmp,
                    web.ip(),
                    0,
                    Expect::Open,
                ),
                probe(APP_PORT, Expect::Open),
            ],
            PROBE_DEADLINE,
        )?;
        // Only now that the allowed port answers does a silent 80 mean the ACL dropped it.
        check_all(&[probe(80, Expect::Closed)], BLOCKED_FOR)?;
        // The rule, not the server, made the difference: allowing 80 opens it.
        allow(lab.client(), &fx, Some("tcp"), Some(80), "IPv4").await?;
        check_all(&[probe(80, Expect::Open)], PROBE_DEADLINE)?;
        remove(&lab, &kube, &nodes, &client).await?;
        remove(&lab, &kube, &nodes, &web).await?;
        assert_all_gone(&lab, &kube, &fx, &nodes).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_restart_keeps_pods_connected_and_del_after_it_removes_ovs_and_neutron_ports() -> Result<()> {
    on_lab!(&["10.83.0.0/24"], |lab, fx| {
        allow(lab.client(), &fx, None, None, "IPv4").await?;
        let kube = start_kube().await?;
        let _ctrl = start_controller(&kube.client, &lab.target, controller_config(&fx, ""));
        create_namespace(&kube.client, NS).await?;
        let mut nodes = lab.nodes(&kube).await?;
        let a = wire(&lab, &kube, &nodes, "old-a", 0).await?;
        let b = wire(&lab, &kube, &nodes, "old-b", 1).await?;
        let c = wire(&lab, &kube, &nodes, "old-c", 0).await?;
        let _servers = [&a, &b, &c]
            .iter()
            .map(|p| Server::start(&p.path(), APP_PORT))
            .collect::<Result<Vec<_>>>()?;
        check_all(&full_mesh(&[&a, &b, &c], Expect::Open), PROBE_DEADLINE)?;

        // The dataplane does not depend on the daemon ...
        nodes[0].stop_daemon().await?;
        check_all(&full_mesh(&[&a, &b, &c], Expect::Open), PROBE_DEADLINE)
            .context("daemon of k8s-node-1 down")?;
        // ... nor does a restarted daemon disturb what its predecessor plugged.
        nodes[0].start_daemon().await?;
        check_all(&full_mesh(&[&a, &b, &c], Expect::Open), PROBE_DEADLINE).context("after the restart")?;
        ensure!(
            nodes[0].ovs_ports()?.len() == 2,
            "k8s-node-1 has OVS ports {:?} after the restart",
            nodes[0].ovs_ports()?
        );

        // A new pod on the restarted daemon joins the others.
        let d = wire(&lab, &kube, &nodes, "new-d", 0).await?;
        let _sd = Server::start(&d.path(), APP_PORT)?;
        check_all(&full_mesh(&[&a, &b, &c, &d], Expect::Open), PROBE_DEADLINE)?;

        // Deleting a pod the previous daemon plugged: its OVS and Neutron ports go, the rest stays.
        remove(&lab, &kube, &nodes, &c).await?;
        check_all(&full_mesh(&[&a, &b, &d], Expect::Open), PROBE_DEADLINE)?;
        check_all(
            &[Probe::new(
                "old-b -> deleted old-c",
                &b.path(),
                Proto::Icmp,
                c.ip(),
                0,
                Expect::Closed,
            )],
            BLOCKED_FOR,
        )?;
        for p in [&a, &b, &d] {
            remove(&lab, &kube, &nodes, p).await?;
        }
        assert_all_gone(&lab, &kube, &fx, &nodes).await
    })
}

/// An IPv6 subnet (static addresses, as kuryr plugs them) on `network` of the fixture's project.
async fn v6_subnet(client: &NeutronClient, fx: &NeutronFixture, network: &str, cidr: &str) -> Result<String> {
    let s = client
        .create_subnet(&kuryr_neutron::SubnetCreate {
            network_id: network.to_string(),
            ip_version: 6,
            cidr: Some(cidr.into()),
            project_id: Some(fx.project.clone()),
            name: Some("pods-v6".into()),
            ..Default::default()
        })
        .await?;
    Ok(s.id)
}

/// The controller's config with `[neutron_defaults] pod_subnets` (every pod subnet, one network).
fn config_with_subnets(fx: &NeutronFixture, subnets: &[&str]) -> std::sync::Arc<kuryr_config::KuryrConfig> {
    kuryr_testbed::config(&format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
         cluster_id = e2e-{}\n\
         [neutron_defaults]\nproject = {}\npod_subnets = {}\npod_security_groups = {}\nresource_tags = k8s,e2e\n",
        &fx.project[fx.project.len() - 8..],
        fx.project,
        subnets.join(","),
        fx.sg
    ))
}

/// Every ICMP/TCP/UDP probe between the pods, over every address family they have.
async fn pods_talk_over_each_family(lab: &Lab, kube: &Kube, nodes: &[Node; 2], want: &[bool]) -> Result<()> {
    let a = wire(lab, kube, nodes, "pod-a", 0).await?;
    let b = wire(lab, kube, nodes, "pod-b", 1).await?;
    for p in [&a, &b] {
        let families: Vec<bool> = p.ips.iter().map(IpAddr::is_ipv6).collect();
        ensure!(
            families == want,
            "{}: addresses {:?}, wanted IPv6 flags {want:?}",
            p.name(),
            p.ips
        );
    }
    let _servers = [&a, &b]
        .iter()
        .map(|p| Server::start(&p.path(), APP_PORT))
        .collect::<Result<Vec<_>>>()?;
    check_all(&full_mesh(&[&a, &b], Expect::Open), PROBE_DEADLINE)?;
    remove(lab, kube, nodes, &a).await?;
    remove(lab, kube, nodes, &b).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dual_stack_pods_on_two_chassis_talk_over_ipv4_and_ipv6() -> Result<()> {
    on_lab!(&["10.84.0.0/24"], |lab, fx| {
        allow(lab.client(), &fx, None, None, "IPv4").await?;
        allow(lab.client(), &fx, None, None, "IPv6").await?;
        let v6 = v6_subnet(lab.client(), &fx, &fx.network, "fd00:84::/64").await?;
        let kube = start_kube().await?;
        let _ctrl = start_controller(
            &kube.client,
            &lab.target,
            config_with_subnets(&fx, &[&fx.subnet, &v6]),
        );
        create_namespace(&kube.client, NS).await?;
        let nodes = lab.nodes(&kube).await?;
        pods_talk_over_each_family(&lab, &kube, &nodes, &[false, true]).await?;
        assert_all_gone(&lab, &kube, &fx, &nodes).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ipv6_only_pods_on_two_chassis_talk() -> Result<()> {
    on_lab!(&["10.85.0.0/24"], |lab, fx| {
        allow(lab.client(), &fx, None, None, "IPv6").await?;
        let net = lab
            .client()
            .create_network(&kuryr_neutron::NetworkCreate {
                name: Some("pods-v6-only".into()),
                project_id: Some(fx.project.clone()),
                ..Default::default()
            })
            .await?;
        let v6 = v6_subnet(lab.client(), &fx, &net.id, "fd00:85::/64").await?;
        let kube = start_kube().await?;
        let _ctrl = start_controller(&kube.client, &lab.target, config_with_subnets(&fx, &[&v6]));
        create_namespace(&kube.client, NS).await?;
        let nodes = lab.nodes(&kube).await?;
        pods_talk_over_each_family(&lab, &kube, &nodes, &[true]).await?;
        assert_all_gone(&lab, &kube, &fx, &nodes).await
    })
}

/// Pods in two namespaces, each namespace with its own network and subnet (the `namespace`
/// subnets driver) joined by the Neutron router, on the two chassis: traffic between them is
/// routed by OVN's logical router. Run with the `noop` and the `neutron` (port pool) VIF pool
/// drivers: pooled ports, bound before any pod exists, must work the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_subnets_route_between_namespaces_with_and_without_port_pools() -> Result<()> {
    use kuryr_crds::KuryrNetwork;
    use kuryr_neutron::{RouterCreate, SubnetPoolCreate};

    on_lab!(&["10.86.0.0/24"], |lab, fx| {
        allow(lab.client(), &fx, None, None, "IPv4").await?;
        let client = lab.client();
        let subnetpool = client
            .create_subnetpool(&SubnetPoolCreate {
                name: "ns-pool".into(),
                prefixes: vec!["10.87.0.0/16".into()],
                default_prefixlen: Some(26),
                project_id: Some(fx.project.clone()),
                ..Default::default()
            })
            .await?;
        let router = client
            .create_router(&RouterCreate {
                name: Some("pods".into()),
                project_id: Some(fx.project.clone()),
                ..Default::default()
            })
            .await?;
        let result: Result<()> = async {
            for pool in ["noop", "neutron"] {
                let kube = start_kube().await?;
                let cfg = kuryr_testbed::config(&format!(
                    "[kubernetes]\nenabled_handlers = vif,kuryrport,namespace,kuryrnetwork\n\
                     pod_subnets_driver = namespace\npod_vif_driver = neutron-vif\nvif_pool_driver = {pool}\n\
                     cluster_id = e2e-{}\n\
                     [namespace_subnet]\npod_router = {}\npod_subnet_pool = {}\n\
                     [vif_pool]\nports_pool_batch = 2\nports_pool_min = 1\nports_pool_update_frequency = 2\n\
                     [neutron_defaults]\nproject = {}\npod_security_groups = {}\nresource_tags = k8s,e2e\n",
                    &fx.project[fx.project.len() - 8..],
                    router.id,
                    subnetpool.id,
                    fx.project,
                    fx.sg
                ));
                let ctrl = start_controller(&kube.client, &lab.target, cfg);
                let nodes = lab.nodes(&kube).await?;
                let (ns_a, ns_b) = (format!("team-a-{pool}"), format!("team-b-{pool}"));
                create_namespace(&kube.client, &ns_a).await?;
                create_namespace(&kube.client, &ns_b).await?;
                let a = wire_in(&lab, &kube, &nodes, &ns_a, "a", 0).await.context(pool)?;
                let b = wire_in(&lab, &kube, &nodes, &ns_b, "b", 1).await.context(pool)?;
                let a2 = wire_in(&lab, &kube, &nodes, &ns_a, "a2", 1).await.context(pool)?;
                // Each namespace on its own network (a and a2 share theirs).
                let net = |w: &Wired| {
                    let id = w.port_id.clone();
                    async move { Ok::<_, anyhow::Error>(client.get_port(&id).await?.network_id) }
                };
                let (net_a, net_b, net_a2) = (net(&a).await?, net(&b).await?, net(&a2).await?);
                ensure!(
                    net_a != net_b && net_a == net_a2,
                    "{pool}: networks a={net_a} b={net_b} a2={net_a2}"
                );
                let _servers = [&a, &b, &a2]
                    .iter()
                    .map(|p| Server::start(&p.path(), APP_PORT))
                    .collect::<Result<Vec<_>>>()?;
                check_all(&full_mesh(&[&a, &b, &a2], Expect::Open), PROBE_DEADLINE)
                    .with_context(|| format!("routed between namespaces ({pool} pool)"))?;
                for w in [&a, &b, &a2] {
                    cni_del(&nodes[w.node], &w.sandbox).await?;
                    Api::<Pod>::namespaced(kube.client.clone(), &w.sandbox.namespace)
                        .delete(w.name(), &DeleteParams::default())
                        .await?;
                }
                // Deleting the namespaces releases their networks (and router interfaces).
                for (ns, net) in [(&ns_a, &net_a), (&ns_b, &net_b)] {
                    Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.client.clone())
                        .delete(ns, &DeleteParams::default())
                        .await?;
                    let kns: Api<KuryrNetwork> = Api::namespaced(kube.client.clone(), ns);
                    eventually("the namespace's network deleted", WAIT, || async {
                        let gone = match client.get_network(net).await {
                            Err(e) if e.is_not_found() => true,
                            Err(e) => return Err(e.into()),
                            Ok(_) => false,
                        };
                        Ok((gone && kns.get_opt(ns).await?.is_none()).then_some(()))
                    })
                    .await
                    .with_context(|| format!("{pool}: namespace {ns}"))?;
                }
                ctrl.shutdown().await?;
                for n in &nodes {
                    let left = n.ovs_ports()?;
                    ensure!(left.is_empty(), "{pool}: {}: OVS ports left: {left:?}", n.name);
                }
            }
            Ok(())
        }
        .await;
        // After a failure the namespaces' networks may still hang on the router: detach them so
        // cleanup_project can delete them.
        let subnets = client
            .list_subnets(&kuryr_neutron::ListFilter::new().project_id(&fx.project))
            .await
            .unwrap_or_default();
        for sn in subnets {
            let spec = kuryr_neutron::RouterInterfaceSpec::Subnet { subnet_id: sn.id };
            let _ = client.remove_router_interface(&router.id, &spec).await;
        }
        for p in pod_ports(client, &fx.project).await.unwrap_or_default() {
            let _ = client.delete_port(&p.id).await;
        }
        cleanup_project(client, &fx.project).await;
        let _ = client.delete_router(&router.id).await;
        let _ = client.delete_subnetpool(&subnetpool.id).await;
        result
    })
}
