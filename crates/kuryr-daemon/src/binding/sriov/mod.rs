//! SR-IOV binding: move a VF's netdev into the pod and configure it there.
//!
//! The controller cannot know which VF the device plugin gave the pod, so a
//! `VIFSriov` usually names none (`dev_address` unset): the daemon then picks a
//! free VF of one of the physnet's PFs (`[sriov] physical_device_mappings`,
//! `physnet:pf`), sets the port's MAC and the network's VLAN on it through the
//! PF, moves it into the pod and configures L3 there.
//!
//! With the SR-IOV network device plugin the kubelet has already given the
//! pod specific VFs; picking another one would let two pods swap VFs. With
//! `[sriov] enable_pod_resource_service = True` the daemon therefore asks the
//! kubelet's PodResources service ([`crate::kubelet`]) for the pod's devices
//! of the physnet's resource (`[sriov] physnet_resource_mappings`, with
//! `device_plugin_resource_prefix`, mapped by kuryr-config as the controller
//! maps them) and takes the first of them that no other interface of the pod
//! uses yet.
//!
//! - [`sysfs`]: what sysfs says about PFs and VFs
//! - [`allocation`]: which VF an ADD takes (kubelet allocation or free VF), claims
//! - [`driver`]: the [`BindingDriver`](super::BindingDriver) that moves it

mod allocation;
mod driver;
mod sysfs;

use std::path::PathBuf;
use std::time::Duration;

pub use allocation::{VfCandidate, find_free_vf};
pub use driver::SriovDriver;
pub use sysfs::sriov_capable_pfs;

/// Where the daemon looks for VFs.
#[derive(Clone, Debug, PartialEq)]
pub struct SriovConfig {
    /// `[sriov]` of `kuryr.conf` (checked when it loaded): the PFs of each
    /// physnet, `enable_pod_resource_service` (a VIF without `dev_address`
    /// gets a VF the kubelet allocated to the pod, never any free VF),
    /// `kubelet_root_dir` (the PodResources socket is
    /// `pod-resources/kubelet.sock` in it) and the physnet -> device-plugin
    /// resource mapping.
    pub options: kuryr_config::SriovSection,
    /// Root of sysfs (`/sys`); tests point it at a fake tree.
    pub sysfs_root: PathBuf,
    /// Bound on one PodResources call (connect included).
    pub kubelet_timeout: Duration,
}

impl Default for SriovConfig {
    fn default() -> Self {
        Self {
            options: kuryr_config::SriovSection::default(),
            sysfs_root: PathBuf::from("/sys"),
            kubelet_timeout: Duration::from_secs(10),
        }
    }
}
