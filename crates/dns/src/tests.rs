//! Table tests of the whole local path: bytes of a query in, bytes of a reply out.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use ambit_state::{ProxyState, Workload};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

use crate::mesh::{SearchList, Settings};
use crate::message::{handle_locally, parse_request, query_message, Parsed, Protocol};

const MESH: &str = r#"
workloads:
- {name: client, namespace: ns1, workloadIps: ["10.0.0.1"]}
- {name: client2, namespace: ns2, workloadIps: ["10.0.0.2"]}
- {name: client-net2, namespace: ns1, network: net2, workloadIps: ["10.1.0.1"]}
- name: h1
  namespace: ns1
  workloadIps: ["10.0.1.1", "fd00::1:1", "fd00::1:2"]
  services: {ns1/headless.ns1.svc.cluster.local: {80: 80}}
- name: h2
  namespace: ns1
  workloadIps: ["10.0.1.2"]
  services: {ns1/headless.ns1.svc.cluster.local: {80: 80}}
services:
- {name: echo, namespace: ns1, hostname: echo.ns1.svc.cluster.local, vips: ["/10.96.0.1", "/fd00::96:1", "net2/10.200.0.1"]}
- {name: echo, namespace: ns2, hostname: echo.ns2.svc.cluster.local, vips: ["/10.96.0.2"]}
- {name: v4, namespace: ns1, hostname: v4.ns1.svc.cluster.local, vips: ["/10.96.0.4", "/fd00::96:4"], ipFamilies: IPv4}
- {name: v6, namespace: ns1, hostname: v6.ns1.svc.cluster.local, vips: ["/10.96.0.6", "/fd00::96:6"], ipFamilies: IPv6}
- {name: headless, namespace: ns1, hostname: headless.ns1.svc.cluster.local}
- {name: novip, namespace: ns1, hostname: novip.example.com}
- {name: ext, namespace: ns1, hostname: api.example.com, vips: ["/10.96.1.1"]}
- {name: wild, namespace: ns1, hostname: "*.wild.example.com", vips: ["/10.96.1.2"]}
- {name: private, namespace: ns3, hostname: private.ns3.svc.cluster.local, vips: ["/10.96.3.1"], visibility: Namespace}
- {name: shared, namespace: ns2, hostname: shared.example.com, vips: ["/10.96.2.2"]}
- {name: shared, namespace: ns3, hostname: shared.example.com, vips: ["/10.96.2.3"]}
- {name: shared, namespace: ns4, hostname: shared.example.com, vips: ["/10.96.2.4"]}
- {name: canon, namespace: ns2, hostname: canon.example.com, vips: ["/10.96.4.2"]}
- {name: canon, namespace: ns3, hostname: canon.example.com, vips: ["/10.96.4.3"], canonical: true}
- {name: mine, namespace: ns1, hostname: mine.example.com, vips: ["/10.96.5.1"]}
- {name: mine, namespace: ns2, hostname: mine.example.com, vips: ["/10.96.5.2"], canonical: true}
"#;

fn state() -> ProxyState {
    ProxyState::from_yaml("test", MESH).unwrap()
}

fn client(state: &ProxyState, name: &str) -> Arc<Workload> {
    state.workloads().find(|w| w.name == name).cloned().unwrap()
}

fn query_bytes(name: &str, ty: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut m = query_message(0x1234, Query::query(Name::from_ascii(name).unwrap(), ty));
    if let Some(payload) = edns {
        let mut e = Edns::new();
        e.set_max_payload(payload);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

struct Reply {
    code: ResponseCode,
    authoritative: bool,
    ips: BTreeSet<IpAddr>,
    cname: Option<(String, String)>,
    owners: BTreeSet<String>,
    ttls: BTreeSet<u32>,
    message: Message,
}

fn run(
    settings: &Settings,
    client_name: Option<&str>,
    bytes: &[u8],
    proto: Protocol,
) -> Option<Reply> {
    let s = state();
    let c = client_name.map(|n| client(&s, n));
    let out = handle_locally(&s, c.as_deref(), settings, bytes, proto)?;
    let m = Message::from_vec(&out).expect("our reply parses");
    let mut ips = BTreeSet::new();
    let mut cname = None;
    let mut owners = BTreeSet::new();
    let mut ttls = BTreeSet::new();
    for r in m.answers() {
        ttls.insert(r.ttl());
        match r.data() {
            RData::A(a) => {
                ips.insert(IpAddr::V4(a.0));
                owners.insert(r.name().to_ascii());
            }
            RData::AAAA(a) => {
                ips.insert(IpAddr::V6(a.0));
                owners.insert(r.name().to_ascii());
            }
            RData::CNAME(c) => cname = Some((r.name().to_ascii(), c.0.to_ascii())),
            other => panic!("unexpected record {other:?}"),
        }
    }
    Some(Reply {
        code: m.response_code(),
        authoritative: m.authoritative(),
        ips,
        cname,
        owners,
        ttls,
        message: m,
    })
}

fn ask(name: &str, ty: RecordType) -> Option<Reply> {
    run(
        &Settings::default(),
        Some("client"),
        &query_bytes(name, ty, None),
        Protocol::Udp,
    )
}

fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

use RecordType::{A, AAAA};

#[test]
fn mesh_names_are_answered_with_search_expansion() {
    // (query, type, expected ips, expected CNAME target)
    let cases: &[(&str, RecordType, &[&str], Option<&str>)] = &[
        ("echo.ns1.svc.cluster.local.", A, &["10.96.0.1"], None),
        ("ECHO.ns1.svc.cluster.local.", A, &["10.96.0.1"], None),
        ("echo.ns1.svc.cluster.local.", AAAA, &["fd00::96:1"], None),
        // Short names as a resolver without search domains sends them.
        ("echo.", A, &["10.96.0.1"], None),
        ("echo.ns2.", A, &["10.96.0.2"], None),
        ("echo.ns2.svc.", A, &["10.96.0.2"], None),
        // A search domain appended by the client's resolver: stripped, with a CNAME.
        (
            "echo.ns1.svc.cluster.local.ns1.svc.cluster.local.",
            A,
            &["10.96.0.1"],
            Some("echo.ns1.svc.cluster.local."),
        ),
        (
            "echo.ns2.ns1.svc.cluster.local.",
            A,
            &["10.96.0.2"],
            Some("echo.ns2."),
        ),
        ("echo.ns1.svc.cluster.local.", A, &["10.96.0.1"], None),
        (
            "api.example.com.svc.cluster.local.",
            A,
            &["10.96.1.1"],
            Some("api.example.com."),
        ),
        // Wildcard hosts, never with a CNAME.
        ("x.wild.example.com.", A, &["10.96.1.2"], None),
        ("a.b.wild.example.com.", A, &["10.96.1.2"], None),
        (
            "x.wild.example.com.ns1.svc.cluster.local.",
            A,
            &["10.96.1.2"],
            None,
        ),
        // Headless: one address of the family per endpoint.
        (
            "headless.ns1.svc.cluster.local.",
            A,
            &["10.0.1.1", "10.0.1.2"],
            None,
        ),
        (
            "headless.ns1.svc.cluster.local.",
            AAAA,
            &["fd00::1:1"],
            None,
        ),
        // Families.
        ("v4.ns1.svc.cluster.local.", A, &["10.96.0.4"], None),
        ("v4.ns1.svc.cluster.local.", AAAA, &[], None),
        ("v6.ns1.svc.cluster.local.", A, &[], None),
        ("v6.ns1.svc.cluster.local.", AAAA, &["fd00::96:6"], None),
        // Ranking: client namespace > canonical > first.
        ("mine.example.com.", A, &["10.96.5.1"], None),
        ("canon.example.com.", A, &["10.96.4.3"], None),
        ("shared.example.com.", A, &["10.96.2.2"], None),
    ];
    for (name, ty, want, cname) in cases {
        let r = ask(name, *ty).unwrap_or_else(|| panic!("{name}: no reply"));
        assert_eq!(r.code, ResponseCode::NoError, "{name} {ty}");
        assert!(r.authoritative, "{name} {ty}: authoritative");
        assert_eq!(r.ips, ips(want), "{name} {ty}");
        assert_eq!(
            r.cname.as_ref().map(|c| c.1.as_str()),
            *cname,
            "{name} {ty}"
        );
        if let Some((from, to)) = &r.cname {
            assert_eq!(from.to_lowercase(), name.to_lowercase());
            assert!(
                r.owners.iter().all(|o| o == to),
                "{name}: addresses owned by the target"
            );
        } else if !r.ips.is_empty() {
            assert_eq!(r.owners.len(), 1);
            assert_eq!(
                r.owners.iter().next().unwrap().to_lowercase(),
                name.to_lowercase()
            );
        }
        assert!(r.ttls.iter().all(|t| *t == 30), "{name}: TTL 30");
        assert!(r.message.recursion_available(), "{name}: RA");
        assert_eq!(r.message.id(), 0x1234);
        assert_eq!(r.message.message_type(), MessageType::Response);
    }
}

#[test]
fn other_names_and_types_are_forwarded() {
    // The sans-IO path answers SERVFAIL for "forward".
    for (name, ty) in [
        ("example.org.", A),
        ("novip.example.com.", A),
        ("echo.ns1.svc.cluster.local.", RecordType::MX),
        ("echo.ns1.svc.cluster.local.", RecordType::TXT),
        ("echo.ns9.svc.cluster.local.", A),
        // Not visible from ns1.
        ("private.ns3.svc.cluster.local.", A),
        ("wild.example.com.", A),
    ] {
        let r = ask(name, ty).unwrap();
        assert_eq!(r.code, ResponseCode::ServFail, "{name} {ty} is forwarded");
        assert!(!r.authoritative);
    }
}

#[test]
fn visibility_follows_the_client_namespace() {
    let bytes = query_bytes("private.ns3.svc.cluster.local.", A, None);
    let s = state();
    let mut c = (*client(&s, "client2")).clone();
    c.namespace = "ns3".into();
    let out = handle_locally(&s, Some(&c), &Settings::default(), &bytes, Protocol::Udp).unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert!(m.authoritative());
    assert_eq!(m.answers().len(), 1);
    // The short form resolves in the client's namespace.
    let out = handle_locally(
        &s,
        Some(&c),
        &Settings::default(),
        &query_bytes("private.", A, None),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(Message::from_vec(&out).unwrap().answers().len(), 1);
    // From ns2, `echo` is ns2's echo.
    let r = run(
        &Settings::default(),
        Some("client2"),
        &query_bytes("echo.", A, None),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.ips, ips(&["10.96.0.2"]));
}

#[test]
fn vips_of_the_clients_network() {
    let r = run(
        &Settings::default(),
        Some("client-net2"),
        &query_bytes("echo.", A, None),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.ips, ips(&["10.200.0.1"]));
    let r = run(
        &Settings::default(),
        Some("client-net2"),
        &query_bytes("echo.", AAAA, None),
        Protocol::Udp,
    )
    .unwrap();
    assert!(r.authoritative && r.ips.is_empty() && r.code == ResponseCode::NoError);
}

#[test]
fn preferred_namespace_breaks_ties_after_canonical() {
    let settings = Settings {
        preferred_namespace: Some("ns4".into()),
        ..Settings::default()
    };
    let r = run(
        &settings,
        Some("client"),
        &query_bytes("shared.example.com.", A, None),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.ips, ips(&["10.96.2.4"]));
    let r = run(
        &settings,
        Some("client"),
        &query_bytes("canon.example.com.", A, None),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.ips, ips(&["10.96.4.3"]), "canonical still first");
}

#[test]
fn ipv6_disabled_answers_aaaa_empty() {
    let settings = Settings {
        ipv6_enabled: false,
        ..Settings::default()
    };
    let r = run(
        &settings,
        Some("client"),
        &query_bytes("echo.", AAAA, None),
        Protocol::Udp,
    )
    .unwrap();
    assert!(r.authoritative);
    assert_eq!(r.code, ResponseCode::NoError);
    assert!(r.ips.is_empty());
}

#[test]
fn fixed_search_list_in_dedicated_mode() {
    let settings = Settings {
        search: SearchList::Fixed(vec!["corp.example".into()]),
        ..Settings::default()
    };
    let r = run(
        &settings,
        Some("client"),
        &query_bytes("echo.corp.example.", A, None),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.ips, ips(&["10.96.0.1"]));
    assert_eq!(r.cname.unwrap().1, "echo.");
    // The Kubernetes list is not used then.
    let r = run(
        &settings,
        Some("client"),
        &query_bytes("echo.ns1.svc.cluster.local.ns1.svc.cluster.local.", A, None),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.code, ResponseCode::ServFail, "forwarded");
}

#[test]
fn unknown_client_gets_servfail() {
    let r = run(
        &Settings::default(),
        None,
        &query_bytes("echo.", A, None),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.code, ResponseCode::ServFail);
    assert!(!r.authoritative);
}

#[test]
fn answers_are_shuffled() {
    let mut firsts = BTreeSet::new();
    for _ in 0..64 {
        let r = ask("headless.ns1.svc.cluster.local.", A).unwrap();
        let first = match r.message.answers()[0].data() {
            RData::A(a) => a.0,
            _ => unreachable!(),
        };
        firsts.insert(first);
    }
    assert_eq!(firsts.len(), 2, "both endpoints come first sometimes");
}

#[test]
fn edns_is_echoed_with_at_least_512() {
    for (offered, echoed) in [(100u16, 512u16), (1232, 1232), (4096, 4096)] {
        let r = run(
            &Settings::default(),
            Some("client"),
            &query_bytes("echo.", A, Some(offered)),
            Protocol::Udp,
        )
        .unwrap();
        assert_eq!(
            r.message.extensions().as_ref().unwrap().max_payload(),
            echoed
        );
    }
    let r = ask("echo.", A).unwrap();
    assert!(
        r.message.extensions().is_none(),
        "no EDNS without the client's"
    );
}

#[test]
fn malformed_queries() {
    let settings = Settings::default();
    // A response message ⇒ FORMERR.
    let mut m = Message::from_vec(&query_bytes("echo.", A, None)).unwrap();
    m.set_message_type(MessageType::Response);
    let r = run(
        &settings,
        Some("client"),
        &m.to_vec().unwrap(),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.code, ResponseCode::FormErr);
    assert!(r.ips.is_empty());
    let mut m = Message::from_vec(&query_bytes("echo.", A, None)).unwrap();
    m.set_op_code(OpCode::Status);
    let r = run(
        &settings,
        Some("client"),
        &m.to_vec().unwrap(),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.code, ResponseCode::NotImp);
    // No question, or two.
    let mut m = query_message(7, Query::query(Name::from_ascii("echo.").unwrap(), A));
    m.take_queries();
    let r = run(
        &settings,
        Some("client"),
        &m.to_vec().unwrap(),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.code, ResponseCode::FormErr);
    let mut m = query_message(7, Query::query(Name::from_ascii("echo.").unwrap(), A));
    m.add_query(Query::query(Name::from_ascii("x.").unwrap(), A));
    let r = run(
        &settings,
        Some("client"),
        &m.to_vec().unwrap(),
        Protocol::Udp,
    )
    .unwrap();
    assert_eq!(r.code, ResponseCode::FormErr);
    // Truncated: header readable ⇒ FORMERR with its id; shorter ⇒ dropped.
    let full = query_bytes("echo.ns1.svc.cluster.local.", A, None);
    let r = run(&settings, Some("client"), &full[..20], Protocol::Udp).unwrap();
    assert_eq!(r.code, ResponseCode::FormErr);
    assert_eq!(r.message.id(), 0x1234);
    assert!(run(&settings, Some("client"), &full[..5], Protocol::Udp).is_none());
    assert!(run(&settings, Some("client"), &[], Protocol::Udp).is_none());
    // A 300-byte name (labels of 60 bytes; names end at 255) ⇒ FORMERR.
    let mut bytes = full[..12].to_vec();
    for _ in 0..5 {
        bytes.push(60);
        bytes.extend(std::iter::repeat_n(b'a', 60));
    }
    bytes.extend([0, 0, 1, 0, 1]);
    assert!(bytes.len() > 300);
    let r = run(&settings, Some("client"), &bytes, Protocol::Udp).unwrap();
    assert_eq!(r.code, ResponseCode::FormErr);
}

#[test]
fn large_udp_replies_are_truncated() {
    // A headless service with many endpoints.
    let mut yaml =
        String::from("workloads:\n- {name: client, namespace: ns1, workloadIps: [\"10.0.0.1\"]}\n");
    for i in 0..100 {
        yaml.push_str(&format!(
            "- {{name: e{i}, namespace: ns1, workloadIps: [\"10.2.0.{i}\"], services: {{ns1/big.ns1.svc.cluster.local: {{80: 80}}}}}}\n"
        ));
    }
    yaml.push_str(
        "services:\n- {name: big, namespace: ns1, hostname: big.ns1.svc.cluster.local}\n",
    );
    let s = ProxyState::from_yaml("t", &yaml).unwrap();
    let c = client(&s, "client");
    let q = query_bytes("big.", A, None);
    let udp = handle_locally(&s, Some(&c), &Settings::default(), &q, Protocol::Udp).unwrap();
    assert!(udp.len() <= 512);
    let m = Message::from_vec(&udp).unwrap();
    assert!(m.truncated() && m.answers().is_empty());
    let tcp = handle_locally(&s, Some(&c), &Settings::default(), &q, Protocol::Tcp).unwrap();
    assert_eq!(Message::from_vec(&tcp).unwrap().answers().len(), 100);
}

#[test]
fn parse_request_reports_the_query() {
    let Parsed::Query(r) = parse_request(&query_bytes("Echo.NS1.", AAAA, None)) else {
        panic!("a query");
    };
    assert_eq!(r.name(), "echo.ns1");
    assert_eq!(r.query_type(), "aaaa");
}
