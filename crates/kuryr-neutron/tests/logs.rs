//! What a failed call leaves in the logs: Neutron's `x-openstack-request-id` at warn level, and never the token (nor
//! the password), even with every target - reqwest, hyper, rustls through the `log` bridge - at trace level.
//!
//! One test in this binary: it installs the global subscriber. The stand-in Keystone + Neutron runs on its own thread
//! with logging switched off there, so that only the client's log lines are inspected.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kuryr_neutron::{AuthOptions, AuthType, ClientOptions, ListFilter, NeutronClient, PortCreate, Secret};
use serde_json::json;

const TOKEN: &str = "gAAAAAB-test-token-must-never-be-logged-3f9c";
const PASSWORD: &str = "pw-must-never-be-logged-81ab";
const APP_SECRET: &str = "appcred-secret-must-never-be-logged-77d1";

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Buffer {
    fn text(&self) -> String {
        self.0
            .lock()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn neutron_error(status: StatusCode, request_id: &'static str, error_type: &str) -> Response {
    (
        status,
        [("x-openstack-request-id", request_id)],
        axum::Json(json!({"NeutronError": {"type": error_type, "message": "injected", "detail": ""}})),
    )
        .into_response()
}

async fn issue_token(State(base): State<String>) -> Response {
    let expires_at = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let catalog = json!([{"type": "network", "endpoints": [
        {"interface": "public", "region_id": "RegionOne", "url": format!("{base}/network")}]}]);
    (
        StatusCode::CREATED,
        [("x-subject-token", TOKEN)],
        axum::Json(json!({"token": {"expires_at": expires_at, "catalog": catalog}})),
    )
        .into_response()
}

/// Starts the stand-in on a thread whose logs go nowhere (the server sees the token; its logs are not under test).
fn start_server() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _quiet = tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let base = format!("http://{}", listener.local_addr().expect("addr"));
            let app = Router::new()
                .route("/identity/v3/auth/tokens", post(issue_token))
                .route(
                    "/network/v2.0/networks",
                    get(|| async {
                        neutron_error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "req-logs-list-500",
                            "HTTPInternalServerError",
                        )
                    }),
                )
                .route(
                    "/network/v2.0/ports",
                    post(|| async {
                        neutron_error(
                            StatusCode::CONFLICT,
                            "req-logs-create-409",
                            "IpAddressGenerationFailure",
                        )
                    }),
                )
                .route(
                    "/network/v2.0/ports/{id}",
                    get(|| async {
                        neutron_error(StatusCode::NOT_FOUND, "req-logs-get-404", "PortNotFound")
                    }),
                )
                .with_state(base.clone());
            tx.send(base).expect("send url");
            axum::serve(listener, app).await.expect("serve");
        });
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("server url")
}

#[tokio::test]
async fn failed_calls_log_the_request_id_at_warn_and_never_the_token() {
    let buf = Buffer::default();
    let writer = buf.clone();
    tracing_subscriber::fmt()
        .with_env_filter("trace")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .try_init()
        .expect("global subscriber (with the log bridge for reqwest/rustls)");

    let base = start_server();
    let options = ClientOptions {
        auth: AuthOptions {
            auth_type: AuthType::Password,
            auth_url: Some(format!("{base}/identity/v3")),
            username: Some("kuryr".into()),
            password: Some(Secret::new(PASSWORD)),
            user_domain_name: Some("Default".into()),
            project_name: Some("k8s".into()),
            project_domain_name: Some("Default".into()),
            ..AuthOptions::default()
        },
        max_attempts: 2,
        retry_base_delay: Duration::from_millis(5),
        retry_max_delay: Duration::from_millis(10),
        ..ClientOptions::default()
    };
    // Options and credentials logged whole (Debug) must redact the secrets.
    tracing::trace!(?options, "password client options");
    let client = NeutronClient::new(&options).expect("client");

    // A 500 on an idempotent GET: retried once, then failed.
    let e = client.list_networks(&ListFilter::new()).await.expect_err("500");
    assert_eq!(e.request_id(), Some("req-logs-list-500"));
    // A 409 on a POST: not retried, failed.
    let e = client
        .create_port(&PortCreate::new("net"))
        .await
        .expect_err("409");
    assert_eq!(e.request_id(), Some("req-logs-create-409"));
    // A 404 is an answer callers act on ("already gone"), not worth a warning.
    let e = client.get_port("gone").await.expect_err("404");
    assert!(e.is_not_found());

    // Application credentials: the secret goes to Keystone only.
    let app_options = ClientOptions {
        auth: AuthOptions {
            auth_type: AuthType::ApplicationCredential,
            auth_url: Some(format!("{base}/identity/v3")),
            application_credential_id: Some("appcred-id".into()),
            application_credential_secret: Some(Secret::new(APP_SECRET)),
            ..AuthOptions::default()
        },
        max_attempts: 1,
        ..ClientOptions::default()
    };
    tracing::trace!(?app_options, "application credential client options");
    let app_client = NeutronClient::new(&app_options).expect("client");
    let e = app_client.get_port("gone").await.expect_err("404");
    assert!(e.is_not_found());

    let logs = buf.text();
    let warn_lines: Vec<&str> = logs.lines().filter(|l| l.contains(" WARN ")).collect();
    for rid in ["req-logs-list-500", "req-logs-create-409"] {
        assert!(
            warn_lines.iter().any(|l| l.contains(rid)),
            "no WARN line with {rid}:\n{logs}"
        );
    }
    assert!(
        !warn_lines.iter().any(|l| l.contains("req-logs-get-404")),
        "a 404 was logged as a warning:\n{logs}"
    );
    assert!(
        logs.lines()
            .any(|l| l.contains(" INFO ") && l.contains("retrying") && l.contains("req-logs-list-500")),
        "the retry is not logged with its request id:\n{logs}"
    );
    // The check below means something only if the HTTP stack did log at trace/debug level.
    assert!(
        logs.lines()
            .any(|l| (l.contains(" TRACE ") || l.contains(" DEBUG "))
                && (l.contains("reqwest") || l.contains("hyper"))),
        "no reqwest/hyper log lines captured:\n{logs}"
    );
    assert!(!logs.contains(TOKEN), "the token is in the logs:\n{logs}");
    assert!(!logs.contains(PASSWORD), "the password is in the logs:\n{logs}");
    assert!(logs.contains("application credential client options"), "{logs}");
    assert!(
        !logs.contains(APP_SECRET),
        "the application credential secret is in the logs:\n{logs}"
    );
}
