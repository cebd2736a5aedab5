//! The floor of a CNI ADD: the kernel work a binding asks for, sent through
//! the daemon's own netlink layer, with no plugin process, no HTTP, no
//! registry and no daemon bookkeeping (leftover lookups, owner alias, state
//! record); on Open vSwitch, plus the one ovsdb transaction that adds the
//! port and the wait for vswitchd to apply it. cni-bench divides the full ADD
//! by it.

use std::time::Duration;

use kuryr_daemon::binding::ovsdb::{self, Ovsdb};
use kuryr_daemon::binding::{BindingError, OvsProbe, PlugKind, PlugSpec, ensure_bridge, l3};
use kuryr_daemon::netlink::{LinkSettings, NetNs, Netlink};
use serde_json::json;

/// The veth pair with its pod end created in `netns` under its final name
/// and MTU, MAC / up / addresses / routes inside (the daemon's own
/// [`l3::configure`]), host end on `master` (if any) and up (one request).
async fn veth(
    host: &Netlink,
    spec: &PlugSpec,
    netns: &NetNs,
    master: Option<u32>,
) -> Result<(), BindingError> {
    let pod = Netlink::in_netns(netns).await?;
    host.create_veth(&spec.host_ifname, &spec.ifname, Some(netns.fd()), spec.mtu)
        .await?;
    let pod_link = pod.require_link(&spec.ifname).await?;
    l3::configure(&pod, &pod_link, spec).await?;
    let host_link = host.require_link(&spec.host_ifname).await?;
    let settings = LinkSettings {
        master,
        up: true,
        ..LinkSettings::default()
    };
    host.configure_link(host_link.index, &settings).await?;
    Ok(())
}

/// Remove the pair as the daemon's DEL does: delete the host end.
async fn del_veth(host: &Netlink, spec: &PlugSpec) -> Result<(), BindingError> {
    if let Some(link) = host.link_by_name(&spec.host_ifname).await? {
        host.delete_link(link.index).await?;
    }
    Ok(())
}

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
        let bridge = ensure_bridge(&host, name).await?;
        Ok(Self {
            host,
            bridge: bridge.index,
        })
    }

    /// One pod's ADD: the veth, its host end on the bridge.
    pub async fn add(&self, spec: &PlugSpec, netns: &NetNs) -> Result<(), BindingError> {
        if !matches!(spec.kind, PlugKind::Bridge { .. }) {
            return Err(BindingError::InvalidVif {
                field: "versioned_object.name".into(),
                message: format!("the floor plugs bridge VIFs, not {}", spec.kind.driver_name()),
            });
        }
        veth(&self.host, spec, netns, Some(self.bridge)).await
    }

    pub async fn del(&self, spec: &PlugSpec) -> Result<(), BindingError> {
        del_veth(&self.host, spec).await
    }
}

/// The floor on an Open vSwitch bridge: the veth, then one transaction on
/// the daemon's own ovsdb connection adding its host end with the external
/// ids the Neutron agent (or OVN) matches on, and the wait for vswitchd to
/// apply it. No lookup of a port record left by an earlier attempt, no read
/// of the interface's error.
pub struct OvsFloor {
    host: Netlink,
    ovs: OvsProbe,
    db: String,
    bridge: String,
}

impl OvsFloor {
    /// Uses the bridge `bridge` of the ovsdb at `db`, created with the
    /// userspace datapath.
    pub async fn new(db: &str, bridge: &str) -> Result<Self, BindingError> {
        let ovs = OvsProbe::locate(30, Some(db));
        ovs.create_bridge(bridge, "netdev").await?;
        Ok(Self {
            host: Netlink::current()?,
            ovs,
            db: db.to_string(),
            bridge: bridge.to_string(),
        })
    }

    pub async fn add(&self, spec: &PlugSpec, netns: &NetNs, pod_uid: &str) -> Result<(), BindingError> {
        veth(&self.host, spec, netns, None).await?;
        let iface = spec.host_ifname.as_str();
        let mac = spec.mac.to_string();
        let ids = ovsdb::string_map([
            ("iface-id", spec.port_id.as_str()),
            ("attached-mac", mac.as_str()),
            ("iface-status", "active"),
            ("vm-uuid", pod_uid),
        ]);
        let fail = |e: ovsdb::OvsdbError| BindingError::Ovs {
            args: format!("add-port {} {iface}", self.bridge),
            message: e.to_string(),
        };
        let mut c = Ovsdb::connect(&self.db, Duration::from_secs(30))
            .await
            .map_err(fail)?;
        c.transact_applied(vec![
            json!({"op": "insert", "table": "Interface", "uuid-name": "iface",
                "row": {"name": iface, "external_ids": ids}}),
            json!({"op": "insert", "table": "Port", "uuid-name": "port",
                "row": {"name": iface, "interfaces": ovsdb::named("iface")}}),
            json!({"op": "mutate", "table": "Bridge", "where": [ovsdb::eq("name", json!(self.bridge))],
                "mutations": [["ports", "insert", ovsdb::named("port")]]}),
        ])
        .await
        .map(drop)
        .map_err(fail)
    }

    pub async fn del(&self, spec: &PlugSpec) -> Result<(), BindingError> {
        self.ovs.del_port(&spec.host_ifname).await?;
        del_veth(&self.host, spec).await
    }

    /// Removes the bridge (with any port left on it).
    pub async fn remove(&self) -> Result<(), BindingError> {
        let out = tokio::process::Command::new("ovs-vsctl")
            .arg(format!("--db={}", self.db))
            .args(["--timeout=30", "--if-exists", "del-br", &self.bridge])
            .output()
            .await
            .map_err(|e| BindingError::Ovs {
                args: format!("del-br {}", self.bridge),
                message: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(BindingError::Ovs {
                args: format!("del-br {}", self.bridge),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }
}
