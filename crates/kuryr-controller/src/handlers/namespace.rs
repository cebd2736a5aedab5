//! `namespace` handler: a namespace holding pods on the pods' network gets a KuryrNetwork
//! (`spec.nsName`, `projectId`, `nsLabels`; see `drivers::namespace_networks`), which the
//! `kuryrnetwork` handler turns into a Neutron network, subnet and router interface; its labels
//! are kept current; its deletion deletes it.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kuryr_crds::KuryrNetwork;
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
                let networks = &self.ctx.drivers.namespace_networks;
                if networks.needed_by_pods(&name).await? {
                    networks.create(ns).await?;
                } else {
                    tracing::debug!(namespace = %name, "no pod on the pods' network: no KuryrNetwork until one needs it");
                }
                Ok(())
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
