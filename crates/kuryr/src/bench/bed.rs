//! One run's test bed: fresh Kubernetes and Neutron emulators, the Neutron fixture (project,
//! network, subnet, security group, port quota lifted) and the kuryr.conf both controllers read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_emulator::{KubeEmulator, KubeHandle, KubeOptions};
use kuryr_neutron::{ClientOptions, NeutronClient, QuotaUpdate};
use neutron_emulator::{AgentHosts, Emulator, EmulatorHandle, EmulatorOptions, LatencyProfile};
use serde_json::json;

use futures::{StreamExt as _, TryStreamExt as _};

use super::Profile;

/// The simulated cluster: nodes (with the InternalIP the kubelet would report) and the
/// namespaces pods go to.
#[derive(Clone, Debug)]
pub struct Layout {
    pub nodes: Vec<(String, String)>,
    pub namespaces: Vec<String>,
}

impl Layout {
    /// The peer runs: 4 nodes and two namespaces, as a new user would try it.
    pub fn peer() -> Self {
        Self {
            nodes: (1..=4)
                .map(|i| (format!("bench-node-{i}"), format!("192.168.50.{}", 10 + i)))
                .collect(),
            namespaces: vec!["bench-a".into(), "bench-b".into()],
        }
    }

    /// `nodes` nodes (`bench-node-1`.., addresses from 192.168.0.1 on) and `namespaces`
    /// namespaces (`bench-1`..).
    pub fn grid(nodes: usize, namespaces: usize) -> Self {
        Self {
            nodes: (1..=nodes)
                .map(|i| {
                    (
                        format!("bench-node-{i}"),
                        format!("192.168.{}.{}", i / 250, i % 250 + 1),
                    )
                })
                .collect(),
            namespaces: (1..=namespaces).map(|i| format!("bench-{i}")).collect(),
        }
    }

    /// Namespace and node of pod `i` of a workload: namespaces in turn, then the next node, so
    /// that `nodes * namespaces * k` pods put `namespaces * k` on every node.
    pub fn place(&self, i: usize) -> (&str, &str) {
        let ns = &self.namespaces[i % self.namespaces.len()];
        let node = &self.nodes[(i / self.namespaces.len()) % self.nodes.len()].0;
        (ns, node)
    }
}

pub struct Bed {
    pub kube: KubeHandle,
    pub neutron: EmulatorHandle,
    pub conf: PathBuf,
    pub health_port: u16,
    /// The controller's Prometheus exporter.
    pub metrics_port: u16,
    /// Worker slots of the emulated neutron-server (`None`: unlimited).
    pub neutron_workers: Option<usize>,
}

impl Bed {
    pub async fn start(profile: Profile, pooled: bool, layout: &Layout, dir: &Path) -> anyhow::Result<Self> {
        if layout.nodes.is_empty() || layout.namespaces.is_empty() {
            anyhow::bail!("the bench layout needs at least one node and one namespace");
        }
        let kube = KubeEmulator::start(KubeOptions {
            nodes: layout.nodes.iter().map(|(n, _)| n.clone()).collect(),
            // The bench's own watch must keep up with a burst of thousands of events.
            watch_channel_capacity: 1 << 16,
            ..KubeOptions::default()
        })
        .await
        .context("starting the Kubernetes API emulator")?;
        let client = kube::Client::try_from(kube::Config::new(kube.url().parse()?))?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in kuryr_crds::generate::crds() {
            crds.create(&PostParams::default(), &crd)
                .await
                .context("applying the CRDs")?;
        }
        let nodes: Api<Node> = Api::all(client.clone());
        // A thousand nodes are set up in a second or two with a few requests in flight.
        futures::stream::iter(layout.nodes.iter().map(|(name, ip)| {
            let nodes = nodes.clone();
            async move {
                let patch = json!({"status": {"addresses": [
                    {"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]}});
                nodes
                    .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .with_context(|| format!("setting the address of node {name}"))
                    .map(drop)
            }
        }))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
        for ns in &layout.namespaces {
            let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &obj)
                .await?;
        }

        let opts = match profile {
            Profile::Instant => EmulatorOptions {
                latency: LatencyProfile::None,
                active_delay: Duration::from_millis(50),
                ..EmulatorOptions::default()
            },
            Profile::RealServer => EmulatorOptions::real_server(),
        };
        let neutron_workers = opts.workers;
        let profile_latency = opts.latency.clone();
        let neutron = Emulator::start(EmulatorOptions {
            agent_hosts: AgentHosts::Only(layout.nodes.iter().map(|(n, _)| n.clone()).collect()),
            ..opts
        })
        .await?;
        // The fixture is made at no latency: only the controllers' requests meet the profile.
        neutron.set_latency(LatencyProfile::None);
        let os = NeutronClient::new(&ClientOptions::noauth(neutron.url()))?;
        let project = uuid::Uuid::new_v4().simple().to_string();
        let net = os
            .create_network(&kuryr_neutron::NetworkCreate {
                name: Some("bench-pods".into()),
                project_id: Some(project.clone()),
                ..Default::default()
            })
            .await?;
        let subnet = os
            .create_subnet(&kuryr_neutron::SubnetCreate {
                network_id: net.id.clone(),
                ip_version: 4,
                cidr: Some("10.100.0.0/16".into()),
                project_id: Some(project.clone()),
                ..Default::default()
            })
            .await?;
        let sg = os
            .create_security_group(&kuryr_neutron::SecurityGroupCreate {
                name: "bench-pods".into(),
                project_id: Some(project.clone()),
                ..Default::default()
            })
            .await?;
        // Neutron's default of 500 ports would cap the large runs, not the controllers.
        os.update_quota(
            &project,
            &QuotaUpdate {
                port: Some(-1),
                ..Default::default()
            },
        )
        .await?;
        neutron.set_latency(profile_latency);
        neutron.reset_stats();

        let health_port = free_port()?;
        let metrics_port = free_port()?;
        let conf = dir.join("kuryr.conf");
        let text = kuryr_conf(&ConfValues {
            kube_url: kube.url(),
            neutron_url: &neutron.url(),
            pool: pooled,
            project: &project,
            subnet: &subnet.id,
            sg: &sg.id,
            health_port,
            exporter_port: metrics_port,
        });
        std::fs::write(&conf, text).with_context(|| format!("writing {}", conf.display()))?;
        kube.requests().reset();
        Ok(Self {
            kube,
            neutron,
            conf,
            health_port,
            metrics_port,
            neutron_workers,
        })
    }

    pub async fn stop(self) {
        if let Err(e) = self.kube.shutdown().await {
            tracing::warn!(error = %e, "stopping the Kubernetes API emulator");
        }
        self.neutron.shutdown().await;
    }
}

pub struct ConfValues<'a> {
    pub kube_url: &'a str,
    pub neutron_url: &'a str,
    pub pool: bool,
    pub project: &'a str,
    pub subnet: &'a str,
    pub sg: &'a str,
    pub health_port: u16,
    pub exporter_port: u16,
}

/// The one kuryr.conf both implementations read: upstream's option names only, except
/// `[kubernetes] cluster_id` (kuryr-rs' ownership tag; upstream ignores it). Neutron is reached as
/// upstream configures a noauth server: keystoneauth's `none` plugin with its `endpoint`. An empty
/// `token_file` stops upstream from requiring the in-pod service account token.
pub fn kuryr_conf(v: &ConfValues<'_>) -> String {
    let pool = if v.pool { "neutron" } else { "noop" };
    format!(
        "[DEFAULT]\n\
         debug = False\n\
         [kubernetes]\n\
         api_root = {kube}\n\
         token_file =\n\
         enabled_handlers = vif,kuryrport\n\
         pod_vif_driver = neutron-vif\n\
         vif_pool_driver = {pool}\n\
         pod_subnets_driver = default\n\
         pod_security_groups_driver = default\n\
         pod_project_driver = default\n\
         port_debug = False\n\
         controller_ha = False\n\
         cluster_id = bench\n\
         [neutron]\n\
         auth_type = none\n\
         endpoint = {neutron}\n\
         [neutron_defaults]\n\
         project = {project}\n\
         pod_subnet = {subnet}\n\
         pod_security_groups = {sg}\n\
         ovs_bridge = br-int\n\
         [vif_pool]\n\
         ports_pool_batch = 10\n\
         ports_pool_min = 5\n\
         ports_pool_max = 0\n\
         ports_pool_update_frequency = 1\n\
         [health_server]\n\
         port = {health}\n\
         [prometheus_exporter]\n\
         controller_exporter_port = {exporter}\n",
        kube = v.kube_url.trim_end_matches('/'),
        neutron = v.neutron_url.trim_end_matches('/'),
        project = v.project,
        subnet = v.subnet,
        sg = v.sg,
        health = v.health_port,
        exporter = v.exporter_port,
    )
}

/// A port nothing listens on right now (the controllers' health and metrics servers take it).
fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_conf_loads_in_kuryr_rs_with_upstreams_neutron_options() {
        let text = kuryr_conf(&ConfValues {
            kube_url: "http://127.0.0.1:1/",
            neutron_url: "http://127.0.0.1:2",
            pool: true,
            project: "p",
            subnet: "s",
            sg: "g",
            health_port: 3,
            exporter_port: 4,
        });
        let loaded = kuryr_config::KuryrConfig::from_ini_str(&text).expect("kuryr-rs loads the bench conf");
        assert_eq!(
            loaded.config.neutron.neutron_endpoint(),
            Some("http://127.0.0.1:2")
        );
        assert_eq!(loaded.config.kubernetes.api_root, "http://127.0.0.1:1");
        assert!(text.contains("vif_pool_driver = neutron\n"));
    }
}
