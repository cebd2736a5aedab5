//! kube-rs 5 (`kube::Client`, `kube::runtime`) against the emulator.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config};
use kube_emulator::{KubeEmulator, KubeOptions};
use serde_json::json;

mod common;
use common::eventually;

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": value}}))
        .expect("valid ConfigMap")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_runtime_against_emulator() {
    let opts = KubeOptions {
        bookmark_interval: Duration::from_millis(300),
        ..KubeOptions::default()
    };
    let handle = KubeEmulator::start(opts).await.expect("emulator starts");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    handle.write_kubeconfig(&path).expect("kubeconfig");
    let kubeconfig = Kubeconfig::read_from(&path).expect("kubeconfig parses");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    let client = Client::try_from(config).expect("client");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    api.create(&PostParams::default(), &cm("before", "0"))
        .await
        .expect("create before watch");

    let (reader, writer) = reflector::store();
    let inits = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let (i2, e2) = (inits.clone(), errors.clone());
    let stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Init) => {
                    i2.fetch_add(1, Ordering::SeqCst);
                }
                Ok(_) => {}
                Err(_) => {
                    e2.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    });
    let has = |name: &'static str| {
        let reader = reader.clone();
        move || reader.get(&ObjectRef::new(name).within("default")).is_some()
    };
    let value = |name: &'static str| {
        let reader = reader.clone();
        move || {
            reader
                .get(&ObjectRef::new(name).within("default"))
                .and_then(|c| c.data.clone())
                .and_then(|d| d.get("k").cloned())
        }
    };
    eventually("initial list", has("before")).await;

    // adds, updates, deletes
    api.create(&PostParams::default(), &cm("a", "1"))
        .await
        .expect("create a");
    eventually("add seen", has("a")).await;
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .expect("patch a");
    let v = value("a");
    eventually("update seen", || v().as_deref() == Some("2")).await;
    api.delete("before", &DeleteParams::default())
        .await
        .expect("delete before");
    let h = has("before");
    eventually("delete seen", || !h()).await;
    assert_eq!(inits.load(Ordering::SeqCst), 1);

    // A forced disconnect resumes from the last resourceVersion without a re-list.
    handle.drop_watches();
    tokio::time::sleep(Duration::from_millis(200)).await;
    api.create(&PostParams::default(), &cm("b", "1"))
        .await
        .expect("create b");
    eventually("add after disconnect", has("b")).await;
    assert_eq!(
        inits.load(Ordering::SeqCst),
        1,
        "a plain disconnect must not force a re-list"
    );

    // After compaction the resume gets 410 and the watcher re-lists.
    handle.compact();
    handle.drop_watches();
    api.create(&PostParams::default(), &cm("c", "1"))
        .await
        .expect("create c");
    eventually("add after compaction", has("c")).await;
    let i = inits.clone();
    eventually("re-list after 410", || i.load(Ordering::SeqCst) >= 2).await;

    // Stale PUT -> 409.
    let mut stale = api.get("a").await.expect("get a");
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "3"}})),
    )
    .await
    .expect("bump a");
    stale.data = Some([("k".to_string(), "stale".to_string())].into());
    match api.replace("a", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(ae)) => assert_eq!((ae.code, ae.reason.as_str()), (409, "Conflict")),
        other => panic!("stale PUT must conflict, got {other:?}"),
    }
    // A no-op write keeps the resourceVersion.
    let current = api.get("a").await.expect("get a");
    let same = api
        .replace("a", &PostParams::default(), &current)
        .await
        .expect("no-op PUT");
    assert_eq!(same.metadata.resource_version, current.metadata.resource_version);

    // Finalizer add via JSON patch with a test op (the kube-rs finalizer helper's exact shape).
    let add: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/guard"]}
    ]))
    .expect("patch");
    api.patch("a", &PatchParams::default(), &Patch::Json::<()>(add.clone()))
        .await
        .expect("add finalizer");
    match api
        .patch("a", &PatchParams::default(), &Patch::Json::<()>(add))
        .await
    {
        Err(kube::Error::Api(ae)) => assert_eq!(ae.code, 422),
        other => panic!("second test op must fail, got {other:?}"),
    }

    // DELETE with a finalizer returns the object, marked for deletion.
    match api.delete("a", &DeleteParams::default()).await.expect("delete a") {
        either::Either::Left(obj) => assert!(obj.metadata.deletion_timestamp.is_some()),
        either::Either::Right(status) => panic!("expected the object, got {status:?}"),
    }
    let h = has("a");
    assert!(h(), "object with a finalizer must survive DELETE");
    let remove: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/guard"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .expect("patch");
    api.patch("a", &PatchParams::default(), &Patch::Json::<()>(remove))
        .await
        .expect("remove finalizer");
    eventually("delete after last finalizer", || !h()).await;
    match api.get("a").await {
        Err(kube::Error::Api(ae)) => assert_eq!(ae.code, 404),
        other => panic!("expected 404, got {other:?}"),
    }

    // Server-side apply with a field manager creates, then updates.
    let ssa = PatchParams::apply("emulator-test").force();
    api.patch("d", &ssa, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}, "data": {"k": "1", "x": "y"}}))).await.expect("apply create");
    let d = api.patch("d", &ssa, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}, "data": {"k": "2"}}))).await.expect("apply update");
    let data = d.data.expect("data");
    assert_eq!(data.get("k").map(String::as_str), Some("2"));
    assert!(
        !data.contains_key("x"),
        "fields dropped from the applied config are removed"
    );

    handle.shutdown().await.expect("shutdown");
}

/// kube-runtime's event Recorder writes events.k8s.io/v1 Events (the CNI daemon uses it).
#[tokio::test]
async fn kube_runtime_recorder_publishes_events_v1() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::events::v1::Event as EventV1;
    use kube::Resource;
    use kube::api::{ListParams, PostParams};
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};

    let handle = KubeEmulator::start(KubeOptions::default())
        .await
        .expect("emulator");
    let client =
        kube::Client::try_from(kube::Config::new(handle.url().parse().expect("url"))).expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let obj = cms
        .create(&PostParams::default(), &cm("evented", "x"))
        .await
        .expect("create");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "kuryr-test".into(),
            instance: None,
        },
    );
    let ev = Event {
        type_: EventType::Warning,
        reason: "VifNotActive".into(),
        note: Some("waiting".into()),
        action: "Wiring".into(),
        secondary: None,
    };
    recorder
        .publish(&ev, &obj.object_ref(&()))
        .await
        .expect("publish");
    let events: Api<EventV1> = Api::namespaced(client, "default");
    let listed = events
        .list(&ListParams::default().fields("regarding.name=evented"))
        .await
        .expect("list by regarding.name");
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].reason.as_deref(), Some("VifNotActive"));
    assert_eq!(
        listed.items[0].reporting_controller.as_deref(),
        Some("kuryr-test")
    );
}
