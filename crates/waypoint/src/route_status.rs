//! Route status for users, as `/config_dump` shows it: per Service and port, the routes
//! attached in the order their matches are evaluated, and what is not honoured and why
//! (a backend the mesh does not have, a match that another evaluated first always wins
//! over, a route of the other kind, a refused document). The same lines are logged once
//! per change.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use ambit_routes::{
    BackendTarget, Filter, Frontend, HeaderMatch, PathMatch, QueryMatch, RouteMatch, ServiceKey,
    ValueMatch,
};
use ambit_state::ProxyState;

use crate::routing::{resolve, Routes};

/// The `waypointRoutes` section: one entry per Service and port with routes.
pub fn dump(routes: &Routes, state: &ProxyState, cluster_domain: &str) -> Value {
    let services: BTreeSet<&ServiceKey> = routes.table.services().collect();
    let mut frontends = Vec::new();
    for key in services {
        let resolved = resolve(state, key, cluster_domain);
        let mut ports: BTreeSet<u16> = routes.table.ports_named(key).into_iter().collect();
        if let Some(s) = &resolved {
            ports.extend(s.ports.keys());
        }
        for port in ports {
            let frontend = Frontend {
                service: key.clone(),
                port,
            };
            let evaluation = routes.table.evaluation(&frontend);
            if evaluation.is_empty() {
                continue;
            }
            let mut refused: Vec<Value> = routes
                .table
                .refusals(&frontend)
                .into_iter()
                .map(|r| json!({"kind": r.kind.to_string(), "route": r.route, "reason": r.why}))
                .collect();
            let mut attached: Vec<String> = Vec::new();
            for m in &evaluation {
                let key = m.route.key();
                if !attached.contains(&key) {
                    attached.push(key);
                    for note in &m.route.notes {
                        refused.push(json!({"kind": m.route.kind.to_string(), "route": m.route.key(), "reason": note}));
                    }
                    for (i, rule) in m.route.rules.iter().enumerate() {
                        for b in &rule.backends {
                            let why = match &b.target {
                                BackendTarget::Invalid(why) => Some(why.clone()),
                                BackendTarget::Service(s) => match resolve(state, &s.service, cluster_domain) {
                                    None => Some(format!("backend {} does not exist in the mesh: its share of requests is answered 500", s.service)),
                                    Some(svc) if !svc.ports.contains_key(&s.port) => Some(format!("backend {} has no port {}: its share of requests is answered 500", s.service, s.port)),
                                    Some(_) => None,
                                },
                            };
                            if let Some(why) = why {
                                refused.push(json!({"kind": m.route.kind.to_string(), "route": m.route.key(), "rule": i, "reason": why}));
                            }
                        }
                    }
                }
            }
            let order: Vec<Value> = evaluation
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
            frontends.push(json!({
                "service": key.to_string(),
                "port": port,
                "attached": attached,
                "evaluationOrder": order,
                "refused": refused,
            }));
        }
    }
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

/// The status as log lines: one per refusal, for the log once per change.
pub fn log_lines(routes: &Routes, state: &ProxyState, cluster_domain: &str) -> Vec<String> {
    let dump = dump(routes, state, cluster_domain);
    let mut lines = Vec::new();
    for f in dump["frontends"].as_array().into_iter().flatten() {
        for r in f["refused"].as_array().into_iter().flatten() {
            lines.push(format!(
                "{}:{}: {} {}: {}",
                f["service"].as_str().unwrap_or_default(),
                f["port"],
                r["kind"].as_str().unwrap_or_default(),
                r["route"].as_str().unwrap_or_default(),
                r["reason"].as_str().unwrap_or_default()
            ));
        }
    }
    lines
}
