//! Socket creation and options. Everything the proxy opens goes through a [`SocketFactory`]
//! so that in-pod mode can create the same sockets inside another network namespace.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::settings::{Keepalive, ProxyConfig};

/// Creates the sockets of one proxy instance. The default factory creates them in the
/// current network namespace; in-pod mode supplies one that enters the pod's namespace.
pub trait SocketFactory: Send + Sync + 'static {
    /// A new unconnected TCP socket for `family_of`'s address family.
    fn new_tcp(&self, family_of: SocketAddr) -> io::Result<Socket>;
    /// A bound, listening TCP socket.
    fn listen(&self, addr: SocketAddr, transparent: bool) -> io::Result<Socket>;
}

/// Sockets in the current network namespace, all carrying `mark` when set.
#[derive(Clone, Debug, Default)]
pub struct DefaultSocketFactory {
    pub mark: Option<u32>,
    pub reuse_port: bool,
}

impl SocketFactory for DefaultSocketFactory {
    fn new_tcp(&self, family_of: SocketAddr) -> io::Result<Socket> {
        new_tcp_socket(family_of, self.mark)
    }

    fn listen(&self, addr: SocketAddr, transparent: bool) -> io::Result<Socket> {
        listen_socket(addr, self.mark, self.reuse_port, transparent)
    }
}

/// A non-blocking TCP socket of `family_of`'s family with the mark applied.
pub fn new_tcp_socket(family_of: SocketAddr, mark: Option<u32>) -> io::Result<Socket> {
    let socket = Socket::new(
        Domain::for_address(family_of),
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    if let Some(mark) = mark {
        socket.set_mark(mark)?;
    }
    Ok(socket)
}

/// A listening socket. `transparent` asks for `IP_TRANSPARENT`, best effort; callers that
/// need it check [`is_transparent`].
pub fn listen_socket(
    addr: SocketAddr,
    mark: Option<u32>,
    reuse_port: bool,
    transparent: bool,
) -> io::Result<Socket> {
    let socket = new_tcp_socket(addr, mark)?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        // A `[::]` listener takes IPv4 too (mapped addresses), like ztunnel's.
        socket.set_only_v6(false)?;
    }
    if transparent {
        let _ = set_transparent(&socket, addr.is_ipv6());
    }
    socket.bind(&SockAddr::from(addr))?;
    // Room for a burst of new connections (a pool warming up, a flood being shed) before
    // the kernel drops SYNs and clients wait a second to retry; tokio's default too.
    socket.listen(1024)?;
    Ok(socket)
}

fn set_transparent(socket: &Socket, v6: bool) -> io::Result<()> {
    if v6 {
        socket.set_ip_transparent_v6(true)
    } else {
        socket.set_ip_transparent_v4(true)
    }
}

/// Whether the listener could be made transparent (`IP_TRANSPARENT`), which original-source
/// preservation needs.
pub fn is_transparent(socket: &Socket, v6: bool) -> bool {
    if v6 {
        socket.ip_transparent_v6().unwrap_or(false)
    } else {
        socket.ip_transparent_v4().unwrap_or(false)
    }
}

pub fn into_listener(socket: Socket) -> io::Result<TcpListener> {
    TcpListener::from_std(std::net::TcpListener::from(socket))
}

/// Options ztunnel applies to accepted and outgoing data sockets.
pub fn tune_stream(stream: &TcpStream, keepalive: &Keepalive) -> io::Result<()> {
    stream.set_nodelay(true)?;
    apply_keepalive(&socket2::SockRef::from(stream), keepalive)
}

fn apply_keepalive(socket: &socket2::SockRef<'_>, keepalive: &Keepalive) -> io::Result<()> {
    if !keepalive.enabled {
        return Ok(());
    }
    let params = TcpKeepalive::new()
        .with_time(keepalive.time)
        .with_interval(keepalive.interval)
        .with_retries(keepalive.retries);
    socket.set_tcp_keepalive(&params)?;
    if keepalive.user_timeout {
        socket.set_tcp_user_timeout(Some(user_timeout(keepalive)))?;
    }
    Ok(())
}

/// How long unacknowledged data may sit before the kernel drops the connection: as long as
/// keepalive takes to give up. The kernel takes a signed 32-bit count of milliseconds and
/// rejects more, so the longest allowed keepalive settings are clamped to ~24.8 days.
fn user_timeout(keepalive: &Keepalive) -> Duration {
    const KERNEL_MAX: Duration = Duration::from_millis(i32::MAX as u64);
    keepalive
        .time
        .saturating_add(keepalive.interval.saturating_mul(keepalive.retries))
        .min(KERNEL_MAX)
}

pub use crate::decide::{canonical_ip, Spoof};

/// Outgoing connect timeout (ztunnel: 10 s).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects a socket made by `factory` to `dst`, optionally from `source` (original-source
/// preservation). The source bind uses `IP_BIND_ADDRESS_NO_PORT` so the kernel picks the
/// port at `connect()`, per 4-tuple, and a high rate of short connections does not run
/// out of ports behind TIME_WAIT.
pub async fn connect(
    factory: &dyn SocketFactory,
    cfg: &ProxyConfig,
    dst: SocketAddr,
    source: Option<Spoof>,
) -> io::Result<TcpStream> {
    let mut socket = factory.new_tcp(dst)?;
    if let Some(spoof) = source {
        if let Err(e) = bind_transparent_source(&socket, spoof.ip, dst) {
            if spoof.required {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "cannot connect from the client's address {} (ENABLE_ORIG_SRC=true): {e}",
                        spoof.ip
                    ),
                ));
            }
            tracing::debug!(client = %spoof.ip, "original source not preserved: {e}");
            socket = factory.new_tcp(dst)?;
        }
    }
    let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(socket));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(dst)).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connection to {dst} timed out after {CONNECT_TIMEOUT:?}"),
            ))
        }
    };
    tune_stream(&stream, &cfg.keepalive)?;
    Ok(stream)
}

fn bind_transparent_source(socket: &Socket, src: IpAddr, dst: SocketAddr) -> io::Result<()> {
    let src = match (src, dst) {
        (IpAddr::V4(v4), SocketAddr::V6(_)) => IpAddr::V6(v4.to_ipv6_mapped()),
        (src, _) => src,
    };
    set_transparent(socket, dst.is_ipv6())?;
    if dst.is_ipv6() {
        socket.set_freebind_v6(true)?;
    } else {
        socket.set_freebind_v4(true)?;
    }
    nix::sys::socket::setsockopt(
        socket,
        nix::sys::socket::sockopt::IpBindAddressNoPort,
        &true,
    )
    .map_err(io::Error::from)?;
    // The app is local, so this connection runs over `lo` anyway. Saying so lets the
    // kernel's default `tcp_tw_reuse=2` ("loopback only") reuse its TIME_WAIT ports: the
    // proxy closes first towards the app, and every connection would otherwise hold one
    // (client IP, port) for 60 s until the ports for that client run out.
    socket.bind_device(Some(b"lo"))?;
    socket.bind(&SockAddr::from(SocketAddr::new(src, 0)))
}

/// The destination a captured connection was heading to before netfilter redirected it:
/// `SO_ORIGINAL_DST`, then `IP6T_SO_ORIGINAL_DST`, else the local address (not redirected).
pub fn original_destination(stream: &TcpStream) -> io::Result<SocketAddr> {
    let sock = socket2::SockRef::from(stream);
    let found = sock
        .original_dst_v4()
        .ok()
        .or_else(|| sock.original_dst_v6().ok())
        .and_then(|a| a.as_socket());
    match found {
        Some(addr) => Ok(canonical(addr)),
        None => stream.local_addr().map(canonical),
    }
}

/// IPv4-mapped IPv6 addresses (from dual-stack listeners) as plain IPv4.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(canonical_ip(addr.ip()), addr.port())
}

/// The wildcard address listeners bind: `[::]` with IPv6 on, else `0.0.0.0`.
pub fn wildcard(ipv6: bool, port: u16) -> SocketAddr {
    if ipv6 {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)
    }
}

/// Arms `stream` so that dropping it aborts the connection with a TCP reset (`SO_LINGER`
/// 0): the peer reads ECONNRESET rather than a clean end of stream, and no TIME_WAIT is
/// kept here. For relays passing on a reset and for connections shed at accept.
pub fn reset_on_close(stream: &TcpStream) {
    if let Err(e) = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO)) {
        tracing::debug!(error = %e, "could not arm a reset on close");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_become_ipv4() {
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:80".parse().unwrap();
        assert_eq!(canonical(mapped), "10.0.0.1:80".parse().unwrap());
        let v6: SocketAddr = "[fd00::1]:80".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }

    #[tokio::test]
    async fn the_longest_keepalive_settings_fit_the_kernels_user_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let longest = Keepalive {
            enabled: true,
            time: Duration::from_secs(32767),
            interval: Duration::from_secs(32767),
            retries: 127,
            user_timeout: true,
        };
        tune_stream(&stream, &longest).expect("the kernel takes the clamped user timeout");
        let set = socket2::SockRef::from(&stream).tcp_user_timeout().unwrap();
        assert_eq!(set, Some(Duration::from_millis(i32::MAX as u64)));
        let usual = Keepalive {
            user_timeout: true,
            ..Keepalive::default()
        };
        tune_stream(&stream, &usual).unwrap();
        let set = socket2::SockRef::from(&stream).tcp_user_timeout().unwrap();
        assert_eq!(set, Some(usual.time + usual.interval * usual.retries));
    }

    #[tokio::test]
    async fn unredirected_connection_reports_its_local_address() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        assert_eq!(original_destination(&server).unwrap(), addr);
    }

    #[tokio::test]
    async fn outgoing_sockets_carry_the_mark() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cfg = ProxyConfig::default();
        let factory = DefaultSocketFactory {
            mark: Some(0x539),
            reuse_port: false,
        };
        let stream = connect(&factory, &cfg, addr, None)
            .await
            .expect("connect with SO_MARK needs CAP_NET_ADMIN: run the tests as root");
        let mark = socket2::SockRef::from(&stream).mark().unwrap();
        assert_eq!(mark, 0x539);
        assert!(stream.nodelay().unwrap());
    }
}
