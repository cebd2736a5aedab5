//! Service -> KuryrLoadBalancer spec. Pure: the caller resolves project, subnet and security groups.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kuryr_config::OCTAVIA_MAX_TIMEOUT_MS;
use kuryr_crds::names::annotations;
use kuryr_crds::{KuryrLoadBalancerSpec, LbSpecPort};

use crate::error::Error;

/// Service types kuryr turns into load balancers (upstream's `SUPPORTED_SERVICE_TYPES`).
const SUPPORTED_TYPES: &[&str] = &["ClusterIP", "LoadBalancer"];

/// Why a Service gets no load balancer; shown in a `KuryrServiceSkipped` Event like upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    Headless,
    UnsupportedType(String),
    /// `default/kubernetes`: the API server's own Service, which needs https to the masters.
    ApiServer,
    /// Not allocated a cluster IP yet.
    NoClusterIp,
}

impl Skip {
    pub fn message(&self, ns: &str, name: &str) -> String {
        match self {
            Skip::Headless => format!("Skipping headless Service {ns}/{name}."),
            Skip::UnsupportedType(t) => format!("Skipping service {ns}/{name} of unsupported type {t}."),
            Skip::ApiServer => format!("Skipping default service {ns}/{name}."),
            Skip::NoClusterIp => format!("Skipping Service {ns}/{name} without a cluster IP yet."),
        }
    }
}

/// Whether kuryr serves `svc`, and if not why.
pub fn skip_reason(svc: &Service) -> Option<Skip> {
    let spec = svc.spec.as_ref()?;
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    if !SUPPORTED_TYPES.contains(&ty) {
        return Some(Skip::UnsupportedType(ty.to_string()));
    }
    match spec.cluster_ip.as_deref() {
        Some("None") => return Some(Skip::Headless),
        None | Some("") => return Some(Skip::NoClusterIp),
        Some(_) => {}
    }
    if svc.namespace().as_deref() == Some("default") && svc.name_any() == "kubernetes" {
        return Some(Skip::ApiServer);
    }
    None
}

/// What the drivers resolved for the Service's load balancer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolved {
    pub project_id: String,
    pub subnet_id: String,
    pub security_groups: Vec<String>,
    /// `None` leaves the choice to Octavia.
    pub provider: Option<String>,
    /// `[octavia_defaults]` timeouts in ms, 0 = Octavia's default.
    pub timeout_client_data: u64,
    pub timeout_member_data: u64,
}

/// The KuryrLoadBalancer spec of `svc` (endpoint slices excepted: the `endpoints` handler owns them).
pub fn build(svc: &Service, r: &Resolved) -> Result<KuryrLoadBalancerSpec, Error> {
    let spec = svc
        .spec
        .as_ref()
        .ok_or_else(|| Error::invalid("spec", "the Service has no spec"))?;
    let ip = cluster_ip(spec.cluster_ip.as_deref().unwrap_or_default())?;
    let mut ports = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let field = format!("spec.ports[{i}]");
        let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let target_port = match &p.target_port {
            None => p.port.to_string(),
            Some(IntOrString::Int(n)) => n.to_string(),
            Some(IntOrString::String(s)) if s.is_empty() => {
                return Err(Error::invalid(format!("{field}.targetPort"), "empty"));
            }
            Some(IntOrString::String(s)) => s.clone(),
        };
        if !(1..=65535).contains(&p.port) {
            return Err(Error::invalid(
                format!("{field}.port"),
                format!("{} is not a port number", p.port),
            ));
        }
        ports.push(LbSpecPort {
            name: p.name.clone(),
            port: p.port,
            protocol,
            target_port,
        });
    }
    let annotations = svc.annotations();
    let timeout = |key: &str, default: u64| -> Result<Option<i32>, Error> {
        let value = match annotations.get(key) {
            // Octavia refuses more than its limit; refused there, the listener would be left out.
            Some(v) => v
                .trim()
                .parse::<i32>()
                .ok()
                .filter(|ms| u64::try_from(*ms).is_ok_and(|ms| ms <= OCTAVIA_MAX_TIMEOUT_MS))
                .ok_or_else(|| {
                    Error::invalid(
                        format!("metadata.annotations[{key}]"),
                        format!(
                            "{v:?} is not a timeout in milliseconds between 0 and {OCTAVIA_MAX_TIMEOUT_MS} \
                             (Octavia's limit, 24 h)"
                        ),
                    )
                })?,
            None => i32::try_from(default).unwrap_or(i32::MAX),
        };
        Ok((value > 0).then_some(value))
    };
    let lb_ip = match spec.load_balancer_ip.as_deref() {
        Some(s) if !s.is_empty() => Some(
            s.parse::<IpAddr>()
                .map_err(|_| Error::invalid("spec.loadBalancerIP", format!("{s:?} is not an IP address")))?
                .to_string(),
        ),
        _ => None,
    };
    Ok(KuryrLoadBalancerSpec {
        endpoint_slices: Vec::new(),
        ip: Some(ip.to_string()),
        lb_ip,
        ports,
        project_id: Some(r.project_id.clone()),
        security_groups_ids: r.security_groups.clone(),
        subnet_id: Some(r.subnet_id.clone()),
        type_: Some(served_type(spec).to_string()),
        provider: r.provider.clone(),
        timeout_client_data: timeout(annotations::LB_TIMEOUT_CLIENT_DATA, r.timeout_client_data)?,
        timeout_member_data: timeout(annotations::LB_TIMEOUT_MEMBER_DATA, r.timeout_member_data)?,
        session_affinity: match spec.session_affinity.as_deref() {
            Some("ClientIP") => Some("ClientIP".into()),
            _ => None,
        },
        // The `service` handler adds them (they need Neutron reads).
        listener_acls: Vec::new(),
    })
}

/// A Service field an Octavia load balancer cannot honour; shown in a Warning Event on the Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhonoured {
    /// The Event reason (one per field: the Event recorder folds Events of one reason into a series).
    pub reason: &'static str,
    pub message: String,
}

/// What of `svc`'s traffic policies a load balancer of `provider` cannot do, and what it does instead.
///
/// - `internalTrafficPolicy: Local` asks for the endpoints on the client's own node only. The VIP is one
///   Octavia object shared by every client, and a pool's members cannot depend on who connects, so
///   every ready endpoint is served (as with `Cluster`).
/// - `externalTrafficPolicy: Local` (LoadBalancer Services) asks that backends see the client's address and
///   that traffic takes no second hop. A floating IP reaches the VIP directly (there is no node hop to
///   avoid); the `ovn` provider only DNATs, so backends see the client's address: honoured. The
///   `amphora` provider proxies every connection, so backends see the amphora's address: not honoured.
pub fn unhonoured(svc: &Service, provider: Option<&str>) -> Vec<Unhonoured> {
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if spec.internal_traffic_policy.as_deref() == Some("Local") {
        out.push(Unhonoured {
            reason: "KuryrInternalTrafficPolicyUnsupported",
            message:
                "spec.internalTrafficPolicy: Local cannot be honoured by an Octavia load balancer (its VIP \
                      does not know which node a client runs on): traffic goes to every ready endpoint, as \
                      with Cluster"
                    .into(),
        });
    }
    let load_balancer = served_type(spec) == "LoadBalancer";
    if load_balancer
        && spec.external_traffic_policy.as_deref() == Some("Local")
        && provider != Some(super::desired::OVN_PROVIDER)
    {
        out.push(Unhonoured {
            reason: "KuryrExternalTrafficPolicyUnsupported",
            message: format!(
                "spec.externalTrafficPolicy: Local cannot be honoured by the Octavia provider {:?}: it \
                 proxies connections, so backends see the load balancer's address, not the client's \
                 (the ovn provider keeps it); traffic goes to every ready endpoint, as with Cluster",
                provider.unwrap_or("default")
            ),
        });
    }
    if load_balancer
        && spec
            .load_balancer_source_ranges
            .as_ref()
            .is_some_and(|r| !r.is_empty())
    {
        // Said out loud: a user who asked for it believes the Service closed to other sources.
        out.push(Unhonoured {
            reason: "KuryrLoadBalancerSourceRangesUnsupported",
            message: "spec.loadBalancerSourceRanges is not applied: the floating IP admits every source (a \
                      NetworkPolicy on the backends limits who reaches them)"
                .into(),
        });
    }
    out
}

/// The type kuryr serves the Service as. A LoadBalancer Service of another `loadBalancerClass` is served
/// as its ClusterIP only (kuryr stands in for kube-proxy): its external address is the named
/// implementation's to give (Kubernetes: the default implementation ignores a Service with a class),
/// so kuryr neither allocates a floating IP for it nor writes its `status.loadBalancer`.
pub fn served_type(spec: &ServiceSpec) -> &str {
    match spec.type_.as_deref() {
        Some("LoadBalancer") if spec.load_balancer_class.as_deref().is_some_and(|c| !c.is_empty()) => {
            "ClusterIP"
        }
        Some(t) => t,
        None => "ClusterIP",
    }
}

/// A cluster IP, written canonically (upstream strips leading zeros the same way).
pub fn cluster_ip(s: &str) -> Result<IpAddr, Error> {
    s.parse::<IpAddr>()
        .map_err(|_| Error::invalid("spec.clusterIP", format!("{s:?} is not an IP address")))
}

/// Whether the parts of the spec the `service` handler owns differ (endpoint slices are the `endpoints`
/// handler's and never compared here).
pub fn service_part_differs(current: &KuryrLoadBalancerSpec, wanted: &KuryrLoadBalancerSpec) -> bool {
    let strip = |s: &KuryrLoadBalancerSpec| KuryrLoadBalancerSpec {
        endpoint_slices: Vec::new(),
        ..s.clone()
    };
    strip(current) != strip(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;

    fn svc(ty: &str, ip: &str, ports: Vec<ServicePort>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("demo".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(ty.into()),
                cluster_ip: Some(ip.into()),
                ports: Some(ports),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn port(name: &str, port: i32, target: IntOrString) -> ServicePort {
        ServicePort {
            name: Some(name.into()),
            port,
            protocol: Some("TCP".into()),
            target_port: Some(target),
            ..Default::default()
        }
    }

    fn resolved() -> Resolved {
        Resolved {
            project_id: "p".into(),
            subnet_id: "s".into(),
            security_groups: vec!["sg".into()],
            provider: Some("amphora".into()),
            timeout_client_data: 0,
            timeout_member_data: 50_000,
        }
    }

    #[test]
    fn headless_external_name_and_api_server_are_skipped() {
        assert_eq!(
            skip_reason(&svc("ClusterIP", "None", vec![])),
            Some(Skip::Headless)
        );
        assert_eq!(
            skip_reason(&svc("ExternalName", "", vec![])),
            Some(Skip::UnsupportedType("ExternalName".into()))
        );
        assert_eq!(
            skip_reason(&svc("NodePort", "10.0.0.5", vec![])),
            Some(Skip::UnsupportedType("NodePort".into()))
        );
        let mut api = svc("ClusterIP", "10.0.0.1", vec![]);
        api.metadata.namespace = Some("default".into());
        api.metadata.name = Some("kubernetes".into());
        assert_eq!(skip_reason(&api), Some(Skip::ApiServer));
        assert_eq!(skip_reason(&svc("LoadBalancer", "10.0.0.9", vec![])), None);
    }

    #[test]
    fn spec_carries_ports_as_strings_and_timeouts() {
        let s = svc(
            "ClusterIP",
            "10.0.0.7",
            vec![
                port("http", 80, IntOrString::Int(8080)),
                port("named", 81, IntOrString::String("metrics".into())),
            ],
        );
        let spec = build(&s, &resolved()).expect("spec");
        assert_eq!(spec.ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(spec.ports[0].target_port, "8080");
        assert_eq!(spec.ports[1].target_port, "metrics");
        assert_eq!(spec.timeout_client_data, None, "0 means Octavia's default");
        assert_eq!(spec.timeout_member_data, Some(50_000));
        assert_eq!(spec.provider.as_deref(), Some("amphora"));
    }

    #[test]
    fn a_load_balancer_of_another_class_is_served_as_its_cluster_ip_only() {
        let mut s = svc(
            "LoadBalancer",
            "10.0.0.7",
            vec![port("a", 80, IntOrString::Int(80))],
        );
        assert_eq!(
            build(&s, &resolved()).unwrap().type_.as_deref(),
            Some("LoadBalancer")
        );
        if let Some(spec) = s.spec.as_mut() {
            spec.load_balancer_class = Some("metallb.io/metallb".into());
        }
        let spec = build(&s, &resolved()).unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.ports.len(), 1, "the cluster IP is still served");
    }

    #[test]
    fn bad_annotation_names_it() {
        let mut s = svc("ClusterIP", "10.0.0.7", vec![port("a", 80, IntOrString::Int(80))]);
        s.metadata.annotations = Some(
            [(
                annotations::LB_TIMEOUT_CLIENT_DATA.to_string(),
                "soon".to_string(),
            )]
            .into_iter()
            .collect(),
        );
        let e = build(&s, &resolved()).expect_err("bad timeout");
        assert!(e.to_string().contains(annotations::LB_TIMEOUT_CLIENT_DATA), "{e}");
        for (value, ok) in [
            ("86400000", true),
            ("86400001", false),
            ("-1", false),
            ("0", true),
        ] {
            s.metadata.annotations = Some(
                [(annotations::LB_TIMEOUT_MEMBER_DATA.to_string(), value.to_string())]
                    .into_iter()
                    .collect(),
            );
            match build(&s, &resolved()) {
                Ok(_) => assert!(ok, "{value} taken"),
                Err(e) => {
                    assert!(!ok, "{value}: {e}");
                    assert!(e.to_string().contains(annotations::LB_TIMEOUT_MEMBER_DATA), "{e}");
                    assert!(e.to_string().contains("86400000"), "{e}");
                }
            }
        }
    }

    #[test]
    fn traffic_policies_octavia_cannot_honour_are_named() {
        let mut s = svc(
            "LoadBalancer",
            "10.0.0.7",
            vec![port("a", 80, IntOrString::Int(80))],
        );
        assert!(
            unhonoured(&s, Some("amphora")).is_empty(),
            "Cluster is what a load balancer does"
        );
        if let Some(spec) = s.spec.as_mut() {
            spec.internal_traffic_policy = Some("Local".into());
            spec.external_traffic_policy = Some("Local".into());
        }
        let amphora = unhonoured(&s, Some("amphora"));
        let fields: Vec<_> = amphora
            .iter()
            .map(|u| u.message.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            fields,
            ["spec.internalTrafficPolicy", "spec.externalTrafficPolicy"],
            "{amphora:?}"
        );
        // The ovn provider keeps the client's address: externalTrafficPolicy Local holds.
        let ranges = {
            let mut r = s.clone();
            if let Some(spec) = r.spec.as_mut() {
                spec.load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into()]);
            }
            unhonoured(&r, Some("ovn"))
        };
        assert!(
            ranges
                .iter()
                .any(|u| u.message.starts_with("spec.loadBalancerSourceRanges")),
            "{ranges:?}"
        );
        let ovn = unhonoured(&s, Some("ovn"));
        assert_eq!(ovn.len(), 1, "{ovn:?}");
        assert_eq!(ovn[0].reason, "KuryrInternalTrafficPolicyUnsupported");
        // externalTrafficPolicy means nothing to a ClusterIP Service.
        if let Some(spec) = s.spec.as_mut() {
            spec.type_ = Some("ClusterIP".into());
            spec.internal_traffic_policy = None;
        }
        assert!(unhonoured(&s, Some("amphora")).is_empty());
    }

    #[test]
    fn endpoint_slices_do_not_count_as_a_service_change() {
        let s = svc("ClusterIP", "10.0.0.7", vec![port("a", 80, IntOrString::Int(80))]);
        let a = build(&s, &resolved()).expect("spec");
        let mut b = a.clone();
        b.endpoint_slices.push(Default::default());
        assert!(!service_part_differs(&a, &b));
        b.ports[0].port = 81;
        assert!(service_part_differs(&a, &b));
    }
}
