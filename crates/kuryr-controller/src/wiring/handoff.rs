//! Pods handed from the `vif` handler to the `kuryrport` handler.
//!
//! The `vif` handler holds the pod as its finalizer patch left it (the API server's answer) when
//! it creates the pod's KuryrPort (handed over just before the create, whose event may reach
//! the other handler first); the `kuryrport` handler needs that pod a moment later to plan
//! the interfaces. Handing it over saves a GET per pod, a fifth of the controller's Kubernetes
//! requests in a burst.
//!
//! Guarantees:
//! - A pod is taken at most once, by the uid its KuryrPort names; a missing one (evicted, taken
//!   by an earlier pass, another replica's pod) just means the handler reads the pod itself.
//! - Nothing handed over is fresher than a GET would have been a moment earlier: a change after
//!   the hand-over reaches the handlers as an event of its own, as it would after a GET.
//! - Bounded: at most `capacity` pods, each at most [`MAX_AGE`] old, and only what planning reads
//!   (metadata without `managedFields`, spec); a full hand-over refuses new pods instead of
//!   dropping the ones a burst is about to take.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::locked::Locked;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// A pod not taken within this long is not going to be (its KuryrPort went to another replica,
/// or its handler failed and reads the pod again).
pub const MAX_AGE: Duration = Duration::from_secs(30);

/// What a burst of a few hundred pods keeps in flight between the two handlers; a larger burst
/// reads the rest (about 1 KB a pod kept).
pub const DEFAULT_CAPACITY: usize = 512;

pub struct PodHandoff {
    pods: Mutex<HashMap<String, (Instant, Box<Pod>)>>,
    capacity: usize,
}

impl Default for PodHandoff {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl PodHandoff {
    pub fn new(capacity: usize) -> Self {
        Self {
            pods: Mutex::default(),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Box<Pod>)>> {
        self.pods.locked()
    }

    /// Hands `pod` over (what planning reads of it); false when it was not kept (no uid, full).
    pub fn put(&self, pod: &Pod) -> bool {
        self.put_at(pod, Instant::now())
    }

    fn put_at(&self, pod: &Pod, now: Instant) -> bool {
        let Some(uid) = pod.uid() else {
            return false;
        };
        let mut pods = self.lock();
        if pods.len() >= self.capacity {
            pods.retain(|_, (at, _)| now.saturating_duration_since(*at) < MAX_AGE);
            if pods.len() >= self.capacity {
                return false;
            }
        }
        let mut metadata = pod.metadata.clone();
        metadata.managed_fields = None;
        let kept = Pod {
            metadata,
            spec: pod.spec.clone(),
            status: None,
        };
        pods.insert(uid, (now, Box::new(kept)));
        true
    }

    /// The pod of uid `uid`, if it was handed over within [`MAX_AGE`]; it is not kept after.
    pub fn take(&self, uid: &str) -> Option<Box<Pod>> {
        self.take_at(uid, Instant::now())
    }

    fn take_at(&self, uid: &str, now: Instant) -> Option<Box<Pod>> {
        let (at, pod) = self.lock().remove(uid)?;
        (now.saturating_duration_since(at) < MAX_AGE).then_some(pod)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{uid}"), "namespace": "default", "uid": uid,
                "labels": {"app": "a"},
                "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Pending", "hostIP": "10.0.0.1"}
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_is_taken_once_by_its_uid_with_what_planning_reads() {
        let h = PodHandoff::new(4);
        assert!(h.put(&pod("u1")));
        assert!(h.take("u2").is_none());
        let got = h.take("u1").unwrap();
        assert_eq!(got.metadata.name.as_deref(), Some("p-u1"));
        assert_eq!(got.labels().get("app").map(String::as_str), Some("a"));
        assert_eq!(got.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some("n1"));
        assert!(got.metadata.managed_fields.is_none());
        assert!(got.status.is_none());
        assert!(h.take("u1").is_none(), "taken twice");
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn a_full_handoff_keeps_the_pods_it_has_and_makes_room_only_from_stale_ones() {
        let h = PodHandoff::new(2);
        let t0 = Instant::now();
        assert!(h.put_at(&pod("a"), t0));
        assert!(h.put_at(&pod("b"), t0 + Duration::from_secs(1)));
        // Full: the pods a burst is about to take stay, the new one is refused.
        assert!(!h.put_at(&pod("c"), t0 + Duration::from_secs(2)));
        assert_eq!(h.len(), 2);
        // Once "a" is older than MAX_AGE it makes room.
        assert!(h.put_at(&pod("d"), t0 + MAX_AGE));
        assert!(h.take_at("a", t0 + MAX_AGE).is_none());
        assert!(h.take_at("b", t0 + MAX_AGE).is_some());
        assert!(h.take_at("d", t0 + MAX_AGE).is_some());
    }

    #[test]
    fn a_pod_left_too_long_is_read_again_and_one_without_uid_is_not_kept() {
        let h = PodHandoff::new(2);
        let t0 = Instant::now();
        assert!(h.put_at(&pod("a"), t0));
        assert!(h.take_at("a", t0 + MAX_AGE).is_none());
        assert_eq!(h.len(), 0, "an expired pod is dropped when looked up");
        let mut no_uid = pod("x");
        no_uid.metadata.uid = None;
        assert!(!h.put(&no_uid));
    }
}
