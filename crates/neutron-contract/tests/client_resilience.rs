//! kuryr-neutron transport behaviour that needs a misbehaving server, using the emulator's fault injection:
//! 5xx retries with Retry-After on idempotent calls only, and the concurrency cap.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kuryr_neutron::{ClientOptions, ErrorKind, ListFilter, NeutronClient, PortCreate};
use neutron_emulator::{
    Emulator, EmulatorOptions, FaultConfig, FaultRule, LatencyProfile, LatencyTable, OpLatency,
};

fn rule(operation: &str, status: u16, retry_after: Option<u64>, max_count: u64) -> FaultRule {
    FaultRule {
        operation: operation.into(),
        rate: 0.0,
        every_nth: Some(1),
        status,
        retry_after_secs: retry_after,
        max_count: Some(max_count),
        after_commit: false,
    }
}

fn client(url: &str, max_concurrent: usize) -> NeutronClient {
    let mut o = ClientOptions::noauth(url);
    o.max_attempts = 4;
    o.retry_base_delay = Duration::from_millis(10);
    o.retry_max_delay = Duration::from_secs(2);
    o.max_concurrent_requests = max_concurrent;
    NeutronClient::new(&o).expect("client")
}

#[tokio::test]
async fn get_is_retried_on_503_honouring_retry_after() {
    let emu = Emulator::start(EmulatorOptions::default())
        .await
        .expect("emulator");
    emu.set_faults(FaultConfig {
        rules: vec![rule("port.list", 503, Some(1), 2)],
        ..FaultConfig::default()
    });
    let c = client(&emu.url(), 4);
    let t0 = Instant::now();
    let ports = c
        .list_ports(&ListFilter::new())
        .await
        .expect("third attempt succeeds");
    assert!(ports.is_empty());
    assert!(
        t0.elapsed() >= Duration::from_millis(1900),
        "Retry-After: 1 honoured twice, took {:?}",
        t0.elapsed()
    );
    assert_eq!(emu.stats().operations.get("port.list"), Some(&3));
    emu.shutdown().await;
}

#[tokio::test]
async fn post_is_not_retried_on_503() {
    let emu = Emulator::start(EmulatorOptions::default())
        .await
        .expect("emulator");
    emu.set_faults(FaultConfig {
        rules: vec![rule("port.create", 503, None, 1)],
        ..FaultConfig::default()
    });
    let c = client(&emu.url(), 4);
    let e = c
        .create_port(&PortCreate::new("00000000-0000-0000-0000-000000000000"))
        .await
        .expect_err("503");
    assert_eq!(e.kind(), Some(&ErrorKind::ServiceUnavailable));
    assert!(e.is_transient());
    assert_eq!(
        emu.stats().operations.get("port.create"),
        Some(&1),
        "a POST is sent once"
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn concurrency_cap_limits_in_flight_requests() {
    let emu = Emulator::start(EmulatorOptions {
        latency: LatencyProfile::Custom(LatencyTable {
            default: OpLatency {
                base_ms: 200,
                ..OpLatency::default()
            },
            ops: BTreeMap::new(),
        }),
        ..EmulatorOptions::default()
    })
    .await
    .expect("emulator");
    let c = client(&emu.url(), 2);
    let t0 = Instant::now();
    let calls = (0..6).map(|_| {
        let c = c.clone();
        async move { c.list_networks(&ListFilter::new()).await }
    });
    for r in futures::future::join_all(calls).await {
        r.expect("list");
    }
    // 6 calls of 200 ms through 2 slots take at least 3 rounds.
    assert!(
        t0.elapsed() >= Duration::from_millis(580),
        "cap not applied: {:?}",
        t0.elapsed()
    );
    emu.shutdown().await;
}
