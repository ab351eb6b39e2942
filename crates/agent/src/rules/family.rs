//! IPv4 or IPv6: the per-family names, addresses and commands the rules are written with.

use std::net::IpAddr;

use ambit_wellknown::probes::{SNAT_V4 as PROBE_SNAT_V4, SNAT_V6 as PROBE_SNAT_V6};

/// IPv4 or IPv6: which iptables flavour, which loopback, which probe address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// Both families, v4 first.
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The family of an address (IPv4-mapped IPv6 counts as IPv4).
    pub fn of(ip: IpAddr) -> Family {
        match unmap(ip) {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// `iptables-restore` / `ip6tables-restore`.
    pub fn restore_command(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }

    /// `iptables-save` / `ip6tables-save`.
    pub fn save_command(self) -> &'static str {
        match self {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        }
    }

    /// The loopback destination the rules exempt, as written in the rules.
    pub fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.1/32",
            Family::V6 => "::1/128",
        }
    }

    /// The probe SNAT address.
    pub fn probe_snat(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(PROBE_SNAT_V4),
            Family::V6 => IpAddr::V6(PROBE_SNAT_V6),
        }
    }

    /// `inet` / `inet6` (ipset family names).
    pub fn ipset_family(self) -> &'static str {
        match self {
            Family::V4 => "inet",
            Family::V6 => "inet6",
        }
    }

    /// `-4` / `-6` (the `ip` flag).
    pub(crate) fn ip_flag(self) -> &'static str {
        match self {
            Family::V4 => "-4",
            Family::V6 => "-6",
        }
    }

    /// The default route as written for `ip route`.
    pub(crate) fn any_route(self) -> &'static str {
        match self {
            Family::V4 => "0.0.0.0/0",
            Family::V6 => "::/0",
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) as IPv4; anything else unchanged.
pub fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}
