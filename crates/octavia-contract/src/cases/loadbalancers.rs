//! Load balancers and listeners: fully populated create, status tree, adding to an ACTIVE load balancer, the 409
//! while PENDING_*, cascade delete, tags.

use std::collections::BTreeSet;

use anyhow::{Context as _, anyhow, ensure};
use kuryr_neutron::ListFilter;
use kuryr_neutron::octavia::{
    ListenerCreate, OctaviaClient, OctaviaErrorKind, PoolCreate, Provisioning, ResourceUpdate, WaitOptions,
};

use crate::Ctx;
use crate::ctx::expect_error;

pub(super) async fn fully_populated_create_reaches_active_with_status_tree(ctx: &Ctx) -> anyhow::Result<()> {
    let req = ctx.populated_req("full", 80, &[("10.0.0.5", 8080), ("10.0.0.6", 8080)]);
    let created = ctx.client.create_load_balancer(&req).await?;
    ensure!(
        created.provisioning_status == "PENDING_CREATE",
        "a new load balancer is PENDING_CREATE, got {}",
        created.provisioning_status
    );
    ensure!(
        created.project_id == ctx.project,
        "project_id {}",
        created.project_id
    );
    ensure!(
        created.listeners.len() == 1 && created.pools.len() == 1,
        "create answer lists the children: {created:?}"
    );
    ensure!(
        created.vip_address.is_some(),
        "a VIP address is allocated at once"
    );
    ensure!(
        created.provider.as_deref() == Some("amphora"),
        "default provider: {:?}",
        created.provider
    );
    let lb = ctx
        .client
        .wait_for_provisioning(&created.id, Provisioning::Active)
        .await?
        .ok_or_else(|| anyhow!("vanished"))?;
    ensure!(lb.provisioning_status == "ACTIVE");
    let tree = ctx.client.get_status_tree(&lb.id).await?;
    ensure!(tree.loadbalancer.id == lb.id);
    let not_active: Vec<_> = tree
        .provisioning_statuses()
        .into_iter()
        .filter(|(_, s)| s != "ACTIVE")
        .collect();
    ensure!(
        not_active.is_empty(),
        "everything ACTIVE in the tree: {not_active:?}"
    );
    let [listener] = tree.loadbalancer.listeners.as_slice() else {
        return Err(anyhow!("one listener in the tree: {tree:?}"));
    };
    ensure!(listener.id == created.listeners[0].id, "tree listener id");
    let [pool] = listener.pools.as_slice() else {
        return Err(anyhow!("one pool under the listener: {tree:?}"));
    };
    ensure!(pool.id == created.pools[0].id, "tree pool id");
    let hm = pool
        .health_monitor
        .as_ref()
        .ok_or_else(|| anyhow!("pool has its monitor"))?;
    ensure!(hm.monitor_type == "TCP", "monitor type {}", hm.monitor_type);
    let addrs: BTreeSet<_> = pool
        .members
        .iter()
        .map(|m| format!("{}:{}", m.address, m.protocol_port))
        .collect();
    ensure!(
        addrs == BTreeSet::from(["10.0.0.5:8080".to_owned(), "10.0.0.6:8080".to_owned()]),
        "members {addrs:?}"
    );
    // Without a health manager nothing reports health: operating status stays OFFLINE.
    ensure!(
        tree.loadbalancer.operating_status == "OFFLINE",
        "{}",
        tree.loadbalancer.operating_status
    );
    let l = ctx.client.get_listener(&listener.id).await?;
    ensure!(
        l.protocol == "TCP"
            && l.protocol_port == 80
            && l.default_pool_id.as_deref() == Some(pool.id.as_str())
    );
    let p = ctx.client.get_pool(&pool.id).await?;
    ensure!(p.lb_algorithm == "ROUND_ROBIN" && p.healthmonitor_id.as_deref() == Some(hm.id.as_str()));
    ensure!(p.members.len() == 2, "pool.members {:?}", p.members);
    Ok(())
}

pub(super) async fn listener_and_pool_added_to_active_lb(ctx: &Ctx) -> anyhow::Result<()> {
    let lb = ctx.active_lb(&ctx.lb_req("bare")).await?;
    ensure!(lb.listeners.is_empty() && lb.pools.is_empty());
    let l = ctx
        .client
        .create_listener(&ListenerCreate {
            loadbalancer_id: Some(lb.id.clone()),
            name: Some("http".into()),
            ..ListenerCreate::new("HTTP", 8080)
        })
        .await?;
    ensure!(
        l.provisioning_status == "PENDING_CREATE",
        "{}",
        l.provisioning_status
    );
    // The pool is sent while the listener's create is still PENDING: the client waits for the load balancer.
    let p = ctx
        .client
        .create_pool(&PoolCreate {
            listener_id: Some(l.id.clone()),
            ..PoolCreate::new("HTTP", "LEAST_CONNECTIONS")
        })
        .await?;
    ctx.client
        .wait_for_provisioning(&lb.id, Provisioning::Active)
        .await?;
    let l = ctx.client.get_listener(&l.id).await?;
    ensure!(
        l.default_pool_id.as_deref() == Some(p.id.as_str()),
        "pool became the listener's default"
    );
    ensure!(l.loadbalancers.iter().any(|r| r.id == lb.id));
    let lb = ctx.client.get_load_balancer(&lb.id).await?;
    ensure!(lb.listeners.len() == 1 && lb.pools.len() == 1, "{lb:?}");
    let listeners = ctx
        .client
        .list_listeners(&ListFilter::new().eq("loadbalancer_id", &lb.id))
        .await?;
    ensure!(listeners.len() == 1 && listeners[0].id == l.id);
    // A second listener on the same port is a conflict, not a busy load balancer.
    let dup = ctx
        .client
        .create_listener(&ListenerCreate {
            loadbalancer_id: Some(lb.id.clone()),
            ..ListenerCreate::new("HTTP", 8080)
        })
        .await;
    expect_error("duplicate listener port", dup, 409, |k| {
        *k == OctaviaErrorKind::Conflict
    })?;
    Ok(())
}

pub(super) async fn write_while_pending_is_409_and_the_client_waits(ctx: &Ctx) -> anyhow::Result<()> {
    let lb = ctx.client.create_load_balancer(&ctx.lb_req("busy")).await?;
    // A client that never waits shows Octavia's raw answer while the create is in progress.
    let impatient = OctaviaClient::new(&kuryr_neutron::ClientOptions::noauth(ctx.base_url()))?
        .with_wait_options(WaitOptions {
            timeout: std::time::Duration::ZERO,
            ..WaitOptions::default()
        });
    let rename = ResourceUpdate {
        name: Some("renamed".into()),
        ..ResourceUpdate::default()
    };
    let e = expect_error(
        "update while PENDING_CREATE",
        impatient.update_load_balancer(&lb.id, &rename).await,
        409,
        |k| matches!(k, OctaviaErrorKind::Immutable { .. }),
    )?;
    match e.kind() {
        Some(OctaviaErrorKind::Immutable { id, state, .. }) => {
            ensure!(
                id.as_deref() == Some(lb.id.as_str()),
                "409 names the load balancer: {e}"
            );
            ensure!(
                state.as_deref() == Some("PENDING_CREATE"),
                "409 names the state: {e}"
            );
        }
        _ => return Err(anyhow!("not Immutable: {e}")),
    }
    ensure!(e.request_id().is_some(), "409 carries a request id");
    // The ordinary client waits for ACTIVE and resends.
    let updated = ctx
        .client
        .update_load_balancer(&lb.id, &rename)
        .await
        .context("update with the client's wait")?;
    ensure!(updated.name == "renamed");
    let lb = ctx
        .client
        .wait_for_provisioning(&lb.id, Provisioning::Active)
        .await?
        .ok_or_else(|| anyhow!("vanished"))?;
    ensure!(lb.name == "renamed");
    Ok(())
}

pub(super) async fn cascade_delete_removes_the_tree(ctx: &Ctx) -> anyhow::Result<()> {
    let lb = ctx
        .active_lb(&ctx.populated_req("cascade", 443, &[("10.0.1.5", 443)]))
        .await?;
    let tree = ctx.client.get_status_tree(&lb.id).await?;
    let listener_id = tree
        .loadbalancer
        .listeners
        .first()
        .map(|l| l.id.clone())
        .ok_or_else(|| anyhow!("listener"))?;
    let pool_id = lb
        .pools
        .first()
        .map(|p| p.id.clone())
        .ok_or_else(|| anyhow!("pool"))?;
    let plain = ctx.client.delete_load_balancer(&lb.id, false).await;
    let e = expect_error("delete with children, no cascade", plain, 400, |k| {
        *k == OctaviaErrorKind::Validation
    })?;
    ensure!(
        e.api().is_some_and(|a| a.message.contains("it has children")),
        "message: {e}"
    );
    ctx.client.delete_load_balancer(&lb.id, true).await?;
    let gone = ctx
        .client
        .wait_for_provisioning(&lb.id, Provisioning::Deleted)
        .await?;
    ensure!(gone.is_none());
    let e = ctx
        .client
        .get_listener(&listener_id)
        .await
        .err()
        .ok_or_else(|| anyhow!("listener survived"))?;
    ensure!(e.is_not_found(), "listener after cascade: {e}");
    let e = ctx
        .client
        .get_pool(&pool_id)
        .await
        .err()
        .ok_or_else(|| anyhow!("pool survived"))?;
    ensure!(e.is_not_found(), "pool after cascade: {e}");
    let left = ctx.client.list_load_balancers(&ctx.project_filter()).await?;
    ensure!(left.is_empty(), "project still lists {left:?}");
    Ok(())
}

pub(super) async fn tags_filter_and_replace(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx
        .client
        .create_load_balancer(&kuryr_neutron::octavia::LoadBalancerCreate {
            tags: vec!["kuryr".into(), "svc-a".into()],
            ..ctx.lb_req("a")
        })
        .await?;
    let b = ctx
        .client
        .create_load_balancer(&kuryr_neutron::octavia::LoadBalancerCreate {
            tags: vec!["kuryr".into(), "svc-b".into()],
            ..ctx.lb_req("b")
        })
        .await?;
    let ids =
        |v: Vec<kuryr_neutron::octavia::LoadBalancer>| v.into_iter().map(|l| l.id).collect::<BTreeSet<_>>();
    let c = &ctx.client;
    let both = ids(c
        .list_load_balancers(&ctx.project_filter().tags(["kuryr"]))
        .await?);
    ensure!(
        both == BTreeSet::from([a.id.clone(), b.id.clone()]),
        "tags=kuryr: {both:?}"
    );
    let only_a = ids(c
        .list_load_balancers(&ctx.project_filter().tags(["kuryr", "svc-a"]))
        .await?);
    ensure!(
        only_a == BTreeSet::from([a.id.clone()]),
        "tags=kuryr,svc-a (all): {only_a:?}"
    );
    let any = ids(c
        .list_load_balancers(&ctx.project_filter().tags_any(["svc-a", "svc-b"]))
        .await?);
    ensure!(any.len() == 2, "tags-any: {any:?}");
    let not_a = ids(c
        .list_load_balancers(&ctx.project_filter().not_tags(["svc-a"]))
        .await?);
    ensure!(
        not_a == BTreeSet::from([b.id.clone()]),
        "not-tags=svc-a: {not_a:?}"
    );
    c.wait_for_provisioning(&a.id, Provisioning::Active).await?;
    let updated = c
        .update_load_balancer(
            &a.id,
            &ResourceUpdate {
                tags: Some(vec!["moved".into()]),
                ..ResourceUpdate::default()
            },
        )
        .await?;
    ensure!(
        updated.tags == vec!["moved".to_owned()],
        "tags replaced: {:?}",
        updated.tags
    );
    let moved = ids(c
        .list_load_balancers(&ctx.project_filter().tags(["moved"]))
        .await?);
    ensure!(moved == BTreeSet::from([a.id.clone()]), "tags=moved: {moved:?}");
    let kuryr = ids(c
        .list_load_balancers(&ctx.project_filter().tags(["kuryr"]))
        .await?);
    ensure!(kuryr == BTreeSet::from([b.id.clone()]), "old tag gone: {kuryr:?}");
    Ok(())
}

/// A listener update with a timeout set to null restores Octavia's default (50000 ms for the data
/// timeouts), and a null `allowed_cidrs` admits everyone again; keys left out keep their values.
pub(super) async fn listener_update_null_restores_defaults(ctx: &Ctx) -> anyhow::Result<()> {
    let lb = ctx.active_lb(&ctx.lb_req("defaults")).await?;
    let l = ctx
        .client
        .create_listener(&ListenerCreate {
            loadbalancer_id: Some(lb.id.clone()),
            timeout_client_data: Some(1234),
            timeout_member_data: Some(4321),
            allowed_cidrs: Some(vec!["192.0.2.0/24".into()]),
            ..ListenerCreate::new("TCP", 80)
        })
        .await?;
    ctx.client
        .wait_for_provisioning(&lb.id, Provisioning::Active)
        .await?;
    let got = ctx.client.get_listener(&l.id).await?;
    ensure!(
        (got.timeout_client_data, got.timeout_member_data) == (Some(1234), Some(4321)),
        "as created: {got:?}"
    );
    ensure!(
        got.allowed_cidrs.as_deref() == Some(&["192.0.2.0/24".to_string()][..]),
        "{:?}",
        got.allowed_cidrs
    );
    let mut extra = serde_json::Map::new();
    extra.insert("timeout_client_data".into(), serde_json::Value::Null);
    extra.insert("allowed_cidrs".into(), serde_json::Value::Null);
    let update = ResourceUpdate {
        extra,
        ..ResourceUpdate::default()
    };
    ctx.client.update_listener(&l.id, &update).await?;
    ctx.client
        .wait_for_provisioning(&lb.id, Provisioning::Active)
        .await?;
    let got = ctx.client.get_listener(&l.id).await?;
    ensure!(
        got.timeout_client_data == Some(50000),
        "null restores the default: {:?}",
        got.timeout_client_data
    );
    ensure!(
        got.timeout_member_data == Some(4321),
        "a key left out keeps its value: {:?}",
        got.timeout_member_data
    );
    ensure!(
        got.allowed_cidrs.as_ref().is_none_or(Vec::is_empty),
        "null admits everyone: {:?}",
        got.allowed_cidrs
    );
    Ok(())
}
