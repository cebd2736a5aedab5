//! neutron-emulator: an in-repo Neutron v2.0 REST API server for tests, benchmarks and `kuryr sandbox`.
//!
//! It serves the API subset kuryr-rs uses with the shapes, status codes and error bodies of neutron-server 29.0.0
//! under `auth_strategy = noauth` (every request is admin; `project_id` comes from the body, else
//! `fake_project_id`). On top it has latency profiles (the real server's medians), fault injection (error rates,
//! outages) and request statistics, all settable at start, through [`EmulatorHandle`] and over HTTP at
//! `/_emulator/{faults,latency,stats,reset}`.
//!
//! Operation names (stats keys, latency table keys, fault rule targets) are `<resource>.<action>`: resources
//! `network`, `subnet`, `subnetpool`, `port`, `router`, `security_group`, `security_group_rule`, `trunk`,
//! `quota`, `network_ip_availability`, `extension`, `agent`; actions `list`, `get`, `create`, `create_bulk`
//! (`POST /ports {"ports": [..]}`), `update`, `delete`, `tags` (any tag call), `add_subports`, `remove_subports`,
//! `get_subports`, `add_router_interface`, `remove_router_interface`, `details`.
//!
//! Admin endpoints (JSON bodies are the serde forms of the public types):
//! - `GET /_emulator/stats` -> [`Stats`]; `DELETE /_emulator/stats` zeroes it.
//! - `GET|PUT /_emulator/faults` -> [`FaultConfig`], e.g.
//!   `{"rules": [{"operation": "port.create*", "rate": 0.1, "status": 503, "retry_after_secs": 1}],
//!   "outage": {"mode": "reset", "duration_ms": 2000}}`; `DELETE` clears.
//! - `GET|PUT /_emulator/latency` -> [`LatencyProfile`]: `{"profile": "none"}`, `{"profile": "real_server"}`,
//!   `{"profile": "custom", "table": {"default": {"base_ms": 5}, "ops": {"port.get": {"base_ms": 16}}}}`.
//! - `POST /_emulator/reset`: forget all resources, quotas, faults and counters.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use neutron_emulator::{Emulator, EmulatorOptions};
//! let emu = Emulator::start(EmulatorOptions::default()).await?;
//! let base = emu.url(); // http://127.0.0.1:PORT  (API under /v2.0)
//! # let _ = base;
//! emu.shutdown().await;
//! # Ok(()) }
//! ```

pub mod api;
pub mod control;
pub mod error;
pub mod input;
pub mod ipam;
pub mod store;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request as AxumRequest, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;

pub use control::{
    FaultConfig, FaultRule, LatencyProfile, LatencyTable, OpLatency, Outage, OutageMode, Stats,
};
pub use error::{ApiError, Resource};
pub use store::{
    AgentHosts, Binding, NOAUTH_PROJECT, OVS_BRIDGE_MAPPINGS, QUOTA_DEFAULTS, SRIOV_DEVICE_MAPPINGS,
    VLAN_RANGES,
};

use crate::control::Control;
use crate::store::{Activation, Store};

/// Start-up options.
#[derive(Debug, Clone)]
pub struct EmulatorOptions {
    /// Address to listen on; port 0 picks a free one.
    pub listen: SocketAddr,
    pub latency: LatencyProfile,
    pub faults: FaultConfig,
    /// Delay between a port being bound and it turning ACTIVE (the agent's wiring time).
    pub active_delay: Duration,
    /// Process at most this many API requests at once (uWSGI runs 2 processes); `None` = unlimited.
    pub workers: Option<usize>,
    /// Hosts with L2 agents (an OVS agent and a NIC Switch agent each, mapped as [`OVS_BRIDGE_MAPPINGS`] and
    /// [`SRIOV_DEVICE_MAPPINGS`] say). `Any` binds every host; `Only` makes other hosts `binding_failed` like the real
    /// server.
    pub agent_hosts: AgentHosts,
    /// Agent hosts whose OVS agent plugs the hybrid way (its firewall is `iptables_hybrid`): ports bound there get
    /// `ovs_hybrid_plug` in `binding:vif_details`, as the real server takes it from the agent's report.
    pub hybrid_plug_hosts: BTreeSet<String>,
    /// Answer with `Connection: close` like the real uWSGI setup (clients must cope with it).
    pub connection_close: bool,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            latency: LatencyProfile::None,
            faults: FaultConfig::default(),
            active_delay: Duration::from_millis(0),
            workers: None,
            agent_hosts: AgentHosts::Any,
            hybrid_plug_hosts: BTreeSet::new(),
            connection_close: false,
        }
    }
}

impl EmulatorOptions {
    /// Behaves like the measured real server: its latencies, 2 workers, 200 ms to ACTIVE, `Connection: close`.
    pub fn real_server() -> Self {
        Self {
            latency: LatencyProfile::RealServer,
            workers: Some(2),
            active_delay: Duration::from_millis(200),
            connection_close: true,
            ..Self::default()
        }
    }
}

struct Shared {
    store: Mutex<Store>,
    control: Mutex<Control>,
    active_delay: Mutex<Duration>,
    workers: Option<Arc<Semaphore>>,
    agent_hosts: AgentHosts,
    hybrid_plug_hosts: BTreeSet<String>,
    connection_close: bool,
}

impl Shared {
    fn new_store(&self) -> Store {
        let mut store = Store::new(self.agent_hosts.clone());
        store.hybrid_plug_hosts = self.hybrid_plug_hosts.clone();
        store
    }

    fn agent_list(&self, store: &Store) -> Vec<String> {
        match &self.agent_hosts {
            AgentHosts::Only(h) => h.iter().cloned().collect(),
            AgentHosts::Any => store.seen_hosts.iter().cloned().collect(),
        }
    }
}

/// Entry point.
pub struct Emulator;

impl Emulator {
    /// Binds, starts serving in the background and returns the handle.
    pub async fn start(options: EmulatorOptions) -> anyhow::Result<EmulatorHandle> {
        let listener = TcpListener::bind(options.listen)
            .await
            .map_err(|e| anyhow::anyhow!("neutron-emulator: cannot listen on {}: {e}", options.listen))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            control: Mutex::new(Control::new(options.faults.clone(), &options.latency)),
            active_delay: Mutex::new(options.active_delay),
            workers: options.workers.map(|n| Arc::new(Semaphore::new(n.max(1)))),
            agent_hosts: options.agent_hosts.clone(),
            hybrid_plug_hosts: options.hybrid_plug_hosts.clone(),
            connection_close: options.connection_close,
        });
        *shared.store.lock() = shared.new_store();
        let app = axum::Router::new().fallback(dispatch).with_state(shared.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let faulty = FaultyListener {
            inner: listener,
            shared: shared.clone(),
        };
        let task = tokio::spawn(async move {
            let serve = axum::serve(faulty, app).with_graceful_shutdown(async move {
                let _ = rx.await;
            });
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "neutron-emulator server stopped serving");
            }
        });
        tracing::info!(%addr, "neutron-emulator listening");
        Ok(EmulatorHandle {
            addr,
            shared,
            shutdown: Mutex::new(Some(tx)),
            task: Mutex::new(Some(task)),
        })
    }
}

/// See [`EmulatorHandle::port_control`]: the same rules as `POST /v2.0/ports` and `DELETE /v2.0/ports/{id}`,
/// without statistics, latency or faults.
#[derive(Clone)]
pub struct PortControl(Arc<Shared>);

impl std::fmt::Debug for PortControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PortControl")
    }
}

impl PortControl {
    /// Creates a port from the body of a `POST /v2.0/ports` (`{"port": {...}}`); answers the port's JSON.
    /// Without `network_id`, the network is the one of the first fixed IP's subnet (what Octavia's network
    /// driver looks up before it creates a VIP port).
    pub fn create(&self, body: &serde_json::Value) -> Result<serde_json::Value, String> {
        let mut store = self.0.store.lock();
        let mut obj = input::member(body, "port").map_err(|e| e.message)?.clone();
        if !obj.contains_key("network_id") {
            let subnet = obj
                .get("fixed_ips")
                .and_then(|f| f.get(0))
                .and_then(|f| f.get("subnet_id"))
                .and_then(serde_json::Value::as_str)
                .ok_or("neither network_id nor fixed_ips[0].subnet_id")?;
            let network = store
                .subnets
                .get(subnet)
                .map(|s| s.network_id.clone())
                .ok_or_else(|| format!("subnet {subnet} not found"))?;
            obj.insert("network_id".into(), json!(network));
        }
        let ids = store.create_ports(&[&obj]).map_err(|e| e.message)?;
        let id = ids.first().ok_or("no port created")?;
        Ok(store.render_port(id))
    }

    pub fn delete(&self, id: &str) -> Result<(), String> {
        self.0.store.lock().delete_port(id, None).map_err(|e| e.message)
    }
}

/// A running emulator. Dropping it stops the server; `shutdown()` also waits for it.
pub struct EmulatorHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl EmulatorHandle {
    /// Base URL without the version, e.g. `http://127.0.0.1:41234` (like `KURYR_TEST_NEUTRON_URL`).
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
        self.shared.control.lock().set_faults(faults);
    }

    pub fn faults(&self) -> FaultConfig {
        self.shared.control.lock().faults.clone()
    }

    pub fn set_latency(&self, latency: LatencyProfile) {
        self.shared.control.lock().latency = latency.table();
    }

    pub fn set_active_delay(&self, delay: Duration) {
        *self.shared.active_delay.lock() = delay;
    }

    /// Port create/delete in process, for another emulator that plays a Neutron client (the Octavia
    /// emulator's VIP ports) from under its own lock, where an HTTP call cannot be awaited.
    pub fn port_control(&self) -> PortControl {
        PortControl(self.shared.clone())
    }

    /// Forgets every resource, quota, fault and counter.
    pub fn reset(&self) {
        reset_all(&self.shared);
    }

    /// Stops accepting, finishes in-flight requests and waits for the server task.
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

impl Drop for EmulatorHandle {
    /// A forgotten handle still stops the server (in-flight requests finish in the background).
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.lock().take() {
            let _ = tx.send(());
        }
    }
}

fn reset_all(shared: &Shared) {
    *shared.store.lock() = shared.new_store();
    let mut c = shared.control.lock();
    c.set_faults(FaultConfig::default());
    c.stats = Stats::default();
}

/// Accepts connections, dropping them at once during an outage in `Reset` mode.
struct FaultyListener {
    inner: TcpListener,
    shared: Arc<Shared>,
}

impl axum::serve::Listener for FaultyListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    if self.shared.control.lock().outage() == Some(OutageMode::Reset) {
                        drop(stream);
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    return (stream, addr);
                }
                Err(e) => {
                    // Out of file descriptors and similar: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

fn request_id() -> String {
    format!("req-{}", uuid::Uuid::new_v4())
}

fn json_response(shared: &Shared, status: StatusCode, body: Option<&Value>, extra: HeaderMap) -> Response {
    let mut resp = match body {
        Some(v) => {
            let bytes = serde_json::to_vec(v).unwrap_or_default();
            let mut r = Response::new(Body::from(bytes));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        None => Response::new(Body::empty()),
    };
    *resp.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(&request_id()) {
        resp.headers_mut().insert("x-openstack-request-id", v);
    }
    if shared.connection_close {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp.headers_mut().extend(extra);
    resp
}

fn error_response(shared: &Shared, e: &ApiError) -> Response {
    json_response(shared, e.status, Some(&e.body()), HeaderMap::new())
}

fn parse_if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(v) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let s = v
        .to_str()
        .map_err(|_| ApiError::bad_request("If-Match header is not valid"))?;
    match s.trim().strip_prefix("revision_number=") {
        Some(n) => n.trim().parse().map(Some).map_err(|_| {
            ApiError::bad_request(format!("If-Match header revision_number '{n}' is not an integer"))
        }),
        // Neutron ignores If-Match values that are not revision constraints (plain ETags).
        None => Ok(None),
    }
}

async fn dispatch(State(shared): State<Arc<Shared>>, req: AxumRequest) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, 64 * 1024 * 1024).await {
        Ok(b) => b,
        Err(_) => return error_response(&shared, &ApiError::bad_request("Body contains invalid data")),
    };
    if let Some(rest) = parts.uri.path().strip_prefix("/_emulator/") {
        return admin(&shared, &parts.method, rest, &bytes);
    }
    // Like the real server (uWSGI), a request is carried out to the end even when the client
    // stops waiting: a client that dies mid-request leaves what the request did.
    match tokio::spawn(serve(shared.clone(), parts, bytes)).await {
        Ok(response) => response,
        Err(_) => error_response(&shared, &ApiError::internal()),
    }
}

async fn serve(shared: Arc<Shared>, parts: axum::http::request::Parts, bytes: axum::body::Bytes) -> Response {
    let path = parts.uri.path().to_string();
    let segments: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let s = s.strip_suffix(".json").unwrap_or(s);
            percent_decode(s)
        })
        .collect();
    let Some(route) = api::route(&segments) else {
        return error_response(&shared, &ApiError::http_not_found());
    };
    let body: Option<Value> =
        if bytes.is_empty() || parts.method == Method::GET || parts.method == Method::DELETE {
            None
        } else {
            match serde_json::from_slice(&bytes) {
                Ok(v) => Some(v),
                Err(_) => {
                    // Still counted: the client made the call.
                    let op = api::classify(&parts.method, &route, None);
                    shared.control.lock().admit(&op);
                    return error_response(&shared, &ApiError::bad_request("Body contains invalid data"));
                }
            }
        };
    let op = api::classify(&parts.method, &route, body.as_ref());
    let (fault, delay, held) = {
        let mut c = shared.control.lock();
        let (fault, delay) = (c.admit(&op), c.delay(&op));
        c.stats.busy_ms = c
            .stats
            .busy_ms
            .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        (fault, delay, c.rule_delay(&op))
    };
    // A rule's delay holds no worker: it models a client-visible stall, not service time.
    if !held.is_zero() {
        tokio::time::sleep(held).await;
    }
    // Worker slots model uWSGI's processes: a request holds one for its whole (simulated) service time.
    let _permit = match &shared.workers {
        Some(sem) => sem.clone().acquire_owned().await.ok(),
        None => None,
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(f) = fault
        && !f.after_commit
    {
        return fault_response(&shared, f);
    }
    let raw_query = parts.uri.query().unwrap_or("").to_string();
    let query: Vec<(String, String)> = form_urlencoded::parse(raw_query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(String::from)
        .unwrap_or_else(|| "127.0.0.1".into());
    let if_match = match parse_if_match(&parts.headers) {
        Ok(v) => v,
        Err(e) => return error_response(&shared, &e),
    };
    let request = api::Request {
        method: parts.method.clone(),
        segments,
        query,
        raw_query: &raw_query,
        path: &path,
        host,
        body,
        if_match,
    };
    let (result, activations) = {
        let mut store = shared.store.lock();
        let agents = shared.agent_list(&store);
        let r = api::handle(&mut store, &route, &request, &agents);
        (r, std::mem::take(&mut store.activations))
    };
    schedule_activations(&shared, activations, &result);
    if result.is_ok() && (op.name == "port.create" || op.name == "port.create_bulk") {
        shared.control.lock().stats.ports_created += op.items as u64;
    }
    if let Some(f) = fault {
        return fault_response(&shared, f);
    }
    match result {
        Ok(api::Reply {
            status,
            html: Some(html),
            ..
        }) => {
            let mut r = json_response(&shared, status, None, HeaderMap::new());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=UTF-8"),
            );
            *r.body_mut() = Body::from(html);
            r
        }
        Ok(reply) => json_response(&shared, reply.status, reply.body.as_ref(), HeaderMap::new()),
        Err(e) => error_response(&shared, &e),
    }
}

fn schedule_activations(
    shared: &Arc<Shared>,
    activations: Vec<Activation>,
    result: &Result<api::Reply, ApiError>,
) {
    // A failed request rolled its changes back; its queued activations refer to nothing.
    if activations.is_empty() || result.is_err() {
        return;
    }
    let delay = *shared.active_delay.lock();
    let shared = shared.clone();
    tokio::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut store = shared.store.lock();
        for a in &activations {
            store.activate(a);
        }
    });
}

fn fault_response(shared: &Shared, f: control::InjectedFault) -> Response {
    let status = StatusCode::from_u16(f.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let err = match status {
        StatusCode::SERVICE_UNAVAILABLE => ApiError::unavailable(),
        StatusCode::INTERNAL_SERVER_ERROR => ApiError::internal(),
        other => ApiError::new(other, "HTTPError", format!("Injected fault: {}", other.as_u16())),
    };
    let mut extra = HeaderMap::new();
    if let Some(secs) = f.retry_after_secs
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        extra.insert(header::RETRY_AFTER, v);
    }
    json_response(shared, err.status, Some(&err.body()), extra)
}

fn percent_decode(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/_emulator/*`: runtime control for tests, benchmarks and scripts.
fn admin(shared: &Arc<Shared>, method: &Method, rest: &str, body: &Bytes) -> Response {
    let parse = |b: &Bytes| -> Result<Value, ApiError> {
        if b.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(b).map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))
    };
    let result: Result<(StatusCode, Option<Value>), ApiError> =
        (|| match (method.clone(), rest.trim_end_matches('/')) {
            (Method::GET, "stats") => Ok((StatusCode::OK, Some(json!(shared.control.lock().stats)))),
            (Method::DELETE, "stats") => {
                shared.control.lock().stats = Stats::default();
                Ok((StatusCode::NO_CONTENT, None))
            }
            (Method::GET, "faults") => Ok((StatusCode::OK, Some(json!(shared.control.lock().faults)))),
            (Method::PUT | Method::POST, "faults") => {
                let cfg: FaultConfig = serde_json::from_value(parse(body)?)
                    .map_err(|e| ApiError::bad_request(format!("invalid fault config: {e}")))?;
                shared.control.lock().set_faults(cfg.clone());
                Ok((StatusCode::OK, Some(json!(cfg))))
            }
            (Method::DELETE, "faults") => {
                shared.control.lock().set_faults(FaultConfig::default());
                Ok((StatusCode::NO_CONTENT, None))
            }
            (Method::GET, "latency") => Ok((StatusCode::OK, Some(json!(shared.control.lock().latency)))),
            (Method::PUT | Method::POST, "latency") => {
                let profile: LatencyProfile = serde_json::from_value(parse(body)?)
                    .map_err(|e| ApiError::bad_request(format!("invalid latency profile: {e}")))?;
                shared.control.lock().latency = profile.table();
                Ok((StatusCode::OK, Some(json!(profile))))
            }
            (Method::POST, "reset") => {
                reset_all(shared);
                Ok((StatusCode::NO_CONTENT, None))
            }
            (Method::GET, "agents") => {
                let store = shared.store.lock();
                let hosts: BTreeSet<String> = shared.agent_list(&store).into_iter().collect();
                Ok((StatusCode::OK, Some(json!(hosts))))
            }
            _ => Err(ApiError::http_not_found()),
        })();
    match result {
        Ok((status, body)) => json_response(shared, status, body.as_ref(), HeaderMap::new()),
        Err(e) => error_response(shared, &e),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Ok(v) = HeaderValue::from_str(&request_id()) {
            r.headers_mut().insert("x-openstack-request-id", v);
        }
        r
    }
}
