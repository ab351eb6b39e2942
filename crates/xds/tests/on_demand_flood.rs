//! Bad input at an on-demand client: a hand-written delta ADS server (plain h2c on
//! 127.0.0.1) answers every Address request with far more workloads than were asked for.
//! The client keeps what it asked for and at most its bound of dependents, ignores and
//! counts the rest, ACKs (the stream stays up, one stream in all), and still answers its
//! askers.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use ambit_proto::istio::workload as pw;
use ambit_proto::{
    address_resource, DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource, ADDRESS_TYPE,
};
use ambit_state::ProxyState;
use ambit_xds::on_demand::BookLimits;
use ambit_xds::{DeltaClient, NodeConfig, OnDemand, OnDemandConfig, PlainTransport, XdsClient};
use futures_util::Stream;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Unasked workloads sent with every Address response.
const FLOOD: u32 = 5_000;
const PER_NAME: usize = 10;
const MAX_DEPENDENTS: usize = 15;

/// Answers every Address request (initial or named) with the names asked, as workloads
/// carrying the asked name as an alias, plus [`FLOOD`] workloads nobody asked for;
/// reports every request and every stream opened.
struct Flooder {
    streams: mpsc::UnboundedSender<()>,
    requests: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Flooder {
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
        let _ = self.streams.send(());
        let seen = self.requests.clone();
        let mut incoming = req.into_inner();
        let (tx, rx) = mpsc::unbounded_channel::<Result<DeltaDiscoveryResponse, Status>>();
        tokio::spawn(async move {
            let mut nonce = 0u32;
            let mut round = 0u32;
            while let Ok(Some(m)) = incoming.message().await {
                let asked: Vec<String> = m
                    .resource_names_subscribe
                    .iter()
                    .filter(|n| *n != "*")
                    .cloned()
                    .collect();
                let answer = m.response_nonce.is_empty() || !asked.is_empty();
                let type_url = m.type_url.clone();
                let _ = seen.send(m);
                if !answer {
                    continue;
                }
                nonce += 1;
                let mut resources = Vec::new();
                if type_url == ADDRESS_TYPE {
                    round += 1;
                    for (i, name) in asked.iter().enumerate() {
                        resources.push(workload(
                            &format!("asked-{round}-{i}"),
                            name,
                            [10, 2, round as u8, i as u8],
                        ));
                    }
                    for i in 0..FLOOD {
                        let ip = [10, 1 + round as u8, (i / 256) as u8, (i % 256) as u8];
                        resources.push(workload(&format!("flood-{round}-{i}"), "", ip));
                    }
                }
                let _ = tx.send(Ok(DeltaDiscoveryResponse {
                    type_url,
                    nonce: nonce.to_string(),
                    resources,
                    ..Default::default()
                }));
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

/// A workload named `c//v1/Pod/ns/<name>` at `ip`, with `alias` (the name asked) unless empty.
fn workload(name: &str, alias: &str, ip: [u8; 4]) -> Resource {
    let uid = format!("c//v1/Pod/ns/{name}");
    let w = pw::Workload {
        uid: uid.clone(),
        name: name.into(),
        namespace: "ns".into(),
        addresses: vec![ip.to_vec().into()],
        tunnel_protocol: pw::TunnelProtocol::Hbone as i32,
        ..Default::default()
    };
    let mut r = address_resource(&uid, "1", pw::address::Type::Workload(w));
    if !alias.is_empty() {
        r.aliases = vec![alias.to_string()];
    }
    r
}

async fn serve(ads: Flooder) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(ads))
            .serve_with_incoming(futures_util::stream::unfold(listener, |l| async move {
                let conn = l.accept().await.map(|(s, _)| s);
                Some((conn, l))
            })),
    );
    addr
}

const WAIT: Duration = Duration::from_secs(20);

async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("timed out")
        .expect("closed")
}

/// The next ACK or NACK of the Address type.
async fn address_reply(
    rx: &mut mpsc::UnboundedReceiver<DeltaDiscoveryRequest>,
) -> DeltaDiscoveryRequest {
    loop {
        let r = next(rx).await;
        if r.type_url == ADDRESS_TYPE && !r.response_nonce.is_empty() {
            return r;
        }
    }
}

fn held(state: &Mutex<ProxyState>) -> (usize, usize) {
    let s = state.lock().unwrap();
    let asked = s
        .workloads()
        .filter(|w| w.name.starts_with("asked-"))
        .count();
    let flood = s
        .workloads()
        .filter(|w| w.name.starts_with("flood-"))
        .count();
    (asked, flood)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unasked_resources_is_bounded_counted_and_the_stream_stays_up() {
    let (streams_tx, mut streams) = mpsc::unbounded_channel();
    let (requests_tx, mut requests) = mpsc::unbounded_channel();
    let addr = serve(Flooder {
        streams: streams_tx,
        requests: requests_tx,
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let od = OnDemand::new(OnDemandConfig {
        timeout: WAIT,
        idle: Duration::from_secs(3600),
        limits: BookLimits {
            dependents_per_name: PER_NAME,
            max_dependents: MAX_DEPENDENTS,
            ..BookLimits::default()
        },
    });
    let node = NodeConfig {
        pod_name: "z".into(),
        pod_namespace: "istio-system".into(),
        ..Default::default()
    };
    let state = Arc::new(Mutex::new(ProxyState::new()));
    let sink = state.clone();
    tokio::spawn(
        XdsClient::new(PlainTransport(channel), DeltaClient::new(node.to_node()))
            .with_on_demand(od.clone())
            .run(move |b| b.apply(&mut sink.lock().unwrap())),
    );
    next(&mut streams).await;

    // The initial answer floods before anything was asked: nothing is kept, all counted.
    let ack = address_reply(&mut requests).await;
    assert!(ack.error_detail.is_none(), "not NACKed: {ack:?}");
    assert_eq!(held(&state), (0, 0));
    assert_eq!(od.status().ignored_total, u64::from(FLOOD));

    // Asked by name: answered, the asked workload kept, dependents within the bound.
    tokio::time::timeout(WAIT, od.fetch("/10.0.0.1"))
        .await
        .unwrap()
        .expect("answered despite the flood");
    let ack = address_reply(&mut requests).await;
    assert!(ack.error_detail.is_none(), "not NACKed: {ack:?}");
    assert_eq!(held(&state), (1, PER_NAME));
    let s = od.status();
    assert_eq!((s.answered, s.dependents), (1, PER_NAME));
    assert_eq!(
        s.ignored_total,
        2 * u64::from(FLOOD) - PER_NAME as u64,
        "{s:?}"
    );

    // A second name: the total bound of dependents holds whatever is asked.
    tokio::time::timeout(WAIT, od.fetch("/10.0.0.2"))
        .await
        .unwrap()
        .expect("answered despite the flood");
    let ack = address_reply(&mut requests).await;
    assert!(ack.error_detail.is_none(), "not NACKed: {ack:?}");
    assert_eq!(held(&state), (2, MAX_DEPENDENTS));
    let s = od.status();
    assert_eq!((s.answered, s.dependents), (2, MAX_DEPENDENTS));
    assert_eq!(
        s.ignored_total,
        3 * u64::from(FLOOD) - MAX_DEPENDENTS as u64,
        "{s:?}"
    );

    // Still the first stream: nothing was reset or reconnected.
    assert!(
        streams.try_recv().is_err(),
        "the client opened another stream"
    );
}
