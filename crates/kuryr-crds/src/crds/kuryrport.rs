//! `KuryrPort` (`kuryrports.openstack.org`, short `kp`): one per pod, named after the pod, in
//! the pod's namespace. The controller fills `status.vifs`; the pod's node's CNI daemon plugs them.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::names;
use crate::vif::Vif;

// kube's printcolumn(...) attributes repeat keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "openstack.org",
    version = "v1",
    kind = "KuryrPort",
    plural = "kuryrports",
    singular = "kuryrport",
    shortname = "kp",
    namespaced,
    status = "KuryrPortStatus",
    derive = "PartialEq",
    doc = "Neutron ports (as os-vif VIFs) of one pod; named after the pod.",
    printcolumn(
        name = "PodUID",
        type_ = "string",
        description = "Pod UID",
        json_path = ".spec.podUid"
    ),
    printcolumn(
        name = "Nodename",
        type_ = "string",
        description = "Name of the node corresponding pod lives in",
        json_path = ".spec.podNodeName"
    ),
    printcolumn(
        name = "labels",
        type_ = "string",
        description = "Labels for the CRD",
        json_path = ".metadata.labels"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct KuryrPortSpec {
    pub pod_uid: String,
    pub pod_node_name: String,
    /// Static (kubelet manifest) pods have no API-side lifecycle.
    #[serde(default)]
    pub pod_static: bool,
}

/// `status.vifs`: interface name (`eth0`, `eth1`, ...) to VIF. Free-form in the schema, as upstream.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KuryrPortStatus {
    #[schemars(schema_with = "crate::crds::schema::preserve_unknown_object")]
    pub vifs: BTreeMap<String, KuryrPortVif>,
}

/// One entry of `status.vifs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KuryrPortVif {
    /// True for the interface that carries the pod's default route (`eth0`).
    #[serde(default)]
    pub default: bool,
    pub vif: Vif,
    /// Keys upstream might add next to `default`/`vif`, kept for round trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl KuryrPortVif {
    pub fn new(default: bool, vif: Vif) -> Self {
        Self {
            default,
            vif,
            extra: Map::new(),
        }
    }
}

impl KuryrPortStatus {
    /// The VIF marked `default` (falls back to `eth0` when no entry is marked, as for
    /// objects written by hand).
    pub fn default_vif(&self) -> Option<(&str, &Vif)> {
        self.vifs
            .iter()
            .find(|(_, v)| v.default)
            .or_else(|| self.vifs.get_key_value(names::DEFAULT_IFNAME))
            .map(|(name, v)| (name.as_str(), &v.vif))
    }

    /// Additional (non-default) VIFs in interface-name order.
    pub fn additional_vifs(&self) -> impl Iterator<Item = (&str, &Vif)> {
        let default = self.default_vif().map(|(n, _)| n);
        self.vifs
            .iter()
            .filter(move |(n, _)| Some(n.as_str()) != default)
            .map(|(n, v)| (n.as_str(), &v.vif))
    }

    /// True once every VIF is active (what the CNI daemon waits for before answering ADD).
    pub fn all_active(&self) -> bool {
        !self.vifs.is_empty() && self.vifs.values().all(|v| v.vif.active())
    }
}

impl KuryrPort {
    /// The label selector a CNI daemon uses to watch its node's KuryrPorts.
    pub fn node_selector(node: &str) -> String {
        format!("{}={node}", names::labels::NODE_NAME)
    }

    pub fn vifs(&self) -> Option<&BTreeMap<String, KuryrPortVif>> {
        self.status.as_ref().map(|s| &s.vifs)
    }
}
