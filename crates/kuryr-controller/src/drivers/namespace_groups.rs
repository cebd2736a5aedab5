//! The `namespace` security groups driver (pods' and Services'): one group per namespace that
//! admits traffic from the namespace's own pods, and its release once the namespace is gone.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kuryr_config::KuryrConfig;
use kuryr_neutron::{ListFilter, SecurityGroupCreate, SecurityGroupRuleCreate, Taggable};
use tokio::sync::Mutex;

use super::security_groups::SecurityGroupsDriver;
use crate::error::Error;
use crate::openstack::Deployments;
use crate::pool::PoolManager;

const TAG_NAMESPACE: &str = "kuryr-rs.namespace=";

/// `namespace`: the default groups plus one group per namespace that admits traffic from pods of
/// the same namespace (upstream's namespace isolation). The group is found by its namespace and
/// cluster tags in the pod's project, so a restart or a second controller never creates a
/// duplicate, and another cluster's namespace of the same name never shares (or deletes) it.
///
/// Pods' and Services' groups come from one instance (`Drivers::namespace_groups`): one cache,
/// which a release empties for both. A namespace's group is released with its KuryrNetwork
/// (namespace subnets) and, whatever the handlers, by the orphan sweep once the namespace is gone.
pub struct NamespaceSecurityGroups {
    deployments: Deployments,
    config: Arc<KuryrConfig>,
    tags: Vec<String>,
    /// Pools keyed by a group are dropped before it is deleted: their spare ports hold it.
    pools: Option<Arc<PoolManager>>,
    cache: Mutex<HashMap<(String, String), String>>,
}

impl NamespaceSecurityGroups {
    pub fn new(
        deployments: Deployments,
        config: Arc<KuryrConfig>,
        tags: Vec<String>,
        pools: Option<Arc<PoolManager>>,
    ) -> Self {
        Self {
            deployments,
            config,
            tags,
            pools,
            cache: Mutex::default(),
        }
    }

    fn namespace_tag(namespace: &str) -> String {
        format!("{TAG_NAMESPACE}{namespace}")
    }

    fn cluster_tag(&self) -> String {
        kuryr_crds::names::neutron::cluster_tag(&self.config.kubernetes.cluster_id)
    }

    /// What a group is made with, before its tags: `kuryr-rs-ns:<cluster_id>:<namespace>`.
    fn description(&self, namespace: &str) -> String {
        format!("{}{namespace}", self.description_prefix())
    }

    fn description_prefix(&self) -> String {
        format!("kuryr-rs-ns:{}:", self.config.kubernetes.cluster_id)
    }

    /// The tags that identify this cluster's group of `namespace`.
    fn lookup_tags(&self, namespace: &str) -> [String; 2] {
        [Self::namespace_tag(namespace), self.cluster_tag()]
    }

    async fn namespace_group(
        &self,
        deployment: &str,
        project_id: &str,
        namespace: &str,
    ) -> Result<String, Error> {
        let key = (deployment.to_string(), namespace.to_string());
        let mut cache = self.cache.lock().await;
        if let Some(id) = cache.get(&key) {
            return Ok(id.clone());
        }
        let client = self.deployments.client(deployment)?;
        let lookup = self.lookup_tags(namespace);
        let existing = client
            .list_security_groups(&ListFilter::new().project_id(project_id).tags(&lookup))
            .await?;
        let id = match existing.into_iter().next() {
            Some(sg) => {
                self.deployments.adoptable(deployment, || {
                    format!("security group {} of namespace {namespace}", sg.id)
                })?;
                sg.id
            }
            None => {
                // Tagged last, once its rules exist: a tagged group is complete. Neutron takes
                // no tags in the create, so the description says whose it is: one a crash left
                // untagged is adopted and completed rather than duplicated (and never another
                // cluster's, or upstream's group of the same name).
                let name = format!("ns/{namespace}-sg");
                let description = self.description(namespace);
                let untagged = client
                    .list_security_groups(&ListFilter::new().name(&name).project_id(project_id))
                    .await?
                    .into_iter()
                    .find(|sg| sg.tags.is_empty() && sg.description == description);
                let sg = match untagged {
                    Some(sg) => {
                        self.deployments.adoptable(deployment, || {
                            format!("untagged security group {} of namespace {namespace}", sg.id)
                        })?;
                        sg
                    }
                    None => {
                        client
                            .create_security_group(&SecurityGroupCreate {
                                name,
                                project_id: Some(project_id.to_string()),
                                description: Some(description),
                                ..Default::default()
                            })
                            .await?
                    }
                };
                for ethertype in ["IPv4", "IPv6"] {
                    let rule = client
                        .create_security_group_rule(&SecurityGroupRuleCreate {
                            security_group_id: sg.id.clone(),
                            direction: "ingress".into(),
                            ethertype: Some(ethertype.into()),
                            remote_group_id: Some(sg.id.clone()),
                            project_id: Some(project_id.to_string()),
                            ..Default::default()
                        })
                        .await;
                    match rule {
                        // Created before the crash. Not any 409: OverQuota is one too.
                        Err(e) if e.is_kind(&kuryr_neutron::ErrorKind::SecurityGroupRuleExists) => {}
                        r => {
                            r?;
                        }
                    }
                }
                let mut tags = self.tags.clone();
                tags.extend(lookup);
                tags.sort();
                tags.dedup();
                client
                    .replace_tags(Taggable::SecurityGroup, &sg.id, &tags)
                    .await?;
                sg.id
            }
        };
        cache.insert(key, id.clone());
        Ok(id)
    }
}

#[async_trait]
impl SecurityGroupsDriver for NamespaceSecurityGroups {
    async fn security_groups(
        &self,
        deployment: &str,
        project_id: &str,
        namespace: &str,
    ) -> Result<Vec<String>, Error> {
        let mut groups = self.config.deployment_defaults(deployment).pod_security_groups;
        groups.push(self.namespace_group(deployment, project_id, namespace).await?);
        Ok(groups)
    }

    async fn release_namespace(
        &self,
        deployment: &str,
        project_id: &str,
        namespace: &str,
    ) -> Result<(), Error> {
        self.cache
            .lock()
            .await
            .remove(&(deployment.to_string(), namespace.to_string()));
        // Found by tags, as `namespace_group` adopts it: in the namespace's project, and only
        // where the cluster tag is this cluster's (retried until the claim is confirmed).
        let client = self.deployments.client(deployment)?;
        let groups = client
            .list_security_groups(
                &ListFilter::new()
                    .project_id(project_id)
                    .tags(self.lookup_tags(namespace)),
            )
            .await?;
        if let Some(sg) = groups.first() {
            self.deployments.adoptable(deployment, || {
                format!("security group {} of namespace {namespace}", sg.id)
            })?;
        }
        for sg in groups {
            self.release_group(deployment, namespace, &sg.id).await?;
        }
        Ok(())
    }
}

impl NamespaceSecurityGroups {
    /// Deletes `sg`, the group of `namespace` in `deployment`: the pools keyed by it go first
    /// (their spare ports hold it). Forgotten before and after the delete, so a lookup racing
    /// it caches nothing stale: a port create naming the deleted group fails, is retried, and
    /// the retry makes the group anew.
    async fn release_group(&self, deployment: &str, namespace: &str, sg: &str) -> Result<(), Error> {
        self.forget(deployment, namespace, sg).await;
        if let Some(pools) = &self.pools {
            pools.drop_security_group(sg).await?;
        }
        let client = self.deployments.client(deployment)?;
        let deleted = match client.delete_security_group(sg).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            // A port of the namespace not released yet, a load balancer's VIP port not deleted
            // yet: the next pass tries again.
            Err(e) if e.is_kind(&kuryr_neutron::ErrorKind::SecurityGroupInUse) => Err(Error::not_ready(
                format!("security group {sg} of namespace {namespace} is still in use: {e}"),
            )),
            Err(e) => Err(e.into()),
        };
        self.forget(deployment, namespace, sg).await;
        deleted
    }

    /// Forgets every group: at the start of a leadership term, as another replica's sweep may
    /// have deleted some while this one was not leading.
    pub async fn forget_all(&self) {
        self.cache.lock().await.clear();
    }

    async fn forget(&self, deployment: &str, namespace: &str, sg: &str) {
        let mut cache = self.cache.lock().await;
        let key = (deployment.to_string(), namespace.to_string());
        if cache.get(&key).is_some_and(|id| id == sg) {
            cache.remove(&key);
        }
    }

    /// Releases this cluster's namespace groups whose namespace is gone (deleted while no
    /// controller ran, or with no KuryrNetwork to release it: the `namespace` groups driver
    /// without namespace subnets). A namespace is gone only when it is missing from a listing
    /// taken after its group was seen, so one created meanwhile keeps its group. Only where this
    /// cluster's cluster_id claim is held (cluster_claim.rs). Groups a crash left untagged are
    /// found by their description in the projects this cluster's groups are in (and the default
    /// project). Returns the groups deleted.
    pub async fn sweep_orphans(&self, kube: &kube::Client) -> Result<usize, Error> {
        let before = namespaces(kube).await?;
        let mut candidates = vec![];
        let mut errors = vec![];
        for deployment in self.deployments.claimed_names() {
            match self.groups_of_cluster(&deployment).await {
                Ok(groups) => candidates.extend(
                    groups
                        .into_iter()
                        .filter(|(ns, _)| !before.contains(ns))
                        .map(|(ns, sg)| (deployment.clone(), ns, sg)),
                ),
                // One unreachable cloud does not keep the others from being swept.
                Err(e) => errors.push(e),
            }
        }
        let mut released = 0;
        if !candidates.is_empty() {
            let after = namespaces(kube).await?;
            for (deployment, ns, sg) in candidates.iter().filter(|(_, ns, _)| !after.contains(ns)) {
                match self.release_group(deployment, ns, sg).await {
                    Ok(()) => {
                        tracing::info!(namespace = %ns, deployment = %deployment, security_group = %sg, "deleted the security group of a namespace that is gone");
                        released += 1;
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        match errors.len() {
            0 => Ok(released),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Multiple(errors)),
        }
    }
}

impl NamespaceSecurityGroups {
    /// This cluster's namespace groups in `deployment` as (namespace, group): the tagged ones,
    /// and the untagged ones its description names in their projects and the default project.
    async fn groups_of_cluster(&self, deployment: &str) -> Result<Vec<(String, String)>, Error> {
        let client = self.deployments.client(deployment)?;
        // The fields used only: each pass sees every group of the cluster.
        let tagged = client
            .list_security_groups(&ListFilter::new().tags([self.cluster_tag()]).fields([
                "id",
                "tags",
                "project_id",
            ]))
            .await?;
        let mut projects: BTreeSet<String> = tagged.iter().map(|sg| sg.project_id.clone()).collect();
        projects.extend(
            self.config
                .neutron_defaults
                .project
                .clone()
                .filter(|p| !p.is_empty()),
        );
        let mut found: Vec<(String, String)> = tagged
            .into_iter()
            .filter_map(|sg| {
                let ns = sg.tags.iter().find_map(|t| t.strip_prefix(TAG_NAMESPACE))?;
                Some((ns.to_string(), sg.id))
            })
            .collect();
        let prefix = self.description_prefix();
        for project in projects.into_iter().filter(|p| !p.is_empty()) {
            let groups = client
                .list_security_groups(&ListFilter::new().project_id(&project).fields([
                    "id",
                    "tags",
                    "description",
                ]))
                .await?;
            found.extend(groups.into_iter().filter_map(|sg| {
                let ns = sg.description.strip_prefix(&prefix)?;
                (sg.tags.is_empty() && !ns.is_empty()).then(|| (ns.to_string(), sg.id))
            }));
        }
        Ok(found)
    }
}

async fn namespaces(kube: &kube::Client) -> Result<BTreeSet<String>, Error> {
    Ok(Api::<Namespace>::all(kube.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect())
}
