//! The tags API on every taggable resource.

use anyhow::{anyhow, ensure};
use kuryr_neutron::Taggable;

use super::sorted;
use crate::Ctx;

pub(super) async fn tags_add_replace_remove(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn tags_on_network_subnet_and_trunk(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, subnet) = ctx.network("10.41.0.0/24").await?;
    let c = &ctx.client;
    c.add_tag(Taggable::Network, &net.id, "kuryr.net").await?;
    c.add_tag(Taggable::Subnet, &subnet.id, "kuryr.subnet").await?;
    let parent = ctx.port(ctx.port_req(&net.id)).await?;
    let trunk = c.create_trunk(&ctx.trunk_req(&parent.id)).await?;
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
