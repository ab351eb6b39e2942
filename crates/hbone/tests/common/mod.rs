//! Shared helpers for the loopback tests: certificates from an ephemeral CA, a test server
//! on 127.0.0.1:0, and a counting dialer.
#![allow(dead_code)]

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_hbone::{tls, H2Settings, HboneError, IncomingConnect, PoolKey};
use ambit_identity::{CertificateAuthority, SpiffeId, WorkloadCertificate};
use http::HeaderMap;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::client::TlsStream;

pub const TD: &str = "cluster.local";
const DAY: Duration = Duration::from_secs(86400);

pub struct Certs {
    pub ca: CertificateAuthority,
    pub server_id: SpiffeId,
    pub client_id: SpiffeId,
    pub server: WorkloadCertificate,
    pub client: WorkloadCertificate,
}

pub fn certs() -> Certs {
    let ca = CertificateAuthority::ephemeral(TD).unwrap();
    let server_id = SpiffeId::new(TD, "default", "server").unwrap();
    let client_id = SpiffeId::new(TD, "default", "client").unwrap();
    let server = ca.issue(&server_id, DAY).unwrap();
    let client = ca.issue(&client_id, DAY).unwrap();
    Certs {
        ca,
        server_id,
        client_id,
        server,
        client,
    }
}

impl Certs {
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        ambit_identity::server_config(&self.server).unwrap()
    }
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        ambit_identity::client_config(&self.client, std::slice::from_ref(&self.server_id)).unwrap()
    }
    pub fn issue(&self, id: &SpiffeId) -> WorkloadCertificate {
        self.ca.issue(id, DAY).unwrap()
    }
}

/// Short pings so keepalive runs during tests.
pub fn fast_settings() -> H2Settings {
    H2Settings {
        ping_interval: Duration::from_millis(200),
        ping_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

type Generation = (watch::Sender<bool>, watch::Receiver<bool>);

/// An HBONE server on 127.0.0.1:0 whose per-connection results can be inspected.
pub struct TestServer {
    pub addr: SocketAddr,
    generation: Arc<Mutex<Generation>>,
    results: tokio::sync::Mutex<mpsc::UnboundedReceiver<Result<(), HboneError>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    pub async fn start<H, F>(
        tls: Arc<rustls::ServerConfig>,
        settings: H2Settings,
        handler: H,
    ) -> TestServer
    where
        H: Fn(IncomingConnect) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let generation = Arc::new(Mutex::new(watch::channel(false)));
        let (res_tx, res_rx) = mpsc::unbounded_channel();
        let handler = Arc::new(handler);
        let gen = generation.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let rx = gen.lock().unwrap().1.clone();
                let handler = handler.clone();
                let tls = tls.clone();
                let settings = settings.clone();
                let res_tx = res_tx.clone();
                tokio::spawn(async move {
                    let r = ambit_hbone::serve_connection(tcp, tls, settings, rx, move |inc| {
                        handler(inc)
                    })
                    .await;
                    let _ = res_tx.send(r);
                });
            }
        });
        TestServer {
            addr,
            generation,
            results: tokio::sync::Mutex::new(res_rx),
            task,
        }
    }

    /// Signals graceful shutdown (GOAWAY) to the connections accepted so far; later
    /// connections are served normally.
    pub fn goaway_existing(&self) {
        let mut g = self.generation.lock().unwrap();
        g.0.send_replace(true);
        *g = watch::channel(false);
    }

    /// The result of the next connection that ends.
    pub async fn next_result(&self) -> Result<(), HboneError> {
        tokio::time::timeout(Duration::from_secs(10), self.results.lock().await.recv())
            .await
            .expect("a server connection should have ended")
            .expect("server task alive")
    }
}

/// Echo handler: validates, answers 200, copies bytes back until EOF, then half-closes.
pub async fn echo(inc: IncomingConnect) {
    if let Err(r) = inc.validate() {
        inc.reject(r.status);
        return;
    }
    let Ok(stream) = inc.accept(HeaderMap::new()) else {
        return;
    };
    let (mut r, mut w) = tokio::io::split(stream);
    if tokio::io::copy(&mut r, &mut w).await.is_ok() {
        let _ = w.shutdown().await;
    }
    let _ = r.unsplit(w);
}

/// TCP connect + HBONE TLS handshake, counting calls.
pub async fn dial(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    count: Arc<AtomicUsize>,
) -> Result<TlsStream<TcpStream>, HboneError> {
    count.fetch_add(1, Ordering::SeqCst);
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    tls::connect(tcp, config).await
}

pub fn key(c: &Certs, dst: SocketAddr) -> PoolKey {
    PoolKey {
        src_identity: c.client_id.to_string(),
        dst_identities: vec![c.server_id.to_string()],
        dst,
        src_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

/// A deterministic pseudo-random payload.
pub fn payload(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// A one-connection TCP forwarder that can be frozen (stops moving bytes in one direction,
/// sockets stay open) or cut (both sockets dropped).
pub struct Forwarder {
    pub addr: SocketAddr,
    freeze_up: Arc<std::sync::atomic::AtomicBool>,
    freeze_down: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    pub async fn start(upstream: SocketAddr) -> Forwarder {
        use std::sync::atomic::AtomicBool;
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let freeze_up = Arc::new(AtomicBool::new(false));
        let freeze_down = Arc::new(AtomicBool::new(false));
        let (fu, fd) = (freeze_up.clone(), freeze_down.clone());
        let task = tokio::spawn(async move {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            async fn pump(
                r: &mut tokio::net::tcp::OwnedReadHalf,
                w: &mut tokio::net::tcp::OwnedWriteHalf,
                frozen: &AtomicBool,
            ) {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match r.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    while frozen.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    if w.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
            tokio::join!(pump(&mut cr, &mut sw, &fu), pump(&mut sr, &mut cw, &fd));
        });
        Forwarder {
            addr,
            freeze_up,
            freeze_down,
            task,
        }
    }

    /// Stop forwarding client→server bytes.
    pub fn freeze_up(&self) {
        self.freeze_up.store(true, Ordering::SeqCst);
    }

    /// Stop forwarding server→client bytes.
    pub fn freeze_down(&self) {
        self.freeze_down.store(true, Ordering::SeqCst);
    }

    /// Drop both connections.
    pub fn cut(&self) {
        self.task.abort();
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}
