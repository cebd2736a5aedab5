//! Single vs bulk port-create latency against the emulator (RealServer profile) and, when
//! `KURYR_TEST_NEUTRON_URL` is set, against the real neutron-server. Prints a table.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use neutron_emulator::{Emulator, EmulatorOptions};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    name = "neutron-bench",
    about = "Port create latency: N single creates vs one bulk create"
)]
struct Args {
    /// Repetitions per case (median reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Port counts to compare.
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    sizes: Vec<usize>,
    /// Bind ports to this host at creation (empty = unbound).
    #[arg(long, default_value = "")]
    host: String,
    /// Skip the emulator and only measure the real server.
    #[arg(long)]
    real_only: bool,
}

struct Target {
    label: String,
    base: String,
    http: reqwest::Client,
}

impl Target {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        // The real uWSGI closes connections; retry a reset once for these test-only calls.
        for attempt in 0..3 {
            let mut req = self
                .http
                .request(method.clone(), format!("{}/v2.0{path}", self.base));
            if let Some(b) = &body {
                req = req.json(b);
            }
            match req.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    if !status.is_success() {
                        bail!("{} {path}: HTTP {status}: {text}", self.label);
                    }
                    if text.is_empty() {
                        return Ok(Value::Null);
                    }
                    return serde_json::from_str(&text).with_context(|| format!("{path}: invalid JSON"));
                }
                Err(e) if attempt < 2 && method == reqwest::Method::DELETE => {
                    tracing::debug!(error = %e, "retrying");
                }
                Err(e) => return Err(e).with_context(|| format!("{} {path}", self.label)),
            }
        }
        bail!("{path}: retries exhausted")
    }
}

fn id_of(v: &Value, key: &str) -> anyhow::Result<String> {
    v.get(key)
        .and_then(|o| o.get("id"))
        .and_then(Value::as_str)
        .map(String::from)
        .with_context(|| format!("no {key}.id in reply"))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

async fn measure(
    t: &Target,
    args: &Args,
    net: &str,
    project: &str,
) -> anyhow::Result<Vec<(String, Duration)>> {
    let port = |_: usize| {
        let mut p = json!({"network_id": net, "project_id": project, "device_owner": "compute:kuryr", "name": "available-port"});
        if !args.host.is_empty() {
            p["binding:host_id"] = json!(args.host);
        }
        p
    };
    let mut rows = Vec::new();
    for &n in &args.sizes {
        let mut singles = Vec::new();
        let mut bulks = Vec::new();
        for _ in 0..args.runs {
            let mut ids = Vec::new();
            let t0 = Instant::now();
            for i in 0..n {
                let v = t
                    .call(reqwest::Method::POST, "/ports", Some(json!({"port": port(i)})))
                    .await?;
                ids.push(id_of(&v, "port")?);
            }
            singles.push(t0.elapsed());
            let t0 = Instant::now();
            let v = t
                .call(
                    reqwest::Method::POST,
                    "/ports",
                    Some(json!({"ports": (0..n).map(port).collect::<Vec<_>>()})),
                )
                .await?;
            bulks.push(t0.elapsed());
            if let Some(items) = v.get("ports").and_then(Value::as_array) {
                ids.extend(
                    items
                        .iter()
                        .filter_map(|p| p.get("id").and_then(Value::as_str).map(String::from)),
                );
            }
            for id in ids {
                t.call(reqwest::Method::DELETE, &format!("/ports/{id}"), None)
                    .await?;
            }
        }
        rows.push((format!("{n} sequential single creates"), median(singles)));
        rows.push((format!("1 bulk create of {n}"), median(bulks)));
    }
    Ok(rows)
}

async fn run_target(t: &Target, args: &Args) -> anyhow::Result<Vec<(String, Duration)>> {
    let project = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let net = t
        .call(
            reqwest::Method::POST,
            "/networks",
            Some(json!({"network": {"name": "bench-net", "project_id": project}})),
        )
        .await?;
    let net_id = id_of(&net, "network")?;
    t.call(
        reqwest::Method::POST,
        "/subnets",
        Some(json!({"subnet": {"network_id": net_id, "project_id": project, "ip_version": 4, "cidr": "10.250.0.0/20", "enable_dhcp": false}})),
    )
    .await?;
    let rows = measure(t, args, &net_id, &project).await;
    let _ = t
        .call(reqwest::Method::DELETE, &format!("/networks/{net_id}"), None)
        .await;
    // The real server created the project's default security group: leave nothing behind.
    let sgs_path = format!("/security-groups?project_id={project}&fields=id");
    if let Ok(sgs) = t.call(reqwest::Method::GET, &sgs_path, None).await {
        for sg in sgs
            .get("security_groups")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(id) = sg.get("id").and_then(Value::as_str) {
                let path = format!("/security-groups/{id}");
                let _ = t.call(reqwest::Method::DELETE, &path, None).await;
            }
        }
    }
    rows
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let mut columns: Vec<(String, Vec<(String, Duration)>)> = Vec::new();
    let mut emu = None;
    if !args.real_only {
        let handle = Emulator::start(EmulatorOptions::real_server()).await?;
        let t = Target {
            label: "emulator(real profile)".into(),
            base: handle.url(),
            http: http.clone(),
        };
        columns.push((t.label.clone(), run_target(&t, &args).await?));
        emu = Some(handle);
    }
    match std::env::var("KURYR_TEST_NEUTRON_URL") {
        Ok(url) if !url.is_empty() => {
            let t = Target {
                label: "real neutron-server".into(),
                base: url.trim_end_matches('/').to_string(),
                http,
            };
            columns.push((t.label.clone(), run_target(&t, &args).await?));
        }
        _ => println!("(KURYR_TEST_NEUTRON_URL unset: real-server column skipped)"),
    }
    if let Some(h) = emu {
        h.shutdown().await;
    }
    let Some((_, first)) = columns.first() else {
        bail!("nothing measured")
    };
    print!("{:<36}", format!("operation (median of {} runs)", args.runs));
    for (label, _) in &columns {
        print!("{label:>26}");
    }
    println!();
    for (i, (name, _)) in first.iter().enumerate() {
        print!("{name:<36}");
        for (_, rows) in &columns {
            let ms = rows.get(i).map(|r| r.1.as_millis()).unwrap_or_default();
            print!("{:>23} ms", ms);
        }
        println!();
    }
    Ok(())
}
