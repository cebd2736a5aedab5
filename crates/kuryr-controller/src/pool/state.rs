//! The pure pool bookkeeping: which ports each pool holds and what to do next. No I/O and no
//! clock: callers pass `now`, execute the returned decisions (bulk creates, Neutron updates,
//! deletions) and report back. Every pool decision is made here so it can be tested
//! without a server:
//!
//! - refill after every allocation when fewer than `min` remain: `max(batch, min - size, pods
//!   waiting)` ports in one bulk request (surge: a burst is served by one bulk, not by batch after
//!   batch), spares capped by `max`, the request by [`Limits::bulk`]; every waiting pod is
//!   counted, so `max` never stops a pod from getting its port;
//! - at most one populate per key, at most `max_concurrent_populate` across keys (blocked keys
//!   are started when a slot frees up);
//! - a failed refill backs the pool off (exponential with jitter, [`Backoff`]): requests meanwhile
//!   share the failure instead of each starting a refill; success or [`Pools::reset_backoff`]
//!   (capacity came back) ends it;
//! - `max` holds on every path: recovery and the periodic [`Pools::plan_trim`] delete spares
//!   beyond it, not only the recycle pass;
//! - a port in use remembers the pod holding it: a release by any other pod (a finalizer retried
//!   after the port was recycled and handed on) is stale and ignored, so a port never goes to two
//!   pods;
//! - ports in use that no KuryrPort records (a pod that took a port and never recorded it) are
//!   found by [`Pools::unrecorded_in_use`] and forgotten, so the orphan sweep can delete them;
//! - an empty pool borrows from a sibling (same deployment/host/project/network/subnets, other
//!   security groups) so the caller can re-apply the groups instead of waiting;
//! - the recycle pass returns released ports to `available` or deletes them at `max`;
//! - the TTL pass deletes idle ports while the pool stays above `min`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// What makes pooled ports interchangeable. `host` is the node (bare metal), the trunk id
/// (nested VLAN) or the VM port id (nested macvlan). `subnets` are the subnets the ports have
/// fixed IPs on: two pools on one network but different subnets are different pools (a port on
/// the pod subnet must never serve an extra interface asked for on another subnet). Subnets and
/// security groups are sorted and unique.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub deployment: String,
    pub host: String,
    pub project_id: String,
    pub network_id: String,
    pub subnets: Vec<String>,
    pub security_groups: Vec<String>,
}

impl Key {
    pub fn new(
        deployment: impl Into<String>,
        host: impl Into<String>,
        project_id: impl Into<String>,
        network_id: impl Into<String>,
        subnets: impl IntoIterator<Item = String>,
        security_groups: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            deployment: deployment.into(),
            host: host.into(),
            project_id: project_id.into(),
            network_id: network_id.into(),
            subnets: sorted_unique(subnets),
            security_groups: sorted_unique(security_groups),
        }
    }

    /// The KuryrPortPool `subnetId` of this key: the sorted subnet ids, comma-joined (just the
    /// id in the normal one-subnet case). Lossless, so [`Key::split_subnets`] reads it back.
    pub fn subnet_id(&self) -> String {
        self.subnets.join(",")
    }

    /// The subnets of a KuryrPortPool `subnetId` (see [`Key::subnet_id`]).
    pub fn split_subnets(subnet_id: &str) -> Vec<String> {
        subnet_id
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Same place, network and subnets, different security groups: its ports serve us after
    /// one security-group update.
    pub fn is_sibling_of(&self, other: &Key) -> bool {
        self.same_network(other)
            && self.subnets == other.subnets
            && self.security_groups != other.security_groups
    }

    /// Same deployment, host, project and network (subnets and security groups aside).
    pub fn same_network(&self, other: &Key) -> bool {
        self.deployment == other.deployment
            && self.host == other.host
            && self.project_id == other.project_id
            && self.network_id == other.network_id
    }
}

fn sorted_unique(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let set: BTreeSet<String> = items.into_iter().collect();
    set.into_iter().collect()
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}/{}/[{}]",
            self.deployment,
            self.host,
            self.project_id,
            self.network_id,
            self.subnet_id(),
            self.security_groups.join(",")
        )
    }
}

/// `[vif_pool]` sizes, in the units the decisions use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub min: usize,
    /// 0 = unlimited.
    pub max: usize,
    pub batch: usize,
    /// `None` = ports live forever.
    pub ttl: Option<Duration>,
    pub max_concurrent_populate: usize,
    /// At most this many ports in one bulk create (a surge larger than this is served by
    /// successive refills).
    pub bulk: usize,
}

/// The largest bulk create a refill sends: a real neutron-server takes about 10 s for 50 bound
/// ports, longer requests risk client timeouts.
pub const MAX_BULK: usize = 50;

impl Limits {
    pub fn from_config(cfg: &kuryr_config::VifPoolSection) -> Self {
        let to_usize = |v: u32| usize::try_from(v).unwrap_or(usize::MAX);
        Self {
            min: to_usize(cfg.ports_pool_min),
            max: to_usize(cfg.ports_pool_max),
            batch: to_usize(cfg.ports_pool_batch.get()),
            ttl: (cfg.ports_pool_ttl > 0).then(|| Duration::from_secs(cfg.ports_pool_ttl)),
            max_concurrent_populate: to_usize(cfg.ports_pool_max_concurrent_populate.get()),
            bulk: MAX_BULK.max(to_usize(cfg.ports_pool_batch.get())),
        }
    }
}

/// What the pool records about itself besides its key (needed for its KuryrPortPool object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolMeta {
    /// KuryrPortPool name, also the value of the pool tag on its Neutron ports.
    pub name: String,
    pub nested: bool,
}

/// A port a pod holds: since when, and which pod (its uid; `None` when unknown, e.g. recovered
/// from a KuryrPort without one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub since: Timestamp,
    pub holder: Option<String>,
}

/// What a release did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Released {
    /// Back in the pool, recyclable.
    Back,
    /// Already spare (a repeated release): nothing changed.
    Already,
    /// Held by another pod now (the releaser's port was recycled and handed on since): ignored.
    Stale { holder: String },
}

/// A port held by a pool. `data` is whatever the caller needs to hand it out (the VIF).
#[derive(Clone, Debug, PartialEq)]
pub struct Entry<T> {
    pub port_id: String,
    pub data: T,
    /// When it entered its current list (idle age for TTL, wait for recycling).
    pub since: Timestamp,
    /// Recyclable ports: the pod that released it.
    pub released_by: Option<String>,
}

impl<T> Entry<T> {
    pub fn new(port_id: impl Into<String>, data: T, since: Timestamp) -> Self {
        Self {
            port_id: port_id.into(),
            data,
            since,
            released_by: None,
        }
    }
}

#[derive(Debug)]
pub struct Pool<T> {
    pub meta: PoolMeta,
    available: VecDeque<Entry<T>>,
    recyclable: Vec<Entry<T>>,
    /// Taken by a recycle pass, being updated or deleted; still owned (persisted as recyclable).
    recycling: Vec<Entry<T>>,
    /// Port id -> when, and by which pod.
    in_use: BTreeMap<String, Held>,
    populating: bool,
    /// A refill was wanted while the global cap was reached.
    refill_blocked: bool,
    /// Pods that found the pool empty and wait for a port, with when they last asked: the
    /// demand a refill is sized by. A pod leaves it when it gets a port or stops asking.
    waiting: BTreeMap<String, Timestamp>,
    /// A pod was served from a sibling pool: this one has no port of its own groups yet and
    /// refills a batch (not one port per such pod: they have theirs).
    lacks_own: bool,
    last_refill: Option<Timestamp>,
    last_error: Option<(RefillFailure, Timestamp)>,
    /// Refills failed in a row (0 after a success or a reset).
    failures: u32,
    /// No refill before this (backing off after a failure).
    retry_at: Option<Timestamp>,
}

impl<T> Pool<T> {
    fn new(meta: PoolMeta) -> Self {
        Self {
            meta,
            available: VecDeque::new(),
            recyclable: Vec::new(),
            recycling: Vec::new(),
            in_use: BTreeMap::new(),
            populating: false,
            refill_blocked: false,
            waiting: BTreeMap::new(),
            lacks_own: false,
            last_refill: None,
            last_error: None,
            failures: 0,
            retry_at: None,
        }
    }

    pub fn available(&self) -> impl Iterator<Item = &Entry<T>> {
        self.available.iter()
    }

    /// Recyclable ports, including the ones a recycle pass is processing.
    pub fn recyclable(&self) -> impl Iterator<Item = &Entry<T>> {
        self.recyclable.iter().chain(&self.recycling)
    }

    pub fn in_use(&self) -> &BTreeMap<String, Held> {
        &self.in_use
    }

    pub fn available_len(&self) -> usize {
        self.available.len()
    }

    pub fn recyclable_len(&self) -> usize {
        self.recyclable.len() + self.recycling.len()
    }

    pub fn is_populating(&self) -> bool {
        self.populating
    }

    pub fn last_refill(&self) -> Option<Timestamp> {
        self.last_refill
    }

    /// The failure of the last refill, until one succeeds.
    pub fn last_error(&self) -> Option<&(RefillFailure, Timestamp)> {
        self.last_error.as_ref()
    }

    /// When the pool may refill again after a failure (`None`: not backing off).
    pub fn retry_at(&self) -> Option<Timestamp> {
        self.retry_at
    }

    /// Refills failed in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Pods waiting for a port of this pool.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Every port the pool accounts for (available, recyclable, in use).
    fn total(&self) -> usize {
        self.available.len() + self.recyclable_len() + self.in_use.len()
    }

    fn owns(&self, port_id: &str) -> bool {
        self.in_use.contains_key(port_id)
            || self.available.iter().any(|e| e.port_id == port_id)
            || self.recyclable().any(|e| e.port_id == port_id)
    }
}

/// Why a refill failed, as the pod waiting for the pool must see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefillFailure {
    pub message: String,
    /// The error label (`OverQuota`, `IpAddressGenerationFailure`, ...): the Event reason.
    pub kind: &'static str,
    /// Quota or address exhaustion: the user must see it (an Event on the pod).
    pub user_visible: bool,
}

impl From<&str> for RefillFailure {
    fn from(message: &str) -> Self {
        Self {
            message: message.to_string(),
            kind: "RefillFailed",
            user_visible: false,
        }
    }
}

/// One bulk create to run: `n` ports for `key`, tagged with the pool `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refill {
    pub key: Key,
    pub name: String,
    pub n: usize,
    /// An operator's populate: exactly `n` ports in one request. A refill's `n` may be cut to
    /// what the deployment's Neutron answers in one request's time; pods still waiting and a
    /// pool still below `min` get the next refill, planned as this one lands (the `batch`
    /// surplus beyond that is not asked again).
    pub exact: bool,
}

/// What [`Pools::take`] found.
#[derive(Debug, PartialEq)]
pub enum Take<T> {
    /// A port with the right security groups: hand it out as is.
    Hit(Entry<T>),
    /// A port of a sibling pool: re-apply `key`'s security groups before handing it out.
    Borrowed { entry: Entry<T>, from: Key },
    /// Nothing to give: ResourceNotReady until the refill lands.
    Empty,
}

/// [`Take`] plus the refills the allocation triggered (start them now).
#[derive(Debug, PartialEq)]
pub struct Taken<T> {
    pub take: Take<T>,
    pub refills: Vec<Refill>,
}

/// What a recycle pass decided for one released port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecycleAction {
    /// Re-apply the pool's security groups, reset name/device id, then `Returned`.
    Return,
    /// The pool is at max: delete the port.
    Delete,
}

#[derive(Debug, PartialEq)]
pub struct RecycleStep<T> {
    pub key: Key,
    pub port_id: String,
    pub data: T,
    pub action: RecycleAction,
}

/// How a recycle step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecycleOutcome {
    /// Cleaned: back to available.
    Returned,
    /// Deleted, or found gone: forget it.
    Dropped,
    /// The Neutron call failed: keep it recyclable for the next pass.
    Retry,
}

/// How long a pool waits after failed refills: `initial` doubling per failure up to `cap`, each
/// wait drawn from its upper half (jitter, so that pools failing together do not retry together).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        // With the quota exhausted a pool tries about once a minute; capacity coming back is
        // noticed sooner through `Pools::reset_backoff`.
        Self {
            initial: Duration::from_secs(2),
            cap: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The wait after `failures` failures in a row, for a `jitter` in [0, 1).
    pub fn wait(&self, failures: u32, jitter: f64) -> Duration {
        let exp = self
            .initial
            .saturating_mul(1u32 << failures.saturating_sub(1).min(16));
        exp.min(self.cap).mul_f64(0.5 + jitter.clamp(0.0, 1.0) / 2.0)
    }
}

/// A pod stops counting as waiting when it has not asked again for this long (deleted, or its
/// retries ran out): the handler retries at most every 15 s.
const WAITING_EXPIRY: SignedDuration = SignedDuration::from_secs(60);

/// Every pool of one pool driver.
#[derive(Debug)]
pub struct Pools<T> {
    limits: Limits,
    backoff: Backoff,
    pools: BTreeMap<Key, Pool<T>>,
    populating: usize,
    /// Pools changed since the last [`Pools::take_dirty`] (what the CRD flusher writes).
    dirty: BTreeSet<Key>,
    /// Ports in use that no pool may take back ([`Pools::mark_unservable`]).
    unservable: BTreeSet<String>,
    /// xorshift state for the backoff jitter (no I/O here: seeded by the caller).
    rng: u64,
}

impl<T> Pools<T> {
    pub fn new(limits: Limits) -> Self {
        Self::with_backoff(limits, Backoff::default(), 0x9e37_79b9_7f4a_7c15)
    }

    /// `seed` drives the backoff jitter (any value; 0 is replaced).
    pub fn with_backoff(limits: Limits, backoff: Backoff, seed: u64) -> Self {
        Self {
            limits,
            backoff,
            pools: BTreeMap::new(),
            populating: 0,
            dirty: BTreeSet::new(),
            unservable: BTreeSet::new(),
            rng: seed.max(1),
        }
    }

    fn jitter(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        // 53 random bits as a fraction in [0, 1).
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn get(&self, key: &Key) -> Option<&Pool<T>> {
        self.pools.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Pool<T>)> {
        self.pools.iter()
    }

    pub fn len(&self) -> usize {
        self.pools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// Bulk creates in flight across all pools.
    pub fn populating(&self) -> usize {
        self.populating
    }

    /// Creates the pool for `key` when it does not exist yet.
    pub fn ensure(&mut self, key: &Key, meta: impl FnOnce() -> PoolMeta) -> &mut Pool<T> {
        if !self.pools.contains_key(key) {
            self.dirty.insert(key.clone());
        }
        self.pools.entry(key.clone()).or_insert_with(|| Pool::new(meta()))
    }

    /// The pool owning `port_id` (available, recyclable or in use).
    pub fn owner_of(&self, port_id: &str) -> Option<&Key> {
        self.pools.iter().find(|(_, p)| p.owns(port_id)).map(|(k, _)| k)
    }

    /// Every port id any pool accounts for.
    pub fn port_ids(&self) -> BTreeSet<String> {
        let mut ids = BTreeSet::new();
        for p in self.pools.values() {
            ids.extend(p.available.iter().map(|e| e.port_id.clone()));
            ids.extend(p.recyclable().map(|e| e.port_id.clone()));
            ids.extend(p.in_use.keys().cloned());
        }
        ids
    }

    /// The allocation of one port for `key` (pool created by [`Pools::ensure`] first) by
    /// `waiter` (the pod asking). Takes the oldest available port (FIFO: the longest-bound port
    /// is the likeliest to be ACTIVE), else borrows from a sibling, else reports empty and
    /// counts `waiter` as waiting; then plans the refill.
    pub fn take(&mut self, key: &Key, waiter: &str, now: Timestamp) -> Taken<T> {
        let Some(pool) = self.pools.get_mut(key) else {
            return Taken {
                take: Take::Empty,
                refills: Vec::new(),
            };
        };
        let held = Held {
            since: now,
            holder: Some(waiter.to_string()),
        };
        let take = if let Some(entry) = pool.available.pop_front() {
            pool.in_use.insert(entry.port_id.clone(), held);
            pool.waiting.remove(waiter);
            self.dirty.insert(key.clone());
            Take::Hit(entry)
        } else {
            pool.waiting.insert(waiter.to_string(), now);
            match self.borrow_from_sibling(key) {
                Some((from, entry)) => {
                    // Served: no longer waiting, or the surge would size this pool's refill by
                    // pods that have their ports already. The pool still refills to its `min`.
                    if let Some(pool) = self.pools.get_mut(key) {
                        pool.waiting.remove(waiter);
                        pool.lacks_own = true;
                        pool.in_use.insert(entry.port_id.clone(), held);
                    }
                    self.dirty.insert(key.clone());
                    self.dirty.insert(from.clone());
                    Take::Borrowed { entry, from }
                }
                None => Take::Empty,
            }
        };
        let refills = self.plan_refill(key, now).into_iter().collect();
        Taken { take, refills }
    }

    /// A sibling's oldest port, preferring siblings above their own `min` (taking from those
    /// does not make them refill) and then the fullest. The donor is not refilled: nobody asked
    /// for its security groups.
    fn borrow_from_sibling(&mut self, key: &Key) -> Option<(Key, Entry<T>)> {
        let min = self.limits.min;
        let donor = self
            .pools
            .iter()
            .filter(|(k, p)| k.is_sibling_of(key) && !p.available.is_empty())
            .max_by_key(|(_, p)| (p.available.len() > min, p.available.len()))
            .map(|(k, _)| k.clone())?;
        let entry = self.pools.get_mut(&donor)?.available.pop_front()?;
        Some((donor, entry))
    }

    /// Plans a refill of `key` if it needs one and may have one now. Needs one when fewer than
    /// `min` ports are available, or when pods wait for more ports than are available; may not
    /// while one runs or while the pool backs off after a failure.
    pub fn plan_refill(&mut self, key: &Key, now: Timestamp) -> Option<Refill> {
        let limits = self.limits;
        let at_cap = self.populating >= limits.max_concurrent_populate;
        let pool = self.pools.get_mut(key)?;
        pool.waiting
            .retain(|_, asked| now.duration_since(*asked) < WAITING_EXPIRY);
        let size = pool.available.len();
        let waiting = pool.waiting.len();
        let wanted = size < limits.min || waiting > size || (pool.lacks_own && size == 0);
        if !wanted || pool.populating || pool.retry_at.is_some_and(|at| now < at) {
            return None;
        }
        let mut n = limits.batch.max(limits.min.saturating_sub(size));
        if limits.max > 0 {
            // `max` bounds the spare ports (available + waiting to be recycled), as upstream's
            // pool size: ports in use by pods never stop a busy node from keeping spares.
            n = n.min(limits.max.saturating_sub(size + pool.recyclable_len()));
        }
        // Surge: every waiting pod gets its port from this one request; `max` bounds the
        // spares, never a pod.
        n = n.max(waiting.saturating_sub(size)).min(limits.bulk.max(1));
        if n == 0 {
            return None;
        }
        if at_cap {
            pool.refill_blocked = true;
            return None;
        }
        pool.populating = true;
        pool.refill_blocked = false;
        pool.lacks_own = false;
        self.populating += 1;
        Some(Refill {
            key: key.clone(),
            name: pool.meta.name.clone(),
            n,
            exact: false,
        })
    }

    /// Forces a populate of exactly `n` ports (pool management API), still one per key at a
    /// time and within the global cap. `None` when one is already running or the cap is reached.
    pub fn plan_populate(&mut self, key: &Key, n: usize) -> Option<Refill> {
        if n == 0 || self.populating >= self.limits.max_concurrent_populate {
            return None;
        }
        let pool = self.pools.get_mut(key)?;
        if pool.populating {
            return None;
        }
        // An operator asking is a reason to try again now.
        pool.retry_at = None;
        pool.populating = true;
        self.populating += 1;
        Some(Refill {
            key: key.clone(),
            name: pool.meta.name.clone(),
            n,
            exact: true,
        })
    }

    /// Records the end of a bulk create and plans what may start now: this pool again if
    /// allocations drained it meanwhile, and pools blocked by the global cap.
    pub fn finish_refill(
        &mut self,
        key: &Key,
        result: Result<Vec<Entry<T>>, RefillFailure>,
        now: Timestamp,
    ) -> Vec<Refill> {
        let mut again = false;
        let jitter = self.jitter();
        let backoff = self.backoff;
        if let Some(pool) = self.pools.get_mut(key) {
            if pool.populating {
                pool.populating = false;
                self.populating = self.populating.saturating_sub(1);
            }
            match result {
                Ok(entries) => {
                    pool.available.extend(entries);
                    pool.last_refill = Some(now);
                    pool.last_error = None;
                    pool.failures = 0;
                    pool.retry_at = None;
                    again = true;
                }
                // No immediate retry (a failing Neutron would be hammered): the pool backs off;
                // allocations meanwhile answer with this failure.
                Err(e) => {
                    pool.failures = pool.failures.saturating_add(1);
                    let wait = backoff.wait(pool.failures, jitter);
                    pool.retry_at = Some(
                        now.saturating_add(SignedDuration::try_from(wait).unwrap_or(SignedDuration::MAX))
                            .unwrap_or(now),
                    );
                    pool.last_error = Some((e, now));
                }
            }
            self.dirty.insert(key.clone());
        }
        let mut refills = Vec::new();
        if again && let Some(r) = self.plan_refill(key, now) {
            refills.push(r);
        }
        let blocked: Vec<Key> = self
            .pools
            .iter()
            .filter(|(_, p)| p.refill_blocked)
            .map(|(k, _)| k.clone())
            .collect();
        for k in blocked {
            if let Some(r) = self.plan_refill(&k, now) {
                refills.push(r);
            }
        }
        refills
    }

    /// Pools below `min` (or with pods waiting) that are not refilling and not backing off (the
    /// maintenance pass retries failed refills once their backoff ran out).
    pub fn plan_refills_below_min(&mut self, now: Timestamp) -> Vec<Refill> {
        let keys: Vec<Key> = self.pools.keys().cloned().collect();
        keys.iter().filter_map(|k| self.plan_refill(k, now)).collect()
    }

    /// Ends the backoff of the pools `which` selects (capacity came back: the quota was raised
    /// or ports were freed) and plans their refills now, each cut to the `room` left (`None`:
    /// unlimited): a refill asking for more ports than the quota has room for fails whole (a
    /// bulk create is atomic), and room for three ports is three pods served, not a failed bulk
    /// of ten every quota check. Pools the room does not reach keep backing off, and a pool's
    /// failure count stays until a refill lands, so a refill that fails again waits longer.
    pub fn reset_backoff(
        &mut self,
        which: impl Fn(&Key) -> bool,
        room: Option<usize>,
        now: Timestamp,
    ) -> Vec<Refill> {
        let keys: Vec<Key> = self
            .pools
            .iter()
            .filter(|(k, p)| p.retry_at.is_some() && which(k))
            .map(|(k, _)| k.clone())
            .collect();
        let mut left = room;
        let mut out = Vec::new();
        for k in keys {
            if left == Some(0) {
                break;
            }
            let Some(pool) = self.pools.get_mut(&k) else {
                continue;
            };
            let (retry_at, failures) = (pool.retry_at.take(), pool.failures);
            match self.plan_refill(&k, now) {
                Some(mut r) => {
                    if let Some(left) = &mut left {
                        r.n = r.n.min(*left);
                        *left -= r.n;
                    }
                    out.push(r);
                }
                None => {
                    // Nothing to refill now: it backs off as it did. One held back by the
                    // cap on refills at once does not: it starts as a slot frees.
                    if let Some(pool) = self.pools.get_mut(&k)
                        && !pool.refill_blocked
                    {
                        pool.retry_at = retry_at;
                        pool.failures = failures;
                    }
                }
            }
        }
        out
    }

    /// Pod `holder` (its uid) gave its port back: it waits in `recyclable` for the next pass.
    /// A port held by another pod now is not taken from it ([`Released::Stale`]); a port already
    /// spare stays where it is. `Err` gives the data back when no pool of `key` exists (the
    /// caller deletes the port).
    pub fn release(
        &mut self,
        key: &Key,
        port_id: &str,
        data: T,
        holder: &str,
        now: Timestamp,
    ) -> Result<Released, T> {
        let current = self.pools.values().find_map(|p| p.in_use.get(port_id));
        if let Some(Held {
            holder: Some(current),
            ..
        }) = current
            && !holder.is_empty()
            && current != holder
        {
            return Ok(Released::Stale {
                holder: current.clone(),
            });
        }
        if self.pools.values().any(|p| {
            p.recyclable().any(|e| e.port_id == port_id) || p.available.iter().any(|e| e.port_id == port_id)
        }) {
            // A repeated release (handler retry): the port is already back.
            return Ok(Released::Already);
        }
        // A port is in use once, wherever it was counted (a borrowed port whose move failed
        // goes back to its donor, not to the pool that took it); no longer so also when no pool
        // takes it back (the caller deletes it, or the orphan sweep does).
        for (k, p) in &mut self.pools {
            if p.in_use.remove(port_id).is_some() {
                self.dirty.insert(k.clone());
            }
        }
        // No pool takes back one recovery found where none serves ([`Pools::mark_unservable`]).
        if self.unservable.remove(port_id) {
            return Err(data);
        }
        let Some(pool) = self.pools.get_mut(key) else {
            return Err(data);
        };
        pool.recyclable.push(Entry {
            port_id: port_id.to_string(),
            data,
            since: now,
            released_by: (!holder.is_empty()).then(|| holder.to_string()),
        });
        self.dirty.insert(key.clone());
        Ok(Released::Back)
    }

    /// Whether `key`'s spare ports (available and released) exceed `max`: the pool holds more
    /// than it may keep until a recycle pass deletes the surplus.
    pub fn over_max(&self, key: &Key) -> bool {
        let max = self.limits.max;
        max > 0
            && self
                .pools
                .get(key)
                .is_some_and(|p| p.available.len() + p.recyclable.len() > max)
    }

    /// Records a port as in use by pod `holder` of `key` (recovery from KuryrPorts).
    pub fn mark_in_use(&mut self, key: &Key, port_id: &str, since: Timestamp, holder: Option<&str>) {
        if let Some(pool) = self.pools.get_mut(key) {
            let held = Held {
                since,
                holder: holder.filter(|h| !h.is_empty()).map(str::to_string),
            };
            pool.in_use.insert(port_id.to_string(), held);
        }
    }

    /// A port a pod uses that no pool may take back when it is released (recovery found it
    /// where no pool serves: a subport moved off its trunk by hand): [`Pools::release`] hands it
    /// back for deletion.
    pub fn mark_unservable(&mut self, port_id: &str) {
        self.unservable.insert(port_id.to_string());
    }

    /// Adds recovered ports to `key`'s lists (recovery).
    pub fn adopt(&mut self, key: &Key, available: Vec<Entry<T>>, recyclable: Vec<Entry<T>>) {
        if let Some(pool) = self.pools.get_mut(key) {
            pool.available.extend(available);
            pool.recyclable.extend(recyclable);
            self.dirty.insert(key.clone());
        }
    }

    /// Moves every recyclable port into processing and decides its fate: returned while the
    /// pool (available plus what this pass returns) is below `max` plus its waiting pods,
    /// deleted beyond.
    pub fn plan_recycle(&mut self) -> Vec<RecycleStep<T>>
    where
        T: Clone,
    {
        let max = self.limits.max;
        let mut steps = Vec::new();
        for (key, pool) in &mut self.pools {
            if pool.recyclable.is_empty() {
                continue;
            }
            let mut size = pool.available.len();
            // Pods waiting for this pool are served before `max` bounds the spares.
            let keep = max.saturating_add(pool.waiting.len());
            for entry in std::mem::take(&mut pool.recyclable) {
                let action = if max == 0 || size < keep {
                    size += 1;
                    RecycleAction::Return
                } else {
                    RecycleAction::Delete
                };
                steps.push(RecycleStep {
                    key: key.clone(),
                    port_id: entry.port_id.clone(),
                    data: entry.data.clone(),
                    action,
                });
                pool.recycling.push(entry);
            }
        }
        steps
    }

    /// Records how a recycle step ended.
    pub fn finish_recycle(&mut self, key: &Key, port_id: &str, outcome: RecycleOutcome, now: Timestamp) {
        let Some(pool) = self.pools.get_mut(key) else {
            return;
        };
        let Some(i) = pool.recycling.iter().position(|e| e.port_id == port_id) else {
            return;
        };
        let mut entry = pool.recycling.swap_remove(i);
        match outcome {
            RecycleOutcome::Returned => {
                entry.since = now;
                entry.released_by = None;
                pool.available.push_back(entry);
            }
            RecycleOutcome::Dropped => {}
            RecycleOutcome::Retry => pool.recyclable.push(entry),
        }
        self.dirty.insert(key.clone());
    }

    /// Removes and returns available ports idle for at least the TTL, oldest first, while the
    /// pool stays above `min`.
    pub fn plan_ttl(&mut self, now: Timestamp) -> Vec<(Key, Entry<T>)> {
        let Some(ttl) = self.limits.ttl else {
            return Vec::new();
        };
        let ttl = SignedDuration::try_from(ttl).unwrap_or(SignedDuration::MAX);
        let min = self.limits.min;
        let mut expired = Vec::new();
        for (key, pool) in &mut self.pools {
            let mut excess = pool.available.len().saturating_sub(min);
            if excess == 0 {
                continue;
            }
            let mut kept = VecDeque::with_capacity(pool.available.len());
            // Oldest first: the queue is in arrival order.
            while let Some(e) = pool.available.pop_front() {
                if excess > 0 && now.duration_since(e.since) >= ttl {
                    excess -= 1;
                    expired.push((key.clone(), e));
                } else {
                    kept.push_back(e);
                }
            }
            pool.available = kept;
            if !expired.is_empty() {
                self.dirty.insert(key.clone());
            }
        }
        expired
    }

    /// Removes and returns the available ports beyond `max` (plus one per waiting pod) of every
    /// pool, newest first (the
    /// oldest are the likeliest to be ACTIVE): ports adopted by recovery, or left by a lower
    /// `max`. Recyclable ports need no trim: the recycle pass returns them only below `max`.
    pub fn plan_trim(&mut self) -> Vec<(Key, Entry<T>)> {
        let max = self.limits.max;
        if max == 0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (key, pool) in &mut self.pools {
            // A refill sized for waiting pods lands beyond `max` on purpose: those ports are
            // theirs (they ask again after their backoff), not spares to trim.
            let keep = max.saturating_add(pool.waiting.len());
            if pool.available.len() <= keep {
                continue;
            }
            out.extend(
                pool.available
                    .split_off(keep)
                    .into_iter()
                    .map(|e| (key.clone(), e)),
            );
            self.dirty.insert(key.clone());
        }
        out
    }

    /// Puts ports back into `key`'s available list (their deletion failed: still accounted for,
    /// the next trim tries again).
    pub fn put_back(&mut self, key: &Key, entries: impl IntoIterator<Item = Entry<T>>) {
        if let Some(pool) = self.pools.get_mut(key) {
            pool.available.extend(entries);
            self.dirty.insert(key.clone());
        }
    }

    /// Ports held in use since before `before` that no KuryrPort records (`recorded` is every
    /// port id the KuryrPorts list).
    pub fn unrecorded_in_use(
        &self,
        recorded: &std::collections::HashSet<String>,
        before: Timestamp,
    ) -> BTreeSet<String> {
        self.pools
            .values()
            .flat_map(|p| p.in_use.iter())
            .filter(|(id, held)| held.since < before && !recorded.contains(id.as_str()))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Stops counting `port_id` as in use: no pod holds it. It leaves the pool's books only; the
    /// port itself, still tagged, is the orphan sweep's to delete (or a late release brings it
    /// back as recyclable), so a mistake here can never hand one port to two pods.
    pub fn forget_in_use(&mut self, port_id: &str) -> Option<Key> {
        let key = self
            .pools
            .iter_mut()
            .find_map(|(k, p)| p.in_use.remove(port_id).map(|_| k.clone()))?;
        self.dirty.insert(key.clone());
        Some(key)
    }

    /// Drops the pool of `key` (its KuryrPortPool object was deleted, or its network is being
    /// deleted). Returns its available and recyclable ports, those a recycle pass is processing
    /// included (its update then finds them gone), for the caller to delete. Ports in use stay
    /// with their KuryrPorts: on release no pool takes them back, so they are deleted then.
    pub fn remove(&mut self, key: &Key) -> Option<Vec<Entry<T>>> {
        let pool = self.pools.remove(key)?;
        if pool.populating {
            self.populating = self.populating.saturating_sub(1);
        }
        self.dirty.remove(key);
        let mut out: Vec<Entry<T>> = pool.available.into_iter().collect();
        out.extend(pool.recyclable);
        out.extend(pool.recycling);
        Some(out)
    }

    /// Drops the pool of `key` if it holds no port at all and is not being filled (a pool
    /// emptied by `free`): its KuryrPortPool object then goes too. True when dropped.
    pub fn remove_if_empty(&mut self, key: &Key) -> bool {
        let empty = self
            .pools
            .get(key)
            .is_some_and(|p| p.total() == 0 && p.recycling.is_empty() && !p.populating);
        if empty {
            self.pools.remove(key);
            self.dirty.remove(key);
        }
        empty
    }

    /// Empties `key`'s available list (pool management `free`): the caller deletes the ports.
    pub fn drain_available(&mut self, key: &Key) -> Vec<Entry<T>> {
        let Some(pool) = self.pools.get_mut(key) else {
            return Vec::new();
        };
        self.dirty.insert(key.clone());
        pool.available.drain(..).collect()
    }

    /// Forgets a port wherever it is (found deleted in Neutron).
    pub fn forget(&mut self, port_id: &str) -> Option<Key> {
        for (key, pool) in &mut self.pools {
            let before = pool.total();
            pool.available.retain(|e| e.port_id != port_id);
            pool.recyclable.retain(|e| e.port_id != port_id);
            pool.recycling.retain(|e| e.port_id != port_id);
            pool.in_use.remove(port_id);
            if pool.total() != before {
                self.dirty.insert(key.clone());
                return Some(key.clone());
            }
        }
        None
    }

    /// Updates the data of an available port in place (e.g. its VIF became active).
    pub fn update_available(&mut self, key: &Key, mut f: impl FnMut(&mut Entry<T>)) {
        if let Some(pool) = self.pools.get_mut(key) {
            pool.available.iter_mut().for_each(&mut f);
        }
    }

    /// Pools changed since the last call.
    pub fn take_dirty(&mut self) -> BTreeSet<Key> {
        std::mem::take(&mut self.dirty)
    }

    /// Marks pools to be written again (a failed flush).
    pub fn mark_dirty(&mut self, keys: impl IntoIterator<Item = Key>) {
        self.dirty.extend(keys);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(min: usize, max: usize, batch: usize) -> Limits {
        Limits {
            min,
            max,
            batch,
            ttl: None,
            max_concurrent_populate: 20,
            bulk: MAX_BULK,
        }
    }

    fn key(sgs: &[&str]) -> Key {
        Key::new(
            "default",
            "node-1",
            "proj",
            "net",
            ["sub".to_string()],
            sgs.iter().map(|s| (*s).to_string()),
        )
    }

    fn meta(name: &str) -> PoolMeta {
        PoolMeta {
            name: name.into(),
            nested: false,
        }
    }

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn entries(prefix: &str, n: usize, since: Timestamp) -> Vec<Entry<()>> {
        (0..n)
            .map(|i| Entry::new(format!("{prefix}{i}"), (), since))
            .collect()
    }

    /// Runs the refill to completion with `n` fresh ports.
    fn complete(pools: &mut Pools<()>, r: &Refill, now: Timestamp) -> Vec<Refill> {
        pools.finish_refill(&r.key, Ok(entries(&format!("{}-{now}-", r.name), r.n, now)), now)
    }

    #[test]
    fn empty_pool_triggers_one_batch_and_second_request_hits() {
        let mut pools = Pools::<()>::new(limits(2, 0, 5));
        let k = key(&["sg"]);
        pools.ensure(&k, || meta("p"));
        let first = pools.take(&k, "pod", t(0));
        assert_eq!(first.take, Take::Empty);
        assert_eq!(
            first.refills,
            vec![Refill {
                key: k.clone(),
                name: "p".into(),
                n: 5,
                exact: false
            }]
        );
        // A second request while populating must not start another populate for the key.
        assert!(pools.take(&k, "pod", t(0)).refills.is_empty());
        assert!(complete(&mut pools, &first.refills[0], t(1)).is_empty());
        for _ in 0..3 {
            let got = pools.take(&k, "pod", t(2));
            assert!(matches!(got.take, Take::Hit(_)));
            assert!(got.refills.is_empty(), "5 -> 2 left, still >= min");
        }
        // 1 left < min 2: refill max(batch, min - size) = 5.
        let got = pools.take(&k, "pod", t(3));
        assert!(matches!(got.take, Take::Hit(_)));
        assert_eq!(got.refills.len(), 1);
        assert_eq!(got.refills[0].n, 5);
    }

    #[test]
    fn removed_pool_returns_spare_ports_and_frees_its_populate_slot() {
        let mut pools = Pools::<()>::new(Limits {
            max_concurrent_populate: 1,
            ..limits(1, 0, 2)
        });
        // Another network: b must not borrow a's ports.
        let (a, b) = (
            key(&["a"]),
            Key::new("default", "node-1", "proj", "net-2", ["sub-2".to_string()], []),
        );
        pools.ensure(&a, || meta("a"));
        pools.ensure(&b, || meta("b"));
        let r = pools.take(&a, "pod", t(0)).refills;
        complete(&mut pools, &r[0], t(1));
        let Take::Hit(used) = pools.take(&a, "pod", t(2)).take else {
            panic!("hit expected")
        };
        pools.release(&a, &used.port_id, (), "pod", t(3)).unwrap();
        // b populating holds the only slot; removing b must give it back.
        assert_eq!(pools.take(&b, "pod", t(3)).refills.len(), 1);
        assert_eq!(pools.remove(&b).map(|v| v.len()), Some(0));
        assert!(pools.get(&b).is_none());
        assert!(pools.remove(&b).is_none());
        assert!(!pools.remove_if_empty(&a), "a holds ports");
        let spare = pools.remove(&a).unwrap();
        assert_eq!(spare.len(), 2, "available and recyclable ports come back");
        pools.ensure(&a, || meta("a"));
        assert_eq!(
            pools.take(&a, "pod", t(4)).refills.len(),
            1,
            "the slot is free again"
        );
        pools.ensure(&b, || meta("b"));
        assert!(pools.remove_if_empty(&b));
        assert!(!pools.remove_if_empty(&a), "a is populating");
    }

    #[test]
    fn refill_size_is_max_of_batch_and_missing_to_min() {
        let mut pools = Pools::<()>::new(limits(10, 0, 3));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        let r = pools.take(&k, "pod", t(0)).refills;
        assert_eq!(r[0].n, 10);
    }

    #[test]
    fn max_caps_spare_ports_not_ports_in_use() {
        // min 2, max 2, batch 1
        let mut pools = Pools::<()>::new(limits(2, 2, 1));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        let r = pools.take(&k, "pod", t(0)).refills;
        assert_eq!(r[0].n, 2);
        complete(&mut pools, &r[0], t(1));
        // A pod takes one: 1 spare < min 2, refill only up to max 2 spares.
        let first = pools.take(&k, "pod", t(2));
        assert!(matches!(first.take, Take::Hit(_)));
        assert_eq!(first.refills[0].n, 1);
        complete(&mut pools, &first.refills[0], t(2));
        let p = pools.get(&k).unwrap();
        assert_eq!(
            (p.available_len(), p.in_use().len()),
            (2, 1),
            "a busy node keeps its spares"
        );
        // At max spares: a further take refills just the one it used.
        let second = pools.take(&k, "pod", t(3));
        assert!(matches!(second.take, Take::Hit(_)));
        assert_eq!(second.refills[0].n, 1);
    }

    #[test]
    fn global_cap_blocks_then_starts_when_a_slot_frees() {
        let mut l = limits(1, 0, 2);
        l.max_concurrent_populate = 1;
        let mut pools = Pools::<()>::new(l);
        // Another network: b must not borrow a's ports.
        let (a, b) = (
            key(&["a"]),
            Key::new("default", "node-1", "proj", "net-2", ["sub-2".to_string()], []),
        );
        pools.ensure(&a, || meta("a"));
        pools.ensure(&b, || meta("b"));
        let ra = pools.take(&a, "pod", t(0)).refills;
        assert_eq!(ra.len(), 1);
        assert!(pools.take(&b, "pod", t(0)).refills.is_empty(), "cap reached");
        assert_eq!(pools.populating(), 1);
        let next = complete(&mut pools, &ra[0], t(1));
        assert_eq!(
            next,
            vec![Refill {
                key: b.clone(),
                name: "b".into(),
                n: 2,
                exact: false
            }]
        );
        assert_eq!(pools.populating(), 1);
    }

    /// The quota has room for 3 ports again and two pools of batch 10 back off after
    /// OverQuota: one refill of 3 (a bulk of 10 fails whole), the other pool keeps backing off,
    /// and a failure count survives until a refill lands.
    #[test]
    fn a_quota_with_little_room_gets_refills_cut_to_it() {
        let mut pools = Pools::<()>::new(limits(1, 0, 10));
        let (a, b) = (
            key(&["a"]),
            Key::new("default", "node-1", "proj", "net-2", ["sub-2".to_string()], []),
        );
        for (k, name) in [(&a, "a"), (&b, "b")] {
            pools.ensure(k, || meta(name));
            assert_eq!(pools.take(k, "pod", t(0)).refills.len(), 1);
            pools.finish_refill(k, Err("OverQuota".into()), t(1));
            assert_eq!(pools.get(k).unwrap().failures(), 1);
        }
        let r = pools.reset_backoff(|_| true, Some(3), t(2));
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].n, 3);
        let other = if r[0].key == a { &b } else { &a };
        let p = pools.get(other).unwrap();
        assert!(p.retry_at().is_some(), "no room left for it: still backing off");
        // The refill of 3 fails too (another writer took the room): it waits longer.
        let k = r[0].key.clone();
        pools.finish_refill(&k, Err("OverQuota".into()), t(3));
        assert_eq!(pools.get(&k).unwrap().failures(), 2);
        assert!(
            pools.reset_backoff(|_| true, Some(0), t(4)).is_empty(),
            "no room: nothing"
        );
        assert!(pools.get(&k).unwrap().retry_at().is_some());
    }

    #[test]
    fn failed_refill_records_error_and_is_retried_by_maintenance() {
        let mut pools = Pools::<()>::new(limits(1, 0, 2));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        let r = pools.take(&k, "pod", t(0)).refills;
        assert!(pools.finish_refill(&k, Err("quota".into()), t(1)).is_empty());
        assert_eq!(pools.populating(), 0);
        let pool = pools.get(&k).unwrap();
        assert_eq!(pool.last_error().map(|e| e.0.message.as_str()), Some("quota"));
        assert!(!pool.is_populating());
        assert!(
            pools.plan_refills_below_min(t(1)).is_empty(),
            "backing off right after the failure"
        );
        // The first wait is at most `initial` (2 s).
        assert_eq!(pools.plan_refills_below_min(t(3)), r);
    }

    #[test]
    fn a_failing_pool_backs_off_and_pods_share_its_refill() {
        let mut pools = Pools::<()>::new(limits(1, 0, 2));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        let mut refills = 0;
        let mut failures = 0;
        let mut last_wait = SignedDuration::ZERO;
        // 500 pods asking every 100 ms for 10 minutes while every refill fails.
        let start = t(0);
        for tick in 0..6000i64 {
            let now = start
                .checked_add(SignedDuration::from_millis(tick * 100))
                .unwrap();
            let pod = format!("pod-{}", tick % 500);
            for r in pools.take(&k, &pod, now).refills {
                refills += 1;
                assert_eq!(pools.populating(), 1, "one refill at a time");
                pools.finish_refill(&r.key, Err("OverQuota".into()), now);
                failures += 1;
                let p = pools.get(&k).unwrap();
                assert_eq!(p.failures(), failures);
                let wait = p.retry_at().unwrap().duration_since(now);
                if failures > 1 && failures < 6 {
                    assert!(wait > last_wait, "{wait:?} grows after {last_wait:?}");
                }
                assert!(wait <= SignedDuration::from_secs(60), "capped: {wait:?}");
                last_wait = wait;
            }
        }
        // 2, 4, 8, 16, 32 s (each halved at worst by jitter) then at most 60 s: about 15 in 10
        // minutes, where every request would otherwise have started one.
        assert!((8..=25).contains(&refills), "{refills} refills in 10 minutes");
        // Capacity came back: one refill at once, sized for the pods waiting (all 500 asked
        // within the last minute), capped by the bulk size.
        let now = t(600);
        let r = pools.reset_backoff(|key| key == &k, None, now);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].n, MAX_BULK);
        assert!(pools.get(&k).unwrap().retry_at().is_none());
        pools.finish_refill(&k, Ok(entries("n", r[0].n, now)), now);
        let p = pools.get(&k).unwrap();
        assert_eq!(
            (p.failures(), p.retry_at()),
            (0, None),
            "success ends the backoff"
        );
        // Pods still waiting beyond the first bulk: the next one starts as it lands.
        assert_eq!(pools.populating(), 1);
    }

    /// The surge refill lands beyond `max` for the pods waiting: neither the trim nor a release's
    /// recycle pass takes those ports before the pods (in their backoff) ask again.
    #[test]
    fn ports_for_waiting_pods_are_not_trimmed_or_recycled_away() {
        let mut pools = Pools::<()>::new(limits(1, 5, 2));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        let first = pools.take(&k, "pod-0", t(0)).refills;
        for i in 1..30 {
            pools.take(&k, &format!("pod-{i}"), t(0));
        }
        let next = complete(&mut pools, &first[0], t(1));
        complete(&mut pools, &next[0], t(2));
        assert_eq!(pools.get(&k).unwrap().available_len(), 30);
        assert!(pools.plan_trim().is_empty(), "30 pods wait for them");
        // A pod elsewhere releases a port of this pool: returned, not deleted, while pods wait.
        let got = pools.take(&k, "pod-0", t(3));
        let Take::Hit(e) = got.take else {
            panic!("a hit expected")
        };
        pools.release(&k, &e.port_id, (), "", t(3)).unwrap();
        let steps = pools.plan_recycle();
        assert!(
            steps.iter().all(|s| s.action == RecycleAction::Return),
            "{steps:?}"
        );
        // Once served, the spares beyond max go.
        for i in 1..30 {
            assert!(matches!(
                pools.take(&k, &format!("pod-{i}"), t(4)).take,
                Take::Hit(_)
            ));
        }
        let left = pools.get(&k).unwrap().available_len();
        assert_eq!(pools.plan_trim().len(), left.saturating_sub(5));
    }

    /// Pods served from a sibling pool have their ports: the empty pool refills one batch for its
    /// own groups, not a port for each of them beyond `max`.
    #[test]
    fn pods_served_by_a_sibling_do_not_size_the_refill() {
        let mut pools = Pools::<()>::new(limits(1, 3, 1));
        let (mine, other) = (key(&["new"]), key(&["old"]));
        pools.ensure(&other, || meta("o"));
        let r = pools.take(&other, "seed", t(0)).refills;
        pools.finish_refill(&r[0].key, Ok(entries("o-", 10, t(1))), t(1));
        pools.ensure(&mine, || meta("m"));
        let mut refills = Vec::new();
        for i in 0..10 {
            let got = pools.take(&mine, &format!("pod-{i}"), t(2));
            assert!(matches!(got.take, Take::Borrowed { .. }), "{i}");
            refills.extend(got.refills);
        }
        assert_eq!(pools.get(&mine).unwrap().waiting(), 0);
        let made: usize = refills.iter().map(|r| r.n).sum();
        assert!(made <= 3, "refills of {made} ports for pods that have theirs");
    }

    #[test]
    fn a_burst_is_served_by_one_refill_sized_by_the_waiting_pods() {
        // max 5 spares, batch 2: 30 pods found the pool empty while its first refill ran.
        let mut pools = Pools::<()>::new(limits(1, 5, 2));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        let first = pools.take(&k, "pod-0", t(0)).refills;
        assert_eq!(first[0].n, 2, "one pod waiting: the batch");
        for i in 1..30 {
            assert!(pools.take(&k, &format!("pod-{i}"), t(0)).refills.is_empty());
        }
        assert_eq!(pools.get(&k).unwrap().waiting(), 30);
        let next = complete(&mut pools, &first[0], t(1));
        assert_eq!(next.len(), 1);
        assert_eq!(
            next[0].n, 28,
            "the 28 pods the first 2 ports do not serve, beyond max"
        );
        for i in 0..2 {
            let got = pools.take(&k, &format!("pod-{i}"), t(1));
            assert!(matches!(got.take, Take::Hit(_)));
        }
        assert_eq!(pools.get(&k).unwrap().waiting(), 28);
        // Pods that stopped asking (deleted) stop counting after a minute.
        complete(&mut pools, &next[0], t(2));
        for i in 2..10 {
            assert!(matches!(
                pools.take(&k, &format!("pod-{i}"), t(2)).take,
                Take::Hit(_)
            ));
        }
        let p = pools.get(&k).unwrap();
        assert_eq!((p.available_len(), p.waiting()), (20, 20));
        assert!(pools.plan_refills_below_min(t(100)).is_empty());
        assert_eq!(pools.get(&k).unwrap().waiting(), 0);
    }

    #[test]
    fn trim_removes_available_ports_beyond_max_newest_first() {
        let mut pools = Pools::<()>::new(limits(1, 3, 1));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        pools.adopt(&k, entries("p", 5, t(0)), entries("r", 2, t(0)));
        pools.take_dirty();
        let trimmed: Vec<String> = pools.plan_trim().into_iter().map(|(_, e)| e.port_id).collect();
        assert_eq!(trimmed, ["p3", "p4"]);
        assert!(pools.take_dirty().contains(&k));
        let p = pools.get(&k).unwrap();
        assert_eq!((p.available_len(), p.recyclable_len()), (3, 2));
        assert!(pools.plan_trim().is_empty(), "within max");
        // The recycle pass deletes the recyclable ones: the pool is at max.
        let actions: Vec<RecycleAction> = pools.plan_recycle().iter().map(|s| s.action).collect();
        assert_eq!(actions, [RecycleAction::Delete, RecycleAction::Delete]);
        // A failed deletion stays accounted for.
        pools.put_back(&k, entries("p3", 1, t(1)));
        assert_eq!(pools.plan_trim().len(), 1);
        let mut unlimited = Pools::<()>::new(limits(1, 0, 1));
        unlimited.ensure(&k, || meta("p"));
        unlimited.adopt(&k, entries("p", 50, t(0)), Vec::new());
        assert!(unlimited.plan_trim().is_empty(), "max 0 is unlimited");
    }

    #[test]
    fn ports_in_use_by_no_kuryrport_are_found_and_forgotten() {
        let mut pools = Pools::<()>::new(limits(0, 0, 1));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        pools.mark_in_use(&k, "recorded", t(0), None);
        pools.mark_in_use(&k, "phantom", t(0), None);
        pools.mark_in_use(&k, "just-taken", t(10), None);
        let recorded = std::collections::HashSet::from(["recorded".to_string()]);
        assert_eq!(
            pools.unrecorded_in_use(&recorded, t(5)),
            BTreeSet::from(["phantom".to_string()]),
            "a port taken after the cutoff may not be recorded yet"
        );
        assert_eq!(pools.forget_in_use("phantom"), Some(k.clone()));
        assert_eq!(pools.forget_in_use("phantom"), None);
        assert_eq!(pools.get(&k).unwrap().in_use().len(), 2);
        assert!(
            pools.owner_of("phantom").is_none(),
            "the orphan sweep may take it now"
        );
        // A late release of a forgotten port brings it back as recyclable, never twice.
        pools.release(&k, "phantom", (), "", t(20)).unwrap();
        assert_eq!(pools.get(&k).unwrap().recyclable_len(), 1);
    }

    #[test]
    fn empty_pool_borrows_from_sibling_with_other_security_groups() {
        let mut pools = Pools::<()>::new(limits(0, 0, 3));
        let (mine, other) = (key(&["new"]), key(&["old"]));
        pools.ensure(&other, || meta("o"));
        let r = pools.take(&other, "pod", t(0)).refills;
        complete(&mut pools, &r[0], t(1));
        pools.ensure(&mine, || meta("m"));
        let got = pools.take(&mine, "pod", t(2));
        match got.take {
            Take::Borrowed { from, entry } => {
                assert_eq!(from, other);
                assert!(pools.get(&mine).unwrap().in_use().contains_key(&entry.port_id));
            }
            other => panic!("expected a borrowed port, got {other:?}"),
        }
        // The empty pool still refills for its own security groups.
        assert_eq!(got.refills.len(), 1);
        assert_eq!(pools.get(&other).unwrap().available_len(), 2);
        // A different network is not a sibling.
        let far = Key::new(
            "default",
            "node-1",
            "proj",
            "net2",
            ["sub".to_string()],
            ["new".to_string()],
        );
        pools.ensure(&far, || meta("f"));
        assert_eq!(pools.take(&far, "pod", t(3)).take, Take::Empty);
        // Nor is another subnet of the same network: its ports have the wrong addresses.
        let other_subnet = Key::new(
            "default",
            "node-1",
            "proj",
            "net",
            ["sub-b".to_string()],
            ["new".to_string()],
        );
        pools.ensure(&other_subnet, || meta("s"));
        assert_eq!(pools.take(&other_subnet, "pod", t(3)).take, Take::Empty);
    }

    #[test]
    fn a_borrowed_port_given_back_to_its_donor_leaves_the_borrowers_books() {
        let mut pools = Pools::<()>::new(limits(0, 0, 3));
        let (mine, other) = (key(&["new"]), key(&["old"]));
        pools.ensure(&other, || meta("o"));
        let r = pools.take(&other, "pod", t(0)).refills;
        complete(&mut pools, &r[0], t(1));
        pools.ensure(&mine, || meta("m"));
        let Take::Borrowed { from, entry } = pools.take(&mine, "pod", t(2)).take else {
            panic!("expected a borrowed port");
        };
        // Moving it failed: it goes back to the donor, counted in use nowhere.
        pools.release(&from, &entry.port_id, (), "pod", t(3)).unwrap();
        assert!(pools.get(&mine).unwrap().in_use().is_empty());
        assert!(
            pools
                .get(&other)
                .unwrap()
                .recyclable()
                .any(|e| e.port_id == entry.port_id)
        );
    }

    #[test]
    fn keys_differ_by_subnets_and_round_trip_through_the_crd_subnet_id() {
        let k = |subnets: &[&str]| {
            Key::new(
                "default",
                "node-1",
                "proj",
                "net",
                subnets.iter().map(|s| (*s).to_string()),
                ["sg".to_string()],
            )
        };
        assert_ne!(k(&["a"]), k(&["b"]));
        assert!(!k(&["a"]).is_sibling_of(&k(&["b"])));
        assert!(k(&["a"]).same_network(&k(&["b"])));
        let multi = k(&["b", "a", "b"]);
        assert_eq!(multi.subnets, ["a", "b"]);
        assert_eq!(multi.subnet_id(), "a,b");
        assert_eq!(Key::split_subnets(&multi.subnet_id()), multi.subnets);
        assert_eq!(k(&["a"]).subnet_id(), "a");
        assert_eq!(multi.to_string(), "default/node-1/proj/net/a,b/[sg]");
    }

    #[test]
    fn recycle_returns_up_to_max_and_deletes_the_rest() {
        // min 0 (no refill): spares only come back through recycling; max 2.
        let mut pools = Pools::<()>::new(limits(0, 2, 1));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        for i in 0..3 {
            pools.mark_in_use(&k, &format!("port-{i}"), t(i), Some("ns/pod"));
        }
        for i in 0..3 {
            pools
                .release(&k, &format!("port-{i}"), (), "ns/pod", t(10))
                .unwrap();
        }
        assert_eq!(pools.get(&k).unwrap().recyclable_len(), 3);
        let steps = pools.plan_recycle();
        let actions: Vec<RecycleAction> = steps.iter().map(|s| s.action).collect();
        assert_eq!(
            actions,
            vec![
                RecycleAction::Return,
                RecycleAction::Return,
                RecycleAction::Delete
            ]
        );
        // Still owned while being processed.
        assert_eq!(pools.get(&k).unwrap().recyclable_len(), 3);
        for s in &steps {
            let outcome = match s.action {
                RecycleAction::Return => RecycleOutcome::Returned,
                RecycleAction::Delete => RecycleOutcome::Dropped,
            };
            pools.finish_recycle(&k, &s.port_id, outcome, t(20));
        }
        let p = pools.get(&k).unwrap();
        assert_eq!(
            (p.available_len(), p.recyclable_len(), p.in_use().len()),
            (2, 0, 0)
        );
    }

    #[test]
    fn a_release_by_a_pod_the_port_was_handed_on_from_is_ignored() {
        // min 0, max 5, batch 1: no refill, so the one port goes round.
        let mut pools = Pools::<()>::new(limits(0, 5, 1));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        pools.mark_in_use(&k, "x", t(0), Some("pod-a"));
        // pod-a's finalizer releases the port, then fails later on and will run again.
        assert_eq!(pools.release(&k, "x", (), "pod-a", t(1)), Ok(Released::Back));
        for s in pools.plan_recycle() {
            pools.finish_recycle(&k, &s.port_id, RecycleOutcome::Returned, t(2));
        }
        let Take::Hit(e) = pools.take(&k, "pod-b", t(3)).take else {
            panic!("the recycled port is available");
        };
        assert_eq!(e.port_id, "x");
        // The retried finalizer must not take the port from pod-b.
        assert_eq!(
            pools.release(&k, "x", (), "pod-a", t(4)),
            Ok(Released::Stale {
                holder: "pod-b".into()
            })
        );
        let p = pools.get(&k).unwrap();
        assert_eq!((p.available_len(), p.recyclable_len()), (0, 0));
        assert_eq!(p.in_use()["x"].holder.as_deref(), Some("pod-b"));
        assert!(matches!(pools.take(&k, "pod-c", t(5)).take, Take::Empty));
        // Not even when its pool is gone meanwhile (that path would delete the port).
        assert_eq!(
            pools.release(&key(&["other"]), "x", (), "pod-a", t(6)),
            Ok(Released::Stale {
                holder: "pod-b".into()
            })
        );
        // pod-b's own release is accepted; a holder nobody recorded (unknown pod) is too.
        assert_eq!(pools.release(&k, "x", (), "pod-b", t(7)), Ok(Released::Back));
        pools.mark_in_use(&k, "y", t(8), None);
        assert_eq!(pools.release(&k, "y", (), "pod-z", t(9)), Ok(Released::Back));
    }

    #[test]
    fn failed_recycle_stays_recyclable_and_release_is_idempotent() {
        let mut pools = Pools::<()>::new(limits(0, 0, 1));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        pools.mark_in_use(&k, "x", t(0), Some("pod-a"));
        assert_eq!(pools.release(&k, "x", (), "pod-a", t(1)), Ok(Released::Back));
        assert_eq!(pools.release(&k, "x", (), "pod-a", t(1)), Ok(Released::Already));
        assert_eq!(pools.get(&k).unwrap().recyclable_len(), 1);
        let steps = pools.plan_recycle();
        assert_eq!(steps.len(), 1);
        pools.finish_recycle(&k, "x", RecycleOutcome::Retry, t(2));
        assert_eq!(pools.get(&k).unwrap().recyclable_len(), 1);
        assert_eq!(pools.plan_recycle().len(), 1);
        // Releasing into an unknown pool hands the port back for deletion.
        assert_eq!(pools.release(&key(&["zz"]), "y", (), "pod-b", t(3)), Err(()));
    }

    #[test]
    fn a_release_no_pool_takes_back_leaves_the_in_use_books() {
        let mut pools = Pools::<()>::new(limits(0, 2, 1));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        pools.mark_in_use(&k, "x", t(0), Some("pod-a"));
        pools.mark_in_use(&k, "y", t(0), Some("pod-b"));
        pools.take_dirty();
        // Released towards a pool that is gone (its node left): the caller deletes the port.
        assert_eq!(pools.release(&key(&["gone"]), "x", (), "pod-a", t(1)), Err(()));
        let p = pools.get(&k).unwrap();
        assert!(
            !p.in_use().contains_key("x"),
            "still counted in use: {:?}",
            p.in_use()
        );
        assert_eq!(pools.owner_of("x"), None);
        assert!(!pools.port_ids().contains("x"));
        assert!(p.in_use().contains_key("y"), "another port's books untouched");
        // The pool's books are written again without it.
        assert!(pools.take_dirty().contains(&k));
    }

    #[test]
    fn an_unservable_port_is_handed_back_for_deletion_on_release() {
        let mut pools = Pools::<()>::new(limits(0, 5, 1));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        pools.mark_unservable("x");
        assert_eq!(pools.release(&k, "x", (), "pod-a", t(1)), Err(()));
        let p = pools.get(&k).unwrap();
        assert_eq!((p.available_len(), p.recyclable_len()), (0, 0), "not taken back");
        // Once: a port of that id later is a port like any other.
        pools.mark_in_use(&k, "x", t(2), Some("pod-b"));
        assert_eq!(pools.release(&k, "x", (), "pod-b", t(3)), Ok(Released::Back));
    }

    #[test]
    fn ttl_deletes_idle_ports_only_above_min() {
        let mut l = limits(2, 0, 5);
        l.ttl = Some(Duration::from_secs(60));
        let mut pools = Pools::<()>::new(l);
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        pools.adopt(&k, entries("old", 4, t(0)), Vec::new());
        pools.adopt(&k, entries("new", 1, t(50)), Vec::new());
        assert!(pools.plan_ttl(t(59)).is_empty(), "nothing idle for 60 s yet");
        let expired = pools.plan_ttl(t(100));
        // 5 available, min 2: at most 3 go, the oldest ones; "new0" (50 s idle) stays.
        let ids: Vec<&str> = expired.iter().map(|(_, e)| e.port_id.as_str()).collect();
        assert_eq!(ids, vec!["old0", "old1", "old2"]);
        let left: Vec<String> = pools
            .get(&k)
            .unwrap()
            .available()
            .map(|e| e.port_id.clone())
            .collect();
        assert_eq!(left, vec!["old3", "new0"]);
        assert!(pools.plan_ttl(t(1000)).is_empty(), "at min");
    }

    #[test]
    fn dirty_tracking_and_forget() {
        let mut pools: Pools<()> = Pools::new(limits(0, 0, 1));
        let k = key(&[]);
        pools.ensure(&k, || meta("p"));
        assert_eq!(pools.take_dirty(), BTreeSet::from([k.clone()]));
        assert!(pools.take_dirty().is_empty());
        pools.adopt(&k, entries("a", 2, t(0)), Vec::new());
        assert_eq!(pools.owner_of("a1"), Some(&k));
        assert_eq!(pools.forget("a1"), Some(k.clone()));
        assert_eq!(pools.owner_of("a1"), None);
        assert_eq!(pools.port_ids(), BTreeSet::from(["a0".to_string()]));
        assert_eq!(pools.drain_available(&k).len(), 1);
        assert!(pools.take_dirty().contains(&k));
    }

    #[test]
    fn limits_from_config() {
        let cfg = kuryr_config::VifPoolSection {
            ports_pool_ttl: 30,
            ..Default::default()
        };
        let l = Limits::from_config(&cfg);
        assert_eq!((l.min, l.max, l.batch, l.max_concurrent_populate), (5, 0, 10, 20));
        assert_eq!(l.ttl, Some(Duration::from_secs(30)));
    }
}
