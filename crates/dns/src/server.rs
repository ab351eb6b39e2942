//! The DNS server: UDP and TCP on 15053 (127.0.0.1 and, when there, ::1), or on the
//! address `ISTIO_META_DNS_PROXY_ADDR` names.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use crate::message::Protocol;
use crate::resolver::{Resolver, Step};
use crate::sockets::DnsSockets;

/// ztunnel's DNS port.
pub const DNS_PORT: u16 = 15053;
/// TCP connections one server keeps open at once; more wait in the backlog.
pub const MAX_TCP_CONNECTIONS: usize = 64;
/// A TCP connection with no complete query for this long is closed.
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Queries longer than this are cut by the receive buffer and answered FORMERR.
const MAX_UDP_QUERY: usize = 4096;

/// Where a DNS server listens (`ISTIO_META_DNS_PROXY_ADDR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// `localhost:<port>`: 127.0.0.1 and, if the loopback has IPv6, ::1.
    Localhost(u16),
    /// `ip:port`.
    Exact(SocketAddr),
}

impl Default for ListenAddr {
    fn default() -> Self {
        ListenAddr::Localhost(DNS_PORT)
    }
}

impl FromStr for ListenAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(port) = s.strip_prefix("localhost:") {
            return port
                .parse()
                .map(ListenAddr::Localhost)
                .map_err(|_| format!("{port:?} is not a port"));
        }
        s.parse()
            .map(ListenAddr::Exact)
            .map_err(|_| format!("{s:?} is neither localhost:<port> nor <ip>:<port>"))
    }
}

/// A bound DNS server, not yet serving.
pub struct DnsServer {
    resolver: Arc<Resolver>,
    udp: Vec<Arc<UdpSocket>>,
    tcp: Vec<TcpListener>,
}

fn ipv6_unavailable(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::AddrNotAvailable || e.raw_os_error() == Some(libc::EAFNOSUPPORT)
}

impl DnsServer {
    /// Binds UDP and TCP on `listen`. With [`ListenAddr::Localhost`], `::1` is skipped
    /// when `ipv6` is off or the namespace's loopback has no IPv6.
    pub fn bind(
        resolver: Arc<Resolver>,
        sockets: &dyn DnsSockets,
        listen: ListenAddr,
        ipv6: bool,
    ) -> io::Result<DnsServer> {
        let mut server = DnsServer {
            resolver,
            udp: Vec::new(),
            tcp: Vec::new(),
        };
        let (addrs, optional_v6) = match listen {
            ListenAddr::Localhost(port) => {
                let mut v = vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)];
                if ipv6 {
                    v.push(SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port));
                }
                (v, true)
            }
            ListenAddr::Exact(a) => (vec![a], false),
        };
        for addr in addrs {
            let with_context = |what: &str, e: io::Error| {
                io::Error::new(
                    e.kind(),
                    format!("cannot bind the DNS proxy ({what}) on {addr}: {e}"),
                )
            };
            let udp = match sockets.udp_bind(addr) {
                Ok(s) => s,
                Err(e) if optional_v6 && addr.is_ipv6() && ipv6_unavailable(&e) => {
                    tracing::debug!(%addr, "no IPv6 on the loopback: DNS on IPv4 only ({e})");
                    continue;
                }
                Err(e) => return Err(with_context("UDP", e)),
            };
            // The same port for TCP, also when the kernel picked it (port 0).
            let bound = udp.local_addr()?;
            let tcp = sockets
                .tcp_listen(bound)
                .map_err(|e| with_context("TCP", e))?;
            server.udp.push(Arc::new(UdpSocket::from_std(udp)?));
            server.tcp.push(TcpListener::from_std(tcp)?);
        }
        Ok(server)
    }

    /// The addresses bound (ports may have been picked by the kernel).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.udp
            .iter()
            .filter_map(|s| s.local_addr().ok())
            .collect()
    }

    /// Serves until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let mut tasks = tokio::task::JoinSet::new();
        for socket in self.udp {
            tasks.spawn(serve_udp(self.resolver.clone(), socket));
        }
        let connections = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
        for listener in self.tcp {
            tasks.spawn(serve_tcp(
                self.resolver.clone(),
                listener,
                connections.clone(),
            ));
        }
        shutdown.await;
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

async fn serve_udp(resolver: Arc<Resolver>, socket: Arc<UdpSocket>) {
    let mut buf = vec![0u8; MAX_UDP_QUERY];
    let mut forwards = tokio::task::JoinSet::new();
    loop {
        let (n, src) = match socket.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(target: "dns", "receive failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Reap finished forwards so the set does not grow.
        while forwards.try_join_next().is_some() {}
        match resolver.prepare(&buf[..n], Protocol::Udp) {
            Step::Reply(reply) => {
                let _ = socket.send_to(&reply, src).await;
            }
            Step::Drop => {}
            Step::Forward(job) => {
                let socket = socket.clone();
                // Bounded: the job holds one of the forwarder's slots.
                forwards.spawn(async move {
                    if let Some(reply) = job.run().await {
                        let _ = socket.send_to(&reply, src).await;
                    }
                });
            }
        }
    }
}

async fn serve_tcp(resolver: Arc<Resolver>, listener: TcpListener, connections: Arc<Semaphore>) {
    let mut open = tokio::task::JoinSet::new();
    loop {
        // Wait for a free slot before accepting: excess clients wait in the backlog.
        let Ok(slot) = connections.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::debug!(target: "dns", "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while open.try_join_next().is_some() {}
        let resolver = resolver.clone();
        open.spawn(async move {
            serve_connection(&resolver, stream).await;
            drop(slot);
        });
    }
}

/// Length-prefixed queries (RFC 1035 §4.2.2), answered in order.
async fn serve_connection(resolver: &Arc<Resolver>, mut stream: TcpStream) {
    let mut buf = Vec::new();
    loop {
        let read = async {
            let len = stream.read_u16().await?;
            buf.resize(usize::from(len), 0);
            stream.read_exact(&mut buf).await?;
            io::Result::Ok(())
        };
        match tokio::time::timeout(TCP_IDLE_TIMEOUT, read).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        let reply = match resolver.prepare(&buf, Protocol::Tcp) {
            Step::Reply(r) => r,
            Step::Drop => return,
            Step::Forward(job) => match job.run().await {
                Some(r) => r,
                None => return,
            },
        };
        let Ok(len) = u16::try_from(reply.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(reply.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&reply);
        if stream.write_all(&framed).await.is_err() {
            return;
        }
    }
}
