//! `kuryrport` handler: load the pod (handed over by the `vif` handler, or read) -> wire its
//! interfaces (`crate::wiring`) -> record them in `status.vifs` -> activate them; on finalize,
//! release everything the KuryrPort records and whatever a crash created without recording it.
//!
//! Progress is written after each step (VIFs acquired, then activated), so a crash between steps
//! resumes from the stored state instead of creating ports twice.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use kuryr_crds::KuryrPort;
use kuryr_crds::names::annotations::NPWG_NETWORK_STATUS;
use kuryr_crds::names::finalizers;
use serde_json::json;

use crate::context::Context;
use crate::drivers::PodRef;
use crate::error::{Error, is_not_found};
use crate::handlers::vif::is_completed;
use crate::k8s::{publish_event, publish_event_on, remove_finalizer, surface_user_error};
use crate::locked::Locked;
use crate::pipeline::{ResourceEventHandler, Settled, Version};
use crate::wiring::{self, DriverSource, RecordedVif, record};

pub struct KuryrPortHandler {
    ctx: Arc<Context>,
    /// KuryrPorts wired and active, at the version this handler's last status write left them.
    settled: Settled,
    /// KuryrPorts (uids) whose wiring failed at least once: a port may have been created for
    /// them and not recorded (a create whose answer was lost).
    failed: Mutex<HashSet<String>>,
}

impl KuryrPortHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            ctx,
            settled: Settled::default(),
            failed: Mutex::default(),
        }
    }

    fn failed(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.failed.locked()
    }

    /// Whether a port created for `kp` may be unrecorded: unless this leadership term saw the
    /// KuryrPort from its creation and every pass over it succeeded, a crash (this replica's or
    /// an earlier leader's) may have left one. Only then are the pod's tagged ports listed at
    /// finalization: a list filtered by tags costs the server a look at every port, and a pod
    /// deletion should not cost that.
    fn may_have_unrecorded(&self, kp: &KuryrPort) -> bool {
        let created_within = kp
            .metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|t| self.ctx.term.created_within(t.0));
        !created_within || kp.uid().is_some_and(|uid| self.failed().contains(&uid))
    }

    /// The KuryrPort's pod, or `None` when it is gone or was re-created (then this KuryrPort is
    /// stale and deleted, which releases its ports through finalize). The pod the `vif` handler
    /// handed over with a new KuryrPort is used as read.
    async fn live_pod(&self, kp: &KuryrPort) -> Result<Option<Box<Pod>>, Error> {
        if let Some(pod) = self.ctx.pod_handoff.take(&kp.spec.pod_uid) {
            return Ok(Some(pod));
        }
        let ns = kp.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.ctx.kube.clone(), &ns);
        match pods.get_opt(&kp.name_any()).await? {
            Some(p) if p.uid().as_deref() == Some(kp.spec.pod_uid.as_str()) => Ok(Some(Box::new(p))),
            _ => {
                let api: Api<KuryrPort> = Api::namespaced(self.ctx.kube.clone(), &ns);
                match api.delete(&kp.name_any(), &DeleteParams::background()).await {
                    Ok(_) => Ok(None),
                    Err(e) if is_not_found(&e) => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    async fn write_status(&self, kp: &KuryrPort, vifs: &[RecordedVif]) -> Result<Option<Version>, Error> {
        self.patch_status(kp, vifs, None).await
    }

    /// Main resource, not /status: upstream's CRDs have no status subresource. With
    /// `resource_version` the write only applies to that version of the object (409 otherwise).
    /// Returns the version the write left; only that is read of the answer (the VIFs written
    /// are most of its bytes).
    async fn patch_status(
        &self,
        kp: &KuryrPort,
        vifs: &[RecordedVif],
        resource_version: Option<&str>,
    ) -> Result<Option<Version>, Error> {
        let ns = kp.namespace().unwrap_or_default();
        let mut patch = json!({"status": record::to_status(vifs)?});
        if let Some(rv) = resource_version {
            patch["metadata"] = json!({"resourceVersion": rv});
        }
        let request = kube::core::Request::new(KuryrPort::url_path(&(), Some(&ns)))
            .patch(&kp.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .map_err(kube::Error::BuildRequest)?;
        let written: Written = self.ctx.kube.request(request).await?;
        Ok(written.metadata.version())
    }

    /// `k8s.v1.cni.cncf.io/network-status` on the pod, when multi-VIF drivers are enabled and the
    /// value changed.
    async fn write_network_status(&self, pod: &PodSeen<'_>, vifs: &[RecordedVif]) -> Result<(), Error> {
        if self.ctx.drivers.multi_vif.is_empty() {
            return Ok(());
        }
        let value = record::network_status(vifs)?;
        if pod.network_status.as_ref() == Some(&value) {
            return Ok(());
        }
        let pods: Api<Pod> = Api::namespaced(
            self.ctx.kube.clone(),
            pod.reference.namespace.as_deref().unwrap_or_default(),
        );
        let patch = json!({"metadata": {"annotations": {NPWG_NETWORK_STATUS: value}}});
        let name = pod.reference.name.as_deref().unwrap_or_default();
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Returns the versions of the KuryrPort its status writes left, the last first (`None`:
    /// nothing written).
    ///
    /// The steps around the wait for ACTIVE are boxed: a future is as large as its largest
    /// step, and a burst holds a thousand of these waiting; unboxed, the plan and the Kubernetes
    /// calls made each waiting pass 8.7 KB instead of what the wait itself needs.
    ///
    /// The pod is given up once its interfaces are planned, before the ports are acquired (in a
    /// burst, the wait for a pool's refill): what the later steps need of it is kept apart
    /// ([`PodSeen`]).
    async fn wire(
        &self,
        kp: &KuryrPort,
        pod: Box<Pod>,
        reference: &ObjectReference,
    ) -> Result<Option<Version>, Error> {
        let source = DriverSource::new(&self.ctx, kp);
        let mut written = None;
        let mut vifs = wiring::recorded_vifs(kp);
        let started = Instant::now();
        let planned = if vifs.is_empty() {
            let podref = PodRef::from_pod(&pod);
            let plan = Box::pin(wiring::plan(&self.ctx, &pod, &podref)).await?;
            Some((podref, plan))
        } else {
            None
        };
        let Pod { metadata: meta, .. } = *pod;
        let pod = PodSeen {
            reference,
            created: meta.creation_timestamp.map(|t| t.0),
            network_status: meta.annotations.and_then(|mut a| a.remove(NPWG_NETWORK_STATUS)),
        };
        if let Some((podref, plan)) = planned {
            vifs = match Box::pin(wiring::acquire_all(&source, &podref, &plan)).await {
                Ok(vifs) => vifs,
                // A namespace group the driver had cached was deleted meanwhile (another
                // replica's sweep, an operator): forgotten, and made again by the retry.
                Err(e) => match &self.ctx.drivers.namespace_groups {
                    Some(groups)
                        if e.neutron()
                            .is_some_and(|n| n.is_kind(&kuryr_neutron::ErrorKind::SecurityGroupNotFound)) =>
                    {
                        groups.forget_all().await;
                        return Err(Error::not_ready(format!(
                            "a security group of the pod is gone: {e}"
                        )));
                    }
                    _ => return Err(e),
                },
            };
            self.ctx.metrics.stage("request", started.elapsed());
            // Recorded only over the copy that showed no VIFs: a stale copy (an event queued
            // before an earlier attempt recorded its VIFs) must not replace the recorded ports,
            // which would leave them taken from their pool by no KuryrPort.
            let version = kp.metadata.resource_version.as_deref();
            match Box::pin(self.patch_status(kp, &vifs, version)).await {
                Ok(v) => written = v,
                Err(e) => {
                    // Could not record the ports: give them back rather than leak them. A 409 wrote
                    // nothing; any other failure may have been committed before its answer was lost,
                    // and a recorded port given back would be another pod's while this one used it.
                    let conflict = matches!(&e, Error::Kube(kube::Error::Api(s)) if s.code == 409);
                    let unrecorded = if conflict {
                        vifs
                    } else {
                        self.unrecorded(kp, vifs).await
                    };
                    if let Err(release) = wiring::release_all(&source, &unrecorded).await {
                        tracing::warn!(kuryrport = %kp.name_any(), error = %release, "giving back unrecorded ports failed");
                    }
                    if conflict {
                        return Err(Error::not_ready(format!(
                            "KuryrPort {} changed while its VIFs were acquired; retrying with its current state",
                            kp.name_any()
                        )));
                    }
                    return Err(e);
                }
            }
        }
        if vifs.iter().any(|v| !v.vif.active()) {
            let started = Instant::now();
            let activation = wiring::activate_all(&source, &mut vifs).await;
            if activation.changed {
                let activated = Box::pin(self.write_status(kp, &vifs)).await?;
                written = Version::then(written, activated);
            }
            if let Some(e) = activation.pending {
                Box::pin(self.report_slow_activation(kp, pod.reference, &e)).await;
                return Err(e);
            }
            self.ctx.metrics.stage("activate", started.elapsed());
            if let Some(age) = pod.created.and_then(since) {
                self.ctx.metrics.stage("total", age);
            }
        }
        Box::pin(self.write_network_status(&pod, &vifs)).await?;
        Ok(written)
    }

    /// Which of `vifs` the KuryrPort, read again, does not record. Unreadable: none are given
    /// back (ports held and not recorded are reclaimed by the pools' books and the orphan sweep
    /// after their grace; one given back while recorded would be handed to another pod).
    async fn unrecorded(&self, kp: &KuryrPort, vifs: Vec<RecordedVif>) -> Vec<RecordedVif> {
        let api: Api<KuryrPort> = Api::namespaced(self.ctx.kube.clone(), &kp.namespace().unwrap_or_default());
        match api.get_opt(&kp.name_any()).await {
            Ok(Some(now)) if now.uid() == kp.uid() => {
                let recorded: Vec<String> = wiring::recorded_vifs(&now)
                    .iter()
                    .map(|v| v.vif.id().to_string())
                    .collect();
                vifs.into_iter()
                    .filter(|v| !recorded.iter().any(|id| id == v.vif.id()))
                    .collect()
            }
            Ok(_) => vifs,
            Err(e) => {
                tracing::warn!(kuryrport = %kp.name_any(), error = %e, "cannot tell which ports the failed write recorded: none given back");
                Vec::new()
            }
        }
    }

    /// A port that never comes up (agent down, binding failed) is shown to the user once it has
    /// taken longer than the CNI daemon waits for it.
    async fn report_slow_activation(&self, kp: &KuryrPort, pod: &ObjectReference, e: &Error) {
        let timeout = self.ctx.config.cni_daemon.vif_annotation_timeout;
        if let Some(waited) = kp.metadata.creation_timestamp.as_ref().and_then(|t| since(t.0))
            && waited.as_secs() >= timeout
        {
            let msg = format!("VIFs not active after {}s: {e}", waited.as_secs());
            publish_event_on(&self.ctx.events, pod, true, "VIFActivationTimeout", &msg).await;
        }
    }
}

/// What the steps after the ports' acquisition need of the pod, kept while they wait for ACTIVE
/// instead of the whole pod.
struct PodSeen<'a> {
    reference: &'a ObjectReference,
    created: Option<Timestamp>,
    /// Its `k8s.v1.cni.cncf.io/network-status` annotation.
    network_status: Option<String>,
}

/// What is read of the answer to a status write.
#[derive(serde::Deserialize)]
struct Written {
    metadata: WrittenMeta,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    uid: Option<String>,
    resource_version: Option<String>,
}

impl WrittenMeta {
    fn version(self) -> Option<Version> {
        Some(Version::new(self.uid?, self.resource_version?))
    }
}

/// Time since `t`.
fn since(t: Timestamp) -> Option<Duration> {
    Duration::try_from(Timestamp::now().duration_since(t)).ok()
}

#[async_trait]
impl ResourceEventHandler for KuryrPortHandler {
    type Object = KuryrPort;

    fn name(&self) -> &'static str {
        "kuryrport"
    }

    fn settled(&self) -> Option<&Settled> {
        Some(&self.settled)
    }

    /// A KuryrPort being deleted whose status cannot be parsed: the interfaces that can be read
    /// are released as usual; the others' ports are found by the pod's ownership tags, as after a
    /// crash (a pool's port among them goes back to its pool at the next recovery, which adopts
    /// ports no KuryrPort records). Without this its pod stayed Terminating.
    const SALVAGES: bool = true;

    fn salvage(&self, mut raw: serde_json::Value) -> Option<KuryrPort> {
        if let Some(vifs) = raw.pointer_mut("/status/vifs").and_then(|v| v.as_object_mut()) {
            vifs.retain(|_, vif| serde_json::from_value::<kuryr_crds::KuryrPortVif>(vif.clone()).is_ok());
        }
        let kp = serde_json::from_value::<KuryrPort>(raw.clone())
            .ok()
            .or_else(|| {
                raw.as_object_mut()?.remove("status");
                serde_json::from_value::<KuryrPort>(raw).ok()
            })?;
        // What was dropped may have ports: the finalization looks for them by tag.
        if let Some(uid) = kp.uid() {
            self.failed().insert(uid);
        }
        Some(kp)
    }

    async fn on_present(&self, kp: &KuryrPort) -> Result<(), Error> {
        let Some(pod) = Box::pin(self.live_pod(kp)).await? else {
            return Ok(());
        };
        if pod.meta().deletion_timestamp.is_some() {
            return Ok(());
        }
        let reference = pod.object_ref(&());
        let result = self.wire(kp, pod, &reference).await.map(|written| match written {
            Some(v) => self.settled.settle_version(v),
            None => self.settled.settle(kp),
        });
        if result.is_err()
            && let Some(uid) = kp.uid()
        {
            self.failed().insert(uid);
        }
        // A user's mistake is told on the pod and logged at WARN; only what retrying may mend
        // goes on to the Retry handler.
        Box::pin(surface_user_error(&self.ctx.events, &reference, result)).await
    }

    async fn on_finalize(&self, kp: &KuryrPort) -> Result<(), Error> {
        let pods: Api<Pod> = Api::namespaced(self.ctx.kube.clone(), &kp.namespace().unwrap_or_default());
        let pod = pods
            .get_opt(&kp.name_any())
            .await?
            .filter(|p| p.uid().as_deref() == Some(kp.spec.pod_uid.as_str()));
        if let Some(pod) = &pod
            && pod.metadata.deletion_timestamp.is_none()
            && !is_completed(pod)
        {
            // Deleted by hand (or by a namespace's deletion before its pods) while the pod runs on
            // its ports: released now, they would be another pod's, address and all, while this
            // one still used them. They stay, and so does the finalizer, until the pod goes
            // (upstream's rule); the vif handler then runs this again.
            tracing::warn!(pod = %format!("{}/{}", kp.namespace().unwrap_or_default(), kp.name_any()),
                "KuryrPort deleted while its pod runs: its ports are kept until the pod is deleted");
            publish_event(
                &self.ctx.events,
                pod,
                true,
                "NoKuryrPort",
                "KuryrPort was deleted while the pod runs (KuryrPorts are kuryr's own): its ports are kept until the pod is deleted",
            )
            .await;
            self.ctx.kept_kuryrports.locked().insert(kp.spec.pod_uid.clone());
            return Ok(());
        }
        self.ctx.kept_kuryrports.locked().remove(&kp.spec.pod_uid);
        let vifs = wiring::recorded_vifs(kp);
        wiring::release_all(&DriverSource::new(&self.ctx, kp), &vifs).await?;
        if self.may_have_unrecorded(kp) {
            let drivers = self.ctx.drivers.pod_vif_drivers();
            wiring::unrecorded::release_unrecorded(&self.ctx, &drivers, kp, &vifs).await?;
            if let Some(pod) = &pod {
                wiring::unrecorded::restore_unrecorded_claims(&self.ctx, pod, &vifs).await?;
            }
        }
        remove_finalizer(&self.ctx.kube, kp, finalizers::KURYRPORT).await?;
        if let Some(uid) = kp.uid() {
            self.failed().remove(&uid);
        }
        if let Some(pod) = &pod {
            remove_finalizer(&self.ctx.kube, pod, finalizers::POD).await?;
        }
        Ok(())
    }
}
