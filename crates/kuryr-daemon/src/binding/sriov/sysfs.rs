//! What sysfs says about PFs and VFs: which PFs have VFs, a PF's VFs with
//! their PCI addresses, a VF's PF and number, a VF's netdev. Read-only; the
//! root is configurable so tests use a fake tree ([`tests::fake_pf`]).

use std::path::Path;

use super::super::BindingError;

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

/// The first name in `dir` (sorted), e.g. the netdev under a device's `net/`.
fn first_entry(dir: &Path) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.into_iter().next()
}

/// One VF of a PF as sysfs lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SysfsVf {
    /// VF number on the PF (`virtfn<N>`).
    pub index: u32,
    pub pci_address: String,
    /// Its netdev, when it is in the daemon's namespace (a VF moved into a
    /// pod has none here).
    pub netdev: Option<String>,
}

/// The VFs of `pf`, by index.
pub(super) fn vfs_of(sysfs_root: &Path, pf: &str) -> Result<Vec<SysfsVf>, String> {
    let device = sysfs_root.join("class/net").join(pf).join("device");
    let dir = std::fs::read_dir(&device).map_err(|e| format!("PF {pf}: {}: {e}", device.display()))?;
    let mut vfs = Vec::new();
    for entry in dir.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(index) = name.strip_prefix("virtfn").and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Some(pci_address) = std::fs::read_link(entry.path())
            .ok()
            .and_then(|t| t.file_name().map(|f| f.to_string_lossy().into_owned()))
        else {
            continue;
        };
        let netdev = first_entry(&entry.path().join("net"));
        vfs.push(SysfsVf {
            index,
            pci_address,
            netdev,
        });
    }
    vfs.sort_by_key(|vf| vf.index);
    Ok(vfs)
}

/// PF netdev and VF number of the VF at `pci` (from its `physfn` link).
pub(super) fn vf_identity(sysfs_root: &Path, pci: &str) -> Result<(String, u32), String> {
    let physfn_net = sysfs_root.join("bus/pci/devices").join(pci).join("physfn/net");
    let pf = first_entry(&physfn_net)
        .ok_or_else(|| format!("VF {pci}: its PF has no netdev in {}", physfn_net.display()))?;
    let index = vfs_of(sysfs_root, &pf)?
        .into_iter()
        .find(|vf| vf.pci_address == pci)
        .map(|vf| vf.index)
        .ok_or_else(|| format!("VF {pci} is not listed by PF {pf}"))?;
    Ok((pf, index))
}

/// [`vf_identity`] as a binding error.
pub(super) fn require_vf_identity(sysfs_root: &Path, pci: &str) -> Result<(String, u32), BindingError> {
    vf_identity(sysfs_root, pci).map_err(|reason| BindingError::Unsupported {
        driver: "sriov",
        reason,
    })
}

/// The netdev of the VF at `pci` in the daemon's namespace.
pub(super) fn vf_netdev(sysfs_root: &Path, pci: &str) -> Result<String, BindingError> {
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

/// The PCI address of the device behind netdev `name` (`class/net/<name>/device`).
pub(super) fn pci_of_netdev(sysfs_root: &Path, name: &str) -> Result<String, BindingError> {
    let device = sysfs_root.join("class/net").join(name).join("device");
    std::fs::canonicalize(&device)
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
        .ok_or_else(|| BindingError::Unsupported {
            driver: "sriov",
            reason: format!("VF {name}: {} does not resolve", device.display()),
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(super) mod tests {
    use super::*;

    /// A fake sysfs: `pf` at `pf_pci` with VFs `(index, pci, netdev)`; a VF
    /// without netdev is one that sits in a pod's namespace.
    pub(in super::super) fn fake_pf(root: &Path, pf: &str, pf_pci: &str, vfs: &[(u32, &str, Option<&str>)]) {
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
    fn vfs_are_listed_by_number_with_their_netdevs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fake_pf(
            root,
            "ens1f0",
            "0000:3b:00.0",
            &[
                (10, "0000:3b:03.2", Some("ens1f0v10")),
                (0, "0000:3b:02.0", None),
                (2, "0000:3b:02.2", Some("ens1f0v2")),
            ],
        );
        let vfs = vfs_of(root, "ens1f0").unwrap();
        let got: Vec<(u32, &str, Option<&str>)> = vfs
            .iter()
            .map(|vf| (vf.index, vf.pci_address.as_str(), vf.netdev.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (0, "0000:3b:02.0", None),
                (2, "0000:3b:02.2", Some("ens1f0v2")),
                (10, "0000:3b:03.2", Some("ens1f0v10")),
            ]
        );
        assert!(vfs_of(root, "missing0").unwrap_err().starts_with("PF missing0: "));
        // The VF's PF and number, from its PCI address (VIFs that name the VF).
        assert_eq!(vf_identity(root, "0000:3b:03.2").unwrap(), ("ens1f0".into(), 10));
        assert!(
            vf_identity(root, "0000:3b:09.9")
                .unwrap_err()
                .contains("its PF has no netdev")
        );
        assert_eq!(vf_netdev(root, "0000:3b:02.2").unwrap(), "ens1f0v2");
        assert!(
            vf_netdev(root, "0000:3b:02.0").is_err(),
            "VF in a pod has no host netdev"
        );
        assert!(matches!(
            vf_netdev(Path::new("/sys"), "../../etc"),
            Err(BindingError::InvalidVif { .. })
        ));
        assert_eq!(pci_of_netdev(root, "ens1f0v2").unwrap(), "0000:3b:02.2");
        assert!(pci_of_netdev(root, "nothere").is_err());
    }
}
