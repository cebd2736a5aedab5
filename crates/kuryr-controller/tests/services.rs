//! Services on Octavia through the real start-up path: the `service`, `endpoints` and `kuryrloadbalancer`
//! handlers against the Kubernetes API emulator, the Neutron emulator (the service subnet) and each Octavia
//! target: the emulator, and the real Octavia 19.0.0 (amphora provider on noop drivers) at
//! KURYR_TEST_OCTAVIA_URL (skipped with the reason when unset; KURYR_TEST_REQUIRE_OCTAVIA=1 makes that an
//! error).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_crds::{KuryrLoadBalancer, KuryrLoadBalancerStatus, KuryrNetwork};
use kuryr_neutron::ClientOptions;
use kuryr_neutron::ListFilter;
use kuryr_neutron::octavia::{ListenerCreate, LoadBalancerCreate, OctaviaClient, PoolCreate, Provisioning};
use octavia_emulator::{LatencyProfile, OctaviaEmulator, OctaviaHandle, OctaviaOptions};
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(120);

/// One Octavia to run against.
struct OctaviaTarget {
    name: &'static str,
    client: OctaviaClient,
    emulator: Option<OctaviaHandle>,
}

async fn octavia_targets(latency: LatencyProfile) -> Result<Vec<OctaviaTarget>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let emu = OctaviaEmulator::start(OctaviaOptions {
        latency,
        ..OctaviaOptions::default()
    })
    .await?;
    let mut out = vec![OctaviaTarget {
        name: "emulator",
        client: OctaviaClient::new(&ClientOptions::noauth(emu.url()))?,
        emulator: Some(emu),
    }];
    match octavia_contract::env::real_octavia_url().map_err(anyhow::Error::msg)? {
        Some(url) => out.push(OctaviaTarget {
            name: "octavia",
            client: OctaviaClient::new(&ClientOptions::noauth(&url))?,
            emulator: None,
        }),
        None => eprintln!(
            "real Octavia target skipped: {}",
            octavia_contract::env::skip_reason()
        ),
    }
    Ok(out)
}

/// A test's world: Kubernetes, Neutron (emulator) with a pod and a service subnet, one Octavia.
struct Bed {
    kube: Kube,
    neutron: NeutronTarget,
    fx: NeutronFixture,
    /// The project of the load balancers: Octavia takes Keystone-sized ids (at most 36 characters), which the
    /// Neutron fixture's descriptive project names are not.
    project: String,
    /// Also the controller's cluster id: the tests share the real Octavia, and each controller's orphan
    /// sweep must see only its own load balancers.
    ns: String,
}

impl Bed {
    async fn new(ns: &str) -> Result<Self> {
        let kube = start_kube().await?;
        let neutron = neutron_targets().await?.remove(0);
        let fx = neutron_fixture_subnets(&neutron.client, &["10.1.0.0/24", "10.96.0.0/24"]).await?;
        create_namespace(&kube.client, ns, json!({})).await?;
        Ok(Self {
            kube,
            neutron,
            fx,
            project: uuid::Uuid::new_v4().simple().to_string(),
            ns: ns.to_string(),
        })
    }

    fn config(&self, extra: &str) -> String {
        format!(
            "[kubernetes]\nenabled_handlers = service,endpoints,kuryrloadbalancer\npod_vif_driver = neutron-vif\n\
             vif_pool_driver = noop\ncluster_id = {ns}\n\
             [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nservice_subnet = {}\n\
             resource_tags = k8s\n[octavia_defaults]\nreconcile_period = 1\n{extra}",
            self.project,
            self.fx.subnet,
            self.fx.sg,
            self.fx.subnets[1].subnet,
            ns = self.ns,
        )
    }

    fn controller(&self, octavia: &OctaviaTarget, extra: &str, identity: &str) -> Controller {
        let metrics = Metrics::new();
        let deployments = Deployments::noauth(&self.neutron.url, &metrics)
            .expect("neutron client")
            .with_octavia("default", octavia.client.clone());
        start_controller_with(
            &self.kube.client,
            deployments,
            metrics,
            config(&self.config(extra)),
            identity,
        )
    }

    fn client(&self) -> &Client {
        &self.kube.client
    }
}

/// A ClusterIP Service selecting pods labelled `app: <name>`.
fn service_manifest(ns: &str, name: &str, ip: &str, ports: &[(&str, i32, i32, &str)]) -> serde_json::Value {
    let ports: Vec<_> = ports
        .iter()
        .map(|(n, p, t, proto)| json!({"name": n, "port": p, "targetPort": t, "protocol": proto}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "selector": {"app": name}, "ports": ports}
    })
}

async fn create_service(
    kube: &Client,
    ns: &str,
    name: &str,
    ip: &str,
    ports: &[(&str, i32, i32, &str)],
) -> Result<()> {
    let svc: Service = serde_json::from_value(service_manifest(ns, name, ip, ports))?;
    Api::<Service>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await?;
    Ok(())
}

/// Writes the Service's one EndpointSlice (as the EndpointSlice controller would) with `ips` ready on `ports`.
async fn set_endpoints(
    kube: &Client,
    ns: &str,
    svc: &str,
    ips: &[String],
    ports: &[(&str, i32)],
) -> Result<()> {
    let endpoints = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            json!({
                "addresses": [ip], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": format!("{svc}-{i}"), "namespace": ns}
            })
        })
        .collect();
    write_slice(kube, ns, svc, &format!("{svc}-slice"), endpoints, ports).await
}

/// Creates or replaces EndpointSlice `name` of Service `svc` (the `kubernetes.io/service-name` label).
async fn write_slice(
    kube: &Client,
    ns: &str,
    svc: &str,
    name: &str,
    endpoints: Vec<serde_json::Value>,
    ports: &[(&str, i32)],
) -> Result<()> {
    let api = Api::<EndpointSlice>::namespaced(kube.clone(), ns);
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>(),
    }))?;
    match api.get_opt(name).await? {
        None => {
            api.create(&PostParams::default(), &slice).await?;
        }
        Some(_) => {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::to_value(&slice)?),
            )
            .await?;
        }
    }
    Ok(())
}

fn ips(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("10.1.0.{}", 10 + i)).collect()
}

/// The KuryrLoadBalancer status once it records `listeners` listeners with `members` members in all.
async fn recorded(
    kube: &Client,
    ns: &str,
    name: &str,
    listeners: usize,
    members: usize,
) -> Result<KuryrLoadBalancerStatus> {
    let api = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), ns);
    eventually(
        &format!("KuryrLoadBalancer {ns}/{name} with {listeners} listeners and {members} members"),
        WAIT,
        || async {
            let Some(klb) = api.get_opt(name).await? else {
                return Ok(None);
            };
            let Some(st) = klb.status else { return Ok(None) };
            let ok =
                st.loadbalancer.is_some() && st.listeners.len() == listeners && st.members.len() == members;
            Ok(ok.then_some(st))
        },
    )
    .await
}

/// The members Octavia holds in the load balancer's pools, as (address, port).
async fn octavia_members(client: &OctaviaClient, lb_id: &str) -> Result<BTreeSet<(String, u16)>> {
    let tree = client.get_status_tree(lb_id).await?;
    Ok(tree
        .loadbalancer
        .listeners
        .iter()
        .flat_map(|l| &l.pools)
        .flat_map(|p| &p.members)
        .map(|m| (m.address.clone(), m.protocol_port))
        .collect())
}

async fn lbs_named(client: &OctaviaClient, name: &str) -> Result<Vec<kuryr_neutron::octavia::LoadBalancer>> {
    Ok(client
        .list_load_balancers(&ListFilter::new().name(name.to_string()))
        .await?
        .into_iter()
        .filter(|lb| lb.provisioning_status != "DELETED")
        .collect())
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..6])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_becomes_one_load_balancer_that_follows_its_endpoints_and_ports() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        let ns = unique("svc");
        let bed = Bed::new(&ns).await?;
        let _ctrl = bed.controller(&oct, "", "svc-lifecycle");
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.10", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(3), &[("http", 8080)]).await?;

        let st = recorded(kube, &ns, "web", 1, 3).await.context(oct.name)?;
        let lb = st.loadbalancer.clone().unwrap();
        assert_eq!(lb.ip, "10.96.0.10", "{}: VIP is the clusterIP", oct.name);
        assert_eq!(lb.name, format!("{ns}/web"));
        let want: BTreeSet<_> = ips(3).into_iter().map(|ip| (ip, 8080)).collect();
        assert_eq!(octavia_members(&oct.client, &lb.id).await?, want, "{}", oct.name);
        let live = oct.client.get_load_balancer(&lb.id).await?;
        assert_eq!(live.provisioning_status, "ACTIVE", "{}", oct.name);
        assert!(
            live.tags.contains(&format!("kuryr-rs.cluster={ns}")),
            "{}: {:?}",
            oct.name,
            live.tags
        );
        if let Some(emu) = &oct.emulator {
            // A new Service is ONE fully populated create.
            let s = emu.stats();
            assert_eq!(s.count("loadbalancer.create"), 1, "{s:?}");
            assert_eq!(
                s.count("listener.create") + s.count("pool.create") + s.count("member.create"),
                0,
                "{s:?}"
            );
            emu.reset_stats();
        }

        // Scale to 5, then 1: members follow, one batch update per change.
        set_endpoints(kube, &ns, "web", &ips(5), &[("http", 8080)]).await?;
        let st = recorded(kube, &ns, "web", 1, 5).await.context(oct.name)?;
        assert_eq!(
            octavia_members(&oct.client, &lb.id).await?.len(),
            5,
            "{}",
            oct.name
        );
        assert_eq!(
            st.loadbalancer.as_ref().map(|l| l.id.as_str()),
            Some(lb.id.as_str())
        );
        set_endpoints(kube, &ns, "web", &ips(1), &[("http", 8080)]).await?;
        recorded(kube, &ns, "web", 1, 1).await.context(oct.name)?;
        let want: BTreeSet<_> = ips(1).into_iter().map(|ip| (ip, 8080)).collect();
        assert_eq!(octavia_members(&oct.client, &lb.id).await?, want, "{}", oct.name);
        if let Some(emu) = &oct.emulator {
            let s = emu.stats();
            assert_eq!(s.count("member.batch_update"), 2, "{s:?}");
            assert_eq!(s.count("loadbalancer.create"), 0, "{s:?}");
        }

        // A second port adds a listener with its pool and members.
        let svcs = Api::<Service>::namespaced(kube.clone(), &ns);
        let patch = json!({"spec": {"ports": [
            {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
            {"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]}});
        svcs.patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        set_endpoints(kube, &ns, "web", &ips(1), &[("http", 8080), ("https", 8443)]).await?;
        recorded(kube, &ns, "web", 2, 2).await.context(oct.name)?;
        let tree = oct.client.get_status_tree(&lb.id).await?;
        assert_eq!(tree.loadbalancer.listeners.len(), 2, "{}", oct.name);

        // Deleting the Service removes everything from Octavia, then the objects themselves.
        svcs.delete("web", &DeleteParams::default()).await?;
        eventually(&format!("{}: Service gone", oct.name), WAIT, || async {
            Ok(svcs.get_opt("web").await?.is_none().then_some(()))
        })
        .await?;
        let gone = oct.client.get_load_balancer(&lb.id).await;
        assert!(
            matches!(&gone, Err(e) if e.is_not_found())
                || gone.as_ref().is_ok_and(|l| l.provisioning_status == "DELETED"),
            "{}: load balancer still there: {gone:?}",
            oct.name
        );
        let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
        assert!(klbs.get_opt("web").await?.is_none());
    }
    Ok(())
}

/// `sessionAffinity` turned on and off again on a live Service reaches its pool (session persistence
/// SOURCE_IP, then none) with one pool update each, the same load balancer kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_affinity_change_reaches_the_pool() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        let ns = unique("affinity");
        let bed = Bed::new(&ns).await?;
        let _ctrl = bed.controller(&oct, "", "svc-affinity");
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.11", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(2), &[("http", 8080)]).await?;
        let st = recorded(kube, &ns, "web", 1, 2).await.context(oct.name)?;
        let lb_id = st.loadbalancer.clone().unwrap().id;
        let pool_id = st.pools[0].id.clone();
        let persistence = || async {
            let p = oct.client.get_pool(&pool_id).await?;
            Ok::<_, anyhow::Error>(
                p.session_persistence
                    .as_ref()
                    .and_then(|sp| sp["type"].as_str().map(str::to_string)),
            )
        };
        assert_eq!(persistence().await?, None, "{}", oct.name);
        if let Some(emu) = &oct.emulator {
            emu.reset_stats();
        }
        let svcs = Api::<Service>::namespaced(kube.clone(), &ns);
        let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
        for (affinity, want) in [("ClientIP", Some("SOURCE_IP")), ("None", None)] {
            let patch = json!({"spec": {"sessionAffinity": affinity}});
            svcs.patch("web", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let recorded_as = want.unwrap_or("NONE");
            eventually(&format!("{}: {affinity} recorded", oct.name), WAIT, || async {
                let klb = klbs.get("web").await?;
                let pools = klb.status.map(|s| s.pools).unwrap_or_default();
                Ok(pools
                    .first()
                    .filter(|p| p.session_persistence.as_deref() == Some(recorded_as))
                    .map(|_| ()))
            })
            .await?;
            assert_eq!(persistence().await?.as_deref(), want, "{}: {affinity}", oct.name);
        }
        let st = recorded(kube, &ns, "web", 1, 2).await.context(oct.name)?;
        assert_eq!(st.loadbalancer.map(|l| l.id), Some(lb_id), "{}", oct.name);
        assert_eq!(st.pools[0].id, pool_id, "{}: the pool is kept", oct.name);
        if let Some(emu) = &oct.emulator {
            let s = emu.stats();
            assert_eq!(s.count("pool.update"), 2, "{s:?}");
            assert_eq!(
                s.count("pool.create") + s.count("loadbalancer.create"),
                0,
                "{s:?}"
            );
            // A provider that refuses the change: the pool keeps what it has, and an endpoints
            // change made with it still reaches the members.
            emu.set_faults(octavia_emulator::FaultConfig {
                rules: vec![octavia_emulator::FaultRule {
                    operation: "pool.update".into(),
                    status: Some(400),
                    count: None,
                    delay_ms: 0,
                }],
            });
            let patch = json!({"spec": {"sessionAffinity": "ClientIP"}});
            svcs.patch("web", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            set_endpoints(kube, &ns, "web", &ips(3), &[("http", 8080)]).await?;
            let st = recorded(kube, &ns, "web", 1, 3).await.context(oct.name)?;
            assert_eq!(st.pools[0].session_persistence.as_deref(), Some("NONE"));
            assert_eq!(persistence().await?, None);
            // ...and the Service's owner is told why its affinity did not change.
            let note = warning_note(kube, &ns, "web", Some("KuryrSessionAffinityUnsupported")).await?;
            assert!(note.contains("80/TCP"), "{note}");
            emu.set_faults(octavia_emulator::FaultConfig::default());
        }
    }
    Ok(())
}

/// A Service without a selector (an outside database, say) is served from the EndpointSlices its owner writes
/// by hand: every ready address of every slice labelled with its name is a member, and changing or deleting a
/// slice changes the members (upstream served such Services from their Endpoints too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_a_selector_is_served_from_its_manual_endpoint_slices() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        let ns = unique("nosel");
        let bed = Bed::new(&ns).await?;
        let _ctrl = bed.controller(&oct, "", "svc-nosel");
        let kube = bed.client();
        let mut manifest = service_manifest(&ns, "db", "10.96.0.17", &[("pg", 5432, 5432, "TCP")]);
        if let Some(spec) = manifest["spec"].as_object_mut() {
            spec.remove("selector");
        }
        let svc: Service = serde_json::from_value(manifest)?;
        assert!(svc.spec.as_ref().is_some_and(|s| s.selector.is_none()));
        let svcs = Api::<Service>::namespaced(kube.clone(), &ns);
        svcs.create(&PostParams::default(), &svc).await?;
        // Hand-written slices: bare addresses (no Pod behind them), one not ready.
        let addr = |ip: &str, ready: bool| json!({"addresses": [ip], "conditions": {"ready": ready}});
        write_slice(
            kube,
            &ns,
            "db",
            "db-a",
            vec![addr("192.168.50.1", true), addr("192.168.50.2", true)],
            &[("pg", 5432)],
        )
        .await?;
        write_slice(
            kube,
            &ns,
            "db",
            "db-b",
            vec![addr("192.168.50.3", true), addr("192.168.50.4", false)],
            &[("pg", 5432)],
        )
        .await?;
        let members = |ips: &[&str]| -> BTreeSet<(String, u16)> {
            ips.iter().map(|ip| (ip.to_string(), 5432)).collect()
        };

        let st = recorded(kube, &ns, "db", 1, 3).await.context(oct.name)?;
        let lb = st.loadbalancer.clone().context("load balancer")?;
        assert_eq!(lb.ip, "10.96.0.17", "{}", oct.name);
        assert_eq!(
            octavia_members(&oct.client, &lb.id).await?,
            members(&["192.168.50.1", "192.168.50.2", "192.168.50.3"]),
            "{}",
            oct.name
        );

        // One address replaced in a slice: the members follow, on the same load balancer.
        write_slice(
            kube,
            &ns,
            "db",
            "db-a",
            vec![addr("192.168.50.1", true), addr("192.168.50.5", true)],
            &[("pg", 5432)],
        )
        .await?;
        let want = members(&["192.168.50.1", "192.168.50.3", "192.168.50.5"]);
        eventually(&format!("{}: members follow db-a", oct.name), WAIT, || async {
            Ok((octavia_members(&oct.client, &lb.id).await? == want).then_some(()))
        })
        .await?;

        // A slice deleted: its members go.
        Api::<EndpointSlice>::namespaced(kube.clone(), &ns)
            .delete("db-b", &DeleteParams::default())
            .await?;
        let st = recorded(kube, &ns, "db", 1, 2).await.context(oct.name)?;
        assert_eq!(st.loadbalancer.map(|l| l.id), Some(lb.id.clone()));
        assert_eq!(
            octavia_members(&oct.client, &lb.id).await?,
            members(&["192.168.50.1", "192.168.50.5"]),
            "{}",
            oct.name
        );
    }
    Ok(())
}

/// `[octavia_defaults] member_mode`, as upstream: L3 (the default) puts members on the service subnet (the
/// VIP's, Octavia routes to the pods); L2 on the pod's own subnet, found through the subnet driver. The VIP
/// stays on the service subnet either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_mode_l2_puts_members_on_the_pod_subnet_and_l3_on_the_service_subnet() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    for mode in ["L3", "L2"] {
        let ns = unique("mode");
        let bed = Bed::new(&ns).await?;
        let (pod_subnet, svc_subnet) = (bed.fx.subnet.clone(), bed.fx.subnets[1].subnet.clone());
        // The service subnet stands for the worker nodes' here: 10.96.0.77 is a host-network
        // backend's address; 192.168.9.9 (a hand-written slice's) is on no subnet kuryr knows.
        let _ctrl = bed.controller(
            &oct,
            &format!(
                "[octavia_defaults]\nmember_mode = {mode}\n[pod_vif_nested]\nworker_nodes_subnets = {svc_subnet}\n"
            ),
            &format!("svc-mode-{mode}"),
        );
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.18", &[("http", 80, 8080, "TCP")]).await?;
        let mut backends = ips(2);
        backends.extend(["10.96.0.77".to_string(), "192.168.9.9".to_string()]);
        set_endpoints(kube, &ns, "web", &backends, &[("http", 8080)]).await?;
        let (members, want): (usize, Vec<(&str, &str)>) = if mode == "L2" {
            (
                3,
                vec![
                    ("10.1.0.10", &pod_subnet),
                    ("10.1.0.11", &pod_subnet),
                    ("10.96.0.77", &svc_subnet),
                ],
            )
        } else {
            (
                4,
                backends
                    .iter()
                    .map(|ip| (ip.as_str(), svc_subnet.as_str()))
                    .collect(),
            )
        };
        let st = recorded(kube, &ns, "web", 1, members).await.context(mode)?;
        let lb = st.loadbalancer.clone().context("load balancer")?;
        assert_eq!(lb.subnet_id, svc_subnet, "{mode}: the VIP subnet");
        let mut recorded: Vec<(&str, &str)> = st
            .members
            .iter()
            .map(|m| (m.ip.as_str(), m.subnet_id.as_str()))
            .collect();
        recorded.sort();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        assert_eq!(recorded, want_sorted, "{mode}");
        // What Octavia itself holds, not only what the status says.
        let pool = st.pools.first().context("pool")?;
        let mut live: Vec<(String, String)> = oct
            .client
            .list_members(&pool.id, &ListFilter::new())
            .await?
            .into_iter()
            .map(|m| (m.address, m.subnet_id.unwrap_or_default()))
            .collect();
        live.sort();
        let want_live: Vec<(String, String)> = want_sorted
            .iter()
            .map(|(a, s)| (a.to_string(), s.to_string()))
            .collect();
        assert_eq!(live, want_live, "{mode}");
        if mode == "L2" {
            let note = warning_note(kube, &ns, "web", Some("KuryrSkipMember")).await?;
            assert!(
                note.contains("192.168.9.9") && !note.contains("10.96.0.77"),
                "{note}"
            );
        }
    }
    Ok(())
}

/// Writes a KuryrNetwork for `ns` whose status names `subnet`, as the kuryrnetwork handler would.
async fn write_kuryrnetwork(kube: &Client, ns: &str, subnet: &str) -> Result<()> {
    let api = Api::<KuryrNetwork>::namespaced(kube.clone(), ns);
    // The CRD has no status subresource (upstream's): the status is written with the object.
    if api.get_opt(ns).await?.is_some() {
        let status = json!({"status": {"subnetId": subnet, "netId": "n"}});
        api.patch(ns, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        return Ok(());
    }
    let kn: KuryrNetwork = serde_json::from_value(json!({
        "apiVersion": "openstack.org/v1", "kind": "KuryrNetwork",
        "metadata": {"name": ns, "namespace": ns},
        "spec": {"nsName": ns, "projectId": "p", "nsLabels": {}},
        "status": {"subnetId": subnet, "netId": "n"},
    }))?;
    api.create(&PostParams::default(), &kn).await?;
    Ok(())
}

/// L2 member mode with per-namespace subnets: an endpoint in a namespace that has no network yet
/// (no KuryrNetwork: one is asked for, as the namespace holds a pod) is left out, with a
/// `KuryrSkipMember` Event naming it and the namespace, and the others are served at once; it
/// becomes a member when its namespace's network appears (the pass is retried for it). One such
/// endpoint held up the whole load balancer; one naming a namespace that does not exist is left
/// out for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_whose_namespace_has_no_network_yet_waits_alone_in_l2_mode() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let ns = unique("l2ns");
    let other = format!("{ns}-other");
    let bed = Bed::new(&ns).await?;
    let (pod_subnet, svc_subnet) = (bed.fx.subnet.clone(), bed.fx.subnets[1].subnet.clone());
    let kube = bed.client();
    create_namespace(kube, &other, json!({})).await?;
    write_kuryrnetwork(kube, &ns, &pod_subnet).await?;
    let _ctrl = bed.controller(
        &oct,
        "[kubernetes]\npod_subnets_driver = namespace\n[octavia_defaults]\nmember_mode = L2\n",
        "svc-l2ns",
    );
    create_service(kube, &ns, "web", "10.96.0.21", &[("http", 80, 8080, "TCP")]).await?;
    let endpoint = |ip: &str, pod: &str, pod_ns: &str| {
        json!({
            "addresses": [ip], "conditions": {"ready": true},
            "targetRef": {"kind": "Pod", "name": pod, "namespace": pod_ns}
        })
    };
    write_slice(
        kube,
        &ns,
        "web",
        "web-a",
        vec![
            endpoint("10.1.0.10", "web-0", &ns),
            endpoint("10.1.0.11", "web-1", &ns),
            endpoint("10.96.0.50", "far-0", &other),
            // A hand-written slice may name a namespace that does not exist: left out alike.
            endpoint("192.0.2.51", "ghost-0", &format!("{ns}-ghost")),
        ],
        &[("http", 8080)],
    )
    .await?;
    let st = recorded(kube, &ns, "web", 1, 2).await?;
    let mut on: Vec<(String, String)> = st
        .members
        .iter()
        .map(|m| (m.ip.clone(), m.subnet_id.clone()))
        .collect();
    on.sort();
    assert_eq!(
        on,
        [
            ("10.1.0.10".to_string(), pod_subnet.clone()),
            ("10.1.0.11".to_string(), pod_subnet.clone())
        ]
    );
    let note = warning_note(kube, &ns, "web", Some("KuryrSkipMember")).await?;
    assert!(note.contains("10.96.0.50") && note.contains(&other), "{note}");
    let asked = Api::<KuryrNetwork>::namespaced(kube.clone(), &other)
        .get_opt(&other)
        .await?
        .context("the endpoint's namespace got a KuryrNetwork asked for")?;
    assert_eq!(asked.spec.ns_name, other);

    // The namespace's network appears: its endpoint joins, on that subnet, with no other event.
    write_kuryrnetwork(kube, &other, &svc_subnet).await?;
    let st = recorded(kube, &ns, "web", 1, 3).await?;
    assert!(
        st.members
            .iter()
            .any(|m| m.ip == "10.96.0.50" && m.subnet_id == svc_subnet),
        "{:?}",
        st.members
    );
    Ok(())
}

/// `kubectl get klb` (the real kubectl, against the Kubernetes emulator's server-side tables) shows a
/// KuryrLoadBalancer the controller wrote with the CRD's printer columns: project, VIP, provider and the
/// Octavia load balancer's id (from the status, so only once it exists).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_klb_shows_project_vip_provider_and_load_balancer() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let ns = unique("klbcols");
    let bed = Bed::new(&ns).await?;
    let _ctrl = bed.controller(
        &oct,
        "[kubernetes]\nendpoints_driver_octavia_provider = amphora\n",
        "svc-klbcols",
    );
    let kube = bed.client();
    create_service(kube, &ns, "web", "10.96.0.19", &[("http", 80, 8080, "TCP")]).await?;
    let st = recorded(kube, &ns, "web", 1, 0).await?;
    let lb = st.loadbalancer.context("load balancer")?;

    let kubeconfig = std::env::temp_dir().join(format!("kuryr-{ns}.kubeconfig"));
    bed.kube.handle.write_kubeconfig(&kubeconfig)?;
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "klb", "-n", &ns])
        .env_remove("KUBECONFIG")
        .output();
    let _ = std::fs::remove_file(&kubeconfig);
    let out = match out {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var("KURYR_TEST_REQUIRE_KUBECTL").as_deref() != Ok("1"),
                "kubectl is not on PATH"
            );
            eprintln!("skipping: kubectl is not on PATH");
            return Ok(());
        }
        Err(e) => return Err(e).context("running kubectl"),
    };
    let table = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{table}");
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 2, "a header and one row: {table}");
    assert_eq!(
        rows[0],
        ["NAME", "PROJECT-ID", "VIP", "PROVIDER", "LB-ID", "AGE"],
        "{table}"
    );
    assert_eq!(
        rows[1][..5],
        [
            "web",
            bed.project.as_str(),
            "10.96.0.19",
            "amphora",
            lb.id.as_str()
        ],
        "{table}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_while_the_load_balancer_is_pending_create_leaves_exactly_one() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::AmphoraNoop).await? {
        let ns = unique("crash");
        let bed = Bed::new(&ns).await?;
        let ctrl = bed.controller(&oct, "", "svc-crash-1");
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.11", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(3), &[("http", 8080)]).await?;
        let name = format!("{ns}/web");
        eventually(&format!("{}: load balancer pending", oct.name), WAIT, || async {
            Ok(lbs_named(&oct.client, &name)
                .await?
                .into_iter()
                .find(|lb| lb.provisioning_status == "PENDING_CREATE")
                .map(|_| ()))
        })
        .await?;
        ctrl.kill().await;
        let _ctrl = bed.controller(&oct, "", "svc-crash-2");
        let st = recorded(kube, &ns, "web", 1, 3).await.context(oct.name)?;
        let lbs = lbs_named(&oct.client, &name).await?;
        assert_eq!(lbs.len(), 1, "{}: {lbs:?}", oct.name);
        assert_eq!(
            st.loadbalancer.map(|l| l.id),
            Some(lbs[0].id.clone()),
            "{}",
            oct.name
        );
        // Another cluster's load balancer for a Service of the same name in the same project:
        // not this cluster's to release with its own.
        let foreign = oct
            .client
            .create_load_balancer(&LoadBalancerCreate {
                name: Some(name.clone()),
                project_id: Some(bed.project.clone()),
                vip_subnet_id: Some(bed.fx.subnets[1].subnet.clone()),
                vip_address: Some("10.96.0.211".into()),
                provider: Some("amphora".into()),
                tags: vec![
                    "kuryr-rs".into(),
                    kuryr_crds::names::neutron::cluster_tag("another-cluster"),
                    format!("kuryr-rs.service={name}"),
                ],
                ..Default::default()
            })
            .await?;
        oct.client
            .wait_for_provisioning(&foreign.id, Provisioning::Active)
            .await?;
        Api::<Service>::namespaced(kube.clone(), &ns)
            .delete("web", &DeleteParams::default())
            .await?;
        // Released once the KuryrLoadBalancer's finalizer is off: by then the handler did all
        // it does.
        let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
        eventually(&format!("{}: load balancer released", oct.name), WAIT, || async {
            Ok(klbs.get_opt("web").await?.is_none().then_some(()))
        })
        .await?;
        let left = lbs_named(&oct.client, &name).await?;
        assert!(
            left.len() == 1 && left[0].id == foreign.id && left[0].provisioning_status == "ACTIVE",
            "{}: only the other cluster's load balancer is left, untouched: {left:?}",
            oct.name
        );
        oct.client.delete_load_balancer(&foreign.id, true).await?;
    }
    Ok(())
}

/// A load balancer a crashed controller left (or one still PENDING_CREATE at a restart) is
/// adopted with what Octavia has, not what the spec asks: a listener left with an older spec's
/// timeout and ACL, and a pool with session persistence the Service no longer asks for, are
/// brought to the spec (they were recorded as asked, and kept what they had).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_load_balancer_is_brought_to_the_spec_it_did_not_have() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        let ns = unique("stale-tree");
        let bed = Bed::new(&ns).await?;
        let kube = bed.client();
        let name = format!("{ns}/web");
        let left = oct
            .client
            .create_load_balancer(&LoadBalancerCreate {
                name: Some(name.clone()),
                project_id: Some(bed.project.clone()),
                vip_subnet_id: Some(bed.fx.subnets[1].subnet.clone()),
                vip_address: Some("10.96.0.18".into()),
                provider: Some("amphora".into()),
                tags: vec![
                    "kuryr-rs".into(),
                    kuryr_crds::names::neutron::cluster_tag(&ns),
                    format!("kuryr-rs.service={name}"),
                ],
                listeners: vec![ListenerCreate {
                    name: Some(format!("{name}:TCP:80")),
                    protocol: "TCP".into(),
                    protocol_port: 80,
                    allowed_cidrs: Some(vec!["192.0.2.0/24".into()]),
                    timeout_client_data: Some(1234),
                    default_pool: Some(Box::new(PoolCreate {
                        name: Some(format!("{name}:TCP:80")),
                        protocol: "TCP".into(),
                        lb_algorithm: "ROUND_ROBIN".into(),
                        session_persistence: Some(json!({"type": "SOURCE_IP"})),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .await?;
        oct.client
            .wait_for_provisioning(&left.id, Provisioning::Active)
            .await?;
        create_service(kube, &ns, "web", "10.96.0.18", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(1), &[("http", 8080)]).await?;
        let _ctrl = bed.controller(&oct, "", "svc-stale-tree");
        let st = recorded(kube, &ns, "web", 1, 1).await?;
        assert_eq!(
            st.loadbalancer.map(|l| l.id),
            Some(left.id.clone()),
            "{}: adopted",
            oct.name
        );
        let listener = st.listeners.first().map(|l| l.id.clone()).unwrap_or_default();
        let pool = st.pools.first().map(|p| p.id.clone()).unwrap_or_default();
        eventually(
            &format!("{}: the adopted tree as the spec asks", oct.name),
            WAIT,
            || async {
                let l = oct.client.get_listener(&listener).await?;
                let p = oct.client.get_pool(&pool).await?;
                let open = l.admin_state_up && l.allowed_cidrs.as_ref().is_none_or(Vec::is_empty);
                let timeout = l.timeout_client_data.is_none_or(|t| t == 50_000);
                let persistence = p
                    .session_persistence
                    .as_ref()
                    .is_none_or(serde_json::Value::is_null);
                Ok((open && timeout && persistence).then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_replaces_an_error_load_balancer_and_recreates_one_deleted_by_hand() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        let ns = unique("repair");
        let bed = Bed::new(&ns).await?;
        let _ctrl = bed.controller(&oct, "", "svc-repair");
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.12", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(2), &[("http", 8080)]).await?;
        let first = recorded(kube, &ns, "web", 1, 2)
            .await
            .context(oct.name)?
            .loadbalancer
            .unwrap()
            .id;

        // Deleted by hand: the periodic reconcile notices and the handler builds it again.
        oct.client.delete_load_balancer(&first, true).await?;
        let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
        let second = eventually(
            &format!("{}: re-created load balancer", oct.name),
            WAIT,
            || async {
                let st = klbs.get_opt("web").await?.and_then(|k| k.status);
                Ok(st
                    .and_then(|s| s.loadbalancer.filter(|_| s.members.len() == 2))
                    .map(|l| l.id)
                    .filter(|id| *id != first))
            },
        )
        .await?;
        assert_eq!(
            octavia_members(&oct.client, &second).await?.len(),
            2,
            "{}",
            oct.name
        );

        // ERROR (only the emulator can be told to fail): replaced by a new one.
        if let Some(emu) = &oct.emulator {
            emu.force_error(&second).map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let third = eventually("replacement of the ERROR load balancer", WAIT, || async {
                let st = klbs.get_opt("web").await?.and_then(|k| k.status);
                Ok(st
                    .and_then(|s| s.loadbalancer.filter(|_| s.members.len() == 2))
                    .map(|l| l.id)
                    .filter(|id| *id != second))
            })
            .await?;
            let lbs = lbs_named(&oct.client, &format!("{ns}/web")).await?;
            assert_eq!(lbs.iter().map(|l| l.id.clone()).collect::<Vec<_>>(), vec![third]);
        }
        Api::<Service>::namespaced(kube.clone(), &ns)
            .delete("web", &DeleteParams::default())
            .await?;
        eventually(&format!("{}: released", oct.name), WAIT, || async {
            Ok(lbs_named(&oct.client, &format!("{ns}/web"))
                .await?
                .is_empty()
                .then_some(()))
        })
        .await?;
    }
    Ok(())
}

/// A KuryrLoadBalancer as upstream kuryr-kubernetes 10.0.0 writes it, for a load balancer it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_kuryrloadbalancer_and_its_load_balancer_are_adopted() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        let ns = unique("adopt");
        let bed = Bed::new(&ns).await?;
        let kube = bed.client();
        let svc_subnet = bed.fx.subnets[1].subnet.clone();
        // Upstream's load balancer: its names, no kuryr-rs tags, one listener and pool, no members yet.
        let name = format!("{ns}/web");
        let listener = format!("{name}:TCP:80");
        let lb = oct
            .client
            .create_load_balancer(&LoadBalancerCreate {
                name: Some(name.clone()),
                project_id: Some(bed.project.clone()),
                vip_subnet_id: Some(svc_subnet.clone()),
                vip_address: Some("10.96.0.13".into()),
                provider: Some("amphora".into()),
                tags: vec!["k8s".into()],
                listeners: vec![ListenerCreate {
                    name: Some(listener.clone()),
                    default_pool: Some(Box::new(PoolCreate {
                        name: Some(listener.clone()),
                        ..PoolCreate::new("TCP", "ROUND_ROBIN")
                    })),
                    ..ListenerCreate::new("TCP", 80)
                }],
                ..Default::default()
            })
            .await?;
        oct.client
            .wait_for_provisioning(&lb.id, Provisioning::Active)
            .await?;
        let tree = oct.client.get_status_tree(&lb.id).await?;
        let l = &tree.loadbalancer.listeners[0];
        create_service(kube, &ns, "web", "10.96.0.13", &[("http", 80, 8080, "TCP")]).await?;
        let svc = Api::<Service>::namespaced(kube.clone(), &ns).get("web").await?;
        let klb: KuryrLoadBalancer = serde_json::from_value(json!({
            "apiVersion": "openstack.org/v1", "kind": "KuryrLoadBalancer",
            "metadata": {"name": "web", "namespace": ns,
                "finalizers": ["kuryr.openstack.org/kuryrloadbalancer-finalizers"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": svc.uid()}]},
            "spec": {"ip": "10.96.0.13", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "8080"}],
                "project_id": bed.project, "provider": "amphora", "security_groups_ids": [bed.fx.sg],
                "subnet_id": svc_subnet, "type": "ClusterIP"},
            "status": {
                "loadbalancer": {"id": lb.id, "ip": "10.96.0.13", "name": name, "port_id": lb.vip_port_id,
                    "project_id": bed.project, "provider": "amphora", "security_groups": [bed.fx.sg],
                    "subnet_id": svc_subnet},
                "listeners": [{"id": l.id, "loadbalancer_id": lb.id, "name": listener, "port": 80,
                    "project_id": bed.project, "protocol": "TCP"}],
                "pools": [{"id": l.pools[0].id, "listener_id": l.id, "loadbalancer_id": lb.id, "name": listener,
                    "project_id": bed.project, "protocol": "TCP"}]
            }
        }))?;
        let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
        klbs.create(&PostParams::default(), &klb).await?;
        set_endpoints(kube, &ns, "web", &ips(3), &[("http", 8080)]).await?;

        let _ctrl = bed.controller(&oct, "", "svc-adopt");
        let st = recorded(kube, &ns, "web", 1, 3).await.context(oct.name)?;
        assert_eq!(
            st.loadbalancer.map(|l| l.id),
            Some(lb.id.clone()),
            "{}: adopted, not replaced",
            oct.name
        );
        assert_eq!(lbs_named(&oct.client, &name).await?.len(), 1, "{}", oct.name);
        assert_eq!(
            octavia_members(&oct.client, &lb.id).await?.len(),
            3,
            "{}",
            oct.name
        );
        // The periodic check gives it kuryr-rs' tags (the orphan sweep finds it by them), keeping upstream's.
        let want = [
            format!("kuryr-rs.cluster={ns}"),
            format!("kuryr-rs.service={ns}/web"),
            "k8s".into(),
        ];
        eventually(
            &format!("{}: adopted load balancer tagged", oct.name),
            WAIT,
            || async {
                let live = oct.client.get_load_balancer(&lb.id).await?;
                Ok(want.iter().all(|t| live.tags.contains(t)).then_some(()))
            },
        )
        .await?;
        Api::<Service>::namespaced(kube.clone(), &ns)
            .delete("web", &DeleteParams::default())
            .await?;
        eventually(&format!("{}: released", oct.name), WAIT, || async {
            Ok(lbs_named(&oct.client, &name).await?.is_empty().then_some(()))
        })
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_ip_outside_the_service_subnet_is_a_warning_event_naming_the_field() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let ns = unique("bad");
    let bed = Bed::new(&ns).await?;
    let _ctrl = bed.controller(&oct, "", "svc-bad");
    let kube = bed.client();
    create_service(kube, &ns, "stray", "10.55.0.10", &[("http", 80, 8080, "TCP")]).await?;
    create_service(kube, &ns, "good", "10.96.0.14", &[("http", 80, 8080, "TCP")]).await?;
    let note = warning_note(kube, &ns, "stray", None).await?;
    assert!(note.contains("spec.clusterIP"), "{note}");
    // The other Service is unaffected.
    recorded(kube, &ns, "good", 1, 0).await?;
    Ok(())
}

/// A port the provider cannot serve (its driver answers 501, as a provider without a protocol does) gets a
/// Warning Event naming it; the Service's other ports, and the other Services, are served. Emulator only: the
/// real providers here serve every Kubernetes protocol (amphora in Octavia 19 and ovn in ovn-octavia-provider
/// 11 both take TCP, UDP and SCTP: ovn_octavia_provider/common/constants.py OVN_NATIVE_LB_PROTOCOLS), so only
/// an injected refusal can show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_the_provider_refuses_is_a_warning_event_and_the_other_ports_are_served() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let emu = oct.emulator.as_ref().expect("the first target is the emulator");
    let ns = unique("refused");
    let bed = Bed::new(&ns).await?;
    let _ctrl = bed.controller(&oct, "", "svc-refused");
    let kube = bed.client();
    // The other Service is served before the refusals are armed: the emulator's faults match operations,
    // not Services, so one armed earlier could land on either Service's create.
    create_service(kube, &ns, "plain", "10.96.0.16", &[("web", 80, 8080, "TCP")]).await?;
    set_endpoints(kube, &ns, "plain", &ips(2), &[("web", 8080)]).await?;
    let plain = recorded(kube, &ns, "plain", 1, 2).await?;
    let refusal = |op: &str| octavia_emulator::FaultRule {
        operation: op.to_string(),
        status: Some(501),
        count: Some(1),
        delay_ms: 0,
    };
    // The fully populated create is refused, then the first listener (TCP/80 comes first) on its own.
    emu.set_faults(octavia_emulator::FaultConfig {
        rules: vec![refusal("loadbalancer.create"), refusal("listener.create")],
    });
    create_service(
        kube,
        &ns,
        "mixed",
        "10.96.0.15",
        &[("web", 80, 8080, "TCP"), ("dns", 53, 5353, "UDP")],
    )
    .await?;
    // The other Service keeps following its endpoints while the refused one is handled.
    set_endpoints(kube, &ns, "plain", &ips(3), &[("web", 8080)]).await?;
    let st = recorded(kube, &ns, "mixed", 1, 0).await?;
    assert_eq!(st.listeners[0].protocol, "UDP", "{:?}", st.listeners);
    assert_eq!(st.listeners[0].port, 53);
    let note = warning_note(kube, &ns, "mixed", Some("KuryrServicePortUnsupported")).await?;
    assert!(note.contains("80/TCP"), "{note}");
    // Not asked again: a later change plans nothing for it (the two listener creates are the refused one and
    // UDP/53's).
    set_endpoints(kube, &ns, "mixed", &ips(2), &[("dns", 5353)]).await?;
    recorded(kube, &ns, "mixed", 1, 2).await?;
    assert_eq!(emu.stats().count("listener.create"), 2, "{:?}", emu.stats());
    // The user changes what the Service asks (here a timeout annotation): asked again, and served now
    // that Octavia takes it.
    let annotate = json!({"metadata": {"annotations": {"openstack.org/kuryr-timeout-client-data": "60000"}}});
    Api::<Service>::namespaced(kube.clone(), &ns)
        .patch("mixed", &PatchParams::default(), &Patch::Merge(&annotate))
        .await?;
    let st = recorded(kube, &ns, "mixed", 2, 2).await?;
    assert!(
        st.listeners.iter().any(|l| l.protocol == "TCP" && l.port == 80),
        "{:?}",
        st.listeners
    );
    assert_eq!(emu.stats().count("listener.create"), 3, "{:?}", emu.stats());
    // Back to what was refused before: asked again (the listener served now is updated, not
    // dropped as still refused).
    let back = json!({"metadata": {"annotations": {"openstack.org/kuryr-timeout-client-data": null}}});
    Api::<Service>::namespaced(kube.clone(), &ns)
        .patch("mixed", &PatchParams::default(), &Patch::Merge(&back))
        .await?;
    let api = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
    eventually("TCP/80 served without the timeout", WAIT, || async {
        let st = api.get("mixed").await?.status.unwrap_or_default();
        let tcp = st.listeners.iter().find(|l| l.protocol == "TCP" && l.port == 80);
        Ok(tcp
            .is_some_and(|l| l.timeout_client_data != Some(60000))
            .then_some(()))
    })
    .await?;
    assert_eq!(emu.stats().count("listener.create"), 3, "{:?}", emu.stats());

    // The other Service: the same load balancer, ACTIVE, its one listener with the 3 members, no Warning.
    let st = recorded(kube, &ns, "plain", 1, 3).await?;
    let lb = st.loadbalancer.clone().context("plain's load balancer")?;
    assert_eq!(
        Some(&lb.id),
        plain.loadbalancer.as_ref().map(|l| &l.id),
        "replaced"
    );
    assert_eq!(
        oct.client.get_load_balancer(&lb.id).await?.provisioning_status,
        "ACTIVE"
    );
    let tree = oct.client.get_status_tree(&lb.id).await?;
    let listeners: Vec<_> = tree
        .loadbalancer
        .listeners
        .iter()
        .map(|l| l.name.clone())
        .collect();
    assert_eq!(listeners, [format!("{ns}/plain:TCP:80")]);
    let want: BTreeSet<_> = ips(3).into_iter().map(|ip| (ip, 8080)).collect();
    assert_eq!(octavia_members(&oct.client, &lb.id).await?, want);
    let plain_warnings = warnings(kube, &ns, "plain").await?;
    assert!(plain_warnings.is_empty(), "{plain_warnings:?}");
    Ok(())
}

/// A pool the provider refuses (a driver's 501, as the amphora one answers for an algorithm it has
/// not) refuses its port as a refused listener does: the listener made for it goes again (it would
/// serve nothing), a Warning Event names the port, the Service's other ports are served, and the
/// pool is not asked for again while the Service asks the same, also when the pass that met the
/// refusal failed later. Emulator only, as the listener case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_the_provider_refuses_refuses_its_port_and_is_not_asked_again() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let emu = oct.emulator.as_ref().expect("the first target is the emulator");
    let ns = unique("poolref");
    let bed = Bed::new(&ns).await?;
    let _ctrl = bed.controller(&oct, "", "svc-poolref");
    let kube = bed.client();
    let refusal = |op: &str| octavia_emulator::FaultRule {
        operation: op.to_string(),
        status: Some(501),
        count: Some(1),
        delay_ms: 0,
    };
    // The fully populated create is refused, then the first port's pool (TCP/80 comes first), and
    // the second port's pool create fails (500): the pass fails after the refusal, which holds.
    let failure = octavia_emulator::FaultRule {
        status: Some(500),
        ..refusal("pool.create")
    };
    emu.set_faults(octavia_emulator::FaultConfig {
        rules: vec![refusal("loadbalancer.create"), refusal("pool.create"), failure],
    });
    create_service(
        kube,
        &ns,
        "mixed",
        "10.96.0.18",
        &[("web", 80, 8080, "TCP"), ("dns", 53, 5353, "UDP")],
    )
    .await?;
    let st = recorded(kube, &ns, "mixed", 1, 0).await?;
    assert_eq!(
        (st.listeners[0].protocol.as_str(), st.listeners[0].port),
        ("UDP", 53)
    );
    let note = warning_note(kube, &ns, "mixed", Some("KuryrServicePortUnsupported")).await?;
    assert!(note.contains("80/TCP") && note.contains("its pool"), "{note}");
    // The failed pass retried: UDP/53 gets its pool (members need one), TCP/80 is not asked again.
    set_endpoints(kube, &ns, "mixed", &ips(2), &[("web", 8080), ("dns", 5353)]).await?;
    let st = recorded(kube, &ns, "mixed", 1, 2).await?;
    let lb = st.loadbalancer.clone().context("the load balancer")?;
    let tree = oct.client.get_status_tree(&lb.id).await?;
    let listeners: Vec<_> = tree
        .loadbalancer
        .listeners
        .iter()
        .map(|l| (l.name.clone(), l.pools.len()))
        .collect();
    assert_eq!(
        listeners,
        [(format!("{ns}/mixed:UDP:53"), 1)],
        "the refused port's listener went"
    );
    let s = emu.stats();
    assert_eq!((s.count("pool.create"), s.faults_injected), (3, 3), "{s:?}");
    assert_eq!(s.count("listener.create"), 2, "{s:?}");
    // Nor for an endpoint change.
    set_endpoints(kube, &ns, "mixed", &ips(3), &[("web", 8080), ("dns", 5353)]).await?;
    recorded(kube, &ns, "mixed", 1, 3).await?;
    assert_eq!(emu.stats().count("pool.create"), 3, "{:?}", emu.stats());
    Ok(())
}

/// A pass that fails after making a listener (Octavia refused its pool once) leaves that listener in
/// Octavia but not in the record: the next pass reads the tree back and adds the pool to it, where
/// planning from the old record would create the listener again, which Octavia refuses (409, the
/// port is taken) at every retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_made_by_a_failed_pass_is_recorded_not_created_again() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let emu = oct.emulator.as_ref().expect("the first target is the emulator");
    let ns = unique("half");
    let bed = Bed::new(&ns).await?;
    let _ctrl = bed.controller(&oct, "", "svc-half");
    let kube = bed.client();
    create_service(kube, &ns, "grow", "10.96.0.17", &[("http", 80, 8080, "TCP")]).await?;
    set_endpoints(kube, &ns, "grow", &ips(2), &[("http", 8080)]).await?;
    recorded(kube, &ns, "grow", 1, 2).await?;
    let made = |s: &octavia_emulator::Stats| s.count("listener.create");
    let before = made(&emu.stats());
    emu.set_faults(octavia_emulator::FaultConfig {
        rules: vec![octavia_emulator::FaultRule {
            operation: "pool.create".into(),
            status: Some(500),
            count: Some(1),
            delay_ms: 0,
        }],
    });
    let patch = json!({"spec": {"ports": [
        {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
        {"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]}});
    Api::<Service>::namespaced(kube.clone(), &ns)
        .patch("grow", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    set_endpoints(kube, &ns, "grow", &ips(2), &[("http", 8080), ("https", 8443)]).await?;
    let st = recorded(kube, &ns, "grow", 2, 4).await?;
    let s = emu.stats();
    assert_eq!(s.faults_injected, 1, "the pool was refused once: {s:?}");
    assert_eq!(made(&s) - before, 1, "the new listener made once: {s:?}");
    let lb = st.loadbalancer.context("the load balancer")?;
    let tree = oct.client.get_status_tree(&lb.id).await?;
    assert!(
        tree.loadbalancer.listeners.iter().all(|l| l.pools.len() == 1),
        "every listener has its pool: {tree:?}"
    );
    // No endpoints left: the record says so too (a merge patch would keep the old members).
    set_endpoints(kube, &ns, "grow", &[], &[("http", 8080), ("https", 8443)]).await?;
    recorded(kube, &ns, "grow", 2, 0).await?;
    assert_eq!(octavia_members(&oct.client, &lb.id).await?, BTreeSet::new());
    Ok(())
}

/// A served Service turned into one kuryr does not serve (here ExternalName) loses its load balancer, and
/// gets one `KuryrServiceSkipped` Event saying why, as upstream's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_turned_external_name_loses_its_load_balancer() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let ns = unique("extname");
    let bed = Bed::new(&ns).await?;
    let _ctrl = bed.controller(&oct, "", "svc-extname");
    let kube = bed.client();
    create_service(kube, &ns, "away", "10.96.0.18", &[("http", 80, 8080, "TCP")]).await?;
    set_endpoints(kube, &ns, "away", &ips(1), &[("http", 8080)]).await?;
    let st = recorded(kube, &ns, "away", 1, 1).await?;
    let lb = st.loadbalancer.context("the load balancer")?;
    let patch = json!({"spec": {"type": "ExternalName", "externalName": "db.example.org", "clusterIP": null,
                                "selector": null}});
    Api::<Service>::namespaced(kube.clone(), &ns)
        .patch("away", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
    eventually("the KuryrLoadBalancer gone", WAIT, || async {
        Ok(klbs.get_opt("away").await?.is_none().then_some(()))
    })
    .await?;
    eventually("the load balancer gone", WAIT, || async {
        Ok(oct
            .client
            .get_load_balancer(&lb.id)
            .await
            .err()
            .filter(|e| e.is_not_found())
            .map(|_| ()))
    })
    .await?;
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(kube.clone(), &ns);
    let skipped: Vec<_> = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("KuryrServiceSkipped"))
        .filter_map(|e| e.note)
        .collect();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0].contains("unsupported type ExternalName"),
        "{skipped:?}"
    );
    Ok(())
}

/// Octavia's network driver on the test's Neutron emulator: VIP ports exist there, so floating IPs can be
/// associated with them (the lab's Octavia runs the noop network driver and makes none).
#[derive(Debug)]
struct NeutronVipPorts(neutron_emulator::PortControl);

impl octavia_emulator::VipPorts for NeutronVipPorts {
    fn create(
        &self,
        lb_id: &str,
        project_id: &str,
        subnet_id: &str,
        address: &str,
    ) -> Result<String, String> {
        let port = self.0.create(&json!({"port": {
            "name": format!("octavia-lb-{lb_id}"), "project_id": project_id,
            "device_owner": "Octavia", "device_id": format!("lb-{lb_id}"),
            "fixed_ips": [{"subnet_id": subnet_id, "ip_address": address}],
        }}))?;
        port["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| "port without id".to_string())
    }

    fn delete(&self, port_id: &str) {
        let _ = self.0.delete(port_id);
    }
}

/// The external side of LoadBalancer Services on the bed's Neutron emulator: an external network and subnet,
/// and a router joining it to the service subnet (Neutron associates a floating IP only through one).
struct External {
    network: String,
    octavia: OctaviaTarget,
}

async fn external(bed: &Bed) -> Result<External> {
    use kuryr_neutron::{NetworkCreate, RouterCreate, RouterInterfaceSpec, SubnetCreate};
    let n = &bed.neutron.client;
    let project = Some(bed.fx.project.clone());
    let net = n
        .create_network(&NetworkCreate {
            name: Some("public".into()),
            project_id: project.clone(),
            router_external: Some(true),
            ..Default::default()
        })
        .await?;
    n.create_subnet(&SubnetCreate {
        network_id: net.id.clone(),
        ip_version: 4,
        cidr: Some("172.24.4.0/24".into()),
        project_id: project.clone(),
        ..Default::default()
    })
    .await?;
    let router = n
        .create_router(&RouterCreate {
            project_id: project,
            external_gateway_info: Some(json!({"network_id": net.id})),
            ..Default::default()
        })
        .await?;
    n.add_router_interface(
        &router.id,
        &RouterInterfaceSpec::Subnet {
            subnet_id: bed.fx.subnets[1].subnet.clone(),
        },
    )
    .await?;
    let ports = bed
        .neutron
        .emulator()
        .context("the bed's Neutron is the emulator")?
        .port_control();
    let emu = OctaviaEmulator::start(OctaviaOptions {
        vip_ports: Some(std::sync::Arc::new(NeutronVipPorts(ports))),
        ..OctaviaOptions::default()
    })
    .await?;
    Ok(External {
        network: net.id,
        octavia: OctaviaTarget {
            name: "emulator",
            client: OctaviaClient::new(&ClientOptions::noauth(emu.url()))?,
            emulator: Some(emu),
        },
    })
}

async fn create_lb_service(kube: &Client, ns: &str, name: &str, ip: &str, lb_ip: Option<&str>) -> Result<()> {
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"type": "LoadBalancer", "clusterIP": ip, "loadBalancerIP": lb_ip, "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    }))?;
    Api::<Service>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await?;
    Ok(())
}

/// The KuryrLoadBalancer status once it records a public IP.
async fn public_ip(
    kube: &Client,
    ns: &str,
    name: &str,
) -> Result<(KuryrLoadBalancerStatus, kuryr_crds::LbPubIpInfo)> {
    let api = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), ns);
    eventually(&format!("{ns}/{name} with a public IP"), WAIT, || async {
        let st = api.get_opt(name).await?.and_then(|k| k.status);
        Ok(st.and_then(|s| s.service_pub_ip_info.clone().map(|i| (s, i))))
    })
    .await
}

async fn ingress(kube: &Client, ns: &str, name: &str) -> Result<Vec<String>> {
    let svc = Api::<Service>::namespaced(kube.clone(), ns).get(name).await?;
    Ok(svc
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| i.ip)
        .collect())
}

/// A LoadBalancer Service of another `loadBalancerClass` is served as its cluster IP only: its load balancer
/// is made, but no floating IP, and its `status.loadBalancer` (the other implementation's) is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_service_of_another_class_gets_no_floating_ip() -> Result<()> {
    init_logs();
    let ns = unique("lbclass");
    let bed = Bed::new(&ns).await?;
    let ext = external(&bed).await?;
    let kube = bed.client();
    let svcs = Api::<Service>::namespaced(kube.clone(), &ns);
    let classy: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "classy", "namespace": ns},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "example.com/other", "clusterIP": "10.96.0.40",
                 "selector": {"app": "classy"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    }))?;
    svcs.create(&PostParams::default(), &classy).await?;
    // What the other implementation wrote.
    let theirs = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9"}]}}});
    svcs.patch_status("classy", &PatchParams::default(), &Patch::Merge(&theirs))
        .await?;
    create_lb_service(kube, &ns, "plain", "10.96.0.41", None).await?;
    let extra = format!("[neutron_defaults]\nexternal_svc_net = {}\n", ext.network);
    let _ctrl = bed.controller(&ext.octavia, &extra, "svc-lbclass");

    // The plain one gets its floating IP: the controller has been through both.
    public_ip(kube, &ns, "plain").await?;
    let st = recorded(kube, &ns, "classy", 1, 0).await?;
    assert!(st.loadbalancer.is_some(), "the cluster IP is served");
    assert!(st.service_pub_ip_info.is_none(), "{st:?}");
    let klb = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns)
        .get("classy")
        .await?;
    assert_eq!(klb.spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(ingress(kube, &ns, "classy").await?, ["192.0.2.9"]);
    let fips = bed.neutron.client.list_floatingips(&ListFilter::new()).await?;
    assert_eq!(fips.len(), 1, "only the plain Service's: {fips:?}");
    Ok(())
}

/// LoadBalancer Services against the Neutron and Octavia emulators: a floating IP from external_svc_net on the
/// VIP port (tagged, in the KuryrLoadBalancer status and the Service's ingress), `loadBalancerIP` naming a
/// user's floating IP (associated, never deleted; one the user moved to another port meanwhile stays
/// there when the Service goes), one left by a crash adopted rather than duplicated, released
/// when the Service goes back to ClusterIP, and the orphan sweep deleting one whose Service is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_service_gets_a_floating_ip_on_its_vip_port() -> Result<()> {
    use kuryr_controller::services::public_ip::description;
    use kuryr_neutron::FloatingIpCreate;
    init_logs();
    let ns = unique("lbsvc");
    let bed = Bed::new(&ns).await?;
    let ext = external(&bed).await?;
    let n = &bed.neutron.client;
    let fip_req = |description: Option<String>, address: Option<&str>| FloatingIpCreate {
        floating_network_id: ext.network.clone(),
        floating_ip_address: address.map(str::to_string),
        project_id: Some(bed.fx.project.clone()),
        description,
        ..Default::default()
    };
    let user = n.create_floatingip(&fip_req(None, Some("172.24.4.50"))).await?;
    let moved = n.create_floatingip(&fip_req(None, Some("172.24.4.51"))).await?;
    // What a controller killed between the floating IP create and the status write leaves.
    let left = n
        .create_floatingip(&fip_req(Some(description(&ns, &ns, "crashed")), None))
        .await?;
    // A floating IP of a Service that no longer exists.
    let orphan = n
        .create_floatingip(&fip_req(Some(description(&ns, &ns, "ghost")), None))
        .await?;
    let kube = bed.client();
    // The Services exist before the controller starts, so its first orphan sweep already knows them.
    create_lb_service(kube, &ns, "pool", "10.96.0.20", None).await?;
    create_lb_service(kube, &ns, "mine", "10.96.0.21", Some("172.24.4.50")).await?;
    create_lb_service(kube, &ns, "crashed", "10.96.0.22", None).await?;
    create_lb_service(kube, &ns, "moved", "10.96.0.23", Some("172.24.4.51")).await?;
    let extra = format!("[neutron_defaults]\nexternal_svc_net = {}\n", ext.network);
    let _ctrl = bed.controller(&ext.octavia, &extra, "svc-lb");

    let (st, info) = public_ip(kube, &ns, "pool").await?;
    assert_eq!(info.alloc_method, "pool");
    let fip = n.get_floatingip(&info.ip_id).await?;
    let vip_port = st
        .loadbalancer
        .as_ref()
        .map(|l| l.port_id.clone())
        .unwrap_or_default();
    assert_eq!(fip.port_id.as_deref(), Some(vip_port.as_str()), "{fip:?}");
    assert_eq!(fip.floating_ip_address, info.ip_addr);
    assert!(fip.tags.contains(&format!("kuryr-rs.cluster={ns}")), "{fip:?}");
    assert!(
        fip.tags.contains(&format!("kuryr-rs.service={ns}/pool")),
        "{fip:?}"
    );
    let want = vec![info.ip_addr.clone()];
    eventually("Service status.loadBalancer.ingress", WAIT, || async {
        Ok((ingress(kube, &ns, "pool").await? == want).then_some(()))
    })
    .await?;

    let (st, info) = public_ip(kube, &ns, "mine").await?;
    assert_eq!(
        (info.alloc_method.as_str(), info.ip_id.as_str()),
        ("user", user.id.as_str())
    );
    let vip_port = st
        .loadbalancer
        .as_ref()
        .map(|l| l.port_id.clone())
        .unwrap_or_default();
    assert_eq!(n.get_floatingip(&user.id).await?.port_id, Some(vip_port.clone()));

    // The load balancer deleted by hand: the periodic check rebuilds it on a new VIP port, and the
    // floating IP, which Neutron let go with the old port, follows it there.
    let old_lb = st.loadbalancer.as_ref().map(|l| l.id.clone()).unwrap_or_default();
    ext.octavia.client.delete_load_balancer(&old_lb, true).await?;
    let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
    let new_port = eventually("the load balancer rebuilt", WAIT, || async {
        let lb = klbs.get("mine").await?.status.and_then(|s| s.loadbalancer);
        Ok(lb.filter(|l| l.id != old_lb).map(|l| l.port_id))
    })
    .await?;
    assert_ne!(new_port, vip_port);
    eventually("the floating IP on the new VIP port", WAIT, || async {
        Ok((n.get_floatingip(&user.id).await?.port_id.as_deref() == Some(new_port.as_str())).then_some(()))
    })
    .await?;

    let (_, info) = public_ip(kube, &ns, "crashed").await?;
    assert_eq!(info.ip_id, left.id, "the leftover is adopted");
    let all = n
        .list_floatingips(&ListFilter::new().eq("floating_network_id", ext.network.clone()))
        .await?;
    assert_eq!(
        all.len(),
        5,
        "user, moved, pool, crashed and (until swept) ghost: {all:?}"
    );

    // Back to ClusterIP: the pool floating IP is deleted and the ingress cleared.
    let svcs = Api::<Service>::namespaced(kube.clone(), &ns);
    let (_, pool_info) = public_ip(kube, &ns, "pool").await?;
    svcs.patch(
        "pool",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"type": "ClusterIP"}})),
    )
    .await?;
    eventually("pool floating IP released", WAIT, || async {
        let klb = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns)
            .get("pool")
            .await?;
        let gone = n
            .get_floatingip(&pool_info.ip_id)
            .await
            .is_err_and(|e| e.is_not_found());
        let cleared = klb.status.is_some_and(|s| s.service_pub_ip_info.is_none());
        Ok((gone && cleared && ingress(kube, &ns, "pool").await?.is_empty()).then_some(()))
    })
    .await?;

    // Deleting a Service gives the user's floating IP back, associated with nothing.
    svcs.delete("mine", &DeleteParams::default()).await?;
    eventually("user floating IP disassociated", WAIT, || async {
        let f = n.get_floatingip(&user.id).await?;
        Ok((f.port_id.is_none() && svcs.get_opt("mine").await?.is_none()).then_some(()))
    })
    .await?;

    // A user's floating IP the user moved to another port (a VM's) meanwhile is theirs to keep
    // there: the Service going does not take it off that port.
    let (_, info) = public_ip(kube, &ns, "moved").await?;
    assert_eq!(info.ip_id, moved.id);
    let vm_port = n
        .create_port(&kuryr_neutron::PortCreate {
            network_id: bed.fx.subnets[1].network.clone(),
            project_id: Some(bed.fx.project.clone()),
            name: Some("a-vm".into()),
            ..Default::default()
        })
        .await?;
    n.update_floatingip_port(&moved.id, Some(&vm_port.id)).await?;
    svcs.delete("moved", &DeleteParams::default()).await?;
    eventually("the moved Service gone", WAIT, || async {
        Ok(svcs.get_opt("moved").await?.is_none().then_some(()))
    })
    .await?;
    let f = n.get_floatingip(&moved.id).await?;
    assert_eq!(f.port_id.as_deref(), Some(vm_port.id.as_str()), "{f:?}");

    // The ghost's floating IP goes within two reconcile passes (1 s apart here).
    eventually("orphaned floating IP swept", WAIT, || async {
        Ok(n.get_floatingip(&orphan.id)
            .await
            .is_err_and(|e| e.is_not_found())
            .then_some(()))
    })
    .await?;
    assert!(
        n.get_floatingip(&user.id).await.is_ok(),
        "a user's floating IP is never deleted"
    );
    Ok(())
}

/// Waits until Service `name` advertises exactly `ip` in its `status.loadBalancer.ingress`.
async fn advertised(kube: &Client, ns: &str, name: &str, ip: &str) -> Result<()> {
    let want = vec![ip.to_string()];
    eventually(&format!("{name}: ingress {ip}"), WAIT, || async {
        Ok((ingress(kube, ns, name).await? == want).then_some(()))
    })
    .await
}

/// A Service keeps its public IP until a replacement is had: a `loadBalancerIP` naming no floating
/// IP is a Warning Event naming the field, and the address stays the Service's and advertised (it
/// was released first, back to the external pool, where it may soon be another tenant's); the
/// Service's own address pinned by `loadBalancerIP` stays, the same floating IP. A released public
/// IP is never left advertised: the Service made NodePort loses it from its ingress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_ip_stays_until_replaced_and_a_released_one_leaves_the_ingress() -> Result<()> {
    init_logs();
    let ns = unique("lbgone");
    let bed = Bed::new(&ns).await?;
    let ext = external(&bed).await?;
    let n = &bed.neutron.client;
    let kube = bed.client();
    create_lb_service(kube, &ns, "swap", "10.96.0.30", None).await?;
    create_lb_service(kube, &ns, "port", "10.96.0.31", None).await?;
    let extra = format!("[neutron_defaults]\nexternal_svc_net = {}\n", ext.network);
    let _ctrl = bed.controller(&ext.octavia, &extra, "svc-lbgone");
    let svcs = Api::<Service>::namespaced(kube.clone(), &ns);

    let (st, info) = public_ip(kube, &ns, "swap").await?;
    let vip_port = st.loadbalancer.map(|l| l.port_id).unwrap_or_default();
    advertised(kube, &ns, "swap", &info.ip_addr).await?;
    let lb_ip = |ip: &str| json!({"spec": {"loadBalancerIP": ip}});
    svcs.patch(
        "swap",
        &PatchParams::default(),
        &Patch::Merge(&lb_ip("172.24.4.99")),
    )
    .await?;
    let note = warning_note(kube, &ns, "swap", None).await?;
    assert!(
        note.contains("loadBalancerIP") && note.contains("172.24.4.99"),
        "{note}"
    );
    let fip = n.get_floatingip(&info.ip_id).await?;
    assert_eq!(
        fip.port_id.as_deref(),
        Some(vip_port.as_str()),
        "still on the VIP: {fip:?}"
    );
    assert_eq!(public_ip(kube, &ns, "swap").await?.1, info);
    advertised(kube, &ns, "swap", &info.ip_addr).await?;
    // Its own address pinned: nothing changes, and nothing is warned of any more.
    svcs.patch(
        "swap",
        &PatchParams::default(),
        &Patch::Merge(&lb_ip(&info.ip_addr)),
    )
    .await?;
    let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
    eventually("the pinned address in the KuryrLoadBalancer", WAIT, || async {
        Ok((klbs.get("swap").await?.spec.lb_ip.as_deref() == Some(info.ip_addr.as_str())).then_some(()))
    })
    .await?;
    let warned = warnings(kube, &ns, "swap").await?.len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(public_ip(kube, &ns, "swap").await?.1, info);
    assert_eq!(
        n.get_floatingip(&info.ip_id).await?.port_id.as_deref(),
        Some(vip_port.as_str())
    );
    assert_eq!(warnings(kube, &ns, "swap").await?.len(), warned, "no new warning");

    let (_, info) = public_ip(kube, &ns, "port").await?;
    advertised(kube, &ns, "port", &info.ip_addr).await?;
    svcs.patch(
        "port",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"type": "NodePort"}})),
    )
    .await?;
    eventually("port: released and no longer advertised", WAIT, || async {
        let gone = n
            .get_floatingip(&info.ip_id)
            .await
            .is_err_and(|e| e.is_not_found());
        Ok((gone && ingress(kube, &ns, "port").await?.is_empty()).then_some(()))
    })
    .await?;
    Ok(())
}

/// Without `[neutron_defaults] external_svc_net` a LoadBalancer Service gets a Warning Event naming the option;
/// its load balancer and the other Services are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_service_without_external_svc_net_is_a_warning_event_naming_it() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let ns = unique("noext");
    let bed = Bed::new(&ns).await?;
    let kube = bed.client();
    create_lb_service(kube, &ns, "public", "10.96.0.30", None).await?;
    // An address another implementation (MetalLB, the cloud controller manager) gave it.
    let services = Api::<Service>::namespaced(kube.clone(), &ns);
    let ingress = json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}});
    services
        .patch_status("public", &PatchParams::default(), &Patch::Merge(&ingress))
        .await?;
    let _ctrl = bed.controller(&oct, "", "svc-noext");
    create_service(kube, &ns, "inside", "10.96.0.31", &[("http", 80, 8080, "TCP")]).await?;
    let note = warning_note(kube, &ns, "public", None).await?;
    assert!(note.contains("external_svc_net"), "{note}");
    recorded(kube, &ns, "public", 1, 0).await?;
    recorded(kube, &ns, "inside", 1, 0).await?;
    // kuryr-rs gives it no address, and takes none away.
    let advertised = services
        .get_status("public")
        .await?
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|l| l.ingress)
        .unwrap_or_default();
    assert_eq!(
        advertised
            .iter()
            .filter_map(|i| i.ip.as_deref())
            .collect::<Vec<_>>(),
        vec!["203.0.113.7"]
    );
    Ok(())
}

/// A `[kubernetes] service_public_ip_driver` kuryr-rs does not have is a Warning Event on the LoadBalancer
/// Service naming the option (not a silent Service without a public IP); its load balancer and the other
/// Services are still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_service_public_ip_driver_is_a_warning_event_naming_it() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let ns = unique("badpip");
    let bed = Bed::new(&ns).await?;
    let _ctrl = bed.controller(
        &oct,
        "[kubernetes]\nservice_public_ip_driver = octavia_vip_magic\n",
        "svc-badpip",
    );
    let kube = bed.client();
    create_lb_service(kube, &ns, "public", "10.96.0.32", None).await?;
    create_service(kube, &ns, "inside", "10.96.0.33", &[("http", 80, 8080, "TCP")]).await?;
    let (reason, note) = eventually("Warning Event on the LoadBalancer Service", WAIT, || async {
        Ok(warnings(kube, &ns, "public").await?.into_iter().next())
    })
    .await?;
    assert_eq!(reason, "InvalidInput", "{note}");
    assert!(note.contains("[kubernetes] service_public_ip_driver"), "{note}");
    assert!(note.contains("octavia_vip_magic"), "{note}");
    let st = recorded(kube, &ns, "public", 1, 0).await?;
    assert!(st.service_pub_ip_info.is_none(), "{st:?}");
    recorded(kube, &ns, "inside", 1, 0).await?;
    let inside = warnings(kube, &ns, "inside").await?;
    assert!(inside.is_empty(), "{inside:?}");
    Ok(())
}

/// `[neutron_defaults] external_svc_subnet` picks the subnet of the external network the floating IP comes
/// from; without it Neutron takes the network's first subnet with room (172.24.4.0/24 here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_svc_subnet_chooses_the_floating_ips_subnet() -> Result<()> {
    use kuryr_neutron::SubnetCreate;
    init_logs();
    let ns = unique("extsub");
    let bed = Bed::new(&ns).await?;
    let ext = external(&bed).await?;
    let second = bed
        .neutron
        .client
        .create_subnet(&SubnetCreate {
            network_id: ext.network.clone(),
            ip_version: 4,
            cidr: Some("172.24.5.0/24".into()),
            project_id: Some(bed.fx.project.clone()),
            ..Default::default()
        })
        .await?;
    let extra = format!(
        "[neutron_defaults]\nexternal_svc_net = {}\nexternal_svc_subnet = {}\n",
        ext.network, second.id
    );
    let _ctrl = bed.controller(&ext.octavia, &extra, "svc-extsub");
    let kube = bed.client();
    create_lb_service(kube, &ns, "public", "10.96.0.34", None).await?;
    let (st, info) = public_ip(kube, &ns, "public").await?;
    assert!(info.ip_addr.starts_with("172.24.5."), "{info:?}");
    let fip = bed.neutron.client.get_floatingip(&info.ip_id).await?;
    let vip_port = st.loadbalancer.map(|l| l.port_id).unwrap_or_default();
    assert_eq!(fip.port_id.as_deref(), Some(vip_port.as_str()), "{fip:?}");
    let want = vec![info.ip_addr.clone()];
    eventually("Service status.loadBalancer.ingress", WAIT, || async {
        Ok((ingress(kube, &ns, "public").await? == want).then_some(()))
    })
    .await?;
    Ok(())
}

/// An overloaded Octavia: the create's answer comes after the client's timeout (the emulator holds the request
/// 3 s, the controller's client waits 1 s), and the load balancer is only made when the request is carried out,
/// after the client gave up. The controller looks it up by name and VIP until it appears instead of creating
/// again: exactly one create, one load balancer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_is_lost_is_looked_up_not_repeated() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let emu = oct.emulator.as_ref().expect("the first target is the emulator");
    emu.set_faults(octavia_emulator::FaultConfig {
        rules: vec![octavia_emulator::FaultRule {
            operation: "loadbalancer.create".into(),
            status: None,
            count: Some(1),
            delay_ms: 3000,
        }],
    });
    let mut opts = ClientOptions::noauth(emu.url());
    opts.timeout = Some(Duration::from_secs(1));
    let impatient = OctaviaTarget {
        name: "emulator",
        client: OctaviaClient::new(&opts)?,
        emulator: None,
    };
    let ns = unique("lost");
    let bed = Bed::new(&ns).await?;
    let _ctrl = bed.controller(&impatient, "", "svc-lost");
    let kube = bed.client();
    create_service(kube, &ns, "slow", "10.96.0.40", &[("http", 80, 8080, "TCP")]).await?;
    set_endpoints(kube, &ns, "slow", &ips(2), &[("http", 8080)]).await?;
    let st = recorded(kube, &ns, "slow", 1, 2).await?;
    let lbs = lbs_named(&oct.client, &format!("{ns}/slow")).await?;
    assert_eq!(lbs.len(), 1, "{lbs:?}");
    assert_eq!(st.loadbalancer.map(|l| l.id), Some(lbs[0].id.clone()));
    assert_eq!(emu.stats().count("loadbalancer.create"), 1, "{:?}", emu.stats());
    Ok(())
}

/// The Warning Events on Service `name`, as (reason, note).
async fn warnings(kube: &Client, ns: &str, name: &str) -> Result<Vec<(String, String)>> {
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(kube.clone(), ns);
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}

/// The note of the first Warning Event on `name` (of `reason`, when given), once there is one.
async fn warning_note(kube: &Client, ns: &str, name: &str, reason: Option<&str>) -> Result<String> {
    eventually(
        &format!("a Warning Event on {ns}/{name} ({reason:?})"),
        WAIT,
        || async {
            Ok(warnings(kube, ns, name)
                .await?
                .into_iter()
                .find(|(r, _)| reason.is_none_or(|want| r == want))
                .map(|(_, note)| note))
        },
    )
    .await
}

/// Traffic policies an Octavia load balancer cannot honour are never silently ignored: a Warning Event on the
/// Service names the field, once (not on every event), and the Service is served from every ready endpoint.
/// `internalTrafficPolicy: Local` on any provider; `externalTrafficPolicy: Local` on a LoadBalancer Service
/// with the amphora provider (the ovn provider keeps the client's address, so it holds there: no Event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_policies_octavia_cannot_honour_are_warning_events_naming_the_field() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let ns = unique("tp");
    let bed = Bed::new(&ns).await?;
    let _ctrl = bed.controller(&oct, "", "svc-tp");
    let kube = bed.client();
    let svcs = Api::<Service>::namespaced(kube.clone(), &ns);
    for (name, ip, ty, itp, etp) in [
        ("local-in", "10.96.0.40", "ClusterIP", "Local", None),
        (
            "local-out",
            "10.96.0.41",
            "LoadBalancer",
            "Cluster",
            Some("Local"),
        ),
        ("plain", "10.96.0.42", "LoadBalancer", "Cluster", Some("Cluster")),
    ] {
        set_endpoints(kube, &ns, name, &ips(3), &[("http", 8080)]).await?;
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": &ns},
            "spec": {"type": ty, "clusterIP": ip, "selector": {"app": name},
                     "internalTrafficPolicy": itp, "externalTrafficPolicy": etp,
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
        }))?;
        svcs.create(&PostParams::default(), &svc).await?;
    }
    for name in ["local-in", "local-out", "plain"] {
        // Served as with Cluster: every ready endpoint is a member.
        recorded(kube, &ns, name, 1, 3).await.context(name)?;
    }
    let policy = |w: &[(String, String)]| -> Vec<(String, String)> {
        w.iter()
            .filter(|(r, _)| r.contains("TrafficPolicy"))
            .cloned()
            .collect()
    };
    let inside = eventually("internalTrafficPolicy Warning", WAIT, || async {
        let w = policy(&warnings(kube, &ns, "local-in").await?);
        Ok((!w.is_empty()).then_some(w))
    })
    .await?;
    assert_eq!(inside.len(), 1, "{inside:?}");
    assert_eq!(inside[0].0, "KuryrInternalTrafficPolicyUnsupported");
    assert!(
        inside[0].1.starts_with("spec.internalTrafficPolicy: Local"),
        "{inside:?}"
    );
    let outside = eventually("externalTrafficPolicy Warning", WAIT, || async {
        let w = policy(&warnings(kube, &ns, "local-out").await?);
        Ok((!w.is_empty()).then_some(w))
    })
    .await?;
    assert_eq!(outside.len(), 1, "{outside:?}");
    assert_eq!(outside[0].0, "KuryrExternalTrafficPolicyUnsupported");
    assert!(
        outside[0].1.contains("spec.externalTrafficPolicy: Local"),
        "{outside:?}"
    );
    assert!(outside[0].1.contains("amphora"), "{outside:?}");

    // A later event on the Service (a label) does not repeat the Event: still one, with count 1.
    svcs.patch(
        "local-in",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(kube.clone(), &ns);
    let series: Vec<_> = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("KuryrInternalTrafficPolicyUnsupported"))
        .collect();
    assert_eq!(series.len(), 1, "{series:?}");
    assert!(series[0].series.is_none(), "published once: {series:?}");
    assert!(policy(&warnings(kube, &ns, "plain").await?).is_empty());
    Ok(())
}

/// The ovn provider keeps the client's address: `externalTrafficPolicy: Local` holds, no Event; an
/// `internalTrafficPolicy: Local` still gets its Warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_ovn_provider_external_traffic_policy_local_holds() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let ns = unique("tpovn");
    let bed = Bed::new(&ns).await?;
    let _ctrl = bed.controller(
        &oct,
        "[kubernetes]\nendpoints_driver_octavia_provider = ovn\n",
        "svc-tp-ovn",
    );
    let kube = bed.client();
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "both", "namespace": &ns},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.43", "selector": {"app": "both"},
                 "internalTrafficPolicy": "Local", "externalTrafficPolicy": "Local",
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    }))?;
    Api::<Service>::namespaced(kube.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await?;
    recorded(kube, &ns, "both", 1, 0).await?;
    let reasons = eventually("internalTrafficPolicy Warning", WAIT, || async {
        let w: Vec<String> = warnings(kube, &ns, "both")
            .await?
            .into_iter()
            .map(|(r, _)| r)
            .filter(|r| r.contains("TrafficPolicy"))
            .collect();
        Ok((!w.is_empty()).then_some(w))
    })
    .await?;
    assert_eq!(reasons, ["KuryrInternalTrafficPolicyUnsupported"]);
    Ok(())
}

/// `[kubernetes] service_security_groups_driver` chooses the groups a Service's load balancer records, as
/// upstream: `default` the pod defaults, `namespace` those plus the namespace's own group (found or made in
/// Neutron, tagged with the namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_security_groups_driver_chooses_the_load_balancers_groups() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    for driver in ["default", "namespace"] {
        let ns = unique("sgs");
        let bed = Bed::new(&ns).await?;
        let _ctrl = bed.controller(
            &oct,
            &format!("[kubernetes]\nservice_security_groups_driver = {driver}\n"),
            &format!("svc-sgs-{driver}"),
        );
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.50", &[("http", 80, 8080, "TCP")]).await?;
        recorded(kube, &ns, "web", 1, 0).await.context(driver)?;
        let klb = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns)
            .get("web")
            .await?;
        let groups = klb.spec.security_groups_ids;
        match driver {
            "default" => assert_eq!(groups, std::slice::from_ref(&bed.fx.sg)),
            _ => {
                assert_eq!(groups.len(), 2, "{groups:?}");
                assert_eq!(groups[0], bed.fx.sg);
                let sg = bed.neutron.client.get_security_group(&groups[1]).await?;
                assert!(
                    sg.tags.contains(&format!("kuryr-rs.namespace={ns}")),
                    "{:?}",
                    sg.tags
                );
            }
        }
    }
    Ok(())
}

/// The Octavia listener of `lb_id` on `port`.
async fn listener_on(
    client: &OctaviaClient,
    lb_id: &str,
    port: u16,
) -> Result<kuryr_neutron::octavia::Listener> {
    let tree = client.get_status_tree(lb_id).await?;
    let name = tree
        .loadbalancer
        .listeners
        .iter()
        .find(|l| l.name.ends_with(&format!(":{port}")))
        .map(|l| l.id.clone())
        .context("no listener on the port")?;
    Ok(client.get_listener(&name).await?)
}

/// A KuryrLoadBalancer's `spec.listener_acls` (what the `service` handler writes with `enforce_sg_rules`)
/// becomes its listeners' Octavia `allowed_cidrs`: on the fully populated create, on a change (one listener
/// update, the other listener untouched), closed (nobody admitted: the listener is disabled) and open again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_acls_in_the_spec_become_allowed_cidrs_in_octavia() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        let ns = unique("acl");
        let bed = Bed::new(&ns).await?;
        let kube = bed.client();
        let svc_subnet = bed.fx.subnets[1].subnet.clone();
        create_service(
            kube,
            &ns,
            "web",
            "10.96.0.70",
            &[("http", 80, 8080, "TCP"), ("alt", 81, 8081, "TCP")],
        )
        .await?;
        let svc = Api::<Service>::namespaced(kube.clone(), &ns).get("web").await?;
        // Only the kuryrloadbalancer handler runs: the spec is the test's.
        let klb: KuryrLoadBalancer = serde_json::from_value(json!({
            "apiVersion": "openstack.org/v1", "kind": "KuryrLoadBalancer",
            "metadata": {"name": "web", "namespace": ns,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": svc.uid()}]},
            "spec": {"ip": "10.96.0.70",
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "8080"},
                          {"name": "alt", "port": 81, "protocol": "TCP", "targetPort": "8081"}],
                "project_id": bed.project, "provider": "amphora", "security_groups_ids": ["np-group"],
                "subnet_id": svc_subnet, "type": "ClusterIP",
                "listener_acls": [{"protocol": "TCP", "port": 80, "allowed_cidrs": ["10.1.0.50/32", "10.2.0.0/16"]}]}
        }))?;
        let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
        klbs.create(&PostParams::default(), &klb).await?;
        let _ctrl = bed.controller(
            &oct,
            "[kubernetes]\nenabled_handlers = kuryrloadbalancer\n",
            "svc-acl",
        );
        let st = recorded(kube, &ns, "web", 2, 0).await.context(oct.name)?;
        let lb_id = st.loadbalancer.map(|l| l.id).unwrap_or_default();
        let cidrs = |l: &kuryr_neutron::octavia::Listener| {
            let mut c = l.allowed_cidrs.clone().unwrap_or_default();
            c.sort();
            c
        };
        let l80 = listener_on(&oct.client, &lb_id, 80).await?;
        assert_eq!(cidrs(&l80), ["10.1.0.50/32", "10.2.0.0/16"], "{}", oct.name);
        assert!(l80.admin_state_up, "{}", oct.name);
        let l81 = listener_on(&oct.client, &lb_id, 81).await?;
        assert!(cidrs(&l81).is_empty(), "{}: port 81 admits everyone", oct.name);

        let set_acls = |acls: serde_json::Value| {
            let klbs = klbs.clone();
            async move {
                klbs.patch(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"listener_acls": acls}})),
                )
                .await
            }
        };
        let wait_listener = |what: &'static str, check: fn(&kuryr_neutron::octavia::Listener) -> bool| {
            let (client, lb_id) = (oct.client.clone(), lb_id.clone());
            async move {
                eventually(what, WAIT, || async {
                    let l = listener_on(&client, &lb_id, 80).await?;
                    Ok(check(&l).then_some(l))
                })
                .await
            }
        };
        set_acls(json!([{"protocol": "TCP", "port": 80, "allowed_cidrs": ["10.1.0.51/32"]}])).await?;
        wait_listener("port 80 admits 10.1.0.51/32 only", |l| {
            l.allowed_cidrs.as_deref() == Some(&["10.1.0.51/32".to_string()][..]) && l.admin_state_up
        })
        .await
        .context(oct.name)?;
        set_acls(json!([{"protocol": "TCP", "port": 80, "allowed_cidrs": []}])).await?;
        wait_listener("port 80 admits nobody: disabled", |l| {
            l.allowed_cidrs.as_deref().unwrap_or_default().is_empty() && !l.admin_state_up
        })
        .await
        .context(oct.name)?;
        set_acls(json!(null)).await?;
        wait_listener("port 80 admits everyone again", |l| {
            l.allowed_cidrs.as_deref().unwrap_or_default().is_empty() && l.admin_state_up
        })
        .await
        .context(oct.name)?;
        // The record follows Octavia (written after the update).
        eventually(&format!("{}: the record says open", oct.name), WAIT, || async {
            let st = klbs.get("web").await?.status.unwrap_or_default();
            let rec80 = st
                .listeners
                .iter()
                .find(|l| l.port == 80)
                .map(|l| l.allowed_cidrs.clone());
            Ok((rec80 == Some(None)).then_some(()))
        })
        .await?;
        let l81 = listener_on(&oct.client, &lb_id, 81).await?;
        assert!(cidrs(&l81).is_empty() && l81.admin_state_up, "{}", oct.name);
        klbs.delete("web", &DeleteParams::default()).await?;
        eventually(&format!("{}: released", oct.name), WAIT, || async {
            Ok(lbs_named(&oct.client, &format!("{ns}/web"))
                .await?
                .is_empty()
                .then_some(()))
        })
        .await?;
    }
    Ok(())
}

/// A pod with `labels` and `ip` (no port: the policy handlers only need its labels and address).
async fn labelled_pod(
    kube: &Client,
    ns: &str,
    name: &str,
    labels: serde_json::Value,
    ip: &str,
) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(kube.clone(), ns);
    let p = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": NODES[0], "containers": [{"name": "c", "image": "busybox"}]}
    }))?;
    api.create(&PostParams::default(), &p).await?;
    let status = json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// The controller of the listener ACL tests: policies on pods, and Services whose groups follow them
/// (the full resync an hour away, so only the handlers' own reactions count).
const POLICIES_MOVE_SERVICES: &str = "[kubernetes]\nenabled_handlers = service,endpoints,kuryrloadbalancer,policy,kuryrnetworkpolicy,pod_label\n\
     pod_security_groups_driver = policy\nservice_security_groups_driver = policy\n\
     watch_reconcile_period = 3600\n";

/// Namespace `name`, labelled `team=<name>`.
async fn team_namespace(kube: &Client, name: &str) -> Result<()> {
    let namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"team": name}}}))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    Ok(())
}

/// `ns/only-x`: the `app=web` pods admit TCP 8080 from namespace `team` only.
fn web_only_from_team(ns: &str, team: &str) -> Result<k8s_openapi::api::networking::v1::NetworkPolicy> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "only-x", "namespace": ns},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": team}}}],
                              "ports": [{"protocol": "TCP", "port": 8080}]}]}
    }))?)
}

/// `enforce_sg_rules` (default on) with `service_security_groups_driver = policy`: a NetworkPolicy admitting
/// only namespace X on the backends' port makes the Service's load balancer take the policy's group and its
/// listener admit only X's pods; another namespace's pod is not admitted; a second Service whose backends the
/// policy does not select keeps an open listener; a pod added to X later is admitted too. Deleting the policy
/// opens the listener again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_policy_change_moves_the_listener_acls_of_the_services_it_affects() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let ns = unique("aclnp");
    let bed = Bed::new(&ns).await?;
    let kube = bed.client();
    let x = format!("{ns}-x");
    let y = format!("{ns}-y");
    for n in [&x, &y] {
        team_namespace(kube, n).await?;
    }
    labelled_pod(kube, &ns, "web-0", json!({"app": "web"}), "10.1.0.10").await?;
    labelled_pod(kube, &ns, "other-0", json!({"app": "other"}), "10.1.0.11").await?;
    labelled_pod(kube, &x, "client-x", json!({"role": "client"}), "10.1.0.50").await?;
    labelled_pod(kube, &y, "client-y", json!({"role": "client"}), "10.1.0.60").await?;
    let _ctrl = bed.controller(&oct, POLICIES_MOVE_SERVICES, "svc-acl-np");
    create_service(kube, &ns, "web", "10.96.0.80", &[("http", 80, 8080, "TCP")]).await?;
    create_service(kube, &ns, "other", "10.96.0.81", &[("http", 80, 8080, "TCP")]).await?;
    for svc in ["web", "other"] {
        set_endpoints(
            kube,
            &ns,
            svc,
            &[if svc == "web" { "10.1.0.10" } else { "10.1.0.11" }.to_string()],
            &[("http", 8080)],
        )
        .await?;
    }
    let web = recorded(kube, &ns, "web", 1, 1).await?;
    let other = recorded(kube, &ns, "other", 1, 1).await?;
    let web_lb = web.loadbalancer.map(|l| l.id).unwrap_or_default();
    let other_lb = other.loadbalancer.map(|l| l.id).unwrap_or_default();
    let open = |l: &kuryr_neutron::octavia::Listener| {
        l.allowed_cidrs.as_deref().unwrap_or_default().is_empty() && l.admin_state_up
    };
    assert!(
        open(&listener_on(&oct.client, &web_lb, 80).await?),
        "no policy: open"
    );

    let np = web_only_from_team(&ns, &x)?;
    let nps = Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(kube.clone(), &ns);
    nps.create(&PostParams::default(), &np).await?;
    let l = eventually("the web listener admits only namespace X", WAIT, || async {
        let l = listener_on(&oct.client, &web_lb, 80).await?;
        let cidrs = l.allowed_cidrs.clone().unwrap_or_default();
        Ok(cidrs.iter().any(|c| c.starts_with("10.1.0.50")).then_some(l))
    })
    .await?;
    let cidrs = l.allowed_cidrs.clone().unwrap_or_default();
    assert!(l.admin_state_up);
    assert!(
        !cidrs
            .iter()
            .any(|c| c.starts_with("10.1.0.60") || c.starts_with("10.1.0.11")),
        "only X's pods: {cidrs:?}"
    );
    let klb = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns)
        .get("web")
        .await?;
    assert!(
        !klb.spec.security_groups_ids.contains(&bed.fx.sg),
        "the policy's group, not the default: {:?}",
        klb.spec.security_groups_ids
    );
    assert!(
        open(&listener_on(&oct.client, &other_lb, 80).await?),
        "the policy does not select the other Service's backends"
    );
    let other_klb = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns)
        .get("other")
        .await?;
    assert_eq!(
        other_klb.spec.security_groups_ids,
        std::slice::from_ref(&bed.fx.sg)
    );

    // A new pod in X joins the policy's peer address group: the listener admits it too (through the
    // pod_label handler: the full resync, which would also get there, is an hour away).
    labelled_pod(kube, &x, "client-x2", json!({"role": "client"}), "10.1.0.51").await?;
    eventually("the web listener admits the new pod of X", WAIT, || async {
        let l = listener_on(&oct.client, &web_lb, 80).await?;
        let cidrs = l.allowed_cidrs.clone().unwrap_or_default();
        let has = |ip: &str| cidrs.iter().any(|c| c.starts_with(ip));
        Ok((has("10.1.0.51") && has("10.1.0.50")).then_some(()))
    })
    .await?;

    nps.delete("only-x", &DeleteParams::default()).await?;
    eventually("the web listener open again", WAIT, || async {
        let l = listener_on(&oct.client, &web_lb, 80).await?;
        Ok(open(&l).then_some(()))
    })
    .await?;
    let klb = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns)
        .get("web")
        .await?;
    assert_eq!(klb.spec.security_groups_ids, std::slice::from_ref(&bed.fx.sg));
    assert!(klb.spec.listener_acls.is_empty());
    Ok(())
}

/// A Service whose targetPort is a name, behind a policy admitting that port from namespace X: the
/// listener's ACL needs the number the EndpointSlices give the name, and before the first ready
/// backend there is none (the listener is closed). When the backend's slice arrives, the ACL is
/// written at once - the endpoints change resolves the name - not at the Service's next event (an
/// hour away here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_target_port_resolved_by_the_first_backend_opens_its_listener_acl() -> Result<()> {
    init_logs();
    let oct = octavia_targets(LatencyProfile::Instant).await?.remove(0);
    let ns = unique("aclname");
    let bed = Bed::new(&ns).await?;
    let kube = bed.client();
    let x = format!("{ns}-x");
    team_namespace(kube, &x).await?;
    labelled_pod(kube, &ns, "web-0", json!({"app": "web"}), "10.1.0.10").await?;
    labelled_pod(kube, &x, "client-x", json!({"role": "client"}), "10.1.0.50").await?;
    let _ctrl = bed.controller(&oct, POLICIES_MOVE_SERVICES, "svc-acl-name");
    let np = web_only_from_team(&ns, &x)?;
    Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(kube.clone(), &ns)
        .create(&PostParams::default(), &np)
        .await?;
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"clusterIP": "10.96.0.82", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP"}]}
    }))?;
    Api::<Service>::namespaced(kube.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await?;
    let st = recorded(kube, &ns, "web", 1, 0).await?;
    let lb = st.loadbalancer.map(|l| l.id).unwrap_or_default();
    // The policy's group reached the Service; with no named port resolved yet, its rule on 8080
    // admits nobody on the listener (its port-less rules, the nodes' and the VIPs', still do).
    let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
    let acl = eventually("the policy's listener ACL", WAIT, || async {
        Ok(klbs.get("web").await?.spec.listener_acls.first().cloned())
    })
    .await?;
    assert!(
        !acl.allowed_cidrs.iter().any(|c| c.starts_with("10.1.0.50")),
        "{acl:?}"
    );
    set_endpoints(kube, &ns, "web", &["10.1.0.10".to_string()], &[("http", 8080)]).await?;
    eventually(
        "the listener admits namespace X on the resolved port",
        WAIT,
        || async {
            let l = listener_on(&oct.client, &lb, 80).await?;
            let cidrs = l.allowed_cidrs.clone().unwrap_or_default();
            Ok((l.admin_state_up && cidrs.iter().any(|c| c.starts_with("10.1.0.50"))).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// A load balancer Octavia puts in ERROR during a write (a member update whose job failed) is
/// deleted and built again by the handler's retry: its record is dropped with it, rather than
/// planned against until the periodic check notices (an hour here) - the retry's member update on
/// the deleted pool got 404, which is not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_gone_to_error_mid_pass_is_rebuilt_by_the_retry() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        // Only the emulator can be told to fail a job.
        let Some(emu) = &oct.emulator else { continue };
        let ns = unique("errpass");
        let bed = Bed::new(&ns).await?;
        let _ctrl = bed.controller(
            &oct,
            "[octavia_defaults]\nreconcile_period = 3600\n",
            "svc-errpass",
        );
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.14", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(2), &[("http", 8080)]).await?;
        let first = recorded(kube, &ns, "web", 1, 2).await?.loadbalancer.unwrap().id;

        emu.fail_next_jobs(1);
        set_endpoints(kube, &ns, "web", &ips(3), &[("http", 8080)]).await?;
        let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
        let second = eventually("a new load balancer with the 3 members", WAIT, || async {
            let st = klbs.get_opt("web").await?.and_then(|k| k.status);
            Ok(st
                .and_then(|s| s.loadbalancer.filter(|_| s.members.len() == 3))
                .map(|l| l.id)
                .filter(|id| *id != first))
        })
        .await?;
        assert_eq!(octavia_members(&oct.client, &second).await?.len(), 3);
        let lbs = lbs_named(&oct.client, &format!("{ns}/web")).await?;
        assert_eq!(
            lbs.iter().map(|l| l.id.clone()).collect::<Vec<_>>(),
            vec![second],
            "the ERROR one is deleted"
        );
    }
    Ok(())
}

/// A load balancer Octavia fails to build (its create job ends in ERROR: no room for an amphora)
/// is a Warning Event on the Service naming the failure, and is built again by the retry; the
/// ERROR ones are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_octavia_fails_to_build_is_a_warning_and_is_built_again() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        // Only the emulator can be told to fail a job.
        let Some(emu) = &oct.emulator else { continue };
        let ns = unique("errbuild");
        let bed = Bed::new(&ns).await?;
        let _ctrl = bed.controller(
            &oct,
            "[octavia_defaults]\nreconcile_period = 3600\n",
            "svc-errbuild",
        );
        let kube = bed.client();
        emu.fail_next_jobs(1);
        create_service(kube, &ns, "web", "10.96.0.15", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(2), &[("http", 8080)]).await?;
        let note = warning_note(kube, &ns, "web", Some("LoadBalancerError")).await?;
        assert!(note.contains("ERROR"), "{note}");
        let lb = recorded(kube, &ns, "web", 1, 2).await?.loadbalancer.unwrap().id;
        let lbs = lbs_named(&oct.client, &format!("{ns}/web")).await?;
        assert_eq!(
            lbs.iter().map(|l| l.id.clone()).collect::<Vec<_>>(),
            vec![lb],
            "the ERROR one is deleted"
        );
    }
    Ok(())
}

/// The periodic check judges a load balancer against the KuryrLoadBalancer as its pass listed it:
/// when the handler rewrote the record meanwhile (members replaced while the check waited on
/// Octavia), the check does not clear the current record (it did: a false "changed outside
/// kuryr", the record emptied and adopted again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_rewritten_during_a_periodic_check_is_not_cleared() -> Result<()> {
    use futures::StreamExt;
    use kube::api::WatchEvent;
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        // Only the emulator can be told to answer slowly.
        let Some(emu) = &oct.emulator else { continue };
        let ns = unique("stale");
        let bed = Bed::new(&ns).await?;
        let _ctrl = bed.controller(&oct, "", "svc-stale");
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.17", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(2), &[("http", 8080)]).await?;
        recorded(kube, &ns, "web", 1, 2).await?;
        let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
        let version = klbs.get("web").await?.resource_version().unwrap_or_default();
        let mut events = klbs.watch(&Default::default(), &version).await?.boxed();
        let cleared = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let watching = tokio::spawn({
            let cleared = cleared.clone();
            async move {
                while let Some(Ok(e)) = events.next().await {
                    if let WatchEvent::Modified(k) = e
                        && k.status.as_ref().is_none_or(|s| s.loadbalancer.is_none())
                    {
                        cleared.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        });
        // Each check's first read waits 3 s: the pass listed the record before the change below.
        emu.set_faults(octavia_emulator::FaultConfig {
            rules: vec![octavia_emulator::FaultRule {
                operation: "loadbalancer.get".into(),
                status: None,
                count: None,
                delay_ms: 3000,
            }],
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let others = vec!["10.1.0.30".to_string(), "10.1.0.31".to_string()];
        set_endpoints(kube, &ns, "web", &others, &[("http", 8080)]).await?;
        eventually("the new members recorded", WAIT, || async {
            let st = klbs.get_opt("web").await?.and_then(|k| k.status);
            let ips: BTreeSet<String> = st.iter().flat_map(|s| &s.members).map(|m| m.ip.clone()).collect();
            Ok((ips == others.iter().cloned().collect()).then_some(()))
        })
        .await?;
        // Past the slow check that listed the old record.
        tokio::time::sleep(Duration::from_secs(4)).await;
        emu.set_faults(octavia_emulator::FaultConfig::default());
        watching.abort();
        let cleared = cleared.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(cleared, 0, "{}: the record was cleared {cleared} times", oct.name);
    }
    Ok(())
}

/// A load balancer deleted by hand is found gone by the next member update (404): the record is
/// mended and the retry builds it again, with no handler failure (which would log an ERROR for a
/// state the handler has already repaired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_deleted_by_hand_is_rebuilt_by_the_handler_without_a_failure() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        let ns = unique("byhand");
        let bed = Bed::new(&ns).await?;
        let ctrl = bed.controller(
            &oct,
            "[octavia_defaults]\nreconcile_period = 3600\n",
            "svc-byhand",
        );
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.16", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(2), &[("http", 8080)]).await?;
        let first = recorded(kube, &ns, "web", 1, 2).await?.loadbalancer.unwrap().id;
        oct.client.delete_load_balancer(&first, true).await?;
        set_endpoints(kube, &ns, "web", &ips(3), &[("http", 8080)]).await?;
        let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), &ns);
        eventually("a new load balancer with the 3 members", WAIT, || async {
            let st = klbs.get_opt("web").await?.and_then(|k| k.status);
            Ok(st
                .and_then(|s| s.loadbalancer.filter(|_| s.members.len() == 3))
                .filter(|l| l.id != first)
                .map(drop))
        })
        .await?;
        let failures: Vec<String> = ctrl
            .metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("kuryr_handler_failures_total{handler=\"kuryrloadbalancer\""))
            .map(str::to_string)
            .collect();
        assert!(failures.is_empty(), "{}: {failures:?}", oct.name);
    }
    Ok(())
}

/// A floating IP a controller made for a LoadBalancer Service and was killed before recording,
/// the Service then made ClusterIP: the next controller deletes it (the orphan sweep spares it, its
/// Service exists), so the Service is not reachable from the external network any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrecorded_floating_ip_of_a_service_made_cluster_ip_is_deleted() -> Result<()> {
    use kuryr_controller::services::public_ip::description;
    use kuryr_neutron::FloatingIpCreate;
    init_logs();
    let ns = unique("fipgone");
    let bed = Bed::new(&ns).await?;
    let ext = external(&bed).await?;
    let n = &bed.neutron.client;
    let left = n
        .create_floatingip(&FloatingIpCreate {
            floating_network_id: ext.network.clone(),
            project_id: Some(bed.fx.project.clone()),
            description: Some(description(&ns, &ns, "web")),
            ..Default::default()
        })
        .await?;
    let kube = bed.client();
    create_service(kube, &ns, "web", "10.96.0.24", &[("http", 80, 8080, "TCP")]).await?;
    let extra = format!("[neutron_defaults]\nexternal_svc_net = {}\n", ext.network);
    let _ctrl = bed.controller(&ext.octavia, &extra, "svc-fipgone");
    recorded(kube, &ns, "web", 1, 0).await?;
    eventually("the unrecorded floating IP deleted", WAIT, || async {
        match n.get_floatingip(&left.id).await {
            Err(e) if e.is_not_found() => Ok(Some(())),
            Err(e) => Err(e.into()),
            Ok(_) => Ok(None),
        }
    })
    .await?;
    Ok(())
}

/// A public IP found off its load balancer's VIP port (a pass that rebuilt the load balancer and
/// crashed before pointing the IP at the new port leaves exactly this) is put back by the first
/// pass of the next controller, with no change to the Service to prompt it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_ip_found_off_its_vip_port_after_a_restart_is_put_back() -> Result<()> {
    init_logs();
    let ns = unique("fipback");
    let bed = Bed::new(&ns).await?;
    let ext = external(&bed).await?;
    let n = &bed.neutron.client;
    let kube = bed.client();
    create_lb_service(kube, &ns, "pool", "10.96.0.23", None).await?;
    let extra = format!("[neutron_defaults]\nexternal_svc_net = {}\n", ext.network);
    let ctrl = bed.controller(&ext.octavia, &extra, "svc-fip-1");
    let (st, info) = public_ip(kube, &ns, "pool").await?;
    let vip_port = st.loadbalancer.map(|l| l.port_id).unwrap_or_default();
    assert_eq!(
        n.get_floatingip(&info.ip_id).await?.port_id,
        Some(vip_port.clone())
    );

    ctrl.kill().await;
    n.update_floatingip_port(&info.ip_id, None).await?;
    let _ctrl = bed.controller(&ext.octavia, &extra, "svc-fip-2");
    eventually("the public IP back on the VIP port", WAIT, || async {
        Ok(
            (n.get_floatingip(&info.ip_id).await?.port_id.as_deref() == Some(vip_port.as_str()))
                .then_some(()),
        )
    })
    .await?;
    let (_, after) = public_ip(kube, &ns, "pool").await?;
    assert_eq!(after, info, "the same IP, recorded as before");
    Ok(())
}

/// A listener or member a provider put in ERROR (its operation failed and was reverted: the load
/// balancer is ACTIVE again, so no wait saw it) is deleted and made again by the periodic check,
/// rather than recorded as serving for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_and_members_in_error_are_made_again() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        // Only the emulator can be told to fail one object.
        let Some(emu) = &oct.emulator else { continue };
        let ns = unique("childerr");
        let bed = Bed::new(&ns).await?;
        let _ctrl = bed.controller(&oct, "", "svc-childerr");
        let kube = bed.client();
        create_service(
            kube,
            &ns,
            "web",
            "10.96.0.15",
            &[("http", 80, 8080, "TCP"), ("metrics", 9090, 9090, "TCP")],
        )
        .await?;
        set_endpoints(kube, &ns, "web", &ips(2), &[("http", 8080), ("metrics", 9090)]).await?;
        let lb = recorded(kube, &ns, "web", 2, 4).await?.loadbalancer.unwrap().id;
        let tree = oct.client.get_status_tree(&lb).await?;
        let by_port = |port: &str| {
            tree.loadbalancer
                .listeners
                .iter()
                .find(|l| l.name.ends_with(port))
                .cloned()
                .unwrap()
        };
        let failed_listener = by_port(":TCP:80").id;
        let failed_member = by_port(":TCP:9090").pools[0].members[0].id.clone();
        emu.force_child_error("listeners", &failed_listener)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        emu.force_child_error("members", &failed_member)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;

        eventually("the failed listener and member made again", WAIT, || async {
            let tree = oct.client.get_status_tree(&lb).await?;
            let listeners = &tree.loadbalancer.listeners;
            let members: Vec<_> = listeners
                .iter()
                .flat_map(|l| &l.pools)
                .flat_map(|p| &p.members)
                .collect();
            let healthy = listeners.len() == 2
                && listeners
                    .iter()
                    .all(|l| l.provisioning_status == "ACTIVE" && l.id != failed_listener)
                && members.len() == 4
                && members
                    .iter()
                    .all(|m| m.provisioning_status == "ACTIVE" && m.id != failed_member);
            Ok(healthy.then_some(()))
        })
        .await?;
        assert_eq!(octavia_members(&oct.client, &lb).await?.len(), 4);
        assert_eq!(
            lbs_named(&oct.client, &format!("{ns}/web")).await?.len(),
            1,
            "repaired in place, not replaced"
        );
    }
    Ok(())
}

/// A load balancer of a Service's name and tags but another VIP (a Service deleted with its
/// finalizers stripped, then made again with a new cluster IP) is an orphan: the sweep deletes it
/// (it held the old cluster IP in the service subnet), and spares the Service's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_load_balancer_of_the_name_but_another_vip_is_swept() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        let ns = unique("stalevip");
        let bed = Bed::new(&ns).await?;
        let kube = bed.client();
        // What the Service's predecessor left: its name and kuryr-rs' tags, the old cluster IP.
        let leftover = oct
            .client
            .create_load_balancer(&LoadBalancerCreate {
                name: Some(format!("{ns}/web")),
                project_id: Some(bed.project.clone()),
                vip_subnet_id: Some(bed.fx.subnets[1].subnet.clone()),
                vip_address: Some("10.96.0.99".into()),
                provider: Some("amphora".into()),
                tags: vec![
                    "kuryr-rs".into(),
                    format!("kuryr-rs.cluster={ns}"),
                    format!("kuryr-rs.service={ns}/web"),
                ],
                ..Default::default()
            })
            .await?;
        create_service(kube, &ns, "web", "10.96.0.16", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(1), &[("http", 8080)]).await?;
        let _ctrl = bed.controller(&oct, "", "svc-stalevip");
        let own = recorded(kube, &ns, "web", 1, 1).await?.loadbalancer.unwrap().id;
        assert_ne!(own, leftover.id, "{}: the leftover is not adopted", oct.name);
        eventually(&format!("{}: the leftover swept", oct.name), WAIT, || async {
            let ids: Vec<String> = lbs_named(&oct.client, &format!("{ns}/web"))
                .await?
                .into_iter()
                .map(|l| l.id)
                .collect();
            Ok((ids == vec![own.clone()]).then_some(()))
        })
        .await?;
        Api::<Service>::namespaced(kube.clone(), &ns)
            .delete("web", &DeleteParams::default())
            .await?;
        eventually(&format!("{}: released", oct.name), WAIT, || async {
            Ok(lbs_named(&oct.client, &format!("{ns}/web"))
                .await?
                .is_empty()
                .then_some(()))
        })
        .await?;
    }
    Ok(())
}

/// A load balancer's listener ACLs are read in lists: one rule list for all its groups and one
/// address group list for all the address groups they name, whatever their number (a resync of
/// every Service that policies guard reads this for each of them).
#[tokio::test]
async fn listener_acls_read_the_groups_in_two_lists() -> Result<()> {
    use kuryr_neutron::{AddressGroupCreate, SecurityGroupCreate, SecurityGroupRuleCreate};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let emu = neutron_emulator::Emulator::start(neutron_emulator::EmulatorOptions::default()).await?;
    let client = kuryr_neutron::NeutronClient::new(&ClientOptions::noauth(emu.url()))?;
    let mut groups = Vec::new();
    let mut want = BTreeSet::new();
    for i in 0..5u8 {
        let sg = client
            .create_security_group(&SecurityGroupCreate {
                name: format!("acl-{i}"),
                ..Default::default()
            })
            .await?;
        let cidr = format!("10.9.{i}.0/24");
        let ag = client
            .create_address_group(&AddressGroupCreate {
                name: format!("acl-{i}"),
                project_id: None,
                description: None,
                addresses: vec![cidr.clone()],
            })
            .await?;
        client
            .create_security_group_rule(&SecurityGroupRuleCreate {
                security_group_id: sg.id.clone(),
                direction: "ingress".into(),
                ethertype: Some("IPv4".into()),
                protocol: Some("tcp".into()),
                port_range_min: Some(8080),
                port_range_max: Some(8080),
                remote_address_group_id: Some(ag.id),
                ..Default::default()
            })
            .await?;
        want.insert(cidr);
        groups.push(sg.id);
    }
    let reads = |s: &neutron_emulator::Stats| -> u64 {
        s.operations
            .iter()
            .filter(|(op, _)| op.starts_with("security_group_rule.") || op.starts_with("address_group."))
            .map(|(_, n)| n)
            .sum()
    };
    let before = reads(&emu.stats());
    let port = kuryr_crds::LbSpecPort {
        name: None,
        port: 80,
        protocol: "TCP".into(),
        target_port: "8080".into(),
    };
    let acls = kuryr_controller::services::security::listener_acls(
        &client,
        &groups,
        &[],
        &[port],
        &[],
        "10.0.0.10".parse()?,
    )
    .await?;
    assert_eq!(acls.len(), 1, "{acls:?}");
    assert_eq!(
        acls[0].allowed_cidrs.iter().cloned().collect::<BTreeSet<_>>(),
        want
    );
    assert_eq!(reads(&emu.stats()) - before, 2, "{:?}", emu.stats().operations);
    Ok(())
}

/// A pool a provider put in ERROR under an ACTIVE load balancer refuses every member write (409
/// "immutable") for good: the handler's pass that meets it deletes the pool and the retry makes
/// it again with the members asked for, without waiting for the periodic check (an hour here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_in_error_is_made_again_by_the_pass_that_meets_it() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        // Only the emulator can be told to fail one object.
        let Some(emu) = &oct.emulator else { continue };
        let ns = unique("poolerr");
        let bed = Bed::new(&ns).await?;
        let _ctrl = bed.controller(&oct, "reconcile_period = 3600\n", "svc-poolerr");
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.17", &[("http", 80, 8080, "TCP")]).await?;
        set_endpoints(kube, &ns, "web", &ips(2), &[("http", 8080)]).await?;
        let lb = recorded(kube, &ns, "web", 1, 2).await?.loadbalancer.unwrap().id;
        let tree = oct.client.get_status_tree(&lb).await?;
        let failed_pool = tree.loadbalancer.listeners[0].pools[0].id.clone();
        emu.force_child_error("pools", &failed_pool)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        set_endpoints(kube, &ns, "web", &ips(3), &[("http", 8080)]).await?;
        eventually(
            "the pool made again with three members",
            Duration::from_secs(30),
            || async {
                let tree = oct.client.get_status_tree(&lb).await?;
                let pools: Vec<_> = tree
                    .loadbalancer
                    .listeners
                    .iter()
                    .flat_map(|l| &l.pools)
                    .collect();
                let healthy = pools.len() == 1
                    && pools[0].id != failed_pool
                    && pools[0].provisioning_status == "ACTIVE"
                    && pools[0].members.len() == 3;
                Ok(healthy.then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

/// `[kubernetes] service_project_driver = annotation` with pods in the default project, as
/// upstream: the load balancer is made in the project the namespace's annotation names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_project_driver_decides_the_load_balancers_project() -> Result<()> {
    init_logs();
    for oct in octavia_targets(LatencyProfile::Instant).await? {
        let ns = unique("svcproj");
        let bed = Bed::new(&ns).await?;
        let tenant = uuid::Uuid::new_v4().simple().to_string();
        Api::<k8s_openapi::api::core::v1::Namespace>::all(bed.client().clone())
            .patch(
                &ns,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": {"openstack.org/kuryr-project": tenant}}})),
            )
            .await?;
        let _ctrl = bed.controller(
            &oct,
            "[kubernetes]\nservice_project_driver = annotation\n",
            "svc-project",
        );
        let kube = bed.client();
        create_service(kube, &ns, "web", "10.96.0.18", &[("http", 80, 8080, "TCP")]).await?;
        let lb = recorded(kube, &ns, "web", 1, 0).await?.loadbalancer.unwrap().id;
        let got = oct.client.get_load_balancer(&lb).await?;
        assert_eq!(got.project_id, tenant, "{}", oct.name);
        assert_ne!(tenant, bed.project);
    }
    Ok(())
}
