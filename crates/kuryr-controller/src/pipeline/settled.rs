//! Versions of objects a handler is done with, so that the watch event of its own last write
//! is not handled again.
//!
//! A handler that writes the object it handles (a finalizer on a pod, the status of a
//! KuryrPort) gets that write back as a MODIFIED event, and being level-based it would re-read
//! everything it depends on only to find nothing to do: about two of the eight Kubernetes
//! requests per pod. After a pass that succeeded, the handler records the resourceVersion its
//! last write produced (or the one it was given, if it wrote nothing); an event carrying exactly
//! that version describes the state it finished on and is skipped.
//!
//! Guarantees: only an identical version is skipped (any other writer changes it); a failed pass
//! records nothing; the watcher's periodic re-send ([`super::Event::resync`]) is always handled
//! in full, so drift outside the object (a KuryrPort deleted by hand) still heals; the record of
//! an object goes with its DELETED event, so memory follows live objects.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Resource;

/// An object's uid and resourceVersion, without the object: what a handler keeps of its own
/// write while it goes on (thousands of handlers wait at once in a burst; the written objects
/// they held were 20 MB of the controller's heap at 10,000 pods).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    uid: String,
    resource_version: String,
}

impl Version {
    pub fn of<K: Resource>(obj: &K) -> Option<Self> {
        let meta = obj.meta();
        Some(Self {
            uid: meta.uid.clone()?,
            resource_version: meta.resource_version.clone()?,
        })
    }
}

/// uid -> the resourceVersion a handler finished on (boxed: 32 bytes a slot, one for every
/// object a handler has seen).
#[derive(Debug, Default)]
pub struct Settled {
    versions: Mutex<HashMap<Box<str>, Box<str>>>,
}

impl Settled {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Box<str>>> {
        self.versions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `obj` is exactly the version a pass finished on.
    pub fn is_settled<K: Resource>(&self, obj: &K) -> bool {
        let meta = obj.meta();
        match (meta.uid.as_deref(), meta.resource_version.as_deref()) {
            (Some(uid), Some(rv)) => self.lock().get(uid).is_some_and(|v| **v == *rv),
            _ => false,
        }
    }

    /// Records that a pass finished with the object at `obj`'s version (the object as the
    /// handler's last write returned it, or as it was handed over when nothing was written).
    pub fn settle<K: Resource>(&self, obj: &K) {
        if let Some(v) = Version::of(obj) {
            self.settle_version(v);
        }
    }

    /// Records a version taken earlier with [`Version::of`].
    pub fn settle_version(&self, v: Version) {
        self.lock()
            .insert(v.uid.into_boxed_str(), v.resource_version.into_boxed_str());
    }

    /// Forgets `obj` (it was deleted, or a pass over it is about to change it).
    pub fn forget<K: Resource>(&self, obj: &K) {
        if let Some(uid) = obj.meta().uid.as_deref() {
            self.forget_uid(uid);
        }
    }

    /// Forgets the object with this uid.
    pub fn forget_uid(&self, uid: &str) {
        self.lock().remove(uid);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::ObjectMeta;

    use super::*;

    fn pod(uid: &str, rv: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn only_the_exact_version_a_pass_finished_on_is_settled() {
        let s = Settled::default();
        assert!(!s.is_settled(&pod("u1", "5")), "nothing recorded yet");
        s.settle(&pod("u1", "5"));
        assert!(s.is_settled(&pod("u1", "5")));
        assert!(!s.is_settled(&pod("u1", "6")), "a later write by anyone");
        assert!(!s.is_settled(&pod("u2", "5")), "another object");
        s.forget(&pod("u1", "5"));
        assert!(!s.is_settled(&pod("u1", "5")));
        s.settle_version(Version::of(&pod("u1", "7")).unwrap());
        assert!(s.is_settled(&pod("u1", "7")));
        s.forget(&pod("u1", "7"));
        assert!(s.is_empty());
        // Objects without a uid or version are never settled.
        s.settle(&Pod::default());
        assert!(!s.is_settled(&Pod::default()));
    }
}
