//! `kuryr.conf` loader, compatible with upstream kuryr-kubernetes' oslo.config files.
//!
//! Two layers:
//! - [`ini`]: the raw INI document (parse, merge several files, `[DEFAULT]` fallback);
//!   reusable for any oslo.config-style file.
//! - [`KuryrConfig`]: one typed struct per section with upstream option names and defaults
//!   (see [`sections`]).
//!
//! Precedence, lowest to highest: defaults, `[DEFAULT]`, the section itself, later
//! `--config-file`s, then environment variables `KURYR__<SECTION>__<OPTION>=value`
//! (`KURYR__DEPLOYMENT__<NAME>__<OPTION>` for `[deployment:<name>]`).
//!
//! Unknown sections and options are warnings (returned and logged), bad values are errors
//! naming section, option and value.
//!
//! ```
//! let loaded = kuryr_config::KuryrConfig::from_ini_str("[vif_pool]\nports_pool_batch = 4\n")?;
//! assert_eq!(loaded.config.vif_pool.ports_pool_batch.get(), 4);
//! assert_eq!(loaded.config.vif_pool.ports_pool_min, 5);
//! # Ok::<(), kuryr_config::ConfigError>(())
//! ```

pub mod error;
pub mod ini;
pub mod sections;
pub mod sriov;
pub mod value;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;

pub use error::{ConfigError, InvalidValue, MissingOption, Warning};
pub use ini::{DEFAULT_SECTION, Ini, IniValue, Origin};
pub use sections::*;
pub use sriov::{OPAQUE_RESOURCE_PREFIX, PhysicalDeviceMappings};
pub use value::{OptionValue, ScalarValue, Secret};

/// Prefix of the section name of extra OpenStack deployments: `[deployment:<name>]`.
pub const DEPLOYMENT_SECTION_PREFIX: &str = "deployment:";
/// Name of the deployment configured in `[neutron]`.
pub const DEFAULT_DEPLOYMENT: &str = "default";
/// Prefix of environment overrides.
pub const ENV_PREFIX: &str = "KURYR__";

/// The whole configuration with its warnings.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub config: KuryrConfig,
    pub warnings: Vec<Warning>,
}

/// Declares `KuryrConfig` from (field, section type, section name) triples, so the list of
/// known sections, the struct and the reader cannot drift apart.
macro_rules! kuryr_config {
    ($( $(#[$meta:meta])* $field:ident : $ty:ident = $section:literal ),+ $(,)?) => {
        /// Typed `kuryr.conf`. `Default` gives upstream's defaults.
        #[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
        pub struct KuryrConfig {
            $( $(#[$meta])* pub $field: $ty, )+
            /// `[deployment:<name>]` sections in declaration order (see
            /// `docs/architecture.md#several-openstack-deployments`); see
            /// [`KuryrConfig::deployments`] for all deployments including `[neutron]`.
            pub extra_deployments: Vec<(String, NeutronAuthSection)>,
        }

        /// Every fixed section with its option names.
        pub const KNOWN_SECTIONS: &[(&str, &[&str])] = &[ $( ($section, $ty::OPTIONS) ),+ ];

        fn read_fixed_sections(ini: &Ini, errors: &mut Vec<InvalidValue>) -> KuryrConfig {
            KuryrConfig {
                $( $field: $ty::from_ini(ini, $section, errors), )+
                extra_deployments: Vec::new(),
            }
        }
    };
}

kuryr_config! {
    /// `[DEFAULT]`
    default: DefaultSection = "DEFAULT",
    kubernetes: KubernetesSection = "kubernetes",
    vif_pool: VifPoolSection = "vif_pool",
    neutron_defaults: NeutronDefaultsSection = "neutron_defaults",
    octavia_defaults: OctaviaDefaultsSection = "octavia_defaults",
    cache_defaults: CacheDefaultsSection = "cache_defaults",
    subnet_caching: CachingSection = "subnet_caching",
    nodes_caching: CachingSection = "nodes_caching",
    node_driver_caching: CachingSection = "node_driver_caching",
    pod_vif_nested: PodVifNestedSection = "pod_vif_nested",
    binding: BindingSection = "binding",
    namespace_subnet: NamespaceSubnetSection = "namespace_subnet",
    cni_daemon: CniDaemonSection = "cni_daemon",
    health_server: HealthServerSection = "health_server",
    cni_health_server: CniHealthServerSection = "cni_health_server",
    prometheus_exporter: PrometheusExporterSection = "prometheus_exporter",
    sriov: SriovSection = "sriov",
    vhostuser: VhostuserSection = "vhostuser",
    nested_dpdk: NestedDpdkSection = "nested_dpdk",
    pool_manager: PoolManagerSection = "pool_manager",
    /// The deployment named `default`.
    neutron: NeutronAuthSection = "neutron",
    pod_binding: PodBindingSection = "pod_binding",
}

impl KuryrConfig {
    /// Loads `paths` in order (later files win) and applies `KURYR__…` environment overrides
    /// of this process.
    pub fn load(paths: &[impl AsRef<Path>]) -> Result<Loaded, ConfigError> {
        Self::load_with_env(paths, std::env::vars_os())
    }

    /// [`KuryrConfig::load`] for a process that never calls OpenStack (the CNI daemon): the
    /// deployments' credentials are not required. The installed kuryr.conf carries none: they
    /// live in a Secret only the controller reads (`kuryr manifests`).
    pub fn load_without_credentials(paths: &[impl AsRef<Path>]) -> Result<Loaded, ConfigError> {
        Self::read(paths, std::env::vars_os(), false)
    }

    /// [`KuryrConfig::load`] with an explicit environment (tests, embedding).
    pub fn load_with_env<K, V>(
        paths: &[impl AsRef<Path>],
        env: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Loaded, ConfigError>
    where
        K: Into<OsString>,
        V: Into<OsString>,
    {
        Self::read(paths, env, true)
    }

    fn read<K, V>(
        paths: &[impl AsRef<Path>],
        env: impl IntoIterator<Item = (K, V)>,
        require_credentials: bool,
    ) -> Result<Loaded, ConfigError>
    where
        K: Into<OsString>,
        V: Into<OsString>,
    {
        let mut ini = Ini::new();
        for path in paths {
            let path = path.as_ref();
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
                path: path.to_owned(),
                source,
            })?;
            ini.merge(Ini::parse(&text, &path.display().to_string())?);
        }
        let env_warnings = apply_env_overrides(&mut ini, env)?;
        let mut loaded = Self::from_ini_checked(&ini, require_credentials)?;
        for w in &env_warnings {
            tracing::warn!("{w}");
        }
        loaded.warnings.splice(0..0, env_warnings);
        Ok(loaded)
    }

    /// The `*.conf` files of an oslo `--config-dir`, sorted by name (the order oslo loads
    /// them in, so later names win).
    pub fn config_dir_files(dir: impl AsRef<Path>) -> Result<Vec<std::path::PathBuf>, ConfigError> {
        let dir = dir.as_ref();
        let io = |source| ConfigError::Io {
            path: dir.to_owned(),
            source,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if path.extension().is_some_and(|e| e == "conf") && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }

    /// Parses one INI text (no environment overrides).
    pub fn from_ini_str(text: &str) -> Result<Loaded, ConfigError> {
        Self::from_ini(&Ini::parse(text, "<string>")?)
    }

    /// [`KuryrConfig::from_ini_str`] without requiring the deployments' credentials: an
    /// installed kuryr.conf (the ConfigMap) has them in the controller's Secret instead.
    pub fn from_ini_str_without_credentials(text: &str) -> Result<Loaded, ConfigError> {
        Self::from_ini_checked(&Ini::parse(text, "<string>")?, false)
    }

    /// Builds the typed configuration from a raw document.
    pub fn from_ini(ini: &Ini) -> Result<Loaded, ConfigError> {
        Self::from_ini_checked(ini, true)
    }

    fn from_ini_checked(ini: &Ini, require_credentials: bool) -> Result<Loaded, ConfigError> {
        let mut errors = Vec::new();
        let mut warnings = unknown_names(ini);
        let mut config = read_fixed_sections(ini, &mut errors);

        for section in ini.section_names() {
            let Some(name) = section.strip_prefix(DEPLOYMENT_SECTION_PREFIX) else {
                continue;
            };
            let name = name.trim();
            if name.is_empty() || name == DEFAULT_DEPLOYMENT {
                return Err(ConfigError::BadDeploymentName {
                    section: section.to_owned(),
                    reason: if name.is_empty() {
                        "the deployment name is empty".to_owned()
                    } else {
                        "the deployment \"default\" is configured in [neutron]".to_owned()
                    },
                });
            }
            if config.extra_deployments.iter().any(|(n, _)| n == name) {
                return Err(ConfigError::BadDeploymentName {
                    section: section.to_owned(),
                    reason: format!("deployment {name:?} is declared twice"),
                });
            }
            let auth = NeutronAuthSection::from_ini(ini, section, &mut errors);
            config.extra_deployments.push((name.to_owned(), auth));
        }

        fold_deprecated(ini, &mut config, &mut warnings);
        inherit_project_drivers(ini, &mut config);
        check_rules(ini, &config, &mut errors);

        if !errors.is_empty() {
            return Err(ConfigError::Invalid(errors));
        }
        let missing = if require_credentials {
            missing_credentials(&config)
        } else {
            Vec::new()
        };
        if !missing.is_empty() {
            return Err(ConfigError::Missing(missing));
        }
        for w in &warnings {
            tracing::warn!("{w}");
        }
        Ok(Loaded { config, warnings })
    }

    /// Every OpenStack deployment: `("default", [neutron])` first, then the
    /// `[deployment:<name>]` sections in declaration order.
    pub fn deployments(&self) -> Vec<(&str, &NeutronAuthSection)> {
        std::iter::once((DEFAULT_DEPLOYMENT, &self.neutron))
            .chain(self.extra_deployments.iter().map(|(n, a)| (n.as_str(), a)))
            .collect()
    }

    /// One deployment by name (`"default"` is `[neutron]`).
    pub fn deployment(&self, name: &str) -> Option<&NeutronAuthSection> {
        self.deployments()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| a)
    }

    /// The Neutron ids pods use in deployment `name`: its own section's overrides, else the
    /// global `[neutron_defaults]` / `[namespace_subnet]` values.
    pub fn deployment_defaults(&self, name: &str) -> DeploymentDefaults {
        let d = self.deployment(name);
        let nd = &self.neutron_defaults;
        let ns = &self.namespace_subnet;
        DeploymentDefaults {
            pod_subnet: d
                .and_then(|d| d.pod_subnet.clone())
                .or_else(|| nd.pod_subnet.clone()),
            pod_security_groups: d
                .map(|d| d.pod_security_groups.clone())
                .filter(|g| !g.is_empty())
                .unwrap_or_else(|| nd.pod_security_groups.clone()),
            pod_router: d
                .and_then(|d| d.pod_router.clone())
                .or_else(|| ns.pod_router.clone()),
            pod_subnet_pool: d
                .and_then(|d| d.pod_subnet_pool.clone())
                .or_else(|| ns.pod_subnet_pool.clone()),
        }
    }

    /// The Service options of deployment `name`. Neutron ids (`service_subnet`, `external_svc_net`,
    /// `external_svc_subnet`) come from the deployment's own section; the global `[neutron_defaults]`
    /// values are the `default` deployment's only, since an id of one cloud names nothing (or something
    /// else) in another. The Octavia provider is a name, not an id: the global
    /// `[kubernetes] endpoints_driver_octavia_provider` is every deployment's unless its section sets
    /// `octavia_provider`. Empty values count as unset.
    pub fn service_options(&self, name: &str) -> ServiceOptions {
        let d = self.deployment(name);
        let nd = &self.neutron_defaults;
        let global = |v: &Option<String>| {
            if name == DEFAULT_DEPLOYMENT {
                v.clone()
            } else {
                None
            }
        };
        let set = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
        ServiceOptions {
            service_subnet: set(d.and_then(|d| d.service_subnet.clone()))
                .or_else(|| set(global(&nd.service_subnet))),
            external_svc_net: set(d.and_then(|d| d.external_svc_net.clone()))
                .or_else(|| set(global(&nd.external_svc_net))),
            external_svc_subnet: set(d.and_then(|d| d.external_svc_subnet.clone()))
                .or_else(|| set(global(&nd.external_svc_subnet))),
            octavia_provider: set(d.and_then(|d| d.octavia_provider.clone()))
                .unwrap_or_else(|| self.kubernetes.endpoints_driver_octavia_provider.clone()),
            section: if name == DEFAULT_DEPLOYMENT {
                "neutron_defaults".to_string()
            } else {
                format!("{DEPLOYMENT_SECTION_PREFIX}{name}")
            },
        }
    }
}

/// What a deployment's Services are built with, resolved by [`KuryrConfig::service_options`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceOptions {
    /// The VIP subnet, and the option it came from (for errors naming it).
    pub service_subnet: Option<String>,
    pub external_svc_net: Option<String>,
    pub external_svc_subnet: Option<String>,
    /// The Octavia provider as configured (`default` = Octavia's default, upstream's `amphora`).
    pub octavia_provider: String,
    /// Where this deployment's Neutron ids are configured: `[neutron_defaults]` for `default`,
    /// `[deployment:<name>]` otherwise (error messages name it).
    pub section: String,
}

/// Per-deployment Neutron ids, resolved by [`KuryrConfig::deployment_defaults`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeploymentDefaults {
    pub pod_subnet: Option<String>,
    pub pod_security_groups: Vec<String>,
    pub pod_router: Option<String>,
    pub pod_subnet_pool: Option<String>,
}

/// Applies `KURYR__<SECTION>__<OPTION>=value` and `KURYR__DEPLOYMENT__<NAME>__<OPTION>=value`
/// to `ini`. Section names match existing sections case-insensitively and are lower-cased
/// otherwise (`DEFAULT` stays `DEFAULT`); option names are lower-cased.
pub fn apply_env_overrides<K, V>(
    ini: &mut Ini,
    env: impl IntoIterator<Item = (K, V)>,
) -> Result<Vec<Warning>, ConfigError>
where
    K: Into<OsString>,
    V: Into<OsString>,
{
    let mut warnings = Vec::new();
    // Sorted so that the result does not depend on the environment's order.
    let mut vars: Vec<(String, String)> = Vec::new();
    for (k, v) in env {
        let (k, v): (OsString, OsString) = (k.into(), v.into());
        let Some(key) = k.to_str() else { continue };
        if !key.starts_with(ENV_PREFIX) {
            continue;
        }
        let value = v.into_string().map_err(|_| ConfigError::Env {
            var: key.to_owned(),
            message: "the value is not valid UTF-8".to_owned(),
        })?;
        vars.push((key.to_owned(), value));
    }
    vars.sort();

    for (var, value) in vars {
        let parts: Vec<&str> = var[ENV_PREFIX.len()..].split("__").collect();
        let (section, option) = match parts.as_slice() {
            [dep, name, option] if dep.eq_ignore_ascii_case("deployment") && !name.is_empty() => (
                format!("{DEPLOYMENT_SECTION_PREFIX}{}", name.to_ascii_lowercase()),
                *option,
            ),
            [section, option] if !section.is_empty() => (section.to_ascii_lowercase(), *option),
            _ => {
                warnings.push(Warning::MalformedEnvVar { var });
                continue;
            }
        };
        if option.is_empty() {
            warnings.push(Warning::MalformedEnvVar { var });
            continue;
        }
        let section = ini
            .section_names()
            .chain(std::iter::once(DEFAULT_SECTION))
            .find(|s| s.eq_ignore_ascii_case(&section))
            .map(str::to_owned)
            .unwrap_or(section);
        let origin = Origin::Env { var: var.clone() };
        ini.set(&section, &option.to_ascii_lowercase(), value, origin);
    }
    Ok(warnings)
}

/// Sections upstream's files carry for Python libraries kuryr-rs replaces (oslo.concurrency
/// locks, os-vif privsep helpers). devstack writes them into every kuryr.conf, so they are
/// skipped quietly instead of warned about.
pub const PYTHON_ONLY_SECTIONS: &[&str] = &[
    "oslo_concurrency",
    "vif_plug_ovs_privileged",
    "vif_plug_linux_bridge_privileged",
    "os_vif_ovs",
    "os_vif_linux_bridge",
    "privsep",
];

/// keystonemiddleware options devstack's `configure_auth_token_middleware` writes into
/// `[neutron]`; they configure token validation of incoming requests, which kuryr never does.
pub const PYTHON_ONLY_AUTH_OPTIONS: &[&str] = &[
    "www_authenticate_uri",
    "memcached_servers",
    "signing_dir",
    "service_token_roles_required",
    "service_type",
    "auth_section",
    "collect_timing",
    "split_loggers",
];

fn unknown_names(ini: &Ini) -> Vec<Warning> {
    let all_options: BTreeSet<&str> = KNOWN_SECTIONS
        .iter()
        .flat_map(|(_, opts)| opts.iter().copied())
        .chain(NeutronAuthSection::OPTIONS.iter().copied())
        .collect();
    let mut warnings = Vec::new();
    for section in ini.section_names() {
        if PYTHON_ONLY_SECTIONS.contains(&section) {
            tracing::debug!("section [{section}] configures a Python library kuryr-rs does not use; ignored");
            continue;
        }
        let is_auth = section == "neutron" || section.starts_with(DEPLOYMENT_SECTION_PREFIX);
        let known: Option<&[&str]> = if section.starts_with(DEPLOYMENT_SECTION_PREFIX) {
            Some(NeutronAuthSection::OPTIONS)
        } else {
            KNOWN_SECTIONS
                .iter()
                .find(|(name, _)| *name == section)
                .map(|(_, opts)| *opts)
        };
        let Some(known) = known else {
            let origin = ini.options(section).next().map(|(_, v)| v.origin.clone());
            warnings.push(Warning::UnknownSection {
                section: section.to_owned(),
                origin,
            });
            continue;
        };
        for (option, value) in ini.options(section) {
            // A [DEFAULT] option is a fallback for every section, so any option name is known.
            let is_known = if section == DEFAULT_SECTION {
                all_options.contains(option)
            } else {
                known.contains(&option)
            };
            if !is_known && is_auth && PYTHON_ONLY_AUTH_OPTIONS.contains(&option) {
                tracing::debug!("[{section}] {option} is a keystonemiddleware option; ignored");
                continue;
            }
            if !is_known {
                warnings.push(Warning::UnknownOption {
                    section: section.to_owned(),
                    option: option.to_owned(),
                    origin: value.origin.clone(),
                });
            }
        }
    }
    warnings
}

/// Old spellings upstream still honours: keep honouring them, but say so.
fn fold_deprecated(ini: &Ini, config: &mut KuryrConfig, warnings: &mut Vec<Warning>) {
    if let Some(raw) = ini.lookup("pod_vif_nested", "worker_nodes_subnet") {
        warnings.push(Warning::Deprecated {
            section: "pod_vif_nested".into(),
            option: "worker_nodes_subnet".into(),
            advice: "use worker_nodes_subnets (a list)".into(),
            origin: raw.origin.clone(),
        });
        let nested = &mut config.pod_vif_nested;
        if let Some(subnet) = nested.worker_nodes_subnet.clone()
            && !nested.worker_nodes_subnets.contains(&subnet)
        {
            nested.worker_nodes_subnets.push(subnet);
        }
    }
    if let Some(raw) = ini.lookup("binding", "driver") {
        warnings.push(Warning::Deprecated {
            section: "binding".into(),
            option: "driver".into(),
            advice: "use default_driver".into(),
            origin: raw.origin.clone(),
        });
        if ini.lookup("binding", "default_driver").is_none()
            && let Some(driver) = config.binding.driver.clone()
        {
            config.binding.default_driver = driver;
        }
    }
    if let Some(raw) = ini.lookup("vif_pool", "pools_vif_drivers") {
        warnings.push(Warning::Deprecated {
            section: "vif_pool".into(),
            option: "pools_vif_drivers".into(),
            advice: "use vif_pool_mapping (pod VIF driver -> pool driver)".into(),
            origin: raw.origin.clone(),
        });
    }
}

/// Checks each deployment has what its `auth_type` needs, so a typo fails at start-up
/// rather than at the first Neutron call. A `cloud` (clouds.yaml) entry may supply
/// everything, so it disables the check here; the cloud itself is loaded, and a missing file or
/// cloud name reported, when the Neutron clients are built at start-up
/// (`kuryr_controller::openstack::Deployments::from_config`).
fn missing_credentials(config: &KuryrConfig) -> Vec<MissingOption> {
    let mut missing = Vec::new();
    for (name, auth) in config.deployments() {
        let Some(auth_type) = auth.auth_type else { continue };
        if auth.cloud.is_some() {
            continue;
        }
        let section = if name == DEFAULT_DEPLOYMENT {
            "neutron".to_owned()
        } else {
            format!("{DEPLOYMENT_SECTION_PREFIX}{name}")
        };
        // Keystone v3 names a user or project by name only within a domain (its own option or
        // the `default_domain_*` ones); an id needs none.
        let default_domain = auth.default_domain_name.is_some() || auth.default_domain_id.is_some();
        let user_domain = auth.user_id.is_some()
            || auth.username.is_none()
            || auth.user_domain_name.is_some()
            || auth.user_domain_id.is_some()
            || default_domain;
        let project_domain = auth.project_id.is_some()
            || auth.project_name.is_none()
            || auth.project_domain_name.is_some()
            || auth.project_domain_id.is_some()
            || default_domain;
        let required: &[(&str, bool)] = match auth_type {
            AuthType::Password | AuthType::V3Password => &[
                ("auth_url", auth.auth_url.is_some()),
                (
                    "username or user_id",
                    auth.username.is_some() || auth.user_id.is_some(),
                ),
                ("user_domain_name or user_domain_id", user_domain),
                ("password", auth.password.is_some()),
                // A token without a project has no catalog and no role on Neutron.
                (
                    "project_name or project_id",
                    auth.project_name.is_some() || auth.project_id.is_some(),
                ),
                ("project_domain_name or project_domain_id", project_domain),
            ],
            AuthType::V3ApplicationCredential => &[
                ("auth_url", auth.auth_url.is_some()),
                (
                    "application_credential_id or application_credential_name",
                    auth.application_credential_id.is_some() || auth.application_credential_name.is_some(),
                ),
                // A credential named, not given by id, is the named user's.
                (
                    "username or user_id",
                    auth.application_credential_id.is_some()
                        || auth.application_credential_name.is_none()
                        || auth.username.is_some()
                        || auth.user_id.is_some(),
                ),
                ("user_domain_name or user_domain_id", user_domain),
                (
                    "application_credential_secret",
                    auth.application_credential_secret.is_some(),
                ),
            ],
            // Without Keystone there is no catalog to find Neutron in.
            AuthType::Noauth | AuthType::None => {
                &[("endpoint_override or endpoint", auth.neutron_endpoint().is_some())]
            }
        };
        for (option, present) in required {
            if !present {
                missing.push(MissingOption {
                    section: section.clone(),
                    option: (*option).to_owned(),
                    because: format!("auth_type = {auth_type}"),
                });
            }
        }
    }
    missing
}

/// The namespace, Service and policy project drivers a kuryr.conf leaves unset follow
/// `pod_project_driver`: a port can only use the security groups of its own project, and a
/// namespace's network and a Service's load balancer belong with its pods. Upstream's default for
/// each was `default`, and its documentation asked for all four to be set alike; a config that
/// sets them keeps what it says.
fn inherit_project_drivers(ini: &Ini, config: &mut KuryrConfig) {
    let pod = config.kubernetes.pod_project_driver;
    let k = &mut config.kubernetes;
    for (option, driver) in [
        ("namespace_project_driver", &mut k.namespace_project_driver),
        ("service_project_driver", &mut k.service_project_driver),
        (
            "network_policy_project_driver",
            &mut k.network_policy_project_driver,
        ),
    ] {
        if ini.lookup("kubernetes", option).is_none() {
            *driver = pod;
        }
    }
}

/// Rules that involve more than one value's syntax.
fn check_rules(ini: &Ini, config: &KuryrConfig, errors: &mut Vec<InvalidValue>) {
    let mut fail = |section: &str, option: &str, expected: String| {
        if let Some(raw) = ini.lookup(section, option) {
            errors.push(InvalidValue {
                section: section.to_owned(),
                option: option.to_owned(),
                value: raw.value.clone(),
                expected,
                origin: raw.origin.clone(),
            });
        }
    };
    let threshold = config.pod_binding.usage_threshold;
    // 0 would move every project off at once and bind nothing more; a hysteresis as high as the
    // threshold would admit no new binding once usage is measured.
    if !(threshold > 0.0 && threshold <= 1.0) {
        fail(
            "pod_binding",
            "usage_threshold",
            "expected a fraction above 0, at most 1".into(),
        );
    }
    let hysteresis = config.pod_binding.usage_hysteresis;
    if !(hysteresis >= 0.0 && hysteresis < threshold.max(f64::MIN_POSITIVE)) {
        fail(
            "pod_binding",
            "usage_hysteresis",
            "expected a fraction from 0 up to (not including) usage_threshold".into(),
        );
    }
    for (option, ms) in [
        ("timeout_client_data", config.octavia_defaults.timeout_client_data),
        ("timeout_member_data", config.octavia_defaults.timeout_member_data),
    ] {
        if ms > OCTAVIA_MAX_TIMEOUT_MS {
            fail(
                "octavia_defaults",
                option,
                format!(
                    "expected milliseconds between 0 and {OCTAVIA_MAX_TIMEOUT_MS} (Octavia's limit, 24 h)"
                ),
            );
        }
    }
    // Upstream's `openshift` driver learnt the nodes' subnets from OpenShift's Machine objects,
    // which kuryr-rs does not watch: a nested driver would find no node's VM port, silently.
    let nested = matches!(
        config.kubernetes.pod_vif_driver,
        PodVifDriver::NestedVlan | PodVifDriver::NestedMacvlan | PodVifDriver::NestedDpdk
    );
    if nested && config.kubernetes.nodes_subnets_driver == NodesSubnetsDriver::Openshift {
        fail(
            "kubernetes",
            "nodes_subnets_driver",
            "expected config (OpenShift's Machine objects are not read): list the nodes' subnets in \
             [pod_vif_nested] worker_nodes_subnets"
                .into(),
        );
    }
    if let Some(w) = config
        .pod_binding
        .weigher_multipliers
        .keys()
        .find(|w| !config.pod_binding.weighers.contains(w))
    {
        fail(
            "pod_binding",
            "weigher_multipliers",
            format!("weigher {:?} is not listed in [pod_binding] weighers", w.as_str()),
        );
    }
}
