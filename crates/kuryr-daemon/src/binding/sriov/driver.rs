//! The SR-IOV binding driver: move the chosen VF's netdev into the pod with
//! the port's MAC and the network's VLAN set through its PF, and give it back
//! to the host on teardown.

use async_trait::async_trait;

use crate::netlink::{NetNs, Netlink};

use super::super::veth::wrong_kind;
use super::super::{BindingDriver, BindingError, PlugKind, PlugSpec, PlugTarget, TeardownError, l3};
use super::SriovConfig;
use super::allocation::VfAllocator;
use super::sysfs::{pci_of_netdev, require_vf_identity};

/// Host name given back to a VF when it leaves the pod: derived from its PCI
/// address (`0000:3b:02.1` -> `vf3b021`) or, when the spec names none (a VF the
/// kubelet or the free list chose), from its Neutron port id
/// (`3f2a7c9e-1111-...` -> `vf3f2a7c9e1111`), so that two VFs never collide.
fn host_vf_name(pci_or_port: &str) -> String {
    let alnum = |s: &str| -> Vec<char> { s.chars().filter(char::is_ascii_alphanumeric).collect() };
    // IFNAMSIZ: 15 bytes, "vf" and 13 more. A PCI address differs in its end (domain dropped),
    // a port id (random) in its start.
    let kept: String = match pci_or_port.split_once(':') {
        Some((_domain, rest)) => {
            let tail = alnum(rest);
            tail[tail.len().saturating_sub(13)..].iter().collect()
        }
        None => alnum(pci_or_port).into_iter().take(13).collect(),
    };
    format!("vf{kept}")
}

pub struct SriovDriver {
    vfs: VfAllocator,
}

impl SriovDriver {
    pub fn new(config: SriovConfig) -> Self {
        Self {
            vfs: VfAllocator::new(config),
        }
    }

    /// Reset the VLAN of the VF now called `host_name` in the host namespace.
    async fn clear_vlan(&self, host_name: &str) -> Result<(), BindingError> {
        let root = &self.vfs.config().sysfs_root;
        let pci = pci_of_netdev(root, host_name)?;
        let (pf, index) = require_vf_identity(root, &pci)?;
        let host = Netlink::current()?;
        let pf = host.require_link(&pf).await?;
        host.set_vf(pf.index, index, None, 0).await.map_err(Into::into)
    }

    /// Move the pod's VF back to the host under [`host_vf_name`]; `None`
    /// when there is nothing to move (namespace or link already gone).
    async fn return_to_host(
        &self,
        spec: &PlugSpec,
        pci_address: Option<&str>,
        target: &PlugTarget<'_>,
    ) -> Result<Option<String>, BindingError> {
        // A destroyed namespace hands its VFs back to the host by itself.
        let Some(netns) = target.netns else {
            return Ok(None);
        };
        let pod = Netlink::in_netns(netns).await?;
        let Some(link) = pod.link_by_name(&spec.ifname).await? else {
            return Ok(None);
        };
        let host_ns = NetNs::open("/proc/self/ns/net")?;
        pod.set_down(link.index).await?;
        let host_name = host_vf_name(pci_address.unwrap_or(&spec.port_id));
        pod.rename(link.index, &host_name).await?;
        pod.move_to_netns(link.index, host_ns.fd()).await?;
        Ok(Some(host_name))
    }
}

#[async_trait]
impl BindingDriver for SriovDriver {
    fn name(&self) -> &'static str {
        "sriov"
    }

    async fn setup(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let PlugKind::Sriov {
            pci_address,
            physnet,
            vlan,
        } = &spec.kind
        else {
            return Err(wrong_kind(self.name(), spec));
        };
        let netns = target.require_netns()?;
        let pod = Netlink::in_netns(netns).await?;
        // A retried ADD finds the VF already in the pod.
        if pod.link_by_name(&spec.ifname).await?.is_none() {
            let pod_key = target.pod();
            let (vf, _claim) = self
                .vfs
                .choose(pci_address.as_deref(), physnet.as_deref(), pod_key.as_ref())
                .await?;
            let host = Netlink::current()?;
            let link = host.require_link(&vf.netdev).await?;
            let pf = host.require_link(&vf.pf).await?;
            // Down while reconfiguring and moving: a VF keeps its config across namespaces.
            host.set_down(link.index).await?;
            host.set_vf(pf.index, vf.vf_index, Some(spec.mac), vlan.unwrap_or(0))
                .await?;
            host.move_to_netns(link.index, netns.fd()).await?;
            let moved = pod.require_link(&vf.netdev).await?;
            pod.rename(moved.index, &spec.ifname).await?;
        }
        let link = pod.require_link(&spec.ifname).await?;
        l3::configure(&pod, &link, spec).await
    }

    async fn teardown(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), TeardownError> {
        let PlugKind::Sriov {
            pci_address, vlan, ..
        } = &spec.kind
        else {
            return Err(TeardownError(vec![wrong_kind(self.name(), spec)]));
        };
        // VFs are hardware: give them back to the host, never delete them.
        let result = match self.return_to_host(spec, pci_address.as_deref(), target).await {
            // The next pod on this VF must not inherit the VLAN.
            Ok(Some(host_name)) if vlan.is_some() => self.clear_vlan(&host_name).await,
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        TeardownError::into_result(result.err().into_iter().collect())
    }

    async fn check(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let pod = Netlink::in_netns(target.require_netns()?).await?;
        l3::check(&pod, spec).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vf_host_names_fit_ifnamsiz_and_differ() {
        assert_eq!(host_vf_name("0000:3b:02.1"), "vf3b021");
        assert_ne!(host_vf_name("0000:3b:02.1"), host_vf_name("0000:3b:02.2"));
        assert!(host_vf_name("0000:3b:02.1-with-a-very-long-suffix").len() <= 15);
        // No PCI address in the spec: the port id, never one name for every VF.
        let a = host_vf_name("3f2a7c9e-1111-4222-8333-444455556666");
        assert_eq!(a, "vf3f2a7c9e11114");
        assert_ne!(a, host_vf_name("9b8c7d6e-aaaa-4bbb-8ccc-ddddeeeeffff"));
    }
}
