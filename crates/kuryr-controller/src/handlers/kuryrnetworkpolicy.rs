//! `kuryrnetworkpolicy` handler: makes Neutron match the policy (security groups, rules, address
//! groups through the `network_policy` driver), writes the status (group id, rules, pod selector,
//! what had to be approximated), and moves the selected pods' ports onto the groups. On delete it
//! takes the groups off the ports, deletes them and lets the object go. Either way the Services whose
//! backends the policy selects follow it (their load balancer's groups and listener ACLs:
//! [`PolicyFollowers`]). Groups whose policy is gone
//! anyway (force-deleted objects, a deposed leader's late write) are the driver's periodic sweep's
//! (`NetworkPolicyDriver::run_sweeps`, started with the pipeline). Everything happens in the
//! deployment the object records (`openstack.org/kuryr-deployment`, none = the default one); one
//! whose deployment left `kuryr.conf` is drained: its finalizer goes with a Warning Event naming
//! the groups left there.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use kuryr_crds::names::finalizers;
use kuryr_crds::{KuryrNetworkPolicy, SgRuleStatus};
use serde_json::json;

use crate::context::Context;
use crate::drivers::network_policy::policy_uid;
use crate::error::{Error, is_not_found};
use crate::handlers::policy::PolicyHandler;
use crate::handlers::service::PolicyFollowers;
use crate::k8s::{add_finalizer, publish_event, remove_finalizer, surface_user_error};
use crate::locked::Locked;
use crate::pipeline::ResourceEventHandler;
use crate::placement::record::recorded_deployment;
use crate::policies::PolicySpec;
use crate::policies::desired::BASE_VARIANT;
use crate::policies::selector::Selector;

/// How long a deletion waits for its pods to be moved off its groups before it releases them
/// anyway (the release takes the groups off whatever ports still have them).
const MOVE_PATIENCE: Duration = Duration::from_secs(30);

pub struct KuryrNetworkPolicyHandler {
    ctx: Arc<Context>,
    /// The Services whose load balancers follow the policies.
    followers: PolicyFollowers,
    /// When this replica first tried to finalize each object (by uid), by its own monotonic clock:
    /// [`MOVE_PATIENCE`] runs from then (a deletionTimestamp is the API server's clock).
    finalizing: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl KuryrNetworkPolicyHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            followers: PolicyFollowers::new(ctx.clone()),
            ctx,
            finalizing: Default::default(),
        }
    }

    /// The NetworkPolicy `knp` was made for, when it still stands (same uid, not being deleted).
    async fn standing_policy(&self, knp: &KuryrNetworkPolicy) -> Result<Option<NetworkPolicy>, Error> {
        let Some(uid) = policy_uid(knp) else {
            return Ok(None);
        };
        let api: Api<NetworkPolicy> =
            Api::namespaced(self.ctx.kube.clone(), &knp.namespace().unwrap_or_default());
        Ok(api.get_opt(&knp.name_any()).await?.filter(|np| {
            np.metadata.deletion_timestamp.is_none() && np.uid().as_deref() == Some(uid.as_str())
        }))
    }

    /// Every pod of the namespace onto the groups its policies give it now; a pod that cannot be
    /// moved does not keep the others where they were (every failure is returned).
    async fn sync_ports(&self, ns: &str) -> Result<(), Error> {
        self.ctx
            .drivers
            .network_policy
            .sync_namespace_ports(ns)
            .await
            .map(drop)
    }
}

#[async_trait]
impl ResourceEventHandler for KuryrNetworkPolicyHandler {
    type Object = KuryrNetworkPolicy;

    fn name(&self) -> &'static str {
        "kuryrnetworkpolicy"
    }

    async fn on_present(&self, knp: &KuryrNetworkPolicy) -> Result<(), Error> {
        let ns = knp.namespace().unwrap_or_default();
        let name = knp.name_any();
        let Some(np) = Api::<NetworkPolicy>::namespaced(self.ctx.kube.clone(), &ns)
            .get_opt(&name)
            .await?
            .filter(|np| np.metadata.deletion_timestamp.is_none())
        else {
            // Its policy is gone or going: release through the finalizer path (never apply
            // again what is being released).
            let api: Api<KuryrNetworkPolicy> = Api::namespaced(self.ctx.kube.clone(), &ns);
            return match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => Ok(()),
                Err(e) if is_not_found(&e) => Ok(()),
                Err(e) => Err(e.into()),
            };
        };
        // Reported by the `policy` handler; nothing changes until the policy is fixed.
        let Ok(spec) = PolicySpec::parse(&np) else {
            return Ok(());
        };
        let uid = np.uid().unwrap_or_default();
        let knp = add_finalizer(&self.ctx.kube, knp, finalizers::NETWORKPOLICY).await?;
        let driver = &self.ctx.drivers.network_policy;
        let deployment = recorded_deployment(&knp);
        if !driver.knows_deployment(&deployment) {
            let e = Error::invalid(
                format!(
                    "metadata.annotations[{}]",
                    kuryr_crds::names::annotations::DEPLOYMENT
                ),
                format!(
                    "OpenStack deployment {deployment:?} is not in kuryr.conf; the policy is not applied"
                ),
            );
            publish_event(&self.ctx.events, &knp, true, e.label(), &e.to_string()).await;
            return Err(e);
        }
        // A group upstream recorded in the status is taken over by the driver's first apply.
        let applied = match driver.ensure(&uid, &deployment, &spec).await {
            Ok(applied) => applied,
            // The project's quota reached, a rule Neutron refuses: told on the NetworkPolicy,
            // its owner's object; only what retrying may mend goes on to the Retry handler.
            Err(e) => {
                let regarding = np.object_ref(&());
                return Box::pin(surface_user_error(&self.ctx.events, &regarding, Err(e))).await;
            }
        };
        let rules: Vec<SgRuleStatus> = applied
            .rules
            .iter()
            .map(|r| SgRuleStatus {
                id: r.id.clone(),
                description: Some(r.description.clone()).filter(|d| !d.is_empty()),
                direction: Some(r.direction.clone()),
                ethertype: Some(r.ethertype.clone()),
                port_range_max: r.port_range_max.and_then(|p| i32::try_from(p).ok()),
                port_range_min: r.port_range_min.and_then(|p| i32::try_from(p).ok()),
                protocol: r.protocol.clone(),
                remote_ip_prefix: r.remote_ip_prefix.clone(),
                security_group_id: Some(r.security_group_id.clone()),
            })
            .collect();
        // Upstream's CRD has no status subresource: the status is patched with the object.
        let status = json!({"status": {
            "securityGroupId": applied.groups.get(BASE_VARIANT),
            "securityGroupRules": rules,
            "podSelector": knp.spec.pod_selector,
            "kuryrRsNotes": applied.notes,
        }});
        Api::<KuryrNetworkPolicy>::namespaced(self.ctx.kube.clone(), &ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        self.sync_ports(&ns).await?;
        let previous = knp.status.as_ref().and_then(|s| s.pod_selector.as_ref());
        let selectors: Vec<Selector> = std::iter::once(&knp.spec.pod_selector)
            .chain(previous)
            .filter_map(|s| Selector::parse(s, "spec.podSelector").ok())
            .collect();
        self.followers.refresh(&ns, &selectors).await
    }

    async fn on_finalize(&self, knp: &KuryrNetworkPolicy) -> Result<(), Error> {
        let ns = knp.namespace().unwrap_or_default();
        let driver = &self.ctx.drivers.network_policy;
        let deployment = recorded_deployment(knp);
        if let Some(np) = self.standing_policy(knp).await? {
            // Deleted by hand (or by a collector) while its NetworkPolicy stands: the policy is
            // still in force. Its groups stay, on the ports, and the KuryrNetworkPolicy made again
            // in its place finds them by the policy's uid, so no pod is left open meanwhile.
            tracing::info!(policy = %knp.name_any(), namespace = %ns, "KuryrNetworkPolicy deleted while its NetworkPolicy stands: made again");
            remove_finalizer(&self.ctx.kube, knp, finalizers::NETWORKPOLICY).await?;
            return PolicyHandler::new(self.ctx.clone()).on_present(&np).await;
        }
        // The policy no longer counts for its pods (a policy being deleted is left out): they
        // are moved to the groups they have without it before its groups go, so none sits on a
        // part of its groups meanwhile (an ingress-only policy's pod on allow-all egress alone
        // admits nothing). A pod that cannot be moved for a reason a retry cannot mend (its own
        // input) must not keep the deletion waiting: the release takes the group off its port.
        // Nor may one that waits on something else for long (another policy's group its quota
        // refused, which this deletion may be what frees): past [`MOVE_PATIENCE`] it goes on.
        let uid = knp.uid().unwrap_or_default();
        let patient = self
            .finalizing
            .locked()
            .entry(uid.clone())
            .or_insert_with(std::time::Instant::now)
            .elapsed()
            <= MOVE_PATIENCE;
        match self.sync_ports(&ns).await {
            Ok(()) => {}
            Err(e) if e.is_retryable() && patient => return Err(e),
            Err(e) => {
                tracing::warn!(policy = %knp.name_any(), namespace = %ns, error = %e, "pods not moved before the policy's release");
            }
        }
        let unadopted = knp.status.as_ref().and_then(|s| s.security_group_id.as_deref());
        if let (None, Some(sg), true) = (policy_uid(knp), unadopted, driver.knows_deployment(&deployment)) {
            driver.release_unadopted(&deployment, sg).await?;
        }
        if let Some(uid) = policy_uid(knp) {
            if driver.knows_deployment(&deployment) {
                driver.release(&uid, &deployment).await?;
            } else {
                // Nothing can reach that Neutron any more: drained, not stuck.
                let msg = format!(
                    "OpenStack deployment {deployment:?} is no longer configured: the security groups and \
                     address groups of this policy (description kuryr-rs:{}:{uid}) are left there",
                    self.ctx.cluster_id
                );
                tracing::warn!(policy = %knp.name_any(), namespace = %ns, "{msg}");
                publish_event(&self.ctx.events, knp, true, "DeploymentRemoved", &msg).await;
            }
        }
        let selectors: Vec<Selector> = Selector::parse(&knp.spec.pod_selector, "spec.podSelector")
            .into_iter()
            .collect();
        match self.followers.refresh(&ns, &selectors).await {
            Ok(()) => {}
            Err(e) if e.is_retryable() && patient => return Err(e),
            // Their load balancers follow at the Services' next pass; the groups are gone anyway.
            Err(e) => {
                tracing::warn!(policy = %knp.name_any(), namespace = %ns, error = %e, "Services not refreshed after the policy's release");
            }
        }
        if knp.meta().finalizers.is_some() {
            remove_finalizer(&self.ctx.kube, knp, finalizers::NETWORKPOLICY).await?;
        }
        self.finalizing.locked().remove(&uid);
        Ok(())
    }
}
