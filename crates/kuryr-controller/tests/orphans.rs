//! Ports a crash created for a pod but never recorded in its KuryrPort (the controller died
//! between the Neutron create and the status write) are found by the pod's ownership tags and
//! deleted with the pod - also nested subports, which carry no device id - while a newer pod of
//! the same name and other pods keep theirs. Emulator and, with KURYR_TEST_NEUTRON_URL, the
//! real neutron-server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kuryr_crds::names::device_owner::COMPUTE_KURYR;
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::PortCreate;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ports_a_crash_never_recorded_are_deleted_with_their_pod() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.81.0.0/24").await?;
        let cluster = format!("orphans-{}", uuid::Uuid::new_v4().simple());
        let cfg = format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
             cluster_id = {cluster}\n\
             [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\n",
            fx.project, fx.subnet, fx.sg
        );
        let first = start_controller(&kube.client, &target, config(&cfg), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;
        let pod = create_pod(&kube.client, "demo", "victim", NODES[0], json!({})).await?;
        create_pod(&kube.client, "demo", "bystander", NODES[1], json!({})).await?;
        let recorded = wait_active_ports(&kube.client, "demo", 2).await?;

        // What a crashed controller left behind for "victim": a port created (tagged in the same
        // request) but never written to the KuryrPort; and one a newer "victim" would own.
        let uid = pod.uid().unwrap();
        let stray = |device_id: &str| PortCreate {
            project_id: Some(fx.project.clone()),
            device_id: Some(device_id.to_string()),
            device_owner: Some(COMPUTE_KURYR.into()),
            tags: vec![
                tags::TAG_MANAGED.into(),
                tags::cluster_tag(&cluster),
                tags::pod_tag("demo", "victim"),
            ],
            ..PortCreate::new(&fx.network)
        };
        let lost = neutron.create_port(&stray(&uid)).await?;
        let newer = neutron.create_port(&stray("uid-of-a-newer-victim")).await?;
        // The crash: the controller that wired the pods is gone, another one takes over.
        first.stop.cancel();
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c2");

        Api::<Pod>::namespaced(kube.client.clone(), "demo")
            .delete("victim", &DeleteParams::default())
            .await?;
        wait_active_ports(&kube.client, "demo", 1).await?;
        eventually("the unrecorded port deleted with its pod", WAIT, || async {
            Ok(neutron
                .get_port(&lost.id)
                .await
                .err()
                .filter(|e| e.is_not_found())
                .map(|_| ()))
        })
        .await?;
        let left: std::collections::BTreeSet<String> = neutron
            .list_ports(&kuryr_neutron::ListFilter::new().network_id(&fx.network))
            .await?
            .into_iter()
            .map(|p| p.id)
            .collect();
        assert!(
            left.contains(&newer.id),
            "{}: a newer pod's port is kept",
            target.name
        );
        assert_eq!(
            recorded.iter().filter(|p| left.contains(*p)).count(),
            1,
            "{}: the victim's recorded port went, the bystander's stays",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!("orphans[{}]: unrecorded port deleted with its pod", target.name);
    }
    Ok(())
}

/// With no pool (`noop`), a pod port nothing records - its pod and KuryrPort gone while no
/// controller saw it (a finalizer removed by hand) - is deleted by the orphan sweep once it is
/// older than the in-use grace and seen unowned twice; a recorded port and another cluster's stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_pools_a_port_nothing_records_is_swept() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.82.0.0/24").await?;
        let cluster = format!("sweep-{}", uuid::Uuid::new_v4().simple());
        let cfg = format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
             cluster_id = {cluster}\n[vif_pool]\nports_pool_update_frequency = 1\n\
             [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\n",
            fx.project, fx.subnet, fx.sg
        );
        let port = |cluster: &str, pod: &str| PortCreate {
            project_id: Some(fx.project.clone()),
            device_id: Some(format!("uid-of-{pod}")),
            device_owner: Some(COMPUTE_KURYR.into()),
            tags: vec![
                tags::TAG_MANAGED.into(),
                tags::cluster_tag(cluster),
                tags::pod_tag("demo", pod),
            ],
            ..PortCreate::new(&fx.network)
        };
        let left = neutron.create_port(&port(&cluster, "gone")).await?;
        let theirs = neutron.create_port(&port("another-cluster", "theirs")).await?;
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;
        create_pod(&kube.client, "demo", "kept", NODES[0], json!({})).await?;
        let recorded = wait_active_ports(&kube.client, "demo", 1).await?;

        let started = std::time::Instant::now();
        eventually("the unrecorded port swept", WAIT, || async {
            Ok(neutron
                .get_port(&left.id)
                .await
                .err()
                .filter(|e| e.is_not_found())
                .map(|_| ()))
        })
        .await?;
        assert!(
            started.elapsed() >= Duration::from_secs(20),
            "{}: swept at {:?}, within the grace of its creation",
            target.name,
            started.elapsed()
        );
        for id in recorded.iter().chain([&theirs.id]) {
            assert!(neutron.get_port(id).await.is_ok(), "{}: {id} kept", target.name);
        }
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!(
            "orphans[{}]: unrecorded port swept after {:?} without pools",
            target.name,
            started.elapsed()
        );
    }
    Ok(())
}
