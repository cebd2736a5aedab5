//! `specific_ports`: pod annotation `spec-ports`, a JSON list of pre-created Neutron port ids
//! the pod uses instead of new ports. `normal` ports are plugged like the pod VIF driver's (bare
//! metal only: nested drivers would have to attach the port to the node VM), `direct` ones as
//! SR-IOV VFs.
//!
//! Each port is validated before anything is touched: it exists, nobody uses it (no
//! `device_id`/`device_owner`, unless this pod's own claim was interrupted by a crash), and it
//! belongs to the pod's project. The claim sets only `device_id`, `device_owner` and the host; on
//! release those are restored and the port is never deleted or pooled.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use kube::ResourceExt;
use kuryr_config::SriovSection;
use kuryr_crds::names::annotations::SPEC_PORTS;

use super::additional_subnets::refield;
use super::{MultiVifDriver, PlannedVif, PodNetworking, PortRestore, PortSource, VNIC_DIRECT, VNIC_NORMAL};
use crate::drivers::NetworkInfo;
use crate::drivers::subnets::SubnetCache;
use crate::error::Error;
use crate::openstack::Deployments;
use kuryr_crds::names::device_owner::COMPUTE_KURYR;

pub const NAME: &str = "specific_ports";

/// Parses the annotation: a JSON list of distinct, non-empty port ids.
pub fn parse(raw: &str) -> Result<Vec<String>, Error> {
    let ids: Vec<String> = serde_json::from_str(raw).map_err(|e| {
        Error::invalid(
            SPEC_PORTS,
            format!("expected a JSON list of Neutron port ids: {e}"),
        )
    })?;
    let mut seen = BTreeSet::new();
    for (i, id) in ids.iter().enumerate() {
        if id.trim().is_empty() {
            return Err(Error::invalid(format!("{SPEC_PORTS}[{i}]"), "empty port id"));
        }
        if !seen.insert(id.trim()) {
            return Err(Error::invalid(
                format!("{SPEC_PORTS}[{i}]"),
                format!("port {id} is listed twice"),
            ));
        }
    }
    Ok(ids.into_iter().map(|s| s.trim().to_string()).collect())
}

pub struct SpecificPorts {
    deployments: Deployments,
    subnets: SubnetCache,
    physnets: SriovSection,
}

impl SpecificPorts {
    pub fn new(deployments: Deployments, subnets: SubnetCache, physnets: SriovSection) -> Self {
        Self {
            deployments,
            subnets,
            physnets,
        }
    }
}

#[async_trait]
impl MultiVifDriver for SpecificPorts {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn plan(&self, net: &PodNetworking<'_>) -> Result<Vec<PlannedVif>, Error> {
        let Some(raw) = net.pod.annotations().get(SPEC_PORTS) else {
            return Ok(vec![]);
        };
        let deployment = &net.default.deployment;
        let client = self.deployments.client(deployment)?;
        let pod_uid = net.pod.metadata.uid.as_deref();
        let mut out = vec![];
        for (i, id) in parse(raw)?.into_iter().enumerate() {
            let field = format!("{SPEC_PORTS}[{i}]");
            let port = client.get_port(&id).await.map_err(|e| {
                if e.is_not_found() {
                    Error::invalid(&field, format!("Neutron port {id} does not exist"))
                } else {
                    e.into()
                }
            })?;
            // Claimed by this very pod: a crash came between the claim and the KuryrPort
            // status that records it. Resume the claim instead of calling the port taken.
            let own_claim =
                pod_uid.is_some_and(|uid| port.device_id == uid) && port.device_owner == COMPUTE_KURYR;
            if !own_claim && (!port.device_id.is_empty() || !port.device_owner.is_empty()) {
                return Err(Error::invalid(
                    &field,
                    format!(
                        "port {id} is in use (device_owner {:?}, device_id {:?})",
                        port.device_owner, port.device_id
                    ),
                ));
            }
            if port.project_id != net.default.project_id {
                return Err(Error::invalid(
                    &field,
                    format!(
                        "port {id} belongs to project {}, not to the pod's project {}",
                        port.project_id, net.default.project_id
                    ),
                ));
            }
            let direct = match port.binding_vnic_type.as_str() {
                "" | VNIC_NORMAL => false,
                VNIC_DIRECT => true,
                other => {
                    return Err(Error::invalid(
                        &field,
                        format!(
                            "port {id} has binding:vnic_type {other}; kuryr plugs normal and direct ports"
                        ),
                    ));
                }
            };
            if !direct && !net.bare_metal() {
                return Err(Error::invalid(
                    &field,
                    format!(
                        "normal port {id} can only be used with pod_vif_driver neutron-vif, not {}",
                        net.vif_driver
                    ),
                ));
            }
            let network = self.network_of(deployment, &field, &port).await?;
            let physnet = direct.then(|| {
                port.fixed_ips
                    .iter()
                    .find_map(|f| self.physnets.physnet_of_subnet(&f.subnet_id))
                    .map(str::to_string)
                    .or_else(|| {
                        port.binding_profile
                            .get("physical_network")
                            .and_then(|v| v.as_str())
                            .map(str::to_string)
                    })
            });
            out.push(PlannedVif {
                driver: NAME,
                ifname: None,
                network: format!("port:{id}"),
                source: PortSource::Adopt {
                    deployment: deployment.clone(),
                    port: Box::new(port.clone()),
                    network,
                    physnet,
                    restore: if own_claim {
                        PortRestore::unclaimed(&port)
                    } else {
                        PortRestore::of(&port)
                    },
                },
            });
        }
        Ok(out)
    }
}

impl SpecificPorts {
    /// The port's network with every subnet it has an address on.
    async fn network_of(
        &self,
        deployment: &str,
        field: &str,
        port: &kuryr_neutron::Port,
    ) -> Result<Arc<NetworkInfo>, Error> {
        let mut subnet_ids: Vec<&str> = port.fixed_ips.iter().map(|f| f.subnet_id.as_str()).collect();
        subnet_ids.dedup();
        let Some(first) = subnet_ids.first() else {
            return Err(Error::invalid(
                field,
                format!("port {} has no IP address", port.id),
            ));
        };
        let base = self
            .subnets
            .network_of_subnet(deployment, first)
            .await
            .map_err(|e| refield(e, field))?;
        let mut info = NetworkInfo::clone(&base);
        for id in &subnet_ids[1..] {
            let more = self
                .subnets
                .network_of_subnet(deployment, id)
                .await
                .map_err(|e| refield(e, field))?;
            info.subnets.extend(more.subnets.iter().cloned());
        }
        Ok(Arc::new(info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_is_a_list_of_distinct_ids() {
        assert_eq!(parse(r#"["a","b"]"#).unwrap(), ["a", "b"]);
        let e = parse(r#"["a","a"]"#).unwrap_err().to_string();
        assert!(e.contains("spec-ports[1]") && e.contains("twice"), "{e}");
        let e = parse("[a]").unwrap_err().to_string();
        assert!(e.contains("spec-ports") && e.contains("JSON list"), "{e}");
        assert!(parse(r#"[""]"#).is_err());
    }
}
