//! Reads one [`Snapshot`] of the cluster: Kubernetes objects, Neutron ports and security groups
//! of this cluster, Octavia load balancers, and the leader controller's own pool books.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use kuryr_controller::pool::api;
use kuryr_crds::names::device_owner::COMPUTE_KURYR;
use kuryr_crds::names::neutron as tags;
use kuryr_crds::{KuryrLoadBalancer, KuryrPort, KuryrPortPool};
use kuryr_neutron::octavia::OctaviaClient;
use kuryr_neutron::{ListFilter, NeutronClient};

use super::invariants::{
    KuryrPortView, LoadBalancerView, PodView, PoolView, PortView, SecurityGroupView, Snapshot,
};

/// Where the state is read from.
pub struct Reader {
    pub kube: kube::Client,
    pub neutron: NeutronClient,
    pub octavia: Option<OctaviaClient>,
    pub cluster_id: String,
    /// The namespace of the leader Lease and the KuryrPortPools.
    pub controller_namespace: String,
    /// Controller identity -> its pool management socket.
    pub sockets: BTreeMap<String, PathBuf>,
}

impl Reader {
    /// The identity holding the leader Lease, if any.
    pub async fn leader(&self) -> Option<String> {
        Api::<Lease>::namespaced(self.kube.clone(), &self.controller_namespace)
            .get_opt("kuryr-controller")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }

    pub async fn read(&self, at: Duration, disrupted: bool) -> anyhow::Result<Snapshot> {
        let lp = ListParams::default();
        let pods = Api::<Pod>::all(self.kube.clone())
            .list(&lp)
            .await
            .context("listing pods")?;
        let kps = Api::<KuryrPort>::all(self.kube.clone())
            .list(&lp)
            .await
            .context("listing KuryrPorts")?;
        let pools = Api::<KuryrPortPool>::namespaced(self.kube.clone(), &self.controller_namespace)
            .list(&lp)
            .await
            .context("listing KuryrPortPools")?;
        let services = Api::<Service>::all(self.kube.clone())
            .list(&lp)
            .await
            .context("listing Services")?;
        let klbs = Api::<KuryrLoadBalancer>::all(self.kube.clone())
            .list(&lp)
            .await
            .context("listing KuryrLoadBalancers")?;
        let policies = Api::<NetworkPolicy>::all(self.kube.clone())
            .list(&lp)
            .await
            .context("listing NetworkPolicies")?;
        let in_use = self.leader_in_use().await;
        // Neutron last: what it lists was created before or after the objects above, and only
        // the grace period tells the two apart.
        let cluster_tag = tags::cluster_tag(&self.cluster_id);
        let ports = self
            .neutron
            .list_ports(&ListFilter::new().tags([tags::TAG_MANAGED, cluster_tag.as_str()]))
            .await
            .context("listing Neutron ports")?;
        let sg_prefix = format!("kuryr-rs:{}:", self.cluster_id);
        let groups = self
            .neutron
            .list_security_groups(&ListFilter::new())
            .await
            .context("listing Neutron security groups")?;
        let address_groups = self
            .neutron
            .list_address_groups(&ListFilter::new())
            .await
            .context("listing Neutron address groups")?;
        let lbs = match &self.octavia {
            Some(o) => o
                .list_load_balancers(&ListFilter::new())
                .await
                .context("listing Octavia load balancers")?,
            None => Vec::new(),
        };

        let key = |ns: Option<&str>, name: &str| format!("{}/{name}", ns.unwrap_or_default());
        Ok(Snapshot {
            at,
            disrupted,
            // The check loop knows the disruption windows and sets it.
            calm_since: Duration::ZERO,
            pods: pods
                .items
                .iter()
                .map(|p| {
                    let status = p.status.as_ref();
                    PodView {
                        key: key(p.metadata.namespace.as_deref(), &p.name_any()),
                        uid: p.metadata.uid.clone().unwrap_or_default(),
                        scheduled: p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some(),
                        deleting: p.metadata.deletion_timestamp.is_some(),
                        running: status
                            .is_some_and(|s| s.phase.as_deref() == Some("Running") && s.pod_ip.is_some()),
                    }
                })
                .collect(),
            kuryr_ports: kps
                .items
                .iter()
                .map(|kp| KuryrPortView {
                    key: key(kp.metadata.namespace.as_deref(), &kp.name_any()),
                    pod_uid: kp.spec.pod_uid.clone(),
                    deleting: kp.metadata.deletion_timestamp.is_some(),
                    vifs: kp
                        .status
                        .as_ref()
                        .map(|s| {
                            s.vifs
                                .values()
                                .map(|v| {
                                    (
                                        v.vif.id().to_string(),
                                        v.vif.fixed_ips().map(|(_, ip)| ip.to_string()).collect(),
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                })
                .collect(),
            pools: pools
                .items
                .iter()
                .map(|p| {
                    let name = p.name_any();
                    let status = p.status.as_ref();
                    let ids = |v: Option<&Vec<kuryr_crds::PoolPort>>| {
                        v.map(|v| v.iter().map(|e| e.port_id.clone()).collect())
                            .unwrap_or_default()
                    };
                    PoolView {
                        in_use: in_use.as_ref().map(|m| m.get(&name).cloned().unwrap_or_default()),
                        name,
                        max: p.spec.max,
                        available: ids(status.map(|s| &s.available)),
                        recyclable: ids(status.map(|s| &s.recyclable)),
                    }
                })
                .collect(),
            ports: ports
                .iter()
                .filter(|p| p.device_owner == COMPUTE_KURYR)
                .map(|p| PortView {
                    id: p.id.clone(),
                    pool: p
                        .tags
                        .iter()
                        .find_map(|t| t.strip_prefix(tags::TAG_POOL_PREFIX))
                        .map(str::to_string),
                    ips: p.fixed_ips.iter().map(|f| f.ip_address.clone()).collect(),
                })
                .collect(),
            services: services
                .items
                .iter()
                .map(|s| key(s.metadata.namespace.as_deref(), &s.name_any()))
                .chain(
                    klbs.items
                        .iter()
                        .map(|k| key(k.metadata.namespace.as_deref(), &k.name_any())),
                )
                .collect(),
            load_balancers: lbs
                .iter()
                .filter(|lb| lb.tags.contains(&cluster_tag))
                .filter_map(|lb| {
                    let service = lb.tags.iter().find_map(|t| t.strip_prefix("kuryr-rs.service="))?;
                    Some(LoadBalancerView {
                        id: lb.id.clone(),
                        service: service.to_string(),
                    })
                })
                .collect(),
            policies: policies
                .items
                .iter()
                .filter_map(|p| p.metadata.uid.clone())
                .collect::<BTreeSet<_>>(),
            security_groups: groups
                .iter()
                .filter_map(|g| {
                    let uid = g.description.strip_prefix(&sg_prefix)?;
                    Some(SecurityGroupView {
                        id: g.id.clone(),
                        policy_uid: uid.to_string(),
                    })
                })
                .collect(),
            address_groups: address_groups
                .iter()
                .filter_map(|g| {
                    let uid = g.description.strip_prefix(&sg_prefix)?;
                    Some(SecurityGroupView {
                        id: g.id.clone(),
                        policy_uid: uid.to_string(),
                    })
                })
                .collect(),
        })
    }

    /// Pool name -> the port ids the leader counts in use; `None` without a reachable leader.
    async fn leader_in_use(&self) -> Option<BTreeMap<String, Vec<String>>> {
        let leader = self.leader().await?;
        let socket = self.sockets.get(&leader)?;
        let pools = api::list_pools(socket).await.ok()?;
        let mut out = BTreeMap::new();
        for p in pools {
            let shown = api::show_pool(socket, &p.name).await.ok()?;
            let ids = shown
                .ports
                .into_iter()
                .filter(|e| e.state == "inUse")
                .map(|e| e.port_id)
                .collect();
            out.insert(p.name, ids);
        }
        Some(out)
    }
}
