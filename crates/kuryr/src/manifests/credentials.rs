//! OpenStack credentials out of the ConfigMap: both workloads mount kuryr.conf, and the CNI
//! DaemonSet's privileged pods run on every node, yet only the controller calls OpenStack. The
//! deployments' secret options (`password`, `application_credential_secret`) move to a Secret the
//! controller alone reads, as `KURYR__<SECTION>__<OPTION>` environment variables (the loader's
//! overrides); the ConfigMap keeps a comment where each was.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

use super::{Doc, Options, meta};

/// The Secret the controller takes its OpenStack credentials from.
pub const SECRET: &str = "kuryr-credentials";

/// Options that are credentials, in `[neutron]` and `[deployment:<name>]`.
const SECRET_OPTIONS: [&str; 2] = ["password", "application_credential_secret"];

/// kuryr.conf without its credentials, and the credentials as environment variables.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub public: String,
    pub env: BTreeMap<String, String>,
}

/// Splits `conf_text` (oslo INI: `[section]` headers, `key = value` or `key: value` lines).
pub fn split(conf_text: &str) -> Split {
    let mut out = Split::default();
    let mut prefix: Option<String> = None;
    for line in conf_text.lines() {
        let trimmed = line.trim();
        if let Some(section) = trimmed.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            let section = section.trim().to_ascii_lowercase();
            prefix = if section == "neutron" {
                Some("KURYR__NEUTRON__".to_owned())
            } else {
                section
                    .strip_prefix("deployment:")
                    .map(|name| format!("KURYR__DEPLOYMENT__{}__", name.trim().to_ascii_uppercase()))
            };
        } else if let Some(prefix) = &prefix
            && !trimmed.starts_with('#')
            && !trimmed.starts_with(';')
            && let Some((key, value)) = trimmed.split_once(['=', ':'])
            && SECRET_OPTIONS.contains(&key.trim().to_ascii_lowercase().as_str())
        {
            let var = format!("{prefix}{}", key.trim().to_ascii_uppercase());
            out.public.push_str(&format!(
                "# {}: in the Secret {SECRET} ({var}), read by the controller only\n",
                key.trim()
            ));
            out.env.insert(var, value.trim().to_owned());
            continue;
        }
        out.public.push_str(line);
        out.public.push('\n');
    }
    out
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
        let text = "[DEFAULT]\npassword = not-a-deployment\n[neutron]\nauth_type = password\npassword = s3cret=x\n\
                    username = kuryr\n# password = commented\n[deployment:Edge-1]\napplication_credential_secret: abc\n\
                    [octavia_defaults]\npassword = other\n";
        let s = split(text);
        assert_eq!(
            s.env,
            BTreeMap::from([
                ("KURYR__NEUTRON__PASSWORD".to_owned(), "s3cret=x".to_owned()),
                (
                    "KURYR__DEPLOYMENT__EDGE-1__APPLICATION_CREDENTIAL_SECRET".to_owned(),
                    "abc".to_owned()
                ),
            ])
        );
        assert!(
            !s.public.contains("s3cret") && !s.public.contains("abc"),
            "{}",
            s.public
        );
        for kept in [
            "password = not-a-deployment",
            "username = kuryr",
            "# password = commented",
            "password = other",
        ] {
            assert!(s.public.contains(kept), "{kept} in {}", s.public);
        }
        assert!(
            s.public
                .contains("# password: in the Secret kuryr-credentials (KURYR__NEUTRON__PASSWORD)")
        );
    }

    /// What leaves the file comes back through the loader's environment overrides unchanged.
    #[test]
    fn the_loader_reads_the_split_back_as_the_whole() {
        let text = "[neutron]\nauth_type = password\nauth_url = https://k:5000/v3\nusername = u\npassword = p@ss\n\
                    user_domain_name = Default\nproject_name = p\nproject_domain_name = Default\n";
        let s = split(text);
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
