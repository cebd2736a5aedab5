//! `clouds.yaml` (openstacksdk format) support.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{AuthOptions, AuthType, ClientOptions, Interface, Secret};

#[derive(Debug, thiserror::Error)]
pub enum CloudsYamlError {
    #[error(
        "no clouds.yaml found (searched {}; the order is $OS_CLIENT_CONFIG_FILE, ./clouds.yaml, \
         ~/.config/openstack/clouds.yaml, /etc/openstack/clouds.yaml, as in openstacksdk)",
        display_paths(.searched)
    )]
    NotFound { searched: Vec<PathBuf> },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid clouds.yaml {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("cloud {name:?} is not defined in {path} (defined: {available:?})")]
    NoSuchCloud {
        name: String,
        path: PathBuf,
        available: Vec<String>,
    },
    #[error("no cloud name given and OS_CLOUD is unset, and {path} defines {count} clouds")]
    Ambiguous { path: PathBuf, count: usize },
}

/// `paths` joined for an error message.
pub fn display_paths(p: &[PathBuf]) -> String {
    p.iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[derive(Deserialize)]
struct CloudsFile {
    #[serde(default)]
    clouds: BTreeMap<String, CloudEntry>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CloudEntry {
    auth: AuthSection,
    auth_type: Option<String>,
    region_name: Option<String>,
    interface: Option<String>,
    cacert: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    verify: Option<bool>,
    network_endpoint_override: Option<String>,
    endpoint_override: Option<String>,
    api_timeout: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AuthSection {
    auth_url: Option<String>,
    username: Option<String>,
    user_id: Option<String>,
    password: Option<String>,
    user_domain_name: Option<String>,
    user_domain_id: Option<String>,
    project_name: Option<String>,
    project_id: Option<String>,
    project_domain_name: Option<String>,
    project_domain_id: Option<String>,
    application_credential_id: Option<String>,
    application_credential_name: Option<String>,
    application_credential_secret: Option<String>,
    /// openstacksdk shorthand applied to both user and project domain when they are unset.
    domain_name: Option<String>,
    endpoint: Option<String>,
}

/// The openstacksdk search order: `$OS_CLIENT_CONFIG_FILE`, `./clouds.yaml`, `~/.config/openstack/clouds.yaml`,
/// `/etc/openstack/clouds.yaml`.
pub fn clouds_yaml_search_paths() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(p) = std::env::var_os("OS_CLIENT_CONFIG_FILE") {
        paths.push(PathBuf::from(p));
    }
    // Absolute, so that an error message says which directory was meant.
    paths.push(
        std::env::current_dir()
            .map(|d| d.join("clouds.yaml"))
            .unwrap_or_else(|_| PathBuf::from("clouds.yaml")),
    );
    if let Some(home) = std::env::var_os("HOME") {
        paths.push(Path::new(&home).join(".config/openstack/clouds.yaml"));
    }
    paths.push(PathBuf::from("/etc/openstack/clouds.yaml"));
    paths
}

/// Load cloud `name` (default `$OS_CLOUD`, or the only cloud of the file) from the first existing clouds.yaml.
pub fn load_cloud(name: Option<&str>) -> Result<ClientOptions, CloudsYamlError> {
    let env_name = std::env::var("OS_CLOUD").ok();
    load_cloud_in(&clouds_yaml_search_paths(), name.or(env_name.as_deref()))
}

/// Load cloud `name` from the first existing file of `search` (like openstacksdk, later files are not merged).
pub fn load_cloud_in(search: &[PathBuf], name: Option<&str>) -> Result<ClientOptions, CloudsYamlError> {
    let path = search
        .iter()
        .find(|p| p.is_file())
        .ok_or_else(|| CloudsYamlError::NotFound {
            searched: search.to_vec(),
        })?;
    load_cloud_from(path, name)
}

/// Load cloud `name` from a given clouds.yaml; `None` picks the file's only cloud.
pub fn load_cloud_from(path: &Path, name: Option<&str>) -> Result<ClientOptions, CloudsYamlError> {
    let text = std::fs::read_to_string(path).map_err(|source| CloudsYamlError::Read {
        path: path.to_owned(),
        source,
    })?;
    let invalid = |message: String| CloudsYamlError::Invalid {
        path: path.to_owned(),
        message,
    };
    let file: CloudsFile = serde_yaml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let (cloud_name, entry) = match name {
        Some(n) => file
            .clouds
            .get_key_value(n)
            .ok_or_else(|| CloudsYamlError::NoSuchCloud {
                name: n.to_owned(),
                path: path.to_owned(),
                available: file.clouds.keys().cloned().collect(),
            })?,
        None if file.clouds.len() == 1 => file.clouds.iter().next().ok_or(CloudsYamlError::Ambiguous {
            path: path.to_owned(),
            count: 0,
        })?,
        None => {
            return Err(CloudsYamlError::Ambiguous {
                path: path.to_owned(),
                count: file.clouds.len(),
            });
        }
    };
    let auth_type = match entry.auth_type.as_deref() {
        None => AuthType::Password,
        Some(t) => AuthType::parse(t)
            .ok_or_else(|| invalid(format!("clouds.{cloud_name}.auth_type: unsupported value {t:?}")))?,
    };
    let interface = match entry.interface.as_deref() {
        None => Interface::Public,
        Some(i) => Interface::parse(i)
            .ok_or_else(|| invalid(format!("clouds.{cloud_name}.interface: unsupported value {i:?}")))?,
    };
    let a = &entry.auth;
    let mut opts = ClientOptions {
        auth: AuthOptions {
            auth_type,
            auth_url: a.auth_url.clone(),
            username: a.username.clone(),
            user_id: a.user_id.clone(),
            password: a.password.clone().map(Secret::new),
            user_domain_name: a.user_domain_name.clone().or_else(|| a.domain_name.clone()),
            user_domain_id: a.user_domain_id.clone(),
            project_name: a.project_name.clone(),
            project_id: a.project_id.clone(),
            project_domain_name: a.project_domain_name.clone().or_else(|| a.domain_name.clone()),
            project_domain_id: a.project_domain_id.clone(),
            application_credential_id: a.application_credential_id.clone(),
            application_credential_name: a.application_credential_name.clone(),
            application_credential_secret: a.application_credential_secret.clone().map(Secret::new),
        },
        region_name: entry.region_name.clone(),
        interface,
        cafile: entry.cacert.clone(),
        certfile: entry.cert.clone(),
        keyfile: entry.key.clone(),
        insecure: entry.verify == Some(false),
        endpoint_override: entry
            .network_endpoint_override
            .clone()
            .or_else(|| entry.endpoint_override.clone())
            .or_else(|| a.endpoint.clone()),
        ..ClientOptions::default()
    };
    if let Some(t) = entry.api_timeout {
        opts.timeout = Some(
            std::time::Duration::try_from_secs_f64(t)
                .map_err(|_| invalid(format!("clouds.{cloud_name}.api_timeout: invalid value {t}")))?,
        );
    }
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"
clouds:
  prod:
    auth:
      auth_url: https://keystone.example:5000/v3
      username: kuryr
      password: pw
      project_name: k8s
      domain_name: Default
    region_name: RegionTwo
    interface: internal
    cacert: /etc/ssl/ca.pem
  appcred:
    auth_type: v3applicationcredential
    auth:
      auth_url: https://keystone.example:5000
      application_credential_id: abc
      application_credential_secret: xyz
    verify: false
  lab:
    auth_type: none
    auth:
      endpoint: http://127.0.0.1:9696
"#;

    fn write() -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().expect("tempfile");
        std::fs::write(f.path(), YAML).expect("write");
        f
    }

    #[test]
    fn password_cloud() {
        let f = write();
        let o = load_cloud_from(f.path(), Some("prod")).expect("prod");
        assert_eq!(o.auth.auth_type, AuthType::Password);
        assert_eq!(o.auth.username.as_deref(), Some("kuryr"));
        assert_eq!(o.auth.password.as_ref().map(Secret::expose), Some("pw"));
        assert_eq!(o.auth.user_domain_name.as_deref(), Some("Default"));
        assert_eq!(o.auth.project_domain_name.as_deref(), Some("Default"));
        assert_eq!(o.region_name.as_deref(), Some("RegionTwo"));
        assert_eq!(o.interface, Interface::Internal);
        assert_eq!(o.cafile.as_deref(), Some(Path::new("/etc/ssl/ca.pem")));
        assert!(!o.insecure);
    }

    #[test]
    fn appcred_and_noauth_clouds() {
        let f = write();
        let o = load_cloud_from(f.path(), Some("appcred")).expect("appcred");
        assert_eq!(o.auth.auth_type, AuthType::ApplicationCredential);
        assert_eq!(o.auth.application_credential_id.as_deref(), Some("abc"));
        assert!(o.insecure);
        let o = load_cloud_from(f.path(), Some("lab")).expect("lab");
        assert_eq!(o.auth.auth_type, AuthType::NoAuth);
        assert_eq!(o.endpoint_override.as_deref(), Some("http://127.0.0.1:9696"));
    }

    #[test]
    fn unknown_or_ambiguous_cloud_is_reported() {
        let f = write();
        let e = load_cloud_from(f.path(), Some("nope")).expect_err("unknown");
        assert!(e.to_string().contains("\"nope\""), "{e}");
        let e = load_cloud_from(f.path(), None).expect_err("ambiguous");
        assert!(matches!(e, CloudsYamlError::Ambiguous { count: 3, .. }));
    }

    #[test]
    fn search_uses_the_first_existing_file_and_names_every_path_when_none_exists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing/clouds.yaml");
        let present = dir.path().join("clouds.yaml");
        std::fs::write(&present, YAML).expect("write");
        let o = load_cloud_in(&[missing.clone(), present], Some("lab")).expect("second path");
        assert_eq!(o.auth.auth_type, AuthType::NoAuth);
        let other = dir.path().join("etc/clouds.yaml");
        let e = load_cloud_in(&[missing.clone(), other.clone()], Some("lab")).expect_err("none exists");
        let msg = e.to_string();
        assert!(matches!(e, CloudsYamlError::NotFound { .. }), "{e:?}");
        for p in [&missing, &other] {
            assert!(msg.contains(&p.display().to_string()), "{msg}");
        }
        assert!(msg.contains("OS_CLIENT_CONFIG_FILE"), "{msg}");
    }
}
