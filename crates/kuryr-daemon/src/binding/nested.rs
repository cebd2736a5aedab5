//! Nested (pod-in-VM) bindings: a VLAN or macvlan device on the VM's
//! interface (`[binding] link_iface`, else the one of its default route), created straight in
//! the pod namespace.

use async_trait::async_trait;

use crate::netlink::{Link, NetNs, Netlink, NetlinkError};

use super::veth::{clear_pod_leftover, delete_pod_link, wrong_kind};
use super::{BindingDriver, BindingError, PlugKind, PlugSpec, PlugTarget, TeardownError, l3};

async fn parent_link(
    driver: &'static str,
    link_iface: &Option<String>,
    host: &Netlink,
) -> Result<Link, BindingError> {
    let Some(name) = link_iface.as_deref() else {
        return detect_parent(host)
            .await?
            .ok_or_else(|| BindingError::Unsupported {
                driver,
                reason: "[binding] link_iface is not set, and the node has no interface to take instead \
                         (no IPv4 default route, no interface up but the loopback)"
                    .into(),
            });
    };
    host.link_by_name(name)
        .await?
        .ok_or_else(|| BindingError::Unsupported {
            driver,
            reason: format!("[binding] link_iface {name} does not exist"),
        })
}

/// The VM's own interface when `[binding] link_iface` is not set (upstream's default, which
/// detects it too): the one of the IPv4 default route, else the first interface up that is not
/// the loopback.
async fn detect_parent(host: &Netlink) -> Result<Option<Link>, BindingError> {
    if let Some(index) = host.default_route_link().await?
        && let Some(link) = host.link_by_index(index).await?
    {
        return Ok(Some(link));
    }
    Ok(host
        .list_links()
        .await?
        .into_iter()
        .filter(|l| l.up && !l.loopback)
        .min_by_key(|l| l.index))
}

/// A nested device cannot carry more than its parent.
fn check_mtu(driver: &'static str, spec: &PlugSpec, parent: &Link) -> Result<(), BindingError> {
    if let (Some(requested), Some(parent_mtu)) = (spec.mtu, parent.mtu)
        && requested > parent_mtu
    {
        return Err(BindingError::MtuTooLarge {
            driver,
            requested,
            parent: parent.name.clone(),
            parent_mtu,
        });
    }
    Ok(())
}

/// What a nested setup starts from: the parent link (its MTU checked) and
/// the pod's namespace, cleared of a leftover of an interrupted setup.
struct Prepared<'a> {
    host: Netlink,
    parent: Link,
    netns: &'a NetNs,
    pod: Netlink,
}

async fn prepare<'a>(
    driver: &'static str,
    kind: &str,
    link_iface: &Option<String>,
    spec: &PlugSpec,
    target: &PlugTarget<'a>,
) -> Result<Prepared<'a>, BindingError> {
    let host = Netlink::current()?;
    let parent = parent_link(driver, link_iface, &host).await?;
    check_mtu(driver, spec, &parent)?;
    let netns = target.require_netns()?;
    let pod = Netlink::in_netns(netns).await?;
    clear_pod_leftover(&pod, driver, &spec.ifname, kind).await?;
    Ok(Prepared {
        host,
        parent,
        netns,
        pod,
    })
}

/// The device lives in the pod only: deleting it there is all of teardown.
async fn teardown_pod_link(
    spec: &PlugSpec,
    target: &PlugTarget<'_>,
    kind: &str,
) -> Result<(), TeardownError> {
    let mut errors = Vec::new();
    delete_pod_link(spec, target, kind, &mut errors).await;
    TeardownError::into_result(errors)
}

/// L3 as configured, on a link of `kind`.
async fn check_pod_link(spec: &PlugSpec, target: &PlugTarget<'_>, kind: &str) -> Result<(), BindingError> {
    let pod = Netlink::in_netns(target.require_netns()?).await?;
    let link = l3::check(&pod, spec).await?;
    if link.kind.as_deref() != Some(kind) {
        return Err(BindingError::Check {
            ifname: spec.ifname.clone(),
            message: format!("is a {:?} link, expected {kind}", link.kind),
        });
    }
    Ok(())
}

pub struct VlanDriver {
    link_iface: Option<String>,
}

impl VlanDriver {
    pub fn new(link_iface: Option<String>) -> Self {
        Self { link_iface }
    }
}

#[async_trait]
impl BindingDriver for VlanDriver {
    fn name(&self) -> &'static str {
        "nested-vlan"
    }

    async fn setup(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let PlugKind::VlanNested { vlan_id } = spec.kind else {
            return Err(wrong_kind(self.name(), spec));
        };
        let Prepared {
            host,
            parent,
            netns,
            pod,
        } = prepare(self.name(), "vlan", &self.link_iface, spec, target).await?;
        host.create_vlan(&spec.ifname, parent.index, vlan_id, Some(netns.fd()))
            .await
            .map_err(|e| match e {
                NetlinkError::KernelUnsupported { .. } => BindingError::Unsupported {
                    driver: "nested-vlan",
                    reason: e.to_string(),
                },
                // The pod's own stale link went in `prepare`: the ID is taken on the parent by
                // another pod's, in a namespace the runtime has not cleaned up yet.
                other if other.is_exists() => BindingError::Busy {
                    driver: "nested-vlan",
                    reason: format!(
                        "VLAN ID {vlan_id} on {} is still in use (probably the network namespace of a \
                         deleted pod the runtime has not cleaned up yet): {other}",
                        parent.name
                    ),
                },
                other => other.into(),
            })?;
        let link = pod.require_link(&spec.ifname).await?;
        l3::configure(&pod, &link, spec).await
    }

    async fn teardown(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), TeardownError> {
        teardown_pod_link(spec, target, "vlan").await
    }

    async fn check(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        check_pod_link(spec, target, "vlan").await
    }
}

pub struct MacvlanDriver {
    link_iface: Option<String>,
}

impl MacvlanDriver {
    pub fn new(link_iface: Option<String>) -> Self {
        Self { link_iface }
    }
}

#[async_trait]
impl BindingDriver for MacvlanDriver {
    fn name(&self) -> &'static str {
        "nested-macvlan"
    }

    async fn setup(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        if spec.kind != PlugKind::MacvlanNested {
            return Err(wrong_kind(self.name(), spec));
        }
        let Prepared {
            host,
            parent,
            netns,
            pod,
        } = prepare(self.name(), "macvlan", &self.link_iface, spec, target).await?;
        host.create_macvlan(&spec.ifname, parent.index, Some(netns.fd()))
            .await?;
        let link = pod.require_link(&spec.ifname).await?;
        // The Neutron port carries the address allowed on the trunk (the
        // controller added it to allowed_address_pairs), so use it.
        l3::configure(&pod, &link, spec).await
    }

    async fn teardown(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), TeardownError> {
        teardown_pod_link(spec, target, "macvlan").await
    }

    async fn check(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        check_pod_link(spec, target, "macvlan").await
    }
}
