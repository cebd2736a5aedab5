//! Pod wiring end to end: the controller against the Kubernetes API emulator and a Neutron
//! (the emulator, and the real neutron-server when KURYR_TEST_NEUTRON_URL is set).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kuryr_crds::KuryrPort;
use kuryr_neutron::ListFilter;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(120);

fn bare_metal_config(fx: &NeutronFixture, extra: &str) -> String {
    format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
         cluster_id = wiring-{}\n{extra}\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nresource_tags = k8s,test\n",
        &fx.project[fx.project.len() - 12..],
        fx.project,
        fx.subnet,
        fx.sg
    )
}

async fn all_kps_active(kube: &kube::Client, ns: &str, n: usize) -> Result<Option<Vec<KuryrPort>>> {
    let kps = Api::<KuryrPort>::namespaced(kube.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items;
    let active = kps
        .iter()
        .filter(|kp| {
            kp.status
                .as_ref()
                .and_then(|s| s.default_vif())
                .is_some_and(|(_, v)| v.active())
        })
        .count();
    Ok((kps.len() == n && active == n).then_some(kps))
}

/// Retries of the handlers that read pods (the `vif` handler, the `kuryrport` handler on a retry).
fn handler_retries(metrics: &kuryr_controller::metrics::Metrics) -> u64 {
    metrics.retries("vif") + metrics.retries("kuryrport")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bare_metal_pods_get_active_ports_and_release_them() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.10.0.0/24").await?;
        let ctrl = start_controller(&kube.client, &target, config(&bare_metal_config(&fx, "")), "c1");
        create_namespace(&kube.client, "demo", json!({})).await?;
        for i in 0..20 {
            create_pod(&kube.client, "demo", &format!("pod-{i}"), NODES[i % 2], json!({})).await?;
        }
        let kps = eventually("20 active KuryrPorts", WAIT, || {
            all_kps_active(&kube.client, "demo", 20)
        })
        .await?;
        // The vif handler hands each new pod to the kuryrport handler with its KuryrPort: a pod
        // is read again only by a retry (a real server may ask for one), at most once each.
        let pod_reads = kube
            .handle
            .requests()
            .snapshot()
            .get("get pods")
            .copied()
            .unwrap_or(0);
        let retries = handler_retries(&ctrl.metrics);
        assert!(
            pod_reads <= retries,
            "{}: the controller read {pod_reads} pods it was handed ({retries} retries)",
            target.name
        );
        let pods = Api::<Pod>::namespaced(kube.client.clone(), "demo");
        for kp in &kps {
            let pod = pods.get(&kp.name_any()).await?;
            assert_eq!(
                kp.spec.pod_uid,
                pod.uid().unwrap(),
                "{}: KuryrPort tracks the pod uid",
                target.name
            );
            assert!(
                pod.finalizers()
                    .iter()
                    .any(|f| f == kuryr_crds::names::finalizers::POD)
            );
            assert!(
                kp.finalizers()
                    .iter()
                    .any(|f| f == kuryr_crds::names::finalizers::KURYRPORT)
            );
            assert_eq!(
                kp.labels().get(kuryr_crds::names::labels::NODE_NAME),
                Some(&kp.spec.pod_node_name)
            );
            assert_eq!(kp.owner_references()[0].uid, pod.uid().unwrap());
            let (ifname, vif) = kp.status.as_ref().unwrap().default_vif().unwrap();
            assert_eq!(ifname, "eth0");
            let port = neutron.get_port(vif.id()).await?;
            assert_eq!(port.device_owner, "compute:kuryr");
            assert_eq!(port.binding_host_id, kp.spec.pod_node_name);
            assert_eq!(port.security_groups, vec![fx.sg.clone()]);
            assert_eq!(port.device_id, kp.spec.pod_uid);
            let cluster = format!("kuryr-rs.cluster=wiring-{}", &fx.project[fx.project.len() - 12..]);
            for tag in ["k8s", "test", "kuryr-rs", cluster.as_str()] {
                assert!(
                    port.tags.iter().any(|t| t == tag),
                    "{}: port tags {:?} lack {tag}",
                    target.name,
                    port.tags
                );
            }
            assert_eq!(
                port.status, "ACTIVE",
                "{}: port {} not ACTIVE",
                target.name, port.id
            );
            assert_eq!(vif.address(), Some(port.mac_address.as_str()));
            let ip = vif.fixed_ips().next().map(|(_, ip)| ip.to_string());
            assert_eq!(ip.as_deref(), Some(port.fixed_ips[0].ip_address.as_str()));
        }
        let owned = ListFilter::new()
            .project_id(&fx.project)
            .device_owner("compute:kuryr");
        assert_eq!(neutron.list_ports(&owned).await?.len(), 20, "{}", target.name);

        // Deleting the pods removes every port (noop pool) and every finalizer.
        for i in 0..20 {
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
        let kps = Api::<KuryrPort>::namespaced(kube.client.clone(), "demo");
        assert!(kps.list(&ListParams::default()).await?.items.is_empty());
        assert!(
            neutron.list_ports(&owned).await?.is_empty(),
            "{}: ports left behind",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!("wiring[{}]: 20 pods wired and released", target.name);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_and_bad_annotation_produce_events_while_others_are_wired() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.11.0.0/24").await?;
        // A second project limited to 2 ports, selected through the namespace annotation.
        let tight = format!("{}-tight", fx.project);
        neutron
            .update_quota(
                &tight,
                &kuryr_neutron::QuotaUpdate {
                    port: Some(2),
                    ..Default::default()
                },
            )
            .await?;
        let cfg = bare_metal_config(&fx, "pod_project_driver = annotation");
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c1");
        create_namespace(&kube.client, "ok", json!({})).await?;
        create_namespace(
            &kube.client,
            "tight",
            json!({"openstack.org/kuryr-project": tight}),
        )
        .await?;
        create_namespace(
            &kube.client,
            "broken",
            json!({"openstack.org/kuryr-project": "  "}),
        )
        .await?;
        for i in 0..2 {
            create_pod(&kube.client, "tight", &format!("t-{i}"), NODES[0], json!({})).await?;
        }
        create_pod(&kube.client, "broken", "b-0", NODES[0], json!({})).await?;
        for i in 0..4 {
            create_pod(&kube.client, "ok", &format!("ok-{i}"), NODES[1], json!({})).await?;
        }
        eventually("pods of 'ok' wired", WAIT, || {
            all_kps_active(&kube.client, "ok", 4)
        })
        .await?;
        // The third pod over the quota only once the first two hold their ports: a real
        // neutron-server does not enforce a quota between creates it runs concurrently (its
        // two API workers let three ports into a quota of two).
        let kps = Api::<KuryrPort>::namespaced(kube.client.clone(), "tight");
        let with_ports = || {
            let kps = kps.clone();
            async move {
                let n = kps
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .filter(|kp| kp.status.as_ref().is_some_and(|s| !s.vifs.is_empty()))
                    .count();
                Ok((n == 2).then_some(()))
            }
        };
        eventually("the two pods within the quota hold their ports", WAIT, with_ports).await?;
        create_pod(&kube.client, "tight", "t-2", NODES[0], json!({})).await?;
        let events_with = |ns: &'static str, reason: &'static str| {
            let api = Api::<Event>::namespaced(kube.client.clone(), ns);
            async move {
                let evs = api.list(&ListParams::default()).await?.items;
                Ok(evs.into_iter().find(|e| e.reason.as_deref() == Some(reason)))
            }
        };
        let quota = eventually("OverQuota event", WAIT, || events_with("tight", "OverQuota")).await?;
        assert_eq!(quota.type_.as_deref(), Some("Warning"));
        assert!(
            quota.note.unwrap_or_default().contains("Quota exceeded"),
            "{}",
            target.name
        );
        let bad = eventually("InvalidInput event", WAIT, || {
            events_with("broken", "InvalidInput")
        })
        .await?;
        assert!(
            bad.note
                .unwrap_or_default()
                .contains("openstack.org/kuryr-project")
        );
        assert_eq!(
            bad.regarding.as_ref().and_then(|r| r.name.as_deref()),
            Some("b-0")
        );
        // Still the two pods that fit the quota hold ports, not the third; the controller is
        // still alive.
        eventually(
            &format!("{}: the two pods within the quota wired", target.name),
            WAIT,
            with_ports,
        )
        .await?;
        assert!(!ctrl.is_finished());
        ctrl.stop.cancel();
        let _ = neutron.reset_quota(&tight).await;
        cleanup_project(neutron, &tight).await;
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_port_that_never_goes_active_produces_an_activation_timeout_event() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.12.0.0/24").await?;
        let cfg = format!(
            "{}[cni_daemon]\nvif_annotation_timeout = 1\n",
            bare_metal_config(&fx, "")
        );
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c1");
        create_namespace(&kube.client, "stuck", json!({})).await?;
        // No L2 agent serves this host: Neutron fails the binding and the port stays DOWN.
        create_pod(&kube.client, "stuck", "s-0", "node-without-agent", json!({})).await?;
        let api = Api::<Event>::namespaced(kube.client.clone(), "stuck");
        let ev = eventually("VIFActivationTimeout event", WAIT, || async {
            let evs = api.list(&ListParams::default()).await?.items;
            Ok(evs
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("VIFActivationTimeout")))
        })
        .await?;
        assert_eq!(
            ev.regarding.as_ref().and_then(|r| r.name.as_deref()),
            Some("s-0"),
            "{}",
            target.name
        );
        assert!(
            ev.note.unwrap_or_default().contains("not active"),
            "{}",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// A KuryrPort whose status was made unreadable (a hand edit; a VIF type from a newer release)
/// does not keep its pod Terminating: deleting the pod releases the port, found by the pod's tags,
/// and both objects go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_whose_kuryrport_cannot_be_read_is_still_deleted_and_its_port_released() -> Result<()> {
    use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.10.3.0/24").await?;
        let ctrl = start_controller(&kube.client, &target, config(&bare_metal_config(&fx, "")), "c1");
        create_namespace(&kube.client, "odd", json!({})).await?;
        create_pod(&kube.client, "odd", "p", NODES[0], json!({})).await?;
        let kps = eventually("an active KuryrPort", WAIT, || {
            all_kps_active(&kube.client, "odd", 1)
        })
        .await?;
        let port_id = kps[0]
            .status
            .as_ref()
            .unwrap()
            .default_vif()
            .unwrap()
            .1
            .id()
            .to_string();
        let raw: Api<DynamicObject> =
            Api::namespaced_with(kube.client.clone(), "odd", &ApiResource::erase::<KuryrPort>(&()));
        let future = json!({"status": {"vifs": {"eth0": {"default": true, "vif": {
            "versioned_object.name": "VIFFromTheFuture", "versioned_object.namespace": "os_vif",
            "versioned_object.version": "1.0", "versioned_object.data": {"id": port_id}}}}}});
        raw.patch("p", &PatchParams::default(), &Patch::Merge(&future))
            .await?;
        // The controller says it cannot read it.
        eventually("a Warning Event on the KuryrPort", WAIT, || async {
            let events = Api::<Event>::namespaced(kube.client.clone(), "odd")
                .list(&ListParams::default())
                .await?
                .items;
            Ok(events
                .iter()
                .any(|e| {
                    e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("KuryrPort")
                        && e.note.as_deref().is_some_and(|n| n.contains("VIFFromTheFuture"))
                })
                .then_some(()))
        })
        .await?;

        let pods = Api::<Pod>::namespaced(kube.client.clone(), "odd");
        pods.delete("p", &DeleteParams::default()).await?;
        eventually("the pod and its KuryrPort gone", WAIT, || async {
            let pod = pods.get_opt("p").await?;
            let kp = raw.get_opt("p").await?;
            Ok((pod.is_none() && kp.is_none()).then_some(()))
        })
        .await?;
        let gone = neutron.get_port(&port_id).await;
        assert!(
            gone.as_ref().is_err_and(|e| e.is_not_found()),
            "{}: port left behind: {gone:?}",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}
