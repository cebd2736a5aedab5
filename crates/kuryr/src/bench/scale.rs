//! `kuryr bench --scale`: the kuryr-rs controller alone at cluster scale, on the instant Neutron
//! profile with the `neutron` pool and the port quota lifted.
//!
//! - `pods-10k`: 10,000 pods at once on 100 nodes and 10 namespaces, all wired.
//! - `recovery-10k`: a controller fills its pools with 10,000 ports (a 10,000-pod burst, then
//!   every pod deleted: the ports go back to the pools and are flushed to the KuryrPortPools),
//!   is SIGKILLed, and a new one starts; measured: process start -> `/ready` answering 200
//!   (dependencies reached and every pool recovered), and how many ports it recovered.
//! - `nodes-1000`: 1,000 nodes x 30 pods placed and wired, then a steady churn (create, delete a
//!   few seconds later) on top for a fixed window; measured on the churned pods.

use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::ValueEnum;
use kube_emulator::store::{ListOpts, Store};
use kuryr_crds::KuryrPortPool;
use tokio::time::Instant;

use super::bed::{Bed, Layout};
use super::cases::{self, Created, Wired};
use super::child::{self, Controller, Programs};
use super::report::{ScaleRow, percentile};
use super::{Impl, Profile};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scale {
    /// 10,000 pods at once (100 nodes, 10 namespaces): pods/s, latency, peak RSS, CPU.
    Pods10k,
    /// 10,000 pooled ports recovered after a SIGKILL: process start to ready.
    Recovery10k,
    /// 1,000 nodes x 30 pods placed, then 20 pods/s of churn for 60 s: latency of the churn.
    Nodes1000,
}

impl Scale {
    pub fn label(self) -> &'static str {
        match self {
            Scale::Pods10k => "pods-10k",
            Scale::Recovery10k => "recovery-10k",
            Scale::Nodes1000 => "nodes-1000",
        }
    }
}

/// The sizes of one scale case (`--quick` divides them by 10 for a smoke run).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleSize {
    pub nodes: usize,
    pub namespaces: usize,
    /// Pods of the burst (`pods-10k`, `recovery-10k`) or placed before the churn (`nodes-1000`).
    pub pods: usize,
    pub churn_rate: f64,
    pub churn_secs: f64,
    pub churn_lifetime: Duration,
}

impl ScaleSize {
    pub fn of(case: Scale, quick: bool) -> Self {
        let d = if quick { 10 } else { 1 };
        let (nodes, per_node) = match case {
            Scale::Pods10k | Scale::Recovery10k => (100 / d, 100),
            Scale::Nodes1000 => (1000 / d, 30),
        };
        Self {
            nodes,
            namespaces: 10,
            pods: nodes * per_node,
            churn_rate: 20.0,
            churn_secs: if quick { 10.0 } else { 60.0 },
            churn_lifetime: Duration::from_secs(5),
        }
    }

    pub fn describe(&self, case: Scale) -> String {
        let base = format!(
            "{} nodes, {} namespaces, {} pods",
            self.nodes, self.namespaces, self.pods
        );
        match case {
            Scale::Pods10k => base,
            Scale::Recovery10k => format!("{base} -> {} pooled ports", self.pods),
            Scale::Nodes1000 => format!(
                "{base} + churn {:.0}/s for {:.0}s (pods live {}s)",
                self.churn_rate,
                self.churn_secs,
                self.churn_lifetime.as_secs()
            ),
        }
    }
}

pub async fn run_all(
    programs: &Programs,
    cases: &[Scale],
    quick: bool,
    timeout: Duration,
    work: &std::path::Path,
) -> anyhow::Result<Vec<ScaleRow>> {
    let mut rows = Vec::new();
    let mut failed = 0;
    for &case in cases {
        let size = ScaleSize::of(case, quick);
        let dir = work.join(case.label());
        std::fs::create_dir_all(&dir)?;
        println!("  {:<12} {} ...", case.label(), size.describe(case));
        let started = Instant::now();
        let result = run_one(programs, case, size, timeout, &dir).await;
        let errors = child::controller_error_lines(&dir);
        match result {
            Ok(row) => {
                println!(
                    "  {:<12} {}/{} wired, p99 {} ms, peak RSS {:.1} MiB, {errors} ERROR lines logged ({:.0}s)",
                    case.label(),
                    row.wired,
                    row.pods,
                    percentile(&row.latencies, 99.0).map_or(0, |d| d.as_millis()),
                    row.peak_rss_kib as f64 / 1024.0,
                    started.elapsed().as_secs_f64()
                );
                rows.push(row);
            }
            Err(e) => {
                failed += 1;
                println!(
                    "  {:<12} FAILED ({errors} ERROR lines logged): {e:#}",
                    case.label()
                );
            }
        }
    }
    if failed > 0 {
        println!();
        print!("{}", super::report::scale_report(&rows));
        bail!("{failed} of {} scale runs failed (see above)", cases.len());
    }
    Ok(rows)
}

async fn run_one(
    programs: &Programs,
    case: Scale,
    size: ScaleSize,
    timeout: Duration,
    dir: &std::path::Path,
) -> anyhow::Result<ScaleRow> {
    let layout = Layout::grid(size.nodes, size.namespaces);
    let bed = Bed::start(Profile::Instant, true, &layout, dir).await?;
    let result = match case {
        Scale::Pods10k | Scale::Nodes1000 => wire(programs, &bed, &layout, case, size, timeout, dir).await,
        Scale::Recovery10k => recovery(programs, &bed, &layout, size, timeout, dir).await,
    };
    bed.stop().await;
    result
}

/// The row of a run, latencies and throughput from `created`.
fn row_of(case: Scale, size: ScaleSize, created: &Created, wired: &Wired) -> ScaleRow {
    let mut latencies = Vec::with_capacity(created.len());
    let mut last = None;
    for (key, at) in created {
        if let Some(t) = wired.get(key) {
            latencies.push(t.saturating_duration_since(*at));
            last = last.max(Some(t));
        }
    }
    latencies.sort();
    let secs = match (created.iter().map(|(_, at)| *at).min(), last) {
        (Some(f), Some(l)) => l.saturating_duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    ScaleRow {
        case,
        cluster: size.describe(case),
        pods: created.len(),
        wired: latencies.len(),
        secs,
        latencies,
        setup: None,
        ready: None,
        recovered: None,
        cpu_secs: 0.0,
        peak_rss_kib: 0,
        neutron_requests: 0,
        kube_requests: Default::default(),
        load: [0.0; 3],
    }
}

/// `pods-10k` (the burst is measured) and `nodes-1000` (the burst places the pods, the churn
/// on top is measured).
async fn wire(
    programs: &Programs,
    bed: &Bed,
    layout: &Layout,
    case: Scale,
    size: ScaleSize,
    timeout: Duration,
    dir: &std::path::Path,
) -> anyhow::Result<ScaleRow> {
    let store = bed.kube.store();
    let tracker = cases::track(store.clone())?;
    let mut ctrl = Controller::spawn(Impl::KuryrRs, programs, &bed.conf, dir.join("controller.log"))?;
    let outcome = async {
        ctrl.wait_ready(bed.health_port, Duration::from_secs(120)).await?;
        let mut setup = None;
        if case == Scale::Nodes1000 {
            let placed_at = Instant::now();
            let placed = cases::burst(&store, layout, "placed", size.pods)?;
            if !cases::wait_wired(&tracker.wired, &placed, Instant::now() + timeout).await {
                bail!(
                    "the {} placed pods were not all wired within {}s",
                    size.pods,
                    timeout.as_secs()
                );
            }
            // The churn measures a cluster in its steady state: the tail of the placement (the
            // pools' refills and records for a thousand nodes) is let finish first.
            settle(bed, Instant::now() + timeout).await?;
            setup = Some(placed_at.elapsed());
        }
        bed.neutron.reset_stats();
        bed.kube.requests().reset();
        let cpu_before = child::usage(ctrl.pid).cpu_secs;
        let deadline = Instant::now() + timeout;
        let created = match case {
            Scale::Nodes1000 => {
                let total = (size.churn_rate * size.churn_secs).round().max(1.0) as usize;
                cases::churn(
                    &store,
                    layout,
                    &tracker.wired,
                    size.churn_rate,
                    total,
                    size.churn_lifetime,
                    deadline,
                )
                .await?
            }
            _ => cases::burst(&store, layout, "pod", size.pods)?,
        };
        cases::wait_wired(&tracker.wired, &created, deadline).await;
        let usage = child::usage(ctrl.pid);
        let mut row = row_of(case, size, &created, &tracker.wired);
        row.setup = setup;
        row.cpu_secs = usage.cpu_secs - cpu_before;
        row.peak_rss_kib = usage.peak_rss_kib;
        row.neutron_requests = bed.neutron.stats().operations.values().sum();
        row.kube_requests = bed.kube.requests().snapshot().into_iter().collect();
        row.load = load_average();
        anyhow::Ok(row)
    }
    .await;
    let exited = ctrl.exited();
    ctrl.stop().await;
    if exited {
        bail!(
            "the controller exited during the run; its log: {}",
            dir.join("controller.log").display()
        );
    }
    outcome
}

/// Waits until the controller has nothing queued and Neutron saw no request for two samples in a
/// row (a second apart).
async fn settle(bed: &Bed, deadline: Instant) -> anyhow::Result<()> {
    let mut quiet = 0;
    let mut last = None;
    while quiet < 2 {
        if Instant::now() > deadline {
            bail!("the controller did not settle after the placement");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let metrics = child::http_get(bed.metrics_port, "/metrics").await?;
        let requests: u64 = bed.neutron.stats().operations.values().sum();
        let idle = queue_depth(&metrics) == Some(0) && last == Some(requests);
        quiet = if idle { quiet + 1 } else { 0 };
        last = Some(requests);
    }
    Ok(())
}

/// `kuryr_queue_depth` of a Prometheus text exposition.
fn queue_depth(metrics: &str) -> Option<u64> {
    metrics.lines().find_map(|l| {
        let v = l.strip_prefix("kuryr_queue_depth ")?;
        v.trim().parse::<f64>().ok().map(|v| v as u64)
    })
}

/// `recovery-10k`.
async fn recovery(
    programs: &Programs,
    bed: &Bed,
    layout: &Layout,
    size: ScaleSize,
    timeout: Duration,
    dir: &std::path::Path,
) -> anyhow::Result<ScaleRow> {
    let store = bed.kube.store();
    let tracker = cases::track(store.clone())?;
    let mut first = Controller::spawn(Impl::KuryrRs, programs, &bed.conf, dir.join("controller-1.log"))?;
    let filled = async {
        first
            .wait_ready(bed.health_port, Duration::from_secs(120))
            .await?;
        let setup_at = Instant::now();
        let created = cases::burst(&store, layout, "fill", size.pods)?;
        let deadline = Instant::now() + timeout;
        if !cases::wait_wired(&tracker.wired, &created, deadline).await {
            bail!("the {} pods filling the pools were not all wired", size.pods);
        }
        cases::drain(&store, deadline).await?;
        let ports = wait_pools_flushed(&store, size.pods, deadline).await?;
        anyhow::Ok((created, ports, setup_at.elapsed()))
    }
    .await;
    // Killed, not stopped: a crash, nothing written on the way out.
    first.kill().await;
    let (created, pooled, setup) = filled?;

    let started = Instant::now();
    let mut ctrl = Controller::spawn(Impl::KuryrRs, programs, &bed.conf, dir.join("controller-2.log"))?;
    let outcome = async {
        ctrl.wait_ready_every(
            bed.health_port,
            Duration::from_secs(120),
            Duration::from_millis(5),
        )
        .await?;
        let ready = started.elapsed();
        let usage = child::usage(ctrl.pid);
        let metrics = child::http_get(bed.metrics_port, "/metrics").await?;
        let recovered = recovered_ports(&metrics)
            .context("the controller's /metrics has no kuryr_pool_events_total{event=\"recovered\"}")?;
        let mut row = row_of(Scale::Recovery10k, size, &created, &tracker.wired);
        row.cluster = format!("{}; {pooled} ports in the pools", row.cluster);
        row.setup = Some(setup);
        row.ready = Some(ready);
        row.recovered = Some(recovered);
        row.cpu_secs = usage.cpu_secs;
        row.peak_rss_kib = usage.peak_rss_kib;
        row.load = load_average();
        anyhow::Ok(row)
    }
    .await;
    ctrl.stop().await;
    outcome
}

/// Waits until the KuryrPortPool objects list at least `ports` available ports and no
/// recyclable one (every released port recycled and flushed); returns the available total.
async fn wait_pools_flushed(store: &Store, ports: usize, deadline: Instant) -> anyhow::Result<usize> {
    let def = store
        .find("openstack.org", "v1", "kuryrportpools")
        .context("KuryrPortPools are not served")?;
    loop {
        let items = store
            .list(&def, None, &ListOpts::default())
            .map_err(|e| anyhow::anyhow!("listing KuryrPortPools: {e}"))?
            .items;
        let (mut available, mut recyclable) = (0, 0);
        for item in items {
            let pool: KuryrPortPool =
                serde_json::from_value(item.as_ref().clone()).context("a KuryrPortPool the store holds")?;
            if let Some(st) = pool.status {
                available += st.available.len();
                recyclable += st.recyclable.len();
            }
        }
        if available >= ports && recyclable == 0 {
            return Ok(available);
        }
        if Instant::now() > deadline {
            bail!(
                "the pools list {available} available and {recyclable} recyclable ports, not {ports} available"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kuryr_pool_events_total{event="recovered"}` of a Prometheus text exposition.
pub fn recovered_ports(metrics: &str) -> Option<u64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix("kuryr_pool_events_total{")?;
        let (labels, value) = rest.split_once('}')?;
        labels
            .split(',')
            .any(|kv| kv.trim() == "event=\"recovered\"")
            .then(|| value.trim().parse::<f64>().ok())
            .flatten()
            .map(|v| v as u64)
    })
}

/// The 1, 5 and 15 minute load averages (zeros when /proc/loadavg cannot be read).
pub fn load_average() -> [f64; 3] {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| parse_loadavg(&s))
        .unwrap_or([0.0; 3])
}

fn parse_loadavg(s: &str) -> Option<[f64; 3]> {
    let mut it = s.split_whitespace().map(str::parse::<f64>);
    Some([it.next()?.ok()?, it.next()?.ok()?, it.next()?.ok()?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_cases() {
        let s = ScaleSize::of(Scale::Pods10k, false);
        assert_eq!((s.nodes, s.namespaces, s.pods), (100, 10, 10_000));
        let s = ScaleSize::of(Scale::Nodes1000, false);
        assert_eq!((s.nodes, s.pods), (1000, 30_000));
        assert_eq!(s.churn_rate * s.churn_secs, 1200.0);
        let q = ScaleSize::of(Scale::Recovery10k, true);
        assert_eq!((q.nodes, q.pods), (10, 1000));
        // The layout puts the same number of pods on every node.
        let layout = Layout::grid(s.nodes, s.namespaces);
        let mut per_node = std::collections::HashMap::new();
        for i in 0..s.pods {
            *per_node.entry(layout.place(i).1.to_string()).or_insert(0) += 1;
        }
        assert_eq!(per_node.len(), 1000);
        assert!(per_node.values().all(|n| *n == 30));
    }

    #[test]
    fn queue_depth_from_the_exposition() {
        let text = "# HELP kuryr_queue_depth Objects\n# TYPE kuryr_queue_depth gauge\nkuryr_queue_depth 3\n";
        assert_eq!(queue_depth(text), Some(3));
        assert_eq!(queue_depth("kuryr_queue_depth_other 1\n"), None);
    }

    #[test]
    fn recovered_count_from_the_exposition() {
        let text = "# HELP kuryr_pool_events Pool hits\n\
                    # TYPE kuryr_pool_events counter\n\
                    kuryr_pool_events_total{event=\"hit\"} 5\n\
                    kuryr_pool_events_total{event=\"recovered\"} 10000\n";
        assert_eq!(recovered_ports(text), Some(10_000));
        assert_eq!(
            recovered_ports("kuryr_pool_events_total{event=\"hit\"} 5\n"),
            None
        );
    }

    #[test]
    fn loadavg_line() {
        assert_eq!(
            parse_loadavg("3.54 1.93 2.07 3/812 4242\n"),
            Some([3.54, 1.93, 2.07])
        );
        assert_eq!(parse_loadavg("x"), None);
    }
}
