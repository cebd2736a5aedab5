//! Floating IPs (`router` extension), as neutron-server 29 with the L3 router plugin answers (checked by the
//! contract suite's `floating_ips` cases).
//!
//! Observed on a real server: a floating IP takes its address from a subnet of a `router:external` network
//! through a port owned by `network:floatingip` (so the address is taken like any port's, and the network is in
//! use while it exists); `tags` are refused in the POST (they are set afterwards through the tag routes); a
//! port can only be associated when a router has its gateway on the floating network and an interface on the
//! port's subnet (`ExternalGatewayForFloatingIPNotFound`, 404); one fixed IP has at most one floating IP per
//! external network (`FloatingIPPortAlreadyAssociated`, 409); deleting the associated port disassociates.
//! Without an L3 agent the status stays `DOWN`.

use serde_json::{Value, json};

use super::{FixedIp, STD_READONLY, Std, Store, std_from};
use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};
use crate::ipam;

pub const FLOATINGIP_OWNER: &str = "network:floatingip";

#[derive(Debug, Clone)]
pub struct FloatingIp {
    pub std: Std,
    pub network_id: String,
    /// The port holding the floating address on the external network.
    pub own_port: String,
    pub address: String,
    /// The associated port and which of its fixed IPs is translated.
    pub port_id: Option<String>,
    pub fixed_ip: Option<String>,
    pub router_id: Option<String>,
}

fn bad(message: String) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::BAD_REQUEST,
        "BadRequest",
        format!("Bad floatingip request: {message}"),
    )
}

impl Store {
    pub fn create_floatingip(&mut self, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "floatingip")?;
        input::check_attrs(
            obj,
            &["description", "port_id", "fixed_ip_address"],
            &[
                "project_id",
                "tenant_id",
                "floating_network_id",
                "floating_ip_address",
                "subnet_id",
            ],
            &[
                "id",
                "created_at",
                "updated_at",
                "revision_number",
                "status",
                "tags",
                "router_id",
            ],
            false,
        )?;
        let network_id = input::req_str(obj, "floating_network_id")?;
        let net = self
            .networks
            .get(&network_id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Network, &network_id))?;
        if !net.external {
            return Err(bad(format!(
                "Network {network_id} is not a valid external network."
            )));
        }
        let has_v4 = net
            .subnets
            .iter()
            .any(|s| self.subnets.get(s).is_some_and(|s| s.cidr.version == 4));
        if !has_v4 {
            return Err(bad(format!(
                "Network {network_id} does not contain any IPv4 subnet."
            )));
        }
        let mut std = std_from(obj, 0)?;
        self.check_quota(&std.project_id, "floatingip", 1)?;
        let subnet_id = input::opt_str(obj, "subnet_id")?;
        if let Some(s) = &subnet_id {
            match self.subnets.get(s) {
                None => return Err(ApiError::resource_not_found(Resource::Subnet, s)),
                Some(sub) if sub.network_id != network_id => {
                    return Err(bad(format!(
                        "Subnet with id {s} is not part of the network {network_id}."
                    )));
                }
                Some(_) => {}
            }
        }
        let address = input::opt_str(obj, "floating_ip_address")?;
        let port_id = input::opt_str(obj, "port_id")?;
        let fixed_ip = input::opt_str(obj, "fixed_ip_address")?;
        std.name = String::new();
        let mut fixed = Obj::new();
        if let Some(s) = &subnet_id {
            fixed.insert("subnet_id".into(), json!(s));
        }
        if let Some(a) = &address {
            fixed.insert("ip_address".into(), json!(a));
        }
        let mut port = Obj::new();
        port.insert("network_id".into(), json!(network_id));
        port.insert("device_id".into(), json!(std.id));
        port.insert("device_owner".into(), json!(FLOATINGIP_OWNER));
        port.insert("port_security_enabled".into(), json!(false));
        port.insert("security_groups".into(), json!([]));
        if fixed.is_empty() {
            // One IPv4 address: a floating IP has no IPv6 side.
            let v4 = net
                .subnets
                .iter()
                .find(|s| {
                    self.subnets
                        .get(*s)
                        .is_some_and(|s| s.cidr.version == 4 && s.ipam.has_free())
                })
                .cloned();
            let Some(v4) = v4 else {
                return Err(ApiError::conflict(
                    "IpAddressGenerationFailure",
                    format!("No more IP addresses available on network {network_id}."),
                ));
            };
            fixed.insert("subnet_id".into(), json!(v4));
        }
        port.insert("fixed_ips".into(), json!([Value::Object(fixed)]));
        // Associating checks everything before the address is taken, so a refused association leaves nothing.
        let association = match &port_id {
            Some(p) => Some(self.association(&std.id, &network_id, p, fixed_ip.as_deref())?),
            None => None,
        };
        let own_port = self
            .create_ports(&[&port])?
            .into_iter()
            .next()
            .ok_or_else(ApiError::internal)?;
        let address = self
            .ports
            .get(&own_port)
            .and_then(|p| p.fixed_ips.first())
            .map(|f| ipam::format_ip(f.version, f.ip))
            .unwrap_or_default();
        let id = std.id.clone();
        let (port_id, fixed_ip, router_id) = match association {
            Some((p, f, r)) => (Some(p), Some(f), Some(r)),
            None => (None, None, None),
        };
        self.floatingips.insert(
            id.clone(),
            FloatingIp {
                std,
                network_id,
                own_port,
                address,
                port_id,
                fixed_ip,
                router_id,
            },
        );
        Ok(self.render_floatingip(&id))
    }

    /// The (port, fixed IP, router) a floating IP on `network_id` would be associated with, or why not.
    fn association(
        &self,
        fip_id: &str,
        network_id: &str,
        port_id: &str,
        fixed_ip: Option<&str>,
    ) -> ApiResult<(String, String, String)> {
        let port = self
            .ports
            .get(port_id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::Port, port_id))?;
        let v4: Vec<&FixedIp> = port.fixed_ips.iter().filter(|f| f.version == 4).collect();
        let chosen = match fixed_ip {
            Some(want) => v4
                .iter()
                .find(|f| ipam::format_ip(4, f.ip) == want)
                .copied()
                .ok_or_else(|| bad(format!("Port {port_id} does not have fixed ip {want}.")))?,
            None => match v4.as_slice() {
                [] => {
                    return Err(bad(format!("No IPv4 addresses found on port {port_id}.")));
                }
                [one] => *one,
                _ => {
                    return Err(bad(format!(
                        "Port {port_id} has multiple fixed IPv4 addresses.  Must provide a specific IPv4 address when assigning a floating IP"
                    )));
                }
            },
        };
        let address = ipam::format_ip(4, chosen.ip);
        let router = self
            .routers
            .values()
            .find(|r| {
                r.external_gateway_info.get("network_id").and_then(Value::as_str) == Some(network_id)
                    && self.router_port_on_subnet(&r.std.id, &chosen.subnet_id).is_some()
            })
            .ok_or_else(|| {
                ApiError::not_found(
                    "ExternalGatewayForFloatingIPNotFound",
                    format!(
                        "External network {network_id} is not reachable from subnet {}.  Therefore, cannot associate Port {port_id} with a Floating IP.",
                        chosen.subnet_id
                    ),
                )
            })?;
        if let Some(other) = self.floatingips.values().find(|f| {
            f.std.id != fip_id
                && f.network_id == network_id
                && f.port_id.as_deref() == Some(port_id)
                && f.fixed_ip.as_deref() == Some(address.as_str())
        }) {
            return Err(ApiError::conflict(
                "FloatingIPPortAlreadyAssociated",
                format!(
                    "Cannot associate floating IP {} ({fip_id}) with port {port_id} using fixed IP {address}, as that fixed IP already has a floating IP on external network {network_id}.",
                    self.floatingips
                        .get(fip_id)
                        .map(|f| f.address.as_str())
                        .unwrap_or(other.address.as_str()),
                ),
            ));
        }
        Ok((port_id.to_string(), address, router.std.id.clone()))
    }

    pub fn update_floatingip(&mut self, id: &str, body: &Value) -> ApiResult<Value> {
        let obj = input::member(body, "floatingip")?;
        input::check_attrs(
            obj,
            &["description", "port_id", "fixed_ip_address"],
            &[
                "project_id",
                "tenant_id",
                "floating_network_id",
                "floating_ip_address",
                "subnet_id",
            ],
            &STD_READONLY,
            true,
        )?;
        let fip = self
            .floatingips
            .get(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::FloatingIp, id))?;
        let network_id = fip.network_id.clone();
        let description = input::opt_str(obj, "description")?;
        let fixed_ip = input::opt_str(obj, "fixed_ip_address")?;
        // `port_id: null` disassociates; absent leaves the association as it is.
        let association = match obj.get("port_id") {
            None => None,
            Some(Value::Null) => Some(None),
            Some(_) => {
                let port_id = input::req_str(obj, "port_id")?;
                Some(Some(self.association(
                    id,
                    &network_id,
                    &port_id,
                    fixed_ip.as_deref(),
                )?))
            }
        };
        let fip = self
            .floatingips
            .get_mut(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::FloatingIp, id))?;
        if let Some(d) = description {
            fip.std.description = d;
        }
        match association {
            None => {}
            Some(None) => {
                fip.port_id = None;
                fip.fixed_ip = None;
                fip.router_id = None;
            }
            Some(Some((p, f, r))) => {
                fip.port_id = Some(p);
                fip.fixed_ip = Some(f);
                fip.router_id = Some(r);
            }
        }
        fip.std.bump();
        Ok(self.render_floatingip(id))
    }

    pub fn delete_floatingip(&mut self, id: &str) -> ApiResult<()> {
        let fip = self
            .floatingips
            .remove(id)
            .ok_or_else(|| ApiError::resource_not_found(Resource::FloatingIp, id))?;
        self.remove_port(&fip.own_port);
        Ok(())
    }

    /// A port that goes away takes its floating IP associations with it (the floating IPs stay).
    pub(super) fn disassociate_port(&mut self, port_id: &str) {
        for fip in self
            .floatingips
            .values_mut()
            .filter(|f| f.port_id.as_deref() == Some(port_id))
        {
            fip.port_id = None;
            fip.fixed_ip = None;
            fip.router_id = None;
            fip.std.bump();
        }
    }

    pub fn render_floatingip(&self, id: &str) -> Value {
        let Some(f) = self.floatingips.get(id) else {
            return Value::Null;
        };
        let mut o = Obj::new();
        f.std.fill(&mut o);
        // Floating IPs have no name.
        o.remove("name");
        let port_details = f.port_id.as_deref().and_then(|p| self.ports.get(p)).map(|p| {
            json!({
                "name": p.std.name,
                "network_id": p.network_id,
                "mac_address": p.mac,
                "admin_state_up": p.admin_state_up,
                "status": p.status,
                "device_id": p.device_id,
                "device_owner": p.device_owner,
            })
        });
        for (k, v) in [
            ("floating_ip_address", json!(f.address)),
            ("floating_network_id", json!(f.network_id)),
            ("router_id", json!(f.router_id)),
            ("port_id", json!(f.port_id)),
            ("fixed_ip_address", json!(f.fixed_ip)),
            ("status", json!("DOWN")),
            ("port_details", port_details.unwrap_or(Value::Null)),
        ] {
            o.insert(k.into(), v);
        }
        Value::Object(o)
    }
}
