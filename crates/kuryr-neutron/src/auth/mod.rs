//! Authentication: Keystone v3 (password, application credential), `noauth`, `clouds.yaml`.
//!
//! Option names follow keystoneauth so that `kuryr.conf` `[neutron]` sections map one to one.

mod clouds;
mod keystone;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

pub use clouds::{
    CloudsYamlError, clouds_yaml_search_paths, display_paths, load_cloud, load_cloud_from, load_cloud_in,
};
pub(crate) use keystone::Authenticator;

/// Passwords, tokens and application credential secrets: kuryr-config's type, so an option
/// goes from `kuryr.conf` to Keystone without being copied into another wrapper.
pub use kuryr_config::Secret;

/// keystoneauth `auth_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum AuthType {
    #[default]
    #[serde(alias = "password", alias = "v3password")]
    Password,
    #[serde(
        alias = "v3applicationcredential",
        alias = "applicationcredential",
        alias = "application_credential"
    )]
    ApplicationCredential,
    /// No Keystone: every request goes to `endpoint_override` without a token.
    #[serde(alias = "noauth", alias = "none")]
    NoAuth,
}

impl AuthType {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "password" | "v3password" | "Password" => Some(Self::Password),
            "v3applicationcredential" | "applicationcredential" | "application_credential" => {
                Some(Self::ApplicationCredential)
            }
            "noauth" | "none" | "NoAuth" => Some(Self::NoAuth),
            _ => None,
        }
    }
}

/// Catalog endpoint interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum Interface {
    #[default]
    #[serde(alias = "public", alias = "publicURL")]
    Public,
    #[serde(alias = "internal", alias = "internalURL")]
    Internal,
    #[serde(alias = "admin", alias = "adminURL")]
    Admin,
}

impl Interface {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "public" | "publicURL" | "Public" => Some(Self::Public),
            "internal" | "internalURL" | "Internal" => Some(Self::Internal),
            "admin" | "adminURL" | "Admin" => Some(Self::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Internal => "internal",
            Self::Admin => "admin",
        }
    }
}

/// Credentials (keystoneauth option names).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct AuthOptions {
    pub auth_type: AuthType,
    pub auth_url: Option<String>,
    pub username: Option<String>,
    pub user_id: Option<String>,
    pub password: Option<Secret>,
    pub user_domain_name: Option<String>,
    pub user_domain_id: Option<String>,
    pub project_name: Option<String>,
    pub project_id: Option<String>,
    pub project_domain_name: Option<String>,
    pub project_domain_id: Option<String>,
    pub application_credential_id: Option<String>,
    pub application_credential_name: Option<String>,
    pub application_credential_secret: Option<Secret>,
}

/// Everything needed to build a [`crate::NeutronClient`].
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct ClientOptions {
    #[serde(flatten)]
    pub auth: AuthOptions,
    pub region_name: Option<String>,
    /// Catalog interface; keystoneauth calls it `interface` (`valid_interfaces` in oslo.config is mapped here).
    #[serde(alias = "valid_interfaces")]
    pub interface: Interface,
    /// PEM bundle trusted in addition to the platform roots.
    #[serde(alias = "cacert")]
    pub cafile: Option<PathBuf>,
    /// Client certificate (PEM) for servers that ask for one (keystoneauth's `certfile`,
    /// openstacksdk's `cert`); its key in `keyfile`, or in the same file.
    #[serde(alias = "cert")]
    pub certfile: Option<PathBuf>,
    /// The client certificate's private key (PEM; keystoneauth's `keyfile`, openstacksdk's `key`).
    #[serde(alias = "key")]
    pub keyfile: Option<PathBuf>,
    /// Skip TLS certificate verification (test clouds only).
    pub insecure: bool,
    /// Neutron endpoint used instead of the catalog's; mandatory with `noauth`.
    pub endpoint_override: Option<String>,
    /// Per-request timeout in seconds.
    #[serde(deserialize_with = "de_opt_secs")]
    pub timeout: Option<Duration>,
    /// Cap on concurrent in-flight requests to Neutron.
    pub max_concurrent_requests: usize,
    /// Attempts for a retryable call (1 = no retry).
    pub max_attempts: u32,
    /// First backoff delay; doubles per attempt, with full jitter.
    #[serde(deserialize_with = "de_secs")]
    pub retry_base_delay: Duration,
    /// Backoff ceiling, also the ceiling for a server's Retry-After.
    #[serde(deserialize_with = "de_secs")]
    pub retry_max_delay: Duration,
    /// Keep idle HTTP connections for reuse. Off by default: neutron-server under uWSGI closes every connection
    /// after the answer, and a pooled connection then fails with a reset on the next request.
    pub connection_reuse: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            auth: AuthOptions::default(),
            region_name: None,
            interface: Interface::Public,
            cafile: None,
            certfile: None,
            keyfile: None,
            insecure: false,
            endpoint_override: None,
            timeout: Some(Duration::from_secs(60)),
            max_concurrent_requests: 20,
            max_attempts: 4,
            retry_base_delay: Duration::from_millis(200),
            retry_max_delay: Duration::from_secs(10),
            connection_reuse: false,
        }
    }
}

impl ClientOptions {
    /// `noauth` against an explicit endpoint, e.g. `http://127.0.0.1:9696`.
    pub fn noauth(endpoint: impl Into<String>) -> Self {
        Self {
            auth: AuthOptions {
                auth_type: AuthType::NoAuth,
                ..AuthOptions::default()
            },
            endpoint_override: Some(endpoint.into()),
            ..Self::default()
        }
    }

    /// Options of cloud `name` (or `$OS_CLOUD`) from the first `clouds.yaml` found; see [`load_cloud`].
    pub fn from_clouds_yaml(name: Option<&str>) -> Result<Self, CloudsYamlError> {
        load_cloud(name)
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Secs {
    Num(f64),
    Text(String),
}

fn secs_to_duration<E: serde::de::Error>(v: Secs) -> Result<Duration, E> {
    let n = match v {
        Secs::Num(n) => n,
        Secs::Text(s) => s
            .trim()
            .parse::<f64>()
            .map_err(|_| E::custom(format!("expected a number of seconds, got {s:?}")))?,
    };
    Duration::try_from_secs_f64(n).map_err(|_| E::custom(format!("invalid number of seconds {n}")))
}

fn de_secs<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    secs_to_duration(Secs::deserialize(d)?)
}

fn de_opt_secs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    Option::<Secs>::deserialize(d)?.map(secs_to_duration).transpose()
}

/// Authentication failures.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("auth option `{0}` is required for auth_type {1:?}")]
    MissingOption(&'static str, AuthType),
    #[error("invalid auth option `{option}`: {message}")]
    InvalidOption { option: &'static str, message: String },
    #[error("Keystone refused authentication ({status}): {message}")]
    Rejected { status: u16, message: String },
    #[error("cannot reach Keystone at {url}: {}", crate::error::describe_transport(.source))]
    Connection {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("unexpected Keystone answer: {0}")]
    InvalidResponse(String),
    #[error(
        "no {service_type} endpoint for interface {interface} in region {region} in the Keystone catalog"
    )]
    NoEndpoint {
        service_type: &'static str,
        interface: &'static str,
        region: String,
    },
}

impl AuthError {
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connection { .. } => true,
            Self::Rejected { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_redacted() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!format!("{s}").contains("hunter2"));
        let opts = AuthOptions {
            password: Some(s),
            application_credential_secret: Some(Secret::new("appsecret")),
            ..AuthOptions::default()
        };
        let dbg = format!("{opts:?}");
        assert!(!dbg.contains("hunter2") && !dbg.contains("appsecret"), "{dbg}");
    }

    #[test]
    fn client_options_deserialize_keystoneauth_names() {
        let o: ClientOptions = serde_json::from_value(serde_json::json!({
            "auth_type": "v3applicationcredential",
            "auth_url": "https://ks/v3",
            "application_credential_id": "ac",
            "application_credential_secret": "s",
            "region_name": "R2",
            "valid_interfaces": "internal",
            "timeout": "7.5",
            "insecure": true,
        }))
        .expect("valid options");
        assert_eq!(o.auth.auth_type, AuthType::ApplicationCredential);
        assert_eq!(o.interface, Interface::Internal);
        assert_eq!(o.timeout, Some(Duration::from_millis(7500)));
        assert_eq!(o.region_name.as_deref(), Some("R2"));
        assert!(o.insecure);
        assert_eq!(o.max_concurrent_requests, 20);
        let bad = serde_json::from_value::<ClientOptions>(serde_json::json!({"timeout": "soon"}));
        assert!(bad.is_err());
    }
}
