//! The checks a file's policy passes, made on a policy decoded from the wire: it is
//! written back as the AuthorizationPolicy that would say it, read by `ambit_manifests`
//! exactly as a file is, and must read back the same. So a body is accepted only if some
//! file says exactly it, and every check of the manifests reader (Kubernetes names,
//! targets and the root namespace, actions and providers, what CUSTOM may not use, empty
//! sources and operations, service accounts, every value) holds for xDS too, with no
//! second copy of them to drift.
//!
//! A rule is written back clause by clause: a clause is a rule's `from` (its match
//! objects set only source fields), `to` (operation fields) or `when` (one match object
//! with only conditions), in that order, each at most once, as the manifests reader makes
//! them. What no AuthorizationPolicy can say (a destination IP or header match outside a
//! condition, clauses out of that order, a match object mixing sections) is refused with
//! its place in `rulesJson`; the rest is refused with the AuthorizationPolicy's field
//! (`spec.rules[0].from[1].source.principals[0]`) and the reader's own message.

use ambit_manifests::{ParseOptions, PolicyTarget, WaypointAction, WaypointPolicy};
use ambit_state::{Clause, RbacMatch, Rule};
use serde_json::{json, Map, Value};

use crate::convert::ConvertError;

/// Which part of an Istio rule a clause is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Section {
    From,
    To,
    When,
}

impl Section {
    fn name(self) -> &'static str {
        match self {
            Section::From => "from",
            Section::To => "to",
            Section::When => "when",
        }
    }
}

/// Checks that `policy` is what a file says: written as its AuthorizationPolicy, read
/// back by the manifests reader with `root_namespace`, it must come out the same.
pub fn check(policy: &WaypointPolicy, root_namespace: &str) -> Result<(), ConvertError> {
    let a = &policy.authorization;
    let text = render(policy)?.to_string();
    let options = ParseOptions {
        root_namespace: root_namespace.to_string(),
        default_namespace: a.namespace.clone(),
    };
    let mut parsed = ambit_manifests::parse_documents("the policy's wire form", &text, &options);
    if let Some(e) = parsed.errors.first() {
        return Err(ConvertError::new(e.field.clone(), &e.message));
    }
    if let Some(s) = parsed.skipped.first() {
        return Err(ConvertError::new("targets", s.value.reason));
    }
    let read = match parsed.policies.len() {
        1 => parsed.policies.remove(0).value,
        n => {
            return Err(ConvertError::new(
                "",
                format!("its AuthorizationPolicy form reads as {n} policies, not one"),
            ))
        }
    };
    match first_difference(&read, policy) {
        None => Ok(()),
        Some(field) => Err(ConvertError::new(
            field,
            "reads back otherwise from the AuthorizationPolicy that would say it, so no file says this",
        )),
    }
}

/// The AuthorizationPolicy (as JSON, which YAML reads) whose reading is `policy`, for a
/// policy whose rules an AuthorizationPolicy can say.
fn render(policy: &WaypointPolicy) -> Result<Value, ConvertError> {
    let a = &policy.authorization;
    let mut metadata = json!({ "name": a.name, "namespace": a.namespace });
    if a.dry_run {
        metadata["annotations"] = json!({ ambit_manifests::DRY_RUN_ANNOTATION: "true" });
    }
    let mut spec = Map::new();
    let refs: Vec<Value> = policy.targets.iter().map(target_ref).collect();
    spec.insert("targetRefs".into(), Value::Array(refs));
    let action = match &policy.action {
        WaypointAction::Allow => "ALLOW",
        WaypointAction::Deny => "DENY",
        WaypointAction::Audit => "AUDIT",
        WaypointAction::Custom { provider } => {
            spec.insert("provider".into(), json!({ "name": provider }));
            "CUSTOM"
        }
    };
    spec.insert("action".into(), action.into());
    if !a.rules.is_empty() {
        let rules = a
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule(i, r))
            .collect::<Result<Vec<_>, _>>()?;
        spec.insert("rules".into(), Value::Array(rules));
    }
    Ok(json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": metadata,
        "spec": spec,
    }))
}

fn target_ref(t: &PolicyTarget) -> Value {
    const GATEWAY_API: &str = "gateway.networking.k8s.io";
    match t {
        PolicyTarget::Gateway { name, .. } => {
            json!({ "group": GATEWAY_API, "kind": "Gateway", "name": name })
        }
        PolicyTarget::GatewayClass { name } => {
            json!({ "group": GATEWAY_API, "kind": "GatewayClass", "name": name })
        }
        PolicyTarget::Service { name, .. } => json!({ "kind": "Service", "name": name }),
        PolicyTarget::ServiceEntry { name, .. } => {
            json!({ "group": "networking.istio.io", "kind": "ServiceEntry", "name": name })
        }
    }
}

/// One rule as an Istio rule: its clauses as `from`, `to` and `when`.
fn rule(i: usize, r: &Rule) -> Result<Value, ConvertError> {
    let mut out = Map::new();
    let mut last: Option<Section> = None;
    for (j, clause) in r.iter().enumerate() {
        let at = format!("rulesJson[{i}][{j}]");
        let section = clause_section(&at, clause)?;
        if let Some(before) = last.filter(|b| *b >= section) {
            return Err(ConvertError::new(
                at,
                format!(
                    "a {} clause after a {} clause; an AuthorizationPolicy rule's clauses are from, to and when, in that order, each at most once",
                    section.name(),
                    before.name()
                ),
            ));
        }
        last = Some(section);
        let value = match section {
            Section::From => Value::Array(
                clause
                    .iter()
                    .map(|m| json!({ "source": source(m) }))
                    .collect(),
            ),
            Section::To => Value::Array(
                clause
                    .iter()
                    .map(|m| json!({ "operation": operation(m) }))
                    .collect(),
            ),
            Section::When => {
                let conditions = clause[0].l7.as_deref().and_then(|l| l.when.as_ref());
                serde_json::to_value(conditions).map_err(|e| ConvertError::new(at, e))?
            }
        };
        out.insert(section.name().into(), value);
    }
    Ok(Value::Object(out))
}

/// The section of a clause: that of its match objects, which must agree. A match object
/// that sets nothing takes the clause's (the reader then refuses it, as it would in a
/// file).
fn clause_section(at: &str, clause: &Clause) -> Result<Section, ConvertError> {
    if clause.is_empty() {
        return Err(ConvertError::new(
            at,
            "an empty clause; an AuthorizationPolicy's from and to lists are never empty (leave a section out to match anything)",
        ));
    }
    let mut found: Option<(usize, Section)> = None;
    for (k, m) in clause.iter().enumerate() {
        let Some(section) = match_section(&format!("{at}[{k}]"), m)? else {
            continue;
        };
        match found {
            Some((first, s)) if s != section => {
                return Err(ConvertError::new(
                    format!("{at}[{k}]"),
                    format!(
                        "{} fields in a clause whose match object {first} sets {} fields; a clause is one section of an AuthorizationPolicy rule",
                        section.name(),
                        s.name()
                    ),
                ))
            }
            Some(_) => {}
            None => found = Some((k, section)),
        }
    }
    let Some((_, section)) = found else {
        return Err(ConvertError::new(
            at,
            "its match objects set no field; a source, an operation or a condition sets at least one",
        ));
    };
    if section == Section::When && clause.len() != 1 {
        return Err(ConvertError::new(
            at,
            "a when clause is one match object holding every condition of the rule",
        ));
    }
    Ok(section)
}

/// The section whose fields a match object sets (`None` for one that sets nothing).
fn match_section(at: &str, m: &RbacMatch) -> Result<Option<Section>, ConvertError> {
    let l7 = m.l7.as_deref();
    let l7_set = |f: fn(&ambit_state::L7Attributes) -> bool| l7.is_some_and(f);
    let unsayable = [
        ("destinationIps", !m.destination_ips.is_empty()),
        ("notDestinationIps", !m.not_destination_ips.is_empty()),
        ("headers", l7_set(|l| l.headers.is_some())),
        ("notHeaders", l7_set(|l| l.not_headers.is_some())),
    ];
    if let Some((field, _)) = unsayable.iter().find(|(_, set)| *set) {
        return Err(ConvertError::new(
            format!("{at}.{field}"),
            "no AuthorizationPolicy field says this (use a when condition: destination.ip, request.headers[<name>])",
        ));
    }
    let source = [
        ("namespaces", !m.namespaces.is_empty()),
        ("notNamespaces", !m.not_namespaces.is_empty()),
        ("serviceAccounts", !m.service_accounts.is_empty()),
        ("notServiceAccounts", !m.not_service_accounts.is_empty()),
        ("principals", !m.principals.is_empty()),
        ("notPrincipals", !m.not_principals.is_empty()),
        ("sourceIps", !m.source_ips.is_empty()),
        ("notSourceIps", !m.not_source_ips.is_empty()),
        (
            "requestPrincipals",
            l7_set(|l| l.request_principals.is_some()),
        ),
        (
            "notRequestPrincipals",
            l7_set(|l| l.not_request_principals.is_some()),
        ),
        ("remoteIps", l7_set(|l| l.remote_ips.is_some())),
        ("notRemoteIps", l7_set(|l| l.not_remote_ips.is_some())),
    ];
    let operation = [
        ("destinationPorts", !m.destination_ports.is_empty()),
        ("notDestinationPorts", !m.not_destination_ports.is_empty()),
        ("hosts", l7_set(|l| l.hosts.is_some())),
        ("notHosts", l7_set(|l| l.not_hosts.is_some())),
        ("methods", l7_set(|l| l.methods.is_some())),
        ("notMethods", l7_set(|l| l.not_methods.is_some())),
        ("paths", l7_set(|l| l.paths.is_some())),
        ("notPaths", l7_set(|l| l.not_paths.is_some())),
    ];
    let when = [("when", l7_set(|l| l.when.is_some()))];
    let sets: Vec<(Section, &str)> = [
        (Section::From, &source[..]),
        (Section::To, &operation[..]),
        (Section::When, &when[..]),
    ]
    .into_iter()
    .filter_map(|(s, fields)| fields.iter().find(|(_, set)| *set).map(|(f, _)| (s, *f)))
    .collect();
    match sets.as_slice() {
        [] => Ok(None),
        [(s, _)] => Ok(Some(*s)),
        [(s1, f1), (s2, f2), ..] => Err(ConvertError::new(
            format!("{at}.{f2}"),
            format!(
                "a {} field beside a {} field ({f1}) in one match object; each belongs to its own clause",
                s2.name(),
                s1.name()
            ),
        )),
    }
}

/// Adds `key: [values]` for a list that is written (`Some`, or non-empty).
fn put(out: &mut Map<String, Value>, key: &str, values: Option<Vec<Value>>) {
    if let Some(v) = values {
        out.insert(key.into(), Value::Array(v));
    }
}

fn listed<T>(v: &[T], f: impl Fn(&T) -> Value) -> Option<Vec<Value>> {
    (!v.is_empty()).then(|| v.iter().map(f).collect())
}

fn written<T>(v: Option<&Vec<T>>, f: impl Fn(&T) -> Value) -> Option<Vec<Value>> {
    v.map(|v| v.iter().map(f).collect())
}

fn source(m: &RbacMatch) -> Value {
    let mut s = Map::new();
    let l7 = m.l7.as_deref();
    let text = |v: &ambit_state::StringMatch| Value::from(v.to_istio());
    let account = |a: &ambit_state::ServiceAccountMatch| {
        Value::from(format!("{}/{}", a.namespace, a.service_account))
    };
    let net = |n: &ipnet::IpNet| Value::from(n.to_string());
    let block = |b: &ambit_state::IpBlock| Value::from(b.as_str());
    put(&mut s, "principals", listed(&m.principals, text));
    put(&mut s, "notPrincipals", listed(&m.not_principals, text));
    put(&mut s, "namespaces", listed(&m.namespaces, text));
    put(&mut s, "notNamespaces", listed(&m.not_namespaces, text));
    put(
        &mut s,
        "serviceAccounts",
        listed(&m.service_accounts, account),
    );
    put(
        &mut s,
        "notServiceAccounts",
        listed(&m.not_service_accounts, account),
    );
    put(&mut s, "ipBlocks", listed(&m.source_ips, net));
    put(&mut s, "notIpBlocks", listed(&m.not_source_ips, net));
    if let Some(l) = l7 {
        put(
            &mut s,
            "requestPrincipals",
            written(l.request_principals.as_ref(), text),
        );
        put(
            &mut s,
            "notRequestPrincipals",
            written(l.not_request_principals.as_ref(), text),
        );
        put(
            &mut s,
            "remoteIpBlocks",
            written(l.remote_ips.as_ref(), block),
        );
        put(
            &mut s,
            "notRemoteIpBlocks",
            written(l.not_remote_ips.as_ref(), block),
        );
    }
    Value::Object(s)
}

fn operation(m: &RbacMatch) -> Value {
    let mut o = Map::new();
    let port = |p: &u16| Value::from(p.to_string());
    let text = |v: &ambit_state::StringMatch| Value::from(v.to_istio());
    let path = |p: &ambit_state::PathMatch| Value::from(p.to_text());
    put(&mut o, "ports", listed(&m.destination_ports, port));
    put(&mut o, "notPorts", listed(&m.not_destination_ports, port));
    if let Some(l) = m.l7.as_deref() {
        put(&mut o, "hosts", written(l.hosts.as_ref(), text));
        put(&mut o, "notHosts", written(l.not_hosts.as_ref(), text));
        put(&mut o, "methods", written(l.methods.as_ref(), text));
        put(&mut o, "notMethods", written(l.not_methods.as_ref(), text));
        put(&mut o, "paths", written(l.paths.as_ref(), path));
        put(&mut o, "notPaths", written(l.not_paths.as_ref(), path));
    }
    Value::Object(o)
}

/// The first field where `read` (the manifests reader's) and `sent` differ, in the wire
/// message's terms.
fn first_difference(read: &WaypointPolicy, sent: &WaypointPolicy) -> Option<String> {
    let (r, s) = (&read.authorization, &sent.authorization);
    if r.name != s.name {
        return Some("name".into());
    }
    if r.namespace != s.namespace {
        return Some("namespace".into());
    }
    if read.action != sent.action || r.action != s.action || r.scope != s.scope {
        return Some("action".into());
    }
    if r.dry_run != s.dry_run {
        return Some("dryRun".into());
    }
    if read.targets != sent.targets {
        let i = read
            .targets
            .iter()
            .zip(&sent.targets)
            .position(|(a, b)| a != b)
            .unwrap_or(read.targets.len().min(sent.targets.len()));
        return Some(format!("targets[{i}]"));
    }
    if r.rules.len() != s.rules.len() {
        return Some("rulesJson".into());
    }
    for (i, (ra, sa)) in r.rules.iter().zip(&s.rules).enumerate() {
        if ra.len() != sa.len() {
            return Some(format!("rulesJson[{i}]"));
        }
        for (j, (ca, cb)) in ra.iter().zip(sa).enumerate() {
            if ca.len() != cb.len() {
                return Some(format!("rulesJson[{i}][{j}]"));
            }
            if let Some(k) = ca.iter().zip(cb).position(|(a, b)| a != b) {
                return Some(format!("rulesJson[{i}][{j}][{k}]"));
            }
        }
    }
    // Every field compared above; anything else is the body as a whole.
    (read != sent).then(String::new)
}
