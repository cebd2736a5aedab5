//! Trunks and subports: creation rules, add/remove, conflicts and trunk_details.

use anyhow::{anyhow, ensure};
use kuryr_neutron::{ErrorKind, ListFilter, Port, PortCreate, SubPort, TrunkCreate};

use super::{AGENT_HOST, MISSING};
use crate::Ctx;
use crate::ctx::expect_api_error;

pub(super) async fn trunk_fixture(
    ctx: &Ctx,
    cidr: &str,
    subports: usize,
) -> anyhow::Result<(Port, Vec<Port>)> {
    let (net, _) = ctx.network(cidr).await?;
    let parent = ctx
        .port(PortCreate {
            name: Some("vm-parent".into()),
            ..ctx.port_req(&net.id)
        })
        .await?;
    let subs = ctx
        .client
        .create_ports(&vec![
            PortCreate {
                name: Some("subport".into()),
                ..ctx.port_req(&net.id)
            };
            subports
        ])
        .await?;
    Ok((parent, subs))
}

pub(super) async fn trunk_create_on_unbound_parent(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, _) = trunk_fixture(ctx, "10.45.0.0/24", 0).await?;
    let t = new_trunk(ctx, &parent).await?;
    ensure!(
        t.port_id == parent.id && t.name == "vm-trunk" && t.project_id == ctx.project,
        "{t:?}"
    );
    ensure!(
        t.status == "DOWN" && t.sub_ports.is_empty() && t.admin_state_up,
        "{t:?}"
    );
    ensure!(ctx.client.get_trunk(&t.id).await?.id == t.id);
    let listed = ctx
        .client
        .list_trunks(&ListFilter::new().port_id(&parent.id))
        .await?;
    ensure!(
        listed.len() == 1 && listed[0].id == t.id,
        "list by port_id: {listed:?}"
    );
    expect_api_error(
        ctx.client.create_trunk(&ctx.trunk_req(MISSING)).await,
        ErrorKind::PortNotFound,
        404,
    )?;
    ctx.client.delete_trunk(&t.id).await?;
    expect_api_error(ctx.client.get_trunk(&t.id).await, ErrorKind::TrunkNotFound, 404)?;
    Ok(())
}

pub(super) async fn trunk_create_with_subports(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, subs) = trunk_fixture(ctx, "10.46.0.0/24", 1).await?;
    let t = ctx
        .client
        .create_trunk(&TrunkCreate {
            sub_ports: vec![SubPort::vlan(&subs[0].id, 10)],
            ..ctx.trunk_req(&parent.id)
        })
        .await?;
    ensure!(
        t.sub_ports == vec![SubPort::vlan(&subs[0].id, 10)],
        "sub_ports {:?}",
        t.sub_ports
    );
    Ok(())
}

pub(super) async fn trunk_on_bound_parent_is_parent_port_in_use(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.47.0.0/24").await?;
    let bound = ctx
        .port(PortCreate {
            binding_host_id: Some(AGENT_HOST.into()),
            ..ctx.port_req(&net.id)
        })
        .await?;
    expect_api_error(
        ctx.client.create_trunk(&ctx.trunk_req(&bound.id)).await,
        ErrorKind::ParentPortInUse,
        409,
    )?;
    ensure!(
        ctx.client.list_trunks(&ctx.project_filter()).await?.is_empty(),
        "trunk created anyway"
    );
    Ok(())
}

pub(super) async fn trunk_get_missing_is_trunk_not_found(ctx: &Ctx) -> anyhow::Result<()> {
    expect_api_error(ctx.client.get_trunk(MISSING).await, ErrorKind::TrunkNotFound, 404)?;
    expect_api_error(
        ctx.client
            .add_subports(MISSING, &[SubPort::vlan(MISSING, 5)])
            .await,
        ErrorKind::TrunkNotFound,
        404,
    )?;
    Ok(())
}

/// A trunk named `vm-trunk` on `parent`, without subports.
async fn new_trunk(ctx: &Ctx, parent: &Port) -> anyhow::Result<kuryr_neutron::Trunk> {
    Ok(ctx
        .client
        .create_trunk(&TrunkCreate {
            name: Some("vm-trunk".into()),
            ..ctx.trunk_req(&parent.id)
        })
        .await?)
}

pub(super) async fn trunk_add_and_remove_subports(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, subs) = trunk_fixture(ctx, "10.48.0.0/24", 2).await?;
    let t = new_trunk(ctx, &parent).await?;
    let want = vec![SubPort::vlan(&subs[0].id, 101), SubPort::vlan(&subs[1].id, 102)];
    let after_add = ctx.client.add_subports(&t.id, &want).await?;
    ensure!(
        after_add.id == t.id,
        "add_subports answer is the trunk (unwrapped): {after_add:?}"
    );
    ensure!(
        after_add.sub_ports == want,
        "after add: {:?}",
        after_add.sub_ports
    );
    ensure!(ctx.client.get_subports(&t.id).await? == want, "get_subports");
    let after_remove = ctx.client.remove_subports(&t.id, &[&subs[0].id]).await?;
    ensure!(after_remove.id == t.id);
    ensure!(
        after_remove.sub_ports == want[1..],
        "after remove: {:?}",
        after_remove.sub_ports
    );
    ensure!(ctx.client.get_trunk(&t.id).await?.sub_ports == want[1..]);
    // The removed port is an ordinary port again: deletable.
    ctx.client.delete_port(&subs[0].id).await?;
    Ok(())
}

pub(super) async fn trunk_duplicate_subport(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, subs) = trunk_fixture(ctx, "10.49.0.0/24", 2).await?;
    let t = new_trunk(ctx, &parent).await?;
    ctx.client
        .add_subports(&t.id, &[SubPort::vlan(&subs[0].id, 101)])
        .await?;
    let e = expect_api_error(
        ctx.client
            .add_subports(&t.id, &[SubPort::vlan(&subs[1].id, 101)])
            .await,
        ErrorKind::DuplicateSubPort,
        409,
    )?;
    let msg = e.api().map(|a| a.message.clone()).unwrap_or_default();
    ensure!(msg.contains("101"), "message names the VLAN: {msg}");
    ensure!(
        ctx.client.get_subports(&t.id).await?.len() == 1,
        "duplicate was added"
    );
    Ok(())
}

/// A port that already has a device (here a `device_id` set at creation) cannot become a subport:
/// kuryr's nested driver must create subports without one.
pub(super) async fn subport_with_device_id_is_port_in_use(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, _) = trunk_fixture(ctx, "10.57.0.0/24", 0).await?;
    let t = new_trunk(ctx, &parent).await?;
    let owned = ctx
        .port(PortCreate {
            device_id: Some("pod-uid-1".into()),
            ..ctx.port_req(&parent.network_id)
        })
        .await?;
    let e = expect_api_error(
        ctx.client
            .add_subports(&t.id, &[SubPort::vlan(&owned.id, 110)])
            .await,
        ErrorKind::Other {
            error_type: "PortInUse".into(),
        },
        409,
    )?;
    let msg = e.api().map(|a| a.message.clone()).unwrap_or_default();
    ensure!(msg.contains("pod-uid-1"), "message names the device: {msg}");
    ensure!(
        ctx.client.get_subports(&t.id).await?.is_empty(),
        "nothing was added"
    );
    Ok(())
}

pub(super) async fn trunk_vlan_out_of_range_is_invalid_input(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, subs) = trunk_fixture(ctx, "10.50.0.0/24", 1).await?;
    let t = new_trunk(ctx, &parent).await?;
    let e = expect_api_error(
        ctx.client
            .add_subports(&t.id, &[SubPort::vlan(&subs[0].id, 5000)])
            .await,
        ErrorKind::InvalidInput,
        400,
    )?;
    let msg = e.api().map(|a| a.message.clone()).unwrap_or_default();
    ensure!(msg.contains("5000"), "message names the id: {msg}");
    Ok(())
}

pub(super) async fn delete_subport_port_is_port_in_use_as_subport(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, subs) = trunk_fixture(ctx, "10.51.0.0/24", 1).await?;
    let t = new_trunk(ctx, &parent).await?;
    ctx.client
        .add_subports(&t.id, &[SubPort::vlan(&subs[0].id, 7)])
        .await?;
    expect_api_error(
        ctx.client.delete_port(&subs[0].id).await,
        ErrorKind::PortInUseAsSubPort,
        409,
    )?;
    ensure!(
        ctx.client.get_port(&subs[0].id).await.is_ok(),
        "subport deleted anyway"
    );
    Ok(())
}

pub(super) async fn parent_port_has_trunk_details(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, subs) = trunk_fixture(ctx, "10.52.0.0/24", 2).await?;
    let t = new_trunk(ctx, &parent).await?;
    ctx.client
        .add_subports(
            &t.id,
            &[SubPort::vlan(&subs[0].id, 11), SubPort::vlan(&subs[1].id, 12)],
        )
        .await?;
    let p = ctx.client.get_port(&parent.id).await?;
    let td = p
        .trunk_details
        .ok_or_else(|| anyhow!("parent port has no trunk_details"))?;
    ensure!(td.trunk_id == t.id, "trunk_id {}", td.trunk_id);
    ensure!(td.sub_ports.len() == 2, "sub_ports {:?}", td.sub_ports);
    for (port, vlan) in [(&subs[0], 11), (&subs[1], 12)] {
        let found = td
            .sub_ports
            .iter()
            .find(|d| d.port_id == port.id)
            .ok_or_else(|| anyhow!("subport {} missing from trunk_details", port.id))?;
        ensure!(
            found.segmentation_id == vlan
                && found.segmentation_type == "vlan"
                && found.mac_address == port.mac_address,
            "trunk_details entry {found:?} for port {} ({})",
            port.id,
            port.mac_address
        );
    }
    // Subports themselves carry no trunk_details.
    ensure!(ctx.client.get_port(&subs[0].id).await?.trunk_details.is_none());
    Ok(())
}
