//! Provider drivers: `amphora` (the default) and `ovn`, each with the option checks its real driver makes
//! before Octavia accepts a request (a driver's `UnsupportedOptionError` becomes a 501).

use serde_json::{Value, json};

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Amphora,
    Ovn,
}

/// What `GET /v2/lbaas/providers` lists, with the descriptions a devstack-style deployment configures.
pub const PROVIDERS: [(&str, &str); 2] = [
    ("amphora", "The Octavia Amphora driver."),
    ("ovn", "Octavia OVN driver."),
];

const AMPHORA_PROTOCOLS: [&str; 9] = [
    "TCP",
    "HTTP",
    "HTTPS",
    "TERMINATED_HTTPS",
    "PROXY",
    "PROXYV2",
    "UDP",
    "SCTP",
    "PROMETHEUS",
];
const AMPHORA_ALGORITHMS: [&str; 3] = ["ROUND_ROBIN", "SOURCE_IP", "LEAST_CONNECTIONS"];
const OVN_PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];
const OVN_ALGORITHMS: [&str; 2] = ["SOURCE_IP_PORT", "SOURCE_IP"];
const OVN_HM_TYPES: [&str; 2] = ["UDP-CONNECT", "TCP"];

impl Provider {
    /// `provider` of a create request; none means `[api_settings] default_provider_driver` (amphora). Only
    /// the drivers [`PROVIDERS`] lists are enabled (not the deprecated `octavia` alias).
    pub fn parse(name: Option<&str>) -> Result<Self, ApiError> {
        match name {
            None | Some("amphora") => Ok(Provider::Amphora),
            Some("ovn") => Ok(Provider::Ovn),
            Some(other) => Err(ApiError::new(400, format!("Provider '{other}' is not enabled."))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Provider::Amphora => "amphora",
            Provider::Ovn => "ovn",
        }
    }

    fn unsupported(self, msg: String) -> ApiError {
        ApiError::provider_unsupported(self.name(), &msg)
    }

    pub fn check_listener(self, protocol: &str, allowed_cidrs: Option<&[String]>) -> Result<(), ApiError> {
        match self {
            Provider::Amphora if !AMPHORA_PROTOCOLS.contains(&protocol) => Err(self.unsupported(format!(
                "Amphora provider does not support {protocol} protocol. Supported: {}",
                AMPHORA_PROTOCOLS.join(", ")
            ))),
            Provider::Ovn if !OVN_PROTOCOLS.contains(&protocol) => {
                Err(self.unsupported(format!("OVN provider does not support {protocol} protocol")))
            }
            Provider::Ovn if allowed_cidrs.is_some_and(|c| !c.is_empty()) => {
                Err(self.unsupported("OVN provider does not support allowed_cidrs option".into()))
            }
            _ => Ok(()),
        }
    }

    pub fn check_pool(
        self,
        protocol: Option<&str>,
        algorithm: Option<&str>,
        sp_type: Option<&str>,
    ) -> Result<(), ApiError> {
        match self {
            Provider::Amphora => {
                if let Some(a) = algorithm
                    && !AMPHORA_ALGORITHMS.contains(&a)
                {
                    return Err(self.unsupported(format!("Amphora provider does not support {a} algorithm.")));
                }
            }
            Provider::Ovn => {
                if let Some(p) = protocol
                    && !OVN_PROTOCOLS.contains(&p)
                {
                    return Err(self.unsupported(format!("OVN provider does not support {p} protocol")));
                }
                if let Some(a) = algorithm
                    && !OVN_ALGORITHMS.contains(&a)
                {
                    return Err(self.unsupported(format!("OVN provider does not support {a} algorithm")));
                }
                if let Some(t) = sp_type
                    && t != "SOURCE_IP"
                {
                    return Err(self.unsupported(format!(
                        "OVN provider does not support {t} session persistence. Only SOURCE_IP type is supported."
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn check_healthmonitor(self, hm_type: &str) -> Result<(), ApiError> {
        if self == Provider::Ovn && !OVN_HM_TYPES.contains(&hm_type) {
            return Err(self.unsupported(format!(
                "OVN provider does not support {hm_type} health monitor type. Supported types: {}",
                OVN_HM_TYPES.join(", ")
            )));
        }
        Ok(())
    }

    pub fn check_member_monitor(self, monitor_address: bool, monitor_port: bool) -> Result<(), ApiError> {
        if self == Provider::Ovn && (monitor_address || monitor_port) {
            return Err(self.unsupported(
                "OVN Load Balancer does not support different member monitor address or port.".into(),
            ));
        }
        Ok(())
    }
}

impl Provider {
    /// ovn load balancers take members of the VIP's IP version only.
    pub fn check_member_family(self, vip: &str, member: &str) -> Result<(), ApiError> {
        let v4 = |a: &str| {
            a.parse::<std::net::IpAddr>()
                .map(|ip| ip.is_ipv4())
                .unwrap_or(true)
        };
        if self == Provider::Ovn && v4(vip) != v4(member) {
            return Err(self.unsupported(
                "OVN provider does not support mixing IPv4/IPv6 configuration within the same Load Balancer."
                    .into(),
            ));
        }
        Ok(())
    }
}

pub fn render_providers() -> Value {
    let list: Vec<Value> = PROVIDERS
        .iter()
        .map(|(n, d)| json!({"name": n, "description": d}))
        .collect();
    json!({ "providers": list })
}
