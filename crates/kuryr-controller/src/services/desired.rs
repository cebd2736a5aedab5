//! A KuryrLoadBalancer spec -> the Octavia tree it asks for. Pure.

use std::collections::{BTreeMap, BTreeSet};

use kuryr_crds::{KuryrLoadBalancerSpec, LbEndpointPort, LbEndpointSlice, LbSpecPort};

use crate::error::Error;

/// The Octavia provider that only balances by source IP and port.
pub const OVN_PROVIDER: &str = "ovn";

/// A load balancer as the spec wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredLb {
    pub name: String,
    pub vip_address: String,
    pub vip_subnet_id: String,
    pub project_id: String,
    pub provider: Option<String>,
    pub security_groups: Vec<String>,
    /// Keyed by (Octavia protocol, port): one listener per Service port.
    pub listeners: BTreeMap<(String, u16), DesiredListener>,
    /// Endpoint addresses left out: no member subnet holds them (L2 member mode).
    pub skipped: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredListener {
    pub name: String,
    pub protocol: String,
    pub port: u16,
    pub timeout_client_data: Option<u64>,
    pub timeout_member_data: Option<u64>,
    /// Octavia `allowed_cidrs`: `None` admits everyone, an empty list nobody (see `acls.rs`).
    pub allowed_cidrs: Option<Vec<String>>,
    pub pool: DesiredPool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredPool {
    pub name: String,
    pub protocol: String,
    pub lb_algorithm: String,
    /// Octavia session persistence type (`SOURCE_IP`), from `sessionAffinity: ClientIP`.
    pub persistence: Option<String>,
    /// Keyed by (address, port), the key Octavia's batch member update matches on.
    pub members: BTreeMap<(String, u16), DesiredMember>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredMember {
    /// `<namespace>/<pod>:<port>`, upstream's member name.
    pub name: String,
    pub address: String,
    pub port: u16,
    pub subnet_id: Option<String>,
}

/// What the tree depends on besides the spec.
pub struct Inputs<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// `[octavia_defaults] lb_algorithm`.
    pub lb_algorithm: &'a str,
    /// The subnet a member is reached on: the VIP subnet in L3 member mode, the pod's subnet in L2.
    /// `None` leaves the member out (its pod's subnet is not known yet).
    pub member_subnet: &'a dyn Fn(&str) -> Option<String>,
}

/// Which subnet each member is reached on, by `[octavia_defaults] member_mode` (upstream's
/// `_get_subnet_by_octavia_mode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberSubnets {
    /// L3: every member through the VIP subnet; Octavia routes to the pods.
    Vip(String),
    /// L2: a member on the pod subnet holding its address, so Octavia plugs into that network; an
    /// address on no pod subnet (a host-network pod's, a hand-written slice's) on the worker nodes'
    /// subnet holding it (`[pod_vif_nested] worker_nodes_subnets`), as upstream.
    Pod(Vec<(ipnet::IpNet, String)>),
}

impl MemberSubnets {
    /// The subnet of the member at `ip`; `None` (L2, no pod subnet holds it) leaves the member out until
    /// one does.
    pub fn of(&self, ip: &str) -> Option<String> {
        match self {
            Self::Vip(subnet) => Some(subnet.clone()),
            Self::Pod(subnets) => {
                let ip: std::net::IpAddr = ip.parse().ok()?;
                subnets
                    .iter()
                    .find(|(net, _)| net.contains(&ip))
                    .map(|(_, id)| id.clone())
            }
        }
    }
}

/// The port of `slice` serving the Service port `p`: the one of the same name (both unnamed for
/// a one-port Service). A Service port renamed reaches the KuryrLoadBalancer before the
/// EndpointSlice controller renames the slices' port: meanwhile a slice port whose name no
/// Service port has still serves `p` when its number is `p`'s numeric target port, or, for a
/// named target port, when it is the only such port of `p`'s protocol and `p` the only Service
/// port without a slice port of its name. Matching by name alone emptied the pool until the
/// slices followed.
fn slice_port(spec: &KuryrLoadBalancerSpec, p: &LbSpecPort, slice: &LbEndpointSlice) -> Option<u16> {
    let name_of = |n: &Option<String>| n.clone().unwrap_or_default();
    let number = |sp: &LbEndpointPort| sp.port.and_then(|n| u16::try_from(n).ok());
    if let Some(sp) = slice
        .ports
        .iter()
        .find(|sp| name_of(&sp.name) == name_of(&p.name))
    {
        return number(sp);
    }
    let protocol = |s: &Option<String>| s.as_deref().unwrap_or("TCP").to_ascii_uppercase();
    let orphans: Vec<&LbEndpointPort> = slice
        .ports
        .iter()
        .filter(|sp| protocol(&sp.protocol) == p.protocol.to_ascii_uppercase())
        .filter(|sp| !spec.ports.iter().any(|q| name_of(&q.name) == name_of(&sp.name)))
        .collect();
    // A numeric target port decides: the orphan serving that number, or none (a port removed
    // and another added in one edit is no rename, and its old slice port must not serve it).
    if let Ok(target) = p.target_port.parse::<i32>() {
        return orphans
            .iter()
            .find(|sp| sp.port == Some(target))
            .and_then(|sp| number(sp));
    }
    let unserved = spec
        .ports
        .iter()
        .filter(|q| !slice.ports.iter().any(|sp| name_of(&sp.name) == name_of(&q.name)))
        .count();
    match (orphans.as_slice(), unserved) {
        ([only], 1) => number(only),
        _ => None,
    }
}

/// The tree `spec` asks for. A spec without ip, subnet or project is not ready to be acted on.
pub fn desired(spec: &KuryrLoadBalancerSpec, inp: &Inputs<'_>) -> Result<DesiredLb, Error> {
    let need = |v: &Option<String>, field: &str| {
        v.clone()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Error::invalid(format!("spec.{field}"), "missing"))
    };
    let lb_name = super::lb_name(inp.namespace, inp.name);
    let provider = spec.provider.clone().filter(|p| !p.is_empty());
    let ovn = provider.as_deref() == Some(OVN_PROVIDER);
    // A dual-stack Service has slices of both families; its load balancer serves the VIP's (the primary
    // cluster IP's). Providers take members of the VIP's version only (ovn refuses a mix outright), and
    // upstream, reading core/v1 Endpoints, only ever saw the primary family.
    let vip_v6 = spec
        .ip
        .as_deref()
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
        .map(|ip| ip.is_ipv6());
    let of_vip_family = |address: &str| match (vip_v6, address.parse::<std::net::IpAddr>()) {
        (Some(v6), Ok(a)) => a.is_ipv6() == v6,
        _ => true,
    };
    let mut listeners = BTreeMap::new();
    let mut skipped = BTreeSet::new();
    for (i, p) in spec.ports.iter().enumerate() {
        let port = u16::try_from(p.port).ok().filter(|p| *p > 0).ok_or_else(|| {
            Error::invalid(
                format!("spec.ports[{i}].port"),
                format!("{} is not a port", p.port),
            )
        })?;
        let protocol = p.protocol.to_ascii_uppercase();
        let name = format!("{lb_name}:{protocol}:{port}");
        let mut members = BTreeMap::new();
        for slice in &spec.endpoint_slices {
            let Some(target) = slice_port(spec, p, slice) else {
                continue;
            };
            for ep in &slice.endpoints {
                if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                let Some(address) = ep.addresses.first().filter(|a| of_vip_family(a)) else {
                    continue;
                };
                let Some(subnet) = (inp.member_subnet)(address) else {
                    skipped.insert(address.clone());
                    continue;
                };
                let who = match &ep.target_ref {
                    Some(r) => format!(
                        "{}/{}",
                        r.namespace.as_deref().unwrap_or(inp.namespace),
                        r.name.as_deref().unwrap_or(inp.name)
                    ),
                    None => format!("{}/{}", inp.namespace, inp.name),
                };
                members.insert(
                    (address.clone(), target),
                    DesiredMember {
                        // Octavia refuses a name past 255 characters, and a member update
                        // is all or nothing: a pod's 253-character name must not freeze the pool.
                        name: format!("{who}:{target}")
                            .chars()
                            .take(kuryr_crds::names::neutron::MAX_LEN)
                            .collect(),
                        address: address.clone(),
                        port: target,
                        subnet_id: Some(subnet),
                    },
                );
            }
        }
        let timeout = |t: Option<i32>| t.and_then(|v| u64::try_from(v).ok()).filter(|v| *v > 0);
        listeners.insert(
            (protocol.clone(), port),
            DesiredListener {
                name: name.clone(),
                protocol: protocol.clone(),
                port,
                // The ovn provider has no proxy, hence no data timeouts, and refuses them.
                timeout_client_data: if ovn {
                    None
                } else {
                    timeout(spec.timeout_client_data)
                },
                timeout_member_data: if ovn {
                    None
                } else {
                    timeout(spec.timeout_member_data)
                },
                // The ovn provider refuses `allowed_cidrs`; it only DNATs, so the backends' own groups
                // see the client's address and enforce the policies themselves.
                allowed_cidrs: if ovn {
                    None
                } else {
                    spec.listener_acls
                        .iter()
                        .find(|a| a.port == p.port && a.protocol.eq_ignore_ascii_case(&protocol))
                        .map(|a| a.allowed_cidrs.clone())
                },
                pool: DesiredPool {
                    name,
                    protocol,
                    // The ovn provider implements only SOURCE_IP_PORT and refuses the rest.
                    lb_algorithm: if ovn {
                        "SOURCE_IP_PORT".into()
                    } else {
                        inp.lb_algorithm.to_string()
                    },
                    persistence: (spec.session_affinity.as_deref() == Some("ClientIP"))
                        .then(|| "SOURCE_IP".to_string()),
                    members,
                },
            },
        );
    }
    Ok(DesiredLb {
        name: lb_name,
        vip_address: need(&spec.ip, "ip")?,
        vip_subnet_id: need(&spec.subnet_id, "subnet_id")?,
        project_id: need(&spec.project_id, "project_id")?,
        provider,
        security_groups: spec.security_groups_ids.clone(),
        listeners,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kuryr_crds::{LbEndpoint, LbEndpointPort, LbEndpointSlice, LbSpecPort, LbTargetRef};

    fn spec(provider: &str) -> KuryrLoadBalancerSpec {
        KuryrLoadBalancerSpec {
            ip: Some("10.0.0.10".into()),
            subnet_id: Some("svc-subnet".into()),
            project_id: Some("p".into()),
            provider: Some(provider.into()),
            timeout_client_data: Some(30_000),
            session_affinity: Some("ClientIP".into()),
            listener_acls: vec![kuryr_crds::LbListenerAcl {
                protocol: "TCP".into(),
                port: 80,
                allowed_cidrs: vec!["10.2.0.0/16".into()],
            }],
            ports: vec![
                LbSpecPort {
                    name: Some("http".into()),
                    port: 80,
                    protocol: "TCP".into(),
                    target_port: "8080".into(),
                },
                LbSpecPort {
                    name: Some("dns".into()),
                    port: 53,
                    protocol: "UDP".into(),
                    target_port: "5353".into(),
                },
            ],
            endpoint_slices: vec![LbEndpointSlice {
                endpoints: ["10.1.0.3", "10.1.0.4"]
                    .iter()
                    .map(|ip| LbEndpoint {
                        addresses: vec![ip.to_string()],
                        target_ref: Some(LbTargetRef {
                            name: Some(format!("pod-{ip}")),
                            namespace: Some("demo".into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ports: vec![LbEndpointPort {
                    name: Some("http".into()),
                    port: Some(8080),
                    protocol: Some("TCP".into()),
                }],
            }],
            ..Default::default()
        }
    }

    fn inputs<'a>(subnet: &'a dyn Fn(&str) -> Option<String>) -> Inputs<'a> {
        Inputs {
            namespace: "demo",
            name: "web",
            lb_algorithm: "ROUND_ROBIN",
            member_subnet: subnet,
        }
    }

    #[test]
    fn a_dual_stack_service_serves_the_vip_family_only() {
        let l3 = |_: &str| Some("svc-subnet".to_string());
        let mut s = spec("ovn");
        let mut v6 = s.endpoint_slices[0].clone();
        for e in &mut v6.endpoints {
            e.addresses = vec![format!(
                "fd00::{}",
                e.addresses[0].rsplit('.').next().unwrap_or("1")
            )];
        }
        s.endpoint_slices.push(v6);
        let members = |s: &KuryrLoadBalancerSpec| -> Vec<String> {
            let d = desired(s, &inputs(&l3)).expect("desired");
            d.listeners[&("TCP".to_string(), 80)]
                .pool
                .members
                .keys()
                .map(|(a, _)| a.clone())
                .collect()
        };
        assert_eq!(members(&s), ["10.1.0.3", "10.1.0.4"]);
        // An IPv6 primary: the IPv6 slice.
        s.ip = Some("fd00:96::10".into());
        assert_eq!(members(&s), ["fd00::3", "fd00::4"]);
    }

    /// A Service port renamed keeps its members while the slices still carry the old name: by
    /// its numeric target port, or as the one port left without a slice port of its name.
    #[test]
    fn a_renamed_service_port_keeps_its_members_until_the_slices_follow() {
        let l3 = |_: &str| Some("svc-subnet".to_string());
        let members = |s: &KuryrLoadBalancerSpec, proto: &str, port: u16| -> usize {
            desired(s, &inputs(&l3)).expect("desired").listeners[&(proto.to_string(), port)]
                .pool
                .members
                .len()
        };
        let mut s = spec("amphora");
        s.ports[0].name = Some("web".into());
        assert_eq!(members(&s, "TCP", 80), 2, "by its target port 8080");
        assert_eq!(members(&s, "UDP", 53), 0, "not another protocol's");
        // A port replaced by one of another numeric target: the old slice port is not its.
        let mut replaced = s.clone();
        replaced.ports[0].target_port = "9000".into();
        assert_eq!(members(&replaced, "TCP", 80), 0);
        // A named target port: the only port without a slice port of its name.
        s.ports[0].target_port = "http-alt".into();
        s.ports.truncate(1);
        assert_eq!(members(&s, "TCP", 80), 2);
        // Two ports renamed at once, neither by number: no guess.
        s.ports.push(LbSpecPort {
            name: Some("admin".into()),
            port: 81,
            protocol: "TCP".into(),
            target_port: "admin".into(),
        });
        s.endpoint_slices[0].ports.push(LbEndpointPort {
            name: Some("old-admin".into()),
            port: Some(9090),
            protocol: Some("TCP".into()),
        });
        assert_eq!(members(&s, "TCP", 80), 0);
        assert_eq!(members(&s, "TCP", 81), 0);
        // A slice port of a name some Service port has is that port's, never another's.
        s.ports[1].name = Some("old-admin".into());
        assert_eq!(members(&s, "TCP", 81), 2);
        assert_eq!(members(&s, "TCP", 80), 2, "the one left without its name");
    }

    #[test]
    fn one_listener_and_pool_per_port_members_only_where_a_slice_port_matches() {
        let l3 = |_: &str| Some("svc-subnet".to_string());
        let d = desired(&spec("amphora"), &inputs(&l3)).expect("desired");
        assert_eq!(d.name, "demo/web");
        let http = &d.listeners[&("TCP".to_string(), 80)];
        assert_eq!(http.name, "demo/web:TCP:80");
        assert_eq!(http.pool.members.len(), 2);
        let m = &http.pool.members[&("10.1.0.3".to_string(), 8080)];
        assert_eq!(m.name, "demo/pod-10.1.0.3:8080");
        assert_eq!(m.subnet_id.as_deref(), Some("svc-subnet"));
        assert_eq!(http.timeout_client_data, Some(30_000));
        assert_eq!(http.pool.persistence.as_deref(), Some("SOURCE_IP"));
        assert_eq!(http.allowed_cidrs, Some(vec!["10.2.0.0/16".to_string()]));
        let dns = &d.listeners[&("UDP".to_string(), 53)];
        assert!(dns.pool.members.is_empty(), "no slice port named dns");
    }

    #[test]
    fn a_member_of_a_pod_with_a_long_name_has_a_name_octavia_takes() {
        let l3 = |_: &str| Some("svc-subnet".to_string());
        let mut s = spec("amphora");
        s.endpoint_slices[0].endpoints[0].target_ref = Some(LbTargetRef {
            name: Some("p".repeat(253)),
            namespace: Some("demo".into()),
            ..Default::default()
        });
        let d = desired(&s, &inputs(&l3)).expect("desired");
        let m = &d.listeners[&("TCP".to_string(), 80)].pool.members[&("10.1.0.3".to_string(), 8080)];
        assert_eq!(m.name.chars().count(), 255, "{}", m.name);
        assert!(m.name.starts_with("demo/ppp"), "{}", m.name);
    }

    #[test]
    fn ovn_gets_source_ip_port_and_no_timeouts() {
        let l3 = |_: &str| Some("svc-subnet".to_string());
        let d = desired(&spec("ovn"), &inputs(&l3)).expect("desired");
        let http = &d.listeners[&("TCP".to_string(), 80)];
        assert_eq!(http.pool.lb_algorithm, "SOURCE_IP_PORT");
        assert_eq!(http.timeout_client_data, None);
        assert_eq!(http.allowed_cidrs, None, "the ovn provider refuses ACLs");
        assert_eq!(http.pool.persistence.as_deref(), Some("SOURCE_IP"));
    }

    #[test]
    fn members_without_a_known_subnet_wait() {
        let l2 = |ip: &str| (ip == "10.1.0.3").then(|| "pod-subnet".to_string());
        let d = desired(&spec("amphora"), &inputs(&l2)).expect("desired");
        let http = &d.listeners[&("TCP".to_string(), 80)];
        assert_eq!(http.pool.members.len(), 1);
    }

    /// Upstream's member modes: L3 members sit on the VIP (service) subnet, L2 members on their pod's
    /// subnet; the load balancer's VIP stays on the service subnet either way.
    #[test]
    fn member_mode_l2_puts_members_on_their_pod_subnet_and_l3_on_the_vip_subnet() {
        let mut s = spec("amphora");
        s.endpoint_slices[0].endpoints.push(LbEndpoint {
            addresses: vec!["10.2.0.7".into()],
            ..Default::default()
        });
        let net = |c: &str| c.parse::<ipnet::IpNet>().expect("cidr");
        let modes = [
            MemberSubnets::Vip("svc-subnet".into()),
            MemberSubnets::Pod(vec![
                (net("10.1.0.0/24"), "pods-a".into()),
                (net("10.2.0.0/24"), "pods-b".into()),
            ]),
        ];
        let members = |m: &MemberSubnets| {
            let of = |ip: &str| m.of(ip);
            let d = desired(&s, &inputs(&of)).expect("desired");
            assert_eq!(d.vip_subnet_id, "svc-subnet");
            d.listeners[&("TCP".to_string(), 80)]
                .pool
                .members
                .values()
                .map(|m| (m.address.clone(), m.subnet_id.clone().unwrap_or_default()))
                .collect::<Vec<_>>()
        };
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            members(&modes[0]),
            [
                pair("10.1.0.3", "svc-subnet"),
                pair("10.1.0.4", "svc-subnet"),
                pair("10.2.0.7", "svc-subnet")
            ]
        );
        assert_eq!(
            members(&modes[1]),
            [
                pair("10.1.0.3", "pods-a"),
                pair("10.1.0.4", "pods-a"),
                pair("10.2.0.7", "pods-b")
            ]
        );
        // L2: an address on no pod subnet is not a member until one is known.
        assert_eq!(modes[1].of("192.168.0.1"), None);
        assert_eq!(modes[1].of("not an address"), None);
    }

    #[test]
    fn a_spec_without_subnet_names_the_field() {
        let mut s = spec("amphora");
        s.subnet_id = None;
        let l3 = |_: &str| None;
        let e = desired(&s, &inputs(&l3)).expect_err("no subnet");
        assert!(e.to_string().contains("spec.subnet_id"), "{e}");
    }
}
