//! HTTP servers: the CNI API (TCP and optionally a unix socket), health and
//! metrics. See [`crate::api`] for the wire format.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::DaemonError;
use crate::daemon::Daemon;

#[derive(Deserialize)]
struct AddQuery {
    all: Option<String>,
}

async fn add_network(State(d): State<Arc<Daemon>>, Query(q): Query<AddQuery>, body: Bytes) -> Response {
    match d.add(&body).await {
        Ok(r) => {
            let all = q
                .all
                .as_deref()
                .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
            let body = if all {
                json!({"vif": r.vif, "result": r.result})
            } else {
                r.vif
            };
            (StatusCode::ACCEPTED, axum::Json(body)).into_response()
        }
        Err(e) => log_error("ADD", e).into_response(),
    }
}

async fn del_network(State(d): State<Arc<Daemon>>, body: Bytes) -> Response {
    match d.del(&body).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => log_error("DEL", e).into_response(),
    }
}

async fn check_network(State(d): State<Arc<Daemon>>, body: Bytes) -> Response {
    match d.check(&body).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => log_error("CHECK", e).into_response(),
    }
}

async fn gc(State(d): State<Arc<Daemon>>, body: Bytes) -> Response {
    match d.gc(&body).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => log_error("GC", e).into_response(),
    }
}

async fn status(State(d): State<Arc<Daemon>>) -> Response {
    match d.ready().await {
        Ok(()) => (StatusCode::OK, axum::Json(json!({"status": "ready"}))).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn alive() -> StatusCode {
    StatusCode::OK
}

async fn metrics(State(d): State<Arc<Daemon>>) -> Response {
    d.metrics
        .registry_entries
        .set(i64::try_from(d.registry.len()).unwrap_or(i64::MAX));
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        d.metrics.encode(),
    )
        .into_response()
}

fn log_error(command: &str, e: DaemonError) -> DaemonError {
    tracing::warn!(command, code = e.code(), error = %e, "CNI request failed");
    e
}

/// The CNI API.
pub fn api_router(d: Arc<Daemon>) -> Router {
    Router::new()
        .route("/addNetwork", post(add_network))
        .route("/delNetwork", post(del_network))
        .route("/checkNetwork", post(check_network))
        .route("/gc", post(gc))
        .route("/status", post(status).get(status))
        .with_state(d)
}

/// `/ready` and `/alive`.
pub fn health_router(d: Arc<Daemon>) -> Router {
    Router::new()
        .route("/ready", get(status))
        .route("/alive", get(alive))
        .with_state(d)
}

pub fn metrics_router(d: Arc<Daemon>) -> Router {
    Router::new().route("/metrics", get(metrics)).with_state(d)
}

/// Running servers; dropping this does not stop them, call [`Self::shutdown`].
pub struct Servers {
    pub api: SocketAddr,
    pub health: SocketAddr,
    pub metrics: SocketAddr,
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

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Bind every listener of the config (port 0 picks a free port; the bound
/// addresses are in [`Servers`]) and serve.
pub async fn start(d: Arc<Daemon>) -> std::io::Result<Servers> {
    let (stop, rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("bind {addr}: {e}")))
    };
    let api_l = bind(d.config.bind_address).await?;
    let health_l = bind(d.config.health_address).await?;
    let metrics_l = bind(d.config.metrics_address).await?;
    let (api, health, metrics) = (
        api_l.local_addr()?,
        health_l.local_addr()?,
        metrics_l.local_addr()?,
    );
    for (listener, router) in [
        (api_l, api_router(d.clone())),
        (health_l, health_router(d.clone())),
        (metrics_l, metrics_router(d.clone())),
    ] {
        let rx = rx.clone();
        tasks.push(tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(stopped(rx))
                .await
        }));
    }
    if let Some(path) = &d.config.unix_socket {
        // A socket left by a previous run would make bind fail.
        let _ = std::fs::remove_file(path);
        let l = tokio::net::UnixListener::bind(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("bind {}: {e}", path.display())))?;
        let router = api_router(d.clone());
        let rx = rx.clone();
        tasks.push(tokio::spawn(async move {
            axum::serve(l, router).with_graceful_shutdown(stopped(rx)).await
        }));
    }
    tracing::info!(%api, %health, %metrics, "kuryr daemon listening");
    Ok(Servers {
        api,
        health,
        metrics,
        stop,
        tasks,
    })
}
