//! The routers: the CNI API, health and metrics. Every answer that is not a
//! success is an [`ApiError`]'s JSON, including unknown paths and methods.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::json;

use crate::api::{ApiError, DaemonError};
use crate::daemon::Daemon;

/// The whole body, within the size limit and the body timeout.
async fn read_body(d: &Daemon, body: Body) -> Result<Bytes, ApiError> {
    let limits = &d.config.limits;
    let collect = Limited::new(body, limits.max_body_bytes).collect();
    match tokio::time::timeout(limits.body_timeout, collect).await {
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            d.metrics.reject("too_large");
            Err(ApiError::too_large(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is over the limit of {} bytes", limits.max_body_bytes),
            ))
        }
        Ok(Err(e)) => {
            d.metrics.reject("malformed");
            Err(ApiError::malformed(format!("reading the request body: {e}")))
        }
        Err(_) => {
            d.metrics.reject("body_timeout");
            Err(ApiError::read_timeout(format!(
                "request body not complete within {:?}",
                limits.body_timeout
            )))
        }
    }
}

/// `?all=1` (or `true`) asks ADD for every interface.
fn wants_all(uri: &Uri) -> bool {
    uri.query().unwrap_or_default().split('&').any(|kv| {
        kv.split_once('=')
            .is_some_and(|(k, v)| k == "all" && (v == "1" || v.eq_ignore_ascii_case("true")))
    })
}

async fn add_network(State(d): State<Arc<Daemon>>, req: Request) -> Response {
    let all = wants_all(req.uri());
    let body = match read_body(&d, req.into_body()).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let result = d.add(&body).await;
    d.liveness.record(&result);
    match result {
        Ok(r) => {
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

async fn del_network(State(d): State<Arc<Daemon>>, req: Request) -> Response {
    let body = match read_body(&d, req.into_body()).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let result = d.del(&body).await;
    d.liveness.record(&result);
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => log_error("DEL", e).into_response(),
    }
}

async fn check_network(State(d): State<Arc<Daemon>>, req: Request) -> Response {
    let body = match read_body(&d, req.into_body()).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    match d.check(&body).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => log_error("CHECK", e).into_response(),
    }
}

async fn gc(State(d): State<Arc<Daemon>>, req: Request) -> Response {
    let body = match read_body(&d, req.into_body()).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
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

/// Alive unless ADD/DEL keep failing or memory is over its limit ([`crate::liveness`]).
async fn alive(State(d): State<Arc<Daemon>>) -> Response {
    let rss = d.config.max_memory_mib.and(crate::liveness::rss_mib());
    match d.liveness.verdict(rss) {
        None => StatusCode::OK.into_response(),
        Some(why) => {
            tracing::error!(reason = %why, "not alive: the kubelet restarts the daemon");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({"status": "not alive", "reason": why})),
            )
                .into_response()
        }
    }
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

async fn not_found(State(d): State<Arc<Daemon>>, uri: Uri) -> ApiError {
    d.metrics.reject("not_found");
    ApiError::not_found(uri.path())
}

async fn method_not_allowed(State(d): State<Arc<Daemon>>, method: Method, uri: Uri) -> ApiError {
    d.metrics.reject("method_not_allowed");
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// JSON answers for unknown paths and methods.
fn with_fallbacks(r: Router<Arc<Daemon>>, d: Arc<Daemon>) -> Router {
    r.fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(d)
}

/// The CNI API.
pub fn api_router(d: Arc<Daemon>) -> Router {
    let r = Router::new()
        .route("/addNetwork", post(add_network))
        .route("/delNetwork", post(del_network))
        .route("/checkNetwork", post(check_network))
        .route("/gc", post(gc))
        .route("/status", post(status).get(status));
    with_fallbacks(r, d)
}

/// `/ready` and `/alive`.
pub fn health_router(d: Arc<Daemon>) -> Router {
    let r = Router::new()
        .route("/ready", get(status))
        .route("/alive", get(alive));
    with_fallbacks(r, d)
}

pub fn metrics_router(d: Arc<Daemon>) -> Router {
    with_fallbacks(Router::new().route("/metrics", get(metrics)), d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_read_from_the_query() {
        let u = |s: &str| s.parse::<Uri>().unwrap_or_default();
        assert!(wants_all(&u("/addNetwork?all=1")));
        assert!(wants_all(&u("/addNetwork?x=2&all=TRUE")));
        assert!(!wants_all(&u("/addNetwork?all=0")));
        assert!(!wants_all(&u("/addNetwork?ball=1")));
        assert!(!wants_all(&u("/addNetwork")));
    }
}
