//! Port binding as ML2 decides it, and the delayed DOWN -> ACTIVE transitions of ports and trunks.

use serde_json::Value;

use super::{
    Activation, AgentHosts, OVS_BRIDGE_MAPPINGS, Port, SRIOV_DEVICE_MAPPINGS, Store, TRUNK_SUBPORT_OWNER,
};

/// A port's binding as ML2 (openvswitch + sriovnicswitch) decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    Unbound,
    Failed,
    Ovs,
    /// sriovnicswitch: the VLAN the VF gets ("0" on a flat network).
    HwVeb {
        vlan: String,
    },
}

impl Binding {
    pub fn bound(&self) -> bool {
        matches!(self, Binding::Ovs | Binding::HwVeb { .. })
    }
}

impl Store {
    fn host_binds(&self, host: &str) -> bool {
        !host.is_empty()
            && match &self.agent_hosts {
                AgentHosts::Any => true,
                AgentHosts::Only(h) => h.contains(host),
            }
    }

    /// The port's binding, as ML2 with the openvswitch and sriovnicswitch mechanism drivers decides it with an
    /// OVS agent ([`OVS_BRIDGE_MAPPINGS`]) and a NIC Switch agent ([`SRIOV_DEVICE_MAPPINGS`]) on every agent host:
    /// - `normal` (and `direct` with the `switchdev` capability, OVS hardware offload): `ovs` on a VXLAN network or
    ///   a flat/VLAN network of a bridge-mapped physnet;
    /// - `direct` / `macvtap`: `hw_veb` on a flat/VLAN network of a device-mapped physnet;
    /// - anything else, another host or another network: `binding_failed`.
    pub fn binding(&self, p: &Port) -> Binding {
        if p.host.is_empty() {
            return Binding::Unbound;
        }
        if !self.host_binds(&p.host) {
            return Binding::Failed;
        }
        let Some(net) = self.networks.get(&p.network_id) else {
            return Binding::Failed;
        };
        let physnet = net.physical_network.as_deref().unwrap_or_default();
        let physical = net.network_type == "vlan" || net.network_type == "flat";
        let switchdev = p
            .profile
            .get("capabilities")
            .and_then(Value::as_array)
            .is_some_and(|c| c.iter().any(|c| c == "switchdev"));
        match p.vnic_type.as_str() {
            "normal" => {}
            "direct" if switchdev => {}
            "direct" | "macvtap" => {
                return if physical && SRIOV_DEVICE_MAPPINGS.iter().any(|m| m.0 == physnet) {
                    Binding::HwVeb {
                        vlan: net.segmentation_id.unwrap_or(0).to_string(),
                    }
                } else {
                    Binding::Failed
                };
            }
            _ => return Binding::Failed,
        }
        if net.network_type == "vxlan" || OVS_BRIDGE_MAPPINGS.iter().any(|m| m.0 == physnet) {
            Binding::Ovs
        } else {
            Binding::Failed
        }
    }

    pub(super) fn port_binds(&self, id: &str) -> bool {
        self.ports.get(id).is_some_and(|p| self.binding(p).bound())
    }

    /// Flips a port or trunk to ACTIVE if nothing changed since the activation was scheduled.
    pub fn activate(&mut self, a: &Activation) {
        match a {
            Activation::Port { id, generation } => {
                if let Some(p) = self.ports.get_mut(id)
                    && p.bind_gen == *generation
                    && !p.host.is_empty()
                    && p.status != "ACTIVE"
                {
                    p.status = "ACTIVE".into();
                    p.std.bump();
                }
            }
            Activation::Trunk { id, generation } => {
                if let Some(t) = self.trunks.get_mut(id)
                    && t.generation == *generation
                {
                    t.status = "ACTIVE".into();
                }
            }
        }
    }

    /// The parent's binding changed: bind (or leave) the subports and schedule the trunk's activation.
    pub(super) fn wire_trunk(&mut self, trunk_id: &str, host: &str) {
        let binds = self.host_binds(host);
        let Some(trunk) = self.trunks.get_mut(trunk_id) else {
            return;
        };
        trunk.generation += 1;
        trunk.status = "DOWN".into();
        let generation = trunk.generation;
        let subs: Vec<String> = trunk.sub_ports.iter().map(|s| s.port_id.clone()).collect();
        if binds {
            self.activations.push(Activation::Trunk {
                id: trunk_id.to_string(),
                generation,
            });
            for sp in subs {
                self.bind_subport(&sp, host);
            }
        }
    }

    fn bind_subport(&mut self, port_id: &str, host: &str) {
        if let Some(p) = self.ports.get_mut(port_id) {
            p.device_owner = TRUNK_SUBPORT_OWNER.into();
            if p.host != host {
                p.host = host.to_string();
                p.bind_gen += 1;
                p.status = "DOWN".into();
                p.std.revision += 2;
            }
            p.std.bump();
            let generation = p.bind_gen;
            if self.port_binds(port_id) {
                self.activations.push(Activation::Port {
                    id: port_id.to_string(),
                    generation,
                });
            }
        }
    }
}
