//! As root: what a peer without credentials can make `ambit control` hold, against the
//! real process in a network namespace, with raw HTTP/2 clients over TLS bound to chosen
//! loopback addresses (so "another address" is a real other source).
//!
//! - xDS and the CA need a token the tokens file lists, checked from the request's
//!   headers before its body is read; a deleted tokens file grants nothing.
//! - Idle connections that never authenticate are closed, and a flood of them (from the
//!   client's own address or from many) does not lock a real client out.
//! - One source with a valid token cannot take every stream.
//! - Certificate requests: a body larger than a CSR is refused from its length prefix, a
//!   body that never finishes times out; a subscription name larger than any real one
//!   ends the stream.
//! - The operator port refuses a non-loopback address.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ambit_netns_lab::control::ControlPlane;
use ambit_netns_lab::{wait_until, Lab};
use ambit_proto::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, ADDRESS_TYPE};
use bytes::{Buf, Bytes, BytesMut};
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
const CA_PATH: &str = "/istio.v1.auth.IstioCertificateService/CreateCertificate";
/// Guards against hangs only; no timing is asserted.
const WAIT: Duration = Duration::from_secs(30);

const MESH: &str = r#"
workloads:
- uid: c1//v1/Pod/default/web
  name: web
  namespace: default
  serviceAccount: web
  node: node1
  workloadIps: ["10.0.0.2"]
"#;

fn ambit() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ambit"))
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A control server in a namespace of its own, with `args` added to its command line.
struct Server {
    _lab: Lab,
    ns: String,
    control: ControlPlane,
    tls: Arc<rustls::ClientConfig>,
}

impl Server {
    fn start(tag: &str, args: &[&str]) -> Server {
        let lab = Lab::new(tag).unwrap();
        let ns = lab.netns("control").unwrap();
        let ca_dir = lab.dir.path().join("ca");
        std::fs::create_dir(&ca_dir).unwrap();
        let listen: SocketAddr = "127.0.0.1:15012".parse().unwrap();
        let mut control =
            ControlPlane::prepare(&lab, &ns, listen, &ambit(), &ca_dir, &["node1"], MESH).unwrap();
        control.extra_args = args.iter().map(|a| a.to_string()).collect();
        control.start(&lab).unwrap();
        let root = std::fs::read(ca_dir.join("root-cert.pem")).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(&root) {
            roots.add(c.unwrap()).unwrap();
        }
        let mut tls =
            rustls::ClientConfig::builder_with_provider(ambit_identity::crypto_provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        Server {
            _lab: lab,
            ns,
            control,
            tls: Arc::new(tls),
        }
    }

    fn token(&self) -> String {
        self.control.token("node1").unwrap()
    }

    /// A TCP connection from `from` (any 127/8 address) to the server, in its namespace.
    fn tcp_from(&self, from: IpAddr) -> TcpStream {
        let to = self.control.listen;
        let std = Lab::in_netns(&self.ns, move || {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            s.bind(&SocketAddr::new(from, 0).into())?;
            s.connect(&to.into())?;
            Ok(std::net::TcpStream::from(s))
        })
        .unwrap();
        std.set_nonblocking(true).unwrap();
        TcpStream::from_std(std).unwrap()
    }

    async fn tls_from(&self, from: IpAddr) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = self.tcp_from(from);
        let name = ServerName::try_from("127.0.0.1").unwrap();
        tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
    }

    /// An HTTP/2 connection from `from`; the task drives it and ends when it closes.
    async fn h2_from(&self, from: IpAddr) -> H2 {
        let tls = tokio::time::timeout(WAIT, self.tls_from(from))
            .await
            .expect("TLS in time")
            .expect("TLS handshake");
        let (send, conn) = h2::client::handshake(tls).await.expect("HTTP/2 handshake");
        H2 {
            send,
            driver: tokio::spawn(async move {
                let _ = conn.await;
            }),
        }
    }

    fn metric(&self, name: &str) -> u64 {
        let text = self.control.metrics().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    }
}

struct H2 {
    send: h2::client::SendRequest<Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

/// What a gRPC call got: its status (if it ended) and the messages before it.
#[derive(Debug)]
struct Answer {
    status: Option<(u32, String)>,
    messages: Vec<Bytes>,
}

impl Answer {
    fn code(&self) -> Option<u32> {
        self.status.as_ref().map(|s| s.0)
    }
}

const DEADLINE_EXCEEDED: u32 = 4;
const RESOURCE_EXHAUSTED: u32 = 8;
const INVALID_ARGUMENT: u32 = 3;
const OUT_OF_RANGE: u32 = 11;
const UNAUTHENTICATED: u32 = 16;

fn grpc_frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out.into()
}

fn xds_request(names: Vec<String>) -> Bytes {
    let req = DeltaDiscoveryRequest {
        node: Some(Node {
            id: "ztunnel~10.0.0.1~zt.istio-system~istio-system.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: ADDRESS_TYPE.into(),
        resource_names_subscribe: names,
        ..Default::default()
    };
    grpc_frame(&req.encode_to_vec())
}

fn status_of(headers: &http::HeaderMap) -> Option<(u32, String)> {
    let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Some((code, message))
}

/// `grpc-message` is percent-encoded (gRPC over HTTP/2).
fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = raw
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (raw[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl H2 {
    /// Opens a call to `path` with `token`, sends `body` (ending the stream when `end`),
    /// and reads until the status or `want` messages have come.
    async fn call(
        &mut self,
        path: &str,
        token: Option<&str>,
        body: Bytes,
        end: bool,
        want: usize,
    ) -> (Answer, h2::SendStream<Bytes>) {
        let mut request = http::Request::builder()
            .method("POST")
            .uri(format!("https://127.0.0.1:15012{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(t) = token {
            request = request.header("authorization", format!("Bearer {t}"));
        }
        let send = self.send.clone();
        let mut send = tokio::time::timeout(WAIT, send.ready())
            .await
            .expect("stream capacity in time")
            .expect("the connection is open");
        let (response, mut tx) = send
            .send_request(request.body(()).unwrap(), false)
            .expect("a stream");
        if !body.is_empty() || end {
            // A request refused from its headers may be answered, and its stream closed,
            // before the body goes out: the answer below is what counts.
            let _ = tx.send_data(body, end);
        }
        let response = tokio::time::timeout(WAIT, response)
            .await
            .expect("response headers in time")
            .expect("a response");
        let (parts, mut rx) = response.into_parts();
        let mut answer = Answer {
            status: status_of(&parts.headers),
            messages: Vec::new(),
        };
        if answer.status.is_some() {
            return (answer, tx);
        }
        let mut buf = BytesMut::new();
        while answer.messages.len() < want {
            match tokio::time::timeout(WAIT, rx.data())
                .await
                .expect("data in time")
            {
                Some(Ok(chunk)) => {
                    let _ = rx.flow_control().release_capacity(chunk.len());
                    buf.extend_from_slice(&chunk);
                    while buf.len() >= 5 {
                        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                        if buf.len() < 5 + len {
                            break;
                        }
                        buf.advance(5);
                        answer.messages.push(buf.split_to(len).freeze());
                    }
                }
                Some(Err(e)) => panic!("the response stream failed: {e}"),
                None => break,
            }
        }
        if answer.messages.len() < want {
            let trailers = tokio::time::timeout(WAIT, rx.trailers())
                .await
                .expect("trailers in time")
                .expect("trailers");
            answer.status = trailers.as_ref().and_then(status_of);
        }
        (answer, tx)
    }

    /// Opens an xDS stream (wildcard) and reads its first response.
    async fn xds(&mut self, token: Option<&str>) -> (Answer, h2::SendStream<Bytes>) {
        self.call(ADS_PATH, token, xds_request(Vec::new()), false, 1)
            .await
    }

    fn is_closed(&self) -> bool {
        self.driver.is_finished()
    }
}

fn workloads(answer: &Answer) -> Vec<String> {
    let first = answer.messages.first().expect("a response");
    DeltaDiscoveryResponse::decode(first.clone())
        .unwrap()
        .resources
        .into_iter()
        .map(|r| r.name)
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn xds_and_the_ca_need_a_listed_token_checked_before_the_body() {
    let server = Server::start("ctl-token", &[]);
    runtime().block_on(async {
        let token = server.token();
        let mut conn = server.h2_from(loopback(1)).await;
        for bad in [None, Some("made-up")] {
            let (answer, _) = conn.xds(bad).await;
            assert_eq!(answer.code(), Some(UNAUTHENTICATED), "{bad:?}: {answer:?}");
            assert!(answer.messages.is_empty(), "{bad:?}: {answer:?}");
        }
        // Refused from the headers alone: the body is never sent, the answer comes anyway.
        let (answer, _) = conn.call(CA_PATH, None, Bytes::new(), false, 0).await;
        assert_eq!(answer.code(), Some(UNAUTHENTICATED), "{answer:?}");
        let (answer, _) = conn.xds(Some(&token)).await;
        assert_eq!(answer.code(), None, "{answer:?}");
        assert_eq!(workloads(&answer), ["c1//v1/Pod/default/web"]);
        assert_eq!(
            server.metric("ambit_control_unauthenticated_requests_total"),
            3
        );

        // A deleted tokens file grants nothing; restored, it grants again.
        let saved = std::fs::read(&server.control.tokens_path).unwrap();
        std::fs::remove_file(&server.control.tokens_path).unwrap();
        let mut refused = None;
        for _ in 0..100 {
            let (answer, _) = conn.xds(Some(&token)).await;
            if answer.code() == Some(UNAUTHENTICATED) {
                refused = Some(answer);
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            refused.is_some(),
            "the token outlived the deleted tokens file"
        );
        std::fs::write(&server.control.tokens_path, &saved).unwrap();
        let mut served = false;
        for _ in 0..100 {
            let mut conn = server.h2_from(loopback(1)).await;
            if conn.xds(Some(&token)).await.0.code().is_none() {
                served = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(served, "the restored tokens file was not read again");
        // A tokens file that no longer parses grants nothing either.
        std::fs::write(&server.control.tokens_path, "- token: [unclosed\n").unwrap();
        let mut refused = false;
        for _ in 0..100 {
            let mut conn = server.h2_from(loopback(1)).await;
            if conn.xds(Some(&token)).await.0.code() == Some(UNAUTHENTICATED) {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            refused,
            "the old tokens outlived a tokens file that no longer parses"
        );
        assert!(server.control.log().contains("refusing every request"));
    });
}

#[test]
fn certificate_bodies_are_bounded_and_timed_and_names_are_bounded() {
    let server = Server::start("ctl-bodies", &[]);
    runtime().block_on(async {
        let token = server.token();
        let mut conn = server.h2_from(loopback(1)).await;
        // A length prefix of 4 MiB is refused from the prefix, before the body comes.
        let mut prefix = vec![0u8];
        prefix.extend_from_slice(&(4u32 * 1024 * 1024).to_be_bytes());
        prefix.extend_from_slice(&[0u8; 1000]);
        let (answer, _) = conn
            .call(CA_PATH, Some(&token), prefix.into(), false, 0)
            .await;
        assert_eq!(answer.code(), Some(OUT_OF_RANGE), "{answer:?}");
        // A small body that never finishes is given up on.
        let mut partial = vec![0u8];
        partial.extend_from_slice(&1000u32.to_be_bytes());
        partial.extend_from_slice(&[0u8; 10]);
        let (answer, _tx) = conn
            .call(CA_PATH, Some(&token), partial.into(), false, 0)
            .await;
        assert_eq!(answer.code(), Some(DEADLINE_EXCEEDED), "{answer:?}");
        // A subscription to a name longer than any resource's ends the stream.
        let (answer, _) = conn
            .call(
                ADS_PATH,
                Some(&token),
                xds_request(vec!["x".repeat(1024 * 1024)]),
                false,
                1,
            )
            .await;
        assert_eq!(answer.code(), Some(INVALID_ARGUMENT), "{answer:?}");
        assert!(
            answer.status.as_ref().unwrap().1.contains("1048576 bytes"),
            "{answer:?}"
        );
        // The connection and the server go on serving.
        let (answer, _) = conn.xds(Some(&token)).await;
        assert_eq!(workloads(&answer), ["c1//v1/Pod/default/web"]);
    });
}

#[test]
fn idle_and_flooding_connections_do_not_lock_out_a_client() {
    // 8 xDS clients: 72 connections in all, 2 per source.
    let server = Server::start(
        "ctl-flood",
        &["--max-clients", "8", "--max-per-source", "2"],
    );
    runtime().block_on(async {
        let token = server.token();
        // A connection that never makes a request is closed.
        let idle = server.h2_from(loopback(9)).await;
        wait_until("the idle connection to be closed", WAIT, || {
            idle.is_closed()
        })
        .unwrap();

        // A flood of idle TLS+HTTP/2 connections from the client's own address.
        let mut flood = Vec::new();
        for _ in 0..40 {
            flood.push(server.h2_from(loopback(1)).await);
        }
        // ... and from many addresses, more than the server holds in all.
        for last in 10..60 {
            for _ in 0..2 {
                flood.push(server.h2_from(loopback(last)).await);
            }
        }
        // A client from the flood's address, and one from another, are both served.
        for from in [loopback(1), loopback(2)] {
            let mut client = server.h2_from(from).await;
            let (answer, _) = client.xds(Some(&token)).await;
            assert_eq!(answer.code(), None, "from {from}: {answer:?}");
            assert_eq!(workloads(&answer), ["c1//v1/Pod/default/web"]);
        }
        // What the flood holds is bounded by the server, not by its patience.
        wait_until("the flood's connections to be closed", WAIT, || {
            flood.iter().filter(|c| !c.is_closed()).count() <= 72
        })
        .unwrap();
        let from_one = flood[..40].iter().filter(|c| !c.is_closed()).count();
        assert!(
            from_one <= 2,
            "{from_one} flood connections from 127.0.0.1 still open"
        );
    });
}

#[test]
fn one_source_with_a_token_cannot_take_every_stream() {
    let server = Server::start(
        "ctl-streams",
        &["--max-clients", "8", "--max-per-source", "2"],
    );
    runtime().block_on(async {
        let token = server.token();
        let mut greedy = server.h2_from(loopback(1)).await;
        let mut held = Vec::new();
        let mut codes = Vec::new();
        for _ in 0..10 {
            let (answer, tx) = greedy.xds(Some(&token)).await;
            codes.push(answer.code());
            held.push(tx);
        }
        let served = codes.iter().filter(|c| c.is_none()).count();
        let exhausted = codes
            .iter()
            .filter(|c| **c == Some(RESOURCE_EXHAUSTED))
            .count();
        assert_eq!((served, exhausted), (2, 8), "{codes:?}");
        // Another address still gets its streams.
        let mut other = server.h2_from(loopback(2)).await;
        let (answer, _tx) = other.xds(Some(&token)).await;
        assert_eq!(answer.code(), None, "{answer:?}");
        assert_eq!(workloads(&answer), ["c1//v1/Pod/default/web"]);
    });
}

#[test]
fn the_operator_port_must_be_on_loopback() {
    let lab = Lab::new("ctl-admin").unwrap();
    let dir = lab.dir.path();
    std::fs::write(dir.join("tokens.yaml"), "[]\n").unwrap();
    std::fs::create_dir(dir.join("mesh")).unwrap();
    let log = dir.join("control.log");
    let mut child = std::process::Command::new(ambit())
        .args(["control", "--mesh"])
        .arg(dir.join("mesh"))
        .arg("--ca")
        .arg(dir.join("ca"))
        .arg("--tokens")
        .arg(dir.join("tokens.yaml"))
        .args(["--listen", "127.0.0.1:0", "--admin", "0.0.0.0:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let exited = wait_until("ambit control to refuse --admin 0.0.0.0", WAIT, || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if exited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("ambit control served its operator port on 0.0.0.0");
    }
    assert!(!child.wait().unwrap().success());
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(
        err.contains("--admin") && err.contains("not on loopback"),
        "{err}"
    );
    drop(lab);
}

/// `--monitoring` answers the kubelet and Prometheus from any address, and shows them
/// nothing of `/debug` (the whole mesh stays on the loopback-only admin port).
#[test]
fn the_monitoring_port_serves_ready_and_metrics_only() {
    let server = Server::start("ctl-monitor", &["--monitoring", "127.0.0.2:15020"]);
    let at = SocketAddr::from(([127, 0, 0, 2], 15020));
    let get = |path: &str| ambit_netns_lab::http_get(&server.ns, at, path).unwrap();
    assert_eq!(get("/ready"), (200, "ready\n".to_string()));
    let (status, metrics) = get("/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("ambit_control_xds_clients"), "{metrics}");
    let (status, body) = get("/debug");
    assert_eq!(status, 404, "{body}");
    assert!(!body.contains("workloads"), "{body}");
}
