//! cni-bench's floor does the kernel work of a real ADD: what it plugs
//! passes the bridge binding's own CHECK (MAC, MTU, up, addresses, host end
//! on the bridge), has the pod's default route, and its DEL removes the pair.
#![allow(clippy::unwrap_used)]

#[path = "../benches/cni-bench/floor.rs"]
mod floor;
// The workspace's one skip behaviour (a failure under KURYR_TEST_REQUIRE_ALL=1).
#[allow(dead_code)]
#[path = "../../kuryr-testbed/src/skip.rs"]
mod skip;

use std::process::{Command, Output};

use kuryr_daemon::binding::{BindingConfig, BindingDriver, BridgeDriver, OvsDriver, OvsProbe, PlugTarget};
use kuryr_daemon::netlink::{NetNs, Netlink};
use kuryr_daemon::testing::VifFixture;
use kuryr_daemon::vif;

fn ip(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().expect("run ip")
}

/// `tag` tells apart the tests running at once in this process: it starts
/// the port id, so the host end's name.
fn fixture(tag: &str, bridge: &str) -> VifFixture {
    VifFixture {
        ifname: "eth0".into(),
        port_id: format!(
            "{tag}{:05}-0000-0000-0000-000000000000",
            std::process::id() % 100_000
        ),
        mac: "fa:16:3e:12:34:56".into(),
        subnets: vec![(
            "10.77.0.0/16".into(),
            "10.77.3.4".parse().unwrap(),
            Some("10.77.0.1".parse().unwrap()),
        )],
        bridge: bridge.into(),
        mtu: Some(1400),
        active: true,
    }
}

#[tokio::test]
async fn the_floor_plugs_what_the_bridge_binding_checks_and_removes_it() {
    let ns = format!("kfl{}", std::process::id() % 100_000);
    if !ip(&["netns", "add", &ns]).status.success() {
        skip::skip("cannot create network namespaces (need root and iproute2)");
        return;
    }
    let bridge = format!("kflb{}", std::process::id() % 100_000);
    let spec = vif::plug_spec(
        &fixture("fl", &bridge).to_vif(),
        "eth0",
        true,
        &BindingConfig::default(),
    )
    .unwrap();
    let netns = NetNs::open(&format!("/var/run/netns/{ns}")).unwrap();

    let floor = floor::BridgeFloor::new(&bridge).await.unwrap();
    let plugged = floor.add(&spec, &netns).await;
    let checked = BridgeDriver.check(&spec, &PlugTarget::new(&netns, "uid")).await;
    let routes = String::from_utf8_lossy(&ip(&["-n", &ns, "route", "show", "default"]).stdout).into_owned();
    let deleted = floor.del(&spec).await;
    let host = Netlink::current().unwrap();
    let host_left = host.link_by_name(&spec.host_ifname).await.unwrap();
    let pod_left = Netlink::in_netns(&netns)
        .await
        .unwrap()
        .link_by_name("eth0")
        .await
        .unwrap();
    ip(&["netns", "del", &ns]);
    ip(&["link", "del", &bridge]);

    plugged.unwrap();
    checked.unwrap();
    assert!(
        routes.contains("default via 10.77.0.1 dev eth0"),
        "routes: {routes}"
    );
    deleted.unwrap();
    assert_eq!(host_left, None, "host end left behind");
    assert_eq!(pod_left, None, "pod end left behind");
}

#[tokio::test]
async fn the_floor_refuses_a_vif_it_does_not_plug() {
    let mut spec = vif::plug_spec(
        &fixture("fu", "br").to_vif(),
        "eth0",
        true,
        &BindingConfig::default(),
    )
    .unwrap();
    spec.kind = kuryr_daemon::binding::PlugKind::MacvlanNested;
    let netns = NetNs::current().unwrap();
    let unused = format!("kflu{}", std::process::id() % 100_000);
    let floor = match floor::BridgeFloor::new(&unused).await {
        Ok(floor) => floor,
        Err(e) => {
            skip::skip(format!("cannot create a bridge (need root): {e}"));
            return;
        }
    };
    let err = floor.add(&spec, &netns).await.unwrap_err();
    ip(&["link", "del", &unused]);
    assert!(err.to_string().contains("versioned_object.name"), "{err}");
}

/// The Open vSwitch floor plugs what the OVS binding's CHECK accepts (the
/// port on its bridge with the Neutron port as `iface-id`) and its DEL
/// removes it, against the userspace OVS of `KURYR_TEST_OVS_DB`.
#[tokio::test]
async fn the_ovs_floor_plugs_what_the_ovs_binding_checks_and_removes_it() {
    let Some(db) = std::env::var("KURYR_TEST_OVS_DB").ok().filter(|d| !d.is_empty()) else {
        skip::skip("KURYR_TEST_OVS_DB is unset (scripts/test-all.sh starts a userspace OVS and sets it)");
        return;
    };
    let ns = format!("kfo{}", std::process::id() % 100_000);
    if !ip(&["netns", "add", &ns]).status.success() {
        skip::skip("cannot create network namespaces (need root and iproute2)");
        return;
    }
    let bridge = format!("kfob{}", std::process::id() % 100_000);
    let cfg = BindingConfig {
        ovs_db: Some(db),
        ovs_datapath_type: "netdev".into(),
        ..BindingConfig::default()
    };
    let spec = vif::plug_spec(&fixture("fo", &bridge).to_ovs_vif(), "eth0", true, &cfg).unwrap();
    let netns = NetNs::open(&format!("/var/run/netns/{ns}")).unwrap();
    let floor = floor::OvsFloor::new(cfg.ovs_db.as_deref().unwrap(), &bridge)
        .await
        .unwrap();
    let plugged = floor.add(&spec, &netns, "uid").await;
    let checked = OvsDriver::new(&cfg)
        .check(&spec, &PlugTarget::new(&netns, "uid"))
        .await;
    let deleted = floor.del(&spec).await;
    let after = OvsProbe::locate(10, cfg.ovs_db.as_deref())
        .port_of(&spec.host_ifname)
        .await;
    let removed = floor.remove().await;
    ip(&["netns", "del", &ns]);

    plugged.unwrap();
    checked.unwrap();
    deleted.unwrap();
    assert_eq!(after.unwrap(), None, "the port outlived the floor's DEL");
    removed.unwrap();
}
