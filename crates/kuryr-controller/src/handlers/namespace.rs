//! `namespace` handler: with the `namespace` subnet driver every namespace gets a KuryrNetwork
//! (`spec.nsName`, `projectId`, `nsLabels`), which the `kuryrnetwork` handler turns into a Neutron
//! network, subnet and router interface.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kuryr_crds::names::finalizers;
use kuryr_crds::{KuryrNetwork, KuryrNetworkSpec};
use serde_json::json;

use crate::context::Context;
use crate::error::{Error, is_not_found};
use crate::pipeline::ResourceEventHandler;

pub struct NamespaceHandler {
    ctx: Arc<Context>,
}

impl NamespaceHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }
}

#[async_trait]
impl ResourceEventHandler for NamespaceHandler {
    type Object = Namespace;

    fn name(&self) -> &'static str {
        "namespace"
    }

    async fn on_present(&self, ns: &Namespace) -> Result<(), Error> {
        let name = ns.name_any();
        let labels = ns.labels().clone();
        let api: Api<KuryrNetwork> = Api::namespaced(self.ctx.kube.clone(), &name);
        match api.get_opt(&name).await? {
            Some(kn) if kn.spec.ns_labels == labels => Ok(()),
            Some(_) => {
                // Labels drive network policies upstream; keep them current.
                let patch = json!({"spec": {"nsLabels": labels}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                Ok(())
            }
            None => {
                let project = self
                    .ctx
                    .drivers
                    .namespace_project
                    .project_for_namespace(&name)
                    .await?;
                let kn = KuryrNetwork {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(name.clone()),
                        finalizers: Some(vec![finalizers::KURYRNETWORK.to_string()]),
                        ..Default::default()
                    },
                    spec: KuryrNetworkSpec {
                        ns_name: name.clone(),
                        project_id: project,
                        ns_labels: labels,
                    },
                    status: None,
                };
                match api.create(&PostParams::default(), &kn).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) if crate::k8s::is_namespace_terminating(&e) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    async fn on_finalize(&self, ns: &Namespace) -> Result<(), Error> {
        let name = ns.name_any();
        let api: Api<KuryrNetwork> = Api::namespaced(self.ctx.kube.clone(), &name);
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
