//! The Namespace and the ConfigMap with kuryr.conf.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};

use super::{Doc, Options, meta};

/// The ConfigMap both workloads mount at `/etc/kuryr`.
pub const CONFIG_MAP: &str = "kuryr-config";
/// Its key, and the file name under `/etc/kuryr`.
pub const CONFIG_KEY: &str = "kuryr.conf";

pub fn namespace(opts: &Options) -> Doc {
    let mut metadata = meta(&opts.namespace, None);
    // The CNI DaemonSet is privileged: Pod Security Admission must allow it in this namespace.
    metadata
        .labels
        .get_or_insert_default()
        .insert("pod-security.kubernetes.io/enforce".into(), "privileged".into());
    Doc::new(&Namespace {
        metadata,
        ..Namespace::default()
    })
}

pub fn config_map(opts: &Options, conf_text: &str) -> Doc {
    Doc::new(&ConfigMap {
        metadata: meta(CONFIG_MAP, Some(&opts.namespace)),
        data: Some(BTreeMap::from([(CONFIG_KEY.to_owned(), conf_text.to_owned())])),
        ..ConfigMap::default()
    })
}
