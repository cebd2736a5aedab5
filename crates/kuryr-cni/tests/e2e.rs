//! The real plugin binary, run as a container runtime runs it (env + stdin),
//! against real in-process daemons on two emulated nodes: each node is a
//! network namespace with a Linux bridge, the nodes' bridges are joined by a
//! veth, and each daemon runs on a runtime whose threads live in its node's
//! namespace (so its "host side" is the node). Plugin and daemons talk over
//! unix sockets, which cross namespaces.
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use kuryr_daemon::registry::PodKey;
use kuryr_daemon::testing::{VifFixture, kuryrport};
use kuryr_daemon::{ApiHealth, Daemon, DaemonConfig, NoEvents};
use serde_json::{Value, json};

// The workspace's one skip behaviour (a failure under KURYR_TEST_REQUIRE_ALL=1).
#[allow(dead_code)]
#[path = "../../kuryr-testbed/src/skip.rs"]
mod skip;

static N: AtomicU32 = AtomicU32::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn ip(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().expect("run ip")
}

fn ip_ok(args: &[&str]) -> String {
    let o = ip(args);
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether this process may create network namespaces; [`skip::skip`]s, saying why, when not.
#[track_caller]
fn can_netns() -> bool {
    let n = unique("kprobe");
    let ok = ip(&["netns", "add", &n]).status.success();
    if ok {
        ip(&["netns", "del", &n]);
    } else {
        skip::skip("cannot create network namespaces (need root and iproute2)");
    }
    ok
}

struct Ns(String);
impl Ns {
    fn new(prefix: &str) -> Self {
        let n = unique(prefix);
        ip_ok(&["netns", "add", &n]);
        ip_ok(&["-n", &n, "link", "set", "lo", "up"]);
        Ns(n)
    }
    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }
}
impl Drop for Ns {
    fn drop(&mut self) {
        ip(&["netns", "del", &self.0]);
    }
}

struct ApiUp;
#[async_trait]
impl ApiHealth for ApiUp {
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A daemon whose runtime threads live in `ns`.
struct Node {
    ns: Ns,
    daemon: Arc<Daemon>,
    sock: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Node {
    fn start(name: &str) -> Self {
        let ns = Ns::new("knode");
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("kuryr.sock").to_string_lossy().into_owned();
        let mut cfg = DaemonConfig::new(name);
        cfg.bind_address = "127.0.0.1:0".parse().unwrap();
        cfg.health_address = "127.0.0.1:0".parse().unwrap();
        cfg.metrics_address = "127.0.0.1:0".parse().unwrap();
        cfg.unix_socket = Some(sock.clone().into());
        cfg.vif_annotation_timeout = Duration::from_secs(3);
        let path = ns.path();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            // Worker threads are created from here and inherit the node netns.
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let d = Daemon::new(cfg, Arc::new(NoEvents), Arc::new(ApiUp));
                let servers = kuryr_daemon::server::start(d.clone()).await.unwrap();
                ready_tx.send(d).unwrap();
                let _ = stop_rx.await;
                servers.shutdown().await;
            });
        });
        let daemon = ready_rx.recv_timeout(Duration::from_secs(120)).unwrap();
        Node {
            ns,
            daemon,
            sock,
            stop: Some(stop_tx),
            thread: Some(thread),
            _dir: dir,
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Plugin<'a> {
    node: &'a Node,
    version: &'a str,
}

impl Plugin<'_> {
    fn conf(&self, extra: Value) -> Value {
        let mut c = json!({"cniVersion": self.version, "name": "kuryr", "type": "kuryr-cni",
            "kuryr_daemon": format!("unix://{}", self.node.sock), "kuryr_daemon_timeout": 20});
        if let (Some(c), Some(e)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        c
    }

    fn run(
        &self,
        cmd: &str,
        container: &str,
        netns: &str,
        pod: &str,
        uid: Option<&str>,
        conf: &Value,
    ) -> (Output, Option<Value>) {
        let mut args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={container}"
        );
        if let Some(u) = uid {
            args.push_str(&format!(";K8S_POD_UID={u}"));
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_kuryr-cni"))
            .env_clear()
            .env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", container)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/opt/cni/bin")
            .env("CNI_ARGS", args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let parsed = serde_json::from_slice(&out.stdout).ok();
        (out, parsed)
    }
}

fn fixture(pod: &str, n: u8, bridge: &str, active: bool) -> VifFixture {
    VifFixture {
        ifname: "eth0".into(),
        port_id: format!("{}-{pod}", unique("p")),
        mac: format!("fa:16:3e:00:10:{n:02x}"),
        subnets: vec![
            (
                "10.97.0.0/24".into(),
                format!("10.97.0.{n}").parse().unwrap(),
                Some("10.97.0.1".parse().unwrap()),
            ),
            (
                "fd00:97::/64".into(),
                format!("fd00:97::{n:x}").parse().unwrap(),
                Some("fd00:97::1".parse().unwrap()),
            ),
        ],
        bridge: bridge.into(),
        mtu: Some(1450),
        active,
    }
}

/// TCP connectivity from one namespace to an address in another.
fn reachable(from: &str, to: &str, addr: IpAddr) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    let enter = |p: String| {
        let f = std::fs::File::open(p).map_err(|e| e.to_string())?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string())
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let to = to.to_string();
    let server = std::thread::spawn(move || -> Result<(), String> {
        enter(to)?;
        let mut l = None;
        for _ in 0..50 {
            if let Ok(x) = TcpListener::bind(SocketAddr::new(addr, 0)) {
                l = Some(x);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let l = l.ok_or("bind")?;
        l.set_nonblocking(false).map_err(|e| e.to_string())?;
        tx.send(l.local_addr().map_err(|e| e.to_string())?.port())
            .map_err(|e| e.to_string())?;
        let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
        s.write_all(b"k").map_err(|e| e.to_string())
    });
    let port = rx
        .recv_timeout(Duration::from_secs(120))
        .map_err(|e| e.to_string())?;
    let from = from.to_string();
    let client = std::thread::spawn(move || -> Result<(), String> {
        enter(from)?;
        let mut last = String::new();
        for _ in 0..40 {
            match TcpStream::connect_timeout(&SocketAddr::new(addr, port), Duration::from_secs(1)) {
                Ok(mut s) => {
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).map_err(|e| e.to_string())?;
                    return Ok(());
                }
                Err(e) => {
                    last = e.to_string();
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        }
        Err(last)
    });
    let r = client.join().map_err(|_| "client panicked".to_string())?;
    if r.is_ok() {
        server.join().map_err(|_| "server panicked".to_string())??;
    }
    r
}

fn scenario(version: &str) {
    let bridge = "brk";
    let n1 = Node::start("node-1");
    let n2 = Node::start("node-2");
    // Node bridges joined by a veth: one L2 segment across the two nodes.
    for n in [&n1, &n2] {
        ip_ok(&["-n", &n.ns.0, "link", "add", bridge, "type", "bridge"]);
        ip_ok(&["-n", &n.ns.0, "link", "set", bridge, "up"]);
    }
    ip_ok(&[
        "link", "add", "kx1", "netns", &n1.ns.0, "type", "veth", "peer", "name", "kx2", "netns", &n2.ns.0,
    ]);
    ip_ok(&["-n", &n1.ns.0, "link", "set", "kx1", "master", bridge, "up"]);
    ip_ok(&["-n", &n2.ns.0, "link", "set", "kx2", "master", bridge, "up"]);

    let (pa, pb) = (Ns::new("kpoda"), Ns::new("kpodb"));
    // Pod A's VIF is still DOWN: ADD must plug it and wait for activation.
    let fa = fixture("a", 10, bridge, false);
    let fb = fixture("b", 11, bridge, true);
    n1.daemon.registry.apply_kuryrport(kuryrport(
        "default",
        "pod-a",
        "uid-a",
        "node-1",
        std::slice::from_ref(&fa),
    ));
    n2.daemon.registry.apply_kuryrport(kuryrport(
        "default",
        "pod-b",
        "uid-b",
        "node-2",
        std::slice::from_ref(&fb),
    ));
    let activate = {
        let d = n1.daemon.clone();
        let mut fa = fa.clone();
        std::thread::spawn(move || {
            // Activate 400 ms after the ADD has plugged and waits for activation, not 400 ms
            // after this thread started: the ADD (a process the test runs) may start later.
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while d
                .registry
                .get(&PodKey::new("default", "pod-a"))
                .and_then(|e| e.attachment)
                .is_none()
            {
                assert!(std::time::Instant::now() < deadline, "ADD of pod-a never plugged");
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(400));
            fa.active = true;
            d.registry
                .apply_kuryrport(kuryrport("default", "pod-a", "uid-a", "node-1", &[fa]));
        })
    };
    let p1 = Plugin { node: &n1, version };
    let p2 = Plugin { node: &n2, version };
    let (out, res) = p1.run(
        "ADD",
        "ca1",
        &pa.path(),
        "pod-a",
        Some("uid-a"),
        &p1.conf(json!({})),
    );
    assert!(
        out.status.success(),
        "ADD failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    activate.join().unwrap();
    let res = res.unwrap();
    assert_eq!(res["cniVersion"], version);
    assert_eq!(res["interfaces"][0]["name"], "eth0");
    assert_eq!(res["interfaces"][0]["mac"], "fa:16:3e:00:10:0a");
    assert_eq!(res["interfaces"][0]["sandbox"], pa.path());
    let ips = res["ips"].as_array().unwrap();
    assert_eq!(ips.len(), 2, "{res}");
    assert_eq!(ips[0]["address"], "10.97.0.10/24");
    assert_eq!(ips[1]["address"], "fd00:97::a/64");
    assert_eq!(ips[0]["gateway"], "10.97.0.1");
    let old = version.starts_with("0.");
    assert_eq!(
        ips[0].get("version").is_some(),
        old,
        "ips[].version only before 1.0.0: {res}"
    );
    assert!(
        res["routes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["dst"] == "0.0.0.0/0")
    );

    let (out, _) = p2.run(
        "ADD",
        "cb1",
        &pb.path(),
        "pod-b",
        Some("uid-b"),
        &p2.conf(json!({})),
    );
    assert!(
        out.status.success(),
        "ADD b failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Pods on different nodes talk over the nodes' bridges, v4 and v6.
    reachable(&pa.path(), &pb.path(), "10.97.0.11".parse().unwrap()).unwrap();
    reachable(&pb.path(), &pa.path(), "fd00:97::a".parse().unwrap()).unwrap();

    if version != "0.3.1" {
        let (out, _) = p1.run(
            "CHECK",
            "ca1",
            &pa.path(),
            "pod-a",
            Some("uid-a"),
            &p1.conf(json!({"prevResult": res})),
        );
        assert!(
            out.status.success(),
            "CHECK failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        // CHECK notices a broken interface.
        ip_ok(&["-n", &pa.0, "link", "set", "eth0", "down"]);
        let (out, err) = p1.run(
            "CHECK",
            "ca1",
            &pa.path(),
            "pod-a",
            Some("uid-a"),
            &p1.conf(json!({})),
        );
        assert!(!out.status.success());
        assert_eq!(err.unwrap()["code"], 999);
        ip_ok(&["-n", &pa.0, "link", "set", "eth0", "up"]);
    } else {
        let (out, err) = p1.run(
            "CHECK",
            "ca1",
            &pa.path(),
            "pod-a",
            Some("uid-a"),
            &p1.conf(json!({})),
        );
        assert!(!out.status.success());
        assert_eq!(err.unwrap()["code"], 1, "CHECK does not exist in 0.3.1");
    }

    // A DEL for an older container of the same pod touches nothing.
    let (out, _) = p1.run(
        "DEL",
        "old-container",
        &pa.path(),
        "pod-a",
        Some("uid-a"),
        &p1.conf(json!({})),
    );
    assert!(out.status.success());
    assert!(ip_ok(&["-n", &pa.0, "link"]).contains("eth0"));

    // Errors in CNI format with upstream codes.
    let (out, err) = p1.run(
        "ADD",
        "cx",
        &pa.path(),
        "pod-a",
        Some("other-uid"),
        &p1.conf(json!({})),
    );
    assert!(!out.status.success());
    assert_eq!(
        err.as_ref().unwrap()["code"],
        3,
        "UID mismatch is 'pod gone': {err:?}"
    );
    let (out, err) = p1.run("ADD", "cy", &pa.path(), "no-such-pod", None, &p1.conf(json!({})));
    assert!(!out.status.success());
    assert_eq!(err.as_ref().unwrap()["code"], 11, "{err:?}");
    assert_eq!(err.as_ref().unwrap()["cniVersion"], version);

    if version == "1.1.0" {
        let (out, _) = p1.run("STATUS", "", "", "", None, &p1.conf(json!({})));
        assert!(
            out.status.success(),
            "STATUS: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        // GC with pod-b's container as the only valid one removes nothing on node 2 ...
        let (out, _) = p2.run(
            "GC",
            "",
            "",
            "",
            None,
            &p2.conf(json!({"cni.dev/valid-attachments": [{"containerID": "cb1", "ifname": "eth0"}]})),
        );
        assert!(out.status.success());
        assert!(ip_ok(&["-n", &pb.0, "link"]).contains("eth0"));
        // ... and with none valid removes pod-b's interface.
        let (out, _) = p2.run(
            "GC",
            "",
            "",
            "",
            None,
            &p2.conf(json!({"cni.dev/valid-attachments": []})),
        );
        assert!(
            out.status.success(),
            "GC: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(!ip_ok(&["-n", &pb.0, "link"]).contains("eth0"));
    }

    // DEL twice: both succeed, the second finds nothing to do.
    for _ in 0..2 {
        let (out, _) = p1.run(
            "DEL",
            "ca1",
            &pa.path(),
            "pod-a",
            Some("uid-a"),
            &p1.conf(json!({})),
        );
        assert!(
            out.status.success(),
            "DEL: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(!ip_ok(&["-n", &pa.0, "link"]).contains("eth0"));
    }
    let (out, _) = p2.run(
        "DEL",
        "cb1",
        &pb.path(),
        "pod-b",
        Some("uid-b"),
        &p2.conf(json!({})),
    );
    assert!(out.status.success());
    // Host side is clean and the registry keeps only the KuryrPorts.
    let host_links = ip_ok(&["-n", &n1.ns.0, "link"]);
    assert!(
        !host_links.contains(&kuryr_crds::vif_name_for_port(&fa.port_id)),
        "{host_links}"
    );
    assert!(
        n1.daemon
            .registry
            .get(&PodKey::new("default", "pod-a"))
            .unwrap()
            .attachment
            .is_none()
    );
    assert_eq!(n1.daemon.pod_lock_count(), 0);
    let metrics = n1.daemon.metrics.encode();
    // Node 1 answered three ADDs: pod-a after waiting ~400 ms for
    // activation, then the UID mismatch and the unknown pod after the 3 s
    // vif_annotation_timeout each. The cumulative buckets must say so.
    let bucket = |le: &str| -> u64 {
        let prefix =
            format!("kuryr_cni_request_duration_milliseconds_bucket{{le=\"{le}\",command=\"ADD\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no ADD bucket le={le}: {metrics}"))
    };
    let les: Vec<String> = kuryr_daemon::metrics::LATENCY_BUCKETS_MS
        .iter()
        .map(|b| format!("{b:.1}"))
        .chain(["+Inf".to_string()])
        .collect();
    let counts: Vec<u64> = les.iter().map(|le| bucket(le)).collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "cumulative: {counts:?}");
    assert_eq!(bucket("250.0"), 0, "pod-a waited for activation: {metrics}");
    assert!(bucket("2500.0") <= 1, "the timeouts took 3 s: {metrics}");
    assert_eq!(bucket("+Inf"), 3, "{metrics}");
    assert!(
        metrics.contains("kuryr_cni_request_duration_milliseconds_count{command=\"ADD\"} 3\n"),
        "{metrics}"
    );
    let sum: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("kuryr_cni_request_duration_milliseconds_sum{command=\"ADD\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ADD sum: {metrics}"));
    assert!(sum >= 6000.0, "two 3 s timeouts: {sum}");
    assert!(
        metrics.contains("kuryr_cni_errors_total{command=\"ADD\",code=\"11\"} 1"),
        "{metrics}"
    );
}

#[test]
fn cni_0_3_1() {
    if can_netns() {
        scenario("0.3.1");
    }
}

#[test]
fn cni_0_4_0() {
    if can_netns() {
        scenario("0.4.0");
    }
}

#[test]
fn cni_1_0_0() {
    if can_netns() {
        scenario("1.0.0");
    }
}

#[test]
fn cni_1_1_0() {
    if can_netns() {
        scenario("1.1.0");
    }
}

#[test]
fn version_command_and_missing_daemon() {
    let out = Command::new(env!("CARGO_BIN_EXE_kuryr-cni"))
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
    // No stdin, no env: a CNI error, never a panic.
    let out = Command::new(env!("CARGO_BIN_EXE_kuryr-cni"))
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let e: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(e["code"].is_u64() && e["msg"].is_string(), "{e}");
}
