//! What Kubernetes says a set of NetworkPolicies allows, written from the networking.k8s.io/v1
//! API reference alone (NetworkPolicySpec, NetworkPolicyPeer, NetworkPolicyPort, IPBlock,
//! LabelSelector) and deliberately independent of kuryr's translation: the truth-table test
//! compares what the dataplane does with what this says.
//!
//! The rules it encodes:
//! - a pod is isolated for ingress (egress) when a policy of its namespace selects it
//!   (`podSelector`, empty = every pod) and has `Ingress` (`Egress`) in its policyTypes;
//!   policyTypes left out means `Ingress`, plus `Egress` when `egress` has at least one rule;
//! - an isolated pod admits what at least one such policy's rules allow (a union); a rule allows
//!   a peer when `from`/`to` is empty or missing or one of its peers matches, and a port when
//!   `ports` is empty or missing or one of its entries matches;
//! - a peer with only `podSelector` means pods of the policy's namespace; with only
//!   `namespaceSelector`, every pod of the matching namespaces; with both, the matching pods of
//!   the matching namespaces; `ipBlock` is `cidr` minus every `except`;
//! - a port entry's protocol defaults to TCP; a named port is resolved on the destination pod's
//!   container ports (a pod without that name does not match); `endPort` makes `port..=endPort`;
//! - traffic from A to B passes when A's egress allows it and B's ingress allows it; a pod
//!   talking to itself is not subject to policy.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

pub type Labels = BTreeMap<String, String>;

#[derive(Clone, Debug)]
pub struct ModelPod {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub ips: Vec<IpAddr>,
    /// Container ports: (name, protocol as in the API: "TCP", "UDP", "SCTP", number).
    pub ports: Vec<(String, String, u16)>,
}

/// The cluster as the policies see it.
#[derive(Clone, Debug, Default)]
pub struct World {
    pub namespaces: BTreeMap<String, Labels>,
    pub pods: Vec<ModelPod>,
    /// (namespace, name) -> the NetworkPolicy's `spec`.
    pub policies: BTreeMap<(String, String), Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Ingress,
    Egress,
}

impl World {
    pub fn pod(&self, namespace: &str, name: &str) -> Result<&ModelPod> {
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
            .with_context(|| format!("no pod {namespace}/{name} in the model"))
    }

    /// Whether a connection from `from` to `to` on `protocol`/`port` is allowed.
    pub fn allows(&self, from: &ModelPod, to: &ModelPod, protocol: &str, port: u16) -> Result<bool> {
        if from.namespace == to.namespace && from.name == to.name {
            return Ok(true);
        }
        Ok(self.admits(Way::Egress, from, to, protocol, port)?
            && self.admits(Way::Ingress, to, from, protocol, port)?)
    }

    /// Whether `subject`'s policies of direction `way` let it talk with `other`.
    fn admits(
        &self,
        way: Way,
        subject: &ModelPod,
        other: &ModelPod,
        protocol: &str,
        port: u16,
    ) -> Result<bool> {
        let mut isolated = false;
        for ((ns, name), spec) in &self.policies {
            if ns != &subject.namespace {
                continue;
            }
            let at = |f: &str| format!("{ns}/{name}: spec.{f}");
            if !selector_matches(spec.get("podSelector"), &subject.labels)
                .with_context(|| at("podSelector"))?
            {
                continue;
            }
            if !policy_types(spec)?.contains(&way) {
                continue;
            }
            isolated = true;
            let (rules_field, peers_field) = match way {
                Way::Ingress => ("ingress", "from"),
                Way::Egress => ("egress", "to"),
            };
            // The pod whose container ports name the port: the destination.
            let destination = match way {
                Way::Ingress => subject,
                Way::Egress => other,
            };
            for (i, rule) in list(spec.get(rules_field)).iter().enumerate() {
                let field = format!("{rules_field}[{i}]");
                let peers = list(rule.get(peers_field));
                let peer_ok = peers.is_empty() || {
                    let mut any = false;
                    for (j, peer) in peers.iter().enumerate() {
                        if self
                            .peer_matches(ns, peer, other)
                            .with_context(|| at(&format!("{field}.{peers_field}[{j}]")))?
                        {
                            any = true;
                            break;
                        }
                    }
                    any
                };
                if !peer_ok {
                    continue;
                }
                let ports = list(rule.get("ports"));
                let port_ok = ports.is_empty() || {
                    let mut any = false;
                    for (j, p) in ports.iter().enumerate() {
                        if port_matches(p, destination, protocol, port)
                            .with_context(|| at(&format!("{field}.ports[{j}]")))?
                        {
                            any = true;
                            break;
                        }
                    }
                    any
                };
                if port_ok {
                    return Ok(true);
                }
            }
        }
        Ok(!isolated)
    }

    fn peer_matches(&self, policy_ns: &str, peer: &Value, pod: &ModelPod) -> Result<bool> {
        if let Some(block) = peer.get("ipBlock").filter(|v| !v.is_null()) {
            let cidr = block
                .get("cidr")
                .and_then(Value::as_str)
                .context("ipBlock.cidr")?;
            let excepts = list(block.get("except"));
            for ip in &pod.ips {
                if in_cidr(*ip, cidr)? {
                    let mut excepted = false;
                    for e in &excepts {
                        if in_cidr(*ip, e.as_str().context("ipBlock.except entry")?)? {
                            excepted = true;
                        }
                    }
                    if !excepted {
                        return Ok(true);
                    }
                }
            }
            return Ok(false);
        }
        let pods = peer.get("podSelector").filter(|v| !v.is_null());
        let namespaces = peer.get("namespaceSelector").filter(|v| !v.is_null());
        let ns_ok = match namespaces {
            None => pod.namespace == policy_ns,
            Some(sel) => {
                let labels = self.namespaces.get(&pod.namespace).cloned().unwrap_or_default();
                selector_matches(Some(sel), &labels).context("namespaceSelector")?
            }
        };
        let pod_ok = match pods {
            None => true,
            Some(sel) => selector_matches(Some(sel), &pod.labels).context("podSelector")?,
        };
        if pods.is_none() && namespaces.is_none() {
            bail!("a peer needs podSelector, namespaceSelector or ipBlock");
        }
        Ok(ns_ok && pod_ok)
    }
}

/// `policyTypes`, or its default.
fn policy_types(spec: &Value) -> Result<Vec<Way>> {
    match spec.get("policyTypes").filter(|v| !v.is_null()) {
        Some(types) => list(Some(types))
            .iter()
            .map(|t| match t.as_str() {
                Some("Ingress") => Ok(Way::Ingress),
                Some("Egress") => Ok(Way::Egress),
                other => bail!("spec.policyTypes: unknown {other:?}"),
            })
            .collect(),
        None => {
            let mut out = vec![Way::Ingress];
            if !list(spec.get("egress")).is_empty() {
                out.push(Way::Egress);
            }
            Ok(out)
        }
    }
}

fn list(v: Option<&Value>) -> Vec<Value> {
    v.and_then(Value::as_array).cloned().unwrap_or_default()
}

/// A LabelSelector: every `matchLabels` pair and every `matchExpressions` requirement; an empty
/// (or absent) selector matches everything.
pub fn selector_matches(sel: Option<&Value>, labels: &Labels) -> Result<bool> {
    let Some(sel) = sel.filter(|v| !v.is_null()) else {
        return Ok(true);
    };
    if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in ml {
            if labels.get(k).map(String::as_str) != v.as_str() {
                return Ok(false);
            }
        }
    }
    for e in list(sel.get("matchExpressions")) {
        let key = e
            .get("key")
            .and_then(Value::as_str)
            .context("matchExpressions key")?;
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let have = labels.get(key).map(String::as_str);
        let ok = match e.get("operator").and_then(Value::as_str) {
            Some("In") => have.is_some_and(|h| values.contains(&h)),
            Some("NotIn") => !have.is_some_and(|h| values.contains(&h)),
            Some("Exists") => have.is_some(),
            Some("DoesNotExist") => have.is_none(),
            other => bail!("matchExpressions operator {other:?}"),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

fn port_matches(p: &Value, destination: &ModelPod, protocol: &str, port: u16) -> Result<bool> {
    let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
    if proto != protocol {
        return Ok(false);
    }
    match p.get("port") {
        None | Some(Value::Null) => Ok(true),
        Some(Value::String(name)) => Ok(destination
            .ports
            .iter()
            .any(|(n, pr, num)| n == name && pr == protocol && *num == port)),
        Some(Value::Number(n)) => {
            let lo = n.as_u64().context("port")?;
            let hi = match p.get("endPort") {
                None | Some(Value::Null) => lo,
                Some(e) => e.as_u64().context("endPort")?,
            };
            Ok((lo..=hi).contains(&u64::from(port)))
        }
        Some(other) => bail!("port {other}"),
    }
}

/// Whether `ip` is inside `cidr` ("a.b.c.d/n"; IPv6 likewise). Different families never match.
pub fn in_cidr(ip: IpAddr, cidr: &str) -> Result<bool> {
    let (net, len) = cidr.split_once('/').with_context(|| format!("cidr {cidr:?}"))?;
    let net: IpAddr = net.parse().with_context(|| format!("cidr {cidr:?}"))?;
    let len: u32 = len.parse().with_context(|| format!("cidr {cidr:?}"))?;
    Ok(match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            anyhow::ensure!(len <= 32, "cidr {cidr:?}");
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            anyhow::ensure!(len <= 128, "cidr {cidr:?}");
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    })
}
