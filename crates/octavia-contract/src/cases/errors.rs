//! Error answers: 404 shapes on every resource, 400 validation.

use anyhow::ensure;
use kuryr_neutron::octavia::{ListenerCreate, OctaviaErrorKind, PoolCreate};

use super::MISSING;
use crate::Ctx;
use crate::ctx::expect_error;

pub(super) async fn not_found_shapes(ctx: &Ctx) -> anyhow::Result<()> {
    let c = &ctx.client;
    let nf = |k: &OctaviaErrorKind| *k == OctaviaErrorKind::NotFound;
    let e = expect_error(
        "get missing load balancer",
        c.get_load_balancer(MISSING).await,
        404,
        nf,
    )?;
    let api = e.api().ok_or_else(|| anyhow::anyhow!("api error"))?;
    ensure!(
        api.message == format!("Load Balancer {MISSING} not found."),
        "faultstring: {:?}",
        api.message
    );
    ensure!(
        api.faultcode.as_deref() == Some("Client"),
        "faultcode {:?}",
        api.faultcode
    );
    ensure!(
        e.request_id().is_some_and(|r| r.starts_with("req-")),
        "request id {:?}",
        e.request_id()
    );
    expect_error("status of missing", c.get_status_tree(MISSING).await, 404, nf)?;
    let e = expect_error("get missing listener", c.get_listener(MISSING).await, 404, nf)?;
    ensure!(
        e.api()
            .is_some_and(|a| a.message == format!("Listener {MISSING} not found.")),
        "{e}"
    );
    let e = expect_error("get missing pool", c.get_pool(MISSING).await, 404, nf)?;
    ensure!(
        e.api()
            .is_some_and(|a| a.message == format!("Pool {MISSING} not found.")),
        "{e}"
    );
    expect_error(
        "get missing health monitor",
        c.get_health_monitor(MISSING).await,
        404,
        nf,
    )?;
    expect_error(
        "members of missing pool",
        c.list_members(MISSING, &Default::default()).await,
        404,
        nf,
    )?;
    expect_error(
        "delete missing load balancer",
        c.delete_load_balancer(MISSING, true).await,
        404,
        nf,
    )?;
    expect_error("delete missing pool", c.delete_pool(MISSING).await, 404, nf)?;
    Ok(())
}

pub(super) async fn invalid_input_is_400_validation(ctx: &Ctx) -> anyhow::Result<()> {
    let lb = ctx.active_lb(&ctx.lb_req("invalid")).await?;
    let c = &ctx.client;
    let v = |k: &OctaviaErrorKind| *k == OctaviaErrorKind::Validation;
    let e = expect_error(
        "listener protocol FOO",
        c.create_listener(&ListenerCreate {
            loadbalancer_id: Some(lb.id.clone()),
            ..ListenerCreate::new("FOO", 80)
        })
        .await,
        400,
        v,
    )?;
    ensure!(
        e.api().is_some_and(|a| a
            .message
            .starts_with("Invalid input for field/attribute protocol")),
        "{e}"
    );
    expect_error(
        "pool without listener or load balancer",
        c.create_pool(&PoolCreate::new("TCP", "ROUND_ROBIN")).await,
        400,
        v,
    )?;
    let mut unnamed = ctx.populated_req("unnamed", 80, &[("10.0.0.9", 80)]);
    if let Some(pool) = unnamed
        .listeners
        .first_mut()
        .and_then(|l| l.default_pool.as_mut())
    {
        pool.name = None;
    }
    let e = expect_error(
        "fully populated create with an unnamed pool",
        c.create_load_balancer(&unnamed).await,
        400,
        v,
    )?;
    ensure!(
        e.api().is_some_and(|a| a.message.contains("Pools must be named")),
        "{e}"
    );
    expect_error(
        "unknown provider",
        c.create_load_balancer(&kuryr_neutron::octavia::LoadBalancerCreate {
            provider: Some("no-such-provider".into()),
            ..ctx.lb_req("badprov")
        })
        .await,
        400,
        v,
    )?;
    Ok(())
}
