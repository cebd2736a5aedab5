//! No secret in any log line of a controller run, every target at TRACE level: the controller
//! reaches the Kubernetes API over TLS with a bearer token and a client key from a kubeconfig
//! (read as `kuryr controller --kubeconfig` reads it), and Neutron through a Keystone password
//! login; it wires a pod, and the captured log holds neither the bearer token, the client key,
//! the Keystone password nor the token Keystone issued.
//!
//! One test in this binary: it installs the global subscriber (with the `log` bridge, so
//! reqwest, hyper and rustls lines are captured too).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_emulator::{KubeEmulator, KubeOptions};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_crds::KuryrPort;
use kuryr_testbed::*;
use serde_json::{Value, json};

const KUBE_TOKEN: &str = "kube-bearer-must-never-be-logged-5e21";
const PASSWORD: &str = "keystone-pw-must-never-be-logged-9c04";
const KEYSTONE_TOKEN: &str = "gAAAAAB-keystone-token-must-never-be-logged-d7e3";
const WAIT: Duration = Duration::from_secs(120);

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

/// A Keystone that accepts only [`PASSWORD`] and lists the Neutron emulator in its catalog.
#[derive(Clone)]
struct Keystone {
    neutron_url: String,
    issued: Arc<AtomicU32>,
}

async fn issue_token(State(k): State<Keystone>, axum::Json(body): axum::Json<Value>) -> Response {
    if body.pointer("/auth/identity/password/user/password") != Some(&json!(PASSWORD)) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    k.issued.fetch_add(1, Ordering::SeqCst);
    let expires_at = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let catalog = json!([{"type": "network", "endpoints": [
        {"interface": "public", "region_id": "RegionOne", "url": k.neutron_url}]}]);
    (
        StatusCode::CREATED,
        [("x-subject-token", KEYSTONE_TOKEN)],
        axum::Json(json!({"token": {"expires_at": expires_at, "catalog": catalog}})),
    )
        .into_response()
}

async fn start_keystone(k: Keystone) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/identity/v3", listener.local_addr()?);
    let app = Router::new()
        .route("/identity/v3/auth/tokens", post(issue_token))
        .with_state(k);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// Non-blank lines of a PEM body at least 40 characters long: any of them in a log is the key.
fn pem_lines(pem: &str) -> Vec<String> {
    pem.lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 40)
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_run_at_trace_level_logs_no_token_key_or_password() -> Result<()> {
    let buf = Buffer::default();
    let writer = buf.clone();
    tracing_subscriber::fmt()
        .with_env_filter("trace")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .try_init()
        .expect("global subscriber (with the log bridge)");

    let targets = neutron_targets().await?;
    let target = targets
        .iter()
        .find(|t| t.emulator().is_some())
        .expect("the Neutron emulator target");
    let fx = neutron_fixture(&target.client, "10.77.0.0/24").await?;
    let keystone = Keystone {
        neutron_url: target.url.clone(),
        issued: Arc::default(),
    };
    let auth_url = start_keystone(keystone.clone()).await?;

    let kube_emu = KubeEmulator::start(KubeOptions {
        tls: true,
        token: Some(KUBE_TOKEN.into()),
        nodes: NODES.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
    .await?;
    let client_cert = rcgen::generate_simple_self_signed(vec!["kuryr-controller".to_string()])?;
    let key_pem = client_cert.signing_key.serialize_pem();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let key_data = b64(&key_pem);
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {
            "server": kube_emu.url(),
            "certificate-authority-data": b64(kube_emu.ca_pem().expect("a TLS emulator's CA")),
        }}],
        "users": [{"name": "kuryr", "user": {
            "token": KUBE_TOKEN,
            "client-certificate-data": b64(&client_cert.cert.pem()),
            "client-key-data": &key_data,
        }}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "kuryr"}}],
        "current-context": "c",
    });
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, kubeconfig.to_string())?;
    let kube_config =
        kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(&path)?, &KubeConfigOptions::default())
            .await?;
    // Logged whole, as a careless caller might: its Debug must redact the credentials.
    tracing::trace!(config = ?kube_config, "Kubernetes client configuration");
    let kube = kube::Client::try_from(kube_config)?;
    apply_crds(&kube).await?;

    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
         [neutron]\nauth_type = password\nauth_url = {auth_url}\nusername = kuryr\npassword = {PASSWORD}\n\
         user_domain_name = Default\nproject_name = k8s\nproject_domain_name = Default\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\n",
        fx.project, fx.subnet, fx.sg
    );
    let cfg = config(&ini);
    tracing::trace!(config = ?cfg, "kuryr.conf");
    let metrics = Metrics::new();
    let deployments = Deployments::from_config(&cfg, &metrics)?;
    let ctrl = start_controller_with(&kube, deployments, metrics, cfg, "secrets");

    create_namespace(&kube, "secrets", json!({})).await?;
    create_pod(&kube, "secrets", "pod-1", NODES[0], json!({})).await?;
    let kps = Api::<KuryrPort>::namespaced(kube.clone(), "secrets");
    eventually("the pod wired", WAIT, || async {
        Ok(kps
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .find_map(|kp| {
                kp.status
                    .as_ref()?
                    .default_vif()
                    .is_some_and(|(_, v)| v.active())
                    .then_some(())
            }))
    })
    .await?;
    ctrl.shutdown().await?;

    let logs = buf.text();
    // The checks below mean something only if the credentials were used and the stacks logged.
    assert!(
        keystone.issued.load(Ordering::SeqCst) >= 1,
        "the controller never logged in to Keystone"
    );
    for stack in ["kube_client", "reqwest", "hyper", "rustls"] {
        assert!(
            logs.lines()
                .any(|l| (l.contains(" TRACE ") || l.contains(" DEBUG ")) && l.contains(stack)),
            "no {stack} log lines captured"
        );
    }
    assert!(logs.contains("Kubernetes client configuration"));
    assert!(logs.contains("kuryr.conf"));
    let mut secrets = vec![
        ("the Kubernetes bearer token", KUBE_TOKEN.to_string()),
        ("the Keystone password", PASSWORD.to_string()),
        ("the Keystone token", KEYSTONE_TOKEN.to_string()),
        // client-key-data as the kubeconfig carries it (past the PEM header every key shares).
        (
            "the client key data",
            key_data[key_data.len() / 2..][..40].to_string(),
        ),
    ];
    secrets.extend(
        pem_lines(&key_pem)
            .into_iter()
            .map(|l| ("a line of the client key", l)),
    );
    assert!(secrets.len() > 4, "the key PEM has no body lines: {key_pem}");
    for (what, secret) in &secrets {
        if let Some(line) = logs.lines().find(|l| l.contains(secret.as_str())) {
            panic!("{what} is in the logs: {line}");
        }
    }
    Ok(())
}
