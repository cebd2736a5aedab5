#![allow(clippy::unwrap_used)]
//! KuryrPortPool persistence and restart recovery: the in-repo Kubernetes API emulator plus the
//! real neutron-server (`KURYR_TEST_NEUTRON_URL`). A first PoolManager fills a pool and flushes
//! it; a second one (the "restarted controller") rebuilds it from the KuryrPortPool object and
//! a KuryrPort, without creating a Neutron port, and serves the next pod from it.

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use kube_emulator::{KubeEmulator, KubeOptions};
use kuryr_config::{KuryrConfig, VifPoolDriver};
use kuryr_controller::context::Platform;
use kuryr_controller::drivers::pool::{ORIGIN_FIELD, VifPool};
use kuryr_controller::drivers::vif::neutron::NeutronVif;
use kuryr_controller::drivers::{NetworkInfo, PodRef, PortSpec};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pool::{self, persist::Persister};
use kuryr_crds::{KuryrPort, KuryrPortPool};
use kuryr_neutron::{ClientOptions, ListFilter, NetworkCreate, NeutronClient, SubnetCreate};
use support::pooled_vif;

const NS: &str = "kuryr-system";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rebuilds_pools_from_kuryrportpools_and_kuryrports() {
    let Some(url) = support::real_neutron_url("pool_persist") else {
        return;
    };
    let mut opts = ClientOptions::noauth(&url);
    opts.timeout = Some(Duration::from_secs(120));
    let neutron = NeutronClient::new(&opts).unwrap();
    let id: u64 = rand::random();
    let project = format!("poolpersist{id:016x}");
    let net = neutron
        .create_network(&NetworkCreate {
            project_id: Some(project.clone()),
            ..NetworkCreate::default()
        })
        .await
        .unwrap();
    let subnet = neutron
        .create_subnet(&SubnetCreate {
            network_id: net.id.clone(),
            ip_version: 4,
            cidr: Some("10.79.0.0/24".into()),
            project_id: Some(project.clone()),
            enable_dhcp: Some(false),
            ..SubnetCreate::default()
        })
        .await
        .unwrap();

    let body = {
        let (neutron, project, net_id) = (neutron.clone(), project.clone(), net.id.clone());
        tokio::spawn(async move {
            let kube_handle = KubeEmulator::start(KubeOptions {
                nodes: vec!["k8s-node-1".into()],
                ..Default::default()
            })
            .await
            .unwrap();
            let kube = kube::Client::try_from(kube::Config::new(kube_handle.url().parse().unwrap())).unwrap();
            let crds: Api<CustomResourceDefinition> = Api::all(kube.clone());
            for crd in kuryr_crds::generate::crds() {
                crds.create(&PostParams::default(), &crd).await.unwrap();
            }
            // The controller namespace exists in a deployment (its manifests create it).
            let ns: k8s_openapi::api::core::v1::Namespace =
                serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).unwrap();
            Api::all(kube.clone())
                .create(&PostParams::default(), &ns)
                .await
                .unwrap();
            let mut config = KuryrConfig::default();
            config.kubernetes.cluster_id = format!("persist-{id:016x}");
            config.kubernetes.controller_namespace = NS.into();
            config.kubernetes.vif_pool_driver = VifPoolDriver::Neutron;
            config.vif_pool.ports_pool_min = 2;
            config.vif_pool.ports_pool_batch = 5.try_into().unwrap();
            let config = Arc::new(config);
            let deployments = Deployments::single(neutron.clone());
            let ctx = Arc::new(Platform::new(
                kube.clone(),
                config.clone(),
                deployments.clone(),
                Metrics::new(),
            ));
            kuryr_testbed::claim_cluster_id(&ctx).await.unwrap();
            let manager = || {
                let vif = Arc::new(NeutronVif::new(
                    deployments.clone(),
                    ctx.resource_tags(),
                    "br-int".into(),
                    0,
                ));
                pool::build(ctx.clone(), vif, &config.vif_pool).unwrap()
            };
            let info = Arc::new(NetworkInfo {
                id: net_id.clone(),
                name: String::new(),
                mtu: None,
                subnets: vec![subnet],
            });
            let spec = PortSpec::new("default", project.clone(), info, vec![]);
            let pod = |name: &str| PodRef {
                namespace: "default".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
                node: "k8s-node-1".into(),
            };
            let count = || async {
                neutron
                    .list_ports(&ListFilter::new().project_id(&project))
                    .await
                    .unwrap()
                    .len()
            };

            // First controller: nothing to recover; one pod fills the cold pool with 5 ports. Its
            // first request may answer ResourceNotReady when the bulk create outlasts the pool's
            // refill wait: asked again as the handler would, it is served from that one refill.
            let first = manager();
            first.recover().await.unwrap();
            assert!(first.is_ready());
            let (vif, origin) = pooled_vif(first.as_ref(), &pod("a"), &spec).await.unwrap();
            assert_eq!(count().await, 5);
            let persister = Persister::new(kube.clone(), NS);
            assert_eq!(persister.flush(&first.drivers()[0]).await.unwrap(), 1);
            let pools: Api<KuryrPortPool> = Api::namespaced(kube.clone(), NS);
            let objs = pools.list(&Default::default()).await.unwrap().items;
            assert_eq!(objs.len(), 1);
            let status = objs[0].status.clone().unwrap();
            assert_eq!((status.available_count, status.recyclable_count), (4, 0));
            assert!(status.available.iter().all(|p| p.port_id != vif.id()));
            assert!(
                status
                    .available
                    .iter()
                    .all(|p| !p.mac_address.is_empty() && !p.fixed_ips.is_empty())
            );

            // The pod's KuryrPort records its port with the kuryr-rs origin.
            let mut kp: KuryrPort = serde_json::from_value(serde_json::json!({
                "apiVersion": "openstack.org/v1", "kind": "KuryrPort",
                "metadata": {"name": "a", "namespace": "default"},
                "spec": {"podUid": "uid-a", "podNodeName": "k8s-node-1"},
            }))
            .unwrap();
            let mut entry = kuryr_crds::KuryrPortVif::new(true, vif.clone());
            entry
                .extra
                .insert(ORIGIN_FIELD.into(), serde_json::to_value(&origin).unwrap());
            kp.status = Some(kuryr_crds::KuryrPortStatus {
                vifs: [("eth0".to_string(), entry)].into_iter().collect(),
            });
            Api::<KuryrPort>::namespaced(kube.clone(), "default")
                .create(&PostParams::default(), &kp)
                .await
                .unwrap();
            drop(first);

            // "Restarted" controller.
            let second = manager();
            assert!(!second.is_ready());
            second.recover().await.unwrap();
            assert!(second.is_ready());
            let summaries = second.summaries();
            assert_eq!(summaries.len(), 1);
            assert_eq!((summaries[0].available, summaries[0].in_use), (4, 1));
            assert_eq!(summaries[0].name, objs[0].metadata.name.clone().unwrap());
            assert_eq!(count().await, 5, "recovery creates nothing");
            // A hit: the recovered pool holds 4 spare ports, so one request serves it.
            let (next, _) = second.request_vif(&pod("b"), &spec).await.unwrap();
            assert_ne!(next.id(), vif.id());
            assert_eq!(count().await, 5, "the next pod is served from the recovered pool");
        })
    };
    let res = body.await;
    for p in neutron
        .list_ports(&ListFilter::new().project_id(&project))
        .await
        .unwrap_or_default()
    {
        let _ = neutron.delete_port(&p.id).await;
    }
    let _ = neutron.delete_network(&net.id).await;
    if let Err(e) = res {
        std::panic::resume_unwind(e.into_panic());
    }
}
