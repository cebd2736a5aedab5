//! Property tests of the `kuryr.conf` reader: arbitrary text never panics,
//! and a bad value is an error naming its section and option.

use kuryr_config::{CniDaemonSection, KuryrConfig};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

/// A fixed seed: CI runs the same cases every time; the budget keeps the
/// file well under its time limit in debug builds.
fn config() -> Config {
    Config {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x6b75_7279),
        failure_persistence: None,
        ..Config::default()
    }
}

/// Typed options of several sections (numbers, booleans, addresses,
/// choices, mappings, lists).
const TYPED: &[(&str, &str)] = &[
    ("cni_daemon", "bind_address"),
    ("cni_daemon", "worker_num"),
    ("cni_daemon", "vif_annotation_timeout"),
    ("cni_daemon", "docker_mode"),
    ("cni_daemon", "max_connections"),
    ("cni_daemon", "request_read_timeout"),
    ("vif_pool", "ports_pool_max"),
    ("vif_pool", "ports_pool_min"),
    ("vif_pool", "ports_pool_batch"),
    ("cni_health_server", "port"),
    ("cni_health_server", "max_memory_usage"),
    ("prometheus_exporter", "cni_exporter_port"),
    ("sriov", "physical_device_mappings"),
    ("sriov", "enable_pod_resource_service"),
    ("binding", "ovs_plug_mode"),
    ("binding", "pod_tx_checksum_offload"),
    ("kubernetes", "enabled_handlers"),
];

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,400}") {
        let _ = KuryrConfig::from_ini_str(&text);
    }

    #[test]
    fn arbitrary_lines_never_panic(lines in prop::collection::vec("[\\[\\]=:# a-z_0-9\\t.,-]{0,40}", 0..20)) {
        let _ = KuryrConfig::from_ini_str(&lines.join("\n"));
    }

    #[test]
    fn a_bad_value_names_its_section_and_option(
        which in 0..TYPED.len(),
        value in "[^\\r\\n]{0,60}",
    ) {
        let (section, option) = TYPED[which];
        let text = format!("[{section}]\n{option} = {value}\n");
        if let Err(e) = KuryrConfig::from_ini_str(&text) {
            let e = e.to_string();
            prop_assert!(
                e.contains(&format!("[{section}] {option}")) || e.contains("syntax"),
                "{text:?}: {e}"
            );
        }
    }

    #[test]
    fn environment_overrides_never_panic_and_name_the_variable(
        section in prop_oneof![Just("CNI_DAEMON".to_string()), Just("VIF_POOL".to_string()), "[A-Z_]{0,12}"],
        option in prop_oneof![Just("WORKER_NUM".to_string()), Just("PORTS_POOL_MAX".to_string()), "[A-Z_]{0,12}"],
        value in "[^\\x00]{0,40}",
    ) {
        let var = format!("KURYR__{section}__{option}");
        let empty: [&str; 0] = [];
        if let Err(e) = KuryrConfig::load_with_env(&empty, [(var.clone(), value.clone())]) {
            let e = e.to_string();
            let option = option.to_lowercase();
            prop_assert!(e.contains(&var) || e.contains(&option), "{var}={value:?}: {e}");
        }
    }
}

#[test]
fn the_hardening_options_are_known() {
    for o in [
        "allow_non_loopback_bind",
        "max_connections",
        "max_concurrent_adds",
        "request_read_timeout",
    ] {
        assert!(CniDaemonSection::OPTIONS.contains(&o), "{o}");
    }
    let loaded = KuryrConfig::from_ini_str("[cni_daemon]\nmax_connections = lots\n");
    let e = loaded.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("[cni_daemon] max_connections"), "{e}");
}
