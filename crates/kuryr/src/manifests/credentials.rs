//! OpenStack credentials out of the ConfigMap: both workloads mount kuryr.conf, and the CNI
//! DaemonSet's privileged pods run on every node, yet only the controller calls OpenStack. The
//! deployments' secret options (`password`, `application_credential_secret`) move to a Secret the
//! controller alone reads, as `KURYR__<SECTION>__<OPTION>` environment variables (the loader's
//! overrides); the ConfigMap keeps a comment where each was.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kuryr_config::{DEFAULT_SECTION, DEPLOYMENT_SECTION_PREFIX, Ini, Origin};

use super::files::{Carried, FILE_OPTIONS, FILES_SECRET, Source};
use super::{Doc, Options, meta};

/// The Secret the controller takes its OpenStack credentials from.
pub const SECRET: &str = "kuryr-credentials";

/// Options that are credentials, in `[neutron]` and `[deployment:<name>]`.
const SECRET_OPTIONS: [&str; 2] = ["password", "application_credential_secret"];

/// kuryr.conf without its credentials, the credentials as environment variables, and the files
/// its OpenStack clients read ([`files`](super::files)).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub public: String,
    pub env: BTreeMap<String, String>,
    pub files: Carried,
}

/// Where a moved option went.
enum Moved {
    /// A credential, to this environment variable.
    Env { key: String, var: String },
    /// A file, read from `from`, to `to` in the controller.
    File { key: String, from: String, to: String },
}

/// Splits `conf_text`, read by the loader's own INI parser (quotes, `-` in keys, continuation
/// lines as the services read them): every line of a moved option goes, a comment takes its
/// place (and, for a file, the option naming where the controller finds it). A deployment whose
/// name an environment variable cannot carry back is refused, and so is a file that cannot be read.
pub fn split(conf_text: &str, source: &dyn Source) -> Result<Split, String> {
    let ini = Ini::parse(conf_text, "kuryr.conf").map_err(|e| e.to_string())?;
    let mut env = BTreeMap::new();
    let mut files = Carried::new();
    let mut clouds = Vec::new();
    // 1-based line -> where its option moved to.
    let mut moved: BTreeMap<usize, Moved> = BTreeMap::new();
    for section in ini.section_names() {
        // The sections as the loader names them (case-sensitive, as oslo's). `[DEFAULT]` is where
        // every section falls back to: its files and cloud are carried too (its credentials stay,
        // as before: no variable names a fallback).
        let prefix = if section == DEFAULT_SECTION {
            None
        } else if section == "neutron" {
            Some("KURYR__NEUTRON__".to_owned())
        } else if let Some(name) = section.strip_prefix(DEPLOYMENT_SECTION_PREFIX) {
            let carried = !name.is_empty()
                && !name.contains("__")
                && name == name.to_ascii_lowercase()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
            if !carried {
                return Err(format!(
                    "[{section}]: a deployment name in lower case letters, digits, '-', '.' or single '_' \
                     (its credentials go to the environment variable KURYR__DEPLOYMENT__<NAME>__<OPTION>)"
                ));
            }
            Some(format!("KURYR__DEPLOYMENT__{}__", name.to_ascii_uppercase()))
        } else {
            continue;
        };
        for (key, value) in ini.options(section) {
            let Origin::File { line, .. } = value.origin else {
                continue;
            };
            if key == "cloud" {
                // Empty is no cloud, as the loader reads it.
                if !value.value.trim().is_empty() {
                    clouds.push((section.to_owned(), value.value.trim().to_owned()));
                }
            } else if FILE_OPTIONS.contains(&key) && !value.value.is_empty() {
                let to = super::files::carry(source, &mut files, section, key, &value.value)?;
                moved.insert(
                    line,
                    Moved::File {
                        key: key.to_owned(),
                        from: value.value.clone(),
                        to,
                    },
                );
            } else if let Some(prefix) = prefix.as_ref().filter(|_| SECRET_OPTIONS.contains(&key)) {
                let var = format!("{prefix}{}", key.to_ascii_uppercase());
                env.insert(var.clone(), value.value.clone());
                moved.insert(
                    line,
                    Moved::Env {
                        key: key.to_owned(),
                        var,
                    },
                );
            }
        }
    }
    super::files::carry_clouds_yaml(source, &mut files, &clouds)?;
    let mut public = String::new();
    let mut continuing = false;
    for (idx, line) in conf_text.lines().enumerate() {
        match moved.get(&(idx + 1)) {
            Some(Moved::Env { key, var }) => {
                public.push_str(&format!(
                    "# {key}: in the Secret {SECRET} ({var}), read by the controller only\n"
                ));
                continuing = true;
                continue;
            }
            Some(Moved::File { key, from, to }) => {
                public.push_str(&format!(
                    "# {key}: {from} where kuryr manifests ran, in the Secret {FILES_SECRET} mounted by the controller\n\
                     {key} = {to}\n"
                ));
                continuing = true;
                continue;
            }
            None => {}
        }
        // The indented lines that continue a moved value go with it.
        if continuing && line.starts_with([' ', '\t']) && !line.trim().is_empty() {
            continue;
        }
        continuing = false;
        public.push_str(line);
        public.push('\n');
    }
    Ok(Split { public, env, files })
}

pub fn secret(opts: &Options, env: &BTreeMap<String, String>) -> Doc {
    Doc::with_comments(
        &Secret {
            metadata: meta(SECRET, Some(&opts.namespace)),
            type_: Some("Opaque".to_owned()),
            string_data: Some(env.clone()),
            ..Secret::default()
        },
        vec![
            "OpenStack credentials from kuryr.conf: the controller's environment only (the CNI".to_owned(),
            "daemons on every node never call OpenStack). Keep this file out of version control.".to_owned(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_of_every_deployment_leave_the_file() {
        let text = "[DEFAULT]\npassword = not-a-deployment\n[neutron]\nauth_type = password\npassword = \"s3cret=x\"\n\
                    username = kuryr\n# password = commented\n[deployment:edge-1]\napplication-credential-secret: abc\n  zq9\n\
                    region_name = r\n[octavia_defaults]\npassword = other\n";
        let s = split(text, &super::super::files::Local).expect("split");
        assert_eq!(
            s.env,
            BTreeMap::from([
                ("KURYR__NEUTRON__PASSWORD".to_owned(), "s3cret=x".to_owned()),
                (
                    "KURYR__DEPLOYMENT__EDGE-1__APPLICATION_CREDENTIAL_SECRET".to_owned(),
                    "abc\nzq9".to_owned()
                ),
            ]),
            "values as the loader reads them: quotes stripped, continuation lines joined"
        );
        assert!(
            !s.public.contains("s3cret") && !s.public.contains("abc") && !s.public.contains("zq9"),
            "{}",
            s.public
        );
        for kept in [
            "password = not-a-deployment",
            "username = kuryr",
            "# password = commented",
            "password = other",
            "region_name = r",
        ] {
            assert!(s.public.contains(kept), "{kept} in {}", s.public);
        }
        assert!(
            s.public
                .contains("# password: in the Secret kuryr-credentials (KURYR__NEUTRON__PASSWORD)")
        );
        assert!(
            split("[deployment: Edge]\npassword = p\n", &super::super::files::Local).is_err(),
            "a name the variable cannot carry back is refused"
        );
    }

    /// What leaves the file comes back through the loader's environment overrides unchanged.
    #[test]
    fn the_loader_reads_the_split_back_as_the_whole() {
        let text = "[neutron]\nauth_type = password\nauth_url = https://k:5000/v3\nusername = u\npassword = p@ss\n\
                    user_domain_name = Default\nproject_name = p\nproject_domain_name = Default\n";
        let s = split(text, &super::super::files::Local).expect("split");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kuryr.conf");
        std::fs::write(&path, &s.public).expect("write");
        assert!(
            kuryr_config::KuryrConfig::load_with_env(&[&path], Vec::<(String, String)>::new()).is_err(),
            "without the Secret the controller's load fails"
        );
        let loaded = kuryr_config::KuryrConfig::load_with_env(&[&path], s.env.clone()).expect("load");
        assert_eq!(
            loaded.config.neutron.password.as_ref().map(|p| p.expose()),
            Some("p@ss")
        );
        assert!(kuryr_config::KuryrConfig::load_without_credentials(&[&path]).is_ok());
    }
}
