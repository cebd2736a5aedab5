//! `kuryrnetwork` handler: a Neutron network, a subnet from `[namespace_subnet] pod_subnet_pool`
//! and an interface on `[namespace_subnet] pod_router` per namespace; all removed on finalize.
//!
//! Each step looks its resource up by tag before creating it and records it in the status right
//! after, so a crash between two steps never creates a second network or subnet.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kuryr_crds::names::{annotations, finalizers};
use kuryr_crds::{KuryrNetwork, KuryrNetworkStatus};
use kuryr_neutron::{ListFilter, NetworkCreate, RouterInterfaceSpec, SubnetCreate, Taggable};
use serde_json::json;

use crate::context::Context;
use crate::drivers::PortSpec;
use crate::drivers::subnets::recorded_deployment;
use crate::error::Error;
use crate::k8s::{add_finalizer, publish_event, remove_finalizer};
use crate::pipeline::ResourceEventHandler;

pub struct KuryrNetworkHandler {
    ctx: Arc<Context>,
}

fn ns_tag(ns: &str) -> String {
    format!("kuryr-rs.namespace={ns}")
}

impl KuryrNetworkHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }

    async fn patch_status(&self, kn: &KuryrNetwork, status: &KuryrNetworkStatus) -> Result<(), Error> {
        let api: Api<KuryrNetwork> =
            Api::namespaced(self.ctx.kube.clone(), &kn.namespace().unwrap_or_default());
        let patch = json!({"status": status});
        api.patch(&kn.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Records `deployment` on the KuryrNetwork (a merge patch with the read resourceVersion, so
    /// two workers never record different deployments).
    async fn record_deployment(&self, kn: &KuryrNetwork, deployment: &str) -> Result<KuryrNetwork, Error> {
        let api: Api<KuryrNetwork> =
            Api::namespaced(self.ctx.kube.clone(), &kn.namespace().unwrap_or_default());
        let patch = json!({"metadata": {
            "resourceVersion": kn.resource_version(),
            "annotations": {annotations::DEPLOYMENT: deployment},
        }});
        Ok(api
            .patch(&kn.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?)
    }

    /// The KuryrNetwork's deployment is no longer in `kuryr.conf`: nothing can reach its Neutron,
    /// so the finalizer goes (the namespace is not stuck) after a Warning Event naming what stays
    /// behind for the operator to clean up.
    async fn drain_unconfigured(&self, kn: &KuryrNetwork, deployment: &str) -> Result<(), Error> {
        self.tell_unconfigured(kn, deployment).await;
        remove_finalizer(&self.ctx.kube, kn, finalizers::KURYRNETWORK).await
    }

    /// A Warning Event on the namespace (its own namespace may be terminating, where no Event can
    /// be created) and a WARN line.
    async fn tell_unconfigured(&self, kn: &KuryrNetwork, deployment: &str) {
        let st = kn.status.clone().unwrap_or_default();
        let msg = format!(
            "OpenStack deployment {deployment:?} is no longer configured: network {}, subnet {} and the \
             namespace's security group were left in it",
            st.net_id.as_deref().unwrap_or("-"),
            st.subnet_id.as_deref().unwrap_or("-"),
        );
        tracing::warn!(kuryrnetwork = %kn.name_any(), deployment, "{msg}");
        match Api::<Namespace>::all(self.ctx.kube.clone())
            .get_opt(&kn.spec.ns_name)
            .await
        {
            Ok(Some(ns)) => publish_event(&self.ctx.events, &ns, true, "DeploymentRemoved", &msg).await,
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not read namespace {}", kn.spec.ns_name),
        }
    }

    /// The namespace's network in `project`, tagged as ours, else one of its name left
    /// untagged: Neutron takes no tags in a network create, so a crash between the create and
    /// the tagging leaves one, adopted rather than duplicated. Scoped by project too:
    /// the same cluster tags in another project (another cluster given the same cluster_id, or a
    /// namespace moved to another project) are not this namespace's network. Adopted only where
    /// the cluster_id claim is confirmed (`Deployments::adoptable`).
    async fn existing_network(
        &self,
        client: &kuryr_neutron::NeutronClient,
        deployment: &str,
        ns: &str,
        project: &str,
    ) -> Result<Option<kuryr_neutron::Network>, Error> {
        let tagged = client
            .list_networks(&ListFilter::new().tags(self.tags(ns)).project_id(project))
            .await?;
        let found = match tagged.into_iter().next() {
            Some(n) => Some(n),
            None => client
                .list_networks(&ListFilter::new().name(format!("ns/{ns}-net")).project_id(project))
                .await?
                .into_iter()
                .find(|n| n.tags.is_empty()),
        };
        if let Some(n) = &found {
            self.ctx
                .deployments
                .adoptable(deployment, || format!("network {} of namespace {ns}", n.id))?;
        }
        Ok(found)
    }

    fn tags(&self, ns: &str) -> Vec<String> {
        let mut t = self.ctx.resource_tags();
        t.push(ns_tag(ns));
        t
    }
}

/// The namespace's subnet on `net_id`: tagged as ours, else one of its name left untagged by a
/// crash between the create and the tagging.
async fn existing_subnet(
    client: &kuryr_neutron::NeutronClient,
    net_id: &str,
    ns: &str,
) -> Result<Option<kuryr_neutron::Subnet>, Error> {
    let tag = ns_tag(ns);
    let tagged = client
        .list_subnets(&ListFilter::new().network_id(net_id).tags([tag.as_str()]))
        .await?;
    if let Some(s) = tagged.into_iter().next() {
        return Ok(Some(s));
    }
    Ok(client
        .list_subnets(
            &ListFilter::new()
                .network_id(net_id)
                .name(format!("ns/{ns}-subnet")),
        )
        .await?
        .into_iter()
        .find(|s| s.tags.is_empty()))
}

#[async_trait]
impl ResourceEventHandler for KuryrNetworkHandler {
    type Object = KuryrNetwork;

    fn name(&self) -> &'static str {
        "kuryrnetwork"
    }

    async fn on_present(&self, kn: &KuryrNetwork) -> Result<(), Error> {
        let kn = add_finalizer(&self.ctx.kube, kn, finalizers::KURYRNETWORK).await?;
        let ns = kn.spec.ns_name.clone();
        // Placed once: the deployment is recorded before anything is created in it, and the
        // namespace stays there (and is finalized there) whatever its project's binding becomes.
        let (kn, deployment) = match recorded_deployment(&kn) {
            Some(d) => (kn, d),
            None => {
                let placed = match self.ctx.bind(&kn.spec.project_id, &ns).await {
                    Ok(p) => p,
                    // Told on the namespace already (Platform::bind); retrying cannot mend it.
                    Err(e) if e.is_user_visible() && !e.is_retryable() => {
                        tracing::warn!(namespace = %ns, error = %e, "namespace not placed: told its owner with a Warning Event");
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                };
                let kn = self.record_deployment(&kn, &placed.deployment).await?;
                (kn, placed.deployment)
            }
        };
        let project = self.ctx.project_in(&deployment, &kn.spec.project_id).await?;
        let Ok(client) = self.ctx.deployments.client(&deployment) else {
            // Its deployment left kuryr.conf: nothing to build there any more.
            self.tell_unconfigured(&kn, &deployment).await;
            return Ok(());
        };
        let cfg = self.ctx.config.deployment_defaults(&deployment);
        let mut status = kn.status.clone().unwrap_or_default();
        let cluster_tags = self.tags(&ns);

        if status.net_id.is_none() {
            // Scoped by project too: the same cluster tags in another project (another cluster
            // given the same cluster_id, or a namespace moved to another project) are not this
            // namespace's network; adopting one attached its subnet to a router it was not on.
            let name = format!("ns/{ns}-net");
            let net = match self.existing_network(client, &deployment, &ns, &project).await? {
                Some(n) if !n.tags.is_empty() => n,
                untagged => {
                    let n = match untagged {
                        Some(n) => n,
                        None => {
                            client
                                .create_network(&NetworkCreate {
                                    name: Some(name),
                                    project_id: Some(project.clone()),
                                    ..Default::default()
                                })
                                .await?
                        }
                    };
                    client
                        .replace_tags(Taggable::Network, &n.id, &cluster_tags)
                        .await?;
                    n
                }
            };
            status.net_id = Some(net.id);
            self.patch_status(&kn, &status).await?;
        }
        let net_id = status.net_id.clone().unwrap_or_default();
        if status.subnet_id.is_none() {
            let pool = cfg.pod_subnet_pool.clone().ok_or_else(|| {
                Error::Config(
                    "[namespace_subnet] pod_subnet_pool must be set for the namespace subnet driver".into(),
                )
            })?;
            let name = format!("ns/{ns}-subnet");
            let subnet = match existing_subnet(client, &net_id, &ns).await? {
                Some(s) if !s.tags.is_empty() => s,
                untagged => {
                    let s = match untagged {
                        Some(s) => s,
                        None => {
                            let sp = client.get_subnetpool(&pool).await?;
                            client
                                .create_subnet(&SubnetCreate {
                                    network_id: net_id.clone(),
                                    ip_version: sp.ip_version,
                                    name: Some(name),
                                    project_id: Some(project.clone()),
                                    subnetpool_id: Some(pool),
                                    ..Default::default()
                                })
                                .await?
                        }
                    };
                    client
                        .replace_tags(Taggable::Subnet, &s.id, &cluster_tags)
                        .await?;
                    s
                }
            };
            status.subnet_id = Some(subnet.id);
            status.subnet_cidr = Some(subnet.cidr);
            self.patch_status(&kn, &status).await?;
        }
        if status.router_id.is_none()
            && let Some(router) = cfg.pod_router.clone()
        {
            let subnet_id = status.subnet_id.clone().unwrap_or_default();
            let attached = client
                .list_ports(&ListFilter::new().device_id(&router).fixed_ip_subnet(&subnet_id))
                .await?;
            if attached.is_empty() {
                client
                    .add_router_interface(&router, &RouterInterfaceSpec::Subnet { subnet_id })
                    .await?;
            }
            status.router_id = Some(router);
            status.ns_labels = Some(kn.spec.ns_labels.clone());
            status.populated = Some(false);
            self.patch_status(&kn, &status).await?;
        }
        // Pre-populate the new subnet's pools on every node, once (docs/architecture.md#port-pools).
        if status.populated != Some(true)
            && let Some(pools) = &self.ctx.drivers.pools
            && let Some(subnet_id) = status.subnet_id.clone()
        {
            let network = self
                .ctx
                .drivers
                .subnet_cache
                .network_of_subnet(&deployment, &subnet_id)
                .await?;
            let sgs = self
                .ctx
                .drivers
                .security_groups
                .security_groups(&deployment, &project, &ns)
                .await?;
            pools
                .prepopulate(&PortSpec::new(deployment.clone(), project.clone(), network, sgs))
                .await?;
            status.populated = Some(true);
            self.patch_status(&kn, &status).await?;
        }
        Ok(())
    }

    async fn on_finalize(&self, kn: &KuryrNetwork) -> Result<(), Error> {
        // Release where the network was made, whatever the project's binding is now.
        let Some(deployment) = recorded_deployment(kn) else {
            // Never placed: nothing was created anywhere.
            return remove_finalizer(&self.ctx.kube, kn, finalizers::KURYRNETWORK).await;
        };
        let Ok(client) = self.ctx.deployments.client(&deployment) else {
            return self.drain_unconfigured(kn, &deployment).await;
        };
        let mut status = kn.status.clone().unwrap_or_default();
        // What was made but not recorded (a crash, or a failed status write, right after a
        // create) is looked up as `on_present` would have adopted it: else the network leaks and
        // an unrecorded router interface keeps its deletion refused (409) for ever.
        if status.net_id.is_none() || status.subnet_id.is_none() || status.router_id.is_none() {
            let ns = &kn.spec.ns_name;
            if status.net_id.is_none() {
                let project = self.ctx.project_in(&deployment, &kn.spec.project_id).await?;
                status.net_id = self
                    .existing_network(client, &deployment, ns, &project)
                    .await?
                    .map(|n| n.id);
            }
            if let (None, Some(net_id)) = (&status.subnet_id, &status.net_id) {
                status.subnet_id = existing_subnet(client, net_id, ns).await?.map(|s| s.id);
            }
            if status.router_id.is_none() {
                // Removing an interface never added is a 404, taken as done below.
                status.router_id = self
                    .ctx
                    .config
                    .deployment_defaults(&deployment)
                    .pod_router
                    .clone();
            }
        }
        if let (Some(router), Some(subnet_id)) = (&status.router_id, &status.subnet_id) {
            match client
                .remove_router_interface(
                    router,
                    &RouterInterfaceSpec::Subnet {
                        subnet_id: subnet_id.clone(),
                    },
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(subnet_id) = &status.subnet_id {
            self.ctx.drivers.subnet_cache.forget(&deployment, subnet_id).await;
        }
        if let Some(net_id) = &status.net_id {
            // Spare pool ports are on the network too: pools on it go first.
            if let Some(pools) = &self.ctx.drivers.pools {
                pools.drop_network(&deployment, net_id).await?;
            }
            // Ports of pods in the namespace are released by their KuryrPorts first; a port still
            // there makes Neutron refuse (409), and the retry comes back once they are gone.
            match client.delete_network(net_id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                // NetworkInUse: retried until the pods' ports are released.
                Err(e) if e.status() == Some(409) => {
                    return Err(Error::not_ready(format!("network {net_id} still has ports: {e}")));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let project = self.ctx.project_in(&deployment, &kn.spec.project_id).await?;
        self.ctx
            .drivers
            .security_groups
            .release_namespace(&deployment, &project, &kn.spec.ns_name)
            .await?;
        remove_finalizer(&self.ctx.kube, kn, finalizers::KURYRNETWORK).await?;
        Ok(())
    }
}
