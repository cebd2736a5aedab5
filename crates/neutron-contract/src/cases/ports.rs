//! Ports: create (single and bulk, atomicity), get/delete errors, update, revision and attribute validation.

use std::collections::BTreeSet;

use anyhow::{anyhow, ensure};
use kuryr_neutron::{
    AllowedAddressPair, ErrorKind, FixedIpRequest, PortCreate, PortUpdate, QuotaUpdate, SecurityGroupCreate,
    Taggable,
};
use reqwest::Method;
use serde_json::json;

use super::{MISSING, ids, sorted};
use crate::Ctx;
use crate::ctx::expect_api_error;

pub(super) async fn port_create_shape(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn port_create_on_missing_network_is_network_not_found(ctx: &Ctx) -> anyhow::Result<()> {
    expect_api_error(
        ctx.client.create_port(&ctx.port_req(MISSING)).await,
        ErrorKind::NetworkNotFound,
        404,
    )?;
    Ok(())
}

pub(super) async fn port_get_missing_is_port_not_found_with_request_id(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn port_delete_missing_is_port_not_found(ctx: &Ctx) -> anyhow::Result<()> {
    expect_api_error(
        ctx.client.delete_port(MISSING).await,
        ErrorKind::PortNotFound,
        404,
    )?;
    Ok(())
}

pub(super) async fn port_delete_then_get_is_404(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, _) = ctx.network("10.22.0.0/24").await?;
    let p = ctx.port(ctx.port_req(&net.id)).await?;
    ctx.client.delete_port(&p.id).await?;
    expect_api_error(ctx.client.get_port(&p.id).await, ErrorKind::PortNotFound, 404)?;
    expect_api_error(ctx.client.delete_port(&p.id).await, ErrorKind::PortNotFound, 404)?;
    Ok(())
}

pub(super) async fn bulk_create_50_ports(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn bulk_create_is_atomic_on_quota(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn bulk_create_is_atomic_on_ip_conflict(ctx: &Ctx) -> anyhow::Result<()> {
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

/// Single creates asked at once (the client sends those that wait behind others as one bulk):
/// each caller gets its own port, and one refused create fails alone - on the real server the
/// bulk carrying it is refused whole, and the client asks again port by port.
pub(super) async fn concurrent_single_creates_each_get_their_own_answer(ctx: &Ctx) -> anyhow::Result<()> {
    let (net, subnet) = ctx.network("10.65.0.0/24").await?;
    let taken = PortCreate {
        fixed_ips: Some(vec![FixedIpRequest::address(&subnet.id, "10.65.0.200")]),
        ..ctx.port_req(&net.id)
    };
    let holder = ctx.port(taken.clone()).await?;
    let reqs: Vec<PortCreate> = (0..12)
        .map(|i| {
            let req = if i == 7 {
                taken.clone()
            } else {
                ctx.port_req(&net.id)
            };
            PortCreate {
                name: Some(format!("together-{i}")),
                ..req
            }
        })
        .collect();
    let answers = futures::future::join_all(reqs.iter().map(|r| ctx.client.create_port(r))).await;
    let mut made = BTreeSet::from([holder.id.clone()]);
    for (i, answer) in answers.into_iter().enumerate() {
        if i == 7 {
            expect_api_error(answer, ErrorKind::IpAddressAlreadyAllocated, 409)?;
            continue;
        }
        let p = answer.map_err(|e| anyhow!("create {i}: {e}"))?;
        ensure!(
            p.name == format!("together-{i}"),
            "create {i} answered port {:?}",
            p.name
        );
        made.insert(p.id);
    }
    let listed = ids(&ctx.project_ports().await?);
    ensure!(
        listed == made,
        "the project holds {} ports, {} made",
        listed.len(),
        made.len()
    );
    Ok(())
}

pub(super) async fn bulk_create_stores_tags(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn single_create_stores_tags(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn update_port_attributes(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn update_with_stale_revision_is_412(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn unrecognized_attribute_is_400(ctx: &Ctx) -> anyhow::Result<()> {
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
