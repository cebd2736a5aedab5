use std::collections::BTreeMap;
use std::num::NonZeroU32;

use kuryr_config::{BindingFilter, BindingWeigher};

use super::*;
use crate::placement::Group;
use crate::placement::store::MemoryStore;

/// Six deployments in two groups: pod1-3 general purpose (`resource=general`) in az1, pod4-6
/// "CAD modeling" (`resource=cad`) in az2, in declaration order.
fn six_in_two_groups() -> Vec<Candidate> {
    (1..=6)
        .map(|i| Candidate {
            name: format!("pod{i}"),
            order: i,
            availability_zone: Some(if i <= 3 { "az1" } else { "az2" }.into()),
            resource_affinity: BTreeMap::from([(
                "resource".into(),
                if i <= 3 { "general" } else { "cad" }.into(),
            )]),
            maintenance: false,
            move_existing: false,
            threshold: 0.9,
            hysteresis: 0.05,
            usage: UsageFigure::Unmeasured,
            project_usage: ProjectUsage::default(),
            pending: 0.0,
            project_ids: BTreeMap::new(),
        })
        .collect()
}

fn all_filters() -> Vec<BindingFilter> {
    vec![
        BindingFilter::All,
        BindingFilter::AvailabilityZone,
        BindingFilter::ResourceAffinity,
        BindingFilter::UsageThreshold,
    ]
}

fn sched(filters: &[BindingFilter], weighers: &[BindingWeigher]) -> Scheduler {
    Scheduler::new(&PodBindingSection {
        enabled: true,
        filters: filters.to_vec(),
        weighers: weighers.to_vec(),
        subset_size: NonZeroU32::MIN,
        ..PodBindingSection::default()
    })
}

fn req(project: &str, affinity: &str) -> BindingRequest {
    BindingKey {
        project: project.into(),
        group: Group {
            availability_zone: None,
            resource_affinity: BTreeMap::from([("resource".into(), affinity.into())]),
        },
    }
}

fn cur(d: &str) -> Current {
    Current {
        deployment: d.into(),
        pinned: false,
    }
}

fn to(d: &Decision) -> Option<&str> {
    match d {
        Decision::Bind { to, .. } => Some(to),
        Decision::Stay { deployment, .. } => Some(deployment),
        Decision::NoneFits { .. } => None,
    }
}

#[test]
fn one_tenant_binds_in_both_groups_at_once() {
    let s = sched(&all_filters(), &[BindingWeigher::CreationOrder]);
    let c = six_in_two_groups();
    assert_eq!(to(&s.decide(&c, &req("t1", "general"), None)), Some("pod1"));
    assert_eq!(to(&s.decide(&c, &req("t1", "cad"), None)), Some("pod4"));
}

#[test]
fn a_binding_stays_until_its_deployment_is_full_in_maintenance_with_move_or_removed() {
    let s = sched(&all_filters(), &[BindingWeigher::CreationOrder]);
    let mut c = six_in_two_groups();
    let r = req("t1", "general");
    // A better-scoring deployment appearing never moves a binding.
    assert_eq!(
        s.decide(&c, &r, Some(&cur("pod2"))),
        Decision::Stay {
            deployment: "pod2".into(),
            stuck: None
        }
    );
    // Maintenance without move_existing: stays, but gets no new binding.
    c[1].maintenance = true;
    assert_eq!(to(&s.decide(&c, &r, Some(&cur("pod2")))), Some("pod2"));
    assert_eq!(
        to(&s.decide(&c, &req("t2", "general"), Some(&cur("pod1")))),
        Some("pod1")
    );
    let mut fresh = c.clone();
    fresh[0].maintenance = true;
    assert_eq!(to(&s.decide(&fresh, &req("t3", "general"), None)), Some("pod3"));
    // With move_existing it moves, and the history row says why.
    c[1].move_existing = true;
    match s.decide(&c, &r, Some(&cur("pod2"))) {
        Decision::Bind { to, from, why } => {
            assert_eq!((to.as_str(), from.as_deref()), ("pod1", Some("pod2")));
            assert!(why.contains("maintenance"), "{why}");
        }
        d => panic!("{d:?}"),
    }
    // Pinned by an operator: stays even then.
    let pinned = Current {
        deployment: "pod2".into(),
        pinned: true,
    };
    assert_eq!(to(&s.decide(&c, &r, Some(&pinned))), Some("pod2"));
    // A deployment removed from the configuration: even a pinned binding leaves.
    c.remove(1);
    match s.decide(&c, &r, Some(&pinned)) {
        Decision::Bind { to, why, .. } => {
            assert_eq!(to, "pod1");
            assert!(why.contains("no longer configured"), "{why}");
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn usage_threshold_with_hysteresis_never_flaps() {
    let s = sched(&all_filters(), &[BindingWeigher::CreationOrder]);
    let mut c = six_in_two_groups();
    let r = req("t1", "general");
    c[0].usage = UsageFigure::Fresh(0.89);
    assert_eq!(
        to(&s.decide(&c, &r, Some(&cur("pod1")))),
        Some("pod1"),
        "below its threshold"
    );
    c[0].usage = UsageFigure::Fresh(0.9);
    match s.decide(&c, &r, Some(&cur("pod1"))) {
        Decision::Bind { to, why, .. } => {
            assert_eq!(to, "pod2");
            assert!(why.contains("threshold"), "{why}");
        }
        d => panic!("{d:?}"),
    }
    // Back just under the threshold: not yet eligible for new bindings (needs < 0.85)...
    c[0].usage = UsageFigure::Fresh(0.87);
    assert_eq!(to(&s.decide(&c, &r, Some(&cur("pod2")))), Some("pod2"));
    assert_eq!(to(&s.decide(&c, &req("t2", "general"), None)), Some("pod2"));
    // ...and once it is, bound projects still stay where they are.
    c[0].usage = UsageFigure::Fresh(0.5);
    assert_eq!(to(&s.decide(&c, &req("t2", "general"), None)), Some("pod1"));
    assert_eq!(to(&s.decide(&c, &r, Some(&cur("pod2")))), Some("pod2"));
    // A project's own port quota counts as well as the deployment figure.
    c[0].project_usage.fractions.insert("t3".into(), 0.95);
    assert_eq!(to(&s.decide(&c, &req("t3", "general"), None)), Some("pod2"));
    assert_eq!(to(&s.decide(&c, &req("t4", "general"), None)), Some("pod1"));
}

/// A port quota carried over from an earlier round (the last round could not list the bindings)
/// keeps new bindings out but moves no bound project: it may be long out of date.
#[test]
fn a_carried_port_quota_keeps_new_bindings_out_and_moves_nobody() {
    let s = sched(&all_filters(), &[BindingWeigher::CreationOrder]);
    let mut c = six_in_two_groups();
    c[0].usage = UsageFigure::Fresh(0.5);
    c[0].project_usage.fractions.insert("t1".into(), 0.95);
    let r = req("t1", "general");
    assert_eq!(
        to(&s.decide(&c, &r, Some(&cur("pod1")))),
        Some("pod2"),
        "measured: full"
    );
    c[0].project_usage.carried = true;
    assert_eq!(
        to(&s.decide(&c, &r, Some(&cur("pod1")))),
        Some("pod1"),
        "carried: stays"
    );
    assert_eq!(
        to(&s.decide(&c, &r, None)),
        Some("pod2"),
        "carried: still full for a new binding"
    );
    assert_eq!(to(&s.decide(&c, &req("t2", "general"), None)), Some("pod1"));
}

#[test]
fn stale_figures_keep_bindings_but_take_no_new_ones_and_unmeasured_pass() {
    let s = sched(&all_filters(), &[BindingWeigher::CreationOrder]);
    let mut c = six_in_two_groups();
    c[0].usage = UsageFigure::Stale {
        last: Some(0.95),
        why: "timeout".into(),
    };
    let r = req("t1", "general");
    assert_eq!(to(&s.decide(&c, &r, Some(&cur("pod1")))), Some("pod1"));
    assert_eq!(to(&s.decide(&c, &r, None)), Some("pod2"));
}

#[test]
fn none_fits_lists_what_each_filter_removed() {
    let s = sched(&all_filters(), &[BindingWeigher::CreationOrder]);
    let mut c = six_in_two_groups();
    c[0].maintenance = true;
    c[1].usage = UsageFigure::Fresh(0.99);
    c[2].usage = UsageFigure::Stale {
        last: None,
        why: "HTTP 500".into(),
    };
    match s.decide(&c, &req("t1", "general"), None) {
        Decision::NoneFits { from, eliminations } => {
            assert_eq!(from, None);
            let by: BTreeMap<&str, Vec<&str>> = eliminations
                .iter()
                .map(|e| (e.filter, e.removed.iter().map(|(n, _)| n.as_str()).collect()))
                .collect();
            assert_eq!(by["all"], ["pod1"]);
            assert_eq!(by["availability_zone"], Vec::<&str>::new());
            assert_eq!(by["resource_affinity"], ["pod4", "pod5", "pod6"]);
            assert_eq!(by["usage_threshold"], ["pod2", "pod3"]);
            let text: Vec<String> = eliminations.iter().map(ToString::to_string).collect();
            assert!(
                text[3].contains("pod3 (usage figure is stale (HTTP 500))"),
                "{text:?}"
            );
        }
        d => panic!("{d:?}"),
    }
    // A binding that should leave but has nowhere to go stays, saying why.
    c[1].usage = UsageFigure::Fresh(0.95);
    match s.decide(&c, &req("t1", "general"), Some(&cur("pod2"))) {
        Decision::Stay {
            deployment,
            stuck: Some((why, _)),
        } => {
            assert_eq!(deployment, "pod2");
            assert!(why.contains("threshold"), "{why}");
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn every_weigher_counts_and_multipliers_may_be_negative() {
    let mut conf = PodBindingSection {
        enabled: true,
        filters: vec![BindingFilter::All],
        weighers: vec![BindingWeigher::CreationOrder, BindingWeigher::IdleCapacity],
        weigher_multipliers: BTreeMap::from([(BindingWeigher::IdleCapacity, 2.0)]),
        ..PodBindingSection::default()
    };
    let mut c = six_in_two_groups();
    c.truncate(2);
    c[0].usage = UsageFigure::Fresh(0.7);
    c[1].usage = UsageFigure::Fresh(0.1);
    let r = BindingKey::default();
    assert_eq!(to(&Scheduler::new(&conf).decide(&c, &r, None)), Some("pod2"));
    conf.weigher_multipliers = BTreeMap::from([(BindingWeigher::IdleCapacity, -2.0)]);
    assert_eq!(to(&Scheduler::new(&conf).decide(&c, &r, None)), Some("pod1"));
}

/// The default filters (`all` only) still honour what a namespace asks for: a zone or an
/// affinity request is never placed elsewhere (and a bound one leaves a deployment that no longer
/// matches), while a request that asks for neither goes anywhere.
#[test]
fn zone_and_affinity_requests_hold_with_the_default_filters() {
    let s = sched(&[BindingFilter::All], &[BindingWeigher::CreationOrder]);
    let c = six_in_two_groups();
    let mut zone = BindingKey::default();
    zone.group.availability_zone = Some("az2".into());
    assert_eq!(to(&s.decide(&c, &zone, None)), Some("pod4"));
    assert_eq!(to(&s.decide(&c, &req("p", "cad"), None)), Some("pod4"));
    assert_eq!(to(&s.decide(&c, &zone, Some(&cur("pod1")))), Some("pod4"));
    assert_eq!(to(&s.decide(&c, &BindingKey::default(), None)), Some("pod1"));
    zone.group.availability_zone = Some("az9".into());
    assert!(matches!(s.decide(&c, &zone, None), Decision::NoneFits { .. }));
}

fn binder(c: Vec<Candidate>) -> (Binder, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::default());
    (
        Binder::new(
            sched(&all_filters(), &[BindingWeigher::CreationOrder]),
            c,
            store.clone(),
        ),
        store,
    )
}

#[tokio::test]
async fn two_namespaces_of_one_project_in_different_zones_never_flap() {
    let (b, store) = binder(six_in_two_groups());
    let zone = |z: &str| BindingKey {
        project: "t1".into(),
        group: Group {
            availability_zone: Some(z.into()),
            resource_affinity: BTreeMap::new(),
        },
    };
    let (a1, a2) = (zone("az1"), zone("az2"));
    assert_eq!(
        b.bind(&a1).await.map(|p| p.deployment).ok().as_deref(),
        Some("pod1")
    );
    assert_eq!(
        b.bind(&a2).await.map(|p| p.deployment).ok().as_deref(),
        Some("pod4")
    );
    let before = store.list().await.ok();
    for _ in 0..10 {
        // The cache is emptied as a usage round would: every resync re-reads the store.
        b.forget().await;
        for k in [&a1, &a2] {
            let p = b.bind(k).await.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(p.rebound, None);
        }
    }
    assert_eq!(store.list().await.ok(), before, "history unchanged");
    assert_eq!(before.map(|l| l.len()), Some(2));
}

#[tokio::test]
async fn rebinding_keeps_history_maps_project_ids_and_grows_only_fresh_figures() {
    let mut c = six_in_two_groups();
    c[1].project_ids.insert("t1".into(), "t1-in-pod2".into());
    c[1].usage = UsageFigure::Fresh(0.2);
    let (b, store) = binder(c);
    let r = req("t1", "general");
    let p = b.bind(&r).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((p.deployment.as_str(), p.project_id.as_str()), ("pod1", "t1"));
    assert_eq!(p.rebound, Some((None, "new binding".to_string())));
    let mut c = b.candidates().await;
    c[0].maintenance = true;
    c[0].move_existing = true;
    b.set_candidates(c).await;
    let p = b.bind(&r).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (p.deployment.as_str(), p.project_id.as_str()),
        ("pod2", "t1-in-pod2")
    );
    let c = b.candidates().await;
    assert_eq!(
        c[1].usage,
        UsageFigure::Fresh(0.2),
        "the measured figure as measured"
    );
    assert_eq!(c[1].pending, VIRTUAL_CONSUMPTION);
    assert_eq!(
        c[1].admission_usage_for("t2"),
        UsageFigure::Fresh(0.2 + VIRTUAL_CONSUMPTION)
    );
    assert_eq!(
        (&c[0].usage, c[0].pending),
        (&UsageFigure::Unmeasured, 0.0),
        "an unmeasured figure never grows"
    );
    let st = store
        .get(&r)
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no binding"));
    let rows: Vec<(&str, bool)> = st
        .history
        .iter()
        .map(|h| (h.deployment.as_str(), h.end.is_some()))
        .collect();
    assert_eq!(rows, [("pod1", true), ("pod2", false)]);
    assert!(st.history[1].why.contains("maintenance"), "{:?}", st.history);
    // An operator pin keeps it even when pod2 goes into maintenance too.
    store.set_pinned(&r, true).await.unwrap_or_else(|e| panic!("{e}"));
    let mut c = b.candidates().await;
    c[1].maintenance = true;
    c[1].move_existing = true;
    b.set_candidates(c).await;
    assert_eq!(
        b.bind(&r).await.map(|p| p.deployment).ok().as_deref(),
        Some("pod2")
    );
}

#[tokio::test]
async fn no_deployment_passes_is_a_retried_user_visible_error_naming_the_filters() {
    let mut c = six_in_two_groups();
    for x in &mut c {
        x.maintenance = true;
    }
    let (b, _) = binder(c);
    let e = b.bind(&req("t1", "cad")).await.expect_err("none passes");
    assert!(e.is_retryable() && e.is_user_visible(), "{e:?}");
    assert_eq!(e.label(), "NoDeploymentPasses");
    assert!(e.to_string().contains("all removed pod1 (in maintenance)"), "{e}");
}

#[test]
fn history_is_bounded() {
    let mut st = crate::placement::store::BindingState {
        key: BindingKey::default(),
        pinned: false,
        history: vec![],
    };
    for i in 0..(crate::placement::store::MAX_HISTORY + 5) {
        st.rebind(&format!("d{i}"), "x", "t");
    }
    assert_eq!(st.history.len(), crate::placement::store::MAX_HISTORY);
    assert_eq!(
        st.current().as_deref(),
        Some(format!("d{}", crate::placement::store::MAX_HISTORY + 4).as_str())
    );
    assert_eq!(st.history.iter().filter(|h| h.end.is_none()).count(), 1);
}

#[test]
fn subset_size_spreads_new_bindings_over_the_best_n_only() {
    let s = Scheduler::new(&PodBindingSection {
        enabled: true,
        filters: all_filters(),
        weighers: vec![BindingWeigher::CreationOrder],
        subset_size: NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN),
        ..PodBindingSection::default()
    });
    let c = six_in_two_groups();
    let mut picked = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..200 {
        let d = s.decide(&c, &req(&format!("t{i}"), "general"), None);
        *picked.entry(to(&d).unwrap_or("none").to_string()).or_default() += 1;
    }
    // pod1 and pod2 are the two best general deployments by creation order; pod3 never wins.
    assert_eq!(
        picked.keys().map(String::as_str).collect::<Vec<_>>(),
        ["pod1", "pod2"],
        "{picked:?}"
    );
    // Random among the two: each well away from never (200 draws, p(<40) is negligible).
    assert!(picked.values().all(|n| *n >= 40), "{picked:?}");
}

/// A project id asked for before the deployment objects are loaded waits for them, and is
/// not-ready (retried) when they do not come: kuryr.conf's id may not be the one the operator
/// mapped on the object, and a network made in the wrong project is one nobody cleans up.
#[tokio::test(start_paused = true)]
async fn a_project_id_waits_for_the_deployment_objects_and_never_guesses() {
    let mut conf = six_in_two_groups();
    conf[1].project_ids.insert("p1".into(), "conf-id".into());
    let b = Arc::new(Binder::awaiting_objects(
        sched(&all_filters(), &[BindingWeigher::CreationOrder]),
        conf,
        Arc::new(MemoryStore::default()),
    ));
    let e = b
        .project_id("pod2", "p1")
        .await
        .expect_err("objects never loaded");
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("pod2"), "{e}");
    let asked = tokio::spawn({
        let b = b.clone();
        async move { b.project_id("pod2", "p1").await }
    });
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let mut objects = six_in_two_groups();
    objects[1].project_ids.insert("p1".into(), "object-id".into());
    b.set_candidates(objects).await;
    assert_eq!(asked.await.expect("joined").expect("loaded"), "object-id");
    assert_eq!(
        b.project_id("pod3", "p1").await.expect("loaded"),
        "p1",
        "not mapped there"
    );
}

/// A controller just started has only kuryr.conf's view of the deployments: until the objects'
/// watch hands over the operator's settings (here: the first deployment in maintenance) nothing
/// is bound, or the first namespaces would go where the operator said not to.
#[tokio::test]
async fn nothing_is_bound_before_the_deployment_objects_are_loaded() {
    let store = Arc::new(MemoryStore::default());
    let b = Binder::awaiting_objects(
        sched(&all_filters(), &[BindingWeigher::CreationOrder]),
        six_in_two_groups(),
        store.clone(),
    );
    let key = BindingKey::default();
    let e = b.bind(&key).await.expect_err("not loaded");
    assert!(e.is_retryable(), "{e}");
    assert!(store.list().await.expect("list").is_empty());
    let mut objects = six_in_two_groups();
    objects[0].maintenance = true;
    b.set_candidates(objects).await;
    let placed = b.bind(&key).await.expect("loaded");
    assert_ne!(placed.deployment, "pod1", "pod1 is in maintenance");
}

/// A controller just started knows no usage: a new project waits for the term's first round
/// instead of taking the full first deployment for unmeasured (which passes usage_threshold).
#[tokio::test]
async fn a_new_term_decides_on_its_first_usage_round() {
    let (b, store) = binder(six_in_two_groups());
    b.expect_usage();
    let b = Arc::new(b);
    let key = req("t1", "general");
    let binding = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move { b.bind(&key).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!binding.is_finished(), "decided before any usage was measured");
    assert!(store.list().await.expect("list").is_empty());
    let full = (UsageFigure::Fresh(0.99), ProjectUsage::default());
    b.set_usage(&BTreeMap::from([("pod1".to_string(), full)])).await;
    let placed = binding.await.expect("joined").expect("bound");
    assert_eq!(placed.deployment, "pod2", "pod1 is full");
    // The next term: a binding that stays needs no figure and does not wait for one.
    b.expect_usage();
    b.forget().await;
    let again = tokio::time::timeout(std::time::Duration::from_secs(1), b.bind(&key))
        .await
        .expect("no wait for a binding that stays")
        .expect("bound");
    assert_eq!(again.deployment, "pod2");
}

/// Eight new projects decided at once (a term's first usage round wakes every waiter) with
/// pod1 measured at 0.84 (threshold 0.9, hysteresis 0.05: room for one binding's estimate): one
/// lands there, the others see it and go on to pod2; and the estimate never moves the project
/// already bound to pod1 (only a measured figure moves tenants). All eight saw 0.84 and
/// landed on pod1, whose estimate (0.92) then moved the old tenant away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_bindings_is_admitted_in_turn_and_its_estimate_moves_nobody() {
    let store = Arc::new(GatedStore {
        delay: std::time::Duration::from_millis(5),
        ..GatedStore::default()
    });
    let b = Arc::new(Binder::new(
        sched(&all_filters(), &[BindingWeigher::CreationOrder]),
        six_in_two_groups(),
        store.clone(),
    ));
    let old = req("old", "general");
    assert_eq!(b.bind(&old).await.expect("bound").deployment, "pod1");
    b.expect_usage();
    let binds: Vec<_> = (0..8)
        .map(|i| {
            let b = b.clone();
            tokio::spawn(async move { b.bind(&req(&format!("new{i}"), "general")).await })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let measured = (UsageFigure::Fresh(0.84), ProjectUsage::default());
    b.set_usage(&BTreeMap::from([("pod1".to_string(), measured)]))
        .await;
    let mut on_pod1 = 0;
    for j in binds {
        if j.await.expect("joined").expect("bound").deployment == "pod1" {
            on_pod1 += 1;
        }
    }
    assert_eq!(on_pod1, 1, "one new binding fits pod1's room");
    b.forget().await;
    let again = b.bind(&old).await.expect("bound");
    assert_eq!((again.deployment.as_str(), again.rebound), ("pod1", None));
}

/// A replica leading again binds nothing on what it knew of the deployments in its last term
/// (another leader's operator may have put one into maintenance meanwhile): not until the
/// term's watch has listed the objects again.
#[tokio::test]
async fn a_new_term_binds_nothing_before_the_deployments_are_listed_again() {
    let (b, _) = binder(six_in_two_groups());
    assert_eq!(
        b.bind(&req("t1", "general")).await.expect("bound").deployment,
        "pod1"
    );
    b.begin_term().await;
    let refused = b.bind(&req("t2", "general")).await;
    assert!(matches!(refused, Err(Error::ResourceNotReady(_))), "{refused:?}");
    let mut c = six_in_two_groups();
    c[0].maintenance = true;
    b.set_candidates(c).await;
    b.set_usage(&BTreeMap::new()).await;
    assert_eq!(
        b.bind(&req("t2", "general")).await.expect("bound").deployment,
        "pod2"
    );
}

/// A store whose reads take `delay` (concurrent binds overlap as they do against the
/// Kubernetes API) and, while the test holds `gate`, return what they read only once it lets
/// them go: a decision then acts on a read older than what the test changed meanwhile. Claims
/// wait likewise while the test holds `claim_gate`.
#[derive(Default)]
struct GatedStore {
    inner: MemoryStore,
    delay: std::time::Duration,
    gate: tokio::sync::RwLock<()>,
    claim_gate: tokio::sync::RwLock<()>,
}

#[async_trait::async_trait]
impl BindingStore for GatedStore {
    async fn get(&self, key: &BindingKey) -> Result<Option<BindingState>, Error> {
        let read = self.inner.get(key).await;
        tokio::time::sleep(self.delay).await;
        let _open = self.gate.read().await;
        read
    }
    async fn list(&self) -> Result<Vec<BindingState>, Error> {
        self.inner.list().await
    }
    async fn claim(
        &self,
        key: &BindingKey,
        expected: Option<&str>,
        pinned: Option<bool>,
        new: &str,
        why: &str,
    ) -> Result<bool, Error> {
        let _open = self.claim_gate.read().await;
        self.inner.claim(key, expected, pinned, new, why).await
    }
    async fn set_pinned(&self, key: &BindingKey, pinned: bool) -> Result<(), Error> {
        self.inner.set_pinned(key, pinned).await
    }
}

/// An operator's pin (or move, with the cache emptied) landing while a decision reads the
/// binding: the pinned binding is not moved by that decision, and the moved one is not cached
/// where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_pin_or_move_during_a_decision_is_not_undone() {
    let store = Arc::new(GatedStore::default());
    let b = Arc::new(Binder::new(
        sched(&all_filters(), &[BindingWeigher::CreationOrder]),
        six_in_two_groups(),
        store.clone(),
    ));
    let (t1, t2) = (req("t1", "general"), req("t2", "general"));
    for r in [&t1, &t2] {
        assert_eq!(b.bind(r).await.expect("bound").deployment, "pod1");
    }
    // pod1 into maintenance with move_existing: t1 is to leave... but is pinned meanwhile.
    let mut c = six_in_two_groups();
    c[0].maintenance = true;
    c[0].move_existing = true;
    b.set_candidates(c).await;
    let gate = store.gate.write().await;
    let deciding = tokio::spawn({
        let (b, t1) = (b.clone(), t1.clone());
        async move { b.bind(&t1).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    store.inner.set_pinned(&t1, true).await.expect("pinned");
    drop(gate);
    let placed = deciding.await.expect("joined").expect("bound");
    assert_eq!(placed.deployment, "pod1", "a pinned binding stays");
    // t2 left pod1 for pod2; an operator moves it to pod3 while a decision reads it.
    assert_eq!(b.bind(&t2).await.expect("bound").deployment, "pod2");
    b.forget().await;
    let gate = store.gate.write().await;
    let deciding = tokio::spawn({
        let (b, t2) = (b.clone(), t2.clone());
        async move { b.bind(&t2).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        store
            .inner
            .claim(&t2, Some("pod2"), None, "pod3", "moved by an operator")
            .await
            .expect("moved")
    );
    b.forget().await;
    drop(gate);
    deciding.await.expect("joined").expect("bound");
    assert_eq!(
        b.bind(&t2).await.expect("bound").deployment,
        "pod3",
        "not cached on pod2"
    );
}

/// A deployment put into maintenance while a new binding is admitted: the edit takes effect
/// (and the object's observedGeneration says so) only after that admission, decided on the old
/// candidates, and no binding decided after it goes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maintenance_edit_waits_for_the_admission_in_flight() {
    let store = Arc::new(GatedStore::default());
    let b = Arc::new(Binder::new(
        sched(&all_filters(), &[BindingWeigher::CreationOrder]),
        six_in_two_groups(),
        store.clone(),
    ));
    let gate = store.claim_gate.write().await;
    let admitting = tokio::spawn({
        let b = b.clone();
        async move { b.bind(&req("t1", "general")).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let mut c = six_in_two_groups();
    c[0].maintenance = true;
    let editing = tokio::spawn({
        let b = b.clone();
        async move { b.set_candidates(c).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        !editing.is_finished(),
        "the edit waits for the admission in flight"
    );
    drop(gate);
    let placed = admitting.await.expect("joined").expect("bound");
    assert_eq!(placed.deployment, "pod1", "decided before the edit");
    editing.await.expect("joined");
    assert_eq!(
        b.bind(&req("t2", "general")).await.expect("bound").deployment,
        "pod2"
    );
}

/// A binding object's watch event forgets that binding alone: marking a thousand unused
/// bindings (or another replica's claims) does not send every cached binding back to the store.
#[tokio::test]
async fn a_binding_event_forgets_that_binding_only() {
    let store = Arc::new(MemoryStore::default());
    let b = Binder::new(
        sched(&all_filters(), &[BindingWeigher::CreationOrder]),
        six_in_two_groups(),
        store.clone(),
    );
    let (t1, t2) = (req("t1", "general"), req("t2", "general"));
    for r in [&t1, &t2] {
        assert_eq!(b.bind(r).await.expect("bound").deployment, "pod1");
    }
    for (r, to) in [(&t1, "pod2"), (&t2, "pod3")] {
        assert!(
            store
                .claim(r, Some("pod1"), None, to, "moved by an operator")
                .await
                .expect("moved")
        );
    }
    b.forget_key(&t2).await;
    assert_eq!(b.bind(&t2).await.expect("bound").deployment, "pod3", "read again");
    assert_eq!(
        b.bind(&t1).await.expect("bound").deployment,
        "pod1",
        "still cached"
    );
    b.forget().await;
    assert_eq!(b.bind(&t1).await.expect("bound").deployment, "pod2");
}
