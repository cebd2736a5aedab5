//! Keystone v3 auth against a small in-test Keystone (no keystone server exists in this environment). The same axum
//! app also answers a couple of Neutron paths so that token use, catalog selection and 401 re-auth are observable.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kuryr_neutron::{
    AuthOptions, AuthType, ClientOptions, ErrorKind, Interface, ListFilter, NeutronClient, Outcome, Secret,
};
use serde_json::{Value, json};

#[derive(Default)]
struct Fake {
    /// Bodies of POST /v3/auth/tokens.
    auth_bodies: Vec<Value>,
    /// X-Auth-Token values seen by the Neutron routes, per route.
    neutron_tokens: Vec<(String, String)>,
    /// Tokens the Neutron side rejects with 401.
    revoked: Vec<String>,
    issued: u32,
    expires_in_secs: i64,
}

type Shared = Arc<Mutex<Fake>>;

async fn issue_token(State(s): State<(Shared, String)>, Json(body): Json<Value>) -> Response {
    let (fake, base) = s;
    let (token, expires_in) = {
        let Ok(mut f) = fake.lock() else {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        };
        f.auth_bodies.push(body.clone());
        f.issued += 1;
        (format!("tok-{}", f.issued), f.expires_in_secs)
    };
    let pw_ok = body.pointer("/auth/identity/password/user/password") == Some(&json!("s3cret"));
    let ac_ok = body.pointer("/auth/identity/application_credential/secret") == Some(&json!("acsecret"));
    if !pw_ok && !ac_ok {
        return (StatusCode::UNAUTHORIZED, Json(json!({"error": {"code": 401, "message": "The request you have made requires authentication."}}))).into_response();
    }
    let expires_at = (chrono::Utc::now() + chrono::Duration::seconds(expires_in)).to_rfc3339();
    let catalog = json!([
        {"type": "identity", "name": "keystone", "endpoints": [
            {"interface": "public", "region": "RegionOne", "region_id": "RegionOne", "url": format!("{base}/identity")}]},
        {"type": "network", "name": "neutron", "endpoints": [
            {"interface": "public", "region": "RegionOne", "region_id": "RegionOne", "url": format!("{base}/r1-public")},
            {"interface": "internal", "region": "RegionOne", "region_id": "RegionOne", "url": format!("{base}/r1-internal")},
            {"interface": "internal", "region": "RegionTwo", "region_id": "RegionTwo", "url": format!("{base}/r2-internal")},
            {"interface": "admin", "region": "RegionTwo", "region_id": "RegionTwo", "url": format!("{base}/r2-admin")}]}
    ]);
    let mut headers = HeaderMap::new();
    if let Ok(v) = token.parse() {
        headers.insert("x-subject-token", v);
    }
    (
        StatusCode::CREATED,
        headers,
        Json(json!({"token": {"expires_at": expires_at, "catalog": catalog, "methods": ["password"]}})),
    )
        .into_response()
}

fn neutron_route(
    route: &'static str,
) -> impl Fn(State<(Shared, String)>, HeaderMap) -> std::future::Ready<Response> + Clone {
    move |State((fake, _)): State<(Shared, String)>, headers: HeaderMap| {
        let token = headers
            .get("x-auth-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let resp = match fake.lock() {
            Ok(mut f) => {
                f.neutron_tokens.push((route.to_owned(), token.clone()));
                if token.is_empty() || f.revoked.contains(&token) {
                    (
                        StatusCode::UNAUTHORIZED,
                        Json(json!({"NeutronError": {"type": "HTTPUnauthorized", "message": "Authentication required", "detail": ""}})),
                    )
                        .into_response()
                } else {
                    let mut h = HeaderMap::new();
                    h.insert(
                        "x-openstack-request-id",
                        axum::http::HeaderValue::from_static("req-fake-1"),
                    );
                    (h, Json(json!({"networks": [{"id": route, "name": route}]}))).into_response()
                }
            }
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        };
        std::future::ready(resp)
    }
}

async fn start(expires_in_secs: i64) -> (Shared, String) {
    let fake: Shared = Arc::new(Mutex::new(Fake {
        expires_in_secs,
        ..Fake::default()
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = Router::new()
        .route("/identity/v3/auth/tokens", post(issue_token))
        .route("/r1-public/v2.0/networks", get(neutron_route("r1-public")))
        .route("/r1-internal/v2.0/networks", get(neutron_route("r1-internal")))
        .route("/r2-internal/v2.0/networks", get(neutron_route("r2-internal")))
        .route("/r2-admin/v2.0/networks", get(neutron_route("r2-admin")))
        .with_state((fake.clone(), base.clone()));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (fake, base)
}

fn password_opts(base: &str) -> ClientOptions {
    ClientOptions {
        auth: AuthOptions {
            auth_type: AuthType::Password,
            auth_url: Some(format!("{base}/identity/v3")),
            username: Some("kuryr".into()),
            password: Some(Secret::new("s3cret")),
            user_domain_name: Some("Default".into()),
            project_name: Some("k8s".into()),
            project_domain_name: Some("Default".into()),
            ..AuthOptions::default()
        },
        max_attempts: 1,
        ..ClientOptions::default()
    }
}

fn lock(f: &Shared) -> std::sync::MutexGuard<'_, Fake> {
    f.lock().expect("fake state")
}

#[tokio::test]
async fn password_auth_body_catalog_selection_and_token_cache() {
    let (fake, base) = start(3600).await;
    let mut opts = password_opts(&base);
    opts.region_name = Some("RegionOne".into());
    opts.interface = Interface::Internal;
    let client = NeutronClient::new(&opts).expect("client");
    let nets = client.list_networks(&ListFilter::new()).await.expect("list");
    assert_eq!(nets[0].id, "r1-internal", "region RegionOne + internal interface");
    client
        .list_networks(&ListFilter::new())
        .await
        .expect("second list");
    let f = lock(&fake);
    assert_eq!(f.issued, 1, "token is cached between calls");
    assert_eq!(
        f.auth_bodies[0],
        json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": "kuryr", "domain": {"name": "Default"}, "password": "s3cret"}}},
            "scope": {"project": {"name": "k8s", "domain": {"name": "Default"}}}
        }})
    );
    assert!(
        f.neutron_tokens
            .iter()
            .all(|(r, t)| r == "r1-internal" && t == "tok-1")
    );
    // Debug output of the client and options never contains secrets.
    let dbg = format!("{client:?} {opts:?}");
    assert!(!dbg.contains("s3cret") && !dbg.contains("tok-1"), "{dbg}");
}

#[tokio::test]
async fn application_credential_body_and_other_region() {
    let (fake, base) = start(3600).await;
    let opts = ClientOptions {
        auth: AuthOptions {
            auth_type: AuthType::ApplicationCredential,
            auth_url: Some(format!("{base}/identity")), // without /v3: the client appends it
            application_credential_id: Some("ac-id".into()),
            application_credential_secret: Some(Secret::new("acsecret")),
            ..AuthOptions::default()
        },
        region_name: Some("RegionTwo".into()),
        interface: Interface::Admin,
        max_attempts: 1,
        ..ClientOptions::default()
    };
    let client = NeutronClient::new(&opts).expect("client");
    let nets = client.list_networks(&ListFilter::new()).await.expect("list");
    assert_eq!(nets[0].id, "r2-admin");
    let f = lock(&fake);
    assert_eq!(
        f.auth_bodies[0],
        json!({"auth": {"identity": {"methods": ["application_credential"],
            "application_credential": {"id": "ac-id", "secret": "acsecret"}}}})
    );
}

#[tokio::test]
async fn missing_catalog_endpoint_is_a_clear_error() {
    let (_fake, base) = start(3600).await;
    let mut opts = password_opts(&base);
    opts.region_name = Some("RegionOne".into());
    opts.interface = Interface::Admin;
    let client = NeutronClient::new(&opts).expect("client");
    let err = client
        .list_networks(&ListFilter::new())
        .await
        .expect_err("no admin endpoint in RegionOne");
    let msg = err.to_string();
    assert!(
        msg.contains("network") && msg.contains("admin") && msg.contains("RegionOne"),
        "{msg}"
    );
}

#[tokio::test]
async fn wrong_password_is_rejected_without_retry_loop() {
    let (fake, base) = start(3600).await;
    let mut opts = password_opts(&base);
    opts.auth.password = Some(Secret::new("wrong"));
    opts.max_attempts = 3;
    let client = NeutronClient::new(&opts).expect("client");
    let err = client
        .list_networks(&ListFilter::new())
        .await
        .expect_err("rejected");
    assert!(err.to_string().contains("401"), "{err}");
    assert!(!err.to_string().contains("wrong"), "secret leaked: {err}");
    assert_eq!(lock(&fake).issued, 1, "a rejected password is not retried");
}

#[tokio::test]
async fn unauthorized_triggers_one_reauth_and_resend() {
    let (fake, base) = start(3600).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let metrics = Arc::new(move |c: &kuryr_neutron::CallRecord<'_>| {
        if let Ok(mut s) = seen2.lock() {
            s.push((c.operation.to_owned(), c.outcome, c.status, c.attempts));
        }
    });
    let client = NeutronClient::with_metrics(&password_opts(&base), metrics).expect("client");
    client.list_networks(&ListFilter::new()).await.expect("first");
    // Keystone revokes tok-1: Neutron answers 401, the client must get tok-2 and resend.
    lock(&fake).revoked.push("tok-1".into());
    let nets = client
        .list_networks(&ListFilter::new())
        .await
        .expect("after re-auth");
    assert_eq!(nets[0].id, "r1-public");
    {
        let f = lock(&fake);
        assert_eq!(f.issued, 2);
        let tokens: Vec<&str> = f.neutron_tokens.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(tokens, vec!["tok-1", "tok-1", "tok-2"]);
    }
    // When the new token is rejected too, the 401 is returned (one re-auth per call, no loop).
    {
        let mut f = lock(&fake);
        f.revoked.push("tok-2".into());
        f.revoked.push("tok-3".into());
    }
    let err = client
        .list_networks(&ListFilter::new())
        .await
        .expect_err("still 401");
    assert_eq!(err.kind(), Some(&ErrorKind::Unauthorized));
    assert_eq!(err.status(), Some(401));
    assert_eq!(lock(&fake).issued, 3);
    let s = seen.lock().expect("metrics");
    assert_eq!(s.len(), 3);
    assert_eq!(s[0], ("list_networks".to_owned(), Outcome::Success, Some(200), 1));
    assert_eq!(s[2].1, Outcome::ApiError);
}

#[tokio::test]
async fn token_near_expiry_is_renewed() {
    // A 2 s token is refreshed at half-life, so the second call after 1.2 s re-authenticates.
    let (fake, base) = start(2).await;
    let client = NeutronClient::new(&password_opts(&base)).expect("client");
    client.list_networks(&ListFilter::new()).await.expect("first");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    client.list_networks(&ListFilter::new()).await.expect("second");
    assert_eq!(lock(&fake).issued, 2);
}

#[tokio::test]
async fn endpoint_override_wins_over_catalog() {
    let (fake, base) = start(3600).await;
    let mut opts = password_opts(&base);
    opts.endpoint_override = Some(format!("{base}/r2-internal"));
    let client = NeutronClient::new(&opts).expect("client");
    let nets = client.list_networks(&ListFilter::new()).await.expect("list");
    assert_eq!(nets[0].id, "r2-internal");
    assert_eq!(lock(&fake).neutron_tokens[0].1, "tok-1");
}

#[tokio::test]
async fn noauth_needs_endpoint_and_sends_no_token() {
    let (fake, base) = start(3600).await;
    let mut opts = ClientOptions::noauth(format!("{base}/r1-public"));
    opts.max_attempts = 1;
    let err = NeutronClient::new(&ClientOptions {
        endpoint_override: None,
        ..opts.clone()
    })
    .expect_err("noauth without endpoint");
    assert!(err.to_string().contains("endpoint_override"), "{err}");
    let client = NeutronClient::new(&opts).expect("client");
    let err = client
        .list_networks(&ListFilter::new())
        .await
        .expect_err("fake wants a token");
    assert_eq!(err.status(), Some(401));
    let f = lock(&fake);
    assert_eq!(f.issued, 0);
    assert_eq!(f.neutron_tokens, vec![("r1-public".to_owned(), String::new())]);
}
