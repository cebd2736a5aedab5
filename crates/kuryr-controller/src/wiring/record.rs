//! What a KuryrPort records of a pod's interfaces (`status.vifs`): the upstream VIF JSON, plus
//! in fields upstream ignores where each port came from and how it goes back.

use std::collections::BTreeMap;

use kuryr_crds::{KuryrPort, KuryrPortStatus, KuryrPortVif, Vif};

use crate::drivers::multi_vif::{self, MultiVifRecord, RECORD_FIELD};
use crate::drivers::pool::{ORIGIN_FIELD, VifOrigin};
use crate::error::Error;

pub use crate::drivers::multi_vif::ReleaseMode;

/// One interface of a pod as recorded in its KuryrPort.
#[derive(Clone, Debug)]
pub struct RecordedVif {
    pub ifname: String,
    pub default: bool,
    pub vif: Vif,
    /// `None` in KuryrPorts written by upstream kuryr-kubernetes (inferred when needed).
    pub origin: Option<VifOrigin>,
    /// Set on additional interfaces: how they go back and which network they are.
    pub multi: Option<MultiVifRecord>,
}

impl RecordedVif {
    /// How the port goes back: eth0 always through the pool driver.
    pub fn release_mode(&self) -> ReleaseMode {
        self.multi.as_ref().map_or(ReleaseMode::Pool, |m| m.release)
    }

    /// The network name reported in `k8s.v1.cni.cncf.io/network-status`.
    pub fn network_name(&self) -> &str {
        self.multi
            .as_ref()
            .map_or(multi_vif::DEFAULT_NETWORK_NAME, |m| m.network.as_str())
    }
}

/// The VIFs a KuryrPort records. Origins or records that cannot be read are treated as absent
/// (upstream-written objects have none).
pub fn recorded_vifs(kp: &KuryrPort) -> Vec<RecordedVif> {
    kp.status
        .as_ref()
        .map(|s| {
            s.vifs
                .iter()
                .map(|(ifname, v)| RecordedVif {
                    ifname: ifname.clone(),
                    default: v.default,
                    vif: v.vif.clone(),
                    origin: v
                        .extra
                        .get(ORIGIN_FIELD)
                        .and_then(|o| serde_json::from_value(o.clone()).ok()),
                    multi: v
                        .extra
                        .get(RECORD_FIELD)
                        .and_then(|o| serde_json::from_value(o.clone()).ok()),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The KuryrPort status recording `vifs`.
pub fn to_status(vifs: &[RecordedVif]) -> Result<KuryrPortStatus, Error> {
    let mut map = BTreeMap::new();
    for r in vifs {
        let mut entry = KuryrPortVif::new(r.default, r.vif.clone());
        if let Some(o) = &r.origin {
            let v = serde_json::to_value(o).map_err(|e| Error::serialization("VIF origin", e))?;
            entry.extra.insert(ORIGIN_FIELD.to_string(), v);
        }
        if let Some(m) = &r.multi {
            let v = serde_json::to_value(m).map_err(|e| Error::serialization("multi-VIF record", e))?;
            entry.extra.insert(RECORD_FIELD.to_string(), v);
        }
        map.insert(r.ifname.clone(), entry);
    }
    Ok(KuryrPortStatus { vifs: map })
}

/// The `k8s.v1.cni.cncf.io/network-status` value: every interface, eth0 first.
pub fn network_status(vifs: &[RecordedVif]) -> Result<String, Error> {
    let mut ordered: Vec<&RecordedVif> = vifs.iter().collect();
    ordered.sort_by_key(|r| (!r.default, r.ifname.clone()));
    let status: Vec<serde_json::Value> = ordered
        .iter()
        .map(|r| multi_vif::network_status_entry(r.network_name(), &r.ifname, &r.vif, r.default))
        .collect();
    serde_json::to_string_pretty(&status).map_err(|e| Error::serialization("network-status", e))
}
