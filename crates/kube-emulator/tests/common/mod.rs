//! Helpers shared by the integration tests.

use std::time::Duration;

/// Polls `f` every 50 ms until it holds. Generous (120 s): a loaded machine must not fail what
/// only takes longer.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while tokio::time::Instant::now() < deadline {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}
