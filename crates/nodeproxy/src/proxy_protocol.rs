//! PROXY protocol v2 (reference §2.9): the header written to an application tunnel
//! (`application_tunnel.protocol: PROXY`) after the upstream connection is made and before
//! any payload, telling the app who the HBONE client was. Sans-IO: bytes out only.
//!
//! Layout (the PROXY protocol specification, version 2): 12-byte signature, version 2 and
//! command PROXY (`0x21`), family and transport (`0x11` TCP/IPv4, `0x21` TCP/IPv6), the
//! length of what follows (big-endian), source and destination addresses and ports, then
//! TLVs. TLV `0xD0` carries the client's SPIFFE id.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The v2 signature.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// TLV type for the peer's SPIFFE identity (Istio's choice, in the custom range).
pub const TLV_PEER_IDENTITY: u8 = 0xD0;

/// A header that cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyHeaderError {
    /// The TLVs would not fit the 16-bit length field; the identity came from a
    /// certificate, so it is the peer's certificate that is unusual.
    #[error("PROXY v2 header too long: {0} bytes after the fixed part (at most 65535)")]
    TooLong(usize),
}

/// Encodes a PROXY v2 header for a TCP connection from `src` to `dst`, with the peer's
/// identity as TLV 0xD0 when there is one. Mixed families are sent as IPv6 (an IPv4
/// address as `::ffff:a.b.c.d`), since one header has one family.
pub fn encode(
    src: SocketAddr,
    dst: SocketAddr,
    peer_identity: Option<&str>,
) -> Result<Vec<u8>, ProxyHeaderError> {
    let v6 = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let mut addrs = Vec::with_capacity(36);
    let family = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            addrs.extend_from_slice(&s.octets());
            addrs.extend_from_slice(&d.octets());
            0x11
        }
        (s, d) => {
            let (s, d): (Ipv6Addr, Ipv6Addr) = (v6(s), v6(d));
            addrs.extend_from_slice(&s.octets());
            addrs.extend_from_slice(&d.octets());
            0x21
        }
    };
    addrs.extend_from_slice(&src.port().to_be_bytes());
    addrs.extend_from_slice(&dst.port().to_be_bytes());
    let mut tlvs = Vec::new();
    if let Some(id) = peer_identity {
        let len = u16::try_from(id.len()).map_err(|_| ProxyHeaderError::TooLong(id.len()))?;
        tlvs.push(TLV_PEER_IDENTITY);
        tlvs.extend_from_slice(&len.to_be_bytes());
        tlvs.extend_from_slice(id.as_bytes());
    }
    let rest = addrs.len() + tlvs.len();
    let rest_len = u16::try_from(rest).map_err(|_| ProxyHeaderError::TooLong(rest))?;
    let mut out = Vec::with_capacity(16 + rest);
    out.extend_from_slice(&SIGNATURE);
    out.push(0x21);
    out.push(family);
    out.extend_from_slice(&rest_len.to_be_bytes());
    out.extend_from_slice(&addrs);
    out.extend_from_slice(&tlvs);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_with_identity_byte_for_byte() {
        let id = "spiffe://cluster.local/ns/a/sa/b";
        let got = encode(
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:8080".parse().unwrap(),
            Some(id),
        )
        .unwrap();
        let mut want = vec![
            0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54,
            0x0A, // signature
            0x21, // v2, PROXY
            0x11, // TCP over IPv4
            0x00, 0x2F, // 12 address bytes + 3 + 32 TLV bytes = 47
            10, 0, 0, 1, // source
            10, 0, 0, 2, // destination
            0x9C, 0x40, // 40000
            0x1F, 0x90, // 8080
            0xD0, 0x00, 0x20, // TLV 0xD0, 32 bytes
        ];
        want.extend_from_slice(id.as_bytes());
        assert_eq!(id.len(), 32);
        assert_eq!(got, want);
    }

    #[test]
    fn ipv6_without_identity_byte_for_byte() {
        let got = encode(
            "[fd00::1]:1".parse().unwrap(),
            "[fd00::2]:443".parse().unwrap(),
            None,
        )
        .unwrap();
        let mut want = SIGNATURE.to_vec();
        want.extend_from_slice(&[0x21, 0x21, 0x00, 0x24]); // v2 PROXY, TCP over IPv6, 36
        want.extend_from_slice(&[0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        want.extend_from_slice(&[0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        want.extend_from_slice(&[0x00, 0x01, 0x01, 0xBB]);
        assert_eq!(got, want);
    }

    #[test]
    fn mixed_families_are_sent_as_ipv6() {
        let got = encode(
            "10.0.0.1:1".parse().unwrap(),
            "[fd00::2]:2".parse().unwrap(),
            None,
        )
        .unwrap();
        assert_eq!(got[13], 0x21);
        assert_eq!(
            &got[16..32],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1]
        );
    }

    #[test]
    fn an_identity_too_long_is_an_error_not_a_truncation() {
        let long = "x".repeat(70_000);
        let e = encode(
            "10.0.0.1:1".parse().unwrap(),
            "10.0.0.2:2".parse().unwrap(),
            Some(&long),
        )
        .unwrap_err();
        assert_eq!(e, ProxyHeaderError::TooLong(70_000));
        // Just under the field, but with the addresses it no longer fits.
        let near = "x".repeat(65_530);
        assert!(encode(
            "10.0.0.1:1".parse().unwrap(),
            "10.0.0.2:2".parse().unwrap(),
            Some(&near)
        )
        .is_err());
    }
}
