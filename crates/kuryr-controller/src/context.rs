//! The context injected into handlers (kube-rs controller style), built once before anything runs.
//!
//! - [`Platform`]: what everything shares - the Kubernetes client, `kuryr.conf`, the OpenStack
//!   clients of every deployment, metrics, the Event recorder and deployment placement.
//! - [`Context`]: the platform plus the [`Drivers`] chosen from it. Drivers are complete when the
//!   context exists (the pool included); nothing in it is replaced afterwards.

use std::ops::Deref;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, ResourceExt};
use kuryr_config::KuryrConfig;
use kuryr_crds::events::{Recorder, Reporter};

use crate::drivers::Drivers;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::openstack::{DEFAULT_DEPLOYMENT, Deployments};
use crate::placement::store::ConfigMapStore;
use crate::placement::{AFFINITY_ANNOTATION, AZ_ANNOTATION, Binder, BindingRequest, Candidate, Scheduler};

/// Clients, configuration and shared services; cheap to share behind an `Arc`.
pub struct Platform {
    pub kube: Client,
    pub config: Arc<KuryrConfig>,
    pub deployments: Deployments,
    pub metrics: Metrics,
    /// kube-runtime's Event recorder (events.k8s.io/v1, with its own de-duplication into series).
    pub events: Recorder,
    /// Tags every Neutron resource this cluster's controller creates, so that clusters sharing a
    /// project never touch each other's ports.
    pub cluster_id: String,
    /// Which deployment serves a project, when `[pod_binding] enabled`.
    pub placement: Option<Arc<Binder>>,
}

impl Platform {
    pub fn new(kube: Client, config: Arc<KuryrConfig>, deployments: Deployments, metrics: Metrics) -> Self {
        let reporter = Reporter {
            controller: "kuryr-controller".into(),
            instance: std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()),
        };
        let events = Recorder::new(kube.clone(), reporter);
        let cluster_id = config.kubernetes.cluster_id.clone();
        let placement = config.pod_binding.enabled.then(|| {
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
            placement,
        }
    }

    /// Where `project`'s existing resources live (its current placement), for releasing them.
    pub async fn bound_deployment(&self, project_id: &str) -> Result<String, Error> {
        match &self.placement {
            Some(b) => Ok(b
                .current(project_id)
                .await?
                .unwrap_or_else(|| DEFAULT_DEPLOYMENT.to_string())),
            None => Ok(DEFAULT_DEPLOYMENT.to_string()),
        }
    }

    /// The OpenStack deployment serving `namespace`'s project: with `[pod_binding] enabled` the
    /// placement scheduler decides and records it; otherwise the default deployment.
    ///
    /// The namespace is only read when the scheduler is on (its annotations carry the requested
    /// zone and affinity), so the default path costs no API call.
    pub async fn bind(&self, project_id: &str, namespace: &str) -> Result<String, Error> {
        let Some(binder) = &self.placement else {
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
                .map(|a| crate::placement::parse_affinity(a))
                .transpose()?
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

/// The platform and the drivers `kuryr.conf` chose, as every handler receives them.
pub struct Context {
    platform: Arc<Platform>,
    pub drivers: Drivers,
}

impl Context {
    /// Chooses every driver (the pool included) from the platform's configuration.
    pub fn build(platform: Arc<Platform>) -> Result<Arc<Self>, Error> {
        let drivers = Drivers::from_config(&platform)?;
        Ok(Arc::new(Self { platform, drivers }))
    }

    pub fn platform(&self) -> &Arc<Platform> {
        &self.platform
    }
}

impl Deref for Context {
    type Target = Platform;

    fn deref(&self) -> &Platform {
        &self.platform
    }
}
