//! Thin typed netlink layer: drivers call these methods and never build raw
//! netlink messages.
//!
//! A [`Netlink`] handle is bound to the network namespace its socket was
//! created in (the kernel keys a netlink socket to the netns of its creator).
//! [`Netlink::in_netns`] creates that socket on a short-lived dedicated OS
//! thread that called `setns(2)`; the thread never runs async code and the
//! tokio worker threads never change namespace. All later requests on the
//! handle then run on the caller's runtime.

mod netns;

pub use netns::NetNs;

use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

use futures::TryStreamExt;
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, MacVlanMode};
use rtnetlink::{LinkBridge, LinkMacVlan, LinkUnspec, LinkVeth, LinkVlan, RouteMessageBuilder};
use tokio::task::JoinHandle;

/// Errors of the netlink layer. Kernel answers keep their errno so callers
/// can tell "exists" from "not supported".
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("the kernel does not support {what} links (errno {errno})")]
    KernelUnsupported { what: &'static str, errno: i32 },
    #[error("link {0:?} not found")]
    LinkNotFound(String),
    #[error("{op}: {source}")]
    Kernel {
        op: String,
        errno: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}: {message}")]
    Protocol { op: String, message: String },
    #[error("network namespace {path}: {source}")]
    Netns {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid interface name {0:?}: must be 1-15 bytes without '/' or whitespace")]
    InvalidName(String),
}

impl NetlinkError {
    /// errno of a kernel answer, if this error is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Kernel { errno, .. } => Some(*errno),
            Self::KernelUnsupported { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }

    fn from_rt(op: impl Into<String>, err: rtnetlink::Error) -> Self {
        let op = op.into();
        match err {
            rtnetlink::Error::NetlinkError(msg) => {
                let errno = msg.raw_code().abs();
                Self::Kernel {
                    op,
                    errno,
                    source: std::io::Error::from_raw_os_error(errno),
                }
            }
            other => Self::Protocol {
                op,
                message: other.to_string(),
            },
        }
    }
}

pub type Result<T> = std::result::Result<T, NetlinkError>;

/// MAC address, printed as `aa:bb:cc:dd:ee:ff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl std::str::FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for byte in out.iter_mut() {
            let part = parts.next().ok_or_else(|| format!("MAC {s:?} is too short"))?;
            *byte =
                u8::from_str_radix(part, 16).map_err(|_| format!("MAC {s:?} has a bad octet {part:?}"))?;
        }
        if parts.next().is_some() {
            return Err(format!("MAC {s:?} is too long"));
        }
        Ok(Self(out))
    }
}

impl std::fmt::Display for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// What we read back about a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Option<MacAddr>,
    pub mtu: Option<u32>,
    pub up: bool,
    pub loopback: bool,
    /// `veth`, `bridge`, `macvlan`, ... (None for physical devices).
    pub kind: Option<String>,
    /// Index of the bridge/bond this link is attached to.
    pub master: Option<u32>,
    /// Index of the parent link (veth peer, macvlan/vlan lower device), in
    /// the link's own namespace or another one.
    pub parent: Option<u32>,
    /// `ifalias`: kuryr records who owns a host-side link there.
    pub alias: Option<String>,
}

impl Link {
    fn from_message(msg: &LinkMessage) -> Self {
        let mut link = Link {
            index: msg.header.index,
            name: String::new(),
            mac: None,
            mtu: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            loopback: msg.header.flags.contains(LinkFlags::Loopback),
            kind: None,
            master: None,
            parent: None,
            alias: None,
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n.clone(),
                LinkAttribute::Address(a) if a.len() == 6 => {
                    let mut m = [0u8; 6];
                    m.copy_from_slice(a);
                    link.mac = Some(MacAddr(m));
                }
                LinkAttribute::Mtu(m) => link.mtu = Some(*m),
                LinkAttribute::Controller(c) => link.master = Some(*c),
                LinkAttribute::Link(p) => link.parent = Some(*p),
                LinkAttribute::IfAlias(a) => link.alias = Some(a.clone()),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        if let LinkInfo::Kind(kind) = info {
                            link.kind = Some(kind.to_string());
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }
}

/// An IP address with prefix length (`10.0.0.5/24`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpPrefix {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl IpPrefix {
    pub fn new(addr: IpAddr, prefix_len: u8) -> std::result::Result<Self, String> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(format!("prefix length {prefix_len} too long for {addr}"));
        }
        Ok(Self { addr, prefix_len })
    }

    /// The network address (host bits zeroed).
    pub fn network(&self) -> IpPrefix {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let bits = u32::from(a);
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix_len)).unwrap_or(0);
                IpAddr::V4((bits & mask).into())
            }
            IpAddr::V6(a) => {
                let bits = u128::from(a);
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                IpAddr::V6((bits & mask).into())
            }
        };
        IpPrefix {
            addr,
            prefix_len: self.prefix_len,
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        if ip.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        IpPrefix {
            addr: ip,
            prefix_len: self.prefix_len,
        }
        .network()
            == self.network()
    }
}

impl std::str::FromStr for IpPrefix {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not in address/prefix form"))?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} has an invalid address"))?;
        let len: u8 = len
            .parse()
            .map_err(|_| format!("{s:?} has an invalid prefix length"))?;
        IpPrefix::new(addr, len)
    }
}

impl std::fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// Serialised as their text form (`fa:16:3e:..`, `10.0.0.5/24`), as the
/// daemon's state files keep them.
macro_rules! serde_as_str {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
serde_as_str!(MacAddr);
serde_as_str!(IpPrefix);

/// A route to add: `destination` None means the default route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub destination: Option<IpPrefix>,
    pub gateway: Option<IpAddr>,
    pub oif: u32,
}

/// Several settings of one link, sent as one request (what `ip link set X
/// address A mtu M master B alias T up` does): one round trip instead of one
/// per setting. The kernel applies the address and MTU before the flags, so
/// a link comes up with them already set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkSettings<'a> {
    pub mac: Option<MacAddr>,
    pub mtu: Option<u32>,
    /// Index of the bridge to attach the link to.
    pub master: Option<u32>,
    pub alias: Option<&'a str>,
    pub up: bool,
}

impl LinkSettings<'_> {
    /// The request for link `index`; `None` when there is nothing to set.
    pub fn message(&self, index: u32) -> Option<LinkMessage> {
        if *self == Self::default() {
            return None;
        }
        let mut b = LinkUnspec::new_with_index(index);
        if let Some(mac) = self.mac {
            b = b.address(mac.0.to_vec());
        }
        if let Some(mtu) = self.mtu {
            b = b.mtu(mtu);
        }
        if let Some(master) = self.master {
            b = b.controller(master);
        }
        if let Some(alias) = self.alias {
            b = b.alias(alias);
        }
        if self.up {
            b = b.up();
        }
        Some(b.build())
    }

    /// What is set, for error messages: `MAC fa:16:..., MTU 1450, up`.
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(mac) = self.mac {
            parts.push(format!("MAC {mac}"));
        }
        if let Some(mtu) = self.mtu {
            parts.push(format!("MTU {mtu}"));
        }
        if let Some(master) = self.master {
            parts.push(format!("master #{master}"));
        }
        if self.alias.is_some() {
            parts.push("alias".to_string());
        }
        if self.up {
            parts.push("up".to_string());
        }
        parts.join(", ")
    }
}

/// Linux interface names are at most 15 bytes (IFNAMSIZ - 1).
pub fn validate_ifname(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 15
        || name.contains(['/', ':', '\0'])
        || name.chars().any(char::is_whitespace)
        || name == "."
        || name == ".."
    {
        return Err(NetlinkError::InvalidName(name.to_string()));
    }
    Ok(())
}

/// rtnetlink handle bound to one network namespace.
pub struct Netlink {
    handle: rtnetlink::Handle,
    connection: JoinHandle<()>,
    /// The namespace of a handle opened with [`Netlink::in_netns`].
    netns: Option<NetNs>,
}

impl Drop for Netlink {
    fn drop(&mut self) {
        // A request-only netlink connection never ends on its own.
        self.connection.abort();
    }
}

impl Netlink {
    /// A handle on the namespace of the calling process. Must run inside a
    /// tokio runtime.
    pub fn current() -> Result<Self> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|source| NetlinkError::Kernel {
            op: "open netlink socket".into(),
            errno: source.raw_os_error().unwrap_or(0),
            source,
        })?;
        Ok(Self {
            handle,
            connection: tokio::spawn(conn),
            netns: None,
        })
    }

    /// A handle on the namespace `ns`. The socket is created on a dedicated OS
    /// thread that entered `ns`; requests then run on the current runtime.
    pub async fn in_netns(ns: &NetNs) -> Result<Self> {
        let runtime = tokio::runtime::Handle::current();
        let (conn, handle, _) = ns
            .run_in("open a netlink socket", move || {
                // The socket's I/O registration needs a reactor; the socket itself is
                // created here, inside `ns`.
                let _guard = runtime.enter();
                rtnetlink::new_connection()
            })
            .await?;
        Ok(Self {
            handle,
            connection: tokio::spawn(conn),
            netns: Some(ns.duplicate()?),
        })
    }

    /// Lets the interfaces of this handle's namespace take IPv6 addresses: a runtime may make a
    /// pod's namespace with IPv6 off (Docker does for `--net=none`), and adding an address then
    /// fails with EACCES. The daemon's own namespace is left as the node has it.
    pub async fn enable_ipv6(&self) -> Result<()> {
        let Some(ns) = &self.netns else {
            return Ok(());
        };
        ns.run_in(
            "enable IPv6 (net.ipv6.conf.{all,default}.disable_ipv6 = 0)",
            || {
                for conf in ["all", "default"] {
                    let path = format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6");
                    if std::fs::read_to_string(&path)?.trim() != "0" {
                        std::fs::write(&path, "0")?;
                    }
                }
                Ok(())
            },
        )
        .await
    }

    pub async fn list_links(&self) -> Result<Vec<Link>> {
        let mut stream = self.handle.link().get().execute();
        let mut out = Vec::new();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| NetlinkError::from_rt("list links", e))?
        {
            out.push(Link::from_message(&msg));
        }
        Ok(out)
    }

    /// Look a link up by name; `Ok(None)` when it does not exist.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        validate_ifname(name)?;
        let mut stream = self.handle.link().get().match_name(name.to_string()).execute();
        match stream.try_next().await {
            Ok(Some(msg)) => Ok(Some(Link::from_message(&msg))),
            Ok(None) => Ok(None),
            Err(e) => {
                let err = NetlinkError::from_rt(format!("get link {name}"), e);
                if err.errno() == Some(libc::ENODEV) {
                    Ok(None)
                } else {
                    Err(err)
                }
            }
        }
    }

    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        let mut stream = self.handle.link().get().match_index(index).execute();
        match stream.try_next().await {
            Ok(msg) => Ok(msg.map(|m| Link::from_message(&m))),
            Err(e) => {
                let err = NetlinkError::from_rt(format!("get link #{index}"), e);
                if err.errno() == Some(libc::ENODEV) {
                    Ok(None)
                } else {
                    Err(err)
                }
            }
        }
    }

    /// Like [`Self::link_by_name`] but missing links are an error.
    pub async fn require_link(&self, name: &str) -> Result<Link> {
        self.link_by_name(name)
            .await?
            .ok_or_else(|| NetlinkError::LinkNotFound(name.to_string()))
    }

    async fn add(&self, what: &'static str, name: &str, msg: LinkMessage) -> Result<()> {
        self.handle.link().add(msg).execute().await.map_err(|e| {
            match NetlinkError::from_rt(format!("create {what} {name}"), e) {
                // EOPNOTSUPP: kind known but disabled; ENOTSUP is the same value.
                NetlinkError::Kernel { errno, .. } if errno == libc::EOPNOTSUPP => {
                    NetlinkError::KernelUnsupported { what, errno }
                }
                other => other,
            }
        })
    }

    /// Create a veth pair. With `peer_netns` the peer is created directly in
    /// that namespace (one request, no separate move).
    pub async fn create_veth(
        &self,
        name: &str,
        peer: &str,
        peer_netns: Option<BorrowedFd<'_>>,
        mtu: Option<u32>,
    ) -> Result<()> {
        validate_ifname(name)?;
        validate_ifname(peer)?;
        let mut builder = LinkVeth::new(name, peer);
        if let Some(mtu) = mtu {
            builder = builder.mtu(mtu);
        }
        let mut msg = builder.build();
        if let Some(ns) = peer_netns {
            set_veth_peer_attr(&mut msg, LinkAttribute::NetNsFd(ns.as_raw_fd()));
        }
        if let Some(mtu) = mtu {
            set_veth_peer_attr(&mut msg, LinkAttribute::Mtu(mtu));
        }
        self.add("veth", name, msg).await
    }

    pub async fn create_bridge(&self, name: &str) -> Result<()> {
        validate_ifname(name)?;
        self.add("bridge", name, LinkBridge::new(name).build()).await
    }

    /// Create a macvlan (bridge mode) on `parent`, optionally directly in
    /// another namespace.
    pub async fn create_macvlan(&self, name: &str, parent: u32, netns: Option<BorrowedFd<'_>>) -> Result<()> {
        validate_ifname(name)?;
        let mut builder = LinkMacVlan::new(name, parent, MacVlanMode::Bridge);
        if let Some(ns) = netns {
            builder = builder.setns_by_fd(ns.as_raw_fd());
        }
        self.add("macvlan", name, builder.build()).await
    }

    /// Create an 802.1Q VLAN device on `parent`. Kernels without the 8021q
    /// module answer EOPNOTSUPP, reported as [`NetlinkError::KernelUnsupported`].
    pub async fn create_vlan(
        &self,
        name: &str,
        parent: u32,
        vlan_id: u16,
        netns: Option<BorrowedFd<'_>>,
    ) -> Result<()> {
        validate_ifname(name)?;
        let mut builder = LinkVlan::new(name, parent, vlan_id);
        if let Some(ns) = netns {
            builder = builder.setns_by_fd(ns.as_raw_fd());
        }
        self.add("vlan", name, builder.build())
            .await
            .map_err(|e| match e {
                // Without the module the kind is unknown to the kernel.
                NetlinkError::Kernel { errno, .. } if errno == libc::EOPNOTSUPP => {
                    NetlinkError::KernelUnsupported { what: "vlan", errno }
                }
                other => other,
            })
    }

    async fn set(&self, op: String, msg: LinkMessage) -> Result<()> {
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|e| NetlinkError::from_rt(op, e))
    }

    /// Move a link into the namespace `ns` (by fd).
    pub async fn move_to_netns(&self, index: u32, ns: BorrowedFd<'_>) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .setns_by_fd(ns.as_raw_fd())
            .build();
        self.set(format!("move link #{index} to netns"), msg).await
    }

    pub async fn rename(&self, index: u32, name: &str) -> Result<()> {
        validate_ifname(name)?;
        let msg = LinkUnspec::new_with_index(index).name(name).build();
        self.set(format!("rename link #{index} to {name}"), msg).await
    }

    /// Apply `settings` to link `index` in one request (none when empty).
    pub async fn configure_link(&self, index: u32, settings: &LinkSettings<'_>) -> Result<()> {
        match settings.message(index) {
            Some(msg) => {
                self.set(format!("set {} on link #{index}", settings.describe()), msg)
                    .await
            }
            None => Ok(()),
        }
    }

    pub async fn set_mac(&self, index: u32, mac: MacAddr) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).address(mac.0.to_vec()).build();
        self.set(format!("set MAC {mac} on link #{index}"), msg).await
    }

    pub async fn set_mtu(&self, index: u32, mtu: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).mtu(mtu).build();
        self.set(format!("set MTU {mtu} on link #{index}"), msg).await
    }

    pub async fn set_up(&self, index: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).up().build();
        self.set(format!("set link #{index} up"), msg).await
    }

    pub async fn set_down(&self, index: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).down().build();
        self.set(format!("set link #{index} down"), msg).await
    }

    /// Set MAC and VLAN of virtual function `vf` through its physical function
    /// `pf` (`ip link set PF vf N mac M vlan V`); VLAN 0 clears it.
    pub async fn set_vf(&self, pf: u32, vf: u32, mac: Option<MacAddr>, vlan: u16) -> Result<()> {
        use netlink_packet_route::link::{LinkVfInfo, VfInfo, VfInfoMac, VfInfoVlan};
        let mut infos = vec![VfInfo::Vlan(VfInfoVlan::new(vf, u32::from(vlan), 0))];
        if let Some(mac) = mac {
            infos.insert(0, VfInfo::Mac(VfInfoMac::new(vf, &mac.0)));
        }
        let mut msg = LinkUnspec::new_with_index(pf).build();
        msg.attributes
            .push(LinkAttribute::VfInfoList(vec![LinkVfInfo(infos)]));
        self.set(format!("set VF {vf} of link #{pf} (vlan {vlan})"), msg)
            .await
    }

    /// Set the interface alias (`ip link set X alias Y`), at most 255 bytes.
    pub async fn set_alias(&self, index: u32, alias: &str) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).alias(alias).build();
        self.set(format!("set alias on link #{index}"), msg).await
    }

    /// Attach a link to a bridge (`ip link set X master B`).
    pub async fn set_master(&self, index: u32, master: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).controller(master).build();
        self.set(format!("attach link #{index} to master #{master}"), msg)
            .await
    }

    pub async fn delete_link(&self, index: u32) -> Result<()> {
        self.handle
            .link()
            .del(index)
            .execute()
            .await
            .map_err(|e| NetlinkError::from_rt(format!("delete link #{index}"), e))
    }

    /// Add an address; an address that is already there is not an error.
    pub async fn add_address(&self, index: u32, addr: IpPrefix) -> Result<()> {
        let res = self
            .handle
            .address()
            .add(index, addr.addr, addr.prefix_len)
            .execute()
            .await
            .map_err(|e| NetlinkError::from_rt(format!("add address {addr} on link #{index}"), e));
        match res {
            Err(e) if e.is_exists() => Ok(()),
            other => other,
        }
    }

    pub async fn del_address(&self, index: u32, addr: IpPrefix) -> Result<()> {
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .set_address_filter(addr.addr)
            .set_prefix_length_filter(addr.prefix_len)
            .execute();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| NetlinkError::from_rt(format!("find address {addr}"), e))?
        {
            self.handle
                .address()
                .del(msg)
                .execute()
                .await
                .map_err(|e| NetlinkError::from_rt(format!("delete address {addr}"), e))?;
        }
        Ok(())
    }

    /// Addresses configured on a link.
    pub async fn addresses(&self, index: u32) -> Result<Vec<IpPrefix>> {
        use netlink_packet_route::address::AddressAttribute;
        let mut stream = self.handle.address().get().set_link_index_filter(index).execute();
        let mut out = Vec::new();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| NetlinkError::from_rt(format!("list addresses of link #{index}"), e))?
        {
            for attr in &msg.attributes {
                if let AddressAttribute::Address(a) = attr {
                    out.push(IpPrefix {
                        addr: *a,
                        prefix_len: msg.header.prefix_len,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The interface of the main table's IPv4 default route, if there is one.
    pub async fn default_route_link(&self) -> Result<Option<u32>> {
        use netlink_packet_route::route::{RouteAttribute, RouteHeader};
        let req = RouteMessageBuilder::<std::net::Ipv4Addr>::new().build();
        let mut stream = self.handle.route().get(req).execute();
        let mut found = None;
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| NetlinkError::from_rt("list IPv4 routes", e))?
        {
            if found.is_some()
                || msg.header.destination_prefix_length != 0
                || msg.header.table != RouteHeader::RT_TABLE_MAIN
            {
                continue;
            }
            found = msg.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            });
        }
        Ok(found)
    }

    /// Add a route; one that already exists is not an error.
    pub async fn add_route(&self, route: &Route) -> Result<()> {
        let family_v4 = match (route.destination, route.gateway) {
            (Some(d), _) => d.addr.is_ipv4(),
            (None, Some(g)) => g.is_ipv4(),
            (None, None) => {
                return Err(NetlinkError::Protocol {
                    op: "add route".into(),
                    message: "a route needs a destination or a gateway".into(),
                });
            }
        };
        let msg = if family_v4 {
            let mut b = RouteMessageBuilder::<std::net::Ipv4Addr>::new().output_interface(route.oif);
            if let Some(d) = route.destination {
                let IpAddr::V4(a) = d.network().addr else {
                    return Err(mixed_family(route));
                };
                b = b.destination_prefix(a, d.prefix_len);
            }
            match route.gateway {
                Some(IpAddr::V4(g)) => b = b.gateway(g),
                Some(IpAddr::V6(_)) => return Err(mixed_family(route)),
                None => b = b.scope(netlink_packet_route::route::RouteScope::Link),
            }
            b.build()
        } else {
            let mut b = RouteMessageBuilder::<std::net::Ipv6Addr>::new().output_interface(route.oif);
            if let Some(d) = route.destination {
                let IpAddr::V6(a) = d.network().addr else {
                    return Err(mixed_family(route));
                };
                b = b.destination_prefix(a, d.prefix_len);
            }
            match route.gateway {
                Some(IpAddr::V6(g)) => b = b.gateway(g),
                Some(IpAddr::V4(_)) => return Err(mixed_family(route)),
                None => {}
            }
            b.build()
        };
        let res = self
            .handle
            .route()
            .add(msg)
            .execute()
            .await
            .map_err(|e| NetlinkError::from_rt(format!("add route {route:?}"), e));
        match res {
            Err(e) if e.is_exists() => Ok(()),
            other => other,
        }
    }
}

fn mixed_family(route: &Route) -> NetlinkError {
    NetlinkError::Protocol {
        op: format!("add route {route:?}"),
        message: "destination and gateway are of different address families".into(),
    }
}

/// Put `attr` into the veth peer's own link message (IFLA_VETH_PEER), where
/// the kernel reads the peer's namespace and MTU.
fn set_veth_peer_attr(msg: &mut LinkMessage, attr: LinkAttribute) {
    use netlink_packet_route::link::{InfoData, InfoVeth};
    for a in msg.attributes.iter_mut() {
        if let LinkAttribute::LinkInfo(infos) = a {
            for info in infos.iter_mut() {
                if let LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))) = info {
                    peer.attributes.push(attr.clone());
                }
            }
        }
    }
}

/// True when the link is of the given kind.
pub fn is_kind(link: &Link, kind: InfoKind) -> bool {
    link.kind.as_deref() == Some(kind.to_string().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_settings_go_out_in_one_message() {
        assert_eq!(LinkSettings::default().message(7), None);
        let mac: MacAddr = "fa:16:3e:00:00:01".parse().expect("mac");
        let all = LinkSettings {
            mac: Some(mac),
            mtu: Some(1450),
            master: Some(3),
            alias: Some("kuryr:c:ns/p"),
            up: true,
        };
        let msg = all.message(7).expect("a message");
        assert_eq!(msg.header.index, 7);
        assert!(msg.header.flags.contains(LinkFlags::Up));
        let attrs = &msg.attributes;
        assert!(
            attrs.contains(&LinkAttribute::Address(mac.0.to_vec())),
            "{attrs:?}"
        );
        assert!(attrs.contains(&LinkAttribute::Mtu(1450)), "{attrs:?}");
        assert!(attrs.contains(&LinkAttribute::Controller(3)), "{attrs:?}");
        assert!(
            attrs.contains(&LinkAttribute::IfAlias("kuryr:c:ns/p".into())),
            "{attrs:?}"
        );
        assert_eq!(
            all.describe(),
            "MAC fa:16:3e:00:00:01, MTU 1450, master #3, alias, up"
        );

        let only_up = LinkSettings {
            up: true,
            ..LinkSettings::default()
        };
        let msg = only_up.message(9).expect("a message");
        assert!(msg.header.flags.contains(LinkFlags::Up));
        assert!(
            !msg.attributes.iter().any(|a| matches!(
                a,
                LinkAttribute::Address(_) | LinkAttribute::Mtu(_) | LinkAttribute::Controller(_)
            )),
            "{:?}",
            msg.attributes
        );
        // Nothing asked of the link's state: it is not taken down either.
        let mtu_only = LinkSettings {
            mtu: Some(9000),
            ..LinkSettings::default()
        };
        let msg = mtu_only.message(9).expect("a message");
        assert!(
            !msg.header.change_mask.contains(LinkFlags::Up),
            "{:?}",
            msg.header
        );
    }
}
