//! The `kuryr controller` process SIGKILLed while its pods are being deleted en masse, then
//! started again: the `neutron` pool is back within `ports_pool_max` one update period after the
//! last pod is gone, and Neutron holds exactly the pool's spares. A real child process against the
//! Kubernetes and Neutron emulators; the kill lands as the first KuryrPorts are gone, while released
//! ports are being handed back and not yet recorded in the KuryrPortPool.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kuryr_crds::{KuryrPort, KuryrPortPool};
use kuryr_neutron::ListFilter;
use kuryr_testbed::*;
use serde_json::json;
use support::controller;

const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "mass";
const CONTROLLER_NS: &str = "kuryr";
const PODS: usize = 40;
const MAX: usize = 5;
const UPDATE_PERIOD: Duration = Duration::from_secs(2);

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `/ready` on the health port answers 200.
async fn ready(port: u16) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    if s.write_all(b"GET /ready HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    let head = String::from_utf8_lossy(&buf);
    head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_during_mass_deletion_is_back_within_max_one_update_period_after() -> Result<()> {
    init_logs();
    let kube = start_kube().await?;
    let neutron = neutron_targets().await?.remove(0);
    let fx = neutron_fixture(&neutron.client, "10.77.0.0/24").await?;
    for ns in [NS, CONTROLLER_NS] {
        create_namespace(&kube.client, ns, json!({})).await?;
    }
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    kube.handle.write_kubeconfig(&kubeconfig)?;
    let conf = dir.path().join("kuryr.conf");
    let health = free_port()?;
    let cluster = format!("massdel-{}", uuid::Uuid::new_v4().simple());
    std::fs::write(
        &conf,
        format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\n\
             vif_pool_driver = neutron\ncluster_id = {cluster}\ncontroller_namespace = {CONTROLLER_NS}\n\
             [neutron]\nendpoint_override = {url}\n\
             [neutron_defaults]\nproject = {project}\npod_subnet = {subnet}\npod_security_groups = {sg}\n\
             [vif_pool]\nports_pool_max = {MAX}\nports_pool_min = 1\nports_pool_batch = 5\n\
             ports_pool_update_frequency = {period}\n\
             [health_server]\nport = {health}\n[prometheus_exporter]\ncontroller_exporter_port = 0\n",
            url = neutron.url,
            project = fx.project,
            subnet = fx.subnet,
            sg = fx.sg,
            period = UPDATE_PERIOD.as_secs(),
        ),
    )?;
    let log = dir.path().join("controller.log");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut first = controller(&conf, &kubeconfig, &log)?;

    for i in 0..PODS {
        create_pod(&kube.client, NS, &format!("p{i}"), NODES[0], json!({})).await?;
    }
    let kps = Api::<KuryrPort>::namespaced(kube.client.clone(), NS);
    eventually("every pod wired", WAIT, || async {
        let active = kps
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|kp| kp.status.as_ref().is_some_and(|s| s.all_active()))
            .count();
        Ok((active == PODS).then_some(()))
    })
    .await
    .with_context(log_text)?;

    let pods = Api::<Pod>::namespaced(kube.client.clone(), NS);
    for i in 0..PODS {
        pods.delete(&format!("p{i}"), &DeleteParams::default()).await?;
    }
    // Killed as soon as the first pods' ports are handed back, with the rest still to go.
    eventually("the first KuryrPorts released", WAIT, || async {
        Ok((kps.list(&ListParams::default()).await?.items.len() < PODS).then_some(()))
    })
    .await?;
    first.start_kill()?; // SIGKILL
    first.wait().await?;
    let left = kps.list(&ListParams::default()).await?.items.len();
    eprintln!("mass deletion: killed with {left} of {PODS} KuryrPorts left");

    let started = Instant::now();
    let mut second = controller(&conf, &kubeconfig, &log)?;
    eventually("the new controller ready", WAIT, || async {
        Ok(ready(health).await.then_some(()))
    })
    .await
    .with_context(log_text)?;
    let ready_after = started.elapsed();
    eventually("every pod and KuryrPort gone", WAIT, || async {
        let gone = pods.list(&ListParams::default()).await?.items.is_empty()
            && kps.list(&ListParams::default()).await?.items.is_empty();
        Ok(gone.then_some(()))
    })
    .await
    .with_context(log_text)?;
    let gone_after = started.elapsed();

    // Neutron's ports of the pool (tagged, of this project) and the pool's own record.
    let pools = Api::<KuryrPortPool>::namespaced(kube.client.clone(), CONTROLLER_NS);
    let books = || async {
        let ports = neutron
            .client
            .list_ports(
                &ListFilter::new()
                    .project_id(&fx.project)
                    .device_owner("compute:kuryr"),
            )
            .await?
            .len();
        let recorded: usize = pools
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|p| p.status.as_ref())
            .map(|s| s.available.len() + s.recyclable.len())
            .sum();
        anyhow::Ok((ports, recorded))
    };
    let within = eventually("the pool within max", WAIT, || async {
        let (ports, recorded) = books().await?;
        Ok((ports <= MAX && ports == recorded).then_some((ports, recorded)))
    })
    .await
    .with_context(log_text)?;
    let within_after = started.elapsed();
    eprintln!(
        "mass deletion: ready {ready_after:?}, pods gone {gone_after:?}, within max {within_after:?} ({} ports, {} recorded)",
        within.0, within.1
    );
    let late = within_after.saturating_sub(ready_after.max(gone_after));
    ensure!(
        late <= UPDATE_PERIOD + Duration::from_secs(1),
        "back within max {late:?} after the later of ready and the last pod gone (update period {UPDATE_PERIOD:?})"
    );
    // And it stays so.
    tokio::time::sleep(UPDATE_PERIOD * 2).await;
    let (ports, recorded) = books().await?;
    ensure!(
        ports <= MAX && ports == recorded,
        "{ports} ports, {recorded} recorded"
    );

    second.start_kill()?;
    second.wait().await?;
    let text = log_text();
    assert!(!text.lines().any(|l| l.contains(" ERROR ")), "{text}");
    cleanup_project(&neutron.client, &fx.project).await;
    Ok(())
}
