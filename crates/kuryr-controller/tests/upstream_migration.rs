//! The switch from upstream kuryr-kubernetes 10.0.0 to kuryr-rs on a live cluster, as
//! docs/install.md tells an operator to do it: upstream's own controller (the venv of
//! scripts/upstream-kuryr-venv.sh, run unchanged) wires a namespace and its pods; it is stopped;
//! kuryr-rs starts on the same kuryr.conf and the objects upstream wrote. Nothing is made twice,
//! the namespace's network serves new pods, and every port, subnet, network and router interface
//! upstream made is released the right way when its pod or namespace goes. Against the Neutron
//! emulator and, with KURYR_TEST_NEUTRON_URL set, the real neutron-server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kuryr_crds::{KuryrNetwork, KuryrPort};
use kuryr_neutron::{ListFilter, NeutronClient};
use serde_json::json;
use support::*;

/// Upstream's controller takes a few seconds to import and list everything before it acts.
const WAIT: Duration = Duration::from_secs(120);

/// The venv's python, or `None` after saying why the test cannot run.
fn upstream_controller() -> Option<PathBuf> {
    let python = std::env::var_os("KURYR_TEST_UPSTREAM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.upstream-kuryr/venv/bin/python")
        });
    let exe = python.parent().map(|bin| bin.join("kuryr-k8s-controller"));
    match exe {
        Some(exe) if exe.exists() => Some(exe),
        _ => {
            skip(format!(
                "upstream kuryr-k8s-controller not found next to {}: run scripts/upstream-kuryr-venv.sh \
                 (scripts/test-all.sh does and exports KURYR_TEST_UPSTREAM_PYTHON)",
                python.display()
            ));
            None
        }
    }
}

/// A port nothing listens on right now (upstream's health and metrics servers take them).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The one kuryr.conf both controllers read: upstream's option names, plus kuryr-rs'
/// `cluster_id`, which upstream ignores.
struct Conf<'a> {
    kube_url: &'a str,
    neutron_url: &'a str,
    project: &'a str,
    sg: &'a str,
    router: &'a str,
    subnet_pool: &'a str,
    cluster_id: &'a str,
}

impl Conf<'_> {
    fn text(&self) -> Result<String> {
        Ok(format!(
            "[DEFAULT]\ndebug = False\n\
             [kubernetes]\napi_root = {}\ntoken_file =\n\
             enabled_handlers = vif,kuryrport,namespace,kuryrnetwork\n\
             pod_vif_driver = neutron-vif\nvif_pool_driver = noop\npod_subnets_driver = namespace\n\
             pod_security_groups_driver = default\npod_project_driver = default\ncontroller_ha = False\n\
             cluster_id = {}\n\
             [neutron]\nauth_type = none\nendpoint = {}\n\
             [neutron_defaults]\nproject = {}\npod_security_groups = {}\novs_bridge = br-int\n\
             [namespace_subnet]\npod_router = {}\npod_subnet_pool = {}\n\
             [health_server]\nport = {}\n\
             [prometheus_exporter]\ncontroller_exporter_port = {}\n",
            self.kube_url.trim_end_matches('/'),
            self.cluster_id,
            self.neutron_url.trim_end_matches('/'),
            self.project,
            self.sg,
            self.router,
            self.subnet_pool,
            free_port()?,
            free_port()?,
        ))
    }
}

/// Upstream's controller as a child process; killed if the test ends without stopping it.
struct Upstream {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Upstream {
    fn start(exe: &Path, conf: &Path, log: PathBuf) -> Result<Self> {
        let out = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(exe)
            .arg("--config-file")
            .arg(conf)
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .kill_on_drop(true)
            .spawn()
            .context("starting upstream's kuryr-k8s-controller")?;
        Ok(Self { child, log })
    }

    /// The end of its log, to explain a wait that timed out.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// `what` within [`WAIT`], or the error with upstream's log.
    async fn wait<T, F, Fut>(&mut self, what: &str, f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>>>,
    {
        let res = eventually(what, WAIT, f).await;
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!("upstream's controller exited ({status}):\n{}", self.log_tail());
        }
        res.with_context(|| format!("upstream's controller log ends with:\n{}", self.log_tail()))
    }

    /// SIGTERM, as `kubectl scale --replicas=0` ends it; SIGKILL after 10 s.
    async fn stop(mut self) -> Result<()> {
        let pid = self.child.id().context("upstream's controller already reaped")?;
        let sent = tokio::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .await?;
        anyhow::ensure!(sent.success(), "kill -TERM {pid}: {sent}");
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
}

/// The port of each pod's KuryrPort once every VIF is active.
async fn active_ports(
    kube: &kube::Client,
    ns: &str,
    pods: &[&str],
) -> Result<Option<BTreeMap<String, String>>> {
    let api: Api<KuryrPort> = Api::namespaced(kube.clone(), ns);
    let mut out = BTreeMap::new();
    for pod in pods {
        let Some(kp) = api.get_opt(pod).await? else {
            return Ok(None);
        };
        let Some(status) = kp.status.as_ref() else {
            return Ok(None);
        };
        if status.vifs.is_empty() || !status.vifs.values().all(|v| v.vif.active()) {
            return Ok(None);
        }
        let Some((_, vif)) = status.default_vif() else {
            return Ok(None);
        };
        out.insert(pod.to_string(), vif.id().to_string());
    }
    Ok(Some(out))
}

/// The namespace's network, subnet and router once its KuryrNetwork says they are all there.
async fn namespace_network(kube: &kube::Client, ns: &str) -> Result<Option<(String, String, String)>> {
    let kn = Api::<KuryrNetwork>::namespaced(kube.clone(), ns)
        .get_opt(ns)
        .await?;
    Ok(kn.and_then(|kn| {
        let s = kn.status?;
        Some((s.net_id?, s.subnet_id?, s.router_id?))
    }))
}

/// Ports of `project` that pods use (not the router's nor DHCP's).
async fn pod_ports(neutron: &NeutronClient, project: &str) -> Result<Vec<kuryr_neutron::Port>> {
    Ok(neutron
        .list_ports(&ListFilter::new().project_id(project))
        .await?
        .into_iter()
        .filter(|p| p.device_owner.starts_with("compute:") || p.device_owner.is_empty())
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_wires_a_namespace_then_kuryr_rs_takes_over_without_making_anything_twice() -> Result<()> {
    init_logs();
    let Some(exe) = upstream_controller() else {
        return Ok(());
    };
    for target in neutron_targets().await? {
        let neutron = &target.client;
        let kube = start_kube().await?;
        let fx = neutron_fixture(neutron, "10.66.0.0/24").await?;
        let (pool, router) = namespace_subnet_infra(neutron, &fx.project, "10.67.0.0/16").await?;
        let dir = tempfile::tempdir()?;
        let conf = dir.path().join("kuryr.conf");
        let cluster_id = format!("migration-{}", &fx.project[..8]);
        let text = Conf {
            kube_url: kube.handle.url(),
            neutron_url: &target.url,
            project: &fx.project,
            sg: &fx.sg,
            router: &router.id,
            subnet_pool: &pool.id,
            cluster_id: &cluster_id,
        }
        .text()?;
        std::fs::write(&conf, &text)?;

        // Upstream wires a namespace and two pods.
        let mut upstream = Upstream::start(&exe, &conf, dir.path().join("upstream.log"))?;
        create_namespace(&kube.client, "moved", json!({})).await?;
        for (pod, node) in [("p1", NODES[0]), ("p2", NODES[1])] {
            create_pod(&kube.client, "moved", pod, node, json!({})).await?;
        }
        let (net, subnet, router_id) = upstream
            .wait("upstream's namespace network", || {
                namespace_network(&kube.client, "moved")
            })
            .await?;
        let before = upstream
            .wait("upstream's active KuryrPorts", || {
                active_ports(&kube.client, "moved", &["p1", "p2"])
            })
            .await?;
        upstream.stop().await?;
        assert_eq!(router_id, router.id, "{}", target.name);
        let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "moved");
        for p in ["p1", "p2"] {
            let pod = pods.get(p).await?;
            assert!(
                pod.finalizers()
                    .iter()
                    .any(|f| f == kuryr_crds::names::finalizers::POD),
                "{}: upstream put its finalizer on {p}",
                target.name
            );
        }
        let made = pod_ports(neutron, &fx.project).await?;
        assert_eq!(made.len(), 2, "{}: {made:?}", target.name);

        // kuryr-rs takes over with the same file.
        let ctrl = start_controller(&kube.client, &target, config(&text), "migration");
        create_pod(&kube.client, "moved", "p3", NODES[0], json!({})).await?;
        let after = eventually("p3 wired by kuryr-rs", WAIT, || {
            active_ports(&kube.client, "moved", &["p1", "p2", "p3"])
        })
        .await?;
        for p in ["p1", "p2"] {
            assert_eq!(
                after[p], before[p],
                "{}: {p} kept the port upstream gave it",
                target.name
            );
        }
        let p3 = neutron.get_port(&after["p3"]).await?;
        assert_eq!(
            p3.network_id, net,
            "{}: p3 is on the namespace's network",
            target.name
        );
        assert!(
            p3.fixed_ips.iter().any(|ip| ip.subnet_id == subnet),
            "{}: p3 is on upstream's subnet: {:?}",
            target.name,
            p3.fixed_ips
        );
        // The resync after start-up is a few seconds; nothing is made twice by it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            namespace_network(&kube.client, "moved").await?,
            Some((net.clone(), subnet.clone(), router_id))
        );
        let networks = neutron
            .list_networks(&ListFilter::new().project_id(&fx.project))
            .await?;
        assert_eq!(
            networks.len(),
            2,
            "{}: the fixture's and the namespace's: {networks:?}",
            target.name
        );
        assert_eq!(pod_ports(neutron, &fx.project).await?.len(), 3, "{}", target.name);

        // A pod upstream wired goes: its port is released and the pod is let go.
        pods.delete("p1", &DeleteParams::default()).await?;
        eventually("p1 gone with its port", WAIT, || async {
            let gone = pods.get_opt("p1").await?.is_none();
            let port_gone = neutron
                .get_port(&before["p1"])
                .await
                .is_err_and(|e| e.is_not_found());
            Ok((gone && port_gone).then_some(()))
        })
        .await?;

        // The namespace goes: its pods, then the network, subnet and router interface upstream made.
        Api::<Namespace>::all(kube.client.clone())
            .delete("moved", &DeleteParams::default())
            .await?;
        eventually(
            "the namespace's network and router interface removed",
            WAIT,
            || async {
                let net_gone = neutron.get_network(&net).await.is_err_and(|e| e.is_not_found());
                let subnet_gone = neutron.get_subnet(&subnet).await.is_err_and(|e| e.is_not_found());
                let interfaces = neutron
                    .list_ports(&ListFilter::new().device_id(&router.id))
                    .await?;
                let kn_gone = Api::<KuryrNetwork>::namespaced(kube.client.clone(), "moved")
                    .get_opt("moved")
                    .await?
                    .is_none();
                Ok((net_gone && subnet_gone && interfaces.is_empty() && kn_gone).then_some(()))
            },
        )
        .await?;
        let left = pod_ports(neutron, &fx.project).await?;
        assert!(left.is_empty(), "{}: ports left behind: {left:?}", target.name);
        ctrl.shutdown().await?;
        let _ = neutron.delete_router(&router.id).await;
        let _ = neutron.delete_subnetpool(&pool.id).await;
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}
