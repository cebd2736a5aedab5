//! Security group drivers: the security groups of a pod's ports.

use std::collections::HashMap;

use std::sync::Arc;

use async_trait::async_trait;
use kuryr_config::KuryrConfig;
use kuryr_neutron::{ListFilter, SecurityGroupCreate, SecurityGroupRuleCreate, Taggable};
use tokio::sync::Mutex;

use crate::error::Error;
use crate::openstack::Deployments;

#[async_trait]
pub trait SecurityGroupsDriver: Send + Sync {
    async fn security_groups(
        &self,
        deployment: &str,
        project_id: &str,
        namespace: &str,
    ) -> Result<Vec<String>, Error>;

    /// The groups of one pod's ports. Drivers that decide per pod (`policy`) override it; the
    /// others decide per namespace.
    async fn pod_security_groups(
        &self,
        deployment: &str,
        project_id: &str,
        pod: &k8s_openapi::api::core::v1::Pod,
    ) -> Result<Vec<String>, Error> {
        let ns = kube::ResourceExt::namespace(pod).unwrap_or_default();
        self.security_groups(deployment, project_id, &ns).await
    }

    /// Deletes what the driver created for a namespace that is gone (in `project_id`).
    async fn release_namespace(
        &self,
        _deployment: &str,
        _project_id: &str,
        _namespace: &str,
    ) -> Result<(), Error> {
        Ok(())
    }
}

/// `default`: `[neutron_defaults] pod_security_groups` for every pod (or the deployment's own).
pub struct DefaultSecurityGroups {
    config: Arc<KuryrConfig>,
}

impl DefaultSecurityGroups {
    pub fn new(config: Arc<KuryrConfig>) -> Self {
        Self { config }
    }
}

#[async_trait]
impl SecurityGroupsDriver for DefaultSecurityGroups {
    async fn security_groups(&self, deployment: &str, _: &str, _: &str) -> Result<Vec<String>, Error> {
        Ok(self.config.deployment_defaults(deployment).pod_security_groups)
    }
}

/// `namespace`: the default groups plus one group per namespace that admits traffic from pods of
/// the same namespace (upstream's namespace isolation). The group is found by its namespace and
/// cluster tags in the pod's project, so a restart or a second controller never creates a
/// duplicate, and another cluster's namespace of the same name never shares (or deletes) it.
pub struct NamespaceSecurityGroups {
    deployments: Deployments,
    config: Arc<KuryrConfig>,
    tags: Vec<String>,
    cache: Mutex<HashMap<(String, String), String>>,
}

impl NamespaceSecurityGroups {
    pub fn new(deployments: Deployments, config: Arc<KuryrConfig>, tags: Vec<String>) -> Self {
        Self {
            deployments,
            config,
            tags,
            cache: Mutex::default(),
        }
    }

    fn namespace_tag(namespace: &str) -> String {
        format!("kuryr-rs.namespace={namespace}")
    }

    /// The tags that identify this cluster's group of `namespace`.
    fn lookup_tags(&self, namespace: &str) -> [String; 2] {
        [
            Self::namespace_tag(namespace),
            kuryr_crds::names::neutron::cluster_tag(&self.config.kubernetes.cluster_id),
        ]
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
                // Tagged last, once its rules exist: a tagged group is complete. One left
                // untagged by a crash is adopted and completed rather than duplicated.
                let name = format!("ns/{namespace}-sg");
                let untagged = client
                    .list_security_groups(&ListFilter::new().name(&name).project_id(project_id))
                    .await?
                    .into_iter()
                    .find(|sg| sg.tags.is_empty());
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
                                description: Some(format!("kuryr-rs: pods of namespace {namespace}")),
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
                        // SecurityGroupRuleExists: created before the crash.
                        Err(e) if e.status() == Some(409) => {}
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
            match client.delete_security_group(&sg.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// `policy`: the groups of the NetworkPolicies that select the pod (plus allow-all groups for a
/// direction none of them isolates); a pod no policy selects gets the default groups. Known from
/// the pod's labels alone, so its port has them before the KuryrPort goes active.
pub struct PolicySecurityGroups {
    policies: Arc<super::network_policy::NetworkPolicyDriver>,
    config: Arc<KuryrConfig>,
}

impl PolicySecurityGroups {
    pub fn new(policies: Arc<super::network_policy::NetworkPolicyDriver>, config: Arc<KuryrConfig>) -> Self {
        Self { policies, config }
    }
}

#[async_trait]
impl SecurityGroupsDriver for PolicySecurityGroups {
    /// Without a pod (a pool filled ahead of demand) the default groups.
    async fn security_groups(&self, deployment: &str, _: &str, _: &str) -> Result<Vec<String>, Error> {
        Ok(self.config.deployment_defaults(deployment).pod_security_groups)
    }

    async fn pod_security_groups(
        &self,
        deployment: &str,
        _project_id: &str,
        pod: &k8s_openapi::api::core::v1::Pod,
    ) -> Result<Vec<String>, Error> {
        self.policies.pod_groups(deployment, pod).await
    }
}
