//! The hardened server: tonic's routes served over our TLS and hyper's HTTP/2, one task
//! per connection, with everything a peer without credentials can make it hold bounded.
//!
//! - **Admission.** Connections go through an [`ambit_admission::Gate`]: a total and a
//!   per-source share; when a share is spent, the stalest connection that has not yet
//!   authenticated (least far through its handshake, then longest without progress) is
//!   closed for the newcomer, so a legitimate client is served while others flood.
//! - **Deadlines.** The TLS handshake must finish within `handshake_timeout`; the first
//!   authenticated request must come within `auth_timeout` of it; an authenticated
//!   connection without an open stream for `idle_timeout` is closed (GOAWAY).
//! - **Authentication before anything is held.** Each request's head goes to the
//!   [`Gatekeeper`] before its body is read or a stream is counted: a refusal is answered
//!   at once, trailers-only, with the gRPC status it gives. Accepted requests may carry
//!   a body deadline (unary calls: a slow body cannot pin a stream).
//! - **Stream shares.** At most `max_streams_per_connection` per connection and
//!   `max_streams_per_source` open at once per source IP (beyond: `RESOURCE_EXHAUSTED`).
//!
//! Each request carries tonic's `TcpConnectInfo`, so handlers' `remote_addr()` works.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ambit_admission::{Gate, Limits, ReportThrottle, Ticket};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio_rustls::LazyConfigAcceptor;
use tonic::body::BoxBody;
use tonic::service::Routes;
use tonic::transport::server::TcpConnectInfo;
use tonic::Status;
use tower_service::Service;

/// Stages of a connection's handshake, for the gate (later stages are evicted last).
const STAGE_HELLO: ambit_admission::Stage = 1;
const STAGE_TLS: ambit_admission::Stage = 2;

/// What a peer may make the server hold, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Connections at once, in total and per source IP.
    pub connections: Limits,
    /// Time a client has to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time, after the handshake, until the first authenticated request.
    pub auth_timeout: Duration,
    /// An authenticated connection with no open stream this long is closed.
    pub idle_timeout: Duration,
    pub max_streams_per_connection: u32,
    /// Streams open at once from one source IP, over all its connections.
    pub max_streams_per_source: usize,
    /// Bytes of request headers.
    pub max_header_list_size: u32,
    /// HTTP/2 keepalive pings and the time a PONG may take.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Time open connections have to finish once `stop` resolves.
    pub drain_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            connections: Limits::quarter_per_source(1024),
            handshake_timeout: Duration::from_secs(10),
            auth_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_streams_per_connection: 256,
            max_streams_per_source: 256,
            max_header_list_size: 16 * 1024,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(5),
        }
    }
}

/// What the gatekeeper lets a request hold.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestLimits {
    /// The whole request body must arrive within this (unary calls).
    pub body_deadline: Option<Duration>,
}

/// Decides a request from its head alone, before its body is read: `Err` is the status
/// the client gets (`UNAUTHENTICATED` for a missing or unknown token, say).
pub type Gatekeeper = Arc<dyn Fn(&http::request::Parts) -> Admission + Send + Sync>;

/// A gatekeeper's verdict: now, or once something it must ask (an API server's
/// TokenReview, say) has answered. Either way nothing of the body is read before it.
pub enum Admission {
    Now(Result<RequestLimits, Box<Status>>),
    Later(Pin<Box<dyn Future<Output = Result<RequestLimits, Box<Status>>> + Send>>),
}

/// Serves `routes` on `listener` over `tls` until `stop` resolves, then lets open
/// connections finish (GOAWAY) for at most `drain_timeout`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    routes: Routes,
    options: ServeOptions,
    gatekeeper: Gatekeeper,
    stop: impl Future<Output = ()>,
) {
    let gate = Gate::new(options.connections);
    let streams = Arc::new(SourceStreams {
        limit: options.max_streams_per_source,
        open: Mutex::new(HashMap::new()),
        reports: ReportThrottle::default(),
    });
    let shared = Arc::new(Server {
        tls,
        routes,
        options,
        gatekeeper,
        streams,
    });
    let (draining, drain_rx) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let reports = ReportThrottle::default();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = ambit_admission::accept(&listener, &gate, &reports, "gRPC server") => {
                let shared = shared.clone();
                let drain_rx = drain_rx.clone();
                connections.spawn(async move {
                    shared.connection(accepted, drain_rx).await;
                });
            }
            // Reap finished connections as they go, so the set stays small.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    draining.send_replace(true);
    let all_done = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(options.drain_timeout, all_done)
        .await
        .is_err()
    {
        tracing::debug!("closing the gRPC connections still open after the drain");
        connections.shutdown().await;
    }
}

struct Server {
    tls: Arc<rustls::ServerConfig>,
    routes: Routes,
    options: ServeOptions,
    gatekeeper: Gatekeeper,
    streams: Arc<SourceStreams>,
}

/// One connection's standing, shared by its task and its requests.
struct Connection {
    ticket: Ticket,
    peer: SocketAddr,
    /// Streams open now.
    open: AtomicUsize,
    /// When the last stream ended (or the handshake finished).
    quiet_since: Mutex<Instant>,
    /// A stream opened or ended: the connection's deadline is worked out again.
    changed: Notify,
}

impl Connection {
    /// When the connection is to be closed unless something changes first.
    fn deadline(&self, options: &ServeOptions, handshaken: Instant) -> Option<Instant> {
        if !self.ticket.is_proven() {
            return Some(handshaken + options.auth_timeout);
        }
        if self.open.load(Ordering::Acquire) == 0 {
            let quiet = *self.quiet_since.lock().unwrap_or_else(|p| p.into_inner());
            return Some(quiet + options.idle_timeout);
        }
        None
    }
}

impl Server {
    async fn connection(
        self: Arc<Self>,
        accepted: ambit_admission::Accepted,
        mut drain: watch::Receiver<bool>,
    ) {
        let ambit_admission::Accepted {
            stream,
            peer,
            ticket,
        } = accepted;
        let _ = stream.set_nodelay(true);
        let info = TcpConnectInfo {
            local_addr: stream.local_addr().ok(),
            remote_addr: Some(peer),
        };
        let handshake = async {
            let start =
                LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await?;
            ticket.advance(STAGE_HELLO);
            start.into_stream(self.tls.clone()).await
        };
        let tls = tokio::select! {
            r = tokio::time::timeout(self.options.handshake_timeout, handshake) => match r {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return tracing::debug!("TLS handshake from {peer} failed: {e}"),
                Err(_) => return tracing::debug!("TLS handshake from {peer} timed out"),
            },
            _ = ticket.evicted() => return,
            _ = drain.wait_for(|d| *d) => return,
        };
        ticket.advance(STAGE_TLS);
        let handshaken = Instant::now();
        let conn = Arc::new(Connection {
            ticket,
            peer,
            open: AtomicUsize::new(0),
            quiet_since: Mutex::new(handshaken),
            changed: Notify::new(),
        });
        let service = PerConnection {
            server: self.clone(),
            conn: conn.clone(),
            info,
        };
        let options = &self.options;
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(options.max_streams_per_connection)
            .max_header_list_size(options.max_header_list_size)
            .keep_alive_interval(options.keepalive_interval)
            .keep_alive_timeout(options.keepalive_timeout)
            // Rapid reset: streams reset before they are served end the connection.
            .max_pending_accept_reset_streams(20)
            .max_local_error_reset_streams(1024);
        let serving = builder.serve_connection(
            TokioIo::new(tls),
            hyper_util::service::TowerToHyperService::new(service),
        );
        tokio::pin!(serving);
        let mut closing: Option<Instant> = None;
        loop {
            let deadline = match closing {
                Some(at) => Some(at),
                None => conn.deadline(options, handshaken),
            };
            tokio::select! {
                r = serving.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("gRPC connection from {peer} ended: {e}");
                    }
                    return;
                }
                _ = conn.ticket.evicted() => {
                    tracing::debug!("closed the unauthenticated connection from {peer} for a newcomer");
                    return;
                }
                _ = conn.changed.notified() => {}
                _ = sleep_until(deadline) => {
                    if closing.is_some() {
                        return;
                    }
                    // Still due (a stream may have opened meanwhile)?
                    if conn.deadline(options, handshaken).is_some_and(|d| d <= Instant::now()) {
                        if conn.ticket.is_proven() {
                            tracing::debug!("closing the idle connection from {peer}");
                        } else {
                            tracing::debug!("closing the connection from {peer}: no authenticated request within {:?}", options.auth_timeout);
                        }
                        serving.as_mut().graceful_shutdown();
                        closing = Some(Instant::now() + options.drain_timeout);
                    }
                }
                _ = drain.wait_for(|d| *d), if closing.is_none() => {
                    serving.as_mut().graceful_shutdown();
                    closing = Some(Instant::now() + options.drain_timeout);
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Streams open per source IP.
struct SourceStreams {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
    reports: ReportThrottle,
}

impl SourceStreams {
    fn enter(self: &Arc<Self>, conn: &Arc<Connection>) -> Option<StreamGuard> {
        let source = conn.peer.ip().to_canonical();
        {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            let n = open.entry(source).or_insert(0);
            if *n >= self.limit {
                return None;
            }
            *n += 1;
        }
        conn.open.fetch_add(1, Ordering::AcqRel);
        conn.changed.notify_one();
        Some(StreamGuard {
            streams: self.clone(),
            conn: conn.clone(),
            source,
        })
    }
}

/// One open stream, counted until its response is done.
struct StreamGuard {
    streams: Arc<SourceStreams>,
    conn: Arc<Connection>,
    source: IpAddr,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        {
            let mut open = self.streams.open.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = open.get_mut(&self.source) {
                *n -= 1;
                if *n == 0 {
                    open.remove(&self.source);
                }
            }
        }
        *self
            .conn
            .quiet_since
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.conn.open.fetch_sub(1, Ordering::AcqRel);
        self.conn.changed.notify_one();
    }
}

/// The service of one connection: the gatekeeper, the stream shares, then the routes.
#[derive(Clone)]
struct PerConnection {
    server: Arc<Server>,
    conn: Arc<Connection>,
    info: TcpConnectInfo,
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<BoxBody>, tonic::codegen::StdError>> + Send>>;

impl Service<http::Request<Incoming>> for PerConnection {
    type Response = http::Response<BoxBody>;
    type Error = tonic::codegen::StdError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Incoming>) -> Self::Future {
        let (parts, body) = request.into_parts();
        match (self.server.gatekeeper)(&parts) {
            Admission::Now(Ok(limits)) => self.admitted(parts, body, limits),
            Admission::Now(Err(status)) => refuse(*status),
            Admission::Later(verdict) => {
                let mut this = self.clone();
                Box::pin(async move {
                    match verdict.await {
                        Ok(limits) => this.admitted(parts, body, limits).await,
                        Err(status) => Ok(status.into_http()),
                    }
                })
            }
        }
    }
}

impl PerConnection {
    /// A request the gatekeeper let through: its stream counted against the shares, its
    /// body bounded, then routed.
    fn admitted(
        &mut self,
        mut parts: http::request::Parts,
        body: Incoming,
        limits: RequestLimits,
    ) -> ResponseFuture {
        self.conn.ticket.prove();
        let Some(guard) = self.server.streams.enter(&self.conn) else {
            let streams = &self.server.streams;
            if streams
                .reports
                .due(Instant::now(), ambit_admission::accept::REPORT_EVERY)
            {
                tracing::warn!(
                    "{} already has {} gRPC streams open; refusing more (reported at most every 10 s)",
                    self.conn.peer.ip(),
                    streams.limit
                );
            }
            return refuse(Status::resource_exhausted(format!(
                "this address already has {} streams open",
                streams.limit
            )));
        };
        parts.extensions.insert(self.info.clone());
        let body = match limits.body_deadline {
            Some(limit) => tonic::body::boxed(BodyDeadline {
                inner: body,
                limit,
                deadline: Box::pin(tokio::time::sleep(limit)),
            }),
            None => tonic::body::boxed(body),
        };
        let mut routes = self.server.routes.clone();
        Box::pin(async move {
            let response = routes.call(http::Request::from_parts(parts, body)).await?;
            Ok(response.map(|inner| {
                tonic::body::boxed(Counted {
                    inner,
                    _guard: guard,
                })
            }))
        })
    }
}

fn refuse(status: Status) -> ResponseFuture {
    Box::pin(std::future::ready(Ok(status.into_http())))
}

pin_project_lite::pin_project! {
    /// A request body that must end within `limit` of the request.
    struct BodyDeadline {
        #[pin]
        inner: Incoming,
        limit: Duration,
        deadline: Pin<Box<tokio::time::Sleep>>,
    }
}

impl Body for BodyDeadline {
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if this.deadline.as_mut().poll(cx).is_ready() {
            let status = Status::deadline_exceeded(format!(
                "the request body did not arrive within {:?}",
                this.limit
            ));
            return Poll::Ready(Some(Err(Box::new(status))));
        }
        this.inner.poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// A response body that holds its stream's place until it is done.
    struct Counted {
        #[pin]
        inner: BoxBody,
        _guard: StreamGuard,
    }
}

impl Body for Counted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
