//! Errors rendered the way Octavia's WSME/pecan layer renders them:
//! `{"faultcode": "Client"|"Server", "faultstring": "...", "debuginfo": null}`; `Client` for 4xx, `Server` for 5xx.

use serde_json::{Value, json};

/// An API error: HTTP status plus Octavia's `faultstring`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub faultstring: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.faultstring)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    pub fn new(status: u16, faultstring: impl Into<String>) -> Self {
        Self {
            status,
            faultstring: faultstring.into(),
        }
    }

    pub fn body(&self) -> Value {
        let code = if self.status >= 500 { "Server" } else { "Client" };
        json!({"faultcode": code, "faultstring": self.faultstring, "debuginfo": null})
    }

    /// `NotFound`: resource names are the data models' human names ("Load Balancer", "Health Monitor").
    pub fn not_found(resource: &str, id: &str) -> Self {
        Self::new(404, format!("{resource} {id} not found."))
    }

    /// `ValidationException`.
    pub fn validation(detail: impl std::fmt::Display) -> Self {
        Self::new(400, format!("Validation failure: {detail}"))
    }

    /// WSME's `InvalidInput` for a body attribute.
    pub fn invalid_input(field: &str, value: impl std::fmt::Display, msg: &str) -> Self {
        Self::new(
            400,
            format!("Invalid input for field/attribute {field}. Value: '{value}'. {msg}"),
        )
    }

    /// WSME's `UnknownAttribute`.
    pub fn unknown_attribute(argument: &str, attrs: &[String]) -> Self {
        Self::new(
            400,
            format!("Unknown attribute for argument {argument}: {}", attrs.join(", ")),
        )
    }

    /// `ImmutableObject`: a child write while the load balancer (or pool) is not ACTIVE.
    pub fn immutable(resource: &str, id: &str) -> Self {
        Self::new(
            409,
            format!("{resource} {id} is immutable and cannot be updated."),
        )
    }

    /// `LBPendingStateError`: an update or delete of the load balancer itself while it is not ACTIVE.
    pub fn lb_pending(state: &str, id: &str) -> Self {
        Self::new(
            409,
            format!("Invalid state {state} of loadbalancer resource {id}"),
        )
    }

    /// `QuotaException`.
    pub fn quota(resource: &str) -> Self {
        Self::new(403, format!("Quota has been met for resources: {resource}"))
    }

    /// `ProviderUnsupportedOptionError`: what Octavia makes of a driver's `UnsupportedOptionError`.
    pub fn provider_unsupported(provider: &str, msg: &str) -> Self {
        Self::new(
            501,
            format!("Provider '{provider}' does not support a requested option: {msg}"),
        )
    }

    /// pecan's answer to a path no controller serves.
    pub fn path_not_found() -> Self {
        Self::new(404, "The resource could not be found.")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(405, "The method specified is not allowed for this resource.")
    }

    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(500, msg)
    }
}
