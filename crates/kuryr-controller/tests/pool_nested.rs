//! Port pools on nested VLAN nodes: the `nested` pool driver keeps subports attached to each VM's
//! trunk, fills it in one bulk create + one `add_subports` per batch, recycles released subports
//! in place, and recovers its pools after a restart without creating, deleting or re-numbering a
//! subport - against the emulator and, when KURYR_TEST_NEUTRON_URL is set, the real server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kuryr_controller::pool::api;
use kuryr_crds::KuryrPortPool;
use kuryr_neutron::NeutronClient;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(120);

/// port id -> VLAN id of a trunk's subports.
async fn subports(neutron: &NeutronClient, trunk: &str) -> Result<BTreeMap<String, u32>> {
    Ok(neutron
        .get_subports(trunk)
        .await?
        .into_iter()
        .map(|s| (s.port_id, s.segmentation_id))
        .collect())
}

fn assert_unique_vlans(target: &str, sp: &BTreeMap<String, u32>) {
    let vlans: BTreeSet<u32> = sp.values().copied().collect();
    assert_eq!(vlans.len(), sp.len(), "{target}: VLAN ids collide: {sp:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nested_pools_fill_trunks_in_batches_recycle_and_recover() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let t = target.name;
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.67.0.0/24").await?;
        let vms = vm_trunks(neutron, &kube.client, &fx.project, "192.168.67.0/24").await?;
        let (trunk, other_trunk) = (&vms.trunks[0], &vms.trunks[1]);
        let bed = PoolBed::nested(
            &kube,
            &fx,
            &vms.subnet,
            "ports_pool_batch = 3\nports_pool_min = 1\nports_pool_update_frequency = 1",
        )
        .await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;

        // First pod: one batch of 3 subports on its node's trunk, none on the other node's.
        create_pod(&kube.client, "demo", "pod-0", NODES[0], json!({})).await?;
        wait_active_ports(&kube.client, "demo", 1).await?;
        let first = eventually("3 subports on the trunk", WAIT, || async {
            let sp = subports(neutron, trunk).await?;
            Ok((sp.len() == 3).then_some(sp))
        })
        .await?;
        assert_unique_vlans(t, &first);
        assert!(
            subports(neutron, other_trunk).await?.is_empty(),
            "{t}: pools are per trunk"
        );
        create_pod(&kube.client, "demo", "pod-1", NODES[0], json!({})).await?;
        let used = wait_active_ports(&kube.client, "demo", 2).await?;
        // The spare subport is at min and no refill runs: a (wrong) second batch would show by now.
        settled_pool(&bed.socket, 1, 2).await?;
        assert_eq!(
            subports(neutron, trunk).await?,
            first,
            "{t}: the second pod hit the pool"
        );
        assert!(
            used.iter().all(|p| first.contains_key(p)),
            "{t}: pods use pooled subports"
        );
        for id in first.keys() {
            let port = neutron.get_port(id).await?;
            assert_eq!(port.device_owner, "trunk:subport", "{t}");
            assert!(
                port.tags
                    .iter()
                    .any(|x| x == kuryr_crds::names::neutron::TAG_MANAGED),
                "{t}: {:?}",
                port.tags
            );
        }
        let objs = Api::<KuryrPortPool>::namespaced(kube.client.clone(), CONTROLLER_NS);
        eventually("a KuryrPortPool for the trunk", WAIT, || async {
            let l = objs.list(&ListParams::default()).await?.items;
            Ok(l.iter()
                .any(|p| {
                    p.spec.key.trunk_port_id.as_deref() == Some(trunk.as_str())
                        && p.status.as_ref().is_some_and(|s| s.available.len() == 1)
                })
                .then_some(()))
        })
        .await?;

        // Restart: the recovered pool serves the next pod; nothing is created, deleted or
        // re-numbered until it runs below min, and the next batch's VLANs avoid the old ones.
        ctrl.shutdown().await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c2");
        create_pod(&kube.client, "demo", "pod-2", NODES[0], json!({})).await?;
        let used_after = wait_active_ports(&kube.client, "demo", 3).await?;
        let new: Vec<_> = used_after.difference(&used).collect();
        assert_eq!(new.len(), 1, "{t}");
        assert!(first.contains_key(new[0]), "{t}: served from the recovered pool");
        let grown = eventually("the refill after the restart", WAIT, || async {
            let sp = subports(neutron, trunk).await?;
            Ok((sp.len() == 6).then_some(sp))
        })
        .await?;
        for (port, vlan) in &first {
            assert_eq!(
                grown.get(port),
                Some(vlan),
                "{t}: recovered subports keep their VLAN"
            );
        }
        assert_unique_vlans(t, &grown);

        // Released subports stay on the trunk and return to the pool.
        let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "demo");
        for i in 0..3 {
            pods.delete(&format!("pod-{i}"), &DeleteParams::default()).await?;
        }
        eventually("all 6 subports available again", WAIT, || async {
            let pools = api::list_pools(&bed.socket).await?;
            Ok((pools.len() == 1
                && pools[0].available == 6
                && pools[0].in_use == 0
                && pools[0].recyclable == 0)
                .then_some(()))
        })
        .await?;
        assert_eq!(subports(neutron, trunk).await?, grown, "{t}: recycled in place");
        assert_eq!(
            kuryr_ports(neutron, &fx.project).await?.len(),
            6,
            "{t}: nothing leaked"
        );
        for id in grown.keys() {
            let port = neutron.get_port(id).await?;
            assert_eq!(port.name, kuryr_crds::names::neutron::POOL_PORT_NAME, "{t}");
            assert_eq!(port.security_groups, vec![fx.sg.clone()], "{t}");
        }
        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
        eprintln!("pool_nested[{t}]: 6 subports for 3 pods across a restart, recycled in place");
    }
    Ok(())
}

/// A spare subport serves the VM whose trunk it is on, whatever the pool objects recorded: one
/// moved to another node's trunk while the controller was down is recovered into that trunk's
/// pool, one detached from every trunk into no pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recovery_places_a_spare_subport_by_the_trunk_it_is_on() -> Result<()> {
    use kuryr_neutron::SubPort;
    init_logs();
    for target in neutron_targets().await? {
        let t = target.name;
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.69.0.0/24").await?;
        let vms = vm_trunks(neutron, &kube.client, &fx.project, "192.168.69.0/24").await?;
        let (trunk, other_trunk) = (&vms.trunks[0], &vms.trunks[1]);
        let bed = PoolBed::nested(
            &kube,
            &fx,
            &vms.subnet,
            "ports_pool_batch = 3\nports_pool_min = 1\nports_pool_update_frequency = 1",
        )
        .await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;
        // A pod on each node: a pool on each trunk.
        create_pod(&kube.client, "demo", "pod-0", NODES[0], json!({})).await?;
        create_pod(&kube.client, "demo", "pod-1", NODES[1], json!({})).await?;
        let used = wait_active_ports(&kube.client, "demo", 2).await?;
        let objs = Api::<KuryrPortPool>::namespaced(kube.client.clone(), CONTROLLER_NS);
        eventually("each trunk's pool object lists its spares", WAIT, || async {
            let l = objs.list(&ListParams::default()).await?.items;
            let listed = |trunk: &str| {
                l.iter().any(|p| {
                    p.spec.key.trunk_port_id.as_deref() == Some(trunk)
                        && p.status.as_ref().is_some_and(|s| s.available.len() == 2)
                })
            };
            Ok((listed(trunk) && listed(other_trunk)).then_some(()))
        })
        .await?;
        ctrl.shutdown().await?;

        let spares: Vec<String> = subports(neutron, trunk)
            .await?
            .into_keys()
            .filter(|p| !used.contains(p))
            .collect();
        assert_eq!(spares.len(), 2, "{t}: {spares:?}");
        let (moved, detached) = (&spares[0], &spares[1]);
        neutron.remove_subports(trunk, &spares).await?;
        neutron
            .add_subports(other_trunk, &[SubPort::vlan(moved.clone(), 3001)])
            .await?;
        // pod-0's own port, in use, moved too: on release it goes to the pool of the trunk it
        // is on, not to the one its origin names.
        let pod0_port = subports(neutron, trunk)
            .await?
            .into_keys()
            .find(|p| used.contains(p))
            .expect("pod-0's subport");
        neutron.remove_subports(trunk, &[&pod0_port]).await?;
        neutron
            .add_subports(other_trunk, &[SubPort::vlan(pod0_port.clone(), 3002)])
            .await?;
        // pod-1's, in use, moved to the trunk of a VM that is no node: it serves no node's pods
        // any more, so on release it is deleted (taken off that trunk first), not recycled.
        let pod1_port = subports(neutron, other_trunk)
            .await?
            .into_keys()
            .find(|p| used.contains(p) && *p != pod0_port)
            .expect("pod-1's subport");
        let stray_parent = neutron
            .create_port(&kuryr_neutron::PortCreate {
                project_id: Some(fx.project.clone()),
                name: Some("vm-not-a-node".into()),
                ..kuryr_neutron::PortCreate::new(vms.network.clone())
            })
            .await?;
        let stray_trunk = neutron
            .create_trunk(&kuryr_neutron::TrunkCreate {
                port_id: stray_parent.id.clone(),
                project_id: Some(fx.project.clone()),
                ..Default::default()
            })
            .await?;
        neutron.remove_subports(other_trunk, &[&pod1_port]).await?;
        neutron
            .add_subports(&stray_trunk.id, &[SubPort::vlan(pod1_port.clone(), 3003)])
            .await?;

        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c2");
        let holding = |port: String| {
            let socket = bed.socket.clone();
            async move {
                let mut out = Vec::new();
                for p in api::list_pools(&socket).await? {
                    let shown = api::show_pool(&socket, &p.name).await?;
                    if shown
                        .ports
                        .iter()
                        .any(|x| x.port_id == port && x.state == "available")
                    {
                        out.push(p);
                    }
                }
                anyhow::Ok(out)
            }
        };
        let other_pool = eventually("the moved spare available in its trunk's pool", WAIT, || async {
            let pools = holding(moved.clone()).await?;
            Ok(pools.into_iter().find(|p| p.host == *other_trunk))
        })
        .await?;
        let holders: Vec<String> = holding(moved.clone())
            .await?
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(
            holders,
            std::slice::from_ref(&other_pool.name),
            "{t}: held by one pool"
        );
        for p in api::list_pools(&bed.socket).await? {
            let shown = api::show_pool(&bed.socket, &p.name).await?;
            assert!(
                !shown.ports.iter().any(|x| x.port_id == *detached),
                "{t}: a subport of no trunk placed in {}",
                p.name
            );
        }
        let port = neutron.get_port(moved).await?;
        let pool_tags: Vec<&String> = port
            .tags
            .iter()
            .filter(|x| x.starts_with(kuryr_crds::names::neutron::TAG_POOL_PREFIX))
            .collect();
        assert_eq!(
            pool_tags,
            [&kuryr_crds::names::neutron::pool_tag(&other_pool.name)],
            "{t}: retagged for the pool it serves"
        );
        Api::<Pod>::namespaced(kube.client.clone(), "demo")
            .delete("pod-0", &DeleteParams::default())
            .await?;
        eventually("pod-0's moved port back in its trunk's pool", WAIT, || async {
            let pools = holding(pod0_port.clone()).await?;
            Ok((pools.len() == 1 && pools[0].host == *other_trunk).then_some(()))
        })
        .await?;
        Api::<Pod>::namespaced(kube.client.clone(), "demo")
            .delete("pod-1", &DeleteParams::default())
            .await?;
        eventually("pod-1's stray port deleted", WAIT, || async {
            Ok(neutron
                .get_port(&pod1_port)
                .await
                .err()
                .filter(|e| e.is_not_found())
                .map(|_| ()))
        })
        .await?;
        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
        eprintln!("pool_nested[{t}]: moved subports recovered on their trunk, a detached one in no pool");
    }
    Ok(())
}

/// Pre-population on nested nodes: a node no pool host is found for (a control-plane node on
/// no worker subnet, listed first here) is skipped, and every worker node's trunk pool is still
/// filled. It stopped the pass at that node, leaving the nodes after it empty and the network
/// never marked populated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prepopulate_skips_a_node_without_a_pool_host() -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams, PostParams};
    use kuryr_controller::drivers::vif::nested::VmPortLookup;
    use kuryr_controller::drivers::vif::nested_vlan::NestedVlan;
    use std::sync::Arc;

    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.66.0.0/24").await?;
        let vms = vm_trunks(neutron, &kube.client, &fx.project, "192.168.66.0/24").await?;
        let nodes = Api::<Node>::all(kube.client.clone());
        let control: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "a-control-plane"}
        }))?;
        nodes.create(&PostParams::default(), &control).await?;
        let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.250.0.5"}]}});
        nodes
            .patch_status("a-control-plane", &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        let bed = PoolBed::nested(
            &kube,
            &fx,
            &vms.subnet,
            "ports_pool_batch = 2\nports_pool_min = 2",
        )
        .await?;
        let config = config(&bed.ini);
        let (ctx, deployments) = claimed_platform(&kube.client, config.clone(), &target.url).await?;
        let vif = Arc::new(NestedVlan::new(
            deployments,
            VmPortLookup::new(kube.client.clone(), vec![vms.subnet.clone()]),
            ctx.resource_tags(),
            1450,
        ));
        let manager = kuryr_controller::pool::build(ctx, vif, &config.vif_pool)?;
        let spec = fixture_port_spec(neutron, &fx).await?;
        manager.recover().await?;
        let started = manager.prepopulate(&spec).await?;
        assert_eq!(
            started.len(),
            NODES.len(),
            "{}: one pool per worker node's trunk: {started:?}",
            target.name
        );
        for trunk in &vms.trunks {
            eventually(
                &format!("{}: 2 subports on {trunk}", target.name),
                WAIT,
                || async { Ok((subports(neutron, trunk).await?.len() == 2).then_some(())) },
            )
            .await?;
        }
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}
