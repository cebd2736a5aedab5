//! `kuryr sandbox` end to end: the built binary against its embedded emulators.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs the CLI, killing it after `limit` so a hang fails the test instead of blocking CI.
fn run_kuryr(args: &[&str], limit: Duration) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kuryr"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kuryr");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(
        status.is_some(),
        "kuryr {args:?} did not finish within {limit:?}\nstdout:\n{out}\nstderr:\n{err}"
    );
    (status.is_some_and(|s| s.success()), out, err)
}

/// The lines of the sandbox's log (its stderr; the components run in its process) at ERROR
/// level: the level field after the timestamp, colour sequences removed.
fn error_lines(log: &str) -> Vec<String> {
    log.lines()
        .map(|l| {
            let mut plain = String::with_capacity(l.len());
            let mut chars = l.chars();
            while let Some(c) = chars.next() {
                if c == '\u{1b}' {
                    // `ESC [ ... letter`
                    chars.by_ref().find(char::is_ascii_alphabetic);
                } else {
                    plain.push(c);
                }
            }
            plain
        })
        .filter(|l| l.split_whitespace().nth(1) == Some("ERROR"))
        .collect()
}

/// A clean sandbox run logs no ERROR (a handled race or retry is a WARN at most).
fn assert_no_error_lines(err: &str) {
    let errors = error_lines(err);
    assert!(
        errors.is_empty(),
        "ERROR lines in the sandbox's log:\n{}",
        errors.join("\n")
    );
}

#[test]
fn error_lines_are_found_by_their_level_not_by_a_word() {
    let log = "\u{1b}[2m2026-11-25T08:00:00.000000Z\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m \u{1b}[2mkuryr_controller\u{1b}[0m: failed\n\
               2026-11-25T08:00:01.000000Z  WARN kuryr_controller: an ERROR in a message\n";
    let errors = error_lines(log);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].ends_with("kuryr_controller: failed"), "{errors:?}");
}

/// The value column of a summary row, e.g. `pods wired   6/6`.
fn row<'a>(summary: &'a str, label: &str) -> Option<&'a str> {
    summary
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .map(str::trim)
}

#[test]
fn sandbox_wires_six_pods_and_prints_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (ok, out, err) = run_kuryr(
        &[
            "sandbox",
            "--exit-after-summary",
            "--pods",
            "6",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        Duration::from_secs(180),
    );
    assert!(ok, "kuryr sandbox failed\nstdout:\n{out}\nstderr:\n{err}");
    assert_no_error_lines(&err);
    assert_eq!(row(&out, "pods wired"), Some("6/6"), "{out}");
    assert_eq!(row(&out, "pods Running (kubelet)"), Some("6/6"), "{out}");
    let p99 = row(&out, "wiring latency p99").unwrap_or_default();
    assert!(p99.ends_with(" ms") && p99 != "- ms", "p99 row: {p99:?}\n{out}");
    // Six ports created through Neutron (one call each, or bulk), none failed.
    let creates: u64 = out
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() == 3 && cols[0].starts_with("create_port")).then(|| {
                assert_eq!(cols[2], "0", "failed port creations: {l}");
                cols[1].parse::<u64>().unwrap()
            })
        })
        .sum();
    assert!(creates >= 1, "no port creation in the Neutron calls table\n{out}");
    // kubectl can use the kubeconfig it wrote (the server is gone now, but the file is complete).
    let kubeconfig = std::fs::read_to_string(state.join("kubeconfig")).unwrap();
    assert!(kubeconfig.contains("server: http://127.0.0.1:"), "{kubeconfig}");
    assert!(
        out.contains(&format!(
            "export KUBECONFIG={}",
            state.canonicalize().unwrap().join("kubeconfig").display()
        )),
        "{out}"
    );
}

#[test]
fn crds_check_passes_on_the_committed_manifests_and_fails_on_an_empty_dir() {
    let manifests = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/crds");
    let (ok, out, err) = run_kuryr(&["crds", "--check", manifests], Duration::from_secs(30));
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("is up to date"), "{out}");

    let empty = tempfile::tempdir().unwrap();
    let (ok, _, err) = run_kuryr(
        &["crds", "--check", empty.path().to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert!(!ok, "an empty directory must be reported as out of date");
    assert!(err.contains("missing: kuryrports.openstack.org.yaml"), "{err}");

    let (ok, out, _) = run_kuryr(&["crds", empty.path().to_str().unwrap()], Duration::from_secs(30));
    assert!(ok && out.contains("wrote "), "{out}");
    let (ok, _, err) = run_kuryr(
        &["crds", "--check", empty.path().to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert!(ok, "freshly written manifests must pass the check: {err}");
}

#[test]
fn controller_reports_bad_config_values_by_section_and_option() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("kuryr.conf");
    std::fs::write(&conf, "[vif_pool]\nports_pool_min = lots\n").unwrap();
    let (ok, _, err) = run_kuryr(
        &["controller", "--config-file", conf.to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert!(!ok);
    assert!(
        err.contains("vif_pool") && err.contains("ports_pool_min"),
        "{err}"
    );
}

#[test]
fn sandbox_with_pools_wires_pods_from_bulk_created_ports() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (ok, out, err) = run_kuryr(
        &[
            "sandbox",
            "--exit-after-summary",
            "--pool",
            "--pods",
            "4",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        Duration::from_secs(180),
    );
    assert!(ok, "kuryr sandbox --pool failed\nstdout:\n{out}\nstderr:\n{err}");
    assert_no_error_lines(&err);
    assert_eq!(row(&out, "pods wired"), Some("4/4"), "{out}");
    // The pool fills itself with bulk creates; no pod needs a single-port create.
    let cols = |op: &str| -> Option<Vec<String>> {
        out.lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .find(|c| c.len() == 3 && c[0] == op)
    };
    let bulk = cols("create_ports").unwrap_or_else(|| panic!("no bulk port creation\n{out}"));
    assert!(bulk[1].parse::<u64>().unwrap() >= 1 && bulk[2] == "0", "{bulk:?}");
    for single in ["create_port", "create_ports_coalesced"] {
        assert_eq!(cols(single), None, "pods were wired outside the pool\n{out}");
    }
}

/// `--deployments 2`: two Neutron emulators, each a KuryrOpenStackDeployment with its own zone
/// and its own Octavia; the two demo namespaces ask for the two zones, and the summary shows each
/// deployment with the namespace bound there, the ports of its pods and the load balancer of the
/// Service in that namespace.
#[test]
fn sandbox_with_two_deployments_places_a_namespace_in_each() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (ok, out, err) = run_kuryr(
        &[
            "sandbox",
            "--exit-after-summary",
            "--deployments",
            "2",
            "--pods",
            "6",
            "--namespaces",
            "2",
            "--services",
            "2",
            "--latency",
            "none",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        Duration::from_secs(180),
    );
    assert!(ok, "kuryr sandbox failed\nstdout:\n{out}\nstderr:\n{err}");
    assert_no_error_lines(&err);
    assert_eq!(row(&out, "pods wired"), Some("6/6"), "{out}");
    assert!(out.contains("load balancers: 2/2 ACTIVE"), "{out}");
    // Pods go round-robin over demo-1 (zone az1) and demo-2 (zone az2): 3 ports each.
    let deployment = |name: &str| {
        out.lines()
            .find_map(|l| l.trim_start().strip_prefix(&format!("{name} ")))
            .map(|rest| rest.split_whitespace().collect::<Vec<_>>())
    };
    assert_eq!(
        deployment("default"),
        Some(vec![
            "zone",
            "az1",
            "namespaces",
            "1",
            "ports",
            "3",
            "load_balancers",
            "1"
        ]),
        "{out}"
    );
    assert_eq!(
        deployment("deployment-2"),
        Some(vec![
            "zone",
            "az2",
            "namespaces",
            "1",
            "ports",
            "3",
            "load_balancers",
            "1"
        ]),
        "{out}"
    );
    // With a real neutron-server the second deployment could not be started.
    let (ok, _, err) = run_kuryr(
        &[
            "sandbox",
            "--deployments",
            "2",
            "--neutron-url",
            "http://127.0.0.1:1",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(!ok && err.contains("--neutron-url"), "{err}");
}
