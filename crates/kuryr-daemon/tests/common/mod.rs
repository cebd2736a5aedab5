//! Throwaway kernel fixtures for tests: uniquely named namespaces and links,
//! removed on drop even when the test fails.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short unique name (fits IFNAMSIZ): `<prefix><pid%10000><n>`.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}{n}", std::process::id() % 100_000)
}

/// `true` when we can create namespaces (root with CAP_SYS_ADMIN).
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
        eprintln!("skipping: cannot create network namespaces (need root and iproute2)");
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
