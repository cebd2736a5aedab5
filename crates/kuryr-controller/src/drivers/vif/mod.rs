//! Pod VIF drivers: how a pod's port is created, attached, activated and released.
//!
//! - [`neutron::NeutronVif`] (`neutron-vif`): bare metal, port bound to the node (`binding:host_id`)
//! - [`nested_vlan::NestedVlan`] (`nested-vlan`): VM nodes, port attached as a VLAN subport of the
//!   node VM's trunk
//! - [`nested_macvlan::NestedMacvlan`] (`nested-macvlan`): VM nodes, port IP/MAC added to the VM
//!   port's allowed address pairs
//!
//! Every driver creates ports in bulk (`request_vifs(n)`), so the pools refill in one request.

pub mod nested;
pub mod nested_macvlan;
pub mod nested_vlan;
pub mod neutron;

use async_trait::async_trait;
use kuryr_crds::Vif;
use kuryr_crds::names::{device_owner, neutron as tags};
use kuryr_neutron::{NeutronClient, PortCreate};

use super::{PodRef, PortSpec};
use crate::error::Error;

/// Who a new port is for: a pod (named and tagged after it, `device_id` = pod UID) or a pool.
#[derive(Clone, Debug)]
pub enum PortOwner {
    Pod(PodRef),
    Pool { pool: String },
}

#[async_trait]
pub trait VifDriver: Send + Sync {
    fn name(&self) -> &'static str;

    /// The "host" part of the pool key for a node: the node itself on bare metal, the node VM's
    /// trunk (nested VLAN) or VM port (nested macvlan).
    async fn pool_host(&self, deployment: &str, node: &str) -> Result<String, Error>;

    /// Creates `n` ports for `host` in ONE bulk request and attaches them as the driver needs.
    /// Either all ports come back or none is left behind.
    async fn request_vifs(
        &self,
        spec: &PortSpec,
        host: &str,
        owner: &PortOwner,
        n: usize,
    ) -> Result<Vec<Vif>, Error>;

    /// Detaches (nested) and deletes the VIF's port. A port already gone is success.
    async fn release_vif(&self, deployment: &str, host: &str, vif: &Vif) -> Result<(), Error>;

    /// Marks the VIF active once Neutron reports its port ACTIVE; otherwise ResourceNotReady.
    async fn activate_vif(&self, deployment: &str, vif: &mut Vif) -> Result<(), Error>;
}

/// The create body shared by all drivers: project, network/subnets, security groups and the
/// ownership tags that make every port accountable after a crash.
pub fn port_create(
    spec: &PortSpec,
    owner: &PortOwner,
    base_tags: &[String],
    device_owner: &str,
) -> PortCreate {
    let mut req = PortCreate::new(spec.network.id.clone());
    req.project_id = Some(spec.project_id.clone());
    req.fixed_ips = Some(
        spec.network
            .subnets
            .iter()
            .map(|s| kuryr_neutron::FixedIpRequest::subnet(s.id.clone()))
            .collect(),
    );
    req.security_groups = Some(spec.security_groups.clone());
    req.device_owner = Some(device_owner.to_string());
    req.admin_state_up = Some(true);
    if spec.vnic_type != "normal" {
        req.binding_vnic_type = Some(spec.vnic_type.clone());
    }
    let mut port_tags = base_tags.to_vec();
    match owner {
        PortOwner::Pod(pod) => {
            req.name = Some(format!("{}/{}", pod.namespace, pod.name));
            req.device_id = Some(pod.uid.clone());
            port_tags.push(tags::pod_tag(&pod.namespace, &pod.name));
        }
        PortOwner::Pool { pool } => {
            req.name = Some(tags::POOL_PORT_NAME.to_string());
            port_tags.push(tags::pool_tag(pool));
        }
    }
    req.tags = port_tags;
    req
}

/// Deletes ports best-effort (used to roll back a half-done bulk): every error is logged, the
/// first is returned, and every port is attempted.
pub async fn delete_ports(client: &NeutronClient, ids: &[String]) -> Result<(), Error> {
    let mut first = None;
    for id in ids {
        match client.delete_port(id).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(port = %id, error = %e, "could not delete port");
                first.get_or_insert(Error::from(e));
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// Shared activation: re-read the port and flip the VIF to active when Neutron says so.
pub async fn activate_from_neutron(client: &NeutronClient, vif: &mut Vif) -> Result<(), Error> {
    if vif.active() {
        return Ok(());
    }
    let port = client.get_port(vif.id()).await?;
    if port.is_active() {
        vif.base_mut().active = true;
        Ok(())
    } else {
        Err(Error::not_ready(format!("port {} is {}", port.id, port.status)))
    }
}

pub(crate) const COMPUTE_KURYR: &str = device_owner::COMPUTE_KURYR;
