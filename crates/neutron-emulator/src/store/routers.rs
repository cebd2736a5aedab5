//! Routers and router interfaces (a port owned by `network:router_interface`).

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::{ROUTER_INTERFACE_OWNER, STD_READONLY, Std, StdUpdate, Store, create_tags, std_from};
use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};
use crate::ipam;

/// What a router create or update may set.
const ROUTER_WRITABLE: [&str; 5] = [
    "name",
    "description",
    "admin_state_up",
    "external_gateway_info",
    "routes",
];

#[derive(Debug, Clone)]
pub struct Router {
    pub std: Std,
    pub admin_state_up: bool,
    pub routes: Value,
    pub external_gateway_info: Value,
}

impl Store {
    pub fn create_router(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "router")?;
        input::check_attrs(
            obj,
            &ROUTER_WRITABLE,
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
            &ROUTER_WRITABLE,
            &[
                "project_id",
                "tenant_id",
                "distributed",
                "ha",
                "availability_zone_hints",
                "flavor_id",
            ],
            &STD_READONLY,
            true,
        )?;
        let std_update = StdUpdate::parse(obj)?;
        let admin = input::opt_bool(obj, "admin_state_up")?;
        let routes = input::opt_list(obj, "routes")?;
        let r = self
            .routers
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Router, id))?;
        std_update.apply(&mut r.std);
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
        let obj = input::body_obj(body)?;
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
                    return Err(ApiError::port_in_use(&pid, &p.network_id, &p.device_id));
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

    pub(super) fn router_port_on_subnet(&self, router: &str, subnet: &str) -> Option<String> {
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
        let obj = input::body_obj(body)?;
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
}
