//! From os-vif VIFs (KuryrPort `status.vifs`) to binding specs and CNI results.

use std::net::IpAddr;

use kuryr_crds::Vif;
use kuryr_crds::vif::parse_cidr;
use serde_json::{Value, json};

use kuryr_config::OvsPlugMode;

use crate::binding::{BindingConfig, BindingError, PlugKind, PlugSpec, SubnetRoute};
use crate::netlink::{IpPrefix, MacAddr};

fn invalid(field: impl Into<String>, message: impl Into<String>) -> BindingError {
    BindingError::InvalidVif {
        field: field.into(),
        message: message.into(),
    }
}

/// Build the binding spec of one VIF.
///
/// `ifname` is the name inside the pod (for the default VIF: `CNI_IFNAME`).
pub fn plug_spec(
    vif: &Vif,
    ifname: &str,
    is_default: bool,
    config: &BindingConfig,
) -> Result<PlugSpec, BindingError> {
    let port = vif.id();
    let field = |f: &str| format!("VIF {port}: {f}");
    let mac: MacAddr = vif
        .address()
        .ok_or_else(|| invalid(field("address"), "the VIF has no MAC address"))?
        .parse()
        .map_err(|e: String| invalid(field("address"), e))?;
    let network = vif.network();
    let mut addresses = Vec::new();
    let mut gateways = Vec::new();
    let mut routes = Vec::new();
    for subnet in network.map(|n| n.subnets.objects.as_slice()).unwrap_or_default() {
        let (_, prefix_len) = parse_cidr("Subnet.cidr", &subnet.cidr)
            .map_err(|e| invalid(field("network.subnets.cidr"), e.to_string()))?;
        for ip in &subnet.ips.objects {
            addresses.push(
                IpPrefix::new(ip.address, prefix_len)
                    .map_err(|e| invalid(field("network.subnets.ips"), e))?,
            );
        }
        if let Some(gw) = subnet.gateway {
            gateways.push(gw);
        }
        for route in &subnet.routes.objects {
            let destination: IpPrefix = route
                .cidr
                .parse()
                .map_err(|e: String| invalid(field("network.subnets.routes.cidr"), e))?;
            routes.push(SubnetRoute {
                destination,
                gateway: route.gateway,
            });
        }
    }
    let mtu = network.and_then(|n| n.mtu).filter(|m| *m > 0);
    let kind = match vif {
        // OVS hybrid plug: the VIF's bridge is the per-port Linux bridge, the network's the OVS one.
        Vif::Bridge(b) if b.base.plugin == "ovs" => {
            let ovs_bridge = network
                .and_then(|n| n.bridge.clone())
                .unwrap_or_else(|| config.ovs_bridge.clone());
            let port_bridge = b
                .bridge_name
                .clone()
                .unwrap_or_else(|| format!("qbr{port}").chars().take(14).collect());
            match config.ovs_plug {
                OvsPlugMode::Ovs => PlugKind::HybridOvs {
                    bridge: port_bridge,
                    ovs_bridge,
                },
                OvsPlugMode::LinuxBridge => PlugKind::Bridge { bridge: ovs_bridge },
            }
        }
        Vif::Bridge(b) => PlugKind::Bridge {
            bridge: b
                .bridge_name
                .clone()
                .or_else(|| network.and_then(|n| n.bridge.clone()))
                .unwrap_or_else(|| config.default_bridge.clone()),
        },
        Vif::OpenVSwitch(o) => {
            let bridge = o
                .bridge_name
                .clone()
                .or_else(|| network.and_then(|n| n.bridge.clone()))
                .unwrap_or_else(|| config.ovs_bridge.clone());
            match config.ovs_plug {
                OvsPlugMode::Ovs => PlugKind::OpenVSwitch { bridge },
                OvsPlugMode::LinuxBridge => PlugKind::Bridge { bridge },
            }
        }
        Vif::VlanNested(v) => PlugKind::VlanNested { vlan_id: v.vlan_id },
        Vif::MacvlanNested(_) => PlugKind::MacvlanNested,
        Vif::Sriov(s) => PlugKind::Sriov {
            pci_address: s.dev_address.clone(),
            physnet: s.physnet.clone(),
            vlan: network.and_then(|n| n.vlan).filter(|v| *v > 0),
        },
        other => {
            return Err(invalid(
                field("versioned_object.name"),
                format!(
                    "{} VIFs are not supported by kuryr-rs' CNI daemon",
                    other.object_name()
                ),
            ));
        }
    };
    let host_ifname = if vif.vif_name().is_empty() {
        kuryr_crds::vif_name_for_port(port)
    } else {
        vif.vif_name().to_string()
    };
    Ok(PlugSpec {
        port_id: port.to_string(),
        ifname: ifname.to_string(),
        host_ifname,
        mac,
        mtu,
        addresses,
        gateways,
        routes,
        is_default,
        kind,
    })
}

/// The CNI 1.0 result body (without `cniVersion`) listing every interface.
/// The plugin adds `cniVersion` and the per-version details.
pub fn cni_result(specs: &[PlugSpec], netns: &str, dns: &[IpAddr]) -> Value {
    let mut interfaces = Vec::new();
    let mut ips = Vec::new();
    let mut routes = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let mut iface = json!({"name": spec.ifname, "mac": spec.mac.to_string(), "sandbox": netns});
        if let Some(mtu) = spec.mtu {
            iface["mtu"] = json!(mtu);
        }
        interfaces.push(iface);
        for addr in &spec.addresses {
            let mut ip = json!({"address": addr.to_string(), "interface": i});
            if let Some(gw) = spec.gateway_of(addr) {
                ip["gateway"] = json!(gw.to_string());
            }
            ips.push(ip);
        }
        if spec.is_default {
            for gw in spec.default_gateways() {
                let dst = if gw.is_ipv4() { "0.0.0.0/0" } else { "::/0" };
                routes.push(json!({"dst": dst, "gw": gw.to_string()}));
            }
        }
        for r in &spec.routes {
            let mut route = json!({"dst": r.destination.to_string()});
            if let Some(gw) = r.gateway {
                route["gw"] = json!(gw.to_string());
            }
            routes.push(route);
        }
    }
    let nameservers: Vec<String> = dns.iter().map(ToString::to_string).collect();
    json!({"interfaces": interfaces, "ips": ips, "routes": routes, "dns": {"nameservers": nameservers}})
}

/// DNS servers of all subnets of a VIF, in order, without duplicates.
pub fn dns_servers(vifs: &[&Vif]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    for vif in vifs {
        for subnet in vif
            .network()
            .map(|n| n.subnets.objects.as_slice())
            .unwrap_or_default()
        {
            for d in &subnet.dns {
                if !out.contains(d) {
                    out.push(*d);
                }
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kuryr_crds::vif::{Network, VifBase, VifBridge, VifOpenVSwitch};

    use super::*;

    fn ovs_vif() -> Vif {
        let mut base = VifBase::new("port-1", "ovs");
        base.address = Some("fa:16:3e:00:00:01".into());
        base.network = Some(Network::new("net-1"));
        Vif::OpenVSwitch(VifOpenVSwitch {
            base,
            bridge_name: Some("br-int".into()),
            obj: Default::default(),
        })
    }

    #[test]
    fn ovs_vifs_follow_the_node_ovs_plug_mode() {
        let mut config = BindingConfig::default();
        let spec = plug_spec(&ovs_vif(), "eth0", true, &config).unwrap();
        assert_eq!(
            spec.kind,
            PlugKind::OpenVSwitch {
                bridge: "br-int".into()
            }
        );
        config.ovs_plug = OvsPlugMode::LinuxBridge;
        let spec = plug_spec(&ovs_vif(), "eth0", true, &config).unwrap();
        assert_eq!(
            spec.kind,
            PlugKind::Bridge {
                bridge: "br-int".into()
            }
        );
    }

    /// Upstream's VIF of a port Neutron binds with `ovs_hybrid_plug` (the OVS agent's
    /// iptables_hybrid firewall): the pod goes on its per-port bridge, joined to the network's OVS
    /// bridge; a Linux bridge VIF (plugin `linux_bridge`) stays a plain bridge plug.
    #[test]
    fn hybrid_ovs_vifs_go_on_their_port_bridge_joined_to_the_ovs_bridge() {
        let vif = Vif::from_primitive(
            serde_json::from_str(include_str!(
                "../../kuryr-crds/tests/fixtures/upstream/vif-ovs-hybrid.json"
            ))
            .unwrap(),
        )
        .unwrap();
        let mut config = BindingConfig::default();
        let spec = plug_spec(&vif, "eth0", true, &config).unwrap();
        assert_eq!(
            spec.kind,
            PlugKind::HybridOvs {
                bridge: "qbr2a1b2c3d-11".into(),
                ovs_bridge: "br-int".into()
            }
        );
        assert_eq!(spec.host_ifname, "tap2a1b2c3d-11");
        config.ovs_plug = OvsPlugMode::LinuxBridge;
        let spec = plug_spec(&vif, "eth0", true, &config).unwrap();
        assert_eq!(
            spec.kind,
            PlugKind::Bridge {
                bridge: "br-int".into()
            }
        );

        let mut base = VifBase::new("port-2", "linux_bridge");
        base.address = Some("fa:16:3e:00:00:02".into());
        base.network = Some(Network::new("net-1"));
        let plain = Vif::Bridge(VifBridge {
            base,
            bridge_name: Some("brqnet-1".into()),
            obj: Default::default(),
        });
        let spec = plug_spec(&plain, "eth0", true, &BindingConfig::default()).unwrap();
        assert_eq!(
            spec.kind,
            PlugKind::Bridge {
                bridge: "brqnet-1".into()
            }
        );
    }
}
