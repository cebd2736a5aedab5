//! Scheduler and kubelet stand-ins, plus GC, persistence and plain-HTTP checks through reqwest.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kube_emulator::standins::{spawn_kubelet, spawn_scheduler};
use kube_emulator::{DeleteOpts, KubeEmulator, KubeOptions, WriteOpts};
use serde_json::{Value, json};

mod common;
use common::eventually;

/// Status code of an authenticated GET.
async fn get_status(http: &reqwest::Client, url: String) -> u16 {
    let r = http.get(url).bearer_auth("tok").send().await;
    r.expect("get").status().as_u16()
}

/// Body of an authenticated GET.
async fn get_json(http: &reqwest::Client, url: String) -> Value {
    let r = http.get(url).bearer_auth("tok").send().await.expect("get");
    r.json().await.expect("json body")
}

fn pod(name: &str, selector: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    if let Some(node) = selector {
        p["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_and_kubelet_run_pods() {
    let opts = KubeOptions {
        nodes: vec!["n1".into(), "n2".into()],
        ..KubeOptions::default()
    };
    let handle = KubeEmulator::start(opts).await.expect("start");
    let store = handle.store();
    let counter = Arc::new(AtomicUsize::new(0));
    let torn_down = Arc::new(AtomicUsize::new(0));
    let c = counter.clone();
    let t = torn_down.clone();
    let _scheduler = spawn_scheduler(store.clone());
    let _kubelet = spawn_kubelet(
        store.clone(),
        Vec::new(),
        Arc::new(move |pod: Value| {
            let n = c.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if pod.pointer("/metadata/name").and_then(Value::as_str) == Some("broken") {
                    return Err("CNI ADD failed: no VIF".to_string());
                }
                Ok(Some(format!("10.0.0.{}", n + 10)))
            })
        }),
        Some(Arc::new(move |_pod: Value| {
            let t = t.clone();
            Box::pin(async move {
                t.fetch_add(1, Ordering::SeqCst);
            })
        })),
    );
    let pods = store.find("", "v1", "pods").expect("pods served");
    for (name, sel) in [
        ("p1", None),
        ("p2", None),
        ("p3", None),
        ("pinned", Some("n2")),
        ("broken", None),
    ] {
        store
            .create(&pods, "default", pod(name, sel), &WriteOpts::default())
            .expect("create pod");
    }
    let get = |name: &str| store.get(&pods, "default", name).expect("pod exists");
    for name in ["p1", "p2", "p3", "pinned"] {
        eventually(&format!("{name} running"), || {
            get(name).pointer("/status/phase") == Some(&json!("Running"))
        })
        .await;
        let ip = get(name)
            .pointer("/status/podIP")
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_default();
        assert!(ip.starts_with("10.0.0."), "{name} has IP {ip}");
    }
    assert_eq!(get("pinned").pointer("/spec/nodeName"), Some(&json!("n2")));
    let nodes: std::collections::HashSet<String> = ["p1", "p2", "p3"]
        .iter()
        .filter_map(|n| {
            get(n)
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .collect();
    assert_eq!(nodes.len(), 2, "round-robin uses both nodes");
    // The failing pod stays Pending and gets a Warning event.
    let events = store.find("", "v1", "events").expect("events served");
    eventually("failure event", || {
        store
            .list(&events, Some("default"), &Default::default())
            .map(|p| {
                p.items.iter().any(|e| {
                    e["reason"] == "FailedCreatePodSandBox" && e["involvedObject"]["name"] == "broken"
                })
            })
            .unwrap_or(false)
    })
    .await;
    assert_eq!(get("broken").pointer("/status/phase"), Some(&json!("Pending")));
    store
        .delete(&pods, "default", "p1", &DeleteOpts::default())
        .expect("delete p1");
    let td = torn_down.clone();
    eventually("teardown called", || td.load(Ordering::SeqCst) == 1).await;
    handle.shutdown().await.expect("shutdown");
}

/// A pod whose setup never ends (its port never comes, or it is deleted first) must not hold up
/// the pods created after it, and deleting it cancels its setup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_pod_does_not_hold_up_the_others() {
    let opts = KubeOptions {
        nodes: vec!["n1".into()],
        ..KubeOptions::default()
    };
    let handle = KubeEmulator::start(opts).await.expect("start");
    let store = handle.store();
    let cancelled = Arc::new(AtomicUsize::new(0));
    let c = cancelled.clone();
    let _scheduler = spawn_scheduler(store.clone());
    let _kubelet = spawn_kubelet(
        store.clone(),
        Vec::new(),
        Arc::new(move |pod: Value| {
            let c = c.clone();
            Box::pin(async move {
                if pod.pointer("/metadata/name").and_then(Value::as_str) == Some("slow") {
                    // Counts a cancellation: dropped before the (endless) wait ends.
                    struct OnDrop(Arc<AtomicUsize>);
                    impl Drop for OnDrop {
                        fn drop(&mut self) {
                            self.0.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    let _guard = OnDrop(c);
                    std::future::pending::<()>().await;
                }
                Ok(Some("10.0.0.9".to_string()))
            })
        }),
        None,
    );
    let pods = store.find("", "v1", "pods").expect("pods served");
    store
        .create(&pods, "default", pod("slow", None), &WriteOpts::default())
        .expect("create slow");
    // Let the kubelet pick the slow pod first.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for name in ["q1", "q2"] {
        store
            .create(&pods, "default", pod(name, None), &WriteOpts::default())
            .expect("create pod");
    }
    let get = |name: &str| store.get(&pods, "default", name).expect("pod exists");
    for name in ["q1", "q2"] {
        eventually(&format!("{name} running behind a slow pod"), || {
            get(name).pointer("/status/phase") == Some(&json!("Running"))
        })
        .await;
    }
    assert_eq!(get("slow").pointer("/status/phase"), Some(&json!("Pending")));
    assert_eq!(cancelled.load(Ordering::SeqCst), 0);
    store
        .delete(&pods, "default", "slow", &DeleteOpts::default())
        .expect("delete slow");
    let c = cancelled.clone();
    eventually("the deleted pod's setup cancelled", || {
        c.load(Ordering::SeqCst) == 1
    })
    .await;
    handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_persistence_auth_and_http_errors() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("state.json");
    let opts = KubeOptions {
        persist_path: Some(file.clone()),
        token: Some("tok".into()),
        ..KubeOptions::default()
    };
    let handle = KubeEmulator::start(opts.clone()).await.expect("start");
    let http = reqwest::Client::new();
    let url = handle.url().to_string();
    let cms = format!("{url}/api/v1/namespaces/default/configmaps");

    let unauth = http.get(&cms).send().await.expect("request");
    assert_eq!(unauth.status().as_u16(), 401);
    let post = |body: Value| http.post(&cms).bearer_auth("tok").json(&body).send();
    let owner: Value = post(json!({"metadata": {"name": "owner"}}))
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let uid = owner["metadata"]["uid"].as_str().expect("uid").to_string();
    let dep = post(json!({"metadata": {"name": "dep", "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]}})).await.expect("post");
    assert_eq!(dep.status().as_u16(), 201);
    let dup = post(json!({"metadata": {"name": "dep"}})).await.expect("post");
    assert_eq!(dup.status().as_u16(), 409);
    let status: Value = dup.json().await.expect("status");
    assert_eq!(
        (status["kind"].as_str(), status["reason"].as_str()),
        (Some("Status"), Some("AlreadyExists"))
    );
    let dry = http
        .post(format!("{cms}?dryRun=All"))
        .bearer_auth("tok")
        .json(&json!({"metadata": {"name": "dry"}}))
        .send()
        .await
        .expect("post");
    assert_eq!(dry.status().as_u16(), 201);
    assert_eq!(get_status(&http, format!("{cms}/dry")).await, 404);
    // Paging.
    let page: Value = get_json(&http, format!("{cms}?&limit=1")).await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1));
    let token = page["metadata"]["continue"].as_str().expect("continue token");
    let rest: Value = get_json(&http, format!("{cms}?limit=1&continue={token}")).await;
    assert_eq!(rest["items"][0]["metadata"]["name"], "owner");
    // Unsupported field selector -> 400; unsupported method -> 405.
    assert_eq!(
        get_status(&http, format!("{cms}?fieldSelector=spec.bogus=1")).await,
        400
    );
    assert_eq!(
        http.post(format!("{cms}/owner"))
            .bearer_auth("tok")
            .json(&json!({}))
            .send()
            .await
            .expect("post")
            .status()
            .as_u16(),
        405
    );

    // Background GC: deleting the owner removes the dependent.
    let del = http
        .delete(format!("{cms}/owner"))
        .bearer_auth("tok")
        .send()
        .await
        .expect("delete");
    assert_eq!(del.status().as_u16(), 200);
    // The garbage collector runs in the background: the dependent goes soon after, not within the DELETE.
    let store = handle.store();
    let cm_def = store.find("", "v1", "configmaps").expect("configmaps served");
    eventually("dependent garbage-collected", || {
        store.get(&cm_def, "default", "dep").is_err()
    })
    .await;
    assert_eq!(get_status(&http, format!("{cms}/dep")).await, 404);

    post(json!({"metadata": {"name": "kept"}, "data": {"a": "b"}}))
        .await
        .expect("post");
    let rv_before = handle.store().resource_version();
    handle.shutdown().await.expect("shutdown saves");

    // Restart from the persisted file.
    let handle = KubeEmulator::start(opts).await.expect("restart");
    let kept: Value = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/namespaces/default/configmaps/kept",
            handle.url()
        ))
        .bearer_auth("tok")
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(kept["data"]["a"], "b");
    assert!(
        handle.store().resource_version() >= rv_before,
        "resourceVersion never goes backwards across restarts"
    );
    handle.shutdown().await.expect("shutdown");
}
