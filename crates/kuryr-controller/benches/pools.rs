//! Port pools vs no pool: 200 pods on 4 nodes wired by the controller against the Kubernetes
//! API emulator and the Neutron emulator with the measured real-server latency profile
//! (`EmulatorOptions::real_server()`: ~150-200 ms per port, 2 workers, 200 ms to ACTIVE).
//!
//! - `noop`: a port per pod;
//! - `neutron`: warm pools (one pod per node, then a populate over the pool management API), so
//!   the measured pods all take the hit path;
//! - `cold`: the `neutron` pool driver from nothing: the burst itself sizes the refills.
//!
//! The Neutron calls per pod come from the emulator's request counters over the measured window
//! only. Then the exhaustion case: 500 pods (`POOL_BENCH_EXHAUSTED_PODS`) on a port quota of 20,
//! instant Neutron; port creates per minute while the quota stays full (after a 30 s ramp), then
//! the time until every pod is wired once the quota is raised.
//!
//! `cargo bench -p kuryr-controller --bench pools` (`POOL_BENCH_PODS` overrides the pod count).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use kube_emulator::{KubeEmulator, KubeOptions};
use kuryr_config::KuryrConfig;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pool::api;
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_crds::KuryrPort;
use kuryr_neutron::{ClientOptions, NeutronClient};
use neutron_emulator::{Emulator, EmulatorOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NODES: [&str; 4] = ["bench-node-1", "bench-node-2", "bench-node-3", "bench-node-4"];
const NS: &str = "kuryr-system";
const TIMEOUT: Duration = Duration::from_secs(600);

struct Row {
    mode: &'static str,
    pods: usize,
    secs: f64,
    p50: Duration,
    p99: Duration,
    calls: u64,
    ports_created: u64,
    ops: String,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pods: usize = match std::env::var("POOL_BENCH_PODS") {
        Ok(v) => v.parse().context("POOL_BENCH_PODS must be a number")?,
        Err(_) => 200,
    };
    let mut rows = Vec::new();
    for mode in ["noop", "neutron", "cold"] {
        eprintln!("pools bench: {mode}, {pods} pods on {} nodes ...", NODES.len());
        rows.push(run_mode(mode, pods).await?);
    }
    println!();
    println!(
        "pods on {} nodes, Neutron emulator with the real-server latency profile",
        NODES.len()
    );
    println!(
        "{:<8} {:>5} {:>8} {:>8} {:>9} {:>9} {:>14} {:>13}  operations (measured window)",
        "pool", "pods", "secs", "pods/s", "p50 ms", "p99 ms", "calls/pod", "ports made"
    );
    for r in &rows {
        println!(
            "{:<8} {:>5} {:>8.2} {:>8.1} {:>9} {:>9} {:>14.2} {:>13}  {}",
            r.mode,
            r.pods,
            r.secs,
            r.pods as f64 / r.secs,
            r.p50.as_millis(),
            r.p99.as_millis(),
            r.calls as f64 / r.pods as f64,
            r.ports_created,
            r.ops
        );
    }
    let exhausted: usize = match std::env::var("POOL_BENCH_EXHAUSTED_PODS") {
        Ok(v) => v.parse().context("POOL_BENCH_EXHAUSTED_PODS must be a number")?,
        Err(_) => 500,
    };
    if exhausted > 0 {
        eprintln!("pools bench: exhaustion, {exhausted} pods on a port quota of {QUOTA} ...");
        let e = run_exhaustion(exhausted).await?;
        println!();
        println!(
            "{exhausted} pods on {} nodes, port quota {QUOTA}, instant Neutron emulator",
            NODES.len()
        );
        println!(
            "{:<28} {:>12} {:>12} {:>20}",
            "case", "creates/min", "calls/min", "wired after raise s"
        );
        println!(
            "{:<28} {:>12.1} {:>12.1} {:>20.2}",
            "quota full, then raised",
            e.creates_per_min,
            e.calls_per_min,
            e.wired_after.as_secs_f64()
        );
    }
    Ok(())
}

const QUOTA: i64 = 20;

struct Exhaustion {
    creates_per_min: f64,
    calls_per_min: f64,
    wired_after: Duration,
}

async fn run_exhaustion(pods: usize) -> Result<Exhaustion> {
    let bed = Bed::start("neutron", EmulatorOptions::default()).await?;
    let quota = |port| kuryr_neutron::QuotaUpdate {
        port: Some(port),
        ..Default::default()
    };
    bed.neutron.update_quota(bed.project, &quota(QUOTA)).await?;
    for i in 0..pods {
        create_pod(&bed.kube, &format!("pod-{i}"), NODES[i % NODES.len()]).await?;
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    bed.emu.reset_stats();
    let window = Duration::from_secs(60);
    tokio::time::sleep(window).await;
    let stats = bed.emu.stats();
    let minutes = window.as_secs_f64() / 60.0;
    let creates = stats.count("port.create_bulk") + stats.count("port.create");
    bed.neutron
        .update_quota(bed.project, &quota(i64::try_from(pods)? * 2))
        .await?;
    let raised = Instant::now();
    wait_active(&bed.kube, pods, &HashMap::new()).await?;
    let wired_after = raised.elapsed();
    bed.stop().await;
    Ok(Exhaustion {
        creates_per_min: creates as f64 / minutes,
        calls_per_min: stats.total_requests as f64 / minutes,
        wired_after,
    })
}

/// The emulators, a project with a network, and a running controller.
struct Bed {
    emu: neutron_emulator::EmulatorHandle,
    _kube_handle: kube_emulator::KubeHandle,
    neutron: NeutronClient,
    kube: Client,
    project: &'static str,
    socket: std::path::PathBuf,
    stop: CancellationToken,
    controller: tokio::task::JoinHandle<kuryr_controller::Result<()>>,
}

impl Bed {
    async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(15), self.controller).await;
        let _ = std::fs::remove_file(&self.socket);
    }

    async fn start(pool: &str, options: EmulatorOptions) -> Result<Self> {
        let emu = Emulator::start(options).await?;
        let neutron = NeutronClient::new(&ClientOptions::noauth(emu.url()))?;
        let kube_handle = KubeEmulator::start(KubeOptions {
            nodes: NODES.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await?;
        let kube = Client::try_from(kube::Config::new(kube_handle.url().parse()?))?;
        let crds: Api<CustomResourceDefinition> = Api::all(kube.clone());
        for crd in kuryr_crds::generate::crds() {
            crds.create(&PostParams::default(), &crd).await?;
        }
        for ns in [NS, "bench"] {
            let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
            Api::<Namespace>::all(kube.clone())
                .create(&PostParams::default(), &obj)
                .await?;
        }
        let project = "pool-bench";
        let net = neutron
            .create_network(&kuryr_neutron::NetworkCreate {
                name: Some("pods".into()),
                project_id: Some(project.into()),
                ..Default::default()
            })
            .await?;
        let subnet = neutron
            .create_subnet(&kuryr_neutron::SubnetCreate {
                network_id: net.id.clone(),
                ip_version: 4,
                cidr: Some("10.200.0.0/21".into()),
                project_id: Some(project.into()),
                ..Default::default()
            })
            .await?;
        let sg = neutron
            .create_security_group(&kuryr_neutron::SecurityGroupCreate {
                name: "pods".into(),
                project_id: Some(project.into()),
                ..Default::default()
            })
            .await?;
        let socket = std::env::temp_dir().join(format!("pool-bench-{}.sock", std::process::id()));
        let ini = format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = {pool}\n\
         cluster_id = bench\ncontroller_namespace = {NS}\nenable_manager = true\n\
         [pool_manager]\nsock_file = {}\n\
         [vif_pool]\nports_pool_batch = 10\nports_pool_min = 5\nports_pool_update_frequency = 2\n\
         [neutron_defaults]\nproject = {project}\npod_subnet = {}\npod_security_groups = {}\n",
            socket.display(),
            subnet.id,
            sg.id
        );
        let cfg = Arc::new(KuryrConfig::from_ini_str(&ini)?.config);
        let metrics = Metrics::new();
        let deployments = Deployments::noauth(&emu.url(), &metrics)?;
        let mut opts = ControllerOptions::new(cfg, kube.clone(), deployments, metrics);
        opts.health_addr = None;
        opts.metrics_addr = None;
        opts.identity = "bench".into();
        let stop = CancellationToken::new();
        let controller = tokio::spawn(run(opts, stop.clone()));
        Ok(Self {
            emu,
            _kube_handle: kube_handle,
            neutron,
            kube,
            project,
            socket,
            stop,
            controller,
        })
    }
}

async fn run_mode(mode: &'static str, pods: usize) -> Result<Row> {
    let pool = if mode == "noop" { "noop" } else { "neutron" };
    let bed = Bed::start(pool, EmulatorOptions::real_server()).await?;
    let (emu, kube, socket) = (&bed.emu, &bed.kube, &bed.socket);

    let per_node = pods.div_ceil(NODES.len());
    if mode == "neutron" {
        // Warm-up: one pod per node makes each pool known, then each is populated for the
        // measured pods, and the ports are given time to turn ACTIVE.
        for (i, node) in NODES.iter().enumerate() {
            create_pod(kube, &format!("warm-{i}"), node).await?;
        }
        wait_active(kube, NODES.len(), &HashMap::new()).await?;
        for p in api::list_pools(socket).await? {
            let started = api::populate_pool(socket, &p.name, Some(per_node)).await?;
            if !started.started {
                bail!("populate of {} did not start", p.name);
            }
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let pools = api::list_pools(socket).await?;
            if pools.iter().all(|p| p.available >= per_node && !p.populating) {
                break;
            }
            if Instant::now() > deadline {
                bail!("pools did not fill: {pools:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Two maintenance periods: available ports are seen ACTIVE, so a hit needs no call.
        tokio::time::sleep(Duration::from_secs(5)).await;
    }

    emu.reset_stats();
    let started = Instant::now();
    let mut created = HashMap::new();
    for i in 0..pods {
        let name = format!("pod-{i}");
        create_pod(kube, &name, NODES[i % NODES.len()]).await?;
        created.insert(name, Instant::now());
    }
    let warm = if mode == "neutron" { NODES.len() } else { 0 };
    let done = wait_active(kube, pods + warm, &created).await?;
    let secs = started.elapsed().as_secs_f64();
    let stats = emu.stats();
    let mut lat: Vec<Duration> = created
        .iter()
        .filter_map(|(name, at)| done.get(name).map(|d| d.duration_since(*at)))
        .collect();
    lat.sort();
    if lat.len() != pods {
        bail!("{} of {pods} pods measured", lat.len());
    }
    let pct = |q: f64| lat[((lat.len() as f64 * q).ceil() as usize).clamp(1, lat.len()) - 1];
    let ops = stats
        .operations
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    bed.stop().await;
    Ok(Row {
        mode,
        pods,
        secs,
        p50: pct(0.50),
        p99: pct(0.99),
        calls: stats.total_requests,
        ports_created: stats.ports_created,
        ops: if ops.is_empty() { "none".into() } else { ops },
    })
}

async fn create_pod(kube: &Client, name: &str, node: &str) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    }))?;
    Api::<Pod>::namespaced(kube.clone(), "bench")
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// Polls until `n` KuryrPorts are active; returns when each of `watch` was first seen active.
async fn wait_active(
    kube: &Client,
    n: usize,
    watch: &HashMap<String, Instant>,
) -> Result<HashMap<String, Instant>> {
    let api = Api::<KuryrPort>::namespaced(kube.clone(), "bench");
    let deadline = Instant::now() + TIMEOUT;
    let mut seen: HashMap<String, Instant> = HashMap::new();
    loop {
        let kps = api.list(&ListParams::default()).await?.items;
        let now = Instant::now();
        let mut active = 0;
        for kp in &kps {
            let up = kp
                .status
                .as_ref()
                .and_then(|s| s.default_vif())
                .is_some_and(|(_, v)| v.active());
            if up {
                active += 1;
                if watch.contains_key(&kp.name_any()) {
                    seen.entry(kp.name_any()).or_insert(now);
                }
            }
        }
        if active >= n {
            return Ok(seen);
        }
        if now > deadline {
            bail!("{active} of {n} KuryrPorts active after {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
