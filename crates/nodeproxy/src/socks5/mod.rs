//! SOCKS5 on 127.0.0.1:15080 (`UNSTABLE_ENABLE_SOCKS5=true`): an application that knows
//! no capture names its destination itself, and from then on the connection is handled
//! exactly like a captured outbound one. As in ztunnel, the success reply goes out before
//! the upstream is reached: a failure after it shows as a closed connection.

pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::inputs::ProxyInputs;
use crate::socket;
use ambit_runtime::drain::DrainWatcher;
use wire::{Parsed, Reply, Socks5Error, Target};

/// How long a client may take to send its greeting and request.
const NEGOTIATION_TIMEOUT: Duration = Duration::from_secs(10);

pub use crate::lookups::NameLookup;

/// Why a SOCKS5 client got no tunnel.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("{0}")]
    Protocol(#[from] Socks5Error),
    #[error("reading the SOCKS5 negotiation: {0}")]
    Io(#[from] std::io::Error),
    #[error("the client sent nothing usable within {NEGOTIATION_TIMEOUT:?}")]
    Timeout,
    #[error("{name} cannot be resolved: the DNS proxy is disabled")]
    NoResolver { name: String },
    #[error("{name} cannot be resolved: {reason}")]
    Unresolved { name: String, reason: String },
    #[error("{name} has no {family} address")]
    NoAddress { name: String, family: &'static str },
    #[error("this proxy's own workload is not known: {0}")]
    NoLocalWorkload(String),
}

impl Refused {
    fn reply(&self) -> Option<Vec<u8>> {
        match self {
            Refused::Protocol(e) => e.reply(),
            Refused::Io(_) | Refused::Timeout => None,
            Refused::NoResolver { .. } | Refused::NoLocalWorkload(_) => {
                Some(wire::reply(Reply::GeneralFailure).to_vec())
            }
            Refused::Unresolved { .. } | Refused::NoAddress { .. } => {
                Some(wire::reply(Reply::HostUnreachable).to_vec())
            }
        }
    }
}

pub(crate) async fn handle(
    pi: Arc<ProxyInputs>,
    mut stream: TcpStream,
    src: SocketAddr,
    drain: DrainWatcher,
) {
    let src = socket::canonical(src);
    if let Err(e) = socket::tune_stream(&stream, &pi.cfg.keepalive) {
        tracing::debug!(%src, "could not tune accepted socket: {e}");
    }
    let negotiated = tokio::time::timeout(NEGOTIATION_TIMEOUT, negotiate(&pi, &mut stream, src))
        .await
        .unwrap_or(Err(Refused::Timeout));
    let dst = match negotiated {
        Ok(dst) => dst,
        Err(refused) => {
            tracing::info!(%src, "SOCKS5 request refused: {refused}");
            if let Some(reply) = refused.reply() {
                let _ = stream.write_all(&reply).await;
            }
            return;
        }
    };
    if let Err(e) = stream.write_all(&wire::reply(Reply::Succeeded)).await {
        tracing::debug!(%src, %dst, "SOCKS5 client left before the reply: {e}");
        return;
    }
    crate::outbound::forward(pi, stream, src, dst, drain).await
}

/// Reads the greeting and the request (never a byte past them), answers the greeting,
/// and resolves the destination.
async fn negotiate(
    pi: &ProxyInputs,
    stream: &mut TcpStream,
    src: SocketAddr,
) -> Result<SocketAddr, Refused> {
    let mut buf = Vec::with_capacity(wire::MAX_GREETING);
    while let Parsed::Incomplete { need } = wire::parse_greeting(&buf)? {
        read_to(stream, &mut buf, need).await?;
    }
    stream.write_all(&[wire::VERSION, wire::NO_AUTH]).await?;
    buf.clear();
    let target = loop {
        match wire::parse_request(&buf)? {
            Parsed::Incomplete { need } => read_to(stream, &mut buf, need).await?,
            Parsed::Done(target, _) => break target,
        }
    };
    match target {
        Target::Addr(addr) => Ok(socket::canonical(addr)),
        Target::Name { host, port } => {
            let Some(names) = pi.names.as_ref() else {
                return Err(Refused::NoResolver { name: host });
            };
            let client = {
                let state = pi.state.get();
                pi.local()
                    .workload(&state)
                    .map_err(|e| Refused::NoLocalWorkload(e.to_string()))?
            };
            // The client's own family decides which records are asked for.
            let ipv6 = src.is_ipv6();
            let ips =
                names
                    .lookup(&client, &host, ipv6)
                    .await
                    .map_err(|reason| Refused::Unresolved {
                        name: host.clone(),
                        reason,
                    })?;
            let ip = ips
                .into_iter()
                .find(|ip| ip.is_ipv6() == ipv6)
                .ok_or(Refused::NoAddress {
                    name: host,
                    family: if ipv6 { "IPv6" } else { "IPv4" },
                })?;
            Ok(SocketAddr::new(ip, port))
        }
    }
}

async fn read_to(stream: &mut TcpStream, buf: &mut Vec<u8>, need: usize) -> std::io::Result<()> {
    let have = buf.len();
    buf.resize(need, 0);
    stream.read_exact(&mut buf[have..]).await?;
    Ok(())
}
