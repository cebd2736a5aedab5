//! In-memory registry of this node's pods: their KuryrPort (fed by the
//! watchers) and what the daemon plugged for them (recorded by ADD).
//!
//! Entries exist only while there is a KuryrPort (readable or not) or an
//! attachment for the pod, so the map never outgrows the node's pods. Waiters (ADD) are woken by
//! a version counter on a `watch` channel, so no update is ever missed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kuryr_crds::KuryrPort;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::binding::PlugSpec;

/// `namespace/name` of a pod (a KuryrPort has the pod's name and namespace).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl PodKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub fn of(kp: &KuryrPort) -> Option<Self> {
        Some(Self::new(
            kp.metadata.namespace.clone()?,
            kp.metadata.name.clone()?,
        ))
    }

    /// The tag written into host-side link aliases: `kuryr:<container>:<ns>/<name>`.
    pub fn owner_tag(&self, container_id: &str) -> String {
        format!("kuryr:{container_id}:{}/{}", self.namespace, self.name)
    }

    /// Parse an owner tag back into (key, container id).
    pub fn parse_owner_tag(tag: &str) -> Option<(Self, String)> {
        let rest = tag.strip_prefix("kuryr:")?;
        let (container, pod) = rest.split_once(':')?;
        let (ns, name) = pod.split_once('/')?;
        if container.is_empty() || ns.is_empty() || name.is_empty() {
            return None;
        }
        Some((Self::new(ns, name), container.to_string()))
    }
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What ADD plugged for one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub container_id: String,
    pub netns: Option<String>,
    /// The namespace at `netns` when it was plugged (device, inode): a DEL that
    /// goes by the recorded path enters it only if it is still that one (a
    /// `/proc/<pid>/ns/net` path names another process' once the pid is reused).
    pub netns_id: Option<(u64, u64)>,
    /// Specs as plugged; empty when the attachment was restored from host
    /// link aliases after a restart (then `host_ifnames` is what we know).
    pub specs: Vec<PlugSpec>,
    pub host_ifnames: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Entry {
    pub kuryrport: Option<Arc<KuryrPort>>,
    /// Why the pod's KuryrPort cannot be read (the field named), when the API
    /// holds one this daemon cannot parse: an ADD for the pod fails at once.
    pub unreadable: Option<Arc<str>>,
    pub attachment: Option<Attachment>,
    /// UID of a pod the API reported deleted under this name.
    pub gone_uid: Option<String>,
    /// The `metadata.uid` of the KuryrPort whose deletion set `gone_uid`: only that object's late
    /// events keep the pod dead; a new KuryrPort for a live pod (its old one's finalizer stripped
    /// by hand, the controller making another) brings it back.
    pub gone_kuryrport: Option<String>,
}

/// How many deleted pods are remembered for ADDs still waiting on them.
const RECENTLY_GONE: usize = 4096;

#[derive(Default)]
pub struct Registry {
    entries: Mutex<HashMap<PodKey, Entry>>,
    /// Pods reported deleted (key, uid), newest last, bounded: an ADD for a
    /// pod with no entry left must still learn that it is gone.
    gone: Mutex<std::collections::VecDeque<(PodKey, String)>>,
    /// The UID under each pod name of this node, as the pod watch last saw it: an ADD whose runtime
    /// passes no `K8S_POD_UID` (cri-dockerd, older containerd and CRI-O) is checked against it.
    pods: Mutex<HashMap<PodKey, String>>,
    /// A pod watch feeds `pods` but has not listed them yet (a daemon just started): an ADD
    /// without `K8S_POD_UID` cannot be told from a re-created pod's until it has.
    pods_awaited: std::sync::atomic::AtomicBool,
    version: watch::Sender<u64>,
}

/// What a wait predicate decides for the current entry.
pub enum Wait<T> {
    Ready(T),
    Fail(T),
    Pending,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<PodKey, Entry>> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, key: &PodKey) -> Option<Entry> {
        self.lock().get(key).cloned()
    }

    pub fn keys(&self) -> Vec<PodKey> {
        let mut k: Vec<_> = self.lock().keys().cloned().collect();
        k.sort();
        k
    }

    /// Whether `kp` (for the pod under `e`'s name) leaves the pod dead: it is the deleted KuryrPort
    /// itself (a late event; either UID unknown counts as the same), or the pod watch reported its
    /// pod deleted (`pod_gone`). Otherwise `e` forgets the deletion.
    fn keeps_dead(e: &mut Entry, kp: &KuryrPort, pod_gone: bool) {
        let same_pod = e.gone_uid.as_deref() == Some(kp.spec.pod_uid.as_str());
        let same_object = match (&e.gone_kuryrport, &kp.metadata.uid) {
            (Some(gone), Some(uid)) => gone == uid,
            _ => true,
        };
        if !(same_pod && (pod_gone || same_object)) {
            e.gone_uid = None;
            e.gone_kuryrport = None;
        }
    }

    /// A KuryrPort was added or changed.
    pub fn apply_kuryrport(&self, kp: KuryrPort) {
        let Some(key) = PodKey::of(&kp) else { return };
        let pod_gone = self.is_gone(&key, &kp.spec.pod_uid);
        {
            let mut map = self.lock();
            let entry = map.entry(key).or_default();
            Self::keeps_dead(entry, &kp, pod_gone);
            entry.kuryrport = Some(Arc::new(kp));
            entry.unreadable = None;
        }
        self.bump();
    }

    /// The pod's KuryrPort was added or changed, but cannot be read (`why`).
    pub fn kuryrport_unreadable(&self, key: &PodKey, why: &str) {
        {
            let mut map = self.lock();
            let entry = map.entry(key.clone()).or_default();
            entry.kuryrport = None;
            entry.unreadable = Some(why.into());
        }
        self.bump();
    }

    /// A KuryrPort was deleted.
    pub fn delete_kuryrport(&self, key: &PodKey) {
        {
            let mut map = self.lock();
            if let Some(e) = map.get_mut(key) {
                if let Some(kp) = &e.kuryrport {
                    e.gone_uid = Some(kp.spec.pod_uid.clone());
                    e.gone_kuryrport = kp.metadata.uid.clone();
                }
                e.kuryrport = None;
                e.unreadable = None;
                if e.attachment.is_none() {
                    map.remove(key);
                }
            }
        }
        self.bump();
    }

    /// Whether the API reported pod `key` with `uid` deleted.
    pub fn is_gone(&self, key: &PodKey, uid: &str) -> bool {
        self.gone
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|(k, u)| k == key && u == uid)
    }

    /// A pod watch starts feeding this registry; [`Self::pods_listed`] ends the wait for its first
    /// listing.
    pub fn pod_watch_started(&self) {
        if self.pods.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            self.pods_awaited
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Whether a pod watch runs that has not listed this node's pods yet.
    pub fn pods_awaited(&self) -> bool {
        self.pods_awaited.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The UID of the pod named `key` as the pod watch last saw it.
    pub fn pod_uid(&self, key: &PodKey) -> Option<String> {
        self.pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// The pod watch saw pod `key` with `uid`. A name back with another UID means the pod with the
    /// old one is gone (a name is reused only once the old pod is deleted).
    pub fn pod_seen(&self, key: &PodKey, uid: &str) {
        let old = self
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), uid.to_string());
        match old {
            Some(old) if old != uid => self.pod_deleted(key, &old),
            Some(_) => {}
            None => self.bump(),
        }
    }

    /// A re-list of the pod watch: every pod it does not show under the UID known before was
    /// deleted while nothing watched.
    pub fn pods_listed(&self, fresh: HashMap<PodKey, String>) {
        let before = std::mem::replace(
            &mut *self.pods.lock().unwrap_or_else(|p| p.into_inner()),
            fresh.clone(),
        );
        for (key, uid) in &before {
            if fresh.get(key) != Some(uid) {
                self.pod_deleted(key, uid);
            }
        }
        self.pods_awaited
            .store(false, std::sync::atomic::Ordering::Release);
        self.bump();
    }

    /// The API reports the pod deleted: waiting ADDs for it fail with 410.
    pub fn pod_deleted(&self, key: &PodKey, uid: &str) {
        {
            let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
            if pods.get(key).is_some_and(|u| u == uid) {
                pods.remove(key);
            }
        }
        {
            let mut gone = self.gone.lock().unwrap_or_else(|p| p.into_inner());
            if gone.len() >= RECENTLY_GONE {
                gone.pop_front();
            }
            gone.push_back((key.clone(), uid.to_string()));
        }
        {
            let mut map = self.lock();
            if let Some(e) = map.get_mut(key) {
                e.gone_uid = Some(uid.to_string());
                e.gone_kuryrport = None;
                if e.attachment.is_none() && e.kuryrport.as_ref().is_none_or(|kp| kp.spec.pod_uid == uid) {
                    map.remove(key);
                }
            }
        }
        self.bump();
    }

    /// Replace every KuryrPort at once (a watcher (re)list finished), the
    /// ones that cannot be read with why: pods whose KuryrPort vanished while
    /// we were not watching lose it.
    pub fn replace_kuryrports(&self, kps: Vec<KuryrPort>, unreadable: Vec<(PodKey, String)>) {
        let mut fresh: HashMap<PodKey, (KuryrPort, bool)> = HashMap::new();
        for kp in kps {
            if let Some(k) = PodKey::of(&kp) {
                let pod_gone = self.is_gone(&k, &kp.spec.pod_uid);
                fresh.insert(k, (kp, pod_gone));
            }
        }
        {
            let mut map = self.lock();
            let unreadable: HashMap<PodKey, String> = unreadable.into_iter().collect();
            let listed = |k: &PodKey| fresh.contains_key(k) || unreadable.contains_key(k);
            map.retain(|k, e| {
                if !listed(k) {
                    e.kuryrport = None;
                    e.unreadable = None;
                }
                e.attachment.is_some() || listed(k)
            });
            for (k, (kp, pod_gone)) in fresh {
                let e = map.entry(k).or_default();
                Self::keeps_dead(e, &kp, pod_gone);
                e.kuryrport = Some(Arc::new(kp));
                e.unreadable = None;
            }
            for (k, why) in unreadable {
                let e = map.entry(k).or_default();
                e.kuryrport = None;
                e.unreadable = Some(why.into());
            }
        }
        self.bump();
    }

    pub fn set_attachment(&self, key: &PodKey, att: Attachment) {
        self.lock().entry(key.clone()).or_default().attachment = Some(att);
        self.bump();
    }

    /// Drop the attachment; the entry goes too when no KuryrPort is left.
    pub fn clear_attachment(&self, key: &PodKey) -> Option<Attachment> {
        let mut map = self.lock();
        let e = map.get_mut(key)?;
        let att = e.attachment.take();
        if e.kuryrport.is_none() {
            map.remove(key);
        }
        att
    }

    /// All attachments (for GC).
    pub fn attachments(&self) -> Vec<(PodKey, Attachment)> {
        self.lock()
            .iter()
            .filter_map(|(k, e)| e.attachment.clone().map(|a| (k.clone(), a)))
            .collect()
    }

    /// Wait until `decide` returns Ready/Fail for the pod's entry or the
    /// deadline passes (`Err(last entry)`). `on_pending` runs once, the first
    /// time the answer is Pending, before the wait starts (to post a "waiting"
    /// event while the caller is still waiting); it is bounded by the deadline
    /// and no update is missed while it runs.
    pub async fn wait_for<T, F>(
        &self,
        key: &PodKey,
        deadline: Instant,
        mut decide: impl FnMut(Option<&Entry>) -> Wait<T>,
        on_pending: impl FnOnce() -> F,
    ) -> Result<Result<T, T>, Option<Entry>>
    where
        F: std::future::Future<Output = ()>,
    {
        let mut rx = self.version.subscribe();
        let mut on_pending = Some(on_pending);
        loop {
            rx.borrow_and_update();
            let decision = {
                let map = self.lock();
                decide(map.get(key))
            };
            match decision {
                Wait::Ready(t) => return Ok(Ok(t)),
                Wait::Fail(t) => return Ok(Err(t)),
                Wait::Pending => {}
            }
            if let Some(hook) = on_pending.take() {
                // Decided again after it, whatever time is left: what arrived while it ran
                // may be the answer.
                let _ = tokio::time::timeout_at(deadline, hook()).await;
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
                return Err(self.get(key));
            }
        }
    }
}

/// A small helper for tests and benches: time left until `deadline`.
pub fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kuryr_crds::KuryrPortSpec;

    fn kp(ns: &str, name: &str, uid: &str) -> KuryrPort {
        let mut kp = KuryrPort::new(
            name,
            KuryrPortSpec {
                pod_uid: uid.into(),
                pod_node_name: "n1".into(),
                pod_static: false,
            },
        );
        kp.metadata.namespace = Some(ns.into());
        kp
    }

    #[test]
    fn owner_tags_round_trip() {
        let k = PodKey::new("ns", "p");
        let tag = k.owner_tag("abc123");
        assert_eq!(PodKey::parse_owner_tag(&tag), Some((k, "abc123".into())));
        assert_eq!(PodKey::parse_owner_tag("something else"), None);
        assert_eq!(PodKey::parse_owner_tag("kuryr::ns/p"), None);
    }

    #[test]
    fn entries_go_away_with_their_pod() {
        let r = Registry::new();
        let k = PodKey::new("ns", "p");
        r.apply_kuryrport(kp("ns", "p", "u1"));
        assert_eq!(r.len(), 1);
        r.set_attachment(
            &k,
            Attachment {
                container_id: "c".into(),
                netns: None,
                netns_id: None,
                specs: vec![],
                host_ifnames: vec![],
            },
        );
        r.delete_kuryrport(&k);
        assert_eq!(r.len(), 1, "kept while something is plugged");
        assert!(r.clear_attachment(&k).is_some());
        assert!(r.is_empty());

        r.apply_kuryrport(kp("ns", "q", "u2"));
        r.pod_deleted(&PodKey::new("ns", "q"), "u2");
        assert!(r.is_empty());
        // A pod deleted with a newer KuryrPort under the same name stays.
        r.apply_kuryrport(kp("ns", "q", "u3"));
        r.pod_deleted(&PodKey::new("ns", "q"), "u2");
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn relist_prunes_vanished_kuryrports() {
        let r = Registry::new();
        r.apply_kuryrport(kp("ns", "a", "1"));
        r.apply_kuryrport(kp("ns", "b", "2"));
        r.replace_kuryrports(vec![kp("ns", "b", "2"), kp("ns", "c", "3")], vec![]);
        assert_eq!(r.keys(), vec![PodKey::new("ns", "b"), PodKey::new("ns", "c")]);
    }

    #[test]
    fn an_unreadable_kuryrport_is_kept_with_why_until_it_is_fixed_or_gone() {
        let r = Registry::new();
        let (a, b) = (PodKey::new("ns", "a"), PodKey::new("ns", "b"));
        r.apply_kuryrport(kp("ns", "a", "1"));
        r.kuryrport_unreadable(&a, "status.vifs.eth0: bad");
        let e = r.get(&a).expect("kept");
        assert!(e.kuryrport.is_none(), "the old copy is not served any more");
        assert_eq!(e.unreadable.as_deref(), Some("status.vifs.eth0: bad"));
        r.apply_kuryrport(kp("ns", "a", "1"));
        assert!(r.get(&a).expect("kept").unreadable.is_none(), "fixed");
        // A re-list keeps what it lists, readable or not, and drops the rest.
        r.replace_kuryrports(vec![], vec![(b.clone(), "spec: bad".into())]);
        assert_eq!(r.keys(), vec![b.clone()]);
        assert_eq!(r.get(&b).and_then(|e| e.unreadable).as_deref(), Some("spec: bad"));
        r.delete_kuryrport(&b);
        assert!(r.is_empty());
    }

    #[tokio::test]
    async fn waiters_wake_on_updates_and_time_out() {
        let r = Arc::new(Registry::new());
        let k = PodKey::new("ns", "p");
        let r2 = r.clone();
        let waiter = tokio::spawn(async move {
            let k = PodKey::new("ns", "p");
            r2.wait_for(
                &k,
                Instant::now() + Duration::from_secs(5),
                |e| match e.and_then(|e| e.kuryrport.clone()) {
                    Some(kp) => Wait::Ready(kp.spec.pod_uid.clone()),
                    None => Wait::Pending,
                },
                || async {},
            )
            .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        r.apply_kuryrport(kp("ns", "p", "u9"));
        let got = waiter.await.ok().and_then(|r| r.ok()).and_then(|r| r.ok());
        assert_eq!(got.as_deref(), Some("u9"));

        let pending = std::sync::atomic::AtomicUsize::new(0);
        let res: Result<Result<(), ()>, _> = r
            .wait_for(
                &k,
                Instant::now() + Duration::from_millis(30),
                |_| Wait::Pending,
                || async {
                    pending.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                },
            )
            .await;
        assert!(res.is_err());
        assert_eq!(pending.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
