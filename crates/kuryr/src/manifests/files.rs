//! Files kuryr.conf names for the OpenStack clients: `cafile`, `certfile` and `keyfile` of
//! `[neutron]` and `[deployment:<name>]`, and for a `cloud` the clouds.yaml it is read from (with
//! its clouds' `cacert`, `cert` and `key`). The controller runs on a read-only image that has none of them, so
//! `kuryr manifests` reads them where it runs and carries them in a Secret the controller alone
//! mounts at [`FILES_DIR`]; the ConfigMap's kuryr.conf (and the carried clouds.yaml) name them
//! there. A file that cannot be read stops the generation, naming the option.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use serde_yaml::Value;

use super::{Doc, Options, meta};

/// The Secret with the carried files.
pub const FILES_SECRET: &str = "kuryr-openstack-files";
/// Where the controller mounts it.
pub const FILES_DIR: &str = "/etc/kuryr-openstack";
/// The carried clouds.yaml's key (the controller's `OS_CLIENT_CONFIG_FILE` names it).
pub const CLOUDS_YAML: &str = "clouds.yaml";
/// The keystoneauth session options that name a file.
pub const FILE_OPTIONS: [&str; 3] = ["cafile", "certfile", "keyfile"];

/// Where the files come from: the machine `kuryr manifests` runs on, or a test's map.
pub trait Source {
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>>;
    /// Where a clouds.yaml is looked for, in order (the first that exists is used).
    fn clouds_yaml_paths(&self) -> Vec<PathBuf>;
}

/// The local file system, clouds.yaml searched as the controller searches it.
pub struct Local;

impl Source for Local {
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn clouds_yaml_paths(&self) -> Vec<PathBuf> {
        kuryr_neutron::auth::clouds_yaml_search_paths()
    }
}

/// The carried files by Secret key.
pub type Carried = BTreeMap<String, Vec<u8>>;

/// Reads `option = path` of `[section]` into `carried`; returns the path the controller finds it at.
pub fn carry(
    source: &dyn Source,
    carried: &mut Carried,
    section: &str,
    option: &str,
    path: &str,
) -> Result<String, String> {
    // Secret keys are [-._a-zA-Z0-9]+; deployment names are checked to be within that already.
    let key = format!("{}.{option}", section.replace(':', "-"));
    let bytes = source.read(Path::new(path)).map_err(|e| {
        format!("[{section}] {option} = {path}: cannot read it to carry it into the cluster (the Secret {FILES_SECRET}): {e}")
    })?;
    carried.insert(key.clone(), bytes);
    Ok(format!("{FILES_DIR}/{key}"))
}

/// The clouds.yaml the `cloud` options of kuryr.conf (`(section, cloud)`) are read from, found
/// as the controller would find it, cut down to those clouds (the others' credentials stay
/// out of the cluster), each `cacert`, `cert` and `key` carried too.
pub fn carry_clouds_yaml(
    source: &dyn Source,
    carried: &mut Carried,
    clouds: &[(String, String)],
) -> Result<(), String> {
    if clouds.is_empty() {
        return Ok(());
    }
    for (section, cloud) in clouds {
        // Its files go under Secret keys named after it.
        if cloud.is_empty()
            || !cloud
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        {
            return Err(format!(
                "[{section}] cloud = {cloud}: kuryr manifests carries its files under Secret keys named after it, \
                 which allow letters, digits, '-', '.' and '_' only: rename the cloud in clouds.yaml"
            ));
        }
    }
    let searched = source.clouds_yaml_paths();
    let found = searched.iter().find_map(|p| source.read(p).ok().map(|b| (p, b)));
    let names = || {
        clouds
            .iter()
            .map(|(s, c)| format!("[{s}] cloud = {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some((path, bytes)) = found else {
        return Err(format!(
            "{}: no clouds.yaml to carry into the cluster where kuryr manifests runs (searched {})",
            names(),
            kuryr_neutron::auth::display_paths(&searched)
        ));
    };
    let at = path.display();
    let doc: Value = serde_yaml::from_slice(&bytes).map_err(|e| format!("{at}: {e}"))?;
    let mut kept = serde_yaml::Mapping::new();
    for (section, cloud) in clouds {
        let Some(entry) = doc.get("clouds").and_then(|c| c.get(cloud.as_str())) else {
            return Err(format!("[{section}] cloud = {cloud}: {at} has no such cloud"));
        };
        let mut entry = entry.clone();
        for field in ["cacert", "cert", "key"] {
            let Some(path) = entry.get(field).and_then(Value::as_str).map(str::to_owned) else {
                continue;
            };
            let key = format!("clouds.{cloud}.{field}");
            let bytes = source
                .read(Path::new(&path))
                .map_err(|e| format!("{at}: clouds.{cloud}.{field} = {path}: cannot read it: {e}"))?;
            carried.insert(key.clone(), bytes);
            entry[field] = Value::String(format!("{FILES_DIR}/{key}"));
        }
        kept.insert(Value::String(cloud.clone()), entry);
    }
    let mut out = serde_yaml::Mapping::new();
    out.insert(Value::String("clouds".into()), Value::Mapping(kept));
    let text = serde_yaml::to_string(&Value::Mapping(out)).map_err(|e| format!("{at}: {e}"))?;
    carried.insert(CLOUDS_YAML.to_owned(), text.into_bytes());
    Ok(())
}

pub fn secret(opts: &Options, carried: &Carried) -> Doc {
    Doc::with_comments(
        &Secret {
            metadata: meta(FILES_SECRET, Some(&opts.namespace)),
            type_: Some("Opaque".to_owned()),
            data: Some(
                carried
                    .iter()
                    .map(|(k, v)| (k.clone(), ByteString(v.clone())))
                    .collect(),
            ),
            ..Secret::default()
        },
        vec![
            format!(
                "Files kuryr.conf names for the OpenStack clients, mounted by the controller at {FILES_DIR}"
            ),
            "(keys, certificates, clouds.yaml). Keep this file out of version control.".to_owned(),
        ],
    )
}
