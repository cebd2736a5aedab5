//! What the daemon plugged, kept on disk (one small JSON file per pod in the
//! daemon's state directory, as netavark keeps its state) so that a restarted
//! daemon can still tear down every binding - nested VLAN/macvlan devices and
//! SR-IOV VFs live only in the pod's namespace and OVS ports only in ovsdb,
//! so host link aliases alone cannot bring them back.
//!
//! The directory belongs on a tmpfs such as `/run`: a reboot removes every
//! namespace and veth, and must remove the records with them.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::binding::PlugSpec;
use crate::registry::{Attachment, PodKey};

/// Bumped when the record format changes incompatibly.
const VERSION: u32 = 1;

/// One pod's attachment as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub version: u32,
    pub namespace: String,
    pub name: String,
    pub container_id: String,
    pub netns: Option<String>,
    /// Absent in records written before it was kept.
    #[serde(default)]
    pub netns_id: Option<(u64, u64)>,
    pub pod_uid: String,
    pub specs: Vec<PlugSpec>,
}

impl Record {
    pub fn new(key: &PodKey, pod_uid: &str, att: &Attachment) -> Self {
        Self {
            version: VERSION,
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            container_id: att.container_id.clone(),
            netns: att.netns.clone(),
            netns_id: att.netns_id,
            pod_uid: pod_uid.to_string(),
            specs: att.specs.clone(),
        }
    }

    pub fn key(&self) -> PodKey {
        PodKey::new(self.namespace.clone(), self.name.clone())
    }

    pub fn attachment(&self) -> Attachment {
        Attachment {
            container_id: self.container_id.clone(),
            netns: self.netns.clone(),
            netns_id: self.netns_id,
            host_ifnames: self.specs.iter().map(|s| s.host_ifname.clone()).collect(),
            specs: self.specs.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("daemon state {path}: {message}")]
pub struct StateError {
    pub path: String,
    pub message: String,
}

fn err(path: &Path, e: impl std::fmt::Display) -> StateError {
    StateError {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// The state directory.
#[derive(Clone, Debug)]
pub struct StateDir {
    dir: PathBuf,
}

/// A file name for `ns/name` that cannot leave the directory: pod names come
/// from CNI_ARGS, so every byte outside `[A-Za-z0-9-]` is %-escaped (dots
/// included, so neither `.` nor `..` can result).
fn file_name(key: &PodKey) -> String {
    let mut out = String::with_capacity(key.namespace.len() + key.name.len() + 6);
    for (i, part) in [&key.namespace, &key.name].into_iter().enumerate() {
        if i > 0 {
            out.push('_');
        }
        for b in part.bytes() {
            if b.is_ascii_alphanumeric() || b == b'-' {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out.push_str(".json");
    out
}

impl StateDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn file(&self, key: &PodKey) -> PathBuf {
        self.dir.join(file_name(key))
    }

    /// Write the pod's record atomically (temporary file, fsync, rename).
    pub fn save(&self, record: &Record) -> Result<(), StateError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| err(&self.dir, e))?;
        let path = self.file(&record.key());
        let tmp = path.with_extension("json.tmp");
        let body = serde_json::to_vec_pretty(record).map_err(|e| err(&path, e))?;
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(&path, e)
        })
    }

    /// Forget the pod's record; a missing one is fine.
    pub fn remove(&self, key: &PodKey) -> Result<(), StateError> {
        let path = self.file(key);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(err(&path, e)),
        }
    }

    /// Every record; unreadable or foreign files are reported, not fatal (the
    /// other pods must still be restored). A missing directory is empty.
    pub fn load_all(&self) -> (Vec<Record>, Vec<StateError>) {
        let mut records = Vec::new();
        let mut errors = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (records, errors),
            Err(e) => {
                errors.push(err(&self.dir, e));
                return (records, errors);
            }
        };
        for entry in entries {
            let path = match entry {
                Ok(e) => e.path(),
                Err(e) => {
                    errors.push(err(&self.dir, e));
                    continue;
                }
            };
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let parsed = std::fs::read(&path)
                .map_err(|e| err(&path, e))
                .and_then(|b| serde_json::from_slice::<Record>(&b).map_err(|e| err(&path, e)));
            match parsed {
                Ok(r) if r.version != VERSION => {
                    errors.push(err(&path, format!("unknown record version {}", r.version)));
                }
                Ok(r) => records.push(r),
                Err(e) => errors.push(e),
            }
        }
        records.sort_by_key(Record::key);
        (records, errors)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::binding::PlugKind;

    fn spec(kind: PlugKind) -> PlugSpec {
        PlugSpec {
            port_id: "p1".into(),
            ifname: "eth1".into(),
            host_ifname: "tapp1".into(),
            mac: "fa:16:3e:00:00:01".parse().unwrap(),
            mtu: Some(1400),
            addresses: vec!["10.0.0.5/24".parse().unwrap()],
            gateways: vec!["10.0.0.1".parse().unwrap()],
            routes: vec![crate::binding::SubnetRoute {
                destination: "10.1.0.0/16".parse().unwrap(),
                gateway: None,
            }],
            is_default: false,
            kind,
        }
    }

    #[test]
    fn records_round_trip_every_binding_kind() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path().join("state"));
        let key = PodKey::new("ns", "p");
        let att = Attachment {
            container_id: "c1".into(),
            netns: Some("/var/run/netns/x".into()),
            netns_id: Some((4, 4026532000)),
            host_ifnames: vec!["tapp1".into(); 6],
            specs: vec![
                spec(PlugKind::Bridge { bridge: "br0".into() }),
                spec(PlugKind::OpenVSwitch {
                    bridge: "br-int".into(),
                }),
                spec(PlugKind::HybridOvs {
                    bridge: "qbrp1".into(),
                    ovs_bridge: "br-int".into(),
                }),
                spec(PlugKind::VlanNested { vlan_id: 42 }),
                spec(PlugKind::MacvlanNested),
                spec(PlugKind::Sriov {
                    pci_address: None,
                    physnet: Some("physnet1".into()),
                    vlan: Some(7),
                }),
            ],
        };
        let rec = Record::new(&key, "uid-1", &att);
        state.save(&rec).unwrap();
        let (all, errors) = state.load_all();
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(all, vec![rec.clone()]);
        assert_eq!(all[0].attachment(), att);
        state.remove(&key).unwrap();
        state.remove(&key).unwrap();
        assert!(state.load_all().0.is_empty());
    }

    #[test]
    fn names_from_cni_args_stay_inside_the_directory() {
        assert_eq!(file_name(&PodKey::new("default", "web-0")), "default_web-0.json");
        let evil = file_name(&PodKey::new("..", "../../etc/passwd"));
        assert!(!evil.contains('/') && !evil.starts_with('.'), "{evil}");
        assert_ne!(
            file_name(&PodKey::new("a_b", "c")),
            file_name(&PodKey::new("a", "b_c"))
        );
    }

    #[test]
    fn a_broken_file_does_not_hide_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        std::fs::write(dir.path().join("junk.json"), b"{not json").unwrap();
        let att = Attachment {
            container_id: "c".into(),
            netns: None,
            netns_id: None,
            host_ifnames: vec![],
            specs: vec![],
        };
        state
            .save(&Record::new(&PodKey::new("ns", "ok"), "u", &att))
            .unwrap();
        let (all, errors) = state.load_all();
        assert_eq!(all.len(), 1);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].to_string().contains("junk.json"), "{}", errors[0]);
    }
}
