//! The neutron-vif OVS binding against a real Open vSwitch with the userspace
//! (netdev) datapath: `scripts/ovs-userspace.sh start` runs one and prints its
//! database socket; these tests talk to it through `KURYR_TEST_OVS_DB`
//! (`unix:<socket>`, set by `scripts/test-all.sh`) and skip with the reason
//! when it is unset (a failure under `KURYR_TEST_REQUIRE_ALL=1`, as CI runs
//! them). They never start or stop OVS themselves.
#![allow(clippy::unwrap_used)]
mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use kuryr_crds::vif::{FixedIp, Network, PortProfile, Subnet, VifBase, VifBridge, VifOpenVSwitch};
use kuryr_crds::{KuryrPort, KuryrPortSpec, KuryrPortStatus, KuryrPortVif, Vif};
use kuryr_daemon::binding::{
    BindingConfig, BindingDrivers, BindingError, HybridDevices, PlugKind, PlugSpec, PlugTarget,
    TxChecksumMode, ovs_available_at,
};
use kuryr_daemon::netlink::{NetNs, Netlink};
use kuryr_daemon::{ApiHealth, Daemon, DaemonConfig, NoEvents};
use serde_json::{Value, json};

/// The userspace OVS database, or `None` after [`skip`] (a failure under `KURYR_TEST_REQUIRE_ALL=1`).
#[track_caller]
fn ovs_db() -> Option<String> {
    match std::env::var("KURYR_TEST_OVS_DB") {
        Ok(db) if !db.is_empty() => Some(db),
        _ => {
            skip(
                "KURYR_TEST_OVS_DB is unset (run `scripts/ovs-userspace.sh start` and set \
                 KURYR_TEST_OVS_DB=unix:<printed socket>; scripts/test-all.sh does both)",
            );
            None
        }
    }
}

/// [`ovs_db`] when network namespaces can be made here too (else skipped with the reason).
#[track_caller]
fn ovs_lab() -> Option<String> {
    let db = ovs_db()?;
    can_netns().then_some(db)
}

fn vsctl(db: &str, args: &[&str]) -> String {
    let mut full = vec!["ovs-vsctl", "--timeout=10"];
    let db_arg = format!("--db={db}");
    full.push(&db_arg);
    full.extend_from_slice(args);
    host_ok(&full)
}

/// `external_ids` of an OVS Interface as `ovs-vsctl list Interface` shows it.
fn external_ids(db: &str, iface: &str) -> serde_json::Map<String, Value> {
    let out = vsctl(
        db,
        &[
            "--format=json",
            "--columns=external_ids",
            "list",
            "Interface",
            iface,
        ],
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    // {"data":[[["map",[["k","v"],...]]]],"headings":["external_ids"]}
    let pairs = v["data"][0][0][1].as_array().unwrap_or_else(|| panic!("{out}"));
    pairs
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_string(), p[1].clone()))
        .collect()
}

/// An OVS bridge removed (with its ports) on drop.
struct OvsBridge {
    db: String,
    name: String,
}

impl OvsBridge {
    /// A new userspace bridge named after `prefix`.
    fn netdev(db: &str, prefix: &str) -> Self {
        let b = Self {
            db: db.to_string(),
            name: unique(prefix),
        };
        vsctl(
            db,
            &[
                "add-br",
                &b.name,
                "--",
                "set",
                "Bridge",
                &b.name,
                "datapath_type=netdev",
            ],
        );
        b
    }
}

impl Drop for OvsBridge {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ovs-vsctl")
            .args([
                &format!("--db={}", self.db),
                "--timeout=10",
                "--if-exists",
                "del-br",
                &self.name,
            ])
            .status();
    }
}

fn ovs_config(db: &str) -> BindingConfig {
    BindingConfig {
        ovs_db: Some(db.to_string()),
        // No kernel module here: bridges the driver creates must be userspace ones.
        ovs_datapath_type: "netdev".into(),
        ..BindingConfig::default()
    }
}

fn spec(port: &str, tap: &str, mac: &str, addr: &str, bridge: &str) -> PlugSpec {
    PlugSpec {
        port_id: port.into(),
        ifname: "eth0".into(),
        host_ifname: tap.into(),
        mac: mac.parse().unwrap(),
        mtu: Some(1450),
        addresses: vec![addr.parse().unwrap()],
        gateways: vec![],
        routes: vec![],
        is_default: true,
        kind: PlugKind::OpenVSwitch {
            bridge: bridge.into(),
        },
    }
}

/// A pod interface plugged the OVS hybrid way: `tap...` on the port's `qbr...`
/// bridge, joined to `ovs_bridge` by `qvb...`/`qvo...` (os-vif's names).
fn hybrid_spec(port: &str, mac: &str, addr: &str, ovs_bridge: &str) -> PlugSpec {
    let tap = kuryr_crds::vif_name_for_port(port);
    let bridge = HybridDevices::of_tap(&tap).unwrap().bridge;
    PlugSpec {
        kind: PlugKind::HybridOvs {
            bridge,
            ovs_bridge: ovs_bridge.into(),
        },
        ..spec(port, &tap, mac, addr, ovs_bridge)
    }
}

/// Every host link a plug of `spec` may make (the hybrid plug's devices when
/// its host end is named like a port's tap), deleted on drop.
struct HybridLinks(Vec<HostLink>);

impl HybridLinks {
    fn of(spec: &PlugSpec) -> Self {
        let mut names = vec![spec.host_ifname.clone()];
        if let Some(d) = HybridDevices::of_tap(&spec.host_ifname) {
            names.extend([d.bridge, d.qvb, d.qvo]);
        }
        Self(names.into_iter().map(HostLink).collect())
    }

    fn names(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|l| &l.0)
    }
}

/// `ip -o link show <name>` names `master`.
fn on_master(name: &str, master: &str) -> bool {
    host_ok(&["ip", "-o", "link", "show", name]).contains(&format!(" master {master} "))
}

/// [`tcp_reachable`] with a deadline: without one a path that drops every
/// packet would leave its listener blocked in accept() and the test hanging.
async fn tcp_ok(from: &TestNetns, to: &TestNetns, addr: &str) {
    let (f, t, a) = (from.name.clone(), to.name.clone(), addr.parse().unwrap());
    match tokio::time::timeout(
        Duration::from_secs(90),
        tokio::task::spawn_blocking(move || tcp_reachable(&f, &t, a)),
    )
    .await
    {
        Ok(r) => r
            .unwrap()
            .unwrap_or_else(|e| panic!("no TCP to {addr} through OVS: {e}")),
        Err(_) => panic!("no TCP to {addr} through OVS within 90 s"),
    }
}

async fn host_link_exists(name: &str) -> bool {
    Netlink::current()
        .unwrap()
        .link_by_name(name)
        .await
        .unwrap()
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_on_a_netdev_bridge_reach_each_other_and_teardown_cleans_up() {
    let Some(db) = ovs_lab() else { return };
    // The driver creates the missing bridge with the configured datapath.
    let bridge = OvsBridge {
        db: db.clone(),
        name: unique("kovb"),
    };
    let (a, b) = (TestNetns::new("kova"), TestNetns::new("kovb"));
    let (ta, tb) = (unique("kovt"), unique("kovt"));
    let _links = (HostLink(ta.clone()), HostLink(tb.clone()));
    let (port_a, port_b) = (
        format!("{}-port-a", unique("q")),
        format!("{}-port-b", unique("q")),
    );
    let sa = spec(&port_a, &ta, "fa:16:3e:00:40:0a", "10.71.0.10/24", &bridge.name);
    let sb = spec(&port_b, &tb, "fa:16:3e:00:40:0b", "10.71.0.11/24", &bridge.name);
    let (na, nb) = (NetNs::open(&a.path()).unwrap(), NetNs::open(&b.path()).unwrap());
    let (target_a, target_b) = (
        PlugTarget::new(&na, "pod-uid-a"),
        PlugTarget::new(&nb, "pod-uid-b"),
    );
    // The public availability probe finds this OVS usable.
    ovs_available_at(Some(&db)).await.unwrap();
    let drivers = BindingDrivers::new(&ovs_config(&db));
    let d = drivers.for_kind(&sa.kind);
    assert_eq!(d.name(), "neutron-vif/ovs");
    d.setup(&sa, &target_a).await.unwrap();
    // B's name is an Interface record left on another bridge under a Port of
    // another name, its veth gone: the setup replaces it (and the TCP below
    // crosses it).
    let other = OvsBridge::netdev(&db, "kovo");
    let holder = unique("kovh");
    vsctl(
        &db,
        &[
            "--",
            "--id=@i",
            "create",
            "Interface",
            &format!("name={tb}"),
            "--",
            "--id=@p",
            "create",
            "Port",
            &format!("name={holder}"),
            "interfaces=@i",
            "--",
            "add",
            "Bridge",
            &other.name,
            "ports",
            "@p",
        ],
    );
    d.setup(&sb, &target_b).await.unwrap();
    assert_eq!(vsctl(&db, &["list-ports", &other.name]).trim(), "");
    assert_eq!(vsctl(&db, &["get", "Interface", &tb, "error"]).trim(), "[]");
    // A retried ADD over the leftovers of the first one (its veth and its
    // port record) succeeds.
    d.setup(&sa, &target_a).await.unwrap();
    d.check(&sa, &target_a).await.unwrap();
    d.check(&sb, &target_b).await.unwrap();

    let dp = vsctl(&db, &["get", "Bridge", &bridge.name, "datapath_type"]);
    assert_eq!(dp.trim(), "netdev");
    let mut ports: Vec<String> = vsctl(&db, &["list-ports", &bridge.name])
        .lines()
        .map(str::to_owned)
        .collect();
    ports.sort();
    let mut want = vec![ta.clone(), tb.clone()];
    want.sort();
    assert_eq!(ports, want);

    // The pod ends carry the Neutron port's MAC and IP.
    let link = a.exec_ok(&["ip", "-o", "link", "show", "eth0"]);
    assert!(
        link.contains("fa:16:3e:00:40:0a") && link.contains("mtu 1450"),
        "{link}"
    );
    let addr = b.exec_ok(&["ip", "-o", "-4", "addr", "show", "eth0"]);
    assert!(addr.contains("10.71.0.11/24"), "{addr}");

    // What the Neutron OVS agent matches on.
    for (tap, port, mac, uid) in [
        (&ta, &port_a, "fa:16:3e:00:40:0a", "pod-uid-a"),
        (&tb, &port_b, "fa:16:3e:00:40:0b", "pod-uid-b"),
    ] {
        let ids = external_ids(&db, tap);
        assert_eq!(ids["iface-id"], json!(port), "{ids:?}");
        assert_eq!(ids["attached-mac"], json!(mac), "{ids:?}");
        assert_eq!(ids["iface-status"], json!("active"), "{ids:?}");
        assert_eq!(ids["vm-uuid"], json!(uid), "{ids:?}");
    }

    // TCP both ways through the userspace datapath.
    tcp_ok(&a, &b, "10.71.0.11").await;
    tcp_ok(&b, &a, "10.71.0.10").await;

    // CHECK notices a port someone removed from OVS.
    vsctl(&db, &["del-port", &bridge.name, &tb]);
    match d.check(&sb, &target_b).await {
        Err(BindingError::Check { ifname, message }) => {
            assert_eq!(ifname, tb);
            assert!(message.contains("not an OVS port"), "{message}");
        }
        other => panic!("CHECK must fail without the OVS port, got {other:?}"),
    }

    d.teardown(&sa, &target_a).await.unwrap();
    d.teardown(&sb, &target_b).await.unwrap();
    d.teardown(&sa, &target_a).await.expect("teardown is idempotent");
    assert_eq!(vsctl(&db, &["list-ports", &bridge.name]).trim(), "");
    assert!(!host_link_exists(&ta).await && !host_link_exists(&tb).await);
    for ns in [&a, &b] {
        let links = ns.exec_ok(&["ip", "-o", "link"]);
        assert!(!links.contains("eth0"), "{links}");
    }
}

/// OVS hybrid plug (upstream's `VIFBridge` of plugin `ovs`, for the OVS agent's
/// iptables_hybrid firewall): each pod's veth on a Linux bridge of its port,
/// joined to the OVS bridge by a veth whose `qvo` end is the OVS port the agent
/// matches; pods talk through it, CHECK sees a broken link, teardown leaves
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_plugged_pods_talk_through_their_port_bridges_and_leave_nothing() {
    let Some(db) = ovs_lab() else { return };
    let bridge = OvsBridge::netdev(&db, "kovy");
    let (a, b) = (TestNetns::new("kovya"), TestNetns::new("kovyb"));
    let (port_a, port_b) = (unique("ya"), unique("yb"));
    let sa = hybrid_spec(&port_a, "fa:16:3e:00:45:0a", "10.75.0.10/24", &bridge.name);
    let sb = hybrid_spec(&port_b, "fa:16:3e:00:45:0b", "10.75.0.11/24", &bridge.name);
    let _links = (HybridLinks::of(&sa), HybridLinks::of(&sb));
    let (na, nb) = (NetNs::open(&a.path()).unwrap(), NetNs::open(&b.path()).unwrap());
    let (target_a, target_b) = (
        PlugTarget::new(&na, "pod-uid-ya"),
        PlugTarget::new(&nb, "pod-uid-yb"),
    );
    let drivers = BindingDrivers::new(&ovs_config(&db));
    let d = drivers.for_kind(&sa.kind);
    assert_eq!(d.name(), "neutron-vif/ovs-hybrid");
    d.setup(&sa, &target_a).await.unwrap();
    d.setup(&sb, &target_b).await.unwrap();
    // A retried ADD over everything the first one made succeeds.
    d.setup(&sa, &target_a).await.unwrap();
    d.check(&sa, &target_a).await.unwrap();
    d.check(&sb, &target_b).await.unwrap();

    let mut qvos = Vec::new();
    for (s, uid) in [(&sa, "pod-uid-ya"), (&sb, "pod-uid-yb")] {
        let dev = HybridDevices::of_tap(&s.host_ifname).unwrap();
        assert!(on_master(&s.host_ifname, &dev.bridge), "{dev:?}");
        assert!(on_master(&dev.qvb, &dev.bridge), "{dev:?}");
        assert_eq!(vsctl(&db, &["port-to-br", &dev.qvo]).trim(), bridge.name);
        let ids = external_ids(&db, &dev.qvo);
        assert_eq!(ids["iface-id"], json!(s.port_id), "{ids:?}");
        assert_eq!(ids["attached-mac"], json!(s.mac.to_string()), "{ids:?}");
        assert_eq!(ids["iface-status"], json!("active"), "{ids:?}");
        assert_eq!(ids["vm-uuid"], json!(uid), "{ids:?}");
        let ipv6 = format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", dev.bridge);
        if let Ok(off) = std::fs::read_to_string(&ipv6) {
            assert_eq!(off.trim(), "1", "{ipv6}");
        }
        qvos.push(dev.qvo);
    }
    // Only the qvo ends are OVS ports: the pods' veths are on their Linux bridges.
    let mut ports: Vec<String> = vsctl(&db, &["list-ports", &bridge.name])
        .lines()
        .map(str::to_owned)
        .collect();
    ports.sort();
    qvos.sort();
    assert_eq!(ports, qvos);

    tcp_ok(&a, &b, "10.75.0.11").await;
    tcp_ok(&b, &a, "10.75.0.10").await;

    // CHECK notices the port bridge's link to OVS taken off it.
    let qvb_b = HybridDevices::of_tap(&sb.host_ifname).unwrap().qvb;
    host_ok(&["ip", "link", "set", &qvb_b, "nomaster"]);
    match d.check(&sb, &target_b).await {
        Err(BindingError::Check { ifname, message }) => {
            assert_eq!(ifname, qvb_b);
            assert!(message.contains("not attached to bridge"), "{message}");
        }
        other => panic!("CHECK must fail with qvb off the bridge, got {other:?}"),
    }

    d.teardown(&sa, &target_a).await.unwrap();
    d.teardown(&sb, &target_b).await.unwrap();
    d.teardown(&sa, &target_a).await.expect("teardown is idempotent");
    assert_eq!(vsctl(&db, &["list-ports", &bridge.name]).trim(), "");
    for link in _links.0.names().chain(_links.1.names()) {
        assert!(!host_link_exists(link).await, "{link} left");
    }
    for ns in [&a, &b] {
        let links = ns.exec_ok(&["ip", "-o", "link"]);
        assert!(!links.contains("eth0"), "{links}");
    }
}

/// A port handed from one container to another (through the pool): a late DEL of the first
/// leaves every device the second's ADD made again and carries the owner of (the per-port bridge,
/// the qvb/qvo pair and its OVS port), even before that ADD made its pod veth, and removes only
/// what is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_teardown_leaves_the_hybrid_devices_of_the_ports_next_container() {
    let Some(db) = ovs_lab() else { return };
    let bridge = OvsBridge::netdev(&db, "kovz");
    let (old_ns, new_ns) = (TestNetns::new("kovzo"), TestNetns::new("kovzn"));
    let s = hybrid_spec(&unique("z"), "fa:16:3e:00:46:01", "10.76.0.10/24", &bridge.name);
    let _links = HybridLinks::of(&s);
    let dev = HybridDevices::of_tap(&s.host_ifname).unwrap();
    let (old_tag, new_tag) = (
        kuryr_daemon::registry::PodKey::new("default", "old").owner_tag("c-old"),
        kuryr_daemon::registry::PodKey::new("default", "new").owner_tag("c-new"),
    );
    let (on, nn) = (
        NetNs::open(&old_ns.path()).unwrap(),
        NetNs::open(&new_ns.path()).unwrap(),
    );
    let old = PlugTarget {
        owner_tag: Some(&old_tag),
        ..PlugTarget::new(&on, "uid-old")
    };
    let new = PlugTarget {
        owner_tag: Some(&new_tag),
        ..PlugTarget::new(&nn, "uid-new")
    };
    let drivers = BindingDrivers::new(&ovs_config(&db));
    let d = drivers.for_kind(&s.kind);
    d.setup(&s, &old).await.unwrap();
    // The new container's ADD half way: the bridge and the pair are its own, the pod veth still
    // the old container's.
    for link in [&dev.bridge, &dev.qvb, &dev.qvo] {
        host_ok(&["ip", "link", "set", link, "alias", &new_tag]);
    }
    d.teardown(&s, &old).await.unwrap();
    assert!(
        !host_link_exists(&s.host_ifname).await,
        "the old pod veth is the old one's"
    );
    assert!(!old_ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"));
    for link in [&dev.bridge, &dev.qvb, &dev.qvo] {
        assert!(host_link_exists(link).await, "{link} is the new container's");
    }
    assert_eq!(vsctl(&db, &["port-to-br", &dev.qvo]).trim(), bridge.name);
    // Its ADD done, the old container's DEL again leaves all of it; its own DEL takes it all.
    d.setup(&s, &new).await.unwrap();
    d.teardown(&s, &old).await.unwrap();
    d.check(&s, &new).await.unwrap();
    d.teardown(&s, &new).await.unwrap();
    for link in _links.names() {
        assert!(!host_link_exists(link).await, "{link} left");
    }
    assert_eq!(vsctl(&db, &["list-ports", &bridge.name]).trim(), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_collects_the_ovsdb_error_and_still_removes_the_veth() {
    let Some(db) = ovs_lab() else { return };
    let bridge = OvsBridge {
        db: db.clone(),
        name: unique("kovb"),
    };
    let pod = TestNetns::new("kovc");
    let tap = unique("kovt");
    let _l = HostLink(tap.clone());
    let s = spec(
        "port-collect",
        &tap,
        "fa:16:3e:00:41:01",
        "10.72.0.5/24",
        &bridge.name,
    );
    let ns = NetNs::open(&pod.path()).unwrap();
    let target = PlugTarget::new(&ns, "pod-uid-c");
    let good = BindingDrivers::new(&ovs_config(&db));
    good.for_kind(&s.kind).setup(&s, &target).await.unwrap();

    // The same driver pointed at a database that does not answer.
    let dead = tempfile::tempdir().unwrap();
    let dead_db = format!("unix:{}/db.sock", dead.path().display());
    let broken = BindingDrivers::new(&BindingConfig {
        ovs_timeout_secs: 2,
        ..ovs_config(&dead_db)
    });
    let err = broken.for_kind(&s.kind).teardown(&s, &target).await.unwrap_err();
    assert_eq!(err.0.len(), 1, "{err}");
    assert!(
        matches!(&err.0[0], BindingError::OvsUnreachable { args, .. } if args.contains("del-port")),
        "{err}"
    );
    // The kernel side went anyway; the OVS record is what the error is about.
    assert!(!host_link_exists(&tap).await);
    assert_eq!(vsctl(&db, &["list-ports", &bridge.name]).trim(), tap);
    good.for_kind(&s.kind).teardown(&s, &target).await.unwrap();
    assert_eq!(vsctl(&db, &["list-ports", &bridge.name]).trim(), "");
}

/// `ethtool -k eth0` in the pod: whether TX checksum offload is on.
fn pod_tx_checksum_on(pod: &TestNetns) -> bool {
    let out = pod.exec_ok(&["ethtool", "-k", "eth0"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("tx-checksumming:"))
        .unwrap_or_else(|| panic!("no tx-checksumming in {out}"));
    line.contains(": on")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_tx_checksum_offload_goes_off_on_a_netdev_bridge_unless_configured_on() {
    let Some(db) = ovs_lab() else { return };
    if std::process::Command::new("ethtool")
        .arg("--version")
        .output()
        .is_err()
    {
        skip("ethtool is not installed (scripts/ovs-userspace.sh start installs it)");
        return;
    }
    let bridge = OvsBridge {
        db: db.clone(),
        name: unique("kovb"),
    };
    for (mode, want_on) in [
        (TxChecksumMode::Auto, false),
        (TxChecksumMode::Off, false),
        (TxChecksumMode::On, true),
    ] {
        let pod = TestNetns::new("kovx");
        let tap = unique("kovt");
        let _l = HostLink(tap.clone());
        let s = spec("port-tx", &tap, "fa:16:3e:00:43:01", "10.74.0.5/24", &bridge.name);
        let ns = NetNs::open(&pod.path()).unwrap();
        let target = PlugTarget::new(&ns, "pod-uid-tx");
        let drivers = BindingDrivers::new(&BindingConfig {
            pod_tx_checksum: mode,
            ..ovs_config(&db)
        });
        let d = drivers.for_kind(&s.kind);
        d.setup(&s, &target).await.unwrap();
        assert_eq!(pod_tx_checksum_on(&pod), want_on, "{mode:?} on a netdev bridge");
        d.teardown(&s, &target).await.unwrap();
    }
}

/// A missing bridge whose name a Port elsewhere already has cannot be made:
/// the ADD fails saying so instead of taking the bridge for made by someone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_name_taken_by_a_port_is_refused_with_the_reason() {
    let Some(db) = ovs_lab() else { return };
    let other = OvsBridge::netdev(&db, "kovo");
    let taken = unique("kovn");
    vsctl(&db, &["add-port", &other.name, &taken]);
    let pod = TestNetns::new("kovn");
    let ns = NetNs::open(&pod.path()).unwrap();
    let tap = unique("kovt");
    let _l = HostLink(tap.clone());
    let s = spec("port-n", &tap, "fa:16:3e:00:44:01", "10.75.0.5/24", &taken);
    let drivers = BindingDrivers::new(&ovs_config(&db));
    match drivers
        .for_kind(&s.kind)
        .setup(&s, &PlugTarget::new(&ns, "n"))
        .await
    {
        Err(BindingError::Ovs { message, .. }) => {
            assert!(
                message.contains("a port or interface of that name exists"),
                "{message}"
            );
        }
        other => panic!("a bridge name held by a port must be refused, got {other:?}"),
    }
    let bridges = vsctl(&db, &["list-br"]);
    assert!(!bridges.lines().any(|b| b == taken), "{bridges}");
    assert_eq!(vsctl(&db, &["list-ports", &other.name]).trim(), taken);
}

/// Needs no running OVS: a database that does not answer makes the driver
/// refuse with the reason, leaving nothing behind (a hybrid plug's bridge and
/// veth pair, made before the OVS port, neither).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_ovsdb_refuses_setup_without_leftovers() {
    if !can_netns() {
        return;
    }
    let pod = TestNetns::new("kovu");
    let ns = NetNs::open(&pod.path()).unwrap();
    let dead = tempfile::tempdir().unwrap();
    let drivers = BindingDrivers::new(&BindingConfig {
        ovs_timeout_secs: 2,
        ..ovs_config(&format!("unix:{}/db.sock", dead.path().display()))
    });
    let tap = unique("kovt");
    let plain = spec("port-u", &tap, "fa:16:3e:00:42:01", "10.73.0.5/24", "br-int");
    let hybrid = hybrid_spec(&unique("u"), "fa:16:3e:00:42:02", "10.73.0.6/24", "br-int");
    for (s, driver) in [(plain, "neutron-vif/ovs"), (hybrid, "neutron-vif/ovs-hybrid")] {
        let _l = HybridLinks::of(&s);
        match drivers
            .for_kind(&s.kind)
            .setup(&s, &PlugTarget::new(&ns, "u"))
            .await
        {
            Err(BindingError::Unsupported { driver: d, reason }) => {
                assert_eq!(d, driver);
                assert!(
                    reason.contains("ovsdb-server does not answer") || reason.contains("not installed"),
                    "{reason}"
                );
            }
            other => panic!("{driver}: expected Unsupported, got {other:?}"),
        }
        for link in _l.names() {
            assert!(!host_link_exists(link).await, "{driver}: {link} left");
        }
        assert!(!pod.exec_ok(&["ip", "-o", "link"]).contains("eth0"), "{driver}");
    }
}

/// An ovsdb-server that finds the bridge and then never answers again (an ovs-vswitchd that does
/// not apply the port: each wait runs to its timeout). Serves every connection to `sock`.
fn stalling_ovsdb(sock: std::path::PathBuf) -> tokio::task::JoinHandle<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = conn.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let mut stream = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
                    let mut used = 0;
                    while let Some(Ok(req)) = stream.next() {
                        used = stream.byte_offset();
                        let lookup = req["method"] == "transact" && req["params"][1]["table"] == "Bridge";
                        if lookup {
                            let rows = json!([{"_uuid": ["uuid", "6b8e1c0e-0000-4000-8000-000000000001"],
                                               "datapath_type": "netdev"}]);
                            let answer = json!({"id": req["id"], "error": null,
                                "result": [{"rows": rows}, {"rows": []}, {"rows": []}]});
                            let _ = conn.write_all(answer.to_string().as_bytes()).await;
                        }
                    }
                    buf.drain(..used);
                }
            });
        }
    })
}

/// An ADD whose client goes away while it plugs (the runtime killed the plugin: its sandbox given
/// up) is not cut short between the veth made and the port attached or undone: the plug runs to
/// its end on its own, here the OVS attach timing out and the veth removed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_dropped_mid_plug_still_finishes_its_plug() {
    if !can_netns() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("db.sock");
    let server = stalling_ovsdb(sock.clone());
    let node = unique("kovc");
    let mut cfg = DaemonConfig::new(node.clone());
    cfg.vif_annotation_timeout = Duration::from_secs(20);
    cfg.binding = BindingConfig {
        ovs_timeout_secs: 2,
        ..ovs_config(&format!("unix:{}", sock.display()))
    };
    let d = Daemon::new(cfg, Arc::new(NoEvents), Arc::new(ApiUp));
    let pod = TestNetns::new("kovc");
    let port_id = format!("{}-port-c", unique("q"));
    let tap = kuryr_crds::vif_name_for_port(&port_id);
    let _l = HostLink(tap.clone());
    d.registry.apply_kuryrport(ovs_kuryrport(
        Plug::Ovs,
        "cut",
        "uid-cut",
        &node,
        &port_id,
        "fa:16:3e:00:45:01",
        "10.74.0.30",
        "br-int",
    ));
    let body = cni_body("ADD", "cut", "c1", &pod.path(), "uid-cut").to_string();
    let add = {
        let d = d.clone();
        tokio::spawn(async move { d.add(body.as_bytes()).await.map(drop) })
    };
    // Plugging: the veth is made, the attach waits on the database.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !host_link_exists(&tap).await {
        assert!(std::time::Instant::now() < deadline, "the ADD never plugged");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    add.abort();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while host_link_exists(&tap).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the veth of a plug cut short is left on the host"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.abort();
}

struct ApiUp;
#[async_trait]
impl ApiHealth for ApiUp {
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// How the OVS agent binds a port: plugged into the OVS bridge, or through a
/// Linux bridge of its own (`ovs_hybrid_plug`, its iptables_hybrid firewall).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Plug {
    Ovs,
    Hybrid,
}

/// A KuryrPort whose eth0 is a `VIFOpenVSwitch` on `bridge` (or, hybrid, a
/// `VIFBridge` of plugin `ovs` on the port's `qbr` bridge with `bridge` in its
/// network), as the controller's neutron-vif driver writes it for a port bound
/// by the OVS agent.
#[allow(clippy::too_many_arguments)]
fn ovs_kuryrport(
    plug: Plug,
    name: &str,
    uid: &str,
    node: &str,
    port_id: &str,
    mac: &str,
    ip: &str,
    bridge: &str,
) -> KuryrPort {
    let mut base = VifBase::new(port_id, "ovs");
    base.address = Some(mac.into());
    base.active = true;
    base.port_profile = Some(PortProfile::open_vswitch(port_id));
    let mut net = Network::new(format!("net-{port_id}"));
    net.mtu = Some(1450);
    net.bridge = Some(bridge.into());
    let mut subnet = Subnet::new("10.74.0.0/24", None);
    subnet.ips = vec![FixedIp::new(ip.parse().unwrap())].into();
    net.subnets = vec![subnet].into();
    base.network = Some(net);
    let vif = match plug {
        Plug::Ovs => Vif::OpenVSwitch(VifOpenVSwitch {
            base,
            bridge_name: Some(bridge.into()),
            obj: Default::default(),
        }),
        Plug::Hybrid => Vif::Bridge(VifBridge {
            base,
            bridge_name: Some(format!("qbr{port_id}").chars().take(14).collect()),
            obj: Default::default(),
        }),
    };
    let mut kp = KuryrPort::new(
        name,
        KuryrPortSpec {
            pod_uid: uid.into(),
            pod_node_name: node.into(),
            pod_static: false,
        },
    );
    kp.metadata.namespace = Some("default".into());
    kp.metadata.labels = Some([(kuryr_crds::names::labels::NODE_NAME.to_string(), node.to_string())].into());
    kp.status = Some(KuryrPortStatus {
        vifs: [("eth0".to_string(), KuryrPortVif::new(true, vif))].into(),
    });
    kp
}

fn cni_body(command: &str, pod: &str, container: &str, netns: &str, uid: &str) -> Value {
    json!({"CNI_IFNAME": "eth0", "CNI_NETNS": netns, "CNI_CONTAINERID": container, "CNI_COMMAND": command,
        "CNI_ARGS": format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_UID={uid}"), "config_kuryr": {}})
}

/// ADD and DEL through the daemon's HTTP API with VIFOpenVSwitch VIFs on the
/// userspace OVS's br-int (the bridge `scripts/ovs-userspace.sh` creates).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_http_add_del_with_ovs_vifs() {
    let Some(db) = ovs_lab() else { return };
    let dp = vsctl(&db, &["get", "Bridge", "br-int", "datapath_type"]);
    assert_eq!(
        dp.trim(),
        "netdev",
        "scripts/ovs-userspace.sh makes br-int a netdev bridge"
    );
    let node = unique("kovn");
    let mut cfg = DaemonConfig::new(node.clone());
    cfg.bind_address = "127.0.0.1:0".parse().unwrap();
    cfg.health_address = "127.0.0.1:0".parse().unwrap();
    cfg.metrics_address = "127.0.0.1:0".parse().unwrap();
    cfg.vif_annotation_timeout = Duration::from_secs(5);
    cfg.binding = ovs_config(&db);
    let d = Daemon::new(cfg, Arc::new(NoEvents), Arc::new(ApiUp));
    let servers = kuryr_daemon::server::start(d.clone()).await.unwrap();
    let api = format!("http://{}", servers.api);
    // reqwest is built without a default TLS provider (ring only here).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();

    let pods = [
        (
            "ovs-web",
            "fa:16:3e:00:43:01",
            "10.74.0.21",
            TestNetns::new("kovw"),
        ),
        (
            "ovs-db",
            "fa:16:3e:00:43:02",
            "10.74.0.22",
            TestNetns::new("kovd"),
        ),
    ];
    let mut taps = Vec::new();
    for (i, (name, mac, ip, ns)) in pods.iter().enumerate() {
        let uid = format!("uid-{name}-{}", unique("u"));
        let port_id = format!("{}-port-{i}", unique("q"));
        let tap = kuryr_crds::vif_name_for_port(&port_id);
        taps.push((HostLink(tap.clone()), port_id.clone(), uid.clone()));
        d.registry.apply_kuryrport(ovs_kuryrport(
            Plug::Ovs,
            name,
            &uid,
            &node,
            &port_id,
            mac,
            ip,
            "br-int",
        ));
        let r = http
            .post(format!("{api}/addNetwork"))
            .json(&cni_body("ADD", name, &format!("c-{name}"), &ns.path(), &uid))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, 202, "{body}");
        assert_eq!(body["versioned_object.name"], "VIFOpenVSwitch");
        assert_eq!(body["versioned_object.data"]["address"], *mac);
        let ids = external_ids(&db, &tap);
        assert_eq!(ids["iface-id"], json!(port_id), "{ids:?}");
        assert_eq!(ids["attached-mac"], json!(mac), "{ids:?}");
        assert_eq!(ids["iface-status"], json!("active"), "{ids:?}");
        assert_eq!(ids["vm-uuid"], json!(uid), "{ids:?}");
        assert_eq!(vsctl(&db, &["port-to-br", &tap]).trim(), "br-int");
    }
    tcp_ok(&pods[0].3, &pods[1].3, "10.74.0.22").await;

    for ((name, _, _, ns), (tap, _, uid)) in pods.iter().zip(&taps) {
        let r = http
            .post(format!("{api}/delNetwork"))
            .json(&cni_body("DEL", name, &format!("c-{name}"), &ns.path(), uid))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 204, "{:?}", r.text().await);
        let ports = vsctl(&db, &["list-ports", "br-int"]);
        assert!(!ports.lines().any(|p| p == tap.0), "{ports}");
        assert!(!host_link_exists(&tap.0).await);
    }
    servers.shutdown().await;
}

/// A daemon restarted while an OVS pod is plugged, whose KuryrPort is gone
/// by the time of the DEL: the OVS Port row must go with the veth, both when
/// the attachment comes back from the state directory (full spec) and when
/// only the host link alias is left (no state directory). A hybrid plug's
/// port bridge and its `qvb`/`qvo` pair go too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_after_restart_removes_the_ovs_port() {
    let Some(db) = ovs_lab() else { return };
    let state = tempfile::tempdir().unwrap();
    for (case, with_state, plug) in [
        ("state", true, Plug::Ovs),
        ("alias", false, Plug::Ovs),
        ("hybrid state", true, Plug::Hybrid),
        ("hybrid alias", false, Plug::Hybrid),
    ] {
        let node = unique("kovr");
        let cfg = |state_dir: Option<std::path::PathBuf>| {
            let mut cfg = DaemonConfig::new(node.clone());
            cfg.vif_annotation_timeout = Duration::from_secs(5);
            cfg.binding = ovs_config(&db);
            cfg.state_dir = state_dir;
            cfg
        };
        let state_dir = with_state.then(|| state.path().join(case));
        let first = Daemon::new(cfg(state_dir.clone()), Arc::new(NoEvents), Arc::new(ApiUp));
        let pod = unique("ovsr");
        let uid = format!("uid-{pod}");
        let port_id = format!("{}-port-r", unique("q"));
        let tap = kuryr_crds::vif_name_for_port(&port_id);
        let _t = HostLink(tap.clone());
        let hybrid = HybridDevices::of_tap(&tap).unwrap();
        let _h = (HostLink(hybrid.qvo.clone()), HostLink(hybrid.bridge.clone()));
        // The OVS port: the pod veth's host end, or the hybrid plug's qvo.
        let ovs_port = match plug {
            Plug::Ovs => tap.clone(),
            Plug::Hybrid => hybrid.qvo.clone(),
        };
        let ns = TestNetns::new("kovr");
        first.registry.apply_kuryrport(ovs_kuryrport(
            plug,
            &pod,
            &uid,
            &node,
            &port_id,
            "fa:16:3e:00:44:01",
            "10.74.0.31",
            "br-int",
        ));
        let add = cni_body("ADD", &pod, "ctr", &ns.path(), &uid).to_string();
        first.add(add.as_bytes()).await.unwrap();
        assert_eq!(vsctl(&db, &["port-to-br", &ovs_port]).trim(), "br-int", "{case}");
        if plug == Plug::Hybrid {
            assert!(host_link_exists(&hybrid.bridge).await, "{case}");
        }
        drop(first);

        if case == "hybrid alias" {
            // The pod veth went with its namespace's end (or never came: a crash mid-ADD); the
            // bridge and the pair carry the owner too.
            host_ok(&["ip", "link", "del", &tap]);
        }
        let d = Daemon::new(cfg(state_dir), Arc::new(NoEvents), Arc::new(ApiUp));
        d.restore_from_host().await.unwrap();
        let att = d
            .registry
            .get(&kuryr_daemon::registry::PodKey::new("default", &pod))
            .and_then(|e| e.attachment)
            .unwrap_or_else(|| panic!("{case}: attachment not restored"));
        assert_eq!(att.specs.is_empty(), !with_state, "{case}");
        let del = cni_body("DEL", &pod, "ctr", &ns.path(), &uid).to_string();
        d.del(del.as_bytes()).await.unwrap();
        let ports = vsctl(&db, &["list-ports", "br-int"]);
        assert!(!ports.lines().any(|p| p == ovs_port), "{case}: {ports}");
        let rows = vsctl(
            &db,
            &["--columns=name", "find", "Interface", &format!("name={ovs_port}")],
        );
        assert!(rows.trim().is_empty(), "{case}: {rows}");
        for link in [&tap, &hybrid.bridge, &hybrid.qvb, &hybrid.qvo] {
            assert!(!host_link_exists(link).await, "{case}: {link} left");
        }
        assert!(!ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"), "{case}");
    }
}
