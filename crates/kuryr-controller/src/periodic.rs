//! Periodic passes of the leader (orphan sweeps): the first right away, then every `every`; a
//! failed pass (a cloud unreachable, a race a later pass settles) is tried again sooner, backing
//! off from 2 s up to `every`.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::Error;

const FIRST_RETRY: Duration = Duration::from_secs(2);

/// Runs `pass` until `stop`; `what` names it in the logs, with the count each pass returns.
pub async fn sweeps<F, Fut>(what: &'static str, every: Duration, stop: CancellationToken, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<usize, Error>>,
{
    let mut wait = Duration::ZERO;
    let mut retry = FIRST_RETRY;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        match pass().await {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(released = n, "{what}: released what is gone");
                }
                wait = every;
                retry = FIRST_RETRY;
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?retry, "{what}: sweep failed; retrying");
                wait = retry.min(every);
                retry = (retry * 2).min(every);
            }
        }
    }
}
