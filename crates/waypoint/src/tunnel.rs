//! One CONNECT stream into the waypoint: its authority checked against what this
//! waypoint fronts (refused with 400 otherwise, counted and logged), then carried by the
//! port's protocol: HTTP (declared, or sniffed on undeclared ports) or an opaque tunnel
//! with L4 policy only (declared TCP, or undeclared bytes that are not HTTP).

use std::net::IpAddr;
use std::sync::Arc;

use ambit_hbone::server::IncomingConnect;
use ambit_identity::SpiffeId;
use ambit_runtime::drain::DrainWatcher;
use ambit_state::Workload;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use crate::front::{front, Carriage, Fronted};
use crate::http::{sniff, Sniffed};
use crate::metrics::RequestLabels;
use crate::upstream::Version;
use crate::Waypoint;

/// The most bytes read to tell HTTP from other traffic.
const SNIFF_BYTES: usize = 24;
/// How long a client may take to send its first bytes on a port that is sniffed.
const SNIFF_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Who sent a tunnel and where it goes: the same for every request in it.
#[derive(Debug)]
pub struct Downstream {
    /// The HBONE peer: the client workload's address.
    pub peer_ip: IpAddr,
    /// The HBONE peer's verified identity.
    pub peer_identity: Option<SpiffeId>,
    /// The peer's workload, found by its address and identity.
    pub source: Option<Arc<Workload>>,
    pub fronted: Fronted,
    /// The CONNECT's `:authority` destination IP (the VIP or pod IP dialed), if an IP.
    pub destination_ip: Option<IpAddr>,
}

impl Downstream {
    /// The source half of the metric labels, and the fronted service.
    pub fn labels(&self) -> RequestLabels {
        let unknown = || "unknown".to_string();
        let src = self.source.as_deref();
        let mut l = RequestLabels {
            reporter: "waypoint",
            source_workload: src.map_or_else(unknown, |w| w.workload_name.clone()),
            source_canonical_service: src.map_or_else(unknown, |w| w.canonical_name.clone()),
            source_canonical_revision: src
                .map(|w| w.canonical_revision.clone())
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "latest".into()),
            source_workload_namespace: self
                .peer_identity
                .as_ref()
                .map_or_else(unknown, |i| i.namespace().to_string()),
            source_principal: self
                .peer_identity
                .as_ref()
                .map_or_else(unknown, |i| i.to_string()),
            source_app: src.map_or_else(unknown, |w| w.canonical_name.clone()),
            source_version: src.map_or_else(unknown, |w| w.canonical_revision.clone()),
            source_cluster: src.map_or_else(unknown, |w| w.cluster_id.clone()),
            request_protocol: "http",
            response_flags: "-",
            connection_security_policy: "mutual_tls",
            ..RequestLabels::default()
        };
        destination_labels(&mut l, &self.fronted, None);
        l
    }
}

/// Fills the destination half of `l`: the service being served, and the chosen
/// endpoint's workload when there is one.
pub fn destination_labels(l: &mut RequestLabels, fronted: &Fronted, endpoint: Option<&Workload>) {
    let unknown = || "unknown".to_string();
    match fronted.service() {
        Some(s) => {
            l.destination_service = s.hostname.clone();
            l.destination_service_name = s.name.clone();
            l.destination_service_namespace = s.namespace.clone();
        }
        None => {
            l.destination_service = unknown();
            l.destination_service_name = unknown();
            l.destination_service_namespace = unknown();
        }
    }
    let w = endpoint.or(match fronted {
        Fronted::Workload { workload, .. } => Some(workload.as_ref()),
        Fronted::Service { .. } => None,
    });
    l.destination_workload = w.map_or_else(unknown, |w| w.workload_name.clone());
    l.destination_workload_namespace = w.map_or_else(unknown, |w| w.namespace.clone());
    l.destination_canonical_service = w.map_or_else(unknown, |w| w.canonical_name.clone());
    l.destination_canonical_revision = w
        .map(|w| w.canonical_revision.clone())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(unknown);
    // Only an endpoint reached over HBONE proves an identity.
    l.destination_principal = w
        .filter(|w| w.protocol == ambit_state::TunnelProtocol::Hbone)
        .map_or_else(unknown, |w| w.identity().to_string());
    l.destination_app = w.map_or_else(unknown, |w| w.canonical_name.clone());
    l.destination_version = w.map_or_else(unknown, |w| w.canonical_revision.clone());
    l.destination_cluster = w.map_or_else(unknown, |w| w.cluster_id.clone());
}

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
    let down = Arc::new(Downstream {
        peer_ip,
        peer_identity,
        source,
        fronted,
        destination_ip,
    });
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
