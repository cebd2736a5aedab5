//! Subnet pools: prefixes subnets are allocated from.

use serde_json::{Value, json};

use super::{Std, StdUpdate, Store, create_tags, std_from};
use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};
use crate::ipam::Cidr;

/// What a subnet pool create or update may set.
const SUBNETPOOL_WRITABLE: [&str; 8] = [
    "name",
    "description",
    "prefixes",
    "default_prefixlen",
    "min_prefixlen",
    "max_prefixlen",
    "is_default",
    "default_quota",
];

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

impl Store {
    pub fn create_subnetpool(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "subnetpool")?;
        input::check_attrs(
            obj,
            &SUBNETPOOL_WRITABLE,
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
            &SUBNETPOOL_WRITABLE,
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
        let std_update = StdUpdate::parse(obj)?;
        let prefixes = input::opt_str_list(obj, "prefixes")?;
        let pool = self
            .subnetpools
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::SubnetPool, id))?;
        std_update.apply(&mut pool.std);
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
}
