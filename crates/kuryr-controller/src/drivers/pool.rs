//! The pool driver interface (`[kubernetes] vif_pool_driver`) and `noop`, which creates a port per
//! pod and deletes it on release. The real pools (`neutron`, `nested`, `multi_pool`) live in
//! `crate::pool`.

use std::sync::Arc;

use async_trait::async_trait;
use kuryr_crds::Vif;
use serde::{Deserialize, Serialize};

use super::vif::{PortOwner, VifDriver};
use super::{PodRef, PortSpec};
use crate::error::Error;

/// Where a pod's VIF came from, stored next to the VIF in KuryrPort status (an extra field
/// upstream ignores), so that release goes back to the same deployment, trunk and pool even after a
/// restart or a config change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VifOrigin {
    pub deployment: String,
    /// Node (bare metal), trunk id (nested VLAN) or VM port id (nested macvlan).
    pub host: String,
    pub project_id: String,
    pub network_id: String,
    /// The subnets the port has its fixed IPs on, sorted: pools on one network but different
    /// subnets are different pools. Empty in origins written before it was recorded (release and
    /// recovery then go by the pool holding the port, or by the port's own fixed IPs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<String>,
    pub security_groups: Vec<String>,
    /// The VIF driver that made it.
    pub driver: String,
    /// Pre-created port given by the user (`spec-ports`): never deleted or pooled on release.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preserve: bool,
}

/// The field name of [`VifOrigin`] inside a KuryrPort `status.vifs` entry.
pub const ORIGIN_FIELD: &str = "kuryrRsOrigin";

/// The subnets a port has fixed IPs on, sorted and unique (the `subnets` of its origin and of
/// its pool key).
pub fn port_subnets(port: &kuryr_neutron::Port) -> Vec<String> {
    let set: std::collections::BTreeSet<String> =
        port.fixed_ips.iter().map(|f| f.subnet_id.clone()).collect();
    set.into_iter().collect()
}

#[async_trait]
pub trait VifPool: Send + Sync {
    fn name(&self) -> &'static str;

    /// A VIF for `pod` on `spec`. Pools answer from their available ports; ResourceNotReady
    /// means "being refilled, retry shortly".
    async fn request_vif(&self, pod: &PodRef, spec: &PortSpec) -> Result<(Vif, VifOrigin), Error>;

    /// Gives the VIF back (pools recycle it; noop deletes its port). `holder` is the releasing
    /// pod ([`holder`]): pools ignore a release by a pod the port has since been handed on from.
    async fn release_vif(&self, vif: &Vif, origin: &VifOrigin, holder: &str) -> Result<(), Error>;

    async fn activate_vif(&self, origin: &VifOrigin, vif: &mut Vif) -> Result<(), Error>;

    /// The VIF driver behind the pool.
    fn vif_driver(&self) -> &Arc<dyn VifDriver>;
}

/// `noop`: no pooling; one Neutron port per pod, created on request and deleted on release.
pub struct NoopPool {
    driver: Arc<dyn VifDriver>,
}

impl NoopPool {
    pub fn new(driver: Arc<dyn VifDriver>) -> Self {
        Self { driver }
    }
}

/// The identity pools record for the pod holding a port: its uid, or namespace/name for a pod
/// known without one.
pub fn holder(namespace: &str, name: &str, uid: &str) -> String {
    if uid.is_empty() {
        format!("{namespace}/{name}")
    } else {
        uid.to_string()
    }
}

pub fn origin_for(driver: &dyn VifDriver, spec: &PortSpec, host: &str) -> VifOrigin {
    let mut subnets = spec.network.subnet_ids();
    subnets.sort();
    subnets.dedup();
    VifOrigin {
        deployment: spec.deployment.clone(),
        host: host.to_string(),
        project_id: spec.project_id.clone(),
        network_id: spec.network.id.clone(),
        subnets,
        security_groups: spec.security_groups.clone(),
        driver: driver.name().to_string(),
        preserve: false,
    }
}

#[async_trait]
impl VifPool for NoopPool {
    fn name(&self) -> &'static str {
        "noop"
    }

    async fn request_vif(&self, pod: &PodRef, spec: &PortSpec) -> Result<(Vif, VifOrigin), Error> {
        let host = self.driver.pool_host(&spec.deployment, &pod.node).await?;
        let mut vifs = self
            .driver
            .request_vifs(spec, &host, &PortOwner::Pod(pod.clone()), 1)
            .await?;
        let vif = vifs
            .pop()
            .ok_or_else(|| Error::not_ready("Neutron returned no port"))?;
        Ok((vif, origin_for(self.driver.as_ref(), spec, &host)))
    }

    async fn release_vif(&self, vif: &Vif, origin: &VifOrigin, _holder: &str) -> Result<(), Error> {
        self.driver
            .release_vif(&origin.deployment, &origin.host, vif)
            .await
    }

    async fn activate_vif(&self, origin: &VifOrigin, vif: &mut Vif) -> Result<(), Error> {
        self.driver.activate_vif(&origin.deployment, vif).await
    }

    fn vif_driver(&self) -> &Arc<dyn VifDriver> {
        &self.driver
    }
}
