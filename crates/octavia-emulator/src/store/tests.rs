//! Store rules without HTTP: lifecycle, graph create, batch members, cascade delete, immutability, quota,
//! provider restrictions.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;

const SUBNET: &str = "5f4a6f5e-9a0e-4e7b-8c1f-0b7f2d2f0a11";

fn store(worker_ms: u64) -> Store {
    Store::new(StoreConfig {
        worker: WorkerDelays {
            lb_create_ms: worker_ms,
            lb_update_ms: worker_ms,
            lb_delete_ms: worker_ms,
            child_create_ms: worker_ms,
            child_update_ms: worker_ms,
            child_delete_ms: worker_ms,
        },
        ..StoreConfig::default()
    })
}

fn id(v: &Value, key: &str) -> String {
    v[key]["id"].as_str().map(String::from).unwrap_or_default()
}

fn later(now: Instant) -> Instant {
    now + Duration::from_secs(10)
}

/// An ACTIVE load balancer with an ACTIVE TCP listener and a default pool.
fn lb_with_pool(s: &mut Store, now: Instant) -> (String, String, String) {
    let lb = s
        .create_loadbalancer(
            Some(NOAUTH_PROJECT),
            &json!({"loadbalancer": {"vip_subnet_id": SUBNET, "name": "lb"}}),
            now,
        )
        .map(|v| id(&v, "loadbalancer"))
        .unwrap_or_default();
    s.settle(later(now));
    let l = s
        .create_listener(
            &json!({"listener": {"loadbalancer_id": lb, "protocol": "TCP", "protocol_port": 80}}),
            now,
        )
        .map(|v| id(&v, "listener"))
        .unwrap_or_default();
    s.settle(later(now));
    let p = s
        .create_pool(
            &json!({"pool": {"listener_id": l, "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN"}}),
            now,
        )
        .map(|v| id(&v, "pool"))
        .unwrap_or_default();
    s.settle(later(now));
    (lb, l, p)
}

#[test]
fn create_goes_pending_then_active_and_pending_blocks_writes() {
    let mut s = store(1500);
    let now = Instant::now();
    let v = s.create_loadbalancer(
        Some(NOAUTH_PROJECT),
        &json!({"loadbalancer": {"vip_subnet_id": SUBNET}}),
        now,
    );
    let v = v.unwrap_or_default();
    let lb = id(&v, "loadbalancer");
    assert_eq!(v["loadbalancer"]["provisioning_status"], "PENDING_CREATE");
    assert_eq!(v["loadbalancer"]["operating_status"], "OFFLINE");
    assert_eq!(v["loadbalancer"]["provider"], "amphora");
    assert_eq!(v["loadbalancer"]["project_id"], NOAUTH_PROJECT);
    assert_eq!(v["loadbalancer"]["vip_address"], "10.0.0.2");
    let err = s.update_loadbalancer(&lb, &json!({"loadbalancer": {"name": "x"}}), now);
    assert_eq!(err, Err(ApiError::lb_pending("PENDING_CREATE", &lb)));
    assert_eq!(err.err().map(|e| e.status), Some(409));
    let child = s.create_listener(
        &json!({"listener": {"loadbalancer_id": lb, "protocol": "TCP", "protocol_port": 80}}),
        now,
    );
    assert_eq!(
        child.err().map(|e| e.faultstring),
        Some(format!("Load Balancer {lb} is immutable and cannot be updated."))
    );
    s.settle(now + Duration::from_millis(1499));
    assert_eq!(s.loadbalancers[&lb].common.provisioning_status, PENDING_CREATE);
    s.settle(now + Duration::from_millis(1500));
    assert_eq!(s.loadbalancers[&lb].common.provisioning_status, ACTIVE);
    let v = s
        .update_loadbalancer(&lb, &json!({"loadbalancer": {"name": "x", "tags": ["a"]}}), now)
        .unwrap_or_default();
    assert_eq!(v["loadbalancer"]["provisioning_status"], "PENDING_UPDATE");
    assert_eq!(v["loadbalancer"]["tags"], json!(["a"]));
}

#[test]
fn fully_populated_create_builds_the_tree() {
    let mut s = store(0);
    let now = Instant::now();
    let body = json!({"loadbalancer": {
        "vip_subnet_id": SUBNET, "vip_address": "10.0.5.5", "name": "graph", "tags": ["k8s"],
        "listeners": [{"protocol": "TCP", "protocol_port": 80, "timeout_client_data": 1000,
            "default_pool": {"name": "p1", "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN",
                "members": [{"address": "10.1.0.1", "protocol_port": 8080}, {"address": "10.1.0.2", "protocol_port": 8080}],
                "healthmonitor": {"type": "TCP", "delay": 5, "timeout": 3, "max_retries": 3}}}]
    }});
    let v = s
        .create_loadbalancer(Some(NOAUTH_PROJECT), &body, now)
        .unwrap_or_default();
    let lb = &v["loadbalancer"];
    assert_eq!(lb["vip_address"], "10.0.5.5");
    assert_eq!(lb["listeners"][0]["timeout_client_data"], 1000);
    assert_eq!(lb["listeners"][0]["provisioning_status"], "PENDING_CREATE");
    assert_eq!(lb["pools"][0]["members"].as_array().map(Vec::len), Some(2));
    assert_eq!(lb["pools"][0]["healthmonitor"]["type"], "TCP");
    assert_eq!(lb["listeners"][0]["default_pool_id"], lb["pools"][0]["id"]);
    let lb_id = lb["id"].as_str().unwrap_or_default().to_string();
    s.settle(now);
    let st = s.loadbalancer_status(&lb_id).unwrap_or_default();
    let tree = &st["statuses"]["loadbalancer"];
    assert_eq!(tree["provisioning_status"], "ACTIVE");
    assert_eq!(
        tree["listeners"][0]["pools"][0]["members"][1]["provisioning_status"],
        "ACTIVE"
    );
    assert_eq!(tree["listeners"][0]["pools"][0]["health_monitor"]["type"], "TCP");
    // A duplicate VIP on the same subnet is refused.
    let dup = s.create_loadbalancer(
        Some(NOAUTH_PROJECT),
        &json!({"loadbalancer": {"vip_subnet_id": SUBNET, "vip_address": "10.0.5.5"}}),
        now,
    );
    assert_eq!(dup.err().map(|e| e.status), Some(409));
    // A reference to an undefined pool is refused before anything is stored.
    let before = s.loadbalancers.len();
    let bad = json!({"loadbalancer": {"vip_subnet_id": SUBNET,
        "listeners": [{"protocol": "TCP", "protocol_port": 81, "default_pool": {"name": "nope"}}]}});
    assert_eq!(
        s.create_loadbalancer(Some(NOAUTH_PROJECT), &bad, now)
            .err()
            .map(|e| e.faultstring),
        Some("Validation failure: Pool 'nope' was referenced but no full definition was found.".into())
    );
    assert_eq!(s.loadbalancers.len(), before);
}

#[test]
fn batch_member_update_replaces_the_set() {
    let mut s = store(0);
    let now = Instant::now();
    let (_, _, pool) = lb_with_pool(&mut s, now);
    let members = |s: &Store| {
        let mut v: Vec<(String, i64, i64)> = s
            .members
            .values()
            .map(|m| (m.address.clone(), m.protocol_port, m.weight))
            .collect();
        v.sort();
        v
    };
    let body = json!({"members": [{"address": "10.1.0.1", "protocol_port": 80}, {"address": "10.1.0.2", "protocol_port": 80}]});
    assert_eq!(s.batch_update_members(&pool, &body, false, now), Ok(()));
    s.settle(now);
    let kept = s
        .members
        .values()
        .find(|m| m.address == "10.1.0.1")
        .map(|m| m.common.id.clone());
    let body = json!({"members": [{"address": "10.1.0.1", "protocol_port": 80, "weight": 5}, {"address": "10.1.0.3", "protocol_port": 80}]});
    assert_eq!(s.batch_update_members(&pool, &body, false, now), Ok(()));
    // Removed members wait for the worker in PENDING_DELETE.
    assert!(
        s.members
            .values()
            .any(|m| m.address == "10.1.0.2" && m.common.provisioning_status == PENDING_DELETE)
    );
    s.settle(now);
    assert_eq!(
        members(&s),
        vec![("10.1.0.1".into(), 80, 5), ("10.1.0.3".into(), 80, 1)]
    );
    assert_eq!(
        s.members
            .values()
            .find(|m| m.address == "10.1.0.1")
            .map(|m| m.common.id.clone()),
        kept
    );
    // additive_only keeps members not named.
    let body = json!({"members": [{"address": "10.1.0.4", "protocol_port": 80}]});
    assert_eq!(s.batch_update_members(&pool, &body, true, now), Ok(()));
    s.settle(now);
    assert_eq!(s.members.len(), 3);
    // Same member twice: 400.
    let body = json!({"members": [{"address": "10.1.0.1", "protocol_port": 80}, {"address": "10.1.0.1", "protocol_port": 80}]});
    assert_eq!(
        s.batch_update_members(&pool, &body, false, now)
            .err()
            .map(|e| e.status),
        Some(400)
    );
}

#[test]
fn member_writes_wait_for_the_pool_and_the_load_balancer() {
    let mut s = store(300);
    let now = Instant::now();
    let (lb, _, pool) = lb_with_pool(&mut s, now);
    let t = later(now);
    let body = json!({"member": {"address": "10.1.0.1", "protocol_port": 80}});
    assert!(s.create_member(&pool, &body, t).is_ok());
    assert_eq!(s.loadbalancers[&lb].common.provisioning_status, PENDING_UPDATE);
    let again = s.create_member(
        &pool,
        &json!({"member": {"address": "10.1.0.2", "protocol_port": 80}}),
        t,
    );
    assert_eq!(again.err(), Some(ApiError::immutable("Pool", &pool)));
    s.settle(t + Duration::from_millis(300));
    let dup = s.create_member(&pool, &body, t);
    assert_eq!(
        dup.err().map(|e| (e.status, e.faultstring)),
        Some((
            409,
            "Another member on this pool is already using ip 10.1.0.1 on protocol_port 80".into()
        ))
    );
}

#[test]
fn delete_needs_cascade_and_cascade_removes_everything() {
    let mut s = store(0);
    let now = Instant::now();
    let (lb, _, pool) = lb_with_pool(&mut s, now);
    assert!(
        s.create_member(
            &pool,
            &json!({"member": {"address": "10.1.0.1", "protocol_port": 80}}),
            now
        )
        .is_ok()
    );
    s.settle(now);
    let err = s.delete_loadbalancer(&lb, false, now).err();
    assert_eq!(
        err.map(|e| (e.status, e.faultstring)),
        Some((
            400,
            format!("Validation failure: Cannot delete Load Balancer {lb} - it has children")
        ))
    );
    assert_eq!(s.delete_loadbalancer(&lb, true, now), Ok(()));
    assert_eq!(s.loadbalancers[&lb].common.provisioning_status, PENDING_DELETE);
    s.settle(now);
    assert!(
        s.loadbalancers.is_empty() && s.listeners.is_empty() && s.pools.is_empty() && s.members.is_empty()
    );
}

#[test]
fn error_state_blocks_updates_but_allows_delete() {
    let mut s = store(0);
    let now = Instant::now();
    let lb = s
        .create_loadbalancer(
            Some(NOAUTH_PROJECT),
            &json!({"loadbalancer": {"vip_subnet_id": SUBNET}}),
            now,
        )
        .map(|v| id(&v, "loadbalancer"))
        .unwrap_or_default();
    s.settle(now);
    assert_eq!(s.force_error(&lb), Ok(()));
    let upd = s.update_loadbalancer(&lb, &json!({"loadbalancer": {"name": "x"}}), now);
    assert_eq!(upd.err(), Some(ApiError::lb_pending("ERROR", &lb)));
    assert_eq!(s.delete_loadbalancer(&lb, false, now), Ok(()));
}

#[test]
fn quota_is_enforced_only_when_asked() {
    let mut s = store(0);
    let body = json!({"loadbalancer": {"vip_subnet_id": SUBNET, "project_id": "p1"}});
    s.update_quota("p1", &json!({"quota": {"loadbalancer": 0}}))
        .unwrap_or_default();
    assert!(
        s.create_loadbalancer(Some(NOAUTH_PROJECT), &body, Instant::now())
            .is_ok(),
        "noauth: everything is admin, no quota is met"
    );
    let mut s = store(0);
    s.config.enforce_quota = true;
    let now = Instant::now();
    let q = s
        .update_quota("p1", &json!({"quota": {"loadbalancer": 1}}))
        .unwrap_or_default();
    assert_eq!(q["quota"]["load_balancer"], 1);
    assert_eq!(q["quota"]["listener"], -1);
    let body = json!({"loadbalancer": {"vip_subnet_id": SUBNET, "project_id": "p1"}});
    assert!(s.create_loadbalancer(Some(NOAUTH_PROJECT), &body, now).is_ok());
    let err = s.create_loadbalancer(Some(NOAUTH_PROJECT), &body, now).err();
    assert_eq!(
        err.map(|e| (e.status, e.faultstring)),
        Some((403, "Quota has been met for resources: Load Balancer".into()))
    );
    // Other projects keep the unlimited default.
    assert!(
        s.create_loadbalancer(
            Some(NOAUTH_PROJECT),
            &json!({"loadbalancer": {"vip_subnet_id": SUBNET, "project_id": "p2"}}),
            now
        )
        .is_ok()
    );
}

#[test]
fn ovn_provider_restrictions() {
    let mut s = store(0);
    let now = Instant::now();
    let lb = s
        .create_loadbalancer(
            Some(NOAUTH_PROJECT),
            &json!({"loadbalancer": {"vip_subnet_id": SUBNET, "provider": "ovn"}}),
            now,
        )
        .map(|v| id(&v, "loadbalancer"))
        .unwrap_or_default();
    s.settle(now);
    let http = s.create_listener(
        &json!({"listener": {"loadbalancer_id": lb, "protocol": "HTTP", "protocol_port": 80}}),
        now,
    );
    assert_eq!(
        http.err().map(|e| (e.status, e.faultstring)),
        Some((
            501,
            "Provider 'ovn' does not support a requested option: OVN provider does not support HTTP protocol"
                .into()
        ))
    );
    let pool = s.create_pool(
        &json!({"pool": {"loadbalancer_id": lb, "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN"}}),
        now,
    );
    assert_eq!(
        pool.err().map(|e| e.faultstring),
        Some("Provider 'ovn' does not support a requested option: OVN provider does not support ROUND_ROBIN algorithm".into())
    );
    let ok = s.create_pool(
        &json!({"pool": {"loadbalancer_id": lb, "protocol": "UDP", "lb_algorithm": "SOURCE_IP_PORT"}}),
        now,
    );
    assert!(ok.is_ok());
    s.settle(now);
    let ovn_pool = s
        .pools
        .values()
        .find(|p| p.lb_id == lb)
        .map(|p| p.common.id.clone())
        .unwrap_or_default();
    let v6 = s.create_member(
        &ovn_pool,
        &json!({"member": {"address": "fd00::5", "protocol_port": 53}}),
        now,
    );
    assert_eq!(
        v6.err().map(|e| e.faultstring),
        Some(
            "Provider 'ovn' does not support a requested option: OVN provider does not support mixing IPv4/IPv6 \
             configuration within the same Load Balancer."
                .into()
        )
    );
    // amphora refuses SOURCE_IP_PORT but takes SCTP.
    let amp = s
        .create_loadbalancer(
            Some(NOAUTH_PROJECT),
            &json!({"loadbalancer": {"vip_subnet_id": SUBNET}}),
            now,
        )
        .map(|v| id(&v, "loadbalancer"))
        .unwrap_or_default();
    s.settle(now);
    let p = s.create_pool(
        &json!({"pool": {"loadbalancer_id": amp, "protocol": "TCP", "lb_algorithm": "SOURCE_IP_PORT"}}),
        now,
    );
    assert_eq!(p.err().map(|e| e.status), Some(501));
    let l = s.create_listener(
        &json!({"listener": {"loadbalancer_id": amp, "protocol": "SCTP", "protocol_port": 80}}),
        now,
    );
    assert!(l.is_ok());
}

#[test]
fn validation_errors_are_wsme_shaped() {
    let mut s = store(0);
    let now = Instant::now();
    let no_vip = s
        .create_loadbalancer(Some(NOAUTH_PROJECT), &json!({"loadbalancer": {}}), now)
        .err();
    assert_eq!(
        no_vip.map(|e| e.faultstring),
        Some(
            "Validation failure: VIP must contain one of: vip_port_id, vip_network_id, vip_subnet_id.".into()
        )
    );
    let unknown = s
        .create_loadbalancer(
            Some(NOAUTH_PROJECT),
            &json!({"loadbalancer": {"vip_subnet_id": SUBNET, "bogus": 1}}),
            now,
        )
        .err();
    assert_eq!(
        unknown.map(|e| e.faultstring),
        Some("Unknown attribute for argument loadbalancer: bogus".into())
    );
    let (_, l, _) = lb_with_pool(&mut s, now);
    // protocol_port is immutable: not an attribute of ListenerPUT.
    let imm = s
        .update_listener(&l, &json!({"listener": {"protocol_port": 81}}), now)
        .err();
    assert_eq!(imm.map(|e| e.status), Some(400));
    let e = ApiError::not_found("Load Balancer", "x").body();
    assert_eq!(
        e,
        json!({"faultcode": "Client", "faultstring": "Load Balancer x not found.", "debuginfo": null})
    );
}

#[test]
fn failing_worker_jobs_end_in_error_and_failover_repairs() {
    let mut s = store(0);
    let now = Instant::now();
    s.failing_jobs = 1;
    let body = json!({"loadbalancer": {"vip_subnet_id": SUBNET,
        "listeners": [{"protocol": "TCP", "protocol_port": 80}]}});
    let lb = s
        .create_loadbalancer(Some(NOAUTH_PROJECT), &body, now)
        .map(|v| id(&v, "loadbalancer"))
        .unwrap_or_default();
    s.settle(now);
    assert_eq!(s.loadbalancers[&lb].common.provisioning_status, ERROR);
    assert!(
        s.listeners
            .values()
            .all(|l| l.common.provisioning_status == ERROR)
    );
    assert_eq!(s.failover_loadbalancer(&lb, now), Ok(()));
    assert_eq!(s.loadbalancers[&lb].common.provisioning_status, PENDING_UPDATE);
    s.settle(now);
    assert_eq!(s.loadbalancers[&lb].common.provisioning_status, ACTIVE);
}

#[test]
fn session_persistence_rules_by_protocol() {
    let mut s = store(0);
    let now = Instant::now();
    let (lb, _, _) = lb_with_pool(&mut s, now);
    let pool = |proto: &str, sp: Value| {
        json!({"pool": {"loadbalancer_id": lb, "protocol": proto,
        "lb_algorithm": "SOURCE_IP", "session_persistence": sp}})
    };
    let err = |r: Result<Value, ApiError>| r.err().map(|e| e.faultstring);
    assert_eq!(
        err(s.create_pool(
            &pool("UDP", json!({"type": "APP_COOKIE", "cookie_name": "c"})),
            now
        )),
        Some("Validation failure: Cookie names are not supported for UDP/SCTP pools.".into())
    );
    assert_eq!(
        err(s.create_pool(&pool("UDP", json!({"type": "HTTP_COOKIE"})), now)),
        Some("Validation failure: Session persistence of type HTTP_COOKIE is not supported for UDP/SCTP protocol pools.".into())
    );
    assert_eq!(
        err(s.create_pool(&pool("HTTP", json!({"type": "APP_COOKIE"})), now)),
        Some("Validation failure: Field \"cookie_name\" must be specified when using the \"APP_COOKIE\" session persistence type.".into())
    );
    assert_eq!(
        err(s.create_pool(&pool("TCP", json!({"type": "SOURCE_IP", "persistence_timeout": 60})), now)),
        Some("Validation failure: persistence_timeout and persistence_granularity is only for UDP and SCTP protocol pools.".into())
    );
    let ok = s.create_pool(
        &pool("UDP", json!({"type": "SOURCE_IP", "persistence_timeout": 60})),
        now,
    );
    let v = ok.unwrap_or_default();
    assert_eq!(v["pool"]["session_persistence"]["persistence_timeout"], 60);
    assert_eq!(v["pool"]["session_persistence"]["cookie_name"], Value::Null);
}

#[test]
fn listener_protocol_option_rules() {
    let mut s = store(0);
    let now = Instant::now();
    let (lb, _, _) = lb_with_pool(&mut s, now);
    let mk = |extra: Value| {
        let mut l = json!({"loadbalancer_id": lb, "protocol": "TCP", "protocol_port": 90});
        if let (Some(o), Value::Object(e)) = (l.as_object_mut(), extra) {
            o.extend(e);
        }
        json!({ "listener": l })
    };
    let err = |r: Result<Value, ApiError>| r.err().map(|e| e.faultstring);
    assert_eq!(
        err(s.create_listener(&mk(json!({"insert_headers": {"X-Forwarded-For": "true"}})), now)),
        Some("insert-headers is not a valid option for a TCP protocol listener.".into())
    );
    assert_eq!(
        err(s.create_listener(
            &mk(json!({"protocol": "TERMINATED_HTTPS", "protocol_port": 443})),
            now
        )),
        Some(
            "Validation failure: An SNI or default certificate container reference must be provided for \
             TERMINATED_HTTPS protocol listeners."
                .into()
        )
    );
    assert_eq!(
        err(s.create_listener(&mk(json!({"allowed_cidrs": ["fd00::/64"]})), now)),
        Some("Validation failure: CIDR fd00::/64 IP version incompatible with all VIPs ['10.0.0.2'] IP version.".into())
    );
    assert_eq!(
        err(s.create_listener(&mk(json!({"allowed_cidrs": ["10.0.1.0/33"]})), now)),
        Some(
            "Invalid input for field/attribute allowed_cidrs. Value: '['10.0.1.0/33']'. Value should be IPv4 or IPv6 \
             CIDR format"
                .into()
        )
    );
    assert_eq!(
        err(s.create_listener(&mk(json!({"protocol_port": 80})), now)),
        Some(
            "Another Listener on this Load Balancer is already using protocol TCP and protocol_port 80"
                .into()
        )
    );
    // UDP can share the port number with TCP.
    assert!(
        s.create_listener(&mk(json!({"protocol": "UDP", "protocol_port": 80})), now)
            .is_ok()
    );
}
