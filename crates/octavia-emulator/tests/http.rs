//! The emulator over HTTP: routes, status codes, bodies, the control API.

use std::time::Duration;

use octavia_emulator::{
    FaultConfig, FaultRule, LatencyProfile, OctaviaEmulator, OctaviaHandle, OctaviaOptions, WorkerDelays,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const SUBNET: &str = "5f4a6f5e-9a0e-4e7b-8c1f-0b7f2d2f0a11";

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    fn new(emu: &OctaviaHandle) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            http: reqwest::Client::new(),
            base: emu.url(),
        }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        // What keystonemiddleware would derive from a token; under noauth the client sends it itself.
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("X-Project-Id", "p-test");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request reaches the emulator");
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

#[tokio::test]
async fn fully_populated_create_through_status_tree() {
    let emu = OctaviaEmulator::start(OctaviaOptions::default())
        .await
        .expect("emulator starts");
    let c = Client::new(&emu);
    let body = json!({"loadbalancer": {
        "name": "svc", "vip_subnet_id": SUBNET, "tags": ["cluster:a"],
        "listeners": [{"name": "l80", "protocol": "TCP", "protocol_port": 80,
            "default_pool": {"name": "p80", "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN",
                "members": [{"address": "10.1.0.1", "protocol_port": 8080, "subnet_id": SUBNET}]}}]
    }});
    let (st, v) = c.call(Method::POST, "/v2/lbaas/loadbalancers", Some(body)).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["loadbalancer"]["provisioning_status"], "PENDING_CREATE");
    assert_eq!(v["loadbalancer"]["listeners"][0]["protocol_port"], 80);
    assert_eq!(v["loadbalancer"]["pools"][0]["members"][0]["address"], "10.1.0.1");
    let id = v["loadbalancer"]["id"].as_str().unwrap_or_default().to_string();

    let (st, v) = c
        .call(Method::GET, &format!("/v2/lbaas/loadbalancers/{id}/status"), None)
        .await;
    assert_eq!(st, StatusCode::OK);
    let lb = &v["statuses"]["loadbalancer"];
    assert_eq!(lb["provisioning_status"], "ACTIVE");
    assert_eq!(lb["listeners"][0]["name"], "l80");
    assert_eq!(lb["listeners"][0]["pools"][0]["name"], "p80");
    assert_eq!(
        lb["listeners"][0]["pools"][0]["members"][0]["operating_status"],
        "NO_MONITOR"
    );

    // Plain GET shows only ids of children; the v2.0 alias serves the same.
    let (_, v) = c
        .call(Method::GET, &format!("/v2.0/lbaas/loadbalancers/{id}"), None)
        .await;
    assert!(v["loadbalancer"]["listeners"][0].get("protocol").is_none());
    assert_eq!(
        v["loadbalancer"]["listeners"][0].as_object().map(|o| o.len()),
        Some(1)
    );

    // Tag filters.
    let (_, v) = c
        .call(Method::GET, "/v2/lbaas/loadbalancers?tags=cluster:a", None)
        .await;
    assert_eq!(v["loadbalancers"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["loadbalancers_links"], json!([]));
    let (_, v) = c
        .call(Method::GET, "/v2/lbaas/loadbalancers?tags-any=x,y", None)
        .await;
    assert_eq!(v["loadbalancers"].as_array().map(Vec::len), Some(0));

    // Batch member update answers 202 with no body.
    let (_, pools) = c
        .call(
            Method::GET,
            &format!("/v2/lbaas/pools?loadbalancer_id={id}"),
            None,
        )
        .await;
    let pool_id = pools["pools"][0]["id"].as_str().unwrap_or_default().to_string();
    let batch = json!({"members": [{"address": "10.1.0.2", "protocol_port": 8080}]});
    let (st, _) = c
        .call(
            Method::PUT,
            &format!("/v2/lbaas/pools/{pool_id}/members"),
            Some(batch),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let (_, m) = c
        .call(Method::GET, &format!("/v2/lbaas/pools/{pool_id}/members"), None)
        .await;
    assert_eq!(m["members"][0]["address"], "10.1.0.2");
    assert_eq!(m["members"].as_array().map(Vec::len), Some(1));

    // Delete without cascade is refused, with cascade accepted.
    let (st, v) = c
        .call(Method::DELETE, &format!("/v2/lbaas/loadbalancers/{id}"), None)
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(v["faultcode"], "Client");
    let (st, _) = c
        .call(
            Method::DELETE,
            &format!("/v2/lbaas/loadbalancers/{id}?cascade=true"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, v) = c
        .call(Method::GET, &format!("/v2/lbaas/loadbalancers/{id}"), None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(
        v,
        json!({"faultcode": "Client", "faultstring": format!("Load Balancer {id} not found."), "debuginfo": null})
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn pending_state_answers_409_until_the_worker_is_done() {
    let latency = LatencyProfile::Custom {
        api_ms: Default::default(),
        worker: WorkerDelays {
            lb_create_ms: 200,
            ..Default::default()
        },
    };
    let emu = OctaviaEmulator::start(OctaviaOptions {
        latency,
        ..Default::default()
    })
    .await
    .expect("starts");
    let c = Client::new(&emu);
    let (_, v) = c
        .call(
            Method::POST,
            "/v2/lbaas/loadbalancers",
            Some(json!({"loadbalancer": {"vip_subnet_id": SUBNET}})),
        )
        .await;
    let id = v["loadbalancer"]["id"].as_str().unwrap_or_default().to_string();
    let (st, v) = c
        .call(
            Method::PUT,
            &format!("/v2/lbaas/loadbalancers/{id}"),
            Some(json!({"loadbalancer": {"name": "n"}})),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT);
    assert_eq!(
        v["faultstring"],
        format!("Invalid state PENDING_CREATE of loadbalancer resource {id}")
    );
    let mut status = String::new();
    for _ in 0..100 {
        let (_, v) = c
            .call(Method::GET, &format!("/v2/lbaas/loadbalancers/{id}"), None)
            .await;
        status = v["loadbalancer"]["provisioning_status"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if status == "ACTIVE" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, "ACTIVE");
    let (st, _) = c
        .call(
            Method::PUT,
            &format!("/v2/lbaas/loadbalancers/{id}"),
            Some(json!({"loadbalancer": {"name": "n"}})),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
}

#[tokio::test]
async fn control_api_faults_stats_error_and_providers() {
    let emu = OctaviaEmulator::start(OctaviaOptions::default())
        .await
        .expect("starts");
    let c = Client::new(&emu);
    let bare = reqwest::Client::new()
        .post(format!("{}/v2/lbaas/loadbalancers", emu.url()))
        .json(&json!({"loadbalancer": {"vip_subnet_id": SUBNET}}))
        .send()
        .await
        .expect("request reaches the emulator");
    assert_eq!(bare.status(), StatusCode::BAD_REQUEST, "no project anywhere");
    let (_, v) = c.call(Method::GET, "/", None).await;
    let versions = v["versions"].as_array().cloned().unwrap_or_default();
    assert_eq!(versions.first().map(|x| x["id"].clone()), Some(json!("v2.0")));
    assert_eq!(
        versions.last().map(|x| x["status"].clone()),
        Some(json!("CURRENT"))
    );
    assert_eq!(versions[0]["links"][0]["href"], format!("{}/v2", emu.url()));
    let (_, v) = c.call(Method::GET, "/v2/lbaas/providers", None).await;
    assert_eq!(
        v["providers"][1],
        json!({"name": "ovn", "description": "Octavia OVN driver."})
    );

    let faults = json!({"rules": [{"operation": "loadbalancer.create", "status": 503, "count": 1}]});
    let (st, _) = c.call(Method::PUT, "/control/faults", Some(faults)).await;
    assert_eq!(st, StatusCode::OK);
    let lb = json!({"loadbalancer": {"vip_subnet_id": SUBNET}});
    let (st, v) = c
        .call(Method::POST, "/v2/lbaas/loadbalancers", Some(lb.clone()))
        .await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["faultcode"], "Server");
    let (st, v) = c.call(Method::POST, "/v2/lbaas/loadbalancers", Some(lb)).await;
    assert_eq!(st, StatusCode::CREATED);
    let id = v["loadbalancer"]["id"].as_str().unwrap_or_default().to_string();

    let (st, _) = c
        .call(Method::POST, &format!("/control/loadbalancers/{id}/error"), None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let l = json!({"listener": {"loadbalancer_id": id, "protocol": "TCP", "protocol_port": 80}});
    let (st, v) = c.call(Method::POST, "/v2/lbaas/listeners", Some(l)).await;
    assert_eq!(st, StatusCode::CONFLICT);
    assert_eq!(
        v["faultstring"],
        format!("Load Balancer {id} is immutable and cannot be updated.")
    );

    let (_, s) = c.call(Method::GET, "/control/stats", None).await;
    assert_eq!(
        s["operations"]["loadbalancer.create"], 3,
        "the bare create, the injected 503, the created one"
    );
    assert_eq!(s["operations"]["listener.create"], 1);
    assert_eq!(s["faults_injected"], 1);
    assert_eq!(emu.stats().count("provider.list"), 1);

    emu.set_faults(FaultConfig {
        rules: vec![FaultRule {
            operation: "*.list".into(),
            status: Some(500),
            count: None,
            delay_ms: 0,
        }],
    });
    let (st, _) = c.call(Method::GET, "/v2/lbaas/pools", None).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);

    let (st, q) = c
        .call(
            Method::PUT,
            "/v2/lbaas/quotas/p1",
            Some(json!({"quota": {"member": 5}})),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    assert_eq!(q["quota"]["member"], 5);
    let (_, q) = c.call(Method::GET, "/v2/lbaas/quotas/p1", None).await;
    assert_eq!(q["quota"]["loadbalancer"], -1);
}

#[tokio::test]
async fn pagination_links_like_octavia() {
    let emu = OctaviaEmulator::start(OctaviaOptions::default())
        .await
        .expect("starts");
    let c = Client::new(&emu);
    let mut ids = Vec::new();
    for i in 0..3 {
        let body = json!({"loadbalancer": {"vip_subnet_id": SUBNET, "name": format!("lb{i}")}});
        let (_, v) = c.call(Method::POST, "/v2/lbaas/loadbalancers", Some(body)).await;
        ids.push(v["loadbalancer"]["id"].as_str().unwrap_or_default().to_string());
    }
    let (_, v) = c.call(Method::GET, "/v2/lbaas/loadbalancers?limit=2", None).await;
    assert_eq!(v["loadbalancers"].as_array().map(Vec::len), Some(2));
    let links = v["loadbalancers_links"].as_array().cloned().unwrap_or_default();
    assert_eq!(links.len(), 1);
    assert_eq!(links[0]["rel"], "next");
    let href = links[0]["href"].as_str().unwrap_or_default();
    assert!(
        href.starts_with(&format!(
            "{}/v2/lbaas/loadbalancers?limit=2&marker={}",
            emu.url(),
            ids[1]
        )),
        "{href}"
    );
    let (_, v) = c
        .call(
            Method::GET,
            &format!("/v2/lbaas/loadbalancers?limit=2&marker={}", ids[1]),
            None,
        )
        .await;
    assert_eq!(v["loadbalancers"][0]["id"], ids[2].as_str());
    assert_eq!(v["loadbalancers_links"][0]["rel"], "previous");
    assert_eq!(v["loadbalancers_links"].as_array().map(Vec::len), Some(1));
    let (_, v) = c
        .call(
            Method::GET,
            "/v2/lbaas/loadbalancers?name=lb1&fields=id,name",
            None,
        )
        .await;
    assert_eq!(v["loadbalancers"], json!([{"id": ids[1], "name": "lb1"}]));
}
