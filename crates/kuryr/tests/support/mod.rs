//! What the tests that run `kuryr` as a child process share.

use std::path::Path;
use std::process::Stdio;

use anyhow::Result;
use tokio::process::{Child, Command};

/// `kuryr controller` as a child process (killed when dropped), its output appended to `log`.
pub fn controller(conf: &Path, kubeconfig: &Path, log: &Path) -> Result<Child> {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    let err = out.try_clone()?;
    Ok(Command::new(env!("CARGO_BIN_EXE_kuryr"))
        .arg("controller")
        .arg("--config-file")
        .arg(conf)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(true)
        .spawn()?)
}
