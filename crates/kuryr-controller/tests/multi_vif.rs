//! Multi-VIF end to end: multi-VIF drivers driven through the controller against the
//! Kubernetes API emulator and a Neutron (the emulator, and the real neutron-server when
//! KURYR_TEST_NEUTRON_URL is set).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kuryr_crds::{KuryrPort, NetworkAttachmentDefinition, Vif};
use kuryr_neutron::{ListFilter, NeutronClient, Port};
use serde_json::{Value, json};
use support::*;

const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "demo";

fn multi_config(fx: &NeutronFixture, sriov_subnet: Option<&str>) -> String {
    let sriov = sriov_subnet
        .map(|s| format!("[sriov]\ndefault_physnet_subnets = physnet2:{s}\n"))
        .unwrap_or_default();
    format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
         multi_vif_drivers = additional_subnets, npwg_multiple_interfaces, sriov, specific_ports\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\nresource_tags = k8s,test\n{sriov}",
        fx.project, fx.subnet, fx.sg
    )
}

/// A second network with one subnet in the fixture's project.
async fn extra_subnet(neutron: &NeutronClient, project: &str, name: &str, cidr: &str) -> Result<String> {
    let net = neutron
        .create_network(&kuryr_neutron::NetworkCreate {
            name: Some(name.into()),
            project_id: Some(project.into()),
            ..Default::default()
        })
        .await?;
    let subnet = neutron
        .create_subnet(&kuryr_neutron::SubnetCreate {
            network_id: net.id,
            ip_version: 4,
            cidr: Some(cidr.into()),
            project_id: Some(project.into()),
            name: Some(name.into()),
            ..Default::default()
        })
        .await?;
    Ok(subnet.id)
}

/// A VLAN provider network on `physnet` (admin-created, VLAN allocated by Neutron) with one subnet in
/// the fixture's project: what an operator gives SR-IOV VFs. Returns (network, subnet).
async fn physnet_subnet(
    neutron: &NeutronClient,
    project: &str,
    physnet: &str,
    cidr: &str,
) -> Result<(kuryr_neutron::Network, String)> {
    let net = neutron
        .create_network(&kuryr_neutron::NetworkCreate {
            name: Some(format!("{physnet}-vfs")),
            project_id: Some(project.into()),
            provider_network_type: Some("vlan".into()),
            provider_physical_network: Some(physnet.into()),
            ..Default::default()
        })
        .await?;
    let subnet = neutron
        .create_subnet(&kuryr_neutron::SubnetCreate {
            network_id: net.id.clone(),
            ip_version: 4,
            cidr: Some(cidr.into()),
            project_id: Some(project.into()),
            name: Some(format!("{physnet}-vfs")),
            ..Default::default()
        })
        .await?;
    Ok((net, subnet.id))
}

/// A pod in [`NS`] on the first node.
async fn create_pod_with(
    kube: &kube::Client,
    name: &str,
    annotations: Value,
    resources: Value,
) -> Result<Pod> {
    support::create_pod_with(kube, NS, name, NODES[0], annotations, resources).await
}

async fn create_nad(kube: &kube::Client, ns: &str, name: &str, kuryr_config: Option<Value>) -> Result<()> {
    let mut annotations = json!({});
    if let Some(c) = kuryr_config {
        annotations["openstack.org/kuryr-config"] = json!(c.to_string());
    }
    let nad: NetworkAttachmentDefinition = serde_json::from_value(json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"config": "{\"cniVersion\":\"0.3.1\",\"name\":\"kuryr\",\"type\":\"kuryr-cni\"}"}
    }))?;
    Api::<NetworkAttachmentDefinition>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &nad)
        .await?;
    Ok(())
}

/// A user's port, named `precreated`, on a second network of the fixture's project (`cidr`): what a
/// pod's `spec-ports` annotation names.
async fn precreated_port(neutron: &NeutronClient, fx: &NeutronFixture, cidr: &str) -> Result<Port> {
    let sub = extra_subnet(neutron, &fx.project, "spec", cidr).await?;
    let net = neutron.get_subnet(&sub).await?.network_id;
    let mut req = kuryr_neutron::PortCreate::new(net);
    req.name = Some("precreated".into());
    req.project_id = Some(fx.project.clone());
    Ok(neutron.create_port(&req).await?)
}

/// The pod's KuryrPort once it has `n` VIFs, all active.
async fn wired(kube: &kube::Client, pod: &str, n: usize) -> Result<KuryrPort> {
    wired_kp(kube, NS, pod, n).await
}

fn vif<'a>(kp: &'a KuryrPort, ifname: &str) -> &'a Vif {
    &kp.status.as_ref().unwrap().vifs[ifname].vif
}

async fn delete_pod_and_wait(kube: &kube::Client, name: &str) -> Result<()> {
    let pods = Api::<Pod>::namespaced(kube.clone(), NS);
    pods.delete(name, &DeleteParams::default()).await?;
    eventually(&format!("{name} gone"), WAIT, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

async fn kuryr_ports(neutron: &NeutronClient, project: &str) -> Result<Vec<Port>> {
    Ok(neutron
        .list_ports(
            &ListFilter::new()
                .project_id(project)
                .device_owner("compute:kuryr"),
        )
        .await?)
}

async fn event_for(kube: &kube::Client, pod: &str) -> Result<Event> {
    let api = Api::<Event>::namespaced(kube.clone(), NS);
    eventually(&format!("InvalidInput event on {pod}"), WAIT, || async {
        let evs = api.list(&ListParams::default()).await?.items;
        Ok(evs.into_iter().find(|e| {
            e.reason.as_deref() == Some("InvalidInput")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod)
        }))
    })
    .await
}

fn subnet_of(port: &Port) -> &str {
    &port.fixed_ips[0].subnet_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn additional_subnets_give_eth1_eth2_and_leave_no_port() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.20.0.0/24").await?;
        let a = extra_subnet(neutron, &fx.project, "extra-a", "10.21.0.0/24").await?;
        let b = extra_subnet(neutron, &fx.project, "extra-b", "10.22.0.0/24").await?;
        let ctrl = start_controller(&kube.client, &target, config(&multi_config(&fx, None)), "c1");
        create_namespace(&kube.client, NS, json!({})).await?;
        let pod = create_pod_with(
            &kube.client,
            "multi",
            json!({"openstack.org/kuryr-additional-subnets": json!([a, b]).to_string()}),
            json!({}),
        )
        .await?;
        let kp = wired(&kube.client, "multi", 3).await?;
        let status = kp.status.as_ref().unwrap();
        assert_eq!(
            status.vifs.keys().collect::<Vec<_>>(),
            ["eth0", "eth1", "eth2"],
            "{}",
            target.name
        );
        assert!(status.vifs["eth0"].default && !status.vifs["eth1"].default);
        for (ifname, subnet, cidr) in [
            ("eth0", &fx.subnet, "10.20.0.0/24"),
            ("eth1", &a, "10.21.0.0/24"),
            ("eth2", &b, "10.22.0.0/24"),
        ] {
            let v = vif(&kp, ifname);
            let port = neutron.get_port(v.id()).await?;
            assert_eq!(subnet_of(&port), subnet, "{}: {ifname} subnet", target.name);
            assert_eq!(port.device_id, pod.uid().unwrap(), "{}: {ifname}", target.name);
            assert_eq!(port.status, "ACTIVE", "{}: {ifname}", target.name);
            assert_eq!(port.security_groups, vec![fx.sg.clone()]);
            let (s, ip) = v.fixed_ips().next().unwrap();
            assert_eq!(s.cidr, cidr, "{}: {ifname} os-vif subnet", target.name);
            assert_eq!(ip.to_string(), port.fixed_ips[0].ip_address);
        }
        assert_eq!(kuryr_ports(neutron, &fx.project).await?.len(), 3);
        // network-status lists every interface, eth0 first and default.
        let pods = Api::<Pod>::namespaced(kube.client.clone(), NS);
        let annotated = eventually("network-status", WAIT, || async {
            let p = pods.get("multi").await?;
            Ok(p.annotations().get("k8s.v1.cni.cncf.io/network-status").cloned())
        })
        .await?;
        let ns: Vec<Value> = serde_json::from_str(&annotated)?;
        assert_eq!(ns.len(), 3);
        assert_eq!(ns[0]["interface"], "eth0");
        assert_eq!(ns[0]["default"], true);
        assert_eq!(ns[2]["name"], format!("subnet:{b}"));

        delete_pod_and_wait(&kube.client, "multi").await?;
        assert!(
            kuryr_ports(neutron, &fx.project).await?.is_empty(),
            "{}: ports left behind",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!(
            "multi_vif[{}]: eth0/eth1/eth2 on three subnets, released",
            target.name
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn npwg_networks_get_their_interface_and_network_status() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.30.0.0/24").await?;
        let data = extra_subnet(neutron, &fx.project, "data", "10.31.0.0/24").await?;
        let ctrl = start_controller(&kube.client, &target, config(&multi_config(&fx, None)), "c1");
        create_namespace(&kube.client, NS, json!({})).await?;
        create_namespace(&kube.client, "shared", json!({})).await?;
        create_nad(&kube.client, NS, "data", Some(json!({"subnetId": data}))).await?;
        create_nad(
            &kube.client,
            "shared",
            "data2",
            Some(json!({"subnetId": data, "driverType": "neutron"})),
        )
        .await?;
        // JSON form with interface, ips and mac.
        create_pod_with(
            &kube.client,
            "json-form",
            json!({"k8s.v1.cni.cncf.io/networks":
                json!([{"name": "data", "interface": "net1", "ips": ["10.31.0.77/24"], "mac": "fa:16:3e:aa:bb:cc"}]).to_string()}),
            json!({}),
        )
        .await?;
        // Text form, across namespaces, with and without an interface name.
        create_pod_with(
            &kube.client,
            "text-form",
            json!({"k8s.v1.cni.cncf.io/networks": "shared/data2@data0, data"}),
            json!({}),
        )
        .await?;
        let kp = wired(&kube.client, "json-form", 2).await?;
        let port = neutron.get_port(vif(&kp, "net1").id()).await?;
        assert_eq!(port.fixed_ips[0].ip_address, "10.31.0.77", "{}", target.name);
        assert_eq!(port.mac_address, "fa:16:3e:aa:bb:cc", "{}", target.name);
        assert_eq!(subnet_of(&port), data);
        let pods = Api::<Pod>::namespaced(kube.client.clone(), NS);
        let raw = eventually("network-status", WAIT, || async {
            let p = pods.get("json-form").await?;
            Ok(p.annotations().get("k8s.v1.cni.cncf.io/network-status").cloned())
        })
        .await?;
        let status: Vec<Value> = serde_json::from_str(&raw)?;
        let eth0 = neutron.get_port(vif(&kp, "eth0").id()).await?;
        assert_eq!(
            status,
            vec![
                json!({"name": "kuryr", "interface": "eth0", "ips": [eth0.fixed_ips[0].ip_address],
                       "mac": eth0.mac_address, "default": true, "dns": {}}),
                json!({"name": "demo/data", "interface": "net1", "ips": ["10.31.0.77"],
                       "mac": "fa:16:3e:aa:bb:cc", "default": false, "dns": {}}),
            ],
            "{}",
            target.name
        );
        let kp = wired(&kube.client, "text-form", 3).await?;
        let names: Vec<&String> = kp.status.as_ref().unwrap().vifs.keys().collect();
        assert_eq!(names, ["data0", "eth0", "eth1"], "{}", target.name);
        for ifname in ["data0", "eth1"] {
            assert_eq!(subnet_of(&neutron.get_port(vif(&kp, ifname).id()).await?), data);
        }
        for p in ["json-form", "text-form"] {
            delete_pod_and_wait(&kube.client, p).await?;
        }
        assert!(
            kuryr_ports(neutron, &fx.project).await?.is_empty(),
            "{}",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!("multi_vif[{}]: NAD interfaces and network-status", target.name);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn specific_port_is_used_restored_and_used_again() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.40.0.0/24").await?;
        let before = precreated_port(neutron, &fx, "10.41.0.0/24").await?;
        let ctrl = start_controller(&kube.client, &target, config(&multi_config(&fx, None)), "c1");
        create_namespace(&kube.client, NS, json!({})).await?;
        for round in ["first", "second"] {
            let pod = create_pod_with(
                &kube.client,
                round,
                json!({"spec-ports": json!([before.id]).to_string()}),
                json!({}),
            )
            .await?;
            let kp = wired(&kube.client, round, 2).await?;
            assert_eq!(vif(&kp, "eth1").id(), before.id, "{}: {round}", target.name);
            let used = neutron.get_port(&before.id).await?;
            assert_eq!(used.device_id, pod.uid().unwrap(), "{}: {round}", target.name);
            assert_eq!(used.device_owner, "compute:kuryr");
            assert_eq!(used.binding_host_id, NODES[0]);
            assert_eq!(used.name, before.name, "the user's name is kept");
            delete_pod_and_wait(&kube.client, round).await?;
            let after = neutron.get_port(&before.id).await?;
            assert_eq!(
                (
                    &after.name,
                    &after.device_id,
                    &after.device_owner,
                    &after.binding_host_id,
                    &after.mac_address,
                    &after.fixed_ips
                ),
                (
                    &before.name,
                    &before.device_id,
                    &before.device_owner,
                    &before.binding_host_id,
                    &before.mac_address,
                    &before.fixed_ips
                ),
                "{}: {round}: port restored",
                target.name
            );
        }
        assert!(
            kuryr_ports(neutron, &fx.project).await?.is_empty(),
            "{}",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!("multi_vif[{}]: spec-port used twice and restored", target.name);
    }
    Ok(())
}

/// A crash between claiming a specific port and recording it in the KuryrPort leaves the port
/// claimed by the pod. The restarted controller resumes the claim (the port is not "in use" by
/// someone else) and release restores the port as it was before the first claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_interrupted_specific_port_claim_is_resumed_and_restored() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.42.0.0/24").await?;
        let before = precreated_port(neutron, &fx, "10.43.0.0/24").await?;
        create_namespace(&kube.client, NS, json!({})).await?;
        let pod = create_pod_with(
            &kube.client,
            "resumed",
            json!({"spec-ports": json!([before.id]).to_string()}),
            json!({}),
        )
        .await?;
        // What the crashed controller had done: the claim, and nothing recorded yet.
        let claim = kuryr_neutron::PortUpdate {
            device_id: pod.uid(),
            device_owner: Some("compute:kuryr".into()),
            binding_host_id: Some(NODES[0].into()),
            ..Default::default()
        };
        neutron.update_port(&before.id, &claim).await?;
        let ctrl = start_controller(&kube.client, &target, config(&multi_config(&fx, None)), "c1");
        let kp = wired(&kube.client, "resumed", 2).await?;
        assert_eq!(vif(&kp, "eth1").id(), before.id, "{}", target.name);
        delete_pod_and_wait(&kube.client, "resumed").await?;
        let after = neutron.get_port(&before.id).await?;
        assert_eq!(
            (
                &after.name,
                &after.device_id,
                &after.device_owner,
                &after.binding_host_id
            ),
            (
                &before.name,
                &before.device_id,
                &before.device_owner,
                &before.binding_host_id
            ),
            "{}: restored as before the claim",
            target.name
        );
        // Another pod's claim is still refused.
        let mut other = claim.clone();
        other.device_id = Some("someone-else".into());
        neutron.update_port(&before.id, &other).await?;
        create_pod_with(
            &kube.client,
            "refused",
            json!({"spec-ports": json!([before.id]).to_string()}),
            json!({}),
        )
        .await?;
        let ev = event_for(&kube.client, "refused").await?;
        assert!(
            ev.note.as_deref().unwrap_or_default().contains("in use"),
            "{}: {ev:?}",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
        eprintln!("multi_vif[{}]: interrupted spec-port claim resumed", target.name);
    }
    Ok(())
}

/// A crash between claiming a specific port and recording it, and the pod deleted before any
/// controller wired it again: kuryr never tags a user's port, so only the pod's annotation finds
/// it. Its KuryrPort's finalizer puts it back unclaimed, so the next pod naming it gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_specific_port_claimed_but_never_recorded_is_put_back_with_its_pod() -> Result<()> {
    use kuryr_crds::names::finalizers;
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.44.0.0/24").await?;
        let before = precreated_port(neutron, &fx, "10.45.0.0/24").await?;
        create_namespace(&kube.client, NS, json!({})).await?;
        let annotations = json!({"spec-ports": json!([before.id]).to_string()});
        let pod = create_pod_with(&kube.client, "lost", annotations.clone(), json!({})).await?;
        // What the crashed controller had done: the pod's finalizer, its KuryrPort with nothing
        // recorded, the claim.
        let pods = Api::<Pod>::namespaced(kube.client.clone(), NS);
        pods.patch(
            "lost",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"metadata": {"finalizers": [finalizers::POD]}})),
        )
        .await?;
        let kp: KuryrPort = serde_json::from_value(json!({
            "apiVersion": "openstack.org/v1", "kind": "KuryrPort",
            "metadata": {"name": "lost", "namespace": NS, "finalizers": [finalizers::KURYRPORT]},
            "spec": {"podUid": pod.uid(), "podNodeName": NODES[0]}
        }))?;
        Api::<KuryrPort>::namespaced(kube.client.clone(), NS)
            .create(&PostParams::default(), &kp)
            .await?;
        neutron
            .update_port(
                &before.id,
                &kuryr_neutron::PortUpdate {
                    device_id: pod.uid(),
                    device_owner: Some("compute:kuryr".into()),
                    binding_host_id: Some(NODES[0].into()),
                    ..Default::default()
                },
            )
            .await?;
        pods.delete("lost", &DeleteParams::default()).await?;
        let ctrl = start_controller(&kube.client, &target, config(&multi_config(&fx, None)), "c1");
        eventually("the pod gone", WAIT, || async {
            Ok(pods.get_opt("lost").await?.is_none().then_some(()))
        })
        .await?;
        let after = neutron.get_port(&before.id).await?;
        assert_eq!(
            (&after.name, &after.device_id, &after.device_owner),
            (&before.name, &before.device_id, &before.device_owner),
            "{}: put back unclaimed",
            target.name
        );
        // The next pod naming it gets it.
        create_pod_with(&kube.client, "next", annotations, json!({})).await?;
        let kp = wired(&kube.client, "next", 2).await?;
        assert_eq!(vif(&kp, "eth1").id(), before.id, "{}", target.name);
        delete_pod_and_wait(&kube.client, "next").await?;
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sriov_request_gets_direct_ports_on_the_physnet() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.50.0.0/24").await?;
        let (vf_net, vf_subnet) = physnet_subnet(neutron, &fx.project, "physnet2", "10.51.0.0/24").await?;
        assert_eq!(
            (
                vf_net.provider_network_type.as_deref(),
                vf_net.provider_physical_network.as_deref()
            ),
            (Some("vlan"), Some("physnet2")),
            "{}: {vf_net:?}",
            target.name
        );
        let vlan = vf_net
            .provider_segmentation_id
            .expect("VLAN allocated")
            .to_string();
        let cfg = multi_config(&fx, Some(&vf_subnet));
        let ctrl = start_controller(&kube.client, &target, config(&cfg), "c1");
        create_namespace(&kube.client, NS, json!({})).await?;
        create_pod_with(
            &kube.client,
            "vf",
            json!({}),
            json!({"requests": {"pod.alpha.kubernetes.io/opaque-int-resource-sriov-vf-physnet2": "1"},
                   "limits": {"intel.com/physnet2": "1"}}),
        )
        .await?;
        let kp = wired(&kube.client, "vf", 3).await?;
        for ifname in ["eth1", "eth2"] {
            let Vif::Sriov(v) = vif(&kp, ifname) else {
                panic!("{}: {ifname} is not a VIFSriov", target.name)
            };
            assert_eq!(v.physnet.as_deref(), Some("physnet2"));
            assert_eq!(v.pod_name.as_deref(), Some("vf"));
            // Bound by ML2's sriovnicswitch driver (the node's NIC Switch agent maps physnet2)
            // and wired by that agent: ACTIVE, on both targets.
            let port = eventually(&format!("{ifname} direct port ACTIVE"), WAIT, || async {
                let p = neutron.get_port(&v.base.id).await?;
                Ok((p.status == "ACTIVE").then_some(p))
            })
            .await
            .map_err(|e| anyhow::anyhow!("{}: {e:#}", target.name))?;
            assert_eq!(port.binding_vnic_type, "direct", "{}", target.name);
            assert_eq!(port.binding_vif_type, "hw_veb", "{}: {port:?}", target.name);
            assert_eq!(port.binding_host_id, NODES[0], "{}", target.name);
            assert_eq!(
                port.binding_profile.get("physical_network"),
                Some(&json!("physnet2")),
                "{}",
                target.name
            );
            assert_eq!(
                port.binding_vif_details.get("vlan"),
                Some(&json!(vlan)),
                "{}: {:?}",
                target.name,
                port.binding_vif_details
            );
            assert_eq!(port.network_id, vf_net.id);
            assert_eq!(subnet_of(&port), vf_subnet);
            eprintln!(
                "multi_vif[{}]: {ifname} direct port vif_type={} status={}",
                target.name, port.binding_vif_type, port.status
            );
        }
        delete_pod_and_wait(&kube.client, "vf").await?;
        assert!(
            kuryr_ports(neutron, &fx.project).await?.is_empty(),
            "{}",
            target.name
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_produces_events_and_leaks_nothing() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.60.0.0/24").await?;
        let data = extra_subnet(neutron, &fx.project, "data", "10.61.0.0/24").await?;
        let net = neutron.get_subnet(&data).await?.network_id;
        // A port somebody else uses, with a known address.
        let mut req = kuryr_neutron::PortCreate::new(net);
        req.project_id = Some(fx.project.clone());
        req.device_owner = Some("compute:nova".into());
        req.device_id = Some("vm-1".into());
        req.fixed_ips = Some(vec![kuryr_neutron::FixedIpRequest::address(
            data.clone(),
            "10.61.0.50",
        )]);
        let busy = neutron.create_port(&req).await?;
        let ctrl = start_controller(&kube.client, &target, config(&multi_config(&fx, None)), "c1");
        create_namespace(&kube.client, NS, json!({})).await?;
        create_nad(&kube.client, NS, "data", Some(json!({"subnetId": data}))).await?;
        create_nad(&kube.client, NS, "plain", None).await?;
        let missing = "0b9a3c43-4f5d-4c55-9d6e-5c1c1c1c1c1c";
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "unknown-subnet",
                json!({"openstack.org/kuryr-additional-subnets": json!([missing]).to_string()}),
                missing,
            ),
            (
                "bad-json",
                json!({"k8s.v1.cni.cncf.io/networks": "[{\"name\": \"data\""}),
                "malformed JSON",
            ),
            (
                "no-kuryr-config",
                json!({"k8s.v1.cni.cncf.io/networks": "plain"}),
                "openstack.org/kuryr-config",
            ),
            (
                "port-in-use",
                json!({"spec-ports": json!([busy.id]).to_string()}),
                "is in use",
            ),
            (
                "unsupported-field",
                json!({"k8s.v1.cni.cncf.io/networks": json!([{"name": "data", "bandwidth": {}}]).to_string()}),
                "bandwidth",
            ),
            // Valid at planning time, refused by Neutron: eth0 and eth1 (additional subnet) were
            // made by then and must be given back.
            (
                "address-taken",
                json!({"openstack.org/kuryr-additional-subnets": json!([data]).to_string(), "k8s.v1.cni.cncf.io/networks": json!([{"name": "data", "ips": ["10.61.0.50"]}]).to_string()}),
                "ips/mac of network demo/data",
            ),
        ];
        for (name, annotations, _) in &cases {
            create_pod_with(&kube.client, name, annotations.clone(), json!({})).await?;
        }
        for (name, _, needle) in &cases {
            let ev = event_for(&kube.client, name).await?;
            let msg = ev.note.unwrap_or_default();
            assert!(
                msg.contains(needle),
                "{}: {name}: event {msg:?} lacks {needle:?}",
                target.name
            );
            assert_eq!(ev.type_.as_deref(), Some("Warning"));
            eprintln!("multi_vif[{}]: {name}: {msg}", target.name);
        }
        assert!(
            kuryr_ports(neutron, &fx.project).await?.is_empty(),
            "{}: a bad pod left a port",
            target.name
        );
        let kps = Api::<KuryrPort>::namespaced(kube.client.clone(), NS)
            .list(&ListParams::default())
            .await?;
        assert!(
            kps.items
                .iter()
                .all(|kp| kp.status.as_ref().is_none_or(|s| s.vifs.is_empty())),
            "{}: a bad pod got VIFs recorded",
            target.name
        );
        let still = neutron.get_port(&busy.id).await?;
        assert_eq!(
            (still.device_owner.as_str(), still.device_id.as_str()),
            ("compute:nova", "vm-1")
        );
        ctrl.stop.cancel();
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// NADs as upstream documents them: no `spec`, and no `subnetId`. The subnet is
/// `[neutron_defaults] subnet_mapping` of the `driverType`, else the pod subnet.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nad_without_spec_or_subnet_id_takes_the_configured_subnet() -> Result<()> {
    use kube::api::{ApiResource, DynamicObject};
    init_logs();
    let target = neutron_targets().await?.remove(0);
    let kube = start_kube().await?;
    let neutron = &target.client;
    let fx = neutron_fixture(neutron, "10.32.0.0/24").await?;
    let data = extra_subnet(neutron, &fx.project, "data", "10.33.0.0/24").await?;
    let ini = multi_config(&fx, None).replace(
        "resource_tags = k8s,test\n",
        &format!("resource_tags = k8s,test\nsubnet_mapping = neutron:{data}\n"),
    );
    let ctrl = start_controller(&kube.client, &target, config(&ini), "c1");
    create_namespace(&kube.client, NS, json!({})).await?;
    let nads = Api::<DynamicObject>::namespaced_with(
        kube.client.clone(),
        NS,
        &ApiResource::erase::<NetworkAttachmentDefinition>(&()),
    );
    for (name, kuryr_config) in [("mapped", json!({"driverType": "neutron"})), ("plain", json!({}))] {
        let nad: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": NS,
                         "annotations": {"openstack.org/kuryr-config": kuryr_config.to_string()}}
        }))?;
        nads.create(&PostParams::default(), &nad).await?;
    }
    create_pod_with(
        &kube.client,
        "bare-nads",
        json!({"k8s.v1.cni.cncf.io/networks": "mapped@net1, plain@net2"}),
        json!({}),
    )
    .await?;
    let kp = wired(&kube.client, "bare-nads", 3).await?;
    assert_eq!(subnet_of(&neutron.get_port(vif(&kp, "net1").id()).await?), data);
    assert_eq!(
        subnet_of(&neutron.get_port(vif(&kp, "net2").id()).await?),
        fx.subnet
    );
    delete_pod_and_wait(&kube.client, "bare-nads").await?;
    ctrl.shutdown().await?;
    Ok(())
}

/// `[kubernetes] use_events = False`, as upstream: a pod's malformed annotation is still refused
/// (its port is not made), but no Event is posted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn use_events_false_posts_no_event() -> Result<()> {
    init_logs();
    let target = neutron_targets().await?.remove(0);
    let kube = start_kube().await?;
    let fx = neutron_fixture(&target.client, "10.34.0.0/24").await?;
    let ini = multi_config(&fx, None).replace("[kubernetes]\n", "[kubernetes]\nuse_events = False\n");
    let ctrl = start_controller(&kube.client, &target, config(&ini), "c1");
    create_namespace(&kube.client, NS, json!({})).await?;
    create_pod_with(
        &kube.client,
        "bad",
        json!({"openstack.org/kuryr-additional-subnets": "not json"}),
        json!({}),
    )
    .await?;
    // Made after the refused one and wired: the refusal was handled by then (with Events on,
    // its Event is posted before the refusal returns).
    create_pod_with(&kube.client, "good", json!({}), json!({})).await?;
    wired(&kube.client, "good", 1).await?;
    let events = Api::<Event>::namespaced(kube.client.clone(), NS)
        .list(&ListParams::default())
        .await?
        .items;
    assert!(events.is_empty(), "{events:?}");
    let kps = Api::<KuryrPort>::namespaced(kube.client.clone(), NS);
    let bad = kps.get_opt("bad").await?;
    assert!(
        bad.and_then(|kp| kp.status).is_none_or(|s| s.vifs.is_empty()),
        "the refused pod has no VIFs"
    );
    ctrl.shutdown().await?;
    Ok(())
}
