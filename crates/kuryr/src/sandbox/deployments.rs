//! `kuryr sandbox --deployments N`: N OpenStack deployments, each an embedded Neutron emulator
//! with its own availability zone (`az1` is `default`, the `[neutron]` one), demo network and
//! project (mapped from the cluster's project with `project_ids`, as separate Keystones need).
//! Placement is on; demo namespace `i` asks for zone `az<(i mod N) + 1>`, so every deployment
//! gets namespaces, and the summary shows where namespaces, ports and load balancers landed. With
//! `--services` each deployment has its own service subnet and Octavia emulator.

use std::collections::BTreeMap;

use anyhow::Context as _;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use kuryr_crds::{KuryrLoadBalancer, KuryrProjectBinding};
use kuryr_neutron::{ClientOptions, ListFilter, NeutronClient};
use neutron_emulator::{AgentHosts, Emulator, EmulatorHandle, EmulatorOptions, LatencyProfile};

use super::services::SandboxOctavia;
use super::{DemoNetwork, NODES};
use crate::cli::{LatencyArg, SandboxArgs};

/// A deployment besides `default`.
pub(crate) struct Extra {
    pub(crate) name: String,
    pub(crate) zone: String,
    pub(crate) url: String,
    pub(crate) client: NeutronClient,
    pub(crate) demo: DemoNetwork,
    pub(crate) emulator: EmulatorHandle,
    /// With `--services`: this deployment's own service subnet and Octavia emulator (an id or an
    /// endpoint of one cloud means nothing in another).
    pub(crate) services: Option<(String, SandboxOctavia)>,
}

/// Zone of deployment `i` (0 = `default`).
pub(crate) fn zone(i: usize) -> String {
    format!("az{}", i + 1)
}

/// Zone demo namespace `ns_index` asks for with `n` deployments.
pub(crate) fn namespace_zone(ns_index: usize, n: usize) -> String {
    zone(ns_index % n.max(1))
}

/// Refuses combinations that cannot work, naming the option.
pub(crate) fn check_args(args: &SandboxArgs) -> anyhow::Result<()> {
    if args.deployments > 1 && args.neutron_url.is_some() {
        anyhow::bail!(
            "--deployments {} starts its own Neutron emulators; it cannot be combined with --neutron-url",
            args.deployments
        );
    }
    Ok(())
}

/// Starts deployments 2..=N, each with its demo network, quota fitted to `ports`.
pub(crate) async fn start(args: &SandboxArgs, ports: i64) -> anyhow::Result<Vec<Extra>> {
    let mut out = Vec::new();
    for i in 1..usize::from(args.deployments) {
        let opts = match args.latency {
            LatencyArg::RealServer => EmulatorOptions::real_server(),
            LatencyArg::None => EmulatorOptions {
                latency: LatencyProfile::None,
                active_delay: std::time::Duration::from_millis(50),
                ..EmulatorOptions::default()
            },
        };
        let emulator = Emulator::start(EmulatorOptions {
            agent_hosts: AgentHosts::Only(NODES.iter().map(|n| n.to_string()).collect()),
            ..opts
        })
        .await
        .with_context(|| format!("starting the Neutron emulator of deployment {}", i + 1))?;
        let url = emulator.url();
        let client = NeutronClient::new(&ClientOptions::noauth(&url)).context("Neutron client")?;
        let demo = DemoNetwork::create(&client, &args.cidr).await?;
        demo.fit_port_quota(&client, ports).await?;
        let services = if args.services > 0 {
            let (_, subnet) = super::services::create_service_subnet(&client, &demo.project).await?;
            let octavia = super::services::start_octavia(None).await?;
            Some((subnet, octavia))
        } else {
            None
        };
        let extra = Extra {
            name: format!("deployment-{}", i + 1),
            zone: zone(i),
            url,
            client,
            demo,
            emulator,
            services,
        };
        println!(
            "Neutron of deployment {} (zone {}): embedded emulator at {}; project {} (cluster project mapped to it)",
            extra.name, extra.zone, extra.url, extra.demo.project
        );
        if let Some((subnet, octavia)) = &extra.services {
            println!(
                "  service subnet {subnet} ({}); Octavia: {}",
                super::services::SERVICE_CIDR,
                octavia.label
            );
        }
        out.push(extra);
    }
    Ok(out)
}

/// kuryr.conf lines for `[neutron]` (the default deployment's zone) and the sections of the
/// other deployments plus `[pod_binding]`.
pub(crate) fn config_lines(extras: &[Extra], cluster_project: &str) -> (String, String) {
    let mut sections = String::from(
        "[pod_binding]\nenabled = True\nfilters = all,availability_zone\nweighers = creation_order\n",
    );
    for e in extras {
        sections.push_str(&format!(
            "[deployment:{}]\nauth_type = noauth\nendpoint_override = {}\navailability_zone = {}\n\
             project_ids = {cluster_project}:{}\npod_subnet = {}\npod_security_groups = {}\n",
            e.name, e.url, e.zone, e.demo.project, e.demo.subnet, e.demo.security_group
        ));
        if let Some((subnet, octavia)) = &e.services {
            sections.push_str(&format!(
                "load_balancer_endpoint_override = {}\nservice_subnet = {subnet}\n",
                octavia.url
            ));
        }
    }
    (format!("availability_zone = {}\n", zone(0)), sections)
}

/// One row per deployment: its zone, the demo namespaces bound there and the pods' ports in its
/// Neutron.
pub(crate) async fn report(
    client: &kube::Client,
    namespaces: &[String],
    default: (&NeutronClient, &str),
    extras: &[Extra],
) -> String {
    let n = extras.len() + 1;
    // zone -> deployment, from the bindings the controller recorded.
    let bound: BTreeMap<String, String> = Api::<KuryrProjectBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|b| Some((b.spec.availability_zone?, b.status?.deployment?)))
                .collect()
        })
        .unwrap_or_default();
    // deployment -> load balancers, from the deployment each KuryrLoadBalancer records.
    let mut lbs: BTreeMap<String, usize> = BTreeMap::new();
    if let Ok(l) = Api::<KuryrLoadBalancer>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        for klb in &l.items {
            *lbs.entry(
                klb.annotations()
                    .get(kuryr_crds::names::annotations::DEPLOYMENT)
                    .cloned()
                    .unwrap_or_else(|| "default".to_string()),
            )
            .or_default() += 1;
        }
    }
    let mut rows = vec![("default".to_string(), zone(0), default.0, default.1)];
    rows.extend(
        extras
            .iter()
            .map(|e| (e.name.clone(), e.zone.clone(), &e.client, e.demo.project.as_str())),
    );
    let mut out = String::from("deployments (kubectl get kosd, kubectl get kpb):\n");
    for (name, zone, neutron, project) in rows {
        let ns = namespaces
            .iter()
            .enumerate()
            .filter(|(i, _)| bound.get(&namespace_zone(*i, n)) == Some(&name))
            .count();
        let ports = match neutron.list_ports(&ListFilter::new().project_id(project)).await {
            Ok(p) => p
                .iter()
                .filter(|p| p.device_owner.starts_with("compute:"))
                .count()
                .to_string(),
            Err(e) => format!("? ({e})"),
        };
        let lb = lbs.get(&name).copied().unwrap_or(0);
        out.push_str(&format!(
            "  {name:<14} zone {zone:<5} namespaces {ns:<3} ports {ports:<4} load_balancers {lb}\n"
        ));
    }
    out
}
