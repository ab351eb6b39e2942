//! Sockets created inside a pod's network namespace and marked, so the pod's capture
//! rules let them through and HBONE leaves from the pod's own IP.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use ambit_inpod::Netns;
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
