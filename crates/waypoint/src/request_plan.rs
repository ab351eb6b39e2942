//! What the routes attached to the dialled Service make of a request, decided before any
//! byte goes onward: the implicit default route, 404, 500, a redirect, or a backend
//! Service with the rule's header modifiers, rewrite, mirrors, timeouts and retry policy
//! (reference waypoint.md §3). Sans-IO: the mesh state and the random number are given.

use std::sync::Arc;
use std::time::Duration;

use ambit_gateway_routes::{
    modified_path, redirect_location, Action, CorsAction, Filter, Frontend, HeaderModifier,
    Matched, PathMatch, RedirectSource, Route, RouteTable, Rule, Selection, ServiceBackend,
    ServiceKey, Timeouts,
};
use ambit_manifests::{ErrorKind, ManifestError, ObjectRef};
use ambit_state::{ProxyState, Service};

use crate::front::Fronted;

/// The routes a waypoint holds: the table requests are chosen by, and the documents
/// refused when they were read (shown in `/config_dump`).
#[derive(Debug, Default)]
pub struct Routes {
    pub table: RouteTable,
    /// Each refused route document: `namespace/name` when known, and why.
    pub refused: Vec<(Option<String>, String)>,
    /// Routes kept at their last good version because their new one was refused.
    pub kept: Vec<String>,
}

/// The routes a load comes to after `previous`: a refused route keeps its last good
/// version (a typo must not drop a route that worked); a file that cannot be read keeps
/// everything as it was.
pub fn merge_routes(
    routes: Vec<Route>,
    errors: &[ManifestError],
    previous: Option<&Routes>,
) -> Routes {
    if errors.iter().any(|e| e.kind == ErrorKind::Read) {
        if let Some(p) = previous {
            return Routes {
                table: p.table.clone(),
                refused: errors.iter().map(|e| (None, e.to_string())).collect(),
                kept: p.table.routes().iter().map(|r| r.key()).collect(),
            };
        }
    }
    let mut routes: Vec<Arc<Route>> = routes.into_iter().map(Arc::new).collect();
    let mut refused = Vec::new();
    let mut kept = Vec::new();
    for e in errors {
        let Some(object) = e.object.as_ref().filter(|o| o.is_route()) else {
            continue;
        };
        let key = object.key.clone();
        refused.push((key.clone(), e.to_string()));
        let last_good = key.as_ref().and_then(|key| {
            previous?
                .table
                .routes()
                .iter()
                .find(|r| &r.key() == key && is_kind(r, object))
                .cloned()
        });
        if let Some(r) = last_good {
            if !routes
                .iter()
                .any(|n| n.key() == r.key() && n.kind == r.kind)
            {
                kept.push(r.key());
                routes.push(r);
            }
        }
    }
    Routes {
        table: RouteTable::new(routes),
        refused,
        kept,
    }
}

fn is_kind(r: &Route, object: &ObjectRef) -> bool {
    object
        .kind
        .as_deref()
        .is_none_or(|k| k == r.kind.to_string())
}

/// The request as routes read it.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    pub method: &'a str,
    /// Normalised, without the query.
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a http::HeaderMap,
    /// `Host` or `:authority`, as sent.
    pub host: &'a str,
}

/// What to do with a request.
#[derive(Debug)]
pub enum Plan<'t> {
    /// Send to this Service frontend (the dialled one when no route is attached).
    Forward(Box<Forward<'t>>),
    /// Routes are attached and none matches: 404, flag `NR`.
    NotFound,
    /// The rule chosen cannot be served: 500, with why (for the log).
    Fail(String),
    /// Answer with a redirect.
    Redirect { status: u16, location: String },
    /// A CORS preflight from an allowed origin: answered 200 with these headers.
    Preflight(Vec<(http::header::HeaderName, http::HeaderValue)>),
}

/// Where and how to forward.
#[derive(Debug)]
pub struct Forward<'t> {
    /// The Service and port to balance over.
    pub target: Fronted,
    /// The route and rule that chose it (`None`: the default route).
    pub rule: Option<Matched<'t>>,
    /// Applied in order to the request, then to the response.
    pub request_headers: Vec<&'t HeaderModifier>,
    pub response_headers: Vec<&'t HeaderModifier>,
    /// A URL rewrite: the new `Host` and path (with the query kept).
    pub host: Option<&'t str>,
    pub path: Option<String>,
    /// Services that get a copy (this request's draw already made).
    pub mirrors: Vec<Fronted>,
    pub timeouts: Timeouts,
    pub retry: RetryPolicy<'t>,
    /// A CORS filter's headers for the answer (the request came from an allowed origin).
    pub cors_headers: Vec<(http::header::HeaderName, http::HeaderValue)>,
}

/// When a try is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy<'t> {
    /// Tries after the first.
    pub retries: u32,
    /// Response codes retried (besides connect failures, and gRPC's UNAVAILABLE and
    /// CANCELLED).
    pub codes: &'t [u16],
    /// The base of the jittered exponential backoff between tries.
    pub backoff: Duration,
    /// A connection reset after the request was sent, and a try's timeout, are retried
    /// (Envoy's `reset`): a route that asks for retries gets them, as the Gateway API's
    /// `HTTPRouteRetryConnectionError` case requires; the mesh default does not.
    pub on_reset: bool,
}

/// Envoy's base backoff interval when none is written.
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(25);

impl RetryPolicy<'_> {
    /// Istio 1.31's default for a waypoint, with or without routes: connect failures,
    /// refused streams and gRPC UNAVAILABLE / CANCELLED, no status codes, 2 retries.
    pub const MESH_DEFAULT: RetryPolicy<'static> = RetryPolicy {
        retries: 2,
        codes: &[],
        backoff: DEFAULT_BACKOFF,
        on_reset: false,
    };

    /// How long to wait before retry number `n` (1 for the first): Envoy's full jitter,
    /// uniform in `[0, (2^n - 1) × base]`, capped at ten times the base.
    pub fn backoff_before(&self, n: u32, random: u64) -> Duration {
        let base = self.backoff.as_micros() as u64;
        let ceiling = ((1u64 << n.min(16)) - 1)
            .saturating_mul(base)
            .min(base.saturating_mul(10));
        Duration::from_micros(random % ceiling.saturating_add(1))
    }
}

/// The Service frontend a request was dialled to, for route choice; `None` for workload
/// addressing (routes attach to Services only).
pub fn frontend_of(fronted: &Fronted, gateway: &Arc<ServiceKey>) -> Option<Frontend> {
    match fronted {
        Fronted::Service { service, port, .. } => Some(Frontend {
            service: ServiceKey::new(service.namespace.clone(), service.name.clone()),
            port: *port,
            gateway: Some(gateway.clone()),
        }),
        Fronted::Workload { .. } => None,
    }
}

/// The Service a backend names, found in the mesh state: by its cluster hostname first,
/// then by namespace and name (a ServiceEntry or another domain).
pub fn resolve(state: &ProxyState, b: &ServiceKey, cluster_domain: &str) -> Option<Arc<Service>> {
    let host = format!("{}.{}.svc.{cluster_domain}", b.name, b.namespace);
    state
        .service_by_key(&format!("{}/{host}", b.namespace))
        .or_else(|| {
            state
                .services()
                .find(|s| s.namespace == b.namespace && s.name == b.name)
                .cloned()
        })
}

fn backend_fronted(
    state: &ProxyState,
    b: &ServiceBackend,
    cluster_domain: &str,
) -> Option<Fronted> {
    let service = resolve(state, &b.service, cluster_domain)?;
    service
        .ports
        .contains_key(&b.port)
        .then_some(Fronted::Service {
            service,
            port: b.port,
            vip: None,
        })
}

/// The plan for `req` dialled to `fronted`. `random` draws the weighted backend and the
/// mirrors' shares.
pub fn plan<'t>(
    table: &'t RouteTable,
    state: &ProxyState,
    fronted: &Fronted,
    req: &RouteRequest<'_>,
    random: u64,
    cluster_domain: &str,
    gateway: &Arc<ServiceKey>,
) -> Plan<'t> {
    let default = || {
        Plan::Forward(Box::new(Forward {
            target: fronted.clone(),
            rule: None,
            request_headers: Vec::new(),
            response_headers: Vec::new(),
            host: None,
            path: None,
            mirrors: Vec::new(),
            timeouts: Timeouts::default(),
            retry: RetryPolicy::MESH_DEFAULT,
            cors_headers: Vec::new(),
        }))
    };
    if table.routes().is_empty() {
        return default();
    }
    let Some(frontend) = frontend_of(fronted, gateway) else {
        return default();
    };
    let request = ambit_gateway_routes::Request {
        method: req.method,
        path: req.path,
        query: req.query,
        headers: req.headers,
    };
    let matched = match table.select(&frontend, &request) {
        Selection::NoRoutes => return default(),
        Selection::NotFound => return Plan::NotFound,
        Selection::Matched(m) => m,
    };
    let rule = matched.rule;
    let matched_prefix = match &matched.route_match.path {
        PathMatch::Prefix(p) => Some(p.as_str()),
        _ => None,
    };
    let described = || {
        format!(
            "{} {} rule {}",
            matched.route.kind,
            matched.route.key(),
            matched.rule_index
        )
    };
    // A rule's CORS filter answers a preflight from an allowed origin itself, whatever
    // the rule would do with the request (Envoy's CORS filter runs before its router).
    let mut cors_headers = Vec::new();
    for f in &rule.filters {
        if let Filter::Cors(c) = f {
            match c.action(req.method, req.headers) {
                CorsAction::Preflight(headers) => return Plan::Preflight(headers),
                CorsAction::Annotate(headers) => cors_headers = headers,
                CorsAction::None => {}
            }
        }
    }
    // Resolved once, below: the picked backend's Service is looked up there.
    let action = rule.action(random, |_| true);
    let (backend, target) = match action {
        Action::Redirect(r) => {
            let host = host_without_port(req.host);
            let source = RedirectSource {
                scheme: "http",
                host,
                port: frontend.port,
                path: req.path,
                query: req.query,
            };
            return match redirect_location(r, matched_prefix, source) {
                Some(location) => Plan::Redirect {
                    status: r.status,
                    location,
                },
                None => Plan::Fail(format!(
                    "{}: its redirect's prefix does not apply to {}",
                    described(),
                    req.path
                )),
            };
        }
        Action::Fail(f) => return Plan::Fail(format!("{}: {f:?}", described())),
        Action::Forward(backend, target) => (backend, target),
    };
    let Some(target) = backend_fronted(state, target, cluster_domain) else {
        return Plan::Fail(format!(
            "{}: backend {target} is not in the mesh, or has no such port",
            described()
        ));
    };
    let mut forward = Forward {
        target,
        rule: Some(matched),
        request_headers: Vec::new(),
        response_headers: Vec::new(),
        host: None,
        path: None,
        mirrors: Vec::new(),
        timeouts: rule.timeouts,
        retry: retry_policy(rule),
        cors_headers,
    };
    // The rule's filters, then the backend's own.
    for f in rule.filters.iter().chain(&backend.filters) {
        match f {
            Filter::RequestHeaders(m) => forward.request_headers.push(m),
            Filter::ResponseHeaders(m) => forward.response_headers.push(m),
            Filter::Rewrite(r) => {
                if let Some(h) = &r.hostname {
                    forward.host = Some(h);
                }
                if let Some(p) = &r.path {
                    match modified_path(p, matched_prefix, req.path) {
                        Some(p) => forward.path = Some(p),
                        None => {
                            return Plan::Fail(format!(
                                "{}: its rewrite's prefix does not apply to {}",
                                described(),
                                req.path
                            ))
                        }
                    }
                }
            }
            Filter::Mirror(m) => {
                // Each mirror draws its share from its own part of the number.
                let draw = (random.rotate_left(17 * (forward.mirrors.len() as u32 + 1))
                    % u64::from(m.denominator.max(1))) as u32;
                if draw < m.numerator {
                    if let Some(t) = backend_fronted(state, &m.backend, cluster_domain) {
                        forward.mirrors.push(t);
                    }
                }
            }
            // Read above, for the rule; a backend's has nothing left to answer.
            Filter::Redirect(_) | Filter::Cors(_) => {}
        }
    }
    Plan::Forward(Box::new(forward))
}

/// `host` without a `:port` (an IPv6 literal keeps its brackets).
fn host_without_port(host: &str) -> &str {
    if let Some(end) = host.strip_prefix('[').and_then(|h| h.find(']')) {
        return &host[..end + 2];
    }
    match host.rsplit_once(':') {
        Some((h, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

fn retry_policy(rule: &Rule) -> RetryPolicy<'_> {
    match &rule.retry {
        None => RetryPolicy::MESH_DEFAULT,
        Some(r) => RetryPolicy {
            retries: r
                .attempts
                .unwrap_or(2)
                .min(ambit_gateway_routes::MAX_RETRY_ATTEMPTS),
            codes: &r.codes,
            backoff: r.backoff.unwrap_or(DEFAULT_BACKOFF),
            on_reset: true,
        },
    }
}

#[cfg(test)]
mod tests;
