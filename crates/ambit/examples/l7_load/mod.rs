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
    http::Request::builder()
        .method("POST")
        .uri(format!("http://{}:{SERVICE_PORT}/bench", path.host()))
        .header("host", format!("{}:{SERVICE_PORT}", path.host()))
        .body(Full::new(body.clone()))
        .expect("a valid request")
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
    let body = Bytes::from(vec![b'x'; 1024]);
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut streams_io = Vec::new();
    for _ in 0..conns {
        streams_io.push(lab.connect_to(path.dst())?);
    }
    let start = Instant::now();
    lab.rt.block_on(async {
        let mut tasks = Vec::new();
        for io in streams_io {
            if h2 {
                let (sender, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
                        .await?;
                tokio::spawn(conn);
                for _ in 0..streams {
                    let (mut sender, done, body) = (sender.clone(), done.clone(), body.clone());
                    tasks.push(tokio::spawn(async move {
                        while Instant::now() < deadline {
                            let r = sender.send_request(request(path, &body)).await?;
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
                        let r = sender.send_request(request(path, &body)).await?;
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
    let body = Bytes::from(vec![b'x'; 1024]);
    let mut ios = Vec::new();
    for _ in 0..conns {
        ios.push(lab.connect_to(path.dst())?);
    }
    lab.rt.block_on(async {
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
                    let r = sender.send_request(request(path, &body)).await?;
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
