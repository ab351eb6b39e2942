//! The DNS server on loopback: mesh answers, forwarding (UDP, TC → TCP, NXDOMAIN,
//! failures), TCP framing, the flood bound, metrics and the resolver API.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ambit_dns::{
    ClientIdentity, DnsConfig, DnsMetrics, DnsServer, ListenAddr, LocalSockets, ResolvConf,
    Resolver, Settings,
};
use ambit_state::ProxyState;
use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

const MESH: &str = r#"
workloads:
- {name: client, namespace: ns1, canonicalName: client, canonicalRevision: v1, workloadIps: ["10.0.0.1"]}
services:
- {name: echo, namespace: ns1, hostname: echo.ns1.svc.cluster.local, vips: ["/10.96.0.1"]}
"#;

const GUARD: Duration = Duration::from_secs(10);

/// A tiny upstream resolver: `example.org` ⇒ 192.0.2.1, `big.example.org` ⇒ TC over
/// UDP and 192.0.2.2 over TCP, anything else ⇒ NXDOMAIN. `silent` never answers.
async fn upstream(silent: bool) -> SocketAddr {
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = udp.local_addr().unwrap();
    let tcp = TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, src)) = udp.recv_from(&mut buf).await else {
                return;
            };
            if silent {
                continue;
            }
            let reply = answer(&buf[..n], false);
            let _ = udp.send_to(&reply, src).await;
        }
    });
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = tcp.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let len = s.read_u16().await.unwrap();
                let mut buf = vec![0u8; len as usize];
                s.read_exact(&mut buf).await.unwrap();
                let reply = answer(&buf, true);
                s.write_all(&(reply.len() as u16).to_be_bytes())
                    .await
                    .unwrap();
                s.write_all(&reply).await.unwrap();
            });
        }
    });
    addr
}

fn answer(query: &[u8], tcp: bool) -> Vec<u8> {
    let q = Message::from_vec(query).unwrap();
    let question = q.queries()[0].clone();
    let mut m = Message::new();
    m.set_id(q.id())
        .set_message_type(MessageType::Response)
        .add_query(question.clone());
    match question.name().to_ascii().as_str() {
        "example.org." => {
            m.add_answer(Record::from_rdata(
                question.name().clone(),
                60,
                RData::A(A("192.0.2.1".parse().unwrap())),
            ));
        }
        "big.example.org." if !tcp => {
            m.set_truncated(true);
        }
        "big.example.org." => {
            m.add_answer(Record::from_rdata(
                question.name().clone(),
                60,
                RData::A(A("192.0.2.2".parse().unwrap())),
            ));
        }
        _ => {
            m.set_response_code(ResponseCode::NXDomain);
        }
    }
    m.to_vec().unwrap()
}

struct Running {
    addr: SocketAddr,
    resolver: Arc<Resolver>,
    registry: prometheus_client::registry::Registry,
}

async fn start(upstream: SocketAddr) -> Running {
    let state = Arc::new(ProxyState::from_yaml("t", MESH).unwrap());
    let cfg = DnsConfig {
        settings: Settings::default(),
        upstream: ResolvConf {
            nameservers: vec![upstream],
            search: vec![],
        },
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = DnsMetrics::register(&mut registry);
    let sockets = Arc::new(LocalSockets::default());
    let resolver = Arc::new(Resolver::new(
        &cfg,
        Arc::new(move || state.clone()),
        ClientIdentity {
            namespace: "ns1".into(),
            name: "client".into(),
            service_account: String::new(),
            node: None,
        },
        sockets.clone(),
        metrics.clone(),
    ));
    let server = DnsServer::bind(
        resolver.clone(),
        sockets.as_ref(),
        ListenAddr::Exact("127.0.0.1:0".parse().unwrap()),
        true,
    )
    .unwrap();
    let addr = server.local_addrs()[0];
    tokio::spawn(server.run(std::future::pending()));
    Running {
        addr,
        resolver,
        registry,
    }
}

fn query(id: u16, name: &str) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    m.to_vec().unwrap()
}

async fn udp_ask(server: SocketAddr, bytes: &[u8]) -> Option<Message> {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    s.send_to(bytes, server).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), s.recv(&mut buf))
        .await
        .ok()?
        .unwrap();
    Some(Message::from_vec(&buf[..n]).unwrap())
}

fn a_records(m: &Message) -> Vec<IpAddr> {
    m.answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn answers_and_forwards_over_udp_and_tcp() {
    let up = upstream(false).await;
    let r = start(up).await;
    let m = udp_ask(r.addr, &query(1, "echo.")).await.unwrap();
    assert!(m.authoritative());
    assert_eq!(a_records(&m), ["10.96.0.1".parse::<IpAddr>().unwrap()]);

    let m = udp_ask(r.addr, &query(2, "example.org.")).await.unwrap();
    assert_eq!(m.id(), 2);
    assert!(!m.authoritative());
    assert_eq!(a_records(&m), ["192.0.2.1".parse::<IpAddr>().unwrap()]);

    let m = udp_ask(r.addr, &query(3, "nx.example.org.")).await.unwrap();
    assert_eq!(m.response_code(), ResponseCode::NXDomain);
    assert!(!m.authoritative());

    // The upstream truncates over UDP: the forwarder asks again over TCP.
    let m = udp_ask(r.addr, &query(4, "big.example.org."))
        .await
        .unwrap();
    assert_eq!(a_records(&m), ["192.0.2.2".parse::<IpAddr>().unwrap()]);

    // TCP: two queries on one connection.
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    for (id, name) in [(5u16, "echo.ns1."), (6, "example.org.")] {
        let q = query(id, name);
        s.write_all(&(q.len() as u16).to_be_bytes()).await.unwrap();
        s.write_all(&q).await.unwrap();
        let len = tokio::time::timeout(GUARD, s.read_u16())
            .await
            .unwrap()
            .unwrap();
        let mut buf = vec![0u8; len as usize];
        s.read_exact(&mut buf).await.unwrap();
        let m = Message::from_vec(&buf).unwrap();
        assert_eq!(m.id(), id);
        assert_eq!(a_records(&m).len(), 1);
    }

    // Bad input: a truncated packet ⇒ FORMERR; a few bytes ⇒ nothing.
    let q = query(7, "echo.ns1.svc.cluster.local.");
    let m = udp_ask(r.addr, &q[..15]).await.unwrap();
    assert_eq!(m.response_code(), ResponseCode::FormErr);
    assert!(udp_ask(r.addr, &q[..4]).await.is_none());

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &r.registry).unwrap();
    let labels = r#"request_query_type="a",request_protocol="udp",source_canonical_service="client",source_canonical_revision="v1""#;
    assert!(
        text.contains(&format!("istio_dns_requests_total{{{labels}}} 4")),
        "{text}"
    );
    assert!(
        text.contains(&format!("istio_dns_upstream_requests_total{{{labels}}} 3")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "istio_dns_upstream_request_duration_seconds_count{{{labels}}} 3"
        )),
        "{text}"
    );
    assert!(
        text.contains("le=\"0.0005\"") && text.contains("le=\"5.0\""),
        "ztunnel's buckets: {text}"
    );
    assert!(
        !text.contains("istio_dns_upstream_failures_total{"),
        "NXDOMAIN is an answer, not a failure: {text}"
    );
}

#[tokio::test]
async fn silent_upstream_is_servfail_and_a_flood_is_bounded() {
    let silent = upstream(true).await;
    let flooded = start(silent).await;
    let healthy = start(upstream(false).await).await;
    // Fill the flooded server's forward slots, and more.
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for id in 0..500u16 {
        s.send_to(&query(id, "example.org."), flooded.addr)
            .await
            .unwrap();
    }
    // Mesh names of the flooded pod are still answered; the other pod forwards fine.
    let m = udp_ask(flooded.addr, &query(1000, "echo.")).await.unwrap();
    assert_eq!(a_records(&m).len(), 1);
    let m = udp_ask(healthy.addr, &query(1001, "example.org."))
        .await
        .unwrap();
    assert_eq!(a_records(&m).len(), 1);
    // The flood's forwards time out as SERVFAIL; beyond the bound they were dropped.
    let mut buf = vec![0u8; 4096];
    let mut servfails = 0;
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(4), s.recv(&mut buf)).await {
        let m = Message::from_vec(&buf[..n]).unwrap();
        assert_eq!(m.response_code(), ResponseCode::ServFail);
        servfails += 1;
    }
    assert!(
        servfails > 0 && servfails <= ambit_dns::forward::MAX_IN_FLIGHT,
        "{servfails}"
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &flooded.registry).unwrap();
    assert!(
        text.contains("istio_dns_upstream_failures_total{"),
        "{text}"
    );
}

#[tokio::test]
async fn resolver_api_answers_mesh_and_forwarded_names() {
    let r = start(upstream(false).await).await;
    let state = ProxyState::from_yaml("t", MESH).unwrap();
    let client = state.workloads().next().unwrap().clone();
    let ips = r.resolver.lookup(&client, "echo", false).await.unwrap();
    assert_eq!(ips, ["10.96.0.1".parse::<IpAddr>().unwrap()]);
    let ips = r
        .resolver
        .lookup(&client, "example.org", false)
        .await
        .unwrap();
    assert_eq!(ips, ["192.0.2.1".parse::<IpAddr>().unwrap()]);
    let e = r.resolver.lookup(&client, "echo", true).await.unwrap_err();
    assert!(e.to_string().contains("no IPv6 address"), "{e}");
    let e = r
        .resolver
        .lookup(&client, "nx.example.org", false)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            ambit_dns::DnsError::Failed {
                code: ResponseCode::NXDomain,
                ..
            }
        ),
        "{e}"
    );
}
