//! The sandbox's Services: an Octavia (the embedded emulator behaving like Octavia with the amphora noop
//! drivers, or a real one with `--octavia-url`), a service subnet in Neutron holding the emulated API server's
//! cluster IPs, and `--services N` demo Services selecting the demo pods, whose load balancers the controller
//! builds. What is measured: each Service's time from creation to an ACTIVE load balancer holding every ready
//! pod of its namespace as a member.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kuryr_crds::KuryrLoadBalancer;
use kuryr_neutron::NeutronClient;
use octavia_emulator::{OctaviaEmulator, OctaviaHandle, OctaviaOptions};
use serde_json::json;
use tokio::time::Instant;

/// The kube emulator's service cluster IP range (`10.96.0.0/16`, handed out from 10.96.0.10).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

/// Octavia for the sandbox: the URL the controller uses and, when embedded, the emulator.
pub struct SandboxOctavia {
    pub url: String,
    pub label: String,
    pub emulator: Option<OctaviaHandle>,
}

pub async fn start_octavia(url: Option<&str>) -> anyhow::Result<SandboxOctavia> {
    if let Some(url) = url {
        return Ok(SandboxOctavia {
            url: url.to_string(),
            label: format!("Octavia at {url}"),
            emulator: None,
        });
    }
    let emu = OctaviaEmulator::start(OctaviaOptions::amphora_noop())
        .await
        .context("starting the Octavia emulator")?;
    Ok(SandboxOctavia {
        url: emu.url(),
        label: format!(
            "embedded Octavia emulator at {} (amphora noop latency profile)",
            emu.url()
        ),
        emulator: Some(emu),
    })
}

/// The service network and subnet of the demo project.
pub async fn create_service_subnet(
    neutron: &NeutronClient,
    project: &str,
) -> anyhow::Result<(String, String)> {
    let network = neutron
        .create_network(&kuryr_neutron::NetworkCreate {
            name: Some("kuryr-sandbox-services".into()),
            project_id: Some(project.to_string()),
            ..Default::default()
        })
        .await
        .context("creating the service network")?;
    let subnet = neutron
        .create_subnet(&kuryr_neutron::SubnetCreate {
            network_id: network.id.clone(),
            ip_version: 4,
            cidr: Some(SERVICE_CIDR.to_string()),
            name: Some("kuryr-sandbox-services".into()),
            project_id: Some(project.to_string()),
            ..Default::default()
        })
        .await
        .context("creating the service subnet")?;
    Ok((network.id, subnet.id))
}

/// Creates `n` Services spread over `namespaces`, each selecting the demo pods of its namespace.
pub async fn create_services(
    client: &kube::Client,
    namespaces: &[String],
    n: usize,
) -> anyhow::Result<Vec<(String, String, Instant)>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let ns = &namespaces[i % namespaces.len()];
        let name = format!("demo-svc-{i}");
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"app": "kuryr-sandbox-demo"},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
        }))?;
        let at = Instant::now();
        Api::<Service>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &svc)
            .await
            .with_context(|| format!("creating Service {ns}/{name}"))?;
        out.push((ns.clone(), name, at));
    }
    Ok(out)
}

/// One Service's outcome.
pub struct ServiceResult {
    pub name: String,
    pub vip: String,
    pub members: usize,
    pub ready_after: Option<Duration>,
}

/// Waits until each Service's load balancer holds `members_per_ns[ns]` members, or the deadline.
pub async fn wait_services(
    client: &kube::Client,
    services: &[(String, String, Instant)],
    members_per_ns: &BTreeMap<String, usize>,
    deadline: Instant,
) -> Vec<ServiceResult> {
    let mut results: BTreeMap<String, ServiceResult> = BTreeMap::new();
    loop {
        for (ns, name, created) in services {
            let key = format!("{ns}/{name}");
            if results.get(&key).is_some_and(|r| r.ready_after.is_some()) {
                continue;
            }
            let klb = Api::<KuryrLoadBalancer>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .ok()
                .flatten();
            let status = klb.as_ref().and_then(|k| k.status.as_ref());
            let members = status.map_or(0, |s| s.members.len());
            let want = members_per_ns.get(ns).copied().unwrap_or(0);
            let active = status.is_some_and(|s| s.loadbalancer.is_some()) && members == want;
            results.insert(
                key.clone(),
                ServiceResult {
                    name: key,
                    vip: klb.and_then(|k| k.spec.ip).unwrap_or_default(),
                    members,
                    ready_after: active.then(|| created.elapsed()),
                },
            );
        }
        if results.values().all(|r| r.ready_after.is_some()) || Instant::now() > deadline {
            return results.into_values().collect();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes the demo Services and waits for their load balancers to be released (a real Octavia outlives the
/// sandbox).
pub async fn release_services(client: &kube::Client, namespaces: &[String]) {
    println!("releasing the demo Services' load balancers ...");
    for ns in namespaces {
        let api = Api::<Service>::namespaced(client.clone(), ns);
        if let Err(e) = api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
        {
            eprintln!("  deleting Services in {ns}: {e}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let mut left = 0;
        for ns in namespaces {
            left += Api::<Service>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .map_or(0, |l| l.items.len());
        }
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("  some Services still hold their load balancers; see `kubectl get klb -A`");
}
