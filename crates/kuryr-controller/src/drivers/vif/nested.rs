//! What nested drivers share: finding the Neutron port of the VM a node runs in, by the node's
//! InternalIP on one of `[pod_vif_nested] worker_nodes_subnets` (upstream's lookup).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kuryr_neutron::{ListFilter, NeutronClient, Port};
use tokio::sync::RwLock;

use crate::error::Error;

#[derive(Clone)]
pub struct VmPortLookup {
    kube: kube::Client,
    worker_subnets: Vec<String>,
    /// (deployment, node) -> VM port id. A VM keeps its port for life.
    cache: Arc<RwLock<HashMap<(String, String), String>>>,
}

impl VmPortLookup {
    pub fn new(kube: kube::Client, worker_subnets: Vec<String>) -> Self {
        Self {
            kube,
            worker_subnets,
            cache: Arc::default(),
        }
    }

    async fn node_ips(&self, node: &str) -> Result<Vec<String>, Error> {
        let n = Api::<Node>::all(self.kube.clone()).get(node).await?;
        let ips: Vec<String> = n
            .status
            .and_then(|s| s.addresses)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .collect();
        if ips.is_empty() {
            return Err(Error::not_ready(format!(
                "node {node} has no InternalIP address yet"
            )));
        }
        Ok(ips)
    }

    /// The VM port of `node` (re-read from Neutron, so trunk details are current).
    pub async fn vm_port(&self, client: &NeutronClient, deployment: &str, node: &str) -> Result<Port, Error> {
        let key = (deployment.to_string(), node.to_string());
        if let Some(id) = self.cache.read().await.get(&key) {
            return Ok(client.get_port(id).await?);
        }
        if self.worker_subnets.is_empty() {
            return Err(Error::Config(
                "[pod_vif_nested] worker_nodes_subnets must be set for nested drivers".into(),
            ));
        }
        for ip in self.node_ips(node).await? {
            for subnet in &self.worker_subnets {
                let filter = ListFilter::new().fixed_ip_address(&ip).fixed_ip_subnet(subnet);
                if let Some(port) = client.list_ports(&filter).await?.into_iter().next() {
                    self.cache.write().await.insert(key, port.id.clone());
                    return Ok(port);
                }
            }
        }
        Err(Error::not_ready(format!(
            "no Neutron port of node {node} found on worker subnets {:?}",
            self.worker_subnets
        )))
    }
}
