//! kube-emulator: a Kubernetes API server emulator for tests and the embedded sandbox.
//!
//! It speaks the real wire protocol (discovery, OpenAPI v3, CRUD, all four patch types, watch
//! with bookmarks and 410 handling, Table output, CRDs with schema validation) over TCP, optionally
//! TLS with a generated CA and bearer-token auth, so `kubectl`, `kube::Client` and upstream kuryr's
//! Python client cannot tell it from a kube-apiserver for the paths kuryr uses.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kube_emulator::EmulatorError> {
//! let handle = kube_emulator::KubeEmulator::start(kube_emulator::KubeOptions::default()).await?;
//! handle.write_kubeconfig("/tmp/kubeconfig")?;
//! println!("serving at {}", handle.url());
//! handle.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! The scheduler and kubelet stand-ins live in [`standins`], outside the API server, and use only
//! the in-process [`Store`] handle.

pub mod error;
pub mod event_shapes;
pub mod fields;
pub mod netns;
pub mod patch;
pub mod rbac;
pub mod requests;
pub mod resources;
pub mod schema;
pub mod selector;
pub mod server;
pub mod standins;
pub mod store;
pub mod table;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

pub use error::{ApiError, ApiResult};
pub use store::{DeleteOpts, ListOpts, Propagation, Store, StoreConfig, WriteOpts};

/// Errors starting, persisting or stopping the emulator.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("generating the TLS certificate: {0}")]
    Tls(String),
    #[error("persistence file {path}: {message}")]
    Persist { path: PathBuf, message: String },
    #[error("writing kubeconfig {path}: {source}")]
    Kubeconfig { path: PathBuf, source: std::io::Error },
    #[error("server task failed: {0}")]
    Serve(String),
}

/// How to run the emulator.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Address to listen on; port 0 picks an ephemeral port.
    pub bind: SocketAddr,
    /// Serve HTTPS with a freshly generated CA (its certificate goes into the kubeconfig).
    pub tls: bool,
    /// Require `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Load state from this JSON file at start, save it periodically and on shutdown.
    pub persist_path: Option<PathBuf>,
    pub persist_interval: Duration,
    /// Watch history kept for resuming watches (older resourceVersions get 410 Gone).
    pub history_limit: usize,
    /// Per-(kind, namespace) broadcast capacity; a watcher further behind is disconnected.
    pub watch_channel_capacity: usize,
    /// How often BOOKMARK events go to watchers that asked for them.
    pub bookmark_interval: Duration,
    /// Nodes to create (Ready) at start if absent.
    pub nodes: Vec<String>,
    /// Authorize requests made with ServiceAccount tokens ([`KubeHandle::service_account_token`])
    /// against the stored Roles, ClusterRoles and bindings (403 otherwise). `token` stays a
    /// superuser.
    pub rbac: bool,
}

impl Default for KubeOptions {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: false,
            token: None,
            persist_path: None,
            persist_interval: Duration::from_secs(5),
            history_limit: StoreConfig::default().history_limit,
            watch_channel_capacity: StoreConfig::default().channel_capacity,
            bookmark_interval: Duration::from_secs(10),
            nodes: Vec::new(),
            rbac: false,
        }
    }
}

/// Entry point.
pub struct KubeEmulator;

impl KubeEmulator {
    pub async fn start(opts: KubeOptions) -> Result<KubeHandle, EmulatorError> {
        let store = Arc::new(Store::new(StoreConfig {
            history_limit: opts.history_limit,
            channel_capacity: opts.watch_channel_capacity,
        }));
        if let Some(path) = &opts.persist_path {
            load(&store, path)?;
        }
        for node in &opts.nodes {
            ensure_node(&store, node);
        }
        let listener = std::net::TcpListener::bind(opts.bind).map_err(|source| EmulatorError::Bind {
            addr: opts.bind,
            source,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| EmulatorError::Bind {
                addr: opts.bind,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| EmulatorError::Bind {
            addr: opts.bind,
            source,
        })?;
        let sa_tokens = server::ServiceAccountTokens::default();
        let requests = requests::RequestStats::default();
        let unavailable = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let lists_held = Arc::new(tokio::sync::watch::Sender::new(false));
        let app = Arc::new(server::App {
            store: store.clone(),
            token: opts.token.clone(),
            bookmark_interval: opts.bookmark_interval,
            sa_tokens: sa_tokens.clone(),
            rbac: opts.rbac,
            requests: requests.clone(),
            unavailable: unavailable.clone(),
            lists_held: lists_held.clone(),
        });
        let router = server::router(app);
        let server_handle = axum_server::Handle::new();
        let (scheme, ca_pem, task) = if opts.tls {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let (ca_pem, cert_pem, key_pem) = generate_certs(addr.ip())?;
            let config =
                axum_server::tls_rustls::RustlsConfig::from_pem(cert_pem.into_bytes(), key_pem.into_bytes())
                    .await
                    .map_err(|e| EmulatorError::Tls(e.to_string()))?;
            let server = axum_server::from_tcp_rustls(listener, config)
                .map_err(|source| EmulatorError::Bind { addr, source })?;
            let h = server_handle.clone();
            let task = tokio::spawn(async move { server.handle(h).serve(router.into_make_service()).await });
            ("https", Some(ca_pem), task)
        } else {
            let server =
                axum_server::from_tcp(listener).map_err(|source| EmulatorError::Bind { addr, source })?;
            let h = server_handle.clone();
            let task = tokio::spawn(async move { server.handle(h).serve(router.into_make_service()).await });
            ("http", None, task)
        };
        let persist_task = opts.persist_path.clone().map(|path| {
            let store = store.clone();
            let interval = opts.persist_interval;
            tokio::spawn(async move {
                let mut saved_rv = store.resource_version();
                loop {
                    tokio::time::sleep(interval).await;
                    let rv = store.resource_version();
                    if rv != saved_rv {
                        match save(&store, &path) {
                            Ok(()) => saved_rv = rv,
                            Err(e) => tracing::warn!("periodic save failed: {e}"),
                        }
                    }
                }
            })
        });
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            addr.ip().to_string()
        };
        let url = match addr.ip() {
            IpAddr::V6(_) => format!("{scheme}://[{host}]:{}", addr.port()),
            IpAddr::V4(_) => format!("{scheme}://{host}:{}", addr.port()),
        };
        let gc_task = tokio::spawn(store.clone().run_garbage_collector());
        tracing::info!(%url, "kube-emulator serving");
        Ok(KubeHandle {
            url,
            addr,
            store,
            ca_pem,
            token: opts.token,
            sa_tokens,
            requests,
            unavailable,
            lists_held,
            persist_path: opts.persist_path,
            server_handle,
            task,
            persist_task,
            gc_task,
        })
    }
}

fn ensure_node(store: &Store, name: &str) {
    let Some(def) = store.find("", "v1", "nodes") else {
        return;
    };
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet stand-in is posting ready status"}],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.32.0", "operatingSystem": "linux", "architecture": "amd64"}
        }
    });
    // AlreadyExists (e.g. restored from the persistence file) is fine.
    let _ = store.create(&def, "", node, &WriteOpts::default());
}

/// Returns (CA PEM, server cert PEM, server key PEM).
fn generate_certs(ip: IpAddr) -> Result<(String, String, String), EmulatorError> {
    let tls = |e: rcgen::Error| EmulatorError::Tls(e.to_string());
    let ca_key = rcgen::KeyPair::generate().map_err(tls)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-emulator-ca");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(tls)?;
    let mut sans = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if !ip.is_unspecified() && !ip.is_loopback() {
        sans.push(ip.to_string());
    }
    let key = rcgen::KeyPair::generate().map_err(tls)?;
    let mut params = rcgen::CertificateParams::new(sans).map_err(tls)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &ca).map_err(tls)?;
    Ok((ca.pem(), cert.pem(), key.serialize_pem()))
}

fn load(store: &Store, path: &Path) -> Result<(), EmulatorError> {
    let err = |message: String| EmulatorError::Persist {
        path: path.to_path_buf(),
        message,
    };
    let raw = match std::fs::read(path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err(e.to_string())),
    };
    let snap: Value = serde_json::from_slice(&raw).map_err(|e| err(format!("not valid JSON: {e}")))?;
    store.restore(&snap).map_err(err)
}

/// Atomically writes the store to `path` (temp file + rename).
fn save(store: &Store, path: &Path) -> Result<(), EmulatorError> {
    let err = |message: String| EmulatorError::Persist {
        path: path.to_path_buf(),
        message,
    };
    let bytes = serde_json::to_vec(&store.snapshot()).map_err(|e| err(e.to_string()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(|e| err(e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
}

/// A running emulator.
pub struct KubeHandle {
    url: String,
    addr: SocketAddr,
    store: Arc<Store>,
    ca_pem: Option<String>,
    token: Option<String>,
    sa_tokens: server::ServiceAccountTokens,
    requests: requests::RequestStats,
    unavailable: Arc<std::sync::atomic::AtomicBool>,
    lists_held: Arc<tokio::sync::watch::Sender<bool>>,
    persist_path: Option<PathBuf>,
    server_handle: axum_server::Handle<SocketAddr>,
    task: JoinHandle<std::io::Result<()>>,
    persist_task: Option<JoinHandle<()>>,
    gc_task: JoinHandle<()>,
}

impl KubeHandle {
    /// `http(s)://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// PEM of the CA that signed the serving certificate (TLS only).
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Every (user, verb, group, resource) ServiceAccount requests were allowed to use so far
    /// (with [`KubeOptions::rbac`]): what a least-privilege role must grant, and no more.
    pub fn used_permissions(&self) -> Vec<rbac::Used> {
        self.sa_tokens.used()
    }

    /// Every (user, verb, group, resource) a ServiceAccount was refused (403) so far: a least-privilege
    /// role that lacks what the code calls shows here.
    pub fn denied_permissions(&self) -> Vec<rbac::Used> {
        self.sa_tokens.denied()
    }

    /// A bearer token of ServiceAccount `namespace/name` (like a TokenRequest's). With
    /// [`KubeOptions::rbac`] its requests are authorized by the stored RBAC objects.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        self.sa_tokens.issue(rbac::ServiceAccount {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// The in-process client handle (used by the stand-ins and by tests that seed state).
    /// API requests received over HTTP, by `<verb> <resource>` (in-process [`Store`] calls are
    /// not requests and not counted).
    pub fn requests(&self) -> &requests::RequestStats {
        &self.requests
    }

    pub fn store(&self) -> Arc<Store> {
        self.store.clone()
    }

    /// Forces watch-history compaction: every resourceVersion issued so far becomes too old
    /// (410 Gone) to start a watch from. Open watches keep running.
    pub fn compact(&self) {
        self.store.compact();
    }

    /// The next `n` paged lists that go on with a continue token that can expire find the
    /// history compacted since their first page, and answer 410 with the real server's offer of
    /// an inconsistent continuation: what a client paging slower than the server keeps history
    /// meets. Each is a real compaction: every watch that reconnects from before it gets 410 too.
    pub fn compact_before_continued_lists(&self, n: u32) {
        self.store.compact_before_continued_lists(n);
    }

    /// Forcibly ends every open watch connection.
    pub fn drop_watches(&self) {
        self.store.drop_watches();
    }

    /// An API server outage: while `true` every request over HTTP answers 503 and the open
    /// watches are ended. The in-process stand-ins (scheduler, kubelet) keep using the store.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.unavailable
            .store(unavailable, std::sync::atomic::Ordering::Relaxed);
        if unavailable {
            self.store.drop_watches();
        }
    }

    /// A slow API server's lists: while `true`, list requests over HTTP (not gets, not watches)
    /// wait; released, each answers with the state at its release. What a client does while
    /// its re-list is under way is tested with it.
    pub fn hold_lists(&self, held: bool) {
        self.lists_held.send_replace(held);
    }

    /// The kubeconfig YAML pointing at this emulator (context `kube-emulator`, namespace `default`).
    pub fn kubeconfig(&self) -> String {
        let mut cluster = json!({"server": self.url});
        if let Some(ca) = &self.ca_pem {
            cluster["certificate-authority-data"] =
                json!(base64::engine::general_purpose::STANDARD.encode(ca));
        }
        let user = match &self.token {
            Some(t) => json!({"token": t}),
            None => json!({}),
        };
        let cfg = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kube-emulator", "cluster": cluster}],
            "users": [{"name": "kube-emulator", "user": user}],
            "contexts": [{"name": "kube-emulator", "context": {"cluster": "kube-emulator", "user": "kube-emulator", "namespace": "default"}}],
            "current-context": "kube-emulator",
            "preferences": {},
        });
        // A JSON document is valid YAML; serde_yaml only makes it friendlier to read.
        serde_yaml::to_string(&cfg).unwrap_or_else(|_| cfg.to_string())
    }

    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), EmulatorError> {
        let path = path.as_ref();
        std::fs::write(path, self.kubeconfig()).map_err(|source| EmulatorError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Saves the persistence file now (no-op without one).
    pub fn save(&self) -> Result<(), EmulatorError> {
        match &self.persist_path {
            Some(p) => save(&self.store, p),
            None => Ok(()),
        }
    }

    /// Stops serving (open watches are ended) and saves the persistence file.
    pub async fn shutdown(self) -> Result<(), EmulatorError> {
        let KubeHandle {
            store,
            persist_path,
            server_handle,
            task,
            persist_task,
            gc_task,
            ..
        } = self;
        gc_task.abort();
        store.drop_watches();
        server_handle.graceful_shutdown(Some(Duration::from_secs(2)));
        if let Some(t) = &persist_task {
            t.abort();
        }
        let served = task.await.map_err(|e| EmulatorError::Serve(e.to_string()))?;
        served.map_err(|e| EmulatorError::Serve(e.to_string()))?;
        // Saved after the listener stopped, so no accepted write is lost.
        match &persist_path {
            Some(p) => save(&store, p),
            None => Ok(()),
        }
    }
}
