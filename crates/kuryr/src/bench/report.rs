//! The results: one table (markdown, so it pastes into docs/benchmarks.md), the ratios of the
//! two implementations, and the latency chart as a hand-written SVG.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::cases::Stages;
use super::scale::Scale;
use super::{Case, Impl, Profile};

/// One (profile, case, implementation) run.
#[derive(Clone, Debug)]
pub struct Row {
    pub profile: Profile,
    pub case: Case,
    pub which: Impl,
    pub pods: usize,
    pub wired: usize,
    /// First pod created -> last pod wired.
    pub secs: f64,
    /// Sorted wiring latencies (pod created -> KuryrPort with an active default VIF).
    pub latencies: Vec<Duration>,
    /// Where those latencies went: when each pod's KuryrPort was made and its ports recorded.
    pub stages: Stages,
    /// Neutron requests in the measured window by operation (`port.create`, ...).
    pub neutron_ops: BTreeMap<String, u64>,
    /// Simulated service time the emulator spent on them (its worker slots' busy time).
    pub neutron_busy: Duration,
    pub neutron_workers: Option<usize>,
    /// Kubernetes API requests in the measured window by `<verb> <resource>`.
    pub kube_requests: BTreeMap<String, u64>,
    pub cpu_secs: f64,
    /// CPU of the benchmark process itself over the window: the emulated Kubernetes API and
    /// Neutron serving the controller (and the pod creator). With the controller's, what the run
    /// asked of the machine's cores.
    pub bed_cpu_secs: f64,
    pub peak_rss_kib: u64,
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64) * q / 100.0).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

impl Row {
    /// The controller's and the emulators' CPU over the run's wall time: on a machine of N cores,
    /// a value near N means the run was bound by the machine, not by waits.
    pub fn cores_busy(&self) -> f64 {
        if self.secs > 0.0 {
            (self.cpu_secs + self.bed_cpu_secs) / self.secs
        } else {
            0.0
        }
    }

    pub fn pods_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.wired as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Every pod of the run was wired.
    pub fn complete(&self) -> bool {
        self.wired == self.pods
    }

    fn per_pod(&self, n: u64) -> f64 {
        n as f64 / self.pods.max(1) as f64
    }

    pub fn neutron_per_pod(&self) -> f64 {
        self.per_pod(self.neutron_ops.values().sum())
    }

    pub fn kube_per_pod(&self) -> f64 {
        self.per_pod(self.kube_requests.values().sum())
    }

    /// Neutron requests per pod by kind of port call: create (single or bulk), get, list,
    /// update, delete, other.
    pub fn neutron_by_kind(&self) -> String {
        let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
        for (op, n) in &self.neutron_ops {
            let kind = match op.as_str() {
                "port.create" => "create",
                "port.create_bulk" => "bulk",
                "port.get" => "get",
                "port.list" => "list",
                "port.update" | "port.tags" => "update",
                "port.delete" => "delete",
                _ => "other",
            };
            *kinds.entry(kind).or_default() += n;
        }
        kinds
            .iter()
            .map(|(k, n)| format!("{k} {:.2}", self.per_pod(*n)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The most pods/s the emulated neutron-server's workers could serve for the requests this
    /// run made (workers / busy seconds per pod); `None` without a worker limit.
    pub fn server_bound(&self) -> Option<f64> {
        let workers = self.neutron_workers? as f64;
        let busy_per_pod = self.neutron_busy.as_secs_f64() / self.pods.max(1) as f64;
        (busy_per_pod > 0.0).then(|| workers / busy_per_pod)
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{}", d.as_millis()))
}

/// The markdown table of every row.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(
        "| Neutron | case | impl | pods wired | pods/s | p50 / p99 / max ms | Neutron req/pod | by kind (per pod) | \
         server bound pods/s | k8s req/pod | CPU s | emulators CPU s | cores busy | peak RSS MiB |\n",
    );
    out.push_str("|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {}/{} | {:.1} | {} / {} / {} | {:.2} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.1} |",
            r.profile.label(),
            r.case.label(),
            r.which.label(),
            r.wired,
            r.pods,
            r.pods_per_sec(),
            ms(percentile(&r.latencies, 50.0)),
            ms(percentile(&r.latencies, 99.0)),
            ms(r.latencies.last().copied()),
            r.neutron_per_pod(),
            r.neutron_by_kind(),
            r.server_bound().map_or_else(|| "-".into(), |b| format!("{b:.1}")),
            r.kube_per_pod(),
            r.cpu_secs,
            r.bed_cpu_secs,
            r.cores_busy(),
            r.peak_rss_kib as f64 / 1024.0,
        );
    }
    out
}

/// kuryr-rs vs upstream per (profile, case): pods/s, p99, CPU and memory ratios.
pub fn ratios(rows: &[Row]) -> String {
    let mut out = String::from(
        "| Neutron | case | pods/s kuryr-rs / upstream | p99 upstream / kuryr-rs | CPU upstream / kuryr-rs | RSS upstream / kuryr-rs |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    for r in rows.iter().filter(|r| r.which == Impl::KuryrRs) {
        let Some(u) = rows
            .iter()
            .find(|u| u.which == Impl::Upstream && u.profile == r.profile && u.case == r.case)
        else {
            continue;
        };
        let ratio = |a: f64, b: f64| {
            if b > 0.0 && a > 0.0 {
                format!("{:.1}x", a / b)
            } else {
                "-".into()
            }
        };
        let p99 = |x: &Row| percentile(&x.latencies, 99.0).map_or(0.0, |d| d.as_secs_f64());
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            r.profile.label(),
            r.case.label(),
            ratio(r.pods_per_sec(), u.pods_per_sec()),
            ratio(p99(u), p99(r)),
            ratio(u.cpu_secs, r.cpu_secs),
            ratio(u.peak_rss_kib as f64, r.peak_rss_kib as f64),
        );
    }
    out
}

const W: f64 = 900.0;
const LEFT: f64 = 250.0;
const RIGHT: f64 = 30.0;
const ROW_H: f64 = 18.0;
const TOP: f64 = 60.0;
/// The chart's log axis: 1 ms to 1000 s.
const AXIS_MIN_MS: f64 = 1.0;
const AXIS_MAX_MS: f64 = 1_000_000.0;

fn x_of(ms: f64) -> f64 {
    let span = AXIS_MAX_MS.log10() - AXIS_MIN_MS.log10();
    let f = (ms.clamp(AXIS_MIN_MS, AXIS_MAX_MS).log10() - AXIS_MIN_MS.log10()) / span;
    LEFT + f * (W - LEFT - RIGHT)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Wiring latency per run on a log axis: a line from min to max, a box from p50 to p99 and a
/// tick at p50; kuryr-rs blue, upstream orange, grouped by (Neutron profile, case).
pub fn svg(rows: &[Row], title: &str) -> String {
    let h = TOP + rows.len() as f64 * ROW_H + 50.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="13" font-weight="bold">{}</text>"#,
        esc(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="36">line: min to max; box: p50 to p99; log scale. <tspan fill="#1f77b4">kuryr-rs</tspan>, <tspan fill="#ff7f0e">upstream 10.0.0</tspan></text>"##
    );
    let bottom = TOP + rows.len() as f64 * ROW_H;
    let mut tick = AXIS_MIN_MS;
    while tick <= AXIS_MAX_MS {
        let x = x_of(tick);
        let label = if tick >= 1000.0 {
            format!("{}s", tick / 1000.0)
        } else {
            format!("{tick}ms")
        };
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{bottom}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            bottom + 14.0
        );
        tick *= 10.0;
    }
    for (i, r) in rows.iter().enumerate() {
        let y = TOP + i as f64 * ROW_H + ROW_H / 2.0;
        let color = match r.which {
            Impl::KuryrRs => "#1f77b4",
            Impl::Upstream => "#ff7f0e",
        };
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{} / {} / {}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            esc(r.profile.label()),
            esc(r.case.label()),
            esc(r.which.label())
        );
        let (Some(min), Some(p50), Some(p99), Some(max)) = (
            r.latencies.first(),
            percentile(&r.latencies, 50.0),
            percentile(&r.latencies, 99.0),
            r.latencies.last(),
        ) else {
            continue;
        };
        let f = |d: &Duration| x_of(d.as_secs_f64() * 1000.0);
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}"/>"#,
            f(min),
            f(max)
        );
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}" fill-opacity="0.6"/>"#,
            f(&p50),
            y - 5.0,
            (f(&p99) - f(&p50)).max(1.0),
            10.0
        );
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black" stroke-width="2"/>"#,
            f(&p50),
            y - 6.0,
            f(&p50),
            y + 6.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Kubernetes API requests per pod by `<verb> <resource>`, largest first: `label: create
/// kuryrports 1.00, patch pods 1.00, ...` (what the "k8s req/pod" column is made of).
pub fn kube_breakdown(label: &str, pods: usize, requests: &BTreeMap<String, u64>) -> String {
    let mut by: Vec<(&String, &u64)> = requests.iter().filter(|(_, n)| **n > 0).collect();
    by.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let parts: Vec<String> = by
        .iter()
        .map(|(k, n)| format!("{k} {:.2}", **n as f64 / pods.max(1) as f64))
        .collect();
    format!(
        "{label}: {}\n",
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    )
}

/// The run with the median pods/s (of an even number, the slower of the middle two): one whole
/// run, so that its columns stay consistent with each other.
pub fn median_run(mut runs: Vec<Row>) -> Option<Row> {
    // A run that left pods unwired (a timeout) is no one's median while a complete one exists.
    if runs.iter().any(Row::complete) {
        runs.retain(Row::complete);
    }
    if runs.is_empty() {
        return None;
    }
    runs.sort_by(|a, b| a.pods_per_sec().total_cmp(&b.pods_per_sec()));
    let mid = (runs.len() - 1) / 2;
    Some(runs.swap_remove(mid))
}

/// Where the wiring time of a run went: p50 / p99 from each pod's creation to its KuryrPort being
/// made (the `vif` handler), its ports recorded in it (created in Neutron, the `kuryrport`
/// handler) and its default VIF active. Each stage counts the pods that reached it (a pod on a
/// warm pool is recorded active at once; one never wired is in no later stage).
pub fn stages_line(label: &str, s: &Stages, active: &[Duration]) -> String {
    let ms = |v: &[Duration], q: f64| percentile(v, q).map_or("-".to_string(), |d| d.as_millis().to_string());
    let stage = |v: &[Duration]| format!("{} / {}", ms(v, 50.0), ms(v, 99.0));
    format!(
        "{label}: KuryrPort {}, ports recorded {}, active {}\n",
        stage(&s.created),
        stage(&s.recorded),
        stage(active)
    )
}

/// One `kuryr bench --scale` run (kuryr-rs alone).
#[derive(Clone, Debug)]
pub struct ScaleRow {
    pub case: Scale,
    /// The simulated cluster and workload, in words.
    pub cluster: String,
    /// Pods measured: the burst, or the churned pods.
    pub pods: usize,
    pub wired: usize,
    /// First measured pod created -> last one wired.
    pub secs: f64,
    /// Sorted wiring latencies of the measured pods.
    pub latencies: Vec<Duration>,
    /// Time to place the pods before the measured part (`nodes-1000`), or to fill the pools
    /// (`recovery-10k`).
    pub setup: Option<Duration>,
    /// `recovery-10k`: the new controller's process start -> `/ready`.
    pub ready: Option<Duration>,
    /// `recovery-10k`: ports the new controller recovered into its pools.
    pub recovered: Option<u64>,
    /// CPU-seconds of the controller over the measured part (until ready for a recovery).
    pub cpu_secs: f64,
    /// VmHWM of the controller, its whole life.
    pub peak_rss_kib: u64,
    pub neutron_requests: u64,
    /// Kubernetes API requests over the measured part by `<verb> <resource>`.
    pub kube_requests: BTreeMap<String, u64>,
    /// 1/5/15 minute load averages at the end of the run.
    pub load: [f64; 3],
}

/// What each scale case must show.
pub const SCALE_RSS_TARGET_MIB: f64 = 64.0;
pub const SCALE_READY_TARGET: Duration = Duration::from_secs(2);
pub const SCALE_P99_TARGET: Duration = Duration::from_secs(1);

impl ScaleRow {
    pub fn pods_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.wired as f64 / self.secs
        } else {
            0.0
        }
    }

    /// The case's target and whether it was met (every pod wired counts too; for a recovery,
    /// every pooled port recovered).
    pub fn verdict(&self) -> (String, bool) {
        let all_wired = self.pods > 0 && self.wired == self.pods;
        match self.case {
            Scale::Pods10k => {
                let mib = self.peak_rss_kib as f64 / 1024.0;
                (
                    format!("peak RSS <= {SCALE_RSS_TARGET_MIB:.0} MiB"),
                    all_wired && mib <= SCALE_RSS_TARGET_MIB,
                )
            }
            Scale::Recovery10k => (
                format!("ready < {} s", SCALE_READY_TARGET.as_secs()),
                all_wired
                    && self.recovered.is_some_and(|n| n >= self.pods as u64)
                    && self.ready.is_some_and(|r| r < SCALE_READY_TARGET),
            ),
            Scale::Nodes1000 => (
                format!("churn p99 < {} s", SCALE_P99_TARGET.as_secs()),
                all_wired && percentile(&self.latencies, 99.0).is_some_and(|p| p < SCALE_P99_TARGET),
            ),
        }
    }
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.2}", d.as_secs_f64()))
}

/// The scale table, then what its "k8s req/pod" column is made of.
pub fn scale_report(rows: &[ScaleRow]) -> String {
    let mut out = scale_table(rows);
    out.push_str("\nKubernetes requests per measured pod:\n");
    for r in rows {
        out.push_str(&kube_breakdown(r.case.label(), r.pods, &r.kube_requests));
    }
    out
}

/// The markdown table of the scale runs.
pub fn scale_table(rows: &[ScaleRow]) -> String {
    let mut out = String::from(
        "| case | cluster and workload | pods wired | setup s | pods/s | p50 / p99 / max ms | ready s | ports recovered | \
         CPU s | peak RSS MiB | Neutron req/pod | k8s req/pod | load avg | target | met |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n",
    );
    for r in rows {
        let per_pod = |n: u64| n as f64 / r.pods.max(1) as f64;
        let (target, met) = r.verdict();
        let _ = writeln!(
            out,
            "| {} | {} | {}/{} | {} | {:.1} | {} / {} / {} | {} | {} | {:.2} | {:.1} | {:.2} | {:.1} | {:.1} {:.1} {:.1} | {} | {} |",
            r.case.label(),
            r.cluster,
            r.wired,
            r.pods,
            secs(r.setup),
            r.pods_per_sec(),
            ms(percentile(&r.latencies, 50.0)),
            ms(percentile(&r.latencies, 99.0)),
            ms(r.latencies.last().copied()),
            secs(r.ready),
            r.recovered.map_or_else(|| "-".into(), |n| n.to_string()),
            r.cpu_secs,
            r.peak_rss_kib as f64 / 1024.0,
            per_pod(r.neutron_requests),
            per_pod(r.kube_requests.values().sum()),
            r.load[0],
            r.load[1],
            r.load[2],
            target,
            if met { "yes" } else { "NO" },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(which: Impl, lat_ms: &[u64], secs: f64) -> Row {
        let mut latencies: Vec<Duration> = lat_ms.iter().map(|m| Duration::from_millis(*m)).collect();
        latencies.sort();
        Row {
            profile: Profile::RealServer,
            case: Case::ColdNoop,
            which,
            pods: lat_ms.len(),
            wired: lat_ms.len(),
            secs,
            stages: Stages::default(),
            latencies,
            neutron_ops: BTreeMap::from([("port.create".into(), 4), ("port.list".into(), 2)]),
            neutron_busy: Duration::from_secs(2),
            neutron_workers: Some(2),
            kube_requests: BTreeMap::from([("patch kuryrports".into(), 8)]),
            cpu_secs: 1.0,
            bed_cpu_secs: 2.0,
            peak_rss_kib: 10240,
        }
    }

    #[test]
    fn stages_show_each_step_and_a_dash_for_one_never_reached() {
        let ms = |v: &[u64]| v.iter().map(|m| Duration::from_millis(*m)).collect::<Vec<_>>();
        let s = Stages {
            created: ms(&[5, 10, 20]),
            recorded: ms(&[40, 60, 90]),
        };
        assert_eq!(
            stages_line("instant cold burst noop kuryr-rs", &s, &[]),
            "instant cold burst noop kuryr-rs: KuryrPort 10 / 20, ports recorded 60 / 90, active - / -\n"
        );
    }

    #[test]
    fn the_median_run_is_one_whole_run() {
        assert!(median_run(vec![]).is_none());
        let runs = vec![
            row(Impl::KuryrRs, &[10, 20], 2.0),
            row(Impl::KuryrRs, &[10, 20], 1.0),
            row(Impl::KuryrRs, &[10, 20], 4.0),
        ];
        assert_eq!(median_run(runs).map(|r| r.secs), Some(2.0));
        // Of two, the slower.
        let runs = vec![row(Impl::KuryrRs, &[10], 1.0), row(Impl::KuryrRs, &[10], 3.0)];
        assert_eq!(median_run(runs).map(|r| r.secs), Some(3.0));
        // A run that timed out with pods unwired is not the median of complete ones, however fast.
        let mut partial = row(Impl::KuryrRs, &[10, 20], 0.1);
        partial.wired = 1;
        let runs = vec![
            partial.clone(),
            row(Impl::KuryrRs, &[10, 20], 2.0),
            row(Impl::KuryrRs, &[10, 20], 4.0),
        ];
        assert_eq!(median_run(runs).map(|r| r.secs), Some(4.0));
        assert_eq!(median_run(vec![partial]).map(|r| r.wired), Some(1));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&v, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&v[..1], 99.0), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn per_pod_figures_and_server_bound() {
        let r = row(Impl::KuryrRs, &[10, 20, 30, 40], 2.0);
        assert_eq!(r.pods_per_sec(), 2.0);
        assert_eq!(r.neutron_per_pod(), 1.5);
        assert_eq!(r.neutron_by_kind(), "create 1.00, list 0.50");
        assert_eq!(r.kube_per_pod(), 2.0);
        // 1 CPU-second of controller and 2 of emulators over 2 s: one and a half cores.
        assert_eq!(r.cores_busy(), 1.5);
        // 2 s of service for 4 pods on 2 workers: 4 pods/s at most.
        assert_eq!(r.server_bound(), Some(4.0));
    }

    #[test]
    fn ratios_pair_the_implementations() {
        let rows = vec![
            row(Impl::KuryrRs, &[10, 20], 1.0),
            row(Impl::Upstream, &[100, 200], 4.0),
        ];
        let t = ratios(&rows);
        // pods/s 2 vs 0.5; p99 200 ms vs 20 ms.
        assert!(t.contains("| 4.0x | 10.0x | 1.0x | 1.0x |"), "{t}");
    }

    #[test]
    fn chart_draws_one_box_per_run_on_the_log_axis() {
        let rows = vec![
            row(Impl::KuryrRs, &[10, 100], 1.0),
            row(Impl::Upstream, &[1000, 10_000], 4.0),
        ];
        let s = svg(&rows, "t <x>");
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("fill-opacity").count(), 2);
        assert!(s.contains("t &lt;x&gt;"));
        // 10 ms is one decade of six past the axis start.
        let expect = LEFT + (W - LEFT - RIGHT) / 6.0;
        assert!((x_of(10.0) - expect).abs() < 1e-9);
    }

    fn scale_row(case: Scale) -> ScaleRow {
        ScaleRow {
            case,
            cluster: "c".into(),
            pods: 100,
            wired: 100,
            secs: 4.0,
            latencies: (1..=100).map(Duration::from_millis).collect(),
            setup: None,
            ready: Some(Duration::from_millis(1500)),
            recovered: Some(100),
            cpu_secs: 1.0,
            peak_rss_kib: 60 * 1024,
            neutron_requests: 50,
            kube_requests: BTreeMap::from([("get pods".into(), 300)]),
            load: [1.0, 2.0, 3.0],
        }
    }

    #[test]
    fn kube_requests_are_broken_down_per_pod_largest_first() {
        let req = BTreeMap::from([
            ("patch pods".to_string(), 100),
            ("create kuryrports".to_string(), 200),
            ("list pods".to_string(), 0),
        ]);
        assert_eq!(
            kube_breakdown("warm pool kuryr-rs", 100, &req),
            "warm pool kuryr-rs: create kuryrports 2.00, patch pods 1.00\n"
        );
        assert_eq!(kube_breakdown("x", 10, &BTreeMap::new()), "x: none\n");
    }

    #[test]
    fn scale_targets() {
        let mut r = scale_row(Scale::Pods10k);
        assert!(r.verdict().1);
        r.peak_rss_kib = 65 * 1024;
        assert!(!r.verdict().1, "above 64 MiB");
        let mut r = scale_row(Scale::Pods10k);
        r.wired = 99;
        assert!(!r.verdict().1, "a pod not wired");

        let mut r = scale_row(Scale::Recovery10k);
        assert!(r.verdict().1);
        r.ready = Some(Duration::from_secs(2));
        assert!(!r.verdict().1, "2 s is not under 2 s");
        let mut r = scale_row(Scale::Recovery10k);
        r.recovered = Some(99);
        assert!(!r.verdict().1, "a port not recovered");

        let mut r = scale_row(Scale::Nodes1000);
        assert!(r.verdict().1);
        // Nearest rank: the 99th of 100 values.
        r.latencies[98] = Duration::from_millis(1000);
        r.latencies[99] = Duration::from_millis(1000);
        assert!(!r.verdict().1, "p99 of 1 s");
    }

    #[test]
    fn scale_table_rows() {
        let t = scale_table(&[scale_row(Scale::Pods10k), scale_row(Scale::Recovery10k)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(
            lines[2].starts_with("| pods-10k | c | 100/100 | - | 25.0 | 50 / 99 / 100 | 1.50 | 100 | 1.00 | 60.0 | 0.50 | 3.0 | 1.0 2.0 3.0 | peak RSS <= 64 MiB | yes |"),
            "{}",
            lines[2]
        );
        assert!(lines[3].ends_with("| ready < 2 s | yes |"), "{}", lines[3]);
    }
}
