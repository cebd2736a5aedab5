//! `additional_subnets`: pod annotation `openstack.org/kuryr-additional-subnets`, a JSON list of
//! Neutron subnet ids; one extra interface per subnet, on the subnet's network, through the pod
//! VIF driver (and its pool).

use async_trait::async_trait;
use kube::ResourceExt;
use kuryr_crds::names::annotations::ADDITIONAL_SUBNETS;

use super::{MultiVifDriver, PlannedVif, PodNetworking, PortSource, VNIC_NORMAL};
use crate::drivers::subnets::SubnetCache;
use crate::error::Error;

pub const NAME: &str = "additional_subnets";

pub struct AdditionalSubnets {
    subnets: SubnetCache,
}

impl AdditionalSubnets {
    pub fn new(subnets: SubnetCache) -> Self {
        Self { subnets }
    }
}

/// Parses the annotation: a JSON list of non-empty subnet id strings.
pub fn parse(raw: &str) -> Result<Vec<String>, Error> {
    let ids: Vec<String> = serde_json::from_str(raw).map_err(|e| {
        Error::invalid(
            ADDITIONAL_SUBNETS,
            format!("expected a JSON list of Neutron subnet ids: {e}"),
        )
    })?;
    if let Some(i) = ids.iter().position(|s| s.trim().is_empty()) {
        return Err(Error::invalid(
            format!("{ADDITIONAL_SUBNETS}[{i}]"),
            "empty subnet id",
        ));
    }
    Ok(ids.into_iter().map(|s| s.trim().to_string()).collect())
}

/// Re-labels a subnet lookup failure with the field the user wrote.
pub(super) fn refield(e: Error, field: &str) -> Error {
    match e {
        Error::InvalidInput { message, .. } => Error::invalid(field, message),
        other => other,
    }
}

#[async_trait]
impl MultiVifDriver for AdditionalSubnets {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn plan(&self, net: &PodNetworking<'_>) -> Result<Vec<PlannedVif>, Error> {
        let Some(raw) = net.pod.annotations().get(ADDITIONAL_SUBNETS) else {
            return Ok(vec![]);
        };
        let mut out = vec![];
        for (i, id) in parse(raw)?.into_iter().enumerate() {
            let network = self
                .subnets
                .network_of_subnet(&net.default.deployment, &id)
                .await
                .map_err(|e| refield(e, &format!("{ADDITIONAL_SUBNETS}[{i}]")))?;
            out.push(PlannedVif {
                driver: NAME,
                ifname: None,
                network: format!("subnet:{id}"),
                source: PortSource::Pooled {
                    spec: net.spec_on(network, VNIC_NORMAL),
                },
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_must_be_a_json_list_of_ids() {
        assert_eq!(parse(r#"["a", " b "]"#).unwrap(), ["a", "b"]);
        assert!(parse("[]").unwrap().is_empty());
        let e = parse("a,b").unwrap_err().to_string();
        assert!(e.contains(ADDITIONAL_SUBNETS) && e.contains("JSON list"), "{e}");
        let e = parse(r#"["a", ""]"#).unwrap_err().to_string();
        assert!(e.contains("[1]"), "{e}");
        assert!(parse(r#"[1]"#).is_err());
    }
}
