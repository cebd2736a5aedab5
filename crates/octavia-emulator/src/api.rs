//! Routing of `/v2/lbaas/...` (and the `/v2.0/lbaas/...` alias Octavia keeps for neutron-lbaas clients), list
//! filters and pagination. Parses requests and renders replies; every rule lives in `store`.

use std::time::Instant;

use axum::http::Method;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::store::{Common, Store, providers};

pub struct Reply {
    pub status: u16,
    pub body: Option<Value>,
}

fn ok(status: u16, body: Value) -> Result<Reply, ApiError> {
    Ok(Reply {
        status,
        body: Some(body),
    })
}

fn empty(status: u16) -> Result<Reply, ApiError> {
    Ok(Reply { status, body: None })
}

/// `<resource>.<action>` of a call, the key of stats, latency tables and fault rules.
pub fn classify(method: &Method, segs: &[String]) -> String {
    let res = match segs.first().map(String::as_str) {
        Some("loadbalancers") => "loadbalancer",
        Some("listeners") => "listener",
        Some("pools") if segs.len() >= 3 && segs[2] == "members" => "member",
        Some("pools") => "pool",
        Some("healthmonitors") => "healthmonitor",
        Some("quotas") => "quota",
        Some("providers") => "provider",
        Some("amphorae") => "amphora",
        _ => "unknown",
    };
    let item = match res {
        "member" => segs.len() >= 4,
        _ => segs.len() >= 2,
    };
    let action = match (method.as_str(), item, segs.get(2).map(String::as_str)) {
        ("GET", true, Some("status" | "statuses")) if res == "loadbalancer" => "status",
        ("GET", true, Some("stats")) if res == "loadbalancer" => "stats",
        ("PUT", true, Some("failover")) if res == "loadbalancer" => "failover",
        ("GET", true, _) => "get",
        ("GET", false, _) => "list",
        ("POST", _, _) => "create",
        ("PUT", false, _) if res == "member" => "batch_update",
        ("PUT", _, _) => "update",
        ("DELETE", _, _) => "delete",
        _ => "other",
    };
    format!("{res}.{action}")
}

fn query_bool(query: &[(String, String)], key: &str) -> bool {
    query.iter().any(|(k, v)| {
        k == key
            && matches!(
                v.to_ascii_lowercase().as_str(),
                "true" | "1" | "yes" | "on" | "y" | "t"
            )
    })
}

fn need_body(body: Option<&Value>) -> Result<&Value, ApiError> {
    body.ok_or_else(|| ApiError::new(400, "Invalid input: the request body is missing"))
}

/// One parsed API request.
pub struct Request<'a> {
    pub method: &'a Method,
    /// Path segments after `/v2/lbaas`.
    pub segs: &'a [String],
    pub query: &'a [(String, String)],
    pub body: Option<&'a Value>,
    /// Scheme, host and path, for pagination links.
    pub path_url: &'a str,
    /// The request context's project (`X-Project-Id` under noauth).
    pub context_project: Option<&'a str>,
}

pub fn handle(store: &mut Store, req: &Request<'_>, now: Instant) -> Result<Reply, ApiError> {
    let Request {
        method,
        segs,
        query,
        body,
        path_url,
        context_project,
    } = *req;
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let m = method.as_str();
    match (m, s.as_slice()) {
        ("GET", ["providers"]) => ok(200, providers::render_providers()),
        ("GET", ["amphorae"]) => {
            let amps = store.amphorae();
            list(
                path_url,
                "amphorae",
                query,
                amps.iter().map(|(c, v)| (c, v.clone())),
            )
        }
        ("GET", ["amphorae", id]) => {
            let amp = store.amphorae().into_iter().find(|(c, _)| c.id == *id);
            let (_, v) = amp.ok_or_else(|| ApiError::not_found("Amphora", id))?;
            ok(200, json!({ "amphora": v }))
        }
        ("GET", ["loadbalancers"]) => list(
            path_url,
            "loadbalancers",
            query,
            store
                .loadbalancers
                .values()
                .map(|x| (&x.common, store.render_loadbalancer(&x.common.id, false))),
        ),
        ("POST", ["loadbalancers"]) => ok(
            201,
            store.create_loadbalancer(context_project, need_body(body)?, now)?,
        ),
        ("GET", ["loadbalancers", id]) => {
            store
                .loadbalancers
                .get(*id)
                .ok_or_else(|| ApiError::not_found("Load Balancer", id))?;
            ok(
                200,
                json!({ "loadbalancer": store.render_loadbalancer(id, false) }),
            )
        }
        ("PUT", ["loadbalancers", id]) => ok(200, store.update_loadbalancer(id, need_body(body)?, now)?),
        ("DELETE", ["loadbalancers", id]) => {
            store.delete_loadbalancer(id, query_bool(query, "cascade"), now)?;
            empty(204)
        }
        ("GET", ["loadbalancers", id, "status" | "statuses"]) => ok(200, store.loadbalancer_status(id)?),
        ("PUT", ["loadbalancers", id, "failover"]) => {
            store.failover_loadbalancer(id, now)?;
            empty(202)
        }
        ("GET", ["loadbalancers", id, "stats"]) => ok(200, store.loadbalancer_stats(id)?),
        ("GET", ["listeners"]) => list(
            path_url,
            "listeners",
            query,
            store
                .listeners
                .values()
                .map(|x| (&x.common, store.render_listener(&x.common.id, false))),
        ),
        ("POST", ["listeners"]) => ok(201, store.create_listener(need_body(body)?, now)?),
        ("GET", ["listeners", id]) => {
            store
                .listeners
                .get(*id)
                .ok_or_else(|| ApiError::not_found("Listener", id))?;
            ok(200, json!({ "listener": store.render_listener(id, false) }))
        }
        ("PUT", ["listeners", id]) => ok(200, store.update_listener(id, need_body(body)?, now)?),
        ("DELETE", ["listeners", id]) => {
            store.delete_listener(id, now)?;
            empty(204)
        }
        ("GET", ["pools"]) => list(
            path_url,
            "pools",
            query,
            store
                .pools
                .values()
                .map(|x| (&x.common, store.render_pool(&x.common.id, false))),
        ),
        ("POST", ["pools"]) => ok(201, store.create_pool(need_body(body)?, now)?),
        ("GET", ["pools", id]) => {
            store
                .pools
                .get(*id)
                .ok_or_else(|| ApiError::not_found("Pool", id))?;
            ok(200, json!({ "pool": store.render_pool(id, false) }))
        }
        ("PUT", ["pools", id]) => ok(200, store.update_pool(id, need_body(body)?, now)?),
        ("DELETE", ["pools", id]) => {
            store.delete_pool(id, now)?;
            empty(204)
        }
        ("GET", ["pools", pid, "members"]) => {
            store
                .pools
                .get(*pid)
                .ok_or_else(|| ApiError::not_found("Pool", pid))?;
            let items = store
                .members
                .values()
                .filter(|x| x.pool_id == *pid)
                .map(|x| (&x.common, store.render_member(&x.common.id)));
            list(path_url, "members", query, items)
        }
        ("POST", ["pools", pid, "members"]) => ok(201, store.create_member(pid, need_body(body)?, now)?),
        ("PUT", ["pools", pid, "members"]) => {
            store.batch_update_members(pid, need_body(body)?, query_bool(query, "additive_only"), now)?;
            empty(202)
        }
        ("GET", ["pools", pid, "members", id]) => {
            if store.members.get(*id).is_none_or(|x| x.pool_id != *pid) {
                return Err(ApiError::not_found("Member", id));
            }
            ok(200, json!({ "member": store.render_member(id) }))
        }
        ("PUT", ["pools", pid, "members", id]) => {
            ok(200, store.update_member(pid, id, need_body(body)?, now)?)
        }
        ("DELETE", ["pools", pid, "members", id]) => {
            store.delete_member(pid, id, now)?;
            empty(204)
        }
        ("GET", ["healthmonitors"]) => list(
            path_url,
            "healthmonitors",
            query,
            store
                .healthmonitors
                .values()
                .map(|x| (&x.common, store.render_healthmonitor(&x.common.id, false))),
        ),
        ("POST", ["healthmonitors"]) => ok(201, store.create_healthmonitor(need_body(body)?, now)?),
        ("GET", ["healthmonitors", id]) => {
            store
                .healthmonitors
                .get(*id)
                .ok_or_else(|| ApiError::not_found("Health Monitor", id))?;
            ok(
                200,
                json!({ "healthmonitor": store.render_healthmonitor(id, false) }),
            )
        }
        ("PUT", ["healthmonitors", id]) => ok(200, store.update_healthmonitor(id, need_body(body)?, now)?),
        ("DELETE", ["healthmonitors", id]) => {
            store.delete_healthmonitor(id, now)?;
            empty(204)
        }
        ("GET", ["quotas"]) => ok(200, store.list_quotas()),
        ("GET", ["quotas", project]) => ok(200, json!({ "quota": store.quota_for(project).render(project) })),
        ("GET", ["quotas", project, "default"]) => ok(
            200,
            json!({ "quota": crate::store::Quota::default().render(project) }),
        ),
        ("PUT", ["quotas", project]) => ok(202, store.update_quota(project, need_body(body)?)?),
        ("DELETE", ["quotas", project]) => {
            store.quotas.remove(*project);
            empty(202)
        }
        (
            _,
            [
                "loadbalancers" | "listeners" | "pools" | "healthmonitors" | "quotas" | "providers",
                ..,
            ],
        ) => Err(ApiError::method_not_allowed()),
        _ => Err(ApiError::path_not_found()),
    }
}

/// Octavia's pagination helper: equality filters on rendered attributes, `tags`/`tags-any`/`not-tags`/
/// `not-tags-any` (comma lists, repeatable), `fields`, `limit` + `marker` (by id) in creation order.
fn list<'a>(
    path_url: &str,
    key: &str,
    query: &[(String, String)],
    items: impl Iterator<Item = (&'a Common, Value)>,
) -> Result<Reply, ApiError> {
    let mut items: Vec<(&Common, Value)> = items.collect();
    items.sort_by_key(|(c, _)| c.seq);
    let tag_set = |name: &str| -> Vec<String> {
        query
            .iter()
            .filter(|(k, _)| k == name)
            .flat_map(|(_, v)| v.split(',').map(str::to_string).collect::<Vec<_>>())
            .filter(|t| !t.is_empty())
            .collect()
    };
    let (all, any, not_all, not_any) = (
        tag_set("tags"),
        tag_set("tags-any"),
        tag_set("not-tags"),
        tag_set("not-tags-any"),
    );
    let mut limit = None;
    let mut marker = None;
    let mut fields: Vec<String> = Vec::new();
    let mut filters: Vec<(&str, &str)> = Vec::new();
    for (k, v) in query {
        match k.as_str() {
            "tags" | "tags-any" | "not-tags" | "not-tags-any" | "page_reverse" | "sort" | "sort_key"
            | "sort_dir" => {}
            "limit" => {
                limit = Some(v.parse::<usize>().map_err(|_| {
                    ApiError::new(400, format!("Supplied pagination limit '{v}' is not valid."))
                })?)
            }
            "marker" => marker = Some(v.clone()),
            "fields" => fields.extend(v.split(',').map(str::to_string)),
            _ => filters.push((k.as_str(), v.as_str())),
        }
    }
    items.retain(|(c, v)| {
        let has = |t: &String| c.tags.contains(t);
        (all.is_empty() || all.iter().all(has))
            && (any.is_empty() || any.iter().any(has))
            && (not_all.is_empty() || !not_all.iter().all(has))
            && (not_any.is_empty() || !not_any.iter().any(has))
            && filters.iter().all(|(k, want)| matches_filter(v, k, want))
    });
    if let Some(mk) = &marker {
        let pos = items
            .iter()
            .position(|(c, _)| &c.id == mk)
            .ok_or_else(|| ApiError::new(400, format!("Supplied pagination marker '{mk}' is not valid.")))?;
        items.drain(..=pos);
    }
    // Octavia's pagination helper: the page size defaults to `pagination_max_limit` (1000); a full page gets a
    // `next` link (even when nothing follows), a page reached through a marker a `previous` link.
    let limit = limit.unwrap_or(1000);
    items.truncate(limit);
    let mut links = Vec::new();
    if let (Some((first, _)), Some((last, _))) = (items.first(), items.last()) {
        if marker.is_some() {
            links.push(json!({"href": format!("{path_url}?limit={limit}&marker={}&page_reverse=True", first.id), "rel": "previous"}));
        }
        if items.len() >= limit {
            links
                .push(json!({"href": format!("{path_url}?limit={limit}&marker={}", last.id), "rel": "next"}));
        }
    }
    let rendered: Vec<Value> = items
        .into_iter()
        .map(|(_, v)| {
            if fields.is_empty() {
                return v;
            }
            let mut out = serde_json::Map::new();
            for f in &fields {
                if let Some(x) = v.get(f) {
                    out.insert(f.clone(), x.clone());
                }
            }
            Value::Object(out)
        })
        .collect();
    ok(200, json!({ key: rendered, format!("{key}_links"): links }))
}

/// Filters compare with the attribute's rendering (`loadbalancer_id` matches the `loadbalancers` id list).
fn matches_filter(v: &Value, key: &str, want: &str) -> bool {
    let attr = match key {
        // Children name their load balancers in a list; amphorae have a plain attribute.
        "loadbalancer_id" if v.get("loadbalancer_id").is_some() => v.get(key),
        "loadbalancer_id" => {
            return v
                .get("loadbalancers")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|i| i["id"] == want));
        }
        "pool_id" => {
            return v
                .get("pools")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|i| i["id"] == want));
        }
        k => v.get(k),
    };
    match attr {
        Some(Value::String(s)) => s == want,
        Some(Value::Bool(b)) => b.to_string() == want.to_ascii_lowercase(),
        Some(Value::Number(n)) => n.to_string() == want,
        Some(Value::Null) => false,
        // Octavia's pagination helper drops filters on attributes the model does not have.
        None => true,
        _ => false,
    }
}

/// The API versions Octavia's root controller lists (all served under `/v2`); the last one is CURRENT.
const VERSIONS: [(&str, &str); 31] = [
    ("v2.0", "2016-12-11T00:00:00Z"),
    ("v2.1", "2018-04-20T00:00:00Z"),
    ("v2.2", "2018-07-31T00:00:00Z"),
    ("v2.3", "2018-12-18T00:00:00Z"),
    ("v2.4", "2018-12-19T00:00:00Z"),
    ("v2.5", "2019-01-21T00:00:00Z"),
    ("v2.6", "2019-01-25T00:00:00Z"),
    ("v2.7", "2018-01-25T12:00:00Z"),
    ("v2.8", "2019-02-12T00:00:00Z"),
    ("v2.9", "2019-03-04T00:00:00Z"),
    ("v2.10", "2019-03-05T00:00:00Z"),
    ("v2.11", "2019-06-24T00:00:00Z"),
    ("v2.12", "2019-09-11T00:00:00Z"),
    ("v2.13", "2019-09-13T00:00:00Z"),
    ("v2.14", "2019-11-10T00:00:00Z"),
    ("v2.15", "2020-03-10T00:00:00Z"),
    ("v2.16", "2020-03-15T00:00:00Z"),
    ("v2.17", "2020-04-29T00:00:00Z"),
    ("v2.18", "2020-04-29T01:00:00Z"),
    ("v2.19", "2020-05-12T00:00:00Z"),
    ("v2.20", "2020-08-02T00:00:00Z"),
    ("v2.21", "2020-09-03T00:00:00Z"),
    ("v2.22", "2020-09-04T00:00:00Z"),
    ("v2.23", "2020-09-07T00:00:00Z"),
    ("v2.24", "2020-10-15T00:00:00Z"),
    ("v2.25", "2021-10-02T00:00:00Z"),
    ("v2.26", "2022-08-29T00:00:00Z"),
    ("v2.27", "2023-05-05T00:00:00Z"),
    ("v2.28", "2023-11-08T00:00:00Z"),
    ("v2.29", "2024-10-15T00:00:00Z"),
    ("v2.30", "2025-02-26T00:00:00Z"),
];

/// `GET /`: the version document, with links relative to the request URL.
pub fn versions(host_url: &str) -> Value {
    let base = if host_url.ends_with('/') {
        host_url.to_string()
    } else {
        format!("{host_url}/")
    };
    let list: Vec<Value> = VERSIONS
        .iter()
        .enumerate()
        .map(|(i, (id, updated))| {
            let status = if i + 1 == VERSIONS.len() { "CURRENT" } else { "SUPPORTED" };
            json!({"id": id, "status": status, "updated": updated, "links": [{"href": format!("{base}v2"), "rel": "self"}]})
        })
        .collect();
    json!({ "versions": list })
}
