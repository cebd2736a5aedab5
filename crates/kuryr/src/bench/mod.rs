//! `kuryr bench`: the peer benchmark. The kuryr-rs controller and upstream kuryr-kubernetes
//! 10.0.0's controller run as child processes, one after the other, each on fresh Kubernetes
//! and Neutron emulators and with the same kuryr.conf, through the same cases and Neutron latency
//! profiles; one table and one latency chart compare them.
//!
//! A subcommand of the `kuryr` binary rather than a cargo bench: the kuryr-rs controller it starts
//! is this very (release) binary, so what is measured is the shipped controller as a process, built
//! once, with its CPU and memory read from /proc exactly like upstream's.

mod bed;
mod cases;
mod child;
mod report;
mod scale;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::ValueEnum;
use tokio::time::Instant;

use crate::cli::BenchArgs;
use bed::{Bed, Layout};
use child::{Controller, Programs};
use report::Row;
pub use scale::Scale;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Impl {
    KuryrRs,
    Upstream,
}

impl Impl {
    pub fn label(self) -> &'static str {
        match self {
            Impl::KuryrRs => "kuryr-rs",
            Impl::Upstream => "upstream",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    /// No added latency, ports ACTIVE 50 ms after binding.
    Instant,
    /// The measured neutron-server: its latencies, 2 workers, 200 ms to ACTIVE.
    RealServer,
}

impl Profile {
    pub fn label(self) -> &'static str {
        match self {
            Profile::Instant => "instant",
            Profile::RealServer => "real-server",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Case {
    /// All pods at once, `noop` pool: a port create per pod.
    ColdNoop,
    /// All pods at once, `neutron` pool starting empty.
    ColdPooled,
    /// All pods at once on pools that the same number of pods filled and gave back.
    WarmPool,
    /// Pods created at a steady rate and deleted a few seconds later (`neutron` pool).
    Churn,
}

impl Case {
    pub fn label(self) -> &'static str {
        match self {
            Case::ColdNoop => "cold burst noop",
            Case::ColdPooled => "cold burst pooled",
            Case::WarmPool => "warm pool",
            Case::Churn => "churn",
        }
    }

    pub fn pooled(self) -> bool {
        !matches!(self, Case::ColdNoop)
    }
}

/// Sizes of one bench invocation.
#[derive(Clone, Copy, Debug)]
struct Size {
    pods: usize,
    churn_secs: f64,
    churn_lifetime: Duration,
    timeout: Duration,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let size = Size {
        pods: args.pods.unwrap_or(if args.quick { 30 } else { 300 }),
        churn_secs: if args.quick { 3.0 } else { 15.0 },
        churn_lifetime: Duration::from_secs(if args.quick { 1 } else { 3 }),
        timeout: Duration::from_secs(args.timeout),
    };
    let upstream_python = args
        .upstream_python
        .clone()
        .or_else(|| std::env::var_os("KURYR_TEST_UPSTREAM_PYTHON").map(PathBuf::from))
        .or_else(|| Some(PathBuf::from(".upstream-kuryr/venv/bin/python")));
    let programs = Programs::find(args.kuryr_bin.as_deref(), upstream_python.as_deref())?;
    if !args.scale.is_empty() {
        return run_scale(&args, &programs).await;
    }
    let impls: Vec<Impl> = if args.only.is_empty() {
        vec![Impl::KuryrRs, Impl::Upstream]
    } else {
        args.only.clone()
    };
    if impls.contains(&Impl::Upstream) && programs.upstream.is_none() {
        anyhow::bail!(
            "upstream kuryr-k8s-controller not found next to {:?}: run scripts/upstream-kuryr-venv.sh and pass \
             its output as --upstream-python, or use --only kuryr-rs",
            upstream_python
        );
    }
    let profiles = if args.profile.is_empty() {
        vec![Profile::Instant, Profile::RealServer]
    } else {
        args.profile.clone()
    };
    let cases = if args.case.is_empty() {
        vec![Case::ColdNoop, Case::ColdPooled, Case::WarmPool, Case::Churn]
    } else {
        args.case.clone()
    };
    let work = std::env::temp_dir().join(format!("kuryr-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    println!(
        "peer bench: {} pods per burst, churn {:.0} pods/s (instant) / {:.0} pods/s (real-server) for {}s; logs in {}",
        size.pods,
        churn_rate(Profile::Instant),
        churn_rate(Profile::RealServer),
        size.churn_secs,
        work.display()
    );

    let mut rows = Vec::new();
    for &profile in &profiles {
        for &case in &cases {
            let mut runs: BTreeMap<&str, Vec<Row>> = BTreeMap::new();
            for round in 1..=args.rounds {
                for &which in &impls {
                    let mut name = format!("{}-{:?}-{}", profile.label(), case, which.label());
                    if args.rounds > 1 {
                        name.push_str(&format!("-{round}"));
                    }
                    let dir = work.join(name);
                    std::fs::create_dir_all(&dir)?;
                    let started = Instant::now();
                    let result = run_one(&programs, profile, case, which, size, &dir).await;
                    let errors = child::controller_error_lines(&dir);
                    match result {
                        Ok(row) => {
                            println!(
                                "  {:<11} {:<17} {:<8} {}/{} wired, {:.1} pods/s, p99 {} ms, {errors} ERROR lines logged ({:.0}s)",
                                profile.label(),
                                case.label(),
                                which.label(),
                                row.wired,
                                row.pods,
                                row.pods_per_sec(),
                                report::percentile(&row.latencies, 99.0).map_or(0, |d| d.as_millis()),
                                started.elapsed().as_secs_f64()
                            );
                            runs.entry(which.label()).or_default().push(row);
                        }
                        Err(e) => println!(
                            "  {:<11} {:<17} {:<8} FAILED ({errors} ERROR lines logged): {e:#}",
                            profile.label(),
                            case.label(),
                            which.label()
                        ),
                    }
                }
            }
            for &which in &impls {
                if let Some(median) = runs.remove(which.label()).and_then(report::median_run) {
                    rows.push(median);
                }
            }
        }
    }
    if args.rounds > 1 {
        println!("\n(each row: the median of up to {} runs by pods/s)", args.rounds);
    }
    println!();
    print!("{}", report::table(&rows));
    println!();
    print!("{}", report::ratios(&rows));
    println!("\nKubernetes requests per pod:");
    for r in &rows {
        let label = format!("{} {} {}", r.profile.label(), r.case.label(), r.which.label());
        print!("{}", report::kube_breakdown(&label, r.pods, &r.kube_requests));
    }
    println!("\nWhere the wiring time went (ms from pod creation, p50 / p99):");
    for r in &rows {
        let label = format!("{} {} {}", r.profile.label(), r.case.label(), r.which.label());
        print!("{}", report::stages_line(&label, &r.stages, &r.latencies));
    }
    // The committed chart is the full side-by-side run's: a partial run (some cases, profiles or
    // one implementation) writes a chart only where --svg says.
    let full = args.only.is_empty() && args.profile.is_empty() && args.case.is_empty();
    let svg_path = args
        .svg
        .clone()
        .or_else(|| (full && !args.quick).then(|| PathBuf::from("docs/peer-bench.svg")));
    if let Some(path) = svg_path {
        let title = format!(
            "Wiring latency, {} pods per burst: kuryr-rs vs upstream kuryr-kubernetes 10.0.0 (kuryr bench)",
            size.pods
        );
        std::fs::write(&path, report::svg(&rows, &title))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\nchart: {}", path.display());
    }
    let expected = profiles.len() * cases.len() * impls.len();
    if rows.len() != expected {
        anyhow::bail!("{} of {expected} runs failed (see above)", expected - rows.len());
    }
    Ok(())
}

/// `--scale`: the kuryr-rs controller alone (upstream wires ~10 pods/s: 10,000 pods would take
/// it most of an hour).
async fn run_scale(args: &BenchArgs, programs: &Programs) -> anyhow::Result<()> {
    if args.only.contains(&Impl::Upstream) {
        anyhow::bail!("--scale runs the kuryr-rs controller only; drop --only upstream");
    }
    let work = std::env::temp_dir().join(format!("kuryr-bench-scale-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let load = scale::load_average();
    println!(
        "scale bench: kuryr-rs controller, instant Neutron, neutron pool; load average {:.2} {:.2} {:.2}; logs in {}",
        load[0],
        load[1],
        load[2],
        work.display()
    );
    let rows = scale::run_all(
        programs,
        &args.scale,
        args.quick,
        Duration::from_secs(args.timeout),
        &work,
    )
    .await?;
    println!();
    print!("{}", report::scale_report(&rows));
    Ok(())
}

fn churn_rate(profile: Profile) -> f64 {
    match profile {
        Profile::Instant => 50.0,
        Profile::RealServer => 5.0,
    }
}

async fn run_one(
    programs: &Programs,
    profile: Profile,
    case: Case,
    which: Impl,
    size: Size,
    dir: &std::path::Path,
) -> anyhow::Result<Row> {
    let bed = Bed::start(profile, case.pooled(), &Layout::peer(), dir).await?;
    let result = measure(programs, &bed, profile, case, which, size, dir).await;
    bed.stop().await;
    result
}

async fn measure(
    programs: &Programs,
    bed: &Bed,
    profile: Profile,
    case: Case,
    which: Impl,
    size: Size,
    dir: &std::path::Path,
) -> anyhow::Result<Row> {
    let store = bed.kube.store();
    let layout = Layout::peer();
    let tracker = cases::track(store.clone())?;
    let mut ctrl = Controller::spawn(which, programs, &bed.conf, dir.join("controller.log"))?;
    let outcome = async {
        ctrl.wait_ready(bed.health_port, Duration::from_secs(120)).await?;
        if case == Case::WarmPool {
            // The same burst once, unmeasured, then everything deleted: the ports go back to the
            // pools, and two pool update periods let them be seen ready for reuse.
            let warm = cases::burst(&store, &layout, "warm", size.pods)?;
            if !cases::wait_wired(&tracker.wired, &warm, Instant::now() + size.timeout).await {
                anyhow::bail!(
                    "the warm-up pods were not all wired within {}s",
                    size.timeout.as_secs()
                );
            }
            cases::drain(&store, Instant::now() + size.timeout).await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        bed.neutron.reset_stats();
        bed.kube.requests().reset();
        let cpu_before = child::usage(ctrl.pid).cpu_secs;
        let bed_cpu_before = child::own_cpu_secs();
        let deadline = Instant::now() + size.timeout;
        let created = match case {
            Case::Churn => {
                let rate = churn_rate(profile);
                let total = (rate * size.churn_secs).round().max(1.0) as usize;
                cases::churn(
                    &store,
                    &layout,
                    &tracker.wired,
                    rate,
                    total,
                    size.churn_lifetime,
                    deadline,
                )
                .await?
            }
            _ => cases::burst(&store, &layout, "pod", size.pods)?,
        };
        cases::wait_wired(&tracker.wired, &created, deadline).await;
        let usage = child::usage(ctrl.pid);
        let stats = bed.neutron.stats();
        let kube_requests = bed.kube.requests().snapshot();
        anyhow::Ok((
            created,
            usage.cpu_secs - cpu_before,
            child::own_cpu_secs() - bed_cpu_before,
            usage.peak_rss_kib,
            stats,
            kube_requests,
        ))
    }
    .await;
    let exited = ctrl.exited();
    ctrl.stop().await;
    let (created, cpu_secs, bed_cpu_secs, peak_rss_kib, stats, kube_requests) = outcome?;
    if exited {
        anyhow::bail!(
            "the controller exited during the run; its log: {}",
            dir.join("controller.log").display()
        );
    }
    let stages = cases::Stages::of(&tracker.wired, &created);
    let mut latencies = Vec::with_capacity(created.len());
    let mut last = None;
    for (key, at) in &created {
        if let Some(t) = tracker.wired.get(key) {
            latencies.push(t.saturating_duration_since(*at));
            last = last.max(Some(t));
        }
    }
    latencies.sort();
    let first = created.iter().map(|(_, at)| *at).min();
    let secs = match (first, last) {
        (Some(f), Some(l)) => l.saturating_duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    Ok(Row {
        profile,
        case,
        which,
        pods: created.len(),
        wired: latencies.len(),
        secs,
        latencies,
        stages,
        neutron_ops: stats.operations.clone(),
        neutron_busy: Duration::from_millis(stats.busy_ms),
        neutron_workers: bed.neutron_workers,
        kube_requests: kube_requests.into_iter().collect::<BTreeMap<_, _>>(),
        cpu_secs,
        bed_cpu_secs,
        peak_rss_kib,
    })
}
