//! `KuryrNetworkPolicy` (`kuryrnetworkpolicies.openstack.org`, short `knp`): a NetworkPolicy
//! translated to Neutron security group rules; named after the policy, in its namespace.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// kube's printcolumn(...) attributes repeat keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "openstack.org",
    version = "v1",
    kind = "KuryrNetworkPolicy",
    plural = "kuryrnetworkpolicies",
    singular = "kuryrnetworkpolicy",
    shortname = "knp",
    namespaced,
    status = "KuryrNetworkPolicyStatus",
    derive = "PartialEq",
    doc = "A NetworkPolicy as Neutron security group rules.",
    printcolumn(
        name = "SG-ID",
        type_ = "string",
        description = "The ID of the SG associated to the policy",
        json_path = ".status.securityGroupId"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct KuryrNetworkPolicySpec {
    #[serde(default)]
    pub egress_sg_rules: Vec<SgRuleEntry>,
    #[serde(default)]
    pub ingress_sg_rules: Vec<SgRuleEntry>,
    #[serde(default)]
    #[schemars(schema_with = "crate::crds::schema::preserve_unknown_object")]
    pub pod_selector: LabelSelector,
    /// `Ingress` and/or `Egress`.
    #[serde(default)]
    pub policy_types: Vec<String>,
}

/// One wanted rule with the pods and namespace it was derived from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SgRuleEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affected_pods: Option<Vec<AffectedPod>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub sg_rule: SgRule,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AffectedPod {
    #[serde(rename = "podIP")]
    pub pod_ip: String,
    #[serde(rename = "podNamespace")]
    pub pod_namespace: String,
}

/// A security group rule body (Neutron field names).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SgRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `ingress` or `egress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    /// `IPv4` or `IPv6`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethertype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range_max: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range_min: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_ip_prefix: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KuryrNetworkPolicyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_group_id: Option<String>,
    /// Rules as created in Neutron.
    #[serde(default)]
    pub security_group_rules: Vec<SgRuleStatus>,
    /// The pod selector the rules were last applied for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crds::schema::preserve_unknown_object")]
    pub pod_selector: Option<LabelSelector>,
    /// kuryr-rs: where the rules are an equivalent of the policy rather than its literal form
    /// (e.g. an `ipBlock` with `except` as the prefixes left), by field. Upstream ignores it.
    #[serde(default, rename = "kuryrRsNotes", skip_serializing_if = "Vec::is_empty")]
    pub kuryr_rs_notes: Vec<String>,
}

/// A created security group rule (Neutron field names, `id` required).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SgRuleStatus {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethertype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range_max: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range_min: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_ip_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_group_id: Option<String>,
}
