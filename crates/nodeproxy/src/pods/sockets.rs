//! Sockets created inside a pod's network namespace and marked, so the pod's capture
//! rules let them through and HBONE leaves from the pod's own IP.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use ambit_zds::Netns;
use socket2::Socket;

use crate::socket::{listen_socket, new_tcp_socket, SocketFactory};

pub struct InPodSocketFactory {
    pub netns: Arc<Netns>,
    pub mark: u32,
    /// `SO_REUSEPORT` on listeners (`INPOD_PORT_REUSE`): a new proxy can take over the
    /// ports while the old one still holds them.
    pub reuse_port: bool,
}

impl SocketFactory for InPodSocketFactory {
    fn new_tcp(&self, family_of: SocketAddr) -> io::Result<Socket> {
        self.netns
            .enter(|| new_tcp_socket(family_of, Some(self.mark)))?
    }

    fn listen(&self, addr: SocketAddr, transparent: bool) -> io::Result<Socket> {
        self.netns
            .enter(|| listen_socket(addr, Some(self.mark), self.reuse_port, transparent))?
    }
}

/// The DNS server of a pod and its forwarder: sockets in the pod's namespace, marked, so
/// upstream queries leave from the pod and are not captured again.
impl ambit_dns::DnsSockets for InPodSocketFactory {
    fn udp_bind(&self, addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
        self.netns.enter(|| self.dns_local().udp_bind(addr))?
    }

    fn tcp_listen(&self, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
        self.netns.enter(|| self.dns_local().tcp_listen(addr))?
    }

    fn udp_upstream(&self, to: SocketAddr) -> io::Result<std::net::UdpSocket> {
        self.netns.enter(|| self.dns_local().udp_upstream(to))?
    }

    fn tcp_upstream(&self, to: SocketAddr) -> io::Result<Socket> {
        self.netns.enter(|| self.dns_local().tcp_upstream(to))?
    }
}

impl InPodSocketFactory {
    fn dns_local(&self) -> ambit_dns::LocalSockets {
        ambit_dns::LocalSockets {
            mark: Some(self.mark),
            reuse_port: self.reuse_port,
        }
    }
}
