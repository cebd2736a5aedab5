//! The Octavia tree as a KuryrLoadBalancer's `status` records it (upstream's status layout), and back.
//! Diffing against the record, not against Octavia, is what makes "nothing changed" cost no call; the
//! periodic reconcile checks the record against Octavia.

use std::collections::BTreeMap;

use kuryr_crds::{KuryrLoadBalancerStatus, LbListener, LbLoadBalancer, LbMember, LbPool};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordedLb {
    pub id: String,
    pub name: String,
    pub ip: String,
    pub subnet_id: String,
    pub port_id: String,
    pub project_id: String,
    pub provider: String,
    pub security_groups: Vec<String>,
    pub listeners: BTreeMap<(String, u16), RecordedListener>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordedListener {
    pub id: String,
    pub name: String,
    pub timeout_client_data: Option<u64>,
    pub timeout_member_data: Option<u64>,
    pub allowed_cidrs: Option<Vec<String>>,
    pub pool: Option<RecordedPool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordedPool {
    pub id: String,
    pub name: String,
    pub protocol: String,
    /// The session persistence type (`None`: none); unknown (outer `None`) in a record upstream wrote.
    pub persistence: Option<Option<String>>,
    pub members: BTreeMap<(String, u16), RecordedMember>,
}

/// How the status says "no session persistence" (absent means unknown).
const NO_PERSISTENCE: &str = "NONE";

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordedMember {
    pub id: String,
    pub name: String,
    pub subnet_id: String,
}

impl RecordedLb {
    /// The record in `status`; `None` when no load balancer is recorded. Entries that do not fit (a pool of
    /// an unknown listener, a port out of range) are dropped: the plan then re-creates what they stood for.
    pub fn from_status(status: Option<&KuryrLoadBalancerStatus>) -> Option<Self> {
        let status = status?;
        let lb = status.loadbalancer.as_ref().filter(|lb| !lb.id.is_empty())?;
        let mut listeners: BTreeMap<(String, u16), RecordedListener> = BTreeMap::new();
        let mut key_of_listener = BTreeMap::new();
        for l in &status.listeners {
            let Ok(port) = u16::try_from(l.port) else { continue };
            let key = (l.protocol.to_ascii_uppercase(), port);
            key_of_listener.insert(l.id.clone(), key.clone());
            listeners.insert(
                key,
                RecordedListener {
                    id: l.id.clone(),
                    name: l.name.clone(),
                    timeout_client_data: l.timeout_client_data.and_then(|v| u64::try_from(v).ok()),
                    timeout_member_data: l.timeout_member_data.and_then(|v| u64::try_from(v).ok()),
                    allowed_cidrs: l.allowed_cidrs.clone(),
                    pool: None,
                },
            );
        }
        let mut key_of_pool = BTreeMap::new();
        for p in &status.pools {
            let Some(key) = key_of_listener.get(&p.listener_id) else {
                continue;
            };
            if let Some(l) = listeners.get_mut(key) {
                key_of_pool.insert(p.id.clone(), key.clone());
                l.pool = Some(RecordedPool {
                    id: p.id.clone(),
                    name: p.name.clone(),
                    protocol: p.protocol.clone(),
                    persistence: p
                        .session_persistence
                        .as_deref()
                        .map(|t| (t != NO_PERSISTENCE).then(|| t.to_string())),
                    members: BTreeMap::new(),
                });
            }
        }
        for m in &status.members {
            let Ok(port) = u16::try_from(m.port) else { continue };
            let Some(key) = key_of_pool.get(&m.pool_id) else {
                continue;
            };
            if let Some(pool) = listeners.get_mut(key).and_then(|l| l.pool.as_mut()) {
                pool.members.insert(
                    (m.ip.clone(), port),
                    RecordedMember {
                        id: m.id.clone(),
                        name: m.name.clone(),
                        subnet_id: m.subnet_id.clone(),
                    },
                );
            }
        }
        Some(Self {
            id: lb.id.clone(),
            name: lb.name.clone(),
            ip: lb.ip.clone(),
            subnet_id: lb.subnet_id.clone(),
            port_id: lb.port_id.clone(),
            project_id: lb.project_id.clone(),
            provider: lb.provider.clone(),
            security_groups: lb.security_groups.clone(),
            listeners,
        })
    }

    /// Writes the record into `status` (the public IP entry is kept as it is).
    pub fn write_status(&self, status: &mut KuryrLoadBalancerStatus) {
        status.loadbalancer = Some(LbLoadBalancer {
            id: self.id.clone(),
            ip: self.ip.clone(),
            name: self.name.clone(),
            port_id: self.port_id.clone(),
            project_id: self.project_id.clone(),
            provider: self.provider.clone(),
            security_groups: self.security_groups.clone(),
            subnet_id: self.subnet_id.clone(),
        });
        status.listeners.clear();
        status.pools.clear();
        status.members.clear();
        for ((protocol, port), l) in &self.listeners {
            status.listeners.push(LbListener {
                id: l.id.clone(),
                loadbalancer_id: self.id.clone(),
                name: l.name.clone(),
                port: i32::from(*port),
                project_id: self.project_id.clone(),
                protocol: protocol.clone(),
                timeout_client_data: l.timeout_client_data.and_then(|v| i32::try_from(v).ok()),
                timeout_member_data: l.timeout_member_data.and_then(|v| i32::try_from(v).ok()),
                allowed_cidrs: l.allowed_cidrs.clone(),
            });
            let Some(pool) = &l.pool else { continue };
            status.pools.push(LbPool {
                id: pool.id.clone(),
                listener_id: l.id.clone(),
                loadbalancer_id: self.id.clone(),
                name: pool.name.clone(),
                project_id: self.project_id.clone(),
                protocol: pool.protocol.clone(),
                session_persistence: pool
                    .persistence
                    .as_ref()
                    .map(|p| p.clone().unwrap_or_else(|| NO_PERSISTENCE.to_string())),
            });
            for ((ip, port), m) in &pool.members {
                status.members.push(LbMember {
                    id: m.id.clone(),
                    ip: ip.clone(),
                    name: m.name.clone(),
                    pool_id: pool.id.clone(),
                    port: i32::from(*port),
                    project_id: self.project_id.clone(),
                    subnet_id: m.subnet_id.clone(),
                });
            }
        }
    }

    /// Takes from `prev` what the status tree does not show - a listener's timeouts and admitted
    /// sources, a pool's session persistence - for the listeners and pools both records have (the
    /// same ids): after a pass that failed part way, what the record held before is what Octavia
    /// surely has, while what was asked may never have been sent. The next plan asks again.
    pub fn unshown_from(&mut self, prev: &RecordedLb) {
        for (key, l) in &mut self.listeners {
            let Some(p) = prev.listeners.get(key).filter(|p| p.id == l.id) else {
                continue;
            };
            l.timeout_client_data = p.timeout_client_data;
            l.timeout_member_data = p.timeout_member_data;
            l.allowed_cidrs = p.allowed_cidrs.clone();
            persistence_of_same_pool(l.pool.as_mut(), p.pool.as_ref());
        }
    }

    /// Takes the session persistence of the pool of listener `key` from `prev` (a change Octavia
    /// refused: the pool kept what it had).
    pub fn persistence_from(&mut self, prev: &RecordedLb, key: &(String, u16)) {
        if let Some(l) = self.listeners.get_mut(key) {
            persistence_of_same_pool(
                l.pool.as_mut(),
                prev.listeners.get(key).and_then(|p| p.pool.as_ref()),
            );
        }
    }

    /// Every member of every pool (for counting).
    pub fn member_count(&self) -> usize {
        self.listeners
            .values()
            .filter_map(|l| l.pool.as_ref())
            .map(|p| p.members.len())
            .sum()
    }
}

/// A pool's session persistence from the same pool (same id) of an earlier record.
fn persistence_of_same_pool(pool: Option<&mut RecordedPool>, prev: Option<&RecordedPool>) {
    if let (Some(pool), Some(prev)) = (pool, prev)
        && pool.id == prev.id
    {
        pool.persistence = prev.persistence.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips() {
        let mut rec = RecordedLb {
            id: "lb".into(),
            name: "demo/web".into(),
            ip: "10.0.0.10".into(),
            subnet_id: "s".into(),
            port_id: "vip".into(),
            project_id: "p".into(),
            provider: "amphora".into(),
            security_groups: vec!["sg".into()],
            listeners: BTreeMap::new(),
        };
        let mut members = BTreeMap::new();
        members.insert(
            ("10.1.0.3".to_string(), 8080),
            RecordedMember {
                id: "m1".into(),
                name: "demo/a:8080".into(),
                subnet_id: "s".into(),
            },
        );
        rec.listeners.insert(
            ("TCP".into(), 80),
            RecordedListener {
                id: "l1".into(),
                name: "demo/web:TCP:80".into(),
                timeout_client_data: Some(5000),
                timeout_member_data: None,
                allowed_cidrs: Some(vec!["10.2.0.0/16".into()]),
                pool: Some(RecordedPool {
                    id: "p1".into(),
                    name: "demo/web:TCP:80".into(),
                    protocol: "TCP".into(),
                    persistence: Some(None),
                    members,
                }),
            },
        );
        let mut status = KuryrLoadBalancerStatus::default();
        rec.write_status(&mut status);
        assert_eq!(status.members.len(), 1);
        assert_eq!(status.pools[0].listener_id, "l1");
        assert_eq!(status.pools[0].session_persistence.as_deref(), Some("NONE"));
        assert_eq!(RecordedLb::from_status(Some(&status)), Some(rec.clone()));
        // A record upstream wrote does not say: unknown, not "none".
        status.pools[0].session_persistence = None;
        let pool = |r: Option<RecordedLb>| r.and_then(|r| r.listeners.into_values().next()?.pool);
        assert_eq!(
            pool(RecordedLb::from_status(Some(&status))).map(|p| p.persistence),
            Some(None)
        );
        status.pools[0].session_persistence = Some("SOURCE_IP".into());
        assert_eq!(
            pool(RecordedLb::from_status(Some(&status))).map(|p| p.persistence),
            Some(Some(Some("SOURCE_IP".into())))
        );
    }

    #[test]
    fn after_a_failed_pass_what_the_tree_does_not_show_is_taken_from_the_last_record() {
        let listener =
            |id: &str, pool_id: &str, timeout: Option<u64>, persistence: Option<&str>| RecordedListener {
                id: id.into(),
                name: "demo/web:TCP:80".into(),
                timeout_client_data: timeout,
                timeout_member_data: None,
                allowed_cidrs: None,
                pool: Some(RecordedPool {
                    id: pool_id.into(),
                    persistence: Some(persistence.map(str::to_string)),
                    ..Default::default()
                }),
            };
        let with = |l: RecordedListener| RecordedLb {
            id: "lb".into(),
            listeners: [(("TCP".to_string(), 80), l)].into(),
            ..Default::default()
        };
        let prev = with(listener("l1", "p1", None, None));
        // Read back with what was asked (a timeout and persistence the pass may not have sent).
        let mut read = with(listener("l1", "p1", Some(9000), Some("SOURCE_IP")));
        read.unshown_from(&prev);
        assert_eq!(read, prev);
        // A listener made again in the pass (another id) was made with what was asked.
        let mut remade = with(listener("l2", "p2", Some(9000), Some("SOURCE_IP")));
        let asked = remade.clone();
        remade.unshown_from(&prev);
        assert_eq!(remade, asked);
        // A refused persistence change only.
        let mut read = with(listener("l1", "p1", Some(9000), Some("SOURCE_IP")));
        read.persistence_from(&prev, &("TCP".to_string(), 80));
        assert_eq!(read, with(listener("l1", "p1", Some(9000), None)));
    }

    #[test]
    fn no_load_balancer_no_record() {
        assert_eq!(
            RecordedLb::from_status(Some(&KuryrLoadBalancerStatus::default())),
            None
        );
        assert_eq!(RecordedLb::from_status(None), None);
    }
}
