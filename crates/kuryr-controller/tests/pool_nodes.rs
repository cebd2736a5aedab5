//! Nodes that are no more: the pools of a deleted node are dropped (its spare ports deleted),
//! also when it went while no controller ran; a node whose VM is replaced under the same name
//! gets its pods on the new VM's trunk, with and without pools - against the emulator and, when
//! KURYR_TEST_NEUTRON_URL is set, the real server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kuryr_controller::pool::api;
use kuryr_crds::KuryrPortPool;
use kuryr_neutron::{NeutronClient, PortUpdate};
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(120);

async fn delete_node(kube: &kube::Client, node: &str) -> Result<()> {
    Api::<Node>::all(kube.clone())
        .delete(node, &DeleteParams::default())
        .await?;
    Ok(())
}

async fn create_node(kube: &kube::Client, node: &str) -> Result<()> {
    let n: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node}
    }))?;
    Api::<Node>::all(kube.clone())
        .create(&PostParams::default(), &n)
        .await?;
    Ok(())
}

/// The KuryrPortPool objects.
async fn pool_objects(kube: &kube::Client) -> Result<Vec<KuryrPortPool>> {
    let objs = Api::<KuryrPortPool>::namespaced(kube.clone(), CONTROLLER_NS);
    Ok(objs.list(&ListParams::default()).await?.items)
}

/// Their hosts (trunks, for nested pools).
fn hosts_of(pools: Vec<KuryrPortPool>) -> BTreeSet<String> {
    pools
        .into_iter()
        .filter_map(|p| p.spec.key.host.or(p.spec.key.trunk_port_id))
        .collect()
}

/// Their name -> (VIF driver, uid).
fn drivers_of(pools: Vec<KuryrPortPool>) -> BTreeMap<String, (String, String)> {
    pools
        .into_iter()
        .map(|p| {
            let name = p.metadata.name.unwrap_or_default();
            let uid = p.metadata.uid.unwrap_or_default();
            (name, (p.spec.vif_driver.unwrap_or_default(), uid))
        })
        .collect()
}

/// The hosts of the controller's pools, once none is refilling.
async fn settled_hosts(socket: &std::path::Path) -> Result<BTreeSet<String>> {
    let pools = api::list_pools(socket).await?;
    Ok(if pools.iter().any(|p| p.populating) {
        BTreeSet::new()
    } else {
        pools.into_iter().map(|p| p.host).collect()
    })
}

async fn subport_ids(neutron: &NeutronClient, trunk: &str) -> Result<BTreeSet<String>> {
    Ok(neutron
        .get_subports(trunk)
        .await?
        .into_iter()
        .map(|s| s.port_id)
        .collect())
}

/// The VM of `trunk` is deleted as Nova deletes one whose port it did not create: the parent
/// port stays, detached from the instance.
async fn delete_vm(neutron: &NeutronClient, trunk: &str) -> Result<()> {
    let parent = neutron.get_trunk(trunk).await?.port_id;
    neutron
        .update_port(
            &parent,
            &PortUpdate {
                device_id: Some(String::new()),
                ..Default::default()
            },
        )
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pools_of_deleted_nodes_are_dropped_also_when_deleted_while_no_controller_ran() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let t = target.name;
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.68.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_batch = 3\nports_pool_min = 1\nports_pool_update_frequency = 1",
        )
        .await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;
        create_pod(&kube.client, "demo", "pod-0", NODES[0], json!({})).await?;
        create_pod(&kube.client, "demo", "pod-1", NODES[1], json!({})).await?;
        let used = wait_active_ports(&kube.client, "demo", 2).await?;
        let both: BTreeSet<String> = NODES.iter().map(|n| n.to_string()).collect();
        eventually("a pool per node, flushed", WAIT, || async {
            Ok((settled_hosts(&bed.socket).await? == both
                && hosts_of(pool_objects(&kube.client).await?) == both)
                .then_some(()))
        })
        .await?;
        assert_eq!(kuryr_ports(neutron, &fx.project).await?.len(), 6, "{t}");

        // The node goes: its 2 spare ports and its KuryrPortPool with it; its pod keeps its port.
        delete_node(&kube.client, NODES[1]).await?;
        let only_first: BTreeSet<String> = [NODES[0].to_string()].into();
        eventually("the deleted node's pool dropped", WAIT, || async {
            Ok((settled_hosts(&bed.socket).await? == only_first
                && hosts_of(pool_objects(&kube.client).await?) == only_first
                && kuryr_ports(neutron, &fx.project).await?.len() == 4)
                .then_some(()))
        })
        .await?;
        assert!(
            used.is_subset(&kuryr_ports(neutron, &fx.project).await?),
            "{t}: pods keep their ports"
        );

        // The other node goes while no controller runs: the next one drops its recovered pool.
        ctrl.shutdown().await?;
        delete_node(&kube.client, NODES[0]).await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c2");
        eventually("the pool of the node deleted meanwhile dropped", WAIT, || async {
            let ports = kuryr_ports(neutron, &fx.project).await?;
            Ok((api::list_pools(&bed.socket).await?.is_empty()
                && pool_objects(&kube.client).await?.is_empty()
                && ports == used)
                .then_some(()))
        })
        .await?;

        // The pods go too: their ports have no pool to go back to.
        let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "demo");
        for p in ["pod-0", "pod-1"] {
            pods.delete(p, &DeleteParams::default()).await?;
        }
        eventually("no port left", WAIT, || async {
            Ok(kuryr_ports(neutron, &fx.project).await?.is_empty().then_some(()))
        })
        .await?;
        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
        eprintln!("pool_nodes[{t}]: pools of 2 deleted nodes dropped, one deleted while no controller ran");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_vm_replaced_under_the_same_name_gets_its_pods_on_the_new_trunk() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let t = target.name;
        for pool_driver in ["nested", "noop"] {
            let kube = start_kube().await?;
            let neutron = &target.client;
            let fx = neutron_fixture(neutron, "10.69.0.0/24").await?;
            let vms = vm_trunks(neutron, &kube.client, &fx.project, "192.168.69.0/24").await?;
            let old_trunk = &vms.trunks[0];
            let bed = PoolBed::nested_with(
                &kube,
                &fx,
                &vms.subnet,
                pool_driver,
                "ports_pool_batch = 3\nports_pool_min = 1\nports_pool_update_frequency = 1",
            )
            .await?;
            let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
            create_namespace(&kube.client, "demo", json!({})).await?;
            create_pod(&kube.client, "demo", "pod-0", NODES[0], json!({})).await?;
            let first = wait_active_ports(&kube.client, "demo", 1).await?;
            let spares = if pool_driver == "nested" { 3 } else { 1 };
            eventually("the first pod's subports on the old trunk", WAIT, || async {
                Ok((subport_ids(neutron, old_trunk).await?.len() == spares).then_some(()))
            })
            .await?;

            // The VM is replaced: with pools the Node object is deleted and registered again
            // (as a cloud provider and the new kubelet do); without, the Node only gets the new
            // VM's address (no watch would see a deletion).
            delete_vm(neutron, old_trunk).await?;
            if pool_driver == "nested" {
                delete_node(&kube.client, NODES[0]).await?;
                create_node(&kube.client, NODES[0]).await?;
            }
            let new_trunk = vm_trunk(neutron, &kube.client, &fx.project, &vms.network, NODES[0]).await?;
            create_pod(&kube.client, "demo", "pod-1", NODES[0], json!({})).await?;
            let both = wait_active_ports(&kube.client, "demo", 2).await?;
            let second: Vec<&String> = both.difference(&first).collect();
            assert_eq!(second.len(), 1, "{t}/{pool_driver}");
            let on_new = subport_ids(neutron, &new_trunk).await?;
            assert!(
                on_new.contains(second[0]),
                "{t}/{pool_driver}: the new pod's port is a subport of the new VM's trunk {new_trunk}: {on_new:?}"
            );
            if pool_driver == "nested" {
                // The old trunk's spare subports are deleted; the first pod keeps its own.
                eventually("the old VM's pool dropped", WAIT, || async {
                    let hosts = settled_hosts(&bed.socket).await?;
                    Ok((subport_ids(neutron, old_trunk).await? == first
                        && hosts == [new_trunk.clone()].into()
                        && hosts_of(pool_objects(&kube.client).await?) == hosts)
                        .then_some(()))
                })
                .await?;
            }
            let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "demo");
            for p in ["pod-0", "pod-1"] {
                pods.delete(p, &DeleteParams::default()).await?;
            }
            eventually("the old trunk emptied", WAIT, || async {
                Ok(subport_ids(neutron, old_trunk).await?.is_empty().then_some(()))
            })
            .await?;
            // The new pool's spares (a batch of 3 on a server answering in time; a loaded one
            // makes the client ask fewer ports a request, and the pool refills only to min).
            eventually("only the new pool's subports left", WAIT, || async {
                let ports = kuryr_ports(neutron, &fx.project).await?;
                let on_new = subport_ids(neutron, &new_trunk).await?;
                let spares: usize = match pool_driver {
                    "nested" => api::list_pools(&bed.socket)
                        .await?
                        .iter()
                        .filter(|p| p.host == *new_trunk && !p.populating && p.in_use == 0)
                        .map(|p| p.available + p.recyclable)
                        .sum(),
                    _ => 0,
                };
                let want_spares = pool_driver != "nested" || spares >= 1;
                if ports == on_new && ports.len() == spares && want_spares {
                    return Ok(Some(()));
                }
                Err(anyhow::anyhow!(
                    "kuryr ports {ports:?}, the new trunk's subports {on_new:?}, the new pool's spares {spares}"
                ))
            })
            .await?;
            ctrl.shutdown().await?;
            cleanup_project(neutron, &fx.project).await;
            eprintln!("pool_nodes[{t}/{pool_driver}]: the replaced VM's node wires pods on its new trunk");
        }
    }
    Ok(())
}

/// The pools a `multi_pool` manager of both nested drivers recovers (without running it): name ->
/// (VIF driver, spare ports, ports in use).
async fn recovered_by_both_nested_drivers(
    ctx: &std::sync::Arc<kuryr_controller::context::Platform>,
) -> Result<BTreeMap<String, (String, usize, usize)>> {
    use kuryr_config::PodVifDriver;
    use kuryr_controller::drivers::set::vif_driver;
    let vifs = [PodVifDriver::NestedVlan, PodVifDriver::NestedMacvlan]
        .into_iter()
        .map(|d| vif_driver(ctx, d))
        .collect::<Result<Vec<_>, _>>()?;
    let manager = kuryr_controller::pool::build_multi(ctx.clone(), vifs, &ctx.config.vif_pool)?;
    manager.recover().await?;
    Ok(manager
        .summaries()
        .into_iter()
        .map(|p| (p.name, (p.vif_driver, p.available + p.recyclable, p.in_use)))
        .collect())
}

/// `multi_pool` with both nested drivers pooled: each judges its own hosts (a trunk, a VM port),
/// so a restart's first listing keeps every live pool (judged by the other driver, a VM port id
/// is no trunk, and a healthy pool was dropped with its ports).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_pools_of_both_nested_drivers_outlive_a_restart() -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    init_logs();
    for target in neutron_targets().await? {
        let t = target.name;
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.74.0.0/24").await?;
        let vms = vm_trunks(neutron, &kube.client, &fx.project, "192.168.74.0/24").await?;
        let label =
            json!({"metadata": {"labels": {kuryr_controller::pool::NODE_POD_VIF_LABEL: "nested-macvlan"}}});
        Api::<Node>::all(kube.client.clone())
            .patch(NODES[1], &PatchParams::default(), &Patch::Merge(&label))
            .await?;
        let bed = PoolBed::nested_with(
            &kube,
            &fx,
            &vms.subnet,
            "multi_pool",
            "vif_pool_mapping = nested-vlan:nested,nested-macvlan:nested\nports_pool_batch = 2\nports_pool_min = 1\n\
             ports_pool_update_frequency = 1",
        )
        .await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;
        create_pod(&kube.client, "demo", "vlan", NODES[0], json!({})).await?;
        create_pod(&kube.client, "demo", "macvlan", NODES[1], json!({})).await?;
        wait_active_ports(&kube.client, "demo", 2).await?;
        let settled = || async {
            let pools = api::list_pools(&bed.socket).await?;
            Ok((pools.len() == 2
                && pools
                    .iter()
                    .all(|p| !p.populating && p.available == 1 && p.in_use == 1))
            .then(|| pools.into_iter().map(|p| p.host).collect::<BTreeSet<_>>()))
        };
        let before = eventually("a pool per nested driver", WAIT, settled).await?;
        let ports = kuryr_ports(neutron, &fx.project).await?;
        let objects = eventually("each pool object names its VIF driver", WAIT, || async {
            let o = drivers_of(pool_objects(&kube.client).await?);
            Ok((o.len() == 2 && o.values().all(|(d, _)| !d.is_empty())).then_some(o))
        })
        .await?;
        let drivers: BTreeSet<&str> = objects.values().map(|(d, _)| d.as_str()).collect();
        assert_eq!(
            drivers,
            BTreeSet::from(["nested-macvlan", "nested-vlan"]),
            "{t}: {objects:?}"
        );

        ctrl.shutdown().await?;
        // Each driver recovers from its own objects only: read by both, a pool was held twice
        // (its spare subports adopted as macvlan ports) until the first node listing dropped
        // the copy, deleting what it could.
        let (ctx, _) = claimed_platform(&kube.client, config(&bed.ini), &target.url).await?;
        let held = recovered_by_both_nested_drivers(&ctx).await?;
        // Each pool had one port in use and one spare.
        let written: BTreeMap<String, (String, usize, usize)> = objects
            .iter()
            .map(|(n, (d, _))| (n.clone(), (d.clone(), 1, 1)))
            .collect();
        assert_eq!(
            held, written,
            "{t}: each pool recovered by the driver that wrote it"
        );
        // Objects written before the driver was recorded: each goes to the driver that knows its
        // host (a trunk, a VM port); the next controller records it again.
        let pools = Api::<KuryrPortPool>::namespaced(kube.client.clone(), CONTROLLER_NS);
        for name in written.keys() {
            let legacy = json!({"spec": {"vifDriver": null}});
            pools
                .patch(name, &PatchParams::default(), &Patch::Merge(&legacy))
                .await?;
        }
        let held = recovered_by_both_nested_drivers(&ctx).await?;
        assert_eq!(held, written, "{t}: objects without a driver");

        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c2");
        let after = eventually("both pools recovered", WAIT, settled).await?;
        assert_eq!(after, before, "{t}");
        // Past the first listing (a node watch event round trip): still both, no port deleted.
        create_pod(&kube.client, "demo", "later", NODES[0], json!({})).await?;
        wait_active_ports(&kube.client, "demo", 3).await?;
        let pools = api::list_pools(&bed.socket).await?;
        assert_eq!(pools.len(), 2, "{t}: {pools:?}");
        eventually(
            "the pool objects written before, with their drivers",
            WAIT,
            || async { Ok((drivers_of(pool_objects(&kube.client).await?) == objects).then_some(())) },
        )
        .await?;
        let now = kuryr_ports(neutron, &fx.project).await?;
        assert!(
            ports.is_subset(&now),
            "{t}: no pool port deleted: {ports:?} -> {now:?}"
        );
        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
        eprintln!("pool_nodes[{t}]: nested-vlan and nested-macvlan pools kept across a restart");
    }
    Ok(())
}

/// Whether pool hosts still serve a VM is asked of Neutron in lists, not a get per host: a node
/// gone with no host known this term (or a restart's first listing) questions every host of a
/// nested pool driver, which is a host per node. A deleted trunk and a detached parent port are
/// dead; a trunk of a running VM is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_pool_hosts_are_judged_in_lists() -> Result<()> {
    use kuryr_controller::drivers::vif::VifDriver;
    use kuryr_controller::drivers::vif::nested::VmPortLookup;
    use kuryr_controller::drivers::vif::nested_macvlan::NestedMacvlan;
    use kuryr_controller::drivers::vif::nested_vlan::NestedVlan;
    use kuryr_controller::openstack::Deployments;
    init_logs();
    for target in neutron_targets().await? {
        let t = target.name;
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.75.0.0/24").await?;
        let vms = vm_trunks(neutron, &kube.client, &fx.project, "192.168.75.0/24").await?;
        let parents = [
            neutron.get_trunk(&vms.trunks[0]).await?.port_id,
            neutron.get_trunk(&vms.trunks[1]).await?.port_id,
        ];
        delete_vm(neutron, &vms.trunks[1]).await?;
        let gone_trunk = "8c3f4c1e-0000-4000-8000-00000000dead".to_string();
        let deployments = Deployments::single(neutron.clone());
        let lookup = || VmPortLookup::new(kube.client.clone(), vec![vms.subnet.clone()]);
        let vlan = NestedVlan::new(deployments.clone(), lookup(), vec![], 1500);
        let macvlan = NestedMacvlan::new(deployments.clone(), lookup(), vec![], 1500, 3);
        if let Some(e) = target.emulator() {
            e.reset_stats();
        }
        // More hosts than one list names (80): the live trunk is in the second.
        let gone: Vec<String> = (0..85)
            .map(|i| format!("8c3f4c1e-0000-4000-8000-{i:012}"))
            .chain([gone_trunk])
            .collect();
        let mut hosts = gone.clone();
        hosts.extend([vms.trunks[1].clone(), vms.trunks[0].clone()]);
        let mut dead = vlan.dead_hosts("default", &hosts).await?;
        dead.sort();
        let mut want = gone;
        want.push(vms.trunks[1].clone());
        want.sort();
        assert_eq!(dead, want, "{t}: nested-vlan");
        let dead = macvlan
            .dead_hosts("default", &[parents[0].clone(), parents[1].clone()])
            .await?;
        assert_eq!(dead, vec![parents[1].clone()], "{t}: nested-macvlan");
        if let Some(e) = target.emulator() {
            let stats = e.stats();
            assert_eq!(
                stats.count("trunk.get") + stats.count("port.get"),
                0,
                "{t}: {stats:?}"
            );
            assert_eq!(
                (stats.count("trunk.list"), stats.count("port.list")),
                (2, 2),
                "{t}: a list per 80 hosts, driver and kind: {stats:?}"
            );
        }
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}
