//! `policy` handler: a NetworkPolicy -> its KuryrNetworkPolicy (same name and namespace, owned by
//! the policy). The spec holds the pod selector, the policy types and the rules in upstream's
//! shape; the `kuryrnetworkpolicy` handler makes Neutron match. Content the translation cannot
//! act on gets a Warning Event on the NetworkPolicy naming the field, and changes nothing.
//!
//! The KuryrNetworkPolicy is created with the OpenStack deployment its groups will live in (the
//! annotation `openstack.org/kuryr-deployment`): where the namespace's pods are, so its groups can
//! be put on their ports. It stays there after a rebind of the project.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use kuryr_crds::names::finalizers;
use kuryr_crds::{KuryrNetworkPolicy, KuryrNetworkPolicySpec, SgRule, SgRuleEntry};
use serde_json::json;

use crate::context::Context;
use crate::drivers::network_policy::policy_uid;
use crate::error::{Error, is_not_found};
use crate::k8s::{add_finalizer, publish_event, remove_finalizer};
use crate::pipeline::ResourceEventHandler;
use crate::policies::desired::BASE_VARIANT;
use crate::policies::{ClusterIndex, Direction, Options, PolicySpec, Remote, desired};

pub struct PolicyHandler {
    ctx: Arc<Context>,
}

impl PolicyHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }

    /// The deployment of `ns`'s pods: its own network's when the subnets driver gives
    /// namespaces one, otherwise the project's binding for the namespace's group (the scheduler,
    /// whose filters drop deployments in maintenance: never a fallback).
    async fn place(&self, ns: &str) -> Result<String, Error> {
        match self.ctx.drivers.subnets.deployment_of_namespace(ns).await {
            Ok(Some(deployment)) => Ok(deployment),
            Ok(None) => {
                let project = self.ctx.drivers.project.project_for_namespace(ns).await?;
                Ok(self.ctx.bind(&project, ns).await?.deployment)
            }
            Err(e) => Err(e),
        }
    }
}

/// The KuryrNetworkPolicy spec of `spec`: membership-independent rules (address groups appear
/// by their key in the description).
pub fn knp_spec(np: &NetworkPolicy, spec: &PolicySpec) -> KuryrNetworkPolicySpec {
    let d = desired(spec, &ClusterIndex::default(), &Options::default());
    let (mut ingress, mut egress) = (vec![], vec![]);
    for r in d.groups.get(BASE_VARIANT).into_iter().flatten() {
        let (remote_ip_prefix, description) = match &r.remote {
            Remote::Prefix(c) => (Some(c.to_string()), None),
            Remote::Group(k) => (None, Some(format!("address group {}", k.0))),
            _ => (None, None),
        };
        let entry = SgRuleEntry {
            affected_pods: None,
            namespace: None,
            sg_rule: SgRule {
                description,
                direction: Some(r.direction.neutron().into()),
                ethertype: Some(r.ethertype.neutron().into()),
                port_range_min: r.ports.map(|p| i32::from(p.0)),
                port_range_max: r.ports.map(|p| i32::from(p.1)),
                protocol: r.protocol.map(|p| p.neutron().into()),
                remote_ip_prefix,
            },
        };
        match r.direction {
            Direction::Ingress => ingress.push(entry),
            Direction::Egress => egress.push(entry),
        }
    }
    let mut policy_types = vec![];
    if spec.ingress.is_some() {
        policy_types.push("Ingress".to_string());
    }
    if spec.egress.is_some() {
        policy_types.push("Egress".to_string());
    }
    KuryrNetworkPolicySpec {
        egress_sg_rules: egress,
        ingress_sg_rules: ingress,
        pod_selector: np
            .spec
            .as_ref()
            .and_then(|s| s.pod_selector.clone())
            .unwrap_or_default(),
        policy_types,
    }
}

#[async_trait]
impl ResourceEventHandler for PolicyHandler {
    type Object = NetworkPolicy;

    fn name(&self) -> &'static str {
        "policy"
    }

    async fn on_present(&self, np: &NetworkPolicy) -> Result<(), Error> {
        let spec = match PolicySpec::parse(np) {
            Ok(s) => s,
            Err(e) => {
                publish_event(&self.ctx.events, np, true, "InvalidNetworkPolicy", &e.to_string()).await;
                tracing::warn!(policy = %np.name_any(), field = %e.field, "NetworkPolicy not enforced: {}", e.message);
                return Ok(());
            }
        };
        let np = add_finalizer(&self.ctx.kube, np, finalizers::NETWORKPOLICY).await?;
        let ns = np.namespace().unwrap_or_default();
        let api: Api<KuryrNetworkPolicy> = Api::namespaced(self.ctx.kube.clone(), &ns);
        let want = knp_spec(&np, &spec);
        let generation = np.metadata.generation.unwrap_or_default().to_string();
        let generation_of = |knp: &KuryrNetworkPolicy| {
            knp.annotations()
                .get(kuryr_crds::names::annotations::POLICY_GENERATION)
                .cloned()
        };
        let owner = OwnerReference {
            api_version: "networking.k8s.io/v1".into(),
            kind: "NetworkPolicy".into(),
            name: np.name_any(),
            uid: np.uid().unwrap_or_default(),
            block_owner_deletion: Some(true),
            controller: Some(true),
        };
        match api.get_opt(&np.name_any()).await? {
            // Written by upstream kuryr-kubernetes, which links the policy by an annotation: the
            // owner reference is what names the policy's Neutron groups (their tag) from here on,
            // and what lets them be released when the policy goes.
            Some(knp) if policy_uid(&knp).is_none() => {
                let patch = json!({"metadata": {"ownerReferences": [owner],
                    "annotations": {kuryr_crds::names::annotations::POLICY_GENERATION: generation}},
                    "spec": want});
                api.patch(&np.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                Ok(())
            }
            // Deleted while this policy stands: made again once it is gone (its handler's finalizer
            // does it; this event retries until then).
            Some(knp) if knp.metadata.deletion_timestamp.is_some() => Err(Error::not_ready(format!(
                "KuryrNetworkPolicy {ns}/{} is being deleted",
                np.name_any()
            ))),
            Some(knp) if knp.spec == want && generation_of(&knp).as_ref() == Some(&generation) => Ok(()),
            Some(_) => {
                let patch = json!({"metadata": {"annotations": {
                    kuryr_crds::names::annotations::POLICY_GENERATION: generation}}, "spec": want});
                api.patch(&np.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                Ok(())
            }
            None => {
                let deployment = self.place(&ns).await?;
                let mut annotations = crate::placement::record::annotations(&deployment);
                annotations.insert(
                    kuryr_crds::names::annotations::POLICY_GENERATION.to_string(),
                    generation,
                );
                let knp = KuryrNetworkPolicy {
                    metadata: ObjectMeta {
                        annotations: Some(annotations),
                        name: Some(np.name_any()),
                        namespace: Some(ns.clone()),
                        finalizers: Some(vec![finalizers::NETWORKPOLICY.to_string()]),
                        owner_references: Some(vec![owner]),
                        ..Default::default()
                    },
                    spec: want,
                    status: None,
                };
                match api.create(&PostParams::default(), &knp).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        Err(Error::not_ready("KuryrNetworkPolicy being replaced"))
                    }
                    Err(e) if crate::k8s::is_namespace_terminating(&e) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    async fn on_finalize(&self, np: &NetworkPolicy) -> Result<(), Error> {
        let ns = np.namespace().unwrap_or_default();
        let api: Api<KuryrNetworkPolicy> = Api::namespaced(self.ctx.kube.clone(), &ns);
        match api.get_opt(&np.name_any()).await? {
            // The kuryrnetworkpolicy handler releases the Neutron side, then lets it go.
            Some(knp) => {
                if knp.meta().deletion_timestamp.is_none() {
                    match api.delete(&np.name_any(), &DeleteParams::background()).await {
                        Ok(_) => {}
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(Error::not_ready(format!(
                    "KuryrNetworkPolicy {ns}/{} still being released",
                    np.name_any()
                )))
            }
            None => remove_finalizer(&self.ctx.kube, np, finalizers::NETWORKPOLICY).await,
        }
    }
}
