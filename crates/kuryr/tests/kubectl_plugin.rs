//! The `kubectl kuryr` plugin run by the real kubectl (found on PATH as `kubectl-kuryr`) and as
//! `kuryr kubectl`, against a Kubernetes emulator seeded with a wired pod, a pool and bindings.

use std::path::{Path, PathBuf};
use std::process::Output;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use kube_emulator::{KubeEmulator, KubeHandle, KubeOptions};
use serde_json::{Value, json};

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "openstack.org".into(),
        version: "v1".into(),
        api_version: "openstack.org/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn seeded() -> (KubeHandle, Client) {
    let handle = KubeEmulator::start(KubeOptions::default())
        .await
        .expect("kube emulator starts");
    let kubeconfig = Kubeconfig::from_yaml(&handle.kubeconfig()).expect("kubeconfig parses");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    let client = Client::try_from(config).expect("kube client");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in kuryr_crds::generate::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("CRD created");
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "kuryr"}})).expect("ns");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
    let post = PostParams::default();
    let kp_res = resource("KuryrPort", "kuryrports");
    let mut kp = DynamicObject::new("web", &kp_res).within("default");
    kp.data = json!({
        "spec": {"podUid": "u-1", "podNodeName": "n1"},
        "status": {"vifs": {"eth0": {"default": true, "kuryrRsOrigin": {"pool": {"name": "n1-pool"}}, "vif": {
            "versioned_object.name": "VIFOpenVSwitch",
            "versioned_object.data": {"id": "port-web", "address": "fa:16:3e:00:00:07", "active": true,
                "vif_name": "tapweb", "network": {"versioned_object.data": {"subnets": {"versioned_object.data": {
                    "objects": [{"versioned_object.data": {"ips": {"versioned_object.data": {"objects": [
                        {"versioned_object.data": {"address": "10.0.0.7"}}]}}}}]}}}}}}}}}
    });
    Api::<DynamicObject>::namespaced_with(client.clone(), "default", &kp_res)
        .create(&post, &kp)
        .await
        .expect("KuryrPort created");
    let pool_res = resource("KuryrPortPool", "kuryrportpools");
    let mut pool = DynamicObject::new("n1-pool", &pool_res).within("kuryr");
    pool.data = json!({"spec": {"key": {"deployment": "default", "host": "n1", "projectId": "p",
        "networkId": "net", "subnetId": "sub-1", "securityGroupIds": ["sg"]}, "min": 2, "batch": 4, "max": 0}});
    Api::<DynamicObject>::namespaced_with(client.clone(), "kuryr", &pool_res)
        .create(&post, &pool)
        .await
        .expect("pool created");
    let kpb_res = resource("KuryrProjectBinding", "kuryrprojectbindings");
    let mut kpb = DynamicObject::new("p", &kpb_res);
    kpb.data = json!({"spec": {"projectId": "p"}});
    let kpbs = Api::<DynamicObject>::all_with(client.clone(), &kpb_res);
    kpbs.create(&post, &kpb).await.expect("binding created");
    // The status subresource: written apart from the object, as the controller does.
    let status = json!({"status": {"deployment": "default",
        "history": [{"deployment": "default", "boundAt": "2026-11-24T00:00:00Z"}]}});
    kpbs.patch_status(
        "p",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&status),
    )
    .await
    .expect("bindings created");
    (handle, client)
}

/// A PATH directory holding `kubectl-kuryr` -> the built `kuryr`.
fn plugin_dir(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kuryr"), bin.join("kubectl-kuryr")).expect("symlink");
    bin
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_runs_the_plugin_and_kuryr_kubectl_takes_kubectl_flags() {
    let (handle, _client) = seeded().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    handle.write_kubeconfig(&kubeconfig).expect("kubeconfig written");
    let bin = plugin_dir(dir.path());
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let kc = kubeconfig.display().to_string();

    // Through the real kubectl, which finds `kubectl-kuryr` on PATH.
    let kubectl = |args: &[&str]| {
        let mut full = vec!["kuryr", "--kubeconfig", kc.as_str()];
        full.extend_from_slice(args);
        std::process::Command::new("kubectl")
            .args(&full)
            .env("PATH", &path)
            .env_remove("KUBECONFIG")
            .output()
    };
    let out = match kubectl(&["get", "vif", "web", "-n", "default", "-o", "wide"]) {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var("KURYR_TEST_REQUIRE_KUBECTL").as_deref() != Ok("1"),
                "kubectl is not on PATH"
            );
            eprintln!("skipping: kubectl is not on PATH");
            return;
        }
        Err(e) => panic!("kubectl: {e}"),
    };
    let table = text(&out);
    assert!(out.status.success(), "{table}");
    let header = table.lines().next().unwrap_or_default();
    for col in ["INTERFACE", "PORT", "MAC", "IPS", "ACTIVE", "TYPE", "ORIGIN"] {
        assert!(header.contains(col), "{table}");
    }
    let row = table.lines().nth(1).unwrap_or_default();
    for cell in [
        "eth0",
        "port-web",
        "fa:16:3e:00:00:07",
        "10.0.0.7",
        "true",
        "VIFOpenVSwitch",
        "pool",
    ] {
        assert!(row.contains(cell), "{cell}: {table}");
    }

    let out = kubectl(&["get", "vif", "web", "--namespace", "default", "-o", "json"]).expect("kubectl runs");
    assert!(out.status.success(), "{}", text(&out));
    let vifs: Value = serde_json::from_slice(&out.stdout).expect("json output");
    assert_eq!(vifs["eth0"]["vif"]["versioned_object.data"]["id"], "port-web");

    let out = kubectl(&["pools"]).expect("kubectl runs");
    let pools = text(&out);
    assert!(out.status.success(), "{pools}");
    assert!(
        pools
            .lines()
            .any(|l| l.starts_with("n1-pool") && l.contains("sub-1")),
        "{pools}"
    );

    let out = kubectl(&["bindings", "-o", "yaml"]).expect("kubectl runs");
    let yaml = text(&out);
    assert!(out.status.success(), "{yaml}");
    assert!(
        yaml.contains("kind: KuryrProjectBinding")
            && yaml.contains("deployment: default")
            && yaml.contains("projectId: p"),
        "{yaml}"
    );

    let out = kubectl(&["get", "vif", "nope", "-n", "default"]).expect("kubectl runs");
    assert!(!out.status.success());
    assert!(
        text(&out).contains("pod default/nope has no KuryrPort"),
        "{}",
        text(&out)
    );

    // `kuryr kubectl` with --context (the emulator's context name) and $KUBECONFIG.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kuryr"))
        .args([
            "kubectl",
            "--context",
            "kube-emulator",
            "status",
            "--skip-neutron",
            "-n",
            "kuryr",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .expect("kuryr runs");
    let status = text(&out);
    // No ConfigMap with kuryr.conf in this cluster: the config checks warn.
    assert_eq!(out.status.code(), Some(1), "{status}");
    assert!(status.contains("Success  CRD versions"), "{status}");
    assert!(status.contains("no kuryr.conf: not checked"), "{status}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kuryr"))
        .args(["kubectl", "--context", "no-such-context", "pools"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .expect("kuryr runs");
    assert!(!out.status.success(), "{}", text(&out));

    handle.shutdown().await.expect("kube emulator stops");
}

/// `kuryr kubectl deployments` (list, maintenance) and `bindings pin|move`, on the objects the
/// controller follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_and_bindings_are_administered_through_the_api() {
    let (handle, client) = seeded().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    handle.write_kubeconfig(&kubeconfig).expect("kubeconfig written");
    let kc = kubeconfig.display().to_string();
    let kuryr = |args: &[&str]| {
        let mut full = vec!["kubectl", "--kubeconfig", kc.as_str()];
        full.extend_from_slice(args);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kuryr"))
            .args(&full)
            .output()
            .expect("kuryr runs");
        (out.status.success(), text(&out))
    };
    let kosd_res = resource("KuryrOpenStackDeployment", "kuryropenstackdeployments");
    let kosds = Api::<DynamicObject>::all_with(client.clone(), &kosd_res);
    for name in ["default", "west"] {
        let mut o = DynamicObject::new(name, &kosd_res);
        o.data = json!({"spec": {"availabilityZone": "az1"}});
        kosds.create(&PostParams::default(), &o).await.expect("kosd");
    }
    let (ok, out) = kuryr(&[
        "deployments",
        "maintenance",
        "default",
        "on",
        "--reason",
        "upgrade",
        "--move-existing",
    ]);
    assert!(ok, "{out}");
    let spec = kosds.get("default").await.expect("kosd").data["spec"].clone();
    assert_eq!(spec["maintenance"], json!({"enabled": true, "reason": "upgrade"}));
    assert_eq!(spec["moveExisting"], json!(true));
    let (ok, out) = kuryr(&["deployments", "-o", "wide"]);
    assert!(ok, "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("default"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        row.contains("az1") && row.contains("true") && row.contains("upgrade"),
        "{out}"
    );

    let (ok, out) = kuryr(&["bindings", "move", "p", "--to", "west"]);
    assert!(ok, "{out}");
    let (ok, out) = kuryr(&["bindings", "pin", "p"]);
    assert!(ok, "{out}");
    let kpb = Api::<DynamicObject>::all_with(
        client.clone(),
        &resource("KuryrProjectBinding", "kuryrprojectbindings"),
    )
    .get("p")
    .await
    .expect("kpb");
    assert_eq!(kpb.data["spec"]["pinned"], json!(true));
    assert_eq!(kpb.data["status"]["deployment"], json!("west"));
    assert_eq!(
        kpb.data["status"]["history"][1]["why"],
        json!("moved by an operator")
    );
    assert!(kpb.data["status"]["history"][0]["unboundAt"].is_string());
    // The move is an Event on the binding object, as the controller's own moves are.
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("events");
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("ProjectMoved")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("p")
                && e.note.as_deref().unwrap_or("").contains("to west by an operator")),
        "{:?}",
        events.items
    );
    // list (one row per binding), show (the binding and its history), history (rows), also as
    // top-level `kuryr bindings`.
    let (ok, out) = kuryr(&["bindings"]);
    assert!(ok, "{out}");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 2, "header and one binding: {out}");
    assert!(
        rows[0].starts_with("PROJECT") && rows[0].ends_with("PINNED"),
        "{out}"
    );
    assert!(
        rows[1].starts_with("p ") && rows[1].contains("west") && rows[1].ends_with("true"),
        "{out}"
    );
    let (ok, out) = kuryr(&["bindings", "show", "p"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("Deployment: west\n") && out.contains("Pinned:     true\n"),
        "{out}"
    );
    assert!(out.contains("moved by an operator"), "{out}");
    let (ok, history) = kuryr(&["bindings", "history", "p"]);
    assert!(ok, "{history}");
    assert_eq!(history.lines().count(), 3, "header and two periods: {history}");
    let top = std::process::Command::new(env!("CARGO_BIN_EXE_kuryr"))
        .args(["bindings", "--kubeconfig", kc.as_str(), "history", "p"])
        .output()
        .expect("kuryr runs");
    assert!(top.status.success(), "{}", text(&top));
    assert_eq!(
        String::from_utf8_lossy(&top.stdout),
        history,
        "`kuryr bindings` is the same command"
    );
    let (ok, out) = kuryr(&["bindings", "history", "nobody"]);
    assert!(ok && out.contains("No project bindings found"), "{out}");
    let (ok, out) = kuryr(&["bindings", "show", "nobody"]);
    assert!(!ok && out.contains("no KuryrProjectBinding"), "{out}");

    // A maintenance window with an end: `--until` takes a duration from now; off clears it.
    let (ok, out) = kuryr(&["deployments", "maintenance", "west", "on", "--until", "2h"]);
    assert!(ok, "{out}");
    let until = kosds.get("west").await.expect("kosd").data["spec"]["maintenance"]["until"].clone();
    let until: k8s_openapi::jiff::Timestamp = until.as_str().unwrap_or_default().parse().expect("RFC 3339");
    let left = until
        .duration_since(k8s_openapi::jiff::Timestamp::now())
        .as_secs();
    assert!((7_000..=7_200).contains(&left), "{left} s left");
    let (ok, out) = kuryr(&["deployments"]);
    assert!(
        ok && out.lines().next().unwrap_or_default().contains("UNTIL"),
        "{out}"
    );
    let (ok, out) = kuryr(&["deployments", "maintenance", "west", "off"]);
    assert!(ok, "{out}");
    let spec = kosds.get("west").await.expect("kosd").data["spec"].clone();
    assert_eq!(spec["maintenance"], json!({"enabled": false}), "until cleared");
    let (ok, out) = kuryr(&["deployments", "maintenance", "west", "on", "--until", "soon"]);
    assert!(!ok && out.contains("--until \"soon\""), "{out}");

    let (ok, out) = kuryr(&["bindings", "move", "p", "--to", "nowhere"]);
    assert!(!ok && out.contains("--to nowhere"), "{out}");
    let (ok, out) = kuryr(&["bindings", "pin", "p", "--zone", "a:b"]);
    assert!(!ok && out.contains("--zone: \"a:b\""), "{out}");
}

/// `kuryr kubectl status` on an install `kuryr manifests` made: its ConfigMap's kuryr.conf has no
/// credentials (they are in the controller's Secret), and the config checks still run on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_an_installed_config_whose_credentials_are_in_the_secret() {
    let (handle, client) = seeded().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("kuryr.conf");
    std::fs::write(
        &conf,
        "[kubernetes]\nenabled_handlers = vif,kuryrport\ncontroller_namespace = kuryr\ncontroller_ha = True\n\
         [cni_daemon]\nnetns_proc_dir = /host_proc\n\
         [neutron]\nauth_type = password\nauth_url = https://keystone:5000/v3\nusername = kuryr\npassword = s3cret\n\
         user_domain_name = Default\nproject_name = service\nproject_domain_name = Default\n\
         [neutron_defaults]\nproject = p\npod_subnet = s\npod_security_groups = sg\nservice_subnet = svc\n",
    )
    .expect("kuryr.conf written");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kuryr"))
        .args(["manifests", "--config-file"])
        .arg(&conf)
        .output()
        .expect("kuryr runs");
    assert!(out.status.success(), "{}", text(&out));
    let docs: Vec<Value> = serde_yaml::Deserializer::from_slice(&out.stdout)
        .filter_map(|d| serde_yaml::with::singleton_map_recursive::deserialize(d).ok())
        .collect::<Vec<Value>>();
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("a ConfigMap")
        .clone();
    let installed = cm["data"]["kuryr.conf"].as_str().unwrap_or_default().to_owned();
    assert!(!installed.contains("s3cret"), "{installed}");
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(cm).expect("ConfigMap");
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "kuryr")
        .create(&PostParams::default(), &cm)
        .await
        .expect("ConfigMap created");

    let kubeconfig = dir.path().join("kubeconfig");
    handle.write_kubeconfig(&kubeconfig).expect("kubeconfig written");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kuryr"))
        .args(["kubectl", "status", "--skip-neutron", "-n", "kuryr"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .expect("kuryr runs");
    let status = text(&out);
    assert!(
        status.contains("1 OpenStack deployment(s) with credentials"),
        "{status}"
    );
    handle.shutdown().await.expect("kube emulator stops");
}
