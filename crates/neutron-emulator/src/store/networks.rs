//! Networks: provider segments as ML2's type drivers allocate them, and IP availability.

use axum::http::StatusCode;
use rand::Rng;
use serde_json::{Value, json};

use super::{Std, StdUpdate, Store, VLAN_RANGES, create_tags, std_from};
use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};

/// What a network create or update may set.
const NETWORK_WRITABLE: [&str; 7] = [
    "name",
    "description",
    "admin_state_up",
    "mtu",
    "shared",
    "port_security_enabled",
    "router:external",
];

#[derive(Debug, Clone)]
pub struct Network {
    pub std: Std,
    pub admin_state_up: bool,
    pub mtu: u32,
    pub shared: bool,
    pub external: bool,
    pub port_security_enabled: bool,
    /// `provider:network_type`: `vxlan` (tenant networks), `vlan` or `flat`.
    pub network_type: String,
    pub physical_network: Option<String>,
    /// None for flat networks.
    pub segmentation_id: Option<u32>,
    pub subnets: Vec<String>,
}

fn clamp(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

impl Store {
    pub fn create_network(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "network")?;
        input::check_attrs(
            obj,
            &NETWORK_WRITABLE,
            &[
                "project_id",
                "tenant_id",
                "tags",
                "provider:network_type",
                "provider:physical_network",
                "provider:segmentation_id",
                "availability_zone_hints",
            ],
            &[
                "id",
                "created_at",
                "updated_at",
                "revision_number",
                "status",
                "subnets",
            ],
            false,
        )?;
        let mut std = std_from(obj, 1)?;
        std.tags = create_tags(obj)?;
        if !std.tags.is_empty() {
            std.revision += 1;
        }
        let (network_type, physical_network, segmentation_id) = self.provider_segment(obj)?;
        // VXLAN takes 50 bytes of the physical networks' 1500.
        let default_mtu = if network_type == "vxlan" { 1450 } else { 1500 };
        let mtu = input::opt_int(obj, "mtu")?.unwrap_or(default_mtu);
        let mtu = u32::try_from(mtu)
            .map_err(|_| ApiError::invalid_attr("mtu", format!("'{mtu}' is not a valid mtu")))?;
        let net = Network {
            admin_state_up: input::opt_bool(obj, "admin_state_up")?.unwrap_or(true),
            shared: input::opt_bool(obj, "shared")?.unwrap_or(false),
            external: input::opt_bool(obj, "router:external")?.unwrap_or(false),
            port_security_enabled: input::opt_bool(obj, "port_security_enabled")?.unwrap_or(true),
            mtu,
            network_type,
            physical_network,
            segmentation_id,
            subnets: Vec::new(),
            std,
        };
        let project = net.std.project_id.clone();
        self.ensure_default_sg(&project);
        self.check_quota(&project, "network", 1)?;
        let id = net.std.id.clone();
        self.networks.insert(id.clone(), net);
        let mut v = self.render_network(&id);
        if let Value::Object(o) = &mut v {
            // Only the create answer carries it (auto-allocated-topology's view), like the real server.
            o.insert("is_default".into(), json!(false));
        }
        Ok(v)
    }

    /// The network's segment from the `provider:*` attributes, validated like ML2's type drivers (flat on any
    /// physnet, VLAN on [`VLAN_RANGES`], VXLAN); without them a tenant VXLAN network.
    fn provider_segment(&self, obj: &Obj) -> ApiResult<(String, Option<String>, Option<u32>)> {
        let net_type = input::opt_str(obj, "provider:network_type")?;
        let physnet = input::opt_str(obj, "provider:physical_network")?.filter(|p| !p.is_empty());
        let seg = input::opt_int(obj, "provider:segmentation_id")?;
        let Some(net_type) = net_type else {
            if physnet.is_some() || seg.is_some() {
                return Err(ApiError::invalid_input("network_type required"));
            }
            let vni = rand::rng().random_range(1000..16_000_000);
            return Ok(("vxlan".into(), None, Some(vni)));
        };
        match net_type.as_str() {
            "flat" => {
                let Some(p) = physnet else {
                    return Err(ApiError::invalid_input(
                        "physical_network required for flat provider network",
                    ));
                };
                if seg.is_some() {
                    return Err(ApiError::invalid_input(
                        "segmentation_id prohibited for flat provider network",
                    ));
                }
                if self
                    .networks
                    .values()
                    .any(|n| n.network_type == "flat" && n.physical_network.as_deref() == Some(p.as_str()))
                {
                    return Err(ApiError::conflict(
                        "FlatNetworkInUse",
                        format!("Unable to create the flat network. Physical network {p} is in use."),
                    ));
                }
                Ok((net_type, Some(p), None))
            }
            "vlan" => {
                let ranges: Vec<(&str, u32, u32)> = match &physnet {
                    Some(p) => {
                        let r: Vec<_> = VLAN_RANGES.iter().filter(|r| r.0 == p).copied().collect();
                        if r.is_empty() {
                            return Err(ApiError::invalid_input(format!(
                                "physical_network '{p}' unknown for VLAN provider network"
                            )));
                        }
                        r
                    }
                    None if seg.is_some() => {
                        return Err(ApiError::invalid_input(
                            "segmentation_id requires physical_network for VLAN provider network",
                        ));
                    }
                    None => VLAN_RANGES.to_vec(),
                };
                let used = |physnet: &str, vlan: u32| {
                    self.networks.values().any(|n| {
                        n.network_type == "vlan"
                            && n.physical_network.as_deref() == Some(physnet)
                            && n.segmentation_id == Some(vlan)
                    })
                };
                if let Some(v) = seg {
                    let p = physnet.unwrap_or_default();
                    let vlan = u32::try_from(v)
                        .ok()
                        .filter(|v| (1..=4094).contains(v))
                        .ok_or_else(|| {
                            ApiError::invalid_input("segmentation_id out of range (1 through 4094)")
                        })?;
                    if used(&p, vlan) {
                        return Err(ApiError::conflict(
                            "VlanIdInUse",
                            format!(
                                "Unable to create the network. The VLAN {vlan} on physical network {p} is in use."
                            ),
                        ));
                    }
                    return Ok((net_type, Some(p), Some(vlan)));
                }
                // Like the type driver: a random free VLAN of the physnet's (or any) range.
                let free: Vec<(&str, u32)> = ranges
                    .iter()
                    .flat_map(|&(p, lo, hi)| (lo..=hi).map(move |v| (p, v)))
                    .filter(|&(p, v)| !used(p, v))
                    .collect();
                if free.is_empty() {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "NoNetworkAvailable",
                        "Unable to create the network. No tenant network is available for allocation.",
                    ));
                }
                let (p, v) = free[rand::rng().random_range(0..free.len())];
                Ok((net_type, Some(p.to_string()), Some(v)))
            }
            "vxlan" => {
                if physnet.is_some() {
                    return Err(ApiError::invalid_input(
                        "provider:physical_network specified for vxlan network",
                    ));
                }
                let vni = match seg {
                    Some(v) => u32::try_from(v)
                        .map_err(|_| ApiError::invalid_input("segmentation_id out of range"))?,
                    None => rand::rng().random_range(1000..16_000_000),
                };
                Ok((net_type, None, Some(vni)))
            }
            other => Err(ApiError::invalid_input(format!(
                "network_type value '{other}' not supported"
            ))),
        }
    }

    pub fn update_network(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "network")?;
        input::check_attrs(
            obj,
            &NETWORK_WRITABLE,
            &[
                "project_id",
                "tenant_id",
                "provider:network_type",
                "provider:physical_network",
                "provider:segmentation_id",
            ],
            &[
                "id",
                "created_at",
                "updated_at",
                "revision_number",
                "status",
                "subnets",
                "tags",
            ],
            true,
        )?;
        let std_update = StdUpdate::parse(obj)?;
        let admin = input::opt_bool(obj, "admin_state_up")?;
        let shared = input::opt_bool(obj, "shared")?;
        let ps = input::opt_bool(obj, "port_security_enabled")?;
        let ext = input::opt_bool(obj, "router:external")?;
        let mtu = input::opt_int(obj, "mtu")?;
        let net = self
            .networks
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Network, id))?;
        std_update.apply(&mut net.std);
        if let Some(v) = admin {
            net.admin_state_up = v;
        }
        if let Some(v) = shared {
            net.shared = v;
        }
        if let Some(v) = ps {
            net.port_security_enabled = v;
        }
        if let Some(v) = ext {
            net.external = v;
        }
        if let Some(v) = mtu {
            net.mtu = u32::try_from(v)
                .map_err(|_| ApiError::invalid_attr("mtu", format!("'{v}' is not a valid mtu")))?;
        }
        net.std.bump();
        Ok(self.render_network(id))
    }

    pub fn delete_network(&mut self, id: &str) -> ApiResult<()> {
        if !self.networks.contains_key(id) {
            return Err(ApiError::resource_not_found(Resource::Network, id));
        }
        // Neutron deletes the network's floating IPs (and their ports) and network-owned ports (DHCP) itself;
        // any other port blocks the delete.
        let fips: Vec<String> = self
            .floatingips
            .values()
            .filter(|f| f.network_id == id)
            .map(|f| f.std.id.clone())
            .collect();
        let fip_ports: Vec<String> = fips
            .iter()
            .filter_map(|f| self.floatingips.get(f).map(|f| f.own_port.clone()))
            .collect();
        let in_use: Vec<&str> = self
            .ports
            .values()
            .filter(|p| p.network_id == id && !fip_ports.contains(&p.std.id))
            .map(|p| p.std.id.as_str())
            .collect();
        if !in_use.is_empty() {
            return Err(ApiError::conflict(
                "NetworkInUse",
                format!(
                    "Unable to complete operation on network {id}. There are one or more ports still in use on the network, id for these ports is: {}.",
                    in_use.join(", ")
                ),
            ));
        }
        for f in &fips {
            self.delete_floatingip(f)?;
        }
        self.subnets.retain(|_, s| s.network_id != id);
        self.networks.remove(id);
        Ok(())
    }

    pub fn render_network(&self, id: &str) -> Value {
        let Some(n) = self.networks.get(id) else {
            return Value::Null;
        };
        let mut o = Obj::new();
        n.std.fill(&mut o);
        let v4scope: Value = Value::Null;
        for (k, v) in [
            ("admin_state_up", json!(n.admin_state_up)),
            ("mtu", json!(n.mtu)),
            ("status", json!("ACTIVE")),
            ("subnets", json!(n.subnets)),
            ("shared", json!(n.shared)),
            ("availability_zone_hints", json!([])),
            ("availability_zones", json!([])),
            ("ipv4_address_scope", v4scope.clone()),
            ("ipv6_address_scope", v4scope),
            ("router:external", json!(n.external)),
            ("port_security_enabled", json!(n.port_security_enabled)),
            ("l2_adjacency", json!(true)),
            ("provider:network_type", json!(n.network_type)),
            ("provider:physical_network", json!(n.physical_network)),
            ("provider:segmentation_id", json!(n.segmentation_id)),
        ] {
            o.insert(k.into(), v);
        }
        Value::Object(o)
    }

    /// `GET /network-ip-availabilities/{id}` body (without the wrapper).
    pub fn ip_availability(&self, network_id: &str) -> Option<Value> {
        let n = self.networks.get(network_id)?;
        let mut subs = Vec::new();
        let (mut total_pool, mut used_pool, mut total_sub, mut used_sub) = (0u128, 0u128, 0u128, 0u128);
        for sid in &n.subnets {
            let Some(s) = self.subnets.get(sid) else { continue };
            let (lo, hi) = s.cidr.host_range();
            let in_subnet = (hi - lo).saturating_add(1);
            let pool_total = s.ipam.pool_total();
            let pool_used = s.ipam.pool_used();
            let used = s.ipam.used() as u128;
            total_pool = total_pool.saturating_add(pool_total);
            used_pool += pool_used;
            total_sub = total_sub.saturating_add(in_subnet);
            used_sub += used;
            subs.push(json!({
                "subnet_id": sid, "ip_version": s.cidr.version, "cidr": s.cidr.to_string(), "subnet_name": s.std.name,
                "used_ips": clamp(used), "total_ips": clamp(pool_total),
                "ip_availability_details": {"total_ips_in_subnet": clamp(in_subnet), "total_ips_in_allocation_pool": clamp(pool_total),
                    "used_ips_in_subnet": clamp(used), "used_ips_in_allocation_pool": clamp(pool_used)},
            }));
        }
        Some(json!({
            "network_id": n.std.id, "network_name": n.std.name, "project_id": n.std.project_id, "tenant_id": n.std.project_id,
            "subnet_ip_availability": subs, "used_ips": clamp(used_sub), "total_ips": clamp(total_pool),
            "ip_availability_details": {"total_ips_in_subnet": clamp(total_sub), "total_ips_in_allocation_pool": clamp(total_pool),
                "used_ips_in_subnet": clamp(used_sub), "used_ips_in_allocation_pool": clamp(used_pool)},
        }))
    }
}
