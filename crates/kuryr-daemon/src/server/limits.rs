//! How much the daemon's servers take on at once and how long they wait for
//! a client, and how many file descriptors API connections may use.

use std::net::SocketAddr;
use std::time::Duration;

/// Descriptors kept back from API connections: the health and metrics
/// servers, the Kubernetes client, state files, netlink sockets, OVS tools.
pub const FD_RESERVE: u64 = 256;
/// Descriptors one in-flight ADD may hold (netns, netlink, child pipes).
pub const FDS_PER_ADD: u64 = 4;
/// Connections the health and metrics servers each serve at once; enough for
/// a kubelet and a scraper, small enough to fit in [`FD_RESERVE`].
pub const HEALTH_CONNECTIONS: usize = 32;
/// The fewest API connections the daemon runs with, whatever the budget.
const MIN_CONNECTIONS: usize = 8;

#[derive(Clone, Debug)]
pub struct ServerLimits {
    /// `[cni_daemon] max_connections`.
    pub max_connections: usize,
    /// `[cni_daemon] max_concurrent_adds`.
    pub max_concurrent_adds: usize,
    /// `[cni_daemon] request_read_timeout`: for the request head.
    pub header_timeout: Duration,
    /// `[cni_daemon] request_read_timeout`: for the body, once the head is in.
    pub body_timeout: Duration,
    /// Request line and headers.
    pub max_head_bytes: usize,
    /// A CNI request is a few KiB; this leaves room for big network configs.
    pub max_body_bytes: usize,
    /// `[cni_daemon] allow_non_loopback_bind`.
    pub allow_non_loopback_bind: bool,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self::from_kuryr_config(&kuryr_config::CniDaemonSection::default())
    }
}

impl ServerLimits {
    pub fn from_kuryr_config(c: &kuryr_config::CniDaemonSection) -> Self {
        let read = Duration::from_secs(c.request_read_timeout.max(1));
        Self {
            max_connections: usize::try_from(c.max_connections).unwrap_or(usize::MAX),
            max_concurrent_adds: usize::try_from(c.max_concurrent_adds).unwrap_or(usize::MAX),
            header_timeout: read,
            body_timeout: read,
            max_head_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
            allow_non_loopback_bind: c.allow_non_loopback_bind,
        }
    }

    /// API connections served at once: `max_connections`, but never so many
    /// that the open-file limit `nofile` leaves the health server, the
    /// in-flight ADDs and the rest of the daemon without descriptors.
    pub fn connection_budget(&self, nofile: Option<u64>) -> usize {
        let Some(nofile) = nofile else {
            return self.max_connections.max(MIN_CONNECTIONS);
        };
        let adds = u64::try_from(self.max_concurrent_adds).unwrap_or(u64::MAX);
        let spare = nofile
            .saturating_sub(FD_RESERVE)
            .saturating_sub(adds.saturating_mul(FDS_PER_ADD));
        let spare = usize::try_from(spare).unwrap_or(usize::MAX);
        self.max_connections.min(spare).max(MIN_CONNECTIONS)
    }

    /// The API has no authentication: it listens on loopback unless
    /// `allow_non_loopback_bind` says otherwise.
    pub fn check_bind_address(&self, addr: SocketAddr) -> Result<(), String> {
        if addr.ip().is_loopback() || self.allow_non_loopback_bind {
            return Ok(());
        }
        Err(format!(
            "[cni_daemon] bind_address {addr} is not a loopback address; the CNI API has no \
             authentication, set [cni_daemon] allow_non_loopback_bind = True to serve it there anyway"
        ))
    }
}

/// The soft `RLIMIT_NOFILE` of this process (`None` when unlimited or unreadable).
pub fn open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_limit_bounds_api_connections() {
        let l = ServerLimits {
            max_connections: 1024,
            max_concurrent_adds: 128,
            ..ServerLimits::default()
        };
        assert_eq!(l.connection_budget(None), 1024);
        assert_eq!(l.connection_budget(Some(1 << 20)), 1024);
        // 1024 files: 256 reserved, 128 ADDs x 4 -> 256 for connections.
        assert_eq!(l.connection_budget(Some(1024)), 256);
        assert_eq!(l.connection_budget(Some(100)), MIN_CONNECTIONS);
    }

    #[test]
    fn only_loopback_unless_allowed() {
        let mut l = ServerLimits::default();
        assert!(
            l.check_bind_address("127.0.0.1:5036".parse().unwrap_or_else(|_| unreachable!()))
                .is_ok()
        );
        assert!(
            l.check_bind_address("[::1]:5036".parse().unwrap_or_else(|_| unreachable!()))
                .is_ok()
        );
        let any: SocketAddr = "0.0.0.0:5036".parse().unwrap_or_else(|_| unreachable!());
        assert!(
            l.check_bind_address(any)
                .is_err_and(|e| e.contains("allow_non_loopback_bind"))
        );
        l.allow_non_loopback_bind = true;
        assert!(l.check_bind_address(any).is_ok());
    }
}
