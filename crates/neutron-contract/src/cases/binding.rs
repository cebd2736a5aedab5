//! Port binding by the agents: ACTIVE/DOWN transitions, failed bindings, trunk subports and SR-IOV.

use std::time::Duration;

use anyhow::{bail, ensure};
use kuryr_neutron::{PortCreate, PortUpdate, SubPort, TrunkCreate};
use serde_json::json;

use super::networks::{SRIOV_PHYSNET, vlan_network};
use super::trunks::trunk_fixture;
use super::{ACTIVE_WITHIN, AGENT_HOST, AGENT_HOST_2, HYBRID_PLUG_HOST, ids};
use crate::Ctx;

pub(super) async fn ports_bound_to_agent_host_become_active(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.59.0.0/24").await?;
    let reqs = vec![
        PortCreate {
            binding_host_id: Some(AGENT_HOST.into()),
            device_owner: Some("compute:kuryr".into()),
            name: Some("available-port".into()),
            ..ctx.port_req(&net.id)
        };
        3
    ];
    let ports = ctx.client.create_ports(&reqs).await?;
    for p in &ports {
        ensure!(p.binding_host_id == AGENT_HOST, "host {:?}", p.binding_host_id);
        let active = ctx.wait_status(&p.id, "ACTIVE", ACTIVE_WITHIN).await?;
        ensure!(
            active.binding_vif_type == "ovs",
            "vif_type {:?}",
            active.binding_vif_type
        );
    }
    let listed = ctx
        .client
        .list_ports(&ctx.project_filter().status("ACTIVE"))
        .await?;
    ensure!(
        ids(&listed) == ids(&ports),
        "status=ACTIVE filter returned {:?}",
        ids(&listed)
    );
    Ok(())
}

pub(super) async fn binding_by_update_becomes_active_and_unbinding_goes_down(
    ctx: &Ctx,
) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.60.0.0/24").await?;
    let p = ctx.port(ctx.port_req(&net.id)).await?;
    let bound = ctx
        .client
        .update_port(
            &p.id,
            &PortUpdate {
                binding_host_id: Some(AGENT_HOST_2.into()),
                device_id: Some("pod-1".into()),
                device_owner: Some("compute:kuryr".into()),
                ..PortUpdate::default()
            },
        )
        .await?;
    ensure!(
        bound.binding_vif_type == "ovs" && bound.binding_host_id == AGENT_HOST_2,
        "{bound:?}"
    );
    ctx.wait_status(&p.id, "ACTIVE", ACTIVE_WITHIN).await?;
    let unbound = ctx
        .client
        .update_port(
            &p.id,
            &PortUpdate {
                binding_host_id: Some(String::new()),
                device_id: Some(String::new()),
                ..PortUpdate::default()
            },
        )
        .await?;
    ensure!(
        unbound.status == "DOWN"
            && unbound.binding_vif_type == "unbound"
            && unbound.binding_host_id.is_empty(),
        "after unbinding: status {} vif_type {} host {:?}",
        unbound.status,
        unbound.binding_vif_type,
        unbound.binding_host_id
    );
    Ok(())
}

/// ML2/OVS takes `ovs_hybrid_plug` from the OVS agent of the port's host (one whose firewall is
/// iptables_hybrid reports it): the CNI then plugs the pod through a Linux bridge of its port, where
/// that firewall filters. Such a port gets no `ovs_create_tap`.
pub(super) async fn ovs_hybrid_plug_follows_the_agent_of_the_host(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.66.0.0/24").await?;
    for (host, hybrid) in [(AGENT_HOST, false), (HYBRID_PLUG_HOST, true)] {
        let p = ctx
            .port(PortCreate {
                binding_host_id: Some(host.into()),
                device_owner: Some("compute:kuryr".into()),
                ..ctx.port_req(&net.id)
            })
            .await?;
        let details = &p.binding_vif_details;
        ensure!(
            p.binding_vif_type == "ovs",
            "{host}: vif_type {:?}",
            p.binding_vif_type
        );
        ensure!(
            details.get("ovs_hybrid_plug") == Some(&json!(hybrid)),
            "{host}: vif_details {details:?}"
        );
        ensure!(
            details.contains_key("ovs_create_tap") != hybrid,
            "{host}: vif_details {details:?}"
        );
        ctx.wait_status(&p.id, "ACTIVE", ACTIVE_WITHIN).await?;
    }
    Ok(())
}

pub(super) async fn binding_to_host_without_agent_fails(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.61.0.0/24").await?;
    let p = ctx
        .port(PortCreate {
            binding_host_id: Some("no-agent-host".into()),
            ..ctx.port_req(&net.id)
        })
        .await?;
    ensure!(
        p.binding_vif_type == "binding_failed" && p.status == "DOWN",
        "{p:?}"
    );
    Ok(())
}

pub(super) async fn trunk_subports_become_active(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, subs) = trunk_fixture(ctx, "10.62.0.0/24", 2).await?;
    let t = ctx
        .client
        .create_trunk(&TrunkCreate {
            sub_ports: vec![SubPort::vlan(&subs[0].id, 10)],
            ..ctx.trunk_req(&parent.id)
        })
        .await?;
    // "Nova boots the VM": bind the parent after the trunk exists.
    ctx.client
        .update_port(
            &parent.id,
            &PortUpdate {
                binding_host_id: Some(AGENT_HOST.into()),
                device_owner: Some("compute:nova".into()),
                device_id: Some("vm0".into()),
                ..PortUpdate::default()
            },
        )
        .await?;
    ctx.wait_status(&parent.id, "ACTIVE", ACTIVE_WITHIN).await?;
    let sp = ctx.wait_status(&subs[0].id, "ACTIVE", ACTIVE_WITHIN).await?;
    ensure!(
        sp.device_owner == "trunk:subport"
            && sp.binding_host_id == AGENT_HOST
            && sp.binding_vif_type == "ovs",
        "subport binding: owner {:?} host {:?} vif {:?}",
        sp.device_owner,
        sp.binding_host_id,
        sp.binding_vif_type
    );
    // A subport added to the bound trunk is wired too.
    ctx.client
        .add_subports(&t.id, &[SubPort::vlan(&subs[1].id, 11)])
        .await?;
    let sp2 = ctx.wait_status(&subs[1].id, "ACTIVE", ACTIVE_WITHIN).await?;
    ensure!(
        sp2.device_owner == "trunk:subport",
        "owner {:?}",
        sp2.device_owner
    );
    let deadline = std::time::Instant::now() + ACTIVE_WITHIN;
    loop {
        let tr = ctx.client.get_trunk(&t.id).await?;
        if tr.status == "ACTIVE" {
            break;
        }
        if std::time::Instant::now() > deadline {
            bail!("trunk status {} after {ACTIVE_WITHIN:?}", tr.status);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

pub(super) async fn direct_port_on_physnet_host_is_hw_veb_and_goes_active(ctx: &Ctx) -> anyhow::Result<()> {
    let net = vlan_network(ctx, SRIOV_PHYSNET).await?;
    let vid = net.provider_segmentation_id.unwrap_or_default();
    ctx.subnet(&net.id, "10.63.0.0/24").await?;
    let direct = |network_id: &str| PortCreate {
        binding_host_id: Some(AGENT_HOST.into()),
        binding_vnic_type: Some("direct".into()),
        binding_profile: Some([("physical_network".to_string(), json!(SRIOV_PHYSNET))].into()),
        device_owner: Some("compute:kuryr".into()),
        ..ctx.port_req(network_id)
    };
    // sriovnicswitch binds it: the host's NIC Switch agent maps the network's physnet.
    let p = ctx.port(direct(&net.id)).await?;
    ensure!(
        p.binding_vif_type == "hw_veb"
            && p.binding_vnic_type == "direct"
            && p.binding_host_id == AGENT_HOST
            && p.binding_profile.get("physical_network") == Some(&json!(SRIOV_PHYSNET)),
        "{p:?}"
    );
    let d = &p.binding_vif_details;
    ensure!(
        d.get("vlan") == Some(&json!(vid.to_string()))
            && d.get("port_filter") == Some(&json!(false))
            && d.get("connectivity") == Some(&json!("l2"))
            && d.get("bound_drivers") == Some(&json!({"0": "sriovnicswitch"})),
        "vif_details {d:?}"
    );
    // The NIC Switch agent reports the VF up.
    let active = ctx.wait_status(&p.id, "ACTIVE", ACTIVE_WITHIN).await?;
    ensure!(active.binding_vif_type == "hw_veb", "{active:?}");
    // On a (tenant) VXLAN network nothing binds a direct port.
    let (tenant, _) = ctx.network("10.64.0.0/24").await?;
    let failed = ctx.port(direct(&tenant.id)).await?;
    ensure!(
        failed.binding_vif_type == "binding_failed" && failed.status == "DOWN",
        "{failed:?}"
    );
    // Nor on a host without agents.
    let elsewhere = ctx
        .port(PortCreate {
            binding_host_id: Some("no-agent-host".into()),
            ..direct(&net.id)
        })
        .await?;
    ensure!(
        elsewhere.binding_vif_type == "binding_failed" && elsewhere.status == "DOWN",
        "{elsewhere:?}"
    );
    Ok(())
}
