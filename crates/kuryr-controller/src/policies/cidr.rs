//! IP prefixes as Neutron and NetworkPolicy `ipBlock` use them, with the set difference an
//! `ipBlock.except` needs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IPv4 or IPv6 prefix in canonical form (host bits cleared).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    v6: bool,
    addr: u128,
    len: u8,
}

impl Cidr {
    /// The prefix of one address (`/32` or `/128`).
    pub fn host(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => Self {
                v6: false,
                addr: u128::from(u32::from(a)),
                len: 32,
            },
            IpAddr::V6(a) => Self {
                v6: true,
                addr: u128::from(a),
                len: 128,
            },
        }
    }

    pub fn is_v6(&self) -> bool {
        self.v6
    }

    /// Whether it holds every address of its family (`0.0.0.0/0`, `::/0`).
    pub fn is_everything(&self) -> bool {
        self.len == 0
    }

    fn bits(&self) -> u8 {
        if self.v6 { 128 } else { 32 }
    }

    fn mask(bits: u8, len: u8) -> u128 {
        if len == 0 {
            0
        } else {
            let all = if bits == 128 {
                u128::MAX
            } else {
                (1u128 << bits) - 1
            };
            all & !((1u128 << (bits - len)) - 1) & all
        }
    }

    /// Whether every address of `other` is in `self`.
    pub fn contains(&self, other: &Cidr) -> bool {
        self.v6 == other.v6
            && other.len >= self.len
            && other.addr & Self::mask(self.bits(), self.len) == self.addr
    }

    pub fn contains_ip(&self, ip: IpAddr) -> bool {
        self.contains(&Self::host(ip))
    }

    /// The two halves of this prefix (none for a host prefix).
    fn split(&self) -> Option<(Cidr, Cidr)> {
        if self.len == self.bits() {
            return None;
        }
        let len = self.len + 1;
        let high = self.addr | (1u128 << (self.bits() - len));
        Some((
            Cidr {
                v6: self.v6,
                addr: self.addr,
                len,
            },
            Cidr {
                v6: self.v6,
                addr: high,
                len,
            },
        ))
    }

    /// `self` minus every prefix of `except`, as the fewest prefixes that cover exactly the
    /// remaining addresses (no address of `except` is in the result, every other one is).
    pub fn subtract(&self, except: &[Cidr]) -> Vec<Cidr> {
        let relevant: Vec<Cidr> = except
            .iter()
            .filter(|e| e.v6 == self.v6 && (self.contains(e) || e.contains(self)))
            .copied()
            .collect();
        if relevant.iter().any(|e| e.contains(self)) {
            return vec![];
        }
        if relevant.is_empty() {
            return vec![*self];
        }
        match self.split() {
            Some((lo, hi)) => {
                let mut out = lo.subtract(&relevant);
                out.extend(hi.subtract(&relevant));
                out
            }
            None => vec![],
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.v6 {
            write!(f, "{}/{}", Ipv6Addr::from(self.addr), self.len)
        } else {
            // A v4 prefix keeps its address in the low 32 bits.
            write!(f, "{}/{}", Ipv4Addr::from(self.addr as u32), self.len)
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    /// `a.b.c.d/n` or `x::y/n`; host bits are cleared (`10.0.0.1/8` is `10.0.0.0/8`), and an
    /// IPv4 octet with leading zeros is decimal (`010.0.0.0/8` is `10.0.0.0/8`), both as the
    /// Kubernetes API server takes them (its sloppy parser): refusing either would drop a policy
    /// it accepted and leave the pods it selects open. A bare address is a host prefix.
    fn from_str(s: &str) -> Result<Self, String> {
        let (ip, len) = match s.split_once('/') {
            Some((ip, len)) => (ip, Some(len)),
            None => (s, None),
        };
        let ip: IpAddr = match ip.parse() {
            Ok(ip) => ip,
            Err(_) => sloppy_v4(ip)
                .map(IpAddr::V4)
                .ok_or_else(|| format!("{s:?} is not an IP prefix"))?,
        };
        let mut c = Self::host(ip);
        if let Some(len) = len {
            let len: u8 = len
                .parse()
                .map_err(|_| format!("{s:?} has an invalid prefix length"))?;
            if len > c.bits() {
                return Err(format!("{s:?} has a prefix length above {}", c.bits()));
            }
            c.addr &= Self::mask(c.bits(), len);
            c.len = len;
        }
        Ok(c)
    }
}

/// An IPv4 address whose octets may carry leading zeros, read as decimal (not octal), as Go's
/// pre-1.17 parser that Kubernetes keeps for compatibility reads it.
fn sloppy_v4(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = part.trim_start_matches('0');
        *o = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
    }
    parts.next().is_none().then(|| Ipv4Addr::from(octets))
}

impl serde::Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().expect("test cidr")
    }

    #[test]
    fn parse_and_display_round_trip() {
        assert_eq!(c("10.0.0.0/8").to_string(), "10.0.0.0/8");
        assert_eq!(c("10.1.2.3").to_string(), "10.1.2.3/32");
        assert_eq!(c("2001:db8::/32").to_string(), "2001:db8::/32");
        assert_eq!(c("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert_eq!(c("10.0.0.1/8").to_string(), "10.0.0.0/8", "host bits cleared");
        assert_eq!(c("2001:db8::1/32").to_string(), "2001:db8::/32");
        assert_eq!(
            c("010.000.0.01/8").to_string(),
            "10.0.0.0/8",
            "leading zeros are decimal"
        );
        assert_eq!(c("192.168.001.0/24").to_string(), "192.168.1.0/24");
        for bad in [
            "10.0.0.256/8",
            "010.0.0/8",
            "10.0.0.0.1/8",
            "1a.0.0.0/8",
            "10..0.0/8",
            "+10.0.0.0/8",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
    }

    #[test]
    fn containment() {
        assert!(c("10.0.0.0/8").contains(&c("10.2.0.0/16")));
        assert!(!c("10.2.0.0/16").contains(&c("10.0.0.0/8")));
        assert!(!c("10.0.0.0/8").contains(&c("::/0")));
        assert!(c("0.0.0.0/0").contains_ip("192.168.1.1".parse().expect("ip")));
    }

    #[test]
    fn subtract_is_exact() {
        let block = c("10.0.0.0/24");
        let out = block.subtract(&[c("10.0.0.128/25"), c("10.0.0.5/32")]);
        // Every address of the block is allowed iff it is not excepted.
        for last in 0u8..=255 {
            let ip: IpAddr = format!("10.0.0.{last}").parse().expect("ip");
            let excepted = last >= 128 || last == 5;
            assert_eq!(out.iter().any(|p| p.contains_ip(ip)), !excepted, "10.0.0.{last}");
        }
        assert_eq!(
            out.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "10.0.0.0/30",
                "10.0.0.4/32",
                "10.0.0.6/31",
                "10.0.0.8/29",
                "10.0.0.16/28",
                "10.0.0.32/27",
                "10.0.0.64/26"
            ]
        );
        assert!(
            block.subtract(&[c("10.0.0.0/16")]).is_empty(),
            "an except covering the block"
        );
        assert_eq!(
            block.subtract(&[c("192.168.0.0/16")]),
            vec![block],
            "an unrelated except"
        );
    }

    #[test]
    fn subtract_ipv6() {
        let out = c("2001:db8::/126").subtract(&[c("2001:db8::1/128")]);
        assert_eq!(
            out.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["2001:db8::/128", "2001:db8::2/127"]
        );
    }
}
