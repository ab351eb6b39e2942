//! An AuthorizationPolicy, as read ([`crate::schema`]), checked as Istio checks it and
//! translated into the waypoint's model ([`WaypointPolicy`]).
//!
//! Each Istio rule becomes one [`Rule`] of up to three clauses, in this order: `from` (one
//! match object per source), `to` (one per operation), `when` (one match object holding
//! every condition); a section left out adds no clause. Sans-IO.

use ambit_state::{
    Authorization, Clause, L7Attributes, PolicyAction, PolicyScope, RbacMatch, Rule,
    ServiceAccountMatch,
};

use crate::locate::{field, FieldPath};
use crate::model::{PolicyTarget, SkipReason, WaypointAction, WaypointPolicy};
use crate::schema::{Metadata, Object, Operation, RuleSpec, Source, Spec, TargetRef};
use crate::values::{Action, ServiceAccount, Text};
use crate::ParseOptions;

/// A refusal found after parsing: the field at fault and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub path: FieldPath,
    pub message: String,
}

fn invalid(path: FieldPath, message: impl Into<String>) -> Invalid {
    Invalid {
        path,
        message: message.into(),
    }
}

/// What a policy came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Policy(WaypointPolicy),
    Skipped(SkipReason),
}

/// A policy's namespace (defaulted) and name, and what it came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Translation {
    pub namespace: String,
    pub name: String,
    pub outcome: Outcome,
}

/// The annotation that makes a policy dry-run only.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// Istio's limits (its CRD schema): rules per policy, sources per rule, service accounts
/// per list.
const MAX_RULES: usize = 512;
const MAX_FROM: usize = 512;
const MAX_SERVICE_ACCOUNTS: usize = 16;

const GATEWAY_API: &str = "gateway.networking.k8s.io";
const ISTIO_NETWORKING: &str = "networking.istio.io";

/// Checks and translates a policy. A policy every check passes that has no targets is not
/// for a waypoint (skipped); one with targets is a [`WaypointPolicy`].
pub(crate) fn translate(obj: Object, options: &ParseOptions) -> Result<Translation, Invalid> {
    let (namespace, name) = namespace_and_name(&obj.metadata, options)?;
    let dry_run = match obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.0.get(DRY_RUN_ANNOTATION))
        .map(String::as_str)
    {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(invalid(
                field!["metadata", "annotations", DRY_RUN_ANNOTATION],
                format!("{other:?} is neither \"true\" nor \"false\""),
            ))
        }
    };
    let spec = obj.spec.unwrap_or_default();
    let targets = targets(
        spec.selector.is_some(),
        spec.target_ref.as_ref(),
        spec.target_refs.as_deref(),
        &namespace,
        options,
    )?;
    let action = action(&spec)?;
    let custom = matches!(action, WaypointAction::Custom { .. });
    let rules = spec
        .rules
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, r)| rule(field!["spec", "rules", i], r, &namespace, custom))
        .collect::<Result<Vec<Rule>, Invalid>>()?;

    let outcome = if targets.is_empty() {
        Outcome::Skipped(match spec.selector {
            Some(_) => SkipReason::Selector,
            None => SkipReason::NamespaceWide,
        })
    } else {
        let mut authorization = Authorization {
            name: name.clone(),
            namespace: namespace.clone(),
            scope: PolicyScope::WorkloadSelector,
            action: match action {
                WaypointAction::Allow => PolicyAction::Allow,
                _ => PolicyAction::Deny,
            },
            rules,
            dry_run,
        };
        authorization
            .normalize()
            .map_err(|m| invalid(field!["metadata"], m))?;
        Outcome::Policy(WaypointPolicy {
            authorization,
            action,
            targets,
        })
    };
    Ok(Translation {
        namespace,
        name,
        outcome,
    })
}

/// An Istio object's `metadata.namespace` (defaulted) and `metadata.name`, checked.
pub(crate) fn namespace_and_name(
    metadata: &Metadata,
    options: &ParseOptions,
) -> Result<(String, String), Invalid> {
    let name = metadata.name.0.clone();
    check_dns(&name, 253, true).map_err(|m| invalid(field!["metadata", "name"], m))?;
    let namespace = match &metadata.namespace {
        Some(Text(ns)) if !ns.is_empty() => {
            check_dns(ns, 63, false).map_err(|m| invalid(field!["metadata", "namespace"], m))?;
            ns.clone()
        }
        _ => options.default_namespace.clone(),
    };
    Ok((namespace, name))
}

/// A Kubernetes name: a DNS-1123 subdomain (`dots`) or label, at most `max` long.
pub(crate) fn check_dns(s: &str, max: usize, dots: bool) -> Result<(), String> {
    let allowed =
        |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dots && c == '.');
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if s.is_empty()
        || s.len() > max
        || !s.chars().all(allowed)
        || !edge(s.chars().next())
        || !edge(s.chars().last())
    {
        let what = if dots {
            "lower-case letters, digits, '-' and '.'"
        } else {
            "lower-case letters, digits and '-'"
        };
        return Err(format!(
            "{s:?} is not a Kubernetes name: 1-{max} {what}, starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// The targets of `targetRef` or `targetRefs` of a policy's (or a RequestAuthentication's)
/// spec, checked; `selector` is true when the spec has a `selector`.
pub(crate) fn targets(
    selector: bool,
    target_ref: Option<&TargetRef>,
    target_refs: Option<&[TargetRef]>,
    namespace: &str,
    options: &ParseOptions,
) -> Result<Vec<PolicyTarget>, Invalid> {
    let refs: Vec<(FieldPath, &TargetRef)> = match (target_ref, target_refs) {
        (Some(_), Some(v)) if !v.is_empty() => {
            return Err(invalid(
                field!["spec", "targetRef"],
                "set either targetRef or targetRefs, not both",
            ))
        }
        (Some(r), _) => vec![(field!["spec", "targetRef"], r)],
        (None, v) => v
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, r)| (field!["spec", "targetRefs", i], r))
            .collect(),
    };
    if selector && !refs.is_empty() {
        return Err(invalid(
            field!["spec", "selector"],
            "set either selector (a workload's policy) or targetRefs (a waypoint's), not both",
        ));
    }
    refs.into_iter()
        .map(|(p, r)| target(p, r, namespace, options))
        .collect()
}

fn target(
    p: FieldPath,
    r: &TargetRef,
    namespace: &str,
    options: &ParseOptions,
) -> Result<PolicyTarget, Invalid> {
    let name = r.name.0.clone();
    if name.is_empty() {
        return Err(invalid(p.at(field!["name"]), "must not be empty"));
    }
    if r.namespace.as_ref().is_some_and(|ns| !ns.0.is_empty()) {
        return Err(invalid(
            p.at(field!["namespace"]),
            "must not be set: a policy attaches only to targets in its own namespace (Istio refuses cross-namespace targetRefs)",
        ));
    }
    let group = r.group.as_ref().map_or("", |g| g.0.as_str());
    let kind = r.kind.0.as_str();
    let ns = namespace.to_string();
    let expected_group = match kind {
        "Service" => "",
        "ServiceEntry" => ISTIO_NETWORKING,
        "Gateway" | "GatewayClass" => GATEWAY_API,
        _ => {
            return Err(invalid(
                p.at(field!["kind"]),
                format!("a waypoint's policy cannot target a {kind:?}; the kinds are Gateway and GatewayClass ({GATEWAY_API}), Service (core group, \"\") and ServiceEntry ({ISTIO_NETWORKING})"),
            ))
        }
    };
    let group_ok = group == expected_group || (kind == "Service" && group == "core");
    if !group_ok {
        let at = if r.group.is_some() { "group" } else { "kind" };
        return Err(invalid(
            p.at(field![at]),
            format!("{kind} is in group {expected_group:?}, not {group:?}"),
        ));
    }
    // The name of an object of that kind: a Service's is a DNS label, the others' DNS
    // subdomains, as Kubernetes admits them (a longer one could never name a target).
    let checked = match kind {
        "Service" => check_dns(&name, 63, false),
        _ => check_dns(&name, 253, true),
    };
    checked.map_err(|m| invalid(p.at(field!["name"]), m))?;
    Ok(match kind {
        "Service" => PolicyTarget::Service { namespace: ns, name },
        "ServiceEntry" => PolicyTarget::ServiceEntry { namespace: ns, name },
        "Gateway" => PolicyTarget::Gateway { namespace: ns, name },
        _ if namespace != options.root_namespace => {
            return Err(invalid(
                p.at(field!["kind"]),
                format!(
                    "a GatewayClass target is honoured only in the root namespace ({:?}), and this policy is in {namespace:?}",
                    options.root_namespace
                ),
            ))
        }
        _ => PolicyTarget::GatewayClass { name },
    })
}

/// The action, with the checks Istio makes of it.
fn action(spec: &Spec) -> Result<WaypointAction, Invalid> {
    let action = spec.action.as_ref().map_or(Action::Allow, |a| a.0);
    let no_rules = spec.rules.as_ref().is_none_or(Vec::is_empty);
    let rules_needed = |name: &str| {
        invalid(
            field!["spec", "action"],
            format!("a {name} policy without rules never matches; add an empty rule ({{}}) to match every request"),
        )
    };
    if let Some(rules) = &spec.rules {
        if rules.len() > MAX_RULES {
            return Err(invalid(
                field!["spec", "rules"],
                format!("at most {MAX_RULES} rules"),
            ));
        }
    }
    if action != Action::Custom && spec.provider.is_some() {
        return Err(invalid(
            field!["spec", "provider"],
            "only a CUSTOM policy names a provider",
        ));
    }
    Ok(match action {
        Action::Allow => WaypointAction::Allow,
        Action::Audit => WaypointAction::Audit,
        Action::Deny if no_rules => return Err(rules_needed("DENY")),
        Action::Deny => WaypointAction::Deny,
        Action::Custom if no_rules => return Err(rules_needed("CUSTOM")),
        Action::Custom => match spec.provider.as_ref().map(|p| p.name.as_ref()) {
            Some(Some(Text(name))) if !name.is_empty() => WaypointAction::Custom {
                provider: name.clone(),
            },
            written => {
                let at = match written {
                    None => field!["spec", "action"],
                    Some(_) => field!["spec", "provider", "name"],
                };
                return Err(invalid(
                    at,
                    "a CUSTOM policy names its provider (spec.provider.name: an extensionProviders entry of MeshConfig)",
                ));
            }
        },
    })
}

/// One rule: its `from`, `to` and `when` clauses.
fn rule(p: FieldPath, r: RuleSpec, namespace: &str, custom: bool) -> Result<Rule, Invalid> {
    let mut clauses: Vec<Clause> = Vec::new();
    if let Some(from) = r.from {
        let fp = p.at(field!["from"]);
        if from.is_empty() {
            return Err(invalid(
                fp,
                "must not be empty; leave it out to match any source",
            ));
        }
        if from.len() > MAX_FROM {
            return Err(invalid(fp, format!("at most {MAX_FROM} sources")));
        }
        let clause = from
            .into_iter()
            .enumerate()
            .map(|(j, f)| match f.source {
                Some(s) => source(fp.at(field![j, "source"]), s, namespace, custom),
                None => Err(invalid(fp.at(field![j]), "source: must be set")),
            })
            .collect::<Result<Clause, Invalid>>()?;
        clauses.push(clause);
    }
    if let Some(to) = r.to {
        let tp = p.at(field!["to"]);
        if to.is_empty() {
            return Err(invalid(
                tp,
                "must not be empty; leave it out to match any operation",
            ));
        }
        let clause = to
            .into_iter()
            .enumerate()
            .map(|(j, t)| match t.operation {
                Some(o) => operation(tp.at(field![j, "operation"]), o),
                None => Err(invalid(tp.at(field![j]), "operation: must be set")),
            })
            .collect::<Result<Clause, Invalid>>()?;
        clauses.push(clause);
    }
    let when = r.when.unwrap_or_default();
    if custom {
        for (j, c) in when.iter().enumerate() {
            let key = c.key();
            let identity = matches!(
                key.as_str(),
                "source.namespace" | "source.serviceAccount" | "source.principal"
            ) || key.starts_with("request.auth.");
            if identity {
                return Err(invalid(
                    p.at(field!["when", j, "key"]),
                    format!("{key} is not supported with action CUSTOM (Istio refuses it)"),
                ));
            }
        }
    }
    if !when.is_empty() {
        clauses.push(vec![with_l7(
            RbacMatch::default(),
            L7Attributes {
                when: Some(when),
                ..L7Attributes::default()
            },
        )]);
    }
    Ok(clauses)
}

/// `Option<Vec<leaf>>` to the values; a list left out or empty sets nothing (as in Istio).
fn list<L, T>(v: Option<Vec<L>>, f: impl Fn(L) -> T) -> Vec<T> {
    v.into_iter().flatten().map(f).collect()
}

/// An L7 attribute: `None` when nothing is written.
fn l7_list<L, T>(v: Option<Vec<L>>, f: impl Fn(L) -> T) -> Option<Vec<T>> {
    Some(list(v, f)).filter(|l| !l.is_empty())
}

fn with_l7(mut m: RbacMatch, l7: L7Attributes) -> RbacMatch {
    m.l7 = (!l7.is_empty()).then(|| Box::new(l7));
    m
}

/// True if a list is written with at least one value.
fn set<T>(v: &Option<Vec<T>>) -> bool {
    v.as_ref().is_some_and(|l| !l.is_empty())
}

fn source(p: FieldPath, s: Source, namespace: &str, custom: bool) -> Result<RbacMatch, Invalid> {
    let identity = [
        ("principals", set(&s.principals)),
        ("notPrincipals", set(&s.not_principals)),
        ("namespaces", set(&s.namespaces)),
        ("notNamespaces", set(&s.not_namespaces)),
    ];
    let accounts = [
        ("serviceAccounts", set(&s.service_accounts)),
        ("notServiceAccounts", set(&s.not_service_accounts)),
    ];
    let requests = [
        ("requestPrincipals", set(&s.request_principals)),
        ("notRequestPrincipals", set(&s.not_request_principals)),
    ];
    if custom {
        if let Some((field, _)) = identity
            .iter()
            .chain(&accounts)
            .chain(&requests)
            .find(|(_, on)| *on)
        {
            return Err(invalid(
                p.at(field![*field]),
                "is not supported with action CUSTOM (Istio refuses it)",
            ));
        }
    }
    if let (Some((field, _)), true) = (
        accounts.iter().find(|(_, on)| *on),
        identity.iter().any(|(_, on)| *on),
    ) {
        return Err(invalid(
            p.at(field![*field]),
            "cannot be set with principals or namespaces in the same source (Istio refuses it)",
        ));
    }
    for (field, v) in [
        ("serviceAccounts", &s.service_accounts),
        ("notServiceAccounts", &s.not_service_accounts),
    ] {
        if v.as_ref().is_some_and(|l| l.len() > MAX_SERVICE_ACCOUNTS) {
            return Err(invalid(
                p.at(field![field]),
                format!("at most {MAX_SERVICE_ACCOUNTS} service accounts"),
            ));
        }
    }
    let account = |ServiceAccount(r)| ServiceAccountMatch {
        namespace: r.namespace.unwrap_or_else(|| namespace.to_string()),
        service_account: r.name,
    };
    let m = with_l7(
        RbacMatch {
            namespaces: list(s.namespaces, |v| v.0),
            not_namespaces: list(s.not_namespaces, |v| v.0),
            service_accounts: list(s.service_accounts, account),
            not_service_accounts: list(s.not_service_accounts, account),
            principals: list(s.principals, |v| v.0),
            not_principals: list(s.not_principals, |v| v.0),
            source_ips: list(s.ip_blocks, |v| v.0),
            not_source_ips: list(s.not_ip_blocks, |v| v.0),
            ..RbacMatch::default()
        },
        L7Attributes {
            request_principals: l7_list(s.request_principals, |v| v.0),
            not_request_principals: l7_list(s.not_request_principals, |v| v.0),
            remote_ips: l7_list(s.remote_ip_blocks, |v| v.0),
            not_remote_ips: l7_list(s.not_remote_ip_blocks, |v| v.0),
            ..L7Attributes::default()
        },
    );
    if m.is_empty() {
        return Err(invalid(
            p,
            "sets no field; a source matches on at least one",
        ));
    }
    Ok(m)
}

fn operation(p: FieldPath, o: Operation) -> Result<RbacMatch, Invalid> {
    let m = with_l7(
        RbacMatch {
            destination_ports: list(o.ports, |v| v.0),
            not_destination_ports: list(o.not_ports, |v| v.0),
            ..RbacMatch::default()
        },
        L7Attributes {
            hosts: l7_list(o.hosts, |v| v.0),
            not_hosts: l7_list(o.not_hosts, |v| v.0),
            methods: l7_list(o.methods, |v| v.0),
            not_methods: l7_list(o.not_methods, |v| v.0),
            paths: l7_list(o.paths, |v| v.0),
            not_paths: l7_list(o.not_paths, |v| v.0),
            ..L7Attributes::default()
        },
    );
    if m.is_empty() {
        return Err(invalid(
            p,
            "sets no field; an operation matches on at least one",
        ));
    }
    Ok(m)
}
