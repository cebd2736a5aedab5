//! The deployment an object's OpenStack resources live in, as the object records it: the
//! annotation `openstack.org/kuryr-deployment`, written in the object's create so nothing exists in
//! OpenStack before the record does. An object without it was made by upstream kuryr-kubernetes
//! (or a kuryr-rs without placement) in the only deployment there was: the default one.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kuryr_crds::names::annotations::DEPLOYMENT;

use crate::openstack::DEFAULT_DEPLOYMENT;

/// The deployment `obj` records (the default one when it records none).
pub fn recorded_deployment(obj: &impl ResourceExt) -> String {
    match obj.annotations().get(DEPLOYMENT) {
        Some(d) if !d.trim().is_empty() => d.trim().to_string(),
        _ => DEFAULT_DEPLOYMENT.to_string(),
    }
}

/// The annotations an object placed in `deployment` is created with.
pub fn annotations(deployment: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(DEPLOYMENT.to_string(), deployment.to_string())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    /// Any object: the record is read the same way on every kind.
    fn knp(annotations: Option<BTreeMap<String, String>>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("deny".into()),
                annotations,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn what_a_create_records_is_read_back_and_no_record_is_the_default_deployment() {
        assert_eq!(recorded_deployment(&knp(Some(annotations("west")))), "west");
        assert_eq!(
            recorded_deployment(&knp(None)),
            DEFAULT_DEPLOYMENT,
            "upstream objects are adopted"
        );
        let blank = BTreeMap::from([(DEPLOYMENT.to_string(), " ".to_string())]);
        assert_eq!(recorded_deployment(&knp(Some(blank))), DEFAULT_DEPLOYMENT);
    }
}
