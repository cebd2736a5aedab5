//! The orphan sweep on nested ports: a kuryr-rs subport owned by nothing has no device id
//! (Neutron refuses one on subports), so the sweep must find its trunk from the trunks' subport
//! lists, detach it and delete it - after two passes, and never touching an owned subport. A
//! nested-macvlan orphan's address pair leaves the VM port with it. Nothing is swept where the
//! cluster_id is not claimed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::Result;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kuryr_controller::drivers::vif::VifDriver;
use kuryr_controller::drivers::vif::nested::VmPortLookup;
use kuryr_controller::drivers::vif::nested_macvlan::NestedMacvlan;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pool::sweep::{Suspects, sweep};
use kuryr_crds::names::device_owner::{COMPUTE_KURYR, TRUNK_SUBPORT};
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::{AllowedAddressPair, PortCreate, PortUpdate, SubPort, TrunkCreate};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_detaches_and_deletes_unowned_subports() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.65.0.0/24").await?;
        let cluster_tag = tags::cluster_tag(&format!("sweep-{}", uuid::Uuid::new_v4().simple()));
        let parent = neutron
            .create_port(&PortCreate {
                project_id: Some(fx.project.clone()),
                ..PortCreate::new(&fx.network)
            })
            .await?;
        let trunk = neutron
            .create_trunk(&TrunkCreate {
                port_id: parent.id.clone(),
                project_id: Some(fx.project.clone()),
                ..TrunkCreate::default()
            })
            .await?;
        let sub = || PortCreate {
            project_id: Some(fx.project.clone()),
            device_owner: Some(TRUNK_SUBPORT.into()),
            ..PortCreate::new(&fx.network)
        };
        let ports = neutron.create_ports(&[sub(), sub()]).await?;
        for p in &ports {
            neutron
                .replace_tags(
                    kuryr_neutron::Taggable::Port,
                    &p.id,
                    &[tags::TAG_MANAGED, cluster_tag.as_str()],
                )
                .await?;
        }
        let (orphan, owned) = (ports[0].id.clone(), ports[1].id.clone());
        neutron
            .add_subports(
                &trunk.id,
                &[SubPort::vlan(&orphan, 101), SubPort::vlan(&owned, 102)],
            )
            .await?;
        // What made the old sweep skip the trunk: nothing on the port names it.
        let before = neutron.get_port(&orphan).await?;
        eprintln!(
            "pool_sweep[{}]: subport device_id {:?}",
            target.name, before.device_id
        );

        let deployments = Deployments::single(neutron.clone());
        let owned_set: HashSet<String> = HashSet::from([owned.clone()]);
        let now = Timestamp::now() + SignedDuration::from_secs(60);
        // Until the cluster_id is claimed as this cluster's, nothing carrying its tag is swept.
        let mut suspects = Suspects::default();
        for _ in 0..2 {
            let unclaimed = sweep(&deployments, &[], &cluster_tag, &owned_set, now, &mut suspects).await?;
            assert!(unclaimed.is_empty(), "{}: swept unclaimed", target.name);
        }
        deployments.set_claimed("default", true);
        let mut suspects = Suspects::default();
        // Ports created after the grace's start are not questioned, however often seen.
        let long_ago: Timestamp = "2020-01-01T00:00:00Z".parse()?;
        for _ in 0..2 {
            let young = sweep(
                &deployments,
                &[],
                &cluster_tag,
                &owned_set,
                long_ago,
                &mut suspects,
            )
            .await?;
            assert!(young.is_empty(), "{}: a young port is kept", target.name);
        }
        let mut suspects = Suspects::default();
        let first = sweep(&deployments, &[], &cluster_tag, &owned_set, now, &mut suspects).await?;
        assert!(
            first.is_empty(),
            "{}: first sighting deletes nothing",
            target.name
        );
        let second = sweep(&deployments, &[], &cluster_tag, &owned_set, now, &mut suspects).await?;
        assert_eq!(second, vec![orphan.clone()], "{}", target.name);
        assert!(neutron.get_port(&orphan).await.is_err_and(|e| e.is_not_found()));
        let left: Vec<String> = neutron
            .get_subports(&trunk.id)
            .await?
            .into_iter()
            .map(|s| s.port_id)
            .collect();
        assert_eq!(
            left,
            vec![owned.clone()],
            "{}: the owned subport stays",
            target.name
        );

        neutron.remove_subports(&trunk.id, &[owned.as_str()]).await?;
        neutron.delete_trunk(&trunk.id).await?;
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_takes_a_macvlan_orphan_s_address_pair_off_its_vm_port() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.66.0.0/24").await?;
        let workers = neutron_fixture(neutron, "192.168.66.0/24").await?;
        let cluster_tag = tags::cluster_tag(&format!("sweep-{}", uuid::Uuid::new_v4().simple()));
        let pod_port = || PortCreate {
            project_id: Some(fx.project.clone()),
            device_owner: Some(COMPUTE_KURYR.into()),
            tags: vec![tags::TAG_MANAGED.into(), cluster_tag.clone()],
            ..PortCreate::new(&fx.network)
        };
        let ports = neutron.create_ports(&[pod_port(), pod_port()]).await?;
        let pair = |p: &kuryr_neutron::Port| AllowedAddressPair {
            ip_address: p.fixed_ips[0].ip_address.clone(),
            mac_address: Some(p.mac_address.clone()),
        };
        let vm = neutron
            .create_port(&PortCreate {
                project_id: Some(workers.project.clone()),
                device_id: Some("vm-1".into()),
                device_owner: Some("compute:nova".into()),
                ..PortCreate::new(&workers.network)
            })
            .await?;
        // An operator's own pair (a keepalived address on the VM) is not kuryr's to take.
        let operators = AllowedAddressPair {
            ip_address: "10.66.0.250".into(),
            mac_address: Some(vm.mac_address.clone()),
        };
        let all = vec![pair(&ports[0]), pair(&ports[1]), operators.clone()];
        neutron
            .update_port(
                &vm.id,
                &PortUpdate {
                    allowed_address_pairs: Some(all),
                    ..Default::default()
                },
            )
            .await?;

        let deployments = Deployments::single(neutron.clone());
        deployments.set_claimed("default", true);
        let macvlan: Arc<dyn VifDriver> = Arc::new(NestedMacvlan::new(
            deployments.clone(),
            VmPortLookup::new(kube.client.clone(), vec![workers.subnet.clone()]),
            vec![],
            1500,
            3,
        ));
        let owned: HashSet<String> = HashSet::from([ports[1].id.clone()]);
        let now = Timestamp::now() + SignedDuration::from_secs(60);
        let mut suspects = Suspects::default();
        let vifs = [macvlan];
        for _ in 0..2 {
            sweep(&deployments, &vifs, &cluster_tag, &owned, now, &mut suspects).await?;
        }
        assert!(
            neutron
                .get_port(&ports[0].id)
                .await
                .is_err_and(|e| e.is_not_found())
        );
        let key = |p: &AllowedAddressPair| (p.ip_address.clone(), p.mac_address.clone());
        let left: std::collections::BTreeSet<_> = neutron
            .get_port(&vm.id)
            .await?
            .allowed_address_pairs
            .iter()
            .map(key)
            .collect();
        assert_eq!(
            left,
            [key(&pair(&ports[1])), key(&operators)].into_iter().collect(),
            "{}: the orphan's pair goes, the owned port's and the operator's stay",
            target.name
        );
        cleanup_project(neutron, &fx.project).await;
        cleanup_project(neutron, &workers.project).await;
    }
    Ok(())
}

/// The sweep's "owned by a pod" is every port the KuryrPorts record, read a page at a time: a
/// list that outlasts the API server's history (410 on its continue token) is read again from
/// the start, as a port it missed would be swept from under its pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_ports_survive_a_kuryrport_list_outlasting_the_server_history() -> Result<()> {
    use kube::api::{Api, ApiResource, DynamicObject, PostParams};
    use kube::core::GroupVersionKind;
    use kuryr_controller::pool::persist::Persister;
    init_logs();
    let kube = start_kube().await?;
    // More than one page (500) of KuryrPorts.
    const N: usize = 620;
    let gvk = GroupVersionKind::gvk("openstack.org", "v1", "KuryrPort");
    let api: Api<DynamicObject> =
        Api::namespaced_with(kube.client.clone(), "default", &ApiResource::from_gvk(&gvk));
    let mut expected = HashSet::new();
    for i in 0..N {
        let kp: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "openstack.org/v1", "kind": "KuryrPort",
            "metadata": {"name": format!("pod-{i:04}")},
            "spec": {"podUid": format!("uid-{i}"), "podNodeName": NODES[0]},
            "status": {"vifs": {"eth0": {"default": true, "vif": {
                "versioned_object.name": "VIFOpenVSwitch",
                "versioned_object.data": {"id": format!("port-{i}")}
            }}}}
        }))?;
        api.create(&PostParams::default(), &kp).await?;
        expected.insert(format!("port-{i}"));
    }
    let persister = Persister::new(kube.client.clone(), "kuryr-system");
    kube.handle.compact_before_continued_lists(1);
    let owned = persister.ports_in_use().await?;
    assert_eq!(owned.len(), N, "every recorded port, read again after the 410");
    assert_eq!(owned, expected);
    // A server that compacts under every continued page fails the read (bounded), rather than
    // handing the sweep a partial set.
    kube.handle.compact_before_continued_lists(100);
    let err = persister.ports_in_use().await.expect_err("no list gets through");
    assert!(err.to_string().contains("continue parameter is too old"), "{err}");
    Ok(())
}
