//! RBAC enforcement: requests with ServiceAccount tokens are authorized against the stored roles
//! and bindings, here the ones `kuryr manifests` generates (deploy/manifests/02-rbac.yaml).

use std::path::Path;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use kube_emulator::{KubeEmulator, KubeHandle, KubeOptions};
use serde_json::{Value, json};

const ADMIN: &str = "admin-token";

async fn client(handle: &KubeHandle, token: &str) -> Client {
    let kubeconfig = Kubeconfig::from_yaml(&handle.kubeconfig()).expect("kubeconfig parses");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    config.auth_info.token = Some(token.to_owned().into());
    Client::try_from(config).expect("client")
}

fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n---\n")
        .filter_map(|d| serde_yaml::from_str::<Value>(d).ok())
        .filter(|v| v.is_object())
        .collect()
}

fn plural(kind: &str) -> String {
    match kind {
        "ServiceAccount" => "serviceaccounts".into(),
        "ClusterRole" => "clusterroles".into(),
        "ClusterRoleBinding" => "clusterrolebindings".into(),
        "Role" => "roles".into(),
        "RoleBinding" => "rolebindings".into(),
        "Namespace" => "namespaces".into(),
        other => panic!("unexpected kind {other}"),
    }
}

async fn create(admin: &Client, doc: &Value) {
    let api_version = doc["apiVersion"].as_str().expect("apiVersion");
    let kind = doc["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural(kind),
    };
    let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("object");
    let api: Api<DynamicObject> = match doc.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
        None => Api::all_with(admin.clone(), &ar),
    };
    api.create(&PostParams::default(), &obj).await.expect("created");
}

fn forbidden(err: kube::Error) -> String {
    match err {
        kube::Error::Api(e) if e.code == 403 && e.reason == "Forbidden" => e.message,
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_accounts_get_exactly_what_the_generated_roles_grant() {
    let handle = KubeEmulator::start(KubeOptions {
        token: Some(ADMIN.into()),
        rbac: true,
        ..KubeOptions::default()
    })
    .await
    .expect("emulator starts");
    let admin = client(&handle, ADMIN).await;
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in docs(&deploy.join("manifests/00-crds.yaml")) {
        crds.create(&PostParams::default(), &serde_json::from_value(crd).expect("crd"))
            .await
            .expect("CRD created");
    }
    for doc in docs(&deploy.join("manifests/01-namespace.yaml"))
        .iter()
        .chain(&docs(&deploy.join("manifests/02-rbac.yaml")))
    {
        create(&admin, doc).await;
    }

    // The CNI daemon: lists pods and KuryrPorts cluster-wide, writes neither, reads no ConfigMap.
    let cni = client(&handle, &handle.service_account_token("kuryr", "kuryr-cni")).await;
    Api::<Pod>::all(cni.clone())
        .list(&ListParams::default())
        .await
        .expect("the daemon lists pods");
    let kps = ApiResource {
        group: "openstack.org".into(),
        version: "v1".into(),
        api_version: "openstack.org/v1".into(),
        kind: "KuryrPort".into(),
        plural: "kuryrports".into(),
    };
    Api::<DynamicObject>::all_with(cni.clone(), &kps)
        .list(&ListParams::default())
        .await
        .expect("the daemon lists KuryrPorts");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}))
    .expect("pod");
    let msg = forbidden(
        Api::<Pod>::namespaced(cni.clone(), "default")
            .create(&PostParams::default(), &pod)
            .await
            .expect_err("the daemon creates no pod"),
    );
    assert_eq!(
        msg,
        "pods is forbidden: User \"system:serviceaccount:kuryr:kuryr-cni\" cannot create resource \"pods\" \
         in API group \"\" in the namespace \"default\""
    );
    forbidden(
        Api::<ConfigMap>::namespaced(cni.clone(), "kuryr")
            .get("kuryr-config")
            .await
            .expect_err("the daemon reads no ConfigMap"),
    );

    // The controller: its Lease only in its own namespace (a Role, not a ClusterRole).
    let controller = client(
        &handle,
        &handle.service_account_token("kuryr", "kuryr-controller"),
    )
    .await;
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "kuryr-controller"}})).expect("lease");
    Api::<Lease>::namespaced(controller.clone(), "kuryr")
        .create(&PostParams::default(), &lease)
        .await
        .expect("the controller creates its Lease");
    forbidden(
        Api::<Lease>::namespaced(controller.clone(), "default")
            .create(&PostParams::default(), &lease)
            .await
            .expect_err("no Lease outside its namespace"),
    );
    Api::<Pod>::all(controller.clone())
        .list(&ListParams::default())
        .await
        .expect("the controller lists pods");

    // A permission removed from the ClusterRole is gone at the next request.
    let roles: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &ApiResource {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: "ClusterRole".into(),
            plural: "clusterroles".into(),
        },
    );
    let mut role = roles.get("kuryr-cni").await.expect("role");
    if let Some(rules) = role.data.get_mut("rules").and_then(Value::as_array_mut) {
        rules.retain(|r| r["resources"] != json!(["pods"]));
    }
    roles
        .replace("kuryr-cni", &PostParams::default(), &role)
        .await
        .expect("role updated");
    let msg = forbidden(
        Api::<Pod>::all(cni.clone())
            .list(&ListParams::default())
            .await
            .expect_err("pods list was removed"),
    );
    assert!(
        msg.ends_with("cannot list resource \"pods\" in API group \"\" at the cluster scope"),
        "{msg}"
    );

    // Unknown tokens are not authenticated at all.
    let stranger = client(&handle, "nobody").await;
    match Api::<Pod>::all(stranger).list(&ListParams::default()).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 401),
        other => panic!("expected 401, got {other:?}"),
    }
    handle.shutdown().await.expect("clean shutdown");
}
