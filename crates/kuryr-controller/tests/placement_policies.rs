//! NetworkPolicy under deployment placement, end to end: a controller with the `vif`, `kuryrport`,
//! `policy`, `kuryrnetworkpolicy` and `pod_label` handlers (`pod_security_groups_driver = policy`),
//! the Kubernetes emulator and two OpenStack deployments, each a Neutron emulator. A policy's groups
//! are placed once, where its namespace's pods are, recorded on its KuryrNetworkPolicy, and stay
//! there after the project is rebound; pods' ports carry the groups of their own deployment; nothing
//! is left in either deployment at the end (docs/placement.md, "NetworkPolicy").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_crds::names::annotations::DEPLOYMENT;
use kuryr_crds::{KuryrNetworkPolicy, KuryrOpenStackDeployment, KuryrPort, KuryrProjectBinding};
use kuryr_neutron::{ClientOptions, ListFilter, NeutronClient};
use neutron_emulator::{Emulator, EmulatorHandle, EmulatorOptions};
use serde_json::{Value, json};
use support::*;

const WAIT: Duration = Duration::from_secs(60);

/// One OpenStack deployment: a Neutron emulator with a pod subnet and a default group.
struct Cloud {
    neutron: NeutronClient,
    fx: NeutronFixture,
    url: String,
    _emulator: EmulatorHandle,
}

impl Cloud {
    async fn start(cidr: &str) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let emu = Emulator::start(EmulatorOptions::default()).await?;
        let neutron = NeutronClient::new(&ClientOptions::noauth(emu.url()))?;
        let fx = neutron_fixture(&neutron, cidr).await?;
        Ok(Self {
            neutron,
            fx,
            url: emu.url().to_string(),
            _emulator: emu,
        })
    }

    fn section(&self) -> String {
        format!(
            "auth_type = noauth\nendpoint_override = {}\npod_subnet = {}\npod_security_groups = {}\n",
            self.url, self.fx.subnet, self.fx.sg
        )
    }

    /// This cluster's policy security groups and address groups here (by their description).
    async fn policy_groups(&self, cluster: &str) -> Result<(usize, usize)> {
        let prefix = format!("kuryr-rs:{cluster}:");
        let sgs = self
            .neutron
            .list_security_groups(&ListFilter::new())
            .await?
            .into_iter()
            .filter(|s| s.description.starts_with(&prefix))
            .count();
        let ags = self
            .neutron
            .list_address_groups(&ListFilter::new())
            .await?
            .into_iter()
            .filter(|a| a.description.starts_with(&prefix))
            .count();
        Ok((sgs, ags))
    }

    async fn has_group(&self, id: &str) -> Result<bool> {
        Ok(!self
            .neutron
            .list_security_groups(&ListFilter::new().id(id))
            .await?
            .is_empty())
    }
}

fn start(kube: &Client, ini: &str, identity: &str) -> Controller {
    let cfg = config(ini);
    let metrics = Metrics::new();
    let deployments = Deployments::from_config(&cfg, &metrics).expect("deployments");
    start_controller_with(kube, deployments, metrics, cfg, identity)
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..6])
}

async fn pod(kube: &Client, ns: &str, name: &str, labels: Value) -> Result<()> {
    let p: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": NODES[0], "containers": [{"name": "c", "image": "busybox"}]}
    }))?;
    Api::<Pod>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &p)
        .await?;
    Ok(())
}

/// `name` in `ns`: pods `app=db` admit ingress from pods `app=web` only (an address group).
async fn apply_policy(kube: &Client, ns: &str, name: &str, port: u16) -> Result<()> {
    let spec = policy_spec(port);
    let np: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns}, "spec": spec,
    }))?;
    Api::<NetworkPolicy>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &np)
        .await?;
    Ok(())
}

fn policy_spec(port: u16) -> Value {
    json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"],
           "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                        "ports": [{"protocol": "TCP", "port": port}]}]})
}

/// The KuryrNetworkPolicy once it has a security group: (its recorded deployment, the group).
async fn placed_policy(kube: &Client, ns: &str, name: &str) -> Result<(String, String)> {
    let api = Api::<KuryrNetworkPolicy>::namespaced(kube.clone(), ns);
    eventually(
        &format!("KuryrNetworkPolicy {ns}/{name} applied"),
        WAIT,
        || async {
            Ok(api.get_opt(name).await?.and_then(|k| {
                let sg = k.status.as_ref()?.security_group_id.clone()?;
                Some((k.annotations().get(DEPLOYMENT)?.clone(), sg))
            }))
        },
    )
    .await
}

/// The pod's default port once its KuryrPort records one: (port id, its deployment).
async fn port_of(kube: &Client, ns: &str, name: &str) -> Result<(String, String)> {
    let api = Api::<KuryrPort>::namespaced(kube.clone(), ns);
    eventually(&format!("{ns}/{name}'s port"), WAIT, || async {
        Ok(api.get_opt(name).await?.and_then(|k| k.status).and_then(|s| {
            s.vifs.values().find(|v| v.default).map(|v| {
                let deployment = v
                    .extra
                    .get("kuryrRsOrigin")
                    .and_then(|o| o.get("deployment"))
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_string();
                (v.vif.id().to_string(), deployment)
            })
        }))
    })
    .await
}

/// Sets maintenance on `deployment` and waits until the controller follows the edit.
async fn set_maintenance(kube: &Client, deployment: &str, on: bool, move_existing: bool) -> Result<()> {
    let patch =
        json!({"spec": {"maintenance": {"enabled": on, "reason": "upgrade"}, "moveExisting": move_existing}});
    let api = Api::<KuryrOpenStackDeployment>::all(kube.clone());
    // The controller creates the object at start.
    let generation = eventually(&format!("{deployment} patched"), WAIT, || async {
        Ok(api
            .patch(deployment, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .ok()
            .and_then(|o| o.metadata.generation))
    })
    .await
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

async fn bound(kube: &Client, project: &str) -> Result<Option<String>> {
    Ok(Api::<KuryrProjectBinding>::all(kube.clone())
        .get_opt(&kuryr_crds::binding_name(project, ""))
        .await?
        .and_then(|b| b.status)
        .and_then(|s| s.deployment))
}

async fn delete_policy(kube: &Client, ns: &str, name: &str) -> Result<()> {
    Api::<NetworkPolicy>::namespaced(kube.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// A policy of a namespace bound to `west` has its groups in west (none in `default`), recorded on
/// its KuryrNetworkPolicy, and the selected pod's port in west carries them. The project is moved
/// to `default` (maintenance with moveExisting on west): the old policy stays in west (an update is
/// applied there, its pod keeps the group), a new namespace's policy goes to `default`, a new pod of
/// the old namespace (now wired in `default`) is refused with a Warning Event naming the policy
/// rather than wired without it, and deleting each policy deletes its groups where it records them:
/// no policy group or address group is left in either deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_lives_where_its_namespace_pods_are_and_stays_there_after_a_rebind() -> Result<()> {
    init_logs();
    let (a, b) = (
        Cloud::start("10.1.0.0/24").await?,
        Cloud::start("10.2.0.0/24").await?,
    );
    let kube = start_kube().await?;
    let client = &kube.client;
    let cluster = unique("npplace");
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport,policy,kuryrnetworkpolicy,pod_label\n\
         pod_vif_driver = neutron-vif\nvif_pool_driver = noop\npod_security_groups_driver = policy\n\
         pod_project_driver = annotation\nnetwork_policy_project_driver = annotation\n\
         controller_namespace = default\ncluster_id = {cluster}\n\
         [neutron]\n{}[deployment:west]\n{}\
         [pod_binding]\nenabled = True\nfilters = all\nweighers = creation_order\n",
        a.section(),
        b.section(),
    );
    let ctl = start(client, &ini, "placement-policies-1");
    let project = uuid::Uuid::new_v4().simple().to_string();
    let annotations = json!({"openstack.org/kuryr-project": project});

    // default in maintenance: the project binds to west.
    set_maintenance(client, "default", true, false).await?;
    let old = unique("old");
    create_namespace(client, &old, annotations.clone()).await?;
    apply_policy(client, &old, "db-in", 5432).await?;
    let (where_, old_sg) = placed_policy(client, &old, "db-in").await?;
    assert_eq!(where_, "west", "placed where the namespace's binding is");
    assert_eq!(bound(client, &project).await?.as_deref(), Some("west"));
    assert!(b.has_group(&old_sg).await?, "the group is in west");
    assert!(!a.has_group(&old_sg).await?);
    // One security group and its address groups (the peer's, the namespace's Service VIPs).
    let one = b.policy_groups(&cluster).await?;
    assert!(
        one.0 == 1 && one.1 >= 1,
        "west holds the policy's groups: {one:?}"
    );
    assert_eq!(a.policy_groups(&cluster).await?, (0, 0), "nothing in default");

    pod(client, &old, "db", json!({"app": "db"})).await?;
    let (db_port, db_dep) = port_of(client, &old, "db").await?;
    assert_eq!(db_dep, "west");
    let groups = b.neutron.get_port(&db_port).await?.security_groups;
    assert!(
        groups.contains(&old_sg),
        "the port in west carries west's group: {groups:?}"
    );
    assert!(!groups.contains(&a.fx.sg), "no group id of default: {groups:?}");

    // The project moves to default.
    set_maintenance(client, "default", false, false).await?;
    set_maintenance(client, "west", true, true).await?;
    let new = unique("new");
    create_namespace(client, &new, annotations.clone()).await?;
    apply_policy(client, &new, "db-in", 5432).await?;
    let (where_, new_sg) = placed_policy(client, &new, "db-in").await?;
    assert_eq!(
        where_, "default",
        "a new namespace's policy goes where the project is bound now"
    );
    assert_eq!(bound(client, &project).await?.as_deref(), Some("default"));
    assert!(a.has_group(&new_sg).await?);
    assert_eq!(
        a.policy_groups(&cluster).await?,
        one,
        "the same groups in default"
    );

    // The old policy is updated: applied in west, where it stays; its pod keeps the group.
    let patch = json!({"spec": policy_spec(6432)});
    Api::<NetworkPolicy>::namespaced(client.clone(), &old)
        .patch("db-in", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    eventually("the old policy's rule moved to 6432 in west", WAIT, || async {
        let rules = b
            .neutron
            .list_security_group_rules(&ListFilter::new().security_group_id(&old_sg))
            .await?;
        Ok(rules
            .iter()
            .any(|r| r.port_range_min == Some(6432) && r.remote_address_group_id.is_some())
            .then_some(()))
    })
    .await?;
    assert_eq!(
        placed_policy(client, &old, "db-in").await?,
        ("west".into(), old_sg.clone())
    );
    assert_eq!(
        b.policy_groups(&cluster).await?,
        one,
        "still the same groups in west"
    );
    assert_eq!(
        a.policy_groups(&cluster).await?,
        one,
        "only the new policy's in default"
    );
    assert!(
        b.neutron
            .get_port(&db_port)
            .await?
            .security_groups
            .contains(&old_sg)
    );

    // A new pod of the old namespace is wired where the binding is now (default): the old policy
    // selects it and has no group there, so it is refused, naming the policy.
    pod(client, &old, "db2", json!({"app": "db"})).await?;
    eventually("a Warning Event on old/db2 naming the policy", WAIT, || async {
        let events = Api::<Event>::namespaced(client.clone(), &old)
            .list(&ListParams::default())
            .await?;
        Ok(events
            .items
            .into_iter()
            .find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("db2")
                    && e.note.as_deref().unwrap_or("").contains(&format!("{old}/db-in"))
            })
            .map(|_| ()))
    })
    .await?;
    assert!(
        a.neutron
            .list_ports(&ListFilter::new().eq("security_groups", old_sg.clone()))
            .await?
            .is_empty(),
        "no port of default names west's group"
    );

    // A group of the old policy's in default (made by a controller that placed it wrongly) is an
    // orphan there: the sweep at the next start deletes it, and west's stays.
    let old_uid = Api::<NetworkPolicy>::namespaced(client.clone(), &old)
        .get("db-in")
        .await?
        .uid()
        .context("uid")?;
    let stray = a
        .neutron
        .create_security_group(&kuryr_neutron::SecurityGroupCreate {
            name: format!("sg-{old}-db-in"),
            project_id: Some(project.clone()),
            description: Some(format!("kuryr-rs:{cluster}:{old_uid}")),
            ..Default::default()
        })
        .await?;
    a.neutron
        .replace_tags(
            kuryr_neutron::Taggable::SecurityGroup,
            &stray.id,
            &[
                kuryr_crds::names::neutron::cluster_tag(&cluster),
                format!("kuryr-rs.knp={old_uid}"),
                "kuryr-rs.variant=base".to_string(),
            ],
        )
        .await?;
    ctl.shutdown().await?;
    let ctl = start(client, &ini, "placement-policies-2");
    eventually("the stray group swept from default", WAIT, || async {
        Ok((!a.has_group(&stray.id).await?).then_some(()))
    })
    .await?;
    assert!(
        b.has_group(&old_sg).await?,
        "west's group of the same policy stays"
    );
    assert_eq!(a.policy_groups(&cluster).await?, one, "the new policy's stay");

    // Deleting each policy deletes its groups where it records them.
    delete_policy(client, &old, "db-in").await?;
    eventually("the old policy's groups gone from west", WAIT, || async {
        Ok((b.policy_groups(&cluster).await? == (0, 0)).then_some(()))
    })
    .await?;
    assert!(
        !b.neutron
            .get_port(&db_port)
            .await?
            .security_groups
            .contains(&old_sg),
        "taken off its port first"
    );
    assert_eq!(a.policy_groups(&cluster).await?, one, "the new one untouched");
    delete_policy(client, &new, "db-in").await?;
    eventually("the new policy's groups gone from default", WAIT, || async {
        Ok((a.policy_groups(&cluster).await? == (0, 0)).then_some(()))
    })
    .await?;
    assert_eq!(b.policy_groups(&cluster).await?, (0, 0));
    for ns in [&old, &new] {
        eventually(&format!("the KuryrNetworkPolicy of {ns} gone"), WAIT, || async {
            Ok(Api::<KuryrNetworkPolicy>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        })
        .await?;
    }
    ctl.shutdown().await?;
    Ok(())
}

/// The node subnets policies admit ingress from are looked up in every deployment: one that cannot
/// answer (here `aaa`, listed before `default`, out from the start) is not where the subnet is, and
/// must not keep every policy of every deployment from being applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deployment_that_is_out_keeps_no_policy_elsewhere_from_being_applied() -> Result<()> {
    use neutron_emulator::{FaultConfig, Outage};
    init_logs();
    let (a, out) = (
        Cloud::start("10.4.0.0/24").await?,
        Cloud::start("10.5.0.0/24").await?,
    );
    out._emulator.set_faults(FaultConfig {
        outage: Some(Outage::default()),
        ..FaultConfig::default()
    });
    let kube = start_kube().await?;
    let client = &kube.client;
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport,policy,kuryrnetworkpolicy,pod_label\n\
         pod_vif_driver = neutron-vif\nvif_pool_driver = noop\npod_security_groups_driver = policy\n\
         controller_namespace = default\ncluster_id = {}\n\
         [neutron_defaults]\nproject = {}\n\
         [pod_vif_nested]\nworker_nodes_subnets = {}\n\
         [neutron]\n{}[deployment:aaa]\n{}",
        unique("npout"),
        a.fx.project,
        a.fx.subnet,
        a.section(),
        out.section(),
    );
    let ctl = start(client, &ini, "placement-policies-out");
    assert!(
        applied_admits_ingress_from(client, &a.neutron, "10.4.0.0/24").await?,
        "ingress from the node subnet admitted"
    );
    ctl.shutdown().await?;
    Ok(())
}

/// The service subnet isolated pods admit ingress from (`enforce_sg_rules`, the load balancers'
/// health checks) is read on first use: a Neutron that cannot answer then is asked again at the
/// next use, never taken for a deployment without one for the controller's lifetime.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_subnet_unread_at_first_is_read_again() -> Result<()> {
    use neutron_emulator::{FaultConfig, FaultRule};
    init_logs();
    let a = Cloud::start("10.6.0.0/24").await?;
    let svc = a
        .neutron
        .create_network(&kuryr_neutron::NetworkCreate {
            name: Some("services".into()),
            project_id: Some(a.fx.project.clone()),
            ..Default::default()
        })
        .await?;
    let svc_subnet = a
        .neutron
        .create_subnet(&kuryr_neutron::SubnetCreate {
            network_id: svc.id,
            ip_version: 4,
            cidr: Some("10.7.0.0/24".into()),
            project_id: Some(a.fx.project.clone()),
            ..Default::default()
        })
        .await?;
    a._emulator.set_faults(FaultConfig {
        rules: vec![FaultRule::always("subnet.get", 503)],
        ..FaultConfig::default()
    });
    let kube = start_kube().await?;
    let client = &kube.client;
    let ini = format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport,policy,kuryrnetworkpolicy,pod_label\n\
         pod_vif_driver = neutron-vif\nvif_pool_driver = noop\npod_security_groups_driver = policy\n\
         controller_namespace = default\ncluster_id = {}\n\
         [neutron_defaults]\nproject = {}\nservice_subnet = {}\n\
         [neutron]\n{}",
        unique("npsvc"),
        a.fx.project,
        svc_subnet.id,
        a.section(),
    );
    let ctl = start(client, &ini, "placement-policies-svc");
    let ns = unique("db");
    create_namespace(client, &ns, json!({})).await?;
    apply_policy(client, &ns, "db-in", 5432).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    a._emulator.set_faults(FaultConfig::default());
    assert!(
        policy_admits_ingress_from(client, &a.neutron, &ns, "10.7.0.0/24").await?,
        "ingress from the service subnet admitted"
    );
    ctl.shutdown().await?;
    Ok(())
}

/// Applies `db-in` in a new namespace and tells, once it is applied, whether its group admits
/// ingress from `prefix`.
async fn applied_admits_ingress_from(kube: &Client, neutron: &NeutronClient, prefix: &str) -> Result<bool> {
    let ns = unique("db");
    create_namespace(kube, &ns, json!({})).await?;
    apply_policy(kube, &ns, "db-in", 5432).await?;
    policy_admits_ingress_from(kube, neutron, &ns, prefix).await
}

/// Once `ns/db-in` is applied, whether its group admits ingress from `prefix`.
async fn policy_admits_ingress_from(
    kube: &Client,
    neutron: &NeutronClient,
    ns: &str,
    prefix: &str,
) -> Result<bool> {
    let knps = Api::<KuryrNetworkPolicy>::namespaced(kube.clone(), ns);
    let sg = eventually("the policy applied", WAIT, || async {
        Ok(knps
            .get_opt("db-in")
            .await?
            .and_then(|k| k.status?.security_group_id))
    })
    .await?;
    Ok(neutron
        .list_security_group_rules(&ListFilter::new().security_group_id(&sg))
        .await?
        .into_iter()
        .any(|r| r.direction == "ingress" && r.remote_ip_prefix.as_deref() == Some(prefix)))
}
