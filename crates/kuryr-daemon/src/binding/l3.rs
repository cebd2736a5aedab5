//! Pod-side configuration common to all drivers: MAC, MTU, addresses, routes.

use crate::netlink::{IpPrefix, Link, LinkSettings, Netlink, Route};

use super::{BindingError, PlugSpec};

/// What `link` still needs to have `spec`'s MAC and MTU and be up: a
/// setting the link already has (a veth created with its MTU, a VF whose MAC
/// was set through its PF) is not sent again.
pub fn link_settings(link: &Link, spec: &PlugSpec) -> LinkSettings<'static> {
    LinkSettings {
        mac: Some(spec.mac).filter(|m| link.mac != Some(*m)),
        mtu: spec.mtu.filter(|m| link.mtu != Some(*m)),
        up: !link.up,
        ..LinkSettings::default()
    }
}

/// Configure `link` (already in the pod namespace, already named
/// `spec.ifname`, as just read back) and bring it up: MAC, MTU and up in one
/// request, then addresses and routes.
///
/// Only the default interface gets default routes (one per address family
/// with a gateway); a subnet without a gateway is valid and simply has none.
pub async fn configure(pod: &Netlink, link: &Link, spec: &PlugSpec) -> Result<(), BindingError> {
    let index = link.index;
    pod.configure_link(index, &link_settings(link, spec)).await?;
    if spec.addresses.iter().any(|a| a.addr.is_ipv6()) {
        pod.enable_ipv6().await?;
    }
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
        for gw in spec.default_gateways() {
            pod.add_route(&Route {
                destination: None,
                gateway: Some(gw),
                oif: index,
            })
            .await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::PlugKind;
    use crate::netlink::MacAddr;

    fn spec(mtu: Option<u32>) -> PlugSpec {
        PlugSpec {
            port_id: "p".into(),
            ifname: "eth0".into(),
            host_ifname: "tapp".into(),
            mac: "fa:16:3e:00:00:02".parse().expect("mac"),
            mtu,
            addresses: Vec::new(),
            gateways: Vec::new(),
            routes: Vec::new(),
            is_default: true,
            kind: PlugKind::MacvlanNested,
        }
    }

    fn link(mac: &str, mtu: u32, up: bool) -> Link {
        Link {
            index: 4,
            name: "eth0".into(),
            mac: Some(mac.parse::<MacAddr>().expect("mac")),
            mtu: Some(mtu),
            up,
            loopback: false,
            kind: Some("veth".into()),
            master: None,
            parent: None,
            alias: None,
        }
    }

    #[test]
    fn only_what_the_link_lacks_is_set() {
        let fresh = link("aa:bb:cc:dd:ee:ff", 1450, false);
        let s = link_settings(&fresh, &spec(Some(1450)));
        assert_eq!(s.mac, Some(spec(None).mac));
        assert_eq!(s.mtu, None, "created with its MTU already");
        assert!(s.up);

        let s = link_settings(&fresh, &spec(Some(1400)));
        assert_eq!(s.mtu, Some(1400));
        assert_eq!(link_settings(&fresh, &spec(None)).mtu, None, "no MTU asked");

        let done = link("fa:16:3e:00:00:02", 1450, true);
        assert_eq!(link_settings(&done, &spec(Some(1450))), LinkSettings::default());
    }
}
