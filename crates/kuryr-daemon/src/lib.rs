//! kuryr-daemon: the CNI daemon of kuryr-rs.
//!
//! - [`netlink`]: thin typed netlink layer (namespaces entered on dedicated OS threads)
//! - [`binding`]: binding drivers (`neutron-vif` bridge/OVS, `nested-vlan`, `nested-macvlan`, `sriov`)
//! - [`vif`]: os-vif VIFs to binding specs and CNI results
//! - [`registry`]: in-memory pods/KuryrPorts/attachments of this node
//! - [`state`]: attachments kept on disk for a restarted daemon
//! - [`daemon`]: CNI ADD/DEL/CHECK/GC logic; [`server`]: HTTP API, health, metrics
//! - [`kubelet`]: the kubelet's PodResources service (VFs the device plugin gave a pod)
//! - [`kube`]: watchers feeding the registry, Events, and [`kube::run`] for the CLI
//! - [`api`]: wire format and error codes

pub mod api;
pub mod binding;
pub mod daemon;
pub mod kube;
pub mod kubelet;
pub mod liveness;
pub mod metrics;
pub mod netlink;
pub mod registry;
pub mod server;
pub mod state;
pub mod vif;

pub use daemon::{ApiHealth, Daemon, DaemonConfig, NoEvents, PodEvents};
pub mod testing;
