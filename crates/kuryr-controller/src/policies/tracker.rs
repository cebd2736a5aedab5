//! Which policies a cluster change affects: the cluster index and the live policies, both fed by
//! watch events, and what was last applied per policy. After a pod or namespace event only the
//! policies whose desired state moved are reconciled (and read back from Neutron); the others
//! cost nothing. Pure state, tested without servers.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt;

use super::desired::{DesiredPolicy, Direction, Options, desired};
use super::index::{ClusterIndex, PodInfo, PodKey, ServiceInfo};
use super::selector::Labels;
use super::spec::{Peer, PolicySpec};

#[derive(Clone, Debug, Default)]
pub struct PolicyTracker {
    /// Changed only through the tracker's methods, which note the policies each change may move.
    cluster: ClusterIndex,
    /// Live, valid policies by uid.
    pub policies: BTreeMap<String, PolicySpec>,
    /// What the last successful reconcile of each policy made Neutron hold.
    applied: BTreeMap<String, DesiredPolicy>,
    /// The policies a change may have moved since the last [`Self::stale`]; `None`: any of them
    /// (a namespace's labels or the Services changed, nothing asked yet). A pod event, the
    /// common one, notes only the policies that can see that pod, so [`Self::stale`] computes
    /// those and not every policy of the cluster again.
    moved: Option<BTreeSet<String>>,
}

impl PolicyTracker {
    pub fn new(cluster: ClusterIndex, policies: BTreeMap<String, PolicySpec>) -> Self {
        Self {
            cluster,
            policies,
            applied: BTreeMap::new(),
            moved: None,
        }
    }

    pub fn cluster(&self) -> &ClusterIndex {
        &self.cluster
    }

    pub fn set_policy(&mut self, uid: &str, spec: PolicySpec) {
        self.note(uid);
        self.policies.insert(uid.to_string(), spec);
    }

    /// A policy deleted or no longer valid: nothing of it is tracked any more.
    pub fn remove_policy(&mut self, uid: &str) {
        self.policies.remove(uid);
        self.applied.remove(uid);
    }

    /// Records a successful reconcile (of a policy still live: one released meanwhile stays
    /// forgotten). The policy is looked at again at the next [`Self::stale`]: a change seen
    /// while it was being applied may have been judged against what it applied before.
    pub fn record_applied(&mut self, uid: &str, want: DesiredPolicy) {
        if self.policies.contains_key(uid) {
            self.applied.insert(uid.to_string(), want);
            self.note(uid);
        }
    }

    pub fn applied(&self, uid: &str) -> Option<&DesiredPolicy> {
        self.applied.get(uid)
    }

    /// Forgets what was applied (a failed reconcile: Neutron may hold anything in between).
    pub fn forget_applied(&mut self, uid: &str) {
        self.applied.remove(uid);
    }

    /// A pod added, changed or being deleted, as its watch event shows it.
    pub fn observe_pod(&mut self, pod: &Pod) {
        let key = PodKey::new(pod.namespace().unwrap_or_default(), pod.name_any());
        let before = self.cluster.pods.get(&key).cloned();
        self.cluster.observe_pod(pod);
        self.pod_changed(&key, before);
    }

    /// A pod gone (see [`ClusterIndex::remove_pod`]).
    pub fn remove_pod(&mut self, pod: &Pod) {
        let key = PodKey::new(pod.namespace().unwrap_or_default(), pod.name_any());
        let before = self.cluster.pods.get(&key).cloned();
        self.cluster.remove_pod(pod);
        self.pod_changed(&key, before);
    }

    /// Sets (`Some`) or removes the pod `key` as the model sees it.
    pub fn set_pod_info(&mut self, key: PodKey, info: Option<PodInfo>) {
        let before = match info {
            Some(info) => self.cluster.pods.insert(key.clone(), info),
            None => self.cluster.pods.remove(&key),
        };
        self.pod_changed(&key, before);
    }

    /// A namespace added or relabelled, as its watch event shows it. One being deleted keeps its
    /// labels until it is gone: its pods still run (each leaves as its own deletion starts), and
    /// selectors still match it, as the first full listing has it too.
    pub fn observe_namespace(&mut self, ns: &Namespace) {
        self.set_namespace_labels(&ns.name_any(), Some(ns.labels().clone()));
    }

    /// Sets (`Some`) or removes the labels of namespace `name`.
    pub fn set_namespace_labels(&mut self, name: &str, labels: Option<Labels>) {
        let before = match labels {
            Some(l) => self.cluster.namespaces.insert(name.to_string(), l),
            None => self.cluster.namespaces.remove(name),
        };
        if before.as_ref() != self.cluster.namespaces.get(name) {
            self.moved = None;
        }
    }

    /// The Services as last listed.
    pub fn set_services(&mut self, services: BTreeMap<(String, String), ServiceInfo>) {
        if self.cluster.services != services {
            self.cluster.services = services;
            self.moved = None;
        }
    }

    /// Sets (`Some`) or removes one Service, as its watch event shows it; true when that
    /// changed what the policies see.
    pub fn set_service(&mut self, key: (String, String), info: Option<ServiceInfo>) -> bool {
        let changed = match info {
            Some(info) => {
                self.cluster.services.get(&key) != Some(&info) && {
                    self.cluster.services.insert(key, info);
                    true
                }
            }
            None => self.cluster.services.remove(&key).is_some(),
        };
        if changed {
            self.moved = None;
        }
        changed
    }

    fn note(&mut self, uid: &str) {
        if let Some(moved) = &mut self.moved {
            moved.insert(uid.to_string());
        }
    }

    fn pod_changed(&mut self, key: &PodKey, before: Option<PodInfo>) {
        let after = self.cluster.pods.get(key);
        if before.as_ref() == after || self.moved.is_none() {
            return;
        }
        let seen: Vec<String> = self
            .policies
            .iter()
            .filter(|(_, spec)| sees(spec, &self.cluster, key, [before.as_ref(), after]))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in seen {
            self.note(&uid);
        }
    }

    /// The live policies whose desired state differs from what was last applied, with that
    /// desired state: of those a change since the last call may have moved, and those with
    /// nothing applied (new, or a reconcile that failed).
    pub fn stale(&mut self, opts: &Options) -> Vec<(String, PolicySpec, DesiredPolicy)> {
        let moved = self.moved.replace(BTreeSet::new());
        self.policies
            .iter()
            .filter(|(uid, _)| {
                moved.as_ref().is_none_or(|m| m.contains(*uid)) || !self.applied.contains_key(*uid)
            })
            .filter_map(|(uid, spec)| {
                let want = desired(spec, &self.cluster, opts);
                (self.applied.get(uid) != Some(&want)).then(|| (uid.clone(), spec.clone(), want))
            })
            .collect()
    }
}

/// Whether `spec`'s desired state can depend on the pod `key` as it was or is (`infos`): the
/// pod is in the policy's namespace (selection, named ports), a peer designates it, or an egress
/// rule looks at pods beyond its peers' selectors (a rule to anywhere, or to an ipBlock holding
/// one of its addresses: the Services in front of them, named ports resolved on them). Erring
/// on the side of yes costs one desired-state computation, never a missed change.
fn sees(spec: &PolicySpec, index: &ClusterIndex, key: &PodKey, infos: [Option<&PodInfo>; 2]) -> bool {
    if key.namespace == spec.key.namespace {
        return true;
    }
    let infos = || infos.iter().flatten();
    let rules = spec
        .ingress
        .iter()
        .flatten()
        .map(|r| (Direction::Ingress, r))
        .chain(spec.egress.iter().flatten().map(|r| (Direction::Egress, r)));
    for (dir, rule) in rules {
        let Some(peers) = &rule.peers else {
            if dir == Direction::Egress {
                return true;
            }
            continue;
        };
        for peer in peers {
            let seen = match peer {
                Peer::Pods { namespaces, pods } => {
                    index.namespace_matches(namespaces, &key.namespace)
                        && infos().any(|i| pods.matches(&i.labels))
                }
                Peer::Block { .. } => {
                    dir == Direction::Egress && infos().any(|i| i.ips.iter().any(|ip| peer.block_holds(*ip)))
                }
            };
            if seen {
                return true;
            }
        }
    }
    false
}
