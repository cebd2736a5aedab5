//! The context injected into handlers and drivers (kube-rs controller style).

use std::sync::Arc;

use kube::Client;
use kuryr_config::KuryrConfig;

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
}

impl Context {
    pub fn new(kube: Client, config: Arc<KuryrConfig>, deployments: Deployments, metrics: Metrics) -> Self {
        let events = EventRecorder::new(kube.clone(), "kuryr-controller");
        let cluster_id = config.kubernetes.cluster_id.clone();
        Self {
            kube,
            config,
            deployments,
            metrics,
            events,
            cluster_id,
        }
    }

    /// The OpenStack deployment serving a project. With a single deployment every project lives
    /// there; the dynamic binding scheduler (seed 001) replaces this choice when enabled.
    pub fn deployment_for(&self, _project_id: &str) -> &str {
        DEFAULT_DEPLOYMENT
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
