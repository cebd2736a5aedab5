//! `kuryr status` against a Kubernetes emulator cluster and a Neutron emulator: a cluster seeded
//! with every problem it checks for fails naming each, a clean one passes with exit code 0.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use kube_emulator::{KubeEmulator, KubeHandle, KubeOptions};
use kuryr_neutron::{ClientOptions, NeutronClient, QuotaUpdate};
use neutron_emulator::{Emulator, EmulatorOptions};
use serde_json::json;

const PROJECT: &str = "p-kuryr";

async fn cluster() -> (KubeHandle, Client) {
    let handle = KubeEmulator::start(KubeOptions {
        nodes: vec!["n1".into(), "n2".into(), "n3".into()],
        ..KubeOptions::default()
    })
    .await
    .expect("kube emulator starts");
    let kubeconfig = Kubeconfig::from_yaml(&handle.kubeconfig()).expect("kubeconfig parses");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    let client = Client::try_from(config).expect("kube client");
    (handle, client)
}

/// Installs kuryr-rs' CRDs but `skip`, each through `adjust` first.
async fn install_crds(client: &Client, skip: &str, adjust: impl Fn(&mut CustomResourceDefinition)) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for mut crd in kuryr_crds::generate::crds() {
        if crd.metadata.name.as_deref() == Some(skip) {
            continue;
        }
        adjust(&mut crd);
        api.create(&PostParams::default(), &crd)
            .await
            .expect("CRD created");
    }
}

/// The KuryrLoadBalancer CRD as upstream's (no `spec.listener_acls`): the API server drops the field.
fn upstream_klb(crd: &mut CustomResourceDefinition) {
    if crd.metadata.name.as_deref() != Some("kuryrloadbalancers.openstack.org") {
        return;
    }
    for v in &mut crd.spec.versions {
        let spec = v
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("spec"))
            .and_then(|s| s.properties.as_mut());
        if let Some(props) = spec {
            props.remove("listener_acls");
        }
    }
}

fn conf(neutron_url: &str, pool: &str) -> String {
    format!(
        "[kubernetes]\nvif_pool_driver = neutron\n\
         [neutron]\nauth_type = noauth\nendpoint_override = {neutron_url}\n\
         [neutron_defaults]\nproject = {PROJECT}\npod_subnet = s\npod_security_groups = sg\n\
         [vif_pool]\n{pool}\n"
    )
}

async fn status(handle: &KubeHandle, dir: &Path, conf: &str) -> (i32, String) {
    let kubeconfig = dir.join("kubeconfig");
    handle.write_kubeconfig(&kubeconfig).expect("kubeconfig written");
    let conf_path = dir.join("kuryr.conf");
    std::fs::write(&conf_path, conf).expect("kuryr.conf written");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kuryr"))
        .arg("status")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--config-file")
        .arg(&conf_path)
        .output()
        .await
        .expect("kuryr status runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
}

async fn neutron_with_port_quota(limit: i64) -> neutron_emulator::EmulatorHandle {
    let neutron = Emulator::start(EmulatorOptions::default())
        .await
        .expect("neutron emulator starts");
    let client = NeutronClient::new(&ClientOptions::noauth(neutron.url())).expect("neutron client");
    client
        .update_quota(
            PROJECT,
            &QuotaUpdate {
                port: Some(limit),
                ..QuotaUpdate::default()
            },
        )
        .await
        .expect("quota set");
    neutron
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_cluster_fails_naming_each_problem() {
    let neutron = neutron_with_port_quota(4).await;
    let (handle, client) = cluster().await;
    install_crds(&client, "kuryrportpools.openstack.org", upstream_klb).await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "old", "namespace": "default",
                     "annotations": {"openstack.org/kuryr-vif": "{\"versioned_object.data\": {}}"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
    let kp_resource = ApiResource {
        group: "openstack.org".into(),
        version: "v1".into(),
        api_version: "openstack.org/v1".into(),
        kind: "KuryrPort".into(),
        plural: "kuryrports".into(),
    };
    let mut kp = DynamicObject::new("web", &kp_resource).within("default");
    kp.data = json!({
        "spec": {"podUid": "u-1", "podNodeName": "n1"},
        "status": {"vifs": {"eth0": {"default": true, "vif": {"versioned_object.data": {"id": "port-1"}}}}}
    });
    Api::<DynamicObject>::namespaced_with(client.clone(), "default", &kp_resource)
        .create(&PostParams::default(), &kp)
        .await
        .expect("upstream KuryrPort created");

    // Another cluster (an upstream one upgraded first, at the default id) holds the cluster_id.
    NeutronClient::new(&ClientOptions::noauth(neutron.url()))
        .expect("neutron client")
        .create_security_group(&kuryr_neutron::SecurityGroupCreate {
            name: kuryr_controller::cluster_claim::group_name("kubernetes"),
            project_id: Some(PROJECT.into()),
            description: Some(format!(
                "{}another-cluster",
                kuryr_controller::cluster_claim::DESCRIPTION_PREFIX
            )),
            ..Default::default()
        })
        .await
        .expect("claim created");

    let dir = tempfile::tempdir().expect("tempdir");
    // min above max, and 3 nodes x 2 ports above the quota of 4; a deployment without credentials.
    let conf = conf(
        &neutron.url(),
        "ports_pool_min = 2\nports_pool_max = 1\nports_pool_batch = 1",
    ) + "[deployment:east]\npod_subnet = s2\n";
    let (code, out) = status(&handle, dir.path(), &conf).await;
    assert_eq!(code, 2, "{out}");
    for want in [
        "Failure  Pod annotations",
        "default/old",
        "missing: kuryrportpools.openstack.org",
        "Failure  CRD fields",
        "kuryrloadbalancers.openstack.org lacks spec.listener_acls",
        "1 KuryrPort(s) recorded by upstream",
        "default/web",
        "ports_pool_min = 2 is above ports_pool_max = 1",
        "pre-creates 6 ports, but the port quota leaves 4",
        "[deployment:east] auth_type",
        "Failure  cluster_id claim",
        "claimed by another Kubernetes cluster",
        "result: Failure",
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
    handle.shutdown().await.expect("kube emulator stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_cluster_passes() {
    let neutron = neutron_with_port_quota(100).await;
    let (handle, client) = cluster().await;
    install_crds(&client, "", |_| {}).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, out) = status(
        &handle,
        dir.path(),
        &conf(&neutron.url(), "ports_pool_min = 5\nports_pool_max = 20"),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("Success")).count(),
        7,
        "{out}"
    );
    assert!(out.contains("result: Success"), "{out}");
    assert!(out.contains("cluster_id \"kubernetes\" is free"), "{out}");
    handle.shutdown().await.expect("kube emulator stops");
}
