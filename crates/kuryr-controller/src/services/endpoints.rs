//! A Service's EndpointSlices -> `spec.endpointSlices` of its KuryrLoadBalancer. Pure.

use std::collections::BTreeSet;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kuryr_crds::{LbEndpoint, LbEndpointConditions, LbEndpointPort, LbEndpointSlice, LbTargetRef};

/// The label the EndpointSlice controller puts on every slice of a Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

fn ready(e: &Endpoint) -> bool {
    e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) && !e.addresses.is_empty()
}

/// Terminating but still serving (a pod in its grace period that has not failed its readiness probe).
fn draining(e: &Endpoint) -> bool {
    e.conditions
        .as_ref()
        .is_some_and(|c| c.serving == Some(true) && c.terminating == Some(true))
        && !e.addresses.is_empty()
}

/// The endpoint slices as the KuryrLoadBalancer records them: ready endpoints (an endpoint whose
/// readiness is unknown counts as ready, as kube-proxy does), IPv4/IPv6 slices alike, sorted so that the
/// same endpoints always give the same spec (no write, no Octavia call, when nothing changed). An address
/// family without a ready endpoint is served by its terminating endpoints that still serve, recorded
/// as ready: kube-proxy's fallback, so the last pods of a Service being rolled or drained finish their
/// connections and take new ones until they go, rather than the load balancer refusing them at once.
pub fn from_slices(slices: &[EndpointSlice]) -> Vec<LbEndpointSlice> {
    let served: BTreeSet<&str> = slices
        .iter()
        .filter(|s| s.endpoints.iter().any(ready))
        .map(|s| s.address_type.as_str())
        .collect();
    let mut out: Vec<LbEndpointSlice> = slices
        .iter()
        .filter(|s| s.address_type != "FQDN")
        .map(|s| {
            let fallback = !served.contains(s.address_type.as_str());
            let mut endpoints: Vec<LbEndpoint> = s
                .endpoints
                .iter()
                .filter(|e| ready(e) || (fallback && draining(e)))
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

    fn draining_ep(ip: &str, serving: bool) -> Endpoint {
        let mut e = ep(ip, Some(false));
        e.conditions = Some(EndpointConditions {
            ready: Some(false),
            serving: Some(serving),
            terminating: Some(true),
        });
        e
    }

    #[test]
    fn terminating_endpoints_that_serve_take_the_traffic_only_when_none_is_ready() {
        let ips = |out: &[LbEndpointSlice]| -> Vec<String> {
            out.iter()
                .flat_map(|s| &s.endpoints)
                .map(|e| e.addresses[0].clone())
                .collect()
        };
        // A ready endpoint in another slice of the family: the draining ones are left out.
        let out = from_slices(&[
            slice(vec![draining_ep("10.1.0.4", true)]),
            slice(vec![ep("10.1.0.5", Some(true))]),
        ]);
        assert_eq!(ips(&out), ["10.1.0.5"]);
        // The last pods draining: the serving ones stay members, recorded as ready.
        let out = from_slices(&[slice(vec![
            draining_ep("10.1.0.4", true),
            draining_ep("10.1.0.6", false),
            ep("10.1.0.7", Some(false)),
        ])]);
        assert_eq!(ips(&out), ["10.1.0.4"]);
        assert_eq!(
            out[0].endpoints[0].conditions.as_ref().and_then(|c| c.ready),
            Some(true)
        );
        // Per family: a ready IPv6 endpoint does not take the IPv4 fallback away.
        let mut v6 = slice(vec![ep("fd00::5", Some(true))]);
        v6.address_type = "IPv6".into();
        let out = from_slices(&[slice(vec![draining_ep("10.1.0.4", true)]), v6]);
        assert_eq!(ips(&out), ["10.1.0.4", "fd00::5"]);
    }

    #[test]
    fn a_slice_without_ready_endpoints_is_dropped() {
        assert!(from_slices(&[slice(vec![ep("10.1.0.4", Some(false))])]).is_empty());
    }
}
