//! Planning a pod's interfaces: eth0 from the project, placement, subnet and security group
//! drivers, the others from the multi-VIF drivers. No Neutron writes happen here, so bad input
//! (an annotation, a NAD) fails before any port exists.

use k8s_openapi::api::core::v1::Pod;
use kuryr_crds::names::DEFAULT_IFNAME;

use crate::context::Context;
use crate::drivers::multi_vif::{self, DEFAULT_NETWORK_NAME, PlannedVif, PodNetworking, PortSource};
use crate::drivers::{PodRef, PortSpec};
use crate::error::Error;

/// One interface to acquire.
#[derive(Clone, Debug)]
pub struct Interface {
    pub ifname: String,
    /// eth0, the pod's default route.
    pub default: bool,
    pub plan: PlannedVif,
}

impl Interface {
    /// The pod's eth0: a port from the pool driver on `spec`.
    pub fn default_on(spec: PortSpec) -> Self {
        Self {
            ifname: DEFAULT_IFNAME.to_string(),
            default: true,
            plan: PlannedVif {
                driver: "pod_vif_driver",
                ifname: Some(DEFAULT_IFNAME.to_string()),
                network: DEFAULT_NETWORK_NAME.to_string(),
                source: PortSource::Pooled { spec },
            },
        }
    }
}

/// Project, network and security groups of the pod's default interface, in the deployment that
/// serves the pod's project.
pub async fn default_spec(ctx: &Context, namespace: &str) -> Result<PortSpec, Error> {
    spec_for(ctx, namespace, None).await
}

/// [`default_spec`] for `pod`: per-pod security group drivers (`policy`) see its labels.
async fn spec_for(ctx: &Context, namespace: &str, pod: Option<&Pod>) -> Result<PortSpec, Error> {
    let d = &ctx.drivers;
    let project = d.project.project_for_namespace(namespace).await?;
    // A namespace whose network was made in some deployment keeps its pods there, whatever the
    // project's binding is now; otherwise the binding decides.
    let (deployment, project) = match d.subnets.deployment_of_namespace(namespace).await? {
        Some(dep) => {
            let id = ctx.project_in(&dep, &project).await?;
            (dep, id)
        }
        None => {
            let placed = ctx.bind(&project, namespace).await?;
            (placed.deployment, placed.project_id)
        }
    };
    let network = d.subnets.network_for_namespace(&deployment, namespace).await?;
    let sgs = match pod {
        Some(pod) => {
            d.security_groups
                .pod_security_groups(&deployment, &project, pod)
                .await?
        }
        None => {
            d.security_groups
                .security_groups(&deployment, &project, namespace)
                .await?
        }
    };
    Ok(PortSpec::new(deployment, project, network, sgs))
}

/// Every interface the pod gets, eth0 first, named and validated.
pub async fn plan(ctx: &Context, pod: &Pod, podref: &PodRef) -> Result<Vec<Interface>, Error> {
    let spec = spec_for(ctx, &podref.namespace, Some(pod)).await?;
    let extra = multi_vif::plan_all(
        &ctx.drivers.multi_vif,
        &PodNetworking {
            pod,
            podref,
            default: &spec,
            vif_driver: ctx.drivers.vif.kind(),
        },
        &ctx.config.kubernetes.additional_ifname_prefix,
    )
    .await?;
    let mut out = Vec::with_capacity(extra.len() + 1);
    out.push(Interface::default_on(spec));
    out.extend(extra.into_iter().map(|(ifname, plan)| Interface {
        ifname,
        default: false,
        plan,
    }));
    Ok(out)
}
