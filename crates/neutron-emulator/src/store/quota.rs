//! Quotas: per-project limits (neutron's defaults until set) and what each project uses.

use serde_json::{Value, json};

use std::collections::BTreeMap;

use super::{Record, Store};
use crate::error::{ApiError, ApiResult};
use crate::input::{self, Obj};

/// Quota keys in the order neutron lists them, with their defaults (-1 = unlimited).
pub const QUOTA_DEFAULTS: [(&str, i64); 11] = [
    ("network", 100),
    ("subnet", 100),
    ("subnetpool", -1),
    ("port", 500),
    ("router_route", 30),
    ("router", 10),
    ("floatingip", 50),
    ("rbac_policy", 10),
    ("security_group", 10),
    ("security_group_rule", 100),
    ("trunk", -1),
];

impl Store {
    pub fn quota_limit(&self, project: &str, key: &str) -> i64 {
        if let Some(v) = self.quotas.get(project).and_then(|q| q.get(key)) {
            return *v;
        }
        QUOTA_DEFAULTS
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .unwrap_or(-1)
    }

    pub fn quota_used(&self, project: &str, key: &str) -> i64 {
        let n = match key {
            "network" => owned_by(&self.networks, project),
            "subnet" => owned_by(&self.subnets, project),
            "subnetpool" => owned_by(&self.subnetpools, project),
            "port" => owned_by(&self.ports, project),
            "router" => owned_by(&self.routers, project),
            "security_group" => owned_by(&self.security_groups, project),
            "security_group_rule" => self.sg_rules.values().filter(|r| r.project_id == project).count(),
            "trunk" => owned_by(&self.trunks, project),
            "floatingip" => owned_by(&self.floatingips, project),
            _ => 0,
        };
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    pub(super) fn check_quota(&self, project: &str, key: &str, adding: usize) -> ApiResult<()> {
        let limit = self.quota_limit(project, key);
        let adding = i64::try_from(adding).unwrap_or(i64::MAX);
        if limit >= 0 && self.quota_used(project, key).saturating_add(adding) > limit {
            return Err(ApiError::over_quota(key));
        }
        Ok(())
    }

    pub fn quota_json(&self, project: &str) -> Value {
        let mut o = Obj::new();
        for (k, _) in QUOTA_DEFAULTS {
            o.insert(k.into(), json!(self.quota_limit(project, k)));
        }
        Value::Object(o)
    }

    pub fn quota_default_json() -> Value {
        Value::Object(
            QUOTA_DEFAULTS
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect(),
        )
    }

    pub fn quota_details_json(&self, project: &str) -> Value {
        let mut o = Obj::new();
        for (k, _) in QUOTA_DEFAULTS {
            o.insert(
                k.into(),
                json!({"limit": self.quota_limit(project, k), "used": self.quota_used(project, k), "reserved": 0}),
            );
        }
        Value::Object(o)
    }

    pub fn quota_list_json(&self) -> Value {
        let mut projects: Vec<&String> = self.quotas.keys().collect();
        projects.sort();
        let items: Vec<Value> = projects
            .into_iter()
            .map(|p| {
                let mut q = self.quota_json(p);
                if let Value::Object(o) = &mut q {
                    o.insert("project_id".into(), json!(p));
                    o.insert("tenant_id".into(), json!(p));
                }
                q
            })
            .collect();
        json!(items)
    }

    pub fn quota_update(&mut self, project: &str, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "quota")?;
        let mut parsed = Vec::new();
        for (k, v) in obj {
            if !QUOTA_DEFAULTS.iter().any(|(q, _)| q == k) {
                return Err(ApiError::bad_request(format!("Unrecognized attribute(s) '{k}'")));
            }
            let n = input::to_int(k, v)
                .map_err(|_| ApiError::invalid_input(format!("'{}' is not an integer", input::show(v))))?;
            if n < -1 {
                return Err(ApiError::invalid_attr(
                    k,
                    format!("'{n}' is too small - must be at least '-1'"),
                ));
            }
            parsed.push((k.clone(), n));
        }
        let entry = self.quotas.entry(project.to_string()).or_default();
        for (k, n) in parsed {
            entry.insert(k, n);
        }
        Ok(self.quota_json(project))
    }

    pub fn quota_delete(&mut self, project: &str) {
        self.quotas.remove(project);
    }
}

/// How many of `records` belong to `project`.
fn owned_by<R: Record>(records: &BTreeMap<String, R>, project: &str) -> usize {
    records.values().filter(|r| r.std().project_id == project).count()
}
