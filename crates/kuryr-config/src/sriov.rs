//! The `[sriov]` mappings between physnets, PFs, subnets and device-plugin resources, read
//! once here for the controller (which VFs a pod requests, on which subnet) and the CNI
//! daemon (which PFs and which kubelet resource serve a physnet).
//!
//! `physical_device_mappings` is checked when `kuryr.conf` loads: an entry that is not
//! `physnet:interface` is a load error naming the section, option and value, never a
//! mapping silently dropped at the first SR-IOV ADD.

use std::collections::BTreeMap;

use crate::sections::SriovSection;
use crate::value::OptionValue;

/// Opaque integer resource of the pre-device-plugin SR-IOV convention; the physnet follows
/// the prefix (`pod.alpha.kubernetes.io/opaque-int-resource-sriov-vf-physnet2`).
pub const OPAQUE_RESOURCE_PREFIX: &str = "pod.alpha.kubernetes.io/opaque-int-resource-sriov-vf-";

/// Longest Linux interface name (`IFNAMSIZ` - 1).
const MAX_IFNAME: usize = 15;

/// `[sriov] physical_device_mappings` (`physnet:pf,physnet:pf2,...`): physnet -> its PF
/// netdevs, in the order listed (the daemon's preference order). A physnet may be listed
/// with several PFs; a PF listed twice for a physnet counts once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhysicalDeviceMappings(BTreeMap<String, Vec<String>>);

impl PhysicalDeviceMappings {
    /// The PFs of `physnet`, if it is mapped.
    pub fn pfs(&self, physnet: &str) -> Option<&[String]> {
        self.0.get(physnet).map(Vec::as_slice)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// (physnet, PFs), by physnet.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.0.iter().map(|(p, pfs)| (p.as_str(), pfs.as_slice()))
    }

    /// One `physnet:interface` entry, checked.
    fn parse_entry(entry: &str) -> Result<(&str, &str), String> {
        let (physnet, pf) = entry
            .split_once(':')
            .map(|(a, b)| (a.trim(), b.trim()))
            .filter(|(a, b)| !a.is_empty() && !b.is_empty())
            .ok_or_else(|| format!("entry {entry:?} is not physnet:interface"))?;
        let bad_name = pf.len() > MAX_IFNAME
            || pf == "."
            || pf == ".."
            || pf.contains(|c: char| c == '/' || c == ':' || c.is_whitespace());
        if bad_name {
            return Err(format!(
                "entry {entry:?}: {pf:?} (physnet {physnet}) is not an interface name"
            ));
        }
        Ok((physnet, pf))
    }
}

/// Tests and embedders that build the mappings in code.
impl From<BTreeMap<String, Vec<String>>> for PhysicalDeviceMappings {
    fn from(map: BTreeMap<String, Vec<String>>) -> Self {
        Self(map)
    }
}

impl OptionValue for PhysicalDeviceMappings {
    fn parse_option(raw: &str) -> Result<Self, String> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (physnet, pf) = Self::parse_entry(entry)?;
            let pfs = out.entry(physnet.to_owned()).or_default();
            if !pfs.iter().any(|p| p == pf) {
                pfs.push(pf.to_owned());
            }
        }
        Ok(Self(out))
    }
}

impl serde::Serialize for PhysicalDeviceMappings {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl SriovSection {
    /// The PFs whose VFs serve `physnet` (`physical_device_mappings`).
    pub fn pfs_of_physnet(&self, physnet: &str) -> Option<&[String]> {
        self.physical_device_mappings.pfs(physnet)
    }

    /// The physnet whose VFs serve `subnet_id`, if `default_physnet_subnets` names it.
    pub fn physnet_of_subnet(&self, subnet_id: &str) -> Option<&str> {
        self.default_physnet_subnets
            .iter()
            .find(|(_, s)| s.as_str() == subnet_id)
            .map(|(p, _)| p.as_str())
    }

    fn resource_prefix(&self) -> &str {
        self.device_plugin_resource_prefix.trim_end_matches('/')
    }

    /// The device-plugin resource (`intel.com/sriov_a`) whose VFs serve `physnet`:
    /// `<prefix>/<physnet_resource_mappings[physnet]>`, or `<prefix>/<physnet>` when no
    /// mapping is configured at all (upstream's rule).
    pub fn resource_of_physnet(&self, physnet: &str) -> Result<String, String> {
        let prefix = self.resource_prefix();
        if self.physnet_resource_mappings.is_empty() {
            return Ok(format!("{prefix}/{physnet}"));
        }
        self.physnet_resource_mappings
            .get(physnet)
            .map(|res| format!("{prefix}/{res}"))
            .ok_or_else(|| format!("physnet {physnet} has no resource in [sriov] physnet_resource_mappings"))
    }

    /// The physnet a pod's resource name requests, or None when it is no SR-IOV resource:
    /// an opaque integer resource ([`OPAQUE_RESOURCE_PREFIX`]`<physnet>`), or a device-plugin
    /// resource of `physnet_resource_mappings` (without mappings: `<prefix>/<physnet>` for
    /// the physnets of `default_physnet_subnets`).
    pub fn physnet_of_resource<'a>(&'a self, resource: &'a str) -> Option<&'a str> {
        if let Some(physnet) = resource.strip_prefix(OPAQUE_RESOURCE_PREFIX) {
            return Some(physnet);
        }
        let name = resource
            .strip_prefix(self.resource_prefix())
            .and_then(|r| r.strip_prefix('/'))?;
        if self.physnet_resource_mappings.is_empty() {
            self.default_physnet_subnets
                .get_key_value(name)
                .map(|(p, _)| p.as_str())
        } else {
            self.physnet_resource_mappings
                .iter()
                .find(|(_, res)| res.as_str() == name)
                .map(|(p, _)| p.as_str())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mappings(raw: &str) -> Result<PhysicalDeviceMappings, String> {
        PhysicalDeviceMappings::parse_option(raw)
    }

    #[test]
    fn physical_device_mappings_group_pfs_by_physnet_in_order() {
        let m =
            mappings("physnet1:ens1f0, physnet1 : ens1f1,physnet2:ens2f0,physnet1:ens1f0,").expect("valid");
        assert_eq!(
            m.pfs("physnet1"),
            Some(&["ens1f0".to_string(), "ens1f1".to_string()][..])
        );
        assert_eq!(m.pfs("physnet2"), Some(&["ens2f0".to_string()][..]));
        assert_eq!(m.pfs("physnet3"), None);
        assert!(mappings("").expect("empty").is_empty());
    }

    #[test]
    fn bad_physical_device_mappings_say_why() {
        assert_eq!(
            mappings("physnet1:ens1f0,ens1f1"),
            Err("entry \"ens1f1\" is not physnet:interface".into())
        );
        assert!(mappings(":ens1f0").is_err());
        assert!(mappings("physnet1:").is_err());
        for bad in ["p:../x", "p:..", "p:a/b", "p:a:b", "p:a-very-long-interface"] {
            let err = mappings(bad).expect_err(bad);
            assert!(err.contains("is not an interface name"), "{bad}: {err}");
        }
    }

    #[test]
    fn resources_map_both_ways_with_the_prefix() {
        let mut s = SriovSection {
            default_physnet_subnets: [("physnet2".to_string(), "sub-2".to_string())].into(),
            ..SriovSection::default()
        };
        // No resource mappings: resources are named after physnets.
        assert_eq!(
            s.resource_of_physnet("physnet1").as_deref(),
            Ok("intel.com/physnet1")
        );
        assert_eq!(s.physnet_of_resource("intel.com/physnet2"), Some("physnet2"));
        assert_eq!(s.physnet_of_resource("intel.com/other"), None);
        assert_eq!(s.physnet_of_resource("intel.comx/physnet2"), None);
        assert_eq!(
            s.physnet_of_resource("pod.alpha.kubernetes.io/opaque-int-resource-sriov-vf-physnet9"),
            Some("physnet9")
        );
        assert_eq!(s.physnet_of_subnet("sub-2"), Some("physnet2"));
        assert_eq!(s.physnet_of_subnet("sub-9"), None);
        // With mappings and a trailing slash on the prefix.
        s.device_plugin_resource_prefix = "example.org/".into();
        s.physnet_resource_mappings = [("physnet1".to_string(), "sriov_a".to_string())].into();
        assert_eq!(
            s.resource_of_physnet("physnet1").as_deref(),
            Ok("example.org/sriov_a")
        );
        assert_eq!(s.physnet_of_resource("example.org/sriov_a"), Some("physnet1"));
        assert_eq!(s.physnet_of_resource("example.org/physnet2"), None);
        let err = s.resource_of_physnet("physnet2").expect_err("unmapped");
        assert!(
            err.contains("physnet physnet2 has no resource in [sriov] physnet_resource_mappings"),
            "{err}"
        );
    }
}
