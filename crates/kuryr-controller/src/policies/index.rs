//! What the policy model reads about the cluster: namespaces and their labels, pods with their
//! labels, addresses and named container ports, and Services. Pure data, filled by the
//! handlers from watch events and by tests directly.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::selector::{Labels, Selector};
use super::spec::{Namespaces, Peer, Protocol};

/// `namespace/name` of a pod.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl PodKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// Which pod of that name this is: a deletion of its predecessor must not remove it.
    pub uid: Option<String>,
    pub labels: Labels,
    /// The pod's addresses (empty until it has some: such a pod is in no address group yet).
    pub ips: Vec<IpAddr>,
    /// Named container ports: (name, protocol, number).
    pub named_ports: Vec<(String, Protocol, u16)>,
}

impl PodInfo {
    pub fn from_pod(pod: &Pod) -> Self {
        // A finished pod's address is released (with pools, soon another pod's), and a host-network
        // pod's is its node's: neither may stand for the pod in a policy's peers.
        let finished = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let mut ips: Vec<IpAddr> = pod
            .status
            .iter()
            .filter(|_| !finished && !host_network)
            .flat_map(|s| {
                s.pod_ips
                    .iter()
                    .flatten()
                    .map(|p| p.ip.clone())
                    .chain(s.pod_ip.clone())
            })
            .filter_map(|ip| ip.parse().ok())
            .collect();
        ips.sort();
        ips.dedup();
        // A host-network pod has no Neutron port: a named port of its own would only make a
        // group variant no port ever uses (and cost a security group of the project's quota).
        let named_ports = pod
            .spec
            .iter()
            .filter(|_| !host_network)
            .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let name = p.name.clone()?;
                let proto = Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))?;
                let n = u16::try_from(p.container_port).ok()?;
                Some((name, proto, n))
            })
            .collect();
        Self {
            uid: pod.metadata.uid.clone(),
            labels: pod.labels().clone(),
            ips,
            named_ports,
        }
    }

    /// The number of the named port `name` for `proto`, if the pod declares it.
    pub fn resolve(&self, proto: Protocol, name: &str) -> Option<u16> {
        self.named_ports
            .iter()
            .find(|(n, p, _)| n == name && *p == proto)
            .map(|(_, _, num)| *num)
    }
}

/// A Service as the Service-VIP hook needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Cluster IPs / load balancer VIPs (headless Services have none).
    pub vips: Vec<IpAddr>,
    /// `spec.selector`; `None` for Services without one.
    pub selector: Option<Labels>,
    /// Its ports (a client reaches the VIP on these; the load balancer forwards to the target).
    pub ports: Vec<ServicePort>,
    /// The backends of a Service without a selector, from its EndpointSlices (whoever wrote
    /// them: `kubernetes.default`'s API servers, an external database); empty for the others,
    /// whose backends are the pods their selector picks.
    pub endpoints: Vec<Backend>,
}

/// One address behind a Service without a selector, with the ports its EndpointSlice gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    pub ip: IpAddr,
    /// (port name, protocol, number): the name is the Service port's it serves.
    pub ports: Vec<(String, Protocol, u16)>,
}

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// `ports[].name` (empty for a Service's one unnamed port): an EndpointSlice port serves
    /// the Service port of its name.
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    pub target: TargetPort,
}

/// Where a Service port forwards to on its backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPort {
    Number(u16),
    /// A named container port, resolved on each backend.
    Name(String),
}

impl ServicePort {
    /// The backend port this Service port forwards to on `pod`, when known there.
    pub fn target_on(&self, pod: &PodInfo) -> Option<u16> {
        match &self.target {
            TargetPort::Number(n) => Some(*n),
            TargetPort::Name(name) => pod.resolve(self.protocol, name),
        }
    }
}

impl ServiceInfo {
    pub fn from_service(svc: &Service) -> Self {
        let spec = svc.spec.as_ref();
        let vips = spec
            .iter()
            .flat_map(|s| s.cluster_ips.iter().flatten().chain(s.cluster_ip.iter()))
            .filter_map(|ip| ip.parse().ok())
            .collect::<std::collections::BTreeSet<IpAddr>>()
            .into_iter()
            .collect();
        let ports = spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .filter_map(|p| {
                let protocol = Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))?;
                let port = u16::try_from(p.port).ok()?;
                let target = match &p.target_port {
                    None => TargetPort::Number(port),
                    Some(IntOrString::Int(n)) => TargetPort::Number(u16::try_from(*n).ok()?),
                    Some(IntOrString::String(name)) => TargetPort::Name(name.clone()),
                };
                Some(ServicePort {
                    name: p.name.clone().unwrap_or_default(),
                    protocol,
                    port,
                    target,
                })
            })
            .collect();
        Self {
            vips,
            selector: spec.and_then(|s| s.selector.clone()).filter(|s| !s.is_empty()),
            ports,
            endpoints: Vec::new(),
        }
    }

    /// The backends of a Service without a selector: the ready addresses of `slices` (its
    /// EndpointSlices) with their slice's ports. A Service with a selector keeps none (its
    /// pods stand for them).
    pub fn with_endpoint_slices(mut self, slices: &[EndpointSlice]) -> Self {
        if self.selector.is_some() {
            return self;
        }
        let mut out: BTreeMap<IpAddr, Vec<(String, Protocol, u16)>> = BTreeMap::new();
        for slice in slices {
            let ports: Vec<(String, Protocol, u16)> = slice
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    let protocol = Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))?;
                    let port = u16::try_from(p.port?).ok()?;
                    Some((p.name.clone().unwrap_or_default(), protocol, port))
                })
                .collect();
            for ep in &slice.endpoints {
                if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                for ip in ep.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()) {
                    let have = out.entry(ip).or_default();
                    for p in &ports {
                        if !have.contains(p) {
                            have.push(p.clone());
                        }
                    }
                }
            }
        }
        self.endpoints = out.into_iter().map(|(ip, ports)| Backend { ip, ports }).collect();
        self
    }

    /// The port the backends of a Service without a selector serve `sp` on, at `b`.
    pub fn backend_port(sp: &ServicePort, b: &Backend) -> Option<u16> {
        b.ports
            .iter()
            .find(|(name, proto, _)| *name == sp.name && *proto == sp.protocol)
            .map(|(_, _, n)| *n)
    }
}

/// The cluster as the model sees it.
#[derive(Clone, Debug, Default)]
pub struct ClusterIndex {
    pub namespaces: BTreeMap<String, Labels>,
    pub pods: BTreeMap<PodKey, PodInfo>,
    /// (namespace, name) -> Service.
    pub services: BTreeMap<(String, String), ServiceInfo>,
}

impl ClusterIndex {
    pub fn set_namespace(&mut self, ns: &Namespace) {
        self.namespaces.insert(ns.name_any(), ns.labels().clone());
    }

    pub fn set_pod(&mut self, pod: &Pod) {
        let key = PodKey::new(pod.namespace().unwrap_or_default(), pod.name_any());
        self.pods.insert(key, PodInfo::from_pod(pod));
    }

    /// A pod seen by a watch: added or replaced; one being deleted is removed (it holds no
    /// address any more).
    pub fn observe_pod(&mut self, pod: &Pod) {
        if pod.metadata.deletion_timestamp.is_some() {
            self.remove_pod(pod);
        } else {
            self.set_pod(pod);
        }
    }

    /// Removes `pod`, not a pod of the same name that replaced it (a StatefulSet's): the pipeline
    /// keeps events of different uids apart, so the predecessor's deletion (or its retry) can come
    /// after its successor was seen.
    pub fn remove_pod(&mut self, pod: &Pod) {
        let key = PodKey::new(pod.namespace().unwrap_or_default(), pod.name_any());
        let same = |info: &PodInfo| match (&info.uid, &pod.metadata.uid) {
            (Some(have), Some(gone)) => have == gone,
            _ => true,
        };
        if self.pods.get(&key).is_some_and(same) {
            self.pods.remove(&key);
        }
    }

    /// The Services without a selector, with their backends.
    pub fn services_without_selector(&self) -> impl Iterator<Item = &ServiceInfo> {
        self.services
            .values()
            .filter(|s| s.selector.is_none() && !s.endpoints.is_empty())
    }

    pub fn namespace_matches(&self, scope: &Namespaces, ns: &str) -> bool {
        match scope {
            Namespaces::Own(own) => own == ns,
            // A namespace the index has not seen yet has no labels to match on.
            Namespaces::Matching(sel) => self.namespaces.get(ns).is_some_and(|l| sel.matches(l)),
        }
    }

    /// Pods a policy with `selector` in `namespace` applies to.
    pub fn selected<'a>(
        &'a self,
        namespace: &'a str,
        selector: &'a Selector,
    ) -> impl Iterator<Item = (&'a PodKey, &'a PodInfo)> + 'a {
        self.pods
            .iter()
            .filter(move |(k, p)| k.namespace == namespace && selector.matches(&p.labels))
    }

    /// Pods a pod peer designates (ipBlock peers designate no pod here).
    pub fn peer_pods<'a>(
        &'a self,
        peer: &'a Peer,
    ) -> Box<dyn Iterator<Item = (&'a PodKey, &'a PodInfo)> + 'a> {
        match peer {
            Peer::Pods { namespaces, pods } => Box::new(self.pods.iter().filter(move |(k, p)| {
                self.namespace_matches(namespaces, &k.namespace) && pods.matches(&p.labels)
            })),
            Peer::Block { .. } => Box::new(std::iter::empty()),
        }
    }

    /// The Services whose selector picks at least one of `pods`, each with the ones it picks.
    pub fn services_selecting<'a>(
        &'a self,
        pods: &'a [(&'a PodKey, &'a PodInfo)],
    ) -> impl Iterator<Item = (&'a ServiceInfo, Vec<&'a PodInfo>)> + 'a {
        self.services.iter().filter_map(move |((ns, _), svc)| {
            let sel = svc.selector.as_ref()?;
            let picked: Vec<&PodInfo> = pods
                .iter()
                .filter(|(k, p)| {
                    &k.namespace == ns && sel.iter().all(|(lk, lv)| p.labels.get(lk) == Some(lv))
                })
                .map(|(_, p)| *p)
                .collect();
            (!picked.is_empty()).then_some((svc, picked))
        })
    }

    /// VIPs of every Service of `namespace`.
    pub fn namespace_vips(&self, namespace: &str) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = self
            .services
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .flat_map(|(_, s)| s.vips.iter().copied())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}
