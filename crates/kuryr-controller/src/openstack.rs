//! One Neutron client per OpenStack deployment (seed 001), built from `[neutron]` and the
//! `[deployment:<name>]` sections, plus the mapping of client errors onto pipeline errors.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kuryr_config::{KuryrConfig, NeutronAuthSection};
use kuryr_neutron::{
    AuthOptions, AuthType, CallRecord, ClientOptions, ErrorKind, Interface, NeutronClient, Secret,
};

use crate::error::Error;
use crate::metrics::Metrics;

pub const DEFAULT_DEPLOYMENT: &str = "default";

/// The Neutron clients of every configured deployment.
#[derive(Clone)]
pub struct Deployments {
    clients: Arc<BTreeMap<String, NeutronClient>>,
}

impl Deployments {
    /// Builds a client per deployment; calls are reported to `metrics`.
    pub fn from_config(config: &KuryrConfig, metrics: &Metrics) -> Result<Self, Error> {
        let mut clients = BTreeMap::new();
        for (name, section) in config.deployments() {
            let opts = client_options(section);
            let m = metrics.clone();
            let client = NeutronClient::with_metrics(
                &opts,
                Arc::new(move |c: &CallRecord<'_>| {
                    m.neutron_call(c.operation, c.outcome.as_str(), c.latency)
                }),
            )
            .map_err(|e| Error::Config(format!("deployment {name}: {e}")))?;
            clients.insert(name.to_string(), client);
        }
        Ok(Self {
            clients: Arc::new(clients),
        })
    }

    /// One `noauth` deployment at `url` (a test or sandbox Neutron), reporting into `metrics`.
    pub fn noauth(url: &str, metrics: &Metrics) -> Result<Self, Error> {
        let client = NeutronClient::with_metrics(&ClientOptions::noauth(url), metrics_hook(metrics))
            .map_err(|e| Error::Config(format!("Neutron at {url}: {e}")))?;
        Ok(Self::single(client))
    }

    /// For tests and the sandbox: one deployment with an explicit client.
    pub fn single(client: NeutronClient) -> Self {
        Self {
            clients: Arc::new(BTreeMap::from([(DEFAULT_DEPLOYMENT.to_string(), client)])),
        }
    }

    pub fn client(&self, deployment: &str) -> Result<&NeutronClient, Error> {
        self.clients
            .get(deployment)
            .ok_or_else(|| Error::Config(format!("unknown OpenStack deployment {deployment:?}")))
    }

    pub fn default_client(&self) -> Result<&NeutronClient, Error> {
        self.client(DEFAULT_DEPLOYMENT)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.clients.keys().map(String::as_str)
    }
}

/// Reports every Neutron call into the controller's Prometheus metrics.
pub fn metrics_hook(metrics: &Metrics) -> Arc<dyn kuryr_neutron::Metrics> {
    let m = metrics.clone();
    Arc::new(move |c: &CallRecord<'_>| m.neutron_call(c.operation, c.outcome.as_str(), c.latency))
}

/// Maps a `kuryr.conf` keystoneauth section onto the client's options.
pub fn client_options(s: &NeutronAuthSection) -> ClientOptions {
    if let Some(cloud) = &s.cloud
        && let Ok(mut from_yaml) = ClientOptions::from_clouds_yaml(Some(cloud))
    {
        if s.endpoint_override.is_some() {
            from_yaml.endpoint_override = s.endpoint_override.clone();
        }
        return from_yaml;
    }
    let auth_type = match s.auth_type.map(|t| t.as_str()) {
        Some("v3applicationcredential" | "applicationcredential" | "application_credential") => {
            AuthType::ApplicationCredential
        }
        Some("password" | "v3password") => AuthType::Password,
        // No plugin (or noauth/none): unauthenticated requests to endpoint_override.
        _ => AuthType::NoAuth,
    };
    let interface = match s.effective_interface().as_str() {
        "internal" => Interface::Internal,
        "admin" => Interface::Admin,
        _ => Interface::Public,
    };
    ClientOptions {
        auth: AuthOptions {
            auth_type,
            auth_url: s.auth_url.clone(),
            username: s.username.clone(),
            user_id: s.user_id.clone(),
            password: s.password.as_ref().map(|p| Secret::new(p.expose())),
            user_domain_name: s
                .user_domain_name
                .clone()
                .or_else(|| s.default_domain_name.clone()),
            user_domain_id: s.user_domain_id.clone().or_else(|| s.default_domain_id.clone()),
            project_name: s.project_name.clone(),
            project_id: s.project_id.clone(),
            project_domain_name: s
                .project_domain_name
                .clone()
                .or_else(|| s.default_domain_name.clone()),
            project_domain_id: s
                .project_domain_id
                .clone()
                .or_else(|| s.default_domain_id.clone()),
            application_credential_id: s.application_credential_id.clone(),
            application_credential_name: s.application_credential_name.clone(),
            application_credential_secret: s
                .application_credential_secret
                .as_ref()
                .map(|p| Secret::new(p.expose())),
        },
        region_name: s.region_name.clone(),
        interface,
        cafile: s.cafile.clone().map(Into::into),
        insecure: s.insecure,
        endpoint_override: s.endpoint_override.clone(),
        timeout: s
            .timeout
            .map(Duration::from_secs)
            .or(Some(Duration::from_secs(60))),
        ..ClientOptions::default()
    }
}

impl From<kuryr_neutron::Error> for Error {
    fn from(e: kuryr_neutron::Error) -> Self {
        let kind = match e.kind() {
            Some(ErrorKind::OverQuota) => "OverQuota",
            Some(ErrorKind::IpAddressGenerationFailure) => "IpAddressGenerationFailure",
            Some(ErrorKind::PortNotFound) => "PortNotFound",
            Some(ErrorKind::DuplicateSubPort) => "DuplicateSubPort",
            Some(ErrorKind::RevisionNumberConstraintFailed) => "RevisionNumberConstraintFailed",
            Some(ErrorKind::Conflict) => "Conflict",
            Some(_) => "NeutronError",
            None if e.is_transient() => "NeutronUnreachable",
            None => "NeutronClient",
        };
        // Exhausted quotas or addresses are transient from the pod's point of view (someone may free
        // resources) and the user must see them; a 412 just means "re-read and try again".
        let capacity = matches!(kind, "OverQuota" | "IpAddressGenerationFailure");
        let transient = e.is_transient() || capacity || kind == "RevisionNumberConstraintFailed";
        Error::OpenStack {
            message: e.to_string(),
            kind,
            transient,
            user_visible: capacity,
            request_id: e.request_id().map(str::to_string),
            retry_after: None,
        }
    }
}
