//! Property tests of the os-vif VIF JSON reader (what KuryrPort status
//! carries): arbitrary JSON never panics, and a valid VIF with one value
//! replaced by anything either still reads or is refused naming that key.

use std::net::IpAddr;

use kuryr_crds::vif::{FixedIp, Network, ObjMeta, Subnet, Vif, VifBase, VifVlanNested};
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
        any::<f64>().prop_map(|f| json!(f)),
        "\\PC{0,16}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_.]{1,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn valid_vif() -> Value {
    let mut subnet = Subnet::new("10.0.0.0/24", Some(IpAddr::from([10, 0, 0, 1])));
    subnet.ips.objects.push(FixedIp::new(IpAddr::from([10, 0, 0, 5])));
    let mut net = Network::new("net-1");
    net.mtu = Some(1450);
    net.subnets.objects.push(subnet);
    let mut base = VifBase::new("18f968a5-c420-4318-92d7-941eb5f9e60e", "noop");
    base.network = Some(net);
    base.address = Some("fa:16:3e:00:00:01".into());
    Vif::VlanNested(VifVlanNested {
        base,
        vlan_id: 42,
        obj: ObjMeta::default(),
    })
    .to_primitive()
    .unwrap_or(Value::Null)
}

/// Every (object key, JSON pointer) of `v`.
fn keyed_paths(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push((k.clone(), p.clone()));
                keyed_paths(child, &p, out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                keyed_paths(child, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_json_never_panics(v in json_value()) {
        if let Err(e) = Vif::from_primitive(v) {
            prop_assert!(e.to_string().starts_with("invalid os-vif object"));
        }
    }

    #[test]
    fn a_bad_value_is_refused_naming_its_key(pick in any::<prop::sample::Index>(), value in json_value()) {
        let mut vif = valid_vif();
        let mut paths = Vec::new();
        keyed_paths(&vif, "", &mut paths);
        let (key, pointer) = pick.get(&paths).clone();
        if let Some(slot) = vif.pointer_mut(&pointer) {
            *slot = value;
        }
        if let Err(e) = Vif::from_primitive(vif) {
            let e = e.to_string();
            // The key itself, or the object whose envelope it belongs to.
            let named = e.contains(key.trim_start_matches("versioned_object."))
                || (key.starts_with("versioned_object.") && e.contains("versioned_object"));
            prop_assert!(named, "{} at {}: {}", key, pointer, e);
        }
    }
}

#[test]
fn the_fixture_reads_back() {
    assert!(Vif::from_primitive(valid_vif()).is_ok());
}
