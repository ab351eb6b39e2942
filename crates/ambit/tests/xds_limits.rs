//! `ambit ztunnel` against an in-process delta xDS server over TLS on 127.0.0.1, sent what
//! a control plane must not be able to do to it: an `Authorization` of 2,000,000 empty
//! match objects (4 MB on the wire, the audit's case) and an `Address` resource whose
//! body is another service than its name. Each is NACKed with the reason naming the
//! resource, the field and the limit; `/config_dump` never shows it; the good resources
//! of the same responses are applied. Then the same attack split over 488 policies of
//! 4,096 empty match objects each, every one within the limits of one resource: the
//! response is NACKed whole for the budget of what the policies may hold, none of them
//! shows, and a good policy sent after is applied.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream as StdTcp};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ambit_grpc::server::{incoming, test_pki, AcceptOptions, TestPki};
use ambit_netns_lab::free_port;
use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use ambit_proto::istio::security as psec;
use ambit_proto::istio::workload as pw;
use ambit_proto::{
    address_resource, DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource, ADDRESS_TYPE,
    AUTHORIZATION_TYPE,
};
use futures_util::Stream;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

const UID: &str = "Kubernetes//v1/Pod/default/a";
const GOOD_SERVICE: &str = "default/good.default.svc.cluster.local";
const ANNOUNCED: &str = "default/announced.default.svc.cluster.local";
const HIDDEN_HOST: &str = "hidden.default.svc.cluster.local";
const GOOD_POLICY: &str = "default/good-policy";
const BIG_POLICY: &str = "default/big-policy";
const MATCHES: usize = 2_000_000;

/// What the server sends of a type after the reply with a nonce ("" for the initial
/// request): the next response, if any.
type Script = fn(&str, &str) -> Option<DeltaDiscoveryResponse>;

/// Answers each request as its script says. Reports every ACK or NACK.
struct Ads {
    replies: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    script: Script,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        _: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Out<DiscoveryResponse>>, Status> {
        Err(Status::unimplemented("state of the world"))
    }

    async fn delta_aggregated_resources(
        &self,
        req: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Out<DeltaDiscoveryResponse>>, Status> {
        let mut incoming = req.into_inner();
        let replies = self.replies.clone();
        let script = self.script;
        let (tx, rx) = mpsc::unbounded_channel::<Result<DeltaDiscoveryResponse, Status>>();
        tokio::spawn(async move {
            while let Ok(Some(m)) = incoming.message().await {
                if let Some(next) = script(&m.type_url, &m.response_nonce) {
                    let _ = tx.send(Ok(next));
                }
                if !m.response_nonce.is_empty() {
                    let _ = replies.send(m);
                }
            }
        });
        let out =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        Ok(Response::new(Box::pin(out)))
    }
}

fn response(type_url: &str, nonce: &str, resources: Vec<Resource>) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: nonce.into(),
        resources,
        ..Default::default()
    }
}

fn first(type_url: &str) -> DeltaDiscoveryResponse {
    let resources = if type_url == ADDRESS_TYPE {
        let w = pw::Workload {
            uid: UID.into(),
            name: "a".into(),
            namespace: "default".into(),
            addresses: vec![vec![127, 0, 0, 1].into()],
            ..Default::default()
        };
        vec![address_resource(UID, "1", pw::address::Type::Workload(w))]
    } else {
        Vec::new()
    };
    response(type_url, "1", resources)
}

fn service(hostname: &str, vip: [u8; 4]) -> pw::address::Type {
    pw::address::Type::Service(pw::Service {
        name: hostname.split('.').next().unwrap().into(),
        namespace: "default".into(),
        hostname: hostname.into(),
        addresses: vec![pw::NetworkAddress {
            network: String::new(),
            address: vip.to_vec().into(),
            length: None,
        }],
        ..Default::default()
    })
}

fn policy_resource(key: &str, p: psec::Authorization) -> Resource {
    Resource {
        name: key.into(),
        version: "2".into(),
        resource: Some(prost_types::Any {
            type_url: AUTHORIZATION_TYPE.into(),
            value: p.encode_to_vec(),
        }),
        ..Default::default()
    }
}

/// The first test's script: a first response of each type (nonce "1"), then after its
/// ACK the second (nonce "2").
fn oversized_script(type_url: &str, nonce: &str) -> Option<DeltaDiscoveryResponse> {
    match nonce {
        "" => Some(first(type_url)),
        "1" => Some(second(type_url)),
        _ => None,
    }
}

/// The second response of each type: one refused resource, one good one.
fn second(type_url: &str) -> DeltaDiscoveryResponse {
    if type_url == ADDRESS_TYPE {
        return response(
            ADDRESS_TYPE,
            "2",
            vec![
                // Named `announced`, a body for `hidden`.
                address_resource(ANNOUNCED, "2", service(HIDDEN_HOST, [10, 96, 0, 9])),
                address_resource(
                    GOOD_SERVICE,
                    "2",
                    service("good.default.svc.cluster.local", [10, 96, 0, 1]),
                ),
            ],
        );
    }
    let big = policy(
        "big-policy",
        vec![psec::Rule {
            clauses: vec![psec::Clause {
                matches: vec![psec::Match::default(); MATCHES],
            }],
        }],
    );
    response(
        AUTHORIZATION_TYPE,
        "2",
        vec![
            policy_resource(BIG_POLICY, big),
            policy_resource(GOOD_POLICY, good_policy()),
        ],
    )
}

fn policy(name: &str, rules: Vec<psec::Rule>) -> psec::Authorization {
    psec::Authorization {
        name: name.into(),
        namespace: "default".into(),
        scope: psec::Scope::Namespace as i32,
        action: psec::Action::Deny as i32,
        rules,
        ..Default::default()
    }
}

fn good_policy() -> psec::Authorization {
    policy(
        "good-policy",
        vec![psec::Rule {
            clauses: vec![psec::Clause {
                matches: vec![psec::Match {
                    destination_ports: vec![9],
                    ..Default::default()
                }],
            }],
        }],
    )
}

/// The split attack: policies of 4,096 empty match objects (one rule, one clause: within
/// every limit of one resource), 488 of them in one 4 MB response.
const SPLIT_POLICIES: usize = 488;
const SPLIT_MATCHES: usize = 4_096;

/// The second test's script: the workload, no policy; then the split attack (nonce "2");
/// after its NACK, the good policy alone (nonce "3").
fn split_script(type_url: &str, nonce: &str) -> Option<DeltaDiscoveryResponse> {
    match (type_url, nonce) {
        (_, "") => Some(first(type_url)),
        (AUTHORIZATION_TYPE, "1") => {
            // One body, encoded once: only the name differs.
            let body = policy(
                "split-0",
                vec![psec::Rule {
                    clauses: vec![psec::Clause {
                        matches: vec![psec::Match::default(); SPLIT_MATCHES],
                    }],
                }],
            )
            .encode_to_vec();
            let resources = (0..SPLIT_POLICIES)
                .map(|i| {
                    let mut p = psec::Authorization::decode(body.as_slice()).unwrap();
                    p.name = format!("split-{i}");
                    policy_resource(&format!("default/split-{i}"), p)
                })
                .collect();
            Some(response(AUTHORIZATION_TYPE, "2", resources))
        }
        (AUTHORIZATION_TYPE, "2") => Some(response(
            AUTHORIZATION_TYPE,
            "3",
            vec![policy_resource(GOOD_POLICY, good_policy())],
        )),
        _ => None,
    }
}

async fn serve(ads: Ads, pki: &TestPki) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(ads))
            .serve_with_incoming(incoming(listener, pki.acceptor(), AcceptOptions::default())),
    );
    addr
}

/// A blocking HTTP/1.1 GET of the body; None while nothing listens.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = StdTcp::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The reply to the response of `type_url` with `nonce`. Fails at once if the proxy
/// exits (a port taken by another process between `free_port` and its bind, say).
async fn reply_to(
    replies: &mut mpsc::UnboundedReceiver<DeltaDiscoveryRequest>,
    seen: &mut Vec<DeltaDiscoveryRequest>,
    proxy: &mut Child,
    type_url: &str,
    nonce: &str,
) -> DeltaDiscoveryRequest {
    let start = Instant::now();
    loop {
        if let Some(i) = seen
            .iter()
            .position(|r| r.type_url == type_url && r.response_nonce == nonce)
        {
            return seen.remove(i);
        }
        if let Some(status) = proxy.try_wait().expect("wait for ambit") {
            panic!(
                "ambit ztunnel exited ({status}) before replying to the {type_url} response {nonce}"
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no reply to the {type_url} response {nonce}"
        );
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(200), replies.recv()).await {
            seen.push(r.expect("the server went away"));
        }
    }
}

/// `ambit ztunnel` in dedicated mode against the xDS server at `addr`, with its admin
/// port.
fn start_proxy(addr: SocketAddr, root_pem: &str) -> (Kill, u16) {
    let admin = free_port();
    let env: Vec<(&str, String)> = vec![
        ("PROXY_MODE", "dedicated".into()),
        ("PROXY_WORKLOAD_INFO", "default/a/default".into()),
        ("XDS_ADDRESS", format!("localhost:{}", addr.port())),
        ("XDS_ROOT_CA", root_pem.into()),
        ("CA_ROOT_CA", root_pem.into()),
        ("POD_NAME", "ztunnel-limits".into()),
        ("POD_NAMESPACE", "istio-system".into()),
        ("AMBIT_ADMIN_ADDR", format!("127.0.0.1:{admin}")),
        ("AMBIT_STATS_ADDR", format!("127.0.0.1:{}", free_port())),
        ("AMBIT_READINESS_ADDR", format!("127.0.0.1:{}", free_port())),
        ("AMBIT_OUTBOUND_PORT", free_port().to_string()),
        ("AMBIT_INBOUND_PLAINTEXT_PORT", free_port().to_string()),
        ("AMBIT_HBONE_PORT", free_port().to_string()),
        // No DNS proxy: its fixed port would be shared by the proxies of both tests.
        ("ISTIO_META_DNS_CAPTURE", "false".into()),
        ("RUST_LOG", "info".into()),
    ];
    let child = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("ztunnel")
        .env_clear()
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start ambit");
    (Kill(child), admin)
}

/// The server for `script` and its replies.
async fn server(
    script: Script,
) -> (
    TestPki,
    SocketAddr,
    mpsc::UnboundedReceiver<DeltaDiscoveryRequest>,
) {
    let pki = test_pki(&["localhost"]);
    let (replies_tx, replies) = mpsc::unbounded_channel();
    let ads = Ads {
        replies: replies_tx,
        script,
    };
    let addr = serve(ads, &pki).await;
    (pki, addr, replies)
}

/// `/config_dump` once `ready` says it shows what it waits for.
async fn dump_when(admin: u16, ready: impl Fn(&str) -> bool, what: &str) -> String {
    let start = Instant::now();
    loop {
        if let Some(d) = get(admin, "/config_dump") {
            if ready(&d) {
                let dump: serde_json::Value =
                    serde_json::from_str(&d).expect("config_dump is JSON");
                return dump.to_string();
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} never showed in /config_dump"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_misnamed_resources_are_nacked_and_never_applied() {
    let (pki, addr, mut replies) = server(oversized_script).await;
    let (mut proxy, admin) = start_proxy(addr, &pki.root_pem);

    let mut seen = Vec::new();
    let nack = reply_to(
        &mut replies,
        &mut seen,
        &mut proxy.0,
        AUTHORIZATION_TYPE,
        "2",
    )
    .await;
    let message = nack
        .error_detail
        .expect("a NACK carries error_detail")
        .message;
    assert_eq!(
        message,
        format!("{BIG_POLICY}: rules[0].clauses[0].matches: more than 4096 match objects in one rule (the limit)")
    );
    let nack = reply_to(&mut replies, &mut seen, &mut proxy.0, ADDRESS_TYPE, "2").await;
    let message = nack
        .error_detail
        .expect("a NACK carries error_detail")
        .message;
    assert_eq!(
        message,
        format!("{ANNOUNCED}: the body's service namespace/hostname is \"default/{HIDDEN_HOST}\", not the resource name; refused so that a removal by name always removes what was announced")
    );

    // The good resources of the same responses are applied; the refused ones are not.
    let text = dump_when(
        admin,
        |d| d.contains("good-policy") && d.contains("good.default.svc.cluster.local"),
        "the good resources",
    )
    .await;
    for refused in ["big-policy", "hidden", "announced"] {
        assert!(!text.contains(refused), "{refused} in {text}");
    }
    assert!(text.contains(UID), "{text}");
}

/// 488 policies of 4,096 empty match objects, each within the limits of one resource
/// (4 MB on the wire): over the budget of what the policies may hold once decoded, so
/// the response is NACKed whole with the estimate and the budget, and none of it is
/// applied; the good policy sent after it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_split_to_pass_the_resource_limits_are_nacked_for_the_budget() {
    let (pki, addr, mut replies) = server(split_script).await;
    let (mut proxy, admin) = start_proxy(addr, &pki.root_pem);

    let mut seen = Vec::new();
    let nack = reply_to(
        &mut replies,
        &mut seen,
        &mut proxy.0,
        AUTHORIZATION_TYPE,
        "2",
    )
    .await;
    let message = nack
        .error_detail
        .expect("the split attack is NACKed")
        .message;
    let budget = ambit_xds::MAX_HELD_POLICIES;
    let estimate: u64 = message
        .strip_prefix(
            "response: the istio.security.Authorization resources held would come to an estimated ",
        )
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no estimate in {message:?}"));
    assert!(estimate > budget, "{message}");
    assert_eq!(
        message,
        format!("response: the istio.security.Authorization resources held would come to an estimated {estimate} bytes once decoded, over their budget of {budget} bytes (held before this response: 0); nothing applied")
    );

    let ack = reply_to(
        &mut replies,
        &mut seen,
        &mut proxy.0,
        AUTHORIZATION_TYPE,
        "3",
    )
    .await;
    assert_eq!(ack.error_detail, None, "the good policy is ACKed");
    let text = dump_when(admin, |d| d.contains("good-policy"), "the good policy").await;
    assert!(!text.contains("split-"), "a split policy in {text}");
    assert!(text.contains(UID), "{text}");
}
