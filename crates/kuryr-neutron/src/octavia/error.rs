//! Typed Octavia errors. Octavia answers failures with `{"faultcode", "faultstring", "debuginfo"}` (WSME); the kind is
//! decided from the status and the fixed wording of Octavia's exception messages, so callers match on kinds.

use std::fmt;
use std::time::Duration;

use crate::auth::AuthError;
use crate::transport::{StatusFailure, TransportError};

/// What went wrong, as far as a caller needs to react to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OctaviaErrorKind {
    /// 404.
    NotFound,
    /// 409 because the load balancer (or the pool, listener, policy) is in a `PENDING_*` state: "Invalid state
    /// PENDING_UPDATE of loadbalancer resource <id>" or "<resource> <id> is immutable and cannot be updated.".
    /// The client's writes wait for the load balancer and retry these.
    Immutable {
        /// `loadbalancer`, `Load Balancer`, `Pool`, `Listener`, `L7Policy` as Octavia names it.
        resource: String,
        id: Option<String>,
        /// The `PENDING_*` state when Octavia names it.
        state: Option<String>,
    },
    /// Any other 409: duplicate listener port or member, pool in use, VIP address in use.
    Conflict,
    /// 403 "Quota has been met for resources: ...".
    Quota,
    /// Another 403 (policy).
    Forbidden,
    /// 400: invalid input, unknown provider, bad filter.
    Validation,
    /// 501 "Provider '<p>' does not support a requested option: ...".
    UnsupportedProviderOption,
    /// Another 501 (provider not found, feature not implemented by the provider).
    NotImplemented,
    Unauthorized,
    ServiceUnavailable,
    Other {
        status: u16,
    },
}

impl OctaviaErrorKind {
    /// The kind of an error answer from its status and `faultstring`.
    pub fn classify(status: u16, faultstring: &str) -> Self {
        match status {
            404 => Self::NotFound,
            409 => parse_immutable(faultstring).unwrap_or(Self::Conflict),
            403 if faultstring.starts_with("Quota has been met") => Self::Quota,
            403 => Self::Forbidden,
            400 => Self::Validation,
            401 => Self::Unauthorized,
            501 if faultstring.contains("does not support a requested option") => {
                Self::UnsupportedProviderOption
            }
            501 => Self::NotImplemented,
            503 => Self::ServiceUnavailable,
            s => Self::Other { status: s },
        }
    }

    /// Name for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::NotFound => "NotFound",
            Self::Immutable { .. } => "Immutable",
            Self::Conflict => "Conflict",
            Self::Quota => "Quota",
            Self::Forbidden => "Forbidden",
            Self::Validation => "Validation",
            Self::UnsupportedProviderOption => "UnsupportedProviderOption",
            Self::NotImplemented => "NotImplemented",
            Self::Unauthorized => "Unauthorized",
            Self::ServiceUnavailable => "ServiceUnavailable",
            Self::Other { .. } => "Other",
        }
    }
}

impl fmt::Display for OctaviaErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The two wordings of Octavia's "busy" conflict; `None` for any other 409.
fn parse_immutable(msg: &str) -> Option<OctaviaErrorKind> {
    // LBPendingStateError: "Invalid state PENDING_UPDATE of loadbalancer resource <id>"
    if let Some(rest) = msg.strip_prefix("Invalid state ") {
        let mut words = rest.split_whitespace();
        let state = words.next().map(str::to_owned);
        let id = msg
            .rsplit_once("resource ")
            .map(|(_, id)| id.trim().trim_end_matches('.').to_owned())
            .filter(|id| !id.is_empty());
        return Some(OctaviaErrorKind::Immutable {
            resource: "loadbalancer".to_owned(),
            id,
            state,
        });
    }
    // ImmutableObject: "<resource> <id> is immutable and cannot be updated."
    let head = msg
        .strip_suffix("is immutable and cannot be updated.")?
        .trim_end();
    let (resource, id) = match head.rsplit_once(' ') {
        Some((r, id)) => (r.to_owned(), Some(id.to_owned())),
        None => (head.to_owned(), None),
    };
    Some(OctaviaErrorKind::Immutable {
        resource,
        id,
        state: None,
    })
}

/// An error answer from the Octavia API.
#[derive(Debug, Clone)]
pub struct OctaviaApiError {
    pub kind: OctaviaErrorKind,
    pub status: u16,
    /// `faultstring` (or the start of a body that was not a WSME fault).
    pub message: String,
    pub faultcode: Option<String>,
    pub debuginfo: Option<String>,
    /// `x-openstack-request-id`, to grep in Octavia's log.
    pub request_id: Option<String>,
    pub retry_after: Option<Duration>,
    pub operation: &'static str,
}

impl fmt::Display for OctaviaApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: Octavia answered {} {}: {} (request id {})",
            self.operation,
            self.status,
            self.kind,
            self.message,
            self.request_id.as_deref().unwrap_or("none")
        )
    }
}

#[derive(serde::Deserialize)]
struct FaultBody {
    #[serde(default)]
    faultcode: Option<String>,
    #[serde(default)]
    faultstring: Option<String>,
    #[serde(default)]
    debuginfo: Option<String>,
}

impl OctaviaApiError {
    pub(crate) fn from_failure(f: StatusFailure) -> Self {
        let (faultcode, message, debuginfo) = match serde_json::from_slice::<FaultBody>(&f.body) {
            Ok(b) if b.faultstring.is_some() => (b.faultcode, b.faultstring.unwrap_or_default(), b.debuginfo),
            _ => (
                None,
                String::from_utf8_lossy(&f.body).chars().take(300).collect(),
                None,
            ),
        };
        Self {
            kind: OctaviaErrorKind::classify(f.status, &message),
            status: f.status,
            message,
            faultcode,
            debuginfo,
            request_id: f.request_id,
            retry_after: f.retry_after,
            operation: f.operation,
        }
    }
}

/// Every error of [`crate::octavia::OctaviaClient`].
#[derive(Debug, thiserror::Error)]
pub enum OctaviaError {
    #[error("{0}")]
    Api(Box<OctaviaApiError>),
    #[error(
        "{operation}: connection to Octavia failed{}{}: {}",
        if *.timed_out { " (timeout)" } else { "" },
        if *.outcome_unknown { " after the request was sent, so it may have been applied" } else { "" },
        crate::error::describe_transport(.source)
    )]
    Connection {
        operation: &'static str,
        timed_out: bool,
        outcome_unknown: bool,
        #[source]
        source: reqwest::Error,
    },
    #[error("{operation}: cannot decode Octavia answer (status {status}, request id {}): {message}", request_id.as_deref().unwrap_or("none"))]
    Decode {
        operation: &'static str,
        status: u16,
        request_id: Option<String>,
        message: String,
    },
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("invalid Octavia client configuration: {0}")]
    Config(String),
    /// The load balancer went to provisioning_status ERROR while we waited for it.
    #[error("load balancer {lb_id} went to provisioning_status ERROR (waiting for {target})")]
    ProvisioningFailed { lb_id: String, target: &'static str },
    /// The load balancer did not reach the target in time.
    #[error("load balancer {lb_id} still {last_status} after {waited:?} (waiting for {target})")]
    WaitTimeout {
        lb_id: String,
        target: &'static str,
        last_status: String,
        waited: Duration,
    },
}

impl From<TransportError> for OctaviaError {
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::Connection {
                operation,
                timed_out,
                outcome_unknown,
                source,
            } => Self::Connection {
                operation,
                timed_out,
                outcome_unknown,
                source,
            },
            TransportError::Decode {
                operation,
                status,
                request_id,
                message,
            } => Self::Decode {
                operation,
                status,
                request_id,
                message,
            },
            TransportError::Auth(e) => Self::Auth(e),
            TransportError::Config(m) => Self::Config(m),
        }
    }
}

impl OctaviaError {
    pub fn api(&self) -> Option<&OctaviaApiError> {
        match self {
            Self::Api(e) => Some(e),
            _ => None,
        }
    }

    pub fn kind(&self) -> Option<&OctaviaErrorKind> {
        self.api().map(|e| &e.kind)
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api(e) => Some(e.status),
            Self::Decode { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn request_id(&self) -> Option<&str> {
        match self {
            Self::Api(e) => e.request_id.as_deref(),
            Self::Decode { request_id, .. } => request_id.as_deref(),
            _ => None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        self.api().and_then(|e| e.retry_after)
    }

    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// A 409 because something is `PENDING_*`: worth retrying once the load balancer is ACTIVE again.
    pub fn is_immutable(&self) -> bool {
        matches!(self.kind(), Some(OctaviaErrorKind::Immutable { .. }))
    }

    /// See [`crate::Error::outcome_unknown`].
    pub fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            Self::Connection {
                outcome_unknown: true,
                ..
            }
        )
    }

    /// Worth retrying later unchanged: connection problems, 5xx (but 501), 429, a busy load balancer.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connection { .. } | Self::WaitTimeout { .. } => true,
            Self::Api(e) => (e.status >= 500 && e.status != 501) || e.status == 429 || self.is_immutable(),
            Self::Auth(e) => e.is_transient(),
            Self::Decode { .. } | Self::Config(_) | Self::ProvisioningFailed { .. } => false,
        }
    }
}

pub type OctaviaResult<T> = std::result::Result<T, OctaviaError>;

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(status: u16, body: &str) -> OctaviaError {
        OctaviaError::Api(Box::new(OctaviaApiError::from_failure(StatusFailure {
            operation: "op",
            status,
            request_id: Some("req-1".into()),
            retry_after: Some(Duration::from_secs(2)),
            body: body.as_bytes().to_vec(),
        })))
    }

    #[test]
    fn pending_state_409_names_state_and_lb() {
        let e = failure(
            409,
            r#"{"faultcode": "Client", "faultstring": "Invalid state PENDING_UPDATE of loadbalancer resource 2062-ab", "debuginfo": null}"#,
        );
        assert_eq!(
            e.kind(),
            Some(&OctaviaErrorKind::Immutable {
                resource: "loadbalancer".into(),
                id: Some("2062-ab".into()),
                state: Some("PENDING_UPDATE".into()),
            })
        );
        assert!(e.is_immutable() && e.is_transient());
        assert_eq!(e.request_id(), Some("req-1"));
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(e.api().and_then(|a| a.faultcode.as_deref()), Some("Client"));
    }

    #[test]
    fn immutable_object_409() {
        let e = failure(
            409,
            r#"{"faultcode": "Client", "faultstring": "Load Balancer 77aa is immutable and cannot be updated.", "debuginfo": null}"#,
        );
        assert_eq!(
            e.kind(),
            Some(&OctaviaErrorKind::Immutable {
                resource: "Load Balancer".into(),
                id: Some("77aa".into()),
                state: None,
            })
        );
        let e = failure(
            409,
            r#"{"faultcode": "Client", "faultstring": "Another member on this pool is already using ip 10.0.0.5 on protocol_port 80", "debuginfo": null}"#,
        );
        assert_eq!(e.kind(), Some(&OctaviaErrorKind::Conflict));
        assert!(!e.is_transient());
    }

    #[test]
    fn other_kinds() {
        let q = failure(
            403,
            r#"{"faultcode": "Client", "faultstring": "Quota has been met for resources: Load Balancer", "debuginfo": null}"#,
        );
        assert_eq!(q.kind(), Some(&OctaviaErrorKind::Quota));
        let nf = failure(
            404,
            r#"{"faultcode": "Client", "faultstring": "Load Balancer 00 not found.", "debuginfo": null}"#,
        );
        assert!(nf.is_not_found());
        assert_eq!(
            nf.api().map(|a| a.message.as_str()),
            Some("Load Balancer 00 not found.")
        );
        let v = failure(
            400,
            r#"{"faultcode": "Client", "faultstring": "Invalid input for field/attribute protocol.", "debuginfo": null}"#,
        );
        assert_eq!(v.kind(), Some(&OctaviaErrorKind::Validation));
        let u = failure(
            501,
            r#"{"faultcode": "Server", "faultstring": "Provider 'ovn' does not support a requested option: OVN provider does not support HTTP protocol", "debuginfo": null}"#,
        );
        assert_eq!(u.kind(), Some(&OctaviaErrorKind::UnsupportedProviderOption));
        assert!(!u.is_transient());
        let html = failure(503, "<html>busy</html>");
        assert_eq!(html.kind(), Some(&OctaviaErrorKind::ServiceUnavailable));
        assert!(html.is_transient());
        assert!(html.to_string().contains("<html>busy</html>"));
    }
}
