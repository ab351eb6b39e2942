//! The CONNECT `:authority`: the target of the tunnel.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use crate::error::HeaderError;
use crate::headers::excerpt;

/// Longest `:authority` accepted: a 253-byte DNS name, `:`, a 5-digit port, with slack for a
/// bracketed IPv6 address with a scope id.
pub const MAX_AUTHORITY_LEN: usize = 261;

/// Longest DNS name (RFC 1035, without the trailing dot).
const MAX_DNS_NAME_LEN: usize = 253;
/// Longest DNS label.
const MAX_DNS_LABEL_LEN: usize = 63;

/// The target of an HBONE tunnel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Authority {
    /// `ip:port` (IPv6 bracketed on the wire): a workload address or a service VIP.
    Addr(SocketAddr),
    /// `host:port`: a service hostname (double HBONE). The host is a lower-cased DNS name.
    Host {
        /// The DNS name, lower-case.
        host: String,
        /// The port the client dialed.
        port: u16,
    },
}

impl Authority {
    /// The target port.
    pub fn port(&self) -> u16 {
        match self {
            Authority::Addr(a) => a.port(),
            Authority::Host { port, .. } => *port,
        }
    }

    /// The target IP, if the authority is an address.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Authority::Addr(a) => Some(a.ip()),
            Authority::Host { .. } => None,
        }
    }
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Authority::Addr(a) => write!(f, "{a}"),
            Authority::Host { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl FromStr for Authority {
    type Err = HeaderError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_authority(s)
    }
}

impl From<SocketAddr> for Authority {
    fn from(a: SocketAddr) -> Self {
        Authority::Addr(a)
    }
}

/// Parses a CONNECT `:authority`: first as a socket address (`1.2.3.4:80`, `[::1]:80`), else as
/// `host:port` where the port is mandatory and the host must be a valid DNS name.
/// Port 0 is rejected: it can never be a tunnel target.
pub fn parse_authority(s: &str) -> Result<Authority, HeaderError> {
    if s.is_empty() {
        return Err(HeaderError::EmptyAuthority);
    }
    if s.len() > MAX_AUTHORITY_LEN {
        return Err(HeaderError::AuthorityTooLong(s.len()));
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        if addr.port() == 0 {
            return Err(HeaderError::InvalidPort(excerpt(s)));
        }
        return Ok(Authority::Addr(addr));
    }
    // A bare IP address, or a bracketed IPv6 address, without a port.
    if s.parse::<IpAddr>().is_ok() || (s.starts_with('[') && s.ends_with(']')) {
        return Err(HeaderError::MissingPort(excerpt(s)));
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(HeaderError::MissingPort(excerpt(s)));
    };
    // Brackets or colons that did not make a socket address above.
    if host.contains(['[', ']', ':']) {
        return Err(HeaderError::InvalidHost(excerpt(s)));
    }
    let port = parse_port(port).ok_or_else(|| HeaderError::InvalidPort(excerpt(s)))?;
    if !is_dns_name(host) {
        return Err(HeaderError::InvalidHost(excerpt(s)));
    }
    Ok(Authority::Host {
        host: host.to_ascii_lowercase(),
        port,
    })
}

/// A decimal port in 1..=65535: digits only (no sign, no spaces), at most 5 of them.
fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u16>().ok().filter(|p| *p != 0)
}

/// RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens, 1-63 bytes
/// each, 253 bytes in all; the last label is not all-numeric (that would be a malformed IP).
pub(crate) fn is_dns_name(host: &str) -> bool {
    if host.is_empty() || host.len() > MAX_DNS_NAME_LEN {
        return false;
    }
    let mut last = "";
    for label in host.split('.') {
        let b = label.as_bytes();
        if b.is_empty() || b.len() > MAX_DNS_LABEL_LEN {
            return false;
        }
        if !b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-') {
            return false;
        }
        if b.first() == Some(&b'-') || b.last() == Some(&b'-') {
            return false;
        }
        last = label;
    }
    !last.bytes().all(|c| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4() {
        let a = parse_authority("10.0.2.5:8080").unwrap();
        assert_eq!(a, Authority::Addr("10.0.2.5:8080".parse().unwrap()));
        assert_eq!(a.to_string(), "10.0.2.5:8080");
        assert_eq!(a.port(), 8080);
        assert_eq!(a.ip(), Some("10.0.2.5".parse().unwrap()));
    }

    #[test]
    fn ipv6_bracketed() {
        let a = parse_authority("[ff06::c3]:80").unwrap();
        assert_eq!(a, Authority::Addr("[ff06::c3]:80".parse().unwrap()));
        assert_eq!(a.to_string(), "[ff06::c3]:80");
    }

    #[test]
    fn hostname() {
        let a = parse_authority("remote.default.svc.cluster.local:8080").unwrap();
        assert_eq!(
            a,
            Authority::Host {
                host: "remote.default.svc.cluster.local".into(),
                port: 8080
            }
        );
        assert_eq!(a.to_string(), "remote.default.svc.cluster.local:8080");
        assert_eq!(a.ip(), None);
        // Case is normalised.
        assert_eq!(
            parse_authority("Example.COM:1").unwrap().to_string(),
            "example.com:1"
        );
        // Single label, digits-first labels, inner hyphens are fine.
        assert!(parse_authority("localhost:80").is_ok());
        assert!(parse_authority("3com.x-y.io:80").is_ok());
    }

    #[test]
    fn missing_port() {
        for s in ["example.com", "10.0.0.1", "[::1]", "::1", "ff06::c3"] {
            assert!(
                matches!(parse_authority(s), Err(HeaderError::MissingPort(_))),
                "{s}: {:?}",
                parse_authority(s)
            );
        }
    }

    #[test]
    fn bad_port() {
        for s in [
            "example.com:",
            "example.com:0",
            "10.0.0.1:0",
            "example.com:65536",
            "example.com:+80",
            "example.com:8 0",
            "example.com:123456",
            "example.com:http",
            "example.com:-1",
        ] {
            assert!(
                matches!(parse_authority(s), Err(HeaderError::InvalidPort(_))),
                "{s}: {:?}",
                parse_authority(s)
            );
        }
    }

    #[test]
    fn garbage() {
        for s in [
            ":80",
            "exa mple.com:80",
            "-a.com:80",
            "a-.com:80",
            "a..b:80",
            ".a:80",
            "a.:80",
            "a_b.com:80",
            "1.2.3:80",
            "300.1.1.1:80",
            "[::1:80",
            "[zz::1]:80",
            "é.com:80",
            "a/b:80",
            "user@host:80",
            "host:80\u{0}",
            "\u{0}:80",
            "\u{202e}:1",
        ] {
            let r = parse_authority(s);
            assert!(r.is_err(), "{s:?} parsed as {r:?}");
        }
        assert_eq!(parse_authority(""), Err(HeaderError::EmptyAuthority));
    }

    #[test]
    fn huge() {
        let s = format!("{}:80", "a".repeat(10_000));
        assert_eq!(
            parse_authority(&s),
            Err(HeaderError::AuthorityTooLong(s.len()))
        );
        // A long but valid name: 4 labels of 63 = 255 with dots > 253 ⇒ invalid.
        let label = "a".repeat(63);
        let name = [label.as_str(); 4].join(".");
        assert!(parse_authority(&format!("{name}:80")).is_err());
        let name = [
            label.as_str(),
            label.as_str(),
            label.as_str(),
            "abcdefghijklmnopqrstuvwxyz",
        ]
        .join(".");
        assert!(parse_authority(&format!("{name}:80")).is_ok());
        assert!(parse_authority(&format!("{}.com:80", "a".repeat(64))).is_err());
        // Error messages are bounded and escaped.
        let s = format!("{}\n", "x".repeat(200));
        let msg = parse_authority(&s).unwrap_err().to_string();
        assert!(msg.len() < 200, "{msg}");
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn display_round_trip() {
        for s in [
            "1.2.3.4:5",
            "[::1]:80",
            "[fe80::1%2]:80",
            "svc.ns.svc.cluster.local:443",
        ] {
            let a = parse_authority(s).unwrap();
            assert_eq!(parse_authority(&a.to_string()).unwrap(), a);
        }
    }
}
