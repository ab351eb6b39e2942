//! An HTTPRoute or GRPCRoute, as read ([`crate::route_schema`]), checked as the Gateway API
//! CRDs check it (required fields, value patterns, list limits, and the rules between
//! fields their validation expressions state) and translated into the routes model
//! ([`ambit_gateway_routes::Route`]): defaults filled, names lower-cased, expressions compiled.
//!
//! `parentRefs` of kind Service or ServiceEntry in the route's own namespace attach a
//! route to that frontend of a waypoint, and a Gateway of its namespace to every frontend
//! of that waypoint without routes of its own; other parents (a Service of another
//! namespace, another kind) are noted on the route, and a route with none is skipped. `hostnames` are
//! checked but do not narrow a mesh route: the frontend dialled is what selects it.
//! `sessionPersistence` is read and not honoured (noted). Sans-IO.
//!
//! One module per part of a route: its head (`head`: metadata, parentRefs, hostnames), its
//! rules (`rule`), their matches (`matches`), backends (`backends`) and filters
//! (`filters`); `object_ref` reads what a backend or a mirror refers to, `fields` checks the
//! values they all share.

mod backends;
mod fields;
mod filters;
mod head;
mod matches;
mod object_ref;
mod rule;

use std::collections::HashSet;

use ambit_gateway_routes::{Route, RouteKind, RouteMatch, Rule, Timeouts};

use crate::locate::{field, FieldPath};
use crate::model::SkipReason;
use crate::route_schema::{GrpcRuleSpec, HttpRuleSpec, RouteObject};
use crate::translate::{check_dns, Invalid};
use crate::values::Text;
use crate::ParseOptions;

pub(crate) use fields::header_name;
use head::{head, Head};

/// The Gateway API group.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
pub const HTTP_ROUTE_VERSIONS: &[&str] = &["v1", "v1beta1"];
pub const GRPC_ROUTE_VERSIONS: &[&str] = &["v1"];

// The CRDs' limits on a route's rules.
const MAX_RULES: usize = 16;
const MAX_MATCHES_PER_ROUTE: usize = 128;

pub(super) fn invalid(path: FieldPath, message: impl Into<String>) -> Invalid {
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
        rule::http_rule,
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
        rule::grpc_rule,
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
