//! A rule of an HTTPRoute or GRPCRoute: its matches, filters and backends, and (HTTP only)
//! its timeouts and retry.

use std::time::Duration;

use ambit_gateway_routes::{
    parse_duration, Filter, PathMatch, PathModifier, Redirect, Retry, Rewrite, RouteKind,
    RouteMatch, Rule, Timeouts, MAX_RETRY_ATTEMPTS, MIN_RETRY_BACKOFF,
};

use super::backends::{backend_refs, backends};
use super::filters::filters;
use super::invalid;
use super::matches::{grpc_match, http_match};
use crate::locate::{field, FieldPath};
use crate::route_schema::{GrpcRuleSpec, HttpRuleSpec, RetrySpec, TimeoutsSpec};
use crate::translate::Invalid;
use crate::values::Text;

// The CRDs' limits.
const MAX_HTTP_MATCHES: usize = 64;
const MAX_GRPC_MATCHES: usize = 8;

/// A rule's matches, each read by `read`: at most `max`; none written is one match of
/// every request.
fn rule_matches<M>(
    p: &FieldPath,
    spec: Option<Vec<M>>,
    max: usize,
    read: fn(FieldPath, M) -> Result<RouteMatch, Invalid>,
) -> Result<Vec<RouteMatch>, Invalid> {
    match spec {
        Some(m) if m.len() > max => Err(invalid(
            p.at(field!["matches"]),
            format!("at most {max} matches"),
        )),
        Some(m) if !m.is_empty() => m
            .into_iter()
            .enumerate()
            .map(|(j, m)| read(p.at(field!["matches", j]), m))
            .collect(),
        _ => Ok(vec![RouteMatch::default()]),
    }
}

pub(super) fn http_rule(
    p: FieldPath,
    r: HttpRuleSpec,
    namespace: &str,
    notes: &mut Vec<String>,
) -> Result<Rule, Invalid> {
    let matches = rule_matches(&p, r.matches, MAX_HTTP_MATCHES, http_match)?;
    let filters_spec = r.filters.unwrap_or_default();
    let backends_spec = backend_refs(&p, r.backend_refs)?;
    let fp = p.at(field!["filters"]);
    let mut unsupported = None;
    let filters = filters(
        &fp,
        filters_spec,
        namespace,
        RouteKind::Http,
        &mut unsupported,
        notes,
    )?;
    if !backends_spec.is_empty() && filters.iter().any(|f| matches!(f, Filter::Redirect(_))) {
        return Err(invalid(
            fp,
            "a RequestRedirect filter cannot be used together with backendRefs",
        ));
    }
    let prefix_only = matches.len() == 1 && matches!(matches[0].path, PathMatch::Prefix(_));
    let backends = backends(
        &p,
        backends_spec,
        namespace,
        RouteKind::Http,
        &mut unsupported,
        notes,
    )?;
    let replaces_prefix = |fs: &[Filter]| {
        fs.iter().any(|f| {
            matches!(
                f,
                Filter::Redirect(Redirect {
                    path: Some(PathModifier::Prefix(_)),
                    ..
                }) | Filter::Rewrite(Rewrite {
                    path: Some(PathModifier::Prefix(_)),
                    ..
                })
            )
        })
    };
    if !prefix_only
        && (replaces_prefix(&filters) || backends.iter().any(|b| replaces_prefix(&b.filters)))
    {
        return Err(invalid(
            p.at(field!["matches"]),
            "a filter with path type ReplacePrefixMatch needs exactly one match, of type PathPrefix",
        ));
    }
    let timeouts = r
        .timeouts
        .map(|t| timeouts(&p.at(field!["timeouts"]), t))
        .transpose()?
        .unwrap_or_default();
    let retry = r.retry.map(|rt| retry(&p, rt, notes)).transpose()?;
    if r.session_persistence.is_some() {
        notes.push(format!("{p}.sessionPersistence: not honoured"));
    }
    Ok(Rule {
        name: r.name.map(|n| n.0),
        matches,
        filters,
        backends,
        timeouts,
        retry,
        unsupported,
    })
}

pub(super) fn grpc_rule(
    p: FieldPath,
    r: GrpcRuleSpec,
    namespace: &str,
    notes: &mut Vec<String>,
) -> Result<Rule, Invalid> {
    let matches = rule_matches(&p, r.matches, MAX_GRPC_MATCHES, grpc_match)?;
    let backends_spec = backend_refs(&p, r.backend_refs)?;
    let mut unsupported = None;
    let filters = filters(
        &p.at(field!["filters"]),
        r.filters.unwrap_or_default(),
        namespace,
        RouteKind::Grpc,
        &mut unsupported,
        notes,
    )?;
    let backends = backends(
        &p,
        backends_spec,
        namespace,
        RouteKind::Grpc,
        &mut unsupported,
        notes,
    )?;
    if r.session_persistence.is_some() {
        notes.push(format!("{p}.sessionPersistence: not honoured"));
    }
    Ok(Rule {
        name: r.name.map(|n| n.0),
        matches,
        filters,
        backends,
        timeouts: Timeouts::default(),
        retry: None,
        unsupported,
    })
}

/// A rule's timeouts: the backend request's within the request's, 0 meaning none.
fn timeouts(tp: &FieldPath, t: TimeoutsSpec) -> Result<Timeouts, Invalid> {
    let read = |v: Option<Text>, f: &str| -> Result<Option<Duration>, Invalid> {
        v.map(|t| parse_duration(&t.0).map_err(|m| invalid(tp.at(field![f]), m)))
            .transpose()
    };
    let request = read(t.request, "request")?;
    let backend = read(t.backend_request, "backendRequest")?;
    if let (Some(req), Some(b)) = (request, backend) {
        if !req.is_zero() && b > req {
            return Err(invalid(
                tp.at(field!["backendRequest"]),
                "is longer than the request timeout, which covers it",
            ));
        }
    }
    let nonzero = |d: Option<Duration>| d.filter(|d| !d.is_zero());
    Ok(Timeouts {
        request: nonzero(request),
        backend_request: nonzero(backend),
    })
}

/// A rule's retry: status codes from 400 to 599 once each; attempts capped at
/// [`MAX_RETRY_ATTEMPTS`] and the backoff raised to [`MIN_RETRY_BACKOFF`], each noted, so
/// that no route makes the waypoint retry without end or without pause.
fn retry(p: &FieldPath, rt: RetrySpec, notes: &mut Vec<String>) -> Result<Retry, Invalid> {
    let rp = p.at(field!["retry"]);
    let mut codes = Vec::new();
    for (k, c) in rt.codes.unwrap_or_default().into_iter().enumerate() {
        if !(400..=599).contains(&c) {
            return Err(invalid(
                rp.at(field!["codes", k]),
                format!("{c} is not a status code from 400 to 599"),
            ));
        }
        let c = c as u16;
        if codes.contains(&c) {
            return Err(invalid(
                rp.at(field!["codes", k]),
                format!("{c} is listed twice"),
            ));
        }
        codes.push(c);
    }
    let attempts = rt
        .attempts
        .map(|a| {
            u32::try_from(a).map_err(|_| {
                invalid(
                    rp.at(field!["attempts"]),
                    format!("{a} is not a number of retries (0 or more)"),
                )
            })
        })
        .transpose()?;
    let attempts = match attempts {
        Some(a) if a > MAX_RETRY_ATTEMPTS => {
            notes.push(format!(
                "{p}.retry.attempts: {a} capped at {MAX_RETRY_ATTEMPTS} retries"
            ));
            Some(MAX_RETRY_ATTEMPTS)
        }
        a => a,
    };
    let backoff = rt
        .backoff
        .map(|b| parse_duration(&b.0).map_err(|m| invalid(rp.at(field!["backoff"]), m)))
        .transpose()?;
    let backoff = match backoff {
        Some(b) if b < MIN_RETRY_BACKOFF => {
            notes.push(format!(
                "{p}.retry.backoff: {b:?} raised to {MIN_RETRY_BACKOFF:?}"
            ));
            Some(MIN_RETRY_BACKOFF)
        }
        b => b,
    };
    Ok(Retry {
        codes,
        attempts,
        backoff,
    })
}
