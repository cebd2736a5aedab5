//! `neutron-vif` bindings: a veth pair whose host end goes on a Linux bridge
//! or an Open vSwitch bridge, pod end in the pod namespace.

use async_trait::async_trait;

use crate::netlink::{Netlink, NetlinkError};

use super::ovs::OvsProbe;
use super::{BindingDriver, BindingError, PlugKind, PlugSpec, PlugTarget, TeardownError, l3};

/// Create the veth pair (pod end created directly in the pod namespace under
/// its final name) and configure the pod end. Returns the host end's index.
async fn plug_veth(spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(Netlink, u32), BindingError> {
    let netns = target.require_netns()?;
    let host = Netlink::current()?;
    let pod = Netlink::in_netns(netns).await?;
    // Leftovers of an interrupted earlier attempt.
    if let Some(old) = host.link_by_name(&spec.host_ifname).await? {
        host.delete_link(old.index).await?;
    }
    if let Some(old) = pod.link_by_name(&spec.ifname).await? {
        pod.delete_link(old.index).await?;
    }
    host.create_veth(&spec.host_ifname, &spec.ifname, Some(netns.fd()), spec.mtu)
        .await?;
    let host_link = host.require_link(&spec.host_ifname).await?;
    if let Some(tag) = target.owner_tag {
        host.set_alias(host_link.index, tag).await?;
    }
    let pod_link = pod.require_link(&spec.ifname).await?;
    l3::configure(&pod, pod_link.index, spec, true).await?;
    host.set_up(host_link.index).await?;
    Ok((host, host_link.index))
}

/// Remove the host end (which removes the pair) and, if it is gone already,
/// the pod end by name.
async fn unplug_veth(spec: &PlugSpec, target: &PlugTarget<'_>, errors: &mut Vec<BindingError>) {
    match Netlink::current() {
        Ok(host) => match host.link_by_name(&spec.host_ifname).await {
            Ok(Some(l)) => {
                if let Err(e) = host.delete_link(l.index).await
                    && e.errno() != Some(libc::ENODEV)
                {
                    errors.push(e.into());
                }
            }
            Ok(None) => {}
            Err(e) => errors.push(e.into()),
        },
        Err(e) => errors.push(e.into()),
    }
    delete_pod_link(spec, target, "veth", errors).await;
}

/// Delete `spec.ifname` in the pod if it is still there and of `kind`; a gone
/// namespace means there is nothing left to remove.
pub(super) async fn delete_pod_link(
    spec: &PlugSpec,
    target: &PlugTarget<'_>,
    kind: &str,
    errors: &mut Vec<BindingError>,
) {
    let Some(netns) = target.netns else {
        return;
    };
    let pod = match Netlink::in_netns(netns).await {
        Ok(p) => p,
        Err(NetlinkError::Netns { .. }) => return,
        Err(e) => {
            errors.push(e.into());
            return;
        }
    };
    match pod.link_by_name(&spec.ifname).await {
        Ok(Some(l)) if l.kind.as_deref() == Some(kind) => {
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
        let (host, host_index) = plug_veth(spec, target).await?;
        // Created when missing (single-node and test setups have no agent
        // doing it); never removed, other ports share it.
        let br = match host.link_by_name(bridge).await? {
            Some(b) => b,
            None => {
                match host.create_bridge(bridge).await {
                    Err(e) if !e.is_exists() => return Err(e.into()),
                    _ => {}
                }
                host.require_link(bridge).await?
            }
        };
        if !br.up {
            host.set_up(br.index).await?;
        }
        host.set_master(host_index, br.index).await?;
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
        let host = Netlink::current()?;
        let br = host.link_by_name(bridge).await?;
        let tap = host.link_by_name(&spec.host_ifname).await?;
        match (br, tap) {
            (Some(br), Some(tap)) if tap.master == Some(br.index) => Ok(()),
            (_, None) => Err(BindingError::Check {
                ifname: spec.host_ifname.clone(),
                message: "host end of the veth is missing".into(),
            }),
            _ => Err(BindingError::Check {
                ifname: spec.host_ifname.clone(),
                message: format!("host end is not attached to bridge {bridge}"),
            }),
        }
    }
}

/// veth with the host end added to an OVS bridge with the external ids the
/// Neutron OVS agent matches on (os-vif VIFOpenVSwitch).
pub struct OvsDriver {
    timeout_secs: u32,
}

impl OvsDriver {
    pub fn new(timeout_secs: u32) -> Self {
        Self { timeout_secs }
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
        let probe = OvsProbe::detect(self.timeout_secs).await;
        if let Some(reason) = probe.unavailable_reason() {
            return Err(BindingError::Unsupported {
                driver: self.name(),
                reason,
            });
        }
        plug_veth(spec, target).await?;
        let mac = spec.mac.to_string();
        let iface = spec.host_ifname.as_str();
        let ids = [
            format!("external-ids:iface-id={}", spec.port_id),
            format!("external-ids:attached-mac={mac}"),
            "external-ids:iface-status=active".to_string(),
            format!("external-ids:vm-uuid={}", target.pod_uid),
        ];
        let mut args: Vec<String> = vec![
            "--".into(),
            "--may-exist".into(),
            "add-port".into(),
            bridge.clone(),
            iface.into(),
            "--".into(),
            "set".into(),
            "Interface".into(),
            iface.into(),
        ];
        args.extend(ids);
        if let Err(e) = probe.vsctl(&args).await {
            // Don't leave a veth nobody will ever wire.
            let mut ignored = Vec::new();
            unplug_veth(spec, target, &mut ignored).await;
            return Err(e);
        }
        Ok(())
    }

    async fn teardown(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), TeardownError> {
        let mut errors = Vec::new();
        if let PlugKind::OpenVSwitch { bridge } = &spec.kind {
            let probe = OvsProbe::detect(self.timeout_secs).await;
            if probe.unavailable_reason().is_none() {
                let args: Vec<String> = vec![
                    "--if-exists".into(),
                    "del-port".into(),
                    bridge.clone(),
                    spec.host_ifname.clone(),
                ];
                if let Err(e) = probe.vsctl(&args).await {
                    errors.push(e);
                }
            }
        }
        unplug_veth(spec, target, &mut errors).await;
        TeardownError::into_result(errors)
    }

    async fn check(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let pod = Netlink::in_netns(target.require_netns()?).await?;
        l3::check(&pod, spec).await?;
        let host = Netlink::current()?;
        if host.link_by_name(&spec.host_ifname).await?.is_none() {
            return Err(BindingError::Check {
                ifname: spec.host_ifname.clone(),
                message: "host end of the veth is missing".into(),
            });
        }
        Ok(())
    }
}

pub(super) fn wrong_kind(driver: &'static str, spec: &PlugSpec) -> BindingError {
    BindingError::InvalidVif {
        field: "versioned_object.name".into(),
        message: format!("driver {driver} cannot plug a {} VIF", spec.kind.driver_name()),
    }
}
