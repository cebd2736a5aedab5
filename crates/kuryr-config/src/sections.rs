//! Typed sections of `kuryr.conf`. Each option is declared once, in a `config_section!`
//! block: name (= field name), type and upstream default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;

use crate::error::InvalidValue;
use crate::ini::Ini;
use crate::sriov::PhysicalDeviceMappings;
use crate::value::{OptionValue, Secret, choice_enum};

/// Declares a section struct: one line per option, `name: Type = default`.
/// Generates the struct, its `Default` (the upstream defaults), the list of option names,
/// and `from_ini`, which reads each option with `[DEFAULT]` fallback.
macro_rules! config_section {
    (
        $(#[$smeta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $default:expr ),+ $(,)?
        }
    ) => {
        $(#[$smeta])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )+
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $( $field: $default, )+ }
            }
        }

        impl $name {
            /// The option names of this section, as written in `kuryr.conf`.
            pub const OPTIONS: &'static [&'static str] = &[$(stringify!($field)),+];

            /// Reads the section `section` of `ini` (falling back to `[DEFAULT]`); options
            /// that are not set keep their default, bad values are appended to `errors`.
            pub fn from_ini(ini: &Ini, section: &str, errors: &mut Vec<InvalidValue>) -> Self {
                let mut this = Self::default();
                $(
                    if let Some(raw) = ini.lookup(section, stringify!($field)) {
                        match <$ty as OptionValue>::parse_option(&raw.value) {
                            Ok(v) => this.$field = v,
                            Err(expected) => errors.push(InvalidValue {
                                section: section.to_owned(),
                                option: stringify!($field).to_owned(),
                                value: raw.value.clone(),
                                expected,
                                origin: raw.origin.clone(),
                            }),
                        }
                    }
                )+
                this
            }
        }
    };
}

fn s(v: &str) -> String {
    v.to_owned()
}

fn list(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_owned()).collect()
}

// ---------------------------------------------------------------------------------------
// Driver and other enumerated names (the spellings upstream registers as entry points).

choice_enum! {
    /// `[binding] ovs_plug_mode` (kuryr-rs): how the CNI daemon plugs VIFOpenVSwitch VIFs.
    pub enum OvsPlugMode {
        /// veth on the OVS bridge with Neutron's external-ids (what the OVS agent expects).
        Ovs = "ovs",
        /// veth on a Linux bridge named like the VIF's OVS bridge (hosts without OVS; no
        /// agent flows or security groups apply).
        LinuxBridge = "linux_bridge",
    }
}

choice_enum! {
    /// `[binding] ovs_datapath_type` (kuryr-rs): datapath of an OVS bridge the daemon creates.
    pub enum OvsDatapathType {
        System = "system",
        Netdev = "netdev",
    }
}

choice_enum! {
    /// `[binding] pod_tx_checksum_offload` (kuryr-rs): TX checksum offload of the pod end of an
    /// OVS-bound veth.
    pub enum PodTxChecksumOffload {
        /// Off when the bridge uses the userspace (netdev) datapath, which forwards the partial
        /// checksums a veth leaves to "hardware"; left as the kernel set it otherwise.
        Auto = "auto",
        /// Always off (datapaths the daemon cannot recognise that need it too).
        Off = "off",
        /// Never touched.
        On = "on",
    }
}

choice_enum! {
    /// `[kubernetes] pod_vif_driver`
    pub enum PodVifDriver {
        NeutronVif = "neutron-vif",
        NestedVlan = "nested-vlan",
        NestedMacvlan = "nested-macvlan",
        NestedDpdk = "nested-dpdk",
    }
}

choice_enum! {
    /// `[kubernetes] vif_pool_driver` and the values of `[vif_pool] vif_pool_mapping`.
    pub enum VifPoolDriver {
        Noop = "noop",
        Neutron = "neutron",
        Nested = "nested",
        MultiPool = "multi_pool",
    }
}

choice_enum! {
    /// `[kubernetes] *_project_driver`
    pub enum ProjectDriver {
        Default = "default",
        Annotation = "annotation",
    }
}

choice_enum! {
    /// `[kubernetes] pod_subnets_driver`
    pub enum PodSubnetsDriver {
        Default = "default",
        Namespace = "namespace",
    }
}

choice_enum! {
    /// `[kubernetes] service_subnets_driver`
    pub enum ServiceSubnetsDriver {
        Default = "default",
    }
}

choice_enum! {
    /// `[kubernetes] pod_security_groups_driver` / `service_security_groups_driver`
    pub enum SecurityGroupsDriver {
        Default = "default",
        Policy = "policy",
        /// A security group per namespace admitting traffic from the same namespace.
        Namespace = "namespace",
    }
}

choice_enum! {
    /// `[kubernetes] multi_vif_drivers` items.
    pub enum MultiVifDriver {
        Noop = "noop",
        NpwgMultipleInterfaces = "npwg_multiple_interfaces",
        Sriov = "sriov",
        /// kuryr-rs: `openstack.org/kuryr-additional-subnets` pod annotation.
        AdditionalSubnets = "additional_subnets",
        /// kuryr-rs: `spec-ports` pod annotation (pre-created ports).
        SpecificPorts = "specific_ports",
    }
}

choice_enum! {
    /// `[kubernetes] nodes_subnets_driver`
    pub enum NodesSubnetsDriver {
        Config = "config",
        Openshift = "openshift",
    }
}

choice_enum! {
    /// `[kubernetes] enabled_handlers` items (upstream's handler entry points).
    pub enum Handler {
        Vif = "vif",
        Endpoints = "endpoints",
        Service = "service",
        KuryrLoadBalancer = "kuryrloadbalancer",
        KuryrPort = "kuryrport",
        KuryrNetwork = "kuryrnetwork",
        KuryrNetworkPopulation = "kuryrnetwork_population",
        KuryrNetworkPolicy = "kuryrnetworkpolicy",
        Namespace = "namespace",
        Policy = "policy",
        PodLabel = "pod_label",
        OpenshiftMachine = "openshift_machine",
        /// Pre-Victoria names, still accepted in old configs.
        Lb = "lb",
        LbaasSpec = "lbaasspec",
    }
}

choice_enum! {
    /// `[octavia_defaults] member_mode`
    pub enum MemberMode {
        L2 = "L2",
        L3 = "L3",
    }
}

choice_enum! {
    /// `[octavia_defaults] sg_mode`
    pub enum SgMode {
        Create = "create",
        Update = "update",
    }
}

choice_enum! {
    /// `[octavia_defaults] lb_algorithm`
    pub enum LbAlgorithm {
        RoundRobin = "ROUND_ROBIN",
        LeastConnections = "LEAST_CONNECTIONS",
        SourceIp = "SOURCE_IP",
        SourceIpPort = "SOURCE_IP_PORT",
    }
}

choice_enum! {
    /// `[neutron] auth_type`: the keystoneauth plugins kuryr-rs implements.
    pub enum AuthType {
        Password = "password",
        V3Password = "v3password",
        V3ApplicationCredential = "v3applicationcredential",
        /// Neutron with `auth_strategy = noauth`.
        Noauth = "noauth",
        None = "none",
    }
}

choice_enum! {
    /// `[neutron] interface`: which catalog endpoint to use.
    pub enum Interface {
        Public = "public",
        Internal = "internal",
        Admin = "admin",
    }
}

choice_enum! {
    /// `[pod_binding] filters` items: which deployments may receive a tenant.
    pub enum BindingFilter {
        /// Passes every enabled deployment.
        All = "all",
        /// Passes deployments whose `availability_zone` matches the requested one.
        AvailabilityZone = "availability_zone",
        /// Passes deployments whose `resource_affinity` has the requested key:value.
        ResourceAffinity = "resource_affinity",
        /// Drops deployments whose measured usage is above `usage_threshold`.
        UsageThreshold = "usage_threshold",
    }
}

choice_enum! {
    /// `[pod_binding] weighers` items: how the remaining deployments are ranked.
    pub enum BindingWeigher {
        /// Earlier declared deployments weigh more (upstream "pod creation time").
        CreationOrder = "creation_order",
        /// More idle capacity weighs more.
        IdleCapacity = "idle_capacity",
    }
}

// ---------------------------------------------------------------------------------------
// Sections.

config_section! {
    /// `[DEFAULT]`: kuryr-lib core options and the oslo.log options kuryr deployments set.
    pub struct DefaultSection {
        debug: bool = false,
        use_stderr: bool = false,
        use_json: bool = false,
        use_syslog: bool = false,
        log_file: Option<String> = None,
        log_dir: Option<String> = None,
        log_config_append: Option<String> = None,
        bindir: String = s("/usr/libexec/kuryr"),
        subnetpool_name_prefix: String = s("kuryrPool"),
        deployment_type: String = s("baremetal"),
        pybasedir: Option<String> = None,
    }
}

config_section! {
    /// `[kubernetes]`
    pub struct KubernetesSection {
        api_root: String = s("https://localhost:6443"),
        ssl_client_crt_file: Option<String> = None,
        ssl_client_key_file: Option<String> = None,
        ssl_ca_crt_file: Option<String> = Some(s("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")),
        /// Unset (kuryr-rs): verify, with `ssl_ca_crt_file` when it exists, else the system roots;
        /// `False` turns verification off as upstream's default did.
        ssl_verify_server_crt: Option<bool> = None,
        token_file: Option<String> = Some(s("/var/run/secrets/kubernetes.io/serviceaccount/token")),
        pod_project_driver: ProjectDriver = ProjectDriver::Default,
        service_project_driver: ProjectDriver = ProjectDriver::Default,
        namespace_project_driver: ProjectDriver = ProjectDriver::Default,
        network_policy_project_driver: ProjectDriver = ProjectDriver::Default,
        pod_subnets_driver: PodSubnetsDriver = PodSubnetsDriver::Default,
        service_subnets_driver: ServiceSubnetsDriver = ServiceSubnetsDriver::Default,
        pod_security_groups_driver: SecurityGroupsDriver = SecurityGroupsDriver::Default,
        service_security_groups_driver: SecurityGroupsDriver = SecurityGroupsDriver::Default,
        pod_vif_driver: PodVifDriver = PodVifDriver::NeutronVif,
        vif_pool_driver: VifPoolDriver = VifPoolDriver::Noop,
        nodes_subnets_driver: NodesSubnetsDriver = NodesSubnetsDriver::Config,
        endpoints_lbaas_driver: String = s("lbaasv2"),
        endpoints_driver_octavia_provider: String = s("default"),
        service_public_ip_driver: String = s("neutron_floating_ip"),
        network_policy_driver: String = s("default"),
        multi_vif_drivers: Vec<MultiVifDriver> = vec![MultiVifDriver::Noop],
        additional_ifname_prefix: String = s("eth"),
        port_debug: bool = false,
        enable_manager: bool = false,
        /// Seconds.
        watch_retry_timeout: u64 = 60,
        /// Seconds.
        watch_connection_timeout: u64 = 30,
        /// Seconds.
        watch_read_timeout: u64 = 60,
        /// Seconds between full resyncs of the watched resources.
        watch_reconcile_period: u64 = 120,
        /// Handler names; validated by the controller against its handler registry so that a
        /// library user's own handlers can be enabled too (upstream names: see [`Handler`]).
        enabled_handlers: Vec<String> = list(&["vif", "endpoints", "service", "kuryrloadbalancer", "kuryrport"]),
        use_events: bool = true,
        controller_ha: bool = false,
        controller_ha_elector_port: u16 = 16401,
        /// kuryr-rs: identifies this cluster in the tags of every Neutron resource it creates, so
        /// clusters sharing an OpenStack project never collect each other's ports.
        cluster_id: String = s("kubernetes"),
        /// kuryr-rs: namespace of the controller's Lease and KuryrPortPool objects.
        controller_namespace: String = s("kube-system"),
        /// kuryr-rs: Kubernetes API requests in flight at once (watches count only until their
        /// response starts). The client speaks HTTP/1.1, one connection per request in flight:
        /// unbounded, a burst of pods opened a connection (and a TLS handshake) per pod.
        max_concurrent_requests: NonZeroU32 = NonZeroU32::MIN.saturating_add(31),
    }
}

config_section! {
    /// `[vif_pool]`
    pub struct VifPoolSection {
        /// Maximum ports per pool, 0 = unlimited (enforced on recycle, like upstream).
        ports_pool_max: u32 = 0,
        ports_pool_min: u32 = 5,
        ports_pool_batch: NonZeroU32 = NonZeroU32::MIN.saturating_add(9),
        /// Seconds between pool maintenance passes.
        ports_pool_update_frequency: u64 = 20,
        /// Deprecated upstream (pool driver -> pod VIF driver); use `vif_pool_mapping`.
        pools_vif_drivers: BTreeMap<VifPoolDriver, PodVifDriver> = BTreeMap::new(),
        /// Pod VIF driver name -> pool driver name.
        vif_pool_mapping: BTreeMap<PodVifDriver, VifPoolDriver> = BTreeMap::new(),
        /// kuryr-rs: seconds an unused pooled port may live before it is deleted; 0 = forever.
        ports_pool_ttl: u64 = 0,
        /// kuryr-rs: bulk port creations in flight at once (upstream hard-codes 20).
        ports_pool_max_concurrent_populate: NonZeroU32 = NonZeroU32::MIN.saturating_add(19),
    }
}

config_section! {
    /// `[neutron_defaults]`
    pub struct NeutronDefaultsSection {
        project: Option<String> = None,
        pod_subnet: Option<String> = None,
        /// kuryr-rs: every pod subnet of the `default` subnets driver, all on one network (dual
        /// stack: an IPv4 and an IPv6 subnet; each pod gets an address from each). Overrides
        /// `pod_subnet` when set.
        pod_subnets: Vec<String> = Vec::new(),
        pod_security_groups: Vec<String> = Vec::new(),
        ovs_bridge: String = s("br-int"),
        service_subnet: Option<String> = None,
        external_svc_net: Option<String> = None,
        external_svc_subnet: Option<String> = None,
        /// 0 = use the MTU of the Neutron network.
        network_device_mtu: u32 = 0,
        /// Seconds.
        lbaas_activation_timeout: u64 = 300,
        /// driverType -> subnet id.
        subnet_mapping: BTreeMap<String, String> = BTreeMap::new(),
        resource_tags: Vec<String> = Vec::new(),
    }
}

/// The longest listener timeout Octavia takes, in milliseconds (24 h): its API refuses more.
pub const OCTAVIA_MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

config_section! {
    /// `[octavia_defaults]`
    pub struct OctaviaDefaultsSection {
        member_mode: MemberMode = MemberMode::L3,
        sg_mode: SgMode = SgMode::Update,
        enforce_sg_rules: bool = true,
        lb_algorithm: LbAlgorithm = LbAlgorithm::RoundRobin,
        /// Milliseconds, 0 = Octavia's default.
        timeout_client_data: u64 = 0,
        /// Milliseconds, 0 = Octavia's default.
        timeout_member_data: u64 = 0,
        /// kuryr-rs: seconds between checks of every load balancer against Octavia (repair of what was
        /// changed or deleted by hand, replacement of ERROR ones, orphan sweep); upstream's fixed 600.
        reconcile_period: u64 = 600,
    }
}

config_section! {
    /// `[cache_defaults]`
    pub struct CacheDefaultsSection {
        enabled: bool = true,
        backend: String = s("dogpile.cache.memory"),
    }
}

config_section! {
    /// `[subnet_caching]`, `[nodes_caching]` and `[node_driver_caching]`.
    pub struct CachingSection {
        caching: bool = true,
        /// Seconds.
        cache_time: u64 = 3600,
    }
}

config_section! {
    /// `[pod_vif_nested]`
    pub struct PodVifNestedSection {
        worker_nodes_subnets: Vec<String> = Vec::new(),
        /// Deprecated singular form; folded into `worker_nodes_subnets` on load.
        worker_nodes_subnet: Option<String> = None,
        rev_update_attempts: u32 = 3,
    }
}

config_section! {
    /// `[binding]` (kuryr-lib)
    pub struct BindingSection {
        veth_dst_prefix: String = s("eth"),
        default_driver: String = s("kuryr.lib.binding.drivers.veth"),
        /// Old kuryr-lib name of `default_driver` (still in upstream's nested docs);
        /// folded into `default_driver` on load when that is not set.
        driver: Option<String> = None,
        enabled_drivers: Vec<String> = list(&["kuryr.lib.binding.drivers.veth"]),
        /// Host interface the nested drivers put VLAN/macvlan devices on.
        link_iface: String = String::new(),
        /// kuryr-rs: OVSDB the CNI daemon talks to (`unix:/path/db.sock` or `tcp:host:port`);
        /// unset = ovs-vsctl's default socket (`$OVS_RUNDIR/db.sock`, else
        /// `/var/run/openvswitch/db.sock`).
        ovs_db: Option<String> = None,
        /// kuryr-rs: datapath of an OVS bridge the daemon has to create itself.
        ovs_datapath_type: OvsDatapathType = OvsDatapathType::System,
        /// kuryr-rs: how VIFOpenVSwitch VIFs are plugged on this node.
        ovs_plug_mode: OvsPlugMode = OvsPlugMode::Ovs,
        /// kuryr-rs: TX checksum offload of the pod end of OVS-bound veths.
        pod_tx_checksum_offload: PodTxChecksumOffload = PodTxChecksumOffload::Auto,
    }
}

config_section! {
    /// `[namespace_subnet]`
    pub struct NamespaceSubnetSection {
        pod_router: Option<String> = None,
        pod_subnet_pool: Option<String> = None,
    }
}

config_section! {
    /// `[cni_daemon]`
    pub struct CniDaemonSection {
        bind_address: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 5036)),
        worker_num: u32 = 30,
        /// Seconds.
        vif_annotation_timeout: u64 = 60,
        /// Seconds (netlink operations in kuryr-rs).
        pyroute2_timeout: u64 = 10,
        docker_mode: bool = false,
        netns_proc_dir: Option<String> = None,
        cni_failures_count: u32 = 3,
        /// kuryr-rs: let `bind_address` be other than a loopback address (the API has no
        /// authentication, so anything that reaches it can plug and unplug pods).
        allow_non_loopback_bind: bool = false,
        /// kuryr-rs: connections the API serves at once (capped further by the open-file limit).
        max_connections: u32 = 1024,
        /// kuryr-rs: ADD requests in flight at once; more wait for a slot within
        /// `vif_annotation_timeout`.
        max_concurrent_adds: u32 = 128,
        /// kuryr-rs: seconds a client has to send the request head, and again its body.
        request_read_timeout: u64 = 10,
    }
}

config_section! {
    /// `[health_server]` (controller)
    pub struct HealthServerSection {
        port: u16 = 8082,
    }
}

config_section! {
    /// `[cni_health_server]`
    pub struct CniHealthServerSection {
        port: u16 = 8090,
        /// MiB, -1 = no limit.
        max_memory_usage: i64 = -1,
        cg_path: String = s("/sys/fs/cgroup/memory/system.slice/kuryr-cni.service"),
    }
}

config_section! {
    /// `[prometheus_exporter]`
    pub struct PrometheusExporterSection {
        controller_exporter_port: u16 = 9654,
        cni_exporter_port: u16 = 9655,
    }
}

config_section! {
    /// `[sriov]`
    pub struct SriovSection {
        kubelet_root_dir: String = s("/var/lib/kubelet"),
        enable_pod_resource_service: bool = false,
        default_physnet_subnets: BTreeMap<String, String> = BTreeMap::new(),
        /// Checked on load (`physnet:interface` entries).
        physical_device_mappings: PhysicalDeviceMappings = PhysicalDeviceMappings::default(),
        physnet_resource_mappings: BTreeMap<String, String> = BTreeMap::new(),
        device_plugin_resource_prefix: String = s("intel.com"),
        resource_driver_mappings: BTreeMap<String, String> = BTreeMap::new(),
    }
}

config_section! {
    /// `[vhostuser]`
    pub struct VhostuserSection {
        mount_point: String = s("/var/cni/vhostuser"),
        ovs_vhu_path: String = s("/var/run/openvswitch/"),
    }
}

config_section! {
    /// `[nested_dpdk]`
    pub struct NestedDpdkSection {
        dpdk_driver: String = s("uio_pci_generic"),
        pci_mount_point: String = s("/var/pci_address"),
    }
}

config_section! {
    /// `[pool_manager]`
    pub struct PoolManagerSection {
        sock_file: String = s("/run/kuryr/kuryr_manage.sock"),
    }
}

config_section! {
    /// `[neutron]` and every `[deployment:<name>]`: keystoneauth session, auth and adapter
    /// options, plus kuryr-lib's neutron options and the kuryr-rs deployment attributes.
    pub struct NeutronAuthSection {
        /// `None`: no plugin configured, requests go unauthenticated (needs `endpoint_override`).
        auth_type: Option<AuthType> = None,
        auth_url: Option<String> = None,
        /// clouds.yaml cloud name to take the credentials from.
        cloud: Option<String> = None,
        username: Option<String> = None,
        user_id: Option<String> = None,
        password: Option<Secret> = None,
        user_domain_name: Option<String> = None,
        user_domain_id: Option<String> = None,
        project_name: Option<String> = None,
        project_id: Option<String> = None,
        project_domain_name: Option<String> = None,
        project_domain_id: Option<String> = None,
        domain_name: Option<String> = None,
        domain_id: Option<String> = None,
        default_domain_name: Option<String> = None,
        default_domain_id: Option<String> = None,
        system_scope: Option<String> = None,
        trust_id: Option<String> = None,
        application_credential_id: Option<String> = None,
        application_credential_name: Option<String> = None,
        application_credential_secret: Option<Secret> = None,
        region_name: Option<String> = None,
        interface: Option<Interface> = None,
        /// kuryr-lib's name for the catalog interface; `interface` wins when both are set.
        endpoint_type: String = s("public"),
        /// Neutron URL to use instead of the catalog's (e.g. with `auth_type = noauth`).
        endpoint_override: Option<String> = None,
        /// keystoneauth's `none`/`noauth` plugin option: the URL of every service (what upstream's
        /// kuryr.conf sets with `auth_type = none`); `endpoint_override` wins when both are set.
        endpoint: Option<String> = None,
        /// kuryr-rs: Octavia URL to use instead of the catalog's `load-balancer` endpoint (openstacksdk's
        /// name); needed by the Service handlers with `auth_type = noauth`.
        load_balancer_endpoint_override: Option<String> = None,
        cafile: Option<String> = None,
        certfile: Option<String> = None,
        keyfile: Option<String> = None,
        insecure: bool = false,
        /// Seconds per HTTP request; `None` = no timeout (keystoneauth's default).
        timeout: Option<u64> = None,
        /// kuryr-rs: availability zone this deployment serves.
        availability_zone: Option<String> = None,
        /// kuryr-rs: key:value tags matched by the `resource_affinity` filter.
        resource_affinity: BTreeMap<String, String> = BTreeMap::new(),
        /// kuryr-rs: `false` takes the deployment out of new bindings (maintenance); its
        /// KuryrOpenStackDeployment object, when there is one, decides instead.
        binding_enabled: bool = true,
        /// kuryr-rs: cluster project id -> this deployment's project id (`a:b,c:d`), for
        /// deployments with their own Keystone.
        project_ids: BTreeMap<String, String> = BTreeMap::new(),
        /// kuryr-rs: this deployment's pod subnet (overrides `[neutron_defaults] pod_subnet`, whose
        /// id only exists in one deployment).
        pod_subnet: Option<String> = None,
        /// kuryr-rs: this deployment's pod security groups (overrides `[neutron_defaults]`).
        pod_security_groups: Vec<String> = Vec::new(),
        /// kuryr-rs: this deployment's `[namespace_subnet] pod_router`.
        pod_router: Option<String> = None,
        /// kuryr-rs: this deployment's `[namespace_subnet] pod_subnet_pool`.
        pod_subnet_pool: Option<String> = None,
        /// kuryr-rs: the subnet of this deployment's Service VIPs (`[neutron_defaults] service_subnet` is
        /// the `default` deployment's only: a subnet id means nothing in another cloud).
        service_subnet: Option<String> = None,
        /// kuryr-rs: this deployment's network of Service floating IPs (`[neutron_defaults]
        /// external_svc_net` is the `default` deployment's only).
        external_svc_net: Option<String> = None,
        /// kuryr-rs: this deployment's subnet of Service floating IPs (`[neutron_defaults]
        /// external_svc_subnet` is the `default` deployment's only).
        external_svc_subnet: Option<String> = None,
        /// kuryr-rs: this deployment's Octavia provider (overrides `[kubernetes]
        /// endpoints_driver_octavia_provider`, a name every cloud may have).
        octavia_provider: Option<String> = None,
    }
}

config_section! {
    /// `[pod_binding]` (kuryr-rs): which deployment a tenant is bound to (see
    /// `docs/architecture.md#several-openstack-deployments`).
    pub struct PodBindingSection {
        enabled: bool = false,
        filters: Vec<BindingFilter> = vec![BindingFilter::All],
        weighers: Vec<BindingWeigher> = vec![BindingWeigher::CreationOrder],
        /// Weigher name -> multiplier; weighers not listed use 1.0.
        weigher_multipliers: BTreeMap<BindingWeigher, f64> = BTreeMap::new(),
        /// Fraction (0..=1) of a deployment's capacity above which `usage_threshold` drops it.
        usage_threshold: f64 = 0.9,
        /// New bindings only go to deployments below `usage_threshold - usage_hysteresis`, so a
        /// deployment a binding just left is not picked again at once.
        usage_hysteresis: f64 = 0.05,
        /// Seconds between usage measurements of every deployment.
        usage_refresh_interval: u64 = 300,
        /// Seconds one deployment's measurement may take; a slower one is stale this round.
        usage_timeout: u64 = 30,
        /// Pick randomly among the best `subset_size` deployments (1 = always the best).
        subset_size: NonZeroU32 = NonZeroU32::MIN,
        /// Seconds a binding no namespace uses is kept (with its history) before it is deleted;
        /// 0 keeps every binding for ever.
        unused_binding_retention: u64 = 604800,
    }
}

impl NeutronAuthSection {
    /// The catalog interface to use: `interface`, else kuryr-lib's `endpoint_type`
    /// (which also accepts the old `publicURL`/`internalURL`/`adminURL` spellings),
    /// else `public`.
    pub fn effective_interface(&self) -> Interface {
        if let Some(i) = self.interface {
            return i;
        }
        let t = self.endpoint_type.trim();
        let t = t.strip_suffix("URL").unwrap_or(t);
        t.parse().unwrap_or(Interface::Public)
    }

    /// The Neutron URL that replaces the catalog's: `endpoint_override`, else the `none` plugin's
    /// `endpoint`.
    pub fn neutron_endpoint(&self) -> Option<&str> {
        self.endpoint_override.as_deref().or(self.endpoint.as_deref())
    }
}
