//! `ambit control --kubernetes` at scale, on loopback: the test API server (in this
//! process) holds N namespaces, each with a waypoint Gateway, a Service labelled to use it,
//! P AuthorizationPolicies on the Gateway and R HTTPRoutes on the Service; a file-mode
//! `ambit control` stands in for istiod's CA. Measured, over interleaved rounds (a fresh
//! control server each): the time from start to ready (every watch listed), its RSS once
//! ready and its peak, what one waypoint is served (its own objects only), and the time
//! from a policy's update through the API (as `kubectl apply` sends it) to the change on a
//! connected waypoint's stream, p50 and p99 over U updates.
//!
//! bench_control_kubernetes --ambit target/release/ambit --out FILE
//!     [--rounds 3] [--namespaces 1000] [--policies 10] [--routes 10] [--updates 200]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ambit_fake_apiserver::{namespace, ApiServer, Resource, ServerOptions, User};
use ambit_grpc::{ChannelConfig, GrpcChannel, RootCa, Token};
use ambit_identity::SpiffeId;
use ambit_netns_lab::stats::{median, percentile, spread};
use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_proto::{DeltaDiscoveryRequest, WAYPOINT_POLICY_TYPE, WAYPOINT_ROUTE_TYPE};
use anyhow::{bail, Context};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream_wrapper::ReceiverStream;

mod tokio_stream_wrapper {
    //! A receiver as a stream (tokio-stream is not among this crate's dependencies).
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub struct ReceiverStream<T>(pub tokio::sync::mpsc::Receiver<T>);

    impl<T> futures_util::Stream for ReceiverStream<T> {
        type Item = T;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
            self.0.poll_recv(cx)
        }
    }
}

struct Args {
    ambit: PathBuf,
    out: PathBuf,
    rounds: usize,
    namespaces: usize,
    policies: usize,
    routes: usize,
    updates: usize,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        ambit: PathBuf::from("target/release/ambit"),
        out: PathBuf::from("target/bench-control-kubernetes.md"),
        rounds: 3,
        namespaces: 1000,
        policies: 10,
        routes: 10,
        updates: 200,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut v = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--ambit" => a.ambit = v()?.into(),
            "--out" => a.out = v()?.into(),
            "--rounds" => a.rounds = v()?.parse()?,
            "--namespaces" => a.namespaces = v()?.parse()?,
            "--policies" => a.policies = v()?.parse()?,
            "--routes" => a.routes = v()?.parse()?,
            "--updates" => a.updates = v()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

fn policy(ns: usize, i: usize, methods: &[&str]) -> serde_json::Value {
    json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": format!("p{i}"), "namespace": format!("ns{ns}")},
        "spec": {
            "targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "waypoint"}],
            "action": "ALLOW",
            "rules": [{"from": [{"source": {"principals": [format!("cluster.local/ns/ns{ns}/sa/client{i}")]}}],
                       "to": [{"operation": {"methods": methods, "paths": [format!("/api/{i}/*")]}}]}],
        },
    })
}

fn route(ns: usize, i: usize) -> serde_json::Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": format!("r{i}"), "namespace": format!("ns{ns}")},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "app", "port": 80}],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": format!("/r{i}")}}],
                       "backendRefs": [{"name": "app", "port": 80}]}],
        },
    })
}

fn populate(api: &ApiServer, a: &Args) -> anyhow::Result<()> {
    for ns in 0..a.namespaces {
        api.create(namespace(&format!("ns{ns}"), &[]))?;
        api.create(
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "waypoint", "namespace": format!("ns{ns}")},
            "spec": {"gatewayClassName": "istio-waypoint", "listeners": []}}),
        )?;
        api.create(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "app", "namespace": format!("ns{ns}"),
                         "labels": {"istio.io/use-waypoint": "waypoint"}},
            "spec": {"ports": [{"port": 80}]}}))?;
        for i in 0..a.policies {
            api.create(policy(ns, i, &["GET"]))?;
        }
        for i in 0..a.routes {
            api.create(route(ns, i))?;
        }
    }
    Ok(())
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn memory(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn get(addr: SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_whitespace().nth(1)?.parse().ok()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The stand-in for istiod's CA: a file-mode control server with a token for the
/// control server's identity.
fn start_ca(a: &Args, dir: &std::path::Path) -> anyhow::Result<(Killed, SocketAddr)> {
    std::fs::create_dir_all(dir.join("mesh"))?;
    std::fs::write(dir.join("mesh/mesh.yaml"), "workloads: []\n")?;
    std::fs::write(
        dir.join("tokens.yaml"),
        "- token: bench-ca-token\n  identity: spiffe://cluster.local/ns/istio-system/sa/ambit-control\n",
    )?;
    std::fs::write(dir.join("ca-token"), "bench-ca-token")?;
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let child = Command::new(&a.ambit)
        .arg("control")
        .arg("--mesh")
        .arg(dir.join("mesh"))
        .arg("--ca")
        .arg(dir.join("ca"))
        .arg("--tokens")
        .arg(dir.join("tokens.yaml"))
        .args([
            "--listen",
            &listen.to_string(),
            "--admin",
            &admin.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let child = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(admin, "/ready") != Some(200) {
        if Instant::now() > deadline {
            bail!("the CA stand-in did not become ready");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((child, listen))
}

struct Round {
    ready: Duration,
    rss_kib: u64,
    peak_kib: u64,
    served: (usize, usize),
    latencies: Vec<Duration>,
}

async fn round(
    a: &Args,
    api: &ApiServer,
    dir: &std::path::Path,
    ca: SocketAddr,
) -> anyhow::Result<Round> {
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let monitoring = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let started = Instant::now();
    let child = Command::new(&a.ambit)
        .args(["control", "--kubernetes", "--kubeconfig"])
        .arg(dir.join("kubeconfig"))
        .args([
            "--listen",
            &listen.to_string(),
            "--admin",
            &admin.to_string(),
            "--monitoring",
            &monitoring.to_string(),
        ])
        .env("CA_ADDRESS", format!("https://{ca}"))
        .env("CA_ROOT_CA", dir.join("ca/root-cert.pem"))
        .env("AUTH_TOKEN", dir.join("ca-token"))
        .env(
            "RUST_LOG",
            std::env::var("BENCH_CONTROL_RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(match std::env::var_os("BENCH_CONTROL_LOG") {
            Some(path) => Stdio::from(std::fs::File::create(path)?),
            None => Stdio::null(),
        })
        .stderr(Stdio::null())
        .spawn()?;
    let child = Killed(child);
    let pid = child.0.id();
    while get(monitoring, "/ready") != Some(200) {
        if started.elapsed() > Duration::from_secs(300) {
            bail!("ambit control --kubernetes was not ready within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ready = started.elapsed();
    // Settled: what it holds, not what loading left in flight.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_kib, _) = memory(pid)?;

    // One waypoint's stream (namespace ns0), both types.
    let channel = GrpcChannel::new(ChannelConfig {
        server_identity: Some(SpiffeId::parse(
            "spiffe://cluster.local/ns/istio-system/sa/ambit-control",
        )?),
        address: format!("https://{listen}"),
        root: RootCa::File(dir.join("ca/root-cert.pem")),
        alt_hostname: None,
        token: Token::Literal("wp0".into()),
        cluster_id: "Kubernetes".into(),
        headers: Vec::new(),
    })?;
    let (tx, rx) = mpsc::channel(16);
    for type_url in [WAYPOINT_POLICY_TYPE, WAYPOINT_ROUTE_TYPE] {
        tx.send(DeltaDiscoveryRequest {
            type_url: type_url.into(),
            ..Default::default()
        })
        .await?;
    }
    let mut client = AggregatedDiscoveryServiceClient::new(channel.channel()?);
    let mut stream = client
        .delta_aggregated_resources(channel.request(ReceiverStream(rx))?)
        .await?
        .into_inner();
    let mut served = (0, 0);
    for _ in 0..2 {
        let r = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await??
            .context("the stream ended")?;
        match r.type_url.as_str() {
            WAYPOINT_POLICY_TYPE => served.0 = r.resources.len(),
            _ => served.1 = r.resources.len(),
        }
        tx.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .await?;
    }
    // Updates of one of its policies, one at a time, each timed to its arrival.
    let mut latencies = Vec::with_capacity(a.updates);
    for u in 0..a.updates {
        let methods: Vec<String> = vec!["GET".into(), format!("X{u}")];
        let sent = Instant::now();
        api.update(Resource::AuthorizationPolicies, Some("ns0"), "p0", |p| {
            p["spec"]["rules"][0]["to"][0]["operation"]["methods"] = json!(methods);
        })?;
        loop {
            let r = tokio::time::timeout(Duration::from_secs(30), stream.message())
                .await??
                .context("the stream ended")?;
            tx.send(DeltaDiscoveryRequest {
                type_url: r.type_url.clone(),
                response_nonce: r.nonce.clone(),
                ..Default::default()
            })
            .await?;
            let mark = format!("X{u}");
            if r.resources.iter().any(|res| {
                res.resource
                    .as_ref()
                    .is_some_and(|any| String::from_utf8_lossy(&any.value).contains(&mark))
            }) {
                break;
            }
        }
        latencies.push(sent.elapsed());
    }
    let (_, peak_kib) = memory(pid)?;
    drop(child);
    Ok(Round {
        ready,
        rss_kib,
        peak_kib,
        served,
        latencies,
    })
}

fn millis(v: &[Duration]) -> Vec<f64> {
    v.iter().map(|d| d.as_secs_f64() * 1000.0).collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let dir = tempfile_dir()?;
    let api = ApiServer::start(ServerOptions::default()).await?;
    let control_token = "bench-control";
    api.add_token(
        control_token,
        User::service_account("istio-system", "ambit-control"),
    );
    api.add_token_with_audiences(
        "wp0",
        User::service_account("ns0", "waypoint"),
        &["istio-ca"],
    );
    std::fs::write(dir.join("kubeconfig"), api.kubeconfig(control_token))?;
    let loaded = Instant::now();
    populate(&api, &a)?;
    eprintln!(
        "{} namespaces, {} policies, {} routes created in {:?}",
        a.namespaces,
        a.namespaces * a.policies,
        a.namespaces * a.routes,
        loaded.elapsed()
    );
    let (_ca, ca) = start_ca(&a, &dir)?;
    let mut rounds = Vec::new();
    for r in 0..a.rounds {
        let one = round(&a, &api, &dir, ca).await?;
        eprintln!(
            "round {}: ready {:?}, RSS {} KiB (peak {}), served {:?}",
            r + 1,
            one.ready,
            one.rss_kib,
            one.peak_kib,
            one.served
        );
        rounds.push(one);
    }
    let mib = |k: u64| k as f64 / 1024.0;
    let fig = |f: &dyn Fn(&Round) -> f64| {
        let v: Vec<f64> = rounds.iter().map(f).collect();
        let (lo, hi) = spread(&v);
        (median(&v), lo, hi)
    };
    let ready = fig(&|r| r.ready.as_secs_f64());
    let rss = fig(&|r| mib(r.rss_kib));
    let peak = fig(&|r| mib(r.peak_kib));
    let p50 = fig(&|r| median(&millis(&r.latencies)));
    let p99 = fig(&|r| percentile(&millis(&r.latencies), 99.0));
    let served = rounds.first().map_or((0, 0), |r| r.served);
    let table = format!(
        "### ambit control --kubernetes at scale\n\n\
         {} namespaces, each with a waypoint Gateway, a Service using it, {} AuthorizationPolicies and {} HTTPRoutes ({} + {} objects); {} rounds, a fresh server each, medians (spread).\n\n\
         | figure | median | spread |\n|---|---:|---|\n\
         | start to ready (every watch listed) | {:.2} s | {:.2}–{:.2} |\n\
         | RSS, ready and settled | {:.1} MiB | {:.1}–{:.1} |\n\
         | RSS peak (load and {} updates) | {:.1} MiB | {:.1}–{:.1} |\n\
         | a policy update through the API to a connected waypoint, p50 | {:.1} ms | {:.1}–{:.1} |\n\
         | the same, p99 ({} updates a round) | {:.1} ms | {:.1}–{:.1} |\n\n\
         One waypoint (namespace ns0) was served {} policies and {} routes: its own.\n",
        a.namespaces,
        a.policies,
        a.routes,
        a.namespaces * a.policies,
        a.namespaces * a.routes,
        a.rounds,
        ready.0, ready.1, ready.2,
        rss.0, rss.1, rss.2,
        a.updates,
        peak.0, peak.1, peak.2,
        p50.0, p50.1, p50.2,
        a.updates,
        p99.0, p99.1, p99.2,
        served.0,
        served.1,
    );
    println!("{table}");
    std::fs::write(&a.out, &table)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("bench-control-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
