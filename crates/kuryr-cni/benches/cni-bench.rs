//! cni-bench: CNI ADD/DEL latency from plugin exec to result (VIF already
//! ACTIVE, veth + Linux bridge or, with `CNI_BENCH_OVS_DB`, veth + Open
//! vSwitch bridge; real namespaces), the same ADD through the
//! daemon in process (no plugin, no HTTP), the floor of an ADD (its bare
//! kernel work, see `floor.rs`), and daemon memory with many pods
//! registered. The three ADD kinds take turns pod by pod, so the machine's
//! load falls on them alike. Prints a table.
//!
//! `cargo bench -p kuryr-cni --bench cni-bench` (root needed for netns);
//! env `CNI_BENCH_PODS` (default 200) and `CNI_BENCH_REGISTERED` (default 500);
//! `CNI_BENCH_OVS_DB=unix:<socket>` (the ovsdb `scripts/ovs-userspace.sh start`
//! prints) binds on a userspace-datapath OVS bridge instead.
#![allow(clippy::unwrap_used)]

#[path = "cni-bench/floor.rs"]
mod floor;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kuryr_crds::{KuryrPort, Vif};
use kuryr_daemon::netlink::NetNs;
use kuryr_daemon::registry::PodKey;
use kuryr_daemon::testing::{VifFixture, kuryrport_of};
use kuryr_daemon::{ApiHealth, Daemon, DaemonConfig, NoEvents, vif};
use serde_json::json;

struct ApiUp;
#[async_trait]
impl ApiHealth for ApiUp {
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn children_max_rss_kib() -> i64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes into the struct we pass.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    ru.ru_maxrss
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn fixture(i: u32, tag: &str, bridge: &str) -> VifFixture {
    let (a, b) = (i / 250, i % 250 + 2);
    VifFixture {
        ifname: "eth0".into(),
        port_id: format!("{tag}{i:05}-0000-0000-0000-000000000000"),
        mac: format!("fa:16:3e:99:{:02x}:{:02x}", i / 256, i % 256),
        // With a gateway, as a pod's subnet has: the ADD adds its default route.
        subnets: vec![(
            format!("10.{}.0.0/16", 100 + a),
            format!("10.{}.{}.{}", 100 + a, i % 200, b).parse().unwrap(),
            Some(format!("10.{}.0.1", 100 + a).parse().unwrap()),
        )],
        bridge: bridge.into(),
        mtu: Some(1450),
        active: true,
    }
}

/// The binding under test: a Linux bridge, or an OVS bridge of the ovsdb at `db`.
enum Floor {
    Bridge(floor::BridgeFloor),
    Ovs(floor::OvsFloor),
}

impl Floor {
    fn vif(&self, f: &VifFixture) -> Vif {
        match self {
            Self::Bridge(_) => f.to_vif(),
            Self::Ovs(_) => f.to_ovs_vif(),
        }
    }

    fn kuryrport(&self, namespace: &str, i: u32, f: &VifFixture) -> KuryrPort {
        let vifs = vec![(f.ifname.clone(), self.vif(f))];
        kuryrport_of(
            namespace,
            &format!("pod{i}"),
            &format!("uid{i}"),
            "bench-node",
            vifs,
        )
    }

    async fn add(
        &self,
        spec: &kuryr_daemon::binding::PlugSpec,
        netns: &NetNs,
        uid: &str,
    ) -> Result<(), kuryr_daemon::binding::BindingError> {
        match self {
            Self::Bridge(f) => f.add(spec, netns).await,
            Self::Ovs(f) => f.add(spec, netns, uid).await,
        }
    }

    async fn del(
        &self,
        spec: &kuryr_daemon::binding::PlugSpec,
    ) -> Result<(), kuryr_daemon::binding::BindingError> {
        match self {
            Self::Bridge(f) => f.del(spec).await,
            Self::Ovs(f) => f.del(spec).await,
        }
    }
}

fn main() {
    let pods: u32 = std::env::var("CNI_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let registered: u32 = std::env::var("CNI_BENCH_REGISTERED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let probe = format!("kbp{}", std::process::id());
    if !Command::new("ip")
        .args(["netns", "add", &probe])
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("cni-bench: cannot create network namespaces (need root); nothing measured");
        return;
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kuryr.sock");
    let mut cfg = DaemonConfig::new("bench-node");
    cfg.bind_address = "127.0.0.1:0".parse().unwrap();
    cfg.health_address = "127.0.0.1:0".parse().unwrap();
    cfg.metrics_address = "127.0.0.1:0".parse().unwrap();
    cfg.unix_socket = Some(sock.clone());
    let ovs_db = std::env::var("CNI_BENCH_OVS_DB").ok().filter(|d| !d.is_empty());
    if let Some(db) = &ovs_db {
        cfg.binding.ovs_db = Some(db.clone());
        // No kernel module here: the bench's bridge is a userspace one.
        cfg.binding.ovs_datapath_type = "netdev".into();
    }
    let binding_cfg = cfg.binding.clone();
    let bridge = format!("kbb{}", std::process::id() % 100_000);
    let rss_before_daemon = rss_kib();
    let (daemon, servers) = rt.block_on(async {
        let d = Daemon::new(cfg, Arc::new(NoEvents), Arc::new(ApiUp));
        let s = kuryr_daemon::server::start(d.clone()).await.unwrap();
        (d, s)
    });
    let rss_idle = rss_kib();

    // Latency: one netns per pod (created outside the timed section).
    let tag = format!("b{:03}", std::process::id() % 1000);
    let conf = json!({"cniVersion": "1.0.0", "name": "kuryr", "type": "kuryr-cni", "kuryr_daemon": format!("unix://{}", sock.display())}).to_string();
    let run = |cmd: &str, i: u32, ns: &str| -> Duration {
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_kuryr-cni"))
            .env_clear()
            .env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", format!("ctr{i}"))
            .env("CNI_NETNS", format!("/var/run/netns/{ns}"))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_ARGS", format!("K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod{i}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(conf.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let took = started.elapsed();
        assert!(
            out.status.success(),
            "{cmd} pod{i}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        took
    };
    // The same request body the plugin posts.
    let body = |cmd: &str, i: u32, ns: &str| {
        json!({
            "CNI_COMMAND": cmd,
            "CNI_CONTAINERID": format!("ctr{i}"),
            "CNI_NETNS": format!("/var/run/netns/{ns}"),
            "CNI_IFNAME": "eth0",
            "CNI_ARGS": format!("K8S_POD_NAMESPACE=inproc;K8S_POD_NAME=pod{i}"),
            "config_kuryr": serde_json::from_str::<serde_json::Value>(&conf).unwrap(),
        })
        .to_string()
    };
    let floor = match &ovs_db {
        Some(db) => Floor::Ovs(rt.block_on(floor::OvsFloor::new(db, &bridge)).unwrap()),
        None => Floor::Bridge(rt.block_on(floor::BridgeFloor::new(&bridge)).unwrap()),
    };
    let (inproc_tag, floor_tag) = (format!("d{}", &tag[1..]), format!("f{}", &tag[1..]));
    let mut adds = Vec::new();
    let mut dels = Vec::new();
    let mut inproc_adds = Vec::new();
    let mut floor_adds = Vec::new();
    let mut spawns = Vec::new();
    for i in 0..pods {
        // Rotate who goes first so that none always runs right after
        // another's veth removal.
        for turn in 0..3 {
            let ns = format!("kbn{}x{i}k{turn}", std::process::id() % 100_000);
            Command::new("ip").args(["netns", "add", &ns]).status().unwrap();
            match (turn + i) % 3 {
                0 => {
                    daemon
                        .registry
                        .apply_kuryrport(floor.kuryrport("bench", i, &fixture(i, &tag, &bridge)));
                    adds.push(run("ADD", i, &ns));
                    dels.push(run("DEL", i, &ns));
                    // What starting any process costs here, for reading the
                    // plugin's share of an ADD.
                    let started = Instant::now();
                    let out = Command::new("true")
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .output()
                        .unwrap();
                    assert!(out.status.success());
                    spawns.push(started.elapsed());
                }
                1 => {
                    daemon.registry.apply_kuryrport(floor.kuryrport(
                        "inproc",
                        i,
                        &fixture(i, &inproc_tag, &bridge),
                    ));
                    let started = Instant::now();
                    rt.block_on(daemon.add(body("ADD", i, &ns).as_bytes())).unwrap();
                    inproc_adds.push(started.elapsed());
                    rt.block_on(daemon.del(body("DEL", i, &ns).as_bytes())).unwrap();
                    // Out of the registry again: the memory rows below count
                    // the same entries as before this variant existed.
                    daemon
                        .registry
                        .delete_kuryrport(&PodKey::new("inproc", format!("pod{i}")));
                }
                _ => {
                    let spec = vif::plug_spec(
                        &floor.vif(&fixture(i, &floor_tag, &bridge)),
                        "eth0",
                        true,
                        &binding_cfg,
                    )
                    .unwrap();
                    let started = Instant::now();
                    rt.block_on(async {
                        let netns = NetNs::open(&format!("/var/run/netns/{ns}"))?;
                        floor.add(&spec, &netns, &format!("uid{i}")).await
                    })
                    .unwrap();
                    floor_adds.push(started.elapsed());
                    rt.block_on(floor.del(&spec)).unwrap();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        }
    }
    let plugin_rss = children_max_rss_kib();
    adds.sort();
    dels.sort();
    inproc_adds.sort();
    floor_adds.sort();
    spawns.sort();

    // Memory with many pods registered (status.vifs filled, as in production).
    for i in 0..registered {
        daemon
            .registry
            .apply_kuryrport(floor.kuryrport("mem", i, &fixture(i, &tag, &bridge)));
    }
    let rss_loaded = rss_kib();

    let kind = match &floor {
        Floor::Ovs(f) => {
            rt.block_on(f.remove()).unwrap();
            "veth + Open vSwitch (userspace datapath), VIF already ACTIVE, plugin exec -> result; \
             floor = bare netlink work + one ovsdb transaction and vswitchd applying it"
        }
        Floor::Bridge(_) => {
            let _ = Command::new("ip").args(["link", "del", &bridge]).status();
            "veth + Linux bridge, VIF already ACTIVE, plugin exec -> result; floor = bare netlink work"
        }
    };
    drop(floor);
    rt.block_on(servers.shutdown());

    println!("\ncni-bench ({kind})");
    println!("{:<34} {:>12}", "metric", "value");
    println!("{}", "-".repeat(47));
    let ms_f = |d: Duration| d.as_secs_f64() * 1000.0;
    let ms = |d: Duration| format!("{:.2} ms", ms_f(d));
    println!("{:<34} {:>12}", "pods", pods);
    println!("{:<34} {:>12}", "ADD p50", ms(pct(&adds, 0.50)));
    println!("{:<34} {:>12}", "ADD p99", ms(pct(&adds, 0.99)));
    println!("{:<34} {:>12}", "ADD max", ms(pct(&adds, 1.0)));
    println!(
        "{:<34} {:>12}",
        "in-process daemon ADD p50",
        ms(pct(&inproc_adds, 0.50))
    );
    println!(
        "{:<34} {:>12}",
        "in-process daemon ADD p99",
        ms(pct(&inproc_adds, 0.99))
    );
    println!("{:<34} {:>12}", "floor ADD p50", ms(pct(&floor_adds, 0.50)));
    println!("{:<34} {:>12}", "floor ADD p99", ms(pct(&floor_adds, 0.99)));
    let ratio = |p: f64| pct(&adds, p).as_secs_f64() / pct(&floor_adds, p).as_secs_f64();
    println!(
        "{:<34} {:>12}",
        "ADD p50 / floor p50",
        format!("{:.2}x", ratio(0.50))
    );
    println!(
        "{:<34} {:>12}",
        "ADD p99 / floor p99",
        format!("{:.2}x", ratio(0.99))
    );
    println!(
        "{:<34} {:>12}",
        "target p99 <= 2x floor",
        if ratio(0.99) <= 2.0 { "met" } else { "NOT met" }
    );
    println!(
        "{:<34} {:>12}",
        "exec of true p50 / p99",
        format!(
            "{:.2} / {:.2} ms",
            ms_f(pct(&spawns, 0.50)),
            ms_f(pct(&spawns, 0.99))
        )
    );
    println!("{:<34} {:>12}", "DEL p50", ms(pct(&dels, 0.50)));
    println!("{:<34} {:>12}", "DEL p99", ms(pct(&dels, 0.99)));
    println!(
        "{:<34} {:>12}",
        "children max RSS (plugin, ip)",
        format!("{plugin_rss} KiB")
    );
    println!(
        "{:<34} {:>12}",
        "process RSS before daemon",
        format!("{rss_before_daemon} KiB")
    );
    println!(
        "{:<34} {:>12}",
        "daemon RSS idle (process)",
        format!("{rss_idle} KiB")
    );
    println!(
        "{:<34} {:>12}",
        format!("RSS with {registered} pods registered"),
        format!("{rss_loaded} KiB")
    );
    println!(
        "{:<34} {:>12}",
        "per registered pod",
        format!(
            "{:.1} KiB",
            rss_loaded.saturating_sub(rss_idle) as f64 / f64::from(registered.max(1))
        )
    );
    println!("{:<34} {:>12}", "registry entries", daemon.registry.len());
}
