//! Restart recovery of one pool driver: rebuild the pools from the KuryrPortPool objects and the
//! KuryrPorts (ports in use), cross-checked with Neutron by the kuryr-rs tags.
//!
//! Only ports carrying `kuryr-rs`, this cluster's tag and a pool tag are considered. A port is
//! placed, in this order, by: the KuryrPort using it (in use), the KuryrPortPool listing it,
//! the pool its tag names (an object of that name, or - when the object was never written -
//! the key rebuilt from the port itself, accepted only if it yields the tag's name). Ports no
//! object lists are adopted as recyclable, never available: `ports_pool_max` is enforced on them
//! by the first recycle pass, and available ports beyond it are trimmed right after recovery. Ports that
//! fit nowhere are left alone here: the orphan sweep deletes them after two passes, so a
//! recovery bug can never delete a port that is in use.
//!
//! Deciding is separate from acting: [`recover`] only reads (the Kubernetes API input and Neutron)
//! and builds a [`Recovered`] value, which the driver installs in one step
//! (`PoolDriver::install_recovered`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kuryr_config::PodVifDriver;
use kuryr_crds::KuryrPortPool;
use kuryr_crds::names::device_owner::TRUNK_SUBPORT;
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::{ListFilter, NeutronClient, Port};

use super::driver::{PoolDriver, PoolKind};
use super::state::{Entry, Key, PoolMeta};
use crate::drivers::pool::{VifOrigin, port_subnets};
use crate::drivers::vif::subports_by_port;
use crate::drivers::{NetworkInfo, PortSpec};
use crate::error::Error;

/// A port a KuryrPort records (its `status.vifs`), with the origin kuryr-rs stores next to it.
#[derive(Clone, Debug)]
pub struct InUsePort {
    pub port_id: String,
    pub origin: Option<VifOrigin>,
    /// The pod holding it (`crate::drivers::pool::holder` of the KuryrPort's pod).
    pub holder: Option<String>,
    /// The KuryrPort is being deleted: its ports may already be released and handed on.
    pub terminating: bool,
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
pub type Lists = (Vec<Entry<kuryr_crds::Vif>>, Vec<Entry<kuryr_crds::Vif>>);

/// Everything recovery decided, for an empty driver to install.
#[derive(Default)]
pub struct Recovered {
    /// Every pool that exists again, with its metadata.
    pub pools: BTreeMap<Key, PoolMeta>,
    /// Ports in use by pods: (pool, port id, holding pod).
    pub in_use: Vec<(Key, String, Option<String>)>,
    /// Ports in use that no pool may take back on release (on no pool's trunk).
    pub unservable: Vec<String>,
    /// Available and recyclable ports per pool.
    pub adopted: BTreeMap<Key, Lists>,
    /// What a refill of each pool creates: the network as Neutron has it now.
    pub specs: Vec<(Key, PortSpec)>,
    /// Ports whose pool tag names another pool than the one they were placed in (a borrowed
    /// port's move cut short, a pool listing written before a tag): (deployment, port id, the
    /// tags to add and remove), so that the next recovery reads them alike.
    pub retag: Vec<(String, String, tags::PoolRetag)>,
    pub report: RecoveryReport,
}

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

/// Names the VIF driver of pool objects written before kuryr-rs recorded it (`spec.vifDriver`),
/// so that each driver recovers from its own objects only. A bare-metal object is the `neutron`
/// pool's; a nested one is the only nested driver's, and with two (`multi_pool`: nested-vlan
/// keys name a trunk, nested-macvlan ones a VM port) the one that knows its host. An object
/// neither knows stays unnamed: no driver recovers it, the persister releases it and the orphan
/// sweep deletes its ports, as when its node's pools are dropped.
pub async fn name_legacy_drivers(
    drivers: &[Arc<PoolDriver>],
    input: &mut RecoveryInput,
) -> Result<(), Error> {
    let of_kind =
        |kind: PoolKind| -> Vec<&Arc<PoolDriver>> { drivers.iter().filter(|d| d.kind() == kind).collect() };
    let nested = of_kind(PoolKind::Nested);
    let mut ask: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in input.pools.iter_mut().filter(|p| p.spec.vif_driver.is_none()) {
        let kind = if p.spec.key.is_nested() {
            PoolKind::Nested
        } else {
            PoolKind::Neutron
        };
        match of_kind(kind).as_slice() {
            [only] => p.spec.vif_driver = Some(only.vif().name().to_string()),
            [] => {}
            _ => {
                if let Some(host) = &p.spec.key.trunk_port_id {
                    ask.entry(p.spec.key.deployment.clone())
                        .or_default()
                        .push(host.clone());
                }
            }
        }
    }
    for (deployment, hosts) in ask {
        // A deployment no longer configured: recovery skips its objects anyway.
        if !nested
            .iter()
            .all(|d| d.options().deployments.names().any(|n| n == deployment))
        {
            continue;
        }
        let mut owner: HashMap<String, &'static str> = HashMap::new();
        for d in &nested {
            let dead: HashSet<String> = d
                .vif()
                .dead_hosts(&deployment, &hosts)
                .await?
                .into_iter()
                .collect();
            for h in hosts.iter().filter(|h| !dead.contains(*h)) {
                owner.entry(h.clone()).or_insert(d.vif().name());
            }
        }
        for p in input
            .pools
            .iter_mut()
            .filter(|p| p.spec.vif_driver.is_none() && p.spec.key.deployment == deployment)
        {
            if let Some(d) = p.spec.key.trunk_port_id.as_ref().and_then(|h| owner.get(h)) {
                p.spec.vif_driver = Some((*d).to_string());
            }
        }
    }
    Ok(())
}

/// Decides how `driver`'s pools looked before the restart, from `input` and Neutron.
pub async fn recover(driver: &PoolDriver, input: &RecoveryInput) -> Result<Recovered, Error> {
    let nested = driver.kind() == PoolKind::Nested;
    let mine = driver.vif().name();
    let objects: Vec<(&str, &KuryrPortPool, Key)> = input
        .pools
        .iter()
        .filter(|p| p.spec.key.is_nested() == nested && p.spec.vif_driver.as_deref() == Some(mine))
        .filter_map(|p| Some((p.metadata.name.as_deref()?, p, key_of(p)?)))
        .collect();
    let by_name: HashMap<&str, (&KuryrPortPool, &Key)> =
        objects.iter().map(|(n, p, k)| (*n, (*p, k))).collect();
    // Port -> (pool object name, recyclable?, since): membership as last flushed. A port two
    // objects list (a move between pools whose donor was not written again before a crash)
    // belongs where it was placed last.
    let mut listed: HashMap<&str, (&str, bool, Timestamp)> = HashMap::new();
    for (name, pool, _) in &objects {
        if let Some(st) = &pool.status {
            let entries = st.available.iter().map(|p| (p, false));
            for (p, recyclable) in entries.chain(st.recyclable.iter().map(|p| (p, true))) {
                match listed.get(p.port_id.as_str()) {
                    Some((_, _, since)) if *since >= p.since.0 => {}
                    _ => {
                        listed.insert(&p.port_id, (name, recyclable, p.since.0));
                    }
                }
            }
        }
    }
    // A port two KuryrPorts list (one terminating, whose finalizer released it before a crash,
    // and the pod it was handed on to) belongs to the live one.
    let mut in_use: HashMap<&str, &InUsePort> = HashMap::new();
    for u in &input.in_use {
        match in_use.get(u.port_id.as_str()) {
            Some(other) if !other.terminating || u.terminating => {}
            _ => {
                in_use.insert(u.port_id.as_str(), u);
            }
        }
    }

    let mut out = Recovered::default();
    let mut seen: HashSet<String> = HashSet::new();
    let opts = driver.options();
    let deployments: Vec<String> = opts.deployments.names().map(str::to_string).collect();
    for deployment in deployments {
        // Where the cluster tag is not (yet) confirmed this cluster's (cluster_claim.rs), only the
        // ports its own records name are adopted: one found by its tags alone could be another
        // cluster's. The rest wait for the orphan sweep, which runs once the claim is confirmed.
        let tags_are_ours = opts.deployments.is_claimed(&deployment);
        let client = opts.deployments.client(&deployment)?;
        for (name, _, key) in &objects {
            if key.deployment == deployment {
                let meta = PoolMeta {
                    name: (*name).to_string(),
                    nested,
                };
                out.pools.entry(key.clone()).or_insert(meta);
            }
        }
        // The trunks pools serve here: a subport found on another one is no pool's.
        let pool_hosts: HashSet<&str> = objects
            .iter()
            .filter(|(_, _, k)| k.deployment == deployment)
            .map(|(_, _, k)| k.host.as_str())
            .collect();
        let filter = ListFilter::new().tags([tags::TAG_MANAGED, opts.cluster_tag.as_str()]);
        let ports = client.list_ports(&filter).await?;
        let subports = if driver.vif().kind() == PodVifDriver::NestedVlan {
            subports_by_port(client).await?
        } else {
            HashMap::new()
        };
        let mut nets = Networks {
            client,
            cache: HashMap::new(),
        };
        let now = Timestamp::now();
        for port in &ports {
            let Some(tag_name) = port
                .tags
                .iter()
                .find_map(|t| t.strip_prefix(tags::TAG_POOL_PREFIX))
            else {
                continue;
            };
            if !tags_are_ours
                && !listed.contains_key(port.id.as_str())
                && !in_use.contains_key(port.id.as_str())
            {
                continue;
            }
            seen.insert(port.id.clone());
            let subnets = port_subnets(port);
            // In use by a pod: its origin names the pool it goes back to.
            if let Some(user) = in_use.get(port.id.as_str()) {
                let key = match user.origin.as_ref() {
                    Some(o) if o.driver == driver.vif().name() => Some(origin_key(o, &subnets)),
                    // Another pool driver's pod (multi_pool).
                    Some(_) => None,
                    None => listed
                        .get(port.id.as_str())
                        .map(|(n, _, _)| *n)
                        .or(Some(tag_name))
                        .and_then(|n| by_name.get(n))
                        .map(|(_, k)| (*k).clone()),
                };
                let placed = key.and_then(|k| on_its_trunk(driver, k, port, &subports, &pool_hosts));
                if placed.is_none()
                    && user
                        .origin
                        .as_ref()
                        .is_some_and(|o| o.driver == driver.vif().name())
                {
                    // Its pod keeps it; released, it goes (it serves no node's pods here).
                    tracing::info!(port = %port.id, "pool port in use is on no pool's trunk; deleted when released");
                    out.unservable.push(port.id.clone());
                    out.report.unplaced += 1;
                }
                if let Some(key) = placed {
                    let meta = out
                        .pools
                        .entry(key.clone())
                        .or_insert_with(|| driver.meta_for(&key));
                    if let Some(t) = tags::pool_retag(&port.tags, &meta.name) {
                        out.retag.push((deployment.clone(), port.id.clone(), t));
                    }
                    out.in_use.push((key, port.id.clone(), user.holder.clone()));
                    out.report.in_use += 1;
                }
                continue;
            }
            let (key, recyclable, since) = if let Some((name, recyclable, since)) =
                listed.get(port.id.as_str())
                && let Some((_, key)) = by_name.get(name)
            {
                ((*key).clone(), *recyclable, *since)
            } else if let Some((_, key)) = by_name.get(tag_name) {
                // Not listed: created by a refill, or released by a pod, after the last flush.
                // A released port still has its pod's name and groups, and the pool may be at
                // max: recyclable, so the recycle pass cleans it and keeps it only below max.
                ((*key).clone(), true, now)
            } else if let Some(key) = rebuild_key(driver, &deployment, port, &subports)
                && driver.meta_for(&key).name == tag_name
            {
                out.pools
                    .entry(key.clone())
                    .or_insert_with(|| driver.meta_for(&key));
                (key, true, now)
            } else {
                if port_is_my_kind(driver, port) {
                    out.report.unplaced += 1;
                    tracing::info!(port = %port.id, pool = tag_name, "pool port fits no pool; left to the orphan sweep");
                }
                continue;
            };
            let Some(key) = on_its_trunk(driver, key, port, &subports, &pool_hosts) else {
                out.report.unplaced += 1;
                tracing::info!(port = %port.id, "pool port is on no pool's trunk; left to the orphan sweep");
                continue;
            };
            let vlan = subports.get(&port.id).and_then(|(_, v)| u16::try_from(*v).ok());
            let net = nets.get(&port.network_id, &subnets).await?;
            let vif = match driver.vif().vif_of_port(port, &net, vlan) {
                Ok(vif) => vif,
                Err(e) => {
                    out.report.unplaced += 1;
                    tracing::info!(port = %port.id, error = %e, "pool port cannot be reused; left to the orphan sweep");
                    continue;
                }
            };
            let mut entry = Entry::new(port.id.clone(), vif, since);
            let meta = out
                .pools
                .entry(key.clone())
                .or_insert_with(|| driver.meta_for(&key));
            // Not as a spare of this pool is (another pool's groups or tag: a move between two
            // pools cut short by a crash, before or after its tag write; a pod's name): recyclable,
            // so the recycle pass puts this pool's groups and tag on it before any pod gets it.
            let groups: BTreeSet<&String> = port.security_groups.iter().collect();
            let clean = port.name == tags::POOL_PORT_NAME
                && (nested || port.device_id.is_empty())
                && groups == key.security_groups.iter().collect::<BTreeSet<_>>();
            let mut recyclable = recyclable || !clean;
            if let Some(t) = tags::pool_retag(&port.tags, &meta.name) {
                out.retag.push((deployment.clone(), port.id.clone(), t));
                recyclable = true;
            }
            let lists = out.adopted.entry(key).or_default();
            if recyclable {
                entry.data.base_mut().active = false;
                lists.1.push(entry);
            } else {
                lists.0.push(entry);
            }
            out.report.adopted += 1;
        }
        // Refills need a spec per pool: the network as Neutron has it now.
        let keys: Vec<Key> = out
            .pools
            .keys()
            .filter(|k| k.deployment == deployment)
            .cloned()
            .collect();
        for key in keys {
            match nets.get(&key.network_id, &key.subnets).await {
                Ok(net) => {
                    let spec = PortSpec::new(
                        deployment.clone(),
                        key.project_id.clone(),
                        net,
                        key.security_groups.clone(),
                    );
                    out.specs.push((key, spec));
                }
                Err(e) => tracing::warn!(pool = %key, error = %e, "network of pool unavailable"),
            }
        }
    }
    out.report.vanished = listed.keys().filter(|id| !seen.contains(**id)).count();
    Ok(out)
}

/// The key of a pool port whose KuryrPortPool was never written, from the port itself.
fn rebuild_key(
    driver: &PoolDriver,
    deployment: &str,
    port: &Port,
    subports: &HashMap<String, (String, u32)>,
) -> Option<Key> {
    let host = match driver.vif().kind() {
        PodVifDriver::NeutronVif if !port.binding_host_id.is_empty() => port.binding_host_id.clone(),
        PodVifDriver::NestedVlan => subports.get(&port.id)?.0.clone(),
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

/// A nested-vlan port serves the VM whose trunk it is a subport of, whatever a record says
/// (a pool listing or a tag written before the port was moved or detached by hand): `key` with
/// that trunk as its host when a pool of this deployment serves that trunk (`pool_hosts`), else
/// `None` - on no trunk, or on a trunk of a VM that may be no node, it serves no pod.
fn on_its_trunk(
    driver: &PoolDriver,
    key: Key,
    port: &Port,
    subports: &HashMap<String, (String, u32)>,
    pool_hosts: &HashSet<&str>,
) -> Option<Key> {
    if driver.vif().kind() != PodVifDriver::NestedVlan {
        return Some(key);
    }
    let (trunk, _) = subports.get(&port.id)?;
    if *trunk == key.host {
        return Some(key);
    }
    pool_hosts.contains(trunk.as_str()).then(|| Key {
        host: trunk.clone(),
        ..key
    })
}

fn port_is_my_kind(driver: &PoolDriver, port: &Port) -> bool {
    (port.device_owner == TRUNK_SUBPORT) == (driver.kind() == PoolKind::Nested)
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
