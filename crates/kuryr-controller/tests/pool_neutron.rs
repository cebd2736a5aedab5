#![allow(clippy::unwrap_used)]
//! Port pools against the real neutron-server (`KURYR_TEST_NEUTRON_URL`), driving the `neutron`
//! pool driver directly (no Kubernetes). Each test has its own project, network and cluster tag,
//! and deletes what it made even when it fails.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kuryr_controller::drivers::pool::{VifOrigin, VifPool, holder};
use kuryr_controller::drivers::vif::neutron::NeutronVif;
use kuryr_controller::drivers::{NetworkInfo, PodRef, PortSpec};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pool::driver::{PoolDriver, PoolKind, PoolOptions};
use kuryr_controller::pool::recover::{InUsePort, RecoveryInput};
use kuryr_controller::pool::state::{Key, Limits};
use kuryr_crds::Vif;
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::{
    ClientOptions, ListFilter, NetworkCreate, NeutronClient, Port, SecurityGroupCreate, SubnetCreate,
};

use support::{eventually, pooled_vif, real_neutron_url};
use tokio_util::sync::CancellationToken;

const NODE: &str = "k8s-node-1";

#[derive(Clone)]
struct Lab {
    client: NeutronClient,
    project: String,
    cluster: String,
    spec: PortSpec,
}

impl Lab {
    async fn new(url: &str, test: &str) -> Lab {
        let mut opts = ClientOptions::noauth(url);
        opts.timeout = Some(Duration::from_secs(120));
        let client = NeutronClient::new(&opts).unwrap();
        let id: u64 = rand::random();
        let project = format!("pooltest{id:016x}");
        let net = client
            .create_network(&NetworkCreate {
                name: Some(format!("{test}-net")),
                project_id: Some(project.clone()),
                ..NetworkCreate::default()
            })
            .await
            .unwrap();
        let subnet = client
            .create_subnet(&SubnetCreate {
                network_id: net.id.clone(),
                ip_version: 4,
                cidr: Some("10.77.0.0/24".into()),
                project_id: Some(project.clone()),
                enable_dhcp: Some(false),
                ..SubnetCreate::default()
            })
            .await
            .unwrap();
        let sg = client
            .create_security_group(&SecurityGroupCreate {
                name: format!("{test}-sg"),
                project_id: Some(project.clone()),
                description: None,
                stateful: None,
                tags: vec![],
            })
            .await
            .unwrap();
        let info = Arc::new(NetworkInfo {
            id: net.id.clone(),
            name: net.name.clone(),
            mtu: net.mtu,
            subnets: vec![subnet],
        });
        Lab {
            client,
            cluster: format!("test-{id:016x}"),
            spec: PortSpec::new("default", project.clone(), info, vec![sg.id]),
            project,
        }
    }

    fn driver(&self, min: u32, max: u32, batch: u32, ttl: u64) -> Arc<PoolDriver> {
        self.driver_updating(min, max, batch, ttl, Duration::from_secs(1))
    }

    /// A driver whose periodic maintenance runs every `update_frequency`.
    fn driver_updating(
        &self,
        min: u32,
        max: u32,
        batch: u32,
        ttl: u64,
        update_frequency: Duration,
    ) -> Arc<PoolDriver> {
        let deployments = Deployments::single(self.client.clone());
        // A pool of a cluster holding its id (the claim itself: tests/cluster_claim.rs).
        deployments.set_claimed("default", true);
        let cluster_tag = tags::cluster_tag(&self.cluster);
        let vif = Arc::new(NeutronVif::new(
            deployments.clone(),
            vec![tags::TAG_MANAGED.to_string(), cluster_tag.clone()],
            "br-int".into(),
            0,
        ));
        let opts = PoolOptions {
            deployments,
            limits: Limits {
                min: min as usize,
                max: max as usize,
                batch: batch as usize,
                ttl: (ttl > 0).then(|| Duration::from_secs(ttl)),
                max_concurrent_populate: 4,
                bulk: kuryr_controller::pool::state::MAX_BULK,
            },
            port_debug: false,
            mtu: 0,
            cluster_tag,
            metrics: Metrics::new(),
            refill_wait: Duration::from_secs(60),
            update_frequency,
        };
        PoolDriver::new(PoolKind::Neutron, vif, opts).unwrap()
    }

    async fn ports(&self) -> Vec<Port> {
        self.client
            .list_ports(&ListFilter::new().project_id(&self.project))
            .await
            .unwrap()
    }

    fn pod(&self, name: &str) -> PodRef {
        PodRef {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            node: NODE.into(),
        }
    }

    fn key(&self) -> Key {
        Key::new(
            "default",
            NODE,
            self.project.clone(),
            self.spec.network.id.clone(),
            self.spec.network.subnet_ids(),
            self.spec.security_groups.clone(),
        )
    }

    async fn cleanup(&self) {
        for p in self.ports().await {
            let _ = self.client.delete_port(&p.id).await;
        }
        let _ = self.client.delete_network(&self.spec.network.id).await;
        let sgs = self
            .client
            .list_security_groups(&ListFilter::new().project_id(&self.project))
            .await
            .unwrap_or_default();
        for sg in sgs {
            let _ = self.client.delete_security_group(&sg.id).await;
        }
    }

    /// Runs `body`, cleans up, then re-raises a failure of `body`.
    async fn run<F, Fut>(self, body: F)
    where
        F: FnOnce(Lab) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let res = tokio::spawn(body(self.clone())).await;
        self.cleanup().await;
        if let Err(e) = res {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

async fn request(d: &PoolDriver, lab: &Lab, pod: &str) -> (Vif, VifOrigin) {
    pooled_vif(d, &lab.pod(pod), &lab.spec).await.unwrap()
}

/// `pod` gives its port back, as its KuryrPort's finalizer does.
async fn release(d: &PoolDriver, lab: &Lab, pod: &str, vif: &Vif, origin: &VifOrigin) {
    let p = lab.pod(pod);
    d.release_vif(vif, origin, &holder(&p.namespace, &p.name, &p.uid))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_request_creates_one_batch_second_none() {
    let Some(url) = real_neutron_url("first_request_creates_one_batch_second_none") else {
        return;
    };
    Lab::new(&url, "pool-batch")
        .await
        .run(|lab| async move {
            let d = lab.driver(2, 0, 5, 0);
            d.mark_ready();
            let (vif, origin) = request(&d, &lab, "a").await;
            assert_eq!(lab.ports().await.len(), 5, "the first pod adds exactly one batch");
            assert_eq!(origin.host, NODE);
            assert_eq!(origin.driver, "neutron-vif");
            let (vif2, _) = request(&d, &lab, "b").await;
            assert_ne!(vif.id(), vif2.id());
            assert_eq!(lab.ports().await.len(), 5, "the second pod adds none");
            // Pool ports are tagged as this cluster's and this pool's in the create request.
            let name = d.snapshot(&lab.key()).unwrap().name;
            for p in lab.ports().await {
                assert!(p.tags.contains(&tags::TAG_MANAGED.to_string()), "{:?}", p.tags);
                assert!(p.tags.contains(&tags::pool_tag(&name)), "{:?}", p.tags);
                assert_eq!(p.binding_host_id, NODE);
            }
            let pool = d.snapshot(&lab.key()).unwrap();
            assert_eq!((pool.available, pool.in_use), (3, 2));
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_ports_recycle_up_to_max() {
    let Some(url) = real_neutron_url("released_ports_recycle_up_to_max") else {
        return;
    };
    Lab::new(&url, "pool-max")
        .await
        .run(|lab| async move {
            let d = lab.driver(1, 2, 2, 0);
            d.mark_ready();
            let mut used = Vec::new();
            for pod in ["a", "b", "c"] {
                used.push((pod, request(&d, &lab, pod).await));
            }
            // Batches of 2: a and b drain the first, c takes one of the second. `max` bounds the
            // spare ports, never the ports pods use. A loaded server's slow creates make the
            // client ask for fewer ports a request (`ports_per_request`): the second batch may
            // then come as one port for c and a refill back to `min` after it, so the spares
            // are counted, not assumed (one on a server answering in time).
            let pool = eventually("no refill running", Duration::from_secs(60), || async {
                Ok(d.snapshot(&lab.key()).filter(|p| !p.populating))
            })
            .await
            .unwrap();
            let spares = pool.available;
            assert!((1..=2).contains(&spares), "min 1, max 2: {pool:?}");
            assert_eq!(pool.in_use, 3);
            assert_eq!(
                lab.ports().await.len(),
                3 + spares,
                "three in use plus the spares"
            );
            for (pod, (vif, origin)) in &used {
                release(&d, &lab, pod, vif, origin).await;
            }
            assert_eq!(
                lab.ports().await.len(),
                3 + spares,
                "release deletes nothing by itself"
            );
            let deleted = d.maintain().await;
            assert_eq!(
                deleted,
                1 + spares,
                "the spares plus the recycled reach max 2; the rest go"
            );
            let ports = lab.ports().await;
            assert_eq!(ports.len(), 2, "exactly max spare ports after one update pass");
            for p in &ports {
                assert_eq!(p.name, tags::POOL_PORT_NAME);
                assert_eq!(p.security_groups, lab.spec.security_groups);
            }
            let pool = d.snapshot(&lab.key()).unwrap();
            assert_eq!((pool.available, pool.recyclable, pool.in_use), (2, 0, 0));
        })
        .await;
}

/// Releases that take a pool beyond max wake maintenance: the surplus goes at once, not at the
/// next periodic pass (an hour away here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_beyond_max_is_recycled_at_once() {
    let Some(url) = real_neutron_url("a_release_beyond_max_is_recycled_at_once") else {
        return;
    };
    Lab::new(&url, "pool-wake")
        .await
        .run(|lab| async move {
            let d = lab.driver_updating(1, 1, 2, 0, Duration::from_secs(3600));
            d.mark_ready();
            let stop = CancellationToken::new();
            let maintenance = tokio::spawn({
                let (d, stop) = (d.clone(), stop.clone());
                async move { d.run_maintenance(stop).await }
            });
            let mut used = Vec::new();
            for pod in ["a", "b", "c"] {
                used.push((pod, request(&d, &lab, pod).await));
            }
            eventually("no refill running", Duration::from_secs(60), || async {
                Ok((!d.snapshot(&lab.key()).unwrap().populating).then_some(()))
            })
            .await
            .unwrap();
            // Releasing b and c goes beyond max 1 (with the spare): wakes a recycle pass.
            for (pod, (vif, origin)) in &used {
                release(&d, &lab, pod, vif, origin).await;
            }
            eventually("the pool back within max 1", Duration::from_secs(60), || async {
                let pool = d.snapshot(&lab.key()).unwrap();
                let ports = lab.ports().await.len();
                Ok(((pool.available, pool.recyclable, pool.in_use, ports) == (1, 0, 0, 1)).then_some(()))
            })
            .await
            .unwrap();
            stop.cancel();
            maintenance.await.unwrap();
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_shrinks_pool_back_to_min() {
    let Some(url) = real_neutron_url("ttl_shrinks_pool_back_to_min") else {
        return;
    };
    Lab::new(&url, "pool-ttl")
        .await
        .run(|lab| async move {
            // A TTL far longer than the few calls between the refill landing and the first
            // pass, so that "not yet" does not depend on how fast they are.
            let d = lab.driver(1, 0, 4, 20);
            d.mark_ready();
            request(&d, &lab, "a").await;
            assert_eq!(lab.ports().await.len(), 4);
            assert_eq!(d.maintain().await, 0, "nothing idle for the TTL yet");
            // Passes (as the update loop runs them) until the TTL is up: one pass deletes both
            // ports above min.
            let deleted = eventually(
                "idle ports above min expired",
                Duration::from_secs(120),
                || async {
                    let n = d.maintain().await;
                    Ok((n > 0).then_some(n))
                },
            )
            .await
            .unwrap();
            assert_eq!(deleted, 2);
            assert_eq!(lab.ports().await.len(), 2, "one in use plus min spare");
            assert_eq!(d.snapshot(&lab.key()).unwrap().available, 1);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_from_neutron_tags_readopts_pool_ports() {
    let Some(url) = real_neutron_url("recovery_from_neutron_tags_readopts_pool_ports") else {
        return;
    };
    Lab::new(&url, "pool-recover")
        .await
        .run(|lab| async move {
            let d = lab.driver(2, 0, 5, 0);
            d.mark_ready();
            let (vif, origin) = request(&d, &lab, "a").await;
            let (freed, freed_origin) = request(&d, &lab, "b").await;
            release(&d, &lab, "b", &freed, &freed_origin).await;
            drop(d);
            // Someone else's port on the same network, without our tags: never touched.
            let foreign = lab
                .client
                .create_port(&kuryr_neutron::PortCreate {
                    project_id: Some(lab.project.clone()),
                    ..kuryr_neutron::PortCreate::new(lab.spec.network.id.clone())
                })
                .await
                .unwrap();

            let d = lab.driver(2, 0, 5, 0);
            assert!(!d.is_ready());
            let err = d.request_vif(&lab.pod("early"), &lab.spec).await.unwrap_err();
            assert!(err.to_string().contains("recovered"), "{err}");
            // No KuryrPortPool objects (never flushed): rebuilt from the Neutron tags alone.
            // a's port is also listed by the KuryrPort of a pod being deleted whose finalizer
            // released it before the crash (it was then handed on to a): the live one holds it.
            let claim = |pod: &str, terminating| {
                let p = lab.pod(pod);
                InUsePort {
                    port_id: vif.id().to_string(),
                    origin: Some(origin.clone()),
                    holder: Some(holder(&p.namespace, &p.name, &p.uid)),
                    terminating,
                }
            };
            let input = RecoveryInput {
                pools: Vec::new(),
                in_use: vec![claim("gone", true), claim("a", false)],
            };
            let report = d.recover(&input).await.unwrap();
            assert!(d.is_ready());
            assert_eq!(report.in_use, 1);
            assert_eq!(report.adopted, 4, "3 spare + the released one");
            // Ports no KuryrPortPool lists are adopted as recyclable: the recycle pass cleans
            // them (a released one still has its pod's name and groups) before they are handed
            // out, and keeps them only below max.
            let pool = d.snapshot(&lab.key()).unwrap();
            assert_eq!((pool.available, pool.recyclable, pool.in_use), (0, 4, 1));
            d.maintain().await;
            let pool = d.snapshot(&lab.key()).unwrap();
            assert_eq!((pool.available, pool.recyclable, pool.in_use), (4, 0, 1));
            let before = lab.ports().await.len();
            assert_eq!(before, 6);
            let (again, _) = request(&d, &lab, "c").await;
            assert_ne!(again.id(), vif.id(), "a port in use is never handed out twice");
            assert_ne!(again.id(), foreign.id);
            assert_eq!(lab.ports().await.len(), before, "served from the recovered pool");
            // The deleted pod's retried finalizer does not take a's port away.
            release(&d, &lab, "gone", &vif, &origin).await;
            let pool = d.snapshot(&lab.key()).unwrap();
            assert_eq!((pool.recyclable, pool.in_use), (0, 2), "a and c hold theirs");
            release(&d, &lab, "a", &vif, &origin).await;
            assert_eq!(d.snapshot(&lab.key()).unwrap().recyclable, 1);
        })
        .await;
}
