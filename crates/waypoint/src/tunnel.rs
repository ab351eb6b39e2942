//! One CONNECT stream into the waypoint: its authority checked against what this
//! waypoint fronts (refused with 400 otherwise, counted and logged), then carried by the
//! port's protocol: HTTP (declared, or sniffed on undeclared ports) or an opaque tunnel
//! with L4 policy only (declared TCP, or undeclared bytes that are not HTTP).

use std::sync::Arc;

use ambit_hbone::server::IncomingConnect;
use ambit_identity::SpiffeId;
use ambit_runtime::drain::DrainWatcher;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use crate::downstream::Downstream;
use crate::front::{front, Carriage};
use crate::upstream::Version;
use crate::Waypoint;

/// The most bytes read to tell HTTP from other traffic.
const SNIFF_BYTES: usize = 24;
/// How long a client may take to send its first bytes on a port that is sniffed.
const SNIFF_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Handles one CONNECT stream.
pub async fn handle(
    wp: Arc<Waypoint>,
    incoming: IncomingConnect,
    peer_identity: Option<SpiffeId>,
    drain: DrainWatcher,
) {
    let peer = incoming.peer().clone();
    let peer_ip = peer.addr.ip().to_canonical();
    let connect = match incoming.validate() {
        Ok(c) => c,
        Err(rejection) => {
            tracing::info!(peer = %peer.addr, "CONNECT refused: {}", rejection.reason);
            return incoming.reject(rejection.status);
        }
    };
    let state = wp.state.get();
    let me = wp.me(&state);
    let fronted = match front(&state, &wp.cfg.network, me.as_deref(), &connect.authority) {
        Ok(f) => f,
        Err(crate::front::NotFronted::NoSelf) => {
            tracing::warn!(
                authority = %connect.authority,
                "CONNECT refused: no workload in the mesh state is this waypoint (POD_NAMESPACE={}, POD_NAME={}, SERVICE_ACCOUNT={}); check that they name the waypoint's pod as the control plane knows it",
                wp.cfg.namespace,
                wp.cfg.pod_name,
                wp.cfg.service_account
            );
            wp.metrics.refused_authorities.inc();
            return incoming.reject(http::StatusCode::SERVICE_UNAVAILABLE);
        }
        Err(e) => {
            wp.metrics.refused_authorities.inc();
            tracing::info!(
                peer = %peer.addr,
                identity = ?peer_identity.as_ref().map(ToString::to_string),
                authority = %connect.authority,
                "CONNECT refused: {e}"
            );
            return incoming.reject(http::StatusCode::BAD_REQUEST);
        }
    };
    let source = state
        .workload_by_ip(&wp.cfg.network, peer_ip)
        .filter(|w| Some(w.identity()) == peer_identity);
    let destination_ip = match &connect.authority {
        ambit_hbone::Authority::Addr(a) => Some(a.ip()),
        ambit_hbone::Authority::Host { .. } => None,
    };
    let down = Arc::new(Downstream::new(
        peer_ip,
        peer_identity,
        source,
        fronted,
        destination_ip,
    ));
    drop(state);
    match down.fronted.carriage() {
        Carriage::Opaque => crate::tcp::carry(wp, down, incoming, drain).await,
        Carriage::Http | Carriage::Sniff => {
            // 200 now: the destination is one this waypoint fronts; what follows are
            // HTTP answers inside the tunnel.
            let Ok(mut stream) = incoming.accept(http::HeaderMap::new()) else {
                return;
            };
            let first = match tokio::time::timeout(SNIFF_TIMEOUT, read_first(&mut stream)).await {
                Ok(Ok(first)) => first,
                Ok(Err(e)) => return tracing::debug!("tunnel ended before its first bytes: {e}"),
                Err(_) => return tracing::debug!("no bytes within {SNIFF_TIMEOUT:?}: closed"),
            };
            let sniffed = sniff(&first).unwrap_or(Sniffed::Other);
            let io = Rewound::new(first, stream);
            match (sniffed, down.fronted.carriage()) {
                (Sniffed::Http2, _) => {
                    crate::http::serve(wp, down, io, Version::Http2, drain).await
                }
                (Sniffed::Http1, _) | (Sniffed::Other, Carriage::Http) => {
                    // On a declared HTTP port anything else is HTTP/1.1's to refuse.
                    crate::http::serve(wp, down, io, Version::Http1, drain).await
                }
                (Sniffed::Other, _) => crate::tcp::carry_accepted(wp, down, io, drain).await,
            }
        }
    }
}

/// The HTTP/2 client preface.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the first bytes of a stream are HTTP: the HTTP/2 preface (or a prefix of it
/// while fewer bytes have arrived), or an HTTP/1 request line's method and space.
/// `None`: not yet known.
pub fn sniff(first: &[u8]) -> Option<Sniffed> {
    if first.is_empty() {
        return None;
    }
    let n = first.len().min(H2_PREFACE.len());
    if first[..n] == H2_PREFACE[..n] {
        return (n == H2_PREFACE.len()).then_some(Sniffed::Http2);
    }
    // An HTTP/1 method is a token of letters; a space ends it.
    for (i, &b) in first.iter().enumerate().take(16) {
        if b == b' ' {
            return Some(if i > 0 {
                Sniffed::Http1
            } else {
                Sniffed::Other
            });
        }
        if !b.is_ascii_alphabetic() {
            return Some(Sniffed::Other);
        }
    }
    if first.len() >= 16 {
        Some(Sniffed::Other)
    } else {
        None
    }
}

/// What the first bytes showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniffed {
    Http1,
    Http2,
    Other,
}

/// Reads until the first bytes tell HTTP from other traffic (or the stream ends).
async fn read_first<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Bytes> {
    let mut buf = BytesMut::with_capacity(SNIFF_BYTES);
    loop {
        let mut chunk = [0u8; SNIFF_BYTES];
        let want = SNIFF_BYTES - buf.len();
        let n = s.read(&mut chunk[..want]).await?;
        buf.extend_from_slice(&chunk[..n]);
        if n == 0 || buf.len() >= SNIFF_BYTES || sniff(&buf).is_some() {
            return Ok(buf.freeze());
        }
    }
}

/// A stream with bytes already read put back in front.
pub struct Rewound<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewound<S> {
    pub fn new(prefix: Bytes, inner: S) -> Rewound<S> {
        Rewound { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewound<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewound<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn sniff_table() {
        let cases: &[(&[u8], Option<Sniffed>)] = &[
            (b"", None),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Some(Sniffed::Http2)),
            (b"PRI * HTTP", None),
            (b"GET / HTTP/1.1\r\n", Some(Sniffed::Http1)),
            (b"DELETE /x HTTP/1.1", Some(Sniffed::Http1)),
            (b"GE", None),
            (b"\x16\x03\x01", Some(Sniffed::Other)),
            (b" GET", Some(Sniffed::Other)),
            (b"SSH-2.0-OpenSSH", Some(Sniffed::Other)),
            (b"ABCDEFGHIJKLMNOPQ", Some(Sniffed::Other)),
            // Could still be an extension method.
            (b"PRX", None),
            (b"PRX / HTTP/1.1", Some(Sniffed::Http1)),
        ];
        for (bytes, want) in cases {
            assert_eq!(sniff(bytes), *want, "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    #[tokio::test]
    async fn rewound_gives_the_prefix_first() {
        let (mut a, b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b" world")
            .await
            .unwrap();
        drop(a);
        let mut r = Rewound::new(Bytes::from_static(b"hello"), b);
        let mut out = String::new();
        r.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "hello world");
    }
}
