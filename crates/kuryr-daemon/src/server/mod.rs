//! HTTP servers: the CNI API (TCP and optionally a unix socket), health and
//! metrics. See [`crate::api`] for the wire format, [`conn`] for what every
//! connection goes through, [`limits`] for the caps.

mod conn;
mod limits;
mod routes;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use axum::Router;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use limits::{FD_RESERVE, FDS_PER_ADD, HEALTH_CONNECTIONS, ServerLimits, open_file_limit};
pub use routes::{api_router, health_router, metrics_router};

use crate::daemon::Daemon;
use conn::{ConnLimits, Listener};

/// Running servers; dropping this does not stop them, call [`Self::shutdown`].
pub struct Servers {
    pub api: SocketAddr,
    pub health: SocketAddr,
    pub metrics: SocketAddr,
    /// API connections served at once (the configured cap within the file budget).
    pub api_connections: usize,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
}

impl Servers {
    /// Stop accepting, finish in-flight requests, wait for the servers.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Wait until a server fails (they never end on their own).
    pub async fn wait(self) -> std::io::Result<()> {
        for t in self.tasks {
            match t.await {
                Ok(r) => r?,
                Err(e) => return Err(std::io::Error::other(e)),
            }
        }
        Ok(())
    }
}

async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("bind {addr}: {e}")))
}

/// The unix socket, readable and writable by its owner only (the daemon
/// runs as root; the plugin the kubelet runs is root too).
fn bind_unix(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    let named = |e: std::io::Error| std::io::Error::new(e.kind(), format!("bind {}: {e}", path.display()));
    // A socket left by a previous run would make bind fail.
    let _ = std::fs::remove_file(path);
    let l = tokio::net::UnixListener::bind(path).map_err(named)?;
    // The new socket's group comes from a set-group-id directory, or the daemon's own; as root,
    // hand it to root:root so 0600 cannot leave it to anyone else.
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(path, Some(0), Some(0)).map_err(named)?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(named)?;
    Ok(l)
}

/// Bind every listener of the config (port 0 picks a free port; the bound
/// addresses are in [`Servers`]) and serve. The API's TCP address must be a
/// loopback one unless `limits.allow_non_loopback_bind`.
pub async fn start(d: Arc<Daemon>) -> std::io::Result<Servers> {
    let limits = &d.config.limits;
    limits
        .check_bind_address(d.config.bind_address)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
    let nofile = open_file_limit();
    let api_connections = limits.connection_budget(nofile);
    if api_connections < limits.max_connections {
        tracing::warn!(
            open_file_limit = nofile,
            max_connections = limits.max_connections,
            api_connections,
            "the open-file limit caps the CNI API's connections below [cni_daemon] max_connections"
        );
    }
    let (stop, rx) = watch::channel(false);
    let api_l = bind(d.config.bind_address).await?;
    let health_l = bind(d.config.health_address).await?;
    let metrics_l = bind(d.config.metrics_address).await?;
    let (api, health, metrics) = (
        api_l.local_addr()?,
        health_l.local_addr()?,
        metrics_l.local_addr()?,
    );
    let api_limits = ConnLimits {
        max_connections: api_connections,
        header_timeout: limits.header_timeout,
        max_head_bytes: limits.max_head_bytes,
        max_body_bytes: limits.max_body_bytes,
    };
    let probe_limits = ConnLimits {
        max_connections: HEALTH_CONNECTIONS,
        ..api_limits.clone()
    };
    let mut servers: Vec<(Listener, Router, ConnLimits)> = vec![
        (Listener::Tcp(api_l), api_router(d.clone()), api_limits.clone()),
        (
            Listener::Tcp(health_l),
            health_router(d.clone()),
            probe_limits.clone(),
        ),
        (Listener::Tcp(metrics_l), metrics_router(d.clone()), probe_limits),
    ];
    if let Some(path) = &d.config.unix_socket {
        // Its own cap: a flood on one listener leaves the other working.
        servers.push((
            Listener::Unix(bind_unix(path)?),
            api_router(d.clone()),
            api_limits,
        ));
    }
    let mut tasks = Vec::new();
    for (listener, router, limits) in servers {
        let on_reject: conn::OnReject = {
            let d = d.clone();
            Arc::new(move |reason| d.metrics.reject(reason))
        };
        tasks.push(tokio::spawn(conn::serve(
            listener,
            router,
            limits,
            on_reject,
            rx.clone(),
        )));
    }
    tracing::info!(%api, %health, %metrics, api_connections, "kuryr daemon listening");
    Ok(Servers {
        api,
        health,
        metrics,
        api_connections,
        stop,
        tasks,
    })
}
