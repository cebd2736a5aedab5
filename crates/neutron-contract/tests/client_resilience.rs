//! kuryr-neutron transport behaviour that needs a misbehaving server, using the emulator's fault injection:
//! 5xx retries with Retry-After on idempotent calls only, connection resets (retried for idempotent calls, never
//! for a port create, whose outcome is then reported as unknown), and the concurrency cap.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kuryr_neutron::{
    CallRecord, ClientOptions, Error, ErrorKind, ListFilter, NetworkCreate, NeutronClient, PortCreate,
};
use neutron_emulator::{
    Emulator, EmulatorOptions, FaultConfig, FaultRule, LatencyProfile, LatencyTable, OpLatency, Outage,
    OutageMode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn rule(operation: &str, status: u16, retry_after: Option<u64>, max_count: u64) -> FaultRule {
    FaultRule {
        operation: operation.into(),
        rate: 0.0,
        every_nth: Some(1),
        status,
        retry_after_secs: retry_after,
        max_count: Some(max_count),
        after_commit: false,
        delay_ms: 0,
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

/// Attempts per operation, as the client reports them to its metrics hook.
type Attempts = Arc<Mutex<Vec<(String, u32)>>>;

fn client_with_attempts(url: &str, max_attempts: u32) -> (NeutronClient, Attempts) {
    let mut o = ClientOptions::noauth(url);
    o.max_attempts = max_attempts;
    o.retry_base_delay = Duration::from_millis(100);
    o.retry_max_delay = Duration::from_millis(400);
    let seen: Attempts = Arc::default();
    let s2 = seen.clone();
    let c = NeutronClient::with_metrics(
        &o,
        Arc::new(move |c: &CallRecord<'_>| {
            if let Ok(mut v) = s2.lock() {
                v.push((c.operation.to_owned(), c.attempts));
            }
        }),
    )
    .expect("client");
    (c, seen)
}

/// A port create that failed on the connection: the caller cannot know whether the port exists.
fn assert_create_port_outcome_unknown(e: &Error) {
    assert!(
        matches!(
            e,
            Error::Connection {
                operation: "create_port",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.outcome_unknown(), "{e:?}");
}

fn attempts_of(seen: &Attempts, op: &str) -> Vec<u32> {
    seen.lock()
        .expect("metrics")
        .iter()
        .filter(|(o, _)| o == op)
        .map(|(_, a)| *a)
        .collect()
}

async fn reset_emulator() -> neutron_emulator::EmulatorHandle {
    // connection_close (like uWSGI): every request opens a new connection, so every request meets the outage.
    Emulator::start(EmulatorOptions {
        connection_close: true,
        ..EmulatorOptions::default()
    })
    .await
    .expect("emulator")
}

#[tokio::test]
async fn reset_connections_retry_a_list_but_never_a_port_create() {
    let emu = reset_emulator().await;
    let (c, seen) = client_with_attempts(&emu.url(), 10);
    let net = c
        .create_network(&NetworkCreate {
            name: Some("reset".into()),
            ..NetworkCreate::default()
        })
        .await
        .expect("network");

    // A short outage: the list is retried with backoff until the server accepts connections again.
    emu.set_faults(FaultConfig {
        outage: Some(Outage {
            mode: OutageMode::Reset,
            duration_ms: Some(300),
        }),
        ..FaultConfig::default()
    });
    let t0 = Instant::now();
    c.list_ports(&ListFilter::new())
        .await
        .expect("list retried past the outage");
    let tries = attempts_of(&seen, "list_ports");
    assert!(
        tries.len() == 1 && tries[0] >= 2,
        "list_ports attempts {tries:?} after {:?}",
        t0.elapsed()
    );
    assert_eq!(
        emu.stats().count("port.list"),
        1,
        "only the last attempt got through"
    );

    // During an outage a POST is sent once and the error says its outcome is unknown.
    emu.set_faults(FaultConfig {
        outage: Some(Outage {
            mode: OutageMode::Reset,
            duration_ms: None,
        }),
        ..FaultConfig::default()
    });
    let e = c.create_port(&PortCreate::new(&net.id)).await.expect_err("reset");
    assert_create_port_outcome_unknown(&e);
    assert!(e.to_string().contains("may have been applied"), "{e}");
    assert_eq!(attempts_of(&seen, "create_port"), vec![1], "a POST is not resent");
    // An idempotent call that fails for good is not "unknown": repeating it is harmless.
    let (short, _) = client_with_attempts(&emu.url(), 2);
    let e = short.list_ports(&ListFilter::new()).await.expect_err("outage");
    assert!(e.is_transient() && !e.outcome_unknown(), "{e:?}");
    emu.shutdown().await;
}

/// Forwards each request to `upstream`, lets it complete there, then resets the client's connection instead of
/// answering: the case where a create took effect but its answer was lost.
async fn answer_losing_proxy(upstream: SocketAddr) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 8192];
                // Headers, then Content-Length bytes of body.
                let body_start = loop {
                    let Ok(n) = client.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                    if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&req[..body_start]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while req.len() < body_start + len {
                    let Ok(n) = client.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                }
                let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                if up.write_all(&req).await.is_err() {
                    return;
                }
                // The emulator closes after its answer (connection_close): read it all, then throw it away.
                let mut answer = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(5), up.read_to_end(&mut answer)).await;
                let _ = client.set_zero_linger();
                drop(client);
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_create_whose_answer_is_lost_is_reported_once_and_not_duplicated() {
    let emu = reset_emulator().await;
    let direct = client(&emu.url(), 4);
    let net = direct
        .create_network(&NetworkCreate {
            name: Some("lost-answer".into()),
            ..NetworkCreate::default()
        })
        .await
        .expect("network");
    let proxy = answer_losing_proxy(emu.addr()).await;
    let (c, seen) = client_with_attempts(&format!("http://{proxy}"), 4);
    let e = c
        .create_port(&PortCreate {
            name: Some("lost-answer-port".into()),
            ..PortCreate::new(&net.id)
        })
        .await
        .expect_err("answer lost");
    assert_create_port_outcome_unknown(&e);
    assert_eq!(attempts_of(&seen, "create_port"), vec![1], "not resent");
    // The port does exist: exactly one, which the caller can find by name/tags (or the tag sweep removes).
    assert_eq!(emu.stats().count("port.create"), 1);
    let ports = direct
        .list_ports(&ListFilter::new().name("lost-answer-port"))
        .await
        .expect("list");
    assert_eq!(ports.len(), 1, "{ports:?}");
    // An idempotent GET through the same answer-losing path is retried (and fails for good here).
    let e = c.list_ports(&ListFilter::new()).await.expect_err("answers lost");
    assert!(!e.outcome_unknown(), "{e:?}");
    assert_eq!(attempts_of(&seen, "list_ports"), vec![4]);
    emu.shutdown().await;
}
