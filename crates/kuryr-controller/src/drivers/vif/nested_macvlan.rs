//! `nested-macvlan`: pods on VM nodes get a Neutron port whose IP and MAC are added to the VM
//! port's allowed address pairs; the CNI daemon creates a macvlan device on the VM's interface.
//!
//! The VM port is shared by every pod of the node, so updates are revision-checked (`If-Match`)
//! and re-read on 412, as upstream does with `rev_update_attempts`. The revision check alone does
//! not serialize them: a real neutron-server (29.0.0, MariaDB) answers 200 to two concurrent
//! updates carrying the same `If-Match` revision, and one pod's pair is lost. So this controller's
//! own updates of one VM port also take turns; the revision check still guards against other
//! writers.

use async_trait::async_trait;
use kuryr_config::PodVifDriver;
use kuryr_crds::Vif;
use kuryr_neutron::{AllowedAddressPair, ErrorKind, Port, PortUpdate};

use super::nested::{VmPortLookup, vm_port_alive, vm_ports_alive};
use super::{COMPUTE_KURYR, PortOwner, VifDriver, create_ports, delete_ports, port_create};
use crate::drivers::os_vif::{VifKind, vif_from_port};
use crate::drivers::{NetworkInfo, PortSpec};
use crate::error::Error;
use crate::keyed_locks::KeyedLocks;
use crate::openstack::Deployments;

pub struct NestedMacvlan {
    deployments: Deployments,
    lookup: VmPortLookup,
    tags: Vec<String>,
    mtu: u32,
    attempts: u32,
    /// (deployment, VM port id): the pair updates of one VM port take turns.
    vm_locks: KeyedLocks<(String, String)>,
}

impl NestedMacvlan {
    pub fn new(
        deployments: Deployments,
        lookup: VmPortLookup,
        tags: Vec<String>,
        mtu: u32,
        attempts: u32,
    ) -> Self {
        Self {
            deployments,
            lookup,
            tags,
            mtu,
            attempts: attempts.max(1),
            vm_locks: KeyedLocks::default(),
        }
    }

    /// Applies `change` to the VM port's allowed address pairs with optimistic concurrency.
    async fn update_pairs(
        &self,
        deployment: &str,
        vm_port_id: &str,
        change: impl Fn(&mut Vec<AllowedAddressPair>) + Send + Sync,
    ) -> Result<(), Error> {
        let client = self.deployments.client(deployment)?;
        let _turn = self
            .vm_locks
            .lock((deployment.to_string(), vm_port_id.to_string()))
            .await;
        let mut last = None;
        for _ in 0..self.attempts {
            let vm: Port = client.get_port(vm_port_id).await?;
            let mut pairs = vm.allowed_address_pairs.clone();
            change(&mut pairs);
            if pairs == vm.allowed_address_pairs {
                return Ok(());
            }
            let update = PortUpdate {
                allowed_address_pairs: Some(pairs),
                ..Default::default()
            };
            match client
                .update_port_if_revision(vm_port_id, &update, vm.revision_number)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.is_kind(&ErrorKind::RevisionNumberConstraintFailed) => last = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.map_or_else(|| Error::not_ready("VM port update"), Error::from))
    }
}

fn pairs_of(port: &Port) -> Vec<AllowedAddressPair> {
    port.fixed_ips
        .iter()
        .map(|ip| AllowedAddressPair {
            ip_address: ip.ip_address.clone(),
            mac_address: Some(port.mac_address.clone()),
        })
        .collect()
}

#[async_trait]
impl VifDriver for NestedMacvlan {
    fn kind(&self) -> PodVifDriver {
        PodVifDriver::NestedMacvlan
    }

    fn vif_of_port(&self, port: &Port, network: &NetworkInfo, _vlan: Option<u16>) -> Result<Vif, Error> {
        vif_from_port(port, network, &VifKind::MacvlanNested, self.mtu)
    }

    async fn pool_host(&self, deployment: &str, node: &str) -> Result<String, Error> {
        let client = self.deployments.client(deployment)?;
        Ok(self.lookup.vm_port(client, deployment, node).await?.id)
    }

    async fn request_vifs(
        &self,
        spec: &PortSpec,
        vm_port: &str,
        owner: &PortOwner,
        n: usize,
    ) -> Result<Vec<Vif>, Error> {
        let client = self.deployments.client(&spec.deployment)?;
        let req = port_create(spec, owner, &self.tags, COMPUTE_KURYR);
        create_ports(client, req, n, |ports| async move {
            let new_pairs: Vec<AllowedAddressPair> = ports.iter().flat_map(pairs_of).collect();
            self.update_pairs(&spec.deployment, vm_port, |pairs| {
                for p in &new_pairs {
                    if !pairs.contains(p) {
                        pairs.push(p.clone());
                    }
                }
            })
            .await?;
            ports
                .iter()
                .map(|p| {
                    let mut vif = self.vif_of_port(p, &spec.network, None)?;
                    // Macvlan ports are never bound, so Neutron never reports them ACTIVE: the
                    // address pair on the VM port is what makes them work (upstream does the same).
                    vif.base_mut().active = true;
                    Ok(vif)
                })
                .collect()
        })
        .await
    }

    async fn release_vif(&self, deployment: &str, vm_port: &str, vif: &Vif) -> Result<(), Error> {
        let client = self.deployments.client(deployment)?;
        match client.get_port(vif.id()).await {
            Ok(port) if port.device_owner == kuryr_crds::names::device_owner::TRUNK_SUBPORT => {
                // A nested-vlan port (another driver's pool): never this driver's to delete.
                return Err(Error::invalid(
                    "port",
                    format!(
                        "port {} is a trunk subport, not a macvlan port of VM port {vm_port}",
                        port.id
                    ),
                ));
            }
            Ok(port) => {
                let gone = pairs_of(&port);
                match self
                    .update_pairs(deployment, vm_port, |pairs| pairs.retain(|p| !gone.contains(p)))
                    .await
                {
                    // The VM's port is gone (the VM deleted): it has no pairs left to remove, and
                    // the pod's port must still go, or the pod stays Terminating for good.
                    Err(e) if e.neutron().is_some_and(|n| n.is_not_found()) => {
                        tracing::info!(port = %port.id, vm_port, "VM port gone: no address pair to remove");
                    }
                    r => r?,
                }
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        delete_ports(client, &[vif.id().to_string()]).await
    }

    async fn activate_vif(&self, _deployment: &str, vif: &mut Vif) -> Result<(), Error> {
        vif.base_mut().active = true;
        Ok(())
    }

    async fn forget_node(&self, node: &str) {
        self.lookup.forget(node).await;
    }

    async fn forget_nodes(&self) {
        self.lookup.forget_all().await;
    }

    /// The orphans' address pairs are taken off whichever VM ports carry them (found on the
    /// worker subnets): left there, a VM keeps the right to send as an address Neutron hands to
    /// another pod, and each stale pair counts against Neutron's per-port limit (10 by default).
    async fn release_orphans(&self, deployment: &str, ports: &[Port]) -> Vec<String> {
        let gone: Vec<AllowedAddressPair> = ports.iter().flat_map(pairs_of).collect();
        if gone.is_empty() {
            return Vec::new();
        }
        let all = || ports.iter().map(|p| p.id.clone()).collect();
        let vms = match self.deployments.client(deployment) {
            Ok(client) => self.lookup.worker_ports(client).await,
            Err(e) => Err(e),
        };
        let vms = match vms {
            Ok(vms) => vms,
            Err(e) => {
                tracing::warn!(deployment, error = %e, "cannot list the VM ports to release orphaned pairs from");
                return all();
            }
        };
        // Each VM port apart: one that fails keeps only the orphans whose pairs are on it.
        let mut kept = Vec::new();
        for vm in vms {
            if !vm.allowed_address_pairs.iter().any(|p| gone.contains(p)) {
                continue;
            }
            match self
                .update_pairs(deployment, &vm.id, |pairs| pairs.retain(|p| !gone.contains(p)))
                .await
            {
                Ok(()) => {
                    tracing::info!(vm_port = %vm.id, deployment, "took orphaned pods' address pairs off a VM port")
                }
                Err(e) => {
                    tracing::warn!(vm_port = %vm.id, deployment, error = %e, "cannot take orphaned pairs off a VM port");
                    kept.extend(
                        ports
                            .iter()
                            .filter(|p| pairs_of(p).iter().any(|a| vm.allowed_address_pairs.contains(a)))
                            .map(|p| p.id.clone()),
                    );
                }
            }
        }
        kept
    }

    async fn host_alive(&self, deployment: &str, vm_port: &str) -> Result<bool, Error> {
        vm_port_alive(self.deployments.client(deployment)?, vm_port).await
    }

    async fn dead_hosts(&self, deployment: &str, vm_ports: &[String]) -> Result<Vec<String>, Error> {
        let alive = vm_ports_alive(self.deployments.client(deployment)?, vm_ports).await?;
        Ok(vm_ports.iter().filter(|p| !alive.contains(*p)).cloned().collect())
    }
}
