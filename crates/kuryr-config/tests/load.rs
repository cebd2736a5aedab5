//! Loading whole kuryr.conf files: typed values, precedence, warnings and error texts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use kuryr_config::*;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

const NO_ENV: [(&str, &str); 0] = [];

fn load(names: &[&str]) -> Loaded {
    let paths: Vec<PathBuf> = names.iter().map(|n| fixture(n)).collect();
    match KuryrConfig::load_with_env(&paths, NO_ENV) {
        Ok(l) => l,
        Err(e) => panic!("loading {names:?} failed: {e}"),
    }
}

fn load_err(text: &str) -> String {
    match KuryrConfig::from_ini_str(text) {
        Ok(l) => panic!("expected an error for {text:?}, got {:?}", l.config),
        Err(e) => e.to_string(),
    }
}

#[test]
fn defaults_match_upstream() {
    let c = KuryrConfig::default();
    assert_eq!(
        c.kubernetes
            .enabled_handlers
            .iter()
            .map(|h| h.as_str())
            .collect::<Vec<_>>(),
        ["vif", "endpoints", "service", "kuryrloadbalancer", "kuryrport"]
    );
    assert_eq!(c.kubernetes.pod_vif_driver, PodVifDriver::NeutronVif);
    assert_eq!(c.kubernetes.vif_pool_driver, VifPoolDriver::Noop);
    assert_eq!(c.kubernetes.multi_vif_drivers, [MultiVifDriver::Noop]);
    assert_eq!(c.kubernetes.watch_reconcile_period, 120);
    assert_eq!(c.kubernetes.controller_ha_elector_port, 16401);
    assert!(c.kubernetes.use_events);
    assert_eq!(c.vif_pool.ports_pool_min, 5);
    assert_eq!(c.vif_pool.ports_pool_max, 0);
    assert_eq!(c.vif_pool.ports_pool_batch.get(), 10);
    assert_eq!(c.vif_pool.ports_pool_update_frequency, 20);
    assert_eq!(c.vif_pool.ports_pool_ttl, 0);
    assert_eq!(c.vif_pool.ports_pool_max_concurrent_populate.get(), 20);
    assert_eq!(c.kubernetes.max_concurrent_requests.get(), 32);
    assert_eq!(c.neutron_defaults.ovs_bridge, "br-int");
    assert_eq!(
        c.cni_daemon.bind_address,
        "127.0.0.1:5036".parse::<SocketAddr>().expect("addr")
    );
    assert_eq!(c.cni_daemon.vif_annotation_timeout, 60);
    assert_eq!(c.cni_daemon.cni_failures_count, 3);
    assert_eq!(c.health_server.port, 8082);
    assert_eq!(c.cni_health_server.port, 8090);
    assert_eq!(c.prometheus_exporter.controller_exporter_port, 9654);
    assert_eq!(c.prometheus_exporter.cni_exporter_port, 9655);
    assert_eq!(c.octavia_defaults.member_mode, MemberMode::L3);
    assert_eq!(c.binding.default_driver, "kuryr.lib.binding.drivers.veth");
    assert_eq!(c.pod_vif_nested.rev_update_attempts, 3);
    assert!(!c.pod_binding.enabled);
    assert_eq!(c.deployments().len(), 1);
    // An empty file gives exactly the defaults and no warnings.
    let empty = KuryrConfig::from_ini_str("").expect("empty config");
    assert_eq!(empty.config, c);
    assert!(empty.warnings.is_empty());
}

#[test]
fn devstack_file_gives_typed_values() {
    let Loaded { config: c, warnings } = load(&["devstack-kuryr.conf"]);
    assert!(c.default.debug);
    assert!(c.default.use_stderr);
    let k = &c.kubernetes;
    assert_eq!(k.api_root, "https://192.168.122.10:6443");
    assert_eq!(k.token_file.as_deref(), Some("/etc/kuryr/token"));
    assert_eq!(k.ssl_verify_server_crt, Some(true));
    assert!(k.port_debug);
    assert!(!k.use_events);
    assert_eq!(k.vif_pool_driver, VifPoolDriver::Neutron);
    assert_eq!(k.pod_subnets_driver, PodSubnetsDriver::Namespace);
    assert_eq!(k.pod_security_groups_driver, SecurityGroupsDriver::Policy);
    assert_eq!(k.service_security_groups_driver, SecurityGroupsDriver::Policy);
    // The continuation line is part of the list.
    assert_eq!(k.enabled_handlers.len(), 10);
    assert_eq!(
        k.enabled_handlers.last().map(String::as_str),
        Some("kuryrnetworkpolicy")
    );
    assert_eq!(
        k.multi_vif_drivers,
        [MultiVifDriver::Noop, MultiVifDriver::NpwgMultipleInterfaces]
    );
    assert_eq!(k.watch_reconcile_period, 300);
    assert_eq!(k.endpoints_driver_octavia_provider, "ovn");

    let n = &c.neutron;
    assert_eq!(n.auth_type, Some(AuthType::Password));
    assert_eq!(n.auth_url.as_deref(), Some("http://192.168.122.10/identity"));
    assert_eq!(n.password.as_ref().map(Secret::expose), Some("secretadmin"));
    assert_eq!(n.project_domain_name.as_deref(), Some("Default"));
    assert_eq!(n.region_name.as_deref(), Some("RegionOne"));

    let nd = &c.neutron_defaults;
    assert_eq!(nd.pod_security_groups.len(), 2);
    assert_eq!(nd.network_device_mtu, 1450);
    assert_eq!(nd.resource_tags, ["devstack-k8s", "kuryr"]);
    assert_eq!(
        nd.subnet_mapping.get("sriov").map(String::as_str),
        Some("5f3b1c2d-0000-4000-8000-000000000001")
    );
    assert_eq!(
        c.namespace_subnet.pod_router.as_deref(),
        Some("3c4d5e6f-7a8b-4c9d-0e1f-2a3b4c5d6e7f")
    );
    assert_eq!(c.octavia_defaults.lb_algorithm, LbAlgorithm::SourceIpPort);
    assert!(!c.octavia_defaults.enforce_sg_rules);
    assert_eq!(c.vif_pool.ports_pool_ttl, 600);
    assert_eq!(c.vif_pool.ports_pool_max_concurrent_populate.get(), 8);
    assert_eq!(c.kubernetes.max_concurrent_requests.get(), 16);
    assert!(c.cni_daemon.docker_mode);
    assert_eq!(c.cni_daemon.netns_proc_dir.as_deref(), Some("/host_proc"));
    assert_eq!(c.cni_daemon.vif_annotation_timeout, 120);
    assert_eq!(c.cni_daemon.cni_failures_count, 5);
    assert_eq!(c.cni_health_server.max_memory_usage, 1024);
    assert_eq!(
        c.sriov.pfs_of_physnet("physnet1"),
        Some(&["ens4f0".to_string()][..])
    );
    assert_eq!(
        c.sriov.pfs_of_physnet("physnet2"),
        Some(&["ens4f1".to_string()][..])
    );
    assert_eq!(
        c.sriov
            .physnet_resource_mappings
            .get("physnet2")
            .map(String::as_str),
        Some("sriov_b")
    );
    assert!(c.sriov.enable_pod_resource_service);
    assert_eq!(c.subnet_caching.cache_time, 600);
    assert_eq!(c.nodes_caching.cache_time, 120);
    assert!(c.nodes_caching.caching);
    assert!(!c.node_driver_caching.caching);
    assert_eq!(c.nested_dpdk.dpdk_driver, "vfio-pci");

    assert_eq!(n.interface, Some(Interface::Public));
    // Sections and keystonemiddleware options devstack writes for Python libraries are
    // skipped quietly; the option devstack sets that upstream never registered is reported.
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        matches!(&warnings[0], Warning::UnknownOption { section, option, .. }
            if section == "kubernetes" && option == "controller_ha_port"),
        "{warnings:?}"
    );
}

#[test]
fn nested_vlan_file() {
    let Loaded { config: c, warnings } = load(&["nested-vlan.conf"]);
    assert_eq!(c.kubernetes.pod_vif_driver, PodVifDriver::NestedVlan);
    assert_eq!(c.kubernetes.vif_pool_driver, VifPoolDriver::Nested);
    assert_eq!(
        c.pod_vif_nested.worker_nodes_subnets,
        [
            "2e3f4a5b-6c7d-4e8f-9a0b-1c2d3e4f5a6b",
            "3f4a5b6c-7d8e-4f9a-0b1c-2d3e4f5a6b7c"
        ]
    );
    assert_eq!(c.binding.link_iface, "ens3");
    assert_eq!(c.binding.default_driver, "kuryr.lib.binding.drivers.vlan");
    assert_eq!(c.vif_pool.ports_pool_min, 2);
    assert_eq!(c.vif_pool.ports_pool_max, 20);
    assert_eq!(c.vif_pool.ports_pool_batch.get(), 4);
    let mapping: BTreeMap<PodVifDriver, VifPoolDriver> = [
        (PodVifDriver::NestedVlan, VifPoolDriver::Nested),
        (PodVifDriver::NeutronVif, VifPoolDriver::Neutron),
    ]
    .into();
    assert_eq!(c.vif_pool.vif_pool_mapping, mapping);
    let n = &c.neutron;
    assert_eq!(n.auth_type, Some(AuthType::V3Password));
    // Quotes are stripped like oslo's parser does.
    assert_eq!(
        n.password.as_ref().map(Secret::expose),
        Some("k8s secret with spaces")
    );
    assert_eq!(n.interface, Some(Interface::Internal));
    assert_eq!(n.timeout, Some(30));
    assert!(n.insecure);
    // `[binding] driver` is the old name of default_driver.
    assert!(
        warnings
            .iter()
            .any(|w| matches!(w, Warning::Deprecated { option, .. } if option == "driver")),
        "{warnings:?}"
    );
}

#[test]
fn several_deployments() {
    let Loaded { config: c, warnings } = load(&["multi-deployment.conf"]);
    assert!(warnings.is_empty(), "{warnings:?}");
    let deps = c.deployments();
    let names: Vec<&str> = deps.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["default", "east", "west"]);
    assert_eq!(deps[0].1.auth_type, Some(AuthType::Noauth));
    assert_eq!(
        deps[0].1.endpoint_override.as_deref(),
        Some("http://127.0.0.1:9696")
    );
    let east = c.deployment("east").expect("east declared");
    assert_eq!(east.auth_type, Some(AuthType::Password));
    assert_eq!(east.region_name.as_deref(), Some("East"));
    assert_eq!(
        east.resource_affinity.get("tier").map(String::as_str),
        Some("gold")
    );
    assert!(east.binding_enabled);
    let west = c.deployment("west").expect("west declared");
    assert_eq!(west.auth_type, Some(AuthType::V3ApplicationCredential));
    assert_eq!(west.application_credential_id.as_deref(), Some("8b1f0d2e3c4a"));
    assert_eq!(
        west.application_credential_secret.as_ref().map(Secret::expose),
        Some("west-secret")
    );
    assert!(!west.binding_enabled);
    assert!(c.deployment("north").is_none());

    let b = &c.pod_binding;
    assert!(b.enabled);
    assert_eq!(
        b.filters,
        [
            BindingFilter::AvailabilityZone,
            BindingFilter::ResourceAffinity,
            BindingFilter::UsageThreshold
        ]
    );
    assert_eq!(
        b.weighers,
        [BindingWeigher::CreationOrder, BindingWeigher::IdleCapacity]
    );
    assert_eq!(
        b.weigher_multipliers.get(&BindingWeigher::IdleCapacity),
        Some(&2.5)
    );
    assert_eq!(b.usage_threshold, 0.8);
    assert_eq!(b.subset_size.get(), 2);
}

#[test]
fn later_files_win() {
    let c = load(&["devstack-kuryr.conf", "override.conf"]).config;
    assert_eq!(c.kubernetes.api_root, "https://k8s-override:6443");
    assert!(!c.kubernetes.port_debug);
    assert_eq!(c.vif_pool.ports_pool_batch.get(), 3);
    assert_eq!(c.neutron.region_name.as_deref(), Some("RegionTwo"));
    // Untouched values of the first file stay.
    assert_eq!(c.neutron.username.as_deref(), Some("admin"));
    assert_eq!(c.vif_pool.ports_pool_ttl, 600);
    // And the other order.
    let c = load(&["override.conf", "devstack-kuryr.conf"]).config;
    assert_eq!(c.kubernetes.api_root, "https://192.168.122.10:6443");
    assert!(c.kubernetes.port_debug);
}

#[test]
fn default_section_is_a_fallback() {
    let l = KuryrConfig::from_ini_str(
        "[DEFAULT]\nports_pool_min = 7\nport = 9000\ncaching = false\n[vif_pool]\nports_pool_max = 3\n[cni_health_server]\nport = 8091\n",
    )
    .expect("valid");
    assert_eq!(l.config.vif_pool.ports_pool_min, 7);
    assert_eq!(l.config.vif_pool.ports_pool_max, 3);
    // The section's own value beats [DEFAULT]...
    assert_eq!(l.config.cni_health_server.port, 8091);
    // ...and [DEFAULT] reaches every section that does not set the option.
    assert_eq!(l.config.health_server.port, 9000);
    assert!(!l.config.subnet_caching.caching && !l.config.nodes_caching.caching);
    // Options of other sections are known in [DEFAULT].
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
}

#[test]
fn env_overrides_win_over_files() {
    let env = [
        ("KURYR__VIF_POOL__PORTS_POOL_MIN", "9"),
        ("KURYR__KUBERNETES__API_ROOT", "https://from-env:6443"),
        ("KURYR__DEFAULT__DEBUG", "false"),
        ("KURYR__DEPLOYMENT__WEST__REGION_NAME", "WestEnv"),
        ("KURYR__DEPLOYMENT__NORTH__AUTH_TYPE", "noauth"),
        ("KURYR__DEPLOYMENT__NORTH__ENDPOINT_OVERRIDE", "http://north:9696"),
        ("KURYR__NEUTRON__PASSWORD", "from-env"),
        ("PATH", "/usr/bin"),
        ("KURYR__BROKEN", "x"),
    ];
    let paths = [fixture("devstack-kuryr.conf"), fixture("multi-deployment.conf")];
    let Loaded { config: c, warnings } = KuryrConfig::load_with_env(&paths, env).expect("valid");
    assert_eq!(c.vif_pool.ports_pool_min, 9);
    assert_eq!(c.kubernetes.api_root, "https://from-env:6443");
    assert!(!c.default.debug);
    assert_eq!(
        c.deployment("west").and_then(|d| d.region_name.as_deref()),
        Some("WestEnv")
    );
    assert_eq!(
        c.deployment("north").and_then(|d| d.auth_type),
        Some(AuthType::Noauth)
    );
    assert_eq!(c.neutron.password.as_ref().map(Secret::expose), Some("from-env"));
    assert!(
        warnings.contains(&Warning::MalformedEnvVar {
            var: "KURYR__BROKEN".into()
        }),
        "{warnings:?}"
    );
}

#[test]
fn env_bad_value_names_the_variable() {
    let err = KuryrConfig::load_with_env(
        &[fixture("nested-vlan.conf")],
        [("KURYR__VIF_POOL__PORTS_POOL_MAX", "lots")],
    )
    .expect_err("bad env value");
    let text = err.to_string();
    assert!(
        text.contains("[vif_pool] ports_pool_max = \"lots\": expected an integer"),
        "{text}"
    );
    assert!(
        text.contains("environment variable KURYR__VIF_POOL__PORTS_POOL_MAX"),
        "{text}"
    );
}

#[test]
fn unknown_names_are_warnings() {
    let l = KuryrConfig::from_ini_str(
        "[kubernetes]\napi_rot = http://x\n[vif_pool]\nports_pool_min = 1\n[mystery]\na = 1\n",
    )
    .expect("unknown names do not fail");
    assert_eq!(l.config.vif_pool.ports_pool_min, 1);
    assert_eq!(l.warnings.len(), 2, "{:?}", l.warnings);
    let texts: Vec<String> = l.warnings.iter().map(ToString::to_string).collect();
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("unknown option [kubernetes] api_rot (from <string>:2)")),
        "{texts:?}"
    );
    assert!(
        texts.iter().any(|t| t.starts_with("unknown section [mystery]")),
        "{texts:?}"
    );
    let l = KuryrConfig::from_ini_str("[deployment:east]\nauth_typo = password\n").expect("valid");
    assert!(
        matches!(&l.warnings[..], [Warning::UnknownOption { section, option, .. }] if section == "deployment:east" && option == "auth_typo"),
        "{:?}",
        l.warnings
    );
}

#[test]
fn bad_values_name_section_option_and_value() {
    let cases: &[(&str, &str)] = &[
        (
            "[vif_pool]\nports_pool_min = abc\n",
            "[vif_pool] ports_pool_min = \"abc\": expected an integer",
        ),
        (
            "[vif_pool]\nports_pool_min = -1\n",
            "[vif_pool] ports_pool_min = \"-1\": expected an integer between 0 and 4294967295",
        ),
        (
            "[vif_pool]\nports_pool_batch = 0\n",
            "[vif_pool] ports_pool_batch = \"0\": expected an integer of at least 1",
        ),
        (
            "[kubernetes]\nmax_concurrent_requests = 0\n",
            "[kubernetes] max_concurrent_requests = \"0\": expected an integer of at least 1",
        ),
        (
            "[kubernetes]\nport_debug = maybe\n",
            "[kubernetes] port_debug = \"maybe\": expected a boolean",
        ),
        (
            "[health_server]\nport = 70000\n",
            "[health_server] port = \"70000\": expected an integer between 0 and 65535",
        ),
        (
            "[pod_binding]\nusage_threshold = high\n",
            "[pod_binding] usage_threshold = \"high\": expected a number",
        ),
        (
            "[pod_binding]\nusage_threshold = 1.5\n",
            "[pod_binding] usage_threshold = \"1.5\": expected a fraction above 0, at most 1",
        ),
        (
            "[pod_binding]\nusage_threshold = 0\n",
            "[pod_binding] usage_threshold = \"0\": expected a fraction above 0, at most 1",
        ),
        (
            "[kubernetes]\npod_vif_driver = nested-vlan\nnodes_subnets_driver = openshift\n",
            "[kubernetes] nodes_subnets_driver = \"openshift\": expected config (OpenShift's Machine objects are not read)",
        ),
        (
            "[pod_binding]\nusage_threshold = 0.9\nusage_hysteresis = 0.9\n",
            "[pod_binding] usage_hysteresis = \"0.9\": expected a fraction from 0 up to (not including) usage_threshold",
        ),
        (
            "[octavia_defaults]\ntimeout_member_data = 90000000\n",
            "[octavia_defaults] timeout_member_data = \"90000000\": expected milliseconds between 0 and 86400000",
        ),
        (
            "[cni_daemon]\nbind_address = localhost\n",
            "[cni_daemon] bind_address = \"localhost\": expected an address as ip:port",
        ),
        (
            "[kubernetes]\npod_vif_driver = nested-vxlan\n",
            "[kubernetes] pod_vif_driver = \"nested-vxlan\": expected one of: neutron-vif, nested-vlan, nested-macvlan, nested-dpdk",
        ),
        (
            "[kubernetes]\nvif_pool_driver = big\n",
            "[kubernetes] vif_pool_driver = \"big\": expected one of: noop, neutron, nested, multi_pool",
        ),
        (
            "[kubernetes]\nmulti_vif_drivers = noop,magic\n",
            "[kubernetes] multi_vif_drivers = \"noop,magic\": list item \"magic\": expected one of: noop, npwg_multiple_interfaces, sriov",
        ),
        (
            "[neutron]\nauth_type = token\n",
            "[neutron] auth_type = \"token\": expected one of: password, v3password, v3applicationcredential, noauth, none",
        ),
        (
            "[neutron_defaults]\nsubnet_mapping = nocolon\n",
            "[neutron_defaults] subnet_mapping = \"nocolon\": expected key:value pairs",
        ),
        (
            "[vif_pool]\nvif_pool_mapping = neutron:nested\n",
            "[vif_pool] vif_pool_mapping = \"neutron:nested\": key \"neutron\": expected one of: neutron-vif,",
        ),
        (
            "[pod_binding]\nweigher_multipliers = idle_capacity:2\n",
            "[pod_binding] weigher_multipliers = \"idle_capacity:2\": weigher \"idle_capacity\" is not listed",
        ),
        (
            "[deployment:east]\ninsecure = sometimes\n",
            "[deployment:east] insecure = \"sometimes\": expected a boolean",
        ),
        (
            "[DEFAULT]\nports_pool_min = x\n",
            "[vif_pool] ports_pool_min = \"x\": expected an integer (from <string>:2)",
        ),
    ];
    for (text, expected) in cases {
        let err = load_err(text);
        assert!(
            err.contains(expected),
            "config {text:?}\n  error: {err}\n  expected to contain: {expected}"
        );
    }
}

/// The daemon used to log a bad mapping and start without it; now it cannot start.
#[test]
fn bad_physical_device_mappings_fail_the_load() {
    for (value, why) in [
        (
            "physnet1:ens1f0,ens1f1",
            "entry \"ens1f1\" is not physnet:interface",
        ),
        (
            "physnet1:../etc",
            "\"../etc\" (physnet physnet1) is not an interface name",
        ),
        (
            "physnet1:an-interface-name-too-long",
            "(physnet physnet1) is not an interface name",
        ),
    ] {
        let err = KuryrConfig::from_ini_str(&format!("[sriov]\nphysical_device_mappings = {value}\n"))
            .expect_err(value);
        let bad = err.invalid_values();
        assert_eq!(bad.len(), 1, "{err}");
        assert_eq!(
            (
                bad[0].section.as_str(),
                bad[0].option.as_str(),
                bad[0].value.as_str()
            ),
            ("sriov", "physical_device_mappings", value)
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("[sriov] physical_device_mappings = {value:?}: ")) && msg.contains(why),
            "{msg}"
        );
    }
    // Environment overrides are checked the same way.
    let err = KuryrConfig::load_with_env(
        &[] as &[&str],
        [("KURYR__SRIOV__PHYSICAL_DEVICE_MAPPINGS", "nocolon")],
    )
    .expect_err("bad override");
    assert!(
        err.to_string().contains(
            "[sriov] physical_device_mappings = \"nocolon\": entry \"nocolon\" is not physnet:interface"
        ),
        "{err}"
    );
}

#[test]
fn every_bad_value_is_reported_at_once() {
    let err = KuryrConfig::from_ini_str("[vif_pool]\nports_pool_min = a\nports_pool_max = b\n")
        .expect_err("two bad values");
    let bad: Vec<&str> = err.invalid_values().iter().map(|e| e.option.as_str()).collect();
    assert_eq!(bad, ["ports_pool_max", "ports_pool_min"]);
}

#[test]
fn deployment_names_are_checked() {
    assert!(load_err("[deployment:default]\nauth_type = noauth\n").contains("configured in [neutron]"));
    assert!(load_err("[deployment:]\nauth_type = noauth\n").contains("name is empty"));
}

#[test]
fn deprecated_singular_worker_subnet_is_folded() {
    let l = KuryrConfig::from_ini_str("[pod_vif_nested]\nworker_nodes_subnet = subnet-a\n").expect("valid");
    assert_eq!(l.config.pod_vif_nested.worker_nodes_subnets, ["subnet-a"]);
    assert!(
        matches!(&l.warnings[..], [Warning::Deprecated { option, .. }] if option == "worker_nodes_subnet")
    );
}

#[test]
fn missing_file_and_syntax_errors_name_the_file() {
    let missing = fixture("does-not-exist.conf");
    let err = KuryrConfig::load_with_env(&[&missing], NO_ENV).expect_err("missing file");
    assert!(err.to_string().contains("does-not-exist.conf"), "{err}");
    assert!(matches!(err, ConfigError::Io { .. }));
    let err = load_err("[kubernetes]\nthis line is wrong\n");
    assert!(err.contains("<string>:2"), "{err}");
}

#[test]
fn secrets_do_not_leak_in_debug_output() {
    let c = load(&["multi-deployment.conf"]).config;
    let dump = format!("{c:?}");
    assert!(
        !dump.contains("east-pass") && !dump.contains("west-secret"),
        "{dump}"
    );
}

#[test]
fn credentials_required_by_auth_type() {
    let err =
        load_err("[deployment:east]\nauth_type = password\nauth_url = https://k:5000/v3\nusername = u\n");
    assert_eq!(
        err,
        "[deployment:east] user_domain_name or user_domain_id must be set with auth_type = password; \
         [deployment:east] password must be set with auth_type = password; \
         [deployment:east] project_name or project_id must be set with auth_type = password"
    );
    // Names within a domain, ids alone, or the default domain for both.
    let named = "[neutron]\nauth_type = password\nauth_url = https://k:5000/v3\nusername = u\npassword = p\n\
        project_name = k8s\n";
    assert_eq!(
        load_err(named),
        "[neutron] user_domain_name or user_domain_id must be set with auth_type = password; \
         [neutron] project_domain_name or project_domain_id must be set with auth_type = password"
    );
    for complete in [
        format!("{named}user_domain_name = Default\nproject_domain_id = default\n"),
        format!("{named}default_domain_name = Default\n"),
        "[neutron]\nauth_type = password\nauth_url = https://k:5000/v3\nuser_id = u1\npassword = p\n\
         project_id = p1\n"
            .to_owned(),
    ] {
        if let Err(e) = KuryrConfig::from_ini_str(&complete) {
            panic!("{complete}: {e}");
        }
    }
    // An application credential by name is its user's: the user is named too.
    let err = load_err(
        "[neutron]\nauth_type = v3applicationcredential\nauth_url = https://k:5000/v3\n\
         application_credential_name = c\napplication_credential_secret = s\n",
    );
    assert_eq!(
        err,
        "[neutron] username or user_id must be set with auth_type = v3applicationcredential"
    );
    let err = load_err("[neutron]\nauth_type = v3applicationcredential\n");
    assert!(
        err.contains("[neutron] auth_url must be set with auth_type = v3applicationcredential"),
        "{err}"
    );
    assert!(
        err.contains("application_credential_id or application_credential_name"),
        "{err}"
    );
    assert!(err.contains("application_credential_secret"), "{err}");
    let err = load_err("[neutron]\nauth_type = noauth\n");
    assert_eq!(
        err,
        "[neutron] endpoint_override or endpoint must be set with auth_type = noauth"
    );
    // Upstream's noauth form: keystoneauth's `none` plugin with its `endpoint`.
    let upstream = KuryrConfig::from_ini_str("[neutron]\nauth_type = none\nendpoint = http://n:9696\n")
        .expect("upstream's noauth [neutron]")
        .config;
    assert_eq!(upstream.neutron.neutron_endpoint(), Some("http://n:9696"));
    // clouds.yaml may hold the credentials.
    assert!(KuryrConfig::from_ini_str("[neutron]\nauth_type = password\ncloud = openstack\n").is_ok());
    // No auth_type: nothing is configured yet, nothing is required.
    assert!(KuryrConfig::from_ini_str("[neutron]\nregion_name = r\n").is_ok());
}

#[test]
fn interface_falls_back_to_endpoint_type() {
    let c = KuryrConfig::from_ini_str("[neutron]\nendpoint_type = internalURL\n")
        .expect("valid")
        .config;
    assert_eq!(c.neutron.effective_interface(), Interface::Internal);
    let c = KuryrConfig::from_ini_str("[neutron]\nendpoint_type = admin\ninterface = public\n")
        .expect("valid")
        .config;
    assert_eq!(c.neutron.effective_interface(), Interface::Public);
    assert_eq!(
        KuryrConfig::default().neutron.effective_interface(),
        Interface::Public
    );
}

#[test]
fn config_dir_lists_conf_files_in_name_order() {
    let files = KuryrConfig::config_dir_files(fixture("")).expect("fixtures dir");
    let names: Vec<String> = files
        .iter()
        .filter_map(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "devstack-kuryr.conf",
            "multi-deployment.conf",
            "nested-vlan.conf",
            "override.conf"
        ]
    );
    let err = KuryrConfig::config_dir_files(fixture("no-such-dir")).expect_err("missing dir");
    assert!(err.to_string().contains("no-such-dir"), "{err}");
}

#[test]
fn serialized_dump_uses_conf_spellings_and_hides_secrets() {
    let c = load(&["multi-deployment.conf", "nested-vlan.conf"]).config;
    let json = serde_json::to_value(&c).expect("serializable");
    assert_eq!(json["kubernetes"]["pod_vif_driver"], "nested-vlan");
    assert_eq!(json["vif_pool"]["vif_pool_mapping"]["nested-vlan"], "nested");
    assert_eq!(json["vif_pool"]["ports_pool_batch"], 4);
    assert_eq!(json["neutron"]["password"], "***");
    assert_eq!(json["extra_deployments"][1][0], "west");
    assert_eq!(
        json["extra_deployments"][1][1]["application_credential_secret"],
        "***"
    );
    assert!(!json.to_string().contains("west-secret"));
}

#[test]
fn deployment_sections_override_pod_ids() {
    let ini = "[neutron]\nauth_type = noauth\nendpoint_override = http://a\n\
               [neutron_defaults]\npod_subnet = global-subnet\npod_security_groups = sg1,sg2\n\
               [namespace_subnet]\npod_router = r0\n\
               [deployment:east]\nauth_type = noauth\nendpoint_override = http://b\npod_subnet = east-subnet\n\
               pod_router = r-east\n";
    let cfg = KuryrConfig::from_ini_str(ini).expect("loads").config;
    let d = cfg.deployment_defaults("default");
    assert_eq!(d.pod_subnet.as_deref(), Some("global-subnet"));
    assert_eq!(d.pod_router.as_deref(), Some("r0"));
    let e = cfg.deployment_defaults("east");
    assert_eq!(e.pod_subnet.as_deref(), Some("east-subnet"));
    assert_eq!(
        e.pod_security_groups,
        ["sg1", "sg2"],
        "falls back to [neutron_defaults]"
    );
    assert_eq!(e.pod_router.as_deref(), Some("r-east"));
}

#[test]
fn service_ids_of_neutron_defaults_belong_to_the_default_deployment_only() {
    let ini = "[kubernetes]\nendpoints_driver_octavia_provider = ovn\n\
               [neutron]\nauth_type = noauth\nendpoint_override = http://a\n\
               [neutron_defaults]\nservice_subnet = global-svc\nexternal_svc_net = global-ext\n\
               external_svc_subnet = global-ext-subnet\n\
               [deployment:east]\nauth_type = noauth\nendpoint_override = http://b\nservice_subnet = east-svc\n\
               external_svc_net = east-ext\noctavia_provider = amphora\n\
               [deployment:west]\nauth_type = noauth\nendpoint_override = http://c\nservice_subnet =\n";
    let cfg = KuryrConfig::from_ini_str(ini).expect("loads").config;
    let d = cfg.service_options("default");
    assert_eq!(d.service_subnet.as_deref(), Some("global-svc"));
    assert_eq!(d.external_svc_net.as_deref(), Some("global-ext"));
    assert_eq!(d.external_svc_subnet.as_deref(), Some("global-ext-subnet"));
    assert_eq!(d.octavia_provider, "ovn");
    let e = cfg.service_options("east");
    assert_eq!(e.service_subnet.as_deref(), Some("east-svc"));
    assert_eq!(e.external_svc_net.as_deref(), Some("east-ext"));
    assert_eq!(
        e.external_svc_subnet, None,
        "an id of [neutron_defaults] is not another cloud's"
    );
    assert_eq!(e.octavia_provider, "amphora");
    assert_eq!(e.section, "deployment:east");
    let w = cfg.service_options("west");
    assert_eq!(
        w.service_subnet, None,
        "an empty value is unset, not the global id"
    );
    assert_eq!(w.octavia_provider, "ovn", "a provider name is every cloud's");
}

/// The other project drivers left unset follow the pods' (a port uses only its own project's
/// groups); one that is set keeps its value.
#[test]
fn unset_project_drivers_follow_the_pods() {
    use kuryr_config::ProjectDriver;
    let k = KuryrConfig::from_ini_str_without_credentials(
        "[kubernetes]\npod_project_driver = annotation\nservice_project_driver = default\n",
    )
    .expect("load")
    .config
    .kubernetes;
    assert_eq!(k.namespace_project_driver, ProjectDriver::Annotation);
    assert_eq!(k.network_policy_project_driver, ProjectDriver::Annotation);
    assert_eq!(k.service_project_driver, ProjectDriver::Default);
}

/// `[cni_daemon] bind_address = localhost:5036`, as upstream configs may write it: loopback.
#[test]
fn a_localhost_bind_address_is_loopback() {
    let c = KuryrConfig::from_ini_str_without_credentials("[cni_daemon]\nbind_address = localhost:6036\n")
        .expect("load")
        .config;
    assert_eq!(
        c.cni_daemon.bind_address,
        std::net::SocketAddr::from(([127, 0, 0, 1], 6036))
    );
    assert!(
        KuryrConfig::from_ini_str_without_credentials("[cni_daemon]\nbind_address = example.org:1\n")
            .is_err()
    );
}
