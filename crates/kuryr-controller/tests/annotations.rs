//! Property tests of the annotation parsers (user input on pods, namespaces and
//! NetworkAttachmentDefinitions): arbitrary values never panic, and every refusal is an
//! InvalidInput naming the annotation (and the element) at fault.
#![allow(clippy::unwrap_used)]

use kuryr_controller::Error;
use kuryr_controller::drivers::multi_vif::{additional_subnets, npwg, specific_ports};
use kuryr_controller::placement::{AFFINITY_ANNOTATION, parse_affinity};
use kuryr_crds::names::annotations::{ADDITIONAL_SUBNETS, NAD_KURYR_CONFIG, NPWG_NETWORKS, SPEC_PORTS};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Map, Value, json};

/// A fixed seed and a budget that keeps the file well under 30 s in debug.
fn config() -> Config {
    Config {
        cases: 1024,
        rng_seed: RngSeed::Fixed(0x6b75_7279),
        failure_persistence: None,
        ..Config::default()
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "\\PC{0,16}".prop_map(Value::String),
        "[a-z0-9-]{1,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("name".to_string()),
                    Just("namespace".to_string()),
                    Just("interface".to_string()),
                    Just("ips".to_string()),
                    Just("mac".to_string()),
                    "[a-z]{1,8}"
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Text or JSON, as an annotation value can be anything.
fn raw() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,60}",
        "[a-z0-9/@,. =-]{0,60}",
        json_value().prop_map(|v| v.to_string()),
    ]
}

fn names(e: &Error, annotation: &str) -> bool {
    matches!(e, Error::InvalidInput { field, .. } if field.starts_with(annotation))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn npwg_networks(raw in raw()) {
        if let Err(e) = npwg::parse(&raw) {
            prop_assert!(names(&e, NPWG_NETWORKS), "{raw:?}: {e:?}");
        }
    }

    #[test]
    fn additional_subnets(raw in raw()) {
        if let Err(e) = additional_subnets::parse(&raw) {
            prop_assert!(names(&e, ADDITIONAL_SUBNETS), "{raw:?}: {e:?}");
        }
    }

    #[test]
    fn spec_ports(raw in raw()) {
        match specific_ports::parse(&raw) {
            Ok(ids) => prop_assert!(ids.iter().all(|i| !i.is_empty() && i.trim() == i)),
            Err(e) => prop_assert!(names(&e, SPEC_PORTS), "{raw:?}: {e:?}"),
        }
    }

    #[test]
    fn resource_affinity(raw in raw()) {
        match parse_affinity(&raw) {
            Ok(m) => prop_assert!(m.keys().all(|k| !k.is_empty())),
            Err(e) => prop_assert!(names(&e, AFFINITY_ANNOTATION), "{raw:?}: {e:?}"),
        }
    }

    #[test]
    fn nad_kuryr_config(raw in raw()) {
        let nad: kuryr_crds::NetworkAttachmentDefinition = serde_json::from_value(json!({
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "net-a", "namespace": "default", "annotations": {NAD_KURYR_CONFIG: raw}},
            "spec": {}
        }))
        .unwrap();
        if let Err(e) = nad.kuryr_config() {
            let e = e.to_string();
            prop_assert!(e.contains(NAD_KURYR_CONFIG) && e.contains("default/net-a"), "{e}");
        }
    }
}

#[test]
fn malformed_affinity_is_refused_not_dropped() {
    assert_eq!(
        parse_affinity(" zone = a , rack=b,")
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        vec![("rack".into(), "b".into()), ("zone".into(), "a".into())]
    );
    let e = parse_affinity("zone=a,rack").unwrap_err();
    assert!(names(&e, &format!("{AFFINITY_ANNOTATION}[1]")), "{e:?}");
}
