//! Which VF an SR-IOV ADD takes: the one the VIF names, one the kubelet
//! allocated to the pod (PodResources, `[sriov] enable_pod_resource_service`),
//! or the lowest free VF of the physnet's PFs. A VF picked by an ADD is
//! claimed until that ADD has moved it or failed, so concurrent ADDs never
//! take the same one.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use crate::kubelet::{PodResourcesClient, pod_devices};
use crate::registry::PodKey;

use super::super::BindingError;
use super::SriovConfig;
use super::sysfs::{require_vf_identity, vf_identity, vf_netdev, vfs_of};

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

/// Pick the lowest-numbered free VF of the first PF of `pfs` that has one.
/// A VF is free when its netdev is visible in the daemon's namespace (a VF
/// moved into a pod is not) and `taken` (PCI addresses claimed by ADDs in
/// progress) does not hold it.
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
                let free = vfs
                    .into_iter()
                    .filter(|vf| !taken.contains(&vf.pci_address))
                    .find_map(|vf| Some((vf.index, vf.netdev?, vf.pci_address)));
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

/// The devices the kubelet allocated to a pod for one physnet's resource.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Allocation {
    pod: PodKey,
    physnet: String,
    resource: String,
    /// PCI addresses, in the kubelet's order.
    device_ids: Vec<String>,
}

/// Chooses VFs and keeps the claims of ADDs in progress.
pub(super) struct VfAllocator {
    config: SriovConfig,
    /// VFs picked by ADDs that have not moved them yet.
    claimed: Mutex<HashSet<String>>,
}

/// Releases a claimed VF when the ADD is done with it (moved or failed).
pub(super) struct Claim<'a> {
    claimed: &'a Mutex<HashSet<String>>,
    pci: Option<String>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let Some(pci) = self.pci.take() {
            lock(self.claimed).remove(&pci);
        }
    }
}

/// A poisoned lock only means another ADD panicked; the set is still right.
fn lock(claimed: &Mutex<HashSet<String>>) -> MutexGuard<'_, HashSet<String>> {
    claimed.lock().unwrap_or_else(|p| p.into_inner())
}

fn no_device(reason: String) -> BindingError {
    BindingError::NoDevice {
        driver: "sriov",
        reason,
    }
}

impl VfAllocator {
    pub(super) fn new(config: SriovConfig) -> Self {
        Self {
            config,
            claimed: Mutex::new(HashSet::new()),
        }
    }

    pub(super) fn config(&self) -> &SriovConfig {
        &self.config
    }

    /// `vf`, claimed in `claimed` until the returned [`Claim`] drops.
    fn claim(&self, claimed: &mut HashSet<String>, vf: VfCandidate) -> (VfCandidate, Claim<'_>) {
        claimed.insert(vf.pci_address.clone());
        let claim = Claim {
            claimed: &self.claimed,
            pci: Some(vf.pci_address.clone()),
        };
        (vf, claim)
    }

    /// The VF for this spec: the one the VIF names, one the kubelet
    /// allocated to `pod` (`enable_pod_resource_service`), or a free one of
    /// its physnet's PFs.
    pub(super) async fn choose(
        &self,
        pci_address: Option<&str>,
        physnet: Option<&str>,
        pod: Option<&PodKey>,
    ) -> Result<(VfCandidate, Claim<'_>), BindingError> {
        match (pci_address, physnet) {
            (None, Some(physnet)) if self.config.options.enable_pod_resource_service => {
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
        let pod = pod.ok_or_else(|| {
            no_device(format!(
                "physnet {physnet}: [sriov] enable_pod_resource_service needs the pod's name and namespace, \
                 and the plug target does not name the pod"
            ))
        })?;
        let resource = self
            .config
            .options
            .resource_of_physnet(physnet)
            .map_err(|e| no_device(format!("pod {pod}: {e}")))?;
        let context = format!("pod {pod}, physnet {physnet}, resource {resource}");
        let client = PodResourcesClient::in_root_dir(
            Path::new(&self.config.options.kubelet_root_dir),
            self.config.kubelet_timeout,
        );
        let pods = client.list().await.map_err(|e| {
            no_device(format!(
                "{context}: kubelet PodResources on {}: {e}",
                client.socket().display()
            ))
        })?;
        let device_ids = pod_devices(&pods, &pod.namespace, &pod.name, &resource);
        if device_ids.is_empty() {
            return Err(no_device(format!(
                "{context}: the kubelet lists no {resource} device for the pod (does it request {resource} \
                 from the SR-IOV device plugin?)"
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
        let mut claimed = lock(&self.claimed);
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
            tracing::debug!(pod = %allocation.pod, pci = %pci, %pf, vf_index, "VF allocated by the kubelet");
            let vf = VfCandidate {
                pf,
                vf_index,
                pci_address: pci.clone(),
                netdev,
            };
            return Ok(self.claim(&mut claimed, vf));
        }
        Err(no_device(format!(
            "pod {}, physnet {}, resource {}: none of the {} VFs the kubelet allocated to the pod is free: {}",
            allocation.pod,
            allocation.physnet,
            allocation.resource,
            allocation.device_ids.len(),
            reasons.join("; ")
        )))
    }

    /// The VF for this spec: the one the VIF names, or a free one of its physnet.
    pub(super) fn pick(
        &self,
        pci_address: Option<&str>,
        physnet: Option<&str>,
    ) -> Result<(VfCandidate, Claim<'_>), BindingError> {
        let root = &self.config.sysfs_root;
        if let Some(pci) = pci_address {
            let netdev = vf_netdev(root, pci)?;
            let (pf, vf_index) = require_vf_identity(root, pci)?;
            let vf = VfCandidate {
                pf,
                vf_index,
                pci_address: pci.to_string(),
                netdev,
            };
            // Named by the VIF: nobody else picks it, nothing to claim.
            let claim = Claim {
                claimed: &self.claimed,
                pci: None,
            };
            return Ok((vf, claim));
        }
        let physnet = physnet.ok_or_else(|| BindingError::InvalidVif {
            field: "physnet".into(),
            message: "SR-IOV VIF names neither a VF (dev_address) nor a physnet".into(),
        })?;
        let unsupported = |reason: String| BindingError::Unsupported {
            driver: "sriov",
            reason,
        };
        let pfs = self.config.options.pfs_of_physnet(physnet).ok_or_else(|| {
            unsupported(format!(
                "physnet {physnet} has no PF in [sriov] physical_device_mappings"
            ))
        })?;
        let mut claimed = lock(&self.claimed);
        let vf =
            find_free_vf(root, pfs, &claimed).map_err(|e| unsupported(format!("physnet {physnet}: {e}")))?;
        Ok(self.claim(&mut claimed, vf))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::binding::sriov::sysfs::tests::fake_pf;

    /// A fake sysfs with PF ens1f0 (0000:3b:00.0) and these VFs.
    fn sysfs_with_ens1f0(vfs: &[(u32, &str, Option<&str>)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fake_pf(dir.path(), "ens1f0", "0000:3b:00.0", vfs);
        dir
    }

    /// `[sriov]` with physnet2 on PF ens1f0.
    fn physnet2_on_ens1f0() -> kuryr_config::SriovSection {
        kuryr_config::SriovSection {
            physical_device_mappings: BTreeMap::from([("physnet2".to_string(), vec!["ens1f0".to_string()])])
                .into(),
            ..Default::default()
        }
    }

    #[test]
    fn picks_lowest_free_vf_skipping_pod_owned_and_claimed_ones() {
        let dir = sysfs_with_ens1f0(&[
            (10, "0000:3b:03.2", Some("ens1f0v10")),
            (0, "0000:3b:02.0", None), // in a pod's namespace
            (1, "0000:3b:02.1", Some("ens1f0v1")),
            (2, "0000:3b:02.2", Some("ens1f0v2")),
        ]);
        let root = dir.path();
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
    }

    #[test]
    fn falls_through_to_the_next_pf_and_explains_failures() {
        let dir = sysfs_with_ens1f0(&[(0, "0000:3b:02.0", None)]);
        let root = dir.path();
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
    fn picks_per_physnet_and_releases_claims() {
        let dir = sysfs_with_ens1f0(&[(0, "0000:3b:02.0", Some("v0")), (1, "0000:3b:02.1", Some("v1"))]);
        let vfs = VfAllocator::new(SriovConfig {
            options: physnet2_on_ens1f0(),
            sysfs_root: dir.path().to_path_buf(),
            ..SriovConfig::default()
        });
        let (a, claim_a) = vfs.pick(None, Some("physnet2")).unwrap();
        let (b, claim_b) = vfs.pick(None, Some("physnet2")).unwrap();
        assert_eq!((a.netdev.as_str(), b.netdev.as_str()), ("v0", "v1"));
        let err = vfs.pick(None, Some("physnet2")).err().unwrap().to_string();
        assert!(err.contains("all 2 VFs"), "{err}");
        drop((claim_a, claim_b));
        assert_eq!(vfs.pick(None, Some("physnet2")).unwrap().0.netdev, "v0");
        let err = vfs.pick(None, Some("physnet9")).err().unwrap().to_string();
        assert!(err.contains("physnet physnet9 has no PF"), "{err}");
        let err = vfs.pick(None, None).err().unwrap().to_string();
        assert!(err.contains("physnet"), "{err}");
        // A VIF naming its VF gets exactly that one, with PF and number.
        let (named, _) = vfs.pick(Some("0000:3b:02.1"), None).unwrap();
        assert_eq!(
            (named.pf.as_str(), named.vf_index, named.netdev.as_str()),
            ("ens1f0", 1, "v1")
        );
    }

    mod kubelet_allocated {
        use std::collections::HashMap;
        use std::time::Duration;

        use super::*;
        use crate::kubelet::fake::{Answer, FakeKubelet, pod_with};
        use crate::kubelet::pod_resources::{V1_LIST, V1ALPHA1_LIST};

        const RESOURCE: &str = "intel.com/sriov_a";

        /// PF ens1f0 with four free VFs, 0000:3b:02.0 (VF 0) to 0000:3b:02.3 (VF 3).
        fn four_free_vfs() -> tempfile::TempDir {
            sysfs_with_ens1f0(&[
                (0, "0000:3b:02.0", Some("v0")),
                (1, "0000:3b:02.1", Some("v1")),
                (2, "0000:3b:02.2", Some("v2")),
                (3, "0000:3b:02.3", Some("v3")),
            ])
        }

        fn allocator(root: &Path, kubelet: &FakeKubelet, enabled: bool) -> VfAllocator {
            VfAllocator::new(SriovConfig {
                options: kuryr_config::SriovSection {
                    enable_pod_resource_service: enabled,
                    kubelet_root_dir: kubelet.root_dir().display().to_string(),
                    physnet_resource_mappings: [("physnet2".to_string(), "sriov_a".to_string())].into(),
                    device_plugin_resource_prefix: "intel.com".into(),
                    ..physnet2_on_ens1f0()
                },
                sysfs_root: root.to_path_buf(),
                kubelet_timeout: Duration::from_secs(5),
            })
        }

        #[tokio::test]
        async fn the_kubelet_allocated_vf_wins_over_a_lower_free_one() {
            let dir = four_free_vfs();
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
            let d = allocator(dir.path(), &kubelet, true);
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
            // Disabled: the lowest free VF, no kubelet call.
            let disabled = allocator(dir.path(), &kubelet, false);
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
            let dir = four_free_vfs();
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
            let d = allocator(dir.path(), &kubelet, true);
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
            let dir = four_free_vfs();
            let kubelet = FakeKubelet::start(HashMap::from([(
                V1_LIST,
                Answer::Pods(vec![
                    pod_with("ns", "p", &[("intel.com/sriov_b", &["0000:3b:02.0"])]),
                    pod_with("ns2", "p", &[(RESOURCE, &["0000:3b:02.1"])]),
                ]),
            )]))
            .await;
            let d = allocator(dir.path(), &kubelet, true);
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
            let dir = four_free_vfs();
            let kubelet = FakeKubelet::start(HashMap::from([(
                V1_LIST,
                Answer::Status {
                    code: 7,
                    message: "access denied to pod resources".into(),
                    trailers_only: false,
                },
            )]))
            .await;
            let d = allocator(dir.path(), &kubelet, true);
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
            let err = allocator(dir.path(), &none, true)
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
    }
}
