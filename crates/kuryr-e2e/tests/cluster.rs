//! Pod wiring end-to-end: the controller (neutron-vif, noop pool) and two
//! CNI daemons, one per network-namespace node, wire pods through the real
//! `kuryr-cni` binary, against the Neutron emulator and (when
//! `KURYR_TEST_NEUTRON_URL` is set) the real neutron-server.
//!
//! Neutron binds the ports with its OVS agent (`VIFOpenVSwitch` on `br-int`);
//! this machine has no Open vSwitch, so the daemons run with
//! `OvsPlugMode::LinuxBridge`: an operator's explicit choice to put OVS VIFs on
//! a Linux bridge of the same name. The nodes' `br-int` bridges are joined by
//! a veth, which stands in for the tenant network between hypervisors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kuryr_crds::KuryrPort;
use serde_json::{Value, json};
use support::*;

const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "e2e";

/// A wired pod: its sandbox and the Neutron port(s) behind each interface.
struct Wired {
    sandbox: PodSandbox,
    node: usize,
    /// (ifname, port MAC, port IP) per interface, eth0 first.
    ports: Vec<(String, String, IpAddr)>,
    result: Value,
}

impl Wired {
    fn ip(&self) -> IpAddr {
        self.ports[0].2
    }
}

async fn kuryrport(kube: &Kube, name: &str) -> Result<KuryrPort> {
    Ok(Api::<KuryrPort>::namespaced(kube.client.clone(), NS)
        .get(name)
        .await?)
}

/// Create the pod, ADD it through the plugin on its node, and check the
/// result and the namespace against Neutron's ports.
async fn wire_pod(
    kube: &Kube,
    target: &NeutronTarget,
    nodes: &[Node; 2],
    name: &str,
    node: usize,
    annotations: Value,
) -> Result<Wired> {
    let pod = create_pod(&kube.client, NS, name, nodes[node].name, annotations).await?;
    let sandbox = PodSandbox::new(&pod)?;
    let result = cni_add(&nodes[node], &sandbox).await?;
    let kp = kuryrport(kube, name).await?;
    let status = kp.status.as_ref().context("KuryrPort status")?;
    let mut ports = Vec::new();
    let vifs = status
        .default_vif()
        .map(|(_, v)| ("eth0".to_string(), v))
        .into_iter()
        .chain(status.additional_vifs().map(|(n, v)| (n.to_string(), v)));
    for (ifname, vif) in vifs {
        let port = target.client.get_port(vif.id()).await?;
        ensure!(
            port.status == "ACTIVE",
            "port {} of {name} is {}",
            port.id,
            port.status
        );
        ensure!(
            port.binding_host_id == nodes[node].name,
            "port {} bound to {}",
            port.id,
            port.binding_host_id
        );
        let ip: IpAddr = port
            .fixed_ips
            .first()
            .context("port without fixed IP")?
            .ip_address
            .parse()?;
        ports.push((ifname, port.mac_address.clone(), ip));
    }
    // The CNI result lists every interface with its port's MAC and IP.
    let ifaces = result["interfaces"].as_array().context("result interfaces")?;
    let ips = result["ips"].as_array().context("result ips")?;
    ensure!(ifaces.len() == ports.len(), "{name}: {result}");
    for (i, (ifname, mac, ip)) in ports.iter().enumerate() {
        ensure!(
            ifaces[i]["name"] == ifname.as_str(),
            "{name}: interface {i}: {result}"
        );
        ensure!(ifaces[i]["mac"] == mac.as_str(), "{name}: {ifname} MAC: {result}");
        ensure!(
            ifaces[i]["sandbox"] == sandbox.netns.path().as_str(),
            "{name}: sandbox: {result}"
        );
        ensure!(
            ips.iter().any(|x| x["interface"] == i
                && x["address"]
                    .as_str()
                    .is_some_and(|a| a.starts_with(&format!("{ip}/")))),
            "{name}: {ifname} IP {ip} missing from {result}"
        );
    }
    // ... and so does the pod's namespace (`ip -j addr`).
    let addrs = sandbox.netns.addrs()?;
    for (ifname, mac, ip) in &ports {
        let link = addrs
            .iter()
            .find(|(n, _, _)| n == ifname)
            .with_context(|| format!("{name}: no {ifname} in the pod namespace: {addrs:?}"))?;
        ensure!(&link.1 == mac, "{name}: {ifname} has MAC {} not {mac}", link.1);
        ensure!(
            link.2.iter().any(|a| a.starts_with(&format!("{ip}/"))),
            "{name}: {ifname} lacks {ip}: {:?}",
            link.2
        );
    }
    Ok(Wired {
        sandbox,
        node,
        ports,
        result,
    })
}

/// CNI DEL, then delete the pod as the kubelet would after the sandbox is gone.
async fn unwire_pod(kube: &Kube, nodes: &[Node; 2], w: &Wired) -> Result<()> {
    cni_del(&nodes[w.node], &w.sandbox).await?;
    let left = w.sandbox.netns.links()?;
    ensure!(
        left == ["lo"],
        "{}: interfaces left after DEL: {left:?}",
        w.sandbox.name
    );
    Api::<Pod>::namespaced(kube.client.clone(), NS)
        .delete(&w.sandbox.name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// Nothing left: no pods, no KuryrPorts, no Neutron ports, no veth on the nodes.
async fn assert_all_gone(
    kube: &Kube,
    target: &NeutronTarget,
    fx: &NeutronFixture,
    nodes: &[Node; 2],
) -> Result<()> {
    let pods = Api::<Pod>::namespaced(kube.client.clone(), NS);
    let kps = Api::<KuryrPort>::namespaced(kube.client.clone(), NS);
    eventually("pods and KuryrPorts gone", WAIT, || async {
        let p = pods.list(&Default::default()).await?.items.len();
        let k = kps.list(&Default::default()).await?.items.len();
        Ok((p == 0 && k == 0).then_some(()))
    })
    .await?;
    eventually("every pod port deleted in Neutron", WAIT, || async {
        Ok(pod_ports(&target.client, &fx.project)
            .await?
            .is_empty()
            .then_some(()))
    })
    .await?;
    for n in nodes {
        let left = n.leftover_links()?;
        ensure!(left.is_empty(), "{}: links left on the node: {left:?}", n.name);
    }
    Ok(())
}

/// Runs `body` once per Neutron target with a fresh project, cleaning it up
/// whatever happens.
macro_rules! per_target {
    ($cidrs:expr, |$target:ident, $fx:ident| $body:expr) => {{
        init_logs();
        if !can_netns() {
            return Ok(());
        }
        cni_binary()?;
        for $target in neutron_targets().await? {
            let $fx = neutron_fixture(&$target.client, $cidrs).await?;
            let result: Result<()> = async { $body }.await;
            cleanup_project(&$target.client, &$fx.project).await;
            result.with_context(|| format!("against {}", $target.name))?;
        }
        Ok(())
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_pods_on_two_nodes_get_their_ports_talk_and_leave_nothing() -> Result<()> {
    per_target!(&["10.71.0.0/24"], |target, fx| {
        let kube = start_kube().await?;
        let _ctrl = start_controller(&kube.client, &target, controller_config(&fx, ""));
        create_namespace(&kube.client, NS).await?;
        let nodes = two_nodes(&kube).await?;
        let mut pods = Vec::new();
        for i in 0..4 {
            pods.push(wire_pod(&kube, &target, &nodes, &format!("pod-{i}"), i % 2, json!({})).await?);
        }
        let macs: std::collections::BTreeSet<_> = pods.iter().map(|p| p.ports[0].1.clone()).collect();
        ensure!(macs.len() == 4, "four distinct Neutron MACs: {macs:?}");
        // Across nodes both ways, and within a node.
        for (from, to) in [(0, 1), (1, 0), (2, 3), (3, 0), (0, 2)] {
            let (a, b) = (&pods[from], &pods[to]);
            reachable(&a.sandbox.netns.path(), &b.sandbox.netns.path(), b.ip())
                .map_err(|e| anyhow::anyhow!("{} -> {} ({}): {e}", a.sandbox.name, b.sandbox.name, b.ip()))?;
        }
        for p in &pods {
            unwire_pod(&kube, &nodes, p).await?;
        }
        assert_all_gone(&kube, &target, &fx, &nodes).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_restart_keeps_pods_and_serves_add_and_del() -> Result<()> {
    per_target!(&["10.72.0.0/24"], |target, fx| {
        let kube = start_kube().await?;
        let _ctrl = start_controller(&kube.client, &target, controller_config(&fx, ""));
        create_namespace(&kube.client, NS).await?;
        let mut nodes = two_nodes(&kube).await?;
        let old_a = wire_pod(&kube, &target, &nodes, "old-a", 0, json!({})).await?;
        let old_b = wire_pod(&kube, &target, &nodes, "old-b", 1, json!({})).await?;
        let (pa, pb) = (old_a.sandbox.netns.path(), old_b.sandbox.netns.path());

        // The datapath does not depend on the daemon.
        nodes[0].stop_daemon().await?;
        reachable(&pa, &pb, old_b.ip()).map_err(|e| anyhow::anyhow!("daemon down: {e}"))?;
        nodes[0].start_daemon().await?;
        reachable(&pb, &pa, old_a.ip()).map_err(|e| anyhow::anyhow!("after restart: {e}"))?;

        // New ADDs on the restarted daemon work and reach the old pods.
        let new_a = wire_pod(&kube, &target, &nodes, "new-a", 0, json!({})).await?;
        reachable(&new_a.sandbox.netns.path(), &pb, old_b.ip())
            .map_err(|e| anyhow::anyhow!("new pod: {e}"))?;
        reachable(&pa, &new_a.sandbox.netns.path(), new_a.ip())
            .map_err(|e| anyhow::anyhow!("to new pod: {e}"))?;

        // A stale DEL (an older container of old-a) still touches nothing.
        let stale = PodSandbox {
            namespace: NS.into(),
            name: "old-a".into(),
            uid: old_a.sandbox.uid.clone(),
            container: "an-older-container".into(),
            netns: Ns::new("kstale")?,
        };
        cni_del(&nodes[0], &stale).await?;
        ensure!(
            old_a.sandbox.netns.links()?.contains(&"eth0".to_string()),
            "a stale DEL after restart removed old-a's eth0"
        );

        // DEL of the pod the previous daemon plugged.
        for p in [&old_a, &new_a, &old_b] {
            unwire_pod(&kube, &nodes, p).await?;
        }
        assert_all_gone(&kube, &target, &fx, &nodes).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn additional_subnets_pod_has_eth0_eth1_eth2_and_leaves_nothing() -> Result<()> {
    per_target!(&["10.73.0.0/24", "10.74.0.0/24", "10.75.0.0/24"], |target, fx| {
        let kube = start_kube().await?;
        let cfg = controller_config(&fx, "multi_vif_drivers = additional_subnets");
        let _ctrl = start_controller(&kube.client, &target, cfg);
        create_namespace(&kube.client, NS).await?;
        let nodes = two_nodes(&kube).await?;
        let extra = json!([fx.subnets[1].subnet, fx.subnets[2].subnet]).to_string();
        let pod = wire_pod(
            &kube,
            &target,
            &nodes,
            "multi",
            0,
            json!({"openstack.org/kuryr-additional-subnets": extra}),
        )
        .await?;
        let names: Vec<&str> = pod.ports.iter().map(|(n, _, _)| n.as_str()).collect();
        ensure!(names == ["eth0", "eth1", "eth2"], "interfaces {names:?}");
        // Each interface on its own subnet, in that order.
        for (i, (ifname, _, ip)) in pod.ports.iter().enumerate() {
            let prefix = fx.subnets[i].cidr.trim_end_matches("0/24");
            ensure!(
                ip.to_string().starts_with(prefix),
                "{ifname} has {ip}, not in {}",
                fx.subnets[i].cidr
            );
        }
        ensure!(
            pod.result["ips"].as_array().map(Vec::len) == Some(3),
            "three IPs in the CNI result: {}",
            pod.result
        );
        let defaults = pod.sandbox.netns.default_route_devs()?;
        ensure!(
            defaults == ["eth0"],
            "default routes via {defaults:?}, only eth0 expected"
        );
        let defaults_in_result: Vec<&Value> = pod.result["routes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["dst"] == "0.0.0.0/0")
            .collect();
        ensure!(
            defaults_in_result.len() == 1,
            "one default route in {}",
            pod.result
        );

        // A pod on the other node reaches the multi-homed pod's eth0.
        let peer = wire_pod(&kube, &target, &nodes, "peer", 1, json!({})).await?;
        reachable(&peer.sandbox.netns.path(), &pod.sandbox.netns.path(), pod.ip())
            .map_err(|e| anyhow::anyhow!("peer -> multi: {e}"))?;

        unwire_pod(&kube, &nodes, &pod).await?;
        unwire_pod(&kube, &nodes, &peer).await?;
        assert_all_gone(&kube, &target, &fx, &nodes).await
    })
}
