//! From a validated policy and the cluster index, the Neutron state that enforces it: security
//! groups with deduplicated rules, and the address groups those rules point at.
//!
//! Membership lives in address groups, never in rules: a pod whose labels start (or stop)
//! matching a peer is one `add_addresses` (`remove_addresses`) on that peer's group, and the
//! rules stay as they are. Rules only change when the policy does.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde::Serialize;

use super::cidr::Cidr;
use super::index::{Backend, ClusterIndex, PodInfo, PodKey, ServiceInfo, ServicePort, TargetPort};
use super::spec::{Peer, PolicyKey, PolicySpec, PortRef, Protocol, RuleSpec};
use super::stable_hash;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn neutron(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum EtherType {
    V4,
    V6,
}

impl EtherType {
    pub fn neutron(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }

    pub fn of(c: &Cidr) -> Self {
        if c.is_v6() { Self::V6 } else { Self::V4 }
    }
}

/// Names an address group within its policy; stable while the peer it stands for is unchanged.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct AgKey(pub String);

/// Who is on the other side of a rule.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Remote {
    Any,
    Prefix(Cidr),
    Group(AgKey),
    /// An address group that is not one of the policy's (only ever seen in actual state).
    Foreign(String),
}

/// One security group rule in Neutron's terms.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Rule {
    pub direction: Direction,
    pub ethertype: EtherType,
    /// `None`: every protocol (and then no ports).
    pub protocol: Option<Protocol>,
    /// `None`: every port of the protocol.
    pub ports: Option<(u16, u16)>,
    pub remote: Remote,
}

/// What the model adds for Services and nodes, as upstream does for its policy groups.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Ingress from these prefixes is always allowed on isolated pods (the nodes' subnets, so
    /// kubelet probes keep working; upstream's `_get_default_np_rules`).
    pub host_cidrs: Vec<Cidr>,
    /// Allow ingress from the VIPs of the policy namespace's Services: OVN load balancers answer
    /// hairpin traffic with the VIP as source (upstream's `_get_service_ingress_rules`).
    pub namespace_service_vips: bool,
}

/// The security group variant every selected pod gets unless ingress named ports resolve
/// differently on it.
pub const BASE_VARIANT: &str = "base";

/// The Neutron state one policy needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredPolicy {
    /// Security groups by variant. One ([`BASE_VARIANT`]) unless an ingress named port resolves
    /// to different numbers on the selected pods: each resolution gets its own group, so no pod
    /// is opened on another pod's port.
    pub groups: BTreeMap<String, BTreeSet<Rule>>,
    pub address_groups: BTreeMap<AgKey, BTreeSet<Cidr>>,
    /// Selected pods and the variant each gets.
    pub members: BTreeMap<PodKey, String>,
    /// What the translation had to approximate or leave out, for the status.
    pub notes: Vec<String>,
}

/// The variant of `pod` for a policy whose ingress uses the named ports `names`.
pub fn variant_of(pod: &PodInfo, names: &[(Protocol, String)]) -> String {
    if names.is_empty() {
        return BASE_VARIANT.to_string();
    }
    let sig: Vec<String> = names
        .iter()
        .map(|(proto, n)| match pod.resolve(*proto, n) {
            Some(num) => format!("{}/{n}={num}", proto.neutron()),
            None => format!("{}/{n}=-", proto.neutron()),
        })
        .collect();
    if sig.iter().all(|s| s.ends_with("=-")) {
        return BASE_VARIANT.to_string();
    }
    format!("np-{:016x}", stable_hash(&sig.join(",")))
}

fn peer_key(prefix: &str, peer: &Peer) -> String {
    let json = serde_json::to_string(peer).unwrap_or_default();
    format!("{prefix}-{:016x}", stable_hash(&json))
}

fn host_prefixes(ips: impl IntoIterator<Item = IpAddr>) -> BTreeSet<Cidr> {
    ips.into_iter().map(Cidr::host).collect()
}

/// Pods that may be behind an egress peer (`None`: every destination), with the addresses of
/// theirs that the peer covers.
fn egress_candidates<'a>(
    index: &'a ClusterIndex,
    peer: Option<&'a Peer>,
) -> Vec<(&'a PodKey, &'a PodInfo, Vec<IpAddr>)> {
    match peer {
        None => index.pods.iter().map(|(k, p)| (k, p, p.ips.clone())).collect(),
        Some(p @ Peer::Pods { .. }) => index.peer_pods(p).map(|(k, p)| (k, p, p.ips.clone())).collect(),
        Some(block @ Peer::Block { .. }) => index
            .pods
            .iter()
            .map(|(k, p)| {
                let ips = p
                    .ips
                    .iter()
                    .copied()
                    .filter(|ip| block.block_holds(*ip))
                    .collect();
                (k, p, ips)
            })
            .filter(|(_, _, ips): &(_, _, Vec<IpAddr>)| !ips.is_empty())
            .collect(),
    }
}

struct Builder<'a> {
    index: &'a ClusterIndex,
    out: DesiredPolicy,
}

impl Builder<'_> {
    fn group(&mut self, key: String, addrs: BTreeSet<Cidr>) -> Remote {
        let key = AgKey(key);
        self.out
            .address_groups
            .entry(key.clone())
            .or_default()
            .extend(addrs);
        Remote::Group(key)
    }

    /// Egress to a Service is checked at the client before its load balancer rewrites the
    /// destination, so the rule must admit the Service's VIP on the Service's port: for the
    /// Services in front of `behind` (the pods behind a peer), the VIPs on each Service port
    /// that forwards to a port the rule admits on one of its pods (`admits`). `whole`: the rule
    /// admits every port of `proto` (or everything, `proto` none), and so do the VIPs. Upstream
    /// admitted the VIPs on the backends' port, which a client never sends to unless the two are
    /// equal.
    ///
    /// A Service without a selector (`kubernetes.default`, an external database) has the
    /// addresses of its EndpointSlices behind it instead of pods: it is in front of a pod peer
    /// when one of them is a peer pod's, of an ipBlock when all of them are in the block (the
    /// load balancer may pick any), of "anywhere" always, as upstream; a port the rule admits on
    /// them is given by number (`admits_backend`: named ports name pods' container ports).
    #[allow(clippy::too_many_arguments)]
    fn service_rules(
        &mut self,
        base: &str,
        peer: Option<&Peer>,
        behind: &[(&PodKey, &PodInfo)],
        proto: Option<Protocol>,
        whole: bool,
        admits: impl Fn(&ServicePort, &PodInfo) -> bool,
        admits_backend: impl Fn(u16) -> bool,
        rules: &mut BTreeSet<Rule>,
    ) {
        let mut by_port: BTreeMap<Option<u16>, BTreeSet<Cidr>> = BTreeMap::new();
        // `reached`: the backend addresses the peer covers. A VIP of a family none of them has
        // is not admitted: the load balancer would forward it to addresses outside the peer.
        let mut add = |svc: &ServiceInfo, reached: &[IpAddr], admitted: &dyn Fn(&ServicePort) -> bool| {
            let vips = host_prefixes(
                svc.vips
                    .iter()
                    .copied()
                    .filter(|v| reached.iter().any(|ip| ip.is_ipv6() == v.is_ipv6())),
            );
            if vips.is_empty() {
                return;
            }
            if whole && proto.is_none() {
                by_port.entry(None).or_default().extend(vips);
                return;
            }
            for sp in svc.ports.iter().filter(|sp| Some(sp.protocol) == proto) {
                if admitted(sp) {
                    let key = (!whole).then_some(sp.port);
                    by_port.entry(key).or_default().extend(vips.iter().copied());
                }
            }
        };
        for (svc, picked) in self.index.services_selecting(behind) {
            let reached: Vec<IpAddr> = picked
                .iter()
                .flat_map(|p| p.ips.iter().copied())
                .filter(|ip| !matches!(peer, Some(b @ Peer::Block { .. }) if !b.block_holds(*ip)))
                .collect();
            add(svc, &reached, &|sp| picked.iter().any(|pod| admits(sp, pod)));
        }
        let peer_ips: BTreeSet<IpAddr> = match peer {
            Some(Peer::Pods { .. }) => behind.iter().flat_map(|(_, p)| p.ips.iter().copied()).collect(),
            _ => BTreeSet::new(),
        };
        for svc in self.index.services_without_selector() {
            let reached: Vec<&Backend> = match peer {
                None => svc.endpoints.iter().collect(),
                Some(Peer::Pods { .. }) => svc
                    .endpoints
                    .iter()
                    .filter(|b| peer_ips.contains(&b.ip))
                    .collect(),
                Some(Peer::Block { allowed, .. }) => {
                    // Per address family: an IPv4 block says nothing of a dual-stack Service's
                    // IPv6 backends, and must hold all of its IPv4 ones.
                    let of_block: Vec<&Backend> = svc
                        .endpoints
                        .iter()
                        .filter(|b| allowed.iter().any(|c| c.is_v6() == b.ip.is_ipv6()))
                        .collect();
                    let inside = |b: &&Backend| allowed.iter().any(|c| c.contains_ip(b.ip));
                    if of_block.iter().all(inside) {
                        of_block
                    } else {
                        Vec::new()
                    }
                }
            };
            if reached.is_empty() {
                continue;
            }
            let addresses: Vec<IpAddr> = reached.iter().map(|b| b.ip).collect();
            add(svc, &addresses, &|sp| {
                reached
                    .iter()
                    .any(|b| ServiceInfo::backend_port(sp, b).is_some_and(&admits_backend))
            });
        }
        for (port, vips) in by_port {
            let key = match (proto, port) {
                (None, _) => format!("{base}-vips"),
                (Some(p), None) => format!("{base}-vips-{}", p.neutron()),
                (Some(p), Some(n)) => format!("{base}-vips-{}-{n}", p.neutron()),
            };
            let remote = self.group(key, vips);
            push(rules, Direction::Egress, proto, port.map(|n| (n, n)), remote);
        }
    }

    /// The rules of one ingress/egress rule for one variant (`pod` resolves ingress named ports).
    fn rules(
        &mut self,
        dir: Direction,
        spec: &RuleSpec,
        path: &str,
        variant_pod: Option<&PodInfo>,
        rules: &mut BTreeSet<Rule>,
    ) {
        // (protocol, ports) pairs, or named ports still to resolve.
        enum P {
            Fixed(Option<Protocol>, Option<(u16, u16)>),
            Named(Protocol, String),
        }
        let ports: Vec<P> = match &spec.ports {
            None => vec![P::Fixed(None, None)],
            Some(list) => list
                .iter()
                .map(|p| match &p.port {
                    // Neutron stores the whole range as no range: asked for as one, the rule
                    // would never read back as wanted and be made again at every resync.
                    PortRef::All | PortRef::Range(1, 65535) => P::Fixed(Some(p.protocol), None),
                    PortRef::Range(a, b) => P::Fixed(Some(p.protocol), Some((*a, *b))),
                    PortRef::Named(n) => P::Named(p.protocol, n.clone()),
                })
                .collect(),
        };
        let peers: Vec<Option<&Peer>> = match &spec.peers {
            None => vec![None],
            Some(list) => list.iter().map(Some).collect(),
        };
        for (j, peer) in peers.iter().enumerate() {
            let remotes: Vec<Remote> = match peer {
                None => vec![Remote::Any],
                Some(Peer::Block { allowed, except, .. }) => {
                    if !except.is_empty() {
                        self.out.notes.push(format!(
                            "{path}.{}[{j}].ipBlock: cidr minus except as {} prefixes (the same addresses, never more)",
                            if dir == Direction::Ingress { "from" } else { "to" },
                            allowed.len()
                        ));
                    }
                    allowed.iter().copied().map(Remote::Prefix).collect()
                }
                Some(p @ Peer::Pods { .. }) => {
                    let addrs =
                        host_prefixes(self.index.peer_pods(p).flat_map(|(_, i)| i.ips.iter().copied()));
                    let key = match dir {
                        Direction::Ingress => peer_key("i", p),
                        Direction::Egress => peer_key("e", p),
                    };
                    vec![self.group(key, addrs)]
                }
            };
            // The pods behind an egress peer, for the Services in front of them.
            // (Not looked for at all in a cluster without Services: it lists every pod.)
            let behind: Vec<(&PodKey, &PodInfo)> = match dir {
                // A pod without an address (pending, finished) is behind no Service.
                Direction::Egress if !self.index.services.is_empty() => egress_candidates(self.index, *peer)
                    .into_iter()
                    .filter(|(_, _, ips)| !ips.is_empty())
                    .map(|(k, p, _)| (k, p))
                    .collect(),
                _ => Vec::new(),
            };
            let base = match peer {
                None => "e-all".to_string(),
                Some(p) => peer_key("e", p),
            };
            for port in &ports {
                if dir == Direction::Egress && !(peer.is_none() && matches!(port, P::Fixed(None, None))) {
                    let admits = |sp: &ServicePort, pod: &PodInfo| match port {
                        P::Fixed(_, None) => true,
                        P::Fixed(_, Some((a, b))) => sp.target_on(pod).is_some_and(|n| *a <= n && n <= *b),
                        P::Named(proto, name) => {
                            matches!(&sp.target, TargetPort::Name(n) if n == name)
                                || pod
                                    .resolve(*proto, name)
                                    .is_some_and(|n| sp.target_on(pod) == Some(n))
                        }
                    };
                    let proto = match port {
                        P::Fixed(proto, _) => *proto,
                        P::Named(proto, _) => Some(*proto),
                    };
                    let admits_backend = |n: u16| match port {
                        P::Fixed(_, None) => true,
                        P::Fixed(_, Some((a, b))) => *a <= n && n <= *b,
                        P::Named(..) => false,
                    };
                    let whole = matches!(port, P::Fixed(_, None));
                    self.service_rules(&base, *peer, &behind, proto, whole, admits, admits_backend, rules);
                }
                match port {
                    P::Fixed(proto, range) => {
                        for remote in &remotes {
                            push(rules, dir, *proto, *range, remote.clone());
                        }
                    }
                    P::Named(proto, name) => match dir {
                        Direction::Ingress => {
                            if let Some(num) = variant_pod.and_then(|p| p.resolve(*proto, name)) {
                                for remote in &remotes {
                                    push(rules, dir, Some(*proto), Some((num, num)), remote.clone());
                                }
                            }
                        }
                        Direction::Egress => {
                            // The port is the destination's: one group per number it resolves to.
                            let mut by_num: BTreeMap<u16, BTreeSet<Cidr>> = BTreeMap::new();
                            for (_, pod, ips) in egress_candidates(self.index, *peer) {
                                if let Some(num) = pod.resolve(*proto, name) {
                                    by_num.entry(num).or_default().extend(host_prefixes(ips));
                                }
                            }
                            for (num, addrs) in by_num {
                                let key = format!("{base}-{}-{name}-{num}", proto.neutron());
                                let remote = self.group(key, addrs);
                                push(rules, dir, Some(*proto), Some((num, num)), remote);
                            }
                        }
                    },
                }
            }
        }
    }
}

fn push(
    rules: &mut BTreeSet<Rule>,
    dir: Direction,
    proto: Option<Protocol>,
    ports: Option<(u16, u16)>,
    remote: Remote,
) {
    // A prefix of every address is no remote of its family, as Neutron's duplicate check takes
    // it: kept as a prefix, it duplicates the rule of a peerless rule on the same ports, which
    // Neutron refuses (409) at every pass.
    let (remote, ethertypes) = match remote {
        Remote::Prefix(c) if c.is_everything() => (Remote::Any, vec![EtherType::of(&c)]),
        Remote::Prefix(c) => (Remote::Prefix(c), vec![EtherType::of(&c)]),
        other => (other, vec![EtherType::V4, EtherType::V6]),
    };
    for ethertype in ethertypes {
        rules.insert(Rule {
            direction: dir,
            ethertype,
            protocol: proto,
            ports,
            remote: remote.clone(),
        });
    }
}

/// Drops rules an allow-everything rule of the same direction and ethertype already covers.
fn dedup_subsumed(rules: &mut BTreeSet<Rule>) {
    let open: BTreeSet<(Direction, EtherType)> = rules
        .iter()
        .filter(|r| r.protocol.is_none() && r.remote == Remote::Any)
        .map(|r| (r.direction, r.ethertype))
        .collect();
    rules.retain(|r| {
        !open.contains(&(r.direction, r.ethertype)) || (r.protocol.is_none() && r.remote == Remote::Any)
    });
}

/// The desired Neutron state of `policy`.
pub fn desired(policy: &PolicySpec, index: &ClusterIndex, opts: &Options) -> DesiredPolicy {
    let ns = &policy.key.namespace;
    let names = policy.ingress_port_names();
    let mut b = Builder {
        index,
        out: DesiredPolicy::default(),
    };
    // Variants: the base one always (a pod not created yet gets it), plus one per resolution.
    let mut variants: BTreeMap<String, Option<&PodInfo>> = BTreeMap::new();
    variants.insert(BASE_VARIANT.to_string(), None);
    for (k, p) in index.selected(ns, &policy.pod_selector) {
        let v = variant_of(p, &names);
        b.out.members.insert(k.clone(), v.clone());
        if v != BASE_VARIANT {
            variants.insert(v, Some(p));
        }
    }
    for (variant, pod) in variants {
        let mut rules = BTreeSet::new();
        if let Some(ingress) = &policy.ingress {
            for (i, r) in ingress.iter().enumerate() {
                b.rules(
                    Direction::Ingress,
                    r,
                    &format!("spec.ingress[{i}]"),
                    pod,
                    &mut rules,
                );
            }
            for c in &opts.host_cidrs {
                push(&mut rules, Direction::Ingress, None, None, Remote::Prefix(*c));
            }
            if opts.namespace_service_vips {
                let vips = host_prefixes(index.namespace_vips(ns));
                let remote = b.group("i-service-vips".into(), vips);
                push(&mut rules, Direction::Ingress, None, None, remote);
            }
        }
        if let Some(egress) = &policy.egress {
            for (i, r) in egress.iter().enumerate() {
                b.rules(
                    Direction::Egress,
                    r,
                    &format!("spec.egress[{i}]"),
                    pod,
                    &mut rules,
                );
            }
        }
        dedup_subsumed(&mut rules);
        b.out.groups.insert(variant, rules);
    }
    // A group no remaining rule points at is not needed.
    let used: BTreeSet<AgKey> = b
        .out
        .groups
        .values()
        .flatten()
        .filter_map(|r| match &r.remote {
            Remote::Group(k) => Some(k.clone()),
            _ => None,
        })
        .collect();
    b.out.address_groups.retain(|k, _| used.contains(k));
    b.out.notes.sort();
    b.out.notes.dedup();
    b.out
}

/// The security groups one pod needs beyond its policies' own: kuryr-rs keeps one
/// allow-all-ingress and one allow-all-egress group for pods whose policies isolate only the
/// other direction (a policy group never opens a direction itself, so several policies on one
/// pod stay a union).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodSecurity {
    /// No policy selects the pod: it allows everything (the configured default groups).
    Unselected,
    Selected {
        /// (policy, variant) of every policy selecting the pod.
        groups: Vec<(PolicyKey, String)>,
        open_ingress: bool,
        open_egress: bool,
    },
}

/// Which security groups `pod` (with `info`, possibly not in the index yet) gets.
pub fn pod_security(namespace: &str, info: &PodInfo, policies: &[PolicySpec]) -> PodSecurity {
    let mut groups = vec![];
    let (mut ingress, mut egress) = (false, false);
    for p in policies {
        if p.key.namespace != namespace || !p.pod_selector.matches(&info.labels) {
            continue;
        }
        ingress |= p.ingress.is_some();
        egress |= p.egress.is_some();
        groups.push((p.key.clone(), variant_of(info, &p.ingress_port_names())));
    }
    if groups.is_empty() {
        return PodSecurity::Unselected;
    }
    groups.sort();
    PodSecurity::Selected {
        groups,
        open_ingress: !ingress,
        open_egress: !egress,
    }
}
