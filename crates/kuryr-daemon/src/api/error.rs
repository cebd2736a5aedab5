//! Error answers of the daemon's HTTP servers: always upstream's JSON
//! `{"code", "msg", "details"}`, whether a CNI command failed or the request
//! never reached one (bad HTTP, unknown path, too large, too slow, too many).

use axum::http::StatusCode;
use axum::http::header::{CONNECTION, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Upstream's CNI error codes (`kuryr_kubernetes/cni/daemon/service.py`).
pub const ERR_CONTAINER_UNKNOWN: u32 = 3;
pub const ERR_INVALID_ENVIRONMENT_VARIABLES: u32 = 4;
pub const ERR_TRY_AGAIN_LATER: u32 = 11;
pub const ERR_INTERNAL: u32 = 999;
/// kuryr-rs: CNI STATUS when the daemon cannot plug anything.
pub const ERR_NOT_READY: u32 = 50;

/// One error answer. A request the client got wrong carries code 4 (upstream's
/// "invalid environment variables", which its plugin reports as a bad request);
/// one the daemon could not take now carries 11 ("try again later"), which
/// makes the runtime retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: u32,
    pub msg: &'static str,
    pub details: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: u32, msg: &'static str, details: impl Into<String>) -> Self {
        Self {
            status,
            code,
            msg,
            details: details.into(),
        }
    }

    /// Not HTTP/1.x, or a head that does not parse.
    pub fn malformed(details: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ERR_INVALID_ENVIRONMENT_VARIABLES,
            "Malformed HTTP request",
            details,
        )
    }

    pub fn too_large(status: StatusCode, details: impl Into<String>) -> Self {
        Self::new(
            status,
            ERR_INVALID_ENVIRONMENT_VARIABLES,
            "Request too large",
            details,
        )
    }

    /// The client did not send its head or body in time.
    pub fn read_timeout(details: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            ERR_TRY_AGAIN_LATER,
            "Request not received in time. Try Again Later",
            details,
        )
    }

    /// Every connection slot is taken by a request being served.
    pub fn busy(details: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ERR_TRY_AGAIN_LATER,
            "Too many requests. Try Again Later",
            details,
        )
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ERR_INVALID_ENVIRONMENT_VARIABLES,
            "Not Found",
            format!("no endpoint {path}"),
        )
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ERR_INVALID_ENVIRONMENT_VARIABLES,
            "Method Not Allowed",
            format!("{path} does not take {method}"),
        )
    }

    pub fn body(&self) -> String {
        json!({"code": self.code, "msg": self.msg, "details": self.details}).to_string()
    }

    /// The whole HTTP/1.1 answer, for the connection layer that answers
    /// before any router runs. The connection is closed after it.
    pub fn to_http(&self) -> Vec<u8> {
        let body = self.body();
        format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or(""),
            body.len()
        )
        .into_bytes()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {}): {}", self.msg, self.code, self.details)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(CONTENT_TYPE, "application/json"), (CONNECTION, "close")],
            self.body(),
        )
            .into_response()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    BadParams(String),
    #[error("{0}")]
    PodGone(String),
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    NotReady(String),
    #[error("{0}")]
    Internal(String),
}

impl DaemonError {
    /// CNI error code (upstream numbering).
    pub fn code(&self) -> u32 {
        match self {
            Self::BadParams(_) => ERR_INVALID_ENVIRONMENT_VARIABLES,
            Self::PodGone(_) => ERR_CONTAINER_UNKNOWN,
            Self::Timeout(_) => ERR_TRY_AGAIN_LATER,
            Self::NotReady(_) => ERR_NOT_READY,
            Self::Internal(_) => ERR_INTERNAL,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadParams(_) => StatusCode::BAD_REQUEST,
            Self::PodGone(_) => StatusCode::GONE,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn msg(&self) -> &'static str {
        match self {
            Self::BadParams(_) => "Required parameters are missing or invalid",
            Self::PodGone(_) => "Pod was deleted while processing the request",
            Self::Timeout(_) => "Try Again Later",
            Self::NotReady(_) => "The kuryr daemon is not ready",
            Self::Internal(_) => "Internal error",
        }
    }

    pub fn reply(&self) -> ApiError {
        ApiError::new(self.status(), self.code(), self.msg(), self.to_string())
    }
}

impl IntoResponse for DaemonError {
    fn into_response(self) -> Response {
        self.reply().into_response()
    }
}
