//! Forwarding the names that are not ours to the resolvers of resolv.conf, from sockets
//! the [`DnsSockets`] factory makes (in the pod's namespace, in-pod).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, Query};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::message::query_message;
use crate::sockets::DnsSockets;

/// How long one nameserver gets to answer one query.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Forwarded queries one DNS server (one pod) may have waiting at once; more are dropped,
/// so one pod's flood holds a bounded share of the node proxy.
pub const MAX_IN_FLIGHT: usize = 64;
/// resolv.conf(5): at most three nameservers are used.
const MAX_NAMESERVERS: usize = 3;
/// Replies larger than this over UDP are cut by the kernel and fail to parse.
const UDP_RECV_BUFFER: usize = 4096;

/// What resolv.conf says: where to forward, and the search list (dedicated mode).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<SocketAddr>,
    pub search: Vec<String>,
}

impl ResolvConf {
    /// Parses resolv.conf: `nameserver <ip>` lines (the first three; scoped IPv6
    /// addresses are skipped) and the last `search` (or `domain`) line.
    pub fn parse(text: &str) -> ResolvConf {
        let mut out = ResolvConf::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    if let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok()) {
                        if out.nameservers.len() < MAX_NAMESERVERS {
                            out.nameservers.push(SocketAddr::new(ip, 53));
                        }
                    }
                }
                Some("search") | Some("domain") => {
                    out.search = words
                        .map(|w| w.trim_end_matches('.').to_ascii_lowercase())
                        .filter(|w| !w.is_empty())
                        .collect();
                }
                _ => {}
            }
        }
        out
    }

    /// Reads resolv.conf from `path` (ztunnel reads its own `/etc/resolv.conf`).
    pub fn read(path: &Path) -> io::Result<ResolvConf> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot read the DNS proxy's resolv.conf {}: {e}",
                    path.display()
                ),
            )
        })?;
        Ok(ResolvConf::parse(&text))
    }
}

/// Why a forwarded query got no answer; the client then gets SERVFAIL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    #[error("no nameserver in the DNS proxy's resolv.conf")]
    NoNameservers,
    #[error("upstream {server}: {error}")]
    Io {
        server: SocketAddr,
        error: io::Error,
    },
    #[error("upstream {server} did not answer within {ATTEMPT_TIMEOUT:?}")]
    Timeout { server: SocketAddr },
    #[error("upstream {server} sent a reply that does not parse: {reason}")]
    BadReply { server: SocketAddr, reason: String },
}

/// Sends queries upstream, a bounded number at a time.
pub struct Forwarder {
    nameservers: Vec<SocketAddr>,
    sockets: Arc<dyn DnsSockets>,
    in_flight: Arc<Semaphore>,
    timeout: Duration,
}

impl Forwarder {
    pub fn new(nameservers: Vec<SocketAddr>, sockets: Arc<dyn DnsSockets>) -> Forwarder {
        Forwarder {
            nameservers,
            sockets,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            timeout: ATTEMPT_TIMEOUT,
        }
    }

    /// A slot for one forward, or `None` when this server already waits on
    /// [`MAX_IN_FLIGHT`] of them.
    pub fn try_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.in_flight.clone().try_acquire_owned().ok()
    }

    /// Asks each nameserver in turn until one answers; a UDP reply with TC set is asked
    /// again over TCP.
    pub async fn forward(&self, query: &Query) -> Result<Message, ForwardError> {
        let mut last = ForwardError::NoNameservers;
        for &server in &self.nameservers {
            let id: u16 = rand::random();
            let bytes =
                query_message(id, query.clone())
                    .to_vec()
                    .map_err(|e| ForwardError::BadReply {
                        server,
                        reason: format!("cannot encode the query: {e}"),
                    })?;
            let attempt = async {
                let reply = self.udp_exchange(server, &bytes, id, query).await?;
                if reply.truncated() {
                    return self.tcp_exchange(server, &bytes, id, query).await;
                }
                Ok(reply)
            };
            match tokio::time::timeout(self.timeout, attempt).await {
                Ok(Ok(reply)) => return Ok(reply),
                Ok(Err(e)) => last = e,
                Err(_) => last = ForwardError::Timeout { server },
            }
        }
        Err(last)
    }

    async fn udp_exchange(
        &self,
        server: SocketAddr,
        bytes: &[u8],
        id: u16,
        query: &Query,
    ) -> Result<Message, ForwardError> {
        let io = |error| ForwardError::Io { server, error };
        let std_socket = self.sockets.udp_upstream(server).map_err(io)?;
        let socket = tokio::net::UdpSocket::from_std(std_socket).map_err(io)?;
        // Connected: the kernel drops datagrams from anyone but the server.
        socket.connect(server).await.map_err(io)?;
        socket.send(bytes).await.map_err(io)?;
        let mut buf = vec![0u8; UDP_RECV_BUFFER];
        loop {
            let n = socket.recv(&mut buf).await.map_err(io)?;
            // A reply to something else (or garbage) is skipped; the timeout bounds this.
            if let Some(reply) = matching_reply(&buf[..n], id, query) {
                return Ok(reply);
            }
        }
    }

    async fn tcp_exchange(
        &self,
        server: SocketAddr,
        bytes: &[u8],
        id: u16,
        query: &Query,
    ) -> Result<Message, ForwardError> {
        let io = |error| ForwardError::Io { server, error };
        let socket = self.sockets.tcp_upstream(server).map_err(io)?;
        let socket = tokio::net::TcpSocket::from_std_stream(socket.into());
        let mut stream = socket.connect(server).await.map_err(io)?;
        let len = u16::try_from(bytes.len()).map_err(|_| ForwardError::BadReply {
            server,
            reason: "query too long".into(),
        })?;
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(bytes);
        stream.write_all(&framed).await.map_err(io)?;
        let len = stream.read_u16().await.map_err(io)?;
        let mut buf = vec![0u8; usize::from(len)];
        stream.read_exact(&mut buf).await.map_err(io)?;
        matching_reply(&buf, id, query).ok_or_else(|| ForwardError::BadReply {
            server,
            reason: "not a reply to our query".into(),
        })
    }
}

/// The reply to our query `id` for `query`, if that is what `bytes` are.
fn matching_reply(bytes: &[u8], id: u16, query: &Query) -> Option<Message> {
    let m = Message::from_vec(bytes).ok()?;
    let same_question = m.queries().first().is_some_and(|q| {
        q.query_type() == query.query_type()
            && q.query_class() == query.query_class()
            && q.name().eq_ignore_root_case(query.name())
    });
    (m.id() == id && m.message_type() == MessageType::Response && same_question).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf() {
        let r = ResolvConf::parse(
            "# comment\nnameserver 10.96.0.10\nnameserver fe80::1%eth0\nnameserver ::1 # local\n\
             search ns1.svc.cluster.local svc.cluster.local. cluster.local\noptions ndots:5\n\
             nameserver 1.1.1.1\nnameserver 8.8.8.8\n",
        );
        assert_eq!(
            r.nameservers,
            [
                "10.96.0.10:53".parse().unwrap(),
                "[::1]:53".parse().unwrap(),
                "1.1.1.1:53".parse().unwrap(),
            ]
        );
        assert_eq!(
            r.search,
            [
                "ns1.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
        assert_eq!(ResolvConf::parse(""), ResolvConf::default());
    }
}
