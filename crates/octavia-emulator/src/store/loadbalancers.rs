//! Load balancers: VIP allocation, the fully populated (graph) create, cascade delete and the status tree.

use std::time::Instant;

use serde_json::{Map, Value, json};

use super::listeners::{ListenerSpec, check_pool_protocol};
use super::pools::PoolSpec;
use super::providers::Provider;
use super::{
    ACTIVE, Common, ERROR, PENDING_DELETE, PENDING_UPDATE, Store, Work, id_list, quotas::Kind, timestamp,
};
use crate::error::ApiError;
use crate::input::Fields;

#[derive(Debug, Clone, PartialEq)]
pub struct LoadBalancer {
    pub common: Common,
    pub description: Option<String>,
    pub vip_address: String,
    pub vip_subnet_id: String,
    pub vip_network_id: String,
    pub vip_port_id: String,
    pub vip_qos_policy_id: Option<String>,
    pub provider: Provider,
    pub flavor_id: Option<String>,
    pub availability_zone: Option<String>,
    /// When the simulated worker finishes the pending job.
    pub settle_at: Option<Instant>,
    /// The `amphora` provider's one amphora (SINGLE topology); `None` for other providers.
    pub amphora_id: Option<String>,
}

const CREATE_FIELDS: [&str; 17] = [
    "name",
    "description",
    "admin_state_up",
    "vip_address",
    "vip_port_id",
    "vip_subnet_id",
    "vip_network_id",
    "vip_qos_policy_id",
    "vip_sg_ids",
    "additional_vips",
    "project_id",
    "listeners",
    "pools",
    "provider",
    "tags",
    "flavor_id",
    "availability_zone",
];
const UPDATE_FIELDS: [&str; 6] = [
    "name",
    "description",
    "vip_qos_policy_id",
    "admin_state_up",
    "vip_sg_ids",
    "tags",
];

/// Without Neutron the network of a subnet is unknown; a stable derived id keeps replies consistent.
fn derived_id(kind: &str, from: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, format!("{kind}:{from}").as_bytes()).to_string()
}

impl Store {
    /// `POST /v2/lbaas/loadbalancers`, including the single-call fully populated create. `context_project` is
    /// the request context's project (under noauth: the `X-Project-Id` header); a body `project_id` wins.
    pub fn create_loadbalancer(
        &mut self,
        context_project: Option<&str>,
        body: &Value,
        now: Instant,
    ) -> Result<Value, ApiError> {
        let f = Fields::root(body, "loadbalancer", &CREATE_FIELDS)?;
        let name = f.string("name", 255)?;
        let description = f.string("description", 255)?;
        let admin = f.boolean("admin_state_up")?.unwrap_or(true);
        let vip_address = f.ip("vip_address")?;
        let vip_port_id = f.uuid("vip_port_id")?;
        let vip_subnet_id = f.uuid("vip_subnet_id")?;
        let vip_network_id = f.uuid("vip_network_id")?;
        let qos = f.uuid("vip_qos_policy_id")?;
        let project = f
            .string("project_id", 36)?
            .or_else(|| context_project.map(String::from))
            .ok_or_else(|| {
                ApiError::validation(
                    "Missing project ID in request where one is required. An administrator should check the \
                     keystone settings in the Octavia configuration.",
                )
            })?;
        let provider = Provider::parse(f.string("provider", 64)?.as_deref())?;
        let tags = f.string_list("tags", 255)?.unwrap_or_default();
        let flavor_id = f.uuid("flavor_id")?;
        let az = f.string("availability_zone", 255)?;
        if vip_port_id.is_none() && vip_subnet_id.is_none() && vip_network_id.is_none() {
            return Err(ApiError::new(
                400,
                "Validation failure: VIP must contain one of: vip_port_id, vip_network_id, vip_subnet_id.",
            ));
        }
        let subnet = vip_subnet_id.clone().unwrap_or_else(|| {
            derived_id(
                "subnet",
                vip_network_id
                    .as_deref()
                    .or(vip_port_id.as_deref())
                    .unwrap_or_default(),
            )
        });
        let network = vip_network_id
            .clone()
            .unwrap_or_else(|| derived_id("network", &subnet));
        if let Some(ip) = vip_address
            && self
                .loadbalancers
                .values()
                .any(|lb| lb.vip_subnet_id == subnet && lb.vip_address == ip.to_string())
        {
            return Err(ApiError::new(
                409,
                format!(
                    "The VIP IP address is already in use: IP address {ip} already allocated in subnet {subnet}"
                ),
            ));
        }
        // Graph parts are validated completely before anything is stored.
        let mut listener_specs = f
            .list("listeners")?
            .iter()
            .map(|l| ListenerSpec::parse(&Fields::object(l, "listeners", &listener_graph_fields())?))
            .collect::<Result<Vec<_>, _>>()?;
        let mut pool_specs = f
            .list("pools")?
            .iter()
            .map(|p| PoolSpec::parse(&Fields::object(p, "pools", &pool_graph_fields())?, true))
            .collect::<Result<Vec<_>, _>>()?;
        let mut default_pool_names: Vec<Option<String>> = Vec::new();
        for l in &mut listener_specs {
            let Some(dp) = l.default_pool.take() else {
                default_pool_names.push(None);
                continue;
            };
            let pf = Fields::object(&dp, "default_pool", &pool_graph_fields())?;
            let name = pf.string("name", 255)?.ok_or_else(|| {
                ApiError::validation("Pools must be named when creating a fully populated loadbalancer.")
            })?;
            // More than a name is a full pool definition; a bare name refers to one under `pools`.
            if pf.map.len() > 1 {
                pool_specs.push(PoolSpec::parse(&pf, true)?);
            }
            default_pool_names.push(Some(name));
        }
        let names: Vec<Option<String>> = pool_specs.iter().map(|p| p.name.clone()).collect();
        let unique: std::collections::BTreeSet<&Option<String>> = names.iter().collect();
        if unique.len() != names.len() {
            return Err(ApiError::validation(
                "Pool names must be unique when creating a fully populated loadbalancer.",
            ));
        }
        for n in default_pool_names.iter().flatten() {
            if !names.iter().any(|p| p.as_deref() == Some(n)) {
                return Err(ApiError::validation(format!(
                    "Pool '{n}' was referenced but no full definition was found."
                )));
            }
        }
        for p in &pool_specs {
            for attr in ["protocol", "lb_algorithm"] {
                let missing = if attr == "protocol" {
                    p.protocol.is_none()
                } else {
                    p.lb_algorithm.is_none()
                };
                if missing {
                    return Err(ApiError::validation(format!(
                        "Pool definition for '{}' missing required attribute: {attr}",
                        p.name.clone().unwrap_or_default()
                    )));
                }
            }
            p.check_provider(provider)?;
        }
        // CIDR checks need the VIP's IP version; an allocated VIP comes from the IPv4 pool.
        let vip_for_checks = vip_address
            .map(|ip| ip.to_string())
            .unwrap_or_else(|| "0.0.0.0".into());
        for (i, l) in listener_specs.iter().enumerate() {
            let earlier: Vec<&ListenerSpec> = listener_specs[..i].iter().collect();
            self.check_listener_spec("", &vip_for_checks, provider, l, &earlier)?;
            if let Some(Some(n)) = default_pool_names.get(i)
                && let Some(p) = pool_specs.iter().find(|p| p.name.as_deref() == Some(n))
            {
                check_pool_protocol(&l.protocol, p.protocol.as_deref().unwrap_or_default())?;
            }
        }
        self.check_quota(&project, Kind::LoadBalancer, 1)?;
        if !pool_specs.is_empty() {
            self.check_quota(&project, Kind::Pool, pool_specs.len())?;
        }
        if !listener_specs.is_empty() {
            self.check_quota(&project, Kind::Listener, listener_specs.len())?;
        }
        let members: usize = pool_specs.iter().map(|p| p.members.len()).sum();
        if members > 0 {
            self.check_quota(&project, Kind::Member, members)?;
        }
        let hms = pool_specs.iter().filter(|p| p.healthmonitor.is_some()).count();
        if hms > 0 {
            self.check_quota(&project, Kind::HealthMonitor, hms)?;
        }
        let vip = match vip_address {
            Some(ip) => ip.to_string(),
            None => self.allocate_vip()?.to_string(),
        };
        let common = self.common(&project, name, admin, tags);
        let lb_id = common.id.clone();
        let vip_port_id = match (vip_port_id, &self.config.vip_ports) {
            (Some(p), _) => p,
            (None, Some(ports)) => ports
                .create(&lb_id, &project, &subnet, &vip)
                .map_err(|why| ApiError::new(409, format!("Unable to create the VIP port: {why}")))?,
            (None, None) => uuid::Uuid::new_v4().to_string(),
        };
        let delay = self.config.worker.delay(Work::LbCreate);
        self.loadbalancers.insert(
            lb_id.clone(),
            LoadBalancer {
                common,
                description,
                vip_address: vip,
                vip_port_id,
                vip_subnet_id: subnet,
                vip_network_id: network,
                vip_qos_policy_id: qos,
                provider,
                flavor_id,
                availability_zone: az,
                settle_at: Some(now + delay),
                amphora_id: (provider == Provider::Amphora).then(|| uuid::Uuid::new_v4().to_string()),
            },
        );
        let mut pool_ids = Vec::new();
        for p in pool_specs {
            let name = p.name.clone();
            pool_ids.push((name, self.insert_pool(&lb_id, &project, p)));
        }
        for (l, dp) in listener_specs.into_iter().zip(default_pool_names) {
            let lid = self.insert_listener(&lb_id, &project, l);
            if let Some(n) = dp
                && let Some((_, pid)) = pool_ids.iter().find(|(pn, _)| pn.as_deref() == Some(n.as_str()))
                && let Some(listener) = self.listeners.get_mut(&lid)
            {
                listener.default_pool_id = Some(pid.clone());
            }
        }
        Ok(json!({ "loadbalancer": self.render_loadbalancer(&lb_id, true) }))
    }

    pub fn update_loadbalancer(&mut self, id: &str, body: &Value, now: Instant) -> Result<Value, ApiError> {
        let f = Fields::root(body, "loadbalancer", &UPDATE_FIELDS)?;
        let name = f.string("name", 255)?;
        let description = f.string("description", 255)?;
        let qos = f.uuid("vip_qos_policy_id")?;
        let admin = f.boolean("admin_state_up")?;
        let tags = f.string_list("tags", 255)?;
        let delay = self.config.worker.delay(Work::LbUpdate);
        let lb = self
            .loadbalancers
            .get_mut(id)
            .ok_or_else(|| ApiError::not_found("Load Balancer", id))?;
        if lb.common.provisioning_status != ACTIVE {
            return Err(ApiError::lb_pending(&lb.common.provisioning_status, id));
        }
        lb.common.provisioning_status = PENDING_UPDATE.into();
        lb.settle_at = Some(now + delay);
        if f.has("name") {
            lb.common.name = name;
        }
        if f.has("description") {
            lb.description = description;
        }
        if f.has("vip_qos_policy_id") {
            lb.vip_qos_policy_id = qos;
        }
        if let Some(a) = admin {
            lb.common.admin_state_up = a;
        }
        if let Some(t) = tags {
            lb.common.tags = t;
        }
        lb.common.updated_at = Some(timestamp());
        Ok(json!({ "loadbalancer": self.render_loadbalancer(id, false) }))
    }

    /// `DELETE /loadbalancers/{id}[?cascade=true]`: ACTIVE or ERROR load balancers can be deleted.
    pub fn delete_loadbalancer(&mut self, id: &str, cascade: bool, now: Instant) -> Result<(), ApiError> {
        let lb = self
            .loadbalancers
            .get(id)
            .ok_or_else(|| ApiError::not_found("Load Balancer", id))?;
        let has_children =
            self.listeners.values().any(|l| l.lb_id == id) || self.pools.values().any(|p| p.lb_id == id);
        if has_children && !cascade {
            return Err(ApiError::validation(format!(
                "Cannot delete Load Balancer {id} - it has children"
            )));
        }
        let status = lb.common.provisioning_status.clone();
        if status != ACTIVE && status != ERROR {
            return Err(ApiError::lb_pending(&status, id));
        }
        let delay = self.config.worker.delay(Work::LbDelete);
        if let Some(lb) = self.loadbalancers.get_mut(id) {
            lb.common.provisioning_status = PENDING_DELETE.into();
            lb.settle_at = Some(now + delay);
        }
        let pools = self.pool_ids_of(id);
        let mark = |c: &mut Common| c.provisioning_status = PENDING_DELETE.into();
        for l in self.listeners.values_mut().filter(|l| l.lb_id == id) {
            mark(&mut l.common);
        }
        for p in self.pools.values_mut().filter(|p| p.lb_id == id) {
            mark(&mut p.common);
        }
        for m in self.members.values_mut().filter(|m| pools.contains(&m.pool_id)) {
            mark(&mut m.common);
        }
        for h in self
            .healthmonitors
            .values_mut()
            .filter(|h| pools.contains(&h.pool_id))
        {
            mark(&mut h.common);
        }
        Ok(())
    }

    /// `PUT /loadbalancers/{id}/failover`: ACTIVE or ERROR load balancers go PENDING_UPDATE for an update's time.
    pub fn failover_loadbalancer(&mut self, id: &str, now: Instant) -> Result<(), ApiError> {
        let delay = self.config.worker.delay(Work::LbUpdate);
        let lb = self
            .loadbalancers
            .get_mut(id)
            .ok_or_else(|| ApiError::not_found("Load Balancer", id))?;
        let status = lb.common.provisioning_status.clone();
        if status != ACTIVE && status != ERROR {
            return Err(ApiError::lb_pending(&status, id));
        }
        if lb.provider == Provider::Ovn {
            return Err(ApiError::provider_unsupported(
                "ovn",
                "OVN provider does not support loadbalancer failover",
            ));
        }
        lb.common.provisioning_status = PENDING_UPDATE.into();
        lb.settle_at = Some(now + delay);
        Ok(())
    }

    /// `LoadBalancerResponse`, or `LoadBalancerFullResponse` (the create's answer: listeners and pools inline).
    pub fn render_loadbalancer(&self, id: &str, full: bool) -> Value {
        let Some(lb) = self.loadbalancers.get(id) else {
            return Value::Null;
        };
        let mut out = Map::new();
        lb.common.render_into(&mut out);
        let listeners = self.listener_ids_of(id);
        let pools = self.pool_ids_of(id);
        let (listeners, pools) = if full {
            (
                Value::Array(listeners.iter().map(|l| self.render_listener(l, true)).collect()),
                Value::Array(pools.iter().map(|p| self.render_pool(p, true)).collect()),
            )
        } else {
            (id_list(&listeners), id_list(&pools))
        };
        let extra = json!({
            "description": lb.description,
            "vip_address": lb.vip_address,
            "vip_port_id": lb.vip_port_id,
            "vip_subnet_id": lb.vip_subnet_id,
            "vip_network_id": lb.vip_network_id,
            "vip_qos_policy_id": lb.vip_qos_policy_id,
            "vip_sg_ids": [],
            "vip_vnic_type": "normal",
            "additional_vips": [],
            "listeners": listeners,
            "pools": pools,
            "provider": lb.provider.name(),
            "flavor_id": lb.flavor_id,
            "availability_zone": lb.availability_zone,
        });
        if let Value::Object(e) = extra {
            out.extend(e);
        }
        Value::Object(out)
    }

    /// `GET /loadbalancers/{id}/status`: the tree of provisioning and operating statuses.
    pub fn loadbalancer_status(&self, id: &str) -> Result<Value, ApiError> {
        let lb = self
            .loadbalancers
            .get(id)
            .ok_or_else(|| ApiError::not_found("Load Balancer", id))?;
        let listeners: Vec<Value> = self
            .listener_ids_of(id)
            .iter()
            .map(|l| self.listener_status(l))
            .collect();
        Ok(json!({"statuses": {"loadbalancer": {
            "id": lb.common.id,
            "name": lb.common.name.clone().unwrap_or_default(),
            "operating_status": lb.common.operating_status,
            "provisioning_status": lb.common.provisioning_status,
            "listeners": listeners,
        }}}))
    }

    /// `GET /loadbalancers/{id}/stats`: no traffic flows through an emulated amphora.
    pub fn loadbalancer_stats(&self, id: &str) -> Result<Value, ApiError> {
        self.loadbalancers
            .get(id)
            .ok_or_else(|| ApiError::not_found("Load Balancer", id))?;
        Ok(
            json!({"stats": {"bytes_in": 0, "bytes_out": 0, "active_connections": 0, "total_connections": 0, "request_errors": 0}}),
        )
    }
}

fn listener_graph_fields() -> Vec<&'static str> {
    vec![
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
        "default_pool",
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
        "tls_ciphers",
        "tls_versions",
        "alpn_protocols",
        "hsts_max_age",
        "hsts_include_subdomains",
        "hsts_preload",
        "l7policies",
    ]
}

fn pool_graph_fields() -> Vec<&'static str> {
    vec![
        "name",
        "description",
        "admin_state_up",
        "protocol",
        "lb_algorithm",
        "session_persistence",
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
    ]
}
