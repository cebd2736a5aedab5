//! Typed errors. Neutron reports failures as `{"NeutronError": {"type", "message", "detail"}}`; the `type` is mapped
//! onto [`ErrorKind`] so callers match on kinds instead of parsing messages.

use std::fmt;

use crate::auth::AuthError;

/// The `NeutronError.type` values kuryr-rs reacts to. Anything else is kept verbatim in [`ErrorKind::Other`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    OverQuota,
    IpAddressGenerationFailure,
    IpAddressAlreadyAllocated,
    PortNotFound,
    NetworkNotFound,
    SubnetNotFound,
    TrunkNotFound,
    FloatingIpNotFound,
    SecurityGroupNotFound,
    /// A security group still on a port cannot be deleted.
    SecurityGroupInUse,
    /// A rule equal to one the group has (409, like OverQuota: told apart by the type).
    SecurityGroupRuleExists,
    /// No router joins the port's subnet to the floating IP's network.
    ExternalGatewayForFloatingIpNotFound,
    FloatingIpPortAlreadyAssociated,
    DuplicateSubPort,
    PortInUseAsSubPort,
    ParentPortInUse,
    SubPortBindingError,
    RevisionNumberConstraintFailed,
    /// `remove_addresses` named an address the address group does not hold (404; nothing removed).
    AddressesNotFound,
    /// `add_addresses` named an address the address group already holds (400; nothing added).
    AddressesAlreadyExist,
    /// A tag removed one at a time that the resource does not carry (404).
    TagNotFound,
    InvalidInput,
    /// `BadRequest`/`HTTPBadRequest`, e.g. "Unrecognized attribute(s)".
    BadRequest,
    Conflict,
    /// A 404 whose type is not one of the specific `*NotFound` kinds above.
    NotFound,
    Unauthorized,
    ServiceUnavailable,
    /// Any other `NeutronError.type` (or, for a body that is not a NeutronError, the HTTP reason).
    Other {
        error_type: String,
    },
}

impl ErrorKind {
    /// Map a `NeutronError.type` (possibly empty when the body was not a NeutronError) and HTTP status to a kind.
    pub fn from_type(error_type: &str, status: u16) -> Self {
        match error_type {
            "OverQuota" => Self::OverQuota,
            "IpAddressGenerationFailure" => Self::IpAddressGenerationFailure,
            "IpAddressAlreadyAllocated" => Self::IpAddressAlreadyAllocated,
            "PortNotFound" => Self::PortNotFound,
            "NetworkNotFound" => Self::NetworkNotFound,
            "SubnetNotFound" => Self::SubnetNotFound,
            "TrunkNotFound" => Self::TrunkNotFound,
            "FloatingIPNotFound" => Self::FloatingIpNotFound,
            "SecurityGroupNotFound" => Self::SecurityGroupNotFound,
            "SecurityGroupInUse" => Self::SecurityGroupInUse,
            "SecurityGroupRuleExists" => Self::SecurityGroupRuleExists,
            "ExternalGatewayForFloatingIPNotFound" => Self::ExternalGatewayForFloatingIpNotFound,
            "FloatingIPPortAlreadyAssociated" => Self::FloatingIpPortAlreadyAssociated,
            "DuplicateSubPort" => Self::DuplicateSubPort,
            "PortInUseAsSubPort" => Self::PortInUseAsSubPort,
            "ParentPortInUse" => Self::ParentPortInUse,
            "SubPortBindingError" => Self::SubPortBindingError,
            "RevisionNumberConstraintFailed" => Self::RevisionNumberConstraintFailed,
            "AddressesNotFound" => Self::AddressesNotFound,
            "AddressesAlreadyExist" => Self::AddressesAlreadyExist,
            "TagNotFound" => Self::TagNotFound,
            "InvalidInput" => Self::InvalidInput,
            "BadRequest" | "HTTPBadRequest" => Self::BadRequest,
            "Conflict" | "HTTPConflict" => Self::Conflict,
            "NotFound" | "HTTPNotFound" => Self::NotFound,
            "NotAuthorized" | "HTTPUnauthorized" | "Unauthorized" => Self::Unauthorized,
            "ServiceUnavailable" | "HTTPServiceUnavailable" => Self::ServiceUnavailable,
            "" => match status {
                400 => Self::BadRequest,
                401 => Self::Unauthorized,
                404 => Self::NotFound,
                409 => Self::Conflict,
                503 => Self::ServiceUnavailable,
                _ => Self::Other {
                    error_type: format!("HTTP{status}"),
                },
            },
            other => match status {
                401 => Self::Unauthorized,
                503 => Self::ServiceUnavailable,
                _ => Self::Other {
                    error_type: other.to_owned(),
                },
            },
        }
    }

    /// The name as Neutron spells it (for logs and metrics labels).
    pub fn as_str(&self) -> &str {
        match self {
            Self::OverQuota => "OverQuota",
            Self::IpAddressGenerationFailure => "IpAddressGenerationFailure",
            Self::IpAddressAlreadyAllocated => "IpAddressAlreadyAllocated",
            Self::PortNotFound => "PortNotFound",
            Self::NetworkNotFound => "NetworkNotFound",
            Self::SubnetNotFound => "SubnetNotFound",
            Self::TrunkNotFound => "TrunkNotFound",
            Self::FloatingIpNotFound => "FloatingIPNotFound",
            Self::SecurityGroupNotFound => "SecurityGroupNotFound",
            Self::SecurityGroupInUse => "SecurityGroupInUse",
            Self::SecurityGroupRuleExists => "SecurityGroupRuleExists",
            Self::ExternalGatewayForFloatingIpNotFound => "ExternalGatewayForFloatingIPNotFound",
            Self::FloatingIpPortAlreadyAssociated => "FloatingIPPortAlreadyAssociated",
            Self::DuplicateSubPort => "DuplicateSubPort",
            Self::PortInUseAsSubPort => "PortInUseAsSubPort",
            Self::ParentPortInUse => "ParentPortInUse",
            Self::SubPortBindingError => "SubPortBindingError",
            Self::RevisionNumberConstraintFailed => "RevisionNumberConstraintFailed",
            Self::AddressesNotFound => "AddressesNotFound",
            Self::AddressesAlreadyExist => "AddressesAlreadyExist",
            Self::TagNotFound => "TagNotFound",
            Self::InvalidInput => "InvalidInput",
            Self::BadRequest => "BadRequest",
            Self::Conflict => "Conflict",
            Self::NotFound => "NotFound",
            Self::Unauthorized => "Unauthorized",
            Self::ServiceUnavailable => "ServiceUnavailable",
            Self::Other { error_type } => error_type,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answer from the Neutron API.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub status: u16,
    pub message: String,
    /// `x-openstack-request-id` of the failed request, to grep in neutron-server's log.
    pub request_id: Option<String>,
    /// The server's `Retry-After` (429/503): when to try again at the earliest.
    pub retry_after: Option<std::time::Duration>,
    /// Client operation name, e.g. `create_port`.
    pub operation: &'static str,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: Neutron answered {} {}: {} (request id {})",
            self.operation,
            self.status,
            self.kind,
            self.message,
            self.request_id.as_deref().unwrap_or("none")
        )
    }
}

/// Every error of the client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neutron answered with an error status.
    #[error("{0}")]
    Api(Box<ApiError>),
    /// The request did not get an HTTP answer (refused, reset, DNS, TLS, timeout).
    #[error(
        "{operation}: connection to Neutron failed{}{}: {}",
        if *.timed_out { " (timeout)" } else { "" },
        if *.outcome_unknown { " after the request was sent, so it may have been applied" } else { "" },
        describe_transport(.source)
    )]
    Connection {
        operation: &'static str,
        timed_out: bool,
        /// The connection was established and the request (maybe) sent, then lost before an answer: a
        /// non-idempotent call (e.g. a port create) may have taken effect. See [`Error::outcome_unknown`].
        outcome_unknown: bool,
        #[source]
        source: reqwest::Error,
    },
    /// Neutron answered with a success status but a body we cannot understand.
    #[error("{operation}: cannot decode Neutron answer (status {status}, request id {}): {message}", request_id.as_deref().unwrap_or("none"))]
    Decode {
        operation: &'static str,
        status: u16,
        request_id: Option<String>,
        message: String,
    },
    /// Keystone authentication or endpoint discovery failed.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// Bad client configuration or argument.
    #[error("invalid Neutron client configuration: {0}")]
    Config(String),
    /// One request's failure, answered to each of the callers it carried (port creates sent
    /// together, see `client/coalesce.rs`); every accessor answers as for the failure itself.
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
}

impl Error {
    /// The failure itself, through any sharing.
    fn own(&self) -> &Self {
        match self {
            Self::Shared(e) => e.own(),
            e => e,
        }
    }

    pub fn api(&self) -> Option<&ApiError> {
        match self.own() {
            Self::Api(e) => Some(e),
            _ => None,
        }
    }

    pub fn kind(&self) -> Option<&ErrorKind> {
        self.api().map(|e| &e.kind)
    }

    pub fn status(&self) -> Option<u16> {
        match self.own() {
            Self::Api(e) => Some(e.status),
            Self::Decode { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn request_id(&self) -> Option<&str> {
        match self.own() {
            Self::Api(e) => e.request_id.as_deref(),
            Self::Decode { request_id, .. } => request_id.as_deref(),
            _ => None,
        }
    }

    /// How long the server asked callers to wait before trying again (`Retry-After`).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.api().and_then(|e| e.retry_after)
    }

    /// A non-idempotent call (POST, action PUT) lost its connection after the request may have reached Neutron: it is
    /// not retried by the client, and the caller must find out whether it took effect (e.g. list its ports by name
    /// or tag) before creating again, or leave the leftover to the tag-based cleanup.
    pub fn outcome_unknown(&self) -> bool {
        matches!(
            self.own(),
            Self::Connection {
                outcome_unknown: true,
                ..
            }
        )
    }

    /// True for any 404 answer (PortNotFound, TrunkNotFound, ...): "already gone" for delete paths.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    pub fn is_kind(&self, kind: &ErrorKind) -> bool {
        self.kind() == Some(kind)
    }

    /// Worth retrying later unchanged: connection problems, 5xx, 429. OverQuota and IP exhaustion are not transient:
    /// they need someone to free resources first.
    pub fn is_transient(&self) -> bool {
        match self.own() {
            Self::Connection { .. } => true,
            Self::Api(e) => e.status >= 500 || e.status == 429 || e.kind == ErrorKind::ServiceUnavailable,
            Self::Auth(e) => e.is_transient(),
            Self::Decode { .. } | Self::Config(_) | Self::Shared(_) => false,
        }
    }
}

impl From<crate::transport::TransportError> for Error {
    fn from(e: crate::transport::TransportError) -> Self {
        use crate::transport::TransportError as T;
        match e {
            T::Connection {
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
            T::Decode {
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
            T::Auth(e) => Self::Auth(e),
            T::Config(m) => Self::Config(m),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A transport error with its causes: reqwest's own message ("error sending request for url ...") hides why, e.g. which
/// certificate check failed. A failed certificate verification gets a hint naming the options that fix it.
pub(crate) fn describe_transport(e: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut bad_certificate = false;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(rustls::Error::InvalidCertificate(_)) = find_rustls(err) {
            bad_certificate = true;
        }
        let msg = err.to_string();
        if parts.last() != Some(&msg) {
            parts.push(msg);
        }
        cur = err.source();
    }
    let mut out = parts.join(": ");
    if bad_certificate {
        out.push_str(
            " (TLS certificate verification failed: set `cafile` to the CA bundle that signed the server's \
             certificate, or `insecure = True` on test clouds only)",
        );
    }
    out
}

/// The rustls error in `err`, looking through (nested) `io::Error`s, whose `source()` skips the wrapped error.
fn find_rustls<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(r) = err.downcast_ref::<rustls::Error>() {
        return Some(r);
    }
    let inner = err.downcast_ref::<std::io::Error>()?.get_ref()?;
    find_rustls(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_known_types_and_falls_back_on_status() {
        assert_eq!(ErrorKind::from_type("OverQuota", 409), ErrorKind::OverQuota);
        // Both 409: a rule that exists is done, a quota reached is not.
        assert_eq!(
            ErrorKind::from_type("SecurityGroupRuleExists", 409),
            ErrorKind::SecurityGroupRuleExists
        );
        assert_eq!(ErrorKind::from_type("HTTPBadRequest", 400), ErrorKind::BadRequest);
        assert_eq!(ErrorKind::from_type("", 503), ErrorKind::ServiceUnavailable);
        assert_eq!(ErrorKind::from_type("", 404), ErrorKind::NotFound);
        assert_eq!(ErrorKind::from_type("TagNotFound", 404), ErrorKind::TagNotFound);
        assert_eq!(
            ErrorKind::from_type("RouterInUse", 409),
            ErrorKind::Other {
                error_type: "RouterInUse".into()
            }
        );
        assert_eq!(ErrorKind::from_type("Whatever", 401), ErrorKind::Unauthorized);
    }

    #[test]
    fn transient_only_for_server_side_trouble() {
        let mk = |kind, status| {
            Error::Api(Box::new(ApiError {
                kind,
                status,
                message: String::new(),
                request_id: Some("req-1".into()),
                retry_after: None,
                operation: "op",
            }))
        };
        assert!(mk(ErrorKind::ServiceUnavailable, 503).is_transient());
        assert!(
            mk(
                ErrorKind::Other {
                    error_type: "HTTP429".into()
                },
                429
            )
            .is_transient()
        );
        assert!(!mk(ErrorKind::OverQuota, 409).is_transient());
        let e = mk(ErrorKind::PortNotFound, 404);
        assert!(e.is_not_found());
        assert_eq!(e.request_id(), Some("req-1"));
        assert!(e.to_string().contains("op: Neutron answered 404 PortNotFound"));
    }
}
