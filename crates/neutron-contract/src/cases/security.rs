//! Security groups and rules, routers and router interfaces.

use std::collections::BTreeSet;

use anyhow::{anyhow, ensure};
use kuryr_neutron::{
    ErrorKind, ListFilter, RouterCreate, RouterInterfaceSpec, SecurityGroupCreate, SecurityGroupRuleCreate,
};

use crate::Ctx;
use crate::ctx::expect_api_error;

pub(super) async fn security_groups_and_rules(ctx: &Ctx) -> anyhow::Result<()> {
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
    // The whole port range is stored as no range (neutron-server canonicalises it).
    let whole = c
        .create_security_group_rule(&SecurityGroupRuleCreate {
            security_group_id: sg.id.clone(),
            direction: "ingress".into(),
            ethertype: Some("IPv4".into()),
            protocol: Some("udp".into()),
            port_range_min: Some(1),
            port_range_max: Some(65535),
            project_id: Some(ctx.project.clone()),
            ..SecurityGroupRuleCreate::default()
        })
        .await?;
    ensure!(
        whole.port_range_min.is_none() && whole.port_range_max.is_none(),
        "{whole:?}"
    );
    c.delete_security_group_rule(&whole.id).await?;
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

pub(super) async fn router_add_and_remove_interface(ctx: &Ctx) -> anyhow::Result<()> {
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

pub(super) async fn security_group_create_refuses_tags(ctx: &Ctx) -> anyhow::Result<()> {
    let r = ctx
        .client
        .create_security_group(&SecurityGroupCreate {
            name: "tagged-sg".into(),
            project_id: Some(ctx.project.clone()),
            tags: vec!["t".into()],
            ..SecurityGroupCreate::default()
        })
        .await;
    expect_api_error(r, ErrorKind::BadRequest, 400)?;
    let listed = ctx
        .client
        .list_security_groups(&ctx.project_filter().name("tagged-sg"))
        .await?;
    ensure!(listed.is_empty(), "nothing created: {listed:?}");
    Ok(())
}

/// Neutron's duplicate check takes a remote of every address (`0.0.0.0/0`, `::/0`) for no remote:
/// a rule that differs from an existing one only so is refused as existing (409), whichever
/// comes first.
pub(super) async fn an_all_addresses_remote_duplicates_no_remote(ctx: &Ctx) -> anyhow::Result<()> {
    let c = &ctx.client;
    let sg = c
        .create_security_group(&SecurityGroupCreate {
            name: "dup-sg".into(),
            project_id: Some(ctx.project.clone()),
            ..SecurityGroupCreate::default()
        })
        .await?;
    let rule = |ethertype: &str, prefix: Option<&str>| SecurityGroupRuleCreate {
        security_group_id: sg.id.clone(),
        direction: "ingress".into(),
        ethertype: Some(ethertype.into()),
        protocol: Some("tcp".into()),
        port_range_min: Some(443),
        port_range_max: Some(443),
        remote_ip_prefix: prefix.map(str::to_string),
        project_id: Some(ctx.project.clone()),
        ..SecurityGroupRuleCreate::default()
    };
    c.create_security_group_rule(&rule("IPv4", None)).await?;
    let e = expect_api_error(
        c.create_security_group_rule(&rule("IPv4", Some("0.0.0.0/0")))
            .await,
        ErrorKind::SecurityGroupRuleExists,
        409,
    )?;
    ensure!(e.to_string().contains("already exists"), "{e}");
    c.create_security_group_rule(&rule("IPv6", Some("::/0"))).await?;
    expect_api_error(
        c.create_security_group_rule(&rule("IPv6", None)).await,
        ErrorKind::SecurityGroupRuleExists,
        409,
    )?;
    c.delete_security_group(&sg.id).await?;
    Ok(())
}
