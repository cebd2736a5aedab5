//! The HTTP layer: path routing, discovery, OpenAPI v3, CRUD verbs, watch streaming, Table output
//! and bearer-token auth. All state lives in [`Store`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::error::{ApiError, ApiResult};
use crate::event_shapes;
use crate::patch::PatchType;
use crate::rbac;
use crate::resources::ResourceDef;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{
    DeleteOpts, EventType, FieldValidation, ListOpts, Propagation, Store, WatchEvent, WriteOpts, event_line,
};
use crate::table;

/// Shared server state.
pub struct App {
    pub store: Arc<Store>,
    pub token: Option<String>,
    pub bookmark_interval: Duration,
    pub sa_tokens: ServiceAccountTokens,
    /// Authorize ServiceAccount requests (see [`crate::rbac`]).
    pub rbac: bool,
    pub requests: crate::requests::RequestStats,
    /// While set, every API request answers 503 (an API server outage; see
    /// [`crate::KubeHandle::set_unavailable`]).
    pub unavailable: Arc<std::sync::atomic::AtomicBool>,
    /// While `true`, list requests wait (see [`crate::KubeHandle::hold_lists`]).
    pub lists_held: Arc<tokio::sync::watch::Sender<bool>>,
}

/// Bearer tokens issued to ServiceAccounts, what their requests were allowed to do, and what
/// they were refused.
#[derive(Clone, Default)]
pub struct ServiceAccountTokens(
    Arc<std::sync::RwLock<HashMap<String, rbac::ServiceAccount>>>,
    Arc<std::sync::Mutex<std::collections::BTreeSet<rbac::Used>>>,
    Arc<std::sync::Mutex<std::collections::BTreeSet<rbac::Used>>>,
);

impl ServiceAccountTokens {
    pub fn issue(&self, sa: rbac::ServiceAccount) -> String {
        let token = format!(
            "kube-emulator-sa.{}.{}.{}",
            sa.namespace,
            sa.name,
            uuid::Uuid::new_v4().simple()
        );
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(token.clone(), sa);
        token
    }

    fn record(&self, used: rbac::Used, allowed: bool) {
        let set = if allowed { &self.1 } else { &self.2 };
        set.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(used);
    }

    /// Every (user, verb, group, resource) an authorized request used.
    pub fn used(&self) -> Vec<rbac::Used> {
        Self::all(&self.1)
    }

    /// Every (user, verb, group, resource) a request was refused (403).
    pub fn denied(&self) -> Vec<rbac::Used> {
        Self::all(&self.2)
    }

    fn all(set: &std::sync::Mutex<std::collections::BTreeSet<rbac::Used>>) -> Vec<rbac::Used> {
        set.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    fn lookup(&self, token: &str) -> Option<rbac::ServiceAccount> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(token)
            .cloned()
    }
}

/// Who made a request: `None` for the superuser token (or no token where none is required).
#[derive(Clone, Default)]
struct Identity(Option<rbac::ServiceAccount>);

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .fallback(handle)
        .layer(middleware::from_fn_with_state(app.clone(), auth))
        .layer(DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(app)
}

async fn auth(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    app.requests
        .record(req.method(), req.uri().path(), req.uri().query());
    if app.unavailable.load(std::sync::atomic::Ordering::Relaxed) {
        return error_response(&ApiError::new(
            503,
            "ServiceUnavailable",
            "the API server is unavailable (emulated outage)",
        ));
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(|t| t.trim().to_owned());
    let service_account = bearer.as_deref().and_then(|t| app.sa_tokens.lookup(t));
    if service_account.is_none()
        && let Some(token) = &app.token
    {
        let ok = bearer.as_deref() == Some(token.as_str());
        if !ok && !matches!(req.uri().path(), "/healthz" | "/readyz" | "/livez") {
            return error_response(&ApiError::unauthorized());
        }
    }
    req.extensions_mut().insert(Identity(service_account));
    next.run(req).await
}

/// With RBAC on, a ServiceAccount's resource request needs a matching rule.
fn authorize(app: &App, identity: &Identity, method: &Method, t: &Target, q: &Query) -> ApiResult<()> {
    let (true, Some(who)) = (app.rbac, &identity.0) else {
        return Ok(());
    };
    let resource = match &t.sub {
        Some(sub) => format!("{}/{sub}", t.def.plural),
        None => t.def.plural.clone(),
    };
    let attrs = rbac::Attributes {
        verb: rbac::verb(method, t.name.is_some(), t.watch_prefix || flag(q, "watch")),
        group: &t.def.group,
        resource,
        namespace: t.ns.as_deref(),
        name: t.name.as_deref(),
    };
    let policy = app.store.rbac_policy();
    let allowed = rbac::allows(&policy, who, &attrs);
    app.sa_tokens.record(
        rbac::Used {
            user: who.username(),
            verb: attrs.verb.to_owned(),
            group: attrs.group.to_owned(),
            resource: attrs.resource.clone(),
        },
        allowed,
    );
    if allowed {
        Ok(())
    } else {
        Err(rbac::forbidden(who, &attrs))
    }
}

fn json_response(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

fn error_response(err: &ApiError) -> Response {
    json_response(err.code, &err.to_status())
}

fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('"', "'"));
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append("warning", v);
        }
    }
    resp
}

/// How the client wants objects rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Render {
    Full,
    Table,
    Metadata,
}

fn render_mode(headers: &HeaderMap) -> Render {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    // The first acceptable media type wins, as in the real content negotiation.
    for part in accept.split(',') {
        if part.contains("as=Table") {
            return Render::Table;
        }
        if part.contains("as=PartialObjectMetadata") {
            return Render::Metadata;
        }
        let base = part.split(';').next().unwrap_or_default().trim();
        if matches!(base, "application/json" | "*/*" | "application/yaml") {
            return Render::Full;
        }
    }
    Render::Full
}

fn partial(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))})
}

type Query = HashMap<String, String>;

fn parse_query(q: Option<&str>) -> Query {
    url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn flag(q: &Query, k: &str) -> bool {
    q.get(k).is_some_and(|v| v == "true" || v == "1")
}

fn write_opts(q: &Query) -> ApiResult<WriteOpts> {
    let field_validation = match q.get("fieldValidation").map(String::as_str) {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "fieldValidation: invalid value {other:?}: must be Ignore, Warn or Strict"
            )));
        }
    };
    Ok(WriteOpts {
        dry_run: dry_run(q)?,
        field_manager: q.get("fieldManager").cloned(),
        force: false,
        field_validation,
    })
}

/// `fieldManager` or, like the real server for non-apply writes, the User-Agent up to its first `/`.
fn write_opts_with_manager(q: &Query, headers: &HeaderMap) -> ApiResult<WriteOpts> {
    let mut opts = write_opts(q)?;
    if opts.field_manager.as_deref().is_none_or(str::is_empty) {
        opts.field_manager = headers
            .get(header::USER_AGENT)
            .and_then(|h| h.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .map(|m| m.chars().take(128).collect::<String>())
            .filter(|m| !m.is_empty());
    }
    Ok(opts)
}

fn dry_run(q: &Query) -> ApiResult<bool> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "dryRun: Unsupported value: {other:?}: supported values: \"All\""
        ))),
    }
}

fn list_opts(q: &Query, def: &ResourceDef) -> ApiResult<ListOpts> {
    let fields = q.get("fieldSelector").map(String::as_str).unwrap_or_default();
    Ok(ListOpts {
        labels: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or_default())?,
        fields: FieldSelector::parse(fields, def)?,
        limit: match q.get("limit").filter(|l| !l.is_empty()) {
            Some(l) => Some(l.parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "limit: invalid value {l:?}: must be a non-negative integer"
                ))
            })?),
            None => None,
        },
        continue_: q.get("continue").filter(|c| !c.is_empty()).cloned(),
    })
}

/// The requested shape of a resource and the resource it is stored as: the same except for
/// events.k8s.io Events, which live in the core `events` storage (see [`event_shapes`]).
struct Shape {
    def: Arc<ResourceDef>,
    storage: Arc<ResourceDef>,
    events_v1: bool,
}

impl Shape {
    fn of(store: &Store, def: &Arc<ResourceDef>) -> ApiResult<Self> {
        if !event_shapes::is_events_v1(def) {
            return Ok(Self {
                def: def.clone(),
                storage: def.clone(),
                events_v1: false,
            });
        }
        Ok(Self {
            def: def.clone(),
            storage: store.find("", "v1", "events").ok_or_else(not_found_path)?,
            events_v1: true,
        })
    }

    /// Selectors are validated against the requested shape's field names, then matched against
    /// the stored shape's.
    fn list_opts(&self, q: &Query) -> ApiResult<ListOpts> {
        let opts = list_opts(q, &self.def)?;
        if !self.events_v1 {
            return Ok(opts);
        }
        let sel = q.get("fieldSelector").map(String::as_str).unwrap_or_default();
        Ok(ListOpts {
            fields: FieldSelector::parse(&event_shapes::field_selector_to_core(sel), &self.storage)?,
            ..opts
        })
    }

    fn inbound(&self, body: Value) -> Value {
        if self.events_v1 {
            event_shapes::to_core(body)
        } else {
            body
        }
    }

    fn inbound_patch(&self, ptype: PatchType, body: Value) -> Value {
        match (self.events_v1, ptype) {
            (false, _) => body,
            (true, PatchType::Json) => event_shapes::json_patch_to_core(body),
            (true, _) => event_shapes::to_core(body),
        }
    }

    fn outbound<'a>(&self, obj: &'a Value) -> Cow<'a, Value> {
        if self.events_v1 {
            Cow::Owned(event_shapes::to_events_v1(obj))
        } else {
            Cow::Borrowed(obj)
        }
    }

    fn outbound_all(&self, items: Vec<Arc<Value>>) -> Vec<Arc<Value>> {
        if self.events_v1 {
            items
                .iter()
                .map(|i| Arc::new(event_shapes::to_events_v1(i)))
                .collect()
        } else {
            items
        }
    }
}

fn parse_body(headers: &HeaderMap, body: &[u8]) -> ApiResult<Value> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("application/json");
    let base = ct.split(';').next().unwrap_or_default().trim();
    match base {
        "application/json"
        | ""
        | "application/merge-patch+json"
        | "application/json-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/apply-patch+json" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}"))),
        "application/yaml" | "application/apply-patch+yaml" => serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid YAML: {e}"))),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

/// A parsed resource URL.
struct Target {
    def: Arc<ResourceDef>,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    watch_prefix: bool,
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn resolve(store: &Store, group: &str, version: &str, rest: &[&str]) -> ApiResult<Target> {
    let (watch_prefix, rest) = match rest.first() {
        Some(&"watch") => (true, &rest[1..]),
        _ => (false, rest),
    };
    let (plural, ns, tail): (&str, Option<&str>, &[&str]) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if group.is_empty() && version == "v1" && !matches!(*plural, "status" | "finalize") =>
        {
            (plural, Some(ns), tail)
        }
        ["namespaces", ns, plural, tail @ ..] if !group.is_empty() => (plural, Some(ns), tail),
        [plural, tail @ ..] => (plural, None, tail),
        [] => return Err(not_found_path()),
    };
    let def = store.find(group, version, plural).ok_or_else(not_found_path)?;
    if ns.is_some() && !def.namespaced {
        return Err(not_found_path());
    }
    let (name, sub) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, sub] => (Some(name.to_string()), Some(sub.to_string())),
        _ => return Err(not_found_path()),
    };
    if def.namespaced && ns.is_none() && name.is_some() {
        return Err(not_found_path());
    }
    Ok(Target {
        def,
        ns: ns.map(String::from),
        name,
        sub,
        watch_prefix,
    })
}

/// Whether a GET of `segs` lists a collection (not a get of one object, not a watch).
fn is_list(store: &Store, segs: &[&str], q: &Query) -> bool {
    let target = match segs {
        ["api", "v1", rest @ ..] => resolve(store, "", "v1", rest).ok(),
        ["apis", g, v, rest @ ..] => resolve(store, g, v, rest).ok(),
        _ => None,
    };
    target.is_some_and(|t| t.name.is_none() && t.sub.is_none() && !t.watch_prefix && !flag(q, "watch"))
}

async fn handle(
    State(app): State<Arc<App>>,
    axum::Extension(identity): axum::Extension<Identity>,
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let q = parse_query(uri.query());
    let path = uri.path().trim_matches('/').to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if method == Method::GET && *app.lists_held.borrow() && is_list(&app.store, &segs, &q) {
        let _ = app.lists_held.subscribe().wait_for(|held| !held).await;
    }
    let result = match (method.clone(), segs.as_slice()) {
        (Method::GET, ["version"]) => Ok(json_response(200, &version())),
        (Method::GET, ["healthz" | "readyz" | "livez"]) => Ok((StatusCode::OK, "ok").into_response()),
        (Method::GET, ["api"]) => Ok(json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default()}]}),
        )),
        (Method::GET, ["apis"]) => Ok(json_response(200, &api_groups(&app.store))),
        (Method::GET, ["api", "v1"]) => resource_list(&app.store, "", "v1"),
        (Method::GET, ["apis", g]) => api_group(&app.store, g),
        (Method::GET, ["apis", g, v]) => resource_list(&app.store, g, v),
        (Method::GET, ["openapi", "v3"]) => Ok(json_response(200, &openapi_root(&app.store))),
        (Method::GET, ["openapi", "v3", "api", "v1"]) => openapi_doc(&app.store, "", "v1"),
        (Method::GET, ["openapi", "v3", "apis", g, v]) => openapi_doc(&app.store, g, v),
        (_, ["api", "v1", rest @ ..]) => resolve(&app.store, "", "v1", rest).and_then(|t| {
            authorize(&app, &identity, &method, &t, &q)?;
            serve(&app, method.clone(), t, &q, &headers, &body)
        }),
        (_, ["apis", g, v, rest @ ..]) => resolve(&app.store, g, v, rest).and_then(|t| {
            authorize(&app, &identity, &method, &t, &q)?;
            serve(&app, method.clone(), t, &q, &headers, &body)
        }),
        _ => Err(not_found_path()),
    };
    match result {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(%method, %uri, code = e.code, reason = e.reason, "request failed: {}", e.message);
            error_response(&e)
        }
    }
}

fn version() -> Value {
    json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0-kube-emulator", "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean", "buildDate": "2024-12-11T00:00:00Z", "goVersion": "go1.23.4", "compiler": "gc", "platform": "linux/amd64"})
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(json!({}))})
}

fn groups(store: &Store) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for ((g, v), _) in store.registry().group_versions() {
        if g.is_empty() {
            continue;
        }
        match out.iter_mut().find(|(og, _)| og == g) {
            Some((_, vs)) => vs.push(v.clone()),
            None => out.push((g.clone(), vec![v.clone()])),
        }
    }
    out
}

fn api_groups(store: &Store) -> Value {
    let gs: Vec<Value> = groups(store).iter().map(|(g, vs)| group_json(g, vs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

fn api_group(store: &Store, group: &str) -> ApiResult<Response> {
    let gs = groups(store);
    let (_, vs) = gs.iter().find(|(g, _)| g == group).ok_or_else(not_found_path)?;
    let mut body = group_json(group, vs);
    body["kind"] = json!("APIGroup");
    body["apiVersion"] = json!("v1");
    Ok(json_response(200, &body))
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn resource_list(store: &Store, group: &str, version: &str) -> ApiResult<Response> {
    let reg = store.registry();
    let defs = reg.resources(group, version).ok_or_else(not_found_path)?;
    let mut resources = Vec::new();
    for d in defs {
        let mut r = json!({"name": d.plural, "singularName": d.singular, "namespaced": d.namespaced, "kind": d.kind, "verbs": VERBS});
        if !d.short_names.is_empty() {
            r["shortNames"] = json!(d.short_names);
        }
        if !d.categories.is_empty() {
            r["categories"] = json!(d.categories);
        }
        resources.push(r);
        if d.status_subresource {
            resources.push(json!({"name": format!("{}/status", d.plural), "singularName": "", "namespaced": d.namespaced, "kind": d.kind, "verbs": ["get", "patch", "update"]}));
        }
        if d.is_pod() {
            resources.push(json!({"name": "pods/binding", "singularName": "", "namespaced": true, "kind": "Binding", "verbs": ["create"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(json_response(
        200,
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    ))
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn registry_hash(store: &Store, group: &str, version: &str) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if let Some(defs) = store.registry().resources(group, version) {
        for d in defs {
            (
                &d.plural,
                &d.kind,
                d.namespaced,
                d.status_subresource,
                d.schema.as_ref().map(|s| s.to_string()),
            )
                .hash(&mut h);
        }
    }
    format!("{:016X}", h.finish())
}

fn openapi_root(store: &Store) -> Value {
    let mut paths = serde_json::Map::new();
    for ((g, v), _) in store.registry().group_versions() {
        let p = gv_path(g, v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", registry_hash(store, g, v))}),
        );
    }
    json!({"paths": paths})
}

/// Minimal per-group-version OpenAPI v3: enough for kubectl to see that every kind supports
/// server-side field validation (so it sends `fieldValidation=Strict` instead of validating itself).
fn openapi_doc(store: &Store, group: &str, version: &str) -> ApiResult<Response> {
    let reg = store.registry();
    let defs = reg.resources(group, version).ok_or_else(not_found_path)?;
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    let base = format!("/{}", gv_path(group, version));
    let param = |name: &str| json!({"name": name, "in": "query", "description": name, "schema": {"type": "string", "uniqueItems": true}});
    for d in defs {
        let gvk = json!({"group": group, "version": version, "kind": d.kind});
        let item = if d.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", d.plural)
        } else {
            format!("{base}/{}/{{name}}", d.plural)
        };
        let op = |action: &str| json!({"operationId": format!("{action}{}", d.kind), "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk, "parameters": [param("dryRun"), param("fieldManager"), param("fieldValidation")], "responses": {"200": {"description": "OK"}}});
        paths.insert(
            item,
            json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
        );
        let schema_name = format!(
            "{}.{}.{}",
            if group.is_empty() {
                "io.k8s.api.core"
            } else {
                group
            },
            version,
            d.kind
        );
        let mut schema = d
            .schema
            .as_deref()
            .cloned()
            .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        schema["x-kubernetes-group-version-kind"] = json!([gvk]);
        schemas.insert(schema_name, schema);
    }
    Ok(json_response(
        200,
        &json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths, "components": {"schemas": schemas}}),
    ))
}

fn list_body(def: &ResourceDef, items: &[Arc<Value>], meta: Value, mode: Render, q: &Query) -> Value {
    match mode {
        Render::Table => {
            let refs: Vec<&Value> = items.iter().map(|v| v.as_ref()).collect();
            table::table(
                def,
                &refs,
                meta,
                q.get("includeObject").map(String::as_str).unwrap_or("Metadata"),
            )
        }
        Render::Metadata => {
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items.iter().map(|i| partial(i)).collect::<Vec<_>>()})
        }
        Render::Full => {
            json!({"kind": def.list_kind, "apiVersion": def.api_version(), "metadata": meta, "items": items.iter().map(|i| i.as_ref()).collect::<Vec<_>>()})
        }
    }
}

fn object_body<'a>(def: &ResourceDef, obj: &'a Value, mode: Render, q: &Query) -> Cow<'a, Value> {
    match mode {
        Render::Table => Cow::Owned(table::table(
            def,
            &[obj],
            json!({"resourceVersion": obj.pointer("/metadata/resourceVersion")}),
            q.get("includeObject").map(String::as_str).unwrap_or("Metadata"),
        )),
        Render::Metadata => Cow::Owned(partial(obj)),
        Render::Full => Cow::Borrowed(obj),
    }
}

fn serve(
    app: &Arc<App>,
    method: Method,
    t: Target,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<Response> {
    let events_v1 = event_shapes::is_events_v1(&t.def);
    serve_resource(app, method, t, q, headers, body).map_err(|e| {
        if events_v1 {
            event_shapes::error_in_events_group(e)
        } else {
            e
        }
    })
}

fn serve_resource(
    app: &Arc<App>,
    method: Method,
    t: Target,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<Response> {
    let store = &app.store;
    let def = t.def.clone();
    let shape = Shape::of(store, &def)?;
    // Every store call goes to the storage resource; replies are rendered in the requested shape.
    let sdef = shape.storage.clone();
    let ns = t.ns.clone().unwrap_or_default();
    let mode = render_mode(headers);
    match (method, t.name.as_deref(), t.sub.as_deref()) {
        (Method::GET, None, None) => {
            let opts = shape.list_opts(q)?;
            if t.watch_prefix || flag(q, "watch") {
                return Ok(watch_response(app, shape, t.ns, opts, q, mode));
            }
            let mut page = store.list(&sdef, t.ns.as_deref(), &opts)?;
            page.items = shape.outbound_all(page.items);
            let mut meta = json!({"resourceVersion": page.resource_version.to_string()});
            if let Some(c) = &page.continue_ {
                meta["continue"] = json!(c);
                meta["remainingItemCount"] = json!(page.remaining);
            }
            Ok(json_response(200, &list_body(&def, &page.items, meta, mode, q)))
        }
        (Method::GET, Some(name), None) => {
            if t.watch_prefix {
                let mut opts = shape.list_opts(q)?;
                opts.fields = FieldSelector::parse(&format!("metadata.name={name}"), &sdef)?;
                return Ok(watch_response(app, shape, t.ns, opts, q, mode));
            }
            let stored = store.get(&sdef, &ns, name)?;
            let obj = shape.outbound(&stored);
            Ok(json_response(200, &object_body(&def, &obj, mode, q)))
        }
        (Method::POST, None, None) => {
            if t.ns.is_none() && def.namespaced {
                return Err(ApiError::method_not_allowed(format!(
                    "POST is not supported on the cluster-wide {} collection",
                    def.plural
                )));
            }
            let out = store.create(
                &sdef,
                &ns,
                shape.inbound(parse_body(headers, body)?),
                &write_opts_with_manager(q, headers)?,
            )?;
            Ok(with_warnings(
                json_response(201, &object_body(&def, &shape.outbound(&out.object), mode, q)),
                &out.warnings,
            ))
        }
        (Method::DELETE, None, None) => {
            let (_, opts) = delete_opts(q, body)?;
            let deleted = store.delete_collection(&sdef, t.ns.as_deref(), &shape.list_opts(q)?, &opts)?;
            let deleted: Vec<Value> = deleted.iter().map(|d| shape.outbound(d).into_owned()).collect();
            Ok(json_response(
                200,
                &json!({"kind": def.list_kind, "apiVersion": def.api_version(), "metadata": {}, "items": deleted}),
            ))
        }
        (Method::PUT, Some(name), sub @ (None | Some("status"))) => {
            let status_only = sub_is_status(&def, sub)?;
            let out = store.update(
                &sdef,
                &ns,
                name,
                shape.inbound(parse_body(headers, body)?),
                status_only,
                &write_opts_with_manager(q, headers)?,
            )?;
            Ok(with_warnings(
                json_response(200, &object_body(&def, &shape.outbound(&out.object), mode, q)),
                &out.warnings,
            ))
        }
        (Method::PATCH, Some(name), sub @ (None | Some("status"))) => {
            let status_only = sub_is_status(&def, sub)?;
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|h| h.to_str().ok())
                .unwrap_or_default();
            let ptype = PatchType::from_content_type(ct)?;
            let mut opts = if ptype == PatchType::Apply {
                write_opts(q)?
            } else {
                write_opts_with_manager(q, headers)?
            };
            if ptype != PatchType::Apply && q.get("force").is_some() {
                return Err(ApiError::bad_request(
                    "force: Invalid value: force may only be set for apply patches",
                ));
            }
            opts.force = flag(q, "force");
            if ptype == PatchType::Apply
                && opts.field_validation == FieldValidation::Warn
                && q.get("fieldValidation").is_none()
            {
                opts.field_validation = FieldValidation::Strict;
            }
            let out = store.patch(
                &sdef,
                &ns,
                name,
                ptype,
                shape.inbound_patch(ptype, parse_body(headers, body)?),
                status_only,
                &opts,
            )?;
            let code = if out.created { 201 } else { 200 };
            Ok(with_warnings(
                json_response(code, &object_body(&def, &shape.outbound(&out.object), mode, q)),
                &out.warnings,
            ))
        }
        (Method::GET, Some(name), Some("status")) => {
            sub_is_status(&def, Some("status"))?;
            Ok(json_response(
                200,
                &object_body(&def, &shape.outbound(&*store.get(&sdef, &ns, name)?), mode, q),
            ))
        }
        (Method::DELETE, Some(name), None) => {
            let (orphan_false, opts) = delete_opts(q, body)?;
            let (obj, gone) = store.delete(&sdef, &ns, name, &opts)?;
            // The deleted object, or a Status: only the object has a shape to convert.
            let obj = if obj.get("kind").and_then(Value::as_str) == Some("Status") {
                Cow::Borrowed(&obj)
            } else {
                shape.outbound(&obj)
            };
            // The real server answers 202 only when deletion is pending and orphanDependents=false was asked.
            let code = if !gone && orphan_false { 202 } else { 200 };
            Ok(json_response(code, &obj))
        }
        (Method::POST, Some(name), Some("binding")) if def.is_pod() => Ok(json_response(
            201,
            &store.bind(&ns, name, &parse_body(headers, body)?)?,
        )),
        (m, _, Some(sub)) if matches!(sub, "status" | "binding") => {
            Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource: {m} {}/{sub}",
                def.plural
            )))
        }
        (_, _, Some(_)) => Err(not_found_path()),
        (m, _, _) => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource: {m} {}",
            def.plural
        ))),
    }
}

fn sub_is_status(def: &ResourceDef, sub: Option<&str>) -> ApiResult<bool> {
    match sub {
        None => Ok(false),
        Some(_) if def.status_subresource => Ok(true),
        Some(_) => Err(not_found_path()),
    }
}

/// Returns (orphanDependents == false, options).
fn delete_opts(q: &Query, body: &[u8]) -> ApiResult<(bool, DeleteOpts)> {
    let b: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("DeleteOptions body is not valid JSON: {e}")))?
    };
    let policy = b
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or(q.get("propagationPolicy").map(String::as_str));
    let orphan_deps = b.get("orphanDependents").and_then(Value::as_bool);
    let body_dry = b
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|d| d == "All"));
    Ok((
        orphan_deps == Some(false),
        DeleteOpts {
            dry_run: dry_run(q)? || body_dry,
            propagation: match (policy, orphan_deps) {
                (Some("Orphan"), _) | (None, Some(true)) => Propagation::Orphan,
                (Some("Foreground"), _) => Propagation::Foreground,
                (Some("Background") | None, _) => Propagation::Background,
                (Some(other), _) => {
                    return Err(ApiError::bad_request(format!(
                        "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
                    )));
                }
            },
            precondition_uid: b
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(String::from),
            precondition_rv: b
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(String::from),
        },
    ))
}

/// Per-watcher filtering and rendering.
struct WatchFilter {
    shape: Shape,
    opts: ListOpts,
    mode: Render,
}

impl WatchFilter {
    fn matches(&self, obj: &Value) -> bool {
        self.opts.labels.matches(obj) && self.opts.fields.matches(obj)
    }

    fn trivial(&self) -> bool {
        self.opts.labels.is_empty()
            && self.opts.fields.is_empty()
            && self.mode == Render::Full
            && !self.shape.events_v1
    }

    /// The line to send for an event, or `None` when this watcher must not see it.
    fn render(&self, ev: &WatchEvent) -> Option<Bytes> {
        if self.trivial() {
            return Some(ev.line.clone());
        }
        let now = self.matches(&ev.object);
        let before = ev.old.as_deref().is_some_and(|o| self.matches(o));
        let type_ = match (ev.type_, before, now) {
            (EventType::Deleted, _, true) | (EventType::Modified, true, false) => EventType::Deleted,
            (EventType::Added, _, true) | (EventType::Modified, false, true) => EventType::Added,
            (EventType::Modified, true, true) => EventType::Modified,
            _ => return None,
        };
        if type_ == ev.type_ && self.mode == Render::Full && !self.shape.events_v1 {
            return Some(ev.line.clone());
        }
        // Selectors match the stored shape; the watcher gets its own shape.
        let object = self.shape.outbound(&ev.object);
        let obj = match self.mode {
            Render::Full => object,
            Render::Metadata => Cow::Owned(partial(&object)),
            Render::Table => Cow::Owned(table::table(
                &self.shape.def,
                &[&object],
                json!({"resourceVersion": ev.rv.to_string()}),
                "Metadata",
            )),
        };
        Some(event_line(type_.as_str(), &obj))
    }
}

/// Upper bound of one watch chunk assembled from already-queued events.
const WATCH_BATCH_BYTES: usize = 64 * 1024;

fn watch_response(
    app: &Arc<App>,
    shape: Shape,
    ns: Option<String>,
    opts: ListOpts,
    q: &Query,
    mode: Render,
) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    let from = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => Ok(None),
        Some(rv) => rv.parse::<u64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {rv:?}: must be an unsigned integer"
            ))
        }),
    };
    // The kill generation is read now, where the watch subscribes, not when its task first runs:
    // an outage begun in between must still end it.
    let start = from
        .and_then(|from| app.store.watch(&shape.storage, ns.as_deref(), from))
        .map(|s| {
            let generation = *s.kill.borrow();
            (s, generation)
        });
    let def = shape.def.clone();
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let bookmarks = flag(q, "allowWatchBookmarks");
    let interval = app.bookmark_interval;
    let store = app.store.clone();
    let filter = WatchFilter { shape, opts, mode };
    tokio::spawn(async move {
        let (mut start, kill_gen) = match start {
            Ok(s) => s,
            Err(e) => {
                // Like the real server: HTTP 200 with an ERROR event carrying the Status (410 Expired).
                let _ = tx.send(Ok(event_line("ERROR", &e.to_status()))).await;
                return;
            }
        };
        for ev in &start.initial {
            if let Some(line) = filter.render(ev)
                && tx.send(Ok(line)).await.is_err()
            {
                return;
            }
        }
        let mut last_rv = start.start_rv;
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        loop {
            tokio::select! {
                // An ended connection sends nothing more: a bookmark picked after the kill (both
                // ready when a loaded runtime polls late) would carry a resourceVersion newer than
                // a compaction that the client must meet as 410 (the CI flake 're-list after 410').
                biased;
                _ = tx.closed() => return,
                _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => return,
                changed = start.kill.changed() => {
                    if changed.is_err() || *start.kill.borrow() != kill_gen {
                        return;
                    }
                }
                _ = ticker.tick(), if bookmarks => {
                    // Like the watch cache, a bookmark carries the current resourceVersion (also
                    // when only other kinds changed). Every event up to it is already queued on
                    // this watcher's channel (commit sends under the store lock): send those first.
                    let current = store.resource_version();
                    let mut batch = BytesMut::new();
                    loop {
                        match start.rx.try_recv() {
                            Ok(ev) => {
                                if ev.rv > last_rv {
                                    last_rv = ev.rv;
                                    if let Some(line) = filter.render(&ev) {
                                        batch.extend_from_slice(&line);
                                    }
                                }
                            }
                            Err(broadcast::error::TryRecvError::Empty) => break,
                            Err(_) => {
                                if !batch.is_empty() {
                                    let _ = tx.send(Ok(batch.freeze())).await;
                                }
                                return;
                            }
                        }
                    }
                    if !batch.is_empty() && tx.send(Ok(batch.freeze())).await.is_err() {
                        return;
                    }
                    last_rv = last_rv.max(current);
                    let bm = json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": {"resourceVersion": last_rv.to_string()}});
                    if tx.send(Ok(event_line("BOOKMARK", &bm))).await.is_err() {
                        return;
                    }
                }
                ev = start.rx.recv() => {
                    // Under load, send what is already queued as one chunk: one wake-up and one
                    // HTTP frame per batch instead of per event keeps fan-out to many watchers cheap.
                    let mut batch = BytesMut::new();
                    let mut next = ev;
                    loop {
                        match next {
                            Ok(ev) => {
                                if ev.rv > last_rv {
                                    last_rv = ev.rv;
                                    if let Some(line) = filter.render(&ev) {
                                        batch.extend_from_slice(&line);
                                    }
                                }
                            }
                            // A watcher that fell behind is closed; the client resumes from its last rv.
                            Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => {
                                if !batch.is_empty() {
                                    let _ = tx.send(Ok(batch.freeze())).await;
                                }
                                return;
                            }
                        }
                        if batch.len() >= WATCH_BATCH_BYTES {
                            break;
                        }
                        next = match start.rx.try_recv() {
                            Ok(ev) => Ok(ev),
                            Err(broadcast::error::TryRecvError::Empty) => break,
                            Err(broadcast::error::TryRecvError::Lagged(n)) => Err(broadcast::error::RecvError::Lagged(n)),
                            Err(broadcast::error::TryRecvError::Closed) => Err(broadcast::error::RecvError::Closed),
                        };
                    }
                    if !batch.is_empty() && tx.send(Ok(batch.freeze())).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(ReceiverStream::new(rx)))
        .unwrap_or_else(|_| error_response(&ApiError::internal("building the watch response failed")))
}
