//! The `dns_query` target: the whole local query path of the DNS proxy on bytes from a
//! client, with the invariants it must keep.

use std::sync::OnceLock;

use ambit_state::ProxyState;
use hickory_proto::op::{Message, MessageType};

use ambit_dns::message::{handle_locally, Protocol, MAX_UDP_PAYLOAD};
use ambit_dns::{SearchList, Settings};

const MESH: &str = r#"
workloads:
- {name: client, namespace: ns1, workloadIps: ["10.0.0.1", "fd00::1"]}
- {name: h, namespace: ns1, workloadIps: ["10.0.1.1"], services: {ns1/headless.ns1.svc.cluster.local: {80: 80}}}
services:
- {name: echo, namespace: ns1, hostname: echo.ns1.svc.cluster.local, vips: ["/10.96.0.1", "/fd00::96:1"]}
- {name: headless, namespace: ns1, hostname: headless.ns1.svc.cluster.local}
- {name: wild, namespace: ns2, hostname: "*.example.com", vips: ["/10.96.1.1"]}
"#;

fn state() -> &'static ProxyState {
    static STATE: OnceLock<ProxyState> = OnceLock::new();
    STATE.get_or_init(|| ProxyState::from_yaml("fuzz", MESH).expect("fuzz mesh"))
}

/// Byte 0: bit 0 = TCP (else UDP), bit 1 = unknown client, bit 2 = IPv6 off, bit 3 = a
/// fixed search list; the rest is the query. Panics if a reply breaks an invariant: it
/// parses, is a response, carries the query's id, fits the UDP limit.
pub fn query_path(data: &[u8]) {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let protocol = if mode & 1 != 0 {
        Protocol::Tcp
    } else {
        Protocol::Udp
    };
    let state = state();
    let client = (mode & 2 == 0)
        .then(|| state.workloads().find(|w| w.name == "client"))
        .flatten();
    let settings = Settings {
        ipv6_enabled: mode & 4 == 0,
        search: if mode & 8 != 0 {
            SearchList::Fixed(vec!["example.com".into(), "cluster.local".into()])
        } else {
            SearchList::Kubernetes
        },
        ..Settings::default()
    };
    let Some(reply) = handle_locally(state, client.map(|c| &**c), &settings, bytes, protocol)
    else {
        return;
    };
    let m = Message::from_vec(&reply).expect("our reply parses");
    assert_eq!(m.message_type(), MessageType::Response);
    assert!(bytes.len() >= 2, "a reply needs an id");
    assert_eq!(
        m.id(),
        u16::from_be_bytes([bytes[0], bytes[1]]),
        "the query's id"
    );
    if protocol == Protocol::Udp {
        assert!(
            reply.len() <= usize::from(MAX_UDP_PAYLOAD),
            "UDP reply too long"
        );
    }
    assert!(m
        .answers()
        .iter()
        .all(|r| r.ttl() == ambit_dns::message::TTL));
}
