//! The thin HTTP layer: TLS, authentication, fault injection, the request log, and the
//! streaming of watches planned by [`crate::handler`].

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, watch};

use crate::authn::Tokens;
use crate::error::ApiError;
use crate::handler::{self, Handled, Settings, WatchPlan, WatchStart};
use crate::rbac::User;
use crate::resource::served_as;
use crate::store::{Event, Store};
use crate::table;
use crate::watch::{bookmark, event_line};
use crate::{RecordedRequest, ServerOptions};

/// Request bodies above this get 413.
pub(crate) const MAX_BODY: usize = 3 * 1024 * 1024;
/// Open watches above this get 429.
pub(crate) const MAX_WATCHES: usize = 512;
/// Connections served at once; more are closed on accept.
const MAX_CONNECTIONS: usize = 1024;
/// Time a client gets to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests kept in the log (oldest dropped first).
const MAX_LOG: usize = 10_000;
/// Bytes of a request body kept in the log.
const MAX_LOGGED_BODY: usize = 64 * 1024;
/// Events buffered per watcher before it is cut off (it resumes from its last version).
const WATCH_BUFFER: usize = 64;

type RespBody = BoxBody<Bytes, std::io::Error>;

struct FailRule {
    remaining: usize,
    status: u16,
    method: Option<String>,
    path_contains: Option<String>,
}

struct DelayRule {
    remaining: usize,
    delay: Duration,
    method: Option<String>,
    path_contains: Option<String>,
}

fn rule_matches(method: &Option<String>, path: &Option<String>, m: &str, target: &str) -> bool {
    method.as_deref().is_none_or(|x| x.eq_ignore_ascii_case(m))
        && path.as_deref().is_none_or(|p| target.contains(p))
}

#[derive(Default)]
pub(crate) struct FaultState {
    fails: Vec<FailRule>,
    delays: Vec<DelayRule>,
}

pub(crate) struct Inner {
    pub store: Mutex<Store>,
    pub events: broadcast::Sender<Arc<Event>>,
    pub tokens: Mutex<Tokens>,
    pub faults: Mutex<FaultState>,
    pub log: Mutex<VecDeque<RecordedRequest>>,
    pub kill: watch::Sender<u64>,
    pub open_watches: AtomicUsize,
    pub opts: ServerOptions,
    pub host: String,
}

/// Locks `m`, recovering from a poisoned lock (a panicking test thread must not wedge
/// the server for the others).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    pub fn new(opts: ServerOptions, host: String) -> Inner {
        let (events, _) = broadcast::channel(opts.history.clamp(16, 65_536));
        Inner {
            store: Mutex::new(Store::new(opts.history)),
            events,
            tokens: Mutex::new(Tokens::default()),
            faults: Mutex::new(FaultState::default()),
            log: Mutex::new(VecDeque::new()),
            kill: watch::channel(0).0,
            open_watches: AtomicUsize::new(0),
            opts,
            host,
        }
    }

    /// Fans events out; called with the store locked so watchers see them in order.
    pub fn publish(&self, events: Vec<Arc<Event>>) {
        for ev in events {
            // No receivers is fine: nobody is watching.
            let _ = self.events.send(ev);
        }
    }

    pub fn fail_next(&self, n: usize, status: u16, method: Option<&str>, path: Option<&str>) {
        lock(&self.faults).fails.push(FailRule {
            remaining: n,
            status,
            method: method.map(str::to_string),
            path_contains: path.map(str::to_string),
        });
    }

    pub fn delay_next(&self, n: usize, delay: Duration, method: Option<&str>, path: Option<&str>) {
        lock(&self.faults).delays.push(DelayRule {
            remaining: n,
            delay,
            method: method.map(str::to_string),
            path_contains: path.map(str::to_string),
        });
    }

    pub fn clear_faults(&self) {
        let mut f = lock(&self.faults);
        f.fails.clear();
        f.delays.clear();
    }

    fn take_fault(&self, method: &str, target: &str) -> (Option<u16>, Option<Duration>) {
        let mut f = lock(&self.faults);
        let mut delay = None;
        if let Some(d) = f
            .delays
            .iter_mut()
            .find(|d| d.remaining > 0 && rule_matches(&d.method, &d.path_contains, method, target))
        {
            d.remaining -= 1;
            delay = Some(d.delay);
        }
        f.delays.retain(|d| d.remaining > 0);
        let mut fail = None;
        if let Some(r) = f
            .fails
            .iter_mut()
            .find(|r| r.remaining > 0 && rule_matches(&r.method, &r.path_contains, method, target))
        {
            r.remaining -= 1;
            fail = Some(r.status);
        }
        f.fails.retain(|r| r.remaining > 0);
        (fail, delay)
    }

    fn record(&self, r: RecordedRequest) {
        let mut log = lock(&self.log);
        if log.len() == MAX_LOG {
            log.pop_front();
        }
        log.push_back(r);
    }
}

/// A body fed from a channel: watch events, or an error that aborts the connection.
struct ChannelBody {
    rx: mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.rx.poll_recv(cx)
    }
}

fn full(status: u16, body: &Value, retry_after: Option<u32>) -> hyper::Response<RespBody> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut b = hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json");
    if let Some(s) = retry_after {
        b = b.header("retry-after", s.to_string());
    }
    b.body(
        Full::new(Bytes::from(bytes))
            .map_err(|n| match n {})
            .boxed(),
    )
    .unwrap_or_else(|_| {
        hyper::Response::new(Full::new(Bytes::new()).map_err(|n| match n {}).boxed())
    })
}

fn error(e: &ApiError) -> hyper::Response<RespBody> {
    full(e.code, &e.to_status(), e.retry_after)
}

const PUBLIC_PATHS: [&str; 4] = ["/healthz", "/readyz", "/livez", "/version"];

/// Serves connections from `listener` until `shutdown` flips.
pub(crate) async fn serve(
    inner: Arc<Inner>,
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "too many connections; closing this one");
            continue;
        };
        let (inner, acceptor, mut shutdown) = (inner.clone(), acceptor.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let svc = hyper::service::service_fn(move |req| {
                let inner = inner.clone();
                async move { Ok::<_, Infallible>(handle_http(inner, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(tls), svc);
            tokio::select! {
                r = conn => if let Err(e) = r { tracing::debug!(%peer, error = %e, "connection ended") },
                _ = shutdown.changed() => {}
            }
        });
    }
}

async fn handle_http(
    inner: Arc<Inner>,
    req: hyper::Request<Incoming>,
) -> hyper::Response<RespBody> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let target = if query.is_empty() {
        path.clone()
    } else {
        format!("{path}?{query}")
    };
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let content_type = header("content-type");
    let accept = header("accept");
    let token = header("authorization").and_then(|h| {
        let (scheme, t) = h.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| t.trim().to_string())
    });
    let user = token.and_then(|t| lock(&inner.tokens).authenticate(&t));
    let mut rec = RecordedRequest {
        method: method.clone(),
        path: target.clone(),
        content_type: content_type.clone(),
        user: user.as_ref().map(|u| u.name.clone()),
        body: None,
        status: 0,
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let err = if e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                ApiError::too_large(MAX_BODY)
            } else {
                ApiError::bad_request("the request body could not be read")
            };
            rec.status = err.code;
            inner.record(rec);
            return error(&err);
        }
    };
    if matches!(method.as_str(), "POST" | "PUT" | "PATCH") {
        let kept = &body[..body.len().min(MAX_LOGGED_BODY)];
        let mut text = String::from_utf8_lossy(kept).into_owned();
        if body.len() > MAX_LOGGED_BODY {
            text.push_str("...(truncated)");
        }
        rec.body = Some(text);
    }
    let finish = |rec: &mut RecordedRequest, resp: hyper::Response<RespBody>| {
        rec.status = resp.status().as_u16();
        inner.record(rec.clone());
        resp
    };
    let public = PUBLIC_PATHS.contains(&path.trim_end_matches('/'));
    let user = match user {
        Some(u) => u,
        None if public => User::anonymous(),
        None => return finish(&mut rec, error(&ApiError::unauthorized())),
    };
    let (fail, delay) = inner.take_fault(&method, &target);
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    if let Some(code) = fail {
        return finish(&mut rec, error(&ApiError::injected(code)));
    }
    let hreq = handler::Request {
        method: &method,
        path: &path,
        query: &query,
        content_type: content_type.as_deref(),
        accept: accept.as_deref(),
        body: &body,
        user: &user,
    };
    let plan = {
        let mut store = lock(&inner.store);
        // The token table, which TokenReviews read: only ever locked after the store.
        let tokens = lock(&inner.tokens);
        let settings = Settings {
            rbac: inner.opts.rbac,
            server_url: &inner.host,
            tokens: &tokens,
        };
        match handler::handle(&mut store, &settings, &hreq) {
            Handled::Done(resp, events) => {
                inner.publish(events);
                drop(tokens);
                drop(store);
                return finish(&mut rec, full(resp.status, &resp.body, resp.retry_after));
            }
            Handled::Watch(plan) => plan,
        }
    };
    let resp = start_watch(&inner, plan);
    finish(&mut rec, resp)
}

/// Decrements the open-watch count when a watch ends.
struct WatchGuard(Arc<Inner>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

fn start_watch(inner: &Arc<Inner>, plan: WatchPlan) -> hyper::Response<RespBody> {
    if inner.open_watches.fetch_add(1, Ordering::SeqCst) >= MAX_WATCHES {
        inner.open_watches.fetch_sub(1, Ordering::SeqCst);
        return error(&ApiError::too_many_requests(1));
    }
    let guard = WatchGuard(inner.clone());
    let r = plan.filter.resource;
    // Under the store lock: the starting events and the subscription, so none is missed.
    let (initial, start_rv, rx, expired) = {
        let store = lock(&inner.store);
        let rx = inner.events.subscribe();
        let rv = store.rv();
        match plan.start {
            WatchStart::Snapshot => {
                let mut lines: Vec<Vec<u8>> = store
                    .list(r, plan.filter.namespace.as_deref())
                    .filter(|(_, o)| plan.filter.matches(o))
                    .map(|(_, o)| object_line(&plan, "ADDED", o))
                    .collect();
                if plan.initial_events_end {
                    lines.push(event_line("BOOKMARK", &bookmark(r, plan.version, rv, true)));
                }
                (lines, rv, rx, false)
            }
            WatchStart::After(since) => match store.events_since(since) {
                Ok(evs) => {
                    let lines = evs
                        .iter()
                        .filter_map(|e| plan.filter.translate(e))
                        .map(|(k, o)| object_line(&plan, k.as_str(), &o))
                        .collect();
                    (lines, rv.max(since), rx, false)
                }
                Err(too_old) => {
                    let status = ApiError::from(too_old).to_status();
                    (vec![event_line("ERROR", &status)], rv, rx, true)
                }
            },
        }
    };
    let (tx, body_rx) = mpsc::channel(WATCH_BUFFER);
    let kill = inner.kill.subscribe();
    let inner = inner.clone();
    tokio::spawn(async move {
        let _guard = guard;
        for line in initial {
            if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                return;
            }
        }
        if !expired {
            run_watch(&inner, plan, start_rv, rx, &tx, kill).await;
        }
    });
    hyper::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(ChannelBody { rx: body_rx }.boxed())
        .unwrap_or_else(|_| error(&ApiError::internal("building the watch response")))
}

/// An event line for `obj`, in the watch's version, as a one-row Table when the watch
/// asked for Tables.
fn object_line(plan: &WatchPlan, kind: &str, obj: &Value) -> Vec<u8> {
    let r = plan.filter.resource;
    match plan.table {
        Some(include) => {
            let meta =
                serde_json::json!({"resourceVersion": obj.pointer("/metadata/resourceVersion")});
            let t = table::table(
                r,
                plan.version,
                std::slice::from_ref(obj),
                meta,
                include,
                table::now(),
            );
            event_line(kind, &t)
        }
        None => event_line(kind, &served_as(r, plan.version, obj)),
    }
}

async fn run_watch(
    inner: &Inner,
    plan: WatchPlan,
    start_rv: u64,
    mut rx: broadcast::Receiver<Arc<Event>>,
    tx: &mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>,
    mut kill: watch::Receiver<u64>,
) {
    let send = |line: Vec<u8>| tx.send(Ok(Frame::data(Bytes::from(line))));
    let mut progress = start_rv;
    let period = inner.opts.bookmark_interval.max(Duration::from_millis(10));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let deadline = plan.timeout.map(|t| tokio::time::Instant::now() + t);
    let sleep = tokio::time::sleep_until(
        deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)),
    );
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            r = rx.recv() => match r {
                Ok(ev) => {
                    progress = progress.max(ev.rv);
                    if let Some((k, o)) = plan.filter.translate(&ev) {
                        if send(object_line(&plan, k.as_str(), &o)).await.is_err() { return; }
                    }
                }
                // Too slow, or the server is going: end cleanly; the client resumes from
                // the last version it saw, which the history still holds.
                Err(_) => return,
            },
            _ = tick.tick(), if plan.bookmarks => {
                let rv = lock(&inner.store).rv();
                // Every event up to `rv` is already queued: deliver those first.
                loop {
                    match rx.try_recv() {
                        Ok(ev) => {
                            progress = progress.max(ev.rv);
                            if let Some((k, o)) = plan.filter.translate(&ev) {
                                if send(object_line(&plan, k.as_str(), &o)).await.is_err() { return; }
                            }
                        }
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(_) => return,
                    }
                }
                progress = progress.max(rv);
                let b = bookmark(plan.filter.resource, plan.version, progress, false);
                if send(event_line("BOOKMARK", &b)).await.is_err() { return; }
            }
            _ = &mut sleep, if deadline.is_some() => return,
            _ = kill.changed() => {
                // An error frame makes hyper cut the connection mid-stream.
                let _ = tx.send(Err(std::io::Error::other("watch dropped by fault injection"))).await;
                return;
            }
            _ = tx.closed() => return,
        }
    }
}
