//! Pools: a balancing algorithm over members, owned by a load balancer and optionally a listener's default.

use std::time::Instant;

use serde_json::{Map, Value, json};

use super::healthmonitors::HmSpec;
use super::listeners::check_pool_protocol;
use super::members::MemberSpec;
use super::providers::Provider;
use super::{Common, PENDING_DELETE, Store, Work, id_list, quotas::Kind, timestamp};
use crate::error::ApiError;
use crate::input::Fields;

pub const PROTOCOLS: [&str; 7] = ["HTTP", "HTTPS", "PROXY", "PROXYV2", "SCTP", "TCP", "UDP"];
pub const ALGORITHMS: [&str; 4] = ["LEAST_CONNECTIONS", "ROUND_ROBIN", "SOURCE_IP", "SOURCE_IP_PORT"];
pub const SP_TYPES: [&str; 3] = ["APP_COOKIE", "HTTP_COOKIE", "SOURCE_IP"];

#[derive(Debug, Clone, PartialEq)]
pub struct SessionPersistence {
    pub kind: String,
    pub cookie_name: Option<String>,
    pub persistence_timeout: Option<i64>,
    pub persistence_granularity: Option<String>,
}

impl SessionPersistence {
    fn parse(v: &Value, for_create: bool) -> Result<Self, ApiError> {
        let f = Fields::object(
            v,
            "session_persistence",
            &[
                "type",
                "cookie_name",
                "persistence_timeout",
                "persistence_granularity",
            ],
        )?;
        let kind = if for_create {
            f.required_one_of("type", &SP_TYPES)?
        } else {
            f.one_of("type", &SP_TYPES)?.unwrap_or_else(|| "SOURCE_IP".into())
        };
        let cookie_name = f.string("cookie_name", 255)?;
        Ok(Self {
            kind,
            cookie_name,
            persistence_timeout: f.int("persistence_timeout", i64::MIN, i64::MAX)?,
            persistence_granularity: f.ip("persistence_granularity")?.map(|ip| ip.to_string()),
        })
    }

    /// `validate.check_session_persistence`.
    fn check_cookie(&self) -> Result<(), ApiError> {
        if self.cookie_name.is_some() && self.kind != "APP_COOKIE" {
            return Err(ApiError::validation(
                "Field \"cookie_name\" can only be specified with session persistence of type \"APP_COOKIE\".",
            ));
        }
        if self.kind == "APP_COOKIE" && self.cookie_name.is_none() {
            return Err(ApiError::validation(
                "Field \"cookie_name\" must be specified when using the \"APP_COOKIE\" session persistence type.",
            ));
        }
        Ok(())
    }

    fn render(&self) -> Value {
        json!({
            "type": self.kind,
            "cookie_name": self.cookie_name,
            "persistence_timeout": self.persistence_timeout,
            "persistence_granularity": self.persistence_granularity,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    pub common: Common,
    pub description: Option<String>,
    pub lb_id: String,
    pub protocol: String,
    pub lb_algorithm: String,
    pub session_persistence: Option<SessionPersistence>,
}

/// A validated pool create request; in a fully populated create it may carry members and a health monitor.
pub struct PoolSpec {
    pub name: Option<String>,
    pub description: Option<String>,
    pub admin_state_up: bool,
    pub protocol: Option<String>,
    pub lb_algorithm: Option<String>,
    pub session_persistence: Option<SessionPersistence>,
    pub tags: Vec<String>,
    pub members: Vec<MemberSpec>,
    pub healthmonitor: Option<HmSpec>,
    pub listener_id: Option<String>,
    pub loadbalancer_id: Option<String>,
}

const FIELDS: [&str; 17] = [
    "name",
    "description",
    "admin_state_up",
    "protocol",
    "lb_algorithm",
    "session_persistence",
    "project_id",
    "healthmonitor",
    "members",
    "tags",
    "tls_container_ref",
    "ca_tls_container_ref",
    "crl_container_ref",
    "tls_enabled",
    "tls_ciphers",
    "tls_versions",
    "alpn_protocols",
];

impl PoolSpec {
    /// `nested`: a `PoolSingleCreate` (protocol and algorithm checked later, members/monitor allowed).
    pub fn parse(f: &Fields<'_>, nested: bool) -> Result<Self, ApiError> {
        let (protocol, lb_algorithm) = if nested {
            (
                f.one_of("protocol", &PROTOCOLS)?,
                f.one_of("lb_algorithm", &ALGORITHMS)?,
            )
        } else {
            (
                Some(f.required_one_of("protocol", &PROTOCOLS)?),
                Some(f.required_one_of("lb_algorithm", &ALGORITHMS)?),
            )
        };
        let members = f
            .list("members")?
            .iter()
            .map(|m| MemberSpec::parse(&Fields::object(m, "members", &super::members::CREATE_FIELDS)?))
            .collect::<Result<Vec<_>, _>>()?;
        let healthmonitor = match f.present("healthmonitor") {
            None => None,
            Some(v) => Some(HmSpec::parse(&Fields::object(
                v,
                "healthmonitor",
                &super::healthmonitors::SINGLE_FIELDS,
            )?)?),
        };
        Ok(Self {
            name: f.string("name", 255)?,
            description: f.string("description", 255)?,
            admin_state_up: f.boolean("admin_state_up")?.unwrap_or(true),
            protocol,
            lb_algorithm,
            session_persistence: f
                .present("session_persistence")
                .map(|v| SessionPersistence::parse(v, true))
                .transpose()?,
            tags: f.string_list("tags", 255)?.unwrap_or_default(),
            members,
            healthmonitor,
            listener_id: f.uuid("listener_id")?,
            loadbalancer_id: f.uuid("loadbalancer_id")?,
        })
    }

    /// Timeout and granularity of session persistence only exist for UDP and SCTP pools.
    pub(crate) fn check_persistence_protocol(&self) -> Result<(), ApiError> {
        let l4 = matches!(self.protocol.as_deref(), Some("UDP" | "SCTP"));
        if l4 && let Some(sp) = &self.session_persistence {
            // Cookie names are refused by the pool controller before the type is looked at.
            if sp.cookie_name.is_some() {
                return Err(ApiError::validation(
                    "Cookie names are not supported for UDP/SCTP pools.",
                ));
            }
            if sp.kind == "HTTP_COOKIE" || sp.kind == "APP_COOKIE" {
                return Err(ApiError::validation(format!(
                    "Session persistence of type {} is not supported for UDP/SCTP protocol pools.",
                    sp.kind
                )));
            }
        }
        if !l4
            && let Some(sp) = &self.session_persistence
            && (sp.persistence_timeout.is_some() || sp.persistence_granularity.is_some())
        {
            return Err(ApiError::validation(
                "persistence_timeout and persistence_granularity is only for UDP and SCTP protocol pools.",
            ));
        }
        match &self.session_persistence {
            Some(sp) => sp.check_cookie(),
            None => Ok(()),
        }
    }

    pub(crate) fn check_provider(&self, provider: Provider) -> Result<(), ApiError> {
        self.check_persistence_protocol()?;
        provider.check_pool(
            self.protocol.as_deref(),
            self.lb_algorithm.as_deref(),
            self.session_persistence.as_ref().map(|s| s.kind.as_str()),
        )?;
        if let Some(hm) = &self.healthmonitor {
            provider.check_healthmonitor(&hm.kind)?;
        }
        for m in &self.members {
            provider.check_member_monitor(m.monitor_address.is_some(), m.monitor_port.is_some())?;
        }
        Ok(())
    }
}

impl Store {
    /// Inserts a pool with its nested members and monitor (all PENDING_CREATE); returns its id.
    pub(crate) fn insert_pool(&mut self, lb_id: &str, project_id: &str, spec: PoolSpec) -> String {
        let common = self.common(project_id, spec.name, spec.admin_state_up, spec.tags);
        let id = common.id.clone();
        let has_hm = spec.healthmonitor.is_some();
        self.pools.insert(
            id.clone(),
            Pool {
                common,
                description: spec.description,
                lb_id: lb_id.to_string(),
                protocol: spec.protocol.unwrap_or_default(),
                lb_algorithm: spec.lb_algorithm.unwrap_or_default(),
                session_persistence: spec.session_persistence,
            },
        );
        if let Some(hm) = spec.healthmonitor {
            self.insert_healthmonitor(&id, project_id, hm);
        }
        for m in spec.members {
            self.insert_member(&id, project_id, m, has_hm);
        }
        id
    }

    /// `POST /v2/lbaas/pools`.
    pub fn create_pool(&mut self, body: &Value, now: Instant) -> Result<Value, ApiError> {
        let mut fields = FIELDS.to_vec();
        fields.extend(["listener_id", "loadbalancer_id"]);
        fields.retain(|k| *k != "members" && *k != "healthmonitor");
        let f = Fields::root(body, "pool", &fields)?;
        let spec = PoolSpec::parse(&f, false)?;
        let (lb_id, listener) = match (&spec.listener_id, &spec.loadbalancer_id) {
            (Some(lid), _) => {
                let l = self
                    .listeners
                    .get(lid)
                    .ok_or_else(|| ApiError::not_found("Listener", lid))?;
                if let Some(lb) = &spec.loadbalancer_id
                    && lb != &l.lb_id
                {
                    return Err(ApiError::validation(
                        "Listener must be on the Load Balancer specified.",
                    ));
                }
                check_pool_protocol(&l.protocol, spec.protocol.as_deref().unwrap_or_default())?;
                (l.lb_id.clone(), Some(lid.clone()))
            }
            (None, Some(lb)) => (lb.clone(), None),
            (None, None) => {
                return Err(ApiError::validation(
                    "Must provide at least one of: loadbalancer_id, listener_id",
                ));
            }
        };
        let lb = self
            .loadbalancers
            .get(&lb_id)
            .ok_or_else(|| ApiError::not_found("Load Balancer", &lb_id))?;
        let (project, provider) = (lb.common.project_id.clone(), lb.provider);
        self.check_lb_mutable(&lb_id)?;
        spec.check_persistence_protocol()?;
        self.check_quota(&project, Kind::Pool, 1)?;
        if listener
            .as_ref()
            .and_then(|l| self.listeners.get(l))
            .is_some_and(|l| l.default_pool_id.is_some())
        {
            return Err(ApiError::new(409, "This listener already has a default pool"));
        }
        spec.check_provider(provider)?;
        let id = self.insert_pool(&lb_id, &project, spec);
        let affected: Vec<String> = listener.iter().cloned().collect();
        self.lock_for_child(&lb_id, &affected, Work::ChildCreate, now)?;
        if let Some(lid) = listener
            && let Some(l) = self.listeners.get_mut(&lid)
        {
            l.default_pool_id = Some(id.clone());
        }
        Ok(json!({ "pool": self.render_pool(&id, false) }))
    }

    pub fn update_pool(&mut self, id: &str, body: &Value, now: Instant) -> Result<Value, ApiError> {
        let pool = self
            .pools
            .get(id)
            .ok_or_else(|| ApiError::not_found("Pool", id))?;
        let lb_id = pool.lb_id.clone();
        let provider = self
            .loadbalancers
            .get(&lb_id)
            .map(|lb| lb.provider)
            .unwrap_or(Provider::Amphora);
        let fields: Vec<&str> = FIELDS
            .iter()
            .copied()
            .filter(|k| !["protocol", "project_id", "healthmonitor", "members"].contains(k))
            .collect();
        let f = Fields::root(body, "pool", &fields)?;
        let name = f.string("name", 255)?;
        let description = f.string("description", 255)?;
        let admin = f.boolean("admin_state_up")?;
        let algorithm = f.one_of("lb_algorithm", &ALGORITHMS)?;
        let sp = f
            .present("session_persistence")
            .map(|v| SessionPersistence::parse(v, false))
            .transpose()?;
        if let Some(sp) = &sp {
            sp.check_cookie()?;
        }
        let tags = f.string_list("tags", 255)?;
        provider.check_pool(None, algorithm.as_deref(), sp.as_ref().map(|s| s.kind.as_str()))?;
        self.check_lb_mutable(&lb_id)?;
        let listeners = self.listeners_using(id);
        self.lock_for_child(&lb_id, &listeners, Work::ChildUpdate, now)?;
        let pool = self
            .pools
            .get_mut(id)
            .ok_or_else(|| ApiError::not_found("Pool", id))?;
        pool.common.provisioning_status = super::PENDING_UPDATE.into();
        if f.has("name") {
            pool.common.name = name;
        }
        if f.has("description") {
            pool.description = description;
        }
        if let Some(a) = admin {
            pool.common.admin_state_up = a;
        }
        if let Some(a) = algorithm {
            pool.lb_algorithm = a;
        }
        if f.has("session_persistence") {
            pool.session_persistence = sp;
        }
        if let Some(t) = tags {
            pool.common.tags = t;
        }
        pool.common.updated_at = Some(timestamp());
        Ok(json!({ "pool": self.render_pool(id, false) }))
    }

    pub fn delete_pool(&mut self, id: &str, now: Instant) -> Result<(), ApiError> {
        let pool = self
            .pools
            .get(id)
            .ok_or_else(|| ApiError::not_found("Pool", id))?;
        let lb_id = pool.lb_id.clone();
        let listeners = self.listeners_using(id);
        self.lock_for_child(&lb_id, &listeners, Work::ChildDelete, now)?;
        if let Some(p) = self.pools.get_mut(id) {
            p.common.provisioning_status = PENDING_DELETE.into();
        }
        Ok(())
    }

    pub fn listeners_using(&self, pool_id: &str) -> Vec<String> {
        let mut v: Vec<&super::Listener> = self
            .listeners
            .values()
            .filter(|l| l.default_pool_id.as_deref() == Some(pool_id))
            .collect();
        v.sort_by_key(|l| l.common.seq);
        v.into_iter().map(|l| l.common.id.clone()).collect()
    }

    /// `PoolResponse`, or `PoolFullResponse` (members and monitor inline, no `loadbalancers`).
    pub fn render_pool(&self, id: &str, full: bool) -> Value {
        let Some(p) = self.pools.get(id) else {
            return Value::Null;
        };
        let mut out = Map::new();
        p.common.render_into(&mut out);
        let hm = self.healthmonitor_of(id);
        let members = self.member_ids_of(id);
        let extra = json!({
            "description": p.description,
            "protocol": p.protocol,
            "lb_algorithm": p.lb_algorithm,
            "session_persistence": p.session_persistence.as_ref().map(SessionPersistence::render),
            "listeners": id_list(&self.listeners_using(id)),
            "healthmonitor_id": hm.map(|h| h.common.id.clone()),
            "tls_container_ref": null,
            "ca_tls_container_ref": null,
            "crl_container_ref": null,
            "tls_enabled": false,
            "tls_ciphers": null,
            "tls_versions": null,
            "alpn_protocols": null,
        });
        if let Value::Object(m) = extra {
            out.extend(m);
        }
        if full {
            out.insert(
                "members".into(),
                Value::Array(members.iter().map(|m| self.render_member(m)).collect()),
            );
            if let Some(h) = hm {
                out.insert(
                    "healthmonitor".into(),
                    self.render_healthmonitor(&h.common.id, true),
                );
            }
        } else {
            out.insert("loadbalancers".into(), id_list(std::slice::from_ref(&p.lb_id)));
            out.insert("members".into(), id_list(&members));
        }
        Value::Object(out)
    }

    pub(crate) fn pool_status(&self, id: &str) -> Value {
        let Some(p) = self.pools.get(id) else {
            return Value::Null;
        };
        let members: Vec<Value> = self
            .member_ids_of(id)
            .iter()
            .filter_map(|m| self.members.get(m))
            .map(|m| {
                json!({
                    "id": m.common.id,
                    "name": m.common.name.clone().unwrap_or_default(),
                    "operating_status": m.common.operating_status,
                    "provisioning_status": m.common.provisioning_status,
                    "address": m.address,
                    "protocol_port": m.protocol_port,
                })
            })
            .collect();
        let mut out = json!({
            "id": p.common.id,
            // Only listener, member and load balancer status entries turn a missing name into "".
            "name": p.common.name,
            "provisioning_status": p.common.provisioning_status,
            "operating_status": p.common.operating_status,
            "members": members,
        });
        if let Some(h) = self.healthmonitor_of(id) {
            out["health_monitor"] = json!({
                "id": h.common.id,
                "name": h.common.name,
                "type": h.kind,
                "provisioning_status": h.common.provisioning_status,
                "operating_status": h.common.operating_status,
            });
        }
        out
    }
}
