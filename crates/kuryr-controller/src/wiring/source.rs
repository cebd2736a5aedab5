//! The drivers' [`VifSource`]: ports from the pool driver, created for the pod, or adopted
//! (`spec-ports`), and given back the same way.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use kuryr_crds::names::device_owner::COMPUTE_KURYR;
use kuryr_crds::{KuryrPort, Vif};
use kuryr_neutron::{Port, PortUpdate};
use serde_json::json;

use super::lifecycle::VifSource;
use super::plan::Interface;
use super::record::{RecordedVif, ReleaseMode};
use crate::context::Context;
use crate::drivers::multi_vif::{self, MultiVifRecord, PortRestore, PortSource, VNIC_DIRECT};
use crate::drivers::os_vif::{VifKind, vif_from_port};
use crate::drivers::pool::{VifOrigin, origin_for, port_subnets};
use crate::drivers::vif::{PortOwner, create_ports, delete_ports, port_create};
use crate::drivers::{NetworkInfo, PodRef, PortSpec};
use crate::error::Error;
use crate::openstack::DEFAULT_DEPLOYMENT;

/// Acquires and releases through the context's drivers. `kp` is the KuryrPort being wired or
/// finalized: VIFs it recorded without an origin (written by upstream) are resolved against its
/// node.
pub struct DriverSource<'a> {
    pub ctx: &'a Context,
    pub kp: &'a KuryrPort,
}

impl<'a> DriverSource<'a> {
    pub fn new(ctx: &'a Context, kp: &'a KuryrPort) -> Self {
        Self { ctx, kp }
    }

    /// The origin of a VIF, inferred for one recorded without (an upstream KuryrPort): the
    /// default deployment and the pod VIF driver's pool host for the pod's node.
    async fn origin(&self, r: &RecordedVif) -> Result<VifOrigin, Error> {
        if let Some(o) = &r.origin {
            return Ok(o.clone());
        }
        let vif_driver = &self.ctx.drivers.vif;
        let host = vif_driver
            .pool_host(DEFAULT_DEPLOYMENT, &self.kp.spec.pod_node_name)
            .await?;
        let info = Arc::new(NetworkInfo {
            id: r.vif.network().map(|n| n.id.clone()).unwrap_or_default(),
            name: String::new(),
            mtu: None,
            subnets: vec![],
        });
        Ok(origin_for(
            vif_driver.as_ref(),
            &PortSpec::new(DEFAULT_DEPLOYMENT, "", info, vec![]),
            &host,
        ))
    }

    fn bound_kind(&self, physnet: Option<Option<String>>) -> VifKind {
        match physnet {
            Some(physnet) => VifKind::Sriov { physnet },
            None => VifKind::Bound {
                ovs_bridge: self.ctx.config.neutron_defaults.ovs_bridge.clone(),
            },
        }
    }

    /// A port made for this pod only (requested addresses/MAC, or an SR-IOV VF port).
    async fn create(
        &self,
        pod: &PodRef,
        network: &str,
        spec: &PortSpec,
        fixed_ips: &[kuryr_neutron::FixedIpRequest],
        mac: Option<&String>,
        physnet: Option<&String>,
    ) -> Result<(Vif, VifOrigin), Error> {
        let client = self.ctx.deployments.client(&spec.deployment)?;
        let mut req = port_create(
            spec,
            &PortOwner::Pod(pod.clone()),
            &self.ctx.resource_tags(),
            COMPUTE_KURYR,
        );
        if !fixed_ips.is_empty() {
            req.fixed_ips = Some(fixed_ips.to_vec());
        }
        req.mac_address = mac.cloned();
        req.binding_host_id = Some(pod.node.clone());
        if let Some(p) = physnet {
            req.binding_vnic_type = Some(VNIC_DIRECT.into());
            req.binding_profile = Some(BTreeMap::from([("physical_network".to_string(), json!(p))]));
        }
        let kind = self.bound_kind(physnet.map(|p| Some(p.clone())));
        let mtu = self.ctx.config.neutron_defaults.network_device_mtu;
        let network_info = &spec.network;
        let (port, vif) = create_ports(client, req, 1, |mut ports| async move {
            let port = ports
                .pop()
                .ok_or_else(|| Error::not_ready("Neutron returned no port"))?;
            let vif = vif_from_port(&port, network_info, &kind, mtu)?;
            Ok((port, vif))
        })
        .await
        .map_err(|err| {
            // A requested address or MAC Neutron refuses is the user's to fix.
            let refused = matches!(err, Error::OpenStack { .. }) && !err.is_retryable();
            if refused && (!fixed_ips.is_empty() || mac.is_some()) {
                Error::invalid(format!("ips/mac of network {network}"), err.to_string())
            } else {
                err
            }
        })?;
        let origin = self.origin_of(pod, &spec.deployment, &port, physnet.is_some(), false);
        Ok((vif, origin))
    }

    /// A pre-created port, claimed conditionally on the revision validated while planning.
    async fn adopt(
        &self,
        pod: &PodRef,
        deployment: &str,
        port: &Port,
        network: &NetworkInfo,
        physnet: &Option<Option<String>>,
        restore: &PortRestore,
    ) -> Result<(Vif, VifOrigin), Error> {
        let client = self.ctx.deployments.client(deployment)?;
        // The name stays the user's: with only kuryr's own fields changed, a claim that a crash
        // interrupted can still be restored exactly.
        let update = PortUpdate {
            device_id: Some(pod.uid.clone()),
            device_owner: Some(COMPUTE_KURYR.into()),
            binding_host_id: Some(pod.node.clone()),
            ..Default::default()
        };
        // A port taken by someone else meanwhile fails here (412); the next attempt re-plans.
        let bound = client
            .update_port_if_revision(&port.id, &update, port.revision_number)
            .await?;
        let kind = self.bound_kind(physnet.clone());
        let mtu = self.ctx.config.neutron_defaults.network_device_mtu;
        let vif = match vif_from_port(&bound, network, &kind, mtu) {
            Ok(v) => v,
            Err(e) => {
                let _ = client.update_port(&port.id, &restore.update()).await;
                return Err(e);
            }
        };
        Ok((
            vif,
            self.origin_of(pod, deployment, port, physnet.is_some(), true),
        ))
    }

    fn origin_of(
        &self,
        pod: &PodRef,
        deployment: &str,
        port: &Port,
        sriov: bool,
        preserve: bool,
    ) -> VifOrigin {
        VifOrigin {
            deployment: deployment.to_string(),
            host: pod.node.clone(),
            project_id: port.project_id.clone(),
            network_id: port.network_id.clone(),
            subnets: port_subnets(port),
            security_groups: port.security_groups.clone(),
            driver: if sriov { "sriov" } else { "neutron-vif" }.into(),
            preserve,
        }
    }
}

#[async_trait]
impl VifSource for DriverSource<'_> {
    async fn acquire(&self, pod: &PodRef, iface: &Interface) -> Result<RecordedVif, Error> {
        let plan = &iface.plan;
        let (mut vif, origin, release, restore) = match &plan.source {
            PortSource::Pooled { spec } => {
                let (vif, origin) = self.ctx.drivers.pool.request_vif(pod, spec).await?;
                (vif, origin, ReleaseMode::Pool, None)
            }
            PortSource::Create {
                spec,
                fixed_ips,
                mac,
                physnet,
            } => {
                let (vif, origin) = self
                    .create(
                        pod,
                        &plan.network,
                        spec,
                        fixed_ips,
                        mac.as_ref(),
                        physnet.as_ref(),
                    )
                    .await?;
                (vif, origin, ReleaseMode::Delete, None)
            }
            PortSource::Adopt {
                deployment,
                port,
                network,
                physnet,
                restore,
            } => {
                let (vif, origin) = self
                    .adopt(pod, deployment, port, network, physnet, restore)
                    .await?;
                (vif, origin, ReleaseMode::Restore, Some(restore.clone()))
            }
        };
        // Upstream's SR-IOV VIFs name their pod: the daemon finds the pod's allocated VFs by it.
        if let Vif::Sriov(s) = &mut vif {
            s.pod_name = Some(pod.name.clone());
        }
        Ok(RecordedVif {
            ifname: iface.ifname.clone(),
            default: iface.default,
            vif,
            origin: Some(origin),
            multi: (!iface.default).then(|| MultiVifRecord {
                driver: plan.driver.to_string(),
                network: plan.network.clone(),
                release,
                restore,
            }),
        })
    }

    async fn activate(&self, r: &mut RecordedVif) -> Result<(), Error> {
        if r.multi.is_some() && multi_vif::activates_immediately(&r.vif) {
            r.vif.base_mut().active = true;
            return Ok(());
        }
        let origin = self.origin(r).await?;
        self.ctx.drivers.pool.activate_vif(&origin, &mut r.vif).await
    }

    async fn release(&self, r: &RecordedVif) -> Result<(), Error> {
        let origin = self.origin(r).await?;
        if self.ctx.deployments.client(&origin.deployment).is_err() {
            // Its deployment left kuryr.conf: nothing can reach the port, and keeping the pod's
            // finalizer would only leave it stuck.
            tracing::warn!(port = %r.vif.id(), deployment = %origin.deployment,
                "OpenStack deployment no longer configured: port left in it");
            return Ok(());
        }
        // A group change for this pod under way (a policy pass) lands before the port goes.
        self.ctx.port_groups.after_changes(r.vif.id()).await;
        match r.release_mode() {
            ReleaseMode::Pool => {
                let ns = kube::ResourceExt::namespace(self.kp).unwrap_or_default();
                let name = kube::ResourceExt::name_any(self.kp);
                let holder = crate::drivers::pool::holder(&ns, &name, &self.kp.spec.pod_uid);
                self.ctx.drivers.pool.release_vif(&r.vif, &origin, &holder).await
            }
            ReleaseMode::Delete => {
                delete_ports(
                    self.ctx.deployments.client(&origin.deployment)?,
                    &[r.vif.id().to_string()],
                )
                .await
            }
            ReleaseMode::Restore => {
                let restore = r.multi.as_ref().and_then(|m| m.restore.as_ref()).ok_or_else(|| {
                    Error::invalid(
                        format!("KuryrPort status of port {}", r.vif.id()),
                        "pre-created port recorded without its original attributes",
                    )
                })?;
                let client = self.ctx.deployments.client(&origin.deployment)?;
                match client.update_port(r.vif.id(), &restore.update()).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}
