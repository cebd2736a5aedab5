//! Pod VIF drivers: how a pod's port is created, attached, activated and released.
//!
//! - [`neutron::NeutronVif`] (`neutron-vif`): bare metal, port bound to the node (`binding:host_id`)
//! - [`nested_vlan::NestedVlan`] (`nested-vlan`): VM nodes, port attached as a VLAN subport of the
//!   node VM's trunk
//! - [`nested_macvlan::NestedMacvlan`] (`nested-macvlan`): VM nodes, port IP/MAC added to the VM
//!   port's allowed address pairs
//!
//! Every driver creates ports in bulk (`request_vifs(n)`), so the pools refill in one request.
//! The Neutron steps they share live here: [`create_ports`] (all or nothing, with a rollback when
//! a later step fails) and [`detach_and_delete`].

pub mod active;
pub mod nested;
pub mod nested_macvlan;
pub mod nested_vlan;
pub mod neutron;

use std::collections::HashMap;
use std::future::Future;

use async_trait::async_trait;
use kuryr_config::PodVifDriver;
use kuryr_crds::Vif;
use kuryr_crds::names::{device_owner, neutron as tags};
use kuryr_neutron::{ListFilter, NeutronClient, Port, PortCreate};

use super::{NetworkInfo, PodRef, PortSpec};
use crate::error::Error;

/// Who a new port is for: a pod (named and tagged after it, `device_id` = pod UID) or a pool.
#[derive(Clone, Debug)]
pub enum PortOwner {
    Pod(PodRef),
    Pool { pool: String },
}

#[async_trait]
pub trait VifDriver: Send + Sync {
    /// Which `[kubernetes] pod_vif_driver` this is.
    fn kind(&self) -> PodVifDriver;

    /// The `kuryr.conf` name (also what a VIF's origin records).
    fn name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The os-vif VIF of one of this driver's ports (`vlan`: its segmentation id when it is a
    /// trunk subport). Used for new ports and for ports recovered after a restart.
    fn vif_of_port(&self, port: &Port, network: &NetworkInfo, vlan: Option<u16>) -> Result<Vif, Error>;

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

    /// Forgets what the driver remembers of `node`: its Node object is gone or was re-created
    /// (a nested node's VM may have been replaced).
    async fn forget_node(&self, _node: &str) {}

    /// Forgets what the driver remembers of every node (a new leadership term).
    async fn forget_nodes(&self) {}

    /// Undoes what the driver did outside `ports` before the orphan sweep deletes them: no pod or
    /// pool records them, so their host is unknown (`release_vif` needs it). Returns the ids of
    /// those it could not release (logged): they wait for a later pass, since once deleted what
    /// pointed at them could not be found any more.
    async fn release_orphans(&self, _deployment: &str, _ports: &[Port]) -> Vec<String> {
        Vec::new()
    }

    /// Whether a pool host still serves a node. Nested: the VM's trunk or port is still attached
    /// to an instance. Bare-metal hosts are node names, which the Node watch judges.
    async fn host_alive(&self, _deployment: &str, _host: &str) -> Result<bool, Error> {
        Ok(true)
    }

    /// Those of `hosts` (of `deployment`) that no longer serve a node. One [`Self::host_alive`]
    /// each by default; nested drivers ask for all of them in a few lists.
    async fn dead_hosts(&self, deployment: &str, hosts: &[String]) -> Result<Vec<String>, Error> {
        let mut dead = Vec::new();
        for host in hosts {
            if !self.host_alive(deployment, host).await? {
                dead.push(host.clone());
            }
        }
        Ok(dead)
    }
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
            req.name = Some(tags::pod_port_name(&pod.namespace, &pod.name));
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

/// How many ids one list by ids names: 40 bytes each in the query (`id=<uuid>&`), 2.5 KiB in
/// all, so that with the other filters and the headers (a Keystone token among them) a request
/// fits the 4 KiB a uWSGI-served neutron-server takes by default (`buffer-size`; devstack
/// raises it to 64 KiB, not every deployment does).
pub const IDS_PER_LIST: usize = 64;

/// The ports among `ids` that pass `filter`: one list per [`IDS_PER_LIST`] ids.
pub async fn ports_by_ids<S: AsRef<str>>(
    client: &NeutronClient,
    ids: &[S],
    filter: &ListFilter,
) -> Result<Vec<Port>, Error> {
    let mut out = Vec::new();
    for filter in filter.chunked("id", ids, IDS_PER_LIST) {
        out.extend(client.list_ports(&filter).await?);
    }
    Ok(out)
}

/// Deletes ports; a port already gone is success. Every port is attempted and every failure
/// kept ([`Error::Multiple`]).
pub async fn delete_ports(client: &NeutronClient, ids: &[String]) -> Result<(), Error> {
    let mut errors = vec![];
    for id in ids {
        if let Err(e) = detach_and_delete(client, id, None).await {
            tracing::warn!(port = %id, error = %e, "could not delete port");
            errors.push(e);
        }
    }
    Error::collect(errors)
}

/// Detaches a subport from `trunk` (when given) and deletes the port. A subport already
/// detached, a trunk or a port already gone are success: this is the release path after crashes.
pub async fn detach_and_delete(
    client: &NeutronClient,
    port_id: &str,
    trunk: Option<&str>,
) -> Result<(), Error> {
    if let Some(trunk) = trunk {
        match client.remove_subports(trunk, &[port_id]).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() || e.status() == Some(400) || e.status() == Some(409) => {
                tracing::debug!(port = port_id, trunk, error = %e, "subport already detached");
            }
            Err(e) => {
                return Err(Error::openstack(
                    format!("detaching port {port_id} from trunk {trunk}"),
                    e,
                ));
            }
        }
    }
    let mut detached_elsewhere = false;
    loop {
        match client.delete_port(port_id).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_not_found() => return Ok(()),
            // A subport of another trunk than the one recorded (moved by hand): detached from
            // that one, once.
            Err(e) if !detached_elsewhere && e.is_kind(&kuryr_neutron::ErrorKind::PortInUseAsSubPort) => {
                let Some((actual, _)) = subports_by_port(client).await?.remove(port_id) else {
                    return Err(Error::openstack(format!("deleting port {port_id}"), e));
                };
                client.remove_subports(&actual, &[port_id]).await.map_err(|e| {
                    Error::openstack(format!("detaching port {port_id} from trunk {actual}"), e)
                })?;
                detached_elsewhere = true;
            }
            Err(e) => return Err(Error::openstack(format!("deleting port {port_id}"), e)),
        }
    }
}

/// Every trunk subport of the deployment: port id -> (trunk id, VLAN id). Subports carry no
/// device id (Neutron refuses one on them), so this is how a subport's trunk is found.
pub async fn subports_by_port(client: &NeutronClient) -> Result<HashMap<String, (String, u32)>, Error> {
    let trunks = client.list_trunks(&kuryr_neutron::ListFilter::new()).await?;
    Ok(trunks
        .into_iter()
        .flat_map(|t| {
            let id = t.id;
            t.sub_ports
                .into_iter()
                .map(move |s| (s.port_id, (id.clone(), s.segmentation_id)))
        })
        .collect())
}

/// Creates `n` ports like `req` in one request (bulk creates are atomic in Neutron), then runs
/// `finish` on them (attach, build VIFs, ...). When `finish` fails the ports are deleted again,
/// so the caller gets either everything or nothing left behind.
pub async fn create_ports<T, F, Fut>(
    client: &NeutronClient,
    req: PortCreate,
    n: usize,
    finish: F,
) -> Result<T, Error>
where
    F: FnOnce(Vec<Port>) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let ports = if n == 1 {
        vec![client.create_port(&req).await?]
    } else {
        client.create_ports(&vec![req; n]).await?
    };
    let ids: Vec<String> = ports.iter().map(|p| p.id.clone()).collect();
    match finish(ports).await {
        Ok(v) => Ok(v),
        Err(e) => {
            if let Err(cleanup) = delete_ports(client, &ids).await {
                tracing::warn!(ports = ?ids, error = %cleanup, "rollback of created ports failed; the orphan sweep or finalize-by-tags collects them");
            }
            Err(e)
        }
    }
}

/// Shared activation: wait (within the poller's bound) for Neutron to report the port ACTIVE,
/// then flip the VIF to active; ResourceNotReady when it is not up by then.
pub async fn activate_from_neutron(poller: &active::ActivePoller, vif: &mut Vif) -> Result<(), Error> {
    if vif.active() {
        return Ok(());
    }
    poller.wait_active(vif.id()).await?;
    vif.base_mut().active = true;
    Ok(())
}

pub(crate) const COMPUTE_KURYR: &str = device_owner::COMPUTE_KURYR;
