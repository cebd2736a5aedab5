//! Well-known names shared with upstream kuryr-kubernetes (`kuryr_kubernetes/constants.py`)
//! plus the ones kuryr-rs adds. Upstream values are part of the drop-in contract: existing
//! objects carry them, so they must not change.

/// API group of the kuryr CRDs.
pub const GROUP: &str = "openstack.org";
/// Version of the kuryr CRDs.
pub const VERSION: &str = "v1";
/// `apiVersion` of the kuryr CRDs.
pub const API_VERSION: &str = "openstack.org/v1";
/// API group of NetworkAttachmentDefinition (Network Plumbing WG).
pub const NPWG_GROUP: &str = "k8s.cni.cncf.io";
/// `apiVersion` of NetworkAttachmentDefinition.
pub const NPWG_API_VERSION: &str = "k8s.cni.cncf.io/v1";
/// Prefix of kuryr's finalizers and labels.
pub const KURYR_FQDN: &str = "kuryr.openstack.org";

/// Interface name of the pod's default VIF.
pub const DEFAULT_IFNAME: &str = "eth0";
/// Default `[kubernetes] additional_ifname_prefix` (additional VIFs are `eth1`, `eth2`, ...).
pub const ADDITIONAL_IFNAME_PREFIX: &str = "eth";
/// os-vif plugin name kuryr uses for VIFs no os-vif plugin must plug (nested).
pub const OS_VIF_NOOP_PLUGIN: &str = "noop";

pub mod finalizers {
    /// On KuryrPort: Neutron ports still to release.
    pub const KURYRPORT: &str = "kuryr.openstack.org/kuryrport-finalizer";
    /// On Pod: its KuryrPort still exists.
    pub const POD: &str = "kuryr.openstack.org/pod-finalizer";
    /// On KuryrNetwork: the namespace's network, subnet and router interface still exist.
    pub const KURYRNETWORK: &str = "kuryrnetwork.finalizers.kuryr.openstack.org";
    /// On KuryrLoadBalancer (note upstream's plural "finalizers").
    pub const KURYRLOADBALANCER: &str = "kuryr.openstack.org/kuryrloadbalancer-finalizers";
    /// On Service.
    pub const SERVICE: &str = "kuryr.openstack.org/service-finalizer";
    /// On NetworkPolicy and KuryrNetworkPolicy.
    pub const NETWORKPOLICY: &str = "kuryr.openstack.org/networkpolicy-finalizer";
    /// kuryr-rs: on KuryrPortPool, the pool's Neutron ports still exist.
    pub const KURYRPORTPOOL: &str = "kuryr.openstack.org/kuryrportpool-finalizer";
}

pub mod labels {
    /// On KuryrPort: node of the pod, so each CNI daemon watches only its own ports.
    pub const NODE_NAME: &str = "kuryr.openstack.org/nodeName";
    /// kuryr-rs, on KuryrPortPool: node (bare metal) or trunk IP (nested) the pool serves.
    pub const POOL_HOST: &str = "kuryr.openstack.org/poolHost";
    /// kuryr-rs, on KuryrPortPool: OpenStack deployment of the pool
    /// (see `docs/architecture.md#several-openstack-deployments`).
    pub const POOL_DEPLOYMENT: &str = "kuryr.openstack.org/deployment";
}

pub mod annotations {
    /// Namespace: OpenStack project id for its resources (`annotation` project driver).
    pub const PROJECT: &str = "openstack.org/kuryr-project";
    /// Pod: JSON list of extra Neutron subnet ids, one VIF each (`additional_subnets` multi-VIF driver).
    pub const ADDITIONAL_SUBNETS: &str = "openstack.org/kuryr-additional-subnets";
    /// Pod: NADs to attach (`npwg_multiple_interfaces` multi-VIF driver).
    pub const NPWG_NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
    /// Pod: attachment results as reported to Multus-aware tools.
    pub const NPWG_NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
    /// NetworkAttachmentDefinition: `{"subnetId": "...", "driverType": "..."}`.
    pub const NAD_KURYR_CONFIG: &str = "openstack.org/kuryr-config";
    /// Key of the subnet id inside [`NAD_KURYR_CONFIG`].
    pub const NAD_SUBNET_ID: &str = "subnetId";
    /// Key of the VIF driver type inside [`NAD_KURYR_CONFIG`].
    pub const NAD_DRIVER_TYPE: &str = "driverType";
    /// Pod: JSON list of pre-created Neutron port ids to use (`specific ports`).
    pub const SPEC_PORTS: &str = "spec-ports";
    /// Pod (legacy, pre-CRD releases): the VIFs as an os-vif `PodState` primitive.
    pub const VIF: &str = "openstack.org/kuryr-vif";
    /// Pod/Namespace: label snapshot used by the policy handlers.
    pub const POD_LABEL: &str = "openstack.org/kuryr-pod-label";
    pub const NAMESPACE_LABEL: &str = "openstack.org/kuryr-namespace-label";
    /// KuryrPort (kuryr-rs): set by the vif handler when the pod of a KuryrPort deleted while it
    /// still ran is deleted too, so that the KuryrPort's finalizer is run again (its ports are
    /// released then, not while the pod used them).
    pub const POD_DELETED: &str = "kuryr.openstack.org/pod-deleted";
    /// Node: SR-IOV PCI information.
    pub const NODE_PCI_DEVICE_INFO: &str = "openstack.org/kuryr-pci-info";
    /// Service: Octavia listener timeouts.
    pub const LB_TIMEOUT_CLIENT_DATA: &str = "openstack.org/kuryr-timeout-client-data";
    pub const LB_TIMEOUT_MEMBER_DATA: &str = "openstack.org/kuryr-timeout-member-data";
    /// KuryrNetwork (kuryr-rs): the OpenStack deployment its network, subnet, router interface and
    /// security group live in, recorded before the first is created; absent (an object written
    /// by upstream) = the default deployment.
    pub const DEPLOYMENT: &str = "openstack.org/kuryr-deployment";
    /// KuryrNetworkPolicy (kuryr-rs): the `metadata.generation` of the NetworkPolicy it was last
    /// written from. Its spec alone does not show every change (a named port resolves per pod, so
    /// a rule on one is not in it): a new generation is written, which hands the change on.
    pub const POLICY_GENERATION: &str = "openstack.org/kuryr-policy-generation";
    /// KuryrProjectBinding (kuryr-rs): since when no namespace uses the binding (RFC 3339); the
    /// binding is deleted once `[pod_binding] unused_binding_retention` has passed.
    pub const UNUSED_SINCE: &str = "openstack.org/kuryr-unused-since";
    /// Any kuryr-watched object: bumped to force an event (upstream writes a fresh uuid).
    pub const KURYR_TRIGGER: &str = "KuryrTrigger";
}

/// Neutron `device_owner` values of ports kuryr creates.
pub mod device_owner {
    /// Bare-metal pod ports.
    pub const COMPUTE_KURYR: &str = "compute:kuryr";
    /// Nested (VLAN) pod ports attached to a trunk.
    pub const TRUNK_SUBPORT: &str = "trunk:subport";
}

/// Neutron names and tags kuryr-rs puts on what it creates.
pub mod neutron {
    /// Port name of a pooled, unused port (upstream's `KURYR_PORT_NAME`, so upstream's recovery
    /// and kuryr-rs' see the same ports).
    pub const POOL_PORT_NAME: &str = "kuryr-pool-port";
    /// Tag on every Neutron resource kuryr-rs creates, in addition to `[neutron_defaults]
    /// resource_tags`: lets a sweep find leaks after a crash.
    pub const TAG_MANAGED: &str = "kuryr-rs";
    /// Tag prefix naming the cluster (`kuryr-rs.cluster=<id>`), so two clusters sharing a
    /// project never collect each other's ports.
    pub const TAG_CLUSTER_PREFIX: &str = "kuryr-rs.cluster=";
    /// Tag prefix naming the KuryrPortPool that owns a pooled port (`kuryr-rs.pool=<name>`).
    pub const TAG_POOL_PREFIX: &str = "kuryr-rs.pool=";
    /// Tag prefix naming the pod (`kuryr-rs.pod=<namespace>/<name>`) a port is bound to.
    pub const TAG_POD_PREFIX: &str = "kuryr-rs.pod=";

    /// `kuryr-rs.cluster=<cluster>`.
    pub fn cluster_tag(cluster: &str) -> String {
        format!("{TAG_CLUSTER_PREFIX}{cluster}")
    }

    /// `kuryr-rs.pool=<pool>`.
    pub fn pool_tag(pool: &str) -> String {
        format!("{TAG_POOL_PREFIX}{pool}")
    }

    /// How a port's tags come to name `pool` alone: its tag to add (when missing) and the other
    /// pools' tags to remove, one tag at a time, so that no tag anyone else wrote meanwhile is
    /// lost. `None` when `tags` name `pool` alone already.
    pub fn pool_retag(tags: &[String], pool: &str) -> Option<PoolRetag> {
        let own = pool_tag(pool);
        let remove: Vec<String> = tags
            .iter()
            .filter(|t| t.starts_with(TAG_POOL_PREFIX) && **t != own)
            .cloned()
            .collect();
        let add = (!tags.contains(&own)).then_some(own);
        (add.is_some() || !remove.is_empty()).then_some(PoolRetag { add, remove })
    }

    /// See [`pool_retag`]. The tag is added before the others are removed: cut short, a port
    /// names two pools (which recovery and the recycle pass both retag) rather than none.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct PoolRetag {
        pub add: Option<String>,
        pub remove: Vec<String>,
    }

    /// Neutron refuses a tag, and a resource name, longer than this (in characters).
    pub const MAX_LEN: usize = 255;

    /// `kuryr-rs.pod=<namespace>/<name>`; one past [`MAX_LEN`] (a namespace and pod name may
    /// add up to 317 characters) is cut and ends in `~` and a stable hash of the whole, so it
    /// still names one pod and is found again from the same pod.
    pub fn pod_tag(namespace: &str, name: &str) -> String {
        let tag = format!("{TAG_POD_PREFIX}{namespace}/{name}");
        if tag.chars().count() <= MAX_LEN {
            return tag;
        }
        let hash = format!("~{:016x}", fnv1a(tag.as_bytes()));
        let kept: String = tag.chars().take(MAX_LEN - hash.len()).collect();
        kept + &hash
    }

    /// The name of a pod's port, `<namespace>/<name>`, cut to [`MAX_LEN`] as upstream cuts it.
    pub fn pod_port_name(namespace: &str, name: &str) -> String {
        format!("{namespace}/{name}").chars().take(MAX_LEN).collect()
    }

    /// 64-bit FNV-1a: tags outlive a build, so the hash must not change with the toolchain (as
    /// std's `DefaultHasher` may).
    pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }
}

/// Name of the `n`-th additional interface (`eth1`, ...) with the default prefix.
pub fn additional_ifname(prefix: &str, index: usize) -> String {
    format!("{prefix}{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_retagged_for_its_pool_only_when_it_names_another() {
        use neutron::{PoolRetag, pool_retag, pool_tag};
        let own = vec!["kuryr-rs".to_string(), pool_tag("a")];
        assert_eq!(pool_retag(&own, "a"), None);
        assert_eq!(
            pool_retag(&own, "b"),
            Some(PoolRetag {
                add: Some(pool_tag("b")),
                remove: vec![pool_tag("a")]
            })
        );
        let both = vec![pool_tag("a"), "x".to_string(), pool_tag("b")];
        assert_eq!(
            pool_retag(&both, "a"),
            Some(PoolRetag {
                add: None,
                remove: vec![pool_tag("b")]
            }),
            "two pool tags leave one"
        );
        assert_eq!(
            pool_retag(&["x".to_string()], "a"),
            Some(PoolRetag {
                add: Some(pool_tag("a")),
                remove: vec![]
            })
        );
    }

    #[test]
    fn upstream_names_are_unchanged() {
        assert_eq!(finalizers::KURYRPORT, format!("{KURYR_FQDN}/kuryrport-finalizer"));
        assert_eq!(finalizers::POD, format!("{KURYR_FQDN}/pod-finalizer"));
        assert_eq!(labels::NODE_NAME, format!("{KURYR_FQDN}/nodeName"));
        assert_eq!(API_VERSION, format!("{GROUP}/{VERSION}"));
    }

    #[test]
    fn neutron_tags() {
        assert_eq!(neutron::cluster_tag("c1"), "kuryr-rs.cluster=c1");
        assert_eq!(neutron::pod_tag("ns", "p"), "kuryr-rs.pod=ns/p");
        assert_eq!(neutron::pod_port_name("ns", "p"), "ns/p");
        assert_eq!(additional_ifname(ADDITIONAL_IFNAME_PREFIX, 1), "eth1");
    }

    #[test]
    fn a_long_pod_name_gives_a_tag_and_port_name_neutron_takes_and_tells_apart() {
        let ns = "n".repeat(63);
        let (a, b) = ("p".repeat(252) + "a", "p".repeat(252) + "b");
        let (ta, tb) = (neutron::pod_tag(&ns, &a), neutron::pod_tag(&ns, &b));
        assert_eq!(ta.chars().count(), neutron::MAX_LEN);
        assert!(ta.starts_with(&format!("kuryr-rs.pod={ns}/ppp")), "{ta}");
        assert_ne!(ta, tb, "two pods, two tags");
        assert_eq!(ta, neutron::pod_tag(&ns, &a), "the same pod, the same tag");
        // The hash is FNV-1a of the whole tag: fixed, whatever the toolchain.
        assert_eq!(neutron::fnv1a(b"kuryr-rs"), 0xe791_40d6_a806_1112);
        assert_eq!(neutron::pod_port_name(&ns, &a).chars().count(), neutron::MAX_LEN);
        // At the limit nothing is cut.
        let fits = "p".repeat(neutron::MAX_LEN - "kuryr-rs.pod=ns/".len());
        assert_eq!(neutron::pod_tag("ns", &fits), format!("kuryr-rs.pod=ns/{fits}"));
    }
}
