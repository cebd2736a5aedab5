//! API semantics checked over plain HTTP (reqwest): server-side apply field ownership, watch
//! bookmarks, dryRun on every write verb, no-op writes.

use std::time::Duration;

use futures::StreamExt;
use kube_emulator::{KubeEmulator, KubeHandle, KubeOptions};
use serde_json::{Value, json};

struct Http {
    client: reqwest::Client,
    base: String,
}

impl Http {
    fn new(handle: &KubeHandle) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            client: reqwest::Client::new(),
            base: handle.url().to_string(),
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> (u16, Value) {
        let resp = req.send().await.expect("request sent");
        let code = resp.status().as_u16();
        let body = resp.json().await.unwrap_or(Value::Null);
        (code, body)
    }

    async fn apply(&self, path: &str, manager: &str, force: bool, body: Value) -> (u16, Value) {
        let url = format!(
            "{}{path}?fieldManager={manager}{}",
            self.base,
            if force { "&force=true" } else { "" }
        );
        self.send(
            self.client
                .patch(url)
                .header("content-type", "application/apply-patch+yaml")
                .body(body.to_string()),
        )
        .await
    }

    async fn patch(&self, path: &str, query: &str, ctype: &str, body: Value) -> (u16, Value) {
        self.send(
            self.client
                .patch(format!("{}{path}?{query}", self.base))
                .header("content-type", ctype)
                .body(body.to_string()),
        )
        .await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.client.get(format!("{}{path}", self.base))).await
    }
}

fn managers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| {
                    format!(
                        "{}/{}",
                        e["manager"].as_str().unwrap_or_default(),
                        e["operation"].as_str().unwrap_or_default()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn owned_by<'a>(obj: &'a Value, manager: &str) -> &'a Value {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|e| e["manager"] == manager))
        .map(|e| &e["fieldsV1"])
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_tracks_field_ownership_between_managers() {
    let handle = KubeEmulator::start(KubeOptions::default()).await.expect("start");
    let http = Http::new(&handle);
    let cm = "/api/v1/namespaces/default/configmaps/shared";
    let cfg = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"}, "data": data});

    let (code, _) = http
        .apply(cm, "alice", false, cfg(json!({"a": "1", "shared": "s"})))
        .await;
    assert_eq!(code, 201);
    // Same value for a field alice owns: no conflict, the ownership is shared.
    let (code, obj) = http
        .apply(cm, "bob", false, cfg(json!({"shared": "s", "b": "2"})))
        .await;
    assert_eq!(code, 200, "{obj}");
    assert_eq!(managers(&obj), ["alice/Apply", "bob/Apply"]);
    assert_eq!(
        owned_by(&obj, "bob"),
        &json!({"f:data": {"f:b": {}, "f:shared": {}}})
    );

    // A different value for a field alice owns: 409 naming manager and field, nothing written.
    let rv = obj["metadata"]["resourceVersion"].clone();
    let (code, status) = http
        .apply(
            cm,
            "bob",
            false,
            cfg(json!({"a": "bob's", "shared": "s", "b": "2"})),
        )
        .await;
    assert_eq!(code, 409, "{status}");
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(
        status["message"],
        "Apply failed with 1 conflict: conflict with \"alice\": .data.a"
    );
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "FieldManagerConflict", "message": "conflict with \"alice\"", "field": ".data.a"}])
    );
    let (_, now) = http.get(cm).await;
    assert_eq!(now["metadata"]["resourceVersion"], rv);
    assert_eq!(now["data"]["a"], "1");
    // Two conflicting fields: the plural message lists them per manager.
    let (code, status) = http
        .apply(cm, "bob", false, cfg(json!({"a": "x", "shared": "y", "b": "2"})))
        .await;
    assert_eq!(code, 409);
    assert_eq!(
        status["message"],
        "Apply failed with 2 conflicts: conflicts with \"alice\":\n- .data.a\n- .data.shared"
    );

    // force=true takes the field over.
    let (code, obj) = http
        .apply(
            cm,
            "bob",
            true,
            cfg(json!({"a": "bob's", "shared": "s", "b": "2"})),
        )
        .await;
    assert_eq!(code, 200, "{obj}");
    assert_eq!(obj["data"]["a"], "bob's");
    assert_eq!(owned_by(&obj, "alice"), &json!({"f:data": {"f:shared": {}}}));
    // alice can now apply without "a" (bob owns it, so it stays) ...
    let (code, obj) = http.apply(cm, "alice", false, cfg(json!({"shared": "s"}))).await;
    assert_eq!(code, 200, "{obj}");
    assert_eq!(obj["data"], json!({"a": "bob's", "shared": "s", "b": "2"}));
    // ... and bob dropping "shared" keeps it (alice owns it) while "b", only bob's, goes.
    let (code, obj) = http.apply(cm, "bob", false, cfg(json!({"a": "bob's"}))).await;
    assert_eq!(code, 200, "{obj}");
    assert_eq!(obj["data"], json!({"a": "bob's", "shared": "s"}));

    // A non-apply write takes ownership of what it changes: a later apply conflicts with it.
    let (code, obj) = http
        .patch(
            cm,
            "fieldManager=editor",
            "application/merge-patch+json",
            json!({"data": {"shared": "edited"}}),
        )
        .await;
    assert_eq!(code, 200, "{obj}");
    assert_eq!(owned_by(&obj, "editor"), &json!({"f:data": {"f:shared": {}}}));
    let (code, status) = http.apply(cm, "alice", false, cfg(json!({"shared": "s"}))).await;
    assert_eq!(code, 409, "{status}");
    assert_eq!(
        status["message"],
        "Apply failed with 1 conflict: conflict with \"editor\" using v1: .data.shared"
    );

    // Pods: containers are keyed by name, finalizers are a set, labels a map.
    let pod = "/api/v1/namespaces/default/pods/web";
    let pod_cfg = |labels: Value, finalizers: Value, containers: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": labels, "finalizers": finalizers},
               "spec": {"containers": containers}})
    };
    let (code, obj) = http
        .apply(
            pod,
            "alice",
            false,
            pod_cfg(
                json!({"app": "web"}),
                json!(["example.com/a"]),
                json!([{"name": "c1", "image": "busybox"}]),
            ),
        )
        .await;
    assert_eq!(code, 201, "{obj}");
    assert_eq!(
        owned_by(&obj, "alice")["f:spec"]["f:containers"],
        json!({"k:{\"name\":\"c1\"}": {".": {}, "f:image": {}, "f:name": {}}})
    );
    let (code, status) = http
        .apply(
            pod,
            "bob",
            false,
            pod_cfg(json!({}), json!([]), json!([{"name": "c1", "image": "nginx"}])),
        )
        .await;
    assert_eq!(code, 409, "{status}");
    assert_eq!(
        status["details"]["causes"][0]["field"],
        ".spec.containers[name=\"c1\"].image"
    );
    let (code, obj) = http
        .apply(
            pod,
            "bob",
            false,
            pod_cfg(
                json!({"tier": "front"}),
                json!(["example.com/b"]),
                json!([{"name": "c2", "image": "nginx"}]),
            ),
        )
        .await;
    assert_eq!(code, 200, "{obj}");
    let names: Vec<&str> = obj["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["c1", "c2"]);
    assert_eq!(
        obj["metadata"]["finalizers"],
        json!(["example.com/a", "example.com/b"])
    );
    assert_eq!(obj["metadata"]["labels"], json!({"app": "web", "tier": "front"}));
    // alice drops her finalizer, label and container: only hers go.
    let (code, obj) = http
        .apply(
            pod,
            "alice",
            false,
            pod_cfg(json!({}), json!([]), json!([{"name": "c2", "image": "nginx"}])),
        )
        .await;
    assert_eq!(code, 200, "{obj}");
    assert_eq!(obj["metadata"]["finalizers"], json!(["example.com/b"]));
    assert_eq!(obj["metadata"]["labels"], json!({"tier": "front"}));
    assert_eq!(
        obj["spec"]["containers"],
        json!([{"name": "c2", "image": "nginx"}])
    );

    handle.shutdown().await.expect("shutdown");
}

async fn next_event(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buf: &mut Vec<u8>,
) -> Value {
    loop {
        if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            return serde_json::from_slice(&line).expect("watch line is JSON");
        }
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("watch event in time")
            .expect("stream open")
            .expect("chunk");
        buf.extend_from_slice(&chunk);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_bookmarks_carry_the_current_resource_version_and_resume() {
    let opts = KubeOptions {
        bookmark_interval: Duration::from_millis(200),
        ..KubeOptions::default()
    };
    let handle = KubeEmulator::start(opts).await.expect("start");
    let http = Http::new(&handle);
    let cms = "/api/v1/namespaces/default/configmaps";
    let create = |path: &'static str, name: &'static str| {
        http.send(
            http.client
                .post(format!("{}{path}", http.base))
                .json(&json!({"metadata": {"name": name}})),
        )
    };
    assert_eq!(create(cms, "a").await.0, 201);
    let (_, list) = http.get(cms).await;
    let list_rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("list rv")
        .to_string();
    let watch = |rv: String| {
        http.client
            .get(format!(
                "{}{cms}?watch=true&allowWatchBookmarks=true&resourceVersion={rv}",
                http.base
            ))
            .send()
    };
    let resp = watch(list_rv.clone()).await.expect("watch");
    assert_eq!(resp.status().as_u16(), 200);
    let mut stream = Box::pin(resp.bytes_stream());
    let mut buf = Vec::new();
    // Writes of another kind move the resourceVersion on; the bookmark reports it.
    assert_eq!(create("/api/v1/namespaces/default/secrets", "s").await.0, 201);
    let current = handle.store().resource_version();
    assert!(current > list_rv.parse::<u64>().expect("numeric rv"));
    // (A bookmark sent before the secret was written may come first: it carries the list's rv.)
    let mut tries = 0;
    let bookmark_rv = loop {
        tries += 1;
        assert!(
            tries < 50,
            "no bookmark with the current resourceVersion {current}"
        );
        let bookmark = next_event(&mut stream, &mut buf).await;
        assert_eq!(bookmark["type"], "BOOKMARK", "{bookmark}");
        assert_eq!(bookmark["object"]["kind"], "ConfigMap");
        let rv = bookmark["object"]["metadata"]["resourceVersion"]
            .as_str()
            .expect("bookmark rv")
            .to_string();
        if rv == current.to_string() {
            break rv;
        }
        assert_eq!(rv, list_rv, "a bookmark carries the list's or the current rv");
    };
    drop(stream);

    // Resuming from the bookmark replays nothing before it and delivers what came after.
    assert_eq!(create(cms, "b").await.0, 201);
    let resp = watch(bookmark_rv).await.expect("resume");
    let mut stream = Box::pin(resp.bytes_stream());
    let mut buf = Vec::new();
    let ev = next_event(&mut stream, &mut buf).await;
    assert_eq!(
        (ev["type"].as_str(), ev["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("b")),
        "{ev}"
    );
    assert_eq!(create(cms, "c").await.0, 201);
    let mut ev = next_event(&mut stream, &mut buf).await;
    while ev["type"] == "BOOKMARK" {
        ev = next_event(&mut stream, &mut buf).await;
    }
    assert_eq!(ev["object"]["metadata"]["name"], "c", "{ev}");
    drop(stream);
    handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_background_foreground_and_orphan() {
    let handle = KubeEmulator::start(KubeOptions::default()).await.expect("start");
    let http = Http::new(&handle);
    let cms = "/api/v1/namespaces/default/configmaps";
    let create = |body: Value| http.send(http.client.post(format!("{}{cms}", http.base)).json(&body));
    let owned_by = |name: &str, owner: &Value, block: bool| {
        json!({"metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"], "blockOwnerDeletion": block}]}})
    };
    let delete = |name: &str, policy: &str| {
        http.send(
            http.client
                .delete(format!("{}{cms}/{name}", http.base))
                .json(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": policy})),
        )
    };
    let exists = |name: &'static str| {
        let http = &http;
        async move { http.get(&format!("{cms}/{name}")).await }
    };
    async fn wait_for<F, Fut>(what: &str, mut f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        // Generous: a loaded machine must not fail what only takes longer.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while tokio::time::Instant::now() < deadline {
            if f().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("timed out waiting for: {what}");
    }

    // Background (default): the owner goes at once, the dependent (and its dependent) after it.
    let (_, owner) = create(json!({"metadata": {"name": "bg-owner"}})).await;
    let (_, dep) = create(owned_by("bg-dep", &owner, false)).await;
    create(owned_by("bg-grandchild", &dep, false)).await;
    let (code, _) = delete("bg-owner", "Background").await;
    assert_eq!(code, 200);
    assert_eq!(exists("bg-owner").await.0, 404);
    wait_for("background GC of the chain", || async {
        exists("bg-dep").await.0 == 404 && exists("bg-grandchild").await.0 == 404
    })
    .await;

    // Foreground: the owner waits (deletionTimestamp + foregroundDeletion) until its blocking
    // dependent is gone; the dependent is deleted by the collector.
    let (_, owner) = create(json!({"metadata": {"name": "fg-owner"}})).await;
    let mut blocking = owned_by("fg-dep", &owner, true);
    blocking["metadata"]["finalizers"] = json!(["example.com/hold"]);
    create(blocking).await;
    create(owned_by("fg-free", &owner, false)).await;
    let (code, obj) = delete("fg-owner", "Foreground").await;
    assert!(code == 200 || code == 202, "{code} {obj}");
    assert_eq!(obj["metadata"]["finalizers"], json!(["foregroundDeletion"]));
    assert!(obj["metadata"]["deletionTimestamp"].is_string(), "{obj}");
    wait_for("dependents deleted in the foreground", || async {
        let (_, dep) = exists("fg-dep").await;
        dep["metadata"]["deletionTimestamp"].is_string() && exists("fg-free").await.0 == 404
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (code, owner_now) = exists("fg-owner").await;
    assert_eq!(code, 200, "the owner waits for its blocking dependent");
    assert_eq!(owner_now["metadata"]["finalizers"], json!(["foregroundDeletion"]));
    let (code, _) = http
        .patch(
            &format!("{cms}/fg-dep"),
            "",
            "application/merge-patch+json",
            json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(code, 200);
    wait_for("owner deleted once its dependent is gone", || async {
        exists("fg-owner").await.0 == 404 && exists("fg-dep").await.0 == 404
    })
    .await;

    // Orphan: the dependent stays and loses its ownerReference.
    let (_, owner) = create(json!({"metadata": {"name": "or-owner"}})).await;
    create(owned_by("or-dep", &owner, true)).await;
    let (code, _) = delete("or-owner", "Orphan").await;
    assert_eq!(code, 200);
    assert_eq!(exists("or-owner").await.0, 404);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (code, dep) = exists("or-dep").await;
    assert_eq!(code, 200, "orphaned dependent survives");
    assert!(dep["metadata"]["ownerReferences"].is_null(), "{dep}");

    handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_writes_and_no_op_writes_change_nothing() {
    let handle = KubeEmulator::start(KubeOptions::default()).await.expect("start");
    let http = Http::new(&handle);
    let cms = "/api/v1/namespaces/default/configmaps";
    let x = format!("{cms}/x");
    let post = |body: Value| http.send(http.client.post(format!("{}{cms}", http.base)).json(&body));
    let (code, _) =
        post(json!({"metadata": {"name": "x", "labels": {"app": "a"}}, "data": {"k": "1"}})).await;
    assert_eq!(code, 201);
    let (code, _) = post(json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}})).await;
    assert_eq!(code, 201);
    let (_, before) = http.get(&x).await;
    let rv = before["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let store_rv = handle.store().resource_version();
    let resp = http
        .client
        .get(format!(
            "{}{cms}?watch=true&resourceVersion={store_rv}",
            http.base
        ))
        .send()
        .await
        .expect("watch");
    let mut stream = Box::pin(resp.bytes_stream());
    let mut buf = Vec::new();
    let unchanged = || async {
        let (_, now) = http.get(&x).await;
        assert_eq!(now, before, "the object must not change");
    };

    // dryRun=All on PUT, merge/JSON/apply PATCH and DELETE: the would-be result, nothing stored.
    let mut put = before.clone();
    put["data"]["k"] = json!("2");
    let (code, out) = http
        .send(http.client.put(format!("{}{x}?dryRun=All", http.base)).json(&put))
        .await;
    assert_eq!((code, &out["data"]["k"]), (200, &json!("2")), "{out}");
    unchanged().await;
    let (code, out) = http
        .patch(
            &x,
            "dryRun=All",
            "application/merge-patch+json",
            json!({"data": {"k": "3"}}),
        )
        .await;
    assert_eq!((code, &out["data"]["k"]), (200, &json!("3")), "{out}");
    unchanged().await;
    let (code, out) = http
        .patch(
            &x,
            "dryRun=All",
            "application/json-patch+json",
            json!([{"op": "replace", "path": "/data/k", "value": "4"}]),
        )
        .await;
    assert_eq!((code, &out["data"]["k"]), (200, &json!("4")), "{out}");
    unchanged().await;
    let (code, out) = http
        .patch(
            &x,
            "dryRun=All&fieldManager=applier&force=true",
            "application/apply-patch+yaml",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"k": "5"}}),
        )
        .await;
    assert_eq!((code, &out["data"]["k"]), (200, &json!("5")), "{out}");
    unchanged().await;
    let (code, out) = http
        .send(http.client.delete(format!("{}{x}?dryRun=All", http.base)))
        .await;
    assert_eq!((code, &out["metadata"]["name"]), (200, &json!("x")), "{out}");
    unchanged().await;
    let held = format!("{cms}/held");
    let (_, held_before) = http.get(&held).await;
    let (code, out) = http
        .send(
            http.client
                .delete(format!("{}{held}", http.base))
                .json(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]})),
        )
        .await;
    assert_eq!(code, 200);
    assert!(
        out["metadata"]["deletionTimestamp"].is_string(),
        "a held object would be marked for deletion: {out}"
    );
    assert_eq!(http.get(&held).await.1, held_before);

    // No-op writes: same resourceVersion, no event.
    let (code, out) = http
        .send(http.client.put(format!("{}{x}", http.base)).json(&before))
        .await;
    assert_eq!(
        (code, &out["metadata"]["resourceVersion"]),
        (200, &json!(rv)),
        "{out}"
    );
    for (ctype, body) in [
        ("application/merge-patch+json", json!({"data": {"k": "1"}})),
        (
            "application/strategic-merge-patch+json",
            json!({"metadata": {"labels": {"app": "a"}}}),
        ),
        (
            "application/json-patch+json",
            json!([{"op": "replace", "path": "/data/k", "value": "1"}]),
        ),
    ] {
        let (code, out) = http.patch(&x, "fieldManager=editor", ctype, body).await;
        assert_eq!(
            (code, &out["metadata"]["resourceVersion"]),
            (200, &json!(rv)),
            "{ctype}: {out}"
        );
    }
    unchanged().await;
    // A repeated apply by the same manager is a no-op too.
    let cfg = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"k": "1"}});
    let (code, applied) = http.apply(&x, "applier", true, cfg.clone()).await;
    assert_eq!(code, 200, "{applied}");
    let (code, again) = http.apply(&x, "applier", false, cfg).await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(
        again["metadata"]["resourceVersion"],
        applied["metadata"]["resourceVersion"]
    );

    // The first event the watcher sees is the apply's ownership change (the only real write),
    // then a real change.
    let ev = next_event(&mut stream, &mut buf).await;
    assert_eq!(ev["type"], "MODIFIED");
    assert_eq!(
        ev["object"]["metadata"]["resourceVersion"], applied["metadata"]["resourceVersion"],
        "{ev}"
    );
    let (code, changed) = http
        .patch(
            &x,
            "",
            "application/merge-patch+json",
            json!({"data": {"k": "9"}}),
        )
        .await;
    assert_eq!(code, 200);
    let ev = next_event(&mut stream, &mut buf).await;
    assert_eq!(ev["type"], "MODIFIED");
    assert_eq!(ev["object"]["data"]["k"], "9");
    assert_eq!(
        ev["object"]["metadata"]["resourceVersion"],
        changed["metadata"]["resourceVersion"]
    );
    drop(stream);
    handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_answers_503_ends_open_watches_and_ends_itself() {
    let handle = KubeEmulator::start(KubeOptions::default()).await.expect("start");
    let http = Http::new(&handle);
    let cms = "/api/v1/namespaces/default/configmaps";
    let resp = http
        .client
        .get(format!("{}{cms}?watch=true", http.base))
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status().as_u16(), 200);
    let mut stream = Box::pin(resp.bytes_stream());

    handle.set_unavailable(true);
    let (code, status) = http.get(cms).await;
    assert_eq!(code, 503, "{status}");
    assert_eq!(status["reason"], "ServiceUnavailable", "{status}");
    // The open watch ends (no more chunks) instead of hanging on.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the watch survived the outage");
    let (code, _) = http
        .send(
            http.client
                .post(format!("{}{cms}", http.base))
                .json(&json!({"metadata": {"name": "during"}})),
        )
        .await;
    assert_eq!(code, 503);

    handle.set_unavailable(false);
    let (code, list) = http.get(cms).await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(
        list["items"],
        json!([]),
        "the write during the outage was refused"
    );
    handle.shutdown().await.expect("shutdown");
}

/// Held lists wait and answer with the state at their release; gets and writes go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_lists_wait_and_answer_the_state_at_release() {
    let handle = KubeEmulator::start(KubeOptions::default()).await.expect("start");
    let http = Http::new(&handle);
    let cms = "/api/v1/namespaces/default/configmaps";
    for name in ["a", "b"] {
        let (code, _) = http
            .send(
                http.client
                    .post(format!("{}{cms}", http.base))
                    .json(&json!({"metadata": {"name": name}})),
            )
            .await;
        assert_eq!(code, 201);
    }
    handle.hold_lists(true);
    let lists = || {
        handle
            .requests()
            .snapshot()
            .get("list configmaps")
            .copied()
            .unwrap_or(0)
    };
    let before = lists();
    let list = tokio::spawn({
        let (client, url) = (http.client.clone(), format!("{}{cms}", http.base));
        async move {
            let body: Value = client.get(url).send().await?.json().await?;
            Ok::<_, reqwest::Error>(body)
        }
    });
    // The list is at the server (and held) before anything changes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lists() == before && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(lists(), before + 1, "the list reached the server");
    let (code, got) = http.get(&format!("{cms}/a")).await;
    assert_eq!(code, 200, "a get is not held: {got}");
    let (code, _) = http
        .send(http.client.delete(format!("{}{cms}/a", http.base)))
        .await;
    assert_eq!(code, 200, "a write is not held");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!list.is_finished(), "the list answered while held");
    handle.hold_lists(false);
    let body = tokio::time::timeout(Duration::from_secs(10), list)
        .await
        .expect("the list answers once released")
        .expect("join")
        .expect("list");
    let names: Vec<&str> = body["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["b"], "the state at release: {body}");
    handle.shutdown().await.expect("shutdown");
}

/// Writes a real API server refuses: on a custom resource a strategic merge patch (415: CRDs have
/// no patch tags) and an update without resourceVersion (422: no unconditional update); on any
/// kind a create that carries a resourceVersion (a read object re-posted unstripped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_a_real_server_refuses_are_refused() {
    let handle = KubeEmulator::start(KubeOptions::default())
        .await
        .expect("emulator starts");
    let http = Http::new(&handle);
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    });
    let (code, out) = http
        .send(
            http.client
                .post(format!(
                    "{}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                    http.base
                ))
                .json(&crd),
        )
        .await;
    assert_eq!(code, 201, "{out}");
    let widgets = "/apis/example.com/v1/namespaces/default/widgets";
    let widget = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"a": 1}});
    let (code, created) = http
        .send(http.client.post(format!("{}{widgets}", http.base)).json(&widget))
        .await;
    assert_eq!(code, 201, "{created}");
    let w = format!("{widgets}/w");

    let (code, out) = http
        .patch(
            &w,
            "",
            "application/strategic-merge-patch+json",
            json!({"spec": {"a": 2}}),
        )
        .await;
    assert_eq!(
        (code, &out["reason"]),
        (415, &json!("UnsupportedMediaType")),
        "{out}"
    );
    let (code, out) = http
        .patch(&w, "", "application/merge-patch+json", json!({"spec": {"a": 2}}))
        .await;
    assert_eq!(code, 200, "{out}");

    let mut unconditional = out.clone();
    unconditional["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("resourceVersion");
    let (code, out) = http
        .send(http.client.put(format!("{}{w}", http.base)).json(&unconditional))
        .await;
    assert_eq!((code, &out["reason"]), (422, &json!("Invalid")), "{out}");
    assert_eq!(
        out["details"]["causes"][0]["field"], "metadata.resourceVersion",
        "{out}"
    );

    // A built-in kind takes an unconditional update.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "1"}});
    let cms = "/api/v1/namespaces/default/configmaps";
    let (code, read) = http
        .send(http.client.post(format!("{}{cms}", http.base)).json(&cm))
        .await;
    assert_eq!(code, 201, "{read}");
    let (code, out) = http
        .send(http.client.put(format!("{}{cms}/c", http.base)).json(&cm))
        .await;
    assert_eq!(code, 200, "{out}");

    // The object as read, posted again under another name.
    let mut again = read.clone();
    again["metadata"]["name"] = json!("c2");
    let (code, out) = http
        .send(http.client.post(format!("{}{cms}", http.base)).json(&again))
        .await;
    assert_eq!(code, 500, "{out}");
    assert!(
        out["message"]
            .as_str()
            .is_some_and(|m| m.contains("resourceVersion should not be set")),
        "{out}"
    );
}
