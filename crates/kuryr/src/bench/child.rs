//! The controllers as child processes, and what /proc says they used.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::Impl;

pub struct Controller {
    child: Child,
    pub pid: u32,
    pub log: PathBuf,
}

/// Where each implementation's controller executable is.
pub struct Programs {
    pub kuryr_rs: PathBuf,
    /// `kuryr-k8s-controller` of the upstream venv, when there is one.
    pub upstream: Option<PathBuf>,
}

impl Programs {
    pub fn find(kuryr_bin: Option<&Path>, upstream_python: Option<&Path>) -> anyhow::Result<Self> {
        let kuryr_rs = match kuryr_bin {
            Some(p) => p.to_path_buf(),
            None => std::env::current_exe().context("locating the kuryr binary")?,
        };
        let upstream = upstream_python
            .and_then(Path::parent)
            .map(|bin| bin.join("kuryr-k8s-controller"))
            .filter(|p| p.exists());
        Ok(Self { kuryr_rs, upstream })
    }
}

impl Controller {
    pub fn spawn(which: Impl, programs: &Programs, conf: &Path, log: PathBuf) -> anyhow::Result<Self> {
        let mut cmd = match which {
            Impl::KuryrRs => {
                let mut c = Command::new(&programs.kuryr_rs);
                c.arg("controller").arg("--config-file").arg(conf);
                c
            }
            Impl::Upstream => {
                let Some(exe) = &programs.upstream else {
                    bail!(
                        "upstream kuryr-k8s-controller not found: run scripts/upstream-kuryr-venv.sh and pass \
                         its output as --upstream-python (or set KURYR_TEST_UPSTREAM_PYTHON)"
                    );
                };
                let mut c = Command::new(exe);
                c.arg("--config-file").arg(conf);
                c
            }
        };
        let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        // Both read the API server from kuryr.conf's api_root, not from the caller's kubeconfig.
        cmd.env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting the {} controller", which.label()))?;
        let pid = child.id().context("controller exited at once")?;
        Ok(Self { child, pid, log })
    }

    /// Waits for `/ready` on the health port (both serve it there).
    pub async fn wait_ready(&mut self, health_port: u16, timeout: Duration) -> anyhow::Result<Duration> {
        self.wait_ready_every(health_port, timeout, Duration::from_millis(100))
            .await
    }

    /// [`Controller::wait_ready`], asking every `poll`.
    pub async fn wait_ready_every(
        &mut self,
        health_port: u16,
        timeout: Duration,
        poll: Duration,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the controller exited ({status}) before it was ready; its log: {}",
                    self.log.display()
                );
            }
            if http_ok(health_port, "/ready").await {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!(
                    "the controller was not ready after {}s; its log: {}",
                    timeout.as_secs(),
                    self.log.display()
                );
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// SIGKILL, as a crash or an OOM kill would end it: nothing is flushed.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// SIGTERM, then SIGKILL after a grace period.
    pub async fn stop(mut self) {
        if let Ok(pid) = i32::try_from(self.pid) {
            // SAFETY: kill(2) on the pid of a child this process started and has not reaped.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// A plain HTTP/1.0 GET on 127.0.0.1: true on a 2xx status line.
async fn http_ok(port: u16, path: &str) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    };
    match tokio::time::timeout(Duration::from_secs(2), attempt).await {
        Ok(Ok(head)) => head.starts_with(b"HTTP/1.") && head[9] == b'2',
        _ => false,
    }
}

/// A plain HTTP/1.0 GET on 127.0.0.1: the body of a 2xx answer.
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut text = String::new();
        s.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .with_context(|| format!("GET {path} on port {port} timed out"))??;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !(head.starts_with("HTTP/1.") && head.as_bytes().get(9) == Some(&b'2')) {
        bail!(
            "GET {path} on port {port}: {}",
            head.lines().next().unwrap_or_default()
        );
    }
    Ok(body.to_string())
}

/// ERROR lines in the controller logs (`controller*.log`) of one run's directory, so a run that
/// looked fine in its figures but logged failures shows it.
pub fn controller_error_lines(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("controller") && name.ends_with(".log")
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|log| crate::chaos::procs::error_lines(&log).len())
        .sum()
}

/// CPU time and peak resident memory of a process and its descendants.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub cpu_secs: f64,
    pub peak_rss_kib: u64,
}

/// Reads `/proc/<pid>/stat` (utime + stime) and `/proc/<pid>/status` (VmHWM) of `pid` and every
/// process below it.
pub fn usage(pid: u32) -> Usage {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    let mut total = Usage::default();
    for p in tree(pid) {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat"))
            && let Some((utime, stime)) = parse_cpu_ticks(&stat)
        {
            total.cpu_secs += (utime + stime) as f64 / ticks;
        }
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{p}/status")) {
            total.peak_rss_kib += parse_vm_hwm_kib(&status).unwrap_or(0);
        }
    }
    total
}

/// CPU time of this process alone (the emulators serving a run, the pod creator), not its
/// children: utime + stime of `/proc/self/stat`.
pub fn own_cpu_secs() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| parse_cpu_ticks(&stat))
        .map_or(0.0, |(u, s)| (u + s) as f64 / ticks)
}

/// `pid` and its descendants (from each process' `children` file).
fn tree(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                out.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
            }
        }
        i += 1;
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// utime and stime (fields 14 and 15) of a `/proc/<pid>/stat` line; the command name in
/// parentheses may hold spaces, so fields are counted after its closing parenthesis.
pub fn parse_cpu_ticks(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ")": field 3 (state) is index 0, so field N is index N - 3.
    Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
}

pub fn parse_vm_hwm_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_after_a_command_name_with_spaces() {
        let stat = "4242 (kuryr k8s (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 731 42 0 0 20 0 9 0 100";
        assert_eq!(parse_cpu_ticks(stat), Some((731, 42)));
    }

    #[test]
    fn vm_hwm() {
        let status = "Name:\tkuryr\nVmPeak:\t  999 kB\nVmHWM:\t   23456 kB\nVmRSS:\t 20000 kB\n";
        assert_eq!(parse_vm_hwm_kib(status), Some(23456));
        assert_eq!(parse_vm_hwm_kib("Name: x\n"), None);
    }

    #[test]
    fn error_lines_of_every_controller_log_of_a_run_count() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(controller_error_lines(dir.path()), 0);
        std::fs::write(
            dir.path().join("controller-1.log"),
            "2026-11-25T08:00:00Z  INFO kuryr: ready\n2026-11-25T08:00:01Z ERROR kuryr_controller: failed\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("controller-2.log"),
            "2026-11-25 08:00:02.000 77 ERROR kuryr_kubernetes.handlers [-] failed\n",
        )
        .unwrap();
        // Not a controller's log.
        std::fs::write(
            dir.path().join("neutron.log"),
            "2026-11-25T08:00:03Z ERROR x: y\n",
        )
        .unwrap();
        assert_eq!(controller_error_lines(dir.path()), 2);
    }

    #[test]
    fn own_process_is_measured() {
        let u = usage(std::process::id());
        assert!(u.peak_rss_kib > 0, "{u:?}");
    }
}
