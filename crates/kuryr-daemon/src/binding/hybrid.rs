//! os-vif's OVS "hybrid plug" (a `VIFBridge` of plugin `ovs`: Neutron's `ovs_hybrid_plug`, which the
//! OVS agent asks for when its firewall is `iptables_hybrid`). The agent's iptables rules filter the
//! pod's traffic on a Linux bridge of its own, so the pod's veth cannot go on the OVS bridge directly
//! (its security groups would not apply):
//!
//! ```text
//! pod eth0 ==veth== tapXXX -- qbrXXX (Linux bridge) -- qvbXXX ==veth== qvoXXX -- br-int (OVS)
//! ```
//!
//! `XXX` is the start of the Neutron port id (os-vif's names, 14 characters); `qvo` is the OVS port
//! with the external ids the agent matches on.

use async_trait::async_trait;

use crate::netlink::{LinkSettings, Netlink};

use super::veth::{
    OvsDriver, check_on_bridge, delete_host_link, ensure_bridge, link_of_another, plug_veth, unplug_veth,
    wrong_kind,
};
use super::{BindingConfig, BindingDriver, BindingError, PlugKind, PlugSpec, PlugTarget, TeardownError, l3};

/// os-vif's device name length (`NIC_NAME_LEN`).
const NAME_LEN: usize = 14;

/// The host devices of one port's hybrid plug besides the pod veth's host end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HybridDevices {
    /// The per-port Linux bridge (`qbr...`, the VIF's `bridge_name`).
    pub bridge: String,
    /// The veth end on that bridge.
    pub qvb: String,
    /// The veth end on the OVS bridge.
    pub qvo: String,
}

impl HybridDevices {
    pub fn of_port(port_id: &str, bridge: &str) -> Self {
        let name = |prefix: &str| format!("{prefix}{port_id}").chars().take(NAME_LEN).collect();
        Self {
            bridge: bridge.to_string(),
            qvb: name("qvb"),
            qvo: name("qvo"),
        }
    }

    /// The devices a hybrid plug of the pod veth whose host end is `tap` (`tap` + the start of
    /// the port id, os-vif's naming) has, when that is its name.
    pub fn of_tap(tap: &str) -> Option<Self> {
        let id = tap.strip_prefix("tap").filter(|id| !id.is_empty())?;
        Some(Self {
            bridge: format!("qbr{id}"),
            qvb: format!("qvb{id}"),
            qvo: format!("qvo{id}"),
        })
    }
}

/// The per-port bridge as os-vif sets it up: forwarding at once (no forward delay), multicast
/// passed to the pod (no snooping on a bridge of one port), and IPv6 off on it, so that nothing of
/// the host takes part in the tenant's network through it (no link-local address, no DAD or MLD).
/// A setting the kernel does not have (no IPv6) is skipped; one it refuses (a read-only /proc or
/// /sys) leaves the pod working, so that is a warning.
fn tune_port_bridge(bridge: &str) {
    for (path, value) in [
        (format!("/sys/class/net/{bridge}/bridge/forward_delay"), "0"),
        (format!("/sys/class/net/{bridge}/bridge/multicast_snooping"), "0"),
        (format!("/proc/sys/net/ipv6/conf/{bridge}/disable_ipv6"), "1"),
    ] {
        match std::fs::write(&path, value) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(bridge, path, error = %e, "could not set up a hybrid plug's bridge"),
        }
    }
}

/// The hybrid plug: see the module documentation.
pub struct HybridOvsDriver {
    ovs: OvsDriver,
}

impl HybridOvsDriver {
    pub fn new(config: &BindingConfig) -> Self {
        Self {
            ovs: OvsDriver::new(config),
        }
    }

    async fn plug(
        &self,
        host: &Netlink,
        probe: &super::OvsProbe,
        ovs_bridge: &str,
        dev: &HybridDevices,
        spec: &PlugSpec,
        target: &PlugTarget<'_>,
    ) -> Result<(), BindingError> {
        let br = ensure_bridge(host, &dev.bridge).await?;
        tune_port_bridge(&dev.bridge);
        // An interrupted setup's pair is made anew (os-vif keeps one it finds; it may be half
        // configured, and the OVS port below is replaced anyway).
        let mut stale = Vec::new();
        delete_host_link(host, &dev.qvo, &mut stale).await;
        delete_host_link(host, &dev.qvb, &mut stale).await;
        if let Some(e) = stale.into_iter().next() {
            return Err(e);
        }
        host.create_veth(&dev.qvb, &dev.qvo, None, spec.mtu).await?;
        // The bridge and both ends carry the owner, as the pod veth's host end does: a daemon
        // restarted without its state directory finds them by it and removes them with the pod
        // (also when the pod's veth never came or went with its namespace), and a late DEL of
        // another pod that had the port before leaves them alone.
        host.configure_link(
            br.index,
            &LinkSettings {
                alias: target.alias(),
                up: true,
                ..LinkSettings::default()
            },
        )
        .await?;
        for (name, master) in [(&dev.qvb, Some(br.index)), (&dev.qvo, None)] {
            let link = host.require_link(name).await?;
            let settings = LinkSettings {
                master,
                alias: target.alias(),
                up: true,
                ..LinkSettings::default()
            };
            host.configure_link(link.index, &settings).await?;
        }
        plug_veth(host, spec, target, Some(br.index)).await?;
        self.ovs.attach(probe, ovs_bridge, &dev.qvo, spec, target).await
    }

    /// The host side but the pod veth: the OVS port (unless `probe` knows the database does not
    /// answer), the `qvb`/`qvo` pair and the bridge.
    async fn unplug_host_side(
        &self,
        probe: &super::OvsProbe,
        dev: &HybridDevices,
        errors: &mut Vec<BindingError>,
    ) {
        // Without Open vSwitch no OVS port can exist; with an unreachable database one may.
        if probe.installed()
            && probe.unavailable_reason().is_none()
            && let Err(e) = probe.del_port(&dev.qvo).await
        {
            errors.push(e);
        }
        match Netlink::current() {
            Ok(host) => {
                delete_host_link(&host, &dev.qvo, errors).await;
                delete_host_link(&host, &dev.bridge, errors).await;
            }
            Err(e) => errors.push(e.into()),
        }
    }
}

#[async_trait]
impl BindingDriver for HybridOvsDriver {
    fn name(&self) -> &'static str {
        "neutron-vif/ovs-hybrid"
    }

    async fn setup(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let PlugKind::HybridOvs { bridge, ovs_bridge } = &spec.kind else {
            return Err(wrong_kind(self.name(), spec));
        };
        let mut probe = self.ovs.locate();
        if let Some(reason) = probe.unavailable_reason() {
            return Err(BindingError::Unsupported {
                driver: self.name(),
                reason,
            });
        }
        let dev = HybridDevices::of_port(&spec.port_id, bridge);
        let host = Netlink::current()?;
        if let Err(e) = self.plug(&host, &probe, ovs_bridge, &dev, spec, target).await {
            let e = match self.ovs.unsupported(&mut probe, e).await {
                BindingError::Unsupported { reason, .. } => BindingError::Unsupported {
                    driver: self.name(),
                    reason,
                },
                e => e,
            };
            // Nothing is left that nobody would ever wire; the setup error is the one reported.
            let mut ignored = Vec::new();
            self.unplug_host_side(&probe, &dev, &mut ignored).await;
            unplug_veth(spec, target, &mut ignored).await;
            return Err(e);
        }
        Ok(())
    }

    async fn teardown(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), TeardownError> {
        let PlugKind::HybridOvs { bridge, .. } = &spec.kind else {
            return Err(TeardownError(vec![wrong_kind(self.name(), spec)]));
        };
        let mut errors = Vec::new();
        // The devices of a port plugged for another container since (handed on through the
        // pool) are that one's: each carries its owner, and one of them naming another is enough
        // (that container's ADD may be half way, its pod veth not made yet).
        let dev = HybridDevices::of_port(&spec.port_id, bridge);
        let mut another = None;
        for name in [&spec.host_ifname, &dev.qvo, &dev.qvb, &dev.bridge] {
            another = link_of_another(name, target).await;
            if another.is_some() {
                break;
            }
        }
        if let Some(owner) = another {
            tracing::info!(port = %spec.port_id, owner, "hybrid plug devices plugged for another container since: left alone");
        } else {
            self.unplug_host_side(&self.ovs.locate(), &dev, &mut errors).await;
        }
        unplug_veth(spec, target, &mut errors).await;
        TeardownError::into_result(errors)
    }

    async fn check(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let PlugKind::HybridOvs { bridge, ovs_bridge } = &spec.kind else {
            return Err(wrong_kind(self.name(), spec));
        };
        let pod = Netlink::in_netns(target.require_netns()?).await?;
        l3::check(&pod, spec).await?;
        let dev = HybridDevices::of_port(&spec.port_id, bridge);
        let host = Netlink::current()?;
        check_on_bridge(&host, &spec.host_ifname, bridge).await?;
        check_on_bridge(&host, &dev.qvb, bridge).await?;
        self.ovs.check_port(ovs_bridge, &dev.qvo, &spec.port_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_named_as_os_vif_names_them() {
        let port = "2a1b2c3d-1111-4222-8333-944455556666";
        let dev = HybridDevices::of_port(port, "qbr2a1b2c3d-11");
        assert_eq!(dev.qvb, "qvb2a1b2c3d-11");
        assert_eq!(dev.qvo, "qvo2a1b2c3d-11");
        assert_eq!(HybridDevices::of_tap("tap2a1b2c3d-11"), Some(dev));
        assert_eq!(HybridDevices::of_tap("eth0"), None);
        assert_eq!(HybridDevices::of_tap("tap"), None);
    }
}
