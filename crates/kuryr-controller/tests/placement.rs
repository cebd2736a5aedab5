//! Deployment placement end to end on two OpenStack deployments (two Neutron emulators; the same
//! tests run against real neutron-servers in `placement_real.rs`): projects bound per (project,
//! zone/affinity group), maintenance set on a `KuryrOpenStackDeployment` without a restart, binding
//! history in `KuryrProjectBinding`, namespace networks finalized in the deployment they were made
//! in, and a deployment removed from the configuration drained instead of stuck.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_crds::names::annotations::DEPLOYMENT;
use kuryr_crds::{KuryrNetwork, KuryrOpenStackDeployment, KuryrPort, KuryrProjectBinding};
use kuryr_neutron::{ClientOptions, ListFilter, NeutronClient};
use neutron_emulator::{Emulator, EmulatorHandle, EmulatorOptions};
use serde_json::json;
use support::*;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

fn start(kube: &kube::Client, ini: &str) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    start_with(kube, ini, Metrics::new())
}

fn start_with(
    kube: &kube::Client,
    ini: &str,
    metrics: Metrics,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cfg = config(ini);
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

/// The history of `project`'s binding in its general group: (deployment, still current).
async fn history(kube: &kube::Client, project: &str) -> Result<Vec<(String, bool)>> {
    let b = Api::<KuryrProjectBinding>::all(kube.clone())
        .get(&kuryr_crds::binding_name(project, ""))
        .await?;
    Ok(b.status
        .unwrap_or_default()
        .history
        .into_iter()
        .map(|h| (h.deployment, h.unbound_at.is_none()))
        .collect())
}

/// An Event with `reason` regarding `name` whose note contains `text`, in any namespace.
async fn event(kube: &kube::Client, name: &str, reason: &str, text: &str) -> Result<Event> {
    let api = Api::<Event>::all(kube.clone());
    eventually(
        &format!("{reason} Event on {name} saying {text:?}"),
        WAIT,
        || async {
            Ok(api
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                        && e.note.as_deref().unwrap_or("").contains(text)
                }))
        },
    )
    .await
}

async fn set_maintenance(kube: &kube::Client, deployment: &str, on: bool, move_existing: bool) -> Result<()> {
    let patch =
        json!({"spec": {"maintenance": {"enabled": on, "reason": "upgrade"}, "moveExisting": move_existing}});
    Api::<KuryrOpenStackDeployment>::all(kube.clone())
        .patch(deployment, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

struct Two {
    east: NeutronClient,
    west: NeutronClient,
    fe: NeutronFixture,
    fw: NeutronFixture,
    urls: (String, String),
    _emulators: (EmulatorHandle, EmulatorHandle),
}

async fn two_emulators() -> Result<Two> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let e = Emulator::start(EmulatorOptions::default()).await?;
    let w = Emulator::start(EmulatorOptions::default()).await?;
    let east = NeutronClient::new(&ClientOptions::noauth(e.url()))?;
    let west = NeutronClient::new(&ClientOptions::noauth(w.url()))?;
    let fe = neutron_fixture(&east, "10.60.0.0/24").await?;
    let fw = neutron_fixture(&west, "10.61.0.0/24").await?;
    Ok(Two {
        east,
        west,
        fe,
        fw,
        urls: (e.url().to_string(), w.url().to_string()),
        _emulators: (e, w),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn projects_bind_per_group_and_maintenance_set_with_the_api_moves_them_without_restart() -> Result<()> {
    init_logs();
    let t = two_emulators().await?;
    let (east_url, west_url) = t.urls.clone();
    let kube = start_kube().await?;
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_project_driver = annotation\ncontroller_namespace = default\n\
         [neutron]\nauth_type = noauth\nendpoint_override = {east_url}\navailability_zone = az1\n\
         pod_subnet = {}\npod_security_groups = {}\n\
         [deployment:west]\nauth_type = noauth\nendpoint_override = {west_url}\navailability_zone = az2\n\
         pod_subnet = {}\npod_security_groups = {}\n\
         [pod_binding]\nenabled = True\nfilters = all,availability_zone\nweighers = creation_order\n",
        t.fe.subnet, t.fe.sg, t.fw.subnet, t.fw.sg
    );
    let (stop, task) = start(&kube.client, &ini);
    // One project, two namespaces asking for different zones: bound in both at once.
    create_namespace(
        &kube.client,
        "team-a",
        json!({"openstack.org/kuryr-project": "proj-a"}),
    )
    .await?;
    create_namespace(
        &kube.client,
        "team-a-west",
        json!({"openstack.org/kuryr-project": "proj-a", "openstack.org/kuryr-availability-zone": "az2"}),
    )
    .await?;
    create_namespace(
        &kube.client,
        "team-bad",
        json!({"openstack.org/kuryr-project": "proj-c", "openstack.org/kuryr-resource-affinity": "gpu"}),
    )
    .await?;
    create_namespace(
        &kube.client,
        "team-nowhere",
        json!({"openstack.org/kuryr-project": "proj-d", "openstack.org/kuryr-availability-zone": "az9"}),
    )
    .await?;
    create_pod(&kube.client, "team-a", "a1", NODES[0], json!({})).await?;
    create_pod(&kube.client, "team-a-west", "w1", NODES[1], json!({})).await?;
    create_pod(&kube.client, "team-bad", "c1", NODES[1], json!({})).await?;
    create_pod(&kube.client, "team-nowhere", "d1", NODES[1], json!({})).await?;
    let a1 = eventually("a1 wired", WAIT, || port_of(&kube.client, "team-a", "a1")).await?;
    let w1 = eventually("w1 wired", WAIT, || port_of(&kube.client, "team-a-west", "w1")).await?;
    assert_eq!(
        t.east.get_port(&a1).await?.project_id,
        "proj-a",
        "general group: east"
    );
    assert_eq!(
        t.west.get_port(&w1).await?.project_id,
        "proj-a",
        "az2 group: west"
    );
    assert!(t.east.get_port(&w1).await.is_err());

    // Bad input is a Warning Event on the namespace naming it; no deployment passing lists the
    // filters' eliminations (and is retried).
    event(
        &kube.client,
        "team-bad",
        "InvalidInput",
        "openstack.org/kuryr-resource-affinity[0]",
    )
    .await?;
    event(
        &kube.client,
        "team-nowhere",
        "NoDeploymentPasses",
        "availability_zone removed default (zone az1 is not az9), west (zone az2 is not az9)",
    )
    .await?;

    // Both deployments got their object from kuryr.conf; one without credentials is refused on itself.
    let kosd: Api<KuryrOpenStackDeployment> = Api::all(kube.client.clone());
    let names: Vec<String> = kosd
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|o| o.name_any())
        .collect();
    assert_eq!(names, ["default", "west"]);
    kosd.create(
        &Default::default(),
        &KuryrOpenStackDeployment::new("ghost", Default::default()),
    )
    .await?;
    let cond = eventually("ghost condition", WAIT, || async {
        Ok(kosd
            .get("ghost")
            .await?
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Configured")))
    })
    .await?;
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "NoCredentials")
    );
    assert!(cond.message.contains("[deployment:ghost]"), "{}", cond.message);

    // Maintenance on east, set with the API, no restart: with move_existing off proj-a stays...
    set_maintenance(&kube.client, "default", true, false).await?;
    create_namespace(
        &kube.client,
        "team-b",
        json!({"openstack.org/kuryr-project": "proj-b"}),
    )
    .await?;
    create_pod(&kube.client, "team-b", "b1", NODES[0], json!({})).await?;
    create_pod(&kube.client, "team-a", "a2", NODES[0], json!({})).await?;
    let b1 = eventually("b1 wired", WAIT, || port_of(&kube.client, "team-b", "b1")).await?;
    assert_eq!(
        t.west.get_port(&b1).await?.project_id,
        "proj-b",
        "new bindings avoid east"
    );
    let a2 = eventually("a2 wired", WAIT, || port_of(&kube.client, "team-a", "a2")).await?;
    assert_eq!(
        t.east.get_port(&a2).await?.project_id,
        "proj-a",
        "proj-a stays on east"
    );
    // ...with it on, proj-a moves, with an Event and a history row.
    set_maintenance(&kube.client, "default", true, true).await?;
    create_pod(&kube.client, "team-a", "a3", NODES[0], json!({})).await?;
    let a3 = eventually("a3 wired", WAIT, || port_of(&kube.client, "team-a", "a3")).await?;
    assert_eq!(
        t.west.get_port(&a3).await?.project_id,
        "proj-a",
        "proj-a moved to west"
    );
    assert_eq!(
        history(&kube.client, "proj-a").await?,
        [("default".to_string(), false), ("west".to_string(), true)]
    );
    event(
        &kube.client,
        "team-a",
        "ProjectMoved",
        "moved from deployment default to west",
    )
    .await?;

    // a1's port lives in east: releasing it goes there, whatever the binding is now.
    let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "team-a");
    pods.delete("a1", &DeleteParams::default()).await?;
    eventually("a1 released in east", WAIT, || async {
        Ok(t.east
            .get_port(&a1)
            .await
            .err()
            .filter(|e| e.is_not_found())
            .map(|_| ()))
    })
    .await?;
    assert!(t.west.get_port(&a3).await.is_ok());
    stop.cancel();
    task.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_networks_are_finalized_where_they_were_made_and_a_removed_deployment_drains() -> Result<()>
{
    init_logs();
    let t = two_emulators().await?;
    let (east_url, west_url) = t.urls.clone();
    let (pe, re) = namespace_subnet_infra(&t.east, &t.fe.project, "10.98.0.0/16").await?;
    let (pw, rw) = namespace_subnet_infra(&t.west, &t.fw.project, "10.97.0.0/16").await?;
    let kube = start_kube().await?;
    let west_section = format!(
        "[deployment:west]\nauth_type = noauth\nendpoint_override = {west_url}\n\
         pod_security_groups = {}\npod_router = {}\npod_subnet_pool = {}\n",
        t.fw.sg, rw.id, pw.id
    );
    let ini = |with_west: bool| {
        format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport,namespace,kuryrnetwork\npod_subnets_driver = namespace\n\
             pod_project_driver = annotation\ncontroller_namespace = default\n\
             [neutron_defaults]\nproject = proj-system\n\
             [neutron]\nauth_type = noauth\nendpoint_override = {east_url}\n\
             pod_security_groups = {}\npod_router = {}\npod_subnet_pool = {}\n{}\
             [pod_binding]\nenabled = True\n",
            t.fe.sg,
            re.id,
            pe.id,
            if with_west { west_section.as_str() } else { "" }
        )
    };
    let count = |c: &NeutronClient, project: &str| {
        let (c, project) = (c.clone(), project.to_string());
        async move {
            let nets = c
                .list_networks(&ListFilter::new().project_id(&project))
                .await?
                .len();
            let subnets = c
                .list_subnets(&ListFilter::new().project_id(&project))
                .await?
                .len();
            let ports = c.list_ports(&ListFilter::new().project_id(&project)).await?.len();
            anyhow::Ok((nets, subnets, ports))
        }
    };
    let east_before = count(&t.east, "proj-a").await?;
    let (stop, task) = start(&kube.client, &ini(true));
    let kns = |ns: &str| Api::<KuryrNetwork>::namespaced(kube.client.clone(), ns);
    create_namespace(
        &kube.client,
        "old",
        json!({"openstack.org/kuryr-project": "proj-a"}),
    )
    .await?;
    create_pod(&kube.client, "old", "o1", NODES[0], json!({})).await?;
    let o1 = eventually("o1 wired", WAIT, || port_of(&kube.client, "old", "o1")).await?;
    assert!(t.east.get_port(&o1).await.is_ok());
    let old = eventually("old's router interface", WAIT, || async {
        Ok(kns("old")
            .get_opt("old")
            .await?
            .filter(|kn| kn.status.as_ref().is_some_and(|s| s.router_id.is_some())))
    })
    .await?;
    assert_eq!(
        old.annotations().get(DEPLOYMENT).map(String::as_str),
        Some("default")
    );

    // proj-a moves to west: new namespaces go there; the old namespace keeps its network (and its
    // new pods) in east.
    set_maintenance(&kube.client, "default", true, true).await?;
    create_namespace(
        &kube.client,
        "new",
        json!({"openstack.org/kuryr-project": "proj-a"}),
    )
    .await?;
    create_pod(&kube.client, "new", "n1", NODES[0], json!({})).await?;
    create_pod(&kube.client, "old", "o2", NODES[0], json!({})).await?;
    let n1 = eventually("n1 wired", WAIT, || port_of(&kube.client, "new", "n1")).await?;
    let o2 = eventually("o2 wired", WAIT, || port_of(&kube.client, "old", "o2")).await?;
    assert!(t.west.get_port(&n1).await.is_ok(), "new namespace in west");
    assert!(
        t.east.get_port(&o2).await.is_ok(),
        "old namespace's pods stay in east"
    );
    assert_eq!(
        kns("new")
            .get("new")
            .await?
            .annotations()
            .get(DEPLOYMENT)
            .map(String::as_str),
        Some("west")
    );

    // The old namespace goes: everything it had in east goes with it, counts back to the start.
    let old_status = old.status.unwrap();
    let (old_net, old_subnet) = (old_status.net_id.unwrap(), old_status.subnet_id.unwrap());
    assert!(
        t.east
            .list_ports(&ListFilter::new().device_id(&re.id))
            .await?
            .iter()
            .any(|p| p.fixed_ips.iter().any(|f| f.subnet_id == old_subnet)),
        "old's router interface is in east"
    );
    Api::<Pod>::namespaced(kube.client.clone(), "old")
        .delete("o2", &DeleteParams::default())
        .await?;
    delete_namespace_and_wait(&kube.client, &t.east, "old", "o1", &old_net).await?;
    eventually("old namespace's resources gone from east", WAIT, || async {
        let now = count(&t.east, "proj-a").await?;
        // The system namespaces (project proj-system) keep their own router interfaces.
        let router_on_old = t
            .east
            .list_ports(&ListFilter::new().device_id(&re.id))
            .await?
            .iter()
            .any(|p| p.fixed_ips.iter().any(|f| f.subnet_id == old_subnet));
        Ok((now == east_before && !router_on_old).then_some(()))
    })
    .await?;

    // west leaves kuryr.conf while "new" still has a network there: deleting the namespace is
    // not stuck, and an Event says what was left behind.
    stop.cancel();
    task.await?;
    let (stop, task) = start(&kube.client, &ini(false));
    Api::<Namespace>::all(kube.client.clone())
        .delete("new", &DeleteParams::default())
        .await?;
    event(
        &kube.client,
        "new",
        "DeploymentRemoved",
        "\"west\" is no longer configured",
    )
    .await?;
    eventually("KuryrNetwork new gone", WAIT, || async {
        Ok(kns("new").get_opt("new").await?.is_none().then_some(()))
    })
    .await?;
    stop.cancel();
    task.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_deployment_shows_stale_without_delaying_the_others_and_bad_objects_are_refused() -> Result<()>
{
    init_logs();
    let t = two_emulators().await?;
    let (east_url, west_url) = t.urls.clone();
    // East never answers the IP availability call the measurement makes.
    t._emulators
        .0
        .set_latency(neutron_emulator::LatencyProfile::Custom(
            neutron_emulator::LatencyTable {
                default: Default::default(),
                ops: [(
                    "network_ip_availability.get".to_string(),
                    neutron_emulator::OpLatency::fixed(600_000),
                )]
                .into(),
            },
        ));
    let kube = start_kube().await?;
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\ncontroller_namespace = default\n\
         [neutron_defaults]\nproject = proj-a\n\
         [neutron]\nauth_type = noauth\nendpoint_override = {east_url}\npod_subnet = {}\npod_security_groups = {}\n\
         [deployment:west]\nauth_type = noauth\nendpoint_override = {west_url}\npod_subnet = {}\npod_security_groups = {}\n\
         [pod_binding]\nenabled = True\nfilters = all,usage_threshold\nusage_refresh_interval = 1\nusage_timeout = 1\n",
        t.fe.subnet, t.fe.sg, t.fw.subnet, t.fw.sg
    );
    let (stop, task) = start(&kube.client, &ini);
    let kosd: Api<KuryrOpenStackDeployment> = Api::all(kube.client.clone());
    let status = |name: &'static str| {
        let kosd = kosd.clone();
        async move { anyhow::Ok(kosd.get_opt(name).await?.and_then(|o| o.status)) }
    };
    let east = eventually("east stale", WAIT, || async {
        Ok(status("default").await?.filter(|s| s.stale))
    })
    .await?;
    let why = east
        .usage
        .as_ref()
        .and_then(|u| u.get("staleBecause"))
        .and_then(|v| v.as_str());
    assert!(why.is_some_and(|w| w.contains("no answer within 1s")), "{east:?}");
    assert_eq!(east.measured_at, None, "never measured: no age to show");
    // West is measured every round meanwhile: its time moves on, its figure is fresh.
    let first = eventually("west measured", WAIT, || async {
        Ok(status("west")
            .await?
            .filter(|s| !s.stale)
            .and_then(|s| s.measured_at))
    })
    .await?;
    let west = eventually("west measured again", WAIT, || async {
        Ok(status("west")
            .await?
            .filter(|s| s.measured_at.as_ref().is_some_and(|m| *m != first)))
    })
    .await?;
    assert!(!west.stale);
    assert_eq!(
        west.usage
            .as_ref()
            .and_then(|u| u.pointer("/ipv4/total"))
            .and_then(|v| v.as_str()),
        Some("253"),
        "{west:?}"
    );
    // A stale deployment takes no new binding: proj-a goes to west.
    create_namespace(&kube.client, "team-a", json!({})).await?;
    create_pod(&kube.client, "team-a", "a1", NODES[0], json!({})).await?;
    let a1 = eventually("a1 wired", WAIT, || port_of(&kube.client, "team-a", "a1")).await?;
    assert!(t.west.get_port(&a1).await.is_ok());
    // The schema refuses a malformed zone.
    let bad = KuryrOpenStackDeployment::new(
        "bad",
        kuryr_crds::KuryrOpenStackDeploymentSpec {
            availability_zone: Some("a:b".into()),
            ..Default::default()
        },
    );
    match kosd.create(&Default::default(), &bad).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422, "{s:?}"),
        other => panic!("{other:?}"),
    }
    stop.cancel();
    task.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_project_over_its_port_quota_threshold_is_rebound_with_a_history_row_and_metrics() -> Result<()> {
    init_logs();
    let t = two_emulators().await?;
    let (east_url, west_url) = t.urls.clone();
    t.east
        .update_quota(
            "proj-a",
            &kuryr_neutron::QuotaUpdate {
                port: Some(2),
                ..Default::default()
            },
        )
        .await?;
    let kube = start_kube().await?;
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\ncontroller_namespace = default\n\
         [neutron_defaults]\nproject = proj-a\n\
         [neutron]\nauth_type = noauth\nendpoint_override = {east_url}\npod_subnet = {}\npod_security_groups = {}\n\
         [deployment:west]\nauth_type = noauth\nendpoint_override = {west_url}\npod_subnet = {}\npod_security_groups = {}\n\
         [pod_binding]\nenabled = True\nfilters = all,usage_threshold\nusage_threshold = 0.9\nusage_refresh_interval = 1\n",
        t.fe.subnet, t.fe.sg, t.fw.subnet, t.fw.sg
    );
    let metrics = Metrics::new();
    let (stop, task) = start_with(&kube.client, &ini, metrics.clone());
    create_namespace(&kube.client, "team-a", json!({})).await?;
    for pod in ["a1", "a2"] {
        create_pod(&kube.client, "team-a", pod, NODES[0], json!({})).await?;
        let p = eventually("wired", WAIT, || port_of(&kube.client, "team-a", pod)).await?;
        assert!(t.east.get_port(&p).await.is_ok(), "{pod} in east");
    }
    // 2 of 2 ports used: once measured, proj-a is over east's threshold.
    eventually("east's port figure measured", WAIT, || async {
        let text = metrics.encode();
        Ok(text
            .lines()
            .any(|l| {
                l.starts_with("kuryr_deployment_usage_ratio{")
                    && l.contains("deployment=\"default\"")
                    && l.contains("resource=\"ports:proj-a\"")
                    && l.ends_with(" 1.0")
            })
            .then_some(()))
    })
    .await?;
    create_pod(&kube.client, "team-a", "a3", NODES[0], json!({})).await?;
    let a3 = eventually("a3 wired", WAIT, || port_of(&kube.client, "team-a", "a3")).await?;
    assert!(t.west.get_port(&a3).await.is_ok(), "rebound to west");
    assert_eq!(
        history(&kube.client, "proj-a").await?,
        [("default".to_string(), false), ("west".to_string(), true)]
    );
    let b = Api::<KuryrProjectBinding>::all(kube.client.clone())
        .get(&kuryr_crds::binding_name("proj-a", ""))
        .await?;
    let why = &b.status.unwrap_or_default().history[1].why;
    assert!(why.contains("reached its threshold 0.900"), "{why}");
    event(
        &kube.client,
        "team-a",
        "ProjectMoved",
        "moved from deployment default to west",
    )
    .await?;
    stop.cancel();
    task.await?;
    Ok(())
}
