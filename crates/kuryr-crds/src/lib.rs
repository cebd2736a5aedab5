//! kuryr-crds: Rust types of the kuryr custom resources, the os-vif VIF JSON model and the
//! well-known names (finalizers, labels, annotations) shared by the controller and the CNI daemon.
//!
//! - `openstack.org/v1`: [`KuryrPort`], [`KuryrNetwork`], [`KuryrNetworkPolicy`],
//!   [`KuryrLoadBalancer`] (schemas compatible with upstream kuryr-kubernetes) and
//!   [`KuryrPortPool`] (new in kuryr-rs).
//! - `k8s.cni.cncf.io/v1`: [`NetworkAttachmentDefinition`].
//! - [`vif`] - os-vif versioned objects ([`Vif`], [`vif::Network`], [`vif::Subnet`], ...).
//! - [`names`] - constants.
//! - [`generate`] - CRD manifests (`crdgen` writes them to `deploy/crds/`).
//!
//! All CRDs kuryr-rs installs enable the status subresource, so status must be written through
//! `/status` (`Api::patch_status`). CRDs installed by upstream kuryr-kubernetes do not have it
//! (upstream writes status through the main resource); see [`generate`].

pub mod crds;
pub mod events;
pub mod generate;
pub mod names;
pub mod vif;

pub use crds::kuryrloadbalancer::{
    KuryrLoadBalancer, KuryrLoadBalancerSpec, KuryrLoadBalancerStatus, LbEndpoint, LbEndpointConditions,
    LbEndpointPort, LbEndpointSlice, LbListener, LbListenerAcl, LbLoadBalancer, LbMember, LbPool,
    LbPubIpInfo, LbSpecPort, LbTargetRef,
};
pub use crds::kuryrnetwork::{KuryrNetwork, KuryrNetworkSpec, KuryrNetworkStatus};
pub use crds::kuryrnetworkpolicy::{
    KuryrNetworkPolicy, KuryrNetworkPolicySpec, KuryrNetworkPolicyStatus, SgRule, SgRuleEntry, SgRuleStatus,
};
pub use crds::kuryrport::{KuryrPort, KuryrPortSpec, KuryrPortStatus, KuryrPortVif};
pub use crds::kuryrportpool::{
    KuryrPortPool, KuryrPortPoolSpec, KuryrPortPoolStatus, PoolFixedIp, PoolKey, PoolKeyError, PoolPort,
};
pub use crds::nad::{
    NadError, NadKuryrConfig, NetworkAttachmentDefinition, NetworkAttachmentDefinitionSpec, kuryr_config_of,
};
pub use crds::placement::{
    BindingHistoryRow, DeploymentCondition, KuryrOpenStackDeployment, KuryrOpenStackDeploymentSpec,
    KuryrOpenStackDeploymentStatus, KuryrProjectBinding, KuryrProjectBindingSpec, KuryrProjectBindingStatus,
    Maintenance, binding_name,
};
pub use vif::{Vif, vif_name_for_port};
