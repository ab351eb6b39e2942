//! The xDS client over a real `ambit_grpc::GrpcChannel` (TLS, bearer token, clusterid,
//! extra headers) against an in-process delta ADS server on 127.0.0.1.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_grpc::server::{incoming, test_pki, AcceptOptions, TestPki};
use ambit_grpc::{ChannelConfig, GrpcChannel, RootCa, Token};
use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use ambit_proto::istio::workload as pw;
use ambit_proto::{
    address_resource, DeltaDiscoveryRequest, DeltaDiscoveryResponse, ADDRESS_TYPE,
    AUTHORIZATION_TYPE,
};
use ambit_state::ProxyState;
use ambit_xds::{DeltaClient, NodeConfig, XdsClient};
use futures_util::Stream;
use tokio::net::TcpListener;
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
        vec![address_resource(UID, "1", pw::address::Type::Workload(w))]
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

async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("timed out")
        .expect("closed")
}

#[tokio::test]
async fn tls_stream_with_token_and_cluster_id_gets_ready() {
    let pki = test_pki(&["localhost"]);
    let root_pem = pki.root_pem.clone();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let addr = serve(Ads { seen: seen_tx }, &pki).await;
    let channel = GrpcChannel::new(ChannelConfig {
        server_identity: None,
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
