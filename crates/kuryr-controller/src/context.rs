//! The context injected into handlers (kube-rs controller style), built once before anything runs.
//!
//! - [`Platform`]: what everything shares - the Kubernetes client, `kuryr.conf`, the OpenStack
//!   clients of every deployment, metrics, the Event recorder and deployment placement.
//! - [`Context`]: the platform plus the [`Drivers`] chosen from it and what handlers hand each
//!   other ([`PodHandoff`]). Drivers are complete when the context exists (the pool included);
//!   nothing in it is replaced afterwards.

use std::ops::Deref;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, ResourceExt};
use kuryr_config::KuryrConfig;
use kuryr_crds::events::{Events, Reporter};

use crate::drivers::Drivers;
use crate::error::Error;
use crate::k8s::publish_event;
use crate::metrics::Metrics;
use crate::openstack::{DEFAULT_DEPLOYMENT, Deployments};
use crate::placement::kube_store::KubeStore;
use crate::placement::{Binder, BindingKey, Placed, Scheduler};
use crate::services::provisioning::{self, LbWaits, LbWaitsByDeployment};
use crate::wiring::handoff::PodHandoff;

/// Clients, configuration and shared services; cheap to share behind an `Arc`.
pub struct Platform {
    pub kube: Client,
    pub config: Arc<KuryrConfig>,
    pub deployments: Deployments,
    pub metrics: Metrics,
    /// kube-runtime's Event recorder (events.k8s.io/v1, with its own de-duplication into series).
    pub events: Events,
    /// Tags every Neutron resource this cluster's controller creates, so that clusters sharing a
    /// project never touch each other's ports.
    pub cluster_id: String,
    /// Which deployment serves a project, when `[pod_binding] enabled`.
    pub placement: Option<Arc<Binder>>,
    /// The shared waits for load balancers to leave PENDING_*, one poller per deployment.
    lb_waits: Arc<LbWaitsByDeployment>,
    /// This replica's leadership term (set while it leads).
    pub term: crate::leader::Term,
    /// Ports' security group changes and releases, one per port at a time.
    pub port_groups: Arc<crate::drivers::port_groups::PortGroups>,
}

impl Platform {
    pub fn new(kube: Client, config: Arc<KuryrConfig>, deployments: Deployments, metrics: Metrics) -> Self {
        let reporter = Reporter {
            controller: "kuryr-controller".into(),
            instance: std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()),
        };
        let events = Events::new(kube.clone(), reporter, config.kubernetes.use_events);
        let cluster_id = config.kubernetes.cluster_id.clone();
        let placement = config.pod_binding.enabled.then(|| {
            // Objects are overlaid once their watch delivers them (placement/watch.rs).
            let (candidates, _) =
                crate::placement::candidates::build(&config, &[], k8s_openapi::jiff::Timestamp::now());
            Arc::new(Binder::awaiting_objects(
                Scheduler::new(&config.pod_binding),
                candidates,
                Arc::new(KubeStore::new(kube.clone())),
            ))
        });
        let lb_waits = Arc::new(LbWaitsByDeployment::new(provisioning::settings(
            config.neutron_defaults.lbaas_activation_timeout,
        )));
        Self {
            kube,
            config,
            deployments,
            metrics,
            events,
            cluster_id,
            placement,
            lb_waits,
            term: crate::leader::Term::default(),
            port_groups: Arc::default(),
        }
    }

    /// The shared load balancer waits of `deployment` (the one Octavia poller for all its Services).
    pub fn lb_waits(&self, deployment: &str) -> Result<LbWaits, Error> {
        Ok(self
            .lb_waits
            .get(deployment, self.deployments.octavia(deployment)?))
    }

    /// `project`'s id in `deployment` (deployments with their own Keystone map it).
    pub async fn project_in(&self, deployment: &str, project: &str) -> Result<String, Error> {
        match &self.placement {
            Some(b) => b.project_id(deployment, project).await,
            None => Ok(project.to_string()),
        }
    }

    /// The OpenStack deployment serving `namespace`'s project, and the project's id there: with
    /// `[pod_binding] enabled` the placement scheduler decides and records it per (project, group
    /// the namespace asks for); otherwise the default deployment.
    ///
    /// The namespace is only read when the scheduler is on (its annotations carry the requested
    /// zone and affinity), so the default path costs no API call. What the namespace's owner must
    /// know (a malformed annotation, no deployment passing, a rebinding) is an Event on it.
    pub async fn bind(&self, project_id: &str, namespace: &str) -> Result<Placed, Error> {
        let Some(binder) = &self.placement else {
            return Ok(Placed {
                deployment: DEFAULT_DEPLOYMENT.to_string(),
                project_id: project_id.to_string(),
                rebound: None,
                stuck: None,
            });
        };
        let Some(ns) = Api::<Namespace>::all(self.kube.clone())
            .get_opt(namespace)
            .await?
        else {
            return Err(Error::Gone(format!("namespace {namespace}")));
        };
        let result = match crate::placement::group_of(ns.annotations()) {
            Ok(group) => {
                binder
                    .bind(&BindingKey {
                        project: project_id.to_string(),
                        group,
                    })
                    .await
            }
            Err(e) => Err(e),
        };
        match &result {
            Err(e) if e.is_user_visible() => {
                publish_event(&self.events, &ns, true, e.label(), &e.to_string()).await;
            }
            Ok(p) => {
                if let Some((from, why)) = &p.rebound {
                    // Distinct reasons: the Recorder folds Events of one reason into a series.
                    let (reason, msg) = match from {
                        Some(f) => (
                            "ProjectMoved",
                            format!(
                                "project {project_id} moved from deployment {f} to {}: {why}",
                                p.deployment
                            ),
                        ),
                        None => (
                            "ProjectBound",
                            format!("project {project_id} bound to deployment {}", p.deployment),
                        ),
                    };
                    publish_event(&self.events, &ns, false, reason, &msg).await;
                }
                if let Some(why) = &p.stuck {
                    publish_event(&self.events, &ns, true, "BindingStuck", why).await;
                }
            }
            Err(_) => {}
        }
        result
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
    /// Pods the `vif` handler hands to the `kuryrport` handler with their new KuryrPort.
    pub pod_handoff: PodHandoff,
    /// Uids of running pods whose KuryrPort was deleted and is kept, ports and all, until the pod
    /// is: the `vif` handler runs its finalizer again then. (A restart lists the KuryrPort again.)
    pub kept_kuryrports: std::sync::Mutex<std::collections::HashSet<String>>,
    /// One writer of a KuryrLoadBalancer's `spec.endpointSlices` at a time, per Service (namespace,
    /// name): the `endpoints` handler and the `service` handler's catch-up after a create each
    /// list the slices and write them, and an older list written last would win.
    pub slice_writes: crate::keyed_locks::KeyedLocks<(String, String)>,
}

impl Context {
    /// Chooses every driver (the pool included) from the platform's configuration.
    pub fn build(platform: Arc<Platform>) -> Result<Arc<Self>, Error> {
        let drivers = Drivers::from_config(&platform)?;
        Ok(Arc::new(Self {
            platform,
            drivers,
            pod_handoff: PodHandoff::default(),
            kept_kuryrports: std::sync::Mutex::default(),
            slice_writes: Default::default(),
        }))
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
