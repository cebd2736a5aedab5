//! NetworkPolicy proven by traffic, in the style of the Kubernetes network-policy e2e suite:
//! namespaces x, y, z with pods a, b, c each (on both chassis of the OVN lab, wired by the real
//! CNI daemons), every pod serving TCP and UDP on 80 and 81. For each case the policies are
//! changed through the API, the expected 9x9 matrix per port and protocol is computed by
//! `support::netpol_model` (written from the Kubernetes API reference, not from kuryr's
//! translation), and all cells are probed in parallel until the dataplane matches or a deadline
//! passes; the time from the change to the match is printed per case.
//!
//! The controller runs the `policy`, `kuryrnetworkpolicy` and `pod_label` handlers with
//! `pod_security_groups_driver = policy`; the enforcement is OVN's ACLs for the Neutron security
//! groups and address groups kuryr made.
//!
//! Needs the OVN lab (`KURYR_TEST_OVN_NEUTRON_URL`, `KURYR_TEST_OVN_LAB`); without it the
//! dataplane test prints why it skips, unless `KURYR_TEST_REQUIRE_OVN=1`. The model's own tests
//! always run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::netpol_model::{Labels, ModelPod, World};
use support::ovn_lab::*;
use support::probe::{Expect, Probe, Proto, Server, reach_once};
use support::*;

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
const PORTS: [u16; 2] = [80, 81];
const PROTOCOLS: [(Proto, &str); 2] = [(Proto::Tcp, "TCP"), (Proto::Udp, "UDP")];
const SUBNET: &str = "10.94.0.0/24";
/// One probe attempt: an answer on the lab comes in milliseconds; silence this long is a drop.
const ATTEMPT: Duration = Duration::from_millis(1500);
/// How long the dataplane may take to follow a change (controller, Neutron, northd, chassis).
const CONVERGE: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------- the model's own tests

fn model_pod(ns: &str, name: &str, ip: &str, web: u16) -> ModelPod {
    ModelPod {
        namespace: ns.into(),
        name: name.into(),
        labels: [("pod".to_string(), name.to_string())].into(),
        ips: vec![ip.parse().unwrap()],
        ports: container_ports(web)
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().to_string(),
                    p["protocol"].as_str().unwrap().to_string(),
                    p["containerPort"].as_u64().unwrap() as u16,
                )
            })
            .collect(),
    }
}

/// x/a 10.0.0.1, x/b .2, y/a .3, y/b .4; b's "web" port is 81, a's 80.
fn small_world(policies: &[(&str, &str, Value)]) -> World {
    let mut w = World::default();
    for ns in ["x", "y"] {
        w.namespaces
            .insert(ns.into(), [("ns".to_string(), ns.to_string())].into());
    }
    w.pods = vec![
        model_pod("x", "a", "10.0.0.1", 80),
        model_pod("x", "b", "10.0.0.2", 81),
        model_pod("y", "a", "10.0.0.3", 80),
        model_pod("y", "b", "10.0.0.4", 81),
    ];
    for (ns, name, spec) in policies {
        w.policies
            .insert((ns.to_string(), name.to_string()), spec.clone());
    }
    w
}

fn allows(w: &World, from: (&str, &str), to: (&str, &str), proto: &str, port: u16) -> bool {
    w.allows(
        w.pod(from.0, from.1).unwrap(),
        w.pod(to.0, to.1).unwrap(),
        proto,
        port,
    )
    .unwrap()
}

#[test]
fn model_without_policies_allows_everything_and_deny_all_isolates_only_its_namespace() {
    let open = small_world(&[]);
    assert!(allows(&open, ("y", "a"), ("x", "b"), "UDP", 81));
    let w = small_world(&[("x", "deny", json!({"podSelector": {}}))]);
    assert!(!allows(&w, ("y", "a"), ("x", "a"), "TCP", 80));
    assert!(
        !allows(&w, ("x", "b"), ("x", "a"), "TCP", 80),
        "same namespace too"
    );
    assert!(
        allows(&w, ("x", "a"), ("y", "a"), "TCP", 80),
        "egress is not isolated"
    );
    assert!(
        allows(&w, ("x", "a"), ("x", "a"), "TCP", 80),
        "a pod reaches itself"
    );
    let all = small_world(&[("x", "all", json!({"podSelector": {}, "ingress": [{}]}))]);
    assert!(allows(&all, ("y", "b"), ("x", "a"), "UDP", 80));
}

#[test]
fn model_policy_types_default_to_ingress_plus_egress_only_when_egress_rules_exist() {
    let egress_rules = small_world(&[(
        "x",
        "p",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "egress": [{"to": [{"podSelector": {}}]}]}),
    )]);
    assert!(
        !allows(&egress_rules, ("y", "a"), ("x", "a"), "TCP", 80),
        "Ingress implied"
    );
    assert!(allows(&egress_rules, ("x", "a"), ("x", "b"), "TCP", 80));
    assert!(
        !allows(&egress_rules, ("x", "a"), ("y", "a"), "TCP", 80),
        "Egress implied"
    );
    let empty_egress = small_world(&[("x", "p", json!({"podSelector": {}, "egress": []}))]);
    assert!(allows(&empty_egress, ("x", "a"), ("y", "a"), "TCP", 80));
    let ingress_listed = small_world(&[(
        "x",
        "p",
        json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}],
               "egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "none"}}}]}]}),
    )]);
    assert!(
        allows(&ingress_listed, ("x", "a"), ("y", "b"), "TCP", 80),
        "egress rules of an Ingress-only policy are ignored"
    );
}

#[test]
fn model_peers_pod_selector_is_the_policy_namespace_namespace_selector_every_pod_and_both_the_intersection() {
    let rule = |from: Value| {
        small_world(&[(
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": from}]}),
        )])
    };
    let pods = rule(json!([{"podSelector": {"matchLabels": {"pod": "b"}}}]));
    assert!(allows(&pods, ("x", "b"), ("x", "a"), "TCP", 80));
    assert!(
        !allows(&pods, ("y", "b"), ("x", "a"), "TCP", 80),
        "other namespace"
    );
    let nss = rule(json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]));
    assert!(allows(&nss, ("y", "a"), ("x", "a"), "TCP", 80));
    assert!(!allows(&nss, ("x", "b"), ("x", "a"), "TCP", 80));
    let both = rule(json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                            "podSelector": {"matchLabels": {"pod": "b"}}}]));
    assert!(allows(&both, ("y", "b"), ("x", "a"), "TCP", 80));
    assert!(!allows(&both, ("y", "a"), ("x", "a"), "TCP", 80));
    assert!(!allows(&both, ("x", "b"), ("x", "a"), "TCP", 80));
    let exprs = rule(
        json!([{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]},
                             "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a"]},
                                                                  {"key": "extra", "operator": "DoesNotExist"}]}}]),
    );
    assert!(allows(&exprs, ("y", "a"), ("x", "a"), "TCP", 80));
    assert!(!allows(&exprs, ("y", "b"), ("x", "a"), "TCP", 80));
    let mut labelled = exprs.clone();
    labelled.pods[2].labels.insert("extra".into(), "1".into());
    assert!(
        !allows(&labelled, ("y", "a"), ("x", "a"), "TCP", 80),
        "DoesNotExist"
    );
}

#[test]
fn model_ip_block_except_named_ports_per_destination_and_end_port() {
    let w = small_world(&[(
        "x",
        "p",
        json!({"podSelector": {}, "ingress": [
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/30", "except": ["10.0.0.2/32"]}}]},
            {"ports": [{"port": "web"}]},
            {"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": 80, "endPort": 81}]}]}),
    )]);
    // 10.0.0.0/30 minus .2: x/a (.1) and y/a (.3) reach everything of x; x/b (.2) does not.
    assert!(allows(&w, ("y", "a"), ("x", "b"), "TCP", 81));
    assert!(!allows(&w, ("x", "b"), ("x", "a"), "TCP", 81));
    // "web" is 80 on x/a and 81 on x/b: resolved on the destination.
    assert!(allows(&w, ("y", "b"), ("x", "a"), "TCP", 80));
    assert!(!allows(&w, ("y", "b"), ("x", "a"), "TCP", 81));
    assert!(allows(&w, ("y", "b"), ("x", "b"), "TCP", 81));
    assert!(!allows(&w, ("y", "b"), ("x", "b"), "TCP", 80));
    // UDP 80..=81 from every namespace.
    assert!(allows(&w, ("y", "b"), ("x", "b"), "UDP", 80));
    assert!(allows(&w, ("y", "b"), ("x", "b"), "UDP", 81));
}

#[test]
fn model_several_policies_are_a_union_and_both_ends_must_allow() {
    let w = small_world(&[
        (
            "x",
            "from-b",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        ),
        (
            "x",
            "from-y",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": 81}]}]}),
        ),
        (
            "y",
            "no-egress",
            json!({"podSelector": {"matchLabels": {"pod": "b"}}, "policyTypes": ["Egress"]}),
        ),
    ]);
    assert!(allows(&w, ("x", "b"), ("x", "a"), "UDP", 80));
    assert!(allows(&w, ("y", "a"), ("x", "a"), "TCP", 81));
    assert!(!allows(&w, ("y", "a"), ("x", "a"), "TCP", 80));
    assert!(
        !allows(&w, ("y", "b"), ("x", "a"), "TCP", 81),
        "y/b's egress is closed"
    );
    assert!(!allows(&w, ("y", "b"), ("y", "a"), "TCP", 81));
}

// ---------------------------------------------------------------- the dataplane

/// Container ports every pod declares: `serve-<port>-<proto>` for what it serves and `web`,
/// which is `web` on this pod (80 on a and b, 81 on c: a named port resolved per pod).
fn container_ports(web: u16) -> Vec<Value> {
    let mut out = vec![];
    for port in PORTS {
        for (_, proto) in PROTOCOLS {
            out.push(json!({"name": format!("serve-{port}-{}", proto.to_lowercase()),
                            "containerPort": port, "protocol": proto}));
        }
    }
    out.push(json!({"name": "web", "containerPort": web, "protocol": "TCP"}));
    out
}

fn web_port(pod: &str) -> u16 {
    if pod == "c" { 81 } else { 80 }
}

/// One change a case makes through the API.
enum Act {
    /// Create or replace the policy `namespace/name` with `spec`.
    Apply(&'static str, &'static str, Value),
    Delete(&'static str, &'static str),
    /// Merge `labels` (null removes) into a pod's labels.
    PodLabels(&'static str, &'static str, Value),
    NamespaceLabels(&'static str, Value),
    /// Every policy deleted and every label back to how the suite created it.
    Clear,
}

struct Case {
    name: &'static str,
    acts: Vec<Act>,
}

fn case(name: &'static str, acts: Vec<Act>) -> Case {
    Case { name, acts }
}

fn pod_sel(pod: &str) -> Value {
    json!({"matchLabels": {"pod": pod}})
}

fn ns_sel(ns: &str) -> Value {
    json!({"matchLabels": {"ns": ns}})
}

/// The cases, in order; each starts from where the previous one left the cluster. `ip` gives a
/// pod's address (for ipBlock peers).
fn cases(ip: &dyn Fn(&str, &str) -> IpAddr) -> Vec<Case> {
    use Act::*;
    let host = |ns: &str, pod: &str| format!("{}/32", ip(ns, pod));
    vec![
        case("no policy: everything open", vec![Clear]),
        case(
            "deny all ingress in x",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
            )],
        ),
        case(
            "the same policy updated to allow all ingress in x",
            vec![Apply("x", "p", json!({"podSelector": {}, "ingress": [{}]}))],
        ),
        case(
            "x/a from pod=b of x (pod label)",
            vec![
                Clear,
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"podSelector": pod_sel("b")}]}]}),
                ),
            ],
        ),
        case(
            "x/a from namespace y (namespace label)",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"namespaceSelector": ns_sel("y")}]}]}),
            )],
        ),
        case(
            "x/a from pod=c of namespace y (both in one peer)",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"namespaceSelector": ns_sel("y"), "podSelector": pod_sel("c")}]}]}),
            )],
        ),
        case(
            "x/a from namespace y or pod=c of x (two peers)",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"namespaceSelector": ns_sel("y")}, {"podSelector": pod_sel("c")}]}]}),
            )],
        ),
        case(
            "matchExpressions: x/a and x/b from pods not a of namespaces y and z",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]},
                       "ingress": [{"from": [{
                           "namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y", "z"]}]},
                           "podSelector": {"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["a"]}]}}]}]}),
            )],
        ),
        case(
            "matchExpressions Exists/DoesNotExist: all of x from pods without label extra (y/a has it)",
            vec![
                PodLabels("y", "a", json!({"extra": "1"})),
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Exists"}]},
                           "ingress": [{"from": [{"namespaceSelector": {},
                               "podSelector": {"matchExpressions": [{"key": "extra", "operator": "DoesNotExist"}]}}]}]}),
                ),
            ],
        ),
        case(
            "x/a on TCP 80 from everyone (protocol defaults to TCP)",
            vec![
                Clear,
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"), "ingress": [{"ports": [{"port": 80}]}]}),
                ),
            ],
        ),
        case(
            "x/a on the named port serve-81-udp",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": pod_sel("a"), "ingress": [{"ports": [{"protocol": "UDP", "port": "serve-81-udp"}]}]}),
            )],
        ),
        case(
            "all of x on the named port web (80 on a and b, 81 on c)",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": {}, "ingress": [{"ports": [{"port": "web"}]}]}),
            )],
        ),
        case(
            "endPort: x/a on TCP 80-81 from namespace z",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"namespaceSelector": ns_sel("z")}], "ports": [{"port": 80, "endPort": 81}]}]}),
            )],
        ),
        case(
            "ipBlock with except: x/a from the pod subnet except y/b",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"ipBlock": {"cidr": SUBNET, "except": [host("y", "b")]}}]}]}),
            )],
        ),
        case(
            "ipBlock of one address, any UDP port: x/a from y/a",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"ipBlock": {"cidr": host("y", "a")}}], "ports": [{"protocol": "UDP"}]}]}),
            )],
        ),
        case(
            "egress deny-all in x",
            vec![
                Clear,
                Apply("x", "p", json!({"podSelector": {}, "policyTypes": ["Egress"]})),
            ],
        ),
        case(
            "implicit policyTypes: x/a to namespace y on TCP 80 (and so no ingress)",
            vec![
                Delete("x", "p"),
                Apply(
                    "x",
                    "q",
                    json!({"podSelector": pod_sel("a"),
                           "egress": [{"to": [{"namespaceSelector": ns_sel("y")}], "ports": [{"port": 80}]}]}),
                ),
            ],
        ),
        case(
            "egress to ipBlock with except: x/a to the pod subnet except z/a and z/b",
            vec![Apply(
                "x",
                "q",
                json!({"podSelector": pod_sel("a"), "policyTypes": ["Egress"],
                       "egress": [{"to": [{"ipBlock": {"cidr": SUBNET, "except": [host("z", "a"), host("z", "b")]}}]}]}),
            )],
        ),
        case(
            "egress on a named port: x/b to pod=c of any namespace on web (81 there)",
            vec![
                Clear,
                Apply(
                    "x",
                    "q",
                    json!({"podSelector": pod_sel("b"), "policyTypes": ["Egress"],
                           "egress": [{"to": [{"namespaceSelector": {}, "podSelector": pod_sel("c")}],
                                       "ports": [{"port": "web"}]}]}),
                ),
            ],
        ),
        case(
            "ingress and egress in one policy: x/a from y, to z",
            vec![
                Clear,
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"), "policyTypes": ["Ingress", "Egress"],
                           "ingress": [{"from": [{"namespaceSelector": ns_sel("y")}]}],
                           "egress": [{"to": [{"namespaceSelector": ns_sel("z")}]}]}),
                ),
            ],
        ),
        case(
            "two ingress policies on x/a are a union: from pod=b of x, from namespace z on UDP",
            vec![
                Clear,
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"podSelector": pod_sel("b")}]}]}),
                ),
                Apply(
                    "x",
                    "q",
                    json!({"podSelector": pod_sel("a"),
                           "ingress": [{"from": [{"namespaceSelector": ns_sel("z")}], "ports": [{"protocol": "UDP"}]}]}),
                ),
            ],
        ),
        case(
            "an Ingress-only and an Egress-only policy on x/a isolate it both ways",
            vec![
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"namespaceSelector": ns_sel("y")}]}]}),
                ),
                Apply(
                    "x",
                    "q",
                    json!({"podSelector": pod_sel("a"), "policyTypes": ["Egress"],
                           "egress": [{"to": [{"namespaceSelector": ns_sel("y")}]}]}),
                ),
            ],
        ),
        case(
            "policyTypes [Ingress] ignores the policy's egress rules",
            vec![
                Delete("x", "q"),
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"), "policyTypes": ["Ingress"],
                           "ingress": [{"from": [{"namespaceSelector": ns_sel("y")}]}],
                           "egress": [{"to": [{"podSelector": pod_sel("b")}]}]}),
                ),
            ],
        ),
        case(
            "x/a from pod=b of y",
            vec![
                Clear,
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"),
                           "ingress": [{"from": [{"namespaceSelector": ns_sel("y"), "podSelector": pod_sel("b")}]}]}),
                ),
            ],
        ),
        case(
            "policy update: the peer becomes pod=c of y",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"namespaceSelector": ns_sel("y"), "podSelector": pod_sel("c")}]}]}),
            )],
        ),
        case(
            "x/a from role=client pods anywhere: nobody is one yet",
            vec![Apply(
                "x",
                "p",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "client"}}}]}]}),
            )],
        ),
        case(
            "label change on a peer: y/a becomes role=client",
            vec![PodLabels("y", "a", json!({"role": "client"}))],
        ),
        case(
            "label change on a peer: y/a loses role=client",
            vec![PodLabels("y", "a", json!({"role": null}))],
        ),
        case(
            "a policy for app=web pods that no pod has: nothing changes",
            vec![
                Clear,
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}),
                ),
            ],
        ),
        case(
            "label change on a selected pod: x/c becomes app=web and is isolated",
            vec![PodLabels("x", "c", json!({"app": "web"}))],
        ),
        case(
            "x/a from namespaces of team blue: none yet",
            vec![
                Clear,
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"),
                           "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}]}),
                ),
            ],
        ),
        case(
            "namespace label change: z joins team blue",
            vec![NamespaceLabels("z", json!({"team": "blue"}))],
        ),
        case(
            "x/a from y and from z by two policies",
            vec![
                Clear,
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"namespaceSelector": ns_sel("y")}]}]}),
                ),
                Apply(
                    "x",
                    "q",
                    json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"namespaceSelector": ns_sel("z")}]}]}),
                ),
            ],
        ),
        case("policy deletion: the one from y goes", vec![Delete("x", "p")]),
        case(
            "default deny in every namespace, open within each",
            vec![
                Clear,
                Apply(
                    "x",
                    "p",
                    json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
                ),
                Apply(
                    "y",
                    "p",
                    json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
                ),
                Apply(
                    "z",
                    "p",
                    json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
                ),
            ],
        ),
        case(
            "deny all both ways in y, egress to x only in z",
            vec![
                Clear,
                Apply(
                    "y",
                    "p",
                    json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
                ),
                Apply(
                    "z",
                    "p",
                    json!({"podSelector": {}, "policyTypes": ["Egress"],
                           "egress": [{"to": [{"namespaceSelector": ns_sel("x")}]}]}),
                ),
            ],
        ),
        case("every policy deleted: everything open again", vec![Clear]),
    ]
}

/// A pod of the table: where it runs and how the model sees it.
struct TablePod {
    ns: &'static str,
    name: &'static str,
    wired: Wired,
}

struct Table<'a> {
    kube: Client,
    pods: Vec<TablePod>,
    world: World,
    lab: &'a Lab,
}

impl Table<'_> {
    /// Reads labels and policies back from the API (what the controller sees, including the
    /// labels the API server adds itself).
    async fn refresh(&mut self) -> Result<()> {
        let mut world = World::default();
        for ns in Api::<Namespace>::all(self.kube.clone())
            .list(&ListParams::default())
            .await?
        {
            world.namespaces.insert(ns.name_any(), ns.labels().clone());
        }
        for p in &self.pods {
            let pod = Api::<Pod>::namespaced(self.kube.clone(), p.ns)
                .get(p.name)
                .await?;
            world.pods.push(ModelPod {
                namespace: p.ns.into(),
                name: p.name.into(),
                labels: pod.labels().clone(),
                ips: p.wired.ips.clone(),
                ports: container_ports(web_port(p.name))
                    .iter()
                    .map(|c| {
                        (
                            c["name"].as_str().unwrap_or_default().to_string(),
                            c["protocol"].as_str().unwrap_or_default().to_string(),
                            c["containerPort"].as_u64().unwrap_or_default() as u16,
                        )
                    })
                    .collect(),
            });
        }
        for ns in NAMESPACES {
            for np in Api::<NetworkPolicy>::namespaced(self.kube.clone(), ns)
                .list(&ListParams::default())
                .await?
            {
                // A deleted policy stays listed until the controller's finalizer has released
                // its groups; the user's intent (and Kubernetes' semantics, which know no such
                // finalizer) is that it no longer applies.
                if np.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                world
                    .policies
                    .insert((ns.to_string(), np.name_any()), serde_json::to_value(&np.spec)?);
            }
        }
        self.world = world;
        Ok(())
    }

    async fn act(&self, act: &Act) -> Result<()> {
        match act {
            Act::Apply(ns, name, spec) => {
                let api = Api::<NetworkPolicy>::namespaced(self.kube.clone(), ns);
                let mut np: NetworkPolicy = serde_json::from_value(json!({
                    "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                    "metadata": {"name": name, "namespace": ns}, "spec": spec}))?;
                match api.get_opt(name).await? {
                    // A policy being deleted (its finalizer holds it until the controller has
                    // released its groups) cannot be brought back: replacing it would only change
                    // a terminating object. Wait until it is gone, then create anew.
                    Some(old) if old.metadata.deletion_timestamp.is_some() => {
                        deleted(&api, name).await?;
                        api.create(&PostParams::default(), &np).await?;
                    }
                    None => {
                        api.create(&PostParams::default(), &np).await?;
                    }
                    Some(old) => {
                        np.metadata = old.metadata;
                        api.replace(name, &PostParams::default(), &np).await?;
                    }
                }
            }
            Act::Delete(ns, name) => {
                Api::<NetworkPolicy>::namespaced(self.kube.clone(), ns)
                    .delete(name, &DeleteParams::default())
                    .await?;
            }
            Act::PodLabels(ns, name, labels) => {
                Api::<Pod>::namespaced(self.kube.clone(), ns)
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": labels}})),
                    )
                    .await?;
            }
            Act::NamespaceLabels(ns, labels) => {
                Api::<Namespace>::all(self.kube.clone())
                    .patch(
                        ns,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": labels}})),
                    )
                    .await?;
            }
            Act::Clear => {
                for ns in NAMESPACES {
                    let api = Api::<NetworkPolicy>::namespaced(self.kube.clone(), ns);
                    for np in api.list(&ListParams::default()).await? {
                        api.delete(&np.name_any(), &DeleteParams::default()).await?;
                    }
                    let nss = Api::<Namespace>::all(self.kube.clone());
                    let extra = extra_labels(nss.get(ns).await?.labels(), &[("ns", ns)]);
                    if !extra.is_empty() {
                        nss.patch(
                            ns,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"metadata": {"labels": extra}})),
                        )
                        .await?;
                    }
                }
                for p in &self.pods {
                    let api = Api::<Pod>::namespaced(self.kube.clone(), p.ns);
                    let extra = extra_labels(api.get(p.name).await?.labels(), &[("pod", p.name)]);
                    if !extra.is_empty() {
                        api.patch(
                            p.name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"metadata": {"labels": extra}})),
                        )
                        .await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Every cell: (protocol, port, from, to) with its probe, self excluded.
    fn cells(&self) -> Vec<(usize, usize, usize, Probe)> {
        let mut out = vec![];
        for (k, (proto, _)) in PROTOCOLS.iter().enumerate() {
            for (l, port) in PORTS.iter().enumerate() {
                for (i, from) in self.pods.iter().enumerate() {
                    for (j, to) in self.pods.iter().enumerate() {
                        if i == j {
                            continue;
                        }
                        out.push((
                            k * PORTS.len() + l,
                            i,
                            j,
                            Probe::new(
                                format!("{}/{} -> {}/{}", from.ns, from.name, to.ns, to.name),
                                &from.wired.path(),
                                *proto,
                                to.wired.ip(),
                                *port,
                                Expect::Open,
                            ),
                        ));
                    }
                }
            }
        }
        out
    }

    fn expected(&self, cells: &[(usize, usize, usize, Probe)]) -> Result<Vec<bool>> {
        cells
            .iter()
            .map(|(pp, i, j, _)| {
                let (_, proto) = PROTOCOLS[pp / PORTS.len()];
                let port = PORTS[pp % PORTS.len()];
                self.world
                    .allows(&self.world.pods[*i], &self.world.pods[*j], proto, port)
            })
            .collect()
    }

    /// Applies the case, then probes every cell until the dataplane matches the model.
    async fn run(&mut self, n: usize, case: &Case) -> Result<Duration> {
        let t = Instant::now();
        for act in &case.acts {
            self.act(act)
                .await
                .with_context(|| format!("case {n} ({})", case.name))?;
        }
        self.refresh().await?;
        let cells = self.cells();
        let want = self.expected(&cells)?;
        let probes: Vec<Probe> = cells.iter().map(|c| c.3.clone()).collect();
        let mut rounds = 0;
        loop {
            rounds += 1;
            let p = probes.clone();
            let got = tokio::task::spawn_blocking(move || reach_once(&p, ATTEMPT)).await?;
            let got = got
                .into_iter()
                .collect::<std::result::Result<Vec<bool>, String>>()
                .map_err(anyhow::Error::msg)?;
            if got == want {
                let took = t.elapsed();
                let open = want.iter().filter(|w| **w).count();
                eprintln!(
                    "case {n:2} matched in {:>6.2} s ({rounds} rounds; {open}/{} cells open): {}",
                    took.as_secs_f64(),
                    want.len(),
                    case.name
                );
                return Ok(took);
            }
            if t.elapsed() > CONVERGE {
                bail!(
                    "case {n} ({}): the dataplane does not match the model after {:?} ({rounds} rounds)\n{}\n{}",
                    case.name,
                    t.elapsed(),
                    self.render(&cells, &want, &got),
                    self.neutron_state()
                        .await
                        .unwrap_or_else(|e| format!("(Neutron state: {e})"))
                );
            }
        }
    }

    /// Matrices per protocol/port: `.` allowed as expected, `x` blocked as expected, `!` open
    /// but the model blocks it, `?` blocked but the model allows it. Rows: from; columns: to.
    fn render(&self, cells: &[(usize, usize, usize, Probe)], want: &[bool], got: &[bool]) -> String {
        let names: Vec<String> = self.pods.iter().map(|p| format!("{}/{}", p.ns, p.name)).collect();
        let mut grid: BTreeMap<usize, Vec<Vec<char>>> = BTreeMap::new();
        for (((pp, i, j, _), w), g) in cells.iter().zip(want).zip(got) {
            let m = grid
                .entry(*pp)
                .or_insert_with(|| vec![vec!['-'; names.len()]; names.len()]);
            m[*i][*j] = match (w, g) {
                (true, true) => '.',
                (false, false) => 'x',
                (false, true) => '!',
                (true, false) => '?',
            };
        }
        let mut out = String::new();
        for (pp, m) in grid {
            let (_, proto) = PROTOCOLS[pp / PORTS.len()];
            let _ = writeln!(out, "{proto} {}:   {}", PORTS[pp % PORTS.len()], names.join(" "));
            for (i, row) in m.iter().enumerate() {
                let cells: Vec<String> = row.iter().map(|c| format!("  {c}")).collect();
                let _ = writeln!(out, "  {:>4} {}", names[i], cells.join(" "));
            }
        }
        out
    }

    /// The groups each pod's port has and their rules, for a failure message.
    async fn neutron_state(&self) -> Result<String> {
        let client = self.lab.client();
        let mut out = String::new();
        for p in &self.pods {
            let port = client.get_port(&p.wired.port_id).await?;
            let _ = writeln!(
                out,
                "{}/{} {}: {:?}",
                p.ns,
                p.name,
                p.wired.ip(),
                port.security_groups
            );
        }
        Ok(out)
    }
}

/// Labels beyond `keep` (and the API server's own), as a merge patch that removes them, with
/// the `keep` labels set back.
fn extra_labels(have: &Labels, keep: &[(&str, &str)]) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for (k, v) in have {
        if k.starts_with("kubernetes.io/") {
            continue;
        }
        match keep.iter().find(|(kk, _)| kk == k) {
            Some((_, kv)) if kv == v => {}
            Some((_, kv)) => {
                out.insert(k.clone(), json!(kv));
            }
            None => {
                out.insert(k.clone(), Value::Null);
            }
        }
    }
    out
}

fn config(fx: &NeutronFixture) -> std::sync::Arc<kuryr_config::KuryrConfig> {
    kuryr_testbed::config(&format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport,policy,kuryrnetworkpolicy,pod_label\n\
         pod_vif_driver = neutron-vif\nvif_pool_driver = noop\npod_security_groups_driver = policy\n\
         cluster_id = np-tt-{}\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nresource_tags = k8s,e2e\n",
        &fx.project[fx.project.len() - 8..],
        fx.project,
        fx.subnet,
        fx.sg
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn network_policy_truth_table_on_the_ovn_dataplane_matches_the_kubernetes_model_cell_by_cell()
-> Result<()> {
    on_lab!(&[SUBNET], |lab, fx| {
        // Pods that no policy selects keep the cluster's default group: open, as without policies.
        allow(lab.client(), &fx, None, None, "IPv4").await?;
        let kube = start_kube().await?;
        let ctrl = start_controller(&kube.client, &lab.target, config(&fx));
        for ns in NAMESPACES {
            kuryr_testbed::create_namespace(&kube.client, ns, json!({})).await?;
            Api::<Namespace>::all(kube.client.clone())
                .patch(
                    ns,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"ns": ns}}})),
                )
                .await?;
        }
        let nodes = lab.nodes(&kube).await?;
        let t = Instant::now();
        let mut pods = vec![];
        for (k, (ns, name)) in NAMESPACES
            .iter()
            .flat_map(|ns| PODS.iter().map(move |p| (*ns, *p)))
            .enumerate()
        {
            let node = k % 2;
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": {"pod": name}},
                "spec": {"nodeName": nodes[node].name,
                         "containers": [{"name": "c", "image": "busybox", "ports": container_ports(web_port(name))}]}
            }))?;
            let pod = Api::<Pod>::namespaced(kube.client.clone(), ns)
                .create(&PostParams::default(), &pod)
                .await?;
            let wired = wire_created(lab, &kube, &nodes, &pod, node).await?;
            // The kubelet's part: the pod's address in its status (the policy model's pod IPs).
            let ips: Vec<Value> = wired.ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
            Api::<Pod>::namespaced(kube.client.clone(), ns)
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": "Running", "podIP": wired.ip().to_string(), "podIPs": ips}})),
                )
                .await?;
            pods.push(TablePod { ns, name, wired });
        }
        eprintln!("9 pods wired on 2 chassis in {:?}", t.elapsed());
        let _servers = pods
            .iter()
            .flat_map(|p| {
                PORTS
                    .iter()
                    .map(move |port| Server::start(&p.wired.path(), *port))
            })
            .collect::<Result<Vec<_>>>()?;
        let ip_of: BTreeMap<(String, String), IpAddr> = pods
            .iter()
            .map(|p| ((p.ns.to_string(), p.name.to_string()), p.wired.ip()))
            .collect();
        let ip = |ns: &str, pod: &str| ip_of[&(ns.to_string(), pod.to_string())];
        let all = cases(&ip);
        let mut table = Table {
            kube: kube.client.clone(),
            pods,
            world: World::default(),
            lab,
        };
        let mut times = vec![];
        for (n, c) in all.iter().enumerate() {
            times.push(table.run(n, c).await?);
        }
        times.sort();
        eprintln!(
            "{} cases, every cell as the model says; change -> dataplane match: median {:.2} s, max {:.2} s",
            all.len(),
            times[times.len() / 2].as_secs_f64(),
            times[times.len() - 1].as_secs_f64()
        );
        // The last case deleted every policy: their security groups and address groups go too.
        eventually("every policy's groups deleted from Neutron", WAIT, || async {
            let f = kuryr_neutron::ListFilter::new().project_id(&fx.project);
            let sgs = lab.client().list_security_groups(&f).await?;
            let policy_sgs = sgs
                .iter()
                .filter(|s| s.tags.iter().any(|t| t.starts_with("kuryr-rs.knp=")))
                .count();
            let ags = lab.client().list_address_groups(&f).await?.len();
            Ok((policy_sgs == 0 && ags == 0).then_some(()))
        })
        .await?;
        for p in &table.pods {
            remove(lab, &kube, &nodes, &p.wired).await?;
        }
        drop(ctrl);
        Ok(())
    })
}

/// Waits until the policy `name` is gone (its finalizer removed by the controller).
async fn deleted(api: &Api<NetworkPolicy>, name: &str) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(90);
    while api.get_opt(name).await?.is_some() {
        if Instant::now() > until {
            bail!("NetworkPolicy {name} still being deleted after 90 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
