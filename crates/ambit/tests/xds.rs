//! `ambit ztunnel` against an in-process delta xDS server over TLS on 127.0.0.1: the
//! binary reads the XDS_* variables, stays not ready ("state manager") until a response
//! of each type arrived, then shows the workload it was sent in `/config_dump`; a batch
//! with one malformed workload is NACKed naming it while the rest applies.

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
use ambit_proto::istio::workload as pw;
use ambit_proto::{
    address_resource, DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource, ADDRESS_TYPE,
};
use futures_util::Stream;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

const UID: &str = "Kubernetes//v1/Pod/ns1/a";

/// Answers the initial requests once `go` turns true; reports the metadata it saw.
struct Ads {
    go: watch::Receiver<bool>,
    meta: mpsc::UnboundedSender<Vec<String>>,
    /// Every ACK or NACK the proxy sends.
    replies: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
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
        let meta: Vec<String> = req
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some(format!("{k}={}", v.to_str().unwrap_or("?")))
                }
                _ => None,
            })
            .collect();
        let _ = self.meta.send(meta);
        let mut incoming = req.into_inner();
        let mut go = self.go.clone();
        let replies = self.replies.clone();
        let (tx, rx) = mpsc::unbounded_channel::<Result<DeltaDiscoveryResponse, Status>>();
        tokio::spawn(async move {
            while let Ok(Some(m)) = incoming.message().await {
                if m.response_nonce.is_empty() {
                    let _ = go.wait_for(|g| *g).await;
                    let _ = tx.send(Ok(answer(&m.type_url)));
                } else {
                    // Once the first workload is in: a batch with one good workload
                    // and one whose address has 5 bytes.
                    if m.type_url == ADDRESS_TYPE && m.response_nonce == "1" {
                        let _ = tx.send(Ok(mixed_batch()));
                    }
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

const GOOD_UID: &str = "Kubernetes//v1/Pod/ns1/good";
const BAD_UID: &str = "Kubernetes//v1/Pod/ns1/bad";

fn workload_resource(uid: &str, name: &str, address: Vec<u8>) -> Resource {
    let w = pw::Workload {
        uid: uid.into(),
        name: name.into(),
        namespace: "ns1".into(),
        addresses: vec![address.into()],
        ..Default::default()
    };
    address_resource(uid, "2", pw::address::Type::Workload(w))
}

fn mixed_batch() -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: ADDRESS_TYPE.into(),
        nonce: "2".into(),
        resources: vec![
            workload_resource(GOOD_UID, "good", vec![127, 0, 0, 2]),
            workload_resource(BAD_UID, "bad", vec![127, 0, 0, 3, 9]),
        ],
        ..Default::default()
    }
}

fn answer(type_url: &str) -> DeltaDiscoveryResponse {
    let resources = if type_url == ADDRESS_TYPE {
        let w = pw::Workload {
            uid: UID.into(),
            name: "a".into(),
            namespace: "ns1".into(),
            addresses: vec![vec![127, 0, 0, 1].into()],
            ..Default::default()
        };
        vec![address_resource(UID, "1", pw::address::Type::Workload(w))]
    } else {
        Vec::new()
    };
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: "1".into(),
        resources,
        ..Default::default()
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

/// A blocking HTTP/1.1 GET: (status line, body); None while nothing listens.
fn get(port: u16, path: &str) -> Option<(String, String)> {
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
    Some((head.lines().next()?.to_string(), body.to_string()))
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` until it returns Some, failing after a generous guard.
async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_proxy_gets_ready_from_xds() {
    let pki = test_pki(&["localhost"]);
    let root_pem = pki.root_pem.clone();
    let (go_tx, go) = watch::channel(false);
    let (meta_tx, mut meta) = mpsc::unbounded_channel();
    let (replies_tx, mut replies) = mpsc::unbounded_channel();
    let addr = serve(
        Ads {
            go,
            meta: meta_tx,
            replies: replies_tx,
        },
        &pki,
    )
    .await;

    let readiness = free_port();
    let admin = free_port();
    let env: Vec<(String, String)> = [
        ("PROXY_MODE", "dedicated".to_string()),
        ("PROXY_WORKLOAD_INFO", "ns1/a/default".to_string()),
        ("XDS_ADDRESS", format!("localhost:{}", addr.port())),
        ("XDS_ROOT_CA", root_pem.clone()),
        // No certificate is needed here; the default CA address only needs a usable root.
        ("CA_ROOT_CA", root_pem),
        ("AUTH_TOKEN", "e2e-token".to_string()),
        ("CLUSTER_ID", "c9".to_string()),
        ("POD_NAME", "ztunnel-e2e".to_string()),
        ("POD_NAMESPACE", "istio-system".to_string()),
        ("AMBIT_ADMIN_ADDR", format!("127.0.0.1:{admin}")),
        ("AMBIT_STATS_ADDR", format!("127.0.0.1:{}", free_port())),
        ("AMBIT_READINESS_ADDR", format!("127.0.0.1:{readiness}")),
        ("AMBIT_OUTBOUND_PORT", free_port().to_string()),
        ("AMBIT_INBOUND_PLAINTEXT_PORT", free_port().to_string()),
        ("AMBIT_HBONE_PORT", free_port().to_string()),
        ("RUST_LOG", "info".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let child = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("ztunnel")
        .env_clear()
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start ambit");
    let _child = Kill(child);

    let seen = tokio::time::timeout(Duration::from_secs(30), meta.recv())
        .await
        .expect("the node proxy never opened an xDS stream")
        .unwrap();
    for want in ["authorization=Bearer e2e-token", "clusterid=c9"] {
        assert!(seen.iter().any(|m| m == want), "{want} not in {seen:?}");
    }
    let (status, body) =
        eventually("readiness endpoint", || get(readiness, "/healthz/ready")).await;
    assert!(status.contains("500"), "{status} {body}");
    assert!(body.contains("state manager"), "{body}");

    go_tx.send(true).unwrap();
    eventually("ready", || {
        get(readiness, "/healthz/ready").filter(|(s, _)| s.contains("200"))
    })
    .await;
    let (_, dump) = get(admin, "/config_dump").expect("config_dump");
    assert!(dump.contains(UID), "{dump}");

    // The mixed batch: the bad workload is NACKed by name and reason, the good one applies.
    let nack = loop {
        let r = tokio::time::timeout(Duration::from_secs(30), replies.recv())
            .await
            .expect("no reply to the mixed batch")
            .unwrap();
        if r.response_nonce == "2" {
            break r;
        }
    };
    let detail = nack.error_detail.expect("a NACK carries error_detail");
    assert!(detail.message.contains(BAD_UID), "{}", detail.message);
    assert!(
        detail.message.contains("4 or 16 bytes"),
        "{}",
        detail.message
    );
    assert!(!detail.message.contains(GOOD_UID), "{}", detail.message);
    let dump = eventually("the good workload in /config_dump", || {
        get(admin, "/config_dump").filter(|(_, d)| d.contains(GOOD_UID))
    })
    .await
    .1;
    assert!(!dump.contains(BAD_UID), "{dump}");
}

/// What `ambit control` serves (its own encoder) is what the node proxy's decoder reads
/// back: every workload, service and policy of a full mesh arrives equal.
#[test]
fn control_resources_decode_to_the_same_mesh() {
    const MESH: &str = r#"
workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.0.0.2", "fd00::2"]
  protocol: HBONE
  node: node1
  network: net1
  clusterId: cluster1
  canonicalName: client
  canonicalRevision: v1
  workloadName: client
  workloadType: pod
  status: Unhealthy
  locality: {region: r1, zone: z1, subzone: s1}
  capacity: 2
  authorizationPolicies: ["default/allow"]
  waypoint: {destination: "/10.0.0.9", hboneMtlsPort: 15008}
  networkGateway: {destination: {namespace: gw, hostname: gw.example}, hbonePort: 15009}
  applicationTunnel: {protocol: PROXY, port: 15088}
  services:
    default/echo.default.svc.cluster.local: {80: 8080, 90: 0}
- {name: server, namespace: default, workloadType: deployment, workloadIps: ["10.0.0.3"]}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10", "net1/10.97.0.0/16"]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/echo"]
  loadBalancer: {routingPreferences: [Network, Region], mode: Failover, healthPolicy: AllowAll}
  ipFamilies: IPv4
  canonical: true
  visibility: Namespace
policies:
- name: allow
  namespace: default
  scope: WorkloadSelector
  action: Allow
  rules:
  - - - principals: [{prefix: "cluster.local/"}]
        sourceIps: ["10.0.0.0/8"]
        destinationPorts: [8080]
- {name: g, namespace: istio-system, scope: Global, action: Deny}
"#;
    let cfg = ambit_state::parse_local_config("mesh.yaml", MESH).unwrap();
    let want = ambit_state::ProxyState::from_config(cfg).unwrap();
    let addresses: Vec<Resource> = want
        .workloads()
        .map(|w| ambit_control::convert::workload_resource(w))
        .chain(
            want.services()
                .map(|s| ambit_control::convert::service_resource(s)),
        )
        .collect();
    let policies: Vec<Resource> = want
        .policies()
        .map(|p| ambit_control::convert::policy_resource(p))
        .collect();
    let mut client = ambit_xds::DeltaClient::new(ambit_xds::NodeConfig::default().to_node());
    let mut got = ambit_state::ProxyState::new();
    for (type_url, resources) in [
        (ADDRESS_TYPE, addresses),
        (ambit_proto::AUTHORIZATION_TYPE, policies),
    ] {
        let handled = client.handle(DeltaDiscoveryResponse {
            type_url: type_url.into(),
            nonce: "1".into(),
            resources,
            ..Default::default()
        });
        assert!(handled.rejected.is_empty(), "{:?}", handled.rejected);
        handled.batch.apply(&mut got);
    }
    let list = |s: &ambit_state::ProxyState| {
        (
            s.workloads().map(|w| (**w).clone()).collect::<Vec<_>>(),
            s.services().map(|x| (**x).clone()).collect::<Vec<_>>(),
            s.policies().map(|p| (**p).clone()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(list(&got), list(&want));
}
