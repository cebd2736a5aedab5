//! Versions of objects a handler is done with, so that the watch events of its own writes are
//! not handled again.
//!
//! A handler that writes the object it handles (a finalizer on a pod, the status of a
//! KuryrPort) gets that write back as a MODIFIED event, and being level-based it would re-read
//! everything it depends on only to find nothing to do: about two of the eight Kubernetes
//! requests per pod. After a pass that succeeded, the handler records the resourceVersions its
//! writes produced (or the one it was given, if it wrote nothing); an event carrying exactly one
//! of those versions describes the state it finished on, or one its own later write replaced
//! (the KuryrPort handler records the ports, then their activation), and is skipped. The event of
//! the last write follows any earlier one in the watch, so skipping an earlier one loses nothing;
//! handled, it would show a state the pass already left (inactive ports it would activate and
//! record again).
//!
//! Guarantees: only an identical version is skipped (any other writer changes it); a failed pass
//! records nothing; the watcher's periodic re-send ([`super::Event::resync`]) is always handled
//! in full, so drift outside the object (a KuryrPort deleted by hand) still heals; the record of
//! an object goes with its DELETED event, so memory follows live objects.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::locked::Locked;
use kube::Resource;

/// The versions of one object a pass wrote, the last first, without the object: what a handler
/// keeps of its own writes while it goes on (thousands of handlers wait at once in a burst; the
/// written objects they held were 20 MB of the controller's heap at 10,000 pods).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    uid: String,
    /// Never empty.
    resource_versions: Vec<String>,
}

impl Version {
    pub fn of<K: Resource>(obj: &K) -> Option<Self> {
        let meta = obj.meta();
        Some(Self::new(meta.uid.clone()?, meta.resource_version.clone()?))
    }

    /// The version `resource_version` of the object of uid `uid`.
    pub fn new(uid: String, resource_version: String) -> Self {
        Self {
            uid,
            resource_versions: vec![resource_version],
        }
    }

    /// `later` (a write of the same pass after `earlier`), remembering `earlier`'s versions too.
    pub fn then(earlier: Option<Self>, later: Option<Self>) -> Option<Self> {
        match (earlier, later) {
            (Some(e), Some(mut l)) if e.uid == l.uid => {
                l.resource_versions.extend(e.resource_versions);
                Some(l)
            }
            (e, l) => l.or(e),
        }
    }
}

/// What is kept of an object: the version its last pass finished on, and any its own earlier
/// writes of that pass produced (boxed: 24 bytes a slot, one for every object a handler has seen).
#[derive(Debug)]
enum At {
    Last(Box<str>),
    Several(Box<[Box<str>]>),
}

impl At {
    fn contains(&self, rv: &str) -> bool {
        match self {
            At::Last(v) => **v == *rv,
            At::Several(vs) => vs.iter().any(|v| **v == *rv),
        }
    }
}

/// uid -> the resourceVersions a handler finished on.
#[derive(Debug, Default)]
pub struct Settled {
    versions: Mutex<HashMap<Box<str>, At>>,
}

impl Settled {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, At>> {
        self.versions.locked()
    }

    /// Whether `obj` is a version a pass finished on or its own later write replaced.
    pub fn is_settled<K: Resource>(&self, obj: &K) -> bool {
        let meta = obj.meta();
        match (meta.uid.as_deref(), meta.resource_version.as_deref()) {
            (Some(uid), Some(rv)) => self.lock().get(uid).is_some_and(|at| at.contains(rv)),
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

    /// Records versions taken earlier with [`Version::of`] (and [`Version::then`]).
    pub fn settle_version(&self, v: Version) {
        let mut rvs = v.resource_versions;
        let at = if rvs.len() == 1 {
            At::Last(rvs.remove(0).into_boxed_str())
        } else {
            At::Several(rvs.into_iter().map(String::into_boxed_str).collect())
        };
        self.lock().insert(v.uid.into_boxed_str(), at);
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
        // A pass that wrote twice: the event of its first write is as settled as its last's;
        // the next pass's record replaces both.
        let two = Version::then(Version::of(&pod("u1", "8")), Version::of(&pod("u1", "9")));
        s.settle_version(two.unwrap());
        assert!(s.is_settled(&pod("u1", "8")) && s.is_settled(&pod("u1", "9")));
        assert!(!s.is_settled(&pod("u1", "7")), "a version before the pass");
        s.settle(&pod("u1", "10"));
        assert!(!s.is_settled(&pod("u1", "8")) && !s.is_settled(&pod("u1", "9")));
        assert!(s.is_settled(&pod("u1", "10")));
        // Another object's version is never taken as an earlier write.
        let mixed = Version::then(Version::of(&pod("u2", "3")), Version::of(&pod("u1", "11")));
        s.settle_version(mixed.unwrap());
        assert!(!s.is_settled(&pod("u1", "3")) && s.is_settled(&pod("u1", "11")));
        s.forget_uid("u1");
        s.forget_uid("u2");
        assert!(s.is_empty());
        // Objects without a uid or version are never settled.
        s.settle(&Pod::default());
        assert!(!s.is_settled(&Pod::default()));
    }
}
