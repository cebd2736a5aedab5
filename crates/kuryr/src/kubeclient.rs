//! The Kubernetes client of the services, from a kubeconfig or from `[kubernetes]`.
//!
//! Precedence: `--kubeconfig`/`$KUBECONFIG`; then in-cluster service-account settings when running
//! in a pod and `api_root` is left at its default; otherwise `[kubernetes] api_root` with
//! `token_file`, `ssl_ca_crt_file` and the client certificate options, like upstream's client.

use std::path::Path;

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kuryr_config::{KubernetesSection, KuryrConfig};
use tower::limit::ConcurrencyLimitLayer;

use crate::cli::KubeArgs;

pub async fn client(args: &KubeArgs, config: &KuryrConfig) -> anyhow::Result<kube::Client> {
    let cfg = kube_config(args, &config.kubernetes).await?;
    tracing::info!(server = %cfg.cluster_url, "Kubernetes API");
    let limit = config.kubernetes.max_concurrent_requests.get() as usize;
    Ok(kube::client::ClientBuilder::try_from(cfg)
        .context("building the Kubernetes client")?
        .with_layer(&ConcurrencyLimitLayer::new(limit))
        .build())
}

async fn kube_config(args: &KubeArgs, k: &KubernetesSection) -> anyhow::Result<kube::Config> {
    if let Some(path) = &args.kubeconfig {
        let file = Kubeconfig::read_from(path).with_context(|| format!("kubeconfig {}", path.display()))?;
        return kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("kubeconfig {}", path.display()));
    }
    if in_cluster(&k.api_root, std::env::var_os("KUBERNETES_SERVICE_HOST").is_some())? {
        return kube::Config::incluster().context("in-cluster Kubernetes configuration");
    }
    from_section(k)
}

/// Whether the API server is the one of the pod's cluster: `api_root` left at its default, or set
/// empty as upstream's containerized installs write it (its client then takes the server from
/// `KUBERNETES_SERVICE_HOST`), in a pod. An empty `api_root` outside a pod names no server.
fn in_cluster(api_root: &str, in_pod: bool) -> anyhow::Result<bool> {
    let empty = api_root.trim().is_empty();
    if empty && !in_pod {
        anyhow::bail!(
            "[kubernetes] api_root is empty: the API server is then the pod's cluster's \
             (KUBERNETES_SERVICE_HOST), which is not set here; set api_root or pass --kubeconfig"
        );
    }
    Ok(in_pod && (empty || api_root == KubernetesSection::default().api_root))
}

/// `[kubernetes]` the way upstream's client reads it, but verifying the server certificate unless
/// `ssl_verify_server_crt = False` says otherwise (upstream's default was not to verify): with
/// `ssl_ca_crt_file` when that file exists, else with the system's roots.
fn from_section(k: &KubernetesSection) -> anyhow::Result<kube::Config> {
    let url = k
        .api_root
        .parse::<http::Uri>()
        .with_context(|| format!("[kubernetes] api_root = {:?} is not a URL", k.api_root))?;
    let https = url.scheme_str() == Some("https");
    let mut cfg = kube::Config::new(url);
    // Outside a pod the default service-account token does not exist: send no token then.
    cfg.auth_info.token_file = k.token_file.clone().filter(|p| Path::new(p).is_file());
    if https {
        let ca = k.ssl_ca_crt_file.as_deref();
        match k.ssl_verify_server_crt {
            Some(false) => {
                tracing::warn!(
                    "[kubernetes] ssl_verify_server_crt = False: the API server certificate is not verified"
                );
                cfg.accept_invalid_certs = true;
            }
            Some(true) => {
                let ca = ca.context("[kubernetes] ssl_verify_server_crt = True needs ssl_ca_crt_file")?;
                if !Path::new(ca).is_file() {
                    anyhow::bail!("[kubernetes] ssl_ca_crt_file = {ca:?} does not exist");
                }
                cfg.root_cert_file = Some(ca.into());
            }
            None => {
                cfg.root_cert_file = ca.filter(|c| Path::new(c).is_file()).map(Into::into);
            }
        }
        match (&k.ssl_client_crt_file, &k.ssl_client_key_file) {
            (Some(crt), Some(key)) => {
                cfg.auth_info.client_certificate = Some(crt.clone());
                cfg.auth_info.client_key = Some(key.clone());
            }
            (None, None) => {}
            _ => {
                anyhow::bail!("[kubernetes] ssl_client_crt_file and ssl_client_key_file must be set together")
            }
        }
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's containerized installs write `api_root = ""`: the pod's cluster, as the default.
    #[test]
    fn an_empty_api_root_is_the_pods_cluster() {
        let default = KubernetesSection::default().api_root;
        assert!(in_cluster("", true).expect("in a pod"));
        assert!(in_cluster("  ", true).expect("in a pod"));
        assert!(in_cluster(&default, true).expect("in a pod"));
        assert!(!in_cluster("https://10.0.0.1:6443", true).expect("a named server"));
        assert!(!in_cluster(&default, false).expect("outside a pod"));
        let e = in_cluster("", false).expect_err("no server").to_string();
        assert!(
            e.contains("api_root") && e.contains("KUBERNETES_SERVICE_HOST"),
            "{e}"
        );
    }

    fn section(ini: &str) -> KubernetesSection {
        match KuryrConfig::from_ini_str(ini) {
            Ok(l) => l.config.kubernetes,
            Err(e) => panic!("test config: {e}"),
        }
    }

    #[test]
    fn api_root_with_missing_token_and_ca_files_is_plain() -> anyhow::Result<()> {
        let k = section("[kubernetes]\napi_root = http://10.0.0.1:8080\ntoken_file = /nonexistent/token\n");
        let cfg = from_section(&k)?;
        assert_eq!(cfg.cluster_url.to_string(), "http://10.0.0.1:8080/");
        assert_eq!(cfg.auth_info.token_file, None);
        assert!(!cfg.accept_invalid_certs);
        Ok(())
    }

    #[test]
    fn https_is_verified_by_default_and_reads_the_token_file() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let token = dir.path().join("token");
        std::fs::write(&token, "abc")?;
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, "pem")?;
        let k = section(&format!(
            "[kubernetes]\napi_root = https://k8s.example:6443\ntoken_file = {}\nssl_ca_crt_file = {}\n",
            token.display(),
            ca.display()
        ));
        let cfg = from_section(&k)?;
        assert!(!cfg.accept_invalid_certs);
        assert_eq!(cfg.root_cert_file.as_deref(), Some(ca.as_path()));
        assert_eq!(cfg.auth_info.token_file.as_deref(), token.to_str());
        // No CA file: still verified, against the system's roots.
        let k = section(
            "[kubernetes]\napi_root = https://k8s.example:6443\nssl_ca_crt_file = /nonexistent/ca.crt\n",
        );
        let cfg = from_section(&k)?;
        assert!(!cfg.accept_invalid_certs);
        assert_eq!(cfg.root_cert_file, None);
        Ok(())
    }

    #[test]
    fn verification_is_off_only_when_asked() -> anyhow::Result<()> {
        let k = section("[kubernetes]\napi_root = https://k8s.example:6443\nssl_verify_server_crt = False\n");
        assert!(from_section(&k)?.accept_invalid_certs);
        Ok(())
    }

    #[test]
    fn verification_needs_an_existing_ca_file() {
        let k = section(
            "[kubernetes]\napi_root = https://k8s.example:6443\nssl_verify_server_crt = True\nssl_ca_crt_file = /nonexistent/ca.crt\n",
        );
        let err = from_section(&k).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("ssl_ca_crt_file"), "{err}");
    }

    #[test]
    fn half_a_client_certificate_is_an_error() {
        let k =
            section("[kubernetes]\napi_root = https://k8s.example:6443\nssl_client_crt_file = /tmp/c.crt\n");
        let err = from_section(&k).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("ssl_client_key_file"), "{err}");
    }

    /// A server that answers each request 50 ms after it arrived, counting requests in flight.
    async fn slow_server() -> anyhow::Result<(String, std::sync::Arc<std::sync::atomic::AtomicUsize>)> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let now = std::sync::Arc::new(AtomicUsize::new(0));
        let most = std::sync::Arc::new(AtomicUsize::new(0));
        let seen = most.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (now, most) = (now.clone(), most.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    // One request per read is enough for bodiless GETs; keep-alive serves the next.
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        now.fetch_sub(1, Ordering::SeqCst);
                        let body = r#"{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}"#;
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        );
                        if conn.write_all(format!("{head}{body}").as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok((url, seen))
    }

    #[tokio::test]
    async fn requests_in_flight_are_bounded_by_max_concurrent_requests() -> anyhow::Result<()> {
        use k8s_openapi::api::core::v1::Namespace;
        let (url, most) = slow_server().await?;
        let loaded = KuryrConfig::from_ini_str(&format!(
            "[kubernetes]\napi_root = {url}\ntoken_file =\nmax_concurrent_requests = 3\n"
        ))?;
        let client = client(&KubeArgs { kubeconfig: None }, &loaded.config).await?;
        let api: kube::Api<Namespace> = kube::Api::all(client);
        let gets = (0..12).map(|_| api.get("x"));
        for got in futures::future::join_all(gets).await {
            got?;
        }
        let most = most.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            (2..=3).contains(&most),
            "{most} requests were in flight at once, the bound is 3"
        );
        Ok(())
    }

    /// Every formatted log line of the current thread's subscriber.
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut v) = self.0.lock() {
                v.extend_from_slice(b);
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_kubeconfig_token_never_reaches_a_trace_log() -> anyhow::Result<()> {
        const TOKEN: &str = "kubeconfig-token-must-never-be-logged-5e21";
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let emu = kube_emulator::KubeEmulator::start(kube_emulator::KubeOptions::default()).await?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters: [{{name: k, cluster: {{server: \"{}\"}}}}]\n\
                 users: [{{name: u, user: {{token: {TOKEN}}}}}]\n\
                 contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n",
                emu.url()
            ),
        )?;
        let args = KubeArgs {
            kubeconfig: Some(path),
        };
        let client = client(&args, &KuryrConfig::default()).await?;
        client.apiserver_version().await?;
        let _ = emu.shutdown().await;
        let log =
            String::from_utf8_lossy(&lines.0.lock().map(|v| v.clone()).unwrap_or_default()).into_owned();
        // The check means something only if the HTTP stack logged at trace/debug level.
        assert!(
            log.lines().any(|l| l.contains("TRACE") || l.contains("DEBUG")),
            "{log}"
        );
        assert!(
            !log.contains(TOKEN),
            "the kubeconfig token is in the logs:\n{log}"
        );
        Ok(())
    }

    #[test]
    fn bad_api_root_names_the_option() {
        let k = section("[kubernetes]\napi_root = not a url\n");
        let err = from_section(&k).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("api_root"), "{err}");
    }
}
