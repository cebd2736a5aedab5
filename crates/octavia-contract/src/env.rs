//! The real-Octavia test variables: `KURYR_TEST_OCTAVIA_URL` (the real Octavia; its target is skipped, saying why,
//! when unset) and `KURYR_TEST_REQUIRE_OCTAVIA=1` (an unset URL is then an error, never a silent skip).

pub const OCTAVIA_URL_VAR: &str = "KURYR_TEST_OCTAVIA_URL";
pub const REQUIRE_OCTAVIA_VAR: &str = "KURYR_TEST_REQUIRE_OCTAVIA";

/// `Ok(None)` means "skip the real Octavia", an `Err` (with the reason) means the run must fail.
pub fn real_octavia_url() -> Result<Option<String>, String> {
    real_octavia_url_from(
        std::env::var(OCTAVIA_URL_VAR).ok().as_deref(),
        std::env::var(REQUIRE_OCTAVIA_VAR).ok().as_deref(),
    )
}

/// [`real_octavia_url`] on given values (`None` = variable unset).
pub fn real_octavia_url_from(url: Option<&str>, require: Option<&str>) -> Result<Option<String>, String> {
    match url.map(str::trim) {
        Some(u) if !u.is_empty() => Ok(Some(u.to_owned())),
        _ => match require.map(str::trim) {
            None | Some("" | "0") => Ok(None),
            Some("1") => Err(format!(
                "{REQUIRE_OCTAVIA_VAR}=1 but {OCTAVIA_URL_VAR} is unset: the real Octavia tests must run \
                 (scripts/octavia-lab/start-octavia.sh starts one)"
            )),
            Some(other) => Err(format!("{REQUIRE_OCTAVIA_VAR} must be 0 or 1, got {other:?}")),
        },
    }
}

pub fn skip_reason() -> String {
    format!(
        "{OCTAVIA_URL_VAR} is unset (scripts/octavia-lab/start-octavia.sh starts a real Octavia on :9876)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_wins_unset_skips_unless_required() {
        let url = "http://127.0.0.1:9876";
        assert_eq!(
            real_octavia_url_from(Some(url), Some("1")),
            Ok(Some(url.to_owned()))
        );
        assert_eq!(real_octavia_url_from(None, None), Ok(None));
        assert_eq!(real_octavia_url_from(Some(" "), Some("0")), Ok(None));
        let e = real_octavia_url_from(None, Some("1")).expect_err("required");
        assert!(
            e.contains(OCTAVIA_URL_VAR) && e.contains(REQUIRE_OCTAVIA_VAR),
            "{e}"
        );
        assert!(real_octavia_url_from(None, Some("yes")).is_err());
    }
}
