//! IP arithmetic and per-subnet address allocation.
//!
//! Addresses are handled as `u128` so IPv4 and IPv6 share one code path. Each subnet keeps the set of allocated
//! addresses, a free list of released ones and a scan cursor, so allocating N addresses is O(N) amortised even for
//! IPv6 /64 pools that can never be enumerated.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A normalised CIDR (host bits zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub version: u8,
    pub network: u128,
    pub prefix: u8,
}

pub fn ip_to_u128(ip: IpAddr) -> (u8, u128) {
    match ip {
        IpAddr::V4(v4) => (4, u128::from(u32::from(v4))),
        IpAddr::V6(v6) => (6, u128::from(v6)),
    }
}

pub fn u128_to_ip(version: u8, v: u128) -> IpAddr {
    if version == 4 {
        // Truncation is intended: IPv4 values always fit in 32 bits.
        IpAddr::V4(Ipv4Addr::from((v & 0xffff_ffff) as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(v))
    }
}

pub fn parse_ip(s: &str) -> Option<(u8, u128)> {
    s.parse::<IpAddr>().ok().map(ip_to_u128)
}

pub fn format_ip(version: u8, v: u128) -> String {
    u128_to_ip(version, v).to_string()
}

fn bits(version: u8) -> u8 {
    if version == 4 { 32 } else { 128 }
}

impl Cidr {
    /// Parses `a.b.c.d/n`; `Err(Some(normalised))` when host bits are set (neutron refuses those and suggests the
    /// normalised form), `Err(None)` when it is not a CIDR at all.
    pub fn parse(s: &str) -> Result<Cidr, Option<String>> {
        let (ip, prefix) = s.split_once('/').ok_or(None)?;
        let (version, addr) = parse_ip(ip).ok_or(None)?;
        let prefix: u8 = prefix.parse().map_err(|_| None)?;
        if prefix > bits(version) {
            return Err(None);
        }
        let cidr = Cidr {
            version,
            network: addr & Self::mask(version, prefix),
            prefix,
        };
        if cidr.network != addr {
            return Err(Some(cidr.to_string()));
        }
        Ok(cidr)
    }

    fn mask(version: u8, prefix: u8) -> u128 {
        let total = bits(version);
        if prefix == 0 {
            return 0;
        }
        let all: u128 = if total == 128 {
            u128::MAX
        } else {
            (1u128 << total) - 1
        };
        all & !((1u128 << (total - prefix)).wrapping_sub(1))
    }

    pub fn from_parts(version: u8, network: u128, prefix: u8) -> Cidr {
        Cidr {
            version,
            network: network & Self::mask(version, prefix),
            prefix,
        }
    }

    /// Number of addresses minus one (so a /0 IPv6 range does not overflow).
    pub fn span(&self) -> u128 {
        let host_bits = bits(self.version) - self.prefix;
        if host_bits == 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        }
    }

    pub fn first(&self) -> u128 {
        self.network
    }

    pub fn last(&self) -> u128 {
        self.network + self.span()
    }

    pub fn contains(&self, version: u8, ip: u128) -> bool {
        version == self.version && ip >= self.first() && ip <= self.last()
    }

    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.version == other.version && self.first() <= other.last() && other.first() <= self.last()
    }

    /// Usable host addresses: IPv4 excludes network and broadcast (except /31 and /32), IPv6 excludes the
    /// subnet-router anycast address only.
    pub fn host_range(&self) -> (u128, u128) {
        if self.version == 4 {
            if self.prefix >= 31 {
                (self.first(), self.last())
            } else {
                (self.first() + 1, self.last() - 1)
            }
        } else if self.prefix == 128 {
            (self.first(), self.last())
        } else {
            (self.first() + 1, self.last())
        }
    }

    /// Default gateway: first host for IPv4, the subnet-router anycast address for IPv6 (what neutron picks).
    pub fn default_gateway(&self) -> u128 {
        if self.version == 4 {
            self.host_range().0
        } else {
            self.first()
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", format_ip(self.version, self.network), self.prefix)
    }
}

/// Default allocation pools: the host range minus the gateway.
pub fn default_pools(cidr: &Cidr, gateway: Option<u128>) -> Vec<(u128, u128)> {
    let (lo, hi) = cidr.host_range();
    subtract(lo, hi, gateway)
}

fn subtract(lo: u128, hi: u128, hole: Option<u128>) -> Vec<(u128, u128)> {
    match hole {
        Some(g) if g >= lo && g <= hi => {
            let mut v = Vec::new();
            if g > lo {
                v.push((lo, g - 1));
            }
            if g < hi {
                v.push((g + 1, hi));
            }
            v
        }
        _ => vec![(lo, hi)],
    }
}

/// Allocation failures, mapped to neutron errors by the caller (which knows network and subnet ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    Exhausted,
    AlreadyAllocated,
}

/// Address book of one subnet.
#[derive(Debug, Clone)]
pub struct SubnetIpam {
    pub version: u8,
    pools: Vec<(u128, u128)>,
    allocated: HashSet<u128>,
    free: Vec<u128>,
    cursor_pool: usize,
    cursor: u128,
    pool_total: u128,
    pool_used: u128,
}

impl SubnetIpam {
    pub fn new(version: u8, pools: Vec<(u128, u128)>) -> Self {
        let pool_total = pools
            .iter()
            .map(|(a, b)| (b - a).saturating_add(1))
            .fold(0u128, u128::saturating_add);
        let cursor = pools.first().map(|p| p.0).unwrap_or(0);
        Self {
            version,
            pools,
            allocated: HashSet::new(),
            free: Vec::new(),
            cursor_pool: 0,
            cursor,
            pool_total,
            pool_used: 0,
        }
    }

    pub fn pools(&self) -> &[(u128, u128)] {
        &self.pools
    }

    pub fn in_pool(&self, ip: u128) -> bool {
        self.pools.iter().any(|(a, b)| ip >= *a && ip <= *b)
    }

    pub fn pool_total(&self) -> u128 {
        self.pool_total
    }

    pub fn pool_used(&self) -> u128 {
        self.pool_used
    }

    pub fn used(&self) -> usize {
        self.allocated.len()
    }

    pub fn is_allocated(&self, ip: u128) -> bool {
        self.allocated.contains(&ip)
    }

    pub fn has_free(&self) -> bool {
        self.pool_used < self.pool_total
    }

    /// Takes any free pool address.
    pub fn allocate_any(&mut self) -> Result<u128, AllocError> {
        if !self.has_free() {
            return Err(AllocError::Exhausted);
        }
        while let Some(ip) = self.free.pop() {
            if !self.allocated.contains(&ip) && self.in_pool(ip) {
                self.mark(ip);
                return Ok(ip);
            }
        }
        // A free address exists (pool_used < pool_total), so this scan terminates within one lap of the pools.
        loop {
            let (lo, hi) = self.pools[self.cursor_pool];
            if self.cursor < lo || self.cursor > hi {
                self.cursor_pool = (self.cursor_pool + 1) % self.pools.len();
                self.cursor = self.pools[self.cursor_pool].0;
                continue;
            }
            let ip = self.cursor;
            if ip == hi {
                self.cursor_pool = (self.cursor_pool + 1) % self.pools.len();
                self.cursor = self.pools[self.cursor_pool].0;
            } else {
                self.cursor = ip + 1;
            }
            if !self.allocated.contains(&ip) {
                self.mark(ip);
                return Ok(ip);
            }
        }
    }

    /// Takes one given address (inside or outside the pools, like neutron allows for fixed IPs in the cidr).
    pub fn allocate_specific(&mut self, ip: u128) -> Result<(), AllocError> {
        if self.allocated.contains(&ip) {
            return Err(AllocError::AlreadyAllocated);
        }
        self.mark(ip);
        Ok(())
    }

    fn mark(&mut self, ip: u128) {
        self.allocated.insert(ip);
        if self.in_pool(ip) {
            self.pool_used += 1;
        }
    }

    pub fn release(&mut self, ip: u128) {
        if self.allocated.remove(&ip) && self.in_pool(ip) {
            self.pool_used -= 1;
            self.free.push(ip);
        }
    }
}

/// Finds the first free aligned block of `prefixlen` inside `prefixes` that overlaps none of `taken`.
pub fn allocate_prefix(prefixes: &[Cidr], taken: &[Cidr], prefixlen: u8) -> Option<Cidr> {
    let mut taken: Vec<Cidr> = taken.to_vec();
    taken.sort_by_key(|c| c.first());
    for p in prefixes {
        if prefixlen < p.prefix || prefixlen > bits(p.version) {
            continue;
        }
        let mut start = p.first();
        loop {
            let block = Cidr::from_parts(p.version, start, prefixlen);
            if block.last() > p.last() {
                break;
            }
            match taken.iter().find(|t| t.overlaps(&block)) {
                None => return Some(block),
                Some(t) => {
                    // Skip past the overlapping allocation, re-aligned to the block size.
                    let next = t.last().max(block.last()).checked_add(1)?;
                    let step = block.span() + 1;
                    start = next.div_ceil(step).checked_mul(step)?;
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parse_and_ranges() {
        let c = Cidr::parse("10.20.0.0/22")
            .map_err(|_| "parse")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(format_ip(4, c.default_gateway()), "10.20.0.1");
        let pools = default_pools(&c, Some(c.default_gateway()));
        assert_eq!(pools.len(), 1);
        assert_eq!(format_ip(4, pools[0].0), "10.20.0.2");
        assert_eq!(format_ip(4, pools[0].1), "10.20.3.254");
        assert_eq!(Cidr::parse("10.0.0.1/24"), Err(Some("10.0.0.0/24".to_string())));
        assert_eq!(Cidr::parse("nonsense"), Err(None));
        let v6 = Cidr::parse("fd00:10::/64")
            .map_err(|_| "parse")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(format_ip(6, v6.default_gateway()), "fd00:10::");
        let p6 = default_pools(&v6, Some(v6.default_gateway()));
        assert_eq!(format_ip(6, p6[0].0), "fd00:10::1");
        assert_eq!(format_ip(6, p6[0].1), "fd00:10::ffff:ffff:ffff:ffff");
    }

    #[test]
    fn allocation_exhausts_and_reuses() {
        let c = Cidr::parse("10.31.0.0/29")
            .map_err(|_| "parse")
            .unwrap_or_else(|e| panic!("{e}"));
        let mut ipam = SubnetIpam::new(4, default_pools(&c, Some(c.default_gateway())));
        assert_eq!(ipam.pool_total(), 5);
        let got: Vec<u128> = (0..5).filter_map(|_| ipam.allocate_any().ok()).collect();
        assert_eq!(got.len(), 5);
        assert_eq!(ipam.allocate_any(), Err(AllocError::Exhausted));
        ipam.release(got[2]);
        assert_eq!(ipam.allocate_any(), Ok(got[2]));
        assert_eq!(ipam.allocate_specific(got[0]), Err(AllocError::AlreadyAllocated));
    }

    #[test]
    fn prefix_allocation_skips_taken_blocks() {
        let pool = Cidr::parse("10.128.0.0/16")
            .map_err(|_| "parse")
            .unwrap_or_else(|e| panic!("{e}"));
        let first = allocate_prefix(&[pool], &[], 26).map(|c| c.to_string());
        assert_eq!(first.as_deref(), Some("10.128.0.0/26"));
        let taken = [Cidr::parse("10.128.0.0/26")
            .map_err(|_| "parse")
            .unwrap_or_else(|e| panic!("{e}"))];
        let second = allocate_prefix(&[pool], &taken, 28).map(|c| c.to_string());
        assert_eq!(second.as_deref(), Some("10.128.0.64/28"));
        let tiny = Cidr::parse("10.0.0.0/30")
            .map_err(|_| "parse")
            .unwrap_or_else(|e| panic!("{e}"));
        let full = [tiny];
        assert!(allocate_prefix(&[tiny], &full, 30).is_none());
    }
}
