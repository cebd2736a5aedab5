//! `nested-vlan`: pods on VM nodes get a Neutron port attached as a VLAN subport of the VM's trunk.
//!
//! VLAN ids are chosen per trunk from what Neutron says is in use (the trunk's subports), so they
//! never collide, also across controller restarts; a per-trunk lock serialises allocation inside
//! this process, and a DuplicateSubPort/Conflict from a concurrent writer re-reads and retries.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use kuryr_crds::Vif;
use kuryr_crds::names::device_owner::TRUNK_SUBPORT;
use kuryr_neutron::{ErrorKind, SubPort};
use tokio::sync::Mutex;

use super::nested::VmPortLookup;
use super::{PortOwner, VifDriver, activate_from_neutron, delete_ports, port_create};
use crate::drivers::PortSpec;
use crate::drivers::os_vif::{VifKind, vif_from_port};
use crate::error::Error;
use crate::openstack::Deployments;

const MIN_VLAN: u32 = 1;
const MAX_VLAN: u32 = 4094;

pub struct NestedVlan {
    deployments: Deployments,
    lookup: VmPortLookup,
    tags: Vec<String>,
    mtu: u32,
    trunk_locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

/// Picks `n` free VLAN ids, lowest first.
pub fn free_vlan_ids(in_use: &BTreeSet<u32>, n: usize) -> Option<Vec<u32>> {
    let ids: Vec<u32> = (MIN_VLAN..=MAX_VLAN)
        .filter(|v| !in_use.contains(v))
        .take(n)
        .collect();
    (ids.len() == n).then_some(ids)
}

impl NestedVlan {
    pub fn new(deployments: Deployments, lookup: VmPortLookup, tags: Vec<String>, mtu: u32) -> Self {
        Self {
            deployments,
            lookup,
            tags,
            mtu,
            trunk_locks: Mutex::default(),
        }
    }

    async fn trunk_lock(&self, trunk: &str) -> Arc<Mutex<()>> {
        self.trunk_locks
            .lock()
            .await
            .entry(trunk.to_string())
            .or_default()
            .clone()
    }
}

#[async_trait]
impl VifDriver for NestedVlan {
    fn name(&self) -> &'static str {
        "nested-vlan"
    }

    async fn pool_host(&self, deployment: &str, node: &str) -> Result<String, Error> {
        let client = self.deployments.client(deployment)?;
        let vm_port = self.lookup.vm_port(client, deployment, node).await?;
        vm_port.trunk_details.map(|t| t.trunk_id).ok_or_else(|| {
            Error::Config(format!(
                "VM port {} of node {node} is not a trunk parent",
                vm_port.id
            ))
        })
    }

    async fn request_vifs(
        &self,
        spec: &PortSpec,
        trunk: &str,
        owner: &PortOwner,
        n: usize,
    ) -> Result<Vec<Vif>, Error> {
        let client = self.deployments.client(&spec.deployment)?;
        let mut req = port_create(spec, owner, &self.tags, TRUNK_SUBPORT);
        // Neutron refuses a port with a device_id as a subport (409 PortInUse); the pod tag keeps
        // the port accountable instead.
        req.device_id = None;
        let reqs = vec![req; n];
        let ports = if n == 1 {
            vec![client.create_port(&reqs[0]).await?]
        } else {
            client.create_ports(&reqs).await?
        };
        let ids: Vec<String> = ports.iter().map(|p| p.id.clone()).collect();

        let lock = self.trunk_lock(trunk).await;
        let _guard = lock.lock().await;
        let mut attempt = 0;
        let vlans = loop {
            attempt += 1;
            let in_use: BTreeSet<u32> = match client.get_subports(trunk).await {
                Ok(s) => s.iter().map(|s| s.segmentation_id).collect(),
                Err(e) => {
                    let _ = delete_ports(client, &ids).await;
                    return Err(e.into());
                }
            };
            let Some(vlans) = free_vlan_ids(&in_use, n) else {
                let _ = delete_ports(client, &ids).await;
                return Err(Error::OpenStack {
                    message: format!("trunk {trunk} has no {n} free VLAN ids left"),
                    kind: "VlanExhausted",
                    transient: true,
                    user_visible: true,
                    request_id: None,
                    retry_after: None,
                });
            };
            let subports: Vec<SubPort> = ids
                .iter()
                .zip(&vlans)
                .map(|(id, v)| SubPort::vlan(id.clone(), *v))
                .collect();
            match client.add_subports(trunk, &subports).await {
                Ok(_) => break vlans,
                // Another writer took one of our ids between read and write: re-read and retry.
                Err(e)
                    if attempt < 5
                        && (e.is_kind(&ErrorKind::DuplicateSubPort) || e.is_kind(&ErrorKind::Conflict)) =>
                {
                    tracing::debug!(trunk, error = %e, "VLAN id race; retrying");
                }
                Err(e) => {
                    let _ = delete_ports(client, &ids).await;
                    return Err(e.into());
                }
            }
        };
        let mut vifs = Vec::with_capacity(n);
        for (port, vlan) in ports.iter().zip(vlans) {
            let vlan_id =
                u16::try_from(vlan).map_err(|_| Error::invalid("segmentation_id", vlan.to_string()))?;
            vifs.push(vif_from_port(
                port,
                &spec.network,
                &VifKind::VlanNested { vlan_id },
                self.mtu,
            )?);
        }
        Ok(vifs)
    }

    async fn release_vif(&self, deployment: &str, trunk: &str, vif: &Vif) -> Result<(), Error> {
        let client = self.deployments.client(deployment)?;
        match client.remove_subports(trunk, &[vif.id()]).await {
            Ok(_) => {}
            // Not a subport (any more) or trunk gone: deleting the port is all that is left.
            Err(e) if e.is_not_found() || e.status() == Some(400) || e.status() == Some(409) => {
                tracing::debug!(port = vif.id(), trunk, error = %e, "subport already detached");
            }
            Err(e) => return Err(e.into()),
        }
        delete_ports(client, &[vif.id().to_string()]).await
    }

    async fn activate_vif(&self, deployment: &str, vif: &mut Vif) -> Result<(), Error> {
        activate_from_neutron(self.deployments.client(deployment)?, vif).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vlan_ids_skip_used_ones_and_run_out() {
        let used: BTreeSet<u32> = [1, 2, 4].into_iter().collect();
        assert_eq!(free_vlan_ids(&used, 3), Some(vec![3, 5, 6]));
        let all: BTreeSet<u32> = (1..=4094).collect();
        assert_eq!(free_vlan_ids(&all, 1), None);
    }
}
