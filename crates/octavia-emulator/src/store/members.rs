//! Members of a pool, including the batch update that replaces a pool's whole member set.

use std::collections::BTreeSet;
use std::time::Instant;

use serde_json::{Map, Value, json};

use super::providers::Provider;
use super::{Common, NO_MONITOR, PENDING_DELETE, PENDING_UPDATE, Store, Work, quotas::Kind, timestamp};
use crate::error::ApiError;
use crate::input::Fields;

#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub common: Common,
    pub pool_id: String,
    pub address: String,
    pub protocol_port: i64,
    pub weight: i64,
    pub backup: bool,
    pub subnet_id: Option<String>,
    pub monitor_address: Option<String>,
    pub monitor_port: Option<i64>,
}

pub const CREATE_FIELDS: [&str; 12] = [
    "name",
    "admin_state_up",
    "address",
    "protocol_port",
    "weight",
    "backup",
    "subnet_id",
    "project_id",
    "monitor_port",
    "monitor_address",
    "tags",
    "request_sriov",
];
const UPDATE_FIELDS: [&str; 7] = [
    "name",
    "admin_state_up",
    "weight",
    "backup",
    "monitor_port",
    "monitor_address",
    "tags",
];

pub struct MemberSpec {
    pub name: Option<String>,
    pub admin_state_up: bool,
    pub address: String,
    pub protocol_port: i64,
    pub weight: i64,
    pub backup: bool,
    pub subnet_id: Option<String>,
    pub monitor_address: Option<String>,
    pub monitor_port: Option<i64>,
    pub tags: Vec<String>,
}

impl MemberSpec {
    pub fn parse(f: &Fields<'_>) -> Result<Self, ApiError> {
        let address = f
            .ip("address")?
            .ok_or_else(|| ApiError::invalid_input("address", "None", "Mandatory field missing."))?;
        Ok(Self {
            name: f.string("name", 255)?,
            admin_state_up: f.boolean("admin_state_up")?.unwrap_or(true),
            address: address.to_string(),
            protocol_port: f.required_int("protocol_port", 1, 65535)?,
            weight: f.int("weight", 0, 256)?.unwrap_or(1),
            backup: f.boolean("backup")?.unwrap_or(false),
            subnet_id: f.uuid("subnet_id")?,
            monitor_address: f.ip("monitor_address")?.map(|ip| ip.to_string()),
            monitor_port: f.int("monitor_port", 1, 65535)?,
            tags: f.string_list("tags", 255)?.unwrap_or_default(),
        })
    }

    /// `validate.ip_not_reserved` with Octavia's default `[networking] reserved_ips` (the metadata address).
    pub fn check_reserved(&self) -> Result<(), ApiError> {
        if self.address == "169.254.169.254" {
            return Err(ApiError::new(
                400,
                format!("{} is not a valid option for member address", self.address),
            ));
        }
        Ok(())
    }

    fn key(&self) -> (String, i64) {
        (self.address.clone(), self.protocol_port)
    }
}

fn duplicate(address: &str, port: i64) -> ApiError {
    ApiError::new(
        409,
        format!("Another member on this pool is already using ip {address} on protocol_port {port}"),
    )
}

impl Store {
    pub(crate) fn insert_member(
        &mut self,
        pool_id: &str,
        project_id: &str,
        spec: MemberSpec,
        has_hm: bool,
    ) -> String {
        let mut common = self.common(project_id, spec.name, spec.admin_state_up, spec.tags);
        if !has_hm {
            common.operating_status = NO_MONITOR.into();
        }
        let id = common.id.clone();
        self.members.insert(
            id.clone(),
            Member {
                common,
                pool_id: pool_id.to_string(),
                address: spec.address,
                protocol_port: spec.protocol_port,
                weight: spec.weight,
                backup: spec.backup,
                subnet_id: spec.subnet_id,
                monitor_address: spec.monitor_address,
                monitor_port: spec.monitor_port,
            },
        );
        id
    }

    /// Member and health monitor controllers check the pool first (`ImmutableObject` Pool), then the load
    /// balancer; the write puts the pool in PENDING_UPDATE too.
    pub(crate) fn pool_child_context(&self, pool_id: &str) -> Result<(String, String, Provider), ApiError> {
        let pool = self
            .pools
            .get(pool_id)
            .ok_or_else(|| ApiError::not_found("Pool", pool_id))?;
        if pool.common.provisioning_status != super::ACTIVE {
            return Err(ApiError::immutable("Pool", pool_id));
        }
        let lb = self
            .loadbalancers
            .get(&pool.lb_id)
            .ok_or_else(|| ApiError::not_found("Load Balancer", &pool.lb_id))?;
        self.check_lb_mutable(&pool.lb_id)?;
        Ok((pool.lb_id.clone(), pool.common.project_id.clone(), lb.provider))
    }

    fn vip_of(&self, lb_id: &str) -> String {
        self.loadbalancers
            .get(lb_id)
            .map(|lb| lb.vip_address.clone())
            .unwrap_or_default()
    }

    pub(crate) fn lock_pool_child(
        &mut self,
        lb_id: &str,
        pool_id: &str,
        work: Work,
        now: Instant,
    ) -> Result<(), ApiError> {
        let listeners = self.listeners_using(pool_id);
        self.lock_for_child(lb_id, &listeners, work, now)?;
        if let Some(p) = self.pools.get_mut(pool_id) {
            p.common.provisioning_status = PENDING_UPDATE.into();
        }
        Ok(())
    }

    pub fn create_member(&mut self, pool_id: &str, body: &Value, now: Instant) -> Result<Value, ApiError> {
        let f = Fields::root(body, "member", &CREATE_FIELDS)?;
        let spec = MemberSpec::parse(&f)?;
        let pool_project = self
            .pools
            .get(pool_id)
            .map(|p| p.common.project_id.clone())
            .ok_or_else(|| ApiError::not_found("Pool", pool_id))?;
        // Octavia's order: reserved address, quota, then the pool and load balancer states, then duplicates.
        spec.check_reserved()?;
        self.check_quota(&pool_project, Kind::Member, 1)?;
        let (lb_id, project, provider) = self.pool_child_context(pool_id)?;
        if self
            .members
            .values()
            .any(|m| m.pool_id == pool_id && (m.address.clone(), m.protocol_port) == spec.key())
        {
            return Err(duplicate(&spec.address, spec.protocol_port));
        }
        provider.check_member_monitor(spec.monitor_address.is_some(), spec.monitor_port.is_some())?;
        provider.check_member_family(&self.vip_of(&lb_id), &spec.address)?;
        let has_hm = self.healthmonitor_of(pool_id).is_some();
        let id = self.insert_member(pool_id, &project, spec, has_hm);
        self.lock_pool_child(&lb_id, pool_id, Work::ChildCreate, now)?;
        Ok(json!({ "member": self.render_member(&id) }))
    }

    pub fn update_member(
        &mut self,
        pool_id: &str,
        id: &str,
        body: &Value,
        now: Instant,
    ) -> Result<Value, ApiError> {
        if self.members.get(id).is_none_or(|m| m.pool_id != pool_id) {
            return Err(ApiError::not_found("Member", id));
        }
        let f = Fields::root(body, "member", &UPDATE_FIELDS)?;
        let name = f.string("name", 255)?;
        let admin = f.boolean("admin_state_up")?;
        let weight = f.int("weight", 0, 256)?;
        let backup = f.boolean("backup")?;
        let monitor_address = f.ip("monitor_address")?;
        let monitor_port = f.int("monitor_port", 1, 65535)?;
        let tags = f.string_list("tags", 255)?;
        let (lb_id, _, provider) = self.pool_child_context(pool_id)?;
        provider.check_member_monitor(monitor_address.is_some(), monitor_port.is_some())?;
        self.lock_pool_child(&lb_id, pool_id, Work::ChildUpdate, now)?;
        let m = self
            .members
            .get_mut(id)
            .ok_or_else(|| ApiError::not_found("Member", id))?;
        m.common.provisioning_status = PENDING_UPDATE.into();
        if f.has("name") {
            m.common.name = name;
        }
        if let Some(a) = admin {
            m.common.admin_state_up = a;
        }
        if let Some(w) = weight {
            m.weight = w;
        }
        if let Some(b) = backup {
            m.backup = b;
        }
        if f.has("monitor_address") {
            m.monitor_address = monitor_address.map(|ip| ip.to_string());
        }
        if f.has("monitor_port") {
            m.monitor_port = monitor_port;
        }
        if let Some(t) = tags {
            m.common.tags = t;
        }
        m.common.updated_at = Some(timestamp());
        Ok(json!({ "member": self.render_member(id) }))
    }

    pub fn delete_member(&mut self, pool_id: &str, id: &str, now: Instant) -> Result<(), ApiError> {
        if self.members.get(id).is_none_or(|m| m.pool_id != pool_id) {
            return Err(ApiError::not_found("Member", id));
        }
        let (lb_id, _, _) = self.pool_child_context(pool_id)?;
        self.lock_pool_child(&lb_id, pool_id, Work::ChildDelete, now)?;
        if let Some(m) = self.members.get_mut(id) {
            m.common.provisioning_status = PENDING_DELETE.into();
        }
        Ok(())
    }

    /// `PUT /pools/{id}/members`: members matched by (address, protocol_port) are updated, the others created;
    /// current members not named are deleted unless `additive_only`. A request that changes nothing leaves the
    /// load balancer alone (Octavia returns early without locking it).
    pub fn batch_update_members(
        &mut self,
        pool_id: &str,
        body: &Value,
        additive_only: bool,
        now: Instant,
    ) -> Result<(), ApiError> {
        let root = Fields::object(body, "members_", &["members"])?;
        let specs = root
            .list("members")?
            .iter()
            .map(|m| MemberSpec::parse(&Fields::object(m, "members", &CREATE_FIELDS)?))
            .collect::<Result<Vec<_>, _>>()?;
        if !self.pools.contains_key(pool_id) {
            return Err(ApiError::not_found("Pool", pool_id));
        }
        let (lb_id, project, provider) = self.pool_child_context(pool_id)?;
        let old: Vec<(String, (String, i64))> = self
            .member_ids_of(pool_id)
            .into_iter()
            .filter_map(|id| {
                self.members
                    .get(&id)
                    .map(|m| (id, (m.address.clone(), m.protocol_port)))
            })
            .collect();
        let mut seen = BTreeSet::new();
        let (mut updates, mut creates) = (Vec::new(), Vec::new());
        for spec in specs {
            let key = spec.key();
            if !seen.insert(key.clone()) {
                if old.iter().any(|(_, k)| k == &key) {
                    return Err(ApiError::validation(
                        "Member must be updated only once in the same request.",
                    ));
                }
                return Err(duplicate(&key.0, key.1));
            }
            provider.check_member_monitor(spec.monitor_address.is_some(), spec.monitor_port.is_some())?;
            provider.check_member_family(&self.vip_of(&lb_id), &spec.address)?;
            match old.iter().find(|(_, k)| k == &key) {
                Some((id, _)) => updates.push((id.clone(), spec)),
                None => {
                    spec.check_reserved()?;
                    creates.push(spec)
                }
            }
        }
        let deletes: Vec<String> = if additive_only {
            Vec::new()
        } else {
            old.iter()
                .filter(|(_, k)| !seen.contains(k))
                .map(|(id, _)| id.clone())
                .collect()
        };
        if creates.is_empty() && updates.is_empty() && deletes.is_empty() {
            return Ok(());
        }
        let growth = creates.len() as i64 - deletes.len() as i64;
        if growth > 0 {
            self.check_quota(&project, Kind::Member, growth as usize)?;
        }
        self.lock_pool_child(&lb_id, pool_id, Work::ChildUpdate, now)?;
        let has_hm = self.healthmonitor_of(pool_id).is_some();
        for spec in creates {
            self.insert_member(pool_id, &project, spec, has_hm);
        }
        for (id, spec) in updates {
            if let Some(m) = self.members.get_mut(&id) {
                m.common.provisioning_status = PENDING_UPDATE.into();
                m.common.name = spec.name;
                m.common.admin_state_up = spec.admin_state_up;
                m.common.tags = spec.tags;
                m.weight = spec.weight;
                m.backup = spec.backup;
                m.monitor_address = spec.monitor_address;
                m.monitor_port = spec.monitor_port;
                m.common.updated_at = Some(timestamp());
            }
        }
        for id in deletes {
            if let Some(m) = self.members.get_mut(&id) {
                m.common.provisioning_status = PENDING_DELETE.into();
            }
        }
        Ok(())
    }

    /// `MemberResponse` (the full form inside a pool is the same object).
    pub fn render_member(&self, id: &str) -> Value {
        let Some(m) = self.members.get(id) else {
            return Value::Null;
        };
        let mut out = Map::new();
        m.common.render_into(&mut out);
        let extra = json!({
            "address": m.address,
            "protocol_port": m.protocol_port,
            "weight": m.weight,
            "backup": m.backup,
            "subnet_id": m.subnet_id,
            "monitor_address": m.monitor_address,
            "monitor_port": m.monitor_port,
            "vnic_type": "normal",
        });
        if let Value::Object(e) = extra {
            out.extend(e);
        }
        Value::Object(out)
    }
}
