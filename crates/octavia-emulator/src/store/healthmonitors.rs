//! Health monitors: at most one per pool.

use std::time::Instant;

use serde_json::{Map, Value, json};

use super::{Common, PENDING_DELETE, PENDING_UPDATE, Store, Work, quotas::Kind, timestamp};
use crate::error::ApiError;
use crate::input::Fields;

pub const TYPES: [&str; 7] = ["HTTP", "HTTPS", "PING", "SCTP", "TCP", "TLS-HELLO", "UDP-CONNECT"];
const METHODS: [&str; 9] = [
    "CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE",
];

#[derive(Debug, Clone, PartialEq)]
pub struct HealthMonitor {
    pub common: Common,
    pub pool_id: String,
    pub kind: String,
    pub delay: i64,
    pub timeout: i64,
    pub max_retries: i64,
    pub max_retries_down: i64,
    pub http_method: Option<String>,
    pub url_path: Option<String>,
    pub expected_codes: Option<String>,
}

pub const SINGLE_FIELDS: [&str; 14] = [
    "name",
    "type",
    "delay",
    "timeout",
    "max_retries_down",
    "max_retries",
    "http_method",
    "url_path",
    "expected_codes",
    "admin_state_up",
    "tags",
    "http_version",
    "domain_name",
    "project_id",
];

pub struct HmSpec {
    pub name: Option<String>,
    pub kind: String,
    pub delay: i64,
    pub timeout: i64,
    pub max_retries: i64,
    pub max_retries_down: i64,
    pub http_method: Option<String>,
    pub url_path: Option<String>,
    pub expected_codes: Option<String>,
    pub admin_state_up: bool,
    pub tags: Vec<String>,
}

impl HmSpec {
    pub fn parse(f: &Fields<'_>) -> Result<Self, ApiError> {
        let kind = f.required_one_of("type", &TYPES)?;
        let http = kind == "HTTP" || kind == "HTTPS";
        let mut s = Self {
            name: f.string("name", 255)?,
            delay: f.required_int("delay", 0, i64::MAX)?,
            timeout: f.required_int("timeout", 0, i64::MAX)?,
            max_retries: f.required_int("max_retries", 1, 10)?,
            max_retries_down: f.int("max_retries_down", 1, 10)?.unwrap_or(3),
            http_method: f.one_of("http_method", &METHODS)?,
            url_path: f.string("url_path", 255)?,
            expected_codes: f.string("expected_codes", 64)?,
            admin_state_up: f.boolean("admin_state_up")?.unwrap_or(true),
            tags: f.string_list("tags", 255)?.unwrap_or_default(),
            kind,
        };
        if !http && (s.http_method.is_some() || s.url_path.is_some() || s.expected_codes.is_some()) {
            return Err(ApiError::new(
                400,
                format!(
                    "http_method, url_path, expected_codes is not a valid option for health monitors of type {}",
                    s.kind
                ),
            ));
        }
        if http {
            s.http_method.get_or_insert_with(|| "GET".into());
            s.url_path.get_or_insert_with(|| "/".into());
            s.expected_codes.get_or_insert_with(|| "200".into());
        }
        Ok(s)
    }
}

impl Store {
    pub(crate) fn insert_healthmonitor(&mut self, pool_id: &str, project_id: &str, spec: HmSpec) -> String {
        let common = self.common(project_id, spec.name, spec.admin_state_up, spec.tags);
        let id = common.id.clone();
        self.healthmonitors.insert(
            id.clone(),
            HealthMonitor {
                common,
                pool_id: pool_id.to_string(),
                kind: spec.kind,
                delay: spec.delay,
                timeout: spec.timeout,
                max_retries: spec.max_retries,
                max_retries_down: spec.max_retries_down,
                http_method: spec.http_method,
                url_path: spec.url_path,
                expected_codes: spec.expected_codes,
            },
        );
        id
    }

    pub fn create_healthmonitor(&mut self, body: &Value, now: Instant) -> Result<Value, ApiError> {
        let mut fields = SINGLE_FIELDS.to_vec();
        fields.push("pool_id");
        let f = Fields::root(body, "healthmonitor", &fields)?;
        let pool_id = f
            .uuid("pool_id")?
            .ok_or_else(|| ApiError::invalid_input("pool_id", "None", "Mandatory field missing."))?;
        let spec = HmSpec::parse(&f)?;
        let project = self
            .pools
            .get(&pool_id)
            .map(|p| p.common.project_id.clone())
            .ok_or_else(|| ApiError::not_found("Pool", &pool_id))?;
        self.check_quota(&project, Kind::HealthMonitor, 1)?;
        let (lb_id, _, provider) = self.pool_child_context(&pool_id)?;
        if self.healthmonitor_of(&pool_id).is_some() {
            return Err(ApiError::new(409, "This pool already has a health monitor"));
        }
        provider.check_healthmonitor(&spec.kind)?;
        let id = self.insert_healthmonitor(&pool_id, &project, spec);
        self.lock_pool_child(&lb_id, &pool_id, Work::ChildCreate, now)?;
        Ok(json!({ "healthmonitor": self.render_healthmonitor(&id, false) }))
    }

    pub fn update_healthmonitor(&mut self, id: &str, body: &Value, now: Instant) -> Result<Value, ApiError> {
        let hm = self
            .healthmonitors
            .get(id)
            .ok_or_else(|| ApiError::not_found("Health Monitor", id))?;
        let pool_id = hm.pool_id.clone();
        let allowed: Vec<&str> = SINGLE_FIELDS
            .iter()
            .copied()
            .filter(|k| !["type", "project_id"].contains(k))
            .collect();
        let f = Fields::root(body, "healthmonitor", &allowed)?;
        let name = f.string("name", 255)?;
        let delay = f.int("delay", 0, i64::MAX)?;
        let timeout = f.int("timeout", 0, i64::MAX)?;
        let retries = f.int("max_retries", 1, 10)?;
        let retries_down = f.int("max_retries_down", 1, 10)?;
        let admin = f.boolean("admin_state_up")?;
        let tags = f.string_list("tags", 255)?;
        let (lb_id, _, _) = self.pool_child_context(&pool_id)?;
        self.lock_pool_child(&lb_id, &pool_id, Work::ChildUpdate, now)?;
        let hm = self
            .healthmonitors
            .get_mut(id)
            .ok_or_else(|| ApiError::not_found("Health Monitor", id))?;
        hm.common.provisioning_status = PENDING_UPDATE.into();
        if f.has("name") {
            hm.common.name = name;
        }
        for (slot, v) in [
            (&mut hm.delay, delay),
            (&mut hm.timeout, timeout),
            (&mut hm.max_retries, retries),
            (&mut hm.max_retries_down, retries_down),
        ] {
            if let Some(v) = v {
                *slot = v;
            }
        }
        if let Some(a) = admin {
            hm.common.admin_state_up = a;
        }
        if let Some(t) = tags {
            hm.common.tags = t;
        }
        hm.common.updated_at = Some(timestamp());
        Ok(json!({ "healthmonitor": self.render_healthmonitor(id, false) }))
    }

    pub fn delete_healthmonitor(&mut self, id: &str, now: Instant) -> Result<(), ApiError> {
        let hm = self
            .healthmonitors
            .get(id)
            .ok_or_else(|| ApiError::not_found("Health Monitor", id))?;
        let pool_id = hm.pool_id.clone();
        let (lb_id, _, _) = self.pool_child_context(&pool_id)?;
        self.lock_pool_child(&lb_id, &pool_id, Work::ChildDelete, now)?;
        if let Some(h) = self.healthmonitors.get_mut(id) {
            h.common.provisioning_status = PENDING_DELETE.into();
        }
        Ok(())
    }

    pub fn render_healthmonitor(&self, id: &str, full: bool) -> Value {
        let Some(h) = self.healthmonitors.get(id) else {
            return Value::Null;
        };
        let mut out = Map::new();
        h.common.render_into(&mut out);
        let extra = json!({
            "type": h.kind,
            "delay": h.delay,
            "timeout": h.timeout,
            "max_retries": h.max_retries,
            "max_retries_down": h.max_retries_down,
            "http_method": h.http_method,
            "url_path": h.url_path,
            "expected_codes": h.expected_codes,
            "http_version": null,
            "domain_name": null,
        });
        if let Value::Object(e) = extra {
            out.extend(e);
        }
        if !full {
            out.insert("pools".into(), json!([{ "id": h.pool_id }]));
        }
        Value::Object(out)
    }
}
