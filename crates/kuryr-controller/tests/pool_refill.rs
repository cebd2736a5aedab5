//! Refills on the emulator. An empty pool answers ResourceNotReady and refills at once: a request
//! never waits for a slow refill, only the pool's refill wait (`pool::driver::REFILL_WAIT`) at most
//! (needs a Neutron whose bulk create is slow, so only the in-repo emulator runs it). A pod that
//! waited for a refill comes before the spares its taking leaves wanted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use kuryr_config::{KuryrConfig, VifPoolDriver};
use kuryr_controller::context::Platform;
use kuryr_controller::drivers::pool::VifPool;
use kuryr_controller::drivers::vif::neutron::NeutronVif;
use kuryr_controller::drivers::{NetworkInfo, PodRef, PortSpec};
use kuryr_controller::error::Error;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pool;
use kuryr_neutron::{ClientOptions, NeutronClient};
use neutron_emulator::{AgentHosts, Emulator, EmulatorOptions, LatencyProfile};
use serde_json::json;
use support::*;

/// How long the emulator takes for a port create (single or bulk): far above `REFILL_WAIT`, so
/// that an answer before the refill lands does not depend on how fast the machine is.
const SLOW_CREATE: Duration = Duration::from_secs(20);

/// A pool manager on the emulator (`latency` set once the fixture exists), its port spec, the
/// emulator, its client and the fixture's project.
struct Bed {
    manager: Arc<pool::PoolManager>,
    spec: PortSpec,
    emu: neutron_emulator::EmulatorHandle,
    neutron: NeutronClient,
    project: String,
    _kube: Kube,
}

async fn bed(name: &str, latency: LatencyProfile, min: u32, batch: u32) -> Result<Bed> {
    let _ = rustls::crypto::ring::default_provider().install_default();
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
    config.kubernetes.cluster_id = name.into();
    config.kubernetes.controller_namespace = CONTROLLER_NS.into();
    config.kubernetes.vif_pool_driver = VifPoolDriver::Neutron;
    config.vif_pool.ports_pool_min = min;
    config.vif_pool.ports_pool_batch = batch.try_into()?;
    let config = Arc::new(config);
    let metrics = Metrics::new();
    let deployments = Deployments::noauth(&emu.url(), &metrics)?;
    let ctx = Arc::new(Platform::new(
        kube.client.clone(),
        config.clone(),
        deployments.clone(),
        metrics,
    ));
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
    Ok(Bed {
        manager,
        spec,
        emu,
        neutron,
        project: fx.project,
        _kube: kube,
    })
}

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        node: NODES[0].into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_empty_pool_answers_not_ready_at_once_and_refills() -> Result<()> {
    init_logs();
    println!("pool_refill: the real neutron-server cannot be made slow; emulator only");
    let ms = u64::try_from(SLOW_CREATE.as_millis())?;
    let latency: LatencyProfile = serde_json::from_value(json!({
        "profile": "custom",
        "table": {"default": {"base_ms": 0}, "ops": {
            "port.create": {"base_ms": ms}, "port.create_bulk": {"base_ms": ms}
        }}
    }))?;
    let b = bed("refill", latency, 1, 3).await?;
    let pod = pod("a");

    let asked = Instant::now();
    let first = b.manager.request_vif(&pod, &b.spec).await;
    let took = asked.elapsed();
    assert!(
        matches!(first, Err(Error::ResourceNotReady(_))),
        "an empty pool answers ResourceNotReady: {first:?}"
    );
    assert!(
        took < SLOW_CREATE,
        "answered after {took:?}, not after the whole refill"
    );
    let s = b.manager.summaries();
    assert!(
        s.len() == 1 && s[0].populating,
        "the refill started at once and is still running: {s:?}"
    );
    // The retry after the refill landed is a hit: no second bulk create.
    eventually("the refill landed", Duration::from_secs(120), || async {
        let s = b.manager.summaries();
        Ok((!s[0].populating && s[0].available == 3).then_some(()))
    })
    .await?;
    let created = b.emu.stats().ports_created;
    let (vif, _) = b.manager.request_vif(&pod, &b.spec).await?;
    assert!(!vif.id().is_empty());
    assert_eq!(b.emu.stats().ports_created, created, "served from the pool");
    assert_eq!(created, 3, "one refill");
    cleanup_project(&b.neutron, &b.project).await;
    Ok(())
}

/// A pod that waited for a refill comes before the pool's spares: the refill of spares its
/// taking calls for starts once its port's wait for ACTIVE ended, not while the server could
/// still be answering that check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_spares_a_waiting_pod_leaves_wanted_are_asked_for_once_its_port_is_active() -> Result<()> {
    init_logs();
    let b = bed("spares", LatencyProfile::None, 2, 2).await?;
    // The first pod finds the pool empty, waits for its refill (2 ports) and takes one.
    let (mut vif, origin) = b.manager.request_vif(&pod("a"), &b.spec).await?;
    let s = b.manager.summaries();
    assert_eq!(
        (s[0].available, s[0].populating),
        (1, false),
        "below min, but no spare refill while the pod's port is not ACTIVE: {s:?}"
    );
    assert_eq!(b.emu.stats().ports_created, 2);
    b.manager.activate_vif(&origin, &mut vif).await?;
    assert!(vif.active());
    // Well within the maintenance pass's period (20 s), which would plan it too.
    eventually("the spares refilled", Duration::from_secs(10), || async {
        let s = b.manager.summaries();
        Ok((!s[0].populating && s[0].available == 3).then_some(()))
    })
    .await?;
    assert_eq!(b.emu.stats().ports_created, 4, "one refill of the batch");
    // A pod served at once (it did not wait) holds nothing back: the refill to min starts as it
    // takes its port.
    b.manager.request_vif(&pod("b"), &b.spec).await?;
    b.manager.request_vif(&pod("c"), &b.spec).await?;
    let s = b.manager.summaries();
    assert_eq!((s[0].available, s[0].populating), (1, true), "{s:?}");
    cleanup_project(&b.neutron, &b.project).await;
    Ok(())
}
