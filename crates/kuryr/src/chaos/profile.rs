//! Soak profiles and the fault schedule they give for a seed (pure: the same profile and seed
//! always plan the same faults at the same moments).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

/// Port pool settings of the controllers (`[vif_pool]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSettings {
    pub min: u32,
    pub max: u32,
    pub batch: u32,
    pub update_secs: u64,
}

/// What a soak does.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    /// Churn time; faults are planned within the first `fault_window` of it.
    pub duration: Duration,
    pub fault_window: f64,
    /// Pod operations per second (create, delete, relabel; namespaces, Services and policies
    /// are churned at a tenth of it).
    pub ops_per_sec: f64,
    pub max_pods: usize,
    pub namespaces: usize,
    pub services: usize,
    pub policies: usize,
    /// Fraction of Neutron requests answered 500 while faults run (emulator only).
    pub neutron_5xx: f64,
    /// Short windows (3 s) in which Neutron resets every new connection (emulator only).
    pub neutron_resets: usize,
    pub neutron_outage: Option<Duration>,
    /// The port quota cut to what exists for this long (emulator only).
    pub quota_exhaustion: Option<Duration>,
    pub kube_outage: Option<Duration>,
    pub watch_drops: usize,
    /// Watch history compactions: every resumed watch gets 410 Gone.
    pub gones: usize,
    /// Controller SIGKILLs (a third right after a burst of creates, mid-refill; a third right
    /// after a mass delete, mid-finalize; the rest at random moments).
    pub kills: usize,
    /// Graceful stops of the leader (SIGTERM): the standby takes over.
    pub leader_changes: usize,
    /// CNI daemon SIGKILLs (a random node's), restarted a second later.
    pub daemon_kills: usize,
    pub pool: PoolSettings,
    /// A pod must run within this long after it was created or the faults stopped.
    pub stuck_bound: Duration,
    /// How long the end of a run may take to converge before the final check.
    pub settle: Duration,
}

impl Profile {
    /// A few minutes on the emulators, every kind of fault at least once.
    pub fn ci() -> Self {
        Self {
            name: "ci",
            duration: Duration::from_secs(150),
            fault_window: 0.75,
            ops_per_sec: 4.0,
            max_pods: 60,
            namespaces: 3,
            services: 3,
            policies: 2,
            neutron_5xx: 0.05,
            neutron_resets: 2,
            neutron_outage: Some(Duration::from_secs(30)),
            quota_exhaustion: Some(Duration::from_secs(20)),
            kube_outage: Some(Duration::from_secs(10)),
            watch_drops: 3,
            gones: 2,
            kills: 6,
            leader_changes: 2,
            daemon_kills: 2,
            pool: PoolSettings {
                min: 2,
                max: 10,
                batch: 5,
                update_secs: 5,
            },
            stuck_bound: Duration::from_secs(60),
            settle: Duration::from_secs(90),
        }
    }

    /// Against a real neutron-server: no Neutron fault injection, fewer pods, shorter.
    pub fn server() -> Self {
        Self {
            name: "server",
            duration: Duration::from_secs(75),
            ops_per_sec: 2.0,
            max_pods: 25,
            namespaces: 2,
            services: 0,
            policies: 1,
            neutron_5xx: 0.0,
            neutron_resets: 0,
            neutron_outage: None,
            quota_exhaustion: None,
            kube_outage: Some(Duration::from_secs(8)),
            watch_drops: 2,
            gones: 1,
            kills: 4,
            leader_changes: 1,
            daemon_kills: 1,
            ..Self::ci()
        }
    }

    /// 32 minutes, at least 10,000 pod operations, 5% Neutron 5xx, one 30 s outage, 20 SIGKILLs.
    pub fn long() -> Self {
        Self {
            name: "long",
            duration: Duration::from_secs(32 * 60),
            fault_window: 0.9,
            ops_per_sec: 6.0,
            max_pods: 200,
            namespaces: 6,
            services: 6,
            policies: 4,
            neutron_resets: 6,
            quota_exhaustion: Some(Duration::from_secs(240)),
            kube_outage: Some(Duration::from_secs(20)),
            watch_drops: 12,
            gones: 6,
            kills: 20,
            leader_changes: 6,
            daemon_kills: 6,
            settle: Duration::from_secs(180),
            ..Self::ci()
        }
    }

    /// The same churn without any fault: what the workload alone does to the books.
    pub fn without_faults(self) -> Self {
        Self {
            kube_outage: None,
            watch_drops: 0,
            gones: 0,
            kills: 0,
            leader_changes: 0,
            daemon_kills: 0,
            ..self.without_neutron_faults()
        }
    }

    /// Without Neutron faults (a real server cannot be told to fail).
    pub fn without_neutron_faults(mut self) -> Self {
        self.neutron_5xx = 0.0;
        self.neutron_resets = 0;
        self.neutron_outage = None;
        self.quota_exhaustion = None;
        self
    }
}

/// When a controller is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KillMoment {
    Random,
    /// Right after a burst of creates larger than the pools: refills are in flight.
    MidRefill,
    /// Right after a mass delete: ports are being released and recycled.
    MidFinalize,
    /// While a port create is held in Neutron (the emulator's delay rule): the create lands
    /// after the controller died, its ports known only by their tags.
    MidWrite,
}

/// One planned fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    NeutronOutage(Duration),
    NeutronResets(Duration),
    QuotaExhaustion(Duration),
    KubeOutage(Duration),
    WatchDrop,
    Gone,
    Kill(KillMoment),
    LeaderChange,
    DaemonKill,
}

impl Fault {
    /// How long the fault is in force (0: a single event).
    pub fn length(&self) -> Duration {
        match self {
            Fault::NeutronOutage(d)
            | Fault::NeutronResets(d)
            | Fault::QuotaExhaustion(d)
            | Fault::KubeOutage(d) => *d,
            _ => Duration::ZERO,
        }
    }

    /// The table's name of its kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::NeutronOutage(_) => "neutron outage",
            Fault::NeutronResets(_) => "neutron connection resets",
            Fault::QuotaExhaustion(_) => "port quota exhausted",
            Fault::KubeOutage(_) => "kubernetes API outage",
            Fault::WatchDrop => "watch disconnect",
            Fault::Gone => "watch 410 Gone",
            Fault::Kill(KillMoment::Random) => "controller SIGKILL (random)",
            Fault::Kill(KillMoment::MidRefill) => "controller SIGKILL (mid-refill)",
            Fault::Kill(KillMoment::MidFinalize) => "controller SIGKILL (mid-finalize)",
            Fault::Kill(KillMoment::MidWrite) => "controller SIGKILL (mid-write)",
            Fault::LeaderChange => "leadership change",
            Fault::DaemonKill => "CNI daemon SIGKILL",
        }
    }
}

/// A fault at a moment of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Planned {
    pub at: Duration,
    pub fault: Fault,
}

/// The faults of `profile` for `seed`, in time order. The long faults (outages, resets, quota)
/// never overlap one another, so each one's recovery is measured on its own; the short ones fall
/// anywhere in the fault window.
pub fn schedule(profile: &Profile, seed: u64) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let window = profile.duration.mul_f64(profile.fault_window.clamp(0.0, 1.0));
    // Nothing in the first tenth: the cluster first reaches a steady state.
    let start = profile.duration / 10;
    let mut long: Vec<Fault> = Vec::new();
    long.extend(profile.neutron_outage.map(Fault::NeutronOutage));
    long.extend(profile.quota_exhaustion.map(Fault::QuotaExhaustion));
    long.extend(profile.kube_outage.map(Fault::KubeOutage));
    long.extend((0..profile.neutron_resets).map(|_| Fault::NeutronResets(Duration::from_secs(3))));
    let mut plan = Vec::new();
    // In order, separated by random gaps that share the time the faults leave free.
    if !long.is_empty() && window > start {
        let busy: Duration = long.iter().map(Fault::length).sum();
        let free = (window - start).saturating_sub(busy);
        let weights: Vec<f64> = (0..=long.len()).map(|_| rng.random::<f64>() + 0.01).collect();
        let total: f64 = weights.iter().sum();
        let mut at = start;
        for (fault, w) in long.into_iter().zip(&weights) {
            at += free.mul_f64(w / total);
            plan.push(Planned { at, fault });
            at += fault.length();
        }
    }
    let mut short: Vec<Fault> = Vec::new();
    short.extend((0..profile.watch_drops).map(|_| Fault::WatchDrop));
    short.extend((0..profile.gones).map(|_| Fault::Gone));
    short.extend((0..profile.kills).map(|i| {
        Fault::Kill(match i % 4 {
            0 => KillMoment::MidRefill,
            1 => KillMoment::MidFinalize,
            2 => KillMoment::MidWrite,
            _ => KillMoment::Random,
        })
    }));
    short.extend((0..profile.leader_changes).map(|_| Fault::LeaderChange));
    // Last: the faults above keep their moments for a seed.
    short.extend((0..profile.daemon_kills).map(|_| Fault::DaemonKill));
    for fault in short {
        let at = start + (window.saturating_sub(start)).mul_f64(rng.random::<f64>());
        plan.push(Planned { at, fault });
    }
    plan.sort();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(plan: &[Planned], f: impl Fn(&Fault) -> bool) -> usize {
        plan.iter().filter(|p| f(&p.fault)).count()
    }

    #[test]
    fn the_long_profile_has_what_the_soak_must_show() {
        let p = Profile::long();
        assert!(p.duration >= Duration::from_secs(30 * 60));
        let ops = p.duration.as_secs_f64() * p.ops_per_sec;
        assert!(ops >= 10_000.0, "{ops} pod operations");
        assert!((p.neutron_5xx - 0.05).abs() < f64::EPSILON);
        let plan = schedule(&p, 7);
        assert_eq!(count(&plan, |f| matches!(f, Fault::Kill(_))), 20);
        assert_eq!(
            count(&plan, |f| *f == Fault::NeutronOutage(Duration::from_secs(30))),
            1
        );
    }

    #[test]
    fn every_planned_fault_is_in_the_fault_window_in_order() {
        for p in [Profile::ci(), Profile::server(), Profile::long()] {
            let plan = schedule(&p, 42);
            let window = p.duration.mul_f64(p.fault_window);
            assert!(plan.windows(2).all(|w| w[0].at <= w[1].at), "{}", p.name);
            for f in &plan {
                assert!(f.at >= p.duration / 10, "{} {f:?}", p.name);
                assert!(
                    f.at + f.fault.length() <= window,
                    "{} {f:?} ends after {window:?}",
                    p.name
                );
            }
        }
    }

    #[test]
    fn long_faults_never_overlap() {
        for seed in 0..50 {
            let plan = schedule(&Profile::ci(), seed);
            let long: Vec<&Planned> = plan
                .iter()
                .filter(|p| p.fault.length() > Duration::ZERO)
                .collect();
            assert_eq!(long.len(), 5);
            for w in long.windows(2) {
                assert!(w[0].at + w[0].fault.length() <= w[1].at, "seed {seed}: {w:?}");
            }
        }
    }

    #[test]
    fn the_ci_profile_has_every_kind_of_fault_and_kills_of_every_moment() {
        let plan = schedule(&Profile::ci(), 1);
        let kinds: std::collections::BTreeSet<&str> = plan.iter().map(|p| p.fault.kind()).collect();
        assert_eq!(kinds.len(), 12, "{kinds:?}");
    }

    #[test]
    fn the_same_seed_plans_the_same_faults() {
        assert_eq!(schedule(&Profile::ci(), 3), schedule(&Profile::ci(), 3));
        assert_ne!(schedule(&Profile::ci(), 3), schedule(&Profile::ci(), 4));
    }

    #[test]
    fn the_server_profile_injects_nothing_into_neutron() {
        let plan = schedule(&Profile::server(), 5);
        assert_eq!(
            count(&plan, |f| matches!(
                f,
                Fault::NeutronOutage(_) | Fault::NeutronResets(_) | Fault::QuotaExhaustion(_)
            )),
            0
        );
        assert_eq!(Profile::ci().without_neutron_faults().neutron_5xx, 0.0);
        assert_eq!(schedule(&Profile::ci().without_faults(), 5), vec![]);
    }
}
