//! VIF JSON produced by upstream kuryr-kubernetes 10.0.0 itself (see
//! `fixtures/upstream/generate.py`), and VIF JSON built by kuryr-rs that upstream's os-vif
//! accepts (`fixtures/upstream/check_kuryr_rs_built.py`).

use std::net::IpAddr;

use kuryr_crds::vif::{
    FixedIp, Network, ObjMeta, PortProfile, Route, Subnet, Vif, VifBase, VifOpenVSwitch, VifVlanNested,
};
use kuryr_crds::{KuryrPortStatus, KuryrPortVif, names};
use serde_json::Value;

fn fixture_path(name: &str) -> String {
    format!("{}/tests/fixtures/upstream/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> Value {
    let path = fixture_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn every_upstream_vif_round_trips_exactly() -> Result<(), Box<dyn std::error::Error>> {
    for (file, type_name) in [
        ("vif-ovs.json", "VIFOpenVSwitch"),
        ("vif-ovs-hybrid.json", "VIFBridge"),
        ("vif-vlan-nested.json", "VIFVlanNested"),
        ("vif-macvlan-nested.json", "VIFMacvlanNested"),
    ] {
        let raw = fixture(file);
        let vif = Vif::from_primitive(raw.clone()).map_err(|e| format!("{file}: {e}"))?;
        assert_eq!(vif.object_name(), type_name, "{file}");
        assert_eq!(vif.to_primitive()?, raw, "{file} must re-serialize identically");
        // Nothing upstream wrote fell into the catch-all: the model names every field.
        assert!(vif.base().extra.is_empty(), "{file}: {:?}", vif.base().extra);
    }
    Ok(())
}

#[test]
fn upstream_ovs_vif_fields() -> Result<(), Box<dyn std::error::Error>> {
    let vif = Vif::from_primitive(fixture("vif-ovs.json"))?;
    let Vif::OpenVSwitch(ovs) = &vif else {
        return Err(format!("expected VIFOpenVSwitch, got {vif}").into());
    };
    assert_eq!(ovs.bridge_name.as_deref(), Some("br-int"));
    assert_eq!(ovs.base.plugin, "ovs");
    assert!(ovs.base.has_traffic_filtering);
    assert_eq!(ovs.base.vif_name, kuryr_crds::vif_name_for_port(&ovs.base.id));
    let profile = ovs.base.port_profile.as_ref().ok_or("port_profile missing")?;
    assert_eq!(profile.interface_id(), Some(ovs.base.id.as_str()));
    let net = vif.network().ok_or("network missing")?;
    assert_eq!(net.bridge.as_deref(), Some("br-int"));
    assert_eq!(net.mtu, Some(1450));
    let subnets = &net.subnets.objects;
    assert_eq!(subnets.len(), 2);
    let v4 = &subnets[0];
    assert_eq!(v4.dns, vec![IpAddr::from([10, 0, 0, 53])]);
    assert_eq!(v4.routes.objects.len(), 1);
    assert_eq!(v4.routes.objects[0].cidr, "192.168.0.0/16");
    assert_eq!(v4.routes.objects[0].gateway, Some(IpAddr::from([10, 11, 9, 254])));
    let v6 = &subnets[1];
    assert_eq!(v6.gateway, None, "IPv6 subnet has no gateway upstream");
    let ips: Vec<String> = vif.fixed_ips().map(|(_, ip)| ip.to_string()).collect();
    assert_eq!(ips, vec!["10.11.9.5", "fd00:10:11::5"]);
    Ok(())
}

#[test]
fn upstream_hybrid_vif_is_inactive_bridge() -> Result<(), Box<dyn std::error::Error>> {
    let vif = Vif::from_primitive(fixture("vif-ovs-hybrid.json"))?;
    let Vif::Bridge(br) = &vif else {
        return Err(format!("expected VIFBridge, got {vif}").into());
    };
    assert!(!br.base.active, "port status DOWN gives active=false");
    assert_eq!(br.bridge_name.as_deref(), Some("qbr2a1b2c3d-11"));
    Ok(())
}

#[test]
fn upstream_kuryrport_status_parses_and_round_trips() -> Result<(), Box<dyn std::error::Error>> {
    let raw = fixture("kuryrport-status.json");
    let status: KuryrPortStatus = serde_json::from_value(raw.clone())?;
    let (ifname, eth0) = status.default_vif().ok_or("no default VIF")?;
    assert_eq!(ifname, names::DEFAULT_IFNAME);
    assert_eq!(eth0.vlan_id(), Some(1346));
    let extra: Vec<_> = status
        .additional_vifs()
        .map(|(n, v)| (n, v.object_name()))
        .collect();
    assert_eq!(extra, vec![("eth1", "VIFMacvlanNested")]);
    assert_eq!(serde_json::to_value(&status)?, raw);
    Ok(())
}

/// What the kuryr-rs controller builds for a bare-metal OVS port, the way upstream's
/// `neutron_to_osvif_vif_ovs` does.
fn kuryr_rs_built_status() -> KuryrPortStatus {
    let port_id = "18f968a5-c420-4318-92d7-941eb5f9e60e";
    let mut v4 = Subnet::new("10.11.9.0/24", Some(IpAddr::from([10, 11, 9, 1])));
    v4.dns.push(IpAddr::from([10, 0, 0, 53]));
    v4.routes
        .objects
        .push(Route::new("192.168.0.0/16", Some(IpAddr::from([10, 11, 9, 254]))));
    v4.ips.objects.push(FixedIp::new(IpAddr::from([10, 11, 9, 5])));
    let mut v6 = Subnet::new("fd00:10:11::/64", None);
    v6.ips
        .objects
        .push(FixedIp::new(IpAddr::from([0xfd00, 0x10, 0x11, 0, 0, 0, 0, 5])));
    let mut net = Network::new("144164d9-8c21-4274-acec-43245de0aed0");
    net.label = Some("ns/luis-net".into());
    net.mtu = Some(1450);
    net.bridge = Some("br-int".into());
    net.subnets.objects = vec![v4, v6];

    let mut base = VifBase::new(port_id, "ovs");
    base.address = Some("fa:16:3e:bf:84:ff".into());
    base.active = true;
    base.has_traffic_filtering = true;
    base.network = Some(net.clone());
    base.port_profile = Some(PortProfile::open_vswitch(port_id));
    let ovs = Vif::OpenVSwitch(VifOpenVSwitch {
        base,
        bridge_name: Some("br-int".into()),
        obj: ObjMeta::default(),
    });

    let nested_id = "3b1b2c3d-1111-4222-8333-944455556666";
    let mut base = VifBase::new(nested_id, names::OS_VIF_NOOP_PLUGIN);
    base.address = Some("fa:16:3e:bf:84:00".into());
    base.network = Some(net);
    let vlan = Vif::VlanNested(VifVlanNested {
        base,
        vlan_id: 1346,
        obj: ObjMeta::default(),
    });

    let mut status = KuryrPortStatus::default();
    status.vifs.insert("eth0".into(), KuryrPortVif::new(true, ovs));
    status.vifs.insert("eth1".into(), KuryrPortVif::new(false, vlan));
    status
}

/// The committed file is what `check_kuryr_rs_built.py` feeds to upstream's os-vif; this test
/// keeps it equal to what the Rust model produces. `KURYR_CRDS_BLESS=1` rewrites it.
#[test]
fn kuryr_rs_built_vifs_match_the_file_upstream_checked() -> Result<(), Box<dyn std::error::Error>> {
    let built = serde_json::to_value(kuryr_rs_built_status())?;
    let path = fixture_path("kuryr-rs-built-status.json");
    if std::env::var_os("KURYR_CRDS_BLESS").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&built)? + "\n")?;
    }
    assert_eq!(
        built,
        fixture("kuryr-rs-built-status.json"),
        "Rust-built VIF JSON changed: rerun with KURYR_CRDS_BLESS=1 and re-check with \
         fixtures/upstream/check_kuryr_rs_built.py"
    );
    Ok(())
}
