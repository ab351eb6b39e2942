//! HBONE client: a pool of HTTP/2 connections keyed by [`PoolKey`], each carrying many CONNECT
//! streams.
//!
//! Rules (Istio-compatible):
//! - at most `min(max_streams_per_connection, peer SETTINGS_MAX_CONCURRENT_STREAMS)` streams
//!   per connection; a full connection makes the pool dial another one for the key;
//! - concurrent callers that find no usable connection are single-flighted: one dials, the
//!   others wait and then reuse (or all get the dial's error);
//! - a connection that received GOAWAY or failed is never handed out again; a stream refused
//!   because of a GOAWAY race is retried on another connection;
//! - a connection with no streams that was not used for `idle_timeout` leaves the pool and
//!   closes;
//! - every connection PINGs its peer (10 s / 20 s by default) and is torn down when the peer
//!   stops answering.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::error::HboneError;
use crate::keepalive;
use crate::request::ConnectRequest;
use crate::stream::H2Stream;

pub use crate::settings::H2Settings;

/// Client `max header list` (16 KiB).
pub const CLIENT_MAX_HEADER_LIST: u32 = 16 * 1024;
/// `POOL_MAX_STREAMS_PER_CONNECTION` default.
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 100;
/// `POOL_UNUSED_RELEASE_TIMEOUT` default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Outgoing connect timeout default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times a stream refused by a going-away connection is retried elsewhere.
const MAX_UNPROCESSED_RETRIES: usize = 3;

/// What makes two tunnels shareable on one connection: same source identity, same expected
/// destination identities, same next hop, same downstream source IP.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// The SPIFFE id we present.
    pub src_identity: String,
    /// The SPIFFE ids the server may have (the caller's TLS config checks them).
    pub dst_identities: Vec<String>,
    /// The next hop: `ip:15008` of the destination node proxy, waypoint or gateway.
    pub dst: SocketAddr,
    /// The downstream client's IP.
    pub src_ip: IpAddr,
}

/// Client tuning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientSettings {
    /// Windows, frame size and keepalive (`max_concurrent_streams` is not used by clients).
    pub h2: H2Settings,
    /// `POOL_MAX_STREAMS_PER_CONNECTION` (100).
    pub max_streams_per_connection: u32,
    /// `POOL_UNUSED_RELEASE_TIMEOUT` (5 min).
    pub idle_timeout: Duration,
    /// Limit for the caller's connect function plus the HTTP/2 handshake (10 s).
    pub connect_timeout: Duration,
    /// How long a CONNECT may wait for its status (15 s: the server answers only after its
    /// own 10 s upstream connect, so it gets room to say 503 first).
    pub response_timeout: Duration,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            h2: H2Settings::default(),
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: Duration::from_secs(15),
        }
    }
}

/// The HBONE connection pool. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("connections", &self.connection_count())
            .finish()
    }
}

struct Inner {
    settings: ClientSettings,
    keys: Mutex<HashMap<PoolKey, Entry>>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Entry {
    conns: Vec<Pooled>,
    dial: Option<Dialing>,
}

/// A dial in progress for a key.
struct Dialing {
    id: u64,
    rx: watch::Receiver<DialState>,
}

#[derive(Clone)]
enum DialState {
    Pending,
    Ready,
    Failed(HboneError),
}

/// A pooled connection: the handle to open streams, plus its shared state.
struct Pooled {
    send: SendRequest<Bytes>,
    state: Arc<ConnState>,
}

/// State shared by the pool, the connection's driver task and its streams.
struct ConnState {
    id: u64,
    active: AtomicUsize,
    last_used: Mutex<Instant>,
    /// Cleared on GOAWAY, error, keepalive failure or idle eviction.
    usable: AtomicBool,
    /// Signalled when the last stream ends, so the driver can restart its idle timer.
    became_idle: Notify,
}

impl ConnState {
    fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
    fn last_used(&self) -> Instant {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A stream's claim on its connection; released when the stream is dropped.
struct Slot(Arc<ConnState>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.touch();
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.became_idle.notify_one();
        }
    }
}

impl Pooled {
    /// Not known to be dead, and h2 reports no connection error (a received GOAWAY counts).
    fn is_usable(&self) -> bool {
        if !self.state.usable.load(Ordering::Acquire) {
            return false;
        }
        let mut send = self.send.clone();
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(Err(_)) = send.poll_ready(&mut cx) {
            self.state.usable.store(false, Ordering::Release);
            return false;
        }
        true
    }
}

/// What a caller does next.
enum Step {
    Use(SendRequest<Bytes>, Slot),
    Wait(watch::Receiver<DialState>),
    Dial(DialTicket),
    CannotDial,
}

/// The right (and duty) to dial for a key; waiters are told how it ended.
struct DialTicket {
    inner: Arc<Inner>,
    key: PoolKey,
    id: u64,
    tx: watch::Sender<DialState>,
    done: bool,
}

impl DialTicket {
    /// Adds the new connection to the pool with one stream slot taken for the dialer.
    fn publish(mut self, send: SendRequest<Bytes>, state: Arc<ConnState>) -> Slot {
        state.active.store(1, Ordering::Release);
        let slot = Slot(state.clone());
        {
            let mut keys = self.inner.lock();
            let entry = keys.entry(self.key.clone()).or_default();
            entry.conns.push(Pooled { send, state });
            if entry.dial.as_ref().is_some_and(|d| d.id == self.id) {
                entry.dial = None;
            }
        }
        self.done = true;
        self.tx.send_replace(DialState::Ready);
        slot
    }

    fn fail(mut self, e: HboneError) {
        self.clear();
        self.done = true;
        self.tx.send_replace(DialState::Failed(e));
    }

    fn clear(&self) {
        let mut keys = self.inner.lock();
        if let Some(entry) = keys.get_mut(&self.key) {
            if entry.dial.as_ref().is_some_and(|d| d.id == self.id) {
                entry.dial = None;
            }
            if entry.conns.is_empty() && entry.dial.is_none() {
                keys.remove(&self.key);
            }
        }
    }
}

impl Drop for DialTicket {
    fn drop(&mut self) {
        // The dialing caller was cancelled: let a waiter take over (the sender drops here).
        if !self.done {
            self.clear();
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, HashMap<PoolKey, Entry>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next_step(self: &Arc<Self>, key: &PoolKey, can_dial: bool) -> Step {
        let max_cfg = self.settings.max_streams_per_connection.max(1) as usize;
        let mut keys = self.lock();
        let entry = keys.entry(key.clone()).or_default();
        entry.conns.retain(Pooled::is_usable);
        for c in &entry.conns {
            let max = max_cfg.min(c.send.current_max_send_streams()).max(1);
            // Increments happen only under the pool lock, so this cannot overshoot `max`.
            if c.state.active.load(Ordering::Acquire) < max {
                c.state.active.fetch_add(1, Ordering::AcqRel);
                c.state.touch();
                return Step::Use(c.send.clone(), Slot(c.state.clone()));
            }
        }
        if let Some(d) = &entry.dial {
            return Step::Wait(d.rx.clone());
        }
        if !can_dial {
            if entry.conns.is_empty() {
                keys.remove(key);
            }
            return Step::CannotDial;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(DialState::Pending);
        entry.dial = Some(Dialing { id, rx });
        Step::Dial(DialTicket {
            inner: self.clone(),
            key: key.clone(),
            id,
            tx,
            done: false,
        })
    }

    /// Takes connection `id` out of the pool (it keeps running until its streams end).
    fn remove(&self, key: &PoolKey, id: u64) {
        let mut keys = self.lock();
        if let Some(entry) = keys.get_mut(key) {
            entry.conns.retain(|c| c.state.id != id);
            if entry.conns.is_empty() && entry.dial.is_none() {
                keys.remove(key);
            }
        }
    }

    /// Removes the connection if it has no streams and was last used `idle` ago or more.
    fn evict_if_idle(&self, key: &PoolKey, state: &ConnState, idle: Duration) -> bool {
        let mut keys = self.lock();
        if state.active.load(Ordering::Acquire) != 0 || state.last_used().elapsed() < idle {
            return false;
        }
        state.usable.store(false, Ordering::Release);
        if let Some(entry) = keys.get_mut(key) {
            entry.conns.retain(|c| c.state.id != state.id);
            if entry.conns.is_empty() && entry.dial.is_none() {
                keys.remove(key);
            }
        }
        true
    }
}

impl Pool {
    /// An empty pool.
    pub fn new(settings: ClientSettings) -> Pool {
        Pool {
            inner: Arc::new(Inner {
                settings,
                keys: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// The pool's settings.
    pub fn settings(&self) -> &ClientSettings {
        &self.inner.settings
    }

    /// Pooled connections across all keys (for tests and metrics).
    pub fn connection_count(&self) -> usize {
        self.inner.lock().values().map(|e| e.conns.len()).sum()
    }

    /// Gets or makes a connection for `key` and opens one CONNECT stream on it.
    ///
    /// `connect` is called only when a new connection is needed; it returns an established
    /// TLS stream with ALPN `h2` (the caller did the TCP connect with its own socket options
    /// and the TLS handshake with a config that checks the server identity, e.g. with
    /// [`crate::tls::connect`]). `connect_timeout` bounds it and the HTTP/2 handshake.
    ///
    /// Errors: `Status(code)` for a non-200 answer; `ConnectTimeout`/`Connect`/`Tls` for dial
    /// failures (also returned to every caller that waited for that dial); `H2` for protocol
    /// failures; `Request` when the request cannot be encoded.
    pub async fn connect<F, Fut, IO, E>(
        &self,
        key: PoolKey,
        connect: F,
        request: &ConnectRequest,
    ) -> Result<H2Stream, HboneError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<IO, E>>,
        E: Into<HboneError>,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // Fail on an unencodable request before dialing anything.
        request.to_http()?;
        let mut connect = Some(connect);
        let mut last_err = None;
        let mut retries = 0;
        loop {
            let (send, slot) = match self.inner.next_step(&key, connect.is_some()) {
                Step::Use(send, slot) => (send, slot),
                Step::Wait(mut rx) => {
                    if let Ok(state) = rx.wait_for(|s| !matches!(s, DialState::Pending)).await {
                        if let DialState::Failed(e) = &*state {
                            return Err(e.clone());
                        }
                    }
                    // Ready, or the dialer was cancelled: look again.
                    continue;
                }
                Step::Dial(ticket) => {
                    // `next_step` hands out tickets only to callers that can still dial.
                    let Some(connect) = connect.take() else {
                        let e = refused(last_err);
                        ticket.fail(e.clone());
                        return Err(e);
                    };
                    match self.dial(&key, connect).await {
                        Ok((send, state)) => {
                            let slot = ticket.publish(send.clone(), state);
                            (send, slot)
                        }
                        Err(e) => {
                            ticket.fail(e.clone());
                            return Err(e);
                        }
                    }
                }
                // Our own fresh connection went away before taking the stream, and our
                // connect function is spent: report why.
                Step::CannotDial => return Err(refused(last_err)),
            };
            let state = slot.0.clone();
            let timeout = self.settings().response_timeout;
            match open_stream(send, request, slot, timeout).await {
                Ok(stream) => return Ok(stream),
                Err(e) if e.is_unprocessed() && retries < MAX_UNPROCESSED_RETRIES => {
                    tracing::debug!(error = %e, dst = %key.dst, "HBONE connection is going away; retrying on another");
                    state.usable.store(false, Ordering::Release);
                    self.inner.remove(&key, state.id);
                    retries += 1;
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs the caller's connect function and the HTTP/2 handshake under the connect timeout,
    /// then starts the connection's driver task.
    async fn dial<F, Fut, IO, E>(
        &self,
        key: &PoolKey,
        connect: F,
    ) -> Result<(SendRequest<Bytes>, Arc<ConnState>), HboneError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<IO, E>>,
        E: Into<HboneError>,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let settings = &self.inner.settings;
        let h2s = &settings.h2;
        let mut builder = h2::client::Builder::new();
        builder
            .initial_window_size(h2s.stream_window())
            .initial_connection_window_size(h2s.connection_window())
            .max_frame_size(h2s.frame_size())
            .initial_max_send_streams(settings.max_streams_per_connection.max(1) as usize)
            .max_header_list_size(CLIENT_MAX_HEADER_LIST)
            .max_send_buffer_size(h2s.stream_window() as usize)
            .enable_push(false);
        let timeout = settings.connect_timeout;
        let (send, mut conn) = tokio::time::timeout(timeout, async {
            let io = connect().await.map_err(Into::into)?;
            let (send, conn) = builder.handshake::<_, Bytes>(io).await?;
            Ok::<_, HboneError>((send, conn))
        })
        .await
        .map_err(|_| HboneError::ConnectTimeout(timeout))??;

        let state = Arc::new(ConnState {
            id: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
            active: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            usable: AtomicBool::new(true),
            became_idle: Notify::new(),
        });
        let keepalive = keepalive::run(conn.ping_pong(), h2s.ping_interval, h2s.ping_timeout);
        tokio::spawn(drive(
            conn,
            keepalive,
            state.clone(),
            Arc::downgrade(&self.inner),
            key.clone(),
            settings.idle_timeout,
        ));
        Ok((send, state))
    }
}

/// Opens one CONNECT stream and waits for the answer.
async fn open_stream(
    send: SendRequest<Bytes>,
    request: &ConnectRequest,
    slot: Slot,
    timeout: Duration,
) -> Result<H2Stream, HboneError> {
    let req = request.to_http()?;
    let mut send = send.ready().await?;
    let (response, stream) = send.send_request(req, false)?;
    drop(send);
    let response = tokio::time::timeout(timeout, response)
        .await
        .map_err(|_| HboneError::ResponseTimeout(timeout))??;
    if response.status() != StatusCode::OK {
        return Err(HboneError::Status(response.status()));
    }
    let (parts, recv) = response.into_parts();
    Ok(H2Stream::new(stream, recv)
        .with_response_headers(parts.headers)
        .with_guard(Box::new(slot)))
}

/// Drives one client connection: polls it, runs keepalive, evicts it when idle, and takes it
/// out of the pool when it ends.
async fn drive<IO, K>(
    conn: h2::client::Connection<IO, Bytes>,
    keepalive: K,
    state: Arc<ConnState>,
    pool: Weak<Inner>,
    key: PoolKey,
    idle: Duration,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    K: Future<Output = HboneError>,
{
    tokio::pin!(conn);
    tokio::pin!(keepalive);
    let mut evicted = false;
    let mut next_idle_check = after(state.last_used(), idle);
    loop {
        tokio::select! {
            r = &mut conn => {
                if let Err(e) = r {
                    tracing::debug!(dst = %key.dst, error = %e, "HBONE connection failed");
                }
                break;
            }
            e = &mut keepalive => {
                tracing::debug!(dst = %key.dst, error = %e, "HBONE keepalive failed; tearing the connection down");
                break;
            }
            _ = state.became_idle.notified(), if !evicted => {
                next_idle_check = after(state.last_used(), idle);
            }
            _ = tokio::time::sleep_until(next_idle_check), if !evicted => {
                // A dropped pool no longer hands the connection out; it closes when its
                // streams end.
                let Some(pool) = pool.upgrade() else {
                    evicted = true;
                    continue;
                };
                if pool.evict_if_idle(&key, &state, idle) {
                    tracing::debug!(dst = %key.dst, "HBONE connection idle; released from the pool");
                    evicted = true;
                } else if state.active.load(Ordering::Acquire) > 0 {
                    // Busy: the last stream to end wakes us up through `became_idle`.
                    next_idle_check = after(Instant::now(), idle);
                } else {
                    next_idle_check = after(state.last_used(), idle);
                }
            }
        }
    }
    state.usable.store(false, Ordering::Release);
    if let Some(pool) = pool.upgrade() {
        pool.remove(&key, state.id);
    }
}

/// `base + d`, saturating far in the future instead of overflowing.
fn after(base: Instant, d: Duration) -> Instant {
    base.checked_add(d)
        .unwrap_or_else(|| base + Duration::from_secs(30 * 365 * 24 * 3600))
}

/// The error for "every connection we tried refused the stream".
fn refused(last: Option<HboneError>) -> HboneError {
    last.unwrap_or_else(|| HboneError::from(h2::Error::from(h2::Reason::REFUSED_STREAM)))
}
