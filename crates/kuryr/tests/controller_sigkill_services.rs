//! The `kuryr controller` process SIGKILLed while its load balancer is PENDING_CREATE, then started
//! again: exactly one load balancer for the Service, ACTIVE, with the right members, and the
//! KuryrLoadBalancer status written. A real child process (not a task aborted in the test's own
//! runtime), against the Kubernetes, Neutron and Octavia emulators; the Octavia emulator's worker keeps
//! a new load balancer PENDING_CREATE for 4 s, so the kill lands inside that window.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use kuryr_crds::KuryrLoadBalancer;
use kuryr_neutron::octavia::{LoadBalancer, OctaviaClient};
use kuryr_neutron::{ClientOptions, ListFilter};
use kuryr_testbed::*;
use octavia_emulator::{LatencyProfile, OctaviaEmulator, OctaviaOptions, WorkerDelays};
use serde_json::json;
use support::controller;

const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "sigkill";

async fn lbs_named(client: &OctaviaClient, name: &str) -> Result<Vec<LoadBalancer>> {
    Ok(client
        .list_load_balancers(&ListFilter::new().name(name.to_string()))
        .await?
        .into_iter()
        .filter(|lb| lb.provisioning_status != "DELETED")
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_process_killed_while_its_load_balancer_is_pending_create_leaves_exactly_one()
-> Result<()> {
    init_logs();
    let kube = start_kube().await?;
    let neutron = neutron_targets().await?.remove(0);
    let fx = neutron_fixture_subnets(&neutron.client, &["10.1.0.0/24", "10.96.0.0/24"]).await?;
    let octavia = OctaviaEmulator::start(OctaviaOptions {
        latency: LatencyProfile::Custom {
            api_ms: BTreeMap::new(),
            worker: WorkerDelays {
                lb_create_ms: 4_000,
                lb_delete_ms: 200,
                ..WorkerDelays::default()
            },
        },
        ..OctaviaOptions::default()
    })
    .await?;
    let oct = OctaviaClient::new(&ClientOptions::noauth(octavia.url()))?;
    create_namespace(&kube.client, NS, json!({})).await?;

    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    kube.handle.write_kubeconfig(&kubeconfig)?;
    let conf = dir.path().join("kuryr.conf");
    // Octavia takes Keystone-sized project ids, which the fixture's descriptive names are not.
    let project = uuid::Uuid::new_v4().simple().to_string();
    std::fs::write(
        &conf,
        format!(
            "[kubernetes]\nenabled_handlers = service,endpoints,kuryrloadbalancer\npod_vif_driver = neutron-vif\n\
             vif_pool_driver = noop\ncluster_id = sigkill-{project}\n\
             [neutron]\nendpoint_override = {neutron}\nload_balancer_endpoint_override = {octavia}\n\
             [neutron_defaults]\nproject = {project}\npod_subnet = {pod}\npod_security_groups = {sg}\n\
             service_subnet = {svc}\n\
             [health_server]\nport = 0\n[prometheus_exporter]\ncontroller_exporter_port = 0\n",
            neutron = neutron.url,
            octavia = octavia.url(),
            pod = fx.subnet,
            sg = fx.sg,
            svc = fx.subnets[1].subnet,
        ),
    )?;
    let log = dir.path().join("controller.log");
    let mut first = controller(&conf, &kubeconfig, &log)?;

    // Three ready endpoints first, so that the Service is one fully populated create.
    let backends = ["10.1.0.10", "10.1.0.11", "10.1.0.12"];
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-slice", "namespace": NS, "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": backends.iter().enumerate().map(|(i, ip)| json!({
            "addresses": [ip], "conditions": {"ready": true},
            "targetRef": {"kind": "Pod", "name": format!("web-{i}"), "namespace": NS}
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))?;
    Api::<EndpointSlice>::namespaced(kube.client.clone(), NS)
        .create(&PostParams::default(), &slice)
        .await?;
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.11", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    }))?;
    let services = Api::<Service>::namespaced(kube.client.clone(), NS);
    services.create(&PostParams::default(), &svc).await?;

    let name = format!("{NS}/web");
    eventually("the load balancer PENDING_CREATE", WAIT, || async {
        Ok(lbs_named(&oct, &name)
            .await?
            .into_iter()
            .find(|lb| lb.provisioning_status == "PENDING_CREATE")
            .map(|_| ()))
    })
    .await?;
    first.start_kill()?; // SIGKILL
    let status = first.wait().await?;
    assert!(!status.success(), "killed: {status}");
    let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.client.clone(), NS);
    assert!(
        klbs.get("web")
            .await?
            .status
            .and_then(|s| s.loadbalancer)
            .is_none(),
        "killed before the status was written"
    );
    assert_eq!(
        lbs_named(&oct, &name).await?[0].provisioning_status,
        "PENDING_CREATE",
        "killed inside the window"
    );

    let mut second = controller(&conf, &kubeconfig, &log)?;
    let st = eventually("KuryrLoadBalancer status with 3 members", WAIT, || async {
        let st = klbs.get_opt("web").await?.and_then(|k| k.status);
        Ok(st.filter(|s| s.loadbalancer.is_some() && s.listeners.len() == 1 && s.members.len() == 3))
    })
    .await
    .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    let lbs = lbs_named(&oct, &name).await?;
    assert_eq!(lbs.len(), 1, "exactly one load balancer: {lbs:?}");
    assert_eq!(lbs[0].provisioning_status, "ACTIVE");
    assert_eq!(
        st.loadbalancer.as_ref().map(|l| l.id.as_str()),
        Some(lbs[0].id.as_str())
    );
    assert_eq!(
        octavia.stats().count("loadbalancer.create"),
        1,
        "{:?}",
        octavia.stats()
    );
    let tree = oct.get_status_tree(&lbs[0].id).await?;
    let members: BTreeSet<(String, u16)> = tree
        .loadbalancer
        .listeners
        .iter()
        .flat_map(|l| &l.pools)
        .flat_map(|p| &p.members)
        .map(|m| (m.address.clone(), m.protocol_port))
        .collect();
    let want: BTreeSet<(String, u16)> = backends.iter().map(|ip| (ip.to_string(), 8080)).collect();
    assert_eq!(members, want);
    let recorded: BTreeSet<(String, u16)> = st
        .members
        .iter()
        .map(|m| (m.ip.clone(), u16::try_from(m.port).unwrap()))
        .collect();
    assert_eq!(recorded, want);

    services.delete("web", &DeleteParams::default()).await?;
    eventually("the load balancer released", WAIT, || async {
        Ok(lbs_named(&oct, &name).await?.is_empty().then_some(()))
    })
    .await?;
    second.start_kill()?;
    second.wait().await?;
    let text = std::fs::read_to_string(&log)?;
    assert!(!text.lines().any(|l| l.contains(" ERROR ")), "{text}");
    cleanup_project(&neutron.client, &fx.project).await;
    Ok(())
}
