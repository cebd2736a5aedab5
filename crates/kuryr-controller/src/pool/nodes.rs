//! The pools of nodes that are no more. A bare-metal pool's ports are bound to its node: once the
//! Node is deleted nothing will take them, and with autoscaling every removed node would keep its
//! spare ports (and quota) for good. A nested pool's ports hang on the node VM's trunk or port:
//! when the VM is replaced under the same node name, the old trunk's subports must not be handed
//! to pods on the new VM.
//!
//! [`NodeBook`] decides from the Node watch's events (pure, tested without a server);
//! [`PoolManager::watch_nodes`] acts: it forgets what was cached of the node (its pool host, its
//! VM port, its `pod_vif` label) and drops the pools whose host is gone - bare metal: the
//! deleted node's; nested: the ones whose trunk or VM port no longer serves an instance (a Node
//! object deleted and registered again by the same VM keeps its pools). The first listing of a
//! term also drops the pools of nodes deleted while no controller ran.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use super::PoolManager;
use super::driver::{PoolDriver, PoolKind};
use crate::error::Error;
use crate::locked::Locked;

/// What became of a node the pools may hold ports for (or route its pods by).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeChange {
    /// The Node object is gone.
    Gone(String),
    /// A new Node object (another uid) took the name: possibly another VM.
    Replaced(String),
    /// An InternalIP address of the node went away: possibly another VM (one replaced without
    /// deleting its Node keeps the uid, not its port).
    Readdressed(String),
    /// Its `pod_vif` label changed (`multi_pool`): its next pods take another route.
    Relabelled(String),
}

impl NodeChange {
    pub fn node(&self) -> &str {
        match self {
            NodeChange::Gone(n)
            | NodeChange::Replaced(n)
            | NodeChange::Readdressed(n)
            | NodeChange::Relabelled(n) => n,
        }
    }
}

/// What the watch has seen of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    uid: String,
    label: Option<String>,
    /// Its InternalIP addresses, sorted.
    ips: Vec<String>,
}

/// The nodes the watch has seen, and the listing under way.
#[derive(Debug, Default)]
pub struct NodeBook {
    uids: HashMap<String, Seen>,
    relisting: Option<HashSet<String>>,
}

impl NodeBook {
    pub fn names(&self) -> HashSet<String> {
        self.uids.keys().cloned().collect()
    }

    /// A node added or modified (or listed), with its `pod_vif` label and InternalIP addresses.
    /// Addresses added (a node booting, dual-stack enabled) are no change, nor a node briefly
    /// reporting none (the last known ones are kept); an address gone is.
    pub fn applied(
        &mut self,
        node: &str,
        uid: &str,
        label: Option<&str>,
        ips: &[&str],
    ) -> Option<NodeChange> {
        if let Some(seen) = &mut self.relisting {
            seen.insert(node.to_string());
        }
        let mut ips: Vec<String> = ips.iter().map(|s| s.to_string()).collect();
        ips.sort();
        let old = self.uids.get(node);
        if ips.is_empty()
            && let Some(old) = old.filter(|o| o.uid == uid)
        {
            ips = old.ips.clone();
        }
        let now = Seen {
            uid: uid.to_string(),
            label: label.map(str::to_string),
            ips,
        };
        let change = match old {
            Some(old) if old.uid != now.uid => Some(NodeChange::Replaced(node.to_string())),
            Some(old) if old.ips.iter().any(|ip| !now.ips.contains(ip)) => {
                Some(NodeChange::Readdressed(node.to_string()))
            }
            Some(old) if old.label != now.label => Some(NodeChange::Relabelled(node.to_string())),
            _ => None,
        };
        self.uids.insert(node.to_string(), now);
        change
    }

    /// A node deleted. The late deletion of an older Node of the same name changes nothing.
    pub fn deleted(&mut self, node: &str, uid: &str) -> Option<NodeChange> {
        match self.uids.get(node) {
            Some(known) if known.uid != uid => None,
            _ => {
                self.uids.remove(node);
                Some(NodeChange::Gone(node.to_string()))
            }
        }
    }

    /// A (re-)listing starts: what it does not list is gone.
    pub fn relist_started(&mut self) {
        self.relisting = Some(HashSet::new());
    }

    /// The listing is complete: the nodes it did not list, deleted while the watch was down.
    pub fn relist_done(&mut self) -> Vec<NodeChange> {
        let Some(seen) = self.relisting.take() else {
            return Vec::new();
        };
        let mut gone: Vec<String> = self.uids.keys().filter(|n| !seen.contains(*n)).cloned().collect();
        gone.sort();
        for n in &gone {
            self.uids.remove(n);
        }
        gone.into_iter().map(NodeChange::Gone).collect()
    }
}

/// How often failed drops are tried again.
const RETRY: Duration = Duration::from_secs(30);

/// A nested pool host judged dead: (VIF driver, deployment, host).
type DeadHost = (&'static str, String, String);

impl PoolManager {
    /// Watches Nodes for the term (after recovery) and drops the pools of those that are no
    /// more. What was cached of nodes in an earlier term is forgotten first (another leader may
    /// have seen them go). Failed drops are tried again every [`RETRY`]; what a drop leaves in
    /// Neutron is tagged and found by the orphan sweep.
    pub(super) async fn watch_nodes(&self, stop: CancellationToken) {
        self.forget_nodes().await;
        let api: Api<Node> = Api::all(self.ctx.kube.clone());
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut book = NodeBook::default();
        let mut first_listing = true;
        // Drops that failed (Neutron or the API unreachable), tried again.
        let mut pending: Vec<NodeChange> = Vec::new();
        let mut absent_pending = false;
        let mut retry = tokio::time::interval(RETRY);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => return,
                _ = retry.tick() => {
                    if absent_pending {
                        absent_pending = self.drop_absent(&book).await;
                    }
                    let again = std::mem::take(&mut pending);
                    for change in again {
                        self.apply_change(change, &mut pending).await;
                    }
                    continue;
                }
                ev = stream.next() => ev,
            };
            let changes = match ev {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "Node watch failed; retrying");
                    continue;
                }
                Some(Ok(Event::Init)) => {
                    book.relist_started();
                    continue;
                }
                Some(Ok(Event::InitApply(n) | Event::Apply(n))) => {
                    let (Some(name), Some(uid)) = (n.metadata.name.as_deref(), n.metadata.uid.as_deref())
                    else {
                        continue;
                    };
                    let label = n
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(super::NODE_POD_VIF_LABEL))
                        .map(String::as_str);
                    let ips: Vec<&str> = n
                        .status
                        .as_ref()
                        .and_then(|s| s.addresses.as_ref())
                        .into_iter()
                        .flatten()
                        .filter(|a| a.type_ == "InternalIP")
                        .map(|a| a.address.as_str())
                        .collect();
                    book.applied(name, uid, label, &ips).into_iter().collect()
                }
                Some(Ok(Event::Delete(n))) => {
                    let (Some(name), Some(uid)) = (n.metadata.name.as_deref(), n.metadata.uid.as_deref())
                    else {
                        continue;
                    };
                    book.deleted(name, uid).into_iter().collect()
                }
                Some(Ok(Event::InitDone)) => {
                    let gone = book.relist_done();
                    if std::mem::take(&mut first_listing) {
                        absent_pending = self.drop_absent(&book).await;
                    }
                    gone
                }
            };
            for change in changes {
                self.apply_change(change, &mut pending).await;
            }
        }
    }

    /// [`PoolManager::node_changed`], kept in `pending` when it fails.
    async fn apply_change(&self, change: NodeChange, pending: &mut Vec<NodeChange>) {
        if let Err(e) = self.node_changed(&change).await {
            tracing::warn!(node = change.node(), error = %e, "cannot drop the pools of a node that is no more; retrying");
            pending.push(change);
        }
    }

    /// [`PoolManager::drop_pools_of_absent_nodes`]; true when it must be tried again.
    async fn drop_absent(&self, book: &NodeBook) -> bool {
        match self.drop_pools_of_absent_nodes(book).await {
            Ok(()) => false,
            Err(e) => {
                tracing::warn!(error = %e, "cannot drop the pools of nodes deleted while no controller ran; retrying");
                true
            }
        }
    }

    /// Forgets every node's cached route, pool host and VM port.
    async fn forget_nodes(&self) {
        self.node_vif.locked().clear();
        for route in self.routes.values() {
            route.vif_driver().forget_nodes().await;
        }
        for d in &self.pooled {
            d.forget_nodes().await;
        }
    }

    /// Forgets what is cached of the node, then drops the pools whose host is gone with it.
    pub async fn node_changed(&self, change: &NodeChange) -> Result<(), Error> {
        let node = change.node();
        self.node_vif.locked().remove(node);
        if matches!(change, NodeChange::Relabelled(_)) {
            // Its next pods are routed anew; its pools and their hosts stand.
            return Ok(());
        }
        for route in self.routes.values() {
            route.vif_driver().forget_node(node).await;
        }
        let mut dead: BTreeSet<DeadHost> = BTreeSet::new();
        for d in &self.pooled {
            let cached = d.forget_node(node).await;
            if d.kind() != PoolKind::Nested {
                continue;
            }
            // The node's host as found in this term; none found (no pod of it asked since the
            // term began, or a failed attempt forgot it): every host of the driver's pools - not
            // for an address change, which many nodes may see at once (the VM port lookup
            // re-checks the port on the node's next pod anyway).
            let hosts = match (cached.is_empty(), change) {
                (true, NodeChange::Readdressed(_)) => BTreeSet::new(),
                (true, _) => d.pool_hosts(),
                (false, _) => cached.into_iter().collect(),
            };
            dead.extend(dead_hosts(d, hosts).await?);
        }
        let bare_metal_gone = matches!(change, NodeChange::Gone(_));
        self.drop_pools("node", node, |d, k| match d.kind() {
            PoolKind::Neutron => bare_metal_gone && k.host == node,
            PoolKind::Nested => dead.contains(&(d.vif().name(), k.deployment.clone(), k.host.clone())),
        })
        .await
    }

    /// The first listing of a term: bare-metal pools of nodes it did not list, and nested pools
    /// whose trunk or VM port no longer serves an instance, are dropped (their nodes went while
    /// no controller ran; the pools were recovered from their KuryrPortPool objects).
    async fn drop_pools_of_absent_nodes(&self, book: &NodeBook) -> Result<(), Error> {
        let mut dead: BTreeSet<DeadHost> = BTreeSet::new();
        for d in self.pooled.iter().filter(|d| d.kind() == PoolKind::Nested) {
            dead.extend(dead_hosts(d, d.pool_hosts()).await?);
        }
        let listed = book.names();
        self.drop_pools("node", "(absent at start)", |d, k| match d.kind() {
            PoolKind::Neutron => !listed.contains(&k.host),
            PoolKind::Nested => dead.contains(&(d.vif().name(), k.deployment.clone(), k.host.clone())),
        })
        .await
    }
}

/// Which of a nested driver's pool hosts no longer serve an instance, judged by its own VIF
/// driver (a trunk for nested-vlan, a VM port for nested-macvlan: `multi_pool` may run both).
async fn dead_hosts(d: &PoolDriver, hosts: BTreeSet<(String, String)>) -> Result<Vec<DeadHost>, Error> {
    let mut by_deployment: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (deployment, host) in hosts {
        by_deployment.entry(deployment).or_default().push(host);
    }
    let mut dead = Vec::new();
    for (deployment, hosts) in by_deployment {
        for host in d.vif().dead_hosts(&deployment, &hosts).await? {
            tracing::info!(
                deployment,
                host,
                driver = d.vif().name(),
                "pool host no longer serves an instance"
            );
            dead.push((d.vif().name(), deployment.clone(), host));
        }
    }
    Ok(dead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletion_and_replacement_are_told_apart() {
        let mut b = NodeBook::default();
        assert_eq!(b.applied("n1", "u1", None, &[]), None);
        assert_eq!(
            b.applied("n1", "u1", None, &[]),
            None,
            "a modification is no change"
        );
        assert_eq!(
            b.applied("n1", "u1", Some("nested-vlan"), &[]),
            Some(NodeChange::Relabelled("n1".into())),
            "its pod_vif label changed"
        );
        assert_eq!(
            b.applied("n1", "u2", Some("nested-vlan"), &[]),
            Some(NodeChange::Replaced("n1".into())),
            "a new uid under the name: the node was re-created"
        );
        assert_eq!(b.deleted("n1", "u1"), None, "the late deletion of the older node");
        assert!(b.names().contains("n1"));
        assert_eq!(b.deleted("n1", "u2"), Some(NodeChange::Gone("n1".into())));
        assert!(!b.names().contains("n1"));
    }

    #[test]
    fn a_relisting_finds_the_nodes_deleted_meanwhile() {
        let mut b = NodeBook::default();
        b.relist_started();
        b.applied("n1", "u1", None, &[]);
        b.applied("n2", "u2", None, &[]);
        b.applied("n3", "u3", None, &[]);
        assert_eq!(b.relist_done(), vec![], "the first listing loses nothing");
        b.relist_started();
        b.applied("n2", "u2", None, &[]);
        assert_eq!(
            b.applied("n3", "u4", None, &[]),
            Some(NodeChange::Replaced("n3".into()))
        );
        assert_eq!(b.relist_done(), vec![NodeChange::Gone("n1".into())]);
        assert_eq!(b.names(), ["n2", "n3"].into_iter().map(String::from).collect());
        assert_eq!(b.relist_done(), vec![], "no listing under way");
    }

    #[test]
    fn an_address_gone_may_be_a_new_vm_one_added_is_not() {
        let mut b = NodeBook::default();
        assert_eq!(b.applied("n1", "u1", None, &[]), None);
        assert_eq!(
            b.applied("n1", "u1", None, &["10.0.0.5"]),
            None,
            "booting: its first address"
        );
        assert_eq!(b.applied("n1", "u1", None, &["10.0.0.5"]), None);
        assert_eq!(
            b.applied("n1", "u1", None, &[]),
            None,
            "briefly none: the last ones are kept"
        );
        assert_eq!(b.applied("n1", "u1", None, &["10.0.0.5"]), None);
        assert_eq!(
            b.applied("n1", "u1", None, &["10.0.0.9"]),
            Some(NodeChange::Readdressed("n1".into())),
            "the VM was replaced under a Node that kept its uid"
        );
        assert_eq!(
            b.applied("n1", "u1", None, &["fd00::9", "10.0.0.9"]),
            None,
            "dual-stack added"
        );
        assert_eq!(
            b.applied("n1", "u1", None, &["10.0.0.9", "fd00::9"]),
            None,
            "order is no change"
        );
        assert_eq!(
            b.applied("n1", "u1", None, &["fd00::9"]),
            Some(NodeChange::Readdressed("n1".into()))
        );
    }
}
