//! Neutron port -> os-vif VIF (the JSON upstream stores in KuryrPort status and the CNI daemon
//! plugs). Mirrors upstream's `os_vif_util.neutron_to_osvif_vif*`.

use std::net::IpAddr;

use kuryr_crds::vif::{
    FixedIp, Network, PortProfile, Route, Subnet, Vif, VifBase, VifBridge, VifMacvlanNested, VifOpenVSwitch,
    VifSriov, VifVlanNested,
};
use kuryr_neutron::Port;

use super::NetworkInfo;
use crate::error::Error;

/// Which os-vif object the VIF driver produces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VifKind {
    /// Bare metal: decided by the port's `binding:vif_type` (ovs or bridge).
    Bound {
        ovs_bridge: String,
    },
    VlanNested {
        vlan_id: u16,
    },
    MacvlanNested,
    Sriov {
        physnet: Option<String>,
    },
}

/// Builds the os-vif network object: one Subnet per subnet the port has an address on, with the
/// subnet's host routes, DNS and (optional) gateway.
pub fn os_vif_network(port: &Port, network: &NetworkInfo, mtu_override: u32) -> Result<Network, Error> {
    let mut net = Network::new(network.id.clone());
    net.label = Some(network.name.clone());
    net.mtu = if mtu_override > 0 {
        Some(mtu_override)
    } else {
        network.mtu
    };
    for subnet in &network.subnets {
        let ips: Vec<IpAddr> = port
            .fixed_ips
            .iter()
            .filter(|f| f.subnet_id == subnet.id)
            .map(|f| {
                f.ip_address.parse().map_err(|_| {
                    Error::invalid(
                        format!("port {} fixed_ips.ip_address", port.id),
                        f.ip_address.clone(),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        if ips.is_empty() {
            continue;
        }
        let gateway = match subnet.gateway_ip.as_deref() {
            Some(g) if !g.is_empty() => Some(
                g.parse::<IpAddr>()
                    .map_err(|_| Error::invalid(format!("subnet {} gateway_ip", subnet.id), g.to_string()))?,
            ),
            _ => None,
        };
        let mut s = Subnet::new(subnet.cidr.clone(), gateway);
        s.dns = subnet
            .dns_nameservers
            .iter()
            .filter_map(|d| d.parse().ok())
            .collect();
        s.ips.objects = ips.into_iter().map(FixedIp::new).collect();
        s.routes.objects = subnet
            .host_routes
            .iter()
            .map(|r| Route::new(r.destination.clone(), r.nexthop.parse().ok()))
            .collect();
        net.subnets.objects.push(s);
    }
    Ok(net)
}

/// Builds the VIF for `port`. `active` follows the Neutron port status.
pub fn vif_from_port(
    port: &Port,
    network: &NetworkInfo,
    kind: &VifKind,
    mtu_override: u32,
) -> Result<Vif, Error> {
    let net = os_vif_network(port, network, mtu_override)?;
    let mk_base = |plugin: &str| {
        let mut b = VifBase::new(port.id.clone(), plugin);
        b.address = Some(port.mac_address.clone());
        b.network = Some(net.clone());
        b.active = port.is_active();
        b
    };
    Ok(match kind {
        VifKind::Bound { ovs_bridge } => match port.binding_vif_type.as_str() {
            "bridge" => {
                let mut base = mk_base("linux_bridge");
                base.has_traffic_filtering = true;
                Vif::Bridge(VifBridge {
                    base,
                    // Linux bridge agent naming: brq + first 11 chars of the network id.
                    bridge_name: Some(format!("brq{}", network.id.chars().take(11).collect::<String>())),
                    obj: Default::default(),
                })
            }
            _ => {
                let mut base = mk_base("ovs");
                let details = &port.binding_vif_details;
                base.has_traffic_filtering = details
                    .get("port_filter")
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(false);
                base.port_profile = Some(PortProfile::open_vswitch(port.id.clone()));
                let bridge = details
                    .get("bridge_name")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| ovs_bridge.clone());
                Vif::OpenVSwitch(VifOpenVSwitch {
                    base,
                    bridge_name: Some(bridge),
                    obj: Default::default(),
                })
            }
        },
        VifKind::VlanNested { vlan_id } => Vif::VlanNested(VifVlanNested {
            base: mk_base("noop"),
            vlan_id: *vlan_id,
            obj: Default::default(),
        }),
        VifKind::MacvlanNested => Vif::MacvlanNested(VifMacvlanNested {
            base: mk_base("noop"),
            obj: Default::default(),
        }),
        VifKind::Sriov { physnet } => Vif::Sriov(VifSriov {
            base: mk_base("sriov"),
            dev_address: None,
            mode: Some("passthrough".into()),
            vlan_name: None,
            physnet: physnet.clone(),
            pod_name: None,
            pod_link: None,
            obj: Default::default(),
        }),
    })
}
