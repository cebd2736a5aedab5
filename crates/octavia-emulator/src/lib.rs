//! octavia-emulator: an in-repo Octavia v2 (load-balancer) REST API server for tests, benchmarks and the sandbox.
//!
//! It serves `/v2/lbaas/...` (and the `/v2.0/lbaas/...` alias) with the JSON shapes, status codes and WSME error
//! bodies of Octavia under `auth_strategy = noauth` (a load balancer's project is the body's `project_id`, else
//! the `X-Project-Id` header, else the create answers 400 as Octavia does).
//! Providers `amphora` (default) and `ovn` apply their real drivers' option checks. Writes move the load balancer
//! through PENDING_* to ACTIVE after the latency profile's worker delay; writes while it is pending get 409.
//! operating_status is never updated (no health manager): objects stay OFFLINE, members NO_MONITOR without a
//! health monitor.
//!
//! Operation names (stats keys, latency table keys, fault rule targets) are `<resource>.<action>`: resources
//! `loadbalancer`, `listener`, `pool`, `member`, `healthmonitor`, `quota`, `provider`; actions `list`, `get`,
//! `create`, `update`, `delete`, plus `loadbalancer.status`, `loadbalancer.stats`, `loadbalancer.failover` and
//! `member.batch_update`.
//!
//! Control API (JSON bodies are the serde forms of the public types):
//! - `GET /control/stats` -> [`Stats`] (calls per `<resource>.<action>`); `DELETE` zeroes it.
//! - `GET|PUT|POST /control/faults` -> [`FaultConfig`], e.g.
//!   `{"rules": [{"operation": "member.batch_update", "status": 503, "count": 2}, {"operation": "*", "delay_ms": 100}]}`;
//!   `DELETE` clears.
//! - `GET|PUT /control/latency` -> [`LatencyProfile`]: `{"profile": "instant"}`, `{"profile": "amphora_noop"}`,
//!   `{"profile": "custom", "api_ms": {"*.create": 50}, "worker": {"lb_create_ms": 1000}}`.
//! - `POST /control/loadbalancers/{id}/error`: the load balancer goes to ERROR (a failed worker job).
//! - `POST /control/{listeners,pools,members}/{id}/error`: that object goes to ERROR, its load
//!   balancer staying ACTIVE (a provider's failed child operation, reverted).
//! - `PUT /control/worker_failures` `{"count": N}`: the next N worker jobs end in ERROR instead of ACTIVE (for a
//!   delete: the load balancer stays, in ERROR).
//! - `PUT /v2/lbaas/loadbalancers/{id}/failover` is served too (202; ACTIVE or ERROR load balancers only).
//! - `POST /control/reset`: forget everything.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use octavia_emulator::{OctaviaEmulator, OctaviaOptions};
//! let emu = OctaviaEmulator::start(OctaviaOptions::default()).await?;
//! let base = emu.url(); // http://127.0.0.1:PORT  (API under /v2/lbaas)
//! # let _ = base;
//! emu.shutdown().await;
//! # Ok(()) }
//! ```

pub mod api;
pub mod control;
pub mod error;
pub mod input;
pub mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use control::{FaultConfig, FaultRule, LatencyProfile, Stats};
pub use error::ApiError;
pub use store::{NOAUTH_PROJECT, Store, StoreConfig, VipPorts, WorkerDelays};

use crate::control::Control;

#[derive(Debug, Clone)]
pub struct OctaviaOptions {
    /// Port 0 picks a free one.
    pub listen: SocketAddr,
    pub latency: LatencyProfile,
    pub faults: FaultConfig,
    /// VIP addresses not given in the request come from this IPv4 network.
    pub vip_network: std::net::Ipv4Addr,
    pub vip_prefix: u8,
    /// Enforce quotas although the API is `noauth` (see `StoreConfig::enforce_quota`).
    pub enforce_quota: bool,
    /// Makes VIP ports in a Neutron (see [`VipPorts`]); `None` leaves `vip_port_id` a bare id.
    pub vip_ports: Option<std::sync::Arc<dyn VipPorts>>,
}

impl Default for OctaviaOptions {
    fn default() -> Self {
        let c = StoreConfig::default();
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            latency: LatencyProfile::Instant,
            faults: FaultConfig::default(),
            vip_network: c.vip_network,
            vip_prefix: c.vip_prefix,
            enforce_quota: false,
            vip_ports: None,
        }
    }
}

impl OctaviaOptions {
    /// Behaves like Octavia with the amphora noop drivers (the sandbox's choice).
    pub fn amphora_noop() -> Self {
        Self {
            latency: LatencyProfile::AmphoraNoop,
            ..Self::default()
        }
    }
}

struct Shared {
    store: Mutex<Store>,
    control: Mutex<Control>,
}

pub struct OctaviaEmulator;

impl OctaviaEmulator {
    /// Binds, serves in the background and returns the handle.
    pub async fn start(options: OctaviaOptions) -> anyhow::Result<OctaviaHandle> {
        let listener = TcpListener::bind(options.listen)
            .await
            .map_err(|e| anyhow::anyhow!("octavia-emulator: cannot listen on {}: {e}", options.listen))?;
        let addr = listener.local_addr()?;
        let config = StoreConfig {
            vip_ports: options.vip_ports,
            vip_network: options.vip_network,
            vip_prefix: options.vip_prefix,
            worker: options.latency.worker(),
            enforce_quota: options.enforce_quota,
        };
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(config)),
            control: Mutex::new(Control {
                faults: options.faults,
                latency: options.latency,
                stats: Stats::default(),
            }),
        });
        let app = axum::Router::new().fallback(dispatch).with_state(shared.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = rx.await;
            });
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "octavia-emulator stopped serving");
            }
        });
        tracing::info!(%addr, "octavia-emulator listening");
        Ok(OctaviaHandle {
            addr,
            shared,
            shutdown: Mutex::new(Some(tx)),
            task: Mutex::new(Some(task)),
        })
    }
}

/// A running emulator; dropping it stops the server.
pub struct OctaviaHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl OctaviaHandle {
    /// Base URL without the version, e.g. `http://127.0.0.1:41234` (the load-balancer endpoint).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stats(&self) -> Stats {
        self.shared.control.lock().stats.clone()
    }

    pub fn reset_stats(&self) {
        self.shared.control.lock().stats = Stats::default();
    }

    pub fn set_faults(&self, faults: FaultConfig) {
        self.shared.control.lock().faults = faults;
    }

    pub fn set_latency(&self, latency: LatencyProfile) {
        self.shared.store.lock().config.worker = latency.worker();
        self.shared.control.lock().latency = latency;
    }

    /// Puts a load balancer into ERROR.
    pub fn force_error(&self, lb_id: &str) -> Result<(), ApiError> {
        self.shared.store.lock().force_error(lb_id)
    }

    /// A listener, pool or member (`kind`: `listeners`, `pools`, `members`) goes to ERROR, its
    /// load balancer staying ACTIVE (a provider's failed child operation, reverted).
    pub fn force_child_error(&self, kind: &str, id: &str) -> Result<(), ApiError> {
        self.shared.store.lock().force_child_error(kind, id)
    }

    /// The next `count` worker jobs (create, update, delete, failover) end in ERROR instead of ACTIVE.
    pub fn fail_next_jobs(&self, count: u64) {
        self.shared.store.lock().failing_jobs = count;
    }

    pub fn reset(&self) {
        reset_all(&self.shared);
    }

    pub async fn shutdown(&self) {
        if let Some(tx) = self.shutdown.lock().take() {
            let _ = tx.send(());
        }
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for OctaviaHandle {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.lock().take() {
            let _ = tx.send(());
        }
    }
}

fn reset_all(shared: &Shared) {
    let mut store = shared.store.lock();
    let config = store.config.clone();
    *store = Store::new(config);
    let mut c = shared.control.lock();
    c.faults = FaultConfig::default();
    c.stats = Stats::default();
}

fn respond(status: u16, body: Option<&Value>) -> Response {
    let mut r = match body {
        Some(v) => {
            let mut r = Response::new(Body::from(serde_json::to_vec(v).unwrap_or_default()));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        None => Response::new(Body::empty()),
    };
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(&format!("req-{}", uuid::Uuid::new_v4())) {
        r.headers_mut().insert("x-openstack-request-id", v);
    }
    r
}

fn error(e: &ApiError) -> Response {
    respond(e.status, Some(&e.body()))
}

/// Like the real API server (uWSGI), a request is carried out to the end even when the client stops waiting
/// for the answer: a create whose answer is lost to a client timeout still happens.
async fn dispatch(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 16 * 1024 * 1024).await else {
        return error(&ApiError::new(400, "Invalid input: unreadable body"));
    };
    match tokio::spawn(handle(shared, parts, bytes)).await {
        Ok(r) => r,
        Err(_) => error(&ApiError::new(500, "Internal server error")),
    }
}

async fn handle(
    shared: Arc<Shared>,
    parts: axum::http::request::Parts,
    bytes: axum::body::Bytes,
) -> Response {
    let path = parts.uri.path().to_string();
    let segs: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if segs.first().map(String::as_str) == Some("control") {
        return control_api(&shared, &parts.method, &segs[1..], &bytes);
    }
    if segs.is_empty() && parts.method == Method::GET {
        let host = parts
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("127.0.0.1");
        return respond(200, Some(&api::versions(&format!("http://{host}/"))));
    }
    let api_segs: Vec<String> = match segs.as_slice() {
        [v, l, rest @ ..] if (v == "v2" || v == "v2.0") && l == "lbaas" => rest.to_vec(),
        // The admin API of amphorae lives beside lbaas.
        [v, o, rest @ ..] if v == "v2" && o == "octavia" && rest.first().is_some_and(|r| r == "amphorae") => {
            rest.to_vec()
        }
        _ => return error(&ApiError::path_not_found()),
    };
    let op = api::classify(&parts.method, &api_segs);
    let (delay, fault) = shared.control.lock().admit(&op);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(status) = fault {
        let msg = if status == 503 {
            "Service Unavailable"
        } else {
            "Injected fault"
        };
        return error(&ApiError::new(status, msg));
    }
    let body: Option<Value> = if bytes.is_empty() {
        None
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(v) => Some(v),
            Err(e) => return error(&ApiError::new(400, format!("Invalid JSON: {e}"))),
        }
    };
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(String::from)
        .unwrap_or_else(|| "127.0.0.1".into());
    let path_url = format!("http://{host}{path}");
    // oslo.context's request context under noauth: the project comes from these headers.
    let context_project = ["x-project-id", "x-tenant-id"].iter().find_map(|h| {
        parts
            .headers
            .get(*h)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    });
    let query: Vec<(String, String)> = form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let result = {
        let now = Instant::now();
        let mut store = shared.store.lock();
        store.settle(now);
        let req = api::Request {
            method: &parts.method,
            segs: &api_segs,
            query: &query,
            body: body.as_ref(),
            path_url: &path_url,
            context_project: context_project.as_deref(),
        };
        let r = api::handle(&mut store, &req, now);
        // The instant profile completes worker jobs before anyone can look.
        store.settle(now);
        r
    };
    match result {
        Ok(reply) => respond(reply.status, reply.body.as_ref()),
        Err(e) => error(&e),
    }
}

fn control_api(shared: &Arc<Shared>, method: &Method, segs: &[String], body: &[u8]) -> Response {
    let parse = || -> Result<Value, ApiError> {
        if body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(body).map_err(|e| ApiError::new(400, format!("invalid JSON: {e}")))
    };
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let result: Result<(u16, Option<Value>), ApiError> = (|| match (method.as_str(), s.as_slice()) {
        ("GET", ["stats"]) => Ok((200, Some(json!(shared.control.lock().stats)))),
        ("DELETE", ["stats"]) => {
            shared.control.lock().stats = Stats::default();
            Ok((204, None))
        }
        ("GET", ["faults"]) => Ok((200, Some(json!(shared.control.lock().faults)))),
        ("PUT" | "POST", ["faults"]) => {
            let cfg: FaultConfig = serde_json::from_value(parse()?)
                .map_err(|e| ApiError::new(400, format!("invalid fault config: {e}")))?;
            shared.control.lock().faults = cfg.clone();
            Ok((200, Some(json!(cfg))))
        }
        ("DELETE", ["faults"]) => {
            shared.control.lock().faults = FaultConfig::default();
            Ok((204, None))
        }
        ("GET", ["latency"]) => Ok((200, Some(json!(shared.control.lock().latency)))),
        ("PUT" | "POST", ["latency"]) => {
            let p: LatencyProfile = serde_json::from_value(parse()?)
                .map_err(|e| ApiError::new(400, format!("invalid latency profile: {e}")))?;
            shared.store.lock().config.worker = p.worker();
            shared.control.lock().latency = p.clone();
            Ok((200, Some(json!(p))))
        }
        ("POST", ["loadbalancers", id, "error"]) => {
            shared.store.lock().force_error(id)?;
            Ok((204, None))
        }
        ("POST", [kind @ ("listeners" | "pools" | "members"), id, "error"]) => {
            shared.store.lock().force_child_error(kind, id)?;
            Ok((204, None))
        }
        ("POST" | "PUT", ["worker_failures"]) => {
            let v = parse()?;
            let count = v
                .get("count")
                .and_then(Value::as_u64)
                .ok_or_else(|| ApiError::new(400, "worker_failures: body must be {\"count\": N}"))?;
            shared.store.lock().failing_jobs = count;
            Ok((200, Some(json!({ "count": count }))))
        }
        ("POST", ["reset"]) => {
            reset_all(shared);
            Ok((204, None))
        }
        _ => Err(ApiError::path_not_found()),
    })();
    match result {
        Ok((status, body)) => respond(status, body.as_ref()),
        Err(e) => error(&e),
    }
}
