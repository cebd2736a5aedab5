//! Listeners: protocol + port on a load balancer, optionally with a default pool.

use std::time::Instant;

use serde_json::{Map, Value, json};

use super::providers::Provider;
use super::{Common, PENDING_DELETE, Store, Work, id_list, quotas::Kind, timestamp};
use crate::error::ApiError;
use crate::input::Fields;

pub const PROTOCOLS: [&str; 9] = [
    "HTTP",
    "HTTPS",
    "PROXY",
    "PROXYV2",
    "PROMETHEUS",
    "SCTP",
    "TCP",
    "TERMINATED_HTTPS",
    "UDP",
];
const MAX_TIMEOUT: i64 = 24 * 60 * 60 * 1000;

#[derive(Debug, Clone, PartialEq)]
pub struct Listener {
    pub common: Common,
    pub description: Option<String>,
    pub lb_id: String,
    pub protocol: String,
    pub protocol_port: i64,
    pub connection_limit: i64,
    pub default_pool_id: Option<String>,
    pub timeout_client_data: i64,
    pub timeout_member_connect: i64,
    pub timeout_member_data: i64,
    pub timeout_tcp_inspect: i64,
    pub allowed_cidrs: Vec<String>,
    pub insert_headers: Map<String, Value>,
    /// Key manager references are stored as given: there is no Barbican to ask.
    pub default_tls_container_ref: Option<String>,
    pub sni_container_refs: Vec<String>,
}

/// A validated listener create request (plain or nested in a fully populated load balancer).
pub struct ListenerSpec {
    pub name: Option<String>,
    pub description: Option<String>,
    pub admin_state_up: bool,
    pub protocol: String,
    pub protocol_port: i64,
    pub connection_limit: i64,
    pub default_pool_id: Option<String>,
    /// Graph create: the default pool as a nested object (full spec or a name reference).
    pub default_pool: Option<Value>,
    pub timeouts: [i64; 4],
    pub allowed_cidrs: Vec<String>,
    pub insert_headers: Map<String, Value>,
    pub default_tls_container_ref: Option<String>,
    pub sni_container_refs: Vec<String>,
    pub tags: Vec<String>,
}

const COMMON_FIELDS: [&str; 20] = [
    "name",
    "description",
    "admin_state_up",
    "protocol",
    "protocol_port",
    "connection_limit",
    "default_tls_container_ref",
    "sni_container_refs",
    "project_id",
    "default_pool_id",
    "insert_headers",
    "timeout_client_data",
    "timeout_member_connect",
    "timeout_member_data",
    "timeout_tcp_inspect",
    "tags",
    "client_ca_tls_container_ref",
    "client_authentication",
    "client_crl_container_ref",
    "allowed_cidrs",
];
const TLS_FIELDS: [&str; 5] = [
    "tls_ciphers",
    "tls_versions",
    "alpn_protocols",
    "hsts_max_age",
    "hsts_include_subdomains",
];

fn allowed(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v: Vec<&str> = COMMON_FIELDS.to_vec();
    v.extend(TLS_FIELDS);
    v.extend(["hsts_preload", "l7policies"]);
    v.extend(extra);
    v
}

impl ListenerSpec {
    pub fn parse(f: &Fields<'_>) -> Result<Self, ApiError> {
        let timeout =
            |k: &str, default: i64| Ok::<i64, ApiError>(f.int(k, 0, MAX_TIMEOUT)?.unwrap_or(default));
        let allowed_cidrs = f.string_list("allowed_cidrs", 64)?.unwrap_or_default();
        check_cidrs(&allowed_cidrs)?;
        let insert_headers = match f.present("insert_headers") {
            None => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                return Err(ApiError::invalid_input(
                    "insert_headers",
                    other,
                    "Invalid data type",
                ));
            }
        };
        Ok(Self {
            name: f.string("name", 255)?,
            description: f.string("description", 255)?,
            admin_state_up: f.boolean("admin_state_up")?.unwrap_or(true),
            protocol: f.required_one_of("protocol", &PROTOCOLS)?,
            protocol_port: f.required_int("protocol_port", 1, 65535)?,
            connection_limit: f.int("connection_limit", -1, i64::MAX)?.unwrap_or(-1),
            default_pool_id: f.uuid("default_pool_id")?,
            default_pool: f.present("default_pool").cloned(),
            timeouts: [
                timeout("timeout_client_data", 50000)?,
                timeout("timeout_member_connect", 5000)?,
                timeout("timeout_member_data", 50000)?,
                timeout("timeout_tcp_inspect", 0)?,
            ],
            allowed_cidrs,
            insert_headers,
            default_tls_container_ref: f.string("default_tls_container_ref", 255)?,
            sni_container_refs: f.string_list("sni_container_refs", 255)?.unwrap_or_default(),
            tags: f.string_list("tags", 255)?.unwrap_or_default(),
        })
    }
}

/// WSME validates the list as a whole and quotes it as Python prints a list.
fn check_cidrs(cidrs: &[String]) -> Result<(), ApiError> {
    if cidrs.iter().all(|c| valid_cidr(c)) {
        return Ok(());
    }
    let quoted: Vec<String> = cidrs.iter().map(|c| format!("'{c}'")).collect();
    Err(ApiError::invalid_input(
        "allowed_cidrs",
        format!("[{}]", quoted.join(", ")),
        "Value should be IPv4 or IPv6 CIDR format",
    ))
}

fn valid_cidr(c: &str) -> bool {
    let Some((ip, len)) = c.split_once('/') else {
        return false;
    };
    match (ip.parse::<std::net::IpAddr>(), len.parse::<u8>()) {
        (Ok(std::net::IpAddr::V4(_)), Ok(l)) => l <= 32,
        (Ok(std::net::IpAddr::V6(_)), Ok(l)) => l <= 128,
        _ => false,
    }
}

/// Protocols that share the TCP port space of a load balancer's VIP.
fn transport(protocol: &str) -> &str {
    match protocol {
        "UDP" => "UDP",
        "SCTP" => "SCTP",
        _ => "TCP",
    }
}

/// `VALID_LISTENER_POOL_PROTOCOL_MAP`.
pub fn check_pool_protocol(listener_protocol: &str, pool_protocol: &str) -> Result<(), ApiError> {
    let valid: &[&str] = match listener_protocol {
        "TCP" => &["HTTP", "HTTPS", "PROXY", "PROXYV2", "TCP"],
        "HTTP" | "TERMINATED_HTTPS" => &["HTTP", "PROXY", "PROXYV2"],
        "HTTPS" => &["HTTPS", "PROXY", "PROXYV2", "TCP"],
        "UDP" => &["UDP"],
        "SCTP" => &["SCTP"],
        _ => &[],
    };
    if valid.contains(&pool_protocol) {
        return Ok(());
    }
    Err(ApiError::validation(format!(
        "The pool protocol '{pool_protocol}' is invalid while the listener protocol is '{listener_protocol}'."
    )))
}

impl Store {
    /// `_validate_create_listener`'s checks in its order, then the provider's.
    pub(crate) fn check_listener_spec(
        &self,
        lb_id: &str,
        vip: &str,
        provider: Provider,
        spec: &ListenerSpec,
        siblings: &[&ListenerSpec],
    ) -> Result<(), ApiError> {
        let p = spec.protocol.as_str();
        if !spec.insert_headers.is_empty() && p != "HTTP" && p != "TERMINATED_HTTPS" {
            return Err(ApiError::new(
                400,
                format!("insert-headers is not a valid option for a {p} protocol listener."),
            ));
        }
        let has_refs = spec.default_tls_container_ref.is_some() || !spec.sni_container_refs.is_empty();
        if (p == "UDP" || p == "SCTP") && (has_refs || !spec.insert_headers.is_empty()) {
            return Err(ApiError::validation(format!(
                "{p} protocol listener does not support TLS."
            )));
        }
        if p != "TERMINATED_HTTPS" && has_refs {
            return Err(ApiError::validation(format!(
                "Certificate container references are not allowed on {p} protocol listeners."
            )));
        }
        if p == "TERMINATED_HTTPS" && !has_refs {
            return Err(ApiError::validation(
                "An SNI or default certificate container reference must be provided for TERMINATED_HTTPS protocol \
                 listeners.",
            ));
        }
        // The message names the protocol of the listener already there.
        let clash = self
            .listeners
            .values()
            .filter(|l| l.lb_id == lb_id)
            .map(|l| (l.protocol.as_str(), l.protocol_port))
            .chain(siblings.iter().map(|s| (s.protocol.as_str(), s.protocol_port)))
            .find(|(p, port)| *port == spec.protocol_port && transport(p) == transport(&spec.protocol));
        if let Some((protocol, port)) = clash {
            return Err(ApiError::new(
                409,
                format!(
                    "Another Listener on this Load Balancer is already using protocol {protocol} and protocol_port {port}"
                ),
            ));
        }
        let vip_v6 = vip.contains(':');
        if let Some(c) = spec.allowed_cidrs.iter().find(|c| c.contains(':') != vip_v6) {
            return Err(ApiError::validation(format!(
                "CIDR {c} IP version incompatible with all VIPs ['{vip}'] IP version."
            )));
        }
        provider.check_listener(&spec.protocol, Some(&spec.allowed_cidrs))
    }

    pub(crate) fn insert_listener(&mut self, lb_id: &str, project_id: &str, spec: ListenerSpec) -> String {
        let common = self.common(project_id, spec.name, spec.admin_state_up, spec.tags);
        let id = common.id.clone();
        let [tcd, tmc, tmd, tti] = spec.timeouts;
        self.listeners.insert(
            id.clone(),
            Listener {
                common,
                description: spec.description,
                lb_id: lb_id.to_string(),
                protocol: spec.protocol,
                protocol_port: spec.protocol_port,
                connection_limit: spec.connection_limit,
                default_pool_id: spec.default_pool_id,
                timeout_client_data: tcd,
                timeout_member_connect: tmc,
                timeout_member_data: tmd,
                timeout_tcp_inspect: tti,
                allowed_cidrs: spec.allowed_cidrs,
                insert_headers: spec.insert_headers,
                default_tls_container_ref: spec.default_tls_container_ref,
                sni_container_refs: spec.sni_container_refs,
            },
        );
        id
    }

    /// `POST /v2/lbaas/listeners`.
    pub fn create_listener(&mut self, body: &Value, now: Instant) -> Result<Value, ApiError> {
        let fields = allowed(&["loadbalancer_id", "default_pool"]);
        let f = Fields::root(body, "listener", &fields)?;
        let lb_id = f
            .uuid("loadbalancer_id")?
            .ok_or_else(|| ApiError::invalid_input("loadbalancer_id", "None", "Mandatory field missing."))?;
        let spec = ListenerSpec::parse(&f)?;
        let lb = self
            .loadbalancers
            .get(&lb_id)
            .ok_or_else(|| ApiError::not_found("Load Balancer", &lb_id))?;
        let (project, provider) = (lb.common.project_id.clone(), lb.provider);
        self.check_quota(&project, Kind::Listener, 1)?;
        // A pool may be the default of several listeners, but only of listeners on its own load balancer.
        if let Some(pool_id) = &spec.default_pool_id {
            let pool = self
                .pools
                .get(pool_id)
                .filter(|p| p.lb_id == lb_id)
                .ok_or_else(|| ApiError::not_found("Pool", pool_id))?;
            check_pool_protocol(&spec.protocol, &pool.protocol)?;
        }
        self.check_lb_mutable(&lb_id)?;
        let vip = self
            .loadbalancers
            .get(&lb_id)
            .map(|lb| lb.vip_address.clone())
            .unwrap_or_default();
        self.check_listener_spec(&lb_id, &vip, provider, &spec, &[])?;
        let id = self.insert_listener(&lb_id, &project, spec);
        self.lock_for_child(&lb_id, &[], Work::ChildCreate, now)?;
        Ok(json!({ "listener": self.render_listener(&id, false) }))
    }

    pub fn update_listener(&mut self, id: &str, body: &Value, now: Instant) -> Result<Value, ApiError> {
        let l = self
            .listeners
            .get(id)
            .ok_or_else(|| ApiError::not_found("Listener", id))?;
        let lb_id = l.lb_id.clone();
        let provider = self
            .loadbalancers
            .get(&lb_id)
            .map(|lb| lb.provider)
            .unwrap_or(Provider::Amphora);
        let mut fields: Vec<&str> = COMMON_FIELDS
            .iter()
            .copied()
            .filter(|k| !["protocol", "protocol_port", "project_id"].contains(k))
            .collect();
        fields.extend(TLS_FIELDS);
        fields.push("hsts_preload");
        let f = Fields::root(body, "listener", &fields)?;
        let name = f.string("name", 255)?;
        let description = f.string("description", 255)?;
        let admin = f.boolean("admin_state_up")?;
        let limit = f.int("connection_limit", -1, i64::MAX)?;
        // A null given resets the default (Octavia's `_set_default_on_none`); absent keeps it.
        let timeouts: Vec<Option<i64>> = [
            ("timeout_client_data", 50000),
            ("timeout_member_connect", 5000),
            ("timeout_member_data", 50000),
            ("timeout_tcp_inspect", 0),
        ]
        .iter()
        .map(|(k, default)| {
            Ok(match f.int(k, 0, MAX_TIMEOUT)? {
                Some(v) => Some(v),
                None if f.has(k) => Some(*default),
                None => None,
            })
        })
        .collect::<Result<_, ApiError>>()?;
        let cidrs = f.string_list("allowed_cidrs", 64)?;
        if let Some(c) = &cidrs {
            check_cidrs(c)?;
            let vip = self
                .loadbalancers
                .get(&lb_id)
                .map(|lb| lb.vip_address.clone())
                .unwrap_or_default();
            if let Some(bad) = c.iter().find(|c| c.contains(':') != vip.contains(':')) {
                return Err(ApiError::validation(format!(
                    "CIDR {bad} IP version incompatible with all VIPs ['{vip}'] IP version."
                )));
            }
        }
        let tls_ref = f.string("default_tls_container_ref", 255)?;
        let sni_refs = f.string_list("sni_container_refs", 255)?;
        let tags = f.string_list("tags", 255)?;
        let default_pool_id = f.uuid("default_pool_id")?;
        if let Some(pid) = &default_pool_id {
            let pool = self
                .pools
                .get(pid)
                .ok_or_else(|| ApiError::not_found("Pool", pid))?;
            check_pool_protocol(&l.protocol, &pool.protocol)?;
        }
        provider.check_listener(&l.protocol, cidrs.as_deref())?;
        self.check_lb_mutable(&lb_id)?;
        self.lock_for_child(&lb_id, &[id.to_string()], Work::ChildUpdate, now)?;
        let l = self
            .listeners
            .get_mut(id)
            .ok_or_else(|| ApiError::not_found("Listener", id))?;
        if f.has("name") {
            l.common.name = name;
        }
        if f.has("description") {
            l.description = description;
        }
        if let Some(a) = admin {
            l.common.admin_state_up = a;
        }
        if let Some(n) = limit {
            l.connection_limit = n;
        }
        let slots = [
            &mut l.timeout_client_data,
            &mut l.timeout_member_connect,
            &mut l.timeout_member_data,
            &mut l.timeout_tcp_inspect,
        ];
        for (slot, v) in slots.into_iter().zip(timeouts) {
            if let Some(v) = v {
                *slot = v;
            }
        }
        if f.has("default_tls_container_ref") {
            l.default_tls_container_ref = tls_ref;
        }
        if let Some(refs) = sni_refs {
            l.sni_container_refs = refs;
        }
        if f.has("allowed_cidrs") {
            l.allowed_cidrs = cidrs.unwrap_or_default();
        }
        if let Some(t) = tags {
            l.common.tags = t;
        }
        if f.has("default_pool_id") {
            l.default_pool_id = default_pool_id;
        }
        l.common.updated_at = Some(timestamp());
        Ok(json!({ "listener": self.render_listener(id, false) }))
    }

    pub fn delete_listener(&mut self, id: &str, now: Instant) -> Result<(), ApiError> {
        let l = self
            .listeners
            .get(id)
            .ok_or_else(|| ApiError::not_found("Listener", id))?;
        let lb_id = l.lb_id.clone();
        self.lock_for_child(&lb_id, &[], Work::ChildDelete, now)?;
        if let Some(l) = self.listeners.get_mut(id) {
            l.common.provisioning_status = PENDING_DELETE.into();
        }
        Ok(())
    }

    /// `ListenerResponse`, or `ListenerFullResponse` inside a fully populated create's answer.
    pub fn render_listener(&self, id: &str, full: bool) -> Value {
        let Some(l) = self.listeners.get(id) else {
            return Value::Null;
        };
        let mut out = Map::new();
        l.common.render_into(&mut out);
        let extra = json!({
            "description": l.description,
            "protocol": l.protocol,
            "protocol_port": l.protocol_port,
            "connection_limit": l.connection_limit,
            "default_tls_container_ref": l.default_tls_container_ref,
            "sni_container_refs": l.sni_container_refs,
            "default_pool_id": l.default_pool_id,
            "l7policies": [],
            "insert_headers": l.insert_headers,
            "timeout_client_data": l.timeout_client_data,
            "timeout_member_connect": l.timeout_member_connect,
            "timeout_member_data": l.timeout_member_data,
            "timeout_tcp_inspect": l.timeout_tcp_inspect,
            "client_ca_tls_container_ref": null,
            "client_authentication": "NONE",
            "client_crl_container_ref": null,
            // Octavia renders an empty list of CIDRs as null.
            "allowed_cidrs": if l.allowed_cidrs.is_empty() { Value::Null } else { json!(l.allowed_cidrs) },
            "tls_ciphers": null,
            "tls_versions": null,
            "alpn_protocols": null,
            "hsts_max_age": null,
            "hsts_include_subdomains": false,
            "hsts_preload": false,
        });
        if let Value::Object(m) = extra {
            out.extend(m);
        }
        if !full {
            out.insert("loadbalancers".into(), id_list(std::slice::from_ref(&l.lb_id)));
        }
        Value::Object(out)
    }

    pub(crate) fn listener_status(&self, id: &str) -> Value {
        let Some(l) = self.listeners.get(id) else {
            return Value::Null;
        };
        let pools: Vec<Value> = l.default_pool_id.iter().map(|p| self.pool_status(p)).collect();
        json!({
            "id": l.common.id,
            "name": l.common.name.clone().unwrap_or_default(),
            "operating_status": l.common.operating_status,
            "provisioning_status": l.common.provisioning_status,
            "pools": pools,
        })
    }
}
