//! What the sandbox measures and prints: wiring latencies and the Neutron calls the controller made.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// The `result` label of a successful call (kuryr-neutron's `Outcome::Success`).
const SUCCESS: &str = "success";

/// Nearest-rank percentile (`p` in 0..=100) of unsorted samples; `None` when there are none.
pub fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// `kuryr_neutron_calls_total{operation=..,result=..}` from the controller's Prometheus text:
/// operation -> result -> count.
pub fn neutron_calls(prometheus_text: &str) -> BTreeMap<String, BTreeMap<String, u64>> {
    kuryr_controller::metrics::calls(prometheus_text, "kuryr_neutron_calls_total{")
}

/// `kuryr_octavia_calls_total`, like [`neutron_calls`].
pub fn octavia_calls(prometheus_text: &str) -> BTreeMap<String, BTreeMap<String, u64>> {
    kuryr_controller::metrics::calls(prometheus_text, "kuryr_octavia_calls_total{")
}

/// The end-of-demo numbers.
pub struct Summary {
    pub neutron: String,
    pub pods_created: usize,
    pub pods_wired: usize,
    pub pods_running: usize,
    /// pod creation -> KuryrPort with an active default VIF, per wired pod.
    pub latencies: Vec<Duration>,
    pub elapsed: Duration,
    pub calls: BTreeMap<String, BTreeMap<String, u64>>,
    /// Requests the embedded emulator served (`None` against an external server).
    pub emulator_requests: Option<u64>,
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_string(),
        |d| format!("{:.0} ms", d.as_secs_f64() * 1000.0),
    )
}

impl Summary {
    pub fn render(&self) -> String {
        let mut s = String::new();
        let line = "-".repeat(64);
        let _ = writeln!(s, "{line}");
        let _ = writeln!(s, "kuryr sandbox summary");
        let _ = writeln!(s, "{line}");
        let _ = writeln!(s, "  {:<28} {}", "Neutron", self.neutron);
        let _ = writeln!(
            s,
            "  {:<28} {}/{}",
            "pods wired", self.pods_wired, self.pods_created
        );
        let _ = writeln!(
            s,
            "  {:<28} {}/{}",
            "pods Running (kubelet)", self.pods_running, self.pods_created
        );
        let _ = writeln!(
            s,
            "  {:<28} {}",
            "wiring latency p50",
            ms(percentile(&self.latencies, 50.0))
        );
        let _ = writeln!(
            s,
            "  {:<28} {}",
            "wiring latency p99",
            ms(percentile(&self.latencies, 99.0))
        );
        let _ = writeln!(
            s,
            "  {:<28} {}",
            "wiring latency max",
            ms(self.latencies.iter().max().copied())
        );
        let _ = writeln!(
            s,
            "  {:<28} {:.1} s",
            "all pods wired after",
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(
            s,
            "  (latency = pod created -> its KuryrPort has an active eth0 VIF)"
        );
        let _ = writeln!(s, "{line}");
        let _ = writeln!(
            s,
            "  {:<32} {:>8} {:>8}",
            "Neutron calls (controller)", "success", "failed"
        );
        let mut total = 0;
        for (op, results) in &self.calls {
            let ok = results.get(SUCCESS).copied().unwrap_or(0);
            let failed: u64 = results
                .iter()
                .filter(|(r, _)| *r != SUCCESS)
                .map(|(_, n)| n)
                .sum();
            total += ok + failed;
            let _ = writeln!(s, "  {op:<32} {ok:>8} {failed:>8}");
        }
        let _ = writeln!(s, "  {:<32} {:>8}", "total", total);
        if let Some(n) = self.emulator_requests {
            let _ = writeln!(s, "  {:<32} {:>8}", "requests served by the emulator", n);
        }
        let _ = writeln!(s, "{line}");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).rev().map(d).collect();
        assert_eq!(percentile(&samples, 50.0), Some(d(50)));
        assert_eq!(percentile(&samples, 99.0), Some(d(99)));
        assert_eq!(percentile(&samples, 100.0), Some(d(100)));
        assert_eq!(percentile(&[d(7)], 99.0), Some(d(7)));
        assert_eq!(percentile(&[d(3), d(1)], 0.0), Some(d(1)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn neutron_calls_are_read_from_the_prometheus_text() {
        let text = "# HELP kuryr_neutron_calls Neutron API calls by operation and result.\n\
            # TYPE kuryr_neutron_calls counter\n\
            kuryr_neutron_calls_total{operation=\"port.create\",result=\"success\"} 20\n\
            kuryr_neutron_calls_total{operation=\"port.create\",result=\"conflict\"} 1\n\
            kuryr_neutron_calls_total{result=\"success\",operation=\"port.get\"} 41\n\
            kuryr_neutron_call_seconds_count{operation=\"port.get\"} 41\n";
        let calls = neutron_calls(text);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls["port.create"]["success"], 20);
        assert_eq!(calls["port.create"]["conflict"], 1);
        assert_eq!(calls["port.get"]["success"], 41);
    }

    #[test]
    fn summary_shows_wired_pods_latencies_and_calls() {
        let summary = Summary {
            neutron: "embedded emulator".into(),
            pods_created: 3,
            pods_wired: 2,
            pods_running: 1,
            latencies: vec![d(100), d(300)],
            elapsed: d(1500),
            calls: neutron_calls(
                "kuryr_neutron_calls_total{operation=\"port.create\",result=\"success\"} 2\n\
                 kuryr_neutron_calls_total{operation=\"port.create\",result=\"server_error\"} 1\n",
            ),
            emulator_requests: Some(9),
        };
        let text = summary.render();
        assert!(text.contains("pods wired                   2/3"), "{text}");
        assert!(text.contains("wiring latency p50           100 ms"), "{text}");
        assert!(text.contains("wiring latency p99           300 ms"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["port.create", "2", "1"]),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["total", "3"]),
            "{text}"
        );
    }
}
