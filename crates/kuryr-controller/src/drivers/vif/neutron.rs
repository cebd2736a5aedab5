//! `neutron-vif`: bare-metal nodes. Ports are bound to the node (`binding:host_id`) so the node's
//! Neutron agent wires them and Neutron reports them ACTIVE.

use async_trait::async_trait;
use kuryr_crds::Vif;

use super::{COMPUTE_KURYR, PortOwner, VifDriver, activate_from_neutron, delete_ports, port_create};
use crate::drivers::PortSpec;
use crate::drivers::os_vif::{VifKind, vif_from_port};
use crate::error::Error;
use crate::openstack::Deployments;

pub struct NeutronVif {
    deployments: Deployments,
    tags: Vec<String>,
    ovs_bridge: String,
    mtu: u32,
}

impl NeutronVif {
    pub fn new(deployments: Deployments, tags: Vec<String>, ovs_bridge: String, mtu: u32) -> Self {
        Self {
            deployments,
            tags,
            ovs_bridge,
            mtu,
        }
    }
}

#[async_trait]
impl VifDriver for NeutronVif {
    fn name(&self) -> &'static str {
        "neutron-vif"
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
        let reqs = vec![req; n];
        // Bulk create is atomic on the Neutron side: either all ports exist or none.
        let ports = if n == 1 {
            vec![client.create_port(&reqs[0]).await?]
        } else {
            client.create_ports(&reqs).await?
        };
        let kind = VifKind::Bound {
            ovs_bridge: self.ovs_bridge.clone(),
        };
        let vifs: Result<Vec<Vif>, Error> = ports
            .iter()
            .map(|p| vif_from_port(p, &spec.network, &kind, self.mtu))
            .collect();
        match vifs {
            Ok(v) => Ok(v),
            Err(e) => {
                let ids: Vec<String> = ports.iter().map(|p| p.id.clone()).collect();
                let _ = delete_ports(client, &ids).await;
                Err(e)
            }
        }
    }

    async fn release_vif(&self, deployment: &str, _host: &str, vif: &Vif) -> Result<(), Error> {
        delete_ports(self.deployments.client(deployment)?, &[vif.id().to_string()]).await
    }

    async fn activate_vif(&self, deployment: &str, vif: &mut Vif) -> Result<(), Error> {
        activate_from_neutron(self.deployments.client(deployment)?, vif).await
    }
}
