//! Services on Octavia: N Services with 3 endpoints each created at once, then an endpoints churn (every
//! Service's endpoints change once), then a burst of 100 endpoint updates on one Service, then deletion.
//! For each phase: time until Octavia matches, and the controller's Octavia calls (writes and reads) per
//! Service or per change, next to what upstream kuryr-kubernetes' approach needs for the same work (one
//! call per load balancer, listener, pool and member, each followed by polling; computed, not run).
//!
//! Targets: the Octavia emulator with the amphora-noop latency profile, and the real Octavia 19.0.0 at
//! KURYR_TEST_OCTAVIA_URL when set (scripts/octavia-lab/start-octavia.sh).
//!
//! `cargo bench -p kuryr-controller --bench services` (`SVC_BENCH_SERVICES` overrides N, default 100).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_emulator::{KubeEmulator, KubeOptions};
use kuryr_config::KuryrConfig;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_crds::KuryrLoadBalancer;
use kuryr_neutron::octavia::OctaviaClient;
use kuryr_neutron::{ClientOptions, NeutronClient};
use neutron_emulator::{Emulator, EmulatorOptions};
use octavia_emulator::{OctaviaEmulator, OctaviaHandle, OctaviaOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "bench";
const TIMEOUT: Duration = Duration::from_secs(900);
const BURST: usize = 100;

/// Calls by operation; those Octavia refused (`api_error`, e.g. a 409 while the load balancer is
/// `PENDING_*`) or that got no answer (`transport_error`) under `<operation>!<result>`, so that writes
/// count what Octavia carried out.
fn octavia_calls(metrics: &Metrics) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (op, by_result) in metrics.octavia_calls() {
        for (result, n) in by_result {
            let key = if result == "success" {
                op.clone()
            } else {
                format!("{op}!{result}")
            };
            *out.entry(key).or_default() += n;
        }
    }
    out
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn writes(calls: &BTreeMap<String, u64>) -> u64 {
    calls
        .iter()
        .filter(|(op, _)| !op.starts_with("get_") && !op.starts_with("list_") && !op.contains('!'))
        .map(|(_, v)| v)
        .sum()
}

fn reads(calls: &BTreeMap<String, u64>) -> u64 {
    calls
        .iter()
        .filter(|(op, _)| op.starts_with("get_") || op.starts_with("list_"))
        .map(|(_, v)| v)
        .sum()
}

struct Phase {
    name: String,
    units: usize,
    unit: &'static str,
    secs: f64,
    calls: BTreeMap<String, u64>,
    upstream_writes: f64,
}

fn ips(svc: usize, generation: usize) -> Vec<String> {
    // Three endpoints per Service; a generation shifts one of them.
    (0..3)
        .map(|k| {
            format!(
                "10.{}.{}.{}",
                1 + svc / 200,
                svc % 200,
                10 + k + generation * (k == 2) as usize
            )
        })
        .collect()
}

async fn set_slice(kube: &Client, svc: &str, ips: &[String]) -> Result<()> {
    let api = Api::<EndpointSlice>::namespaced(kube.clone(), NS);
    let name = format!("{svc}-slice");
    let body = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    });
    if api.get_opt(&name).await?.is_some() {
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await?;
    } else {
        api.create(&PostParams::default(), &serde_json::from_value(body)?)
            .await?;
    }
    Ok(())
}

/// Waits until every Service's KuryrLoadBalancer records a load balancer whose members are `want(svc)`.
async fn converged(kube: &Client, n: usize, want: impl Fn(usize) -> Vec<String>) -> Result<()> {
    let api = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), NS);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let klbs = api.list(&ListParams::default()).await?;
        let by_name: BTreeMap<String, &KuryrLoadBalancer> = klbs
            .items
            .iter()
            .filter_map(|k| k.metadata.name.clone().map(|n| (n, k)))
            .collect();
        let done = (0..n).all(|i| {
            by_name
                .get(&format!("svc-{i}"))
                .and_then(|k| k.status.as_ref())
                .is_some_and(|s| {
                    let mut have: Vec<String> = s.members.iter().map(|m| m.ip.clone()).collect();
                    have.sort();
                    let mut w = want(i);
                    w.sort();
                    s.loadbalancer.is_some() && have == w
                })
        });
        if done {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for the load balancers to converge");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_target(name: &str, octavia_url: &str, n: usize) -> Result<Vec<Phase>> {
    let kube_handle = KubeEmulator::start(KubeOptions::default()).await?;
    let kube = Client::try_from(kube::Config::new(kube_handle.url().parse()?))?;
    let crds: Api<CustomResourceDefinition> = Api::all(kube.clone());
    for crd in kuryr_crds::generate::crds() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(kube.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let neutron_emu = Emulator::start(EmulatorOptions::default()).await?;
    let neutron = NeutronClient::new(&ClientOptions::noauth(neutron_emu.url()))?;
    let project = uuid::Uuid::new_v4().simple().to_string();
    let net = neutron
        .create_network(&kuryr_neutron::NetworkCreate {
            project_id: Some(project.clone()),
            ..Default::default()
        })
        .await?;
    let subnet = neutron
        .create_subnet(&kuryr_neutron::SubnetCreate {
            network_id: net.id.clone(),
            ip_version: 4,
            cidr: Some("10.96.0.0/16".into()),
            project_id: Some(project.clone()),
            ..Default::default()
        })
        .await?;
    let cluster = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let ini = format!(
        "[kubernetes]\nenabled_handlers = service,endpoints,kuryrloadbalancer\npod_vif_driver = neutron-vif\n\
         vif_pool_driver = noop\ncluster_id = {cluster}\n[neutron_defaults]\nproject = {project}\n\
         pod_subnet = {s}\npod_security_groups = sg\nservice_subnet = {s}\n",
        s = subnet.id
    );
    let cfg = Arc::new(KuryrConfig::from_ini_str(&ini).context("bench config")?.config);
    let metrics = Metrics::new();
    let deployments = Deployments::noauth(&neutron_emu.url(), &metrics)?.with_octavia(
        "default",
        OctaviaClient::with_metrics(
            &ClientOptions::noauth(octavia_url),
            kuryr_controller::openstack::octavia_metrics_hook(&metrics),
        )?,
    );
    let mut opts = ControllerOptions::new(cfg, kube.clone(), deployments, metrics.clone());
    opts.health_addr = None;
    opts.metrics_addr = None;
    opts.identity = "services-bench".into();
    let stop = CancellationToken::new();
    let ctrl = tokio::spawn(run(opts, stop.clone()));
    let mut phases = Vec::new();

    // Phase 1: N Services, their endpoints already there (as for Services created with running pods).
    for i in 0..n {
        set_slice(&kube, &format!("svc-{i}"), &ips(i, 0)).await?;
    }
    let before = octavia_calls(&metrics);
    let t = Instant::now();
    let svcs = Api::<Service>::namespaced(kube.clone(), NS);
    for i in 0..n {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": format!("svc-{i}"), "namespace": NS},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
        }))?;
        svcs.create(&PostParams::default(), &svc).await?;
    }
    converged(&kube, n, |i| ips(i, 0)).await?;
    phases.push(Phase {
        name: format!("{name}: create {n} Services x 3 endpoints"),
        units: n,
        unit: "Service",
        secs: t.elapsed().as_secs_f64(),
        calls: diff(&octavia_calls(&metrics), &before),
        // Load balancer, listener, pool, then each member: one call each.
        upstream_writes: 6.0,
    });

    // Phase 2: every Service's endpoints change once (one endpoint replaced).
    let before = octavia_calls(&metrics);
    let t = Instant::now();
    for i in 0..n {
        set_slice(&kube, &format!("svc-{i}"), &ips(i, 1)).await?;
    }
    converged(&kube, n, |i| ips(i, 1)).await?;
    phases.push(Phase {
        name: format!("{name}: endpoints churn, 1 of 3 replaced"),
        units: n,
        unit: "change",
        secs: t.elapsed().as_secs_f64(),
        calls: diff(&octavia_calls(&metrics), &before),
        // One member delete and one member create.
        upstream_writes: 2.0,
    });

    // Phase 3: a burst of endpoint updates on one Service, as a rolling restart produces.
    let before = octavia_calls(&metrics);
    let t = Instant::now();
    for g in 2..(2 + BURST) {
        set_slice(&kube, "svc-0", &ips(0, g)).await?;
    }
    let last = 1 + BURST;
    converged(&kube, n, |i| if i == 0 { ips(0, last) } else { ips(i, 1) }).await?;
    phases.push(Phase {
        name: format!("{name}: burst of {BURST} endpoint updates on one Service"),
        units: BURST,
        unit: "update",
        secs: t.elapsed().as_secs_f64(),
        calls: diff(&octavia_calls(&metrics), &before),
        upstream_writes: 2.0,
    });

    // Phase 4: delete them all.
    let before = octavia_calls(&metrics);
    let t = Instant::now();
    svcs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), NS);
    let deadline = Instant::now() + TIMEOUT;
    while !klbs.list(&ListParams::default()).await?.items.is_empty() {
        if Instant::now() > deadline {
            bail!("timed out waiting for the load balancers to be released");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    phases.push(Phase {
        name: format!("{name}: delete {n} Services"),
        units: n,
        unit: "Service",
        secs: t.elapsed().as_secs_f64(),
        calls: diff(&octavia_calls(&metrics), &before),
        // Members, pool, listener, load balancer, one by one.
        upstream_writes: 6.0,
    });
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), ctrl).await;
    Ok(phases)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // RUST_LOG (e.g. `kuryr_neutron=debug,kuryr_controller=debug`) shows each Octavia call and handler retry.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let n: usize = match std::env::var("SVC_BENCH_SERVICES") {
        Ok(v) => v.parse().context("SVC_BENCH_SERVICES must be a number")?,
        Err(_) => 100,
    };
    let emu: OctaviaHandle = OctaviaEmulator::start(OctaviaOptions::amphora_noop()).await?;
    let mut phases = Vec::new();
    eprintln!("services bench: Octavia emulator (amphora-noop profile), {n} Services ...");
    phases.extend(run_target("emulator", &emu.url(), n).await?);
    match octavia_contract::env::real_octavia_url().map_err(anyhow::Error::msg)? {
        Some(url) => {
            eprintln!("services bench: real Octavia at {url}, {n} Services ...");
            phases.extend(run_target("octavia", &url, n).await?);
        }
        None => eprintln!("real Octavia skipped: {}", octavia_contract::env::skip_reason()),
    }
    println!();
    println!(
        "{:<58} {:>7} {:>8} {:>12} {:>11} {:>15}  operations",
        "phase", "secs", "units", "writes/unit", "reads/unit", "upstream wr/unit"
    );
    for p in &phases {
        let per = |v: u64| v as f64 / p.units as f64;
        println!(
            "{:<58} {:>7.2} {:>8} {:>12.2} {:>11.2} {:>15.1}  {}",
            p.name,
            p.secs,
            format!("{} {}", p.units, p.unit),
            per(writes(&p.calls)),
            per(reads(&p.calls)),
            p.upstream_writes,
            p.calls
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(())
}
