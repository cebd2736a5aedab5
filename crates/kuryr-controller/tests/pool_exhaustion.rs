//! No refill storm under an exhausted port quota: with the quota full and 200 pods waiting on
//! two pools, Neutron sees a few refill attempts per pool per minute (each pool backs off, its
//! waiting pods share its refill), the pods still get their OverQuota Event, and once the quota
//! is raised every pod is wired within 30 s. Emulator only: the quota of a shared real server
//! must not be played with for minutes, and the emulator counts every request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use kuryr_neutron::{ClientOptions, NeutronClient, QuotaUpdate};
use neutron_emulator::{AgentHosts, Emulator, EmulatorOptions};
use serde_json::json;
use support::*;

const PODS: usize = 200;
const QUOTA: i64 = 10;
/// The pools' backoff ramps up in the first half minute; the window after it is what a long
/// exhaustion looks like.
const RAMP: Duration = Duration::from_secs(30);
const WINDOW: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_exhausted_quota_causes_no_refill_storm_and_pods_wire_once_raised() -> Result<()> {
    init_logs();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let emu = Emulator::start(EmulatorOptions {
        active_delay: Duration::from_millis(50),
        agent_hosts: AgentHosts::Only(NODES.iter().map(|s| s.to_string()).collect()),
        ..EmulatorOptions::default()
    })
    .await?;
    let target = NeutronTarget::server("emulator", &emu.url())?;
    let neutron = NeutronClient::new(&ClientOptions::noauth(emu.url()))?;
    let kube = start_kube().await?;
    let fx = neutron_fixture(&neutron, "10.74.0.0/22").await?;
    let quota = |port| QuotaUpdate {
        port: Some(port),
        ..QuotaUpdate::default()
    };
    neutron.update_quota(&fx.project, &quota(QUOTA)).await?;
    let bed = PoolBed::new(
        &kube,
        &fx,
        "ports_pool_min = 1\nports_pool_batch = 5\nports_pool_update_frequency = 2",
    )
    .await?;
    let ctrl = start_controller(&kube.client, &target, config(&bed.ini), "exhaustion");
    create_namespace(&kube.client, "exhaust", json!({})).await?;
    for i in 0..PODS {
        create_pod(&kube.client, "exhaust", &format!("p{i}"), NODES[i % 2], json!({})).await?;
    }
    tokio::time::sleep(RAMP).await;
    emu.reset_stats();
    tokio::time::sleep(WINDOW).await;
    let stats = emu.stats();
    let attempts = stats.count("port.create_bulk") + stats.count("port.create");
    let pools = kuryr_controller::pool::api::list_pools(&bed.socket).await?;
    ensure!(pools.len() == 2, "one pool per node: {pools:?}");
    let in_use: usize = pools.iter().map(|p| p.in_use).sum();
    eprintln!(
        "pool_exhaustion: {PODS} pods, quota {QUOTA}: {attempts} port creates in {WINDOW:?} for 2 pools \
         ({in_use} pods wired); {} requests in all",
        stats.total_requests
    );
    ensure!(
        attempts <= 2 * 4,
        "at most 4 refill attempts per pool per minute, saw {attempts} ({:?})",
        stats.operations
    );
    ensure!(
        in_use <= QUOTA as usize,
        "{in_use} ports in use within a quota of {QUOTA}"
    );
    let events = Api::<Event>::namespaced(kube.client.clone(), "exhaust")
        .list(&ListParams::default())
        .await?;
    ensure!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("OverQuota")),
        "the waiting pods are told why"
    );

    neutron
        .update_quota(&fx.project, &quota(i64::try_from(PODS)? * 2))
        .await?;
    let raised = Instant::now();
    wait_active_ports(&kube.client, "exhaust", PODS).await?;
    let took = raised.elapsed();
    eprintln!("pool_exhaustion: every pod wired {took:?} after the quota was raised");
    ensure!(
        took <= Duration::from_secs(30),
        "wired {took:?} after the quota was raised"
    );
    ctrl.shutdown().await?;
    Ok(())
}
