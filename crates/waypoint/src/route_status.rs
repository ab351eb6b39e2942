//! Route status for users, as `/config_dump` shows it: per Service and port, the routes
//! attached in the order their matches are evaluated, and what is not honoured and why
//! (a backend the mesh does not have, a match that another evaluated first always wins
//! over, a route of the other kind, a refused document). The same lines are logged once
//! per change.

use serde_json::{json, Value};

use ambit_gateway_routes::{
    BackendTarget, Filter, HeaderMatch, PathMatch, QueryMatch, RouteMatch, ServiceBackend,
    ServiceKey, ValueMatch,
};
use ambit_state::ProxyState;

use crate::request_plan::{resolve, Routes};

/// Why a backend cannot be sent to in `state`, if it cannot.
pub fn backend_problem(state: &ProxyState, b: &ServiceBackend, domain: &str) -> Option<String> {
    match resolve(state, &b.service, domain) {
        None => Some(format!("backend {} does not exist in the mesh", b.service)),
        Some(s) if !s.ports.contains_key(&b.port) => {
            Some(format!("backend {} has no port {}", b.service, b.port))
        }
        Some(_) => None,
    }
}

/// The status of every frontend with routes in `state`.
pub fn status<'t>(
    routes: &'t Routes,
    state: &ProxyState,
    domain: &str,
) -> Vec<ambit_gateway_routes::FrontendStatus<'t>> {
    let ports_of = |k: &ServiceKey| {
        resolve(state, k, domain).map_or_else(Vec::new, |s| s.ports.keys().copied().collect())
    };
    ambit_gateway_routes::status(&routes.table, ports_of, |b| {
        backend_problem(state, b, domain)
    })
}

/// The `waypointRoutes` section: one entry per Service and port with routes.
pub fn dump(routes: &Routes, state: &ProxyState, cluster_domain: &str) -> Value {
    let frontends: Vec<Value> = status(routes, state, cluster_domain)
        .iter()
        .map(|f| {
            let order: Vec<Value> = f
                .evaluation
                .iter()
                .map(|m| {
                    json!({
                        "route": m.route.key(),
                        "kind": m.route.kind.to_string(),
                        "rule": m.rule_index,
                        "ruleName": m.rule.name,
                        "match": describe_match(m.route_match),
                        "backends": m.rule.backends.iter().map(|b| json!({
                            "backend": match &b.target {
                                BackendTarget::Service(s) => s.to_string(),
                                BackendTarget::Invalid(why) => format!("invalid: {why}"),
                            },
                            "weight": b.weight,
                        })).collect::<Vec<_>>(),
                        "filters": m.rule.filters.iter().map(filter_name).collect::<Vec<_>>(),
                        "timeouts": {
                            "request": m.rule.timeouts.request.map(|d| format!("{}ms", d.as_millis())),
                            "backendRequest": m.rule.timeouts.backend_request.map(|d| format!("{}ms", d.as_millis())),
                        },
                        "retry": m.rule.retry.as_ref().map(|r| json!({
                            "codes": r.codes,
                            "attempts": r.attempts,
                            "backoff": r.backoff.map(|d| format!("{}ms", d.as_millis())),
                        })),
                    })
                })
                .collect();
            json!({
                "service": f.frontend.service.to_string(),
                "port": f.frontend.port,
                "attached": f.attached.iter().map(|r| r.key()).collect::<Vec<_>>(),
                "evaluationOrder": order,
                "refused": f.refused.iter().map(|r| json!({
                    "kind": r.kind.to_string(),
                    "route": r.route,
                    "reason": r.why,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "frontends": frontends,
        "refusedDocuments": routes.refused.iter().map(|(key, why)| json!({"route": key, "reason": why})).collect::<Vec<_>>(),
        "keptAtLastGoodVersion": routes.kept,
    })
}

fn filter_name(f: &Filter) -> &'static str {
    match f {
        Filter::RequestHeaders(_) => "RequestHeaderModifier",
        Filter::ResponseHeaders(_) => "ResponseHeaderModifier",
        Filter::Redirect(_) => "RequestRedirect",
        Filter::Rewrite(_) => "URLRewrite",
        Filter::Mirror(_) => "RequestMirror",
        Filter::Cors(_) => "CORS",
    }
}

fn value(v: &ValueMatch) -> String {
    match v {
        ValueMatch::Exact(s) => format!("= {s:?}"),
        ValueMatch::Regex(p) => format!("~ {:?}", p.as_str()),
    }
}

/// A match in one line: `PathPrefix /api, method GET, header x-v = "1", query q ~ "a.*"`.
pub fn describe_match(m: &RouteMatch) -> String {
    let mut parts = vec![match &m.path {
        PathMatch::Exact(p) => format!("Exact {p}"),
        PathMatch::Prefix(p) => format!("PathPrefix {p}"),
        PathMatch::Regex(p) => format!("RegularExpression {}", p.as_str()),
    }];
    if let Some(method) = &m.method {
        parts.push(format!("method {method}"));
    }
    parts.extend(
        m.headers
            .iter()
            .map(|HeaderMatch { name, value: v }| format!("header {name} {}", value(v))),
    );
    parts.extend(
        m.query
            .iter()
            .map(|QueryMatch { name, value: v }| format!("query {name} {}", value(v))),
    );
    parts.join(", ")
}
