//! The model against hand-written expectations: no servers.

use std::collections::BTreeSet;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

use super::*;

fn policy(ns: &str, name: &str, spec: Value) -> PolicySpec {
    let np: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": ns, "name": name}, "spec": spec,
    }))
    .expect("policy json");
    PolicySpec::parse(&np).expect("valid policy")
}

fn parse_err(spec: Value) -> PolicyError {
    let np: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"namespace": "x", "name": "bad"}, "spec": spec,
    }))
    .expect("policy json");
    PolicySpec::parse(&np).expect_err("invalid policy")
}

fn labels(kv: &[(&str, &str)]) -> Labels {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn pod(index: &mut ClusterIndex, ns: &str, name: &str, l: &[(&str, &str)], ip: &str) {
    index.pods.insert(
        PodKey::new(ns, name),
        PodInfo {
            uid: None,
            labels: labels(l),
            ips: vec![ip.parse().expect("ip")],
            named_ports: vec![],
        },
    );
}

/// namespaces x, y (labelled ns=<name>), pods a, b, c in each (label pod=<name>).
fn cluster() -> ClusterIndex {
    let mut index = ClusterIndex::default();
    for (n, ns) in ["x", "y"].iter().enumerate() {
        index.namespaces.insert(ns.to_string(), labels(&[("ns", ns)]));
        for (m, p) in ["a", "b", "c"].iter().enumerate() {
            pod(&mut index, ns, p, &[("pod", p)], &format!("10.0.{n}.{}", m + 1));
        }
    }
    index
}

fn c(s: &str) -> Cidr {
    s.parse().expect("cidr")
}

fn cidrs(list: &[&str]) -> BTreeSet<Cidr> {
    list.iter().map(|s| c(s)).collect()
}

fn base(d: &DesiredPolicy) -> &BTreeSet<Rule> {
    &d.groups[desired::BASE_VARIANT]
}

/// Applies `ops` to `actual` the way the handlers do, with fresh ids.
fn apply(actual: &mut ActualPolicy, ops: &[Op]) {
    let mut n = actual.groups.values().map(|g| g.rules.len()).sum::<usize>() + 1000;
    let mut next = || {
        n += 1;
        format!("id-{n}")
    };
    for op in ops {
        match op {
            Op::CreateGroup { variant } => {
                actual.groups.insert(
                    variant.clone(),
                    ActualGroup {
                        id: next(),
                        rules: vec![],
                    },
                );
            }
            Op::CreateAddressGroup { key, addresses } => {
                actual
                    .address_groups
                    .insert(key.clone(), (next(), addresses.iter().copied().collect()));
            }
            Op::DeleteRule { variant, id } => {
                let g = actual.groups.get_mut(variant).expect("group");
                g.rules.retain(|(i, _)| i != id);
            }
            Op::RemoveAddresses { key, addresses, .. } => {
                let g = actual.address_groups.get_mut(key).expect("ag");
                for a in addresses {
                    g.1.remove(a);
                }
            }
            Op::AddAddresses { key, addresses, .. } => {
                actual
                    .address_groups
                    .get_mut(key)
                    .expect("ag")
                    .1
                    .extend(addresses.iter().copied());
            }
            Op::CreateRule { variant, rule } => {
                let id = next();
                actual
                    .groups
                    .get_mut(variant)
                    .expect("group")
                    .rules
                    .push((id, rule.clone()));
            }
            Op::DeleteAddressGroup { key, .. } => {
                // Neutron refuses it while a rule names it (AddressGroupInUse).
                let in_use = actual
                    .groups
                    .values()
                    .flat_map(|g| &g.rules)
                    .any(|(_, r)| r.remote == Remote::Group(key.clone()));
                assert!(
                    !in_use,
                    "address group {key:?} deleted while a rule uses it: {ops:?}"
                );
                actual.address_groups.remove(key);
            }
            Op::DeleteGroup { variant, .. } => {
                actual.groups.remove(variant);
            }
        }
    }
}

#[test]
fn default_deny_ingress_selects_every_pod_and_keeps_egress_open() {
    let index = cluster();
    let p = policy(
        "x",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    let d = desired(&p, &index, &Options::default());
    assert!(base(&d).is_empty(), "no rule: nothing may come in");
    assert_eq!(d.members.len(), 3, "every pod of x, none of y");
    assert!(d.members.keys().all(|k| k.namespace == "x"));
    let info = &index.pods[&PodKey::new("x", "a")];
    assert_eq!(
        pod_security("x", info, std::slice::from_ref(&p)),
        PodSecurity::Selected {
            groups: vec![(p.key.clone(), desired::BASE_VARIANT.into())],
            open_ingress: false,
            open_egress: true,
        }
    );
    assert_eq!(
        pod_security("y", &index.pods[&PodKey::new("y", "a")], &[p]),
        PodSecurity::Unselected,
        "a pod no policy selects allows everything"
    );
}

#[test]
fn implicit_policy_types_and_union_of_policies() {
    let only_egress_rules = policy(
        "x",
        "e",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "egress": [{"to": [{"podSelector": {}}]}]}),
    );
    assert!(only_egress_rules.ingress.is_some(), "Ingress is always implied");
    assert!(
        only_egress_rules.egress.is_some(),
        "Egress is implied by egress rules"
    );
    let ingress_only = policy("x", "i", json!({"podSelector": {}}));
    assert!(ingress_only.egress.is_none());
    let egress_only = policy("x", "o", json!({"podSelector": {}, "policyTypes": ["Egress"]}));
    let info = &cluster().pods[&PodKey::new("x", "b")];
    // One policy isolates ingress, the other egress: the pod is isolated both ways, and the
    // policy groups themselves never open a direction.
    match pod_security("x", info, &[ingress_only, egress_only]) {
        PodSecurity::Selected {
            groups,
            open_ingress,
            open_egress,
        } => {
            assert_eq!(groups.len(), 2);
            assert!(!open_ingress && !open_egress);
        }
        other => panic!("expected selected, got {other:?}"),
    }
}

#[test]
fn pod_peer_is_an_address_group_and_rules_are_deduplicated() {
    let index = cluster();
    let p = policy(
        "x",
        "web",
        json!({
            "podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}], "ports": [{"port": 80}]},
                // The same rule again, and the same peer with another port.
                {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}], "ports": [{"port": 80, "protocol": "TCP"}]},
                {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}], "ports": [{"port": 81, "endPort": 90, "protocol": "UDP"}]},
            ],
        }),
    );
    let d = desired(&p, &index, &Options::default());
    assert_eq!(d.address_groups.len(), 1, "one group per distinct peer");
    let (key, addrs) = d.address_groups.iter().next().expect("group");
    assert_eq!(addrs, &cidrs(&["10.0.0.2/32"]), "x/b only");
    let rules = base(&d);
    assert_eq!(
        rules.len(),
        4,
        "tcp 80 and udp 81-90, each IPv4 and IPv6: {rules:?}"
    );
    assert!(rules.contains(&Rule {
        direction: Direction::Ingress,
        ethertype: EtherType::V4,
        protocol: Some(Protocol::Udp),
        ports: Some((81, 90)),
        remote: Remote::Group(key.clone()),
    }));
}

#[test]
fn relabelling_a_pod_is_one_address_group_update_and_no_rule_change() {
    let mut index = cluster();
    let p = policy(
        "x",
        "web",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "client"}}}]}]}),
    );
    let opts = Options::default();
    let mut actual = ActualPolicy::default();
    let ops = diff(&desired(&p, &index, &opts), &actual);
    apply(&mut actual, &ops);
    assert!(
        diff(&desired(&p, &index, &opts), &actual).is_empty(),
        "applied state is converged"
    );

    index
        .pods
        .get_mut(&PodKey::new("y", "c"))
        .expect("pod")
        .labels
        .insert("role".into(), "client".into());
    let ops = diff(&desired(&p, &index, &opts), &actual);
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(
        matches!(&ops[0], Op::AddAddresses { addresses, .. } if addresses == &vec![c("10.0.1.3/32")]),
        "{ops:?}"
    );
    apply(&mut actual, &ops);

    index
        .pods
        .get_mut(&PodKey::new("y", "c"))
        .expect("pod")
        .labels
        .remove("role");
    let ops = diff(&desired(&p, &index, &opts), &actual);
    assert!(
        matches!(ops.as_slice(), [Op::RemoveAddresses { addresses, .. }] if addresses == &vec![c("10.0.1.3/32")]),
        "{ops:?}"
    );
}

/// Neutron stores 1-65535 as no range: the rule wanted is the one it reads back, or every
/// resync would delete and make it again (dropping connections in between).
#[test]
fn the_whole_port_range_is_wanted_as_no_range() {
    let index = cluster();
    let p = policy(
        "x",
        "wide",
        json!({
            "podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}],
                         "ports": [{"protocol": "TCP", "port": 1, "endPort": 65535},
                                   {"protocol": "UDP", "port": 2, "endPort": 65535}]}],
        }),
    );
    let d = desired(&p, &index, &Options::default());
    let rules = base(&d);
    let ports = |proto: Protocol| -> Vec<Option<(u16, u16)>> {
        rules
            .iter()
            .filter(|r| r.direction == Direction::Ingress && r.protocol == Some(proto))
            .map(|r| r.ports)
            .collect()
    };
    assert!(ports(Protocol::Tcp).iter().all(Option::is_none), "{rules:?}");
    assert!(!ports(Protocol::Tcp).is_empty(), "{rules:?}");
    assert!(
        ports(Protocol::Udp).iter().all(|p| *p == Some((2, 65535))),
        "{rules:?}"
    );
}

/// An ipBlock of every address is the rule of no peer for its family, as Neutron's duplicate
/// check takes it: next to a peerless rule on the same port it is one rule, not a second one
/// Neutron refuses as existing at every pass.
#[test]
fn an_ip_block_of_every_address_is_no_remote() {
    let index = cluster();
    let p = policy(
        "x",
        "open-443",
        json!({
            "podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443}]},
                        {"ports": [{"port": 443}]},
                        {"from": [{"ipBlock": {"cidr": "::/0"}}], "ports": [{"port": 8443}]}],
        }),
    );
    let d = desired(&p, &index, &Options::default());
    let rules: Vec<Rule> = base(&d)
        .iter()
        .filter(|r| r.direction == Direction::Ingress)
        .cloned()
        .collect();
    let rule = |ethertype, port| Rule {
        direction: Direction::Ingress,
        ethertype,
        protocol: Some(Protocol::Tcp),
        ports: Some((port, port)),
        remote: Remote::Any,
    };
    assert_eq!(
        rules,
        [
            rule(EtherType::V4, 443),
            rule(EtherType::V6, 443),
            rule(EtherType::V6, 8443)
        ],
        "{rules:?}"
    );
}

#[test]
fn sctp_ports_and_ranges_become_sctp_rules_and_egress_ip_blocks_keep_their_protocol() {
    let index = cluster();
    let p = policy(
        "x",
        "signalling",
        json!({
            "podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}],
                         "ports": [{"protocol": "SCTP", "port": 3868},
                                   {"protocol": "SCTP", "port": 2905, "endPort": 2910}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}],
                        "ports": [{"protocol": "SCTP", "port": 38412}]}],
        }),
    );
    let d = desired(&p, &index, &Options::default());
    let (key, _) = d.address_groups.iter().next().expect("the x/b peer group");
    let rules = base(&d);
    for ports in [(3868, 3868), (2905, 2910)] {
        assert!(
            rules.contains(&Rule {
                direction: Direction::Ingress,
                ethertype: EtherType::V4,
                protocol: Some(Protocol::Sctp),
                ports: Some(ports),
                remote: Remote::Group(key.clone()),
            }),
            "sctp {ports:?} from x/b: {rules:?}"
        );
    }
    assert!(
        rules.iter().any(|r| r.direction == Direction::Egress
            && r.protocol == Some(Protocol::Sctp)
            && r.ports == Some((38412, 38412))),
        "sctp egress to the block: {rules:?}"
    );
    assert!(
        rules
            .iter()
            .filter(|r| r.protocol.is_some())
            .all(|r| r.protocol == Some(Protocol::Sctp)),
        "no TCP or UDP rule opened for an SCTP-only policy: {rules:?}"
    );
    assert_eq!(Protocol::Sctp.neutron(), "sctp");
}

#[test]
fn namespace_and_pod_selector_in_one_peer_is_an_and() {
    let mut index = cluster();
    index
        .namespaces
        .get_mut("y")
        .expect("ns")
        .insert("team".into(), "blue".into());
    let p = policy(
        "x",
        "both",
        json!({"podSelector": {}, "ingress": [{"from": [{
            "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["blue"]}]},
            "podSelector": {"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["a"]}]},
        }]}]}),
    );
    let d = desired(&p, &index, &Options::default());
    let all: BTreeSet<Cidr> = d.address_groups.values().flatten().copied().collect();
    assert_eq!(all, cidrs(&["10.0.1.2/32", "10.0.1.3/32"]), "y/b and y/c");
}

#[test]
fn ip_block_except_is_exact_and_noted() {
    let p = policy(
        "x",
        "cidr",
        json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/24", "except": ["10.0.0.0/25"]}}], "ports": [{"port": 53, "protocol": "UDP"}]}]}),
    );
    let d = desired(&p, &cluster(), &Options::default());
    let rules: Vec<_> = base(&d).iter().collect();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].remote, Remote::Prefix(c("10.0.0.128/25")));
    assert_eq!(rules[0].direction, Direction::Egress);
    assert_eq!(rules[0].ports, Some((53, 53)));
    assert!(
        d.notes
            .iter()
            .any(|n| n.starts_with("spec.egress[0].to[0].ipBlock")),
        "{:?}",
        d.notes
    );
    assert!(d.address_groups.is_empty());
}

/// [`cluster`] with x/a declaring TCP port `http` as 80 and x/b as 8080 (x/c has no such port).
fn http_on_80_and_8080() -> ClusterIndex {
    let mut index = cluster();
    for (name, port) in [("a", 80), ("b", 8080)] {
        index
            .pods
            .get_mut(&PodKey::new("x", name))
            .expect("pod")
            .named_ports
            .push(("http".into(), Protocol::Tcp, port));
    }
    index
}

#[test]
fn ingress_named_port_gets_one_group_per_resolution() {
    let index = http_on_80_and_8080();
    let p = policy(
        "x",
        "named",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]}),
    );
    let d = desired(&p, &index, &Options::default());
    assert_eq!(d.groups.len(), 3, "base (x/c: no such port) + 80 + 8080");
    let va = &d.members[&PodKey::new("x", "a")];
    let vb = &d.members[&PodKey::new("x", "b")];
    assert_ne!(va, vb);
    assert_eq!(d.members[&PodKey::new("x", "c")], desired::BASE_VARIANT);
    let ports = |v: &str| -> BTreeSet<Option<(u16, u16)>> { d.groups[v].iter().map(|r| r.ports).collect() };
    assert_eq!(
        ports(va),
        [Some((80, 80))].into(),
        "x/a is not opened on b's port"
    );
    assert_eq!(ports(vb), [Some((8080, 8080))].into());
    assert!(d.groups[desired::BASE_VARIANT].is_empty());
}

#[test]
fn egress_named_port_splits_destinations_by_number() {
    let mut index = cluster();
    for (ns, name, port) in [("y", "a", 5353), ("y", "b", 53)] {
        index
            .pods
            .get_mut(&PodKey::new(ns, name))
            .expect("pod")
            .named_ports
            .push(("dns".into(), Protocol::Udp, port));
    }
    let p = policy(
        "x",
        "dns",
        json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": "dns", "protocol": "UDP"}]}]}),
    );
    let d = desired(&p, &index, &Options::default());
    let mut by_port: Vec<(u16, BTreeSet<Cidr>)> = base(&d)
        .iter()
        .filter(|r| r.ethertype == EtherType::V4)
        .map(|r| {
            let Remote::Group(k) = &r.remote else {
                panic!("group remote expected: {r:?}")
            };
            (r.ports.expect("ports").0, d.address_groups[k].clone())
        })
        .collect();
    by_port.sort();
    assert_eq!(
        by_port,
        vec![(53, cidrs(&["10.0.1.2/32"])), (5353, cidrs(&["10.0.1.1/32"]))]
    );
}

/// Egress to pods on their port admits the Services in front of them on the Service's port,
/// where the client sends (the load balancer forwards to the pods' port afterwards).
#[test]
fn egress_to_a_service_backend_port_admits_its_vip_on_the_service_port() {
    use crate::policies::index::{ServicePort, TargetPort};
    let mut index = cluster();
    if let Some(b) = index.pods.get_mut(&PodKey::new("y", "b")) {
        b.named_ports = vec![("http".into(), Protocol::Tcp, 8080)];
    }
    let svc = |vip: &str, ports: Vec<ServicePort>| ServiceInfo {
        vips: vec![vip.parse().expect("ip")],
        selector: Some(labels(&[("pod", "b")])),
        ports,
        endpoints: vec![],
    };
    let tcp = |port: u16, target: TargetPort| ServicePort {
        name: String::new(),
        protocol: Protocol::Tcp,
        port,
        target,
    };
    index.services.insert(
        ("y".into(), "web".into()),
        svc(
            "172.30.0.10",
            vec![
                tcp(80, TargetPort::Number(8080)),
                tcp(9000, TargetPort::Number(9000)),
            ],
        ),
    );
    index.services.insert(
        ("y".into(), "named".into()),
        svc("172.30.0.11", vec![tcp(8000, TargetPort::Name("http".into()))]),
    );
    index.services.insert(
        ("y".into(), "dns".into()),
        svc(
            "172.30.0.12",
            vec![ServicePort {
                name: String::new(),
                protocol: Protocol::Udp,
                port: 53,
                target: TargetPort::Number(8080),
            }],
        ),
    );
    let vip_rules = |spec: Value| -> BTreeSet<(u16, BTreeSet<Cidr>)> {
        let p = policy("x", "out", spec);
        let d = desired(&p, &index, &Options::default());
        base(&d)
            .iter()
            .filter(|r| r.direction == Direction::Egress && r.ethertype == EtherType::V4)
            .filter_map(|r| match &r.remote {
                Remote::Group(k) if k.0.contains("-vips") => {
                    Some((r.ports.expect("a port").0, d.address_groups[k].clone()))
                }
                _ => None,
            })
            .collect()
    };
    let to_b = |ports: Value| {
        json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}], "ports": ports}]})
    };
    assert_eq!(
        vip_rules(to_b(json!([{"port": 8080}]))),
        [
            (80, cidrs(&["172.30.0.10/32"])),
            (8000, cidrs(&["172.30.0.11/32"]))
        ]
        .into(),
        "the Service ports that forward to 8080 (by number, and by the name the pod gives it); not UDP's"
    );
    assert_eq!(
        vip_rules(to_b(json!([{"port": "http"}]))),
        [
            (80, cidrs(&["172.30.0.10/32"])),
            (8000, cidrs(&["172.30.0.11/32"]))
        ]
        .into()
    );
    assert_eq!(
        vip_rules(to_b(json!([{"port": 9000, "endPort": 9100}]))),
        [(9000, cidrs(&["172.30.0.10/32"]))].into()
    );
    assert!(
        vip_rules(to_b(json!([{"port": 7777}]))).is_empty(),
        "no Service forwards to 7777"
    );
    // To any destination on a port: the Services forwarding to it too.
    let anywhere =
        json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": 8080}]}]});
    assert_eq!(
        vip_rules(anywhere),
        [
            (80, cidrs(&["172.30.0.10/32"])),
            (8000, cidrs(&["172.30.0.11/32"]))
        ]
        .into()
    );
    // To an ipBlock holding the backends.
    let block = json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.0.1.0/24"}}],
        "ports": [{"port": 8080}]}]});
    assert_eq!(
        vip_rules(block),
        [
            (80, cidrs(&["172.30.0.10/32"])),
            (8000, cidrs(&["172.30.0.11/32"]))
        ]
        .into()
    );
}

/// A VIP is admitted for the backends behind the peer that could take its traffic: not for a
/// backend an ipBlock excepts, not in a family no reached backend has (an IPv4 block admits no
/// IPv6 VIP), not for a peer pod without an address. A block holding one of a Service's two
/// backends admits its VIP: OVN checks the client's egress again on the backend the load balancer
/// picks, so the other backend stays blocked (crates/kuryr-e2e/tests/ovn_services.rs).
#[test]
fn a_vip_is_admitted_for_the_backends_behind_the_peer() {
    use crate::policies::index::{ServicePort, TargetPort};
    let mut index = cluster();
    let http = vec![ServicePort {
        name: String::new(),
        protocol: Protocol::Tcp,
        port: 80,
        target: TargetPort::Number(80),
    }];
    let svc = |vips: &[&str], sel: &[(&str, &str)]| ServiceInfo {
        vips: vips.iter().map(|v| v.parse().expect("ip")).collect(),
        selector: Some(labels(sel)),
        ports: http.clone(),
        endpoints: vec![],
    };
    // x/b behind s-x-b (dual-stack VIPs, IPv4 pod); x/a and x/c behind "two".
    index.services.insert(
        ("x".into(), "s-x-b".into()),
        svc(&["10.96.0.11", "fd00:96::11"], &[("pod", "b")]),
    );
    index.services.insert(
        ("x".into(), "two".into()),
        svc(&["10.96.0.12"], &[("app", "two")]),
    );
    for p in ["a", "c"] {
        if let Some(i) = index.pods.get_mut(&PodKey::new("x", p)) {
            i.labels.insert("app".into(), "two".into());
        }
    }
    // x/d: a peer pod with no address yet, behind "pending".
    index.pods.insert(
        PodKey::new("x", "d"),
        PodInfo {
            uid: None,
            labels: labels(&[("pod", "d")]),
            ips: vec![],
            named_ports: vec![],
        },
    );
    index.services.insert(
        ("x".into(), "pending".into()),
        svc(&["10.96.0.13"], &[("pod", "d")]),
    );
    let vips = |to: Value| -> BTreeSet<Cidr> {
        let p = policy(
            "x",
            "out",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [to], "ports": [{"port": 80}]}]}),
        );
        let d = desired(&p, &index, &Options::default());
        base(&d)
            .iter()
            .filter_map(|r| match &r.remote {
                Remote::Group(k) if k.0.contains("-vips") => Some(d.address_groups[k].clone()),
                _ => None,
            })
            .flatten()
            .collect()
    };
    let except_b = vips(json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.2/32"]}}));
    assert!(
        !except_b.contains(&c("10.96.0.11/32")),
        "x/b excepted: not its VIP"
    );
    assert!(
        except_b.contains(&c("10.96.0.12/32")),
        "two's backends in the block"
    );
    let whole = vips(json!({"ipBlock": {"cidr": "10.0.0.0/16"}}));
    assert!(whole.contains(&c("10.96.0.11/32")), "x/b in the block: its VIP");
    assert!(
        !whole.contains(&c("fd00:96::11/128")),
        "an IPv4 block reaches no IPv6 backend: {whole:?}"
    );
    let one_of_two = vips(json!({"ipBlock": {"cidr": "10.0.0.3/32"}}));
    assert!(
        one_of_two.contains(&c("10.96.0.12/32")),
        "x/c, one of two's backends"
    );
    let to_d = vips(json!({"podSelector": {"matchLabels": {"pod": "d"}}}));
    assert!(
        to_d.is_empty(),
        "a peer without an address is behind no Service: {to_d:?}"
    );
}

/// A Service without a selector (`kubernetes.default`: its EndpointSlice names the API servers)
/// is in front of the addresses of its slices: egress to them admits its VIP on the Service's
/// port, as egress to a selector's pods does. An ipBlock must hold all of them, a pod peer one.
#[test]
fn egress_to_the_endpoints_of_a_service_without_a_selector_admits_its_vip() {
    use crate::policies::index::{ServicePort, TargetPort};
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let mut index = cluster();
    let service = |name: &str, vip: &str| -> ServiceInfo {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": name},
            "spec": {"clusterIP": vip, "ports": [{"name": "https", "port": 443, "targetPort": 6443}]}
        }))
        .expect("service json");
        ServiceInfo::from_service(&svc)
    };
    let slice = |ips: &[&str], ready: bool| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": "s"}, "addressType": "IPv4",
            "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": ready}})).collect::<Vec<_>>(),
            "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]
        }))
        .expect("slice json")
    };
    index.services.insert(
        ("default".into(), "kubernetes".into()),
        service("kubernetes", "172.30.0.1").with_endpoint_slices(&[
            slice(&["192.168.0.10", "192.168.0.11"], true),
            slice(&["192.168.9.9"], false),
        ]),
    );
    // Backed by a pod's address (x/a is 10.0.0.1), as a hand-made Service may be.
    index.services.insert(
        ("default".into(), "by-hand".into()),
        service("by-hand", "172.30.0.2").with_endpoint_slices(&[slice(&["10.0.0.1"], true)]),
    );
    let api = &index.services[&("default".to_string(), "kubernetes".to_string())];
    assert_eq!(
        api.endpoints.len(),
        2,
        "a not-ready address is no backend: {api:?}"
    );
    assert_eq!(
        api.ports,
        [ServicePort {
            name: "https".into(),
            protocol: Protocol::Tcp,
            port: 443,
            target: TargetPort::Number(6443)
        }]
    );
    let vip_rules = |to: Value, ports: Value| -> BTreeSet<(Option<u16>, BTreeSet<Cidr>)> {
        let spec =
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": to, "ports": ports}]});
        let d = desired(&policy("x", "out", spec), &index, &Options::default());
        base(&d)
            .iter()
            .filter(|r| r.direction == Direction::Egress && r.ethertype == EtherType::V4)
            .filter_map(|r| match &r.remote {
                Remote::Group(k) if k.0.contains("-vips") => {
                    Some((r.ports.map(|p| p.0), d.address_groups[k].clone()))
                }
                _ => None,
            })
            .collect()
    };
    let masters = json!([{"ipBlock": {"cidr": "192.168.0.0/24"}}]);
    assert_eq!(
        vip_rules(masters.clone(), json!([{"port": 6443}])),
        [(Some(443), cidrs(&["172.30.0.1/32"]))].into(),
        "the API servers' port admits the VIP on the Service's"
    );
    assert_eq!(
        vip_rules(masters.clone(), json!([{"protocol": "TCP"}])),
        [(None, cidrs(&["172.30.0.1/32"]))].into(),
        "every TCP port of the backends: every TCP port of the VIP"
    );
    assert!(
        vip_rules(masters, json!([{"port": 443}])).is_empty(),
        "nothing serves 443 behind it"
    );
    assert!(
        vip_rules(
            json!([{"ipBlock": {"cidr": "192.168.0.10/32"}}]),
            json!([{"port": 6443}])
        )
        .is_empty(),
        "a block holding one API server of two: the load balancer may pick the other"
    );
    assert!(
        vip_rules(
            json!([{"ipBlock": {"cidr": "192.168.0.0/24", "except": ["192.168.0.11/32"]}}]),
            json!([{"port": 6443}])
        )
        .is_empty(),
        "nor one whose except leaves one out"
    );
    assert_eq!(
        vip_rules(
            json!([{"podSelector": {"matchLabels": {"pod": "a"}}}]),
            json!([{"port": 6443}])
        ),
        [(Some(443), cidrs(&["172.30.0.2/32"]))].into(),
        "a pod peer: the Service whose slice has the pod's address"
    );
    assert!(
        vip_rules(
            json!([{"podSelector": {"matchLabels": {"pod": "a"}}}]),
            json!([{"port": "https"}])
        )
        .is_empty(),
        "a named port names a pod's container port, not a slice's"
    );
    // Anywhere on the backends' port.
    let spec = json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": 6443}]}]});
    let d = desired(&policy("x", "out", spec), &index, &Options::default());
    let vips: BTreeSet<Cidr> = base(&d)
        .iter()
        .filter_map(|r| match &r.remote {
            Remote::Group(k) if k.0.contains("-vips") && r.ports == Some((443, 443)) => {
                Some(d.address_groups[k].clone())
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(vips, cidrs(&["172.30.0.1/32", "172.30.0.2/32"]));
    // A dual-stack API: an IPv4 block holding its IPv4 servers still admits it.
    let api = index
        .services
        .get_mut(&("default".to_string(), "kubernetes".to_string()))
        .expect("svc");
    let ports = api.endpoints[0].ports.clone();
    api.endpoints.push(crate::policies::index::Backend {
        ip: "fd00::10".parse().expect("ip"),
        ports,
    });
    let spec = json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
        "to": [{"ipBlock": {"cidr": "192.168.0.0/24"}}], "ports": [{"port": 6443}]}]});
    let d = desired(&policy("x", "out", spec), &index, &Options::default());
    assert!(
        base(&d).iter().any(|r| r.ports == Some((443, 443))
            && matches!(&r.remote, Remote::Group(k) if d.address_groups[k].contains(&c("172.30.0.1/32")))),
        "{:?}",
        base(&d)
    );
}

#[test]
fn service_vip_hook() {
    let mut index = cluster();
    index.services.insert(
        ("y".into(), "svc-b".into()),
        ServiceInfo {
            vips: vec!["172.30.0.10".parse().expect("ip")],
            selector: Some(labels(&[("pod", "b")])),
            ports: vec![],
            endpoints: vec![],
        },
    );
    index.services.insert(
        ("x".into(), "svc-x".into()),
        ServiceInfo {
            vips: vec!["172.30.0.20".parse().expect("ip")],
            selector: Some(labels(&[("pod", "zzz")])),
            ports: vec![],
            endpoints: vec![],
        },
    );
    let p = policy(
        "x",
        "to-b",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    );
    let opts = Options {
        host_cidrs: vec![c("192.168.0.0/24")],
        namespace_service_vips: true,
    };
    let d = desired(&p, &index, &opts);
    let egress: BTreeSet<BTreeSet<Cidr>> = base(&d)
        .iter()
        .filter_map(|r| match (&r.direction, &r.remote) {
            (Direction::Egress, Remote::Group(k)) if r.protocol.is_none() => {
                Some(d.address_groups[k].clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        egress,
        [cidrs(&["10.0.0.2/32", "10.0.1.2/32"]), cidrs(&["172.30.0.10/32"])].into(),
        "the pods, and the VIP of the Service in front of them, on every port"
    );
    assert_eq!(
        d.address_groups[&AgKey("i-service-vips".into())],
        cidrs(&["172.30.0.20/32"]),
        "hairpin: the VIPs of the policy's namespace"
    );
    assert!(
        base(&d)
            .iter()
            .any(|r| r.remote == Remote::Prefix(c("192.168.0.0/24"))
                && r.direction == Direction::Ingress
                && r.protocol.is_none())
    );
}

#[test]
fn allow_all_subsumes_narrower_rules() {
    let p = policy(
        "x",
        "open",
        json!({"podSelector": {}, "ingress": [{}, {"from": [{"podSelector": {}}], "ports": [{"port": 80}]}]}),
    );
    let d = desired(&p, &cluster(), &Options::default());
    assert_eq!(base(&d).len(), 2, "allow-all IPv4 and IPv6 only: {:?}", base(&d));
    assert!(
        base(&d)
            .iter()
            .all(|r| r.remote == Remote::Any && r.protocol.is_none())
    );
    assert!(
        d.address_groups.is_empty(),
        "no rule points at the peer group any more"
    );
}

#[test]
fn policy_update_removes_before_it_adds_and_drops_duplicates() {
    let index = cluster();
    let opts = Options::default();
    let old = policy(
        "x",
        "p",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]}),
    );
    let new = policy(
        "x",
        "p",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": 81}]}]}),
    );
    let mut actual = ActualPolicy::default();
    let ops = diff(&desired(&old, &index, &opts), &actual);
    apply(&mut actual, &ops);
    // A crash after creating a rule and before recording it leaves a duplicate.
    let dup = actual.groups[desired::BASE_VARIANT].rules[0].1.clone();
    actual
        .groups
        .get_mut(desired::BASE_VARIANT)
        .expect("group")
        .rules
        .push(("dup".into(), dup));
    let ops = diff(&desired(&new, &index, &opts), &actual);
    let kinds: Vec<&str> = ops
        .iter()
        .map(|o| match o {
            Op::DeleteRule { .. } => "delete",
            Op::CreateRule { .. } => "create",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["delete", "delete", "delete", "create", "create"]);
    apply(&mut actual, &ops);
    assert!(diff(&desired(&new, &index, &opts), &actual).is_empty());
}

#[test]
fn deleted_policy_state_is_removed_address_groups_last() {
    let index = cluster();
    let p = policy(
        "x",
        "p",
        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
    );
    let mut actual = ActualPolicy::default();
    let ops = diff(&desired(&p, &index, &Options::default()), &actual);
    apply(&mut actual, &ops);
    let ops = diff(&DesiredPolicy::default(), &actual);
    assert!(matches!(ops.last(), Some(Op::DeleteAddressGroup { .. })));
    apply(&mut actual, &ops);
    assert_eq!(actual, ActualPolicy::default());
}

/// A named port's variant group no longer wanted (the policy edited to deny all) goes before the
/// address group its rules name: Neutron refuses an address group in use, and the edit was never
/// carried out (the variant kept admitting its peers).
#[test]
fn an_edit_dropping_a_named_port_variant_deletes_its_group_before_the_address_group() {
    let index = http_on_80_and_8080();
    let p = policy(
        "x",
        "named",
        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "c"}}}], "ports": [{"port": "http"}]}]}),
    );
    let mut actual = ActualPolicy::default();
    let ops = diff(&desired(&p, &index, &Options::default()), &actual);
    apply(&mut actual, &ops);
    assert!(!actual.address_groups.is_empty());
    let deny = policy("x", "named", json!({"podSelector": {}, "ingress": []}));
    let want = desired(&deny, &index, &Options::default());
    let ops = diff(&want, &actual);
    apply(&mut actual, &ops);
    assert!(actual.address_groups.is_empty());
    assert_eq!(actual.groups.len(), 1, "the base group only: {actual:?}");
    assert!(diff(&want, &actual).is_empty());
}

#[test]
fn malformed_content_names_the_field() {
    let e = parse_err(
        json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]}),
    );
    assert_eq!(e.field, "spec.ingress[0].from[0].ipBlock");
    let e = parse_err(json!({"podSelector": {}, "egress": [{"ports": [{"port": "http", "endPort": 90}]}]}));
    assert_eq!(e.field, "spec.egress[0].ports[0].endPort");
    let e = parse_err(json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80, "protocol": "ICMP"}]}]}));
    assert_eq!(e.field, "spec.ingress[0].ports[0].protocol");
    let e = parse_err(
        json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.1.0.0/24"]}}]}]}),
    );
    assert_eq!(e.field, "spec.ingress[0].from[0].ipBlock.except[0]");
    let e = parse_err(json!({"podSelector": {}, "policyTypes": ["Sideways"]}));
    assert_eq!(e.field, "spec.policyTypes[0]");
    let e = parse_err(json!({"podSelector": {}, "ingress": [{"ports": [{"port": 90, "endPort": 80}]}]}));
    assert_eq!(e.field, "spec.ingress[0].ports[0].endPort");
}

#[test]
fn a_200_pod_namespace_costs_a_handful_of_writes_and_the_201st_pod_one() {
    let mut index = ClusterIndex::default();
    index.namespaces.insert("big".into(), labels(&[("ns", "big")]));
    for i in 0..200u32 {
        pod(
            &mut index,
            "big",
            &format!("p{i}"),
            &[("app", "api")],
            &format!("10.1.{}.{}", i / 250, i % 250 + 1),
        );
    }
    // Three ports: upstream writes one rule per pod IP and port (600 rules here).
    let p = policy(
        "big",
        "api",
        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "api"}}}],
               "ports": [{"port": 80}, {"port": 443}, {"port": 8080, "protocol": "UDP"}]}]}),
    );
    let opts = Options::default();
    let mut actual = ActualPolicy::default();
    let ops = diff(&desired(&p, &index, &opts), &actual);
    // One group, one address group with the 200 addresses, 3 ports x 2 ethertypes.
    assert_eq!(ops.len(), 8, "{ops:?}");
    apply(&mut actual, &ops);
    pod(&mut index, "big", "p200", &[("app", "api")], "10.1.9.9");
    let ops = diff(&desired(&p, &index, &opts), &actual);
    assert!(
        matches!(ops.as_slice(), [Op::AddAddresses { addresses, .. }] if addresses == &vec![c("10.1.9.9/32")]),
        "{ops:?}"
    );
}

#[test]
fn the_tracker_reconciles_only_the_policies_a_relabel_or_a_namespace_change_moves() {
    let opts = Options {
        host_cidrs: vec![],
        namespace_service_vips: true,
    };
    let from_b = policy(
        "x",
        "from-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    );
    let from_y = policy(
        "x",
        "from-y",
        json!({"podSelector": {"matchLabels": {"pod": "c"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}]}),
    );
    let mut t = PolicyTracker::new(
        cluster(),
        [("u1".to_string(), from_b), ("u2".to_string(), from_y)].into(),
    );
    // Each call answers for the changes since the previous one (the stale ones are reconciled).
    let uids = |t: &mut PolicyTracker| -> Vec<String> {
        let stale = t.stale(&opts);
        let uids = stale.iter().map(|(u, _, _)| u.clone()).collect();
        for (uid, _, want) in stale {
            t.record_applied(&uid, want);
        }
        uids
    };
    let relabel = |t: &mut PolicyTracker, ns: &str, name: &str, value: &str| {
        let key = PodKey::new(ns, name);
        let mut info = t.cluster().pods[&key].clone();
        info.labels.insert("pod".into(), value.into());
        t.set_pod_info(key, Some(info));
    };
    assert_eq!(uids(&mut t), ["u1", "u2"], "nothing applied yet");
    assert!(uids(&mut t).is_empty(), "applied and unchanged");

    // y/a relabelled, but no policy selects or admits pod=b of y: nothing to do.
    relabel(&mut t, "y", "a", "b");
    assert!(uids(&mut t).is_empty());
    // x/c becomes pod=b: a peer of from-b only (and no longer selected by from-y).
    relabel(&mut t, "x", "c", "b");
    assert_eq!(uids(&mut t), ["u1", "u2"]);
    // Namespace y joins team blue: only from-y's peer moves.
    t.set_namespace_labels("y", Some(labels(&[("ns", "y"), ("team", "blue")])));
    t.set_pod_info(
        PodKey::new("x", "c2"),
        Some(PodInfo {
            uid: None,
            labels: labels(&[("pod", "c")]),
            ips: vec!["10.0.0.9".parse().expect("ip")],
            named_ports: vec![],
        }),
    );
    assert_eq!(uids(&mut t), ["u2"]);
    // Namespace y's deletion starts: its labels hold until it is gone (its pods still run).
    let mut terminating: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "y",
        "labels": {"ns": "y", "team": "blue"}, "deletionTimestamp": "2026-12-01T00:00:00Z"}}))
        .expect("namespace");
    t.observe_namespace(&terminating);
    assert!(uids(&mut t).is_empty(), "still team blue");
    terminating.metadata.labels = Some([("ns".to_string(), "y".to_string())].into());
    t.observe_namespace(&terminating);
    assert_eq!(uids(&mut t), ["u2"], "relabelled while terminating");
    t.set_namespace_labels("y", None);
    assert!(uids(&mut t).is_empty(), "no longer team blue: nothing more moves");
    t.set_namespace_labels("y", Some(labels(&[("ns", "y"), ("team", "blue")])));
    assert_eq!(uids(&mut t), ["u2"]);
    // A failed reconcile is retried on the next change even if that change moves nothing.
    t.forget_applied("u1");
    assert_eq!(uids(&mut t), ["u1"]);
    t.forget_applied("u1");
    t.remove_policy("u1");
    assert!(uids(&mut t).is_empty());
}

/// The tracker computes after a pod event only the policies that can see the pod: over a long
/// run of random pod (labels, addresses, named ports, deletion) and namespace label changes,
/// with a Service in front of some pods, it finds exactly the policies a full recomputation of
/// every policy finds moved, never fewer.
#[test]
fn the_tracker_finds_every_moved_policy_a_full_recomputation_finds() {
    use crate::policies::index::{ServicePort, TargetPort};
    let opts = Options {
        host_cidrs: vec![],
        namespace_service_vips: true,
    };
    let namespaces = ["x", "y", "z"];
    let pods = ["a", "b", "c", "d"];
    let mut index = ClusterIndex::default();
    for (n, ns) in namespaces.iter().enumerate() {
        index.namespaces.insert(ns.to_string(), labels(&[("ns", ns)]));
        for (m, p) in pods.iter().enumerate() {
            pod(&mut index, ns, p, &[("pod", p)], &format!("10.0.{n}.{}", m + 1));
        }
    }
    index.services.insert(
        ("z".into(), "web".into()),
        ServiceInfo {
            vips: vec!["172.30.0.1".parse().expect("ip")],
            selector: Some(labels(&[("pod", "b")])),
            ports: vec![ServicePort {
                name: String::new(),
                protocol: Protocol::Tcp,
                port: 80,
                target: TargetPort::Number(8080),
            }],
            endpoints: vec![],
        },
    );
    let specs = [
        (
            "x",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        ),
        (
            "x",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}, "podSelector": {"matchLabels": {"pod": "c"}}}]}]}),
        ),
        (
            "y",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": 8080}]}]}),
        ),
        (
            "y",
            json!({"podSelector": {"matchLabels": {"pod": "d"}}, "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.0.2.0/24"}}], "ports": [{"port": 8080}]}]}),
        ),
        (
            "z",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]}]}),
        ),
        (
            "z",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}], "ports": [{"port": "http"}]}]}),
        ),
    ];
    let policies = specs
        .iter()
        .enumerate()
        .map(|(i, (ns, spec))| (format!("u{i}"), policy(ns, &format!("p{i}"), spec.clone())))
        .collect();
    let mut t = PolicyTracker::new(index, policies);
    for (uid, _, want) in t.stale(&opts) {
        t.record_applied(&uid, want);
    }
    // A small deterministic generator (xorshift): the same run every time.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let values = ["a", "b", "c", "d", "e"];
    for step in 0..3000 {
        let ns = namespaces[next(namespaces.len())];
        let name = pods[next(pods.len())];
        let key = PodKey::new(ns, name);
        match next(10) {
            0 => {
                let team = if next(2) == 0 { "blue" } else { "red" };
                t.set_namespace_labels(ns, Some(labels(&[("ns", ns), ("team", team)])));
            }
            1 => t.set_pod_info(key, None),
            _ => {
                let mut info = t.cluster().pods.get(&key).cloned().unwrap_or_else(|| PodInfo {
                    uid: None,
                    labels: labels(&[("pod", name)]),
                    ips: vec![],
                    named_ports: vec![],
                });
                match next(3) {
                    0 => {
                        info.labels
                            .insert("pod".into(), values[next(values.len())].into());
                    }
                    1 => {
                        let ip = format!("10.0.{}.{}", next(3), next(6) + 1);
                        info.ips = vec![ip.parse().expect("ip")];
                    }
                    _ => {
                        info.named_ports = if next(2) == 0 {
                            vec![("http".into(), Protocol::Tcp, 8080 + next(2) as u16)]
                        } else {
                            vec![]
                        };
                    }
                }
                t.set_pod_info(key, Some(info));
            }
        }
        // What a recomputation of every policy finds moved, against what the tracker finds.
        let full: Vec<String> = t
            .policies
            .iter()
            .filter(|(uid, spec)| t.applied(uid) != Some(&desired(spec, t.cluster(), &opts)))
            .map(|(uid, _)| uid.clone())
            .collect();
        let stale = t.stale(&opts);
        let found: Vec<String> = stale.iter().map(|(u, _, _)| u.clone()).collect();
        assert_eq!(found, full, "step {step}");
        for (uid, _, want) in stale {
            t.record_applied(&uid, want);
        }
    }
}

#[test]
fn a_finished_or_host_network_pod_stands_for_no_address() {
    let pod = |phase: &str, host_network: bool| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "a"}},
            "spec": {"hostNetwork": host_network,
                     "containers": [{"name": "c", "ports": [{"name": "metrics", "containerPort": 9100}]}]},
            "status": {"phase": phase, "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]}
        }))
        .expect("pod")
    };
    let ip: std::net::IpAddr = "10.0.0.5".parse().expect("ip");
    assert_eq!(PodInfo::from_pod(&pod("Running", false)).ips, vec![ip]);
    assert_eq!(
        PodInfo::from_pod(&pod("Running", false)).resolve(Protocol::Tcp, "metrics"),
        Some(9100)
    );
    // No Neutron port, so no group variant for its named port either.
    let host = PodInfo::from_pod(&pod("Running", true));
    assert_eq!(host.resolve(Protocol::Tcp, "metrics"), None);
    assert_eq!(
        super::desired::variant_of(&host, &[(Protocol::Tcp, "metrics".to_string())]),
        super::desired::BASE_VARIANT
    );
    for (phase, host) in [("Succeeded", false), ("Failed", false), ("Running", true)] {
        let info = PodInfo::from_pod(&pod(phase, host));
        assert!(info.ips.is_empty(), "{phase}, hostNetwork {host}: {:?}", info.ips);
        assert_eq!(
            info.labels.get("app").map(String::as_str),
            Some("a"),
            "still indexed by its labels"
        );
    }
}

/// A StatefulSet's pod re-created under its name: the old pod's deletion, handled after the new
/// pod was seen (the pipeline keeps their events apart by uid), leaves the new one in the index.
#[test]
fn a_late_deletion_of_a_pods_predecessor_leaves_the_pod_indexed() {
    let pod = |uid: &str, ip: &str, deleting: bool| -> k8s_openapi::api::core::v1::Pod {
        let mut meta = json!({"name": "web-0", "namespace": "x", "uid": uid, "labels": {"app": "web"}});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-11-29T10:00:00Z");
        }
        serde_json::from_value(json!({
            "metadata": meta,
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIP": ip}
        }))
        .expect("pod")
    };
    let key = PodKey::new("x", "web-0");
    let mut index = ClusterIndex::default();
    index.observe_pod(&pod("u2", "10.0.0.9", false));
    index.observe_pod(&pod("u1", "10.0.0.5", true));
    index.remove_pod(&pod("u1", "10.0.0.5", false));
    let ips = index.pods.get(&key).map(|p| p.ips.clone());
    assert_eq!(ips, Some(vec!["10.0.0.9".parse().expect("ip")]));
    index.remove_pod(&pod("u2", "10.0.0.9", false));
    assert!(!index.pods.contains_key(&key), "its own deletion removes it");
}
