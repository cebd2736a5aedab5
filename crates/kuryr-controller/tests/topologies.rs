//! Nested VLAN nodes with trunks, namespace networks, and two controllers in HA.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kuryr_crds::{KuryrNetwork, KuryrPort};
use kuryr_neutron::ListFilter;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(120);

/// A kuryr.conf with the `namespace` subnets driver (namespaces' subnets from `pool`, attached to
/// `router`) in the fixture's project; `extra` goes into `[kubernetes]`.
fn namespace_subnets_conf(
    handlers: &str,
    extra: &str,
    fx: &NeutronFixture,
    pool: &kuryr_neutron::SubnetPool,
    router: &kuryr_neutron::Router,
) -> String {
    format!(
        "[kubernetes]\nenabled_handlers = {handlers}\npod_subnets_driver = namespace\n{extra}\
         [namespace_subnet]\npod_router = {}\npod_subnet_pool = {}\n\
         [neutron_defaults]\nproject = {}\npod_security_groups = {}\n",
        router.id, pool.id, fx.project, fx.sg
    )
}

async fn active_kps(kube: &kube::Client, ns: &str) -> Result<Vec<KuryrPort>> {
    let kps = Api::<KuryrPort>::namespaced(kube.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items;
    Ok(kps
        .into_iter()
        .filter(|kp| kp.status.as_ref().is_some_and(|s| s.all_active()))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nested_vlan_pods_become_active_subports_with_unique_vlans() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.20.0.0/24").await?;
        let vms = vm_trunks(neutron, &kube.client, &fx.project, "192.168.50.0/24").await?;
        let trunks = vms.trunks.clone();
        let cfg = format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = nested-vlan\n\
             [pod_vif_nested]\nworker_nodes_subnets = {}\n\
             [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\n",
            vms.subnet, fx.project, fx.subnet, fx.sg
        );
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c1");
        create_namespace(&kube.client, "nested", json!({})).await?;
        for i in 0..8 {
            create_pod(&kube.client, "nested", &format!("n-{i}"), NODES[i % 2], json!({})).await?;
        }
        let kps = eventually("8 active nested KuryrPorts", WAIT, || async {
            let a = active_kps(&kube.client, "nested").await?;
            Ok((a.len() == 8).then_some(a))
        })
        .await?;
        for (node, trunk) in NODES.iter().zip(&trunks) {
            let subports = neutron.get_subports(trunk).await?;
            let vlans: BTreeSet<u32> = subports.iter().map(|s| s.segmentation_id).collect();
            assert_eq!(subports.len(), 4, "{}: 4 pods per node", target.name);
            assert_eq!(vlans.len(), 4, "{}: VLAN ids unique per trunk", target.name);
            for kp in kps.iter().filter(|kp| kp.spec.pod_node_name == *node) {
                let (_, vif) = kp.status.as_ref().unwrap().default_vif().unwrap();
                let sp = subports
                    .iter()
                    .find(|s| s.port_id == vif.id())
                    .expect("VIF is a subport of its node's trunk");
                assert_eq!(vif.vlan_id().map(u32::from), Some(sp.segmentation_id));
                let port = neutron.get_port(vif.id()).await?;
                assert_eq!(port.status, "ACTIVE", "{}", target.name);
                assert_eq!(port.device_owner, "trunk:subport");
            }
        }
        let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "nested");
        for i in 0..8 {
            pods.delete(&format!("n-{i}"), &DeleteParams::default()).await?;
        }
        eventually("pods gone", WAIT, || async {
            Ok(pods
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        })
        .await?;
        for trunk in &trunks {
            assert!(
                neutron.get_subports(trunk).await?.is_empty(),
                "{}: subports detached",
                target.name
            );
        }
        let left = neutron
            .list_ports(&ListFilter::new().network_id(&fx.network))
            .await?;
        assert!(
            left.iter().all(|p| p.device_owner != "trunk:subport"),
            "{}: pod ports deleted",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!("nested[{}]: 8 pods on 2 trunks wired and released", target.name);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_subnet_driver_creates_and_removes_namespace_networks() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.30.0.0/24").await?;
        let (pool, router) = namespace_subnet_infra(neutron, &fx.project, "10.99.0.0/16").await?;
        let cfg = namespace_subnets_conf("vif,kuryrport,namespace,kuryrnetwork", "", &fx, &pool, &router);
        // What a controller that crashed between creating team-a's network and tagging it left
        // behind: adopted, not duplicated.
        let crashed = neutron
            .create_network(&kuryr_neutron::NetworkCreate {
                name: Some("ns/team-a-net".into()),
                project_id: Some(fx.project.clone()),
                ..Default::default()
            })
            .await?;
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c1");
        create_namespace(&kube.client, "team-a", json!({})).await?;
        create_pod(&kube.client, "team-a", "p", NODES[0], json!({})).await?;
        let kns: Api<KuryrNetwork> = Api::namespaced(kube.client.clone(), "team-a");
        let status = eventually("KuryrNetwork populated", WAIT, || async {
            Ok(kns
                .get_opt("team-a")
                .await?
                .and_then(|kn| kn.status)
                .filter(|s| s.router_id.is_some()))
        })
        .await?;
        let net_id = status.net_id.clone().unwrap();
        let subnet_id = status.subnet_id.clone().unwrap();
        assert!(
            status.subnet_cidr.as_deref().unwrap_or("").starts_with("10.99."),
            "{:?}",
            status.subnet_cidr
        );
        let net = neutron.get_network(&net_id).await?;
        assert_eq!(net.project_id, fx.project);
        assert_eq!(
            net_id, crashed.id,
            "{}: the untagged network is adopted",
            target.name
        );
        assert!(!net.tags.is_empty(), "{}: and tagged", target.name);
        let same_name = neutron
            .list_networks(&ListFilter::new().name("ns/team-a-net").project_id(&fx.project))
            .await?;
        assert_eq!(same_name.len(), 1, "{}: no duplicate network", target.name);
        let router_ports = neutron
            .list_ports(&ListFilter::new().device_id(&router.id))
            .await?;
        assert!(
            router_ports
                .iter()
                .any(|p| p.fixed_ips.iter().any(|f| f.subnet_id == subnet_id)),
            "{}: router interface",
            target.name
        );
        let kp = eventually("pod wired on the namespace subnet", WAIT, || async {
            Ok(active_kps(&kube.client, "team-a").await?.into_iter().next())
        })
        .await?;
        let (_, vif) = kp.status.as_ref().unwrap().default_vif().unwrap();
        assert_eq!(neutron.get_port(vif.id()).await?.network_id, net_id);

        // The controller stops, and the record of what it made is lost (as after a crash right
        // after the creates, before the status writes); the namespace is deleted meanwhile. The
        // next controller still finds the network, subnet and router interface, and removes them.
        ctrl.shutdown().await?;
        kns.patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"netId": null, "subnetId": null, "routerId": null}})),
        )
        .await?;
        Api::<Pod>::namespaced(kube.client.clone(), "team-a")
            .delete("p", &DeleteParams::default())
            .await?;
        Api::<Namespace>::all(kube.client.clone())
            .delete("team-a", &DeleteParams::default())
            .await?;
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c2");
        eventually("the unrecorded network removed", WAIT, || async {
            Ok(neutron
                .get_network(&net_id)
                .await
                .err()
                .filter(|e| e.is_not_found())
                .map(|_| ()))
        })
        .await?;
        eventually("KuryrNetwork gone", WAIT, || async {
            Ok(kns.get_opt("team-a").await?.is_none().then_some(()))
        })
        .await?;
        let router_ports = neutron
            .list_ports(&ListFilter::new().device_id(&router.id))
            .await?;
        assert!(
            !router_ports
                .iter()
                .any(|p| p.fixed_ips.iter().any(|f| f.subnet_id == subnet_id)),
            "{}: the router interface went with it",
            target.name
        );
        ctrl.stop.cancel();
        let _ = neutron.delete_router(&router.id).await;
        cleanup_project(neutron, &fx.project).await;
        let _ = neutron.delete_subnetpool(&pool.id).await;
        eprintln!("namespace[{}]: network created and removed", target.name);
    }
    Ok(())
}

/// As upstream, a namespace gets a network only once it holds a pod on the pods' network: a
/// controller starting on a namespace that holds one makes it (the `namespace` handler alone, no
/// pod handler); an empty namespace and one of host-network pods get none; the first pod of an
/// empty namespace gets it made and is wired on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_gets_a_network_only_with_a_pod_on_the_pods_network() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.32.0.0/24").await?;
        let (pool, router) = namespace_subnet_infra(neutron, &fx.project, "10.96.0.0/16").await?;
        let cfg = |handlers: &str| namespace_subnets_conf(handlers, "", &fx, &pool, &router);
        for ns in ["held", "hosts", "empty"] {
            create_namespace(&kube.client, ns, json!({})).await?;
        }
        create_pod(&kube.client, "held", "p", NODES[0], json!({})).await?;
        let host_pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "agent", "namespace": "hosts"},
            "spec": {"nodeName": NODES[0], "hostNetwork": true,
                     "containers": [{"name": "c", "image": "busybox"}]}
        }))?;
        Api::<Pod>::namespaced(kube.client.clone(), "hosts")
            .create(&Default::default(), &host_pod)
            .await?;
        let kn = |ns: &str| Api::<KuryrNetwork>::namespaced(kube.client.clone(), ns);
        let populated = |ns: &'static str| {
            let api = kn(ns);
            async move {
                eventually(&format!("{ns}'s network"), WAIT, || async {
                    Ok(api
                        .get_opt(ns)
                        .await?
                        .and_then(|kn| kn.status)
                        .filter(|s| s.router_id.is_some())
                        .and_then(|s| s.subnet_id))
                })
                .await
            }
        };

        let ctrl = start_controller(
            &kube.client,
            &target,
            config(&cfg("namespace,kuryrnetwork")),
            "lazy-1",
        );
        populated("held").await?;
        // The three namespaces were listed together: give the other two the same time.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for ns in ["hosts", "empty", "default", "kube-system"] {
            assert!(kn(ns).get_opt(ns).await?.is_none(), "{}: {ns}", target.name);
        }
        ctrl.shutdown().await?;

        let ctrl = start_controller(
            &kube.client,
            &target,
            config(&cfg("vif,kuryrport,namespace,kuryrnetwork")),
            "lazy-2",
        );
        create_pod(&kube.client, "empty", "first", NODES[1], json!({})).await?;
        let subnet = populated("empty").await?;
        let kp = eventually("the first pod wired", WAIT, || async {
            Ok(active_kps(&kube.client, "empty").await?.into_iter().next())
        })
        .await?;
        let (_, vif) = kp.status.as_ref().unwrap().default_vif().unwrap();
        let port = neutron.get_port(vif.id()).await?;
        assert!(
            port.fixed_ips.iter().any(|ip| ip.subnet_id == subnet),
            "{}: {:?}",
            target.name,
            port.fixed_ips
        );
        assert!(kn("hosts").get_opt("hosts").await?.is_none(), "{}", target.name);
        let networks = neutron
            .list_networks(&ListFilter::new().project_id(&fx.project))
            .await?;
        assert_eq!(
            networks.len(),
            3,
            "{}: the fixture's, held's and empty's: {networks:?}",
            target.name
        );
        ctrl.shutdown().await?;
        // The namespaces' subnets hang on the router: detached so that cleanup_project can go.
        let subnets = neutron
            .list_subnets(&ListFilter::new().project_id(&fx.project))
            .await?;
        for sn in subnets {
            let spec = kuryr_neutron::RouterInterfaceSpec::Subnet { subnet_id: sn.id };
            let _ = neutron.remove_router_interface(&router.id, &spec).await;
        }
        cleanup_project(neutron, &fx.project).await;
        let _ = neutron.delete_router(&router.id).await;
        let _ = neutron.delete_subnetpool(&pool.id).await;
    }
    Ok(())
}

/// A pod waits until its namespace's subnet is on the router (`pod_router` set), not only until
/// the subnet exists: started before, it would have no route out. Here the KuryrNetwork records
/// a subnet and no router interface (the `kuryrnetwork` handler between its two writes): the pod
/// gets no port until the router is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_its_namespace_subnet_to_be_on_the_router() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.33.0.0/24").await?;
        let (pool, router) = namespace_subnet_infra(neutron, &fx.project, "10.95.0.0/16").await?;
        let cfg = namespace_subnets_conf("vif,kuryrport", "", &fx, &pool, &router);
        create_namespace(&kube.client, "late", json!({})).await?;
        let kns = Api::<KuryrNetwork>::namespaced(kube.client.clone(), "late");
        let kn: KuryrNetwork = serde_json::from_value(json!({
            "apiVersion": "openstack.org/v1", "kind": "KuryrNetwork",
            "metadata": {"name": "late", "namespace": "late"},
            "spec": {"nsName": "late", "projectId": fx.project, "nsLabels": {}},
            "status": {"netId": fx.network, "subnetId": fx.subnet, "subnetCIDR": fx.cidr},
        }))?;
        kns.create(&Default::default(), &kn).await?;
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "router-wait");
        let pod = create_pod(&kube.client, "late", "p", NODES[0], json!({})).await?;
        let uid = pod.uid().unwrap();
        let by_pod = ListFilter::new().device_id(&uid);
        // The KuryrPort is there (the vif handler's part) while the port is not.
        eventually("the pod's KuryrPort", WAIT, || async {
            Ok(Api::<KuryrPort>::namespaced(kube.client.clone(), "late")
                .get_opt("p")
                .await?)
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            neutron.list_ports(&by_pod).await?.is_empty(),
            "{}: no port before the router",
            target.name
        );
        kns.patch(
            "late",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"routerId": router.id}})),
        )
        .await?;
        let kp = eventually("the pod wired", WAIT, || async {
            Ok(active_kps(&kube.client, "late").await?.into_iter().next())
        })
        .await?;
        let (_, vif) = kp.status.as_ref().unwrap().default_vif().unwrap();
        let port = neutron.get_port(vif.id()).await?;
        assert!(
            port.fixed_ips.iter().any(|ip| ip.subnet_id == fx.subnet),
            "{}: {:?}",
            target.name,
            port.fixed_ips
        );
        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
        let _ = neutron.delete_router(&router.id).await;
        let _ = neutron.delete_subnetpool(&pool.id).await;
    }
    Ok(())
}

/// A namespace network found by its name (left untagged by a crash) or by its tags could be
/// another cluster's given the same cluster_id: neither adopted nor made a second time until this
/// cluster's claim is confirmed, then adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_network_is_adopted_only_once_the_claim_is_confirmed() -> Result<()> {
    use kube::api::PostParams;
    use kuryr_controller::context::Context;
    use kuryr_controller::handlers::kuryrnetwork::KuryrNetworkHandler;
    use kuryr_controller::pipeline::ResourceEventHandler;
    use kuryr_crds::KuryrNetworkSpec;
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.32.0.0/24").await?;
        let (pool, router) = namespace_subnet_infra(neutron, &fx.project, "10.97.0.0/16").await?;
        let cluster = format!("kn-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let cfg = namespace_subnets_conf(
            "vif,kuryrport,namespace,kuryrnetwork",
            &format!("cluster_id = {cluster}\n"),
            &fx,
            &pool,
            &router,
        );
        let left = neutron
            .create_network(&kuryr_neutron::NetworkCreate {
                name: Some("ns/team-k-net".into()),
                project_id: Some(fx.project.clone()),
                ..Default::default()
            })
            .await?;
        let platform = noauth_platform(&kube.client, &target.url, config(&cfg))?;
        let handler = KuryrNetworkHandler::new(Context::build(platform.clone())?);
        create_namespace(&kube.client, "team-k", json!({})).await?;
        let kns: Api<KuryrNetwork> = Api::namespaced(kube.client.clone(), "team-k");
        let mut kn = KuryrNetwork::new(
            "team-k",
            KuryrNetworkSpec {
                ns_name: "team-k".into(),
                project_id: fx.project.clone(),
                ns_labels: Default::default(),
            },
        );
        kn.metadata.namespace = Some("team-k".into());
        kns.create(&PostParams::default(), &kn).await?;
        let kn = kns.get("team-k").await?;
        match handler.on_present(&kn).await {
            Err(kuryr_controller::Error::ResourceNotReady(_)) => {}
            other => panic!("{}: before the claim: {other:?}", target.name),
        }
        let named = neutron
            .list_networks(&ListFilter::new().name("ns/team-k-net").project_id(&fx.project))
            .await?;
        assert_eq!(named.len(), 1, "{}: made again: {named:?}", target.name);
        assert!(named[0].tags.is_empty(), "{}: adopted unclaimed", target.name);
        let kn = kns.get("team-k").await?;
        assert!(
            kn.status.as_ref().and_then(|s| s.net_id.as_ref()).is_none(),
            "{}: {:?}",
            target.name,
            kn.status
        );

        platform.deployments.set_claimed("default", true);
        handler.on_present(&kn).await?;
        let status = kns.get("team-k").await?.status.unwrap_or_default();
        assert_eq!(
            status.net_id.as_deref(),
            Some(left.id.as_str()),
            "{}",
            target.name
        );
        assert!(
            !neutron.get_network(&left.id).await?.tags.is_empty(),
            "{}: tagged once adopted",
            target.name
        );
        handler.on_finalize(&kns.get("team-k").await?).await?;
        let _ = neutron.delete_router(&router.id).await;
        cleanup_project(neutron, &fx.project).await;
        let _ = neutron.delete_subnetpool(&pool.id).await;
        eprintln!("namespace[{}]: adopted once claimed", target.name);
    }
    Ok(())
}

/// Namespaces waiting for a network quota that stays full make a few probing creates, not one
/// per namespace per retry (the quota gate); once the quota is raised every namespace gets its
/// network.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespaces_over_the_network_quota_make_no_create_storm_and_are_served_once_raised() -> Result<()> {
    init_logs();
    const NAMESPACES: usize = 12;
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.31.0.0/24").await?;
        let (pool, router) = namespace_subnet_infra(neutron, &fx.project, "10.98.0.0/16").await?;
        let networks = |quota: i64| kuryr_neutron::QuotaUpdate {
            network: Some(quota),
            ..Default::default()
        };
        let existing = neutron
            .list_networks(&ListFilter::new().project_id(&fx.project))
            .await?
            .len();
        neutron
            .update_quota(&fx.project, &networks(i64::try_from(existing)?))
            .await?;
        let cfg = namespace_subnets_conf("vif,kuryrport,namespace,kuryrnetwork", "", &fx, &pool, &router);
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c1");
        let creates = || {
            kuryr_controller::metrics::per_operation(&ctrl.metrics.neutron_calls())
                .get("create_network")
                .copied()
                .unwrap_or(0)
        };
        for i in 0..NAMESPACES {
            let ns = format!("q-{i}");
            create_namespace(&kube.client, &ns, json!({})).await?;
            create_pod(&kube.client, &ns, "p", NODES[i % 2], json!({})).await?;
        }
        eventually("a first network create refused", WAIT, || async {
            Ok((creates() > 0).then_some(()))
        })
        .await?;
        // Let the first round (creates already in flight when the first refusal came back) end.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = creates();
        let window = Duration::from_secs(20);
        tokio::time::sleep(window).await;
        let during = creates() - before;
        eprintln!(
            "quota[{}]: {NAMESPACES} namespaces waiting, {during} network creates in {}s ({before} before)",
            target.name,
            window.as_secs()
        );
        // Probes after 2, 4, 8 and 16 s at the most (jittered shorter); each namespace retrying on
        // its own would make several creates each in the same window.
        assert!(
            during <= 6,
            "{}: {during} network creates in {}s for {NAMESPACES} waiting namespaces",
            target.name,
            window.as_secs()
        );
        // Room for every namespace's network (the cluster's own namespaces have one too).
        let all = Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .len();
        neutron
            .update_quota(&fx.project, &networks(i64::try_from(existing + all)?))
            .await?;
        let raised = Instant::now();
        let mut nets = Vec::new();
        for i in 0..NAMESPACES {
            let ns = format!("q-{i}");
            let kns: Api<KuryrNetwork> = Api::namespaced(kube.client.clone(), &ns);
            let status = eventually(
                &format!("{}: {ns}'s network once raised", target.name),
                WAIT,
                || async {
                    Ok(kns
                        .get_opt(&ns)
                        .await?
                        .and_then(|kn| kn.status)
                        .filter(|s| s.router_id.is_some()))
                },
            )
            .await?;
            nets.push((ns, status.net_id.unwrap_or_default()));
        }
        eprintln!(
            "quota[{}]: every namespace's network {:.1}s after the raise",
            target.name,
            raised.elapsed().as_secs_f64()
        );
        for (ns, net_id) in &nets {
            delete_namespace_and_wait(&kube.client, neutron, ns, "p", net_id).await?;
        }
        ctrl.stop.cancel();
        let _ = neutron.reset_quota(&fx.project).await;
        let _ = neutron.delete_router(&router.id).await;
        cleanup_project(neutron, &fx.project).await;
        let _ = neutron.delete_subnetpool(&pool.id).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_leader_acts_and_a_killed_leader_is_replaced() -> Result<()> {
    init_logs();
    // One target is enough here: this is about Kubernetes-side coordination.
    let target = neutron_targets().await?.into_iter().next().unwrap();
    let kube = start_kube().await?;
    let neutron = &target.client;
    let fx = neutron_fixture(neutron, "10.40.0.0/24").await?;
    let cfg = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\ncontroller_ha = True\ncontroller_namespace = default\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\n",
        fx.project, fx.subnet, fx.sg
    );
    let a = start_controller(&kube.client, &target, config(&cfg), "replica-a");
    let b = start_controller(&kube.client, &target, config(&cfg), "replica-b");
    create_namespace(&kube.client, "ha", json!({})).await?;
    for i in 0..4 {
        create_pod(&kube.client, "ha", &format!("h-{i}"), NODES[i % 2], json!({})).await?;
    }
    eventually("4 pods wired", WAIT, || async {
        let n = active_kps(&kube.client, "ha").await?.len();
        Ok((n == 4).then_some(()))
    })
    .await?;
    let leases: Api<Lease> = Api::namespaced(kube.client.clone(), "default");
    let holder = leases
        .get("kuryr-controller")
        .await?
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    let (leader, follower) = if holder == "replica-a" { (a, b) } else { (b, a) };
    // Readiness probes list extensions on every replica; port creation is the leader's alone.
    let creates = |c: &Controller| {
        c.metrics
            .encode()
            .lines()
            // `create_port` alone, `create_ports` when creates asked together went as one bulk.
            .filter(|l| l.starts_with("kuryr_neutron_calls_total") && l.contains("operation=\"create_port"))
            .count()
    };
    assert!(creates(&leader) > 0, "the leader wired the pods");
    assert_eq!(creates(&follower), 0, "the follower created no port");

    leader.kill().await;
    let killed = Instant::now();
    create_pod(&kube.client, "ha", "after-failover", NODES[0], json!({})).await?;
    // The lease is the contract: a dead leader's lease expires and a follower takes it.
    let new_holder = eventually("a new lease holder", WAIT, || async {
        let h = leases
            .get("kuryr-controller")
            .await?
            .spec
            .and_then(|s| s.holder_identity);
        Ok(h.filter(|h| *h != holder))
    })
    .await?;
    // How long it takes depends on the lease timings and the machine: logged, not asserted.
    let handover = killed.elapsed();
    assert_ne!(new_holder, holder);
    eventually("pod wired by the new leader", WAIT, || async {
        let wired = active_kps(&kube.client, "ha")
            .await?
            .iter()
            .any(|kp| kp.name_any() == "after-failover");
        Ok(wired.then_some(()))
    })
    .await?;
    eprintln!("ha: hand-over in {handover:?}, wiring continued");
    follower.stop.cancel();
    cleanup_project(neutron, &fx.project).await;
    Ok(())
}
