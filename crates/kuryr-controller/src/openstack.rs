//! One OpenStack client set (Neutron, and Octavia for the Service handlers) per deployment, built from
//! `[neutron]` and the `[deployment:<name>]` sections.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kuryr_config::{DEPLOYMENT_SECTION_PREFIX, KuryrConfig, NeutronAuthSection};
use kuryr_neutron::auth::{CloudsYamlError, clouds_yaml_search_paths, display_paths, load_cloud_in};
use kuryr_neutron::octavia::OctaviaClient;
use kuryr_neutron::{AuthOptions, AuthType, CallRecord, ClientOptions, Interface, NeutronClient, Secret};

use crate::error::Error;
use crate::metrics::Metrics;

pub const DEFAULT_DEPLOYMENT: &str = "default";

/// The OpenStack clients of every configured deployment.
#[derive(Clone)]
pub struct Deployments {
    clients: Arc<BTreeMap<String, NeutronClient>>,
    /// Octavia per deployment, or why there is none (e.g. `noauth` without an Octavia URL): only the Service
    /// handlers need it, so a deployment without one fails there, naming the option, not at start-up.
    octavia: Arc<BTreeMap<String, Result<OctaviaClient, String>>>,
    /// The deployments where this cluster's `cluster_id` claim is the earliest (see
    /// `cluster_claim`): only there may resources be adopted by their cluster tag, and swept
    /// only where it is not contested either (`true`).
    claimed: Arc<std::sync::RwLock<BTreeMap<String, bool>>>,
}

impl Deployments {
    /// Builds a client per deployment; calls are reported to `metrics`.
    pub fn from_config(config: &KuryrConfig, metrics: &Metrics) -> Result<Self, Error> {
        let mut clients = BTreeMap::new();
        let mut octavia = BTreeMap::new();
        for (name, section) in config.deployments() {
            let opts = client_options(&section_name(name), section)?;
            let client = NeutronClient::with_metrics(&opts, metrics_hook(metrics))
                .map_err(|e| Error::Config(format!("deployment {name}: {e}")))?;
            clients.insert(name.to_string(), client);
            octavia.insert(
                name.to_string(),
                octavia_client(&section_name(name), section, opts, metrics),
            );
        }
        Ok(Self {
            clients: Arc::new(clients),
            octavia: Arc::new(octavia),
            claimed: Arc::default(),
        })
    }

    /// Adds (or replaces) the Octavia client of `deployment` (tests and the sandbox).
    pub fn with_octavia(mut self, deployment: &str, client: OctaviaClient) -> Self {
        let mut map = (*self.octavia).clone();
        map.insert(deployment.to_string(), Ok(client.without_busy_retry()));
        self.octavia = Arc::new(map);
        self
    }

    /// The Octavia client of `deployment`.
    pub fn octavia(&self, deployment: &str) -> Result<&OctaviaClient, Error> {
        match self.octavia.get(deployment) {
            Some(Ok(c)) => Ok(c),
            Some(Err(why)) => Err(Error::Config(why.clone())),
            None => Err(Error::Config(format!(
                "no Octavia client for OpenStack deployment {deployment:?}"
            ))),
        }
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
            octavia: Arc::new(BTreeMap::from([(
                DEFAULT_DEPLOYMENT.to_string(),
                Err("no Octavia is configured for this deployment".to_string()),
            )])),
            claimed: Arc::default(),
        }
    }

    pub fn client(&self, deployment: &str) -> Result<&NeutronClient, Error> {
        self.clients
            .get(deployment)
            .ok_or_else(|| Error::Config(format!("unknown OpenStack deployment {deployment:?}")))
    }

    /// [`NeutronClient::ports_per_request`] of `deployment`'s client (no limit for an unknown
    /// one: its create fails on its own).
    pub fn ports_per_request(&self, deployment: &str) -> usize {
        self.clients
            .get(deployment)
            .map_or(usize::MAX, NeutronClient::ports_per_request)
    }

    pub fn default_client(&self) -> Result<&NeutronClient, Error> {
        self.client(DEFAULT_DEPLOYMENT)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.clients.keys().map(String::as_str)
    }

    /// The deployments where this cluster's `cluster_id` is confirmed as its own: what sweeps
    /// by cluster tag may act in.
    pub fn claimed_names(&self) -> Vec<String> {
        let claimed = self.claims();
        self.names()
            .filter(|d| claimed.get(*d) == Some(&true))
            .map(str::to_string)
            .collect()
    }

    fn claims(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, bool>> {
        self.claimed
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the claim of `deployment` is confirmed and uncontested: what sweeps by cluster
    /// tag wait for.
    pub fn is_claimed(&self, deployment: &str) -> bool {
        self.claims().get(deployment) == Some(&true)
    }

    /// `Ok` where a resource found by this cluster's tags (not by what Kubernetes records of it)
    /// may be adopted: where this cluster's cluster_id claim is confirmed the earliest, contested
    /// or not (a later claim that stays is another scope's, which the sweeps avoid; the earlier
    /// cluster goes on). Before that the tag could be another cluster's, left at the same
    /// cluster_id: not ready (retried with backoff) until then. What a handler creates itself
    /// needs no claim.
    pub fn adoptable(&self, deployment: &str, what: impl FnOnce() -> String) -> Result<(), Error> {
        if self.claims().contains_key(deployment) {
            return Ok(());
        }
        Err(Error::not_ready(format!(
            "{} found by the cluster tag in deployment {deployment}: adopted once the cluster_id claim there is \
             confirmed",
            what()
        )))
    }

    /// Whether every deployment's claim is the earliest, contested or not: nothing waits for a
    /// claim check to adopt.
    pub fn all_adoptable(&self) -> bool {
        let claims = self.claims();
        self.names().all(|d| claims.contains_key(d))
    }

    /// Records the outcome of a claim check of `deployment` (see `cluster_claim`; tests that
    /// drive sweeps without a controller mark their deployments themselves).
    pub fn set_claimed(&self, deployment: &str, claimed: bool) {
        let mut map = self
            .claimed
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match claimed {
            true => map.insert(deployment.to_string(), true),
            false => map.remove(deployment),
        };
    }

    /// Records that this cluster's claim of `deployment` is the earliest but another cluster's
    /// later one stays: adoption goes on, sweeps stop.
    pub fn set_contested(&self, deployment: &str) {
        self.claimed
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(deployment.to_string(), false);
    }
}

/// Reports every Neutron call into the controller's Prometheus metrics.
pub fn metrics_hook(metrics: &Metrics) -> Arc<dyn kuryr_neutron::Metrics> {
    let m = metrics.clone();
    Arc::new(move |c: &CallRecord<'_>| m.neutron_call(c.operation, c.outcome.as_str(), c.latency))
}

/// Octavia shares the deployment's Keystone session options; only the endpoint differs (the catalog's
/// `load-balancer`, or `load_balancer_endpoint_override`).
fn octavia_client(
    section: &str,
    s: &NeutronAuthSection,
    mut opts: ClientOptions,
    metrics: &Metrics,
) -> Result<OctaviaClient, String> {
    opts.endpoint_override = s.load_balancer_endpoint_override.clone();
    if opts.auth.auth_type == AuthType::NoAuth && opts.endpoint_override.is_none() {
        return Err(format!(
            "[{section}] load_balancer_endpoint_override is required for the Service handlers: without \
             Keystone there is no catalog to find Octavia in"
        ));
    }
    // A busy load balancer is waited for by the Service handlers' shared waits, not per write.
    OctaviaClient::with_metrics(&opts, octavia_metrics_hook(metrics))
        .map(OctaviaClient::without_busy_retry)
        .map_err(|e| format!("[{section}] Octavia client: {e}"))
}

/// Reports every Octavia call into the controller's Prometheus metrics.
pub fn octavia_metrics_hook(metrics: &Metrics) -> Arc<dyn kuryr_neutron::Metrics> {
    let m = metrics.clone();
    Arc::new(move |c: &CallRecord<'_>| m.octavia_call(c.operation, c.outcome.as_str(), c.latency))
}

/// The `kuryr.conf` section of deployment `name`, as error messages name it.
fn section_name(name: &str) -> String {
    if name == DEFAULT_DEPLOYMENT {
        "neutron".to_owned()
    } else {
        format!("{DEPLOYMENT_SECTION_PREFIX}{name}")
    }
}

/// Maps a `kuryr.conf` keystoneauth section (`section` names it in errors) onto the client's options. A `cloud`
/// that cannot be loaded is an error: falling back to other options would start without the intended credentials.
pub fn client_options(section: &str, s: &NeutronAuthSection) -> Result<ClientOptions, Error> {
    client_options_searching(section, s, &clouds_yaml_search_paths())
}

fn client_options_searching(
    section: &str,
    s: &NeutronAuthSection,
    clouds_yaml: &[PathBuf],
) -> Result<ClientOptions, Error> {
    if let Some(cloud) = &s.cloud {
        let mut from_yaml = load_cloud_in(clouds_yaml, Some(cloud)).map_err(|e| {
            let searched = match &e {
                // Already lists the paths.
                CloudsYamlError::NotFound { .. } => String::new(),
                _ => format!(
                    "; clouds.yaml is searched in {} and the first one found is used",
                    display_paths(clouds_yaml)
                ),
            };
            Error::Config(format!(
                "[{section}] cloud = {cloud:?} cannot be loaded: {e}{searched}"
            ))
        })?;
        if let Some(endpoint) = s.neutron_endpoint() {
            from_yaml.endpoint_override = Some(endpoint.to_string());
        }
        return Ok(from_yaml);
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
    Ok(ClientOptions {
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
        certfile: s.certfile.clone().map(Into::into),
        keyfile: s.keyfile.clone().map(Into::into),
        insecure: s.insecure,
        endpoint_override: s.neutron_endpoint().map(str::to_string),
        timeout: s
            .timeout
            .map(Duration::from_secs)
            .or(Some(Duration::from_secs(60))),
        ..ClientOptions::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> KuryrConfig {
        KuryrConfig::from_ini_str(text)
            .unwrap_or_else(|e| panic!("config: {e}"))
            .config
    }

    /// A fresh directory under the system temp dir (this crate has no tempfile dev-dependency).
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(test: &str) -> Self {
            let p = std::env::temp_dir().join(format!("kuryr-openstack-{test}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            Self(p)
        }

        fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn yaml(dir: &std::path::Path) -> PathBuf {
        let p = dir.join("clouds.yaml");
        std::fs::write(
            &p,
            "clouds:\n  lab:\n    auth_type: none\n    auth:\n      endpoint: http://127.0.0.1:9696\n",
        )
        .unwrap_or_else(|e| panic!("write: {e}"));
        p
    }

    #[test]
    fn cloud_that_cannot_be_loaded_is_a_start_up_error() {
        let dir = TempDir::new("unloadable");
        let env_file = dir.path().join("env/clouds.yaml");
        let etc = dir.path().join("etc/clouds.yaml");
        let c = config("[neutron]\nauth_type = password\ncloud = prod\n");

        // No clouds.yaml anywhere: the error names the option, the cloud and every path searched.
        let e = client_options_searching("neutron", &c.neutron, &[env_file.clone(), etc.clone()])
            .expect_err("no clouds.yaml");
        let msg = e.to_string();
        for want in ["[neutron] cloud", "\"prod\"", "OS_CLIENT_CONFIG_FILE"] {
            assert!(msg.contains(want), "{want:?} missing in {msg}");
        }
        for p in [&env_file, &etc] {
            assert!(
                msg.contains(&p.display().to_string()),
                "{} missing in {msg}",
                p.display()
            );
        }

        // A clouds.yaml without that cloud: same, plus the file that was read.
        let found = yaml(dir.path());
        let e = client_options_searching("neutron", &c.neutron, &[env_file.clone(), found.clone()])
            .expect_err("unknown cloud");
        let msg = e.to_string();
        for want in ["[neutron] cloud", "\"prod\"", "lab"] {
            assert!(msg.contains(want), "{want:?} missing in {msg}");
        }
        for p in [&env_file, &found] {
            assert!(
                msg.contains(&p.display().to_string()),
                "{} missing in {msg}",
                p.display()
            );
        }

        // Deployments::from_config, called at start-up, reports it (through the real search paths, which
        // hold no cloud of this name).
        let c = config("[neutron]\ncloud = kuryr-test-no-such-cloud\n");
        let e = Deployments::from_config(&c, &Metrics::new())
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("[neutron] cloud = \"kuryr-test-no-such-cloud\"")),
            "{e:?}"
        );
    }

    #[test]
    fn upstream_none_plugin_endpoint_is_the_neutron_url() {
        let c = config("[neutron]\nauth_type = none\nendpoint = http://127.0.0.1:9696\n");
        let o = client_options("neutron", c.deployments()[0].1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.auth.auth_type, AuthType::NoAuth);
        assert_eq!(o.endpoint_override.as_deref(), Some("http://127.0.0.1:9696"));
        let both = config(
            "[neutron]\nauth_type = none\nendpoint = http://a:9696\nendpoint_override = http://b:9696\n",
        );
        let o = client_options("neutron", both.deployments()[0].1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.endpoint_override.as_deref(), Some("http://b:9696"));
    }

    #[test]
    fn cloud_is_loaded_and_endpoint_override_wins() {
        let dir = TempDir::new("loaded");
        let found = yaml(dir.path());
        let c =
            config("[neutron]\n[deployment:east]\ncloud = lab\nendpoint_override = http://10.0.0.1:9696\n");
        let (name, section) = c.deployments()[1];
        assert_eq!(name, "east");
        let o = client_options_searching(&section_name(name), section, &[found])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.auth.auth_type, AuthType::NoAuth);
        assert_eq!(o.endpoint_override.as_deref(), Some("http://10.0.0.1:9696"));
        let e = client_options_searching(&section_name(name), section, &[dir.path().join("none.yaml")])
            .expect_err("missing");
        assert!(e.to_string().contains("[deployment:east] cloud = \"lab\""), "{e}");
    }
}
