use super::*;

const fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn bounds() -> Bounds {
    Bounds {
        grace: s(10),
        over_max: s(20),
        stuck: s(30),
        orphan_kuryrport: s(15),
    }
}

fn pod(key: &str, uid: &str, running: bool) -> PodView {
    PodView {
        key: key.into(),
        uid: uid.into(),
        scheduled: true,
        deleting: false,
        running,
    }
}

fn kp(key: &str, uid: &str, port: &str, ip: &str) -> KuryrPortView {
    KuryrPortView {
        key: key.into(),
        pod_uid: uid.into(),
        deleting: false,
        vifs: vec![(port.into(), vec![ip.into()])],
    }
}

fn port(id: &str, pool: Option<&str>, ip: &str) -> PortView {
    PortView {
        id: id.into(),
        pool: pool.map(String::from),
        ips: vec![ip.into()],
    }
}

fn pool(name: &str, max: u32, available: &[&str], in_use: Option<&[&str]>) -> PoolView {
    PoolView {
        name: name.into(),
        max,
        available: available.iter().map(|s| s.to_string()).collect(),
        recyclable: Vec::new(),
        in_use: in_use.map(|ids| ids.iter().map(|s| s.to_string()).collect()),
    }
}

/// Two running pods on pool ports, one more port available: every book balances.
fn healthy(at: Duration) -> Snapshot {
    Snapshot {
        at,
        disrupted: false,
        calm_since: Duration::ZERO,
        pods: vec![pod("ns/a", "u-a", true), pod("ns/b", "u-b", true)],
        kuryr_ports: vec![
            kp("ns/a", "u-a", "p1", "10.0.0.1"),
            kp("ns/b", "u-b", "p2", "10.0.0.2"),
        ],
        pools: vec![pool("pool-1", 5, &["p3"], Some(&["p1", "p2"]))],
        ports: vec![
            port("p1", Some("pool-1"), "10.0.0.1"),
            port("p2", Some("pool-1"), "10.0.0.2"),
            port("p3", Some("pool-1"), "10.0.0.3"),
        ],
        services: ["ns/svc".to_string()].into(),
        load_balancers: vec![LoadBalancerView {
            id: "lb1".into(),
            service: "ns/svc".into(),
        }],
        policies: ["np-uid".to_string()].into(),
        security_groups: vec![SecurityGroupView {
            id: "sg1".into(),
            policy_uid: "np-uid".into(),
        }],
        address_groups: vec![SecurityGroupView {
            id: "ag1".into(),
            policy_uid: "np-uid".into(),
        }],
    }
}

fn kinds(v: &[Violation]) -> Vec<(Kind, String)> {
    v.iter().map(|v| (v.kind, v.subject.clone())).collect()
}

#[test]
fn a_balanced_cluster_has_no_violation_over_time_nor_at_the_end() {
    let mut c = Checker::new(bounds());
    for t in 0..100 {
        assert_eq!(c.observe(&healthy(s(t))), vec![]);
    }
    assert_eq!(c.final_check(&healthy(s(100))), vec![]);
    assert_eq!(c.snapshots, 101);
}

#[test]
fn an_unowned_port_is_a_leak_only_once_it_outlasts_the_grace() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.ports.push(port("p9", None, "10.0.0.9"));
    for t in 0..=10 {
        snap.at = s(t);
        assert_eq!(c.observe(&snap), vec![], "within the grace at {t}s");
    }
    snap.at = s(11);
    let v = c.observe(&snap);
    assert_eq!(kinds(&v), vec![(Kind::LeakedPort, "p9".to_string())]);
    assert!(v[0].detail.contains("owned by no KuryrPort"), "{}", v[0].detail);
    // Counted once, however long it lasts.
    snap.at = s(12);
    assert_eq!(c.observe(&snap), vec![]);
}

#[test]
fn a_port_recorded_before_the_grace_ends_is_no_leak() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.ports.push(port("p9", None, "10.0.0.9"));
    for t in 0..8 {
        snap.at = s(t);
        assert_eq!(c.observe(&snap), vec![]);
    }
    // The KuryrPort status is written: owned now. A later, unrelated unowned spell starts anew.
    let mut owned = snap.clone();
    owned.pods.push(pod("ns/c", "u-c", true));
    owned.kuryr_ports.push(kp("ns/c", "u-c", "p9", "10.0.0.9"));
    owned.at = s(8);
    assert_eq!(c.observe(&owned), vec![]);
    for t in 9..18 {
        snap.at = s(t);
        assert_eq!(c.observe(&snap), vec![], "grace restarted at 9s, now {t}s");
    }
}

#[test]
fn the_final_check_has_no_grace() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.ports.push(port("p9", Some("pool-1"), "10.0.0.9"));
    let v = c.final_check(&snap);
    assert_eq!(kinds(&v), vec![(Kind::LeakedPort, "p9".to_string())]);
    assert!(v[0].detail.contains("pool tag pool-1"), "{}", v[0].detail);
}

#[test]
fn ports_counted_in_use_by_a_pool_but_held_by_no_pod_are_a_mismatch() {
    // The pool says p1, p2 and p4 are in use; only p1 and p2 are in KuryrPorts. p4 is also no
    // KuryrPort's and in no pool list: a leak the orphan sweep would skip.
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.pools[0].in_use = Some(vec!["p1".into(), "p2".into(), "p4".into()]);
    snap.ports.push(port("p4", Some("pool-1"), "10.0.0.4"));
    let v = c.final_check(&snap);
    assert_eq!(
        kinds(&v),
        vec![
            (Kind::LeakedPort, "p4".to_string()),
            (Kind::Mismatch, "pool-1/in-use".to_string()),
        ]
    );
    assert!(
        v[1].detail.contains("counts 3 in use, KuryrPorts hold 2"),
        "{}",
        v[1].detail
    );
    assert!(
        v[1].detail
            .contains("not among them: p4 [pool tag pool-1; in no KuryrPort]"),
        "{}",
        v[1].detail
    );
}

#[test]
fn a_pod_port_the_pool_does_not_count_is_a_mismatch_too() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.pools[0].in_use = Some(vec!["p1".into()]);
    let v = c.final_check(&snap);
    assert_eq!(kinds(&v), vec![(Kind::Mismatch, "pool-1/in-use".to_string())]);
    assert!(v[0].detail.contains("not counted: p2"), "{}", v[0].detail);
}

#[test]
fn a_pooled_port_missing_from_neutron_is_a_mismatch() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.pools[0].available.push("gone".into());
    let v = c.final_check(&snap);
    assert_eq!(
        kinds(&v),
        vec![(Kind::Mismatch, "pool-1/not-in-neutron".to_string())]
    );
}

#[test]
fn without_the_leaders_count_the_books_are_checked_against_neutron_only() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.pools[0].in_use = None;
    assert_eq!(c.final_check(&snap), vec![]);
}

#[test]
fn over_max_is_allowed_for_one_update_period() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.pools[0].max = 2;
    snap.pools[0].recyclable = vec!["p5".into(), "p6".into()];
    snap.ports.push(port("p5", Some("pool-1"), "10.0.0.5"));
    snap.ports.push(port("p6", Some("pool-1"), "10.0.0.6"));
    for t in 0..=20 {
        snap.at = s(t);
        assert_eq!(c.observe(&snap), vec![], "{t}s");
    }
    snap.at = s(21);
    let v = c.observe(&snap);
    assert_eq!(kinds(&v), vec![(Kind::OverMax, "pool-1".to_string())]);
    assert!(
        v[0].detail.starts_with("1 available + 2 recyclable > max 2"),
        "{}",
        v[0].detail
    );
    // max 0 is unlimited.
    snap.pools[0].max = 0;
    assert_eq!(Checker::new(bounds()).final_check(&snap), vec![]);
}

#[test]
fn two_pods_on_one_port_or_ip_are_reported_at_once() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.pods.push(pod("ns/c", "u-c", true));
    snap.kuryr_ports.push(kp("ns/c", "u-c", "p1", "10.0.0.1"));
    let v = c.observe(&snap);
    assert_eq!(
        kinds(&v),
        vec![
            (Kind::SharedPort, "p1".to_string()),
            (Kind::SharedIp, "10.0.0.1".to_string())
        ]
    );
    assert!(v[0].detail.contains("ns/a, ns/c"), "{}", v[0].detail);
}

#[test]
fn a_kuryrport_being_deleted_holds_nothing() {
    // Its finalizer gave p1 back and the pool handed it to c: no collision while it lingers.
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.kuryr_ports[0].deleting = true;
    snap.pods.push(pod("ns/c", "u-c", true));
    snap.kuryr_ports.push(kp("ns/c", "u-c", "p1", "10.0.0.1"));
    assert_eq!(kinds(&c.observe(&snap)), vec![]);
    // Nor while the port waits in its pool.
    let mut snap = healthy(s(0));
    snap.kuryr_ports[0].deleting = true;
    snap.pools[0] = pool("pool-1", 5, &["p3"], Some(&["p2"]));
    snap.pools[0].recyclable.push("p1".into());
    assert_eq!(kinds(&Checker::new(bounds()).final_check(&snap)), vec![]);
    // Two live holders are reported, naming the one being deleted too.
    let mut snap = healthy(s(0));
    snap.kuryr_ports[0].deleting = true;
    for (key, uid) in [("ns/c", "u-c"), ("ns/d", "u-d")] {
        snap.pods.push(pod(key, uid, true));
        snap.kuryr_ports.push(kp(key, uid, "p1", "10.0.0.1"));
    }
    let v = Checker::new(bounds()).observe(&snap);
    assert_eq!(kinds(&v)[0], (Kind::SharedPort, "p1".to_string()));
    assert!(
        v[0].detail.contains("ns/a (being deleted), ns/c, ns/d"),
        "{}",
        v[0].detail
    );
}

#[test]
fn two_neutron_ports_with_one_ip_are_reported() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.ports[2].ips = vec!["10.0.0.1".into()];
    assert_eq!(
        kinds(&c.observe(&snap)),
        vec![(Kind::SharedIp, "10.0.0.1".to_string())]
    );
}

#[test]
fn a_port_both_pooled_and_in_a_kuryrport_is_shared() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.pools[0].available.push("p1".into());
    let v = c.final_check(&snap);
    assert!(kinds(&v).contains(&(Kind::SharedPort, "p1".to_string())), "{v:?}");
    // The same port in two pools.
    let mut snap = healthy(s(0));
    snap.pools.push(pool("pool-2", 5, &["p3"], Some(&[])));
    let v = Checker::new(bounds()).observe(&snap);
    assert_eq!(kinds(&v), vec![(Kind::SharedPort, "p3".to_string())]);
}

#[test]
fn a_pod_waiting_is_stuck_only_past_the_bound_and_not_while_disrupted() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.pods.push(pod("ns/w", "u-w", false));
    // Disrupted for 100 s: no bound applies.
    snap.disrupted = true;
    for t in 0..100 {
        snap.at = s(t);
        assert_eq!(c.observe(&snap), vec![]);
    }
    // Quiet from 100 s: the pod has 30 s.
    snap.disrupted = false;
    for t in 100..=130 {
        snap.at = s(t);
        assert_eq!(c.observe(&snap), vec![], "{t}s");
    }
    snap.at = s(131);
    let v = c.observe(&snap);
    assert_eq!(kinds(&v), vec![(Kind::StuckPod, "ns/w (u-w)".to_string())]);
}

#[test]
fn worst_recovery_is_the_longest_wait_of_a_pod_pending_when_faults_stopped() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.pods.push(pod("ns/w", "u-w", false));
    snap.pods.push(pod("ns/x", "u-x", false));
    snap.disrupted = true;
    c.observe(&snap);
    snap.disrupted = false;
    snap.at = s(10);
    c.observe(&snap);
    snap.pods[2].running = true;
    snap.at = s(14);
    c.observe(&snap);
    snap.pods.remove(3); // deleted while waiting: its wait ends too
    snap.at = s(17);
    c.observe(&snap);
    assert_eq!(c.worst_recovery(), s(7));
}

#[test]
fn a_pod_not_running_at_the_end_is_stuck_unless_it_is_being_deleted() {
    let mut snap = healthy(s(0));
    snap.pods.push(pod("ns/w", "u-w", false));
    let mut deleting = pod("ns/d", "u-d", false);
    deleting.deleting = true;
    snap.pods.push(deleting);
    let mut unscheduled = pod("ns/u", "u-u", false);
    unscheduled.scheduled = false;
    snap.pods.push(unscheduled);
    let v = Checker::new(bounds()).final_check(&snap);
    assert_eq!(kinds(&v), vec![(Kind::StuckPod, "ns/w (u-w)".to_string())]);
}

#[test]
fn a_kuryrport_of_a_gone_or_replaced_pod_is_an_orphan_after_the_sweep_period() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    // ns/b was deleted and re-created with a new uid; its old KuryrPort is still there.
    snap.pods[1].uid = "u-b2".into();
    snap.pods[1].running = false;
    for t in 0..=15 {
        snap.at = s(t);
        assert_eq!(c.observe(&snap), vec![], "{t}s");
    }
    snap.at = s(16);
    assert_eq!(
        kinds(&c.observe(&snap)),
        vec![(Kind::OrphanKuryrPort, "ns/b (u-b)".to_string())]
    );
}

#[test]
fn load_balancers_and_policy_groups_of_gone_objects_are_leaks() {
    let mut snap = healthy(s(0));
    snap.services.clear();
    snap.policies.clear();
    let v = Checker::new(bounds()).final_check(&snap);
    assert_eq!(
        kinds(&v),
        vec![
            (Kind::LeakedLoadBalancer, "lb1".to_string()),
            (Kind::LeakedSecurityGroup, "sg1".to_string()),
            (Kind::LeakedAddressGroup, "ag1".to_string())
        ]
    );
    assert!(v[0].detail.contains("ns/svc"), "{}", v[0].detail);
}

#[test]
fn violations_render_with_time_kind_subject_and_detail() {
    let v = Violation {
        kind: Kind::LeakedPort,
        subject: "p9".into(),
        detail: "tagged port owned by no KuryrPort and no pool".into(),
        at: Duration::from_millis(12_345),
    };
    assert_eq!(
        v.to_string(),
        "[   12.3s] leaked port p9: tagged port owned by no KuryrPort and no pool"
    );
}

#[test]
fn the_grace_of_a_lasting_finding_starts_when_a_disruption_ends() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.ports.push(port("p9", None, "10.0.0.9"));
    snap.disrupted = true;
    for t in 0..60 {
        snap.at = s(t);
        assert_eq!(c.observe(&snap), vec![], "disrupted at {t}s");
    }
    snap.disrupted = false;
    for t in 60..=69 {
        snap.at = s(t);
        assert_eq!(c.observe(&snap), vec![], "{t}s");
    }
    snap.at = s(70);
    assert_eq!(
        kinds(&c.observe(&snap)),
        vec![(Kind::LeakedPort, "p9".to_string())]
    );
}

#[test]
fn converged_means_no_finding_no_waiting_pod_and_nothing_being_deleted() {
    let c = Checker::new(bounds());
    assert!(c.converged(&healthy(s(0))));
    let mut waiting = healthy(s(0));
    waiting.pods[0].running = false;
    assert!(!c.converged(&waiting));
    let mut deleting = healthy(s(0));
    deleting.kuryr_ports[0].deleting = true;
    assert!(!c.converged(&deleting));
    let mut unowned = healthy(s(0));
    unowned.ports.push(port("p9", None, "10.0.0.9"));
    assert!(!c.converged(&unowned), "a young finding is not settled either");
    assert_eq!(c.reported(), 0);
}

#[test]
fn the_grace_starts_when_a_disruption_ends_even_without_snapshots_during_it() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.ports.push(port("p9", None, "10.0.0.9"));
    snap.at = s(10);
    assert_eq!(c.observe(&snap), vec![], "young");
    // An API outage from 11 s to 60 s: no snapshot could be read; the disruption ended at 60 s.
    snap.calm_since = s(60);
    for t in [61, 65, 69] {
        snap.at = s(t);
        assert_eq!(c.observe(&snap), vec![], "{t}s: timed from the end of the outage");
    }
    snap.at = s(71);
    assert_eq!(
        kinds(&c.observe(&snap)),
        vec![(Kind::LeakedPort, "p9".to_string())]
    );
}

#[test]
fn an_address_group_of_a_gone_policy_is_a_leak_once_it_outlasts_the_grace() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(0));
    snap.address_groups.push(SecurityGroupView {
        id: "ag9".into(),
        policy_uid: "gone".into(),
    });
    assert_eq!(c.observe(&snap), vec![]);
    snap.at = s(11);
    assert_eq!(
        kinds(&c.observe(&snap)),
        vec![(Kind::LeakedAddressGroup, "ag9".to_string())]
    );
}

/// After the deletion of everything, what is left is a leak even while something still claims
/// it (a Service or NetworkPolicy stuck on its finalizer owns its load balancer and groups), and
/// not settling is a violation of its own. Pool ports may stay.
#[test]
fn whatever_outlives_the_deletion_of_everything_is_reported() {
    let mut c = Checker::new(bounds());
    let mut snap = healthy(s(100));
    snap.pods.clear();
    snap.kuryr_ports.clear();
    snap.pools[0].in_use = Some(Vec::new());
    snap.pools[0].available = vec!["p1".into(), "p2".into(), "p3".into()];
    let mut clean = snap.clone();
    clean.load_balancers.clear();
    clean.security_groups.clear();
    clean.address_groups.clear();
    assert_eq!(c.emptied_check(&clean, true), vec![], "only pool ports are left");

    let mut c = Checker::new(bounds());
    snap.ports.push(port("p9", None, "10.0.0.9"));
    let v = kinds(&c.emptied_check(&snap, false));
    for want in [
        (Kind::Unsettled, "the soak namespaces' deletion".to_string()),
        (Kind::LeakedLoadBalancer, "lb1".to_string()),
        (Kind::LeakedSecurityGroup, "sg1".to_string()),
        (Kind::LeakedAddressGroup, "ag1".to_string()),
        (Kind::LeakedPort, "p9".to_string()),
    ] {
        assert!(v.contains(&want), "{want:?} in {v:?}");
    }
}
