//! kuryr-rs placement objects, both cluster-scoped (`openstack.org/v1`):
//!
//! - `KuryrOpenStackDeployment` (short `kosd`): one per OpenStack deployment of `kuryr.conf`
//!   (named like its `[deployment:<name>]` section, `default` for `[neutron]`). The spec is the
//!   operator's: zone, affinity, weight, threshold, maintenance; the status is the controller's:
//!   measured usage and when, and conditions. Credentials stay in `kuryr.conf`.
//! - `KuryrProjectBinding` (short `kpb`): one per (project, group); the spec names the key and
//!   whether an operator pinned it, the status holds the current deployment and a bounded history.
//!
//! Named so that they are never confused with apps/v1 Deployments or with port bindings.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// kube's printcolumn(...) attributes repeat keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "openstack.org",
    version = "v1",
    kind = "KuryrOpenStackDeployment",
    plural = "kuryropenstackdeployments",
    singular = "kuryropenstackdeployment",
    shortname = "kosd",
    status = "KuryrOpenStackDeploymentStatus",
    derive = "PartialEq",
    doc = "kuryr-rs: one OpenStack deployment projects can be bound to; credentials stay in kuryr.conf.",
    printcolumn(name = "Zone", type_ = "string", json_path = ".spec.availabilityZone"),
    printcolumn(
        name = "Weight",
        type_ = "integer",
        description = "Lower is preferred by the creation_order weigher",
        json_path = ".spec.weight"
    ),
    printcolumn(
        name = "Maintenance",
        type_ = "boolean",
        description = "In maintenance now: spec.maintenance.enabled and before spec.maintenance.until",
        json_path = ".status.inMaintenance"
    ),
    printcolumn(
        name = "Until",
        type_ = "string",
        description = "When the maintenance window ends by itself",
        json_path = ".spec.maintenance.until"
    ),
    printcolumn(name = "Move", type_ = "boolean", json_path = ".spec.moveExisting"),
    printcolumn(
        name = "Usage",
        type_ = "string",
        description = "Fraction of what runs out first (ports or IPv4 addresses)",
        json_path = ".status.usage.fraction"
    ),
    printcolumn(
        name = "Measured",
        type_ = "date",
        description = "When usage was last measured",
        json_path = ".status.measuredAt"
    ),
    printcolumn(name = "Stale", type_ = "boolean", json_path = ".status.stale"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct KuryrOpenStackDeploymentSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 255),
        regex(pattern = r"^[^\s:,][^:,]*[^\s:,]$|^[^\s:,]$")
    )]
    pub availability_zone: Option<String>,
    /// key=value tags matched by the `resource_affinity` filter.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::crds::schema::affinity_map")]
    pub resource_affinity: BTreeMap<String, String>,
    /// Rank for the `creation_order` weigher (lower first); absent = declaration order in kuryr.conf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -1_000_000, max = 1_000_000))]
    pub weight: Option<i64>,
    /// Fraction (0 < t <= 1) at which existing bindings leave; absent = `[pod_binding] usage_threshold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crds::schema::usage_threshold")]
    pub usage_threshold: Option<f64>,
    /// New bindings need usage below threshold - headroom (0 <= h < 1); absent = `[pod_binding] usage_hysteresis`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crds::schema::headroom")]
    pub headroom: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<Maintenance>,
    /// With maintenance on: true moves existing bindings elsewhere, false keeps them.
    #[serde(default)]
    pub move_existing: bool,
    /// Cluster project id -> this deployment's project id (separate Keystones have separate ids).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::crds::schema::project_id_map")]
    pub project_ids: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Maintenance {
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
    /// End of the window (RFC 3339): from then on the deployment takes new bindings again, as if
    /// `enabled` were false (absent = until `enabled` is set false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$"))]
    pub until: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KuryrOpenStackDeploymentStatus {
    /// The last measurement as JSON (ports used/limit, IPv4 free/total, fraction); free-form so
    /// that new figures need no schema change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crds::schema::preserve_unknown_object")]
    pub usage: Option<serde_json::Value>,
    /// When `usage` was measured (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<String>,
    /// True when the last measurement failed or is too old: see docs/placement.md for the rule.
    #[serde(default)]
    pub stale: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<DeploymentCondition>,
    /// Whether the scheduler treats the deployment as in maintenance now: `spec.maintenance.enabled`
    /// and, with `spec.maintenance.until`, before that time.
    #[serde(default)]
    pub in_maintenance: bool,
    /// The `metadata.generation` of the spec the controller decides with: an edit has taken
    /// effect once this equals the object's generation (`kubectl wait --for=jsonpath=...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The usage threshold the controller decides with: `spec.usageThreshold`, else kuryr.conf's
    /// `[pod_binding] usage_threshold` (which `kuryr bindings move` cannot read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_threshold: Option<f64>,
    /// Likewise the headroom: `spec.headroom`, else `[pod_binding] usage_hysteresis`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headroom: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentCondition {
    /// `Configured`: kuryr.conf has credentials for this deployment. `Valid`: the spec can be
    /// followed as written (what the schema cannot check: affinity keys, headroom below the
    /// threshold, a parseable `maintenance.until`), the message naming the field.
    #[serde(rename = "type")]
    pub type_: String,
    /// "True" / "False".
    #[schemars(schema_with = "crate::crds::schema::condition_status")]
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: String,
}

// kube's printcolumn(...) attributes repeat keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "openstack.org",
    version = "v1",
    kind = "KuryrProjectBinding",
    plural = "kuryrprojectbindings",
    singular = "kuryrprojectbinding",
    shortname = "kpb",
    status = "KuryrProjectBindingStatus",
    derive = "PartialEq",
    doc = "kuryr-rs: the OpenStack deployment one (project, zone/affinity group) is bound to, with its history.",
    printcolumn(name = "Project", type_ = "string", json_path = ".spec.projectId"),
    printcolumn(name = "Zone", type_ = "string", json_path = ".spec.availabilityZone"),
    printcolumn(name = "Affinity", type_ = "string", json_path = ".spec.resourceAffinity"),
    printcolumn(name = "Deployment", type_ = "string", json_path = ".status.deployment"),
    printcolumn(name = "Pinned", type_ = "boolean", json_path = ".spec.pinned"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct KuryrProjectBindingSpec {
    #[schemars(length(min = 1, max = 255))]
    pub project_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 255),
        regex(pattern = r"^[^\s:,][^:,]*[^\s:,]$|^[^\s:,]$")
    )]
    pub availability_zone: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::crds::schema::affinity_map")]
    pub resource_affinity: BTreeMap<String, String>,
    /// Set by an operator: the binding stays where it is whatever the filters say.
    #[serde(default)]
    pub pinned: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KuryrProjectBindingStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// Oldest first, bounded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<BindingHistoryRow>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingHistoryRow {
    pub deployment: String,
    pub bound_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unbound_at: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

/// Object name of the binding of `project` for group id `group` (see the controller's
/// `Group::id`): the project id (lower-cased, DNS-1123) plus, for a non-general group, a stable
/// hash of the group. `spec` carries the full key, so a collision is detectable.
pub fn binding_name(project: &str, group: &str) -> String {
    let mut base: String = project
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base = base.trim_matches('-').chars().take(200).collect();
    if base.is_empty() {
        base = "p".into();
    }
    if group.is_empty()
        && project
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return base;
    }
    // FNV-1a 64: stable across versions and platforms (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in project.bytes().chain([0]).chain(group.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{base}-{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_names_are_dns_labels_and_differ_per_group() {
        let a = binding_name("proj-a", "");
        let b = binding_name("proj-a", "az=az1");
        let c = binding_name("Proj-A", "");
        assert_eq!(a, "proj-a");
        assert_ne!(a, b);
        assert_ne!(a, c, "case differs: the hash keeps them apart");
        for n in [a, b, c, binding_name("__", "x")] {
            assert!(
                n.len() <= 253
                    && n.chars()
                        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-'),
                "{n}"
            );
            assert!(!n.starts_with('-') && !n.ends_with('-'), "{n}");
        }
    }
}
