//! `kuryr`: the kuryr-rs command line.
//!
//! - `kuryr controller` / `kuryr daemon`: the two long-running services, configured by upstream
//!   `kuryr.conf` files (`--config-file`, `--config-dir`, like oslo.config);
//! - `kuryr crds`: writes or checks the CRD manifests;
//! - `kuryr manifests`: every object an install needs, from kuryr.conf;
//! - `kuryr status`: upgrade and sanity checks of a cluster;
//! - `kuryr kubectl` (also as `kubectl-kuryr`): the kubectl plugin;
//! - `kuryr install-cni`: installs kuryr-cni and its conflist on a node;
//! - `kuryr pools`: the controller's port pools over its management socket;
//! - `kuryr sandbox`: a whole cluster on the laptop (Kubernetes and Neutron emulators, a controller,
//!   two simulated nodes) wiring demo pods, with a latency summary;
//! - `kuryr bench`: the peer benchmark against upstream kuryr-kubernetes' controller;
//! - `kuryr chaos`: a soak of two controller processes under churn and faults, with an
//!   invariant checker.

mod allocator;
mod bench;
mod chaos;
mod cli;
mod cluster_config;
mod crds;
mod install_cni;
mod kubeclient;
mod kubectl_plugin;
mod manifests;
mod pools;
mod sandbox;
mod services;
mod status;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

/// kube-rs logs every failed request at ERROR (`failed with status 503`) before it hands the
/// error to its caller, which retries it or reports it with its context: during an API outage
/// that is an ERROR line per request for a condition the controller handles. Left to the
/// callers unless `RUST_LOG` names kube_client itself.
const KUBE_REQUEST_FAILURES: &str = "kube_client::client::builder=off";

fn init_logging(default_filter: &str) {
    let from_env = std::env::var("RUST_LOG").ok();
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    if !from_env.is_some_and(|v| v.contains("kube_client"))
        && let Ok(directive) = KUBE_REQUEST_FAILURES.parse()
    {
        filter = filter.add_directive(directive);
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(kubectl_plugin::plugin_argv(std::env::args_os().collect()));
    // The sandbox prints its own progress on stdout; only warnings from the components go to the log.
    init_logging(match cli.command {
        Command::Sandbox(_)
        | Command::Bench(_)
        | Command::Chaos(_)
        | Command::Pools(_)
        | Command::Status(_)
        | Command::Kubectl(_)
        | Command::Bindings(_)
        | Command::Deployments(_) => "warn",
        _ => "info",
    });
    // kube-rs and reqwest are built without a default crypto provider (ring only, no aws-lc).
    let _ = rustls::crypto::ring::default_provider().install_default();

    if let Command::Crds(args) = &cli.command {
        return crds::run(args);
    }
    if let Command::Manifests(args) = &cli.command {
        return manifests::run(args);
    }
    if let Command::InstallCni(args) = &cli.command {
        return install_cni::run(args);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kuryr: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Status(args) => return runtime.block_on(status::run(args)),
        Command::Kubectl(args) => return runtime.block_on(kubectl_plugin::run(args)),
        Command::Bindings(args) => return runtime.block_on(kubectl_plugin::run(args.into())),
        Command::Deployments(args) => return runtime.block_on(kubectl_plugin::run(args.into())),
        _ => {}
    }
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Controller(args) => services::controller(args).await,
            Command::Daemon(args) => services::daemon(args).await,
            Command::Pools(args) => pools::run(args).await,
            Command::Sandbox(args) => sandbox::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Chaos(args) => chaos::run(args).await,
            Command::Crds(_)
            | Command::InstallCni(_)
            | Command::Manifests(_)
            | Command::Status(_)
            | Command::Kubectl(_)
            | Command::Bindings(_)
            | Command::Deployments(_) => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kuryr: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
