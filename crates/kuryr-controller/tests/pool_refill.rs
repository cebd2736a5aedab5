//! An empty pool answers ResourceNotReady and refills at once: a request never waits for a slow
//! refill, only the pool's refill wait (`pool::driver::REFILL_WAIT`) at most. Needs a Neutron whose
//! bulk create is slow, so only the in-repo emulator (with a latency table) runs it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use kuryr_config::{KuryrConfig, VifPoolDriver};
use kuryr_controller::drivers::pool::VifPool;
use kuryr_controller::drivers::vif::neutron::NeutronVif;
use kuryr_controller::drivers::{NetworkInfo, PodRef, PortSpec};
use kuryr_controller::error::Error;
use kuryr_controller::pool;
use kuryr_neutron::{ClientOptions, NeutronClient};
use neutron_emulator::{AgentHosts, Emulator, EmulatorOptions, LatencyProfile};
use serde_json::json;
use support::*;

/// How long the emulator takes for a port create (single or bulk): far above `REFILL_WAIT`, so
/// that an answer before the refill lands does not depend on how fast the machine is.
const SLOW_CREATE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_empty_pool_answers_not_ready_at_once_and_refills() -> Result<()> {
    init_logs();
    println!("pool_refill: the real neutron-server cannot be made slow; emulator only");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ms = u64::try_from(SLOW_CREATE.as_millis())?;
    let latency: LatencyProfile = serde_json::from_value(json!({
        "profile": "custom",
        "table": {"default": {"base_ms": 0}, "ops": {
            "port.create": {"base_ms": ms}, "port.create_bulk": {"base_ms": ms}
        }}
    }))?;
    let emu = Emulator::start(EmulatorOptions {
        agent_hosts: AgentHosts::Only(NODES.iter().map(|s| s.to_string()).collect()),
        ..EmulatorOptions::default()
    })
    .await?;
    let neutron = NeutronClient::new(&ClientOptions::noauth(emu.url()))?;
    let kube = start_kube().await?;
    let fx = neutron_fixture(&neutron, "10.70.0.0/24").await?;
    emu.set_latency(latency);

    let mut config = KuryrConfig::default();
    config.kubernetes.cluster_id = "refill".into();
    config.kubernetes.controller_namespace = CONTROLLER_NS.into();
    config.kubernetes.vif_pool_driver = VifPoolDriver::Neutron;
    config.vif_pool.ports_pool_min = 1;
    config.vif_pool.ports_pool_batch = 3.try_into()?;
    let config = Arc::new(config);
    let (ctx, deployments) = claimed_platform(&kube.client, config.clone(), &emu.url()).await?;
    let vif = Arc::new(NeutronVif::new(
        deployments,
        ctx.resource_tags(),
        "br-int".into(),
        0,
    ));
    let manager = pool::build(ctx, vif, &config.vif_pool)?;
    manager.recover().await?;
    let info = Arc::new(NetworkInfo {
        id: fx.network.clone(),
        name: String::new(),
        mtu: None,
        subnets: vec![neutron.get_subnet(&fx.subnet).await?],
    });
    let spec = PortSpec::new("default", fx.project.clone(), info, vec![fx.sg.clone()]);
    let pod = PodRef {
        namespace: "default".into(),
        name: "a".into(),
        uid: "uid-a".into(),
        node: NODES[0].into(),
    };

    let asked = Instant::now();
    let first = manager.request_vif(&pod, &spec).await;
    let took = asked.elapsed();
    assert!(
        matches!(first, Err(Error::ResourceNotReady(_))),
        "an empty pool answers ResourceNotReady: {first:?}"
    );
    assert!(
        took < SLOW_CREATE,
        "answered after {took:?}, not after the whole refill"
    );
    let s = manager.summaries();
    assert!(
        s.len() == 1 && s[0].populating,
        "the refill started at once and is still running: {s:?}"
    );
    // The retry after the refill landed is a hit: no second bulk create.
    eventually("the refill landed", Duration::from_secs(120), || async {
        let s = manager.summaries();
        Ok((!s[0].populating && s[0].available == 3).then_some(()))
    })
    .await?;
    let created = emu.stats().ports_created;
    let (vif, _) = manager.request_vif(&pod, &spec).await?;
    assert!(!vif.id().is_empty());
    assert_eq!(emu.stats().ports_created, created, "served from the pool");
    assert_eq!(created, 3, "one refill");
    cleanup_project(&neutron, &fx.project).await;
    Ok(())
}
