//! `ambit control` on loopback with real tonic clients over TLS: the delta ADS stream
//! (snapshot, ACK, push after a file change, a bad file refused while the old state stays),
//! the waypoints' policies from manifests (to ambit's own xDS client as a waypoint runs
//! it, never to a ztunnel) and the CA (signed, refused for another node's identity,
//! unknown token, two SANs).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambit_control::{Control, ControlConfig};
use ambit_identity::{CertificateRequest, SpiffeId, WorkloadCertificate};
use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_proto::envoy::service::discovery::v3::DiscoveryRequest;
use ambit_proto::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use ambit_proto::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, IstioCertificateRequest, Node, ADDRESS_TYPE,
    AUTHORIZATION_TYPE, WAYPOINT_POLICY_TYPE,
};
use rustls::pki_types::ServerName;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Streaming};

/// Guard against hangs only; no timing is asserted.
const WAIT: Duration = Duration::from_secs(20);

const MESH: &str = r#"
workloads:
- uid: c1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  node: node1
  protocol: HBONE
  workloadIps: ["10.0.0.2"]
  authorizationPolicies: ["default/deny-all"]
- uid: c1//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  node: node2
  protocol: HBONE
  workloadIps: ["10.0.0.3"]
policies:
- name: deny-all
  namespace: default
  scope: WorkloadSelector
  action: Deny
  rules: [[[{namespaces: [{exact: evil}]}]]]
"#;

const EXTRA: &str = r#"
workloads:
- uid: c1//v1/Pod/default/late
  name: late
  namespace: default
  node: node1
  workloadIps: ["10.0.0.4"]
"#;

/// The token the xDS clients present (any listed token may read xDS).
const NODE1_TOKEN: &str = "node1-token";

/// `message` with `authorization: Bearer <token>`, as ztunnel sends it.
fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

const TOKENS: &str = "- token: node1-token\n  node: node1\n- token: web-token\n  identity: spiffe://cluster.local/ns/default/sa/web\n";

/// The serving certificate is reissued at half its life; new handshakes get the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_is_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh");
    std::fs::create_dir(&mesh).unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let mut cfg = ControlConfig::new(mesh, dir.path().join("ca"), tokens);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.serving_cert_ttl = Duration::from_secs(2);
    let control = Control::start(cfg).await.unwrap();
    let first = serving_leaf(
        control.local_addr(),
        &control.root_pem().expect("a file-mode CA"),
    )
    .await;
    let start = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if serving_leaf(
            control.local_addr(),
            &control.root_pem().expect("a file-mode CA"),
        )
        .await
            != first
        {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "the serving certificate was not renewed"
        );
    }
}

/// The leaf the server presents, verified against the root and 127.0.0.1.
async fn serving_leaf(addr: SocketAddr, root_pem: &str) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(ambit_identity::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio::time::timeout(WAIT, connector.connect(name, tcp))
        .await
        .unwrap()
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

struct Fixture {
    _dir: tempfile::TempDir,
    mesh: std::path::PathBuf,
    control: Control,
}

async fn start() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh");
    std::fs::create_dir(&mesh).unwrap();
    std::fs::write(mesh.join("a.yaml"), MESH).unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let mut cfg = ControlConfig::new(mesh.clone(), dir.path().join("ca"), tokens);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.poll_interval = Duration::from_millis(100);
    let control = Control::start(cfg).await.unwrap();
    assert!(control.is_ready());
    // The ephemeral root is published for clients.
    let written = std::fs::read_to_string(dir.path().join("ca/root-cert.pem")).unwrap();
    assert_eq!(written, control.root_pem().expect("a file-mode CA"));
    Fixture {
        _dir: dir,
        mesh,
        control,
    }
}

/// A channel verifying the server with the root and `server_name` (a DNS name or an IP).
fn channel(addr: SocketAddr, root_pem: &str, server_name: &str) -> Channel {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(ambit_identity::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let name = ServerName::try_from(server_name.to_string()).unwrap();
    let service = tower::service_fn(move |_uri: http::Uri| {
        let connector = connector.clone();
        let name = name.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    Endpoint::from_static("https://istiod.istio-system.svc:15012")
        .connect_with_connector_lazy(service)
}

use rustls::pki_types::pem::PemObject;

struct Ads {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
}

impl Ads {
    async fn open(ch: Channel) -> Ads {
        let (tx, rx) = mpsc::channel(16);
        let mut client = AggregatedDiscoveryServiceClient::new(ch);
        // Requests first: the call resolves once the server answers headers.
        for type_url in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
            tx.send(DeltaDiscoveryRequest {
                node: Some(Node {
                    id: "ztunnel~10.0.0.1~zt.istio-system~istio-system.svc.cluster.local".into(),
                    ..Default::default()
                }),
                type_url: type_url.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
        let rx = tokio::time::timeout(
            WAIT,
            client.delta_aggregated_resources(with_token(ReceiverStream::new(rx), NODE1_TOKEN)),
        )
        .await
        .unwrap()
        .unwrap()
        .into_inner();
        Ads { tx, rx }
    }

    async fn next(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("no response in time")
            .unwrap()
            .expect("stream ended")
    }

    async fn ack(&self, r: &DeltaDiscoveryResponse) {
        self.tx
            .send(DeltaDiscoveryRequest {
                type_url: r.type_url.clone(),
                response_nonce: r.nonce.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }

    /// The first response of each type (in any order), ACKed.
    async fn initial(&mut self) -> (DeltaDiscoveryResponse, DeltaDiscoveryResponse) {
        let (mut addr, mut auth) = (None, None);
        while addr.is_none() || auth.is_none() {
            let r = self.next().await;
            self.ack(&r).await;
            match r.type_url.as_str() {
                ADDRESS_TYPE => addr = Some(r),
                AUTHORIZATION_TYPE => auth = Some(r),
                other => panic!("unexpected type {other}"),
            }
        }
        (addr.unwrap(), auth.unwrap())
    }
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut v: Vec<String> = r.resources.iter().map(|r| r.name.clone()).collect();
    v.sort();
    v
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_snapshot_ack_push_and_bad_file() {
    let fx = start().await;
    let addr = fx.control.local_addr();
    let root = fx.control.root_pem().expect("a file-mode CA");
    let mut ads = Ads::open(channel(addr, &root, "istiod.istio-system.svc")).await;
    let (a, p) = ads.initial().await;
    assert_eq!(
        names(&a),
        ["c1//v1/Pod/default/client", "c1//v1/Pod/default/server"]
    );
    assert_eq!(names(&p), ["default/deny-all"]);

    // The ACKs are seen (debug view) and counted.
    eventually("both ACKs in /debug", || {
        let d = fx.control.debug_json();
        let c = &d["clients"][0];
        c["types"][ADDRESS_TYPE]["ack"]["state"] == "acked"
            && c["types"][AUTHORIZATION_TYPE]["ack"]["state"] == "acked"
    })
    .await;
    let d = fx.control.debug_json();
    assert_eq!(
        d["clients"][0]["node_id"],
        "ztunnel~10.0.0.1~zt.istio-system~istio-system.svc.cluster.local"
    );
    assert!(
        d["clients"][0]["types"][ADDRESS_TYPE]["versions"]["c1//v1/Pod/default/client"].is_string()
    );
    let m = fx.control.metrics_text();
    assert!(has_sample(&m, "ambit_control_xds_clients 1"), "{m}");
    assert!(has_sample(&m, "ambit_control_xds_acks_total 2"), "{m}");

    // A new file: only the new workload is pushed.
    let generation = fx.control.mesh_generation();
    std::fs::write(fx.mesh.join("b.yaml"), EXTRA).unwrap();
    let r = ads.next().await;
    assert_eq!(r.type_url, ADDRESS_TYPE);
    assert_eq!(names(&r), ["c1//v1/Pod/default/late"]);
    assert!(r.removed_resources.is_empty());
    // The client rejects it: the NACK and its message are kept.
    ads.tx
        .send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            error_detail: Some(ambit_proto::Status {
                code: 0,
                message: "c1//v1/Pod/default/late: no".into(),
                details: vec![],
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    eventually("the NACK in /debug", || {
        fx.control.debug_json()["clients"][0]["types"][ADDRESS_TYPE]["ack"]["state"] == "nacked"
    })
    .await;
    let d = fx.control.debug_json();
    let t = &d["clients"][0]["types"][ADDRESS_TYPE];
    assert_eq!(t["ack"]["nonce"], r.nonce.as_str());
    assert_eq!(t["nacks"][0]["message"], "c1//v1/Pod/default/late: no");
    assert!(has_sample(
        &fx.control.metrics_text(),
        "ambit_control_xds_nacks_total 1"
    ));
    assert!(fx.control.mesh_generation() > generation);

    // A bad file: reported with file, line and field; the last good mesh stays.
    let generation = fx.control.mesh_generation();
    std::fs::write(
        fx.mesh.join("c.yaml"),
        "workloads:\n- name: x\n  namespace: default\n  protocol: HBONEE\n",
    )
    .unwrap();
    eventually("the bad file reported", || {
        fx.control.mesh_error().is_some()
    })
    .await;
    let err = fx.control.mesh_error().unwrap();
    assert!(
        err.contains("c.yaml") && err.contains("line 4") && err.contains("workloads[0].protocol"),
        "{err}"
    );
    assert_eq!(fx.control.mesh_generation(), generation);
    assert_eq!(fx.control.debug_json()["mesh"]["error"], err.as_str());
    // A new client gets the last good state.
    let mut other = Ads::open(channel(addr, &root, "127.0.0.1")).await;
    let (a2, _) = other.initial().await;
    assert_eq!(names(&a2).len(), 3);

    // Fixed by removing the late workload: the first client hears of the removal only.
    std::fs::remove_file(fx.mesh.join("c.yaml")).unwrap();
    std::fs::remove_file(fx.mesh.join("b.yaml")).unwrap();
    let r = ads.next().await;
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, ["c1//v1/Pod/default/late"]);
    assert!(fx.control.mesh_error().is_none());
    fx.control.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_the_world_is_unimplemented() {
    let fx = start().await;
    let ch = channel(
        fx.control.local_addr(),
        &fx.control.root_pem().expect("a file-mode CA"),
        "localhost",
    );
    // "localhost" is not a serving name: the handshake fails.
    let mut client = AggregatedDiscoveryServiceClient::new(ch);
    let (_tx, rx) = mpsc::channel::<DiscoveryRequest>(1);
    assert!(client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .is_err());
    let ch = channel(
        fx.control.local_addr(),
        &fx.control.root_pem().expect("a file-mode CA"),
        "127.0.0.1",
    );
    let mut client = AggregatedDiscoveryServiceClient::new(ch);
    let (_tx, rx) = mpsc::channel::<DiscoveryRequest>(1);
    let status = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
}

async fn create(
    ch: Channel,
    token: Option<&str>,
    csr: &str,
    impersonate: Option<&str>,
) -> Result<Vec<String>, tonic::Status> {
    let mut client = IstioCertificateServiceClient::new(ch);
    let metadata = impersonate.map(|id| prost_types::Struct {
        fields: [(
            "ImpersonatedIdentity".to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(id.to_string())),
            },
        )]
        .into(),
    });
    let mut req = tonic::Request::new(IstioCertificateRequest {
        csr: csr.to_string(),
        validity_duration: 3600,
        metadata,
    });
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    tokio::time::timeout(WAIT, client.create_certificate(req))
        .await
        .unwrap()
        .map(|r| r.into_inner().cert_chain)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_signs_allowed_identities_and_refuses_the_rest() {
    let fx = start().await;
    let ch = channel(
        fx.control.local_addr(),
        &fx.control.root_pem().expect("a file-mode CA"),
        "istiod.istio-system.svc",
    );
    let client_id = "spiffe://cluster.local/ns/default/sa/client";
    let server_id = "spiffe://cluster.local/ns/default/sa/server";

    // node1's token, a workload of node1.
    let id = SpiffeId::parse(client_id).unwrap();
    let req = CertificateRequest::new(&id).unwrap();
    let chain = create(ch.clone(), Some("node1-token"), &req.pem, Some(client_id))
        .await
        .unwrap();
    assert_eq!(
        chain.last().unwrap(),
        &fx.control.root_pem().expect("a file-mode CA")
    );
    let cert = WorkloadCertificate::from_ca_response(id.clone(), req.key, &chain).unwrap();
    assert_eq!(
        ambit_identity::svid_identity(cert.leaf().unwrap()).unwrap(),
        id
    );

    // node1's token, a workload of node2.
    let req = CertificateRequest::new(&SpiffeId::parse(server_id).unwrap()).unwrap();
    let status = create(ch.clone(), Some("node1-token"), &req.pem, Some(server_id))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains(server_id) && status.message().contains("node1"),
        "{}",
        status.message()
    );

    // Unknown and missing tokens.
    for token in [Some("nope"), None] {
        let status = create(ch.clone(), token, &req.pem, None).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{token:?}");
    }

    // Two SANs.
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![
        rcgen::SanType::URI(rcgen::Ia5String::try_from(client_id).unwrap()),
        rcgen::SanType::URI(
            rcgen::Ia5String::try_from("spiffe://cluster.local/ns/default/sa/server").unwrap(),
        ),
    ];
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    let status = create(ch.clone(), Some("node1-token"), &pem, None)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    let m = fx.control.metrics_text();
    assert!(has_sample(&m, "ambit_control_csr_signed_total 1"), "{m}");
    assert!(has_sample(&m, "ambit_control_csr_refused_total 4"), "{m}");
    // The two without a known token were refused from their headers alone.
    assert!(
        has_sample(&m, "ambit_control_unauthenticated_requests_total 2"),
        "{m}"
    );
}

/// One change pushed to 100 connected clients; prints how long it took (not asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_update_reaches_a_hundred_clients() {
    let fx = start().await;
    let ch = channel(
        fx.control.local_addr(),
        &fx.control.root_pem().expect("a file-mode CA"),
        "127.0.0.1",
    );
    let mut clients = Vec::new();
    for _ in 0..100 {
        let mut ads = Ads::open(ch.clone()).await;
        ads.initial().await;
        clients.push(ads);
    }
    eventually("100 clients", || {
        fx.control.debug_json()["clients"]
            .as_array()
            .map_or(0, Vec::len)
            == 100
    })
    .await;
    let started = Instant::now();
    std::fs::write(fx.mesh.join("b.yaml"), EXTRA).unwrap();
    let mut waits = Vec::new();
    for mut c in clients {
        waits.push(tokio::spawn(async move {
            let r = c.next().await;
            assert_eq!(names(&r), ["c1//v1/Pod/default/late"]);
            Instant::now()
        }));
    }
    let mut times = Vec::new();
    for w in waits {
        times.push(w.await.unwrap());
    }
    let first = times.iter().min().copied().unwrap();
    let last = times.iter().max().copied().unwrap();
    // From the write, this includes up to one poll interval (100 ms) before the change is seen.
    eprintln!(
        "100 clients updated: first to last {:?}, {:?} after the file was written",
        last - first,
        last - started
    );
}

/// A request over `MAX_REQUEST_BYTES` ends that stream with `OutOfRange` naming the size;
/// the server goes on serving: a second client syncs as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_is_refused_and_others_are_served() {
    let fx = start().await;
    let ch = channel(
        fx.control.local_addr(),
        &fx.control.root_pem().expect("a file-mode CA"),
        "127.0.0.1",
    );

    let big = DeltaDiscoveryRequest {
        node: Some(Node {
            id: "ztunnel~10.0.0.1~zt.istio-system~istio-system.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: ADDRESS_TYPE.into(),
        resource_names_subscribe: (0..52_000)
            .map(|i| format!("c1//v1/Pod/default/{i:0>80}"))
            .collect(),
        ..Default::default()
    };
    let big_len = prost::Message::encoded_len(&big);
    assert!(big_len > 5 * 1024 * 1024, "{big_len}");
    let (tx, rx) = mpsc::channel(1);
    tx.send(big).await.unwrap();
    let mut client = AggregatedDiscoveryServiceClient::new(ch.clone());
    // The status comes with the response headers or as the stream's first item.
    let status = match tokio::time::timeout(
        WAIT,
        client.delta_aggregated_resources(with_token(ReceiverStream::new(rx), NODE1_TOKEN)),
    )
    .await
    .unwrap()
    {
        Err(status) => status,
        Ok(r) => tokio::time::timeout(WAIT, r.into_inner().message())
            .await
            .expect("no answer in time")
            .expect_err("the oversized request was answered"),
    };
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains(&format!("found {big_len} bytes"))
            && status.message().contains(&format!(
                "the limit is: {} bytes",
                ambit_control::config::MAX_REQUEST_BYTES
            )),
        "{status:?}"
    );
    drop(tx);
    eventually("the refused client gone from /debug", || {
        fx.control.debug_json()["clients"]
            .as_array()
            .is_some_and(Vec::is_empty)
    })
    .await;

    // Another client, on the same connection and on a new one, gets the snapshot.
    for ch in [
        ch,
        channel(
            fx.control.local_addr(),
            &fx.control.root_pem().expect("a file-mode CA"),
            "127.0.0.1",
        ),
    ] {
        let mut ads = Ads::open(ch).await;
        let (a, p) = ads.initial().await;
        assert_eq!(
            names(&a),
            ["c1//v1/Pod/default/client", "c1//v1/Pod/default/server"]
        );
        assert_eq!(names(&p), ["default/deny-all"]);
    }
    fx.control.shutdown().await;
}

/// The Prometheus text has exactly this sample line (so `_total 2` is not met by 20).
fn has_sample(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

// ----- the waypoints' policies ------------------------------------------------------------

/// ambit's xDS client over the TLS channel, with a token, as a waypoint runs it.
struct TokenTransport {
    channel: Channel,
    token: &'static str,
}

impl ambit_xds::XdsTransport for TokenTransport {
    fn channel(&self) -> Result<Channel, String> {
        Ok(self.channel.clone())
    }
    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, String> {
        Ok(with_token(message, self.token))
    }
}

const POLICIES: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews, namespace: default}
spec:
  targetRefs: [{kind: Service, name: reviews}]
  action: DENY
  rules: [{to: [{operation: {paths: [/admin]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ztunnel-only, namespace: default}
spec:
  selector: {matchLabels: {app: reviews}}
"#;

/// What a waypoint holds from xDS: addresses and its policies, each batch applied to its
/// type's store.
#[derive(Default)]
struct Held {
    state: ambit_state::ProxyState,
    policies: ambit_waypoint_xds::DocumentStore<ambit_manifests::WaypointPolicy>,
    ready: bool,
}

type Shared = Arc<std::sync::Mutex<Held>>;

/// A waypoint's xDS client (addresses and the waypoints' policies), running until dropped.
fn waypoint_client(fx: &Fixture) -> (Shared, tokio::task::JoinHandle<()>) {
    use ambit_waypoint_xds::WaypointPolicies;
    use ambit_xds::{Addresses, DeltaClient, Limits, NodeConfig, XdsClient};
    let held: Shared = Arc::default();
    let delta = DeltaClient::subscribing(NodeConfig::default().to_node(), Limits::default())
        .subscribe(Addresses::default())
        .subscribe(WaypointPolicies::default());
    let transport = TokenTransport {
        channel: channel(
            fx.control.local_addr(),
            &fx.control.root_pem().expect("a file-mode CA"),
            "127.0.0.1",
        ),
        token: NODE1_TOKEN,
    };
    let (on_ready, sink) = (held.clone(), held.clone());
    let client = XdsClient::new(transport, delta).on_ready(move || {
        on_ready.lock().unwrap().ready = true;
    });
    let task = tokio::spawn(client.run(move |batch| {
        let mut h = sink.lock().unwrap();
        let Held {
            state, policies, ..
        } = &mut *h;
        if let Err(other) = batch.try_apply(policies) {
            other.apply(state);
        }
    }));
    (held, task)
}

/// The paths the DENY policy `default/reviews` a waypoint holds matches.
fn reviews_paths(held: &Shared) -> Option<Vec<String>> {
    let h = held.lock().unwrap();
    let p = h.policies.get("AuthorizationPolicy/default/reviews")?;
    let l7 = p.authorization.rules[0][0][0].l7.as_deref()?;
    Some(l7.paths.as_ref()?.iter().map(|p| p.to_text()).collect())
}

/// A waypoint's client gets the policies of the mesh directory's manifests beside the
/// addresses and is ready; a change reaches it; a bad document is refused with its file,
/// line and field while the last good version keeps being served (to it and to a new
/// waypoint); a ztunnel, subscribed to its two types, is never sent the waypoints' type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waypoints_get_their_policies_and_ztunnels_never_do() {
    let fx = start().await;
    std::fs::write(fx.mesh.join("policies.yaml"), POLICIES).unwrap();
    eventually("the manifests served", || {
        fx.control.debug_json()["mesh"]["resources"][WAYPOINT_POLICY_TYPE] == 1
    })
    .await;
    assert!(fx.control.debug_json()["mesh"]["skipped"][0]
        .as_str()
        .unwrap()
        .contains(
            "policies.yaml:9: security.istio.io/v1 AuthorizationPolicy default/ztunnel-only"
        ));

    let root = fx.control.root_pem().expect("a file-mode CA");
    let mut ztunnel = Ads::open(channel(fx.control.local_addr(), &root, "127.0.0.1")).await;
    ztunnel.initial().await;
    let (waypoint, task) = waypoint_client(&fx);
    eventually("the waypoint ready with its policy", || {
        waypoint.lock().unwrap().ready && reviews_paths(&waypoint).is_some()
    })
    .await;
    {
        let h = waypoint.lock().unwrap();
        assert_eq!(h.policies.len(), 1);
        let p = h
            .policies
            .get("AuthorizationPolicy/default/reviews")
            .unwrap();
        assert_eq!(p.action, ambit_manifests::WaypointAction::Deny);
        assert!(h
            .state
            .workload_by_uid("c1//v1/Pod/default/client")
            .is_some());
    }
    assert_eq!(reviews_paths(&waypoint).unwrap(), ["/admin"]);

    // An update changes the policy the waypoint holds.
    std::fs::write(
        fx.mesh.join("policies.yaml"),
        POLICIES.replace("paths: [/admin]", "paths: [/admin, /debug]"),
    )
    .unwrap();
    eventually("the update at the waypoint", || {
        reviews_paths(&waypoint).is_some_and(|p| p == ["/admin", "/debug"])
    })
    .await;

    // A bad version of it: refused with file, line and field; the last good one stays.
    let generation = fx.control.mesh_generation();
    std::fs::write(
        fx.mesh.join("policies.yaml"),
        POLICIES.replace("paths: [/admin]", "methods: [get]"),
    )
    .unwrap();
    eventually("the bad document reported", || {
        fx.control.mesh_error().is_some()
    })
    .await;
    let err = fx.control.mesh_error().unwrap();
    assert!(
        err.contains("policies.yaml:7:40: spec.rules[0].to[0].operation.methods[0]: method \"get\" is not upper case"),
        "{err}"
    );
    assert_eq!(fx.control.mesh_generation(), generation);
    assert_eq!(reviews_paths(&waypoint).unwrap(), ["/admin", "/debug"]);
    // A new waypoint gets the last good version too.
    let (late, late_task) = waypoint_client(&fx);
    eventually("the late waypoint ready", || late.lock().unwrap().ready).await;
    assert_eq!(reviews_paths(&late).unwrap(), ["/admin", "/debug"]);
    late_task.abort();

    // The policy is removed: the waypoint hears of it.
    std::fs::remove_file(fx.mesh.join("policies.yaml")).unwrap();
    eventually("the removal at the waypoint", || {
        waypoint.lock().unwrap().policies.is_empty()
    })
    .await;
    assert!(fx.control.mesh_error().is_none());

    // The ztunnel was sent nothing of all that: its next response is the address change
    // made now (responses on a stream come in order).
    std::fs::write(fx.mesh.join("b.yaml"), EXTRA).unwrap();
    let r = ztunnel.next().await;
    assert_eq!(r.type_url, ADDRESS_TYPE);
    assert_eq!(names(&r), ["c1//v1/Pod/default/late"]);
    let d = fx.control.debug_json();
    let ztunnel_types = d["clients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["types"].get(WAYPOINT_POLICY_TYPE).is_none())
        .expect("the ztunnel's session")["types"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(ztunnel_types, [AUTHORIZATION_TYPE, ADDRESS_TYPE]);
    task.abort();
    fx.control.shutdown().await;
}

/// A waypoint that NACKs the type: recorded per nonce with its message and counted, the
/// rejected version not sent again until it changes, as for ztunnel's types; an unknown
/// token is refused before anything of the type is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_of_the_waypoints_type_is_recorded_and_tokens_are_checked() {
    let fx = start().await;
    std::fs::write(fx.mesh.join("policies.yaml"), POLICIES).unwrap();
    eventually("the manifests served", || {
        fx.control.debug_json()["mesh"]["resources"][WAYPOINT_POLICY_TYPE] == 1
    })
    .await;
    let ch = channel(
        fx.control.local_addr(),
        &fx.control.root_pem().expect("a file-mode CA"),
        "127.0.0.1",
    );
    let subscribe = DeltaDiscoveryRequest {
        node: Some(Node {
            id: "waypoint~10.0.0.9~waypoint.default~default.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: WAYPOINT_POLICY_TYPE.into(),
        ..Default::default()
    };

    // Without a known token: UNAUTHENTICATED, nothing sent.
    let (tx, rx) = mpsc::channel(1);
    tx.send(subscribe.clone()).await.unwrap();
    let status = AggregatedDiscoveryServiceClient::new(ch.clone())
        .delta_aggregated_resources(with_token(ReceiverStream::new(rx), "nope"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    let (tx, rx) = mpsc::channel(16);
    tx.send(subscribe).await.unwrap();
    let mut stream = AggregatedDiscoveryServiceClient::new(ch)
        .delta_aggregated_resources(with_token(ReceiverStream::new(rx), NODE1_TOKEN))
        .await
        .unwrap()
        .into_inner();
    let r = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.type_url, WAYPOINT_POLICY_TYPE);
    assert_eq!(names(&r), ["AuthorizationPolicy/default/reviews"]);
    tx.send(DeltaDiscoveryRequest {
        type_url: WAYPOINT_POLICY_TYPE.into(),
        response_nonce: r.nonce.clone(),
        error_detail: Some(ambit_proto::Status {
            code: 0,
            message: "default/reviews: no".into(),
            details: vec![],
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    eventually("the NACK in /debug", || {
        fx.control.debug_json()["clients"][0]["types"][WAYPOINT_POLICY_TYPE]["ack"]["state"]
            == "nacked"
    })
    .await;
    let d = fx.control.debug_json();
    let t = &d["clients"][0]["types"][WAYPOINT_POLICY_TYPE];
    assert_eq!(t["nacks"][0]["message"], "default/reviews: no");
    assert_eq!(t["ack"]["nonce"], r.nonce.as_str());
    assert!(has_sample(
        &fx.control.metrics_text(),
        "ambit_control_xds_nacks_total 1"
    ));
    // A change of the policy is sent; the rejected version was not sent again before it.
    std::fs::write(
        fx.mesh.join("policies.yaml"),
        POLICIES.replace("paths: [/admin]", "paths: [/admin, /debug]"),
    )
    .unwrap();
    let r2 = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(names(&r2), ["AuthorizationPolicy/default/reviews"]);
    assert_ne!(r2.resources[0].version, r.resources[0].version);
    fx.control.shutdown().await;
}

// ----- the waypoints' routes ---------------------------------------------------------------

const ROUTES: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: reviews, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /v2}}]
    backendRefs: [{name: reviews-v2, port: 9080}]
"#;

/// A waypoint's xDS client of addresses and routes, holding the routes by name.
/// The routes a waypoint's client holds, and whether it is ready.
type HeldRoutes = Arc<
    std::sync::Mutex<(
        ambit_waypoint_xds::DocumentStore<ambit_gateway_routes::Route>,
        bool,
    )>,
>;

fn route_client(fx: &Fixture) -> (HeldRoutes, tokio::task::JoinHandle<()>) {
    use ambit_waypoint_xds::WaypointRoutes;
    use ambit_xds::{Addresses, DeltaClient, Limits, NodeConfig, XdsClient};
    let held: Arc<
        std::sync::Mutex<(
            ambit_waypoint_xds::DocumentStore<ambit_gateway_routes::Route>,
            bool,
        )>,
    > = Arc::default();
    let delta = DeltaClient::subscribing(NodeConfig::default().to_node(), Limits::default())
        .subscribe(Addresses::default())
        .subscribe(WaypointRoutes::default());
    let transport = TokenTransport {
        channel: channel(
            fx.control.local_addr(),
            &fx.control.root_pem().expect("a file-mode CA"),
            "127.0.0.1",
        ),
        token: NODE1_TOKEN,
    };
    let (on_ready, sink) = (held.clone(), held.clone());
    let client = XdsClient::new(transport, delta).on_ready(move || {
        on_ready.lock().unwrap().1 = true;
    });
    let task = tokio::spawn(client.run(move |batch| {
        let mut state = ambit_state::ProxyState::new();
        if let Err(other) = batch.try_apply(&mut sink.lock().unwrap().0) {
            other.apply(&mut state);
        }
    }));
    (held, task)
}

/// The path prefixes of the routes a waypoint holds, by route.
fn held_prefixes(held: &HeldRoutes) -> Vec<String> {
    held.lock()
        .unwrap()
        .0
        .to_vec()
        .iter()
        .flat_map(|r| {
            r.rules.iter().flat_map(move |rule| {
                rule.matches
                    .iter()
                    .map(move |m| format!("{} {:?}", r.key(), m.path))
            })
        })
        .collect()
}

/// Routes in the mesh directory reach a waypoint as the documents were written and read
/// the same there; a change reaches it; a route document the reader refuses keeps the
/// mesh at its last good version; a removal reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waypoints_get_their_routes() {
    let fx = start().await;
    let (waypoint, task) = route_client(&fx);
    eventually("the waypoint ready without routes", || {
        waypoint.lock().unwrap().1
    })
    .await;
    assert!(held_prefixes(&waypoint).is_empty());

    std::fs::write(fx.mesh.join("routes.yaml"), ROUTES).unwrap();
    eventually("the route at the waypoint", || {
        held_prefixes(&waypoint) == ["default/reviews Prefix(\"/v2\")"]
    })
    .await;
    let served = &fx.control.debug_json()["mesh"]["resources"][ambit_proto::WAYPOINT_ROUTE_TYPE];
    assert_eq!(*served, 1);

    std::fs::write(
        fx.mesh.join("routes.yaml"),
        ROUTES.replace("value: /v2", "value: /v3"),
    )
    .unwrap();
    eventually("the change at the waypoint", || {
        held_prefixes(&waypoint) == ["default/reviews Prefix(\"/v3\")"]
    })
    .await;

    // Refused by the reader: the mesh stays at its last good version.
    let generation = fx.control.mesh_generation();
    std::fs::write(
        fx.mesh.join("routes.yaml"),
        ROUTES.replace("port: 9080", "port: 0"),
    )
    .unwrap();
    eventually("the refusal reported", || fx.control.mesh_error().is_some()).await;
    let err = fx.control.mesh_error().unwrap();
    assert!(
        err.contains("routes.yaml:8:") && err.contains("backendRefs[0].port"),
        "{err}"
    );
    assert_eq!(fx.control.mesh_generation(), generation);
    assert_eq!(
        held_prefixes(&waypoint),
        ["default/reviews Prefix(\"/v3\")"]
    );

    std::fs::remove_file(fx.mesh.join("routes.yaml")).unwrap();
    eventually("the removal at the waypoint", || {
        held_prefixes(&waypoint).is_empty()
    })
    .await;
    task.abort();
    fx.control.shutdown().await;
}
