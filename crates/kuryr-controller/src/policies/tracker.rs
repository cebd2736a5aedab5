//! Which policies a cluster change affects: the cluster index and the live policies, both fed by
//! watch events, and what was last applied per policy. After a pod or namespace event only the
//! policies whose desired state moved are reconciled (and read back from Neutron); the others
//! cost nothing. Pure state, tested without servers.

use std::collections::BTreeMap;

use super::desired::{DesiredPolicy, Options, desired};
use super::index::ClusterIndex;
use super::spec::PolicySpec;

#[derive(Clone, Debug, Default)]
pub struct PolicyTracker {
    pub cluster: ClusterIndex,
    /// Live, valid policies by uid.
    pub policies: BTreeMap<String, PolicySpec>,
    /// What the last successful reconcile of each policy made Neutron hold.
    applied: BTreeMap<String, DesiredPolicy>,
}

impl PolicyTracker {
    pub fn new(cluster: ClusterIndex, policies: BTreeMap<String, PolicySpec>) -> Self {
        Self {
            cluster,
            policies,
            applied: BTreeMap::new(),
        }
    }

    pub fn set_policy(&mut self, uid: &str, spec: PolicySpec) {
        self.policies.insert(uid.to_string(), spec);
    }

    /// A policy deleted or no longer valid: nothing of it is tracked any more.
    pub fn remove_policy(&mut self, uid: &str) {
        self.policies.remove(uid);
        self.applied.remove(uid);
    }

    /// Records a successful reconcile (of a policy still live: one released meanwhile stays
    /// forgotten).
    pub fn record_applied(&mut self, uid: &str, want: DesiredPolicy) {
        if self.policies.contains_key(uid) {
            self.applied.insert(uid.to_string(), want);
        }
    }

    pub fn applied(&self, uid: &str) -> Option<&DesiredPolicy> {
        self.applied.get(uid)
    }

    /// Forgets what was applied (a failed reconcile: Neutron may hold anything in between).
    pub fn forget_applied(&mut self, uid: &str) {
        self.applied.remove(uid);
    }

    /// The live policies whose desired state differs from what was last applied, with that
    /// desired state.
    pub fn stale(&self, opts: &Options) -> Vec<(String, PolicySpec, DesiredPolicy)> {
        self.policies
            .iter()
            .filter_map(|(uid, spec)| {
                let want = desired(spec, &self.cluster, opts);
                (self.applied.get(uid) != Some(&want)).then(|| (uid.clone(), spec.clone(), want))
            })
            .collect()
    }
}
