//! SR-IOV binding: move the VF's netdev into the pod and configure it there.

use async_trait::async_trait;

use crate::netlink::{NetNs, Netlink};

use super::veth::wrong_kind;
use super::{BindingDriver, BindingError, PlugKind, PlugSpec, PlugTarget, TeardownError, l3};

/// Physical functions with VFs enabled (`/sys/class/net/*/device/sriov_numvfs` > 0).
pub fn sriov_capable_pfs() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let numvfs = std::fs::read_to_string(e.path().join("device/sriov_numvfs")).ok()?;
            (numvfs.trim().parse::<u32>().ok()? > 0).then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

/// Host name given back to a VF when it leaves the pod: derived from its PCI
/// address so that two VFs never collide (`0000:3b:02.1` -> `vf3b021`).
fn host_vf_name(pci: &str) -> String {
    let tail: String = pci
        .split(':')
        .skip(1)
        .collect::<String>()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let start = tail.len().saturating_sub(13);
    format!("vf{}", &tail[start..])
}

fn vf_netdev(pci: &str) -> Result<String, BindingError> {
    if pci.contains('/') || pci.contains("..") {
        return Err(BindingError::InvalidVif {
            field: "pci_address".into(),
            message: format!("{pci:?} is not a PCI address"),
        });
    }
    let dir = format!("/sys/bus/pci/devices/{pci}/net");
    let mut entries = std::fs::read_dir(&dir).map_err(|e| BindingError::Unsupported {
        driver: "sriov",
        reason: format!("VF {pci} has no netdev ({dir}: {e})"),
    })?;
    entries
        .find_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .ok_or_else(|| BindingError::Unsupported {
            driver: "sriov",
            reason: format!("VF {pci} has no netdev in {dir}"),
        })
}

pub struct SriovDriver;

#[async_trait]
impl BindingDriver for SriovDriver {
    fn name(&self) -> &'static str {
        "sriov"
    }

    async fn setup(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let PlugKind::Sriov { pci_address } = &spec.kind else {
            return Err(wrong_kind(self.name(), spec));
        };
        let pci = pci_address.as_deref().ok_or_else(|| BindingError::InvalidVif {
            field: "pci_address".into(),
            message: "SR-IOV VIF names no VF (pci_address is missing)".into(),
        })?;
        let netns = target.require_netns()?;
        let pod = Netlink::in_netns(netns).await?;
        if pod.link_by_name(&spec.ifname).await?.is_none() {
            let host = Netlink::current()?;
            let name = vf_netdev(pci)?;
            let vf = host.require_link(&name).await?;
            // Down while moving: a VF keeps its config across namespaces.
            host.set_down(vf.index).await?;
            host.move_to_netns(vf.index, netns.fd()).await?;
            let moved = pod.require_link(&name).await?;
            pod.rename(moved.index, &spec.ifname).await?;
        }
        let link = pod.require_link(&spec.ifname).await?;
        l3::configure(&pod, link.index, spec, true).await
    }

    async fn teardown(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), TeardownError> {
        let PlugKind::Sriov { pci_address } = &spec.kind else {
            return Err(TeardownError(vec![wrong_kind(self.name(), spec)]));
        };
        let mut errors = Vec::new();
        // VFs are hardware: give them back to the host, never delete them.
        let step = async {
            // A destroyed namespace hands its VFs back to the host by itself.
            let Some(netns) = target.netns else {
                return Ok(());
            };
            let pod = Netlink::in_netns(netns).await?;
            let Some(link) = pod.link_by_name(&spec.ifname).await? else {
                return Ok(());
            };
            let host_ns = NetNs::open("/proc/self/ns/net")?;
            pod.set_down(link.index).await?;
            let host_name = host_vf_name(pci_address.as_deref().unwrap_or(&spec.port_id));
            pod.rename(link.index, &host_name).await?;
            pod.move_to_netns(link.index, host_ns.fd()).await?;
            Ok::<(), BindingError>(())
        };
        if let Err(e) = step.await {
            errors.push(e);
        }
        TeardownError::into_result(errors)
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
        assert!(vf_netdev("../../etc").is_err());
    }
}
