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
            // OVS-DPDK's vhost-user sockets are not plugged by kuryr-rs: wiring it as an OVS veth
            // would leave the pod without a working interface, so it is refused, naming why.
            "vhostuser" => {
                return Err(Error::Config(format!(
                    "port {}: binding:vif_type vhostuser (OVS-DPDK) is not supported by kuryr-rs; \
                     bind the pods' ports with an OVS agent that is not DPDK, or use SR-IOV",
                    port.id
                )));
            }
            _ => {
                let details = &port.binding_vif_details;
                let flag = |key: &str| details.get(key).and_then(serde_json::Value::as_bool);
                let bridge = details
                    .get("bridge_name")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| ovs_bridge.clone());
                let mut base = mk_base("ovs");
                base.has_traffic_filtering = flag("port_filter").unwrap_or(false);
                base.port_profile = Some(PortProfile::open_vswitch(port.id.clone()));
                if let Some(net) = base.network.as_mut() {
                    net.bridge = Some(bridge.clone());
                }
                // The OVS agent's iptables_hybrid firewall filters on a Linux bridge of the
                // port's own (os-vif's hybrid plug); a pod plugged into the OVS bridge directly
                // would escape its security groups.
                if flag("ovs_hybrid_plug") == Some(true) {
                    Vif::Bridge(VifBridge {
                        base,
                        bridge_name: Some(format!("qbr{}", port.id).chars().take(14).collect()),
                        obj: Default::default(),
                    })
                } else {
                    Vif::OpenVSwitch(VifOpenVSwitch {
                        base,
                        bridge_name: Some(bridge),
                        obj: Default::default(),
                    })
                }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn bound_port(details: serde_json::Value) -> (Port, NetworkInfo) {
        let subnet = kuryr_neutron::Subnet {
            id: "subnet-1".into(),
            cidr: "10.11.9.0/24".into(),
            gateway_ip: Some("10.11.9.1".into()),
            ..Default::default()
        };
        let port = Port {
            id: "2a1b2c3d-1111-4222-8333-944455556666".into(),
            mac_address: "fa:16:3e:bf:84:ff".into(),
            fixed_ips: vec![kuryr_neutron::FixedIp {
                subnet_id: "subnet-1".into(),
                ip_address: "10.11.9.5".into(),
            }],
            status: "DOWN".into(),
            binding_vif_type: "ovs".into(),
            binding_vif_details: serde_json::from_value(details).unwrap(),
            ..Default::default()
        };
        let net = NetworkInfo {
            id: "144164d9-8c21-4274-acec-43245de0aed0".into(),
            name: "ns/luis-net".into(),
            mtu: Some(1450),
            subnets: vec![subnet],
        };
        (port, net)
    }

    fn bound(details: serde_json::Value) -> Vif {
        let (port, net) = bound_port(details);
        let kind = VifKind::Bound {
            ovs_bridge: "br-int".into(),
        };
        vif_from_port(&port, &net, &kind, 0).unwrap()
    }

    /// An OVS-DPDK binding (vhost-user) is refused naming the port and why, not plugged as a veth.
    #[test]
    fn a_vhostuser_binding_is_refused() {
        let (mut port, net) =
            bound_port(serde_json::json!({"vhostuser_socket": "/var/run/openvswitch/vhu1"}));
        port.binding_vif_type = "vhostuser".into();
        let kind = VifKind::Bound {
            ovs_bridge: "br-int".into(),
        };
        let e = vif_from_port(&port, &net, &kind, 0)
            .expect_err("vhostuser")
            .to_string();
        assert!(e.contains("vhostuser") && e.contains(&port.id), "{e}");
    }

    /// A port the OVS agent binds with `ovs_hybrid_plug` (its iptables_hybrid firewall) is
    /// upstream's hybrid VIF: a `VIFBridge` of plugin `ovs` on the port's `qbr` bridge, the OVS
    /// bridge in its network (the daemon joins the two); without it, a `VIFOpenVSwitch`.
    #[test]
    fn a_hybrid_plug_binding_is_a_bridge_vif_of_the_ovs_plugin() {
        let vif =
            bound(serde_json::json!({"port_filter": true, "ovs_hybrid_plug": true, "bridge_name": "br-int"}));
        let Vif::Bridge(b) = &vif else { panic!("{vif:?}") };
        assert_eq!(b.bridge_name.as_deref(), Some("qbr2a1b2c3d-11"));
        assert_eq!(b.base.plugin, "ovs");
        assert!(b.base.has_traffic_filtering);
        assert_eq!(b.base.vif_name, "tap2a1b2c3d-11");
        assert_eq!(
            b.base.port_profile,
            Some(PortProfile::open_vswitch("2a1b2c3d-1111-4222-8333-944455556666"))
        );
        let net = b.base.network.as_ref().unwrap();
        assert_eq!(net.bridge.as_deref(), Some("br-int"));
        // As upstream writes it (its own fixture, made by its os_vif_util).
        let mine = vif.to_primitive().unwrap();
        let theirs: serde_json::Value = serde_json::from_str(include_str!(
            "../../../kuryr-crds/tests/fixtures/upstream/vif-ovs-hybrid.json"
        ))
        .unwrap();
        for key in ["versioned_object.name", "versioned_object.version"] {
            assert_eq!(mine[key], theirs[key], "{key}");
        }
        for key in ["bridge_name", "plugin", "vif_name", "has_traffic_filtering"] {
            let at = |v: &serde_json::Value| v["versioned_object.data"][key].clone();
            assert_eq!(at(&mine), at(&theirs), "{key}");
        }

        for details in [
            serde_json::json!({"port_filter": true, "ovs_hybrid_plug": false}),
            serde_json::json!({"port_filter": true}),
        ] {
            let vif = bound(details);
            let Vif::OpenVSwitch(o) = &vif else {
                panic!("{vif:?}")
            };
            assert_eq!(o.bridge_name.as_deref(), Some("br-int"));
            let net = o.base.network.as_ref().unwrap();
            assert_eq!(net.bridge.as_deref(), Some("br-int"));
        }
    }
}
