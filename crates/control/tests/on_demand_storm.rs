//! Bad input at `ambit control`: a name subscription storm from one client (request after
//! request of thousands of names, as an on-demand client gone wrong would send) on
//! loopback over TLS. The per-client cap holds (the server's own high-water mark, kept on
//! every name, reaches the cap and never passes it), the stream ends with
//! INVALID_ARGUMENT naming the cap, the refusal is counted, and a well-behaved on-demand
//! client is served its updates during and after. A storm of small requests costs the
//! server work in proportion to the names asked (counted), not to their square.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambit_control::{Control, ControlConfig};
use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_proto::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, ADDRESS_TYPE};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::ServerName;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Streaming};

/// Guard against hangs only; no timing is asserted.
const WAIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "node1-token";
const TOKENS: &str = "- token: node1-token\n  node: node1\n";

/// The mesh with the server at 10.0.0.3 and `extra_ip` (its updates, for the test).
fn mesh(extra_ip: &str) -> String {
    format!(
        r#"
workloads:
- uid: c1//v1/Pod/default/client
  name: client
  namespace: default
  node: node1
  protocol: HBONE
  workloadIps: ["10.0.0.2"]
- uid: c1//v1/Pod/default/server
  name: server
  namespace: default
  node: node2
  protocol: HBONE
  workloadIps: ["10.0.0.3", "{extra_ip}"]
"#
    )
}

fn channel(addr: SocketAddr, root_pem: &str) -> Channel {
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
    let name = ServerName::try_from("127.0.0.1").unwrap();
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

/// An on-demand client's first request: `*` subscribed and unsubscribed (nothing), with
/// `names` asked for.
fn on_demand_first(names: Vec<String>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(Node {
            id: "ztunnel~10.0.0.1~zt.istio-system~istio-system.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: ADDRESS_TYPE.into(),
        resource_names_subscribe: std::iter::once("*".to_string()).chain(names).collect(),
        resource_names_unsubscribe: vec!["*".into()],
        ..Default::default()
    }
}

async fn open(
    ch: Channel,
    first: DeltaDiscoveryRequest,
) -> (
    mpsc::Sender<DeltaDiscoveryRequest>,
    Streaming<DeltaDiscoveryResponse>,
) {
    let (tx, rx) = mpsc::channel(4);
    tx.send(first).await.unwrap();
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let stream = tokio::time::timeout(
        WAIT,
        AggregatedDiscoveryServiceClient::new(ch).delta_aggregated_resources(request),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    (tx, stream)
}

async fn next(rx: &mut Streaming<DeltaDiscoveryResponse>) -> DeltaDiscoveryResponse {
    tokio::time::timeout(WAIT, rx.message())
        .await
        .expect("no response in time")
        .unwrap()
        .expect("stream ended")
}

async fn ack(tx: &mpsc::Sender<DeltaDiscoveryRequest>, r: &DeltaDiscoveryResponse) {
    tx.send(DeltaDiscoveryRequest {
        type_url: r.type_url.clone(),
        response_nonce: r.nonce.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
}

/// The server workload's addresses in a response, if it carries it.
fn server_ips(r: &DeltaDiscoveryResponse) -> Option<Vec<Vec<u8>>> {
    use ambit_proto::istio::workload as pw;
    use prost::Message;
    let res = r
        .resources
        .iter()
        .find(|x| x.name == "c1//v1/Pod/default/server")?;
    let any = res.resource.as_ref()?;
    let addr = pw::Address::decode(any.value.as_slice()).ok()?;
    match addr.r#type? {
        pw::address::Type::Workload(w) => Some(w.addresses.iter().map(|a| a.to_vec()).collect()),
        _ => None,
    }
}

/// Waits for the response that brings the server workload at `ip`, ACKing what comes.
async fn wait_server_at(
    tx: &mpsc::Sender<DeltaDiscoveryRequest>,
    rx: &mut Streaming<DeltaDiscoveryResponse>,
    ip: [u8; 4],
) -> DeltaDiscoveryResponse {
    loop {
        let r = next(rx).await;
        ack(tx, &r).await;
        if server_ips(&r).is_some_and(|ips| ips.contains(&ip.to_vec())) {
            return r;
        }
    }
}

/// The value of the sample `series` (name and labels) in the Prometheus text, or 0.
fn metric(control: &Control, series: &str) -> u64 {
    let want = format!("{series} ");
    control
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(&want)?.parse().ok())
        .unwrap_or(0)
}

fn refused(control: &Control, reason: &str) -> u64 {
    metric(
        control,
        &format!("ambit_control_xds_requests_refused_total{{reason=\"{reason}\"}}"),
    )
}

/// The most names one client has held, by the server's high-water mark.
fn names_peak(control: &Control) -> u64 {
    metric(control, "ambit_control_xds_client_names_peak")
}

/// The names the server looked at to answer subscriptions.
fn names_examined(control: &Control) -> u64 {
    metric(control, "ambit_control_xds_names_examined_total")
}

/// The most names any client is kept subscribed to, per `/debug`.
fn most_names(control: &Control) -> u64 {
    control.debug_json()["clients"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["types"][ADDRESS_TYPE]["explicit_subscriptions"].as_u64())
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_storm_is_capped_refused_counted_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let mesh_dir = dir.path().join("mesh");
    std::fs::create_dir(&mesh_dir).unwrap();
    std::fs::write(mesh_dir.join("a.yaml"), mesh("10.0.0.13")).unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let mut cfg = ControlConfig::new(mesh_dir.clone(), dir.path().join("ca"), tokens);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.poll_interval = Duration::from_millis(100);
    let cap = cfg.limits.max_names_per_type;
    let control = Arc::new(Control::start(cfg).await.unwrap());
    let ch = channel(
        control.local_addr(),
        &control.root_pem().expect("a file-mode CA"),
    );

    // The well-behaved client asks for the server by address and gets it.
    let (good_tx, mut good_rx) = open(ch.clone(), on_demand_first(vec!["/10.0.0.3".into()])).await;
    let r = wait_server_at(&good_tx, &mut good_rx, [10, 0, 0, 3]).await;
    assert_eq!(r.resources[0].aliases, ["/10.0.0.3"]);
    assert_eq!(
        metric(
            &control,
            &format!("ambit_control_xds_names_subscribed_total{{type_url=\"{ADDRESS_TYPE}\"}}")
        ),
        1
    );

    assert_eq!(names_peak(&control), 1);

    // The storm: batches of 5,000 names (well under the request size limit), past the cap.
    let batch = 5_000;
    let batches = cap / batch + 2;
    let (storm_tx, mut storm_rx) = open(ch.clone(), on_demand_first(Vec::new())).await;
    let sender = tokio::spawn(async move {
        for b in 0..batches {
            let names = (0..batch)
                .map(|i| format!("/10.{}.{}.{}", b % 250, i / 250, i % 250))
                .collect();
            let req = DeltaDiscoveryRequest {
                type_url: ADDRESS_TYPE.into(),
                resource_names_subscribe: names,
                ..Default::default()
            };
            if storm_tx.send(req).await.is_err() {
                return;
            }
        }
        // Keep the request side open until the server ends the stream.
        storm_tx.closed().await;
    });
    // During the storm, the mesh changes: the good client hears of it.
    std::fs::write(mesh_dir.join("a.yaml"), mesh("10.0.0.14")).unwrap();
    wait_server_at(&good_tx, &mut good_rx, [10, 0, 0, 14]).await;

    let status = loop {
        match tokio::time::timeout(WAIT, storm_rx.message())
            .await
            .expect("the storm's stream was not ended")
        {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the storm's stream ended without an error"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains(&format!(
            "{ADDRESS_TYPE}: the client subscribes to or reports more than {cap} resource names"
        )),
        "{status:?}"
    );
    sender.await.unwrap();
    assert_eq!(refused(&control, "too_many_names"), 1);
    let deadline = Instant::now() + WAIT;
    while control.debug_json()["clients"]
        .as_array()
        .map_or(0, Vec::len)
        != 1
    {
        assert!(Instant::now() < deadline, "the storm's session was kept");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The storm filled its share to the cap, and not one name past it, at any moment:
    // the server keeps the mark on every name it adds, the refused request's too.
    assert_eq!(names_peak(&control), cap as u64);

    // After the storm: the good client still gets changes.
    std::fs::write(mesh_dir.join("a.yaml"), mesh("10.0.0.15")).unwrap();
    wait_server_at(&good_tx, &mut good_rx, [10, 0, 0, 15]).await;
    control.shutdown().await;
}

/// A storm of many small requests (one new name each, sent as fast as the client can):
/// each is answered (with its removal: none exists) and costs in proportion to what it
/// asks, not to every name the client asked before, by the server's own count of the names
/// it looked at: two per request (the name followed, then reported absent). Were every
/// name followed again on each request, the count would be REQUESTS² / 2 (5 × 10⁷).
/// Another client is served after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_subscriptions_are_each_answered_and_others_are_served() {
    const REQUESTS: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let mesh_dir = dir.path().join("mesh");
    std::fs::create_dir(&mesh_dir).unwrap();
    std::fs::write(mesh_dir.join("a.yaml"), mesh("10.0.0.13")).unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let mut cfg = ControlConfig::new(mesh_dir.clone(), dir.path().join("ca"), tokens);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    let control = Control::start(cfg).await.unwrap();
    let ch = channel(
        control.local_addr(),
        &control.root_pem().expect("a file-mode CA"),
    );

    let (storm_tx, mut storm_rx) = open(ch.clone(), on_demand_first(Vec::new())).await;
    let before = names_examined(&control);
    let pad = "x".repeat(100);
    let sender = tokio::spawn(async move {
        for i in 0..REQUESTS {
            let req = DeltaDiscoveryRequest {
                type_url: ADDRESS_TYPE.into(),
                resource_names_subscribe: vec![format!("nobody/{i}-{pad}")],
                ..Default::default()
            };
            storm_tx.send(req).await.unwrap();
        }
        storm_tx
    });
    let answered = async {
        let mut removed = 0;
        while removed < REQUESTS {
            removed += next(&mut storm_rx).await.removed_resources.len();
        }
        removed
    };
    let removed = tokio::time::timeout(2 * WAIT, answered)
        .await
        .expect("the storm was not answered: a hang");
    assert_eq!(removed, REQUESTS);
    let storm_tx = sender.await.unwrap();
    assert_eq!(most_names(&control), REQUESTS as u64);
    let examined = names_examined(&control) - before;
    assert_eq!(
        examined,
        2 * REQUESTS as u64,
        "names looked at for the storm"
    );

    let (good_tx, mut good_rx) = open(ch, on_demand_first(vec!["/10.0.0.3".into()])).await;
    wait_server_at(&good_tx, &mut good_rx, [10, 0, 0, 3]).await;
    drop(storm_tx);
    control.shutdown().await;
}
