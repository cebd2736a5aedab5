//! What nested drivers share: finding the Neutron port of the VM a node runs in, by the node's
//! InternalIP on one of `[pod_vif_nested] worker_nodes_subnets` (upstream's lookup).
//!
//! A node's VM can be replaced under the same node name (autoscaling, repair). The found port is
//! remembered with the `device_id` (the Nova instance) it had, and re-checked on every use: a
//! port gone, or attached to another instance or none, is looked up again by the node's IP.

use std::collections::{HashMap, HashSet};
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
    /// (deployment, node) -> the VM port found for it.
    cache: Arc<RwLock<HashMap<(String, String), Found>>>,
}

#[derive(Clone, Debug)]
struct Found {
    port_id: String,
    /// The instance the port was attached to when found.
    device_id: String,
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
        let found = self.cache.read().await.get(&key).cloned();
        if let Some(found) = found {
            match client.get_port(&found.port_id).await {
                Ok(port) if port.device_id == found.device_id => return Ok(port),
                Ok(port) => tracing::info!(
                    node,
                    port = %port.id,
                    was = %found.device_id,
                    now = %port.device_id,
                    "the node's VM port changed instance; looking the node up again"
                ),
                Err(e) if e.is_not_found() => tracing::info!(
                    node,
                    port = %found.port_id,
                    "the node's VM port is gone; looking the node up again"
                ),
                Err(e) => return Err(e.into()),
            }
            self.cache.write().await.remove(&key);
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
                    let found = Found {
                        port_id: port.id.clone(),
                        device_id: port.device_id.clone(),
                    };
                    self.cache.write().await.insert(key, found);
                    return Ok(port);
                }
            }
        }
        Err(Error::not_ready(format!(
            "no Neutron port of node {node} found on worker subnets {:?}",
            self.worker_subnets
        )))
    }

    /// Every port on the worker subnets: the VM ports (and whatever else lives there), for work
    /// that concerns all nodes at once.
    pub async fn worker_ports(&self, client: &NeutronClient) -> Result<Vec<Port>, Error> {
        let mut seen = std::collections::HashSet::new();
        let mut ports = Vec::new();
        for subnet in &self.worker_subnets {
            for port in client
                .list_ports(&ListFilter::new().fixed_ip_subnet(subnet))
                .await?
            {
                if seen.insert(port.id.clone()) {
                    ports.push(port);
                }
            }
        }
        Ok(ports)
    }

    /// Forgets what was found for `node` (its Node object is gone or was re-created).
    pub async fn forget(&self, node: &str) {
        self.cache.write().await.retain(|(_, n), _| n != node);
    }

    /// Forgets every node's VM port.
    pub async fn forget_all(&self) {
        self.cache.write().await.clear();
    }
}

/// Those of `ids` that are VM ports still serving a VM (see [`vm_port_alive`]), in lists.
pub async fn vm_ports_alive(client: &NeutronClient, ids: &[String]) -> Result<HashSet<String>, Error> {
    let filter = ListFilter::new().fields(["id", "device_id"]);
    Ok(super::ports_by_ids(client, ids, &filter)
        .await?
        .into_iter()
        .filter(|p| !p.device_id.is_empty())
        .map(|p| p.id)
        .collect())
}

/// The parent port of each of `trunks` that exists: one list per [`super::IDS_PER_LIST`] trunks.
pub async fn trunk_parents(
    client: &NeutronClient,
    trunks: &[String],
) -> Result<HashMap<String, String>, Error> {
    let mut parents = HashMap::new();
    for filter in ListFilter::new().chunked("id", trunks, super::IDS_PER_LIST) {
        parents.extend(
            client
                .list_trunks(&filter)
                .await?
                .into_iter()
                .map(|t| (t.id, t.port_id)),
        );
    }
    Ok(parents)
}

/// Whether a VM port still serves a VM: it exists and is attached to an instance. A VM's
/// deletion deletes the ports Nova made and detaches the others (`device_id` cleared).
pub async fn vm_port_alive(client: &NeutronClient, port_id: &str) -> Result<bool, Error> {
    match client.get_port(port_id).await {
        Ok(port) => Ok(!port.device_id.is_empty()),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}
