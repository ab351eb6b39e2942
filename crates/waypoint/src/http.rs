//! HTTP inside an accepted tunnel: HTTP/1.1 or HTTP/2 (h2c, told apart by the first
//! bytes), each request normalised, authorized, balanced on its own over the fronted
//! service's endpoints and forwarded on a pooled onward connection. Status codes and
//! bodies are Envoy's where users see them (reference waypoint.md §2.2, §3.4).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::authz::{self, Verdict};
use crate::balance::{choose, Choice};
use crate::downstream::{Downstream, Outcome};
use crate::upstream::{Body, BoxError, Version};
use crate::Waypoint;
use ambit_runtime::drain::DrainWatcher;

/// Largest request head (request line and headers) taken, HTTP/1.1 and HTTP/2 alike.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most headers in one HTTP/1.1 request.
pub const MAX_HEADERS: usize = 100;
/// Time a client has to send a whole HTTP/1.1 request head.
pub const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Streams per HTTP/2 connection, as Envoy's waypoint allows.
pub const MAX_STREAMS: u32 = 100;
/// Connect attempts per request, the first included (Istio's default retry: connect
/// failures retried on another endpoint, twice).
pub const CONNECT_ATTEMPTS: usize = 3;

/// Serves HTTP on `io` until the client closes or the drain ends it gracefully.
pub async fn serve<IO>(
    wp: Arc<Waypoint>,
    down: Arc<Downstream>,
    io: IO,
    version: Version,
    drain: DrainWatcher,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let (wp, down) = (wp.clone(), down.clone());
        async move { Ok::<_, Infallible>(handle(wp, down, req, version).await) }
    });
    match version {
        Version::Http1 => {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .max_headers(MAX_HEADERS)
                .serve_connection(TokioIo::new(io), service)
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => finished(r),
                _ = drain.draining() => {
                    conn.as_mut().graceful_shutdown();
                    finished(conn.await);
                }
            }
        }
        Version::Http2 => {
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(MAX_STREAMS)
                .max_header_list_size(MAX_HEAD_BYTES as u32)
                .max_pending_accept_reset_streams(50)
                .max_local_error_reset_streams(Some(256))
                .serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => finished(r),
                _ = drain.draining() => {
                    conn.as_mut().graceful_shutdown();
                    finished(conn.await);
                }
            }
        }
    }
}

fn finished(r: Result<(), hyper::Error>) {
    if let Err(e) = r {
        tracing::debug!("inner HTTP connection ended: {e}");
    }
}

/// One request, start to response head. The metrics are recorded when the response body
/// ends (or is dropped).
async fn handle(
    wp: Arc<Waypoint>,
    down: Arc<Downstream>,
    mut req: Request<Incoming>,
    version: Version,
) -> Response<Body> {
    let mut finish = Finish {
        wp: wp.clone(),
        down: down.clone(),
        outcome: Outcome {
            destination: None,
            response_code: 0,
            response_flags: "-",
        },
        start: Instant::now(),
        request_bytes: Arc::new(AtomicU64::new(0)),
        access: wp
            .cfg
            .access_log
            .then(|| crate::access::Entry::of(&req, &down)),
        upstream: None,
    };
    let state = wp.state.get();
    // Istio: a method that is not upper case, or a path that cannot be normalised, is the
    // client's error.
    let method = req.method().as_str();
    if method.bytes().any(|b| b.is_ascii_lowercase()) {
        return finish.reply(StatusCode::BAD_REQUEST, "-", "invalid method");
    }
    let raw_target = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let normalized = match ambit_state::normalize_path(&raw_target, wp.cfg.path_normalization) {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!(target = %raw_target, "refused: {e}");
            return finish.reply(StatusCode::BAD_REQUEST, "-", "Bad Request");
        }
    };
    let forwarded_target = normalized.path_and_query().into_owned();
    let path = normalized.path.to_string();
    let host = request_host(&req);
    ensure_request_id(req.headers_mut());
    if let Some(a) = &mut finish.access {
        a.request_id = crate::access::header_text(req.headers(), "x-request-id");
    }
    // An HTTP/1.1 upgrade (WebSocket and the like) is passed through: the upstream's 101
    // joins the two connections.
    let upgrade = (version == Version::Http1 && is_upgrade(req.headers()))
        .then(|| hyper::upgrade::on(&mut req));

    match authz::authorize_request(&wp, &down, &req, &path, &host) {
        Verdict::Allow => {}
        Verdict::Deny { details } => {
            tracing::debug!(
                source = %down.peer_ip,
                path = %path,
                method = %req.method(),
                details = %details,
                "request denied"
            );
            return finish.reply(StatusCode::FORBIDDEN, "-", "RBAC: access denied");
        }
    }

    // Onward: the request with its target normalised, hop-by-hop headers dropped.
    let (mut parts, body) = req.into_parts();
    let kept_upgrade = upgrade.is_some().then(|| {
        (
            parts.headers.get(http::header::UPGRADE).cloned(),
            parts.headers.get(http::header::CONNECTION).cloned(),
        )
    });
    strip_hop_by_hop(&mut parts.headers);
    if let Some((upgrade_value, _)) = kept_upgrade {
        if let Some(v) = upgrade_value {
            parts.headers.insert(http::header::UPGRADE, v);
        }
        parts.headers.insert(
            http::header::CONNECTION,
            HeaderValue::from_static("upgrade"),
        );
    }
    let authority = host.clone();
    parts.uri = match onward_uri(version, &authority, &forwarded_target) {
        Some(u) => u,
        None => return finish.reply(StatusCode::BAD_REQUEST, "-", "Bad Request"),
    };
    if version == Version::Http1 && !parts.headers.contains_key(http::header::HOST) {
        if let Ok(v) = HeaderValue::from_str(&authority) {
            parts.headers.insert(http::header::HOST, v);
        }
    }
    parts.version = match version {
        Version::Http1 => http::Version::HTTP_11,
        Version::Http2 => http::Version::HTTP_2,
    };
    let body = Counted::new(
        body.map_err(BoxError::from).boxed_unsync(),
        finish.request_bytes.clone(),
        None,
    );
    let mut body = Some(body.boxed_unsync());
    let mut last_failure = None;
    let mut tried = Vec::with_capacity(CONNECT_ATTEMPTS);
    for _ in 0..CONNECT_ATTEMPTS {
        let choice = match choose(&wp, &state, &down.fronted, &tried) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(fronted = %down.fronted.describe(), "{e}");
                return finish.reply(StatusCode::SERVICE_UNAVAILABLE, "UH", "no healthy upstream");
            }
        };
        let Choice { endpoint, workload } = choice;
        finish.outcome.destination = workload;
        finish.upstream = Some(endpoint.target);
        let sender = match wp.upstream.connect(&endpoint, version).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(endpoint = %endpoint.target, "onward connect failed: {e}");
                tried.push(endpoint.target);
                last_failure = Some(e);
                continue;
            }
        };
        let req = Request::from_parts(parts, body.take().unwrap_or_else(empty));
        return match sender.send(req).await {
            Ok(mut response) => {
                if let (Some(downstream), StatusCode::SWITCHING_PROTOCOLS) =
                    (upgrade, response.status())
                {
                    let upstream = hyper::upgrade::on(&mut response);
                    tokio::spawn(join_upgraded(downstream, upstream));
                }
                let (parts, body) = response.into_parts();
                finish.outcome.response_code = parts.status.as_u16();
                if let Some(a) = &mut finish.access {
                    a.status = parts.status.as_u16();
                }
                let body = Counted::new(
                    body.map_err(BoxError::from).boxed_unsync(),
                    Arc::new(AtomicU64::new(0)),
                    Some(finish),
                );
                Response::from_parts(parts, body.boxed_unsync())
            }
            Err(e) => {
                tracing::debug!(endpoint = %endpoint.target, "onward request failed: {e}");
                finish.reply(StatusCode::SERVICE_UNAVAILABLE,
                    "UC",
                    "upstream connect error or disconnect/reset before headers. reset reason: connection termination",
                )
            }
        };
    }
    let why = last_failure.map_or_else(String::new, |e| e.to_string());
    tracing::debug!(fronted = %down.fronted.describe(), "every connect attempt failed: {why}");
    finish.reply(StatusCode::SERVICE_UNAVAILABLE,
        "UF",
        "upstream connect error or disconnect/reset before headers. reset reason: connection failure",
    )
}

fn empty() -> Body {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The `Host` / `:authority` the client sent (the tunnel's authority when it sent none).
fn request_host(req: &Request<Incoming>) -> String {
    if let Some(a) = req.uri().authority() {
        return a.as_str().to_string();
    }
    req.headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// The onward request target: origin form for HTTP/1.1, absolute for HTTP/2 (its
/// `:authority` is the client's, never the endpoint's address).
fn onward_uri(version: Version, authority: &str, target: &str) -> Option<http::Uri> {
    match version {
        Version::Http1 => target.parse().ok(),
        Version::Http2 => {
            let authority = if authority.is_empty() {
                "unknown"
            } else {
                authority
            };
            format!("http://{authority}{target}").parse().ok()
        }
    }
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "te",
    ] {
        headers.remove(name);
    }
}

/// Sets `x-request-id` when the client sent none, as Envoy does.
fn ensure_request_id(headers: &mut HeaderMap) {
    if headers.contains_key("x-request-id") {
        return;
    }
    let id: u128 = rand::random();
    // A version-4 UUID.
    let id =
        (id & !(0xf000u128 << 64) | (0x4000u128 << 64)) & !(0xc000u128 << 48) | (0x8000u128 << 48);
    let hex = format!("{id:032x}");
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    if let Ok(v) = HeaderValue::from_str(&uuid) {
        headers.insert("x-request-id", v);
    }
}

/// What a request's metrics and access log line are made of, recorded once it ends.
struct Finish {
    wp: Arc<Waypoint>,
    down: Arc<Downstream>,
    /// The endpoint chosen and the response, as they become known.
    outcome: Outcome,
    start: Instant,
    request_bytes: Arc<AtomicU64>,
    /// The access log line's fields, when the log is on.
    access: Option<crate::access::Entry>,
    /// The endpoint the request went to.
    upstream: Option<std::net::SocketAddr>,
}

impl Finish {
    /// A reply made here (refusal or upstream failure), counted like a forwarded one.
    fn reply(
        mut self,
        status: StatusCode,
        flags: &'static str,
        body: &'static str,
    ) -> Response<Body> {
        self.outcome.response_code = status.as_u16();
        self.outcome.response_flags = flags;
        if let Some(a) = &mut self.access {
            a.status = status.as_u16();
            a.details = Some(body);
        }
        self.record(body.len() as u64);
        let mut response = Response::new(
            Full::new(Bytes::from_static(body.as_bytes()))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        response
    }

    fn record(self, response_bytes: u64) {
        let duration = self.start.elapsed();
        let request_bytes = self.request_bytes.load(Ordering::Relaxed);
        if let Some(a) = &self.access {
            a.log(
                &self.down.request_labels(&self.outcome),
                self.upstream,
                request_bytes,
                response_bytes,
                duration,
            );
        }
        self.down.record(
            &self.wp.metrics,
            &self.outcome,
            duration.as_secs_f64() * 1000.0,
            request_bytes,
            response_bytes,
        );
    }
}

/// Joins an upgraded client connection to the upgraded upstream one.
async fn join_upgraded(downstream: hyper::upgrade::OnUpgrade, upstream: hyper::upgrade::OnUpgrade) {
    let (Ok(down), Ok(up)) = tokio::join!(downstream, upstream) else {
        return tracing::debug!("an upgrade did not complete on both sides");
    };
    let (mut down, mut up) = (TokioIo::new(down), TokioIo::new(up));
    if let Err(e) = tokio::io::copy_bidirectional(&mut down, &mut up).await {
        tracing::debug!("upgraded connection ended: {e}");
    }
}

/// An HTTP/1.1 upgrade request: `Connection: upgrade` and an `Upgrade` header.
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(http::header::UPGRADE)
        && headers
            .get_all(http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// A body that counts its bytes and, for a response, records the request when it ends.
struct Counted {
    inner: Body,
    bytes: Arc<AtomicU64>,
    recorder: Option<Finish>,
}

impl Counted {
    fn new(inner: Body, bytes: Arc<AtomicU64>, recorder: Option<Finish>) -> Counted {
        Counted {
            inner,
            bytes,
            recorder,
        }
    }

    fn finish(&mut self) {
        if let Some(r) = self.recorder.take() {
            r.record(self.bytes.load(Ordering::Relaxed));
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.finish();
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
            }
            std::task::Poll::Ready(None) | std::task::Poll::Ready(Some(Err(_))) => self.finish(),
            std::task::Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("close, x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-kept"]);
    }

    #[test]
    fn request_ids_are_uuid_v4_and_kept_when_sent() {
        let mut h = HeaderMap::new();
        ensure_request_id(&mut h);
        let id = h["x-request-id"].to_str().unwrap().to_string();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(&id[14..15], "4", "{id}");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        h.insert("x-request-id", HeaderValue::from_static("mine"));
        ensure_request_id(&mut h);
        assert_eq!(h["x-request-id"], "mine");
    }

    #[test]
    fn onward_targets() {
        assert_eq!(
            onward_uri(Version::Http1, "reviews:80", "/a?b")
                .unwrap()
                .to_string(),
            "/a?b"
        );
        assert_eq!(
            onward_uri(Version::Http2, "reviews:80", "/a?b")
                .unwrap()
                .to_string(),
            "http://reviews:80/a?b"
        );
    }
}
