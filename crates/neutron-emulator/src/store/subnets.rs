//! Subnets: CIDR (given or carved from a subnet pool), gateway and allocation pools.

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::{Std, StdUpdate, Store, create_tags, std_from};
use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};
use crate::ipam::{self, Cidr, SubnetIpam};

#[derive(Debug, Clone)]
pub struct Subnet {
    pub std: Std,
    pub network_id: String,
    pub cidr: Cidr,
    pub gateway: Option<u128>,
    pub enable_dhcp: bool,
    pub subnetpool_id: Option<String>,
    pub ipv6_ra_mode: Value,
    pub ipv6_address_mode: Value,
    pub host_routes: Value,
    pub dns_nameservers: Value,
    pub service_types: Value,
    pub ipam: SubnetIpam,
}

impl Subnet {
    /// SLAAC and DHCPv6-stateless subnets: addresses are EUI-64 from the MAC, never from the pool.
    pub fn is_auto_address(&self) -> bool {
        self.cidr.version == 6
            && matches!(
                self.ipv6_address_mode.as_str(),
                Some("slaac" | "dhcpv6-stateless")
            )
    }
}

fn ipv6_mode(obj: &Obj, key: &str) -> ApiResult<Value> {
    match input::opt_str(obj, key)? {
        None => Ok(Value::Null),
        Some(m) if ["slaac", "dhcpv6-stateful", "dhcpv6-stateless"].contains(&m.as_str()) => Ok(json!(m)),
        Some(m) => Err(ApiError::invalid_attr(key, format!("{m} is not in valid_values"))),
    }
}

impl Store {
    pub fn create_subnet(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "subnet")?;
        input::check_attrs(
            obj,
            &[
                "name",
                "description",
                "gateway_ip",
                "enable_dhcp",
                "dns_nameservers",
                "host_routes",
                "allocation_pools",
                "service_types",
                "segment_id",
            ],
            &[
                "project_id",
                "tenant_id",
                "tags",
                "network_id",
                "ip_version",
                "cidr",
                "subnetpool_id",
                "prefixlen",
                "ipv6_ra_mode",
                "ipv6_address_mode",
                "use_default_subnetpool",
            ],
            &["id", "created_at", "updated_at", "revision_number"],
            false,
        )?;
        let network_id = input::req_str(obj, "network_id")?;
        let ip_version = input::to_int("ip_version", input::required(obj, "ip_version")?)?;
        if ip_version != 4 && ip_version != 6 {
            return Err(ApiError::invalid_attr(
                "ip_version",
                format!("{ip_version} is not in valid_values"),
            ));
        }
        let version = if ip_version == 4 { 4u8 } else { 6u8 };
        let mut std = std_from(obj, 0)?;
        std.tags = create_tags(obj)?;
        if !self.networks.contains_key(&network_id) {
            return Err(ApiError::resource_not_found(Resource::Network, &network_id));
        }
        let subnetpool_id = input::opt_str(obj, "subnetpool_id")?;
        let prefixlen = input::opt_int(obj, "prefixlen")?;
        let cidr = match (input::opt_str(obj, "cidr")?, &subnetpool_id) {
            (Some(c), pool) => {
                let cidr = match Cidr::parse(&c) {
                    Ok(c) => c,
                    // The real server accepts host bits and stores the network address.
                    Err(Some(norm)) => Cidr::parse(&norm).map_err(|_| {
                        ApiError::invalid_attr("cidr", format!("'{c}' is not a valid IP subnet"))
                    })?,
                    Err(None) => {
                        return Err(ApiError::invalid_input(format!("{c} is not in a CIDR format")));
                    }
                };
                if let Some(pool_id) = pool {
                    let pool = self
                        .subnetpools
                        .get(pool_id)
                        .ok_or_else(|| ApiError::resource_not_found(Resource::SubnetPool, pool_id))?;
                    if !pool
                        .prefixes
                        .iter()
                        .any(|p| p.first() <= cidr.first() && cidr.last() <= p.last())
                    {
                        return Err(ApiError::bad_request(format!(
                            "Cidr {cidr} is not within the prefixes of subnet pool {pool_id}"
                        )));
                    }
                    if self.pool_subnets(pool_id).iter().any(|t| t.overlaps(&cidr)) {
                        return Err(ApiError::conflict(
                            "SubnetAllocationError",
                            format!(
                                "Failed to allocate subnet: Cidr {cidr} overlaps with another subnet in subnet pool {pool_id}."
                            ),
                        ));
                    }
                }
                cidr
            }
            (None, Some(pool_id)) => {
                let pool = self
                    .subnetpools
                    .get(pool_id)
                    .ok_or_else(|| ApiError::resource_not_found(Resource::SubnetPool, pool_id))?;
                let len = match prefixlen {
                    None => pool.default_prefixlen,
                    Some(l) => {
                        let l = u8::try_from(l).map_err(|_| {
                            ApiError::invalid_attr("prefixlen", format!("'{l}' is not a valid prefix length"))
                        })?;
                        if l < pool.min_prefixlen || l > pool.max_prefixlen {
                            return Err(ApiError::bad_request(format!(
                                "Illegal prefix bounds: prefixlen={l}, min_prefixlen={}, max_prefixlen={}.",
                                pool.min_prefixlen, pool.max_prefixlen
                            )));
                        }
                        l
                    }
                };
                ipam::allocate_prefix(&pool.prefixes, &self.pool_subnets(pool_id), len).ok_or_else(|| {
                    ApiError::conflict(
                        "SubnetAllocationError",
                        format!("Failed to allocate subnet: Insufficient prefix space to allocate subnet size /{len}."),
                    )
                })?
            }
            (None, None) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "Bad subnets request: a subnetpool must be specified in the absence of a cidr.",
                ));
            }
        };
        if cidr.version != version {
            return Err(ApiError::invalid_input(format!(
                "cidr '{cidr}' does not match the ip_version '{version}'"
            )));
        }
        if self
            .subnets
            .values()
            .any(|s| s.network_id == network_id && s.cidr.overlaps(&cidr))
        {
            return Err(ApiError::invalid_input(format!(
                "Requested subnet with cidr: {cidr} for network: {network_id} overlaps with another subnet"
            )));
        }
        let gateway = match obj.get("gateway_ip") {
            None => Some(cidr.default_gateway()),
            Some(Value::Null) => None,
            Some(Value::String(g)) => match ipam::parse_ip(g) {
                // Neutron accepts a gateway outside the cidr (an on-link router elsewhere).
                Some((v, ip)) if v == version => Some(ip),
                Some(_) => {
                    return Err(ApiError::invalid_input(format!(
                        "Gateway IP {g} does not match the ip_version of the subnet"
                    )));
                }
                None => {
                    return Err(ApiError::invalid_attr(
                        "gateway_ip",
                        format!("'{g}' is not a valid IP address"),
                    ));
                }
            },
            Some(v) => {
                return Err(ApiError::invalid_attr(
                    "gateway_ip",
                    format!("'{}' is not a valid IP address", input::show(v)),
                ));
            }
        };
        let pools = match input::opt_list(obj, "allocation_pools")? {
            None => ipam::default_pools(&cidr, gateway),
            Some(items) => {
                let mut pools = Vec::new();
                for item in items {
                    let s = item.get("start").and_then(Value::as_str).and_then(ipam::parse_ip);
                    let e = item.get("end").and_then(Value::as_str).and_then(ipam::parse_ip);
                    match (s, e) {
                        (Some((sv, s)), Some((ev, e)))
                            if cidr.contains(sv, s) && cidr.contains(ev, e) && s <= e =>
                        {
                            if gateway.is_some_and(|g| g >= s && g <= e) {
                                return Err(ApiError::conflict(
                                    "GatewayConflictWithAllocationPools",
                                    format!(
                                        "Gateway ip {} conflicts with allocation pool {}-{}",
                                        gateway.map(|g| ipam::format_ip(version, g)).unwrap_or_default(),
                                        ipam::format_ip(version, s),
                                        ipam::format_ip(version, e)
                                    ),
                                ));
                            }
                            pools.push((s, e));
                        }
                        _ => {
                            let show = |k: &str| item.get(k).map(input::show).unwrap_or_default();
                            return Err(ApiError::bad_request(format!(
                                "The allocation pool {}-{} spans beyond the subnet cidr {cidr}.",
                                show("start"),
                                show("end")
                            ))
                            .with_kind("OutOfBoundsAllocationPool"));
                        }
                    }
                }
                pools
            }
        };
        let project = std.project_id.clone();
        self.check_quota(&project, "subnet", 1)?;
        // The gateway lies outside the pools (checked above), so only a router interface can take it.
        let ipam = SubnetIpam::new(version, pools);
        let subnet = Subnet {
            network_id: network_id.clone(),
            cidr,
            gateway,
            enable_dhcp: input::opt_bool(obj, "enable_dhcp")?.unwrap_or(true),
            subnetpool_id,
            ipv6_ra_mode: ipv6_mode(obj, "ipv6_ra_mode")?,
            ipv6_address_mode: ipv6_mode(obj, "ipv6_address_mode")?,
            host_routes: input::opt_list(obj, "host_routes")?
                .map(Value::Array)
                .unwrap_or(json!([])),
            dns_nameservers: input::opt_list(obj, "dns_nameservers")?
                .map(Value::Array)
                .unwrap_or(json!([])),
            service_types: input::opt_list(obj, "service_types")?
                .map(Value::Array)
                .unwrap_or(json!([])),
            ipam,
            std,
        };
        let id = subnet.std.id.clone();
        self.subnets.insert(id.clone(), subnet);
        if let Some(n) = self.networks.get_mut(&network_id) {
            n.subnets.push(id.clone());
            n.subnets.sort();
            n.std.bump();
        }
        Ok(self.render_subnet(&id))
    }

    pub(super) fn pool_subnets(&self, pool_id: &str) -> Vec<Cidr> {
        self.subnets
            .values()
            .filter(|s| s.subnetpool_id.as_deref() == Some(pool_id))
            .map(|s| s.cidr)
            .collect()
    }

    pub fn update_subnet(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "subnet")?;
        input::check_attrs(
            obj,
            &[
                "name",
                "description",
                "enable_dhcp",
                "dns_nameservers",
                "host_routes",
                "service_types",
            ],
            &[
                "project_id",
                "tenant_id",
                "network_id",
                "ip_version",
                "cidr",
                "subnetpool_id",
                "ipv6_ra_mode",
                "ipv6_address_mode",
                "gateway_ip",
                "allocation_pools",
                "segment_id",
            ],
            &["id", "created_at", "updated_at", "revision_number", "tags"],
            true,
        )?;
        let std_update = StdUpdate::parse(obj)?;
        let dhcp = input::opt_bool(obj, "enable_dhcp")?;
        let dns = input::opt_list(obj, "dns_nameservers")?;
        let routes = input::opt_list(obj, "host_routes")?;
        let st = input::opt_list(obj, "service_types")?;
        let s = self
            .subnets
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Subnet, id))?;
        std_update.apply(&mut s.std);
        if let Some(v) = dhcp {
            s.enable_dhcp = v;
        }
        if let Some(v) = dns {
            s.dns_nameservers = Value::Array(v);
        }
        if let Some(v) = routes {
            s.host_routes = Value::Array(v);
        }
        if let Some(v) = st {
            s.service_types = Value::Array(v);
        }
        s.std.bump();
        Ok(self.render_subnet(id))
    }

    pub fn delete_subnet(&mut self, id: &str) -> ApiResult<()> {
        if !self.subnets.contains_key(id) {
            return Err(ApiError::resource_not_found(Resource::Subnet, id));
        }
        if self
            .ports
            .values()
            .any(|p| p.fixed_ips.iter().any(|f| f.subnet_id == id))
        {
            return Err(ApiError::conflict(
                "SubnetInUse",
                format!(
                    "Unable to complete operation on subnet {id}: One or more ports have an IP allocation from this subnet."
                ),
            ));
        }
        if let Some(s) = self.subnets.remove(id)
            && let Some(n) = self.networks.get_mut(&s.network_id)
        {
            n.subnets.retain(|x| x != id);
            n.std.bump();
        }
        Ok(())
    }

    pub fn render_subnet(&self, id: &str) -> Value {
        let Some(s) = self.subnets.get(id) else {
            return Value::Null;
        };
        let v = s.cidr.version;
        let mut o = Obj::new();
        s.std.fill(&mut o);
        let pools: Vec<Value> = s
            .ipam
            .pools()
            .iter()
            .map(|(a, b)| json!({"start": ipam::format_ip(v, *a), "end": ipam::format_ip(v, *b)}))
            .collect();
        for (k, val) in [
            ("network_id", json!(s.network_id)),
            ("ip_version", json!(v)),
            ("subnetpool_id", json!(s.subnetpool_id)),
            ("enable_dhcp", json!(s.enable_dhcp)),
            ("ipv6_ra_mode", s.ipv6_ra_mode.clone()),
            ("ipv6_address_mode", s.ipv6_address_mode.clone()),
            (
                "gateway_ip",
                s.gateway
                    .map(|g| json!(ipam::format_ip(v, g)))
                    .unwrap_or(Value::Null),
            ),
            ("cidr", json!(s.cidr.to_string())),
            ("allocation_pools", json!(pools)),
            ("host_routes", s.host_routes.clone()),
            ("dns_nameservers", s.dns_nameservers.clone()),
            (
                "router:external",
                json!(self.networks.get(&s.network_id).is_some_and(|n| n.external)),
            ),
            ("service_types", s.service_types.clone()),
            ("segment_id", Value::Null),
        ] {
            o.insert(k.into(), val);
        }
        Value::Object(o)
    }
}
