//! In-process HBONE micro-benchmarks on loopback, with a direct TCP baseline in the same run.
//!
//! Real mutual TLS 1.3 (certificates from an ephemeral CA, the rustls configs the node proxy
//! uses), real HTTP/2 CONNECT through [`ambit_hbone::Pool`] and
//! [`ambit_hbone::serve_connection`], one tokio runtime with two workers holding both ends.
//!
//! Groups (see BENCHMARKS.md for what each figure means):
//! - `throughput`: 64 MiB client→server per iteration, over 1 stream and over 8 concurrent
//!   streams (HBONE: 8 streams on one pooled connection; TCP: 8 connections);
//! - `connections`: per iteration a NEW connection (HBONE: TCP + TLS + HTTP/2 handshakes and
//!   a CONNECT, no pooling), one 1-byte exchange, close; `hbone_pooled_stream` opens a new
//!   CONNECT stream on an existing pooled connection instead;
//! - `latency`: one 1 KiB request/response on a reused connection.
//!
//! Run with `cargo bench -p ambit-hbone` (about 1.5 minutes). Timings live here and in
//! BENCHMARKS.md, never in tests.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ambit_hbone::{
    parse_authority, tls, ClientSettings, ConnectRequest, H2Settings, H2Stream, IncomingConnect,
    Pool, PoolKey,
};
use ambit_identity::{CertificateAuthority, SpiffeId};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::watch;

const MIB: usize = 1024 * 1024;
/// Bytes moved per throughput iteration.
const TRANSFER: usize = 64 * MIB;
/// Application write size (the node proxy reads up to this much from its TCP side).
const CHUNK: usize = 256 * 1024;
/// Request/response size of the latency group.
const RR_SIZE: usize = 1024;

/// What the server does with a stream or connection, chosen by the CONNECT authority's port
/// (HBONE) or by the listener (TCP).
#[derive(Clone, Copy)]
enum App {
    /// Reads to EOF, answers the byte count (8 bytes, big endian), closes.
    Sink,
    /// Reads one byte, writes it back, closes (the server closes first, so TIME_WAIT stays
    /// on the server side and the client's ports are not used up).
    OneShot,
    /// Writes back what it reads until EOF.
    Echo,
}

const SINK_PORT: u16 = 1;
const ONESHOT_PORT: u16 = 2;
const ECHO_PORT: u16 = 3;

impl App {
    fn from_port(port: u16) -> App {
        match port {
            SINK_PORT => App::Sink,
            ONESHOT_PORT => App::OneShot,
            _ => App::Echo,
        }
    }

    async fn serve<S: AsyncRead + AsyncWrite + Unpin>(self, mut s: S) -> std::io::Result<()> {
        match self {
            App::Sink => {
                let mut buf = vec![0u8; CHUNK];
                let mut total = 0u64;
                loop {
                    let n = s.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                s.write_all(&total.to_be_bytes()).await?;
                s.shutdown().await
            }
            App::OneShot => {
                let mut b = [0u8; 1];
                s.read_exact(&mut b).await?;
                s.write_all(&b).await?;
                s.shutdown().await
            }
            App::Echo => {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = s.read(&mut buf).await?;
                    if n == 0 {
                        return s.shutdown().await;
                    }
                    s.write_all(&buf[..n]).await?;
                }
            }
        }
    }
}

/// Client side of the sink app: writes `len` bytes in `CHUNK`s, half-closes, and waits for
/// the server's count.
async fn send_all<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, data: &[u8], len: usize) {
    let mut left = len;
    while left > 0 {
        let n = left.min(data.len());
        s.write_all(&data[..n]).await.unwrap();
        left -= n;
    }
    s.shutdown().await.unwrap();
    let mut count = [0u8; 8];
    s.read_exact(&mut count).await.unwrap();
    assert_eq!(u64::from_be_bytes(count), len as u64);
}

/// Client side of the one-shot app: one byte there and back, then EOF from the server.
async fn one_shot<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
    s.write_all(b"x").await.unwrap();
    let mut b = [0u8; 2];
    s.read_exact(&mut b[..1]).await.unwrap();
    assert_eq!(s.read(&mut b).await.unwrap(), 0, "server should close");
    s.shutdown().await.unwrap();
}

/// Everything one benchmark run shares.
struct Setup {
    rt: Runtime,
    hbone_addr: SocketAddr,
    /// TCP listeners per app.
    tcp_sink: SocketAddr,
    tcp_oneshot: SocketAddr,
    tcp_echo: SocketAddr,
    client_tls: Arc<rustls::ClientConfig>,
    key: PoolKey,
    /// A long-lived pool whose connection is dialled once (warm).
    pool: Pool,
    _shutdown: watch::Sender<bool>,
}

fn settings() -> H2Settings {
    // ztunnel's defaults (4 MiB stream / 16 MiB connection windows, 1 MiB frames).
    H2Settings::default()
}

impl Setup {
    fn new() -> Setup {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let td = "cluster.local";
        let ca = CertificateAuthority::ephemeral(td).unwrap();
        let server_id = SpiffeId::new(td, "default", "server").unwrap();
        let client_id = SpiffeId::new(td, "default", "client").unwrap();
        let day = Duration::from_secs(86_400);
        let server_cert = ca.issue(&server_id, day).unwrap();
        let client_cert = ca.issue(&client_id, day).unwrap();
        let server_tls = ambit_identity::server_config(&server_cert).unwrap();
        let client_tls =
            ambit_identity::client_config(&client_cert, std::slice::from_ref(&server_id)).unwrap();
        let (shutdown_tx, shutdown_rx) = watch::channel(false);

        let (hbone_addr, tcp_sink, tcp_oneshot, tcp_echo) = rt.block_on(async {
            let hbone = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let hbone_addr = hbone.local_addr().unwrap();
            tokio::spawn(async move {
                while let Ok((tcp, _)) = hbone.accept().await {
                    let tls = server_tls.clone();
                    let rx = shutdown_rx.clone();
                    tokio::spawn(async move {
                        let _ =
                            ambit_hbone::serve_connection(tcp, tls, settings(), rx, handle).await;
                    });
                }
            });
            let mut tcp = Vec::new();
            for app in [App::Sink, App::OneShot, App::Echo] {
                let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
                tcp.push(l.local_addr().unwrap());
                tokio::spawn(async move {
                    while let Ok((s, _)) = l.accept().await {
                        s.set_nodelay(true).unwrap();
                        tokio::spawn(async move {
                            let _ = app.serve(s).await;
                        });
                    }
                });
            }
            (hbone_addr, tcp[0], tcp[1], tcp[2])
        });

        let key = PoolKey {
            src_identity: client_id.to_string(),
            dst_identities: vec![server_id.to_string()],
            dst: hbone_addr,
            src_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let setup = Setup {
            rt,
            hbone_addr,
            tcp_sink,
            tcp_oneshot,
            tcp_echo,
            client_tls,
            key,
            pool: Pool::new(client_settings()),
            _shutdown: shutdown_tx,
        };
        // Dial the pooled connection now so no measured iteration pays for it.
        setup.rt.block_on(async {
            let s = setup.stream(&setup.pool, ONESHOT_PORT).await;
            one_shot(s).await;
        });
        setup
    }

    /// A CONNECT stream through `pool` to the app on `port` (dials only when the pool has no
    /// usable connection).
    async fn stream(&self, pool: &Pool, port: u16) -> H2Stream {
        let addr = self.hbone_addr;
        let cfg = self.client_tls.clone();
        let req = ConnectRequest::new(parse_authority(&format!("127.0.0.1:{port}")).unwrap());
        pool.connect(self.key.clone(), move || dial(addr, cfg), &req)
            .await
            .unwrap()
    }
}

fn client_settings() -> ClientSettings {
    ClientSettings {
        h2: settings(),
        ..Default::default()
    }
}

/// TCP connect + HBONE client TLS handshake (what the node proxy does for a new connection).
async fn dial(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ambit_hbone::HboneError> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    tls::connect(tcp, cfg).await
}

async fn handle(inc: IncomingConnect) {
    let app = App::from_port(inc.validate().map(|v| v.authority.port()).unwrap_or(0));
    if let Ok(stream) = inc.accept(HeaderMap::new()) {
        let _ = app.serve(stream).await;
    }
}

async fn tcp_connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s
}

fn throughput(c: &mut Criterion, s: &Arc<Setup>) {
    let data: Arc<Vec<u8>> = Arc::new((0..CHUNK).map(|i| (i * 7 + 3) as u8).collect());
    let mut g = c.benchmark_group("throughput");
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Bytes(TRANSFER as u64));

    for streams in [1usize, 8] {
        let per = TRANSFER / streams;
        g.bench_function(format!("tcp/{streams}"), |b| {
            b.to_async(&s.rt).iter(|| {
                let (data, addr) = (data.clone(), s.tcp_sink);
                async move {
                    let tasks: Vec<_> = (0..streams)
                        .map(|_| {
                            let data = data.clone();
                            tokio::spawn(async move {
                                send_all(tcp_connect(addr).await, &data, per).await
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap();
                    }
                }
            })
        });
        g.bench_function(format!("hbone/{streams}"), |b| {
            b.to_async(&s.rt).iter(|| {
                let (data, s) = (data.clone(), s.clone());
                async move {
                    let tasks: Vec<_> = (0..streams)
                        .map(|_| {
                            let (data, s) = (data.clone(), s.clone());
                            tokio::spawn(async move {
                                let st = s.stream(&s.pool, SINK_PORT).await;
                                send_all(st, &data, per).await
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap();
                    }
                }
            })
        });
    }
    g.finish();
}

fn connections(c: &mut Criterion, s: &Arc<Setup>) {
    let mut g = c.benchmark_group("connections");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(1));

    g.bench_function("tcp_new", |b| {
        b.to_async(&s.rt)
            .iter(|| async { one_shot(tcp_connect(s.tcp_oneshot).await).await })
    });
    g.bench_function("hbone_new", |b| {
        b.to_async(&s.rt).iter(|| async {
            // A fresh pool: TCP + TLS + HTTP/2 handshakes + CONNECT every time. Dropping
            // the pool after the stream closes the connection.
            let pool = Pool::new(client_settings());
            let st = s.stream(&pool, ONESHOT_PORT).await;
            one_shot(st).await;
        })
    });
    g.bench_function("hbone_pooled_stream", |b| {
        b.to_async(&s.rt).iter(|| async {
            let st = s.stream(&s.pool, ONESHOT_PORT).await;
            one_shot(st).await;
        })
    });
    g.finish();
}

fn latency(c: &mut Criterion, s: &Arc<Setup>) {
    let mut g = c.benchmark_group("latency");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(1));
    let req = vec![0x5au8; RR_SIZE];

    async fn round_trip<S: AsyncRead + AsyncWrite + Unpin>(st: &mut S, req: &[u8]) {
        let mut resp = [0u8; RR_SIZE];
        st.write_all(req).await.unwrap();
        st.read_exact(&mut resp).await.unwrap();
    }

    let mut tcp = s.rt.block_on(tcp_connect(s.tcp_echo));
    g.bench_function("tcp_1k", |b| {
        b.iter(|| s.rt.block_on(round_trip(&mut tcp, &req)))
    });
    let mut st = s.rt.block_on(s.stream(&s.pool, ECHO_PORT));
    g.bench_function("hbone_1k", |b| {
        b.iter(|| s.rt.block_on(round_trip(&mut st, &req)))
    });
    g.finish();
    drop(s.rt.block_on(async move {
        let _ = tcp.shutdown().await;
        let _ = st.shutdown().await;
        (tcp, st)
    }));
}

fn benches(c: &mut Criterion) {
    let s = Arc::new(Setup::new());
    throughput(c, &s);
    connections(c, &s);
    latency(c, &s);
}

criterion_group!(hbone, benches);
criterion_main!(hbone);
