//! A rule's matches: an HTTPRoute's path, headers, query parameters and method, a
//! GRPCRoute's service and method and headers.

use std::collections::HashSet;

use ambit_gateway_routes::{
    grpc_path_match, GrpcMatchType, HeaderMatch, PathMatch, Pattern, QueryMatch, RouteMatch,
    ValueMatch,
};

use super::fields::{check_path, header_name, MAX_HEADER_VALUE, MAX_PATH};
use super::invalid;
use crate::locate::{field, FieldPath};
use crate::route_schema::{GrpcMatchSpec, HttpMatchSpec, ValueMatchSpec};
use crate::translate::Invalid;
use crate::values::Text;

// The CRDs' limits.
const MAX_HEADER_MATCHES: usize = 16;
const MAX_QUERY_MATCHES: usize = 16;
const MAX_QUERY_VALUE: usize = 1024;
const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

pub(super) fn http_match(p: FieldPath, m: HttpMatchSpec) -> Result<RouteMatch, Invalid> {
    let path = match m.path {
        None => PathMatch::prefix("/"),
        Some(path) => {
            let kind = path.kind.as_ref().map_or("PathPrefix", |k| k.0.as_str());
            let value = path.value.as_ref().map_or("/", |v| v.0.as_str());
            let vp = p.at(field!["path", "value"]);
            if value.chars().count() > MAX_PATH {
                return Err(invalid(vp, format!("longer than {MAX_PATH} characters")));
            }
            match kind {
                "Exact" | "PathPrefix" => {
                    check_path(value).map_err(|m| invalid(vp, m))?;
                    if kind == "Exact" {
                        PathMatch::Exact(value.to_string())
                    } else {
                        PathMatch::prefix(value)
                    }
                }
                "RegularExpression" => {
                    PathMatch::Regex(Pattern::new(value).map_err(|e| invalid(vp, e.to_string()))?)
                }
                other => {
                    return Err(invalid(
                        p.at(field!["path", "type"]),
                        format!("unknown path match type {other:?}; one of Exact, PathPrefix, RegularExpression"),
                    ))
                }
            }
        }
    };
    let headers = header_matches(&p, m.headers.unwrap_or_default())?;
    let query = query_matches(&p, m.query_params.unwrap_or_default())?;
    let method = match m.method {
        None => None,
        Some(Text(method)) if METHODS.contains(&method.as_str()) => Some(method),
        Some(Text(other)) => {
            return Err(invalid(
                p.at(field!["method"]),
                format!("unknown method {other:?}; one of {}", METHODS.join(", ")),
            ))
        }
    };
    Ok(RouteMatch {
        path,
        headers,
        query,
        method,
    })
}

pub(super) fn grpc_match(p: FieldPath, m: GrpcMatchSpec) -> Result<RouteMatch, Invalid> {
    let path = match m.method {
        None => PathMatch::prefix("/"),
        Some(method) => {
            let mp = p.at(field!["method"]);
            let kind = match method.kind.as_ref().map_or("Exact", |k| k.0.as_str()) {
                "Exact" => GrpcMatchType::Exact,
                "RegularExpression" => GrpcMatchType::RegularExpression,
                other => {
                    return Err(invalid(
                        mp.at(field!["type"]),
                        format!(
                            "unknown method match type {other:?}; one of Exact, RegularExpression"
                        ),
                    ))
                }
            };
            for (f, v) in [("service", &method.service), ("method", &method.method)] {
                if v.as_ref().is_some_and(|v| v.0.chars().count() > MAX_PATH) {
                    return Err(invalid(
                        mp.at(field![f]),
                        format!("longer than {MAX_PATH} characters"),
                    ));
                }
            }
            let service = method.service.as_ref().map(|s| s.0.as_str());
            let name = method.method.as_ref().map(|s| s.0.as_str());
            grpc_path_match(kind, service, name).map_err(|e| {
                let at = match e {
                    ambit_gateway_routes::GrpcMatchError::Method(_) => mp.at(field!["method"]),
                    ambit_gateway_routes::GrpcMatchError::Service(_) => mp.at(field!["service"]),
                    _ => mp,
                };
                invalid(at, e.to_string())
            })?
        }
    };
    let headers = header_matches(&p, m.headers.unwrap_or_default())?;
    Ok(RouteMatch {
        path,
        headers,
        query: Vec::new(),
        method: None,
    })
}

/// `Exact` (the default) or `RegularExpression` of a header or query match.
fn value_match(p: &FieldPath, m: &ValueMatchSpec, max: usize) -> Result<ValueMatch, Invalid> {
    let value = &m.value.0;
    let vp = p.at(field!["value"]);
    if value.is_empty() {
        return Err(invalid(vp, "must not be empty"));
    }
    if value.chars().count() > max {
        return Err(invalid(vp, format!("longer than {max} characters")));
    }
    match m.kind.as_ref().map_or("Exact", |k| k.0.as_str()) {
        "Exact" => Ok(ValueMatch::Exact(value.clone())),
        "RegularExpression" => Pattern::new(value)
            .map(ValueMatch::Regex)
            .map_err(|e| invalid(vp, e.to_string())),
        other => Err(invalid(
            p.at(field!["type"]),
            format!("unknown match type {other:?}; one of Exact, RegularExpression"),
        )),
    }
}

fn header_matches(p: &FieldPath, list: Vec<ValueMatchSpec>) -> Result<Vec<HeaderMatch>, Invalid> {
    let lp = p.at(field!["headers"]);
    if list.len() > MAX_HEADER_MATCHES {
        return Err(invalid(
            lp,
            format!("at most {MAX_HEADER_MATCHES} header matches"),
        ));
    }
    let mut written = HashSet::new();
    let mut out: Vec<HeaderMatch> = Vec::new();
    for (k, m) in list.iter().enumerate() {
        let ep = lp.at(field![k]);
        let name = header_name(&m.name.0).map_err(|e| invalid(ep.at(field!["name"]), e))?;
        if !written.insert(m.name.0.as_str()) {
            return Err(invalid(
                ep.at(field!["name"]),
                format!("{:?} is matched twice", m.name.0),
            ));
        }
        let value = value_match(&ep, m, MAX_HEADER_VALUE)?;
        // The specification: of names equal but for case, only the first counts.
        if !out.iter().any(|h| h.name == name) {
            out.push(HeaderMatch { name, value });
        }
    }
    Ok(out)
}

fn query_matches(p: &FieldPath, list: Vec<ValueMatchSpec>) -> Result<Vec<QueryMatch>, Invalid> {
    let lp = p.at(field!["queryParams"]);
    if list.len() > MAX_QUERY_MATCHES {
        return Err(invalid(
            lp,
            format!("at most {MAX_QUERY_MATCHES} query parameter matches"),
        ));
    }
    let mut out: Vec<QueryMatch> = Vec::new();
    for (k, m) in list.iter().enumerate() {
        let ep = lp.at(field![k]);
        header_name(&m.name.0).map_err(|e| invalid(ep.at(field!["name"]), e))?;
        if out.iter().any(|q| q.name == m.name.0) {
            return Err(invalid(
                ep.at(field!["name"]),
                format!("{:?} is matched twice", m.name.0),
            ));
        }
        let value = value_match(&ep, m, MAX_QUERY_VALUE)?;
        out.push(QueryMatch {
            name: m.name.0.clone(),
            value,
        });
    }
    Ok(out)
}
