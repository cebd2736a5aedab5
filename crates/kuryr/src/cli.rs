//! Command-line arguments.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use kuryr_config::{KuryrConfig, Loaded};

#[derive(Parser, Debug)]
#[command(
    name = "kuryr",
    version,
    about = "kuryr-rs: Kubernetes pods on OpenStack Neutron ports"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the controller (pods -> KuryrPorts -> Neutron ports) until SIGTERM or Ctrl-C.
    Controller(ControllerArgs),
    /// Run the CNI daemon of one node until SIGTERM or Ctrl-C.
    Daemon(DaemonArgs),
    /// Write the CRD manifests into DIR, or with --check verify that DIR is up to date.
    Crds(CrdsArgs),
    /// Inspect and manage the controller's port pools (needs `[kubernetes] enable_manager = True`).
    Pools(PoolsArgs),
    /// Generate every object an install needs (CRDs, Namespace, RBAC, ConfigMap, controller
    /// Deployment, CNI DaemonSet) from kuryr.conf; or with --check verify a directory of them.
    Manifests(ManifestsArgs),
    /// Upgrade and sanity checks of a cluster (exit 0 success, 1 warning, 2 failure).
    Status(StatusArgs),
    /// The `kubectl kuryr` plugin (also run when this binary is invoked as `kubectl-kuryr`).
    Kubectl(KubectlArgs),
    /// Which OpenStack deployment serves each (project, group): list, show, history, move, pin,
    /// unpin (placement; the same as `kuryr kubectl bindings`).
    Bindings(BindingsArgs),
    /// The OpenStack deployments with their usage and its age; maintenance on/off (the same as
    /// `kuryr kubectl deployments`).
    Deployments(DeploymentsArgs),
    /// Install the kuryr-cni plugin and its conflist on this node (the CNI DaemonSet's init step).
    InstallCni(InstallCniArgs),
    /// Start an emulated cluster (Kubernetes + Neutron), a controller and two nodes, and wire demo pods.
    Sandbox(SandboxArgs),
    /// The peer benchmark: kuryr-rs' and upstream kuryr-kubernetes' controllers side by side on
    /// fresh emulators with the same kuryr.conf; prints one table and writes a latency chart.
    Bench(BenchArgs),
    /// Soak: two controllers as child processes under pod churn and injected faults, with an
    /// invariant checker over Kubernetes, Neutron and Octavia (exit 1 on any violation).
    Chaos(ChaosArgs),
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Smoke size: 30 pods per burst, 3 s of churn, no chart unless --svg is given.
    #[arg(long)]
    pub quick: bool,
    /// Pods per burst (default 300; 30 with --quick).
    #[arg(long)]
    pub pods: Option<usize>,
    /// Python of the upstream kuryr-kubernetes 10.0.0 venv (what scripts/upstream-kuryr-venv.sh
    /// prints); its `kuryr-k8s-controller` is run. Default: $KURYR_TEST_UPSTREAM_PYTHON, else
    /// .upstream-kuryr/venv/bin/python.
    #[arg(long, value_name = "PATH")]
    pub upstream_python: Option<PathBuf>,
    /// The kuryr binary whose `controller` is run as kuryr-rs (default: this one), e.g. a build
    /// of an earlier commit to compare before and after a change.
    #[arg(long, value_name = "PATH")]
    pub kuryr_bin: Option<PathBuf>,
    /// Run only these implementations (repeatable; default both).
    #[arg(long, value_enum)]
    pub only: Vec<crate::bench::Impl>,
    /// Run only these Neutron profiles (repeatable; default both).
    #[arg(long, value_enum)]
    pub profile: Vec<crate::bench::Profile>,
    /// Run only these cases (repeatable; default all four).
    #[arg(long, value_enum)]
    pub case: Vec<crate::bench::Case>,
    /// Runs of each case per implementation, the two implementations taking turns; the table shows
    /// each one's median run (by pods/s). On a shared machine one run can land on a slow second:
    /// the same binary's cold burst varies up to 2x in CPU-seconds from run to run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Seconds each run may take to wire its pods.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Run these scale cases of the kuryr-rs controller instead of the peer runs (repeatable):
    /// 10,000 pods, 10,000 pooled ports recovered after a SIGKILL, 1,000 nodes under churn.
    /// `--quick` divides their sizes by 10.
    #[arg(long, value_enum)]
    pub scale: Vec<crate::bench::Scale>,
    /// Where to write the latency chart (default docs/peer-bench.svg for a full run; a run with
    /// --only, --profile or --case writes none unless this is given).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

/// The soak's named profiles (docs/chaos.md).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChaosProfileArg {
    /// A few minutes on the emulators, every fault kind (CI).
    Ci,
    /// Shorter, for a real neutron-server (--neutron-url): no Neutron fault injection.
    Server,
    /// 32 minutes, at least 10,000 pod operations, 5% Neutron 5xx, a 30 s outage, 20 SIGKILLs.
    Long,
}

#[derive(Args, Debug, Clone)]
pub struct ChaosArgs {
    #[arg(long, value_enum, default_value_t = ChaosProfileArg::Ci)]
    pub profile: ChaosProfileArg,
    /// Seed of the fault schedule and the workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Churn for this many seconds instead of the profile's time (faults are scaled with it).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(20..))]
    pub duration: Option<u64>,
    /// Use this neutron-server (noauth) instead of the embedded emulator; Neutron faults are
    /// then not injected.
    #[arg(long, value_name = "URL")]
    pub neutron_url: Option<String>,
    /// The same churn with no fault injected (a reference run).
    #[arg(long)]
    pub no_faults: bool,
    /// Directory for the kubeconfig, the controllers' configuration and their logs.
    #[arg(long, default_value = ".chaos", value_name = "DIR")]
    pub state_dir: PathBuf,
}

/// oslo.config's file options, with upstream's names.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// A kuryr.conf file; repeat it, later files win.
    #[arg(long = "config-file", value_name = "FILE")]
    pub config_file: Vec<PathBuf>,
    /// A directory whose *.conf files are loaded in name order after the --config-files.
    #[arg(long = "config-dir", value_name = "DIR")]
    pub config_dir: Vec<PathBuf>,
}

impl ConfigArgs {
    /// Every file to load, in oslo.config's order.
    pub fn files(&self) -> anyhow::Result<Vec<PathBuf>> {
        let mut files = self.config_file.clone();
        for dir in &self.config_dir {
            files.extend(
                KuryrConfig::config_dir_files(dir)
                    .with_context(|| format!("--config-dir {}", dir.display()))?,
            );
        }
        Ok(files)
    }

    /// Loads the configuration; unknown options are logged as warnings by the loader.
    pub fn load(&self) -> anyhow::Result<Loaded> {
        let files = self.files()?;
        if files.is_empty() {
            tracing::warn!(
                "no --config-file or --config-dir given: using upstream defaults and KURYR__ env overrides"
            );
        }
        let loaded = KuryrConfig::load(&files).context("loading the configuration")?;
        tracing::info!(files = ?files, warnings = loaded.warnings.len(), "configuration loaded");
        Ok(loaded)
    }

    /// [`ConfigArgs::load`] for the CNI daemon, which never calls OpenStack: the installed
    /// kuryr.conf has no credentials (they are in the controller's Secret).
    pub fn load_without_credentials(&self) -> anyhow::Result<Loaded> {
        let files = self.files()?;
        let loaded = KuryrConfig::load_without_credentials(&files).context("loading the configuration")?;
        tracing::info!(files = ?files, warnings = loaded.warnings.len(), "configuration loaded");
        Ok(loaded)
    }
}

/// How to reach the Kubernetes API.
#[derive(Args, Debug, Clone, Default)]
pub struct KubeArgs {
    /// A kubeconfig file; takes precedence over `[kubernetes] api_root` (also read from $KUBECONFIG).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Identity in the leader-election Lease (defaults to $HOSTNAME).
    #[arg(long)]
    pub identity: Option<String>,
}

#[derive(Args, Debug)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// This node's name, as in the Node object (upstream reads $KUBERNETES_NODE_NAME).
    #[arg(long, env = "KUBERNETES_NODE_NAME")]
    pub node_name: Option<String>,
    /// Also serve the daemon API on this unix socket.
    #[arg(long, value_name = "PATH")]
    pub unix_socket: Option<PathBuf>,
    /// Keep a record of each pod's plugged interfaces here, so that a
    /// restarted daemon can still remove them (default /run/kuryr/cni-daemon;
    /// a tmpfs, mounted from the host when the daemon runs in a pod).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CrdsArgs {
    /// Only compare DIR with the generated manifests; exit 1 when they differ.
    #[arg(long)]
    pub check: bool,
    /// Directory of the manifests.
    #[arg(default_value = "deploy/crds")]
    pub dir: PathBuf,
}

#[derive(Args, Debug)]
pub struct PoolsArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The controller's pool management socket (default: `[pool_manager] sock_file`).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    #[command(subcommand)]
    pub command: PoolsCommand,
}

#[derive(Subcommand, Debug)]
pub enum PoolsCommand {
    /// Every pool with its port counts.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One pool with its ports.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Create ports in a pool now (default: `[vif_pool] ports_pool_batch`).
    Populate {
        name: String,
        #[arg(long)]
        count: Option<usize>,
    },
    /// Delete a pool's unused ports.
    Free { name: String },
}

/// Latency of the embedded Neutron emulator.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyArg {
    /// The measured medians of a real neutron-server (2 API workers, 200 ms to ACTIVE).
    RealServer,
    /// No added latency (ports go ACTIVE after 50 ms).
    None,
}

#[derive(Args, Debug, Clone)]
pub struct SandboxArgs {
    /// Demo pods to create.
    #[arg(long, default_value_t = 20)]
    pub pods: usize,
    /// Demo namespaces the pods are spread over.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub namespaces: u16,
    /// Use this neutron-server (noauth, e.g. http://127.0.0.1:9696) instead of the embedded emulator.
    #[arg(long, value_name = "URL")]
    pub neutron_url: Option<String>,
    /// Latency profile of the embedded Neutron emulator.
    #[arg(long, value_enum, default_value_t = LatencyArg::RealServer)]
    pub latency: LatencyArg,
    /// CIDR of the demo pod subnet.
    #[arg(long, default_value = "10.244.0.0/16")]
    pub cidr: String,
    /// Directory for the kubeconfig and the emulator's state.
    #[arg(long, default_value = ".sandbox", value_name = "DIR")]
    pub state_dir: PathBuf,
    /// Kubernetes API emulator listen address (port 0 = any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub kube_listen: SocketAddr,
    /// Serve the controller's Prometheus metrics here (e.g. 127.0.0.1:9654).
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Seconds to wait for every pod to be wired before printing the summary anyway.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Use the `neutron` port pool driver instead of `noop` (pool management socket in --state-dir).
    #[arg(long)]
    pub pool: bool,
    /// Demo Services (ClusterIP, selecting the demo pods of their namespace) made into Octavia load balancers;
    /// 0 leaves the Service handlers off.
    #[arg(long, default_value_t = 3)]
    pub services: usize,
    /// Use this Octavia (noauth, e.g. http://127.0.0.1:9876) instead of the embedded emulator.
    #[arg(long, value_name = "URL")]
    pub octavia_url: Option<String>,
    /// Print the summary and exit (status 1 unless every pod was wired) instead of running until Ctrl-C.
    #[arg(long)]
    pub exit_after_summary: bool,
    /// OpenStack deployments, each an embedded Neutron emulator with its own availability zone
    /// and KuryrOpenStackDeployment object; the demo namespaces ask for the zones in turn, and the
    /// summary shows where namespaces and ports landed (2 or more turns placement on).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub deployments: u16,
}

#[derive(Args, Debug, Clone)]
pub struct InstallCniArgs {
    /// The kuryr-cni executable to install (default: `kuryr-cni` next to this `kuryr` binary).
    #[arg(long, value_name = "PATH")]
    pub cni_bin: Option<PathBuf>,
    /// The host's CNI plugin directory.
    #[arg(long, default_value = "/opt/cni/bin", value_name = "DIR")]
    pub bin_dir: PathBuf,
    /// The host's CNI configuration directory; `10-kuryr.conflist` is written there.
    #[arg(long, default_value = "/etc/cni/net.d", value_name = "DIR")]
    pub conf_dir: PathBuf,
    /// `kuryr_conf` in the conflist.
    #[arg(long, default_value = "/etc/kuryr/kuryr.conf", value_name = "PATH")]
    pub kuryr_conf: String,
    /// `debug` in the conflist.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub debug: bool,
    /// kuryr-rs addition: `kuryr_daemon` in the conflist (http://host:port or a unix socket path;
    /// left out by default, so kuryr-cni uses its built-in address as upstream's plugin does).
    #[arg(long, value_name = "URL")]
    pub kuryr_daemon: Option<String>,
    /// kuryr-rs addition: `kuryr_daemon_timeout` in the conflist, in seconds (left out by default).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub kuryr_daemon_timeout: Option<u64>,
}

#[derive(Args, Debug, Clone)]
pub struct ManifestsArgs {
    /// The kuryr.conf the services will run with (put into the ConfigMap as it is).
    #[arg(long = "config-file", value_name = "FILE")]
    pub config_file: PathBuf,
    /// Namespace of the install (must be `[kubernetes] controller_namespace`).
    #[arg(long, default_value = "kuryr")]
    pub namespace: String,
    /// Container image of both workloads (default: the one scripts/build-image.sh builds).
    #[arg(long)]
    pub image: Option<String>,
    /// Node selector of both workloads, KEY=VALUE; repeat it.
    #[arg(long = "node-selector", value_name = "KEY=VALUE")]
    pub node_selector: Vec<String>,
    /// Controller replicas (more than one needs `[kubernetes] controller_ha = True`).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub replicas: u32,
    /// Write one file per job into DIR instead of printing them.
    #[arg(long, value_name = "DIR", conflicts_with = "check")]
    pub output_dir: Option<PathBuf>,
    /// Only compare DIR with the generated files; exit 1 when they differ.
    #[arg(long, value_name = "DIR")]
    pub check: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// kuryr.conf to check (default: the install's ConfigMap `kuryr-config` in --namespace).
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Namespace of the install, where the ConfigMap is read from.
    #[arg(long, default_value = "kuryr")]
    pub namespace: String,
    /// Do not ask Neutron for the port quota.
    #[arg(long)]
    pub skip_neutron: bool,
}

/// kubectl's `-o` values the plugin supports.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Json,
    Yaml,
    Wide,
}

/// kubectl's connection and output options, shared by `kuryr kubectl ...`, `kuryr bindings` and
/// `kuryr deployments`.
#[derive(Args, Debug, Clone, Default)]
pub struct KubeOpts {
    /// Namespace (default: the context's for `get vif`, the install's `kuryr` for the others).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Args, Debug, Clone)]
pub struct KubectlArgs {
    #[command(flatten)]
    pub kube: KubeOpts,
    #[command(subcommand)]
    pub command: KubectlCommand,
}

/// `kuryr bindings ...`: the same as `kuryr kubectl bindings ...`.
#[derive(Args, Debug, Clone)]
pub struct BindingsArgs {
    #[command(flatten)]
    pub kube: KubeOpts,
    #[command(subcommand)]
    pub action: Option<BindingsAction>,
}

/// `kuryr deployments ...`: the same as `kuryr kubectl deployments ...`.
#[derive(Args, Debug, Clone)]
pub struct DeploymentsArgs {
    #[command(flatten)]
    pub kube: KubeOpts,
    #[command(subcommand)]
    pub action: Option<DeploymentsAction>,
}

impl From<BindingsArgs> for KubectlArgs {
    fn from(a: BindingsArgs) -> Self {
        Self {
            kube: a.kube,
            command: KubectlCommand::Bindings { action: a.action },
        }
    }
}

impl From<DeploymentsArgs> for KubectlArgs {
    fn from(a: DeploymentsArgs) -> Self {
        Self {
            kube: a.kube,
            command: KubectlCommand::Deployments { action: a.action },
        }
    }
}

#[derive(Subcommand, Debug, Clone)]
pub enum KubectlCommand {
    /// Show kuryr objects of a pod.
    #[command(subcommand)]
    Get(KubectlGet),
    /// The controller's port pools (KuryrPortPools).
    Pools,
    /// Which OpenStack deployment serves each project (placement history); pin, unpin or move one.
    Bindings {
        #[command(subcommand)]
        action: Option<BindingsAction>,
    },
    /// The OpenStack deployments (KuryrOpenStackDeployments) with their usage and its age; maintenance.
    Deployments {
        #[command(subcommand)]
        action: Option<DeploymentsAction>,
    },
    /// The upgrade and sanity checks of `kuryr status`, on the install's ConfigMap.
    Status {
        /// Do not ask Neutron for the port quota.
        #[arg(long)]
        skip_neutron: bool,
    },
}

/// Which binding: a project and the group its namespaces ask for.
#[derive(clap::Args, Debug, Clone)]
pub struct BindingSelector {
    /// The (cluster) project id.
    pub project: String,
    /// The availability zone of the group (none = no zone).
    #[arg(long)]
    pub zone: Option<String>,
    /// The resource affinity of the group, `key=value[,key=value]`.
    #[arg(long)]
    pub affinity: Option<String>,
}

#[derive(Subcommand, Debug, Clone)]
pub enum BindingsAction {
    /// One row per binding: where it is now and since when (the default).
    List,
    /// One binding: its key, deployment, pin and whole history.
    Show(BindingSelector),
    /// The history rows (bound at, unbound at, why) of every binding, or of PROJECT's.
    History {
        /// Only this (cluster) project's bindings.
        project: Option<String>,
    },
    /// Keep the binding where it is whatever the filters say (until unpinned or its deployment is removed).
    Pin(BindingSelector),
    /// Let the scheduler move the binding again.
    Unpin(BindingSelector),
    /// Move the binding to deployment TO now (a history row and an Event "moved by an operator");
    /// new namespaces go there at once.
    Move {
        #[command(flatten)]
        binding: BindingSelector,
        #[arg(long)]
        to: String,
    },
}

#[derive(Subcommand, Debug, Clone)]
pub enum DeploymentsAction {
    /// One row per deployment with its usage and the age of that figure (the default).
    List,
    /// Put a deployment into maintenance (on) or take it out (off).
    Maintenance {
        name: String,
        #[arg(value_parser = ["on", "off"])]
        state: String,
        #[arg(long)]
        reason: Option<String>,
        /// With maintenance on, move existing bindings elsewhere too.
        #[arg(long)]
        move_existing: bool,
        /// With maintenance on, when it ends by itself: an RFC 3339 time
        /// (`2026-12-01T06:00:00Z`) or a duration from now (`90m`, `2h`, `1d`).
        #[arg(long)]
        until: Option<String>,
    },
}

#[derive(Subcommand, Debug, Clone)]
pub enum KubectlGet {
    /// The interfaces (VIFs) of POD, from its KuryrPort.
    Vif { pod: String },
}
