//! Ports: atomic (bulk) create, update with If-Match, delete and their JSON form.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::addresses::AddrCtx;
use super::port_attrs::{
    AddressPair, DhcpOpt, aap_needs_port_security, normalize_aap, normalize_dhcp_opts, validate_mac,
    vnic_type,
};
use super::{
    Activation, Binding, FixedIp, ROUTER_INTERFACE_OWNER, Std, StdUpdate, Store, check_revision, create_tags,
    std_from,
};
use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};
use crate::ipam;

/// What a port create or update may set.
const PORT_WRITABLE: [&str; 14] = [
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
    pub allowed_address_pairs: Vec<AddressPair>,
    pub extra_dhcp_opts: Vec<DhcpOpt>,
    /// Bumped on every binding change so a stale activation timer does nothing.
    pub bind_gen: u64,
}

impl Store {
    fn validate_sgs(&self, sgs: &[String]) -> ApiResult<()> {
        for sg in sgs {
            if !self.security_groups.contains_key(sg) {
                return Err(ApiError::resource_not_found(Resource::SecurityGroup, sg));
            }
        }
        Ok(())
    }

    /// Creates one or many ports atomically: all of them or none (the caller wraps the answer as one or a bulk).
    pub fn create_ports(&mut self, items: &[&Obj]) -> ApiResult<Vec<String>> {
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
                &PORT_WRITABLE,
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
                    return Err(ApiError::mac_in_use(&network_id, &mac));
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
        // MACs and addresses (SLAAC addresses derive from the MAC); on the first failure everything this request
        // took is given back.
        let mut allocations: Vec<(String, Vec<FixedIp>)> = Vec::with_capacity(specs.len());
        for s in &specs {
            let result = self.allocate_port(s.obj, &s.network_id);
            match result {
                Ok(a) => allocations.push(a),
                Err(e) => {
                    for (mac, ips) in &allocations {
                        self.release_port(mac, ips);
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
                None => Vec::new(),
            };
            let extra_dhcp_opts = match input::opt_list(obj, "extra_dhcp_opts")? {
                Some(o) => normalize_dhcp_opts(&o)?,
                None => Vec::new(),
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
            &PORT_WRITABLE,
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
        let std_update = StdUpdate::parse(obj)?;
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
        let final_aap_nonempty = !aap.as_ref().unwrap_or(&port.allowed_address_pairs).is_empty();
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
                return Err(ApiError::mac_in_use(&network_id, m));
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
            self.release_ips(&old_ips, new_ips);
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
        std_update.apply(&mut port.std);
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

    pub(super) fn remove_port(&mut self, id: &str) {
        self.disassociate_port(id);
        if let Some(p) = self.ports.remove(id) {
            self.release_port(&p.mac, &p.fixed_ips);
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
            Binding::Ovs => {
                let mut details = json!({"connectivity": "l2", "port_filter": true, "ovs_hybrid_plug": false,
                    "ovs_create_tap": true, "datapath_type": "system", "bridge_name": "br-int",
                    "bound_drivers": {"0": "openvswitch"}});
                // The agent's hybrid plug, and then no tap of OVS' own (the mechanism driver's rule).
                if self.hybrid_plug_hosts.contains(&p.host) {
                    details["ovs_hybrid_plug"] = json!(true);
                    if let Some(d) = details.as_object_mut() {
                        d.remove("ovs_create_tap");
                    }
                }
                ("ovs", details)
            }
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
            ("allowed_address_pairs", json!(p.allowed_address_pairs)),
            ("extra_dhcp_opts", json!(p.extra_dhcp_opts)),
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
}
