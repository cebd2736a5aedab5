//! The in-memory Neutron database and its business rules (IPAM, quotas, trunks, bindings).
//!
//! Everything runs under one mutex held by the caller; every mutating operation validates first and only then
//! changes state, or rolls back what it took (bulk creates), so a failed request never leaves partial state.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use axum::http::StatusCode;
use rand::Rng;
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};
use crate::ipam::{self, AllocError, Cidr, SubnetIpam};

pub const NOAUTH_PROJECT: &str = "fake_project_id";
pub const TRUNK_SUBPORT_OWNER: &str = "trunk:subport";
pub const ROUTER_INTERFACE_OWNER: &str = "network:router_interface";

// What the lab's ML2 and fake agents are configured with (scripts/neutron-lab/start-neutron.sh): tenant networks
// are VXLAN; admins create flat networks on any physnet and VLAN networks on these ranges.
/// `[ml2_type_vlan] network_vlan_ranges`: physnet, first and last VLAN.
pub const VLAN_RANGES: [(&str, u32, u32); 2] = [("physnet1", 100, 200), ("physnet2", 300, 399)];
/// Every agent host's OVS agent `bridge_mappings`: `normal` ports on a flat/VLAN network bind only on these physnets.
pub const OVS_BRIDGE_MAPPINGS: [(&str, &str); 1] = [("physnet1", "br-ex")];
/// Every agent host's NIC Switch (SR-IOV) agent `device_mappings`: `direct`/`macvtap` ports bind (vif_type
/// `hw_veb`) on a flat/VLAN network of these physnets, and nowhere else.
pub const SRIOV_DEVICE_MAPPINGS: [(&str, &str); 1] = [("physnet2", "ens2f0")];

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

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Shared attributes of neutron "standard attribute" resources.
#[derive(Debug, Clone)]
pub struct Std {
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub description: String,
    pub tags: Vec<String>,
    pub created_at: String,
    pub updated_at: String,
    pub revision: u64,
}

impl Std {
    fn new(project_id: String, name: String, description: String, revision: u64) -> Self {
        let t = now();
        Self {
            id: new_id(),
            project_id,
            name,
            description,
            tags: Vec::new(),
            created_at: t.clone(),
            updated_at: t,
            revision,
        }
    }

    fn bump(&mut self) {
        self.revision += 1;
        self.updated_at = now();
    }

    fn fill(&self, o: &mut Obj) {
        o.insert("id".into(), json!(self.id));
        o.insert("name".into(), json!(self.name));
        o.insert("project_id".into(), json!(self.project_id));
        o.insert("tenant_id".into(), json!(self.project_id));
        o.insert("description".into(), json!(self.description));
        o.insert("tags".into(), json!(self.tags));
        o.insert("created_at".into(), json!(self.created_at));
        o.insert("updated_at".into(), json!(self.updated_at));
        o.insert("revision_number".into(), json!(self.revision));
    }
}

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

/// A port's binding as ML2 (openvswitch + sriovnicswitch) decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    Unbound,
    Failed,
    Ovs,
    /// sriovnicswitch: the VLAN the VF gets ("0" on a flat network).
    HwVeb {
        vlan: String,
    },
}

impl Binding {
    pub fn bound(&self) -> bool {
        matches!(self, Binding::Ovs | Binding::HwVeb { .. })
    }
}

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

/// What address allocation needs to know about the port.
#[derive(Debug, Clone, Copy)]
struct AddrCtx<'a> {
    mac: &'a str,
    /// Router interfaces get only the addresses they ask for.
    auto_addresses: bool,
}

/// Modified EUI-64 interface identifier (RFC 4291): fa:16:3e:16:e6:e0 -> f816:3eff:fe16:e6e0.
fn eui64_interface_id(mac: &str) -> u128 {
    let b: Vec<u128> = mac
        .split(':')
        .map(|p| u128::from(u8::from_str_radix(p, 16).unwrap_or(0)))
        .collect();
    if b.len() != 6 {
        return 0;
    }
    ((b[0] ^ 0x02) << 56)
        | (b[1] << 48)
        | (b[2] << 40)
        | (0xff << 32)
        | (0xfe << 24)
        | (b[3] << 16)
        | (b[4] << 8)
        | b[5]
}

#[derive(Debug, Clone)]
pub struct SubnetPool {
    pub std: Std,
    pub prefixes: Vec<Cidr>,
    pub ip_version: u8,
    pub default_prefixlen: u8,
    pub min_prefixlen: u8,
    pub max_prefixlen: u8,
    pub shared: bool,
    pub is_default: bool,
}

#[derive(Debug, Clone)]
pub struct FixedIp {
    pub subnet_id: String,
    pub version: u8,
    pub ip: u128,
}

#[derive(Debug, Clone)]
pub struct Port {
    pub std: Std,
    pub network_id: String,
    pub mac: String,
    pub admin_state_up: bool,
    pub status: String,
    pub device_id: String,
    pub device_owner: String,
    pub fixed_ips: Vec<FixedIp>,
    pub port_security_enabled: bool,
    pub security_groups: Vec<String>,
    pub vnic_type: String,
    pub profile: Value,
    pub host: String,
    pub allowed_address_pairs: Value,
    pub extra_dhcp_opts: Value,
    /// Bumped on every binding change so a stale activation timer does nothing.
    pub bind_gen: u64,
}

#[derive(Debug, Clone)]
pub struct Router {
    pub std: Std,
    pub admin_state_up: bool,
    pub routes: Value,
    pub external_gateway_info: Value,
}

#[derive(Debug, Clone)]
pub struct SecurityGroup {
    pub std: Std,
    pub stateful: bool,
    pub is_default: bool,
}

#[derive(Debug, Clone)]
pub struct SgRule {
    pub id: String,
    pub project_id: String,
    pub security_group_id: String,
    pub direction: String,
    pub ethertype: String,
    pub protocol: Value,
    pub port_range_min: Value,
    pub port_range_max: Value,
    pub remote_ip_prefix: Value,
    pub remote_group_id: Value,
    pub description: Value,
    pub belongs_to_default_sg: Value,
    pub standard_attr_id: u64,
    pub created_at: String,
    pub revision: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubPort {
    pub port_id: String,
    pub segmentation_type: String,
    pub segmentation_id: u32,
}

#[derive(Debug, Clone)]
pub struct Trunk {
    pub std: Std,
    pub port_id: String,
    pub status: String,
    pub admin_state_up: bool,
    pub sub_ports: Vec<SubPort>,
    pub generation: u64,
}

/// Something to flip to ACTIVE after the configured delay, if still current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activation {
    Port { id: String, generation: u64 },
    Trunk { id: String, generation: u64 },
}

/// Which hosts have an L2 agent.
#[derive(Debug, Clone, Default)]
pub enum AgentHosts {
    /// Every host binds (the default for tests).
    #[default]
    Any,
    /// Only these hosts bind; others get `binding:vif_type=binding_failed` like the real server.
    Only(BTreeSet<String>),
}

#[derive(Debug, Default)]
pub struct Store {
    pub networks: BTreeMap<String, Network>,
    pub subnets: BTreeMap<String, Subnet>,
    pub subnetpools: BTreeMap<String, SubnetPool>,
    pub ports: BTreeMap<String, Port>,
    pub routers: BTreeMap<String, Router>,
    pub security_groups: BTreeMap<String, SecurityGroup>,
    pub sg_rules: BTreeMap<String, SgRule>,
    pub trunks: BTreeMap<String, Trunk>,
    quotas: HashMap<String, BTreeMap<String, i64>>,
    macs: HashSet<String>,
    default_sg: HashMap<String, String>,
    /// port id -> trunk id, for parents and subports.
    parent_of: HashMap<String, String>,
    subport_of: HashMap<String, String>,
    next_std_attr: u64,
    pub agent_hosts: AgentHosts,
    pub seen_hosts: BTreeSet<String>,
    pub activations: Vec<Activation>,
}

fn project_of(obj: &Obj) -> ApiResult<String> {
    Ok(
        match (
            input::opt_str(obj, "project_id")?,
            input::opt_str(obj, "tenant_id")?,
        ) {
            (Some(p), _) | (None, Some(p)) if !p.is_empty() => p,
            _ => NOAUTH_PROJECT.to_string(),
        },
    )
}

fn std_from(obj: &Obj, revision: u64) -> ApiResult<Std> {
    Ok(Std::new(
        project_of(obj)?,
        input::opt_str(obj, "name")?.unwrap_or_default(),
        input::opt_str(obj, "description")?.unwrap_or_default(),
        revision,
    ))
}

fn create_tags(obj: &Obj) -> ApiResult<Vec<String>> {
    input::tags("tags", input::opt_str_list(obj, "tags")?.unwrap_or_default())
}

const STD_READONLY: [&str; 6] = [
    "id",
    "created_at",
    "updated_at",
    "revision_number",
    "status",
    "tags",
];

impl Store {
    pub fn new(agent_hosts: AgentHosts) -> Self {
        Self {
            agent_hosts,
            next_std_attr: 1,
            ..Default::default()
        }
    }

    fn next_attr_id(&mut self) -> u64 {
        self.next_std_attr += 1;
        self.next_std_attr
    }

    // ---------------------------------------------------------------- quotas

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
            "network" => self
                .networks
                .values()
                .filter(|r| r.std.project_id == project)
                .count(),
            "subnet" => self
                .subnets
                .values()
                .filter(|r| r.std.project_id == project)
                .count(),
            "subnetpool" => self
                .subnetpools
                .values()
                .filter(|r| r.std.project_id == project)
                .count(),
            "port" => self
                .ports
                .values()
                .filter(|r| r.std.project_id == project)
                .count(),
            "router" => self
                .routers
                .values()
                .filter(|r| r.std.project_id == project)
                .count(),
            "security_group" => self
                .security_groups
                .values()
                .filter(|r| r.std.project_id == project)
                .count(),
            "security_group_rule" => self.sg_rules.values().filter(|r| r.project_id == project).count(),
            "trunk" => self
                .trunks
                .values()
                .filter(|r| r.std.project_id == project)
                .count(),
            _ => 0,
        };
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    fn check_quota(&self, project: &str, key: &str, adding: usize) -> ApiResult<()> {
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

    // ---------------------------------------------------------------- security groups

    /// Neutron creates the project's `default` group on its first resource; so do we.
    pub fn ensure_default_sg(&mut self, project: &str) -> String {
        if let Some(id) = self.default_sg.get(project) {
            return id.clone();
        }
        let mut std = Std::new(
            project.to_string(),
            "default".into(),
            "Default security group".into(),
            1,
        );
        let id = std.id.clone();
        std.tags = Vec::new();
        self.security_groups.insert(
            id.clone(),
            SecurityGroup {
                std,
                stateful: true,
                is_default: true,
            },
        );
        for (direction, ethertype, remote_self) in [
            ("ingress", "IPv4", true),
            ("egress", "IPv6", false),
            ("ingress", "IPv6", true),
            ("egress", "IPv4", false),
        ] {
            let rule = self.new_rule(
                project,
                &id,
                direction,
                ethertype,
                remote_self.then(|| id.clone()),
                Value::Null,
            );
            self.sg_rules.insert(rule.id.clone(), rule);
        }
        self.default_sg.insert(project.to_string(), id.clone());
        id
    }

    fn new_rule(
        &mut self,
        project: &str,
        sg: &str,
        direction: &str,
        ethertype: &str,
        remote_group: Option<String>,
        description: Value,
    ) -> SgRule {
        SgRule {
            id: new_id(),
            project_id: project.to_string(),
            security_group_id: sg.to_string(),
            direction: direction.to_string(),
            ethertype: ethertype.to_string(),
            protocol: Value::Null,
            port_range_min: Value::Null,
            port_range_max: Value::Null,
            remote_ip_prefix: Value::Null,
            remote_group_id: remote_group.map(Value::String).unwrap_or(Value::Null),
            description,
            belongs_to_default_sg: Value::Null,
            standard_attr_id: self.next_attr_id(),
            created_at: now(),
            revision: 0,
        }
    }

    pub fn create_security_group(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "security_group")?;
        input::check_attrs(
            obj,
            &["name", "description", "stateful"],
            &["project_id", "tenant_id", "tags"],
            &STD_READONLY,
            false,
        )?;
        let mut std = std_from(obj, 1)?;
        std.tags = create_tags(obj)?;
        let stateful = input::opt_bool(obj, "stateful")?.unwrap_or(true);
        let project = std.project_id.clone();
        self.ensure_default_sg(&project);
        self.check_quota(&project, "security_group", 1)?;
        let id = std.id.clone();
        self.security_groups.insert(
            id.clone(),
            SecurityGroup {
                std,
                stateful,
                is_default: false,
            },
        );
        for ethertype in ["IPv6", "IPv4"] {
            let mut rule = self.new_rule(&project, &id, "egress", ethertype, None, Value::Null);
            rule.belongs_to_default_sg = json!(false);
            self.sg_rules.insert(rule.id.clone(), rule);
        }
        Ok(self.render_sg(&id))
    }

    pub fn update_security_group(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "security_group")?;
        input::check_attrs(
            obj,
            &["name", "description", "stateful"],
            &["project_id", "tenant_id"],
            &STD_READONLY,
            true,
        )?;
        let name = input::opt_str(obj, "name")?;
        let description = input::opt_str(obj, "description")?;
        let stateful = input::opt_bool(obj, "stateful")?;
        let sg = self
            .security_groups
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::SecurityGroup, id))?;
        if let Some(n) = name {
            sg.std.name = n;
        }
        if let Some(d) = description {
            sg.std.description = d;
        }
        if let Some(s) = stateful {
            sg.stateful = s;
        }
        sg.std.bump();
        Ok(self.render_sg(id))
    }

    pub fn delete_security_group(&mut self, id: &str) -> ApiResult<()> {
        if !self.security_groups.contains_key(id) {
            return Err(ApiError::resource_not_found(Resource::SecurityGroup, id));
        }
        if self
            .ports
            .values()
            .any(|p| p.security_groups.iter().any(|s| s == id))
        {
            return Err(ApiError::conflict(
                "SecurityGroupInUse",
                format!("Security Group {id} in use."),
            ));
        }
        self.security_groups.remove(id);
        self.sg_rules.retain(|_, r| r.security_group_id != id);
        self.default_sg.retain(|_, sg| sg != id);
        Ok(())
    }

    pub fn create_sg_rule(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "security_group_rule")?;
        input::check_attrs(
            obj,
            &[
                "security_group_id",
                "direction",
                "ethertype",
                "protocol",
                "port_range_min",
                "port_range_max",
                "remote_ip_prefix",
                "remote_group_id",
                "remote_address_group_id",
                "description",
            ],
            &["project_id", "tenant_id"],
            &["id", "created_at", "updated_at", "revision_number"],
            false,
        )?;
        let sg = input::req_str(obj, "security_group_id")?;
        let direction = input::req_str(obj, "direction")?;
        if direction != "ingress" && direction != "egress" {
            return Err(ApiError::invalid_attr(
                "direction",
                format!("{direction} is not in valid_values"),
            ));
        }
        let ethertype = input::opt_str(obj, "ethertype")?.unwrap_or_else(|| "IPv4".into());
        if ethertype != "IPv4" && ethertype != "IPv6" {
            return Err(ApiError::invalid_attr(
                "ethertype",
                format!("{ethertype} is not in valid_values"),
            ));
        }
        let project = project_of(obj)?;
        if !self.security_groups.contains_key(&sg) {
            return Err(ApiError::resource_not_found(Resource::SecurityGroup, &sg));
        }
        let protocol = match obj.get("protocol") {
            None | Some(Value::Null) => Value::Null,
            Some(Value::String(s)) => json!(s.to_ascii_lowercase()),
            Some(Value::Number(n)) => json!(n.to_string()),
            Some(v) => {
                return Err(ApiError::invalid_attr(
                    "protocol",
                    format!("'{}' is not a valid protocol", input::show(v)),
                ));
            }
        };
        let pmin = input::opt_int(obj, "port_range_min")?;
        let pmax = input::opt_int(obj, "port_range_max")?;
        for (k, v) in [("port_range_min", pmin), ("port_range_max", pmax)] {
            if let Some(p) = v
                && !(0..=65535).contains(&p)
            {
                return Err(ApiError::invalid_attr(
                    k,
                    format!("'{p}' is not a valid port number"),
                ));
            }
        }
        if let (Some(a), Some(b)) = (pmin, pmax)
            && a > b
        {
            return Err(ApiError::bad_request(
                "For TCP/UDP protocols, port_range_min must be <= port_range_max".to_string(),
            )
            .with_kind("SecurityGroupInvalidPortRange"));
        }
        let remote_ip_prefix = match input::opt_str(obj, "remote_ip_prefix")? {
            None => Value::Null,
            Some(s) => {
                let c = match Cidr::parse(&s) {
                    Ok(c) => c,
                    Err(Some(n)) => {
                        Cidr::parse(&n).map_err(|_| ApiError::invalid_attr("remote_ip_prefix", "invalid"))?
                    }
                    Err(None) => match ipam::parse_ip(&s) {
                        Some((v, ip)) => Cidr::from_parts(v, ip, if v == 4 { 32 } else { 128 }),
                        None => {
                            return Err(ApiError::invalid_attr(
                                "remote_ip_prefix",
                                format!("'{s}' is not a valid IP subnet"),
                            ));
                        }
                    },
                };
                json!(c.to_string())
            }
        };
        let remote_group_id = match input::opt_str(obj, "remote_group_id")? {
            None => Value::Null,
            Some(g) => {
                if !self.security_groups.contains_key(&g) {
                    return Err(ApiError::resource_not_found(Resource::SecurityGroup, &g));
                }
                json!(g)
            }
        };
        let description = input::opt_str(obj, "description")?.unwrap_or_default();
        let mut rule = self.new_rule(&project, &sg, &direction, &ethertype, None, json!(description));
        rule.protocol = protocol;
        rule.port_range_min = pmin.map(|v| json!(v)).unwrap_or(Value::Null);
        rule.port_range_max = pmax.map(|v| json!(v)).unwrap_or(Value::Null);
        rule.remote_ip_prefix = remote_ip_prefix;
        rule.remote_group_id = remote_group_id;
        rule.belongs_to_default_sg = json!(self.security_groups.get(&sg).is_some_and(|s| s.is_default));
        if let Some(dup) = self.sg_rules.values().find(|r| {
            r.security_group_id == rule.security_group_id
                && r.direction == rule.direction
                && r.ethertype == rule.ethertype
                && r.protocol == rule.protocol
                && r.port_range_min == rule.port_range_min
                && r.port_range_max == rule.port_range_max
                && r.remote_ip_prefix == rule.remote_ip_prefix
                && r.remote_group_id == rule.remote_group_id
        }) {
            return Err(ApiError::conflict(
                "SecurityGroupRuleExists",
                format!("Security group rule already exists. Rule id is {}.", dup.id),
            ));
        }
        self.check_quota(&project, "security_group_rule", 1)?;
        let id = rule.id.clone();
        self.sg_rules.insert(id.clone(), rule);
        if let Some(g) = self.security_groups.get_mut(&sg) {
            g.std.bump();
        }
        Ok(self.render_rule(&id, false))
    }

    pub fn delete_sg_rule(&mut self, id: &str) -> ApiResult<()> {
        let rule = self
            .sg_rules
            .remove(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::SecurityGroupRule, id))?;
        if let Some(g) = self.security_groups.get_mut(&rule.security_group_id) {
            g.std.bump();
        }
        Ok(())
    }

    pub fn render_rule(&self, id: &str, embedded: bool) -> Value {
        let Some(r) = self.sg_rules.get(id) else {
            return Value::Null;
        };
        let normalized = r.remote_ip_prefix.clone();
        let mut v = json!({
            "id": r.id, "project_id": r.project_id, "tenant_id": r.project_id,
            "security_group_id": r.security_group_id, "ethertype": r.ethertype, "direction": r.direction,
            "protocol": r.protocol, "port_range_min": r.port_range_min, "port_range_max": r.port_range_max,
            "remote_ip_prefix": r.remote_ip_prefix, "remote_address_group_id": null, "normalized_cidr": normalized,
            "remote_group_id": r.remote_group_id, "belongs_to_default_sg": r.belongs_to_default_sg,
            "description": r.description, "created_at": r.created_at, "updated_at": r.created_at,
            "revision_number": r.revision,
        });
        if embedded && let Value::Object(o) = &mut v {
            o.insert("standard_attr_id".into(), json!(r.standard_attr_id));
            o.insert("tags".into(), json!([]));
        }
        v
    }

    pub fn render_sg(&self, id: &str) -> Value {
        let Some(sg) = self.security_groups.get(id) else {
            return Value::Null;
        };
        let mut o = Obj::new();
        sg.std.fill(&mut o);
        o.insert("stateful".into(), json!(sg.stateful));
        o.insert("shared".into(), json!(false));
        let rules: Vec<Value> = self
            .sg_rules
            .values()
            .filter(|r| r.security_group_id == id)
            .map(|r| self.render_rule(&r.id, true))
            .collect();
        o.insert("security_group_rules".into(), json!(rules));
        Value::Object(o)
    }

    // ---------------------------------------------------------------- networks

    pub fn create_network(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "network")?;
        input::check_attrs(
            obj,
            &[
                "name",
                "description",
                "admin_state_up",
                "mtu",
                "shared",
                "port_security_enabled",
                "router:external",
            ],
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
            &[
                "name",
                "description",
                "admin_state_up",
                "mtu",
                "shared",
                "port_security_enabled",
                "router:external",
            ],
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
        let name = input::opt_str(obj, "name")?;
        let description = input::opt_str(obj, "description")?;
        let admin = input::opt_bool(obj, "admin_state_up")?;
        let shared = input::opt_bool(obj, "shared")?;
        let ps = input::opt_bool(obj, "port_security_enabled")?;
        let ext = input::opt_bool(obj, "router:external")?;
        let mtu = input::opt_int(obj, "mtu")?;
        let net = self
            .networks
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Network, id))?;
        if let Some(v) = name {
            net.std.name = v;
        }
        if let Some(v) = description {
            net.std.description = v;
        }
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
        // Neutron deletes network-owned ports (DHCP) itself; any other port blocks the delete.
        let in_use: Vec<&str> = self
            .ports
            .values()
            .filter(|p| p.network_id == id)
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

    // ---------------------------------------------------------------- subnets

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

    fn pool_subnets(&self, pool_id: &str) -> Vec<Cidr> {
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
        let name = input::opt_str(obj, "name")?;
        let description = input::opt_str(obj, "description")?;
        let dhcp = input::opt_bool(obj, "enable_dhcp")?;
        let dns = input::opt_list(obj, "dns_nameservers")?;
        let routes = input::opt_list(obj, "host_routes")?;
        let st = input::opt_list(obj, "service_types")?;
        let s = self
            .subnets
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Subnet, id))?;
        if let Some(v) = name {
            s.std.name = v;
        }
        if let Some(v) = description {
            s.std.description = v;
        }
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

    // ---------------------------------------------------------------- subnet pools

    pub fn create_subnetpool(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "subnetpool")?;
        input::check_attrs(
            obj,
            &[
                "name",
                "description",
                "prefixes",
                "default_prefixlen",
                "min_prefixlen",
                "max_prefixlen",
                "is_default",
                "default_quota",
            ],
            &["project_id", "tenant_id", "tags", "shared", "address_scope_id"],
            &["id", "created_at", "updated_at", "revision_number", "ip_version"],
            false,
        )?;
        let prefixes_raw = input::opt_str_list(obj, "prefixes")?.ok_or_else(|| {
            ApiError::bad_request("Failed to parse request. Required attribute 'prefixes' not specified")
        })?;
        let mut prefixes = Vec::new();
        for p in &prefixes_raw {
            let c = Cidr::parse(p).or_else(|norm| match norm {
                Some(n) => Cidr::parse(&n).map_err(|_| {
                    ApiError::invalid_attr("prefixes", format!("'{p}' is not a valid IP subnet"))
                }),
                None => Err(ApiError::invalid_attr(
                    "prefixes",
                    format!("'{p}' is not a valid IP subnet"),
                )),
            })?;
            prefixes.push(c);
        }
        let Some(first) = prefixes.first() else {
            return Err(ApiError::bad_request(
                "Invalid input for prefixes. Reason: empty list".to_string(),
            ));
        };
        let version = first.version;
        if prefixes.iter().any(|p| p.version != version) {
            return Err(ApiError::bad_request(
                "Illegal subnetpool prefixes: mixed IP versions".to_string(),
            ));
        }
        let max_bits: u8 = if version == 4 { 32 } else { 128 };
        let min_default = prefixes.iter().map(|p| p.prefix).min().unwrap_or(8);
        let parse_len = |key: &str, dflt: u8| -> ApiResult<u8> {
            match input::opt_int(obj, key)? {
                None => Ok(dflt),
                Some(v) => u8::try_from(v).ok().filter(|l| *l <= max_bits).ok_or_else(|| {
                    ApiError::invalid_attr(key, format!("'{v}' is not a valid prefix length"))
                }),
            }
        };
        let min_prefixlen = parse_len(
            "min_prefixlen",
            if version == 4 { 8 } else { 64 }.min(min_default.max(1)),
        )?;
        let max_prefixlen = parse_len("max_prefixlen", max_bits)?;
        let default_prefixlen = parse_len("default_prefixlen", min_prefixlen)?;
        if default_prefixlen < min_prefixlen || default_prefixlen > max_prefixlen {
            return Err(ApiError::bad_request(format!(
                "Illegal prefix bounds: default_prefixlen={default_prefixlen}, min_prefixlen={min_prefixlen}, max_prefixlen={max_prefixlen}."
            )));
        }
        let mut std = std_from(obj, 0)?;
        std.tags = create_tags(obj)?;
        self.check_quota(&std.project_id, "subnetpool", 1)?;
        let pool = SubnetPool {
            prefixes,
            ip_version: version,
            default_prefixlen,
            min_prefixlen,
            max_prefixlen,
            shared: input::opt_bool(obj, "shared")?.unwrap_or(false),
            is_default: input::opt_bool(obj, "is_default")?.unwrap_or(false),
            std,
        };
        let id = pool.std.id.clone();
        self.subnetpools.insert(id.clone(), pool);
        Ok(self.render_subnetpool(&id))
    }

    pub fn update_subnetpool(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "subnetpool")?;
        input::check_attrs(
            obj,
            &[
                "name",
                "description",
                "prefixes",
                "default_prefixlen",
                "min_prefixlen",
                "max_prefixlen",
                "is_default",
                "default_quota",
            ],
            &["project_id", "tenant_id", "shared", "address_scope_id"],
            &[
                "id",
                "created_at",
                "updated_at",
                "revision_number",
                "ip_version",
                "tags",
            ],
            true,
        )?;
        let name = input::opt_str(obj, "name")?;
        let description = input::opt_str(obj, "description")?;
        let prefixes = input::opt_str_list(obj, "prefixes")?;
        let pool = self
            .subnetpools
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::SubnetPool, id))?;
        if let Some(v) = name {
            pool.std.name = v;
        }
        if let Some(v) = description {
            pool.std.description = v;
        }
        if let Some(list) = prefixes {
            let mut parsed = Vec::new();
            for p in &list {
                let c = Cidr::parse(p).map_err(|_| {
                    ApiError::invalid_attr("prefixes", format!("'{p}' is not a valid IP subnet"))
                })?;
                parsed.push(c);
            }
            // Neutron only allows growing a pool: every old prefix must stay covered.
            if !pool.prefixes.iter().all(|old| {
                parsed
                    .iter()
                    .any(|n| n.first() <= old.first() && old.last() <= n.last())
            }) {
                return Err(ApiError::bad_request(
                    "Illegal update to prefixes: prefixes can only be extended".to_string(),
                ));
            }
            pool.prefixes = parsed;
        }
        pool.std.bump();
        Ok(self.render_subnetpool(id))
    }

    pub fn delete_subnetpool(&mut self, id: &str) -> ApiResult<()> {
        if !self.subnetpools.contains_key(id) {
            return Err(ApiError::resource_not_found(Resource::SubnetPool, id));
        }
        if !self.pool_subnets(id).is_empty() {
            return Err(ApiError::conflict(
                "SubnetPoolInUse",
                format!("Subnet pool {id} cannot be deleted: it has allocated subnets."),
            ));
        }
        self.subnetpools.remove(id);
        Ok(())
    }

    pub fn render_subnetpool(&self, id: &str) -> Value {
        let Some(p) = self.subnetpools.get(id) else {
            return Value::Null;
        };
        let mut o = Obj::new();
        p.std.fill(&mut o);
        let prefixes: Vec<String> = p.prefixes.iter().map(|c| c.to_string()).collect();
        // The real server answers the prefix lengths as strings.
        for (k, v) in [
            ("default_prefixlen", json!(p.default_prefixlen.to_string())),
            ("min_prefixlen", json!(p.min_prefixlen.to_string())),
            ("max_prefixlen", json!(p.max_prefixlen.to_string())),
            ("is_default", json!(p.is_default)),
            ("shared", json!(p.shared)),
            ("prefixes", json!(prefixes)),
            ("ip_version", json!(p.ip_version)),
            ("default_quota", Value::Null),
            ("address_scope_id", Value::Null),
        ] {
            o.insert(k.into(), v);
        }
        Value::Object(o)
    }

    // ---------------------------------------------------------------- ports

    fn new_mac(&mut self) -> String {
        let mut rng = rand::rng();
        loop {
            let b: [u8; 3] = rng.random();
            let mac = format!("fa:16:3e:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2]);
            if self.macs.insert(mac.clone()) {
                return mac;
            }
        }
    }

    fn host_binds(&self, host: &str) -> bool {
        !host.is_empty()
            && match &self.agent_hosts {
                AgentHosts::Any => true,
                AgentHosts::Only(h) => h.contains(host),
            }
    }

    /// The port's binding, as ML2 with the openvswitch and sriovnicswitch mechanism drivers decides it with an
    /// OVS agent ([`OVS_BRIDGE_MAPPINGS`]) and a NIC Switch agent ([`SRIOV_DEVICE_MAPPINGS`]) on every agent host:
    /// - `normal` (and `direct` with the `switchdev` capability, OVS hardware offload): `ovs` on a VXLAN network or
    ///   a flat/VLAN network of a bridge-mapped physnet;
    /// - `direct` / `macvtap`: `hw_veb` on a flat/VLAN network of a device-mapped physnet;
    /// - anything else, another host or another network: `binding_failed`.
    pub fn binding(&self, p: &Port) -> Binding {
        if p.host.is_empty() {
            return Binding::Unbound;
        }
        if !self.host_binds(&p.host) {
            return Binding::Failed;
        }
        let Some(net) = self.networks.get(&p.network_id) else {
            return Binding::Failed;
        };
        let physnet = net.physical_network.as_deref().unwrap_or_default();
        let physical = net.network_type == "vlan" || net.network_type == "flat";
        let switchdev = p
            .profile
            .get("capabilities")
            .and_then(Value::as_array)
            .is_some_and(|c| c.iter().any(|c| c == "switchdev"));
        match p.vnic_type.as_str() {
            "normal" => {}
            "direct" if switchdev => {}
            "direct" | "macvtap" => {
                return if physical && SRIOV_DEVICE_MAPPINGS.iter().any(|m| m.0 == physnet) {
                    Binding::HwVeb {
                        vlan: net.segmentation_id.unwrap_or(0).to_string(),
                    }
                } else {
                    Binding::Failed
                };
            }
            _ => return Binding::Failed,
        }
        if net.network_type == "vxlan" || OVS_BRIDGE_MAPPINGS.iter().any(|m| m.0 == physnet) {
            Binding::Ovs
        } else {
            Binding::Failed
        }
    }

    fn port_binds(&self, id: &str) -> bool {
        self.ports.get(id).is_some_and(|p| self.binding(p).bound())
    }

    /// Allocates the requested fixed IPs (or the defaults) for a port on `network_id`. On error everything taken here
    /// is released again.
    /// MAC and addresses of one port being created; nothing stays taken on error.
    fn allocate_port(&mut self, obj: &Obj, network_id: &str) -> ApiResult<(String, Vec<FixedIp>)> {
        let mac = match input::opt_str(obj, "mac_address")? {
            Some(m) => {
                let m = m.to_ascii_lowercase();
                if !self.macs.insert(m.clone()) {
                    return Err(ApiError::conflict(
                        "MacAddressInUse",
                        format!(
                            "Unable to complete operation for network {network_id}. The mac address {m} is in use."
                        ),
                    ));
                }
                m
            }
            None => self.new_mac(),
        };
        let requested = input::opt_list(obj, "fixed_ips")?;
        let owner = input::opt_str(obj, "device_owner")?.unwrap_or_default();
        let addr = AddrCtx {
            mac: &mac,
            auto_addresses: owner != ROUTER_INTERFACE_OWNER,
        };
        match self.allocate_ips(network_id, requested.as_deref(), &[], addr) {
            Ok(ips) => Ok((mac, ips)),
            Err(e) => {
                self.macs.remove(&mac);
                Err(e)
            }
        }
    }

    fn allocate_ips(
        &mut self,
        network_id: &str,
        requested: Option<&[Value]>,
        keep: &[FixedIp],
        addr: AddrCtx<'_>,
    ) -> ApiResult<Vec<FixedIp>> {
        let mut taken: Vec<FixedIp> = Vec::new();
        let res = self.allocate_ips_inner(network_id, requested, keep, addr, &mut taken);
        if res.is_err() {
            // Give back only what this call took, not the addresses the port already had.
            for f in &taken {
                if keep.iter().any(|k| k.subnet_id == f.subnet_id && k.ip == f.ip) {
                    continue;
                }
                if let Some(s) = self.subnets.get_mut(&f.subnet_id) {
                    s.ipam.release(f.ip);
                }
            }
        }
        res.map(|()| taken)
    }

    /// The EUI-64 address of `mac` on an address-autoconfiguration (SLAAC / DHCPv6-stateless) subnet.
    fn take_auto_address(
        &mut self,
        sid: &str,
        mac: &str,
        keep: &[FixedIp],
        taken: &mut Vec<FixedIp>,
    ) -> ApiResult<()> {
        let Some(s) = self.subnets.get_mut(sid) else {
            return Ok(());
        };
        let ip = s.cidr.network | eui64_interface_id(mac);
        if let Some(k) = keep.iter().find(|k| k.subnet_id == sid && k.ip == ip) {
            taken.push(k.clone());
            return Ok(());
        }
        if s.ipam.allocate_specific(ip).is_err() {
            return Err(ApiError::conflict(
                "IpAddressAlreadyAllocated",
                format!(
                    "IP address {} already allocated in subnet {sid}",
                    ipam::format_ip(6, ip)
                ),
            ));
        }
        taken.push(FixedIp {
            subnet_id: sid.to_string(),
            version: 6,
            ip,
        });
        Ok(())
    }

    fn allocate_ips_inner(
        &mut self,
        network_id: &str,
        requested: Option<&[Value]>,
        keep: &[FixedIp],
        addr: AddrCtx<'_>,
        taken: &mut Vec<FixedIp>,
    ) -> ApiResult<()> {
        let net_subnets: Vec<String> = self
            .networks
            .get(network_id)
            .map(|n| n.subnets.clone())
            .unwrap_or_default();
        let auto_subnets: Vec<String> = net_subnets
            .iter()
            .filter(|id| self.subnets.get(*id).is_some_and(Subnet::is_auto_address))
            .cloned()
            .collect();
        let exhausted = || {
            ApiError::conflict(
                "IpAddressGenerationFailure",
                format!("No more IP addresses available on network {network_id}."),
            )
        };
        let Some(requested) = requested else {
            // Default: one address per IP version, from the first subnet of that version with room.
            for version in [4u8, 6u8] {
                let candidates: Vec<&String> = net_subnets
                    .iter()
                    .filter(|id| {
                        self.subnets
                            .get(*id)
                            .is_some_and(|s| s.cidr.version == version && !s.is_auto_address())
                    })
                    .collect();
                if candidates.is_empty() {
                    continue;
                }
                let Some(sid) = candidates
                    .into_iter()
                    .find(|id| self.subnets.get(*id).is_some_and(|s| s.ipam.has_free()))
                    .cloned()
                else {
                    if version == 4 {
                        return Err(exhausted());
                    }
                    continue;
                };
                if let Some(s) = self.subnets.get_mut(&sid) {
                    let ip = s.ipam.allocate_any().map_err(|_| exhausted())?;
                    taken.push(FixedIp {
                        subnet_id: sid,
                        version,
                        ip,
                    });
                }
            }
            if addr.auto_addresses {
                for sid in &auto_subnets {
                    self.take_auto_address(sid, addr.mac, keep, taken)?;
                }
            }
            return Ok(());
        };
        for item in requested {
            let Value::Object(fip) = item else {
                return Err(ApiError::invalid_attr(
                    "fixed_ips",
                    format!("'{item}' is not a dictionary"),
                ));
            };
            for k in fip.keys() {
                if k != "subnet_id" && k != "ip_address" {
                    return Err(ApiError::invalid_attr(
                        "fixed_ips",
                        format!("Unrecognized key '{k}' in fixed_ips"),
                    ));
                }
            }
            let subnet_id = input::opt_str(fip, "subnet_id")?;
            let ip_str = input::opt_str(fip, "ip_address")?;
            let ip = match &ip_str {
                None => None,
                Some(s) => Some(ipam::parse_ip(s).ok_or_else(|| {
                    ApiError::invalid_attr("fixed_ips", format!("'{s}' is not a valid IP address"))
                })?),
            };
            let sid = match (&subnet_id, ip) {
                (Some(sid), _) => {
                    let s = self.subnets.get(sid).ok_or_else(|| ApiError::resource_not_found(Resource::Subnet, sid))?;
                    if s.network_id != network_id {
                        return Err(ApiError::invalid_input(format!(
                            "Failed to create port on network {network_id}, because fixed_ips included invalid subnet {sid}"
                        )));
                    }
                    if let Some((v, ip)) = ip
                        && !s.cidr.contains(v, ip)
                    {
                        return Err(ApiError::bad_request(format!(
                            "IP address {} is not a valid IP for the specified subnet.",
                            ip_str.clone().unwrap_or_default()
                        ))
                        .with_kind("InvalidIpForSubnet"));
                    }
                    sid.clone()
                }
                (None, Some((v, ip))) => net_subnets
                    .iter()
                    .find(|id| self.subnets.get(*id).is_some_and(|s| s.cidr.contains(v, ip)))
                    .cloned()
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "IP address {} is not a valid IP for any of the subnets on the specified network.",
                            ip_str.clone().unwrap_or_default()
                        ))
                        .with_kind("InvalidIpForNetwork")
                    })?,
                (None, None) => {
                    return Err(ApiError::invalid_attr("fixed_ips", "Exactly one of subnet_id or ip_address is required"));
                }
            };
            if let Some((_, ip)) = ip
                && let Some(k) = keep.iter().find(|k| k.subnet_id == sid && k.ip == ip)
            {
                taken.push(k.clone());
                continue;
            }
            if ip.is_none() && auto_subnets.contains(&sid) {
                self.take_auto_address(&sid, addr.mac, keep, taken)?;
                continue;
            }
            let Some(s) = self.subnets.get_mut(&sid) else {
                continue;
            };
            let version = s.cidr.version;
            match ip {
                Some((_, ip)) => match s.ipam.allocate_specific(ip) {
                    Ok(()) => taken.push(FixedIp {
                        subnet_id: sid,
                        version,
                        ip,
                    }),
                    Err(_) => {
                        return Err(ApiError::conflict(
                            "IpAddressAlreadyAllocated",
                            format!(
                                "IP address {} already allocated in subnet {sid}",
                                ipam::format_ip(version, ip)
                            ),
                        ));
                    }
                },
                None => match s.ipam.allocate_any() {
                    Ok(ip) => taken.push(FixedIp {
                        subnet_id: sid,
                        version,
                        ip,
                    }),
                    Err(AllocError::Exhausted | AllocError::AlreadyAllocated) => return Err(exhausted()),
                },
            }
        }
        // Autoconfiguration subnets always give the port its EUI-64 address, asked for or not.
        if addr.auto_addresses {
            for sid in &auto_subnets {
                if !taken.iter().any(|f| &f.subnet_id == sid) {
                    self.take_auto_address(sid, addr.mac, keep, taken)?;
                }
            }
        }
        Ok(())
    }

    fn validate_sgs(&self, sgs: &[String]) -> ApiResult<()> {
        for sg in sgs {
            if !self.security_groups.contains_key(sg) {
                return Err(ApiError::resource_not_found(Resource::SecurityGroup, sg));
            }
        }
        Ok(())
    }

    /// Creates one or many ports atomically. `bulk` only changes how the caller wraps the answer.
    pub fn create_ports(&mut self, items: &[&Obj]) -> ApiResult<Vec<String>> {
        const WRITABLE: [&str; 14] = [
            "name",
            "description",
            "admin_state_up",
            "device_id",
            "device_owner",
            "fixed_ips",
            "security_groups",
            "port_security_enabled",
            "binding:host_id",
            "binding:profile",
            "binding:vnic_type",
            "allowed_address_pairs",
            "extra_dhcp_opts",
            "mac_address",
        ];
        // Validate everything first (no state change).
        struct Spec<'a> {
            obj: &'a Obj,
            std: Std,
            network_id: String,
        }
        let mut specs = Vec::with_capacity(items.len());
        for obj in items {
            input::check_attrs(
                obj,
                &WRITABLE,
                &["project_id", "tenant_id", "network_id", "tags", "ip_allocation"],
                &[
                    "id",
                    "created_at",
                    "updated_at",
                    "revision_number",
                    "status",
                    "binding:vif_type",
                    "binding:vif_details",
                    "trunk_details",
                ],
                false,
            )?;
            let network_id = input::req_str(obj, "network_id")?;
            let mut std = std_from(obj, 1)?;
            std.tags = create_tags(obj)?;
            if !std.tags.is_empty() {
                std.revision += 1;
            }
            if !self.networks.contains_key(&network_id) {
                return Err(ApiError::resource_not_found(Resource::Network, &network_id));
            }
            for k in ["admin_state_up", "port_security_enabled"] {
                input::opt_bool(obj, k)?;
            }
            for k in [
                "device_id",
                "device_owner",
                "binding:host_id",
                "binding:vnic_type",
                "name",
                "description",
            ] {
                input::opt_str(obj, k)?;
            }
            if let Some(sgs) = input::opt_str_list(obj, "security_groups")? {
                self.validate_sgs(&sgs)?;
            }
            if let Some(mac) = input::opt_str(obj, "mac_address")? {
                validate_mac(&mac)?;
                if self.macs.contains(&mac.to_ascii_lowercase()) {
                    return Err(ApiError::conflict(
                        "MacAddressInUse",
                        format!(
                            "Unable to complete operation for network {network_id}. The mac address {mac} is in use."
                        ),
                    ));
                }
            }
            input::opt_obj(obj, "binding:profile")?;
            vnic_type(obj)?;
            input::opt_list(obj, "fixed_ips")?;
            if let Some(aap) = input::opt_list(obj, "allowed_address_pairs")? {
                normalize_aap(&aap, "fa:16:3e:00:00:00")?;
                let ps = input::opt_bool(obj, "port_security_enabled")?.unwrap_or_else(|| {
                    self.networks
                        .get(&network_id)
                        .is_none_or(|n| n.port_security_enabled)
                });
                if !ps && !aap.is_empty() {
                    return Err(aap_needs_port_security());
                }
            }
            if let Some(opts) = input::opt_list(obj, "extra_dhcp_opts")? {
                normalize_dhcp_opts(&opts)?;
            }
            specs.push(Spec { obj, std, network_id });
        }
        let mut per_project: HashMap<&str, usize> = HashMap::new();
        for s in &specs {
            *per_project.entry(s.std.project_id.as_str()).or_default() += 1;
        }
        for (project, n) in &per_project {
            self.check_quota(project, "port", *n)?;
        }
        // Allocate addresses; undo all of this request's allocations on the first failure.
        // MACs first: SLAAC addresses derive from them. Everything taken here is given back on failure.
        let mut allocations: Vec<(String, Vec<FixedIp>)> = Vec::with_capacity(specs.len());
        for s in &specs {
            let result = self.allocate_port(s.obj, &s.network_id);
            match result {
                Ok(a) => allocations.push(a),
                Err(e) => {
                    for (mac, ips) in &allocations {
                        self.macs.remove(mac);
                        for f in ips {
                            if let Some(sub) = self.subnets.get_mut(&f.subnet_id) {
                                sub.ipam.release(f.ip);
                            }
                        }
                    }
                    return Err(e);
                }
            }
        }
        let mut ids = Vec::with_capacity(specs.len());
        for (s, (mac, fixed_ips)) in specs.into_iter().zip(allocations) {
            let obj = s.obj;
            let project = s.std.project_id.clone();
            let net_ps = self
                .networks
                .get(&s.network_id)
                .is_none_or(|n| n.port_security_enabled);
            let port_security_enabled = input::opt_bool(obj, "port_security_enabled")?.unwrap_or(net_ps);
            let device_owner = input::opt_str(obj, "device_owner")?.unwrap_or_default();
            let security_groups = match input::opt_str_list(obj, "security_groups")? {
                Some(sgs) => sgs,
                None if port_security_enabled && !device_owner.starts_with("network:") => {
                    vec![self.ensure_default_sg(&project)]
                }
                None => Vec::new(),
            };
            let host = input::opt_str(obj, "binding:host_id")?.unwrap_or_default();
            let allowed_address_pairs = match input::opt_list(obj, "allowed_address_pairs")? {
                Some(a) => normalize_aap(&a, &mac)?,
                None => json!([]),
            };
            let extra_dhcp_opts = match input::opt_list(obj, "extra_dhcp_opts")? {
                Some(o) => normalize_dhcp_opts(&o)?,
                None => json!([]),
            };
            let mut port = Port {
                network_id: s.network_id,
                mac,
                admin_state_up: input::opt_bool(obj, "admin_state_up")?.unwrap_or(true),
                status: "DOWN".into(),
                device_id: input::opt_str(obj, "device_id")?.unwrap_or_default(),
                device_owner,
                fixed_ips,
                port_security_enabled,
                security_groups,
                vnic_type: vnic_type(obj)?.unwrap_or_else(|| "normal".into()),
                profile: input::opt_obj(obj, "binding:profile")?
                    .map(Value::Object)
                    .unwrap_or(json!({})),
                host,
                allowed_address_pairs,
                extra_dhcp_opts,
                bind_gen: 0,
                std: s.std,
            };
            if !port.host.is_empty() {
                // Binding at creation writes the binding rows twice more (revision 3 on the real server).
                port.std.revision += 2;
            }
            let id = port.std.id.clone();
            if !port.host.is_empty() {
                self.seen_hosts.insert(port.host.clone());
            }
            self.ports.insert(id.clone(), port);
            if self.port_binds(&id) {
                self.activations.push(Activation::Port {
                    id: id.clone(),
                    generation: 0,
                });
            }
            ids.push(id);
        }
        Ok(ids)
    }

    pub fn update_port(&mut self, id: &str, body: &Value, if_match: Option<u64>) -> ApiResult<Value> {
        let obj = input::member(body, "port")?;
        input::check_attrs(
            obj,
            &[
                "name",
                "description",
                "admin_state_up",
                "device_id",
                "device_owner",
                "fixed_ips",
                "security_groups",
                "port_security_enabled",
                "binding:host_id",
                "binding:profile",
                "binding:vnic_type",
                "allowed_address_pairs",
                "extra_dhcp_opts",
                "mac_address",
            ],
            &["project_id", "tenant_id", "network_id", "ip_allocation"],
            &[
                "id",
                "created_at",
                "updated_at",
                "revision_number",
                "status",
                "binding:vif_type",
                "binding:vif_details",
                "tags",
                "trunk_details",
            ],
            true,
        )?;
        let port = self
            .ports
            .get(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Port, id))?;
        check_revision(if_match, port.std.revision)?;
        let network_id = port.network_id.clone();
        let old_ips = port.fixed_ips.clone();
        let name = input::opt_str(obj, "name")?;
        let description = input::opt_str(obj, "description")?;
        let admin = input::opt_bool(obj, "admin_state_up")?;
        let device_id = input::opt_str(obj, "device_id")?;
        let device_owner = input::opt_str(obj, "device_owner")?;
        let ps = input::opt_bool(obj, "port_security_enabled")?;
        let host = match obj.get("binding:host_id") {
            Some(Value::Null) => Some(String::new()),
            _ => input::opt_str(obj, "binding:host_id")?,
        };
        let profile = input::opt_obj(obj, "binding:profile")?;
        let vnic = vnic_type(obj)?;
        let new_mac = input::opt_str(obj, "mac_address")?.map(|m| m.to_ascii_lowercase());
        let aap = match input::opt_list(obj, "allowed_address_pairs")? {
            Some(a) => Some(normalize_aap(&a, new_mac.as_deref().unwrap_or(&port.mac))?),
            None => None,
        };
        let dhcp = match input::opt_list(obj, "extra_dhcp_opts")? {
            Some(o) => Some(normalize_dhcp_opts(&o)?),
            None => None,
        };
        let final_aap_nonempty = match &aap {
            Some(a) => a.as_array().is_some_and(|a| !a.is_empty()),
            None => port
                .allowed_address_pairs
                .as_array()
                .is_some_and(|a| !a.is_empty()),
        };
        if !input::opt_bool(obj, "port_security_enabled")?.unwrap_or(port.port_security_enabled)
            && final_aap_nonempty
        {
            return Err(aap_needs_port_security());
        }
        let sgs = input::opt_str_list(obj, "security_groups")?;
        if let Some(s) = &sgs {
            self.validate_sgs(s)?;
        }
        let mac = input::opt_str(obj, "mac_address")?;
        if let Some(m) = &mac {
            validate_mac(m)?;
            if port.mac != m.to_ascii_lowercase() && self.macs.contains(&m.to_ascii_lowercase()) {
                return Err(ApiError::conflict(
                    "MacAddressInUse",
                    format!(
                        "Unable to complete operation for network {network_id}. The mac address {m} is in use."
                    ),
                ));
            }
            if !port.host.is_empty() && port.mac != m.to_ascii_lowercase() {
                return Err(ApiError::conflict(
                    "PortBound",
                    format!(
                        "Unable to complete operation on port {id}, port is already bound, port type: ovs, old_mac {}, new_mac {m}.",
                        port.mac
                    ),
                ));
            }
        }
        let final_ps = ps.unwrap_or(port.port_security_enabled);
        let final_sgs_nonempty = sgs
            .as_ref()
            .map(|s| !s.is_empty())
            .unwrap_or(!port.security_groups.is_empty());
        if !final_ps && final_sgs_nonempty && sgs.is_none() && ps.is_some() {
            return Err(ApiError::conflict(
                "PortSecurityPortHasSecurityGroup",
                "Port has security group associated. Cannot disable port security or IP address until security group is removed.",
            ));
        }
        if !final_ps && final_sgs_nonempty && (ps.is_some() || sgs.is_some()) {
            return Err(ApiError::conflict(
                "PortSecurityAndIPRequiredForSecurityGroups",
                "Port security must be enabled and port must have an IP address in order to use security groups.",
            ));
        }
        let new_ips = match input::opt_list(obj, "fixed_ips")? {
            Some(list) => {
                let mac = port.mac.clone();
                let addr = AddrCtx {
                    mac: &mac,
                    auto_addresses: port.device_owner != ROUTER_INTERFACE_OWNER,
                };
                Some(self.allocate_ips(&network_id, Some(&list), &old_ips, addr)?)
            }
            None => None,
        };
        if let Some(new_ips) = &new_ips {
            for old in &old_ips {
                if !new_ips
                    .iter()
                    .any(|n| n.subnet_id == old.subnet_id && n.ip == old.ip)
                    && let Some(s) = self.subnets.get_mut(&old.subnet_id)
                {
                    s.ipam.release(old.ip);
                }
            }
        }
        if let Some(m) = &mac
            && let Some(p) = self.ports.get(id)
        {
            let old = p.mac.clone();
            self.macs.remove(&old);
            self.macs.insert(m.to_ascii_lowercase());
        }
        let is_parent = self.parent_of.get(id).cloned();
        let Some(port) = self.ports.get_mut(id) else {
            return Err(ApiError::resource_not_found(Resource::Port, id));
        };
        let mut binding_changed = false;
        if let Some(v) = name {
            port.std.name = v;
        }
        if let Some(v) = description {
            port.std.description = v;
        }
        if let Some(v) = admin {
            port.admin_state_up = v;
        }
        if let Some(v) = device_id {
            port.device_id = v;
        }
        if let Some(v) = device_owner {
            port.device_owner = v;
        }
        if let Some(v) = ps {
            port.port_security_enabled = v;
        }
        if let Some(v) = sgs {
            port.security_groups = v;
        }
        if let Some(v) = profile {
            port.profile = Value::Object(v);
        }
        if let Some(v) = vnic {
            port.vnic_type = v;
        }
        if let Some(v) = aap {
            port.allowed_address_pairs = v;
        }
        if let Some(v) = dhcp {
            port.extra_dhcp_opts = v;
        }
        if let Some(v) = mac {
            port.mac = v.to_ascii_lowercase();
        }
        if let Some(v) = new_ips {
            port.fixed_ips = v;
        }
        if let Some(h) = host
            && h != port.host
        {
            port.host = h;
            port.bind_gen += 1;
            port.status = "DOWN".into();
            binding_changed = true;
        }
        port.std.bump();
        if binding_changed {
            // binding + status rows: the real server bumps the revision three times for a (re)bind.
            port.std.revision += 2;
        }
        let host_now = port.host.clone();
        let generation = port.bind_gen;
        if binding_changed {
            if !host_now.is_empty() {
                self.seen_hosts.insert(host_now.clone());
            }
            if self.port_binds(id) {
                self.activations.push(Activation::Port {
                    id: id.to_string(),
                    generation,
                });
            }
            if let Some(trunk_id) = is_parent {
                self.wire_trunk(&trunk_id, &host_now);
            }
        }
        Ok(self.render_port(id))
    }

    /// The parent's binding changed: bind (or leave) the subports and schedule the trunk's activation.
    fn wire_trunk(&mut self, trunk_id: &str, host: &str) {
        let binds = self.host_binds(host);
        let Some(trunk) = self.trunks.get_mut(trunk_id) else {
            return;
        };
        trunk.generation += 1;
        trunk.status = "DOWN".into();
        let generation = trunk.generation;
        let subs: Vec<String> = trunk.sub_ports.iter().map(|s| s.port_id.clone()).collect();
        if binds {
            self.activations.push(Activation::Trunk {
                id: trunk_id.to_string(),
                generation,
            });
            for sp in subs {
                self.bind_subport(&sp, host);
            }
        }
    }

    fn bind_subport(&mut self, port_id: &str, host: &str) {
        if let Some(p) = self.ports.get_mut(port_id) {
            p.device_owner = TRUNK_SUBPORT_OWNER.into();
            if p.host != host {
                p.host = host.to_string();
                p.bind_gen += 1;
                p.status = "DOWN".into();
                p.std.revision += 2;
            }
            p.std.bump();
            let generation = p.bind_gen;
            if self.port_binds(port_id) {
                self.activations.push(Activation::Port {
                    id: port_id.to_string(),
                    generation,
                });
            }
        }
    }

    pub fn delete_port(&mut self, id: &str, if_match: Option<u64>) -> ApiResult<()> {
        let port = self
            .ports
            .get(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Port, id))?;
        check_revision(if_match, port.std.revision)?;
        if let Some(t) = self.subport_of.get(id) {
            return Err(ApiError::conflict(
                "PortInUseAsSubPort",
                format!("Port {id} is currently a subport for trunk {t}."),
            ));
        }
        if let Some(t) = self.parent_of.get(id) {
            return Err(ApiError::conflict(
                "PortInUseAsTrunkParent",
                format!("Port {id} is currently a parent port for trunk {t}."),
            ));
        }
        self.remove_port(id);
        Ok(())
    }

    fn remove_port(&mut self, id: &str) {
        if let Some(p) = self.ports.remove(id) {
            for f in &p.fixed_ips {
                if let Some(s) = self.subnets.get_mut(&f.subnet_id) {
                    s.ipam.release(f.ip);
                }
            }
            self.macs.remove(&p.mac);
        }
    }

    pub fn render_port(&self, id: &str) -> Value {
        let Some(p) = self.ports.get(id) else {
            return Value::Null;
        };
        let mut o = Obj::new();
        p.std.fill(&mut o);
        let fixed: Vec<Value> = p
            .fixed_ips
            .iter()
            .map(|f| json!({"subnet_id": f.subnet_id, "ip_address": ipam::format_ip(f.version, f.ip)}))
            .collect();
        let (vif_type, vif_details) = match self.binding(p) {
            Binding::Unbound => ("unbound", json!({})),
            Binding::Ovs => (
                "ovs",
                json!({"connectivity": "l2", "port_filter": true, "ovs_hybrid_plug": false, "ovs_create_tap": true,
                       "datapath_type": "system", "bridge_name": "br-int", "bound_drivers": {"0": "openvswitch"}}),
            ),
            Binding::HwVeb { vlan } => (
                "hw_veb",
                json!({"port_filter": false, "connectivity": "l2", "vlan": vlan,
                       "bound_drivers": {"0": "sriovnicswitch"}}),
            ),
            Binding::Failed => ("binding_failed", json!({})),
        };
        for (k, v) in [
            ("network_id", json!(p.network_id)),
            ("mac_address", json!(p.mac)),
            ("admin_state_up", json!(p.admin_state_up)),
            ("status", json!(p.status)),
            ("device_id", json!(p.device_id)),
            ("device_owner", json!(p.device_owner)),
            ("fixed_ips", json!(fixed)),
            ("allowed_address_pairs", p.allowed_address_pairs.clone()),
            ("extra_dhcp_opts", p.extra_dhcp_opts.clone()),
            ("security_groups", json!(p.security_groups)),
            ("binding:vnic_type", json!(p.vnic_type)),
            ("binding:profile", p.profile.clone()),
            ("binding:host_id", json!(p.host)),
            ("binding:vif_type", json!(vif_type)),
            ("binding:vif_details", vif_details),
            ("port_security_enabled", json!(p.port_security_enabled)),
            ("ip_allocation", json!("immediate")),
        ] {
            o.insert(k.into(), v);
        }
        if let Some(t) = self.parent_of.get(id).and_then(|t| self.trunks.get(t)) {
            let subs: Vec<Value> = t
                .sub_ports
                .iter()
                .map(|s| {
                    json!({"segmentation_id": s.segmentation_id, "segmentation_type": s.segmentation_type,
                           "port_id": s.port_id, "mac_address": self.ports.get(&s.port_id).map(|p| p.mac.clone())})
                })
                .collect();
            o.insert(
                "trunk_details".into(),
                json!({"trunk_id": t.std.id, "sub_ports": subs}),
            );
        }
        Value::Object(o)
    }

    /// Flips a port or trunk to ACTIVE if nothing changed since the activation was scheduled.
    pub fn activate(&mut self, a: &Activation) {
        match a {
            Activation::Port { id, generation } => {
                if let Some(p) = self.ports.get_mut(id)
                    && p.bind_gen == *generation
                    && !p.host.is_empty()
                    && p.status != "ACTIVE"
                {
                    p.status = "ACTIVE".into();
                    p.std.bump();
                }
            }
            Activation::Trunk { id, generation } => {
                if let Some(t) = self.trunks.get_mut(id)
                    && t.generation == *generation
                {
                    t.status = "ACTIVE".into();
                }
            }
        }
    }

    // ---------------------------------------------------------------- trunks

    fn parse_subports(&self, obj: &Obj, key: &str, need_segmentation: bool) -> ApiResult<Vec<SubPort>> {
        let items = input::opt_list(obj, key)?.unwrap_or_default();
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let Value::Object(sp) = &item else {
                return Err(ApiError::invalid_attr(
                    key,
                    format!("'{}' is not a dictionary", input::show(&item)),
                ));
            };
            let port_id = input::req_str(sp, "port_id")?;
            if !need_segmentation {
                out.push(SubPort {
                    port_id,
                    segmentation_type: String::new(),
                    segmentation_id: 0,
                });
                continue;
            }
            let seg_type = input::opt_str(sp, "segmentation_type")?;
            let seg_id = input::opt_int(sp, "segmentation_id")?;
            let (Some(seg_type), Some(seg_id)) = (seg_type, seg_id) else {
                return Err(ApiError::invalid_input(format!(
                    "Invalid subport details '{{'port_id': '{port_id}'}}': missing segmentation information. Must specify both segmentation_id and segmentation_type"
                )));
            };
            if seg_type != "vlan" {
                return Err(ApiError::invalid_input(format!(
                    "Segmentation type '{seg_type}' is not supported"
                )));
            }
            if !(1..=4094).contains(&seg_id) {
                return Err(ApiError::invalid_input(format!(
                    "Segmentation ID '{seg_id}' is not in range"
                )));
            }
            out.push(SubPort {
                port_id,
                segmentation_type: seg_type,
                segmentation_id: u32::try_from(seg_id).unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// Validates subports to add to `trunk_id` (or to a trunk being created on `parent`).
    fn validate_new_subports(&self, trunk_id: &str, existing: &[SubPort], new: &[SubPort]) -> ApiResult<()> {
        let mut seen_ids: Vec<u32> = existing.iter().map(|s| s.segmentation_id).collect();
        let mut seen_ports: Vec<&str> = Vec::new();
        for sp in new {
            let Some(port) = self.ports.get(&sp.port_id) else {
                return Err(ApiError::resource_not_found(Resource::Port, &sp.port_id));
            };
            // The real server refuses a port that already has a device (e.g. a device_id set at
            // creation) as a subport.
            if !port.device_id.is_empty() && !self.subport_of.contains_key(&sp.port_id) {
                return Err(ApiError::conflict(
                    "PortInUse",
                    format!(
                        "Unable to complete operation on port {} for network {}. Port already has an attached device {}.",
                        sp.port_id, port.network_id, port.device_id
                    ),
                ));
            }
            if self.parent_of.contains_key(&sp.port_id) {
                return Err(ApiError::conflict(
                    "ParentPortInUse",
                    format!(
                        "Port {} is currently in use and is not eligible for use as a parent port.",
                        sp.port_id
                    ),
                ));
            }
            if self.subport_of.contains_key(&sp.port_id) || seen_ports.contains(&sp.port_id.as_str()) {
                return Err(ApiError::conflict(
                    "TrunkPortInUse",
                    format!("Port {} is in use by another trunk.", sp.port_id),
                ));
            }
            if seen_ids.contains(&sp.segmentation_id) {
                return Err(ApiError::conflict(
                    "DuplicateSubPort",
                    format!(
                        "segmentation_type vlan and segmentation_id {} already in use on trunk {trunk_id}.",
                        sp.segmentation_id
                    ),
                ));
            }
            seen_ids.push(sp.segmentation_id);
            seen_ports.push(&sp.port_id);
        }
        Ok(())
    }

    pub fn create_trunk(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "trunk")?;
        input::check_attrs(
            obj,
            &["name", "description", "admin_state_up"],
            &["project_id", "tenant_id", "tags", "port_id", "sub_ports"],
            &["id", "created_at", "updated_at", "revision_number", "status"],
            false,
        )?;
        let port_id = input::req_str(obj, "port_id")?;
        let subs = self.parse_subports(obj, "sub_ports", true)?;
        let mut std = std_from(obj, 0)?;
        std.tags = create_tags(obj)?;
        let parent = self
            .ports
            .get(&port_id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Port, &port_id))?;
        if self.parent_of.contains_key(&port_id) || self.subport_of.contains_key(&port_id) {
            return Err(ApiError::conflict(
                "TrunkPortInUse",
                format!("Port {port_id} is in use by another trunk."),
            ));
        }
        // The OVS trunk driver only accepts unbound parents; Nova binds them afterwards.
        if !parent.host.is_empty() {
            return Err(ApiError::conflict(
                "ParentPortInUse",
                format!("Port {port_id} is currently in use and is not eligible for use as a parent port."),
            ));
        }
        if subs.iter().any(|s| s.port_id == port_id) {
            return Err(ApiError::conflict(
                "TrunkPortInUse",
                format!("Port {port_id} is in use by another trunk."),
            ));
        }
        self.validate_new_subports(&std.id, &[], &subs)?;
        self.check_quota(&std.project_id, "trunk", 1)?;
        let trunk = Trunk {
            port_id: port_id.clone(),
            status: "DOWN".into(),
            admin_state_up: input::opt_bool(obj, "admin_state_up")?.unwrap_or(true),
            sub_ports: subs.clone(),
            generation: 0,
            std,
        };
        let id = trunk.std.id.clone();
        self.trunks.insert(id.clone(), trunk);
        self.parent_of.insert(port_id, id.clone());
        for s in &subs {
            self.subport_of.insert(s.port_id.clone(), id.clone());
        }
        Ok(self.render_trunk(&id))
    }

    pub fn update_trunk(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "trunk")?;
        input::check_attrs(
            obj,
            &["name", "description", "admin_state_up"],
            &["project_id", "tenant_id", "port_id", "sub_ports"],
            &[
                "id",
                "created_at",
                "updated_at",
                "revision_number",
                "status",
                "tags",
            ],
            true,
        )?;
        let name = input::opt_str(obj, "name")?;
        let description = input::opt_str(obj, "description")?;
        let admin = input::opt_bool(obj, "admin_state_up")?;
        let t = self
            .trunks
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Trunk, id))?;
        if let Some(v) = name {
            t.std.name = v;
        }
        if let Some(v) = description {
            t.std.description = v;
        }
        if let Some(v) = admin {
            t.admin_state_up = v;
        }
        t.std.bump();
        Ok(self.render_trunk(id))
    }

    pub fn delete_trunk(&mut self, id: &str) -> ApiResult<()> {
        let t = self
            .trunks
            .get(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Trunk, id))?;
        let parent_bound = self.ports.get(&t.port_id).is_some_and(|p| !p.host.is_empty());
        if parent_bound {
            return Err(ApiError::conflict(
                "TrunkInUse",
                format!("Trunk {id} is currently in use."),
            ));
        }
        if let Some(t) = self.trunks.remove(id) {
            self.parent_of.remove(&t.port_id);
            for s in t.sub_ports {
                self.subport_of.remove(&s.port_id);
                self.release_subport(&s.port_id);
            }
        }
        Ok(())
    }

    fn release_subport(&mut self, port_id: &str) {
        if let Some(p) = self.ports.get_mut(port_id)
            && p.device_owner == TRUNK_SUBPORT_OWNER
        {
            p.device_owner.clear();
            p.host.clear();
            p.bind_gen += 1;
            p.status = "DOWN".into();
            p.std.bump();
        }
    }

    pub fn add_subports(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = body
            .as_object()
            .ok_or_else(|| ApiError::bad_request("Body contains invalid data"))?;
        if !obj.contains_key("sub_ports") {
            return Err(ApiError::bad_request(
                "Unable to find 'sub_ports' in request body",
            ));
        }
        let subs = self.parse_subports(obj, "sub_ports", true)?;
        let t = self
            .trunks
            .get(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Trunk, id))?;
        if subs.iter().any(|s| s.port_id == t.port_id) {
            return Err(ApiError::conflict(
                "ParentPortInUse",
                format!(
                    "Port {} is currently in use and is not eligible for use as a parent port.",
                    t.port_id
                ),
            ));
        }
        self.validate_new_subports(id, &t.sub_ports, &subs)?;
        let parent_host = self
            .ports
            .get(&t.port_id)
            .map(|p| p.host.clone())
            .unwrap_or_default();
        for s in &subs {
            self.subport_of.insert(s.port_id.clone(), id.to_string());
        }
        if let Some(t) = self.trunks.get_mut(id) {
            t.sub_ports.extend(subs.iter().cloned());
        }
        if !parent_host.is_empty() {
            // The agent rewires the trunk: DOWN until the new subports are up.
            self.wire_trunk(id, &parent_host);
        }
        Ok(self.render_trunk(id))
    }

    pub fn remove_subports(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = body
            .as_object()
            .ok_or_else(|| ApiError::bad_request("Body contains invalid data"))?;
        if !obj.contains_key("sub_ports") {
            return Err(ApiError::bad_request(
                "Unable to find 'sub_ports' in request body",
            ));
        }
        let subs = self.parse_subports(obj, "sub_ports", false)?;
        let t = self
            .trunks
            .get(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Trunk, id))?;
        for s in &subs {
            if !t.sub_ports.iter().any(|x| x.port_id == s.port_id) {
                return Err(ApiError::not_found(
                    "SubPortNotFound",
                    format!("SubPort {} on trunk {id} could not be found.", s.port_id),
                ));
            }
        }
        let parent_bound = self.port_binds(&t.port_id);
        if let Some(t) = self.trunks.get_mut(id) {
            t.sub_ports
                .retain(|x| !subs.iter().any(|s| s.port_id == x.port_id));
            // The agent unwires the VLANs: the real trunk answers DOWN and comes back ACTIVE afterwards.
            if parent_bound {
                t.generation += 1;
                t.status = "DOWN".into();
                self.activations.push(Activation::Trunk {
                    id: id.to_string(),
                    generation: t.generation,
                });
            }
        }
        for s in &subs {
            self.subport_of.remove(&s.port_id);
            // The agent unplugs the VLAN: DOWN, binding and owner stay (what the real server shows).
            if let Some(p) = self.ports.get_mut(&s.port_id) {
                p.bind_gen += 1;
                if p.status != "DOWN" {
                    p.status = "DOWN".into();
                    p.std.bump();
                }
            }
        }
        Ok(self.render_trunk(id))
    }

    pub fn render_trunk(&self, id: &str) -> Value {
        let Some(t) = self.trunks.get(id) else {
            return Value::Null;
        };
        let mut o = Obj::new();
        t.std.fill(&mut o);
        o.remove("name");
        o.insert("name".into(), json!(t.std.name));
        let subs: Vec<Value> = t.sub_ports.iter().map(render_subport).collect();
        o.insert("admin_state_up".into(), json!(t.admin_state_up));
        o.insert("port_id".into(), json!(t.port_id));
        o.insert("status".into(), json!(t.status));
        o.insert("sub_ports".into(), json!(subs));
        Value::Object(o)
    }

    // ---------------------------------------------------------------- routers

    pub fn create_router(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "router")?;
        input::check_attrs(
            obj,
            &[
                "name",
                "description",
                "admin_state_up",
                "external_gateway_info",
                "routes",
            ],
            &[
                "project_id",
                "tenant_id",
                "tags",
                "distributed",
                "ha",
                "availability_zone_hints",
                "flavor_id",
            ],
            &["id", "created_at", "updated_at", "revision_number", "status"],
            false,
        )?;
        let mut std = std_from(obj, 1)?;
        std.tags = create_tags(obj)?;
        self.check_quota(&std.project_id, "router", 1)?;
        let r = Router {
            admin_state_up: input::opt_bool(obj, "admin_state_up")?.unwrap_or(true),
            routes: input::opt_list(obj, "routes")?
                .map(Value::Array)
                .unwrap_or(json!([])),
            external_gateway_info: obj.get("external_gateway_info").cloned().unwrap_or(Value::Null),
            std,
        };
        let id = r.std.id.clone();
        self.routers.insert(id.clone(), r);
        Ok(self.render_router(&id))
    }

    pub fn update_router(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "router")?;
        input::check_attrs(
            obj,
            &[
                "name",
                "description",
                "admin_state_up",
                "external_gateway_info",
                "routes",
            ],
            &[
                "project_id",
                "tenant_id",
                "distributed",
                "ha",
                "availability_zone_hints",
                "flavor_id",
            ],
            &[
                "id",
                "created_at",
                "updated_at",
                "revision_number",
                "status",
                "tags",
            ],
            true,
        )?;
        let name = input::opt_str(obj, "name")?;
        let description = input::opt_str(obj, "description")?;
        let admin = input::opt_bool(obj, "admin_state_up")?;
        let routes = input::opt_list(obj, "routes")?;
        let r = self
            .routers
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Router, id))?;
        if let Some(v) = name {
            r.std.name = v;
        }
        if let Some(v) = description {
            r.std.description = v;
        }
        if let Some(v) = admin {
            r.admin_state_up = v;
        }
        if let Some(v) = routes {
            r.routes = Value::Array(v);
        }
        if let Some(v) = obj.get("external_gateway_info") {
            r.external_gateway_info = v.clone();
        }
        r.std.bump();
        Ok(self.render_router(id))
    }

    pub fn delete_router(&mut self, id: &str) -> ApiResult<()> {
        if !self.routers.contains_key(id) {
            return Err(ApiError::resource_not_found(Resource::Router, id));
        }
        if self
            .ports
            .values()
            .any(|p| p.device_id == id && p.device_owner == ROUTER_INTERFACE_OWNER)
        {
            return Err(ApiError::conflict(
                "RouterInUse",
                format!("Router {id} still has ports"),
            ));
        }
        self.routers.remove(id);
        Ok(())
    }

    pub fn render_router(&self, id: &str) -> Value {
        let Some(r) = self.routers.get(id) else {
            return Value::Null;
        };
        let mut o = Obj::new();
        r.std.fill(&mut o);
        for (k, v) in [
            ("admin_state_up", json!(r.admin_state_up)),
            ("status", json!("ACTIVE")),
            ("external_gateway_info", r.external_gateway_info.clone()),
            ("availability_zones", json!([])),
            ("availability_zone_hints", json!([])),
            ("distributed", json!(false)),
            ("ha", json!(false)),
            ("routes", r.routes.clone()),
            ("flavor_id", Value::Null),
        ] {
            o.insert(k.into(), v);
        }
        Value::Object(o)
    }

    pub fn add_router_interface(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = body
            .as_object()
            .ok_or_else(|| ApiError::bad_request("Body contains invalid data"))?;
        let router = self
            .routers
            .get(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Router, id))?;
        let project = router.std.project_id.clone();
        let subnet_id = input::opt_str(obj, "subnet_id")?;
        let port_id = input::opt_str(obj, "port_id")?;
        let bad = |m: String| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("Bad router request: {m}"),
            )
        };
        let port_id = match (subnet_id, port_id) {
            (Some(_), Some(_)) => return Err(bad("Cannot specify both subnet-id and port-id.".into())),
            (None, None) => return Err(bad("Either subnet_id or port_id must be specified.".into())),
            (Some(sid), None) => {
                let s = self
                    .subnets
                    .get(&sid)
                    .ok_or_else(|| ApiError::resource_not_found(Resource::Subnet, &sid))?;
                if self.router_port_on_subnet(id, &sid).is_some() {
                    return Err(bad(format!("Router already has a port on subnet {sid}.")));
                }
                let Some(gw) = s.gateway else {
                    return Err(bad(format!(
                        "Subnet for router interface must have a gateway IP.{sid}"
                    )));
                };
                let gw = ipam::format_ip(s.cidr.version, gw);
                let mut port = Obj::new();
                port.insert("network_id".into(), json!(s.network_id));
                port.insert("project_id".into(), json!(project));
                port.insert("device_id".into(), json!(id));
                port.insert("device_owner".into(), json!(ROUTER_INTERFACE_OWNER));
                port.insert("port_security_enabled".into(), json!(false));
                port.insert("security_groups".into(), json!([]));
                port.insert("fixed_ips".into(), json!([{"subnet_id": sid, "ip_address": gw}]));
                let ids = self.create_ports(&[&port])?;
                ids.into_iter().next().ok_or_else(ApiError::internal)?
            }
            (None, Some(pid)) => {
                let p = self
                    .ports
                    .get(&pid)
                    .ok_or_else(|| ApiError::resource_not_found(Resource::Port, &pid))?;
                if !p.device_id.is_empty() {
                    return Err(ApiError::conflict(
                        "PortInUse",
                        format!(
                            "Unable to complete operation on port {pid} for network {}. Port already has an attached device {}.",
                            p.network_id, p.device_id
                        ),
                    ));
                }
                if p.fixed_ips.is_empty() {
                    return Err(bad("Router port must have at least one fixed IP".to_string()));
                }
                if let Some(p) = self.ports.get_mut(&pid) {
                    p.device_id = id.to_string();
                    p.device_owner = ROUTER_INTERFACE_OWNER.into();
                    p.std.bump();
                }
                pid
            }
        };
        if let Some(r) = self.routers.get_mut(id) {
            r.std.bump();
        }
        Ok(self.router_interface_info(id, &port_id))
    }

    fn router_port_on_subnet(&self, router: &str, subnet: &str) -> Option<String> {
        self.ports
            .values()
            .find(|p| {
                p.device_id == router
                    && p.device_owner == ROUTER_INTERFACE_OWNER
                    && p.fixed_ips.iter().any(|f| f.subnet_id == subnet)
            })
            .map(|p| p.std.id.clone())
    }

    fn router_interface_info(&self, router: &str, port_id: &str) -> Value {
        let p = self.ports.get(port_id);
        let subnet_ids: Vec<String> = p
            .map(|p| p.fixed_ips.iter().map(|f| f.subnet_id.clone()).collect())
            .unwrap_or_default();
        json!({
            "id": router,
            "project_id": self.routers.get(router).map(|r| r.std.project_id.clone()),
            "port_id": port_id,
            "network_id": p.map(|p| p.network_id.clone()),
            "subnet_id": subnet_ids.first(),
            "subnet_ids": subnet_ids,
        })
    }

    pub fn remove_router_interface(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = body
            .as_object()
            .ok_or_else(|| ApiError::bad_request("Body contains invalid data"))?;
        if !self.routers.contains_key(id) {
            return Err(ApiError::resource_not_found(Resource::Router, id));
        }
        let subnet_id = input::opt_str(obj, "subnet_id")?;
        let port_id = input::opt_str(obj, "port_id")?;
        let port_id = match (subnet_id, port_id) {
            (_, Some(pid)) => {
                let ok = self
                    .ports
                    .get(&pid)
                    .is_some_and(|p| p.device_id == id && p.device_owner == ROUTER_INTERFACE_OWNER);
                if !ok {
                    return Err(ApiError::not_found(
                        "RouterInterfaceNotFound",
                        format!("Router {id} does not have an interface with id {pid}"),
                    ));
                }
                pid
            }
            (Some(sid), None) => self.router_port_on_subnet(id, &sid).ok_or_else(|| {
                ApiError::not_found(
                    "RouterInterfaceNotFoundForSubnet",
                    format!("Router {id} has no interface on subnet {sid}"),
                )
            })?,
            (None, None) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "Bad router request: Either subnet_id or port_id must be specified.",
                ));
            }
        };
        let info = self.router_interface_info(id, &port_id);
        self.remove_port(&port_id);
        if let Some(r) = self.routers.get_mut(id) {
            r.std.bump();
        }
        Ok(info)
    }

    // ---------------------------------------------------------------- tags

    pub fn tags_mut(&mut self, res: Resource, id: &str) -> ApiResult<&mut Std> {
        let std = match res {
            Resource::Network => self.networks.get_mut(id).map(|r| &mut r.std),
            Resource::Subnet => self.subnets.get_mut(id).map(|r| &mut r.std),
            Resource::SubnetPool => self.subnetpools.get_mut(id).map(|r| &mut r.std),
            Resource::Port => self.ports.get_mut(id).map(|r| &mut r.std),
            Resource::Router => self.routers.get_mut(id).map(|r| &mut r.std),
            Resource::SecurityGroup => self.security_groups.get_mut(id).map(|r| &mut r.std),
            Resource::Trunk => self.trunks.get_mut(id).map(|r| &mut r.std),
            Resource::SecurityGroupRule => None,
        };
        std.ok_or_else(|| ApiError::resource_not_found(res, id))
    }

    // ---------------------------------------------------------------- generic access

    pub fn exists(&self, res: Resource, id: &str) -> bool {
        match res {
            Resource::Network => self.networks.contains_key(id),
            Resource::Subnet => self.subnets.contains_key(id),
            Resource::SubnetPool => self.subnetpools.contains_key(id),
            Resource::Port => self.ports.contains_key(id),
            Resource::Router => self.routers.contains_key(id),
            Resource::SecurityGroup => self.security_groups.contains_key(id),
            Resource::SecurityGroupRule => self.sg_rules.contains_key(id),
            Resource::Trunk => self.trunks.contains_key(id),
        }
    }

    pub fn render(&self, res: Resource, id: &str) -> Value {
        match res {
            Resource::Network => self.render_network(id),
            Resource::Subnet => self.render_subnet(id),
            Resource::SubnetPool => self.render_subnetpool(id),
            Resource::Port => self.render_port(id),
            Resource::Router => self.render_router(id),
            Resource::SecurityGroup => self.render_sg(id),
            Resource::SecurityGroupRule => self.render_rule(id, false),
            Resource::Trunk => self.render_trunk(id),
        }
    }

    /// All ids of a collection, sorted (neutron's default order is by id).
    pub fn ids(&self, res: Resource) -> Vec<String> {
        match res {
            Resource::Network => self.networks.keys().cloned().collect(),
            Resource::Subnet => self.subnets.keys().cloned().collect(),
            Resource::SubnetPool => self.subnetpools.keys().cloned().collect(),
            Resource::Port => self.ports.keys().cloned().collect(),
            Resource::Router => self.routers.keys().cloned().collect(),
            Resource::SecurityGroup => self.security_groups.keys().cloned().collect(),
            Resource::SecurityGroupRule => self.sg_rules.keys().cloned().collect(),
            Resource::Trunk => self.trunks.keys().cloned().collect(),
        }
    }

    pub fn get(&self, res: Resource, id: &str) -> ApiResult<Value> {
        if !self.exists(res, id) {
            return Err(ApiError::resource_not_found(res, id));
        }
        Ok(self.render(res, id))
    }

    pub fn delete(&mut self, res: Resource, id: &str, if_match: Option<u64>) -> ApiResult<()> {
        match res {
            Resource::Network => self.delete_network(id),
            Resource::Subnet => self.delete_subnet(id),
            Resource::SubnetPool => self.delete_subnetpool(id),
            Resource::Port => self.delete_port(id, if_match),
            Resource::Router => self.delete_router(id),
            Resource::SecurityGroup => self.delete_security_group(id),
            Resource::SecurityGroupRule => self.delete_sg_rule(id),
            Resource::Trunk => self.delete_trunk(id),
        }
    }

    pub fn update(
        &mut self,
        res: Resource,
        id: &str,
        body: &Value,
        if_match: Option<u64>,
    ) -> ApiResult<Value> {
        if res != Resource::Port
            && let Some(expected) = if_match
        {
            let current = self.tags_mut(res, id)?.revision;
            check_revision(Some(expected), current)?;
        }
        match res {
            Resource::Network => self.update_network(id, body),
            Resource::Subnet => self.update_subnet(id, body),
            Resource::SubnetPool => self.update_subnetpool(id, body),
            Resource::Port => self.update_port(id, body, if_match),
            Resource::Router => self.update_router(id, body),
            Resource::SecurityGroup => self.update_security_group(id, body),
            Resource::SecurityGroupRule => Err(ApiError::method_not_allowed()),
            Resource::Trunk => self.update_trunk(id, body),
        }
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

fn clamp(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

pub fn render_subport(s: &SubPort) -> Value {
    json!({"port_id": s.port_id, "segmentation_type": s.segmentation_type, "segmentation_id": s.segmentation_id})
}

fn validate_mac(mac: &str) -> ApiResult<()> {
    let parts: Vec<&str> = mac.split(':').collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && u8::from_str_radix(p, 16).is_ok());
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid_attr(
            "mac_address",
            format!("'{mac}' is not a valid MAC address"),
        ))
    }
}

/// `If-Match: revision_number=N` precondition.
pub fn check_revision(expected: Option<u64>, current: u64) -> ApiResult<()> {
    match expected {
        Some(e) if e != current => Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "RevisionNumberConstraintFailed",
            format!("Constrained to {e}, but current revision is {current}"),
        )),
        _ => Ok(()),
    }
}

/// Python-style repr of a flat JSON object, as neutron puts request fragments into messages.
fn py_repr(v: &Value) -> String {
    match v {
        Value::Object(o) => {
            let items: Vec<String> = o.iter().map(|(k, v)| format!("'{k}': {}", py_repr(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::String(s) => format!("'{s}'"),
        other => input::show(other),
    }
}

/// Validates allowed address pairs; a pair without `mac_address` gets the port's MAC, and the list comes back in
/// the order the real server stores it (by MAC, then address).
fn normalize_aap(items: &[Value], port_mac: &str) -> ApiResult<Value> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(items.len());
    for item in items {
        let Value::Object(o) = item else {
            return Err(ApiError::invalid_attr(
                "allowed_address_pairs",
                format!("'{}' is not a dictionary", input::show(item)),
            ));
        };
        let ip = match o.get("ip_address") {
            Some(Value::String(s)) => s.clone(),
            _ => {
                return Err(
                    ApiError::bad_request("AllowedAddressPair must contain ip_address")
                        .with_kind("AllowedAddressPairsMissingIP"),
                );
            }
        };
        if ipam::parse_ip(&ip).is_none() && matches!(Cidr::parse(&ip), Err(None)) {
            return Err(ApiError::bad_request(format!("'{ip}' is not a valid IP address")));
        }
        let mac = match o.get("mac_address") {
            None | Some(Value::Null) => port_mac.to_string(),
            Some(Value::String(m)) => {
                validate_mac(m)?;
                m.to_ascii_lowercase()
            }
            Some(other) => {
                return Err(ApiError::invalid_attr(
                    "mac_address",
                    format!("'{}' is not a valid MAC address", input::show(other)),
                ));
            }
        };
        out.push((mac, ip));
    }
    out.sort();
    out.dedup();
    Ok(Value::Array(
        out.into_iter()
            .map(|(m, i)| json!({"mac_address": m, "ip_address": i}))
            .collect(),
    ))
}

/// Validates extra DHCP options and fills `ip_version` (4 unless given).
fn normalize_dhcp_opts(items: &[Value]) -> ApiResult<Value> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let ok = item.get("opt_name").is_some_and(Value::is_string) && item.get("opt_value").is_some();
        if !ok {
            return Err(ApiError::invalid_input(format!(
                "No valid key specs matched for: {}",
                py_repr(item)
            )));
        }
        let version = match item.get("ip_version") {
            None | Some(Value::Null) => 4,
            Some(v) => input::to_int("ip_version", v)?,
        };
        out.push(
            json!({"opt_name": item["opt_name"], "opt_value": item["opt_value"], "ip_version": version}),
        );
    }
    Ok(Value::Array(out))
}

fn aap_needs_port_security() -> ApiError {
    ApiError::conflict(
        "AddressPairAndPortSecurityRequired",
        "Port Security must be enabled in order to have allowed address pairs on a port.",
    )
}

fn ipv6_mode(obj: &Obj, key: &str) -> ApiResult<Value> {
    match input::opt_str(obj, key)? {
        None => Ok(Value::Null),
        Some(m) if ["slaac", "dhcpv6-stateful", "dhcpv6-stateless"].contains(&m.as_str()) => Ok(json!(m)),
        Some(m) => Err(ApiError::invalid_attr(key, format!("{m} is not in valid_values"))),
    }
}

const VNIC_TYPES: [&str; 11] = [
    "normal",
    "direct",
    "macvtap",
    "baremetal",
    "direct-physical",
    "virtio-forwarder",
    "smart-nic",
    "vdpa",
    "accelerator-direct",
    "accelerator-direct-physical",
    "remote-managed",
];

fn vnic_type(obj: &Obj) -> ApiResult<Option<String>> {
    match input::opt_str(obj, "binding:vnic_type")? {
        Some(v) if !VNIC_TYPES.contains(&v.as_str()) => Err(ApiError::invalid_attr(
            "binding:vnic_type",
            format!("{v} is not in valid_values"),
        )),
        other => Ok(other),
    }
}
