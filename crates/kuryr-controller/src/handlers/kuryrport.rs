//! `kuryrport` handler: asks the drivers for the pod's VIFs, stores them in `status.vifs` (the
//! upstream VIF JSON, plus where each came from), activates them, and releases them on finalize.
//!
//! Additional interfaces (`[kubernetes] multi_vif_drivers`) are planned and validated before any
//! port is made, then acquired together with eth0: if one fails, all of the pod's ports are
//! given back, so a pod never runs half-wired. Once every VIF is active the pod gets its
//! `k8s.v1.cni.cncf.io/network-status` annotation.
//!
//! Progress is written after each step (VIFs requested, then activated), so a crash between steps
//! resumes from the stored state instead of creating ports twice; ports created but never recorded
//! carry the pod's ownership tags, by which finalize finds and deletes them (with pools, the
//! orphan sweep also collects them).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use kuryr_crds::names::annotations::NPWG_NETWORK_STATUS;
use kuryr_crds::names::{DEFAULT_IFNAME, finalizers};
use kuryr_crds::{KuryrPort, KuryrPortStatus, KuryrPortVif, Vif};
use serde_json::json;

use crate::context::Context;
use crate::drivers::multi_vif::{self, MultiVifRecord, PodNetworking, RECORD_FIELD};
use crate::drivers::pool::{ORIGIN_FIELD, VifOrigin, origin_for};
use crate::drivers::{Drivers, PodRef, PortSpec};
use crate::error::{Error, is_not_found};
use crate::k8s::remove_finalizer;
use crate::pipeline::ResourceEventHandler;

pub struct KuryrPortHandler {
    ctx: Arc<Context>,
    drivers: Arc<Drivers>,
}

/// The VIFs recorded in a KuryrPort, with their origin.
pub struct RecordedVif {
    pub ifname: String,
    pub default: bool,
    pub vif: Vif,
    pub origin: Option<VifOrigin>,
    /// Set on additional interfaces: how they go back and which network they are.
    pub multi: Option<MultiVifRecord>,
}

pub fn recorded_vifs(kp: &KuryrPort) -> Vec<RecordedVif> {
    kp.status
        .as_ref()
        .map(|s| {
            s.vifs
                .iter()
                .map(|(ifname, v)| RecordedVif {
                    ifname: ifname.clone(),
                    default: v.default,
                    vif: v.vif.clone(),
                    origin: v
                        .extra
                        .get(ORIGIN_FIELD)
                        .and_then(|o| serde_json::from_value(o.clone()).ok()),
                    multi: v
                        .extra
                        .get(RECORD_FIELD)
                        .and_then(|o| serde_json::from_value(o.clone()).ok()),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn to_status(vifs: &[RecordedVif]) -> Result<KuryrPortStatus, Error> {
    let mut map = BTreeMap::new();
    for r in vifs {
        let mut entry = KuryrPortVif::new(r.default, r.vif.clone());
        if let Some(o) = &r.origin {
            let v = serde_json::to_value(o).map_err(|e| Error::Config(e.to_string()))?;
            entry.extra.insert(ORIGIN_FIELD.to_string(), v);
        }
        if let Some(m) = &r.multi {
            let v = serde_json::to_value(m).map_err(|e| Error::Config(e.to_string()))?;
            entry.extra.insert(RECORD_FIELD.to_string(), v);
        }
        map.insert(r.ifname.clone(), entry);
    }
    Ok(KuryrPortStatus { vifs: map })
}

impl KuryrPortHandler {
    pub fn new(ctx: Arc<Context>, drivers: Arc<Drivers>) -> Self {
        Self { ctx, drivers }
    }

    async fn write_status(&self, kp: &KuryrPort, vifs: &[RecordedVif]) -> Result<(), Error> {
        let status = to_status(vifs)?;
        let api: Api<KuryrPort> = Api::namespaced(self.ctx.kube.clone(), &kp.namespace().unwrap_or_default());
        // Main resource, not /status: upstream's CRDs have no status subresource (see kuryr-crds).
        let patch = json!({"status": status});
        api.patch(&kp.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Resolves project, network and security groups of the pod's default interface.
    async fn default_spec(&self, ns: &str) -> Result<PortSpec, Error> {
        let project = self.drivers.project.project_for_namespace(ns).await?;
        let deployment = self.ctx.bind(&project, ns).await?;
        let network = self
            .drivers
            .subnets
            .network_for_namespace(&deployment, ns)
            .await?;
        let sgs = self
            .drivers
            .security_groups
            .security_groups(&deployment, &project, ns)
            .await?;
        Ok(PortSpec::new(deployment, project, network, sgs))
    }

    /// Origin of a VIF recorded without one (a KuryrPort written by upstream kuryr-kubernetes).
    async fn infer_origin(&self, kp: &KuryrPort, vif: &Vif) -> Result<VifOrigin, Error> {
        let deployment = crate::openstack::DEFAULT_DEPLOYMENT;
        let host = self
            .drivers
            .vif
            .pool_host(deployment, &kp.spec.pod_node_name)
            .await?;
        let network_id = vif.network().map(|n| n.id.clone()).unwrap_or_default();
        let info = Arc::new(crate::drivers::NetworkInfo {
            id: network_id,
            name: String::new(),
            mtu: None,
            subnets: vec![],
        });
        Ok(origin_for(
            self.drivers.vif.as_ref(),
            &PortSpec::new(deployment, "", info, vec![]),
            &host,
        ))
    }

    /// Writes `k8s.v1.cni.cncf.io/network-status` on the pod (every interface, eth0 first) when
    /// multi-VIF drivers are enabled and the value changed.
    async fn write_network_status(&self, pod: &Pod, vifs: &[RecordedVif]) -> Result<(), Error> {
        if self.drivers.multi_vif.is_empty() {
            return Ok(());
        }
        let mut ordered: Vec<&RecordedVif> = vifs.iter().collect();
        ordered.sort_by_key(|r| (!r.default, r.ifname.clone()));
        let status: Vec<serde_json::Value> = ordered
            .iter()
            .map(|r| {
                let network = r
                    .multi
                    .as_ref()
                    .map_or(multi_vif::DEFAULT_NETWORK_NAME, |m| m.network.as_str());
                multi_vif::network_status_entry(network, &r.ifname, &r.vif, r.default)
            })
            .collect();
        let value = serde_json::to_string_pretty(&status).map_err(|e| Error::Config(e.to_string()))?;
        if pod.annotations().get(NPWG_NETWORK_STATUS) == Some(&value) {
            return Ok(());
        }
        let pods: Api<Pod> = Api::namespaced(self.ctx.kube.clone(), &pod.namespace().unwrap_or_default());
        let patch = json!({"metadata": {"annotations": {NPWG_NETWORK_STATUS: value}}});
        pods.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn pod_event(&self, pod: &Pod, err: &Error) {
        if err.is_user_visible() {
            self.ctx
                .events
                .publish(pod, true, err.label(), &err.to_string())
                .await;
        }
    }

    async fn wire(&self, kp: &KuryrPort, pod: &Pod) -> Result<(), Error> {
        let ns = kp.namespace().unwrap_or_default();
        let mut vifs = recorded_vifs(kp);
        if vifs.is_empty() {
            let started = Instant::now();
            let spec = self.default_spec(&ns).await?;
            let podref = PodRef::from_pod(pod);
            // Phase 1 for the additional interfaces: bad input stops here, before any port.
            let plans = multi_vif::plan_all(
                &self.drivers.multi_vif,
                &PodNetworking {
                    pod,
                    podref: &podref,
                    default: &spec,
                    vif_driver: self.drivers.vif.name(),
                },
                &self.ctx.config.kubernetes.additional_ifname_prefix,
            )
            .await?;
            let (vif, origin) = self.drivers.pool.request_vif(&podref, &spec).await?;
            vifs.push(RecordedVif {
                ifname: DEFAULT_IFNAME.to_string(),
                default: true,
                vif,
                origin: Some(origin),
                multi: None,
            });
            match multi_vif::acquire_all(&self.ctx, &self.drivers, &podref, plans).await {
                Ok(extra) => vifs.extend(extra.into_iter().map(|a| RecordedVif {
                    ifname: a.ifname,
                    default: false,
                    vif: a.vif,
                    origin: Some(a.origin),
                    multi: Some(a.record),
                })),
                Err(e) => {
                    // acquire_all rolled back the extra ones; eth0 goes back too.
                    self.release_all(kp, &vifs).await;
                    return Err(e);
                }
            }
            self.ctx.metrics.stage("request", started.elapsed());
            if let Err(e) = self.write_status(kp, &vifs).await {
                // Could not record the ports: give them back rather than leak them.
                self.release_all(kp, &vifs).await;
                return Err(e);
            }
        }
        if vifs.iter().all(|v| v.vif.active()) {
            return self.write_network_status(pod, &vifs).await;
        }
        let started = Instant::now();
        let mut changed = false;
        let mut pending = None;
        for r in &mut vifs {
            if r.vif.active() {
                continue;
            }
            if r.multi.is_some() && multi_vif::activates_immediately(&r.vif) {
                r.vif.base_mut().active = true;
                changed = true;
                continue;
            }
            let origin = match &r.origin {
                Some(o) => o.clone(),
                None => self.infer_origin(kp, &r.vif).await?,
            };
            match self.drivers.pool.activate_vif(&origin, &mut r.vif).await {
                Ok(()) => changed = true,
                Err(e) => pending = Some(e),
            }
        }
        if changed {
            self.write_status(kp, &vifs).await?;
        }
        if let Some(e) = pending {
            // The user sees a port that never comes up (agent down, binding failed) once it has
            // taken longer than the CNI daemon waits for it.
            let timeout = self.ctx.config.cni_daemon.vif_annotation_timeout;
            if let Some(since) = kp.meta().creation_timestamp.as_ref()
                && let Ok(age) =
                    std::time::Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(since.0))
                && age.as_secs() >= timeout
            {
                let msg = format!("VIFs not active after {}s: {e}", age.as_secs());
                self.ctx
                    .events
                    .publish(pod, true, "VIFActivationTimeout", &msg)
                    .await;
            }
            return Err(e);
        }
        self.ctx.metrics.stage("activate", started.elapsed());
        self.write_network_status(pod, &vifs).await?;
        if let Some(created) = pod.meta().creation_timestamp.as_ref() {
            let age = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
            if let Ok(d) = std::time::Duration::try_from(age) {
                self.ctx.metrics.stage("total", d);
            }
        }
        Ok(())
    }

    /// Deletes the ports a crash created for this pod without recording them in its KuryrPort
    /// (between the Neutron create and the status write). They carry the pod's ownership tags
    /// (subports have no device id, so the tags are what finds them); pool ports are left to
    /// their pool's recovery and anything recorded was released by [`Self::release_all`].
    async fn release_unrecorded(&self, kp: &KuryrPort, recorded: &[RecordedVif]) -> Result<(), Error> {
        use kuryr_crds::names::device_owner::TRUNK_SUBPORT;
        use kuryr_crds::names::neutron as tags;
        let pod_tag = tags::pod_tag(&kp.namespace().unwrap_or_default(), &kp.name_any());
        let cluster_tag = tags::cluster_tag(&self.ctx.cluster_id);
        let known: std::collections::HashSet<&str> = recorded.iter().map(|r| r.vif.id()).collect();
        for deployment in self.ctx.deployments.names() {
            let client = self.ctx.deployments.client(deployment)?;
            let filter = kuryr_neutron::ListFilter::new().tags([
                tags::TAG_MANAGED,
                cluster_tag.as_str(),
                pod_tag.as_str(),
            ]);
            let stray: Vec<_> = client
                .list_ports(&filter)
                .await?
                .into_iter()
                .filter(|p| !known.contains(p.id.as_str()))
                .filter(|p| !p.tags.iter().any(|t| t.starts_with(tags::TAG_POOL_PREFIX)))
                // A name reused by a newer pod is not ours to touch.
                .filter(|p| p.device_id.is_empty() || p.device_id == kp.spec.pod_uid)
                .collect();
            if stray.is_empty() {
                continue;
            }
            let trunks = if stray.iter().any(|p| p.device_owner == TRUNK_SUBPORT) {
                crate::pool::sweep::trunk_of_subports(client).await?
            } else {
                Default::default()
            };
            for p in stray {
                let trunk = trunks.get(&p.id).map(String::as_str);
                crate::pool::sweep::delete_port(client, &p.id, trunk).await?;
                tracing::info!(port = %p.id, deployment, kuryrport = %kp.name_any(),
                    "deleted a port created for the pod but never recorded (crash mid-request)");
            }
        }
        Ok(())
    }

    /// Releases every VIF; errors are collected so one failure never strands the others.
    async fn release_all(&self, kp: &KuryrPort, vifs: &[RecordedVif]) -> Option<Error> {
        let mut first = None;
        for r in vifs {
            let origin = match &r.origin {
                Some(o) => o.clone(),
                None => match self.infer_origin(kp, &r.vif).await {
                    Ok(o) => o,
                    Err(e) => {
                        first.get_or_insert(e);
                        continue;
                    }
                },
            };
            let released = match &r.multi {
                Some(m) => multi_vif::release(&self.ctx, &self.drivers, &r.vif, &origin, m).await,
                None => self.drivers.pool.release_vif(&r.vif, &origin).await,
            };
            if let Err(e) = released {
                tracing::warn!(port = r.vif.id(), error = %e, "releasing VIF failed");
                first.get_or_insert(e);
            }
        }
        first
    }
}

#[async_trait]
impl ResourceEventHandler for KuryrPortHandler {
    type Object = KuryrPort;

    fn name(&self) -> &'static str {
        "kuryrport"
    }

    async fn on_present(&self, kp: &KuryrPort) -> Result<(), Error> {
        let ns = kp.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.ctx.kube.clone(), &ns);
        let api: Api<KuryrPort> = Api::namespaced(self.ctx.kube.clone(), &ns);
        let pod = match pods.get_opt(&kp.name_any()).await? {
            Some(p) if p.uid().as_deref() == Some(kp.spec.pod_uid.as_str()) => p,
            // The pod is gone or was re-created: this KuryrPort is stale, release it.
            _ => {
                match api.delete(&kp.name_any(), &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
                return Ok(());
            }
        };
        if pod.meta().deletion_timestamp.is_some() {
            return Ok(());
        }
        match self.wire(kp, &pod).await {
            Ok(()) => Ok(()),
            Err(e) => {
                self.pod_event(&pod, &e).await;
                Err(e)
            }
        }
    }

    async fn on_finalize(&self, kp: &KuryrPort) -> Result<(), Error> {
        let vifs = recorded_vifs(kp);
        if let Some(e) = self.release_all(kp, &vifs).await {
            return Err(e);
        }
        self.release_unrecorded(kp, &vifs).await?;
        remove_finalizer(&self.ctx.kube, kp, finalizers::KURYRPORT).await?;
        let pods: Api<Pod> = Api::namespaced(self.ctx.kube.clone(), &kp.namespace().unwrap_or_default());
        if let Some(pod) = pods.get_opt(&kp.name_any()).await?
            && pod.uid().as_deref() == Some(kp.spec.pod_uid.as_str())
        {
            remove_finalizer(&self.ctx.kube, &pod, finalizers::POD).await?;
        }
        Ok(())
    }
}
