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

use std::collections::{BTreeSet, HashMap, HashSet};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use super::PoolManager;
use super::driver::PoolKind;
use crate::error::Error;

/// What became of a node the pools may hold ports for (or route its pods by).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeChange {
    /// The Node object is gone.
    Gone(String),
    /// A new Node object (another uid) took the name: possibly another VM.
    Replaced(String),
    /// Its `pod_vif` label changed (`multi_pool`): its next pods take another route.
    Relabelled(String),
}

impl NodeChange {
    pub fn node(&self) -> &str {
        match self {
            NodeChange::Gone(n) | NodeChange::Replaced(n) | NodeChange::Relabelled(n) => n,
        }
    }
}

/// The nodes the watch has seen (name -> uid and `pod_vif` label), and the listing under way.
#[derive(Debug, Default)]
pub struct NodeBook {
    uids: HashMap<String, (String, Option<String>)>,
    relisting: Option<HashSet<String>>,
}

impl NodeBook {
    pub fn contains(&self, node: &str) -> bool {
        self.uids.contains_key(node)
    }

    pub fn names(&self) -> HashSet<String> {
        self.uids.keys().cloned().collect()
    }

    /// A node added or modified (or listed), with its `pod_vif` label.
    pub fn applied(&mut self, node: &str, uid: &str, label: Option<&str>) -> Option<NodeChange> {
        if let Some(seen) = &mut self.relisting {
            seen.insert(node.to_string());
        }
        let now = (uid.to_string(), label.map(str::to_string));
        match self.uids.insert(node.to_string(), now) {
            Some((old, _)) if old != uid => Some(NodeChange::Replaced(node.to_string())),
            Some((_, old)) if old.as_deref() != label => Some(NodeChange::Relabelled(node.to_string())),
            _ => None,
        }
    }

    /// A node deleted. The late deletion of an older Node of the same name changes nothing.
    pub fn deleted(&mut self, node: &str, uid: &str) -> Option<NodeChange> {
        match self.uids.get(node) {
            Some((known, _)) if known != uid => None,
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

impl PoolManager {
    /// Watches Nodes for the term (after recovery) and drops the pools of those that are no
    /// more. Failed drops are retried at the next change or listing; what a drop leaves in
    /// Neutron is tagged and found by the orphan sweep.
    pub(super) async fn watch_nodes(&self, stop: CancellationToken) {
        let api: Api<Node> = Api::all(self.ctx.kube.clone());
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut book = NodeBook::default();
        let mut first_listing = true;
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => return,
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
                    book.applied(name, uid, label).into_iter().collect()
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
                    if std::mem::take(&mut first_listing)
                        && let Err(e) = self.drop_pools_of_absent_nodes(&book).await
                    {
                        tracing::warn!(error = %e, "cannot drop the pools of nodes deleted while no controller ran");
                        first_listing = true;
                    }
                    gone
                }
            };
            for change in changes {
                if let Err(e) = self.node_changed(&change).await {
                    tracing::warn!(node = change.node(), error = %e, "cannot drop the pools of a node that is no more");
                }
            }
        }
    }

    /// Forgets what is cached of the node, then drops the pools whose host is gone with it.
    pub async fn node_changed(&self, change: &NodeChange) -> Result<(), Error> {
        let node = change.node();
        self.node_vif
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(node);
        if matches!(change, NodeChange::Relabelled(_)) {
            // Its next pods are routed anew; its pools and their hosts stand.
            return Ok(());
        }
        for route in self.routes.values() {
            route.vif_driver().forget_node(node).await;
        }
        let mut hosts: BTreeSet<(String, String)> = BTreeSet::new();
        for d in &self.pooled {
            if d.kind() == PoolKind::Nested {
                hosts.extend(d.forget_node(node).await);
            } else {
                d.forget_node(node).await;
            }
        }
        let bare_metal_gone = matches!(change, NodeChange::Gone(_));
        let dead = self.dead_nested_hosts(hosts).await?;
        self.drop_pools("node", node, |kind, k| match kind {
            PoolKind::Neutron => bare_metal_gone && k.host == node,
            PoolKind::Nested => dead.contains(&(k.deployment.clone(), k.host.clone())),
        })
        .await
    }

    /// The first listing of a term: bare-metal pools of nodes it did not list, and nested pools
    /// whose trunk or VM port no longer serves an instance, are dropped (their nodes went while
    /// no controller ran; the pools were recovered from their KuryrPortPool objects).
    async fn drop_pools_of_absent_nodes(&self, book: &NodeBook) -> Result<(), Error> {
        let nested: BTreeSet<(String, String)> = self
            .pooled
            .iter()
            .filter(|d| d.kind() == PoolKind::Nested)
            .flat_map(|d| d.pool_hosts())
            .collect();
        let dead = self.dead_nested_hosts(nested).await?;
        let listed = book.names();
        self.drop_pools("node", "(absent at start)", |kind, k| match kind {
            PoolKind::Neutron => !listed.contains(&k.host),
            PoolKind::Nested => dead.contains(&(k.deployment.clone(), k.host.clone())),
        })
        .await
    }

    /// Which of the nested pool hosts no longer serve an instance.
    async fn dead_nested_hosts(
        &self,
        hosts: BTreeSet<(String, String)>,
    ) -> Result<BTreeSet<(String, String)>, Error> {
        let Some(nested) = self.pooled.iter().find(|d| d.kind() == PoolKind::Nested) else {
            return Ok(BTreeSet::new());
        };
        let mut dead = BTreeSet::new();
        for (deployment, host) in hosts {
            // One driver per pool kind: its VIF driver judges its own hosts.
            if !nested.vif().host_alive(&deployment, &host).await? {
                tracing::info!(deployment, host, "pool host no longer serves an instance");
                dead.insert((deployment, host));
            }
        }
        Ok(dead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletion_and_replacement_are_told_apart() {
        let mut b = NodeBook::default();
        assert_eq!(b.applied("n1", "u1", None), None);
        assert_eq!(b.applied("n1", "u1", None), None, "a modification is no change");
        assert_eq!(
            b.applied("n1", "u1", Some("nested-vlan")),
            Some(NodeChange::Relabelled("n1".into())),
            "its pod_vif label changed"
        );
        assert_eq!(
            b.applied("n1", "u2", Some("nested-vlan")),
            Some(NodeChange::Replaced("n1".into())),
            "a new uid under the name: the node was re-created"
        );
        assert_eq!(b.deleted("n1", "u1"), None, "the late deletion of the older node");
        assert!(b.contains("n1"));
        assert_eq!(b.deleted("n1", "u2"), Some(NodeChange::Gone("n1".into())));
        assert!(!b.contains("n1"));
    }

    #[test]
    fn a_relisting_finds_the_nodes_deleted_meanwhile() {
        let mut b = NodeBook::default();
        b.relist_started();
        b.applied("n1", "u1", None);
        b.applied("n2", "u2", None);
        b.applied("n3", "u3", None);
        assert_eq!(b.relist_done(), vec![], "the first listing loses nothing");
        b.relist_started();
        b.applied("n2", "u2", None);
        assert_eq!(
            b.applied("n3", "u4", None),
            Some(NodeChange::Replaced("n3".into()))
        );
        assert_eq!(b.relist_done(), vec![NodeChange::Gone("n1".into())]);
        assert_eq!(b.names(), ["n2", "n3"].into_iter().map(String::from).collect());
        assert_eq!(b.relist_done(), vec![], "no listing under way");
    }
}
