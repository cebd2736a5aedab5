//! Amphora records (`/v2/octavia/amphorae`): the `amphora` provider keeps one per load balancer
//! (SINGLE topology) even on the noop compute driver, holding the VIP; its status follows the load
//! balancer's (BOOTING while it is created, ALLOCATED once it serves).

use serde_json::{Value, json};

use super::{ACTIVE, Common, ERROR, PENDING_DELETE, Store};

impl Store {
    /// Every amphora with the common attributes `list` filters and orders by.
    pub fn amphorae(&self) -> Vec<(Common, Value)> {
        self.loadbalancers
            .values()
            .filter_map(|lb| {
                let id = lb.amphora_id.as_ref()?;
                let status = match lb.common.provisioning_status.as_str() {
                    ACTIVE | "PENDING_UPDATE" => "ALLOCATED",
                    PENDING_DELETE => "PENDING_DELETE",
                    ERROR => "ERROR",
                    _ => "BOOTING",
                };
                let mut common = lb.common.clone();
                common.id = id.clone();
                let body = json!({
                    "id": id,
                    "loadbalancer_id": lb.common.id,
                    "compute_id": null,
                    "lb_network_ip": null,
                    "vrrp_ip": null,
                    "ha_ip": lb.vip_address,
                    "vrrp_port_id": null,
                    "ha_port_id": lb.vip_port_id,
                    "cert_expiration": null,
                    "cert_busy": false,
                    "role": "STANDALONE",
                    "status": status,
                    "vrrp_interface": null,
                    "vrrp_id": 1,
                    "vrrp_priority": null,
                    "cached_zone": lb.availability_zone,
                    "created_at": lb.common.created_at,
                    "updated_at": lb.common.updated_at,
                    "image_id": null,
                    "compute_flavor": null,
                });
                Some((common, body))
            })
            .collect()
    }
}
