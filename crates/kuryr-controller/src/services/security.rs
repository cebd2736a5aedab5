//! Reads what `acls.rs` decides from: the rules of a Service's load balancer groups and the addresses of
//! the address groups they name (Neutron reads only; nothing is written here).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kuryr_crds::{LbEndpointSlice, LbListenerAcl, LbSpecPort};
use kuryr_neutron::{ListFilter, NeutronClient};

use super::acls::{self, ListenerPorts, Remote, Rule};
use crate::drivers::vif::IDS_PER_LIST;
use crate::error::Error;

/// Group ids per rule list: `security_group_id=<uuid>&` takes 55 bytes, and the whole request line
/// must fit uWSGI's default 4 KiB buffer in front of neutron-server (as [`IDS_PER_LIST`] for `id=`).
const GROUPS_PER_LIST: usize = 32;

/// The backends' port(s) a Service port leads to: its number, or for a named target port the numbers the
/// EndpointSlices give the port of the same name.
pub fn target_ports(port: &LbSpecPort, slices: &[LbEndpointSlice]) -> Vec<u16> {
    if let Ok(n) = port.target_port.parse::<u16>() {
        return vec![n];
    }
    let mut out: Vec<u16> = slices
        .iter()
        .flat_map(|s| &s.ports)
        .filter(|sp| sp.name.as_deref().unwrap_or("") == port.name.as_deref().unwrap_or(""))
        .filter_map(|sp| sp.port.and_then(|n| u16::try_from(n).ok()))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The listener ACLs of a load balancer with `groups` serving `ports` on `vip`: the restricted listeners
/// only (see `acls.rs`). Reads nothing when a pod default group is among `groups` (all listeners open).
pub async fn listener_acls(
    neutron: &NeutronClient,
    groups: &[String],
    defaults: &[String],
    ports: &[LbSpecPort],
    slices: &[LbEndpointSlice],
    vip: IpAddr,
) -> Result<Vec<LbListenerAcl>, Error> {
    if acls::any_default(groups, defaults) {
        return Ok(Vec::new());
    }
    // In lists, not one read per group and per address group: a resync of every Service guarded
    // by policies reads this for each of them.
    let mut read = Vec::new();
    for filter in ListFilter::new().chunked("security_group_id", groups, GROUPS_PER_LIST) {
        read.extend(neutron.list_security_group_rules(&filter).await?);
    }
    let named: Vec<&str> = read
        .iter()
        .filter_map(|r| r.remote_address_group_id.as_deref())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut address_groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for filter in ListFilter::new().chunked("id", &named, IDS_PER_LIST) {
        for ag in neutron.list_address_groups(&filter).await? {
            address_groups.insert(ag.id, ag.addresses);
        }
    }
    let rules: Vec<Rule> = read
        .into_iter()
        .map(|r| {
            let remote = if let Some(ag) = r.remote_address_group_id.as_deref() {
                // One deleted meanwhile admits nothing: its rule goes with it.
                Remote::Addresses(address_groups.get(ag).cloned().unwrap_or_default())
            } else if let Some(p) = r.remote_ip_prefix.clone().filter(|p| !p.is_empty()) {
                Remote::Prefix(p)
            } else if r.remote_group_id.is_some() {
                Remote::Group
            } else {
                Remote::Any
            };
            Rule {
                direction: r.direction,
                ethertype: r.ethertype,
                protocol: r.protocol,
                port_range_min: r.port_range_min,
                port_range_max: r.port_range_max,
                remote,
            }
        })
        .collect();
    let listeners: Vec<ListenerPorts> = ports
        .iter()
        .filter_map(|p| {
            Some(ListenerPorts {
                protocol: p.protocol.clone(),
                port: u16::try_from(p.port).ok()?,
                target_ports: target_ports(p, slices),
            })
        })
        .collect();
    let admitted = acls::admitted(groups, defaults, &rules, &listeners, vip.is_ipv6());
    Ok(acls::to_spec(&admitted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kuryr_crds::LbEndpointPort;

    #[test]
    fn named_target_ports_resolve_through_the_slices() {
        let port = |target: &str| LbSpecPort {
            name: Some("http".into()),
            port: 80,
            protocol: "TCP".into(),
            target_port: target.into(),
        };
        let slices = vec![LbEndpointSlice {
            endpoints: vec![],
            ports: vec![
                LbEndpointPort {
                    name: Some("http".into()),
                    port: Some(8080),
                    protocol: Some("TCP".into()),
                },
                LbEndpointPort {
                    name: Some("metrics".into()),
                    port: Some(9090),
                    protocol: Some("TCP".into()),
                },
            ],
        }];
        assert_eq!(target_ports(&port("8081"), &slices), vec![8081]);
        assert_eq!(target_ports(&port("web"), &slices), vec![8080]);
        assert_eq!(target_ports(&port("web"), &[]), Vec::<u16>::new());
    }
}
