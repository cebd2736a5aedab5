//! Neutron's error envelope: `{"NeutronError": {"type", "message", "detail": ""}}` with the real status codes.

use axum::http::StatusCode;

/// One API error, rendered exactly like neutron-server renders its exceptions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: String,
    pub message: String,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind: kind.to_string(),
            message: message.into(),
        }
    }

    pub fn with_kind(mut self, kind: &str) -> Self {
        self.kind = kind.to_string();
        self
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"NeutronError": {"type": self.kind, "message": self.message, "detail": ""}})
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "HTTPBadRequest", message)
    }

    pub fn invalid_input(reason: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "InvalidInput",
            format!("Invalid input for operation: {reason}."),
        )
    }

    /// `Invalid input for <field>. Reason: <reason>.` as neutron-lib's attribute validators say it.
    pub fn invalid_attr(field: &str, reason: impl std::fmt::Display) -> Self {
        Self::bad_request(format!("Invalid input for {field}. Reason: {reason}."))
    }

    pub fn not_found(kind: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, kind, message)
    }

    pub fn conflict(kind: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, kind, message)
    }

    pub fn http_not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "HTTPNotFound",
            "The resource could not be found.",
        )
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "HTTPMethodNotAllowed",
            "The server could not comply with the request since it is either malformed or otherwise incorrect.",
        )
    }

    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "HTTPInternalServerError",
            "Request Failed: internal server error while processing your request.",
        )
    }

    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "HTTPServiceUnavailable",
            "The server is currently unavailable. Please try again at a later time.",
        )
    }

    pub fn mac_in_use(network_id: &str, mac: &str) -> Self {
        Self::conflict(
            "MacAddressInUse",
            format!(
                "Unable to complete operation for network {network_id}. The mac address {mac} is in use."
            ),
        )
    }

    pub fn ip_already_allocated(ip: &str, subnet_id: &str) -> Self {
        Self::conflict(
            "IpAddressAlreadyAllocated",
            format!("IP address {ip} already allocated in subnet {subnet_id}"),
        )
    }

    /// A port that already has a device (`device_id`) cannot become a subport or a router interface.
    pub fn port_in_use(port_id: &str, network_id: &str, device_id: &str) -> Self {
        Self::conflict(
            "PortInUse",
            format!(
                "Unable to complete operation on port {port_id} for network {network_id}. Port already has an attached device {device_id}."
            ),
        )
    }

    pub fn parent_port_in_use(port_id: &str) -> Self {
        Self::conflict(
            "ParentPortInUse",
            format!("Port {port_id} is currently in use and is not eligible for use as a parent port."),
        )
    }

    pub fn trunk_port_in_use(port_id: &str) -> Self {
        Self::conflict(
            "TrunkPortInUse",
            format!("Port {port_id} is in use by another trunk."),
        )
    }

    pub fn over_quota(resource: &str) -> Self {
        Self::conflict(
            "OverQuota",
            format!("Quota exceeded for resources: ['{resource}']."),
        )
    }

    /// `<Kind>NotFound` with neutron's "<Name> <id> could not be found." wording.
    pub fn resource_not_found(res: Resource, id: &str) -> Self {
        match res {
            Resource::SecurityGroup => Self::not_found(
                "SecurityGroupNotFound",
                format!("Security group {id} does not exist"),
            ),
            Resource::SecurityGroupRule => Self::not_found(
                "SecurityGroupRuleNotFound",
                format!("Security group rule {id} does not exist"),
            ),
            // Neutron's RouterNotFound message has no final period.
            Resource::Router => Self::not_found("RouterNotFound", format!("Router {id} could not be found")),
            // So has its FloatingIPNotFound message.
            Resource::FloatingIp => Self::not_found(
                "FloatingIPNotFound",
                format!("Floating IP {id} could not be found"),
            ),
            _ => Self::not_found(
                &format!("{}NotFound", res.type_name()),
                format!("{} {id} could not be found.", res.human_name()),
            ),
        }
    }
}

/// The resource collections the emulator serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    Network,
    Subnet,
    SubnetPool,
    Port,
    Router,
    SecurityGroup,
    SecurityGroupRule,
    Trunk,
    AddressGroup,
    FloatingIp,
}

impl Resource {
    /// Collection name in URLs and list bodies.
    pub fn collection(self) -> &'static str {
        match self {
            Resource::Network => "networks",
            Resource::Subnet => "subnets",
            Resource::SubnetPool => "subnetpools",
            Resource::Port => "ports",
            Resource::Router => "routers",
            Resource::SecurityGroup => "security-groups",
            Resource::SecurityGroupRule => "security-group-rules",
            Resource::Trunk => "trunks",
            Resource::AddressGroup => "address-groups",
            Resource::FloatingIp => "floatingips",
        }
    }

    /// Member key in request/response bodies.
    pub fn member(self) -> &'static str {
        match self {
            Resource::Network => "network",
            Resource::Subnet => "subnet",
            Resource::SubnetPool => "subnetpool",
            Resource::Port => "port",
            Resource::Router => "router",
            Resource::SecurityGroup => "security_group",
            Resource::SecurityGroupRule => "security_group_rule",
            Resource::Trunk => "trunk",
            Resource::AddressGroup => "address_group",
            Resource::FloatingIp => "floatingip",
        }
    }

    /// Plural key in list bodies (neutron uses underscores there).
    pub fn plural_key(self) -> &'static str {
        match self {
            Resource::SecurityGroup => "security_groups",
            Resource::SecurityGroupRule => "security_group_rules",
            Resource::AddressGroup => "address_groups",
            other => other.collection(),
        }
    }

    fn type_name(self) -> &'static str {
        match self {
            Resource::Network => "Network",
            Resource::Subnet => "Subnet",
            Resource::SubnetPool => "SubnetPool",
            Resource::Port => "Port",
            Resource::Router => "Router",
            Resource::SecurityGroup => "SecurityGroup",
            Resource::SecurityGroupRule => "SecurityGroupRule",
            Resource::Trunk => "Trunk",
            Resource::AddressGroup => "AddressGroup",
            Resource::FloatingIp => "FloatingIP",
        }
    }

    fn human_name(self) -> &'static str {
        match self {
            Resource::SubnetPool => "Subnet pool",
            Resource::AddressGroup => "Address group",
            Resource::FloatingIp => "Floating IP",
            other => other.type_name(),
        }
    }

    pub fn from_collection(s: &str) -> Option<Self> {
        [
            Resource::Network,
            Resource::Subnet,
            Resource::SubnetPool,
            Resource::Port,
            Resource::Router,
            Resource::SecurityGroup,
            Resource::SecurityGroupRule,
            Resource::Trunk,
            Resource::AddressGroup,
            Resource::FloatingIp,
        ]
        .into_iter()
        .find(|r| r.collection() == s)
    }

    /// Operation-name prefix used by stats, latency tables and fault rules.
    pub fn op_name(self) -> &'static str {
        self.member()
    }

    /// Quota key counting this resource.
    pub fn quota_key(self) -> &'static str {
        self.member()
    }
}
