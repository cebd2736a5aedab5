//! Address groups (`address-group` extension) and what security group rules may say about them,
//! as neutron-server 29 answers (checked by the contract suite's `address_groups` cases).
//!
//! Observed on a real server: create wants CIDRs (a bare address is refused) and refuses
//! duplicates; `add_addresses` also takes a bare address (as `/32` or `/128`); both actions are
//! all or nothing (`AddressesAlreadyExist` 400, `AddressesNotFound` 404); addresses are answered
//! sorted; the revision grows by one per address added or removed; address groups carry no tags.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::{STD_READONLY, Std, StdUpdate, Store, std_from};
use crate::error::{ApiError, ApiResult};
use crate::input;
use crate::ipam::{self, Cidr};

#[derive(Debug, Clone)]
pub struct AddressGroup {
    pub std: Std,
    pub addresses: BTreeSet<String>,
    pub standard_attr_id: u64,
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(
        "AddressGroupNotFound",
        format!("Address group {id} could not be found."),
    )
}

/// A CIDR in canonical form; with `bare_ok` a plain address is a host prefix.
fn normalize(s: &str, bare_ok: bool) -> Option<String> {
    match Cidr::parse(s) {
        Ok(c) => Some(c.to_string()),
        Err(Some(n)) => Some(n),
        Err(None) if bare_ok => ipam::parse_ip(s)
            .map(|(v, ip)| Cidr::from_parts(v, ip, if v == 4 { 32 } else { 128 }).to_string()),
        Err(None) => None,
    }
}

fn address_list(body: &Value) -> ApiResult<Vec<String>> {
    match body.get("addresses") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().map(String::from).ok_or_else(|| {
                    ApiError::bad_request(format!("invalid IPNetwork {}", input::show(v)))
                        .with_kind("AddrFormatError")
                })
            })
            .collect(),
        // neutron-server answers a 500 here; a clear 400 is what a client can act on.
        _ => Err(ApiError::bad_request(
            "Unable to find 'addresses' in request body",
        )),
    }
}

impl Store {
    pub fn create_address_group(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "address_group")?;
        input::check_attrs(
            obj,
            &["name", "description", "addresses"],
            &["project_id", "tenant_id"],
            &STD_READONLY,
            false,
        )?;
        let raw = input::opt_str_list(obj, "addresses")?.unwrap_or_default();
        let mut seen = BTreeSet::new();
        for a in &raw {
            if !seen.insert(a.as_str()) {
                return Err(ApiError::invalid_attr(
                    "addresses",
                    format!("Duplicate items in the list: '{a}'"),
                ));
            }
        }
        let mut addresses = BTreeSet::new();
        for a in &raw {
            let n = normalize(a, false).ok_or_else(|| {
                ApiError::invalid_attr("addresses", format!("'{a}' is not a valid IP subnet"))
            })?;
            addresses.insert(n);
        }
        let mut std = std_from(obj, 0)?;
        std.revision = addresses.len() as u64;
        let id = std.id.clone();
        let standard_attr_id = self.next_attr_id();
        self.address_groups.insert(
            id.clone(),
            AddressGroup {
                std,
                addresses,
                standard_attr_id,
            },
        );
        Ok(self.render_address_group(&id, false))
    }

    pub fn update_address_group(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "address_group")?;
        input::check_attrs(
            obj,
            &["name", "description"],
            &["project_id", "tenant_id", "addresses"],
            &STD_READONLY,
            true,
        )?;
        let update = StdUpdate::parse(obj)?;
        let ag = self.address_groups.get_mut(id).ok_or_else(|| not_found(id))?;
        update.apply(&mut ag.std);
        ag.std.bump();
        Ok(self.render_address_group(id, false))
    }

    pub fn delete_address_group(&mut self, id: &str) -> ApiResult<()> {
        if !self.address_groups.contains_key(id) {
            return Err(not_found(id));
        }
        if self
            .sg_rules
            .values()
            .any(|r| r.remote_address_group_id.as_str() == Some(id))
        {
            return Err(ApiError::conflict(
                "AddressGroupInUse",
                format!("Address group {id} is in use on one or more security group rules."),
            ));
        }
        self.address_groups.remove(id);
        Ok(())
    }

    /// `add_addresses` (`add` true) or `remove_addresses`: every address or none.
    pub fn address_group_action(&mut self, id: &str, body: &Value, add: bool) -> ApiResult<Value> {
        let list = address_list(body)?;
        let ag = self.address_groups.get(id).ok_or_else(|| not_found(id))?;
        let mut wanted = BTreeSet::new();
        for a in &list {
            let n = normalize(a, true).ok_or_else(|| {
                ApiError::bad_request(format!("invalid IPNetwork {a}")).with_kind("AddrFormatError")
            })?;
            wanted.insert(n);
        }
        let quote = |v: Vec<&String>| v.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(", ");
        if add {
            let dup: Vec<&String> = wanted.iter().filter(|a| ag.addresses.contains(*a)).collect();
            if !dup.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "Addresses [{}] already exist in the address group {id}.",
                    quote(dup)
                ))
                .with_kind("AddressesAlreadyExist"));
            }
        } else {
            let missing: Vec<&String> = wanted.iter().filter(|a| !ag.addresses.contains(*a)).collect();
            if !missing.is_empty() {
                return Err(ApiError::not_found(
                    "AddressesNotFound",
                    format!(
                        "Addresses [{}] not found in the address group {id}.",
                        quote(missing)
                    ),
                ));
            }
        }
        let ag = self.address_groups.get_mut(id).ok_or_else(|| not_found(id))?;
        for a in &wanted {
            if add {
                ag.addresses.insert(a.clone());
            } else {
                ag.addresses.remove(a);
            }
        }
        ag.std.revision += wanted.len() as u64;
        Ok(json!({"address_group": self.render_address_group(id, true)}))
    }

    /// The JSON form; the actions' answers also carry `shared` and `standard_attr_id`.
    pub fn render_address_group(&self, id: &str, action: bool) -> Value {
        let Some(ag) = self.address_groups.get(id) else {
            return Value::Null;
        };
        let mut v = json!({
            "id": ag.std.id, "name": ag.std.name, "project_id": ag.std.project_id,
            "tenant_id": ag.std.project_id, "description": ag.std.description,
            "addresses": ag.addresses, "revision_number": ag.std.revision,
            "created_at": ag.std.created_at, "updated_at": ag.std.updated_at,
        });
        if action && let Value::Object(o) = &mut v {
            o.insert("shared".into(), json!(false));
            o.insert("standard_attr_id".into(), json!(ag.standard_attr_id));
        }
        v
    }
}
