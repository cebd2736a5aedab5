//! `nested-vlan`: pods on VM nodes get a Neutron port attached as a VLAN subport of the VM's trunk.
//!
//! VLAN ids are chosen per trunk from what Neutron says is in use (the trunk's subports), so they
//! never collide, also across controller restarts; a per-trunk lock serialises allocation inside
//! this process, and a DuplicateSubPort/Conflict from a concurrent writer re-reads and retries.

use std::collections::BTreeSet;

use async_trait::async_trait;
use kuryr_config::PodVifDriver;
use kuryr_crds::Vif;
use kuryr_crds::names::device_owner::TRUNK_SUBPORT;
use kuryr_neutron::{ErrorKind, NeutronClient, Port, SubPort};

use super::active::{ActivePollers, PollSettings};
use super::nested::{VmPortLookup, trunk_parents, vm_port_alive, vm_ports_alive};
use super::{PortOwner, VifDriver, activate_from_neutron, create_ports, detach_and_delete, port_create};
use crate::drivers::os_vif::{VifKind, vif_from_port};
use crate::drivers::{NetworkInfo, PortSpec};
use crate::error::Error;
use crate::keyed_locks::KeyedLocks;
use crate::openstack::Deployments;

const MIN_VLAN: u32 = 1;
const MAX_VLAN: u32 = 4094;

pub struct NestedVlan {
    deployments: Deployments,
    lookup: VmPortLookup,
    tags: Vec<String>,
    mtu: u32,
    trunk_locks: KeyedLocks<String>,
    pollers: ActivePollers,
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
            pollers: ActivePollers::new(deployments.clone(), PollSettings::default()),
            deployments,
            lookup,
            tags,
            mtu,
            trunk_locks: KeyedLocks::default(),
        }
    }

    /// Attaches `ports` to `trunk` on free VLAN ids; returns the ids in port order.
    async fn attach(&self, client: &NeutronClient, trunk: &str, ports: &[Port]) -> Result<Vec<u32>, Error> {
        let n = ports.len();
        let _turn = self.trunk_locks.lock(trunk.to_string()).await;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let in_use: BTreeSet<u32> = client
                .get_subports(trunk)
                .await?
                .iter()
                .map(|s| s.segmentation_id)
                .collect();
            let Some(vlans) = free_vlan_ids(&in_use, n) else {
                return Err(Error::exhausted(
                    "VlanExhausted",
                    format!("trunk {trunk} has no {n} free VLAN ids left"),
                ));
            };
            let subports: Vec<SubPort> = ports
                .iter()
                .zip(&vlans)
                .map(|(p, v)| SubPort::vlan(p.id.clone(), *v))
                .collect();
            match client.add_subports(trunk, &subports).await {
                Ok(_) => return Ok(vlans),
                // Another writer took one of our ids between read and write: re-read and retry.
                Err(e)
                    if attempt < 5
                        && (e.is_kind(&ErrorKind::DuplicateSubPort) || e.is_kind(&ErrorKind::Conflict)) =>
                {
                    tracing::debug!(trunk, error = %e, "VLAN id race; retrying");
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[async_trait]
impl VifDriver for NestedVlan {
    fn kind(&self) -> PodVifDriver {
        PodVifDriver::NestedVlan
    }

    fn vif_of_port(&self, port: &Port, network: &NetworkInfo, vlan: Option<u16>) -> Result<Vif, Error> {
        let vlan_id = vlan.ok_or_else(|| {
            Error::invalid(
                format!("port {} segmentation_id", port.id),
                "port is not a trunk subport",
            )
        })?;
        vif_from_port(port, network, &VifKind::VlanNested { vlan_id }, self.mtu)
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
        create_ports(client, req, n, |ports| async move {
            let vlans = self.attach(client, trunk, &ports).await?;
            let mut vifs = Vec::with_capacity(n);
            for (port, vlan) in ports.iter().zip(vlans) {
                let vlan =
                    u16::try_from(vlan).map_err(|_| Error::invalid("segmentation_id", vlan.to_string()))?;
                vifs.push(self.vif_of_port(port, &spec.network, Some(vlan))?);
            }
            Ok(vifs)
        })
        .await
    }

    async fn release_vif(&self, deployment: &str, trunk: &str, vif: &Vif) -> Result<(), Error> {
        detach_and_delete(self.deployments.client(deployment)?, vif.id(), Some(trunk)).await
    }

    async fn activate_vif(&self, deployment: &str, vif: &mut Vif) -> Result<(), Error> {
        activate_from_neutron(&self.pollers.get(deployment)?, vif).await
    }

    async fn forget_node(&self, node: &str) {
        self.lookup.forget(node).await;
    }

    async fn forget_nodes(&self) {
        self.lookup.forget_all().await;
    }

    async fn host_alive(&self, deployment: &str, trunk: &str) -> Result<bool, Error> {
        let client = self.deployments.client(deployment)?;
        match client.get_trunk(trunk).await {
            Ok(t) => vm_port_alive(client, &t.port_id).await,
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn dead_hosts(&self, deployment: &str, trunks: &[String]) -> Result<Vec<String>, Error> {
        let client = self.deployments.client(deployment)?;
        let parents = trunk_parents(client, trunks).await?;
        let ports: Vec<String> = parents.values().cloned().collect();
        let alive = vm_ports_alive(client, &ports).await?;
        Ok(trunks
            .iter()
            .filter(|t| parents.get(*t).is_none_or(|p| !alive.contains(p)))
            .cloned()
            .collect())
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
