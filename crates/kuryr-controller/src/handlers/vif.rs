//! `vif` handler (Pods): the pod side of the split between pods and their ports (KuryrPort). For every scheduled, non-hostNetwork pod
//! it adds the pod finalizer and creates the pod's KuryrPort (owner reference, finalizer, node label);
//! when the pod completes or is deleted it deletes the KuryrPort, whose handler releases the ports.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use kuryr_crds::names::{annotations, finalizers, labels};
use kuryr_crds::{KuryrPort, KuryrPortSpec};

use crate::context::Context;
use crate::error::{Error, is_not_found};
use crate::k8s::{add_finalizer, remove_finalizer};
use crate::locked::Locked;
use crate::pipeline::{ResourceEventHandler, Settled};

pub struct VifHandler {
    ctx: Arc<Context>,
    /// Pods whose KuryrPort this handler saw or made, at the version its finalizer left them.
    settled: Settled,
}

impl VifHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            ctx,
            settled: Settled::default(),
        }
    }

    fn kps(&self, ns: &str) -> Api<KuryrPort> {
        Api::namespaced(self.ctx.kube.clone(), ns)
    }

    /// Creates the pod's KuryrPort (owner reference, finalizer, node label); once created,
    /// records `current` (the pod as our finalizer left it) as settled and hands it to the
    /// `kuryrport` handler, which would otherwise read it again.
    async fn create_kuryrport(&self, pod: &Pod, current: &Pod) -> Result<Created, Error> {
        let ns = pod.namespace().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let owner = pod.controller_owner_ref(&()).map(|mut o| {
            // The KuryrPort must not block the pod's deletion: we release explicitly.
            o.block_owner_deletion = Some(false);
            o
        });
        let kp = KuryrPort {
            metadata: ObjectMeta {
                name: Some(pod.name_any()),
                namespace: Some(ns.clone()),
                labels: Some(BTreeMap::from([(labels::NODE_NAME.to_string(), node.clone())])),
                finalizers: Some(vec![finalizers::KURYRPORT.to_string()]),
                owner_references: owner.map(|o| vec![o]),
                ..Default::default()
            },
            spec: KuryrPortSpec {
                pod_uid: pod.uid().unwrap_or_default(),
                pod_node_name: node,
                pod_static: is_static(pod),
            },
            status: None,
        };
        // Handed over before the create: the KuryrPort's event may reach its handler before the
        // create's answer reaches this one. One in the way (409) may be this pod's: it stays.
        self.ctx.pod_handoff.put(current);
        let created = self.kps(&ns).create(&PostParams::default(), &kp).await;
        if created
            .as_ref()
            .is_err_and(|e| !matches!(e, kube::Error::Api(s) if s.code == 409))
        {
            self.ctx.pod_handoff.take(&kp.spec.pod_uid);
        }
        match created {
            Ok(_) => {
                self.settled.settle(current);
                Ok(Created::Done)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Created::Exists),
            Err(e) if crate::k8s::is_namespace_terminating(&e) => Ok(Created::Done),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the pod's KuryrPort; true when it is already gone.
    async fn delete_kuryrport(&self, pod: &Pod) -> Result<bool, Error> {
        let ns = pod.namespace().unwrap_or_default();
        let kps = self.kps(&ns);
        let uid = pod.uid().unwrap_or_default();
        let kept = self.ctx.kept_kuryrports.locked().contains(&uid);
        let result = if kept {
            // Deleted before, while the pod ran: its finalizer kept the ports for the pod. A
            // delete of an object already being deleted changes nothing, so no event would run
            // that finalizer again: the annotation does.
            let poke = serde_json::json!({"metadata": {"annotations": {annotations::POD_DELETED: "true"}}});
            kps.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&poke))
                .await
                .map(|_| ())
        } else {
            kps.delete(&pod.name_any(), &DeleteParams::background())
                .await
                .map(|_| ())
        };
        let done = match result {
            Ok(()) => false,
            Err(e) if is_not_found(&e) => true,
            // Still kept: the pod's next attempt asks again.
            Err(e) => return Err(e.into()),
        };
        if kept {
            self.ctx.kept_kuryrports.locked().remove(&uid);
        }
        Ok(done)
    }
}

/// What a create of a KuryrPort came to.
enum Created {
    /// Created, or not needed: the namespace is being deleted.
    Done,
    /// One of that name is there already.
    Exists,
}

/// Pods kuryr never wires: host network ones and those not scheduled yet.
pub fn should_ignore(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.host_network).unwrap_or(false)
        || spec.and_then(|s| s.node_name.as_deref()).unwrap_or("").is_empty()
}

/// Succeeded/Failed pods keep no network: their ports go back right away.
pub fn is_completed(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Static (mirror) pods are created by the kubelet, not through the API; they cannot carry our
/// finalizer reliably.
pub fn is_static(pod: &Pod) -> bool {
    pod.annotations()
        .get("kubernetes.io/config.source")
        .is_some_and(|s| s != "api")
        || pod.annotations().contains_key("kubernetes.io/config.mirror")
}

#[async_trait]
impl ResourceEventHandler for VifHandler {
    type Object = Pod;

    fn name(&self) -> &'static str {
        "vif"
    }

    fn settled(&self) -> Option<&Settled> {
        Some(&self.settled)
    }

    async fn on_present(&self, pod: &Pod) -> Result<(), Error> {
        if should_ignore(pod) {
            return Ok(());
        }
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let uid = pod.uid().unwrap_or_default();
        if is_completed(pod) {
            return self.on_finalize(pod).await;
        }
        let static_pod = is_static(pod);
        // A pod that did not carry our finalizer has not been seen by this handler: its
        // KuryrPort is almost surely missing, so it is created without looking first (a
        // conflict then reads the one in the way). Pods seen before look first, so that
        // re-sends of wired pods cost a read, not a refused create.
        let unseen = !static_pod && !pod.finalizers().iter().any(|f| f == finalizers::POD);
        // The pod and each request's future are boxed: a future is as large as its largest step,
        // and a burst holds a thousand of these at once (9.2 KB each unboxed).
        let current = Box::new(if static_pod {
            pod.clone()
        } else {
            Box::pin(add_finalizer(&self.ctx.kube, pod, finalizers::POD)).await?
        });
        // The write answers with the pod as it is now: one that completed since the event (the
        // kubelet refused it at admission) gets no port. That answer's event is skipped as our
        // own write, so it is decided on here.
        if is_completed(&current) {
            return self.on_finalize(&current).await;
        }
        let found = if unseen {
            match Box::pin(self.create_kuryrport(pod, &current)).await? {
                // Whose is the one in the way?
                Created::Exists => Box::pin(self.kps(&ns).get_opt(&name)).await?,
                Created::Done => return Ok(()),
            }
        } else {
            Box::pin(self.kps(&ns).get_opt(&name)).await?
        };
        match found {
            Some(kp) if kp.spec.pod_uid == uid => {
                self.settled.settle(&*current);
                Ok(())
            }
            Some(kp) => {
                // A re-created pod with the old pod's name: the old KuryrPort (and its ports) must go
                // first, so the new pod never gets the old port.
                if kp.meta().deletion_timestamp.is_none() {
                    match Box::pin(self.kps(&ns).delete(&name, &DeleteParams::background())).await {
                        // Released meanwhile: the retry below creates the new pod's.
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        other => {
                            other?;
                        }
                    }
                }
                Err(Error::not_ready(format!(
                    "KuryrPort {ns}/{name} of a previous pod (uid {}) is being released",
                    kp.spec.pod_uid
                )))
            }
            None => {
                // One created meanwhile (a replayed event): the next event re-checks its uid.
                Box::pin(self.create_kuryrport(pod, &current)).await?;
                Ok(())
            }
        }
    }

    async fn on_finalize(&self, pod: &Pod) -> Result<(), Error> {
        // The KuryrPort handler removes the pod finalizer after releasing the ports; if there is no
        // KuryrPort (never wired, or already released) it is ours to remove.
        if self.delete_kuryrport(pod).await? {
            remove_finalizer(&self.ctx.kube, pod, finalizers::POD).await?;
        }
        Ok(())
    }
}
