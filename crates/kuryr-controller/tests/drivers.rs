//! Drivers end to end through the controller: `nested-macvlan` (allowed address pairs on the VM
//! port), the `namespace` security group driver and `multi_pool` routing. Each test runs against
//! the Neutron emulator and, with KURYR_TEST_NEUTRON_URL set, the real neutron-server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kuryr_crds::KuryrPort;
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::{ListFilter, NeutronClient};
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(120);

/// Port id of each pod of `ns` (by pod name) once exactly `n` KuryrPorts have an active VIF.
async fn wired(kube: &kube::Client, ns: &str, n: usize) -> Result<BTreeMap<String, String>> {
    let api = Api::<KuryrPort>::namespaced(kube.clone(), ns);
    eventually(&format!("{n} active KuryrPorts in {ns}"), WAIT, || async {
        let kps = api.list(&ListParams::default()).await?.items;
        let ports: BTreeMap<String, String> = kps
            .iter()
            .filter_map(|kp| {
                let (_, vif) = kp.status.as_ref()?.default_vif()?;
                vif.active().then(|| (kp.name_any(), vif.id().to_string()))
            })
            .collect();
        Ok((kps.len() == n && ports.len() == n).then_some(ports))
    })
    .await
}

async fn delete_pods(kube: &kube::Client, ns: &str, names: &[&str]) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(kube.clone(), ns);
    for name in names {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    eventually("pods gone", WAIT, || async {
        for name in names {
            if pods.get_opt(name).await?.is_some() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

async fn gone(neutron: &NeutronClient, port: &str) -> Result<bool> {
    match neutron.get_port(port).await {
        Ok(_) => Ok(false),
        Err(e) if e.is_not_found() => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// (ip, mac) of every fixed IP of `port`.
async fn addresses(neutron: &NeutronClient, port: &str) -> Result<BTreeSet<(String, String)>> {
    let p = neutron.get_port(port).await?;
    Ok(p.fixed_ips
        .iter()
        .map(|f| (f.ip_address.clone(), p.mac_address.to_lowercase()))
        .collect())
}

/// The allowed address pairs of the VM port `port`.
async fn pairs(neutron: &NeutronClient, port: &str) -> Result<BTreeSet<(String, String)>> {
    let p = neutron.get_port(port).await?;
    Ok(p.allowed_address_pairs
        .iter()
        .map(|a| {
            (
                a.ip_address.clone(),
                a.mac_address.clone().unwrap_or_default().to_lowercase(),
            )
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nested_macvlan_pods_are_allowed_address_pairs_of_their_vm_port() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.70.0.0/24").await?;
        let vms = vm_trunks(neutron, &kube.client, &fx.project, "192.168.70.0/24").await?;
        let mut vm_ports = Vec::new();
        for trunk in &vms.trunks {
            vm_ports.push(neutron.get_trunk(trunk).await?.port_id);
        }
        let cfg = format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = nested-macvlan\n\
             [pod_vif_nested]\nworker_nodes_subnets = {}\n\
             [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\n",
            vms.subnet, fx.project, fx.subnet, fx.sg
        );
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c1");
        create_namespace(&kube.client, "mv", json!({})).await?;
        // Six pods on the first VM at once: their pair updates race on one VM port, and the
        // revision-checked update must keep every one of them.
        let names: Vec<String> = (0..8).map(|i| format!("m-{i}")).collect();
        let creates = names.iter().enumerate().map(|(i, name)| {
            let node = if i < 6 { NODES[0] } else { NODES[1] };
            create_pod(&kube.client, "mv", name, node, json!({}))
        });
        futures::future::try_join_all(creates).await?;
        let ports = wired(&kube.client, "mv", 8).await?;

        let mut expected = [BTreeSet::new(), BTreeSet::new()];
        let mut by_pod = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            let port = neutron.get_port(&ports[name]).await?;
            assert_eq!(port.device_owner, "compute:kuryr", "{}", target.name);
            assert_eq!(port.network_id, fx.network);
            assert!(port.binding_host_id.is_empty(), "macvlan ports are not bound");
            let own = addresses(neutron, &port.id).await?;
            expected[usize::from(i >= 6)].extend(own.iter().cloned());
            by_pod.insert(name.clone(), own);
        }
        assert_eq!(expected[0].len(), 6);
        for (vm, want) in vm_ports.iter().zip(&expected) {
            assert_eq!(&pairs(neutron, vm).await?, want, "{}: VM port {vm}", target.name);
        }

        // Deleting two pods removes exactly their pairs.
        delete_pods(&kube.client, "mv", &["m-0", "m-1"]).await?;
        let mut left = expected[0].clone();
        for name in ["m-0", "m-1"] {
            assert!(
                gone(neutron, &ports[name]).await?,
                "{}: port deleted",
                target.name
            );
        }
        for a in by_pod["m-0"].iter().chain(&by_pod["m-1"]) {
            left.remove(a);
        }
        assert_eq!(left.len(), 4);
        assert_eq!(pairs(neutron, &vm_ports[0]).await?, left, "{}", target.name);
        assert_eq!(pairs(neutron, &vm_ports[1]).await?, expected[1]);

        // The second VM deleted, its port with it (Nova's): its pods' ports still go when the
        // pods do (there is no pair left to remove); they stayed Terminating for good.
        let unbound = kuryr_neutron::PortUpdate {
            device_id: Some(String::new()),
            binding_host_id: Some(String::new()),
            ..Default::default()
        };
        neutron.update_port(&vm_ports[1], &unbound).await?;
        neutron.delete_trunk(&vms.trunks[1]).await?;
        neutron.delete_port(&vm_ports[1]).await?;
        delete_pods(&kube.client, "mv", &["m-6", "m-7"]).await?;
        for name in ["m-6", "m-7"] {
            assert!(
                gone(neutron, &ports[name]).await?,
                "{}: {name}'s port deleted",
                target.name
            );
        }

        let rest: Vec<&str> = names[2..6].iter().map(String::as_str).collect();
        delete_pods(&kube.client, "mv", &rest).await?;
        assert!(
            pairs(neutron, &vm_ports[0]).await?.is_empty(),
            "{}: pairs left on {}",
            target.name,
            vm_ports[0]
        );
        let owned = neutron
            .list_ports(
                &ListFilter::new()
                    .network_id(&fx.network)
                    .device_owner("compute:kuryr"),
            )
            .await?;
        assert!(owned.is_empty(), "{}: pod ports left", target.name);
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!("macvlan[{}]: 8 pods paired and unpaired", target.name);
    }
    Ok(())
}

/// A crash between a macvlan port's create and its KuryrPort record leaves a port tagged for the
/// pod whose address pair is already on the VM port: deleted with the pod, the pair goes with it
/// (left, the VM could still send as an address Neutron hands to another pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unrecorded_macvlan_port_leaves_its_vm_port_with_its_pod() -> Result<()> {
    use kuryr_crds::names::device_owner::COMPUTE_KURYR;
    use kuryr_neutron::{AllowedAddressPair, PortCreate, PortUpdate};
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.71.0.0/24").await?;
        let vms = vm_trunks(neutron, &kube.client, &fx.project, "192.168.71.0/24").await?;
        let vm_port = neutron.get_trunk(&vms.trunks[0]).await?.port_id;
        let cfg = config(&format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = nested-macvlan\n\
             [pod_vif_nested]\nworker_nodes_subnets = {}\n\
             [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\n",
            vms.subnet, fx.project, fx.subnet, fx.sg
        ));
        let first = start_controller(&kube.client, &target, cfg.clone(), "c1");
        create_namespace(&kube.client, "mv", json!({})).await?;
        let pod = create_pod(&kube.client, "mv", "victim", NODES[0], json!({})).await?;
        wired(&kube.client, "mv", 1).await?;
        let recorded = pairs(neutron, &vm_port).await?;
        assert_eq!(recorded.len(), 1, "{}: the pod's pair", target.name);

        // What the crashed controller left: a port for the pod, paired, never recorded.
        let lost = neutron
            .create_port(&PortCreate {
                project_id: Some(fx.project.clone()),
                device_id: Some(pod.uid().unwrap()),
                device_owner: Some(COMPUTE_KURYR.into()),
                tags: vec![
                    tags::TAG_MANAGED.into(),
                    tags::cluster_tag(&cfg.kubernetes.cluster_id),
                    tags::pod_tag("mv", "victim"),
                ],
                ..PortCreate::new(&fx.network)
            })
            .await?;
        let vm = neutron.get_port(&vm_port).await?;
        let mut all = vm.allowed_address_pairs.clone();
        all.push(AllowedAddressPair {
            ip_address: lost.fixed_ips[0].ip_address.clone(),
            mac_address: Some(lost.mac_address.clone()),
        });
        neutron
            .update_port(
                &vm_port,
                &PortUpdate {
                    allowed_address_pairs: Some(all),
                    ..Default::default()
                },
            )
            .await?;
        assert_eq!(pairs(neutron, &vm_port).await?.len(), 2);
        first.stop.cancel();
        let ctrl = start_controller(&kube.client, &target, cfg.clone(), "c2");

        delete_pods(&kube.client, "mv", &["victim"]).await?;
        assert!(
            gone(neutron, &lost.id).await?,
            "{}: the unrecorded port deleted",
            target.name
        );
        assert!(
            pairs(neutron, &vm_port).await?.is_empty(),
            "{}: both pairs off the VM port",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!(
            "macvlan[{}]: an unrecorded port's pair released with its pod",
            target.name
        );
    }
    Ok(())
}

fn namespace_sg_config(fx: &NeutronFixture, cluster: &str) -> String {
    format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\n\
         pod_security_groups_driver = namespace\ncluster_id = {cluster}\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nresource_tags = k8s,test\n",
        fx.project, fx.subnet, fx.sg
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_security_groups_isolate_namespaces_and_clusters() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let neutron = &target.client;
        // Two clusters sharing one Neutron, each with a namespace "team".
        let kube = start_kube().await?;
        let other_kube = start_kube().await?;
        let fx = neutron_fixture(neutron, "10.71.0.0/24").await?;
        let other_fx = neutron_fixture(neutron, "10.72.0.0/24").await?;
        let run_id = uuid::Uuid::new_v4().simple().to_string();
        let ctrl = start_controller(
            &kube.client,
            &target,
            config(&namespace_sg_config(&fx, &format!("a-{run_id}"))),
            "a",
        );
        let other_ctrl = start_controller(
            &other_kube.client,
            &target,
            config(&namespace_sg_config(&other_fx, &format!("b-{run_id}"))),
            "b",
        );
        for ns in ["team", "other"] {
            create_namespace(&kube.client, ns, json!({})).await?;
        }
        create_namespace(&other_kube.client, "team", json!({})).await?;
        for (i, node) in NODES.iter().enumerate() {
            create_pod(&kube.client, "team", &format!("t-{i}"), node, json!({})).await?;
        }
        create_pod(&kube.client, "other", "o-0", NODES[0], json!({})).await?;
        let team = wired(&kube.client, "team", 2).await?;
        let other = wired(&kube.client, "other", 1).await?;

        let extra_group = |sgs: &[String], default: &str| -> BTreeSet<String> {
            sgs.iter().filter(|s| *s != default).cloned().collect()
        };
        let mut team_groups = BTreeSet::new();
        for port in team.values() {
            let p = neutron.get_port(port).await?;
            assert!(
                p.security_groups.contains(&fx.sg),
                "{}: default group kept",
                target.name
            );
            assert_eq!(
                p.security_groups.len(),
                2,
                "{}: {:?}",
                target.name,
                p.security_groups
            );
            team_groups.extend(extra_group(&p.security_groups, &fx.sg));
        }
        assert_eq!(team_groups.len(), 1, "{}: one group per namespace", target.name);
        let team_sg = team_groups.into_iter().next().unwrap();
        let p = neutron.get_port(&other["o-0"]).await?;
        let other_groups = extra_group(&p.security_groups, &fx.sg);
        assert_eq!(other_groups.len(), 1, "{}", target.name);
        assert!(
            !other_groups.contains(&team_sg),
            "{}: namespaces share a group",
            target.name
        );

        // The namespace's group: in the pod's project, tagged, admitting its own members.
        let sg = neutron.get_security_group(&team_sg).await?;
        assert_eq!(sg.project_id, fx.project, "{}", target.name);
        assert!(
            sg.tags.iter().any(|t| t == "kuryr-rs.namespace=team"),
            "{:?}",
            sg.tags
        );
        assert!(
            sg.tags
                .iter()
                .any(|t| *t == tags::cluster_tag(&format!("a-{run_id}")))
        );
        let rules = neutron
            .list_security_group_rules(&ListFilter::new().security_group_id(&team_sg))
            .await?;
        for ethertype in ["IPv4", "IPv6"] {
            assert!(
                rules.iter().any(|r| r.direction == "ingress"
                    && r.ethertype == ethertype
                    && r.remote_group_id.as_deref() == Some(team_sg.as_str())),
                "{}: no {ethertype} ingress rule from the group itself: {rules:?}",
                target.name
            );
        }

        // The other cluster's "team" never shares this cluster's group.
        create_pod(&other_kube.client, "team", "x-0", NODES[1], json!({})).await?;
        let theirs = wired(&other_kube.client, "team", 1).await?;
        let p = neutron.get_port(&theirs["x-0"]).await?;
        assert!(p.security_groups.contains(&other_fx.sg));
        assert!(
            !p.security_groups.contains(&team_sg),
            "{}: another cluster's namespace got this cluster's group",
            target.name
        );
        for sg in extra_group(&p.security_groups, &other_fx.sg) {
            let sg = neutron.get_security_group(&sg).await?;
            assert_eq!(sg.project_id, other_fx.project, "{}", target.name);
        }

        // A second controller of the same cluster (a restart) finds the group instead of
        // making another one.
        ctrl.shutdown().await?;
        let ctrl = start_controller(
            &kube.client,
            &target,
            config(&namespace_sg_config(&fx, &format!("a-{run_id}"))),
            "a2",
        );
        create_pod(&kube.client, "team", "t-2", NODES[0], json!({})).await?;
        let team = wired(&kube.client, "team", 3).await?;
        let p = neutron.get_port(&team["t-2"]).await?;
        assert_eq!(
            extra_group(&p.security_groups, &fx.sg),
            BTreeSet::from([team_sg.clone()]),
            "{}",
            target.name
        );
        let groups = neutron
            .list_security_groups(&ListFilter::new().project_id(&fx.project))
            .await?;
        let namespace_groups = groups
            .iter()
            .filter(|g| g.tags.iter().any(|t| t.starts_with("kuryr-rs.namespace=")))
            .count();
        assert_eq!(namespace_groups, 2, "{}: team and other", target.name);

        ctrl.stop.cancel();
        other_ctrl.stop.cancel();
        for k in [&kube.client, &other_kube.client] {
            for ns in ["team", "other"] {
                let names: Vec<String> = Api::<Pod>::namespaced(k.clone(), ns)
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .map(|p| p.name_any())
                    .collect();
                for n in names {
                    let _ = Api::<Pod>::namespaced(k.clone(), ns)
                        .delete(&n, &DeleteParams::default())
                        .await;
                }
            }
        }
        cleanup_project(neutron, &fx.project).await;
        cleanup_project(neutron, &other_fx.project).await;
        eprintln!("namespace-sg[{}]: groups per namespace and cluster", target.name);
    }
    Ok(())
}

/// A replica that wins the lease back forgets the namespace groups its earlier term cached:
/// another replica's sweep may have deleted one meanwhile (its namespace deleted and made
/// again), and a port create naming it would fail at every retry. One deleted under a leader
/// is forgotten when a port create names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_term_forgets_the_namespace_groups_it_cached() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.79.0.0/24").await?;
        let cluster = format!("nst-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let ini = namespace_sg_config(&fx, &cluster).replacen(
            "[kubernetes]\n",
            "[kubernetes]\ncontroller_ha = true\n",
            1,
        );
        assert!(ini.contains("controller_ha = true"));
        let cfg = config(&ini);
        let leases: Api<Lease> = Api::namespaced(kube.client.clone(), &cfg.kubernetes.controller_namespace);
        let ctrl = start_controller(&kube.client, &target, cfg, "term-a");
        create_namespace(&kube.client, "team", json!({})).await?;
        create_pod(&kube.client, "team", "first", NODES[0], json!({})).await?;
        let port = wired(&kube.client, "team", 1).await?["first"].clone();
        let cached = namespace_group_of(neutron, &port, &fx.sg).await?;
        delete_pods(&kube.client, "team", &["first"]).await?;
        eventually("the first pod's port deleted", WAIT, || async {
            Ok(gone(neutron, &port).await?.then_some(()))
        })
        .await?;

        // Another replica holds the lease a while; its sweep deletes the group.
        let taken = json!({"spec": {"holderIdentity": "term-b", "leaseDurationSeconds": 3600,
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now())}});
        leases
            .patch("kuryr-controller", &PatchParams::default(), &Patch::Merge(&taken))
            .await?;
        // Past this replica's next renewal (every 2 s): it has seen the lease taken.
        tokio::time::sleep(Duration::from_secs(5)).await;
        neutron.delete_security_group(&cached).await?;

        // The other replica is gone: this one leads again.
        leases
            .delete("kuryr-controller", &DeleteParams::default())
            .await?;
        create_pod(&kube.client, "team", "second", NODES[0], json!({})).await?;
        let port = wired(&kube.client, "team", 1).await?["second"].clone();
        let made = namespace_group_of(neutron, &port, &fx.sg).await?;
        assert_ne!(made, cached, "{}", target.name);
        assert!(group_exists(neutron, &made).await?, "{}", target.name);

        // Deleted behind this leader's back too (an operator): the port create that names it
        // fails, the group is forgotten and made again by the retry.
        delete_pods(&kube.client, "team", &["second"]).await?;
        eventually("the second pod's port deleted", WAIT, || async {
            Ok(gone(neutron, &port).await?.then_some(()))
        })
        .await?;
        neutron.delete_security_group(&made).await?;
        create_pod(&kube.client, "team", "third", NODES[0], json!({})).await?;
        let port = wired(&kube.client, "team", 1).await?["third"].clone();
        let again = namespace_group_of(neutron, &port, &fx.sg).await?;
        assert!(
            again != made && group_exists(neutron, &again).await?,
            "{}",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!("namespace-sg[{}]: a new term made the group anew", target.name);
    }
    Ok(())
}

/// The one group of a port besides `default`.
async fn namespace_group_of(neutron: &NeutronClient, port: &str, default: &str) -> Result<String> {
    let groups: Vec<String> = neutron
        .get_port(port)
        .await?
        .security_groups
        .into_iter()
        .filter(|g| g != default)
        .collect();
    assert_eq!(groups.len(), 1, "one namespace group: {groups:?}");
    Ok(groups.into_iter().next().unwrap())
}

async fn group_exists(neutron: &NeutronClient, sg: &str) -> Result<bool> {
    match neutron.get_security_group(sg).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// With the `namespace` groups driver and no namespace subnets, no KuryrNetwork releases a
/// namespace's group: the orphan sweep does, once the namespace is gone (here deleted while no
/// controller ran: the next one's first pass). The pool keyed by the group goes first, as its
/// spare ports hold the group; another namespace keeps its group and its pod's port.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gone_namespaces_group_is_released_with_its_pool() -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.76.0.0/24").await?;
        let bed = PoolBed::new(&kube, &fx, "ports_pool_min = 2\nports_pool_batch = 3\n").await?;
        let ini = bed.ini.replace(
            "[pool_manager]",
            "pod_security_groups_driver = namespace\n[pool_manager]",
        );
        assert!(ini.contains("pod_security_groups_driver = namespace\n[pool_manager]"));
        // Groups left untagged by a crash between their create and their tagging, found by
        // their description: this cluster's is finished and used (stays) or, its namespace
        // gone, swept (gone); another cluster's and upstream's (same name, their own
        // description) are neither.
        let untagged = |ns: &'static str, description: String| {
            let project = fx.project.clone();
            async move {
                Ok::<_, anyhow::Error>(
                    neutron
                        .create_security_group(&kuryr_neutron::SecurityGroupCreate {
                            name: format!("ns/{ns}-sg"),
                            project_id: Some(project),
                            description: Some(description),
                            ..Default::default()
                        })
                        .await?
                        .id,
                )
            }
        };
        let kept = [
            untagged("gone", "kuryr-rs-ns:another-cluster:gone".into()).await?,
            untagged("gone", "upstream's namespace group".into()).await?,
        ];
        let left = untagged("stays", format!("kuryr-rs-ns:{}:stays", bed.cluster_id)).await?;
        let ctrl = start_controller(&kube.client, &target, config(&ini), "c1");
        for ns in ["gone", "stays"] {
            create_namespace(&kube.client, ns, json!({})).await?;
            create_pod(&kube.client, ns, "p", NODES[0], json!({})).await?;
        }
        let gone_port = wired(&kube.client, "gone", 1).await?["p"].clone();
        let stays_port = wired(&kube.client, "stays", 1).await?["p"].clone();
        let gone_sg = namespace_group_of(neutron, &gone_port, &fx.sg).await?;
        let stays_sg = namespace_group_of(neutron, &stays_port, &fx.sg).await?;
        assert_ne!(gone_sg, stays_sg, "{}", target.name);
        assert_eq!(
            stays_sg, left,
            "{}: the leftover is finished, not made again",
            target.name
        );
        assert!(
            !kept.contains(&gone_sg),
            "{}: not this cluster's group",
            target.name
        );
        let holding = |sg: String| async move {
            Ok::<_, anyhow::Error>(
                neutron
                    .list_ports(&ListFilter::new().eq("security_groups", sg))
                    .await?
                    .len(),
            )
        };
        eventually("spare ports of gone's pool", WAIT, || async {
            Ok((holding(gone_sg.clone()).await? > 1).then_some(()))
        })
        .await?;

        delete_pods(&kube.client, "gone", &["p"]).await?;
        ctrl.shutdown().await?;
        let ours = untagged("gone", format!("kuryr-rs-ns:{}:gone", bed.cluster_id)).await?;
        let namespaces: Api<Namespace> = Api::all(kube.client.clone());
        namespaces.delete("gone", &DeleteParams::default()).await?;
        eventually("namespace gone", WAIT, || async {
            Ok(namespaces.get_opt("gone").await?.is_none().then_some(()))
        })
        .await?;
        assert!(
            holding(gone_sg.clone()).await? > 0,
            "{}: the pool's spares still hold the group",
            target.name
        );

        let ctrl = start_controller(&kube.client, &target, config(&ini), "c2");
        eventually("gone's group deleted", WAIT, || async {
            Ok((!group_exists(neutron, &gone_sg).await?).then_some(()))
        })
        .await?;
        eventually("the untagged group of gone deleted", WAIT, || async {
            Ok((!group_exists(neutron, &ours).await?).then_some(()))
        })
        .await?;
        assert!(group_exists(neutron, &stays_sg).await?, "{}", target.name);
        for sg in &kept {
            assert!(
                group_exists(neutron, sg).await?,
                "{}: {sg} is not this cluster's leftover",
                target.name
            );
        }
        let port = neutron.get_port(&stays_port).await?;
        assert!(
            port.security_groups.contains(&stays_sg),
            "{}: {:?}",
            target.name,
            port.security_groups
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!("namespace-sg[{}]: a gone namespace's group swept", target.name);
    }
    Ok(())
}

/// A namespace group found by its tags could be another cluster's given the same cluster_id: it
/// is neither used nor deleted until this cluster's claim is confirmed. A release deletes the
/// group in the namespace's project only; the sweep deletes this cluster's groups of namespaces
/// that are gone, not of those that exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_groups_wait_for_the_claim_and_go_in_their_own_project() -> Result<()> {
    use kuryr_controller::context::Context;
    use kuryr_neutron::{SecurityGroupCreate, Taggable};
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.77.0.0/24").await?;
        let other = neutron_fixture(neutron, "10.78.0.0/24").await?;
        let cluster = format!("nsg-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let lookup = ["kuryr-rs.namespace=team".to_string(), tags::cluster_tag(&cluster)];
        let mut left = vec![];
        for project in [&fx.project, &other.project] {
            let sg = neutron
                .create_security_group(&SecurityGroupCreate {
                    name: "ns/team-sg".into(),
                    project_id: Some(project.clone()),
                    ..Default::default()
                })
                .await?;
            neutron
                .replace_tags(Taggable::SecurityGroup, &sg.id, &lookup)
                .await?;
            left.push(sg.id);
        }
        let platform = noauth_platform(
            &kube.client,
            &target.url,
            config(&namespace_sg_config(&fx, &cluster)),
        )?;
        let ctx = Context::build(platform.clone())?;
        let groups = ctx
            .drivers
            .namespace_groups
            .clone()
            .expect("namespace groups driver");
        let sgs = &ctx.drivers.security_groups;
        let not_ready = |r: Result<(), kuryr_controller::Error>, what: &str| match r {
            Err(kuryr_controller::Error::ResourceNotReady(_)) => {}
            other => panic!("{}: {what} before the claim: {other:?}", target.name),
        };
        not_ready(
            sgs.security_groups("default", &fx.project, "team")
                .await
                .map(|_| ()),
            "group used",
        );
        not_ready(
            sgs.release_namespace("default", &fx.project, "team").await,
            "group deleted",
        );
        assert_eq!(groups.sweep_orphans(&kube.client).await?, 0, "{}", target.name);
        for sg in &left {
            assert!(
                group_exists(neutron, sg).await?,
                "{}: {sg} touched unclaimed",
                target.name
            );
        }

        platform.deployments.set_claimed("default", true);
        let got = sgs.security_groups("default", &fx.project, "team").await?;
        assert_eq!(
            got,
            vec![fx.sg.clone(), left[0].clone()],
            "{}: adopted",
            target.name
        );
        // The namespace exists: the sweep leaves its groups alone.
        create_namespace(&kube.client, "team", json!({})).await?;
        assert_eq!(groups.sweep_orphans(&kube.client).await?, 0, "{}", target.name);
        assert!(group_exists(neutron, &left[0]).await?, "{}", target.name);
        // Released in the other project: that project's group only.
        sgs.release_namespace("default", &other.project, "team").await?;
        assert!(!group_exists(neutron, &left[1]).await?, "{}", target.name);
        assert!(
            group_exists(neutron, &left[0]).await?,
            "{}: another project's group deleted",
            target.name
        );
        // Used again (and cached) before the sweep deletes it.
        let got = sgs.security_groups("default", &fx.project, "team").await?;
        assert_eq!(got, vec![fx.sg.clone(), left[0].clone()], "{}", target.name);
        // Gone namespace, group still on a port: kept until the port goes.
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.client.clone());
        namespaces.delete("team", &DeleteParams::default()).await?;
        eventually("namespace gone", WAIT, || async {
            Ok(namespaces.get_opt("team").await?.is_none().then_some(()))
        })
        .await?;
        let port = neutron
            .create_port(&kuryr_neutron::PortCreate {
                network_id: fx.network.clone(),
                project_id: Some(fx.project.clone()),
                security_groups: Some(vec![left[0].clone()]),
                ..Default::default()
            })
            .await?;
        not_ready(
            groups.sweep_orphans(&kube.client).await.map(|_| ()),
            "group in use deleted",
        );
        assert!(group_exists(neutron, &left[0]).await?, "{}", target.name);
        neutron.delete_port(&port.id).await?;
        assert_eq!(groups.sweep_orphans(&kube.client).await?, 1, "{}", target.name);
        assert!(!group_exists(neutron, &left[0]).await?, "{}", target.name);
        // Nothing cached names the deleted group: the namespace made again gets a new one.
        create_namespace(&kube.client, "team", json!({})).await?;
        let got = sgs.security_groups("default", &fx.project, "team").await?;
        assert_eq!(got.len(), 2, "{}: {got:?}", target.name);
        assert!(!left.contains(&got[1]), "{}: {got:?}", target.name);
        assert!(group_exists(neutron, &got[1]).await?, "{}", target.name);
        cleanup_project(neutron, &fx.project).await;
        cleanup_project(neutron, &other.project).await;
        eprintln!("namespace-sg[{}]: claim, project and sweep", target.name);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_pool_routes_pods_by_their_nodes_vif_driver() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.73.0.0/24").await?;
        let vms = vm_trunks(neutron, &kube.client, &fx.project, "192.168.73.0/24").await?;
        // node 1: bare metal (no label: [kubernetes] pod_vif_driver), pooled by `neutron`;
        // node 2: a VM whose pods are nested-vlan subports, not pooled (`noop`).
        let label =
            json!({"metadata": {"labels": {kuryr_controller::pool::NODE_POD_VIF_LABEL: "nested-vlan"}}});
        Api::<Node>::all(kube.client.clone())
            .patch(NODES[1], &PatchParams::default(), &Patch::Merge(&label))
            .await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "vif_pool_mapping = neutron-vif:neutron,nested-vlan:noop\nports_pool_min = 1\nports_pool_batch = 3\n",
        )
        .await?;
        let ini = format!(
            "{}[pod_vif_nested]\nworker_nodes_subnets = {}\n",
            bed.ini
                .replace("vif_pool_driver = neutron\n", "vif_pool_driver = multi_pool\n"),
            vms.subnet
        );
        assert!(ini.contains("vif_pool_driver = multi_pool"));
        let ctrl = start_controller(&kube.client, &target, config(&ini), "c1");
        create_namespace(&kube.client, "multi", json!({})).await?;
        create_pod(&kube.client, "multi", "bare", NODES[0], json!({})).await?;
        create_pod(&kube.client, "multi", "nested", NODES[1], json!({})).await?;
        let ports = wired(&kube.client, "multi", 2).await?;

        let bare = neutron.get_port(&ports["bare"]).await?;
        assert_eq!(bare.binding_host_id, NODES[0], "{}", target.name);
        assert_eq!(bare.device_owner, "compute:kuryr");
        let pool_tags: Vec<&String> = bare
            .tags
            .iter()
            .filter(|t| t.starts_with(tags::TAG_POOL_PREFIX))
            .collect();
        assert_eq!(
            pool_tags.len(),
            1,
            "{}: bare metal port from a pool: {:?}",
            target.name,
            bare.tags
        );

        let nested = neutron.get_port(&ports["nested"]).await?;
        assert_eq!(nested.device_owner, "trunk:subport", "{}", target.name);
        assert!(
            nested.tags.iter().all(|t| !t.starts_with(tags::TAG_POOL_PREFIX)),
            "{}: nested port not pooled: {:?}",
            target.name,
            nested.tags
        );
        assert!(nested.tags.contains(&tags::pod_tag("multi", "nested")));
        let subports = neutron.get_subports(&vms.trunks[1]).await?;
        assert_eq!(
            subports.iter().map(|s| s.port_id.as_str()).collect::<Vec<_>>(),
            [nested.id.as_str()],
            "{}",
            target.name
        );
        assert!(neutron.get_subports(&vms.trunks[0]).await?.is_empty());

        // Only node 1 has a pool, holding the bare metal pod's port.
        let pools = kuryr_controller::pool::api::list_pools(&bed.socket).await?;
        assert_eq!(pools.len(), 1, "{}: {pools:?}", target.name);
        assert_eq!(
            (pools[0].host.as_str(), pools[0].pool_driver.as_str()),
            (NODES[0], "neutron")
        );
        assert_eq!(pools[0].in_use, 1);
        assert_eq!(pool_tags[0], &tags::pool_tag(&pools[0].name));

        // Release follows the route too: the nested port is deleted, the bare metal one recycled.
        delete_pods(&kube.client, "multi", &["bare", "nested"]).await?;
        eventually("nested port deleted", WAIT, || async {
            Ok(gone(neutron, &nested.id).await?.then_some(()))
        })
        .await?;
        assert!(neutron.get_subports(&vms.trunks[1]).await?.is_empty());
        let pool = eventually("bare metal port back in its pool", WAIT, || async {
            let p = kuryr_controller::pool::api::show_pool(&bed.socket, &pools[0].name).await?;
            Ok((p.in_use == 0).then_some(p))
        })
        .await?;
        assert!(
            pool.ports.iter().any(|p| p.port_id == bare.id),
            "{}: {:?}",
            target.name,
            pool.ports
        );
        assert!(!gone(neutron, &bare.id).await?);

        // Node 2 made bare metal (its label removed): its next pod takes the bare metal route.
        let unlabel = json!({"metadata": {"labels": {kuryr_controller::pool::NODE_POD_VIF_LABEL: null}}});
        Api::<Node>::all(kube.client.clone())
            .patch(NODES[1], &PatchParams::default(), &Patch::Merge(&unlabel))
            .await?;
        let relabelled = eventually("a pod on the relabelled node wired bare metal", WAIT, || async {
            let name = format!("after-{}", uuid::Uuid::new_v4().simple());
            create_pod(&kube.client, "multi", &name, NODES[1], json!({})).await?;
            let ports = wired(&kube.client, "multi", 1).await?;
            let port = neutron.get_port(&ports[&name]).await?;
            delete_pods(&kube.client, "multi", &[name.as_str()]).await?;
            // A nested subport is bound to its VM's host too (the node): the route is told by
            // the owner; pods made before the controller saw the label go nested.
            Ok((port.device_owner == "compute:kuryr").then_some(port))
        })
        .await?;
        assert_eq!(relabelled.binding_host_id, NODES[1], "{}", target.name);
        ctrl.stop.cancel();
        tokio::time::sleep(Duration::from_millis(500)).await;
        cleanup_project(neutron, &fx.project).await;
        let _ = std::fs::remove_file(&bed.socket);
        eprintln!(
            "multi_pool[{}]: routed per node, also after a relabel",
            target.name
        );
    }
    Ok(())
}
