//! Binding drivers: put one VIF into a pod's network namespace.
//!
//! Every driver implements [`BindingDriver`] (setup / teardown / check). A
//! driver only makes the pod-side link appear in the pod namespace under its
//! final name; the L3 configuration (MAC, MTU, addresses, routes) is common
//! and lives in [`l3`]. Teardown is best effort: it attempts every step and
//! returns all the errors it met.

mod hybrid;
pub mod l3;
mod nested;
mod ovs;
pub mod ovsdb;
mod sriov;
mod veth;

pub use hybrid::{HybridDevices, HybridOvsDriver};
pub use nested::{MacvlanDriver, VlanDriver};
pub use ovs::{Added, OvsProbe, disable_tx_checksum, is_userspace_datapath, ovs_available_at};
pub use sriov::{SriovConfig, SriovDriver, VfCandidate, find_free_vf, sriov_capable_pfs};
pub use veth::{BridgeDriver, OvsDriver, delete_netns_link, ensure_bridge};

use std::net::IpAddr;

use async_trait::async_trait;

use kuryr_config::OvsPlugMode;

use crate::netlink::{IpPrefix, MacAddr, NetNs, NetlinkError};

/// One interface to configure in the pod, independent of the os-vif wire
/// format (built from a VIF by [`crate::vif`]). Kept in the daemon's state
/// files ([`crate::state`]), so that a restarted daemon can tear it down.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlugSpec {
    /// Neutron port id.
    pub port_id: String,
    /// Name inside the pod (`eth0`, `eth1`, ...).
    pub ifname: String,
    /// Host-side name for veth based bindings (os-vif `vif_name`, `tapXXXXXXXX-XX`).
    pub host_ifname: String,
    pub mac: MacAddr,
    pub mtu: Option<u32>,
    /// Every fixed IP of the port with its subnet's prefix length.
    pub addresses: Vec<IpPrefix>,
    /// Subnet gateways, one per subnet that has one.
    pub gateways: Vec<IpAddr>,
    /// Extra routes of the subnets (`cidr via gateway`).
    pub routes: Vec<SubnetRoute>,
    /// Only the default interface gets the default route(s).
    pub is_default: bool,
    pub kind: PlugKind,
}

impl PlugSpec {
    /// The gateway of `addr`'s subnet: one inside it, or, for an IPv6 address, an IPv6
    /// link-local one (Neutron allows them, and they are always on-link).
    pub fn gateway_of(&self, addr: &IpPrefix) -> Option<IpAddr> {
        let inside = self.gateways.iter().copied().find(|g| addr.contains(*g));
        inside.or_else(|| {
            addr.addr
                .is_ipv6()
                .then(|| self.gateways.iter().copied().find(|g| is_link_local_v6(*g)))
                .flatten()
        })
    }

    /// The gateways of the default routes: the first of each family that serves one of the
    /// addresses (a gateway off every subnet would be refused by the kernel, ENETUNREACH).
    pub fn default_gateways(&self) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = Vec::new();
        for gw in &self.gateways {
            let on_link = self.addresses.iter().any(|a| self.gateway_of(a) == Some(*gw));
            if on_link && !out.iter().any(|o| o.is_ipv4() == gw.is_ipv4()) {
                out.push(*gw);
            }
        }
        out
    }
}

fn is_link_local_v6(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SubnetRoute {
    pub destination: IpPrefix,
    pub gateway: Option<IpAddr>,
}

/// What kind of binding the VIF asks for.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PlugKind {
    /// veth, host end on a Linux bridge (os-vif VIFBridge).
    Bridge { bridge: String },
    /// veth, host end plugged into an OVS bridge (VIFOpenVSwitch).
    OpenVSwitch { bridge: String },
    /// veth, host end on a per-port Linux bridge `bridge` joined to the OVS bridge
    /// `ovs_bridge` by another veth (VIFBridge of plugin `ovs`: OVS hybrid plug).
    HybridOvs { bridge: String, ovs_bridge: String },
    /// VLAN device on the node's trunk interface (VIFVlanNested).
    VlanNested { vlan_id: u16 },
    /// macvlan on the node's interface (VIFMacvlanNested).
    MacvlanNested,
    /// A VF netdev moved into the pod (VIFSriov). `pci_address` names the VF
    /// when the VIF carries it (`dev_address`); otherwise the daemon takes a
    /// VF the kubelet allocated to the pod (`[sriov]
    /// enable_pod_resource_service`) or picks a free VF of one of `physnet`'s
    /// PFs (`[sriov] physical_device_mappings`).
    /// `vlan` (the network's segmentation id) is set on the VF through its PF.
    Sriov {
        pci_address: Option<String>,
        physnet: Option<String>,
        vlan: Option<u16>,
    },
}

impl PlugKind {
    pub fn driver_name(&self) -> &'static str {
        match self {
            Self::Bridge { .. } => "neutron-vif/bridge",
            Self::OpenVSwitch { .. } => "neutron-vif/ovs",
            Self::HybridOvs { .. } => "neutron-vif/ovs-hybrid",
            Self::VlanNested { .. } => "nested-vlan",
            Self::MacvlanNested => "nested-macvlan",
            Self::Sriov { .. } => "sriov",
        }
    }
}

/// Where to plug: the pod's namespace and who it belongs to.
pub struct PlugTarget<'a> {
    /// None on teardown when the namespace is already gone: drivers then
    /// clean only the host side.
    pub netns: Option<&'a NetNs>,
    /// Pod UID, recorded as OVS `vm-uuid`.
    pub pod_uid: &'a str,
    /// Written into the host-side link's alias so that a restarted daemon
    /// knows which container owns it (see [`crate::registry`]).
    pub owner_tag: Option<&'a str>,
}

impl<'a> PlugTarget<'a> {
    pub fn new(netns: &'a NetNs, pod_uid: &'a str) -> Self {
        Self {
            netns: Some(netns),
            pod_uid,
            owner_tag: None,
        }
    }

    /// The pod being plugged, from the owner tag ADD sets
    /// (`kuryr:<container>:<namespace>/<name>`); `None` outside an ADD.
    pub fn pod(&self) -> Option<crate::registry::PodKey> {
        self.owner_tag
            .and_then(crate::registry::PodKey::parse_owner_tag)
            .map(|(pod, _)| pod)
    }

    /// The alias the host-side link gets: the owner tag, unless it is longer than the kernel takes
    /// (IFALIASZ - 1 = 255 bytes: a 64-character container id with a namespace and pod name of 184
    /// or more; the whole link update would be refused). Such a pod's ownership is in the state
    /// directory only.
    pub fn alias(&self) -> Option<&'a str> {
        const IFALIAS_MAX: usize = 255;
        self.owner_tag.filter(|t| t.len() <= IFALIAS_MAX)
    }

    pub(crate) fn require_netns(&self) -> Result<&'a NetNs, BindingError> {
        self.netns.ok_or_else(|| BindingError::InvalidVif {
            field: "CNI_NETNS".into(),
            message: "the pod network namespace is required".into(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("{driver}: not supported on this node: {reason}")]
    Unsupported { driver: &'static str, reason: String },
    /// The device the VIF needs is not to be had (SR-IOV: the kubelet lists
    /// no VF for the pod, or cannot be asked).
    #[error("{driver}: {reason}")]
    NoDevice { driver: &'static str, reason: String },
    /// What the VIF needs is held by something that goes by itself (a deleted pod's network
    /// namespace the runtime has not removed yet): worth trying again later.
    #[error("{driver}: {reason}")]
    Busy { driver: &'static str, reason: String },
    #[error("{driver}: MTU {requested} is above the parent interface {parent}'s MTU {parent_mtu}")]
    MtuTooLarge {
        driver: &'static str,
        requested: u32,
        parent: String,
        parent_mtu: u32,
    },
    /// ovsdb-server refused an operation (named like the `ovs-vsctl`
    /// command that does the same), or ovs-vswitchd did not apply it.
    #[error("ovsdb {args}: {message}")]
    Ovs { args: String, message: String },
    /// ovsdb-server could not be reached, or did not answer in time.
    #[error("ovsdb {args}: {source}")]
    OvsUnreachable {
        args: String,
        #[source]
        source: ovsdb::OvsdbError,
    },
    #[error("check failed for {ifname}: {message}")]
    Check { ifname: String, message: String },
    #[error("invalid VIF: {field}: {message}")]
    InvalidVif { field: String, message: String },
}

/// Every error met while tearing down (teardown never stops at the first).
#[derive(Debug, thiserror::Error)]
#[error("teardown errors: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct TeardownError(pub Vec<BindingError>);

impl TeardownError {
    pub fn into_result(errors: Vec<BindingError>) -> Result<(), TeardownError> {
        if errors.is_empty() {
            Ok(())
        } else {
            Err(TeardownError(errors))
        }
    }
}

#[async_trait]
pub trait BindingDriver: Send + Sync {
    fn name(&self) -> &'static str;

    /// Create and configure the pod interface. Leftovers of an earlier,
    /// interrupted setup with the same names are removed first, so a retried
    /// ADD succeeds.
    async fn setup(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError>;

    /// Remove what setup created; missing pieces are not errors.
    async fn teardown(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), TeardownError>;

    /// Verify the interface is still there as setup left it.
    async fn check(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError>;
}

/// Node-level binding settings (`[binding]`, `[neutron_defaults]`).
#[derive(Clone, Debug)]
pub struct BindingConfig {
    /// `[binding] link_iface`: parent of nested VLAN/macvlan devices.
    pub link_iface: Option<String>,
    /// `[neutron_defaults] ovs_bridge` (default `br-int`).
    pub ovs_bridge: String,
    /// Linux bridge used when a VIFBridge names none.
    pub default_bridge: String,
    /// Seconds an OVS operation may take, ovs-vswitchd applying it included.
    pub ovs_timeout_secs: u32,
    /// ovsdb-server to talk to: `unix:/path/db.sock` or `tcp:host:port`.
    /// `None`: ovs-vsctl's default (`unix:$OVS_RUNDIR/db.sock`, else
    /// `unix:/var/run/openvswitch/db.sock`).
    pub ovs_db: Option<String>,
    /// `datapath_type` of an OVS bridge the daemon has to create because no
    /// agent did (`system`: kernel module, `netdev`: userspace). Existing
    /// bridges keep theirs.
    pub ovs_datapath_type: String,
    /// How `VIFOpenVSwitch` VIFs are plugged on this node (`[binding]
    /// ovs_plug_mode`). Neutron decides the VIF type from the agent on the
    /// port's host, not from what the node can do: a node without Open
    /// vSwitch whose L2 is a Linux bridge may choose `LinuxBridge`, and the
    /// veth then goes on a Linux bridge named like the VIF's OVS bridge. The
    /// OVS agent does not see such ports (no flows, no security groups): an
    /// operator's explicit choice, never a fallback.
    pub ovs_plug: OvsPlugMode,
    /// TX checksum offload of the pod end of OVS-bound veths.
    pub pod_tx_checksum: TxChecksumMode,
    /// SR-IOV: where the daemon picks VFs for `VIFSriov` VIFs that name none
    /// (PFs of the physnet, or the kubelet's PodResources service).
    pub sriov: SriovConfig,
}

/// What the OVS binding does with the pod end's TX checksum offload (`[binding]
/// pod_tx_checksum_offload`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TxChecksumMode {
    /// Off on a userspace-datapath bridge (see [`disable_tx_checksum`]), untouched otherwise.
    #[default]
    Auto,
    /// Always off: for datapaths the daemon does not recognise that forward partial checksums too.
    Off,
    /// Never touched (an operator who knows the datapath completes checksums).
    On,
}

impl TxChecksumMode {
    /// Whether the pod end's TX checksum offload goes off on a bridge with `datapath_type`.
    pub fn disables_on(self, datapath_type: &str) -> bool {
        match self {
            Self::Auto => ovs::is_userspace_datapath(datapath_type),
            Self::Off => true,
            Self::On => false,
        }
    }
}

impl Default for BindingConfig {
    fn default() -> Self {
        Self {
            link_iface: None,
            ovs_bridge: "br-int".into(),
            default_bridge: "kuryr-br0".into(),
            ovs_timeout_secs: 10,
            ovs_db: None,
            ovs_datapath_type: "system".into(),
            ovs_plug: OvsPlugMode::Ovs,
            pod_tx_checksum: TxChecksumMode::default(),
            sriov: SriovConfig::default(),
        }
    }
}

/// Picks the driver for a [`PlugKind`].
pub struct BindingDrivers {
    bridge: BridgeDriver,
    ovs: OvsDriver,
    hybrid: HybridOvsDriver,
    vlan: VlanDriver,
    macvlan: MacvlanDriver,
    sriov: SriovDriver,
}

impl BindingDrivers {
    pub fn new(config: &BindingConfig) -> Self {
        Self {
            bridge: BridgeDriver,
            ovs: OvsDriver::new(config),
            hybrid: HybridOvsDriver::new(config),
            vlan: VlanDriver::new(config.link_iface.clone()),
            macvlan: MacvlanDriver::new(config.link_iface.clone()),
            sriov: SriovDriver::new(config.sriov.clone()),
        }
    }

    /// The OVS driver (for cleanups that are not tied to one spec).
    pub fn ovs(&self) -> &OvsDriver {
        &self.ovs
    }

    pub fn for_kind(&self, kind: &PlugKind) -> &dyn BindingDriver {
        match kind {
            PlugKind::Bridge { .. } => &self.bridge,
            PlugKind::OpenVSwitch { .. } => &self.ovs,
            PlugKind::HybridOvs { .. } => &self.hybrid,
            PlugKind::VlanNested { .. } => &self.vlan,
            PlugKind::MacvlanNested => &self.macvlan,
            PlugKind::Sriov { .. } => &self.sriov,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::PodKey;

    #[test]
    fn an_add_target_names_its_pod() {
        let tag = PodKey::new("ns", "p").owner_tag("c1");
        let target = PlugTarget {
            netns: None,
            pod_uid: "u",
            owner_tag: Some(&tag),
        };
        assert_eq!(target.pod(), Some(PodKey::new("ns", "p")));
        assert_eq!(target.alias(), Some(tag.as_str()));
        let long = PodKey::new("a".repeat(63), "b".repeat(200)).owner_tag(&"c".repeat(64));
        let target_long = PlugTarget {
            owner_tag: Some(&long),
            ..target
        };
        assert_eq!(target_long.alias(), None, "over the kernel's 255 bytes");
        assert!(target_long.pod().is_some(), "the pod is still known");
        let target = PlugTarget {
            owner_tag: None,
            ..target
        };
        assert_eq!(target.pod(), None);
    }

    #[test]
    fn tx_checksum_goes_off_on_userspace_bridges_unless_configured_otherwise() {
        assert!(TxChecksumMode::default().disables_on("netdev"));
        assert!(!TxChecksumMode::Auto.disables_on("system"));
        assert!(!TxChecksumMode::Auto.disables_on(""));
        assert!(TxChecksumMode::Off.disables_on("system"));
        assert!(!TxChecksumMode::On.disables_on("netdev"));
    }
}
