//! HBONE server: serve one accepted connection (TLS, HTTP/2, one handler task per CONNECT
//! stream), with keepalive and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream};
use http::{HeaderMap, Response, StatusCode};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::HboneError;
use crate::rate::{Idle, StreamRate};
use crate::request::{validate, Rejection, ValidatedConnect};
use crate::stream::H2Stream;
use crate::{keepalive, tls};

pub use crate::settings::H2Settings;

/// Server `max header list` (64 KiB).
pub const SERVER_MAX_HEADER_LIST: u32 = 64 * 1024;
/// Server per-stream send buffer (400 KiB).
pub const SERVER_MAX_SEND_BUFFER: usize = 400 * 1024;
/// Client-reset streams that may wait to be accepted before the connection is refused
/// (h2's default, named here).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;
/// Streams we may reset for a client's errors before the connection is refused (h2's
/// default, named here).
const MAX_LOCAL_ERROR_RESETS: usize = 1024;
/// How long an abruptly closed connection may take to flush its GOAWAY.
const ABRUPT_CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Who is on the other end of an HBONE connection.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The client's address (the "source" for policy and telemetry).
    pub addr: SocketAddr,
    /// The address the connection arrived on (the destination workload's IP in-pod).
    pub local_addr: SocketAddr,
    /// The client's certificate chain, leaf first (verified by the TLS config).
    pub certificates: Vec<CertificateDer<'static>>,
}

/// One CONNECT request awaiting an answer. Answer with [`IncomingConnect::accept`] (200 and
/// the tunnel) or [`IncomingConnect::reject`]. Dropping it unanswered answers 503.
pub struct IncomingConnect {
    parts: http::request::Parts,
    respond: Option<SendResponse<Bytes>>,
    recv: Option<RecvStream>,
    peer: Arc<PeerInfo>,
}

impl std::fmt::Debug for IncomingConnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IncomingConnect")
            .field("method", &self.parts.method)
            .field("uri", &self.parts.uri)
            .field("peer", &self.peer.addr)
            .finish()
    }
}

impl IncomingConnect {
    /// The request head (method, `:authority` in the URI, headers).
    pub fn request(&self) -> &http::request::Parts {
        &self.parts
    }

    /// The connection's peer.
    pub fn peer(&self) -> &Arc<PeerInfo> {
        &self.peer
    }

    /// Steps 1-2 of server processing (see [`crate::request::validate`]).
    pub fn validate(&self) -> Result<ValidatedConnect, Rejection> {
        validate(&self.parts)
    }

    /// Resolves when the client resets the stream (or its connection fails) before it is
    /// answered, with the reason; never, once answered. Race slow work (dialing the app)
    /// against it so a client that gave up does not leave it running.
    pub async fn client_reset(&mut self) -> Reason {
        let Some(respond) = self.respond.as_mut() else {
            return std::future::pending().await;
        };
        match std::future::poll_fn(|cx| respond.poll_reset(cx)).await {
            Ok(reason) => reason,
            Err(e) => e.reason().unwrap_or(Reason::CANCEL),
        }
    }

    /// Answers `status` with END_STREAM (no tunnel). Meant for non-2xx statuses.
    pub fn reject(mut self, status: StatusCode) {
        self.respond_end(status);
    }

    fn respond_end(&mut self, status: StatusCode) {
        self.recv = None;
        if let Some(mut respond) = self.respond.take() {
            let mut resp = Response::new(());
            *resp.status_mut() = status;
            if let Err(e) = respond.send_response(resp, true) {
                tracing::debug!(error = %e, %status, "could not send HBONE rejection");
            }
        }
    }

    /// Answers 200 with `response_headers` (e.g. the destination `baggage`) and returns the
    /// tunnel. Call it only once the upstream connection exists.
    pub fn accept(mut self, response_headers: HeaderMap) -> Result<H2Stream, HboneError> {
        let (Some(mut respond), Some(recv)) = (self.respond.take(), self.recv.take()) else {
            // Unreachable through the public API: answering consumes `self`.
            return Err(HboneError::from(h2::Error::from(Reason::INTERNAL_ERROR)));
        };
        let mut resp = Response::new(());
        *resp.status_mut() = StatusCode::OK;
        *resp.headers_mut() = response_headers;
        let send = respond.send_response(resp, false)?;
        Ok(H2Stream::new(send, recv))
    }
}

impl Drop for IncomingConnect {
    fn drop(&mut self) {
        if self.respond.is_some() {
            tracing::debug!(peer = %self.peer.addr, "HBONE request dropped unanswered; answering 503");
            self.respond_end(StatusCode::SERVICE_UNAVAILABLE);
        }
    }
}

/// A connection through its TLS and HTTP/2 handshakes, ready to be served with
/// [`Accepted::serve`]. Separate steps so a caller can hold a handshake slot (see the
/// proxy's admission limits) only while a client has not proved itself yet.
///
/// `S` is the stream HTTP/2 runs on: TLS over the transport, from [`accept`].
pub struct Accepted<S> {
    conn: h2::server::Connection<S, Bytes>,
    peer: Arc<PeerInfo>,
    settings: H2Settings,
}

impl<S> std::fmt::Debug for Accepted<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accepted")
            .field("peer", &self.peer.addr)
            .finish()
    }
}

/// How far a server handshake has got, reported to the caller's admission (which closes a
/// stalled handshake before one that is progressing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeStep {
    /// The client's ClientHello has arrived.
    ClientHello,
    /// TLS is done; the HTTP/2 preface is next.
    Tls,
}

/// [`accept`] on an accepted TCP connection (sets `TCP_NODELAY`; other socket options are
/// the caller's).
pub async fn accept_connection(
    tcp: TcpStream,
    tls: Arc<rustls::ServerConfig>,
    settings: H2Settings,
) -> Result<Accepted<tokio_rustls::server::TlsStream<TcpStream>>, HboneError> {
    let accepted = accept_connection_reporting(tcp, async { Some(tls) }, settings, |_| {}).await?;
    Ok(accepted.expect("the configuration was given"))
}

/// [`accept_connection`], calling `progress` at each [`HandshakeStep`], with the TLS
/// configuration awaited only once the ClientHello is in (so a handshake is seen to
/// progress before, say, a certificate is fetched). `Ok(None)` when `tls` gives none (the
/// caller has said why); the connection is then dropped.
pub async fn accept_connection_reporting(
    tcp: TcpStream,
    tls: impl Future<Output = Option<Arc<rustls::ServerConfig>>>,
    settings: H2Settings,
    progress: impl Fn(HandshakeStep),
) -> Result<Option<Accepted<tokio_rustls::server::TlsStream<TcpStream>>>, HboneError> {
    // HBONE carries interactive traffic; never delay small frames (PINGs, window updates).
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY on an HBONE connection");
    }
    let addr = tcp.peer_addr().map_err(HboneError::io)?;
    let local_addr = tcp.local_addr().map_err(HboneError::io)?;
    // The socket straight under TLS, without `ReadAhead`: the receiving side of a bulk
    // stream costs 15-22 % less CPU per GB without it on the Intel guest of the issue 9
    // round (interleaved A/B pairs, BENCHMARKS.md), the extra copy out of its buffer
    // outweighing the system calls it saves; and a client that has not finished its
    // handshake gets no read buffer of ours at all. The client keeps it (neutral there).
    accept_reporting(tcp, addr, local_addr, tls, settings, progress).await
}

/// The TLS handshake with `tls` (ALPN `h2` and a client certificate required), then the
/// HTTP/2 server handshake with `settings`, both within [`tls::HANDSHAKE_TIMEOUT`].
pub async fn accept<IO>(
    io: IO,
    addr: SocketAddr,
    local_addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    settings: H2Settings,
) -> Result<Accepted<tokio_rustls::server::TlsStream<IO>>, HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let accepted =
        accept_reporting(io, addr, local_addr, async { Some(tls) }, settings, |_| {}).await?;
    Ok(accepted.expect("the configuration was given"))
}

/// [`accept`], calling `progress` at each [`HandshakeStep`], with the configuration
/// awaited once the ClientHello is in (see [`accept_connection_reporting`]).
pub async fn accept_reporting<IO>(
    io: IO,
    addr: SocketAddr,
    local_addr: SocketAddr,
    tls: impl Future<Output = Option<Arc<rustls::ServerConfig>>>,
    settings: H2Settings,
    progress: impl Fn(HandshakeStep),
) -> Result<Option<Accepted<tokio_rustls::server::TlsStream<IO>>>, HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let deadline = Instant::now() + tls::HANDSHAKE_TIMEOUT;
    let timed_out = |_| HboneError::HandshakeTimeout(tls::HANDSHAKE_TIMEOUT);
    let hello = || progress(HandshakeStep::ClientHello);
    let Some(tls_stream) = tokio::time::timeout_at(deadline, tls::accept_reporting(io, tls, hello))
        .await
        .map_err(timed_out)??
    else {
        return Ok(None);
    };
    progress(HandshakeStep::Tls);
    let certificates = tls_stream
        .get_ref()
        .1
        .peer_certificates()
        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default();
    let peer = Arc::new(PeerInfo {
        addr,
        local_addr,
        certificates,
    });
    accept_h2(tls_stream, peer, settings, deadline)
        .await
        .map(Some)
}

/// The HTTP/2 server handshake on `stream`, which must already be the peer's
/// authenticated channel ([`accept`] runs it on TLS). Public so the fuzz target can drive
/// the server with raw HTTP/2 bytes; a proxy never serves HTTP/2 without TLS.
pub async fn accept_h2<S>(
    stream: S,
    peer: Arc<PeerInfo>,
    settings: H2Settings,
    deadline: Instant,
) -> Result<Accepted<S>, HboneError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let timed_out = |_| HboneError::HandshakeTimeout(tls::HANDSHAKE_TIMEOUT);
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(settings.stream_window())
        .initial_connection_window_size(settings.connection_window())
        .max_frame_size(settings.frame_size())
        .max_concurrent_streams(settings.max_concurrent_streams)
        .max_header_list_size(SERVER_MAX_HEADER_LIST)
        .max_send_buffer_size(SERVER_MAX_SEND_BUFFER)
        // Rapid reset: streams the client resets before we accept them, and streams we
        // had to reset for its errors, end the connection with ENHANCE_YOUR_CALM.
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS));
    let conn = tokio::time::timeout_at(deadline, builder.handshake::<_, Bytes>(stream))
        .await
        .map_err(timed_out)??;
    Ok(Accepted {
        conn,
        peer,
        settings,
    })
}

/// Serves one accepted TCP connection until it ends: [`accept_connection`], then
/// [`Accepted::serve`].
pub async fn serve_connection<H, F>(
    tcp: TcpStream,
    tls: Arc<rustls::ServerConfig>,
    settings: H2Settings,
    shutdown: watch::Receiver<bool>,
    handler: H,
) -> Result<(), HboneError>
where
    H: Fn(IncomingConnect) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    accept_connection(tcp, tls, settings)
        .await?
        .serve(shutdown, handler)
        .await
}

/// Serves one connection over any transport: [`accept`], then [`Accepted::serve`].
#[allow(clippy::too_many_arguments)]
pub async fn serve<IO, H, F>(
    io: IO,
    addr: SocketAddr,
    local_addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    settings: H2Settings,
    shutdown: watch::Receiver<bool>,
    handler: H,
) -> Result<(), HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(IncomingConnect) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    accept(io, addr, local_addr, tls, settings)
        .await?
        .serve(shutdown, handler)
        .await
}

impl<S> Accepted<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Who is on the other end.
    pub fn peer(&self) -> &Arc<PeerInfo> {
        &self.peer
    }

    /// Calls `handler` in a new task for each request stream until the connection ends.
    ///
    /// Pings the client every `ping_interval`; without a PONG within `ping_timeout` the
    /// connection is closed (GOAWAY `NO_ERROR`) and `PingTimeout` returned. A connection
    /// without streams for `idle_timeout` is closed (GOAWAY `NO_ERROR`, `Ok`); one whose
    /// client opens streams faster than `max_stream_rate` gets GOAWAY `ENHANCE_YOUR_CALM`
    /// (`StreamRate`). When `shutdown` turns `true`, sends GOAWAY and keeps serving
    /// in-flight streams until they finish (dropping the sender is not a shutdown signal).
    /// Returns `Ok` when the connection closed cleanly; garbage is an error, never a panic.
    pub async fn serve<H, F>(
        self,
        mut shutdown: watch::Receiver<bool>,
        handler: H,
    ) -> Result<(), HboneError>
    where
        H: Fn(IncomingConnect) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let Accepted {
            mut conn,
            peer,
            settings,
        } = self;
        let addr = peer.addr;
        let keepalive = keepalive::run(
            conn.ping_pong(),
            settings.ping_interval,
            settings.ping_timeout,
        );
        tokio::pin!(keepalive);
        let now = Instant::now().into_std();
        let mut rate = StreamRate::new(settings.max_stream_rate, settings.stream_burst, now);
        let mut idle = Idle::new(settings.idle_timeout, now);
        let idle_check = tokio::time::sleep_until(next_idle_check(&idle));
        tokio::pin!(idle_check);
        let handler = Arc::new(handler);
        let mut draining = false;

        loop {
            tokio::select! {
                next = conn.accept() => match next {
                    Some(Ok((req, respond))) => {
                        let now = Instant::now().into_std();
                        idle.busy(now);
                        if !rate.take(now) {
                            tracing::warn!(
                                peer = %addr,
                                limit = settings.max_stream_rate,
                                "HBONE client opens streams faster than allowed; \
                                 closing its connection with ENHANCE_YOUR_CALM"
                            );
                            close_abruptly(&mut conn, Reason::ENHANCE_YOUR_CALM).await;
                            return Err(HboneError::StreamRate(settings.max_stream_rate));
                        }
                        let (parts, recv) = req.into_parts();
                        let incoming = IncomingConnect {
                            parts,
                            respond: Some(respond),
                            recv: Some(recv),
                            peer: peer.clone(),
                        };
                        let handler = handler.clone();
                        tokio::spawn(async move { handler(incoming).await });
                    }
                    Some(Err(e)) => {
                        if is_clean_close(&e, conn.has_streams()) {
                            return Ok(());
                        }
                        return Err(e.into());
                    }
                    None => return Ok(()),
                },
                _ = wait_for_shutdown(&mut shutdown), if !draining => {
                    tracing::debug!(peer = %addr, "HBONE connection draining: GOAWAY sent");
                    draining = true;
                    conn.graceful_shutdown();
                }
                _ = &mut idle_check, if !draining => {
                    let now = Instant::now().into_std();
                    if conn.has_streams() {
                        idle.busy(now);
                    } else if idle.expired(now) {
                        tracing::debug!(peer = %addr, "HBONE connection idle: GOAWAY sent");
                        draining = true;
                        conn.graceful_shutdown();
                    }
                    idle_check.as_mut().reset(next_idle_check(&idle));
                }
                err = &mut keepalive => {
                    tracing::debug!(peer = %addr, error = %err, "HBONE keepalive failed; closing connection");
                    close_abruptly(&mut conn, Reason::NO_ERROR).await;
                    return Err(err);
                }
            }
        }
    }
}

/// Sends GOAWAY with `reason` and gives it a moment to be written (the peer may be gone).
async fn close_abruptly<S>(conn: &mut h2::server::Connection<S, Bytes>, reason: Reason)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    conn.abrupt_shutdown(reason);
    let _ = tokio::time::timeout(ABRUPT_CLOSE_GRACE, async {
        while let Some(Ok(_)) = conn.accept().await {}
    })
    .await;
}

/// When to look at idleness next: at its deadline, or (never idle) far away.
fn next_idle_check(idle: &Idle) -> Instant {
    idle.deadline()
        .map(Instant::from_std)
        .unwrap_or_else(|| Instant::now() + std::time::Duration::from_secs(86_400 * 365))
}

/// A peer's GOAWAY `NO_ERROR`, or the peer disconnecting while no stream is open (a client
/// closing its idle pooled connection may race one of our PINGs), is a normal end.
fn is_clean_close(e: &h2::Error, has_streams: bool) -> bool {
    if e.is_go_away() && e.reason() == Some(Reason::NO_ERROR) {
        return true;
    }
    !has_streams
        && e.get_io().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::UnexpectedEof
            )
        })
}

/// Resolves once the shutdown flag is `true`; never, if the sender is gone while it is `false`.
async fn wait_for_shutdown(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}
