//! Octavia v2 resources as the API renders them, and the request bodies kuryr-rs sends. Replies are read leniently
//! (unknown fields ignored, absent ones defaulted) so that newer Octavia releases keep working; requests leave out
//! every unset field so that Octavia applies its own defaults.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `null` read as the type's default: Octavia renders an unset name or description as `""`, but other
/// implementations (and older releases, for some fields) render `null`, which must not fail a whole listing.
fn nullable<'de, D: serde::Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `{"id": ...}` references (a load balancer's listeners and pools, a pool's members).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct IdRef {
    pub id: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct LoadBalancer {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub description: String,
    #[serde(deserialize_with = "nullable")]
    pub provisioning_status: String,
    #[serde(deserialize_with = "nullable")]
    pub operating_status: String,
    #[serde(deserialize_with = "nullable")]
    pub admin_state_up: bool,
    #[serde(deserialize_with = "nullable")]
    pub project_id: String,
    pub vip_address: Option<String>,
    pub vip_port_id: Option<String>,
    pub vip_subnet_id: Option<String>,
    pub vip_network_id: Option<String>,
    pub provider: Option<String>,
    pub flavor_id: Option<String>,
    pub availability_zone: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub listeners: Vec<IdRef>,
    #[serde(deserialize_with = "nullable")]
    pub pools: Vec<IdRef>,
    #[serde(deserialize_with = "nullable")]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Listener {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub provisioning_status: String,
    #[serde(deserialize_with = "nullable")]
    pub operating_status: String,
    #[serde(deserialize_with = "nullable")]
    pub admin_state_up: bool,
    #[serde(deserialize_with = "nullable")]
    pub project_id: String,
    #[serde(deserialize_with = "nullable")]
    pub protocol: String,
    #[serde(deserialize_with = "nullable")]
    pub protocol_port: u16,
    pub connection_limit: Option<i64>,
    pub default_pool_id: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub loadbalancers: Vec<IdRef>,
    pub allowed_cidrs: Option<Vec<String>>,
    pub timeout_client_data: Option<u64>,
    pub timeout_member_data: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Pool {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub provisioning_status: String,
    #[serde(deserialize_with = "nullable")]
    pub operating_status: String,
    #[serde(deserialize_with = "nullable")]
    pub admin_state_up: bool,
    #[serde(deserialize_with = "nullable")]
    pub project_id: String,
    #[serde(deserialize_with = "nullable")]
    pub protocol: String,
    #[serde(deserialize_with = "nullable")]
    pub lb_algorithm: String,
    pub session_persistence: Option<Value>,
    #[serde(deserialize_with = "nullable")]
    pub loadbalancers: Vec<IdRef>,
    #[serde(deserialize_with = "nullable")]
    pub listeners: Vec<IdRef>,
    #[serde(deserialize_with = "nullable")]
    pub members: Vec<IdRef>,
    pub healthmonitor_id: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Member {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub provisioning_status: String,
    #[serde(deserialize_with = "nullable")]
    pub operating_status: String,
    #[serde(deserialize_with = "nullable")]
    pub admin_state_up: bool,
    #[serde(deserialize_with = "nullable")]
    pub project_id: String,
    #[serde(deserialize_with = "nullable")]
    pub address: String,
    #[serde(deserialize_with = "nullable")]
    pub protocol_port: u16,
    pub weight: Option<u32>,
    #[serde(deserialize_with = "nullable")]
    pub backup: bool,
    pub subnet_id: Option<String>,
    pub monitor_address: Option<String>,
    pub monitor_port: Option<u16>,
    #[serde(deserialize_with = "nullable")]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct HealthMonitor {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub provisioning_status: String,
    #[serde(deserialize_with = "nullable")]
    pub operating_status: String,
    #[serde(deserialize_with = "nullable")]
    pub admin_state_up: bool,
    #[serde(deserialize_with = "nullable")]
    pub project_id: String,
    #[serde(rename = "type")]
    #[serde(deserialize_with = "nullable")]
    pub monitor_type: String,
    #[serde(deserialize_with = "nullable")]
    pub delay: u32,
    #[serde(deserialize_with = "nullable")]
    pub timeout: u32,
    #[serde(deserialize_with = "nullable")]
    pub max_retries: u32,
    pub max_retries_down: Option<u32>,
    pub http_method: Option<String>,
    pub url_path: Option<String>,
    pub expected_codes: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub pools: Vec<IdRef>,
    #[serde(deserialize_with = "nullable")]
    pub tags: Vec<String>,
}

/// A provider driver (`GET /v2/lbaas/providers`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Provider {
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub description: String,
}

/// An amphora record (`GET /v2/octavia/amphorae`); with the noop drivers these exist without any VM.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Amphora {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    pub loadbalancer_id: Option<String>,
    pub compute_id: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub status: String,
    pub role: Option<String>,
    pub lb_network_ip: Option<String>,
    pub vrrp_ip: Option<String>,
    pub ha_ip: Option<String>,
}

/// A project's quota. `None` = Octavia's default; -1 = unlimited. Octavia renders both the current names and the
/// deprecated `loadbalancer`/`healthmonitor` ones; the current ones are read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct Quota {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listener: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_monitor: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l7policy: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l7rule: Option<i64>,
}

// ------------------------------------------------------------------ status tree

/// `GET /v2/lbaas/loadbalancers/{id}/status`: the provisioning and operating status of everything under a load
/// balancer in one call.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StatusTree {
    pub loadbalancer: LoadBalancerStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct LoadBalancerStatus {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub provisioning_status: String,
    #[serde(deserialize_with = "nullable")]
    pub operating_status: String,
    #[serde(deserialize_with = "nullable")]
    pub listeners: Vec<ListenerStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ListenerStatus {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub provisioning_status: String,
    #[serde(deserialize_with = "nullable")]
    pub operating_status: String,
    #[serde(deserialize_with = "nullable")]
    pub pools: Vec<PoolStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PoolStatus {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub provisioning_status: String,
    #[serde(deserialize_with = "nullable")]
    pub operating_status: String,
    pub health_monitor: Option<HealthMonitorStatus>,
    #[serde(deserialize_with = "nullable")]
    pub members: Vec<MemberStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct HealthMonitorStatus {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(rename = "type")]
    #[serde(deserialize_with = "nullable")]
    pub monitor_type: String,
    #[serde(deserialize_with = "nullable")]
    pub provisioning_status: String,
    #[serde(deserialize_with = "nullable")]
    pub operating_status: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MemberStatus {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub address: String,
    #[serde(deserialize_with = "nullable")]
    pub protocol_port: u16,
    #[serde(deserialize_with = "nullable")]
    pub provisioning_status: String,
    #[serde(deserialize_with = "nullable")]
    pub operating_status: String,
}

impl StatusTree {
    /// Every `provisioning_status` in the tree with what it belongs to, e.g. `("member 10.0.0.5:80", "ACTIVE")`.
    pub fn provisioning_statuses(&self) -> Vec<(String, String)> {
        let lb = &self.loadbalancer;
        let mut out = vec![(format!("loadbalancer {}", lb.id), lb.provisioning_status.clone())];
        for l in &lb.listeners {
            out.push((format!("listener {}", l.id), l.provisioning_status.clone()));
            for p in &l.pools {
                out.push((format!("pool {}", p.id), p.provisioning_status.clone()));
                if let Some(hm) = &p.health_monitor {
                    out.push((format!("healthmonitor {}", hm.id), hm.provisioning_status.clone()));
                }
                for m in &p.members {
                    out.push((
                        format!("member {}:{}", m.address, m.protocol_port),
                        m.provisioning_status.clone(),
                    ));
                }
            }
        }
        out
    }
}

// ------------------------------------------------------------------ requests

fn is_false(b: &bool) -> bool {
    !*b
}

/// `POST /v2/lbaas/loadbalancers`. With `listeners`/`pools` filled it is Octavia's fully populated create: the whole
/// tree in one call, one provisioning cycle.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadBalancerCreate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vip_subnet_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vip_network_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vip_port_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vip_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vip_sg_ids: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flavor_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_state_up: Option<bool>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Fully populated create: listeners, each with an optional `default_pool`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<ListenerCreate>,
    /// Fully populated create: pools not reached through a listener's `default_pool`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolCreate>,
}

/// `POST /v2/lbaas/listeners` (with `loadbalancer_id`), or one listener of a fully populated create (without).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ListenerCreate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loadbalancer_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub protocol: String,
    pub protocol_port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_limit: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_pool_id: Option<String>,
    /// Fully populated create only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_pool: Option<Box<PoolCreate>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_state_up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_cidrs: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_client_data: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_member_data: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl ListenerCreate {
    pub fn new(protocol: impl Into<String>, protocol_port: u16) -> Self {
        Self {
            protocol: protocol.into(),
            protocol_port,
            ..Self::default()
        }
    }
}

/// `POST /v2/lbaas/pools` (with `loadbalancer_id` or `listener_id`), or a pool of a fully populated create (which
/// Octavia refuses with 400 unless every pool has a `name`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolCreate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loadbalancer_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listener_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub protocol: String,
    pub lb_algorithm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_persistence: Option<Value>,
    /// Fully populated create only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberCreate>,
    /// Fully populated create only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthmonitor: Option<HealthMonitorCreate>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl PoolCreate {
    pub fn new(protocol: impl Into<String>, lb_algorithm: impl Into<String>) -> Self {
        Self {
            protocol: protocol.into(),
            lb_algorithm: lb_algorithm.into(),
            ..Self::default()
        }
    }
}

/// A member: `POST /v2/lbaas/pools/{id}/members`, one entry of the batch update, or of a fully populated create.
/// Octavia matches batch entries to existing members by `address` + `protocol_port`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MemberCreate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub address: String,
    pub protocol_port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(skip_serializing_if = "is_false")]
    pub backup: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl MemberCreate {
    pub fn new(address: impl Into<String>, protocol_port: u16) -> Self {
        Self {
            address: address.into(),
            protocol_port,
            ..Self::default()
        }
    }
}

/// `POST /v2/lbaas/healthmonitors` (with `pool_id`), or a pool's monitor in a fully populated create.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HealthMonitorCreate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(rename = "type")]
    pub monitor_type: String,
    pub delay: u32,
    pub timeout: u32,
    pub max_retries: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_retries_down: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_codes: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// `PUT` bodies of load balancers, listeners, pools, members and health monitors: only what is set changes.
/// `tags` replaces the whole list.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ResourceUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_state_up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// Resource-specific attributes (e.g. a member's `weight`, a listener's `connection_limit`), merged into the body.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}
