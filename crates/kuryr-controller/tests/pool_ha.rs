//! Pools across leadership terms (controller HA): a replica that loses leadership and wins it
//! back must not serve from the pools of its earlier term, since the other leader may have handed
//! their ports out meanwhile. Driven through `PoolManager::run` terms (what `service::run`
//! starts and cancels with leadership) against the Kubernetes API emulator and a Neutron - the
//! in-repo emulator, and the real neutron-server when KURYR_TEST_NEUTRON_URL is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use kube::Api;
use kube::api::ListParams;
use kuryr_config::{KuryrConfig, VifPoolDriver};
use kuryr_controller::context::Platform;
use kuryr_controller::drivers::PortSpec;
use kuryr_controller::drivers::pool::{VifPool, holder};
use kuryr_controller::drivers::vif::neutron::NeutronVif;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pool::{self, PoolManager};
use kuryr_crds::KuryrPortPool;
use neutron_emulator::{LatencyProfile, LatencyTable, OpLatency};
use support::*;

const WAIT: Duration = Duration::from_secs(120);

/// Waits until no refill runs and the pool holds at least `min` spare ports (its state then no
/// longer changes by itself).
async fn settled(m: &PoolManager, min: usize) -> Result<()> {
    eventually("the pool settled", WAIT, || async {
        let s = m.summaries();
        Ok((s.len() == 1 && !s[0].populating && s[0].available >= min).then_some(()))
    })
    .await
}

/// One cluster's pools against one Neutron target: replicas of the pool manager share the
/// Kubernetes API and the configuration, as the controller's replicas do.
struct Bed {
    kube: Kube,
    fx: NeutronFixture,
    config: Arc<KuryrConfig>,
    ctx: Arc<Platform>,
    deployments: Deployments,
    spec: PortSpec,
}

impl Bed {
    async fn new(target: &NeutronTarget, cidr: &str) -> Result<Self> {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, cidr).await?;
        // Creates the controller namespace (the KuryrPortPool objects live there).
        PoolBed::new(&kube, &fx, "").await?;
        let mut config = KuryrConfig::default();
        config.kubernetes.cluster_id = format!("ha-{}", uuid::Uuid::new_v4().simple());
        config.kubernetes.controller_namespace = CONTROLLER_NS.into();
        config.kubernetes.vif_pool_driver = VifPoolDriver::Neutron;
        config.vif_pool.ports_pool_min = 2;
        config.vif_pool.ports_pool_batch = 3.try_into()?;
        config.vif_pool.ports_pool_update_frequency = 1;
        let config = Arc::new(config);
        let (ctx, deployments) = claimed_platform(&kube.client, config.clone(), &target.url).await?;
        let spec = fixture_port_spec(neutron, &fx).await?;
        Ok(Self {
            kube,
            fx,
            config,
            ctx,
            deployments,
            spec,
        })
    }

    /// One controller replica's pool manager.
    fn replica(&self) -> Result<Arc<PoolManager>> {
        let vif = Arc::new(NeutronVif::new(
            self.deployments.clone(),
            self.ctx.resource_tags(),
            "br-int".into(),
            0,
        ));
        Ok(pool::build(self.ctx.clone(), vif, &self.config.vif_pool)?)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn regained_leadership_recovers_instead_of_serving_stale_pools() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let bed = Bed::new(&target, "10.64.0.0/24").await?;
        let (kube, neutron, fx, spec) = (&bed.kube, &target.client, &bed.fx, &bed.spec);
        let replica = || bed.replica();
        // Term 1 of replica A: a cold pool, one pod served.
        let a = replica()?;
        let term = start_pool_term(&a).await?;
        let (va, oa) = pooled_vif(a.as_ref(), &pool_pod("a"), spec).await?;
        record_kuryrport(&kube.client, &pool_pod("a"), &va, &oa).await?;
        settled(&a, 2).await?;
        end_pool_term(term).await?;
        assert!(
            !a.is_ready(),
            "{}: a replica that lost leadership does not serve",
            target.name
        );

        // Replica B leads meanwhile and hands one of A's spare ports to another pod.
        let b = replica()?;
        let term = start_pool_term(&b).await?;
        assert_eq!(b.summaries()[0].in_use, 1, "{}", target.name);
        let (vb, ob) = pooled_vif(b.as_ref(), &pool_pod("b"), spec).await?;
        record_kuryrport(&kube.client, &pool_pod("b"), &vb, &ob).await?;
        assert_ne!(vb.id(), va.id());
        settled(&b, 2).await?;
        end_pool_term(term).await?;

        // A leads again: its pools come from recovery, with B's pod port in use.
        let term = start_pool_term(&a).await?;
        let s = a.summaries();
        assert_eq!(s.len(), 1, "{}: {s:?}", target.name);
        assert_eq!(
            s[0].in_use, 2,
            "{}: both pods' ports are in use: {s:?}",
            target.name
        );
        let spare = s[0].available;
        assert!(spare >= 2, "{}: {s:?}", target.name);
        for i in 0..spare {
            let p = pool_pod(&format!("c{i}"));
            let (v, _) = pooled_vif(a.as_ref(), &p, spec).await?;
            assert_ne!(v.id(), vb.id(), "{}: B's pod port handed out again", target.name);
            assert_ne!(v.id(), va.id(), "{}: A's pod port handed out again", target.name);
        }
        end_pool_term(term).await?;
        let objs = Api::<KuryrPortPool>::namespaced(kube.client.clone(), CONTROLLER_NS)
            .list(&ListParams::default())
            .await?;
        assert_eq!(
            objs.items.len(),
            1,
            "{}: one pool object across the terms",
            target.name
        );
        cleanup_project(neutron, &fx.project).await;
        eprintln!("pool_ha[{}]: the regained term recovered its pools", target.name);
    }
    Ok(())
}

/// Leadership lost while the term's pool tasks are inside Neutron calls that do not come back (a
/// maintenance pass through an outage): the replica stops serving at once, not when the calls
/// end, since the other replica may win the lease and hand these ports out meanwhile (the chaos
/// soak caught a replica serving its old pools again after it won the lease back 14 s later).
/// Emulator only: it alone can make calls hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_term_stuck_in_neutron_stops_serving_the_moment_it_ends() -> Result<()> {
    init_logs();
    let targets = neutron_targets().await?;
    let target = &targets[0];
    let emu = target.emulator().context("the first target is the emulator")?;
    let bed = Bed::new(target, "10.64.1.0/24").await?;
    let a = bed.replica()?;
    let term = start_pool_term(&a).await?;
    let pod = pool_pod("a");
    let (va, oa) = pooled_vif(a.as_ref(), &pod, &bed.spec).await?;
    settled(&a, 2).await?;

    // Every Neutron call from here on takes ten minutes; the released port's recycle (a port
    // update, the next maintenance pass) is one of them.
    emu.set_latency(LatencyProfile::Custom(LatencyTable {
        default: OpLatency::fixed(600_000),
        ops: Default::default(),
    }));
    let before = emu.stats().total_requests;
    a.release_vif(&va, &oa, &holder(&pod.namespace, &pod.name, &pod.uid))
        .await?;
    eventually("a pool task waiting on Neutron", WAIT, || async {
        Ok((emu.stats().total_requests > before).then_some(()))
    })
    .await?;

    let (stop, task) = term;
    stop.cancel();
    eventually("the replica stops serving", Duration::from_secs(2), || async {
        Ok((!a.is_ready()).then_some(()))
    })
    .await?;
    let refused = a.request_vif(&pool_pod("b"), &bed.spec).await;
    assert!(
        matches!(&refused, Err(e) if e.is_retryable()),
        "a request after the term ended is not served: {refused:?}"
    );
    tokio::time::timeout(pool::TERM_GRACE + Duration::from_secs(5), task)
        .await
        .context("the term ends within its grace, though its calls still hang")??;

    // Neutron answers again: the next term recovers (the released port is a spare again).
    emu.set_latency(LatencyProfile::Custom(LatencyTable::default()));
    let term = start_pool_term(&a).await?;
    let s = a.summaries();
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0].in_use, 0, "the released port is nobody's: {s:?}");
    end_pool_term(term).await?;
    cleanup_project(&target.client, &bed.fx.project).await;
    Ok(())
}
