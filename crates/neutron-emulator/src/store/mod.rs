//! The in-memory Neutron database and its business rules (IPAM, quotas, trunks, bindings).
//!
//! Everything runs under one mutex held by the caller; every mutating operation validates first and only then
//! changes state, or rolls back what it took (bulk creates), so a failed request never leaves partial state.
//! One file per resource (typed records, their create/update/delete and JSON form); `by_resource` dispatches the
//! generic REST routes. See docs/architecture.md, "The emulators".

mod address_groups;
mod addresses;
mod binding;
mod by_resource;
mod floatingips;
mod networks;
mod port_attrs;
mod ports;
mod quota;
mod routers;
mod security_groups;
mod subnetpools;
mod subnets;
#[cfg(test)]
mod tests;
mod trunks;

pub use address_groups::AddressGroup;
pub use addresses::FixedIp;
pub use binding::Binding;
pub use floatingips::{FLOATINGIP_OWNER, FloatingIp};
pub use networks::Network;
pub use port_attrs::{AddressPair, DhcpOpt};
pub use ports::Port;
pub use quota::QUOTA_DEFAULTS;
pub use routers::Router;
pub use security_groups::{SecurityGroup, SgRule};
pub use subnetpools::SubnetPool;
pub use subnets::Subnet;
pub use trunks::{SubPort, Trunk, render_subport};

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use axum::http::StatusCode;
use serde_json::json;

use crate::error::{ApiError, ApiResult};
use crate::input::{self, Obj};

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

/// The `name` and `description` of an update body, read (and validated) before anything changes.
struct StdUpdate {
    name: Option<String>,
    description: Option<String>,
}

impl StdUpdate {
    fn parse(obj: &Obj) -> ApiResult<Self> {
        Ok(Self {
            name: input::opt_str(obj, "name")?,
            description: input::opt_str(obj, "description")?,
        })
    }

    fn apply(self, std: &mut Std) {
        if let Some(v) = self.name {
            std.name = v;
        }
        if let Some(v) = self.description {
            std.description = v;
        }
    }
}

/// A record with neutron's standard attributes.
trait Record {
    fn std(&self) -> &Std;
}

macro_rules! records {
    ($($t:ty),*) => {
        $(impl Record for $t {
            fn std(&self) -> &Std {
                &self.std
            }
        })*
    };
}

records!(
    Network,
    Subnet,
    SubnetPool,
    Port,
    Router,
    SecurityGroup,
    Trunk,
    FloatingIp
);

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
    pub address_groups: BTreeMap<String, AddressGroup>,
    pub floatingips: BTreeMap<String, FloatingIp>,
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
    /// Hosts whose OVS agent plugs the hybrid way ([`crate::EmulatorOptions::hybrid_plug_hosts`]).
    pub hybrid_plug_hosts: BTreeSet<String>,
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
}
