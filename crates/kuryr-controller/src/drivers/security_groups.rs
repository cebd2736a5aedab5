//! Security group drivers: the security groups of a pod's ports.

use std::sync::Arc;

use async_trait::async_trait;
use kuryr_config::KuryrConfig;

use crate::error::Error;

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
