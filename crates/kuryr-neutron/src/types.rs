//! Typed Neutron resources (answers) and create/update bodies (requests).
//!
//! Answers default every missing attribute (`fields=` lists return partial objects). Requests skip every `None` so
//! that an attribute the deployment does not know is never sent (Neutron answers 400 to unrecognized attributes).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Neutron returns some integers as strings (subnetpool prefix lengths).
fn int_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        N(u32),
        S(String),
    }
    match Option::<V>::deserialize(d)? {
        None => Ok(None),
        Some(V::N(n)) => Ok(Some(n)),
        Some(V::S(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("expected an integer, got {s:?}"))),
    }
}

// ---------------------------------------------------------------- networks

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Network {
    pub id: String,
    pub name: String,
    pub project_id: String,
    pub status: String,
    pub admin_state_up: bool,
    pub shared: bool,
    pub mtu: Option<u32>,
    #[serde(deserialize_with = "null_as_default")]
    pub subnets: Vec<String>,
    pub port_security_enabled: Option<bool>,
    #[serde(rename = "router:external")]
    pub router_external: Option<bool>,
    #[serde(rename = "provider:network_type")]
    pub provider_network_type: Option<String>,
    #[serde(rename = "provider:physical_network")]
    pub provider_physical_network: Option<String>,
    #[serde(rename = "provider:segmentation_id")]
    pub provider_segmentation_id: Option<u32>,
    #[serde(deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(deserialize_with = "null_as_default")]
    pub tags: Vec<String>,
    pub revision_number: u64,
}

/// `POST /v2.0/networks`. Neutron 29 refuses `tags` in a network create body: tag after creation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NetworkCreate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_state_up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_security_enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(rename = "provider:network_type", skip_serializing_if = "Option::is_none")]
    pub provider_network_type: Option<String>,
    #[serde(rename = "provider:physical_network", skip_serializing_if = "Option::is_none")]
    pub provider_physical_network: Option<String>,
    #[serde(rename = "provider:segmentation_id", skip_serializing_if = "Option::is_none")]
    pub provider_segmentation_id: Option<u32>,
    /// An external network (floating IPs and router gateways); admin only on a real cloud.
    #[serde(rename = "router:external", skip_serializing_if = "Option::is_none")]
    pub router_external: Option<bool>,
}

// ---------------------------------------------------------------- subnets

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct AllocationPool {
    pub start: String,
    pub end: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct HostRoute {
    pub destination: String,
    pub nexthop: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Subnet {
    pub id: String,
    pub name: String,
    pub network_id: String,
    pub project_id: String,
    pub ip_version: u8,
    pub cidr: String,
    pub gateway_ip: Option<String>,
    pub enable_dhcp: bool,
    pub subnetpool_id: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub allocation_pools: Vec<AllocationPool>,
    #[serde(deserialize_with = "null_as_default")]
    pub host_routes: Vec<HostRoute>,
    #[serde(deserialize_with = "null_as_default")]
    pub dns_nameservers: Vec<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(deserialize_with = "null_as_default")]
    pub tags: Vec<String>,
    pub revision_number: u64,
}

/// `POST /v2.0/subnets`. Give `cidr`, or `subnetpool_id` (+ optional `prefixlen`) to allocate from a pool.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SubnetCreate {
    pub network_id: String,
    pub ip_version: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// `Some(None)` sends `"gateway_ip": null` (no gateway).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_ip: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_dhcp: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnetpool_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefixlen: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocation_pools: Option<Vec<AllocationPool>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

// ---------------------------------------------------------------- subnet pools

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct SubnetPool {
    pub id: String,
    pub name: String,
    pub project_id: String,
    #[serde(deserialize_with = "null_as_default")]
    pub prefixes: Vec<String>,
    pub ip_version: u8,
    #[serde(deserialize_with = "int_or_string")]
    pub default_prefixlen: Option<u32>,
    #[serde(deserialize_with = "int_or_string")]
    pub min_prefixlen: Option<u32>,
    #[serde(deserialize_with = "int_or_string")]
    pub max_prefixlen: Option<u32>,
    pub shared: bool,
    pub is_default: bool,
    pub address_scope_id: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(deserialize_with = "null_as_default")]
    pub tags: Vec<String>,
    pub revision_number: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SubnetPoolCreate {
    pub name: String,
    pub prefixes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_prefixlen: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_prefixlen: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_prefixlen: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address_scope_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

// ---------------------------------------------------------------- routers

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Router {
    pub id: String,
    pub name: String,
    pub project_id: String,
    pub status: String,
    pub admin_state_up: bool,
    pub external_gateway_info: Option<Value>,
    #[serde(deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(deserialize_with = "null_as_default")]
    pub tags: Vec<String>,
    pub revision_number: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RouterCreate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_state_up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_gateway_info: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Body of `add_router_interface`/`remove_router_interface`: a subnet or a port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum RouterInterfaceSpec {
    Subnet { subnet_id: String },
    Port { port_id: String },
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct RouterInterface {
    /// The router id.
    pub id: String,
    pub port_id: String,
    pub subnet_id: String,
    pub subnet_ids: Vec<String>,
    pub network_id: String,
    pub project_id: String,
}

// ---------------------------------------------------------------- ports

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct FixedIp {
    pub subnet_id: String,
    pub ip_address: String,
}

/// A requested fixed IP: a subnet (any free address), an address, or both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FixedIpRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
}

impl FixedIpRequest {
    pub fn subnet(subnet_id: impl Into<String>) -> Self {
        Self {
            subnet_id: Some(subnet_id.into()),
            ip_address: None,
        }
    }

    pub fn address(subnet_id: impl Into<String>, ip: impl Into<String>) -> Self {
        Self {
            subnet_id: Some(subnet_id.into()),
            ip_address: Some(ip.into()),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct AllowedAddressPair {
    pub ip_address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct TrunkDetails {
    pub trunk_id: String,
    pub sub_ports: Vec<TrunkSubPortDetail>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct TrunkSubPortDetail {
    pub port_id: String,
    pub segmentation_type: String,
    pub segmentation_id: u32,
    pub mac_address: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Port {
    pub id: String,
    pub name: String,
    pub network_id: String,
    pub project_id: String,
    pub mac_address: String,
    #[serde(deserialize_with = "null_as_default")]
    pub fixed_ips: Vec<FixedIp>,
    pub status: String,
    pub admin_state_up: bool,
    pub device_owner: String,
    pub device_id: String,
    #[serde(rename = "binding:host_id", deserialize_with = "null_as_default")]
    pub binding_host_id: String,
    #[serde(rename = "binding:vif_type", deserialize_with = "null_as_default")]
    pub binding_vif_type: String,
    #[serde(rename = "binding:vif_details", deserialize_with = "null_as_default")]
    pub binding_vif_details: BTreeMap<String, Value>,
    #[serde(rename = "binding:vnic_type", deserialize_with = "null_as_default")]
    pub binding_vnic_type: String,
    #[serde(rename = "binding:profile", deserialize_with = "null_as_default")]
    pub binding_profile: BTreeMap<String, Value>,
    #[serde(deserialize_with = "null_as_default")]
    pub security_groups: Vec<String>,
    pub port_security_enabled: Option<bool>,
    #[serde(deserialize_with = "null_as_default")]
    pub allowed_address_pairs: Vec<AllowedAddressPair>,
    pub trunk_details: Option<TrunkDetails>,
    #[serde(deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(deserialize_with = "null_as_default")]
    pub tags: Vec<String>,
    pub revision_number: u64,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
}

impl Port {
    pub fn is_active(&self) -> bool {
        self.status == "ACTIVE"
    }
}

/// `POST /v2.0/ports` item (single or bulk).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PortCreate {
    pub network_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fixed_ips: Option<Vec<FixedIpRequest>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_state_up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    #[serde(rename = "binding:host_id", skip_serializing_if = "Option::is_none")]
    pub binding_host_id: Option<String>,
    #[serde(rename = "binding:vnic_type", skip_serializing_if = "Option::is_none")]
    pub binding_vnic_type: Option<String>,
    #[serde(rename = "binding:profile", skip_serializing_if = "Option::is_none")]
    pub binding_profile: Option<BTreeMap<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_groups: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_security_enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_address_pairs: Option<Vec<AllowedAddressPair>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Stored at creation when the server has the `tag-ports-during-bulk-creation` extension.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl PortCreate {
    pub fn new(network_id: impl Into<String>) -> Self {
        Self {
            network_id: network_id.into(),
            ..Self::default()
        }
    }
}

/// `PUT /v2.0/ports/{id}`: only the `Some` attributes change. `binding_host_id: Some("")` unbinds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PortUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_groups: Option<Vec<String>>,
    #[serde(rename = "binding:host_id", skip_serializing_if = "Option::is_none")]
    pub binding_host_id: Option<String>,
    #[serde(rename = "binding:profile", skip_serializing_if = "Option::is_none")]
    pub binding_profile: Option<BTreeMap<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_address_pairs: Option<Vec<AllowedAddressPair>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_state_up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_security_enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

// ---------------------------------------------------------------- trunks

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct SubPort {
    pub port_id: String,
    pub segmentation_type: String,
    pub segmentation_id: u32,
}

impl SubPort {
    pub fn vlan(port_id: impl Into<String>, vlan_id: u32) -> Self {
        Self {
            port_id: port_id.into(),
            segmentation_type: "vlan".into(),
            segmentation_id: vlan_id,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Trunk {
    pub id: String,
    pub name: String,
    pub port_id: String,
    pub project_id: String,
    pub status: String,
    pub admin_state_up: bool,
    #[serde(deserialize_with = "null_as_default")]
    pub sub_ports: Vec<SubPort>,
    #[serde(deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(deserialize_with = "null_as_default")]
    pub tags: Vec<String>,
    pub revision_number: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TrunkCreate {
    pub port_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sub_ports: Vec<SubPort>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_state_up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

// ---------------------------------------------------------------- security groups

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct SecurityGroupRule {
    pub id: String,
    pub security_group_id: String,
    pub project_id: String,
    pub direction: String,
    pub ethertype: String,
    pub protocol: Option<String>,
    pub port_range_min: Option<u32>,
    pub port_range_max: Option<u32>,
    pub remote_ip_prefix: Option<String>,
    pub remote_group_id: Option<String>,
    /// `security-groups-remote-address-group` extension.
    pub remote_address_group_id: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub description: String,
    pub revision_number: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct SecurityGroup {
    pub id: String,
    pub name: String,
    pub project_id: String,
    pub stateful: Option<bool>,
    #[serde(deserialize_with = "null_as_default")]
    pub security_group_rules: Vec<SecurityGroupRule>,
    #[serde(deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(deserialize_with = "null_as_default")]
    pub tags: Vec<String>,
    pub revision_number: u64,
    /// `2026-11-30T04:30:56Z` (whole seconds) where Neutron shows timestamps.
    pub created_at: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SecurityGroupCreate {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stateful: Option<bool>,
    /// neutron-server refuses tags in a security group POST (`Attribute 'tags' not allowed in
    /// POST`); kept so that the contract suite can show it. Tag with `replace_tags` instead.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SecurityGroupRuleCreate {
    pub security_group_id: String,
    /// `ingress` or `egress`.
    pub direction: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ethertype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_range_min: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_range_max: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_ip_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_group_id: Option<String>,
    /// An address group (`security-groups-remote-address-group`); exclusive with the other remotes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_address_group_id: Option<String>,
    /// With noauth, a rule without `project_id` belongs to `fake_project_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

// ---------------------------------------------------------------- address groups

/// An address group (`address-group` extension): a set of prefixes security group rules can
/// name as their remote. Neutron answers addresses in canonical CIDR form (`10.0.0.1` is
/// `10.0.0.1/32`). Address groups carry no tags.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct AddressGroup {
    pub id: String,
    #[serde(deserialize_with = "null_as_default")]
    pub name: String,
    pub project_id: String,
    #[serde(deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(deserialize_with = "null_as_default")]
    pub addresses: Vec<String>,
    pub revision_number: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct AddressGroupCreate {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// CIDRs; on create Neutron refuses a bare address and duplicates.
    pub addresses: Vec<String>,
}

// ---------------------------------------------------------------- floating IPs

/// A floating IP (`router` extension): an address of a `router:external` network, translated to a fixed IP
/// of the associated port. Neutron takes no `tags` in the create: they are set afterwards.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct FloatingIp {
    pub id: String,
    pub project_id: String,
    pub floating_ip_address: String,
    pub floating_network_id: String,
    pub router_id: Option<String>,
    pub port_id: Option<String>,
    pub fixed_ip_address: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub status: String,
    #[serde(deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(deserialize_with = "null_as_default")]
    pub tags: Vec<String>,
    pub revision_number: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FloatingIpCreate {
    pub floating_network_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    /// A specific address of the external network (admin only on a real cloud).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floating_ip_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

// ---------------------------------------------------------------- quotas, availability, extensions

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct QuotaUsage {
    /// -1 means unlimited.
    pub limit: i64,
    pub used: i64,
    pub reserved: i64,
}

impl QuotaUsage {
    /// Room left, `None` when unlimited.
    pub fn available(&self) -> Option<i64> {
        (self.limit >= 0).then(|| (self.limit - self.used - self.reserved).max(0))
    }
}

/// `GET /v2.0/quotas/{project}/details`, keyed by resource (`port`, `network`, `subnet`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct QuotaDetails(pub BTreeMap<String, QuotaUsage>);

impl QuotaDetails {
    pub fn get(&self, resource: &str) -> Option<&QuotaUsage> {
        self.0.get(resource)
    }
}

/// `PUT /v2.0/quotas/{project}`: the `Some` limits change (-1 = unlimited).
#[derive(Debug, Clone, Default, Serialize)]
pub struct QuotaUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnet: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnetpool: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_group: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_group_rule: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trunk: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct SubnetIpAvailability {
    pub subnet_id: String,
    pub subnet_name: String,
    pub cidr: String,
    pub ip_version: u8,
    /// u128: an IPv6 /64 holds 2^64 addresses.
    pub total_ips: u128,
    pub used_ips: u128,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct NetworkIpAvailability {
    pub network_id: String,
    pub network_name: String,
    pub project_id: String,
    pub total_ips: u128,
    pub used_ips: u128,
    pub subnet_ip_availability: Vec<SubnetIpAvailability>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct Extension {
    pub alias: String,
    pub name: String,
    pub description: String,
    pub updated: String,
}

/// Resources that carry tags (`/v2.0/{collection}/{id}/tags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taggable {
    Network,
    Subnet,
    SubnetPool,
    Port,
    Router,
    Trunk,
    SecurityGroup,
    FloatingIp,
}

impl Taggable {
    pub fn collection(self) -> &'static str {
        match self {
            Self::Network => "networks",
            Self::Subnet => "subnets",
            Self::SubnetPool => "subnetpools",
            Self::Port => "ports",
            Self::Router => "routers",
            Self::Trunk => "trunks",
            Self::SecurityGroup => "security-groups",
            Self::FloatingIp => "floatingips",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn port_create_skips_unset_attributes() {
        let p = PortCreate {
            name: Some("p".into()),
            binding_host_id: Some("node".into()),
            ..PortCreate::new("net")
        };
        assert_eq!(
            serde_json::to_value(&p).expect("serialize"),
            json!({"network_id": "net", "name": "p", "binding:host_id": "node"})
        );
    }

    #[test]
    fn port_parses_real_answer_and_partial_fields() {
        let p: Port = serde_json::from_value(json!({
            "id": "i", "status": "ACTIVE", "binding:host_id": "n1", "binding:vif_type": "ovs",
            "binding:vif_details": {"bridge_name": "br-int"}, "binding:profile": {},
            "fixed_ips": [{"subnet_id": "s", "ip_address": "10.0.0.3"}], "tags": ["a"],
            "trunk_details": {"trunk_id": "t", "sub_ports": [{"segmentation_id": 101, "segmentation_type": "vlan",
                "port_id": "sp", "mac_address": "fa:16:3e:00:00:01"}]},
            "description": null, "revision_number": 3
        }))
        .expect("port");
        assert!(p.is_active());
        assert_eq!(p.binding_host_id, "n1");
        assert_eq!(
            p.trunk_details.as_ref().map(|t| t.sub_ports[0].segmentation_id),
            Some(101)
        );
        let partial: Port = serde_json::from_value(json!({"id": "i"})).expect("partial");
        assert_eq!(partial.id, "i");
        assert!(partial.fixed_ips.is_empty());
    }

    #[test]
    fn subnetpool_prefixlen_strings() {
        let sp: SubnetPool =
            serde_json::from_value(json!({"id": "x", "default_prefixlen": "26", "min_prefixlen": 8}))
                .expect("pool");
        assert_eq!(sp.default_prefixlen, Some(26));
        assert_eq!(sp.min_prefixlen, Some(8));
        assert!(serde_json::from_value::<SubnetPool>(json!({"default_prefixlen": "x"})).is_err());
    }

    #[test]
    fn quota_available() {
        let q = QuotaUsage {
            limit: 5,
            used: 3,
            reserved: 1,
        };
        assert_eq!(q.available(), Some(1));
        assert_eq!(QuotaUsage { limit: -1, ..q }.available(), None);
    }

    #[test]
    fn gateway_null() {
        let s = SubnetCreate {
            network_id: "n".into(),
            ip_version: 4,
            cidr: Some("10.0.0.0/24".into()),
            gateway_ip: Some(None),
            ..SubnetCreate::default()
        };
        assert_eq!(
            serde_json::to_value(&s).expect("serialize"),
            json!({"network_id": "n", "ip_version": 4, "cidr": "10.0.0.0/24", "gateway_ip": null})
        );
    }
}
