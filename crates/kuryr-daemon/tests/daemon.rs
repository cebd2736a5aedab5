//! Daemon logic in real namespaces without HTTP: multi-VIF pods, CNI_IFNAME
//! renaming, static pods, restart recovery of stale-DEL protection.
#![allow(clippy::unwrap_used)]
mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use kuryr_daemon::registry::PodKey;
use kuryr_daemon::testing::{VifFixture, kuryrport};
use kuryr_daemon::{ApiHealth, Daemon, DaemonConfig, NoEvents};
use serde_json::{Value, json};

struct ApiUp;
#[async_trait]
impl ApiHealth for ApiUp {
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

fn daemon() -> Arc<Daemon> {
    let mut cfg = DaemonConfig::new("n1");
    cfg.vif_annotation_timeout = Duration::from_secs(2);
    Daemon::new(cfg, Arc::new(NoEvents), Arc::new(ApiUp))
}

/// A daemon whose ADDs' waits end only by events, never by its (the test's) timeout.
fn event_driven_daemon() -> Arc<Daemon> {
    let mut cfg = DaemonConfig::new("n1");
    cfg.vif_annotation_timeout = WAIT;
    Daemon::new(cfg, Arc::new(NoEvents), Arc::new(ApiUp))
}

/// Pod `default/<name>` with `uid`, as the pod watch sees it.
fn watched_pod(name: &str, uid: &str) -> k8s_openapi::api::core::v1::Pod {
    let mut p = k8s_openapi::api::core::v1::Pod::default();
    p.metadata.namespace = Some("default".into());
    p.metadata.name = Some(name.into());
    p.metadata.uid = Some(uid.into());
    p
}

/// A pod made again under its name: the old pod's VIF (its KuryrPort applied, the pod watch listing
/// it) and the new pod's (not applied yet), on a bridge, with the netns the ADDs use.
struct Recreated {
    ns: TestNetns,
    old: VifFixture,
    new: VifFixture,
    old_tap: String,
    d: Arc<Daemon>,
    pods: kuryr_daemon::kube::PodTracker,
    _links: [HostLink; 3],
}

impl Recreated {
    /// `name`'s old pod `u-old` on 10.<net>.0.5, its new one `u-new` on .6.
    fn new(name: &str, net: u8) -> Self {
        Self::with_pod_watch(name, net, true)
    }

    /// [`Self::new`], the pod watch having listed the old pod (`listed`) or started and not
    /// listed anything yet (a daemon just started).
    fn with_pod_watch(name: &str, net: u8, listed: bool) -> Self {
        use kube::runtime::watcher::Event as WEvent;
        let br = unique("kdr");
        let ns = TestNetns::new("kdr");
        let cidr = format!("10.{net}.0.0/24");
        let mac = |last: u8| format!("fa:16:3e:00:{net:02x}:{last:02x}");
        let old = vif("eth0", "o", &mac(1), &cidr, &format!("10.{net}.0.5"), None, &br);
        let new = vif("eth0", "n", &mac(2), &cidr, &format!("10.{net}.0.6"), None, &br);
        let old_tap = kuryr_crds::vif_name_for_port(&old.port_id);
        let links = [
            HostLink(br.clone()),
            HostLink(old_tap.clone()),
            HostLink(kuryr_crds::vif_name_for_port(&new.port_id)),
        ];
        let d = event_driven_daemon();
        let mut pods = kuryr_daemon::kube::PodTracker::default();
        d.registry.pod_watch_started();
        if listed {
            for ev in [
                WEvent::Init,
                WEvent::InitApply(watched_pod(name, "u-old")),
                WEvent::InitDone,
            ] {
                pods.on_event(ev, &d.registry);
            }
        }
        d.registry.apply_kuryrport(kuryrport(
            "default",
            name,
            "u-old",
            "n1",
            std::slice::from_ref(&old),
        ));
        Self {
            ns,
            old,
            new,
            old_tap,
            d,
            pods,
            _links: links,
        }
    }
}

impl Recreated {
    /// The new pod's ADD (`body`) waits while only the old pod's KuryrPort is there, plugging
    /// nothing, and plugs the new pod's VIF once its KuryrPort comes.
    async fn add_waits_for_the_new_kuryrport(
        &self,
        name: &str,
        body: Vec<u8>,
    ) -> kuryr_daemon::daemon::AddResult {
        let add = tokio::spawn({
            let d = self.d.clone();
            async move { d.add(&body).await }
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!add.is_finished(), "ADD must wait for the new pod's KuryrPort");
        assert!(
            !host_ok(&["ip", "-o", "link"]).contains(&self.old_tap),
            "the old pod's VIF must not be plugged"
        );
        self.d.registry.apply_kuryrport(kuryrport(
            "default",
            name,
            "u-new",
            "n1",
            std::slice::from_ref(&self.new),
        ));
        let res = add.await.unwrap().unwrap();
        assert_eq!(
            res.vif["versioned_object.data"]["address"],
            self.new.mac.as_str(),
            "the new pod's VIF"
        );
        res
    }
}

fn body(pod: &str, container: &str, netns: &str, ifname: &str, uid: &str) -> Vec<u8> {
    json!({"CNI_IFNAME": ifname, "CNI_NETNS": netns, "CNI_CONTAINERID": container, "CNI_COMMAND": "ADD",
        "CNI_ARGS": format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_UID={uid}"), "config_kuryr": {}})
    .to_string()
    .into_bytes()
}

fn vif(
    ifname: &str,
    tag: &str,
    mac: &str,
    cidr: &str,
    ip: &str,
    gw: Option<&str>,
    bridge: &str,
) -> VifFixture {
    VifFixture {
        ifname: ifname.into(),
        port_id: format!("{}{tag}-0000", unique("d")),
        mac: mac.into(),
        subnets: vec![(cidr.into(), ip.parse().unwrap(), gw.map(|g| g.parse().unwrap()))],
        bridge: bridge.into(),
        mtu: None,
        active: true,
    }
}

/// A throwaway pod namespace with one `eth0` VIF on a Linux bridge of its own (`v0`, port tag
/// `tag`); the bridge and the veth's host end go on drop.
struct BridgePod {
    ns: TestNetns,
    v0: VifFixture,
    tap: String,
    _links: [HostLink; 2],
}

impl BridgePod {
    fn new(ns_prefix: &str, tag: &str, mac: &str, cidr: &str, ip: &str) -> Self {
        let br = unique("kdb");
        let v0 = vif("eth0", tag, mac, cidr, ip, None, &br);
        let tap = kuryr_crds::vif_name_for_port(&v0.port_id);
        Self {
            ns: TestNetns::new(ns_prefix),
            _links: [HostLink(br), HostLink(tap.clone())],
            v0,
            tap,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_vif_pod_with_renamed_default_interface() {
    if !can_netns() {
        return;
    }
    let br = unique("kdb");
    let _b = HostLink(br.clone());
    let ns = TestNetns::new("kdm");
    let v0 = vif(
        "eth0",
        "a",
        "fa:16:3e:00:30:01",
        "10.81.0.0/24",
        "10.81.0.5",
        Some("10.81.0.1"),
        &br,
    );
    let v1 = vif(
        "eth1",
        "b",
        "fa:16:3e:00:30:02",
        "10.82.0.0/24",
        "10.82.0.5",
        Some("10.82.0.1"),
        &br,
    );
    let _t = (
        HostLink(kuryr_crds::vif_name_for_port(&v0.port_id)),
        HostLink(kuryr_crds::vif_name_for_port(&v1.port_id)),
    );
    let d = daemon();
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "multi",
        "u1",
        "n1",
        &[v0.clone(), v1.clone()],
    ));
    let r = d
        .add(&body("multi", "c1", &ns.path(), "net0", "u1"))
        .await
        .unwrap();
    let links = ns.exec_ok(&["ip", "-o", "link"]);
    assert!(
        links.contains("net0") && links.contains("eth1") && !links.contains("eth0"),
        "{links}"
    );
    let routes = ns.exec_ok(&["ip", "-4", "route"]);
    assert!(routes.contains("default via 10.81.0.1 dev net0"), "{routes}");
    assert!(
        !routes.contains("default via 10.82.0.1"),
        "only the default VIF gets a default route: {routes}"
    );
    assert_eq!(r.result["interfaces"].as_array().unwrap().len(), 2);
    assert_eq!(r.result["interfaces"][0]["name"], "net0");
    assert_eq!(r.result["ips"][1]["interface"], 1);
    assert_eq!(r.vif["versioned_object.data"]["address"], "fa:16:3e:00:30:01");
    // CHECK passes, DEL removes both.
    d.check(&body("multi", "c1", &ns.path(), "net0", "u1"))
        .await
        .unwrap();
    d.del(&body("multi", "c1", &ns.path(), "net0", "u1"))
        .await
        .unwrap();
    let links = ns.exec_ok(&["ip", "-o", "link"]);
    assert!(!links.contains("net0") && !links.contains("eth1"), "{links}");
}

/// A pod name as long as Kubernetes allows (253) makes an owner tag longer than the kernel takes
/// for a link alias (255 bytes): the ADD still plugs it (the alias is left off), and DEL removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_a_253_character_name_is_plugged() {
    if !can_netns() {
        return;
    }
    let br = unique("kdl");
    let _b = HostLink(br.clone());
    let ns = TestNetns::new("kdl");
    let v0 = vif(
        "eth0",
        "l",
        "fa:16:3e:00:31:01",
        "10.83.0.0/24",
        "10.83.0.5",
        Some("10.83.0.1"),
        &br,
    );
    let _t = HostLink(kuryr_crds::vif_name_for_port(&v0.port_id));
    let d = daemon();
    let name = "p".repeat(253);
    d.registry
        .apply_kuryrport(kuryrport("default", &name, "u1", "n1", std::slice::from_ref(&v0)));
    let container = "c".repeat(64);
    d.add(&body(&name, &container, &ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"));
    d.del(&body(&name, &container, &ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(!ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_pods_skip_the_uid_check_others_get_410() {
    if !can_netns() {
        return;
    }
    let pod = BridgePod::new("kds", "s", "fa:16:3e:00:31:01", "10.83.0.0/24", "10.83.0.5");
    let ns = &pod.ns;
    let v0 = pod.v0.clone();
    let d = daemon();
    let mut kp = kuryrport(
        "kube-system",
        "etcd-n1",
        "mirror-uid",
        "n1",
        std::slice::from_ref(&v0),
    );
    d.registry.apply_kuryrport(kp.clone());
    let b = json!({"CNI_IFNAME": "eth0", "CNI_NETNS": ns.path(), "CNI_CONTAINERID": "c1",
        "CNI_ARGS": "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=etcd-n1;K8S_POD_UID=kubelet-uid"})
    .to_string();
    let e = d.add(b.as_bytes()).await.err().unwrap();
    assert_eq!(e.code(), 3, "{e}");
    assert!(e.to_string().contains("UID mismatch"), "{e}");
    kp.spec.pod_static = true;
    d.registry.apply_kuryrport(kp);
    d.add(b.as_bytes()).await.unwrap();
    d.del(b.as_bytes()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_daemon_still_ignores_stale_dels() {
    if !can_netns() {
        return;
    }
    let pod = BridgePod::new("kdr", "r", "fa:16:3e:00:32:01", "10.84.0.0/24", "10.84.0.5");
    let ns = &pod.ns;
    let v0 = pod.v0.clone();
    let tap = pod.tap.clone();
    let kp = kuryrport("default", "web", "u1", "n1", std::slice::from_ref(&v0));
    let first = daemon();
    first.registry.apply_kuryrport(kp.clone());
    first
        .add(&body("web", "new-ctr", &ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    drop(first);

    // A new daemon process: KuryrPorts come back from the API, ownership
    // from the host link aliases.
    let d = daemon();
    d.registry.apply_kuryrport(kp);
    assert!(d.restore_from_host().await.unwrap() >= 1);
    let att = d
        .registry
        .get(&PodKey::new("default", "web"))
        .unwrap()
        .attachment
        .unwrap();
    assert_eq!(att.container_id, "new-ctr");
    assert_eq!(att.host_ifnames, vec![tap.clone()]);
    d.del(&body("web", "old-ctr", &ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(
        ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"),
        "stale DEL touched nothing"
    );
    d.del(&body("web", "new-ctr", &ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(!ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"));
    let host = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&host.stdout).contains(&tap));
}

#[tokio::test]
async fn add_errors_name_the_problem() {
    let d = daemon();
    let e = d.add(b"{}").await.err().unwrap();
    assert_eq!(e.code(), 4);
    // A namespace that does not exist is refused before any wait.
    let started = std::time::Instant::now();
    let e = d
        .add(&body("p", "c", "/nonexistent/netns", "eth0", "u"))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), 4, "{e}");
    assert!(e.to_string().contains("CNI_NETNS"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused after the VIF wait"
    );
    let Some(other) = other_netns() else {
        return;
    };
    let e = d.add(&body("p", "c", other, "eth0", "u")).await.err().unwrap();
    assert_eq!(e.code(), 11, "no KuryrPort: timeout, try again later");
    let bad: Value = json!({"CNI_IFNAME": "this-name-is-too-long", "CNI_NETNS": "/x", "CNI_CONTAINERID": "c",
        "CNI_ARGS": "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b"});
    let e = d.add(bad.to_string().as_bytes()).await.err().unwrap();
    assert_eq!(e.code(), 4);
    assert!(e.to_string().contains("CNI_IFNAME"), "{e}");
    assert_eq!(d.pod_lock_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_is_not_stuck_behind_an_add_waiting_for_activation() {
    if !can_netns() {
        return;
    }
    let pod = BridgePod::new("kdw", "w", "fa:16:3e:00:33:01", "10.85.0.0/24", "10.85.0.5");
    let ns = &pod.ns;
    let mut v0 = pod.v0.clone();
    v0.active = false;
    let mut cfg = DaemonConfig::new("n1");
    // The ADD must still be waiting for activation whenever the DEL comes, however slow the machine.
    cfg.vif_annotation_timeout = WAIT;
    let d = Daemon::new(cfg, Arc::new(NoEvents), Arc::new(ApiUp));
    d.registry
        .apply_kuryrport(kuryrport("default", "slow", "u1", "n1", &[v0]));
    let add = tokio::spawn({
        let (d, b) = (d.clone(), body("slow", "c1", &ns.path(), "eth0", "u1"));
        async move { d.add(&b).await }
    });
    // Wait until ADD has plugged (it then waits for activation).
    assert!(
        eventually(|| {
            d.registry
                .get(&PodKey::new("default", "slow"))
                .and_then(|e| e.attachment)
                .is_some()
        })
        .await,
        "ADD never plugged"
    );
    d.del(&body("slow", "c1", &ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(!add.is_finished(), "DEL waited for the ADD");
    assert!(!ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"));
    // Activation after the DEL does not resurrect the ADD's success.
    let mut active = kuryrport("default", "slow", "u1", "n1", &[]);
    active.status = d
        .registry
        .get(&PodKey::new("default", "slow"))
        .unwrap()
        .kuryrport
        .unwrap()
        .status
        .clone();
    if let Some(s) = active.status.as_mut() {
        for v in s.vifs.values_mut() {
            v.vif.base_mut().active = true;
        }
    }
    d.registry.apply_kuryrport(active);
    let e = add.await.unwrap().err().unwrap();
    assert_eq!(e.code(), 3, "{e}");
}

/// VIFs that come late (the controller behind a burst) still get the whole
/// `vif_annotation_timeout` to go ACTIVE, as upstream waits for each: with one deadline for
/// both waits, an ADD whose VIFs came near its end answered 504 though the port went ACTIVE
/// soon after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_vifs_get_their_own_time_to_go_active() {
    if !can_netns() {
        return;
    }
    let pod = BridgePod::new("kdl", "l", "fa:16:3e:00:37:01", "10.86.0.0/24", "10.86.0.5");
    let ns = &pod.ns;
    let mut v0 = pod.v0.clone();
    let timeout = Duration::from_secs(2);
    let mut cfg = DaemonConfig::new("n1");
    cfg.vif_annotation_timeout = timeout;
    let d = Daemon::new(cfg, Arc::new(NoEvents), Arc::new(ApiUp));
    let add = tokio::spawn({
        let (d, b) = (d.clone(), body("late", "c1", &ns.path(), "eth0", "u1"));
        async move { d.add(&b).await }
    });
    // The VIF comes at 3/4 of the timeout, inactive; it goes ACTIVE past the first timeout.
    tokio::time::sleep(timeout * 3 / 4).await;
    v0.active = false;
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "late",
        "u1",
        "n1",
        std::slice::from_ref(&v0),
    ));
    tokio::time::sleep(timeout / 2).await;
    assert!(!add.is_finished(), "still waiting for activation");
    v0.active = true;
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "late",
        "u1",
        "n1",
        std::slice::from_ref(&v0),
    ));
    let res = add.await.unwrap().unwrap();
    assert_eq!(res.vif["versioned_object.data"]["active"], true);
    d.del(&body("late", "c1", &ns.path(), "eth0", "u1"))
        .await
        .unwrap();
}

/// A StatefulSet pod re-created under the same name: the KuryrPort of the
/// old pod may still be around (finalizer) when the kubelet asks for the new
/// one. As upstream, ADD waits for the KuryrPort of the pod it was asked for
/// and never plugs the old pod's VIF; an ADD for the old pod (a kubelet
/// retry) answers 410 as soon as the pod watch knows that pod is gone, here
/// learned from a re-list that no longer has it, without waiting out
/// `vif_annotation_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uid_mismatch_waits_for_the_right_kuryrport_and_410s_once_the_pod_is_gone() {
    if !can_netns() {
        return;
    }
    use kube::runtime::watcher::Event as WEvent;
    let mut r = Recreated::new("db-0", 86);
    let pod = |uid: &str| watched_pod("db-0", uid);

    // ADD for the new pod while only the old pod's KuryrPort exists: wait.
    r.add_waits_for_the_new_kuryrport("db-0", body("db-0", "c-new", &r.ns.path(), "eth0", "u-new"))
        .await;
    assert!(r.ns.exec_ok(&["ip", "-o", "link"]).contains(&r.new.mac));

    // A late ADD for the old pod: pending until the pod watch says the pod
    // is gone. The watch broke and its re-list only has the new pod.
    let started = std::time::Instant::now();
    let stale = tokio::spawn({
        let (d, b) = (r.d.clone(), body("db-0", "c-old", &r.ns.path(), "eth0", "u-old"));
        async move { d.add(&b).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!stale.is_finished(), "nothing says the old pod is gone yet");
    for ev in [WEvent::Init, WEvent::InitApply(pod("u-new")), WEvent::InitDone] {
        r.pods.on_event(ev, &r.d.registry);
    }
    let e = stale.await.unwrap().err().unwrap();
    assert_eq!(e.code(), 3, "{e}");
    assert!(
        started.elapsed() < WAIT,
        "410 from the pod watch, not the vif_annotation_timeout"
    );
    // The new pod's interface is untouched by the stale ADD.
    r.d.del(&body("db-0", "c-new", &r.ns.path(), "eth0", "u-new"))
        .await
        .unwrap();
    assert!(!r.ns.exec_ok(&["ip", "-o", "link"]).contains(&r.new.mac));
}

/// A runtime that passes no `K8S_POD_UID` (cri-dockerd, containerd before 1.5.3, CRI-O before
/// 1.22): the ADD is checked against the UID the pod watch knows under the pod's name, as upstream
/// asked the API, so a re-created StatefulSet pod still waits for its own KuryrPort and is never
/// plugged into the old pod's port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_without_a_pod_uid_is_checked_against_the_pod_watch() {
    if !can_netns() {
        return;
    }
    use kube::runtime::watcher::Event as WEvent;
    let mut r = Recreated::new("db-1", 87);
    let pod = |uid: &str| watched_pod("db-1", uid);
    // The pod is re-created; its KuryrPort is not written yet, and the old one is still being
    // released (its finalizer's update comes after the pod watch saw the new pod).
    r.pods.on_event(WEvent::Apply(pod("u-new")), &r.d.registry);
    r.d.registry.apply_kuryrport(kuryrport(
        "default",
        "db-1",
        "u-old",
        "n1",
        std::slice::from_ref(&r.old),
    ));
    let no_uid = json!({"CNI_IFNAME": "eth0", "CNI_NETNS": r.ns.path(), "CNI_CONTAINERID": "c-n",
        "CNI_COMMAND": "ADD", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=db-1", "config_kuryr": {}})
    .to_string()
    .into_bytes();
    r.add_waits_for_the_new_kuryrport("db-1", no_uid.clone()).await;
    r.d.del(&no_uid).await.unwrap();
}

fn add_without_uid(pod: &str, container: &str, netns: &str) -> Vec<u8> {
    json!({"CNI_IFNAME": "eth0", "CNI_NETNS": netns, "CNI_CONTAINERID": container,
        "CNI_COMMAND": "ADD", "CNI_ARGS": format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}"), "config_kuryr": {}})
    .to_string()
    .into_bytes()
}

/// The same runtime, the pod watch between the old pod's deletion and the new pod: no UID is
/// known under the name, and an update of the old pod's KuryrPort (its finalizer being released)
/// comes after the deletion. The ADD waits for the new pod's KuryrPort; it plugged the old pod's
/// port, which the controller was handing back to a pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_without_a_pod_uid_never_takes_a_deleted_pods_kuryrport() {
    if !can_netns() {
        return;
    }
    use kube::runtime::watcher::Event as WEvent;
    let mut r = Recreated::new("db-2", 88);
    r.pods
        .on_event(WEvent::Delete(watched_pod("db-2", "u-old")), &r.d.registry);
    r.d.registry.apply_kuryrport(kuryrport(
        "default",
        "db-2",
        "u-old",
        "n1",
        std::slice::from_ref(&r.old),
    ));
    let no_uid = add_without_uid("db-2", "c-n", &r.ns.path());
    r.add_waits_for_the_new_kuryrport("db-2", no_uid.clone()).await;
    r.d.del(&no_uid).await.unwrap();
}

/// The same runtime right after the daemon started: its pod watch has not listed the node's
/// pods, so the KuryrPort under the name may be a deleted pod's. The ADD waits for the listing,
/// then for the KuryrPort of the pod it shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_without_a_pod_uid_waits_for_the_pod_watchs_first_listing() {
    if !can_netns() {
        return;
    }
    use kube::runtime::watcher::Event as WEvent;
    let mut r = Recreated::with_pod_watch("db-3", 89, false);
    let no_uid = add_without_uid("db-3", "c-n", &r.ns.path());
    let add = tokio::spawn({
        let (d, body) = (r.d.clone(), no_uid.clone());
        async move { d.add(&body).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!add.is_finished(), "ADD waits for the pod watch's first listing");
    assert!(
        !host_ok(&["ip", "-o", "link"]).contains(&r.old_tap),
        "the old pod's VIF must not be plugged"
    );
    for ev in [
        WEvent::Init,
        WEvent::InitApply(watched_pod("db-3", "u-new")),
        WEvent::InitDone,
    ] {
        r.pods.on_event(ev, &r.d.registry);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !add.is_finished(),
        "the KuryrPort is another pod's than the listed one"
    );
    r.d.registry.apply_kuryrport(kuryrport(
        "default",
        "db-3",
        "u-new",
        "n1",
        std::slice::from_ref(&r.new),
    ));
    let res = add.await.unwrap().unwrap();
    assert_eq!(
        res.vif["versioned_object.data"]["address"],
        r.new.mac.as_str(),
        "the new pod's VIF"
    );
    r.d.del(&no_uid).await.unwrap();
}

/// A pod force-deleted and made again under its name on the same node, the new sandbox's ADD
/// before the old one's DEL: the ADD takes the pod's one record, so the old container's DEL is
/// answered as stale (as upstream) - and its host-side veth (with OVS, its port) would have been
/// left for ever. The ADD takes down what only the old container had on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_containers_host_interfaces_go_with_the_new_add() {
    if !can_netns() {
        return;
    }
    let br = unique("kds");
    let _b = HostLink(br.clone());
    let (ns1, ns2) = (TestNetns::new("kds1"), TestNetns::new("kds2"));
    let old = vif(
        "eth0",
        "s",
        "fa:16:3e:00:36:01",
        "10.88.0.0/24",
        "10.88.0.5",
        None,
        &br,
    );
    let new = vif(
        "eth0",
        "t",
        "fa:16:3e:00:36:02",
        "10.88.0.0/24",
        "10.88.0.6",
        None,
        &br,
    );
    let old_tap = kuryr_crds::vif_name_for_port(&old.port_id);
    let new_tap = kuryr_crds::vif_name_for_port(&new.port_id);
    let _t = (HostLink(old_tap.clone()), HostLink(new_tap.clone()));
    let d = daemon();
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "web-0",
        "u1",
        "n1",
        std::slice::from_ref(&old),
    ));
    d.add(&body("web-0", "c1", &ns1.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(host_ok(&["ip", "-o", "link"]).contains(&old_tap));
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "web-0",
        "u2",
        "n1",
        std::slice::from_ref(&new),
    ));
    d.add(&body("web-0", "c2", &ns2.path(), "eth0", "u2"))
        .await
        .unwrap();
    let links = host_ok(&["ip", "-o", "link"]);
    assert!(
        !links.contains(&old_tap) && links.contains(&new_tap),
        "the old container's veth goes, the new one's stays: {links}"
    );
    // The old container's DEL, late: stale, and the new pod keeps its interface.
    d.del(&body("web-0", "c1", &ns1.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(host_ok(&["ip", "-o", "link"]).contains(&new_tap));
    assert!(ns2.exec_ok(&["ip", "-o", "link"]).contains("fa:16:3e:00:36:02"));
    // A new sandbox of the same pod (same port, same host name) keeps it too.
    d.add(&body("web-0", "c3", &ns2.path(), "eth0", "u2"))
        .await
        .unwrap();
    assert!(host_ok(&["ip", "-o", "link"]).contains(&new_tap));
    d.del(&body("web-0", "c3", &ns2.path(), "eth0", "u2"))
        .await
        .unwrap();
}

/// A Neutron port handed on to another pod (the first force-deleted, its port recycled through
/// the pool) is plugged under the same host interface name: the first pod's late DEL, and the
/// teardown of its superseded container when it is made again with another port, leave the
/// second pod's host end alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_handed_to_another_pod_survives_the_first_pods_late_teardown() {
    if !can_netns() {
        return;
    }
    let br = unique("kdh");
    let _b = HostLink(br.clone());
    let (ns1, ns2, ns3) = (
        TestNetns::new("kdh1"),
        TestNetns::new("kdh2"),
        TestNetns::new("kdh3"),
    );
    let shared = vif(
        "eth0",
        "h",
        "fa:16:3e:00:37:01",
        "10.89.0.0/24",
        "10.89.0.5",
        None,
        &br,
    );
    let other = vif(
        "eth0",
        "i",
        "fa:16:3e:00:37:02",
        "10.89.0.0/24",
        "10.89.0.6",
        None,
        &br,
    );
    let tap = kuryr_crds::vif_name_for_port(&shared.port_id);
    let other_tap = kuryr_crds::vif_name_for_port(&other.port_id);
    let _t = (HostLink(tap.clone()), HostLink(other_tap.clone()));
    let d = daemon();
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "a",
        "ua",
        "n1",
        std::slice::from_ref(&shared),
    ));
    d.add(&body("a", "c1", &ns1.path(), "eth0", "ua")).await.unwrap();
    // `a` force-deleted: its KuryrPort goes, its DEL has not come; the port is `b`'s now.
    d.registry.delete_kuryrport(&PodKey::new("default", "a"));
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "b",
        "ub",
        "n1",
        std::slice::from_ref(&shared),
    ));
    d.add(&body("b", "c2", &ns2.path(), "eth0", "ub")).await.unwrap();
    let b_alive = |why: &str| {
        let link = host_ok(&["ip", "-o", "link", "show", &tap]);
        assert!(link.contains("kuryr:c2:default/b"), "{why}: {link}");
        let pod = ns2.exec_ok(&["ip", "-o", "link"]);
        assert!(pod.contains("fa:16:3e:00:37:01"), "{why}: {pod}");
    };
    b_alive("plugged");
    // `a` made again (a StatefulSet's) with another port: its old container's host side goes,
    // but the shared name is `b`'s.
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "a",
        "ua2",
        "n1",
        std::slice::from_ref(&other),
    ));
    d.add(&body("a", "c3", &ns3.path(), "eth0", "ua2")).await.unwrap();
    b_alive("after a's superseded container was torn down");
    // `a`'s late DEL of its first container is stale; of its current one, only its own.
    d.del(&body("a", "c1", &ns1.path(), "eth0", "ua")).await.unwrap();
    d.del(&body("a", "c3", &ns3.path(), "eth0", "ua2")).await.unwrap();
    b_alive("after a's DELs");
    assert!(!host_ok(&["ip", "-o", "link"]).contains(&other_tap));
    d.del(&body("b", "c2", &ns2.path(), "eth0", "ub")).await.unwrap();
    assert!(!host_ok(&["ip", "-o", "link"]).contains(&tap));
}

/// A DEL without CNI_NETNS goes by the path recorded at ADD, but only into the namespace plugged
/// then: another one at that path now (a name made again, a reused pid's `/proc/<pid>/ns/net`)
/// keeps its interfaces, and the host side is still cleaned up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_by_the_recorded_path_leaves_another_namespace_there_alone() {
    if !can_netns() {
        return;
    }
    let br = unique("kdr");
    let _b = HostLink(br.clone());
    let ns = TestNetns::new("kdr");
    let v = vif(
        "eth0",
        "r",
        "fa:16:3e:00:39:01",
        "10.91.0.0/24",
        "10.91.0.5",
        None,
        &br,
    );
    let tap = kuryr_crds::vif_name_for_port(&v.port_id);
    let _t = HostLink(tap.clone());
    let d = daemon();
    d.registry
        .apply_kuryrport(kuryrport("default", "re", "u", "n1", std::slice::from_ref(&v)));
    d.add(&body("re", "c1", &ns.path(), "eth0", "u")).await.unwrap();
    // The namespace goes and another of the same name comes, with an eth0 of its own.
    let run = |args: &[&str]| {
        let st = std::process::Command::new("ip").args(args).status().unwrap();
        assert!(st.success(), "ip {args:?}");
    };
    run(&["netns", "del", &ns.name]);
    run(&["netns", "add", &ns.name]);
    run(&[
        "-n", &ns.name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
    ]);
    d.del(&body("re", "c1", "", "eth0", "u")).await.unwrap();
    let links = ns.exec_ok(&["ip", "-o", "link"]);
    assert!(
        links.contains("eth0"),
        "the other namespace keeps its eth0: {links}"
    );
    assert!(
        !host_ok(&["ip", "-o", "link"]).contains(&tap),
        "the host end is gone"
    );
}

/// Events that never get through (an API server throttling them).
struct HangingEvents;
#[async_trait]
impl kuryr_daemon::PodEvents for HangingEvents {
    async fn publish(&self, _: &PodKey, _: Option<&str>, _: &str, _: &str, _: bool) {
        std::future::pending::<()>().await
    }
}

/// The "waiting for the VIF" Event is a courtesy: one that hangs past the ADD's deadline does
/// not fail an ADD whose VIF arrived meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_event_does_not_fail_an_add_whose_vif_arrived() {
    if !can_netns() {
        return;
    }
    let br = unique("kde");
    let _b = HostLink(br.clone());
    let ns = TestNetns::new("kde");
    let v = vif(
        "eth0",
        "e",
        "fa:16:3e:00:38:01",
        "10.90.0.0/24",
        "10.90.0.5",
        None,
        &br,
    );
    let _t = HostLink(kuryr_crds::vif_name_for_port(&v.port_id));
    let mut cfg = DaemonConfig::new("n1");
    cfg.vif_annotation_timeout = Duration::from_secs(1);
    let d = Daemon::new(cfg, Arc::new(HangingEvents), Arc::new(ApiUp));
    let registry = d.registry.clone();
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        registry.apply_kuryrport(kuryrport("default", "ev", "u", "n1", std::slice::from_ref(&v)));
    });
    let added = d.add(&body("ev", "c1", &ns.path(), "eth0", "u")).await;
    late.await.unwrap();
    assert!(added.is_ok(), "{:?}", added.err());
    d.del(&body("ev", "c1", &ns.path(), "eth0", "u")).await.unwrap();
    // No VIF at all: the ADD times out on time, its "timed out" Event hanging too.
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        d.add(&body("none", "c2", &ns.path(), "eth0", "u2")),
    )
    .await
    .expect("the ADD is answered");
    assert!(answer.is_err(), "no VIF, no interface");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A nested macvlan VIF (`VIFMacvlanNested`) named `ifname`.
fn macvlan_vif(port_id: &str, mac: &str, cidr: &str, ip: &str) -> kuryr_crds::Vif {
    use kuryr_crds::vif::{FixedIp, Network, Subnet, VifBase, VifMacvlanNested};
    let mut base = VifBase::new(port_id, "noop");
    base.address = Some(mac.into());
    base.active = true;
    let mut net = Network::new(format!("net-{port_id}"));
    let mut subnet = Subnet::new(cidr, None);
    subnet.ips = vec![FixedIp::new(ip.parse().unwrap())].into();
    net.subnets = vec![subnet].into();
    base.network = Some(net);
    kuryr_crds::Vif::MacvlanNested(VifMacvlanNested {
        base,
        obj: Default::default(),
    })
}

/// A daemon restarted while a pod with a veth (eth0) and a nested macvlan
/// (eth1) is plugged: the macvlan lives only in the pod's namespace, so host
/// link aliases cannot bring it back; the state directory does. With the
/// KuryrPort gone, DEL still removes both interfaces and the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_daemon_tears_down_nested_bindings_from_its_state_dir() {
    if !can_netns() {
        return;
    }
    let vm = vm_interface("kdp");
    let parent = vm.0.clone();
    let pod = BridgePod::new("kdn", "m", "fa:16:3e:00:35:01", "10.87.0.0/24", "10.87.0.5");
    let ns = &pod.ns;
    let v0 = pod.v0.clone();
    let tap = pod.tap.clone();
    let pod = unique("nested");
    let mut kp = kuryrport("default", &pod, "u1", "n1", std::slice::from_ref(&v0));
    let port1 = format!("{}m1-0000", unique("d"));
    kp.status.as_mut().unwrap().vifs.insert(
        "eth1".into(),
        kuryr_crds::KuryrPortVif::new(
            false,
            macvlan_vif(&port1, "fa:16:3e:00:35:02", "10.88.0.0/24", "10.88.0.5"),
        ),
    );
    let state = tempfile::tempdir().unwrap();
    let cfg = || {
        let mut cfg = DaemonConfig::new("n1");
        cfg.vif_annotation_timeout = Duration::from_secs(2);
        cfg.binding.link_iface = Some(parent.clone());
        cfg.state_dir = Some(state.path().to_path_buf());
        cfg
    };
    let first = Daemon::new(cfg(), Arc::new(NoEvents), Arc::new(ApiUp));
    first.registry.apply_kuryrport(kp);
    first
        .add(&body(&pod, "ctr", &ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    let links = ns.exec_ok(&["ip", "-d", "-o", "link"]);
    assert!(
        links.contains("eth0") && links.contains("eth1") && links.contains("macvlan"),
        "{links}"
    );
    drop(first);

    // A new daemon process; the pod's KuryrPort is already gone.
    let d = Daemon::new(cfg(), Arc::new(NoEvents), Arc::new(ApiUp));
    assert!(d.restore_from_host().await.unwrap() >= 1);
    let att = d
        .registry
        .get(&PodKey::new("default", &pod))
        .unwrap()
        .attachment
        .unwrap();
    assert_eq!(att.container_id, "ctr");
    assert_eq!(att.netns.as_deref(), Some(ns.path().as_str()));
    let kinds: Vec<_> = att.specs.iter().map(|s| s.kind.driver_name()).collect();
    assert_eq!(kinds, vec!["neutron-vif/bridge", "nested-macvlan"]);
    // The stale-DEL protection survives too.
    d.del(&body(&pod, "old-ctr", &ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(ns.exec_ok(&["ip", "-o", "link"]).contains("eth1"));
    // The kubelet's DEL may come without a namespace path.
    d.del(&body(&pod, "ctr", "", "eth0", "u1")).await.unwrap();
    let links = ns.exec_ok(&["ip", "-o", "link"]);
    assert!(!links.contains("eth0") && !links.contains("eth1"), "{links}");
    assert!(!host_ok(&["ip", "-o", "link"]).contains(&tap));
    assert_eq!(
        std::fs::read_dir(state.path()).unwrap().count(),
        0,
        "the record goes with the attachment"
    );
}

#[test]
fn sriov_pod_resource_options_come_from_kuryr_conf() {
    let ini = "[sriov]\nenable_pod_resource_service = True\nkubelet_root_dir = /srv/kubelet\n\
               physnet_resource_mappings = physnet1:sriov_a,physnet2:sriov_b\n\
               device_plugin_resource_prefix = example.org\n";
    let k = kuryr_config::KuryrConfig::from_ini_str(ini)
        .expect("loads")
        .config;
    let s = DaemonConfig::from_kuryr_config(&k, "n1").binding.sriov.options;
    assert!(s.enable_pod_resource_service);
    assert_eq!(s.kubelet_root_dir, "/srv/kubelet");
    assert_eq!(
        s.resource_of_physnet("physnet2").as_deref(),
        Ok("example.org/sriov_b")
    );
    // Upstream's defaults: off, /var/lib/kubelet, intel.com.
    let d = DaemonConfig::from_kuryr_config(&kuryr_config::KuryrConfig::default(), "n1")
        .binding
        .sriov
        .options;
    assert!(!d.enable_pod_resource_service);
    assert_eq!(d.kubelet_root_dir, "/var/lib/kubelet");
    assert_eq!(
        d.resource_of_physnet("physnet1").as_deref(),
        Ok("intel.com/physnet1")
    );
}

/// A DEL for a pod the daemon knows nothing of (its state file lost, its KuryrPort already
/// gone) still takes the interface the runtime names out of the container's namespace, as
/// upstream cleans up: a nested device left there would hold its VLAN id (or MAC) on the VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_knowing_nothing_of_the_pod_removes_its_interface() {
    if !can_netns() {
        return;
    }
    let vm = vm_interface("kdq");
    let parent = vm.0.clone();
    let ns = TestNetns::new("kdk");
    let pod = unique("lost");
    let port = format!("{}m0-0000", unique("d"));
    let mut kp = kuryrport("default", &pod, "u1", "n1", &[]);
    kp.status.as_mut().unwrap().vifs.insert(
        "eth0".into(),
        kuryr_crds::KuryrPortVif::new(
            true,
            macvlan_vif(&port, "fa:16:3e:00:36:01", "10.89.0.0/24", "10.89.0.5"),
        ),
    );
    let cfg = || {
        let mut cfg = DaemonConfig::new("n1");
        cfg.vif_annotation_timeout = Duration::from_secs(2);
        cfg.binding.link_iface = Some(parent.clone());
        cfg
    };
    let first = Daemon::new(cfg(), Arc::new(NoEvents), Arc::new(ApiUp));
    first.registry.apply_kuryrport(kp);
    first
        .add(&body(&pod, "ctr", &ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(ns.exec_ok(&["ip", "-d", "-o", "link"]).contains("macvlan"));
    drop(first);
    // A new daemon without a state directory, and the KuryrPort is gone.
    let d = Daemon::new(cfg(), Arc::new(NoEvents), Arc::new(ApiUp));
    d.del(&body(&pod, "ctr", &ns.path(), "eth0", "u1")).await.unwrap();
    let links = ns.exec_ok(&["ip", "-o", "link"]);
    assert!(!links.contains("eth0"), "{links}");
    // Again: nothing left is no error.
    d.del(&body(&pod, "ctr", &ns.path(), "eth0", "u1")).await.unwrap();
}

/// `/gc` is served on the TCP API too: one without `cni.dev/valid-attachments` is a bad request, not
/// "nothing is valid", which would tear down every pod of the node; an explicitly empty list still
/// means that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_without_its_valid_attachments_tears_down_nothing() {
    if !can_netns() {
        return;
    }
    let pod = BridgePod::new("kdg", "g", "fa:16:3e:00:37:01", "10.90.0.0/24", "10.90.0.5");
    let d = daemon();
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "gc",
        "u1",
        "n1",
        std::slice::from_ref(&pod.v0),
    ));
    d.add(&body("gc", "ctr", &pod.ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    for config in [json!({}), json!({"cniVersion": "1.1.0"}), json!(null)] {
        let e = d
            .gc(json!({"config_kuryr": config}).to_string().as_bytes())
            .await
            .err()
            .unwrap();
        assert_eq!((e.code(), e.status().as_u16()), (4, 400), "{e}");
        assert!(e.to_string().contains("cni.dev/valid-attachments"), "{e}");
    }
    assert!(
        pod.ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"),
        "the pod keeps its interface"
    );
    assert!(host_ok(&["ip", "-o", "link"]).contains(&pod.tap));
    let listed =
        json!({"config_kuryr": {"cni.dev/valid-attachments": [{"containerID": "ctr", "ifname": "eth0"}]}});
    assert_eq!(d.gc(listed.to_string().as_bytes()).await.unwrap(), 0);
    let none = json!({"config_kuryr": {"cni.dev/valid-attachments": []}});
    assert_eq!(d.gc(none.to_string().as_bytes()).await.unwrap(), 1);
    assert!(!pod.ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"));
}

/// CNI_NETNS naming the daemon's own (the host's) namespace is no pod's: an ADD or CHECK is refused
/// before anything is touched (an ADD's leftover cleanup deletes by CNI_IFNAME), a DEL is served on
/// the host side only (it must go through: the kubelet retries a refused one for ever); the host link
/// named CNI_IFNAME stays either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemons_own_namespace_is_no_pods() {
    if !can_netns() {
        return;
    }
    let pod = BridgePod::new("kdh", "h", "fa:16:3e:00:38:01", "10.91.0.0/24", "10.91.0.5");
    // A host link named as CNI_IFNAME will be: the ADD's leftover cleanup would take it.
    let victim = HostLink(unique("khv"));
    host_ok(&["ip", "link", "add", &victim.0, "type", "bridge"]);
    let d = daemon();
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "h",
        "u1",
        "n1",
        std::slice::from_ref(&pod.v0),
    ));
    for own in ["/proc/self/ns/net", "/proc/1/ns/net"] {
        let same = std::fs::metadata(own)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .ok()
            == std::fs::metadata("/proc/self/ns/net")
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .ok();
        if !same {
            continue; // pid 1 is in another namespace (a container)
        }
        let e = d
            .add(&body("h", "ctr", own, &victim.0, "u1"))
            .await
            .err()
            .unwrap();
        assert_eq!((e.code(), e.status().as_u16()), (4, 400), "{e}");
        assert!(e.to_string().contains("CNI_NETNS"), "{e}");
        // A DEL goes through (the kubelet would retry a refused one for ever), host side only.
        d.del(&body("h", "ctr", own, &victim.0, "u1"))
            .await
            .expect("a DEL naming the daemon's own namespace is served, host side only");
        let e = d
            .check(&body("h", "ctr", own, &victim.0, "u1"))
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("CNI_NETNS"), "{e}");
        let links = host_ok(&["ip", "-d", "-o", "link", "show", &victim.0]);
        assert!(links.contains("bridge"), "the host link is untouched: {links}");
    }
    assert!(
        !host_ok(&["ip", "-o", "link"]).contains(&pod.tap),
        "nothing plugged"
    );
}

/// An ADD clears a leftover of its own kind under CNI_IFNAME in the pod, never a link of another
/// kind (not one kuryr made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_leaves_a_foreign_link_under_its_name_alone() {
    if !can_netns() {
        return;
    }
    let pod = BridgePod::new("kdf", "f", "fa:16:3e:00:39:01", "10.92.0.0/24", "10.92.0.5");
    pod.ns.exec_ok(&["ip", "link", "add", "eth0", "type", "bridge"]);
    let d = daemon();
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "f",
        "u1",
        "n1",
        std::slice::from_ref(&pod.v0),
    ));
    let e = d
        .add(&body("f", "ctr", &pod.ns.path(), "eth0", "u1"))
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("eth0") && e.to_string().contains("bridge"),
        "{e}"
    );
    let links = pod.ns.exec_ok(&["ip", "-d", "-o", "link", "show", "eth0"]);
    assert!(links.contains("bridge"), "{links}");
    // A leftover veth of an interrupted ADD goes.
    pod.ns.exec_ok(&["ip", "link", "del", "eth0"]);
    pod.ns.exec_ok(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "left",
    ]);
    d.add(&body("f", "ctr", &pod.ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    let links = pod.ns.exec_ok(&["ip", "-o", "link"]);
    assert!(!links.contains("left"), "{links}");
}

/// A DEL with an empty CNI_CONTAINERID names no container: stale, as upstream answers it (204,
/// touching nothing), never a teardown of the pod's current attachment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_without_a_container_id_is_stale() {
    if !can_netns() {
        return;
    }
    let pod = BridgePod::new("kde", "e", "fa:16:3e:00:3a:01", "10.93.0.0/24", "10.93.0.5");
    let d = daemon();
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "e",
        "u1",
        "n1",
        std::slice::from_ref(&pod.v0),
    ));
    d.add(&body("e", "ctr", &pod.ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    for netns in [pod.ns.path(), String::new()] {
        d.del(&body("e", "", &netns, "eth0", "u1")).await.unwrap();
        assert!(
            pod.ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"),
            "the pod keeps eth0"
        );
        assert!(host_ok(&["ip", "-o", "link"]).contains(&pod.tap));
        let att = d
            .registry
            .get(&PodKey::new("default", "e"))
            .and_then(|e| e.attachment);
        assert_eq!(att.map(|a| a.container_id).as_deref(), Some("ctr"));
    }
    d.del(&body("e", "ctr", &pod.ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(!pod.ns.exec_ok(&["ip", "-o", "link"]).contains("eth0"));
}

/// A KuryrPort deleted under a live pod (its finalizer stripped by hand) and made again by the
/// controller serves the pod again: only the deleted object's own late events keep it dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kuryrport_made_again_for_a_live_pod_serves_it() {
    if !can_netns() {
        return;
    }
    let pod = BridgePod::new("kdk", "k", "fa:16:3e:00:3b:01", "10.94.0.0/24", "10.94.0.5");
    let key = PodKey::new("default", "k");
    let kp = |object_uid: &str| {
        let mut kp = kuryrport("default", "k", "u1", "n1", std::slice::from_ref(&pod.v0));
        kp.metadata.uid = Some(object_uid.into());
        kp
    };
    let d = daemon();
    d.registry.apply_kuryrport(kp("kp-1"));
    d.add(&body("k", "ctr", &pod.ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    d.registry.delete_kuryrport(&key);
    // A late event of the deleted object: the pod stays gone.
    d.registry.apply_kuryrport(kp("kp-1"));
    let e = d
        .check(&body("k", "ctr", &pod.ns.path(), "eth0", "u1"))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), 3, "{e}");
    // The controller's new KuryrPort for the same pod.
    d.registry.apply_kuryrport(kp("kp-2"));
    d.check(&body("k", "ctr", &pod.ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    // The same through a re-list of the KuryrPort watch.
    d.registry.delete_kuryrport(&key);
    d.registry.replace_kuryrports(vec![kp("kp-3")], Vec::new());
    d.check(&body("k", "ctr", &pod.ns.path(), "eth0", "u1"))
        .await
        .unwrap();
    // A new sandbox of the pod is plugged, not answered 410.
    let other = TestNetns::new("kdk");
    d.add(&body("k", "ctr2", &other.path(), "eth0", "u1"))
        .await
        .unwrap();
    assert!(other.exec_ok(&["ip", "-o", "link"]).contains("eth0"));
    // A pod the pod watch reported deleted stays gone whatever KuryrPort comes.
    d.registry.pod_deleted(&key, "u1");
    d.registry.apply_kuryrport(kp("kp-4"));
    let e = d
        .check(&body("k", "ctr2", &other.path(), "eth0", "u1"))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), 3, "{e}");
}

/// Events posted, by reason.
#[derive(Default)]
struct RecordedEvents(std::sync::Mutex<Vec<String>>);

#[async_trait]
impl kuryr_daemon::PodEvents for RecordedEvents {
    async fn publish(&self, _: &PodKey, _: Option<&str>, reason: &str, _: &str, _: bool) {
        self.0.lock().unwrap().push(reason.to_string());
    }
}

fn add_within(pod: &str, netns: &str, plugin_timeout: Value) -> Vec<u8> {
    json!({"CNI_IFNAME": "eth0", "CNI_NETNS": netns, "CNI_CONTAINERID": "ctr", "CNI_COMMAND": "ADD",
        "CNI_ARGS": format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_UID=u1"),
        "config_kuryr": {"kuryr_daemon_timeout": plugin_timeout}})
    .to_string()
    .into_bytes()
}

/// The plugin hangs up after its `kuryr_daemon_timeout` (sent in `config_kuryr`): an ADD answers
/// before it, with its 504 and the timeout's Warning Event, whether it waits for VIFs or for their
/// activation, however long `vif_annotation_timeout` is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_answers_before_the_plugin_hangs_up() {
    if !can_netns() {
        return;
    }
    let events = Arc::new(RecordedEvents::default());
    let mut cfg = DaemonConfig::new("n1");
    cfg.vif_annotation_timeout = WAIT;
    let d = Daemon::new(cfg, events.clone(), Arc::new(ApiUp));
    let pod = BridgePod::new("kdt", "t", "fa:16:3e:00:3c:01", "10.95.0.0/24", "10.95.0.5");
    // No KuryrPort: the VIF wait.
    let started = std::time::Instant::now();
    let e = d
        .add(&add_within("t", &pod.ns.path(), json!(4)))
        .await
        .err()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!((e.code(), e.status().as_u16()), (11, 504), "{e}");
    assert!(
        events
            .0
            .lock()
            .unwrap()
            .contains(&"CNITimeoutKuryrPortRegistry".to_string())
    );
    // A VIF that never goes ACTIVE: the activation wait.
    let mut v0 = pod.v0.clone();
    v0.active = false;
    d.registry
        .apply_kuryrport(kuryrport("default", "t", "u1", "n1", std::slice::from_ref(&v0)));
    let started = std::time::Instant::now();
    let e = d
        .add(&add_within("t", &pod.ns.path(), json!(4.5)))
        .await
        .err()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(4500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(e.code(), 11, "{e}");
    assert!(
        events
            .0
            .lock()
            .unwrap()
            .contains(&"CNITimedOutWaitingForActiveVIFs".to_string())
    );
    // A timeout that is no number of seconds is refused, naming it.
    for bad in [json!("60"), json!(0), json!(-1)] {
        let e = d.add(&add_within("t", &pod.ns.path(), bad)).await.err().unwrap();
        assert_eq!(e.code(), 4, "{e}");
        assert!(e.to_string().contains("kuryr_daemon_timeout"), "{e}");
    }
}

/// An API that knows one pod's UID under each name (a pod absent from it does not exist).
struct PodsApi(std::collections::HashMap<String, String>);

#[async_trait]
impl ApiHealth for PodsApi {
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }

    async fn pod_uid(&self, key: &PodKey) -> Result<Option<String>, String> {
        Ok(self.0.get(&key.name).cloned())
    }
}

fn daemon_with_pods(pods: &[(&str, &str)]) -> Arc<Daemon> {
    let mut cfg = DaemonConfig::new("n1");
    cfg.vif_annotation_timeout = WAIT;
    let pods = pods.iter().map(|(n, u)| (n.to_string(), u.to_string())).collect();
    Daemon::new(cfg, Arc::new(NoEvents), Arc::new(PodsApi(pods)))
}

/// A runtime that passes no K8S_POD_UID: the pod is the one there when the ADD started (the
/// pod watch's, the API not being asked here), so its deletion mid-wait is a 410 at once rather
/// than a wait for its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_less_add_ends_when_its_pod_is_deleted_mid_wait() {
    use kube::runtime::watcher::Event as WEvent;
    let Some(other) = other_netns() else {
        return;
    };
    let d = event_driven_daemon();
    let mut pods = kuryr_daemon::kube::PodTracker::default();
    d.registry.pod_watch_started();
    for ev in [
        WEvent::Init,
        WEvent::InitApply(watched_pod("gone-1", "u1")),
        WEvent::InitDone,
    ] {
        pods.on_event(ev, &d.registry);
    }
    let add = tokio::spawn({
        let d = d.clone();
        async move { d.add(&add_without_uid("gone-1", "c1", other)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!add.is_finished(), "waits for the KuryrPort");
    pods.on_event(WEvent::Delete(watched_pod("gone-1", "u1")), &d.registry);
    let e = tokio::time::timeout(Duration::from_secs(5), add)
        .await
        .expect("410 at once, not after the VIF wait")
        .unwrap()
        .err()
        .unwrap();
    assert_eq!((e.code(), e.status().as_u16()), (3, 410), "{e}");
}

/// The same runtime: the API names the pod under the name (as upstream GETs it); a pod watch behind
/// it (still showing the deleted pod, whose KuryrPort is being released) never gets the new pod
/// plugged into the old one's port, and a pod the API does not have is a 410 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_less_add_goes_by_the_pod_the_api_names() {
    use kube::runtime::watcher::Event as WEvent;
    let Some(other) = other_netns() else {
        return;
    };
    let d = daemon_with_pods(&[("db-9", "u-new")]);
    let e = tokio::time::timeout(
        Duration::from_secs(5),
        d.add(&add_without_uid("nobody", "c1", other)),
    )
    .await
    .expect("at once")
    .err()
    .unwrap();
    assert_eq!(e.code(), 3, "{e}");
    assert!(e.to_string().contains("default/nobody"), "{e}");
    if !can_netns() {
        return;
    }
    let old = BridgePod::new("kdo", "o", "fa:16:3e:00:3d:01", "10.96.0.0/24", "10.96.0.5");
    let new = BridgePod::new("kdn", "n", "fa:16:3e:00:3d:02", "10.96.0.0/24", "10.96.0.6");
    let mut pods = kuryr_daemon::kube::PodTracker::default();
    d.registry.pod_watch_started();
    for ev in [
        WEvent::Init,
        WEvent::InitApply(watched_pod("db-9", "u-old")),
        WEvent::InitDone,
    ] {
        pods.on_event(ev, &d.registry);
    }
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "db-9",
        "u-old",
        "n1",
        std::slice::from_ref(&old.v0),
    ));
    let add = tokio::spawn({
        let (d, body) = (d.clone(), add_without_uid("db-9", "c-n", &old.ns.path()));
        async move { d.add(&body).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!add.is_finished(), "the KuryrPort is the deleted pod's");
    assert!(
        !host_ok(&["ip", "-o", "link"]).contains(&old.tap),
        "the old pod's VIF is not plugged"
    );
    d.registry.apply_kuryrport(kuryrport(
        "default",
        "db-9",
        "u-new",
        "n1",
        std::slice::from_ref(&new.v0),
    ));
    let res = add.await.unwrap().unwrap();
    assert_eq!(res.vif["versioned_object.data"]["address"], new.v0.mac.as_str());
}
