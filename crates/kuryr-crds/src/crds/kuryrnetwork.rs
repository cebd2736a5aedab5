//! `KuryrNetwork` (`kuryrnetworks.openstack.org`, short `kns`): one per namespace (named after
//! it) when the `namespace` subnet driver gives each namespace its own network.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// kube's printcolumn(...) attributes repeat keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "openstack.org",
    version = "v1",
    kind = "KuryrNetwork",
    plural = "kuryrnetworks",
    singular = "kuryrnetwork",
    shortname = "kns",
    namespaced,
    status = "KuryrNetworkStatus",
    derive = "PartialEq",
    doc = "Neutron network, subnet and router interface of one namespace.",
    printcolumn(
        name = "SUBNET-CIDR",
        type_ = "string",
        description = "The subnet CIDR allocated to the namespace",
        json_path = ".status.subnetCIDR"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct KuryrNetworkSpec {
    pub ns_name: String,
    pub project_id: String,
    #[schemars(schema_with = "crate::crds::schema::preserve_unknown_object")]
    pub ns_labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KuryrNetworkStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_id: Option<String>,
    /// True once the subnet's ports were pre-created in the pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub populated: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "subnetCIDR")]
    pub subnet_cidr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    /// Labels the network policies were last applied for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crds::schema::preserve_unknown_object")]
    pub ns_labels: Option<BTreeMap<String, String>>,
}
