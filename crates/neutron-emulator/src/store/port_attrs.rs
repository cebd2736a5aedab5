//! Validation and normalisation of port attributes that need more than a type check.

use serde::Serialize;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::input::{self, Obj};
use crate::ipam::{self, Cidr};

pub(super) fn validate_mac(mac: &str) -> ApiResult<()> {
    let parts: Vec<&str> = mac.split(':').collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && u8::from_str_radix(p, 16).is_ok());
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid_attr(
            "mac_address",
            format!("'{mac}' is not a valid MAC address"),
        ))
    }
}

/// Python-style repr of a flat JSON object, as neutron puts request fragments into messages.
fn py_repr(v: &Value) -> String {
    match v {
        Value::Object(o) => {
            let items: Vec<String> = o.iter().map(|(k, v)| format!("'{k}': {}", py_repr(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::String(s) => format!("'{s}'"),
        other => input::show(other),
    }
}

/// One allowed address pair; ordered by MAC, then address, as the real server stores them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct AddressPair {
    pub mac_address: String,
    /// An address or a CIDR.
    pub ip_address: String,
}

/// Validates allowed address pairs; a pair without `mac_address` gets the port's MAC, and the list comes back in
/// the order the real server stores it.
pub(super) fn normalize_aap(items: &[Value], port_mac: &str) -> ApiResult<Vec<AddressPair>> {
    let mut out: Vec<AddressPair> = Vec::with_capacity(items.len());
    for item in items {
        let Value::Object(o) = item else {
            return Err(ApiError::invalid_attr(
                "allowed_address_pairs",
                format!("'{}' is not a dictionary", input::show(item)),
            ));
        };
        let ip = match o.get("ip_address") {
            Some(Value::String(s)) => s.clone(),
            _ => {
                return Err(
                    ApiError::bad_request("AllowedAddressPair must contain ip_address")
                        .with_kind("AllowedAddressPairsMissingIP"),
                );
            }
        };
        if ipam::parse_ip(&ip).is_none() && matches!(Cidr::parse(&ip), Err(None)) {
            return Err(ApiError::bad_request(format!("'{ip}' is not a valid IP address")));
        }
        let mac = match o.get("mac_address") {
            None | Some(Value::Null) => port_mac.to_string(),
            Some(Value::String(m)) => {
                validate_mac(m)?;
                m.to_ascii_lowercase()
            }
            Some(other) => {
                return Err(ApiError::invalid_attr(
                    "mac_address",
                    format!("'{}' is not a valid MAC address", input::show(other)),
                ));
            }
        };
        out.push(AddressPair {
            mac_address: mac,
            ip_address: ip,
        });
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// One extra DHCP option of a port.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DhcpOpt {
    pub opt_name: String,
    /// As the request gave it.
    pub opt_value: Value,
    pub ip_version: i64,
}

/// Validates extra DHCP options and fills `ip_version` (4 unless given).
pub(super) fn normalize_dhcp_opts(items: &[Value]) -> ApiResult<Vec<DhcpOpt>> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let (Some(name), Some(value)) = (
            item.get("opt_name").and_then(Value::as_str),
            item.get("opt_value"),
        ) else {
            return Err(ApiError::invalid_input(format!(
                "No valid key specs matched for: {}",
                py_repr(item)
            )));
        };
        let ip_version = match item.get("ip_version") {
            None | Some(Value::Null) => 4,
            Some(v) => input::to_int("ip_version", v)?,
        };
        out.push(DhcpOpt {
            opt_name: name.to_string(),
            opt_value: value.clone(),
            ip_version,
        });
    }
    Ok(out)
}

pub(super) fn aap_needs_port_security() -> ApiError {
    ApiError::conflict(
        "AddressPairAndPortSecurityRequired",
        "Port Security must be enabled in order to have allowed address pairs on a port.",
    )
}

const VNIC_TYPES: [&str; 11] = [
    "normal",
    "direct",
    "macvtap",
    "baremetal",
    "direct-physical",
    "virtio-forwarder",
    "smart-nic",
    "vdpa",
    "accelerator-direct",
    "accelerator-direct-physical",
    "remote-managed",
];

pub(super) fn vnic_type(obj: &Obj) -> ApiResult<Option<String>> {
    match input::opt_str(obj, "binding:vnic_type")? {
        Some(v) if !VNIC_TYPES.contains(&v.as_str()) => Err(ApiError::invalid_attr(
            "binding:vnic_type",
            format!("{v} is not in valid_values"),
        )),
        other => Ok(other),
    }
}
