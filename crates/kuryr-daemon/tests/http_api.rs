//! The daemon's HTTP servers under bad and hostile clients, over raw
//! sockets: every malformed request gets upstream's JSON error quickly (the
//! daemon waits 30 s for VIFs here, so a request that reached a wait would
//! miss the deadline), stalled connections do not lock out other clients or
//! the health probes, and the caps answer with JSON too.
#![allow(clippy::unwrap_used)]
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::other_netns;
use kuryr_daemon::server::{ServerLimits, Servers};
use kuryr_daemon::{ApiHealth, Daemon, DaemonConfig, NoEvents};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A generous bound on a hang, not a speed goal.
const DEADLINE: Duration = Duration::from_secs(1);

struct ApiUp;
#[async_trait]
impl ApiHealth for ApiUp {
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

fn config(limits: ServerLimits) -> DaemonConfig {
    let mut cfg = DaemonConfig::new("n1");
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    cfg.bind_address = local;
    cfg.health_address = local;
    cfg.metrics_address = local;
    cfg.vif_annotation_timeout = Duration::from_secs(30);
    cfg.limits = limits;
    cfg
}

fn test_limits() -> ServerLimits {
    ServerLimits {
        header_timeout: Duration::from_millis(300),
        body_timeout: Duration::from_millis(300),
        max_body_bytes: 64 * 1024,
        ..ServerLimits::default()
    }
}

async fn start(cfg: DaemonConfig) -> (Arc<Daemon>, Servers) {
    let d = Daemon::new(cfg, Arc::new(NoEvents), Arc::new(ApiUp));
    let s = kuryr_daemon::server::start(d.clone()).await.unwrap();
    (d, s)
}

/// A parsed answer: status, and the body as JSON when it is JSON.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Value,
    raw: String,
}

fn parse_answer(raw: &[u8]) -> Answer {
    let raw = String::from_utf8_lossy(raw).into_owned();
    let status = raw.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    Answer { status, body, raw }
}

/// Send `parts` (with a pause between them) and read the answer until the
/// server closes, within [`DEADLINE`].
async fn exchange(addr: SocketAddr, parts: &[&[u8]], half_close: bool) -> Answer {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).await.unwrap();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The server may answer (and close) before taking everything.
        if s.write_all(p).await.is_err() {
            break;
        }
    }
    if half_close {
        let _ = s.shutdown().await;
    }
    let mut out = Vec::new();
    let read = tokio::time::timeout(DEADLINE, async {
        let mut buf = [0u8; 8192];
        // A reset after the answer arrived still leaves the answer.
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(
        read.is_ok() && started.elapsed() < DEADLINE * 2,
        "no complete answer within {DEADLINE:?}: {:?}",
        String::from_utf8_lossy(&out)
    );
    parse_answer(&out)
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn cni(ifname: Value, netns: Value, container: Value, args: &str) -> String {
    json!({"CNI_COMMAND": "ADD", "CNI_IFNAME": ifname, "CNI_NETNS": netns, "CNI_CONTAINERID": container,
        "CNI_ARGS": args, "config_kuryr": {}})
    .to_string()
}

const ARGS: &str = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=0b5e6a9c-1f7e";
/// Exists everywhere, so only the field checks can refuse it (the daemon refuses its own namespace
/// after them: requests that must get further use [`other_netns`]).
const NETNS: &str = "/proc/self/ns/net";

fn add(ifname: &str, netns: &str, container: &str, args: &str) -> Vec<u8> {
    post(
        "/addNetwork",
        &cni(json!(ifname), json!(netns), json!(container), args),
    )
}

struct Case {
    name: &'static str,
    parts: Vec<Vec<u8>>,
    half_close: bool,
    status: u16,
    code: u64,
    /// In `details`: the field or limit the error names.
    names: &'static str,
}

fn case(name: &'static str, req: Vec<u8>, status: u16, code: u64, names: &'static str) -> Case {
    Case {
        name,
        parts: vec![req],
        half_close: false,
        status,
        code,
        names,
    }
}

fn cases() -> Vec<Case> {
    let big_header = format!(
        "POST /addNetwork HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let many_headers = format!(
        "POST /addNetwork HTTP/1.1\r\n{}\r\n",
        (0..100).map(|i| format!("X-H{i}: v\r\n")).collect::<String>()
    );
    let chunk = "a".repeat(8 * 1024);
    let chunked_body = format!(
        "POST /addNetwork HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{}0\r\n\r\n",
        (0..10)
            .map(|_| format!("2000\r\n{chunk}\r\n"))
            .collect::<String>()
    );
    let deep = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
    vec![
        // The HTTP layer.
        case("not HTTP", b"hello there\r\n\r\n".to_vec(), 400, 4, "HTTP"),
        case(
            "binary junk",
            b"\x00\x01\x02\xff\r\n\r\n".to_vec(),
            400,
            4,
            "HTTP",
        ),
        case(
            "HTTP/2 preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            400,
            4,
            "HTTP",
        ),
        case(
            "space in a header name",
            b"POST /addNetwork HTTP/1.1\r\nBad Header: x\r\n\r\n".to_vec(),
            400,
            4,
            "HTTP",
        ),
        case("unknown path", post("/nope", "{}"), 404, 4, "/nope"),
        case(
            "API health path",
            b"GET /alive HTTP/1.1\r\n\r\n".to_vec(),
            404,
            4,
            "/alive",
        ),
        case(
            "GET on ADD",
            b"GET /addNetwork HTTP/1.1\r\n\r\n".to_vec(),
            405,
            4,
            "GET",
        ),
        case(
            "DELETE on DEL",
            b"DELETE /delNetwork HTTP/1.1\r\n\r\n".to_vec(),
            405,
            4,
            "DELETE",
        ),
        case(
            "declared body too large",
            b"POST /addNetwork HTTP/1.1\r\nContent-Length: 10000000\r\n\r\n".to_vec(),
            413,
            4,
            "10000000",
        ),
        case(
            "chunked body too large",
            chunked_body.into_bytes(),
            413,
            4,
            "limit",
        ),
        case("head too large", big_header.into_bytes(), 431, 4, "head"),
        case("too many headers", many_headers.into_bytes(), 431, 4, "headers"),
        case(
            "Content-Length not a number",
            b"POST /addNetwork HTTP/1.1\r\nContent-Length: abc\r\n\r\n".to_vec(),
            400,
            4,
            "Content-Length",
        ),
        case(
            "Content-Length twice",
            b"POST /addNetwork HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}".to_vec(),
            400,
            4,
            "Content-Length",
        ),
        case(
            "Content-Length and chunked",
            b"POST /addNetwork HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}"
                .to_vec(),
            400,
            4,
            "Transfer-Encoding",
        ),
        case(
            "unknown transfer coding",
            b"POST /addNetwork HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
            400,
            4,
            "Transfer-Encoding",
        ),
        Case {
            half_close: true,
            ..case(
                "head cut short",
                b"POST /addNetwork HTTP/1.1\r\nHost".to_vec(),
                400,
                4,
                "ended",
            )
        },
        case(
            "head never ends",
            b"POST /addNetwork HTTP/1.1\r\n".to_vec(),
            408,
            11,
            "head",
        ),
        case(
            "body never ends",
            b"POST /addNetwork HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"CNI".to_vec(),
            408,
            11,
            "body",
        ),
        // The request body.
        case("empty body", post("/addNetwork", ""), 400, 4, "not JSON"),
        case(
            "body not JSON",
            post("/addNetwork", "CNI_IFNAME=eth0"),
            400,
            4,
            "not JSON",
        ),
        case(
            "body not UTF-8",
            b"POST /addNetwork HTTP/1.1\r\nContent-Length: 4\r\n\r\n\"\xff\xfe\"".to_vec(),
            400,
            4,
            "not JSON",
        ),
        case("nested too deep", post("/addNetwork", &deep), 400, 4, "not JSON"),
        case("body a list", post("/addNetwork", "[1,2]"), 400, 4, "JSON object"),
        case(
            "CNI_IFNAME a number",
            post("/addNetwork", &cni(json!(1), json!(NETNS), json!("c1"), ARGS)),
            400,
            4,
            "CNI_IFNAME must be a string",
        ),
        case(
            "config_kuryr a string",
            post(
                "/addNetwork",
                &json!({"CNI_ARGS": ARGS, "config_kuryr": "x"}).to_string(),
            ),
            400,
            4,
            "config_kuryr",
        ),
        case(
            "CNI_COMMAND unknown",
            post(
                "/addNetwork",
                &json!({"CNI_COMMAND": "ATTACH", "CNI_ARGS": ARGS}).to_string(),
            ),
            400,
            4,
            "CNI_COMMAND",
        ),
        case(
            "no namespace",
            add("eth0", NETNS, "c1", "K8S_POD_NAME=web-0"),
            400,
            4,
            "K8S_POD_NAMESPACE",
        ),
        case(
            "no pod name",
            add("eth0", NETNS, "c1", "K8S_POD_NAMESPACE=default"),
            400,
            4,
            "K8S_POD_NAME",
        ),
        case(
            "CNI_ARGS not K=V",
            add("eth0", NETNS, "c1", "garbage"),
            400,
            4,
            "CNI_ARGS",
        ),
        case(
            "namespace not a name",
            add(
                "eth0",
                NETNS,
                "c1",
                "K8S_POD_NAMESPACE=Default;K8S_POD_NAME=web-0",
            ),
            400,
            4,
            "K8S_POD_NAMESPACE",
        ),
        case(
            "pod name with a slash",
            add(
                "eth0",
                NETNS,
                "c1",
                "K8S_POD_NAMESPACE=default;K8S_POD_NAME=../web",
            ),
            400,
            4,
            "K8S_POD_NAME",
        ),
        case(
            "pod UID with a slash",
            add(
                "eth0",
                NETNS,
                "c1",
                "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=a/b",
            ),
            400,
            4,
            "K8S_POD_UID",
        ),
        case(
            "no CNI_IFNAME",
            add("", NETNS, "c1", ARGS),
            400,
            4,
            "CNI_IFNAME is missing",
        ),
        case(
            "CNI_IFNAME too long",
            add("eth0123456789abcdef", NETNS, "c1", ARGS),
            400,
            4,
            "CNI_IFNAME",
        ),
        case(
            "CNI_IFNAME with a slash",
            add("e/0", NETNS, "c1", ARGS),
            400,
            4,
            "CNI_IFNAME",
        ),
        case(
            "no CNI_NETNS",
            add("eth0", "", "c1", ARGS),
            400,
            4,
            "CNI_NETNS is missing",
        ),
        case(
            "CNI_NETNS relative",
            add("eth0", "netns/x", "c1", ARGS),
            400,
            4,
            "CNI_NETNS",
        ),
        case(
            "CNI_NETNS escapes",
            add("eth0", "/proc/../etc/passwd", "c1", ARGS),
            400,
            4,
            "CNI_NETNS",
        ),
        case(
            "CNI_NETNS does not exist",
            add("eth0", "/var/run/netns/kuryr-test-no-such-netns", "c1", ARGS),
            400,
            4,
            "CNI_NETNS",
        ),
        case(
            "no CNI_CONTAINERID",
            add("eth0", NETNS, "", ARGS),
            400,
            4,
            "CNI_CONTAINERID is missing",
        ),
        case(
            "CNI_CONTAINERID with a space",
            add("eth0", NETNS, "c 1", ARGS),
            400,
            4,
            "CNI_CONTAINERID",
        ),
        case(
            "DEL with a bad namespace",
            post(
                "/delNetwork",
                &json!({"CNI_ARGS": "K8S_POD_NAMESPACE=a_b;K8S_POD_NAME=p"}).to_string(),
            ),
            400,
            4,
            "K8S_POD_NAMESPACE",
        ),
        case(
            "DEL with a bad container ID",
            post(
                "/delNetwork",
                &json!({"CNI_ARGS": ARGS, "CNI_CONTAINERID": "c;rm"}).to_string(),
            ),
            400,
            4,
            "CNI_CONTAINERID",
        ),
        case(
            "CHECK without netns",
            post(
                "/checkNetwork",
                &cni(json!("eth0"), json!(null), json!("c1"), ARGS),
            ),
            400,
            4,
            "CNI_NETNS is missing",
        ),
        case(
            "GC without its valid attachments",
            post(
                "/gc",
                &json!({"config_kuryr": {"cniVersion": "1.1.0"}}).to_string(),
            ),
            400,
            4,
            "cni.dev/valid-attachments is missing",
        ),
        case(
            "GC without config_kuryr",
            post("/gc", "{}"),
            400,
            4,
            "cni.dev/valid-attachments is missing",
        ),
        case(
            "ADD into the daemon's own network namespace",
            add("eth0", NETNS, "c1", ARGS),
            400,
            4,
            "CNI_NETNS",
        ),
        case(
            "GC attachments not a list",
            post(
                "/gc",
                &json!({"config_kuryr": {"cni.dev/valid-attachments": "c1"}}).to_string(),
            ),
            400,
            4,
            "valid-attachments",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_request_gets_its_json_error_at_once() {
    let (d, s) = start(config(test_limits())).await;
    let cases = cases();
    assert!(cases.len() >= 30);
    let mut failures = Vec::new();
    for c in &cases {
        let parts: Vec<&[u8]> = c.parts.iter().map(Vec::as_slice).collect();
        let a = exchange(s.api, &parts, c.half_close).await;
        let details = a.body["details"].as_str().unwrap_or_default();
        let ok = a.status == c.status
            && a.body["code"].as_u64() == Some(c.code)
            && a.body["msg"].as_str().is_some_and(|m| !m.is_empty())
            && details.contains(c.names);
        if !ok {
            failures.push(format!(
                "{}: want {} code {} naming {:?}, got {}",
                c.name, c.status, c.code, c.names, a.raw
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Each turned-away request is counted by reason.
    let m = &d.metrics;
    assert_eq!(m.rejected("not_found"), 2);
    assert_eq!(m.rejected("method_not_allowed"), 2);
    assert_eq!(m.rejected("header_timeout"), 1);
    assert_eq!(m.rejected("body_timeout"), 1);
    assert_eq!(m.rejected("too_large"), 4);
    assert!(m.rejected("malformed") >= 9, "{}", m.encode());
    assert!(
        m.encode()
            .contains("kuryr_cni_rejected_requests_total{reason=\"too_large\"} 4")
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_and_metrics_servers_answer_json_errors_too() {
    let (_d, s) = start(config(test_limits())).await;
    let a = exchange(
        s.health,
        &[b"POST /alive HTTP/1.1\r\nContent-Length: 0\r\n\r\n"],
        false,
    )
    .await;
    assert_eq!((a.status, a.body["code"].as_u64()), (405, Some(4)), "{}", a.raw);
    let a = exchange(s.health, &[b"GET /nope HTTP/1.1\r\n\r\n"], false).await;
    assert_eq!((a.status, a.body["code"].as_u64()), (404, Some(4)), "{}", a.raw);
    let a = exchange(s.metrics, &[b"junk\r\n\r\n"], false).await;
    assert_eq!((a.status, a.body["code"].as_u64()), (400, Some(4)), "{}", a.raw);
    let a = exchange(s.health, &[b"GET /alive HTTP/1.1\r\n\r\n"], false).await;
    assert_eq!(a.status, 200, "{}", a.raw);
    s.shutdown().await;
}

/// A probe's answer: /alive must be 200; /ready 200 or the JSON "not ready".
async fn probes_answer(s: &Servers) {
    let a = exchange(s.health, &[b"GET /alive HTTP/1.1\r\n\r\n"], false).await;
    assert_eq!(a.status, 200, "{}", a.raw);
    let r = exchange(s.health, &[b"GET /ready HTTP/1.1\r\n\r\n"], false).await;
    assert!(
        r.status == 200 || (r.status == 503 && r.body["code"] == 50),
        "{}",
        r.raw
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_do_not_stop_other_clients_or_probes() {
    let limits = ServerLimits {
        max_connections: 64,
        // Only eviction frees a stalled client's slot here.
        header_timeout: Duration::from_secs(30),
        ..test_limits()
    };
    let (d, s) = start(config(limits)).await;
    assert_eq!(s.api_connections, 64);
    let mut stalled = Vec::new();
    for _ in 0..500 {
        let mut c = TcpStream::connect(s.api).await.unwrap();
        c.write_all(b"POST /delNetwork HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        stalled.push(c);
    }
    // Stalled clients on the health port as well.
    let mut stalled_probes = Vec::new();
    for _ in 0..100 {
        let mut c = TcpStream::connect(s.health).await.unwrap();
        c.write_all(b"GET /alive HTTP/1.1\r\n").await.unwrap();
        stalled_probes.push(c);
    }
    // A working client: a DEL of a pod the daemon never plugged is a no-op.
    let del = post(
        "/delNetwork",
        &json!({"CNI_ARGS": ARGS, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0"}).to_string(),
    );
    for _ in 0..3 {
        let a = exchange(s.api, &[&del], false).await;
        assert_eq!(a.status, 204, "{}", a.raw);
        probes_answer(&s).await;
    }
    // The oldest stalled clients made room, and were told why.
    assert!(
        d.metrics.rejected("evicted") >= 500 - 64,
        "{}",
        d.metrics.encode()
    );
    let mut first = stalled.swap_remove(0);
    let mut out = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, first.read_to_end(&mut out)).await;
    let a = parse_answer(&out);
    assert_eq!((a.status, a.body["code"].as_u64()), (408, Some(11)), "{}", a.raw);
    drop((stalled, stalled_probes));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_slots_are_answered_with_try_again_later() {
    let Some(other) = other_netns() else {
        return;
    };
    let limits = ServerLimits {
        max_connections: 8,
        max_concurrent_adds: 1,
        ..test_limits()
    };
    let mut cfg = config(limits);
    cfg.vif_annotation_timeout = Duration::from_millis(1500);
    let (d, s) = start(cfg).await;
    assert_eq!(s.api_connections, 8);
    // Eight ADDs waiting for VIFs that never come fill every slot.
    let mut conns = Vec::new();
    for i in 0..8 {
        let req = add(
            "eth0",
            other,
            &format!("c{i}"),
            &format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME=p{i}"),
        );
        let mut c = TcpStream::connect(s.api).await.unwrap();
        c.write_all(&req).await.unwrap();
        conns.push(c);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let a = exchange(s.api, &[&post("/status", "")], false).await;
    assert_eq!((a.status, a.body["code"].as_u64()), (503, Some(11)), "{}", a.raw);
    assert!(
        a.body["details"]
            .as_str()
            .unwrap_or_default()
            .contains("8 connections")
    );
    assert_eq!(d.metrics.rejected("connections"), 1);
    probes_answer(&s).await;
    // Only one of the eight holds an ADD slot; the others queue for it.
    let until = Instant::now() + Duration::from_secs(2);
    while d.metrics.adds_in_flight.get() == 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(d.metrics.adds_in_flight.get(), 1);
    // Every one is told to try again later: the slot holder when its VIFs
    // do not come, a waiter when no slot frees up in time.
    let mut answers = Vec::new();
    for mut c in conns {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        answers.push(parse_answer(&out));
    }
    assert!(
        answers.iter().all(|a| a.status == 504 && a.body["code"] == 11),
        "{answers:?}"
    );
    let busy = answers
        .iter()
        .filter(|a| {
            a.body["details"]
                .as_str()
                .unwrap_or_default()
                .contains("ADDs in flight")
        })
        .count();
    assert_eq!(d.metrics.rejected("adds_busy"), busy as u64);
    assert_eq!(d.metrics.adds_in_flight.get(), 0);
    s.shutdown().await;
}

#[tokio::test]
async fn the_api_stays_on_loopback_unless_allowed() {
    let mut cfg = config(test_limits());
    cfg.bind_address = SocketAddr::from(([0, 0, 0, 0], 0));
    let d = Daemon::new(cfg.clone(), Arc::new(NoEvents), Arc::new(ApiUp));
    let e = kuryr_daemon::server::start(d).await.err().map(|e| e.to_string());
    assert!(
        e.as_deref()
            .is_some_and(|e| e.contains("allow_non_loopback_bind") && e.contains("0.0.0.0")),
        "{e:?}"
    );
    cfg.limits.allow_non_loopback_bind = true;
    let (_d, s) = start(cfg).await;
    s.shutdown().await;
}

#[tokio::test]
async fn the_unix_socket_is_private_and_speaks_the_same_json() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let root = nix::unistd::geteuid().is_root();
    if root {
        // A set-group-id directory of another group: a socket created in it inherits that
        // group unless the daemon sets its owner.
        std::os::unix::fs::chown(dir.path(), None, Some(65534)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o2755)).unwrap();
    }
    let path = dir.path().join("daemon.sock");
    let mut cfg = config(test_limits());
    cfg.unix_socket = Some(path.clone());
    let (_d, s) = start(cfg).await;
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    if root {
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "the socket's owner:group");
    } else {
        eprintln!("not root: the socket's owner is not checked");
    }
    let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
    c.write_all(b"GET /nope HTTP/1.1\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(DEADLINE, c.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let a = parse_answer(&out);
    assert_eq!((a.status, a.body["code"].as_u64()), (404, Some(4)), "{}", a.raw);
    s.shutdown().await;
}

/// `/alive` fails once ADDs fail on the daemon's side `cni_failures_count` times in a row (the
/// kubelet then restarts it, as upstream's), and is alive again after a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alive_fails_after_consecutive_internal_failures() {
    let Some(other) = other_netns() else {
        return;
    };
    let mut cfg = config(test_limits());
    cfg.failures_before_restart = 2;
    let (d, s) = start(cfg).await;
    let key = kuryr_daemon::registry::PodKey::new("default", "web-0");
    // A KuryrPort that cannot be read: every ADD fails at once, on the daemon's side.
    d.registry.kuryrport_unreadable(&key, "not a KuryrPort");
    d.registry.pod_watch_started();
    let alive = || async { exchange(s.health, &[b"GET /alive HTTP/1.1\r\n\r\n"], false).await };
    for round in 0..2 {
        assert_eq!(alive().await.status, 200, "before failure {round}");
        let a = exchange(s.api, &[&add("eth0", other, "c1", ARGS)], false).await;
        assert_eq!(a.status, 500, "{}", a.raw);
    }
    let a = alive().await;
    assert_eq!(a.status, 500, "{}", a.raw);
    assert!(a.raw.contains("cni_failures_count = 2"), "{}", a.raw);
    // A bad request is the caller's: it neither counts nor clears.
    let a = exchange(s.api, &[&post("/addNetwork", "{}")], false).await;
    assert_eq!(a.status, 400, "{}", a.raw);
    assert_eq!(alive().await.status, 500);
    d.liveness.record(&Ok(()));
    assert_eq!(alive().await.status, 200, "a success starts the count again");
    s.shutdown().await;
}
