//! Per-project quotas (`/v2/lbaas/quotas`): -1 is unlimited; a project without its own row gets the defaults.

use serde_json::{Value, json};

use super::Store;
use crate::error::ApiError;
use crate::input::Fields;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    LoadBalancer,
    Listener,
    Pool,
    Member,
    HealthMonitor,
}

impl Kind {
    /// The data model's human name Octavia puts into `QuotaException`.
    pub fn model_name(self) -> &'static str {
        match self {
            Kind::LoadBalancer => "Load Balancer",
            Kind::Listener => "Listener",
            Kind::Pool => "Pool",
            Kind::Member => "Member",
            Kind::HealthMonitor => "Health Monitor",
        }
    }
}

/// Quota limits; `None` = the configured default (unlimited, as Octavia's defaults are).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quota {
    pub load_balancer: Option<i64>,
    pub listener: Option<i64>,
    pub pool: Option<i64>,
    pub member: Option<i64>,
    pub health_monitor: Option<i64>,
    pub l7policy: Option<i64>,
    pub l7rule: Option<i64>,
}

impl Quota {
    pub fn limit(&self, kind: Kind) -> i64 {
        match kind {
            Kind::LoadBalancer => self.load_balancer,
            Kind::Listener => self.listener,
            Kind::Pool => self.pool,
            Kind::Member => self.member,
            Kind::HealthMonitor => self.health_monitor,
        }
        .unwrap_or(-1)
    }

    /// `QuotaResponse`: both spellings of load balancer and health monitor (the misspelled ones are deprecated
    /// but still rendered).
    pub fn render(&self, project_id: &str) -> Value {
        let d = |v: Option<i64>| v.unwrap_or(-1);
        json!({
            "project_id": project_id,
            "load_balancer": d(self.load_balancer),
            "loadbalancer": d(self.load_balancer),
            "listener": d(self.listener),
            "pool": d(self.pool),
            "member": d(self.member),
            "health_monitor": d(self.health_monitor),
            "healthmonitor": d(self.health_monitor),
            "l7policy": d(self.l7policy),
            "l7rule": d(self.l7rule),
        })
    }
}

const MAX_QUOTA: i64 = 2_000_000_000;

impl Store {
    pub fn quota_for(&self, project_id: &str) -> Quota {
        self.quotas.get(project_id).cloned().unwrap_or_default()
    }

    /// `PUT /quotas/{project_id}`: only the named limits change.
    pub fn update_quota(&mut self, project_id: &str, body: &Value) -> Result<Value, ApiError> {
        let allowed = [
            "loadbalancer",
            "load_balancer",
            "listener",
            "pool",
            "member",
            "healthmonitor",
            "health_monitor",
            "l7policy",
            "l7rule",
        ];
        let f = Fields::root(body, "quota", &allowed)?;
        let get = |k: &str| f.int(k, -1, MAX_QUOTA);
        let lb = get("loadbalancer")?.or(get("load_balancer")?);
        let hm = get("healthmonitor")?.or(get("health_monitor")?);
        let (listener, pool, member, l7p, l7r) = (
            get("listener")?,
            get("pool")?,
            get("member")?,
            get("l7policy")?,
            get("l7rule")?,
        );
        let q = self.quotas.entry(project_id.to_string()).or_default();
        let set = |slot: &mut Option<i64>, v: Option<i64>| {
            if v.is_some() {
                *slot = v;
            }
        };
        set(&mut q.load_balancer, lb);
        set(&mut q.health_monitor, hm);
        set(&mut q.listener, listener);
        set(&mut q.pool, pool);
        set(&mut q.member, member);
        set(&mut q.l7policy, l7p);
        set(&mut q.l7rule, l7r);
        Ok(json!({ "quota": q.render(project_id) }))
    }

    pub fn list_quotas(&self) -> Value {
        let quotas: Vec<Value> = self.quotas.iter().map(|(p, q)| q.render(p)).collect();
        json!({ "quotas": quotas, "quotas_links": [] })
    }
}
