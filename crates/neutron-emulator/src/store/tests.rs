//! Unit tests of the store: its rules, without HTTP.

use std::collections::BTreeSet;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::{Activation, AgentHosts, Binding, Store};
use crate::error::{ApiError, Resource};
use crate::input::Obj;

const PROJECT: &str = "p1";

fn obj(v: Value) -> Obj {
    match v {
        Value::Object(o) => o,
        other => panic!("not an object: {other}"),
    }
}

fn id_of(v: &Value) -> String {
    v["id"].as_str().expect("rendered resource has an id").to_string()
}

/// A network with one IPv4 subnet; returns (network id, subnet id).
fn network(store: &mut Store, cidr: &str) -> (String, String) {
    let net = store
        .create_network(&json!({"network": {"name": "n", "project_id": PROJECT}}))
        .expect("network");
    let net_id = id_of(&net);
    let subnet = store
        .create_subnet(
            &json!({"subnet": {"network_id": net_id, "ip_version": 4, "cidr": cidr, "project_id": PROJECT}}),
        )
        .expect("subnet");
    (net_id, id_of(&subnet))
}

fn port_req(net_id: &str) -> Obj {
    obj(json!({"network_id": net_id, "project_id": PROJECT}))
}

fn port_with_ip(net_id: &str, subnet_id: &str, ip: &str) -> Obj {
    obj(json!({"network_id": net_id, "project_id": PROJECT,
               "fixed_ips": [{"subnet_id": subnet_id, "ip_address": ip}]}))
}

fn create_port(store: &mut Store, req: Obj) -> Result<String, ApiError> {
    let ids = store.create_ports(&[&req])?;
    Ok(ids.into_iter().next().expect("one id per request"))
}

fn port_ip(store: &Store, id: &str) -> String {
    store.render_port(id)["fixed_ips"][0]["ip_address"]
        .as_str()
        .expect("port has an address")
        .to_string()
}

#[test]
fn default_allocation_takes_pool_addresses_in_order_until_exhausted() {
    let mut store = Store::new(AgentHosts::Any);
    // /29: gateway .1, pool .2 - .6.
    let (net, _) = network(&mut store, "10.0.0.0/29");
    let mut ips = Vec::new();
    for _ in 0..5 {
        let id = create_port(&mut store, port_req(&net)).expect("port");
        ips.push(port_ip(&store, &id));
    }
    assert_eq!(ips, ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]);
    let e = create_port(&mut store, port_req(&net)).expect_err("pool is exhausted");
    assert_eq!(
        (e.status, e.kind.as_str()),
        (StatusCode::CONFLICT, "IpAddressGenerationFailure")
    );
}

#[test]
fn deleted_port_gives_its_address_and_mac_back() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, subnet) = network(&mut store, "10.0.1.0/29");
    let id = create_port(&mut store, port_with_ip(&net, &subnet, "10.0.1.4")).expect("port");
    let mac = store.ports[&id].mac.clone();
    let e = create_port(&mut store, port_with_ip(&net, &subnet, "10.0.1.4")).expect_err("address taken");
    assert_eq!(e.kind, "IpAddressAlreadyAllocated");
    store.delete_port(&id, None).expect("delete");
    let again =
        create_port(&mut store, port_with_ip(&net, &subnet, "10.0.1.4")).expect("address is free again");
    let mut req = port_req(&net);
    req.insert("mac_address".into(), json!(mac));
    create_port(&mut store, req).expect("mac is free again");
    assert_eq!(port_ip(&store, &again), "10.0.1.4");
}

#[test]
fn fixed_ip_outside_the_subnet_is_rejected() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, subnet) = network(&mut store, "10.0.2.0/24");
    let e = create_port(&mut store, port_with_ip(&net, &subnet, "10.9.9.9")).expect_err("outside");
    assert_eq!(
        (e.status, e.kind.as_str()),
        (StatusCode::BAD_REQUEST, "InvalidIpForSubnet")
    );
    assert!(store.ports.is_empty());
}

#[test]
fn slaac_subnet_gives_the_eui64_address_of_the_mac() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, _) = network(&mut store, "10.0.3.0/24");
    store
        .create_subnet(
            &json!({"subnet": {"network_id": net, "ip_version": 6, "cidr": "2001:db8::/64",
            "ipv6_address_mode": "slaac", "ipv6_ra_mode": "slaac", "project_id": PROJECT}}),
        )
        .expect("v6 subnet");
    let mut req = port_req(&net);
    req.insert("mac_address".into(), json!("fa:16:3e:16:e6:e0"));
    let id = create_port(&mut store, req).expect("port");
    let ips: BTreeSet<String> = store.render_port(&id)["fixed_ips"]
        .as_array()
        .expect("fixed_ips")
        .iter()
        .map(|f| f["ip_address"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        ips,
        BTreeSet::from(["10.0.3.2".into(), "2001:db8::f816:3eff:fe16:e6e0".into()])
    );
}

#[test]
fn bulk_create_is_all_or_nothing_on_an_address_conflict() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, subnet) = network(&mut store, "10.0.4.0/24");
    let first = port_with_ip(&net, &subnet, "10.0.4.10");
    let mut second = port_with_ip(&net, &subnet, "10.0.4.10");
    second.insert("mac_address".into(), json!("fa:16:3e:00:00:01"));
    let e = store
        .create_ports(&[&first, &second])
        .expect_err("second conflicts with first");
    assert_eq!(e.kind, "IpAddressAlreadyAllocated");
    assert!(store.ports.is_empty(), "no port of the failed bulk stays");
    // Neither the first port's address nor the second port's MAC stayed taken.
    let mut retry = port_with_ip(&net, &subnet, "10.0.4.10");
    retry.insert("mac_address".into(), json!("fa:16:3e:00:00:01"));
    create_port(&mut store, retry).expect("everything was given back");
}

#[test]
fn bulk_create_over_quota_creates_nothing() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, _) = network(&mut store, "10.0.5.0/24");
    store
        .quota_update(PROJECT, &json!({"quota": {"port": 2}}))
        .expect("quota");
    let reqs = [port_req(&net), port_req(&net), port_req(&net)];
    let refs: Vec<&Obj> = reqs.iter().collect();
    let e = store.create_ports(&refs).expect_err("3 ports > quota 2");
    assert_eq!((e.status, e.kind.as_str()), (StatusCode::CONFLICT, "OverQuota"));
    assert!(store.ports.is_empty());
    assert_eq!(store.quota_used(PROJECT, "port"), 0);
    store.create_ports(&refs[..2]).expect("2 ports fit");
    assert_eq!(store.quota_used(PROJECT, "port"), 2);
}

#[test]
fn quota_limits_are_per_project_and_validated() {
    let mut store = Store::new(AgentHosts::Any);
    store
        .quota_update(PROJECT, &json!({"quota": {"network": 1}}))
        .expect("quota");
    assert_eq!(store.quota_limit(PROJECT, "network"), 1);
    assert_eq!(store.quota_limit("other", "network"), 100, "neutron's default");
    network(&mut store, "10.0.6.0/24");
    let e = store
        .create_network(&json!({"network": {"project_id": PROJECT}}))
        .expect_err("over quota");
    assert_eq!(e.kind, "OverQuota");
    assert_eq!(e.message, "Quota exceeded for resources: ['network'].");
    store
        .create_network(&json!({"network": {"project_id": "other"}}))
        .expect("another project has its own quota");
    let details = store.quota_details_json(PROJECT);
    assert_eq!(details["network"], json!({"limit": 1, "used": 1, "reserved": 0}));
    assert_eq!(
        details["security_group"]["used"], 1,
        "the default group, created with the first network"
    );
    let e = store
        .quota_update(PROJECT, &json!({"quota": {"port": -2}}))
        .expect_err("below -1");
    assert_eq!(e.status, StatusCode::BAD_REQUEST);
    let e = store
        .quota_update(PROJECT, &json!({"quota": {"widgets": 1}}))
        .expect_err("unknown key");
    assert_eq!(e.status, StatusCode::BAD_REQUEST);
    store.quota_delete(PROJECT);
    assert_eq!(store.quota_limit(PROJECT, "network"), 100);
}

#[test]
fn if_match_must_name_the_current_revision() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, _) = network(&mut store, "10.0.7.0/24");
    let id = create_port(&mut store, port_req(&net)).expect("port");
    let rev = store.ports[&id].std.revision;
    let e = store
        .update_port(&id, &json!({"port": {"name": "x"}}), Some(rev + 1))
        .expect_err("stale");
    assert_eq!(
        (e.status, e.kind.as_str()),
        (StatusCode::PRECONDITION_FAILED, "RevisionNumberConstraintFailed")
    );
    assert_eq!(store.ports[&id].std.name, "", "nothing changed");
    let v = store
        .update_port(&id, &json!({"port": {"name": "x"}}), Some(rev))
        .expect("current revision");
    assert_eq!(v["revision_number"], json!(rev + 1));
    let e = store.delete_port(&id, Some(rev)).expect_err("stale delete");
    assert_eq!(e.status, StatusCode::PRECONDITION_FAILED);
    assert!(store.ports.contains_key(&id));
    // The generic update path checks other resources the same way.
    let net_rev = store.networks[&net].std.revision;
    let e = store
        .update(
            Resource::Network,
            &net,
            &json!({"network": {"name": "y"}}),
            Some(net_rev + 5),
        )
        .expect_err("stale network");
    assert_eq!(e.status, StatusCode::PRECONDITION_FAILED);
    store
        .update(
            Resource::Network,
            &net,
            &json!({"network": {"name": "y"}}),
            Some(net_rev),
        )
        .expect("current network revision");
    assert_eq!(store.networks[&net].std.name, "y");
}

#[test]
fn binding_follows_the_agent_hosts_and_activation_ignores_stale_generations() {
    let mut store = Store::new(AgentHosts::Only(BTreeSet::from(["node-1".to_string()])));
    let (net, _) = network(&mut store, "10.0.8.0/24");
    let mut req = port_req(&net);
    req.insert("binding:host_id".into(), json!("node-2"));
    let failed = create_port(&mut store, req).expect("port");
    assert_eq!(store.binding(&store.ports[&failed]), Binding::Failed);
    assert_eq!(store.render_port(&failed)["binding:vif_type"], "binding_failed");
    assert!(store.activations.is_empty(), "a failed binding never goes ACTIVE");

    let mut req = port_req(&net);
    req.insert("binding:host_id".into(), json!("node-1"));
    let bound = create_port(&mut store, req).expect("port");
    assert_eq!(store.binding(&store.ports[&bound]), Binding::Ovs);
    let scheduled = std::mem::take(&mut store.activations);
    assert_eq!(
        scheduled,
        [Activation::Port {
            id: bound.clone(),
            generation: 0
        }]
    );
    // Rebinding before the agent answered makes the scheduled activation stale.
    store
        .update_port(&bound, &json!({"port": {"binding:host_id": ""}}), None)
        .expect("unbind");
    store.activate(&scheduled[0]);
    assert_eq!(store.ports[&bound].status, "DOWN");
    store
        .update_port(&bound, &json!({"port": {"binding:host_id": "node-1"}}), None)
        .expect("rebind");
    let current = std::mem::take(&mut store.activations);
    assert_eq!(current.len(), 1);
    store.activate(&current[0]);
    assert_eq!(store.ports[&bound].status, "ACTIVE");
}

#[test]
fn trunk_ports_cannot_be_deleted_or_reused() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, _) = network(&mut store, "10.0.9.0/24");
    let parent = create_port(&mut store, port_req(&net)).expect("parent");
    let sub = create_port(&mut store, port_req(&net)).expect("subport");
    let trunk = store
        .create_trunk(&json!({"trunk": {"port_id": parent, "project_id": PROJECT,
            "sub_ports": [{"port_id": sub, "segmentation_type": "vlan", "segmentation_id": 10}]}}))
        .expect("trunk");
    let trunk_id = id_of(&trunk);
    assert_eq!(
        store.delete_port(&parent, None).expect_err("parent").kind,
        "PortInUseAsTrunkParent"
    );
    assert_eq!(
        store.delete_port(&sub, None).expect_err("subport").kind,
        "PortInUseAsSubPort"
    );
    let other = create_port(&mut store, port_req(&net)).expect("other parent");
    let e = store
        .create_trunk(&json!({"trunk": {"port_id": other,
            "sub_ports": [{"port_id": sub, "segmentation_type": "vlan", "segmentation_id": 11}]}}))
        .expect_err("subport of another trunk");
    assert_eq!(e.kind, "TrunkPortInUse");
    let extra = create_port(&mut store, port_req(&net)).expect("extra");
    let e = store
        .add_subports(
            &trunk_id,
            &json!({"sub_ports": [{"port_id": extra, "segmentation_type": "vlan", "segmentation_id": 10}]}),
        )
        .expect_err("VLAN 10 is taken on this trunk");
    assert_eq!(e.kind, "DuplicateSubPort");
    store.delete_trunk(&trunk_id).expect("unbound trunk");
    store.delete_port(&sub, None).expect("no longer a subport");
    store.delete_port(&parent, None).expect("no longer a parent");
}

#[test]
fn network_with_ports_cannot_be_deleted_and_subnets_go_with_it() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, subnet) = network(&mut store, "10.0.10.0/24");
    let port = create_port(&mut store, port_req(&net)).expect("port");
    let e = store.delete_network(&net).expect_err("in use");
    assert_eq!(
        (e.status, e.kind.as_str()),
        (StatusCode::CONFLICT, "NetworkInUse")
    );
    assert!(e.message.contains(&port));
    assert_eq!(
        store.delete_subnet(&subnet).expect_err("in use").kind,
        "SubnetInUse"
    );
    store.delete_port(&port, None).expect("port");
    store.delete_network(&net).expect("network");
    assert!(store.subnets.is_empty());
}

#[test]
fn subnet_overlap_and_pool_allocation() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, _) = network(&mut store, "10.1.0.0/24");
    let e = store
        .create_subnet(&json!({"subnet": {"network_id": net, "ip_version": 4, "cidr": "10.1.0.128/25"}}))
        .expect_err("overlaps");
    assert_eq!(e.kind, "InvalidInput");
    let pool = store
        .create_subnetpool(
            &json!({"subnetpool": {"name": "p", "prefixes": ["10.2.0.0/16"], "default_prefixlen": 24}}),
        )
        .expect("pool");
    let pool_id = id_of(&pool);
    let cidrs: Vec<String> = (0..2)
        .map(|_| {
            let s = store
                .create_subnet(
                    &json!({"subnet": {"network_id": net, "ip_version": 4, "subnetpool_id": pool_id}}),
                )
                .expect("subnet from the pool");
            s["cidr"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert_eq!(cidrs, ["10.2.0.0/24", "10.2.1.0/24"]);
    assert_eq!(
        store.delete_subnetpool(&pool_id).expect_err("in use").kind,
        "SubnetPoolInUse"
    );
}

#[test]
fn security_group_rules_are_unique_and_groups_in_use_stay() {
    let mut store = Store::new(AgentHosts::Any);
    let sg = store
        .create_security_group(&json!({"security_group": {"name": "web", "project_id": PROJECT}}))
        .expect("sg");
    let sg_id = id_of(&sg);
    assert_eq!(
        sg["security_group_rules"].as_array().map(Vec::len),
        Some(2),
        "two default egress rules"
    );
    let rule = json!({"security_group_rule": {"security_group_id": sg_id, "direction": "ingress",
        "protocol": "tcp", "port_range_min": 80, "port_range_max": 80, "project_id": PROJECT}});
    store.create_sg_rule(&rule).expect("rule");
    assert_eq!(
        store.create_sg_rule(&rule).expect_err("duplicate").kind,
        "SecurityGroupRuleExists"
    );
    let (net, _) = network(&mut store, "10.0.11.0/24");
    let mut req = port_req(&net);
    req.insert("security_groups".into(), json!([sg_id]));
    let port = create_port(&mut store, req).expect("port");
    assert_eq!(
        store.delete_security_group(&sg_id).expect_err("in use").kind,
        "SecurityGroupInUse"
    );
    store.delete_port(&port, None).expect("port");
    store.delete_security_group(&sg_id).expect("sg");
    assert!(
        store.sg_rules.values().all(|r| r.security_group_id != sg_id),
        "rules go with the group"
    );
}

#[test]
fn address_pairs_default_to_the_port_mac_and_need_port_security() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, _) = network(&mut store, "10.0.12.0/24");
    let id = create_port(&mut store, port_req(&net)).expect("port");
    let mac = store.ports[&id].mac.clone();
    let v = store
        .update_port(
            &id,
            &json!({"port": {"allowed_address_pairs": [
                {"ip_address": "10.0.12.200"},
                {"ip_address": "10.0.12.0/28", "mac_address": "FA:16:3E:00:00:01"},
                {"ip_address": "10.0.12.200"}]}}),
            None,
        )
        .expect("pairs");
    assert_eq!(
        v["allowed_address_pairs"],
        json!([{"mac_address": "fa:16:3e:00:00:01", "ip_address": "10.0.12.0/28"},
               {"mac_address": mac, "ip_address": "10.0.12.200"}]),
        "sorted by MAC, duplicates dropped"
    );
    let e = store
        .update_port(
            &id,
            &json!({"port": {"port_security_enabled": false, "security_groups": []}}),
            None,
        )
        .expect_err("pairs need port security");
    assert_eq!(e.kind, "AddressPairAndPortSecurityRequired");
    let e = store
        .update_port(
            &id,
            &json!({"port": {"allowed_address_pairs": [{"mac_address": mac}]}}),
            None,
        )
        .expect_err("no ip_address");
    assert_eq!(e.kind, "AllowedAddressPairsMissingIP");
}

#[test]
fn extra_dhcp_opts_get_an_ip_version_and_need_a_value() {
    let mut store = Store::new(AgentHosts::Any);
    let (net, _) = network(&mut store, "10.0.13.0/24");
    let mut req = port_req(&net);
    req.insert(
        "extra_dhcp_opts".into(),
        json!([{"opt_name": "mtu", "opt_value": "1400"}, {"opt_name": "dns-server", "opt_value": "::1", "ip_version": 6}]),
    );
    let id = create_port(&mut store, req).expect("port");
    assert_eq!(
        store.render_port(&id)["extra_dhcp_opts"],
        json!([{"opt_name": "mtu", "opt_value": "1400", "ip_version": 4},
               {"opt_name": "dns-server", "opt_value": "::1", "ip_version": 6}])
    );
    let mut bad = port_req(&net);
    bad.insert("extra_dhcp_opts".into(), json!([{"opt_name": "mtu"}]));
    let e = create_port(&mut store, bad).expect_err("no opt_value");
    assert_eq!(
        (e.kind.as_str(), e.message.as_str()),
        (
            "InvalidInput",
            "Invalid input for operation: No valid key specs matched for: {'opt_name': 'mtu'}."
        )
    );
}
