//! scripts/check-contract-summary.sh, which scripts/test-all.sh runs on the `cargo test` log: both targets' summary
//! lines present, 0 failed, the same number passed.

use std::path::PathBuf;
use std::process::Command;

fn check(log: &str) -> (bool, String) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/check-contract-summary.sh");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cargo-test.log");
    std::fs::write(&path, log).expect("write log");
    let out = Command::new("bash")
        .arg(&script)
        .arg(&path)
        .output()
        .expect("run the check script");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

const EMU_40: &str = "contract[emulator]: 40 passed, 0 failed  (3.2s)\n";

#[test]
fn same_count_and_no_failure_passes() {
    let (ok, out) = check(&format!(
        "running 3 tests\n{EMU_40}  ok  case\ncontract[neutron-server]: 40 passed, 0 failed  (20.1s)\n"
    ));
    assert!(ok, "{out}");
    assert!(out.contains("40"), "{out}");
}

#[test]
fn a_missing_or_skipped_target_fails() {
    let (ok, out) = check(&format!(
        "{EMU_40}contract[neutron-server]: skipped: KURYR_TEST_NEUTRON_URL is unset\n"
    ));
    assert!(!ok, "{out}");
    assert!(out.contains("contract[neutron-server]"), "{out}");
    let (ok, out) = check("no contract lines at all\n");
    assert!(!ok, "{out}");
    assert!(
        out.contains("contract[emulator]") && out.contains("contract[neutron-server]"),
        "{out}"
    );
}

#[test]
fn failures_or_different_counts_fail() {
    let (ok, out) = check(&format!(
        "{EMU_40}contract[neutron-server]: 39 passed, 1 failed  (20.1s)\n"
    ));
    assert!(!ok, "{out}");
    assert!(out.contains("1 failed"), "{out}");
    let (ok, out) = check(&format!(
        "{EMU_40}contract[neutron-server]: 38 passed, 0 failed  (20.1s)\n"
    ));
    assert!(!ok, "{out}");
    assert!(
        out.contains("emulator=40") && out.contains("neutron-server=38"),
        "{out}"
    );
}
