//! Deployment placement end to end: two OpenStack deployments (two Neutron emulators), projects bound by
//! availability zone, a deployment put under maintenance, binding history, and releases going back
//! to the deployment each port came from.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::placement::store::{BindingRecord, CONFIGMAP_NAME};
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_crds::KuryrPort;
use kuryr_neutron::{ClientOptions, ListFilter, NeutronClient};
use neutron_emulator::{Emulator, EmulatorOptions};
use serde_json::json;
use support::*;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

fn start(kube: &kube::Client, ini: &str) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cfg = config(ini);
    let metrics = Metrics::new();
    let deployments = Deployments::from_config(&cfg, &metrics).expect("deployments");
    let mut opts = ControllerOptions::new(cfg, kube.clone(), deployments, metrics);
    opts.health_addr = None;
    opts.metrics_addr = None;
    let stop = CancellationToken::new();
    let s = stop.clone();
    (
        stop,
        tokio::spawn(async move { run(opts, s).await.expect("controller") }),
    )
}

async fn port_of(kube: &kube::Client, ns: &str, pod: &str) -> Result<Option<String>> {
    let kp = Api::<KuryrPort>::namespaced(kube.clone(), ns)
        .get_opt(pod)
        .await?;
    Ok(kp.and_then(|kp| kp.status).and_then(|s| {
        s.default_vif()
            .filter(|(_, v)| v.active())
            .map(|(_, v)| v.id().to_string())
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn projects_bind_by_zone_and_move_off_a_deployment_in_maintenance() -> Result<()> {
    init_logs();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let east = Emulator::start(EmulatorOptions::default()).await?;
    let west = Emulator::start(EmulatorOptions::default()).await?;
    let east_c = NeutronClient::new(&ClientOptions::noauth(east.url()))?;
    let west_c = NeutronClient::new(&ClientOptions::noauth(west.url()))?;
    let fe = neutron_fixture(&east_c, "10.60.0.0/24").await?;
    let fw = neutron_fixture(&west_c, "10.61.0.0/24").await?;
    let kube = start_kube().await?;
    let ini = |east_enabled: bool| {
        format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_project_driver = annotation\ncontroller_namespace = default\n\
             [neutron]\nauth_type = noauth\nendpoint_override = {}\navailability_zone = az1\nbinding_enabled = {}\n\
             pod_subnet = {}\npod_security_groups = {}\n\
             [deployment:west]\nauth_type = noauth\nendpoint_override = {}\navailability_zone = az2\n\
             pod_subnet = {}\npod_security_groups = {}\n\
             [pod_binding]\nenabled = True\nfilters = all,availability_zone\nweighers = creation_order\n",
            east.url(),
            if east_enabled { "True" } else { "False" },
            fe.subnet,
            fe.sg,
            west.url(),
            fw.subnet,
            fw.sg
        )
    };
    let (stop, task) = start(&kube.client, &ini(true));
    create_namespace(
        &kube.client,
        "team-a",
        json!({"openstack.org/kuryr-project": "proj-a"}),
    )
    .await?;
    create_namespace(
        &kube.client,
        "team-b",
        json!({"openstack.org/kuryr-project": "proj-b", "openstack.org/kuryr-availability-zone": "az2"}),
    )
    .await?;
    create_pod(&kube.client, "team-a", "a1", NODES[0], json!({})).await?;
    create_pod(&kube.client, "team-b", "b1", NODES[1], json!({})).await?;
    let a1 = eventually("a1 wired", WAIT, || port_of(&kube.client, "team-a", "a1")).await?;
    let b1 = eventually("b1 wired", WAIT, || port_of(&kube.client, "team-b", "b1")).await?;
    assert_eq!(
        east_c.get_port(&a1).await?.project_id,
        "proj-a",
        "team-a is bound to the first declared deployment"
    );
    assert_eq!(
        west_c.get_port(&b1).await?.project_id,
        "proj-b",
        "team-b asked for az2: west"
    );
    assert!(east_c.get_port(&b1).await.is_err());

    // East goes into maintenance: the controller restarts with binding_enabled = False.
    stop.cancel();
    task.await?;
    let (stop, task) = start(&kube.client, &ini(false));
    create_pod(&kube.client, "team-a", "a2", NODES[0], json!({})).await?;
    let a2 = eventually("a2 wired", WAIT, || port_of(&kube.client, "team-a", "a2")).await?;
    assert_eq!(
        west_c.get_port(&a2).await?.project_id,
        "proj-a",
        "proj-a re-bound to west"
    );

    let cm = Api::<ConfigMap>::namespaced(kube.client.clone(), "default")
        .get(CONFIGMAP_NAME)
        .await?;
    let history: Vec<BindingRecord> = serde_json::from_str(&cm.data.unwrap()["proj-a"])?;
    let names: Vec<&str> = history.iter().map(|b| b.deployment.as_str()).collect();
    assert_eq!(names, ["default", "west"]);
    assert!(history[0].end.is_some() && history[1].end.is_none());

    // a1's port lives in east: releasing it goes there, whatever the current binding is.
    let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "team-a");
    pods.delete("a1", &DeleteParams::default()).await?;
    eventually("a1 released in east", WAIT, || async {
        Ok(east_c
            .get_port(&a1)
            .await
            .err()
            .filter(|e| e.is_not_found())
            .map(|_| ()))
    })
    .await?;
    assert!(west_c.get_port(&a2).await.is_ok());
    let left = east_c.list_ports(&ListFilter::new().project_id("proj-a")).await?;
    assert!(left.is_empty(), "{left:?}");
    // The port goes first, then the finalizers: the pod is gone once both are released.
    eventually("a1 gone", WAIT, || async {
        let gone = pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .all(|p| p.metadata.name.as_deref() != Some("a1"));
        Ok(gone.then_some(()))
    })
    .await?;
    stop.cancel();
    task.await?;
    Ok(())
}
