//! Subnet drivers: the network and subnets a pod's default interface is created on.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use kube::Api;
use kuryr_config::KuryrConfig;
use kuryr_crds::KuryrNetwork;
use tokio::sync::{OnceCell, RwLock};

use super::NetworkInfo;
use super::namespace_networks::{Made, NamespaceNetworks};
use crate::error::Error;
use crate::openstack::Deployments;

#[async_trait]
pub trait SubnetsDriver: Send + Sync {
    async fn network_for_namespace(
        &self,
        deployment: &str,
        namespace: &str,
    ) -> Result<Arc<NetworkInfo>, Error>;

    /// The deployment `namespace`'s own network lives in, when the driver gives namespaces their
    /// own network (None: the project's binding decides).
    async fn deployment_of_namespace(&self, _namespace: &str) -> Result<Option<String>, Error> {
        Ok(None)
    }
}

/// (deployment, subnet id) -> network info.
type NetworkCache = HashMap<(String, String), Arc<OnceCell<Arc<NetworkInfo>>>>;

/// Subnet/network details rarely change; caching them keeps the pod path to zero extra Neutron
/// calls after the first pod of a subnet (upstream caches for `[subnet_caching] cache_time` too).
/// One fetch per subnet even when a burst of pods misses the cache together (single flight).
#[derive(Clone)]
pub struct SubnetCache {
    deployments: Deployments,
    cache: Arc<RwLock<NetworkCache>>,
}

impl SubnetCache {
    pub fn new(deployments: Deployments) -> Self {
        Self {
            deployments,
            cache: Arc::default(),
        }
    }

    /// Network info of `subnet_id` (the network and just that subnet).
    pub async fn network_of_subnet(
        &self,
        deployment: &str,
        subnet_id: &str,
    ) -> Result<Arc<NetworkInfo>, Error> {
        let key = (deployment.to_string(), subnet_id.to_string());
        let cell = self.cache.write().await.entry(key).or_default().clone();
        let info = cell
            .get_or_try_init(|| async {
                let client = self.deployments.client(deployment)?;
                let subnet = client.get_subnet(subnet_id).await.map_err(|e| {
                    if e.is_not_found() {
                        Error::invalid("subnet", format!("Neutron subnet {subnet_id} does not exist"))
                    } else {
                        Error::from(e)
                    }
                })?;
                let network = client.get_network(&subnet.network_id).await?;
                Ok::<_, Error>(Arc::new(NetworkInfo {
                    id: network.id,
                    name: network.name,
                    mtu: network.mtu,
                    subnets: vec![subnet],
                }))
            })
            .await?;
        Ok(info.clone())
    }

    pub async fn forget(&self, deployment: &str, subnet_id: &str) {
        self.cache
            .write()
            .await
            .remove(&(deployment.to_string(), subnet_id.to_string()));
    }
}

/// `default`: `[neutron_defaults] pod_subnet` for every pod (or the deployment's own `pod_subnet`
/// when several OpenStack deployments are configured).
pub struct DefaultSubnets {
    config: Arc<KuryrConfig>,
    cache: SubnetCache,
}

impl DefaultSubnets {
    pub fn new(config: Arc<KuryrConfig>, cache: SubnetCache) -> Result<Self, Error> {
        for (name, _) in config.deployments() {
            if name == kuryr_config::DEFAULT_DEPLOYMENT && !config.neutron_defaults.pod_subnets.is_empty() {
                continue;
            }
            if config
                .deployment_defaults(name)
                .pod_subnet
                .as_deref()
                .unwrap_or("")
                .is_empty()
            {
                return Err(Error::Config(format!(
                    "the default subnets driver needs [neutron_defaults] pod_subnet (or pod_subnet in the \
                     section of deployment {name:?})"
                )));
            }
        }
        Ok(Self { config, cache })
    }
}

#[async_trait]
impl SubnetsDriver for DefaultSubnets {
    async fn network_for_namespace(
        &self,
        deployment: &str,
        _namespace: &str,
    ) -> Result<Arc<NetworkInfo>, Error> {
        let several = &self.config.neutron_defaults.pod_subnets;
        if deployment == kuryr_config::DEFAULT_DEPLOYMENT && !several.is_empty() {
            return self.network_of_subnets(deployment, several).await;
        }
        let subnet = self
            .config
            .deployment_defaults(deployment)
            .pod_subnet
            .ok_or_else(|| Error::Config(format!("no pod_subnet for deployment {deployment:?}")))?;
        self.cache.network_of_subnet(deployment, &subnet).await
    }
}

impl DefaultSubnets {
    /// `[neutron_defaults] pod_subnets`: one network with all of them (dual stack), so a port
    /// gets an address on each.
    async fn network_of_subnets(&self, deployment: &str, ids: &[String]) -> Result<Arc<NetworkInfo>, Error> {
        let mut merged: Option<NetworkInfo> = None;
        for id in ids {
            let one = self.cache.network_of_subnet(deployment, id).await?;
            match &mut merged {
                None => merged = Some((*one).clone()),
                Some(m) if m.id == one.id => m.subnets.extend(one.subnets.iter().cloned()),
                Some(m) => {
                    return Err(Error::invalid(
                        "[neutron_defaults] pod_subnets",
                        format!(
                            "subnet {id} is on network {}, the others on {}: a port has addresses on one network",
                            one.id, m.id
                        ),
                    ));
                }
            }
        }
        merged
            .map(Arc::new)
            .ok_or_else(|| Error::Config("[neutron_defaults] pod_subnets is empty".into()))
    }
}

/// `namespace`: the subnet the `kuryrnetwork` handler created for the pod's namespace. Until the
/// KuryrNetwork is populated (its subnet made and, with a `pod_router`, attached: a pod started
/// before would have no route out) the pod waits (ResourceNotReady); a namespace that has none
/// yet (its first pod, Service or policy) gets it made.
pub struct NamespaceSubnets {
    kube: kube::Client,
    config: Arc<KuryrConfig>,
    cache: SubnetCache,
    networks: Arc<NamespaceNetworks>,
}

impl NamespaceSubnets {
    pub fn new(
        kube: kube::Client,
        config: Arc<KuryrConfig>,
        cache: SubnetCache,
        networks: Arc<NamespaceNetworks>,
    ) -> Self {
        Self {
            kube,
            config,
            cache,
            networks,
        }
    }

    async fn read(&self, namespace: &str) -> Result<Option<KuryrNetwork>, Error> {
        Ok(Api::<KuryrNetwork>::namespaced(self.kube.clone(), namespace)
            .get_opt(namespace)
            .await?)
    }

    /// The namespace's KuryrNetwork; made, and waited for, when it has none.
    async fn kuryrnetwork(&self, namespace: &str) -> Result<KuryrNetwork, Error> {
        if let Some(kn) = self.read(namespace).await? {
            return Ok(kn);
        }
        match self.networks.create_for(namespace).await? {
            Made::Created => Err(Error::not_ready(format!(
                "KuryrNetwork {namespace} created for the namespace's first use; its network is being made"
            ))),
            Made::NamespaceGone => Err(Error::Gone(format!("namespace {namespace}"))),
        }
    }
}

#[async_trait]
impl SubnetsDriver for NamespaceSubnets {
    async fn network_for_namespace(
        &self,
        deployment: &str,
        namespace: &str,
    ) -> Result<Arc<NetworkInfo>, Error> {
        let kn = self.kuryrnetwork(namespace).await?;
        let status = kn.status.as_ref();
        let subnet = status
            .and_then(|s| s.subnet_id.clone())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Error::not_ready(format!("KuryrNetwork {namespace} has no subnet yet")))?;
        if self.config.deployment_defaults(deployment).pod_router.is_some()
            && status.and_then(|s| s.router_id.as_ref()).is_none()
        {
            return Err(Error::not_ready(format!(
                "KuryrNetwork {namespace}'s subnet is not attached to the router yet"
            )));
        }
        self.cache.network_of_subnet(deployment, &subnet).await
    }

    /// A namespace without a KuryrNetwork yet gets one made, and what asked (a Service, a policy)
    /// waits for it to be placed: placed on their own, they could land in another deployment than
    /// the network their pods get later (another binding key, or a binding moved meanwhile).
    async fn deployment_of_namespace(&self, namespace: &str) -> Result<Option<String>, Error> {
        let kn = self.kuryrnetwork(namespace).await?;
        match recorded_deployment(&kn) {
            Some(d) => Ok(Some(d)),
            None => Err(Error::not_ready(format!(
                "KuryrNetwork {namespace} has no deployment yet"
            ))),
        }
    }
}

/// The deployment a KuryrNetwork's resources live in: its annotation, or the default deployment
/// for one that has a network but no annotation (written by upstream or an older kuryr-rs). None
/// while it has neither (not placed yet).
pub fn recorded_deployment(kn: &KuryrNetwork) -> Option<String> {
    use kube::ResourceExt;
    // Read as every other recorded deployment is (`placement::record`): a padded value names the
    // same deployment, never one gone from kuryr.conf whose network would then be drained.
    match kn.annotations().get(kuryr_crds::names::annotations::DEPLOYMENT) {
        Some(d) if !d.trim().is_empty() => Some(d.trim().to_string()),
        _ if kn.status.as_ref().is_some_and(|s| s.net_id.is_some()) => {
            Some(crate::openstack::DEFAULT_DEPLOYMENT.to_string())
        }
        _ => None,
    }
}
