//! The context injected into handlers and drivers (kube-rs controller style).

use std::sync::Arc;

use kube::Client;
use kuryr_config::KuryrConfig;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, ResourceExt};

use crate::binding::store::ConfigMapStore;
use crate::binding::{AFFINITY_ANNOTATION, AZ_ANNOTATION, Binder, BindingRequest, Candidate, Scheduler};
use crate::error::Error;
use crate::k8s::EventRecorder;
use crate::metrics::Metrics;
use crate::openstack::{DEFAULT_DEPLOYMENT, Deployments};

pub struct Context {
    pub kube: Client,
    pub config: Arc<KuryrConfig>,
    pub deployments: Deployments,
    pub metrics: Metrics,
    pub events: EventRecorder,
    /// Tags every Neutron resource this cluster's controller creates, so that clusters sharing a
    /// project never touch each other's ports.
    pub cluster_id: String,
    /// The seed 001 binding scheduler, when `[pod_binding] enabled`.
    pub binder: Option<Arc<Binder>>,
}

impl Context {
    pub fn new(kube: Client, config: Arc<KuryrConfig>, deployments: Deployments, metrics: Metrics) -> Self {
        let events = EventRecorder::new(kube.clone(), "kuryr-controller");
        let cluster_id = config.kubernetes.cluster_id.clone();
        let binder = config.pod_binding.enabled.then(|| {
            let candidates = config
                .deployments()
                .into_iter()
                .enumerate()
                .map(|(order, (name, s))| Candidate {
                    name: name.to_string(),
                    order,
                    availability_zone: s.availability_zone.clone(),
                    resource_affinity: s.resource_affinity.clone(),
                    enabled: s.binding_enabled,
                    usage: None,
                })
                .collect();
            let store = Arc::new(ConfigMapStore::new(
                kube.clone(),
                &config.kubernetes.controller_namespace,
            ));
            Arc::new(Binder::new(
                Scheduler::new(&config.pod_binding),
                candidates,
                store,
            ))
        });
        Self {
            kube,
            config,
            deployments,
            metrics,
            events,
            cluster_id,
            binder,
        }
    }

    /// Where `project`'s existing resources live (its current binding), for releasing them.
    pub async fn bound_deployment(&self, project_id: &str) -> Result<String, Error> {
        match &self.binder {
            Some(b) => Ok(b
                .current(project_id)
                .await?
                .unwrap_or_else(|| DEFAULT_DEPLOYMENT.to_string())),
            None => Ok(DEFAULT_DEPLOYMENT.to_string()),
        }
    }

    /// The OpenStack deployment serving `namespace`'s project: with `[pod_binding] enabled` the
    /// binding scheduler (seed 001) decides and records it; otherwise the default deployment.
    ///
    /// The namespace is only read when the scheduler is on (its annotations carry the requested
    /// zone and affinity), so the default path costs no API call.
    pub async fn bind(&self, project_id: &str, namespace: &str) -> Result<String, Error> {
        let Some(binder) = &self.binder else {
            return Ok(DEFAULT_DEPLOYMENT.to_string());
        };
        let ns = Api::<Namespace>::all(self.kube.clone())
            .get_opt(namespace)
            .await?;
        let annotations = ns.map(|n| n.annotations().clone()).unwrap_or_default();
        let req = BindingRequest {
            project: project_id.to_string(),
            availability_zone: annotations.get(AZ_ANNOTATION).cloned(),
            resource_affinity: annotations
                .get(AFFINITY_ANNOTATION)
                .map(|a| {
                    a.split(',')
                        .filter_map(|kv| {
                            kv.split_once('=')
                                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        binder.bind(&req).await
    }

    /// Tags put on every Neutron resource the controller creates: `[neutron_defaults]
    /// resource_tags`, the kuryr-rs marker and the cluster tag.
    pub fn resource_tags(&self) -> Vec<String> {
        let mut tags = self.config.neutron_defaults.resource_tags.clone();
        tags.push(kuryr_crds::names::neutron::TAG_MANAGED.to_string());
        tags.push(kuryr_crds::names::neutron::cluster_tag(&self.cluster_id));
        tags.sort();
        tags.dedup();
        tags
    }
}
