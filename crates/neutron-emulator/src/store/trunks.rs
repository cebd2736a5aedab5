//! Trunks and their subports (VLAN-aware VMs), bound with the parent port.

use serde_json::{Value, json};

use super::{Activation, STD_READONLY, Std, StdUpdate, Store, TRUNK_SUBPORT_OWNER, create_tags, std_from};
use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};

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

pub fn render_subport(s: &SubPort) -> Value {
    json!({"port_id": s.port_id, "segmentation_type": s.segmentation_type, "segmentation_id": s.segmentation_id})
}

impl Store {
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

    /// The `sub_ports` of an `add_subports` / `remove_subports` body.
    fn subports_body(&self, body: &Value, need_segmentation: bool) -> ApiResult<Vec<SubPort>> {
        let obj = input::body_obj(body)?;
        if !obj.contains_key("sub_ports") {
            return Err(ApiError::bad_request(
                "Unable to find 'sub_ports' in request body",
            ));
        }
        self.parse_subports(obj, "sub_ports", need_segmentation)
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
                return Err(ApiError::port_in_use(
                    &sp.port_id,
                    &port.network_id,
                    &port.device_id,
                ));
            }
            if self.parent_of.contains_key(&sp.port_id) {
                return Err(ApiError::parent_port_in_use(&sp.port_id));
            }
            if self.subport_of.contains_key(&sp.port_id) || seen_ports.contains(&sp.port_id.as_str()) {
                return Err(ApiError::trunk_port_in_use(&sp.port_id));
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
            return Err(ApiError::trunk_port_in_use(&port_id));
        }
        // The OVS trunk driver only accepts unbound parents; Nova binds them afterwards.
        if !parent.host.is_empty() {
            return Err(ApiError::parent_port_in_use(&port_id));
        }
        if subs.iter().any(|s| s.port_id == port_id) {
            return Err(ApiError::trunk_port_in_use(&port_id));
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
            &STD_READONLY,
            true,
        )?;
        let std_update = StdUpdate::parse(obj)?;
        let admin = input::opt_bool(obj, "admin_state_up")?;
        let t = self
            .trunks
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Trunk, id))?;
        std_update.apply(&mut t.std);
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
        let subs = self.subports_body(body, true)?;
        let t = self
            .trunks
            .get(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Trunk, id))?;
        if subs.iter().any(|s| s.port_id == t.port_id) {
            return Err(ApiError::parent_port_in_use(&t.port_id));
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
        let subs = self.subports_body(body, false)?;
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
}
