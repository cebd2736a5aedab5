//! Upstream-shaped KuryrPort objects deserialize into the typed CRD.

use kube::ResourceExt;
use kuryr_crds::{KuryrPort, KuryrPortStatus, KuryrPortVif, Vif, names};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn upstream_kuryrport_v1_deserializes() -> Result<(), serde_json::Error> {
    let raw = fixture("kuryrport-v1.json");
    let kp: KuryrPort = serde_json::from_value(raw.clone())?;

    assert_eq!(kp.name_any(), "luis-pod");
    assert_eq!(kp.spec.pod_node_name, "k8s-node-1");
    assert_eq!(kp.spec.pod_uid, "7b1c0a6e-4a52-4a4e-9e55-0f6f1b2c3d4e");
    assert!(!kp.spec.pod_static);
    assert_eq!(
        kp.labels().get(names::labels::NODE_NAME).map(String::as_str),
        Some("k8s-node-1")
    );
    assert!(kp.finalizers().iter().any(|f| f == names::finalizers::KURYRPORT));

    let status = kp.status.as_ref().expect("status present");
    let (ifname, vif) = status.default_vif().expect("eth0 is default");
    assert_eq!(ifname, "eth0");
    assert!(matches!(vif, Vif::VlanNested(v) if v.vlan_id == 1346));
    assert_eq!(status.additional_vifs().count(), 0);
    assert!(status.all_active());

    // the whole object round-trips
    assert_eq!(serde_json::to_value(&kp)?, raw);
    Ok(())
}

#[test]
fn spec_without_pod_static_defaults_to_false() -> Result<(), serde_json::Error> {
    let mut raw = fixture("kuryrport-v1.json");
    raw["spec"]
        .as_object_mut()
        .expect("spec object")
        .remove("podStatic");
    raw.as_object_mut().expect("object").remove("status");
    let kp: KuryrPort = serde_json::from_value(raw)?;
    assert!(!kp.spec.pod_static);
    assert!(kp.status.is_none());
    Ok(())
}

#[test]
fn missing_pod_uid_is_rejected_naming_the_field() {
    let mut raw = fixture("kuryrport-v1.json");
    raw["spec"].as_object_mut().expect("spec object").remove("podUid");
    let err = serde_json::from_value::<KuryrPort>(raw)
        .err()
        .map(|e| e.to_string());
    assert!(err.as_deref().is_some_and(|e| e.contains("podUid")), "{err:?}");
}

#[test]
fn multiple_vifs_default_and_extra_keys() -> Result<(), serde_json::Error> {
    let raw = fixture("kuryrport-v1.json");
    let eth0 = raw["status"]["vifs"]["eth0"]["vif"].clone();
    let mut eth1 = eth0.clone();
    eth1["versioned_object.data"]["id"] = Value::String("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into());
    eth1["versioned_object.data"]["active"] = Value::Bool(false);
    let status_json = serde_json::json!({
        "vifs": {
            "eth1": {"default": false, "vif": eth1, "note": "kept"},
            "eth0": {"default": true, "vif": eth0},
        }
    });
    let status: KuryrPortStatus = serde_json::from_value(status_json.clone())?;
    assert_eq!(status.default_vif().map(|(n, _)| n), Some("eth0"));
    let extra: Vec<_> = status.additional_vifs().map(|(n, v)| (n, v.id())).collect();
    assert_eq!(extra, vec![("eth1", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")]);
    assert!(!status.all_active(), "eth1 is not active yet");
    assert_eq!(
        status
            .vifs
            .get("eth1")
            .and_then(|v: &KuryrPortVif| v.extra.get("note")),
        Some(&Value::String("kept".into()))
    );
    assert_eq!(serde_json::to_value(&status)?, status_json);
    Ok(())
}

#[test]
fn unsupported_vif_type_error_names_it() {
    let mut raw = fixture("kuryrport-v1.json");
    raw["status"]["vifs"]["eth0"]["vif"]["versioned_object.name"] = Value::String("VIFTap".into());
    let err = serde_json::from_value::<KuryrPort>(raw)
        .err()
        .map(|e| e.to_string());
    assert!(err.as_deref().is_some_and(|e| e.contains("VIFTap")), "{err:?}");
}
