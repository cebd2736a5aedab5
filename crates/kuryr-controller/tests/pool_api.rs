#![allow(clippy::unwrap_used)]
//! The pool management API over its unix socket, with the `neutron` pool of a [`PoolManager`]
//! built by `pool::build` against the real neutron-server (`KURYR_TEST_NEUTRON_URL`). The
//! Kubernetes client points nowhere: list/show/populate/free never need it.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kuryr_config::{KuryrConfig, VifPoolDriver};
use kuryr_controller::context::Platform;
use kuryr_controller::drivers::pool::VifPool;
use kuryr_controller::drivers::vif::neutron::NeutronVif;
use kuryr_controller::drivers::{NetworkInfo, PodRef, PortSpec};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pool::{self, api};
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::{ClientOptions, ListFilter, NetworkCreate, NeutronClient, SubnetCreate};
use support::{eventually, pooled_vif};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_populate_free_over_the_socket() {
    let Some(url) = support::real_neutron_url("pool_api") else {
        return;
    };
    let mut opts = ClientOptions::noauth(&url);
    opts.timeout = Some(Duration::from_secs(120));
    let client = NeutronClient::new(&opts).unwrap();
    let id: u64 = rand::random();
    let project = format!("poolapi{id:016x}");
    let net = client
        .create_network(&NetworkCreate {
            project_id: Some(project.clone()),
            ..NetworkCreate::default()
        })
        .await
        .unwrap();
    let subnet = client
        .create_subnet(&SubnetCreate {
            network_id: net.id.clone(),
            ip_version: 4,
            cidr: Some("10.78.0.0/24".into()),
            project_id: Some(project.clone()),
            enable_dhcp: Some(false),
            ..SubnetCreate::default()
        })
        .await
        .unwrap();

    let body = {
        let (client, project, net_id) = (client.clone(), project.clone(), net.id.clone());
        tokio::spawn(async move {
            let mut config = KuryrConfig::default();
            config.kubernetes.cluster_id = format!("apitest-{id:016x}");
            config.kubernetes.vif_pool_driver = VifPoolDriver::Neutron;
            config.vif_pool.ports_pool_min = 1;
            config.vif_pool.ports_pool_batch = 3.try_into().unwrap();
            let config = Arc::new(config);
            let kube =
                kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
            let deployments = Deployments::single(client.clone());
            // A pool of a cluster holding its id (the claim itself: tests/cluster_claim.rs).
            deployments.set_claimed("default", true);
            let ctx = Arc::new(Platform::new(
                kube,
                config.clone(),
                deployments.clone(),
                Metrics::new(),
            ));
            let vif = Arc::new(NeutronVif::new(
                deployments,
                ctx.resource_tags(),
                "br-int".into(),
                0,
            ));
            let manager = pool::build(ctx, vif, &config.vif_pool).unwrap();
            assert_eq!(manager.name(), "neutron");
            assert!(!manager.is_ready(), "not ready before recovery");
            let driver = manager.drivers()[0].clone();
            driver.mark_ready();
            let info = Arc::new(NetworkInfo {
                id: net_id.clone(),
                name: String::new(),
                mtu: None,
                subnets: vec![subnet],
            });
            let spec = PortSpec::new("default", project.clone(), info, vec![]);
            let pod = PodRef {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "u".into(),
                node: "k8s-node-1".into(),
            };
            // The cold pool's first request may answer ResourceNotReady while its refill runs.
            pooled_vif(driver.as_ref(), &pod, &spec).await.unwrap();

            let dir = std::env::temp_dir().join(format!("kuryr-pool-api-{id:016x}"));
            let sock = dir.join("manage.sock");
            let stop = CancellationToken::new();
            let server = {
                let (m, sock, stop) = (manager.clone(), sock.clone(), stop.clone());
                tokio::spawn(async move { api::serve(m, &sock, stop).await })
            };
            // The socket appears once the server is bound.
            eventually("the management socket", WAIT, || async {
                Ok(sock.exists().then_some(()))
            })
            .await
            .unwrap();

            let pools = api::list_pools(&sock).await.unwrap();
            assert_eq!(pools.len(), 1);
            let p = &pools[0];
            assert_eq!((p.available, p.recyclable, p.in_use), (2, 0, 1));
            assert_eq!(p.pool_driver, "neutron");
            assert_eq!(p.host, "k8s-node-1");
            assert!(p.ports.is_empty(), "list carries no port lists");
            assert!(p.last_refill.is_some() && p.last_error.is_none());

            let shown = api::show_pool(&sock, &p.name).await.unwrap();
            assert_eq!(shown.ports.len(), 3);
            assert_eq!(shown.ports.iter().filter(|x| x.state == "inUse").count(), 1);

            let err = api::show_pool(&sock, "kpp-nope").await.unwrap_err();
            assert!(
                matches!(err, api::ClientError::Status { status: 404, .. }),
                "{err}"
            );

            assert!(api::populate_pool(&sock, &p.name, Some(2)).await.unwrap().started);
            let shown = eventually("the populate landed", WAIT, || async {
                let p = api::show_pool(&sock, &p.name).await?;
                Ok((!p.populating && p.available >= 4).then_some(p))
            })
            .await
            .unwrap();
            assert_eq!(shown.available, 4, "populate created exactly 2 ports");
            let pool_tag = tags::pool_tag(&p.name);
            let tagged = client
                .list_ports(&ListFilter::new().tags([pool_tag.as_str()]))
                .await
                .unwrap();
            assert_eq!(tagged.len(), 5);

            assert_eq!(api::free_pool(&sock, &p.name).await.unwrap().deleted, 4);
            let after = api::show_pool(&sock, &p.name).await.unwrap();
            assert_eq!((after.available, after.in_use), (0, 1));
            let tagged = client
                .list_ports(&ListFilter::new().tags([pool_tag.as_str()]))
                .await
                .unwrap();
            assert_eq!(tagged.len(), 1, "only the port in use is left");

            stop.cancel();
            server.await.unwrap().unwrap();
            assert!(!sock.exists(), "a stopped server removes its socket");
            let _ = std::fs::remove_dir_all(&dir);
        })
    };
    let res = body.await;
    for p in client
        .list_ports(&ListFilter::new().project_id(&project))
        .await
        .unwrap_or_default()
    {
        let _ = client.delete_port(&p.id).await;
    }
    let _ = client.delete_network(&net.id).await;
    if let Err(e) = res {
        std::panic::resume_unwind(e.into_panic());
    }
}
