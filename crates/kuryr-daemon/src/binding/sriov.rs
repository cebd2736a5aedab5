//! SR-IOV binding: move a VF's netdev into the pod and configure it there.
//!
//! The controller cannot know which VF the device plugin gave the pod, so a
//! `VIFSriov` usually names none (`dev_address` unset): the daemon then picks a
//! free VF of one of the physnet's PFs (`[sriov] physical_device_mappings`,
//! `physnet:pf`), sets the port's MAC and the network's VLAN on it through the
//! PF, moves it into the pod and configures L3 there. A VF is free when its
//! netdev is visible in the daemon's namespace (a VF moved into a pod is not)
//! and no concurrent ADD has claimed it.
//!
//! With the SR-IOV network device plugin the kubelet has already given the
//! pod specific VFs; picking another one would let two pods swap VFs. With
//! `[sriov] enable_pod_resource_service = True` the daemon therefore asks the
//! kubelet's PodResources service ([`crate::kubelet`]) for the pod's devices
//! of the physnet's resource (`[sriov] physnet_resource_mappings`, with
//! `device_plugin_resource_prefix`, as the controller maps them) and takes
//! the first of them that no other interface of the pod uses yet.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use crate::kubelet::{PodResourcesClient, pod_devices};
use crate::netlink::{NetNs, Netlink};
use crate::registry::PodKey;

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

/// Where the daemon looks for VFs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SriovConfig {
    /// physnet -> its PF netdevs, in preference order.
    pub physnet_pfs: BTreeMap<String, Vec<String>>,
    /// Root of sysfs (`/sys`); tests point it at a fake tree.
    pub sysfs_root: PathBuf,
    /// `[sriov] enable_pod_resource_service`: a VIF without `dev_address`
    /// gets a VF the kubelet allocated to the pod, never any free VF.
    pub enable_pod_resource_service: bool,
    /// `[sriov] kubelet_root_dir` (`/var/lib/kubelet`); the PodResources
    /// socket is `pod-resources/kubelet.sock` in it.
    pub kubelet_root_dir: PathBuf,
    /// `[sriov] physnet_resource_mappings`: physnet -> device-plugin
    /// resource, without the prefix.
    pub physnet_resource_mappings: BTreeMap<String, String>,
    /// `[sriov] device_plugin_resource_prefix` (`intel.com`).
    pub device_plugin_resource_prefix: String,
    /// Bound on one PodResources call (connect included).
    pub kubelet_timeout: Duration,
}

impl Default for SriovConfig {
    fn default() -> Self {
        Self {
            physnet_pfs: BTreeMap::new(),
            sysfs_root: PathBuf::from("/sys"),
            enable_pod_resource_service: false,
            kubelet_root_dir: PathBuf::from("/var/lib/kubelet"),
            physnet_resource_mappings: BTreeMap::new(),
            device_plugin_resource_prefix: "intel.com".into(),
            kubelet_timeout: Duration::from_secs(10),
        }
    }
}

impl SriovConfig {
    /// Parse `[sriov] physical_device_mappings` entries (`physnet:pf`, a
    /// physnet may be listed with several PFs).
    pub fn parse_mappings(entries: &[String]) -> Result<BTreeMap<String, Vec<String>>, String> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            let (physnet, pf) = entry
                .split_once(':')
                .map(|(a, b)| (a.trim(), b.trim()))
                .filter(|(a, b)| !a.is_empty() && !b.is_empty())
                .ok_or_else(|| {
                    format!("[sriov] physical_device_mappings: {entry:?} is not physnet:interface")
                })?;
            if pf.contains('/') || pf.len() > 15 {
                return Err(format!(
                    "[sriov] physical_device_mappings: {pf:?} (physnet {physnet}) is not an interface name"
                ));
            }
            let pfs = out.entry(physnet.to_string()).or_default();
            if !pfs.iter().any(|p| p == pf) {
                pfs.push(pf.to_string());
            }
        }
        Ok(out)
    }

    /// The device-plugin resource (`intel.com/sriov_a`) whose VFs serve
    /// `physnet`, mapped as the controller's `sriov` driver maps it:
    /// `<prefix>/<physnet_resource_mappings[physnet]>`, or `<prefix>/<physnet>`
    /// when no mapping is configured at all.
    pub fn resource_of_physnet(&self, physnet: &str) -> Result<String, String> {
        let prefix = self.device_plugin_resource_prefix.trim_end_matches('/');
        if self.physnet_resource_mappings.is_empty() {
            return Ok(format!("{prefix}/{physnet}"));
        }
        self.physnet_resource_mappings
            .get(physnet)
            .map(|res| format!("{prefix}/{res}"))
            .ok_or_else(|| format!("physnet {physnet} has no resource in [sriov] physnet_resource_mappings"))
    }
}

/// The devices the kubelet allocated to a pod for one physnet's resource.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Allocation {
    pod: PodKey,
    physnet: String,
    resource: String,
    /// PCI addresses, in the kubelet's order.
    device_ids: Vec<String>,
}

impl Allocation {
    fn context(&self) -> String {
        format!(
            "pod {}, physnet {}, resource {}",
            self.pod, self.physnet, self.resource
        )
    }
}

/// A VF the daemon may give to a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VfCandidate {
    /// PF netdev.
    pub pf: String,
    /// VF number on the PF (`virtfn<N>`).
    pub vf_index: u32,
    pub pci_address: String,
    /// The VF's netdev in the daemon's namespace.
    pub netdev: String,
}

fn first_entry(dir: &Path) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.into_iter().next()
}

/// The VFs of `pf` as (index, PCI address, netdev if visible here), by index.
fn vfs_of(sysfs_root: &Path, pf: &str) -> Result<Vec<(u32, String, Option<String>)>, String> {
    let device = sysfs_root.join("class/net").join(pf).join("device");
    let dir = std::fs::read_dir(&device).map_err(|e| format!("PF {pf}: {}: {e}", device.display()))?;
    let mut vfs = Vec::new();
    for entry in dir.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(index) = name.strip_prefix("virtfn").and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Some(pci) = std::fs::read_link(entry.path())
            .ok()
            .and_then(|t| t.file_name().map(|f| f.to_string_lossy().into_owned()))
        else {
            continue;
        };
        vfs.push((index, pci, first_entry(&entry.path().join("net"))));
    }
    vfs.sort_by_key(|(i, _, _)| *i);
    Ok(vfs)
}

/// Pick the lowest-numbered free VF of the first PF of `pfs` that has one.
/// `taken` holds PCI addresses claimed by ADDs in progress.
pub fn find_free_vf(
    sysfs_root: &Path,
    pfs: &[String],
    taken: &HashSet<String>,
) -> Result<VfCandidate, String> {
    let mut reasons = Vec::new();
    for pf in pfs {
        match vfs_of(sysfs_root, pf) {
            Ok(vfs) if vfs.is_empty() => reasons.push(format!("PF {pf} has no VFs (sriov_numvfs is 0)")),
            Ok(vfs) => {
                let total = vfs.len();
                let free = vfs.into_iter().find_map(|(i, pci, netdev)| {
                    Some((i, netdev?, pci)).filter(|(_, _, p)| !taken.contains(p))
                });
                match free {
                    Some((vf_index, netdev, pci_address)) => {
                        return Ok(VfCandidate {
                            pf: pf.clone(),
                            vf_index,
                            pci_address,
                            netdev,
                        });
                    }
                    None => reasons.push(format!("all {total} VFs of PF {pf} are in use")),
                }
            }
            Err(e) => reasons.push(e),
        }
    }
    if pfs.is_empty() {
        reasons.push("no PF is configured".into());
    }
    Err(reasons.join("; "))
}

/// PF netdev and VF number of the VF at `pci` (from its `physfn` link).
fn vf_identity(sysfs_root: &Path, pci: &str) -> Result<(String, u32), String> {
    let dev = sysfs_root.join("bus/pci/devices").join(pci);
    let pf = first_entry(&dev.join("physfn/net")).ok_or_else(|| {
        format!(
            "VF {pci}: its PF has no netdev in {}",
            dev.join("physfn/net").display()
        )
    })?;
    let index = vfs_of(sysfs_root, &pf)?
        .into_iter()
        .find(|(_, p, _)| p == pci)
        .map(|(i, _, _)| i)
        .ok_or_else(|| format!("VF {pci} is not listed by PF {pf}"))?;
    Ok((pf, index))
}

/// Host name given back to a VF when it leaves the pod: derived from its PCI
/// address (or port id) so that two VFs never collide (`0000:3b:02.1` -> `vf3b021`).
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

fn vf_netdev(sysfs_root: &Path, pci: &str) -> Result<String, BindingError> {
    if pci.contains('/') || pci.contains("..") {
        return Err(BindingError::InvalidVif {
            field: "dev_address".into(),
            message: format!("{pci:?} is not a PCI address"),
        });
    }
    let dir = sysfs_root.join("bus/pci/devices").join(pci).join("net");
    first_entry(&dir).ok_or_else(|| BindingError::Unsupported {
        driver: "sriov",
        reason: format!(
            "VF {pci} has no netdev in {} (in use by another pod?)",
            dir.display()
        ),
    })
}

pub struct SriovDriver {
    config: SriovConfig,
    /// VFs picked by ADDs that have not moved them yet.
    claimed: Mutex<HashSet<String>>,
}

/// Releases a claimed VF when the ADD is done with it (moved or failed).
struct Claim<'a> {
    driver: &'a SriovDriver,
    pci: Option<String>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let Some(pci) = self.pci.take() {
            self.driver
                .claimed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&pci);
        }
    }
}

impl SriovDriver {
    pub fn new(config: SriovConfig) -> Self {
        Self {
            config,
            claimed: Mutex::new(HashSet::new()),
        }
    }

    /// The VF for this spec: the one the VIF names, one the kubelet
    /// allocated to `pod` (`enable_pod_resource_service`), or a free one of
    /// its physnet's PFs.
    async fn choose(
        &self,
        pci_address: Option<&str>,
        physnet: Option<&str>,
        pod: Option<&PodKey>,
    ) -> Result<(VfCandidate, Claim<'_>), BindingError> {
        match (pci_address, physnet) {
            (None, Some(physnet)) if self.config.enable_pod_resource_service => {
                let allocation = self.kubelet_allocation(physnet, pod).await?;
                self.pick_allocated(&allocation)
            }
            _ => self.pick(pci_address, physnet),
        }
    }

    /// Ask the kubelet which devices of `physnet`'s resource `pod` was given.
    async fn kubelet_allocation(
        &self,
        physnet: &str,
        pod: Option<&PodKey>,
    ) -> Result<Allocation, BindingError> {
        let no_device = |reason: String| BindingError::NoDevice {
            driver: "sriov",
            reason,
        };
        let pod = pod.ok_or_else(|| {
            no_device(format!(
                "physnet {physnet}: [sriov] enable_pod_resource_service needs the pod's name and namespace, \
                 and the plug target does not name the pod"
            ))
        })?;
        let resource = self
            .config
            .resource_of_physnet(physnet)
            .map_err(|e| no_device(format!("pod {pod}: {e}")))?;
        let client =
            PodResourcesClient::in_root_dir(&self.config.kubelet_root_dir, self.config.kubelet_timeout);
        let pods = client.list().await.map_err(|e| {
            no_device(format!(
                "pod {pod}, physnet {physnet}, resource {resource}: kubelet PodResources on {}: {e}",
                client.socket().display()
            ))
        })?;
        let device_ids = pod_devices(&pods, &pod.namespace, &pod.name, &resource);
        if device_ids.is_empty() {
            return Err(no_device(format!(
                "pod {pod}, physnet {physnet}, resource {resource}: the kubelet lists no {resource} device \
                 for the pod (does it request {resource} from the SR-IOV device plugin?)"
            )));
        }
        Ok(Allocation {
            pod: pod.clone(),
            physnet: physnet.to_string(),
            resource,
            device_ids,
        })
    }

    /// The first VF of `allocation` that is not in use: its netdev is still
    /// in the daemon's namespace (an earlier interface of the pod has moved
    /// its VF away) and no concurrent ADD claimed it.
    fn pick_allocated(&self, allocation: &Allocation) -> Result<(VfCandidate, Claim<'_>), BindingError> {
        let root = &self.config.sysfs_root;
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        let mut reasons = Vec::new();
        for pci in &allocation.device_ids {
            if claimed.contains(pci) {
                reasons.push(format!("{pci} is taken by a concurrent ADD"));
                continue;
            }
            let netdev = match vf_netdev(root, pci) {
                Ok(netdev) => netdev,
                Err(BindingError::InvalidVif { message, .. }) => {
                    reasons.push(message);
                    continue;
                }
                Err(_) => {
                    reasons.push(format!(
                        "{pci} has no netdev in the daemon's namespace (plugged already, e.g. as another \
                         interface of this pod, or bound to a non-netdev driver)"
                    ));
                    continue;
                }
            };
            let (pf, vf_index) = match vf_identity(root, pci) {
                Ok(identity) => identity,
                Err(e) => {
                    reasons.push(e);
                    continue;
                }
            };
            claimed.insert(pci.clone());
            tracing::debug!(pod = %allocation.pod, pci = %pci, %pf, vf_index, "VF allocated by the kubelet");
            let vf = VfCandidate {
                pf,
                vf_index,
                pci_address: pci.clone(),
                netdev,
            };
            let claim = Claim {
                driver: self,
                pci: Some(pci.clone()),
            };
            return Ok((vf, claim));
        }
        Err(BindingError::NoDevice {
            driver: "sriov",
            reason: format!(
                "{}: none of the {} VFs the kubelet allocated to the pod is free: {}",
                allocation.context(),
                allocation.device_ids.len(),
                reasons.join("; ")
            ),
        })
    }

    /// The VF for this spec: the one the VIF names, or a free one of its physnet.
    fn pick(
        &self,
        pci_address: Option<&str>,
        physnet: Option<&str>,
    ) -> Result<(VfCandidate, Claim<'_>), BindingError> {
        let root = &self.config.sysfs_root;
        if let Some(pci) = pci_address {
            let netdev = vf_netdev(root, pci)?;
            let (pf, vf_index) = vf_identity(root, pci).map_err(|reason| BindingError::Unsupported {
                driver: "sriov",
                reason,
            })?;
            let vf = VfCandidate {
                pf,
                vf_index,
                pci_address: pci.to_string(),
                netdev,
            };
            return Ok((
                vf,
                Claim {
                    driver: self,
                    pci: None,
                },
            ));
        }
        let physnet = physnet.ok_or_else(|| BindingError::InvalidVif {
            field: "physnet".into(),
            message: "SR-IOV VIF names neither a VF (dev_address) nor a physnet".into(),
        })?;
        let pfs = self
            .config
            .physnet_pfs
            .get(physnet)
            .ok_or_else(|| BindingError::Unsupported {
                driver: "sriov",
                reason: format!("physnet {physnet} has no PF in [sriov] physical_device_mappings"),
            })?;
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        let vf = find_free_vf(root, pfs, &claimed).map_err(|e| BindingError::Unsupported {
            driver: "sriov",
            reason: format!("physnet {physnet}: {e}"),
        })?;
        claimed.insert(vf.pci_address.clone());
        let claim = Claim {
            driver: self,
            pci: Some(vf.pci_address.clone()),
        };
        Ok((vf, claim))
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
        l3::configure(&pod, link.index, spec, true).await
    }

    async fn teardown(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), TeardownError> {
        let PlugKind::Sriov {
            pci_address, vlan, ..
        } = &spec.kind
        else {
            return Err(TeardownError(vec![wrong_kind(self.name(), spec)]));
        };
        let mut errors = Vec::new();
        // VFs are hardware: give them back to the host, never delete them.
        let step = async {
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
            let host_name = host_vf_name(pci_address.as_deref().unwrap_or(&spec.port_id));
            pod.rename(link.index, &host_name).await?;
            pod.move_to_netns(link.index, host_ns.fd()).await?;
            Ok::<_, BindingError>(Some(host_name))
        };
        match step.await {
            // The next pod on this VF must not inherit the VLAN.
            Ok(Some(host_name)) if vlan.is_some() => {
                if let Err(e) = self.clear_vlan(&host_name).await {
                    errors.push(e);
                }
            }
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
        TeardownError::into_result(errors)
    }

    async fn check(&self, spec: &PlugSpec, target: &PlugTarget<'_>) -> Result<(), BindingError> {
        let pod = Netlink::in_netns(target.require_netns()?).await?;
        l3::check(&pod, spec).await.map(|_| ())
    }
}

impl SriovDriver {
    async fn clear_vlan(&self, host_name: &str) -> Result<(), BindingError> {
        let root = &self.config.sysfs_root;
        let device = root.join("class/net").join(host_name).join("device");
        let pci = std::fs::canonicalize(&device)
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
            .ok_or_else(|| BindingError::Unsupported {
                driver: "sriov",
                reason: format!("VF {host_name}: {} does not resolve", device.display()),
            })?;
        let (pf, index) = vf_identity(root, &pci).map_err(|reason| BindingError::Unsupported {
            driver: "sriov",
            reason,
        })?;
        let host = Netlink::current()?;
        let pf = host.require_link(&pf).await?;
        host.set_vf(pf.index, index, None, 0).await.map_err(Into::into)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A fake sysfs: `pf` at `pf_pci` with VFs `(index, pci, netdev)`; a VF
    /// without netdev is one that sits in a pod's namespace.
    fn fake_pf(root: &Path, pf: &str, pf_pci: &str, vfs: &[(u32, &str, Option<&str>)]) {
        let devices = root.join("bus/pci/devices");
        let pf_dev = devices.join(pf_pci);
        std::fs::create_dir_all(pf_dev.join("net").join(pf)).unwrap();
        std::fs::write(pf_dev.join("sriov_numvfs"), format!("{}\n", vfs.len())).unwrap();
        std::fs::create_dir_all(root.join("class/net").join(pf)).unwrap();
        std::os::unix::fs::symlink(&pf_dev, root.join("class/net").join(pf).join("device")).unwrap();
        for (i, pci, netdev) in vfs {
            let vf_dev = devices.join(pci);
            std::fs::create_dir_all(vf_dev.join("net")).unwrap();
            if let Some(n) = netdev {
                std::fs::create_dir_all(vf_dev.join("net").join(n)).unwrap();
                std::fs::create_dir_all(root.join("class/net").join(n)).unwrap();
                std::os::unix::fs::symlink(&vf_dev, root.join("class/net").join(n).join("device")).unwrap();
            }
            std::os::unix::fs::symlink(format!("../{pci}"), pf_dev.join(format!("virtfn{i}"))).unwrap();
            std::os::unix::fs::symlink(format!("../{pf_pci}"), vf_dev.join("physfn")).unwrap();
        }
    }

    #[test]
    fn vf_host_names_fit_ifnamsiz_and_differ() {
        assert_eq!(host_vf_name("0000:3b:02.1"), "vf3b021");
        assert_ne!(host_vf_name("0000:3b:02.1"), host_vf_name("0000:3b:02.2"));
        assert!(host_vf_name("0000:3b:02.1-with-a-very-long-suffix").len() <= 15);
        assert!(vf_netdev(Path::new("/sys"), "../../etc").is_err());
    }

    #[test]
    fn picks_lowest_free_vf_skipping_pod_owned_and_claimed_ones() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fake_pf(
            root,
            "ens1f0",
            "0000:3b:00.0",
            &[
                (10, "0000:3b:03.2", Some("ens1f0v10")),
                (0, "0000:3b:02.0", None), // in a pod's namespace
                (1, "0000:3b:02.1", Some("ens1f0v1")),
                (2, "0000:3b:02.2", Some("ens1f0v2")),
            ],
        );
        let pfs = vec!["ens1f0".to_string()];
        let vf = find_free_vf(root, &pfs, &HashSet::new()).unwrap();
        assert_eq!(
            vf,
            VfCandidate {
                pf: "ens1f0".into(),
                vf_index: 1,
                pci_address: "0000:3b:02.1".into(),
                netdev: "ens1f0v1".into(),
            }
        );
        // Claimed by a concurrent ADD: the next one; numeric order (2 before 10).
        let taken: HashSet<String> = ["0000:3b:02.1".to_string()].into();
        assert_eq!(find_free_vf(root, &pfs, &taken).unwrap().vf_index, 2);
        let taken: HashSet<String> = ["0000:3b:02.1", "0000:3b:02.2"].map(String::from).into();
        assert_eq!(find_free_vf(root, &pfs, &taken).unwrap().netdev, "ens1f0v10");
        let taken: HashSet<String> = ["0000:3b:02.1", "0000:3b:02.2", "0000:3b:03.2"]
            .map(String::from)
            .into();
        let err = find_free_vf(root, &pfs, &taken).unwrap_err();
        assert!(err.contains("all 4 VFs of PF ens1f0 are in use"), "{err}");
        // The VF's PF and number, from its PCI address (VIFs that name the VF).
        assert_eq!(vf_identity(root, "0000:3b:03.2").unwrap(), ("ens1f0".into(), 10));
        assert_eq!(vf_netdev(root, "0000:3b:02.2").unwrap(), "ens1f0v2");
        assert!(
            vf_netdev(root, "0000:3b:02.0").is_err(),
            "VF in a pod has no host netdev"
        );
    }

    #[test]
    fn falls_through_to_the_next_pf_and_explains_failures() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fake_pf(root, "ens1f0", "0000:3b:00.0", &[(0, "0000:3b:02.0", None)]);
        fake_pf(
            root,
            "ens2f0",
            "0000:5e:00.0",
            &[(0, "0000:5e:02.0", Some("ens2f0v0"))],
        );
        fake_pf(root, "ens3f0", "0000:6e:00.0", &[]);
        let pfs: Vec<String> = ["missing0", "ens3f0", "ens1f0", "ens2f0"]
            .map(String::from)
            .into();
        let vf = find_free_vf(root, &pfs, &HashSet::new()).unwrap();
        assert_eq!((vf.pf.as_str(), vf.netdev.as_str()), ("ens2f0", "ens2f0v0"));
        let err = find_free_vf(root, &pfs[..3], &HashSet::new()).unwrap_err();
        assert!(err.contains("PF missing0"), "{err}");
        assert!(err.contains("PF ens3f0 has no VFs"), "{err}");
        assert!(err.contains("all 1 VFs of PF ens1f0 are in use"), "{err}");
        assert!(find_free_vf(root, &[], &HashSet::new()).is_err());
    }

    #[test]
    fn driver_picks_per_physnet_and_releases_claims() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fake_pf(
            root,
            "ens1f0",
            "0000:3b:00.0",
            &[(0, "0000:3b:02.0", Some("v0")), (1, "0000:3b:02.1", Some("v1"))],
        );
        let driver = SriovDriver::new(SriovConfig {
            physnet_pfs: SriovConfig::parse_mappings(&["physnet2:ens1f0".into()]).unwrap(),
            sysfs_root: root.to_path_buf(),
            ..SriovConfig::default()
        });
        let (a, claim_a) = driver.pick(None, Some("physnet2")).unwrap();
        let (b, claim_b) = driver.pick(None, Some("physnet2")).unwrap();
        assert_eq!((a.netdev.as_str(), b.netdev.as_str()), ("v0", "v1"));
        let err = driver.pick(None, Some("physnet2")).err().unwrap().to_string();
        assert!(err.contains("all 2 VFs"), "{err}");
        drop((claim_a, claim_b));
        assert_eq!(driver.pick(None, Some("physnet2")).unwrap().0.netdev, "v0");
        let err = driver.pick(None, Some("physnet9")).err().unwrap().to_string();
        assert!(err.contains("physnet physnet9 has no PF"), "{err}");
        let err = driver.pick(None, None).err().unwrap().to_string();
        assert!(err.contains("physnet"), "{err}");
        // A VIF naming its VF gets exactly that one, with PF and number.
        let (named, _) = driver.pick(Some("0000:3b:02.1"), None).unwrap();
        assert_eq!(
            (named.pf.as_str(), named.vf_index, named.netdev.as_str()),
            ("ens1f0", 1, "v1")
        );
    }

    mod kubelet_allocated {
        use std::collections::HashMap;

        use super::*;
        use crate::kubelet::fake::{Answer, FakeKubelet};
        use crate::kubelet::pod_resources::{V1_LIST, V1ALPHA1_LIST};
        use crate::kubelet::{ContainerDevices, ContainerResources, PodResources};

        const RESOURCE: &str = "intel.com/sriov_a";

        fn pod_with(ns: &str, name: &str, devices: &[(&str, &[&str])]) -> PodResources {
            PodResources {
                name: name.into(),
                namespace: ns.into(),
                containers: vec![ContainerResources {
                    name: "app".into(),
                    devices: devices
                        .iter()
                        .map(|(r, ids)| ContainerDevices {
                            resource_name: (*r).into(),
                            device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
                        })
                        .collect(),
                }],
            }
        }

        /// PF ens1f0 with four free VFs, 0000:3b:02.0 (VF 0) to 0000:3b:02.3 (VF 3).
        fn four_free_vfs(root: &Path) {
            fake_pf(
                root,
                "ens1f0",
                "0000:3b:00.0",
                &[
                    (0, "0000:3b:02.0", Some("v0")),
                    (1, "0000:3b:02.1", Some("v1")),
                    (2, "0000:3b:02.2", Some("v2")),
                    (3, "0000:3b:02.3", Some("v3")),
                ],
            );
        }

        fn driver(root: &Path, kubelet: &FakeKubelet, enabled: bool) -> SriovDriver {
            SriovDriver::new(SriovConfig {
                physnet_pfs: SriovConfig::parse_mappings(&["physnet2:ens1f0".into()]).unwrap(),
                sysfs_root: root.to_path_buf(),
                enable_pod_resource_service: enabled,
                kubelet_root_dir: kubelet.root_dir().to_path_buf(),
                physnet_resource_mappings: [("physnet2".to_string(), "sriov_a".to_string())].into(),
                device_plugin_resource_prefix: "intel.com".into(),
                kubelet_timeout: Duration::from_secs(5),
            })
        }

        #[tokio::test]
        async fn the_kubelet_allocated_vf_wins_over_a_lower_free_one() {
            let dir = tempfile::tempdir().unwrap();
            four_free_vfs(dir.path());
            let kubelet = FakeKubelet::start(HashMap::from([(
                V1_LIST,
                Answer::Pods(vec![
                    pod_with("ns", "other", &[(RESOURCE, &["0000:3b:02.1"])]),
                    pod_with(
                        "ns",
                        "p",
                        &[
                            ("intel.com/sriov_b", &["0000:3b:02.0"]),
                            (RESOURCE, &["0000:3b:02.2"]),
                        ],
                    ),
                ]),
            )]))
            .await;
            let pod = PodKey::new("ns", "p");
            let d = driver(dir.path(), &kubelet, true);
            let (vf, _claim) = d.choose(None, Some("physnet2"), Some(&pod)).await.unwrap();
            assert_eq!(
                vf,
                VfCandidate {
                    pf: "ens1f0".into(),
                    vf_index: 2,
                    pci_address: "0000:3b:02.2".into(),
                    netdev: "v2".into(),
                }
            );
            assert_eq!(kubelet.calls(), vec![V1_LIST]);
            // Disabled: today's behaviour, the lowest free VF, no kubelet call.
            let disabled = driver(dir.path(), &kubelet, false);
            let (vf, _claim) = disabled.choose(None, Some("physnet2"), Some(&pod)).await.unwrap();
            assert_eq!(vf.vf_index, 0);
            // A VIF naming its VF keeps it.
            let (vf, _claim) = d
                .choose(Some("0000:3b:02.3"), Some("physnet2"), Some(&pod))
                .await
                .unwrap();
            assert_eq!(vf.vf_index, 3);
            assert_eq!(kubelet.calls().len(), 1);
        }

        #[tokio::test]
        async fn each_vif_of_the_pod_takes_another_allocated_vf() {
            let dir = tempfile::tempdir().unwrap();
            four_free_vfs(dir.path());
            // Kubelet's order, not numeric; the same VF listed twice counts once.
            let kubelet = FakeKubelet::start(HashMap::from([(
                V1_LIST,
                Answer::Pods(vec![pod_with(
                    "ns",
                    "p",
                    &[
                        (RESOURCE, &["0000:3b:02.3", "0000:3b:02.1"]),
                        (RESOURCE, &["0000:3b:02.3"]),
                    ],
                )]),
            )]))
            .await;
            let pod = PodKey::new("ns", "p");
            let d = driver(dir.path(), &kubelet, true);
            // Concurrent ADDs (claims held): one VF each.
            let (eth1, claim1) = d.choose(None, Some("physnet2"), Some(&pod)).await.unwrap();
            let (eth2, claim2) = d.choose(None, Some("physnet2"), Some(&pod)).await.unwrap();
            assert_eq!(
                (eth1.pci_address.as_str(), eth2.pci_address.as_str()),
                ("0000:3b:02.3", "0000:3b:02.1")
            );
            let err = d
                .choose(None, Some("physnet2"), Some(&pod))
                .await
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains("pod ns/p, physnet physnet2, resource intel.com/sriov_a")
                    && err.contains("none of the 2 VFs the kubelet allocated")
                    && err.contains("0000:3b:02.3 is taken by a concurrent ADD"),
                "{err}"
            );
            drop((claim1, claim2));
            // eth1's VF has moved into the pod (no host netdev): eth2 gets the other one.
            std::fs::remove_dir_all(dir.path().join("bus/pci/devices/0000:3b:02.3/net/v3")).unwrap();
            let (eth2, _claim) = d.choose(None, Some("physnet2"), Some(&pod)).await.unwrap();
            assert_eq!((eth2.vf_index, eth2.netdev.as_str()), (1, "v1"));
        }

        #[tokio::test]
        async fn no_allocation_is_a_clear_error() {
            let dir = tempfile::tempdir().unwrap();
            four_free_vfs(dir.path());
            let kubelet = FakeKubelet::start(HashMap::from([(
                V1_LIST,
                Answer::Pods(vec![
                    pod_with("ns", "p", &[("intel.com/sriov_b", &["0000:3b:02.0"])]),
                    pod_with("ns2", "p", &[(RESOURCE, &["0000:3b:02.1"])]),
                ]),
            )]))
            .await;
            let d = driver(dir.path(), &kubelet, true);
            let err = d
                .choose(None, Some("physnet2"), Some(&PodKey::new("ns", "p")))
                .await
                .err()
                .unwrap();
            assert!(
                matches!(err, BindingError::NoDevice { driver: "sriov", .. }),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                "sriov: pod ns/p, physnet physnet2, resource intel.com/sriov_a: the kubelet lists no \
                 intel.com/sriov_a device for the pod (does it request intel.com/sriov_a from the SR-IOV \
                 device plugin?)"
            );
            // A physnet without a resource, or no pod to ask about.
            let err = d
                .choose(None, Some("physnet9"), Some(&PodKey::new("ns", "p")))
                .await
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains("physnet physnet9 has no resource in [sriov] physnet_resource_mappings"),
                "{err}"
            );
            let err = d
                .choose(None, Some("physnet2"), None)
                .await
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains("needs the pod's name and namespace"), "{err}");
        }

        #[tokio::test]
        async fn kubelet_errors_are_reported() {
            let dir = tempfile::tempdir().unwrap();
            four_free_vfs(dir.path());
            let kubelet = FakeKubelet::start(HashMap::from([(
                V1_LIST,
                Answer::Status {
                    code: 7,
                    message: "access denied to pod resources".into(),
                    trailers_only: false,
                },
            )]))
            .await;
            let d = driver(dir.path(), &kubelet, true);
            let err = d
                .choose(None, Some("physnet2"), Some(&PodKey::new("ns", "p")))
                .await
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.starts_with(
                    "sriov: pod ns/p, physnet physnet2, resource intel.com/sriov_a: kubelet PodResources on "
                ),
                "{err}"
            );
            assert!(
                err.ends_with("pod-resources/kubelet.sock: /v1.PodResourcesLister/List: gRPC status 7 (PERMISSION_DENIED): access denied to pod resources"),
                "{err}"
            );
            // Unimplemented in both versions: the v1alpha1 status is the one reported.
            let none = FakeKubelet::start(HashMap::new()).await;
            let err = driver(dir.path(), &none, true)
                .choose(None, Some("physnet2"), Some(&PodKey::new("ns", "p")))
                .await
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains(&format!("{V1ALPHA1_LIST}: gRPC status 12 (UNIMPLEMENTED)")),
                "{err}"
            );
        }

        #[test]
        fn an_add_target_names_its_pod() {
            let tag = PodKey::new("ns", "p").owner_tag("c1");
            let target = PlugTarget {
                netns: None,
                pod_uid: "u",
                owner_tag: Some(&tag),
            };
            assert_eq!(target.pod(), Some(PodKey::new("ns", "p")));
            let target = PlugTarget {
                owner_tag: None,
                ..target
            };
            assert_eq!(target.pod(), None);
        }

        #[test]
        fn resources_are_mapped_like_the_controller_maps_them() {
            let mut c = SriovConfig::default();
            assert_eq!(c.resource_of_physnet("physnet1").unwrap(), "intel.com/physnet1");
            c.device_plugin_resource_prefix = "example.org/".into();
            c.physnet_resource_mappings = [("physnet1".to_string(), "sriov_a".to_string())].into();
            assert_eq!(c.resource_of_physnet("physnet1").unwrap(), "example.org/sriov_a");
            assert!(c.resource_of_physnet("physnet2").is_err());
        }
    }

    #[test]
    fn physical_device_mappings_parse() {
        let m = SriovConfig::parse_mappings(&[
            "physnet1:ens1f0".into(),
            " physnet1 : ens1f1".into(),
            "physnet2:ens2f0".into(),
            "physnet1:ens1f0".into(),
            "".into(),
        ])
        .unwrap();
        assert_eq!(m["physnet1"], vec!["ens1f0", "ens1f1"]);
        assert_eq!(m["physnet2"], vec!["ens2f0"]);
        let err = SriovConfig::parse_mappings(&["ens1f0".into()]).unwrap_err();
        assert!(err.contains("\"ens1f0\" is not physnet:interface"), "{err}");
        assert!(SriovConfig::parse_mappings(&["p:../x".into()]).is_err());
    }
}
