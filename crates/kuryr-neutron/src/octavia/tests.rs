//! The client's Octavia-specific behaviour against a scripted in-process server: the 409 wait-and-resend, polling
//! to ACTIVE / ERROR / gone, and the shapes it sends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::*;

const LB: &str = "1b2c43ee-ced7-476b-88d8-18071a8dff93";

/// A load balancer whose provisioning_status follows a script: each GET takes the next status (the last one
/// sticks); "GONE" answers 404. PUTs are refused with Octavia's 409 while the current status is PENDING_*.
#[derive(Default)]
struct Fake {
    script: Vec<&'static str>,
    polls: usize,
    puts: Vec<Value>,
    refused_puts: usize,
    batch_bodies: Vec<(Option<String>, Value)>,
}

type Shared = Arc<Mutex<Fake>>;

fn current(f: &Fake) -> &'static str {
    f.script
        .get(f.polls.saturating_sub(1))
        .or(f.script.last())
        .copied()
        .unwrap_or("ACTIVE")
}

fn fault(status: StatusCode, msg: String) -> Response {
    (
        status,
        [("x-openstack-request-id", "req-fake")],
        axum::Json(json!({"faultcode": "Client", "faultstring": msg, "debuginfo": null})),
    )
        .into_response()
}

async fn get_lb(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let mut f = s.lock().expect("lock");
    f.polls += 1;
    let st = current(&f);
    if st == "GONE" {
        return fault(StatusCode::NOT_FOUND, format!("Load Balancer {id} not found."));
    }
    axum::Json(
        json!({"loadbalancer": {"id": id, "name": "lb", "provisioning_status": st,
        "operating_status": "OFFLINE", "listeners": [], "pools": [], "tags": []}}),
    )
    .into_response()
}

async fn put_lb(
    State(s): State<Shared>,
    Path(id): Path<String>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let mut f = s.lock().expect("lock");
    let st = current(&f);
    if st.starts_with("PENDING_") {
        f.refused_puts += 1;
        return fault(
            StatusCode::CONFLICT,
            format!("Invalid state {st} of loadbalancer resource {id}"),
        );
    }
    f.puts.push(body.clone());
    let name = body.pointer("/loadbalancer/name").cloned().unwrap_or(Value::Null);
    axum::Json(json!({"loadbalancer": {"id": id, "name": name, "provisioning_status": "PENDING_UPDATE"}}))
        .into_response()
}

async fn batch(
    State(s): State<Shared>,
    Path(pool): Path<String>,
    q: axum::extract::RawQuery,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let mut f = s.lock().expect("lock");
    if f.batch_bodies.is_empty() {
        f.batch_bodies.push((Some("refused".into()), body));
        return fault(
            StatusCode::CONFLICT,
            format!("Pool {pool} is immutable and cannot be updated."),
        );
    }
    f.batch_bodies.push((q.0, body));
    StatusCode::ACCEPTED.into_response()
}

async fn serve(script: Vec<&'static str>) -> (OctaviaClient, Shared) {
    let (state, addr) = spawn(script).await;
    let client = OctaviaClient::new(&ClientOptions::noauth(format!("http://{addr}")))
        .expect("client")
        .with_wait_options(WaitOptions {
            initial_interval: Duration::from_millis(2),
            max_interval: Duration::from_millis(10),
            timeout: Duration::from_secs(5),
        });
    (client, state)
}

/// The scripted server on a free port.
async fn spawn(script: Vec<&'static str>) -> (Shared, std::net::SocketAddr) {
    let state: Shared = Arc::new(Mutex::new(Fake {
        script,
        ..Fake::default()
    }));
    let app = Router::new()
        .route("/v2/lbaas/loadbalancers/{id}", get(get_lb).put(put_lb))
        .route("/v2/lbaas/pools/{id}/members", axum::routing::put(batch))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (state, addr)
}

#[tokio::test]
async fn wait_reaches_active_after_pending() {
    let (c, s) = serve(vec!["PENDING_CREATE", "PENDING_CREATE", "ACTIVE"]).await;
    let lb = c
        .wait_for_provisioning(LB, Provisioning::Active)
        .await
        .expect("active");
    assert_eq!(lb.map(|l| l.provisioning_status).as_deref(), Some("ACTIVE"));
    assert_eq!(s.lock().expect("lock").polls, 3);
}

#[tokio::test]
async fn wait_error_is_typed() {
    let (c, _) = serve(vec!["PENDING_UPDATE", "ERROR"]).await;
    let e = c
        .wait_for_provisioning(LB, Provisioning::Active)
        .await
        .expect_err("ERROR");
    assert!(
        matches!(&e, OctaviaError::ProvisioningFailed { lb_id, .. } if lb_id == LB),
        "{e:?}"
    );
    assert!(!e.is_transient());
}

#[tokio::test]
async fn wait_for_delete_ends_on_404_and_times_out_otherwise() {
    let (c, _) = serve(vec!["PENDING_DELETE", "GONE"]).await;
    assert!(
        c.wait_for_provisioning(LB, Provisioning::Deleted)
            .await
            .expect("gone")
            .is_none()
    );
    let (c, _) = serve(vec!["PENDING_DELETE"]).await;
    let c = c.with_wait_options(WaitOptions {
        initial_interval: Duration::from_millis(2),
        max_interval: Duration::from_millis(5),
        timeout: Duration::from_millis(60),
    });
    let e = c
        .wait_for_provisioning(LB, Provisioning::Deleted)
        .await
        .expect_err("never gone");
    assert!(
        matches!(&e, OctaviaError::WaitTimeout { last_status, .. } if last_status == "PENDING_DELETE"),
        "{e:?}"
    );
}

#[tokio::test]
async fn write_refused_409_while_pending_waits_and_resends() {
    // GET 1 (the first PUT sees it) is PENDING_UPDATE; the wait polls until ACTIVE; the resend succeeds.
    let (c, s) = serve(vec!["PENDING_UPDATE", "PENDING_UPDATE", "ACTIVE"]).await;
    s.lock().expect("lock").polls = 1;
    let lb = c
        .update_load_balancer(
            LB,
            &ResourceUpdate {
                name: Some("renamed".into()),
                ..ResourceUpdate::default()
            },
        )
        .await
        .expect("update after the wait");
    assert_eq!(lb.name, "renamed");
    let f = s.lock().expect("lock");
    assert_eq!(f.refused_puts, 1);
    assert_eq!(f.puts, vec![json!({"loadbalancer": {"name": "renamed"}})]);
}

#[tokio::test]
async fn without_busy_retry_a_409_while_pending_is_returned_at_once() {
    let (c, s) = serve(vec!["PENDING_UPDATE"]).await;
    s.lock().expect("lock").polls = 1;
    let c = c.without_busy_retry();
    let e = c
        .update_load_balancer(LB, &ResourceUpdate::default())
        .await
        .expect_err("pending");
    assert!(e.is_immutable(), "{e:?}");
    let f = s.lock().expect("lock");
    assert_eq!((f.refused_puts, f.polls), (1, 1), "no wait, no resend");
}

#[tokio::test]
async fn write_409_gives_up_at_the_timeout_with_the_409() {
    let (c, _) = serve(vec!["PENDING_UPDATE"]).await;
    let c = c.with_wait_options(WaitOptions {
        initial_interval: Duration::from_millis(2),
        max_interval: Duration::from_millis(5),
        timeout: Duration::from_millis(50),
    });
    let e = c
        .update_load_balancer(LB, &ResourceUpdate::default())
        .await
        .expect_err("stays pending");
    // Either the wait's timeout or the final 409 - both say "still busy", neither is a success.
    assert!(
        e.is_immutable() || matches!(e, OctaviaError::WaitTimeout { .. }),
        "{e:?}"
    );
}

#[tokio::test]
async fn batch_member_update_resends_after_immutable_pool_and_sends_additive_only() {
    let (c, s) = serve(vec!["ACTIVE"]).await;
    let members = vec![
        MemberCreate::new("10.0.0.5", 8080),
        MemberCreate {
            weight: Some(5),
            ..MemberCreate::new("10.0.0.6", 8080)
        },
    ];
    c.batch_update_members("pool-1", &members, true)
        .await
        .expect("batch");
    let f = s.lock().expect("lock");
    assert_eq!(f.batch_bodies.len(), 2, "one refused, one accepted");
    let (q, body) = &f.batch_bodies[1];
    assert_eq!(q.as_deref(), Some("additive_only=true"));
    assert_eq!(
        body,
        &json!({"members": [
            {"address": "10.0.0.5", "protocol_port": 8080},
            {"address": "10.0.0.6", "protocol_port": 8080, "weight": 5}
        ]})
    );
}

#[test]
fn decisions() {
    use Provisioning::*;
    assert_eq!(decide(Active, Some("ACTIVE")), Decision::Done);
    assert_eq!(decide(Active, Some("PENDING_UPDATE")), Decision::Wait);
    assert_eq!(decide(Active, Some("ERROR")), Decision::Failed);
    assert_eq!(decide(Active, None), Decision::Failed);
    assert_eq!(decide(Deleted, None), Decision::Done);
    assert_eq!(decide(Deleted, Some("DELETED")), Decision::Done);
    assert_eq!(decide(Deleted, Some("PENDING_DELETE")), Decision::Wait);
    assert_eq!(decide(Deleted, Some("ERROR")), Decision::Failed);
}

#[test]
fn poll_interval_doubles_is_capped_and_never_zero() {
    let w = WaitOptions {
        initial_interval: Duration::from_millis(100),
        max_interval: Duration::from_millis(1000),
        timeout: Duration::from_secs(1),
    };
    for n in 1..30 {
        let cap = Duration::from_millis(100)
            .saturating_mul(1 << (n - 1).min(16))
            .min(Duration::from_millis(1000));
        let d = w.interval(n);
        assert!(
            d >= cap / 2 && d <= cap,
            "poll {n}: {d:?} not in [{:?}, {cap:?}]",
            cap / 2
        );
    }
}

#[test]
fn fully_populated_create_body() {
    let req = LoadBalancerCreate {
        name: Some("svc".into()),
        vip_subnet_id: Some("sub".into()),
        tags: vec!["kuryr".into()],
        listeners: vec![ListenerCreate {
            default_pool: Some(Box::new(PoolCreate {
                members: vec![MemberCreate::new("10.0.0.5", 8080)],
                healthmonitor: Some(HealthMonitorCreate {
                    monitor_type: "TCP".into(),
                    delay: 5,
                    timeout: 3,
                    max_retries: 3,
                    ..HealthMonitorCreate::default()
                }),
                ..PoolCreate::new("TCP", "ROUND_ROBIN")
            })),
            ..ListenerCreate::new("TCP", 80)
        }],
        ..LoadBalancerCreate::default()
    };
    assert_eq!(
        serde_json::to_value(&req).expect("json"),
        json!({"name": "svc", "vip_subnet_id": "sub", "tags": ["kuryr"], "listeners": [{
            "protocol": "TCP", "protocol_port": 80, "default_pool": {
                "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN",
                "members": [{"address": "10.0.0.5", "protocol_port": 8080}],
                "healthmonitor": {"type": "TCP", "delay": 5, "timeout": 3, "max_retries": 3}}}]})
    );
}

#[test]
fn null_strings_and_lists_read_as_empty() {
    let lb: LoadBalancer = serde_json::from_value(json!({
        "id": "x", "name": null, "description": null, "provisioning_status": "ACTIVE", "tags": null,
        "listeners": null, "admin_state_up": null, "vip_address": null
    }))
    .expect("lenient");
    assert_eq!(lb.name, "");
    assert!(lb.tags.is_empty() && lb.listeners.is_empty() && !lb.admin_state_up);
    assert_eq!(lb.vip_address, None);
}

#[tokio::test]
async fn metrics_hook_sees_octavia_error_kinds_and_request_ids_reach_errors() {
    let (_, addr) = spawn(vec!["GONE"]).await;
    type Seen = Vec<(String, Option<String>, crate::Outcome)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let s2 = seen.clone();
    let c = OctaviaClient::with_metrics(
        &ClientOptions::noauth(format!("http://{addr}")),
        Arc::new(move |r: &crate::CallRecord<'_>| {
            if let Ok(mut v) = s2.lock() {
                v.push((r.operation.to_owned(), r.error_type.map(str::to_owned), r.outcome));
            }
        }),
    )
    .expect("client");
    let e = c.get_load_balancer(LB).await.expect_err("404");
    assert_eq!(e.kind(), Some(&OctaviaErrorKind::NotFound));
    assert_eq!(e.request_id(), Some("req-fake"));
    let seen = seen.lock().expect("lock");
    assert_eq!(
        *seen,
        vec![(
            "get_load_balancer".to_owned(),
            Some("NotFound".to_owned()),
            crate::Outcome::ApiError
        )]
    );
}
