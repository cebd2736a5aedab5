//! Multi-VIF drivers (`[kubernetes] multi_vif_drivers`): the pod's interfaces beyond
//! `eth0`.
//!
//! Two phases, so a pod is never left half-wired:
//! 1. **plan** ([`MultiVifDriver::plan`], [`plan_all`]): each enabled driver reads the pod
//!    (annotations, resource requests), resolves subnets, NADs and pre-created ports, and
//!    validates everything. No Neutron writes; a bad request is an [`Error::InvalidInput`]
//!    naming the field, which the kuryrport handler turns into an Event on the pod.
//! 2. **acquire** (`crate::wiring`): ports are taken from the pool, created, or adopted
//!    (`spec-ports`), together with eth0. If one fails, everything acquired for the pod so far
//!    is released.
//!
//! Drivers only describe *what* a pod needs ([`PlannedVif`]); how a port is obtained and given
//! back is `crate::wiring`'s, the same for every interface of the pod.
//!
//! - [`additional_subnets::AdditionalSubnets`] (`additional_subnets`)
//! - [`npwg::NpwgMultipleInterfaces`] (`npwg_multiple_interfaces`)
//! - [`sriov::Sriov`] (`sriov`)
//! - [`specific_ports::SpecificPorts`] (`specific_ports`)

pub mod additional_subnets;
pub mod npwg;
pub mod specific_ports;
pub mod sriov;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kuryr_config::{MultiVifDriver as MultiVifName, PodVifDriver};
use kuryr_crds::Vif;
use kuryr_crds::names::{DEFAULT_IFNAME, additional_ifname};
use kuryr_neutron::{FixedIpRequest, Port, PortUpdate};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::subnets::SubnetCache;
use super::{NetworkInfo, PodRef, PortSpec};
use crate::context::Platform;
use crate::error::Error;

/// `binding:vnic_type` of SR-IOV ports.
pub const VNIC_DIRECT: &str = "direct";
/// `binding:vnic_type` of ordinary ports.
pub const VNIC_NORMAL: &str = "normal";
/// The field name of [`MultiVifRecord`] inside a KuryrPort `status.vifs` entry.
pub const RECORD_FIELD: &str = "kuryrRsMultiVif";
/// Name of the pod's default network in `k8s.v1.cni.cncf.io/network-status`.
pub const DEFAULT_NETWORK_NAME: &str = "kuryr";
/// Longest Linux interface name (IFNAMSIZ - 1).
const MAX_IFNAME: usize = 15;

/// What a multi-VIF driver needs to know about the pod's default interface: its deployment,
/// project and security groups are inherited by the additional ones.
pub struct PodNetworking<'a> {
    pub pod: &'a Pod,
    pub podref: &'a PodRef,
    pub default: &'a PortSpec,
    /// `[kubernetes] pod_vif_driver` in use (some sources only work on bare metal).
    pub vif_driver: PodVifDriver,
}

impl PodNetworking<'_> {
    /// A spec for an extra interface on `network`, in the pod's deployment and project.
    pub fn spec_on(&self, network: Arc<NetworkInfo>, vnic_type: &str) -> PortSpec {
        let mut spec = PortSpec::new(
            self.default.deployment.clone(),
            self.default.project_id.clone(),
            network,
            self.default.security_groups.clone(),
        );
        spec.vnic_type = vnic_type.to_string();
        spec
    }

    pub fn bare_metal(&self) -> bool {
        self.vif_driver == PodVifDriver::NeutronVif
    }
}

/// How one additional interface's port is obtained.
#[derive(Clone, Debug)]
pub enum PortSource {
    /// From the pool (or created per pod by the `noop` pool) through the pod VIF driver.
    Pooled { spec: PortSpec },
    /// Created for this pod only: requested addresses/MAC (bare metal) or an SR-IOV VF port.
    /// Deleted on release.
    Create {
        spec: PortSpec,
        fixed_ips: Vec<FixedIpRequest>,
        mac: Option<String>,
        /// `Some` for `direct` (SR-IOV) ports.
        physnet: Option<String>,
    },
    /// A pre-created port (`spec-ports`), validated free and in the pod's project. Bound to the
    /// pod on acquire, restored (never deleted) on release.
    Adopt {
        deployment: String,
        port: Box<Port>,
        network: Arc<NetworkInfo>,
        /// `Some` when the port is `direct`: it is plugged as an SR-IOV VF.
        physnet: Option<Option<String>>,
        /// What release puts back.
        restore: PortRestore,
    },
}

/// One additional interface a driver wants for the pod (phase 1 result).
#[derive(Clone, Debug)]
pub struct PlannedVif {
    /// Multi-VIF driver that asked for it.
    pub driver: &'static str,
    /// Interface name the user asked for (NPWG `interface`); numbered otherwise.
    pub ifname: Option<String>,
    /// Network name reported in `network-status` (NAD `namespace/name`, `subnet:<id>`, ...).
    pub network: String,
    pub source: PortSource,
}

/// How an additional VIF goes back on release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReleaseMode {
    /// Through the pool driver (recycled, or deleted by `noop`).
    Pool,
    /// Port made for this pod only: deleted.
    Delete,
    /// Pre-created port: its attributes are restored; never deleted or pooled.
    Restore,
}

/// What a pre-created port looked like before the pod took it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortRestore {
    pub name: String,
    pub device_id: String,
    pub device_owner: String,
    pub host_id: String,
}

impl PortRestore {
    /// A port's state before kuryr claims it.
    pub fn of(port: &Port) -> Self {
        Self {
            name: port.name.clone(),
            device_id: port.device_id.clone(),
            device_owner: port.device_owner.clone(),
            host_id: port.binding_host_id.clone(),
        }
    }

    /// A port this pod had claimed when a crash interrupted the claim: kuryr claims only ports
    /// without a device and leaves their name alone, so this is what it was (a host binding set
    /// before the claim is the one thing that cannot be told apart; it is cleared).
    pub fn unclaimed(port: &Port) -> Self {
        Self {
            name: port.name.clone(),
            device_id: String::new(),
            device_owner: String::new(),
            host_id: String::new(),
        }
    }

    /// The update that puts the port back as it was.
    pub fn update(&self) -> PortUpdate {
        PortUpdate {
            name: Some(self.name.clone()),
            device_id: Some(self.device_id.clone()),
            device_owner: Some(self.device_owner.clone()),
            binding_host_id: Some(self.host_id.clone()),
            ..Default::default()
        }
    }
}

/// Stored next to each additional VIF in KuryrPort status (an extra field upstream ignores), so
/// release and `network-status` work after a restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MultiVifRecord {
    pub driver: String,
    pub network: String,
    pub release: ReleaseMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<PortRestore>,
}

#[async_trait]
pub trait MultiVifDriver: Send + Sync {
    /// The `[kubernetes] multi_vif_drivers` name.
    fn name(&self) -> &'static str;

    /// Phase 1: the pod's additional interfaces, validated and resolved, with no Neutron writes.
    /// A pod that asks for nothing gets an empty list.
    async fn plan(&self, net: &PodNetworking<'_>) -> Result<Vec<PlannedVif>, Error>;
}

/// Builds the drivers `[kubernetes] multi_vif_drivers` names, in order (`noop` adds none).
pub fn from_config(ctx: &Platform, subnets: &SubnetCache) -> Result<Vec<Arc<dyn MultiVifDriver>>, Error> {
    let mut out: Vec<Arc<dyn MultiVifDriver>> = vec![];
    let mut seen = BTreeSet::new();
    for name in &ctx.config.kubernetes.multi_vif_drivers {
        if !seen.insert(name.as_str()) {
            return Err(Error::Config(format!(
                "[kubernetes] multi_vif_drivers lists {} twice",
                name.as_str()
            )));
        }
        match name {
            MultiVifName::Noop => {}
            MultiVifName::AdditionalSubnets => out.push(Arc::new(
                additional_subnets::AdditionalSubnets::new(subnets.clone()),
            )),
            MultiVifName::NpwgMultipleInterfaces => out.push(Arc::new(npwg::NpwgMultipleInterfaces::new(
                ctx.kube.clone(),
                subnets.clone(),
                ctx.config.clone(),
            ))),
            MultiVifName::Sriov => out.push(Arc::new(sriov::Sriov::new(&ctx.config.sriov, subnets.clone()))),
            MultiVifName::SpecificPorts => out.push(Arc::new(specific_ports::SpecificPorts::new(
                ctx.deployments.clone(),
                subnets.clone(),
                ctx.config.sriov.clone(),
            ))),
        }
    }
    Ok(out)
}

/// Runs every driver's plan phase and names the interfaces: NPWG-requested names first, then
/// `prefix1`, `prefix2`, ... numbered across drivers in configuration order, skipping taken
/// names. Returns (ifname, plan) pairs.
pub async fn plan_all(
    drivers: &[Arc<dyn MultiVifDriver>],
    net: &PodNetworking<'_>,
    prefix: &str,
) -> Result<Vec<(String, PlannedVif)>, Error> {
    let mut plans = vec![];
    for d in drivers {
        plans.extend(d.plan(net).await?);
    }
    assign_ifnames(plans, prefix)
}

/// Names the planned interfaces (see [`plan_all`]).
pub fn assign_ifnames(plans: Vec<PlannedVif>, prefix: &str) -> Result<Vec<(String, PlannedVif)>, Error> {
    let mut taken = BTreeSet::from([DEFAULT_IFNAME.to_string()]);
    for p in &plans {
        if let Some(name) = &p.ifname {
            check_ifname(name)?;
            if !taken.insert(name.clone()) {
                return Err(Error::invalid(
                    format!("interface of network {}", p.network),
                    format!(
                        "interface name {name:?} is used twice in the pod (eth0 is the default interface)"
                    ),
                ));
            }
        }
    }
    let mut index = 0;
    let mut out = Vec::with_capacity(plans.len());
    for p in plans {
        let name = match &p.ifname {
            Some(n) => n.clone(),
            None => loop {
                index += 1;
                let candidate = additional_ifname(prefix, index);
                if taken.insert(candidate.clone()) {
                    break candidate;
                }
            },
        };
        out.push((name, p));
    }
    Ok(out)
}

/// Linux accepts interface names of 1..=15 bytes without '/', ':' or whitespace.
pub fn check_ifname(name: &str) -> Result<(), Error> {
    let bad = name.is_empty()
        || name.len() > MAX_IFNAME
        || name == "."
        || name == ".."
        || name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace());
    if bad {
        return Err(Error::invalid(
            "interface",
            format!(
                "{name:?} is not a valid interface name (1-{MAX_IFNAME} characters, no '/', ':' or spaces)"
            ),
        ));
    }
    Ok(())
}

/// SR-IOV VIFs are active once created: the VF is moved by the CNI daemon and Neutron may have
/// no agent that would report the port ACTIVE (upstream `SriovVIFDriver.activate_vif` does the
/// same).
pub fn activates_immediately(vif: &Vif) -> bool {
    matches!(vif, Vif::Sriov(_))
}

/// Checks `ip` is an address of `cidr`; both as Neutron writes them.
pub fn ip_in_cidr(ip: IpAddr, cidr: &str) -> bool {
    let Ok((net, prefix)) = kuryr_crds::vif::parse_cidr("cidr", cidr) else {
        return false;
    };
    let (a, b, bits) = match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b)), 32u32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128u32),
        _ => return false,
    };
    let host_bits = bits - u32::from(prefix);
    if host_bits >= 128 {
        return true;
    }
    (a >> host_bits) == (b >> host_bits)
}

/// One entry of `k8s.v1.cni.cncf.io/network-status`.
pub fn network_status_entry(network: &str, ifname: &str, vif: &Vif, default: bool) -> Value {
    let ips: Vec<String> = vif.fixed_ips().map(|(_, ip)| ip.to_string()).collect();
    let mut dns: Vec<String> = vif
        .network()
        .map(|n| {
            n.subnets
                .objects
                .iter()
                .flat_map(|s| s.dns.iter().map(IpAddr::to_string))
                .collect()
        })
        .unwrap_or_default();
    dns.dedup();
    let mut entry = json!({
        "name": network,
        "interface": ifname,
        "ips": ips,
        "mac": vif.address().unwrap_or_default(),
        "default": default,
        "dns": {},
    });
    if !dns.is_empty() {
        entry["dns"] = json!({ "nameservers": dns });
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(ifname: Option<&str>, network: &str) -> PlannedVif {
        let net = Arc::new(NetworkInfo {
            id: "n".into(),
            name: "n".into(),
            mtu: None,
            subnets: vec![],
        });
        PlannedVif {
            driver: "test",
            ifname: ifname.map(str::to_string),
            network: network.into(),
            source: PortSource::Pooled {
                spec: PortSpec::new("default", "p", net, vec![]),
            },
        }
    }

    #[test]
    fn interfaces_are_numbered_across_drivers_around_requested_names() {
        let plans = vec![
            planned(None, "a"),
            planned(Some("eth2"), "b"),
            planned(None, "c"),
            planned(Some("net1"), "d"),
            planned(None, "e"),
        ];
        let names: Vec<String> = assign_ifnames(plans, "eth")
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["eth1", "eth2", "eth3", "net1", "eth4"]);
    }

    #[test]
    fn duplicate_or_invalid_interface_names_are_rejected() {
        let e = assign_ifnames(vec![planned(Some("eth0"), "x")], "eth").unwrap_err();
        assert!(e.to_string().contains("\"eth0\" is used twice"), "{e}");
        let e = assign_ifnames(vec![planned(Some("a"), "x"), planned(Some("a"), "y")], "eth").unwrap_err();
        assert!(e.to_string().contains("network y"), "{e}");
        for bad in ["", "a/b", "has space", "abcdefghijklmnop"] {
            assert!(check_ifname(bad).is_err(), "{bad:?}");
        }
        assert!(check_ifname("net-1").is_ok());
    }

    #[test]
    fn addresses_are_checked_against_the_subnet() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(ip_in_cidr(ip("10.1.2.3"), "10.1.2.0/24"));
        assert!(!ip_in_cidr(ip("10.1.3.3"), "10.1.2.0/24"));
        assert!(ip_in_cidr(ip("2001:db8::5"), "2001:db8::/64"));
        assert!(!ip_in_cidr(ip("10.1.2.3"), "2001:db8::/64"));
        assert!(ip_in_cidr(ip("1.2.3.4"), "0.0.0.0/0"));
    }

    #[test]
    fn records_round_trip_with_upstream_ignorable_names() {
        let r = MultiVifRecord {
            driver: "specific_ports".into(),
            network: "port:x".into(),
            release: ReleaseMode::Restore,
            restore: Some(PortRestore {
                name: "mine".into(),
                device_id: String::new(),
                device_owner: String::new(),
                host_id: String::new(),
            }),
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["release"], "restore");
        assert_eq!(v["restore"]["deviceOwner"], "");
        assert_eq!(serde_json::from_value::<MultiVifRecord>(v).unwrap(), r);
    }
}
