//! The netlink layer against the real kernel, in throwaway namespaces.
#![allow(clippy::unwrap_used)]
mod common;

use common::*;
use kuryr_daemon::netlink::{IpPrefix, MacAddr, NetNs, Netlink, NetlinkError, Route};

#[tokio::test]
async fn veth_into_netns_with_l3_config() {
    if !can_netns() {
        return;
    }
    let ns = TestNetns::new("knl");
    let host_name = unique("kvh");
    let _guard = HostLink(host_name.clone());
    let netns = NetNs::open(&ns.path()).unwrap();
    let host = Netlink::current().unwrap();
    host.create_veth(&host_name, "eth7", Some(netns.fd()), Some(1400))
        .await
        .unwrap();
    let hl = host.require_link(&host_name).await.unwrap();
    assert_eq!(hl.mtu, Some(1400));
    assert_eq!(hl.kind.as_deref(), Some("veth"));

    let pod = Netlink::in_netns(&netns).await.unwrap();
    let link = pod.require_link("eth7").await.unwrap();
    assert_eq!(link.mtu, Some(1400), "peer MTU is set in the same request");
    let mac: MacAddr = "fa:16:3e:12:34:56".parse().unwrap();
    pod.set_mac(link.index, mac).await.unwrap();
    pod.set_mtu(link.index, 1300).await.unwrap();
    pod.rename(link.index, "eth0").await.unwrap();
    pod.set_up(link.index).await.unwrap();
    let v4: IpPrefix = "10.77.0.5/24".parse().unwrap();
    let v6: IpPrefix = "fd00:77::5/64".parse().unwrap();
    pod.add_address(link.index, v4).await.unwrap();
    pod.add_address(link.index, v4)
        .await
        .expect("adding twice is not an error");
    pod.add_address(link.index, v6).await.unwrap();
    pod.add_route(&Route {
        destination: None,
        gateway: Some("10.77.0.1".parse().unwrap()),
        oif: link.index,
    })
    .await
    .unwrap();
    pod.add_route(&Route {
        destination: Some("10.78.0.0/16".parse().unwrap()),
        gateway: Some("10.77.0.254".parse().unwrap()),
        oif: link.index,
    })
    .await
    .unwrap();

    let got = pod.require_link("eth0").await.unwrap();
    assert_eq!(got.mac, Some(mac));
    assert_eq!(got.mtu, Some(1300));
    assert!(got.up);
    let addrs = pod.addresses(got.index).await.unwrap();
    assert!(addrs.contains(&v4), "{addrs:?}");
    assert!(addrs.contains(&v6), "{addrs:?}");
    let routes = ns.exec_ok(&["ip", "-4", "route"]);
    assert!(routes.contains("default via 10.77.0.1 dev eth0"), "{routes}");
    assert!(
        routes.contains("10.78.0.0/16 via 10.77.0.254 dev eth0"),
        "{routes}"
    );
    // The host namespace is untouched by the pod-side handle.
    assert!(
        host.link_by_name("eth0")
            .await
            .unwrap()
            .is_none_or(|l| l.index != got.index || l.kind.as_deref() != Some("veth"))
    );

    pod.del_address(got.index, v4).await.unwrap();
    assert!(!pod.addresses(got.index).await.unwrap().contains(&v4));
    pod.delete_link(got.index).await.unwrap();
    assert!(
        host.link_by_name(&host_name).await.unwrap().is_none(),
        "deleting one veth end removes the pair"
    );
}

#[tokio::test]
async fn bridge_master_macvlan_and_vlan() {
    if !can_netns() {
        return;
    }
    let ns = TestNetns::new("knl");
    let netns = NetNs::open(&ns.path()).unwrap();
    let host = Netlink::current().unwrap();
    let br = unique("kbr");
    let _g1 = HostLink(br.clone());
    let veth = unique("kvb");
    let _g2 = HostLink(veth.clone());
    host.create_bridge(&br).await.unwrap();
    assert!(matches!(host.create_bridge(&br).await, Err(e) if e.is_exists()));
    host.create_veth(&veth, &format!("{veth}p"), None, None)
        .await
        .unwrap();
    let b = host.require_link(&br).await.unwrap();
    let v = host.require_link(&veth).await.unwrap();
    host.set_master(v.index, b.index).await.unwrap();
    assert_eq!(host.require_link(&veth).await.unwrap().master, Some(b.index));

    // macvlan on the bridge, created straight inside the namespace.
    host.create_macvlan("mv0", b.index, Some(netns.fd()))
        .await
        .unwrap();
    let pod = Netlink::in_netns(&netns).await.unwrap();
    assert_eq!(
        pod.require_link("mv0").await.unwrap().kind.as_deref(),
        Some("macvlan")
    );

    // VLAN: works or reports a typed "kernel does not support" error.
    match host.create_vlan("vl0", b.index, 42, Some(netns.fd())).await {
        Ok(()) => assert!(pod.link_by_name("vl0").await.unwrap().is_some()),
        Err(NetlinkError::KernelUnsupported { what, .. }) => assert_eq!(what, "vlan"),
        Err(other) => panic!("unexpected VLAN error: {other}"),
    }

    let links = host.list_links().await.unwrap();
    assert!(links.iter().any(|l| l.name == br));
    assert!(matches!(
        host.require_link("kdoesnotexist").await,
        Err(NetlinkError::LinkNotFound(_))
    ));
    assert!(matches!(
        host.create_bridge("name-that-is-way-too-long").await,
        Err(NetlinkError::InvalidName(_))
    ));
}

#[test]
fn netns_open_rejects_regular_files() {
    let f = tempfile::NamedTempFile::new().unwrap();
    let err = NetNs::open(f.path().to_str().unwrap()).unwrap_err();
    assert!(err.to_string().contains("not a network namespace"), "{err}");
    assert!(NetNs::open("/nonexistent/ns").is_err());
}

#[test]
fn prefixes_and_macs_parse() {
    let p: IpPrefix = "10.1.2.3/16".parse().unwrap();
    assert_eq!(p.network().to_string(), "10.1.0.0/16");
    assert!(p.contains("10.1.99.1".parse().unwrap()));
    assert!(!p.contains("10.2.0.1".parse().unwrap()));
    assert!("10.1.2.3/33".parse::<IpPrefix>().is_err());
    assert!("10.1.2.3".parse::<IpPrefix>().is_err());
    let v6: IpPrefix = "fd00::1/0".parse().unwrap();
    assert_eq!(v6.network().to_string(), "::/0");
    let m: MacAddr = "FA:16:3E:00:00:01".parse().unwrap();
    assert_eq!(m.to_string(), "fa:16:3e:00:00:01");
    assert!("fa:16:3e:00:00".parse::<MacAddr>().is_err());
    assert!("fa:16:3e:00:00:01:02".parse::<MacAddr>().is_err());
}
