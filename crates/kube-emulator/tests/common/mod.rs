//! Helpers shared by the integration tests.

use std::time::Duration;

/// Polls `f` every 50 ms for up to 10 s.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}
