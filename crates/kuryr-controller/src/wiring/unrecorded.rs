//! Ports a crash created for a pod without recording them in its KuryrPort (between the Neutron
//! create and the status write). They carry the pod's ownership tags (subports have no device
//! id, so the tags are what finds them).

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kuryr_crds::KuryrPort;
use kuryr_crds::names::annotations::SPEC_PORTS;
use kuryr_crds::names::device_owner::{COMPUTE_KURYR, TRUNK_SUBPORT};
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::{ListFilter, Port};

use super::record::RecordedVif;
use crate::context::Platform;
use crate::drivers::multi_vif::PortRestore;
use crate::drivers::multi_vif::specific_ports::parse as spec_ports;
use crate::drivers::vif::{VifDriver, detach_and_delete, subports_by_port};
use crate::error::Error;

/// Whether `port`, tagged for `kp`'s pod, is a leftover to delete: not recorded, not a pool port
/// (pools account for their own), and not taken over by a newer pod of the same name.
pub fn is_unrecorded(port: &Port, kp: &KuryrPort, recorded: &HashSet<&str>) -> bool {
    !recorded.contains(port.id.as_str())
        && !port.tags.iter().any(|t| t.starts_with(tags::TAG_POOL_PREFIX))
        && (port.device_id.is_empty() || port.device_id == kp.spec.pod_uid)
}

/// Deletes every unrecorded port of `kp`'s pod in every deployment; every failure is kept, but a
/// deployment that cannot be listed where the orphan sweep runs is left to the sweep.
/// `vifs` (the drivers that may have made the ports) first undo what they did outside a port
/// (nested-macvlan's address pair on the VM port): the port's record is what their `release_vif`
/// would need, and there is none.
pub async fn release_unrecorded(
    ctx: &Platform,
    vifs: &[Arc<dyn VifDriver>],
    kp: &KuryrPort,
    recorded: &[RecordedVif],
) -> Result<(), Error> {
    let pod_tag = tags::pod_tag(&kp.namespace().unwrap_or_default(), &kp.name_any());
    let cluster_tag = tags::cluster_tag(&ctx.cluster_id);
    let known: HashSet<&str> = recorded.iter().map(|r| r.vif.id()).collect();
    let mut errors = Vec::new();
    for deployment in ctx.deployments.names() {
        // A port naming the pod's uid is this pod's whoever's tag it carries; a subport names
        // none, so it is only taken by its tags where they are confirmed this cluster's
        // (cluster_claim.rs); elsewhere it waits for the orphan sweep.
        let tags_are_ours = ctx.deployments.is_claimed(deployment);
        let client = ctx.deployments.client(deployment)?;
        let filter = ListFilter::new().tags([tags::TAG_MANAGED, cluster_tag.as_str(), pod_tag.as_str()]);
        let listed = match client.list_ports(&filter).await {
            Ok(listed) => listed,
            // Where the orphan sweep runs it deletes them (they name no KuryrPort once this one is
            // gone): one deployment that cannot answer must not hold the pods of every other
            // deployment Terminating. Elsewhere nothing else would find them.
            Err(e) if tags_are_ours => {
                tracing::warn!(deployment, kuryrport = %kp.name_any(), error = %e,
                    "could not look for ports created for the pod but never recorded; the orphan sweep deletes any");
                continue;
            }
            Err(e) => {
                errors.push(e.into());
                continue;
            }
        };
        let stray: Vec<Port> = listed
            .into_iter()
            .filter(|p| is_unrecorded(p, kp, &known) && (tags_are_ours || !p.device_id.is_empty()))
            .collect();
        if stray.is_empty() {
            continue;
        }
        let mut kept = HashSet::new();
        for vif in vifs {
            kept.extend(vif.release_orphans(deployment, &stray).await);
        }
        // Deleted now, what still points at them could not be found any more: the finalizer
        // stays and the next try releases them again.
        let (stray, held): (Vec<Port>, Vec<Port>) = stray.into_iter().partition(|p| !kept.contains(&p.id));
        if !held.is_empty() {
            errors.push(Error::not_ready(format!(
                "{} unrecorded port(s) of the pod in {deployment} could not be released from their VM port",
                held.len()
            )));
        }
        let trunks = if stray.iter().any(|p| p.device_owner == TRUNK_SUBPORT) {
            subports_by_port(client).await?
        } else {
            Default::default()
        };
        for p in stray {
            let trunk = trunks.get(&p.id).map(|(t, _)| t.as_str());
            match detach_and_delete(client, &p.id, trunk).await {
                Ok(()) => tracing::info!(port = %p.id, deployment, kuryrport = %kp.name_any(),
                    "deleted a port created for the pod but never recorded (crash mid-request)"),
                Err(e) => errors.push(e),
            }
        }
    }
    Error::collect(errors)
}

/// Puts back unclaimed the user's pre-created ports (`spec-ports`) `pod` claimed without the
/// claim being recorded (a crash between the two). Kuryr never tags them, so neither the lookup
/// by tags nor the orphan sweep finds them: the pod's annotation names them. Left claimed, every
/// later pod naming one would be refused it as in use. A failed restore is kept (the finalizer
/// stays); a deployment that cannot be asked is warned about.
pub async fn restore_unrecorded_claims(
    ctx: &Platform,
    pod: &Pod,
    recorded: &[RecordedVif],
) -> Result<(), Error> {
    let Some(ids) = pod
        .annotations()
        .get(SPEC_PORTS)
        .and_then(|raw| spec_ports(raw).ok())
    else {
        return Ok(());
    };
    let uid = pod.uid().unwrap_or_default();
    let known: HashSet<&str> = recorded.iter().map(|r| r.vif.id()).collect();
    let mut errors = Vec::new();
    for id in ids.iter().filter(|id| !known.contains(id.as_str())) {
        // Deployments that could not say whether they hold it do not hold the pod back (as with
        // unrecorded ports, one deployment that is out must not hold the pods of others
        // Terminating); a port found nowhere else is warned about.
        let mut unanswered = Vec::new();
        let mut found = false;
        for deployment in ctx.deployments.names() {
            let port = match ctx.deployments.client(deployment) {
                Ok(client) => match client.get_port(id).await {
                    Ok(port) => (client, port),
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => {
                        unanswered.push(format!("{deployment}: {e}"));
                        continue;
                    }
                },
                Err(e) => {
                    unanswered.push(format!("{deployment}: {e}"));
                    continue;
                }
            };
            let (client, port) = port;
            found = true;
            if port.device_id != uid || port.device_owner != COMPUTE_KURYR {
                break;
            }
            // On condition that nobody changed it since: a claim of someone else stays theirs.
            match client
                .update_port_if_revision(id, &PortRestore::unclaimed(&port).update(), port.revision_number)
                .await
            {
                Ok(_) => tracing::info!(port = %id, deployment, pod = %pod.name_any(),
                    "put back unclaimed a pre-created port the pod claimed but never recorded (crash mid-claim)"),
                Err(e) if e.is_not_found() => {}
                Err(e) => errors.push(e.into()),
            }
            break;
        }
        if !found && !unanswered.is_empty() {
            tracing::warn!(port = %id, pod = %pod.name_any(), unanswered = ?unanswered,
                "a pre-created port the pod names was not found where Neutron answered: if a crash left it claimed, \
                 it stays so (device_id the pod's uid) until released by hand");
        }
    }
    Error::collect(errors)
}
