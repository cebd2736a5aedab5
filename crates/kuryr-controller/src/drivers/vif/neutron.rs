//! `neutron-vif`: bare-metal nodes. Ports are bound to the node (`binding:host_id`) so the node's
//! Neutron agent wires them and Neutron reports them ACTIVE.

use async_trait::async_trait;
use kuryr_config::PodVifDriver;
use kuryr_crds::Vif;
use kuryr_neutron::Port;

use super::active::{ActivePollers, PollSettings};
use super::{
    COMPUTE_KURYR, PortOwner, VifDriver, activate_from_neutron, create_ports, delete_ports, port_create,
};
use crate::drivers::os_vif::{VifKind, vif_from_port};
use crate::drivers::{NetworkInfo, PortSpec};
use crate::error::Error;
use crate::openstack::Deployments;

pub struct NeutronVif {
    deployments: Deployments,
    tags: Vec<String>,
    ovs_bridge: String,
    mtu: u32,
    pollers: ActivePollers,
}

impl NeutronVif {
    pub fn new(deployments: Deployments, tags: Vec<String>, ovs_bridge: String, mtu: u32) -> Self {
        Self {
            pollers: ActivePollers::new(deployments.clone(), PollSettings::default()),
            deployments,
            tags,
            ovs_bridge,
            mtu,
        }
    }
}

#[async_trait]
impl VifDriver for NeutronVif {
    fn kind(&self) -> PodVifDriver {
        PodVifDriver::NeutronVif
    }

    fn vif_of_port(&self, port: &Port, network: &NetworkInfo, _vlan: Option<u16>) -> Result<Vif, Error> {
        let kind = VifKind::Bound {
            ovs_bridge: self.ovs_bridge.clone(),
        };
        vif_from_port(port, network, &kind, self.mtu)
    }

    async fn pool_host(&self, _deployment: &str, node: &str) -> Result<String, Error> {
        Ok(node.to_string())
    }

    async fn request_vifs(
        &self,
        spec: &PortSpec,
        host: &str,
        owner: &PortOwner,
        n: usize,
    ) -> Result<Vec<Vif>, Error> {
        let client = self.deployments.client(&spec.deployment)?;
        let mut req = port_create(spec, owner, &self.tags, COMPUTE_KURYR);
        req.binding_host_id = Some(host.to_string());
        create_ports(client, req, n, |ports| async move {
            ports
                .iter()
                .map(|p| self.vif_of_port(p, &spec.network, None))
                .collect()
        })
        .await
    }

    async fn release_vif(&self, deployment: &str, _host: &str, vif: &Vif) -> Result<(), Error> {
        delete_ports(self.deployments.client(deployment)?, &[vif.id().to_string()]).await
    }

    async fn activate_vif(&self, deployment: &str, vif: &mut Vif) -> Result<(), Error> {
        activate_from_neutron(&self.pollers.get(deployment)?, vif).await
    }
}
