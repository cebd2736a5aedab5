//! kuryr-daemon: the CNI daemon of kuryr-rs.
//!
//! - [`netlink`]: thin typed netlink layer (namespaces entered on dedicated OS threads)
//! - [`binding`]: binding drivers (`neutron-vif` bridge/OVS, `nested-vlan`, `nested-macvlan`, `sriov`)

pub mod binding;
pub mod netlink;
