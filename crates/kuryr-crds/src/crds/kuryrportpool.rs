//! `KuryrPortPool` (`kuryrportpools.openstack.org`, short `kpp`), new in kuryr-rs: one warm pool
//! of pre-created Neutron ports, so that the controller rebuilds its pools from the API after a
//! restart instead of guessing from Neutron. Pools live in the controller's namespace; the name
//! is derived from the [`PoolKey`] ([`PoolKey::resource_name`]) and `spec.key` carries the full
//! key, so a name collision is detectable.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::names;

// kube's printcolumn(...) attributes repeat keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "openstack.org",
    version = "v1",
    kind = "KuryrPortPool",
    plural = "kuryrportpools",
    singular = "kuryrportpool",
    shortname = "kpp",
    namespaced,
    status = "KuryrPortPoolStatus",
    derive = "PartialEq",
    doc = "kuryr-rs: a pool of pre-created Neutron ports for one (deployment, host or trunk, project, network, subnet, security groups) key.",
    printcolumn(
        name = "Host",
        type_ = "string",
        description = "Node (bare metal) the ports are bound to",
        json_path = ".spec.key.host"
    ),
    printcolumn(
        name = "Trunk-IP",
        type_ = "string",
        description = "IP of the VM whose trunk carries the ports (nested)",
        json_path = ".spec.key.trunkIp"
    ),
    printcolumn(
        name = "Subnet",
        type_ = "string",
        description = "Neutron subnet of the ports",
        json_path = ".spec.key.subnetId",
        priority = 1
    ),
    printcolumn(
        name = "Available",
        type_ = "integer",
        description = "Ports ready for pods",
        json_path = ".status.availableCount"
    ),
    printcolumn(
        name = "Recyclable",
        type_ = "integer",
        description = "Ports released by pods, awaiting cleanup",
        json_path = ".status.recyclableCount"
    ),
    printcolumn(
        name = "VIF-Driver",
        type_ = "string",
        description = "Pod VIF driver whose ports the pool holds",
        json_path = ".spec.vifDriver",
        priority = 1
    ),
    printcolumn(name = "Min", type_ = "integer", json_path = ".spec.min"),
    printcolumn(
        name = "Max",
        type_ = "integer",
        description = "0 means unlimited",
        json_path = ".spec.max"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct KuryrPortPoolSpec {
    pub key: PoolKey,
    /// Refill when fewer ports than this are available.
    pub min: u32,
    /// Ports created per refill (one bulk request).
    pub batch: u32,
    /// Recycled ports beyond this many are deleted; 0 disables the limit (upstream semantics).
    pub max: u32,
    /// Available ports idle longer than this are deleted while the pool stays above `min`;
    /// absent or 0 disables the TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// The pod VIF driver whose ports the pool holds (`neutron-vif`, `nested-vlan`,
    /// `nested-macvlan`): `multi_pool` may run two nested drivers, whose keys look alike.
    /// Absent in objects written before kuryr-rs recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vif_driver: Option<String>,
}

/// What makes ports interchangeable. Exactly one of `host` (bare metal) and `trunkPortId`
/// (nested) is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolKey {
    /// OpenStack deployment (`default` for `[neutron]`).
    pub deployment: String,
    /// Bare metal: node name, the ports' `binding:host_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Nested: the VM's trunk parent port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trunk_port_id: Option<String>,
    /// Nested: the VM's IP on the trunk parent port (upstream keys pools on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trunk_ip: Option<String>,
    pub project_id: String,
    pub network_id: String,
    pub subnet_id: String,
    /// Sorted, without duplicates (see `PoolKey::normalize`).
    #[serde(default)]
    pub security_group_ids: Vec<String>,
}

/// A [`PoolKey`] that cannot name a pool.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PoolKeyError {
    #[error("pool key: exactly one of host and trunkPortId must be set")]
    HostOrTrunk,
    #[error("pool key: {0} must not be empty")]
    Empty(&'static str),
    #[error("pool key: securityGroupIds must be sorted and unique")]
    UnsortedSecurityGroups,
}

const NAME_PREFIX: &str = "kpp-";
const NAME_READABLE_MAX: usize = 30;

impl PoolKey {
    /// Key of a bare-metal pool.
    pub fn host(
        deployment: impl Into<String>,
        host: impl Into<String>,
        project_id: impl Into<String>,
        network_id: impl Into<String>,
        subnet_id: impl Into<String>,
        security_group_ids: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let mut key = Self {
            deployment: deployment.into(),
            host: Some(host.into()),
            trunk_port_id: None,
            trunk_ip: None,
            project_id: project_id.into(),
            network_id: network_id.into(),
            subnet_id: subnet_id.into(),
            security_group_ids: security_group_ids.into_iter().map(Into::into).collect(),
        };
        key.normalize();
        key
    }

    /// Key of a nested (trunk) pool.
    pub fn nested(
        deployment: impl Into<String>,
        trunk_port_id: impl Into<String>,
        trunk_ip: impl Into<String>,
        project_id: impl Into<String>,
        network_id: impl Into<String>,
        subnet_id: impl Into<String>,
        security_group_ids: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let mut key = Self {
            deployment: deployment.into(),
            host: None,
            trunk_port_id: Some(trunk_port_id.into()),
            trunk_ip: Some(trunk_ip.into()),
            project_id: project_id.into(),
            network_id: network_id.into(),
            subnet_id: subnet_id.into(),
            security_group_ids: security_group_ids.into_iter().map(Into::into).collect(),
        };
        key.normalize();
        key
    }

    /// Sorts and deduplicates the security groups: the same set must give the same pool.
    pub fn normalize(&mut self) {
        self.security_group_ids.sort();
        self.security_group_ids.dedup();
    }

    pub fn is_nested(&self) -> bool {
        self.trunk_port_id.is_some()
    }

    pub fn validate(&self) -> Result<(), PoolKeyError> {
        if self.host.is_some() == self.trunk_port_id.is_some() {
            return Err(PoolKeyError::HostOrTrunk);
        }
        for (field, value) in [
            ("deployment", Some(&self.deployment)),
            ("host", self.host.as_ref()),
            ("trunkPortId", self.trunk_port_id.as_ref()),
            ("projectId", Some(&self.project_id)),
            ("networkId", Some(&self.network_id)),
            ("subnetId", Some(&self.subnet_id)),
        ] {
            if value.is_some_and(|v| v.is_empty()) {
                return Err(PoolKeyError::Empty(field));
            }
        }
        if self.security_group_ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(PoolKeyError::UnsortedSecurityGroups);
        }
        Ok(())
    }

    /// Where the ports live: the host, else the trunk IP, else the trunk port id.
    pub fn location(&self) -> &str {
        self.host
            .as_deref()
            .or(self.trunk_ip.as_deref())
            .or(self.trunk_port_id.as_deref())
            .unwrap_or_default()
    }

    /// Stable 64-bit FNV-1a over every key field; part of the object name, so it must never
    /// change between releases.
    pub fn fingerprint(&self) -> u64 {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut hash = OFFSET;
        let mut feed = |s: &str| {
            // A 0xff separator cannot occur in UTF-8, so field boundaries are unambiguous.
            for b in s.as_bytes().iter().chain(std::iter::once(&0xff)) {
                hash ^= u64::from(*b);
                hash = hash.wrapping_mul(PRIME);
            }
        };
        feed("v1");
        feed(&self.deployment);
        feed(self.host.as_deref().unwrap_or("\u{0}"));
        feed(self.trunk_port_id.as_deref().unwrap_or("\u{0}"));
        feed(self.trunk_ip.as_deref().unwrap_or("\u{0}"));
        feed(&self.project_id);
        feed(&self.network_id);
        feed(&self.subnet_id);
        for sg in &self.security_group_ids {
            feed(sg);
        }
        hash
    }

    /// Object name: `kpp-<location>-<fingerprint>`, a valid DNS-1123 label (at most 51
    /// characters) whatever the host or IP looks like.
    pub fn resource_name(&self) -> String {
        let readable = sanitize(self.location(), NAME_READABLE_MAX);
        if readable.is_empty() {
            format!("{NAME_PREFIX}{:016x}", self.fingerprint())
        } else {
            format!("{NAME_PREFIX}{readable}-{:016x}", self.fingerprint())
        }
    }
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}/{}",
            self.deployment,
            self.location(),
            self.project_id,
            self.subnet_id,
            self.security_group_ids.join(",")
        )
    }
}

/// Lower-case, `[a-z0-9-]` only, no leading/trailing `-`, at most `max` characters.
fn sanitize(s: &str, max: usize) -> String {
    let mapped: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(max)
        .collect();
    mapped.trim_matches('-').to_owned()
}

/// A port in the pool, with what the controller needs to hand it to a pod without asking
/// Neutron (the network/subnet details come from the subnet cache).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolPort {
    pub port_id: String,
    pub mac_address: String,
    #[serde(default)]
    pub fixed_ips: Vec<PoolFixedIp>,
    /// Nested: VLAN id of the subport on the trunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<u16>,
    /// When the port entered this list (TTL and recycling age).
    pub since: Time,
    /// Recyclable ports: `namespace/name` of the pod that released it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_by: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolFixedIp {
    pub subnet_id: String,
    pub ip_address: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KuryrPortPoolStatus {
    /// Ready for pods.
    #[serde(default)]
    pub available: Vec<PoolPort>,
    /// Released by pods; need their security groups and name reset before reuse.
    #[serde(default)]
    pub recyclable: Vec<PoolPort>,
    /// `available.len()`, for `kubectl get` (printer columns cannot count).
    #[serde(default)]
    pub available_count: u32,
    /// `recyclable.len()`.
    #[serde(default)]
    pub recyclable_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refill_time: Option<Time>,
    /// Last refill/recycle failure; cleared by the next success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl KuryrPortPoolStatus {
    /// Recomputes the counters from the lists; call before every status write.
    pub fn update_counts(&mut self) {
        self.available_count = u32::try_from(self.available.len()).unwrap_or(u32::MAX);
        self.recyclable_count = u32::try_from(self.recyclable.len()).unwrap_or(u32::MAX);
    }

    /// Every port id the pool owns (for leak sweeps and restart recovery).
    pub fn port_ids(&self) -> impl Iterator<Item = &str> {
        self.available
            .iter()
            .chain(&self.recyclable)
            .map(|p| p.port_id.as_str())
    }
}

impl KuryrPortPool {
    /// A new pool object for `key` in `namespace`, with its name, labels and finalizer set.
    pub fn for_key(
        namespace: &str,
        key: PoolKey,
        min: u32,
        batch: u32,
        max: u32,
        ttl_seconds: Option<u64>,
    ) -> Result<Self, PoolKeyError> {
        key.validate()?;
        let labels = [
            (names::labels::POOL_HOST.to_owned(), sanitize(key.location(), 63)),
            (
                names::labels::POOL_DEPLOYMENT.to_owned(),
                sanitize(&key.deployment, 63),
            ),
        ]
        .into_iter()
        .collect();
        let metadata = ObjectMeta {
            name: Some(key.resource_name()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            finalizers: Some(vec![names::finalizers::KURYRPORTPOOL.to_owned()]),
            ..ObjectMeta::default()
        };
        Ok(Self {
            metadata,
            spec: KuryrPortPoolSpec {
                key,
                min,
                batch,
                max,
                ttl_seconds,
                vif_driver: None,
            },
            status: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PoolKey {
        PoolKey::host(
            "default",
            "k8s-node-1",
            "proj",
            "net",
            "sub",
            ["sg-b", "sg-a", "sg-b"],
        )
    }

    #[test]
    fn security_groups_are_normalized() {
        assert_eq!(key().security_group_ids, vec!["sg-a", "sg-b"]);
        assert_eq!(key().validate(), Ok(()));
        let mut k = key();
        k.security_group_ids = vec!["b".into(), "a".into()];
        assert_eq!(k.validate(), Err(PoolKeyError::UnsortedSecurityGroups));
    }

    #[test]
    fn host_xor_trunk() {
        let mut k = key();
        k.trunk_port_id = Some("t".into());
        assert_eq!(k.validate(), Err(PoolKeyError::HostOrTrunk));
        k.host = None;
        k.trunk_port_id = None;
        assert_eq!(k.validate(), Err(PoolKeyError::HostOrTrunk));
        let mut k = key();
        k.subnet_id.clear();
        assert_eq!(k.validate(), Err(PoolKeyError::Empty("subnetId")));
    }

    #[test]
    fn name_is_stable_and_distinguishes_keys() {
        let name = key().resource_name();
        // Pinned: changing the derivation would orphan every existing pool object.
        assert_eq!(name, format!("kpp-k8s-node-1-{:016x}", key().fingerprint()));
        assert_eq!(key().fingerprint(), 0x9159_ed22_76d0_690b);
        let mut other = key();
        other.security_group_ids.pop();
        assert_ne!(other.resource_name(), name);
        let mut other = key();
        other.deployment = "east".into();
        assert_ne!(other.resource_name(), name);
    }

    #[test]
    fn nested_ipv6_name_is_a_dns_label() {
        let k = PoolKey::nested(
            "default",
            "trunk-port",
            "FD00:0:0:0:0:0:0:1234",
            "p",
            "n",
            "s",
            Vec::<String>::new(),
        );
        let name = k.resource_name();
        assert!(name.len() <= 63, "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{name}"
        );
        assert!(name.starts_with("kpp-fd00-0-0"), "{name}");
    }

    #[test]
    fn for_key_sets_name_labels_finalizer() -> Result<(), PoolKeyError> {
        let pool = KuryrPortPool::for_key("kuryr", key(), 5, 10, 0, None)?;
        assert_eq!(pool.metadata.name, Some(key().resource_name()));
        assert_eq!(
            pool.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(names::labels::POOL_HOST))
                .map(String::as_str),
            Some("k8s-node-1")
        );
        assert_eq!(
            pool.metadata.finalizers,
            Some(vec![names::finalizers::KURYRPORTPOOL.to_owned()])
        );
        let mut bad = key();
        bad.host = None;
        assert!(KuryrPortPool::for_key("kuryr", bad, 5, 10, 0, None).is_err());
        Ok(())
    }
}
