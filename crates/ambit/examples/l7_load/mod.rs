//! Load for the L7 lab's benchmarks (`bench_waypoint`, `bench_routes`): closed-loop
//! HTTP/1.1 or HTTP/2 requests/s, paced latency samples, and medians with their spread
//! (`ambit_netns_lab::stats`).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambit_netns_lab::l7::{L7Lab, DIRECT_HOST, DIRECT_VIP};
use ambit_netns_lab::mesh::{SERVICE_HOST, SERVICE_PORT, SERVICE_VIP};
use ambit_netns_lab::stats::{median, percentile, spread};
use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The paths measured.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Path {
    Waypoint,
    Direct,
    /// Through the bare reverse proxy (the design's ceiling) where the waypoint stands.
    #[allow(dead_code)] // only `bench_waypoint` starts a bare proxy
    Bare,
    /// Another service of the lab, on port 80 of `vip`.
    #[allow(dead_code)] // only `bench_waypoint --nginx` adds services
    Other {
        vip: Ipv4Addr,
        host: &'static str,
    },
}

/// The bare proxy's service (its pod's address is `bench_waypoint`'s).
pub const BARE_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 14);
pub const BARE_HOST: &str = "echo-bare.default.svc.cluster.local";

impl Path {
    pub fn dst(self) -> SocketAddr {
        match self {
            Path::Waypoint => SocketAddr::from((SERVICE_VIP, SERVICE_PORT)),
            Path::Direct => SocketAddr::from((DIRECT_VIP, SERVICE_PORT)),
            Path::Bare => SocketAddr::from((BARE_VIP, SERVICE_PORT)),
            Path::Other { vip, .. } => SocketAddr::from((vip, SERVICE_PORT)),
        }
    }
    pub fn host(self) -> &'static str {
        match self {
            Path::Waypoint => SERVICE_HOST,
            Path::Direct => DIRECT_HOST,
            Path::Bare => BARE_HOST,
            Path::Other { host, .. } => host,
        }
    }
}

pub fn request(path: Path, body: &Bytes) -> http::Request<Full<Bytes>> {
    shaped(path, Shape::Post, body)
}

/// What each request of a load is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Shape {
    /// `POST /bench` with a 1 KiB body (every figure of `bench_waypoint` and `bench_routes`).
    Post,
    /// `GET /bench`, no body.
    #[allow(dead_code)] // only `bench_waypoint --nginx` sends them
    Get,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::Post => "POST 1 KiB",
            Shape::Get => "GET",
        }
    }
}

/// A request of `shape` to `path`'s service (`body` for a POST).
pub fn shaped(path: Path, shape: Shape, body: &Bytes) -> http::Request<Full<Bytes>> {
    let (method, body) = match shape {
        Shape::Post => ("POST", body.clone()),
        Shape::Get => ("GET", Bytes::new()),
    };
    http::Request::builder()
        .method(method)
        .uri(format!("http://{}:{SERVICE_PORT}/bench", path.host()))
        .header("host", format!("{}:{SERVICE_PORT}", path.host()))
        .body(Full::new(body))
        .expect("a valid request")
}

/// A client connection to `path`'s service, as HTTP clients make them (curl, h2load, Envoy):
/// with `TCP_NODELAY`, so that a request written in two parts (an HTTP/2 POST's HEADERS,
/// then its DATA) does not wait for the peer's delayed ACK (40 ms) in between.
fn client(lab: &L7Lab, path: Path) -> anyhow::Result<tokio::net::TcpStream> {
    let io = lab.connect_to(path.dst())?;
    io.set_nodelay(true)?;
    Ok(io)
}

/// Closed-loop load for `secs`: HTTP/1.1 over `conns` connections, or HTTP/2 (h2c, prior
/// knowledge) over `conns` connections with `streams` concurrent requests on each.
/// Returns completed requests/s.
pub fn load(
    lab: &L7Lab,
    path: Path,
    h2: bool,
    conns: usize,
    streams: usize,
    secs: u64,
) -> anyhow::Result<f64> {
    load_as(lab, path, Shape::Post, h2, conns, streams, secs)
}

/// [`load`] with requests of `shape`.
pub fn load_as(
    lab: &L7Lab,
    path: Path,
    shape: Shape,
    h2: bool,
    conns: usize,
    streams: usize,
    secs: u64,
) -> anyhow::Result<f64> {
    let body = Bytes::from(vec![b'x'; 1024]);
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut streams_io = Vec::new();
    for _ in 0..conns {
        streams_io.push(client(lab, path)?);
    }
    let start = Instant::now();
    lab.rt
        .block_on(async {
            let mut tasks = Vec::new();
            for io in streams_io {
                if h2 {
                    let (sender, conn) = hyper::client::conn::http2::handshake(
                        TokioExecutor::new(),
                        TokioIo::new(io),
                    )
                    .await?;
                    tokio::spawn(conn);
                    for _ in 0..streams {
                        let (mut sender, done, body) = (sender.clone(), done.clone(), body.clone());
                        tasks.push(tokio::spawn(async move {
                            while Instant::now() < deadline {
                                let r = sender.send_request(shaped(path, shape, &body)).await?;
                                anyhow::ensure!(r.status() == 200, "status {}", r.status());
                                r.into_body().collect().await?;
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(())
                        }));
                    }
                } else {
                    let (mut sender, conn) =
                        hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
                    tokio::spawn(conn);
                    let (done, body) = (done.clone(), body.clone());
                    tasks.push(tokio::spawn(async move {
                        while Instant::now() < deadline {
                            sender.ready().await?;
                            let r = sender.send_request(shaped(path, shape, &body)).await?;
                            anyhow::ensure!(r.status() == 200, "status {}", r.status());
                            r.into_body().collect().await?;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(())
                    }));
                }
            }
            for t in tasks {
                t.await??;
            }
            anyhow::Ok(())
        })
        .with_context(|| {
            let proto = if h2 { "h2c" } else { "HTTP/1.1" };
            format!(
                "closed-loop {proto} load ({}) to {} after {:.1} s, {} requests answered",
                shape.name(),
                path.host(),
                start.elapsed().as_secs_f64(),
                done.load(Ordering::Relaxed)
            )
        })?;
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// Requests paced at `rate`/s over `conns` HTTP/1.1 connections for `secs`: each
/// request's latency.
pub fn paced(
    lab: &L7Lab,
    path: Path,
    rate: u64,
    conns: usize,
    secs: u64,
) -> anyhow::Result<Vec<Duration>> {
    paced_as(lab, path, Shape::Post, rate, conns, secs)
}

/// [`paced`] with requests of `shape`.
pub fn paced_as(
    lab: &L7Lab,
    path: Path,
    shape: Shape,
    rate: u64,
    conns: usize,
    secs: u64,
) -> anyhow::Result<Vec<Duration>> {
    let body = Bytes::from(vec![b'x'; 1024]);
    let mut ios = Vec::new();
    for _ in 0..conns {
        ios.push(client(lab, path)?);
    }
    lab.rt
        .block_on(async {
            let mut tasks = Vec::new();
            let per_conn = Duration::from_secs_f64(conns as f64 / rate as f64);
            let count = rate * secs / conns as u64;
            for (i, io) in ios.into_iter().enumerate() {
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
                tokio::spawn(conn);
                let body = body.clone();
                tasks.push(tokio::spawn(async move {
                    // Staggered so the connections' requests interleave evenly.
                    tokio::time::sleep(per_conn.mul_f64(i as f64 / conns as f64)).await;
                    let mut tick = tokio::time::interval(per_conn);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    let mut samples = Vec::with_capacity(count as usize);
                    for _ in 0..count {
                        tick.tick().await;
                        let t = Instant::now();
                        sender.ready().await?;
                        let r = sender.send_request(shaped(path, shape, &body)).await?;
                        anyhow::ensure!(r.status() == 200, "status {}", r.status());
                        r.into_body().collect().await?;
                        samples.push(t.elapsed());
                    }
                    Ok(samples)
                }));
            }
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await??);
            }
            anyhow::Ok(all)
        })
        .with_context(|| {
            format!(
                "{rate} requests/s ({}) to {} on {conns} connections",
                shape.name(),
                path.host()
            )
        })
}

/// The p50 (the true median) and the p99 (nearest rank) of latency samples, in µs.
pub fn p50_p99(samples: &[Duration]) -> (f64, f64) {
    let us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    (median(&us), percentile(&us, 99.0))
}

/// A figure over rounds: the median, (lowest–highest).
pub fn fmt(v: &[f64], unit: &str, digits: usize) -> String {
    let (lo, hi) = spread(v);
    format!(
        "{:.*} ({:.*}–{:.*}) {unit}",
        digits,
        median(v),
        digits,
        lo,
        digits,
        hi
    )
}
