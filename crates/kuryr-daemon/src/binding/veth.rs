//! `neutron-vif` bindings: a veth pair whose host end goes on a Linux bridge
//! or an Open vSwitch bridge, pod end in the pod namespace.

use async_trait::async_trait;

use crate::netlink::{Link, LinkSettings, NetNs, Netlink, NetlinkError};

use super::ovs::{OvsProbe, disable_tx_checksum};
use super::{
    BindingConfig, BindingDriver, BindingError, PlugKind, PlugSpec, PlugTarget, TeardownError,
    TxChecksumMode, l3,
};

/// Create the veth pair (pod end created directly in the pod namespace under
/// its final name and MTU) and configure both ends; the host end gets the
/// owner alias, goes on `master` when given and comes up, in one request.
pub(super) async fn plug_veth(
    host: &Netlink,
    spec: &PlugSpec,
    target: &PlugTarget<'_>,
    master: Option<u32>,
) -> Result<(), BindingError> {
    let netns = target.require_netns()?;
    let pod = Netlink::in_netns(netns).await?;
    let create = || host.create_veth(&spec.host_ifname, &spec.ifname, Some(netns.fd()), spec.mtu);
    match create().await {
        // Leftovers of an interrupted earlier attempt hold a name: only then
        // are they looked for (an ADD normally finds none).
        Err(e) if e.is_exists() => {
            if let Some(old) = host.link_by_name(&spec.host_ifname).await? {
                host.delete_link(old.index).await?;
            }
            clear_pod_leftover(&pod, spec.kind.driver_name(), &spec.ifname, "veth").await?;
            create().await?;
        }
        other => other?,
    }
    let host_link = host.require_link(&spec.host_ifname).await?;
    let pod_link = pod.require_link(&spec.ifname).await?;
    l3::configure(&pod, &pod_link, spec).await?;
    host.configure_link(
        host_link.index,
        &LinkSettings {
            master,
            alias: target.alias(),
            up: true,
            ..LinkSettings::default()
        },
    )
    .await?;
    Ok(())
}

/// Clear `ifname` in the pod's namespace for an ADD: a leftover of an interrupted earlier one is a
/// link of `kind` (what the binding makes); a link of another kind is not kuryr's to delete.
pub(super) async fn clear_pod_leftover(
    pod: &Netlink,
    driver: &'static str,
    ifname: &str,
    kind: &str,
) -> Result<(), BindingError> {
    match pod.link_by_name(ifname).await? {
        Some(old) if old.kind.as_deref() == Some(kind) => Ok(pod.delete_link(old.index).await?),
        Some(old) => Err(BindingError::NoDevice {
            driver,
            reason: format!(
                "CNI_IFNAME {ifname} is taken in the pod's network namespace by a {} link, not a \
                 leftover {kind} of kuryr's",
                old.kind.as_deref().unwrap_or("untyped")
            ),
        }),
        None => Ok(()),
    }
}

/// Whether the host end of `spec` is another container's: its alias names an
/// owner other than `target`'s. The same Neutron port (so the same host
/// interface name) may be plugged for another pod since this one's ADD (a
/// pod force-deleted and its port handed on through the pool): a late DEL of
/// the first must not unplug the second. A link without a kuryr alias (one
/// too long for the kernel) or a target that names no owner is taken for
/// this one's, as before aliases were written.
pub(super) async fn host_end_of_another(spec: &PlugSpec, target: &PlugTarget<'_>) -> Option<String> {
    link_of_another(&spec.host_ifname, target).await
}

/// The owner of the host link `name` when its alias names one other than `target`'s.
pub(super) async fn link_of_another(name: &str, target: &PlugTarget<'_>) -> Option<String> {
    let mine = target.owner_tag?;
    let host = Netlink::current().ok()?;
    let link = host.link_by_name(name).await.ok()??;
    let alias = link.alias?;
    (crate::registry::PodKey::parse_owner_tag(&alias).is_some() && alias != mine).then_some(alias)
}

/// Remove the host end (which removes the pair) unless it is another
/// container's, and the pod end by name.
pub(super) async fn unplug_veth(spec: &PlugSpec, target: &PlugTarget<'_>, errors: &mut Vec<BindingError>) {
    if let Some(owner) = host_end_of_another(spec, target).await {
        tracing::info!(link = %spec.host_ifname, owner, "host end plugged for another container since: left alone");
    } else {
        match Netlink::current() {
            Ok(host) => delete_host_link(&host, &spec.host_ifname, errors).await,
            Err(e) => errors.push(e.into()),
        }
    }
    delete_pod_link(spec, target, "veth", errors).await;
}

/// Delete the host link `name` if it is there (a veth end takes its peer along).
pub(super) async fn delete_host_link(host: &Netlink, name: &str, errors: &mut Vec<BindingError>) {
    match host.link_by_name(name).await {
        Ok(Some(l)) => {
            if let Err(e) = host.delete_link(l.index).await
                && e.errno() != Some(libc::ENODEV)
            {
                errors.push(e.into());
            }
        }
        Ok(None) => {}
        Err(e) => errors.push(e.into()),
    }
}

/// Delete `spec.ifname` in the pod if it is still there and of `kind`; a gone
/// namespace means there is nothing left to remove.
pub(super) async fn delete_pod_link(
    spec: &PlugSpec,
    target: &PlugTarget<'_>,
    kind: &str,
    errors: &mut Vec<BindingError>,
) {
    if let Some(netns) = target.netns {
        delete_netns_link(netns, &spec.ifname, Some(kind), errors).await;
    }
}

/// Delete `ifname` in `netns` if it is still there (and of `kind`, when given); a gone
/// namespace or interface means there is nothing left to remove.
pub async fn delete_netns_link(
    netns: &NetNs,
    ifname: &str,
    kind: Option<&str>,
    errors: &mut Vec<BindingError>,
) {
    let pod = match Netlink::in_netns(netns).await {
        Ok(p) => p,
        Err(NetlinkError::Netns { .. }) => return,
        Err(e) => {
            errors.push(e.into());
            return;
        }
    };
    match pod.link_by_name(ifname).await {
        Ok(Some(l)) if kind.is_none_or(|k| l.kind.as_deref() == Some(k)) => {
            if let Err(e) = pod.delete_link(l.index).await
                && e.errno() != Some(libc::ENODEV)
            {
                errors.push(e.into());
            }
        }
        Ok(_) => {}
        Err(e) => errors.push(e.into()),
    }
}

/// veth with the host end on a Linux bridge (os-vif VIFBridge).
pub struct BridgeDriver;

#[async_trait]
impl BindingDriver for BridgeDriver {
    fn name(&self) -> &'static str {
        "neutron-vif/bridge"
    }

    async fn setup(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let PlugKind::Bridge { bridge } = &spec.kind else {
            return Err(wrong_kind(self.name(), spec));
        };
        let host = Netlink::current()?;
        // Created when missing (single-node and test setups have no agent
        // doing it); never removed, other ports share it.
        let br = ensure_bridge(&host, bridge).await?;
        plug_veth(&host, spec, target, Some(br.index)).await?;
        Ok(())
    }

    async fn teardown(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), TeardownError> {
        let mut errors = Vec::new();
        unplug_veth(spec, target, &mut errors).await;
        TeardownError::into_result(errors)
    }

    async fn check(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let PlugKind::Bridge { bridge } = &spec.kind else {
            return Err(wrong_kind(self.name(), spec));
        };
        let pod = Netlink::in_netns(target.require_netns()?).await?;
        l3::check(&pod, spec).await?;
        check_on_bridge(&Netlink::current()?, &spec.host_ifname, bridge).await
    }
}

/// The Linux bridge `name`, created when missing, up.
pub async fn ensure_bridge(host: &Netlink, name: &str) -> Result<Link, BindingError> {
    let br = match host.link_by_name(name).await? {
        Some(b) => b,
        None => {
            match host.create_bridge(name).await {
                Err(e) if !e.is_exists() => return Err(e.into()),
                _ => {}
            }
            host.require_link(name).await?
        }
    };
    if !br.up {
        host.set_up(br.index).await?;
    }
    Ok(br)
}

/// CHECK of a host link: `ifname` exists and is a port of the Linux bridge `bridge`.
pub(super) async fn check_on_bridge(host: &Netlink, ifname: &str, bridge: &str) -> Result<(), BindingError> {
    let br = host.link_by_name(bridge).await?;
    let link = host.link_by_name(ifname).await?;
    match (br, link) {
        (Some(br), Some(link)) if link.master == Some(br.index) => Ok(()),
        (_, None) => Err(BindingError::Check {
            ifname: ifname.to_string(),
            message: "host end of the veth is missing".into(),
        }),
        _ => Err(BindingError::Check {
            ifname: ifname.to_string(),
            message: format!("host end is not attached to bridge {bridge}"),
        }),
    }
}

/// veth with the host end added to an OVS bridge with the external ids the
/// Neutron OVS agent matches on (os-vif VIFOpenVSwitch): `iface-id` (the
/// Neutron port), `attached-mac`, `iface-status=active` and `vm-uuid` (the pod
/// UID where upstream writes a constant).
pub struct OvsDriver {
    timeout_secs: u32,
    db: Option<String>,
    datapath_type: String,
    tx_checksum: TxChecksumMode,
}

impl OvsDriver {
    pub fn new(config: &BindingConfig) -> Self {
        Self {
            timeout_secs: config.ovs_timeout_secs,
            db: config.ovs_db.clone(),
            datapath_type: config.ovs_datapath_type.clone(),
            tx_checksum: config.pod_tx_checksum,
        }
    }

    /// The database named, not asked: the operations talk to it directly,
    /// and it is asked whether it answers only when one failed
    /// ([`OvsDriver::unsupported`]).
    pub(super) fn locate(&self) -> OvsProbe {
        OvsProbe::locate(self.timeout_secs, self.db.as_deref())
    }

    /// `Unsupported` with the reason when the database does not answer (a
    /// node that cannot do OVS), else `e` as it is.
    pub(super) async fn unsupported(&self, probe: &mut OvsProbe, e: BindingError) -> BindingError {
        if !matches!(e, BindingError::OvsUnreachable { .. }) {
            return e;
        }
        probe.ask_db().await;
        match probe.unavailable_reason() {
            Some(reason) => BindingError::Unsupported {
                driver: self.name(),
                reason,
            },
            None => e,
        }
    }

    /// CHECK of an OVS port: `iface` is a port of `bridge` for the Neutron port `port_id`.
    pub(super) async fn check_port(
        &self,
        bridge: &str,
        iface: &str,
        port_id: &str,
    ) -> Result<(), BindingError> {
        let fail = |message: String| BindingError::Check {
            ifname: iface.to_string(),
            message,
        };
        let mut probe = self.locate();
        if let Some(reason) = probe.unavailable_reason() {
            return Err(fail(reason));
        }
        let (on, iface_id) = match probe.port_of(iface).await {
            Ok(Some(found)) => found,
            Ok(None) => return Err(fail("not an OVS port".into())),
            Err(e) => {
                return Err(match self.unsupported(&mut probe, e).await {
                    BindingError::Unsupported { reason, .. } => fail(reason),
                    e => fail(e.to_string()),
                });
            }
        };
        if on != bridge {
            return Err(fail(format!("OVS port is on bridge {on}, expected {bridge}")));
        }
        if iface_id != port_id {
            return Err(fail(format!(
                "external-ids:iface-id is {iface_id:?}, expected {port_id}"
            )));
        }
        Ok(())
    }

    /// Everything after the veth exists: `iface` (the pod veth's host end, or the
    /// hybrid plug's `qvo` end) made a port of `bridge` with the external ids of
    /// `spec`'s Neutron port, and the datapath specific pod-side setting. One
    /// connection to ovsdb-server: the port in one transaction, then its error
    /// column once vswitchd applied it.
    pub(super) async fn attach(
        &self,
        probe: &OvsProbe,
        bridge: &str,
        iface: &str,
        spec: &PlugSpec,
        target: &PlugTarget<'_>,
    ) -> Result<(), BindingError> {
        let mac = spec.mac.to_string();
        let ids = [
            ("iface-id", spec.port_id.as_str()),
            ("attached-mac", mac.as_str()),
            ("iface-status", "active"),
            ("vm-uuid", target.pod_uid),
        ];
        let added = match probe.replace_port(bridge, iface, &ids).await? {
            Some(added) => added,
            None => {
                // Normally the Neutron agent creates it; a node without one
                // (sandbox, tests) gets it with the configured datapath.
                probe.create_bridge(bridge, &self.datapath_type).await?;
                probe
                    .replace_port(bridge, iface, &ids)
                    .await?
                    .ok_or_else(|| BindingError::Ovs {
                        args: format!("add-port {bridge} {iface}"),
                        message: format!("bridge {bridge} was deleted right after it was created"),
                    })?
            }
        };
        if self.tx_checksum.disables_on(&added.datapath) {
            disable_tx_checksum(target.require_netns()?, &spec.ifname).await?;
        }
        // A port vswitchd could not open (wrong datapath, device gone).
        if !added.error.is_empty() {
            return Err(BindingError::Ovs {
                args: format!("add-port {bridge} {iface}"),
                message: format!("ovs-vswitchd could not attach the interface: {}", added.error),
            });
        }
        Ok(())
    }

    /// Remove OVS ports named after host links whose binding is unknown (an
    /// attachment restored from link aliases only). `linux_bridged` names
    /// the links found enslaved to a Linux bridge: those were never OVS
    /// ports, so an unreachable ovsdb is no error for them. Without Open
    /// vSwitch on the node no OVS port can exist.
    pub async fn remove_ports_of_unknown_links(
        &self,
        names: &[String],
        linux_bridged: &[String],
        errors: &mut Vec<BindingError>,
    ) {
        let probe = OvsProbe::detect(self.timeout_secs, self.db.as_deref()).await;
        if !probe.installed() {
            return;
        }
        let reason = probe.unavailable_reason();
        for name in names {
            match &reason {
                None => {
                    if let Err(e) = probe.del_port(name).await {
                        errors.push(e);
                    }
                }
                Some(_) if linux_bridged.contains(name) => {}
                Some(r) => errors.push(BindingError::Ovs {
                    args: format!("--if-exists del-port {name}"),
                    message: format!("cannot remove a possible OVS port: {r}"),
                }),
            }
        }
    }
}

#[async_trait]
impl BindingDriver for OvsDriver {
    fn name(&self) -> &'static str {
        "neutron-vif/ovs"
    }

    async fn setup(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let PlugKind::OpenVSwitch { bridge } = &spec.kind else {
            return Err(wrong_kind(self.name(), spec));
        };
        let mut probe = self.locate();
        if let Some(reason) = probe.unavailable_reason() {
            return Err(BindingError::Unsupported {
                driver: self.name(),
                reason,
            });
        }
        // A port record an interrupted setup left is replaced in attach's
        // transaction; its veth, here.
        plug_veth(&Netlink::current()?, spec, target, None).await?;
        if let Err(e) = self.attach(&probe, bridge, &spec.host_ifname, spec, target).await {
            let e = self.unsupported(&mut probe, e).await;
            // Don't leave a port or a veth nobody will ever wire; the setup
            // error is the one worth reporting.
            if probe.unavailable_reason().is_none() {
                let _ = probe.del_port(&spec.host_ifname).await;
            }
            let mut ignored = Vec::new();
            unplug_veth(spec, target, &mut ignored).await;
            return Err(e);
        }
        Ok(())
    }

    async fn teardown(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), TeardownError> {
        let mut errors = Vec::new();
        let probe = self.locate();
        // Without Open vSwitch no OVS port can exist; with an unreachable
        // database one may, and leaking it silently would hide it. The port
        // of a veth plugged for another container since is that one's.
        if probe.installed()
            && host_end_of_another(spec, target).await.is_none()
            && let Err(e) = probe.del_port(&spec.host_ifname).await
        {
            errors.push(e);
        }
        unplug_veth(spec, target, &mut errors).await;
        TeardownError::into_result(errors)
    }

    async fn check(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let PlugKind::OpenVSwitch { bridge } = &spec.kind else {
            return Err(wrong_kind(self.name(), spec));
        };
        let pod = Netlink::in_netns(target.require_netns()?).await?;
        l3::check(&pod, spec).await?;
        let host = Netlink::current()?;
        if host.link_by_name(&spec.host_ifname).await?.is_none() {
            return Err(BindingError::Check {
                ifname: spec.host_ifname.clone(),
                message: "host end of the veth is missing".into(),
            });
        }
        self.check_port(bridge, &spec.host_ifname, &spec.port_id).await
    }
}

pub(super) fn wrong_kind(driver: &'static str, spec: &PlugSpec) -> BindingError {
    BindingError::InvalidVif {
        field: "versioned_object.name".into(),
        message: format!("driver {driver} cannot plug a {} VIF", spec.kind.driver_name()),
    }
}
