//! Recorded tree vs desired tree -> the Octavia writes that close the gap. Pure.
//!
//! Fewest calls: a new load balancer is ONE fully populated create; a new Service port is a listener, a
//! pool and one batch of members (Octavia takes a whole tree only when creating a load balancer); any
//! change of a pool's members is ONE batch member update; equal trees plan nothing.

use super::desired::DesiredLb;
use super::recorded::RecordedLb;

/// (Octavia protocol, port) of a listener.
pub type ListenerKey = (String, u16);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create the whole tree in one call.
    CreateTree,
    /// The recorded load balancer cannot become the desired one (other VIP, subnet or provider): delete it
    /// with everything under it, then [`Step::CreateTree`].
    Replace { lb_id: String, why: String },
    DeleteListener {
        key: ListenerKey,
        listener_id: String,
        pool_id: Option<String>,
    },
    /// A listener with its default pool and members.
    CreateListener { key: ListenerKey },
    /// The listener's timeouts or admitted sources (one update for both).
    UpdateListener { key: ListenerKey, listener_id: String },
    /// A recorded listener that lost its pool.
    CreatePool { key: ListenerKey, listener_id: String },
    /// The pool's session persistence (the Service's `sessionAffinity` changed).
    UpdatePool { key: ListenerKey, pool_id: String },
    /// The pool's members become exactly the desired ones (batch member update).
    SetMembers { key: ListenerKey, pool_id: String },
}

/// Octavia calls its reference provider both `amphora` and `octavia`.
fn same_provider(recorded: &str, desired: Option<&str>) -> bool {
    let norm = |p: &str| {
        if p == "octavia" {
            "amphora".to_string()
        } else {
            p.to_string()
        }
    };
    match desired {
        None => true,
        Some(d) => recorded.is_empty() || norm(recorded) == norm(d),
    }
}

pub fn plan(recorded: Option<&RecordedLb>, desired: &DesiredLb) -> Vec<Step> {
    let Some(rec) = recorded else {
        return vec![Step::CreateTree];
    };
    let why = if rec.ip != desired.vip_address {
        Some(format!("VIP {} is now {}", rec.ip, desired.vip_address))
    } else if rec.subnet_id != desired.vip_subnet_id {
        Some(format!(
            "VIP subnet {} is now {}",
            rec.subnet_id, desired.vip_subnet_id
        ))
    } else if !same_provider(&rec.provider, desired.provider.as_deref()) {
        Some(format!(
            "provider {} is now {}",
            rec.provider,
            desired.provider.as_deref().unwrap_or_default()
        ))
    } else {
        None
    };
    if let Some(why) = why {
        return vec![
            Step::Replace {
                lb_id: rec.id.clone(),
                why,
            },
            Step::CreateTree,
        ];
    }
    let mut steps = Vec::new();
    // Deletions first: a port that changed protocol frees its number before the new listener wants it.
    for (key, l) in &rec.listeners {
        if !desired.listeners.contains_key(key) {
            steps.push(Step::DeleteListener {
                key: key.clone(),
                listener_id: l.id.clone(),
                pool_id: l.pool.as_ref().map(|p| p.id.clone()),
            });
        }
    }
    for (key, want) in &desired.listeners {
        let Some(have) = rec.listeners.get(key) else {
            steps.push(Step::CreateListener { key: key.clone() });
            continue;
        };
        if have.timeout_client_data != want.timeout_client_data
            || have.timeout_member_data != want.timeout_member_data
            || have.allowed_cidrs != want.allowed_cidrs
        {
            steps.push(Step::UpdateListener {
                key: key.clone(),
                listener_id: have.id.clone(),
            });
        }
        match &have.pool {
            None => steps.push(Step::CreatePool {
                key: key.clone(),
                listener_id: have.id.clone(),
            }),
            Some(pool) => {
                // An unknown record was written by upstream, which never set a pool's session
                // persistence: none, so a Service asking for ClientIP affinity gets it.
                if pool.persistence.clone().unwrap_or(None) != want.pool.persistence {
                    steps.push(Step::UpdatePool {
                        key: key.clone(),
                        pool_id: pool.id.clone(),
                    });
                }
                let same = pool.members.len() == want.pool.members.len()
                    && want.pool.members.iter().all(|(k, m)| {
                        pool.members
                            .get(k)
                            .is_some_and(|r| Some(r.subnet_id.as_str()) == m.subnet_id.as_deref())
                    });
                if !same {
                    steps.push(Step::SetMembers {
                        key: key.clone(),
                        pool_id: pool.id.clone(),
                    });
                }
            }
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::services::desired::{DesiredListener, DesiredMember, DesiredPool};
    use crate::services::recorded::{RecordedListener, RecordedMember, RecordedPool};

    fn desired(ports: &[(&str, u16)], members: &[&str]) -> DesiredLb {
        let mut listeners = BTreeMap::new();
        for (proto, port) in ports {
            let name = format!("demo/web:{proto}:{port}");
            let members = members
                .iter()
                .map(|ip| {
                    (
                        (ip.to_string(), 8080),
                        DesiredMember {
                            name: format!("demo/{ip}:8080"),
                            address: ip.to_string(),
                            port: 8080,
                            subnet_id: Some("s".into()),
                        },
                    )
                })
                .collect();
            listeners.insert(
                (proto.to_string(), *port),
                DesiredListener {
                    name: name.clone(),
                    protocol: proto.to_string(),
                    port: *port,
                    timeout_client_data: None,
                    timeout_member_data: None,
                    allowed_cidrs: None,
                    pool: DesiredPool {
                        name,
                        protocol: proto.to_string(),
                        lb_algorithm: "ROUND_ROBIN".into(),
                        persistence: None,
                        members,
                    },
                },
            );
        }
        DesiredLb {
            name: "demo/web".into(),
            vip_address: "10.0.0.10".into(),
            vip_subnet_id: "s".into(),
            project_id: "p".into(),
            provider: Some("amphora".into()),
            security_groups: vec![],
            listeners,
            skipped: Default::default(),
        }
    }

    /// What Octavia would hold after carrying out `d` (ids derived from names).
    fn recorded_from(d: &DesiredLb) -> RecordedLb {
        RecordedLb {
            id: "lb".into(),
            name: d.name.clone(),
            ip: d.vip_address.clone(),
            subnet_id: d.vip_subnet_id.clone(),
            port_id: "vip".into(),
            project_id: d.project_id.clone(),
            provider: "amphora".into(),
            security_groups: vec![],
            listeners: d
                .listeners
                .iter()
                .map(|(k, l)| {
                    (
                        k.clone(),
                        RecordedListener {
                            id: format!("l-{}", l.name),
                            name: l.name.clone(),
                            timeout_client_data: l.timeout_client_data,
                            timeout_member_data: l.timeout_member_data,
                            allowed_cidrs: l.allowed_cidrs.clone(),
                            pool: Some(RecordedPool {
                                id: format!("p-{}", l.name),
                                name: l.pool.name.clone(),
                                protocol: l.protocol.clone(),
                                persistence: Some(l.pool.persistence.clone()),
                                members: l
                                    .pool
                                    .members
                                    .iter()
                                    .map(|(k, m)| {
                                        (
                                            k.clone(),
                                            RecordedMember {
                                                id: format!("m-{}", m.name),
                                                name: m.name.clone(),
                                                subnet_id: m.subnet_id.clone().unwrap_or_default(),
                                            },
                                        )
                                    })
                                    .collect(),
                            }),
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn new_service_is_one_create() {
        assert_eq!(
            plan(None, &desired(&[("TCP", 80)], &["a", "b", "c"])),
            vec![Step::CreateTree]
        );
    }

    #[test]
    fn nothing_changed_plans_nothing() {
        let d = desired(&[("TCP", 80), ("UDP", 53)], &["a", "b", "c"]);
        assert!(plan(Some(&recorded_from(&d)), &d).is_empty());
    }

    #[test]
    fn endpoint_change_is_one_batch_per_pool() {
        let before = desired(&[("TCP", 80), ("UDP", 53)], &["a", "b", "c"]);
        let after = desired(&[("TCP", 80), ("UDP", 53)], &["a", "b", "c", "d", "e"]);
        let steps = plan(Some(&recorded_from(&before)), &after);
        assert_eq!(steps.len(), 2);
        assert!(steps.iter().all(|s| matches!(s, Step::SetMembers { .. })));
    }

    #[test]
    fn added_and_removed_ports_create_and_delete_listeners_deletions_first() {
        let before = desired(&[("TCP", 80), ("TCP", 81)], &["a"]);
        let after = desired(&[("TCP", 80), ("UDP", 81)], &["a"]);
        let steps = plan(Some(&recorded_from(&before)), &after);
        assert!(matches!(&steps[0], Step::DeleteListener { key, .. } if key == &("TCP".to_string(), 81)));
        assert_eq!(
            steps[1],
            Step::CreateListener {
                key: ("UDP".into(), 81)
            }
        );
        assert_eq!(steps.len(), 2);
    }

    #[test]
    fn vip_or_provider_change_replaces_the_load_balancer() {
        let before = desired(&[("TCP", 80)], &["a"]);
        let mut after = before.clone();
        after.provider = Some("ovn".into());
        let steps = plan(Some(&recorded_from(&before)), &after);
        assert!(matches!(&steps[0], Step::Replace { lb_id, .. } if lb_id == "lb"));
        assert_eq!(steps[1], Step::CreateTree);
        let mut after = before.clone();
        after.provider = Some("octavia".into());
        assert!(
            plan(Some(&recorded_from(&before)), &after).is_empty(),
            "octavia is amphora"
        );
    }

    #[test]
    fn timeouts_changed_update_the_listener_only() {
        let before = desired(&[("TCP", 80)], &["a"]);
        let mut after = before.clone();
        if let Some(l) = after.listeners.values_mut().next() {
            l.timeout_client_data = Some(9000);
        }
        let steps = plan(Some(&recorded_from(&before)), &after);
        assert!(matches!(&steps[..], [Step::UpdateListener { .. }]));
    }

    #[test]
    fn session_affinity_changed_updates_the_pool_and_an_upstream_record_reads_as_none() {
        let before = desired(&[("TCP", 80)], &["a"]);
        let mut after = before.clone();
        if let Some(l) = after.listeners.values_mut().next() {
            l.pool.persistence = Some("SOURCE_IP".into());
        }
        let steps = plan(Some(&recorded_from(&before)), &after);
        assert!(
            matches!(&steps[..], [Step::UpdatePool { pool_id, .. }] if pool_id.starts_with("p-")),
            "{steps:?}"
        );
        // And back to none.
        let steps = plan(Some(&recorded_from(&after)), &before);
        assert!(matches!(&steps[..], [Step::UpdatePool { .. }]), "{steps:?}");
        // A record upstream wrote does not say, and upstream never set it: none. A Service asking
        // for affinity has its pool updated; one asking for none is left as it is.
        let mut upstream = recorded_from(&before);
        for l in upstream.listeners.values_mut() {
            if let Some(p) = l.pool.as_mut() {
                p.persistence = None;
            }
        }
        assert!(matches!(
            &plan(Some(&upstream), &after)[..],
            [Step::UpdatePool { .. }]
        ));
        assert!(plan(Some(&upstream), &before).is_empty());
    }

    #[test]
    fn admitted_sources_changed_update_the_listener_only_and_equal_ones_nothing() {
        let before = desired(&[("TCP", 80), ("TCP", 81)], &["a"]);
        let mut after = before.clone();
        if let Some(l) = after.listeners.get_mut(&("TCP".to_string(), 80)) {
            l.allowed_cidrs = Some(vec!["10.1.0.0/16".into()]);
        }
        let steps = plan(Some(&recorded_from(&before)), &after);
        assert!(
            matches!(&steps[..], [Step::UpdateListener { key, .. }] if key == &("TCP".to_string(), 80)),
            "{steps:?}"
        );
        assert!(plan(Some(&recorded_from(&after)), &after).is_empty());
        // Closing a listener (nobody admitted) is a change too, and opening it again.
        let mut closed = after.clone();
        if let Some(l) = closed.listeners.get_mut(&("TCP".to_string(), 80)) {
            l.allowed_cidrs = Some(vec![]);
        }
        assert_eq!(plan(Some(&recorded_from(&after)), &closed).len(), 1);
        assert_eq!(plan(Some(&recorded_from(&closed)), &before).len(), 1);
    }
}
