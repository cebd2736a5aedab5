//! The cases. Each asserts what neutron-server 29.0.0 (noauth, ML2 openvswitch + sriovnicswitch, fake OVS and NIC
//! Switch agents on k8s-node-1 and k8s-node-2, VLAN ranges physnet1:100:200 and physnet2:300:399, NIC Switch
//! device_mappings physnet2; see `scripts/neutron-lab/`) does; see docs in `shared/notes/real-neutron.md` and the
//! curl transcripts.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure};
use kuryr_neutron::{
    AllowedAddressPair, ErrorKind, FixedIpRequest, ListFilter, NetworkCreate, Port, PortCreate, PortUpdate,
    QuotaUpdate, RouterCreate, RouterInterfaceSpec, SecurityGroupCreate, SecurityGroupRuleCreate, SubPort,
    SubnetCreate, SubnetPoolCreate, Taggable, TrunkCreate,
};
use reqwest::Method;
use serde_json::json;

use crate::ctx::expect_api_error;
use crate::{Case, Ctx};

const MISSING: &str = "00000000-0000-0000-0000-000000000000";
const AGENT_HOST: &str = "k8s-node-1";
const AGENT_HOST_2: &str = "k8s-node-2";
const ACTIVE_WITHIN: Duration = Duration::from_secs(30);

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        /// Every case, in report order.
        pub fn all_cases() -> Vec<Case> {
            vec![$(Case { name: stringify!($name), run: |ctx| Box::pin($name(ctx)) }),*]
        }
    };
}

cases!(
    extensions_include_trunk_and_tags,
    network_crud,
    subnet_crud_and_allocation_pool,
    port_create_shape,
    port_create_on_missing_network_is_network_not_found,
    port_get_missing_is_port_not_found_with_request_id,
    port_delete_missing_is_port_not_found,
    port_delete_then_get_is_404,
    bulk_create_50_ports,
    bulk_create_is_atomic_on_quota,
    bulk_create_is_atomic_on_ip_conflict,
    bulk_create_stores_tags,
    single_create_stores_tags,
    filter_device_owner,
    filter_device_id,
    filter_binding_host_id,
    filter_fixed_ip_address,
    filter_fixed_ip_subnet,
    filter_tags_all,
    filter_tags_any,
    filter_not_tags,
    filter_network_id_and_fields,
    pagination_limit_and_marker,
    tags_add_replace_remove,
    tags_on_network_subnet_and_trunk,
    update_port_attributes,
    update_with_stale_revision_is_412,
    unrecognized_attribute_is_400,
    trunk_create_on_unbound_parent,
    trunk_create_with_subports,
    trunk_on_bound_parent_is_parent_port_in_use,
    trunk_get_missing_is_trunk_not_found,
    trunk_add_and_remove_subports,
    trunk_duplicate_subport,
    subport_with_device_id_is_port_in_use,
    trunk_vlan_out_of_range_is_invalid_input,
    delete_subport_port_is_port_in_use_as_subport,
    parent_port_has_trunk_details,
    quota_details_shape_and_usage,
    quota_exhaustion_is_over_quota,
    ip_exhaustion_on_tiny_subnet,
    network_ip_availability_counts,
    security_groups_and_rules,
    router_add_and_remove_interface,
    subnetpool_allocation,
    ports_bound_to_agent_host_become_active,
    binding_by_update_becomes_active_and_unbinding_goes_down,
    binding_to_host_without_agent_fails,
    trunk_subports_become_active,
    provider_networks_flat_and_vlan,
    direct_port_on_physnet_host_is_hw_veb_and_goes_active,
);

fn ids(ports: &[Port]) -> BTreeSet<String> {
    ports.iter().map(|p| p.id.clone()).collect()
}

fn sorted(v: &[String]) -> Vec<String> {
    let mut v = v.to_vec();
    v.sort();
    v
}

// ------------------------------------------------------------------------------------------ basics

async fn extensions_include_trunk_and_tags(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn network_crud(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn subnet_crud_and_allocation_pool(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn port_create_shape(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, subnet) = ctx.network("10.21.0.0/24").await?;
    let p = ctx
        .port(PortCreate {
            name: Some("available-port".into()),
            device_owner: Some("compute:kuryr".into()),
            fixed_ips: Some(vec![FixedIpRequest::subnet(&subnet.id)]),
            ..ctx.port_req(&net.id)
        })
        .await?;
    ensure!(
        p.name == "available-port" && p.network_id == net.id && p.project_id == ctx.project,
        "{p:?}"
    );
    ensure!(p.status == "DOWN", "unbound port status {}", p.status);
    ensure!(p.admin_state_up, "admin_state_up defaults to true");
    ensure!(p.mac_address.starts_with("fa:16:3e:"), "mac {}", p.mac_address);
    ensure!(
        p.fixed_ips.len() == 1
            && p.fixed_ips[0].subnet_id == subnet.id
            && p.fixed_ips[0].ip_address.starts_with("10.21.0."),
        "fixed_ips {:?}",
        p.fixed_ips
    );
    ensure!(
        p.device_owner == "compute:kuryr" && p.device_id.is_empty(),
        "{p:?}"
    );
    ensure!(
        p.binding_vif_type == "unbound" && p.binding_vnic_type == "normal",
        "{p:?}"
    );
    ensure!(p.binding_host_id.is_empty(), "host {:?}", p.binding_host_id);
    ensure!(
        p.security_groups.len() == 1,
        "default security group expected: {:?}",
        p.security_groups
    );
    ensure!(p.revision_number >= 1, "revision {}", p.revision_number);
    ensure!(p.trunk_details.is_none(), "no trunk yet");
    let got = ctx.client.get_port(&p.id).await?;
    ensure!(
        got.mac_address == p.mac_address && got.fixed_ips == p.fixed_ips,
        "get differs: {got:?}"
    );
    Ok(())
}

async fn port_create_on_missing_network_is_network_not_found(ctx: &Ctx) -> anyhow::Result<()> {
    expect_api_error(
        ctx.client.create_port(&ctx.port_req(MISSING)).await,
        ErrorKind::NetworkNotFound,
        404,
    )?;
    Ok(())
}

async fn port_get_missing_is_port_not_found_with_request_id(ctx: &Ctx) -> anyhow::Result<()> {
    let e = expect_api_error(ctx.client.get_port(MISSING).await, ErrorKind::PortNotFound, 404)?;
    let rid = e
        .request_id()
        .ok_or_else(|| anyhow!("no x-openstack-request-id on the error answer"))?;
    ensure!(rid.starts_with("req-"), "request id {rid:?}");
    let api = e.api().ok_or_else(|| anyhow!("not an API error"))?;
    ensure!(
        api.message.contains(MISSING),
        "message names the port: {}",
        api.message
    );
    Ok(())
}

async fn port_delete_missing_is_port_not_found(ctx: &Ctx) -> anyhow::Result<()> {
    expect_api_error(
        ctx.client.delete_port(MISSING).await,
        ErrorKind::PortNotFound,
        404,
    )?;
    Ok(())
}

async fn port_delete_then_get_is_404(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.22.0.0/24").await?;
    let p = ctx.port(ctx.port_req(&net.id)).await?;
    ctx.client.delete_port(&p.id).await?;
    expect_api_error(ctx.client.get_port(&p.id).await, ErrorKind::PortNotFound, 404)?;
    expect_api_error(ctx.client.delete_port(&p.id).await, ErrorKind::PortNotFound, 404)?;
    Ok(())
}

// ------------------------------------------------------------------------------------------ bulk

async fn bulk_create_50_ports(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, subnet) = ctx.network("10.23.0.0/24").await?;
    let reqs: Vec<PortCreate> = (0..50)
        .map(|i| PortCreate {
            name: Some(format!("bulk-{i}")),
            device_owner: Some("compute:kuryr".into()),
            fixed_ips: Some(vec![FixedIpRequest::subnet(&subnet.id)]),
            ..ctx.port_req(&net.id)
        })
        .collect();
    let ports = ctx.client.create_ports(&reqs).await?;
    ensure!(ports.len() == 50, "bulk answer has {} ports", ports.len());
    // Answers come in request order.
    for (i, p) in ports.iter().enumerate() {
        ensure!(p.name == format!("bulk-{i}"), "port {i} is named {:?}", p.name);
    }
    ensure!(ids(&ports).len() == 50, "ids not distinct");
    let ips: BTreeSet<&str> = ports
        .iter()
        .flat_map(|p| p.fixed_ips.iter().map(|f| f.ip_address.as_str()))
        .collect();
    ensure!(ips.len() == 50, "IPs not distinct: {}", ips.len());
    let listed = ctx.project_ports().await?;
    ensure!(ids(&listed) == ids(&ports), "listed {} ports", listed.len());
    Ok(())
}

async fn bulk_create_is_atomic_on_quota(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.24.0.0/24").await?;
    ctx.client
        .update_quota(
            &ctx.project,
            &QuotaUpdate {
                port: Some(5),
                ..QuotaUpdate::default()
            },
        )
        .await?;
    let six = vec![ctx.port_req(&net.id); 6];
    let e = expect_api_error(ctx.client.create_ports(&six).await, ErrorKind::OverQuota, 409)?;
    let msg = e.api().map(|a| a.message.clone()).unwrap_or_default();
    ensure!(
        msg.contains("port"),
        "OverQuota message names the resource: {msg}"
    );
    ensure!(
        ctx.project_ports().await?.is_empty(),
        "a failed bulk created ports"
    );
    let five = ctx.client.create_ports(&six[..5]).await?;
    ensure!(five.len() == 5);
    Ok(())
}

async fn bulk_create_is_atomic_on_ip_conflict(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, subnet) = ctx.network("10.25.0.0/24").await?;
    let same = PortCreate {
        fixed_ips: Some(vec![FixedIpRequest::address(&subnet.id, "10.25.0.200")]),
        ..ctx.port_req(&net.id)
    };
    let reqs = vec![ctx.port_req(&net.id), same.clone(), same];
    expect_api_error(
        ctx.client.create_ports(&reqs).await,
        ErrorKind::IpAddressAlreadyAllocated,
        409,
    )?;
    ensure!(
        ctx.project_ports().await?.is_empty(),
        "a failed bulk created ports"
    );
    Ok(())
}

async fn bulk_create_stores_tags(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.26.0.0/24").await?;
    let reqs: Vec<PortCreate> = (0..3)
        .map(|i| PortCreate {
            tags: vec!["kuryr.bulk".into(), format!("n{i}")],
            ..ctx.port_req(&net.id)
        })
        .collect();
    let ports = ctx.client.create_ports(&reqs).await?;
    for (i, p) in ports.iter().enumerate() {
        // neutron-server 29.0.0 with tag_ports_during_bulk_creation answers the stored tags.
        ensure!(
            sorted(&p.tags) == sorted(&["kuryr.bulk".into(), format!("n{i}")]),
            "bulk answer tags of port {i}: {:?}",
            p.tags
        );
        let got = ctx.client.get_port(&p.id).await?;
        ensure!(
            sorted(&got.tags) == sorted(&["kuryr.bulk".into(), format!("n{i}")]),
            "stored tags of port {i}: {:?}",
            got.tags
        );
    }
    Ok(())
}

async fn single_create_stores_tags(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.27.0.0/24").await?;
    let p = ctx
        .port(PortCreate {
            tags: vec!["single".into()],
            ..ctx.port_req(&net.id)
        })
        .await?;
    ensure!(p.tags == vec!["single".to_owned()], "answer tags {:?}", p.tags);
    let got = ctx.client.get_tags(Taggable::Port, &p.id).await?;
    ensure!(got == vec!["single".to_owned()], "stored tags {got:?}");
    Ok(())
}

// ------------------------------------------------------------------------------------------ filters

async fn filter_device_owner(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.28.0.0/24").await?;
    let owner = |o: &str| PortCreate {
        device_owner: Some(o.into()),
        ..ctx.port_req(&net.id)
    };
    let kuryr = ctx
        .client
        .create_ports(&[owner("compute:kuryr"), owner("compute:kuryr")])
        .await?;
    ctx.port(owner("compute:other")).await?;
    let got = ctx
        .client
        .list_ports(&ctx.project_filter().device_owner("compute:kuryr"))
        .await?;
    ensure!(
        ids(&got) == ids(&kuryr),
        "device_owner filter returned {:?}",
        ids(&got)
    );
    Ok(())
}

async fn filter_device_id(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.29.0.0/24").await?;
    let a = ctx
        .port(PortCreate {
            device_id: Some("pod-uid-a".into()),
            ..ctx.port_req(&net.id)
        })
        .await?;
    ctx.port(PortCreate {
        device_id: Some("pod-uid-b".into()),
        ..ctx.port_req(&net.id)
    })
    .await?;
    let got = ctx
        .client
        .list_ports(&ListFilter::new().device_id("pod-uid-a").project_id(&ctx.project))
        .await?;
    ensure!(
        got.len() == 1 && got[0].id == a.id,
        "device_id filter returned {:?}",
        ids(&got)
    );
    Ok(())
}

async fn filter_binding_host_id(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.30.0.0/24").await?;
    let bound = ctx
        .port(PortCreate {
            binding_host_id: Some(AGENT_HOST_2.into()),
            ..ctx.port_req(&net.id)
        })
        .await?;
    ensure!(
        bound.binding_host_id == AGENT_HOST_2,
        "host {:?}",
        bound.binding_host_id
    );
    ctx.port(ctx.port_req(&net.id)).await?;
    let got = ctx
        .client
        .list_ports(&ctx.project_filter().host_id(AGENT_HOST_2))
        .await?;
    ensure!(
        got.len() == 1 && got[0].id == bound.id,
        "binding:host_id filter returned {:?}",
        ids(&got)
    );
    Ok(())
}

async fn filter_fixed_ip_address(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, subnet) = ctx.network("10.31.0.0/24").await?;
    let p = ctx
        .port(PortCreate {
            fixed_ips: Some(vec![FixedIpRequest::address(&subnet.id, "10.31.0.77")]),
            ..ctx.port_req(&net.id)
        })
        .await?;
    ensure!(
        p.fixed_ips[0].ip_address == "10.31.0.77",
        "requested address not used: {:?}",
        p.fixed_ips
    );
    ctx.port(ctx.port_req(&net.id)).await?;
    let got = ctx
        .client
        .list_ports(&ctx.project_filter().fixed_ip_address("10.31.0.77"))
        .await?;
    ensure!(
        got.len() == 1 && got[0].id == p.id,
        "fixed_ips=ip_address filter returned {:?}",
        ids(&got)
    );
    let none = ctx
        .client
        .list_ports(&ctx.project_filter().fixed_ip_address("10.31.0.78"))
        .await?;
    ensure!(none.is_empty(), "unused address matched {:?}", ids(&none));
    Ok(())
}

async fn filter_fixed_ip_subnet(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, s1) = ctx.network("10.32.0.0/24").await?;
    let s2 = ctx.subnet(&net.id, "10.33.0.0/24").await?;
    let on = |s: &str| PortCreate {
        fixed_ips: Some(vec![FixedIpRequest::subnet(s)]),
        ..ctx.port_req(&net.id)
    };
    let a = ctx.client.create_ports(&[on(&s1.id), on(&s1.id)]).await?;
    let b = ctx.port(on(&s2.id)).await?;
    let got = ctx
        .client
        .list_ports(&ctx.project_filter().fixed_ip_subnet(&s1.id))
        .await?;
    ensure!(
        ids(&got) == ids(&a),
        "subnet {} filter returned {:?}",
        s1.id,
        ids(&got)
    );
    let got = ctx
        .client
        .list_ports(&ctx.project_filter().fixed_ip_subnet(&s2.id))
        .await?;
    ensure!(
        got.len() == 1 && got[0].id == b.id,
        "subnet {} filter returned {:?}",
        s2.id,
        ids(&got)
    );
    Ok(())
}

/// Ports tagged [x,y], [x], [z].
async fn tagged_trio(ctx: &Ctx, cidr: &str) -> anyhow::Result<(Port, Port, Port)> {
    let (net, _) = ctx.network(cidr).await?;
    let with = |t: &[&str]| PortCreate {
        tags: t.iter().map(|s| (*s).to_owned()).collect(),
        ..ctx.port_req(&net.id)
    };
    let ports = ctx
        .client
        .create_ports(&[with(&["x", "y"]), with(&["x"]), with(&["z"])])
        .await?;
    let [xy, x, z]: [Port; 3] = ports
        .try_into()
        .map_err(|v: Vec<Port>| anyhow!("bulk answered {} ports", v.len()))?;
    Ok((xy, x, z))
}

async fn filter_tags_all(ctx: &Ctx) -> anyhow::Result<()> {
    let (xy, x, _) = tagged_trio(ctx, "10.34.0.0/24").await?;
    let got = ctx
        .client
        .list_ports(&ctx.project_filter().tags(["x", "y"]))
        .await?;
    ensure!(
        got.len() == 1 && got[0].id == xy.id,
        "tags=x,y returned {:?}",
        ids(&got)
    );
    let got = ctx.client.list_ports(&ctx.project_filter().tags(["x"])).await?;
    ensure!(ids(&got) == ids(&[xy, x]), "tags=x returned {:?}", ids(&got));
    Ok(())
}

async fn filter_tags_any(ctx: &Ctx) -> anyhow::Result<()> {
    let (xy, _, z) = tagged_trio(ctx, "10.35.0.0/24").await?;
    let got = ctx
        .client
        .list_ports(&ctx.project_filter().tags_any(["y", "z"]))
        .await?;
    ensure!(
        ids(&got) == ids(&[xy, z]),
        "tags-any=y,z returned {:?}",
        ids(&got)
    );
    Ok(())
}

async fn filter_not_tags(ctx: &Ctx) -> anyhow::Result<()> {
    let (xy, x, z) = tagged_trio(ctx, "10.36.0.0/24").await?;
    let got = ctx
        .client
        .list_ports(&ctx.project_filter().not_tags(["y"]))
        .await?;
    ensure!(
        ids(&got) == ids(&[x.clone(), z.clone()]),
        "not-tags=y returned {:?}",
        ids(&got)
    );
    // not-tags=x,y excludes only ports carrying both.
    let got = ctx
        .client
        .list_ports(&ctx.project_filter().not_tags(["x", "y"]))
        .await?;
    ensure!(
        ids(&got) == ids(&[x, z.clone()]),
        "not-tags=x,y returned {:?}",
        ids(&got)
    );
    let got = ctx
        .client
        .list_ports(&ctx.project_filter().not_tags_any(["x", "q"]))
        .await?;
    ensure!(
        ids(&got) == ids(&[z]),
        "not-tags-any=x,q returned {:?}",
        ids(&got)
    );
    ensure!(
        !got.iter().any(|p| p.id == xy.id),
        "port tagged x,y matched not-tags-any=x"
    );
    Ok(())
}

async fn filter_network_id_and_fields(ctx: &Ctx) -> anyhow::Result<()> {
    let (n1, _) = ctx.network("10.37.0.0/24").await?;
    let (n2, _) = ctx.network("10.38.0.0/24").await?;
    let a = ctx
        .port(PortCreate {
            name: Some("on-n1".into()),
            ..ctx.port_req(&n1.id)
        })
        .await?;
    ctx.port(ctx.port_req(&n2.id)).await?;
    let got = ctx
        .client
        .list_ports(&ListFilter::new().network_id(&n1.id).fields(["id", "name"]))
        .await?;
    ensure!(
        got.len() == 1 && got[0].id == a.id && got[0].name == "on-n1",
        "network_id filter: {got:?}"
    );
    // Only the requested fields come back.
    ensure!(
        got[0].mac_address.is_empty() && got[0].fixed_ips.is_empty() && got[0].network_id.is_empty(),
        "fields=id,name returned more: {:?}",
        got[0]
    );
    let (status, body) = ctx
        .raw_json(
            Method::GET,
            &format!("/ports?network_id={}&fields=id&fields=status", n1.id),
            None,
        )
        .await?;
    ensure!(status == 200, "raw list status {status}");
    let keys: BTreeSet<String> = body["ports"][0]
        .as_object()
        .ok_or_else(|| anyhow!("no ports[0] object in {body}"))?
        .keys()
        .cloned()
        .collect();
    ensure!(
        keys == BTreeSet::from(["id".to_owned(), "status".to_owned()]),
        "fields gave keys {keys:?}"
    );
    Ok(())
}

async fn pagination_limit_and_marker(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.39.0.0/24").await?;
    let created = ctx.client.create_ports(&vec![ctx.port_req(&net.id); 5]).await?;
    let f = ctx.project_filter().limit(2);
    let mut seen = Vec::new();
    let mut marker: Option<String> = None;
    let mut sizes = Vec::new();
    for _ in 0..10 {
        let page = ctx.client.list_ports_page(&f, marker.as_deref()).await?;
        sizes.push(page.items.len());
        seen.extend(page.items);
        match page.next_marker {
            Some(m) => marker = Some(m),
            None => break,
        }
    }
    ensure!(sizes.starts_with(&[2, 2, 1]), "page sizes {sizes:?}");
    ensure!(
        sizes.len() == 3,
        "a short page must not announce a next page: sizes {sizes:?}"
    );
    ensure!(
        seen.len() == 5 && ids(&seen) == ids(&created),
        "pages gave {:?}",
        ids(&seen)
    );
    let all = ctx.client.list_ports(&f).await?;
    ensure!(
        ids(&all) == ids(&created),
        "automatic pagination gave {} ports",
        all.len()
    );
    // Raw shape: ports_links with rel=next carrying a marker.
    let (_, body) = ctx
        .raw_json(
            Method::GET,
            &format!("/ports?project_id={}&limit=2", ctx.project),
            None,
        )
        .await?;
    let links = body["ports_links"]
        .as_array()
        .ok_or_else(|| anyhow!("no ports_links in {body}"))?;
    let next = links
        .iter()
        .find(|l| l["rel"] == "next")
        .ok_or_else(|| anyhow!("no rel=next link in {links:?}"))?;
    let href = next["href"].as_str().unwrap_or_default();
    ensure!(
        href.contains("marker=") && href.contains("limit=2"),
        "next href {href}"
    );
    Ok(())
}

// ------------------------------------------------------------------------------------------ tags, updates

async fn tags_add_replace_remove(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.40.0.0/24").await?;
    let p = ctx.port(ctx.port_req(&net.id)).await?;
    let c = &ctx.client;
    c.add_tag(Taggable::Port, &p.id, "kuryr.cluster-a").await?;
    c.add_tag(Taggable::Port, &p.id, "kuryr.cluster-a").await?; // idempotent
    ensure!(c.get_tags(Taggable::Port, &p.id).await? == vec!["kuryr.cluster-a".to_owned()]);
    let replaced = c.replace_tags(Taggable::Port, &p.id, &["t1", "t2"]).await?;
    ensure!(
        sorted(&replaced) == vec!["t1".to_owned(), "t2".to_owned()],
        "replace answered {replaced:?}"
    );
    c.remove_tag(Taggable::Port, &p.id, "t2").await?;
    ensure!(c.get_tags(Taggable::Port, &p.id).await? == vec!["t1".to_owned()]);
    let e = c
        .remove_tag(Taggable::Port, &p.id, "t2")
        .await
        .err()
        .ok_or_else(|| anyhow!("removing a missing tag succeeded"))?;
    ensure!(
        e.status() == Some(404) && e.kind().map(|k| k.as_str()) == Some("TagNotFound"),
        "missing tag: {e}"
    );
    let got = c.get_port(&p.id).await?;
    ensure!(got.tags == vec!["t1".to_owned()], "port.tags {:?}", got.tags);
    c.remove_all_tags(Taggable::Port, &p.id).await?;
    ensure!(c.get_tags(Taggable::Port, &p.id).await?.is_empty());
    Ok(())
}

async fn tags_on_network_subnet_and_trunk(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, subnet) = ctx.network("10.41.0.0/24").await?;
    let c = &ctx.client;
    c.add_tag(Taggable::Network, &net.id, "kuryr.net").await?;
    c.add_tag(Taggable::Subnet, &subnet.id, "kuryr.subnet").await?;
    let parent = ctx.port(ctx.port_req(&net.id)).await?;
    let trunk = c
        .create_trunk(&TrunkCreate {
            port_id: parent.id.clone(),
            project_id: Some(ctx.project.clone()),
            ..TrunkCreate::default()
        })
        .await?;
    c.replace_tags(Taggable::Trunk, &trunk.id, &["kuryr.trunk"])
        .await?;
    let nets = c.list_networks(&ctx.project_filter().tags(["kuryr.net"])).await?;
    ensure!(
        nets.len() == 1 && nets[0].id == net.id,
        "network tag filter: {nets:?}"
    );
    let subs = c
        .list_subnets(&ctx.project_filter().tags(["kuryr.subnet"]))
        .await?;
    ensure!(
        subs.len() == 1 && subs[0].id == subnet.id,
        "subnet tag filter: {subs:?}"
    );
    ensure!(c.get_trunk(&trunk.id).await?.tags == vec!["kuryr.trunk".to_owned()]);
    Ok(())
}

async fn update_port_attributes(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.42.0.0/24").await?;
    let p = ctx.port(ctx.port_req(&net.id)).await?;
    let sg = ctx
        .client
        .create_security_group(&SecurityGroupCreate {
            name: "pod-sg".into(),
            project_id: Some(ctx.project.clone()),
            ..SecurityGroupCreate::default()
        })
        .await?;
    let upd = PortUpdate {
        name: Some("default/nginx-1".into()),
        device_id: Some("pod-uid-1234".into()),
        device_owner: Some("compute:kuryr".into()),
        security_groups: Some(vec![sg.id.clone()]),
        allowed_address_pairs: Some(vec![AllowedAddressPair {
            ip_address: "10.42.0.250".into(),
            mac_address: None,
        }]),
        admin_state_up: Some(false),
        ..PortUpdate::default()
    };
    let u = ctx.client.update_port(&p.id, &upd).await?;
    ensure!(
        u.name == "default/nginx-1" && u.device_id == "pod-uid-1234" && u.device_owner == "compute:kuryr",
        "{u:?}"
    );
    ensure!(
        u.security_groups == vec![sg.id.clone()],
        "security_groups {:?}",
        u.security_groups
    );
    ensure!(
        u.allowed_address_pairs.len() == 1
            && u.allowed_address_pairs[0].ip_address == "10.42.0.250"
            && u.allowed_address_pairs[0].mac_address.as_deref() == Some(p.mac_address.as_str()),
        "allowed_address_pairs (mac defaults to the port's): {:?}",
        u.allowed_address_pairs
    );
    ensure!(!u.admin_state_up, "admin_state_up");
    ensure!(
        u.revision_number > p.revision_number,
        "revision {} -> {}",
        p.revision_number,
        u.revision_number
    );
    let got = ctx.client.get_port(&p.id).await?;
    ensure!(
        got.name == u.name && got.security_groups == u.security_groups && !got.admin_state_up,
        "{got:?}"
    );
    Ok(())
}

async fn update_with_stale_revision_is_412(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.43.0.0/24").await?;
    let p = ctx.port(ctx.port_req(&net.id)).await?;
    let upd = PortUpdate {
        name: Some("x".into()),
        ..PortUpdate::default()
    };
    let stale = p.revision_number + 5;
    let e = expect_api_error(
        ctx.client.update_port_if_revision(&p.id, &upd, stale).await,
        ErrorKind::RevisionNumberConstraintFailed,
        412,
    )?;
    let msg = e.api().map(|a| a.message.clone()).unwrap_or_default();
    ensure!(
        msg.contains(&stale.to_string()),
        "message names the revision: {msg}"
    );
    ensure!(
        ctx.client.get_port(&p.id).await?.name.is_empty(),
        "a refused update changed the port"
    );
    let ok = ctx
        .client
        .update_port_if_revision(&p.id, &upd, p.revision_number)
        .await?;
    ensure!(ok.name == "x" && ok.revision_number > p.revision_number, "{ok:?}");
    Ok(())
}

async fn unrecognized_attribute_is_400(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.44.0.0/24").await?;
    let (status, body) = ctx
        .raw_json(
            Method::POST,
            "/ports",
            Some(json!({"port": {"network_id": net.id, "project_id": ctx.project, "bogus": 1}})),
        )
        .await?;
    ensure!(status == 400, "status {status}: {body}");
    let msg = body["NeutronError"]["message"].as_str().unwrap_or_default();
    ensure!(
        msg.contains("Unrecognized attribute(s) 'bogus'"),
        "message {msg:?}"
    );
    ensure!(
        body["NeutronError"]["type"] == "HTTPBadRequest",
        "type {}",
        body["NeutronError"]["type"]
    );
    ensure!(
        ctx.project_ports().await?.is_empty(),
        "rejected create left a port"
    );
    Ok(())
}

// ------------------------------------------------------------------------------------------ trunks

async fn trunk_fixture(ctx: &Ctx, cidr: &str, subports: usize) -> anyhow::Result<(Port, Vec<Port>)> {
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

async fn trunk_create_on_unbound_parent(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, _) = trunk_fixture(ctx, "10.45.0.0/24", 0).await?;
    let t = ctx
        .client
        .create_trunk(&TrunkCreate {
            port_id: parent.id.clone(),
            name: Some("vm-trunk".into()),
            project_id: Some(ctx.project.clone()),
            ..TrunkCreate::default()
        })
        .await?;
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
        ctx.client
            .create_trunk(&TrunkCreate {
                port_id: MISSING.into(),
                project_id: Some(ctx.project.clone()),
                ..TrunkCreate::default()
            })
            .await,
        ErrorKind::PortNotFound,
        404,
    )?;
    ctx.client.delete_trunk(&t.id).await?;
    expect_api_error(ctx.client.get_trunk(&t.id).await, ErrorKind::TrunkNotFound, 404)?;
    Ok(())
}

async fn trunk_create_with_subports(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, subs) = trunk_fixture(ctx, "10.46.0.0/24", 1).await?;
    let t = ctx
        .client
        .create_trunk(&TrunkCreate {
            port_id: parent.id.clone(),
            project_id: Some(ctx.project.clone()),
            sub_ports: vec![SubPort::vlan(&subs[0].id, 10)],
            ..TrunkCreate::default()
        })
        .await?;
    ensure!(
        t.sub_ports == vec![SubPort::vlan(&subs[0].id, 10)],
        "sub_ports {:?}",
        t.sub_ports
    );
    Ok(())
}

async fn trunk_on_bound_parent_is_parent_port_in_use(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.47.0.0/24").await?;
    let bound = ctx
        .port(PortCreate {
            binding_host_id: Some(AGENT_HOST.into()),
            ..ctx.port_req(&net.id)
        })
        .await?;
    expect_api_error(
        ctx.client
            .create_trunk(&TrunkCreate {
                port_id: bound.id.clone(),
                project_id: Some(ctx.project.clone()),
                ..TrunkCreate::default()
            })
            .await,
        ErrorKind::ParentPortInUse,
        409,
    )?;
    ensure!(
        ctx.client.list_trunks(&ctx.project_filter()).await?.is_empty(),
        "trunk created anyway"
    );
    Ok(())
}

async fn trunk_get_missing_is_trunk_not_found(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn new_trunk(ctx: &Ctx, parent: &Port) -> anyhow::Result<kuryr_neutron::Trunk> {
    Ok(ctx
        .client
        .create_trunk(&TrunkCreate {
            port_id: parent.id.clone(),
            name: Some("vm-trunk".into()),
            project_id: Some(ctx.project.clone()),
            ..TrunkCreate::default()
        })
        .await?)
}

async fn trunk_add_and_remove_subports(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn trunk_duplicate_subport(ctx: &Ctx) -> anyhow::Result<()> {
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
async fn subport_with_device_id_is_port_in_use(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn trunk_vlan_out_of_range_is_invalid_input(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn delete_subport_port_is_port_in_use_as_subport(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn parent_port_has_trunk_details(ctx: &Ctx) -> anyhow::Result<()> {
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

// ------------------------------------------------------------------------------------------ quotas, IPAM

async fn quota_details_shape_and_usage(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.53.0.0/24").await?;
    ctx.client.create_ports(&vec![ctx.port_req(&net.id); 3]).await?;
    let q = ctx.client.get_quota_details(&ctx.project).await?;
    for r in [
        "network",
        "subnet",
        "port",
        "router",
        "security_group",
        "security_group_rule",
        "subnetpool",
        "trunk",
    ] {
        ensure!(q.get(r).is_some(), "quota details lack {r:?}: {q:?}");
    }
    let port = q.get("port").copied().unwrap_or_default();
    ensure!(
        port.limit == 500 && port.used == 3 && port.reserved == 0,
        "port quota {port:?}"
    );
    let netq = q.get("network").copied().unwrap_or_default();
    ensure!(netq.limit == 100 && netq.used == 1, "network quota {netq:?}");
    let subq = q.get("subnet").copied().unwrap_or_default();
    ensure!(subq.limit == 100 && subq.used == 1, "subnet quota {subq:?}");
    ensure!(
        q.get("security_group").map(|s| s.limit) == Some(10),
        "security_group limit"
    );
    ensure!(
        q.get("security_group_rule").map(|s| s.limit) == Some(100),
        "security_group_rule limit"
    );
    ensure!(q.get("trunk").map(|s| s.limit) == Some(-1), "trunk limit");
    Ok(())
}

async fn quota_exhaustion_is_over_quota(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.54.0.0/24").await?;
    let limits = ctx
        .client
        .update_quota(
            &ctx.project,
            &QuotaUpdate {
                port: Some(2),
                ..QuotaUpdate::default()
            },
        )
        .await?;
    ensure!(limits.get("port") == Some(&2), "update_quota answered {limits:?}");
    ensure!(
        limits.get("network") == Some(&100),
        "other limits unchanged: {limits:?}"
    );
    ctx.port(ctx.port_req(&net.id)).await?;
    ctx.port(ctx.port_req(&net.id)).await?;
    let e = expect_api_error(
        ctx.client.create_port(&ctx.port_req(&net.id)).await,
        ErrorKind::OverQuota,
        409,
    )?;
    ensure!(!e.is_transient(), "OverQuota is not transient");
    let q = ctx.client.get_quota_details(&ctx.project).await?;
    ensure!(q.get("port").map(|p| (p.limit, p.used)) == Some((2, 2)), "{q:?}");
    ctx.client.reset_quota(&ctx.project).await?;
    ensure!(
        ctx.client
            .get_quota_details(&ctx.project)
            .await?
            .get("port")
            .map(|p| p.limit)
            == Some(500)
    );
    Ok(())
}

async fn ip_exhaustion_on_tiny_subnet(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn network_ip_availability_counts(ctx: &Ctx) -> anyhow::Result<()> {
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

// ------------------------------------------------------------------------------------------ SGs, routers, pools

async fn security_groups_and_rules(ctx: &Ctx) -> anyhow::Result<()> {
    let c = &ctx.client;
    let sg = c
        .create_security_group(&SecurityGroupCreate {
            name: "pod-sg".into(),
            project_id: Some(ctx.project.clone()),
            description: Some("contract".into()),
            ..SecurityGroupCreate::default()
        })
        .await?;
    ensure!(sg.name == "pod-sg" && sg.project_id == ctx.project, "{sg:?}");
    // A new group allows all egress (IPv4 and IPv6).
    let egress: BTreeSet<&str> = sg
        .security_group_rules
        .iter()
        .filter(|r| r.direction == "egress")
        .map(|r| r.ethertype.as_str())
        .collect();
    ensure!(
        sg.security_group_rules.len() == 2 && egress == BTreeSet::from(["IPv4", "IPv6"]),
        "default rules {:?}",
        sg.security_group_rules
    );
    let rule = c
        .create_security_group_rule(&SecurityGroupRuleCreate {
            security_group_id: sg.id.clone(),
            direction: "ingress".into(),
            ethertype: Some("IPv4".into()),
            protocol: Some("tcp".into()),
            port_range_min: Some(8080),
            port_range_max: Some(8080),
            remote_ip_prefix: Some("10.57.0.0/22".into()),
            project_id: Some(ctx.project.clone()),
            ..SecurityGroupRuleCreate::default()
        })
        .await?;
    ensure!(
        rule.security_group_id == sg.id
            && rule.protocol.as_deref() == Some("tcp")
            && rule.port_range_min == Some(8080)
            && rule.remote_ip_prefix.as_deref() == Some("10.57.0.0/22")
            && rule.project_id == ctx.project,
        "{rule:?}"
    );
    let rules = c
        .list_security_group_rules(&ListFilter::new().security_group_id(&sg.id))
        .await?;
    ensure!(rules.len() == 3, "rules {rules:?}");
    let got = c.get_security_group(&sg.id).await?;
    ensure!(
        got.security_group_rules.len() == 3,
        "group shows {} rules",
        got.security_group_rules.len()
    );
    c.delete_security_group_rule(&rule.id).await?;
    ensure!(
        c.list_security_group_rules(&ListFilter::new().security_group_id(&sg.id))
            .await?
            .len()
            == 2
    );
    let listed = c
        .list_security_groups(&ctx.project_filter().name("pod-sg"))
        .await?;
    ensure!(
        listed.len() == 1 && listed[0].id == sg.id,
        "list by name: {listed:?}"
    );
    c.delete_security_group(&sg.id).await?;
    let e = c
        .get_security_group(&sg.id)
        .await
        .err()
        .ok_or_else(|| anyhow!("deleted group still there"))?;
    ensure!(e.status() == Some(404), "{e}");
    Ok(())
}

async fn router_add_and_remove_interface(ctx: &Ctx) -> anyhow::Result<()> {
    let (_, subnet) = ctx.network("10.58.0.0/24").await?;
    let r = ctx
        .client
        .create_router(&RouterCreate {
            name: Some("r".into()),
            project_id: Some(ctx.project.clone()),
            ..RouterCreate::default()
        })
        .await?;
    ensure!(r.project_id == ctx.project && r.admin_state_up, "{r:?}");
    let spec = RouterInterfaceSpec::Subnet {
        subnet_id: subnet.id.clone(),
    };
    let iface = ctx.client.add_router_interface(&r.id, &spec).await?;
    ensure!(
        iface.id == r.id && iface.subnet_id == subnet.id && !iface.port_id.is_empty(),
        "{iface:?}"
    );
    let port = ctx.client.get_port(&iface.port_id).await?;
    ensure!(
        port.device_owner == "network:router_interface" && port.device_id == r.id,
        "interface port {port:?}"
    );
    ensure!(
        port.fixed_ips.first().map(|f| f.ip_address.as_str()) == Some("10.58.0.1"),
        "interface takes the gateway address: {:?}",
        port.fixed_ips
    );
    let removed = ctx.client.remove_router_interface(&r.id, &spec).await?;
    ensure!(removed.port_id == iface.port_id, "{removed:?}");
    expect_api_error(
        ctx.client.get_port(&iface.port_id).await,
        ErrorKind::PortNotFound,
        404,
    )?;
    ctx.client.delete_router(&r.id).await?;
    Ok(())
}

async fn subnetpool_allocation(ctx: &Ctx) -> anyhow::Result<()> {
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

// ------------------------------------------------------------------------------------------ binding, ACTIVE

async fn ports_bound_to_agent_host_become_active(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn binding_by_update_becomes_active_and_unbinding_goes_down(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn binding_to_host_without_agent_fails(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn trunk_subports_become_active(ctx: &Ctx) -> anyhow::Result<()> {
    let (parent, subs) = trunk_fixture(ctx, "10.62.0.0/24", 2).await?;
    let t = ctx
        .client
        .create_trunk(&TrunkCreate {
            port_id: parent.id.clone(),
            project_id: Some(ctx.project.clone()),
            sub_ports: vec![SubPort::vlan(&subs[0].id, 10)],
            ..TrunkCreate::default()
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

// ------------------------------------------------------------------------------------------ provider networks, SR-IOV

/// The physnet the NIC Switch agents map (and that has a VLAN range).
const SRIOV_PHYSNET: &str = "physnet2";

/// An admin-created VLAN network on `physnet`, VLAN allocated by Neutron, in this case's project.
async fn vlan_network(ctx: &Ctx, physnet: &str) -> anyhow::Result<kuryr_neutron::Network> {
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

async fn provider_networks_flat_and_vlan(ctx: &Ctx) -> anyhow::Result<()> {
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

async fn direct_port_on_physnet_host_is_hw_veb_and_goes_active(ctx: &Ctx) -> anyhow::Result<()> {
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
