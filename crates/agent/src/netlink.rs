//! The in-pod return-path routing ([`ReturnRouting`]) over rtnetlink, without the `ip` tool.
//!
//! A netlink socket belongs to the network namespace it was created in, so
//! [`RouteSocket::open`] creates it on a short-lived thread that has entered the pod's netns
//! ([`Netns::run_in`]); from then on it works from any thread and the agent never leaves its
//! own namespace. The kernel's answers are matched by errno: `EEXIST` on an add means the
//! rule is already there, `ENOENT`/`ESRCH` on a delete means it is already gone.
//!
//! Blocking: call from `spawn_blocking`.

use std::io;
use std::net::IpAddr;
use std::path::Path;

use ambit_zds::Netns;
use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_ACK_TLVS,
    NLM_F_CAPPED, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use nix::errno::Errno;
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::{TimeVal, TimeValLike};

use crate::rules::{Family, ReturnRouting};

/// Why the kernel's routing could not be read or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetlinkError {
    /// The netns could not be entered or no netlink socket made there (the agent's
    /// privileges, or a netns that is gone).
    #[error("cannot open a netlink socket in netns {netns}: {source} (does the netns exist, and has the agent CAP_SYS_ADMIN and CAP_NET_ADMIN?)")]
    Open {
        netns: String,
        #[source]
        source: io::Error,
    },
    /// Talking to the kernel failed (send or receive).
    #[error("netlink {what} in netns {netns}: {source}")]
    Io {
        netns: String,
        what: String,
        #[source]
        source: io::Error,
    },
    /// The kernel refused a request (`detail`: its own explanation, where it gave one).
    #[error("netlink: the kernel refused `{what}` in netns {netns}: {errno}{detail}{hint}",
        detail = detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default(),
        hint = hint(*errno))]
    Refused {
        netns: String,
        what: String,
        errno: Errno,
        detail: Option<String>,
    },
    /// The kernel's answer could not be decoded (a kernel newer than this agent's netlink
    /// library?).
    #[error("netlink {what} in netns {netns}: undecodable answer: {detail}")]
    Malformed {
        netns: String,
        what: String,
        detail: String,
    },
}

impl NetlinkError {
    /// The kernel's errno, when it refused the request.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            NetlinkError::Refused { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// What to do about an errno the kernel answered with.
fn hint(errno: Errno) -> &'static str {
    match errno {
        Errno::EPERM => "; the agent needs CAP_NET_ADMIN in the pod's netns",
        // The kernel's answer for a v6 route via a device with IPv6 disabled.
        Errno::EACCES => "; IPv6 disabled in the pod, or the agent lacks CAP_NET_ADMIN",
        Errno::EAFNOSUPPORT => "; no IPv6 in this netns? turn IPv6 off for the agent",
        Errno::ENODEV => "; no loopback device in the netns?",
        _ => "",
    }
}

/// What an add found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    Created,
    /// It was there already (`EEXIST`).
    Existed,
}

/// What a delete found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    Removed,
    /// It was not there (`ENOENT`/`ESRCH`).
    Absent,
}

/// A policy rule as the kernel lists it (the fields ours are told apart by).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedRule {
    pub family: Family,
    pub priority: u32,
    pub fwmark: Option<u32>,
    pub fwmask: Option<u32>,
    pub table: u32,
    pub to_table: bool,
}

/// A route as the kernel lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedRoute {
    pub family: Family,
    pub table: u32,
    pub local: bool,
    pub destination: Option<IpAddr>,
    pub prefix_len: u8,
    pub oif: Option<u32>,
}

/// An rtnetlink socket made inside one netns.
pub struct RouteSocket {
    socket: Socket,
    netns: String,
    /// `lo`'s interface index in that netns.
    lo: u32,
    seq: u32,
}

/// A message from the kernel: its header flags and payload.
type Answer = (u16, NetlinkPayload<RouteNetlinkMessage>);

/// Answers larger than this are not expected (a dump part is at most a few pages).
const RECV_BUFFER: usize = 64 * 1024;
/// How long to wait for the kernel's answer.
const RECV_TIMEOUT_S: i64 = 5;

impl RouteSocket {
    /// A socket inside the netns at `path`.
    pub fn open(path: &Path) -> Result<RouteSocket, NetlinkError> {
        let netns = path.display().to_string();
        let open_err = |source| NetlinkError::Open {
            netns: netns.clone(),
            source,
        };
        let ns = Netns::open(path).map_err(open_err)?;
        RouteSocket::open_in(&ns, netns)
    }

    /// A socket inside `ns` (named `label` in messages).
    pub fn open_in(ns: &Netns, label: String) -> Result<RouteSocket, NetlinkError> {
        let opened = ns.run_in(|| {
            let mut socket = Socket::new(NETLINK_ROUTE)?;
            socket.bind_auto()?;
            socket.connect(&SocketAddr::new(0, 0))?;
            // The kernel answers at once; a wait this long means something is badly wrong,
            // and an error says so where a hung enrollment would not.
            setsockopt(
                &socket,
                sockopt::ReceiveTimeout,
                &TimeVal::seconds(RECV_TIMEOUT_S),
            )
            .map_err(io::Error::from)?;
            // The kernel's own error text, for the messages (older kernels lack it).
            let _ = socket.set_cap_ack(true);
            let _ = socket.set_ext_ack(true);
            let lo = nix::net::if_::if_nametoindex("lo").map_err(io::Error::from)?;
            Ok((socket, lo))
        });
        let (socket, lo) = opened.map_err(|source| NetlinkError::Open {
            netns: label.clone(),
            source,
        })?;
        Ok(RouteSocket {
            socket,
            netns: label,
            lo,
            seq: 0,
        })
    }

    /// `lo`'s interface index in this socket's netns.
    pub fn loopback_index(&self) -> u32 {
        self.lo
    }

    /// Adds `plan`'s rule (`ip rule add`: exclusive, so a second add is `EEXIST`, not a
    /// duplicate rule).
    pub fn add_rule(&mut self, plan: &ReturnRouting) -> Result<Added, NetlinkError> {
        let msg = RouteNetlinkMessage::NewRule(rule_message(plan));
        let what = format!("add {}", plan.rule_text());
        match self.request(msg, NLM_F_CREATE | NLM_F_EXCL, &what) {
            Ok(()) => Ok(Added::Created),
            Err(e) if e.errno() == Some(Errno::EEXIST) => Ok(Added::Existed),
            Err(e) => Err(e),
        }
    }

    /// Removes `plan`'s rule.
    pub fn del_rule(&mut self, plan: &ReturnRouting) -> Result<Deleted, NetlinkError> {
        let msg = RouteNetlinkMessage::DelRule(rule_message(plan));
        gone(self.request(msg, 0, &format!("delete {}", plan.rule_text())))
    }

    /// Adds or replaces `plan`'s route (`ip route replace`: whatever route to the same
    /// destination the table held becomes ours).
    pub fn replace_route(&mut self, plan: &ReturnRouting) -> Result<(), NetlinkError> {
        let msg = RouteNetlinkMessage::NewRoute(self.route_message(plan, false));
        let what = format!("replace {}", plan.route_text());
        self.request(msg, NLM_F_CREATE | NLM_F_REPLACE, &what)
    }

    /// Removes `plan`'s route.
    pub fn del_route(&mut self, plan: &ReturnRouting) -> Result<Deleted, NetlinkError> {
        let msg = RouteNetlinkMessage::DelRoute(self.route_message(plan, true));
        gone(self.request(msg, 0, &format!("delete {}", plan.route_text())))
    }

    /// The policy rules of `family`.
    pub fn rules(&mut self, family: Family) -> Result<Vec<ListedRule>, NetlinkError> {
        let mut query = RuleMessage::default();
        query.header.family = address_family(family);
        let what = format!("{family} rule dump");
        let answers = self.dump(RouteNetlinkMessage::GetRule(query), &what)?;
        Ok(answers
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRule(r) => Some(listed_rule(family, &r)),
                _ => None,
            })
            .collect())
    }

    /// The routes of `family` in `table`.
    pub fn routes(&mut self, family: Family, table: u32) -> Result<Vec<ListedRoute>, NetlinkError> {
        let mut query = RouteMessage::default();
        query.header.address_family = address_family(family);
        let what = format!("{family} route dump");
        let answers = self.dump(RouteNetlinkMessage::GetRoute(query), &what)?;
        Ok(answers
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => Some(listed_route(family, &r)),
                _ => None,
            })
            .filter(|r| r.table == table)
            .collect())
    }

    /// Every address on this netns's interfaces, both families (`ip addr`).
    pub fn addresses(&mut self) -> Result<Vec<IpAddr>, NetlinkError> {
        let query = AddressMessage::default();
        let answers = self.dump(RouteNetlinkMessage::GetAddress(query), "address dump")?;
        Ok(answers
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => a.attributes.iter().find_map(|at| match at {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                }),
                _ => None,
            })
            .collect())
    }

    /// `ip route {replace,del} local <any> dev lo table N`, field for field as `ip` sends
    /// it: a delete leaves protocol and scope open so it matches however the route was made.
    fn route_message(&self, plan: &ReturnRouting, delete: bool) -> RouteMessage {
        let mut m = RouteMessage::default();
        m.header.address_family = address_family(plan.family);
        m.header.destination_prefix_length = 0;
        m.header.table = small_table(plan.table);
        m.header.kind = RouteType::Local;
        if delete {
            m.header.protocol = RouteProtocol::Unspec;
            m.header.scope = RouteScope::NoWhere;
        } else {
            m.header.protocol = RouteProtocol::Boot;
            m.header.scope = RouteScope::Host;
        }
        m.attributes = vec![
            RouteAttribute::Table(plan.table),
            RouteAttribute::Oif(self.lo),
        ];
        m
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn send(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        what: &str,
    ) -> Result<u32, NetlinkError> {
        let seq = self.next_seq();
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket
            .send(&buf, 0)
            .map_err(|source| self.io_error(what, source))?;
        Ok(seq)
    }

    /// Sends a change and waits for the kernel's acknowledgement.
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        what: &str,
    ) -> Result<(), NetlinkError> {
        let seq = self.send(msg, NLM_F_ACK | flags, what)?;
        loop {
            for (flags, answer) in self.receive(seq, what)? {
                match answer {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(()),
                            Some(code) => {
                                let detail = ext_ack_message(flags, &e.header);
                                Err(self.refused(what, code.get(), detail))
                            }
                        }
                    }
                    // Without NLM_F_ECHO nothing else is expected; skip it.
                    _ => continue,
                }
            }
        }
    }

    /// Sends a dump request and collects the answers up to `NLMSG_DONE`.
    fn dump(
        &mut self,
        msg: RouteNetlinkMessage,
        what: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        let seq = self.send(msg, NLM_F_DUMP, what)?;
        let mut out = Vec::new();
        loop {
            for (flags, answer) in self.receive(seq, what)? {
                match answer {
                    NetlinkPayload::InnerMessage(m) => out.push(m),
                    NetlinkPayload::Done(d) if d.code == 0 => return Ok(out),
                    NetlinkPayload::Done(d) => return Err(self.refused(what, d.code, None)),
                    NetlinkPayload::Error(e) => match e.code {
                        None => return Ok(out),
                        Some(code) => {
                            let detail = ext_ack_message(flags, &e.header);
                            return Err(self.refused(what, code.get(), detail));
                        }
                    },
                    _ => continue,
                }
            }
        }
    }

    /// One datagram's messages that answer `seq`, with their header flags (stale answers
    /// to earlier requests are dropped).
    fn receive(&mut self, seq: u32, what: &str) -> Result<Vec<Answer>, NetlinkError> {
        let mut buf = Vec::with_capacity(RECV_BUFFER);
        let n = self
            .socket
            .recv(&mut buf, 0)
            .map_err(|source| self.io_error(what, source))?;
        if n > buf.len() {
            return Err(self.malformed(
                what,
                format!("{n}-byte datagram truncated to {}", buf.len()),
            ));
        }
        let mut out = Vec::new();
        let mut rest = &buf[..];
        while !rest.is_empty() {
            // Checked: the length is within the datagram and at least a header, so the
            // loop always advances.
            let packet = NetlinkBuffer::new_checked(rest)
                .map_err(|e| self.malformed(what, e.to_string()))?;
            let (len, ours) = (packet.length() as usize, packet.sequence_number() == seq);
            if ours {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..len])
                    .map_err(|e| self.malformed(what, e.to_string()))?;
                out.push((msg.header.flags, msg.payload));
            }
            // Messages are 4-byte aligned within a datagram.
            rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
        }
        Ok(out)
    }

    fn io_error(&self, what: &str, source: io::Error) -> NetlinkError {
        NetlinkError::Io {
            netns: self.netns.clone(),
            what: what.to_owned(),
            source,
        }
    }

    fn malformed(&self, what: &str, detail: String) -> NetlinkError {
        NetlinkError::Malformed {
            netns: self.netns.clone(),
            what: what.to_owned(),
            detail,
        }
    }

    /// The kernel sends `-errno`.
    fn refused(&self, what: &str, code: i32, detail: Option<String>) -> NetlinkError {
        NetlinkError::Refused {
            netns: self.netns.clone(),
            what: what.to_owned(),
            errno: Errno::from_raw(code.saturating_abs()),
            detail,
        }
    }
}

/// `NLMSGERR_ATTR_MSG`: the kernel's error text.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// The kernel's error text from an `NLMSG_ERROR`'s bytes after the code (`echoed`: the
/// request, whole or, with `NLM_F_CAPPED`, just its header; then, with `NLM_F_ACK_TLVS`,
/// the extended-ack attributes), if it sent one.
fn ext_ack_message(flags: u16, echoed: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let request_len = if flags & NLM_F_CAPPED != 0 {
        16
    } else {
        let len = u32::from_ne_bytes(echoed.get(..4)?.try_into().ok()?);
        usize::try_from(len).ok()?
    };
    let mut attrs = echoed.get(request_len.next_multiple_of(4)..)?;
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        let value = attrs.get(4..len)?;
        if kind == NLMSGERR_ATTR_MSG {
            let text = value.split(|b| *b == 0).next().unwrap_or_default();
            return Some(String::from_utf8_lossy(text).into_owned()).filter(|t| !t.is_empty());
        }
        attrs = attrs
            .get(len.max(4).next_multiple_of(4)..)
            .unwrap_or_default();
    }
    None
}

/// `ENOENT` (rules) and `ESRCH` (routes, and tables that do not exist) mean already gone.
fn gone(result: Result<(), NetlinkError>) -> Result<Deleted, NetlinkError> {
    match result {
        Ok(()) => Ok(Deleted::Removed),
        Err(e) if matches!(e.errno(), Some(Errno::ENOENT | Errno::ESRCH)) => Ok(Deleted::Absent),
        Err(e) => Err(e),
    }
}

fn address_family(family: Family) -> AddressFamily {
    match family {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    }
}

/// The header's 8-bit table field: the table itself when it fits (as `ip` sends it), else
/// "unspecified" and the attribute alone says which.
fn small_table(table: u32) -> u8 {
    u8::try_from(table).unwrap_or(0)
}

/// `ip rule {add,del} fwmark M/K pref P lookup T`.
fn rule_message(plan: &ReturnRouting) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = address_family(plan.family);
    m.header.table = small_table(plan.table);
    m.header.action = RuleAction::ToTable;
    m.attributes = vec![
        RuleAttribute::Priority(plan.priority),
        RuleAttribute::FwMark(plan.fwmark),
        RuleAttribute::FwMask(plan.fwmask),
        RuleAttribute::Table(plan.table),
    ];
    m
}

fn listed_rule(family: Family, r: &RuleMessage) -> ListedRule {
    let mut out = ListedRule {
        family,
        priority: 0,
        fwmark: None,
        fwmask: None,
        table: u32::from(r.header.table),
        to_table: r.header.action == RuleAction::ToTable,
    };
    for a in &r.attributes {
        match a {
            RuleAttribute::Priority(p) => out.priority = *p,
            RuleAttribute::FwMark(m) => out.fwmark = Some(*m),
            RuleAttribute::FwMask(m) => out.fwmask = Some(*m),
            RuleAttribute::Table(t) => out.table = *t,
            _ => {}
        }
    }
    out
}

fn listed_route(family: Family, r: &RouteMessage) -> ListedRoute {
    let header: &RouteHeader = &r.header;
    let mut out = ListedRoute {
        family,
        table: u32::from(header.table),
        local: header.kind == RouteType::Local,
        destination: None,
        prefix_len: header.destination_prefix_length,
        oif: None,
    };
    for a in &r.attributes {
        match a {
            RouteAttribute::Table(t) => out.table = *t,
            RouteAttribute::Oif(i) => out.oif = Some(*i),
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => {
                out.destination = Some((*ip).into())
            }
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => {
                out.destination = Some((*ip).into())
            }
            _ => {}
        }
    }
    out
}

impl ListedRule {
    /// Whether this is `plan`'s rule.
    pub fn is(&self, plan: &ReturnRouting) -> bool {
        self.family == plan.family
            && self.priority == plan.priority
            && self.fwmark == Some(plan.fwmark)
            && self.fwmask == Some(plan.fwmask)
            && self.table == plan.table
            && self.to_table
    }
}

impl ListedRoute {
    /// Whether this is `plan`'s route, via the loopback at `lo`.
    pub fn is(&self, plan: &ReturnRouting, lo: u32) -> bool {
        self.family == plan.family
            && self.table == plan.table
            && self.local
            && self.prefix_len == 0
            && self.oif == Some(lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&u16::try_from(4 + value.len()).unwrap().to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    #[test]
    fn the_kernels_error_text_is_found_after_the_echoed_request() {
        let msg = attr(NLMSGERR_ATTR_MSG, b"IPv6 is disabled on nexthop device\0");
        // Capped: a 16-byte header, then an offset attribute and the text.
        let mut capped = vec![0u8; 16];
        capped.extend(attr(3, &7u32.to_ne_bytes()));
        capped.extend(&msg);
        assert_eq!(
            ext_ack_message(NLM_F_CAPPED | NLM_F_ACK_TLVS, &capped).as_deref(),
            Some("IPv6 is disabled on nexthop device")
        );
        // Uncapped: the whole request (its length in its header), then the text.
        let mut whole = 22u32.to_ne_bytes().to_vec();
        whole.resize(24, 0xff);
        whole.extend(&msg);
        assert_eq!(
            ext_ack_message(NLM_F_ACK_TLVS, &whole).as_deref(),
            Some("IPv6 is disabled on nexthop device")
        );
        // No attributes announced, truncated or nonsense bytes: no text, no panic.
        assert_eq!(ext_ack_message(NLM_F_CAPPED, &capped), None);
        assert_eq!(ext_ack_message(NLM_F_ACK_TLVS, &[0xff; 3]), None);
        assert_eq!(
            ext_ack_message(NLM_F_ACK_TLVS | NLM_F_CAPPED, &[0; 16 + 2]),
            None
        );
        let mut zero_len = vec![0u8; 16];
        zero_len.extend([0, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(
            ext_ack_message(NLM_F_ACK_TLVS | NLM_F_CAPPED, &zero_len),
            None
        );
        let huge = [u32::MAX.to_ne_bytes(), [0; 4]].concat();
        assert_eq!(ext_ack_message(NLM_F_ACK_TLVS, &huge), None);
    }
}
