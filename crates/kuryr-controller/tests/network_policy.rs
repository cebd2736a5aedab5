//! NetworkPolicy through the real start-up path (`policy`, `kuryrnetworkpolicy`, `pod_label`
//! handlers, `pod_security_groups_driver = policy`) against the Neutron emulator and, with
//! KURYR_TEST_NEUTRON_URL set, a real neutron-server: what Neutron holds, not traffic (that is
//! crates/kuryr-e2e).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kuryr_crds::{KuryrNetworkPolicy, KuryrPort};
use kuryr_neutron::{ListFilter, NeutronClient};
use serde_json::{Value, json};
use support::*;

const WAIT: Duration = Duration::from_secs(60);

fn ini(fx: &NeutronFixture, cluster: &str, handlers: &str) -> String {
    format!(
        "[kubernetes]\nenabled_handlers = {handlers}\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
         pod_security_groups_driver = policy\ncluster_id = {cluster}\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nresource_tags = k8s,test\n",
        fx.project, fx.subnet, fx.sg
    )
}

async fn labelled_namespace(kube: &kube::Client, name: &str) -> Result<()> {
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"ns": name}}
    }))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

/// A pod with `labels` and, when given, `ip` as its address (no port: only membership is tested).
async fn pod(kube: &kube::Client, ns: &str, name: &str, labels: Value, ip: Option<&str>) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(kube.clone(), ns);
    let p: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": NODES[0], "containers": [{"name": "c", "image": "busybox",
                 "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))?;
    api.create(&PostParams::default(), &p).await?;
    if let Some(ip) = ip {
        let status = json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
    }
    Ok(())
}

async fn apply_policy(kube: &kube::Client, ns: &str, name: &str, spec: Value) -> Result<()> {
    let np: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns}, "spec": spec,
    }))?;
    Api::<NetworkPolicy>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &np)
        .await?;
    Ok(())
}

/// The security group a policy's KuryrNetworkPolicy records, once it does.
async fn policy_group(kube: &kube::Client, ns: &str, name: &str) -> Result<String> {
    let knps: Api<KuryrNetworkPolicy> = Api::namespaced(kube.clone(), ns);
    eventually(&format!("{ns}/{name}'s group"), WAIT, || async {
        Ok(knps
            .get_opt(name)
            .await?
            .and_then(|k| k.status)
            .and_then(|s| s.security_group_id))
    })
    .await
}

/// Applies `ns/deny` (ingress denied to the `app=db` pods) and returns its security group.
async fn deny_db(kube: &kube::Client, ns: &str) -> Result<String> {
    apply_policy(
        kube,
        ns,
        "deny",
        json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"]}),
    )
    .await?;
    policy_group(kube, ns, "deny").await
}

/// The addresses of the address group the ingress TCP `port` rule of `sg` names.
async fn peer_addresses(
    client: &NeutronClient,
    sg: &str,
    port: u32,
) -> Result<Option<(String, BTreeSet<String>)>> {
    let rules = client
        .list_security_group_rules(&ListFilter::new().security_group_id(sg))
        .await?;
    let Some(ag) = rules
        .iter()
        .find(|r| r.direction == "ingress" && r.port_range_min == Some(port) && r.ethertype == "IPv4")
        .and_then(|r| r.remote_address_group_id.clone())
    else {
        return Ok(None);
    };
    let addrs = client
        .get_address_group(&ag)
        .await?
        .addresses
        .into_iter()
        .collect();
    Ok(Some((ag, addrs)))
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// One test's world against one Neutron target: a Kubernetes emulator, the Neutron fixture
/// (its own project, network, subnet and default group) and a cluster id of its own.
struct PolicyBed {
    kube: Kube,
    fx: NeutronFixture,
    cluster: String,
}

impl PolicyBed {
    async fn new(target: &NeutronTarget, cidr: &str) -> Result<Self> {
        Ok(Self {
            kube: start_kube().await?,
            fx: neutron_fixture(&target.client, cidr).await?,
            cluster: format!("np-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        })
    }

    /// A controller running `handlers` with the policy drivers, as `identity`.
    fn start(&self, target: &NeutronTarget, handlers: &str, identity: &str) -> Controller {
        start_controller(
            &self.kube.client,
            target,
            config(&ini(&self.fx, &self.cluster, handlers)),
            identity,
        )
    }
}

/// The message of the first Warning Event in `ns` naming Neutron's OverQuota, once there is one.
async fn over_quota_warning(kube: &kube::Client, ns: &str) -> Result<String> {
    let events: Api<Event> = Api::namespaced(kube.clone(), ns);
    eventually("a Warning Event naming the quota", WAIT, || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .filter_map(|e| e.message)
            .find(|m| m.contains("OverQuota")))
    })
    .await
}

/// A rule Neutron refuses for the project's quota (409 OverQuota, the status of a rule that
/// exists too) fails the policy with a Warning Event naming the quota: the policy is not taken
/// for applied with rules missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rule_over_the_quota_fails_the_policy_with_an_event() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.70.0.0/24").await?;
        let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
        let ctl = bed.start(&target, "policy,kuryrnetworkpolicy,pod_label", "np-quota");
        labelled_namespace(&kube.client, "q").await?;
        pod(&kube.client, "q", "db", json!({"app": "db"}), Some("10.70.0.10")).await?;
        pod(
            &kube.client,
            "q",
            "web",
            json!({"app": "web"}),
            Some("10.70.0.11"),
        )
        .await?;
        let from_web = |ports: &[u16]| {
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                "ports": ports.iter().map(|p| json!({"port": p})).collect::<Vec<_>>()}]})
        };
        apply_policy(&kube.client, "q", "db", from_web(&[5432])).await?;
        let sg = policy_group(&kube.client, "q", "db").await?;
        eventually("the 5432 rule", WAIT, || async {
            Ok(peer_addresses(client, &sg, 5432).await?.map(drop))
        })
        .await?;
        // No rule more fits in the project.
        let used = client
            .list_security_group_rules(&ListFilter::new().project_id(&fx.project))
            .await?
            .len();
        client
            .update_quota(
                &fx.project,
                &kuryr_neutron::QuotaUpdate {
                    security_group_rule: Some(i64::try_from(used)?),
                    ..Default::default()
                },
            )
            .await?;
        let policies: Api<NetworkPolicy> = Api::namespaced(kube.client.clone(), "q");
        policies
            .patch(
                "db",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": from_web(&[5432, 5433])})),
            )
            .await?;
        let note = over_quota_warning(&kube.client, "q").await?;
        assert!(note.contains("security_group_rule"), "{}: {note}", target.name);
        assert!(
            peer_addresses(client, &sg, 5433).await?.is_none(),
            "{}: no rule over the quota",
            target.name
        );
        // The policy that cannot be applied does not fail (and so retry) other pods' events.
        pod(
            &kube.client,
            "q",
            "other",
            json!({"app": "other"}),
            Some("10.70.0.12"),
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let retries: Vec<String> = ctl
            .metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("kuryr_handler_retries_total{handler=\"pod_label\"}"))
            .map(str::to_string)
            .collect();
        assert!(
            retries.iter().all(|l| l.ends_with(" 0")),
            "{}: {retries:?}",
            target.name
        );
        ctl.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn policy_membership_relabel_invalid_content_and_deletion() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.71.0.0/24").await?;
        let (kube, client, fx, cluster) = (&bed.kube, &target.client, &bed.fx, &bed.cluster);
        let ctl = bed.start(&target, "policy,kuryrnetworkpolicy,pod_label", "np-test");
        labelled_namespace(&kube.client, "x").await?;
        pod(&kube.client, "x", "a", json!({"app": "web"}), Some("10.71.0.11")).await?;
        pod(
            &kube.client,
            "x",
            "b",
            json!({"app": "client"}),
            Some("10.71.0.12"),
        )
        .await?;
        pod(
            &kube.client,
            "x",
            "c",
            json!({"app": "other"}),
            Some("10.71.0.13"),
        )
        .await?;
        apply_policy(
            &kube.client,
            "x",
            "web",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": 80}]}]}),
        )
        .await?;

        let knps: Api<KuryrNetworkPolicy> = Api::namespaced(kube.client.clone(), "x");
        let sg = eventually("KuryrNetworkPolicy status with a group", WAIT, || async {
            Ok(knps
                .get_opt("web")
                .await?
                .and_then(|k| k.status)
                .and_then(|s| s.security_group_id))
        })
        .await?;
        let sgs = client.list_security_groups(&ListFilter::new().id(&sg)).await?;
        assert!(
            sgs[0].tags.contains(&format!("kuryr-rs.cluster={cluster}")),
            "{}: ownership tags {:?}",
            target.name,
            sgs[0].tags
        );
        // The rule may exist before its address group is filled: wait for the group's content.
        let clients = set(&["10.71.0.12/32"]);
        let (ag, addrs) = eventually("the client peer group holding x/b", WAIT, || async {
            Ok(peer_addresses(client, &sg, 80)
                .await?
                .filter(|(_, addrs)| !addrs.is_empty()))
        })
        .await?;
        assert_eq!(addrs, clients, "{}: only x/b is a client", target.name);
        let rules_before: BTreeSet<String> = client
            .list_security_group_rules(&ListFilter::new().security_group_id(&sg))
            .await?
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert!(
            rules_before.len() >= 2,
            "{}: tcp/80 for IPv4 and IPv6 at least",
            target.name
        );

        // x/c becomes a client: it joins the group, the rules stay as they are.
        let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "x");
        pods.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "client"}}})),
        )
        .await?;
        eventually("x/c in the client group", WAIT, || async {
            let a = client.get_address_group(&ag).await?.addresses;
            Ok((a == ["10.71.0.12/32", "10.71.0.13/32"]).then_some(()))
        })
        .await?;
        let rules_after: BTreeSet<String> = client
            .list_security_group_rules(&ListFilter::new().security_group_id(&sg))
            .await?
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(
            rules_before, rules_after,
            "{}: no rule rewritten on relabel",
            target.name
        );

        // Content the translation refuses: a Warning Event naming the field; `web` unaffected.
        apply_policy(
            &kube.client,
            "x",
            "bad",
            json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]}),
        )
        .await?;
        let events: Api<Event> = Api::namespaced(kube.client.clone(), "x");
        let note = eventually("a Warning Event on x/bad", WAIT, || async {
            Ok(events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|e| {
                    e.involved_object.name.as_deref() == Some("bad") && e.type_.as_deref() == Some("Warning")
                })
                .and_then(|e| e.message))
        })
        .await?;
        assert!(
            note.contains("spec.ingress[0].from[0].ipBlock"),
            "{}: {note}",
            target.name
        );
        assert!(
            knps.get_opt("bad").await?.is_none(),
            "an invalid policy enforces nothing"
        );

        // Deleting the policy deletes its groups and lets the objects go.
        Api::<NetworkPolicy>::namespaced(kube.client.clone(), "x")
            .delete("web", &DeleteParams::default())
            .await?;
        eventually("groups of x/web deleted", WAIT, || async {
            let sg_gone = client
                .list_security_groups(&ListFilter::new().id(&sg))
                .await?
                .is_empty();
            let ag_gone = client
                .get_address_group(&ag)
                .await
                .is_err_and(|e| e.is_not_found());
            let knp_gone = knps.get_opt("web").await?.is_none();
            Ok((sg_gone && ag_gone && knp_gone).then_some(()))
        })
        .await?;
        ctl.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_pod_gets_its_policy_group_before_its_port_is_active() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.72.0.0/24").await?;
        let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
        let ctl = bed.start(
            &target,
            "vif,kuryrport,policy,kuryrnetworkpolicy,pod_label",
            "np-test-ports",
        );
        labelled_namespace(&kube.client, "y").await?;
        let sg = deny_db(&kube.client, "y").await?;
        pod(&kube.client, "y", "db", json!({"app": "db"}), None).await?;
        pod(&kube.client, "y", "web", json!({"app": "web"}), None).await?;
        let kps: Api<KuryrPort> = Api::namespaced(kube.client.clone(), "y");
        let port_of = |name: &'static str| {
            let kps = kps.clone();
            async move {
                Ok(kps.get_opt(name).await?.and_then(|k| k.status).and_then(|s| {
                    s.vifs
                        .values()
                        .find(|v| v.default)
                        .map(|v| v.vif.id().to_string())
                }))
            }
        };
        let db_port = eventually("y/db's port", WAIT, || port_of("db")).await?;
        let web_port = eventually("y/web's port", WAIT, || port_of("web")).await?;
        let db = client.get_port(&db_port).await?;
        assert!(
            db.security_groups.contains(&sg),
            "{}: {:?}",
            target.name,
            db.security_groups
        );
        assert!(
            !db.security_groups.contains(&fx.sg),
            "{}: a selected pod does not keep the default group",
            target.name
        );
        assert_eq!(
            client.get_port(&web_port).await?.security_groups,
            vec![fx.sg.clone()],
            "{}: an unselected pod keeps the defaults",
            target.name
        );
        Api::<Pod>::namespaced(kube.client.clone(), "y")
            .delete("db", &DeleteParams::default())
            .await?;
        Api::<Pod>::namespaced(kube.client.clone(), "y")
            .delete("web", &DeleteParams::default())
            .await?;
        Api::<NetworkPolicy>::namespaced(kube.client.clone(), "y")
            .delete("deny", &DeleteParams::default())
            .await?;
        eventually("the deny group deleted", WAIT, || async {
            Ok(client
                .list_security_groups(&ListFilter::new().id(&sg))
                .await?
                .is_empty()
                .then_some(()))
        })
        .await?;
        ctl.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// Drops `name`'s finalizers and deletes it: what `kubectl delete` plus a hand-edited finalizer
/// list does while no controller runs.
async fn force_delete<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn groups_of_a_policy_deleted_while_the_controller_was_down_are_swept() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.73.0.0/24").await?;
        let (kube, client, fx, cluster) = (&bed.kube, &target.client, &bed.fx, &bed.cluster);
        let cfg = ini(fx, cluster, "policy,kuryrnetworkpolicy,pod_label");
        let first = start_controller(&kube.client, &target, config(&cfg), "np-sweep-1");
        labelled_namespace(&kube.client, "z").await?;
        pod(&kube.client, "z", "a", json!({"app": "a"}), Some("10.73.0.5")).await?;
        apply_policy(
            &kube.client,
            "z",
            "gone",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}]}]}),
        )
        .await?;
        let knps: Api<KuryrNetworkPolicy> = Api::namespaced(kube.client.clone(), "z");
        let sg = eventually("the group of z/gone", WAIT, || async {
            Ok(knps
                .get_opt("gone")
                .await?
                .and_then(|k| k.status)
                .and_then(|s| s.security_group_id))
        })
        .await?;
        let (ag, _) = eventually("its peer group", WAIT, || async {
            let rules = client
                .list_security_group_rules(&ListFilter::new().security_group_id(&sg))
                .await?;
            Ok(rules
                .iter()
                .find_map(|r| r.remote_address_group_id.clone())
                .map(|a| (a, ())))
        })
        .await?;
        first.kill().await;
        force_delete(
            &Api::<NetworkPolicy>::namespaced(kube.client.clone(), "z"),
            "gone",
        )
        .await?;
        force_delete(&knps, "gone").await?;

        let second = start_controller(&kube.client, &target, config(&cfg), "np-sweep-2");
        // The sweep runs when the new controller starts leading.
        apply_policy(&kube.client, "z", "other", json!({"podSelector": {}})).await?;
        eventually("the orphaned groups deleted", WAIT, || async {
            let sg_gone = client
                .list_security_groups(&ListFilter::new().id(&sg))
                .await?
                .is_empty();
            let ag_gone = client
                .get_address_group(&ag)
                .await
                .is_err_and(|e| e.is_not_found());
            Ok((sg_gone && ag_gone).then_some(()))
        })
        .await?;
        Api::<NetworkPolicy>::namespaced(kube.client.clone(), "z")
            .delete("other", &DeleteParams::default())
            .await?;
        eventually("z/other released", WAIT, || async {
            Ok(knps.get_opt("other").await?.is_none().then_some(()))
        })
        .await?;
        second.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// The IPv4 ingress rules of the policy's groups with their peers' addresses: (protocol, port
/// range, addresses); the number of security groups this cluster holds for the policy; and the
/// number of its address groups that no rule names (leaks).
#[allow(clippy::type_complexity)]
async fn policy_state(
    client: &NeutronClient,
    cluster: &str,
    uid: &str,
) -> Result<(BTreeSet<(String, u32, u32, BTreeSet<String>)>, usize, usize)> {
    let sgs = client
        .list_security_groups(&ListFilter::new().tags([format!("kuryr-rs.knp={uid}")]))
        .await?;
    let by_description = client
        .list_security_groups(&ListFilter::new().eq("description", format!("kuryr-rs:{cluster}:{uid}")))
        .await?;
    let ags = client
        .list_address_groups(&ListFilter::new().eq("description", format!("kuryr-rs:{cluster}:{uid}")))
        .await?;
    let mut rules = BTreeSet::new();
    for sg in &sgs {
        for r in &sg.security_group_rules {
            if r.direction != "ingress" || r.ethertype != "IPv4" || r.protocol.is_none() {
                continue;
            }
            let addrs: BTreeSet<String> = match &r.remote_address_group_id {
                Some(id) => ags
                    .iter()
                    .find(|a| &a.id == id)
                    .map(|a| a.addresses.iter().cloned().collect())
                    .unwrap_or_else(|| [format!("foreign group {id}")].into()),
                None => r.remote_ip_prefix.iter().cloned().collect(),
            };
            // The namespace's Service VIPs group is empty here (no Services).
            if addrs.is_empty() {
                continue;
            }
            rules.insert((
                r.protocol.clone().unwrap_or_default(),
                r.port_range_min.unwrap_or(0),
                r.port_range_max.unwrap_or(0),
                addrs,
            ));
        }
    }
    let groups = sgs.len().max(by_description.len());
    let named: BTreeSet<&String> = sgs
        .iter()
        .chain(&by_description)
        .flat_map(|sg| &sg.security_group_rules)
        .filter_map(|r| r.remote_address_group_id.as_ref())
        .collect();
    let unnamed = ags.iter().filter(|a| !named.contains(&a.id)).count();
    Ok((rules, groups, unnamed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controller_killed_in_the_middle_of_policy_updates_converges_without_leaks_after_restart()
-> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.74.0.0/24").await?;
        let (kube, client, fx, cluster) = (&bed.kube, &target.client, &bed.fx, &bed.cluster);
        let cfg = ini(fx, cluster, "policy,kuryrnetworkpolicy,pod_label");
        labelled_namespace(&kube.client, "k").await?;
        pod(&kube.client, "k", "a", json!({"app": "a"}), Some("10.74.0.11")).await?;
        pod(&kube.client, "k", "b", json!({"app": "b"}), Some("10.74.0.12")).await?;
        pod(&kube.client, "k", "c", json!({"app": "b"}), Some("10.74.0.13")).await?;
        // Each spec differs from the one before in peers and ports, so an update creates and
        // deletes rules and address groups.
        let specs = [
            (
                json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}],
                       "ports": [{"port": 80}, {"port": 81}]}]}),
                vec![
                    ("tcp", 80, 80, vec!["10.74.0.11/32"]),
                    ("tcp", 81, 81, vec!["10.74.0.11/32"]),
                ],
            ),
            (
                json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}}],
                       "ports": [{"protocol": "UDP", "port": 53}]},
                      {"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"port": 443}]}]}),
                vec![
                    ("udp", 53, 53, vec!["10.74.0.12/32", "10.74.0.13/32"]),
                    ("tcp", 443, 443, vec!["192.0.2.0/24"]),
                ],
            ),
            (
                json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchExpressions":
                       [{"key": "app", "operator": "In", "values": ["a", "b"]}]}}],
                       "ports": [{"port": 8000, "endPort": 8080}]}]}),
                vec![(
                    "tcp",
                    8000,
                    8080,
                    vec!["10.74.0.11/32", "10.74.0.12/32", "10.74.0.13/32"],
                )],
            ),
        ];
        let want = |i: usize| -> BTreeSet<(String, u32, u32, BTreeSet<String>)> {
            specs[i % specs.len()]
                .1
                .iter()
                .map(|(p, lo, hi, a)| (p.to_string(), *lo, *hi, a.iter().map(|s| s.to_string()).collect()))
                .collect()
        };
        let nps = Api::<NetworkPolicy>::namespaced(kube.client.clone(), "k");
        // A controller on a runtime of its own: killing it stops every task it spawned at once,
        // as SIGKILL would (aborting a task of this runtime would leave its detached tasks going).
        let kube_url = kube.handle.url();
        let start = |id: String| start_isolated_controller(kube_url, &target, config(&cfg), &id);
        let mut ctl = start("np-kill-0".into())?;
        apply_policy(&kube.client, "k", "p", specs[0].0.clone()).await?;
        let uid = nps.get("p").await?.metadata.uid.expect("uid");
        eventually("the first spec applied", WAIT, || async {
            let (rules, _, _) = policy_state(client, cluster, &uid).await?;
            Ok((rules == want(0)).then_some(()))
        })
        .await?;
        // Kill at several points of an update: before it starts, in the middle, near its end.
        for (round, delay_ms) in [0u64, 15, 40, 80, 150, 300].into_iter().enumerate() {
            let next = round + 1;
            let mut np = nps.get("p").await?;
            np.spec = serde_json::from_value(specs[next % specs.len()].0.clone())?;
            nps.replace("p", &PostParams::default(), &np).await?;
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            ctl.kill();
            ctl = start(format!("np-kill-{next}"))?;
            eventually(
                &format!(
                    "{}: spec {next} applied after a kill {delay_ms} ms into the update",
                    target.name
                ),
                WAIT,
                || async {
                    let (rules, groups, unnamed) = policy_state(client, cluster, &uid).await?;
                    // One security group, the new rules, and no address group left unused.
                    Ok((rules == want(next) && groups == 1 && unnamed == 0).then_some(()))
                },
            )
            .await?;
        }
        // Deleting the policy leaves nothing of it.
        nps.delete("p", &DeleteParams::default()).await?;
        eventually("every group of k/p deleted", WAIT, || async {
            let (rules, groups, _) = policy_state(client, cluster, &uid).await?;
            let ags = client
                .list_address_groups(
                    &ListFilter::new().eq("description", format!("kuryr-rs:{cluster}:{uid}")),
                )
                .await?;
            Ok((rules.is_empty() && groups == 0 && ags.is_empty()).then_some(()))
        })
        .await?;
        ctl.shutdown().await;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// A KuryrNetworkPolicy written by upstream kuryr-kubernetes 10.0.0 (its spec of per-IP rules, its
/// security group in the status, its finalizer) is adopted: the same security group carries the
/// policy from then on, with kuryr-rs' rules in place of upstream's per-IP ones, and no second
/// group is made; deleting the policy then releases that group like one of kuryr-rs' own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upstream_written_kuryrnetworkpolicy_and_its_group_are_adopted_not_duplicated() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.75.0.0/24").await?;
        let (kube, client, fx, cluster) = (&bed.kube, &target.client, &bed.fx, &bed.cluster);
        let cfg = ini(fx, cluster, "policy,kuryrnetworkpolicy,pod_label");
        labelled_namespace(&kube.client, "u").await?;
        pod(&kube.client, "u", "a", json!({"app": "a"}), Some("10.75.0.11")).await?;
        pod(&kube.client, "u", "b", json!({"app": "b"}), Some("10.75.0.12")).await?;
        // Upstream's group for u/p, named and tagged its way, with one rule per peer pod IP.
        let sg = client
            .create_security_group(&kuryr_neutron::SecurityGroupCreate {
                name: "sg-u-p".into(),
                project_id: Some(fx.project.clone()),
                description: Some("Kuryr-Kubernetes Network Policy u/p SG".into()),
                ..Default::default()
            })
            .await?;
        client
            .replace_tags(kuryr_neutron::Taggable::SecurityGroup, &sg.id, &["k8s", "test"])
            .await?;
        let upstream_rule = client
            .create_security_group_rule(&kuryr_neutron::SecurityGroupRuleCreate {
                security_group_id: sg.id.clone(),
                direction: "ingress".into(),
                ethertype: Some("IPv4".into()),
                protocol: Some("tcp".into()),
                port_range_min: Some(80),
                port_range_max: Some(80),
                remote_ip_prefix: Some("10.75.0.11/32".into()),
                description: Some("Kuryr-Kubernetes NetPolicy SG rule".into()),
                ..Default::default()
            })
            .await?;
        apply_policy(
            &kube.client,
            "u",
            "p",
            json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": 80}]}]}),
        )
        .await?;
        let uid = Api::<NetworkPolicy>::namespaced(kube.client.clone(), "u")
            .get("p")
            .await?
            .metadata
            .uid
            .expect("uid");
        // The KuryrNetworkPolicy exactly as upstream 10.0.0 leaves it (no status subresource in
        // its CRD: the status is written with the object).
        let upstream: KuryrNetworkPolicy = serde_json::from_value(json!({
            "apiVersion": "openstack.org/v1", "kind": "KuryrNetworkPolicy",
            "metadata": {"name": "p", "namespace": "u",
                         "finalizers": [kuryr_crds::names::finalizers::NETWORKPOLICY],
                         "annotations": {"networkPolicyLink": "/apis/networking.k8s.io/v1/namespaces/u/networkpolicies/p"}},
            "spec": {
                "egressSgRules": [],
                "ingressSgRules": [{
                    "affectedPods": [{"podIP": "10.75.0.11", "podNamespace": "u"}],
                    "namespace": "u",
                    "sgRule": {"description": "Kuryr-Kubernetes NetPolicy SG rule", "direction": "ingress",
                               "ethertype": "IPv4", "port_range_max": 80, "port_range_min": 80,
                               "protocol": "tcp", "remote_ip_prefix": "10.75.0.11/32"}}],
                "podSelector": {},
                "policyTypes": ["Ingress"]},
            "status": {
                "podSelector": {},
                "securityGroupId": sg.id,
                "securityGroupRules": [{"id": upstream_rule.id, "direction": "ingress", "ethertype": "IPv4",
                    "port_range_max": 80, "port_range_min": 80, "protocol": "tcp",
                    "remote_ip_prefix": "10.75.0.11/32", "security_group_id": sg.id}]}
        }))?;
        let knps = Api::<KuryrNetworkPolicy>::namespaced(kube.client.clone(), "u");
        knps.create(&PostParams::default(), &upstream).await?;

        let ctl = start_controller(&kube.client, &target, config(&cfg), "np-adopt");
        let want: BTreeSet<(String, u32, u32, BTreeSet<String>)> =
            [("tcp".to_string(), 80, 80, set(&["10.75.0.11/32"]))].into();
        // Upstream's per-IP rule and the address-group rule that replaces it read the same in
        // `policy_state`, so the reconcile is only done once upstream's rule is gone too.
        eventually(
            &format!(
                "{}: upstream's group adopted and reconciled, its per-IP rule replaced by the address-group rule",
                target.name
            ),
            WAIT,
            || async {
                let (rules, groups, unnamed) = policy_state(client, cluster, &uid).await?;
                let upstream_rule_gone = client
                    .list_security_group_rules(&ListFilter::new().security_group_id(&sg.id))
                    .await?
                    .iter()
                    .all(|r| r.id != upstream_rule.id);
                Ok((rules == want && groups == 1 && unnamed == 0 && upstream_rule_gone).then_some(()))
            },
        )
        .await?;
        let tagged = client
            .list_security_groups(&ListFilter::new().tags([format!("kuryr-rs.knp={uid}")]))
            .await?;
        assert_eq!(
            tagged.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
            [sg.id.as_str()],
            "{}: the policy lives on upstream's group, not a new one",
            target.name
        );
        let rules = client
            .list_security_group_rules(&ListFilter::new().security_group_id(&sg.id))
            .await?;
        assert!(
            rules
                .iter()
                .any(|r| r.remote_address_group_id.is_some() && r.port_range_min == Some(80)),
            "{}: the port-80 rule names the policy's address group",
            target.name
        );
        // The upstream object now names its policy (what tags its groups from here on).
        let adopted = eventually("u/p owned by its NetworkPolicy", WAIT, || async {
            let knp = knps.get("p").await?;
            let owned = knp
                .metadata
                .owner_references
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|o| o.kind == "NetworkPolicy" && o.uid == uid);
            Ok(owned.then_some(knp))
        })
        .await?;
        assert_eq!(
            adopted.status.unwrap_or_default().security_group_id.as_deref(),
            Some(sg.id.as_str())
        );

        // Deleting the policy releases the adopted group like one of kuryr-rs' own.
        Api::<NetworkPolicy>::namespaced(kube.client.clone(), "u")
            .delete("p", &DeleteParams::default())
            .await?;
        eventually("u/p and its group gone", WAIT, || async {
            let gone = knps.get_opt("p").await?.is_none();
            let sg_gone = client
                .get_security_group(&sg.id)
                .await
                .err()
                .is_some_and(|e| e.is_not_found());
            Ok((gone && sg_gone).then_some(()))
        })
        .await?;
        ctl.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// A burst of relabels moving 30 pods into a policy's peer selector at once is coalesced per
/// policy: a reconcile of the policy runs under its lock with the latest state, and one whose
/// desired state the previous run already applied makes no call; so the address group ends with
/// every address after a few updates, not one per pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_relabels_is_coalesced_per_policy() -> Result<()> {
    init_logs();
    const PODS: usize = 30;
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.76.0.0/24").await?;
        let (kube, client, fx, cluster) = (&bed.kube, &target.client, &bed.fx, &bed.cluster);
        let cfg = ini(fx, cluster, "policy,kuryrnetworkpolicy,pod_label");
        labelled_namespace(&kube.client, "q").await?;
        pod(
            &kube.client,
            "q",
            "server",
            json!({"app": "server"}),
            Some("10.76.0.10"),
        )
        .await?;
        for i in 0..PODS {
            let ip = format!("10.76.0.{}", 20 + i);
            pod(
                &kube.client,
                "q",
                &format!("c{i}"),
                json!({"app": "other"}),
                Some(&ip),
            )
            .await?;
        }
        let metrics = kuryr_controller::metrics::Metrics::new();
        let deployments = kuryr_controller::openstack::Deployments::noauth(&target.url, &metrics)?;
        let ctl = start_controller_with(
            &kube.client,
            deployments,
            metrics.clone(),
            config(&cfg),
            "np-burst",
        );
        apply_policy(
            &kube.client,
            "q",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "server"}}, "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": 80}]}]}),
        )
        .await?;
        let sg = policy_group(&kube.client, "q", "p").await?;
        eventually("the peer group made, empty", WAIT, || async {
            Ok(peer_addresses(client, &sg, 80)
                .await?
                .filter(|(_, a)| a.is_empty()))
        })
        .await?;
        let updates = || {
            let calls = kuryr_controller::metrics::per_operation(&metrics.neutron_calls());
            ["add_addresses", "remove_addresses"]
                .iter()
                .map(|op| calls.get(*op).copied().unwrap_or(0))
                .sum::<u64>()
        };
        let before = updates();
        let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "q");
        let relabels = (0..PODS).map(|i| {
            let pods = pods.clone();
            async move {
                let patch = json!({"metadata": {"labels": {"app": "client"}}});
                pods.patch(&format!("c{i}"), &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            }
        });
        for r in futures::future::join_all(relabels).await {
            r?;
        }
        let want: BTreeSet<String> = (0..PODS).map(|i| format!("10.76.0.{}/32", 20 + i)).collect();
        eventually(
            &format!("{}: every relabelled pod in the peer group", target.name),
            WAIT,
            || async {
                Ok(peer_addresses(client, &sg, 80)
                    .await?
                    .filter(|(_, a)| *a == want)
                    .map(|_| ()))
            },
        )
        .await?;
        let made = updates() - before;
        eprintln!(
            "{}: {PODS} relabels in one burst -> {made} address group updates",
            target.name
        );
        assert!(
            made <= (PODS / 3) as u64,
            "{}: {made} address group updates for a burst of {PODS} relabels",
            target.name
        );
        ctl.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// The default VIF's port of `ns/name` once its KuryrPort shows it active.
async fn active_port(kube: &kube::Client, ns: &str, name: &str) -> Result<String> {
    let kps: Api<KuryrPort> = Api::namespaced(kube.clone(), ns);
    eventually(&format!("{ns}/{name} active"), WAIT, || async {
        Ok(kps.get_opt(name).await?.and_then(|k| k.status).and_then(|s| {
            s.default_vif()
                .filter(|(_, v)| v.active())
                .map(|(_, v)| v.id().to_string())
        }))
    })
    .await
}

/// A deleted policy's pods are moved to the groups they have without it before its groups go:
/// an ingress-only policy's pod never sits on the allow-all egress group alone (all ingress
/// dropped, kubelet probes too) while the group is deleted. The group's delete is slowed down
/// in the emulator so that such a state would last.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_policys_pods_are_moved_before_its_group_goes() -> Result<()> {
    use neutron_emulator::{FaultConfig, FaultRule};
    init_logs();
    for target in neutron_targets().await? {
        let Some(emulator) = target.emulator() else {
            eprintln!("{}: needs the emulator's slowed deletes", target.name);
            continue;
        };
        let bed = PolicyBed::new(&target, "10.69.0.0/24").await?;
        let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
        let ctl = bed.start(
            &target,
            "vif,kuryrport,policy,kuryrnetworkpolicy,pod_label",
            "np-delete",
        );
        labelled_namespace(&kube.client, "d").await?;
        pod(&kube.client, "d", "db", json!({"app": "db"}), None).await?;
        let port = active_port(&kube.client, "d", "db").await?;
        let sg = deny_db(&kube.client, "d").await?;
        let groups =
            || async { Ok::<_, anyhow::Error>(set_of(client.get_port(&port).await?.security_groups)) };
        let isolated = eventually("db on the policy's group", WAIT, || async {
            let g = groups().await?;
            Ok(g.contains(&sg).then_some(g))
        })
        .await?;
        assert_eq!(
            isolated.len(),
            2,
            "{}: the policy's group and allow-all egress: {isolated:?}",
            target.name
        );
        emulator.set_faults(FaultConfig {
            rules: vec![FaultRule::delay(
                "security_group.delete",
                Duration::from_millis(1500),
            )],
            ..FaultConfig::default()
        });
        Api::<NetworkPolicy>::namespaced(kube.client.clone(), "d")
            .delete("deny", &DeleteParams::default())
            .await?;
        let defaults = set_of(vec![fx.sg.clone()]);
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let g = groups().await?;
            if g == defaults {
                break;
            }
            assert_eq!(
                g, isolated,
                "{}: only the policy's groups or the defaults",
                target.name
            );
            assert!(
                std::time::Instant::now() < deadline,
                "{}: db still on {g:?}",
                target.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eventually("the policy's group deleted", WAIT, || async {
            Ok(client
                .list_security_groups(&ListFilter::new().id(&sg))
                .await?
                .is_empty()
                .then_some(()))
        })
        .await?;
        emulator.set_faults(FaultConfig::default());
        ctl.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// A policy's passes over its namespace read the namespace's ports in lists, not one GET per
/// pod at each pass (with a policy on one pod of 24, each pass read all 24 ports and their
/// KuryrPorts one by one): only the port that must change is read on its own, and written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_pass_reads_its_namespaces_ports_in_lists() -> Result<()> {
    init_logs();
    const PODS: usize = 24;
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.68.0.0/24").await?;
        let (kube, client, fx, cluster) = (&bed.kube, &target.client, &bed.fx, &bed.cluster);
        let metrics = kuryr_controller::metrics::Metrics::new();
        let deployments = kuryr_controller::openstack::Deployments::noauth(&target.url, &metrics)?;
        let ctl = start_controller_with(
            &kube.client,
            deployments,
            metrics.clone(),
            config(&ini(
                fx,
                cluster,
                "vif,kuryrport,policy,kuryrnetworkpolicy,pod_label",
            )),
            "np-lists",
        );
        labelled_namespace(&kube.client, "l").await?;
        pod(&kube.client, "l", "db", json!({"app": "db"}), None).await?;
        for i in 0..PODS - 1 {
            pod(&kube.client, "l", &format!("w{i}"), json!({"app": "web"}), None).await?;
        }
        let db = active_port(&kube.client, "l", "db").await?;
        for i in 0..PODS - 1 {
            active_port(&kube.client, "l", &format!("w{i}")).await?;
        }
        let calls = || kuryr_controller::metrics::per_operation(&metrics.neutron_calls());
        let of = |c: &std::collections::BTreeMap<String, u64>, op: &str| c.get(op).copied().unwrap_or(0);
        let before = calls();
        let sg = deny_db(&kube.client, "l").await?;
        eventually("db on the policy's group", WAIT, || async {
            Ok(client
                .get_port(&db)
                .await?
                .security_groups
                .contains(&sg)
                .then_some(()))
        })
        .await?;
        // Every pass of the policy done: the calls stop growing.
        let mut after = calls();
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = calls();
            if now == after {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the policy's passes never settle"
            );
            after = now;
        }
        let (gets, lists, updates) = (
            of(&after, "get_port") - of(&before, "get_port"),
            of(&after, "list_ports") - of(&before, "list_ports"),
            of(&after, "update_port") - of(&before, "update_port"),
        );
        eprintln!(
            "{}: a policy on 1 pod of {PODS}: {gets} port GETs, {lists} port lists, {updates} port updates",
            target.name
        );
        assert_eq!(updates, 1, "{}: only db's port is written", target.name);
        assert!(
            gets <= 4,
            "{}: {gets} port GETs for a policy on one pod of {PODS} ({lists} lists)",
            target.name
        );
        ctl.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// Two address groups of one peer (two writers, or a crash between create and record) with the
/// policy's rule pointing at the second: membership still follows the pods, in the group the
/// rule points at, and the copy nobody points at goes. The copy listed first was kept, its
/// addresses updated while the rule kept pointing at the other, frozen, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_address_group_the_rule_points_at_keeps_following_the_pods() -> Result<()> {
    use kuryr_neutron::{AddressGroupCreate, SecurityGroupRuleCreate};
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.67.0.0/24").await?;
        let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
        let ctl = bed.start(&target, "policy,kuryrnetworkpolicy,pod_label", "np-dup-ag");
        labelled_namespace(&kube.client, "g").await?;
        pod(
            &kube.client,
            "g",
            "server",
            json!({"app": "server"}),
            Some("10.67.0.10"),
        )
        .await?;
        pod(
            &kube.client,
            "g",
            "c1",
            json!({"app": "client"}),
            Some("10.67.0.21"),
        )
        .await?;
        pod(
            &kube.client,
            "g",
            "c2",
            json!({"app": "other"}),
            Some("10.67.0.22"),
        )
        .await?;
        apply_policy(
            &kube.client,
            "g",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "server"}}, "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": 80}]}]}),
        )
        .await?;
        let sg = policy_group(&kube.client, "g", "p").await?;
        let (first, _) = eventually("the peer group holds c1", WAIT, || async {
            Ok(peer_addresses(client, &sg, 80)
                .await?
                .filter(|(_, a)| *a == set(&["10.67.0.21/32"])))
        })
        .await?;
        // A second copy of the peer group, and the rule moved onto it (what a second writer leaves).
        let original = client.get_address_group(&first).await?;
        let copy = client
            .create_address_group(&AddressGroupCreate {
                name: original.name.clone(),
                project_id: Some(original.project_id.clone()),
                description: Some(original.description.clone()),
                addresses: original.addresses.clone(),
            })
            .await?;
        let rules = client
            .list_security_group_rules(&ListFilter::new().security_group_id(&sg))
            .await?;
        for r in rules
            .iter()
            .filter(|r| r.remote_address_group_id.as_deref() == Some(first.as_str()))
        {
            client.delete_security_group_rule(&r.id).await?;
            client
                .create_security_group_rule(&SecurityGroupRuleCreate {
                    security_group_id: sg.clone(),
                    direction: r.direction.clone(),
                    ethertype: Some(r.ethertype.clone()),
                    protocol: r.protocol.clone(),
                    port_range_min: r.port_range_min,
                    port_range_max: r.port_range_max,
                    remote_address_group_id: Some(copy.id.clone()),
                    project_id: Some(r.project_id.clone()),
                    description: Some(r.description.clone()),
                    ..Default::default()
                })
                .await?;
        }
        // c2 joins the peer: the group the rule points at follows, and the other copy goes.
        Api::<Pod>::namespaced(kube.client.clone(), "g")
            .patch(
                "c2",
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"labels": {"app": "client"}}})),
            )
            .await?;
        let want = set(&["10.67.0.21/32", "10.67.0.22/32"]);
        let (kept, _) = eventually(
            &format!("{}: the rule's group holds c1 and c2", target.name),
            WAIT,
            || async { Ok(peer_addresses(client, &sg, 80).await?.filter(|(_, a)| *a == want)) },
        )
        .await?;
        assert_eq!(
            kept, copy.id,
            "{}: the copy the rule points at is kept, the rule left as it is",
            target.name
        );
        eventually(&format!("{}: one copy left", target.name), WAIT, || async {
            let left = client
                .list_address_groups(&ListFilter::new().eq("description", original.description.clone()))
                .await?;
            Ok((left.iter().filter(|a| a.name == original.name).count() == 1).then_some(()))
        })
        .await?;
        ctl.stop.cancel();
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

fn set_of(items: Vec<String>) -> BTreeSet<String> {
    items.into_iter().collect()
}

/// With the `neutron` pool, a pod a policy selects is never wired unprotected: the port it is
/// handed (from the pool of its group set, or borrowed from the default pool and moved) carries
/// the policy's group and not the default one by the time its KuryrPort shows it active, and an
/// unselected pod's pooled port keeps the defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pooled_port_handed_to_a_selected_pod_carries_its_policy_group() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let client = &target.client;
        let fx = neutron_fixture(client, "10.77.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_batch = 3\nports_pool_min = 1\nports_pool_update_frequency = 1",
        )
        .await?;
        let ini = bed.ini.replace(
            "enabled_handlers = vif,kuryrport\n",
            "enabled_handlers = vif,kuryrport,policy,kuryrnetworkpolicy,pod_label\n\
             pod_security_groups_driver = policy\n",
        );
        let ctl = start_controller(&kube.client, &target, config(&ini), "np-pool");
        labelled_namespace(&kube.client, "z").await?;
        // The default group's pool first: an unselected pod fills it.
        pod(&kube.client, "z", "web", json!({"app": "web"}), None).await?;
        let web = active_port(&kube.client, "z", "web").await?;
        assert_eq!(
            client.get_port(&web).await?.security_groups,
            vec![fx.sg.clone()],
            "{}: an unselected pod keeps the defaults",
            target.name
        );
        let sg = deny_db(&kube.client, "z").await?;
        for name in ["db-0", "db-1", "db-2"] {
            pod(&kube.client, "z", name, json!({"app": "db"}), None).await?;
            let port = client
                .get_port(&active_port(&kube.client, "z", name).await?)
                .await?;
            assert!(
                port.security_groups.contains(&sg) && !port.security_groups.contains(&fx.sg),
                "{}: {name} handed port {} with groups {:?}",
                target.name,
                port.id,
                port.security_groups
            );
            assert!(
                port.tags.iter().any(|t| t.starts_with("kuryr-rs.pool=")),
                "{}: {name}'s port came from a pool: {:?}",
                target.name,
                port.tags
            );
        }
        ctl.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// A pod deleted while a policy pass writes its port's groups: the port goes back to its pool
/// with the pool's groups, never the policy's (the next pod handed it would run under a policy
/// that does not select it). Port updates are slowed down in the emulator, so that the pool's
/// recycling saw the port before the policy's write landed, and returned it as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_port_released_during_a_policys_write_returns_to_its_pool_clean() -> Result<()> {
    use kuryr_controller::pool::api;
    use neutron_emulator::{FaultConfig, FaultRule};
    init_logs();
    for target in neutron_targets().await? {
        let Some(emulator) = target.emulator() else {
            eprintln!("{}: needs the emulator's slowed updates", target.name);
            continue;
        };
        let kube = start_kube().await?;
        let client = &target.client;
        let fx = neutron_fixture(client, "10.78.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_batch = 2\nports_pool_min = 1\nports_pool_update_frequency = 1",
        )
        .await?;
        let ini = bed.ini.replace(
            "enabled_handlers = vif,kuryrport\n",
            "enabled_handlers = vif,kuryrport,policy,kuryrnetworkpolicy,pod_label\n\
             pod_security_groups_driver = policy\n",
        );
        let ctl = start_controller(&kube.client, &target, config(&ini), "np-release");
        labelled_namespace(&kube.client, "r").await?;
        pod(&kube.client, "r", "db", json!({"app": "db"}), None).await?;
        let port = active_port(&kube.client, "r", "db").await?;
        let updates = || {
            emulator
                .stats()
                .operations
                .get("port.update")
                .copied()
                .unwrap_or(0)
        };
        let before = updates();
        let slow = Duration::from_secs(3);
        emulator.set_faults(FaultConfig {
            rules: vec![FaultRule::delay("port.update", slow)],
            ..FaultConfig::default()
        });
        deny_db(&kube.client, "r").await?;
        eventually("the policy's write of db's port under way", WAIT, || async {
            Ok((updates() > before).then_some(()))
        })
        .await?;
        Api::<Pod>::namespaced(kube.client.clone(), "r")
            .delete("db", &DeleteParams::default())
            .await?;
        let kps: Api<KuryrPort> = Api::namespaced(kube.client.clone(), "r");
        eventually("db's KuryrPort released", WAIT, || async {
            Ok(kps.get_opt("db").await?.is_none().then_some(()))
        })
        .await?;
        let pooled = || async {
            for p in api::list_pools(&bed.socket).await? {
                let shown = api::show_pool(&bed.socket, &p.name).await?;
                if let Some(state) = shown.ports.iter().find(|x| x.port_id == port) {
                    return Ok::<_, anyhow::Error>(Some(state.state.clone()));
                }
            }
            Ok(None)
        };
        let defaults = set_of(vec![fx.sg.clone()]);
        eventually("db's port available again on the pool's groups", WAIT, || async {
            let groups = set_of(client.get_port(&port).await?.security_groups);
            Ok((pooled().await?.as_deref() == Some("available") && groups == defaults).then_some(()))
        })
        .await?;
        // Past any write still under way when it was returned.
        tokio::time::sleep(slow + Duration::from_millis(500)).await;
        assert_eq!(
            set_of(client.get_port(&port).await?.security_groups),
            defaults,
            "{}: a pooled port on the pool's groups",
            target.name
        );
        emulator.set_faults(FaultConfig::default());
        ctl.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// Ingress from the nodes stays open on isolated pods (kubelet probes): the policy's group admits
/// the CIDR of each `[pod_vif_nested] worker_nodes_subnets` entry, as upstream's default rules do;
/// a listed subnet no deployment has is left out with a warning, not a policy that never applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_isolated_pod_still_admits_its_nodes() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let client = &target.client;
        let fx = neutron_fixture_subnets(client, &["10.73.0.0/24", "10.74.0.0/24"]).await?;
        let nodes = &fx.subnets[1];
        let cluster = format!("np-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let cfg = format!(
            "{}[pod_vif_nested]\nworker_nodes_subnets = {},{}\n",
            ini(&fx, &cluster, "policy,kuryrnetworkpolicy"),
            nodes.subnet,
            uuid::Uuid::new_v4()
        );
        let ctl = start_controller(&kube.client, &target, config(&cfg), "np-test-nodes");
        labelled_namespace(&kube.client, "n").await?;
        let sg = deny_db(&kube.client, "n").await?;
        // The other ingress rule names the namespace's Service VIPs by an address group.
        let prefixes: Vec<String> = eventually("the nodes' rule", WAIT, || async {
            let rules = client
                .list_security_group_rules(&ListFilter::new().security_group_id(&sg))
                .await?;
            let prefixes: Vec<_> = rules
                .into_iter()
                .filter(|r| r.direction == "ingress")
                .filter_map(|r| r.remote_ip_prefix)
                .collect();
            Ok((!prefixes.is_empty()).then_some(prefixes))
        })
        .await?;
        assert_eq!(prefixes, vec![nodes.cidr.clone()], "{}", target.name);
        ctl.stop.cancel();
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// Egress to the API servers by ipBlock, the usual way to let pods reach `kubernetes.default`:
/// the Service has no selector, its EndpointSlice names the servers on 6443, and the client
/// sends to its cluster IP on 443. The policy's group admits that VIP on 443, read from the
/// Service's EndpointSlice (a selector-less Service was never a peer's Service before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn egress_to_the_api_servers_admits_the_kubernetes_service_vip() -> Result<()> {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.75.0.0/24").await?;
        let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
        let ctl = bed.start(&target, "policy,kuryrnetworkpolicy", "np-test-apiserver");
        labelled_namespace(&kube.client, "n").await?;
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "kubernetes", "namespace": "n"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1",
                     "ports": [{"name": "https", "port": 443, "targetPort": 6443, "protocol": "TCP"}]}
        }))?;
        Api::<Service>::namespaced(kube.client.clone(), "n")
            .create(&PostParams::default(), &svc)
            .await?;
        let slice: EndpointSlice = serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes", "namespace": "n", "labels": {"kubernetes.io/service-name": "kubernetes"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["192.168.0.10"], "conditions": {"ready": true}}],
            "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]
        }))?;
        Api::<EndpointSlice>::namespaced(kube.client.clone(), "n")
            .create(&PostParams::default(), &slice)
            .await?;
        apply_policy(
            &kube.client,
            "n",
            "to-api",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
                "to": [{"ipBlock": {"cidr": "192.168.0.0/24"}}], "ports": [{"port": 6443}]}]}),
        )
        .await?;
        let sg = policy_group(&kube.client, "n", "to-api").await?;
        let vip = eventually("the VIP's egress rule", WAIT, || async {
            let rules = client
                .list_security_group_rules(&ListFilter::new().security_group_id(&sg))
                .await?;
            let Some(ag) = rules
                .iter()
                .find(|r| r.direction == "egress" && r.port_range_min == Some(443) && r.ethertype == "IPv4")
                .and_then(|r| r.remote_address_group_id.clone())
            else {
                return Ok(None);
            };
            Ok(Some(client.get_address_group(&ag).await?.addresses))
        })
        .await?;
        assert_eq!(vip, vec!["10.96.0.1/32".to_string()], "{}", target.name);
        ctl.stop.cancel();
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// A policy edit that its KuryrNetworkPolicy's spec does not show (a rule on a named port, which
/// resolves per pod) still reaches Neutron at once, not at the next resync: the policy's
/// generation is handed on with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_named_port_edit_reaches_neutron_without_waiting_for_a_resync() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.76.0.0/24").await?;
        let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
        let ctl = bed.start(&target, "policy,kuryrnetworkpolicy,pod_label", "np-test-named");
        labelled_namespace(&kube.client, "e").await?;
        let db: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "db", "namespace": "e", "labels": {"app": "db"}},
            "spec": {"nodeName": NODES[0], "containers": [{"name": "c", "image": "busybox",
                     "ports": [{"name": "web", "containerPort": 8080}, {"name": "alt", "containerPort": 9090}]}]}
        }))?;
        let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "e");
        pods.create(&PostParams::default(), &db).await?;
        let rule = |port: &str| {
            json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"],
                   "ingress": [{"ports": [{"port": port}]}]})
        };
        apply_policy(&kube.client, "e", "named", rule("web")).await?;
        let nps: Api<NetworkPolicy> = Api::namespaced(kube.client.clone(), "e");
        let uid = nps.get("named").await?.metadata.uid.unwrap_or_default();
        let ports = || async {
            let mut ports = BTreeSet::new();
            for sg in client
                .list_security_groups(&ListFilter::new().tags([format!("kuryr-rs.knp={uid}")]))
                .await?
            {
                for r in client
                    .list_security_group_rules(&ListFilter::new().security_group_id(&sg.id))
                    .await?
                {
                    if r.direction == "ingress" {
                        ports.extend(r.port_range_min);
                    }
                }
            }
            Ok::<_, anyhow::Error>(ports)
        };
        eventually("the rule on 8080", WAIT, || async {
            Ok((ports().await? == BTreeSet::from([8080])).then_some(()))
        })
        .await?;
        nps.patch(
            "named",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": rule("alt")})),
        )
        .await?;
        eventually("the rule on 9090", WAIT, || async {
            Ok((ports().await? == BTreeSet::from([9090])).then_some(()))
        })
        .await?;
        ctl.stop.cancel();
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// A replica that loses leadership and wins it back forgets what its earlier term learned: a
/// peer pod deleted while another replica led (no event reached this one) leaves the policy's
/// address group once the new term reconciles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_deleted_while_another_replica_led_leaves_the_policy() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.74.0.0/24").await?;
        let (kube, client, fx, cluster) = (&bed.kube, &target.client, &bed.fx, &bed.cluster);
        // With controller_ha the Lease decides who leads.
        let ha = ini(fx, cluster, "policy,kuryrnetworkpolicy,pod_label").replacen(
            "[neutron_defaults]",
            "controller_ha = true\n[neutron_defaults]",
            1,
        );
        let cfg = config(&ha);
        let lease_ns = cfg.kubernetes.controller_namespace.clone();
        let ctl = start_controller(&kube.client, &target, cfg, "np-term");
        labelled_namespace(&kube.client, "t").await?;
        pod(&kube.client, "t", "db", json!({"app": "db"}), Some("10.74.0.10")).await?;
        pod(
            &kube.client,
            "t",
            "web-1",
            json!({"app": "web"}),
            Some("10.74.0.11"),
        )
        .await?;
        apply_policy(
            &kube.client,
            "t",
            "db",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 5432}]}]}),
        )
        .await?;
        let sg = policy_group(&kube.client, "t", "db").await?;
        let peers = |want: &'static [&'static str]| {
            let sg = sg.clone();
            async move {
                eventually(&format!("peers {want:?}"), WAIT, || async {
                    let got = peer_addresses(client, &sg, 5432).await?.map(|(_, a)| a);
                    let want: BTreeSet<String> = want.iter().map(|a| format!("{a}/32")).collect();
                    Ok((got.as_ref() == Some(&want)).then_some(()))
                })
                .await
            }
        };
        peers(&["10.74.0.11"]).await?;

        // Another replica holds the lease for a while: this one stops handling events.
        let leases: Api<Lease> = Api::namespaced(kube.client.clone(), &lease_ns);
        let now = k8s_openapi::jiff::Timestamp::now();
        let taken = json!({"spec": {"holderIdentity": "np-other", "leaseDurationSeconds": 3600,
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now)}});
        leases
            .patch("kuryr-controller", &PatchParams::default(), &Patch::Merge(&taken))
            .await?;
        // Past this replica's next renewal (every 2 s): it has seen the lease taken.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let pods: Api<Pod> = Api::namespaced(kube.client.clone(), "t");
        pods.delete("web-1", &DeleteParams::default()).await?;
        pod(
            &kube.client,
            "t",
            "web-2",
            json!({"app": "web"}),
            Some("10.74.0.12"),
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        peers(&["10.74.0.11"]).await?;

        // The other replica is gone: this one leads again and lists the cluster afresh.
        leases
            .delete("kuryr-controller", &DeleteParams::default())
            .await?;
        peers(&["10.74.0.12"]).await?;
        ctl.stop.cancel();
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// The allow-all group of a direction (for pods no policy isolates that way) that a crash left
/// untagged between its create and its tagging is found by its name and description, finished
/// (its rules, its tags) and used: not made a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_all_group_a_crash_left_untagged_is_finished_not_made_again() -> Result<()> {
    use kuryr_controller::context::Context;
    use kuryr_neutron::SecurityGroupCreate;
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.75.0.0/24").await?;
        let (kube, client, fx, cluster) = (&bed.kube, &target.client, &bed.fx, &bed.cluster);
        let left = client
            .create_security_group(&SecurityGroupCreate {
                name: "kuryr-rs-np-open-ingress".into(),
                project_id: Some(fx.project.clone()),
                description: Some(format!("kuryr-rs-np-open:{cluster}:ingress")),
                ..Default::default()
            })
            .await?;
        let cfg = format!(
            "[kubernetes]\npod_security_groups_driver = policy\ncluster_id = {cluster}\n\
             [neutron_defaults]\nproject = {}\npod_subnet = {}\n",
            fx.project, fx.subnet
        );
        let platform = noauth_platform(&kube.client, &target.url, config(&cfg))?;
        let ctx = Context::build(platform.clone())?;
        labelled_namespace(&kube.client, "o").await?;
        pod(&kube.client, "o", "p", json!({"app": "p"}), Some("10.75.0.9")).await?;
        let p = Api::<Pod>::namespaced(kube.client.clone(), "o").get("p").await?;
        // Found by its description, it could be another cluster's left at the same cluster_id:
        // not adopted (nor made again) until this cluster's claim is confirmed.
        let e = ctx
            .drivers
            .network_policy
            .pod_groups("default", &p)
            .await
            .expect_err("adopted before the claim was confirmed");
        assert!(
            matches!(e, kuryr_controller::Error::ResourceNotReady(_)),
            "{}: {e}",
            target.name
        );
        let got = client.get_security_group(&left.id).await?;
        assert!(
            got.tags.is_empty(),
            "{}: finished unclaimed: {:?}",
            target.name,
            got.tags
        );
        platform.deployments.set_claimed("default", true);
        let groups = ctx.drivers.network_policy.pod_groups("default", &p).await?;
        assert!(
            groups.contains(&left.id),
            "{}: {groups:?} lacks {}",
            target.name,
            left.id
        );
        let named = client
            .list_security_groups(
                &ListFilter::new()
                    .project_id(&fx.project)
                    .name("kuryr-rs-np-open-ingress".to_string()),
            )
            .await?;
        assert_eq!(named.len(), 1, "{}: made again: {named:?}", target.name);
        let sg = &named[0];
        assert!(
            sg.tags.iter().any(|t| t == "kuryr-rs.np-open=ingress"),
            "{}: {:?}",
            target.name,
            sg.tags
        );
        let mut rules: Vec<(String, String)> = sg
            .security_group_rules
            .iter()
            .map(|r| (r.direction.clone(), r.ethertype.clone()))
            .collect();
        rules.sort();
        assert_eq!(
            rules,
            [
                ("ingress".to_string(), "IPv4".to_string()),
                ("ingress".into(), "IPv6".into())
            ],
            "{}: all ingress, nothing else",
            target.name
        );
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// A named-port edit moves a pod to another variant group; the old variant's group is deleted,
/// and until the pod is on its new group it waits on the policy's base group - still isolated -
/// never on what else it has (here the allow-all egress group: no ingress at all) or the
/// project's default groups. (On the emulator, whose group deletes are slowed so that the moment
/// can be seen.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_leaving_an_old_variant_waits_on_the_base_group_still_isolated() -> Result<()> {
    use neutron_emulator::{LatencyProfile, LatencyTable, OpLatency};
    init_logs();
    let target = neutron_targets().await?.remove(0);
    let emu = target.emulator().expect("the first target is the emulator");
    let bed = PolicyBed::new(&target, "10.77.0.0/24").await?;
    let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
    let ctl = bed.start(
        &target,
        "vif,kuryrport,policy,kuryrnetworkpolicy,pod_label",
        "np-variant",
    );
    labelled_namespace(&kube.client, "v").await?;
    let db: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "db", "namespace": "v", "labels": {"app": "db"}},
        "spec": {"nodeName": NODES[0], "containers": [{"name": "c", "image": "busybox",
                 "ports": [{"name": "web", "containerPort": 8080}, {"name": "alt", "containerPort": 9090}]}]}
    }))?;
    Api::<Pod>::namespaced(kube.client.clone(), "v")
        .create(&PostParams::default(), &db)
        .await?;
    let port = wait_active_ports(&kube.client, "v", 1)
        .await?
        .into_iter()
        .next()
        .expect("a port");
    let rule = |p: &str| {
        json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"],
               "ingress": [{"ports": [{"port": p}]}]})
    };
    apply_policy(&kube.client, "v", "named", rule("web")).await?;
    let nps: Api<NetworkPolicy> = Api::namespaced(kube.client.clone(), "v");
    let uid = nps.get("named").await?.metadata.uid.unwrap_or_default();
    let tagged = |tags: Vec<String>| async move {
        Ok::<_, anyhow::Error>(
            client
                .list_security_groups(&ListFilter::new().tags(tags))
                .await?
                .into_iter()
                .map(|sg| sg.id)
                .collect::<BTreeSet<String>>(),
        )
    };
    // The port's groups, and those of them that are the policy's.
    let on_port = || async {
        let now: BTreeSet<String> = client
            .get_port(&port)
            .await?
            .security_groups
            .into_iter()
            .collect();
        let ours: BTreeSet<String> = tagged(vec![format!("kuryr-rs.knp={uid}")])
            .await?
            .intersection(&now)
            .cloned()
            .collect();
        Ok::<_, anyhow::Error>((now, ours))
    };
    let base = eventually("the policy's base group", WAIT, || async {
        let tags = vec![format!("kuryr-rs.knp={uid}"), "kuryr-rs.variant=base".into()];
        Ok(tagged(tags).await?.into_iter().next())
    })
    .await?;
    let first = eventually("the pod on its named-port variant", WAIT, || async {
        let (_, ours) = on_port().await?;
        Ok((ours.len() == 1 && !ours.contains(&base))
            .then(|| ours.into_iter().next())
            .flatten())
    })
    .await?;

    emu.set_latency(LatencyProfile::Custom(LatencyTable {
        ops: [("security_group.delete".to_string(), OpLatency::fixed(1500))].into(),
        ..LatencyTable::default()
    }));
    nps.patch(
        "named",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": rule("alt")})),
    )
    .await?;
    let mut seen: Vec<(BTreeSet<String>, BTreeSet<String>)> = vec![];
    let started = std::time::Instant::now();
    loop {
        let now = on_port().await?;
        if seen.last() != Some(&now) {
            seen.push(now.clone());
        }
        let ours = &now.1;
        if ours.len() == 1 && !ours.contains(&first) && !ours.contains(&base) {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "never moved to the new variant: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        seen.iter()
            .all(|(now, ours)| !ours.is_empty() && !now.contains(&fx.sg)),
        "the pod left the policy's groups meanwhile: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|(_, ours)| ours == &BTreeSet::from([base.clone()])),
        "the base group held it meanwhile: {seen:?}"
    );
    emu.set_latency(LatencyProfile::Custom(LatencyTable::default()));
    ctl.stop.cancel();
    cleanup_project(client, &fx.project).await;
    Ok(())
}

/// A KuryrNetworkPolicy deleted while its NetworkPolicy stands (by hand, or by a collector) is
/// made again at once, and the policy's groups are kept for it, not released and made anew: the
/// policy never stops being enforced. Before, its finalizer released the groups and nothing made
/// the object again until a resync (and with selected pods it never let go: their groups were gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kuryrnetworkpolicy_deleted_under_a_standing_policy_is_made_again_with_its_groups() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.78.0.0/24").await?;
        let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
        let ctl = bed.start(&target, "policy,kuryrnetworkpolicy,pod_label", "np-test-remade");
        labelled_namespace(&kube.client, "r").await?;
        pod(
            &kube.client,
            "r",
            "db-0",
            json!({"app": "db"}),
            Some("10.78.0.20"),
        )
        .await?;
        let sg = deny_db(&kube.client, "r").await?;
        let knps: Api<KuryrNetworkPolicy> = Api::namespaced(kube.client.clone(), "r");
        let old = knps.get("deny").await?.metadata.uid;
        knps.delete("deny", &DeleteParams::default()).await?;
        let again = eventually(
            "the KuryrNetworkPolicy made again",
            Duration::from_secs(30),
            || async {
                Ok(knps
                    .get_opt("deny")
                    .await?
                    .filter(|k| k.metadata.uid != old && k.metadata.deletion_timestamp.is_none())
                    .and_then(|k| k.status)
                    .and_then(|s| s.security_group_id))
            },
        )
        .await?;
        assert_eq!(again, sg, "{}: the same group, kept", target.name);
        client.get_security_group(&sg).await?;
        ctl.stop.cancel();
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// A Service made in front of a policy's egress peers after the policy: its VIP is admitted when
/// the Service comes (a client's packets leave for the VIP before the load balancer rewrites
/// them), not at the policy's next resync two minutes later; and it goes when the Service's
/// deletion starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_made_after_a_policy_has_its_vip_admitted_at_once() -> Result<()> {
    use k8s_openapi::api::core::v1::Service;
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.79.0.0/24").await?;
        let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
        let ctl = bed.start(
            &target,
            "policy,kuryrnetworkpolicy,pod_label",
            "np-test-svc-later",
        );
        labelled_namespace(&kube.client, "s").await?;
        pod(&kube.client, "s", "db", json!({"app": "db"}), Some("10.79.0.5")).await?;
        apply_policy(
            &kube.client,
            "s",
            "to-db",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
                "to": [{"podSelector": {"matchLabels": {"app": "db"}}}], "ports": [{"port": 5432}]}]}),
        )
        .await?;
        let sg = policy_group(&kube.client, "s", "to-db").await?;
        let admitted = || async {
            let mut out = BTreeSet::new();
            for r in client
                .list_security_group_rules(&ListFilter::new().security_group_id(&sg))
                .await?
            {
                if r.direction == "egress" && r.port_range_min == Some(5432) {
                    if let Some(ag) = &r.remote_address_group_id {
                        out.extend(client.get_address_group(ag).await?.addresses);
                    }
                    out.extend(r.remote_ip_prefix.clone());
                }
            }
            anyhow::Ok(out)
        };
        eventually("the peer admitted", WAIT, || async {
            Ok(admitted().await?.contains("10.79.0.5/32").then_some(()))
        })
        .await?;
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "s"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.30", "selector": {"app": "db"},
                     "ports": [{"port": 5432, "targetPort": 5432, "protocol": "TCP"}]}
        }))?;
        let services = Api::<Service>::namespaced(kube.client.clone(), "s");
        services.create(&PostParams::default(), &svc).await?;
        let within = Duration::from_secs(20);
        eventually("the VIP admitted", within, || async {
            Ok(admitted().await?.contains("10.96.0.30/32").then_some(()))
        })
        .await
        .map_err(|e| e.context(target.name))?;
        // Held by a finalizer (kuryr's, while its load balancer goes): it counts no more.
        let hold = json!({"metadata": {"finalizers": ["test.example/hold"]}});
        services
            .patch("db", &PatchParams::default(), &Patch::Merge(&hold))
            .await?;
        services.delete("db", &Default::default()).await?;
        eventually("the VIP no longer admitted", within, || async {
            let now = admitted().await?;
            Ok((!now.contains("10.96.0.30/32") && now.contains("10.79.0.5/32")).then_some(()))
        })
        .await
        .map_err(|e| e.context(target.name))?;
        let release = json!({"metadata": {"finalizers": null}});
        services
            .patch("db", &PatchParams::default(), &Patch::Merge(&release))
            .await?;
        ctl.stop.cancel();
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// The backends of a Service without a selector move (an external database's address changes in
/// its hand-made EndpointSlice): an egress rule to the new address admits the VIP when the slice
/// changes, and no longer to the old one, not at the policy's next resync two minutes later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_selector_less_services_moved_backend_is_followed_when_its_slice_changes() -> Result<()> {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.80.0.0/24").await?;
        let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
        let ctl = bed.start(
            &target,
            "policy,kuryrnetworkpolicy,pod_label",
            "np-test-slice-moves",
        );
        labelled_namespace(&kube.client, "x").await?;
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "x"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.50",
                     "ports": [{"name": "pg", "port": 5432, "targetPort": 15432, "protocol": "TCP"}]}
        }))?;
        Api::<Service>::namespaced(kube.client.clone(), "x")
            .create(&PostParams::default(), &svc)
            .await?;
        let slice = |address: &str| -> Result<EndpointSlice> {
            Ok(serde_json::from_value(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "db-1", "namespace": "x", "labels": {
                    "kubernetes.io/service-name": "db",
                    "endpointslice.kubernetes.io/managed-by": "ops.example/by-hand"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
                "ports": [{"name": "pg", "port": 15432, "protocol": "TCP"}]
            }))?)
        };
        let slices = Api::<EndpointSlice>::namespaced(kube.client.clone(), "x");
        slices
            .create(&PostParams::default(), &slice("172.16.0.10")?)
            .await?;
        apply_policy(
            &kube.client,
            "x",
            "to-db",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
                "to": [{"ipBlock": {"cidr": "192.168.5.0/24"}}], "ports": [{"port": 15432}]}]}),
        )
        .await?;
        let sg = policy_group(&kube.client, "x", "to-db").await?;
        let vip_admitted = || async {
            let rules = client
                .list_security_group_rules(&ListFilter::new().security_group_id(&sg))
                .await?;
            let mut out = BTreeSet::new();
            for r in rules
                .iter()
                .filter(|r| r.direction == "egress" && r.port_range_min == Some(5432))
            {
                if let Some(ag) = &r.remote_address_group_id {
                    out.extend(client.get_address_group(ag).await?.addresses);
                }
                out.extend(r.remote_ip_prefix.clone());
            }
            anyhow::Ok(out.contains("10.96.0.50/32"))
        };
        eventually("the ipBlock's rule", WAIT, || async {
            let rules = client
                .list_security_group_rules(&ListFilter::new().security_group_id(&sg))
                .await?;
            Ok(rules
                .iter()
                .any(|r| {
                    r.port_range_min == Some(15432) && r.remote_ip_prefix.as_deref() == Some("192.168.5.0/24")
                })
                .then_some(()))
        })
        .await?;
        assert!(
            !vip_admitted().await?,
            "{}: the backend is outside the block",
            target.name
        );

        let within = Duration::from_secs(20);
        let moved = json!({"endpoints": [{"addresses": ["192.168.5.7"], "conditions": {"ready": true}}]});
        slices
            .patch("db-1", &PatchParams::default(), &Patch::Merge(&moved))
            .await?;
        eventually("the VIP admitted", within, || async {
            Ok(vip_admitted().await?.then_some(()))
        })
        .await
        .map_err(|e| e.context(target.name))?;
        slices.delete("db-1", &Default::default()).await?;
        eventually("the VIP no longer admitted", within, || async {
            Ok((!vip_admitted().await?).then_some(()))
        })
        .await
        .map_err(|e| e.context(target.name))?;
        ctl.stop.cancel();
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}

/// A policy whose group the project's quota refused does not hold the deletion of another policy
/// of its pods, which may be what frees the quota: the deletion waits a while for the pods to be
/// moved (they cannot be: the refused policy has no group to move them to), then releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_over_the_group_quota_holds_no_other_policys_deletion() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let bed = PolicyBed::new(&target, "10.71.0.0/24").await?;
        let (kube, client, fx) = (&bed.kube, &target.client, &bed.fx);
        let ctl = bed.start(
            &target,
            "vif,kuryrport,policy,kuryrnetworkpolicy,pod_label",
            "np-held",
        );
        labelled_namespace(&kube.client, "h").await?;
        pod(&kube.client, "h", "db", json!({"app": "db"}), None).await?;
        let port = active_port(&kube.client, "h", "db").await?;
        let deny = deny_db(&kube.client, "h").await?;
        eventually("db on the policy's group", WAIT, || async {
            Ok(client
                .get_port(&port)
                .await?
                .security_groups
                .contains(&deny)
                .then_some(()))
        })
        .await?;
        // No group more fits in the project.
        let used = client
            .list_security_groups(&ListFilter::new().project_id(&fx.project))
            .await?
            .len();
        client
            .update_quota(
                &fx.project,
                &kuryr_neutron::QuotaUpdate {
                    security_group: Some(i64::try_from(used)?),
                    ..Default::default()
                },
            )
            .await?;
        apply_policy(
            &kube.client,
            "h",
            "from-web",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
        )
        .await?;
        over_quota_warning(&kube.client, "h").await?;
        Api::<NetworkPolicy>::namespaced(kube.client.clone(), "h")
            .delete("deny", &DeleteParams::default())
            .await?;
        let knps: Api<KuryrNetworkPolicy> = Api::namespaced(kube.client.clone(), "h");
        eventually("deny's KuryrNetworkPolicy finalized", WAIT, || async {
            Ok(knps.get_opt("deny").await?.is_none().then_some(()))
        })
        .await?;
        assert!(
            client
                .list_security_groups(&ListFilter::new().id(&deny))
                .await?
                .is_empty(),
            "{}: deny's group released",
            target.name
        );
        assert!(
            !client.get_port(&port).await?.security_groups.contains(&deny),
            "{}: and taken off db's port",
            target.name
        );
        ctl.shutdown().await?;
        cleanup_project(client, &fx.project).await;
    }
    Ok(())
}
