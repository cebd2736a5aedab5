//! A namespace's KuryrNetwork (`spec.nsName`, `projectId`, `nsLabels`), which the `kuryrnetwork`
//! handler turns into a Neutron network, subnet and router interface: made when the namespace
//! first needs one, as upstream makes it. A namespace holding no pod on the pods' network, no
//! Service and no NetworkPolicy (an empty one, one of host-network pods only: `kube-node-lease`,
//! many of a distribution's system namespaces) costs no network, subnet, router interface nor
//! share of the subnet pool.
//!
//! Two callers make it: the `namespace` handler, for a namespace that already holds such a pod
//! (a controller starting on a cluster, a KuryrNetwork deleted by hand), and the `namespace`
//! subnets driver, for the first pod, Service or NetworkPolicy of a namespace that has none (and
//! for the endpoints' namespaces of a Service in L2 member mode). A Service or policy waits for
//! the network to be placed and goes with it: placed on their own, they could land in another
//! OpenStack deployment than the pods that come later.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kuryr_crds::names::finalizers;
use kuryr_crds::{KuryrNetwork, KuryrNetworkSpec};

use super::project::ProjectDriver;
use crate::error::Error;

pub struct NamespaceNetworks {
    kube: kube::Client,
    /// `namespace_project_driver`: the project of the namespace's network.
    project: Arc<dyn ProjectDriver>,
}

/// What asking for a namespace's KuryrNetwork found.
#[derive(Debug, PartialEq, Eq)]
pub enum Made {
    /// Made now, or by a concurrent caller.
    Created,
    /// The namespace is gone or being deleted: none is made.
    NamespaceGone,
}

impl NamespaceNetworks {
    pub fn new(kube: kube::Client, project: Arc<dyn ProjectDriver>) -> Self {
        Self { kube, project }
    }

    /// Whether `namespace` holds a pod on the pods' network (upstream's test: any pod not on the
    /// host network, finished ones included). One list of at most one pod, filtered by the API
    /// server.
    pub async fn needed_by_pods(&self, namespace: &str) -> Result<bool, Error> {
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), namespace);
        // `!=true`, not `=false`: an API server that leaves the unset field out of the
        // comparison still selects pods that never set it.
        let list = pods
            .list_metadata(&ListParams::default().fields("spec.hostNetwork!=true").limit(1))
            .await?;
        Ok(!list.items.is_empty())
    }

    /// Makes the KuryrNetwork of `ns` (a concurrent maker's is as good).
    pub async fn create(&self, ns: &Namespace) -> Result<Made, Error> {
        if ns.metadata.deletion_timestamp.is_some() {
            return Ok(Made::NamespaceGone);
        }
        let name = ns.name_any();
        let project = self.project.project_for_namespace(&name).await?;
        let kn = KuryrNetwork {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(name.clone()),
                finalizers: Some(vec![finalizers::KURYRNETWORK.to_string()]),
                ..Default::default()
            },
            spec: KuryrNetworkSpec {
                ns_name: name.clone(),
                project_id: project,
                ns_labels: ns.labels().clone(),
            },
            status: None,
        };
        let api: Api<KuryrNetwork> = Api::namespaced(self.kube.clone(), &name);
        match api.create(&PostParams::default(), &kn).await {
            Ok(_) => {
                tracing::info!(namespace = %name, "KuryrNetwork created");
                Ok(Made::Created)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Made::Created),
            Err(e) if crate::k8s::is_namespace_terminating(&e) => Ok(Made::NamespaceGone),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes the KuryrNetwork of the namespace named `namespace`, read first.
    pub async fn create_for(&self, namespace: &str) -> Result<Made, Error> {
        match Api::<Namespace>::all(self.kube.clone())
            .get_opt(namespace)
            .await?
        {
            Some(ns) => self.create(&ns).await,
            None => Ok(Made::NamespaceGone),
        }
    }
}
