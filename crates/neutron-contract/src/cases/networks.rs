//! Networks, subnets, subnet pools, provider segments and IP availability.

use std::collections::BTreeSet;

use anyhow::{anyhow, ensure};
use kuryr_neutron::{ErrorKind, ListFilter, NetworkCreate, SubnetCreate, SubnetPoolCreate};

use super::MISSING;
use crate::Ctx;
use crate::ctx::expect_api_error;

pub(super) async fn extensions_include_trunk_and_tags(ctx: &Ctx) -> anyhow::Result<()> {
    let aliases: BTreeSet<String> = ctx
        .client
        .list_extensions()
        .await?
        .into_iter()
        .map(|e| e.alias)
        .collect();
    for wanted in [
        "trunk",
        "trunk-details",
        "standard-attr-tag",
        "tag-ports-during-bulk-creation",
        "binding",
        "revision-if-match",
        "quotas",
        "quota_details",
        "network-ip-availability",
        "pagination",
        "subnet_allocation",
        "router",
        "security-group",
        "allowed-address-pairs",
    ] {
        ensure!(
            aliases.contains(wanted),
            "extension {wanted:?} missing from {aliases:?}"
        );
    }
    Ok(())
}

pub(super) async fn network_crud(ctx: &Ctx) -> anyhow::Result<()> {
    let net = ctx
        .client
        .create_network(&NetworkCreate {
            name: Some("crud-net".into()),
            project_id: Some(ctx.project.clone()),
            ..NetworkCreate::default()
        })
        .await?;
    ensure!(
        net.name == "crud-net" && net.project_id == ctx.project,
        "create answer: {net:?}"
    );
    ensure!(
        net.status == "ACTIVE" && net.admin_state_up,
        "new network status: {net:?}"
    );
    ensure!(
        net.subnets.is_empty(),
        "new network has subnets: {:?}",
        net.subnets
    );
    let got = ctx.client.get_network(&net.id).await?;
    ensure!(got.id == net.id && got.name == "crud-net", "get: {got:?}");
    let listed = ctx.client.list_networks(&ctx.project_filter()).await?;
    ensure!(
        listed.len() == 1 && listed[0].id == net.id,
        "list by project: {listed:?}"
    );
    ctx.client.delete_network(&net.id).await?;
    expect_api_error(
        ctx.client.get_network(&net.id).await,
        ErrorKind::NetworkNotFound,
        404,
    )?;
    expect_api_error(
        ctx.client.get_network(MISSING).await,
        ErrorKind::NetworkNotFound,
        404,
    )?;
    Ok(())
}

pub(super) async fn subnet_crud_and_allocation_pool(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, subnet) = ctx.network("10.20.0.0/22").await?;
    ensure!(
        subnet.cidr == "10.20.0.0/22" && subnet.ip_version == 4,
        "{subnet:?}"
    );
    ensure!(
        subnet.gateway_ip.as_deref() == Some("10.20.0.1"),
        "gateway: {:?}",
        subnet.gateway_ip
    );
    ensure!(
        subnet.allocation_pools.len() == 1
            && subnet.allocation_pools[0].start == "10.20.0.2"
            && subnet.allocation_pools[0].end == "10.20.3.254",
        "allocation pools: {:?}",
        subnet.allocation_pools
    );
    ensure!(!subnet.enable_dhcp, "enable_dhcp was requested false");
    let got = ctx.client.get_subnet(&subnet.id).await?;
    ensure!(got.network_id == net.id, "get: {got:?}");
    let net = ctx.client.get_network(&net.id).await?;
    ensure!(
        net.subnets == vec![subnet.id.clone()],
        "network.subnets: {:?}",
        net.subnets
    );
    let listed = ctx
        .client
        .list_subnets(&ListFilter::new().network_id(&net.id))
        .await?;
    ensure!(
        listed.len() == 1 && listed[0].id == subnet.id,
        "list by network: {listed:?}"
    );
    ctx.client.delete_subnet(&subnet.id).await?;
    expect_api_error(
        ctx.client.get_subnet(&subnet.id).await,
        ErrorKind::SubnetNotFound,
        404,
    )?;
    Ok(())
}

pub(super) async fn ip_exhaustion_on_tiny_subnet(ctx: &Ctx) -> anyhow::Result<()> {
    // A /29 has 8 addresses: network, gateway (.1), broadcast leave 5 (.2 - .6).
    let (net, subnet) = ctx.network("10.55.0.0/29").await?;
    ensure!(
        subnet
            .allocation_pools
            .first()
            .map(|p| (p.start.as_str(), p.end.as_str()))
            == Some(("10.55.0.2", "10.55.0.6"))
    );
    expect_api_error(
        ctx.client.create_ports(&vec![ctx.port_req(&net.id); 6]).await,
        ErrorKind::IpAddressGenerationFailure,
        409,
    )?;
    ensure!(
        ctx.project_ports().await?.is_empty(),
        "failed bulk allocated addresses"
    );
    let five = ctx.client.create_ports(&vec![ctx.port_req(&net.id); 5]).await?;
    ensure!(five.len() == 5);
    let e = expect_api_error(
        ctx.client.create_port(&ctx.port_req(&net.id)).await,
        ErrorKind::IpAddressGenerationFailure,
        409,
    )?;
    let msg = e.api().map(|a| a.message.clone()).unwrap_or_default();
    ensure!(msg.contains(&net.id), "message names the network: {msg}");
    Ok(())
}

pub(super) async fn network_ip_availability_counts(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, subnet) = ctx.network("10.56.0.0/24").await?;
    ctx.client.create_ports(&vec![ctx.port_req(&net.id); 3]).await?;
    let a = ctx.client.get_network_ip_availability(&net.id).await?;
    ensure!(a.network_id == net.id && a.project_id == ctx.project, "{a:?}");
    ensure!(
        a.total_ips == 253 && a.used_ips == 3,
        "network totals {} / {}",
        a.used_ips,
        a.total_ips
    );
    ensure!(
        a.subnet_ip_availability.len() == 1,
        "{:?}",
        a.subnet_ip_availability
    );
    let s = &a.subnet_ip_availability[0];
    ensure!(
        s.subnet_id == subnet.id
            && s.cidr == "10.56.0.0/24"
            && s.ip_version == 4
            && s.total_ips == 253
            && s.used_ips == 3,
        "subnet availability {s:?}"
    );
    let listed = ctx
        .client
        .list_network_ip_availabilities(&ListFilter::new().network_id(&net.id))
        .await?;
    ensure!(listed.len() == 1 && listed[0].used_ips == 3, "list: {listed:?}");
    Ok(())
}

pub(super) async fn subnetpool_allocation(ctx: &Ctx) -> anyhow::Result<()> {
    let c = &ctx.client;
    let pool = c
        .create_subnetpool(&SubnetPoolCreate {
            name: "ns-pool".into(),
            prefixes: vec!["10.90.0.0/16".into()],
            default_prefixlen: Some(26),
            project_id: Some(ctx.project.clone()),
            ..SubnetPoolCreate::default()
        })
        .await?;
    ensure!(
        pool.default_prefixlen == Some(26) && pool.prefixes == vec!["10.90.0.0/16".to_owned()],
        "{pool:?}"
    );
    ensure!(pool.ip_version == 4, "ip_version {}", pool.ip_version);
    let net = c
        .create_network(&NetworkCreate {
            name: Some("ns-net".into()),
            project_id: Some(ctx.project.clone()),
            ..NetworkCreate::default()
        })
        .await?;
    let from_pool = |prefixlen: Option<u32>| SubnetCreate {
        network_id: net.id.clone(),
        ip_version: 4,
        subnetpool_id: Some(pool.id.clone()),
        prefixlen,
        project_id: Some(ctx.project.clone()),
        enable_dhcp: Some(false),
        ..SubnetCreate::default()
    };
    let s1 = c.create_subnet(&from_pool(None)).await?;
    ensure!(
        s1.cidr.starts_with("10.90.") && s1.cidr.ends_with("/26"),
        "default prefixlen cidr {}",
        s1.cidr
    );
    ensure!(
        s1.subnetpool_id.as_deref() == Some(pool.id.as_str()),
        "subnetpool_id {:?}",
        s1.subnetpool_id
    );
    let s2 = c.create_subnet(&from_pool(Some(28))).await?;
    ensure!(
        s2.cidr.starts_with("10.90.") && s2.cidr.ends_with("/28"),
        "prefixlen 28 cidr {}",
        s2.cidr
    );
    ensure!(
        s1.cidr != s2.cidr,
        "overlapping allocations {} {}",
        s1.cidr,
        s2.cidr
    );
    let listed = c.list_subnets(&ListFilter::new().subnetpool_id(&pool.id)).await?;
    ensure!(listed.len() == 2, "subnets of pool: {listed:?}");
    ensure!(c.get_subnetpool(&pool.id).await?.name == "ns-pool");
    // A pool with subnets cannot go; after they are deleted it can.
    let e = c
        .delete_subnetpool(&pool.id)
        .await
        .err()
        .ok_or_else(|| anyhow!("pool in use was deleted"))?;
    ensure!(
        e.status() == Some(409) || e.status() == Some(400),
        "deleting a used pool: {e}"
    );
    c.delete_subnet(&s1.id).await?;
    c.delete_subnet(&s2.id).await?;
    c.delete_subnetpool(&pool.id).await?;
    Ok(())
}

/// The physnet the NIC Switch agents map (and that has a VLAN range).
pub(super) const SRIOV_PHYSNET: &str = "physnet2";

/// An admin-created VLAN network on `physnet`, VLAN allocated by Neutron, in this case's project.
pub(super) async fn vlan_network(ctx: &Ctx, physnet: &str) -> anyhow::Result<kuryr_neutron::Network> {
    Ok(ctx
        .client
        .create_network(&NetworkCreate {
            name: Some(format!("{}-{physnet}", ctx.case)),
            project_id: Some(ctx.project.clone()),
            provider_network_type: Some("vlan".into()),
            provider_physical_network: Some(physnet.into()),
            ..NetworkCreate::default()
        })
        .await?)
}

pub(super) async fn provider_networks_flat_and_vlan(ctx: &Ctx) -> anyhow::Result<()> {
    let c = &ctx.client;
    let vlan = vlan_network(ctx, SRIOV_PHYSNET).await?;
    let vid = vlan
        .provider_segmentation_id
        .ok_or_else(|| anyhow!("no VLAN allocated: {vlan:?}"))?;
    ensure!(
        vlan.provider_network_type.as_deref() == Some("vlan")
            && vlan.provider_physical_network.as_deref() == Some(SRIOV_PHYSNET)
            && (300..=399).contains(&vid)
            && vlan.mtu == Some(1500),
        "{vlan:?}"
    );
    let tenant = c
        .create_network(&NetworkCreate {
            name: Some("tenant".into()),
            project_id: Some(ctx.project.clone()),
            ..NetworkCreate::default()
        })
        .await?;
    ensure!(
        tenant.provider_network_type.as_deref() == Some("vxlan")
            && tenant.provider_physical_network.is_none()
            && tenant.mtu == Some(1450),
        "{tenant:?}"
    );
    let create = |t: &str, physnet: Option<&str>, seg: Option<u32>| NetworkCreate {
        name: Some("bad".into()),
        project_id: Some(ctx.project.clone()),
        provider_network_type: Some(t.into()),
        provider_physical_network: physnet.map(String::from),
        provider_segmentation_id: seg,
        ..NetworkCreate::default()
    };
    let e = expect_api_error(
        c.create_network(&create("vlan", Some(SRIOV_PHYSNET), Some(vid)))
            .await,
        ErrorKind::Other {
            error_type: "VlanIdInUse".into(),
        },
        409,
    )?;
    ensure!(
        e.to_string().contains(&format!(
            "The VLAN {vid} on physical network {SRIOV_PHYSNET} is in use"
        )),
        "{e}"
    );
    let e = expect_api_error(
        c.create_network(&create("vlan", Some("physnet9"), None)).await,
        ErrorKind::InvalidInput,
        400,
    )?;
    ensure!(
        e.to_string()
            .contains("physical_network 'physnet9' unknown for VLAN provider network"),
        "{e}"
    );
    expect_api_error(
        c.create_network(&create("vlan", Some(SRIOV_PHYSNET), Some(5000)))
            .await,
        ErrorKind::InvalidInput,
        400,
    )?;
    let e = expect_api_error(
        c.create_network(&create("flat", None, None)).await,
        ErrorKind::InvalidInput,
        400,
    )?;
    ensure!(
        e.to_string()
            .contains("physical_network required for flat provider network"),
        "{e}"
    );
    expect_api_error(
        c.create_network(&create("vxlan", Some(SRIOV_PHYSNET), None))
            .await,
        ErrorKind::InvalidInput,
        400,
    )?;
    Ok(())
}
