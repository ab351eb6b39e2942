//! Choosing the rule for a request: the routes attached to the frontend the client dialled
//! (a Service and port, never the `Host` header), every match of theirs in the
//! specification's precedence, the first that holds wins.
//!
//! Precedence (HTTPRoute's `matches` documentation, and reference §3.1): an exact path;
//! then a prefix, longest first; then (implementation-specific in the specification) a
//! regular expression, longest first, as Istio orders them; then a match with a method;
//! then more header matches; then more query matches; then the oldest route; then the
//! route first by `namespace/name`; then the rule, and the match, first in the route.
//!
//! HTTPRoutes and GRPCRoutes are never merged: when both kinds attach to one frontend,
//! the kind of its oldest route (then first by `namespace/name`) is used and the routes
//! of the other kind are left out, as the specification decides between them on a
//! Gateway listener.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderMap;

use crate::model::{
    Frontend, ParentKind, PathMatch, Route, RouteKind, RouteMatch, Rule, ServiceKey,
};
use crate::path::prefix_matches;

/// A request, as far as routes look at it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The path without the query (normalised as the waypoint normalises it).
    pub path: &'a str,
    /// The query, without its `?`.
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
}

/// What the routes say of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection<'t> {
    /// No route is attached to the frontend: the request goes to the dialled Service and
    /// port (the implicit default route).
    NoRoutes,
    /// Routes are attached and none matches: 404.
    NotFound,
    Matched(Matched<'t>),
}

/// The rule chosen, and which of its matches chose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matched<'t> {
    pub route: &'t Route,
    pub rule_index: usize,
    pub rule: &'t Rule,
    pub match_index: usize,
    pub route_match: &'t RouteMatch,
}

/// A route, or a match of one, that a frontend does not use, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `namespace/name`.
    pub route: String,
    pub kind: RouteKind,
    pub why: String,
}

/// One match of one rule, placed in the order of precedence.
#[derive(Debug, Clone)]
struct Entry {
    route: usize,
    rule: usize,
    matched: usize,
    /// `None`: every port of the Service.
    port: Option<u16>,
}

/// A route attached to a Service, for choosing the kind used on a frontend.
#[derive(Debug, Clone)]
struct Attached {
    route: usize,
    port: Option<u16>,
}

/// The routes attached to one parent (a Service or ServiceEntry, or a waypoint Gateway),
/// its matches in precedence order.
#[derive(Debug, Clone, Default)]
struct Attachment {
    entries: Vec<Entry>,
    attached: Vec<Attached>,
    /// The exact-path entries by path (indices into the entries, in order) and where the
    /// entries that are not exact begin: exact matches come first in the order, so a
    /// request looks at those of its own path only, then scans the rest.
    exact: HashMap<String, Vec<usize>>,
    rest: usize,
}

/// Every route of a waypoint, indexed by the parent it attaches to. Built once per change
/// of the routes.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    routes: Vec<Arc<Route>>,
    by_service: HashMap<ServiceKey, Attachment>,
    /// Routes whose parent is a waypoint Gateway (`namespace/name`): for the frontends of
    /// that waypoint that have no route of their own.
    by_gateway: HashMap<ServiceKey, Attachment>,
}

/// The order of one match: smaller first.
type SortKey = (
    u8,
    std::cmp::Reverse<usize>,
    bool,
    std::cmp::Reverse<usize>,
    std::cmp::Reverse<usize>,
    (bool, i64),
    String,
    usize,
    usize,
);

fn sort_key(route: &Route, rule: usize, matched: usize) -> SortKey {
    let m = &route.rules[rule].matches[matched];
    let (rank, len) = match &m.path {
        PathMatch::Exact(p) => (0, p.len()),
        PathMatch::Prefix(p) => (1, p.len()),
        PathMatch::Regex(p) => (2, p.as_str().len()),
    };
    use std::cmp::Reverse;
    (
        rank,
        Reverse(len),
        m.method.is_none(),
        Reverse(m.headers.len()),
        Reverse(m.query.len()),
        // Routes with a creation time first, oldest first.
        route.created.map_or((true, 0), |t| (false, t.0)),
        route.key(),
        rule,
        matched,
    )
}

impl RouteTable {
    pub fn new(routes: impl IntoIterator<Item = Arc<Route>>) -> RouteTable {
        let routes: Vec<Arc<Route>> = routes.into_iter().collect();
        let mut by_service: HashMap<ServiceKey, Attachment> = HashMap::new();
        let mut by_gateway: HashMap<ServiceKey, Attachment> = HashMap::new();
        for (ri, route) in routes.iter().enumerate() {
            for parent in &route.parents {
                let map = match parent.kind {
                    ParentKind::Service => &mut by_service,
                    ParentKind::Gateway => &mut by_gateway,
                };
                let a = map.entry(parent.service.clone()).or_default();
                a.attached.push(Attached {
                    route: ri,
                    port: parent.port,
                });
                for (rule_i, rule) in route.rules.iter().enumerate() {
                    for mi in 0..rule.matches.len() {
                        a.entries.push(Entry {
                            route: ri,
                            rule: rule_i,
                            matched: mi,
                            port: parent.port,
                        });
                    }
                }
            }
        }
        for a in by_service.values_mut().chain(by_gateway.values_mut()) {
            a.entries.sort_by(|x, y| {
                sort_key(&routes[x.route], x.rule, x.matched).cmp(&sort_key(
                    &routes[y.route],
                    y.rule,
                    y.matched,
                ))
            });
            a.attached.sort_by_key(|x| {
                let r = &routes[x.route];
                (r.created.map_or((true, 0), |t| (false, t.0)), r.key())
            });
            a.rest = a.entries.len();
            for (i, e) in a.entries.iter().enumerate() {
                match &routes[e.route].rules[e.rule].matches[e.matched].path {
                    PathMatch::Exact(p) => a.exact.entry(p.clone()).or_default().push(i),
                    _ => {
                        a.rest = i;
                        break;
                    }
                }
            }
        }
        RouteTable {
            routes,
            by_service,
            by_gateway,
        }
    }

    /// The routes that apply to `frontend`, and their kind: those attached to its Service
    /// (or ServiceEntry) on its port, else those attached to its waypoint's Gateway, as
    /// Istio lets a Service's routes win over its waypoint's.
    fn used(&self, frontend: &Frontend) -> Option<(&Attachment, RouteKind)> {
        if let Some(a) = self.by_service.get(&frontend.service) {
            if let Some(kind) = self.kind_used(&a.attached, frontend.port) {
                return Some((a, kind));
            }
        }
        let a = self.by_gateway.get(&**frontend.gateway.as_ref()?)?;
        let kind = self.kind_used(&a.attached, frontend.port)?;
        Some((a, kind))
    }

    /// Every route held, in the order given.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }

    /// The routes that apply to `frontend`, in the order they are evaluated (for users to
    /// see): each route once, the kind used only.
    pub fn attached(&self, frontend: &Frontend) -> Vec<&Route> {
        let Some((a, kind)) = self.used(frontend) else {
            return Vec::new();
        };
        let mut seen = Vec::new();
        for e in &a.entries {
            let r = &self.routes[e.route];
            if applies(e.port, frontend.port) && r.kind == kind && !seen.contains(&e.route) {
                seen.push(e.route);
            }
        }
        seen.into_iter().map(|i| &*self.routes[i]).collect()
    }

    /// The Services that have routes attached, in no particular order.
    pub fn services(&self) -> impl Iterator<Item = &ServiceKey> {
        self.by_service.keys()
    }

    /// The ports routes name for `service` (those attached to every port are not listed).
    pub fn ports_named(&self, service: &ServiceKey) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .by_service
            .get(service)
            .into_iter()
            .flat_map(|a| a.attached.iter().filter_map(|x| x.port))
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// Every match that applies to `frontend`, in the order they are evaluated.
    pub fn evaluation(&self, frontend: &Frontend) -> Vec<Matched<'_>> {
        let Some((a, kind)) = self.used(frontend) else {
            return Vec::new();
        };
        a.entries
            .iter()
            .filter(|e| applies(e.port, frontend.port) && self.routes[e.route].kind == kind)
            .map(|e| {
                let route = &*self.routes[e.route];
                let rule = &route.rules[e.rule];
                Matched {
                    route,
                    rule_index: e.rule,
                    rule,
                    match_index: e.matched,
                    route_match: &rule.matches[e.matched],
                }
            })
            .collect()
    }

    /// What users should be told of `frontend`'s routes: matches that can never be chosen
    /// (one the same, evaluated before, always wins), and routes of the other kind left
    /// out (HTTPRoutes and GRPCRoutes are never merged).
    pub fn refusals(&self, frontend: &Frontend) -> Vec<Refusal> {
        let order = self.evaluation(frontend);
        let mut out = Vec::new();
        for (i, m) in order.iter().enumerate() {
            if let Some(first) = order[..i].iter().find(|e| e.route_match == m.route_match) {
                out.push(Refusal {
                    route: m.route.key(),
                    kind: m.route.kind,
                    why: format!(
                        "rule {} match {} conflicts with {} {} rule {} match {}, which is evaluated first and matches the same requests",
                        m.rule_index,
                        m.match_index,
                        first.route.kind,
                        first.route.key(),
                        first.rule_index,
                        first.match_index
                    ),
                });
            }
        }
        let Some((a, kind)) = self.used(frontend) else {
            return out;
        };
        let mut left_out: Vec<&Route> = a
            .attached
            .iter()
            .filter(|a| applies(a.port, frontend.port))
            .map(|a| &*self.routes[a.route])
            .filter(|r| r.kind != kind)
            .collect();
        left_out.dedup_by_key(|r| r.key());
        for r in left_out {
            out.push(Refusal {
                route: r.key(),
                kind: r.kind,
                why: format!(
                    "not used: an older {kind} is attached to this port, and {kind}s and {}s are never merged on one",
                    r.kind
                ),
            });
        }
        out
    }

    /// The kind of the oldest route attached to this port of the Service.
    fn kind_used(&self, attached: &[Attached], port: u16) -> Option<RouteKind> {
        attached
            .iter()
            .find(|a| applies(a.port, port))
            .map(|a| self.routes[a.route].kind)
    }

    /// The rule for `request` dialled to `frontend`.
    pub fn select(&self, frontend: &Frontend, request: &Request<'_>) -> Selection<'_> {
        let Some((a, kind)) = self.used(frontend) else {
            return Selection::NoRoutes;
        };
        let exact = a.exact.get(request.path).map(Vec::as_slice);
        let candidates = exact
            .unwrap_or_default()
            .iter()
            .map(|&i| &a.entries[i])
            .chain(&a.entries[a.rest..]);
        for e in candidates {
            if !applies(e.port, frontend.port) {
                continue;
            }
            let route = &*self.routes[e.route];
            if route.kind != kind {
                continue;
            }
            let rule = &route.rules[e.rule];
            let m = &rule.matches[e.matched];
            if matches(m, request) {
                return Selection::Matched(Matched {
                    route,
                    rule_index: e.rule,
                    rule,
                    match_index: e.matched,
                    route_match: m,
                });
            }
        }
        Selection::NotFound
    }
}

fn applies(attached: Option<u16>, dialled: u16) -> bool {
    attached.is_none_or(|p| p == dialled)
}

/// True if every condition of `m` holds for `request`.
pub fn matches(m: &RouteMatch, request: &Request<'_>) -> bool {
    let path_ok = match &m.path {
        PathMatch::Exact(p) => p == request.path,
        PathMatch::Prefix(p) => prefix_matches(p, request.path),
        PathMatch::Regex(p) => p.is_match(request.path),
    };
    path_ok
        && m.method
            .as_deref()
            .is_none_or(|want| want == request.method)
        && m.headers
            .iter()
            .all(|h| header_value(request.headers, &h.name).is_some_and(|v| h.value.matches(&v)))
        && m.query
            .iter()
            .all(|q| query_value(request.query, &q.name).is_some_and(|v| q.value.matches(v)))
}

/// A header's value; a header sent more than once, its values joined by `,`. A value that
/// is not text matches nothing.
fn header_value<'h>(
    headers: &'h HeaderMap,
    name: &http::header::HeaderName,
) -> Option<std::borrow::Cow<'h, str>> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?.to_str().ok()?;
    let mut joined: Option<String> = None;
    for v in values {
        let s = joined.get_or_insert_with(|| first.to_string());
        s.push(',');
        s.push_str(v.to_str().ok()?);
    }
    Some(joined.map_or(std::borrow::Cow::Borrowed(first), std::borrow::Cow::Owned))
}

/// The first value of a query parameter, as sent (`a` alone is the empty value).
fn query_value<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_first_as_sent() {
        assert_eq!(query_value(Some("a=1&b=2&a=3"), "a"), Some("1"));
        assert_eq!(query_value(Some("a&b=2"), "a"), Some(""));
        assert_eq!(query_value(Some("a%20b=1"), "a b"), None);
        assert_eq!(query_value(Some("ab=1"), "a"), None);
        assert_eq!(query_value(None, "a"), None);
    }

    #[test]
    fn repeated_headers_are_joined() {
        let mut h = HeaderMap::new();
        h.append("x-v", "a".parse().unwrap());
        assert_eq!(
            header_value(&h, &"x-v".parse().unwrap()).as_deref(),
            Some("a")
        );
        h.append("x-v", "b".parse().unwrap());
        assert_eq!(
            header_value(&h, &"x-v".parse().unwrap()).as_deref(),
            Some("a,b")
        );
        h.append("x-bin", http::HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(header_value(&h, &"x-bin".parse().unwrap()), None);
        assert_eq!(header_value(&h, &"x-none".parse().unwrap()), None);
    }
}
