//! The soak's invariant checker: a pure function of snapshots of Kubernetes, Neutron and Octavia
//! state (no I/O, time comes from the snapshots), so every rule is unit-tested without servers.
//!
//! A snapshot is read in several API calls while the controller keeps working, so a state that is
//! only momentarily inconsistent (a port created and not yet recorded, a pool status written a
//! moment after the KuryrPort) is normal. Rules about ownership and books therefore fire only when
//! the same inconsistency is seen for longer than a grace period; rules that no interleaving can
//! explain (two pods on one port or IP) fire at once. [`Checker::final_check`] is the strict
//! version for the end of a run, after the workload stopped and the cluster settled.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

/// A pod as the checker needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodView {
    /// `namespace/name`.
    pub key: String,
    pub uid: String,
    /// Scheduled to a node.
    pub scheduled: bool,
    pub deleting: bool,
    /// Running with an IP (the CNI ADD succeeded).
    pub running: bool,
}

/// A KuryrPort: its pod and the Neutron ports of its VIFs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KuryrPortView {
    /// `namespace/name` (the pod's).
    pub key: String,
    pub pod_uid: String,
    pub deleting: bool,
    /// `(port id, IPs)` of every VIF in the status.
    pub vifs: Vec<(String, Vec<String>)>,
}

/// A KuryrPortPool's own books, and what the leader controller says it holds in use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolView {
    pub name: String,
    /// `spec.max`; 0 = unlimited.
    pub max: u32,
    pub available: Vec<String>,
    pub recyclable: Vec<String>,
    /// The port ids the leader's pool manager counts in use (`None`: not read, e.g. no leader).
    pub in_use: Option<Vec<String>>,
}

/// A Neutron pod port carrying this cluster's tag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortView {
    pub id: String,
    /// The pool tag (`kuryr-rs.pool=<name>`), if any.
    pub pool: Option<String>,
    pub ips: Vec<String>,
}

/// An Octavia load balancer carrying this cluster's Service tag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadBalancerView {
    pub id: String,
    /// `namespace/name` of the Service tag.
    pub service: String,
}

/// A Neutron security group made for a NetworkPolicy of this cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityGroupView {
    pub id: String,
    /// The NetworkPolicy uid it was made for.
    pub policy_uid: String,
}

/// Everything the checker looks at, read at one moment (as near as the APIs allow).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Time since the run started.
    pub at: Duration,
    /// A disruptive fault (outage, exhausted quota, no leader) is in force or was within its
    /// settle time: pods may wait without bound.
    pub disrupted: bool,
    /// When the last disruption ended: lasting findings are timed from then at the earliest,
    /// also when no snapshot could be read during it (an API outage).
    pub calm_since: Duration,
    pub pods: Vec<PodView>,
    pub kuryr_ports: Vec<KuryrPortView>,
    pub pools: Vec<PoolView>,
    pub ports: Vec<PortView>,
    /// `namespace/name` of every Service and of every KuryrLoadBalancer (either owns its load balancer).
    pub services: BTreeSet<String>,
    pub load_balancers: Vec<LoadBalancerView>,
    /// uid of every NetworkPolicy (one being deleted still owns its groups until finalized).
    pub policies: BTreeSet<String>,
    pub security_groups: Vec<SecurityGroupView>,
    /// This cluster's address groups, by the policy they were made for.
    pub address_groups: Vec<SecurityGroupView>,
}

/// How long each kind of transient inconsistency may last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// A tagged resource unowned, or a pool's books not matching Neutron and the KuryrPorts.
    pub grace: Duration,
    /// A pool above its max (one pool update period).
    pub over_max: Duration,
    /// A scheduled pod not Running, counted from its creation or the end of the last disruption.
    pub stuck: Duration,
    /// A KuryrPort whose pod is gone.
    pub orphan_kuryrport: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A tagged Neutron port no KuryrPort and no pool owns.
    LeakedPort,
    /// A load balancer of a Service that is gone.
    LeakedLoadBalancer,
    /// A security group of a NetworkPolicy that is gone.
    LeakedSecurityGroup,
    /// An address group of a NetworkPolicy that is gone.
    LeakedAddressGroup,
    /// The cluster did not settle within the profile's settle time (what is left is listed
    /// under its own kinds too).
    Unsettled,
    /// A pool's books differ from Neutron or the KuryrPorts.
    Mismatch,
    /// A pool above `max` for longer than an update period.
    OverMax,
    /// Two pods on one Neutron port, or one port both pooled and in use.
    SharedPort,
    /// Two pods with one IP.
    SharedIp,
    /// A pod not Running within the bound.
    StuckPod,
    /// A KuryrPort of a pod that is gone.
    OrphanKuryrPort,
    /// A node out of step with its pods: a Running pod without its address in its namespace,
    /// or an interface or namespace left after its pod.
    NodeState,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::LeakedPort => "leaked port",
            Kind::LeakedLoadBalancer => "leaked load balancer",
            Kind::LeakedSecurityGroup => "leaked security group",
            Kind::LeakedAddressGroup => "leaked address group",
            Kind::Unsettled => "did not settle",
            Kind::Mismatch => "pool mismatch",
            Kind::OverMax => "pool over max",
            Kind::SharedPort => "shared port",
            Kind::SharedIp => "shared IP",
            Kind::StuckPod => "stuck pod",
            Kind::OrphanKuryrPort => "orphan KuryrPort",
            Kind::NodeState => "node state",
        })
    }
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: Kind,
    /// What it is about (port id, pool name, pod key, ...).
    pub subject: String,
    pub detail: String,
    pub at: Duration,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:>7.1}s] {} {}: {}",
            self.at.as_secs_f64(),
            self.kind,
            self.subject,
            self.detail
        )
    }
}

/// What is wrong in one snapshot, before the grace periods are applied.
#[derive(Debug, Default)]
struct Findings {
    /// (kind, subject) -> detail; these need to persist for their grace period.
    lasting: BTreeMap<(Kind, String), String>,
    /// Wrong at once, whatever the timing.
    immediate: Vec<(Kind, String, String)>,
}

/// Runs the rules over a stream of snapshots, keeping when each finding was first seen.
#[derive(Debug)]
pub struct Checker {
    bounds: Bounds,
    first_seen: HashMap<(Kind, String), Duration>,
    /// Findings already reported, so a lasting problem counts once.
    reported: BTreeSet<(Kind, String)>,
    pod_since: HashMap<String, Duration>,
    /// End of the last disruption.
    quiet_since: Option<Duration>,
    was_disrupted: bool,
    /// Pods waiting when the last disruption ended -> that moment.
    recovering: HashMap<String, Duration>,
    worst_recovery: Duration,
    pub snapshots: u64,
}

impl Checker {
    pub fn new(bounds: Bounds) -> Self {
        Self {
            bounds,
            first_seen: HashMap::new(),
            reported: BTreeSet::new(),
            pod_since: HashMap::new(),
            quiet_since: Some(Duration::ZERO),
            was_disrupted: false,
            recovering: HashMap::new(),
            worst_recovery: Duration::ZERO,
            snapshots: 0,
        }
    }

    /// The longest a pod waiting when a disruption ended took to run (or be deleted).
    pub fn worst_recovery(&self) -> Duration {
        self.worst_recovery
    }

    /// How many violations were reported so far.
    pub fn reported(&self) -> usize {
        self.reported.len()
    }

    /// Whether `snap` is a settled cluster: no finding of any age, no pod waiting, nothing
    /// being deleted. Records nothing.
    pub fn converged(&self, snap: &Snapshot) -> bool {
        let f = findings(snap);
        f.lasting.is_empty()
            && f.immediate.is_empty()
            && snap
                .pods
                .iter()
                .all(|p| !p.deleting && (p.running || !p.scheduled))
            && snap.kuryr_ports.iter().all(|kp| !kp.deleting)
    }

    /// Feeds one snapshot; returns the violations first established by it.
    pub fn observe(&mut self, snap: &Snapshot) -> Vec<Violation> {
        self.snapshots += 1;
        self.track_disruption(snap);
        let findings = findings(snap);
        let mut out = Vec::new();
        for (kind, subject, detail) in findings.immediate {
            self.report(&mut out, kind, subject, detail, snap.at);
        }
        self.first_seen
            .retain(|key, _| findings.lasting.contains_key(key));
        for ((kind, subject), detail) in findings.lasting {
            let key = (kind, subject);
            // A disruption stops the controller from repairing anything: the grace starts after it.
            if snap.disrupted {
                self.first_seen.insert(key.clone(), snap.at);
            }
            let since = (*self.first_seen.entry(key.clone()).or_insert(snap.at)).max(snap.calm_since);
            let allowed = match kind {
                Kind::OverMax => self.bounds.over_max,
                Kind::OrphanKuryrPort => self.bounds.orphan_kuryrport,
                _ => self.bounds.grace,
            };
            if snap.at.saturating_sub(since) > allowed {
                let detail = format!(
                    "{detail} (for {:.1}s)",
                    snap.at.saturating_sub(since).as_secs_f64()
                );
                self.report(&mut out, key.0, key.1, detail, snap.at);
            }
        }
        for (uid, key, waited) in self.stuck(snap) {
            let detail = format!(
                "not Running {:.1}s after it was created or the faults stopped",
                waited.as_secs_f64()
            );
            self.report(
                &mut out,
                Kind::StuckPod,
                format!("{key} ({uid})"),
                detail,
                snap.at,
            );
        }
        out
    }

    /// The end of a run: every finding is a violation, whatever its age, and every pod that
    /// still exists must run.
    pub fn final_check(&mut self, snap: &Snapshot) -> Vec<Violation> {
        self.snapshots += 1;
        self.track_disruption(snap);
        let findings = findings(snap);
        let mut out = Vec::new();
        for (kind, subject, detail) in findings.immediate {
            self.report(&mut out, kind, subject, detail, snap.at);
        }
        for ((kind, subject), detail) in findings.lasting {
            self.report(&mut out, kind, subject, format!("{detail} (at the end)"), snap.at);
        }
        for pod in snap
            .pods
            .iter()
            .filter(|p| p.scheduled && !p.deleting && !p.running)
        {
            self.report(
                &mut out,
                Kind::StuckPod,
                format!("{} ({})", pod.key, pod.uid),
                "not Running at the end".into(),
                snap.at,
            );
        }
        out
    }

    /// After every soak object was deleted and the cluster had its settle time: whatever of
    /// them is left is a leak, also when something still claims it (a Service, a NetworkPolicy
    /// or a KuryrPort stuck on its finalizer owns its load balancer, groups or ports, and the
    /// ownership rules would excuse them). Only pool ports may stay. `settled`: whether the
    /// settle ended by itself.
    pub fn emptied_check(&mut self, snap: &Snapshot, settled: bool) -> Vec<Violation> {
        let mut out = self.final_check(snap);
        if !settled {
            self.report(
                &mut out,
                Kind::Unsettled,
                "the soak namespaces' deletion".into(),
                "objects were still left when the settle time ran out".into(),
                snap.at,
            );
        }
        let mut left: Vec<(Kind, String, String)> = Vec::new();
        for pod in &snap.pods {
            left.push((
                Kind::StuckPod,
                format!("{} ({})", pod.key, pod.uid),
                "left after its namespace's deletion".into(),
            ));
        }
        for kp in &snap.kuryr_ports {
            left.push((
                Kind::OrphanKuryrPort,
                format!("{} ({})", kp.key, kp.pod_uid),
                "left after its namespace's deletion".into(),
            ));
        }
        for lb in &snap.load_balancers {
            left.push((
                Kind::LeakedLoadBalancer,
                lb.id.clone(),
                format!(
                    "of Service {}, left after every soak object was deleted",
                    lb.service
                ),
            ));
        }
        for (kind, groups) in [
            (Kind::LeakedSecurityGroup, &snap.security_groups),
            (Kind::LeakedAddressGroup, &snap.address_groups),
        ] {
            for g in groups {
                left.push((
                    kind,
                    g.id.clone(),
                    format!(
                        "of NetworkPolicy {}, left after every soak object was deleted",
                        g.policy_uid
                    ),
                ));
            }
        }
        for port in snap.ports.iter().filter(|p| p.pool.is_none()) {
            left.push((
                Kind::LeakedPort,
                port.id.clone(),
                "a pod port left after every pod was deleted".into(),
            ));
        }
        for (kind, subject, detail) in left {
            self.report(&mut out, kind, subject, detail, snap.at);
        }
        out
    }

    fn report(
        &mut self,
        out: &mut Vec<Violation>,
        kind: Kind,
        subject: String,
        detail: String,
        at: Duration,
    ) {
        if self.reported.insert((kind, subject.clone())) {
            out.push(Violation {
                kind,
                subject,
                detail,
                at,
            });
        }
    }

    fn track_disruption(&mut self, snap: &Snapshot) {
        let waiting: Vec<&PodView> = snap
            .pods
            .iter()
            .filter(|p| p.scheduled && !p.deleting && !p.running)
            .collect();
        if snap.disrupted {
            self.quiet_since = None;
        } else if self.was_disrupted || self.quiet_since.is_none() {
            self.quiet_since = Some(snap.at);
            for p in &waiting {
                self.recovering.insert(p.uid.clone(), snap.at);
            }
        }
        self.was_disrupted = snap.disrupted;
        let still: BTreeSet<&str> = waiting.iter().map(|p| p.uid.as_str()).collect();
        let mut worst = self.worst_recovery;
        self.recovering.retain(|uid, since| {
            if still.contains(uid.as_str()) {
                return true;
            }
            worst = worst.max(snap.at.saturating_sub(*since));
            false
        });
        self.worst_recovery = worst;
        let live: BTreeSet<&str> = snap.pods.iter().map(|p| p.uid.as_str()).collect();
        self.pod_since.retain(|uid, _| live.contains(uid.as_str()));
        for p in &snap.pods {
            self.pod_since.entry(p.uid.clone()).or_insert(snap.at);
        }
    }

    /// Pods waiting longer than the bound since they appeared or the faults stopped.
    fn stuck(&self, snap: &Snapshot) -> Vec<(String, String, Duration)> {
        let Some(quiet) = self.quiet_since else {
            return Vec::new();
        };
        snap.pods
            .iter()
            .filter(|p| p.scheduled && !p.deleting && !p.running)
            .filter_map(|p| {
                let since = self.pod_since.get(&p.uid).copied().unwrap_or(snap.at).max(quiet);
                let waited = snap.at.saturating_sub(since);
                (waited > self.bounds.stuck).then(|| (p.uid.clone(), p.key.clone(), waited))
            })
            .collect()
    }
}

/// Every rule over one snapshot.
fn findings(snap: &Snapshot) -> Findings {
    let mut f = Findings::default();
    ports_and_pools(snap, &mut f);
    shared(snap, &mut f);
    orphan_kuryrports(snap, &mut f);
    services_and_policies(snap, &mut f);
    f
}

/// Ownership of every tagged port, and each pool's books against Neutron and the KuryrPorts.
fn ports_and_pools(snap: &Snapshot, f: &mut Findings) {
    let neutron: BTreeMap<&str, &PortView> = snap.ports.iter().map(|p| (p.id.as_str(), p)).collect();
    let in_kuryrports: BTreeSet<&str> = snap
        .kuryr_ports
        .iter()
        .flat_map(|kp| kp.vifs.iter().map(|(id, _)| id.as_str()))
        .collect();
    // A KuryrPort being deleted may list a port its finalizer already gave back to its pool.
    let in_live_kuryrports: BTreeSet<&str> = snap
        .kuryr_ports
        .iter()
        .filter(|kp| !kp.deleting)
        .flat_map(|kp| kp.vifs.iter().map(|(id, _)| id.as_str()))
        .collect();
    let mut pooled: BTreeMap<&str, &str> = BTreeMap::new();
    for pool in &snap.pools {
        for id in pool.available.iter().chain(&pool.recyclable) {
            if let Some(other) = pooled.insert(id.as_str(), pool.name.as_str())
                && other != pool.name
            {
                f.immediate.push((
                    Kind::SharedPort,
                    id.clone(),
                    format!("listed by pools {other} and {}", pool.name),
                ));
            }
        }
    }
    for port in &snap.ports {
        let id = port.id.as_str();
        if !in_kuryrports.contains(id) && !pooled.contains_key(id) {
            let tag = port
                .pool
                .as_deref()
                .map_or(String::new(), |p| format!(" (pool tag {p})"));
            f.lasting.insert(
                (Kind::LeakedPort, port.id.clone()),
                format!("tagged port owned by no KuryrPort and no pool{tag}"),
            );
        }
        if in_live_kuryrports.contains(id)
            && let Some(pool) = pooled.get(id)
        {
            f.lasting.insert(
                (Kind::SharedPort, port.id.clone()),
                format!("in a KuryrPort and still listed by pool {pool}"),
            );
        }
    }
    for pool in &snap.pools {
        let books: BTreeSet<&str> = pool
            .available
            .iter()
            .chain(&pool.recyclable)
            .map(String::as_str)
            .collect();
        let tagged: BTreeSet<&str> = snap
            .ports
            .iter()
            .filter(|p| p.pool.as_deref() == Some(pool.name.as_str()))
            .map(|p| p.id.as_str())
            .collect();
        let used: BTreeSet<&str> = tagged
            .iter()
            .copied()
            .filter(|id| in_kuryrports.contains(id) && !books.contains(id))
            .collect();
        let missing: Vec<&str> = books
            .iter()
            .copied()
            .filter(|id| !neutron.contains_key(id))
            .collect();
        if !missing.is_empty() {
            f.lasting.insert(
                (Kind::Mismatch, format!("{}/not-in-neutron", pool.name)),
                format!(
                    "{} pooled ports do not exist in Neutron: {}",
                    missing.len(),
                    short(&missing)
                ),
            );
        }
        if let Some(in_use) = &pool.in_use {
            let reported: BTreeSet<&str> = in_use.iter().map(String::as_str).collect();
            if reported != used {
                // Why each counted port is not among the KuryrPorts' ones for this pool: the
                // message must tell a lost release from a port tagged for another pool.
                let explained: Vec<String> = reported
                    .difference(&used)
                    .map(|id| {
                        let tag = match neutron.get(id) {
                            None => "not in Neutron".to_string(),
                            Some(p) => format!("pool tag {}", p.pool.as_deref().unwrap_or("none")),
                        };
                        let holders: Vec<String> = snap
                            .kuryr_ports
                            .iter()
                            .filter(|kp| kp.vifs.iter().any(|(v, _)| v == id))
                            .map(|kp| format!("{}{}", kp.key, if kp.deleting { " (deleting)" } else { "" }))
                            .collect();
                        let held = if holders.is_empty() {
                            "in no KuryrPort".to_string()
                        } else {
                            format!("in KuryrPort {}", holders.join(", "))
                        };
                        format!("{id} [{tag}; {held}]")
                    })
                    .collect();
                let extra: Vec<&str> = explained.iter().map(String::as_str).collect();
                let lacking: Vec<&str> = used.difference(&reported).copied().collect();
                f.lasting.insert(
                    (Kind::Mismatch, format!("{}/in-use", pool.name)),
                    format!(
                        "the pool counts {} in use, KuryrPorts hold {} of its ports (counted but not among them: {}; in a KuryrPort but not counted: {})",
                        reported.len(),
                        used.len(),
                        short(&extra),
                        short(&lacking)
                    ),
                );
            }
        }
        let pooled_now = pool.available.len() + pool.recyclable.len();
        if pool.max > 0 && pooled_now > pool.max as usize {
            f.lasting.insert(
                (Kind::OverMax, pool.name.clone()),
                format!(
                    "{} available + {} recyclable > max {}",
                    pool.available.len(),
                    pool.recyclable.len(),
                    pool.max
                ),
            );
        }
    }
}

/// No two live pods on one port or one IP. A KuryrPort being deleted still lists ports its
/// finalizer has already given back (and the pool may have handed on): it holds nothing, but is
/// named in the finding when live ones collide.
fn shared(snap: &Snapshot, f: &mut Findings) {
    let mut by_port: BTreeMap<&str, Vec<&KuryrPortView>> = BTreeMap::new();
    let mut by_ip: BTreeMap<&str, Vec<&KuryrPortView>> = BTreeMap::new();
    for kp in &snap.kuryr_ports {
        for (port, ips) in &kp.vifs {
            by_port.entry(port).or_default().push(kp);
            for ip in ips {
                by_ip.entry(ip).or_default().push(kp);
            }
        }
    }
    let collisions = |m: BTreeMap<&str, Vec<&KuryrPortView>>| {
        m.into_iter()
            .filter(|(_, h)| h.iter().filter(|kp| !kp.deleting).count() > 1)
            .map(|(what, holders)| {
                let names: Vec<String> = holders
                    .iter()
                    .map(|kp| {
                        let state = if kp.deleting { " (being deleted)" } else { "" };
                        format!("{}{state}", kp.key)
                    })
                    .collect();
                (
                    what.to_string(),
                    format!("in the KuryrPorts of {}", names.join(", ")),
                )
            })
            .collect::<Vec<_>>()
    };
    for (port, detail) in collisions(by_port) {
        f.immediate.push((Kind::SharedPort, port, detail));
    }
    for (ip, detail) in collisions(by_ip) {
        f.immediate.push((Kind::SharedIp, ip, detail));
    }
    // Neutron never gives one address twice; two ports with one IP means a stale record.
    let mut neutron_ips: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for p in &snap.ports {
        for ip in &p.ips {
            neutron_ips.entry(ip).or_default().push(&p.id);
        }
    }
    for (ip, ports) in neutron_ips.into_iter().filter(|(_, p)| p.len() > 1) {
        f.immediate.push((
            Kind::SharedIp,
            ip.to_string(),
            format!("on Neutron ports {}", ports.join(", ")),
        ));
    }
}

/// A KuryrPort lives exactly as long as its pod (same uid).
fn orphan_kuryrports(snap: &Snapshot, f: &mut Findings) {
    let pods: BTreeSet<(&str, &str)> = snap
        .pods
        .iter()
        .map(|p| (p.key.as_str(), p.uid.as_str()))
        .collect();
    for kp in &snap.kuryr_ports {
        if !pods.contains(&(kp.key.as_str(), kp.pod_uid.as_str())) {
            f.lasting.insert(
                (Kind::OrphanKuryrPort, format!("{} ({})", kp.key, kp.pod_uid)),
                "its pod is gone".into(),
            );
        }
    }
}

fn services_and_policies(snap: &Snapshot, f: &mut Findings) {
    for lb in &snap.load_balancers {
        if !snap.services.contains(&lb.service) {
            f.lasting.insert(
                (Kind::LeakedLoadBalancer, lb.id.clone()),
                format!("Service {} is gone", lb.service),
            );
        }
    }
    for (kind, groups) in [
        (Kind::LeakedSecurityGroup, &snap.security_groups),
        (Kind::LeakedAddressGroup, &snap.address_groups),
    ] {
        for g in groups.iter().filter(|g| !snap.policies.contains(&g.policy_uid)) {
            f.lasting.insert(
                (kind, g.id.clone()),
                format!("NetworkPolicy {} is gone", g.policy_uid),
            );
        }
    }
}

/// Every soak object gone and everything made for them with it: no pod, KuryrPort, load
/// balancer, policy group or pod port (pool ports may stay).
pub fn emptied(snap: &Snapshot) -> bool {
    snap.pods.is_empty()
        && snap.kuryr_ports.is_empty()
        && snap.load_balancers.is_empty()
        && snap.security_groups.is_empty()
        && snap.address_groups.is_empty()
        && snap.ports.iter().all(|p| p.pool.is_some())
}

/// The first few ids of a list, for a one-line detail.
fn short(ids: &[&str]) -> String {
    const SHOWN: usize = 4;
    if ids.is_empty() {
        return "none".into();
    }
    let mut s = ids.iter().take(SHOWN).copied().collect::<Vec<_>>().join(", ");
    if ids.len() > SHOWN {
        s.push_str(&format!(" and {} more", ids.len() - SHOWN));
    }
    s
}

#[cfg(test)]
mod tests;
