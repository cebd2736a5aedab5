//! Usage of each deployment, measured periodically off the request path. What runs out for kuryr
//! is (a) a project's port quota and (b) IPv4 addresses: free addresses on the pod subnets and the
//! headroom of the pod subnet pool. IPv6 is left out (a /64 never runs out and would hide an
//! exhausted IPv4 subnet in a sum).
//!
//! Every deployment is measured in parallel, each within `[pod_binding] usage_timeout`, so one
//! hung cloud never delays the others. The stated rule for figures that cannot be had: a failed
//! or timed-out measurement makes the figure stale (shown as such, with the last good fraction
//! and its time); a stale deployment keeps its bindings but gets no new ones, and its figure never
//! grows by virtual consumption.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kuryr_crds::KuryrOpenStackDeployment;
use kuryr_neutron::{ListFilter, NeutronClient};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Binder, ProjectUsage, UsageFigure};
use crate::context::Platform;
use crate::error::Error;

/// One deployment's measurement.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Measured {
    /// Cluster project id -> (ports used, limit); unlimited quotas are left out.
    pub ports: BTreeMap<String, (i64, i64)>,
    /// When `ports` was read, if by an earlier round (this one could not list the bindings).
    #[serde(skip)]
    pub ports_measured_at: Option<String>,
    /// Free and total IPv4 addresses over the pod subnets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<(u128, u128)>,
    /// Free and total IPv4 addresses of the pod subnet pool's prefixes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnet_pool: Option<(u128, u128)>,
}

fn ratio(used: u128, total: u128) -> Option<f64> {
    (total > 0).then(|| used as f64 / total as f64)
}

impl Measured {
    /// The deployment-wide fraction: the fuller of the pod subnets and the subnet pool (0 when
    /// neither applies).
    pub fn fraction(&self) -> f64 {
        [self.ipv4, self.subnet_pool]
            .into_iter()
            .flatten()
            .filter_map(|(free, total)| ratio(total.saturating_sub(free), total))
            .fold(0.0, f64::max)
    }

    /// `project`'s port quota fraction. A limit of 0 is a project kept out of the deployment: full.
    pub fn project_fraction(&self, project: &str) -> Option<f64> {
        self.ports.get(project).and_then(|(used, limit)| match *limit {
            l if l < 0 => None,
            0 => Some(1.0),
            l => Some((*used).max(0) as f64 / l as f64),
        })
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut v = json!({"fraction": format!("{:.3}", self.fraction())});
        let ports: serde_json::Map<String, serde_json::Value> = self
            .ports
            .iter()
            .map(|(p, (used, limit))| (p.clone(), json!({"used": used, "limit": limit})))
            .collect();
        if !ports.is_empty() {
            v["ports"] = ports.into();
        }
        if let Some(at) = &self.ports_measured_at {
            v["portsMeasuredAt"] = at.clone().into();
        }
        for (k, f) in [("ipv4", self.ipv4), ("subnetPool", self.subnet_pool)] {
            if let Some((free, total)) = f {
                v[k] = json!({"free": free.to_string(), "total": total.to_string()});
            }
        }
        v
    }
}

/// Addresses in an IPv4 CIDR (None for IPv6 or garbage).
fn ipv4_size(cidr: &str) -> Option<u128> {
    let (addr, len) = cidr.split_once('/')?;
    addr.parse::<std::net::Ipv4Addr>().ok()?;
    let len: u32 = len.parse().ok()?;
    (len <= 32).then(|| 1u128 << (32 - len))
}

/// What to measure in one deployment.
#[derive(Clone, Debug, Default)]
pub struct Target {
    /// (cluster project id, id in this deployment).
    pub projects: Vec<(String, String)>,
    pub pod_subnets: Vec<String>,
    pub pod_subnet_pool: Option<String>,
}

/// Whether a round in `deployment` reads the port quota of `b`'s project: bound there now, or
/// until less than [`PAST_BINDINGS_MEASURED`] ago (an unreadable end time counts as recent).
pub fn measured_in(
    b: &super::store::BindingState,
    deployment: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> bool {
    b.history.iter().any(|r| {
        r.deployment == deployment
            && r.end.as_deref().is_none_or(|end| {
                end.parse::<k8s_openapi::jiff::Timestamp>()
                    .map_or(true, |end| now.duration_since(end) < PAST_BINDINGS_MEASURED)
            })
    })
}

/// How long a deployment's round still reads the port quota of a project that left it.
const PAST_BINDINGS_MEASURED: k8s_openapi::jiff::SignedDuration =
    k8s_openapi::jiff::SignedDuration::from_hours(24);

/// Reads of one round in flight at once against one deployment: a round reads a quota per
/// project ever bound there, and one after another a thousand projects outlast the round's
/// timeout (every figure would stay stale), while all at once they would flood Neutron.
const IN_FLIGHT: usize = 8;

/// Measures one deployment.
pub async fn measure_one(client: &NeutronClient, target: &Target) -> Result<Measured, Error> {
    let mut m = Measured::default();
    // Owned items and a client per read: borrowed ones make the round's future lose `Send`.
    let quotas: Vec<Result<_, Error>> = futures::stream::iter(target.projects.clone())
        .map(|(cluster_id, id)| {
            let client = client.clone();
            async move {
                let q = client
                    .get_quota_details(&id)
                    .await
                    .map_err(|e| Error::openstack(format!("port quota of project {id}"), e))?;
                Ok((
                    cluster_id,
                    q.get("port").filter(|p| p.limit >= 0).map(|p| (p.used, p.limit)),
                ))
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    for q in quotas {
        if let (cluster_id, Some(port)) = q? {
            m.ports.insert(cluster_id, port);
        }
    }
    let subnets: Vec<Result<_, Error>> = futures::stream::iter(target.pod_subnets.clone())
        .map(|s| {
            let client = client.clone();
            async move {
                client
                    .get_subnet(&s)
                    .await
                    .map_err(|e| Error::openstack(format!("pod subnet {s}"), e))
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut networks: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for subnet in subnets {
        let subnet = subnet?;
        if subnet.ip_version == 4 {
            networks.entry(subnet.network_id).or_default().push(subnet.id);
        }
    }
    for (net, subnets) in &networks {
        let avail = client
            .get_network_ip_availability(net)
            .await
            .map_err(|e| Error::openstack(format!("IP availability of network {net}"), e))?;
        let (free, total) = avail
            .subnet_ip_availability
            .iter()
            .filter(|a| a.ip_version == 4 && subnets.contains(&a.subnet_id))
            .fold((0u128, 0u128), |(f, t), a| {
                (f + a.total_ips.saturating_sub(a.used_ips), t + a.total_ips)
            });
        let (f0, t0) = m.ipv4.unwrap_or((0, 0));
        m.ipv4 = Some((f0 + free, t0 + total));
    }
    if let Some(pool) = &target.pod_subnet_pool {
        let sp = client
            .get_subnetpool(pool)
            .await
            .map_err(|e| Error::openstack(format!("pod subnet pool {pool}"), e))?;
        let total: u128 = sp.prefixes.iter().filter_map(|p| ipv4_size(p)).sum();
        if total > 0 {
            let used: u128 = client
                .list_subnets(&ListFilter::new().subnetpool_id(pool))
                .await
                .map_err(|e| Error::openstack(format!("subnets of pool {pool}"), e))?
                .iter()
                .filter_map(|s| ipv4_size(&s.cidr))
                .sum();
            m.subnet_pool = Some((total.saturating_sub(used), total));
        }
    }
    Ok(m)
}

/// The result of one round for one deployment.
#[derive(Clone, Debug)]
pub enum Outcome {
    Measured(Measured),
    Failed(String),
}

/// Measures every `(name, client, target)` in parallel, each within `timeout`.
pub async fn measure_all(
    targets: Vec<(String, NeutronClient, Target)>,
    timeout: Duration,
) -> BTreeMap<String, Outcome> {
    let rounds = targets.into_iter().map(|(name, client, target)| async move {
        let outcome = match tokio::time::timeout(timeout, measure_one(&client, &target)).await {
            Ok(Ok(m)) => Outcome::Measured(m),
            Ok(Err(e)) => Outcome::Failed(e.to_string()),
            Err(_) => Outcome::Failed(format!("no answer within {}s", timeout.as_secs_f64())),
        };
        (name, outcome)
    });
    futures::future::join_all(rounds).await.into_iter().collect()
}

/// The last figure of each deployment, kept across rounds.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub last_good: BTreeMap<String, (Measured, String)>,
}

impl Figures {
    /// A round that measured no project's quota (the bindings could not be listed) keeps the
    /// last ones measured, with the time they were: an empty list would clear every project's
    /// figure, and a project that left a deployment for its full quota there could be sent
    /// straight back; taken for new, they would move bound projects on old figures.
    pub fn keep_project_quotas(&self, round: &mut BTreeMap<String, Outcome>) {
        for (name, outcome) in round.iter_mut() {
            if let (Outcome::Measured(m), Some((last, at))) = (outcome, self.last_good.get(name)) {
                m.ports = last.ports.clone();
                m.ports_measured_at = Some(last.ports_measured_at.clone().unwrap_or_else(|| at.clone()));
            }
        }
    }

    /// Folds one round in: the scheduler's figure for each deployment, with per-project port
    /// fractions. A failure keeps the last good measurement but marks it stale.
    pub fn apply(
        &mut self,
        round: &BTreeMap<String, Outcome>,
        at: &str,
    ) -> BTreeMap<String, (UsageFigure, ProjectUsage)> {
        let mut out = BTreeMap::new();
        for (name, outcome) in round {
            let fig = match outcome {
                Outcome::Measured(m) => {
                    self.last_good.insert(name.clone(), (m.clone(), at.to_string()));
                    UsageFigure::Fresh(m.fraction())
                }
                Outcome::Failed(why) => UsageFigure::Stale {
                    last: self.last_good.get(name).map(|(m, _)| m.fraction()),
                    why: why.clone(),
                },
            };
            let projects = self
                .last_good
                .get(name)
                .map(|(m, _)| ProjectUsage {
                    fractions: m
                        .ports
                        .keys()
                        .filter_map(|p| m.project_fraction(p).map(|f| (p.clone(), f)))
                        .collect(),
                    carried: m.ports_measured_at.is_some(),
                })
                .unwrap_or_default();
            out.insert(name.clone(), (fig, projects));
        }
        out
    }
}

/// The pod subnets whose addresses a deployment's figure counts: those pods get addresses from,
/// which only the `default` subnets driver takes from kuryr.conf. With `namespace` each
/// namespace has a subnet of its own, from the pod subnet pool (measured as such); a
/// `pod_subnet` left in `[neutron_defaults]` then is no deployment's, and measuring it made
/// every other deployment stale (404) and the first look full when it was.
pub fn measured_pod_subnets(config: &kuryr_config::KuryrConfig, deployment: &str) -> Vec<String> {
    if config.kubernetes.pod_subnets_driver == kuryr_config::PodSubnetsDriver::Namespace {
        return Vec::new();
    }
    let mut pod_subnets: Vec<String> = config
        .deployment_defaults(deployment)
        .pod_subnet
        .into_iter()
        .collect();
    if deployment == crate::openstack::DEFAULT_DEPLOYMENT {
        pod_subnets.extend(config.neutron_defaults.pod_subnets.iter().cloned());
    }
    pod_subnets.sort();
    pod_subnets.dedup();
    pod_subnets
}

/// What to measure in each deployment: the projects bound there now or before, and its pod subnets
/// and pool.
/// Also whether the bindings could be listed and their projects' ids known (when not, no
/// project's quota is measured).
async fn targets(platform: &Platform, binder: &Binder) -> (Vec<(String, NeutronClient, Target)>, bool) {
    let (bindings, mut listed) = match binder.store().list().await {
        Ok(b) => (b, true),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list bindings: port quotas not measured this round");
            (vec![], false)
        }
    };
    let mut out = Vec::new();
    for name in platform.deployments.names() {
        let Ok(client) = platform.deployments.client(name) else {
            continue;
        };
        let defaults = platform.config.deployment_defaults(name);
        let pod_subnets = measured_pod_subnets(&platform.config, name);
        let mut projects = Vec::new();
        // Where a project is bound now, and where it was lately: a project that left a
        // deployment because its quota there was full must not be sent back while it still is
        // (its figure there would otherwise be gone, and the deployment-wide one may look
        // roomy). Lately, not ever: bindings are kept with their history (for as long as namespaces use
        // them, and a retention after), and a round reading the quota of
        // every project a deployment ever had would grow with tenant churn until it could not
        // finish within its timeout, leaving every figure stale.
        let now = k8s_openapi::jiff::Timestamp::now();
        // Once one project's id is not known, no quota is read this round (each lookup would
        // wait for the deployment objects again).
        for b in bindings.iter().filter(|b| listed && measured_in(b, name, now)) {
            let id = match binder.project_id(name, &b.key.project).await {
                Ok(id) => id,
                Err(e) => {
                    tracing::warn!(error = %e, "port quotas not measured this round");
                    listed = false;
                    projects.clear();
                    break;
                }
            };
            let pair = (b.key.project.clone(), id);
            if !projects.contains(&pair) {
                projects.push(pair);
            }
        }
        out.push((
            name.to_string(),
            client.clone(),
            Target {
                projects,
                pod_subnets,
                pod_subnet_pool: defaults.pod_subnet_pool,
            },
        ));
    }
    (out, listed)
}

/// Names null in `new` every key of `old` it has not, in the maps both have too: merged over
/// `old`, `new` is then what stays.
fn null_what_went(old: &serde_json::Value, new: &mut serde_json::Value) {
    let (Some(old), Some(new)) = (old.as_object(), new.as_object_mut()) else {
        return;
    };
    for (k, v) in old {
        match new.get_mut(k) {
            Some(n) => null_what_went(v, n),
            None => {
                new.insert(k.clone(), serde_json::Value::Null);
            }
        }
    }
}

/// Publishes one deployment's figure on its KuryrOpenStackDeployment (when there is one).
async fn publish(api: &Api<KuryrOpenStackDeployment>, name: &str, figures: &Figures, stale: Option<&str>) {
    let last = figures.last_good.get(name);
    let mut usage = last.map(|(m, _)| m.to_json()).unwrap_or(serde_json::Value::Null);
    if let Some(why) = stale
        && usage.is_object()
    {
        usage["staleBecause"] = why.into();
    } else if let Some(why) = stale {
        usage = json!({"staleBecause": why});
    }
    // A merge patch keeps the keys it does not name: the ones the published figure has and this
    // one has not are named null, so a recovered figure has no `staleBecause` left over, and the
    // projects no longer measured drop out.
    if let Ok(obj) = api.get_status(name).await
        && let Some(old) = obj.status.and_then(|s| s.usage)
    {
        null_what_went(&old, &mut usage);
    }
    let patch = json!({"status": {
        "usage": usage,
        "measuredAt": last.map(|(_, at)| at.clone()),
        "stale": stale.is_some(),
    }});
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => tracing::warn!(deployment = name, error = %e, "cannot publish usage"),
    }
}

/// Measures every deployment every `every` until `stop`.
pub async fn run(
    platform: Arc<Platform>,
    binder: Arc<Binder>,
    every: Duration,
    timeout: Duration,
    stop: CancellationToken,
) {
    let api: Api<KuryrOpenStackDeployment> = Api::all(platform.kube.clone());
    let mut figures = Figures::default();
    let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (targets, bindings_listed) = targets(&platform, &binder).await;
        let mut round = measure_all(targets, timeout).await;
        if !bindings_listed {
            figures.keep_project_quotas(&mut round);
        }
        let at = super::store::now();
        let scheduler_figures = figures.apply(&round, &at);
        binder.set_usage(&scheduler_figures).await;
        for (name, outcome) in &round {
            let stale = match outcome {
                Outcome::Measured(m) => {
                    platform.metrics.deployment_usage(name, "fraction", m.fraction());
                    // Quotas carried from an earlier round were exported when they were read.
                    for p in m.ports.keys().filter(|_| m.ports_measured_at.is_none()) {
                        if let Some(f) = m.project_fraction(p) {
                            platform.metrics.deployment_usage(name, &format!("ports:{p}"), f);
                        }
                    }
                    None
                }
                Outcome::Failed(why) => {
                    tracing::warn!(deployment = %name, error = %why, "usage measurement failed: figure is stale");
                    Some(why.as_str())
                }
            };
            let measured = figures
                .last_good
                .get(name)
                .and_then(|(_, at)| at.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .map(|t| t.as_millisecond() as f64 / 1000.0);
            platform
                .metrics
                .deployment_usage_state(name, measured, stale.is_some());
            publish(&api, name, &figures, stale).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published figure is replaced, not merged into the last one: what the new one has not
    /// (a stale reason after a recovery, a project no longer measured) is named null.
    #[test]
    fn a_published_figure_drops_what_the_new_one_has_not() {
        let old = json!({"fraction": "0.500", "staleBecause": "timeout",
            "ports": {"p1": {"used": 1, "limit": 10}, "p2": {"used": 2, "limit": 10}}});
        let mut new = json!({"fraction": "0.400", "ports": {"p1": {"used": 3, "limit": 10}}});
        null_what_went(&old, &mut new);
        assert_eq!(
            new,
            json!({"fraction": "0.400", "staleBecause": null,
                "ports": {"p1": {"used": 3, "limit": 10}, "p2": null}})
        );
        let mut gone = serde_json::Value::Null;
        null_what_went(&old, &mut gone);
        assert_eq!(gone, serde_json::Value::Null, "no figure: the whole map goes");
    }

    /// A deployment's round reads the quotas of the projects bound there now or within the
    /// last day, not of every project it ever had.
    #[test]
    fn only_current_and_recent_bindings_are_measured() {
        use crate::placement::store::{BindingRecord, BindingState};
        let now: k8s_openapi::jiff::Timestamp = "2026-11-30T12:00:00Z".parse().expect("time");
        let row = |d: &str, end: Option<&str>| BindingRecord {
            deployment: d.into(),
            start: "2026-01-01T00:00:00Z".into(),
            end: end.map(Into::into),
            why: String::new(),
        };
        let state = |history| BindingState {
            key: crate::placement::BindingKey {
                project: "p".into(),
                group: Default::default(),
            },
            pinned: false,
            history,
        };
        let b = state(vec![
            row("old", Some("2026-06-01T00:00:00Z")),
            row("lately", Some("2026-11-30T02:00:00Z")),
            row("now", None),
        ]);
        assert!(measured_in(&b, "now", now));
        assert!(measured_in(&b, "lately", now));
        assert!(!measured_in(&b, "old", now), "left half a year ago");
        assert!(!measured_in(&b, "never", now));
    }

    /// A round whose bindings could not be listed keeps the project quotas last measured.
    #[test]
    fn a_round_without_the_bindings_keeps_the_project_quotas() {
        let mut figures = Figures::default();
        let full = Measured {
            ports: BTreeMap::from([("t1".to_string(), (99, 100))]),
            ..Measured::default()
        };
        let round = BTreeMap::from([("west".to_string(), Outcome::Measured(full))]);
        let first = figures.apply(&round, "t0");
        assert_eq!(first["west"].1.fractions.get("t1"), Some(&0.99));
        assert!(!first["west"].1.carried);
        let mut blind = BTreeMap::from([("west".to_string(), Outcome::Measured(Measured::default()))]);
        figures.keep_project_quotas(&mut blind);
        let second = figures.apply(&blind, "t1");
        assert_eq!(second["west"].1.fractions.get("t1"), Some(&0.99), "{second:?}");
        assert!(second["west"].1.carried, "read at t0, not t1: {second:?}");
        assert_eq!(figures.last_good["west"].0.to_json()["portsMeasuredAt"], "t0");
        // Carried again, they keep the time they were read; a round that reads them again is new.
        let mut blind = BTreeMap::from([("west".to_string(), Outcome::Measured(Measured::default()))]);
        figures.keep_project_quotas(&mut blind);
        figures.apply(&blind, "t2");
        assert_eq!(
            figures.last_good["west"].0.ports_measured_at.as_deref(),
            Some("t0")
        );
        let read = Measured {
            ports: BTreeMap::from([("t1".to_string(), (50, 100))]),
            ..Measured::default()
        };
        let third = figures.apply(
            &BTreeMap::from([("west".to_string(), Outcome::Measured(read))]),
            "t3",
        );
        assert!(!third["west"].1.carried);
        assert_eq!(third["west"].1.fractions.get("t1"), Some(&0.5));
        assert!(
            figures.last_good["west"]
                .0
                .to_json()
                .get("portsMeasuredAt")
                .is_none()
        );
    }

    /// Only the `default` subnets driver's subnets are measured: with per-namespace subnets a
    /// `pod_subnet` left in `[neutron_defaults]` is no deployment's.
    #[test]
    fn only_the_subnets_pods_get_addresses_from_are_measured() {
        let conf = |driver: &str| {
            kuryr_config::KuryrConfig::from_ini_str(&format!(
                "[kubernetes]\npod_subnets_driver = {driver}\n[neutron_defaults]\npod_subnet = legacy\n\
                 [neutron]\nauth_type = noauth\nendpoint_override = http://a\n\
                 [deployment:west]\nauth_type = noauth\nendpoint_override = http://b\npod_subnet = w\n"
            ))
            .unwrap_or_else(|e| panic!("{e}"))
            .config
        };
        let default = conf("default");
        assert_eq!(measured_pod_subnets(&default, "default"), ["legacy"]);
        assert_eq!(measured_pod_subnets(&default, "west"), ["w"]);
        let namespace = conf("namespace");
        assert!(measured_pod_subnets(&namespace, "default").is_empty());
        assert!(measured_pod_subnets(&namespace, "west").is_empty());
    }

    /// A round reads every bound project's quota a few at a time: 24 projects behind a Neutron
    /// answering each read in 250 ms are measured within a 3 s timeout (one after another they
    /// took 6 s, and every figure stayed stale for ever).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_projects_are_measured_within_the_round_timeout() {
        use neutron_emulator::{Emulator, EmulatorOptions, LatencyProfile, LatencyTable, OpLatency};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let emu = Emulator::start(EmulatorOptions {
            latency: LatencyProfile::Custom(LatencyTable {
                default: OpLatency::fixed(250),
                ops: BTreeMap::new(),
            }),
            ..EmulatorOptions::default()
        })
        .await
        .expect("emulator starts");
        let client = NeutronClient::new(&kuryr_neutron::ClientOptions::noauth(emu.url())).expect("client");
        let target = Target {
            projects: (0..24).map(|i| (format!("c{i}"), format!("p{i}"))).collect(),
            pod_subnets: Vec::new(),
            pod_subnet_pool: None,
        };
        let round = measure_all(vec![("d".into(), client, target)], Duration::from_secs(3)).await;
        match &round["d"] {
            Outcome::Measured(m) => assert_eq!(m.ports.len(), 24, "{m:?}"),
            Outcome::Failed(why) => panic!("not measured: {why}"),
        }
    }

    #[test]
    fn fraction_is_what_runs_out_first_and_ipv6_never_counts() {
        let m = Measured {
            ports: BTreeMap::from([("p".into(), (45, 50)), ("q".into(), (1, -1))]),
            ipv4: Some((10, 250)),
            subnet_pool: Some((1 << 15, 1 << 16)),
            ..Default::default()
        };
        assert!((m.fraction() - 0.96).abs() < 1e-9, "{}", m.fraction());
        assert_eq!(m.project_fraction("p"), Some(0.9));
        assert_eq!(m.project_fraction("q"), None, "unlimited");
        let fenced = Measured {
            ports: BTreeMap::from([("z".into(), (0, 0))]),
            ..Default::default()
        };
        assert_eq!(
            fenced.project_fraction("z"),
            Some(1.0),
            "a quota of 0 keeps it out"
        );
        assert_eq!(ipv4_size("10.0.0.0/24"), Some(256));
        assert_eq!(ipv4_size("fd00::/64"), None);
        assert_eq!(Measured::default().fraction(), 0.0);
    }

    #[test]
    fn a_failed_round_is_stale_with_the_last_good_figure_and_never_grows() {
        let mut f = Figures::default();
        let good = Measured {
            ipv4: Some((50, 100)),
            ..Default::default()
        };
        let r1 = BTreeMap::from([
            ("a".to_string(), Outcome::Measured(good.clone())),
            ("b".to_string(), Outcome::Failed("timeout".into())),
        ]);
        let out = f.apply(&r1, "t1");
        assert_eq!(out["a"].0, UsageFigure::Fresh(0.5));
        assert_eq!(
            out["b"].0,
            UsageFigure::Stale {
                last: None,
                why: "timeout".into()
            }
        );
        let r2 = BTreeMap::from([("a".to_string(), Outcome::Failed("500".into()))]);
        let out = f.apply(&r2, "t2");
        assert_eq!(
            out["a"].0,
            UsageFigure::Stale {
                last: Some(0.5),
                why: "500".into()
            }
        );
        assert_eq!(
            f.last_good["a"].1, "t1",
            "the age stays the last good measurement's"
        );
    }
}
