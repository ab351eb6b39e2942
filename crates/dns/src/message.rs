//! DNS messages in and out: what to make of a query's bytes, and the reply's bytes.
//! Sans-IO: the server and the fuzz target share every decision here.

use std::net::IpAddr;

use ambit_state::{ProxyState, Workload};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

use crate::mesh::{self, Settings};

/// TTL of every mesh answer (ztunnel's, fixed).
pub const TTL: u32 = 30;
/// The smallest payload a UDP reply may fill (RFC 1035), and the floor of what we offer.
pub const MIN_UDP_PAYLOAD: u16 = 512;
/// The largest UDP reply we send, whatever a client's EDNS offers.
pub const MAX_UDP_PAYLOAD: u16 = 4096;

/// Transport of a query, for the reply size limit and the metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Udp,
    Tcp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Udp => "udp",
            Protocol::Tcp => "tcp",
        }
    }
}

/// A query we accept to answer: one question, opcode QUERY.
#[derive(Debug, Clone)]
pub struct Request {
    pub message: Message,
    pub query: Query,
}

impl Request {
    /// The question's type, lower case, as the metrics label it (`a`, `aaaa`, ...).
    pub fn query_type(&self) -> String {
        self.query.query_type().to_string().to_ascii_lowercase()
    }

    /// The name asked for, lower case, without the trailing dot.
    pub fn name(&self) -> String {
        let mut n = self.query.name().to_lowercase().to_ascii();
        if n.ends_with('.') {
            n.pop();
        }
        n
    }
}

/// What to do with the bytes of a query.
#[derive(Debug)]
pub enum Parsed {
    Query(Box<Request>),
    /// Refused at once: send these bytes back (FORMERR, NOTIMP).
    Reply(Vec<u8>),
    /// Not even a header: nothing to answer to.
    Drop,
}

/// Reads a query. A message that does not parse gets FORMERR if its header could be read
/// (and is not itself a response), else is dropped; a response gets FORMERR; any opcode
/// but QUERY gets NOTIMP; anything but exactly one question gets FORMERR.
pub fn parse_request(bytes: &[u8]) -> Parsed {
    let message = match Message::from_vec(bytes) {
        Ok(m) => m,
        Err(_) => {
            let mut decoder = BinDecoder::new(bytes);
            return match hickory_proto::op::Header::read(&mut decoder) {
                // Never answer a response, however broken: two servers could loop.
                Ok(h) if h.message_type() == MessageType::Query => {
                    error_reply(h.id(), h.op_code(), ResponseCode::FormErr)
                }
                _ => Parsed::Drop,
            };
        }
    };
    if message.message_type() == MessageType::Response {
        return error_reply(message.id(), message.op_code(), ResponseCode::FormErr);
    }
    if message.op_code() != OpCode::Query {
        return error_reply(message.id(), message.op_code(), ResponseCode::NotImp);
    }
    let query = match message.queries() {
        [q] => q.clone(),
        _ => return error_reply(message.id(), message.op_code(), ResponseCode::FormErr),
    };
    Parsed::Query(Box::new(Request { message, query }))
}

fn error_reply(id: u16, op: OpCode, code: ResponseCode) -> Parsed {
    let mut m = Message::error_msg(id, op, code);
    m.set_recursion_available(true);
    match m.to_vec() {
        Ok(b) => Parsed::Reply(b),
        Err(_) => Parsed::Drop,
    }
}

/// The decision for an accepted query.
#[derive(Debug)]
pub enum Decision {
    /// A mesh name: answer authoritatively with these records (maybe none).
    Answer(LocalAnswer),
    /// Not ours: ask the upstream resolvers.
    Forward,
    /// Cannot be answered (no client workload): this response code.
    Fail(ResponseCode),
}

/// An authoritative answer and what the debug log says about it.
#[derive(Debug)]
pub struct LocalAnswer {
    pub records: Vec<Record>,
    /// The hostname that matched (`domain` in the log).
    pub host: String,
    pub ips: Vec<IpAddr>,
}

/// Decides a query for `client` (the pod the server belongs to; `None` if unknown).
pub fn decide(
    state: &ProxyState,
    client: Option<&Workload>,
    settings: &Settings,
    request: &Request,
) -> Decision {
    let Some(client) = client else {
        return Decision::Fail(ResponseCode::ServFail);
    };
    let want_v6 = match request.query.query_type() {
        RecordType::A => false,
        RecordType::AAAA => true,
        _ => return Decision::Forward,
    };
    if request.query.query_class() != DNSClass::IN {
        return Decision::Forward;
    }
    let Some(matched) = mesh::find_service(state, client, settings, &request.name()) else {
        return Decision::Forward;
    };
    let ips = mesh::addresses(state, client, settings, &matched.service, want_v6);
    let asked = request.query.name().clone();
    let mut records = Vec::with_capacity(ips.len() + 1);
    let owner = match matched
        .cname_to
        .as_deref()
        .and_then(|t| Name::from_ascii(format!("{t}.")).ok())
    {
        Some(target) => {
            records.push(Record::from_rdata(
                asked,
                TTL,
                RData::CNAME(CNAME(target.clone())),
            ));
            target
        }
        None => asked,
    };
    for ip in &ips {
        let rdata = match ip {
            IpAddr::V4(v4) => RData::A(A(*v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
        };
        records.push(Record::from_rdata(owner.clone(), TTL, rdata));
    }
    Decision::Answer(LocalAnswer {
        records,
        host: matched.host,
        ips,
    })
}

/// The sections of a reply, with its code and whether we are its authority.
#[derive(Debug, Default)]
pub struct ReplyParts {
    pub code: Option<ResponseCode>,
    pub authoritative: bool,
    pub answers: Vec<Record>,
    pub authority: Vec<Record>,
    pub additional: Vec<Record>,
}

/// Encodes the reply to `request`: its id, question and RD flag, RA set, the client's
/// EDNS echoed (payload at least 512). Over UDP a reply larger than the client takes is
/// truncated (TC set, records dropped) so it retries over TCP.
pub fn encode_reply(request: &Request, parts: ReplyParts, protocol: Protocol) -> Option<Vec<u8>> {
    let req = &request.message;
    let mut m = Message::new();
    m.set_id(req.id())
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_authoritative(parts.authoritative)
        .set_recursion_desired(req.recursion_desired())
        .set_recursion_available(true)
        .set_checking_disabled(req.checking_disabled())
        .set_response_code(parts.code.unwrap_or(ResponseCode::NoError))
        .add_query(request.query.clone());
    m.insert_answers(parts.answers);
    m.insert_name_servers(parts.authority);
    m.insert_additionals(
        parts
            .additional
            .into_iter()
            .filter(|r| r.record_type() != RecordType::OPT)
            .collect(),
    );
    let mut limit = MIN_UDP_PAYLOAD;
    if let Some(req_edns) = req.extensions() {
        let payload = req_edns.max_payload().max(MIN_UDP_PAYLOAD);
        limit = payload.min(MAX_UDP_PAYLOAD);
        let mut edns = Edns::new();
        edns.set_max_payload(payload)
            .set_version(req_edns.version())
            .set_dnssec_ok(req_edns.flags().dnssec_ok);
        m.set_edns(edns);
    }
    let bytes = m.to_vec().ok()?;
    if protocol == Protocol::Udp && bytes.len() > usize::from(limit) {
        return m.truncate().to_vec().ok();
    }
    Some(bytes)
}

/// The whole local path for bytes from a client, as the fuzz target drives it: parse,
/// decide and encode; a forward is answered SERVFAIL here (no upstream in sans-IO).
pub fn handle_locally(
    state: &ProxyState,
    client: Option<&Workload>,
    settings: &Settings,
    bytes: &[u8],
    protocol: Protocol,
) -> Option<Vec<u8>> {
    let request = match parse_request(bytes) {
        Parsed::Query(r) => r,
        Parsed::Reply(b) => return Some(b),
        Parsed::Drop => return None,
    };
    let parts = match decide(state, client, settings, &request) {
        Decision::Answer(a) => ReplyParts {
            authoritative: true,
            answers: a.records,
            ..Default::default()
        },
        Decision::Forward => ReplyParts {
            code: Some(ResponseCode::ServFail),
            ..Default::default()
        },
        Decision::Fail(code) => ReplyParts {
            code: Some(code),
            ..Default::default()
        },
    };
    encode_reply(&request, parts, protocol)
}

/// A query for `name`, as the resolver API and the forwarder send it.
pub fn query_message(id: u16, query: Query) -> Message {
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(query);
    m
}
