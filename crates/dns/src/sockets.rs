//! The sockets of a DNS server and its forwarder. In-pod mode supplies a factory that
//! makes them inside the pod's network namespace; they carry the proxy's mark so the
//! pod's capture rules let the forwarded queries through.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Makes every socket a DNS server uses.
pub trait DnsSockets: Send + Sync + 'static {
    /// A bound UDP socket to serve queries on.
    fn udp_bind(&self, addr: SocketAddr) -> io::Result<std::net::UdpSocket>;
    /// A bound, listening TCP socket to serve queries on.
    fn tcp_listen(&self, addr: SocketAddr) -> io::Result<std::net::TcpListener>;
    /// An unbound UDP socket of `to`'s family, for one forwarded query.
    fn udp_upstream(&self, to: SocketAddr) -> io::Result<std::net::UdpSocket>;
    /// An unconnected TCP socket of `to`'s family, for a forwarded query over TCP.
    fn tcp_upstream(&self, to: SocketAddr) -> io::Result<Socket>;
}

/// Sockets in the current network namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalSockets {
    pub mark: Option<u32>,
    /// `SO_REUSEPORT` on the serving sockets (`INPOD_PORT_REUSE`): a new proxy can bind
    /// while the old one still serves.
    pub reuse_port: bool,
}

fn new_socket(family_of: SocketAddr, ty: Type, mark: Option<u32>) -> io::Result<Socket> {
    let proto = if ty == Type::DGRAM {
        Protocol::UDP
    } else {
        Protocol::TCP
    };
    let socket = Socket::new(
        Domain::for_address(family_of),
        ty.nonblocking().cloexec(),
        Some(proto),
    )?;
    if let Some(mark) = mark {
        socket.set_mark(mark)?;
    }
    Ok(socket)
}

fn serving_socket(addr: SocketAddr, ty: Type, s: &LocalSockets) -> io::Result<Socket> {
    let socket = new_socket(addr, ty, s.mark)?;
    socket.set_reuse_address(true)?;
    if s.reuse_port {
        // Before bind, or it does not apply.
        socket.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&SockAddr::from(addr))?;
    Ok(socket)
}

impl DnsSockets for LocalSockets {
    fn udp_bind(&self, addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
        serving_socket(addr, Type::DGRAM, self).map(Into::into)
    }

    fn tcp_listen(&self, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
        let socket = serving_socket(addr, Type::STREAM, self)?;
        socket.listen(128)?;
        Ok(socket.into())
    }

    fn udp_upstream(&self, to: SocketAddr) -> io::Result<std::net::UdpSocket> {
        new_socket(to, Type::DGRAM, self.mark).map(Into::into)
    }

    fn tcp_upstream(&self, to: SocketAddr) -> io::Result<Socket> {
        new_socket(to, Type::STREAM, self.mark)
    }
}
