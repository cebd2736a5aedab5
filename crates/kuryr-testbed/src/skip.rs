//! Skipping a test, saying why: the one behaviour every test crate of the workspace shares.
//!
//! A test that cannot run what it tests (no lab, no privilege, a missing tool) calls [`skip`] and
//! returns. [`skip`] prints `skipping: <reason>` to stderr; under `KURYR_TEST_REQUIRE_ALL=1`
//! (exported by scripts/test-all.sh, which CI runs) it panics with the reason instead, so that a lab
//! or privilege regression fails the run rather than turning tests silently green (libtest counts
//! a test that returns early as passed). The per-lab switches (`KURYR_TEST_REQUIRE_NEUTRON`,
//! `_OCTAVIA`, `_OVN`, `_KUBECTL`) keep working on their own.
//!
//! [`skip_hardware`] is for what no machine of the kind the tests run on (CI's included) offers:
//! VLAN devices, SR-IOV NICs. It prints the reason and never panics.
//!
//! Only std, on purpose: crates kuryr-testbed depends on (the emulators), or that would build the
//! controller just for this (the daemon, the CNI plugin), include this very file with
//! `#[path = ".../kuryr-testbed/src/skip.rs"] mod skip;` instead of depending on the crate.

/// `1` turns every [`skip`] into a failure.
pub const REQUIRE_ALL_VAR: &str = "KURYR_TEST_REQUIRE_ALL";

/// Skips the calling test (which then returns): prints `skipping: <reason>`, or panics with the
/// reason under `KURYR_TEST_REQUIRE_ALL=1` (naming the caller's line).
#[track_caller]
pub fn skip(reason: impl std::fmt::Display) {
    let reason = reason.to_string();
    if let Some(failure) = refusal(&reason, std::env::var(REQUIRE_ALL_VAR).ok().as_deref()) {
        panic!("{failure}");
    }
    eprintln!("skipping: {reason}");
}

/// Skips for want of hardware or a kernel feature this kind of machine never has: prints
/// `skipping: <reason>` and never panics, `KURYR_TEST_REQUIRE_ALL=1` or not.
pub fn skip_hardware(reason: impl std::fmt::Display) {
    eprintln!("skipping: {reason} (hardware or kernel feature: allowed under {REQUIRE_ALL_VAR}=1)");
}

/// What [`skip`] fails with for the given value of `KURYR_TEST_REQUIRE_ALL` (`None` = unset), or
/// `None` when the skip is allowed.
pub fn refusal(reason: &str, require_all: Option<&str>) -> Option<String> {
    match require_all.map(str::trim) {
        None | Some("" | "0") => None,
        Some("1") => Some(format!(
            "{REQUIRE_ALL_VAR}=1 but this test could not run what it tests: {reason}"
        )),
        Some(other) => Some(format!(
            "{REQUIRE_ALL_VAR} must be 0 or 1, got {other:?} (the test would have skipped: {reason})"
        )),
    }
}
