//! Property tests of what the plugin reads from outside: the CNI
//! environment, the network configuration on stdin, the daemon's HTTP
//! answers and its ADD body. Arbitrary input never panics; refusals carry a
//! CNI code and a message naming what is wrong.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Map, Value, json};

use crate::cni::{self, Env, code};
use crate::http::{Endpoint, parse_response};

/// A fixed seed and a budget that keeps the file well under 30 s in debug.
fn config() -> Config {
    Config {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x6b75_7279),
        failure_persistence: None,
        ..Config::default()
    }
}

/// Nothing listens here: a request that gets as far as the daemon fails at
/// once with "try again later" instead of reaching a real daemon.
const NO_DAEMON: &str = "unix:///nonexistent/kuryr-proptest.sock";

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
            prop::collection::btree_map("[a-z_.]{1,10}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop_oneof!["[ -~]{0,20}", "\\PC{0,20}"])
}

fn env() -> impl Strategy<Value = Env> {
    (
        prop::option::of(prop_oneof![
            Just("ADD".to_string()),
            Just("DEL".to_string()),
            Just("CHECK".to_string()),
            Just("STATUS".to_string()),
            Just("GC".to_string()),
            Just("VERSION".to_string()),
            "[A-Za-z]{0,8}",
        ]),
        opt_text(),
        opt_text(),
        opt_text(),
        opt_text(),
        opt_text(),
    )
        .prop_map(|(command, container_id, netns, ifname, args, path)| Env {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
}

/// A network configuration: mostly well-formed keys with any values.
fn netconf() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just(json!("1.1.0")),
            Just(json!("0.3.1")),
            Just(json!("0.4.0")),
            json_value()
        ],
        prop_oneof![3 => Just(json!(NO_DAEMON)), 1 => json_value()],
        prop::option::of(json_value()),
        prop::option::of(json_value()),
    )
        .prop_map(|(version, daemon, timeout, extra)| {
            let mut m = Map::new();
            m.insert("cniVersion".into(), version);
            m.insert("type".into(), json!("kuryr-cni"));
            // Anything that reaches the daemon must not wait long for it.
            m.insert(
                "kuryr_daemon".into(),
                if daemon.is_string() {
                    daemon
                } else {
                    json!(NO_DAEMON)
                },
            );
            if let Some(t) = timeout {
                m.insert("kuryr_daemon_timeout".into(), t);
            } else {
                m.insert("kuryr_daemon_timeout".into(), json!(1));
            }
            if let Some(e) = extra {
                m.insert("args".into(), e);
            }
            Value::Object(m)
        })
}

/// What an error message must mention to say what is wrong.
const NAMES: &[&str] = &[
    "stdin",
    "network configuration",
    "cniVersion",
    "CNI version",
    "kuryr_daemon",
    "CNI_",
    "Try Again Later",
    "daemon",
];

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_stdin_never_panics(env in env(), stdin in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Err(e) = cni::run(&env, &stdin) {
            prop_assert!(!e.msg.is_empty());
            prop_assert!(NAMES.iter().any(|n| e.msg.contains(n)), "{:?}", e);
        }
    }

    #[test]
    fn every_refusal_names_what_is_wrong(env in env(), conf in netconf()) {
        let stdin = conf.to_string();
        match cni::run(&env, stdin.as_bytes()) {
            // Only VERSION answers without the daemon.
            Ok(out) => prop_assert_eq!(env.command.as_deref(), Some("VERSION"), "{:?}", out),
            Err(e) => {
                prop_assert!(NAMES.iter().any(|n| e.msg.contains(n)), "{:?}", e);
                prop_assert!(e.code != 0);
                let j = e.to_json();
                prop_assert!(j["code"].is_u64() && j["msg"].is_string());
                if e.code == code::TRY_AGAIN_LATER {
                    prop_assert!(e.details.contains("kuryr-proptest.sock"), "{:?}", e);
                }
            }
        }
    }

    #[test]
    fn any_daemon_body_gives_a_result_or_a_reason(body in json_value(), env in env()) {
        for v in ["0.3.1", "1.1.0"] {
            if let Err(e) = cni::cni_result(&body, &env, v) {
                prop_assert!(!e.is_empty());
            }
        }
    }

    #[test]
    fn any_http_answer_parses_or_is_refused(raw in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse_response(&raw);
    }

    #[test]
    fn http_answers_with_any_chunk_sizes(size in "[0-9a-fA-F]{1,20}", rest in "[ -~]{0,40}") {
        let raw = format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\n{rest}");
        let _ = parse_response(raw.as_bytes());
        let raw = format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n{rest}");
        let _ = parse_response(raw.as_bytes());
    }

    #[test]
    fn any_daemon_address_parses_or_names_the_option(s in "\\PC{0,40}") {
        if let Err(e) = Endpoint::parse(&s) {
            prop_assert!(e.contains("kuryr_daemon"), "{}", e);
        }
    }
}

#[test]
fn a_chunk_size_near_the_top_of_usize_is_refused() {
    let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab";
    assert!(parse_response(raw).is_err_and(|e| e.to_string().contains("too large")));
}
