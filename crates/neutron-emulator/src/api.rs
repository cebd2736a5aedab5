//! Request routing: path -> operation -> store call -> neutron-shaped reply, plus list filters and pagination.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::control::Op;
use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};
use crate::store::{OVS_BRIDGE_MAPPINGS, SRIOV_DEVICE_MAPPINGS, Store, render_subport};

/// A reply before headers are added.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Option<Value>,
    /// A non-JSON (webob HTML) answer, which the real server gives for a few paths.
    pub html: Option<String>,
}

impl Reply {
    fn ok(body: Value) -> Self {
        Self {
            status: StatusCode::OK,
            body: Some(body),
            html: None,
        }
    }
    fn created(body: Value) -> Self {
        Self {
            status: StatusCode::CREATED,
            body: Some(body),
            html: None,
        }
    }
    fn no_content() -> Self {
        Self {
            status: StatusCode::NO_CONTENT,
            body: None,
            html: None,
        }
    }
}

/// A parsed API request.
pub struct Request<'a> {
    pub method: Method,
    pub segments: Vec<String>,
    pub query: Vec<(String, String)>,
    pub raw_query: &'a str,
    pub path: &'a str,
    pub host: String,
    pub body: Option<Value>,
    pub if_match: Option<u64>,
}

/// What a path names, decided before the store is touched (stats, faults and latency need it).
#[derive(Debug, Clone)]
pub enum Route {
    Versions,
    Extensions,
    Extension(String),
    Agents,
    Collection(Resource),
    Member(Resource, String),
    Tags(Resource, String),
    Tag(Resource, String, String),
    TrunkAction(String, String),
    AddressGroupAction(String, String),
    RouterAction(String, String),
    Quotas,
    Quota(String),
    QuotaDetails(String),
    QuotaDefault(String),
    IpAvailabilities,
    IpAvailability(String),
}

pub fn route(segments: &[String]) -> Option<Route> {
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    if s.is_empty() {
        return Some(Route::Versions);
    }
    if s[0] != "v2.0" {
        return None;
    }
    Some(match &s[1..] {
        ["extensions"] => Route::Extensions,
        ["extensions", alias] => Route::Extension(alias.to_string()),
        ["agents"] => Route::Agents,
        ["quotas"] => Route::Quotas,
        ["quotas", p] => Route::Quota(p.to_string()),
        ["quotas", p, "details"] => Route::QuotaDetails(p.to_string()),
        ["quotas", p, "default"] => Route::QuotaDefault(p.to_string()),
        ["network-ip-availabilities"] => Route::IpAvailabilities,
        ["network-ip-availabilities", id] => Route::IpAvailability(id.to_string()),
        [
            "trunks",
            id,
            action @ ("add_subports" | "remove_subports" | "get_subports"),
        ] => Route::TrunkAction(id.to_string(), action.to_string()),
        [
            "address-groups",
            id,
            action @ ("add_addresses" | "remove_addresses"),
        ] => Route::AddressGroupAction(id.to_string(), action.to_string()),
        [
            "routers",
            id,
            action @ ("add_router_interface" | "remove_router_interface"),
        ] => Route::RouterAction(id.to_string(), action.to_string()),
        [coll] => Route::Collection(Resource::from_collection(coll)?),
        [coll, id] => Route::Member(Resource::from_collection(coll)?, id.to_string()),
        [coll, id, "tags"] => Route::Tags(Resource::from_collection(coll)?, id.to_string()),
        [coll, id, "tags", tag] => {
            Route::Tag(Resource::from_collection(coll)?, id.to_string(), tag.to_string())
        }
        _ => return None,
    })
}

/// Classifies a request into an operation name (for stats, latency and faults).
pub fn classify(method: &Method, route: &Route, body: Option<&Value>) -> Op {
    let action = |m: &Method| match *m {
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::DELETE => "delete",
        _ => "other",
    };
    match route {
        Route::Versions => Op::new("version.list"),
        Route::Extensions | Route::Extension(_) => Op::new("extension.get"),
        Route::Agents => Op::new("agent.list"),
        Route::Collection(res) if *method == Method::GET => Op::new(format!("{}.list", res.op_name())),
        Route::Collection(Resource::Port) if *method == Method::POST => {
            let items: Vec<&Value> = match body.and_then(|b| b.get("ports")) {
                Some(Value::Array(a)) => a.iter().collect(),
                _ => body.and_then(|b| b.get("port")).into_iter().collect(),
            };
            let bulk = body.is_some_and(|b| b.get("ports").is_some());
            let binds = items.iter().any(|p| {
                p.get("binding:host_id")
                    .and_then(Value::as_str)
                    .is_some_and(|h| !h.is_empty())
            });
            Op {
                name: if bulk {
                    "port.create_bulk".into()
                } else {
                    "port.create".into()
                },
                items: items.len().max(1),
                binds,
            }
        }
        Route::Collection(res) => {
            let bulk = body.is_some_and(|b| b.get(res.plural_key()).is_some());
            Op::new(format!(
                "{}.{}",
                res.op_name(),
                if bulk { "create_bulk" } else { action(method) }
            ))
        }
        Route::Member(Resource::Port, _) if *method == Method::PUT => {
            let binds = body
                .and_then(|b| b.get("port"))
                .and_then(|p| p.get("binding:host_id"))
                .and_then(Value::as_str)
                .is_some_and(|h| !h.is_empty());
            Op {
                name: "port.update".into(),
                items: 1,
                binds,
            }
        }
        Route::Member(res, _) => Op::new(format!("{}.{}", res.op_name(), action(method))),
        Route::Tags(res, _) | Route::Tag(res, _, _) => Op::new(format!("{}.tags", res.op_name())),
        Route::AddressGroupAction(_, a) => Op::new(format!("address_group.{a}")),
        Route::TrunkAction(_, a) => {
            let n = body
                .and_then(|b| b.get("sub_ports"))
                .and_then(Value::as_array)
                .map(Vec::len)
                .unwrap_or(1);
            Op {
                name: format!("trunk.{a}"),
                items: n.max(1),
                binds: false,
            }
        }
        Route::RouterAction(_, a) => Op::new(format!("router.{a}")),
        Route::Quotas => Op::new("quota.list"),
        Route::Quota(_) => Op::new(format!("quota.{}", action(method))),
        Route::QuotaDetails(_) => Op::new("quota.details"),
        Route::QuotaDefault(_) => Op::new("quota.default"),
        Route::IpAvailabilities => Op::new("network_ip_availability.list"),
        Route::IpAvailability(_) => Op::new("network_ip_availability.get"),
    }
}

const EXTENSIONS: &str = include_str!("extensions.json");

fn require_body<'r>(req: &'r Request<'_>) -> ApiResult<&'r Value> {
    req.body
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("Resources required"))
}

/// Executes a routed request against the store.
pub fn handle(
    store: &mut Store,
    route: &Route,
    req: &Request<'_>,
    agent_hosts: &[String],
) -> ApiResult<Reply> {
    let m = &req.method;
    match route {
        Route::Versions if *m == Method::GET => {
            Ok(Reply::ok(json!({"versions": [{"id": "v2.0", "status": "CURRENT",
            "links": [{"rel": "self", "href": format!("http://{}/v2.0/", req.host)}]}]})))
        }
        Route::Extensions if *m == Method::GET => serde_json::from_str(EXTENSIONS)
            .map(Reply::ok)
            .map_err(|_| ApiError::internal()),
        Route::Extension(alias) if *m == Method::GET => {
            let all: Value = serde_json::from_str(EXTENSIONS).map_err(|_| ApiError::internal())?;
            all.get("extensions")
                .and_then(Value::as_array)
                .and_then(|a| {
                    a.iter()
                        .find(|e| e.get("alias").and_then(Value::as_str) == Some(alias))
                })
                .map(|e| Ok(Reply::ok(json!({"extension": e}))))
                .unwrap_or_else(|| {
                    Ok(Reply {
                        status: StatusCode::NOT_FOUND,
                        body: None,
                        html: Some(format!(
                            "<html>\n <head>\n  <title>404 Not Found</title>\n </head>\n <body>\n  <h1>404 Not Found</h1>\n  The resource could not be found.<br /><br />\nExtension with alias {alias} does not exist\n\n\n </body>\n</html>"
                        )),
                    })
                })
        }
        Route::Agents if *m == Method::GET => {
            let items: Vec<Value> = agent_hosts
                .iter()
                .flat_map(|h| agents_json(h, store.hybrid_plug_hosts.contains(h)))
                .collect();
            list_reply(req, "agents", items, None, |_| false)
        }
        Route::Collection(res) if *m == Method::GET => list_resource(store, *res, req),
        Route::Collection(res) if *m == Method::POST => create(store, *res, require_body(req)?),
        Route::Member(res, id) if *m == Method::GET => {
            let v = store.get(*res, id)?;
            let fields = fields_param(&req.query);
            Ok(Reply::ok(json!({res.member(): select_fields(v, &fields)})))
        }
        Route::Member(res, id) if *m == Method::PUT => {
            let v = store.update(*res, id, require_body(req)?, req.if_match)?;
            Ok(Reply::ok(json!({res.member(): v})))
        }
        Route::Member(res, id) if *m == Method::DELETE => {
            store.delete(*res, id, req.if_match).map(|()| Reply::no_content())
        }
        Route::Tags(res, id) => tags_collection(store, *res, id, req),
        Route::Tag(res, id, tag) => tag_member(store, *res, id, tag, m),
        Route::TrunkAction(id, action) => match (m, action.as_str()) {
            (&Method::PUT, "add_subports") => store.add_subports(id, require_body(req)?).map(Reply::ok),
            (&Method::PUT, "remove_subports") => store.remove_subports(id, require_body(req)?).map(Reply::ok),
            (&Method::GET, "get_subports") => {
                let t = store
                    .trunks
                    .get(id)
                    .ok_or_else(|| ApiError::resource_not_found(Resource::Trunk, id))?;
                let subs: Vec<Value> = t.sub_ports.iter().map(render_subport).collect();
                Ok(Reply::ok(json!({"sub_ports": subs})))
            }
            _ => Err(ApiError::method_not_allowed()),
        },
        Route::AddressGroupAction(id, action) if *m == Method::PUT => store
            .address_group_action(id, require_body(req)?, action == "add_addresses")
            .map(Reply::ok),
        Route::RouterAction(id, action) if *m == Method::PUT => match action.as_str() {
            "add_router_interface" => store.add_router_interface(id, require_body(req)?).map(Reply::ok),
            _ => store
                .remove_router_interface(id, require_body(req)?)
                .map(Reply::ok),
        },
        Route::Quotas if *m == Method::GET => Ok(Reply::ok(json!({"quotas": store.quota_list_json()}))),
        Route::Quota(p) if *m == Method::GET => Ok(Reply::ok(json!({"quota": store.quota_json(p)}))),
        Route::Quota(p) if *m == Method::PUT => store
            .quota_update(p, require_body(req)?)
            .map(|q| Reply::ok(json!({"quota": q}))),
        Route::Quota(p) if *m == Method::DELETE => {
            store.quota_delete(p);
            Ok(Reply::no_content())
        }
        Route::QuotaDetails(p) if *m == Method::GET => {
            Ok(Reply::ok(json!({"quota": store.quota_details_json(p)})))
        }
        Route::QuotaDefault(_) if *m == Method::GET => {
            Ok(Reply::ok(json!({"quota": Store::quota_default_json()})))
        }
        Route::IpAvailabilities if *m == Method::GET => {
            const KEYS: [&str; 5] = [
                "network_id",
                "network_name",
                "project_id",
                "tenant_id",
                "ip_version",
            ];
            let filters: Vec<&(String, String)> = req
                .query
                .iter()
                .filter(|(k, _)| KEYS.contains(&k.as_str()))
                .collect();
            let items: Vec<Value> = store
                .networks
                .keys()
                .filter_map(|id| store.ip_availability(id))
                .filter(|v| {
                    filters.iter().all(|(k, want)| {
                        if k == "ip_version" {
                            let subs = v.get("subnet_ip_availability").and_then(Value::as_array);
                            return subs.is_some_and(|s| {
                                s.iter()
                                    .any(|x| x.get("ip_version").is_some_and(|iv| value_matches(iv, want)))
                            });
                        }
                        filters
                            .iter()
                            .filter(|(k2, _)| k2 == k)
                            .any(|(_, w)| v.get(k.as_str()).is_some_and(|x| value_matches(x, w)))
                            && !want.is_empty()
                    })
                })
                .collect();
            list_reply(req, "network_ip_availabilities", items, None, |_| false)
        }
        Route::IpAvailability(id) if *m == Method::GET => store
            .ip_availability(id)
            .map(|v| Reply::ok(json!({"network_ip_availability": v})))
            .ok_or_else(|| ApiError::resource_not_found(Resource::Network, id)),
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// An agent host's L2 agents, like the lab's fake agent registers them: an Open vSwitch agent and a NIC Switch
/// (SR-IOV) agent.
fn agents_json(host: &str, hybrid_plug: bool) -> [Value; 2] {
    // Stable ids per host and agent so repeated lists agree.
    let id = |binary: &str| {
        let name = if binary == "neutron-openvswitch-agent" {
            host.to_string()
        } else {
            format!("{binary}@{host}")
        };
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
    };
    let agent = |binary: &str, agent_type: &str, configurations: Value| {
        json!({"id": id(binary), "agent_type": agent_type, "binary": binary, "topic": "N/A",
               "host": host, "admin_state_up": true, "alive": true, "description": null, "resources_synced": null,
               "availability_zone": null, "created_at": "", "started_at": "", "heartbeat_timestamp": "",
               "configurations": configurations})
    };
    let bridges: serde_json::Map<String, Value> = OVS_BRIDGE_MAPPINGS
        .iter()
        .map(|(p, b)| (p.to_string(), json!(b)))
        .collect();
    let mut devices = serde_json::Map::new();
    for (p, d) in SRIOV_DEVICE_MAPPINGS {
        if let Some(Value::Array(a)) = devices.get_mut(p) {
            a.push(json!(d));
        } else {
            devices.insert(p.to_string(), json!([d]));
        }
    }
    [
        agent(
            "neutron-openvswitch-agent",
            "Open vSwitch agent",
            json!({"bridge_mappings": bridges, "datapath_type": "system", "integration_bridge": "br-int",
                   "tunnel_types": ["vxlan"], "ovs_hybrid_plug": hybrid_plug, "emulated": true}),
        ),
        agent(
            "neutron-sriov-nic-agent",
            "NIC Switch agent",
            json!({"device_mappings": devices, "devices": 0, "extensions": [], "emulated": true}),
        ),
    ]
}

fn create(store: &mut Store, res: Resource, body: &Value) -> ApiResult<Reply> {
    if res == Resource::Port {
        if let Some(items) = body.get("ports") {
            let Value::Array(items) = items else {
                return Err(ApiError::bad_request("Body contains invalid data"));
            };
            if items.is_empty() {
                return Err(ApiError::bad_request("Resources required"));
            }
            let objs: Vec<&Obj> = items.iter().map(input::body_obj).collect::<ApiResult<_>>()?;
            let ids = store.create_ports(&objs)?;
            let out: Vec<Value> = ids.iter().map(|id| store.render_port(id)).collect();
            return Ok(Reply::created(json!({"ports": out})));
        }
        let obj = input::member(body, "port")?;
        let ids = store.create_ports(&[obj])?;
        let id = ids.first().ok_or_else(ApiError::internal)?;
        return Ok(Reply::created(json!({"port": store.render_port(id)})));
    }
    if body.get(res.plural_key()).is_some() {
        // Bulk for other resources: one by one, undone on failure is not needed by kuryr; refuse clearly.
        return Err(ApiError::bad_request(format!(
            "Bulk create of {} is not supported by the emulator",
            res.plural_key()
        )));
    }
    let v = match res {
        Resource::Network => store.create_network(body)?,
        Resource::Subnet => store.create_subnet(body)?,
        Resource::SubnetPool => store.create_subnetpool(body)?,
        Resource::Router => store.create_router(body)?,
        Resource::SecurityGroup => store.create_security_group(body)?,
        Resource::SecurityGroupRule => store.create_sg_rule(body)?,
        Resource::Trunk => store.create_trunk(body)?,
        Resource::AddressGroup => store.create_address_group(body)?,
        Resource::FloatingIp => store.create_floatingip(body)?,
        Resource::Port => return Err(ApiError::internal()),
    };
    Ok(Reply::created(json!({res.member(): v})))
}

fn tags_collection(store: &mut Store, res: Resource, id: &str, req: &Request<'_>) -> ApiResult<Reply> {
    match req.method {
        Method::GET => {
            let std = tag_target(store, res, id)?;
            Ok(Reply::ok(json!({"tags": std.tags})))
        }
        Method::PUT => {
            let body = require_body(req)?;
            let list = body
                .as_object()
                .map(|o| input::opt_str_list(o, "tags"))
                .transpose()?
                .flatten()
                .ok_or_else(|| ApiError::invalid_input("Invalid tags body"))?;
            let tags = input::tags("tags", list)?;
            let std = tag_target(store, res, id)?;
            std.tags = tags;
            std.revision += 1;
            Ok(Reply::ok(json!({"tags": std.tags})))
        }
        Method::DELETE => {
            let std = tag_target(store, res, id)?;
            std.tags.clear();
            std.revision += 1;
            Ok(Reply::no_content())
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

fn tag_member(store: &mut Store, res: Resource, id: &str, tag: &str, m: &Method) -> ApiResult<Reply> {
    let not_found = || ApiError::not_found("TagNotFound", format!("Tag {tag} could not be found."));
    let std = tag_target(store, res, id)?;
    match *m {
        Method::GET => {
            if std.tags.iter().any(|t| t == tag) {
                Ok(Reply::no_content())
            } else {
                Err(not_found())
            }
        }
        Method::PUT => {
            let tags = input::tags("tags", vec![tag.to_string()])?;
            for t in tags {
                if !std.tags.contains(&t) {
                    std.tags.push(t);
                    std.revision += 1;
                }
            }
            // The real server answers `null` with 201.
            Ok(Reply::created(Value::Null))
        }
        Method::DELETE => {
            let before = std.tags.len();
            std.tags.retain(|t| t != tag);
            if std.tags.len() == before {
                return Err(not_found());
            }
            std.revision += 1;
            Ok(Reply::no_content())
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

// -------------------------------------------------------------------- lists

const LIST_CONTROL: [&str; 10] = [
    "fields",
    "limit",
    "marker",
    "page_reverse",
    "sort_key",
    "sort_dir",
    "tags",
    "tags-any",
    "not-tags",
    "not-tags-any",
];

fn fields_param(query: &[(String, String)]) -> Vec<String> {
    query
        .iter()
        .filter(|(k, _)| k == "fields")
        .flat_map(|(_, v)| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn select_fields(v: Value, fields: &[String]) -> Value {
    if fields.is_empty() {
        return v;
    }
    match v {
        Value::Object(o) => Value::Object(
            o.into_iter()
                .filter(|(k, _)| fields.iter().any(|f| f == k))
                .collect(),
        ),
        other => other,
    }
}

/// Standard attributes every collection filters on (security group rules have no `name`).
const STD_FILTERS: [&str; 8] = [
    "id",
    "name",
    "project_id",
    "tenant_id",
    "description",
    "revision_number",
    "created_at",
    "updated_at",
];

/// Whether a collection filters on `key` (neutron's filter-validation refuses others with 400).
fn filterable(res: Resource, key: &str) -> bool {
    let own: &[&str] = match res {
        Resource::Port => &[
            "network_id",
            "mac_address",
            "admin_state_up",
            "status",
            "device_id",
            "device_owner",
            "fixed_ips",
            "security_groups",
            "binding:host_id",
            "binding:vnic_type",
            "binding:vif_type",
            "binding:profile",
            "port_security_enabled",
            "ip_allocation",
            "allowed_address_pairs",
            "extra_dhcp_opts",
        ],
        Resource::Network => &[
            "admin_state_up",
            "mtu",
            "status",
            "shared",
            "router:external",
            "port_security_enabled",
            "subnets",
            "provider:network_type",
            "provider:physical_network",
            "provider:segmentation_id",
            "is_default",
            "availability_zone_hints",
        ],
        Resource::Subnet => &[
            "network_id",
            "ip_version",
            "cidr",
            "gateway_ip",
            "enable_dhcp",
            "subnetpool_id",
            "ipv6_ra_mode",
            "ipv6_address_mode",
            "segment_id",
            "router:external",
            "dns_nameservers",
            "host_routes",
            "service_types",
        ],
        Resource::SubnetPool => &[
            "prefixes",
            "ip_version",
            "default_prefixlen",
            "min_prefixlen",
            "max_prefixlen",
            "is_default",
            "shared",
            "address_scope_id",
            "default_quota",
        ],
        Resource::Router => &["admin_state_up", "status", "distributed", "ha", "flavor_id"],
        Resource::SecurityGroup => &["stateful", "shared"],
        Resource::SecurityGroupRule => &[
            "security_group_id",
            "direction",
            "ethertype",
            "protocol",
            "port_range_min",
            "port_range_max",
            "remote_ip_prefix",
            "remote_group_id",
            "normalized_cidr",
            "remote_address_group_id",
            "belongs_to_default_sg",
        ],
        Resource::Trunk => &["admin_state_up", "status", "port_id", "sub_ports"],
        Resource::AddressGroup => &["addresses", "shared"],
        Resource::FloatingIp => &[
            "floating_ip_address",
            "floating_network_id",
            "router_id",
            "port_id",
            "fixed_ip_address",
            "status",
        ],
    };
    let std = STD_FILTERS.contains(&key) && !(res == Resource::SecurityGroupRule && key == "name");
    std || own.contains(&key)
}

fn value_matches(v: &Value, wanted: &str) -> bool {
    match v {
        Value::String(s) => s == wanted,
        Value::Bool(b) => input::to_bool(&Value::String(wanted.to_string())).is_ok_and(|w| w == *b),
        Value::Number(n) => n.to_string() == wanted,
        Value::Null => wanted.is_empty() || wanted == "None",
        // List attributes (security_groups, subnets...) match when they contain the value.
        Value::Array(items) => items.iter().any(|i| value_matches(i, wanted)),
        Value::Object(_) => false,
    }
}

fn tag_set(q: &[(String, String)], key: &str) -> Vec<String> {
    q.iter()
        .filter(|(k, _)| k == key)
        .flat_map(|(_, v)| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Builds a predicate from the query's attribute filters; rejects unknown attributes like the real server.
fn filter_for(res: Resource, q: &[(String, String)]) -> ApiResult<impl Fn(&Value) -> bool> {
    let mut attr_filters: Vec<(String, Vec<String>)> = Vec::new();
    let mut fip_ips: Vec<String> = Vec::new();
    let mut fip_subnets: Vec<String> = Vec::new();
    let mut bad: Vec<String> = Vec::new();
    for (k, v) in q {
        if LIST_CONTROL.contains(&k.as_str()) {
            continue;
        }
        if res == Resource::Port && k == "fixed_ips" {
            match v.split_once('=') {
                Some(("ip_address", ip)) => fip_ips.push(ip.to_string()),
                Some(("subnet_id", s)) => fip_subnets.push(s.to_string()),
                _ => return Err(ApiError::bad_request(format!("Invalid fixed_ips filter '{v}'"))),
            }
            continue;
        }
        if !filterable(res, k) {
            if !bad.contains(k) {
                bad.push(k.clone());
            }
            continue;
        }
        match attr_filters.iter_mut().find(|(a, _)| a == k) {
            Some((_, vals)) => vals.push(v.clone()),
            None => attr_filters.push((k.clone(), vec![v.clone()])),
        }
    }
    if !bad.is_empty() {
        let list: Vec<String> = bad.iter().map(|b| format!("'{b}'")).collect();
        return Err(ApiError::bad_request(format!(
            "[{}] is invalid attribute for filtering",
            list.join(", ")
        )));
    }
    let all = tag_set(q, "tags");
    let any = tag_set(q, "tags-any");
    let not_all = tag_set(q, "not-tags");
    let not_any = tag_set(q, "not-tags-any");
    Ok(move |item: &Value| {
        for (k, vals) in &attr_filters {
            let key = if k == "tenant_id" {
                "project_id"
            } else {
                k.as_str()
            };
            let Some(v) = item.get(key) else { return false };
            if !vals.iter().any(|w| value_matches(v, w)) {
                return false;
            }
        }
        if !fip_ips.is_empty() || !fip_subnets.is_empty() {
            let ok = item
                .get("fixed_ips")
                .and_then(Value::as_array)
                .is_some_and(|fips| {
                    fips.iter().any(|f| {
                        let ip = f.get("ip_address").and_then(Value::as_str).unwrap_or_default();
                        let sn = f.get("subnet_id").and_then(Value::as_str).unwrap_or_default();
                        (fip_ips.is_empty() || fip_ips.iter().any(|x| x == ip))
                            && (fip_subnets.is_empty() || fip_subnets.iter().any(|x| x == sn))
                    })
                });
            if !ok {
                return false;
            }
        }
        let tags: Vec<&str> = item
            .get("tags")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let has = |t: &String| tags.contains(&t.as_str());
        if !all.iter().all(has) {
            return false;
        }
        if !any.is_empty() && !any.iter().any(has) {
            return false;
        }
        if !not_all.is_empty() && not_all.iter().all(has) {
            return false;
        }
        if not_any.iter().any(has) {
            return false;
        }
        true
    })
}

fn list_resource(store: &Store, res: Resource, req: &Request<'_>) -> ApiResult<Reply> {
    let pred = filter_for(res, &req.query)?;
    let ids = candidate_ids(store, res, &req.query);
    let filtered: Vec<Value> = match page_window(&req.query, &ids, |id| pred(&store.render(res, id))) {
        // Only what the page needs is rendered: the marker's record (where the page starts
        // after) and the next `limit` that pass. A sweep paging through thirty thousand ports
        // rendered all of them for each of its sixty pages.
        Some((from, limit)) => {
            let marker = from.checked_sub(1).map(|i| store.render(res, &ids[i]));
            marker
                .into_iter()
                .chain(
                    ids[from..]
                        .iter()
                        .map(|id| store.render(res, id))
                        .filter(|v| pred(v))
                        .take(limit),
                )
                .collect()
        }
        None => ids
            .iter()
            .map(|id| store.render(res, id))
            .filter(|v| pred(v))
            .collect(),
    };
    let marker_exists = |m: &str| store.exists(res, m);
    list_reply(req, res.plural_key(), filtered, Some(res), marker_exists)
}

/// For a forward page in id order (`limit`, no `sort_key`, no `page_reverse`): where in `ids` the
/// page starts and its size. `None` when the whole list must be rendered first (sorted or reverse
/// pages, and a marker that is not itself listed, whose handling [`list_reply`] decides).
fn page_window(
    q: &[(String, String)],
    ids: &[String],
    listed: impl Fn(&str) -> bool,
) -> Option<(usize, usize)> {
    let get = |k: &str| q.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
    if get("sort_key").is_some() || get("page_reverse").is_some() {
        return None;
    }
    let limit = get("limit")?.parse::<usize>().ok().filter(|l| *l > 0)?;
    match get("marker") {
        None => Some((0, limit)),
        Some(m) => {
            let at = ids.binary_search_by(|id| id.as_str().cmp(m)).ok()?;
            listed(m).then_some((at + 1, limit))
        }
    }
}

/// The ids a list may return, sorted, narrowed before anything is rendered: to the `id` filters'
/// values when there are any, and to the records whose tags pass the tag filters (a server
/// answers such lists from its indexes; rendering every port to filter thirty thousand of them
/// made the emulator the bottleneck of the scale benchmarks). The full predicate still runs on
/// what is rendered.
fn candidate_ids(store: &Store, res: Resource, q: &[(String, String)]) -> Vec<String> {
    let wanted: Vec<&str> = q
        .iter()
        .filter(|(k, _)| k == "id")
        .map(|(_, v)| v.as_str())
        .collect();
    let mut ids: Vec<String> = if wanted.is_empty() {
        store.ids(res)
    } else {
        let mut ids: Vec<String> = wanted
            .into_iter()
            .filter(|id| store.exists(res, id))
            .map(str::to_string)
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let (all, any) = (tag_set(q, "tags"), tag_set(q, "tags-any"));
    let (not_all, not_any) = (tag_set(q, "not-tags"), tag_set(q, "not-tags-any"));
    if all.is_empty() && any.is_empty() && not_all.is_empty() && not_any.is_empty() {
        return ids;
    }
    ids.retain(|id| {
        let Some(tags) = store.tags_of(res, id) else {
            return true;
        };
        let has = |t: &String| tags.contains(t);
        all.iter().all(has)
            && (any.is_empty() || any.iter().any(has))
            && (not_all.is_empty() || !not_all.iter().all(has))
            && !not_any.iter().any(has)
    });
    ids
}

/// Sorting, marker/limit pagination with `<plural>_links`, and `fields=` selection.
fn list_reply(
    req: &Request<'_>,
    key: &str,
    mut items: Vec<Value>,
    res: Option<Resource>,
    marker_exists: impl Fn(&str) -> bool,
) -> ApiResult<Reply> {
    let q = &req.query;
    let get = |k: &str| q.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
    let sort_keys: Vec<&str> = q
        .iter()
        .filter(|(k, _)| k == "sort_key")
        .map(|(_, v)| v.as_str())
        .collect();
    let sort_dirs: Vec<&str> = q
        .iter()
        .filter(|(k, _)| k == "sort_dir")
        .map(|(_, v)| v.as_str())
        .collect();
    for d in &sort_dirs {
        if *d != "asc" && *d != "desc" {
            return Err(ApiError::bad_request(format!(
                "['{d}'] is invalid value for sort_dirs, valid value is 'asc' and 'desc'"
            )));
        }
    }
    if sort_keys.len() != sort_dirs.len() {
        return Err(ApiError::bad_request(
            "The number of sort_keys and sort_dirs must be same",
        ));
    }
    if let Some(r) = res
        && let Some(bad) = sort_keys.iter().find(|k| !filterable(r, k))
    {
        return Err(ApiError::bad_request(format!(
            "['{bad}'] is invalid attribute for sort_keys"
        )));
    }
    if !sort_keys.is_empty() {
        items.sort_by(|a, b| {
            for (i, k) in sort_keys.iter().enumerate() {
                let ord = cmp_values(a.get(*k), b.get(*k));
                let ord = if sort_dirs.get(i).copied() == Some("desc") {
                    ord.reverse()
                } else {
                    ord
                };
                if ord != std::cmp::Ordering::Equal {
                    return ord;
                }
            }
            cmp_values(a.get("id"), b.get("id"))
        });
    }
    let limit = match get("limit") {
        None => None,
        Some(l) => match l.parse::<i64>() {
            Ok(n) if n >= 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("Bad limit request: Limit must be an integer 0 or greater and not '{l}'."),
                ));
            }
        },
    };
    let page_reverse =
        get("page_reverse").is_some_and(|v| input::to_bool(&Value::String(v.to_string())).unwrap_or(false));
    let marker = get("marker");
    let limit = limit.filter(|l| *l > 0);
    let mut links = Vec::new();
    if let Some(limit) = limit {
        if let Some(m) = marker
            && !marker_exists(m)
        {
            return Err(match res {
                Some(r) => ApiError::resource_not_found(r, m),
                None => ApiError::http_not_found(),
            });
        }
        let pos = marker.map(|m| {
            items
                .iter()
                .position(|v| v.get("id").and_then(Value::as_str) == Some(m))
        });
        let page: Vec<Value> = if page_reverse {
            let end = match pos {
                Some(Some(p)) => p,
                Some(None) => items.len(),
                None => items.len(),
            };
            let start = end.saturating_sub(limit);
            items[start..end].to_vec()
        } else {
            let start = match pos {
                Some(Some(p)) => p + 1,
                Some(None) => 0,
                None => 0,
            };
            items.iter().skip(start).take(limit).cloned().collect()
        };
        let first = page
            .first()
            .and_then(|v| v.get("id"))
            .and_then(Value::as_str)
            .map(String::from);
        let last = page
            .last()
            .and_then(|v| v.get("id"))
            .and_then(Value::as_str)
            .map(String::from);
        let short = page.len() < limit;
        if (!short || page_reverse)
            && let Some(last) = &last
        {
            links.push(json!({"rel": "next", "href": page_href(req, last, false)}));
        }
        if !(short && page_reverse)
            && let Some(first) = &first
        {
            links.push(json!({"rel": "previous", "href": page_href(req, first, true)}));
        }
        items = page;
    }
    let fields = fields_param(q);
    let out: Vec<Value> = items.into_iter().map(|v| select_fields(v, &fields)).collect();
    let mut body = Obj::new();
    body.insert(key.to_string(), Value::Array(out));
    if !links.is_empty() {
        body.insert(format!("{key}_links"), Value::Array(links));
    }
    Ok(Reply::ok(Value::Object(body)))
}

fn cmp_values(a: Option<&Value>, b: Option<&Value>) -> std::cmp::Ordering {
    match (a, b) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => x
            .as_f64()
            .unwrap_or(0.0)
            .partial_cmp(&y.as_f64().unwrap_or(0.0))
            .unwrap_or(std::cmp::Ordering::Equal),
        (Some(x), Some(y)) => x.to_string().cmp(&y.to_string()),
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

/// Same query minus marker/page_reverse, plus the new marker (and `page_reverse=True` for previous), like
/// neutron's `get_next_href` / `get_previous_href`.
fn page_href(req: &Request<'_>, marker: &str, previous: bool) -> String {
    let mut ser = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(req.raw_query.as_bytes()) {
        if k == "marker" || k == "page_reverse" {
            continue;
        }
        ser.append_pair(&k, &v);
    }
    ser.append_pair("marker", marker);
    if previous {
        ser.append_pair("page_reverse", "True");
    }
    format!("http://{}{}?{}", req.host, req.path, ser.finish())
}

/// The resource behind a tags URL. The real server answers 500 (a neutron bug) when it does not exist; so do we.
fn tag_target<'s>(store: &'s mut Store, res: Resource, id: &str) -> ApiResult<&'s mut crate::store::Std> {
    store.tags_mut(res, id).map_err(|_| ApiError::internal())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn tag_filters_combine_like_neutron() {
        let items = [
            json!({"id": "a", "tags": ["x", "y"]}),
            json!({"id": "b", "tags": ["x"]}),
            json!({"id": "c", "tags": ["z"]}),
            json!({"id": "d", "tags": []}),
        ];
        let matching = |q: &[(&str, &str)]| -> Vec<String> {
            let q = query(q);
            let Ok(pred) = filter_for(Resource::Port, &q) else {
                panic!("valid query {q:?}");
            };
            items
                .iter()
                .filter(|i| pred(i))
                .filter_map(|i| i["id"].as_str().map(String::from))
                .collect()
        };
        assert_eq!(matching(&[("tags", "x,y")]), ["a"], "tags: all of them");
        assert_eq!(
            matching(&[("tags", "x"), ("tags", "y")]),
            ["a"],
            "repeated parameters add up"
        );
        assert_eq!(matching(&[("tags-any", "y,z")]), ["a", "c"]);
        assert_eq!(
            matching(&[("not-tags", "x,y")]),
            ["b", "c", "d"],
            "not all of them"
        );
        assert_eq!(matching(&[("not-tags-any", "x")]), ["c", "d"]);
        assert_eq!(matching(&[("tags", "x"), ("not-tags-any", "y")]), ["b"]);
        assert_eq!(
            matching(&[("fields", "id"), ("limit", "2")]),
            ["a", "b", "c", "d"],
            "list controls are no filters"
        );
    }

    #[test]
    fn unknown_filter_attributes_are_refused() {
        let refused = |res: Resource, key: &str| {
            let q = query(&[(key, "v")]);
            filter_for(res, &q).err().map(|e| e.message)
        };
        assert_eq!(
            refused(Resource::Port, "bogus").as_deref(),
            Some("['bogus'] is invalid attribute for filtering")
        );
        assert_eq!(refused(Resource::Port, "name"), None);
        assert_eq!(refused(Resource::Port, "binding:host_id"), None);
        assert!(
            refused(Resource::SecurityGroupRule, "name").is_some(),
            "rules have no name"
        );
        assert_eq!(refused(Resource::SecurityGroupRule, "remote_group_id"), None);
    }
}
