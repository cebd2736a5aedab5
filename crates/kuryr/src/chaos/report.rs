//! The soak's result table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::invariants::{Kind, Violation};

/// How many ERROR lines the report quotes (the rest are in the log files).
const ERROR_LINES_SHOWN: usize = 5;

/// Everything the table shows.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub profile: String,
    pub seed: u64,
    pub neutron: String,
    pub elapsed: Duration,
    pub operations: BTreeMap<&'static str, u64>,
    pub refused: BTreeMap<&'static str, u64>,
    pub pod_operations: u64,
    pub faults: BTreeMap<&'static str, u64>,
    /// Neutron requests answered with an injected failure (emulator).
    pub neutron_faults_injected: Option<u64>,
    /// Of those, creates done whose reply was lost.
    pub neutron_lost_replies: Option<u64>,
    pub controller_restarts: u64,
    /// CNI daemon restarts; with `no_daemons` (why) the kubelet stand-in ran pods instead.
    pub daemon_restarts: u64,
    pub no_daemons: Option<String>,
    pub leader_changes_seen: u64,
    pub violations: Vec<Violation>,
    pub worst_recovery: Duration,
    /// Neutron calls per minute by the controllers while the port quota was exhausted, and
    /// the bulk port creates among them.
    pub exhausted_calls_per_min: Option<(f64, f64)>,
    pub neutron_calls_per_min: Option<f64>,
    pub snapshots: u64,
    pub snapshots_skipped: u64,
    /// ERROR lines in the controllers' and daemons' logs, each after its process' name: any
    /// fails the soak (a handled condition is logged at WARN or below).
    pub error_lines: Vec<String>,
    /// Whether the soak itself could run to the end (a setup failure is reported apart).
    pub note: Option<String>,
}

impl Report {
    pub fn count(&self, kinds: &[Kind]) -> usize {
        self.violations.iter().filter(|v| kinds.contains(&v.kind)).count()
    }

    pub fn leaks(&self) -> usize {
        self.count(&[
            Kind::LeakedPort,
            Kind::LeakedLoadBalancer,
            Kind::LeakedSecurityGroup,
            Kind::LeakedAddressGroup,
        ])
    }

    pub fn mismatches(&self) -> usize {
        self.count(&[Kind::Mismatch, Kind::OverMax, Kind::OrphanKuryrPort])
    }

    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.note.is_none() && self.error_lines.is_empty()
    }

    pub fn render(&self) -> String {
        let mut rows: Vec<(String, String)> = Vec::new();
        let mut row = |k: &str, v: String| rows.push((k.to_string(), v));
        row("pod operations", self.pod_operations.to_string());
        for (k, v) in &self.operations {
            let refused = self.refused.get(k).copied().unwrap_or(0);
            let cell = if refused > 0 {
                format!("{v} ({refused} refused)")
            } else {
                v.to_string()
            };
            row(&format!("  {k}"), cell);
        }
        for (k, v) in self
            .refused
            .iter()
            .filter(|(k, _)| !self.operations.contains_key(*k))
        {
            row(&format!("  {k}"), format!("0 ({v} refused)"));
        }
        row("faults", self.faults.values().sum::<u64>().to_string());
        for (k, v) in &self.faults {
            row(&format!("  {k}"), v.to_string());
        }
        if let Some(n) = self.neutron_faults_injected {
            row("  neutron requests failed by injection", n.to_string());
        }
        if let Some(n) = self.neutron_lost_replies {
            row("    of which creates done, reply lost", n.to_string());
        }
        row("controller restarts", self.controller_restarts.to_string());
        row(
            "CNI daemon restarts",
            match &self.no_daemons {
                None => self.daemon_restarts.to_string(),
                Some(why) => format!("no daemons: {why}"),
            },
        );
        row("leadership changes seen", self.leader_changes_seen.to_string());
        row("leaks (ports, load balancers, groups)", self.leaks().to_string());
        row("stuck pods", self.count(&[Kind::StuckPod]).to_string());
        row("did not settle", self.count(&[Kind::Unsettled]).to_string());
        row(
            "mismatches (books, max, KuryrPorts)",
            self.mismatches().to_string(),
        );
        row(
            "shared ports or IPs",
            self.count(&[Kind::SharedPort, Kind::SharedIp]).to_string(),
        );
        row(
            "node state (pod interfaces, leftovers)",
            self.count(&[Kind::NodeState]).to_string(),
        );
        row(
            "worst recovery time",
            format!("{:.1} s", self.worst_recovery.as_secs_f64()),
        );
        if let Some(per_min) = self.neutron_calls_per_min {
            row("neutron calls per minute", format!("{per_min:.0}"));
        }
        if let Some((calls, bulk)) = self.exhausted_calls_per_min {
            row(
                "neutron calls/min, quota exhausted",
                format!("{calls:.0} ({bulk:.0} bulk creates)"),
            );
        }
        row(
            "snapshots checked (skipped)",
            format!("{} ({})", self.snapshots, self.snapshots_skipped),
        );
        row(
            "ERROR lines in component logs",
            self.error_lines.len().to_string(),
        );

        let mut out = String::new();
        let _ = writeln!(
            out,
            "chaos soak: profile {} seed {} against {}, {:.0} s",
            self.profile,
            self.seed,
            self.neutron,
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(out, "| {:<44} | {:>24} |", "what", "count");
        let _ = writeln!(out, "|{}|{}|", "-".repeat(46), "-".repeat(26));
        for (k, v) in &rows {
            let _ = writeln!(out, "| {k:<44} | {v:>24} |");
        }
        if !self.violations.is_empty() {
            let _ = writeln!(out, "violations:");
            for v in &self.violations {
                let _ = writeln!(out, "  {v}");
            }
        }
        if !self.error_lines.is_empty() {
            let shown = self.error_lines.len().min(ERROR_LINES_SHOWN);
            let _ = writeln!(out, "ERROR lines ({shown} of {}):", self.error_lines.len());
            for l in &self.error_lines[..shown] {
                let _ = writeln!(out, "  {l}");
            }
        }
        if let Some(note) = &self.note {
            let _ = writeln!(out, "{note}");
        }
        let _ = writeln!(out, "result: {}", if self.passed() { "PASS" } else { "FAIL" });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_counts_each_kind_and_the_result_follows_the_violations() {
        let mut r = Report {
            profile: "ci".into(),
            seed: 1,
            neutron: "emulator".into(),
            elapsed: Duration::from_secs(150),
            pod_operations: 600,
            ..Report::default()
        };
        r.operations.insert("pod create", 300);
        r.refused.insert("pod create", 4);
        r.faults.insert("controller SIGKILL (random)", 2);
        r.faults.insert("neutron outage", 1);
        r.exhausted_calls_per_min = Some((12.0, 3.0));
        let text = r.render();
        assert!(text.contains("| pod operations"), "{text}");
        assert!(text.contains("300 (4 refused)"), "{text}");
        assert!(
            text.contains("| faults                                       |                        3 |"),
            "{text}"
        );
        assert!(text.contains("12 (3 bulk creates)"), "{text}");
        assert!(text.ends_with("result: PASS\n"), "{text}");

        r.violations.push(Violation {
            kind: Kind::LeakedPort,
            subject: "p1".into(),
            detail: "tagged port owned by no KuryrPort and no pool".into(),
            at: Duration::from_secs(3),
        });
        r.violations.push(Violation {
            kind: Kind::OverMax,
            subject: "pool".into(),
            detail: "25 > 10".into(),
            at: Duration::from_secs(4),
        });
        assert_eq!((r.leaks(), r.mismatches()), (1, 1));
        let text = r.render();
        assert!(text.contains("leaked port p1"), "{text}");
        assert!(text.ends_with("result: FAIL\n"), "{text}");
    }

    #[test]
    fn an_error_line_fails_the_soak_and_the_first_ones_are_quoted() {
        let mut r = Report::default();
        assert!(r.passed());
        assert!(!r.render().contains("ERROR lines ("));
        r.error_lines = (0..7)
            .map(|i| format!("controller-0: 2026-11-25T08:00:0{i}Z ERROR kuryr_controller: failure {i}"))
            .collect();
        assert!(!r.passed(), "an ERROR line with no violation passed");
        let text = r.render();
        assert!(
            text.contains("| ERROR lines in component logs                |                        7 |"),
            "{text}"
        );
        assert!(text.contains("ERROR lines (5 of 7):\n"), "{text}");
        assert!(
            text.contains("  controller-0: 2026-11-25T08:00:04Z ERROR kuryr_controller: failure 4\n"),
            "{text}"
        );
        assert!(!text.contains("failure 5"), "more than five quoted:\n{text}");
        assert!(text.ends_with("result: FAIL\n"), "{text}");
    }
}
