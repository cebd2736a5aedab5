//! `[octavia_defaults] enforce_sg_rules`: which client addresses each listener admits, from the ingress
//! rules of the load balancer's security groups. Pure (the caller reads the rules and the address groups).
//!
//! Upstream's `_create_listeners_acls`: the load balancer proxies connections, so the backends' own groups
//! see the load balancer's address, not the client's; the policies' ingress rules are therefore copied onto
//! the listener as `allowed_cidrs`. For each listener, over the groups' ingress rules of its protocol (or of
//! any protocol) whose port range holds the Service's target port:
//! - a group of `[neutron_defaults] pod_security_groups` (no policy selects the backends), a rule without a
//!   remote, or no group at all: the listener stays open (no ACL);
//! - otherwise the union of the rules' remote prefixes; none at all closes the listener
//!   (`admin_state_up: false`, upstream's "no CIDR is allowed").
//!
//! Rules naming a remote security group are skipped as upstream does (a policy group has none). kuryr-rs
//! policies keep selector peers in address groups instead of one rule per pod IP, so a rule's address
//! group stands for its addresses. Rules of the other IP version than the VIP are skipped (Octavia refuses
//! an IPv6 CIDR on an IPv4 listener).

use std::collections::{BTreeMap, BTreeSet};

use kuryr_crds::LbListenerAcl;

/// One ingress-relevant rule of a security group, as Neutron has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub direction: String,
    /// `IPv4` or `IPv6`.
    pub ethertype: String,
    /// Neutron's protocol name (`tcp`); `None` for any.
    pub protocol: Option<String>,
    pub port_range_min: Option<u32>,
    pub port_range_max: Option<u32>,
    pub remote: Remote,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remote {
    Any,
    Prefix(String),
    /// An address group, with its addresses.
    Addresses(Vec<String>),
    /// Another security group: skipped, as upstream.
    Group,
}

/// A listener to decide for: its protocol and port, and the backends' port(s) the rules must cover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerPorts {
    pub protocol: String,
    pub port: u16,
    /// The Service's target port; several when a named port resolves differently per backend; none when
    /// a named port is not resolved yet (then only rules without a port range apply, as upstream).
    pub target_ports: Vec<u16>,
}

/// What one listener admits: `None` is everyone, `Some(cidrs)` only those (none: nobody).
pub type Admitted = Option<Vec<String>>;

/// Whether any group is one of the pod defaults, i.e. no policy selects the backends: then every listener
/// is open and the rules need not be read.
pub fn any_default(groups: &[String], defaults: &[String]) -> bool {
    groups.is_empty() || groups.iter().any(|g| defaults.contains(g))
}

/// Each listener's admitted sources from `rules` (the rules of the load balancer's groups, all of them).
pub fn admitted(
    groups: &[String],
    defaults: &[String],
    rules: &[Rule],
    listeners: &[ListenerPorts],
    vip_is_v6: bool,
) -> BTreeMap<(String, u16), Admitted> {
    let open = any_default(groups, defaults);
    let ethertype = if vip_is_v6 { "IPv6" } else { "IPv4" };
    listeners
        .iter()
        .map(|l| {
            let key = (l.protocol.to_ascii_uppercase(), l.port);
            if open {
                return (key, None);
            }
            let proto = l.protocol.to_ascii_lowercase();
            let mut cidrs = BTreeSet::new();
            let mut everyone = false;
            for r in rules {
                if r.direction != "ingress" || !r.ethertype.eq_ignore_ascii_case(ethertype) {
                    continue;
                }
                if r.protocol.as_deref().is_some_and(|p| p != proto && p != "any") {
                    continue;
                }
                if let Some(min) = r.port_range_min {
                    let max = r.port_range_max.unwrap_or(min);
                    if !l
                        .target_ports
                        .iter()
                        .any(|t| (min..=max).contains(&u32::from(*t)))
                    {
                        continue;
                    }
                }
                match &r.remote {
                    Remote::Any => everyone = true,
                    Remote::Prefix(p) => {
                        cidrs.insert(p.clone());
                    }
                    // A peer's address group holds both families (its IPv4 and IPv6 rules name
                    // the same group); Octavia refuses a CIDR of the other family than the VIP's.
                    Remote::Addresses(a) => {
                        cidrs.extend(a.iter().filter(|c| c.contains(':') == vip_is_v6).cloned())
                    }
                    Remote::Group => {}
                }
            }
            (key, (!everyone).then(|| cidrs.into_iter().collect()))
        })
        .collect()
}

/// The spec's form: only the restricted listeners, ordered by protocol and port.
pub fn to_spec(admitted: &BTreeMap<(String, u16), Admitted>) -> Vec<LbListenerAcl> {
    admitted
        .iter()
        .filter_map(|((protocol, port), a)| {
            a.as_ref().map(|cidrs| LbListenerAcl {
                protocol: protocol.clone(),
                port: i32::from(*port),
                allowed_cidrs: cidrs.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(protocol: Option<&str>, ports: Option<(u32, u32)>, remote: Remote) -> Rule {
        Rule {
            direction: "ingress".into(),
            ethertype: "IPv4".into(),
            protocol: protocol.map(str::to_string),
            port_range_min: ports.map(|p| p.0),
            port_range_max: ports.map(|p| p.1),
            remote,
        }
    }

    fn listeners() -> Vec<ListenerPorts> {
        vec![
            ListenerPorts {
                protocol: "TCP".into(),
                port: 80,
                target_ports: vec![8080],
            },
            ListenerPorts {
                protocol: "UDP".into(),
                port: 53,
                target_ports: vec![5353],
            },
        ]
    }

    fn key(p: &str, n: u16) -> (String, u16) {
        (p.into(), n)
    }

    #[test]
    fn default_groups_or_none_leave_every_listener_open() {
        let rules = [rule(Some("tcp"), None, Remote::Prefix("10.0.0.0/24".into()))];
        let defaults = vec!["default-sg".to_string()];
        for groups in [vec![], vec!["np".to_string(), "default-sg".to_string()]] {
            let a = admitted(&groups, &defaults, &rules, &listeners(), false);
            assert_eq!(a[&key("TCP", 80)], None, "{groups:?}");
            assert_eq!(a[&key("UDP", 53)], None, "{groups:?}");
        }
    }

    #[test]
    fn prefixes_and_address_groups_of_matching_rules_are_admitted() {
        let groups = vec!["np".to_string()];
        let rules = [
            rule(
                Some("tcp"),
                Some((8080, 8080)),
                Remote::Addresses(vec!["10.1.0.5/32".into(), "10.1.0.6/32".into()]),
            ),
            rule(
                Some("tcp"),
                Some((8000, 8100)),
                Remote::Prefix("192.168.0.0/24".into()),
            ),
            // Another port, another protocol, egress, IPv6, a remote group: none of them counts.
            rule(
                Some("tcp"),
                Some((9000, 9000)),
                Remote::Prefix("172.16.0.0/12".into()),
            ),
            rule(
                Some("udp"),
                Some((8080, 8080)),
                Remote::Prefix("172.17.0.0/16".into()),
            ),
            Rule {
                direction: "egress".into(),
                ..rule(None, None, Remote::Any)
            },
            Rule {
                ethertype: "IPv6".into(),
                ..rule(None, None, Remote::Prefix("fd00::/64".into()))
            },
            rule(None, None, Remote::Group),
        ];
        let a = admitted(&groups, &[], &rules, &listeners(), false);
        assert_eq!(
            a[&key("TCP", 80)],
            Some(vec![
                "10.1.0.5/32".to_string(),
                "10.1.0.6/32".into(),
                "192.168.0.0/24".into()
            ])
        );
        // Nothing admits UDP 5353: the listener admits nobody.
        assert_eq!(a[&key("UDP", 53)], Some(vec![]));
        let spec = to_spec(&a);
        assert_eq!(spec.len(), 2);
        assert_eq!((spec[0].protocol.as_str(), spec[0].port), ("TCP", 80));
    }

    #[test]
    fn a_rule_without_remote_opens_the_listener_and_any_protocol_counts() {
        let groups = vec!["np".to_string()];
        let rules = [
            rule(Some("tcp"), None, Remote::Prefix("10.1.0.5/32".into())),
            rule(None, Some((5353, 5353)), Remote::Any),
        ];
        let a = admitted(&groups, &[], &rules, &listeners(), false);
        assert_eq!(a[&key("TCP", 80)], Some(vec!["10.1.0.5/32".to_string()]));
        assert_eq!(a[&key("UDP", 53)], None);
        assert_eq!(to_spec(&a).len(), 1);
    }

    #[test]
    fn an_unresolved_named_port_matches_only_rules_without_a_range() {
        let groups = vec!["np".to_string()];
        let rules = [
            rule(
                Some("tcp"),
                Some((8080, 8080)),
                Remote::Prefix("10.1.0.5/32".into()),
            ),
            rule(Some("tcp"), None, Remote::Prefix("10.1.0.7/32".into())),
        ];
        let l = [ListenerPorts {
            protocol: "TCP".into(),
            port: 80,
            target_ports: vec![],
        }];
        let a = admitted(&groups, &[], &rules, &l, false);
        assert_eq!(a[&key("TCP", 80)], Some(vec!["10.1.0.7/32".to_string()]));
    }

    #[test]
    fn the_vip_family_picks_the_rules() {
        let groups = vec!["np".to_string()];
        let rules = [
            rule(Some("tcp"), None, Remote::Prefix("10.1.0.5/32".into())),
            Rule {
                ethertype: "IPv6".into(),
                ..rule(Some("tcp"), None, Remote::Prefix("fd00::5/128".into()))
            },
        ];
        let a = admitted(&groups, &[], &rules, &listeners()[..1], true);
        assert_eq!(a[&key("TCP", 80)], Some(vec!["fd00::5/128".to_string()]));
    }

    #[test]
    fn an_address_group_gives_only_the_vip_familys_addresses() {
        let groups = vec!["np".to_string()];
        let peers = Remote::Addresses(vec!["10.1.0.5/32".into(), "fd00::5/128".into()]);
        let rules = [
            rule(Some("tcp"), None, peers.clone()),
            Rule {
                ethertype: "IPv6".into(),
                ..rule(Some("tcp"), None, peers)
            },
        ];
        let v4 = admitted(&groups, &[], &rules, &listeners()[..1], false);
        assert_eq!(v4[&key("TCP", 80)], Some(vec!["10.1.0.5/32".to_string()]));
        let v6 = admitted(&groups, &[], &rules, &listeners()[..1], true);
        assert_eq!(v6[&key("TCP", 80)], Some(vec!["fd00::5/128".to_string()]));
    }
}
