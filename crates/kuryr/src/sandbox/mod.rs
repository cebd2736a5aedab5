//! `kuryr sandbox`: a cluster on one machine, wiring demo pods to Neutron ports.
//!
//! Kubernetes is the in-repo API emulator (kubectl works against it through the kubeconfig it
//! writes); Neutron is the embedded emulator with the real server's latency profile, or a real
//! neutron-server (`--neutron-url`). On top run an in-process controller (neutron-vif, noop pool),
//! the scheduler stand-in and a kubelet stand-in for k8s-node-1 and k8s-node-2 that marks a pod
//! Running with the IP of its KuryrPort once the VIF is active, as the CNI daemon would report it.

mod deployments;
mod report;
pub(crate) mod services;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube_emulator::standins::{SetupFn, spawn_endpointslice_controller, spawn_kubelet, spawn_scheduler};
use kube_emulator::{KubeEmulator, KubeHandle, KubeOptions};
use kuryr_config::KuryrConfig;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::service::{ControllerOptions, run as run_controller};
use kuryr_crds::KuryrPort;
use kuryr_neutron::{ClientOptions, ListFilter, NeutronClient};
use neutron_emulator::{AgentHosts, Emulator, EmulatorHandle, EmulatorOptions, LatencyProfile};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::{LatencyArg, SandboxArgs};
use crate::services::shutdown_signal;
use report::Summary;

const NODES: [&str; 2] = ["k8s-node-1", "k8s-node-2"];
/// How long the kubelet stand-in waits for a pod's VIF (upstream `vif_annotation_timeout`).
const VIF_TIMEOUT: Duration = Duration::from_secs(60);

/// `namespace/name` -> when its KuryrPort was first seen with an active default VIF.
type ActiveSince = Arc<Mutex<HashMap<String, Instant>>>;

pub async fn run(args: SandboxArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    deployments::check_args(&args)?;
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("--state-dir {}", args.state_dir.display()))?;
    let state_dir = args
        .state_dir
        .canonicalize()
        .unwrap_or_else(|_| args.state_dir.clone());

    // Kubernetes.
    let kube = KubeEmulator::start(KubeOptions {
        bind: args.kube_listen,
        nodes: NODES.map(String::from).to_vec(),
        ..KubeOptions::default()
    })
    .await
    .context("starting the Kubernetes API emulator")?;
    let kubeconfig = state_dir.join("kubeconfig");
    kube.write_kubeconfig(&kubeconfig)?;
    let client = kube::Client::try_from(kube::Config::new(kube.url().parse()?))
        .context("Kubernetes client for the emulator")?;
    apply_crds(&client).await?;
    println!(
        "Kubernetes API emulator at {} (nodes: {})",
        kube.url(),
        NODES.join(", ")
    );
    println!("  export KUBECONFIG={}", kubeconfig.display());

    // Neutron.
    let (neutron_url, emulator, neutron_label) = start_neutron(&args).await?;
    println!("Neutron: {neutron_label}");
    let neutron = NeutronClient::new(&ClientOptions::noauth(&neutron_url)).context("Neutron client")?;
    let mut demo = DemoNetwork::create(&neutron, &args.cidr).await?;
    println!(
        "  project {}: network {}, subnet {} ({}), security group {}",
        demo.project, demo.network, demo.subnet, args.cidr, demo.security_group
    );
    let ports = ports_needed(&args);
    if let Err(e) = demo.fit_port_quota(&neutron, ports).await {
        demo.delete(&neutron).await;
        return Err(e);
    }
    let extras = deployments::start(&args, ports).await?;
    let octavia = if args.services > 0 {
        let (network, subnet) = services::create_service_subnet(&neutron, &demo.project).await?;
        println!(
            "  service network {network}, subnet {subnet} ({})",
            services::SERVICE_CIDR
        );
        demo.service = Some((network, subnet));
        let o = services::start_octavia(args.octavia_url.as_deref()).await?;
        println!("Octavia: {}", o.label);
        Some(o)
    } else {
        None
    };

    // Controller, scheduler, kubelets.
    let metrics = Metrics::new();
    let stop = CancellationToken::new();
    let mut controller = start_controller(
        &args,
        &state_dir,
        &client,
        OpenStackUrls {
            neutron: &neutron_url,
            octavia: octavia.as_ref().map(|o| o.url.as_str()),
            others: &extras,
        },
        &demo,
        metrics.clone(),
        stop.clone(),
    )?;
    let _scheduler = spawn_scheduler(kube.store());
    let _endpointslices = spawn_endpointslice_controller(kube.store());
    let _kubelet = spawn_kubelet(
        kube.store(),
        NODES.map(String::from).to_vec(),
        kubelet_setup(client.clone()),
        None,
    );
    let active = ActiveSince::default();
    let tracker = tokio::spawn(track_active(client.clone(), active.clone()));

    // Demo workload.
    let namespaces: Vec<String> = (1..=args.namespaces).map(|i| format!("demo-{i}")).collect();
    for (i, ns) in namespaces.iter().enumerate() {
        let zone = (!extras.is_empty()).then(|| deployments::namespace_zone(i, extras.len() + 1));
        create_namespace(&client, ns, zone.as_deref()).await?;
    }
    println!("creating {} pods in {} ...", args.pods, namespaces.join(", "));
    let mut created: Vec<(String, Instant)> = Vec::with_capacity(args.pods);
    for i in 0..args.pods {
        let ns = &namespaces[i % namespaces.len()];
        let name = format!("demo-{i}");
        let at = Instant::now();
        create_pod(&client, ns, &name).await?;
        created.push((format!("{ns}/{name}"), at));
    }
    let wiring_started = created.first().map_or_else(Instant::now, |(_, at)| *at);

    // Progress until every pod is wired and Running, the timeout, Ctrl-C or a controller failure.
    let deadline = wiring_started + Duration::from_secs(args.timeout);
    let ctrl_c = shutdown_signal();
    tokio::pin!(ctrl_c);
    let mut interrupted = false;
    let mut last = (usize::MAX, usize::MAX);
    let mut running;
    loop {
        let wired = count_wired(&active, &created);
        running = count_running(&client, &namespaces).await;
        if (wired, running) != last {
            println!(
                "  [{:>5.1}s] KuryrPorts active {wired}/{n}   pods Running {running}/{n}",
                wiring_started.elapsed().as_secs_f64(),
                n = args.pods
            );
            last = (wired, running);
        }
        if wired == args.pods && running == args.pods {
            break;
        }
        if Instant::now() > deadline {
            println!(
                "timed out after {}s waiting for the pods (see the controller's log above)",
                args.timeout
            );
            break;
        }
        if controller.is_finished() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = &mut ctrl_c => { interrupted = true; break; }
        }
    }
    if controller.is_finished() {
        match (&mut controller).await {
            Ok(Ok(())) => anyhow::bail!("the controller stopped unexpectedly"),
            Ok(Err(e)) => anyhow::bail!("the controller failed: {e}"),
            Err(e) => anyhow::bail!("the controller task failed: {e}"),
        }
    }

    // Services once the pods run, so that the time to ACTIVE is the load balancers' own.
    let mut services_ok = true;
    if args.services > 0 && running == args.pods && !interrupted && !controller.is_finished() {
        let mut per_ns = std::collections::BTreeMap::new();
        for (name, _) in &created {
            if let Some((ns, _)) = name.split_once('/') {
                *per_ns.entry(ns.to_string()).or_insert(0usize) += 1;
            }
        }
        println!("creating {} Services ...", args.services);
        let svcs = services::create_services(&client, &namespaces, args.services).await?;
        let results = services::wait_services(
            &client,
            &svcs,
            &per_ns,
            Instant::now() + Duration::from_secs(args.timeout),
        )
        .await;
        let times: Vec<Duration> = results.iter().filter_map(|r| r.ready_after).collect();
        services_ok = times.len() == args.services;
        for r in &results {
            println!(
                "  {:<24} VIP {:<15} {} members  {}",
                r.name,
                r.vip,
                r.members,
                r.ready_after.map_or_else(
                    || "not ACTIVE".to_string(),
                    |d| format!("ACTIVE after {} ms", d.as_millis())
                )
            );
        }
        println!(
            "load balancers: {}/{} ACTIVE with every pod of their namespace; time to ACTIVE p50 {} ms, max {} ms",
            times.len(),
            args.services,
            report::percentile(&times, 50.0).map_or(0, |d| d.as_millis()),
            times.iter().max().map_or(0, |d| d.as_millis()),
        );
        let calls = report::octavia_calls(&metrics.encode());
        let per_op: Vec<String> = calls
            .iter()
            .map(|(op, r)| format!("{op} {}", r.values().sum::<u64>()))
            .collect();
        println!("Octavia calls: {}", per_op.join(", "));
    }

    let latencies = latencies(&active, &created);
    let wired = latencies.len();
    let summary = Summary {
        neutron: neutron_label.clone(),
        pods_created: args.pods,
        pods_wired: wired,
        pods_running: running,
        elapsed: active
            .lock()
            .map(|a| {
                a.values()
                    .max()
                    .map(|t| t.saturating_duration_since(wiring_started))
            })
            .ok()
            .flatten()
            .unwrap_or_default(),
        latencies,
        calls: report::neutron_calls(&metrics.encode()),
        emulator_requests: emulator.as_ref().map(|e| e.stats().total_requests),
    };
    print!("{}", summary.render());
    if !extras.is_empty() {
        print!(
            "{}",
            deployments::report(&client, &namespaces, (&neutron, &demo.project), &extras).await
        );
    }
    println!("sandbox up in {:.1}s", started.elapsed().as_secs_f64());
    let all_wired = wired == args.pods && running == args.pods;

    if !args.exit_after_summary && !interrupted {
        println!(
            "Try:\n  export KUBECONFIG={}\n  kubectl get pods -A -o wide\n  kubectl get kp -A\n  kubectl get klb -A",
            kubeconfig.display()
        );
        println!("Running until Ctrl-C ...");
        ctrl_c.await;
    }

    // Shutdown. A real neutron-server outlives the sandbox: release what the demo created.
    // A real Octavia outlives the sandbox too.
    if octavia.as_ref().is_some_and(|o| o.emulator.is_none()) {
        services::release_services(&client, &namespaces).await;
    }
    if emulator.is_none() {
        release_demo(&client, &namespaces, &active).await;
        demo.delete(&neutron).await;
    }
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(15), controller).await;
    if emulator.is_none() {
        demo.delete_claim(&neutron).await;
    }
    tracker.abort();
    shutdown_kube(kube).await;
    if let Some(emu) = emulator {
        emu.shutdown().await;
    }
    for e in extras {
        e.emulator.shutdown().await;
        if let Some(emu) = e.services.and_then(|(_, o)| o.emulator) {
            emu.shutdown().await;
        }
    }
    if let Some(emu) = octavia.and_then(|o| o.emulator) {
        emu.shutdown().await;
    }
    if args.exit_after_summary && !all_wired {
        anyhow::bail!("{wired} of {} pods were wired", args.pods);
    }
    if args.exit_after_summary && !services_ok {
        anyhow::bail!("not every demo Service got an ACTIVE load balancer with all its members");
    }
    Ok(())
}

async fn start_neutron(args: &SandboxArgs) -> anyhow::Result<(String, Option<EmulatorHandle>, String)> {
    if let Some(url) = &args.neutron_url {
        let url = url.trim_end_matches('/').to_string();
        return Ok((url.clone(), None, format!("neutron-server at {url} (noauth)")));
    }
    let opts = match args.latency {
        LatencyArg::RealServer => EmulatorOptions::real_server(),
        LatencyArg::None => EmulatorOptions {
            latency: LatencyProfile::None,
            active_delay: Duration::from_millis(50),
            ..EmulatorOptions::default()
        },
    };
    let emu = Emulator::start(EmulatorOptions {
        agent_hosts: AgentHosts::Only(NODES.iter().map(|n| n.to_string()).collect()),
        ..opts
    })
    .await?;
    let profile = match args.latency {
        LatencyArg::RealServer => "real-server latency profile",
        LatencyArg::None => "no added latency",
    };
    let label = format!("embedded emulator at {} ({profile})", emu.url());
    Ok((emu.url(), Some(emu), label))
}

pub(crate) async fn apply_crds(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in kuryr_crds::generate::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &crd)
            .await
            .with_context(|| format!("applying CRD {name}"))?;
    }
    Ok(())
}

/// The Neutron side of the demo: its own project, network, subnet and security group.
pub(crate) struct DemoNetwork {
    pub(crate) project: String,
    pub(crate) network: String,
    pub(crate) subnet: String,
    pub(crate) security_group: String,
    /// The service network and subnet (with `--services`).
    pub(crate) service: Option<(String, String)>,
}

impl DemoNetwork {
    pub(crate) async fn create(neutron: &NeutronClient, cidr: &str) -> anyhow::Result<Self> {
        // Keystone-shaped (32 hex digits): Octavia refuses project ids longer than 36 characters.
        let project = uuid::Uuid::new_v4().simple().to_string();
        let network = neutron
            .create_network(&kuryr_neutron::NetworkCreate {
                name: Some("kuryr-sandbox-pods".into()),
                project_id: Some(project.clone()),
                ..Default::default()
            })
            .await
            .context("creating the demo network")?;
        let subnet = neutron
            .create_subnet(&kuryr_neutron::SubnetCreate {
                network_id: network.id.clone(),
                ip_version: 4,
                cidr: Some(cidr.to_string()),
                name: Some("kuryr-sandbox-pods".into()),
                project_id: Some(project.clone()),
                ..Default::default()
            })
            .await
            .with_context(|| format!("creating the demo subnet {cidr}"))?;
        let sg = neutron
            .create_security_group(&kuryr_neutron::SecurityGroupCreate {
                name: "kuryr-sandbox-pods".into(),
                project_id: Some(project.clone()),
                description: Some("kuryr sandbox demo pods".into()),
                ..Default::default()
            })
            .await
            .context("creating the demo security group")?;
        Ok(Self {
            project,
            network: network.id,
            subnet: subnet.id,
            security_group: sg.id,
            service: None,
        })
    }

    /// Raises the demo project's port quota to `ports` when Neutron's default (500) is lower, so
    /// that `--pods` decides how many pods run, not the quota; refuses up front when it cannot.
    pub(crate) async fn fit_port_quota(&self, neutron: &NeutronClient, ports: i64) -> anyhow::Result<()> {
        let details = neutron
            .get_quota_details(&self.project)
            .await
            .context("reading the demo project's port quota")?;
        let limit = details.get("port").map_or(-1, |q| q.limit);
        if limit < 0 || limit >= ports {
            return Ok(());
        }
        let req = kuryr_neutron::QuotaUpdate {
            port: Some(ports),
            ..Default::default()
        };
        neutron.update_quota(&self.project, &req).await.with_context(|| {
            format!(
                "the demo needs up to {ports} ports (--pods, --pool, --services), the demo project's port \
                 quota is {limit} and raising it failed; use fewer --pods"
            )
        })?;
        println!("  port quota of the demo project raised from {limit} to {ports}");
        Ok(())
    }

    /// This run's `cluster_id`: each run is another cluster (another emulated kube-system), so a
    /// run left unfinished on a real Neutron never meets the next one's claim.
    pub(crate) fn cluster_id(&self) -> String {
        format!("sandbox-{}", &self.project[..8])
    }

    /// The controller's cluster_id claim, once the controller is stopped (a running one would
    /// claim the id again).
    pub(crate) async fn delete_claim(&self, neutron: &NeutronClient) {
        let claim = kuryr_controller::cluster_claim::group_name(&self.cluster_id());
        if let Ok(sgs) = neutron
            .list_security_groups(&ListFilter::new().name(&claim))
            .await
        {
            for sg in sgs.iter().filter(|sg| sg.project_id == self.project) {
                if let Err(e) = neutron.delete_security_group(&sg.id).await {
                    eprintln!("  cannot delete the cluster_id claim {}: {e}", sg.id);
                }
            }
        }
    }

    /// Best effort: anything left in the demo project (ports the controller did not release).
    pub(crate) async fn delete(&self, neutron: &NeutronClient) {
        // A real server keeps per-project quotas after the project's resources are gone.
        let _ = neutron.reset_quota(&self.project).await;
        let project = ListFilter::new().project_id(&self.project);
        match neutron.list_ports(&project).await {
            Ok(ports) => {
                for p in ports {
                    if let Err(e) = neutron.delete_port(&p.id).await {
                        eprintln!("  leaving port {}: {e}", p.id);
                    }
                }
            }
            Err(e) => eprintln!("  cannot list the demo ports: {e}"),
        }
        if let Some((network, _)) = &self.service
            && let Err(e) = neutron.delete_network(network).await
        {
            eprintln!("  cannot delete the service network: {e}");
        }
        for (what, result) in [
            ("network", neutron.delete_network(&self.network).await),
            (
                "security group",
                neutron.delete_security_group(&self.security_group).await,
            ),
        ] {
            if let Err(e) = result {
                eprintln!("  cannot delete the demo {what}: {e}");
            }
        }
        // The `default` group Neutron made for the project with its first port. Listed without a
        // project filter: a project-filtered list would make Neutron create it again.
        if let Ok(sgs) = neutron
            .list_security_groups(&ListFilter::new().name("default"))
            .await
        {
            for sg in sgs.iter().filter(|sg| sg.project_id == self.project) {
                if let Err(e) = neutron.delete_security_group(&sg.id).await {
                    eprintln!("  cannot delete the project's default security group: {e}");
                }
            }
        }
    }
}

/// Ports the demo holds at most: one per pod, and with `--pool` the pools' ports ahead of demand
/// (refills sized by the waiting pods can double a burst, plus a batch per node), and headroom
/// for the Service VIPs and the project's own ports.
fn ports_needed(args: &SandboxArgs) -> i64 {
    let pods = i64::try_from(args.pods).unwrap_or(i64::MAX);
    let pools = if args.pool {
        pods.saturating_add(i64::try_from(NODES.len() * POOL_BATCH).unwrap_or(0))
    } else {
        0
    };
    let services = i64::try_from(args.services).unwrap_or(i64::MAX);
    pods.saturating_add(pools)
        .saturating_add(services)
        .saturating_add(20)
}

/// `[vif_pool] ports_pool_batch` as the sandbox leaves it (upstream's default).
const POOL_BATCH: usize = 10;

/// Where the controller finds Neutron and (with `--services`) Octavia, and the other
/// deployments (`--deployments`).
#[derive(Clone, Copy)]
struct OpenStackUrls<'a> {
    neutron: &'a str,
    octavia: Option<&'a str>,
    others: &'a [deployments::Extra],
}

fn controller_config(
    urls: OpenStackUrls<'_>,
    demo: &DemoNetwork,
    pool_socket: Option<&Path>,
) -> anyhow::Result<KuryrConfig> {
    let (neutron_zone, placement) = if urls.others.is_empty() {
        (String::new(), String::new())
    } else {
        deployments::config_lines(urls.others, &demo.project)
    };
    let neutron_url = urls.neutron;
    let cluster_id = demo.cluster_id();
    let (handlers, octavia) = match (urls.octavia, &demo.service) {
        (Some(url), Some((_, subnet))) => (
            "vif,kuryrport,service,endpoints,kuryrloadbalancer",
            format!(
                "load_balancer_endpoint_override = {url}\n[neutron_defaults]\nservice_subnet = {subnet}\n"
            ),
        ),
        _ => ("vif,kuryrport", "[neutron_defaults]\n".to_string()),
    };
    let pool = match pool_socket {
        Some(sock) => format!(
            "vif_pool_driver = neutron\nenable_manager = True\n[pool_manager]\nsock_file = {}\n",
            sock.display()
        ),
        None => "vif_pool_driver = noop\n".to_string(),
    };
    let ini = format!(
        "[kubernetes]\n\
         enabled_handlers = {handlers}\n\
         pod_vif_driver = neutron-vif\n\
         cluster_id = {cluster_id}\n\
         {pool}\
         [neutron]\n\
         endpoint_override = {neutron_url}\n\
         {neutron_zone}\
         {octavia}\
         project = {project}\n\
         pod_subnet = {subnet}\n\
         pod_security_groups = {sg}\n\
         resource_tags = kuryr-sandbox\n\
         {placement}",
        project = demo.project,
        subnet = demo.subnet,
        sg = demo.security_group,
    );
    let loaded = KuryrConfig::from_ini_str(&ini).context("sandbox controller configuration")?;
    Ok(loaded.config)
}

fn start_controller(
    args: &SandboxArgs,
    state_dir: &Path,
    client: &kube::Client,
    urls: OpenStackUrls<'_>,
    demo: &DemoNetwork,
    metrics: Metrics,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<Result<(), kuryr_controller::Error>>> {
    let pool_socket = args.pool.then(|| state_dir.join("kuryr_manage.sock"));
    if let Some(sock) = &pool_socket {
        // A socket left by an earlier run would make the bind fail.
        let _ = std::fs::remove_file(sock);
        println!(
            "port pools on (neutron pool driver): kuryr pools --socket {} list",
            sock.display()
        );
    }
    let config = Arc::new(controller_config(urls, demo, pool_socket.as_deref())?);
    let deployments =
        Deployments::from_config(&config, &metrics).context("Neutron client of the controller")?;
    let mut opts = ControllerOptions::new(config, client.clone(), deployments, metrics);
    opts.identity = "kuryr-sandbox-controller".into();
    opts.health_addr = None;
    opts.metrics_addr = args.metrics_addr;
    if let Some(addr) = args.metrics_addr {
        println!("controller metrics at http://{addr}/metrics");
    }
    Ok(tokio::spawn(run_controller(opts, stop)))
}

/// The kubelet's CNI ADD, as the CNI daemon answers it: wait for the pod's KuryrPort (same pod
/// UID) to carry an active default VIF and report its first IP.
pub(crate) fn kubelet_setup(client: kube::Client) -> SetupFn {
    Arc::new(move |pod: Value| {
        let client = client.clone();
        Box::pin(async move {
            let field = |p: &str| {
                pod.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let (ns, name, uid) = (
                field("/metadata/namespace"),
                field("/metadata/name"),
                field("/metadata/uid"),
            );
            let api: Api<KuryrPort> = Api::namespaced(client, &ns);
            let deadline = Instant::now() + VIF_TIMEOUT;
            loop {
                match api.get_opt(&name).await {
                    Ok(Some(kp)) if kp.spec.pod_uid == uid => {
                        if let Some((_, vif)) = kp.status.as_ref().and_then(|s| s.default_vif())
                            && vif.active()
                        {
                            return Ok(vif.fixed_ips().next().map(|(_, ip)| ip.to_string()));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(pod = %format!("{ns}/{name}"), error = %e, "reading KuryrPort"),
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "timed out after {}s waiting for an active VIF",
                        VIF_TIMEOUT.as_secs()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    })
}

/// Records when each KuryrPort first shows an active default VIF (watch, so no poll interval skews it).
async fn track_active(client: kube::Client, active: ActiveSince) {
    let api: Api<KuryrPort> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        let kp = match event {
            Ok(watcher::Event::Apply(kp) | watcher::Event::InitApply(kp)) => kp,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "KuryrPort watch");
                continue;
            }
        };
        let is_active = kp
            .status
            .as_ref()
            .and_then(|s| s.default_vif())
            .is_some_and(|(_, vif)| vif.active());
        if is_active {
            let key = format!(
                "{}/{}",
                kp.metadata.namespace.as_deref().unwrap_or_default(),
                kp.metadata.name.as_deref().unwrap_or_default()
            );
            if let Ok(mut a) = active.lock() {
                a.entry(key).or_insert_with(Instant::now);
            }
        }
    }
}

fn count_wired(active: &ActiveSince, created: &[(String, Instant)]) -> usize {
    active
        .lock()
        .map(|a| created.iter().filter(|(k, _)| a.contains_key(k)).count())
        .unwrap_or(0)
}

fn latencies(active: &ActiveSince, created: &[(String, Instant)]) -> Vec<Duration> {
    active
        .lock()
        .map(|a| {
            created
                .iter()
                .filter_map(|(k, at)| a.get(k).map(|t| t.saturating_duration_since(*at)))
                .collect()
        })
        .unwrap_or_default()
}

async fn count_running(client: &kube::Client, namespaces: &[String]) -> usize {
    let mut n = 0;
    for ns in namespaces {
        if let Ok(pods) = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
        {
            n += pods
                .items
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .is_some_and(|s| s.phase.as_deref() == Some("Running") && s.pod_ip.is_some())
                })
                .count();
        }
    }
    n
}

/// A demo namespace; `zone` is the availability zone it asks for (`--deployments`).
async fn create_namespace(client: &kube::Client, name: &str, zone: Option<&str>) -> anyhow::Result<()> {
    let mut annotations = serde_json::Map::new();
    if let Some(z) = zone {
        annotations.insert(kuryr_controller::placement::AZ_ANNOTATION.into(), z.into());
    }
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kuryr-sandbox": "demo"}, "annotations": annotations}
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

async fn create_pod(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "kuryr-sandbox-demo"}},
        "spec": {"containers": [{"name": "demo", "image": "registry.k8s.io/pause:3.10"}]}
    }))?;
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {ns}/{name}"))?;
    Ok(())
}

/// Deletes the demo pods and waits for the controller to release their ports and finalizers.
async fn release_demo(client: &kube::Client, namespaces: &[String], active: &ActiveSince) {
    println!("releasing the demo pods' Neutron ports ...");
    for ns in namespaces {
        let api = Api::<Pod>::namespaced(client.clone(), ns);
        if let Err(e) = api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
        {
            eprintln!("  deleting pods in {ns}: {e}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = Api::<KuryrPort>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(usize::MAX);
        if left == 0 {
            let n = active.lock().map(|a| a.len()).unwrap_or(0);
            println!("  released {n} ports");
            return;
        }
        if Instant::now() > deadline {
            eprintln!("  {left} KuryrPorts still present after 60s; sweeping the demo project");
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn shutdown_kube(kube: KubeHandle) {
    if let Err(e) = kube.shutdown().await {
        tracing::warn!(error = %e, "stopping the Kubernetes API emulator");
    }
}
