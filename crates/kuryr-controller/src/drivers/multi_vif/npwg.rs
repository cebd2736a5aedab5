//! `npwg_multiple_interfaces`: pod annotation `k8s.v1.cni.cncf.io/networks` (Network Plumbing WG
//! multi-network spec), naming NetworkAttachmentDefinitions that carry
//! `openstack.org/kuryr-config` `{"subnetId", "driverType"}` (either may be left out, as
//! upstream: see [`NpwgMultipleInterfaces::subnet_of`]).
//!
//! Both annotation forms are read: a JSON list of selection objects, and the short text form
//! `[namespace/]name[@interface], ...`. Of the selection fields, those Neutron can honour are
//! honoured (`interface`, `ips` as fixed IPs, `mac` as the port MAC); any other is refused with
//! an Event rather than silently ignored.

use std::sync::Arc;

use async_trait::async_trait;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, ResourceExt};
use kuryr_config::{KuryrConfig, SriovSection};
use kuryr_crds::names::annotations::NPWG_NETWORKS;
use kuryr_crds::{NadKuryrConfig, NetworkAttachmentDefinition, kuryr_config_of};
use kuryr_neutron::FixedIpRequest;
use serde_json::Value;

use super::additional_subnets::refield;
use super::{MultiVifDriver, PlannedVif, PodNetworking, PortSource, VNIC_DIRECT, VNIC_NORMAL, ip_in_cidr};
use crate::drivers::subnets::SubnetCache;
use crate::error::Error;

pub const NAME: &str = "npwg_multiple_interfaces";

/// One network selection element of the annotation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkSelection {
    pub name: String,
    pub namespace: Option<String>,
    pub interface: Option<String>,
    /// As written; a `/prefix` suffix is allowed and ignored.
    pub ips: Vec<String>,
    pub mac: Option<String>,
}

/// Parses the annotation value (JSON list, or the comma-separated text form).
pub fn parse(raw: &str) -> Result<Vec<NetworkSelection>, Error> {
    let trimmed = raw.trim();
    if trimmed.starts_with('[') || trimmed.starts_with('{') {
        let v: Value = serde_json::from_str(trimmed)
            .map_err(|e| Error::invalid(NPWG_NETWORKS, format!("malformed JSON: {e}")))?;
        let Value::Array(items) = v else {
            return Err(Error::invalid(
                NPWG_NETWORKS,
                "expected a JSON list of network selections",
            ));
        };
        return items
            .iter()
            .enumerate()
            .map(|(i, item)| parse_json_element(i, item))
            .collect();
    }
    trimmed
        .split(',')
        .enumerate()
        .map(|(i, part)| parse_text_element(i, part.trim()))
        .collect()
}

fn parse_text_element(i: usize, part: &str) -> Result<NetworkSelection, Error> {
    let field = format!("{NPWG_NETWORKS}[{i}]");
    let (net, interface) = match part.split_once('@') {
        Some((n, ifname)) => (n, Some(ifname.to_string())),
        None => (part, None),
    };
    let (namespace, name) = match net.split('/').collect::<Vec<_>>().as_slice() {
        [name] => (None, *name),
        [ns, name] => (Some(ns.to_string()), *name),
        _ => {
            return Err(Error::invalid(
                field,
                format!("{part:?} is not [namespace/]name[@interface]"),
            ));
        }
    };
    let sel = NetworkSelection {
        name: name.to_string(),
        namespace,
        interface,
        ..Default::default()
    };
    check_names(&field, &sel)?;
    Ok(sel)
}

fn parse_json_element(i: usize, item: &Value) -> Result<NetworkSelection, Error> {
    let field = format!("{NPWG_NETWORKS}[{i}]");
    let Value::Object(obj) = item else {
        return Err(Error::invalid(field, "expected an object with a \"name\""));
    };
    let string = |key: &str| -> Result<Option<String>, Error> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Error::invalid(format!("{field}.{key}"), "must be a string")),
        }
    };
    let mut sel = NetworkSelection {
        name: string("name")?.ok_or_else(|| Error::invalid(format!("{field}.name"), "is required"))?,
        namespace: string("namespace")?,
        interface: string("interface")?,
        mac: string("mac")?,
        ips: vec![],
    };
    match obj.get("ips") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for ip in a {
                let Value::String(s) = ip else {
                    return Err(Error::invalid(
                        format!("{field}.ips"),
                        "must be a list of strings",
                    ));
                };
                sel.ips.push(s.clone());
            }
        }
        Some(_) => {
            return Err(Error::invalid(
                format!("{field}.ips"),
                "must be a list of strings",
            ));
        }
    }
    for key in obj.keys() {
        if !matches!(key.as_str(), "name" | "namespace" | "interface" | "ips" | "mac") {
            return Err(Error::invalid(
                format!("{field}.{key}"),
                "not supported by kuryr (a Neutron port can honour only interface, ips and mac)",
            ));
        }
    }
    check_names(&field, &sel)?;
    Ok(sel)
}

/// Kubernetes object names (DNS-1123 subdomains).
fn check_names(field: &str, sel: &NetworkSelection) -> Result<(), Error> {
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    if !ok(&sel.name) {
        return Err(Error::invalid(
            format!("{field}.name"),
            format!("{:?} is not a valid NetworkAttachmentDefinition name", sel.name),
        ));
    }
    if let Some(ns) = &sel.namespace
        && !ok(ns)
    {
        return Err(Error::invalid(
            format!("{field}.namespace"),
            format!("{ns:?} is not a valid namespace name"),
        ));
    }
    if let Some(ifname) = &sel.interface {
        super::check_ifname(ifname).map_err(|e| refield(e, &format!("{field}.interface")))?;
    }
    Ok(())
}

/// `aa:bb:cc:dd:ee:ff`, unicast (Neutron refuses multicast MACs).
pub fn check_mac(field: &str, mac: &str) -> Result<(), Error> {
    let octets: Vec<&str> = mac.split(':').collect();
    let hex = octets.len() == 6
        && octets
            .iter()
            .all(|o| o.len() == 2 && o.chars().all(|c| c.is_ascii_hexdigit()));
    let first = octets.first().and_then(|o| u8::from_str_radix(o, 16).ok());
    match first {
        Some(b) if hex && b & 1 == 0 => Ok(()),
        _ => Err(Error::invalid(
            field,
            format!("{mac:?} is not a unicast MAC address"),
        )),
    }
}

pub struct NpwgMultipleInterfaces {
    kube: kube::Client,
    subnets: SubnetCache,
    physnets: SriovSection,
    config: Arc<KuryrConfig>,
}

impl NpwgMultipleInterfaces {
    pub fn new(kube: kube::Client, subnets: SubnetCache, config: Arc<KuryrConfig>) -> Self {
        Self {
            kube,
            subnets,
            physnets: config.sriov.clone(),
            config,
        }
    }

    /// The NAD's subnet as upstream finds it: its `subnetId`, else (with a `driverType`)
    /// `[neutron_defaults] subnet_mapping` of that type, else the deployment's pod subnet.
    fn subnet_of(
        &self,
        deployment: &str,
        cfg: &NadKuryrConfig,
        driver: &str,
        full: &str,
    ) -> Result<String, Error> {
        if let Some(id) = cfg.subnet_id.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            return Ok(id.to_owned());
        }
        let mapped = (!driver.is_empty())
            .then(|| self.config.neutron_defaults.subnet_mapping.get(driver))
            .flatten();
        mapped
            .cloned()
            .or_else(|| self.config.deployment_defaults(deployment).pod_subnet)
            .ok_or_else(|| {
                Error::invalid(
                    format!("NetworkAttachmentDefinition {full} subnetId"),
                    format!(
                        "missing, and neither [neutron_defaults] subnet_mapping (for driverType {driver:?}) nor \
                         pod_subnet names a subnet"
                    ),
                )
            })
    }
}

#[async_trait]
impl MultiVifDriver for NpwgMultipleInterfaces {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn plan(&self, net: &PodNetworking<'_>) -> Result<Vec<PlannedVif>, Error> {
        let Some(raw) = net.pod.annotations().get(NPWG_NETWORKS) else {
            return Ok(vec![]);
        };
        let mut out = vec![];
        for (i, sel) in parse(raw)?.into_iter().enumerate() {
            let field = format!("{NPWG_NETWORKS}[{i}]");
            let ns = sel
                .namespace
                .clone()
                .unwrap_or_else(|| net.podref.namespace.clone());
            let full = format!("{ns}/{}", sel.name);
            // Read untyped: kuryr reads only the annotation, and a NAD may have no `spec`.
            let resource = ApiResource::erase::<NetworkAttachmentDefinition>(&());
            let nad = Api::<DynamicObject>::namespaced_with(self.kube.clone(), &ns, &resource)
                .get_opt(&sel.name)
                .await?
                .ok_or_else(|| {
                    Error::invalid(
                        &field,
                        format!("NetworkAttachmentDefinition {full} does not exist"),
                    )
                })?;
            let cfg = kuryr_config_of(&nad.metadata).map_err(|e| Error::invalid(&field, e.to_string()))?;
            let driver = cfg.driver_type.as_deref().unwrap_or("").trim();
            let subnet_id = self.subnet_of(&net.default.deployment, &cfg, driver, &full)?;
            let network = self
                .subnets
                .network_of_subnet(&net.default.deployment, &subnet_id)
                .await
                .map_err(|e| refield(e, &format!("NetworkAttachmentDefinition {full} subnetId")))?;
            let sriov = match driver {
                "" | "neutron" | "neutron-vif" => false,
                d if d == net.vif_driver.as_str() => false,
                "sriov" => true,
                other => {
                    return Err(Error::invalid(
                        format!("NetworkAttachmentDefinition {full} driverType"),
                        format!(
                            "{other:?} is not available: this controller runs {} (or sriov)",
                            net.vif_driver
                        ),
                    ));
                }
            };
            let subnet = &network.subnets[..];
            let mut fixed_ips = vec![];
            for ip in &sel.ips {
                let addr = ip.split('/').next().unwrap_or_default();
                let parsed = addr.parse().map_err(|_| {
                    Error::invalid(format!("{field}.ips"), format!("{ip:?} is not an IP address"))
                })?;
                let Some(s) = subnet.iter().find(|s| ip_in_cidr(parsed, &s.cidr)) else {
                    return Err(Error::invalid(
                        format!("{field}.ips"),
                        format!("{ip} is not in subnet {subnet_id} of {full}"),
                    ));
                };
                fixed_ips.push(FixedIpRequest::address(s.id.clone(), addr.to_string()));
            }
            if let Some(mac) = &sel.mac {
                check_mac(&format!("{field}.mac"), mac)?;
            }
            let custom = !fixed_ips.is_empty() || sel.mac.is_some();
            let source = if sriov {
                let physnet = self.physnets.physnet_of_subnet(&subnet_id).ok_or_else(|| {
                    Error::invalid(
                        format!("NetworkAttachmentDefinition {full} driverType"),
                        format!("sriov needs subnet {subnet_id} in [sriov] default_physnet_subnets"),
                    )
                })?;
                PortSource::Create {
                    spec: net.spec_on(network, VNIC_DIRECT),
                    fixed_ips,
                    mac: sel.mac.clone(),
                    physnet: Some(physnet.to_string()),
                }
            } else if custom {
                // Pooled ports already have their addresses; nested drivers attach ports to the
                // node VM, which a per-pod create here does not do.
                if !net.bare_metal() {
                    return Err(Error::invalid(
                        format!("{field}.ips/mac"),
                        format!(
                            "requested addresses need pod_vif_driver neutron-vif, not {}",
                            net.vif_driver
                        ),
                    ));
                }
                PortSource::Create {
                    spec: net.spec_on(network, VNIC_NORMAL),
                    fixed_ips,
                    mac: sel.mac.clone(),
                    physnet: None,
                }
            } else {
                PortSource::Pooled {
                    spec: net.spec_on(network, VNIC_NORMAL),
                }
            };
            out.push(PlannedVif {
                driver: NAME,
                ifname: sel.interface.clone(),
                network: full,
                source,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form() {
        let got = parse("net-a, other/net-b@data0 ,net-c@x").unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].name, "net-a");
        assert_eq!(got[0].namespace, None);
        assert_eq!(got[1].namespace.as_deref(), Some("other"));
        assert_eq!(got[1].interface.as_deref(), Some("data0"));
        assert_eq!(got[2].interface.as_deref(), Some("x"));
        for bad in ["a/b/c", "", "a,,b", "Net_A", "a@", "a@b/c"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn json_form_honours_interface_ips_mac_and_refuses_the_rest() {
        let got = parse(
            r#"[{"name":"n1","namespace":"x","interface":"net1","ips":["10.0.0.5/24"],"mac":"02:00:00:00:00:01"}]"#,
        )
        .unwrap();
        assert_eq!(
            got[0],
            NetworkSelection {
                name: "n1".into(),
                namespace: Some("x".into()),
                interface: Some("net1".into()),
                ips: vec!["10.0.0.5/24".into()],
                mac: Some("02:00:00:00:00:01".into()),
            }
        );
        let e = parse(r#"[{"name":"n1","default-route":["10.0.0.1"]}]"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[0].default-route") && e.contains("not supported"),
            "{e}"
        );
        let e = parse(r#"[{"name":"n1"},{"namespace":"x"}]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("[1].name"), "{e}");
        let e = parse(r#"[{"name": "n1""#).unwrap_err().to_string();
        assert!(e.contains("malformed JSON"), "{e}");
        assert!(parse(r#"{"name":"n1"}"#).is_err());
        assert!(parse(r#"[{"name":"n1","ips":"10.0.0.1"}]"#).is_err());
    }

    #[test]
    fn macs() {
        assert!(check_mac("m", "fa:16:3e:00:00:01").is_ok());
        assert!(check_mac("m", "01:00:5e:00:00:01").is_err(), "multicast");
        assert!(check_mac("m", "fa:16:3e:00:00").is_err());
        assert!(check_mac("m", "zz:16:3e:00:00:01").is_err());
    }
}
