//! Builders of KuryrPorts as the controller writes them, for tests, the
//! bench and the sandbox (no Kubernetes API involved).

use std::collections::BTreeMap;
use std::net::IpAddr;

use kuryr_crds::vif::{FixedIp, Network, PortProfile, Subnet, VifBase, VifBridge, VifOpenVSwitch};
use kuryr_crds::{KuryrPort, KuryrPortSpec, KuryrPortStatus, KuryrPortVif, Vif};

/// One VIF to put in `status.vifs`.
#[derive(Clone, Debug)]
pub struct VifFixture {
    pub ifname: String,
    pub port_id: String,
    pub mac: String,
    /// `(cidr, ip, gateway)` per subnet.
    pub subnets: Vec<(String, IpAddr, Option<IpAddr>)>,
    pub bridge: String,
    pub mtu: Option<u32>,
    pub active: bool,
}

impl VifFixture {
    /// A VIFBridge (veth on a Linux bridge) VIF.
    pub fn to_vif(&self) -> Vif {
        let base = self.base("bridge");
        Vif::Bridge(VifBridge {
            base,
            bridge_name: Some(self.bridge.clone()),
            obj: Default::default(),
        })
    }

    /// A VIFOpenVSwitch (veth on an OVS bridge) VIF, as for a port the
    /// Neutron OVS agent or OVN binds.
    pub fn to_ovs_vif(&self) -> Vif {
        let mut base = self.base("ovs");
        base.port_profile = Some(PortProfile::open_vswitch(self.port_id.clone()));
        Vif::OpenVSwitch(VifOpenVSwitch {
            base,
            bridge_name: Some(self.bridge.clone()),
            obj: Default::default(),
        })
    }

    fn base(&self, plugin: &str) -> VifBase {
        let mut base = VifBase::new(self.port_id.clone(), plugin);
        base.address = Some(self.mac.clone());
        base.active = self.active;
        let mut net = Network::new(format!("net-{}", self.port_id));
        net.mtu = self.mtu;
        net.bridge = Some(self.bridge.clone());
        let subnets: Vec<Subnet> = self
            .subnets
            .iter()
            .map(|(cidr, ip, gw)| {
                let mut s = Subnet::new(cidr.clone(), *gw);
                s.ips = vec![FixedIp::new(*ip)].into();
                s
            })
            .collect();
        net.subnets = subnets.into();
        base.network = Some(net);
        base
    }
}

/// A KuryrPort for pod `namespace/name` on `node` with the given VIFs; the
/// first one is the default (eth0).
pub fn kuryrport(namespace: &str, name: &str, pod_uid: &str, node: &str, vifs: &[VifFixture]) -> KuryrPort {
    let vifs: Vec<(String, Vif)> = vifs.iter().map(|f| (f.ifname.clone(), f.to_vif())).collect();
    kuryrport_of(namespace, name, pod_uid, node, vifs)
}

/// [`kuryrport`] with VIFs of any kind, by interface name.
pub fn kuryrport_of(
    namespace: &str,
    name: &str,
    pod_uid: &str,
    node: &str,
    vifs: Vec<(String, Vif)>,
) -> KuryrPort {
    let mut kp = KuryrPort::new(
        name,
        KuryrPortSpec {
            pod_uid: pod_uid.to_string(),
            pod_node_name: node.to_string(),
            pod_static: false,
        },
    );
    kp.metadata.namespace = Some(namespace.to_string());
    let mut labels = BTreeMap::new();
    labels.insert(kuryr_crds::names::labels::NODE_NAME.to_string(), node.to_string());
    kp.metadata.labels = Some(labels);
    let vifs: BTreeMap<String, KuryrPortVif> = vifs
        .into_iter()
        .enumerate()
        .map(|(i, (ifname, vif))| (ifname, KuryrPortVif::new(i == 0, vif)))
        .collect();
    kp.status = Some(KuryrPortStatus { vifs });
    kp
}
