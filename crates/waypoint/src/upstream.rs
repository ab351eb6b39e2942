//! Onward connections: HBONE to `podIP:15008` with the waypoint's own identity (the
//! endpoint's identity verified), or plaintext to an endpoint outside the mesh; and,
//! inside them, pooled HTTP connections so that each request is balanced on its own while
//! no request pays for a new tunnel.
//!
//! HTTP/2 upstream: one multiplexed connection per endpoint, made again when it closes.
//! HTTP/1.1 upstream: idle connections per endpoint, each handed back once its response
//! has been read to the end (hyper's `ready`), at most [`MAX_IDLE_H1`] kept.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_hbone::{Authority, ConnectRequest, HboneError, Pool, PoolKey, TraceParent};
use ambit_identity::{CertManager, SpiffeId};
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};

/// The body type carried both ways.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Idle HTTP/1.1 connections kept per endpoint.
pub const MAX_IDLE_H1: usize = 64;
/// The ALPN a sidecar's inbound listener takes Istio mTLS with.
pub const ISTIO_ALPN: &[u8] = b"istio";
/// How long a new onward tunnel and its HTTP handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Transport {
    /// HBONE to `next_hop` (the pod's node proxy port), CONNECT to the target; the server
    /// must present one of `identities`.
    Hbone {
        next_hop: SocketAddr,
        identities: Vec<SpiffeId>,
    },
    /// Plain TCP to the target: a workload outside the mesh.
    Plain,
    /// Istio mTLS to the target's own port, as to a pod with a sidecar (its inbound
    /// listener): the waypoint's certificate, ALPN `istio`, the server one of
    /// `identities`.
    IstioMtls { identities: Vec<SpiffeId> },
    /// TLS over TCP to the target (a DestinationRule's `tls`), sending `server_name`.
    Tls {
        origin: Arc<crate::tls_origin::TlsOrigin>,
        server_name: String,
    },
}

/// One endpoint and how it is reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// `podIP:targetPort`.
    pub target: SocketAddr,
    pub transport: Transport,
}

/// Which HTTP the onward connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    Http1,
    Http2,
}

/// Why an onward request failed before a response.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The tunnel or TCP connection could not be made: another endpoint may do.
    #[error("connection failure: {0}")]
    Connect(String),
}

impl UpstreamError {}

/// The pools of onward connections.
pub struct Upstream {
    hbone: Pool,
    certs: Arc<CertManager>,
    identity: SpiffeId,
    /// The address onward connections come from (`INSTANCE_IP`), if set.
    source_ip: Option<IpAddr>,
    h1: Mutex<HashMap<Endpoint, Vec<http1::SendRequest<Body>>>>,
    h2: Mutex<HashMap<Endpoint, http2::SendRequest<Body>>>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("identity", &self.identity)
            .field("hbone_connections", &self.hbone.connection_count())
            .finish()
    }
}

impl Upstream {
    pub fn new(
        certs: Arc<CertManager>,
        identity: SpiffeId,
        source_ip: Option<IpAddr>,
    ) -> Arc<Upstream> {
        Arc::new(Upstream {
            hbone: Pool::new(ambit_hbone::ClientSettings::default()),
            certs,
            identity,
            source_ip,
            h1: Mutex::default(),
            h2: Mutex::default(),
        })
    }

    /// A pooled connection of `version` to `endpoint`, ready for one request. A failure
    /// here reached nothing: the request may go to another endpoint.
    pub async fn connect(
        self: &Arc<Self>,
        endpoint: &Endpoint,
        version: Version,
    ) -> Result<Sender, UpstreamError> {
        // Originated TLS offers only HTTP/1.1 (an origin outside the mesh may speak
        // nothing else).
        let version = match endpoint.transport {
            Transport::Tls { .. } => Version::Http1,
            _ => version,
        };
        Ok(match version {
            Version::Http2 => Sender::Http2(self.h2_sender(endpoint).await?),
            Version::Http1 => Sender::Http1 {
                sender: self.h1_sender(endpoint).await?,
                pool: self.clone(),
                endpoint: endpoint.clone(),
            },
        })
    }

    async fn h2_sender(
        &self,
        endpoint: &Endpoint,
    ) -> Result<http2::SendRequest<Body>, UpstreamError> {
        if let Some(s) = self
            .h2
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(endpoint)
        {
            if !s.is_closed() {
                return Ok(s.clone());
            }
        }
        let io = self.open(endpoint).await?;
        let (sender, conn) = tokio::time::timeout(
            CONNECT_TIMEOUT,
            http2::Builder::new(TokioExecutor::new()).handshake(TokioIo::new(io)),
        )
        .await
        .map_err(|_| UpstreamError::Connect("HTTP/2 handshake timed out".into()))?
        .map_err(|e| UpstreamError::Connect(format!("HTTP/2 handshake: {e}")))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("onward HTTP/2 connection ended: {e}");
            }
        });
        self.h2
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(endpoint.clone(), sender.clone());
        Ok(sender)
    }

    async fn h1_sender(
        &self,
        endpoint: &Endpoint,
    ) -> Result<http1::SendRequest<Body>, UpstreamError> {
        loop {
            let idle = self
                .h1
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(endpoint)
                .and_then(Vec::pop);
            match idle {
                // Handed back as its last response ended: ready once its connection has
                // taken that in, or failed if the connection is closing.
                Some(mut s) if !s.is_closed() => {
                    if s.ready().await.is_ok() {
                        return Ok(s);
                    }
                }
                Some(_) => continue,
                None => break,
            }
        }
        let io = self.open(endpoint).await?;
        let (sender, conn) = tokio::time::timeout(
            CONNECT_TIMEOUT,
            http1::Builder::new().handshake(TokioIo::new(io)),
        )
        .await
        .map_err(|_| UpstreamError::Connect("HTTP/1.1 handshake timed out".into()))?
        .map_err(|e| UpstreamError::Connect(format!("HTTP/1.1 handshake: {e}")))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!("onward HTTP/1.1 connection ended: {e}");
            }
        });
        Ok(sender)
    }

    /// Keeps an HTTP/1.1 connection for the next request to `endpoint`, up to
    /// [`MAX_IDLE_H1`] per endpoint.
    fn put_idle_h1(&self, endpoint: Endpoint, sender: http1::SendRequest<Body>) {
        let mut idle = self.h1.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.entry(endpoint).or_default();
        if list.len() < MAX_IDLE_H1 {
            list.push(sender);
        }
    }

    /// A new byte stream to the endpoint: a CONNECT stream on a pooled HBONE connection,
    /// or a TCP connection.
    pub async fn open(&self, endpoint: &Endpoint) -> Result<Onward, UpstreamError> {
        match &endpoint.transport {
            Transport::Plain => {
                let tcp = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tcp_connect(endpoint.target, self.source_ip),
                )
                .await
                .map_err(|_| UpstreamError::Connect("TCP connect timed out".into()))?
                .map_err(|e| UpstreamError::Connect(format!("TCP connect: {e}")))?;
                let _ = tcp.set_nodelay(true);
                Ok(Onward::Tcp(tcp))
            }
            Transport::IstioMtls { identities } => {
                let tls = self
                    .certs
                    .client_config(&self.identity, identities)
                    .await
                    .map_err(|e| UpstreamError::Connect(format!("no client TLS: {e}")))?;
                let mut config = (*tls).clone();
                config.alpn_protocols = vec![ISTIO_ALPN.to_vec()];
                let connected = tokio::time::timeout(CONNECT_TIMEOUT, async {
                    let tcp = tcp_connect(endpoint.target, self.source_ip)
                        .await
                        .map_err(|e| format!("TCP connect: {e}"))?;
                    let _ = tcp.set_nodelay(true);
                    // The name is not what is checked: the verifier wants a SPIFFE id.
                    let name =
                        rustls::pki_types::ServerName::IpAddress(endpoint.target.ip().into());
                    tokio_rustls::TlsConnector::from(Arc::new(config))
                        .connect(name, tcp)
                        .await
                        .map_err(|e| format!("Istio mTLS to {}: {e}", endpoint.target))
                })
                .await
                .map_err(|_| UpstreamError::Connect("TCP and mTLS connect timed out".into()))?
                .map_err(UpstreamError::Connect)?;
                Ok(Onward::Tls(Box::new(connected)))
            }
            Transport::Tls {
                origin,
                server_name,
            } => {
                let name =
                    rustls::pki_types::ServerName::try_from(server_name.clone()).map_err(|_| {
                        UpstreamError::Connect(format!(
                            "{server_name:?} is not a server name to send"
                        ))
                    })?;
                let connected = tokio::time::timeout(CONNECT_TIMEOUT, async {
                    let tcp = tcp_connect(endpoint.target, self.source_ip)
                        .await
                        .map_err(|e| format!("TCP connect: {e}"))?;
                    let _ = tcp.set_nodelay(true);
                    tokio_rustls::TlsConnector::from(origin.config.clone())
                        .connect(name, tcp)
                        .await
                        .map_err(|e| format!("TLS to {server_name}: {e}"))
                })
                .await
                .map_err(|_| UpstreamError::Connect("TCP and TLS connect timed out".into()))?
                .map_err(UpstreamError::Connect)?;
                Ok(Onward::Tls(Box::new(connected)))
            }
            Transport::Hbone {
                next_hop,
                identities,
            } => {
                let stream = self
                    .hbone_stream(endpoint.target, *next_hop, identities)
                    .await
                    .map_err(|e| UpstreamError::Connect(e.to_string()))?;
                Ok(Onward::Hbone(Box::new(stream)))
            }
        }
    }

    async fn hbone_stream(
        &self,
        target: SocketAddr,
        next_hop: SocketAddr,
        identities: &[SpiffeId],
    ) -> Result<ambit_hbone::H2Stream, HboneError> {
        let key = PoolKey {
            src_identity: self.identity.to_string(),
            dst_identities: identities.iter().map(ToString::to_string).collect(),
            dst: next_hop,
            src_ip: self.source_ip.unwrap_or_else(|| unspecified(next_hop.ip())),
        };
        let request = ConnectRequest {
            authority: Authority::Addr(target),
            baggage: None,
            forwarded: None,
            traceparent: Some(TraceParent::random()),
        };
        let certs = self.certs.clone();
        let identity = self.identity.clone();
        let expected = identities.to_vec();
        let source_ip = self.source_ip;
        let connector = move || async move {
            let tls = certs
                .client_config(&identity, &expected)
                .await
                .map_err(|e| {
                    HboneError::Tls(Arc::new(std::io::Error::other(format!(
                        "no client TLS for {identity}: {e}"
                    ))))
                })?;
            let tcp = tcp_connect(next_hop, source_ip).await?;
            let _ = tcp.set_nodelay(true);
            ambit_hbone::tls::connect(ambit_hbone::ReadAhead::new(tcp), tls).await
        };
        self.hbone.connect(key, connector, &request).await
    }
}

/// A TCP connection to `dst`, from `source` when given and of the same family.
async fn tcp_connect(
    dst: SocketAddr,
    source: Option<IpAddr>,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = match dst {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    if let Some(ip) = source.filter(|ip| ip.is_ipv4() == dst.is_ipv4()) {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    socket.connect(dst).await
}

fn unspecified(like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

/// A request made for HTTP/2 sent on HTTP/1.1 (to an origin that speaks only that):
/// `Host` from its authority, the target in origin form.
fn as_http1(mut req: http::Request<Body>) -> http::Request<Body> {
    if req.version() != http::Version::HTTP_2 {
        return req;
    }
    *req.version_mut() = http::Version::HTTP_11;
    if let Some(authority) = req.uri().authority().cloned() {
        if !req.headers().contains_key(http::header::HOST) {
            if let Ok(v) = http::HeaderValue::from_str(authority.as_str()) {
                req.headers_mut().insert(http::header::HOST, v);
            }
        }
    }
    let target = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    if let Ok(uri) = target.parse() {
        *req.uri_mut() = uri;
    }
    req
}

/// A connection taken from the pool for one request.
pub enum Sender {
    Http2(http2::SendRequest<Body>),
    Http1 {
        sender: http1::SendRequest<Body>,
        pool: Arc<Upstream>,
        endpoint: Endpoint,
    },
}

impl Sender {
    /// Sends the request. An HTTP/1.1 connection goes back to the pool when its response
    /// body has been read to the end (in the task reading it: no task of its own per
    /// request). A request the connection never wrote comes back in the error, to be sent
    /// elsewhere.
    pub async fn send(self, req: http::Request<Body>) -> Result<http::Response<Body>, SendError> {
        let failed = |mut e: hyper::client::conn::TrySendError<http::Request<Body>>| SendError {
            unsent: e.take_message(),
            error: e.into_error(),
        };
        match self {
            Sender::Http2(mut s) => match s.try_send_request(req).await {
                Ok(r) => Ok(r.map(|b| b.map_err(BoxError::from).boxed_unsync())),
                Err(e) => Err(failed(e)),
            },
            Sender::Http1 {
                mut sender,
                pool,
                endpoint,
            } => match sender.try_send_request(as_http1(req)).await {
                Ok(r) => Ok(r.map(|inner| {
                    HandsBack {
                        inner,
                        back: Some((sender, pool, endpoint)),
                    }
                    .boxed_unsync()
                })),
                Err(e) => Err(failed(e)),
            },
        }
    }
}

/// An HTTP/1.1 response body that returns its connection to the pool once read to its end
/// (or, if nobody reads a body that is already complete, when dropped). A body abandoned
/// part way leaves the connection to close.
struct HandsBack {
    inner: hyper::body::Incoming,
    back: Option<(http1::SendRequest<Body>, Arc<Upstream>, Endpoint)>,
}

impl HandsBack {
    fn hand_back(&mut self) {
        if let Some((sender, pool, endpoint)) = self.back.take() {
            pool.put_idle_h1(endpoint, sender);
        }
    }
}

impl Drop for HandsBack {
    fn drop(&mut self) {
        if http_body::Body::is_end_stream(&self.inner) {
            self.hand_back();
        }
    }
}

impl http_body::Body for HandsBack {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(None) => self.hand_back(),
            std::task::Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled.map(|f| f.map(|r| r.map_err(BoxError::from)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A send that failed before a response began.
#[derive(Debug)]
pub struct SendError {
    pub error: hyper::Error,
    /// The request, when the connection never wrote it.
    pub unsent: Option<http::Request<Body>>,
}

impl SendError {
    /// Whether the upstream never took the request: it came back unwritten, or the
    /// HTTP/2 stream was refused (`REFUSED_STREAM`: the server did not process it).
    pub fn not_taken(&self) -> bool {
        self.unsent.is_some() || refused_stream(&self.error)
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

/// Whether an error's cause is an HTTP/2 `REFUSED_STREAM` reset.
fn refused_stream(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        cause = e.source();
    }
    false
}

/// An onward byte stream.
pub enum Onward {
    Hbone(Box<ambit_hbone::H2Stream>),
    Tcp(tokio::net::TcpStream),
    /// TLS originated to an endpoint outside the mesh.
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

impl AsyncRead for Onward {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Onward::Hbone(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
            Onward::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Onward::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Onward {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Onward::Hbone(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
            Onward::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Onward::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Onward::Hbone(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
            Onward::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            Onward::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Onward::Hbone(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
            Onward::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Onward::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
