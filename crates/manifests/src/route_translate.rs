//! An HTTPRoute or GRPCRoute, as read ([`crate::route_schema`]), checked as the Gateway API
//! CRDs check it (required fields, value patterns, list limits, and the rules between
//! fields their validation expressions state) and translated into the routes model
//! ([`ambit_routes::Route`]): defaults filled, names lower-cased, expressions compiled.
//!
//! Only `parentRefs` of kind Service in the route's own namespace attach a route to a
//! waypoint's frontend; other parents (a Gateway, a ServiceEntry, a Service of another
//! namespace) are noted on the route, and a route with none is skipped. `hostnames` are
//! checked but do not narrow a mesh route: the frontend dialled is what selects it.
//! `sessionPersistence` is read and not honoured (noted). Sans-IO.

use std::collections::HashSet;
use std::time::Duration;

use ambit_routes::{
    grpc_path_match, parse_duration, Backend, BackendTarget, CreationTime, Filter, GrpcMatchType,
    HeaderMatch, HeaderModifier, Mirror, ParentRef, PathMatch, PathModifier, Pattern, QueryMatch,
    Redirect, Retry, Rewrite, Route, RouteKind, RouteMatch, Rule, ServiceBackend, ServiceKey,
    Timeouts, ValueMatch, MAX_RETRY_ATTEMPTS, MIN_RETRY_BACKOFF,
};
use http::header::HeaderName;

use crate::locate::{field, FieldPath};
use crate::model::SkipReason;
use crate::route_schema::{
    BackendObjectSpec, BackendRefSpec, FilterSpec, GrpcMatchSpec, GrpcRuleSpec, HeaderFilterSpec,
    HttpMatchSpec, HttpRuleSpec, PathModifierSpec, RouteObject, ValueMatchSpec,
};
use crate::translate::{check_dns, Invalid};
use crate::values::Text;
use crate::ParseOptions;

/// The Gateway API group.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
pub const HTTP_ROUTE_VERSIONS: &[&str] = &["v1", "v1beta1"];
pub const GRPC_ROUTE_VERSIONS: &[&str] = &["v1"];

// The CRDs' limits.
const MAX_PARENT_REFS: usize = 32;
const MAX_HOSTNAMES: usize = 16;
const MAX_RULES: usize = 16;
const MAX_HTTP_MATCHES: usize = 64;
const MAX_GRPC_MATCHES: usize = 8;
const MAX_MATCHES_PER_ROUTE: usize = 128;
const MAX_FILTERS: usize = 16;
const MAX_BACKEND_REFS: usize = 16;
const MAX_HEADER_MATCHES: usize = 16;
const MAX_QUERY_MATCHES: usize = 16;
const MAX_HEADER_CHANGES: usize = 16;
const MAX_PATH: usize = 1024;
const MAX_HEADER_VALUE: usize = 4096;
const MAX_QUERY_VALUE: usize = 1024;
const MAX_HEADER_NAME: usize = 256;
const MAX_WEIGHT: i64 = 1_000_000;
const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];
const REDIRECT_CODES: &[i64] = &[301, 302, 303, 307, 308];

fn invalid(path: FieldPath, message: impl Into<String>) -> Invalid {
    Invalid {
        path,
        message: message.into(),
    }
}

/// What a route came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RouteOutcome {
    Route(Route),
    Skipped(SkipReason),
}

/// A route's namespace (defaulted) and name, and what it came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteTranslation {
    pub namespace: String,
    pub name: String,
    pub outcome: RouteOutcome,
}

/// The route's header: name, namespace, creation time, and the Service parents.
struct Head {
    namespace: String,
    name: String,
    created: Option<CreationTime>,
    parents: Vec<ParentRef>,
    notes: Vec<String>,
}

/// A parentRef as the CRD compares them: group, kind, namespace, name, sectionName, port.
type ParentKey = (String, String, String, String, Option<String>, Option<i64>);

fn head<R>(
    obj: &RouteObject<R>,
    created: Option<&str>,
    options: &ParseOptions,
) -> Result<Head, Invalid> {
    let name = obj.metadata.name.0.clone();
    check_dns(&name, 253, true).map_err(|m| invalid(field!["metadata", "name"], m))?;
    let namespace = match &obj.metadata.namespace {
        Some(Text(ns)) if !ns.is_empty() => {
            check_dns(ns, 63, false).map_err(|m| invalid(field!["metadata", "namespace"], m))?;
            ns.clone()
        }
        _ => options.default_namespace.clone(),
    };
    let created = created
        .map(CreationTime::parse)
        .transpose()
        .map_err(|m| invalid(field!["metadata", "creationTimestamp"], m))?;
    let spec = obj.spec.as_ref();
    let refs = spec.and_then(|s| s.parent_refs.as_deref()).unwrap_or(&[]);
    if refs.len() > MAX_PARENT_REFS {
        return Err(invalid(
            field!["spec", "parentRefs"],
            format!("at most {MAX_PARENT_REFS} parentRefs"),
        ));
    }
    let mut parents = Vec::new();
    let mut notes = Vec::new();
    let mut seen: Vec<ParentKey> = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        let p = field!["spec", "parentRefs", i];
        let group = r.group.as_ref().map_or(GATEWAY_GROUP, |g| g.0.as_str());
        let kind = r.kind.as_ref().map_or("Gateway", |k| k.0.as_str());
        check_group(group).map_err(|m| invalid(p.at(field!["group"]), m))?;
        check_kind(kind).map_err(|m| invalid(p.at(field!["kind"]), m))?;
        check_object_name(&r.name.0).map_err(|m| invalid(p.at(field!["name"]), m))?;
        let ns = match &r.namespace {
            Some(Text(ns)) => {
                check_dns(ns, 63, false).map_err(|m| invalid(p.at(field!["namespace"]), m))?;
                ns.clone()
            }
            None => namespace.clone(),
        };
        if let Some(Text(s)) = &r.section_name {
            check_dns(s, 253, true).map_err(|m| invalid(p.at(field!["sectionName"]), m))?;
        }
        let port = r
            .port
            .map(|n| port(n).map_err(|m| invalid(p.at(field!["port"]), m)))
            .transpose()?;
        // The CRD: two references to one parent must tell themselves apart by
        // sectionName or port.
        let section = r.section_name.as_ref().map(|s| s.0.clone());
        let key = (
            group.to_string(),
            kind.to_string(),
            ns.clone(),
            r.name.0.clone(),
            section.clone(),
            r.port,
        );
        let same_parent =
            |k: &ParentKey| (&k.0, &k.1, &k.2, &k.3) == (&key.0, &key.1, &key.2, &key.3);
        if let Some(other) = seen.iter().find(|k| same_parent(k)) {
            let distinct = (key.4.is_some() || key.5.is_some())
                && (other.4.is_some() || other.5.is_some())
                && (other.4 != key.4 || other.5 != key.5);
            if !distinct {
                return Err(invalid(
                    p,
                    "refers to a parent already referred to; references to one parent must each set a distinct sectionName or port",
                ));
            }
        }
        seen.push(key);
        let shown = format!("parentRefs[{i}] ({kind} {ns}/{})", r.name.0);
        if !(group.is_empty() && kind == "Service") {
            notes.push(format!(
                "{shown}: not honoured; a waypoint serves routes whose parent is a Service (group \"\")"
            ));
        } else if ns != namespace {
            notes.push(format!(
                "{shown}: not honoured; a route for another namespace's Service (a consumer route) is not served by that Service's waypoint"
            ));
        } else if r.section_name.is_some() {
            notes.push(format!(
                "{shown}: not honoured; a Service parent is scoped by port, not sectionName"
            ));
        } else {
            parents.push(ParentRef {
                service: ServiceKey::new(ns, r.name.0.clone()),
                port,
            });
        }
    }
    if let Some(hosts) = spec.and_then(|s| s.hostnames.as_ref()) {
        if hosts.len() > MAX_HOSTNAMES {
            return Err(invalid(
                field!["spec", "hostnames"],
                format!("at most {MAX_HOSTNAMES} hostnames"),
            ));
        }
        for (i, h) in hosts.iter().enumerate() {
            let bare = h.0.strip_prefix("*.").unwrap_or(&h.0);
            check_hostname(bare).map_err(|m| invalid(field!["spec", "hostnames", i], m))?;
        }
    }
    Ok(Head {
        namespace,
        name,
        created,
        parents,
        notes,
    })
}

fn finish(head: Head, kind: RouteKind, rules: Vec<Rule>, notes: Vec<String>) -> RouteTranslation {
    let outcome = if head.parents.is_empty() {
        RouteOutcome::Skipped(SkipReason::NoServiceParent)
    } else {
        let mut all = head.notes;
        all.extend(notes);
        RouteOutcome::Route(Route {
            kind,
            namespace: head.namespace.clone(),
            name: head.name.clone(),
            created: head.created,
            parents: head.parents,
            notes: all,
            rules,
        })
    };
    RouteTranslation {
        namespace: head.namespace,
        name: head.name,
        outcome,
    }
}

/// The rules list: at least one when written (the CRD), the default one when not, at
/// most 16, names unique, at most 128 matches in all.
fn check_rules<R>(
    rules: Option<&Vec<R>>,
    count: impl Fn(&R) -> usize,
    name: impl Fn(&R) -> Option<&str>,
) -> Result<(), Invalid> {
    let p = field!["spec", "rules"];
    let Some(rules) = rules else {
        return Ok(());
    };
    if rules.is_empty() {
        return Err(invalid(
            p,
            "must hold at least 1 rule; leave rules out for the default rule",
        ));
    }
    if rules.len() > MAX_RULES {
        return Err(invalid(p, format!("at most {MAX_RULES} rules")));
    }
    let total: usize = rules.iter().map(&count).sum();
    if total > MAX_MATCHES_PER_ROUTE {
        return Err(invalid(
            p,
            format!(
                "{total} matches in all; the rules of a route hold at most {MAX_MATCHES_PER_ROUTE}"
            ),
        ));
    }
    let mut names = HashSet::new();
    for (i, r) in rules.iter().enumerate() {
        if let Some(n) = name(r) {
            check_dns(n, 253, true).map_err(|m| invalid(field!["spec", "rules", i, "name"], m))?;
            if !names.insert(n) {
                return Err(invalid(
                    field!["spec", "rules", i, "name"],
                    format!("rule name {n:?} is used twice; rule names are unique within a route"),
                ));
            }
        }
    }
    Ok(())
}

/// Checks and translates an HTTPRoute. `created` is `metadata.creationTimestamp`, if set.
pub(crate) fn translate_http(
    obj: RouteObject<HttpRuleSpec>,
    created: Option<&str>,
    options: &ParseOptions,
) -> Result<RouteTranslation, Invalid> {
    translate_route(
        obj,
        created,
        options,
        RouteKind::Http,
        |r| (r.matches.as_ref().map(Vec::len), r.name.as_ref()),
        http_rule,
    )
}

/// Checks and translates a GRPCRoute.
pub(crate) fn translate_grpc(
    obj: RouteObject<GrpcRuleSpec>,
    created: Option<&str>,
    options: &ParseOptions,
) -> Result<RouteTranslation, Invalid> {
    translate_route(
        obj,
        created,
        options,
        RouteKind::Grpc,
        |r| (r.matches.as_ref().map(Vec::len), r.name.as_ref()),
        grpc_rule,
    )
}

/// What both kinds share: the head, the rules' count and names, each rule by `rule`.
/// `shape` gives a rule's number of matches (if written) and its name.
fn translate_route<R>(
    obj: RouteObject<R>,
    created: Option<&str>,
    options: &ParseOptions,
    kind: RouteKind,
    shape: impl Fn(&R) -> (Option<usize>, Option<&Text>),
    rule: impl Fn(FieldPath, R, &str, &mut Vec<String>) -> Result<Rule, Invalid>,
) -> Result<RouteTranslation, Invalid> {
    let head = head(&obj, created, options)?;
    let rules_spec = obj.spec.and_then(|s| s.rules);
    check_rules(
        rules_spec.as_ref(),
        |r| shape(r).0.map_or(1, |n| n.max(1)),
        |r| shape(r).1.map(|n| n.0.as_str()),
    )?;
    let mut notes = Vec::new();
    let rules = match rules_spec {
        None => vec![default_rule()],
        Some(rules) => rules
            .into_iter()
            .enumerate()
            .map(|(i, r)| rule(field!["spec", "rules", i], r, &head.namespace, &mut notes))
            .collect::<Result<_, _>>()?,
    };
    Ok(finish(head, kind, rules, notes))
}

/// The rule of a route written without rules: every request, no backend (so 500).
fn default_rule() -> Rule {
    Rule {
        name: None,
        matches: vec![RouteMatch::default()],
        filters: Vec::new(),
        backends: Vec::new(),
        timeouts: Timeouts::default(),
        retry: None,
        unsupported: None,
    }
}

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

/// A rule's `backendRefs`, at most [`MAX_BACKEND_REFS`].
fn backend_refs(
    p: &FieldPath,
    spec: Option<Vec<BackendRefSpec>>,
) -> Result<Vec<BackendRefSpec>, Invalid> {
    let spec = spec.unwrap_or_default();
    if spec.len() > MAX_BACKEND_REFS {
        return Err(invalid(
            p.at(field!["backendRefs"]),
            format!("at most {MAX_BACKEND_REFS} backendRefs"),
        ));
    }
    Ok(spec)
}

fn http_rule(
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
    let timeouts = match r.timeouts {
        None => Timeouts::default(),
        Some(t) => {
            let tp = p.at(field!["timeouts"]);
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
            Timeouts {
                request: nonzero(request),
                backend_request: nonzero(backend),
            }
        }
    };
    let retry = match r.retry {
        None => None,
        Some(rt) => {
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
            Some(Retry {
                codes,
                attempts,
                backoff,
            })
        }
    };
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

fn grpc_rule(
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

fn http_match(p: FieldPath, m: HttpMatchSpec) -> Result<RouteMatch, Invalid> {
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

fn grpc_match(p: FieldPath, m: GrpcMatchSpec) -> Result<RouteMatch, Invalid> {
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
                    ambit_routes::GrpcMatchError::Method(_) => mp.at(field!["method"]),
                    ambit_routes::GrpcMatchError::Service(_) => mp.at(field!["service"]),
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

/// An HTTP header name as the CRD allows it (a token of RFC 7230, 1-256 long), lower-cased.
pub(crate) fn header_name(s: &str) -> Result<HeaderName, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if s.is_empty() || s.len() > MAX_HEADER_NAME || !s.chars().all(token) {
        return Err(format!(
            "{s:?} is not a header name: 1-{MAX_HEADER_NAME} letters, digits or !#$%&'*+-.^_`|~ (no ':' pseudo-headers)"
        ));
    }
    HeaderName::from_bytes(s.to_ascii_lowercase().as_bytes()).map_err(|e| format!("{s:?}: {e}"))
}

/// A header value written in a modifier: visible ASCII, single spaces or tabs between.
fn header_value(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > MAX_HEADER_VALUE {
        return Err(format!("must be 1-{MAX_HEADER_VALUE} characters"));
    }
    if http::HeaderValue::from_str(s).is_err() {
        return Err(format!(
            "{s:?} is not a header value (visible ASCII, spaces and tabs)"
        ));
    }
    Ok(())
}

/// An Exact or PathPrefix value, as the CRD's rules check it.
fn check_path(v: &str) -> Result<(), String> {
    if !v.starts_with('/') {
        return Err(format!("{v:?} must be an absolute path, starting with '/'"));
    }
    for bad in ["//", "/./", "/../", "%2f", "%2F", "#"] {
        if v.contains(bad) {
            return Err(format!("{v:?} must not contain {bad:?}"));
        }
    }
    for bad in ["/..", "/."] {
        if v.ends_with(bad) {
            return Err(format!("{v:?} must not end with {bad:?}"));
        }
    }
    let bytes = v.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'%' {
            let hex = |b: Option<&u8>| b.is_some_and(u8::is_ascii_hexdigit);
            if !hex(bytes.get(i + 1)) || !hex(bytes.get(i + 2)) {
                return Err(format!("{v:?} has a '%' not followed by two hex digits"));
            }
            i += 3;
            continue;
        }
        if !(c.is_ascii_alphanumeric() || b"-/._~!$&'()*+,;=:@".contains(&c)) {
            return Err(format!(
                "{v:?} has a character a path cannot hold unescaped ({:?}); percent-encode it",
                v[i..].chars().next().unwrap_or_default()
            ));
        }
        i += 1;
    }
    Ok(())
}

/// A precise hostname (RFC 1123, lower case, no wildcard, 1-253).
fn check_hostname(h: &str) -> Result<(), String> {
    check_dns(h, 253, true)
        .map_err(|_| format!("{h:?} is not a hostname (lower-case RFC 1123, 1-253 characters)"))
}

fn check_group(g: &str) -> Result<(), String> {
    if g.is_empty() {
        return Ok(());
    }
    check_dns(g, 253, true)
        .map_err(|_| format!("{g:?} is not an API group (empty for the core group, or a DNS name)"))
}

fn check_kind(k: &str) -> Result<(), String> {
    let ok = k.len() <= 63
        && k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !k.ends_with('-');
    ok.then_some(()).ok_or_else(|| {
        format!("{k:?} is not a kind (a letter, then letters, digits or '-', at most 63)")
    })
}

fn check_object_name(n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > 253 {
        return Err("must be 1-253 characters".into());
    }
    Ok(())
}

fn port(n: i64) -> Result<u16, String> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{n} is not a port (1-65535)"))
}

/// A backend object reference: a Service of this namespace with a port, or why not.
fn backend_object(
    p: &FieldPath,
    group: Option<&Text>,
    kind: Option<&Text>,
    name: &Text,
    ns: Option<&Text>,
    port_written: Option<i64>,
    namespace: &str,
) -> Result<BackendTarget, Invalid> {
    let group = group.map_or("", |g| g.0.as_str());
    let kind = kind.map_or("Service", |k| k.0.as_str());
    check_group(group).map_err(|m| invalid(p.at(field!["group"]), m))?;
    check_kind(kind).map_err(|m| invalid(p.at(field!["kind"]), m))?;
    check_object_name(&name.0).map_err(|m| invalid(p.at(field!["name"]), m))?;
    let target_ns = match ns {
        Some(Text(n)) => {
            check_dns(n, 63, false).map_err(|m| invalid(p.at(field!["namespace"]), m))?;
            n.clone()
        }
        None => namespace.to_string(),
    };
    let port = port_written
        .map(|n| port(n).map_err(|m| invalid(p.at(field!["port"]), m)))
        .transpose()?;
    if !(group.is_empty() && kind == "Service") {
        return Ok(BackendTarget::Invalid(format!(
            "{kind} (group {group:?}) is not a backend kind the waypoint sends to; only Services are"
        )));
    }
    let Some(port) = port else {
        return Err(invalid(
            p.at(field!["port"]),
            "a Service backend must have a port",
        ));
    };
    if target_ns != namespace {
        return Ok(BackendTarget::Invalid(format!(
            "Service {target_ns}/{} is in another namespace, and ReferenceGrants (which would permit it) are not read",
            name.0
        )));
    }
    Ok(BackendTarget::Service(ServiceBackend {
        service: ServiceKey::new(target_ns, name.0.clone()),
        port,
    }))
}

fn backends(
    p: &FieldPath,
    list: Vec<BackendRefSpec>,
    namespace: &str,
    kind: RouteKind,
    unsupported: &mut Option<String>,
    notes: &mut Vec<String>,
) -> Result<Vec<Backend>, Invalid> {
    let mut out = Vec::with_capacity(list.len());
    for (k, b) in list.into_iter().enumerate() {
        let bp = p.at(field!["backendRefs", k]);
        let target = backend_object(
            &bp,
            b.group.as_ref(),
            b.kind.as_ref(),
            &b.name,
            b.namespace.as_ref(),
            b.port,
            namespace,
        )?;
        let weight = match b.weight {
            None => 1,
            Some(w) if (0..=MAX_WEIGHT).contains(&w) => w as u32,
            Some(w) => {
                return Err(invalid(
                    bp.at(field!["weight"]),
                    format!("{w} is not a weight (0 to {MAX_WEIGHT})"),
                ))
            }
        };
        let fp = bp.at(field!["filters"]);
        let filters = filters(
            &fp,
            b.filters.unwrap_or_default(),
            namespace,
            kind,
            unsupported,
            notes,
        )?;
        if let Some(f) = filters
            .iter()
            .find(|f| !matches!(f, Filter::RequestHeaders(_) | Filter::ResponseHeaders(_)))
        {
            let what = match f {
                Filter::Redirect(_) => "RequestRedirect",
                Filter::Rewrite(_) => "URLRewrite",
                _ => "RequestMirror",
            };
            unsupported.get_or_insert_with(|| {
                format!("{fp}: a {what} filter on a backendRef is not supported (only header modifiers are)")
            });
        }
        out.push(Backend {
            target,
            weight,
            filters,
        });
    }
    Ok(out)
}

/// A rule's (or backendRef's) filters, with the CRD's checks between them.
fn filters(
    p: &FieldPath,
    list: Vec<FilterSpec>,
    namespace: &str,
    kind: RouteKind,
    unsupported: &mut Option<String>,
    notes: &mut Vec<String>,
) -> Result<Vec<Filter>, Invalid> {
    if list.len() > MAX_FILTERS {
        return Err(invalid(p.clone(), format!("at most {MAX_FILTERS} filters")));
    }
    let allowed: &[&str] = match kind {
        RouteKind::Http => &[
            "RequestHeaderModifier",
            "ResponseHeaderModifier",
            "RequestMirror",
            "RequestRedirect",
            "URLRewrite",
            "ExtensionRef",
            "CORS",
            "ExternalAuth",
        ],
        RouteKind::Grpc => &[
            "RequestHeaderModifier",
            "ResponseHeaderModifier",
            "RequestMirror",
            "ExtensionRef",
        ],
    };
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for (k, f) in list.into_iter().enumerate() {
        let fp = p.at(field![k]);
        let ty = f.kind.0.as_str();
        let Some(ty) = allowed.iter().find(|a| **a == ty).copied() else {
            return Err(invalid(
                fp.at(field!["type"]),
                format!(
                    "unknown {kind} filter type {ty:?}; one of {}",
                    allowed.join(", ")
                ),
            ));
        };
        // Exactly the field of the type is set.
        let set = [
            (
                "RequestHeaderModifier",
                "requestHeaderModifier",
                f.request_header_modifier.is_some(),
            ),
            (
                "ResponseHeaderModifier",
                "responseHeaderModifier",
                f.response_header_modifier.is_some(),
            ),
            ("RequestMirror", "requestMirror", f.request_mirror.is_some()),
            (
                "RequestRedirect",
                "requestRedirect",
                f.request_redirect.is_some(),
            ),
            ("URLRewrite", "urlRewrite", f.url_rewrite.is_some()),
            ("CORS", "cors", f.cors.is_some()),
            ("ExternalAuth", "externalAuth", f.external_auth.is_some()),
            ("ExtensionRef", "extensionRef", f.extension_ref.is_some()),
        ];
        for (t, name, present) in set {
            if t == ty && !present {
                return Err(invalid(
                    fp.clone(),
                    format!("{name} must be set for a {ty} filter"),
                ));
            }
            if t != ty && present {
                return Err(invalid(
                    fp.at(field![name]),
                    format!("must not be set for a {ty} filter"),
                ));
            }
        }
        if ty != "RequestMirror" && ty != "ExtensionRef" && seen.contains(&ty) {
            return Err(invalid(fp, format!("a {ty} filter cannot be repeated")));
        }
        seen.push(ty);
        if seen.contains(&"RequestRedirect") && seen.contains(&"URLRewrite") {
            return Err(invalid(
                fp,
                "RequestRedirect and URLRewrite filters cannot be used together",
            ));
        }
        let filter = match ty {
            "RequestHeaderModifier" => Filter::RequestHeaders(header_filter(
                &fp.at(field!["requestHeaderModifier"]),
                f.request_header_modifier.unwrap_or_default(),
            )?),
            "ResponseHeaderModifier" => Filter::ResponseHeaders(header_filter(
                &fp.at(field!["responseHeaderModifier"]),
                f.response_header_modifier.unwrap_or_default(),
            )?),
            "RequestRedirect" => {
                let rp = fp.at(field!["requestRedirect"]);
                let Some(r) = f.request_redirect else {
                    continue;
                };
                let scheme = match r.scheme.map(|s| s.0) {
                    None => None,
                    Some(s) if s == "http" || s == "https" => Some(s),
                    Some(s) => {
                        return Err(invalid(
                            rp.at(field!["scheme"]),
                            format!("unknown scheme {s:?}; http or https"),
                        ))
                    }
                };
                let hostname = r
                    .hostname
                    .map(|h| {
                        check_hostname(&h.0)
                            .map(|_| h.0)
                            .map_err(|m| invalid(rp.at(field!["hostname"]), m))
                    })
                    .transpose()?;
                let path = r
                    .path
                    .map(|m| path_modifier(&rp.at(field!["path"]), m))
                    .transpose()?;
                let port = r
                    .port
                    .map(|n| port(n).map_err(|m| invalid(rp.at(field!["port"]), m)))
                    .transpose()?;
                let status = match r.status_code {
                    None => 302,
                    Some(c) if REDIRECT_CODES.contains(&c) => c as u16,
                    Some(c) => {
                        return Err(invalid(
                            rp.at(field!["statusCode"]),
                            format!("{c} is not a redirect status; one of 301, 302, 303, 307, 308"),
                        ))
                    }
                };
                Filter::Redirect(Redirect {
                    scheme,
                    hostname,
                    path,
                    port,
                    status,
                })
            }
            "URLRewrite" => {
                let rp = fp.at(field!["urlRewrite"]);
                let Some(r) = f.url_rewrite else { continue };
                let hostname = r
                    .hostname
                    .map(|h| {
                        check_hostname(&h.0)
                            .map(|_| h.0)
                            .map_err(|m| invalid(rp.at(field!["hostname"]), m))
                    })
                    .transpose()?;
                let path = r
                    .path
                    .map(|m| path_modifier(&rp.at(field!["path"]), m))
                    .transpose()?;
                Filter::Rewrite(Rewrite { hostname, path })
            }
            "RequestMirror" => {
                let mp = fp.at(field!["requestMirror"]);
                let Some(m) = f.request_mirror else { continue };
                let (numerator, denominator) = match (m.percent, m.fraction) {
                    (Some(_), Some(_)) => {
                        return Err(invalid(
                            mp.at(field!["fraction"]),
                            "set either percent or fraction, not both",
                        ))
                    }
                    (Some(pc), None) if (0..=100).contains(&pc) => (pc as u32, 100),
                    (Some(pc), None) => {
                        return Err(invalid(
                            mp.at(field!["percent"]),
                            format!("{pc} is not a percentage (0 to 100)"),
                        ))
                    }
                    (None, Some(fr)) => {
                        let den = fr.denominator.unwrap_or(100);
                        let ok = |n: i64| u32::try_from(n).ok();
                        match (ok(fr.numerator), ok(den)) {
                            (Some(n), Some(d)) if d > 0 && n <= d => (n, d),
                            _ => {
                                return Err(invalid(
                                    mp.at(field!["fraction"]),
                                    "numerator must be 0 or more and at most the denominator, which is more than 0",
                                ))
                            }
                        }
                    }
                    (None, None) => (1, 1),
                };
                let bp = mp.at(field!["backendRef"]);
                let b: &BackendObjectSpec = &m.backend_ref;
                match backend_object(
                    &bp,
                    b.group.as_ref(),
                    b.kind.as_ref(),
                    &b.name,
                    b.namespace.as_ref(),
                    b.port,
                    namespace,
                )? {
                    BackendTarget::Service(backend) => Filter::Mirror(Mirror {
                        backend,
                        numerator,
                        denominator,
                    }),
                    BackendTarget::Invalid(why) => {
                        // The specification: a mirror to an invalid backend is dropped.
                        notes.push(format!("{bp}: mirror dropped: {why}"));
                        continue;
                    }
                }
            }
            other => {
                unsupported.get_or_insert_with(|| {
                    format!("{fp}: {other} filters are not supported by this waypoint")
                });
                continue;
            }
        };
        out.push(filter);
    }
    Ok(out)
}

fn path_modifier(p: &FieldPath, m: PathModifierSpec) -> Result<PathModifier, Invalid> {
    let check = |v: &Text, f: &str| -> Result<String, Invalid> {
        if v.0.chars().count() > MAX_PATH {
            return Err(invalid(
                p.at(field![f]),
                format!("longer than {MAX_PATH} characters"),
            ));
        }
        Ok(v.0.clone())
    };
    match (
        m.kind.0.as_str(),
        &m.replace_full_path,
        &m.replace_prefix_match,
    ) {
        ("ReplaceFullPath", Some(v), None) => Ok(PathModifier::Full(check(v, "replaceFullPath")?)),
        ("ReplacePrefixMatch", None, Some(v)) => {
            Ok(PathModifier::Prefix(check(v, "replacePrefixMatch")?))
        }
        ("ReplaceFullPath", _, Some(_)) => Err(invalid(
            p.at(field!["replacePrefixMatch"]),
            "must not be set when type is ReplaceFullPath",
        )),
        ("ReplacePrefixMatch", Some(_), _) => Err(invalid(
            p.at(field!["replaceFullPath"]),
            "must not be set when type is ReplacePrefixMatch",
        )),
        ("ReplaceFullPath", None, _) => Err(invalid(
            p.clone(),
            "replaceFullPath must be set when type is ReplaceFullPath",
        )),
        ("ReplacePrefixMatch", _, None) => Err(invalid(
            p.clone(),
            "replacePrefixMatch must be set when type is ReplacePrefixMatch",
        )),
        (other, _, _) => Err(invalid(
            p.at(field!["type"]),
            format!("unknown path modifier type {other:?}; ReplaceFullPath or ReplacePrefixMatch"),
        )),
    }
}

/// A header modifier: at most 16 of each list, and each header name in one action only.
fn header_filter(p: &FieldPath, f: HeaderFilterSpec) -> Result<HeaderModifier, Invalid> {
    let mut names: Vec<HeaderName> = Vec::new();
    let mut claim = |at: FieldPath, raw: &str| -> Result<HeaderName, Invalid> {
        let name = header_name(raw).map_err(|m| invalid(at.clone(), m))?;
        if names.contains(&name) {
            return Err(invalid(
                at,
                format!(
                    "header {raw:?} is named twice; a header modifier takes one action per header"
                ),
            ));
        }
        names.push(name.clone());
        Ok(name)
    };
    let mut out = HeaderModifier::default();
    for (list, field_name, into) in [(f.set, "set", &mut out.set), (f.add, "add", &mut out.add)] {
        let list = list.unwrap_or_default();
        if list.len() > MAX_HEADER_CHANGES {
            return Err(invalid(
                p.at(field![field_name]),
                format!("at most {MAX_HEADER_CHANGES} headers"),
            ));
        }
        for (k, h) in list.into_iter().enumerate() {
            let hp = p.at(field![field_name, k]);
            let name = claim(hp.at(field!["name"]), &h.name.0)?;
            header_value(&h.value.0).map_err(|m| invalid(hp.at(field!["value"]), m))?;
            into.push((name, h.value.0));
        }
    }
    let remove = f.remove.unwrap_or_default();
    if remove.len() > MAX_HEADER_CHANGES {
        return Err(invalid(
            p.at(field!["remove"]),
            format!("at most {MAX_HEADER_CHANGES} headers"),
        ));
    }
    for (k, h) in remove.into_iter().enumerate() {
        out.remove.push(claim(p.at(field!["remove", k]), &h.0)?);
    }
    Ok(out)
}
