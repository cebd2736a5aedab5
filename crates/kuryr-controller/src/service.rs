//! The controller process: leader election, the handler pipeline while leading, pool maintenance,
//! and the health (`/ready`, `/alive`) and Prometheus (`/metrics`) endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use kube::Client;
use kuryr_config::KuryrConfig;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cluster_claim::ClusterClaim;
use crate::context::{Context, Platform};
use crate::error::Error;
use crate::handlers::HandlerRegistry;
use crate::leader::{LeaderElector, LeaseConfig};
use crate::metrics::Metrics;
use crate::openstack::Deployments;
use crate::pipeline::{ControllerPipeline, RetryPolicy};
use crate::pool::PoolManager;

/// How often the groups of gone NetworkPolicies and namespaces are looked for (the first pass at
/// the start of each leadership term).
const GROUP_SWEEP_PERIOD: Duration = Duration::from_secs(60);

/// How long a term's start waits for the cluster_id claim checks before starting the handlers
/// anyway (an unreachable deployment's sweeps then wait for a later check).
const FIRST_CLAIM_WAIT: Duration = Duration::from_secs(15);

/// How to run a controller.
pub struct ControllerOptions {
    pub config: Arc<KuryrConfig>,
    pub kube: Client,
    pub deployments: Deployments,
    pub metrics: Metrics,
    pub registry: HandlerRegistry,
    /// Identity in the leader Lease (pod name / hostname).
    pub identity: String,
    /// Health endpoint address; `None` = off (tests run many controllers in one process).
    pub health_addr: Option<SocketAddr>,
    /// Prometheus endpoint address; `None` = off.
    pub metrics_addr: Option<SocketAddr>,
    /// Handlers run concurrently on this many objects at most.
    pub max_concurrency: usize,
    pub retry: RetryPolicy,
}

impl ControllerOptions {
    pub fn new(config: Arc<KuryrConfig>, kube: Client, deployments: Deployments, metrics: Metrics) -> Self {
        let identity = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| format!("kuryr-controller-{}", std::process::id()));
        let health_addr = Some(SocketAddr::from(([0, 0, 0, 0], config.health_server.port)));
        let metrics_addr = Some(SocketAddr::from((
            [0, 0, 0, 0],
            config.prometheus_exporter.controller_exporter_port,
        )));
        Self {
            config,
            kube,
            deployments,
            metrics,
            registry: HandlerRegistry::with_builtin(),
            identity,
            health_addr,
            metrics_addr,
            max_concurrency: 64,
            retry: RetryPolicy::default(),
        }
    }
}

/// What `/ready` reports on.
#[derive(Default)]
pub struct Readiness {
    pub kube_ok: AtomicBool,
    pub neutron_ok: AtomicBool,
    pub pools_ready: AtomicBool,
    pub leader: AtomicBool,
}

impl Readiness {
    /// The APIs answer and, on the leader, its pools are recovered. A standby has no pools to
    /// recover (only the leader maintains them): it is ready to take over, and must count as
    /// ready, or a rolling update and a PodDisruptionBudget of two replicas wait on it for ever.
    pub fn ready(&self) -> bool {
        self.kube_ok.load(Ordering::Relaxed)
            && self.neutron_ok.load(Ordering::Relaxed)
            && (self.pools_ready.load(Ordering::Relaxed) || !self.leader.load(Ordering::Relaxed))
    }
}

/// Runs the controller until `stop` is cancelled.
pub async fn run(opts: ControllerOptions, stop: CancellationToken) -> Result<(), Error> {
    // Its own token, cancelled also when the controller stops on its own (a refused cluster_id):
    // the elector and the health server end with it.
    let stop = stop.child_token();
    if opts
        .config
        .kubernetes
        .enabled_handlers
        .iter()
        .any(|h| h == "service")
    {
        crate::handlers::service::check_config(&opts.config)?;
    }
    let metrics = opts.metrics.clone();
    let ctx = Context::build(Arc::new(Platform::new(
        opts.kube.clone(),
        opts.config.clone(),
        opts.deployments.clone(),
        metrics.clone(),
    )))?;
    let pools = ctx.drivers.pools.clone();
    let handlers = opts
        .registry
        .build(&opts.config.kubernetes.enabled_handlers, &ctx)?;
    tracing::info!(
        handlers = ?handlers.iter().map(|h| h.name.clone()).collect::<Vec<_>>(),
        vif_driver = ctx.drivers.vif.name(),
        pool = ctx.drivers.pool.name(),
        "controller starting"
    );
    let readiness = Arc::new(Readiness::default());
    readiness.pools_ready.store(pools.is_none(), Ordering::Relaxed);

    let mut tasks = tokio::task::JoinSet::new();
    if let Some(addr) = opts.health_addr {
        tasks.spawn(serve_health(addr, readiness.clone(), stop.clone()));
    }
    if let Some(addr) = opts.metrics_addr {
        tasks.spawn(serve_metrics(addr, metrics.clone(), stop.clone()));
    }
    tasks.spawn(probe_dependencies(ctx.clone(), readiness.clone(), stop.clone()));

    // Leadership: with controller_ha the Lease decides; without it this replica always leads.
    let (tx, mut rx) = watch::channel(!opts.config.kubernetes.controller_ha);
    if opts.config.kubernetes.controller_ha {
        let elector = LeaderElector::new(
            opts.kube.clone(),
            LeaseConfig::new(&opts.config.kubernetes.controller_namespace, &opts.identity),
        );
        tasks.spawn(elector.run(tx, stop.clone()));
    }

    let reconcile = Duration::from_secs(opts.config.kubernetes.watch_reconcile_period.max(1));
    let mut leading: Option<CancellationToken> = None;
    // A term's tasks report here what must stop the controller (a cluster_id held by another cluster).
    let (fatal_tx, mut fatal_rx) = tokio::sync::mpsc::channel::<Error>(1);
    let mut ended: Result<(), Error> = Ok(());
    let handlers = Arc::new(std::sync::Mutex::new(Some(handlers)));
    loop {
        let is_leader = *rx.borrow_and_update();
        readiness.leader.store(is_leader, Ordering::Relaxed);
        match (is_leader, &leading) {
            (true, None) => {
                let token = stop.child_token();
                ctx.term.begin(k8s_openapi::jiff::Timestamp::now());
                // What a previous term learned of the policies may have changed meanwhile.
                ctx.drivers.network_policy.forget().await;
                if let Some(binder) = &ctx.placement {
                    // What a previous term knew may have been changed by another leader.
                    binder.begin_term().await;
                    let pb = &opts.config.pod_binding;
                    tasks.spawn(crate::placement::watch::run(
                        ctx.platform().clone(),
                        binder.clone(),
                        token.clone(),
                    ));
                    tasks.spawn(crate::placement::usage::run(
                        ctx.platform().clone(),
                        binder.clone(),
                        Duration::from_secs(pb.usage_refresh_interval),
                        Duration::from_secs(pb.usage_timeout.max(1)),
                        token.clone(),
                    ));
                    if pb.unused_binding_retention > 0 {
                        tasks.spawn(crate::placement::retire::run(
                            ctx.platform().clone(),
                            Duration::from_secs(pb.unused_binding_retention),
                            token.clone(),
                        ));
                    }
                }
                // Before any handler runs: a cluster_id another cluster holds is refused here (after the
                // placement watch started: a deployment's project id may come from its objects). The
                // wait is bounded, and ends with the term or the process.
                let claim = Arc::new(ClusterClaim::new(ctx.platform().clone()));
                let first = tokio::select! {
                    _ = stop.cancelled() => {
                        token.cancel();
                        break;
                    }
                    changed = rx.changed() => {
                        ctx.term.end();
                        token.cancel();
                        if changed.is_err() {
                            break;
                        }
                        // Leadership changed meanwhile: the loop starts over from the new state.
                        continue;
                    }
                    r = claim.check_all_within(FIRST_CLAIM_WAIT) => r,
                };
                let all_held = match first {
                    Ok(all_held) => all_held,
                    Err(taken) => {
                        claim.withdraw().await;
                        ended = Err(taken);
                        ctx.term.end();
                        token.cancel();
                        break;
                    }
                };
                tasks.spawn(claim.run(all_held, fatal_tx.clone(), token.clone()));
                // Handlers are instantiated once; on a later re-election rebuild them.
                let hs = match handlers.lock().ok().and_then(|mut h| h.take()) {
                    Some(h) => h,
                    None => opts
                        .registry
                        .build(&opts.config.kubernetes.enabled_handlers, &ctx)?,
                };
                let mut pipeline = ControllerPipeline::new(
                    Arc::new(opts.kube.clone()),
                    opts.retry.clone(),
                    metrics.clone(),
                    token.clone(),
                );
                for h in hs {
                    pipeline.register(h);
                }
                if opts
                    .config
                    .kubernetes
                    .enabled_handlers
                    .iter()
                    .any(|h| h == "kuryrloadbalancer")
                {
                    let every = Duration::from_secs(opts.config.octavia_defaults.reconcile_period.max(1));
                    tasks.spawn(
                        crate::services::reconcile::Reconciler::new(ctx.clone()).run(every, token.clone()),
                    );
                }
                if opts
                    .config
                    .kubernetes
                    .enabled_handlers
                    .iter()
                    .any(|h| h == "kuryrnetworkpolicy")
                {
                    tasks.spawn(
                        ctx.drivers
                            .network_policy
                            .clone()
                            .run_sweeps(GROUP_SWEEP_PERIOD, token.clone()),
                    );
                }
                if let Some(groups) = &ctx.drivers.namespace_groups {
                    groups.forget_all().await;
                    let (groups, kube) = (groups.clone(), opts.kube.clone());
                    tasks.spawn(crate::periodic::sweeps(
                        "namespace security groups",
                        GROUP_SWEEP_PERIOD,
                        token.clone(),
                        move || {
                            let (groups, kube) = (groups.clone(), kube.clone());
                            async move { groups.sweep_orphans(&kube).await }
                        },
                    ));
                }
                if let Some(p) = &pools {
                    // Pools act on Neutron too: only the leader maintains (and recovers) them.
                    tasks.spawn(p.clone().run(token.clone()));
                    tasks.spawn(track_pool_readiness(p.clone(), readiness.clone(), token.clone()));
                } else {
                    // Without pools the pod ports still need their orphan sweep.
                    tasks.spawn(crate::pool::sweep::run_without_pools(ctx.clone(), token.clone()));
                }
                tracing::info!(identity = %opts.identity, "leading: pipeline started");
                tasks.spawn(pipeline.run(opts.kube.clone(), reconcile, opts.max_concurrency, token.clone()));
                leading = Some(token);
            }
            (false, Some(token)) => {
                tracing::warn!(identity = %opts.identity, "lost leadership: pipeline stopped");
                ctx.term.end();
                token.cancel();
                // The pool manager's term ends with the token: its pools are dropped and the
                // next term recovers them again (PoolManager::run).
                readiness.pools_ready.store(pools.is_none(), Ordering::Relaxed);
                leading = None;
            }
            _ => {}
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            changed = rx.changed() => if changed.is_err() { break },
            Some(e) = fatal_rx.recv() => {
                ended = Err(e);
                break;
            }
        }
    }
    if let Some(t) = leading {
        t.cancel();
    }
    stop.cancel();
    // Graceful shutdown: let in-flight watch loops observe the cancellation.
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if let Err(e) = &ended {
        tracing::error!(error = %e, "controller stopped");
    }
    ended
}

async fn track_pool_readiness(pools: Arc<PoolManager>, readiness: Arc<Readiness>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => readiness.pools_ready.store(pools.is_ready(), Ordering::Relaxed),
        }
    }
}

async fn probe_dependencies(ctx: Arc<Context>, readiness: Arc<Readiness>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                let kube_ok = ctx.kube.apiserver_version().await.is_ok();
                readiness.kube_ok.store(kube_ok, Ordering::Relaxed);
                let mut neutron_ok = true;
                for name in ctx.deployments.names() {
                    if let Ok(c) = ctx.deployments.client(name) {
                        neutron_ok &= c.list_extensions().await.is_ok();
                    }
                }
                readiness.neutron_ok.store(neutron_ok, Ordering::Relaxed);
            }
        }
    }
}

async fn serve_health(addr: SocketAddr, readiness: Arc<Readiness>, stop: CancellationToken) {
    let app = Router::new()
        .route("/alive", get(|| async { StatusCode::OK }))
        .route(
            "/ready",
            get(|State(r): State<Arc<Readiness>>| async move {
                if r.ready() {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .with_state(readiness);
    serve(addr, app, stop, "health").await;
}

async fn serve_metrics(addr: SocketAddr, metrics: Metrics, stop: CancellationToken) {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Metrics>| async move { m.encode() }),
        )
        .with_state(metrics);
    serve(addr, app, stop, "metrics").await;
}

/// How long a port may stay taken before that is an error: a restarted process may find it held
/// for a while (a connection of the old one, or an outgoing connection's source port).
const BIND_PATIENCE: Duration = Duration::from_secs(60);

async fn serve(addr: SocketAddr, app: Router, stop: CancellationToken, what: &str) {
    let started = tokio::time::Instant::now();
    let mut wait = Duration::from_millis(500);
    let mut reported = false;
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) => {
                if !reported && started.elapsed() >= BIND_PATIENCE {
                    tracing::error!(%addr, error = %e, "cannot bind {what} endpoint; still trying");
                    reported = true;
                } else if !reported {
                    tracing::warn!(%addr, error = %e, retry_in = ?wait, "cannot bind {what} endpoint yet");
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(Duration::from_secs(10));
    };
    tracing::info!(%addr, "{what} endpoint listening");
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_is_ready_without_pools_and_a_leader_once_its_pools_are_recovered() {
        let r = Readiness::default();
        r.kube_ok.store(true, Ordering::Relaxed);
        r.neutron_ok.store(true, Ordering::Relaxed);
        // Pools configured, not recovered: the standby is ready, the leader is not.
        assert!(r.ready());
        r.leader.store(true, Ordering::Relaxed);
        assert!(!r.ready());
        r.pools_ready.store(true, Ordering::Relaxed);
        assert!(r.ready());
        // The APIs still decide for both.
        r.leader.store(false, Ordering::Relaxed);
        r.neutron_ok.store(false, Ordering::Relaxed);
        assert!(!r.ready());
    }
}
