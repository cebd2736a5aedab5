//! The daemon fed by its real watchers from the Kubernetes API emulator:
//! ADD waits for the controller to write VIFs into KuryrPort status, answers
//! the upstream body (bare eth0 VIF), a pod deleted while ADD waits gives
//! 410, errors carry upstream codes, health and metrics endpoints answer.
#![allow(clippy::unwrap_used)]
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use kube_emulator::{KubeEmulator, KubeOptions};
use kuryr_crds::KuryrPort;
use kuryr_daemon::registry::PodKey;
use kuryr_daemon::testing::{VifFixture, kuryrport};
use kuryr_daemon::{Daemon, DaemonConfig, PodEvents};
use serde_json::{Value, json};

#[derive(Default)]
struct Recorded(Mutex<Vec<(String, String)>>);

#[async_trait]
impl PodEvents for Recorded {
    async fn publish(&self, pod: &PodKey, _: Option<&str>, reason: &str, _: &str, _: bool) {
        self.0.lock().unwrap().push((pod.to_string(), reason.to_string()));
    }
}

impl Recorded {
    fn all(&self) -> Vec<(String, String)> {
        self.0.lock().unwrap().clone()
    }
    fn count(&self, pod: &str, reason: &str) -> usize {
        self.all().iter().filter(|(p, r)| p == pod && r == reason).count()
    }
    fn has(&self, pod: &str, reason: &str) -> bool {
        self.count(pod, reason) > 0
    }
}

async fn client(handle: &kube_emulator::KubeHandle, dir: &std::path::Path) -> Client {
    let path = dir.join("kubeconfig");
    handle.write_kubeconfig(&path).unwrap();
    let kc = Kubeconfig::read_from(&path).unwrap();
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}))
    .unwrap()
}

fn cni_body(pod: &str, container: &str, netns: &str, uid: &str) -> Value {
    json!({"CNI_IFNAME": "eth0", "CNI_NETNS": netns, "CNI_PATH": "/opt/cni/bin", "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": container,
        "CNI_ARGS": format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_UID={uid}"),
        "config_kuryr": {"cniVersion": "1.0.0", "name": "kuryr", "type": "kuryr-cni"}})
}

/// The API emulator with kuryr-rs' CRDs, and a client of it (its kubeconfig in the returned
/// directory).
async fn cluster() -> (kube_emulator::KubeHandle, tempfile::TempDir, Client) {
    let handle = KubeEmulator::start(KubeOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let client = client(&handle, dir.path()).await;
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(client.clone());
    for crd in kuryr_crds::generate::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    (handle, dir, client)
}

/// A daemon of `node` on free local ports, posting to `events`, its KuryrPort watch running. Its
/// ADD timeout is the tests' longest wait: every wait in them is ended by an event, never by it.
fn daemon(node: &str, client: &Client, events: Arc<Recorded>) -> (Arc<Daemon>, tokio::task::JoinHandle<()>) {
    let mut cfg = DaemonConfig::new(node.to_string());
    cfg.bind_address = "127.0.0.1:0".parse().unwrap();
    cfg.health_address = "127.0.0.1:0".parse().unwrap();
    cfg.metrics_address = "127.0.0.1:0".parse().unwrap();
    cfg.vif_annotation_timeout = WAIT;
    let d = Daemon::new(
        cfg,
        events,
        Arc::new(kuryr_daemon::kube::KubeApiHealth(client.clone())),
    );
    let watch = tokio::spawn({
        let (c, n, r, e) = (client.clone(), node.to_string(), d.registry.clone(), d.events());
        async move { kuryr_daemon::kube::watch_kuryrports(c, &n, r, e).await }
    });
    (d, watch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_against_kube_emulator() {
    if !can_netns() {
        return;
    }
    let (handle, _dir, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let kps: Api<KuryrPort> = Api::namespaced(client.clone(), "default");
    let node = unique("knode");

    let events = Arc::new(Recorded::default());
    let (d, w1) = daemon(&node, &client, events.clone());
    let w2 = tokio::spawn({
        let (c, n, r) = (client.clone(), node.clone(), d.registry.clone());
        async move { kuryr_daemon::kube::watch_pods(c, &n, r).await }
    });
    let servers = kuryr_daemon::server::start(d.clone()).await.unwrap();
    let http = reqwest::Client::new();
    let api = format!("http://{}", servers.api);

    // The pod and its KuryrPort as the controller creates them: no VIFs yet.
    let p = pods
        .create(&PostParams::default(), &pod("web", &node))
        .await
        .unwrap();
    let uid = p.metadata.uid.clone().unwrap();
    let bridge = unique("kbr");
    let _br = HostLink(bridge.clone());
    let port_id = format!("{}-port", unique("q"));
    let fixture = VifFixture {
        ifname: "eth0".into(),
        port_id: port_id.clone(),
        mac: "fa:16:3e:00:20:01".into(),
        subnets: vec![("10.98.0.0/24".into(), "10.98.0.7".parse().unwrap(), None)],
        bridge: bridge.clone(),
        mtu: None,
        active: true,
    };
    let _tap = HostLink(kuryr_crds::vif_name_for_port(&port_id));
    let mut kp = kuryrport("default", "web", &uid, &node, std::slice::from_ref(&fixture));
    let status = kp.status.take().unwrap();
    kps.create(&PostParams::default(), &kp).await.unwrap();

    let netns = TestNetns::new("kkp");
    let add = tokio::spawn({
        let (http, url, body) = (
            http.clone(),
            format!("{api}/addNetwork"),
            cni_body("web", "c1", &netns.path(), &uid),
        );
        async move { http.post(url).json(&body).send().await }
    });
    // The "waiting" Event is posted when the wait starts, not once it ends.
    assert!(
        eventually(|| events.has("default/web", "CNIWaitingForVIFs")).await,
        "CNIWaitingForVIFs while ADD waits: {:?}",
        events.all()
    );
    assert!(!add.is_finished(), "ADD must wait for the VIFs");
    // The controller writes the VIF, not yet active: ADD plugs it, then
    // waits for activation, saying so at once.
    // kuryr-crds' KuryrPort CRD has no status subresource (as upstream):
    // status is written through the main resource.
    let inactive = VifFixture {
        active: false,
        ..fixture.clone()
    };
    let inactive_status = kuryrport("default", "web", &uid, &node, &[inactive])
        .status
        .unwrap();
    kps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": inactive_status})),
    )
    .await
    .unwrap();
    assert!(
        eventually(|| events.has("default/web", "CNIWaitingForActiveVIFs")).await,
        "CNIWaitingForActiveVIFs while ADD waits: {:?}",
        events.all()
    );
    assert!(!add.is_finished(), "ADD must wait for the VIF to become active");
    // Once per ADD, not per poll or update.
    assert_eq!(events.count("default/web", "CNIWaitingForVIFs"), 1);
    // The controller marks the VIF active.
    kps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
    let resp = add.await.unwrap().unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let vif: Value = resp.json().await.unwrap();
    // Upstream body: the bare os-vif object of eth0.
    assert_eq!(vif["versioned_object.name"], "VIFBridge");
    assert_eq!(vif["versioned_object.data"]["address"], "fa:16:3e:00:20:01");
    let routes = netns.exec_ok(&["ip", "-4", "route"]);
    assert!(
        !routes.contains("default"),
        "no gateway, no default route: {routes}"
    );
    assert_eq!(events.count("default/web", "CNIWaitingForVIFs"), 1);
    assert_eq!(events.count("default/web", "CNIWaitingForActiveVIFs"), 1);

    // Upstream error format and codes.
    let r = http
        .post(format!("{api}/addNetwork"))
        .json(&json!({"CNI_ARGS": "K8S_POD_NAME=x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["code"], 4);
    assert!(e["msg"].is_string() && e["details"].as_str().unwrap().contains("K8S_POD_NAMESPACE"));

    // A pod deleted while its ADD waits: 410 / code 3, without waiting out the timeout.
    let p2 = pods
        .create(&PostParams::default(), &pod("gone", &node))
        .await
        .unwrap();
    let uid2 = p2.metadata.uid.clone().unwrap();
    let kp2 = kuryrport("default", "gone", &uid2, &node, &[]);
    kps.create(&PostParams::default(), &kp2).await.unwrap();
    let started = std::time::Instant::now();
    let add2 = tokio::spawn({
        let (http, url, body) = (
            http.clone(),
            format!("{api}/addNetwork"),
            cni_body("gone", "c2", &netns.path(), &uid2),
        );
        async move { http.post(url).json(&body).send().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    pods.delete("gone", &DeleteParams::default()).await.unwrap();
    let r = add2.await.unwrap().unwrap();
    assert_eq!(r.status().as_u16(), 410);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], 3);
    assert!(
        started.elapsed() < WAIT,
        "410 comes from the pod watch, not the timeout"
    );

    // DEL, then the KuryrPort goes: nothing of the pod is left in the registry.
    let mut del = cni_body("web", "c1", &netns.path(), &uid);
    del["CNI_COMMAND"] = json!("DEL");
    let r = http
        .post(format!("{api}/delNetwork"))
        .json(&del)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    kps.delete("web", &DeleteParams::default()).await.unwrap();
    kps.delete("gone", &DeleteParams::default()).await.unwrap();
    assert!(
        eventually(|| d.registry.is_empty()).await,
        "left: {:?}",
        d.registry.keys()
    );

    // Health and metrics.
    let ready = http
        .get(format!("http://{}/ready", servers.health))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    let alive = http
        .get(format!("http://{}/alive", servers.health))
        .send()
        .await
        .unwrap();
    assert_eq!(alive.status().as_u16(), 200);
    let m = http
        .get(format!("http://{}/metrics", servers.metrics))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("kuryr_cni_request_duration_milliseconds_count{command=\"ADD\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("kuryr_cni_errors_total{command=\"ADD\",code=\"3\"} 1"),
        "{m}"
    );
    assert!(m.contains("kuryr_cni_registry_entries 0"), "{m}");

    // Readiness follows the API: with the emulator gone, GET /ready is 503
    // (CNI code 50) naming the unreachable API, while /alive stays 200.
    w1.abort();
    w2.abort();
    handle.shutdown().await.unwrap();
    let ready = http
        .get(format!("http://{}/ready", servers.health))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body["code"], 50, "{body}");
    assert!(
        body["details"]
            .as_str()
            .is_some_and(|d| d.contains("Kubernetes API unreachable")),
        "{body}"
    );
    let alive = http
        .get(format!("http://{}/alive", servers.health))
        .send()
        .await
        .unwrap();
    assert_eq!(alive.status().as_u16(), 200);
    servers.shutdown().await;
}

/// A KuryrPort the daemon cannot read (a hand edit, a VIF type of a newer
/// controller) is listed together with a good one: the good one is still
/// served, the bad one's pod gets one Warning Event naming the field, and an
/// ADD for it fails at once with upstream's error body instead of waiting out
/// the timeout; once fixed it is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_kuryrport_fails_only_its_own_pod_at_once() {
    let Some(other) = other_netns() else {
        return;
    };
    let (_handle, _dir, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let kps: Api<KuryrPort> = Api::namespaced(client.clone(), "default");
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::api::ApiResource::erase::<KuryrPort>(&()),
    );
    let node = unique("bnode");
    let fixture = |port: &str| VifFixture {
        ifname: "eth0".into(),
        port_id: port.into(),
        mac: "fa:16:3e:00:30:01".into(),
        subnets: vec![("10.98.1.0/24".into(), "10.98.1.7".parse().unwrap(), None)],
        bridge: "br-unused".into(),
        mtu: None,
        active: true,
    };
    let mut uids = Vec::new();
    for name in ["good", "bad"] {
        let p = pods
            .create(&PostParams::default(), &pod(name, &node))
            .await
            .unwrap();
        let uid = p.metadata.uid.clone().unwrap();
        kps.create(
            &PostParams::default(),
            &kuryrport("default", name, &uid, &node, &[fixture(&format!("port-{name}"))]),
        )
        .await
        .unwrap();
        uids.push(uid);
    }
    // Both exist before the daemon lists them: the bad one must not fail the list.
    let mut bad = serde_json::to_value(kps.get("bad").await.unwrap()).unwrap();
    let good_vif = bad["status"]["vifs"]["eth0"].clone();
    bad["status"]["vifs"]["eth0"]["vif"]["versioned_object.name"] = json!("VIFFromTheFuture");
    raw.replace(
        "bad",
        &PostParams::default(),
        &serde_json::from_value(bad.clone()).unwrap(),
    )
    .await
    .unwrap();

    // Only an answer given at once tells the failure from the ADD timeout (504).
    let events = Arc::new(Recorded::default());
    let (d, watch) = daemon(&node, &client, events.clone());
    let servers = kuryr_daemon::server::start(d.clone()).await.unwrap();
    let registry = d.registry.clone();
    let served = |name: &str| {
        registry
            .get(&PodKey::new("default", name))
            .is_some_and(|e| e.kuryrport.is_some())
    };
    assert!(
        eventually(|| served("good")).await,
        "the good KuryrPort is served"
    );
    assert!(!served("bad"));
    assert_eq!(
        events.all(),
        vec![("default/bad".to_string(), "KuryrPortInvalid".to_string())],
        "one Warning, on the bad one's pod"
    );

    // A netns that exists; the ADD fails before anything is plugged.
    let add = |name: &str, uid: &str| {
        let body = cni_body(name, "c1", other, uid);
        let url = format!("http://{}/addNetwork", servers.api);
        async move { reqwest::Client::new().post(url).json(&body).send().await.unwrap() }
    };
    let r = add("bad", &uids[1]).await;
    assert_eq!(r.status().as_u16(), 500, "not the timeout's 504");
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["code"], 999, "{e}");
    let details = e["details"].as_str().unwrap_or_default();
    for want in ["default/bad", "status.vifs.eth0.vif", "VIFFromTheFuture"] {
        assert!(details.contains(want), "{want:?} in {details}");
    }

    // A resync or an unrelated change does not post it again; a fix is served.
    raw.patch(
        "bad",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"touched": "1"}}})),
    )
    .await
    .unwrap();
    kps.patch(
        "bad",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"vifs": {"eth0": good_vif}}})),
    )
    .await
    .unwrap();
    assert!(eventually(|| served("bad")).await, "served once fixed");
    assert_eq!(
        events.count("default/bad", "KuryrPortInvalid"),
        1,
        "{:?}",
        events.all()
    );
    assert!(
        registry
            .get(&PodKey::new("default", "bad"))
            .is_some_and(|e| e.unreadable.is_none())
    );
    servers.shutdown().await;
    watch.abort();
}
