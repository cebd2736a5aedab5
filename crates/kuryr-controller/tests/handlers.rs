//! The handler registry through the real start-up path (`service::run`): `[kubernetes]
//! enabled_handlers` validation, a library user's own handler next to the built-in ones, and the
//! pod UID check of the `vif` handler. Each test runs against the Neutron emulator and, with
//! KURYR_TEST_NEUTRON_URL set, the real neutron-server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kuryr_config::KuryrConfig;
use kuryr_controller::Error;
use kuryr_controller::context::Context;
use kuryr_controller::handlers::HandlerRegistry;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pipeline::{RegisteredHandler, ResourceEventHandler};
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_crds::{KuryrPort, Vif};
use serde_json::json;
use support::*;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

fn bare_metal_config(fx: &NeutronFixture, handlers: &str) -> String {
    format!(
        "[kubernetes]\nenabled_handlers = {handlers}\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nresource_tags = k8s,test\n",
        fx.project, fx.subnet, fx.sg
    )
}

/// What `kuryr controller` builds (minus the HTTP endpoints), with the given handler registry.
fn options(
    kube: &kube::Client,
    target: &NeutronTarget,
    cfg: Arc<KuryrConfig>,
    registry: HandlerRegistry,
) -> ControllerOptions {
    let metrics = Metrics::new();
    let deployments = Deployments::noauth(&target.url, &metrics).expect("neutron client");
    let mut opts = ControllerOptions::new(cfg, kube.clone(), deployments, metrics);
    opts.health_addr = None;
    opts.metrics_addr = None;
    opts.identity = "handlers-test".into();
    opts.registry = registry;
    opts
}

/// The default VIF of `ns/name`'s KuryrPort once it is active and belongs to the pod `uid`.
async fn active_port_of(kube: &kube::Client, ns: &str, name: &str, uid: &str) -> Result<String> {
    let kps = Api::<KuryrPort>::namespaced(kube.clone(), ns);
    eventually(
        &format!("active KuryrPort {ns}/{name} of pod {uid}"),
        WAIT,
        || async {
            let Some(kp) = kps.get_opt(name).await? else {
                return Ok(None);
            };
            if kp.spec.pod_uid != uid {
                return Ok(None);
            }
            Ok(kp
                .status
                .as_ref()
                .and_then(|s| s.default_vif())
                .filter(|(_, v)| v.active())
                .map(|(_, v)| v.id().to_string()))
        },
    )
    .await
}

/// Collects formatted log lines (the warnings start-up prints).
#[derive(Clone, Default)]
struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

// current_thread on purpose: the log capture is this thread's default subscriber, and every task
// of the controller runs on this thread.
#[tokio::test]
async fn unknown_enabled_handler_stops_start_up_and_upstream_only_handlers_are_skipped() -> Result<()> {
    let logs = LogCapture::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("warn")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.60.0.0/24").await?;
        create_namespace(&kube.client, "demo", json!({})).await?;
        let pod = create_pod(&kube.client, "demo", "p", NODES[0], json!({})).await?;

        // A typo in enabled_handlers: run() refuses to start and names every valid handler.
        let cfg = config(&bare_metal_config(&fx, "vif,kuryrport,kuryrprot"));
        let opts = options(&kube.client, &target, cfg, HandlerRegistry::with_builtin());
        let res = tokio::time::timeout(Duration::from_secs(30), run(opts, CancellationToken::new())).await;
        let err = match res {
            Ok(Err(e)) => e,
            Ok(Ok(())) => bail!("{}: run() accepted an unknown handler", target.name),
            Err(_) => bail!("{}: run() kept running with an unknown handler", target.name),
        };
        assert!(matches!(err, Error::Config(_)), "{}: {err}", target.name);
        let msg = err.to_string();
        assert!(msg.contains("enabled_handlers"), "{msg}");
        assert!(msg.contains("\"kuryrprot\""), "{msg}");
        assert!(
            msg.contains(
                "valid handlers: endpoints, kuryrloadbalancer, kuryrnetwork, kuryrnetworkpolicy, kuryrport, namespace, \
                 pod_label, policy, service, vif"
            ),
            "{msg}"
        );
        // Nothing was started: the pod got no KuryrPort.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let kps = Api::<KuryrPort>::namespaced(kube.client.clone(), "demo");
        assert!(kps.list(&ListParams::default()).await?.items.is_empty());

        // Upstream's default list plus network policies and a pre-Victoria name: the one kuryr-rs
        // does not provide is skipped with a warning, the others run, and the controller wires pods.
        let upstream =
            "vif,endpoints,service,kuryrloadbalancer,kuryrport,policy,kuryrnetworkpolicy,lbaasspec";

        // The service handler without [neutron_defaults] service_subnet: run() refuses to start
        // and names the option (rather than failing every Service later).
        let cfg = config(&bare_metal_config(&fx, upstream));
        let opts = options(&kube.client, &target, cfg, HandlerRegistry::with_builtin());
        let res = tokio::time::timeout(Duration::from_secs(30), run(opts, CancellationToken::new())).await;
        let err = match res {
            Ok(Err(e)) => e,
            Ok(Ok(())) => bail!(
                "{}: run() started the service handler without a service subnet",
                target.name
            ),
            Err(_) => bail!("{}: run() kept running without a service subnet", target.name),
        };
        assert!(matches!(err, Error::Config(_)), "{}: {err}", target.name);
        assert!(
            err.to_string().contains("[neutron_defaults] service_subnet"),
            "{err}"
        );

        let cfg = config(&format!(
            "{}service_subnet = {}\n",
            bare_metal_config(&fx, upstream),
            fx.subnet
        ));
        let opts = options(&kube.client, &target, cfg, HandlerRegistry::with_builtin());
        let stop = CancellationToken::new();
        let ctrl = tokio::spawn(run(opts, stop.clone()));
        let port = active_port_of(&kube.client, "demo", "p", &pod.uid().unwrap()).await?;
        assert!(!ctrl.is_finished(), "{}: controller exited", target.name);
        assert_eq!(neutron.get_port(&port).await?.device_id, pod.uid().unwrap());
        let text = logs.text();
        for skipped in ["lb", "lbaasspec"] {
            assert!(
                text.lines().any(|l| l.contains(" WARN ")
                    && l.contains("not provided by kuryr-rs")
                    && l.contains(&format!("handler={skipped}"))),
                "{}: no warning for {skipped}:\n{text}",
                target.name
            );
        }
        for provided in [
            "vif",
            "kuryrport",
            "policy",
            "kuryrnetworkpolicy",
            "endpoints",
            "service",
            "kuryrloadbalancer",
        ] {
            assert!(
                !text
                    .lines()
                    .any(|l| l.contains("not provided") && l.contains(&format!("handler={provided}"))),
                "{}: {provided} reported as skipped:\n{text}",
                target.name
            );
        }
        stop.cancel();
        ctrl.await??;
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// A library user's handler: records every ConfigMap event and marks the ConfigMap as seen,
/// through the context it was built with.
struct ConfigMapHandler {
    ctx: Arc<Context>,
    vif_driver: String,
    seen: Seen,
}

/// (event, ConfigMap name, its `color` value) in the order the handler saw them.
type Seen = Arc<Mutex<Vec<(String, String, Option<String>)>>>;

const SEEN_ANNOTATION: &str = "example.org/seen-by";

#[async_trait]
impl ResourceEventHandler for ConfigMapHandler {
    type Object = ConfigMap;

    fn name(&self) -> &'static str {
        "configmap"
    }

    async fn on_present(&self, cm: &ConfigMap) -> Result<(), Error> {
        let value = cm.data.as_ref().and_then(|d| d.get("color").cloned());
        self.seen
            .lock()
            .unwrap()
            .push(("present".into(), cm.name_any(), value));
        if !cm.annotations().contains_key(SEEN_ANNOTATION) {
            let api: Api<ConfigMap> =
                Api::namespaced(self.ctx.kube.clone(), &cm.namespace().unwrap_or_default());
            let patch = json!({"metadata": {"annotations": {SEEN_ANNOTATION: self.vif_driver}}});
            api.patch(&cm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Ok(())
    }

    async fn on_deleted(&self, cm: &ConfigMap) -> Result<(), Error> {
        self.seen
            .lock()
            .unwrap()
            .push(("deleted".into(), cm.name_any(), None));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_registered_handler_receives_events_next_to_the_builtin_ones() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.61.0.0/24").await?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut registry = HandlerRegistry::with_builtin();
        let s = seen.clone();
        registry.register("configmap", move |ctx| {
            RegisteredHandler::new(ConfigMapHandler {
                ctx: ctx.clone(),
                vif_driver: ctx.drivers.vif.name().to_string(),
                seen: s.clone(),
            })
        });
        assert!(registry.names().any(|n| n == "configmap"));
        let cfg = config(&bare_metal_config(&fx, "vif,kuryrport,configmap"));
        let stop = CancellationToken::new();
        let ctrl = tokio::spawn(run(options(&kube.client, &target, cfg, registry), stop.clone()));

        create_namespace(&kube.client, "apps", json!({})).await?;
        let cms: Api<ConfigMap> = Api::namespaced(kube.client.clone(), "apps");
        let cm: ConfigMap = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": "apps"},
            "data": {"color": "blue"}
        }))?;
        cms.create(&PostParams::default(), &cm).await?;
        let pod = create_pod(&kube.client, "apps", "web", NODES[1], json!({})).await?;

        // The handler got the context: it annotated the ConfigMap with the configured VIF driver.
        let annotated = eventually("ConfigMap annotated by the handler", WAIT, || async {
            Ok(cms
                .get("settings")
                .await?
                .annotations()
                .get(SEEN_ANNOTATION)
                .cloned())
        })
        .await?;
        assert_eq!(annotated, "neutron-vif", "{}", target.name);
        // An update reaches it with the new content.
        let patch = json!({"data": {"color": "green"}});
        cms.patch("settings", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let has = |event: &str, value: Option<&str>| {
            seen.lock()
                .unwrap()
                .iter()
                .any(|(e, n, v)| e == event && n == "settings" && v.as_deref() == value)
        };
        eventually("update seen", WAIT, || async {
            Ok(has("present", Some("green")).then_some(()))
        })
        .await?;
        assert!(has("present", Some("blue")), "{}: creation seen", target.name);
        cms.delete("settings", &DeleteParams::default()).await?;
        eventually("deletion seen", WAIT, || async {
            Ok(has("deleted", None).then_some(()))
        })
        .await?;

        // The built-in handlers still run in the same pipeline.
        let port = active_port_of(&kube.client, "apps", "web", &pod.uid().unwrap()).await?;
        assert_eq!(neutron.get_port(&port).await?.binding_host_id, NODES[1]);
        // Only ConfigMaps reach the ConfigMap handler.
        assert!(
            seen.lock().unwrap().iter().all(|(_, n, _)| n == "settings"),
            "{}: {:?}",
            target.name,
            seen.lock().unwrap()
        );

        // Registered but not enabled: never instantiated, never called.
        let calls = Arc::new(Mutex::new(0u32));
        let mut registry = HandlerRegistry::with_builtin();
        let c = calls.clone();
        let s2 = Arc::new(Mutex::new(Vec::new()));
        registry.register("configmap", move |ctx| {
            *c.lock().unwrap() += 1;
            RegisteredHandler::new(ConfigMapHandler {
                ctx: ctx.clone(),
                vif_driver: ctx.drivers.vif.name().to_string(),
                seen: s2.clone(),
            })
        });
        stop.cancel();
        ctrl.await??;
        let cfg = config(&bare_metal_config(&fx, "vif,kuryrport"));
        let stop = CancellationToken::new();
        let ctrl = tokio::spawn(run(options(&kube.client, &target, cfg, registry), stop.clone()));
        cms.create(&PostParams::default(), &cm).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(*calls.lock().unwrap(), 0, "{}", target.name);
        assert!(
            !cms.get("settings")
                .await?
                .annotations()
                .contains_key(SEEN_ANNOTATION)
        );
        stop.cancel();
        ctrl.await??;
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recreated_pod_never_gets_the_old_pods_port() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.62.0.0/24").await?;
        let cfg = bare_metal_config(&fx, "vif,kuryrport");
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c1");
        create_namespace(&kube.client, "uid", json!({})).await?;
        let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "uid");

        // 1. Deleted and re-created while the controller runs.
        let first = create_pod(&kube.client, "uid", "p", NODES[0], json!({})).await?;
        let first_port = active_port_of(&kube.client, "uid", "p", &first.uid().unwrap()).await?;
        pods.delete("p", &DeleteParams::default()).await?;
        let second = eventually("re-created pod", WAIT, || async {
            match create_pod(&kube.client, "uid", "p", NODES[0], json!({})).await {
                Ok(p) => Ok(Some(p)),
                // The old pod still carries its finalizer until its port is released.
                Err(e) if e.to_string().contains("already exists") => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await?;
        assert_ne!(first.uid(), second.uid());
        let second_port = active_port_of(&kube.client, "uid", "p", &second.uid().unwrap()).await?;
        assert_ne!(second_port, first_port, "{}: old port reused", target.name);
        let err = neutron.get_port(&first_port).await.unwrap_err();
        assert!(err.is_not_found(), "{}: old port left: {err}", target.name);
        let port = neutron.get_port(&second_port).await?;
        assert_eq!(port.device_id, second.uid().unwrap(), "{}", target.name);

        // 2. The old pod vanished while the controller was down (its finalizer removed by hand),
        // the new one exists before the controller comes back: the old KuryrPort - with an
        // active VIF under the same name - must not be handed to the new pod.
        ctrl.shutdown().await?;
        // The garbage collector would delete the pod's KuryrPort with the pod; it runs
        // asynchronously, so the controller must not count on it: the KuryrPort loses its owner
        // reference here, standing in for a collector that has not got to it yet.
        let orphan = json!({"metadata": {"ownerReferences": null}});
        Api::<KuryrPort>::namespaced(kube.client.clone(), "uid")
            .patch("p", &PatchParams::default(), &Patch::Merge(&orphan))
            .await?;
        let strip = json!({"metadata": {"finalizers": null}});
        pods.patch("p", &PatchParams::default(), &Patch::Merge(&strip))
            .await?;
        pods.delete("p", &DeleteParams::default()).await?;
        eventually("old pod gone", WAIT, || async {
            Ok(pods.get_opt("p").await?.is_none().then_some(()))
        })
        .await?;
        let third = create_pod(&kube.client, "uid", "p", NODES[1], json!({})).await?;
        let stale = Api::<KuryrPort>::namespaced(kube.client.clone(), "uid")
            .get("p")
            .await?;
        assert_eq!(stale.spec.pod_uid, second.uid().unwrap(), "stale KuryrPort kept");
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c2");
        let third_port = active_port_of(&kube.client, "uid", "p", &third.uid().unwrap()).await?;
        assert_ne!(third_port, second_port, "{}: old port reused", target.name);
        let port = neutron.get_port(&third_port).await?;
        assert_eq!(port.device_id, third.uid().unwrap());
        assert_eq!(port.binding_host_id, NODES[1]);
        eventually("old pod's port deleted", WAIT, || async {
            match neutron.get_port(&second_port).await {
                Err(e) if e.is_not_found() => Ok(Some(())),
                Err(e) => Err(e.into()),
                Ok(_) => Ok(None),
            }
        })
        .await?;
        let owned = neutron
            .list_ports(
                &kuryr_neutron::ListFilter::new()
                    .project_id(&fx.project)
                    .device_owner("compute:kuryr"),
            )
            .await?;
        let ids: Vec<&str> = owned.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, [third_port.as_str()], "{}", target.name);
        let pod = pods.get("p").await?;
        assert!(
            pod.finalizers()
                .iter()
                .any(|f| f == kuryr_crds::names::finalizers::POD),
            "{}: the new pod carries the finalizer",
            target.name
        );
        let labels: BTreeMap<String, String> = Api::<KuryrPort>::namespaced(kube.client.clone(), "uid")
            .get("p")
            .await?
            .labels()
            .clone();
        assert_eq!(
            labels
                .get(kuryr_crds::names::labels::NODE_NAME)
                .map(String::as_str),
            Some(NODES[1])
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!("uid[{}]: re-created pods got new ports", target.name);
    }
    Ok(())
}

/// The longest names Kubernetes allows (a 63-character namespace, a 253-character pod name) add
/// up to more than the 255 characters Neutron takes for a port's name and a tag: the port is
/// still made, named and tagged within that, found again by its pod's tag, and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_with_the_longest_names_kubernetes_allows_is_wired_and_released() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.63.0.0/24").await?;
        let ctrl = start_controller(
            &kube.client,
            &target,
            config(&bare_metal_config(&fx, "vif,kuryrport")),
            "c1",
        );
        let ns = format!("long-{}", "n".repeat(58));
        let name = format!("{}.{}", "p".repeat(200), "q".repeat(52));
        assert_eq!((ns.len(), name.len()), (63, 253));
        create_namespace(&kube.client, &ns, json!({})).await?;
        let pod = create_pod(&kube.client, &ns, &name, NODES[0], json!({})).await?;
        let port_id = active_port_of(&kube.client, &ns, &name, &pod.uid().unwrap()).await?;
        let port = neutron.get_port(&port_id).await?;
        let tag = kuryr_crds::names::neutron::pod_tag(&ns, &name);
        assert!(port.tags.contains(&tag), "{}: {:?}", target.name, port.tags);
        assert!(
            port.tags.iter().all(|t| t.chars().count() <= 255),
            "{:?}",
            port.tags
        );
        assert_eq!(port.name.chars().count(), 255, "{}: {}", target.name, port.name);
        assert!(port.name.starts_with(&format!("{ns}/ppp")), "{}", port.name);
        Api::<Pod>::namespaced(kube.client.clone(), &ns)
            .delete(&name, &DeleteParams::default())
            .await?;
        eventually("the pod's port released", WAIT, || async {
            match neutron.get_port(&port_id).await {
                Err(e) if e.is_not_found() => Ok(Some(())),
                Err(e) => Err(e.into()),
                Ok(_) => Ok(None),
            }
        })
        .await?;
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// A pod on a node whose OVS agent plugs the hybrid way (its firewall is iptables_hybrid: Neutron
/// binds the port with `ovs_hybrid_plug`) gets upstream's hybrid VIF, a `VIFBridge` of plugin `ovs`
/// on its port's `qbr` bridge with the OVS bridge in its network, which the CNI daemon plugs through
/// that bridge where the agent's firewall filters; a pod on another node a `VIFOpenVSwitch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_on_a_hybrid_plug_node_gets_a_bridge_vif_of_the_ovs_plugin() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.67.0.0/24").await?;
        let ctrl = start_controller(
            &kube.client,
            &target,
            config(&bare_metal_config(&fx, "vif,kuryrport")),
            "c1",
        );
        create_namespace(&kube.client, "hybrid", json!({})).await?;
        for (name, node) in [("plain", NODES[0]), ("filtered", HYBRID_PLUG_NODE)] {
            let pod = create_pod(&kube.client, "hybrid", name, node, json!({})).await?;
            let port = active_port_of(&kube.client, "hybrid", name, &pod.uid().unwrap()).await?;
            let kp = Api::<KuryrPort>::namespaced(kube.client.clone(), "hybrid")
                .get(name)
                .await?;
            let vif = kp
                .status
                .as_ref()
                .and_then(|s| s.default_vif())
                .map(|(_, v)| v.clone());
            match (node, vif) {
                (HYBRID_PLUG_NODE, Some(Vif::Bridge(b))) => {
                    assert_eq!(b.base.plugin, "ovs", "{}", target.name);
                    let qbr: String = format!("qbr{port}").chars().take(14).collect();
                    assert_eq!(b.bridge_name.as_deref(), Some(qbr.as_str()), "{}", target.name);
                    let bridge = b.base.network.as_ref().and_then(|n| n.bridge.clone());
                    assert_eq!(bridge.as_deref(), Some("br-int"), "{}", target.name);
                }
                (_, Some(Vif::OpenVSwitch(o))) if node != HYBRID_PLUG_NODE => {
                    assert_eq!(o.bridge_name.as_deref(), Some("br-int"), "{}", target.name);
                }
                (_, other) => panic!("{}: {name} on {node}: {other:?}", target.name),
            }
        }
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// The vif handler with an OpenStack it never reaches: it only writes to Kubernetes.
fn kube_only_vif_handler(client: &kube::Client) -> Result<kuryr_controller::handlers::vif::VifHandler> {
    let platform = noauth_platform(
        client,
        "http://127.0.0.1:9",
        config("[neutron_defaults]\nproject = p1\npod_subnet = s1\npod_security_groups = sg1\n"),
    )?;
    Ok(kuryr_controller::handlers::vif::VifHandler::new(Context::build(
        platform,
    )?))
}

/// A pod event handled while its namespace is being deleted: the apiserver refuses the
/// KuryrPort (403, cause NamespaceTerminating) and the pod goes with its namespace, so the
/// handler is done - a race with the deletion, not a failure to retry or log at ERROR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_in_a_terminating_namespace_needs_no_kuryrport() -> Result<()> {
    let kube = start_kube().await?;
    create_namespace(&kube.client, "going", json!({})).await?;
    create_pod(&kube.client, "going", "p", NODES[0], json!({})).await?;
    // The pod's finalizer from an earlier event keeps the namespace terminating; the handler
    // then works on its copy from before the deletion.
    let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "going");
    let held = json!({"metadata": {"finalizers": [kuryr_crds::names::finalizers::POD]}});
    let pod = pods
        .patch("p", &PatchParams::default(), &Patch::Merge(&held))
        .await?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.client.clone())
        .delete("going", &DeleteParams::default())
        .await?;
    let handler = kube_only_vif_handler(&kube.client)?;
    handler.on_present(&pod).await?;
    let kps: Api<KuryrPort> = Api::namespaced(kube.client.clone(), "going");
    assert!(
        kps.get_opt("p").await?.is_none(),
        "no KuryrPort in a terminating namespace"
    );
    Ok(())
}

/// A KuryrPort the controller cannot parse (here a VIF type it does not know) is not handed to
/// the handler: the error names the object and the field, and the object gets a Warning Event
/// saying so, which is where its owner looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_cannot_be_parsed_is_a_warning_event_on_it_naming_the_field() -> Result<()> {
    use kube::api::{ApiResource, DynamicObject};
    use kuryr_controller::handlers::kuryrport::KuryrPortHandler;
    use kuryr_controller::pipeline::{Event, EventHandler, EventType, Typed};
    let kube = start_kube().await?;
    create_namespace(&kube.client, "odd", json!({})).await?;
    let platform = noauth_platform(
        &kube.client,
        "http://127.0.0.1:9",
        config("[neutron_defaults]\nproject = p1\npod_subnet = s1\npod_security_groups = sg1\n"),
    )?;
    let ctx = Context::build(platform)?;
    let handler = Typed::new(Arc::new(KuryrPortHandler::new(ctx.clone()))).telling(ctx.events.clone());
    let raw = json!({
        "apiVersion": "openstack.org/v1", "kind": "KuryrPort",
        "metadata": {"name": "p", "namespace": "odd"},
        "spec": {"podUid": "u1", "podNodeName": NODES[0]},
        "status": {"vifs": {"eth0": {"default": true, "vif": {
            "versioned_object.name": "VIFFromTheFuture", "versioned_object.namespace": "os_vif",
            "versioned_object.version": "1.0", "versioned_object.data": {}}}}}
    });
    let api: Api<DynamicObject> =
        Api::namespaced_with(kube.client.clone(), "odd", &ApiResource::erase::<KuryrPort>(&()));
    let created = api
        .create(&PostParams::default(), &serde_json::from_value(raw)?)
        .await?;
    let resource = Arc::new(ApiResource::erase::<KuryrPort>(&()));
    let e = handler
        .handle(Event::new(EventType::Added, resource, created))
        .await
        .expect_err("not handed over");
    let text = e.to_string();
    for want in ["odd/p", "status.vifs.eth0.vif", "VIFFromTheFuture"] {
        assert!(text.contains(want), "{want:?} in {text}");
    }
    assert!(e.is_user_visible(), "the owner's to fix, not an ERROR: {e}");
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(kube.client.clone(), "odd");
    let note = eventually("Warning Event on the KuryrPort", WAIT, || async {
        Ok(events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .find_map(|ev| {
                let r = ev.regarding.as_ref()?;
                (ev.type_.as_deref() == Some("Warning")
                    && r.kind.as_deref() == Some("KuryrPort")
                    && r.name.as_deref() == Some("p"))
                .then_some(ev.note)
                .flatten()
            }))
    })
    .await?;
    assert!(note.contains("status.vifs.eth0.vif"), "{note}");
    Ok(())
}

/// The vif handler's own finalizer write comes back as a MODIFIED event at the version it
/// finished on: handled again it would only re-read the KuryrPort, so it is skipped (no
/// request). A change by anyone else, and the watcher's periodic re-send of the same version,
/// are handled in full; a pod's DELETED event drops its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vif_handler_skips_its_own_write_but_not_a_resend_or_another_change() -> Result<()> {
    use kube::api::{ApiResource, DynamicObject};
    use kuryr_controller::pipeline::{Event, EventHandler, EventType, Typed};
    let kube = start_kube().await?;
    create_namespace(&kube.client, "own", json!({})).await?;
    create_pod(&kube.client, "own", "p", NODES[0], json!({})).await?;
    let handler = Typed::new(Arc::new(kube_only_vif_handler(&kube.client)?));
    let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "own");
    let resource = Arc::new(ApiResource::erase::<Pod>(&()));
    let event = |ty: EventType, pod: &Pod| -> Result<Event> {
        let obj: DynamicObject = serde_json::from_value(serde_json::to_value(pod)?)?;
        Ok(Event::new(ty, resource.clone(), obj))
    };
    let requests = || kube.handle.requests().snapshot().into_values().sum::<u64>();

    handler
        .handle(event(EventType::Added, &pods.get("p").await?)?)
        .await?;
    let kps: Api<KuryrPort> = Api::namespaced(kube.client.clone(), "own");
    assert!(
        kps.get_opt("p").await?.is_some(),
        "the first pass made the KuryrPort"
    );
    // The pod as the handler's finalizer patch left it: its own write coming back.
    let own = pods.get("p").await?;
    assert!(
        own.finalizers()
            .iter()
            .any(|f| f == kuryr_crds::names::finalizers::POD)
    );
    let before = requests();
    handler.handle(event(EventType::Modified, &own)?).await?;
    assert_eq!(requests() - before, 0, "its own write is not handled again");

    // The periodic re-send of that same version is handled in full (it re-reads the KuryrPort).
    let before = requests();
    let obj: DynamicObject = serde_json::from_value(serde_json::to_value(&own)?)?;
    handler.handle(Event::resync(resource.clone(), obj)).await?;
    assert!(requests() > before, "a re-send is handled");

    // Another writer's change is handled: the KuryrPort deleted by hand comes back.
    kps.delete("p", &DeleteParams::default()).await?;
    kps.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    let labelled = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "web"}}})),
        )
        .await?;
    handler.handle(event(EventType::Modified, &labelled)?).await?;
    assert!(
        kps.get_opt("p").await?.is_some(),
        "a change by someone else is handled in full: the KuryrPort is made again"
    );
    Ok(())
}

/// The KuryrPort handler writes its status twice in a pass (the ports recorded, then active).
/// Both writes come back as MODIFIED events: the first shows a state the pass already left
/// (inactive ports it would activate and record again), the last the state it finished on, so
/// both are skipped without a request. The re-send of the same version, and a pass that failed,
/// are handled in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kuryrport_handler_skips_every_event_of_its_own_writes() -> Result<()> {
    use futures::StreamExt;
    use kube::api::{ApiResource, DynamicObject, WatchEvent, WatchParams};
    use kuryr_controller::pipeline::{Event, EventHandler, EventType, Typed};
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let fx = neutron_fixture(&target.client, "10.63.0.0/24").await?;
        let platform = noauth_platform(
            &kube.client,
            &target.url,
            config(&bare_metal_config(&fx, "vif,kuryrport")),
        )?;
        let ctx = Context::build(platform)?;
        create_namespace(&kube.client, "own", json!({})).await?;
        let pod = create_pod(&kube.client, "own", "p", NODES[0], json!({})).await?;
        kuryr_controller::handlers::vif::VifHandler::new(ctx.clone())
            .on_present(&pod)
            .await?;
        let kps: Api<KuryrPort> = Api::namespaced(kube.client.clone(), "own");
        let handler = Typed::new(Arc::new(
            kuryr_controller::handlers::kuryrport::KuryrPortHandler::new(ctx.clone()),
        ));
        let resource = Arc::new(ApiResource::erase::<KuryrPort>(&()));
        let event = |ty: EventType, kp: &KuryrPort| -> Result<Event> {
            let obj: DynamicObject = serde_json::from_value(serde_json::to_value(kp)?)?;
            Ok(Event::new(ty, resource.clone(), obj))
        };
        // One pass, watched from the object it starts with. A loaded real server may not make
        // the port ACTIVE within the handler's wait: the pipeline's Retry would then run it again
        // on the object as it is, and so does the test (the writes watched are the last pass').
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut passes = 0;
        let (mut watch, recorded_before) = loop {
            let start = kps.get("p").await?;
            let recorded_before = start.status.as_ref().is_some_and(|s| !s.vifs.is_empty());
            let watch = kps
                .watch(
                    &WatchParams::default(),
                    start.resource_version().as_deref().unwrap_or("0"),
                )
                .await?
                .boxed();
            passes += 1;
            match handler.handle(event(EventType::Added, &start)?).await {
                Ok(()) => break (watch, recorded_before),
                Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                    eprintln!("{}: pass {passes} not done ({e}); again", target.name);
                }
                Err(e) => return Err(e.into()),
            }
        };
        let last = kps.get("p").await?;
        let active = last
            .status
            .as_ref()
            .and_then(|s| s.vifs.values().next())
            .is_some_and(|v| v.vif.active());
        assert!(
            active,
            "{}: the pass recorded and activated the port",
            target.name
        );

        // Every write of the pass, as the watch hands it back.
        let mut own = vec![];
        while own.last().map(|k: &KuryrPort| k.resource_version()) != Some(last.resource_version()) {
            match tokio::time::timeout(WAIT, watch.next()).await? {
                Some(Ok(WatchEvent::Modified(kp))) => own.push(kp),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => bail!("the watch ended"),
            }
        }
        // The ports recorded, then active (a pass after one that recorded them only activates).
        let writes = if recorded_before { 1 } else { 2 };
        assert_eq!(own.len(), writes, "{}: the pass' writes", target.name);
        let requests = || kube.handle.requests().snapshot().into_values().sum::<u64>();
        for kp in &own {
            let before = requests();
            handler.handle(event(EventType::Modified, kp)?).await?;
            assert_eq!(
                requests() - before,
                0,
                "{}: its own write at {:?} is not handled again",
                target.name,
                kp.resource_version()
            );
        }
        // The periodic re-send of the first write is handled in full (it re-reads the pod).
        let before = requests();
        let obj: DynamicObject = serde_json::from_value(serde_json::to_value(&own[0])?)?;
        handler.handle(Event::resync(resource.clone(), obj)).await?;
        assert!(requests() > before, "{}: a re-send is handled", target.name);
        cleanup_project(&target.client, &fx.project).await;
    }
    Ok(())
}

/// A Service kuryr skips (headless: a StatefulSet's) carries no finalizer, so its deletion reaches
/// `on_deleted`, not `on_finalize`: what the handler remembers of it (the Event it published) goes
/// then, or every headless Service a cluster ever had stays in the controller's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_service_is_forgotten_when_it_is_deleted() -> Result<()> {
    use k8s_openapi::api::core::v1::Service;
    use kuryr_controller::handlers::service::ServiceHandler;
    let kube = start_kube().await?;
    create_namespace(&kube.client, "hl", json!({})).await?;
    let platform = noauth_platform(
        &kube.client,
        "http://127.0.0.1:9",
        config("[neutron_defaults]\nproject = p1\npod_subnet = s1\nservice_subnet = s2\n"),
    )?;
    let handler = ServiceHandler::new(Context::build(platform)?);
    let services: Api<Service> = Api::namespaced(kube.client.clone(), "hl");
    let mut made = Vec::new();
    for i in 0..3 {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": format!("db-{i}"), "namespace": "hl"},
            "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 5432}]}
        }))?;
        made.push(services.create(&PostParams::default(), &svc).await?);
    }
    for svc in &made {
        handler.on_present(svc).await?;
    }
    assert_eq!(handler.remembered(), 3, "each skip told once");
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(kube.client.clone(), "hl");
    let told = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("KuryrServiceSkipped"))
        .count();
    assert_eq!(told, 3);
    for svc in &made {
        services.delete(&svc.name_any(), &DeleteParams::default()).await?;
        handler.on_deleted(svc).await?;
    }
    assert_eq!(handler.remembered(), 0);
    Ok(())
}

/// A policy change refreshes the Services it affects from a listing that may be older than a change
/// of the Service the service handler applied since: the refresh must not put the old ports back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_from_an_older_listing_keeps_the_services_new_ports() -> Result<()> {
    use k8s_openapi::api::core::v1::Service;
    use kuryr_controller::handlers::service::ServiceHandler;
    use kuryr_crds::KuryrLoadBalancer;
    use neutron_emulator::{Emulator, EmulatorOptions};
    let emulator = Emulator::start(EmulatorOptions::default()).await?;
    let neutron = kuryr_neutron::NeutronClient::new(&kuryr_neutron::ClientOptions::noauth(emulator.url()))?;
    let fx = neutron_fixture(&neutron, "10.96.0.0/16").await?;
    let kube = start_kube().await?;
    create_namespace(&kube.client, "web", json!({})).await?;
    let platform = noauth_platform(
        &kube.client,
        &emulator.url(),
        config(&format!(
            "[neutron_defaults]\nproject = {}\npod_subnet = {}\nservice_subnet = {}\npod_security_groups = {}\n",
            fx.project, fx.subnet, fx.subnet, fx.sg
        )),
    )?;
    let handler = ServiceHandler::new(Context::build(platform)?);
    let services: Api<Service> = Api::namespaced(kube.client.clone(), "web");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "protocol": "TCP"}]}
    }))?;
    let listed = services.create(&PostParams::default(), &svc).await?;
    handler.on_present(&listed).await?;
    let now = services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"ports": [{"port": 8080, "protocol": "TCP"}]}})),
        )
        .await?;
    handler.on_present(&now).await?;
    let klbs: Api<KuryrLoadBalancer> = Api::namespaced(kube.client.clone(), "web");
    let ports = |klb: KuryrLoadBalancer| klb.spec.ports.iter().map(|p| p.port).collect::<Vec<_>>();
    assert_eq!(ports(klbs.get("web").await?), [8080]);
    let patched = handler.refresh(&listed).await?;
    assert!(!patched, "nothing of the Service as it is now differs");
    assert_eq!(
        ports(klbs.get("web").await?),
        [8080],
        "the old port is not put back"
    );
    Ok(())
}

/// The vif handler's finalizer write answers with the pod as it is now: a pod that failed since the
/// event the handler acts on (the kubelet refused it at admission) gets no KuryrPort, and no port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_failed_since_its_event_gets_no_kuryrport() -> Result<()> {
    use kuryr_controller::handlers::vif::VifHandler;
    let kube = start_kube().await?;
    create_namespace(&kube.client, "f", json!({})).await?;
    let platform = noauth_platform(
        &kube.client,
        "http://127.0.0.1:9",
        config("[neutron_defaults]\nproject = p1\npod_subnet = s1\npod_security_groups = g1\n"),
    )?;
    let handler = VifHandler::new(Context::build(platform)?);
    let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "f");
    let seen = create_pod(&kube.client, "f", "refused", NODES[0], json!({})).await?;
    pods.patch_status(
        "refused",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": "Failed", "reason": "OutOfcpu"}})),
    )
    .await?;
    handler.on_present(&seen).await?;
    let kps: Api<KuryrPort> = Api::namespaced(kube.client.clone(), "f");
    assert!(
        kps.get_opt("refused").await?.is_none(),
        "no KuryrPort for a failed pod"
    );
    let now = pods.get("refused").await?;
    assert!(
        !now.finalizers().iter().any(|f| f.starts_with("kuryr")),
        "and no finalizer of ours left on it: {:?}",
        now.finalizers()
    );
    Ok(())
}

/// A KuryrPort deleted while its pod runs (by hand, or a namespace's deletion reaching KuryrPorts
/// before pods): its port is not released - with a pool, it would be another pod's, address and
/// all, while this one still used it. The KuryrPort waits, Terminating, with a Warning Event on
/// the pod (upstream's rule); once the pod is deleted, the port is released and both go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kuryrport_deleted_under_a_running_pod_keeps_its_port_until_the_pod_goes() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.63.0.0/24").await?;
        let cfg = bare_metal_config(&fx, "vif,kuryrport");
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c-kept");
        create_namespace(&kube.client, "kept", json!({})).await?;
        let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "kept");
        let kps: Api<KuryrPort> = Api::namespaced(kube.client.clone(), "kept");
        let pod = create_pod(&kube.client, "kept", "p", NODES[0], json!({})).await?;
        let port = active_port_of(&kube.client, "kept", "p", &pod.uid().unwrap()).await?;
        kps.delete("p", &DeleteParams::default()).await?;
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(kube.client.clone(), "kept");
        eventually("NoKuryrPort Warning Event on the pod", WAIT, || async {
            Ok(events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("NoKuryrPort")))
        })
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        neutron
            .get_port(&port)
            .await
            .map_err(|e| anyhow::anyhow!("{}: port released under a running pod: {e}", target.name))?;
        let kp = kps.get("p").await?;
        assert!(kp.metadata.deletion_timestamp.is_some(), "waiting, Terminating");
        assert_eq!(
            kp.status
                .and_then(|s| s.default_vif().map(|(_, v)| v.id().to_string())),
            Some(port.clone()),
            "{}: the pod keeps its port",
            target.name
        );
        pods.delete("p", &DeleteParams::default()).await?;
        // At once, not at the watch's periodic re-send of the KuryrPort (minutes away).
        eventually(
            "pod and KuryrPort gone, port released",
            Duration::from_secs(30),
            || async {
                let released = neutron.get_port(&port).await.is_err_and(|e| e.is_not_found());
                let gone = pods.get_opt("p").await?.is_none() && kps.get_opt("p").await?.is_none();
                Ok((released && gone).then_some(()))
            },
        )
        .await?;
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// A client layer that loses the answer of the first KuryrPort PATCH after the API server has
/// committed it (a timeout or reset after the request was sent), answering 500 instead.
#[derive(Clone)]
struct LoseFirstKuryrPortPatch<S> {
    inner: S,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl<S, B> tower::Service<http::Request<kube::client::Body>> for LoseFirstKuryrPortPatch<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let lose = req.method() == http::Method::PATCH
            && req.uri().path().contains("/kuryrports/")
            && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut resp = fut.await?;
            if lose {
                // The object came back; the client sees a server error instead.
                *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            }
            Ok(resp)
        })
    }
}

/// The status write recording a pod's ports is committed, but its answer is lost: the ports it
/// recorded are not given back (with a pool they would be handed to another pod while this one
/// used them). The retry finds them recorded and goes on with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_whose_answer_is_lost_keeps_the_ports_it_recorded() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let fx = neutron_fixture(&target.client, "10.64.0.0/24").await?;
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let layer_armed = armed.clone();
        let lossy = kube::client::ClientBuilder::try_from(kube::Config::new(kube.handle.url().parse()?))?
            .with_layer(&tower::layer::layer_fn(move |inner| LoseFirstKuryrPortPatch {
                inner,
                armed: layer_armed.clone(),
            }))
            .build();
        let platform = noauth_platform(
            &lossy,
            &target.url,
            config(&bare_metal_config(&fx, "vif,kuryrport")),
        )?;
        let ctx = Context::build(platform)?;
        create_namespace(&kube.client, "lost", json!({})).await?;
        let pod = create_pod(&kube.client, "lost", "p", NODES[0], json!({})).await?;
        kuryr_controller::handlers::vif::VifHandler::new(ctx.clone())
            .on_present(&pod)
            .await?;
        let kps: Api<KuryrPort> = Api::namespaced(kube.client.clone(), "lost");
        let handler = kuryr_controller::handlers::kuryrport::KuryrPortHandler::new(ctx.clone());
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let first = handler.on_present(&kps.get("p").await?).await;
        assert!(first.is_err(), "{}: the write's answer was lost", target.name);
        let recorded = kps
            .get("p")
            .await?
            .status
            .and_then(|s| s.default_vif().map(|(_, v)| v.id().to_string()))
            .ok_or_else(|| anyhow::anyhow!("the write was committed"))?;
        target
            .client
            .get_port(&recorded)
            .await
            .map_err(|e| anyhow::anyhow!("{}: the recorded port was given back: {e}", target.name))?;
        handler.on_present(&kps.get("p").await?).await?;
        let port = active_port_of(&kube.client, "lost", "p", &pod.uid().unwrap()).await?;
        assert_eq!(port, recorded, "{}", target.name);
        cleanup_project(&target.client, &fx.project).await;
    }
    Ok(())
}
