//! The soak's child processes: this same `kuryr` binary run as `kuryr controller`, each with
//! its own log file, killed and started again on demand.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// One supervised process.
pub struct Proc {
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    /// Run through `ip netns exec <ns>` when set.
    netns: Option<String>,
    log: PathBuf,
    child: Option<Child>,
    pub starts: u32,
}

impl Proc {
    pub fn new(name: &str, args: Vec<String>, netns: Option<String>, log_dir: &Path) -> anyhow::Result<Self> {
        let program = std::env::current_exe().context("the path of this kuryr binary")?;
        Ok(Self {
            name: name.to_string(),
            program,
            args,
            netns,
            log: log_dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        })
    }

    /// Starts it unless it runs (a second kill of a stopped replica must not start two).
    pub fn start(&mut self) -> anyhow::Result<()> {
        if self
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
        {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("log file {}", self.log.display()))?;
        let err = log.try_clone()?;
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        cmd.args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("KURYR_CHAOS_CHILD_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {} ({})", self.name, self.program.display()))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    /// Whether it exited on its own (a crash the soak did not cause).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends `signal` and waits for the exit (SIGKILL after `grace` if it is still running).
    pub async fn stop(&mut self, signal: Signal, grace: Duration) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
            // Through `ip netns exec` the pid is the real process: ip execs it.
            kill(Pid::from_raw(pid), signal).with_context(|| format!("{signal} to {}", self.name))?;
        }
        match tokio::time::timeout(grace, child.wait()).await {
            Ok(r) => {
                r.with_context(|| format!("waiting for {}", self.name))?;
            }
            Err(_) => {
                child.kill().await?;
            }
        }
        Ok(())
    }

    /// Lines of its log at ERROR level.
    pub fn error_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .map(|s| error_lines(&s))
            .unwrap_or_default()
    }
}

/// The lines of a log at ERROR level (the level field, not the word in a message): a tracing
/// line (`<time> ERROR target: ...`) or, for upstream's controller in `kuryr bench`, an oslo.log
/// line (`<date> <time> <pid> ERROR name ...`).
pub fn error_lines(log: &str) -> Vec<String> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().take(4).collect();
            f.get(1) == Some(&"ERROR")
                || (f.get(3) == Some(&"ERROR") && f.get(2).is_some_and(|pid| pid.parse::<u32>().is_ok()))
        })
        .collect()
}

/// Without terminal colour sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lines_at_error_level_count() {
        let log = "2026-11-24T10:00:00.000000Z  INFO kuryr_controller: an ERROR in a message\n\
                   2026-11-24T10:00:01.000000Z ERROR kuryr_controller::pipeline: handler failed\n\
                   \u{1b}[2m2026-11-24T10:00:02.000000Z\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m colored\n\
                   2026-11-24T10:00:03.000000Z  WARN kuryr_controller: retry\n\
                   2026-11-24 10:00:04.123 4242 ERROR kuryr_kubernetes.handlers.retry [-] oslo failure\n\
                   2026-11-24 10:00:05.123 4242 WARNING kuryr_kubernetes.x [-] ERROR in a message\n\
                   2026-11-24 10:00:06.123 word ERROR not a pid\n";
        let lines = error_lines(log);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains("handler failed"));
        assert!(lines[2].contains("oslo failure"));
    }
}
