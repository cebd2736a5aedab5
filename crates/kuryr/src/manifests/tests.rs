use serde_json::Value;

use super::*;

const GOOD: &str = "[kubernetes]\ncontroller_namespace = kuryr\ncontroller_ha = True\n\
    enabled_handlers = vif,kuryrport\nvif_pool_driver = neutron\n\
    [neutron]\nauth_type = password\nauth_url = https://keystone:5000/v3\nusername = kuryr\npassword = p\n\
    user_domain_name = Default\nproject_name = k8s\nproject_domain_name = Default\n\
    [neutron_defaults]\nproject = p1\npod_subnet = s1\npod_security_groups = sg1\n\
    [health_server]\nport = 8182\n[cni_health_server]\nport = 8190\n\
    [cni_daemon]\nnetns_proc_dir = /host_proc\n";

fn opts() -> Options {
    Options {
        namespace: "kuryr".into(),
        image: "registry.example/kuryr:1".into(),
        node_selector: BTreeMap::from([("kuryr/enabled".to_owned(), "true".to_owned())]),
        replicas: 2,
    }
}

fn config(ini: &str) -> KuryrConfig {
    match KuryrConfig::from_ini_str(ini) {
        Ok(l) => l.config,
        Err(e) => panic!("test config: {e}"),
    }
}

fn generated(ini: &str) -> BTreeMap<String, String> {
    match render(&opts(), ini, &config(ini)) {
        Ok(files) => files,
        Err(e) => panic!("render: {e:#}"),
    }
}

/// Every document of every file, in apply order.
fn docs(files: &BTreeMap<String, String>) -> Vec<Value> {
    files
        .values()
        .flat_map(|text| text.split("\n---\n").map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|doc| {
            let v: Value = serde_yaml::from_str(&doc).expect("generated YAML parses");
            (!v.is_null()).then_some(v)
        })
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

#[test]
fn every_object_of_an_install_is_generated_in_apply_order() {
    let files = generated(GOOD);
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        [
            "00-crds.yaml",
            "01-namespace.yaml",
            "02-rbac.yaml",
            "03-config.yaml",
            "03-credentials.yaml",
            "04-controller.yaml",
            "05-cni-daemonset.yaml"
        ]
    );
    let docs = docs(&files);
    let kinds: Vec<String> = docs
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or(""),
                d["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    for want in [
        "CustomResourceDefinition/kuryrports.openstack.org",
        "CustomResourceDefinition/kuryrportpools.openstack.org",
        "Namespace/kuryr",
        "ServiceAccount/kuryr-controller",
        "ServiceAccount/kuryr-cni",
        "ClusterRole/kuryr-controller",
        "ClusterRoleBinding/kuryr-controller",
        "Role/kuryr-controller",
        "RoleBinding/kuryr-controller",
        "ClusterRole/kuryr-cni",
        "ClusterRoleBinding/kuryr-cni",
        "ConfigMap/kuryr-config",
        "Secret/kuryr-credentials",
        "Deployment/kuryr-controller",
        "PodDisruptionBudget/kuryr-controller",
        "DaemonSet/kuryr-cni",
    ] {
        assert!(kinds.iter().any(|k| k == want), "{want} missing from {kinds:?}");
    }
    // Namespaced objects are in the install's namespace; the config goes in verbatim.
    for d in &docs {
        let kind = d["kind"].as_str().unwrap_or_default();
        if [
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ConfigMap",
            "Secret",
            "Deployment",
            "DaemonSet",
        ]
        .contains(&kind)
        {
            assert_eq!(d["metadata"]["namespace"], "kuryr", "{kind}");
        }
    }
    // The config goes in verbatim but for the credentials, which only the controller gets.
    assert_eq!(
        find(&docs, "ConfigMap", "kuryr-config")["data"]["kuryr.conf"],
        GOOD.replace(
            "password = p\n",
            "# password: in the Secret kuryr-credentials (KURYR__NEUTRON__PASSWORD), read by the controller only\n"
        )
    );
    assert_eq!(
        find(&docs, "Secret", "kuryr-credentials")["stringData"]["KURYR__NEUTRON__PASSWORD"],
        "p"
    );
    let controller =
        &find(&docs, "Deployment", "kuryr-controller")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(controller["envFrom"][0]["secretRef"]["name"], "kuryr-credentials");
    let daemon = &find(&docs, "DaemonSet", "kuryr-cni")["spec"]["template"]["spec"];
    assert!(
        !daemon.to_string().contains("kuryr-credentials"),
        "the CNI daemons never see the credentials"
    );
}

#[test]
fn the_controller_runs_two_leased_replicas_with_probes_on_the_health_port() {
    let docs = docs(&generated(GOOD));
    let d = find(&docs, "Deployment", "kuryr-controller");
    assert_eq!(d["spec"]["replicas"], 2);
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "kuryr-controller");
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["nodeSelector"]["kuryr/enabled"], "true");
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "registry.example/kuryr:1");
    assert!(strings(&c["command"]).contains(&"--identity".to_owned()));
    assert_eq!(c["ports"][0]["containerPort"], 8182);
    assert_eq!(c["ports"][1]["containerPort"], 9654);
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/alive");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "health");
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    let pdb = find(&docs, "PodDisruptionBudget", "kuryr-controller");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"], d["spec"]["selector"],
        "the budget covers the Deployment's pods"
    );
}

#[test]
fn the_cni_daemonset_mounts_only_what_the_daemon_needs() {
    let all = docs(&generated(GOOD));
    let ds = find(&all, "DaemonSet", "kuryr-cni");
    assert_eq!(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], 1);
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["serviceAccountName"], "kuryr-cni");
    let init = &pod["initContainers"][0];
    assert_eq!(strings(&init["command"])[1], "install-cni");
    let daemon = &pod["containers"][0];
    assert_eq!(daemon["securityContext"]["privileged"], true);
    assert_eq!(daemon["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(daemon["ports"][0]["containerPort"], 8190);
    let mounts: Vec<(String, String)> = daemon["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["mountPath"].as_str().unwrap_or_default().to_owned(),
                m["mountPropagation"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        vec![
            ("/etc/kuryr".to_owned(), String::new()),
            ("/host_proc".to_owned(), String::new()),
            ("/var/run".to_owned(), "HostToContainer".to_owned()),
        ]
    );
    let host_paths: Vec<String> = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["hostPath"]["path"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        host_paths,
        ["/proc", "/var/run", "/opt/cni/bin", "/etc/cni/net.d"]
    );
    // A changed kuryr.conf changes the pod template, so the pods restart with it.
    let other = generated(&format!("{GOOD}[vif_pool]\nports_pool_min = 3\n"));
    let other = docs(&other);
    assert_ne!(
        find(&other, "DaemonSet", "kuryr-cni")["spec"]["template"]["metadata"],
        ds["spec"]["template"]["metadata"]
    );
}

/// Each verb of each rule is preceded by a comment saying which call needs it.
#[test]
fn every_granted_verb_is_justified_next_to_its_rule() {
    let files = generated(GOOD);
    let rbac = &files["02-rbac.yaml"];
    for doc in rbac.split("\n---\n") {
        let v: Value = serde_yaml::from_str(doc).expect("YAML");
        if !matches!(v["kind"].as_str(), Some("ClusterRole" | "Role")) {
            continue;
        }
        let comments: Vec<&str> = doc.lines().filter_map(|l| l.strip_prefix("# ")).collect();
        for rule in v["rules"].as_array().into_iter().flatten() {
            let group = strings(&rule["apiGroups"]).concat();
            for resource in strings(&rule["resources"]) {
                let qualified = rbac::qualified(&group, &resource);
                for verb in strings(&rule["verbs"]) {
                    let prefix = format!("{qualified} {verb}: ");
                    assert!(
                        comments
                            .iter()
                            .any(|c| c.starts_with(&prefix) && c.len() > prefix.len()),
                        "{} {qualified} {verb} is not justified",
                        v["kind"]
                    );
                }
            }
        }
    }
}

#[test]
fn a_config_that_cannot_work_in_a_cluster_is_refused_naming_section_and_option() {
    for (change, want) in [
        (("auth_type = password\n", ""), "[neutron] auth_type"),
        (("pod_subnet = s1\n", ""), "[neutron_defaults] pod_subnet"),
        (
            ("netns_proc_dir = /host_proc\n", ""),
            "[cni_daemon] netns_proc_dir",
        ),
        (("controller_ha = True\n", ""), "[kubernetes] controller_ha"),
        (
            ("controller_namespace = kuryr\n", ""),
            "[kubernetes] controller_namespace",
        ),
    ] {
        let ini = GOOD.replace(change.0, change.1);
        let err = render(&opts(), &ini, &config(&ini))
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(err.contains(want), "{want}: {err}");
    }
}

#[test]
fn check_dir_reports_missing_stale_and_extra_files() -> anyhow::Result<()> {
    let files = generated(GOOD);
    let dir = tempfile::tempdir()?;
    assert_eq!(check_dir(dir.path(), &files)?.missing.len(), files.len());
    write_dir(dir.path(), &files)?;
    assert!(check_dir(dir.path(), &files)?.is_clean());
    std::fs::write(dir.path().join("03-config.yaml"), "old")?;
    std::fs::write(dir.path().join("99-old.yaml"), "x")?;
    std::fs::remove_file(dir.path().join("01-namespace.yaml"))?;
    let drift = check_dir(dir.path(), &files)?;
    assert_eq!(drift.changed, ["03-config.yaml"]);
    assert_eq!(drift.extra, ["99-old.yaml"]);
    assert_eq!(drift.missing, ["01-namespace.yaml"]);
    write_dir(dir.path(), &files)?;
    assert!(
        check_dir(dir.path(), &files)?.is_clean(),
        "write_dir removes what is not generated"
    );
    Ok(())
}

/// A test's machine: files by path, one clouds.yaml location.
struct Machine(BTreeMap<&'static str, &'static str>);

impl files::Source for Machine {
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        self.0
            .get(path.to_str().unwrap_or_default())
            .map(|t| t.as_bytes().to_vec())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
    }

    fn clouds_yaml_paths(&self) -> Vec<PathBuf> {
        vec!["/home/op/.config/openstack/clouds.yaml".into()]
    }
}

/// A private CA and a clouds.yaml on the operator's machine reach the controller: carried in a
/// Secret it alone mounts, kuryr.conf and clouds.yaml naming them where it mounts them, the other
/// clouds of the operator's clouds.yaml left out; an unreadable file stops it, naming the option.
#[test]
fn files_kuryr_conf_names_are_carried_to_the_controller() -> anyhow::Result<()> {
    let ini = GOOD.replace(
        "project_domain_name = Default\n",
        "project_domain_name = Default\ncafile = /home/op/ca.pem\n\
         [deployment:edge]\ncloud = edge\npod_subnet = s2\npod_security_groups = sg2\n",
    );
    let machine = Machine(BTreeMap::from([
        ("/home/op/ca.pem", "CA"),
        ("/home/op/edge-ca.pem", "EDGE CA"),
        (
            "/home/op/.config/openstack/clouds.yaml",
            "clouds:\n  edge:\n    auth:\n      auth_url: https://edge:5000/v3\n      username: u\n      password: pw\n\
             \x20     project_name: p\n      user_domain_name: Default\n      project_domain_name: Default\n\
             \x20   cacert: /home/op/edge-ca.pem\n  other:\n    auth:\n      password: not-for-the-cluster\n",
        ),
    ]));
    let files = render_from(&opts(), &ini, &config(&ini), &machine)?;
    let docs = docs(&files);
    let secret = find(&docs, "Secret", files::FILES_SECRET);
    let data = |key: &str| -> String {
        let bytes: k8s_openapi::ByteString = serde_json::from_value(secret["data"][key].clone())
            .unwrap_or_else(|e| panic!("{key} in the Secret: {e}"));
        String::from_utf8(bytes.0).expect("utf-8")
    };
    assert_eq!(data("neutron.cafile"), "CA");
    assert_eq!(data("clouds.edge.cacert"), "EDGE CA");
    let clouds = data("clouds.yaml");
    assert!(!clouds.contains("not-for-the-cluster"), "{clouds}");
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("clouds.yaml"), &clouds)?;
    let edge = kuryr_neutron::auth::load_cloud_from(&dir.path().join("clouds.yaml"), Some("edge"))?;
    assert_eq!(
        edge.cafile.as_deref(),
        Some(Path::new("/etc/kuryr-openstack/clouds.edge.cacert"))
    );

    let conf = find(&docs, "ConfigMap", "kuryr-config")["data"]["kuryr.conf"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let parsed = kuryr_config::Ini::parse(&conf, "kuryr.conf")?;
    let cafile = parsed
        .options("neutron")
        .find(|(k, _)| *k == "cafile")
        .map(|(_, v)| v.value.clone());
    assert_eq!(cafile.as_deref(), Some("/etc/kuryr-openstack/neutron.cafile"));
    assert!(!conf.contains("cafile = /home/op/ca.pem"), "{conf}");

    let pod = &find(&docs, "Deployment", "kuryr-controller")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert!(
        container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == "openstack-files" && m["mountPath"] == files::FILES_DIR)
    );
    assert!(
        container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["name"] == "OS_CLIENT_CONFIG_FILE" && e["value"] == "/etc/kuryr-openstack/clouds.yaml")
    );
    let daemon = &find(&docs, "DaemonSet", "kuryr-cni")["spec"]["template"]["spec"];
    assert!(
        !daemon["volumes"].to_string().contains(files::FILES_SECRET),
        "the CNI daemons never call OpenStack and never get the files"
    );

    for (gone, want) in [
        ("/home/op/ca.pem", "[neutron] cafile = /home/op/ca.pem"),
        ("/home/op/edge-ca.pem", "clouds.edge.cacert"),
        (
            "/home/op/.config/openstack/clouds.yaml",
            "[deployment:edge] cloud = edge",
        ),
    ] {
        let mut m = Machine(machine.0.clone());
        m.0.remove(gone);
        let err = render_from(&opts(), &ini, &config(&ini), &m)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(err.contains(want), "{want}: {err}");
    }
    Ok(())
}

/// The plugin finds a daemon moved off its built-in address: install-cni writes it into the conflist.
#[test]
fn a_daemon_moved_to_another_port_is_named_to_the_plugin() {
    let init = |ini: &str| -> Vec<String> {
        let files = generated(ini);
        let docs = docs(&files);
        strings(
            &find(&docs, "DaemonSet", "kuryr-cni")["spec"]["template"]["spec"]["initContainers"][0]["command"],
        )
    };
    assert!(!init(GOOD).iter().any(|a| a == "--kuryr-daemon"));
    let moved = GOOD.replace("[cni_daemon]\n", "[cni_daemon]\nbind_address = 127.0.0.1:5037\n");
    let command = init(&moved);
    let at = command.iter().position(|a| a == "--kuryr-daemon");
    assert_eq!(
        at.and_then(|i| command.get(i + 1)).map(String::as_str),
        Some("http://127.0.0.1:5037"),
        "{command:?}"
    );
}

/// `[DEFAULT]`'s file options (every section falls back to them) are carried too, and an empty
/// `cloud` is no cloud, as the services read it.
#[test]
fn default_section_files_are_carried_and_an_empty_cloud_is_none() -> anyhow::Result<()> {
    let ini = format!(
        "[DEFAULT]\ncafile = /home/op/ca.pem\n{}",
        GOOD.replace("[neutron]\n", "[neutron]\ncloud =\n")
    );
    let machine = Machine(BTreeMap::from([("/home/op/ca.pem", "CA")]));
    let files = render_from(&opts(), &ini, &config(&ini), &machine)?;
    let docs = docs(&files);
    let secret = find(&docs, "Secret", files::FILES_SECRET);
    assert!(secret["data"]["DEFAULT.cafile"].is_string(), "{secret}");
    assert!(secret["data"]["clouds.yaml"].is_null(), "{secret}");
    let conf = find(&docs, "ConfigMap", "kuryr-config")["data"]["kuryr.conf"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        conf.contains("cafile = /etc/kuryr-openstack/DEFAULT.cafile"),
        "{conf}"
    );
    // A cloud name no Secret key can carry is refused at generation, not by the API server.
    let named = GOOD.replace("[neutron]\n", "[neutron]\ncloud = my cloud\n");
    let err = render_from(&opts(), &named, &config(&named), &machine)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        err.contains("cloud = my cloud") && err.contains("Secret keys"),
        "{err}"
    );
    Ok(())
}
