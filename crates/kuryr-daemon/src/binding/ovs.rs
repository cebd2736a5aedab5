//! Open vSwitch for the binding: ports added, replaced, removed and checked in
//! the `Open_vSwitch` database over its management protocol (`ovsdb.rs`), the
//! availability probe, and the userspace-datapath fixup.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::netlink::NetNs;

use super::BindingError;
use super::ovsdb::{self, Ovsdb, OvsdbError, eq, first_row, named, select, uuid};

/// ovs-vsctl's default database: `$OVS_RUNDIR/db.sock`, else the packages'
/// run directory.
fn default_db() -> String {
    let rundir = std::env::var("OVS_RUNDIR").unwrap_or_else(|_| "/var/run/openvswitch".into());
    format!("unix:{rundir}/db.sock")
}

/// Where a node's Open vSwitch is, and whether it answers.
#[derive(Clone, Debug)]
pub struct OvsProbe {
    db: String,
    db_error: Option<String>,
    timeout: Duration,
}

impl OvsProbe {
    /// Asks ovsdb-server at `db` (an ovsdb connection string such as
    /// `unix:/run/openvswitch/db.sock`; `None` is ovs-vsctl's default)
    /// whether it answers. Works with the kernel and the userspace (netdev)
    /// datapath alike: only the database has to answer.
    pub async fn detect(timeout_secs: u32, db: Option<&str>) -> Self {
        let mut probe = Self::locate(timeout_secs, db);
        probe.ask_db().await;
        probe
    }

    /// The database named, not asked: the binding's operations talk to it
    /// directly and ask whether it answers only when one failed
    /// ([`OvsProbe::ask_db`]).
    pub fn locate(timeout_secs: u32, db: Option<&str>) -> Self {
        Self {
            db: db.map_or_else(default_db, str::to_owned),
            db_error: None,
            timeout: Duration::from_secs(u64::from(timeout_secs.max(1))),
        }
    }

    /// Asks the database whether it answers, for
    /// [`OvsProbe::unavailable_reason`].
    pub async fn ask_db(&mut self) {
        let answer = async {
            let mut c = Ovsdb::connect(&self.db, self.timeout).await?;
            let dbs = c.list_dbs().await?;
            if dbs.iter().any(|d| d == "Open_vSwitch") {
                Ok(())
            } else {
                Err(OvsdbError::Protocol(format!(
                    "it serves no Open_vSwitch database ({dbs:?})"
                )))
            }
        };
        self.db_error = answer.await.err().map(|e| e.to_string());
    }

    /// Whether Open vSwitch may be on this node (so OVS ports may have been
    /// created): its socket's directory exists (a stopped OVS keeps it) or
    /// the database is reached over TCP.
    pub fn installed(&self) -> bool {
        match self.db.strip_prefix("unix:") {
            Some(path) => Path::new(path).parent().is_some_and(Path::exists),
            None => true,
        }
    }

    /// `None` when OVS is usable (as far as asked), else a human readable reason.
    pub fn unavailable_reason(&self) -> Option<String> {
        if !self.installed() {
            return Some(format!("Open vSwitch is not installed here (no {})", self.db));
        }
        self.db_error
            .as_ref()
            .map(|e| format!("ovsdb-server does not answer: {e}"))
    }

    async fn connect(&self, what: &str) -> Result<Ovsdb, BindingError> {
        Ovsdb::connect(&self.db, self.timeout)
            .await
            .map_err(|e| fail(what, e))
    }

    /// Adds `iface` to `bridge` with `external_ids` in one transaction and
    /// waits for ovs-vswitchd to apply it; a port record of that name an
    /// interrupted setup left on any bridge is removed first. `Ok(None)` when
    /// the bridge does not exist (nothing was changed).
    pub async fn replace_port(
        &self,
        bridge: &str,
        iface: &str,
        external_ids: &[(&str, &str)],
    ) -> Result<Option<Added>, BindingError> {
        let what = format!("add-port {bridge} {iface}");
        let mut c = self.connect(&what).await?;
        let found = c
            .transact(vec![
                select(
                    "Bridge",
                    json!([eq("name", json!(bridge))]),
                    &["_uuid", "datapath_type"],
                ),
                select("Port", json!([eq("name", json!(iface))]), &["_uuid"]),
                select("Interface", json!([eq("name", json!(iface))]), &["_uuid"]),
            ])
            .await
            .map_err(|e| fail(&what, e))?;
        let Some(br) = first_row(&found[0]) else {
            return Ok(None);
        };
        let br_uuid = ovsdb::row_uuid(br).unwrap_or_default().to_string();
        let datapath = ovsdb::optional_string(&br["datapath_type"]).to_string();
        // What an interrupted setup (or a hand-made port) left under this
        // name: the Port of that name, and whichever Port holds an Interface
        // of that name (names are unique in both tables, so either would
        // refuse the insert below).
        let mut stale: Vec<String> = first_row(&found[1])
            .and_then(ovsdb::row_uuid)
            .map(str::to_string)
            .into_iter()
            .collect();
        if let Some(old_iface) = first_row(&found[2]).and_then(ovsdb::row_uuid) {
            let holders = c
                .transact(vec![select(
                    "Port",
                    json!([["interfaces", "includes", uuid(old_iface)]]),
                    &["_uuid"],
                )])
                .await
                .map_err(|e| fail(&what, e))?;
            stale.extend(
                ovsdb::rows(&holders[0])
                    .iter()
                    .filter_map(|r| ovsdb::row_uuid(r))
                    .map(str::to_string),
            );
        }
        stale.sort();
        stale.dedup();
        if !stale.is_empty() {
            // Removed, and applied, on their own: replaced in the same
            // transaction, vswitchd would keep the old port's device open
            // (same name) instead of the veth made again since.
            let ops = stale
                .iter()
                .map(|port| {
                    json!({"op": "mutate", "table": "Bridge", "where": [],
                        "mutations": [["ports", "delete", uuid(port)]]})
                })
                .collect();
            c.transact_applied(ops).await.map_err(|e| fail(&what, e))?;
        }
        let ops = vec![
            json!({"op": "insert", "table": "Interface", "uuid-name": "iface",
                "row": {"name": iface, "external_ids": ovsdb::string_map(external_ids.iter().copied())}}),
            json!({"op": "insert", "table": "Port", "uuid-name": "port",
                "row": {"name": iface, "interfaces": named("iface")}}),
            json!({"op": "mutate", "table": "Bridge", "where": [eq("_uuid", uuid(&br_uuid))],
                "mutations": [["ports", "insert", named("port")]]}),
        ];
        // The bridge's mutate: it must have found the bridge.
        let attach = 2;
        let results = c.transact_applied(ops).await.map_err(|e| fail(&what, e))?;
        if results[attach]["count"].as_i64() != Some(1) {
            // Deleted meanwhile: the new rows, referenced by nothing, went
            // with the commit.
            return Err(BindingError::Ovs {
                args: what,
                message: format!("bridge {bridge} was deleted while the port was being added"),
            });
        }
        let iface_row = c
            .transact(vec![select(
                "Interface",
                json!([eq("name", json!(iface))]),
                &["error"],
            )])
            .await
            .map_err(|e| fail(&what, e))?;
        let error = first_row(&iface_row[0])
            .map(|r| ovsdb::optional_string(&r["error"]).to_string())
            .unwrap_or_default();
        Ok(Some(Added { datapath, error }))
    }

    /// Creates the missing `bridge` with `datapath_type` (as `ovs-vsctl
    /// --may-exist add-br` with it). Only called for a bridge that does not
    /// exist: an existing one keeps the datapath its owner (the Neutron
    /// agent) chose.
    pub async fn create_bridge(&self, bridge: &str, datapath_type: &str) -> Result<(), BindingError> {
        let what = format!("add-br {bridge}");
        let mut c = self.connect(&what).await?;
        let ops = vec![
            json!({"op": "insert", "table": "Interface", "uuid-name": "iface",
                "row": {"name": bridge, "type": "internal"}}),
            json!({"op": "insert", "table": "Port", "uuid-name": "port",
                "row": {"name": bridge, "interfaces": named("iface")}}),
            json!({"op": "insert", "table": "Bridge", "uuid-name": "bridge",
                "row": {"name": bridge, "datapath_type": datapath_type, "ports": named("port")}}),
            json!({"op": "mutate", "table": "Open_vSwitch", "where": [],
                "mutations": [["bridges", "insert", named("bridge")]]}),
        ];
        match c.transact_applied(ops).await {
            Ok(_) => Ok(()),
            // The names are unique: either the bridge was made by someone
            // else meanwhile, or a Port or Interface already has its name.
            Err(OvsdbError::Operation { error, details }) if error == "constraint violation" => {
                let found = c
                    .transact(vec![select(
                        "Bridge",
                        json!([eq("name", json!(bridge))]),
                        &["_uuid"],
                    )])
                    .await
                    .map_err(|e| fail(&what, e))?;
                if first_row(&found[0]).is_some() {
                    return Ok(());
                }
                Err(BindingError::Ovs {
                    args: what,
                    message: format!(
                        "bridge {bridge} cannot be created: a port or interface of that name exists ({details})"
                    ),
                })
            }
            Err(e) => Err(fail(&what, e)),
        }
    }

    /// Removes the port `iface` from whichever bridge holds it (it may have
    /// been moved since setup), if there is one, and waits for ovs-vswitchd
    /// to apply it.
    pub async fn del_port(&self, iface: &str) -> Result<(), BindingError> {
        let what = format!("--if-exists del-port {iface}");
        let mut c = self.connect(&what).await?;
        let found = c
            .transact(vec![select(
                "Port",
                json!([eq("name", json!(iface))]),
                &["_uuid"],
            )])
            .await
            .map_err(|e| fail(&what, e))?;
        let Some(port) = first_row(&found[0]).and_then(ovsdb::row_uuid) else {
            return Ok(());
        };
        let ops = vec![json!({"op": "mutate", "table": "Bridge", "where": [],
            "mutations": [["ports", "delete", uuid(port)]]})];
        c.transact_applied(ops)
            .await
            .map(drop)
            .map_err(|e| fail(&what, e))
    }

    /// The bridge the port `iface` is on and its `external_ids:iface-id`;
    /// `None` when no such port exists.
    pub async fn port_of(&self, iface: &str) -> Result<Option<(String, String)>, BindingError> {
        let what = format!("port-to-br {iface}");
        let mut c = self.connect(&what).await?;
        let found = c
            .transact(vec![
                select("Port", json!([eq("name", json!(iface))]), &["_uuid"]),
                select("Interface", json!([eq("name", json!(iface))]), &["external_ids"]),
            ])
            .await
            .map_err(|e| fail(&what, e))?;
        let Some(port) = first_row(&found[0]).and_then(ovsdb::row_uuid) else {
            return Ok(None);
        };
        let iface_id = first_row(&found[1])
            .and_then(|r| ovsdb::map_get(&r["external_ids"], "iface-id"))
            .unwrap_or_default()
            .to_string();
        let bridges = c
            .transact(vec![select(
                "Bridge",
                json!([["ports", "includes", uuid(port)]]),
                &["name"],
            )])
            .await
            .map_err(|e| fail(&what, e))?;
        Ok(first_row(&bridges[0]).map(|b| (b["name"].as_str().unwrap_or_default().to_string(), iface_id)))
    }
}

/// What [`OvsProbe::replace_port`] did: the bridge's datapath type and the
/// interface's error column once vswitchd applied it (empty when it attached
/// the interface).
#[derive(Clone, Debug)]
pub struct Added {
    pub datapath: String,
    pub error: String,
}

/// An ovsdb failure of the binding operation `what`: unreachable (the
/// connection) or refused (the server's answer).
fn fail(what: &str, e: OvsdbError) -> BindingError {
    if e.is_unreachable() {
        BindingError::OvsUnreachable {
            args: what.to_string(),
            source: e,
        }
    } else {
        BindingError::Ovs {
            args: what.to_string(),
            message: e.to_string(),
        }
    }
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
    let name = ifname.to_string();
    netns
        .run_in("ethtool: tx-checksumming off", move || {
            ethtool_set_tx_csum(&name, false)
        })
        .await
        .map_err(|e| BindingError::Ovs {
            args: format!("(ethtool) {ifname} tx-checksumming off in {}", netns.path()),
            message: e.to_string(),
        })
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

    /// A database that is not there: unreachable, with the I/O error kept as
    /// the source, named by the operation; the probe says why.
    #[tokio::test]
    async fn an_absent_database_is_unreachable_and_keeps_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("unix:{}/db.sock", dir.path().display());
        let probe = OvsProbe::detect(1, Some(&db)).await;
        assert!(probe.installed(), "its directory exists");
        let reason = probe.unavailable_reason().expect("unavailable");
        assert!(reason.starts_with("ovsdb-server does not answer: "), "{reason}");
        let err = probe.del_port("tap0").await.expect_err("no database");
        assert!(matches!(err, BindingError::OvsUnreachable { .. }), "{err:?}");
        assert!(
            err.to_string().starts_with("ovsdb --if-exists del-port tap0: "),
            "{err}"
        );
        let io = std::error::Error::source(&err)
            .and_then(std::error::Error::source)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .map(std::io::Error::kind);
        assert_eq!(io, Some(std::io::ErrorKind::NotFound), "{err:?}");
        // No run directory at all: no Open vSwitch on this node.
        let none = OvsProbe::locate(1, Some("unix:/nonexistent-ovs-rundir/db.sock"));
        assert!(!none.installed());
        assert!(none.unavailable_reason().unwrap().contains("not installed"));
    }
}
