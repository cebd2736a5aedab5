//! A Service's EndpointSlices -> `spec.endpointSlices` of its KuryrLoadBalancer. Pure.

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kuryr_crds::{LbEndpoint, LbEndpointConditions, LbEndpointPort, LbEndpointSlice, LbTargetRef};

/// The label the EndpointSlice controller puts on every slice of a Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The endpoint slices as the KuryrLoadBalancer records them: ready endpoints only (an endpoint whose
/// readiness is unknown counts as ready, as kube-proxy does), IPv4/IPv6 slices alike, sorted so that the
/// same endpoints always give the same spec (no write, no Octavia call, when nothing changed).
pub fn from_slices(slices: &[EndpointSlice]) -> Vec<LbEndpointSlice> {
    let mut out: Vec<LbEndpointSlice> = slices
        .iter()
        .filter(|s| s.address_type != "FQDN")
        .map(|s| {
            let mut endpoints: Vec<LbEndpoint> = s
                .endpoints
                .iter()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                .filter(|e| !e.addresses.is_empty())
                .map(|e| LbEndpoint {
                    addresses: e.addresses.clone(),
                    conditions: Some(LbEndpointConditions { ready: Some(true) }),
                    hostname: e.hostname.clone(),
                    target_ref: e.target_ref.as_ref().map(|r| LbTargetRef {
                        kind: r.kind.clone(),
                        name: r.name.clone(),
                        namespace: r.namespace.clone(),
                        resource_version: None,
                        uid: r.uid.clone(),
                    }),
                    topology: None,
                })
                .collect();
            endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
            let mut ports: Vec<LbEndpointPort> = s
                .ports
                .iter()
                .flatten()
                .map(|p| LbEndpointPort {
                    name: p.name.clone(),
                    port: p.port,
                    protocol: p.protocol.clone(),
                })
                .collect();
            ports.sort_by(|a, b| (&a.name, a.port).cmp(&(&b.name, b.port)));
            LbEndpointSlice { endpoints, ports }
        })
        .filter(|s| !s.endpoints.is_empty())
        .collect();
    out.sort_by(|a, b| {
        let key = |s: &LbEndpointSlice| s.endpoints.first().map(|e| e.addresses.clone());
        key(a).cmp(&key(b))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    fn ep(ip: &str, ready: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready,
                ..Default::default()
            }),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(format!("pod-{ip}")),
                namespace: Some("demo".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn slice(eps: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: eps,
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            metadata: Default::default(),
        }
    }

    #[test]
    fn only_ready_endpoints_count() {
        let out = from_slices(&[slice(vec![
            ep("10.1.0.3", Some(true)),
            ep("10.1.0.4", Some(false)),
            ep("10.1.0.5", None),
        ])]);
        let ips: Vec<_> = out[0].endpoints.iter().map(|e| e.addresses[0].as_str()).collect();
        assert_eq!(ips, ["10.1.0.3", "10.1.0.5"]);
        assert_eq!(out[0].ports[0].port, Some(8080));
    }

    #[test]
    fn order_of_slices_and_endpoints_does_not_matter() {
        let a = from_slices(&[
            slice(vec![ep("10.1.0.9", Some(true)), ep("10.1.0.3", Some(true))]),
            slice(vec![ep("10.1.0.1", Some(true))]),
        ]);
        let b = from_slices(&[
            slice(vec![ep("10.1.0.1", Some(true))]),
            slice(vec![ep("10.1.0.3", Some(true)), ep("10.1.0.9", Some(true))]),
        ]);
        assert_eq!(a, b);
    }

    #[test]
    fn a_slice_without_ready_endpoints_is_dropped() {
        assert!(from_slices(&[slice(vec![ep("10.1.0.4", Some(false))])]).is_empty());
    }
}
