//! Pooled extra interfaces land on the subnet they were asked for: with `vif_pool_driver =
//! neutron` and `multi_vif_drivers = additional_subnets`, a pod asking for a second subnet of its
//! own pod network gets eth0 on the pod subnet and eth1 on the other one, from two pools, and
//! both ports go back to their own pool on release. Against the Neutron emulator and the real
//! neutron-server when KURYR_TEST_NEUTRON_URL is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kuryr_controller::pool::api;
use kuryr_controller::pool::driver::PoolSummary;
use kuryr_crds::KuryrPort;
use kuryr_neutron::NeutronClient;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "demo";

/// The pod's KuryrPort once it has `n` VIFs, all active.
async fn wired(kube: &kube::Client, pod: &str, n: usize) -> Result<KuryrPort> {
    wired_kp(kube, NS, pod, n).await
}

/// (eth0 port id, eth1 port id) of a wired pod, after checking each port's fixed IPs are on
/// exactly its expected subnet.
async fn check_interfaces(
    neutron: &NeutronClient,
    kp: &KuryrPort,
    pod_subnet: &str,
    extra_subnet: &str,
    what: &str,
) -> Result<(String, String)> {
    let vifs = &kp.status.as_ref().unwrap().vifs;
    assert_eq!(vifs.keys().collect::<Vec<_>>(), ["eth0", "eth1"], "{what}");
    let mut ids = Vec::new();
    for (ifname, subnet) in [("eth0", pod_subnet), ("eth1", extra_subnet)] {
        let id = vifs[ifname].vif.id().to_string();
        let port = neutron.get_port(&id).await?;
        let subnets: Vec<&str> = port.fixed_ips.iter().map(|f| f.subnet_id.as_str()).collect();
        assert_eq!(subnets, [subnet], "{what}: {ifname} ({id}) fixed_ips");
        ids.push(id);
    }
    Ok((ids[0].clone(), ids[1].clone()))
}

fn pool_on<'a>(pools: &'a [PoolSummary], subnet: &str) -> Option<&'a PoolSummary> {
    pools.iter().find(|p| p.subnet_id == subnet)
}

/// Port ids of a pool (any state), from the management API.
async fn pool_ports(bed: &PoolBed, pool: &PoolSummary) -> Result<BTreeSet<String>> {
    let shown = api::show_pool(&bed.socket, &pool.name).await?;
    Ok(shown.ports.into_iter().map(|p| p.port_id).collect())
}

async fn delete_pod_and_wait(kube: &kube::Client, name: &str) -> Result<()> {
    let pods = Api::<Pod>::namespaced(kube.clone(), NS);
    pods.delete(name, &DeleteParams::default()).await?;
    eventually(&format!("{name} gone"), WAIT, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn extra_interface_on_another_subnet_of_the_pod_network_gets_its_own_pool() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let name = target.name;
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.66.0.0/24").await?;
        // Subnet B on the SAME network as the pod subnet.
        let subnet_b = neutron
            .create_subnet(&kuryr_neutron::SubnetCreate {
                network_id: fx.network.clone(),
                ip_version: 4,
                cidr: Some("10.67.0.0/24".into()),
                project_id: Some(fx.project.clone()),
                name: Some("extra-b".into()),
                ..Default::default()
            })
            .await?
            .id;
        let mut bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_batch = 2\nports_pool_min = 1\nports_pool_update_frequency = 2",
        )
        .await?;
        bed.ini = bed.ini.replacen(
            "[pool_manager]",
            "multi_vif_drivers = additional_subnets\n[pool_manager]",
            1,
        );
        let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "c1");
        create_namespace(&kube.client, NS, json!({})).await?;
        let annotations = json!({"openstack.org/kuryr-additional-subnets": json!([subnet_b]).to_string()});

        create_pod(&kube.client, NS, "pod-0", NODES[0], annotations.clone()).await?;
        let kp = wired(&kube.client, "pod-0", 2).await?;
        let (eth0, eth1) =
            check_interfaces(neutron, &kp, &fx.subnet, &subnet_b, &format!("{name}: pod-0")).await?;

        let pools = api::list_pools(&bed.socket).await?;
        assert_eq!(pools.len(), 2, "{name}: one pool per subnet: {pools:?}");
        let (pool_a, pool_b) = (
            pool_on(&pools, &fx.subnet).expect("pool on the pod subnet"),
            pool_on(&pools, &subnet_b).expect("pool on subnet B"),
        );
        assert_eq!(
            (pool_a.network_id.as_str(), pool_b.network_id.as_str()),
            (fx.network.as_str(), fx.network.as_str())
        );
        assert_ne!(pool_a.name, pool_b.name, "{name}: distinct KuryrPortPool objects");
        assert!(
            pool_ports(&bed, pool_a).await?.contains(&eth0),
            "{name}: eth0 from pool A"
        );
        assert!(
            pool_ports(&bed, pool_b).await?.contains(&eth1),
            "{name}: eth1 from pool B"
        );

        delete_pod_and_wait(&kube.client, "pod-0").await?;
        // Both ports recycled, each into its own pool.
        let pools = eventually("both ports recycled into their own pools", WAIT, || async {
            let pools = api::list_pools(&bed.socket).await?;
            let settled = pools.len() == 2 && pools.iter().all(|p| p.in_use == 0 && p.recyclable == 0);
            Ok(settled.then_some(pools))
        })
        .await?;
        let (pool_a, pool_b) = (
            pool_on(&pools, &fx.subnet).expect("pool on the pod subnet"),
            pool_on(&pools, &subnet_b).expect("pool on subnet B"),
        );
        let (ports_a, ports_b) = (pool_ports(&bed, pool_a).await?, pool_ports(&bed, pool_b).await?);
        assert!(
            ports_a.contains(&eth0),
            "{name}: eth0's port back in pool A: {ports_a:?}"
        );
        assert!(
            ports_b.contains(&eth1),
            "{name}: eth1's port back in pool B: {ports_b:?}"
        );
        // Every pooled port really is on its pool's subnet.
        for (ports, subnet) in [(&ports_a, &fx.subnet), (&ports_b, &subnet_b)] {
            for id in ports {
                let port = neutron.get_port(id).await?;
                let subnets: Vec<&str> = port.fixed_ips.iter().map(|f| f.subnet_id.as_str()).collect();
                assert_eq!(subnets, [subnet.as_str()], "{name}: pooled port {id}");
            }
        }

        // A second such pod is again served from the right pools.
        create_pod(&kube.client, NS, "pod-1", NODES[0], annotations.clone()).await?;
        let kp = wired(&kube.client, "pod-1", 2).await?;
        let (eth0, eth1) =
            check_interfaces(neutron, &kp, &fx.subnet, &subnet_b, &format!("{name}: pod-1")).await?;
        assert!(ports_a.contains(&eth0), "{name}: pod-1 eth0 from pool A");
        assert!(ports_b.contains(&eth1), "{name}: pod-1 eth1 from pool B");
        let pools = api::list_pools(&bed.socket).await?;
        assert_eq!(pools.len(), 2, "{name}: {pools:?}");
        assert!(pools.iter().all(|p| p.in_use == 1), "{name}: {pools:?}");

        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
        eprintln!(
            "pool_subnets[{name}]: eth0 and eth1 from one pool per subnet, recycled into their own pools"
        );
    }
    Ok(())
}
