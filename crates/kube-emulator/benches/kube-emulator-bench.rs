//! Benchmark: create N pods over HTTP while W watchers stream the namespace; prints create
//! throughput and watch fan-out latency (POST sent -> event received by a watcher).
//!
//! `cargo bench -p kube-emulator --bench kube-emulator-bench` (env: PODS, WATCHERS, CONCURRENCY).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube_emulator::{KubeEmulator, KubeOptions};
use serde_json::json;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Extracts N from `"name":"p-N"` without parsing the whole event.
fn pod_index(line: &[u8]) -> Option<usize> {
    const NEEDLE: &[u8] = b"\"name\":\"p-";
    let pos = line.windows(NEEDLE.len()).position(|w| w == NEEDLE)? + NEEDLE.len();
    let digits = line[pos..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&line[pos..pos + digits]).ok()?.parse().ok()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pods = env_or("PODS", 10_000);
    let watchers = env_or("WATCHERS", 100);
    let concurrency = env_or("CONCURRENCY", 32);
    let handle = KubeEmulator::start(KubeOptions::default()).await?;
    let url = handle.url().to_string();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency * 2)
        .build()?;
    http.post(format!("{url}/api/v1/namespaces"))
        .json(&json!({"metadata": {"name": "bench"}}))
        .send()
        .await?
        .error_for_status()?;

    // Send time of pod i in ns since `t0` (0 = not sent yet): lock-free so 100 watchers reading
    // it measure the server, not contention in the benchmark itself.
    let t0 = Instant::now();
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..pods).map(|_| AtomicU64::new(0)).collect());
    let start_rv = handle.store().resource_version();
    let mut watch_tasks = Vec::new();
    for _ in 0..watchers {
        let resp = http
            .get(format!(
                "{url}/api/v1/namespaces/bench/pods?watch=true&resourceVersion={start_rv}"
            ))
            .send()
            .await?
            .error_for_status()?;
        let sent = sent.clone();
        watch_tasks.push(tokio::spawn(async move {
            let mut stream = resp.bytes_stream();
            let mut buf: Vec<u8> = Vec::new();
            let mut latencies = Vec::with_capacity(pods);
            while latencies.len() < pods {
                let Ok(Some(Ok(chunk))) = tokio::time::timeout(Duration::from_secs(60), stream.next()).await
                else {
                    break;
                };
                let received = t0.elapsed().as_nanos() as u64;
                buf.extend_from_slice(&chunk);
                let mut start = 0;
                while let Some(nl) = buf[start..].iter().position(|b| *b == b'\n') {
                    let line = &buf[start..start + nl];
                    start += nl + 1;
                    if let Some(t) = pod_index(line).and_then(|i| sent.get(i)) {
                        let t = t.load(Ordering::Acquire);
                        if t > 0 {
                            latencies.push(Duration::from_nanos(received.saturating_sub(t)));
                        }
                    }
                }
                buf.drain(..start);
            }
            latencies
        }));
    }

    let began = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut creators = Vec::new();
    for _ in 0..concurrency {
        let (http, url, sent, next) = (http.clone(), url.clone(), sent.clone(), next.clone());
        creators.push(tokio::spawn(async move {
            let mut failures = 0usize;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= pods {
                    break;
                }
                let body = json!({"metadata": {"name": format!("p-{i}"), "labels": {"app": "bench"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
                sent[i].store(t0.elapsed().as_nanos().max(1) as u64, Ordering::Release);
                match http.post(format!("{url}/api/v1/namespaces/bench/pods")).json(&body).send().await {
                    Ok(r) if r.status().is_success() => {}
                    _ => failures += 1,
                }
            }
            failures
        }));
    }
    let mut failures = 0;
    for c in creators {
        failures += c.await?;
    }
    let create_secs = began.elapsed().as_secs_f64();
    let mut all = Vec::new();
    let mut complete = 0;
    for w in watch_tasks {
        let l = w.await?;
        if l.len() == pods {
            complete += 1;
        }
        all.extend(l);
    }
    all.sort();
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    println!("| metric | value |");
    println!("|---|---|");
    println!("| pods created (failed) | {pods} ({failures}) |");
    println!("| create concurrency | {concurrency} |");
    println!("| create requests/s | {:.0} |", pods as f64 / create_secs);
    println!("| watchers (received every event) | {watchers} ({complete}) |");
    println!("| events delivered | {} |", all.len());
    println!("| fan-out latency p50 | {} |", ms(percentile(&all, 0.50)));
    println!("| fan-out latency p99 | {} |", ms(percentile(&all, 0.99)));
    println!(
        "| fan-out latency max | {} |",
        ms(all.last().copied().unwrap_or_default())
    );
    handle.shutdown().await?;
    Ok(())
}
