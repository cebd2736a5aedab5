//! The one reading of the real-server test variables, shared by the contract suite and the test bed:
//! `KURYR_TEST_NEUTRON_URL` (the real neutron-server; tests skip it, saying why, when unset) and
//! `KURYR_TEST_REQUIRE_NEUTRON=1` (set by scripts/test-all.sh: an unset URL is then an error, never a silent skip).

pub const NEUTRON_URL_VAR: &str = "KURYR_TEST_NEUTRON_URL";
pub const REQUIRE_NEUTRON_VAR: &str = "KURYR_TEST_REQUIRE_NEUTRON";

/// The real neutron-server's URL from the environment: `Ok(None)` means "skip the real-server target", an `Err`
/// (with the reason) means the run must fail.
pub fn real_neutron_url() -> Result<Option<String>, String> {
    real_neutron_url_from(
        std::env::var(NEUTRON_URL_VAR).ok().as_deref(),
        std::env::var(REQUIRE_NEUTRON_VAR).ok().as_deref(),
    )
}

/// [`real_neutron_url`] on given values (`None` = variable unset).
pub fn real_neutron_url_from(url: Option<&str>, require: Option<&str>) -> Result<Option<String>, String> {
    match url.map(str::trim) {
        Some(u) if !u.is_empty() => Ok(Some(u.to_owned())),
        _ => match require.map(str::trim) {
            None | Some("" | "0") => Ok(None),
            Some("1") => Err(format!(
                "{REQUIRE_NEUTRON_VAR}=1 but {NEUTRON_URL_VAR} is unset: the real neutron-server tests must run \
                 (scripts/neutron-lab/start-neutron.sh starts one)"
            )),
            Some(other) => Err(format!("{REQUIRE_NEUTRON_VAR} must be 0 or 1, got {other:?}")),
        },
    }
}

/// Why the real-server target is skipped, for the skip message.
pub fn skip_reason() -> String {
    format!(
        "{NEUTRON_URL_VAR} is unset (scripts/neutron-lab/start-neutron.sh starts one; scripts/test-all.sh sets it)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_wins_unset_skips_unless_required() {
        let url = "http://127.0.0.1:9696";
        assert_eq!(
            real_neutron_url_from(Some(url), Some("1")),
            Ok(Some(url.to_owned()))
        );
        assert_eq!(real_neutron_url_from(Some(url), None), Ok(Some(url.to_owned())));
        assert_eq!(real_neutron_url_from(None, None), Ok(None));
        assert_eq!(real_neutron_url_from(Some(""), Some("0")), Ok(None));
        let e = real_neutron_url_from(None, Some("1")).expect_err("required");
        assert!(
            e.contains(NEUTRON_URL_VAR) && e.contains(REQUIRE_NEUTRON_VAR),
            "{e}"
        );
        assert!(real_neutron_url_from(Some(" "), Some("1")).is_err());
        assert!(real_neutron_url_from(None, Some("yes")).is_err());
    }
}
