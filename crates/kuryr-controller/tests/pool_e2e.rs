//! Pool behaviour end to end: the controller (service::run with
//! `vif_pool_driver = neutron`) against the Kubernetes API emulator and a Neutron - the in-repo
//! emulator, and the real neutron-server when KURYR_TEST_NEUTRON_URL is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::{Result, ensure};
use kube::api::{Api, DeleteParams, ListParams};
use kuryr_controller::pool::api;
use kuryr_crds::KuryrPortPool;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_pod_fills_the_pool_second_hits_and_a_restart_recovers_it() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.61.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_batch = 5\nports_pool_min = 2\nports_pool_update_frequency = 2",
        )
        .await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;

        create_pod(&kube.client, "demo", "pod-0", NODES[0], json!({})).await?;
        wait_active_ports(&kube.client, "demo", 1).await?;
        let first = eventually("the first refill's 5 ports", WAIT, || async {
            let p = kuryr_ports(neutron, &fx.project).await?;
            Ok((p.len() == 5).then_some(p))
        })
        .await?;
        create_pod(&kube.client, "demo", "pod-1", NODES[0], json!({})).await?;
        let used = wait_active_ports(&kube.client, "demo", 2).await?;
        // 3 spare ports are above min and no refill runs: the pool no longer changes by itself,
        // so a (wrong) second refill would have shown up by now (or keeps this from settling).
        settled_pool(&bed.socket, 3, 2).await?;
        assert_eq!(
            kuryr_ports(neutron, &fx.project).await?,
            first,
            "{}: the second pod was served from the pool",
            target.name
        );
        assert!(used.is_subset(&first), "{}: pods use pool ports", target.name);
        // Membership is flushed to the KuryrPortPool object before the restart.
        let objs = Api::<KuryrPortPool>::namespaced(kube.client.clone(), CONTROLLER_NS);
        eventually("KuryrPortPool with 3 available ports", WAIT, || async {
            let l = objs.list(&ListParams::default()).await?.items;
            Ok(l.iter()
                .any(|p| p.status.as_ref().is_some_and(|s| s.available.len() == 3))
                .then_some(()))
        })
        .await?;

        ctrl.shutdown().await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c2");
        create_pod(&kube.client, "demo", "pod-2", NODES[0], json!({})).await?;
        let used_after = wait_active_ports(&kube.client, "demo", 3).await?;
        settled_pool(&bed.socket, 2, 3).await?;
        assert_eq!(
            kuryr_ports(neutron, &fx.project).await?,
            first,
            "{}: the restart created or deleted no port",
            target.name
        );
        let new: Vec<_> = used_after.difference(&used).collect();
        assert_eq!(new.len(), 1, "{}", target.name);
        assert!(
            first.contains(new[0]),
            "{}: served from the recovered pool",
            target.name
        );
        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
        eprintln!("pool_e2e[{}]: 5 ports for 3 pods across a restart", target.name);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn released_ports_are_recycled_up_to_max() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.62.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_batch = 2\nports_pool_max = 2\nports_pool_min = 1\nports_pool_update_frequency = 2",
        )
        .await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;
        for i in 0..3 {
            create_pod(&kube.client, "demo", &format!("pod-{i}"), NODES[1], json!({})).await?;
        }
        let used = wait_active_ports(&kube.client, "demo", 3).await?;
        assert_eq!(used.len(), 3);
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(kube.client.clone(), "demo");
        for i in 0..3 {
            pods.delete(&format!("pod-{i}"), &DeleteParams::default()).await?;
        }
        eventually("pods gone", WAIT, || async {
            Ok(pods
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        })
        .await?;
        let spare = eventually("exactly 2 spare ports", WAIT, || async {
            let pools = api::list_pools(&bed.socket).await?;
            let p = kuryr_ports(neutron, &fx.project).await?;
            let settled = pools.len() == 1
                && pools[0].available == 2
                && pools[0].recyclable == 0
                && pools[0].in_use == 0
                && p.len() == 2;
            Ok(settled.then_some(p))
        })
        .await?;
        // Which ports stay spare depends on refills during the run (max bounds spare ports, not
        // ports in use); what matters is that exactly `max` are kept and the rest deleted.
        assert_eq!(spare.len(), 2, "{}", target.name);
        // Stable: wait until the spare ports have sat idle through several update passes (2 s
        // period), as the pool itself measures it, then check nothing changed.
        eventually("spare ports idle through several passes", WAIT, || async {
            let p = settled_pool(&bed.socket, 2, 0).await?;
            Ok(p.oldest_available_secs.is_some_and(|s| s >= 7).then_some(()))
        })
        .await?;
        assert_eq!(
            kuryr_ports(neutron, &fx.project).await?,
            spare,
            "{}: stable",
            target.name
        );
        // Recycled ports are reset: pool name, no device id, the pool's security groups.
        for id in &spare {
            let port = neutron.get_port(id).await?;
            assert_eq!(port.name, kuryr_crds::names::neutron::POOL_PORT_NAME);
            assert_eq!(port.device_id, "");
            assert_eq!(port.security_groups, vec![fx.sg.clone()]);
        }
        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
        eprintln!("pool_e2e[{}]: 3 pods released, 2 spare ports kept", target.name);
    }
    Ok(())
}

/// Far longer than the calls between a refill landing and the test's first look at the pool.
const TTL: i64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_ports_above_min_expire_after_the_ttl() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.63.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            &format!("ports_pool_batch = 4\nports_pool_min = 1\nports_pool_ttl = {TTL}\nports_pool_update_frequency = 1"),
        )
        .await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;
        create_pod(&kube.client, "demo", "pod-0", NODES[0], json!({})).await?;
        // The batch is looked at as it lands, not once the pod's port is ACTIVE: a loaded real
        // server can take longer than the TTL for that, and the spares would be gone.
        let pools = eventually("one batch of 4 landed, 3 spare", WAIT, || async {
            let grown = kuryr_ports(neutron, &fx.project).await?;
            let pools = api::list_pools(&bed.socket).await?;
            ensure!(grown.len() <= 4, "{}: one batch: {grown:?}", target.name);
            Ok(
                (grown.len() == 4 && pools.len() == 1 && !pools[0].populating && pools[0].available == 3)
                    .then_some(pools),
            )
        })
        .await?;
        let used = wait_active_ports(&kube.client, "demo", 1).await?;
        // The TTL is measured against the pool's own idle clock, not the test's: all 3 spare
        // ports came with one refill, so when the pool is first seen back at min, the one left
        // has been idle at least as long as the expired ones were when they went.
        let (left, idle) = eventually("the pool back at min", WAIT, || async {
            let pool = api::show_pool(&bed.socket, &pools[0].name).await?;
            let p = kuryr_ports(neutron, &fx.project).await?;
            let idle = pool
                .ports
                .iter()
                .find(|x| x.state == "available")
                .map(|x| x.age_secs);
            Ok((pool.available == 1 && p.len() == 2).then_some((p, idle)))
        })
        .await?;
        assert!(
            idle.is_some_and(|s| s >= TTL - 1),
            "{}: expired with the spare ports idle for {idle:?} s, before the {TTL} s TTL",
            target.name
        );
        assert!(used.is_subset(&left), "{}: the pod keeps its port", target.name);
        // Min is kept: once the port left has been past the TTL through several 1 s passes (by
        // the pool's clock), it must still be there.
        eventually("the spare port idle past the TTL", WAIT, || async {
            let p = settled_pool(&bed.socket, 1, 1).await?;
            Ok(p.oldest_available_secs
                .is_some_and(|s| s >= TTL + 5)
                .then_some(()))
        })
        .await?;
        assert_eq!(
            kuryr_ports(neutron, &fx.project).await?,
            left,
            "{}: min is kept",
            target.name
        );
        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
        eprintln!("pool_e2e[{}]: 3 idle ports expired down to min", target.name);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kuryrportpool_objects_follow_the_pools() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.66.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_batch = 3\nports_pool_min = 1\nports_pool_update_frequency = 1",
        )
        .await?;
        let objs = Api::<KuryrPortPool>::namespaced(kube.client.clone(), CONTROLLER_NS);
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(kube.client.clone(), "demo");
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;
        create_pod(&kube.client, "demo", "pod-0", NODES[0], json!({})).await?;
        wait_active_ports(&kube.client, "demo", 1).await?;
        let obj = eventually("the pool object", WAIT, || async {
            Ok(objs.list(&ListParams::default()).await?.items.into_iter().next())
        })
        .await?;
        assert_eq!(obj.spec.min, 1);
        assert!(
            obj.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == kuryr_crds::names::finalizers::KURYRPORTPOOL)
        );

        // A restart with other limits writes them back to the existing object.
        ctrl.shutdown().await?;
        // An object left by an earlier configuration, naming a pool with no port at all.
        let stale = KuryrPortPool::for_key(
            CONTROLLER_NS,
            kuryr_crds::PoolKey::host(
                "default",
                NODES[1],
                &fx.project,
                "gone-network",
                "gone-subnet",
                [&fx.sg],
            ),
            1,
            1,
            0,
            None,
        )?;
        let stale_name = stale.metadata.name.clone().unwrap();
        objs.create(&Default::default(), &stale).await?;
        let ini = bed.ini.replace("ports_pool_min = 1", "ports_pool_min = 2");
        let ctrl = start_controller(&kube.client, &target, config(&ini), "c2");
        eventually("min written back, the stale object deleted", WAIT, || async {
            let o = objs.list(&ListParams::default()).await?.items;
            Ok((o.len() == 1 && o[0].spec.min == 2).then_some(()))
        })
        .await?;
        assert!(objs.get_opt(&stale_name).await?.is_none());

        // `free` on a pool nobody uses empties it: the pool and its object go.
        pods.delete("pod-0", &DeleteParams::default()).await?;
        let name = obj.metadata.name.clone().unwrap();
        eventually("the released port recycled", WAIT, || async {
            let p = api::list_pools(&bed.socket).await?;
            Ok((p.len() == 1 && p[0].in_use == 0 && p[0].recyclable == 0).then_some(()))
        })
        .await?;
        let freed = api::free_pool(&bed.socket, &name).await?;
        assert_eq!(freed.deleted, 3, "{}", target.name);
        eventually("the freed pool's object deleted", WAIT, || async {
            Ok(objs
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        })
        .await?;
        assert!(api::list_pools(&bed.socket).await?.is_empty());
        assert!(
            kuryr_ports(neutron, &fx.project).await?.is_empty(),
            "{}",
            target.name
        );

        // Demand re-creates pool and object; deleting the object frees the pool's spare ports
        // and the controller releases its finalizer, while the pod keeps its port.
        create_pod(&kube.client, "demo", "pod-1", NODES[0], json!({})).await?;
        let used = wait_active_ports(&kube.client, "demo", 1).await?;
        eventually("the pool object again", WAIT, || async {
            let o = objs.list(&ListParams::default()).await?.items;
            Ok((o.len() == 1 && o[0].status.as_ref().is_some_and(|s| s.available.len() == 2)).then_some(()))
        })
        .await?;
        objs.delete(&name, &Default::default()).await?;
        eventually("the deleted object released", WAIT, || async {
            Ok(objs
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        })
        .await?;
        assert!(api::list_pools(&bed.socket).await?.is_empty());
        assert_eq!(kuryr_ports(neutron, &fx.project).await?, used, "{}", target.name);
        // With no pool to return to, the released port is deleted.
        pods.delete("pod-1", &DeleteParams::default()).await?;
        eventually("the last port deleted", WAIT, || async {
            Ok(kuryr_ports(neutron, &fx.project).await?.is_empty().then_some(()))
        })
        .await?;
        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// Pre-population (the kuryrnetwork handler's hook): every node's pool of a new namespace
/// network is filled up to min in one bulk create each; a second call creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prepopulate_fills_every_nodes_pool_up_to_min() -> Result<()> {
    use kuryr_controller::drivers::vif::neutron::NeutronVif;
    use std::sync::Arc;

    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.67.0.0/24").await?;
        let bed = PoolBed::new(&kube, &fx, "ports_pool_batch = 2\nports_pool_min = 3").await?;
        let config = config(&bed.ini);
        let (ctx, deployments) = claimed_platform(&kube.client, config.clone(), &target.url).await?;
        let vif = Arc::new(NeutronVif::new(
            deployments,
            ctx.resource_tags(),
            "br-int".into(),
            0,
        ));
        let manager = kuryr_controller::pool::build(ctx, vif, &config.vif_pool)?;
        let spec = fixture_port_spec(neutron, &fx).await?;
        assert!(
            manager.prepopulate(&spec).await.is_err(),
            "{}: not ready before recovery",
            target.name
        );
        manager.recover().await?;
        let started = manager.prepopulate(&spec).await?;
        assert_eq!(started.len(), NODES.len(), "{}: one pool per node", target.name);
        let ports = eventually("pools filled to min", WAIT, || async {
            let pools = manager.summaries();
            let p = kuryr_ports(neutron, &fx.project).await?;
            let filled =
                pools.len() == NODES.len() && pools.iter().all(|s| s.available == 3 && !s.populating);
            Ok((filled && p.len() == 3 * NODES.len()).then_some(p))
        })
        .await?;
        assert!(
            manager.prepopulate(&spec).await?.is_empty(),
            "{}: already at min",
            target.name
        );
        // It started no refill (none runs), so the ports are checked without waiting.
        let pools = manager.summaries();
        assert!(
            pools.iter().all(|s| s.available == 3 && !s.populating),
            "{}: {pools:?}",
            target.name
        );
        assert_eq!(kuryr_ports(neutron, &fx.project).await?, ports, "{}", target.name);
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// Namespace deletion with pools on: the pre-populated (and the used, recycled) pool ports are
/// on the namespace network, so the kuryrnetwork handler drops those pools - ports and
/// KuryrPortPool objects - before deleting the network, which Neutron refuses while a port is on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_namespace_drops_its_pools_and_removes_its_network() -> Result<()> {
    use kuryr_crds::KuryrNetwork;
    use kuryr_neutron::ListFilter;

    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.68.0.0/24").await?;
        let (subnetpool, router) = namespace_subnet_infra(neutron, &fx.project, "10.98.0.0/16").await?;
        let bed = PoolBed::new(&kube, &fx, "").await?;
        let cfg = format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport,namespace,kuryrnetwork\npod_subnets_driver = namespace\n\
             pod_vif_driver = neutron-vif\nvif_pool_driver = neutron\ncluster_id = {}\ncontroller_namespace = {CONTROLLER_NS}\n\
             enable_manager = true\n[pool_manager]\nsock_file = {}\n\
             [namespace_subnet]\npod_router = {}\npod_subnet_pool = {}\n\
             [vif_pool]\nports_pool_batch = 2\nports_pool_min = 2\nports_pool_update_frequency = 2\n\
             [neutron_defaults]\nproject = {}\npod_security_groups = {}\nresource_tags = k8s,test\n",
            bed.cluster_id,
            bed.socket.display(),
            router.id,
            subnetpool.id,
            fx.project,
            fx.sg
        );
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c1");
        create_namespace(&kube.client, "team-p", json!({})).await?;
        create_pod(&kube.client, "team-p", "p", NODES[0], json!({})).await?;
        let kns: Api<KuryrNetwork> = Api::namespaced(kube.client.clone(), "team-p");
        let status = eventually("KuryrNetwork pre-populated", WAIT, || async {
            Ok(kns
                .get_opt("team-p")
                .await?
                .and_then(|kn| kn.status)
                .filter(|s| s.populated == Some(true)))
        })
        .await?;
        let net_id = status.net_id.clone().unwrap();
        wait_active_ports(&kube.client, "team-p", 1).await?;
        let on_net = || async {
            let f = ListFilter::new()
                .network_id(&net_id)
                .tags([kuryr_crds::names::neutron::TAG_MANAGED]);
            anyhow::Ok(neutron.list_ports(&f).await?.len())
        };
        let objs = Api::<KuryrPortPool>::namespaced(kube.client.clone(), CONTROLLER_NS);
        let net_objs = || async {
            let l = objs.list(&ListParams::default()).await?.items;
            anyhow::Ok(l.into_iter().filter(|o| o.spec.key.network_id == net_id).count())
        };
        // One pool per node, filled to min; the pod's port came from node 1's.
        eventually("every node's pool filled and persisted", WAIT, || async {
            Ok((on_net().await? > 2 * NODES.len() && net_objs().await? == NODES.len()).then_some(()))
        })
        .await?;

        delete_namespace_and_wait(&kube.client, neutron, "team-p", "p", &net_id).await?;
        // Every other namespace (default, kube-system, ...) keeps its network and pools.
        assert_eq!(on_net().await?, 0, "{}: no port left on the network", target.name);
        assert_eq!(
            net_objs().await?,
            0,
            "{}: its KuryrPortPools are deleted",
            target.name
        );
        let pools = api::list_pools(&bed.socket).await?;
        assert!(
            pools.iter().all(|p| p.network_id != net_id),
            "{}: no pool left on the network: {pools:?}",
            target.name
        );
        ctrl.shutdown().await?;
        // The other namespaces' subnets stay on the router: detach them so that nothing leaks.
        for p in neutron
            .list_ports(&ListFilter::new().device_id(&router.id))
            .await
            .unwrap_or_default()
        {
            for ip in p.fixed_ips {
                let spec = kuryr_neutron::RouterInterfaceSpec::Subnet {
                    subnet_id: ip.subnet_id,
                };
                let _ = neutron.remove_router_interface(&router.id, &spec).await;
            }
        }
        let _ = neutron.delete_router(&router.id).await;
        cleanup_project(neutron, &fx.project).await;
        let _ = neutron.delete_subnetpool(&subnetpool.id).await;
        eprintln!(
            "pool_e2e[{}]: namespace deleted with its pools and network",
            target.name
        );
    }
    Ok(())
}

/// A pool refill refused for quota: the waiting pod gets the same OverQuota Event as without
/// pools, keeps being retried, and is wired from the room the quota has left (the next refill
/// is cut to it: a bulk create asking for more fails whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refill_over_quota_is_an_event_on_the_pod_which_is_wired_from_the_room_left() -> Result<()> {
    use k8s_openapi::api::events::v1::Event;

    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.69.0.0/24").await?;
        // A batch of 5 never fits a quota of 3 ports.
        let quota = |port| kuryr_neutron::QuotaUpdate {
            port: Some(port),
            ..Default::default()
        };
        neutron.update_quota(&fx.project, &quota(3)).await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_batch = 5\nports_pool_min = 1\nports_pool_update_frequency = 2",
        )
        .await?;
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
        create_namespace(&kube.client, "tight", json!({})).await?;
        create_pod(&kube.client, "tight", "t-0", NODES[0], json!({})).await?;
        let events = Api::<Event>::namespaced(kube.client.clone(), "tight");
        let ev = eventually("OverQuota event on the pod", WAIT, || async {
            let evs = events.list(&ListParams::default()).await?.items;
            Ok(evs.into_iter().find(|e| e.reason.as_deref() == Some("OverQuota")))
        })
        .await?;
        assert_eq!(ev.type_.as_deref(), Some("Warning"), "{}", target.name);
        assert_eq!(
            ev.regarding.as_ref().and_then(|r| r.name.as_deref()),
            Some("t-0"),
            "{}",
            target.name
        );
        assert!(
            ev.note.as_deref().unwrap_or_default().contains("Quota exceeded"),
            "{}: {:?}",
            target.name,
            ev.note
        );
        // Retried within the room the quota has: a refill cut to it (3 ports, not the batch
        // of 5, which fails whole) wires the pod without the quota being raised.
        wait_active_ports(&kube.client, "tight", 1).await?;
        let made = kuryr_ports(neutron, &fx.project).await?.len();
        assert!((1..=3).contains(&made), "{}: {made} ports", target.name);
        assert!(!ctrl.is_finished());
        ctrl.shutdown().await?;
        let _ = neutron.reset_quota(&fx.project).await;
        cleanup_project(neutron, &fx.project).await;
        eprintln!(
            "pool_e2e[{}]: OverQuota event, wired from the room left",
            target.name
        );
    }
    Ok(())
}
