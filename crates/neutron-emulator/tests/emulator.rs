//! Behaviour of the emulator over HTTP that the contract suite (crates/neutron-contract, run against the emulator and
//! the real server) does not check: trunk and binding details, pagination links, faults, latency, SLAAC.
//! Tests that compare shapes with the real neutron-server read `KURYR_TEST_NEUTRON_URL` and skip, saying why, when it
//! is unset (a failure under `KURYR_TEST_REQUIRE_NEUTRON=1` or `KURYR_TEST_REQUIRE_ALL=1`).

use std::collections::BTreeSet;
use std::time::Duration;

use neutron_emulator::{
    AgentHosts, Emulator, EmulatorHandle, EmulatorOptions, FaultConfig, FaultRule, LatencyProfile,
    LatencyTable, OpLatency, Outage, OutageMode,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

// The workspace's one skip behaviour (a failure under KURYR_TEST_REQUIRE_ALL=1); neutron-emulator cannot
// depend on kuryr-testbed, which depends on it.
#[allow(dead_code)]
#[path = "../../kuryr-testbed/src/skip.rs"]
mod skip;

/// The real neutron-server's URL for `test`; `None` after [`skip::skip`] when it is unset. Panics when
/// `KURYR_TEST_REQUIRE_NEUTRON=1` and it is unset.
#[track_caller]
fn real_neutron_url(test: &str) -> Option<String> {
    match neutron_contract::env::real_neutron_url() {
        Ok(Some(url)) => Some(url),
        Ok(None) => {
            skip::skip(format!("{test}: {}", neutron_contract::env::skip_reason()));
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    fn new(base: &str) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            base: format!("{}/v2.0", base.trim_end_matches('/')),
            http: reqwest::Client::new(),
        }
    }

    async fn req(&self, m: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.req_h(m, path, body, &[]).await
    }

    async fn req_h(
        &self,
        m: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let mut r = self.http.request(m, format!("{}{path}", self.base));
        if let Some(b) = body {
            r = r.json(&b);
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let resp = r
            .send()
            .await
            .unwrap_or_else(|e| panic!("request {path} failed: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            if text.is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&text).unwrap_or(Value::String(text))
            },
        )
    }

    async fn ok(&self, m: Method, path: &str, body: Option<Value>) -> Value {
        let (s, v) = self.req(m, path, body).await;
        assert!(s.is_success(), "{path}: {s} {v}");
        v
    }

    async fn net_subnet(&self, project: &str, cidr: &str) -> (String, String) {
        let n = self
            .ok(
                Method::POST,
                "/networks",
                Some(json!({"network": {"name": "n", "project_id": project}})),
            )
            .await;
        let net = n["network"]["id"].as_str().unwrap_or_default().to_string();
        let s = self
            .ok(
                Method::POST,
                "/subnets",
                Some(json!({"subnet": {"network_id": net, "project_id": project, "ip_version": 4, "cidr": cidr, "enable_dhcp": false}})),
            )
            .await;
        (net, s["subnet"]["id"].as_str().unwrap_or_default().to_string())
    }

    async fn port(&self, net: &str, project: &str, extra: Value) -> Value {
        let mut p = json!({"network_id": net, "project_id": project});
        if let (Value::Object(p), Value::Object(e)) = (&mut p, extra) {
            p.extend(e);
        }
        self.ok(Method::POST, "/ports", Some(json!({"port": p}))).await["port"].clone()
    }

    async fn count_ports(&self, project: &str) -> usize {
        self.ok(
            Method::GET,
            &format!("/ports?project_id={project}&fields=id"),
            None,
        )
        .await["ports"]
            .as_array()
            .map(Vec::len)
            .unwrap_or(0)
    }
}

async fn emulator() -> (EmulatorHandle, Api) {
    let emu = Emulator::start(EmulatorOptions::default())
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let api = Api::new(&emu.url());
    (emu, api)
}

fn err_type(v: &Value) -> &str {
    v["NeutronError"]["type"].as_str().unwrap_or("")
}

#[tokio::test]
async fn trunk_rules_and_subport_binding() {
    let (emu, api) = emulator().await;
    let (net, _) = api.net_subnet("t", "10.40.0.0/16").await;
    let bound = api.port(&net, "t", json!({"binding:host_id": "node-1"})).await;
    let (s, v) = api
        .req(
            Method::POST,
            "/trunks",
            Some(json!({"trunk": {"port_id": bound["id"], "project_id": "t"}})),
        )
        .await;
    assert_eq!((s, err_type(&v)), (StatusCode::CONFLICT, "ParentPortInUse"));

    let parent = api.port(&net, "t", json!({"name": "vm0"})).await;
    let sub1 = api.port(&net, "t", json!({})).await;
    let sub2 = api.port(&net, "t", json!({})).await;
    let t = api
        .ok(
            Method::POST,
            "/trunks",
            Some(json!({"trunk": {"port_id": parent["id"], "project_id": "t",
                "sub_ports": [{"port_id": sub1["id"], "segmentation_type": "vlan", "segmentation_id": 10}]}})),
        )
        .await;
    let trunk = t["trunk"]["id"].as_str().unwrap_or_default().to_string();
    assert_eq!(t["trunk"]["status"], "DOWN");
    let add = |seg: i64, port: &Value| json!({"sub_ports": [{"port_id": port["id"], "segmentation_type": "vlan", "segmentation_id": seg}]});
    let (s, v) = api
        .req(
            Method::PUT,
            &format!("/trunks/{trunk}/add_subports"),
            Some(add(10, &sub2)),
        )
        .await;
    assert_eq!((s, err_type(&v)), (StatusCode::CONFLICT, "DuplicateSubPort"));
    let (s, v) = api
        .req(
            Method::PUT,
            &format!("/trunks/{trunk}/add_subports"),
            Some(add(5000, &sub2)),
        )
        .await;
    assert_eq!((s, err_type(&v)), (StatusCode::BAD_REQUEST, "InvalidInput"));
    assert_eq!(
        v["NeutronError"]["message"],
        "Invalid input for operation: Segmentation ID '5000' is not in range."
    );
    let (s, v) = api
        .req(
            Method::PUT,
            &format!("/trunks/{trunk}/add_subports"),
            Some(add(11, &sub1)),
        )
        .await;
    assert_eq!((s, err_type(&v)), (StatusCode::CONFLICT, "TrunkPortInUse"));
    let v = api
        .ok(
            Method::PUT,
            &format!("/trunks/{trunk}/add_subports"),
            Some(add(11, &sub2)),
        )
        .await;
    assert_eq!(
        v["id"],
        trunk.as_str(),
        "add_subports answers the trunk unwrapped"
    );
    assert_eq!(v["sub_ports"].as_array().map(Vec::len), Some(2));

    let (s, v) = api
        .req(
            Method::DELETE,
            &format!("/ports/{}", sub1["id"].as_str().unwrap_or_default()),
            None,
        )
        .await;
    assert_eq!((s, err_type(&v)), (StatusCode::CONFLICT, "PortInUseAsSubPort"));
    let (s, v) = api
        .req(
            Method::DELETE,
            &format!("/ports/{}", parent["id"].as_str().unwrap_or_default()),
            None,
        )
        .await;
    assert_eq!(
        (s, err_type(&v)),
        (StatusCode::CONFLICT, "PortInUseAsTrunkParent")
    );

    let p = api
        .ok(
            Method::GET,
            &format!("/ports/{}", parent["id"].as_str().unwrap_or_default()),
            None,
        )
        .await;
    assert_eq!(p["port"]["trunk_details"]["trunk_id"], trunk.as_str());
    assert_eq!(
        p["port"]["trunk_details"]["sub_ports"][0]["mac_address"],
        sub1["mac_address"]
    );

    // Nova binds the parent: subports follow to its host as trunk:subport and everything goes ACTIVE.
    api.ok(
        Method::PUT,
        &format!("/ports/{}", parent["id"].as_str().unwrap_or_default()),
        Some(json!({"port": {"binding:host_id": "node-1", "device_owner": "compute:nova"}})),
    )
    .await;
    let s1 = wait_status(&api, sub1["id"].as_str().unwrap_or_default(), "ACTIVE").await;
    assert_eq!(s1["device_owner"], "trunk:subport");
    assert_eq!(s1["binding:host_id"], "node-1");
    wait_trunk(&api, &trunk, "ACTIVE").await;
    let (s, v) = api.req(Method::DELETE, &format!("/trunks/{trunk}"), None).await;
    assert_eq!((s, err_type(&v)), (StatusCode::CONFLICT, "TrunkInUse"));
    let v = api
        .ok(
            Method::PUT,
            &format!("/trunks/{trunk}/remove_subports"),
            Some(json!({"sub_ports": [{"port_id": sub2["id"]}]})),
        )
        .await;
    assert_eq!(v["sub_ports"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        v["status"], "DOWN",
        "the agent rewires the trunk after remove_subports"
    );
    wait_trunk(&api, &trunk, "ACTIVE").await;
    let (s, v) = api
        .req(
            Method::PUT,
            &format!("/trunks/{trunk}/remove_subports"),
            Some(json!({"sub_ports": [{"port_id": sub2["id"]}]})),
        )
        .await;
    assert_eq!((s, err_type(&v)), (StatusCode::NOT_FOUND, "SubPortNotFound"));
    emu.shutdown().await;
}

async fn wait_status(api: &Api, id: &str, want: &str) -> Value {
    for _ in 0..200 {
        let v = api.ok(Method::GET, &format!("/ports/{id}"), None).await;
        if v["port"]["status"] == want {
            return v["port"].clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("port {id} never reached {want}");
}

async fn wait_trunk(api: &Api, id: &str, want: &str) {
    for _ in 0..200 {
        let v = api.ok(Method::GET, &format!("/trunks/{id}"), None).await;
        if v["trunk"]["status"] == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("trunk {id} never reached {want}");
}

#[tokio::test]
async fn ports_go_active_only_when_bound_and_revision_guards_updates() {
    let (emu, api) = emulator().await;
    let (net, _) = api.net_subnet("a", "10.50.0.0/24").await;
    let p = api.port(&net, "a", json!({})).await;
    assert_eq!(p["status"], "DOWN");
    assert_eq!(p["binding:vif_type"], "unbound");
    assert!(
        p["mac_address"]
            .as_str()
            .is_some_and(|m| m.starts_with("fa:16:3e:"))
    );
    let id = p["id"].as_str().unwrap_or_default().to_string();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        api.ok(Method::GET, &format!("/ports/{id}"), None).await["port"]["status"],
        "DOWN"
    );

    let rev = p["revision_number"].as_u64().unwrap_or(0);
    let stale = format!("revision_number={}", rev + 7);
    let (s, v) = api
        .req_h(
            Method::PUT,
            &format!("/ports/{id}"),
            Some(json!({"port": {"name": "x"}})),
            &[("If-Match", stale.as_str())],
        )
        .await;
    assert_eq!(
        (s, err_type(&v)),
        (StatusCode::PRECONDITION_FAILED, "RevisionNumberConstraintFailed")
    );
    assert_eq!(
        v["NeutronError"]["message"],
        format!("Constrained to {}, but current revision is {rev}", rev + 7)
    );
    let current = format!("revision_number={rev}");
    let (s, v) = api
        .req_h(
            Method::PUT,
            &format!("/ports/{id}"),
            Some(json!({"port": {"binding:host_id": "node-2", "device_id": "pod-1"}})),
            &[("If-Match", current.as_str())],
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["port"]["status"], "DOWN");
    assert_eq!(v["port"]["binding:vif_type"], "ovs");
    assert!(v["port"]["revision_number"].as_u64().unwrap_or(0) > rev);
    wait_status(&api, &id, "ACTIVE").await;
    let v = api
        .ok(
            Method::PUT,
            &format!("/ports/{id}"),
            Some(json!({"port": {"binding:host_id": ""}})),
        )
        .await;
    assert_eq!(v["port"]["status"], "DOWN");
    assert_eq!(v["port"]["binding:vif_type"], "unbound");

    let (s, v) = api
        .req(
            Method::PUT,
            &format!("/ports/{id}"),
            Some(json!({"port": {"network_id": "x"}})),
        )
        .await;
    assert_eq!(
        (s, v["NeutronError"]["message"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("Cannot update read-only attribute network_id")
        )
    );
    let (s, v) = api
        .req(
            Method::POST,
            "/ports",
            Some(json!({"port": {"network_id": net, "bogus": 1}})),
        )
        .await;
    assert_eq!(
        (s, v["NeutronError"]["message"].as_str()),
        (StatusCode::BAD_REQUEST, Some("Unrecognized attribute(s) 'bogus'"))
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn pagination_links_filters_and_fields() {
    let (emu, api) = emulator().await;
    let (net, sub) = api.net_subnet("g", "10.60.0.0/24").await;
    let bulk: Vec<Value> = (0..5)
        .map(|_| json!({"network_id": net, "project_id": "g", "device_owner": "compute:kuryr"}))
        .collect();
    let created = api.ok(Method::POST, "/ports", Some(json!({"ports": bulk}))).await;
    let mut ids: Vec<String> = created["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["id"].as_str().map(String::from))
        .collect();
    ids.sort();
    let page1 = api
        .ok(
            Method::GET,
            "/ports?device_owner=compute:kuryr&fields=id&limit=2",
            None,
        )
        .await;
    let got: Vec<&str> = page1["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["id"].as_str())
        .collect();
    assert_eq!(got, vec![ids[0].as_str(), ids[1].as_str()]);
    assert_eq!(
        page1["ports"][0].as_object().map(|o| o.len()),
        Some(1),
        "fields=id keeps only id"
    );
    let links = page1["ports_links"].as_array().cloned().unwrap_or_default();
    assert_eq!(links[0]["rel"], "next");
    assert!(links[0]["href"].as_str().is_some_and(
        |h| h.contains("device_owner=compute%3Akuryr") && h.ends_with(&format!("&marker={}", ids[1]))
    ));
    assert_eq!(links[1]["rel"], "previous");
    assert!(
        links[1]["href"]
            .as_str()
            .is_some_and(|h| h.ends_with(&format!("&marker={}&page_reverse=True", ids[0])))
    );
    let last = api
        .ok(
            Method::GET,
            &format!("/ports?device_owner=compute:kuryr&limit=2&marker={}", ids[3]),
            None,
        )
        .await;
    assert_eq!(last["ports"].as_array().map(Vec::len), Some(1));
    let rels: Vec<&str> = last["ports_links"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["rel"].as_str())
        .collect();
    assert_eq!(rels, vec!["previous"], "a short last page has no next link");
    let rev = api
        .ok(
            Method::GET,
            &format!(
                "/ports?device_owner=compute:kuryr&limit=2&marker={}&page_reverse=True",
                ids[3]
            ),
            None,
        )
        .await;
    let got: Vec<&str> = rev["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["id"].as_str())
        .collect();
    assert_eq!(got, vec![ids[1].as_str(), ids[2].as_str()]);

    let ip = created["ports"][2]["fixed_ips"][0]["ip_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let by_ip = api
        .ok(
            Method::GET,
            &format!("/ports?fixed_ips=ip_address%3D{ip}&fixed_ips=subnet_id%3D{sub}"),
            None,
        )
        .await;
    assert_eq!(by_ip["ports"].as_array().map(Vec::len), Some(1));
    let two = api
        .ok(Method::GET, &format!("/ports?id={}&id={}", ids[0], ids[4]), None)
        .await;
    assert_eq!(
        two["ports"].as_array().map(Vec::len),
        Some(2),
        "repeated parameters are OR"
    );
    let (s, v) = api.req(Method::GET, "/ports?bogus=1", None).await;
    assert_eq!(
        (s, v["NeutronError"]["message"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("['bogus'] is invalid attribute for filtering")
        )
    );
    let (s, v) = api
        .req(
            Method::GET,
            "/ports?limit=2&marker=00000000-0000-0000-0000-000000000000",
            None,
        )
        .await;
    assert_eq!((s, err_type(&v)), (StatusCode::NOT_FOUND, "PortNotFound"));
    emu.shutdown().await;
}

#[tokio::test]
async fn fault_injection_counts_and_outage() {
    let (emu, api) = emulator().await;
    let (net, _) = api.net_subnet("f", "10.70.0.0/24").await;
    emu.reset_stats();
    emu.set_faults(FaultConfig {
        rules: vec![FaultRule {
            every_nth: Some(2),
            retry_after_secs: Some(3),
            ..FaultRule::always("port.create", 503)
        }],
        ..Default::default()
    });
    let mut failures = 0;
    for _ in 0..4 {
        let resp = api
            .http
            .post(format!("{}/ports", api.base))
            .json(&json!({"port": {"network_id": net, "project_id": "f"}}))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        if resp.status() == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(
                resp.headers().get("retry-after").and_then(|v| v.to_str().ok()),
                Some("3")
            );
            failures += 1;
        }
    }
    assert_eq!(failures, 2);
    assert_eq!(api.count_ports("f").await, 2, "failed creates created nothing");
    let stats = emu.stats();
    assert_eq!(stats.count("port.create"), 4);
    assert_eq!(stats.faults_injected, 2);
    assert_eq!(stats.count("port.list"), 1);

    // after_commit: the port exists although the client saw a 500.
    emu.set_faults(FaultConfig {
        rules: vec![FaultRule {
            after_commit: true,
            ..FaultRule::always("port.create", 500)
        }],
        ..Default::default()
    });
    let (s, v) = api
        .req(
            Method::POST,
            "/ports",
            Some(json!({"port": {"network_id": net, "project_id": "f"}})),
        )
        .await;
    assert_eq!(
        (s, err_type(&v)),
        (StatusCode::INTERNAL_SERVER_ERROR, "HTTPInternalServerError")
    );
    emu.set_faults(FaultConfig::default());
    assert_eq!(api.count_ports("f").await, 3);

    // Admin endpoint: full outage answering 503, then cleared.
    let admin = reqwest::Client::new();
    let cfg = FaultConfig {
        outage: Some(Outage {
            mode: OutageMode::Unavailable,
            duration_ms: None,
        }),
        ..Default::default()
    };
    let r = admin
        .put(format!("{}/_emulator/faults", emu.url()))
        .json(&cfg)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status(), StatusCode::OK);
    let (s, _) = api.req(Method::GET, "/networks", None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    let r = admin
        .delete(format!("{}/_emulator/faults", emu.url()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (s, _) = api.req(Method::GET, "/networks", None).await;
    assert_eq!(s, StatusCode::OK);

    // Reset mode: connections are dropped, the client gets a transport error.
    emu.set_faults(FaultConfig {
        outage: Some(Outage {
            mode: OutageMode::Reset,
            duration_ms: None,
        }),
        ..Default::default()
    });
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        fresh
            .get(format!("{}/v2.0/networks", emu.url()))
            .send()
            .await
            .is_err()
    );
    emu.set_faults(FaultConfig::default());
    assert!(
        fresh
            .get(format!("{}/v2.0/networks", emu.url()))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    );

    let stats: Value = admin
        .get(format!("{}/_emulator/stats", emu.url()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stats["operations"]["port.create"], 5);
    assert_eq!(
        stats["ports_created"], 3,
        "two plain creates and one hidden by after_commit"
    );
    emu.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn latency_profile_delays_by_operation_and_bulk_size() {
    // Paused clock: sleeps auto-advance, so the assertions are about simulated time, not wall-clock speed.
    let emu = Emulator::start(EmulatorOptions {
        latency: LatencyProfile::Custom(LatencyTable {
            default: OpLatency::fixed(0),
            ops: [
                (
                    "port.create_bulk".to_string(),
                    OpLatency {
                        base_ms: 10,
                        per_item_ms: 100,
                        bind_per_item_ms: 0,
                    },
                ),
                ("port.create".to_string(), OpLatency::fixed(150)),
            ]
            .into_iter()
            .collect(),
        }),
        ..EmulatorOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let api = Api::new(&emu.url());
    let (net, _) = api.net_subnet("l", "10.80.0.0/24").await;
    let t0 = tokio::time::Instant::now();
    api.port(&net, "l", json!({})).await;
    let single = t0.elapsed();
    let t0 = tokio::time::Instant::now();
    let bulk: Vec<Value> = (0..10)
        .map(|_| json!({"network_id": net, "project_id": "l"}))
        .collect();
    api.ok(Method::POST, "/ports", Some(json!({"ports": bulk}))).await;
    let ten = t0.elapsed();
    assert!(
        single >= Duration::from_millis(150),
        "single create took {single:?}"
    );
    assert!(ten >= Duration::from_millis(1010), "bulk of 10 took {ten:?}");
    assert_eq!(emu.stats().count("port.create_bulk"), 1);
    emu.set_latency(LatencyProfile::None);
    let t0 = tokio::time::Instant::now();
    api.port(&net, "l", json!({})).await;
    assert!(t0.elapsed() < Duration::from_millis(150));
    emu.shutdown().await;
}

#[tokio::test]
async fn routers_subnetpools_and_security_groups() {
    let (emu, api) = emulator().await;
    let pool = api
        .ok(Method::POST, "/subnetpools", Some(json!({"subnetpool": {"name": "sp", "project_id": "r", "prefixes": ["10.128.0.0/16"], "default_prefixlen": 26}})))
        .await;
    assert_eq!(
        pool["subnetpool"]["default_prefixlen"], "26",
        "the real server answers prefix lengths as strings"
    );
    let pool_id = pool["subnetpool"]["id"].as_str().unwrap_or_default().to_string();
    let net = api
        .ok(
            Method::POST,
            "/networks",
            Some(json!({"network": {"project_id": "r"}})),
        )
        .await["network"]["id"]
        .clone();
    let s1 = api.ok(Method::POST, "/subnets", Some(json!({"subnet": {"network_id": net, "project_id": "r", "ip_version": 4, "subnetpool_id": pool_id}}))).await;
    assert_eq!(s1["subnet"]["cidr"], "10.128.0.0/26");
    let s2 = api
        .ok(Method::POST, "/subnets", Some(json!({"subnet": {"network_id": net, "project_id": "r", "ip_version": 4, "subnetpool_id": pool_id, "prefixlen": 28}})))
        .await;
    assert_eq!(s2["subnet"]["cidr"], "10.128.0.64/28");
    assert_eq!(s2["subnet"]["gateway_ip"], "10.128.0.65");
    let sub = s2["subnet"]["id"].as_str().unwrap_or_default().to_string();

    let router = api
        .ok(
            Method::POST,
            "/routers",
            Some(json!({"router": {"name": "r1", "project_id": "r"}})),
        )
        .await;
    let rid = router["router"]["id"].as_str().unwrap_or_default().to_string();
    let info = api
        .ok(
            Method::PUT,
            &format!("/routers/{rid}/add_router_interface"),
            Some(json!({"subnet_id": sub})),
        )
        .await;
    assert_eq!(info["subnet_ids"], json!([sub]));
    let port = api
        .ok(Method::GET, &format!("/ports?device_id={rid}"), None)
        .await;
    assert_eq!(port["ports"][0]["device_owner"], "network:router_interface");
    assert_eq!(port["ports"][0]["fixed_ips"][0]["ip_address"], "10.128.0.65");
    let (s, v) = api
        .req(
            Method::PUT,
            &format!("/routers/{rid}/add_router_interface"),
            Some(json!({"subnet_id": sub})),
        )
        .await;
    assert_eq!((s, err_type(&v)), (StatusCode::BAD_REQUEST, "BadRequest"));
    api.ok(
        Method::PUT,
        &format!("/routers/{rid}/remove_router_interface"),
        Some(json!({"subnet_id": sub})),
    )
    .await;
    let (s, v) = api
        .req(
            Method::PUT,
            &format!("/routers/{rid}/remove_router_interface"),
            Some(json!({"subnet_id": sub})),
        )
        .await;
    assert_eq!(
        (s, err_type(&v)),
        (StatusCode::NOT_FOUND, "RouterInterfaceNotFoundForSubnet")
    );

    let sgs = api.ok(Method::GET, "/security-groups?project_id=r", None).await;
    let default = &sgs["security_groups"][0];
    assert_eq!(default["name"], "default");
    assert_eq!(default["security_group_rules"].as_array().map(Vec::len), Some(4));
    let sg = api
        .ok(
            Method::POST,
            "/security-groups",
            Some(json!({"security_group": {"name": "pod", "project_id": "r"}})),
        )
        .await;
    let sgid = sg["security_group"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let rule = json!({"security_group_rule": {"security_group_id": sgid, "direction": "ingress", "protocol": "tcp", "port_range_min": 80, "port_range_max": 80}});
    let r = api
        .ok(Method::POST, "/security-group-rules", Some(rule.clone()))
        .await;
    assert_eq!(
        r["security_group_rule"]["project_id"], "fake_project_id",
        "noauth: rule project comes from the body only"
    );
    let (s, v) = api.req(Method::POST, "/security-group-rules", Some(rule)).await;
    assert_eq!(
        (s, err_type(&v)),
        (StatusCode::CONFLICT, "SecurityGroupRuleExists")
    );
    emu.shutdown().await;
}

/// Same keys on every resource as the real server (values differ: ids, addresses, timestamps).
#[tokio::test]
async fn shapes_match_real_server() {
    let Some(real_url) = real_neutron_url("shapes_match_real_server") else {
        return;
    };
    let (emu, emu_api) = emulator().await;
    let real_api = Api::new(&real_url);
    let project = format!("emu-shape-{}", uuid::Uuid::new_v4().simple());
    let mut shapes: Vec<Vec<(String, BTreeSet<String>)>> = Vec::new();
    for api in [&emu_api, &real_api] {
        let mut out = Vec::new();
        let keys = |v: &Value| {
            v.as_object()
                .map(|o| o.keys().cloned().collect::<BTreeSet<_>>())
                .unwrap_or_default()
        };
        let (net, sub) = api.net_subnet(&project, "10.90.0.0/24").await;
        out.push((
            "network".to_string(),
            keys(&api.ok(Method::GET, &format!("/networks/{net}"), None).await["network"]),
        ));
        out.push((
            "subnet".to_string(),
            keys(&api.ok(Method::GET, &format!("/subnets/{sub}"), None).await["subnet"]),
        ));
        let parent = api.port(&net, &project, json!({})).await;
        out.push(("port(create)".to_string(), keys(&parent)));
        let child = api.port(&net, &project, json!({})).await;
        let t = api
            .ok(
                Method::POST,
                "/trunks",
                Some(json!({"trunk": {"port_id": parent["id"], "project_id": project,
                    "sub_ports": [{"port_id": child["id"], "segmentation_type": "vlan", "segmentation_id": 42}]}})),
            )
            .await;
        out.push(("trunk".to_string(), keys(&t["trunk"])));
        let pid = parent["id"].as_str().unwrap_or_default().to_string();
        let p = api.ok(Method::GET, &format!("/ports/{pid}"), None).await;
        out.push(("port(parent)".to_string(), keys(&p["port"])));
        out.push(("trunk_details".to_string(), keys(&p["port"]["trunk_details"])));
        out.push((
            "quota details".to_string(),
            keys(
                &api.ok(Method::GET, &format!("/quotas/{project}/details"), None)
                    .await["quota"],
            ),
        ));
        let avail = api
            .ok(Method::GET, &format!("/network-ip-availabilities/{net}"), None)
            .await;
        out.push((
            "ip availability".to_string(),
            keys(&avail["network_ip_availability"]),
        ));
        let sg = api
            .ok(
                Method::GET,
                &format!("/security-groups?project_id={project}"),
                None,
            )
            .await;
        out.push(("security group".to_string(), keys(&sg["security_groups"][0])));
        // Clean up (real server state outlives the test).
        let tid = t["trunk"]["id"].as_str().unwrap_or_default().to_string();
        api.req(Method::DELETE, &format!("/trunks/{tid}"), None).await;
        for id in [pid, child["id"].as_str().unwrap_or_default().to_string()] {
            api.req(Method::DELETE, &format!("/ports/{id}"), None).await;
        }
        api.req(Method::DELETE, &format!("/networks/{net}"), None).await;
        let sgid = sg["security_groups"][0]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        api.req(Method::DELETE, &format!("/security-groups/{sgid}"), None)
            .await;
        shapes.push(out);
    }
    for (emu_shape, real_shape) in shapes[0].iter().zip(&shapes[1]) {
        assert_eq!(emu_shape, real_shape, "key set of {} differs", emu_shape.0);
    }
    emu.shutdown().await;
}

fn eui64(prefix: &str, mac: &str) -> String {
    let b: Vec<u16> = mac
        .split(':')
        .filter_map(|p| u16::from_str_radix(p, 16).ok())
        .collect();
    assert_eq!(b.len(), 6, "mac {mac}");
    let iid = [
        ((b[0] ^ 2) << 8) | b[1],
        (b[2] << 8) | 0xff,
        0xfe00 | b[3],
        (b[4] << 8) | b[5],
    ];
    let addr = format!("{prefix}{:x}:{:x}:{:x}:{:x}", iid[0], iid[1], iid[2], iid[3]);
    addr.parse::<std::net::Ipv6Addr>()
        .map(|a| a.to_string())
        .unwrap_or(addr)
}

#[tokio::test]
async fn slaac_subnets_give_every_port_its_eui64_address() {
    let (emu, api) = emulator().await;
    let (net, v4) = api.net_subnet("s", "10.66.0.0/24").await;
    let v6 = api
        .ok(
            Method::POST,
            "/subnets",
            Some(json!({"subnet": {"network_id": net, "project_id": "s", "ip_version": 6, "cidr": "fd66:1::/64",
                "ipv6_address_mode": "slaac", "ipv6_ra_mode": "slaac"}})),
        )
        .await;
    assert_eq!(v6["subnet"]["allocation_pools"][0]["start"], "fd66:1::1");
    let (s, v) = api
        .req(
            Method::POST,
            "/subnets",
            Some(json!({"subnet": {"network_id": net, "ip_version": 6, "cidr": "fd66:3::/64", "ipv6_address_mode": "bogus"}})),
        )
        .await;
    assert_eq!(
        (s, v["NeutronError"]["message"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("Invalid input for ipv6_address_mode. Reason: bogus is not in valid_values.")
        )
    );
    let p = api.port(&net, "s", json!({})).await;
    let mac = p["mac_address"].as_str().unwrap_or_default();
    assert_eq!(p["fixed_ips"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        p["fixed_ips"][1]["ip_address"].as_str(),
        Some(eui64("fd66:1::", mac).as_str())
    );
    let only_v4 = api
        .port(&net, "s", json!({"fixed_ips": [{"subnet_id": v4}]}))
        .await;
    let mac = only_v4["mac_address"].as_str().unwrap_or_default();
    let addrs: Vec<&str> = only_v4["fixed_ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["ip_address"].as_str())
        .collect();
    assert!(
        addrs.contains(&eui64("fd66:1::", mac).as_str()),
        "SLAAC address added although only v4 was asked: {addrs:?}"
    );
    let bulk = api
        .ok(Method::POST, "/ports", Some(json!({"ports": [{"network_id": net, "project_id": "s"}, {"network_id": net, "project_id": "s"}]})))
        .await;
    let v6s: BTreeSet<&str> = bulk["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["fixed_ips"][1]["ip_address"].as_str())
        .collect();
    assert_eq!(v6s.len(), 2);
    emu.shutdown().await;
}

/// label, method, path, body, If-Match value.
type ParityCase<'a> = (&'a str, Method, String, Option<Value>, Option<&'a str>);

/// Status, error type and message (ids blanked) of edge-case requests, compared with the real server.
#[tokio::test]
async fn error_parity_with_real_server() {
    let Some(real_url) = real_neutron_url("error_parity_with_real_server") else {
        return;
    };
    let (emu, emu_api) = emulator().await;
    let real_api = Api::new(&real_url);
    let zero = "00000000-0000-0000-0000-000000000000";
    let mut results: Vec<Vec<String>> = Vec::new();
    for api in [&emu_api, &real_api] {
        let project = format!("emu-parity-{}", uuid::Uuid::new_v4().simple());
        let (net, sub) = api.net_subnet(&project, "10.56.0.0/24").await;
        let port = api
            .port(
                &net,
                &project,
                json!({"fixed_ips": [{"ip_address": "10.56.0.10"}]}),
            )
            .await;
        let port = port["id"].as_str().unwrap_or_default().to_string();
        let sg = api
            .ok(
                Method::POST,
                "/security-groups",
                Some(json!({"security_group": {"project_id": project, "name": "s"}})),
            )
            .await;
        let sg = sg["security_group"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let cases: Vec<ParityCase<'_>> = vec![
            (
                "no member",
                Method::POST,
                "/networks".into(),
                Some(json!({})),
                None,
            ),
            (
                "bad bool",
                Method::POST,
                "/networks".into(),
                Some(json!({"network": {"admin_state_up": "x"}})),
                None,
            ),
            (
                "bad cidr",
                Method::POST,
                "/subnets".into(),
                Some(json!({"subnet": {"network_id": net, "ip_version": 4, "cidr": "banana"}})),
                None,
            ),
            (
                "bad version",
                Method::POST,
                "/subnets".into(),
                Some(json!({"subnet": {"network_id": net, "ip_version": 5, "cidr": "10.1.0.0/24"}})),
                None,
            ),
            (
                "overlap",
                Method::POST,
                "/subnets".into(),
                Some(json!({"subnet": {"network_id": net, "ip_version": 4, "cidr": "10.56.0.0/25"}})),
                None,
            ),
            (
                "no cidr",
                Method::POST,
                "/subnets".into(),
                Some(json!({"subnet": {"network_id": net, "ip_version": 4}})),
                None,
            ),
            (
                "pool outside",
                Method::POST,
                "/subnets".into(),
                Some(
                    json!({"subnet": {"network_id": net, "ip_version": 4, "cidr": "10.4.0.0/24", "allocation_pools": [{"start": "10.5.0.2", "end": "10.5.0.9"}]}}),
                ),
                None,
            ),
            (
                "bad mac",
                Method::POST,
                "/ports".into(),
                Some(json!({"port": {"network_id": net, "mac_address": "zz"}})),
                None,
            ),
            (
                "missing sg",
                Method::POST,
                "/ports".into(),
                Some(json!({"port": {"network_id": net, "security_groups": [zero]}})),
                None,
            ),
            (
                "ip outside subnet",
                Method::POST,
                "/ports".into(),
                Some(
                    json!({"port": {"network_id": net, "fixed_ips": [{"subnet_id": sub, "ip_address": "10.99.0.5"}]}}),
                ),
                None,
            ),
            (
                "ip taken",
                Method::POST,
                "/ports".into(),
                Some(json!({"port": {"network_id": net, "fixed_ips": [{"ip_address": "10.56.0.10"}]}})),
                None,
            ),
            (
                "status in POST",
                Method::POST,
                "/ports".into(),
                Some(json!({"port": {"network_id": net, "status": "ACTIVE"}})),
                None,
            ),
            (
                "read-only",
                Method::PUT,
                format!("/ports/{port}"),
                Some(json!({"port": {"status": "ACTIVE"}})),
                None,
            ),
            (
                "bad vnic",
                Method::PUT,
                format!("/ports/{port}"),
                Some(json!({"port": {"binding:vnic_type": "weird"}})),
                None,
            ),
            (
                "stale delete",
                Method::DELETE,
                format!("/ports/{port}"),
                None,
                Some("revision_number=99"),
            ),
            (
                "trunk without port",
                Method::POST,
                "/trunks".into(),
                Some(json!({"trunk": {}})),
                None,
            ),
            (
                "trunk missing port",
                Method::POST,
                "/trunks".into(),
                Some(json!({"trunk": {"port_id": zero}})),
                None,
            ),
            (
                "bad tags body",
                Method::PUT,
                format!("/ports/{port}/tags"),
                Some(json!({"x": 1})),
                None,
            ),
            (
                "missing rule dir",
                Method::POST,
                "/security-group-rules".into(),
                Some(json!({"security_group_rule": {"security_group_id": sg}})),
                None,
            ),
            (
                "bad port range",
                Method::POST,
                "/security-group-rules".into(),
                Some(
                    json!({"security_group_rule": {"security_group_id": sg, "direction": "ingress", "protocol": "tcp", "port_range_min": 90, "port_range_max": 80}}),
                ),
                None,
            ),
            (
                "sg in use",
                Method::DELETE,
                format!("/security-groups/{sg}"),
                None,
                None,
            ),
            (
                "missing router",
                Method::GET,
                format!("/routers/{zero}"),
                None,
                None,
            ),
            (
                "missing pool",
                Method::GET,
                format!("/subnetpools/{zero}"),
                None,
                None,
            ),
            (
                "sort mismatch",
                Method::GET,
                "/networks?sort_key=name".into(),
                None,
                None,
            ),
            ("bad filter", Method::GET, "/ports?bogus=1".into(), None, None),
            ("bad limit", Method::GET, "/ports?limit=x".into(), None, None),
            (
                "quota too small",
                Method::PUT,
                format!("/quotas/{project}"),
                Some(json!({"quota": {"port": -5}})),
                None,
            ),
            (
                "network in use",
                Method::DELETE,
                format!("/networks/{net}"),
                None,
                None,
            ),
        ];
        let mut out = Vec::new();
        // Bind the port to the security group first so "sg in use" is in use on both.
        api.ok(
            Method::PUT,
            &format!("/ports/{port}"),
            Some(json!({"port": {"security_groups": [sg]}})),
        )
        .await;
        for (label, m, path, body, if_match) in cases {
            let headers: Vec<(&str, &str)> = if_match.map(|v| vec![("If-Match", v)]).unwrap_or_default();
            let (s, v) = api.req_h(m, &path, body, &headers).await;
            let msg = v["NeutronError"]["message"].as_str().unwrap_or("").to_string();
            let blanked: String = msg
                .split(' ')
                .map(|w| {
                    if uuid::Uuid::parse_str(w.trim_end_matches(['.', ',', ':'])).is_ok() {
                        "ID"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" ");
            out.push(format!("{label}: {} {} {blanked}", s.as_u16(), err_type(&v)));
        }
        api.req(Method::DELETE, &format!("/ports/{port}"), None).await;
        api.req(Method::DELETE, &format!("/networks/{net}"), None).await;
        let sgs = api
            .ok(
                Method::GET,
                &format!("/security-groups?project_id={project}&fields=id"),
                None,
            )
            .await;
        for s in sgs["security_groups"].as_array().into_iter().flatten() {
            api.req(
                Method::DELETE,
                &format!("/security-groups/{}", s["id"].as_str().unwrap_or_default()),
                None,
            )
            .await;
        }
        api.req(Method::DELETE, &format!("/quotas/{project}"), None).await;
        results.push(out);
    }
    for (e, r) in results[0].iter().zip(&results[1]) {
        assert_eq!(e, r, "emulator (left) differs from the real server (right)");
    }
    emu.shutdown().await;
}

/// ML2 openvswitch + sriovnicswitch with the lab's agents (what scripts/neutron-lab/ configures and the real
/// server answered): which port binds where, with which vif_type.
#[tokio::test]
#[allow(clippy::unwrap_used)]
async fn bindings_follow_network_segment_vnic_type_and_agent_mappings() {
    let emu = Emulator::start(EmulatorOptions {
        agent_hosts: AgentHosts::Only(["node-a".to_string()].into()),
        ..EmulatorOptions::default()
    })
    .await
    .unwrap();
    let api = Api::new(&emu.url());
    let project = "bindings";
    let net = |extra: Value| {
        let api = &api;
        async move {
            let mut n = json!({"name": "n", "project_id": project});
            if let (Value::Object(n), Value::Object(e)) = (&mut n, extra) {
                n.extend(e);
            }
            let v = api
                .ok(Method::POST, "/networks", Some(json!({"network": n})))
                .await["network"]
                .clone();
            let id = v["id"].as_str().unwrap().to_string();
            api.ok(
                Method::POST,
                "/subnets",
                Some(
                    json!({"subnet": {"network_id": id, "project_id": project, "ip_version": 4,
                                       "cidr": format!("10.{}.0.0/24", rand_octet()), "enable_dhcp": false}}),
                ),
            )
            .await;
            v
        }
    };
    let vlan2 = net(json!({"provider:network_type": "vlan", "provider:physical_network": "physnet2"})).await;
    let seg = vlan2["provider:segmentation_id"].as_u64().unwrap();
    assert!((300..=399).contains(&seg), "{vlan2}");
    assert_eq!(vlan2["mtu"], 1500);
    let vlan1 = net(
        json!({"provider:network_type": "vlan", "provider:physical_network": "physnet1",
                           "provider:segmentation_id": 150}),
    )
    .await;
    assert_eq!(vlan1["provider:segmentation_id"], 150);
    let flat2 = net(json!({"provider:network_type": "flat", "provider:physical_network": "physnet2"})).await;
    assert_eq!(flat2["provider:segmentation_id"], Value::Null);
    let vxlan = net(json!({})).await;
    assert_eq!(vxlan["provider:network_type"], "vxlan");
    assert_eq!(vxlan["mtu"], 1450);
    let (s, e) = api
        .req(
            Method::POST,
            "/networks",
            Some(json!({"network": {"provider:network_type": "flat", "provider:physical_network": "physnet2"}})),
        )
        .await;
    assert_eq!((s.as_u16(), err_type(&e)), (409, "FlatNetworkInUse"), "{e}");

    let bind = |net: &Value, host: &str, extra: Value| {
        let api = &api;
        let id = net["id"].as_str().unwrap().to_string();
        let host = host.to_string();
        async move {
            let mut x = json!({"binding:host_id": host});
            if let (Value::Object(x), Value::Object(e)) = (&mut x, extra) {
                x.extend(e);
            }
            api.port(&id, project, x).await
        }
    };
    let direct = json!({"binding:vnic_type": "direct"});
    // SR-IOV: direct and macvtap on a flat/VLAN network of the NIC Switch agent's physnet.
    let p = bind(&vlan2, "node-a", direct.clone()).await;
    assert_eq!(p["binding:vif_type"], "hw_veb");
    assert_eq!(
        p["binding:vif_details"],
        json!({"port_filter": false, "connectivity": "l2", "vlan": seg.to_string(),
               "bound_drivers": {"0": "sriovnicswitch"}})
    );
    assert_eq!(p["status"], "DOWN");
    wait_status(&api, p["id"].as_str().unwrap(), "ACTIVE").await;
    let p = bind(&flat2, "node-a", direct.clone()).await;
    assert_eq!(
        (&p["binding:vif_type"], &p["binding:vif_details"]["vlan"]),
        (&json!("hw_veb"), &json!("0"))
    );
    let p = bind(&vlan2, "node-a", json!({"binding:vnic_type": "macvtap"})).await;
    assert_eq!(p["binding:vif_type"], "hw_veb");
    // Not on VXLAN, not on the OVS agent's physnet, not on a host without agents, not with switchdev there.
    for (n, host, extra) in [
        (&vxlan, "node-a", direct.clone()),
        (&vlan1, "node-a", direct.clone()),
        (&vlan2, "node-b", direct.clone()),
        (
            &vlan2,
            "node-a",
            json!({"binding:vnic_type": "direct", "binding:profile": {"capabilities": ["switchdev"]}}),
        ),
        (&vlan2, "node-a", json!({})),
    ] {
        let p = bind(n, host, extra.clone()).await;
        assert_eq!(p["binding:vif_type"], "binding_failed", "{extra} on {n}");
        tokio::time::sleep(Duration::from_millis(5)).await;
        let v = api
            .ok(
                Method::GET,
                &format!("/ports/{}", p["id"].as_str().unwrap()),
                None,
            )
            .await;
        assert_eq!(v["port"]["status"], "DOWN");
    }
    // OVS: VXLAN, or a flat/VLAN network of its bridge-mapped physnet; unbound without a host.
    assert_eq!(bind(&vxlan, "node-a", json!({})).await["binding:vif_type"], "ovs");
    assert_eq!(bind(&vlan1, "node-a", json!({})).await["binding:vif_type"], "ovs");
    assert_eq!(
        bind(&vlan2, "", direct.clone()).await["binding:vif_type"],
        "unbound"
    );
    // Both agents of the host are listed.
    let agents = api.ok(Method::GET, "/agents", None).await;
    let mut types: Vec<(&str, &str)> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["host"].as_str().unwrap(), a["agent_type"].as_str().unwrap()))
        .collect();
    types.sort();
    assert_eq!(
        types,
        [("node-a", "NIC Switch agent"), ("node-a", "Open vSwitch agent")]
    );
    let nic = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["agent_type"] == "NIC Switch agent")
        .unwrap();
    assert_eq!(
        nic["configurations"]["device_mappings"],
        json!({"physnet2": ["ens2f0"]})
    );
    emu.shutdown().await;
}

fn rand_octet() -> u8 {
    use std::sync::atomic::{AtomicU8, Ordering};
    static NEXT: AtomicU8 = AtomicU8::new(100);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A rule's delay holds a request before it is carried out, and a client that gives up (or dies)
/// meanwhile does not stop it: the port exists after, as behind the real server's uWSGI.
#[tokio::test]
async fn a_delayed_request_is_carried_out_after_its_client_is_gone() {
    let (emu, api) = emulator().await;
    let (net, _) = api.net_subnet("held", "10.71.0.0/24").await;
    emu.set_faults(FaultConfig {
        rules: vec![FaultRule::delay("port.create", Duration::from_millis(600))],
        ..Default::default()
    });
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let gave_up = impatient
        .post(format!("{}/ports", api.base))
        .json(&json!({"port": {"network_id": net, "project_id": "held"}}))
        .send()
        .await;
    assert!(
        gave_up.is_err_and(|e| e.is_timeout()),
        "the client stopped waiting"
    );
    drop(impatient);
    assert_eq!(api.count_ports("held").await, 0, "still held");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        api.count_ports("held").await,
        1,
        "carried out after its client left"
    );
    // Other operations are not held.
    let started = std::time::Instant::now();
    api.count_ports("held").await;
    assert!(started.elapsed() < Duration::from_millis(500));
}
