//! `kuryr chaos`: a soak of the controller as separate processes (two replicas, leader
//! election on a Lease) against the Kubernetes, Neutron and Octavia emulators (or a real
//! neutron-server), under pod churn and injected faults, with an invariant checker run
//! throughout and at the end. See docs/chaos.md.
//!
//! - [`profile`]: the profiles and their fault schedule (pure);
//! - [`invariants`]: the checker (pure, over [`invariants::Snapshot`]s);
//! - [`snapshot`]: reads a snapshot from the APIs;
//! - [`churn`]: the workload; [`procs`]: the child processes; [`report`]: the table;
//! - [`nodes`]: the nodes (a network namespace and a CNI daemon process each) and the
//!   kubelet's CNI calls.

pub mod churn;
pub mod invariants;
pub mod nodes;
pub mod procs;
pub mod profile;
pub mod report;
pub mod snapshot;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PostParams};
use kube_emulator::standins::{spawn_endpointslice_controller, spawn_kubelet, spawn_scheduler};
use kube_emulator::{KubeEmulator, KubeHandle, KubeOptions};
use kuryr_neutron::octavia::OctaviaClient;
use kuryr_neutron::{ClientOptions, ListFilter, NeutronClient, QuotaUpdate};
use neutron_emulator::{
    AgentHosts, Emulator, EmulatorHandle, EmulatorOptions, FaultConfig, FaultRule, LatencyProfile, Outage,
    OutageMode,
};
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::{ChaosArgs, ChaosProfileArg};
use crate::sandbox::{DemoNetwork, apply_crds, kubelet_setup, services as sandbox_services};
use churn::Churn;
use invariants::{Bounds, Checker, Violation};
use procs::Proc;
use profile::{Fault, KillMoment, Planned, Profile};
use report::Report;

const NODES: [&str; 2] = ["k8s-node-1", "k8s-node-2"];
const CONTROLLERS: usize = 2;
/// The controllers' Lease and pools live here (`[kubernetes] controller_namespace`).
const CONTROLLER_NAMESPACE: &str = "kube-system";
/// A killed or stopped leader is replaced within the Lease's 10 s plus a retry; recovery of the
/// pools follows. Until then pods may wait.
const HANDOVER: Duration = Duration::from_secs(25);
/// After a long fault the controllers need a little while (retry back-off) to notice.
const AFTER_FAULT: Duration = Duration::from_secs(20);
const SNAPSHOT_EVERY: Duration = Duration::from_secs(2);
/// The longest one workload operation may take before the loop moves on.
const OP_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a mid-write kill holds port creates in Neutron (the kill comes within it).
const WRITE_HOLD: Duration = Duration::from_secs(2);

pub async fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let mut profile = match args.profile {
        ChaosProfileArg::Ci => Profile::ci(),
        ChaosProfileArg::Server => Profile::server(),
        ChaosProfileArg::Long => Profile::long(),
    };
    if let Some(secs) = args.duration {
        profile.duration = Duration::from_secs(secs);
    }
    if args.neutron_url.is_some() {
        profile = profile.without_neutron_faults();
    }
    if args.no_faults {
        profile = profile.without_faults();
    }
    let report = Soak::start(&args, profile).await?.run().await?;
    print!("{}", report.render());
    anyhow::ensure!(
        report.passed(),
        "the soak found violations or ERROR lines (see the table above)"
    );
    Ok(())
}

/// Windows in which pods may wait without bound (disruptive faults, leader hand-overs).
#[derive(Clone, Default)]
struct Disruptions(Arc<Mutex<Vec<(Duration, Duration)>>>);

impl Disruptions {
    fn add(&self, from: Duration, until: Duration) {
        if let Ok(mut w) = self.0.lock() {
            w.push((from, until));
        }
    }

    fn at(&self, t: Duration) -> bool {
        self.0
            .lock()
            .map(|w| w.iter().any(|(a, b)| *a <= t && t <= *b))
            .unwrap_or(false)
    }

    /// When the last disruption that has ended by `t` ended (zero if none has).
    fn calm_since(&self, t: Duration) -> Duration {
        self.0
            .lock()
            .map(|w| {
                w.iter()
                    .filter(|(_, b)| *b <= t)
                    .map(|(_, b)| *b)
                    .max()
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }
}

/// The running soak.
struct Soak {
    profile: Profile,
    seed: u64,
    kube: KubeHandle,
    client: kube::Client,
    emulator: Option<EmulatorHandle>,
    octavia: Option<sandbox_services::SandboxOctavia>,
    neutron: NeutronClient,
    neutron_label: String,
    demo: DemoNetwork,
    controllers: Vec<Proc>,
    /// The node daemons, or why none run (the kubelet stand-in then marks pods Running once
    /// their KuryrPort's VIF is active).
    nodes: Result<nodes::Nodes, String>,
    reader: Arc<snapshot::Reader>,
    started: Instant,
    disruptions: Disruptions,
    background: FaultConfig,
    faults: BTreeMap<&'static str, u64>,
    /// Restarts of killed or stopped controllers still to do: (when, index).
    restarts: Vec<(Instant, usize)>,
    /// Restarts of killed daemons still to do: (when, node index).
    daemon_restarts: Vec<(Instant, usize)>,
    /// Ends of long faults still to do.
    ends: Vec<(Instant, Fault)>,
    /// Stats at the start of the quota exhaustion, and the reader's snapshots so far.
    exhaustion: Option<(Instant, neutron_emulator::Stats, u64)>,
    exhausted_rates: Option<(f64, f64)>,
    crashes: Vec<String>,
    rng: StdRng,
}

impl Soak {
    async fn start(args: &ChaosArgs, profile: Profile) -> anyhow::Result<Self> {
        let dir = args.state_dir.join(format!("run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("--state-dir {}", dir.display()))?;
        let dir = dir.canonicalize().unwrap_or(dir);
        println!(
            "chaos: profile {} seed {} for {} s; logs and configuration in {}",
            profile.name,
            args.seed,
            profile.duration.as_secs(),
            dir.display()
        );

        let kube = KubeEmulator::start(KubeOptions {
            nodes: NODES.map(String::from).to_vec(),
            ..KubeOptions::default()
        })
        .await
        .context("starting the Kubernetes API emulator")?;
        let kubeconfig = dir.join("kubeconfig");
        kube.write_kubeconfig(&kubeconfig)?;
        let client = kube::Client::try_from(kube::Config::new(kube.url().parse()?))
            .context("Kubernetes client for the emulator")?;
        apply_crds(&client).await?;
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": CONTROLLER_NAMESPACE}}))?;
        // It may exist already.
        let _ = Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await;

        let (neutron_url, emulator, neutron_label) = match &args.neutron_url {
            Some(url) => {
                let url = url.trim_end_matches('/').to_string();
                (url.clone(), None, format!("neutron-server at {url}"))
            }
            None => {
                let emu = Emulator::start(EmulatorOptions {
                    latency: LatencyProfile::None,
                    active_delay: Duration::from_millis(50),
                    // Every request on a new connection, so a reset window reaches every client.
                    connection_close: true,
                    agent_hosts: AgentHosts::Only(NODES.iter().map(|n| n.to_string()).collect()),
                    ..EmulatorOptions::default()
                })
                .await?;
                let label = format!("the Neutron emulator at {}", emu.url());
                (emu.url(), Some(emu), label)
            }
        };
        let nodes = match nodes::probe() {
            Ok(()) => Ok(nodes::Nodes::start(&NODES, kube.addr(), &dir)
                .await
                .context("starting the nodes")?),
            Err(why) => {
                println!(
                    "chaos: no node daemons ({why}); the kubelet stand-in marks pods Running once their VIF is active"
                );
                Err(why)
            }
        };
        let neutron = NeutronClient::new(&ClientOptions::noauth(&neutron_url)).context("Neutron client")?;
        let mut demo = DemoNetwork::create(&neutron, "10.244.0.0/16").await?;
        let octavia = if profile.services > 0 && emulator.is_some() {
            demo.service = Some(sandbox_services::create_service_subnet(&neutron, &demo.project).await?);
            Some(sandbox_services::start_octavia(None).await?)
        } else {
            None
        };
        let octavia_client = match &octavia {
            Some(o) => Some(OctaviaClient::new(&ClientOptions::noauth(&o.url)).context("Octavia client")?),
            None => None,
        };

        let cluster_id = format!("chaos-{}", std::process::id());
        let mut controllers = Vec::new();
        let mut sockets = BTreeMap::new();
        for i in 0..CONTROLLERS {
            let identity = format!("chaos-controller-{i}");
            let socket = dir.join(format!("pools-{i}.sock"));
            let _ = std::fs::remove_file(&socket);
            let conf = dir.join(format!("controller-{i}.conf"));
            std::fs::write(
                &conf,
                controller_ini(
                    &profile,
                    &cluster_id,
                    &neutron_url,
                    octavia.as_ref().map(|o| o.url.as_str()),
                    &demo,
                    &socket,
                    i,
                )?,
            )
            .with_context(|| format!("writing {}", conf.display()))?;
            let args = vec![
                "controller".to_string(),
                "--config-file".into(),
                conf.display().to_string(),
                "--kubeconfig".into(),
                kubeconfig.display().to_string(),
                "--identity".into(),
                identity.clone(),
            ];
            controllers.push(Proc::new(&identity, args, None, &dir)?);
            sockets.insert(identity, socket);
        }
        let reader = Arc::new(snapshot::Reader {
            kube: client.clone(),
            neutron: NeutronClient::new(&ClientOptions::noauth(&neutron_url)).context("Neutron client")?,
            octavia: octavia_client,
            cluster_id,
            controller_namespace: CONTROLLER_NAMESPACE.into(),
            sockets,
        });
        let background = FaultConfig {
            rules: if profile.neutron_5xx > 0.0 {
                // Lost replies first: the create is done, the controller is told it failed (a
                // timeout, a proxy's 502), and must find what it made instead of making it twice
                // or losing it. Then plain failures of anything, before Neutron acts.
                // Every Nth, not at a rate: a short run makes few creates, and each kind must
                // be seen lost.
                let lost = [
                    ("port.create*", 6),
                    ("security_group.create", 4),
                    ("address_group.create", 4),
                ];
                let mut rules: Vec<FaultRule> = lost
                    .into_iter()
                    .map(|(op, nth)| FaultRule {
                        after_commit: true,
                        every_nth: Some(nth),
                        ..FaultRule::always(op, 502)
                    })
                    .collect();
                rules.push(FaultRule::with_rate("*", profile.neutron_5xx, 500));
                rules
            } else {
                Vec::new()
            },
            outage: None,
            seed: Some(args.seed),
        };
        Ok(Self {
            seed: args.seed,
            rng: StdRng::seed_from_u64(args.seed.wrapping_add(1)),
            profile,
            kube,
            client,
            emulator,
            octavia,
            neutron,
            neutron_label,
            demo,
            controllers,
            nodes,
            reader,
            started: Instant::now(),
            disruptions: Disruptions::default(),
            background,
            faults: BTreeMap::new(),
            restarts: Vec::new(),
            daemon_restarts: Vec::new(),
            ends: Vec::new(),
            exhaustion: None,
            exhausted_rates: None,
            crashes: Vec::new(),
        })
    }

    async fn run(mut self) -> anyhow::Result<Report> {
        for c in &mut self.controllers {
            c.start()?;
        }
        let store = self.kube.store();
        let _scheduler = spawn_scheduler(store.clone());
        let _slices = spawn_endpointslice_controller(store.clone());
        let (setup, teardown) = match &self.nodes {
            Ok(n) => (n.setup(), Some(n.teardown())),
            Err(_) => (kubelet_setup(self.client.clone()), None),
        };
        let _kubelet = spawn_kubelet(store, NODES.map(String::from).to_vec(), setup, teardown);
        self.started = Instant::now();

        // The checker runs on its own, every few seconds, until told to stop.
        let stop_checking = CancellationToken::new();
        let checker = Arc::new(tokio::sync::Mutex::new(Checker::new(self.bounds())));
        let watch = tokio::spawn(check_loop(
            self.reader.clone(),
            checker.clone(),
            self.disruptions.clone(),
            self.started,
            stop_checking.clone(),
        ));

        let mut churn = Churn::new(
            self.client.clone(),
            StdRng::seed_from_u64(self.seed),
            self.profile.max_pods,
            self.profile.namespaces,
            self.profile.services,
            self.profile.policies,
        );
        churn.setup().await;
        let mut plan: std::collections::VecDeque<Planned> =
            profile::schedule(&self.profile, self.seed).into();
        let window_end = self.profile.duration.mul_f64(self.profile.fault_window);
        let background_from = self.profile.duration / 10;
        let mut background_on = false;
        let tick = Duration::from_secs_f64(1.0 / self.profile.ops_per_sec.max(0.1));
        let mut next_op = Instant::now();
        let mut last_progress = Instant::now();
        while self.started.elapsed() < self.profile.duration {
            let now = self.started.elapsed();
            if !background_on && now >= background_from && now < window_end {
                self.set_neutron_faults(None);
                background_on = true;
            }
            if background_on && now >= window_end {
                // Faults stop here; the churn goes on.
                self.background.rules.clear();
                self.set_neutron_faults(None);
                background_on = false;
            }
            while plan.front().is_some_and(|p| p.at <= now) {
                if let Some(p) = plan.pop_front() {
                    self.inject(p.fault, &mut churn).await;
                }
            }
            self.tend().await?;
            if Instant::now() >= next_op {
                // Bounded: during an API outage the client retries, and the faults must still end.
                let _ = tokio::time::timeout(OP_TIMEOUT, churn.step()).await;
                next_op = (next_op + tick).max(Instant::now() - tick * 4);
            }
            if last_progress.elapsed() >= Duration::from_secs(15) {
                last_progress = Instant::now();
                println!(
                    "  [{:>5.0}s] {} pod operations, {} faults, {} violations",
                    now.as_secs_f64(),
                    churn.counts.pod_operations(),
                    self.faults.values().sum::<u64>(),
                    checker.lock().await.reported()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Whatever is still pending ends now.
        while !self.ends.is_empty() || !self.restarts.is_empty() || !self.daemon_restarts.is_empty() {
            self.tend().await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!(
            "  churn over after {} pod operations; settling (up to {} s) ...",
            churn.counts.pod_operations(),
            self.profile.settle.as_secs()
        );
        stop_checking.cancel();
        let mut violations = watch.await.unwrap_or_default();

        // The end: settle, then the strict check; then delete everything, settle, check again.
        let settled = self.settle(&checker, false).await;
        violations.extend(self.final_check(&checker, settled, false).await);
        violations.extend(self.node_check(false).await);
        println!("  deleting every soak namespace ...");
        churn.delete_everything().await;
        let settled = self.settle(&checker, true).await;
        violations.extend(self.final_check(&checker, settled, true).await);
        violations.extend(self.node_check(true).await);

        let leader_changes = self.lease_transitions().await;
        for c in &mut self.controllers {
            let _ = c.stop(Signal::SIGTERM, Duration::from_secs(15)).await;
        }
        let daemons: Vec<&Proc> = self
            .nodes
            .iter()
            .flat_map(|n| n.nodes.iter().map(|n| &n.daemon))
            .collect();
        let error_lines: Vec<String> = self
            .controllers
            .iter()
            .chain(daemons.iter().copied())
            .flat_map(|c| c.error_lines().into_iter().map(|l| format!("{}: {l}", c.name)))
            .collect();
        let daemon_restarts = daemons
            .iter()
            .map(|d| u64::from(d.starts.saturating_sub(1)))
            .sum();
        let checker = checker.lock().await;
        let stats = self.emulator.as_ref().map(|e| e.stats());
        let minutes = self.started.elapsed().as_secs_f64() / 60.0;
        let report = Report {
            profile: self.profile.name.to_string(),
            seed: self.seed,
            neutron: self.neutron_label.clone(),
            elapsed: self.started.elapsed(),
            operations: churn.counts.done.clone(),
            refused: churn.counts.refused.clone(),
            pod_operations: churn.counts.pod_operations(),
            faults: self.faults.clone(),
            neutron_faults_injected: stats.as_ref().map(|s| s.faults_injected),
            neutron_lost_replies: stats.as_ref().map(|s| s.lost_replies),
            controller_restarts: self
                .controllers
                .iter()
                .map(|c| u64::from(c.starts.saturating_sub(1)))
                .sum(),
            daemon_restarts,
            no_daemons: self.nodes.as_ref().err().cloned(),
            leader_changes_seen: leader_changes,
            violations,
            worst_recovery: checker.worst_recovery(),
            exhausted_calls_per_min: self.exhausted_rates,
            neutron_calls_per_min: stats.map(|s| s.total_requests as f64 / minutes.max(1e-9)),
            snapshots: checker.snapshots,
            snapshots_skipped: SKIPPED.load(std::sync::atomic::Ordering::Relaxed),
            error_lines,
            note: (!self.crashes.is_empty())
                .then(|| format!("controller crashes: {}", self.crashes.join("; "))),
        };
        drop(checker);
        self.cleanup().await;
        Ok(report)
    }

    fn bounds(&self) -> Bounds {
        let update = Duration::from_secs(self.profile.pool.update_secs);
        Bounds {
            // Two sweep passes, a pool status flush and a slow snapshot.
            grace: update * 4 + Duration::from_secs(10),
            over_max: update + SNAPSHOT_EVERY * 2,
            stuck: self.profile.stuck_bound,
            orphan_kuryrport: update * 4 + Duration::from_secs(10),
        }
    }

    fn set_neutron_faults(&self, outage: Option<Outage>) {
        if let Some(e) = &self.emulator {
            e.set_faults(FaultConfig {
                outage,
                ..self.background.clone()
            });
        }
    }

    fn count(&mut self, fault: &Fault) {
        *self.faults.entry(fault.kind()).or_default() += 1;
    }

    async fn leader_index(&self) -> Option<usize> {
        // Bounded: during an API outage the client retries for long.
        let leader = tokio::time::timeout(OP_TIMEOUT, self.reader.leader())
            .await
            .ok()
            .flatten()?;
        self.controllers.iter().position(|c| c.name == leader)
    }

    /// Kills the leader while one of its port creates is held in Neutron ([`WRITE_HOLD`], the
    /// emulator's delay rule; a burst of pod creates makes the pools refill): the create lands
    /// after the controller died. Without the emulator (or during a Neutron outage, when no
    /// create gets through) it is a mid-refill kill. Returns the controller killed.
    async fn kill_mid_write(&mut self, churn: &mut Churn) -> usize {
        let n = (self.profile.pool.max + self.profile.pool.batch) as usize;
        // Asked first: in an API outage finding the leader takes longer than the hold.
        let i = self.leader_index().await.unwrap_or(0);
        let Some(e) = self.emulator.as_ref().filter(|e| e.faults().outage.is_none()) else {
            let _ = tokio::time::timeout(OP_TIMEOUT * 4, churn.burst(n)).await;
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(100..600))).await;
            let i = self.leader_index().await.unwrap_or(i);
            sigkill(&mut self.controllers[i]).await;
            return i;
        };
        let mut faults = self.background.clone();
        faults
            .rules
            .insert(0, FaultRule::delay("port.create*", WRITE_HOLD));
        e.set_faults(faults);
        let creates = |s: &neutron_emulator::Stats| s.count("port.create") + s.count("port.create_bulk");
        // Read once the rule is in force: every create counted after it is held.
        let before = creates(&e.stats());
        let held = async {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let now = creates(&e.stats());
                if now > before {
                    return now - before;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            0
        };
        let burst = tokio::time::timeout(OP_TIMEOUT * 4, churn.burst(n));
        tokio::pin!(held, burst);
        // The kill comes as soon as a create is held; the burst goes on after it (a pod
        // create cut short would be a pod the churn does not know).
        let (count, burst_done) = tokio::select! {
            count = &mut held => (count, false),
            _ = &mut burst => (held.await, true),
        };
        match count {
            0 => println!("          no port create reached Neutron within 10 s; killing anyway"),
            n => println!("          {n} port create request(s) held in Neutron at the kill"),
        }
        sigkill(&mut self.controllers[i]).await;
        if !burst_done {
            let _ = burst.await;
        }
        // The held creates keep their delay and land after the kill.
        e.set_faults(self.background.clone());
        i
    }

    async fn inject(&mut self, fault: Fault, churn: &mut Churn) {
        let now = self.started.elapsed();
        if fault == Fault::DaemonKill && self.nodes.is_err() {
            return;
        }
        println!("  [{:>5.0}s] fault: {}", now.as_secs_f64(), fault.kind());
        self.count(&fault);
        let until = now + fault.length() + AFTER_FAULT;
        match fault {
            Fault::NeutronOutage(d) | Fault::NeutronResets(d) => {
                let mode = if matches!(fault, Fault::NeutronOutage(_)) {
                    OutageMode::Unavailable
                } else {
                    OutageMode::Reset
                };
                self.set_neutron_faults(Some(Outage {
                    mode,
                    duration_ms: u64::try_from(d.as_millis()).ok(),
                }));
                self.disruptions.add(now, until);
            }
            Fault::QuotaExhaustion(d) => {
                self.exhaust_quota().await;
                self.ends.push((Instant::now() + d, fault));
                self.disruptions.add(now, until);
            }
            Fault::KubeOutage(d) => {
                self.kube.set_unavailable(true);
                self.ends.push((Instant::now() + d, fault));
                // No controller can renew its Lease meanwhile: every one steps down, and one
                // takes over and recovers once the API is back.
                self.disruptions.add(now, now + d + HANDOVER.max(AFTER_FAULT));
            }
            Fault::WatchDrop => self.kube.drop_watches(),
            Fault::Gone => {
                self.kube.compact();
                self.kube.drop_watches();
            }
            Fault::Kill(moment) => {
                let i = match moment {
                    KillMoment::Random => {
                        let i = self.rng.random_range(0..self.controllers.len());
                        sigkill(&mut self.controllers[i]).await;
                        i
                    }
                    KillMoment::MidRefill => {
                        let n = (self.profile.pool.max + self.profile.pool.batch) as usize;
                        let _ = tokio::time::timeout(OP_TIMEOUT * 4, churn.burst(n)).await;
                        tokio::time::sleep(Duration::from_millis(self.rng.random_range(100..600))).await;
                        let i = self.leader_index().await.unwrap_or(0);
                        sigkill(&mut self.controllers[i]).await;
                        i
                    }
                    KillMoment::MidFinalize => {
                        let _ = tokio::time::timeout(OP_TIMEOUT * 4, churn.mass_delete(20)).await;
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let i = self.leader_index().await.unwrap_or(0);
                        sigkill(&mut self.controllers[i]).await;
                        i
                    }
                    KillMoment::MidWrite => self.kill_mid_write(churn).await,
                };
                self.restarts.push((Instant::now() + Duration::from_secs(1), i));
                self.disruptions.add(now, self.started.elapsed() + HANDOVER);
            }
            Fault::DaemonKill => {
                if let Ok(nodes) = &mut self.nodes {
                    let i = self.rng.random_range(0..nodes.nodes.len());
                    if let Err(e) = nodes.kill(i).await {
                        eprintln!("  cannot kill the daemon of {}: {e:#}", nodes.nodes[i].name);
                    }
                    self.daemon_restarts
                        .push((Instant::now() + Duration::from_secs(1), i));
                    // Its pods wait for the restart and the daemon's start-up.
                    self.disruptions.add(now, self.started.elapsed() + AFTER_FAULT);
                }
            }
            Fault::LeaderChange => {
                let i = self.leader_index().await.unwrap_or(0);
                if let Err(e) = self.controllers[i]
                    .stop(Signal::SIGTERM, Duration::from_secs(15))
                    .await
                {
                    eprintln!("  cannot stop {}: {e:#}", self.controllers[i].name);
                }
                self.restarts.push((Instant::now() + Duration::from_secs(2), i));
                self.disruptions.add(now, self.started.elapsed() + HANDOVER);
            }
        }
    }

    /// Ends due long faults, restarts stopped controllers, notices crashes.
    async fn tend(&mut self) -> anyhow::Result<()> {
        let now = Instant::now();
        let due: Vec<Fault> = self
            .ends
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|(_, f)| *f)
            .collect();
        self.ends.retain(|(at, _)| *at > now);
        for f in due {
            match f {
                Fault::QuotaExhaustion(_) => self.restore_quota().await,
                Fault::KubeOutage(_) => self.kube.set_unavailable(false),
                _ => {}
            }
        }
        let due: Vec<usize> = self
            .restarts
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|(_, i)| *i)
            .collect();
        self.restarts.retain(|(at, _)| *at > now);
        for i in due {
            if !self.restarts.iter().any(|(_, j)| *j == i) {
                self.controllers[i].start()?;
            }
        }
        let due: Vec<usize> = self
            .daemon_restarts
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|(_, i)| *i)
            .collect();
        self.daemon_restarts.retain(|(at, _)| *at > now);
        let at = self.started.elapsed();
        if let Ok(nodes) = &mut self.nodes {
            for i in due {
                nodes.nodes[i].daemon.start()?;
            }
            for n in &mut nodes.nodes {
                if let Some(status) = n.daemon.exited() {
                    self.crashes.push(format!(
                        "{} exited with {status} at {:.0}s",
                        n.daemon.name,
                        at.as_secs_f64()
                    ));
                    n.daemon.start()?;
                }
            }
        }
        for c in &mut self.controllers {
            if let Some(status) = c.exited() {
                self.crashes.push(format!(
                    "{} exited with {status} at {:.0}s",
                    c.name,
                    at.as_secs_f64()
                ));
                c.start()?;
            }
        }
        Ok(())
    }

    /// Sets the project's port quota to the ports it has: every create fails until restored.
    async fn exhaust_quota(&mut self) {
        let ports = self
            .neutron
            .list_ports(&ListFilter::new().project_id(&self.demo.project))
            .await
            .map(|p| p.len())
            .unwrap_or(0);
        let quota = QuotaUpdate {
            port: i64::try_from(ports).ok(),
            ..QuotaUpdate::default()
        };
        if let Err(e) = self.neutron.update_quota(&self.demo.project, &quota).await {
            eprintln!("  cannot set the port quota: {e}");
        }
        if let Some(e) = &self.emulator {
            self.exhaustion = Some((
                Instant::now(),
                e.stats(),
                READS.load(std::sync::atomic::Ordering::Relaxed),
            ));
        }
    }

    async fn restore_quota(&mut self) {
        if let (Some(e), Some((since, before, reads))) = (&self.emulator, self.exhaustion.take()) {
            let after = e.stats();
            let minutes = since.elapsed().as_secs_f64() / 60.0;
            // The checker's own reads (a port list and a security group list each) are not the
            // controllers'.
            let own = 2 * (READS.load(std::sync::atomic::Ordering::Relaxed) - reads);
            let calls = after
                .total_requests
                .saturating_sub(before.total_requests)
                .saturating_sub(own);
            let bulk = after
                .count("port.create_bulk")
                .saturating_sub(before.count("port.create_bulk"));
            self.exhausted_rates = Some((calls as f64 / minutes, bulk as f64 / minutes));
        }
        let quota = QuotaUpdate {
            port: Some(-1),
            ..QuotaUpdate::default()
        };
        if let Err(e) = self.neutron.update_quota(&self.demo.project, &quota).await {
            eprintln!("  cannot restore the port quota: {e}");
        }
    }

    /// Waits until a strict check passes (or the settle time is over); returns whether it did.
    /// Waits for the cluster to converge (`emptied`: every soak object and what it made gone,
    /// pool ports aside) for at most the profile's settle time; false when it did not.
    async fn settle(&mut self, checker: &tokio::sync::Mutex<Checker>, emptied: bool) -> bool {
        let deadline = Instant::now() + self.profile.settle;
        loop {
            let at = self.started.elapsed();
            if let Ok(snap) = self.reader.read(at, false).await
                && (!emptied || invariants::emptied(&snap))
                && checker.lock().await.converged(&snap)
            {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            let _ = self.tend().await;
            tokio::time::sleep(SNAPSHOT_EVERY).await;
        }
    }

    /// The strict check at the end (`emptied`: after the deletion of every soak object, when
    /// anything of them left is a leak). Not settling is a violation.
    async fn final_check(
        &self,
        checker: &tokio::sync::Mutex<Checker>,
        settled: bool,
        emptied: bool,
    ) -> Vec<Violation> {
        let at = self.started.elapsed();
        match self.reader.read(at, false).await {
            Ok(snap) => {
                let v = if emptied {
                    checker.lock().await.emptied_check(&snap, settled)
                } else {
                    let mut v = checker.lock().await.final_check(&snap);
                    if !settled {
                        v.push(Violation {
                            kind: invariants::Kind::Unsettled,
                            subject: "the end of the churn".into(),
                            detail: "the cluster did not converge within the settle time".into(),
                            at,
                        });
                    }
                    v
                };
                println!(
                    "  final check at {:.0}s ({}): {} violations",
                    at.as_secs_f64(),
                    if settled { "settled" } else { "did not settle" },
                    v.len()
                );
                for x in &v {
                    println!("    {x}");
                }
                v
            }
            Err(e) => vec![Violation {
                kind: invariants::Kind::Mismatch,
                subject: "final snapshot".into(),
                detail: format!("cannot be read: {e:#}"),
                at,
            }],
        }
    }

    /// The nodes as the kubelet and the daemons left them: every Running pod's namespace holds
    /// its IP; with `emptied` (every pod deleted), no pod interface and no pod namespace is
    /// left once the DELs are done (retried while a daemon was down: up to a minute).
    async fn node_check(&self, emptied: bool) -> Vec<Violation> {
        let Ok(nodes) = &self.nodes else {
            return Vec::new();
        };
        let at = self.started.elapsed();
        let violation = |subject: String, detail: String| Violation {
            kind: invariants::Kind::NodeState,
            subject,
            detail,
            at,
        };
        let mut out = Vec::new();
        let mut checked = 0;
        if !emptied {
            let pods = match Api::<Pod>::all(self.client.clone())
                .list(&Default::default())
                .await
            {
                Ok(p) => p.items,
                Err(e) => return vec![violation("pods".into(), format!("cannot be listed: {e}"))],
            };
            for pod in pods {
                let status = pod.status.as_ref();
                let (Some(ip), Some("Running")) = (
                    status.and_then(|s| s.pod_ip.as_deref()),
                    status.and_then(|s| s.phase.as_deref()),
                ) else {
                    continue;
                };
                if pod.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let key = format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default()
                );
                checked += 1;
                match nodes.pod_addresses(pod.metadata.uid.as_deref().unwrap_or_default()) {
                    Some(addrs) if addrs.iter().any(|a| a == ip) => {}
                    Some(addrs) => out.push(violation(
                        key,
                        format!("Running with {ip}, its namespace has {addrs:?}"),
                    )),
                    None => out.push(violation(
                        key,
                        format!("Running with {ip}, its namespace is gone"),
                    )),
                }
            }
        } else {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let links = nodes.host_links();
                let namespaces = nodes.pod_namespaces();
                let clean = links.values().all(Vec::is_empty) && namespaces.is_empty();
                if clean || Instant::now() >= deadline {
                    for (node, l) in links.into_iter().filter(|(_, l)| !l.is_empty()) {
                        out.push(violation(node, format!("{} pod interfaces left: {l:?}", l.len())));
                    }
                    if !namespaces.is_empty() {
                        out.push(violation(
                            "pod namespaces".into(),
                            format!("{} left: {namespaces:?}", namespaces.len()),
                        ));
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        if emptied {
            println!("  node check (emptied): {} violations", out.len());
        } else {
            println!("  node check ({checked} Running pods): {} violations", out.len());
        }
        for v in &out {
            println!("    {v}");
        }
        out
    }

    async fn lease_transitions(&self) -> u64 {
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            self.client.clone(),
            CONTROLLER_NAMESPACE,
        )
        .get_opt("kuryr-controller")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.lease_transitions)
        .and_then(|t| u64::try_from(t).ok())
        .unwrap_or(0)
    }

    async fn cleanup(self) {
        if self.emulator.is_none() {
            // A real neutron-server outlives the soak: what the checker found is reported, then
            // the project is emptied (ports first, then the policies' groups, then the demo).
            let project = ListFilter::new().project_id(&self.demo.project);
            if let Ok(ports) = self.neutron.list_ports(&project).await {
                for p in ports {
                    let _ = self.neutron.delete_port(&p.id).await;
                }
            }
            if let Ok(sgs) = self.neutron.list_security_groups(&project).await {
                for sg in sgs
                    .iter()
                    .filter(|sg| sg.id != self.demo.security_group && sg.name != "default")
                {
                    let _ = self.neutron.delete_security_group(&sg.id).await;
                }
            }
            if let Ok(groups) = self.neutron.list_address_groups(&project).await {
                for g in groups {
                    let _ = self.neutron.delete_address_group(&g.id).await;
                }
            }
            self.demo.delete(&self.neutron).await;
        }
        if let Ok(nodes) = self.nodes {
            nodes.shutdown().await;
        }
        let _ = self.kube.shutdown().await;
        if let Some(e) = &self.emulator {
            e.shutdown().await;
        }
        if let Some(o) = self.octavia.and_then(|o| o.emulator) {
            o.shutdown().await;
        }
    }
}

static READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static SKIPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Snapshots every few seconds into the checker; prints violations as they are found.
async fn check_loop(
    reader: Arc<snapshot::Reader>,
    checker: Arc<tokio::sync::Mutex<Checker>>,
    disruptions: Disruptions,
    started: Instant,
    stop: CancellationToken,
) -> Vec<Violation> {
    let mut found = Vec::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return found,
            _ = tokio::time::sleep(SNAPSHOT_EVERY) => {}
        }
        let at = started.elapsed();
        READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A snapshot taken across a disruption's end counts as disrupted.
        let disrupted = disruptions.at(at);
        match reader.read(at, disrupted).await {
            Ok(snap) => {
                let disrupted = disrupted || disruptions.at(started.elapsed());
                let calm_since = disruptions.calm_since(at);
                let snap = invariants::Snapshot {
                    disrupted,
                    calm_since,
                    ..snap
                };
                for v in checker.lock().await.observe(&snap) {
                    println!("  VIOLATION {v}");
                    found.push(v);
                }
            }
            Err(e) => {
                SKIPPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(error = %format!("{e:#}"), "snapshot skipped");
            }
        }
    }
}

/// Each controller's kuryr.conf: the neutron pool driver, both replicas under one Lease, fast
/// pool maintenance so recovery and the sweep are exercised often.
fn controller_ini(
    profile: &Profile,
    cluster_id: &str,
    neutron_url: &str,
    octavia_url: Option<&str>,
    demo: &DemoNetwork,
    socket: &Path,
    index: usize,
) -> anyhow::Result<String> {
    let mut handlers = vec!["vif", "kuryrport"];
    let mut octavia = String::new();
    let mut service_subnet = String::new();
    if let (Some(url), Some((_, subnet))) = (octavia_url, &demo.service) {
        handlers.extend(["service", "endpoints", "kuryrloadbalancer"]);
        octavia = format!("load_balancer_endpoint_override = {url}\n");
        service_subnet = format!("service_subnet = {subnet}\n");
    }
    if profile.policies > 0 {
        handlers.extend(["policy", "kuryrnetworkpolicy", "pod_label"]);
    }
    let sg_driver = if profile.policies > 0 {
        "pod_security_groups_driver = policy\n"
    } else {
        ""
    };
    // Below the kernel's ephemeral range (32768 and up): a port there may be an outgoing
    // connection's source port at the moment a restarted controller binds it.
    let base = 21_000 + 10 * (std::process::id() % 1_100) as usize + index;
    let ini = format!(
        "[kubernetes]\n\
         enabled_handlers = {handlers}\n\
         pod_vif_driver = neutron-vif\n\
         vif_pool_driver = neutron\n\
         enable_manager = True\n\
         controller_ha = True\n\
         controller_namespace = {CONTROLLER_NAMESPACE}\n\
         cluster_id = {cluster_id}\n\
         {sg_driver}\
         [pool_manager]\n\
         sock_file = {socket}\n\
         [vif_pool]\n\
         ports_pool_min = {min}\n\
         ports_pool_max = {max}\n\
         ports_pool_batch = {batch}\n\
         ports_pool_update_frequency = {update}\n\
         [neutron]\n\
         endpoint_override = {neutron_url}\n\
         {octavia}\
         [neutron_defaults]\n\
         project = {project}\n\
         pod_subnet = {subnet}\n\
         pod_security_groups = {sg}\n\
         resource_tags = kuryr-chaos\n\
         {service_subnet}\
         [health_server]\n\
         port = {health}\n\
         [prometheus_exporter]\n\
         controller_exporter_port = {metrics}\n",
        handlers = handlers.join(","),
        socket = socket.display(),
        min = profile.pool.min,
        max = profile.pool.max,
        batch = profile.pool.batch,
        update = profile.pool.update_secs,
        project = demo.project,
        subnet = demo.subnet,
        sg = demo.security_group,
        health = base,
        metrics = base + 5,
    );
    // Refuse a configuration the controller would refuse, before any process starts.
    kuryr_config::KuryrConfig::from_ini_str(&ini).context("the soak's controller configuration")?;
    Ok(ini)
}

/// SIGKILLs a controller (its restart is the caller's).
async fn sigkill(controller: &mut Proc) {
    if let Err(e) = controller.stop(Signal::SIGKILL, Duration::from_secs(5)).await {
        eprintln!("  cannot kill {}: {e:#}", controller.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controllers_run_as_one_ha_pair_on_the_neutron_pool_with_the_profiles_sizes() -> anyhow::Result<()>
    {
        let demo = DemoNetwork {
            project: "p".into(),
            network: "n".into(),
            subnet: "s".into(),
            security_group: "sg".into(),
            service: Some(("sn".into(), "ss".into())),
        };
        let profile = Profile::ci();
        let ini = controller_ini(
            &profile,
            "chaos-1",
            "http://127.0.0.1:1",
            Some("http://127.0.0.1:2"),
            &demo,
            Path::new("/tmp/pools-0.sock"),
            0,
        )?;
        let c = kuryr_config::KuryrConfig::from_ini_str(&ini)?.config;
        assert!(c.kubernetes.controller_ha);
        assert_eq!(c.kubernetes.controller_namespace, CONTROLLER_NAMESPACE);
        assert_eq!(c.kubernetes.cluster_id, "chaos-1");
        assert_eq!(c.vif_pool.ports_pool_max, profile.pool.max);
        assert_eq!(c.vif_pool.ports_pool_update_frequency, profile.pool.update_secs);
        for h in ["vif", "kuryrport", "kuryrloadbalancer", "kuryrnetworkpolicy"] {
            assert!(c.kubernetes.enabled_handlers.iter().any(|x| x == h), "{h}: {ini}");
        }
        // The two replicas never share a health or metrics port.
        let other = controller_ini(
            &profile,
            "chaos-1",
            "http://x",
            None,
            &demo,
            Path::new("/tmp/b"),
            1,
        )?;
        let o = kuryr_config::KuryrConfig::from_ini_str(&other)?.config;
        assert_ne!(c.health_server.port, o.health_server.port);
        assert_ne!(
            c.prometheus_exporter.controller_exporter_port,
            o.prometheus_exporter.controller_exporter_port
        );
        assert_ne!(
            c.health_server.port,
            o.prometheus_exporter.controller_exporter_port
        );
        Ok(())
    }
}
