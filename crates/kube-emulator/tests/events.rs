//! core/v1 and events.k8s.io/v1 Events are one resource in two shapes: whatever is written through
//! one group is read, selected, watched, patched and deleted through the other.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent};
use k8s_openapi::api::events::v1::Event as EventV1;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube_emulator::{KubeEmulator, KubeOptions};
use serde_json::json;

async fn client(handle: &kube_emulator::KubeHandle) -> kube::Client {
    kube::Client::try_from(kube::Config::new(handle.url().parse().expect("url"))).expect("client")
}

#[tokio::test]
async fn recorder_events_and_their_series_are_core_events() {
    let handle = KubeEmulator::start(KubeOptions::default())
        .await
        .expect("emulator");
    let client = client(&handle).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "evented"}})).expect("ConfigMap");
    let obj = cms.create(&PostParams::default(), &cm).await.expect("create");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "kuryr-test".into(),
            instance: Some("node-1".into()),
        },
    );
    let ev = Event {
        type_: EventType::Warning,
        reason: "VifNotActive".into(),
        note: Some("waiting".into()),
        action: "Wiring".into(),
        secondary: None,
    };
    // The second publish of the same event is a merge patch that adds a series.
    for _ in 0..2 {
        recorder
            .publish(&ev, &obj.object_ref(&()))
            .await
            .expect("publish");
    }

    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let listed = core
        .list(&ListParams::default().fields("involvedObject.name=evented,reportingComponent=kuryr-test"))
        .await
        .expect("core list by involvedObject.name");
    assert_eq!(listed.items.len(), 1, "{listed:?}");
    let e = &listed.items[0];
    assert_eq!(e.involved_object.kind.as_deref(), Some("ConfigMap"));
    assert_eq!(e.message.as_deref(), Some("waiting"));
    assert_eq!(e.reason.as_deref(), Some("VifNotActive"));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.action.as_deref(), Some("Wiring"));
    assert_eq!(e.reporting_component.as_deref(), Some("kuryr-test"));
    assert_eq!(e.reporting_instance.as_deref(), Some("node-1"));
    assert_eq!(e.series.as_ref().and_then(|s| s.count), Some(2));
    assert!(e.event_time.is_some());

    let name = e.metadata.name.clone().expect("name");
    let got = core.get(&name).await.expect("core get");
    assert_eq!(got.message.as_deref(), Some("waiting"));
    let v1: Api<EventV1> = Api::namespaced(client, "default");
    let got = v1.get(&name).await.expect("events.k8s.io get");
    assert_eq!(got.regarding.and_then(|r| r.name).as_deref(), Some("evented"));
    assert_eq!(got.series.map(|s| s.count), Some(2));

    handle.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn one_event_in_two_shapes_through_every_verb() {
    let handle = KubeEmulator::start(KubeOptions::default())
        .await
        .expect("emulator");
    let client = client(&handle).await;
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let v1: Api<EventV1> = Api::namespaced(client.clone(), "default");
    let ev: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "pod-a.1"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "pod-a", "apiVersion": "v1"},
        "message": "pulled", "reason": "Pulled", "type": "Normal", "count": 3,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:01:00Z",
        "source": {"component": "kubelet", "host": "node-1"},
    }))
    .expect("core Event");
    core.create(&PostParams::default(), &ev)
        .await
        .expect("core create");

    let got = v1.get("pod-a.1").await.expect("events.k8s.io get");
    assert_eq!(
        got.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("pod-a")
    );
    assert_eq!(got.note.as_deref(), Some("pulled"));
    assert_eq!(got.deprecated_count, Some(3));
    assert!(got.deprecated_first_timestamp.is_some() && got.deprecated_last_timestamp.is_some());
    assert_eq!(
        got.deprecated_source
            .as_ref()
            .and_then(|s| s.component.as_deref()),
        Some("kubelet")
    );

    // Each shape selects on its own field names, and not on the other's.
    let by_regarding = v1
        .list(&ListParams::default().fields("regarding.name=pod-a"))
        .await
        .expect("regarding.name");
    assert_eq!(by_regarding.items.len(), 1);
    let none = v1
        .list(&ListParams::default().fields("regarding.name=pod-b"))
        .await
        .expect("regarding.name");
    assert!(none.items.is_empty());
    assert!(
        v1.list(&ListParams::default().fields("involvedObject.name=pod-a"))
            .await
            .is_err()
    );
    assert!(
        core.list(&ListParams::default().fields("regarding.name=pod-a"))
            .await
            .is_err()
    );

    // Each watcher sees its own shape.
    let rv = by_regarding.metadata.resource_version.clone().expect("rv");
    let mut v1_watch = v1
        .watch(&WatchParams::default().fields("regarding.name=pod-a"), &rv)
        .await
        .expect("v1 watch")
        .boxed();
    let mut core_watch = core
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("core watch")
        .boxed();

    // A merge patch in the events.k8s.io shape lands in the core fields.
    v1.patch(
        "pod-a.1",
        &PatchParams::default(),
        &Patch::Merge(json!({"note": "pulled again", "deprecatedCount": 4})),
    )
    .await
    .expect("v1 patch");
    let c = core.get("pod-a.1").await.expect("core get");
    assert_eq!(c.message.as_deref(), Some("pulled again"));
    assert_eq!(c.count, Some(4));
    match v1_watch.try_next().await.expect("v1 watch item") {
        Some(WatchEvent::Modified(e)) => assert_eq!(e.note.as_deref(), Some("pulled again")),
        other => panic!("unexpected v1 watch item {other:?}"),
    }
    match core_watch.try_next().await.expect("core watch item") {
        Some(WatchEvent::Modified(e)) => assert_eq!(e.message.as_deref(), Some("pulled again")),
        other => panic!("unexpected core watch item {other:?}"),
    }

    // A JSON patch through core is visible through events.k8s.io.
    core.patch(
        "pod-a.1",
        &PatchParams::default(),
        &Patch::<()>::Json(
            serde_json::from_value(json!([{"op": "replace", "path": "/message", "value": "third"}]))
                .expect("json patch"),
        ),
    )
    .await
    .expect("core patch");
    assert_eq!(
        v1.get("pod-a.1").await.expect("v1 get").note.as_deref(),
        Some("third")
    );
    v1.patch(
        "pod-a.1",
        &PatchParams::default(),
        &Patch::<()>::Json(
            serde_json::from_value(json!([{"op": "replace", "path": "/note", "value": "fourth"}]))
                .expect("json patch"),
        ),
    )
    .await
    .expect("v1 json patch");
    assert_eq!(
        core.get("pod-a.1").await.expect("core get").message.as_deref(),
        Some("fourth")
    );

    // An update (PUT) through events.k8s.io.
    let mut cur = v1.get("pod-a.1").await.expect("v1 get");
    cur.reason = Some("Updated".into());
    let put = v1
        .replace("pod-a.1", &PostParams::default(), &cur)
        .await
        .expect("v1 replace");
    assert_eq!(put.note.as_deref(), Some("fourth"));
    assert_eq!(
        core.get("pod-a.1").await.expect("core get").reason.as_deref(),
        Some("Updated")
    );

    // Deleted through one group, gone from both.
    v1.delete("pod-a.1", &DeleteParams::default())
        .await
        .expect("v1 delete");
    assert!(core.get_opt("pod-a.1").await.expect("core get").is_none());
    match v1.get("pod-a.1").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 404);
            assert!(
                s.message.contains("events.events.k8s.io \"pod-a.1\" not found"),
                "{s:?}"
            );
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    match core_watch.try_next().await.expect("core watch item") {
        Some(WatchEvent::Modified(_)) => {
            // the JSON patch and the update; the delete follows
            loop {
                match core_watch.try_next().await.expect("core watch item") {
                    Some(WatchEvent::Deleted(e)) => {
                        assert_eq!(e.message.as_deref(), Some("fourth"));
                        break;
                    }
                    Some(WatchEvent::Modified(_)) => {}
                    other => panic!("unexpected core watch item {other:?}"),
                }
            }
        }
        other => panic!("unexpected core watch item {other:?}"),
    }

    handle.shutdown().await.expect("shutdown");
}
