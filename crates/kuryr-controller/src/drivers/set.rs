//! The drivers chosen by `[kubernetes]` options, built once at start-up, the pool included.

use std::sync::Arc;

use kuryr_config::{
    PodSubnetsDriver, PodVifDriver, ProjectDriver as ProjectDriverName, SecurityGroupsDriver as SgName,
    VifPoolDriver,
};

use super::multi_vif::{self, MultiVifDriver};
use super::namespace_groups::NamespaceSecurityGroups;
use super::namespace_networks::NamespaceNetworks;
use super::network_policy::NetworkPolicyDriver;
use super::pool::{NoopPool, VifPool};
use super::project::{AnnotationProject, DefaultProject, ProjectDriver, UnsetProject};
use super::security_groups::{DefaultSecurityGroups, PolicySecurityGroups, SecurityGroupsDriver};
use super::subnets::{DefaultSubnets, NamespaceSubnets, SubnetCache, SubnetsDriver};
use super::vif::VifDriver;
use super::vif::nested::VmPortLookup;
use super::vif::nested_macvlan::NestedMacvlan;
use super::vif::nested_vlan::NestedVlan;
use super::vif::neutron::NeutronVif;
use crate::context::Platform;
use crate::error::Error;
use crate::pool::{self, PoolManager};

pub struct Drivers {
    /// `[kubernetes] pod_project_driver`: the pods' ports, and the project a namespace's binding
    /// (its deployment) is decided for.
    pub project: Arc<dyn ProjectDriver>,
    /// `namespace_project_driver`: a namespace's network and subnet (its KuryrNetwork).
    pub namespace_project: Arc<dyn ProjectDriver>,
    /// `service_project_driver`: a Service's load balancer.
    pub service_project: Arc<dyn ProjectDriver>,
    /// Namespaces' KuryrNetworks, made on first need (the `namespace` handler and subnets driver).
    pub namespace_networks: Arc<NamespaceNetworks>,
    pub subnets: Arc<dyn SubnetsDriver>,
    pub subnet_cache: SubnetCache,
    pub security_groups: Arc<dyn SecurityGroupsDriver>,
    pub vif: Arc<dyn VifDriver>,
    pub pool: Arc<dyn VifPool>,
    /// `[kubernetes] multi_vif_drivers`, in order; empty for `noop`.
    pub multi_vif: Vec<Arc<dyn MultiVifDriver>>,
    /// The pool manager behind `pool` when a pooling driver is configured (pre-population,
    /// recovery, maintenance); `None` with `noop`.
    pub pools: Option<Arc<PoolManager>>,
    /// `network_policy`: NetworkPolicy as security groups (the `policy`, `kuryrnetworkpolicy`
    /// and `pod_label` handlers and the `policy` security group driver share it).
    pub network_policy: Arc<NetworkPolicyDriver>,
    /// The `namespace` security groups, when pods' or Services' groups come from it (one cache,
    /// one orphan sweep for both).
    pub namespace_groups: Option<Arc<NamespaceSecurityGroups>>,
}

/// A `[kubernetes] *_project_driver` by its upstream name: `default` is `[neutron_defaults]
/// project`; `annotation` is the namespace's `openstack.org/kuryr-project`, else that default.
fn project_driver(ctx: &Platform, name: ProjectDriverName) -> Result<Arc<dyn ProjectDriver>, Error> {
    let default = ctx.config.neutron_defaults.project.as_deref();
    Ok(match name {
        ProjectDriverName::Annotation => Arc::new(AnnotationProject::new(ctx.kube.clone(), default)),
        ProjectDriverName::Default => Arc::new(DefaultProject::new(default)?),
    })
}

impl Drivers {
    /// Builds every driver `[kubernetes]` names, the pool driver included.
    pub fn from_config(ctx: &Arc<Platform>) -> Result<Self, Error> {
        let cfg = &ctx.config;
        let k = &cfg.kubernetes;
        let project = project_driver(ctx, k.pod_project_driver)?;
        // The same driver is one instance; another one is refused only when used (its handler
        // may not be enabled), naming the option.
        let other = |name: ProjectDriverName| -> Arc<dyn ProjectDriver> {
            if name == k.pod_project_driver {
                return project.clone();
            }
            project_driver(ctx, name).unwrap_or_else(|e| Arc::new(UnsetProject(e.to_string())))
        };
        let namespace_project = other(k.namespace_project_driver);
        let service_project = other(k.service_project_driver);
        let subnet_cache = SubnetCache::new(ctx.deployments.clone());
        let namespace_networks = Arc::new(NamespaceNetworks::new(
            ctx.kube.clone(),
            namespace_project.clone(),
        ));
        let subnets: Arc<dyn SubnetsDriver> = match k.pod_subnets_driver {
            PodSubnetsDriver::Namespace => Arc::new(NamespaceSubnets::new(
                ctx.kube.clone(),
                ctx.config.clone(),
                subnet_cache.clone(),
                namespace_networks.clone(),
            )),
            PodSubnetsDriver::Default => {
                Arc::new(DefaultSubnets::new(ctx.config.clone(), subnet_cache.clone())?)
            }
        };
        let vif = vif_driver(ctx, k.pod_vif_driver)?;
        let pools = pool_manager(ctx, &vif)?;
        let network_policy = Arc::new(
            NetworkPolicyDriver::new(
                ctx.kube.clone(),
                ctx.deployments.clone(),
                ctx.config.clone(),
                ctx.resource_tags(),
                ctx.cluster_id.clone(),
                // Only a cluster with policies needs their project: refused when one is applied.
                other(k.network_policy_project_driver),
            )
            .with_pools(pools.clone())
            .with_port_groups(ctx.port_groups.clone())
            .with_placement(ctx.placement.clone()),
        );
        let namespace = || {
            Arc::new(NamespaceSecurityGroups::new(
                ctx.deployments.clone(),
                ctx.config.clone(),
                ctx.resource_tags(),
                pools.clone(),
            ))
        };
        let mut namespace_groups = None;
        let security_groups: Arc<dyn SecurityGroupsDriver> = match k.pod_security_groups_driver {
            SgName::Default => Arc::new(DefaultSecurityGroups::new(ctx.config.clone())),
            SgName::Namespace => namespace_groups.insert(namespace()).clone(),
            SgName::Policy => Arc::new(PolicySecurityGroups::new(
                network_policy.clone(),
                ctx.config.clone(),
            )),
        };
        if k.service_security_groups_driver == SgName::Namespace && namespace_groups.is_none() {
            namespace_groups = Some(namespace());
        }
        let pool: Arc<dyn VifPool> = match &pools {
            Some(p) => p.clone(),
            None => Arc::new(NoopPool::new(vif.clone())),
        };
        let multi_vif = multi_vif::from_config(ctx, &subnet_cache)?;
        Ok(Self {
            project,
            namespace_project,
            service_project,
            namespace_networks,
            subnets,
            subnet_cache,
            security_groups,
            vif,
            pool,
            multi_vif,
            pools,
            network_policy,
            namespace_groups,
        })
    }
}

impl Drivers {
    /// Every VIF driver that may have made a pod's port (the pod VIF driver, and with
    /// `multi_pool` each one its mapping routes to).
    pub fn pod_vif_drivers(&self) -> Vec<Arc<dyn VifDriver>> {
        match &self.pools {
            Some(pools) => pools.vif_drivers(),
            None => vec![self.vif.clone()],
        }
    }
}

/// The pool manager of `[kubernetes] vif_pool_driver`; `None` for `noop`. `multi_pool` gets a
/// VIF driver for every pod VIF driver its mapping names.
fn pool_manager(ctx: &Arc<Platform>, vif: &Arc<dyn VifDriver>) -> Result<Option<Arc<PoolManager>>, Error> {
    let cfg = &ctx.config;
    Ok(match cfg.kubernetes.vif_pool_driver {
        VifPoolDriver::Noop => None,
        VifPoolDriver::MultiPool => {
            let mut vifs = vec![vif.clone()];
            for kind in cfg
                .vif_pool
                .vif_pool_mapping
                .keys()
                .chain(cfg.vif_pool.pools_vif_drivers.values())
            {
                if vifs.iter().all(|v| v.kind() != *kind) {
                    vifs.push(vif_driver(ctx, *kind)?);
                }
            }
            Some(pool::build_multi(ctx.clone(), vifs, &cfg.vif_pool)?)
        }
        _ => Some(pool::build(ctx.clone(), vif.clone(), &cfg.vif_pool)?),
    })
}

/// Builds the VIF driver named by `[kubernetes] pod_vif_driver` (or by `vif_pool_mapping`).
pub fn vif_driver(ctx: &Platform, name: PodVifDriver) -> Result<Arc<dyn VifDriver>, Error> {
    let cfg = &ctx.config;
    let mtu = cfg.neutron_defaults.network_device_mtu;
    let tags = ctx.resource_tags();
    let lookup = || VmPortLookup::new(ctx.kube.clone(), cfg.pod_vif_nested.worker_nodes_subnets.clone());
    Ok(match name {
        PodVifDriver::NeutronVif => Arc::new(NeutronVif::new(
            ctx.deployments.clone(),
            tags,
            cfg.neutron_defaults.ovs_bridge.clone(),
            mtu,
        )),
        PodVifDriver::NestedVlan => Arc::new(NestedVlan::new(ctx.deployments.clone(), lookup(), tags, mtu)),
        PodVifDriver::NestedMacvlan => Arc::new(NestedMacvlan::new(
            ctx.deployments.clone(),
            lookup(),
            tags,
            mtu,
            cfg.pod_vif_nested.rev_update_attempts,
        )),
        other => {
            return Err(Error::Config(format!(
                "[kubernetes] pod_vif_driver = {}: kuryr-rs provides neutron-vif, nested-vlan, nested-macvlan",
                other.as_str()
            )));
        }
    })
}
