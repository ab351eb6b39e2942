//! Addresses as the mesh model names them: `network/ip` pairs, `namespace/hostname`
//! pairs, and the checks every decoder (local YAML, xDS) needs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::name::Name;
use crate::names::{from_str_with, StrError};

/// Why an address could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    /// A text form that is not an IP address.
    #[error("{0:?} is not an IP address")]
    NotAnIp(String),
    /// Raw address bytes of a length other than 4 or 16.
    #[error("address must be 4 or 16 bytes, got {0}")]
    BadLength(usize),
    /// A prefix length larger than the address family allows.
    #[error("prefix length {len} is too long for {addr}")]
    BadPrefix { addr: IpAddr, len: u32 },
    /// Not of the form `<network>/<ip>`.
    #[error("{0:?} is not a \"<network>/<ip>\" address")]
    NotNetworkAddress(String),
    /// Not of the form `<namespace>/<hostname>`.
    #[error("{0:?} is not \"<namespace>/<hostname>\"")]
    NotNamespacedHostname(String),
    /// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`). The data path sees IPv4 peers and
    /// destinations as plain IPv4, so such an entry would never match anything.
    #[error(
        "{written:?} is an IPv4-mapped IPv6 address, which never matches: connections from and to IPv4 addresses are seen as plain IPv4; write {instead:?}"
    )]
    Ipv4Mapped { written: String, instead: String },
}

/// Refuses an IPv4-mapped IPv6 address (see [`AddressError::Ipv4Mapped`]). One rule for
/// every address the mesh model holds: workload IPs, VIPs, gateway and policy addresses.
fn refuse_mapped(
    ip: IpAddr,
    written: &str,
    instead: impl Fn(Ipv4Addr) -> String,
) -> Result<IpAddr, AddressError> {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => Err(AddressError::Ipv4Mapped {
                written: written.to_string(),
                instead: instead(v4),
            }),
            None => Ok(ip),
        },
        IpAddr::V4(_) => Ok(ip),
    }
}

/// Decodes an address carried as raw bytes (xDS `bytes` fields): 4 bytes IPv4, 16 IPv6.
pub fn ip_from_bytes(bytes: &[u8]) -> Result<IpAddr, AddressError> {
    if let Ok(b) = <[u8; 4]>::try_from(bytes) {
        return Ok(IpAddr::V4(Ipv4Addr::from(b)));
    }
    if let Ok(b) = <[u8; 16]>::try_from(bytes) {
        let ip = IpAddr::V6(Ipv6Addr::from(b));
        return refuse_mapped(ip, &ip.to_string(), |v4| v4.to_string());
    }
    Err(AddressError::BadLength(bytes.len()))
}

/// Parses the text form of an IP address.
pub fn parse_ip(s: &str) -> Result<IpAddr, AddressError> {
    let ip = s
        .parse()
        .map_err(|_| AddressError::NotAnIp(s.to_string()))?;
    refuse_mapped(ip, s, |v4| v4.to_string())
}

fn max_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

/// An address within a network: a workload IP or a service VIP. A VIP with a prefix
/// length shorter than the full address is a CIDR VIP (any address inside matches).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetworkAddress {
    /// Network name; "" is the default network.
    pub network: Name,
    pub address: IpAddr,
    /// `None` for an exact address; `Some(len)` (< 32/128) for a CIDR VIP.
    pub prefix_len: Option<u8>,
}

impl NetworkAddress {
    /// An exact address.
    pub fn new(network: impl Into<Name>, address: IpAddr) -> Self {
        NetworkAddress {
            network: network.into(),
            address,
            prefix_len: None,
        }
    }

    /// Builds from xDS parts: raw bytes and an optional prefix length (absent or the
    /// full length means an exact address).
    pub fn from_parts(
        network: impl Into<Name>,
        bytes: &[u8],
        length: Option<u32>,
    ) -> Result<Self, AddressError> {
        let address = ip_from_bytes(bytes)?;
        let prefix_len = normalize_prefix(address, length)?;
        Ok(NetworkAddress {
            network: network.into(),
            address,
            prefix_len,
        })
    }

    /// True if `ip` is this address, or inside this CIDR VIP.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match self.prefix_len {
            None => self.address == ip,
            Some(len) => match ipnet::IpNet::new(self.address, len) {
                Ok(net) => net.contains(&ip),
                Err(_) => false,
            },
        }
    }

    /// The CIDR form of a CIDR VIP (`None` for an exact address).
    pub fn cidr(&self) -> Option<ipnet::IpNet> {
        self.prefix_len
            .and_then(|len| ipnet::IpNet::new(self.address, len).ok())
            .map(|n| n.trunc())
    }
}

fn normalize_prefix(address: IpAddr, length: Option<u32>) -> Result<Option<u8>, AddressError> {
    match length {
        None => Ok(None),
        Some(len) => {
            let max = max_prefix(address);
            if len > u32::from(max) {
                Err(AddressError::BadPrefix { addr: address, len })
            } else if len == u32::from(max) {
                Ok(None)
            } else {
                // len < max <= 128, so it fits in u8.
                Ok(Some(len as u8))
            }
        }
    }
}

impl fmt::Display for NetworkAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.address)?;
        if let Some(len) = self.prefix_len {
            write!(f, "/{len}")?;
        }
        Ok(())
    }
}

impl FromStr for NetworkAddress {
    type Err = AddressError;

    /// `<network>/<ip>` or `<network>/<ip>/<prefix-len>`; the network may be empty
    /// (`/10.0.0.1`). A bare IP is accepted as the default network.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            let ip = refuse_mapped(ip, s, |v4| v4.to_string())?;
            return Ok(NetworkAddress::new("", ip));
        }
        let bad = || AddressError::NotNetworkAddress(s.to_string());
        let (network, rest) = s.split_once('/').ok_or_else(bad)?;
        let (ip, len) = match rest.split_once('/') {
            Some((ip, len)) => (ip, Some(len.parse::<u32>().map_err(|_| bad())?)),
            None => (rest, None),
        };
        let address: IpAddr = ip.parse().map_err(|_| bad())?;
        let address = refuse_mapped(address, s, |v4| match len {
            Some(len) if len >= 96 => format!("{network}/{v4}/{}", len - 96),
            Some(_) => format!("{network}/<an IPv4 CIDR>"),
            None => format!("{network}/{v4}"),
        })?;
        let prefix_len = normalize_prefix(address, len)?;
        Ok(NetworkAddress {
            network: network.into(),
            address,
            prefix_len,
        })
    }
}

impl Serialize for NetworkAddress {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NetworkAddress {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "\"<network>/<ip>\"", |s| {
            s.parse().map_err(StrError::Custom)
        })
    }
}

/// A service named by namespace and hostname (`namespace/hostname`), the key workloads
/// use to list the services they serve.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespacedHostname {
    pub namespace: Name,
    pub hostname: Name,
}

impl fmt::Display for NamespacedHostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.hostname)
    }
}

impl FromStr for NamespacedHostname {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, host)) if !ns.is_empty() && !host.is_empty() && !host.contains('/') => {
                Ok(NamespacedHostname {
                    namespace: ns.into(),
                    hostname: host.into(),
                })
            }
            _ => Err(AddressError::NotNamespacedHostname(s.to_string())),
        }
    }
}

/// serde helper: a list of IP addresses in text form, with an error that quotes the
/// offending entry.
pub(crate) mod ip_list {
    use super::*;

    struct IpText(IpAddr);

    impl<'de> Deserialize<'de> for IpText {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            from_str_with(d, "an IP address", |s| {
                parse_ip(s).map(IpText).map_err(StrError::Custom)
            })
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpAddr>, D::Error> {
        let v: Vec<IpText> = Vec::deserialize(d)?;
        Ok(v.into_iter().map(|t| t.0).collect())
    }

    pub fn serialize<S: Serializer>(v: &[IpAddr], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v)
    }
}

/// serde helper: a list of CIDRs (`10.0.0.0/8`) or bare addresses (one host).
pub(crate) mod cidr_list {
    use super::*;
    use ipnet::IpNet;

    struct CidrText(IpNet);

    pub(crate) fn parse_cidr(s: &str) -> Result<IpNet, String> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            let ip = refuse_mapped(ip, s, |v4| v4.to_string()).map_err(|e| e.to_string())?;
            return Ok(IpNet::from(ip));
        }
        let net = s
            .parse::<IpNet>()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR"))?;
        let len = net.prefix_len();
        refuse_mapped(net.addr(), s, |v4| match len {
            96.. => format!("{v4}/{}", len - 96),
            _ => "an IPv4 CIDR".to_string(),
        })
        .map_err(|e| e.to_string())?;
        Ok(net)
    }

    impl<'de> Deserialize<'de> for CidrText {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            from_str_with(d, "an IP address or CIDR", |s| {
                parse_cidr(s).map(CidrText).map_err(StrError::Custom)
            })
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
        let v: Vec<CidrText> = Vec::deserialize(d)?;
        Ok(v.into_iter().map(|t| t.0).collect())
    }

    pub fn serialize<S: Serializer>(v: &[IpNet], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|n| n.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(
            ip_from_bytes(&[10, 0, 0, 1]).unwrap(),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            ip_from_bytes(&[0; 16]).unwrap(),
            "::".parse::<IpAddr>().unwrap()
        );
        assert_eq!(ip_from_bytes(&[1, 2, 3]), Err(AddressError::BadLength(3)));
        assert_eq!(ip_from_bytes(&[]), Err(AddressError::BadLength(0)));
    }

    #[test]
    fn ipv4_mapped_addresses_are_refused_everywhere() {
        let mapped = |e: AddressError| matches!(e, AddressError::Ipv4Mapped { .. });
        let mut bytes = [0u8; 16];
        bytes[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 1]);
        assert!(mapped(ip_from_bytes(&bytes).unwrap_err()));
        assert!(mapped(parse_ip("::ffff:10.0.0.1").unwrap_err()));
        for s in [
            "::ffff:10.0.0.1",
            "/::ffff:10.0.0.1",
            "n/::ffff:10.0.0.0/104",
        ] {
            assert!(mapped(s.parse::<NetworkAddress>().unwrap_err()), "{s}");
        }
        assert!(cidr_list::parse_cidr("::ffff:10.0.0.0/104").is_err());
        assert!(cidr_list::parse_cidr("::ffff:0.0.0.0/80").is_err());
        // Their neighbours are fine: IPv4-compatible and NAT64 addresses are real IPv6.
        for s in ["::10.0.0.1", "64:ff9b::10.0.0.1", "::ffff:0:10.0.0.1"] {
            assert!(parse_ip(s).is_ok(), "{s}");
        }
        assert!(cidr_list::parse_cidr("::/0").is_ok());
    }

    #[test]
    fn network_address_text() {
        let a: NetworkAddress = "/10.96.0.10".parse().unwrap();
        assert_eq!(a, NetworkAddress::new("", "10.96.0.10".parse().unwrap()));
        assert_eq!(a.to_string(), "/10.96.0.10");
        let a: NetworkAddress = "net1/10.0.0.1".parse().unwrap();
        assert_eq!(a.network, "net1");
        let a: NetworkAddress = "10.0.0.1".parse().unwrap();
        assert_eq!(a.network, "");
        let a: NetworkAddress = "/fd00::1".parse().unwrap();
        assert!(a.address.is_ipv6());
        let a: NetworkAddress = "/10.96.0.0/16".parse().unwrap();
        assert_eq!(a.prefix_len, Some(16));
        assert!(a.contains("10.96.3.4".parse().unwrap()));
        assert!(!a.contains("10.97.3.4".parse().unwrap()));
        assert_eq!(a.to_string(), "/10.96.0.0/16");
        let a: NetworkAddress = "/10.96.0.1/32".parse().unwrap();
        assert_eq!(a.prefix_len, None);
        assert!("/10.96.0.1/33".parse::<NetworkAddress>().is_err());
        assert!("/10.96.0.300".parse::<NetworkAddress>().is_err());
        assert!("nope".parse::<NetworkAddress>().is_err());
        assert!("/10.0.0.1/x".parse::<NetworkAddress>().is_err());
    }

    #[test]
    fn from_parts() {
        let a = NetworkAddress::from_parts("", &[10, 0, 0, 0], Some(8)).unwrap();
        assert_eq!(a.prefix_len, Some(8));
        let a = NetworkAddress::from_parts("", &[10, 0, 0, 1], Some(32)).unwrap();
        assert_eq!(a.prefix_len, None);
        assert!(NetworkAddress::from_parts("", &[10, 0, 0, 1], Some(40)).is_err());
        assert!(NetworkAddress::from_parts("", &[10, 0, 0], None).is_err());
    }

    #[test]
    fn namespaced_hostname() {
        let n: NamespacedHostname = "default/echo.default.svc.cluster.local".parse().unwrap();
        assert_eq!(n.namespace, "default");
        assert_eq!(n.to_string(), "default/echo.default.svc.cluster.local");
        for bad in ["", "/x", "x/", "x", "a/b/c"] {
            assert!(bad.parse::<NamespacedHostname>().is_err(), "{bad}");
        }
    }
}
