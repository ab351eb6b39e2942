//! HTTP inside an accepted tunnel: HTTP/1.1 or HTTP/2 (h2c, told apart by the first
//! bytes), each request normalised, authorized, balanced on its own over the fronted
//! service's endpoints and forwarded on a pooled onward connection. Status codes and
//! bodies are Envoy's where users see them (reference waypoint.md §2.2, §3.4).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::authz::{self, Verdict};
use crate::balance::{choose, Choice};
use crate::downstream::{Downstream, Outcome};
use crate::exchange::{self, Action, Event, Exchange, Note, SendFailure};
use crate::local_reply::LocalReply;
use crate::replay::{Deadline, Tee};
use crate::request_plan::{self, Plan, RouteRequest};
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
/// Connect attempts per opaque tunnel, the first included (Istio's default retry: connect
/// failures retried on another endpoint, twice). HTTP requests follow their route's
/// retry policy ([`request_plan::RetryPolicy`]).
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

/// One request, start to response head. An HTTP/1.1 connection whose request asked to
/// upgrade and was not switched is closed after the answer (Envoy closes it too): what the
/// client sends next may be the other protocol.
async fn handle(
    wp: Arc<Waypoint>,
    down: Arc<Downstream>,
    mut req: Request<Incoming>,
    version: Version,
) -> Response<Body> {
    let close_unless_switched = crate::head::asks_upgrade(req.version(), req.headers());
    // hyper keeps the connection for any HTTP/1.1 request with an `Upgrade` header, and
    // hands it over when it ends; held here, it is joined or closed cleanly (dropped, the
    // tunnel would be reset and the last answer lost).
    let mut on_upgrade = (req.version() == http::Version::HTTP_11
        && req.headers().contains_key(http::header::UPGRADE))
    .then(|| hyper::upgrade::on(&mut req));
    let mut response = handle_request(wp, down, req, version, &mut on_upgrade).await;
    if let Some(unjoined) = on_upgrade {
        if close_unless_switched {
            response
                .headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        tokio::spawn(close_when_handed_over(unjoined));
    }
    response
}

/// Shuts a connection hyper hands over at its end (see [`handle`]) down cleanly.
async fn close_when_handed_over(on_upgrade: hyper::upgrade::OnUpgrade) {
    use tokio::io::AsyncWriteExt;
    if let Ok(io) = on_upgrade.await {
        let _ = TokioIo::new(io).shutdown().await;
    }
}

/// One request, start to response head. The metrics are recorded when the response body
/// ends (or is dropped).
///
/// `on_upgrade`: the client connection's hand-over, taken from it only to join an allowed
/// upgrade.
async fn handle_request(
    wp: Arc<Waypoint>,
    down: Arc<Downstream>,
    mut req: Request<Incoming>,
    version: Version,
    on_upgrade: &mut Option<hyper::upgrade::OnUpgrade>,
) -> Response<Body> {
    let mut finish = Finish {
        wp: wp.clone(),
        down: down.clone(),
        outcome: Outcome::new(is_grpc(req.headers())),
        start: Instant::now(),
        request_body: Arc::new(Progress::default()),
        access: wp
            .cfg
            .access_log
            .then(|| crate::access::Entry::of(&req, &down)),
        upstream: None,
        held: crate::balancing::Held::default(),
    };
    let state = wp.state.get();
    // Istio: a method that is not upper case, or a path that cannot be normalised, is the
    // client's error.
    let method = req.method().as_str();
    if method.bytes().any(|b| b.is_ascii_lowercase()) {
        return finish.answer(LocalReply::INVALID_METHOD);
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
            return finish.answer(LocalReply::BAD_REQUEST);
        }
    };
    let forwarded_target = normalized.path_and_query().into_owned();
    let path = normalized.path.to_string();
    // One authority, no hop-by-hop header, no forged identity, only an allowed upgrade:
    // before anything below decides on the request or adds a header of its own.
    let (req_version, req_method, req_uri) =
        (req.version(), req.method().clone(), req.uri().clone());
    let prepared = match crate::head::prepare(
        req_version,
        &req_method,
        &req_uri,
        req.headers_mut(),
        &wp.cfg.upgrade_types,
    ) {
        Ok(h) => h,
        Err(refused) => {
            tracing::debug!(source = %down.peer_ip, "request refused: {refused}");
            let body = match refused.status() {
                StatusCode::BAD_REQUEST => "Bad Request",
                _ => "",
            };
            let mut response = finish.answer(LocalReply::refused(
                refused.status(),
                refused.details(),
                body,
            ));
            if req_version != http::Version::HTTP_2 {
                // A head HTTP does not allow: nothing after it is read.
                response
                    .headers_mut()
                    .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            }
            return response;
        }
    };
    let host = prepared.authority.clone();
    if wp.cfg.xfcc_client_identity {
        if let Some(v) = down
            .peer_identity
            .as_ref()
            .and_then(|caller| crate::head::xfcc_value(&wp.identity, caller))
        {
            req.headers_mut().insert(crate::head::XFCC, v);
        }
    }
    ensure_request_id(req.headers_mut());
    if let Some(a) = &mut finish.access {
        a.request_id = crate::access::header_text(req.headers(), "x-request-id");
        a.authority.clone_from(&host);
    }

    // RequestAuthentication, before authorization (Envoy's jwt_authn before RBAC).
    let mut request_auth = None;
    let mut forwarded_target = forwarded_target;
    let authns = wp.authns.get();
    if !authns.is_empty() {
        let rules = authns.rules_for(&authz::attachment(&wp), &down.fronted);
        if !rules.is_empty() {
            let query = normalized.query;
            let edits = match ambit_jwt::authenticate_request(
                &rules,
                req.method(),
                req.headers(),
                query,
                std::time::SystemTime::now(),
            ) {
                ambit_jwt::Outcome::Refused(r) => {
                    tracing::debug!(source = %down.peer_ip, path = %path, "request refused: {}", r.details());
                    let challenge = r.www_authenticate("http", &host, &raw_target);
                    let mut response =
                        finish.answer(LocalReply::refused(r.status(), r.body(), r.body()));
                    response
                        .headers_mut()
                        .insert(http::header::WWW_AUTHENTICATE, challenge);
                    return response;
                }
                ambit_jwt::Outcome::NoToken { edits } => edits,
                ambit_jwt::Outcome::Authenticated { auth, edits } => {
                    request_auth = Some(auth);
                    edits
                }
            };
            edits.apply(req.headers_mut());
            if !edits.remove_params.is_empty() {
                let kept = query.and_then(|q| edits.strip_query(q));
                forwarded_target = match kept {
                    Some(q) => format!("{path}?{q}"),
                    None => path.clone(),
                };
            }
        }
    }

    match authz::authorize_request(&wp, &down, &req, &path, &host, request_auth.as_ref()) {
        Verdict::Allow => {}
        Verdict::Deny { details } => {
            tracing::debug!(
                source = %down.peer_ip,
                path = %path,
                method = %req.method(),
                details = %details,
                "request denied"
            );
            return finish.answer(LocalReply::DENIED);
        }
    }

    let grpc = finish.outcome.grpc;
    // The query as forwarded (without a token parameter authentication removed).
    let query_at = forwarded_target.find('?');
    let routes = wp.routes.get();
    let plan = request_plan::plan(
        &routes.table,
        &state,
        &down.fronted,
        &RouteRequest {
            method: req.method().as_str(),
            path: &path,
            query: query_at.map(|i| &forwarded_target[i + 1..]),
            headers: req.headers(),
            host: &host,
        },
        rand::random(),
        &wp.cfg.cluster_domain,
        &wp.gateway,
    );
    let fwd = match plan {
        Plan::Forward(f) => f,
        Plan::NotFound => {
            tracing::debug!(fronted = %down.fronted.describe(), path = %path, "no route matches");
            return finish.answer(LocalReply::NO_ROUTE);
        }
        Plan::Fail(why) => {
            tracing::debug!(fronted = %down.fronted.describe(), "answered 500: {why}");
            return finish.answer(LocalReply::DIRECT_500);
        }
        Plan::Redirect { status, location } => {
            let mut response = finish.answer(LocalReply::redirect(status));
            if let Ok(v) = HeaderValue::from_str(&location) {
                response.headers_mut().insert(http::header::LOCATION, v);
            }
            return response;
        }
        Plan::Preflight(headers) => {
            let mut response = finish.answer(LocalReply::CORS_PREFLIGHT);
            response.headers_mut().extend(headers);
            return response;
        }
    };
    if fwd.rule.is_some() {
        finish.outcome.service = fwd.target.service().cloned();
    }

    // Onward: the request with its target normalised, hop-by-hop headers dropped, the
    // route's modifiers and rewrite applied.
    let (mut parts, body) = req.into_parts();
    if let Some(protocol) = &prepared.upgrade {
        parts
            .headers
            .insert(http::header::UPGRADE, protocol.clone());
        parts.headers.insert(
            http::header::CONNECTION,
            HeaderValue::from_static("upgrade"),
        );
    }
    for m in &fwd.request_headers {
        ambit_gateway_routes::apply_headers(m, &mut parts.headers);
    }
    let authority = fwd.host.map_or(host, str::to_string);
    let target = match &fwd.path {
        Some(p) => format!("{p}{}", query_at.map_or("", |i| &forwarded_target[i..])),
        None => forwarded_target,
    };
    let uri = match onward_uri(version, &authority, &target) {
        Some(u) => u,
        None => return finish.answer(LocalReply::BAD_REQUEST),
    };
    if version == Version::Http1 && !authority.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&authority) {
            parts.headers.insert(http::header::HOST, v);
        }
    }
    let mut head = Head {
        method: parts.method,
        uri,
        version: match version {
            Version::Http1 => http::Version::HTTP_11,
            Version::Http2 => http::Version::HTTP_2,
        },
        headers: parts.headers,
    };
    let counted = Counted::new(
        body.map_err(BoxError::from).boxed_unsync(),
        finish.request_body.clone(),
        None,
    )
    .boxed_unsync();
    let mirrors = fwd
        .mirrors
        .iter()
        .filter_map(|target| mirror(&wp, &state, target, &head, version))
        .collect();
    // Endpoints known by hostname (a ServiceEntry's), resolved once per request.
    let resolved = crate::balance::resolve_hostnames(&wp, &state, &fwd.target).await;
    // A DestinationRule's balancer: the request's hash, and a place in the pool.
    let balancer = wp.balancer_for(&fwd.target);
    let (hash, mut set_cookie) = match &balancer {
        Some(b) => {
            let input = b.request_hash(&head.headers, head.uri.query(), down.peer_ip);
            (input.hash, input.set_cookie)
        }
        None => (None, None),
    };
    if let Some(b) = &balancer {
        let waited_until = fwd.timeouts.request.map(|t| Instant::now() + t);
        match within(waited_until, b.admit()).await {
            None => return finish.answer(LocalReply::TIMEOUT),
            Some(Err(crate::balancing::Overflow)) => {
                wp.metrics.overflow(&b.host, "pending");
                return finish.answer(LocalReply::OVERFLOW);
            }
            Some(Ok(place)) => finish.held.place = place,
        }
    }
    let (mut exchange, mut step) = Exchange::start(
        fwd.retry,
        exchange::Timeouts {
            request: fwd.timeouts.request,
            per_try: fwd.timeouts.backend_request,
        },
        grpc,
        Instant::now(),
    );
    let recording = exchange
        .wants_replay()
        .then(crate::replay::Recording::default);
    let mut tries = Tries {
        fresh: Some(Tee::new(counted, recording.clone(), mirrors).boxed_unsync()),
        unsent: None,
        recording,
    };
    // Counted against the destination's retry budget while it is in flight; a retry
    // holds its place until the next try's outcome.
    let in_flight = wp
        .retry_budgets
        .request(crate::retry_budget::Destination::of(&fwd.target));
    let mut held_retry: Option<crate::retry_budget::InFlightRetry>;
    let mut held_rule_retry: Option<crate::balancing::RetryPlace>;
    // What each try came to, for outlier detection.
    let report = |endpoint: std::net::SocketAddr,
                  outcome: ambit_traffic_policy::outlier::Outcome| {
        if let Some(b) = &balancer {
            b.report(endpoint, outcome, &wp.metrics);
        }
    };
    let mut tried = Vec::new();
    let mut open: Option<(crate::upstream::Sender, std::net::SocketAddr)> = None;
    let mut answered = None;
    loop {
        match step.note {
            Some(Note::Retrying(cause)) => {
                wp.metrics.retries.inc();
                tracing::debug!(fronted = %fwd.target.describe(), ?cause, "retrying");
            }
            Some(Note::RetryRefused(why)) => wp.metrics.retry_refused(why.as_str()),
            None => {}
        }
        let event = match step.action {
            Action::Connect { deadline } => {
                // A new try: the last one's answer is not wanted any more.
                answered = None;
                let balanced = balancer.as_deref().map(|b| (b, hash));
                let chosen = choose(&wp, &state, &fwd.target, &tried, balanced, &resolved);
                let Choice { endpoint, workload } = match chosen {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(fronted = %fwd.target.describe(), "{e}");
                        step = exchange.on(Event::NoEndpoint, Instant::now());
                        continue;
                    }
                };
                finish.outcome.destination = workload;
                finish.upstream = Some(endpoint.target);
                finish.held.in_flight = balancer.as_ref().map(|b| b.start(endpoint.target));
                // A rule's connect timeout, when it ends before the try's.
                let rule_deadline = balancer
                    .as_ref()
                    .map(|b| Instant::now() + b.policy.connection_pool.connect_timeout)
                    .filter(|c| deadline.is_none_or(|d| *c < d));
                let connecting = wp.upstream().connect(&endpoint, version);
                match within(rule_deadline.or(deadline), connecting).await {
                    None if rule_deadline.is_some() => {
                        tracing::debug!(endpoint = %endpoint.target, "onward connect timed out");
                        report(
                            endpoint.target,
                            ambit_traffic_policy::outlier::Outcome::LocalFailure,
                        );
                        tried.push(endpoint.target);
                        Event::ConnectFailed
                    }
                    None => Event::TimerFired { replayable: false },
                    Some(Ok(sender)) => {
                        open = Some((sender, endpoint.target));
                        Event::Connected
                    }
                    Some(Err(e)) => {
                        tracing::debug!(endpoint = %endpoint.target, "onward connect failed: {e}");
                        report(
                            endpoint.target,
                            ambit_traffic_policy::outlier::Outcome::LocalFailure,
                        );
                        tried.push(endpoint.target);
                        Event::ConnectFailed
                    }
                }
            }
            Action::Send { deadline } => {
                let Some((sender, endpoint)) = open.take() else {
                    step = exchange.on(Event::ConnectFailed, Instant::now());
                    continue;
                };
                tried.push(endpoint);
                let request = match tries.unsent.take() {
                    Some(r) => r,
                    None => match tries.body() {
                        Some(body) => head.request(body, tries.recording.is_some()),
                        None => {
                            // Never: the exchange retries a sent body only when it replays.
                            tracing::warn!("a retry found no body to send");
                            step = exchange.on(
                                Event::SendFailed {
                                    cause: SendFailure::Reset,
                                    replayable: false,
                                },
                                Instant::now(),
                            );
                            continue;
                        }
                    },
                };
                match within(deadline, sender.send(request)).await {
                    None => {
                        report(
                            endpoint,
                            ambit_traffic_policy::outlier::Outcome::LocalFailure,
                        );
                        Event::TimerFired {
                            replayable: tries.replayable(),
                        }
                    }
                    Some(Ok(response)) => {
                        report(
                            endpoint,
                            ambit_traffic_policy::outlier::Outcome::Status(
                                response.status().as_u16(),
                            ),
                        );
                        let event = Event::Response {
                            status: response.status().as_u16(),
                            grpc_status: grpc.then(|| grpc_status(response.headers())).flatten(),
                            upgrade_matches: switches_as_asked(
                                &response,
                                prepared.upgrade.as_ref(),
                            ),
                            replayable: tries.replayable(),
                        };
                        answered = Some((response, endpoint));
                        event
                    }
                    Some(Err(e)) if finish.request_body.failed() => {
                        // The client's body broke (bad chunked framing, say).
                        tracing::debug!(source = %down.peer_ip, "request body refused: {e}");
                        Event::SendFailed {
                            cause: SendFailure::ClientBody,
                            replayable: false,
                        }
                    }
                    Some(Err(mut e)) => {
                        tracing::debug!(%endpoint, "onward request failed: {e}");
                        report(
                            endpoint,
                            ambit_traffic_policy::outlier::Outcome::LocalFailure,
                        );
                        let cause = match e.not_taken() {
                            true => SendFailure::NotSent,
                            false => SendFailure::Reset,
                        };
                        tries.unsent = e.unsent.take();
                        Event::SendFailed {
                            cause,
                            replayable: tries.unsent.is_some() || tries.replayable(),
                        }
                    }
                }
            }
            Action::AskBudget => {
                held_retry = in_flight.retry();
                // A rule's `maxRetries` bounds the retries in flight too.
                held_rule_retry = match (&balancer, &held_retry) {
                    (Some(b), Some(_)) => b.retry_place(),
                    _ => None,
                };
                let rule_allows = balancer.is_none() || held_rule_retry.is_some();
                if let (Some(b), Some(_), false) = (&balancer, &held_retry, rule_allows) {
                    wp.metrics.overflow(&b.host, "retries");
                }
                Event::Budget {
                    granted: held_retry.is_some() && rule_allows,
                    random: rand::random(),
                }
            }
            Action::Wait { until } => {
                tokio::time::sleep_until(until.into()).await;
                Event::TimerFired {
                    replayable: tries.replayable(),
                }
            }
            Action::Reply(reply) => return finish.answer(reply),
            Action::Deliver { join_upgrade, flag } => {
                let Some((mut response, endpoint)) = answered.take() else {
                    return finish.answer(LocalReply::CONNECTION_TERMINATION);
                };
                if join_upgrade {
                    // An allowed HTTP/1.1 upgrade (WebSocket) joined to the upstream's 101
                    // for the same protocol, the request having passed every check.
                    match on_upgrade.take() {
                        Some(downstream) => {
                            let upstream = hyper::upgrade::on(&mut response);
                            tokio::spawn(join_upgraded(downstream, upstream));
                        }
                        None => {
                            tracing::debug!(%endpoint, "a 101 to a request that cannot switch");
                            return finish.answer(LocalReply::UPSTREAM_PROTOCOL_ERROR);
                        }
                    }
                }
                finish.outcome.response_flags = flag;
                let (mut parts, mut body) = response.into_parts();
                if let Some(cookie) = set_cookie.take() {
                    parts.headers.append(http::header::SET_COOKIE, cookie);
                }
                for (name, value) in &fwd.cors_headers {
                    parts.headers.insert(name.clone(), value.clone());
                }
                for m in &fwd.response_headers {
                    ambit_gateway_routes::apply_headers(m, &mut parts.headers);
                }
                finish.outcome.response_code = parts.status.as_u16();
                if grpc {
                    finish.outcome.grpc_status = grpc_status(&parts.headers);
                }
                if let Some(a) = &mut finish.access {
                    a.status = parts.status.as_u16();
                }
                if let Some(d) = exchange.deadline() {
                    body = Deadline::new(body, d.into()).boxed_unsync();
                }
                let body = Counted::new(body, Arc::new(Progress::default()), Some(finish));
                return Response::from_parts(parts, body.boxed_unsync());
            }
        };
        step = exchange.on(event, Instant::now());
    }
}

/// Whether a 101 switched to the protocol the client asked to upgrade to.
fn switches_as_asked<B>(response: &http::Response<B>, asked: Option<&HeaderValue>) -> bool {
    response.status() == StatusCode::SWITCHING_PROTOCOLS
        && asked
            .zip(response.headers().get(http::header::UPGRADE))
            .is_some_and(|(a, to)| to.as_bytes().eq_ignore_ascii_case(a.as_bytes()))
}

/// The request body for each try: the client's as it comes on the first, a request that
/// came back unsent, or the recorded copy.
struct Tries {
    fresh: Option<Body>,
    unsent: Option<Request<Body>>,
    recording: Option<crate::replay::Recording>,
}

impl Tries {
    /// The body for the next try built from the head.
    fn body(&mut self) -> Option<Body> {
        self.fresh
            .take()
            .or_else(|| self.recording.as_ref().and_then(|r| r.replay()))
    }

    /// Whether a try after this one could send the body again.
    fn replayable(&self) -> bool {
        self.recording.as_ref().is_some_and(|r| r.replayable())
    }
}

/// An onward request's head, kept to build each try.
struct Head {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: HeaderMap,
}

impl Head {
    /// A request with this head; `again`: a later try may need the head again (else its
    /// headers are moved, not copied).
    fn request(&mut self, body: Body, again: bool) -> Request<Body> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = match again {
            true => self.headers.clone(),
            false => std::mem::take(&mut self.headers),
        };
        req
    }
}

/// `f` until `deadline`: `None` once it passes.
async fn within<F: std::future::Future>(deadline: Option<Instant>, f: F) -> Option<F::Output> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), f).await.ok(),
        None => Some(f.await),
    }
}

/// A `grpc-status` header's value.
fn grpc_status(headers: &HeaderMap) -> Option<u32> {
    headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether a request is gRPC (`content-type: application/grpc`, with or without a
/// subtype).
fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v == "application/grpc"
                || v.starts_with("application/grpc+")
                || v.starts_with("application/grpc;")
        })
}

/// Starts a copy of the request to a mirror `target`, fire and forget, if the bound on
/// mirrors in flight allows; returns the feed for its body. The copy's `Host` has
/// `-shadow` added to its host, as Envoy marks mirrored requests.
fn mirror(
    wp: &Arc<Waypoint>,
    state: &ambit_state::ProxyState,
    target: &crate::front::Fronted,
    head: &Head,
    version: Version,
) -> Option<crate::replay::MirrorSender> {
    let permit = wp.mirrors.clone().try_acquire_owned().ok()?;
    let choice = match choose(wp, state, target, &[], None, &[]) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(mirror = %target.describe(), "mirror skipped: {e}");
            return None;
        }
    };
    let (feed, body) = crate::replay::mirror_channel();
    let mut req = Head {
        method: head.method.clone(),
        uri: head.uri.clone(),
        version: head.version,
        headers: head.headers.clone(),
    }
    .request(body.boxed_unsync(), false);
    let shadow = exchange::shadow_authority;
    if let Some(h) = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
    {
        if let Ok(v) = HeaderValue::from_str(&shadow(h)) {
            req.headers_mut().insert(http::header::HOST, v);
        }
    }
    if let Some(a) = req.uri().authority() {
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        if let Ok(u) = format!("http://{}{target}", shadow(a.as_str())).parse() {
            *req.uri_mut() = u;
        }
    }
    let wp = wp.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let sent = tokio::time::timeout(MIRROR_TIMEOUT, async {
            let sender = wp.upstream().connect(&choice.endpoint, version).await?;
            let response = sender.send(req).await.map_err(|e| e.error)?;
            // Read to the end, so an HTTP/1.1 connection goes back to the pool.
            response.into_body().collect().await?;
            Ok::<_, BoxError>(())
        })
        .await;
        if let Ok(Err(e)) = sent {
            tracing::debug!(endpoint = %choice.endpoint.target, "mirrored request failed: {e}");
        }
    });
    Some(feed)
}

/// How long a mirrored request may take before it is abandoned.
pub const MIRROR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

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
    request_body: Arc<Progress>,
    /// The access log line's fields, when the log is on.
    access: Option<crate::access::Entry>,
    /// The endpoint the request went to.
    upstream: Option<std::net::SocketAddr>,
    /// What a DestinationRule's limits count until the response ends.
    held: crate::balancing::Held,
}

impl Finish {
    /// A reply made here (refusal or upstream failure), counted like a forwarded one. To a
    /// gRPC request it is a trailers-only answer.
    fn answer(mut self, reply: LocalReply) -> Response<Body> {
        let shaped = reply.shape(self.outcome.grpc);
        self.outcome.response_flags = reply.flag;
        self.outcome.response_code = shaped.status.as_u16();
        self.outcome.grpc_status = shaped.grpc_status;
        if let Some(a) = &mut self.access {
            a.status = self.outcome.response_code;
            a.details = Some(reply.details);
        }
        self.record(shaped.body.len() as u64);
        let mut response = Response::new(
            Full::new(shaped.body)
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *response.status_mut() = shaped.status;
        *response.headers_mut() = shaped.headers;
        response
    }

    fn record(self, response_bytes: u64) {
        let duration = self.start.elapsed();
        let request_bytes = self.request_body.bytes.load(Ordering::Relaxed);
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

/// How far a body has come: its bytes so far, and whether it broke (for a request body:
/// the client's framing was bad, the client's fault).
#[derive(Debug, Default)]
struct Progress {
    bytes: AtomicU64,
    failed: AtomicBool,
}

impl Progress {
    fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}

/// A body that counts its bytes and, for a response, records the request when it ends.
struct Counted {
    inner: Body,
    progress: Arc<Progress>,
    recorder: Option<Finish>,
}

impl Counted {
    fn new(inner: Body, progress: Arc<Progress>, recorder: Option<Finish>) -> Counted {
        Counted {
            inner,
            progress,
            recorder,
        }
    }

    fn finish(&mut self) {
        if let Some(r) = self.recorder.take() {
            r.record(self.progress.bytes.load(Ordering::Relaxed));
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
                    self.progress
                        .bytes
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                } else if let (Some(t), Some(r)) = (frame.trailers_ref(), &mut self.recorder) {
                    if r.outcome.grpc {
                        r.outcome.grpc_status = grpc_status(t).or(r.outcome.grpc_status);
                    }
                }
            }
            std::task::Poll::Ready(Some(Err(_))) => {
                self.progress.failed.store(true, Ordering::Relaxed);
                self.finish();
            }
            std::task::Poll::Ready(None) => self.finish(),
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
