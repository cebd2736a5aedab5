//! The controller and two CNI daemons' Kubernetes clients run with the tokens of the
//! ServiceAccounts `kuryr manifests` generates, on a Kubernetes emulator that enforces RBAC with
//! the generated roles, and wire a pod. A permission the code needs but the roles lack stops the
//! wiring here (the emulator answers 403), not on a user's cluster.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use kube_emulator::{KubeEmulator, KubeHandle, KubeOptions};
use kuryr_daemon::registry::{PodKey, Registry};
use kuryr_testbed::{NODES, create_pod, eventually, neutron_fixture, neutron_targets};
use serde_json::{Value, json};

const ADMIN: &str = "admin";

async fn client(handle: &KubeHandle, token: &str) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::from_yaml(&handle.kubeconfig())?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.auth_info.token = Some(token.to_owned().into());
    Ok(Client::try_from(config)?)
}

fn resource_of(doc: &Value) -> anyhow::Result<ApiResource> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let plural = match kind {
        "CustomResourceDefinition" => "customresourcedefinitions",
        "Namespace" => "namespaces",
        "ServiceAccount" => "serviceaccounts",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "ConfigMap" => "configmaps",
        "Secret" => "secrets",
        "Deployment" => "deployments",
        "PodDisruptionBudget" => "poddisruptionbudgets",
        "DaemonSet" => "daemonsets",
        other => anyhow::bail!("unexpected kind {other} in the generated manifests"),
    };
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Ok(ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    })
}

/// `kuryr manifests` for `conf`, applied by the cluster admin; returns the documents.
async fn install(admin: &Client, conf: &str) -> anyhow::Result<Vec<Value>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("kuryr.conf");
    std::fs::write(&path, conf)?;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kuryr"))
        .arg("manifests")
        .arg("--config-file")
        .arg(&path)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "kuryr manifests: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut docs = Vec::new();
    for doc in text.split("\n---\n") {
        let Ok(value) = serde_yaml::from_str::<Value>(doc) else {
            continue;
        };
        if !value.is_object() {
            continue;
        }
        let ar = resource_of(&value)?;
        let obj: DynamicObject = serde_json::from_value(value.clone())?;
        let api: Api<DynamicObject> = match value.pointer("/metadata/namespace").and_then(Value::as_str) {
            Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
            None => Api::all_with(admin.clone(), &ar),
        };
        api.create(&PostParams::default(), &obj).await?;
        docs.push(value);
    }
    Ok(docs)
}

/// A Kubernetes emulator enforcing RBAC with `kuryr manifests` for `conf` applied by its admin.
struct Installed {
    handle: KubeHandle,
    admin: Client,
    docs: Vec<Value>,
    /// With the controller ServiceAccount's token.
    controller_client: Client,
}

async fn installed(conf: &str) -> anyhow::Result<Installed> {
    let handle = KubeEmulator::start(KubeOptions {
        token: Some(ADMIN.into()),
        rbac: true,
        nodes: NODES.iter().map(|n| n.to_string()).collect(),
        ..KubeOptions::default()
    })
    .await?;
    let admin = client(&handle, ADMIN).await?;
    let docs = install(&admin, conf).await?;
    let controller_client = client(
        &handle,
        &handle.service_account_token("kuryr", "kuryr-controller"),
    )
    .await?;
    Ok(Installed {
        handle,
        admin,
        docs,
        controller_client,
    })
}

/// (verb, group, resource) the generated roles bound to `account` grant.
fn granted(docs: &[Value], account: &str) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if !matches!(kind, "ClusterRole" | "Role") || doc["metadata"]["name"] != account {
            continue;
        }
        for rule in doc["rules"].as_array().into_iter().flatten() {
            let strings = |f: &str| -> Vec<String> {
                rule[f]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            };
            for group in strings("apiGroups") {
                for resource in strings("resources") {
                    for verb in strings("verbs") {
                        out.insert((verb, group.clone(), resource.clone()));
                    }
                }
            }
        }
    }
    out
}

fn active_vif(kp: &DynamicObject) -> bool {
    kp.data
        .pointer("/status/vifs/eth0/vif/versioned_object.data/active")
        .and_then(Value::as_bool)
        == Some(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controller_and_two_daemons_wire_a_pod_with_the_generated_service_accounts() -> anyhow::Result<()> {
    let targets = neutron_targets().await?;
    let neutron = &targets[0];
    let fx = neutron_fixture(&neutron.client, "10.78.0.0/24").await?;
    let cluster_id = format!("rbac-{}", uuid::Uuid::new_v4().simple());
    // The `namespace` groups driver: its orphan sweep lists Namespaces. A group of a namespace
    // that is gone (a crash, a namespace deleted while no controller ran) is swept below.
    let orphan = neutron
        .client
        .create_security_group(&kuryr_neutron::SecurityGroupCreate {
            name: "ns/gone-sg".into(),
            project_id: Some(fx.project.clone()),
            ..Default::default()
        })
        .await?;
    neutron
        .client
        .replace_tags(
            kuryr_neutron::Taggable::SecurityGroup,
            &orphan.id,
            &[
                "kuryr-rs.namespace=gone".to_string(),
                kuryr_crds::names::neutron::cluster_tag(&cluster_id),
            ],
        )
        .await?;
    let conf = format!(
        "[kubernetes]\ncontroller_namespace = kuryr\ncontroller_ha = True\nenabled_handlers = vif,kuryrport\n\
         pod_vif_driver = neutron-vif\nvif_pool_driver = noop\ncluster_id = {cluster_id}\n\
         pod_security_groups_driver = namespace\n\
         [neutron]\nauth_type = noauth\nendpoint_override = {}\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\n\
         [cni_daemon]\nnetns_proc_dir = /host_proc\n",
        neutron.url, fx.project, fx.subnet, fx.sg
    );
    let Installed {
        handle,
        admin,
        docs,
        controller_client,
    } = installed(&conf).await?;
    let controller = kuryr_testbed::start_controller(
        &controller_client,
        neutron,
        kuryr_testbed::config(&conf),
        "kuryr-controller-0",
    );
    let mut daemons = Vec::new();
    let mut registries = Vec::new();
    for node in NODES {
        let cni_client = client(&handle, &handle.service_account_token("kuryr", "kuryr-cni")).await?;
        let registry = Arc::new(Registry::new());
        daemons.push(tokio::spawn(kuryr_daemon::kube::watch_kuryrports(
            cni_client.clone(),
            node,
            registry.clone(),
            Arc::new(kuryr_daemon::kube::KubeEvents::new(
                cni_client.clone(),
                node,
                true,
            )),
        )));
        daemons.push(tokio::spawn(kuryr_daemon::kube::watch_pods(
            cni_client,
            node,
            registry.clone(),
        )));
        registries.push(registry);
    }

    create_pod(&admin, "default", "web", NODES[0], json!({})).await?;
    let kps: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        "default",
        &ApiResource {
            group: "openstack.org".into(),
            version: "v1".into(),
            api_version: "openstack.org/v1".into(),
            kind: "KuryrPort".into(),
            plural: "kuryrports".into(),
        },
    );
    eventually(
        "the pod's KuryrPort with an active VIF",
        Duration::from_secs(60),
        || {
            let kps = kps.clone();
            async move { Ok(kps.get_opt("web").await?.filter(active_vif).map(|_| ())) }
        },
    )
    .await?;
    eventually(
        "the gone namespace's group swept",
        Duration::from_secs(60),
        || {
            let neutron = neutron.client.clone();
            let id = orphan.id.clone();
            async move {
                match neutron.get_security_group(&id).await {
                    Err(e) if e.is_not_found() => Ok(Some(())),
                    Err(e) => Err(e.into()),
                    Ok(_) => Ok(None),
                }
            }
        },
    )
    .await?;
    let key = PodKey::new("default", "web");
    eventually(
        "the pod's node daemon to see its VIF",
        Duration::from_secs(30),
        || {
            let registry = registries[0].clone();
            let key = key.clone();
            async move { Ok(registry.get(&key).map(|_| ())) }
        },
    )
    .await?;
    assert!(
        registries[1].get(&key).is_none(),
        "the other node's daemon only sees its own KuryrPorts"
    );

    // The Lease is renewed (update), not only created.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(admin.clone(), "kuryr");
    let first_renew = eventually("the controller's Lease", Duration::from_secs(30), || {
        let leases = leases.clone();
        async move {
            Ok(leases
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .find_map(|l| l.spec.and_then(|s| s.renew_time)))
        }
    })
    .await?;
    eventually("the Lease to be renewed", Duration::from_secs(30), || {
        let leases = leases.clone();
        let first = first_renew.clone();
        async move {
            let renewed = leases
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .filter_map(|l| l.spec.and_then(|s| s.renew_time))
                .any(|t| t != first);
            Ok(renewed.then_some(()))
        }
    })
    .await?;

    // A pod over the port quota gets a Warning Event, repeated as a series while it is retried.
    neutron
        .client
        .update_quota(
            &fx.project,
            &kuryr_neutron::QuotaUpdate {
                port: Some(0),
                ..Default::default()
            },
        )
        .await?;
    create_pod(&admin, "default", "over", NODES[1], json!({})).await?;
    let events: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        "default",
        &ApiResource {
            group: "events.k8s.io".into(),
            version: "v1".into(),
            api_version: "events.k8s.io/v1".into(),
            kind: "Event".into(),
            plural: "events".into(),
        },
    );
    eventually(
        "a repeated Warning Event on the pod over quota",
        Duration::from_secs(60),
        || {
            let events = events.clone();
            async move {
                let repeated = events
                    .list(&Default::default())
                    .await?
                    .items
                    .into_iter()
                    .any(|e| {
                        e.data.pointer("/regarding/name") == Some(&json!("over"))
                            && e.data
                                .pointer("/series/count")
                                .and_then(Value::as_i64)
                                .unwrap_or(0)
                                >= 2
                    });
                Ok(repeated.then_some(()))
            }
        },
    )
    .await?;
    neutron
        .client
        .update_quota(
            &fx.project,
            &kuryr_neutron::QuotaUpdate {
                port: Some(-1),
                ..Default::default()
            },
        )
        .await?;

    // The daemon's Events (a CNI request that timed out, reported twice) go out with its identity.
    let daemon_events = kuryr_daemon::kube::KubeEvents::new(
        client(&handle, &handle.service_account_token("kuryr", "kuryr-cni")).await?,
        NODES[0],
        true,
    );
    for _ in 0..2 {
        kuryr_daemon::PodEvents::publish(&daemon_events, &key, None, "CNITimedOut", "test", true).await;
    }
    // An ADD from a runtime that passes no K8S_POD_UID reads the pod's uid with the daemon's identity.
    let api = kuryr_daemon::kube::KubeApiHealth(
        client(&handle, &handle.service_account_token("kuryr", "kuryr-cni")).await?,
    );
    let uid = kuryr_daemon::daemon::ApiHealth::pod_uid(&api, &key)
        .await
        .map_err(anyhow::Error::msg)?;
    assert!(uid.is_some_and(|u| !u.is_empty()), "the pod's uid read");

    // Deleting the pods releases their ports and removes the KuryrPorts.
    let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), "default");
    for name in ["web", "over"] {
        pods.delete(name, &Default::default()).await?;
    }
    eventually("the KuryrPorts to go", Duration::from_secs(60), || {
        let kps = kps.clone();
        async move {
            let gone = kps.get_opt("web").await?.is_none() && kps.get_opt("over").await?.is_none();
            Ok(gone.then_some(()))
        }
    })
    .await?;

    assert_eq!(
        denied(&handle),
        Vec::<String>::new(),
        "requests the generated roles refused"
    );
    // Least privilege: every granted permission was used by the component it is granted to.
    let used = handle.used_permissions();
    for account in ["kuryr-controller", "kuryr-cni"] {
        let user = format!("system:serviceaccount:kuryr:{account}");
        let used: BTreeSet<(String, String, String)> = used
            .iter()
            .filter(|u| u.user == user)
            .map(|u| (u.verb.clone(), u.group.clone(), u.resource.clone()))
            .collect();
        let unused: Vec<_> = granted(&docs, account).difference(&used).cloned().collect();
        assert!(
            unused.is_empty(),
            "{account} is granted but never used: {unused:?}"
        );
    }

    for d in daemons {
        d.abort();
    }
    controller.shutdown().await?;
    handle.shutdown().await?;
    Ok(())
}

/// What a kuryr ServiceAccount was refused (403), as `user verb group/resource`.
fn denied(handle: &KubeHandle) -> Vec<String> {
    handle
        .denied_permissions()
        .into_iter()
        .filter(|d| d.user.starts_with("system:serviceaccount:kuryr:"))
        .map(|d| format!("{} {} {}/{}", d.user, d.verb, d.group, d.resource))
        .collect()
}

/// Services on Octavia and NetworkPolicy on security groups (every handler but the namespace
/// subnets' two, and the `policy` groups drivers for pods and Services) under the generated
/// roles: a policy's group lands on its pod's port, a Service gets its load balancer, and both go
/// with their finalizers when deleted, with no request refused on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn services_and_network_policies_work_under_the_generated_roles() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kuryr_crds::{KuryrLoadBalancer, KuryrNetworkPolicy, KuryrPort};
    kuryr_testbed::init_logs();

    let targets = neutron_targets().await?;
    let neutron = &targets[0];
    let fx =
        kuryr_testbed::neutron_fixture_subnets(&neutron.client, &["10.79.0.0/24", "10.97.0.0/24"]).await?;
    let octavia =
        octavia_emulator::OctaviaEmulator::start(octavia_emulator::OctaviaOptions::default()).await?;
    let cluster_id = format!("rbac-{}", uuid::Uuid::new_v4().simple());
    let conf = format!(
        "[kubernetes]\ncontroller_namespace = kuryr\ncontroller_ha = True\n\
         enabled_handlers = vif,kuryrport,service,endpoints,kuryrloadbalancer,policy,kuryrnetworkpolicy,pod_label\n\
         pod_vif_driver = neutron-vif\nvif_pool_driver = noop\ncluster_id = {cluster_id}\n\
         pod_security_groups_driver = policy\nservice_security_groups_driver = policy\n\
         [neutron]\nauth_type = noauth\nendpoint_override = {}\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nservice_subnet = {}\n\
         [octavia_defaults]\nreconcile_period = 1\n[cni_daemon]\nnetns_proc_dir = /host_proc\n",
        neutron.url,
        // Octavia takes Keystone-sized project ids, which the fixture's descriptive names are not.
        uuid::Uuid::new_v4().simple(),
        fx.subnet,
        fx.sg,
        fx.subnets[1].subnet
    );
    let Installed {
        handle,
        admin,
        controller_client,
        ..
    } = installed(&conf).await?;
    let metrics = kuryr_controller::metrics::Metrics::new();
    let deployments = kuryr_controller::openstack::Deployments::noauth(&neutron.url, &metrics)?.with_octavia(
        "default",
        kuryr_neutron::octavia::OctaviaClient::new(&kuryr_neutron::ClientOptions::noauth(octavia.url()))?,
    );
    let controller = kuryr_testbed::start_controller_with(
        &controller_client,
        deployments,
        metrics,
        kuryr_testbed::config(&conf),
        "kuryr-controller-0",
    );

    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"nodeName": NODES[0], "containers": [{"name": "c", "image": "busybox"}]}
    }))?;
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), "default");
    pods.create(&PostParams::default(), &pod).await?;
    let policy: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {}}], "ports": [{"port": 80, "protocol": "TCP"}]}]}
    }))?;
    let policies = Api::<NetworkPolicy>::namespaced(admin.clone(), "default");
    policies.create(&PostParams::default(), &policy).await?;
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "ClusterIP", "clusterIP": "10.97.0.10", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 80, "protocol": "TCP"}]}
    }))?;
    let services = Api::<Service>::namespaced(admin.clone(), "default");
    services.create(&PostParams::default(), &service).await?;

    let wait = Duration::from_secs(60);
    let knps = Api::<KuryrNetworkPolicy>::namespaced(admin.clone(), "default");
    let group = eventually("the policy's group", wait, || async {
        Ok(knps
            .get_opt("web")
            .await?
            .and_then(|k| k.status)
            .and_then(|s| s.security_group_id))
    })
    .await?;
    let kps = Api::<KuryrPort>::namespaced(admin.clone(), "default");
    eventually("the pod's port in the policy's group", wait, || async {
        let Some(id) = kps
            .get_opt("web")
            .await?
            .and_then(|kp| kp.status)
            .and_then(|s| s.vifs.get("eth0").map(|v| v.vif.id().to_string()))
        else {
            return Ok(None);
        };
        let port = neutron.client.get_port(&id).await?;
        Ok(port.security_groups.contains(&group).then_some(()))
    })
    .await?;
    let klbs = Api::<KuryrLoadBalancer>::namespaced(admin.clone(), "default");
    eventually("the Service's load balancer", wait, || async {
        Ok(klbs
            .get_opt("web")
            .await?
            .and_then(|k| k.status)
            .and_then(|s| s.loadbalancer)
            .map(|_| ()))
    })
    .await?;

    policies.delete("web", &Default::default()).await?;
    services.delete("web", &Default::default()).await?;
    eventually(
        "the policy, the Service and their Kuryr objects gone",
        wait,
        || async {
            let gone = policies.get_opt("web").await?.is_none()
                && knps.get_opt("web").await?.is_none()
                && services.get_opt("web").await?.is_none()
                && klbs.get_opt("web").await?.is_none();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    assert_eq!(
        denied(&handle),
        Vec::<String>::new(),
        "requests the generated roles refused"
    );

    pods.delete("web", &Default::default()).await?;
    eventually("the pod gone", wait, || async {
        Ok(pods.get_opt("web").await?.is_none().then_some(()))
    })
    .await?;
    controller.shutdown().await?;
    handle.shutdown().await?;
    Ok(())
}
