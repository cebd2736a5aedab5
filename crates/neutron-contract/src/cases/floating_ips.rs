//! Floating IPs (`router` extension): what LoadBalancer Services rely on. Each case makes its own external
//! network and subnet (the sweep deletes them with the floating IPs first).

use anyhow::ensure;
use kuryr_neutron::{
    ErrorKind, FloatingIpCreate, Network, NetworkCreate, RouterCreate, RouterInterfaceSpec, Subnet, Taggable,
};
use serde_json::json;

use super::MISSING;
use crate::Ctx;
use crate::ctx::expect_api_error;

async fn external(ctx: &Ctx, cidr: Option<&str>) -> anyhow::Result<(Network, Option<Subnet>)> {
    let net = ctx
        .client
        .create_network(&NetworkCreate {
            name: Some(format!("{}-ext", ctx.case)),
            project_id: Some(ctx.project.clone()),
            router_external: Some(true),
            ..NetworkCreate::default()
        })
        .await?;
    ensure!(net.router_external == Some(true), "{net:?}");
    let subnet = match cidr {
        Some(c) => Some(ctx.subnet(&net.id, c).await?),
        None => None,
    };
    Ok((net, subnet))
}

fn fip_req(ctx: &Ctx, network: &str) -> FloatingIpCreate {
    FloatingIpCreate {
        floating_network_id: network.to_string(),
        project_id: Some(ctx.project.clone()),
        ..FloatingIpCreate::default()
    }
}

pub(super) async fn floating_ip_allocation_tags_and_lookup(ctx: &Ctx) -> anyhow::Result<()> {
    let c = &ctx.client;
    let (bare, _) = external(ctx, None).await?;
    expect_api_error(
        c.create_floatingip(&fip_req(ctx, &bare.id)).await,
        ErrorKind::BadRequest,
        400,
    )?;
    let (internal, _) = ctx.network("10.62.0.0/24").await?;
    expect_api_error(
        c.create_floatingip(&fip_req(ctx, &internal.id)).await,
        ErrorKind::BadRequest,
        400,
    )?;
    expect_api_error(
        c.create_floatingip(&fip_req(ctx, MISSING)).await,
        ErrorKind::NetworkNotFound,
        404,
    )?;

    let (ext, subnet) = external(ctx, Some("172.30.62.0/24")).await?;
    let subnet = subnet.ok_or_else(|| anyhow::anyhow!("no subnet"))?;
    // Tags are not taken in the create: they are set afterwards.
    let (status, body) = ctx
        .raw_json(
            reqwest::Method::POST,
            "/floatingips",
            Some(json!({"floatingip": {
                "floating_network_id": ext.id, "project_id": ctx.project, "tags": ["t"]
            }})),
        )
        .await?;
    ensure!(status == 400, "tags in the POST: {status} {body}");

    let fip = c
        .create_floatingip(&FloatingIpCreate {
            description: Some("kuryr-rs:contract".into()),
            ..fip_req(ctx, &ext.id)
        })
        .await?;
    let addr: std::net::Ipv4Addr = fip.floating_ip_address.parse()?;
    ensure!(
        addr.octets()[..3] == [172, 30, 62]
            && fip.floating_network_id == ext.id
            && fip.port_id.is_none()
            && fip.fixed_ip_address.is_none()
            && fip.router_id.is_none()
            && fip.status == "DOWN"
            && fip.project_id == ctx.project
            && fip.description == "kuryr-rs:contract"
            && fip.tags.is_empty(),
        "{fip:?}"
    );
    let tags = c
        .replace_tags(Taggable::FloatingIp, &fip.id, &["kuryr-rs", "svc"])
        .await?;
    ensure!(tags.len() == 2, "{tags:?}");
    let by_tags = c
        .list_floatingips(&ctx.project_filter().tags(["kuryr-rs", "svc"]))
        .await?;
    ensure!(
        by_tags.len() == 1 && by_tags[0].id == fip.id && by_tags[0].revision_number > fip.revision_number,
        "list by tags: {by_tags:?}"
    );
    let by_addr = c
        .list_floatingips(
            &ctx.project_filter()
                .eq("floating_ip_address", fip.floating_ip_address.clone()),
        )
        .await?;
    ensure!(by_addr.len() == 1 && by_addr[0].id == fip.id, "{by_addr:?}");
    let by_desc = c
        .list_floatingips(&ctx.project_filter().eq("description", "kuryr-rs:contract"))
        .await?;
    ensure!(by_desc.len() == 1, "list by description: {by_desc:?}");

    // A taken address, an address outside the network, and a free one asked for by address.
    expect_api_error(
        c.create_floatingip(&FloatingIpCreate {
            floating_ip_address: Some(fip.floating_ip_address.clone()),
            ..fip_req(ctx, &ext.id)
        })
        .await,
        ErrorKind::IpAddressAlreadyAllocated,
        409,
    )?;
    expect_api_error(
        c.create_floatingip(&FloatingIpCreate {
            floating_ip_address: Some("172.30.99.7".into()),
            ..fip_req(ctx, &ext.id)
        })
        .await,
        ErrorKind::Other {
            error_type: "InvalidIpForNetwork".into(),
        },
        400,
    )?;
    let wanted = c
        .create_floatingip(&FloatingIpCreate {
            subnet_id: Some(subnet.id.clone()),
            floating_ip_address: Some("172.30.62.77".into()),
            ..fip_req(ctx, &ext.id)
        })
        .await?;
    ensure!(wanted.floating_ip_address == "172.30.62.77", "{wanted:?}");

    c.delete_floatingip(&fip.id).await?;
    expect_api_error(
        c.get_floatingip(&fip.id).await,
        ErrorKind::FloatingIpNotFound,
        404,
    )?;
    // Deleting the external network takes its floating IPs with it.
    c.delete_network(&ext.id).await?;
    expect_api_error(
        c.get_floatingip(&wanted.id).await,
        ErrorKind::FloatingIpNotFound,
        404,
    )?;
    expect_api_error(
        c.delete_floatingip(MISSING).await,
        ErrorKind::FloatingIpNotFound,
        404,
    )?;
    expect_api_error(
        c.update_floatingip_port(MISSING, None).await,
        ErrorKind::FloatingIpNotFound,
        404,
    )?;
    Ok(())
}

pub(super) async fn floating_ip_association_needs_a_router(ctx: &Ctx) -> anyhow::Result<()> {
    let c = &ctx.client;
    let (ext, _) = external(ctx, Some("172.30.63.0/24")).await?;
    let (internal, subnet) = ctx.network("10.63.0.0/24").await?;
    let port = ctx.port(ctx.port_req(&internal.id)).await?;
    let port_ip = port
        .fixed_ips
        .first()
        .map(|f| f.ip_address.clone())
        .unwrap_or_default();
    let fip = c.create_floatingip(&fip_req(ctx, &ext.id)).await?;
    expect_api_error(
        c.update_floatingip_port(&fip.id, Some(&port.id)).await,
        ErrorKind::ExternalGatewayForFloatingIpNotFound,
        404,
    )?;
    expect_api_error(
        c.update_floatingip_port(&fip.id, Some(MISSING)).await,
        ErrorKind::PortNotFound,
        404,
    )?;

    let router = c
        .create_router(&RouterCreate {
            name: Some("fip-router".into()),
            project_id: Some(ctx.project.clone()),
            external_gateway_info: Some(json!({"network_id": ext.id})),
            ..RouterCreate::default()
        })
        .await?;
    c.add_router_interface(
        &router.id,
        &RouterInterfaceSpec::Subnet {
            subnet_id: subnet.id.clone(),
        },
    )
    .await?;
    let assoc = c.update_floatingip_port(&fip.id, Some(&port.id)).await?;
    ensure!(
        assoc.port_id.as_deref() == Some(port.id.as_str())
            && assoc.fixed_ip_address.as_deref() == Some(port_ip.as_str())
            && assoc.router_id.as_deref() == Some(router.id.as_str()),
        "{assoc:?}"
    );
    let by_port = c
        .list_floatingips(&ctx.project_filter().eq("port_id", port.id.clone()))
        .await?;
    ensure!(by_port.len() == 1 && by_port[0].id == fip.id, "{by_port:?}");

    // One floating IP per fixed IP and external network.
    let second = c.create_floatingip(&fip_req(ctx, &ext.id)).await?;
    expect_api_error(
        c.update_floatingip_port(&second.id, Some(&port.id)).await,
        ErrorKind::FloatingIpPortAlreadyAssociated,
        409,
    )?;

    let off = c.update_floatingip_port(&fip.id, None).await?;
    ensure!(
        off.port_id.is_none() && off.fixed_ip_address.is_none() && off.router_id.is_none(),
        "{off:?}"
    );
    // Now the second one may take the port; deleting the port disassociates it, the floating IP stays.
    c.update_floatingip_port(&second.id, Some(&port.id)).await?;
    c.delete_port(&port.id).await?;
    let after = c.get_floatingip(&second.id).await?;
    ensure!(
        after.port_id.is_none() && after.fixed_ip_address.is_none(),
        "{after:?}"
    );
    Ok(())
}
