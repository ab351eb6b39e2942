//! The xDS client over a real `ambit_grpc::GrpcChannel` (TLS, bearer token, clusterid,
//! extra headers) against an in-process delta ADS server on 127.0.0.1.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use ambit_grpc::{ChannelConfig, GrpcChannel, RootCa, Token};
use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use ambit_proto::istio::workload as pw;
use ambit_proto::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource, ADDRESS_TYPE, AUTHORIZATION_TYPE,
};
use ambit_state::ProxyState;
use ambit_xds::{DeltaClient, NodeConfig, XdsClient};
use futures_util::Stream;
use prost::Message;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Answers each stream's initial requests with one workload (Address) and nothing
/// (Authorization), and reports the metadata and every request it saw.
struct Ads {
    seen: mpsc::UnboundedSender<(Vec<String>, mpsc::UnboundedReceiver<DeltaDiscoveryRequest>)>,
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
        let mut meta: Vec<String> = req
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some(format!("{k}={}", v.to_str().unwrap_or("?")))
                }
                _ => None,
            })
            .collect();
        meta.sort();
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        let _ = self.seen.send((meta, req_rx));
        let mut incoming = req.into_inner();
        let (resp_tx, resp_rx) =
            mpsc::unbounded_channel::<Result<DeltaDiscoveryResponse, Status>>();
        tokio::spawn(async move {
            while let Ok(Some(m)) = incoming.message().await {
                let answer = m
                    .response_nonce
                    .is_empty()
                    .then(|| initial_answer(&m.type_url));
                let _ = req_tx.send(m);
                if let Some(a) = answer {
                    let _ = resp_tx.send(Ok(a));
                }
            }
        });
        let out = futures_util::stream::unfold(resp_rx, |mut rx| async move {
            rx.recv().await.map(|m| (m, rx))
        });
        Ok(Response::new(Box::pin(out)))
    }
}

const UID: &str = "Kubernetes//v1/Pod/ns1/a";

fn initial_answer(type_url: &str) -> DeltaDiscoveryResponse {
    let resources = if type_url == ADDRESS_TYPE {
        let w = pw::Workload {
            uid: UID.into(),
            name: "a".into(),
            namespace: "ns1".into(),
            addresses: vec![vec![10, 0, 0, 1].into()],
            tunnel_protocol: pw::TunnelProtocol::Hbone as i32,
            ..Default::default()
        };
        vec![Resource {
            name: UID.into(),
            version: "1".into(),
            resource: Some(prost_types::Any {
                type_url: ADDRESS_TYPE.into(),
                value: pw::Address {
                    r#type: Some(pw::address::Type::Workload(w)),
                }
                .encode_to_vec(),
            }),
            ..Default::default()
        }]
    } else {
        Vec::new()
    };
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: format!("{type_url}-1"),
        resources,
        ..Default::default()
    }
}

struct Tls(tokio_rustls::server::TlsStream<TcpStream>);

impl tonic::transport::server::Connected for Tls {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}
impl AsyncRead for Tls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}
impl AsyncWrite for Tls {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// A test root and a certificate for `localhost` signed by it.
fn pki() -> (String, CertificateDer<'static>, PrivateKeyDer<'static>) {
    let root_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut root = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    root.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    root.distinguished_name
        .push(rcgen::DnType::CommonName, "xds test root");
    let root = root.self_signed(&root_key).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &root, &root_key)
        .unwrap();
    (
        root.pem(),
        leaf.der().clone(),
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
}

async fn serve(ads: Ads, cert: CertificateDer<'static>, key: PrivateKeyDer<'static>) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = futures_util::stream::unfold((listener, acceptor), |(l, a)| async move {
        loop {
            let (tcp, _) = match l.accept().await {
                Ok(x) => x,
                Err(e) => return Some((Err(e), (l, a))),
            };
            if let Ok(tls) = a.accept(tcp).await {
                return Some((Ok::<_, std::io::Error>(Tls(tls)), (l, a)));
            }
        }
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(ads))
            .serve_with_incoming(incoming),
    );
    addr
}

async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("timed out")
        .expect("closed")
}

#[tokio::test]
async fn tls_stream_with_token_and_cluster_id_gets_ready() {
    let (root_pem, cert, key) = pki();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let addr = serve(Ads { seen: seen_tx }, cert, key).await;
    let channel = GrpcChannel::new(ChannelConfig {
        address: format!("localhost:{}", addr.port()),
        root: RootCa::Inline(root_pem),
        alt_hostname: None,
        token: Token::Literal("tok-1".into()),
        cluster_id: "c1".into(),
        headers: vec![("X-Tenant".into(), "t1".into())],
    })
    .unwrap();
    let node = NodeConfig {
        pod_name: "z".into(),
        pod_namespace: "istio-system".into(),
        ..Default::default()
    };
    let state = Arc::new(Mutex::new(ProxyState::new()));
    let (ready_tx, mut ready) = mpsc::unbounded_channel();
    let sink = state.clone();
    tokio::spawn(
        XdsClient::new(channel, DeltaClient::new(node.to_node()))
            .on_ready(move || {
                let _ = ready_tx.send(());
            })
            .run(move |b| b.apply(&mut sink.lock().unwrap())),
    );

    let (meta, mut requests) = next(&mut seen).await;
    for want in ["authorization=Bearer tok-1", "clusterid=c1", "x-tenant=t1"] {
        assert!(meta.iter().any(|m| m == want), "{want} not in {meta:?}");
    }
    let mut acks = Vec::new();
    while acks.len() < 2 {
        let r = next(&mut requests).await;
        if !r.response_nonce.is_empty() {
            assert!(r.error_detail.is_none(), "{r:?}");
            acks.push(r.type_url);
        }
    }
    acks.sort();
    assert_eq!(acks, [AUTHORIZATION_TYPE, ADDRESS_TYPE]);
    next(&mut ready).await;
    let w = state
        .lock()
        .unwrap()
        .workload_by_uid(UID)
        .expect("workload applied");
    assert_eq!(
        w.workload_ips,
        ["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
}
