//! `KuryrLoadBalancer` (`kuryrloadbalancers.openstack.org`, short `klb`): a Service as an
//! Octavia load balancer; named after the Service, in its namespace. Field names follow
//! upstream exactly (a mix of camelCase and snake_case).

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
    kind = "KuryrLoadBalancer",
    plural = "kuryrloadbalancers",
    singular = "kuryrloadbalancer",
    shortname = "klb",
    namespaced,
    status = "KuryrLoadBalancerStatus",
    derive = "PartialEq",
    doc = "A Service as an Octavia load balancer.",
    printcolumn(
        name = "PROJECT-ID",
        type_ = "string",
        description = "The ID of the PROJECT associated to the loadbalancer",
        json_path = ".spec.project_id"
    ),
    printcolumn(
        name = "VIP",
        type_ = "string",
        description = "The Service's VIP",
        json_path = ".spec.ip"
    ),
    printcolumn(
        name = "Provider",
        type_ = "string",
        description = "The Octavia provider",
        json_path = ".spec.provider"
    ),
    printcolumn(
        name = "LB-ID",
        type_ = "string",
        description = "The Octavia load balancer",
        json_path = ".status.loadbalancer.id"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct KuryrLoadBalancerSpec {
    #[serde(rename = "endpointSlices", default, skip_serializing_if = "Vec::is_empty")]
    pub endpoint_slices: Vec<LbEndpointSlice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lb_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<LbSpecPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    /// Service type (`ClusterIP`, `LoadBalancer`).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_client_data: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_member_data: Option<i32>,
    /// kuryr-rs: the Service's `sessionAffinity` when it is `ClientIP` (Octavia `SOURCE_IP` persistence).
    /// Upstream had no such field; its objects simply lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<String>,
    /// kuryr-rs: with `[octavia_defaults] enforce_sg_rules`, the listeners that admit only some sources
    /// (from the ingress rules of the load balancer's security groups); a listener not listed admits
    /// everyone. Upstream computed these on the fly and had no such field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listener_acls: Vec<LbListenerAcl>,
}

/// The sources one listener admits (Octavia `allowed_cidrs`); none at all closes the listener.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LbListenerAcl {
    pub protocol: String,
    pub port: i32,
    #[serde(default)]
    pub allowed_cidrs: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LbEndpointSlice {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<LbEndpoint>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<LbEndpointPort>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LbEndpoint {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<LbEndpointConditions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<LbTargetRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LbEndpointConditions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LbTargetRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LbEndpointPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LbSpecPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub port: i32,
    pub protocol: String,
    /// Upstream stores the target port as a string (number or named port).
    #[serde(rename = "targetPort")]
    pub target_port: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KuryrLoadBalancerStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<LbListener>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loadbalancer: Option<LbLoadBalancer>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<LbMember>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<LbPool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_pub_ip_info: Option<LbPubIpInfo>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LbListener {
    pub id: String,
    pub loadbalancer_id: String,
    pub name: String,
    pub port: i32,
    pub project_id: String,
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_client_data: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_member_data: Option<i32>,
    /// kuryr-rs: the listener's Octavia `allowed_cidrs` when it admits only some sources (none: it is
    /// disabled); absent when it admits everyone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_cidrs: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LbLoadBalancer {
    pub id: String,
    pub ip: String,
    pub name: String,
    pub port_id: String,
    pub project_id: String,
    pub provider: String,
    pub security_groups: Vec<String>,
    pub subnet_id: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LbMember {
    pub id: String,
    pub ip: String,
    pub name: String,
    pub pool_id: String,
    pub port: i32,
    pub project_id: String,
    pub subnet_id: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LbPool {
    pub id: String,
    pub listener_id: String,
    pub loadbalancer_id: String,
    pub name: String,
    pub project_id: String,
    pub protocol: String,
    /// kuryr-rs: the pool's session persistence type as asked (`SOURCE_IP`, from the Service's
    /// `sessionAffinity: ClientIP`) or `NONE`; absent in a record upstream wrote (then unknown, and
    /// left as it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_persistence: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LbPubIpInfo {
    pub ip_id: String,
    pub ip_addr: String,
    pub alloc_method: String,
}
