//! Deployment placement end to end. The first tests run on two Neutron emulators: projects bound
//! per (project, zone/affinity group), maintenance set on a `KuryrOpenStackDeployment` without a
//! restart, binding history in `KuryrProjectBinding`, namespace networks finalized in the
//! deployment they were made in, a deployment removed from the configuration drained instead of
//! stuck. The `four_deployments_*` tests run on four deployments in two affinity groups, two of
//! them real neutron-servers when `KURYR_TEST_NEUTRON_URL` and `KURYR_TEST_NEUTRON_URL_2` are set
//! (docs/placement.md lists what each proves).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
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
    let api = Api::<KuryrOpenStackDeployment>::all(kube.clone());
    let edited = api
        .patch(deployment, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    followed(kube, deployment, edited.metadata.generation).await
}

/// Waits until the controller follows `generation` of `deployment`'s spec, as an operator would
/// with `kubectl wait --for=jsonpath='{.status.observedGeneration}'=N kosd/NAME`.
async fn followed(kube: &kube::Client, deployment: &str, generation: Option<i64>) -> Result<()> {
    let api = Api::<KuryrOpenStackDeployment>::all(kube.clone());
    let generation = generation.context("the API server sets metadata.generation")?;
    eventually(
        &format!("{deployment} generation {generation} followed"),
        WAIT,
        || async {
            Ok(api
                .get(deployment)
                .await?
                .status
                .and_then(|s| s.observed_generation)
                .filter(|g| *g >= generation)
                .map(|_| ()))
        },
    )
    .await
}

struct Two {
    east: NeutronClient,
    west: NeutronClient,
    fe: NeutronFixture,
    fw: NeutronFixture,
    urls: (String, String),
    _emulators: (EmulatorHandle, EmulatorHandle),
}

impl Two {
    /// kuryr.conf's `[neutron]` (east) and `[deployment:west]` sections, each on its emulator
    /// with its fixture's subnet and group, `east` and `west` appended to them.
    fn deployments(&self, east: &str, west: &str) -> String {
        let section = |head: &str, url: &str, fx: &NeutronFixture, extra: &str| {
            format!(
                "[{head}]\nauth_type = noauth\nendpoint_override = {url}\npod_subnet = {}\n\
                 pod_security_groups = {}\n{extra}",
                fx.subnet, fx.sg
            )
        };
        section("neutron", &self.urls.0, &self.fe, east)
            + &section("deployment:west", &self.urls.1, &self.fw, west)
    }
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
    let kube = start_kube().await?;
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_project_driver = annotation\ncontroller_namespace = default\n\
         {}\
         [pod_binding]\nenabled = True\nfilters = all,availability_zone\nweighers = creation_order\n",
        t.deployments("availability_zone = az1\n", "availability_zone = az2\n")
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

/// Creates pod `name` in `ns` on the first node and waits until it is wired: its port's id.
async fn wired(kube: &kube::Client, ns: &str, name: &str) -> Result<String> {
    create_pod(kube, ns, name, NODES[0], json!({})).await?;
    eventually(&format!("{name} wired"), WAIT, || port_of(kube, ns, name)).await
}

/// `status.inMaintenance` of deployment object `name` once it reads `want`.
async fn in_maintenance(kube: &kube::Client, name: &str, want: bool) -> Result<()> {
    let api = Api::<KuryrOpenStackDeployment>::all(kube.clone());
    eventually(&format!("{name} inMaintenance = {want}"), WAIT, || async {
        Ok(api
            .get(name)
            .await?
            .status
            .filter(|s| s.in_maintenance == want)
            .map(|_| ()))
    })
    .await
}

/// An operator's edits take effect without a restart and without waiting for a usage round: a
/// request no deployment could take is retried and served once one can; a maintenance window ends
/// by itself at its `until`; a binding moved by an operator serves the project's next pod at once;
/// `binding_enabled = False` in kuryr.conf for a deployment whose object exists without
/// `spec.maintenance` (made before the setting changed): the scheduler keeps new bindings off
/// it, and its `status.inMaintenance` says so (it said false, read from the object alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_set_in_kuryr_conf_shows_on_an_existing_object() -> Result<()> {
    init_logs();
    let t = two_emulators().await?;
    let kube = start_kube().await?;
    let obj: KuryrOpenStackDeployment = serde_json::from_value(json!({
        "apiVersion": "openstack.org/v1", "kind": "KuryrOpenStackDeployment",
        "metadata": {"name": "west"}, "spec": {}
    }))?;
    Api::<KuryrOpenStackDeployment>::all(kube.client.clone())
        .create(&kube::api::PostParams::default(), &obj)
        .await?;
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_project_driver = annotation\ncontroller_namespace = default\n\
         {}\
         [pod_binding]\nenabled = True\nfilters = all\nweighers = creation_order\nusage_refresh_interval = 3600\n\
         usage_threshold = 0.8\n",
        t.deployments("", "binding_enabled = False\n")
    );
    let (stop, task) = start(&kube.client, &ini);
    in_maintenance(&kube.client, "west", true).await?;
    in_maintenance(&kube.client, "default", false).await?;
    // The threshold and headroom decided with are published: kuryr.conf's where the spec states
    // none (`kuryr bindings move` reads them), the spec's once it states one.
    let api = Api::<KuryrOpenStackDeployment>::all(kube.client.clone());
    let decided = |name: &'static str| {
        let api = api.clone();
        async move {
            let s = api.get(name).await?.status.unwrap_or_default();
            anyhow::Ok((s.usage_threshold, s.headroom))
        }
    };
    eventually("default's threshold and headroom published", WAIT, || async {
        Ok((decided("default").await? == (Some(0.8), Some(0.05))).then_some(()))
    })
    .await?;
    patch_deployment(&kube.client, "west", json!({"usageThreshold": 0.6})).await?;
    assert_eq!(decided("west").await?, (Some(0.6), Some(0.05)));
    stop.cancel();
    task.await?;
    Ok(())
}

/// a spec the controller cannot follow as written is a `Valid=False` condition naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_edits_take_effect_at_once_and_a_refused_request_is_served_once_a_deployment_passes()
-> Result<()> {
    init_logs();
    let t = two_emulators().await?;
    let kube = start_kube().await?;
    // No usage refresh within the test: only the watches can bring the edits in.
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_project_driver = annotation\ncontroller_namespace = default\n\
         {}\
         [pod_binding]\nenabled = True\nfilters = all\nweighers = creation_order\nusage_refresh_interval = 3600\n",
        t.deployments("", "")
    );
    let (stop, task) = start(&kube.client, &ini);
    let ns = |project: &str| json!({"openstack.org/kuryr-project": project});

    // Both deployments in maintenance: nothing passes, an Event says what each filter removed...
    patch_deployment(&kube.client, "default", json!({"maintenance": {"enabled": true}})).await?;
    patch_deployment(&kube.client, "west", json!({"maintenance": {"enabled": true}})).await?;
    create_namespace(&kube.client, "team-r", ns("proj-r")).await?;
    create_pod(&kube.client, "team-r", "r1", NODES[0], json!({})).await?;
    event(&kube.client, "team-r", "NoDeploymentPasses", "in maintenance").await?;
    // ...and once west's window is over (an `until` already past), the same pod is served there.
    patch_deployment(
        &kube.client,
        "west",
        json!({"maintenance": {"enabled": true, "until": "2020-01-01T00:00:00Z"}}),
    )
    .await?;
    in_maintenance(&kube.client, "west", false).await?;
    let r1 = eventually("r1 wired", WAIT, || port_of(&kube.client, "team-r", "r1")).await?;
    assert_eq!(t.west.get_port(&r1).await?.project_id, "proj-r");

    // A window ending in ten seconds: in maintenance now, out of it then, with no edit.
    let end = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(10))?
        .to_string();
    patch_deployment(
        &kube.client,
        "default",
        json!({"maintenance": {"enabled": true, "until": end}}),
    )
    .await?;
    in_maintenance(&kube.client, "default", true).await?;
    in_maintenance(&kube.client, "default", false).await?;
    create_namespace(&kube.client, "team-u", ns("proj-u")).await?;
    let u1 = wired(&kube.client, "team-u", "u1").await?;
    assert_eq!(
        t.east.get_port(&u1).await?.project_id,
        "proj-u",
        "east takes new bindings again (first by creation order)"
    );

    // An operator moves proj-u to west, as `kuryr bindings move` does: its next pod goes there
    // at once (the binding's watch event empties the binder's cache; usage would not for an hour).
    let store = kuryr_controller::placement::kube_store::KubeStore::new(kube.client.clone());
    let key = kuryr_controller::placement::BindingKey {
        project: "proj-u".into(),
        group: Default::default(),
    };
    use kuryr_controller::placement::store::BindingStore as _;
    assert!(
        store
            .claim(&key, Some("default"), None, "west", "moved by an operator")
            .await?
    );
    // The watch event reaches the controller within milliseconds; the pod comes well after it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let u2 = wired(&kube.client, "team-u", "u2").await?;
    assert_eq!(
        t.west.get_port(&u2).await?.project_id,
        "proj-u",
        "the moved binding serves the next pod"
    );
    assert!(
        t.east.get_port(&u1).await.is_ok(),
        "existing pods keep their ports"
    );

    // Headroom not below the threshold would admit nothing: a condition names the field.
    patch_deployment(&kube.client, "west", json!({"headroom": 0.95})).await?;
    let api = Api::<KuryrOpenStackDeployment>::all(kube.client.clone());
    let valid = api
        .get("west")
        .await?
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Valid"))
        .context("Valid condition")?;
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(
        valid.message.starts_with("spec.headroom: 0.95"),
        "{}",
        valid.message
    );
    let default_valid = api
        .get("default")
        .await?
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Valid"))
        .context("Valid condition on default")?;
    assert_eq!(default_valid.status, "True");

    // What an operator sees with kubectl: the printer columns of both kinds.
    if let Some(table) = kubectl_get(&kube, &["kosd"])? {
        assert_eq!(
            header(&table),
            [
                "NAME",
                "ZONE",
                "WEIGHT",
                "MAINTENANCE",
                "UNTIL",
                "MOVE",
                "USAGE",
                "MEASURED",
                "STALE",
                "AGE"
            ],
            "{table}"
        );
        assert_eq!(
            cell(&table, "default", "MAINTENANCE"),
            "false",
            "window over: {table}"
        );
        assert_eq!(cell(&table, "default", "UNTIL"), end, "{table}");
        assert_eq!(cell(&table, "west", "UNTIL"), "2020-01-01T00:00:00Z", "{table}");
    }
    if let Some(table) = kubectl_get(&kube, &["kpb", "proj-u"])? {
        assert_eq!(
            header(&table),
            [
                "NAME",
                "PROJECT",
                "ZONE",
                "AFFINITY",
                "DEPLOYMENT",
                "PINNED",
                "AGE"
            ],
            "{table}"
        );
        assert_eq!(cell(&table, "proj-u", "DEPLOYMENT"), "west", "{table}");
        assert_eq!(cell(&table, "proj-u", "PINNED"), "false", "{table}");
    }
    // An object deleted by hand is made again from kuryr.conf at once, for the operator to edit
    // (its headroom, set on the deleted one, is gone with it).
    let old_uid = api.get("west").await?.metadata.uid;
    api.delete("west", &Default::default()).await?;
    let again = eventually("west made again", WAIT, || async {
        Ok(api.get_opt("west").await?.filter(|o| o.metadata.uid != old_uid))
    })
    .await?;
    assert_eq!(again.spec.headroom, None, "{again:?}");
    stop.cancel();
    task.await?;
    Ok(())
}

/// The column names of kubectl's table.
fn header(table: &str) -> Vec<&str> {
    table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect()
}

/// The cell of kubectl's table in the row named `row`, column `column` (cut at the header's
/// offsets: an empty cell is blank, so splitting on blanks would shift the columns).
fn cell(table: &str, row: &str, column: &str) -> String {
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    let Some(start) = header.find(column) else {
        return format!("<no column {column}>");
    };
    let end = header[start..]
        .find(char::is_whitespace)
        .map(|w| start + w)
        .and_then(|w| header[w..].find(|c: char| !c.is_whitespace()).map(|n| w + n))
        .unwrap_or(usize::MAX);
    lines
        .find(|l| l.split_whitespace().next() == Some(row))
        .map(|l| {
            l.get(start..end.min(l.len()))
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .unwrap_or_else(|| format!("<no row {row}>"))
}

/// `kubectl get ARGS` (the real kubectl, the emulator's server-side tables): its output, or `None`
/// without kubectl on PATH (an error under `KURYR_TEST_REQUIRE_KUBECTL=1`).
fn kubectl_get(kube: &Kube, args: &[&str]) -> Result<Option<String>> {
    let kubeconfig =
        std::env::temp_dir().join(format!("kuryr-placement-{}.kubeconfig", uuid::Uuid::new_v4()));
    kube.handle.write_kubeconfig(&kubeconfig)?;
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("get")
        .args(args)
        .env_remove("KUBECONFIG")
        .output();
    let _ = std::fs::remove_file(&kubeconfig);
    match out {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            anyhow::ensure!(
                out.status.success(),
                "kubectl get {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(Some(text))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            anyhow::ensure!(
                std::env::var("KURYR_TEST_REQUIRE_KUBECTL").as_deref() != Ok("1"),
                "kubectl is not on PATH"
            );
            eprintln!("skipping the kubectl tables: kubectl is not on PATH");
            Ok(None)
        }
        Err(e) => Err(e).context("running kubectl"),
    }
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
         {}\
         [pod_binding]\nenabled = True\nfilters = all,usage_threshold\nusage_refresh_interval = 1\nusage_timeout = 1\n",
        t.deployments("", "")
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
    // East answers again: its figure is fresh, with no stale reason left over.
    t._emulators.0.set_latency(neutron_emulator::LatencyProfile::None);
    let east = eventually("east measured", WAIT, || async {
        Ok(status("default").await?.filter(|s| !s.stale))
    })
    .await?;
    let usage = east.usage.clone().unwrap_or_default();
    assert!(usage.get("staleBecause").is_none(), "{east:?}");
    assert!(usage.get("fraction").is_some(), "{east:?}");
    stop.cancel();
    task.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_project_over_its_port_quota_threshold_is_rebound_with_a_history_row_and_metrics() -> Result<()> {
    init_logs();
    let t = two_emulators().await?;
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
         {}\
         [pod_binding]\nenabled = True\nfilters = all,usage_threshold\nusage_threshold = 0.9\nusage_refresh_interval = 1\n",
        t.deployments("", "")
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

// ------------------------------------------------------------------------------------------------
// Four deployments in two affinity groups: `default` and `general-2` serve general resources,
// `cad-1` and `cad-2` carry `resource=cad` ("CAD modeling"); zones az1 (default, cad-1) and az2
// (general-2, cad-2); declaration order is the creation order, general first. `default` and
// `cad-1` are real neutron-servers when KURYR_TEST_NEUTRON_URL and KURYR_TEST_NEUTRON_URL_2 are
// set (scripts/test-all.sh starts both), emulators otherwise.
// ------------------------------------------------------------------------------------------------

const SECOND_NEUTRON_URL_VAR: &str = "KURYR_TEST_NEUTRON_URL_2";

/// One of the four deployments and what the controller needs there.
struct Site {
    name: &'static str,
    client: NeutronClient,
    url: String,
    real: bool,
    zone: &'static str,
    cad: bool,
    fx: NeutronFixture,
    pool: String,
    router: String,
    emulator: Option<EmulatorHandle>,
}

/// What a project has in one deployment (and the router interfaces there), to prove nothing leaks.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    ports: usize,
    networks: usize,
    subnets: usize,
    security_groups: usize,
    router_interfaces: usize,
}

impl Site {
    async fn counts(&self, project: &str) -> Result<Counts> {
        let f = || ListFilter::new().project_id(project);
        Ok(Counts {
            ports: self.client.list_ports(&f()).await?.len(),
            networks: self.client.list_networks(&f()).await?.len(),
            subnets: self.client.list_subnets(&f()).await?.len(),
            // Neutron gives every project it sees a "default" group of its own.
            security_groups: self
                .client
                .list_security_groups(&f())
                .await?
                .iter()
                .filter(|g| g.name != "default")
                .count(),
            router_interfaces: self
                .client
                .list_ports(&ListFilter::new().device_id(&self.router))
                .await?
                .len(),
        })
    }

    /// Whether `network` exists here.
    async fn has_network(&self, network: &str) -> Result<bool> {
        match self.client.get_network(network).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    fn section(&self) -> String {
        let header = if self.name == "default" {
            "[neutron]".to_string()
        } else {
            format!("[deployment:{}]", self.name)
        };
        format!(
            "{header}\nauth_type = noauth\nendpoint_override = {}\navailability_zone = {}\n{}\
             pod_subnet = {}\npod_security_groups = {}\npod_router = {}\npod_subnet_pool = {}\n",
            self.url,
            self.zone,
            if self.cad {
                "resource_affinity = resource:cad\n"
            } else {
                ""
            },
            self.fx.subnet,
            self.fx.sg,
            self.router,
            self.pool
        )
    }
}

struct Four {
    sites: Vec<Site>,
    /// `[neutron_defaults] project`: the built-in namespaces' networks live there.
    system: String,
    /// Every project the test used, cleaned up on the real servers at the end.
    projects: std::sync::Mutex<Vec<String>>,
    /// The cluster's own id: the real servers are shared, and a controller adopts (and deletes)
    /// resources tagged with its cluster id and a namespace name like `kube-system`.
    cluster_id: String,
}

/// Real neutron-server URLs for `default` and `cad-1`, or None (four emulators, said on stderr).
fn real_urls() -> Result<Option<(String, String)>> {
    let var = |n: &str| std::env::var(n).ok().filter(|u| !u.trim().is_empty());
    match (var("KURYR_TEST_NEUTRON_URL"), var(SECOND_NEUTRON_URL_VAR)) {
        (Some(a), Some(b)) => Ok(Some((a, b))),
        (a, b) => {
            let missing: Vec<&str> = [
                ("KURYR_TEST_NEUTRON_URL", a.is_none()),
                (SECOND_NEUTRON_URL_VAR, b.is_none()),
            ]
            .into_iter()
            .filter_map(|(n, m)| m.then_some(n))
            .collect();
            anyhow::ensure!(
                std::env::var("KURYR_TEST_REQUIRE_NEUTRON").as_deref() != Ok("1"),
                "KURYR_TEST_REQUIRE_NEUTRON=1 but {} unset: the placement tests need two real neutron-servers \
                 (scripts/neutron-lab/start-neutron.sh, then INSTANCE=2 for the second)",
                missing.join(" and ")
            );
            eprintln!(
                "placement: {} unset, so all four deployments are emulators (scripts/test-all.sh starts two \
                 real neutron-servers and sets both)",
                missing.join(" and ")
            );
            Ok(None)
        }
    }
}

impl Four {
    async fn start() -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let real = real_urls()?;
        let layout: [(&str, &str, bool, Option<String>); 4] = [
            ("default", "az1", false, real.as_ref().map(|r| r.0.clone())),
            ("general-2", "az2", false, None),
            ("cad-1", "az1", true, real.as_ref().map(|r| r.1.clone())),
            ("cad-2", "az2", true, None),
        ];
        let mut sites = Vec::new();
        for (i, (name, zone, cad, url)) in layout.into_iter().enumerate() {
            let (url, emulator) = match url {
                Some(u) => (u, None),
                None => {
                    let e = Emulator::start(EmulatorOptions {
                        active_delay: Duration::from_millis(50),
                        agent_hosts: neutron_emulator::AgentHosts::Only(
                            NODES.iter().map(|s| s.to_string()).collect(),
                        ),
                        ..EmulatorOptions::default()
                    })
                    .await?;
                    (e.url().to_string(), Some(e))
                }
            };
            let client = NeutronClient::new(&ClientOptions::noauth(&url))?;
            let fx = neutron_fixture(&client, &format!("10.7{i}.0.0/24")).await?;
            let (pool, router) =
                namespace_subnet_infra(&client, &fx.project, &format!("10.8{i}.0.0/16")).await?;
            sites.push(Site {
                name,
                client,
                url,
                real: emulator.is_none(),
                zone,
                cad,
                fx,
                pool: pool.id,
                router: router.id,
                emulator,
            });
        }
        let system = format!("sys-{}", uuid::Uuid::new_v4().simple());
        Ok(Self {
            sites,
            projects: std::sync::Mutex::new(vec![system.clone()]),
            system,
            cluster_id: format!("placement-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        })
    }

    /// Runs `body` on four fresh deployments, then deletes what it made on the real servers,
    /// whether it passed, failed or panicked.
    async fn run<F, Fut>(body: F) -> Result<()>
    where
        F: FnOnce(Arc<Four>) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let four = Arc::new(Four::start().await?);
        let outcome = tokio::spawn(body(four.clone())).await;
        if !matches!(outcome, Ok(Ok(()))) {
            // The body's controller was told to stop when the body ended: let it.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        four.cleanup().await;
        match outcome {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(e.into()),
        }
    }

    fn site(&self, name: &str) -> &Site {
        self.sites
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no site {name}"))
    }

    /// A project id of this test only (real servers are shared).
    fn project(&self, what: &str) -> String {
        let p = format!("{what}-{}", uuid::Uuid::new_v4().simple());
        self.projects.lock().unwrap().push(p.clone());
        p
    }

    /// kuryr.conf of the four; `per_namespace` = the `namespace` subnet and security group
    /// drivers (a network, subnet, router interface and group per namespace).
    fn ini(&self, handlers: &str, per_namespace: bool, pod_binding: &str) -> String {
        let mut ini = format!(
            "[kubernetes]\nenabled_handlers = {handlers}\npod_project_driver = annotation\ncontroller_namespace = default\n\
             cluster_id = {}\n{}\
             [neutron_defaults]\nproject = {}\n\
             [pod_binding]\nenabled = True\nfilters = all,availability_zone,resource_affinity,usage_threshold\n\
             weighers = creation_order\n{pod_binding}",
            self.cluster_id,
            if per_namespace {
                "pod_subnets_driver = namespace\npod_security_groups_driver = namespace\n"
            } else {
                ""
            },
            self.system
        );
        for s in &self.sites {
            ini.push_str(&s.section());
        }
        ini
    }

    /// Deletes what the test made on the real servers (the emulators go with the test). The
    /// controller must be stopped first.
    async fn cleanup(&self) {
        let projects = self.projects.lock().unwrap().clone();
        for s in self.sites.iter().filter(|s| s.real) {
            let c = &s.client;
            if let Ok(ifaces) = c.list_ports(&ListFilter::new().device_id(&s.router)).await {
                for p in ifaces {
                    for ip in p.fixed_ips {
                        let _ = c
                            .remove_router_interface(
                                &s.router,
                                &kuryr_neutron::RouterInterfaceSpec::Subnet {
                                    subnet_id: ip.subnet_id,
                                },
                            )
                            .await;
                    }
                }
            }
            let _ = c.delete_router(&s.router).await;
            for p in projects.iter().chain([&s.fx.project]) {
                cleanup_project(c, p).await;
                let _ = c.reset_quota(p).await;
                if let Ok(groups) = c.list_security_groups(&ListFilter::new().project_id(p)).await {
                    for g in groups {
                        let _ = c.delete_security_group(&g.id).await;
                    }
                }
            }
            let _ = c.delete_subnetpool(&s.pool).await;
        }
    }
}

/// The KuryrNetwork of `ns` once its network, subnet and router interface exist: (deployment it
/// records, network id).
async fn namespace_network(kube: &kube::Client, ns: &str) -> Result<(String, String)> {
    let api = Api::<KuryrNetwork>::namespaced(kube.clone(), ns);
    eventually(&format!("{ns}'s network"), WAIT, || async {
        Ok(api.get_opt(ns).await?.and_then(|kn| {
            let status = kn.status.as_ref()?;
            status.router_id.as_ref()?;
            let net = status.net_id.clone()?;
            Some((kn.annotations().get(DEPLOYMENT)?.clone(), net))
        }))
    })
    .await
}

/// The current deployment of `project`'s binding for `group` (a `Group::id`) and its history rows.
async fn binding(kube: &kube::Client, project: &str, group: &str) -> Result<(Option<String>, usize)> {
    let b = Api::<KuryrProjectBinding>::all(kube.clone())
        .get(&kuryr_crds::binding_name(project, group))
        .await?;
    let s = b.status.unwrap_or_default();
    Ok((s.deployment, s.history.len()))
}

/// Creates namespace `ns` with one pod, `first`: a namespace gets its network (and is placed) with
/// its first pod.
async fn namespace_with_a_pod(kube: &kube::Client, ns: &str, annotations: serde_json::Value) -> Result<()> {
    create_namespace(kube, ns, annotations).await?;
    create_pod(kube, ns, "first", NODES[0], json!({})).await?;
    Ok(())
}

async fn delete_namespace(kube: &kube::Client, ns: &str) -> Result<()> {
    Api::<Namespace>::all(kube.clone())
        .delete(ns, &DeleteParams::default())
        .await?;
    Ok(())
}

/// One project in two groups, and maintenance, on a real server: a project binds to the first general
/// deployment for general resources and to the first CAD one for "CAD modeling", at the same time,
/// and its namespaces' networks land there. Maintenance set by patching the deployment object:
/// new bindings go elsewhere; with moveExisting off the bound project stays, on it moves; the old
/// namespaces' networks, subnets, router interfaces, groups and ports leave the old deployment
/// once their pods are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_deployments_one_project_in_two_groups_and_maintenance_moves_without_leaking() -> Result<()> {
    init_logs();
    Four::run(one_project_in_two_groups_and_maintenance).await
}

async fn one_project_in_two_groups_and_maintenance(four: Arc<Four>) -> Result<()> {
    let four = &*four;
    let kube = start_kube().await?;
    let tenant = four.project("tenant");
    let other = four.project("other");
    let (default, cad1) = (four.site("default"), four.site("cad-1"));
    let before = default.counts(&tenant).await?;
    let (stop, task) = start(
        &kube.client,
        &four.ini("vif,kuryrport,namespace,kuryrnetwork", true, ""),
    );
    // Stops the controller however the body ends (a panic included), before the cleanup.
    let _stop_on_exit = stop.clone().drop_guard();
    let ns = |p: &str| json!({"openstack.org/kuryr-project": p});
    let cad = |p: &str| json!({"openstack.org/kuryr-project": p, "openstack.org/kuryr-resource-affinity": "resource=cad"});
    // One project in two groups at once: general resources in `default`, "CAD modeling" in `cad-1`.
    create_namespace(&kube.client, "gen-a", ns(&tenant)).await?;
    create_namespace(&kube.client, "cad-a", cad(&tenant)).await?;
    create_pod(&kube.client, "gen-a", "g1", NODES[0], json!({})).await?;
    create_pod(&kube.client, "cad-a", "c1", NODES[1], json!({})).await?;
    let g1 = eventually("g1 wired", WAIT, || port_of(&kube.client, "gen-a", "g1")).await?;
    let c1 = eventually("c1 wired", WAIT, || port_of(&kube.client, "cad-a", "c1")).await?;
    let (at, gen_net) = namespace_network(&kube.client, "gen-a").await?;
    assert_eq!(at, "default", "general resources: the first general deployment");
    assert!(default.has_network(&gen_net).await?);
    let (at, cad_net) = namespace_network(&kube.client, "cad-a").await?;
    assert_eq!(at, "cad-1", "CAD modeling: the first CAD deployment");
    assert!(cad1.has_network(&cad_net).await?);
    assert!(!default.has_network(&cad_net).await?);
    assert_eq!(default.client.get_port(&g1).await?.network_id, gen_net);
    assert_eq!(cad1.client.get_port(&c1).await?.network_id, cad_net);
    // The built-in namespaces hold no pod: no network, subnet nor router interface for them.
    for builtin in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let kn = Api::<KuryrNetwork>::namespaced(kube.client.clone(), builtin)
            .get_opt(builtin)
            .await?;
        assert!(kn.is_none(), "{builtin}: {kn:?}");
    }
    assert_eq!(
        binding(&kube.client, &tenant, "").await?,
        (Some("default".to_string()), 1)
    );
    assert_eq!(
        binding(&kube.client, &tenant, "resource=cad").await?,
        (Some("cad-1".to_string()), 1),
        "both bindings at once"
    );

    // Maintenance on `default` (a patch of its object, as `kubectl patch` or `kuryr kubectl
    // deployments maintenance` sends), moveExisting off: new bindings go elsewhere, the tenant stays.
    set_maintenance(&kube.client, "default", true, false).await?;
    namespace_with_a_pod(&kube.client, "other-a", ns(&other)).await?;
    namespace_with_a_pod(&kube.client, "gen-b", ns(&tenant)).await?;
    assert_eq!(
        namespace_network(&kube.client, "other-a").await?.0,
        "general-2",
        "a new binding avoids the deployment in maintenance"
    );
    assert_eq!(
        namespace_network(&kube.client, "gen-b").await?.0,
        "default",
        "the bound tenant stays with moveExisting off"
    );
    // moveExisting on: the tenant moves, with a history row and an Event; its CAD binding stays.
    set_maintenance(&kube.client, "default", true, true).await?;
    namespace_with_a_pod(&kube.client, "gen-c", ns(&tenant)).await?;
    let (at, moved_net) = namespace_network(&kube.client, "gen-c").await?;
    assert_eq!(at, "general-2");
    assert!(four.site("general-2").has_network(&moved_net).await?);
    assert_eq!(
        history(&kube.client, &tenant).await?,
        [("default".to_string(), false), ("general-2".to_string(), true)]
    );
    event(
        &kube.client,
        "gen-c",
        "ProjectMoved",
        &format!("project {tenant} moved from deployment default to general-2"),
    )
    .await?;
    assert_eq!(
        binding(&kube.client, &tenant, "resource=cad").await?,
        (Some("cad-1".to_string()), 1)
    );

    // The old namespaces go once their pods are gone: `default` is back where it started.
    Api::<Pod>::namespaced(kube.client.clone(), "gen-a")
        .delete("g1", &DeleteParams::default())
        .await?;
    delete_namespace(&kube.client, "gen-a").await?;
    delete_namespace(&kube.client, "gen-b").await?;
    let settled = eventually("default back to its start", WAIT, || async {
        Ok((default.counts(&tenant).await? == before).then_some(()))
    })
    .await;
    if settled.is_err() {
        panic!("before {before:?}, now {:?}", default.counts(&tenant).await?);
    }
    assert!(!default.has_network(&gen_net).await?);
    stop.cancel();
    task.await?;
    Ok(())
}

/// The history rows of `project`'s binding for `group`: (deployment, why).
async fn history_of(kube: &kube::Client, project: &str, group: &str) -> Result<Vec<(String, String)>> {
    let b = Api::<KuryrProjectBinding>::all(kube.clone())
        .get(&kuryr_crds::binding_name(project, group))
        .await?;
    Ok(b.status
        .unwrap_or_default()
        .history
        .into_iter()
        .map(|h| (h.deployment, h.why))
        .collect())
}

/// Merge-patches `spec` into deployment object `name` once the controller has created it.
async fn patch_deployment(kube: &kube::Client, name: &str, spec: serde_json::Value) -> Result<()> {
    let api = Api::<KuryrOpenStackDeployment>::all(kube.clone());
    eventually(&format!("deployment object {name}"), WAIT, || async {
        Ok(api.get_opt(name).await?.map(|_| ()))
    })
    .await?;
    let edited = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await?;
    followed(kube, name, edited.metadata.generation).await
}

/// The value of the metric line starting with `name{` that carries every label of `labels`.
fn gauge(metrics: &Metrics, name: &str, labels: &[&str]) -> Option<f64> {
    metrics.encode().lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('{')?;
        let (set, value) = rest.split_once("} ")?;
        labels
            .iter()
            .all(|want| set.split(',').any(|have| have == *want))
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// Usage crossing a deployment's own threshold: the tenant's port quota on `cad-1` (a real
/// server when configured) is filled, and once measured the tenant's new CAD namespaces go to the
/// next CAD deployment, with a history row and an Event; the figure and its age are on the
/// deployment object and in the Prometheus gauges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_deployments_a_full_port_quota_rebinds_new_namespaces_within_the_group() -> Result<()> {
    init_logs();
    Four::run(full_port_quota_rebinds).await
}

async fn full_port_quota_rebinds(four: Arc<Four>) -> Result<()> {
    let four = &*four;
    let kube = start_kube().await?;
    let tenant = four.project("cad");
    let cad1 = four.site("cad-1");
    let metrics = Metrics::new();
    let (stop, task) = start_with(
        &kube.client,
        &four.ini(
            "vif,kuryrport,namespace,kuryrnetwork",
            true,
            "usage_refresh_interval = 1\n",
        ),
        metrics.clone(),
    );
    // Stops the controller however the body ends (a panic included), before the cleanup.
    let _stop_on_exit = stop.clone().drop_guard();
    // cad-1's own threshold, below [pod_binding] usage_threshold (0.9).
    patch_deployment(&kube.client, "cad-1", json!({"usageThreshold": 0.5})).await?;
    let cad = json!({"openstack.org/kuryr-project": tenant, "openstack.org/kuryr-resource-affinity": "resource=cad"});
    create_namespace(&kube.client, "cad-a", cad.clone()).await?;
    create_pod(&kube.client, "cad-a", "p1", NODES[0], json!({})).await?;
    let p1 = eventually("wired", WAIT, || port_of(&kube.client, "cad-a", "p1")).await?;
    assert_eq!(namespace_network(&kube.client, "cad-a").await?.0, "cad-1");
    assert!(cad1.client.get_port(&p1).await.is_ok(), "p1 in cad-1");

    // Fill the tenant's port quota there: room for exactly one more port, then a pod.
    let used = cad1
        .client
        .get_quota_details(&tenant)
        .await?
        .get("port")
        .map_or(0, |p| p.used);
    cad1.client
        .update_quota(
            &tenant,
            &kuryr_neutron::QuotaUpdate {
                port: Some(used + 1),
                ..Default::default()
            },
        )
        .await?;
    create_pod(&kube.client, "cad-a", "p2", NODES[0], json!({})).await?;
    let p2 = eventually("wired", WAIT, || port_of(&kube.client, "cad-a", "p2")).await?;
    assert!(cad1.client.get_port(&p2).await.is_ok(), "p2 in cad-1");
    let ports = format!("resource=\"ports:{tenant}\"");
    eventually("cad-1's full quota measured", WAIT, || async {
        Ok((gauge(
            &metrics,
            "kuryr_deployment_usage_ratio",
            &["deployment=\"cad-1\"", ports.as_str()],
        ) == Some(1.0))
        .then_some(()))
    })
    .await?;
    // The figure and its age, as `kubectl get kosd cad-1 -o yaml` shows them.
    let status = Api::<KuryrOpenStackDeployment>::all(kube.client.clone())
        .get("cad-1")
        .await?
        .status
        .unwrap_or_default();
    let limit = used + 1;
    assert_eq!(
        status
            .usage
            .as_ref()
            .and_then(|u| u.pointer(&format!("/ports/{tenant}")))
            .cloned(),
        Some(json!({"used": limit, "limit": limit})),
        "{status:?}"
    );
    let measured: k8s_openapi::jiff::Timestamp =
        status.measured_at.as_deref().context("measuredAt")?.parse()?;
    assert!(!status.stale);
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(measured);
    assert!(age.as_secs() < 60, "measured {age:?} ago");
    let gauge_time = gauge(
        &metrics,
        "kuryr_deployment_usage_measured_timestamp_seconds",
        &["deployment=\"cad-1\""],
    )
    .context("measured timestamp gauge")?;
    assert!(
        (gauge_time - measured.as_millisecond() as f64 / 1000.0).abs() < 30.0,
        "{gauge_time}"
    );

    // A new CAD namespace of the tenant goes to the next CAD deployment.
    namespace_with_a_pod(&kube.client, "cad-b", cad).await?;
    let (at, net) = namespace_network(&kube.client, "cad-b").await?;
    assert_eq!(at, "cad-2");
    assert!(four.site("cad-2").has_network(&net).await?);
    let rows = history_of(&kube.client, &tenant, "resource=cad").await?;
    assert_eq!(
        rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        ["cad-1", "cad-2"]
    );
    assert!(
        rows[1].1.contains("usage 1.000 reached its threshold 0.500"),
        "{}",
        rows[1].1
    );
    event(
        &kube.client,
        "cad-b",
        "ProjectMoved",
        &format!("project {tenant} moved from deployment cad-1 to cad-2"),
    )
    .await?;
    // cad-a's pods keep their ports in cad-1.
    assert_eq!(namespace_network(&kube.client, "cad-a").await?.0, "cad-1");
    stop.cancel();
    task.await?;
    Ok(())
}

/// Two namespaces of one project asking for different zones each keep their binding: ten rounds of
/// decisions (a pod in each namespace per round, the cache emptied by every measurement) change
/// no history.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_deployments_two_zones_of_one_project_never_flap() -> Result<()> {
    init_logs();
    Four::run(two_zones_never_flap).await
}

async fn two_zones_never_flap(four: Arc<Four>) -> Result<()> {
    let four = &*four;
    let kube = start_kube().await?;
    let tenant = four.project("zones");
    let (stop, task) = start(
        &kube.client,
        &four.ini("vif,kuryrport", false, "usage_refresh_interval = 1\n"),
    );
    // Stops the controller however the body ends (a panic included), before the cleanup.
    let _stop_on_exit = stop.clone().drop_guard();
    create_namespace(
        &kube.client,
        "zone-1",
        json!({"openstack.org/kuryr-project": tenant, "openstack.org/kuryr-availability-zone": "az1"}),
    )
    .await?;
    create_namespace(
        &kube.client,
        "zone-2",
        json!({"openstack.org/kuryr-project": tenant, "openstack.org/kuryr-availability-zone": "az2"}),
    )
    .await?;
    let expected = |d: &str| vec![(d.to_string(), "new binding".to_string())];
    for round in 0..10 {
        let pod = format!("r{round}");
        create_pod(&kube.client, "zone-1", &pod, NODES[0], json!({})).await?;
        create_pod(&kube.client, "zone-2", &pod, NODES[1], json!({})).await?;
        let p1 = eventually("zone-1 pod wired", WAIT, || port_of(&kube.client, "zone-1", &pod)).await?;
        let p2 = eventually("zone-2 pod wired", WAIT, || port_of(&kube.client, "zone-2", &pod)).await?;
        assert!(
            four.site("default").client.get_port(&p1).await.is_ok(),
            "round {round}: az1 is default"
        );
        assert!(
            four.site("general-2").client.get_port(&p2).await.is_ok(),
            "round {round}: az2 is general-2"
        );
        assert_eq!(
            history_of(&kube.client, &tenant, "az=az1").await?,
            expected("default"),
            "round {round}"
        );
        assert_eq!(
            history_of(&kube.client, &tenant, "az=az2").await?,
            expected("general-2"),
            "round {round}"
        );
    }
    stop.cancel();
    task.await?;
    Ok(())
}

/// A deployment that hangs (an emulator answering nothing) is stale after one timeout, while the
/// other three keep being measured every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_deployments_a_hanging_one_is_stale_and_delays_no_other() -> Result<()> {
    init_logs();
    Four::run(hanging_deployment_is_stale).await
}

async fn hanging_deployment_is_stale(four: Arc<Four>) -> Result<()> {
    let four = &*four;
    let hung = four
        .site("general-2")
        .emulator
        .as_ref()
        .context("general-2 is an emulator")?;
    hung.set_latency(neutron_emulator::LatencyProfile::Custom(
        neutron_emulator::LatencyTable {
            default: neutron_emulator::OpLatency::fixed(600_000),
            ops: Default::default(),
        },
    ));
    let kube = start_kube().await?;
    let metrics = Metrics::new();
    let (stop, task) = start_with(
        &kube.client,
        &four.ini(
            "vif,kuryrport",
            false,
            // The timeout leaves a real neutron-server under a loaded test run (one of the four)
            // room to answer; the hung one takes 600 s, so it is still plainly stale.
            "usage_refresh_interval = 1\nusage_timeout = 4\n",
        ),
        metrics.clone(),
    );
    // Stops the controller however the body ends (a panic included), before the cleanup.
    let _stop_on_exit = stop.clone().drop_guard();
    let kosd: Api<KuryrOpenStackDeployment> = Api::all(kube.client.clone());
    let stale = eventually("general-2 stale", WAIT, || async {
        Ok(kosd
            .get_opt("general-2")
            .await?
            .and_then(|o| o.status)
            .filter(|s| s.stale))
    })
    .await?;
    let why = stale
        .usage
        .as_ref()
        .and_then(|u| u.get("staleBecause"))
        .and_then(|v| v.as_str());
    assert!(
        why.is_some_and(|w| w.contains("no answer within 4s")),
        "{stale:?}"
    );
    assert_eq!(
        gauge(
            &metrics,
            "kuryr_deployment_usage_stale",
            &["deployment=\"general-2\""]
        ),
        Some(1.0)
    );
    // Meanwhile each other deployment is measured round after round: three successive figures,
    // each fresh, each at most a few rounds after the one before (the hang is 600 s).
    for name in ["default", "cad-1", "cad-2"] {
        let mut seen: Vec<k8s_openapi::jiff::Timestamp> = Vec::new();
        while seen.len() < 3 {
            let s = eventually(&format!("{name} measured again"), WAIT, || async {
                Ok(kosd
                    .get_opt(name)
                    .await?
                    .and_then(|o| o.status)
                    .filter(|s| !s.stale)
                    .and_then(|s| s.measured_at)
                    .and_then(|m| m.parse::<k8s_openapi::jiff::Timestamp>().ok())
                    .filter(|t| seen.last().is_none_or(|l| t > l)))
            })
            .await?;
            seen.push(s);
        }
        let gap = seen[2].duration_since(seen[1]);
        // A round waits at most the timeout for a deployment (4 s) and starts 1 s after the last:
        // waiting for the hung one (600 s) would show as minutes.
        assert!(gap.as_secs() <= 12, "{name}: {gap:?} between two measurements");
        assert_eq!(
            gauge(
                &metrics,
                "kuryr_deployment_usage_stale",
                &[format!("deployment=\"{name}\"").as_str()]
            ),
            Some(0.0)
        );
    }
    assert!(
        kosd.get("general-2").await?.status.is_some_and(|s| s.stale),
        "still stale"
    );
    stop.cancel();
    task.await?;
    Ok(())
}

/// A group without a zone whose affinity has the key `az` (`az=az1`) prints like the group of
/// zone az1: each still gets a binding object of its own, and a binding an older controller
/// kept under the shared name is found there and moved in place, not made again.
#[tokio::test]
async fn a_zone_and_an_affinity_key_named_az_get_bindings_of_their_own() -> Result<()> {
    use kuryr_controller::placement::kube_store::{KubeStore, name_of};
    use kuryr_controller::placement::store::BindingStore as _;
    use kuryr_controller::placement::{BindingKey, Group};
    let kube = start_kube().await?;
    let store = KubeStore::new(kube.client.clone());
    let key = |zone: Option<&str>, affinity: &[(&str, &str)]| BindingKey {
        project: "proj-z".into(),
        group: Group {
            availability_zone: zone.map(str::to_string),
            resource_affinity: affinity
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
    };
    let zone = key(Some("az1"), &[("tier", "gold")]);
    let affinity = key(None, &[("az", "az1"), ("tier", "gold")]);
    assert_eq!(zone.group.id(), affinity.group.id(), "the two print alike");
    assert!(store.claim(&zone, None, None, "east", "new").await?);
    assert!(store.claim(&affinity, None, None, "west", "new").await?);
    assert_eq!(
        store.get(&zone).await?.and_then(|s| s.current()).as_deref(),
        Some("east")
    );
    assert_eq!(
        store.get(&affinity).await?.and_then(|s| s.current()).as_deref(),
        Some("west")
    );
    let api = Api::<KuryrProjectBinding>::all(kube.client.clone());
    assert_eq!(api.list(&ListParams::default()).await?.items.len(), 2);

    // An affinity group bound before it had a name of its own: its object has the zone's name.
    let older = key(None, &[("az", "az2")]);
    let shared = name_of(&key(Some("az2"), &[]));
    assert_ne!(shared, name_of(&older));
    let mut obj: KuryrProjectBinding = serde_json::from_value(json!({
        "apiVersion": "openstack.org/v1", "kind": "KuryrProjectBinding",
        "metadata": {"name": shared},
        "spec": {"projectId": "proj-z", "resourceAffinity": {"az": "az2"}, "pinned": false},
    }))?;
    obj = api.create(&Default::default(), &obj).await?;
    obj.status = Some(kuryr_crds::KuryrProjectBindingStatus {
        deployment: Some("east".into()),
        history: vec![kuryr_crds::BindingHistoryRow {
            deployment: "east".into(),
            bound_at: "2026-01-01T00:00:00Z".into(),
            unbound_at: None,
            why: "new".into(),
        }],
    });
    api.replace_status(&shared, &Default::default(), &obj).await?;
    assert_eq!(
        store.get(&older).await?.and_then(|s| s.current()).as_deref(),
        Some("east")
    );
    // The controller's watch sees it now; a claim and a pin land before its move runs, and an
    // earlier move left an empty object under the new name.
    let seen = api.get(&shared).await?;
    let left: KuryrProjectBinding = serde_json::from_value(json!({
        "apiVersion": "openstack.org/v1", "kind": "KuryrProjectBinding",
        "metadata": {"name": name_of(&older)},
        "spec": {"projectId": "proj-z", "resourceAffinity": {"az": "az2"}, "pinned": false},
    }))?;
    api.create(&Default::default(), &left).await?;
    assert_eq!(
        store.get(&older).await?.and_then(|s| s.current()).as_deref(),
        Some("east"),
        "the old object is the binding while it is there"
    );
    assert!(store.claim(&older, Some("east"), None, "west", "moved").await?);
    store.set_pinned(&older, true).await?;
    let moved = api.get(&shared).await?;
    assert_eq!(moved.status.and_then(|s| s.deployment).as_deref(), Some("west"));
    assert!(moved.spec.pinned);
    // Until the controller's watch moves it to its own name, history and pin included; then
    // the zone's group gets its binding.
    assert!(
        store.get(&key(Some("az2"), &[])).await.is_err(),
        "the object holds another key"
    );
    use kuryr_controller::placement::kube_store::move_to_own_name;
    assert!(
        move_to_own_name(&api, &seen).await?,
        "moved as it is now, not as seen"
    );
    assert!(api.get_opt(&shared).await?.is_none());
    let own = api.get(&name_of(&older)).await?;
    assert!(own.spec.pinned);
    let history = own.status.map(|s| s.history).unwrap_or_default();
    assert_eq!(history.len(), 2, "{history:?}");
    assert_eq!(
        store.get(&older).await?.and_then(|s| s.current()).as_deref(),
        Some("west")
    );
    assert!(
        !move_to_own_name(&api, &api.get(&name_of(&older)).await?).await?,
        "at home"
    );
    assert!(store.get(&key(Some("az2"), &[])).await?.is_none());
    assert!(
        store
            .claim(&key(Some("az2"), &[]), None, None, "east", "new")
            .await?
    );
    assert_eq!(api.list(&ListParams::default()).await?.items.len(), 4);
    Ok(())
}

/// A binding no namespace asks for any more is marked with the time it was first seen unused
/// and deleted once `unused_binding_retention` has passed; one a namespace asks for again in
/// time is unmarked and kept, and a pinned one is the operator's and kept. The ports made under
/// the deleted binding are released in their own deployment all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bindings_no_namespace_uses_are_retired_after_the_retention() -> Result<()> {
    use kuryr_controller::placement::kube_store::{KubeStore, name_of};
    use kuryr_controller::placement::store::BindingStore as _;
    use kuryr_crds::names::annotations::UNUSED_SINCE;
    init_logs();
    let t = two_emulators().await?;
    let kube = start_kube().await?;
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_project_driver = annotation\ncontroller_namespace = default\n\
         {}\
         [pod_binding]\nenabled = True\nfilters = all\nweighers = creation_order\nusage_refresh_interval = 3600\n\
         unused_binding_retention = 6\n",
        t.deployments("", "")
    );
    let (stop, task) = start(&kube.client, &ini);
    let project = |p: &str| json!({"openstack.org/kuryr-project": p});
    let key = |p: &str| kuryr_controller::placement::BindingKey {
        project: p.into(),
        group: Default::default(),
    };
    for (ns, p) in [("team-g", "proj-g"), ("team-p", "proj-p"), ("team-h", "proj-h")] {
        create_namespace(&kube.client, ns, project(p)).await?;
        wired(&kube.client, ns, "pod").await?;
    }
    KubeStore::new(kube.client.clone())
        .set_pinned(&key("proj-p"), true)
        .await?;
    let api = Api::<KuryrProjectBinding>::all(kube.client.clone());
    let namespaces = Api::<Namespace>::all(kube.client.clone());
    for ns in ["team-g", "team-p", "team-h"] {
        namespaces.delete(ns, &DeleteParams::default()).await?;
    }
    for ns in ["team-g", "team-p", "team-h"] {
        eventually(&format!("{ns} gone"), WAIT, || async {
            Ok(namespaces.get_opt(ns).await?.is_none().then_some(()))
        })
        .await?;
    }
    assert!(
        t.east
            .list_ports(&ListFilter::new().project_id("proj-g"))
            .await?
            .is_empty(),
        "the pod's port released"
    );
    let mark = |p: &'static str| {
        let api = api.clone();
        async move {
            anyhow::Ok(
                api.get_opt(&name_of(&key(p)))
                    .await?
                    .map(|b| b.annotations().get(UNUSED_SINCE).cloned()),
            )
        }
    };
    eventually("proj-h marked unused", WAIT, || async {
        Ok(mark("proj-h").await?.flatten())
    })
    .await?;
    // Asked for again within the retention: unmarked, kept.
    create_namespace(&kube.client, "team-h2", project("proj-h")).await?;
    eventually("proj-h unmarked", WAIT, || async {
        Ok((mark("proj-h").await? == Some(None)).then_some(()))
    })
    .await?;
    eventually("proj-g retired", WAIT, || async {
        Ok(api
            .get_opt(&name_of(&key("proj-g")))
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(mark("proj-p").await?, Some(None), "pinned: kept, never marked");
    assert_eq!(mark("proj-h").await?, Some(None), "in use: kept");
    stop.cancel();
    task.await?;
    Ok(())
}

/// A binding marked unused that the binder reads (a namespace bound from it) loses its mark as it
/// is read: a retirement decided on the listing before deletes nothing (its precondition fails).
#[tokio::test]
async fn a_marked_binding_read_by_the_binder_is_unmarked_and_not_retired() -> Result<()> {
    use kuryr_controller::placement::kube_store::{KubeStore, name_of};
    use kuryr_controller::placement::store::BindingStore as _;
    use kuryr_crds::names::annotations::UNUSED_SINCE;
    let kube = start_kube().await?;
    let store = KubeStore::new(kube.client.clone());
    let key = kuryr_controller::placement::BindingKey {
        project: "proj-m".into(),
        group: Default::default(),
    };
    assert!(store.claim(&key, None, None, "east", "new").await?);
    let api = Api::<KuryrProjectBinding>::all(kube.client.clone());
    let name = name_of(&key);
    let mark = json!({"metadata": {"annotations": {UNUSED_SINCE: "2026-01-01T00:00:00Z"}}});
    let listed = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&mark))
        .await?;
    assert_eq!(
        store.get(&key).await?.and_then(|s| s.current()).as_deref(),
        Some("east")
    );
    let read = api.get(&name).await?;
    assert!(
        !read.annotations().contains_key(UNUSED_SINCE),
        "unmarked by the read"
    );
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: listed.resource_version(),
            uid: None,
        }),
        ..Default::default()
    };
    assert!(
        api.delete(&name, &dp).await.is_err(),
        "the listing's retirement fails"
    );
    assert!(api.get_opt(&name).await?.is_some());
    Ok(())
}

/// A pod a new term did not see created may have ports a crash never recorded, in any deployment:
/// its KuryrPort's finalizer looks for them in each. One deployment that cannot answer (west, out)
/// is left to the orphan sweep there, instead of holding every such pod of every other deployment
/// Terminating until it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deployment_that_is_out_holds_no_pod_of_another_terminating() -> Result<()> {
    use neutron_emulator::{FaultConfig, Outage};
    init_logs();
    let t = two_emulators().await?;
    let kube = start_kube().await?;
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_project_driver = annotation\ncontroller_namespace = default\n\
         {}\
         [pod_binding]\nenabled = True\nfilters = all,availability_zone\n",
        t.deployments("availability_zone = az1\n", "availability_zone = az2\n")
    );
    let (stop, task) = start(&kube.client, &ini);
    create_namespace(
        &kube.client,
        "team-a",
        json!({"openstack.org/kuryr-project": "proj-a", "openstack.org/kuryr-availability-zone": "az1"}),
    )
    .await?;
    create_pod(&kube.client, "team-a", "a1", NODES[0], json!({})).await?;
    let a1 = eventually("a1 wired", WAIT, || port_of(&kube.client, "team-a", "a1")).await?;
    assert!(t.east.get_port(&a1).await.is_ok(), "a1 in east");
    // Another term: a1 was created before it.
    stop.cancel();
    task.await?;
    let (stop, task) = start(&kube.client, &ini);
    create_pod(&kube.client, "team-a", "a2", NODES[0], json!({})).await?;
    eventually("a2 wired by the new term", WAIT, || {
        port_of(&kube.client, "team-a", "a2")
    })
    .await?;

    t._emulators.1.set_faults(FaultConfig {
        outage: Some(Outage::default()),
        ..FaultConfig::default()
    });
    Api::<Pod>::namespaced(kube.client.clone(), "team-a")
        .delete("a1", &DeleteParams::default())
        .await?;
    let kps: Api<KuryrPort> = Api::namespaced(kube.client.clone(), "team-a");
    eventually("a1's KuryrPort finalized with west out", WAIT, || async {
        Ok(kps.get_opt("a1").await?.is_none().then_some(()))
    })
    .await?;
    let gone = t.east.get_port(&a1).await;
    assert!(
        gone.as_ref().is_err_and(|e| e.is_not_found()),
        "a1's port released in east: {gone:?}"
    );
    stop.cancel();
    task.await?;
    Ok(())
}
