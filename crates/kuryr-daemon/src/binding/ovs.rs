//! `ovs-vsctl` wrapper, availability probe and the userspace-datapath fixup.

use std::path::PathBuf;

use crate::netlink::NetNs;

use super::BindingError;

/// Whether Open vSwitch can be driven on this node, and how to reach it.
#[derive(Clone, Debug)]
pub struct OvsProbe {
    vsctl: Option<PathBuf>,
    db: Option<String>,
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
    /// Look for `ovs-vsctl` and ask ovsdb-server at `db` (an ovsdb
    /// connection string such as `unix:/run/openvswitch/db.sock`; `None` is
    /// ovs-vsctl's default) whether it answers. Works with the kernel and the
    /// userspace (netdev) datapath alike: only the database has to answer.
    pub async fn detect(timeout_secs: u32, db: Option<&str>) -> Self {
        let mut probe = Self {
            vsctl: find_in_path("ovs-vsctl"),
            db: db.map(str::to_owned),
            db_error: None,
            timeout_secs,
        };
        if probe.vsctl.is_some()
            && let Err(e) = probe.vsctl(&["show"]).await
        {
            probe.db_error = Some(e.to_string());
        }
        probe
    }

    /// `true` when `ovs-vsctl` exists (so OVS ports may have been created).
    pub fn installed(&self) -> bool {
        self.vsctl.is_some()
    }

    /// `None` when OVS is usable, else a human readable reason.
    pub fn unavailable_reason(&self) -> Option<String> {
        match (&self.vsctl, &self.db_error) {
            (None, _) => Some("ovs-vsctl is not installed (not in PATH)".into()),
            (Some(_), Some(e)) => Some(format!("ovsdb-server does not answer: {e}")),
            (Some(_), None) => None,
        }
    }

    /// Run `ovs-vsctl [--db=DB] --timeout=N <args>`; stdout on success.
    pub async fn vsctl<S: AsRef<str>>(&self, args: &[S]) -> Result<String, BindingError> {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        let joined = args.join(" ");
        let Some(bin) = &self.vsctl else {
            return Err(BindingError::Ovs {
                args: joined,
                message: "ovs-vsctl is not installed".into(),
            });
        };
        let mut cmd = tokio::process::Command::new(bin);
        if let Some(db) = &self.db {
            cmd.arg(format!("--db={db}"));
        }
        let out = cmd
            .arg(format!("--timeout={}", self.timeout_secs))
            .args(&args)
            // A hung ovs-vsctl must not outlive a cancelled request.
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|source| BindingError::OvsExec {
                args: joined.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(BindingError::Ovs {
                args: joined,
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `datapath_type` of `bridge` (`""` and `system` mean the kernel
    /// datapath), or `None` when the bridge does not exist.
    pub async fn bridge_datapath(&self, bridge: &str) -> Result<Option<String>, BindingError> {
        // One ovs-vsctl run: `--if-exists get` prints nothing for a missing
        // bridge and `""` for an existing one without a datapath_type.
        let dp = self
            .vsctl(&["--if-exists", "get", "Bridge", bridge, "datapath_type"])
            .await?;
        Ok(parse_datapath(&dp))
    }

    /// Create the missing `bridge` with `datapath_type`. Only called for a
    /// bridge that does not exist: an existing one keeps the datapath its
    /// owner (the Neutron agent) chose.
    pub async fn create_bridge(&self, bridge: &str, datapath_type: &str) -> Result<(), BindingError> {
        let dp = format!("datapath_type={datapath_type}");
        self.vsctl(&[
            "--may-exist",
            "add-br",
            bridge,
            "--",
            "set",
            "Bridge",
            bridge,
            dp.as_str(),
        ])
        .await
        .map(drop)
    }

    /// The OVS interface's error column (empty when vswitchd attached it).
    pub async fn interface_error(&self, iface: &str) -> Result<String, BindingError> {
        let e = self
            .vsctl(&["--if-exists", "get", "Interface", iface, "error"])
            .await?;
        Ok(unquote(e.trim()).to_string())
    }
}

/// `--if-exists get Bridge B datapath_type` output: nothing when the bridge
/// does not exist, else its (possibly empty, quoted) datapath type.
fn parse_datapath(out: &str) -> Option<String> {
    let out = out.trim();
    if out.is_empty() {
        return None;
    }
    Some(unquote(out).to_string())
}

/// ovs-vsctl prints strings quoted when they contain special characters and
/// `[]` for an empty optional column.
fn unquote(s: &str) -> &str {
    if s == "[]" {
        return "";
    }
    s.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(s)
}

/// Whether an OVS `datapath_type` is the userspace one.
pub fn is_userspace_datapath(datapath_type: &str) -> bool {
    datapath_type == "netdev"
}

/// The userspace datapath reads packets from a veth through an AF_PACKET
/// socket and forwards them as they are: a pod stack that leaves the TCP/UDP
/// checksum to the NIC (veths offload it by default) would send packets with
/// a partial checksum that the peer drops. Turn off TX checksum offload on
/// the pod end so the pod's kernel computes it (what `ethtool -K <if> tx off`
/// does).
pub async fn disable_tx_checksum(netns: &NetNs, ifname: &str) -> Result<(), BindingError> {
    let fd = netns.try_clone()?;
    let path = netns.path().to_string();
    let name = ifname.to_string();
    let fail = |message: String| BindingError::Ovs {
        args: format!("(ethtool) {name} tx-checksumming off in {path}"),
        message,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (t_path, t_name) = (path.clone(), name.clone());
    std::thread::Builder::new()
        .name("kuryr-ethtool".into())
        .spawn(move || {
            let r = nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("enter netns {t_path}: {e}"))
                .and_then(|()| ethtool_set_tx_csum(&t_name, false).map_err(|e| e.to_string()));
            let _ = tx.send(r);
            // The thread ends here, so its namespace change dies with it.
        })
        .map_err(|e| fail(e.to_string()))?;
    rx.await
        .map_err(|_| fail("ethtool thread exited without an answer".into()))?
        .map_err(fail)
}

/// `SIOCETHTOOL` / `ETHTOOL_STXCSUM` on the calling thread's namespace.
fn ethtool_set_tx_csum(ifname: &str, on: bool) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    const ETHTOOL_STXCSUM: u32 = 0x17;
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let bytes = ifname.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("invalid interface name {ifname:?}"),
        ));
    }
    let mut value = EthtoolValue {
        cmd: ETHTOOL_STXCSUM,
        data: u32::from(on),
    };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (&raw mut value).cast::<libc::c_char>();
    // SAFETY: plain socket(2) call; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `ifr` points at `value`, both live across the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `Ok(())` when OVS is usable through the database at `db` (`unix:/path`, `tcp:host:port`;
/// `None`: ovs-vsctl's default), `Err(reason)` otherwise.
pub async fn ovs_available_at(db: Option<&str>) -> Result<(), String> {
    match OvsProbe::detect(5, db).await.unavailable_reason() {
        None => Ok(()),
        Some(r) => Err(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datapath_output_tells_a_missing_bridge_from_an_empty_type() {
        assert_eq!(parse_datapath(""), None);
        assert_eq!(parse_datapath("\n"), None);
        assert_eq!(parse_datapath("\"\"\n"), Some(String::new()));
        assert_eq!(parse_datapath("netdev\n"), Some("netdev".into()));
        assert_eq!(parse_datapath("system"), Some("system".into()));
    }

    /// An ovs-vsctl that cannot be run keeps the OS error as the source.
    #[tokio::test]
    async fn exec_failures_keep_their_source() {
        let probe = OvsProbe {
            vsctl: Some(PathBuf::from("/nonexistent/ovs-vsctl")),
            db: None,
            db_error: None,
            timeout_secs: 1,
        };
        let err = probe
            .vsctl(&["--if-exists", "del-port", "tap0"])
            .await
            .expect_err("no binary");
        let source = std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .map(std::io::Error::kind);
        assert_eq!(source, Some(std::io::ErrorKind::NotFound), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("ovs-vsctl --if-exists del-port tap0: "),
            "{err}"
        );
    }
}
