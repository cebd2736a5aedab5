//! Address groups (`address-group`) and security group rules naming one
//! (`security-groups-remote-address-group`): what the NetworkPolicy handlers rely on.

use anyhow::ensure;
use kuryr_neutron::{AddressGroupCreate, ErrorKind, SecurityGroupCreate, SecurityGroupRuleCreate};

use super::MISSING;
use crate::Ctx;
use crate::ctx::expect_api_error;

fn other(kind: &str) -> ErrorKind {
    ErrorKind::Other {
        error_type: kind.into(),
    }
}

pub(super) async fn address_group_crud_and_membership(ctx: &Ctx) -> anyhow::Result<()> {
    let c = &ctx.client;
    let ag = c
        .create_address_group(&AddressGroupCreate {
            name: "np-peer".into(),
            project_id: Some(ctx.project.clone()),
            description: Some("kuryr-rs:contract".into()),
            // Host bits are cleared; the answer is sorted.
            addresses: vec!["10.61.0.9/32".into(), "10.61.1.7/24".into()],
        })
        .await?;
    ensure!(
        ag.addresses == ["10.61.0.9/32", "10.61.1.0/24"] && ag.project_id == ctx.project,
        "{ag:?}"
    );
    let listed = c
        .list_address_groups(&ctx.project_filter().eq("description", "kuryr-rs:contract"))
        .await?;
    ensure!(
        listed.len() == 1 && listed[0].id == ag.id,
        "list by description: {listed:?}"
    );

    // A bare address is a host prefix here.
    let after = c
        .add_addresses(&ag.id, &["10.61.0.10", "2001:db8::5/128"])
        .await?;
    ensure!(
        after.addresses == ["10.61.0.10/32", "10.61.0.9/32", "10.61.1.0/24", "2001:db8::5/128"],
        "{after:?}"
    );
    // All or nothing: one address already there and nothing is added.
    expect_api_error(
        c.add_addresses(&ag.id, &["10.61.0.11/32", "10.61.0.9/32"]).await,
        ErrorKind::AddressesAlreadyExist,
        400,
    )?;
    expect_api_error(
        c.remove_addresses(&ag.id, &["10.61.0.9/32", "10.61.9.9/32"])
            .await,
        ErrorKind::AddressesNotFound,
        404,
    )?;
    let got = c.get_address_group(&ag.id).await?;
    ensure!(
        got.addresses == after.addresses,
        "failed actions changed nothing: {got:?}"
    );
    let after = c
        .remove_addresses(&ag.id, &["10.61.0.9/32", "2001:db8::5/128"])
        .await?;
    ensure!(after.addresses == ["10.61.0.10/32", "10.61.1.0/24"], "{after:?}");

    c.delete_address_group(&ag.id).await?;
    expect_api_error(
        c.get_address_group(&ag.id).await,
        other("AddressGroupNotFound"),
        404,
    )?;
    expect_api_error(
        c.add_addresses(MISSING, &["10.61.0.1/32"]).await,
        other("AddressGroupNotFound"),
        404,
    )?;
    Ok(())
}

pub(super) async fn address_group_create_refuses_bare_and_duplicate_addresses(
    ctx: &Ctx,
) -> anyhow::Result<()> {
    let req = |addresses: &[&str]| AddressGroupCreate {
        name: "np-bad".into(),
        project_id: Some(ctx.project.clone()),
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        ..AddressGroupCreate::default()
    };
    expect_api_error(
        ctx.client.create_address_group(&req(&["10.62.0.1"])).await,
        ErrorKind::BadRequest,
        400,
    )?;
    expect_api_error(
        ctx.client
            .create_address_group(&req(&["10.62.0.1/32", "10.62.0.1/32"]))
            .await,
        ErrorKind::BadRequest,
        400,
    )?;
    let none = ctx.client.list_address_groups(&ctx.project_filter()).await?;
    ensure!(none.is_empty(), "nothing created: {none:?}");
    Ok(())
}

pub(super) async fn rule_with_remote_address_group(ctx: &Ctx) -> anyhow::Result<()> {
    let c = &ctx.client;
    let ag = c
        .create_address_group(&AddressGroupCreate {
            name: "np-peer".into(),
            project_id: Some(ctx.project.clone()),
            addresses: vec!["10.63.0.4/32".into()],
            ..AddressGroupCreate::default()
        })
        .await?;
    let sg = c
        .create_security_group(&SecurityGroupCreate {
            name: "np-sg".into(),
            project_id: Some(ctx.project.clone()),
            ..SecurityGroupCreate::default()
        })
        .await?;
    let req = SecurityGroupRuleCreate {
        security_group_id: sg.id.clone(),
        direction: "ingress".into(),
        ethertype: Some("IPv4".into()),
        protocol: Some("tcp".into()),
        port_range_min: Some(80),
        port_range_max: Some(81),
        remote_address_group_id: Some(ag.id.clone()),
        project_id: Some(ctx.project.clone()),
        ..SecurityGroupRuleCreate::default()
    };
    let rule = c.create_security_group_rule(&req).await?;
    ensure!(
        rule.remote_address_group_id.as_deref() == Some(ag.id.as_str())
            && rule.remote_ip_prefix.is_none()
            && rule.remote_group_id.is_none(),
        "{rule:?}"
    );
    let listed = c
        .list_security_group_rules(&ctx.project_filter().eq("remote_address_group_id", &ag.id))
        .await?;
    ensure!(listed.len() == 1 && listed[0].id == rule.id, "{listed:?}");
    expect_api_error(
        c.create_security_group_rule(&req).await,
        ErrorKind::SecurityGroupRuleExists,
        409,
    )?;
    expect_api_error(
        c.create_security_group_rule(&SecurityGroupRuleCreate {
            remote_ip_prefix: Some("10.63.0.0/24".into()),
            port_range_min: Some(90),
            port_range_max: Some(90),
            ..req.clone()
        })
        .await,
        other("SecurityGroupMultipleRemoteEntites"),
        400,
    )?;
    expect_api_error(
        c.create_security_group_rule(&SecurityGroupRuleCreate {
            remote_address_group_id: Some(MISSING.into()),
            ..req.clone()
        })
        .await,
        other("AddressGroupNotFound"),
        404,
    )?;
    // A group a rule names cannot go; once the rule is gone it can.
    expect_api_error(
        c.delete_address_group(&ag.id).await,
        other("AddressGroupInUse"),
        409,
    )?;
    c.delete_security_group_rule(&rule.id).await?;
    c.delete_address_group(&ag.id).await?;
    c.delete_security_group(&sg.id).await?;
    Ok(())
}
