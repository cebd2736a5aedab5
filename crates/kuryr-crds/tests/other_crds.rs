//! Upstream-shaped KuryrNetwork, KuryrNetworkPolicy, KuryrLoadBalancer and
//! NetworkAttachmentDefinition objects deserialize and round-trip.

use kuryr_crds::crds::nad::NadError;
use kuryr_crds::{
    KuryrLoadBalancer, KuryrNetwork, KuryrNetworkPolicy, NadKuryrConfig, NetworkAttachmentDefinition,
};
use serde_json::json;

#[test]
fn kuryrnetwork_as_upstream_writes_it() -> Result<(), serde_json::Error> {
    let raw = json!({
        "apiVersion": "openstack.org/v1", "kind": "KuryrNetwork",
        "metadata": {"name": "ns1", "namespace": "ns1",
                     "finalizers": ["kuryrnetwork.finalizers.kuryr.openstack.org"]},
        "spec": {"nsName": "ns1", "projectId": "d85bdba083204fe2845349a86cb87d82",
                 "nsLabels": {"team": "a"}},
        "status": {"netId": "n1", "subnetId": "s1", "subnetCIDR": "10.0.1.0/24",
                   "routerId": "r1", "populated": true, "nsLabels": {"team": "a"}}
    });
    let kns: KuryrNetwork = serde_json::from_value(raw.clone())?;
    assert_eq!(kns.spec.ns_name, "ns1");
    assert_eq!(kns.spec.ns_labels.get("team").map(String::as_str), Some("a"));
    let status = kns
        .status
        .as_ref()
        .map(|s| (s.subnet_cidr.as_deref(), s.populated));
    assert_eq!(status, Some((Some("10.0.1.0/24"), Some(true))));
    assert_eq!(serde_json::to_value(&kns)?, raw);
    Ok(())
}

#[test]
fn kuryrnetworkpolicy_as_upstream_writes_it() -> Result<(), serde_json::Error> {
    let raw = json!({
        "apiVersion": "openstack.org/v1", "kind": "KuryrNetworkPolicy",
        "metadata": {"name": "allow-web", "namespace": "default",
                     "finalizers": ["kuryr.openstack.org/networkpolicy-finalizer"]},
        "spec": {
            "egressSgRules": [{"sgRule": {"description": "Kuryr-Kubernetes NetPolicy SG rule",
                                          "direction": "egress", "ethertype": "IPv4"}}],
            "ingressSgRules": [{
                "affectedPods": [{"podIP": "10.0.0.7", "podNamespace": "default"}],
                "namespace": "default",
                "sgRule": {"description": "Kuryr-Kubernetes NetPolicy SG rule",
                           "direction": "ingress", "ethertype": "IPv4",
                           "port_range_max": 8080, "port_range_min": 8080,
                           "protocol": "tcp", "remote_ip_prefix": "10.0.0.7"}}],
            "podSelector": {"matchLabels": {"app": "web"}},
            "policyTypes": ["Ingress", "Egress"]
        },
        "status": {
            "securityGroupId": "sg-1",
            "securityGroupRules": [{"id": "r-1", "direction": "egress", "ethertype": "IPv4",
                                    "security_group_id": "sg-1",
                                    "description": "Kuryr-Kubernetes NetPolicy SG rule"}],
            "podSelector": {"matchLabels": {"app": "web"}}
        }
    });
    let knp: KuryrNetworkPolicy = serde_json::from_value(raw.clone())?;
    assert_eq!(knp.spec.ingress_sg_rules[0].sg_rule.port_range_min, Some(8080));
    assert_eq!(
        knp.spec.ingress_sg_rules[0]
            .affected_pods
            .as_ref()
            .map(|p| p[0].pod_ip.as_str()),
        Some("10.0.0.7")
    );
    assert_eq!(
        knp.spec
            .pod_selector
            .match_labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .map(String::as_str),
        Some("web")
    );
    assert_eq!(serde_json::to_value(&knp)?, raw);
    Ok(())
}

#[test]
fn kuryrloadbalancer_as_upstream_writes_it() -> Result<(), serde_json::Error> {
    let raw = json!({
        "apiVersion": "openstack.org/v1", "kind": "KuryrLoadBalancer",
        "metadata": {"name": "web", "namespace": "default",
                     "finalizers": ["kuryr.openstack.org/kuryrloadbalancer-finalizers"]},
        "spec": {
            "endpointSlices": [{
                "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": true},
                               "targetRef": {"kind": "Pod", "name": "web-1",
                                             "namespace": "default", "uid": "u1"}}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}],
            "ip": "10.0.0.100",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "8080"}],
            "project_id": "p1", "security_groups_ids": ["sg-1"], "subnet_id": "s1",
            "type": "ClusterIP", "provider": "amphora", "timeout_client_data": 50000
        },
        "status": {
            "loadbalancer": {"id": "lb1", "ip": "10.0.0.100", "name": "default/web",
                             "port_id": "vip-port", "project_id": "p1", "provider": "amphora",
                             "security_groups": ["sg-1"], "subnet_id": "s1"},
            "listeners": [{"id": "l1", "loadbalancer_id": "lb1", "name": "default/web:TCP:80",
                           "port": 80, "project_id": "p1", "protocol": "TCP"}],
            "pools": [{"id": "pool1", "listener_id": "l1", "loadbalancer_id": "lb1",
                       "name": "default/web:TCP:80", "project_id": "p1", "protocol": "TCP"}],
            "members": [{"id": "m1", "ip": "10.0.0.7", "name": "default/web-1:8080",
                         "pool_id": "pool1", "port": 8080, "project_id": "p1",
                         "subnet_id": "s1"}]
        }
    });
    let klb: KuryrLoadBalancer = serde_json::from_value(raw.clone())?;
    assert_eq!(klb.spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(klb.spec.ports[0].target_port, "8080");
    let members = klb.status.as_ref().map(|s| s.members.len());
    assert_eq!(members, Some(1));
    assert_eq!(serde_json::to_value(&klb)?, raw);
    Ok(())
}

#[test]
fn nad_kuryr_config_annotation() -> Result<(), serde_json::Error> {
    let nad: NetworkAttachmentDefinition = serde_json::from_value(json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-a", "namespace": "default", "annotations": {
            "openstack.org/kuryr-config": "{\"subnetId\": \"s-a\", \"driverType\": \"neutron\"}"}},
        "spec": {"config": "{\"cniVersion\": \"0.3.1\", \"name\": \"net-a\", \"type\": \"kuryr-cni\"}"}
    }))?;
    let cfg = nad.kuryr_config();
    assert!(
        matches!(&cfg, Ok(NadKuryrConfig { subnet_id: Some(s), driver_type: Some(d) }) if s == "s-a" && d == "neutron"),
        "{cfg:?}"
    );
    // Upstream's documented NAD: no spec, no subnetId (the subnet comes from the configuration).
    let bare: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-c", "namespace": "default", "annotations": {
            "openstack.org/kuryr-config": "{\"driverType\": \"neutron\"}"}}
    }))?;
    let cfg = kuryr_crds::kuryr_config_of(&bare.metadata);
    assert!(
        matches!(&cfg, Ok(NadKuryrConfig { subnet_id: None, driver_type: Some(d) }) if d == "neutron"),
        "{cfg:?}"
    );

    let missing: NetworkAttachmentDefinition = serde_json::from_value(json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-b", "namespace": "default"}, "spec": {}
    }))?;
    let err = missing.kuryr_config().err();
    assert!(matches!(err, Some(NadError::MissingAnnotation { .. })), "{err:?}");
    assert!(err.is_some_and(|e| e.to_string().contains("default/net-b")));

    let bad: NetworkAttachmentDefinition = serde_json::from_value(json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-c", "namespace": "default",
                     "annotations": {"openstack.org/kuryr-config": "{\"subnetId\": 5}"}},
        "spec": {}
    }))?;
    let err = bad.kuryr_config().err().map(|e| e.to_string());
    assert!(err.as_deref().is_some_and(|e| e.contains("subnetId")), "{err:?}");
    Ok(())
}
