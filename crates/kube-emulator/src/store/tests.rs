//! Unit tests of the store, without HTTP.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{DeleteOpts, EventType, ListOpts, Propagation, Store, StoreConfig, WatchEvent, WriteOpts};
use crate::patch::PatchType;
use crate::resources::ResourceDef;

fn store() -> Store {
    Store::new(StoreConfig::default())
}

fn configmaps(store: &Store) -> Arc<ResourceDef> {
    store
        .find("", "v1", "configmaps")
        .expect("configmaps are built in")
}

fn namespaces(store: &Store) -> Arc<ResourceDef> {
    store
        .find("", "v1", "namespaces")
        .expect("namespaces are built in")
}

fn cm(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

fn create_cm(store: &Store, ns: &str, body: Value) -> Value {
    store
        .create(&configmaps(store), ns, body, &WriteOpts::default())
        .expect("create")
        .object
        .as_ref()
        .clone()
}

fn meta<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or_default()
}

fn names(items: &[Arc<Value>]) -> Vec<String> {
    items.iter().map(|o| meta(o, "name").to_string()).collect()
}

fn manager(name: &str) -> WriteOpts {
    WriteOpts {
        field_manager: Some(name.into()),
        ..WriteOpts::default()
    }
}

#[test]
fn every_write_gets_the_next_resource_version_and_stale_updates_conflict() {
    let store = store();
    let def = configmaps(&store);
    let before = store.resource_version();
    let created = create_cm(&store, "default", cm("a", json!({"k": "1"})));
    let rv: u64 = meta(&created, "resourceVersion").parse().expect("numeric rv");
    assert_eq!(rv, before + 1);
    assert!(!meta(&created, "uid").is_empty());

    let mut changed = created.clone();
    changed["data"]["k"] = json!("2");
    let updated = store
        .update(
            &def,
            "default",
            "a",
            changed.clone(),
            false,
            &WriteOpts::default(),
        )
        .expect("update at the current rv")
        .object;
    assert_eq!(meta(&updated, "resourceVersion"), (rv + 1).to_string());
    // `changed` still carries the old resourceVersion.
    let e = store
        .update(&def, "default", "a", changed, false, &WriteOpts::default())
        .expect_err("stale");
    assert_eq!((e.code, e.reason), (409, "Conflict"));
    let e = store
        .create(&def, "default", cm("a", json!({})), &WriteOpts::default())
        .expect_err("exists");
    assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
}

#[test]
fn an_update_that_changes_nothing_is_not_a_write() {
    let store = store();
    let def = configmaps(&store);
    let created = create_cm(&store, "default", cm("same", json!({"k": "v"})));
    let rv = store.resource_version();
    let out = store
        .update(
            &def,
            "default",
            "same",
            created.clone(),
            false,
            &WriteOpts::default(),
        )
        .expect("no-op update");
    assert_eq!(*out.object, created);
    assert_eq!(store.resource_version(), rv);
}

#[test]
fn list_pages_with_limit_and_continue_in_name_order() {
    let store = store();
    let def = configmaps(&store);
    for n in ["c", "a", "d", "b", "e"] {
        create_cm(&store, "default", cm(n, json!({})));
    }
    create_cm(&store, "kube-system", cm("other-ns", json!({})));
    let mut opts = ListOpts {
        limit: Some(2),
        ..ListOpts::default()
    };
    let mut seen = Vec::new();
    let mut remaining = Vec::new();
    loop {
        let page = store.list(&def, Some("default"), &opts).expect("list");
        seen.extend(names(&page.items));
        remaining.push(page.remaining);
        match page.continue_ {
            Some(c) => opts.continue_ = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);
    assert_eq!(remaining, [Some(3), Some(1), None]);
    let all = store
        .list(&def, None, &ListOpts::default())
        .expect("cluster-wide list");
    assert_eq!(all.items.len(), 6);
    opts.continue_ = Some("not-a-token".into());
    assert_eq!(store.list(&def, None, &opts).expect_err("bad token").code, 400);
}

#[test]
fn a_continue_token_keeps_its_first_page_version_and_expires_with_compaction() {
    let store = store();
    let def = configmaps(&store);
    for n in ["a", "b", "c", "d"] {
        create_cm(&store, "default", cm(n, json!({})));
    }
    let mut opts = ListOpts {
        limit: Some(1),
        ..ListOpts::default()
    };
    let first = store.list(&def, None, &opts).expect("first page");
    let b_then = store
        .list(&def, Some("default"), &ListOpts::default())
        .expect("all")
        .items[1]
        .clone();
    // Changed between pages: later pages still show the first page's snapshot.
    create_cm(&store, "default", cm("e", json!({})));
    let b = store.get(&def, "default", "b").expect("b");
    let mut changed = (*b).clone();
    changed["data"] = json!({"k": "v"});
    store
        .update(&def, "default", "b", changed, false, &WriteOpts::default())
        .expect("update b");
    store
        .delete(&def, "default", "c", &DeleteOpts::default())
        .expect("delete c");
    opts.continue_ = first.continue_.clone();
    let second = store.list(&def, None, &opts).expect("second page");
    assert_eq!(
        second.resource_version, first.resource_version,
        "pages of one list keep the first page's version (a watch after the list starts there)"
    );
    assert_eq!(*second.items[0], *b_then, "b as it was at the first page");
    opts.continue_ = second.continue_.clone();
    let third = store.list(&def, None, &opts).expect("third page");
    assert_eq!(names(&third.items), ["c"], "c, deleted since, is in the snapshot");
    opts.continue_ = third.continue_.clone();
    let fourth = store.list(&def, None, &opts).expect("fourth page");
    assert_eq!(names(&fourth.items), ["d"], "e, created since, is not");
    assert_eq!(fourth.continue_, None);
    let second = third;
    store.compact();
    opts.continue_ = second.continue_.clone();
    let e = store.list(&def, None, &opts).expect_err("compacted");
    assert_eq!((e.code, e.reason), (410, "Expired"));
    assert!(
        e.message
            .starts_with("The provided continue parameter is too old"),
        "{}",
        e.message
    );
    let status = e.to_status();
    let offered = status["metadata"]["continue"]
        .as_str()
        .expect("a token offered")
        .to_string();
    // The offered token goes on after the same place, at the current version.
    opts.continue_ = Some(offered);
    let mut rest = Vec::new();
    loop {
        let page = store.list(&def, None, &opts).expect("inconsistent continuation");
        assert_eq!(page.resource_version, store.resource_version());
        rest.extend(names(&page.items));
        match page.continue_ {
            Some(c) => opts.continue_ = Some(c),
            None => break,
        }
    }
    assert_eq!(rest, ["d", "e"], "the current state after c (deleted)");
}

#[test]
fn watch_replays_history_from_a_version_and_compaction_makes_it_gone() {
    let store = store();
    let def = configmaps(&store);
    create_cm(&store, "default", cm("before", json!({})));
    let from = store.resource_version();
    create_cm(&store, "default", cm("after", json!({})));
    create_cm(&store, "kube-system", cm("elsewhere", json!({})));
    let start = store.watch(&def, Some("default"), Some(from)).expect("watch");
    let replayed: Vec<(EventType, String)> = start
        .initial
        .iter()
        .map(|e| (e.type_, meta(&e.object, "name").to_string()))
        .collect();
    assert_eq!(replayed, [(EventType::Added, "after".to_string())]);

    let fresh = store
        .watch(&def, Some("default"), None)
        .expect("watch without rv");
    assert_eq!(
        fresh
            .initial
            .iter()
            .map(|e| meta(&e.object, "name"))
            .collect::<Vec<_>>(),
        ["after", "before"],
        "the current state as synthetic ADDED events"
    );

    store.compact();
    let e = store.watch(&def, None, Some(from)).err().expect("too old");
    assert_eq!((e.code, e.reason), (410, "Expired"));
}

#[test]
fn live_events_fan_out_to_the_namespace_and_cluster_watchers_once() {
    let store = store();
    let def = configmaps(&store);
    let mut in_ns = store.watch(&def, Some("default"), None).expect("ns watch").rx;
    let mut all = store.watch(&def, None, None).expect("cluster watch").rx;
    create_cm(&store, "kube-system", cm("x", json!({})));
    create_cm(&store, "default", cm("y", json!({})));
    let got_all: Vec<Arc<WatchEvent>> = [all.try_recv(), all.try_recv()]
        .into_iter()
        .map(|r| r.expect("cluster watcher gets both"))
        .collect();
    assert_eq!(got_all[0].ns, "kube-system");
    assert_eq!(got_all[1].ns, "default");
    let ev = in_ns.try_recv().expect("namespace watcher gets its event");
    assert_eq!(meta(&ev.object, "name"), "y");
    assert!(in_ns.try_recv().is_err(), "and nothing else");
    assert!(ev.line.starts_with(b"{\"type\":\"ADDED\",\"object\":"));
    // Both watchers share the one serialized event.
    assert!(Arc::ptr_eq(&ev, &got_all[1]));
}

#[test]
fn server_side_apply_conflicts_on_fields_another_manager_owns_unless_forced() {
    let store = store();
    let def = configmaps(&store);
    let apply = |mgr: &str, value: &str, force: bool| {
        let opts = WriteOpts {
            force,
            ..manager(mgr)
        };
        store.patch(
            &def,
            "default",
            "ssa",
            PatchType::Apply,
            cm("ssa", json!({"k": value})),
            false,
            &opts,
        )
    };
    assert!(apply("alice", "1", false).expect("apply creates").created);
    let e = apply("bob", "2", false).expect_err("alice owns data.k");
    assert_eq!(e.code, 409);
    assert!(e.message.contains("alice"), "names the owner: {}", e.message);
    let out = apply("bob", "2", true).expect("forced");
    assert_eq!(out.object["data"]["k"], "2");
    let owners: Vec<&str> = out.object["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter(|e| e["fieldsV1"]["f:data"].get("f:k").is_some())
        .map(|e| e["manager"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(owners, ["bob"], "force moves ownership");
    // A manager that stops applying a field it alone owns removes it.
    let out = store
        .patch(
            &def,
            "default",
            "ssa",
            PatchType::Apply,
            cm("ssa", json!({})),
            false,
            &manager("bob"),
        )
        .expect("apply without data.k");
    assert!(out.object["data"].get("k").is_none(), "{}", out.object);
}

#[test]
fn finalizers_hold_a_deleted_object_until_they_are_removed() {
    let store = store();
    let def = configmaps(&store);
    let mut body = cm("fin", json!({}));
    body["metadata"]["finalizers"] = json!(["example.com/hold"]);
    create_cm(&store, "default", body);
    let (obj, gone) = store
        .delete(&def, "default", "fin", &DeleteOpts::default())
        .expect("delete");
    assert!(!gone);
    assert!(!meta(&obj, "deletionTimestamp").is_empty());
    let e = store
        .patch(
            &def,
            "default",
            "fin",
            PatchType::Merge,
            json!({"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}}),
            false,
            &WriteOpts::default(),
        )
        .expect_err("no new finalizers while deleting");
    assert_eq!(e.code, 422);
    store
        .patch(
            &def,
            "default",
            "fin",
            PatchType::Merge,
            json!({"metadata": {"finalizers": null}}),
            false,
            &WriteOpts::default(),
        )
        .expect("remove the finalizer");
    assert_eq!(store.get(&def, "default", "fin").expect_err("gone").code, 404);
}

fn owned_cm(name: &str, owner: &Value, block: bool) -> Value {
    let mut body = cm(name, json!({}));
    body["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
        "name": meta(owner, "name"), "uid": meta(owner, "uid"), "blockOwnerDeletion": block}]);
    body
}

fn run_gc(store: &Store) {
    while store.collect_garbage_step() {}
}

#[test]
fn background_deletion_collects_dependents_and_orphan_keeps_them() {
    let store = store();
    let def = configmaps(&store);
    let owner = create_cm(&store, "default", cm("owner", json!({})));
    create_cm(&store, "default", owned_cm("dep", &owner, false));
    store
        .delete(&def, "default", "owner", &DeleteOpts::default())
        .expect("delete owner");
    assert!(
        store.get(&def, "default", "dep").is_ok(),
        "the collector runs afterwards"
    );
    run_gc(&store);
    assert_eq!(
        store.get(&def, "default", "dep").expect_err("collected").code,
        404
    );

    let owner = create_cm(&store, "default", cm("owner2", json!({})));
    create_cm(&store, "default", owned_cm("dep2", &owner, false));
    let orphan = DeleteOpts {
        propagation: Propagation::Orphan,
        ..DeleteOpts::default()
    };
    store
        .delete(&def, "default", "owner2", &orphan)
        .expect("orphan delete");
    run_gc(&store);
    let dep = store.get(&def, "default", "dep2").expect("orphans stay");
    assert!(dep["metadata"].get("ownerReferences").is_none());
}

#[test]
fn foreground_deletion_waits_for_blocking_dependents() {
    let store = store();
    let def = configmaps(&store);
    let owner = create_cm(&store, "default", cm("fg", json!({})));
    let mut dep = owned_cm("fg-dep", &owner, true);
    dep["metadata"]["finalizers"] = json!(["example.com/hold"]);
    create_cm(&store, "default", dep);
    let fg = DeleteOpts {
        propagation: Propagation::Foreground,
        ..DeleteOpts::default()
    };
    let (obj, gone) = store.delete(&def, "default", "fg", &fg).expect("delete");
    assert!(!gone);
    assert_eq!(obj["metadata"]["finalizers"], json!(["foregroundDeletion"]));
    run_gc(&store);
    assert!(
        store.get(&def, "default", "fg").is_ok(),
        "the blocking dependent is still there"
    );
    store
        .patch(
            &def,
            "default",
            "fg-dep",
            PatchType::Merge,
            json!({"metadata": {"finalizers": null}}),
            false,
            &WriteOpts::default(),
        )
        .expect("release the dependent");
    run_gc(&store);
    assert_eq!(
        store
            .get(&def, "default", "fg")
            .expect_err("owner goes last")
            .code,
        404
    );
}

#[test]
fn a_deleted_namespace_takes_its_objects_and_refuses_new_ones() {
    let store = store();
    let ns_def = namespaces(&store);
    let def = configmaps(&store);
    store
        .create(
            &ns_def,
            "",
            json!({"metadata": {"name": "team"}}),
            &WriteOpts::default(),
        )
        .expect("namespace");
    let mut held = cm("held", json!({}));
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    create_cm(&store, "team", held);
    create_cm(&store, "team", cm("plain", json!({})));
    let (ns, gone) = store
        .delete(&ns_def, "", "team", &DeleteOpts::default())
        .expect("delete namespace");
    assert!(!gone, "a finalizer still holds an object");
    assert_eq!(ns["status"]["phase"], "Terminating");
    assert_eq!(store.get(&def, "team", "plain").expect_err("deleted").code, 404);
    let e = store
        .create(&def, "team", cm("new", json!({})), &WriteOpts::default())
        .expect_err("terminating");
    assert_eq!(e.code, 403);
    store
        .patch(
            &def,
            "team",
            "held",
            PatchType::Merge,
            json!({"metadata": {"finalizers": null}}),
            false,
            &WriteOpts::default(),
        )
        .expect("release");
    assert_eq!(store.get(&ns_def, "", "team").expect_err("finalized").code, 404);
}

#[test]
fn snapshot_and_restore_round_trip() {
    let store = store();
    let def = configmaps(&store);
    create_cm(&store, "default", cm("kept", json!({"k": "v"})));
    let snap = store.snapshot();
    let rv = store.resource_version();
    let restored = Store::new(StoreConfig::default());
    restored.restore(&snap).expect("restore");
    assert_eq!(restored.resource_version(), rv);
    let obj = restored.get(&def, "default", "kept").expect("object is back");
    assert_eq!(obj["data"]["k"], "v");
    let e = restored
        .restore(&json!({"objects": []}))
        .expect_err("needs a resourceVersion");
    assert!(e.contains("resourceVersion"));
}

#[test]
fn restore_moves_events_k8s_io_events_into_the_core_storage() {
    let s = store();
    let snap = json!({"resourceVersion": 7, "objects": [{"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e1", "namespace": "default"}, "regarding": {"name": "p"}, "note": "n"}]});
    s.restore(&snap).expect("restore");
    let core = s.find("", "v1", "events").expect("core events");
    let e = s.get(&core, "default", "e1").expect("in the core storage");
    assert_eq!(e["apiVersion"], "v1");
    assert_eq!(e["involvedObject"]["name"], "p");
    assert_eq!(e["message"], "n");
}

#[test]
fn a_pod_on_a_node_gets_the_nodes_internal_ip_as_host_ip() {
    let store = store();
    let nodes = store.find("", "v1", "nodes").expect("nodes are built in");
    let pods = store.find("", "v1", "pods").expect("pods are built in");
    let node = |name: &str, addresses: Value| {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"addresses": addresses}})
    };
    for n in [
        node(
            "n1",
            json!([{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.1"}]),
        ),
        node("n2", json!([{"type": "InternalIP", "address": "10.0.0.2"}])),
        node("bare", json!([{"type": "Hostname", "address": "bare"}])),
    ] {
        store.create(&nodes, "", n, &WriteOpts::default()).expect("node");
    }
    let pod = |name: &str, node: Option<&str>| {
        let mut spec = json!({"containers": [{"name": "c", "image": "i"}]});
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
    };
    let create = |body: Value| {
        store
            .create(&pods, "default", body, &WriteOpts::default())
            .expect("pod")
            .object
    };
    // Created on a node.
    let on_n1 = create(pod("a", Some("n1")));
    assert_eq!(on_n1["status"]["hostIP"], json!("10.0.0.1"));
    assert_eq!(on_n1["status"]["hostIPs"], json!([{"ip": "10.0.0.1"}]));
    // Bound later by a scheduler.
    let pending = create(pod("b", None));
    assert!(pending["status"].get("hostIP").is_none());
    store
        .bind("default", "b", &json!({"target": {"kind": "Node", "name": "n2"}}))
        .expect("bind");
    let bound = store.get(&pods, "default", "b").expect("pod b");
    assert_eq!(bound["status"]["hostIP"], json!("10.0.0.2"));
    // A node without an InternalIP (or unknown) gives none.
    assert!(create(pod("c", Some("bare")))["status"].get("hostIP").is_none());
    assert!(
        create(pod("d", Some("nowhere")))["status"]
            .get("hostIP")
            .is_none()
    );
}

#[test]
fn generation_counts_spec_changes_only_and_a_metadata_only_change_is_a_write() {
    let store = store();
    let deps = store
        .find("apps", "v1", "deployments")
        .expect("deployments are built in");
    let body = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
    let created = store
        .create(&deps, "default", body, &WriteOpts::default())
        .expect("create")
        .object;
    let generation = |o: &Value| {
        o.pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    let rv = |o: &Value| meta(o, "resourceVersion").to_string();
    let patch = |p: Value| {
        store
            .patch(
                &deps,
                "default",
                "d",
                PatchType::Merge,
                p,
                false,
                &WriteOpts::default(),
            )
            .expect("patch")
            .object
    };
    // A label: a write (new version), not a new generation.
    let labelled = patch(json!({"metadata": {"labels": {"x": "y"}}}));
    assert_ne!(rv(&labelled), rv(&created));
    assert_eq!(generation(&labelled), generation(&created));
    // The same label again: no write at all.
    let again = patch(json!({"metadata": {"labels": {"x": "y"}}}));
    assert_eq!(rv(&again), rv(&labelled));
    // A spec change: a new generation.
    let scaled = patch(json!({"spec": {"replicas": 3}}));
    assert_eq!(generation(&scaled), generation(&created) + 1);
    // Status is a subresource of Deployments: a status write through it is no new generation.
    let status = store
        .patch(
            &deps,
            "default",
            "d",
            PatchType::Merge,
            json!({"status": {"replicas": 3}}),
            true,
            &WriteOpts::default(),
        )
        .expect("status patch")
        .object;
    assert_ne!(rv(&status), rv(&scaled));
    assert_eq!(generation(&status), generation(&scaled));
}
