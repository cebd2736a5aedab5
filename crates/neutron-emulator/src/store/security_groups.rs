//! Security groups and their rules, including the per-project `default` group neutron creates on demand.

use serde_json::{Value, json};

use super::{STD_READONLY, Std, StdUpdate, Store, new_id, now, project_of, std_from};
use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};
use crate::ipam::{self, Cidr};

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
    pub remote_address_group_id: Value,
    pub description: Value,
    pub belongs_to_default_sg: Value,
    pub standard_attr_id: u64,
    pub created_at: String,
    pub revision: u64,
}

impl Store {
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
            remote_address_group_id: Value::Null,
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
            &["project_id", "tenant_id"],
            &STD_READONLY,
            false,
        )?;
        // neutron-server 29 refuses `tags` in a security group POST ("Attribute 'tags' not
        // allowed in POST"): tags are set afterwards.
        let std = std_from(obj, 1)?;
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
        let std_update = StdUpdate::parse(obj)?;
        let stateful = input::opt_bool(obj, "stateful")?;
        let sg = self
            .security_groups
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::SecurityGroup, id))?;
        std_update.apply(&mut sg.std);
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
        let mut pmin = input::opt_int(obj, "port_range_min")?;
        let mut pmax = input::opt_int(obj, "port_range_max")?;
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
        // neutron-server stores the whole range as none (for the backends' sake).
        if (pmin, pmax) == (Some(1), Some(65535)) {
            (pmin, pmax) = (None, None);
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
        let remote_address_group_id = match input::opt_str(obj, "remote_address_group_id")? {
            None => Value::Null,
            Some(g) => {
                if !self.address_groups.contains_key(&g) {
                    return Err(ApiError::not_found(
                        "AddressGroupNotFound",
                        format!("Address group {g} could not be found."),
                    ));
                }
                json!(g)
            }
        };
        let remotes = [&remote_ip_prefix, &remote_group_id, &remote_address_group_id];
        if remotes.iter().filter(|v| !v.is_null()).count() > 1 {
            return Err(ApiError::bad_request(
                "Only one of remote_ip_prefix or remote_group_id or remote_address_group_id may be provided.",
            )
            .with_kind("SecurityGroupMultipleRemoteEntites"));
        }
        let description = input::opt_str(obj, "description")?.unwrap_or_default();
        let mut rule = self.new_rule(&project, &sg, &direction, &ethertype, None, json!(description));
        rule.protocol = protocol;
        rule.port_range_min = pmin.map(|v| json!(v)).unwrap_or(Value::Null);
        rule.port_range_max = pmax.map(|v| json!(v)).unwrap_or(Value::Null);
        rule.remote_ip_prefix = remote_ip_prefix;
        rule.remote_group_id = remote_group_id;
        rule.remote_address_group_id = remote_address_group_id;
        rule.belongs_to_default_sg = json!(self.security_groups.get(&sg).is_some_and(|s| s.is_default));
        // Neutron's duplicate check (`_rule_to_key`) takes a remote of every address for none.
        let any_address = |p: &Value| match p.as_str() {
            None | Some("0.0.0.0/0" | "::/0") => Value::Null,
            Some(_) => p.clone(),
        };
        if let Some(dup) = self.sg_rules.values().find(|r| {
            r.security_group_id == rule.security_group_id
                && r.direction == rule.direction
                && r.ethertype == rule.ethertype
                && r.protocol == rule.protocol
                && r.port_range_min == rule.port_range_min
                && r.port_range_max == rule.port_range_max
                && any_address(&r.remote_ip_prefix) == any_address(&rule.remote_ip_prefix)
                && r.remote_group_id == rule.remote_group_id
                && r.remote_address_group_id == rule.remote_address_group_id
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
            "remote_ip_prefix": r.remote_ip_prefix, "remote_address_group_id": r.remote_address_group_id, "normalized_cidr": normalized,
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
}
