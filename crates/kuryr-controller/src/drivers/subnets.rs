//! Subnet drivers: the network and subnets a pod's default interface is created on.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use kube::Api;
use kuryr_crds::KuryrNetwork;
use tokio::sync::RwLock;

use super::NetworkInfo;
use crate::error::Error;
use crate::openstack::Deployments;

#[async_trait]
pub trait SubnetsDriver: Send + Sync {
    async fn network_for_namespace(
        &self,
        deployment: &str,
        namespace: &str,
    ) -> Result<Arc<NetworkInfo>, Error>;
}

/// (deployment, subnet id) -> network info.
type NetworkCache = HashMap<(String, String), Arc<NetworkInfo>>;

/// Subnet/network details rarely change; caching them keeps the pod path to zero extra Neutron
/// calls after the first pod of a subnet (upstream caches for `[subnet_caching] cache_time` too).
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
        if let Some(n) = self.cache.read().await.get(&key) {
            return Ok(n.clone());
        }
        let client = self.deployments.client(deployment)?;
        let subnet = client.get_subnet(subnet_id).await.map_err(|e| {
            if e.is_not_found() {
                Error::invalid("subnet", format!("Neutron subnet {subnet_id} does not exist"))
            } else {
                e.into()
            }
        })?;
        let network = client.get_network(&subnet.network_id).await?;
        let info = Arc::new(NetworkInfo {
            id: network.id,
            name: network.name,
            mtu: network.mtu,
            subnets: vec![subnet],
        });
        self.cache.write().await.insert(key, info.clone());
        Ok(info)
    }

    pub async fn forget(&self, deployment: &str, subnet_id: &str) {
        self.cache
            .write()
            .await
            .remove(&(deployment.to_string(), subnet_id.to_string()));
    }
}

/// `default`: `[neutron_defaults] pod_subnet` for every pod.
pub struct DefaultSubnets {
    subnet_id: String,
    cache: SubnetCache,
}

impl DefaultSubnets {
    pub fn new(subnet_id: Option<&str>, cache: SubnetCache) -> Result<Self, Error> {
        match subnet_id {
            Some(s) if !s.is_empty() => Ok(Self {
                subnet_id: s.to_string(),
                cache,
            }),
            _ => Err(Error::Config(
                "[neutron_defaults] pod_subnet must be set for the default subnets driver".into(),
            )),
        }
    }
}

#[async_trait]
impl SubnetsDriver for DefaultSubnets {
    async fn network_for_namespace(
        &self,
        deployment: &str,
        _namespace: &str,
    ) -> Result<Arc<NetworkInfo>, Error> {
        self.cache.network_of_subnet(deployment, &self.subnet_id).await
    }
}

/// `namespace`: the subnet the `kuryrnetwork` handler created for the pod's namespace. Until the
/// KuryrNetwork is populated the pod waits (ResourceNotReady).
pub struct NamespaceSubnets {
    kube: kube::Client,
    cache: SubnetCache,
}

impl NamespaceSubnets {
    pub fn new(kube: kube::Client, cache: SubnetCache) -> Self {
        Self { kube, cache }
    }
}

#[async_trait]
impl SubnetsDriver for NamespaceSubnets {
    async fn network_for_namespace(
        &self,
        deployment: &str,
        namespace: &str,
    ) -> Result<Arc<NetworkInfo>, Error> {
        let kn = Api::<KuryrNetwork>::namespaced(self.kube.clone(), namespace)
            .get_opt(namespace)
            .await?
            .ok_or_else(|| Error::not_ready(format!("KuryrNetwork {namespace} not created yet")))?;
        let subnet = kn
            .status
            .as_ref()
            .and_then(|s| s.subnet_id.clone())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Error::not_ready(format!("KuryrNetwork {namespace} has no subnet yet")))?;
        self.cache.network_of_subnet(deployment, &subnet).await
    }
}
