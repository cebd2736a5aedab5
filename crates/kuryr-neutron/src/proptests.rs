//! Property tests of what the clients read from Neutron and Octavia error
//! answers: any body, status and `Retry-After` never panics, and the error
//! always names the operation and the status it came from.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use serde_json::json;

use crate::octavia::OctaviaApiError;
use crate::transport::{MAX_RETRY_AFTER, Service, StatusFailure, retry_after};

/// A fixed seed and a budget that keeps the file well under 30 s in debug.
fn config() -> Config {
    Config {
        cases: 1024,
        rng_seed: RngSeed::Fixed(0x6b75_7279),
        failure_persistence: None,
        ..Config::default()
    }
}

fn failure(status: u16, body: Vec<u8>) -> StatusFailure {
    StatusFailure {
        operation: "create_port",
        status,
        request_id: Some("req-1".into()),
        retry_after: None,
        body,
    }
}

/// Bodies: random bytes, NeutronError / WSME fault shapes with any values.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let any_json = prop_oneof![
        Just(json!(null)),
        any::<i64>().prop_map(|n| json!(n)),
        "\\PC{0,40}".prop_map(|s| json!(s)),
        Just(json!({})),
        Just(json!([1, 2])),
    ];
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..400),
        (any_json.clone(), any_json.clone(), any_json.clone()).prop_map(|(t, m, d)| {
            json!({"NeutronError": {"type": t, "message": m, "detail": d}})
                .to_string()
                .into_bytes()
        }),
        (any_json.clone(), any_json.clone(), any_json).prop_map(|(c, s, d)| {
            json!({"faultcode": c, "faultstring": s, "debuginfo": d})
                .to_string()
                .into_bytes()
        }),
        "\\PC{0,2000}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn neutron_errors_name_operation_and_status(status in 100u16..1000, body in body()) {
        let not_json = serde_json::from_slice::<serde_json::Value>(&body).is_err();
        let e = <crate::client::Neutron as Service>::api_error(failure(status, body));
        let text = e.to_string();
        prop_assert!(text.contains("create_port") && text.contains(&status.to_string()), "{}", text);
        let api = e.api();
        prop_assert!(api.is_some_and(|a| a.status == status));
        // A body that is not JSON (an HTML error page) is kept short in logs.
        if not_json {
            prop_assert!(api.is_some_and(|a| a.message.chars().count() <= 300));
        }
    }

    #[test]
    fn octavia_errors_name_operation_and_status(status in 100u16..1000, body in body()) {
        let a = OctaviaApiError::from_failure(failure(status, body));
        let text = a.to_string();
        prop_assert!(text.contains("create_port") && text.contains(&status.to_string()), "{}", text);
        prop_assert_eq!(a.status, status);
    }

    #[test]
    fn retry_after_is_bounded(v in prop_oneof!["[0-9]{1,25}", "[ -~]{0,20}"]) {
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(RETRY_AFTER, v);
        }
        if let Some(d) = retry_after(&h) {
            prop_assert!(d <= MAX_RETRY_AFTER);
            // What callers do with it cannot overflow.
            prop_assert!(Duration::from_secs(u64::from(u32::MAX)).checked_add(d).is_some());
        }
    }
}

#[test]
fn a_huge_retry_after_is_capped() {
    let mut h = HeaderMap::new();
    h.insert(RETRY_AFTER, HeaderValue::from_static("18446744073709551615"));
    assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
}
