//! Quotas, providers and amphora records.

use anyhow::{anyhow, ensure};
use kuryr_neutron::ListFilter;
use kuryr_neutron::octavia::Quota;

use crate::Ctx;

pub(super) async fn quota_get_set_reset(ctx: &Ctx) -> anyhow::Result<()> {
    let c = &ctx.client;
    let q = c.get_quota(&ctx.project).await?;
    ensure!(
        q.load_balancer == Some(-1) && q.listener == Some(-1) && q.member == Some(-1),
        "default quota is unlimited: {q:?}"
    );
    let set = c
        .update_quota(
            &ctx.project,
            &Quota {
                load_balancer: Some(1),
                member: Some(50),
                ..Quota::default()
            },
        )
        .await?;
    ensure!(
        set.load_balancer == Some(1) && set.member == Some(50),
        "set: {set:?}"
    );
    ensure!(set.pool == Some(-1), "unset fields keep the default: {set:?}");
    ensure!(c.get_quota(&ctx.project).await? == set, "read back");
    // auth_strategy = noauth makes every caller admin, and Octavia enforces no quota then: a second load balancer
    // over a quota of 1 is still created.
    c.create_load_balancer(&ctx.lb_req("q1")).await?;
    c.create_load_balancer(&ctx.lb_req("q2")).await?;
    ensure!(c.list_load_balancers(&ctx.project_filter()).await?.len() == 2);
    c.reset_quota(&ctx.project).await?;
    let q = c.get_quota(&ctx.project).await?;
    ensure!(
        q.load_balancer == Some(-1) && q.member == Some(-1),
        "reset: {q:?}"
    );
    Ok(())
}

pub(super) async fn providers_and_amphora_records(ctx: &Ctx) -> anyhow::Result<()> {
    let providers = ctx.client.list_providers().await?;
    let names: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
    ensure!(names.contains(&"amphora"), "providers {names:?}");
    ensure!(
        providers.iter().all(|p| !p.description.is_empty()),
        "every provider has a description: {providers:?}"
    );
    let lb = ctx.active_lb(&ctx.lb_req("amp")).await?;
    let amps = ctx
        .client
        .list_amphorae(&ListFilter::new().eq("loadbalancer_id", &lb.id))
        .await?;
    let [amp] = amps.as_slice() else {
        return Err(anyhow!("one amphora per SINGLE-topology load balancer: {amps:?}"));
    };
    ensure!(amp.status == "ALLOCATED", "amphora status {}", amp.status);
    ensure!(amp.role.as_deref() == Some("STANDALONE"), "role {:?}", amp.role);
    ensure!(
        amp.ha_ip.as_deref() == lb.vip_address.as_deref(),
        "the amphora holds the VIP: {:?} vs {:?}",
        amp.ha_ip,
        lb.vip_address
    );
    Ok(())
}
