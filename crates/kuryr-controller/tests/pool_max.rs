//! `ports_pool_max` holds through recovery: ports released by pods just before a crash (their
//! KuryrPorts gone, the pool object not yet listing them) and spares beyond a lowered max are
//! brought back within max right after recovery, never adopted as spares for good. Driven through
//! `PoolManager::run` terms against the Kubernetes API emulator and a Neutron - the in-repo
//! emulator, and the real neutron-server when KURYR_TEST_NEUTRON_URL is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use kube::Api;
use kube::api::DeleteParams;
use kuryr_config::{KuryrConfig, VifPoolDriver};
use kuryr_controller::context::Platform;
use kuryr_controller::drivers::vif::neutron::NeutronVif;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pool::{self, PoolManager};
use kuryr_crds::KuryrPort;
use support::*;

const WAIT: Duration = Duration::from_secs(120);
const PODS: usize = 8;

/// Once the pool holds at most `max` spares, none recyclable and no refill running, and Neutron
/// holds exactly its ports: how long that took.
async fn within_max(
    m: &PoolManager,
    neutron: &kuryr_neutron::NeutronClient,
    project: &str,
    max: usize,
    limit: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    eventually(&format!("the pool within max {max}"), limit, || async {
        let s = m.summaries();
        let ok = s.len() == 1
            && !s[0].populating
            && s[0].recyclable == 0
            && s[0].available <= max
            && kuryr_ports(neutron, project).await?.len() == s[0].available + s[0].in_use;
        Ok(ok.then_some(()))
    })
    .await?;
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recovery_keeps_pools_within_max() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.73.0.0/24").await?;
        PoolBed::new(&kube, &fx, "").await?;
        let cluster_id = format!("max-{}", uuid::Uuid::new_v4().simple());
        let replica = |max: u32| -> Result<Arc<PoolManager>> {
            let mut config = KuryrConfig::default();
            config.kubernetes.cluster_id = cluster_id.clone();
            config.kubernetes.controller_namespace = CONTROLLER_NS.into();
            config.kubernetes.vif_pool_driver = VifPoolDriver::Neutron;
            config.vif_pool.ports_pool_min = 1;
            config.vif_pool.ports_pool_max = max;
            config.vif_pool.ports_pool_batch = 2.try_into()?;
            config.vif_pool.ports_pool_update_frequency = 1;
            let config = Arc::new(config);
            let metrics = Metrics::new();
            let deployments = Deployments::noauth(&target.url, &metrics)?;
            let ctx = Arc::new(Platform::new(
                kube.client.clone(),
                config.clone(),
                deployments.clone(),
                metrics,
            ));
            // A replica of a cluster holding its id (the claim itself: tests/cluster_claim.rs).
            deployments.set_claimed("default", true);
            let vif = Arc::new(NeutronVif::new(
                deployments,
                ctx.resource_tags(),
                "br-int".into(),
                0,
            ));
            Ok(pool::build(ctx, vif, &config.vif_pool)?)
        };
        let spec = fixture_port_spec(neutron, &fx).await?;

        // Term 1: 8 pods wired from a pool with max 3.
        let a = replica(3)?;
        let term = start_pool_term(&a).await?;
        for i in 0..PODS {
            let p = pool_pod(&format!("p{i}"));
            let (v, o) = pooled_vif(a.as_ref(), &p, &spec).await?;
            record_kuryrport(&kube.client, &p, &v, &o).await?;
        }
        within_max(&a, neutron, &fx.project, 3, WAIT).await?;
        assert_eq!(a.summaries()[0].in_use, PODS);
        end_pool_term(term).await?;
        // The pods were deleted and their ports released, and the controller died before the
        // pool object listed them: their KuryrPorts are gone, the ports are tagged and listed
        // nowhere.
        let kps = Api::<KuryrPort>::namespaced(kube.client.clone(), "default");
        for i in 0..PODS {
            kps.delete(&format!("p{i}"), &DeleteParams::default()).await?;
        }

        // Term 2: the released ports are recovered, and the pool is back within max.
        let term = start_pool_term(&a).await?;
        let took = within_max(&a, neutron, &fx.project, 3, WAIT).await?;
        let s = a.summaries();
        assert_eq!(s[0].in_use, 0, "{s:?}");
        end_pool_term(term).await?;

        // A lower max: the spares beyond it go right after recovery.
        let b = replica(1)?;
        let term = start_pool_term(&b).await?;
        let took_lower = within_max(&b, neutron, &fx.project, 1, WAIT).await?;
        end_pool_term(term).await?;
        eprintln!(
            "pool_max[{}]: {PODS} released ports recovered; within max 3 after {took:?}, within max 1 after {took_lower:?}",
            target.name
        );
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}
