//! Property tests of the daemon's request parsing: arbitrary bodies never
//! panic, and every refusal names the field (or the body) that is wrong.

use kuryr_daemon::api::{CniParams, CniRequest, Command};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Map, Value, json};

/// A fixed seed and a budget that keeps this file well under 30 s in debug.
fn config() -> Config {
    Config {
        cases: 1024,
        rng_seed: RngSeed::Fixed(0x6b75_7279),
        failure_persistence: None,
        ..Config::default()
    }
}

const FIELDS: &[&str] = &[
    "request body",
    "CNI_IFNAME",
    "CNI_NETNS",
    "CNI_PATH",
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_ARGS",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_UID",
    "config_kuryr",
];

fn names_a_field(e: &str) -> bool {
    FIELDS.iter().any(|f| e.contains(f))
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "\\PC{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Strings near what the fields take: valid ones, edge cases and junk.
fn field_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9][a-z0-9.-]{0,20}",
        "/[a-z/.]{0,30}",
        "[ -~]{0,40}",
        "\\PC{0,40}",
    ]
}

fn cni_args() -> impl Strategy<Value = String> {
    let entry = prop_oneof![
        field_text().prop_map(|v| format!("K8S_POD_NAMESPACE={v}")),
        field_text().prop_map(|v| format!("K8S_POD_NAME={v}")),
        field_text().prop_map(|v| format!("K8S_POD_UID={v}")),
        "[A-Z_]{1,10}=[ -~]{0,10}",
        "[ -~]{0,12}",
    ];
    prop::collection::vec(entry, 0..5).prop_map(|v| v.join(";"))
}

/// A body with the CNI keys, each holding a plausible string or any JSON.
fn request_body() -> impl Strategy<Value = Value> {
    let text_or_any = || prop_oneof![4 => field_text().prop_map(Value::String), 1 => json_value()];
    (
        text_or_any(),
        text_or_any(),
        text_or_any(),
        text_or_any(),
        prop_oneof![4 => cni_args().prop_map(Value::String), 1 => json_value()],
        prop_oneof![Just(json!({})), json_value()],
    )
        .prop_map(|(ifname, netns, container, command, args, conf)| {
            json!({"CNI_IFNAME": ifname, "CNI_NETNS": netns, "CNI_CONTAINERID": container,
                "CNI_COMMAND": command, "CNI_ARGS": args, "config_kuryr": conf})
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_are_refused_with_a_reason(body in prop::collection::vec(any::<u8>(), 0..200)) {
        match CniParams::parse(&body) {
            Ok(p) => {
                for c in [Command::Add, Command::Del, Command::Check] {
                    if let Err(e) = p.validate(c) {
                        prop_assert!(names_a_field(&e.to_string()), "{e}");
                    }
                }
            }
            Err(e) => {
                prop_assert_eq!(e.code(), 4);
                prop_assert!(names_a_field(&e.to_string()), "{}", e);
            }
        }
    }

    #[test]
    fn every_refused_request_names_its_field(body in request_body()) {
        let raw = body.to_string();
        match CniParams::parse(raw.as_bytes()) {
            Ok(p) => {
                // What parses has checked names; validation names the field it refuses.
                prop_assert!(!p.key.namespace.is_empty() && !p.key.name.is_empty());
                for c in [Command::Add, Command::Del, Command::Check] {
                    if let Err(e) = p.validate(c) {
                        prop_assert_eq!(e.code(), 4);
                        prop_assert!(names_a_field(&e.to_string()), "{}", e);
                    }
                }
            }
            Err(e) => {
                prop_assert_eq!(e.code(), 4);
                prop_assert!(names_a_field(&e.to_string()), "{}: {}", raw, e);
            }
        }
        // The plain body parser (GC) agrees on what is a request.
        if let Err(e) = CniRequest::from_json(raw.as_bytes()) {
            prop_assert!(names_a_field(&e.to_string()), "{}", e);
        }
    }

    #[test]
    fn valid_requests_pass(
        ns in "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?",
        name in "[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?",
        ifname in "[a-z][a-z0-9]{0,14}",
        container in "[a-f0-9]{1,64}",
        uid in "[a-f0-9-]{0,36}",
    ) {
        prop_assume!(!name.contains("..") && !name.contains(".-") && !name.contains("-."));
        let body = json!({"CNI_IFNAME": ifname, "CNI_NETNS": "/var/run/netns/x", "CNI_CONTAINERID": container,
            "CNI_COMMAND": "ADD",
            "CNI_ARGS": format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID={uid}")});
        let p = CniParams::parse(body.to_string().as_bytes());
        prop_assert!(p.is_ok(), "{:?}", p.err());
        if let Ok(p) = p {
            prop_assert!(p.validate(Command::Add).is_ok());
            prop_assert_eq!(p.key.namespace, ns);
        }
    }
}
