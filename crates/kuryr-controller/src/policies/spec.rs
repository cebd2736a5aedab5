//! A NetworkPolicy (networking.k8s.io/v1) validated into the model's terms. Everything the
//! translation cannot act on is refused here, with the offending field named, before any
//! Neutron call.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use serde::Serialize;

use super::cidr::Cidr;
use super::selector::Selector;

/// Malformed or unsupported policy content: `field` is the JSON path inside the policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PolicyError {
    pub field: String,
    pub message: String,
}

impl PolicyError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// `namespace/name` of a policy.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PolicyKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PolicyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// Neutron's protocol name.
    pub fn neutron(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// The port of a policy port entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum PortRef {
    /// A number, or the range `port..=endPort`.
    Range(u16, u16),
    /// A container port name, resolved on each destination pod.
    Named(String),
    /// No port: every port of the protocol.
    All,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PortSpec {
    pub protocol: Protocol,
    pub port: PortRef,
}

/// Which namespaces a pod peer looks in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Namespaces {
    /// The policy's own namespace (a peer without `namespaceSelector`).
    Own(String),
    Matching(Selector),
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Peer {
    Pods {
        namespaces: Namespaces,
        pods: Selector,
    },
    /// `ipBlock`: the prefixes left once `except` is taken out (exact, see [`Cidr::subtract`]).
    Block {
        cidr: Cidr,
        except: Vec<Cidr>,
        allowed: Vec<Cidr>,
    },
}

impl Peer {
    /// Whether this is an ipBlock peer that holds `ip` (in its `cidr`, outside its `except`s). An
    /// egress rule to such a peer reaches the pod with that address, and the Services in front of it.
    pub fn block_holds(&self, ip: std::net::IpAddr) -> bool {
        match self {
            Peer::Block { allowed, .. } => allowed.iter().any(|c| c.contains_ip(ip)),
            Peer::Pods { .. } => false,
        }
    }
}

/// One ingress or egress rule: `peers` `None` means every peer, `ports` `None` every port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleSpec {
    pub peers: Option<Vec<Peer>>,
    pub ports: Option<Vec<PortSpec>>,
}

/// A validated NetworkPolicy. `ingress`/`egress` is `None` when the policy does not isolate
/// that direction (its policyTypes, explicit or implicit, lack it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PolicySpec {
    pub key: PolicyKey,
    pub pod_selector: Selector,
    pub ingress: Option<Vec<RuleSpec>>,
    pub egress: Option<Vec<RuleSpec>>,
}

impl PolicySpec {
    pub fn parse(np: &NetworkPolicy) -> Result<Self, PolicyError> {
        let namespace = np
            .namespace()
            .ok_or_else(|| PolicyError::new("metadata.namespace", "missing"))?;
        let key = PolicyKey {
            namespace: namespace.clone(),
            name: np.name_any(),
        };
        let spec = np
            .spec
            .as_ref()
            .ok_or_else(|| PolicyError::new("spec", "missing"))?;
        let pod_selector =
            Selector::parse(&spec.pod_selector.clone().unwrap_or_default(), "spec.podSelector")?;
        let ingress_rules = spec.ingress.clone().unwrap_or_default();
        let egress_rules = spec.egress.clone().unwrap_or_default();
        // Without policyTypes a policy always isolates ingress, and egress only when it has
        // egress rules (the API server's defaulting).
        let (ingress_on, egress_on) = match &spec.policy_types {
            Some(types) if !types.is_empty() => {
                let mut on = (false, false);
                for (i, t) in types.iter().enumerate() {
                    match t.as_str() {
                        "Ingress" => on.0 = true,
                        "Egress" => on.1 = true,
                        other => {
                            return Err(PolicyError::new(
                                format!("spec.policyTypes[{i}]"),
                                format!("{other:?} is not Ingress or Egress"),
                            ));
                        }
                    }
                }
                on
            }
            _ => (true, !egress_rules.is_empty()),
        };
        let ingress = if ingress_on {
            Some(
                ingress_rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| ingress_rule(r, &format!("spec.ingress[{i}]"), &namespace))
                    .collect::<Result<_, _>>()?,
            )
        } else {
            None
        };
        let egress = if egress_on {
            Some(
                egress_rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| egress_rule(r, &format!("spec.egress[{i}]"), &namespace))
                    .collect::<Result<_, _>>()?,
            )
        } else {
            None
        };
        Ok(Self {
            key,
            pod_selector,
            ingress,
            egress,
        })
    }

    /// Named ports the policy's ingress rules use (resolved on the selected pods).
    pub fn ingress_port_names(&self) -> Vec<(Protocol, String)> {
        let mut out: Vec<_> = self
            .ingress
            .iter()
            .flatten()
            .flat_map(|r| r.ports.iter().flatten())
            .filter_map(|p| match &p.port {
                PortRef::Named(n) => Some((p.protocol, n.clone())),
                _ => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

fn ingress_rule(r: &NetworkPolicyIngressRule, path: &str, ns: &str) -> Result<RuleSpec, PolicyError> {
    rule(r.from.as_deref(), r.ports.as_deref(), path, "from", ns)
}

fn egress_rule(r: &NetworkPolicyEgressRule, path: &str, ns: &str) -> Result<RuleSpec, PolicyError> {
    rule(r.to.as_deref(), r.ports.as_deref(), path, "to", ns)
}

fn rule(
    peers: Option<&[NetworkPolicyPeer]>,
    ports: Option<&[NetworkPolicyPort]>,
    path: &str,
    peers_field: &str,
    ns: &str,
) -> Result<RuleSpec, PolicyError> {
    // An empty list means the same as a missing one: every peer / every port.
    let peers = match peers {
        Some(list) if !list.is_empty() => Some(
            list.iter()
                .enumerate()
                .map(|(i, p)| peer(p, &format!("{path}.{peers_field}[{i}]"), ns))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        _ => None,
    };
    let ports = match ports {
        Some(list) if !list.is_empty() => Some(
            list.iter()
                .enumerate()
                .map(|(i, p)| port(p, &format!("{path}.ports[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        _ => None,
    };
    Ok(RuleSpec { peers, ports })
}

fn peer(p: &NetworkPolicyPeer, path: &str, ns: &str) -> Result<Peer, PolicyError> {
    if let Some(block) = &p.ip_block {
        if p.pod_selector.is_some() || p.namespace_selector.is_some() {
            return Err(PolicyError::new(
                format!("{path}.ipBlock"),
                "may not be combined with podSelector or namespaceSelector",
            ));
        }
        let cidr: Cidr = block
            .cidr
            .parse()
            .map_err(|e| PolicyError::new(format!("{path}.ipBlock.cidr"), e))?;
        let mut except = vec![];
        for (i, e) in block.except.iter().flatten().enumerate() {
            let field = format!("{path}.ipBlock.except[{i}]");
            let e: Cidr = e.parse().map_err(|m| PolicyError::new(field.clone(), m))?;
            if !cidr.contains(&e) || e == cidr {
                return Err(PolicyError::new(
                    field,
                    format!("{e} must be strictly within cidr {cidr}"),
                ));
            }
            except.push(e);
        }
        except.sort();
        except.dedup();
        let allowed = cidr.subtract(&except);
        return Ok(Peer::Block {
            cidr,
            except,
            allowed,
        });
    }
    let namespaces = match &p.namespace_selector {
        Some(s) => Namespaces::Matching(Selector::parse(s, &format!("{path}.namespaceSelector"))?),
        None => Namespaces::Own(ns.to_string()),
    };
    let pods = match &p.pod_selector {
        Some(s) => Selector::parse(s, &format!("{path}.podSelector"))?,
        None if p.namespace_selector.is_some() => Selector::everything(),
        None => {
            return Err(PolicyError::new(
                path,
                "must set one of podSelector, namespaceSelector, ipBlock",
            ));
        }
    };
    Ok(Peer::Pods { namespaces, pods })
}

fn port(p: &NetworkPolicyPort, path: &str) -> Result<PortSpec, PolicyError> {
    let protocol = match p.protocol.as_deref() {
        None => Protocol::Tcp,
        Some(s) => Protocol::parse(s).ok_or_else(|| {
            PolicyError::new(
                format!("{path}.protocol"),
                format!("{s:?} is not TCP, UDP or SCTP"),
            )
        })?,
    };
    let number = |n: i32, field: &str| {
        u16::try_from(n)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| PolicyError::new(format!("{path}.{field}"), format!("{n} is not in 1..65535")))
    };
    let port = match (&p.port, p.end_port) {
        (None, None) => PortRef::All,
        (None, Some(_)) => {
            return Err(PolicyError::new(format!("{path}.endPort"), "requires port"));
        }
        (Some(IntOrString::Int(n)), end) => {
            let start = number(*n, "port")?;
            let end = match end {
                Some(e) => number(e, "endPort")?,
                None => start,
            };
            if end < start {
                return Err(PolicyError::new(
                    format!("{path}.endPort"),
                    format!("{end} is below port {start}"),
                ));
            }
            PortRef::Range(start, end)
        }
        (Some(IntOrString::String(s)), None) => match s.parse::<i32>() {
            // The API accepts "80" as a string; it is still a number.
            Ok(n) => {
                let n = number(n, "port")?;
                PortRef::Range(n, n)
            }
            Err(_) if s.is_empty() || s.len() > 15 => {
                return Err(PolicyError::new(
                    format!("{path}.port"),
                    format!("{s:?} is not a valid port name"),
                ));
            }
            Err(_) => PortRef::Named(s.clone()),
        },
        (Some(IntOrString::String(_)), Some(_)) => {
            return Err(PolicyError::new(
                format!("{path}.endPort"),
                "may not be used with a named port",
            ));
        }
    };
    Ok(PortSpec { protocol, port })
}
