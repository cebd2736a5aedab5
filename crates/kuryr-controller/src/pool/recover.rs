//! Restart recovery of one pool driver: rebuild the pools from the KuryrPortPool objects and the
//! KuryrPorts (ports in use), cross-checked with Neutron by the kuryr-rs tags.
//!
//! Only ports carrying `kuryr-rs`, this cluster's tag and a pool tag are considered. A port is
//! placed, in this order, by: the KuryrPort using it (in use), the KuryrPortPool listing it,
//! the pool its tag names (an object of that name, or - when the object was never written -
//! the key rebuilt from the port itself, accepted only if it yields the tag's name). Ports that
//! fit nowhere are left alone here: the orphan sweep deletes them after two passes, so a
//! recovery bug can never delete a port that is in use.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kuryr_crds::KuryrPortPool;
use kuryr_crds::names::device_owner::TRUNK_SUBPORT;
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::{ListFilter, NeutronClient, Port};

use super::driver::{PoolDriver, PoolKind};
use super::state::{Entry, Key};
use crate::drivers::os_vif::vif_from_port;
use crate::drivers::pool::{VifOrigin, port_subnets};
use crate::drivers::{NetworkInfo, PortSpec};
use crate::error::Error;

/// A port a KuryrPort records (its `status.vifs`), with the origin kuryr-rs stores next to it.
#[derive(Clone, Debug)]
pub struct InUsePort {
    pub port_id: String,
    pub origin: Option<VifOrigin>,
}

/// What the Kubernetes API says (see `super::persist::load_recovery_input`).
#[derive(Clone, Debug, Default)]
pub struct RecoveryInput {
    pub pools: Vec<KuryrPortPool>,
    pub in_use: Vec<InUsePort>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Ports put back into available or recyclable lists.
    pub adopted: usize,
    /// Pool ports found in use by KuryrPorts.
    pub in_use: usize,
    /// Ports a KuryrPortPool listed that Neutron no longer has.
    pub vanished: usize,
    /// Tagged pool ports that fit no pool (left to the orphan sweep).
    pub unplaced: usize,
    /// Pools (KuryrPortPool objects) with no port left at all.
    pub dropped: usize,
}

/// The pool key a KuryrPortPool object describes (its `subnetId` may list several subnets,
/// comma-joined: see `PoolDriver::crd_key`). None when it names no host or no subnet.
pub fn key_of(pool: &KuryrPortPool) -> Option<Key> {
    let k = &pool.spec.key;
    let host = k.host.clone().or_else(|| k.trunk_port_id.clone())?;
    let subnets = Key::split_subnets(&k.subnet_id);
    if subnets.is_empty() {
        return None;
    }
    Some(Key::new(
        k.deployment.clone(),
        host,
        k.project_id.clone(),
        k.network_id.clone(),
        subnets,
        k.security_group_ids.clone(),
    ))
}

/// The pool an in-use port goes back to. An origin written before origins recorded their
/// subnets takes the port's own fixed-IP subnets.
fn origin_key(o: &VifOrigin, port_subnets: &[String]) -> Key {
    let subnets = if o.subnets.is_empty() {
        port_subnets
    } else {
        &o.subnets
    };
    Key::new(
        o.deployment.clone(),
        o.host.clone(),
        o.project_id.clone(),
        o.network_id.clone(),
        subnets.iter().cloned(),
        o.security_groups.clone(),
    )
}

/// Available and recyclable ports adopted into one pool.
type Lists = (Vec<Entry<kuryr_crds::Vif>>, Vec<Entry<kuryr_crds::Vif>>);

/// Network details for VIFs, fetched once per (network, subnets).
struct Networks<'a> {
    client: &'a NeutronClient,
    cache: HashMap<(String, Vec<String>), Arc<NetworkInfo>>,
}

impl Networks<'_> {
    async fn get(&mut self, network_id: &str, subnet_ids: &[String]) -> Result<Arc<NetworkInfo>, Error> {
        let k = (network_id.to_string(), subnet_ids.to_vec());
        if let Some(n) = self.cache.get(&k) {
            return Ok(n.clone());
        }
        let net = self.client.get_network(network_id).await?;
        let wanted: HashSet<&str> = subnet_ids.iter().map(String::as_str).collect();
        let subnets = self
            .client
            .list_subnets(&ListFilter::new().network_id(network_id))
            .await?
            .into_iter()
            .filter(|s| wanted.contains(s.id.as_str()))
            .collect();
        let info = Arc::new(NetworkInfo {
            id: net.id,
            name: net.name,
            mtu: net.mtu,
            subnets,
        });
        self.cache.insert(k, info.clone());
        Ok(info)
    }
}

impl PoolDriver {
    /// Rebuilds this driver's pools, then marks it ready. Safe to call on an empty driver only.
    pub async fn recover(&self, input: &RecoveryInput) -> Result<RecoveryReport, Error> {
        let nested = self.kind() == PoolKind::Nested;
        let objects: Vec<(&str, &KuryrPortPool, Key)> = input
            .pools
            .iter()
            .filter(|p| p.spec.key.is_nested() == nested)
            .filter_map(|p| Some((p.metadata.name.as_deref()?, p, key_of(p)?)))
            .collect();
        let by_name: HashMap<&str, (&KuryrPortPool, &Key)> =
            objects.iter().map(|(n, p, k)| (*n, (*p, k))).collect();
        // Port -> (pool object name, recyclable?, since): membership as last flushed.
        let mut listed: HashMap<&str, (&str, bool, Timestamp)> = HashMap::new();
        for (name, pool, _) in &objects {
            if let Some(st) = &pool.status {
                for p in &st.available {
                    listed.insert(&p.port_id, (name, false, p.since.0));
                }
                for p in &st.recyclable {
                    listed.insert(&p.port_id, (name, true, p.since.0));
                }
            }
        }
        let in_use: HashMap<&str, Option<&VifOrigin>> = input
            .in_use
            .iter()
            .map(|u| (u.port_id.as_str(), u.origin.as_ref()))
            .collect();

        let mut report = RecoveryReport::default();
        let mut seen: HashSet<String> = HashSet::new();
        let deployments: Vec<String> = self.options().deployments.names().map(str::to_string).collect();
        for deployment in deployments {
            let client = self.options().deployments.client(&deployment)?;
            for (name, _, key) in &objects {
                if key.deployment == deployment {
                    let meta = super::state::PoolMeta {
                        name: (*name).to_string(),
                        nested,
                    };
                    self.lock().ensure(key, || meta);
                }
            }
            let filter = ListFilter::new().tags([tags::TAG_MANAGED, self.options().cluster_tag.as_str()]);
            let ports = client.list_ports(&filter).await?;
            let subports = self.subports_of_trunks(client).await?;
            let mut nets = Networks {
                client,
                cache: HashMap::new(),
            };
            let now = Timestamp::now();
            let mut adopted: BTreeMap<Key, Lists> = BTreeMap::new();
            for port in &ports {
                let Some(tag_name) = port
                    .tags
                    .iter()
                    .find_map(|t| t.strip_prefix(tags::TAG_POOL_PREFIX))
                else {
                    continue;
                };
                seen.insert(port.id.clone());
                let subnets = port_subnets(port);
                // In use by a pod: its origin names the pool it goes back to.
                if let Some(origin) = in_use.get(port.id.as_str()) {
                    let key = match origin {
                        Some(o) if o.driver == self.vif().name() => Some(origin_key(o, &subnets)),
                        // Another pool driver's pod (multi_pool).
                        Some(_) => None,
                        None => listed
                            .get(port.id.as_str())
                            .map(|(n, _, _)| *n)
                            .or(Some(tag_name))
                            .and_then(|n| by_name.get(n))
                            .map(|(_, k)| (*k).clone()),
                    };
                    if let Some(key) = key {
                        self.lock().ensure(&key, || self.meta_for(&key));
                        self.lock().mark_in_use(&key, &port.id, now);
                        report.in_use += 1;
                    }
                    continue;
                }
                let (key, recyclable, since) = if let Some((name, recyclable, since)) =
                    listed.get(port.id.as_str())
                    && let Some((_, key)) = by_name.get(name)
                {
                    ((*key).clone(), *recyclable, *since)
                } else if let Some((_, key)) = by_name.get(tag_name) {
                    // Created by a refill whose membership was not flushed before the restart.
                    ((*key).clone(), false, now)
                } else if let Some(key) = self.rebuild_key(&deployment, port, &subports)
                    && self.meta_for(&key).name == tag_name
                {
                    self.lock().ensure(&key, || self.meta_for(&key));
                    (key, false, now)
                } else {
                    if self.port_is_my_kind(port) {
                        report.unplaced += 1;
                        tracing::info!(port = %port.id, pool = tag_name, "pool port fits no pool; left to the orphan sweep");
                    }
                    continue;
                };
                let vlan = subports.get(&port.id).and_then(|(_, v)| u16::try_from(*v).ok());
                let vif = match self.vif_kind(vlan) {
                    Ok(kind) => {
                        let net = nets.get(&port.network_id, &subnets).await?;
                        vif_from_port(port, &net, &kind, self.options().mtu)?
                    }
                    Err(e) => {
                        report.unplaced += 1;
                        tracing::info!(port = %port.id, error = %e, "pool port cannot be reused; left to the orphan sweep");
                        continue;
                    }
                };
                let mut entry = Entry::new(port.id.clone(), vif, since);
                let lists = adopted.entry(key).or_default();
                if recyclable {
                    entry.data.base_mut().active = false;
                    lists.1.push(entry);
                } else {
                    lists.0.push(entry);
                }
                report.adopted += 1;
            }
            // Refills need a spec per pool: the network as Neutron has it now.
            let keys: Vec<Key> = self
                .lock()
                .iter()
                .map(|(k, _)| k)
                .filter(|k| k.deployment == deployment)
                .cloned()
                .collect();
            for key in keys {
                match nets.get(&key.network_id, &key.subnets).await {
                    Ok(net) => self.remember_spec(
                        &key,
                        &PortSpec::new(
                            deployment.clone(),
                            key.project_id.clone(),
                            net,
                            key.security_groups.clone(),
                        ),
                    ),
                    Err(e) => tracing::warn!(pool = %key, error = %e, "network of pool unavailable"),
                }
            }
            let mut st = self.lock();
            for (key, (available, recyclable)) in adopted {
                st.adopt(&key, available, recyclable);
            }
        }
        report.vanished = listed.keys().filter(|id| !seen.contains(**id)).count();
        // Objects whose pools hold nothing (left by an earlier configuration, or freed) name
        // pools that no longer exist: dropped here, the reconcile pass deletes the objects.
        report.dropped = {
            let mut st = self.lock();
            let keys: Vec<Key> = st.iter().map(|(k, _)| k.clone()).collect();
            keys.iter().filter(|k| st.remove_if_empty(k)).count()
        };
        self.mark_ready();
        self.publish_sizes();
        self.touched();
        tracing::info!(?report, pool_driver = self.kind().name(), "port pools recovered");
        Ok(report)
    }

    /// Nested VLAN: every subport of every trunk, with its trunk and VLAN id.
    async fn subports_of_trunks(
        &self,
        client: &NeutronClient,
    ) -> Result<HashMap<String, (String, u32)>, Error> {
        if self.vif().name() != "nested-vlan" {
            return Ok(HashMap::new());
        }
        let trunks = client.list_trunks(&ListFilter::new()).await?;
        Ok(trunks
            .into_iter()
            .flat_map(|t| {
                let id = t.id;
                t.sub_ports
                    .into_iter()
                    .map(move |s| (s.port_id, (id.clone(), s.segmentation_id)))
            })
            .collect())
    }

    /// The key of a pool port whose KuryrPortPool was never written, from the port itself.
    fn rebuild_key(
        &self,
        deployment: &str,
        port: &Port,
        subports: &HashMap<String, (String, u32)>,
    ) -> Option<Key> {
        let host = match self.vif().name() {
            "neutron-vif" if !port.binding_host_id.is_empty() => port.binding_host_id.clone(),
            "nested-vlan" => subports.get(&port.id)?.0.clone(),
            // Macvlan ports do not name their VM port.
            _ => return None,
        };
        Some(Key::new(
            deployment,
            host,
            port.project_id.clone(),
            port.network_id.clone(),
            port_subnets(port),
            port.security_groups.clone(),
        ))
    }

    fn port_is_my_kind(&self, port: &Port) -> bool {
        (port.device_owner == TRUNK_SUBPORT) == (self.kind() == PoolKind::Nested)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kuryr_crds::PoolKey;

    #[test]
    fn crd_subnet_id_and_origins_map_to_subnet_keys() {
        let pool = |subnet_id: &str| {
            KuryrPortPool::for_key(
                "kuryr-system",
                PoolKey::host("default", "node-1", "proj", "net", subnet_id, ["sg"]),
                1,
                1,
                0,
                None,
            )
            .unwrap()
        };
        let key = key_of(&pool("b,a")).unwrap();
        assert_eq!(key.subnets, ["a", "b"]);
        assert_eq!(key.subnet_id(), "a,b");
        assert_eq!(key_of(&pool("a")).unwrap().subnets, ["a"]);
        assert!(key_of(&pool(",")).is_none(), "no subnet, no key");

        let mut origin = VifOrigin {
            deployment: "default".into(),
            host: "node-1".into(),
            project_id: "proj".into(),
            network_id: "net".into(),
            subnets: vec!["b".into()],
            security_groups: vec!["sg".into()],
            driver: "neutron-vif".into(),
            preserve: false,
        };
        let port_subnets = ["a".to_string()];
        assert_eq!(origin_key(&origin, &port_subnets).subnets, ["b"]);
        // An origin written before subnets were recorded: the port's own fixed-IP subnets.
        origin.subnets.clear();
        assert_eq!(origin_key(&origin, &port_subnets), key_of(&pool("a")).unwrap());
        let json = serde_json::to_value(&origin).unwrap();
        assert!(json.get("subnets").is_none(), "{json}");
        let back: VifOrigin = serde_json::from_value(json).unwrap();
        assert_eq!(back, origin);
    }
}
