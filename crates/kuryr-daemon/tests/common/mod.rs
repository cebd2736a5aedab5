//! Throwaway kernel fixtures for tests: uniquely named namespaces and links,
//! removed on drop even when the test fails; and [`skip`], how a test says why it does not run
//! (a failure under `KURYR_TEST_REQUIRE_ALL=1`).
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

// The workspace's one skip behaviour (std only; depending on kuryr-testbed would build the controller).
#[path = "../../../kuryr-testbed/src/skip.rs"]
mod skip;
#[allow(unused_imports)]
pub use skip::{skip, skip_hardware};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short unique name (fits IFNAMSIZ): `<prefix><pid%10000><n>`.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}{n}", std::process::id() % 100_000)
}

/// `true` when we can create namespaces (root with CAP_SYS_ADMIN); otherwise [`skip`]s, saying why
/// (a failure under `KURYR_TEST_REQUIRE_ALL=1`), and the caller returns.
#[track_caller]
pub fn can_netns() -> bool {
    let name = unique("kprobe");
    let ok = Command::new("ip")
        .args(["netns", "add", &name])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
    } else {
        skip("cannot create network namespaces (need root and iproute2)");
    }
    ok
}

pub struct TestNetns {
    pub name: String,
}

impl TestNetns {
    pub fn new(prefix: &str) -> Self {
        let name = unique(prefix);
        let st = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("run ip netns add");
        assert!(st.success(), "ip netns add {name} failed");
        // lo up so pings to own addresses work.
        run_in(&name, &["ip", "link", "set", "lo", "up"]);
        Self { name }
    }

    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    pub fn exec(&self, args: &[&str]) -> std::process::Output {
        let mut full = vec!["netns", "exec", &self.name];
        full.extend_from_slice(args);
        Command::new("ip").args(full).output().expect("run ip netns exec")
    }

    pub fn exec_ok(&self, args: &[&str]) -> String {
        let out = self.exec(args);
        assert!(
            out.status.success(),
            "{args:?} in {} failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

fn run_in(ns: &str, args: &[&str]) {
    let mut full = vec!["netns", "exec", ns];
    full.extend_from_slice(args);
    let _ = Command::new("ip").args(full).status();
}

/// A link in the test's own (host) namespace, deleted on drop.
pub struct HostLink(pub String);

impl Drop for HostLink {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.0])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The "VM interface" of nested bindings: one end of a veth (MTU 1500) in the host namespace,
/// up, named from `prefix`; deleted (with its peer) on drop.
pub fn vm_interface(prefix: &str) -> HostLink {
    let parent = unique(prefix);
    let link = HostLink(parent.clone());
    let peer = format!("{parent}p");
    host_ok(&[
        "ip", "link", "add", &parent, "mtu", "1500", "type", "veth", "peer", "name", &peer,
    ]);
    host_ok(&["ip", "link", "set", &parent, "up"]);
    link
}

pub fn host_ok(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("run command");
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run `f` on a fresh OS thread inside the named namespace.
pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("open netns");
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("netns thread")
}

/// Connectivity check without `ping`: a TCP listener on `addr` in `to_ns`,
/// a client in `from_ns` that must get one byte back.
pub fn tcp_reachable(from_ns: &str, to_ns: &str, addr: std::net::IpAddr) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::time::Duration;
    let to = format!("/var/run/netns/{to_ns}");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || -> Result<(), String> {
        let file = std::fs::File::open(&to).map_err(|e| e.to_string())?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string())?;
        // IPv6 addresses are unusable until DAD finishes: retry the bind.
        let mut listener = None;
        for _ in 0..50 {
            match TcpListener::bind(SocketAddr::new(addr, 0)) {
                Ok(l) => {
                    listener = Some(l);
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        let listener = listener.ok_or("bind failed")?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let _ = ready_tx.send(port);
        let (mut s, _) = listener.accept().map_err(|e| e.to_string())?;
        s.write_all(b"k").map_err(|e| e.to_string())
    });
    let port = ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "server did not start".to_string())?;
    let from = from_ns.to_string();
    let res = in_ns(&from, move || -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..30 {
            match TcpStream::connect_timeout(&SocketAddr::new(addr, port), Duration::from_secs(2)) {
                Ok(mut s) => {
                    let mut b = [0u8; 1];
                    s.set_read_timeout(Some(Duration::from_secs(2)))
                        .map_err(|e| e.to_string())?;
                    s.read_exact(&mut b).map_err(|e| e.to_string())?;
                    return if &b == b"k" {
                        Ok(())
                    } else {
                        Err("wrong byte".into())
                    };
                }
                Err(e) => {
                    last = e.to_string();
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        Err(format!("connect to {addr}:{port}: {last}"))
    });
    if res.is_err() {
        // Unblock the server's accept().
        let _ = in_ns(from_ns, move || {
            std::net::TcpStream::connect_timeout(&SocketAddr::new(addr, port), Duration::from_millis(100))
        });
    }
    let server_res = server.join().map_err(|_| "server panicked".to_string())?;
    res.and(server_res)
}

/// How long tests wait for an outcome (and how long a daemon in a test waits for VIFs when the
/// test wants a wait that only an event, never the timeout, ends): generous, so that nothing
/// depends on how fast or loaded the machine is.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Polls `cond` until it holds or [`WAIT`] has passed; whether it held.
pub async fn eventually(cond: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    cond()
}

/// A network namespace other than the test process' own (which the daemon refuses as CNI_NETNS),
/// for requests that need one that exists: a child `unshare`d into a namespace of its own, as root
/// or in a user namespace; it ends with this process (its stdin closes). `None`, with the reason
/// printed, when neither can be made (the test then passes without running, as the README says).
pub fn other_netns() -> Option<&'static str> {
    let path = other_netns_path();
    if path.is_none() {
        eprintln!(
            "skipping: no network namespace other than the test's own can be made (unshare -n needs root or user namespaces)"
        );
    }
    path
}

fn other_netns_path() -> Option<&'static str> {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    static NS: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    NS.get_or_init(|| {
        for flags in ["-n", "-rn"] {
            let Ok(mut child) = Command::new("unshare")
                .args([flags, "--", "sh", "-c", "echo ready; read _"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
            else {
                continue;
            };
            let mut line = String::new();
            if let Some(out) = child.stdout.take() {
                let _ = BufReader::new(out).read_line(&mut line);
            }
            if line.trim() == "ready" {
                let path = format!("/proc/{}/ns/net", child.id());
                // Held open for the process' lifetime: the child reads it to its end.
                std::mem::forget(child.stdin.take());
                std::mem::forget(child);
                return Some(path);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        None
    })
    .as_deref()
}
