//! `endpoints` handler: a Service's EndpointSlices -> `spec.endpointSlices` of its KuryrLoadBalancer (ready
//! endpoints only). Services without a selector are served from the slices their owner writes by hand.
//! Every slice event recomputes the whole Service from all its slices, so order and splitting do not matter,
//! and an unchanged result writes nothing. The slices of one Service are queued apart (one queue per object),
//! so the handling of one Service's slices takes turns (with the `service` handler's catch-up after a create too,
//! `Context::slice_writes`): two handled at once each listed the slices, and the one that listed first could
//! write last, leaving Octavia's members stale until the next slice event.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kuryr_crds::{KuryrLoadBalancer, LbEndpointSlice};
use serde_json::json;

use crate::context::Context;
use crate::error::Error;
use crate::handlers::service::ServiceHandler;
use crate::pipeline::ResourceEventHandler;
use crate::services::endpoints::{SERVICE_NAME_LABEL, from_slices};
use crate::services::security::target_ports;
use crate::services::spec;

pub struct EndpointsHandler {
    ctx: Arc<Context>,
    /// For the listener ACLs of a named target port the slices resolve anew.
    services: ServiceHandler,
}

impl EndpointsHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            services: ServiceHandler::new(ctx.clone()),
            ctx,
        }
    }

    async fn sync(&self, slice: &EndpointSlice) -> Result<(), Error> {
        let ns = slice.namespace().unwrap_or_default();
        let Some(service) = slice.labels().get(SERVICE_NAME_LABEL).cloned() else {
            return Ok(());
        };
        let _turn = self.ctx.slice_writes.lock((ns.clone(), service.clone())).await;
        let svc = Api::<Service>::namespaced(self.ctx.kube.clone(), &ns)
            .get_opt(&service)
            .await?;
        match &svc {
            None => return Ok(()),
            Some(svc) if spec::skip_reason(svc).is_some() || svc.metadata.deletion_timestamp.is_some() => {
                return Ok(());
            }
            Some(_) => {}
        }
        let slices = Api::<EndpointSlice>::namespaced(self.ctx.kube.clone(), &ns)
            .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={service}")))
            .await?;
        let wanted = from_slices(&slices.items);
        let api: Api<KuryrLoadBalancer> = Api::namespaced(self.ctx.kube.clone(), &ns);
        let Some(klb) = api.get_opt(&service).await? else {
            // The service handler creates it with the slices there are then, and lists them once
            // more after the create, so none is missed. Retrying here would only end in an error
            // for a Service it refused (its Event says why).
            return Ok(());
        };
        if klb.spec.endpoint_slices == wanted || klb.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let resolved = |slices: &[LbEndpointSlice]| -> Vec<Vec<u16>> {
            klb.spec.ports.iter().map(|p| target_ports(p, slices)).collect()
        };
        let renumbered = resolved(&klb.spec.endpoint_slices) != resolved(&wanted);
        let patch = json!({ "spec": { "endpointSlices": wanted } });
        let klb = api
            .patch(&service, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        // A listener ACL opens a named target port on the numbers the slices give it (none before a
        // Service's first ready backend: the listener stays closed): those are written now, not at
        // the Service's next event.
        if renumbered && self.ctx.config.octavia_defaults.enforce_sg_rules {
            self.services.refresh_listener_acls(&klb).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl ResourceEventHandler for EndpointsHandler {
    type Object = EndpointSlice;

    fn name(&self) -> &'static str {
        "endpoints"
    }

    /// A deleted slice leads to its Service through its `kubernetes.io/service-name` label.
    fn keeps_last_state(&self) -> bool {
        true
    }

    async fn on_present(&self, slice: &EndpointSlice) -> Result<(), Error> {
        self.sync(slice).await
    }

    async fn on_deleted(&self, slice: &EndpointSlice) -> Result<(), Error> {
        self.sync(slice).await
    }
}
