//! All emulator state behind one lock, one file per resource. Every write validates everything first, then
//! changes state; nothing here knows about HTTP.
//!
//! The provisioning lifecycle is time-driven instead of task-driven: a write moves the load balancer and the
//! touched objects to `PENDING_*` and records when its (simulated) controller worker finishes; [`Store::settle`],
//! called before every request, completes whatever is due. Tests drive time by passing `now` explicitly.

pub mod amphorae;
pub mod healthmonitors;
pub mod listeners;
pub mod loadbalancers;
pub mod members;
pub mod pools;
pub mod providers;
pub mod quotas;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::ApiError;
pub use healthmonitors::HealthMonitor;
pub use listeners::Listener;
pub use loadbalancers::LoadBalancer;
pub use members::Member;
pub use pools::Pool;
pub use quotas::Quota;

pub const ACTIVE: &str = "ACTIVE";
pub const ERROR: &str = "ERROR";
pub const PENDING_CREATE: &str = "PENDING_CREATE";
pub const PENDING_UPDATE: &str = "PENDING_UPDATE";
pub const PENDING_DELETE: &str = "PENDING_DELETE";
/// Without a health manager nothing ever reports traffic, so operating_status stays where the API put it at
/// creation (`OFFLINE`; members of a pool without health monitor `NO_MONITOR`), as with the noop amphora driver.
pub const OFFLINE: &str = "OFFLINE";
pub const NO_MONITOR: &str = "NO_MONITOR";

/// A project id for tests and the sandbox. Octavia under `noauth` has no default project: a create without
/// `project_id` in the body needs an `X-Project-Id` header, else it answers 400.
pub const NOAUTH_PROJECT: &str = "fake_project_id";

/// How long the simulated controller worker takes to bring a change to ACTIVE (or to remove a deleted object).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerDelays {
    #[serde(default)]
    pub lb_create_ms: u64,
    #[serde(default)]
    pub lb_update_ms: u64,
    #[serde(default)]
    pub lb_delete_ms: u64,
    #[serde(default)]
    pub child_create_ms: u64,
    #[serde(default)]
    pub child_update_ms: u64,
    #[serde(default)]
    pub child_delete_ms: u64,
}

/// What a write asks the worker to do; picks the delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    LbCreate,
    LbUpdate,
    LbDelete,
    ChildCreate,
    ChildUpdate,
    ChildDelete,
}

impl WorkerDelays {
    pub fn delay(&self, work: Work) -> Duration {
        Duration::from_millis(match work {
            Work::LbCreate => self.lb_create_ms,
            Work::LbUpdate => self.lb_update_ms,
            Work::LbDelete => self.lb_delete_ms,
            Work::ChildCreate => self.child_create_ms,
            Work::ChildUpdate => self.child_update_ms,
            Work::ChildDelete => self.child_delete_ms,
        })
    }
}

/// Fields every Octavia object has.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    pub id: String,
    /// Creation order: lists are sorted by it (Octavia's default sort is `created_at`).
    pub seq: u64,
    pub project_id: String,
    pub name: Option<String>,
    pub provisioning_status: String,
    pub operating_status: String,
    pub admin_state_up: bool,
    pub tags: Vec<String>,
    pub created_at: String,
    pub updated_at: Option<String>,
}

impl Common {
    fn render_into(&self, out: &mut serde_json::Map<String, Value>) {
        out.insert("id".into(), json!(self.id));
        out.insert("project_id".into(), json!(self.project_id));
        out.insert("name".into(), json!(self.name));
        out.insert("provisioning_status".into(), json!(self.provisioning_status));
        out.insert("operating_status".into(), json!(self.operating_status));
        out.insert("admin_state_up".into(), json!(self.admin_state_up));
        out.insert("tags".into(), json!(self.tags));
        out.insert("created_at".into(), json!(self.created_at));
        out.insert("updated_at".into(), json!(self.updated_at));
    }

    fn pending(&self) -> bool {
        self.provisioning_status.starts_with("PENDING_")
    }
}

/// Octavia stores timestamps in DATETIME columns: second precision, rendered by `isoformat()` without zone.
pub fn timestamp() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S").to_string()
}

/// Octavia's network driver side: the VIP port in Neutron. Without one (the default, like the lab's noop
/// network driver) a load balancer's `vip_port_id` names no Neutron port; with one, a test's Neutron holds a
/// real VIP port that floating IPs can be associated with. Called under the store's lock, so it must not call
/// back into this emulator.
pub trait VipPorts: Send + Sync + std::fmt::Debug {
    /// Creates the port of `address` on `subnet_id` for load balancer `lb_id`; `Err` is the reason to refuse.
    fn create(&self, lb_id: &str, project_id: &str, subnet_id: &str, address: &str)
    -> Result<String, String>;
    /// Deletes the port (a missing one is fine).
    fn delete(&self, port_id: &str);
}

/// Start-up settings of the store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Where VIP ports are made, if anywhere (see [`VipPorts`]).
    pub vip_ports: Option<std::sync::Arc<dyn VipPorts>>,
    /// VIP addresses are allocated from here when the request names none.
    pub vip_network: Ipv4Addr,
    pub vip_prefix: u8,
    pub worker: WorkerDelays,
    /// Octavia checks quotas only with an auth strategy: under `noauth` (what the emulator
    /// serves) everything is admin and no quota is met. On, the emulator enforces them anyway,
    /// for tests of a deployment with Keystone.
    pub enforce_quota: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            vip_ports: None,
            vip_network: Ipv4Addr::new(10, 0, 0, 0),
            vip_prefix: 16,
            worker: WorkerDelays::default(),
            enforce_quota: false,
        }
    }
}

pub struct Store {
    pub config: StoreConfig,
    pub loadbalancers: BTreeMap<String, LoadBalancer>,
    pub listeners: BTreeMap<String, Listener>,
    pub pools: BTreeMap<String, Pool>,
    pub members: BTreeMap<String, Member>,
    pub healthmonitors: BTreeMap<String, HealthMonitor>,
    pub quotas: BTreeMap<String, Quota>,
    /// The next N worker jobs fail: the load balancer and the objects they touched end in ERROR.
    pub failing_jobs: u64,
    seq: u64,
    next_vip_host: u32,
}

impl Store {
    pub fn new(config: StoreConfig) -> Self {
        Self {
            config,
            loadbalancers: BTreeMap::new(),
            listeners: BTreeMap::new(),
            pools: BTreeMap::new(),
            members: BTreeMap::new(),
            healthmonitors: BTreeMap::new(),
            quotas: BTreeMap::new(),
            failing_jobs: 0,
            seq: 0,
            next_vip_host: 0,
        }
    }

    fn common(&mut self, project_id: &str, name: Option<String>, admin: bool, tags: Vec<String>) -> Common {
        self.seq += 1;
        Common {
            id: uuid::Uuid::new_v4().to_string(),
            seq: self.seq,
            project_id: project_id.to_string(),
            name,
            provisioning_status: PENDING_CREATE.into(),
            operating_status: OFFLINE.into(),
            admin_state_up: admin,
            tags,
            created_at: timestamp(),
            updated_at: None,
        }
    }

    /// Completes every load balancer's worker job that is due at `now`.
    pub fn settle(&mut self, now: Instant) {
        let due: Vec<String> = self
            .loadbalancers
            .values()
            .filter(|lb| lb.settle_at.is_some_and(|t| t <= now))
            .map(|lb| lb.common.id.clone())
            .collect();
        for id in due {
            self.finish_work(&id);
        }
    }

    /// The worker's end of a job: PENDING_DELETE objects go away, other PENDING_* ones become ACTIVE.
    fn finish_work(&mut self, lb_id: &str) {
        let Some(lb) = self.loadbalancers.get_mut(lb_id) else {
            return;
        };
        lb.settle_at = None;
        let outcome = if self.failing_jobs > 0 {
            self.failing_jobs -= 1;
            ERROR
        } else {
            ACTIVE
        };
        if outcome == ERROR && lb.common.provisioning_status == PENDING_DELETE {
            lb.common.provisioning_status = ERROR.into();
            let pools = self.pool_ids_of(lb_id);
            self.fail_children(lb_id, &pools);
            return;
        }
        if outcome == ACTIVE && lb.common.provisioning_status == PENDING_DELETE {
            self.remove_lb_tree(lb_id);
            return;
        }
        if lb.common.pending() {
            lb.common.provisioning_status = outcome.into();
        }
        let listeners: Vec<String> = self.listener_ids_of(lb_id);
        let pools: Vec<String> = self.pool_ids_of(lb_id);
        let mut members = Vec::new();
        let mut hms = Vec::new();
        for p in &pools {
            members.extend(self.member_ids_of(p));
            hms.extend(
                self.healthmonitors
                    .values()
                    .filter(|h| &h.pool_id == p)
                    .map(|h| h.common.id.clone()),
            );
        }
        if outcome == ERROR {
            self.fail_children(lb_id, &pools);
            return;
        }
        for id in &members {
            if self
                .members
                .get(id)
                .is_some_and(|m| m.common.provisioning_status == PENDING_DELETE)
            {
                self.members.remove(id);
            }
        }
        for id in &hms {
            if self
                .healthmonitors
                .get(id)
                .is_some_and(|h| h.common.provisioning_status == PENDING_DELETE)
            {
                self.healthmonitors.remove(id);
            }
        }
        for id in &pools {
            if self
                .pools
                .get(id)
                .is_some_and(|p| p.common.provisioning_status == PENDING_DELETE)
            {
                self.remove_pool_tree(id);
            }
        }
        for id in &listeners {
            if self
                .listeners
                .get(id)
                .is_some_and(|l| l.common.provisioning_status == PENDING_DELETE)
            {
                self.listeners.remove(id);
            }
        }
        let activate = |c: &mut Common| {
            if c.pending() {
                c.provisioning_status = ACTIVE.into();
            }
        };
        for l in self.listeners.values_mut().filter(|l| l.lb_id == lb_id) {
            activate(&mut l.common);
        }
        for p in self.pools.values_mut().filter(|p| p.lb_id == lb_id) {
            activate(&mut p.common);
        }
        for m in self.members.values_mut().filter(|m| pools.contains(&m.pool_id)) {
            activate(&mut m.common);
        }
        for h in self
            .healthmonitors
            .values_mut()
            .filter(|h| pools.contains(&h.pool_id))
        {
            activate(&mut h.common);
        }
    }

    fn fail_children(&mut self, lb_id: &str, pools: &[String]) {
        let fail = |c: &mut Common| {
            if c.pending() {
                c.provisioning_status = ERROR.into();
            }
        };
        self.listeners
            .values_mut()
            .filter(|l| l.lb_id == lb_id)
            .for_each(|l| fail(&mut l.common));
        self.pools
            .values_mut()
            .filter(|p| p.lb_id == lb_id)
            .for_each(|p| fail(&mut p.common));
        self.members
            .values_mut()
            .filter(|m| pools.contains(&m.pool_id))
            .for_each(|m| fail(&mut m.common));
        self.healthmonitors
            .values_mut()
            .filter(|h| pools.contains(&h.pool_id))
            .for_each(|h| fail(&mut h.common));
    }

    fn remove_pool_tree(&mut self, pool_id: &str) {
        self.pools.remove(pool_id);
        self.members.retain(|_, m| m.pool_id != pool_id);
        self.healthmonitors.retain(|_, h| h.pool_id != pool_id);
        for l in self.listeners.values_mut() {
            if l.default_pool_id.as_deref() == Some(pool_id) {
                l.default_pool_id = None;
            }
        }
    }

    fn remove_lb_tree(&mut self, lb_id: &str) {
        for p in self.pool_ids_of(lb_id) {
            self.remove_pool_tree(&p);
        }
        self.listeners.retain(|_, l| l.lb_id != lb_id);
        if let (Some(lb), Some(ports)) = (self.loadbalancers.remove(lb_id), &self.config.vip_ports) {
            ports.delete(&lb.vip_port_id);
        }
    }

    pub fn listener_ids_of(&self, lb_id: &str) -> Vec<String> {
        sorted_ids(
            self.listeners
                .values()
                .filter(|l| l.lb_id == lb_id)
                .map(|l| &l.common),
        )
    }

    pub fn pool_ids_of(&self, lb_id: &str) -> Vec<String> {
        sorted_ids(
            self.pools
                .values()
                .filter(|p| p.lb_id == lb_id)
                .map(|p| &p.common),
        )
    }

    pub fn member_ids_of(&self, pool_id: &str) -> Vec<String> {
        sorted_ids(
            self.members
                .values()
                .filter(|m| m.pool_id == pool_id)
                .map(|m| &m.common),
        )
    }

    pub fn healthmonitor_of(&self, pool_id: &str) -> Option<&HealthMonitor> {
        self.healthmonitors.values().find(|h| h.pool_id == pool_id)
    }

    /// Octavia's `test_and_set_lb_and_listeners_prov_status` for a write on a child object: the load balancer
    /// must be ACTIVE (else `ImmutableObject`), then it and the affected listeners go PENDING_UPDATE until the
    /// worker is done.
    pub(crate) fn lock_for_child(
        &mut self,
        lb_id: &str,
        listener_ids: &[String],
        work: Work,
        now: Instant,
    ) -> Result<(), ApiError> {
        let delay = self.config.worker.delay(work);
        let lb = self
            .loadbalancers
            .get_mut(lb_id)
            .ok_or_else(|| ApiError::not_found("Load Balancer", lb_id))?;
        if lb.common.provisioning_status != ACTIVE {
            return Err(ApiError::immutable("Load Balancer", lb_id));
        }
        lb.common.provisioning_status = PENDING_UPDATE.into();
        lb.settle_at = Some(now + delay);
        for id in listener_ids {
            if let Some(l) = self.listeners.get_mut(id) {
                l.common.provisioning_status = PENDING_UPDATE.into();
            }
        }
        Ok(())
    }

    /// The check half of [`Self::lock_for_child`], for validating before anything changes.
    pub(crate) fn check_lb_mutable(&self, lb_id: &str) -> Result<(), ApiError> {
        match self.loadbalancers.get(lb_id) {
            None => Err(ApiError::not_found("Load Balancer", lb_id)),
            Some(lb) if lb.common.provisioning_status != ACTIVE => {
                Err(ApiError::immutable("Load Balancer", lb_id))
            }
            Some(_) => Ok(()),
        }
    }

    /// `check_quota_met`: would `count` more objects of `kind` exceed the project's quota?
    pub(crate) fn check_quota(
        &self,
        project_id: &str,
        kind: quotas::Kind,
        count: usize,
    ) -> Result<(), ApiError> {
        let limit = self.quota_for(project_id).limit(kind);
        if !self.config.enforce_quota || limit < 0 {
            return Ok(());
        }
        let used = match kind {
            quotas::Kind::LoadBalancer => self
                .loadbalancers
                .values()
                .filter(|x| x.common.project_id == project_id)
                .count(),
            quotas::Kind::Listener => self
                .listeners
                .values()
                .filter(|x| x.common.project_id == project_id)
                .count(),
            quotas::Kind::Pool => self
                .pools
                .values()
                .filter(|x| x.common.project_id == project_id)
                .count(),
            quotas::Kind::Member => self
                .members
                .values()
                .filter(|x| x.common.project_id == project_id)
                .count(),
            quotas::Kind::HealthMonitor => self
                .healthmonitors
                .values()
                .filter(|x| x.common.project_id == project_id)
                .count(),
        };
        if used + count > limit as usize {
            return Err(ApiError::quota(kind.model_name()));
        }
        Ok(())
    }

    /// Puts a load balancer (and its children) into ERROR, as a failed worker job would.
    pub fn force_error(&mut self, lb_id: &str) -> Result<(), ApiError> {
        let lb = self
            .loadbalancers
            .get_mut(lb_id)
            .ok_or_else(|| ApiError::not_found("Load Balancer", lb_id))?;
        lb.common.provisioning_status = ERROR.into();
        lb.settle_at = None;
        Ok(())
    }

    /// A listener, pool or member goes to ERROR while its load balancer stays ACTIVE: what a
    /// provider does when one child operation fails (the amphora driver's revert marks the
    /// object ERROR and the load balancer ACTIVE again).
    pub fn force_child_error(&mut self, kind: &str, id: &str) -> Result<(), ApiError> {
        let common = match kind {
            "listeners" => self.listeners.get_mut(id).map(|o| &mut o.common),
            "pools" => self.pools.get_mut(id).map(|o| &mut o.common),
            "members" => self.members.get_mut(id).map(|o| &mut o.common),
            _ => return Err(ApiError::new(400, format!("no ERROR control for {kind}"))),
        };
        let common = common.ok_or_else(|| ApiError::not_found(kind, id))?;
        common.provisioning_status = ERROR.into();
        Ok(())
    }

    pub(crate) fn allocate_vip(&mut self) -> Result<Ipv4Addr, ApiError> {
        let size = 1u64 << (32 - u32::from(self.config.vip_prefix.min(30)));
        let base = u32::from(self.config.vip_network);
        for _ in 0..size {
            self.next_vip_host = (self.next_vip_host + 1) % (size as u32);
            let host = self.next_vip_host;
            // Skip the network address, the gateway (.1) and broadcast like Neutron's allocation pools do.
            if host < 2 || u64::from(host) == size - 1 {
                continue;
            }
            let ip = Ipv4Addr::from(base + host);
            if !self
                .loadbalancers
                .values()
                .any(|lb| lb.vip_address == ip.to_string())
            {
                return Ok(ip);
            }
        }
        Err(ApiError::internal("No more IP addresses available for the VIP"))
    }
}

fn sorted_ids<'a>(it: impl Iterator<Item = &'a Common>) -> Vec<String> {
    let mut v: Vec<&Common> = it.collect();
    v.sort_by_key(|c| c.seq);
    v.into_iter().map(|c| c.id.clone()).collect()
}

pub(crate) fn id_list(ids: &[String]) -> Value {
    Value::Array(ids.iter().map(|id| json!({ "id": id })).collect())
}
