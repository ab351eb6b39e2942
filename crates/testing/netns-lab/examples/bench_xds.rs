//! Benchmark of issue 11's performance aims: delta xDS in the node proxy, ambit's and
//! Istio's ztunnel side by side in the same run, and the fan-out of `ambit control`.
//!
//! ```text
//! bench_xds --ambit target/release/ambit --peer ../shared/peers/istio-ztunnel --out FILE
//!     [--rounds 3] [--updates 1000] [--only ambit|istio] [--proxy-env KEY=VALUE]...
//! bench_xds --fanout --ambit target/release/ambit --out FILE [--rounds 3] [--clients 100]
//! bench_xds --local-file --ambit target/release/ambit --out FILE [--rounds 3]
//! bench_xds --under-control --ambit target/release/ambit --out FILE [--rounds 3]
//!     [--destinations 1000]
//! ```
//!
//! Every mode takes `--workloads N` (10,000 unless told; a service per ten workloads).
//!
//! Proxy mode: each round starts each proxy (which goes first alternates from round to
//! round) alone in a network namespace of its own, with this driver's own delta xDS server
//! listening on 127.0.0.1:15012 inside that namespace (TLS, a server certificate minted
//! here; the proxy trusts its root via `XDS_ROOT_CA`). The server answers the initial
//! requests with 10,000 workloads and 1,000 services in one Address response and an empty
//! Authorization response, then pushes single-workload updates one at a time, each
//! waiting for its ACK (both proxies ACK after applying). Measured: response sent → ACK,
//! request → ACK, RSS before the answer (at start + 500 ms, the answer held until then)
//! and 1 s after the ACK, and the push → ACK latency of every update.
//!
//! Fan-out mode: starts `ambit control` with the same mesh as local-config YAML files,
//! connects `--clients` delta xDS clients, waits for their initial syncs, then rewrites
//! one file to change one workload and records when each client received the delta.
//!
//! Local-file mode: the same mesh as one `LOCAL_XDS_PATH` file; each round starts ambit on
//! it and on a file of its own workload alone (interleaved), and samples RSS ten seconds
//! after ready; the difference is what the mesh adds.
//!
//! Under-control mode: `ambit control` serves the mesh, and a node proxy subscribes to it
//! whole (wildcard) or on demand (`XDS_ON_DEMAND=true`, asking for its own workload only):
//! RSS ten seconds after ready, each way, interleaved. With `--destinations N`, the
//! on-demand proxy is then asked (through its SOCKS5 listener) for connections to N
//! distinct workloads of the mesh, one after another, each looked up on demand before it
//! is decided; RSS is sampled ten seconds after the last, and the proxy's `/xds_on_demand`
//! must show the N names answered. The workloads' nodes are not in the bench, so each
//! connection ends once decided (the dial fails): what stays is what the lookups brought
//! into the store and the metric series each destination adds. The same connections are
//! then made through a wildcard proxy, for what serving them costs without on demand.
//!
//! Needs root (network namespaces). Everything it creates is removed at the end.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, Instant};

use ambit_grpc::server::{self, TestPki};
use ambit_netns_lab::peer::IstioZtunnel;
use ambit_netns_lab::stats;
use ambit_netns_lab::Lab;
use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use ambit_proto::istio::workload::{address, NetworkAddress, Port, PortList};
use ambit_proto::{
    address_resource, DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Resource, Service,
    Workload, ADDRESS_TYPE, AUTHORIZATION_TYPE, MAX_XDS_MESSAGE,
};
use anyhow::{bail, Context};
use futures_util::Stream;
use prost::Message;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// The mesh's size: `--workloads` (10,000 unless told), a service per ten workloads.
static MESH_SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn mesh_workloads() -> usize {
    *MESH_SIZE.get().unwrap_or(&10_000)
}

fn mesh_services() -> usize {
    (mesh_workloads() / 10).max(1)
}
const NAMESPACES: usize = 50;
const NODES: usize = 100;
const XDS_PORT: u16 = 15012;
const XDS_NAME: &str = "xds.bench.local";
/// Generous failure guards, never part of a figure.
const CONNECT_GUARD: Duration = Duration::from_secs(30);
const ACK_GUARD: Duration = Duration::from_secs(30);

struct Args {
    ambit: PathBuf,
    peer: PathBuf,
    out: PathBuf,
    rounds: usize,
    updates: usize,
    clients: usize,
    fanout: bool,
    local_file: bool,
    under_control: bool,
    destinations: usize,
    only: Option<String>,
    proxy_env: Vec<(String, String)>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        ambit: PathBuf::new(),
        peer: PathBuf::new(),
        out: PathBuf::new(),
        rounds: 3,
        updates: 1000,
        clients: 100,
        fanout: false,
        local_file: false,
        under_control: false,
        destinations: 0,
        only: None,
        proxy_env: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--ambit" => a.ambit = val()?.into(),
            "--peer" => a.peer = val()?.into(),
            "--out" => a.out = val()?.into(),
            "--rounds" => a.rounds = val()?.parse().context("--rounds")?,
            "--updates" => a.updates = val()?.parse().context("--updates")?,
            "--clients" => a.clients = val()?.parse().context("--clients")?,
            "--fanout" => a.fanout = true,
            "--local-file" => a.local_file = true,
            "--under-control" => a.under_control = true,
            "--destinations" => a.destinations = val()?.parse().context("--destinations")?,
            "--workloads" => {
                let n: usize = val()?.parse().context("--workloads")?;
                let _ = MESH_SIZE.set(n.clamp(10, 250_000));
            }
            "--only" => a.only = Some(val()?),
            "--proxy-env" => a
                .proxy_env
                .push(ambit_netns_lab::parse_env_pair(&val()?).map_err(anyhow::Error::msg)?),
            "-h" | "--help" => {
                println!("usage: see the top of crates/testing/netns-lab/examples/bench_xds.rs");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (see --help)"),
        }
    }
    if a.out.as_os_str().is_empty() {
        bail!("--out FILE is required");
    }
    let wants = |name: &str| a.only.as_deref().is_none_or(|o| o == name);
    if (a.fanout || wants("ambit")) && a.ambit.as_os_str().is_empty() {
        bail!("--ambit PATH is required (or --only istio)");
    }
    if !a.fanout
        && !a.local_file
        && !a.under_control
        && wants("istio")
        && a.peer.as_os_str().is_empty()
    {
        bail!("--peer DIR is required (or --only ambit)");
    }
    if let Some(o) = &a.only {
        if o != "ambit" && o != "istio" {
            bail!("--only takes ambit or istio");
        }
    }
    if !a.ambit.as_os_str().is_empty() {
        a.ambit = std::fs::canonicalize(&a.ambit)
            .with_context(|| format!("--ambit {}", a.ambit.display()))?;
    }
    a.rounds = a.rounds.clamp(1, 20);
    a.updates = a.updates.clamp(1, 100_000);
    a.clients = a.clients.clamp(1, 1000);
    Ok(a)
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args = parse_args()?;
    let report = if args.fanout {
        fanout(&args)?
    } else if args.local_file {
        local_file(&args)?
    } else if args.under_control {
        under_control(&args)?
    } else {
        proxies(&args)?
    };
    print!("{report}");
    std::fs::write(&args.out, &report)
        .with_context(|| format!("writing {}", args.out.display()))?;
    Ok(())
}

/// Runs `f` on a fresh tokio runtime whose threads all live in `ns`, so every socket the
/// bench opens (server and clients) is inside the namespace the lab created.
fn in_netns_async<T: Send>(
    ns: &str,
    f: impl std::future::Future<Output = anyhow::Result<T>> + Send,
) -> anyhow::Result<T> {
    Lab::in_netns(ns, move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(f)
            .map_err(|e| std::io::Error::other(format!("{e:#}")))
    })
}

// ---------------------------------------------------------------------------------------
// The mesh: 10,000 workloads in 1–2 of 1,000 services each.

fn workload_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        10,
        1 + (i / 62_500) as u8,
        (i / 250 % 250) as u8,
        (i % 250 + 1) as u8,
    )
}

fn service_vip(j: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, (j / 250) as u8, (j % 250 + 1) as u8)
}

fn ns_of(i: usize) -> String {
    format!("ns{}", i % NAMESPACES)
}

fn workload_uid(i: usize) -> String {
    format!("Kubernetes//v1/Pod/{}/w{i}", ns_of(i))
}

fn service_host(j: usize) -> String {
    format!("svc{j}.{}.svc.cluster.local", ns_of(j))
}

/// The services workload `i` belongs to: one for all, a second for every other one.
fn services_of(i: usize) -> Vec<usize> {
    let first = i % mesh_services();
    if i % 2 == 1 {
        vec![first, (first + mesh_services() / 2 + 1) % mesh_services()]
    } else {
        vec![first]
    }
}

fn workload(i: usize, revision: &str) -> Workload {
    let services = services_of(i)
        .into_iter()
        .map(|j| {
            (
                format!("{}/{}", ns_of(j), service_host(j)),
                PortList {
                    ports: vec![Port {
                        service_port: 80,
                        target_port: 8080,
                        app_protocol: 0,
                    }],
                },
            )
        })
        .collect();
    Workload {
        uid: workload_uid(i),
        name: format!("w{i}"),
        namespace: ns_of(i),
        addresses: vec![workload_ip(i).octets().to_vec().into()],
        tunnel_protocol: 1, // HBONE
        trust_domain: "cluster.local".into(),
        service_account: "default".into(),
        node: format!("node{}", i % NODES),
        canonical_name: format!("w{i}"),
        canonical_revision: revision.into(),
        workload_type: 2, // POD
        workload_name: format!("w{i}"),
        services,
        cluster_id: "Kubernetes".into(),
        ..Default::default()
    }
}

fn service(j: usize) -> Service {
    Service {
        name: format!("svc{j}"),
        namespace: ns_of(j),
        hostname: service_host(j),
        addresses: vec![NetworkAddress {
            network: String::new(),
            address: service_vip(j).octets().to_vec().into(),
            length: None,
        }],
        ports: vec![Port {
            service_port: 80,
            target_port: 8080,
            app_protocol: 0,
        }],
        ..Default::default()
    }
}

fn workload_resource(i: usize, revision: &str) -> Resource {
    address_resource(
        workload_uid(i),
        revision,
        address::Type::Workload(workload(i, revision)),
    )
}

/// The initial Address response: every workload and service.
fn initial_addresses() -> DeltaDiscoveryResponse {
    let mut resources: Vec<Resource> = (0..mesh_services())
        .map(|j| {
            address_resource(
                format!("{}/{}", ns_of(j), service_host(j)),
                "v1",
                address::Type::Service(service(j)),
            )
        })
        .collect();
    resources.extend((0..mesh_workloads()).map(|i| workload_resource(i, "v1")));
    DeltaDiscoveryResponse {
        system_version_info: "v1".into(),
        resources,
        type_url: ADDRESS_TYPE.into(),
        removed_resources: Vec::new(),
        nonce: "a0".into(),
    }
}

/// The workload the `k`-th update changes, spread over the mesh.
fn updated_workload(k: usize) -> usize {
    (k * 7919 + 1) % mesh_workloads()
}

// ---------------------------------------------------------------------------------------
// The bench's delta ADS server: every stream is handed to the driver, which answers it.

type Outbound = mpsc::UnboundedSender<Result<DeltaDiscoveryResponse, tonic::Status>>;
type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

struct XdsStream {
    requests: tonic::Streaming<DeltaDiscoveryRequest>,
    responses: Outbound,
}

struct Ads {
    streams: mpsc::UnboundedSender<XdsStream>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = BoxStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = BoxStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        _: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("only delta xDS"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.streams
            .send(XdsStream {
                requests: request.into_inner(),
                responses: tx,
            })
            .map_err(|_| tonic::Status::unavailable("bench is shutting down"))?;
        Ok(tonic::Response::new(Box::pin(receiver_stream(rx))))
    }
}

fn receiver_stream<T: Send + 'static>(
    rx: mpsc::UnboundedReceiver<T>,
) -> impl Stream<Item = T> + Send {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
}

/// Starts the server on 127.0.0.1:15012 of the current namespace.
async fn serve_xds(pki: &TestPki) -> anyhow::Result<mpsc::UnboundedReceiver<XdsStream>> {
    let acceptor = server::acceptor(pki.chain.clone(), pki.key.clone_key())?;
    let listener = TcpListener::bind(("127.0.0.1", XDS_PORT))
        .await
        .context("binding the bench's xDS server")?;
    let incoming = server::incoming(listener, acceptor, server::AcceptOptions::default());
    let (tx, rx) = mpsc::unbounded_channel();
    let service = AggregatedDiscoveryServiceServer::new(Ads { streams: tx })
        .max_decoding_message_size(MAX_XDS_MESSAGE);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    Ok(rx)
}

// ---------------------------------------------------------------------------------------
// Proxy mode.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Impl {
    Ambit,
    Istio,
}

impl Impl {
    fn label(self) -> &'static str {
        match self {
            Impl::Ambit => "ambit",
            Impl::Istio => "Istio",
        }
    }
}

#[derive(Default)]
struct ProxyRound {
    start_to_request_ms: f64,
    request_to_ack_ms: f64,
    sent_to_ack_ms: f64,
    rss_before_mib: f64,
    rss_after_mib: f64,
    rss_10s_mib: f64,
    rss_after_updates_mib: f64,
    nacks: usize,
    /// Whether /config_dump shows the last update's revision: the ACK came after applying.
    last_update_dumped: bool,
    update_us: Vec<f64>,
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status (did the proxy exit?)"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS in /proc/<pid>/status")
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Reads requests until one carries `nonce`; counts NACKs on the way.
async fn wait_ack(
    stream: &mut XdsStream,
    nonce: &str,
    nacks: &mut usize,
) -> anyhow::Result<Instant> {
    loop {
        let msg = tokio::time::timeout(ACK_GUARD, stream.requests.message())
            .await
            .with_context(|| format!("no ACK for nonce {nonce} within {ACK_GUARD:?}"))?
            .context("the proxy's xDS stream failed")?
            .context("the proxy closed its xDS stream")?;
        if msg.response_nonce == nonce {
            if msg.error_detail.is_some() {
                *nacks += 1;
                eprintln!("NACK of {nonce}: {:?}", msg.error_detail);
            }
            return Ok(Instant::now());
        }
    }
}

fn proxy_env(which: Impl, args: &Args, root: &Path, ca_dir: &Path) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("XDS_ADDRESS", format!("https://127.0.0.1:{XDS_PORT}")),
        ("XDS_ROOT_CA", root.display().to_string()),
        ("ALT_XDS_HOSTNAME", XDS_NAME.to_string()),
        ("PROXY_MODE", "dedicated".to_string()),
        ("PROXY_WORKLOAD_INFO", "ns0/w0/default".to_string()),
        ("NODE_NAME", "node0".to_string()),
        ("POD_NAME", "w0".to_string()),
        ("POD_NAMESPACE", "ns0".to_string()),
        ("CLUSTER_ID", "Kubernetes".to_string()),
        ("ISTIO_META_DNS_CAPTURE", "false".to_string()),
        ("RUST_LOG", "info".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    match which {
        // With CA_ADDRESS unset, LOCAL_CA_DIR is the issuer: no CA server is involved.
        Impl::Ambit => env.push(("LOCAL_CA_DIR".into(), ca_dir.display().to_string())),
        Impl::Istio => env.push(("FAKE_CA".into(), "true".into())),
    }
    for (k, v) in &args.proxy_env {
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

fn proxy_round(
    which: Impl,
    args: &Args,
    peer: Option<&IstioZtunnel>,
    initial: &DeltaDiscoveryResponse,
) -> anyhow::Result<ProxyRound> {
    let lab = Lab::new("bxds")?;
    let ns = lab.netns("node")?;
    let pki = server::test_pki(&[XDS_NAME]);
    let root = lab.dir.path().join("xds-root.pem");
    std::fs::write(&root, &pki.root_pem)?;
    let ca_dir = lab.dir.path().join("ca");
    let (program, argv): (PathBuf, &[&str]) = match (which, peer) {
        (Impl::Ambit, _) => (args.ambit.clone(), &["ztunnel"]),
        (Impl::Istio, Some(p)) => {
            p.copy_ca(&ca_dir)?;
            (p.bin.clone(), &["proxy", "ztunnel"])
        }
        (Impl::Istio, None) => bail!("--peer is needed for Istio's ztunnel"),
    };
    if which == Impl::Ambit {
        match peer {
            Some(p) => p.copy_ca(&ca_dir)?,
            None => ambit_identity::CertificateAuthority::ephemeral("cluster.local")?
                .write_plugin_dir(&ca_dir)?,
        }
    }
    let env = proxy_env(which, args, &root, &ca_dir);
    let env_ref: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let lab_ref = &lab;
    let ns_ref = ns.as_str();
    let result = in_netns_async(&ns, async move {
        let mut streams = serve_xds(&pki).await?;
        let proc = lab_ref.spawn(ns_ref, which.label(), &program, argv, &env_ref)?;
        let started = Instant::now();
        let fail = |what: &str| {
            anyhow::anyhow!(
                "{} {what}; its log ends:\n{}",
                which.label(),
                log_tail(&proc.log)
            )
        };
        let mut stream = match tokio::time::timeout(CONNECT_GUARD, streams.recv()).await {
            Ok(Some(s)) => s,
            _ => return Err(fail("did not open a delta xDS stream")),
        };
        // The initial request of each type; the first one's arrival starts the clock.
        let mut first_request = None;
        let mut types = HashSet::new();
        while types.len() < 2 {
            let msg = tokio::time::timeout(CONNECT_GUARD, stream.requests.message())
                .await
                .map_err(|_| fail("did not send both initial requests"))?
                .context("reading the initial requests")?
                .ok_or_else(|| fail("closed its stream before the initial requests"))?;
            first_request.get_or_insert_with(Instant::now);
            if msg.type_url == ADDRESS_TYPE || msg.type_url == AUTHORIZATION_TYPE {
                types.insert(msg.type_url);
            }
        }
        let first_request = first_request.unwrap_or_else(Instant::now);
        // RSS with empty state: the answer is held until it is sampled.
        tokio::time::sleep_until((started + Duration::from_millis(500)).into()).await;
        let rss_before = rss_kib(proc.pid)?;
        let addresses = initial.clone();
        let policies = DeltaDiscoveryResponse {
            system_version_info: "v1".into(),
            type_url: AUTHORIZATION_TYPE.into(),
            nonce: "p0".into(),
            ..Default::default()
        };
        let sent = Instant::now();
        stream.responses.send(Ok(addresses))?;
        stream.responses.send(Ok(policies))?;
        let mut nacks = 0;
        // ACKs may come in either order; the sync is done when both have.
        let mut acked = HashSet::new();
        let mut last_ack = sent;
        while acked.len() < 2 {
            let msg = tokio::time::timeout(ACK_GUARD, stream.requests.message())
                .await
                .map_err(|_| fail("did not ACK the initial responses"))?
                .context("reading the initial ACKs")?
                .ok_or_else(|| fail("closed its stream before ACKing"))?;
            if msg.response_nonce == "a0" || msg.response_nonce == "p0" {
                if msg.error_detail.is_some() {
                    nacks += 1;
                    eprintln!("NACK of {}: {:?}", msg.response_nonce, msg.error_detail);
                }
                acked.insert(msg.response_nonce);
                last_ack = Instant::now();
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss_after = rss_kib(proc.pid)?;
        tokio::time::sleep(Duration::from_secs(9)).await;
        let rss_10s = rss_kib(proc.pid)?;
        let mut update_us = Vec::with_capacity(args.updates);
        for k in 0..args.updates {
            let nonce = format!("u{k}");
            let update = DeltaDiscoveryResponse {
                system_version_info: format!("u{k}"),
                resources: vec![workload_resource(updated_workload(k), &format!("r{k}"))],
                type_url: ADDRESS_TYPE.into(),
                removed_resources: Vec::new(),
                nonce: nonce.clone(),
            };
            let pushed = Instant::now();
            stream.responses.send(Ok(update))?;
            let acked = wait_ack(&mut stream, &nonce, &mut nacks).await?;
            update_us.push((acked - pushed).as_secs_f64() * 1e6);
        }
        let rss_after_updates = rss_kib(proc.pid)?;
        let last = format!("\"r{}\"", args.updates - 1);
        let dump_ns = ns_ref.to_string();
        let dump = tokio::task::spawn_blocking(move || {
            ambit_netns_lab::http_get(&dump_ns, ([127, 0, 0, 1], 15000).into(), "/config_dump")
        })
        .await?;
        let last_update_dumped = match dump {
            Ok((200, body)) => body.contains(&last),
            Ok((status, _)) => {
                eprintln!("/config_dump answered {status}");
                false
            }
            Err(e) => {
                eprintln!("/config_dump: {e:#}");
                false
            }
        };
        let mib = |kib: u64| kib as f64 / 1024.0;
        Ok(ProxyRound {
            start_to_request_ms: (first_request - started).as_secs_f64() * 1e3,
            request_to_ack_ms: (last_ack - first_request).as_secs_f64() * 1e3,
            sent_to_ack_ms: (last_ack - sent).as_secs_f64() * 1e3,
            rss_before_mib: mib(rss_before),
            rss_after_mib: mib(rss_after),
            rss_10s_mib: mib(rss_10s),
            rss_after_updates_mib: mib(rss_after_updates),
            nacks,
            last_update_dumped,
            update_us,
        })
    });
    drop(lab);
    result
}

fn proxies(args: &Args) -> anyhow::Result<String> {
    let peer = if args.only.as_deref() == Some("ambit") && args.peer.as_os_str().is_empty() {
        None
    } else {
        Some(IstioZtunnel::find(&args.peer)?)
    };
    let impls: Vec<Impl> = [Impl::Ambit, Impl::Istio]
        .into_iter()
        .filter(|i| {
            args.only
                .as_deref()
                .is_none_or(|o| o.eq_ignore_ascii_case(i.label()))
        })
        .collect();
    let initial = initial_addresses();
    eprintln!(
        "initial Address response: {} resources, {} bytes",
        initial.resources.len(),
        initial.encoded_len()
    );
    let mut rounds: Vec<Vec<ProxyRound>> = impls.iter().map(|_| Vec::new()).collect();
    for round in 0..args.rounds {
        // Which implementation runs first alternates, so drift favours neither.
        let mut turns: Vec<(usize, &Impl)> = impls.iter().enumerate().collect();
        if round % 2 == 1 {
            turns.reverse();
        }
        for (n, which) in turns {
            eprintln!("round {}/{}: {}", round + 1, args.rounds, which.label());
            let r = proxy_round(*which, args, peer.as_ref(), &initial)?;
            eprintln!(
                "  sync {:.1} ms (request→ACK {:.1} ms), RSS {:.1} → {:.1} MiB, update p50 {:.0} µs",
                r.sent_to_ack_ms,
                r.request_to_ack_ms,
                r.rss_before_mib,
                r.rss_after_mib,
                pct(&r.update_us, 50.0)
            );
            rounds[n].push(r);
        }
    }
    let mut out = String::new();
    writeln!(
        out,
        "### xDS in the node proxy: {} workloads, {} services, \
         {} single-workload updates; {} rounds, interleaved\n",
        mesh_workloads(),
        mesh_services(),
        args.updates,
        args.rounds
    )?;
    if let Some(p) = &peer {
        writeln!(out, "Istio's ztunnel: {}\n", p.bin.display())?;
    }
    let figures: [Figure<ProxyRound>; 14] = [
        ("process start → first xDS request (ms)", |r| {
            r.start_to_request_ms
        }),
        ("initial sync, response sent → ACK (ms)", |r| {
            r.sent_to_ack_ms
        }),
        ("initial sync, request → ACK (ms)", |r| {
            r.request_to_ack_ms
        }),
        ("RSS before the answer (MiB)", |r| r.rss_before_mib),
        ("RSS 1 s after the sync (MiB)", |r| r.rss_after_mib),
        ("RSS added by the sync (MiB)", |r| {
            r.rss_after_mib - r.rss_before_mib
        }),
        ("RSS 10 s after the sync (MiB)", |r| r.rss_10s_mib),
        (
            "RSS added, 10 s after the sync, per workload (bytes)",
            |r| (r.rss_10s_mib - r.rss_before_mib) * 1_048_576.0 / mesh_workloads() as f64,
        ),
        ("RSS after the updates (MiB)", |r| r.rss_after_updates_mib),
        ("update push → ACK p50 (µs)", |r| pct(&r.update_us, 50.0)),
        ("update push → ACK p90 (µs)", |r| pct(&r.update_us, 90.0)),
        ("update push → ACK p99 (µs)", |r| pct(&r.update_us, 99.0)),
        ("NACKed responses", |r| r.nacks as f64),
        ("last update in /config_dump (1 = yes)", |r| {
            f64::from(u8::from(r.last_update_dumped))
        }),
    ];
    write!(out, "| figure |")?;
    for i in &impls {
        write!(out, " {} median (spread) |", i.label())?;
    }
    if impls.len() == 2 {
        write!(out, " ambit/Istio |")?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "|---|{}",
        "---|".repeat(impls.len() + usize::from(impls.len() == 2))
    )?;
    for (name, f) in &figures {
        write!(out, "| {name} |")?;
        let mut medians = Vec::new();
        for r in &rounds {
            let values: Vec<f64> = r.iter().map(f).collect();
            medians.push(pct(&values, 50.0));
            write!(out, " {} |", median_spread(&values))?;
        }
        if medians.len() == 2 {
            if medians[1] != 0.0 {
                write!(out, " {:.2} |", medians[0] / medians[1])?;
            } else {
                write!(out, " – |")?;
            }
        }
        writeln!(out)?;
    }
    writeln!(
        out,
        "\nSync: the Address response ({} resources) and an empty Authorization response are \
         sent together once both initial requests arrived and RSS was sampled (start + 500 ms); \
         \"request → ACK\" counts from the first initial request, so it includes the hold until \
         start + 500 ms. Updates change one \
         workload's canonical_revision, one at a time, each after the previous ACK.",
        initial.resources.len()
    )?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Local-file mode: the same mesh through `LOCAL_XDS_PATH`.

/// The whole mesh as one local config file, or (`only_w0`) just the proxy's own workload.
fn local_mesh_yaml(only_w0: bool) -> String {
    let mut s = String::from("workloads:\n");
    let n = if only_w0 { 1 } else { mesh_workloads() };
    for i in 0..n {
        s.push_str(&workload_yaml(i, "v1"));
    }
    if !only_w0 {
        s.push_str(&services_yaml());
    }
    s
}

/// Waits until the proxy `proc` in `ns` is ready (its readiness port answers 200), then
/// ten seconds more; returns the time to ready (ms) and the RSS then (KiB).
fn ready_then_rss(ns: &str, proc: &ambit_netns_lab::Process) -> anyhow::Result<(f64, u64)> {
    let ready_ms = wait_ready(ns, proc)?;
    std::thread::sleep(Duration::from_secs(10));
    Ok((ready_ms, rss_kib(proc.pid)?))
}

/// Milliseconds from now until the proxy in `ns` answers ready.
fn wait_ready(ns: &str, proc: &ambit_netns_lab::Process) -> anyhow::Result<f64> {
    let started = Instant::now();
    let ready: std::net::SocketAddr = ([127, 0, 0, 1], 15021).into();
    while !matches!(
        ambit_netns_lab::http_get(ns, ready, "/healthz/ready"),
        Ok((200, _))
    ) {
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "the proxy was not ready; its log ends:\n{}",
                log_tail(&proc.log)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(started.elapsed().as_secs_f64() * 1e3)
}

/// Asks the proxy in `ns` for a connection to each of `n` distinct workloads (w1, w2, …)
/// through its SOCKS5 listener, one after another, each until the proxy closes it (it
/// decides after the on-demand lookup, and the dial fails); then checks that its
/// `/xds_on_demand` holds the n names answered besides its own workload.
fn ask_for_destinations(ns: &str, n: usize, on_demand: bool) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let socks: std::net::SocketAddr = ([127, 0, 0, 1], 15080).into();
    for i in 1..=n.min(mesh_workloads() - 1) {
        let ip = workload_ip(i).octets();
        Lab::in_netns(ns, || {
            let mut s = std::net::TcpStream::connect_timeout(&socks, CONNECT_GUARD)?;
            s.set_read_timeout(Some(CONNECT_GUARD))?;
            // No authentication; then CONNECT to the workload's IPv4 address, port 8080.
            s.write_all(&[5, 1, 0])?;
            let mut method = [0u8; 2];
            s.read_exact(&mut method)?;
            s.write_all(&[5, 1, 0, 1, ip[0], ip[1], ip[2], ip[3], 0x1f, 0x90])?;
            // As ztunnel, the proxy replies before it decides; the connection is decided
            // (after the lookup) and ends, since the workload's node is not here: read
            // to its end.
            let mut rest = Vec::new();
            s.read_to_end(&mut rest)?;
            Ok(())
        })
        .with_context(|| format!("SOCKS5 connection to w{i}"))?;
    }
    if !on_demand {
        return Ok(());
    }
    let (status, body) =
        ambit_netns_lab::http_get(ns, ([127, 0, 0, 1], 15000).into(), "/xds_on_demand")?;
    let v: serde_json::Value = serde_json::from_str(&body)
        .with_context(|| format!("/xds_on_demand answered {status}: {body}"))?;
    let answered = v["names"]["answered"].as_u64().unwrap_or(0);
    // Its own workload's uid, and an address name per destination.
    if answered < n as u64 + 1 {
        bail!("the proxy holds {answered} names answered after {n} destinations: {body}");
    }
    eprintln!("on demand after {n} destinations: {}", v["names"]);
    Ok(())
}

struct LocalRound {
    start_to_ready_ms: f64,
    rss_10s_kib: u64,
}

/// Starts ambit in its own namespace on `file`, and samples RSS ten seconds after ready.
fn local_round(args: &Args, yaml: &str) -> anyhow::Result<LocalRound> {
    let lab = Lab::new("bxl")?;
    let ns = lab.netns("node")?;
    let file = lab.dir.path().join("mesh.yaml");
    std::fs::write(&file, yaml)?;
    let ca_dir = lab.dir.path().join("ca");
    ambit_identity::CertificateAuthority::ephemeral("cluster.local")?.write_plugin_dir(&ca_dir)?;
    let mut env: Vec<(&str, String)> = vec![
        ("LOCAL_XDS_PATH", file.display().to_string()),
        ("LOCAL_CA_DIR", ca_dir.display().to_string()),
        ("PROXY_MODE", "dedicated".into()),
        ("PROXY_WORKLOAD_INFO", "ns0/w0/default".into()),
        ("NODE_NAME", "node0".into()),
        ("ISTIO_META_DNS_CAPTURE", "false".into()),
        ("RUST_LOG", "info".into()),
    ];
    for (k, v) in &args.proxy_env {
        env.retain(|(ek, _)| ek != k);
        env.push((k.as_str(), v.clone()));
    }
    let proc = lab.spawn(&ns, "ambit", &args.ambit, &["ztunnel"], &env)?;
    let (start_to_ready_ms, rss_10s_kib) = ready_then_rss(&ns, &proc)?;
    drop(lab);
    Ok(LocalRound {
        start_to_ready_ms,
        rss_10s_kib,
    })
}

fn local_file(args: &Args) -> anyhow::Result<String> {
    let mesh = local_mesh_yaml(false);
    let one = local_mesh_yaml(true);
    eprintln!("local config file: {} bytes", mesh.len());
    let mut full = Vec::new();
    let mut base = Vec::new();
    for round in 0..args.rounds {
        // Which goes first alternates, so drift favours neither.
        for which in if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        } {
            let r = local_round(args, if which { &mesh } else { &one })?;
            eprintln!(
                "round {}/{}: {}: ready in {:.0} ms, RSS 10 s after ready {:.1} MiB",
                round + 1,
                args.rounds,
                if which { "mesh" } else { "one workload" },
                r.start_to_ready_ms,
                r.rss_10s_kib as f64 / 1024.0
            );
            if which {
                full.push(r)
            } else {
                base.push(r)
            }
        }
    }
    let rss = |rs: &[LocalRound]| {
        rs.iter()
            .map(|r| r.rss_10s_kib as f64 / 1024.0)
            .collect::<Vec<_>>()
    };
    // Added: each round's mesh run against the same round's one-workload run.
    let added: Vec<f64> = full
        .iter()
        .zip(&base)
        .map(|(f, b)| (f.rss_10s_kib as f64 - b.rss_10s_kib as f64) / 1024.0)
        .collect();
    let per_workload: Vec<f64> = added
        .iter()
        .map(|a| a * 1_048_576.0 / mesh_workloads() as f64)
        .collect();
    let mut out = String::new();
    writeln!(
        out,
        "### The node proxy on a local config file: {} workloads, {} services ({} bytes of YAML); \
         {} rounds, interleaved\n",
        mesh_workloads(),
        mesh_services(),
        mesh.len(),
        args.rounds
    )?;
    writeln!(out, "| figure | median (spread) |\n|---|---|")?;
    writeln!(
        out,
        "| start → ready, the mesh (ms) | {} |",
        median_spread(&full.iter().map(|r| r.start_to_ready_ms).collect::<Vec<_>>())
    )?;
    writeln!(
        out,
        "| RSS 10 s after ready, the mesh (MiB) | {} |",
        median_spread(&rss(&full))
    )?;
    writeln!(
        out,
        "| RSS 10 s after ready, one workload (MiB) | {} |",
        median_spread(&rss(&base))
    )?;
    writeln!(
        out,
        "| RSS added by the mesh (MiB) | {} |",
        median_spread(&added)
    )?;
    writeln!(
        out,
        "| RSS added per workload (bytes) | {} |",
        median_spread(&per_workload)
    )?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Under-control mode: a node proxy under `ambit control`, wildcard or on demand.

/// RSS (KiB) of a node proxy under `control`, ten seconds after ready, and the time to
/// ready (ms).
fn proxy_under_control(
    args: &Args,
    lab: &Lab,
    control: &ambit_netns_lab::control::ControlPlane,
    kind: UnderControl,
) -> anyhow::Result<(u64, f64)> {
    let on_demand = matches!(
        kind,
        UnderControl::OnDemandIdle | UnderControl::OnDemandServing
    );
    let serving = matches!(
        kind,
        UnderControl::OnDemandServing | UnderControl::WildcardServing
    );
    // Beside the control server, on loopback: their ports do not meet.
    let ns = control.ns.clone();
    let mut env: Vec<(&str, String)> = control.proxy_env("node0")?;
    env.retain(|(k, _)| *k != "CLUSTER_ID");
    env.extend([
        ("CLUSTER_ID", "Kubernetes".to_string()),
        ("PROXY_MODE", "dedicated".to_string()),
        ("PROXY_WORKLOAD_INFO", "ns0/w0/default".to_string()),
        ("NODE_NAME", "node0".to_string()),
        ("XDS_ON_DEMAND", on_demand.to_string()),
        ("UNSTABLE_ENABLE_SOCKS5", "true".to_string()),
    ]);
    for (k, v) in &args.proxy_env {
        env.retain(|(ek, _)| ek != k);
        env.push((k.as_str(), v.clone()));
    }
    let proc = lab.spawn(&ns, kind.name(), &args.ambit, &["ztunnel"], &env)?;
    let (ready_ms, rss) = if serving {
        let ready_ms = wait_ready(&ns, &proc)?;
        ask_for_destinations(&ns, args.destinations, on_demand)?;
        std::thread::sleep(Duration::from_secs(10));
        let rss = rss_kib(proc.pid)?;
        // After the sample, since rendering them takes memory of its own: the metric
        // series the connections left (a label set per destination and family).
        let (_, metrics) =
            ambit_netns_lab::http_get(&ns, ([127, 0, 0, 1], 15020).into(), "/metrics")?;
        let series = metrics
            .lines()
            .filter(|l| l.starts_with("istio_tcp_"))
            .count();
        eprintln!("{}: {series} istio_tcp_* series", kind.name());
        (ready_ms, rss)
    } else {
        ready_then_rss(&ns, &proc)?
    };
    lab.signal_and_wait(
        proc.pid,
        nix::sys::signal::Signal::SIGTERM,
        Duration::from_secs(10),
    )?;
    Ok((rss, ready_ms))
}

/// The proxies a round of under-control mode starts, one after another.
#[derive(Clone, Copy, PartialEq, Eq)]
enum UnderControl {
    Wildcard,
    /// On demand, asked for nothing but its own workload.
    OnDemandIdle,
    /// On demand, after connections to `--destinations` distinct workloads.
    OnDemandServing,
    /// Wildcard, after the same connections: what serving them costs without on demand.
    WildcardServing,
}

impl UnderControl {
    fn name(self) -> &'static str {
        match self {
            UnderControl::Wildcard => "wildcard",
            UnderControl::OnDemandIdle => "on-demand",
            UnderControl::OnDemandServing => "on-demand-serving",
            UnderControl::WildcardServing => "wildcard-serving",
        }
    }
}

fn under_control(args: &Args) -> anyhow::Result<String> {
    let mut kinds = vec![UnderControl::Wildcard, UnderControl::OnDemandIdle];
    if args.destinations > 0 {
        kinds.extend([UnderControl::OnDemandServing, UnderControl::WildcardServing]);
    }
    let mut rss_mib: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for round in 0..args.rounds {
        let lab = Lab::new("bxc")?;
        let cns = lab.netns("control")?;
        let ca_dir = lab.dir.path().join("ca");
        ambit_identity::CertificateAuthority::ephemeral("cluster.local")?
            .write_plugin_dir(&ca_dir)?;
        let listen: std::net::SocketAddr =
            ([127, 0, 0, 1], ambit_netns_lab::control::CONTROL_PORT).into();
        let mut control = ambit_netns_lab::control::ControlPlane::prepare(
            &lab,
            &cns,
            listen,
            &args.ambit,
            &ca_dir,
            &["node0"],
            "workloads: []\n",
        )?;
        // The mesh in several files, as the fan-out mode writes it (a file is bounded).
        write_mesh(&control.mesh_dir)?;
        control.start(&lab)?;
        // Each round starts with the next kind: none always goes first.
        for k in 0..kinds.len() {
            let at = (k + round) % kinds.len();
            let (rss, ready_ms) = proxy_under_control(args, &lab, &control, kinds[at])?;
            eprintln!(
                "round {}/{}: {}: ready in {ready_ms:.0} ms, RSS {:.1} MiB",
                round + 1,
                args.rounds,
                kinds[at].name(),
                rss as f64 / 1024.0
            );
            rss_mib[at].push(rss as f64 / 1024.0);
        }
        control.stop(&lab)?;
    }
    let mut out = String::new();
    writeln!(
        out,
        "### A node proxy under `ambit control`: {} workloads, {} services; {} rounds, interleaved\n",
        mesh_workloads(),
        mesh_services(),
        args.rounds
    )?;
    writeln!(out, "| figure | median (spread) |\n|---|---|")?;
    for (kind, rss) in kinds.iter().zip(&rss_mib) {
        let what = match kind {
            UnderControl::Wildcard => "RSS 10 s after ready, wildcard (MiB)".to_string(),
            UnderControl::OnDemandIdle => "RSS 10 s after ready, on demand (MiB)".to_string(),
            UnderControl::OnDemandServing => format!(
                "RSS 10 s after connections to {} distinct destinations, on demand (MiB)",
                args.destinations
            ),
            UnderControl::WildcardServing => format!(
                "RSS 10 s after connections to {} distinct destinations, wildcard (MiB)",
                args.destinations
            ),
        };
        writeln!(out, "| {what} | {} |", median_spread(rss))?;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Fan-out mode: `ambit control` and many clients.

fn workload_yaml(i: usize, revision: &str) -> String {
    let mut s = format!(
        "- uid: {uid}\n  name: w{i}\n  namespace: {ns}\n  serviceAccount: default\n  \
         trustDomain: cluster.local\n  clusterId: Kubernetes\n  workloadIps: [\"{ip}\"]\n  \
         protocol: HBONE\n  node: node{node}\n  canonicalName: w{i}\n  canonicalRevision: \
         {revision}\n  workloadName: w{i}\n  workloadType: pod\n  services:\n",
        uid = workload_uid(i),
        ns = ns_of(i),
        ip = workload_ip(i),
        node = i % NODES,
    );
    for j in services_of(i) {
        let _ = write!(s, "    {}/{}:\n      80: 8080\n", ns_of(j), service_host(j));
    }
    s
}

const WORKLOAD_FILES: usize = 10;

fn workload_file(k: usize, changed: Option<(usize, &str)>) -> String {
    let mut s = String::from("workloads:\n");
    for i in (0..mesh_workloads()).filter(|i| i % WORKLOAD_FILES == k) {
        let rev = match changed {
            Some((c, rev)) if c == i => rev,
            _ => "v1",
        };
        s.push_str(&workload_yaml(i, rev));
    }
    s
}

fn write_mesh(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for k in 0..WORKLOAD_FILES {
        std::fs::write(
            dir.join(format!("workloads-{k}.yaml")),
            workload_file(k, None),
        )?;
    }
    std::fs::write(dir.join("services.yaml"), services_yaml())?;
    Ok(())
}

fn services_yaml() -> String {
    let mut s = String::from("services:\n");
    for j in 0..mesh_services() {
        let _ = write!(
            s,
            "- name: svc{j}\n  namespace: {ns}\n  hostname: {host}\n  vips: [\"/{vip}\"]\n  \
             ports:\n    80: 8080\n",
            ns = ns_of(j),
            host = service_host(j),
            vip = service_vip(j),
        );
    }
    s
}

/// What a client saw: (client, type URL, resource names, when).
struct Seen {
    client: usize,
    type_url: String,
    names: Vec<String>,
    at: Instant,
}

fn node(c: usize) -> Node {
    let string = |s: String| prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue(s)),
    };
    let fields: BTreeMap<String, prost_types::Value> = [
        ("NAME", format!("ztunnel-{c}")),
        ("NAMESPACE", "istio-system".to_string()),
        (
            "INSTANCE_IPS",
            format!("10.250.{}.{}", c / 250, c % 250 + 1),
        ),
        ("NODE_NAME", format!("node{c}")),
        ("CLUSTER_ID", "Kubernetes".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), string(v)))
    .collect();
    Node {
        id: format!(
            "ztunnel~10.250.{}.{}~ztunnel-{c}.istio-system~istio-system.svc.cluster.local",
            c / 250,
            c % 250 + 1
        ),
        metadata: Some(prost_types::Struct { fields }),
        ..Default::default()
    }
}

async fn fanout_client(
    c: usize,
    channel: ambit_grpc::GrpcChannel,
    seen: mpsc::UnboundedSender<Seen>,
) -> anyhow::Result<()> {
    // Opened again after a refusal or a timeout, as a node proxy reconnects: a thousand
    // clients at once outrun the handshakes two cores can make within a connect timeout.
    let mut attempt = 0;
    let (tx, mut responses) = loop {
        attempt += 1;
        let (tx, rx) = mpsc::unbounded_channel();
        for type_url in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
            tx.send(DeltaDiscoveryRequest {
                node: Some(node(c)),
                type_url: type_url.into(),
                ..Default::default()
            })?;
        }
        let mut client = AggregatedDiscoveryServiceClient::new(channel.channel()?)
            .max_decoding_message_size(MAX_XDS_MESSAGE);
        match client
            .delta_aggregated_resources(channel.request(receiver_stream(rx))?)
            .await
        {
            Ok(r) => break (tx, r.into_inner()),
            Err(_) if attempt < 30 => tokio::time::sleep(Duration::from_millis(500)).await,
            Err(e) => return Err(e).with_context(|| format!("client {c}: opening the stream")),
        }
    };
    while let Some(r) = responses
        .message()
        .await
        .with_context(|| format!("client {c}: the stream failed"))?
    {
        let at = Instant::now();
        tx.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })?;
        let _ = seen.send(Seen {
            client: c,
            type_url: r.type_url,
            names: r.resources.into_iter().map(|x| x.name).collect(),
            at,
        });
    }
    Ok(())
}

struct FanoutRound {
    first_ms: f64,
    last_ms: f64,
    p50_ms: f64,
    spread_ms: f64,
    named: usize,
}

fn fanout(args: &Args) -> anyhow::Result<String> {
    let lab = Lab::new("bxds-fan")?;
    let ns = lab.netns("control")?;
    let ca_dir = lab.dir.path().join("ca");
    ambit_identity::CertificateAuthority::ephemeral("cluster.local")?.write_plugin_dir(&ca_dir)?;
    let mesh = lab.dir.path().join("mesh");
    write_mesh(&mesh)?;
    let tokens = lab.dir.path().join("tokens.yaml");
    let mut t = String::new();
    for c in 0..args.clients {
        let _ = writeln!(t, "- token: tok-{c}\n  node: node{}", c % NODES);
    }
    std::fs::write(&tokens, t)?;
    // The tokens are secrets: the control server asks for an owner-only file.
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let listen = format!("127.0.0.1:{XDS_PORT}");
    let argv: Vec<String> = vec![
        "control".into(),
        "--mesh".into(),
        mesh.display().to_string(),
        "--ca".into(),
        ca_dir.display().to_string(),
        "--tokens".into(),
        tokens.display().to_string(),
        "--listen".into(),
        listen.clone(),
        "--serving-name".into(),
        XDS_NAME.into(),
        // Every client comes from 127.0.0.1 here, where a cluster's nodes each have their
        // own address: the per-source share must hold them all.
        "--max-per-source".into(),
        args.clients.max(256).to_string(),
    ];
    let argv_ref: Vec<&str> = argv.iter().map(String::as_str).collect();
    let root = ca_dir.join(ambit_identity::ca::ROOT_CERT_FILE);
    let lab_ref = &lab;
    let ns_ref = ns.as_str();
    let rounds = in_netns_async(&ns, async move {
        let proc = lab_ref.spawn(
            ns_ref,
            "control",
            &args.ambit,
            &argv_ref,
            &[("RUST_LOG", "info".to_string())],
        )?;
        let fail = |what: &str| {
            anyhow::anyhow!(
                "ambit control {what}; its log ends:\n{}",
                log_tail(&proc.log)
            )
        };
        let deadline = Instant::now() + CONNECT_GUARD;
        while TcpStream::connect(&listen).await.is_err() {
            if !lab_ref.is_running(proc.pid) || Instant::now() > deadline {
                return Err(fail("did not listen"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
        let started = Instant::now();
        for c in 0..args.clients {
            let channel = ambit_grpc::GrpcChannel::new(ambit_grpc::ChannelConfig {
                server_identity: None,
                address: format!("https://{listen}"),
                root: ambit_grpc::RootCa::File(root.clone()),
                alt_hostname: Some(XDS_NAME.into()),
                token: ambit_grpc::Token::Literal(format!("tok-{c}")),
                cluster_id: "Kubernetes".into(),
                headers: Vec::new(),
            })?;
            let seen = seen_tx.clone();
            tokio::spawn(async move {
                if let Err(e) = fanout_client(c, channel, seen).await {
                    eprintln!("{e:#}");
                }
            });
        }
        drop(seen_tx);
        // Initial syncs: every client has a response of each type.
        let mut synced: Vec<HashSet<String>> = vec![HashSet::new(); args.clients];
        let mut done = 0;
        while done < args.clients {
            let s = tokio::time::timeout(CONNECT_GUARD * 3, seen_rx.recv())
                .await
                .map_err(|_| fail(&format!("synced only {done} clients")))?
                .ok_or_else(|| fail("lost every client"))?;
            if synced[s.client].insert(s.type_url) && synced[s.client].len() == 2 {
                done += 1;
            }
        }
        let sync_ms = started.elapsed().as_secs_f64() * 1e3;
        eprintln!("{} clients synced in {sync_ms:.0} ms", args.clients);
        let mut results = Vec::new();
        for round in 0..args.rounds {
            tokio::time::sleep(Duration::from_secs(1)).await;
            while seen_rx.try_recv().is_ok() {}
            let changed = updated_workload(round);
            let file = changed % WORKLOAD_FILES;
            let rev = format!("r{round}");
            let text = workload_file(file, Some((changed, &rev)));
            // Written beside and renamed over, so the server never reads half a file.
            let tmp = mesh.join(format!(".workloads-{file}.tmp"));
            std::fs::write(&tmp, text)?;
            let t_change = Instant::now();
            std::fs::rename(&tmp, mesh.join(format!("workloads-{file}.yaml")))?;
            let uid = workload_uid(changed);
            let mut arrivals: Vec<Option<(Instant, bool)>> = vec![None; args.clients];
            let mut got = 0;
            while got < args.clients {
                let s = match tokio::time::timeout(CONNECT_GUARD, seen_rx.recv()).await {
                    Ok(Some(s)) => s,
                    _ => return Err(fail(&format!("delivered the change to {got} clients"))),
                };
                if s.type_url == ADDRESS_TYPE && arrivals[s.client].is_none() {
                    arrivals[s.client] = Some((s.at, s.names.iter().any(|n| n == &uid)));
                    got += 1;
                }
            }
            let ms: Vec<f64> = arrivals
                .iter()
                .flatten()
                .map(|(at, _)| (*at - t_change).as_secs_f64() * 1e3)
                .collect();
            let named = arrivals.iter().flatten().filter(|(_, n)| *n).count();
            let r = FanoutRound {
                first_ms: min(&ms),
                last_ms: max(&ms),
                p50_ms: pct(&ms, 50.0),
                spread_ms: max(&ms) - min(&ms),
                named,
            };
            eprintln!(
                "change {round}: first {:.1} ms, last {:.1} ms after the file change",
                r.first_ms, r.last_ms
            );
            results.push(r);
        }
        Ok((sync_ms, results))
    })?;
    let (sync_ms, rounds) = rounds;
    let mut out = String::new();
    writeln!(
        out,
        "### `ambit control` fan-out: {} clients, {} workloads, \
         {} services; {} changes\n",
        args.clients,
        mesh_workloads(),
        mesh_services(),
        args.rounds
    )?;
    writeln!(out, "| figure | median (spread) |\n|---|---|")?;
    writeln!(
        out,
        "| connect → all {} initial syncs (ms) | {} |",
        args.clients,
        fmt(sync_ms)
    )?;
    let rows: [Figure<FanoutRound>; 5] = [
        ("file change → first delta (ms)", |r| r.first_ms),
        ("file change → median client (ms)", |r| r.p50_ms),
        ("file change → last delta (ms)", |r| r.last_ms),
        ("first → last arrival (ms)", |r| r.spread_ms),
        ("clients whose delta named the workload", |r| r.named as f64),
    ];
    for (name, f) in rows {
        let v: Vec<f64> = rounds.iter().map(f).collect();
        writeln!(out, "| {name} | {} |", median_spread(&v))?;
    }
    writeln!(
        out,
        "\nEach change rewrites one of {WORKLOAD_FILES} workload files (written beside, renamed \
         over) to change one workload's canonicalRevision; a client's arrival is its first \
         Address response after the rename."
    )?;
    drop(lab);
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Small statistics.

/// A row of a report: its name and how one round's value is read.
type Figure<R> = (&'static str, fn(&R) -> f64);

/// Nearest-rank percentile, except the 50th, which is the true median (the mean of the
/// middle two for an even count); 0 for no values.
fn pct(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    if p == 50.0 {
        stats::median(values)
    } else {
        stats::percentile(values, p)
    }
}

fn min(values: &[f64]) -> f64 {
    stats::spread(values).0
}

fn max(values: &[f64]) -> f64 {
    stats::spread(values).1
}

/// A figure as the tables show it: the median and, in brackets, the lowest and highest.
fn median_spread(v: &[f64]) -> String {
    format!("{} ({}–{})", fmt(pct(v, 50.0)), fmt(min(v)), fmt(max(v)))
}

fn fmt(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}
