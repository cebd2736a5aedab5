//! The real OpenStack dataplane: the controller (neutron-vif) and one CNI daemon per chassis of
//! the OVN lab (`scripts/ovn-lab/ovn-lab.sh`: ML2/OVN neutron-server, two userspace-OVS chassis
//! joined by geneve). Pods are wired through the real `kuryr-cni` binary with the daemon's Open
//! vSwitch binding; their ports go ACTIVE because ovn-controller claimed them, and what is probed
//! between them (ICMP, TCP, UDP) crosses OVN's flows, security-group ACLs and the geneve tunnel.
//!
//! Needs `KURYR_TEST_OVN_NEUTRON_URL` (the lab's API) and `KURYR_TEST_OVN_LAB` (its state
//! directory); without them every test prints why it skips, unless `KURYR_TEST_REQUIRE_OVN=1`
//! (scripts/test-all.sh), which makes a missing lab an error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::IpAddr;
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kuryr_neutron::NeutronClient;
use support::ovn_lab::*;
use support::probe::{Expect, Probe, Proto, Server, check_all};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_pods_on_two_chassis_reach_each_other_over_geneve_and_a_deleted_pod_is_gone() -> Result<()> {
    on_lab!(&["10.81.0.0/24"], |lab, fx| {
        allow(lab.client(), &fx, None, None, "IPv4").await?;
        let kube = start_kube().await?;
        let _ctrl = start_controller(&kube.client, &lab.target, controller_config(&fx, ""));
        create_namespace(&kube.client, NS).await?;
        let nodes = lab.nodes(&kube).await?;
        let mut pods = Vec::new();
        for i in 0..4 {
            pods.push(wire(lab, &kube, &nodes, &format!("pod-{i}"), i % 2).await?);
        }
        let servers = pods
            .iter()
            .map(|p| Server::start(&p.path(), APP_PORT))
            .collect::<Result<Vec<_>>>()?;
        let all: Vec<&Wired> = pods.iter().collect();
        let t = Instant::now();
        check_all(&full_mesh(&all, Expect::Open), PROBE_DEADLINE)?;
        eprintln!(
            "4 pods on 2 chassis: CNI ADD {:?}; every pair answered ICMP, TCP and UDP within {:?}",
            pods.iter().map(|p| p.add_latency).collect::<Vec<_>>(),
            t.elapsed()
        );

        // A deleted pod loses its port (Neutron, OVN, OVS) and with it its connectivity.
        let gone = pods.remove(3);
        let gone_ip = gone.ip();
        remove(lab, &kube, &nodes, &gone).await?;
        let rest: Vec<&Wired> = pods.iter().collect();
        check_all(&full_mesh(&rest, Expect::Open), PROBE_DEADLINE)?;
        check_all(
            &[Probe::new(
                "pod-0 -> deleted pod-3",
                &pods[0].path(),
                Proto::Icmp,
                gone_ip,
                0,
                Expect::Closed,
            )],
            BLOCKED_FOR,
        )?;
        drop(servers);
        for p in &pods {
            remove(lab, &kube, &nodes, p).await?;
        }
        assert_all_gone(lab, &kube, &fx, &nodes).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn security_group_without_an_ingress_rule_for_tcp_80_blocks_it_and_allows_the_allowed_port()
-> Result<()> {
    on_lab!(&["10.82.0.0/24"], |lab, fx| {
        // The pods' group: ICMP and TCP 8080 in, nothing for 80.
        allow(lab.client(), &fx, Some("icmp"), None, "IPv4").await?;
        allow(lab.client(), &fx, Some("tcp"), Some(u32::from(APP_PORT)), "IPv4").await?;
        let kube = start_kube().await?;
        let _ctrl = start_controller(&kube.client, &lab.target, controller_config(&fx, ""));
        create_namespace(&kube.client, NS).await?;
        let nodes = lab.nodes(&kube).await?;
        let client = wire(lab, &kube, &nodes, "client", 0).await?;
        let web = wire(lab, &kube, &nodes, "web", 1).await?;
        let _s80 = Server::start(&web.path(), 80)?;
        let _s8080 = Server::start(&web.path(), APP_PORT)?;
        let probe = |port: u16, expect: Expect| {
            Probe::new(
                format!("client -> web:{port}"),
                &client.path(),
                Proto::Tcp,
                web.ip(),
                port,
                expect,
            )
        };
        check_all(
            &[
                Probe::new(
                    "client -> web (icmp)",
                    &client.path(),
                    Proto::Icmp,
                    web.ip(),
                    0,
                    Expect::Open,
                ),
                probe(APP_PORT, Expect::Open),
            ],
            PROBE_DEADLINE,
        )?;
        // Only now that the allowed port answers does a silent 80 mean the ACL dropped it.
        check_all(&[probe(80, Expect::Closed)], BLOCKED_FOR)?;
        // The rule, not the server, made the difference: allowing 80 opens it.
        allow(lab.client(), &fx, Some("tcp"), Some(80), "IPv4").await?;
        check_all(&[probe(80, Expect::Open)], PROBE_DEADLINE)?;
        remove(lab, &kube, &nodes, &client).await?;
        remove(lab, &kube, &nodes, &web).await?;
        assert_all_gone(lab, &kube, &fx, &nodes).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_restart_keeps_pods_connected_and_del_after_it_removes_ovs_and_neutron_ports() -> Result<()> {
    on_lab!(&["10.83.0.0/24"], |lab, fx| {
        allow(lab.client(), &fx, None, None, "IPv4").await?;
        let kube = start_kube().await?;
        let _ctrl = start_controller(&kube.client, &lab.target, controller_config(&fx, ""));
        create_namespace(&kube.client, NS).await?;
        let mut nodes = lab.nodes(&kube).await?;
        let a = wire(lab, &kube, &nodes, "old-a", 0).await?;
        let b = wire(lab, &kube, &nodes, "old-b", 1).await?;
        let c = wire(lab, &kube, &nodes, "old-c", 0).await?;
        let _servers = [&a, &b, &c]
            .iter()
            .map(|p| Server::start(&p.path(), APP_PORT))
            .collect::<Result<Vec<_>>>()?;
        check_all(&full_mesh(&[&a, &b, &c], Expect::Open), PROBE_DEADLINE)?;

        // The dataplane does not depend on the daemon ...
        nodes[0].stop_daemon().await?;
        check_all(&full_mesh(&[&a, &b, &c], Expect::Open), PROBE_DEADLINE)
            .context("daemon of k8s-node-1 down")?;
        // ... nor does a restarted daemon disturb what its predecessor plugged.
        nodes[0].start_daemon().await?;
        check_all(&full_mesh(&[&a, &b, &c], Expect::Open), PROBE_DEADLINE).context("after the restart")?;
        ensure!(
            nodes[0].ovs_ports()?.len() == 2,
            "k8s-node-1 has OVS ports {:?} after the restart",
            nodes[0].ovs_ports()?
        );

        // A new pod on the restarted daemon joins the others.
        let d = wire(lab, &kube, &nodes, "new-d", 0).await?;
        let _sd = Server::start(&d.path(), APP_PORT)?;
        check_all(&full_mesh(&[&a, &b, &c, &d], Expect::Open), PROBE_DEADLINE)?;

        // Deleting a pod the previous daemon plugged: its OVS and Neutron ports go, the rest stays.
        remove(lab, &kube, &nodes, &c).await?;
        check_all(&full_mesh(&[&a, &b, &d], Expect::Open), PROBE_DEADLINE)?;
        check_all(
            &[Probe::new(
                "old-b -> deleted old-c",
                &b.path(),
                Proto::Icmp,
                c.ip(),
                0,
                Expect::Closed,
            )],
            BLOCKED_FOR,
        )?;
        for p in [&a, &b, &d] {
            remove(lab, &kube, &nodes, p).await?;
        }
        assert_all_gone(lab, &kube, &fx, &nodes).await
    })
}

/// An IPv6 subnet (static addresses, as kuryr plugs them) on `network` of the fixture's project.
async fn v6_subnet(client: &NeutronClient, fx: &NeutronFixture, network: &str, cidr: &str) -> Result<String> {
    let s = client
        .create_subnet(&kuryr_neutron::SubnetCreate {
            network_id: network.to_string(),
            ip_version: 6,
            cidr: Some(cidr.into()),
            project_id: Some(fx.project.clone()),
            name: Some("pods-v6".into()),
            ..Default::default()
        })
        .await?;
    Ok(s.id)
}

/// The controller's config with `[neutron_defaults] pod_subnets` (every pod subnet, one network).
fn config_with_subnets(fx: &NeutronFixture, subnets: &[&str]) -> std::sync::Arc<kuryr_config::KuryrConfig> {
    kuryr_testbed::config(&format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
         cluster_id = e2e-{}\n\
         [neutron_defaults]\nproject = {}\npod_subnets = {}\npod_security_groups = {}\nresource_tags = k8s,e2e\n",
        &fx.project[fx.project.len() - 8..],
        fx.project,
        subnets.join(","),
        fx.sg
    ))
}

/// Every ICMP/TCP/UDP probe between the pods, over every address family they have.
async fn pods_talk_over_each_family(lab: &Lab, kube: &Kube, nodes: &[Node; 2], want: &[bool]) -> Result<()> {
    let a = wire(lab, kube, nodes, "pod-a", 0).await?;
    let b = wire(lab, kube, nodes, "pod-b", 1).await?;
    for p in [&a, &b] {
        let families: Vec<bool> = p.ips.iter().map(IpAddr::is_ipv6).collect();
        ensure!(
            families == want,
            "{}: addresses {:?}, wanted IPv6 flags {want:?}",
            p.name(),
            p.ips
        );
    }
    let _servers = [&a, &b]
        .iter()
        .map(|p| Server::start(&p.path(), APP_PORT))
        .collect::<Result<Vec<_>>>()?;
    check_all(&full_mesh(&[&a, &b], Expect::Open), PROBE_DEADLINE)?;
    remove(lab, kube, nodes, &a).await?;
    remove(lab, kube, nodes, &b).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dual_stack_pods_on_two_chassis_talk_over_ipv4_and_ipv6() -> Result<()> {
    on_lab!(&["10.84.0.0/24"], |lab, fx| {
        allow(lab.client(), &fx, None, None, "IPv4").await?;
        allow(lab.client(), &fx, None, None, "IPv6").await?;
        let v6 = v6_subnet(lab.client(), &fx, &fx.network, "fd00:84::/64").await?;
        let kube = start_kube().await?;
        let _ctrl = start_controller(
            &kube.client,
            &lab.target,
            config_with_subnets(&fx, &[&fx.subnet, &v6]),
        );
        create_namespace(&kube.client, NS).await?;
        let nodes = lab.nodes(&kube).await?;
        pods_talk_over_each_family(lab, &kube, &nodes, &[false, true]).await?;
        assert_all_gone(lab, &kube, &fx, &nodes).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ipv6_only_pods_on_two_chassis_talk() -> Result<()> {
    on_lab!(&["10.85.0.0/24"], |lab, fx| {
        allow(lab.client(), &fx, None, None, "IPv6").await?;
        let net = lab
            .client()
            .create_network(&kuryr_neutron::NetworkCreate {
                name: Some("pods-v6-only".into()),
                project_id: Some(fx.project.clone()),
                ..Default::default()
            })
            .await?;
        let v6 = v6_subnet(lab.client(), &fx, &net.id, "fd00:85::/64").await?;
        let kube = start_kube().await?;
        let _ctrl = start_controller(&kube.client, &lab.target, config_with_subnets(&fx, &[&v6]));
        create_namespace(&kube.client, NS).await?;
        let nodes = lab.nodes(&kube).await?;
        pods_talk_over_each_family(lab, &kube, &nodes, &[true]).await?;
        assert_all_gone(lab, &kube, &fx, &nodes).await
    })
}

/// Pods in two namespaces, each namespace with its own network and subnet (the `namespace`
/// subnets driver) joined by the Neutron router, on the two chassis: traffic between them is
/// routed by OVN's logical router. Run with the `noop` and the `neutron` (port pool) VIF pool
/// drivers: pooled ports, bound before any pod exists, must work the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_subnets_route_between_namespaces_with_and_without_port_pools() -> Result<()> {
    use kuryr_crds::KuryrNetwork;
    use kuryr_neutron::{RouterCreate, SubnetPoolCreate};

    on_lab!(&["10.86.0.0/24"], |lab, fx| {
        allow(lab.client(), &fx, None, None, "IPv4").await?;
        let client = lab.client();
        let subnetpool = client
            .create_subnetpool(&SubnetPoolCreate {
                name: "ns-pool".into(),
                prefixes: vec!["10.87.0.0/16".into()],
                default_prefixlen: Some(26),
                project_id: Some(fx.project.clone()),
                ..Default::default()
            })
            .await?;
        let router = client
            .create_router(&RouterCreate {
                name: Some("pods".into()),
                project_id: Some(fx.project.clone()),
                ..Default::default()
            })
            .await?;
        let result: Result<()> = async {
            for pool in ["noop", "neutron"] {
                let kube = start_kube().await?;
                let cfg = kuryr_testbed::config(&format!(
                    "[kubernetes]\nenabled_handlers = vif,kuryrport,namespace,kuryrnetwork\n\
                     pod_subnets_driver = namespace\npod_vif_driver = neutron-vif\nvif_pool_driver = {pool}\n\
                     cluster_id = e2e-{pool}-{}\n\
                     [namespace_subnet]\npod_router = {}\npod_subnet_pool = {}\n\
                     [vif_pool]\nports_pool_batch = 2\nports_pool_min = 1\nports_pool_update_frequency = 2\n\
                     [neutron_defaults]\nproject = {}\npod_security_groups = {}\nresource_tags = k8s,e2e\n",
                    &fx.project[fx.project.len() - 8..],
                    router.id,
                    subnetpool.id,
                    fx.project,
                    fx.sg
                ));
                let ctrl = start_controller(&kube.client, &lab.target, cfg);
                let nodes = lab.nodes(&kube).await?;
                let (ns_a, ns_b) = (format!("team-a-{pool}"), format!("team-b-{pool}"));
                create_namespace(&kube.client, &ns_a).await?;
                create_namespace(&kube.client, &ns_b).await?;
                let a = wire_in(lab, &kube, &nodes, &ns_a, "a", 0).await.context(pool)?;
                let b = wire_in(lab, &kube, &nodes, &ns_b, "b", 1).await.context(pool)?;
                let a2 = wire_in(lab, &kube, &nodes, &ns_a, "a2", 1).await.context(pool)?;
                // Each namespace on its own network (a and a2 share theirs).
                let net = |w: &Wired| {
                    let id = w.port_id.clone();
                    async move { Ok::<_, anyhow::Error>(client.get_port(&id).await?.network_id) }
                };
                let (net_a, net_b, net_a2) = (net(&a).await?, net(&b).await?, net(&a2).await?);
                ensure!(
                    net_a != net_b && net_a == net_a2,
                    "{pool}: networks a={net_a} b={net_b} a2={net_a2}"
                );
                let _servers = [&a, &b, &a2]
                    .iter()
                    .map(|p| Server::start(&p.path(), APP_PORT))
                    .collect::<Result<Vec<_>>>()?;
                check_all(&full_mesh(&[&a, &b, &a2], Expect::Open), PROBE_DEADLINE)
                    .with_context(|| format!("routed between namespaces ({pool} pool)"))?;
                for w in [&a, &b, &a2] {
                    cni_del(&nodes[w.node], &w.sandbox).await?;
                    Api::<Pod>::namespaced(kube.client.clone(), &w.sandbox.namespace)
                        .delete(w.name(), &DeleteParams::default())
                        .await?;
                }
                // Deleting the namespaces releases their networks (and router interfaces).
                for (ns, net) in [(&ns_a, &net_a), (&ns_b, &net_b)] {
                    Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.client.clone())
                        .delete(ns, &DeleteParams::default())
                        .await?;
                    let kns: Api<KuryrNetwork> = Api::namespaced(kube.client.clone(), ns);
                    eventually("the namespace's network deleted", WAIT, || async {
                        let gone = match client.get_network(net).await {
                            Err(e) if e.is_not_found() => true,
                            Err(e) => return Err(e.into()),
                            Ok(_) => false,
                        };
                        Ok((gone && kns.get_opt(ns).await?.is_none()).then_some(()))
                    })
                    .await
                    .with_context(|| format!("{pool}: namespace {ns}"))?;
                }
                ctrl.shutdown().await?;
                for n in &nodes {
                    let left = n.ovs_ports()?;
                    ensure!(left.is_empty(), "{pool}: {}: OVS ports left: {left:?}", n.name);
                }
            }
            Ok(())
        }
        .await;
        // After a failure the namespaces' networks may still hang on the router: detach them so
        // cleanup_project can delete them.
        let subnets = client
            .list_subnets(&kuryr_neutron::ListFilter::new().project_id(&fx.project))
            .await
            .unwrap_or_default();
        for sn in subnets {
            let spec = kuryr_neutron::RouterInterfaceSpec::Subnet { subnet_id: sn.id };
            let _ = client.remove_router_interface(&router.id, &spec).await;
        }
        for p in pod_ports(client, &fx.project).await.unwrap_or_default() {
            let _ = client.delete_port(&p.id).await;
        }
        cleanup_project(client, &fx.project).await;
        let _ = client.delete_router(&router.id).await;
        let _ = client.delete_subnetpool(&subnetpool.id).await;
        result
    })
}
