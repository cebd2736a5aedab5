//! The floor of a CNI ADD: the kernel work the veth + Linux bridge binding
//! asks for, sent through the daemon's own netlink layer, with no plugin
//! process, no HTTP, no registry and no daemon bookkeeping (leftover lookups,
//! owner alias, state record). cni-bench divides the full ADD by it.

use kuryr_daemon::binding::{BindingError, PlugKind, PlugSpec, l3};
use kuryr_daemon::netlink::{LinkSettings, NetNs, Netlink};

/// A host-side netlink handle and the bridge every floor pod goes on, both
/// opened once: a node's daemon pays for neither per pod either.
pub struct BridgeFloor {
    host: Netlink,
    bridge: u32,
}

impl BridgeFloor {
    /// Uses the Linux bridge `name`, created and set up when missing.
    pub async fn new(name: &str) -> Result<Self, BindingError> {
        let host = Netlink::current()?;
        let bridge = match host.link_by_name(name).await? {
            Some(b) => b,
            None => {
                match host.create_bridge(name).await {
                    Err(e) if !e.is_exists() => return Err(e.into()),
                    _ => {}
                }
                host.require_link(name).await?
            }
        };
        if !bridge.up {
            host.set_up(bridge.index).await?;
        }
        Ok(Self {
            host,
            bridge: bridge.index,
        })
    }

    /// One pod's ADD: the veth pair with its pod end created in `netns`
    /// under its final name and MTU, MAC / up / addresses / routes inside
    /// (the daemon's own [`l3::configure`]), host end on the bridge and up
    /// (one request).
    pub async fn add(&self, spec: &PlugSpec, netns: &NetNs) -> Result<(), BindingError> {
        if !matches!(spec.kind, PlugKind::Bridge { .. }) {
            return Err(BindingError::InvalidVif {
                field: "versioned_object.name".into(),
                message: format!("the floor plugs bridge VIFs, not {}", spec.kind.driver_name()),
            });
        }
        let pod = Netlink::in_netns(netns).await?;
        self.host
            .create_veth(&spec.host_ifname, &spec.ifname, Some(netns.fd()), spec.mtu)
            .await?;
        let pod_link = pod.require_link(&spec.ifname).await?;
        l3::configure(&pod, &pod_link, spec).await?;
        let host_link = self.host.require_link(&spec.host_ifname).await?;
        let on_bridge = LinkSettings {
            master: Some(self.bridge),
            up: true,
            ..LinkSettings::default()
        };
        self.host.configure_link(host_link.index, &on_bridge).await?;
        Ok(())
    }

    /// Remove the pair as the daemon's DEL does: delete the host end.
    pub async fn del(&self, spec: &PlugSpec) -> Result<(), BindingError> {
        if let Some(link) = self.host.link_by_name(&spec.host_ifname).await? {
            self.host.delete_link(link.index).await?;
        }
        Ok(())
    }
}
