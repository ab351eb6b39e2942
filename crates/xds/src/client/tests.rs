use super::*;
use std::pin::Pin;
use std::sync::Mutex;

use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use ambit_proto::istio::{security as psec, workload as pw};
use ambit_proto::{DeltaDiscoveryResponse, Resource, ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambit_state::ProxyState;
use prost::Message;
use tonic::codegen::tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::delta::NodeConfig;

type RespStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

/// One stream as the test server sees it.
struct Conn {
    requests: mpsc::UnboundedReceiver<DeltaDiscoveryRequest>,
    responses: mpsc::UnboundedSender<Result<DeltaDiscoveryResponse, Status>>,
}

struct TestAds {
    conns: mpsc::UnboundedSender<Conn>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for TestAds {
    type StreamAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
    type DeltaAggregatedResourcesStream = RespStream;

    async fn stream_aggregated_resources(
        &self,
        _: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("sotw"))
    }

    async fn delta_aggregated_resources(
        &self,
        req: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<RespStream>, Status> {
        let mut incoming = req.into_inner();
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(m)) = incoming.message().await {
                if req_tx.send(m).is_err() {
                    break;
                }
            }
        });
        let (resp_tx, resp_rx) = mpsc::unbounded_channel();
        let _ = self.conns.send(Conn {
            requests: req_rx,
            responses: resp_tx,
        });
        let out = futures_util::stream::unfold(resp_rx, |mut rx| async move {
            rx.recv().await.map(|m| (m, rx))
        });
        Ok(Response::new(Box::pin(out)))
    }
}

const GUARD: Duration = Duration::from_secs(20);

async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(GUARD, rx.recv())
        .await
        .expect("timed out waiting")
        .expect("channel closed")
}

fn workload_resource(uid: &str) -> Resource {
    workload_at(uid, [10, 0, 0, 1])
}

fn workload_at(uid: &str, ip: [u8; 4]) -> Resource {
    let w = pw::Workload {
        uid: uid.into(),
        name: "a".into(),
        namespace: "ns1".into(),
        addresses: vec![ip.to_vec().into()],
        ..Default::default()
    };
    ambit_proto::address_resource(uid, "v1", pw::address::Type::Workload(w))
}

#[tokio::test]
async fn stream_acks_applies_gets_ready_and_resends_versions() {
    let (channel, mut conns) = serve().await;
    let node = NodeConfig {
        pod_name: "z".into(),
        pod_namespace: "istio-system".into(),
        ..Default::default()
    }
    .to_node();
    let mut registry = Registry::default();
    let metrics = XdsMetrics::register(&mut registry);
    let state = Arc::new(Mutex::new(ProxyState::new()));
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
    let client = XdsClient::new(PlainTransport(channel), DeltaClient::new(node))
        .with_metrics(metrics)
        .on_ready(move || {
            let _ = ready_tx.send(());
        });
    let sink_state = state.clone();
    tokio::spawn(client.run(move |batch| batch.apply(&mut sink_state.lock().unwrap())));

    let mut c1 = next(&mut conns).await;
    let r1 = next(&mut c1.requests).await;
    let r2 = next(&mut c1.requests).await;
    assert_eq!(r1.type_url, ADDRESS_TYPE);
    assert_eq!(r2.type_url, AUTHORIZATION_TYPE);
    assert_eq!(
        r1.node.as_ref().unwrap().id,
        "ztunnel~1.1.1.1~z.istio-system~istio-system.svc.cluster.local"
    );
    assert!(r1.initial_resource_versions.is_empty());

    const W1: &str = "Kubernetes//v1/Pod/ns1/a";
    c1.responses
        .send(Ok(DeltaDiscoveryResponse {
            type_url: ADDRESS_TYPE.into(),
            nonce: "a1".into(),
            resources: vec![workload_resource(W1)],
            ..Default::default()
        }))
        .unwrap();
    let ack = next(&mut c1.requests).await;
    assert_eq!(ack.type_url, ADDRESS_TYPE);
    assert_eq!(ack.response_nonce, "a1");
    assert!(ack.error_detail.is_none());
    assert!(ready_rx.try_recv().is_err(), "not ready with one type");
    assert!(state.lock().unwrap().workload_by_uid(W1).is_some());

    let bad_policy = Resource {
        name: "ns1/bad".into(),
        version: "1".into(),
        resource: Some(prost_types::Any {
            type_url: AUTHORIZATION_TYPE.into(),
            value: psec::Authorization {
                name: "".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        }),
        ..Default::default()
    };
    c1.responses
        .send(Ok(DeltaDiscoveryResponse {
            type_url: AUTHORIZATION_TYPE.into(),
            nonce: "p1".into(),
            resources: vec![bad_policy],
            ..Default::default()
        }))
        .unwrap();
    let nack = next(&mut c1.requests).await;
    assert_eq!(nack.response_nonce, "p1");
    assert_eq!(
        nack.error_detail.unwrap().message,
        "ns1/bad: name: must be non-empty and contain no '/'"
    );
    next(&mut ready_rx).await;

    // A clean end: the client comes back with what it accepted.
    drop(c1);
    let mut c2 = next(&mut conns).await;
    let r1 = next(&mut c2.requests).await;
    let r2 = next(&mut c2.requests).await;
    assert_eq!(r1.initial_resource_versions.len(), 1);
    assert_eq!(r1.initial_resource_versions[W1], "v1");
    assert!(
        r2.initial_resource_versions.is_empty(),
        "the rejected one is asked for again"
    );

    // A benign error, then another stream; readiness fired once only.
    c2.responses
        .send(Err(Status::unavailable("transport is closing")))
        .unwrap();
    let mut c3 = next(&mut conns).await;
    let _ = next(&mut c3.requests).await;
    assert!(ready_rx.try_recv().is_err());

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for want in [
        "istio_xds_connection_terminations_total{reason=\"Complete\"} 1",
        "istio_xds_connection_terminations_total{reason=\"Reconnect\"} 1",
        "istio_xds_message_total{url=\"type.googleapis.com/istio.workload.Address\"} 1",
        "istio_xds_message_total{url=\"type.googleapis.com/istio.security.Authorization\"} 1",
    ] {
        assert!(text.contains(want), "{want} missing from\n{text}");
    }
}

/// The driver serves whatever types its client subscribes to: here Address and a type of
/// the tests' own, each into its own store. Every stream starts with one request per
/// type, with that type's accepted versions once it reconnects; readiness waits for both.
#[tokio::test]
async fn stream_of_a_third_type_into_its_own_store() {
    use crate::resource::{Readiness, ResourceType};
    use crate::test_type::{widget, WidgetStore, Widgets, WIDGET_TYPE};
    use crate::{Addresses, Limits};

    let (channel, mut conns) = serve().await;
    let node = NodeConfig::default().to_node();
    let delta = DeltaClient::subscribing(node, Limits::default())
        .subscribe(Addresses::default())
        .subscribe(Widgets {
            budget: 1 << 20,
            max_parts: 4,
            readiness: Readiness::FirstResponse,
        });
    let state = Arc::new(Mutex::new(ProxyState::new()));
    let widgets = Arc::new(Mutex::new(WidgetStore::new()));
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
    let client = XdsClient::new(PlainTransport(channel), delta).on_ready(move || {
        let _ = ready_tx.send(());
    });
    let (sink_state, sink_widgets) = (state.clone(), widgets.clone());
    tokio::spawn(client.run(move |batch| match batch.downcast::<Widgets>() {
        Ok(b) => b.apply(&mut sink_widgets.lock().unwrap()),
        Err(batch) => batch.apply(&mut sink_state.lock().unwrap()),
    }));

    let mut c1 = next(&mut conns).await;
    let r1 = next(&mut c1.requests).await;
    let r2 = next(&mut c1.requests).await;
    assert_eq!(
        (r1.type_url.as_str(), r2.type_url.as_str()),
        (ADDRESS_TYPE, WIDGET_TYPE)
    );
    assert!(r2.initial_resource_versions.is_empty());

    const W1: &str = "Kubernetes//v1/Pod/ns1/a";
    c1.responses
        .send(Ok(DeltaDiscoveryResponse {
            type_url: ADDRESS_TYPE.into(),
            nonce: "a1".into(),
            resources: vec![workload_resource(W1)],
            ..Default::default()
        }))
        .unwrap();
    assert_eq!(next(&mut c1.requests).await.response_nonce, "a1");
    assert!(ready_rx.try_recv().is_err(), "the widgets are awaited too");

    let w = |name: &str, parts: &[&str]| Resource {
        name: name.into(),
        version: "7".into(),
        resource: Some(prost_types::Any {
            type_url: Widgets::TYPE_URL.into(),
            value: widget(name, parts).encode_to_vec(),
        }),
        ..Default::default()
    };
    c1.responses
        .send(Ok(DeltaDiscoveryResponse {
            type_url: WIDGET_TYPE.into(),
            nonce: "w1".into(),
            resources: vec![w("w1", &["a", "b"]), w("w2", &[""])],
            ..Default::default()
        }))
        .unwrap();
    let nack = next(&mut c1.requests).await;
    assert_eq!(nack.type_url, WIDGET_TYPE);
    assert_eq!(nack.response_nonce, "w1");
    assert_eq!(
        nack.error_detail.unwrap().message,
        "w2: parts[0]: must be non-empty"
    );
    next(&mut ready_rx).await;
    assert_eq!(
        *widgets.lock().unwrap(),
        [("w1".to_string(), vec!["a".to_string(), "b".to_string()])].into()
    );
    assert!(state.lock().unwrap().workload_by_uid(W1).is_some());

    // A new stream: each type asked for again with what it accepted.
    drop(c1);
    let mut c2 = next(&mut conns).await;
    let r1 = next(&mut c2.requests).await;
    let r2 = next(&mut c2.requests).await;
    assert_eq!(r1.type_url, ADDRESS_TYPE);
    assert_eq!(
        r1.initial_resource_versions,
        [(W1.to_string(), "v1".to_string())].into()
    );
    assert_eq!(r2.type_url, WIDGET_TYPE);
    assert_eq!(
        r2.initial_resource_versions,
        [("w1".to_string(), "7".to_string())].into()
    );
}

/// The test ADS server on 127.0.0.1 and a lazy channel to it.
async fn serve() -> (tonic::transport::Channel, mpsc::UnboundedReceiver<Conn>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming =
        tonic::transport::server::TcpIncoming::from_listener(listener, true, None).unwrap();
    let (conns_tx, conns) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(TestAds {
                conns: conns_tx,
            }))
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    (channel, conns)
}

/// A response over the configured bound is refused whole: nothing applied, counted or
/// answered; the stream ends with an error naming the size; the client reconnects with
/// what it had and applies the next normal response.
#[tokio::test]
async fn an_oversized_response_ends_the_stream_and_changes_nothing() {
    const LIMIT: usize = 64 * 1024;
    let (channel, mut conns) = serve().await;
    let node = NodeConfig {
        pod_name: "z".into(),
        pod_namespace: "istio-system".into(),
        ..Default::default()
    }
    .to_node();
    let mut registry = Registry::default();
    let metrics = XdsMetrics::register(&mut registry);
    let state = Arc::new(Mutex::new(ProxyState::new()));
    let (ends_tx, mut ends) = mpsc::unbounded_channel();
    let client = XdsClient::new(PlainTransport(channel), DeltaClient::new(node))
        .with_max_message_bytes(LIMIT)
        .with_metrics(metrics)
        .on_stream_end(move |end| {
            let _ = ends_tx.send(end.clone());
        });
    let sink_state = state.clone();
    tokio::spawn(client.run(move |batch| batch.apply(&mut sink_state.lock().unwrap())));

    let mut c1 = next(&mut conns).await;
    next(&mut c1.requests).await;
    next(&mut c1.requests).await;
    const W1: &str = "Kubernetes//v1/Pod/ns1/a";
    c1.responses
        .send(Ok(DeltaDiscoveryResponse {
            type_url: ADDRESS_TYPE.into(),
            nonce: "a1".into(),
            resources: vec![workload_resource(W1)],
            ..Default::default()
        }))
        .unwrap();
    assert_eq!(next(&mut c1.requests).await.response_nonce, "a1");

    let big_uid = |i: u32| format!("Kubernetes//v1/Pod/ns1/big-{i}");
    let big = DeltaDiscoveryResponse {
        type_url: ADDRESS_TYPE.into(),
        nonce: "big".into(),
        resources: (0..2000u32)
            .map(|i| workload_at(&big_uid(i), [10, 1, (i >> 8) as u8, i as u8]))
            .collect(),
        ..Default::default()
    };
    let big_len = big.encoded_len();
    assert!(big_len > LIMIT, "{big_len}");
    c1.responses.send(Ok(big)).unwrap();

    let end = next(&mut ends).await;
    let StreamEnd::Error(status) = &end else {
        panic!("expected an error end, got {end:?}");
    };
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains("too large")
            && status.message().contains(&format!("found {big_len} bytes"))
            && status
                .message()
                .contains(&format!("the limit is: {LIMIT} bytes")),
        "{status:?}"
    );
    // The first stream got no ACK or NACK for it (its requests end with the stream).
    while let Some(r) = tokio::time::timeout(GUARD, c1.requests.recv())
        .await
        .expect("the first stream did not end")
    {
        assert_ne!(r.response_nonce, "big", "{r:?}");
    }

    // The reconnect asks with the versions it had before: none of the oversized ones.
    let mut c2 = next(&mut conns).await;
    let r1 = next(&mut c2.requests).await;
    next(&mut c2.requests).await;
    assert_eq!(r1.type_url, ADDRESS_TYPE);
    assert_eq!(
        r1.initial_resource_versions,
        [(W1.to_string(), "v1".to_string())].into()
    );
    {
        let s = state.lock().unwrap();
        assert_eq!(
            s.workloads().map(|w| w.uid.to_string()).collect::<Vec<_>>(),
            [W1]
        );
    }

    // A normal response on the new stream is applied and ACKed.
    const W2: &str = "Kubernetes//v1/Pod/ns1/b";
    c2.responses
        .send(Ok(DeltaDiscoveryResponse {
            type_url: ADDRESS_TYPE.into(),
            nonce: "a2".into(),
            resources: vec![workload_at(W2, [10, 0, 0, 2])],
            ..Default::default()
        }))
        .unwrap();
    let ack = next(&mut c2.requests).await;
    assert_eq!(ack.response_nonce, "a2");
    assert!(ack.error_detail.is_none());
    assert!(state.lock().unwrap().workload_by_uid(W2).is_some());
    assert!(state.lock().unwrap().workload_by_uid(&big_uid(0)).is_none());

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for want in [
        "istio_xds_connection_terminations_total{reason=\"Error\"} 1",
        // a1 and a2; the oversized one was never decoded.
        "istio_xds_message_total{url=\"type.googleapis.com/istio.workload.Address\"} 2",
    ] {
        assert!(text.contains(want), "{want} missing from\n{text}");
    }
}

#[test]
fn status_classification() {
    use tonic::Code;
    let benign = [
        Status::new(Code::Unknown, "x"),
        Status::new(Code::Cancelled, "x"),
        Status::new(Code::DeadlineExceeded, "x"),
        Status::new(Code::Unavailable, "foo: transport is closing"),
        Status::new(Code::Unavailable, "received prior goaway: code: NO_ERROR"),
    ];
    for s in benign {
        assert!(
            matches!(StreamEnd::from_status(s.clone()), StreamEnd::Reconnect(_)),
            "{s:?}"
        );
    }
    let bad = [
        Status::new(Code::Unavailable, "connection refused"),
        Status::new(Code::PermissionDenied, "x"),
        Status::new(Code::Unauthenticated, "x"),
        Status::new(Code::Internal, "x"),
    ];
    for s in bad {
        assert!(
            matches!(StreamEnd::from_status(s.clone()), StreamEnd::Error(_)),
            "{s:?}"
        );
    }
}

#[test]
fn backoff_doubles_to_15s_and_resets() {
    let mut b = Backoff::new();
    let err = StreamEnd::ConnectionError("x".into());
    let mut seen = Vec::new();
    for _ in 0..14 {
        seen.push(b.delay(&err));
    }
    assert_eq!(seen[0], Duration::from_millis(10));
    assert_eq!(seen[1], Duration::from_millis(20));
    assert_eq!(seen[2], Duration::from_millis(40));
    assert_eq!(*seen.last().unwrap(), Duration::from_secs(15));
    assert!(seen.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(b.delay(&StreamEnd::Complete), Duration::from_millis(10));
    assert_eq!(
        b.delay(&StreamEnd::Error(Status::internal("x"))),
        Duration::from_millis(10)
    );
    assert_eq!(
        b.delay(&StreamEnd::Error(Status::internal("x"))),
        Duration::from_millis(20)
    );
    assert_eq!(
        b.delay(&StreamEnd::Reconnect(Status::cancelled("x"))),
        Duration::from_millis(10)
    );
}
