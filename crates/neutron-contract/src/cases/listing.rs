//! List filters (attributes, fixed IPs, tags), field selection and pagination.

use std::collections::BTreeSet;

use anyhow::{anyhow, ensure};
use kuryr_neutron::{FixedIpRequest, ListFilter, Port, PortCreate};
use reqwest::Method;

use super::{AGENT_HOST_2, ids};
use crate::Ctx;

pub(super) async fn filter_device_owner(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn filter_device_id(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn filter_binding_host_id(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn filter_fixed_ip_address(ctx: &Ctx) -> anyhow::Result<()> {
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
    // Another port on an address of its own: one left to Neutron's IPAM could be given .78, the
    // address this case needs unused (neutron-server allocates at random).
    ctx.port(PortCreate {
        fixed_ips: Some(vec![FixedIpRequest::address(&subnet.id, "10.31.0.177")]),
        ..ctx.port_req(&net.id)
    })
    .await?;
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

pub(super) async fn filter_fixed_ip_subnet(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn filter_tags_all(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn filter_tags_any(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn filter_not_tags(ctx: &Ctx) -> anyhow::Result<()> {
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

/// The controller's shared ACTIVE check: one list call names many ports by id (`id=a&id=b...`,
/// a chunk of 64 ids: about 2.5 KiB of query) and gets exactly those that exist back.
pub(super) async fn filter_several_ids(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.139.0.0/24").await?;
    let a = ctx.port(ctx.port_req(&net.id)).await?;
    let b = ctx.port(ctx.port_req(&net.id)).await?;
    ctx.port(ctx.port_req(&net.id)).await?;
    let mut filter = ListFilter::new().id(&a.id).id(&b.id);
    // Ids of ports that do not exist (deleted meanwhile) are simply not in the answer.
    for _ in 0..62 {
        filter = filter.id(uuid::Uuid::new_v4().to_string());
    }
    let got = ctx.client.list_ports(&filter.fields(["id", "status"])).await?;
    let ids: BTreeSet<&str> = got.iter().map(|p| p.id.as_str()).collect();
    ensure!(
        ids == BTreeSet::from([a.id.as_str(), b.id.as_str()]),
        "id=a&id=b (+62 unknown) gave {ids:?}"
    );
    ensure!(
        got.iter().all(|p| !p.status.is_empty()),
        "status missing: {got:?}"
    );
    Ok(())
}

pub(super) async fn filter_network_id_and_fields(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn pagination_limit_and_marker(ctx: &Ctx) -> anyhow::Result<()> {
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
