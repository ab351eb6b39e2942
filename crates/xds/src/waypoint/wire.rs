//! A waypoint policy ([`WaypointPolicy`]) as `ambit.waypoint.v1.AuthorizationPolicy` and
//! back. Encoding is `ambit control`'s; decoding the waypoint's, with every check a file's
//! policy passes: the fields the message carries, the rules read by the state crate's own
//! parsers (its JSON form), then the whole as `ambit_manifests` would read it from a file
//! ([`super::manifest`]). A refusal names the field at fault.

use ambit_manifests::{PolicyTarget, WaypointAction, WaypointPolicy};
use ambit_proto::ambit::waypoint::v1 as wp;
use ambit_state::{Authorization, PolicyAction, PolicyScope, Rule};

use crate::convert::ConvertError;

/// The policy as its wire message. Errs only if the rules cannot be written as JSON,
/// which the state's types never do (kept an error rather than a panic: this runs in the
/// control server).
pub fn to_proto_waypoint_policy(
    p: &WaypointPolicy,
) -> Result<wp::AuthorizationPolicy, ConvertError> {
    let a = &p.authorization;
    let (action, provider) = match &p.action {
        WaypointAction::Allow => (wp::Action::Allow, String::new()),
        WaypointAction::Deny => (wp::Action::Deny, String::new()),
        WaypointAction::Audit => (wp::Action::Audit, String::new()),
        WaypointAction::Custom { provider } => (wp::Action::Custom, provider.clone()),
    };
    let targets = p
        .targets
        .iter()
        .map(|t| {
            let (kind, name) = match t {
                PolicyTarget::Gateway { name, .. } => (wp::target::Kind::Gateway, name),
                PolicyTarget::Service { name, .. } => (wp::target::Kind::Service, name),
                PolicyTarget::ServiceEntry { name, .. } => (wp::target::Kind::ServiceEntry, name),
                PolicyTarget::GatewayClass { name } => (wp::target::Kind::GatewayClass, name),
            };
            wp::Target {
                kind: kind as i32,
                name: name.clone(),
            }
        })
        .collect();
    let rules_json = serde_json::to_vec(&a.rules)
        .map_err(|e| ConvertError::new("rulesJson", format!("cannot be written: {e}")))?;
    Ok(wp::AuthorizationPolicy {
        name: a.name.clone(),
        namespace: a.namespace.clone(),
        action: action as i32,
        provider,
        dry_run: a.dry_run,
        targets,
        rules_json,
    })
}

/// The policy a wire message describes, checked as a file's would be (`root_namespace`:
/// the only namespace whose policies may target a GatewayClass). Field paths are the
/// message's (`targets[1].kind`, `rulesJson: [0][2][0].paths[1]`), or, for what only a
/// file's reading refuses, the AuthorizationPolicy's (`spec.rules[0].from[0].source`).
pub fn waypoint_policy_from_proto(
    p: wp::AuthorizationPolicy,
    root_namespace: &str,
) -> Result<WaypointPolicy, ConvertError> {
    for (field, value) in [("name", &p.name), ("namespace", &p.namespace)] {
        if value.is_empty() {
            return Err(ConvertError::new(field, "must be set"));
        }
    }
    let custom = p.action == wp::Action::Custom as i32;
    if !custom && !p.provider.is_empty() {
        return Err(ConvertError::new(
            "provider",
            "only a CUSTOM policy names a provider",
        ));
    }
    let action = match wp::Action::try_from(p.action) {
        Ok(wp::Action::Allow) => WaypointAction::Allow,
        Ok(wp::Action::Deny) => WaypointAction::Deny,
        Ok(wp::Action::Audit) => WaypointAction::Audit,
        Ok(wp::Action::Custom) if p.provider.is_empty() => {
            return Err(ConvertError::new(
                "provider",
                "a CUSTOM policy names its provider",
            ))
        }
        Ok(wp::Action::Custom) => WaypointAction::Custom {
            provider: p.provider,
        },
        Ok(wp::Action::Unspecified) | Err(_) => {
            return Err(ConvertError::new(
                "action",
                format!(
                    "{} is not ALLOW, DENY, AUDIT or CUSTOM (a missing action is refused, never read as ALLOW)",
                    p.action
                ),
            ))
        }
    };
    if p.targets.is_empty() {
        return Err(ConvertError::new(
            "targets",
            "at least one: a policy without targetRefs is ztunnel's, not a waypoint's",
        ));
    }
    let targets = p
        .targets
        .into_iter()
        .enumerate()
        .map(|(i, t)| target(i, t, &p.namespace))
        .collect::<Result<Vec<_>, _>>()?;
    let rules = rules(&p.rules_json)?;
    let mut policy = WaypointPolicy {
        authorization: Authorization {
            name: p.name,
            namespace: p.namespace,
            scope: PolicyScope::WorkloadSelector,
            // As the manifests reader sets it: only ALLOW allows, so that code reading
            // this field alone fails closed.
            action: match action {
                WaypointAction::Allow => PolicyAction::Allow,
                _ => PolicyAction::Deny,
            },
            rules,
            dry_run: p.dry_run,
        },
        action,
        targets,
    };
    super::manifest::check(&policy, root_namespace)?;
    policy.authorization.shrink_to_fit();
    Ok(policy)
}

fn target(i: usize, t: wp::Target, namespace: &str) -> Result<PolicyTarget, ConvertError> {
    if t.name.is_empty() {
        return Err(ConvertError::new(
            format!("targets[{i}].name"),
            "must be set",
        ));
    }
    let namespace = namespace.to_string();
    let name = t.name;
    Ok(match wp::target::Kind::try_from(t.kind) {
        Ok(wp::target::Kind::Gateway) => PolicyTarget::Gateway { namespace, name },
        Ok(wp::target::Kind::Service) => PolicyTarget::Service { namespace, name },
        Ok(wp::target::Kind::ServiceEntry) => PolicyTarget::ServiceEntry { namespace, name },
        Ok(wp::target::Kind::GatewayClass) => PolicyTarget::GatewayClass { name },
        Ok(wp::target::Kind::Unspecified) | Err(_) => {
            return Err(ConvertError::new(
                format!("targets[{i}].kind"),
                format!(
                    "{} is not GATEWAY, SERVICE, SERVICE_ENTRY or GATEWAY_CLASS",
                    t.kind
                ),
            ))
        }
    })
}

/// The rules, read by the state's own parsers from its JSON form.
fn rules(json: &[u8]) -> Result<Vec<Rule>, ConvertError> {
    if json.is_empty() {
        return Err(ConvertError::new(
            "rulesJson",
            "must be set (\"[]\" for a policy without rules)",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(json);
    let rules: Vec<Rule> = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." { String::new() } else { path };
        ConvertError::new(format!("rulesJson{at}"), without_position(e.into_inner()))
    })?;
    de.end()
        .map_err(|e| ConvertError::new("rulesJson", format!("after the rules: {e}")))?;
    Ok(rules)
}

/// The message of a JSON error without its position: the rules are one line, and the
/// field path says where.
fn without_position(e: serde_json::Error) -> String {
    let text = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&at) {
        Some(t) => t.to_string(),
        None => text,
    }
}
