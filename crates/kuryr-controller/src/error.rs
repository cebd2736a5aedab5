//! Controller errors. Each keeps its cause as `#[source]`, says whether retrying may help and
//! whether the object's owner must see it, and doubles as a metric label and Event reason
//! ([`Error::label`]).

use std::time::Duration;

use kuryr_neutron::ErrorKind;
use kuryr_neutron::octavia::OctaviaErrorKind;

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

    /// An OpenStack API call failed. The client's typed error (Neutron's error type, status,
    /// request id, Retry-After) is the source; `context` says what the controller was doing.
    #[error("{}{source}", context.as_deref().map(|c| format!("{c}: ")).unwrap_or_default())]
    OpenStack {
        context: Option<String>,
        #[source]
        source: kuryr_neutron::Error,
    },

    /// An Octavia API call failed (or a load balancer did not reach ACTIVE in time); `context` says what the
    /// controller was doing.
    #[error("{}{source}", context.as_deref().map(|c| format!("{c}: ")).unwrap_or_default())]
    LoadBalancer {
        context: Option<String>,
        #[source]
        source: kuryr_neutron::octavia::OctaviaError,
    },

    /// OpenStack capacity ran out (quota, addresses, a trunk's VLAN ids): transient from the pod's
    /// point of view (someone may free resources) and shown to the user. `reason` is the Event
    /// reason (`OverQuota`, `VlanExhausted`, ...).
    #[error("{message}")]
    Exhausted { reason: &'static str, message: String },

    /// A value the controller itself built could not be (de)serialised: a bug, not bad input.
    #[error("cannot encode {what}: {source}")]
    Serialization {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    /// Several independent steps failed (e.g. releasing each of a pod's ports): every error is
    /// kept, none hides another.
    #[error("{} failures: {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Multiple(Vec<Error>),
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

    pub fn exhausted(reason: &'static str, message: impl Into<String>) -> Self {
        Error::Exhausted {
            reason,
            message: message.into(),
        }
    }

    pub fn serialization(what: &'static str, source: serde_json::Error) -> Self {
        Error::Serialization { what, source }
    }

    /// An OpenStack failure with what the controller was doing.
    pub fn openstack(context: impl Into<String>, source: kuryr_neutron::Error) -> Self {
        Error::OpenStack {
            context: Some(context.into()),
            source,
        }
    }

    /// An Octavia failure with what the controller was doing.
    pub fn octavia(context: impl Into<String>, source: kuryr_neutron::octavia::OctaviaError) -> Self {
        Error::LoadBalancer {
            context: Some(context.into()),
            source,
        }
    }

    /// Every error of `errors` as one: none is `Ok`, one is itself, more are [`Error::Multiple`].
    pub fn collect(mut errors: Vec<Error>) -> Result<(), Error> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Multiple(errors)),
        }
    }

    /// The Neutron error behind this one, if any.
    pub fn neutron(&self) -> Option<&kuryr_neutron::Error> {
        match self {
            Error::OpenStack { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Whether the Retry handler should try again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::ResourceNotReady(_) | Error::Exhausted { .. } => true,
            Error::Kube(e) => kube_error_is_transient(e),
            Error::OpenStack { source, .. } => {
                source.is_transient()
                    || matches!(
                        source.kind(),
                        // Capacity may be freed by someone; a 412 means "re-read and try again".
                        Some(
                            ErrorKind::OverQuota
                                | ErrorKind::IpAddressGenerationFailure
                                | ErrorKind::RevisionNumberConstraintFailed
                        )
                    )
            }
            // A load balancer that went to ERROR is replaced by the next attempt.
            Error::LoadBalancer { source, .. } => {
                source.is_transient()
                    || matches!(
                        source,
                        kuryr_neutron::octavia::OctaviaError::ProvisioningFailed { .. }
                    )
                    || matches!(
                        source.kind(),
                        Some(OctaviaErrorKind::Quota | OctaviaErrorKind::Conflict)
                    )
            }
            Error::Multiple(errors) => errors.iter().any(Error::is_retryable),
            Error::InvalidInput { .. } | Error::Gone(_) | Error::Config(_) | Error::Serialization { .. } => {
                false
            }
        }
    }

    /// Whether the user owning the object should see this failure as an Event.
    pub fn is_user_visible(&self) -> bool {
        match self {
            Error::InvalidInput { .. } | Error::Exhausted { .. } => true,
            Error::OpenStack { source, .. } => matches!(
                source.kind(),
                Some(ErrorKind::OverQuota | ErrorKind::IpAddressGenerationFailure)
            ),
            // A load balancer Octavia could not build (no room for an amphora, a provider
            // failing) is replaced at each retry; its owner sees why the Service has none.
            Error::LoadBalancer { source, .. } => {
                matches!(
                    source.kind(),
                    Some(
                        OctaviaErrorKind::Quota
                            | OctaviaErrorKind::Validation
                            | OctaviaErrorKind::UnsupportedProviderOption
                    )
                ) || matches!(
                    source,
                    kuryr_neutron::octavia::OctaviaError::ProvisioningFailed { .. }
                )
            }
            Error::Multiple(errors) => errors.iter().any(Error::is_user_visible),
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
            Error::Exhausted { reason, .. } => reason,
            Error::Serialization { .. } => "Serialization",
            // The first user-visible failure names the Event, else the first failure.
            Error::Multiple(errors) => errors
                .iter()
                .find(|e| e.is_user_visible())
                .or(errors.first())
                .map_or("Multiple", Error::label),
            Error::OpenStack { source, .. } => match source.kind() {
                Some(ErrorKind::OverQuota) => "OverQuota",
                Some(ErrorKind::IpAddressGenerationFailure) => "IpAddressGenerationFailure",
                Some(ErrorKind::PortNotFound) => "PortNotFound",
                Some(ErrorKind::DuplicateSubPort) => "DuplicateSubPort",
                Some(ErrorKind::RevisionNumberConstraintFailed) => "RevisionNumberConstraintFailed",
                Some(ErrorKind::Conflict) => "Conflict",
                Some(_) => "NeutronError",
                None if source.is_transient() => "NeutronUnreachable",
                None => "NeutronClient",
            },
            Error::LoadBalancer { source, .. } => match source.kind() {
                Some(OctaviaErrorKind::Quota) => "LoadBalancerOverQuota",
                Some(OctaviaErrorKind::Validation | OctaviaErrorKind::UnsupportedProviderOption) => {
                    "LoadBalancerRefused"
                }
                Some(_) => "OctaviaError",
                None if matches!(
                    source,
                    kuryr_neutron::octavia::OctaviaError::ProvisioningFailed { .. }
                ) =>
                {
                    "LoadBalancerError"
                }
                None if source.is_transient() => "OctaviaUnreachable",
                None => "OctaviaClient",
            },
        }
    }

    /// Neutron's `x-openstack-request-id` of the failed call, to find it in the server's log.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Error::Multiple(errors) => errors.iter().find_map(Error::request_id),
            Error::LoadBalancer { source, .. } => source.request_id(),
            _ => self.neutron().and_then(kuryr_neutron::Error::request_id),
        }
    }

    /// The server's `Retry-After`, which overrides the pipeline's own backoff.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Multiple(errors) => errors.iter().filter_map(Error::retry_after).max(),
            Error::LoadBalancer { source, .. } => source.retry_after(),
            _ => self.neutron().and_then(kuryr_neutron::Error::retry_after),
        }
    }
}

impl From<kuryr_neutron::Error> for Error {
    fn from(source: kuryr_neutron::Error) -> Self {
        Error::OpenStack {
            context: None,
            source,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn neutron(kind: &str, status: u16) -> kuryr_neutron::Error {
        kuryr_neutron::Error::Api(Box::new(kuryr_neutron::ApiError {
            kind: ErrorKind::from_type(kind, status),
            status,
            message: "m".into(),
            request_id: Some("req-1".into()),
            retry_after: (status == 503).then(|| Duration::from_secs(4)),
            operation: "create_port",
        }))
    }

    #[test]
    fn openstack_errors_keep_their_source_and_classify_by_it() {
        let e = Error::openstack("creating ports", neutron("OverQuota", 409));
        assert_eq!(e.label(), "OverQuota");
        assert!(e.is_retryable() && e.is_user_visible());
        assert_eq!(e.request_id(), Some("req-1"));
        assert!(e.to_string().starts_with("creating ports: create_port"), "{e}");
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source, Some(neutron("OverQuota", 409).to_string()));

        let e = Error::from(neutron("", 503));
        assert!(e.is_retryable() && !e.is_user_visible());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(4)));
        let e = Error::from(neutron("InvalidInput", 400));
        assert!(!e.is_retryable());
        assert_eq!(e.label(), "NeutronError");
    }

    #[test]
    fn collected_errors_keep_every_failure() {
        assert!(Error::collect(vec![]).is_ok());
        let one = Error::collect(vec![Error::not_ready("a")]).unwrap_err();
        assert!(matches!(one, Error::ResourceNotReady(_)));
        let many = Error::collect(vec![
            Error::Config("x".into()),
            Error::from(neutron("OverQuota", 409)),
        ])
        .unwrap_err();
        let text = many.to_string();
        assert!(
            text.starts_with("2 failures") && text.contains("configuration: x"),
            "{text}"
        );
        assert!(many.is_retryable(), "one of them may succeed on retry");
        assert_eq!(many.label(), "OverQuota", "the user-visible one names the Event");
        assert_eq!(many.request_id(), Some("req-1"));
    }
}
