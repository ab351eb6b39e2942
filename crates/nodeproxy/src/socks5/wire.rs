//! The SOCKS5 messages ztunnel accepts (RFC 1928, no authentication, CONNECT only),
//! sans-IO: each parser takes the bytes received so far and says whether a whole message
//! is there, how long it is, or what is wrong with it.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

pub const VERSION: u8 = 5;
/// Method 0: no authentication required.
pub const NO_AUTH: u8 = 0;
/// The method-selection answer when the client offers nothing we take.
pub const NO_ACCEPTABLE_METHODS: u8 = 0xFF;
const CMD_CONNECT: u8 = 1;
const ATYP_IPV4: u8 = 1;
const ATYP_DOMAIN: u8 = 3;
const ATYP_IPV6: u8 = 4;

/// The longest greeting: version, count, 255 methods. (A request is at most 262 bytes:
/// a name's length is one byte.)
pub const MAX_GREETING: usize = 2 + 255;

/// Reply codes (RFC 1928 §6) as ztunnel uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    Succeeded = 0,
    GeneralFailure = 1,
    NotAllowed = 2,
    NetworkUnreachable = 3,
    /// Also the answer when a name does not resolve.
    HostUnreachable = 4,
    ConnectionRefused = 5,
    /// Every protocol violation is answered with this code.
    CommandNotSupported = 7,
}

/// Where the client asked to go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Addr(SocketAddr),
    /// A domain name (resolved through the DNS proxy's resolver) and a port.
    Name {
        host: String,
        port: u16,
    },
}

/// What a client got wrong. Each is the client's fault; the connection is closed after
/// the reply [`Socks5Error::reply`] names (if any).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Socks5Error {
    #[error("SOCKS version {0} is not supported (only 5)")]
    Version(u8),
    #[error("the greeting offers no authentication method")]
    NoMethods,
    #[error("the greeting does not offer method 0 (no authentication), the only one served")]
    NoAuthNotOffered,
    #[error("SOCKS command {0} is not supported (only 1, CONNECT)")]
    Command(u8),
    #[error("SOCKS address type {0} is not supported (1 IPv4, 3 domain, 4 IPv6)")]
    AddressType(u8),
    #[error("the domain name is empty")]
    EmptyName,
    #[error("the domain name is not UTF-8")]
    NameNotUtf8,
}

impl Socks5Error {
    /// What to send before closing: a method-selection refusal for a greeting that offers
    /// nothing usable, nothing for a foreign version, "command not supported" otherwise.
    pub fn reply(&self) -> Option<Vec<u8>> {
        match self {
            Socks5Error::Version(_) => None,
            Socks5Error::NoMethods | Socks5Error::NoAuthNotOffered => {
                Some(vec![VERSION, NO_ACCEPTABLE_METHODS])
            }
            _ => Some(reply(Reply::CommandNotSupported).to_vec()),
        }
    }
}

/// How far a parser got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed<T> {
    /// The message is at least `need` bytes long in all: read up to there and try again.
    /// Reading exactly that much never takes bytes that follow the message.
    Incomplete { need: usize },
    /// The message is the first `len` bytes.
    Done(T, usize),
}

/// Parses the method-selection greeting; `Done` means it offers no authentication.
pub fn parse_greeting(buf: &[u8]) -> Result<Parsed<()>, Socks5Error> {
    let Some(&version) = buf.first() else {
        return Ok(Parsed::Incomplete { need: 2 });
    };
    if version != VERSION {
        return Err(Socks5Error::Version(version));
    }
    let Some(&count) = buf.get(1) else {
        return Ok(Parsed::Incomplete { need: 2 });
    };
    if count == 0 {
        return Err(Socks5Error::NoMethods);
    }
    let len = 2 + usize::from(count);
    let Some(methods) = buf.get(2..len) else {
        return Ok(Parsed::Incomplete { need: len });
    };
    if !methods.contains(&NO_AUTH) {
        return Err(Socks5Error::NoAuthNotOffered);
    }
    Ok(Parsed::Done((), len))
}

/// Parses the CONNECT request.
pub fn parse_request(buf: &[u8]) -> Result<Parsed<Target>, Socks5Error> {
    // Version, command, reserved, address type, and the shortest address (one length byte).
    if buf.len() < 5 {
        if let Some(&version) = buf.first().filter(|v| **v != VERSION) {
            return Err(Socks5Error::Version(version));
        }
        if let Some(&command) = buf.get(1).filter(|c| **c != CMD_CONNECT) {
            return Err(Socks5Error::Command(command));
        }
        if let Some(&kind) = buf.get(3) {
            if ![ATYP_IPV4, ATYP_DOMAIN, ATYP_IPV6].contains(&kind) {
                return Err(Socks5Error::AddressType(kind));
            }
        }
        return Ok(Parsed::Incomplete { need: 5 });
    }
    if buf[0] != VERSION {
        return Err(Socks5Error::Version(buf[0]));
    }
    if buf[1] != CMD_CONNECT {
        return Err(Socks5Error::Command(buf[1]));
    }
    // buf[2] is reserved; its value does not matter.
    let (addr_end, kind) = match buf[3] {
        ATYP_IPV4 => (8, ATYP_IPV4),
        ATYP_IPV6 => (20, ATYP_IPV6),
        ATYP_DOMAIN => (5 + usize::from(buf[4]), ATYP_DOMAIN),
        other => return Err(Socks5Error::AddressType(other)),
    };
    let len = addr_end + 2;
    if buf.len() < len {
        return Ok(Parsed::Incomplete { need: len });
    }
    let port = u16::from_be_bytes([buf[addr_end], buf[addr_end + 1]]);
    let target = match kind {
        ATYP_IPV4 => {
            let ip = Ipv4Addr::new(buf[4], buf[5], buf[6], buf[7]);
            Target::Addr(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        ATYP_IPV6 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&buf[4..20]);
            Target::Addr(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(octets),
                port,
                0,
                0,
            )))
        }
        _ => {
            let name = &buf[5..addr_end];
            if name.is_empty() {
                return Err(Socks5Error::EmptyName);
            }
            let host = std::str::from_utf8(name).map_err(|_| Socks5Error::NameNotUtf8)?;
            Target::Name {
                host: host.to_string(),
                port,
            }
        }
    };
    Ok(Parsed::Done(target, len))
}

/// A reply to the request, with the bound address 0.0.0.0:0 ztunnel always sends.
pub fn reply(code: Reply) -> [u8; 10] {
    [VERSION, code as u8, 0, ATYP_IPV4, 0, 0, 0, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings() {
        let need = |n| Ok(Parsed::Incomplete { need: n });
        assert_eq!(parse_greeting(&[]), need(2));
        assert_eq!(parse_greeting(&[5]), need(2));
        assert_eq!(parse_greeting(&[5, 2, 2]), need(4));
        assert_eq!(parse_greeting(&[5, 1, 0]), Ok(Parsed::Done((), 3)));
        assert_eq!(
            parse_greeting(&[5, 3, 2, 1, 0, 9]),
            Ok(Parsed::Done((), 5)),
            "bytes after the greeting are not part of it"
        );
        assert_eq!(parse_greeting(&[4, 1, 0]), Err(Socks5Error::Version(4)));
        assert_eq!(parse_greeting(&[5, 0]), Err(Socks5Error::NoMethods));
        assert_eq!(
            parse_greeting(&[5, 2, 1, 2]),
            Err(Socks5Error::NoAuthNotOffered)
        );
        let mut all = vec![5, 255];
        all.extend(1..=255u8);
        assert_eq!(parse_greeting(&all), Err(Socks5Error::NoAuthNotOffered));
        all[256] = 0;
        assert_eq!(parse_greeting(&all), Ok(Parsed::Done((), MAX_GREETING)));
    }

    #[test]
    fn requests_for_each_address_type() {
        let v4 = [5, 1, 0, 1, 10, 0, 0, 7, 0x1f, 0x90];
        assert_eq!(
            parse_request(&v4),
            Ok(Parsed::Done(
                Target::Addr("10.0.0.7:8080".parse().unwrap()),
                10
            ))
        );
        let mut v6 = vec![5, 1, 0, 4];
        v6.extend("fd00::7".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend([0, 80]);
        assert_eq!(
            parse_request(&v6),
            Ok(Parsed::Done(
                Target::Addr("[fd00::7]:80".parse().unwrap()),
                22
            ))
        );
        let mut name = vec![5, 1, 0, 3, 4];
        name.extend(b"echo");
        name.extend([0, 80, 0xAA]);
        assert_eq!(
            parse_request(&name),
            Ok(Parsed::Done(
                Target::Name {
                    host: "echo".into(),
                    port: 80
                },
                11
            ))
        );
        // Every strict prefix asks for more, never for more than the message: reading
        // exactly what is asked for reaches the whole message and nothing after it.
        for msg in [&v4[..], &v6[..], &name[..name.len() - 1]] {
            let mut have = 0;
            loop {
                match parse_request(&msg[..have]) {
                    Ok(Parsed::Incomplete { need }) => {
                        assert!(need > have && need <= msg.len(), "{msg:?}: {have} → {need}");
                        have = need;
                    }
                    Ok(Parsed::Done(_, len)) => {
                        assert_eq!(len, msg.len());
                        break;
                    }
                    Err(e) => panic!("{msg:?} at {have}: {e}"),
                }
            }
        }
    }

    #[test]
    fn bad_requests_name_what_is_wrong() {
        assert_eq!(
            parse_request(&[5, 1, 0, 9]),
            Err(Socks5Error::AddressType(9))
        );
        assert_eq!(
            parse_request(&[5, 2, 0, 1]),
            Err(Socks5Error::Command(2)),
            "BIND"
        );
        assert_eq!(
            parse_request(&[5, 3, 0, 1]),
            Err(Socks5Error::Command(3)),
            "UDP ASSOCIATE"
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 9, 0, 0, 0, 0, 0, 0]),
            Err(Socks5Error::AddressType(9))
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 3, 0, 0, 80]),
            Err(Socks5Error::EmptyName)
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 3, 1, 0xFF, 0, 80]),
            Err(Socks5Error::NameNotUtf8)
        );
        assert_eq!(parse_request(&[4, 1]), Err(Socks5Error::Version(4)));
        for e in [Socks5Error::Command(2), Socks5Error::AddressType(9)] {
            assert_eq!(e.reply(), Some(vec![5, 7, 0, 1, 0, 0, 0, 0, 0, 0]));
        }
        assert_eq!(Socks5Error::NoAuthNotOffered.reply(), Some(vec![5, 0xFF]));
        assert_eq!(Socks5Error::Version(4).reply(), None);
    }

    #[test]
    fn replies_carry_the_unspecified_bound_address() {
        assert_eq!(reply(Reply::Succeeded), [5, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(reply(Reply::HostUnreachable)[1], 4);
    }
}
