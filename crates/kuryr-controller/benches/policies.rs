//! NetworkPolicy churn: a namespace of N client pods (default 200) and a policy admitting them
//! to a web pod on 3 ports, run by the controller's `policy`, `kuryrnetworkpolicy` and
//! `pod_label` handlers against the Kubernetes API emulator and the Neutron emulator with the
//! measured real-server latency profile. Phases: apply the policy, add the (N+1)th client, then
//! relabel one client out of the peer and back in, several times. For each: time until Neutron's
//! address group holds exactly the clients, the controller's Neutron writes and reads (its own
//! call metrics) and its Kubernetes reads (GET/LIST requests, watches excluded), next to the
//! Neutron writes upstream's approach needs (one rule per client IP and port; computed).
//!
//! `cargo bench -p kuryr-controller --bench policies` (`NP_BENCH_PODS` overrides N,
//! `NP_BENCH_RELABELS` the relabel rounds, default 10).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_emulator::{KubeEmulator, KubeOptions};
use kuryr_config::KuryrConfig;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_neutron::{ClientOptions, ListFilter, NeutronClient};
use neutron_emulator::{Emulator, EmulatorOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "bench";
const PORTS: [u16; 3] = [80, 443, 8080];
const TIMEOUT: Duration = Duration::from_secs(60);

fn neutron_calls(metrics: &Metrics) -> BTreeMap<String, u64> {
    kuryr_controller::metrics::per_operation(&metrics.neutron_calls())
}

fn is_read(op: &str) -> bool {
    op.starts_with("get_") || op.starts_with("list_") || op.starts_with("show_")
}

/// Counts of one phase.
#[derive(Clone, Default)]
struct Counts {
    writes: u64,
    reads: u64,
    kube_reads: u64,
}

struct Meter {
    metrics: Metrics,
    kube_reads: Arc<AtomicU64>,
}

impl Meter {
    fn snapshot(&self) -> (BTreeMap<String, u64>, u64) {
        (
            neutron_calls(&self.metrics),
            self.kube_reads.load(Ordering::Relaxed),
        )
    }

    fn since(&self, before: &(BTreeMap<String, u64>, u64)) -> (Counts, BTreeMap<String, u64>) {
        let (after, kube) = self.snapshot();
        let ops: BTreeMap<String, u64> = after
            .iter()
            .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect();
        let c = Counts {
            writes: ops.iter().filter(|(k, _)| !is_read(k)).map(|(_, v)| v).sum(),
            reads: ops.iter().filter(|(k, _)| is_read(k)).map(|(_, v)| v).sum(),
            kube_reads: kube - before.1,
        };
        (c, ops)
    }
}

struct Row {
    phase: String,
    secs: Vec<f64>,
    counts: Counts,
    upstream_writes: u64,
    ops: String,
}

fn client_ip(i: usize) -> String {
    format!("10.200.{}.{}", i / 250, 2 + i % 250)
}

async fn create_pod(kube: &Client, name: &str, app: &str, ip: &str) -> Result<()> {
    let api = Api::<Pod>::namespaced(kube.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
        "spec": {"nodeName": "bench-node", "containers": [{"name": "c", "image": "busybox"}]}
    }))?;
    api.create(&PostParams::default(), &pod).await?;
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Waits until the project's address group holds exactly `want` (as /32 prefixes).
async fn group_is(neutron: &NeutronClient, project: &str, want: &BTreeSet<String>) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let ags = neutron
            .list_address_groups(&ListFilter::new().project_id(project))
            .await?;
        // The clients' group; the other one holds the namespace's Service VIPs (none here).
        let peers: Vec<_> = ags.iter().filter(|a| a.name != "i-service-vips").collect();
        if let [ag] = peers.as_slice() {
            let have: BTreeSet<String> = ag.addresses.iter().cloned().collect();
            if &have == want {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            let seen: Vec<(String, usize)> =
                ags.iter().map(|a| (a.name.clone(), a.addresses.len())).collect();
            bail!(
                "the address group did not reach {} addresses; the project's address groups: {seen:?}",
                want.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = |k: &str, d: usize| -> Result<usize> {
        match std::env::var(k) {
            Ok(v) => v.parse().with_context(|| format!("{k} must be a number")),
            Err(_) => Ok(d),
        }
    };
    let n = env("NP_BENCH_PODS", 200)?;
    let relabels = env("NP_BENCH_RELABELS", 10)?.max(1);

    let kube_handle = KubeEmulator::start(KubeOptions::default()).await?;
    let config = kube::Config::new(kube_handle.url().parse()?);
    let kube = Client::try_from(config.clone())?;
    let crds: Api<CustomResourceDefinition> = Api::all(kube.clone());
    for crd in kuryr_crds::generate::crds() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS, "labels": {"ns": NS}}}))?;
    Api::<Namespace>::all(kube.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    // The controller's own client, counting its reads (a watch is a long GET: not a read here).
    let kube_reads = Arc::new(AtomicU64::new(0));
    let counter = kube_reads.clone();
    let counted = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&tower::layer::layer_fn(move |svc| {
            let counter = counter.clone();
            tower::util::MapRequest::new(svc, move |req: http::Request<kube::client::Body>| {
                let q = req.uri().query().unwrap_or("");
                if req.method() == http::Method::GET && !q.contains("watch=") {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                req
            })
        }))
        .build();

    let emu = Emulator::start(EmulatorOptions::real_server()).await?;
    let neutron = NeutronClient::new(&ClientOptions::noauth(emu.url()))?;
    let project = uuid::Uuid::new_v4().simple().to_string();
    let net = neutron
        .create_network(&kuryr_neutron::NetworkCreate {
            project_id: Some(project.clone()),
            ..Default::default()
        })
        .await?;
    let subnet = neutron
        .create_subnet(&kuryr_neutron::SubnetCreate {
            network_id: net.id,
            ip_version: 4,
            cidr: Some("10.200.0.0/16".into()),
            project_id: Some(project.clone()),
            ..Default::default()
        })
        .await?;
    let sg = neutron
        .create_security_group(&kuryr_neutron::SecurityGroupCreate {
            name: "pods".into(),
            project_id: Some(project.clone()),
            ..Default::default()
        })
        .await?;
    let ini = format!(
        "[kubernetes]\nenabled_handlers = policy,kuryrnetworkpolicy,pod_label\npod_vif_driver = neutron-vif\n\
         vif_pool_driver = noop\npod_security_groups_driver = policy\ncluster_id = np-bench\n\
         [neutron_defaults]\nproject = {project}\npod_subnet = {}\npod_security_groups = {}\n",
        subnet.id, sg.id
    );
    let cfg = Arc::new(KuryrConfig::from_ini_str(&ini).context("bench config")?.config);
    let metrics = Metrics::new();
    let deployments = Deployments::noauth(&emu.url(), &metrics)?;
    let mut opts = ControllerOptions::new(cfg, counted, deployments, metrics.clone());
    opts.health_addr = None;
    opts.metrics_addr = None;
    opts.identity = "np-bench".into();
    let stop = CancellationToken::new();
    let controller = tokio::spawn(run(opts, stop.clone()));
    let meter = Meter { metrics, kube_reads };

    create_pod(&kube, "web", "web", "10.200.255.1").await?;
    for i in 0..n {
        create_pod(&kube, &format!("client-{i}"), "client", &client_ip(i)).await?;
    }
    // Let the pod events of a cluster without policies pass (they cost nothing).
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut rows = vec![];
    let mut members: BTreeSet<String> = (0..n).map(|i| format!("{}/32", client_ip(i))).collect();

    let before = meter.snapshot();
    let t = Instant::now();
    let ports: Vec<_> = PORTS.iter().map(|p| json!({"port": p})).collect();
    let np: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": ports}]}
    }))?;
    Api::<NetworkPolicy>::namespaced(kube.clone(), NS)
        .create(&PostParams::default(), &np)
        .await?;
    group_is(&neutron, &project, &members).await?;
    let secs = t.elapsed().as_secs_f64();
    // Rules are created after the group's addresses: wait for the whole apply to settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (counts, ops) = meter.since(&before);
    rows.push(Row {
        phase: format!("apply a policy admitting {n} pods on {} ports", PORTS.len()),
        secs: vec![secs],
        counts,
        upstream_writes: 1 + (n * PORTS.len()) as u64,
        ops: fmt_ops(&ops),
    });

    let before = meter.snapshot();
    let t = Instant::now();
    create_pod(&kube, &format!("client-{n}"), "client", &client_ip(n)).await?;
    members.insert(format!("{}/32", client_ip(n)));
    group_is(&neutron, &project, &members).await?;
    let secs = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (counts, ops) = meter.since(&before);
    rows.push(Row {
        phase: format!("pod {} joins the peer (new pod)", n + 1),
        secs: vec![secs],
        counts,
        upstream_writes: PORTS.len() as u64,
        ops: fmt_ops(&ops),
    });

    let pods = Api::<Pod>::namespaced(kube.clone(), NS);
    let mut out_secs = vec![];
    let mut in_secs = vec![];
    let mut out_counts = Counts::default();
    let mut in_counts = Counts::default();
    let mut out_ops = BTreeMap::new();
    let mut in_ops = BTreeMap::new();
    for round in 0..relabels {
        let name = format!("client-{round}");
        let addr = format!("{}/32", client_ip(round));
        for (app, secs, counts, opsum) in [
            ("other", &mut out_secs, &mut out_counts, &mut out_ops),
            ("client", &mut in_secs, &mut in_counts, &mut in_ops),
        ] {
            let before = meter.snapshot();
            let t = Instant::now();
            pods.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"app": app}}})),
            )
            .await?;
            if app == "other" {
                members.remove(&addr);
            } else {
                members.insert(addr.clone());
            }
            group_is(&neutron, &project, &members).await?;
            secs.push(t.elapsed().as_secs_f64());
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (c, ops) = meter.since(&before);
            counts.writes += c.writes;
            counts.reads += c.reads;
            counts.kube_reads += c.kube_reads;
            for (k, v) in ops {
                *opsum.entry(k).or_default() += v;
            }
        }
    }
    let per = |c: &Counts| Counts {
        writes: c.writes / relabels as u64,
        reads: c.reads / relabels as u64,
        kube_reads: c.kube_reads / relabels as u64,
    };
    let avg_ops = |ops: &BTreeMap<String, u64>| -> BTreeMap<String, u64> {
        ops.iter()
            .map(|(k, v)| (k.clone(), v / relabels as u64))
            .collect()
    };
    rows.push(Row {
        phase: "a pod relabelled out of the peer".into(),
        secs: out_secs,
        counts: per(&out_counts),
        upstream_writes: PORTS.len() as u64,
        ops: fmt_ops(&avg_ops(&out_ops)),
    });
    rows.push(Row {
        phase: "a pod relabelled into the peer".into(),
        secs: in_secs,
        counts: per(&in_counts),
        upstream_writes: PORTS.len() as u64,
        ops: fmt_ops(&avg_ops(&in_ops)),
    });

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(15), controller).await;

    println!();
    println!(
        "NetworkPolicy churn, {n} client pods, Neutron emulator (real-server latency profile); per event \
         ({relabels} relabel rounds: median and max)"
    );
    println!(
        "{:<46} {:>9} {:>9} {:>8} {:>8} {:>11} {:>10}  operations",
        "phase", "median s", "max s", "writes", "reads", "kube reads", "upstream w"
    );
    for r in &rows {
        let mut s = r.secs.clone();
        s.sort_by(f64::total_cmp);
        println!(
            "{:<46} {:>9.3} {:>9.3} {:>8} {:>8} {:>11} {:>10}  {}",
            r.phase,
            s[s.len() / 2],
            s[s.len() - 1],
            r.counts.writes,
            r.counts.reads,
            r.counts.kube_reads,
            r.upstream_writes,
            r.ops
        );
    }
    tracker_table();
    Ok(())
}

/// The in-memory half of a pod event, no servers: `PolicyTracker::stale` after one pod relabel
/// in a cluster of `namespaces` namespaces with one policy and 40 pods each, computing only the
/// policies that can see the pod against computing every policy (what every pod event cost
/// before the tracker noted who sees what; forced here by a namespace label change).
fn tracker_table() {
    use kuryr_controller::policies::{ClusterIndex, Options, PodInfo, PodKey, PolicySpec, PolicyTracker};
    println!();
    println!("Policy tracker: one pod event, in memory (one policy and 40 pods per namespace)");
    println!(
        "{:>10} {:>8} {:>8} {:>16} {:>16} {:>7}",
        "namespaces", "pods", "policies", "seeing it us", "all policies us", "ratio"
    );
    for namespaces in [10usize, 50, 200] {
        let mut index = ClusterIndex::default();
        let mut policies = BTreeMap::new();
        for n in 0..namespaces {
            let ns = format!("ns{n}");
            index
                .namespaces
                .insert(ns.clone(), [("ns".to_string(), ns.clone())].into());
            for p in 0..40u32 {
                index.pods.insert(
                    PodKey::new(&ns, format!("p{p}")),
                    PodInfo {
                        uid: None,
                        labels: [(
                            "app".to_string(),
                            if p.is_multiple_of(2) { "web" } else { "db" }.to_string(),
                        )]
                        .into(),
                        ips: vec![format!("10.{}.{}.{}", n / 200, n % 200, p + 1).parse().unwrap()],
                        named_ports: vec![],
                    },
                );
            }
            let np: NetworkPolicy = serde_json::from_value(json!({
                "metadata": {"namespace": ns, "name": "db"},
                "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 5432}]}]}
            }))
            .unwrap();
            policies.insert(format!("u{n}"), PolicySpec::parse(&np).unwrap());
        }
        let opts = Options::default();
        let mut t = PolicyTracker::new(index, policies);
        for (uid, _, want) in t.stale(&opts) {
            t.record_applied(&uid, want);
        }
        let rounds = 200u32;
        let relabel = |t: &mut PolicyTracker, i: u32| {
            let key = PodKey::new(format!("ns{}", i as usize % namespaces), "p0");
            let mut info = t.cluster().pods[&key].clone();
            let app = if i.is_multiple_of(2) { "db" } else { "web" };
            info.labels.insert("app".into(), app.into());
            t.set_pod_info(key, Some(info));
        };
        let timed = |t: &mut PolicyTracker, every: bool| {
            let start = Instant::now();
            for i in 0..rounds {
                relabel(t, i);
                if every {
                    t.set_namespace_labels("ns0", Some([("ns".into(), format!("ns0-{i}"))].into()));
                }
                for (uid, _, want) in t.stale(&opts) {
                    t.record_applied(&uid, want);
                }
            }
            start.elapsed().as_secs_f64() * 1e6 / f64::from(rounds)
        };
        let seeing = timed(&mut t, false);
        let all = timed(&mut t, true);
        println!(
            "{:>10} {:>8} {:>8} {:>16.1} {:>16.1} {:>6.1}x",
            namespaces,
            namespaces * 40,
            namespaces,
            seeing,
            all,
            all / seeing
        );
    }
}

fn fmt_ops(ops: &BTreeMap<String, u64>) -> String {
    let s: Vec<String> = ops.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if s.is_empty() { "none".into() } else { s.join(" ") }
}
