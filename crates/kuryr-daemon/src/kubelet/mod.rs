//! The kubelet's PodResources service: which devices (SR-IOV VFs, by PCI
//! address) the kubelet's device plugins allocated to which pod. The SR-IOV
//! binding asks it with `[sriov] enable_pod_resource_service = True`, so that
//! it plugs exactly the VFs the pod was given (see `binding::sriov`).
//!
//! - [`pod_resources`]: gRPC `List` over HTTP/2 on
//!   `<[sriov] kubelet_root_dir>/pod-resources/kubelet.sock`
//! - [`proto`]: hand-written decoding of the answer (no protoc at build time)

pub mod pod_resources;
pub mod proto;

pub use pod_resources::{PodResourcesClient, PodResourcesError, pod_devices};
pub use proto::{ContainerDevices, ContainerResources, DecodeError, PodResources};

#[cfg(test)]
pub(crate) mod fake;
