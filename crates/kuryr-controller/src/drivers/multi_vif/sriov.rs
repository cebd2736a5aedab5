//! `sriov`: pods requesting SR-IOV VFs get one `binding:vnic_type=direct` port per VF, on the
//! subnet `[sriov] default_physnet_subnets` maps the VF's physnet to. The CNI daemon moves the
//! allocated VF into the pod.
//!
//! Requests are read from container `resources.requests` (or `limits`, which Kubernetes copies
//! to requests for extended resources) in two forms:
//! - `pod.alpha.kubernetes.io/opaque-int-resource-sriov-vf-<physnet>` (the original multi-VIF design's opaque integer resource)
//! - device-plugin `<[sriov] device_plugin_resource_prefix>/<resource>`, the resource mapped to a
//!   physnet by `[sriov] physnet_resource_mappings` (`physnet:resource`; without mappings the
//!   resource is named after the physnet, as upstream).
//!
//! The mapping itself is kuryr-config's ([`SriovSection::physnet_of_resource`]), shared with the
//! CNI daemon.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kuryr_config::SriovSection;

use super::additional_subnets::refield;
use super::{MultiVifDriver, PlannedVif, PodNetworking, PortSource, VNIC_DIRECT};
use crate::drivers::subnets::SubnetCache;
use crate::error::Error;

pub const NAME: &str = "sriov";
/// More VFs than any NIC offers a pod: a typo, not a request.
const MAX_VFS: u32 = 64;

/// SR-IOV VFs the pod requests: (resource name, physnet) -> count, summed over containers.
pub fn requested_vfs(pod: &Pod, map: &SriovSection) -> Result<BTreeMap<(String, String), u32>, Error> {
    let mut out: BTreeMap<(String, String), u32> = BTreeMap::new();
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    for c in containers {
        let Some(res) = c.resources.as_ref() else { continue };
        let requests = res.requests.as_ref();
        let limits = res.limits.as_ref();
        // Requests win; a resource only in limits is requested at its limit.
        let mut merged: BTreeMap<&String, &str> = BTreeMap::new();
        for (k, v) in limits.into_iter().flatten() {
            merged.insert(k, v.0.as_str());
        }
        for (k, v) in requests.into_iter().flatten() {
            merged.insert(k, v.0.as_str());
        }
        for (resource, qty) in merged {
            let Some(physnet) = map.physnet_of_resource(resource) else {
                continue;
            };
            let field = format!("containers[{}].resources {resource}", c.name);
            if physnet.is_empty() {
                return Err(Error::invalid(field, "the resource names no physnet"));
            }
            let n: u32 = qty
                .trim()
                .parse()
                .map_err(|_| Error::invalid(&field, format!("{qty:?} is not a whole number of VFs")))?;
            let total = out.entry((resource.clone(), physnet.to_string())).or_default();
            *total = total.saturating_add(n);
            if *total > MAX_VFS {
                return Err(Error::invalid(
                    field,
                    format!("{total} VFs requested; at most {MAX_VFS}"),
                ));
            }
        }
    }
    out.retain(|_, n| *n > 0);
    Ok(out)
}

pub struct Sriov {
    map: SriovSection,
    subnets: SubnetCache,
}

impl Sriov {
    pub fn new(cfg: &SriovSection, subnets: SubnetCache) -> Self {
        Self {
            map: cfg.clone(),
            subnets,
        }
    }
}

#[async_trait]
impl MultiVifDriver for Sriov {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn plan(&self, net: &PodNetworking<'_>) -> Result<Vec<PlannedVif>, Error> {
        let mut out = vec![];
        for ((resource, physnet), count) in requested_vfs(net.pod, &self.map)? {
            let subnet = self.map.default_physnet_subnets.get(&physnet).ok_or_else(|| {
                Error::invalid(
                    format!("resource {resource}"),
                    format!("physnet {physnet} has no subnet in [sriov] default_physnet_subnets"),
                )
            })?;
            let network = self
                .subnets
                .network_of_subnet(&net.default.deployment, subnet)
                .await
                .map_err(|e| refield(e, &format!("[sriov] default_physnet_subnets {physnet}")))?;
            for _ in 0..count {
                out.push(PlannedVif {
                    driver: NAME,
                    ifname: None,
                    network: format!("sriov:{physnet}"),
                    source: PortSource::Create {
                        spec: net.spec_on(network.clone(), VNIC_DIRECT),
                        fixed_ips: vec![],
                        mac: None,
                        physnet: Some(physnet.clone()),
                    },
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(mappings: &[(&str, &str)]) -> SriovSection {
        let mut cfg = SriovSection::default();
        cfg.default_physnet_subnets
            .insert("physnet2".into(), "sub-2".into());
        cfg.default_physnet_subnets
            .insert("physnet3".into(), "sub-3".into());
        for (p, r) in mappings {
            cfg.physnet_resource_mappings.insert((*p).into(), (*r).into());
        }
        cfg
    }

    fn pod(resources: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "a", "resources": resources},
                {"name": "b", "resources": {"requests": {"cpu": "1"}}}
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn opaque_and_device_plugin_requests_are_counted() {
        let m = map(&[("physnet3", "sriov_a")]);
        let p = pod(json!({
            "requests": {"pod.alpha.kubernetes.io/opaque-int-resource-sriov-vf-physnet2": "2", "cpu": "1"},
            "limits": {"intel.com/sriov_a": "1", "intel.com/qat": "1"}
        }));
        let got = requested_vfs(&p, &m).unwrap();
        let want = BTreeMap::from([
            (
                (
                    format!("{}physnet2", kuryr_config::OPAQUE_RESOURCE_PREFIX),
                    "physnet2".to_string(),
                ),
                2,
            ),
            (("intel.com/sriov_a".to_string(), "physnet3".to_string()), 1),
        ]);
        assert_eq!(got, want);
        assert_eq!(m.physnet_of_subnet("sub-3"), Some("physnet3"));
    }

    #[test]
    fn without_mappings_resources_are_named_after_physnets() {
        let m = map(&[]);
        assert_eq!(m.physnet_of_resource("intel.com/physnet2"), Some("physnet2"));
        assert_eq!(m.physnet_of_resource("intel.com/other"), None);
    }

    #[test]
    fn bad_quantities_name_the_resource() {
        let m = map(&[]);
        let p = pod(json!({"requests": {"intel.com/physnet2": "1.5"}}));
        let e = requested_vfs(&p, &m).unwrap_err().to_string();
        assert!(
            e.contains("intel.com/physnet2") && e.contains("containers[a]"),
            "{e}"
        );
        let p = pod(json!({"requests": {"intel.com/physnet2": "1000"}}));
        assert!(requested_vfs(&p, &m).is_err());
        let p = pod(json!({"requests": {"intel.com/physnet2": "0"}}));
        assert!(requested_vfs(&p, &m).unwrap().is_empty());
    }
}
