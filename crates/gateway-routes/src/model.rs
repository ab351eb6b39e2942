//! The routes as the waypoint holds them: each HTTPRoute or GRPCRoute translated once
//! (defaults filled in, names lower-cased, regular expressions compiled, GRPCRoute's
//! service and method turned into a path), so that choosing a rule at request time only
//! compares. Built by `ambit-manifests` from the documents users write; nothing here reads
//! YAML.

use std::fmt;
use std::time::Duration;

use http::header::HeaderName;

use crate::path::normalize_prefix;
use crate::pattern::Pattern;

/// A Kubernetes Service, by namespace and name: what a mesh route attaches to and what a
/// backend names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub namespace: String,
    pub name: String,
}

impl ServiceKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ServiceKey {
        ServiceKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The Service of a cluster hostname `<name>.<namespace>.svc.<domain>` (the form a
    /// waypoint learns its Services by), or `None` for any other host.
    pub fn from_hostname(host: &str, domain: &str) -> Option<ServiceKey> {
        let rest = host.strip_suffix(domain)?.strip_suffix(".svc.")?;
        let (name, namespace) = rest.split_once('.')?;
        let label = |s: &str| !s.is_empty() && !s.contains('.');
        (label(name) && label(namespace)).then(|| ServiceKey::new(namespace, name))
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The frontend a client dialled: a Service and one of its ports. Routes are chosen by it,
/// never by the `Host` header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frontend {
    pub service: ServiceKey,
    pub port: u16,
    /// The waypoint's Gateway (`namespace/name`), whose routes apply when the Service has
    /// none of its own.
    pub gateway: Option<std::sync::Arc<ServiceKey>>,
}

/// Which API a route was written in. HTTPRoutes and GRPCRoutes are never merged on one
/// frontend (the GRPCRoute specification forbids it): see [`crate::RouteTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    Http,
    Grpc,
}

impl fmt::Display for RouteKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
        })
    }
}

/// `metadata.creationTimestamp`, as seconds since the Unix epoch: the oldest route wins a
/// tie. A route without one (a local file that never went through an API server) counts
/// as newer than every route with one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CreationTime(pub i64);

impl CreationTime {
    /// Reads Kubernetes' form, RFC 3339 in UTC to the second: `2024-05-01T12:00:00Z`.
    pub fn parse(s: &str) -> Result<CreationTime, String> {
        let b = s.as_bytes();
        let shape = b.len() == 20
            && b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[13] == b':'
            && b[16] == b':'
            && b[19] == b'Z';
        let num = |r: std::ops::Range<usize>| -> Option<i64> {
            let part = s.get(r)?;
            part.bytes()
                .all(|c| c.is_ascii_digit())
                .then(|| part.parse().ok())?
        };
        let bad = || format!("{s:?} is not a timestamp like 2024-05-01T12:00:00Z (RFC 3339, UTC)");
        if !shape {
            return Err(bad());
        }
        let (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(sec)) = (
            num(0..4),
            num(5..7),
            num(8..10),
            num(11..13),
            num(14..16),
            num(17..19),
        ) else {
            return Err(bad());
        };
        if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
            return Err(bad());
        }
        // Days from the civil date (proleptic Gregorian), as in H. Hinnant's algorithm.
        let y = if mo <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (mo + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        Ok(CreationTime(days * 86_400 + h * 3600 + mi * 60 + sec))
    }
}

/// One route, as attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub kind: RouteKind,
    pub namespace: String,
    pub name: String,
    pub created: Option<CreationTime>,
    /// The Service frontends it attaches to; never empty.
    pub parents: Vec<ParentRef>,
    /// What of the route as written is not honoured, each with why (shown to users): a
    /// `parentRefs` entry a waypoint does not serve, a mirror to an invalid backend.
    pub notes: Vec<String>,
    pub rules: Vec<Rule>,
}

impl Route {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A `parentRef`: the route applies to `port` of the Service (or ServiceEntry), or to
/// every port when `port` is `None`; or to every frontend of a waypoint Gateway without
/// routes of its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParentRef {
    /// The Service's or ServiceEntry's namespace and name, or the Gateway's.
    pub service: ServiceKey,
    pub port: Option<u16>,
    pub kind: ParentKind,
}

/// What a `parentRef` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ParentKind {
    /// A Service (core group) or a ServiceEntry (`networking.istio.io`): both are Services
    /// in the mesh state, by namespace and name.
    #[default]
    Service,
    /// A waypoint Gateway (`gateway.networking.k8s.io`).
    Gateway,
}

/// One rule: any of its matches selects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `name`, when written.
    pub name: Option<String>,
    /// Never empty: a rule written without matches has the default one (prefix `/`).
    pub matches: Vec<RouteMatch>,
    pub filters: Vec<Filter>,
    pub backends: Vec<Backend>,
    pub timeouts: Timeouts,
    pub retry: Option<Retry>,
    /// Set when the rule uses a filter the waypoint does not implement: the specification
    /// forbids skipping such a filter, so a request the rule selects is answered 500.
    pub unsupported: Option<String>,
}

/// One match: every condition written must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMatch {
    pub path: PathMatch,
    /// Names unique (case-insensitively); a later entry for a name already matched is
    /// dropped, as the specification says.
    pub headers: Vec<HeaderMatch>,
    /// Names unique; compared case-sensitively.
    pub query: Vec<QueryMatch>,
    /// Upper case, compared exactly.
    pub method: Option<String>,
}

impl Default for RouteMatch {
    /// The match of a rule written without one: every request.
    fn default() -> RouteMatch {
        RouteMatch {
            path: PathMatch::prefix("/"),
            headers: Vec::new(),
            query: Vec::new(),
            method: None,
        }
    }
}

/// How the request path is compared (without its query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// The whole path, case-sensitively.
    Exact(String),
    /// Whole `/`-separated segments: `/foo` matches `/foo`, `/foo/` and `/foo/bar`, never
    /// `/foobar`. Held without a trailing `/` (written `/foo/` means `/foo`), except `/`.
    Prefix(String),
    /// The whole path matches the expression.
    Regex(Pattern),
}

impl PathMatch {
    /// A prefix match of `value` as written (its trailing `/` dropped).
    pub fn prefix(value: &str) -> PathMatch {
        PathMatch::Prefix(normalize_prefix(value).to_string())
    }
}

/// A request header condition. The name is lower case (names compare
/// case-insensitively); a header sent more than once is compared as its values joined by
/// `,` (RFC 9110 §5.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderMatch {
    pub name: HeaderName,
    pub value: ValueMatch,
}

/// A query parameter condition: the first value of the parameter, as sent (not
/// percent-decoded), as Envoy compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryMatch {
    pub name: String,
    pub value: ValueMatch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueMatch {
    Exact(String),
    /// The whole value matches the expression.
    Regex(Pattern),
}

impl ValueMatch {
    pub fn matches(&self, value: &str) -> bool {
        match self {
            ValueMatch::Exact(v) => v == value,
            ValueMatch::Regex(p) => p.is_match(value),
        }
    }
}

/// A filter, in the order written (the specification asks that order be kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    RequestHeaders(HeaderModifier),
    ResponseHeaders(HeaderModifier),
    Redirect(Redirect),
    Rewrite(Rewrite),
    Mirror(Mirror),
    /// `CORS`: preflights answered, answers annotated ([`crate::Cors`]).
    Cors(crate::Cors),
}

/// `set`, `add` and `remove` of a header modifier. Names are lower case and each name
/// appears in at most one of the three lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderModifier {
    /// Replaces every value of the header.
    pub set: Vec<(HeaderName, String)>,
    /// Appends a value (after any the message has).
    pub add: Vec<(HeaderName, String)>,
    pub remove: Vec<HeaderName>,
}

/// `RequestRedirect`: answered by the waypoint, never forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// `http` or `https`; `None` keeps the request's.
    pub scheme: Option<String>,
    /// `None` keeps the request's host.
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    /// `None`: derived from the scheme as the specification says.
    pub port: Option<u16>,
    /// 301, 302 (the default), 303, 307 or 308.
    pub status: u16,
}

/// `URLRewrite`: the request is forwarded with these changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
}

/// How a redirect or rewrite changes the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathModifier {
    /// The whole path becomes this.
    Full(String),
    /// The segments the rule's (only, prefix) match matched become this: see
    /// [`crate::replace_prefix`].
    Prefix(String),
}

/// `RequestMirror`: a copy of the request to `backend`, its answer ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    pub backend: ServiceBackend,
    /// The share of requests mirrored, `numerator / denominator` (`percent` is `n/100`;
    /// neither written: all).
    pub numerator: u32,
    pub denominator: u32,
}

/// A Service and port to send to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceBackend {
    pub service: ServiceKey,
    pub port: u16,
}

impl fmt::Display for ServiceBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.service, self.port)
    }
}

/// A `backendRef` of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub target: BackendTarget,
    /// 0 to 1,000,000; 0 is never chosen.
    pub weight: u32,
    /// Applied only to requests sent to this backend (header modifiers).
    pub filters: Vec<Filter>,
}

/// Where a backend sends, or why it cannot: a request that lands on an invalid backend is
/// answered 500 (the specification keeps the weight share of an invalid backend for 500s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendTarget {
    Service(ServiceBackend),
    Invalid(String),
}

/// `timeouts`; `None` means none was written (no timeout, as Istio), and a written `0s`
/// is also held as `None` (the specification: zero disables).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole exchange, retries included; expiry is 504.
    pub request: Option<Duration>,
    /// Each try to a backend.
    pub backend_request: Option<Duration>,
}

/// The most retries a rule gets: a larger `attempts` is capped here, with a note. The
/// Gateway API sets no maximum and Istio passes any number to Envoy (and lifts Envoy's
/// default of three retries in flight per cluster), so one request could retry for as long
/// as its client waits; past ten, retries no longer ride over a blip, they hide an outage
/// and multiply its load. The waypoint's retry budget bounds them across requests too.
pub const MAX_RETRY_ATTEMPTS: u32 = 10;

/// The smallest base backoff: Envoy rounds a shorter one up to 1 ms.
pub const MIN_RETRY_BACKOFF: Duration = Duration::from_millis(1);

/// `retry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Status codes (400-599) that are retried, besides connection failures.
    pub codes: Vec<u16>,
    /// Retries after the first try, at most [`MAX_RETRY_ATTEMPTS`]; `None` is the default
    /// (2, as Istio).
    pub attempts: Option<u32>,
    /// The base interval between tries, at least [`MIN_RETRY_BACKOFF`].
    pub backoff: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_times_read_kubernetes_form_and_order_by_age() {
        assert_eq!(
            CreationTime::parse("1970-01-01T00:00:00Z"),
            Ok(CreationTime(0))
        );
        assert_eq!(
            CreationTime::parse("2020-09-08T01:02:03Z"),
            Ok(CreationTime(1_599_526_923))
        );
        assert!(
            CreationTime::parse("2020-09-08T01:02:03Z").unwrap()
                < CreationTime::parse("2020-09-08T01:02:04Z").unwrap()
        );
        for bad in [
            "",
            "2020-09-08",
            "2020-09-08T01:02:03",
            "2020-13-08T01:02:03Z",
            "2020-09-08T25:02:03Z",
            "2020-09-08T01:02:03+01:00",
            "+020-09-08T01:02:03Z",
        ] {
            assert!(CreationTime::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn services_from_cluster_hostnames() {
        let d = "cluster.local";
        assert_eq!(
            ServiceKey::from_hostname("reviews.shop.svc.cluster.local", d),
            Some(ServiceKey::new("shop", "reviews"))
        );
        for other in [
            "reviews.shop.svc.example.org",
            "reviews.svc.cluster.local",
            "a.b.shop.svc.cluster.local",
            "example.com",
        ] {
            assert_eq!(ServiceKey::from_hostname(other, d), None, "{other}");
        }
    }
}
