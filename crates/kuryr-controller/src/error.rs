//! Controller errors. Variants double as metric labels (`Error::label`).

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Something the handler needs is not there yet (a VIF not active, a subnet not created, a pool
    /// being refilled). Always retried.
    #[error("resource not ready: {0}")]
    ResourceNotReady(String),

    /// The user gave us something we cannot act on (malformed annotation, unknown network). Never
    /// retried: it is reported as an Event on the object.
    #[error("invalid {field}: {message}")]
    InvalidInput { field: String, message: String },

    /// A Kubernetes API call failed.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),

    /// The object we were handling is gone; nothing left to do.
    #[error("{0} is gone")]
    Gone(String),

    /// Configuration forbids what is being asked (unknown driver, missing option).
    #[error("configuration: {0}")]
    Config(String),

    /// A wrapped error from an OpenStack client or a driver, with whether retrying may help and the
    /// Neutron request id when there was one.
    #[error("{message}")]
    OpenStack {
        message: String,
        kind: &'static str,
        transient: bool,
        user_visible: bool,
        request_id: Option<String>,
        retry_after: Option<Duration>,
    },
}

impl Error {
    pub fn not_ready(msg: impl Into<String>) -> Self {
        Error::ResourceNotReady(msg.into())
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidInput {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Whether the Retry handler should try again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::ResourceNotReady(_) => true,
            Error::Kube(e) => kube_error_is_transient(e),
            Error::OpenStack { transient, .. } => *transient,
            Error::InvalidInput { .. } | Error::Gone(_) | Error::Config(_) => false,
        }
    }

    /// Whether the user owning the object should see this failure as an Event.
    pub fn is_user_visible(&self) -> bool {
        match self {
            Error::InvalidInput { .. } => true,
            Error::OpenStack { user_visible, .. } => *user_visible,
            _ => false,
        }
    }

    /// Short, stable label for metrics and Event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Error::ResourceNotReady(_) => "ResourceNotReady",
            Error::InvalidInput { .. } => "InvalidInput",
            Error::Kube(_) => "Kubernetes",
            Error::Gone(_) => "Gone",
            Error::Config(_) => "Config",
            Error::OpenStack { kind, .. } => kind,
        }
    }

    pub fn request_id(&self) -> Option<&str> {
        match self {
            Error::OpenStack { request_id, .. } => request_id.as_deref(),
            _ => None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::OpenStack { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// 409 conflicts, 429, 5xx and transport errors are worth retrying; 4xx validation errors are not.
fn kube_error_is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => {
            let code = status.code;
            code == 409 || code == 429 || code >= 500
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_) => true,
        _ => false,
    }
}

/// Whether a kube error is a 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
