//! MAC and fixed-IP allocation for ports; every helper gives back what it took when it fails.

use rand::Rng;
use serde_json::Value;

use super::{ROUTER_INTERFACE_OWNER, Store, Subnet};
use crate::error::{ApiError, ApiResult, Resource};
use crate::input::{self, Obj};
use crate::ipam::{self, AllocError};

#[derive(Debug, Clone)]
pub struct FixedIp {
    pub subnet_id: String,
    pub version: u8,
    pub ip: u128,
}

impl FixedIp {
    fn is(&self, subnet_id: &str, ip: u128) -> bool {
        self.subnet_id == subnet_id && self.ip == ip
    }

    fn same_address(&self, other: &FixedIp) -> bool {
        other.is(&self.subnet_id, self.ip)
    }
}

/// What address allocation needs to know about the port.
#[derive(Debug, Clone, Copy)]
pub(super) struct AddrCtx<'a> {
    pub(super) mac: &'a str,
    /// Router interfaces get only the addresses they ask for.
    pub(super) auto_addresses: bool,
}

/// Modified EUI-64 interface identifier (RFC 4291): fa:16:3e:16:e6:e0 -> f816:3eff:fe16:e6e0.
fn eui64_interface_id(mac: &str) -> u128 {
    let b: Vec<u128> = mac
        .split(':')
        .map(|p| u128::from(u8::from_str_radix(p, 16).unwrap_or(0)))
        .collect();
    if b.len() != 6 {
        return 0;
    }
    ((b[0] ^ 0x02) << 56)
        | (b[1] << 48)
        | (b[2] << 40)
        | (0xff << 32)
        | (0xfe << 24)
        | (b[3] << 16)
        | (b[4] << 8)
        | b[5]
}

impl Store {
    pub(super) fn new_mac(&mut self) -> String {
        let mut rng = rand::rng();
        loop {
            let b: [u8; 3] = rng.random();
            let mac = format!("fa:16:3e:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2]);
            if self.macs.insert(mac.clone()) {
                return mac;
            }
        }
    }

    /// The MAC and the requested (or default) fixed IPs of a port being created on `network_id`; nothing stays
    /// taken on error.
    pub(super) fn allocate_port(&mut self, obj: &Obj, network_id: &str) -> ApiResult<(String, Vec<FixedIp>)> {
        let mac = match input::opt_str(obj, "mac_address")? {
            Some(m) => {
                let m = m.to_ascii_lowercase();
                if !self.macs.insert(m.clone()) {
                    return Err(ApiError::mac_in_use(network_id, &m));
                }
                m
            }
            None => self.new_mac(),
        };
        let requested = input::opt_list(obj, "fixed_ips")?;
        let owner = input::opt_str(obj, "device_owner")?.unwrap_or_default();
        let addr = AddrCtx {
            mac: &mac,
            auto_addresses: owner != ROUTER_INTERFACE_OWNER,
        };
        match self.allocate_ips(network_id, requested.as_deref(), &[], addr) {
            Ok(ips) => Ok((mac, ips)),
            Err(e) => {
                self.macs.remove(&mac);
                Err(e)
            }
        }
    }

    pub(super) fn allocate_ips(
        &mut self,
        network_id: &str,
        requested: Option<&[Value]>,
        keep: &[FixedIp],
        addr: AddrCtx<'_>,
    ) -> ApiResult<Vec<FixedIp>> {
        let mut taken: Vec<FixedIp> = Vec::new();
        let res = self.allocate_ips_inner(network_id, requested, keep, addr, &mut taken);
        if res.is_err() {
            // Give back only what this call took, not the addresses the port already had.
            self.release_ips(&taken, keep);
        }
        res.map(|()| taken)
    }

    /// Gives `ips` back to their subnets, except those also in `keep`.
    pub(super) fn release_ips(&mut self, ips: &[FixedIp], keep: &[FixedIp]) {
        for f in ips.iter().filter(|f| !keep.iter().any(|k| k.same_address(f))) {
            if let Some(s) = self.subnets.get_mut(&f.subnet_id) {
                s.ipam.release(f.ip);
            }
        }
    }

    /// Gives back the MAC and addresses of a port that is gone (or was never created).
    pub(super) fn release_port(&mut self, mac: &str, ips: &[FixedIp]) {
        self.macs.remove(mac);
        self.release_ips(ips, &[]);
    }

    /// The EUI-64 address of `mac` on an address-autoconfiguration (SLAAC / DHCPv6-stateless) subnet.
    fn take_auto_address(
        &mut self,
        sid: &str,
        mac: &str,
        keep: &[FixedIp],
        taken: &mut Vec<FixedIp>,
    ) -> ApiResult<()> {
        let Some(s) = self.subnets.get_mut(sid) else {
            return Ok(());
        };
        let ip = s.cidr.network | eui64_interface_id(mac);
        if let Some(k) = keep.iter().find(|k| k.is(sid, ip)) {
            taken.push(k.clone());
            return Ok(());
        }
        if s.ipam.allocate_specific(ip).is_err() {
            return Err(ApiError::ip_already_allocated(&ipam::format_ip(6, ip), sid));
        }
        taken.push(FixedIp {
            subnet_id: sid.to_string(),
            version: 6,
            ip,
        });
        Ok(())
    }

    fn allocate_ips_inner(
        &mut self,
        network_id: &str,
        requested: Option<&[Value]>,
        keep: &[FixedIp],
        addr: AddrCtx<'_>,
        taken: &mut Vec<FixedIp>,
    ) -> ApiResult<()> {
        let net_subnets: Vec<String> = self
            .networks
            .get(network_id)
            .map(|n| n.subnets.clone())
            .unwrap_or_default();
        let auto_subnets: Vec<String> = net_subnets
            .iter()
            .filter(|id| self.subnets.get(*id).is_some_and(Subnet::is_auto_address))
            .cloned()
            .collect();
        let exhausted = || {
            ApiError::conflict(
                "IpAddressGenerationFailure",
                format!("No more IP addresses available on network {network_id}."),
            )
        };
        let Some(requested) = requested else {
            // Default: one address per IP version, from the first subnet of that version with room.
            for version in [4u8, 6u8] {
                let candidates: Vec<&String> = net_subnets
                    .iter()
                    .filter(|id| {
                        self.subnets
                            .get(*id)
                            .is_some_and(|s| s.cidr.version == version && !s.is_auto_address())
                    })
                    .collect();
                if candidates.is_empty() {
                    continue;
                }
                let Some(sid) = candidates
                    .into_iter()
                    .find(|id| self.subnets.get(*id).is_some_and(|s| s.ipam.has_free()))
                    .cloned()
                else {
                    if version == 4 {
                        return Err(exhausted());
                    }
                    continue;
                };
                if let Some(s) = self.subnets.get_mut(&sid) {
                    let ip = s.ipam.allocate_any().map_err(|_| exhausted())?;
                    taken.push(FixedIp {
                        subnet_id: sid,
                        version,
                        ip,
                    });
                }
            }
            if addr.auto_addresses {
                for sid in &auto_subnets {
                    self.take_auto_address(sid, addr.mac, keep, taken)?;
                }
            }
            return Ok(());
        };
        for item in requested {
            let Value::Object(fip) = item else {
                return Err(ApiError::invalid_attr(
                    "fixed_ips",
                    format!("'{item}' is not a dictionary"),
                ));
            };
            for k in fip.keys() {
                if k != "subnet_id" && k != "ip_address" {
                    return Err(ApiError::invalid_attr(
                        "fixed_ips",
                        format!("Unrecognized key '{k}' in fixed_ips"),
                    ));
                }
            }
            let subnet_id = input::opt_str(fip, "subnet_id")?;
            let ip_str = input::opt_str(fip, "ip_address")?;
            let ip = match &ip_str {
                None => None,
                Some(s) => Some(ipam::parse_ip(s).ok_or_else(|| {
                    ApiError::invalid_attr("fixed_ips", format!("'{s}' is not a valid IP address"))
                })?),
            };
            let sid = match (&subnet_id, ip) {
                (Some(sid), _) => {
                    let s = self.subnets.get(sid).ok_or_else(|| ApiError::resource_not_found(Resource::Subnet, sid))?;
                    if s.network_id != network_id {
                        return Err(ApiError::invalid_input(format!(
                            "Failed to create port on network {network_id}, because fixed_ips included invalid subnet {sid}"
                        )));
                    }
                    if let Some((v, ip)) = ip
                        && !s.cidr.contains(v, ip)
                    {
                        return Err(ApiError::bad_request(format!(
                            "IP address {} is not a valid IP for the specified subnet.",
                            ip_str.clone().unwrap_or_default()
                        ))
                        .with_kind("InvalidIpForSubnet"));
                    }
                    sid.clone()
                }
                (None, Some((v, ip))) => net_subnets
                    .iter()
                    .find(|id| self.subnets.get(*id).is_some_and(|s| s.cidr.contains(v, ip)))
                    .cloned()
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "IP address {} is not a valid IP for any of the subnets on the specified network.",
                            ip_str.clone().unwrap_or_default()
                        ))
                        .with_kind("InvalidIpForNetwork")
                    })?,
                (None, None) => {
                    return Err(ApiError::invalid_attr("fixed_ips", "Exactly one of subnet_id or ip_address is required"));
                }
            };
            if let Some((_, ip)) = ip
                && let Some(k) = keep.iter().find(|k| k.is(&sid, ip))
            {
                taken.push(k.clone());
                continue;
            }
            if ip.is_none() && auto_subnets.contains(&sid) {
                self.take_auto_address(&sid, addr.mac, keep, taken)?;
                continue;
            }
            let Some(s) = self.subnets.get_mut(&sid) else {
                continue;
            };
            let version = s.cidr.version;
            match ip {
                Some((_, ip)) => match s.ipam.allocate_specific(ip) {
                    Ok(()) => taken.push(FixedIp {
                        subnet_id: sid,
                        version,
                        ip,
                    }),
                    Err(_) => {
                        return Err(ApiError::ip_already_allocated(
                            &ipam::format_ip(version, ip),
                            &sid,
                        ));
                    }
                },
                None => match s.ipam.allocate_any() {
                    Ok(ip) => taken.push(FixedIp {
                        subnet_id: sid,
                        version,
                        ip,
                    }),
                    Err(AllocError::Exhausted | AllocError::AlreadyAllocated) => return Err(exhausted()),
                },
            }
        }
        // Autoconfiguration subnets always give the port its EUI-64 address, asked for or not.
        if addr.auto_addresses {
            for sid in &auto_subnets {
                if !taken.iter().any(|f| &f.subnet_id == sid) {
                    self.take_auto_address(sid, addr.mac, keep, taken)?;
                }
            }
        }
        Ok(())
    }
}
