//! `NetworkAttachmentDefinition` (`network-attachment-definitions.k8s.cni.cncf.io`, short
//! `net-attach-def`), the Network Plumbing WG CRD kuryr reads for additional pod interfaces.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::names::annotations;

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "k8s.cni.cncf.io",
    version = "v1",
    kind = "NetworkAttachmentDefinition",
    plural = "network-attachment-definitions",
    singular = "network-attachment-definition",
    shortname = "net-attach-def",
    namespaced,
    derive = "PartialEq",
    doc = "Network Plumbing WG network attachment; kuryr reads the openstack.org/kuryr-config annotation."
)]
pub struct NetworkAttachmentDefinitionSpec {
    /// CNI configuration (JSON text); kuryr does not interpret it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
}

/// The NAD annotation `openstack.org/kuryr-config`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NadKuryrConfig {
    /// Neutron subnet of the additional interface; absent (or empty), as upstream:
    /// `[neutron_defaults] subnet_mapping` of the `driverType`, else the pod subnet.
    #[serde(rename = "subnetId", default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    /// VIF driver for it (`neutron`, `nested-vlan`, `sriov`, ...); the pod VIF driver when absent.
    #[serde(rename = "driverType", default, skip_serializing_if = "Option::is_none")]
    pub driver_type: Option<String>,
}

/// Why a NAD cannot be used by kuryr.
#[derive(Debug, thiserror::Error)]
pub enum NadError {
    #[error("NetworkAttachmentDefinition {name}: annotation {annotation} is missing")]
    MissingAnnotation { name: String, annotation: &'static str },
    #[error(
        "NetworkAttachmentDefinition {name}: annotation {annotation} is not valid JSON with string subnetId and driverType: {source}"
    )]
    BadAnnotation {
        name: String,
        annotation: &'static str,
        source: serde_json::Error,
    },
}

impl NetworkAttachmentDefinition {
    /// Parses the `openstack.org/kuryr-config` annotation.
    pub fn kuryr_config(&self) -> Result<NadKuryrConfig, NadError> {
        kuryr_config_of(&self.metadata)
    }
}

/// The `openstack.org/kuryr-config` annotation of a NAD's metadata: what kuryr reads of a NAD,
/// which may have no `spec` at all (upstream's documented examples have none).
pub fn kuryr_config_of(meta: &ObjectMeta) -> Result<NadKuryrConfig, NadError> {
    let name = format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    );
    let raw = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::NAD_KURYR_CONFIG))
        .ok_or_else(|| NadError::MissingAnnotation {
            name: name.clone(),
            annotation: annotations::NAD_KURYR_CONFIG,
        })?;
    serde_json::from_str(raw).map_err(|source| NadError::BadAnnotation {
        name,
        annotation: annotations::NAD_KURYR_CONFIG,
        source,
    })
}
