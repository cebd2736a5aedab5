//! Services proven by traffic: the controller's `service`, `endpoints` and `kuryrloadbalancer`
//! handlers with `endpoints_driver_octavia_provider = ovn`, a real Octavia whose `ovn` provider
//! (ovn-octavia-provider) drives the OVN lab, and pods wired on the lab's two chassis by the real
//! CNI daemons. The load balancer is an OVN northbound Load_Balancer: what the client pods see at
//! the Service's VIP is OVN's DNAT to the members kuryr gave Octavia. A NetworkPolicy on the
//! backends (the `policy` handlers, `pod_security_groups_driver = policy`) holds for traffic
//! through the VIP too: the allowed client reaches every backend through it, the other none,
//! until the policy is deleted.
//!
//! Needs the OVN lab (`KURYR_TEST_OVN_NEUTRON_URL`, `KURYR_TEST_OVN_LAB`, see ovn.rs) and that
//! Octavia at `KURYR_TEST_OCTAVIA_OVN_URL` (`OCTAVIA_OVN_LAB=<lab dir>
//! scripts/octavia-lab/start-octavia.sh` starts it on :9877); without them the test prints why it
//! skips, unless `KURYR_TEST_REQUIRE_OVN=1`, which makes either missing an error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_crds::KuryrLoadBalancer;
use kuryr_neutron::octavia::OctaviaClient;
use kuryr_neutron::{ClientOptions, NeutronClient, RouterCreate, RouterInterfaceSpec};
use serde_json::json;
use support::ovn_lab::*;
use support::probe::{Expect, Probe, Proto, Server, check_all, tcp_replies};
use support::*;

const OCTAVIA_URL_VAR: &str = "KURYR_TEST_OCTAVIA_OVN_URL";
const SVC: &str = "web";
const SVC_PORT: u16 = 80;
const VIP: &str = "10.92.0.50";
/// Connections per look at the VIP: with three members hashed on the source port, one of them
/// missing from 30 connections has a chance of about 3 * (2/3)^30, 1.5e-5.
const CONNECTIONS: usize = 30;
/// How long traffic to the VIP may take to follow a change (Octavia, the provider, northd, the
/// chassis' flows).
const CONVERGE: Duration = Duration::from_secs(60);

/// The ovn-enabled Octavia's URL; `None` (after saying why) when the test must skip.
fn octavia_url() -> Result<Option<String>> {
    let url = std::env::var(OCTAVIA_URL_VAR)
        .ok()
        .filter(|u| !u.trim().is_empty());
    if url.is_none() {
        if std::env::var("KURYR_TEST_REQUIRE_OVN").is_ok_and(|v| v.trim() == "1") {
            bail!(
                "KURYR_TEST_REQUIRE_OVN=1 but {OCTAVIA_URL_VAR} is unset: the Services-on-OVN test must run \
                 (OCTAVIA_OVN_LAB=<ovn lab dir> scripts/octavia-lab/start-octavia.sh starts that Octavia)"
            );
        }
        skip(format!(
            "{OCTAVIA_URL_VAR} is unset (OCTAVIA_OVN_LAB=<ovn lab dir> scripts/octavia-lab/start-octavia.sh \
             starts an Octavia with the ovn provider on :9877; scripts/test-all.sh sets it)"
        ));
    }
    Ok(url)
}

/// A project (Octavia takes Keystone-sized ids) with a pod network and a service network joined
/// by a router, as a cluster's Neutron would have them.
struct Fixture {
    project: String,
    pod_subnet: String,
    service_subnet: String,
    sg: String,
    router: String,
}

impl Fixture {
    async fn create(client: &NeutronClient) -> Result<Self> {
        let project = uuid::Uuid::new_v4().simple().to_string();
        let mut subnets = Vec::new();
        for (name, cidr) in [("pods", "10.91.0.0/24"), ("services", "10.92.0.0/24")] {
            let net = client
                .create_network(&kuryr_neutron::NetworkCreate {
                    name: Some(name.into()),
                    project_id: Some(project.clone()),
                    ..Default::default()
                })
                .await?;
            let sn = client
                .create_subnet(&kuryr_neutron::SubnetCreate {
                    network_id: net.id,
                    ip_version: 4,
                    cidr: Some(cidr.into()),
                    project_id: Some(project.clone()),
                    name: Some(name.into()),
                    ..Default::default()
                })
                .await?;
            subnets.push(sn.id);
        }
        let sg = client
            .create_security_group(&kuryr_neutron::SecurityGroupCreate {
                name: "pods".into(),
                project_id: Some(project.clone()),
                ..Default::default()
            })
            .await?;
        let router = client
            .create_router(&RouterCreate {
                name: Some("cluster".into()),
                project_id: Some(project.clone()),
                ..Default::default()
            })
            .await?;
        let fx = Self {
            project,
            service_subnet: subnets.pop().context("service subnet")?,
            pod_subnet: subnets.pop().context("pod subnet")?,
            sg: sg.id,
            router: router.id,
        };
        for s in [&fx.pod_subnet, &fx.service_subnet] {
            client
                .add_router_interface(&fx.router, &RouterInterfaceSpec::Subnet { subnet_id: s.clone() })
                .await?;
        }
        Ok(fx)
    }

    /// Deletes what the test (or a failed run of it) left: load balancers, router, project.
    async fn cleanup(&self, neutron: &NeutronClient, octavia: &OctaviaClient) {
        let f = kuryr_neutron::ListFilter::new().project_id(&self.project);
        for lb in octavia.list_load_balancers(&f).await.unwrap_or_default() {
            let _ = octavia.delete_load_balancer(&lb.id, true).await;
        }
        let _ = eventually("the project's load balancers deleted", WAIT, || async {
            Ok(octavia.list_load_balancers(&f).await?.is_empty().then_some(()))
        })
        .await;
        for p in pod_ports(neutron, &self.project).await.unwrap_or_default() {
            let _ = neutron.delete_port(&p.id).await;
        }
        for s in [&self.pod_subnet, &self.service_subnet] {
            let spec = RouterInterfaceSpec::Subnet { subnet_id: s.clone() };
            let _ = neutron.remove_router_interface(&self.router, &spec).await;
        }
        let _ = neutron.delete_router(&self.router).await;
        cleanup_project(neutron, &self.project).await;
    }
}

fn config(fx: &Fixture) -> std::sync::Arc<kuryr_config::KuryrConfig> {
    kuryr_testbed::config(&format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport,service,endpoints,kuryrloadbalancer,policy,\
         kuryrnetworkpolicy,pod_label\npod_security_groups_driver = policy\n\
         pod_vif_driver = neutron-vif\nvif_pool_driver = noop\ncluster_id = svc-ovn-{}\n\
         endpoints_driver_octavia_provider = ovn\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nservice_subnet = {}\n\
         resource_tags = k8s,e2e\n",
        &fx.project[..8],
        fx.project,
        fx.pod_subnet,
        fx.sg,
        fx.service_subnet
    ))
}

async fn create_service(kube: &Client) -> Result<()> {
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SVC, "namespace": NS},
        "spec": {"type": "ClusterIP", "clusterIP": VIP, "selector": {"app": SVC},
                 "ports": [{"name": "http", "port": SVC_PORT, "targetPort": APP_PORT, "protocol": "TCP"}]}
    }))?;
    Api::<Service>::namespaced(kube.clone(), NS)
        .create(&PostParams::default(), &svc)
        .await?;
    Ok(())
}

/// Writes the Service's EndpointSlice (the Kubernetes emulator has no EndpointSlice controller)
/// with `backends` ready, their IPs from their ports as kuryr wired them.
async fn set_endpoints(kube: &Client, backends: &[&Wired]) -> Result<()> {
    let api = Api::<EndpointSlice>::namespaced(kube.clone(), NS);
    let name = format!("{SVC}-slice");
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": SVC}},
        "addressType": "IPv4",
        "endpoints": backends.iter().map(|b| json!({
            "addresses": [b.ip().to_string()], "conditions": {"ready": true},
            "targetRef": {"kind": "Pod", "name": b.name(), "namespace": NS}
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": APP_PORT, "protocol": "TCP"}],
    }))?;
    if api.get_opt(&name).await?.is_none() {
        api.create(&PostParams::default(), &slice).await?;
    } else {
        // A merge patch would merge nothing into the endpoint list: replace it.
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"endpoints": slice.endpoints})),
        )
        .await?;
    }
    Ok(())
}

/// Waits until the KuryrLoadBalancer records a load balancer with `members` members.
async fn recorded_members(kube: &Client, members: usize) -> Result<()> {
    let api = Api::<KuryrLoadBalancer>::namespaced(kube.clone(), NS);
    eventually(
        &format!("KuryrLoadBalancer {NS}/{SVC} with one listener and {members} members"),
        WAIT,
        || async {
            let Some(st) = api.get_opt(SVC).await?.and_then(|k| k.status) else {
                return Ok(None);
            };
            Ok(
                (st.loadbalancer.is_some() && st.listeners.len() == 1 && st.members.len() == members)
                    .then_some(()),
            )
        },
    )
    .await
}

/// Connects to the VIP from `client` until the backends that answer are exactly `want` (every
/// one of them seen in one round of connections, nobody else), or fails with what answered.
fn vip_reaches(client: &Wired, want: &[&str]) -> Result<Duration> {
    let vip: IpAddr = VIP.parse()?;
    let want: BTreeSet<&str> = want.iter().copied().collect();
    let t = Instant::now();
    loop {
        let replies = tcp_replies(&client.path(), vip, SVC_PORT, CONNECTIONS, Duration::from_secs(2))?;
        let answered: BTreeSet<&str> = replies.iter().filter_map(|r| r.as_deref().ok()).collect();
        let failed = replies.iter().filter(|r| r.is_err()).count();
        if answered == want && failed == 0 {
            return Ok(t.elapsed());
        }
        if t.elapsed() > CONVERGE {
            let errors: BTreeSet<&str> = replies
                .iter()
                .filter_map(|r| r.as_ref().err())
                .map(String::as_str)
                .collect();
            bail!(
                "{} -> {VIP}:{SVC_PORT}: wanted exactly {want:?}; the last {CONNECTIONS} connections were answered by \
                 {answered:?}, {failed} failed ({errors:?})",
                client.name()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// [`wire`] for a pod with `labels`, its address then written into its status as the kubelet
/// would (the policy handlers select peers by their pods' addresses).
async fn wire_labelled(
    lab: &Lab,
    kube: &Kube,
    nodes: &[Node; 2],
    name: &str,
    node: usize,
    labels: serde_json::Value,
) -> Result<Wired> {
    let pods = Api::<Pod>::namespaced(kube.client.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"nodeName": nodes[node].name,
                 "containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": APP_PORT}]}]}
    }))?;
    let pod = pods.create(&PostParams::default(), &pod).await?;
    let wired = wire_created(lab, kube, nodes, &pod, node).await?;
    let ip = wired.ip().to_string();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})),
    )
    .await?;
    Ok(wired)
}

/// Connects to the VIP from `client` and expects nothing to answer: no backend reached through
/// it, for [`BLOCKED_FOR`] once it holds (within [`CONVERGE`]).
fn vip_blocked(client: &Wired, why: &str) -> Result<()> {
    blocked(client, VIP.parse()?, SVC_PORT, why)
}

/// Waits until nothing from `client` reaches `addr:port` (a policy in force).
fn blocked(client: &Wired, addr: IpAddr, port: u16, why: &str) -> Result<()> {
    let probe = Probe::new(
        format!("{} -> {addr}:{port} ({why})", client.name()),
        &client.path(),
        Proto::Tcp,
        addr,
        port,
        Expect::Closed,
    );
    let t = Instant::now();
    loop {
        match check_all(std::slice::from_ref(&probe), BLOCKED_FOR) {
            Ok(_) => return Ok(()),
            Err(e) if t.elapsed() > CONVERGE => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// Whether the OVN northbound database has a load balancer with the VIP.
fn nb_has_vip(lab: &Lab) -> Result<bool> {
    let vips = lab.ovn(
        "ovn-nbctl",
        "nb",
        &["--bare", "--columns=vips", "list", "Load_Balancer"],
    )?;
    Ok(vips.contains(&format!("{VIP}:{SVC_PORT}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn service_vip_on_the_ovn_provider_balances_over_its_backends_follows_scaling_and_goes_with_the_service()
-> Result<()> {
    let Some(url) = octavia_url()? else {
        return Ok(());
    };
    let Some(session) = enter().await? else {
        return Ok(());
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lab = &session.lab;
    let octavia = OctaviaClient::new(&ClientOptions::noauth(&url))?;
    let providers = octavia
        .list_providers()
        .await
        .context("list the Octavia's providers")?;
    ensure!(
        providers.iter().any(|p| p.name == "ovn"),
        "the Octavia at {url} has no ovn provider (providers: {:?})",
        providers.iter().map(|p| &p.name).collect::<Vec<_>>()
    );
    let fx = Fixture::create(lab.client()).await?;
    let result = run(lab, &octavia, &fx).await;
    fx.cleanup(lab.client(), &octavia).await;
    result
}

async fn run(lab: &Lab, octavia: &OctaviaClient, fx: &Fixture) -> Result<()> {
    lab.client()
        .create_security_group_rule(&kuryr_neutron::SecurityGroupRuleCreate {
            security_group_id: fx.sg.clone(),
            direction: "ingress".into(),
            ethertype: Some("IPv4".into()),
            project_id: Some(fx.project.clone()),
            ..Default::default()
        })
        .await?;
    let kube = start_kube().await?;
    let metrics = Metrics::new();
    let deployments =
        Deployments::noauth(&lab.target.url, &metrics)?.with_octavia("default", octavia.clone());
    let _ctrl =
        kuryr_testbed::start_controller_with(&kube.client, deployments, metrics, config(fx), "e2e-svc");
    create_namespace(&kube.client, NS).await?;
    let nodes = lab.nodes(&kube).await?;

    // Three backends over both chassis, a client on each.
    let mut backends = Vec::new();
    for (i, node) in [0, 1, 0].into_iter().enumerate() {
        let name = format!("backend-{i}");
        backends.push(wire_labelled(lab, &kube, &nodes, &name, node, json!({"app": SVC})).await?);
    }
    let clients = [
        wire_labelled(lab, &kube, &nodes, "client-0", 0, json!({"role": "client-0"})).await?,
        wire_labelled(lab, &kube, &nodes, "client-1", 1, json!({"role": "client-1"})).await?,
    ];
    let _servers = backends
        .iter()
        .map(|b| Server::start_replying(&b.path(), APP_PORT, b.name()))
        .collect::<Result<Vec<_>>>()?;
    // The backends answer directly first, so that what the VIP shows later is the load balancer's.
    let direct: Vec<Probe> = clients
        .iter()
        .flat_map(|c| {
            backends.iter().map(move |b| {
                Probe::new(
                    format!("{} -> {}", c.name(), b.name()),
                    &c.path(),
                    Proto::Tcp,
                    b.ip(),
                    APP_PORT,
                    Expect::Open,
                )
            })
        })
        .collect();
    check_all(&direct, PROBE_DEADLINE)?;

    let t = Instant::now();
    create_service(&kube.client).await?;
    let all: Vec<&Wired> = backends.iter().collect();
    set_endpoints(&kube.client, &all).await?;
    recorded_members(&kube.client, 3).await?;
    let lbs = octavia
        .list_load_balancers(&kuryr_neutron::ListFilter::new().project_id(&fx.project))
        .await?;
    ensure!(
        lbs.len() == 1
            && lbs[0].provider.as_deref() == Some("ovn")
            && lbs[0].vip_address.as_deref() == Some(VIP)
            && lbs[0].provisioning_status == "ACTIVE",
        "wanted one ACTIVE ovn load balancer on {VIP}, Octavia has {:?}",
        lbs.iter()
            .map(|l| (&l.provider, &l.vip_address, &l.provisioning_status))
            .collect::<Vec<_>>()
    );
    // The provider reports ACTIVE to Octavia while its own queue may still be writing the listener's VIP
    // into the northbound database.
    let nb_deadline = Instant::now() + Duration::from_secs(30);
    while !nb_has_vip(lab)? {
        ensure!(
            Instant::now() < nb_deadline,
            "no OVN northbound Load_Balancer with {VIP}:{SVC_PORT}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let names: Vec<&str> = backends.iter().map(Wired::name).collect();
    for c in &clients {
        let took = vip_reaches(c, &names)?;
        eprintln!(
            "{}: the VIP reached all 3 backends ({:?} after the Service, {took:?} probing)",
            c.name(),
            t.elapsed()
        );
    }

    // A policy on the backends admitting client-0 alone holds through the VIP: client-0 still
    // reaches every backend, client-1 none; deleted, both reach them again.
    let policies = Api::<NetworkPolicy>::namespaced(kube.client.clone(), NS);
    let np: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "only-client-0", "namespace": NS},
        "spec": {"podSelector": {"matchLabels": {"app": SVC}}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client-0"}}}],
                              "ports": [{"protocol": "TCP", "port": APP_PORT}]}]}
    }))?;
    let t = Instant::now();
    policies.create(&PostParams::default(), &np).await?;
    vip_blocked(&clients[1], "not admitted by the backends' policy")?;
    vip_reaches(&clients[0], &names).context("client-0 admitted by the policy")?;
    eprintln!(
        "policy on the backends: client-1 blocked and client-0 served through the VIP {:?} after it",
        t.elapsed()
    );
    policies.delete("only-client-0", &DeleteParams::default()).await?;
    for c in &clients {
        vip_reaches(c, &names).with_context(|| format!("{} after the policy was deleted", c.name()))?;
    }

    // An egress policy on client-0 admitting the backends on their port admits the Service in
    // front of them on its own port: OVN checks client-0's egress before its load balancer
    // rewrites VIP:80 to a backend's :8080 (upstream admitted the VIP on 8080 only).
    let np: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "client-0-out", "namespace": NS},
        "spec": {"podSelector": {"matchLabels": {"role": "client-0"}}, "policyTypes": ["Egress"],
                 "egress": [{"to": [{"podSelector": {"matchLabels": {"app": SVC}}}],
                             "ports": [{"protocol": "TCP", "port": APP_PORT}]}]}
    }))?;
    let t = Instant::now();
    policies.create(&PostParams::default(), &np).await?;
    blocked(
        &clients[0],
        clients[1].ip(),
        APP_PORT,
        "not a destination client-0's policy admits",
    )?;
    vip_reaches(&clients[0], &names).context("client-0 through the VIP under its egress policy")?;
    eprintln!(
        "egress policy on client-0: other pods blocked, the Service's VIP:{SVC_PORT} served {:?} after it",
        t.elapsed()
    );
    policies.delete("client-0-out", &DeleteParams::default()).await?;

    // The except clause of an egress ipBlock holds through the Service (Kubernetes' e2e "except
    // clause while egress access to server in CIDR block" connects through it): the block holds
    // the VIP's address, yet OVN checks client-0's egress again on the backend its load balancer
    // picks, so the excepted backends are never reached through the VIP, and the other one is.
    let except: Vec<String> = backends[..2].iter().map(|b| format!("{}/32", b.ip())).collect();
    let np: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "client-0-block", "namespace": NS},
        "spec": {"podSelector": {"matchLabels": {"role": "client-0"}}, "policyTypes": ["Egress"],
                 "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": except}}]}]}
    }))?;
    let t = Instant::now();
    policies.create(&PostParams::default(), &np).await?;
    blocked(
        &clients[0],
        backends[0].ip(),
        APP_PORT,
        "excepted from client-0's ipBlock",
    )?;
    let reached = loop {
        let replies = tcp_replies(
            &clients[0].path(),
            VIP.parse()?,
            SVC_PORT,
            12,
            Duration::from_secs(1),
        )?;
        let answered: BTreeSet<String> = replies.into_iter().filter_map(Result::ok).collect();
        if answered.len() == 1 || t.elapsed() > CONVERGE {
            break answered;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    ensure!(
        reached == BTreeSet::from([backends[2].name().to_string()]),
        "through the VIP client-0 reached {reached:?}: wanted {} alone (the others are excepted)",
        backends[2].name()
    );
    eprintln!(
        "egress ipBlock except on client-0: through the VIP only the backend the block holds answers, {:?} after it",
        t.elapsed()
    );
    policies
        .delete("client-0-block", &DeleteParams::default())
        .await?;

    // Scaled to one: only that backend answers, from either chassis.
    set_endpoints(&kube.client, &[&backends[1]]).await?;
    recorded_members(&kube.client, 1).await?;
    for c in &clients {
        vip_reaches(c, &[backends[1].name()]).with_context(|| format!("{} after scaling to 1", c.name()))?;
    }

    // The Service deleted: the load balancer goes from Octavia and OVN, and the VIP stops answering.
    Api::<Service>::namespaced(kube.client.clone(), NS)
        .delete(SVC, &DeleteParams::default())
        .await?;
    Api::<EndpointSlice>::namespaced(kube.client.clone(), NS)
        .delete(&format!("{SVC}-slice"), &DeleteParams::default())
        .await?;
    let klbs = Api::<KuryrLoadBalancer>::namespaced(kube.client.clone(), NS);
    eventually(
        "the KuryrLoadBalancer and the Octavia load balancer deleted",
        WAIT,
        || async {
            let lbs = octavia
                .list_load_balancers(&kuryr_neutron::ListFilter::new().project_id(&fx.project))
                .await?;
            Ok((klbs.get_opt(SVC).await?.is_none() && lbs.is_empty()).then_some(()))
        },
    )
    .await?;
    eventually("the OVN northbound load balancer deleted", WAIT, || async {
        Ok((!nb_has_vip(lab)?).then_some(()))
    })
    .await?;
    let vip: IpAddr = VIP.parse()?;
    let gone: Vec<Probe> = clients
        .iter()
        .map(|c| {
            Probe::new(
                format!("{} -> deleted Service", c.name()),
                &c.path(),
                Proto::Tcp,
                vip,
                SVC_PORT,
                Expect::Closed,
            )
        })
        .collect();
    check_all(&gone, BLOCKED_FOR)?;

    for w in backends.iter().chain(clients.iter()) {
        remove(lab, &kube, &nodes, w).await?;
    }
    Ok(())
}
