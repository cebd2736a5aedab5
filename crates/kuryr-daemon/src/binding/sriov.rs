//! SR-IOV binding: move a VF's netdev into the pod and configure it there.
//!
//! The controller cannot know which VF the device plugin gave the pod, so a
//! `VIFSriov` usually names none (`dev_address` unset): the daemon then picks a
//! free VF of one of the physnet's PFs (`[sriov] physical_device_mappings`,
//! `physnet:pf`), sets the port's MAC and the network's VLAN on it through the
//! PF, moves it into the pod and configures L3 there. A VF is free when its
//! netdev is visible in the daemon's namespace (a VF moved into a pod is not)
//! and no concurrent ADD has claimed it.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

/// Where the daemon looks for VFs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SriovConfig {
    /// physnet -> its PF netdevs, in preference order.
    pub physnet_pfs: BTreeMap<String, Vec<String>>,
    /// Root of sysfs (`/sys`); tests point it at a fake tree.
    pub sysfs_root: PathBuf,
}

impl Default for SriovConfig {
    fn default() -> Self {
        Self {
            physnet_pfs: BTreeMap::new(),
            sysfs_root: PathBuf::from("/sys"),
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
            let (vf, _claim) = self.pick(pci_address.as_deref(), physnet.as_deref())?;
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
