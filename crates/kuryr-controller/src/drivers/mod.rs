//! Drivers: they decide the OpenStack side of a pod. Chosen by the upstream
//! config names in `[kubernetes]`.
//!
//! - [`project`]: which Neutron project a pod's ports belong to (`default`, `annotation`)
//! - [`subnets`]: which network/subnets (`default`, `namespace`; a namespace's KuryrNetwork is made
//!   on first need in [`namespace_networks`])
//! - [`security_groups`]: which security groups (`default`, `policy`; `namespace` in
//!   [`namespace_groups`], with its release once the namespace is gone)
//! - [`vif`]: how a port is made and activated (`neutron-vif`, `nested-vlan`, `nested-macvlan`)
//! - [`pool`]: where ports come from (`noop` creates per pod; pools live in `crate::pool`)
//! - [`multi_vif`]: the pod's additional interfaces (`[kubernetes] multi_vif_drivers`)

pub mod address_groups;
pub mod multi_vif;
pub mod namespace_groups;
pub mod namespace_networks;
pub mod network_policy;
pub mod os_vif;
pub mod pool;
pub mod port_groups;
pub mod project;
pub mod security_groups;
pub mod set;
pub mod subnets;
pub mod vif;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kuryr_crds::Vif;
use kuryr_neutron::Subnet;

/// A pod's identity as the drivers need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
}

impl PodRef {
    pub fn from_pod(pod: &Pod) -> Self {
        Self {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            node: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
        }
    }
}

/// The network a port is created on, with the subnets to take addresses from.
#[derive(Clone, Debug)]
pub struct NetworkInfo {
    pub id: String,
    pub name: String,
    pub mtu: Option<u32>,
    /// Subnets of this network the port gets an address on (usually one).
    pub subnets: Vec<Subnet>,
}

impl NetworkInfo {
    pub fn subnet_ids(&self) -> Vec<String> {
        self.subnets.iter().map(|s| s.id.clone()).collect()
    }
}

/// Everything the project/subnet/security-group drivers resolved for one interface of a pod.
#[derive(Clone, Debug)]
pub struct PortSpec {
    /// OpenStack deployment whose Neutron serves this pod (docs/architecture.md#several-openstack-deployments).
    pub deployment: String,
    pub project_id: String,
    pub network: Arc<NetworkInfo>,
    /// Sorted and de-duplicated: part of the pool key.
    pub security_groups: Vec<String>,
    /// `normal` or `direct` (SR-IOV).
    pub vnic_type: String,
}

impl PortSpec {
    pub fn new(
        deployment: impl Into<String>,
        project_id: impl Into<String>,
        network: Arc<NetworkInfo>,
        mut security_groups: Vec<String>,
    ) -> Self {
        security_groups.sort();
        security_groups.dedup();
        Self {
            deployment: deployment.into(),
            project_id: project_id.into(),
            network,
            security_groups,
            vnic_type: "normal".into(),
        }
    }
}

/// One VIF the controller made for a pod, with where it came from so it can be released right.
#[derive(Clone, Debug)]
pub struct AcquiredVif {
    pub vif: Vif,
    pub spec: PortSpec,
}

pub use os_vif::vif_from_port;
pub use set::Drivers;
