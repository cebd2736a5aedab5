//! Quotas: details shape, usage and exhaustion.

use anyhow::ensure;
use kuryr_neutron::{ErrorKind, QuotaUpdate};

use crate::Ctx;
use crate::ctx::expect_api_error;

pub(super) async fn quota_details_shape_and_usage(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn quota_exhaustion_is_over_quota(ctx: &Ctx) -> anyhow::Result<()> {
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
