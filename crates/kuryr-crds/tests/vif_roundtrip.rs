//! VIF JSON round trips against upstream-produced objects.

use std::net::IpAddr;

use kuryr_crds::vif::{self, Vif};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn upstream_vlan_nested_vif_round_trips_exactly() -> Result<(), vif::VifError> {
    let raw = fixture("vif-vlan-nested.json");
    let vif = Vif::from_primitive(raw.clone())?;

    assert_eq!(vif.object_name(), "VIFVlanNested");
    assert_eq!(vif.id(), "18f968a5-c420-4318-92d7-941eb5f9e60e");
    assert_eq!(vif.vif_name(), "tap18f968a5-c4");
    assert_eq!(vif.vif_name(), vif::vif_name_for_port(vif.id()));
    assert_eq!(vif.address(), Some("fa:16:3e:bf:84:ff"));
    assert_eq!(vif.vlan_id(), Some(1346));
    assert!(vif.active());
    assert_eq!(vif.base().plugin, "noop");
    let net = vif.network().expect("seed VIF has a network");
    assert_eq!(net.id, "144164d9-8c21-4274-acec-43245de0aed0");
    assert_eq!(net.label.as_deref(), Some("ns/luis-net"));
    assert_eq!(net.mtu, Some(1350));
    assert_eq!(net.subnets.objects.len(), 1);
    let subnet = &net.subnets.objects[0];
    assert_eq!(subnet.cidr, "10.11.9.0/24");
    assert_eq!(subnet.parsed_cidr()?, (IpAddr::from([10, 11, 9, 0]), 24));
    assert_eq!(subnet.gateway, Some(IpAddr::from([10, 11, 9, 1])));
    assert!(subnet.routes.objects.is_empty());
    assert_eq!(
        vif.fixed_ips().map(|(_, ip)| ip).collect::<Vec<_>>(),
        vec![IpAddr::from([10, 11, 9, 5])]
    );

    assert_eq!(
        vif.to_primitive()?,
        raw,
        "re-serialization must be byte-equivalent JSON"
    );
    Ok(())
}

#[test]
fn unknown_data_fields_and_changes_survive() -> Result<(), vif::VifError> {
    let mut raw = fixture("vif-vlan-nested.json");
    raw["versioned_object.changes"] = serde_json::json!(["active", "id"]);
    raw["versioned_object.data"]["future_field"] = serde_json::json!({"x": 1});
    raw["versioned_object.data"]["network"]["versioned_object.data"]["bridge"] = serde_json::json!("br-int");
    raw["versioned_object.data"]["network"]["versioned_object.data"]["net_future"] = serde_json::json!(7);
    // a newer minor version of a nested object is accepted and kept
    raw["versioned_object.data"]["network"]["versioned_object.version"] = serde_json::json!("1.2");

    let vif = Vif::from_primitive(raw.clone())?;
    assert_eq!(
        vif.meta().changes.as_deref(),
        Some(&["active".to_owned(), "id".to_owned()][..])
    );
    assert_eq!(
        vif.base().extra.get("future_field"),
        Some(&serde_json::json!({"x": 1}))
    );
    assert_eq!(vif.network().and_then(|n| n.bridge.as_deref()), Some("br-int"));
    assert_eq!(vif.to_primitive()?, raw);
    Ok(())
}

#[test]
fn subnet_without_gateway_parses() -> Result<(), vif::VifError> {
    let mut raw = fixture("vif-vlan-nested.json");
    let subnet = &mut raw["versioned_object.data"]["network"]["versioned_object.data"]["subnets"]["versioned_object.data"]
        ["objects"][0]["versioned_object.data"];
    subnet
        .as_object_mut()
        .expect("subnet data is an object")
        .remove("gateway");
    let vif = Vif::from_primitive(raw.clone())?;
    assert_eq!(vif.network().map(|n| n.subnets.objects[0].gateway), Some(None));
    assert_eq!(vif.to_primitive()?, raw);
    Ok(())
}

#[test]
fn changing_a_field_changes_only_that_field() -> Result<(), vif::VifError> {
    let raw = fixture("vif-vlan-nested.json");
    let mut vif = Vif::from_primitive(raw.clone())?;
    vif.base_mut().active = false;
    let mut expected = raw;
    expected["versioned_object.data"]["active"] = Value::Bool(false);
    assert_eq!(vif.to_primitive()?, expected);
    Ok(())
}
