//! `ovs-vsctl` wrapper and availability probe.

use std::path::PathBuf;

use super::BindingError;

/// Whether Open vSwitch can be driven on this node.
#[derive(Clone, Debug)]
pub struct OvsProbe {
    vsctl: Option<PathBuf>,
    db_error: Option<String>,
    timeout_secs: u32,
}

fn find_in_path(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(bin))
        .find(|p| p.is_file())
}

impl OvsProbe {
    /// Look for `ovs-vsctl` and ask ovsdb-server whether it answers. Works
    /// with the kernel datapath and with the userspace (netdev) datapath
    /// alike: only the database has to be reachable to add ports.
    pub async fn detect(timeout_secs: u32) -> Self {
        let Some(vsctl) = find_in_path("ovs-vsctl") else {
            return Self {
                vsctl: None,
                db_error: None,
                timeout_secs,
            };
        };
        let mut probe = Self {
            vsctl: Some(vsctl),
            db_error: None,
            timeout_secs,
        };
        if let Err(e) = probe.vsctl(&["show".to_string()]).await {
            probe.db_error = Some(e.to_string());
        }
        probe
    }

    /// `None` when OVS is usable, else a human readable reason.
    pub fn unavailable_reason(&self) -> Option<String> {
        match (&self.vsctl, &self.db_error) {
            (None, _) => Some("ovs-vsctl is not installed (not in PATH)".into()),
            (Some(_), Some(e)) => Some(format!("ovsdb-server does not answer: {e}")),
            (Some(_), None) => None,
        }
    }

    /// Run `ovs-vsctl --timeout=N <args>`.
    pub async fn vsctl(&self, args: &[String]) -> Result<String, BindingError> {
        let joined = args.join(" ");
        let Some(bin) = &self.vsctl else {
            return Err(BindingError::Ovs {
                args: joined,
                message: "ovs-vsctl is not installed".into(),
            });
        };
        let out = tokio::process::Command::new(bin)
            .arg(format!("--timeout={}", self.timeout_secs))
            .args(args)
            .output()
            .await
            .map_err(|e| BindingError::Ovs {
                args: joined.clone(),
                message: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(BindingError::Ovs {
                args: joined,
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// `Ok(())` when OVS is usable, `Err(reason)` otherwise (for tests and /ready).
pub async fn ovs_available() -> Result<(), String> {
    match OvsProbe::detect(5).await.unavailable_reason() {
        None => Ok(()),
        Some(r) => Err(r),
    }
}
