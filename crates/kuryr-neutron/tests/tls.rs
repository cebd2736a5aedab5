//! `cafile` and `insecure` against a real TLS server: a Keystone + Neutron stand-in served over HTTPS with a
//! certificate signed by a CA generated for the test. The client uses one HTTP client (one TLS configuration) for
//! Keystone and for the Neutron endpoint found in the catalog, and for a `noauth` `endpoint_override`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kuryr_neutron::{AuthOptions, AuthType, ClientOptions, Error, ListFilter, NeutronClient, Secret};
use serde_json::json;

struct Server {
    /// `https://127.0.0.1:<port>`
    url: String,
    ca_pem: String,
    keystone_hits: Arc<AtomicU32>,
    neutron_hits: Arc<AtomicU32>,
    handle: axum_server::Handle<std::net::SocketAddr>,
}

#[derive(Clone)]
struct AppState {
    url: String,
    keystone_hits: Arc<AtomicU32>,
    neutron_hits: Arc<AtomicU32>,
}

/// (CA PEM, server certificate PEM, server key PEM) for localhost / 127.0.0.1.
fn certificates() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kuryr-neutron test CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA");
    let key = rcgen::KeyPair::generate().expect("server key");
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "openstack.test");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &ca).expect("server certificate");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

async fn issue_token(State(s): State<AppState>) -> Response {
    s.keystone_hits.fetch_add(1, Ordering::SeqCst);
    let catalog = json!([{"type": "network", "endpoints": [
        {"interface": "public", "region_id": "RegionOne", "url": format!("{}/network", s.url)}]}]);
    let expires_at = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    (
        StatusCode::CREATED,
        [("x-subject-token", "tls-token")],
        axum::Json(json!({"token": {"expires_at": expires_at, "catalog": catalog}})),
    )
        .into_response()
}

async fn networks(State(s): State<AppState>, headers: HeaderMap) -> Response {
    s.neutron_hits.fetch_add(1, Ordering::SeqCst);
    let token = headers.get("x-auth-token").and_then(|v| v.to_str().ok());
    if token.is_some_and(|t| t != "tls-token") {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    axum::Json(json!({"networks": []})).into_response()
}

async fn start() -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (ca_pem, cert_pem, key_pem) = certificates();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let url = format!("https://127.0.0.1:{}", addr.port());
    let state = AppState {
        url: url.clone(),
        keystone_hits: Arc::default(),
        neutron_hits: Arc::default(),
    };
    let app = Router::new()
        .route("/identity/v3/auth/tokens", post(issue_token))
        .route("/network/v2.0/networks", get(networks))
        .with_state(state.clone());
    let config = axum_server::tls_rustls::RustlsConfig::from_pem(cert_pem.into_bytes(), key_pem.into_bytes())
        .await
        .expect("TLS config");
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(listener, config).expect("server");
    let h = handle.clone();
    tokio::spawn(async move { server.handle(h).serve(app.into_make_service()).await });
    Server {
        url,
        ca_pem,
        keystone_hits: state.keystone_hits,
        neutron_hits: state.neutron_hits,
        handle,
    }
}

/// Password auth at the server's Keystone; Neutron comes from the catalog (the same HTTPS server).
fn keystone_options(s: &Server, cafile: Option<&Path>, insecure: bool) -> ClientOptions {
    ClientOptions {
        auth: AuthOptions {
            auth_type: AuthType::Password,
            auth_url: Some(format!("{}/identity/v3", s.url)),
            username: Some("kuryr".into()),
            password: Some(Secret::new("pw")),
            user_domain_name: Some("Default".into()),
            project_name: Some("k8s".into()),
            project_domain_name: Some("Default".into()),
            ..AuthOptions::default()
        },
        cafile: cafile.map(Path::to_path_buf),
        insecure,
        max_attempts: 1,
        ..ClientOptions::default()
    }
}

fn noauth_options(s: &Server, cafile: Option<&Path>, insecure: bool) -> ClientOptions {
    ClientOptions {
        cafile: cafile.map(Path::to_path_buf),
        insecure,
        max_attempts: 1,
        ..ClientOptions::noauth(format!("{}/network", s.url))
    }
}

fn assert_certificate_error(e: &Error) {
    let msg = e.to_string();
    // The cause is in the message (not only in the source chain), with the options that fix it.
    assert!(msg.contains("certificate"), "{msg}");
    assert!(msg.contains("cafile") && msg.contains("insecure"), "{msg}");
}

#[tokio::test]
async fn cafile_and_insecure_against_a_tls_keystone_and_neutron() {
    let s = start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &s.ca_pem).expect("write CA");

    // With the CA file: Keystone and the catalog's Neutron endpoint are both reached over verified TLS.
    let c = NeutronClient::new(&keystone_options(&s, Some(&ca), false)).expect("client");
    let nets = c.list_networks(&ListFilter::new()).await.expect("verified TLS");
    assert!(nets.is_empty());
    assert_eq!(s.keystone_hits.load(Ordering::SeqCst), 1);
    assert_eq!(s.neutron_hits.load(Ordering::SeqCst), 1);

    // Without it the server's certificate is not trusted: Keystone is never reached, and the error says why.
    let c = NeutronClient::new(&keystone_options(&s, None, false)).expect("client");
    let e = c
        .list_networks(&ListFilter::new())
        .await
        .expect_err("untrusted CA");
    assert!(matches!(e, Error::Auth(_)), "{e:?}");
    assert_certificate_error(&e);
    assert_eq!(s.keystone_hits.load(Ordering::SeqCst), 1);

    // insecure = True: no verification, both endpoints work.
    let c = NeutronClient::new(&keystone_options(&s, None, true)).expect("client");
    c.list_networks(&ListFilter::new()).await.expect("insecure");
    assert_eq!(s.keystone_hits.load(Ordering::SeqCst), 2);
    assert_eq!(s.neutron_hits.load(Ordering::SeqCst), 2);

    // A CA file that did not sign the server's certificate does not help.
    let other = dir.path().join("other-ca.pem");
    std::fs::write(&other, certificates().0).expect("write other CA");
    let c = NeutronClient::new(&keystone_options(&s, Some(&other), false)).expect("client");
    let e = c.list_networks(&ListFilter::new()).await.expect_err("wrong CA");
    assert_certificate_error(&e);

    // noauth with an https endpoint_override: the same rules for the Neutron endpoint itself.
    let c = NeutronClient::new(&noauth_options(&s, Some(&ca), false)).expect("client");
    c.list_networks(&ListFilter::new()).await.expect("verified TLS");
    assert_eq!(s.neutron_hits.load(Ordering::SeqCst), 3);
    let c = NeutronClient::new(&noauth_options(&s, None, false)).expect("client");
    let e = c
        .list_networks(&ListFilter::new())
        .await
        .expect_err("untrusted CA");
    assert!(
        matches!(
            e,
            Error::Connection {
                operation: "list_networks",
                ..
            }
        ),
        "{e:?}"
    );
    assert_certificate_error(&e);
    let c = NeutronClient::new(&noauth_options(&s, None, true)).expect("client");
    c.list_networks(&ListFilter::new()).await.expect("insecure");
    assert_eq!(s.neutron_hits.load(Ordering::SeqCst), 4);

    s.handle.shutdown();
}

/// A server that asks for a client certificate signed by its CA (keystoneauth's `certfile` and
/// `keyfile`): served with them, in two files or in one, refused without.
#[tokio::test]
async fn certfile_and_keyfile_answer_a_server_that_asks_for_a_client_certificate() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    // One CA signs the server's certificate and the client's.
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA");
    let signed = |names: Vec<String>, usage: rcgen::ExtendedKeyUsagePurpose| {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(names).expect("params");
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &ca).expect("certificate");
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = signed(
        vec!["localhost".into(), "127.0.0.1".into()],
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = signed(vec!["kuryr".into()], rcgen::ExtendedKeyUsagePurpose::ClientAuth);

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).expect("CA DER"))
        .expect("root");
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .expect("client verifier");
    let mut server = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(server_cert.as_bytes()).expect("server DER")],
            PrivateKeyDer::from_pem_slice(server_key.as_bytes()).expect("server key DER"),
        )
        .expect("server config");
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().expect("addr").port()
    );
    let hits = Arc::new(AtomicU32::new(0));
    let state = AppState {
        url: url.clone(),
        keystone_hits: Arc::default(),
        neutron_hits: hits.clone(),
    };
    let app = Router::new()
        .route("/network/v2.0/networks", get(networks))
        .with_state(state);
    let config = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(server));
    let handle = axum_server::Handle::new();
    let serve = axum_server::from_tcp_rustls(listener, config).expect("server");
    let h = handle.clone();
    tokio::spawn(async move { serve.handle(h).serve(app.into_make_service()).await });

    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let ca_file = write("ca.pem", &ca.pem());
    let cert_file = write("client.pem", &client_cert);
    let key_file = write("client.key", &client_key);
    let both = write("client-and-key.pem", &format!("{client_cert}\n{client_key}"));
    let options = |certfile: Option<&Path>, keyfile: Option<&Path>| ClientOptions {
        cafile: Some(ca_file.clone()),
        certfile: certfile.map(Path::to_path_buf),
        keyfile: keyfile.map(Path::to_path_buf),
        max_attempts: 1,
        ..ClientOptions::noauth(format!("{url}/network"))
    };
    let c = NeutronClient::new(&options(Some(&cert_file), Some(&key_file))).expect("client");
    c.list_networks(&ListFilter::new()).await.expect("two files");
    let c = NeutronClient::new(&options(Some(&both), None)).expect("client");
    c.list_networks(&ListFilter::new()).await.expect("one file");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    let c = NeutronClient::new(&options(None, None)).expect("client");
    c.list_networks(&ListFilter::new())
        .await
        .expect_err("no client certificate");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    // A key file that is not one is a configuration error naming the option, at once.
    let bad = write("bad.key", "not a key");
    let e = NeutronClient::new(&options(Some(&cert_file), Some(&bad)))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("certfile"), "{e}");
    handle.shutdown();
}
