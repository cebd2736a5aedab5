//! Services under deployment placement, end to end: a controller with the `service`, `endpoints` and
//! `kuryrloadbalancer` handlers, the Kubernetes emulator and two OpenStack deployments, each a Neutron
//! emulator (pod, service and external networks) and an Octavia emulator whose VIP ports live in that
//! Neutron. A load balancer is placed once, in the deployment of its namespace's binding, with that
//! deployment's service subnet; it stays there (reconcile, member updates, repair, floating IP, deletion)
//! after the project is rebound; the orphan sweep runs per deployment; and nothing falls back to a
//! deployment in maintenance or to another cloud's subnet (docs/placement.md, "Services").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_crds::names::annotations::DEPLOYMENT;
use kuryr_crds::{KuryrLoadBalancer, KuryrOpenStackDeployment, KuryrProjectBinding};
use kuryr_neutron::octavia::{LoadBalancer, LoadBalancerCreate, OctaviaClient};
use kuryr_neutron::{
    ClientOptions, ListFilter, NetworkCreate, NeutronClient, RouterCreate, RouterInterfaceSpec, SubnetCreate,
};
use neutron_emulator::{Emulator, EmulatorHandle, EmulatorOptions};
use octavia_emulator::{OctaviaEmulator, OctaviaHandle, OctaviaOptions};
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(60);

/// Octavia's network driver on a deployment's Neutron emulator: VIP ports exist there, so floating IPs
/// can be associated with them.
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

/// One OpenStack deployment: Neutron (pod subnet, service subnet 10.96.0.0/24, an external network routed
/// to the service subnet) and Octavia.
struct Cloud {
    neutron: NeutronClient,
    octavia: OctaviaClient,
    fx: NeutronFixture,
    service_subnet: String,
    external_net: String,
    neutron_url: String,
    octavia_url: String,
    _emulators: (EmulatorHandle, OctaviaHandle),
}

impl Cloud {
    async fn start() -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let emu = Emulator::start(EmulatorOptions::default()).await?;
        let neutron = NeutronClient::new(&ClientOptions::noauth(emu.url()))?;
        let fx = neutron_fixture_subnets(&neutron, &["10.1.0.0/24", "10.96.0.0/24"]).await?;
        let project = Some(fx.project.clone());
        let ext = neutron
            .create_network(&NetworkCreate {
                name: Some("public".into()),
                project_id: project.clone(),
                router_external: Some(true),
                ..Default::default()
            })
            .await?;
        neutron
            .create_subnet(&SubnetCreate {
                network_id: ext.id.clone(),
                ip_version: 4,
                cidr: Some("172.24.4.0/24".into()),
                project_id: project.clone(),
                ..Default::default()
            })
            .await?;
        let router = neutron
            .create_router(&RouterCreate {
                project_id: project,
                external_gateway_info: Some(json!({"network_id": ext.id})),
                ..Default::default()
            })
            .await?;
        let service_subnet = fx.subnets[1].subnet.clone();
        neutron
            .add_router_interface(
                &router.id,
                &RouterInterfaceSpec::Subnet {
                    subnet_id: service_subnet.clone(),
                },
            )
            .await?;
        let oct = OctaviaEmulator::start(OctaviaOptions {
            vip_ports: Some(std::sync::Arc::new(NeutronVipPorts(emu.port_control()))),
            ..OctaviaOptions::default()
        })
        .await?;
        Ok(Self {
            octavia: OctaviaClient::new(&ClientOptions::noauth(oct.url()))?,
            neutron_url: emu.url().to_string(),
            octavia_url: oct.url().to_string(),
            neutron,
            fx,
            service_subnet,
            external_net: ext.id,
            _emulators: (emu, oct),
        })
    }

    /// The `[neutron]` / `[deployment:<name>]` options of this cloud (credentials, pod ids, Octavia).
    fn section(&self) -> String {
        format!(
            "auth_type = noauth\nendpoint_override = {}\nload_balancer_endpoint_override = {}\n\
             pod_subnet = {}\npod_security_groups = {}\n",
            self.neutron_url, self.octavia_url, self.fx.subnet, self.fx.sg
        )
    }

    /// This Octavia's load balancers named `name` (not deleted).
    async fn lbs(&self, name: &str) -> Result<Vec<LoadBalancer>> {
        Ok(self
            .octavia
            .list_load_balancers(&ListFilter::new().name(name.to_string()))
            .await?
            .into_iter()
            .filter(|lb| lb.provisioning_status != "DELETED")
            .collect())
    }

    async fn floating_ips(&self) -> Result<Vec<kuryr_neutron::FloatingIp>> {
        Ok(self
            .neutron
            .list_floatingips(&ListFilter::new().eq("floating_network_id", self.external_net.clone()))
            .await?)
    }
}

fn start(kube: &Client, ini: &str) -> Controller {
    let cfg = config(ini);
    let metrics = Metrics::new();
    let deployments = Deployments::from_config(&cfg, &metrics).expect("deployments");
    start_controller_with(kube, deployments, metrics, cfg, "placement-services")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..6])
}

/// A namespace of project `project` (Octavia takes Keystone-sized project ids).
async fn project_namespace(kube: &Client, ns: &str, project: &str) -> Result<()> {
    create_namespace(kube, ns, json!({"openstack.org/kuryr-project": project})).await
}

async fn create_service(kube: &Client, ns: &str, name: &str, type_: &str, ip: &str) -> Result<()> {
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"type": type_, "clusterIP": ip, "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    }))?;
    Api::<Service>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await?;
    Ok(())
}

/// The Service's one EndpointSlice with `n` ready endpoints on port 8080 (as the EndpointSlice
/// controller would write it).
async fn set_endpoints(kube: &Client, ns: &str, svc: &str, n: usize) -> Result<()> {
    let api = Api::<EndpointSlice>::namespaced(kube.clone(), ns);
    let name = format!("{svc}-slice");
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": (0..n).map(|i| json!({
            "addresses": [format!("10.1.0.{}", 10 + i)], "conditions": {"ready": true},
            "targetRef": {"kind": "Pod", "name": format!("{svc}-{i}"), "namespace": ns}
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))?;
    if api.get_opt(&name).await?.is_some() {
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::to_value(&slice)?),
        )
        .await?;
    } else {
        api.create(&PostParams::default(), &slice).await?;
    }
    Ok(())
}

/// The KuryrLoadBalancer once its status records a load balancer with `members` members.
async fn built(kube: &Client, ns: &str, name: &str, members: usize) -> Result<KuryrLoadBalancer> {
    let api = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), ns);
    eventually(
        &format!("KuryrLoadBalancer {ns}/{name} with {members} members"),
        WAIT,
        || async {
            Ok(api.get_opt(name).await?.filter(|k| {
                k.status
                    .as_ref()
                    .is_some_and(|s| s.loadbalancer.is_some() && s.members.len() == members)
            }))
        },
    )
    .await
}

fn lb_id(klb: &KuryrLoadBalancer) -> String {
    klb.status
        .as_ref()
        .and_then(|s| s.loadbalancer.as_ref())
        .map(|lb| lb.id.clone())
        .unwrap_or_default()
}

/// Member addresses Octavia holds in the load balancer's pools.
async fn octavia_members(client: &OctaviaClient, lb: &str) -> Result<Vec<String>> {
    let tree = client.get_status_tree(lb).await?;
    let mut out: Vec<String> = tree
        .loadbalancer
        .listeners
        .iter()
        .flat_map(|l| &l.pools)
        .flat_map(|p| &p.members)
        .map(|m| m.address.clone())
        .collect();
    out.sort();
    Ok(out)
}

/// A Warning Event with `reason` regarding Service `ns/name` whose note contains `text`.
async fn warning(kube: &Client, ns: &str, name: &str, reason: &str, text: &str) -> Result<Event> {
    let api = Api::<Event>::namespaced(kube.clone(), ns);
    eventually(
        &format!("{reason} Event on {ns}/{name} saying {text:?}"),
        WAIT,
        || async {
            Ok(api
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Service")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                        && e.note.as_deref().unwrap_or("").contains(text)
                }))
        },
    )
    .await
}

/// Sets maintenance on `deployment` and waits until the controller follows the edit.
async fn set_maintenance(kube: &Client, deployment: &str, on: bool, move_existing: bool) -> Result<()> {
    let patch =
        json!({"spec": {"maintenance": {"enabled": on, "reason": "upgrade"}, "moveExisting": move_existing}});
    let api = Api::<KuryrOpenStackDeployment>::all(kube.clone());
    let generation = api
        .patch(deployment, &PatchParams::default(), &Patch::Merge(&patch))
        .await?
        .metadata
        .generation
        .context("the API server sets metadata.generation")?;
    eventually(
        &format!("{deployment} generation {generation} followed"),
        WAIT,
        || async {
            Ok(api
                .get(deployment)
                .await?
                .status
                .and_then(|s| s.observed_generation)
                .filter(|g| *g >= generation)
                .map(|_| ()))
        },
    )
    .await
}

/// The deployment `project`'s general binding is in now.
async fn bound(kube: &Client, project: &str) -> Result<Option<String>> {
    Ok(Api::<KuryrProjectBinding>::all(kube.clone())
        .get_opt(&kuryr_crds::binding_name(project, ""))
        .await?
        .and_then(|b| b.status)
        .and_then(|s| s.deployment))
}

fn two_clouds_ini(cluster: &str, a: &Cloud, b: &Cloud) -> String {
    format!(
        "[kubernetes]\nenabled_handlers = service,endpoints,kuryrloadbalancer\npod_project_driver = annotation\n\
         controller_namespace = default\ncluster_id = {cluster}\n\
         [neutron]\n{}\
         [neutron_defaults]\nservice_subnet = {}\nexternal_svc_net = {}\n\
         [deployment:west]\n{}service_subnet = {}\nexternal_svc_net = {}\n\
         [octavia_defaults]\nreconcile_period = 1\n\
         [pod_binding]\nenabled = True\nfilters = all\nweighers = creation_order\n",
        a.section(),
        a.service_subnet,
        a.external_net,
        b.section(),
        b.service_subnet,
        b.external_net,
    )
}

/// A Service of a project bound to `default` gets its load balancer (and floating IP) there, with that
/// deployment's service subnet. The project is moved to `west` (maintenance with moveExisting): the
/// existing load balancer is still reconciled in `default` (a member update, a repair after it is deleted
/// by hand), a new Service goes to `west` with west's subnet, a load balancer of the first Service's name in
/// `west` is an orphan there and swept, and deleting the first Service releases its load balancer and
/// floating IP in `default`, leaving `west` only the second Service's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_load_balancer_stays_in_the_deployment_it_was_made_in_after_a_rebind() -> Result<()> {
    init_logs();
    let (a, b) = (Cloud::start().await?, Cloud::start().await?);
    let kube = start_kube().await?;
    let client = &kube.client;
    let cluster = unique("svcplace");
    let _ctrl = start(client, &two_clouds_ini(&cluster, &a, &b));
    let project = uuid::Uuid::new_v4().simple().to_string();
    let ns = unique("shop");
    project_namespace(client, &ns, &project).await?;

    create_service(client, &ns, "web", "LoadBalancer", "10.96.0.10").await?;
    set_endpoints(client, &ns, "web", 2).await?;
    let web = built(client, &ns, "web", 2).await?;
    assert_eq!(
        web.annotations().get(DEPLOYMENT).map(String::as_str),
        Some("default")
    );
    assert_eq!(bound(client, &project).await?.as_deref(), Some("default"));
    let web_lb = lb_id(&web);
    let live = a.octavia.get_load_balancer(&web_lb).await?;
    assert_eq!(
        live.vip_subnet_id.as_deref(),
        Some(a.service_subnet.as_str()),
        "default's service_subnet"
    );
    assert!(b.lbs(&format!("{ns}/web")).await?.is_empty(), "nothing in west");
    let fip = eventually("web's floating IP in default", WAIT, || async {
        Ok(a.floating_ips().await?.into_iter().next())
    })
    .await?;
    assert!(b.floating_ips().await?.is_empty());

    // The project moves to west.
    set_maintenance(client, "default", true, true).await?;
    create_service(client, &ns, "api", "ClusterIP", "10.96.0.11").await?;
    set_endpoints(client, &ns, "api", 1).await?;
    let api_klb = built(client, &ns, "api", 1).await?;
    assert_eq!(bound(client, &project).await?.as_deref(), Some("west"), "rebound");
    assert_eq!(
        api_klb.annotations().get(DEPLOYMENT).map(String::as_str),
        Some("west")
    );
    let api_live = b.octavia.get_load_balancer(&lb_id(&api_klb)).await?;
    assert_eq!(
        api_live.vip_subnet_id.as_deref(),
        Some(b.service_subnet.as_str()),
        "west's service_subnet"
    );
    assert!(a.lbs(&format!("{ns}/api")).await?.is_empty());

    // web's endpoints change: the member update goes to default's Octavia.
    set_endpoints(client, &ns, "web", 3).await?;
    let web = built(client, &ns, "web", 3).await?;
    assert_eq!(lb_id(&web), web_lb, "the same load balancer");
    assert_eq!(
        octavia_members(&a.octavia, &web_lb).await?,
        ["10.1.0.10", "10.1.0.11", "10.1.0.12"]
    );
    assert!(
        b.lbs(&format!("{ns}/web")).await?.is_empty(),
        "still nothing in west"
    );

    // Deleted by hand in default: the reconciler repairs it there.
    a.octavia.delete_load_balancer(&web_lb, true).await?;
    let web = eventually("web rebuilt", WAIT, || async {
        let k = built(client, &ns, "web", 3).await?;
        Ok((lb_id(&k) != web_lb).then_some(k))
    })
    .await?;
    let rebuilt = lb_id(&web);
    assert_eq!(
        a.octavia
            .get_load_balancer(&rebuilt)
            .await?
            .vip_subnet_id
            .as_deref(),
        Some(a.service_subnet.as_str()),
        "rebuilt in default"
    );
    assert!(b.lbs(&format!("{ns}/web")).await?.is_empty(), "not in west");

    // A load balancer of web's name and tags in west is not web's: the sweep deletes it, in west only.
    let stray = b
        .octavia
        .create_load_balancer(&LoadBalancerCreate {
            name: Some(format!("{ns}/web")),
            project_id: Some(project.clone()),
            vip_subnet_id: Some(b.service_subnet.clone()),
            vip_address: Some("10.96.0.10".into()),
            tags: vec![
                kuryr_crds::names::neutron::cluster_tag(&cluster),
                format!("kuryr-rs.service={ns}/web"),
            ],
            ..Default::default()
        })
        .await?;
    eventually("the stray load balancer in west swept", WAIT, || async {
        Ok(b.lbs(&format!("{ns}/web")).await?.is_empty().then_some(()))
    })
    .await?;
    assert!(stray.id != rebuilt);
    assert_eq!(
        a.octavia.get_load_balancer(&rebuilt).await?.provisioning_status,
        "ACTIVE"
    );

    // Deleting web releases its load balancer and floating IP in default; west keeps only api's.
    Api::<Service>::namespaced(client.clone(), &ns)
        .delete("web", &DeleteParams::default())
        .await?;
    eventually(
        "web's load balancer and floating IP released in default",
        WAIT,
        || async {
            let gone = a.lbs(&format!("{ns}/web")).await?.is_empty()
                && a.neutron
                    .get_floatingip(&fip.id)
                    .await
                    .is_err_and(|e| e.is_not_found())
                && Api::<KuryrLoadBalancer>::namespaced(client.clone(), &ns)
                    .get_opt("web")
                    .await?
                    .is_none();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    let west: Vec<String> = b
        .octavia
        .list_load_balancers(&ListFilter::new())
        .await?
        .into_iter()
        .filter(|lb| lb.provisioning_status != "DELETED")
        .map(|lb| lb.name)
        .collect();
    assert_eq!(west, [format!("{ns}/api")]);
    assert!(b.floating_ips().await?.is_empty());
    Ok(())
}

/// No fallback: with every deployment in maintenance, a project without a binding gets no load balancer
/// anywhere and its Service a Warning Event listing why each deployment was removed; once `west` leaves
/// maintenance the project binds there, and since west has no `service_subnet` of its own the Service gets
/// a Warning Event naming that option instead of default's subnet id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_falls_back_to_a_deployment_in_maintenance_or_to_another_clouds_subnet() -> Result<()> {
    init_logs();
    let (a, b) = (Cloud::start().await?, Cloud::start().await?);
    let kube = start_kube().await?;
    let client = &kube.client;
    let cluster = unique("svcnofall");
    let ini = format!(
        "[kubernetes]\nenabled_handlers = service,endpoints,kuryrloadbalancer\npod_project_driver = annotation\n\
         controller_namespace = default\ncluster_id = {cluster}\n\
         [neutron]\n{}[neutron_defaults]\nservice_subnet = {}\n[deployment:west]\n{}\
         [octavia_defaults]\nreconcile_period = 1\n\
         [pod_binding]\nenabled = True\nfilters = all\nweighers = creation_order\n",
        a.section(),
        a.service_subnet,
        b.section(),
    );
    let _ctrl = start(client, &ini);
    // The controller creates the deployment objects at start.
    eventually("deployment objects", WAIT, || async {
        let n = Api::<KuryrOpenStackDeployment>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .len();
        Ok((n == 2).then_some(()))
    })
    .await?;
    set_maintenance(client, "default", true, false).await?;
    set_maintenance(client, "west", true, false).await?;
    let project = uuid::Uuid::new_v4().simple().to_string();
    let ns = unique("idle");
    project_namespace(client, &ns, &project).await?;
    create_service(client, &ns, "web", "ClusterIP", "10.96.0.20").await?;
    set_endpoints(client, &ns, "web", 1).await?;
    let e = warning(client, &ns, "web", "NoDeploymentPasses", "default").await?;
    let note = e.note.unwrap_or_default();
    assert!(note.contains("west"), "{note}");
    // Retried meanwhile (the error is retryable): still nothing made anywhere.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        Api::<KuryrLoadBalancer>::namespaced(client.clone(), &ns)
            .get_opt("web")
            .await?
            .is_none()
    );
    assert!(a.lbs(&format!("{ns}/web")).await?.is_empty());
    assert!(b.lbs(&format!("{ns}/web")).await?.is_empty());
    assert_eq!(bound(client, &project).await?, None);

    set_maintenance(client, "west", false, false).await?;
    create_service(client, &ns, "api", "ClusterIP", "10.96.0.21").await?;
    warning(
        client,
        &ns,
        "api",
        "InvalidInput",
        "[deployment:west] service_subnet",
    )
    .await?;
    assert_eq!(bound(client, &project).await?.as_deref(), Some("west"));
    assert!(
        Api::<KuryrLoadBalancer>::namespaced(client.clone(), &ns)
            .get_opt("api")
            .await?
            .is_none(),
        "never built with default's subnet"
    );
    assert!(a.lbs(&format!("{ns}/api")).await?.is_empty());
    assert!(b.lbs(&format!("{ns}/api")).await?.is_empty());
    Ok(())
}

/// A deployment removed from `kuryr.conf` while a load balancer lives in it: after the restart the Service
/// is not stuck. Deleting it releases its finalizers, with a Warning Event `DeploymentRemoved` naming the
/// load balancer left there, and nothing is looked for or made in the remaining deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_load_balancer_of_a_deployment_removed_from_the_configuration_is_drained() -> Result<()> {
    init_logs();
    let (a, b) = (Cloud::start().await?, Cloud::start().await?);
    let kube = start_kube().await?;
    let client = &kube.client;
    let cluster = unique("svcdrain");
    let ctrl = start(client, &two_clouds_ini(&cluster, &a, &b));
    eventually("deployment objects", WAIT, || async {
        let n = Api::<KuryrOpenStackDeployment>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .len();
        Ok((n == 2).then_some(()))
    })
    .await?;
    // New bindings go to west.
    set_maintenance(client, "default", true, false).await?;
    let project = uuid::Uuid::new_v4().simple().to_string();
    let ns = unique("gone");
    project_namespace(client, &ns, &project).await?;
    create_service(client, &ns, "web", "ClusterIP", "10.96.0.30").await?;
    set_endpoints(client, &ns, "web", 1).await?;
    let web = built(client, &ns, "web", 1).await?;
    assert_eq!(
        web.annotations().get(DEPLOYMENT).map(String::as_str),
        Some("west")
    );
    let left = lb_id(&web);
    ctrl.shutdown().await?;

    // west leaves the configuration.
    let ini = format!(
        "[kubernetes]\nenabled_handlers = service,endpoints,kuryrloadbalancer\npod_project_driver = annotation\n\
         controller_namespace = default\ncluster_id = {cluster}\n\
         [neutron]\n{}[neutron_defaults]\nservice_subnet = {}\n\
         [octavia_defaults]\nreconcile_period = 1\n\
         [pod_binding]\nenabled = True\nfilters = all\nweighers = creation_order\n",
        a.section(),
        a.service_subnet,
    );
    let _ctrl = start(client, &ini);
    Api::<Service>::namespaced(client.clone(), &ns)
        .delete("web", &DeleteParams::default())
        .await?;
    eventually("web's finalizers released", WAIT, || async {
        let svc = Api::<Service>::namespaced(client.clone(), &ns)
            .get_opt("web")
            .await?;
        let klb = Api::<KuryrLoadBalancer>::namespaced(client.clone(), &ns)
            .get_opt("web")
            .await?;
        Ok((svc.is_none() && klb.is_none()).then_some(()))
    })
    .await?;
    warning(
        client,
        &ns,
        "web",
        "DeploymentRemoved",
        &format!("\"west\" is no longer configured: load balancer {left} was left in it"),
    )
    .await?;
    assert_eq!(b.lbs(&format!("{ns}/web")).await?.len(), 1, "left, not reachable");
    assert!(
        a.lbs(&format!("{ns}/web")).await?.is_empty(),
        "nothing made in default"
    );
    Ok(())
}

/// With the `namespace` subnets driver a Service goes where its namespace's network is: after the project
/// is moved to `west`, a Service of a new namespace, which holds no pod yet, gets the namespace's network
/// made, waits for it to be placed and goes to `west` with it, while a new Service of the old namespace goes
/// to `default`, where that namespace's network (and the pods that come) still is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_namespace_networks_a_service_goes_where_its_namespace_network_is() -> Result<()> {
    init_logs();
    let (a, b) = (Cloud::start().await?, Cloud::start().await?);
    let (pa, ra) = namespace_subnet_infra(&a.neutron, &a.fx.project, "10.98.0.0/16").await?;
    let (pb, rb) = namespace_subnet_infra(&b.neutron, &b.fx.project, "10.98.0.0/16").await?;
    let kube = start_kube().await?;
    let client = &kube.client;
    let cluster = unique("svcns");
    let ini = format!(
        "[kubernetes]\nenabled_handlers = namespace,kuryrnetwork,service,endpoints,kuryrloadbalancer\n\
         pod_subnets_driver = namespace\npod_project_driver = annotation\ncontroller_namespace = default\n\
         cluster_id = {cluster}\n\
         [neutron]\n{}pod_router = {}\npod_subnet_pool = {}\n\
         [neutron_defaults]\nservice_subnet = {}\n\
         [deployment:west]\n{}pod_router = {}\npod_subnet_pool = {}\nservice_subnet = {}\n\
         [octavia_defaults]\nreconcile_period = 1\n\
         [pod_binding]\nenabled = True\nfilters = all\nweighers = creation_order\n",
        a.section(),
        ra.id,
        pa.id,
        a.service_subnet,
        b.section(),
        rb.id,
        pb.id,
        b.service_subnet,
    );
    let _ctrl = start(client, &ini);
    let project = uuid::Uuid::new_v4().simple().to_string();
    let old = unique("old");
    project_namespace(client, &old, &project).await?;
    create_service(client, &old, "web", "ClusterIP", "10.96.0.40").await?;
    set_endpoints(client, &old, "web", 1).await?;
    let web = built(client, &old, "web", 1).await?;
    assert_eq!(
        web.annotations().get(DEPLOYMENT).map(String::as_str),
        Some("default")
    );

    set_maintenance(client, "default", true, true).await?;
    let new = unique("new");
    project_namespace(client, &new, &project).await?;
    create_service(client, &new, "api", "ClusterIP", "10.96.0.41").await?;
    set_endpoints(client, &new, "api", 1).await?;
    create_service(client, &old, "web2", "ClusterIP", "10.96.0.42").await?;
    set_endpoints(client, &old, "web2", 1).await?;
    let api_klb = built(client, &new, "api", 1).await?;
    let web2 = built(client, &old, "web2", 1).await?;
    let kn_new = Api::<kuryr_crds::KuryrNetwork>::namespaced(client.clone(), &new)
        .get(&new)
        .await?;
    assert_eq!(
        kn_new.annotations().get(DEPLOYMENT).map(String::as_str),
        Some("west")
    );
    assert_eq!(
        api_klb.annotations().get(DEPLOYMENT).map(String::as_str),
        Some("west"),
        "with the new namespace's network"
    );
    assert_eq!(b.lbs(&format!("{new}/api")).await?.len(), 1);
    assert_eq!(
        web2.annotations().get(DEPLOYMENT).map(String::as_str),
        Some("default"),
        "with the old namespace's network, not the project's new binding"
    );
    assert_eq!(a.lbs(&format!("{old}/web2")).await?.len(), 1);
    assert!(b.lbs(&format!("{old}/web2")).await?.is_empty());
    Ok(())
}
