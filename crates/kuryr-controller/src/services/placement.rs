//! Which OpenStack deployment a Service's load balancer lives in.
//!
//! A KuryrLoadBalancer is placed once, when the `service` handler creates it: the deployment goes into
//! its `openstack.org/kuryr-deployment` annotation in that same create, so nothing is ever made in
//! Octavia before the record exists. Everything later (reconcile, member updates, repair, the public
//! IP, finalization, the orphan sweep) reads the record and goes there, whatever the project's binding
//! has become. One without the annotation was made by upstream kuryr-kubernetes (or a kuryr-rs without
//! placement) in the only deployment there was: the default one.

use kube::ResourceExt;
use kuryr_crds::KuryrLoadBalancer;
use kuryr_crds::names::annotations::DEPLOYMENT;

use crate::openstack::DEFAULT_DEPLOYMENT;

/// The deployment `klb`'s load balancer lives in.
pub fn recorded_deployment(klb: &KuryrLoadBalancer) -> String {
    match klb.annotations().get(DEPLOYMENT) {
        Some(d) if !d.trim().is_empty() => d.trim().to_string(),
        _ => DEFAULT_DEPLOYMENT.to_string(),
    }
}

/// The annotations a new KuryrLoadBalancer placed in `deployment` is created with.
pub fn annotations(deployment: &str) -> std::collections::BTreeMap<String, String> {
    std::collections::BTreeMap::from([(DEPLOYMENT.to_string(), deployment.to_string())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn klb(annotations: Option<&[(&str, &str)]>) -> KuryrLoadBalancer {
        KuryrLoadBalancer {
            metadata: ObjectMeta {
                name: Some("web".into()),
                annotations: annotations
                    .map(|a| a.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            spec: Default::default(),
            status: None,
        }
    }

    #[test]
    fn the_annotation_names_the_deployment_and_its_absence_means_the_default_one() {
        assert_eq!(recorded_deployment(&klb(Some(&[(DEPLOYMENT, "east")]))), "east");
        assert_eq!(
            recorded_deployment(&klb(None)),
            DEFAULT_DEPLOYMENT,
            "an upstream object is adopted in the default deployment"
        );
        assert_eq!(
            recorded_deployment(&klb(Some(&[(DEPLOYMENT, " ")]))),
            DEFAULT_DEPLOYMENT
        );
        let mut placed = klb(None);
        placed.metadata.annotations = Some(annotations("west"));
        assert_eq!(
            recorded_deployment(&placed),
            "west",
            "what a create records is read back"
        );
    }
}
