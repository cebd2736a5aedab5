//! Pod-side configuration common to all drivers: MAC, MTU, addresses, routes.

use crate::netlink::{IpPrefix, Link, Netlink, Route};

use super::{BindingError, PlugSpec};

/// Configure link `index` (already in the pod namespace, already named
/// `spec.ifname`) and bring it up.
///
/// Only the default interface gets default routes (one per address family
/// with a gateway); a subnet without a gateway is valid and simply has none.
pub async fn configure(
    pod: &Netlink,
    index: u32,
    spec: &PlugSpec,
    set_mac: bool,
) -> Result<(), BindingError> {
    if set_mac {
        pod.set_mac(index, spec.mac).await?;
    }
    if let Some(mtu) = spec.mtu {
        pod.set_mtu(index, mtu).await?;
    }
    pod.set_up(index).await?;
    for addr in &spec.addresses {
        pod.add_address(index, *addr).await?;
    }
    for route in &spec.routes {
        pod.add_route(&Route {
            destination: Some(route.destination),
            gateway: route.gateway,
            oif: index,
        })
        .await?;
    }
    if spec.is_default {
        let mut v4_done = false;
        let mut v6_done = false;
        for gw in &spec.gateways {
            let done = if gw.is_ipv4() { &mut v4_done } else { &mut v6_done };
            if *done {
                continue;
            }
            // The gateway must be on-link through one of our subnets; one that
            // is not would make the kernel reject the route with ENETUNREACH.
            if !spec.addresses.iter().any(|a| a.contains(*gw)) {
                continue;
            }
            pod.add_route(&Route {
                destination: None,
                gateway: Some(*gw),
                oif: index,
            })
            .await?;
            *done = true;
        }
    }
    Ok(())
}

/// Verify the pod interface matches `spec`.
pub async fn check(pod: &Netlink, spec: &PlugSpec) -> Result<Link, BindingError> {
    let fail = |message: String| BindingError::Check {
        ifname: spec.ifname.clone(),
        message,
    };
    let link = pod
        .link_by_name(&spec.ifname)
        .await?
        .ok_or_else(|| fail("interface is missing from the pod namespace".into()))?;
    if link.mac != Some(spec.mac) {
        return Err(fail(format!(
            "MAC is {:?}, expected {}",
            link.mac.map(|m| m.to_string()),
            spec.mac
        )));
    }
    if !link.up {
        return Err(fail("interface is down".into()));
    }
    if let Some(mtu) = spec.mtu
        && link.mtu != Some(mtu)
    {
        return Err(fail(format!("MTU is {:?}, expected {mtu}", link.mtu)));
    }
    let have: Vec<IpPrefix> = pod.addresses(link.index).await?;
    for want in &spec.addresses {
        if !have.contains(want) {
            return Err(fail(format!("address {want} is missing")));
        }
    }
    Ok(link)
}
