//! Authorization (RBAC): of inbound connections, on their L4 fields (the node proxy), and
//! of HTTP requests, on every field ([`request`], the waypoint). One evaluator: the match
//! fields the two share are evaluated by the same code.
//!
//! Order: enforced DENY policies first (any match rejects), then ALLOW policies (none
//! enforced ⇒ allow; any match ⇒ allow; else reject). Dry-run policies are evaluated and
//! logged, never enforced.

use std::borrow::Borrow;
use std::net::{IpAddr, SocketAddr};

use ambit_identity::SpiffeId;

use crate::ident;
use crate::policy::{
    Authorization, PolicyAction, RbacMatch, Rule, ServiceAccountMatch, StringMatch,
};
use crate::store::ProxyState;
use crate::workload::Workload;

/// What an inbound connection looks like to RBAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbacContext {
    /// The peer's verified SPIFFE id (none for plaintext).
    pub source_identity: Option<SpiffeId>,
    /// The peer's address (the HBONE client address).
    pub source_ip: IpAddr,
    /// The destination pod IP and the translated target port.
    pub destination: SocketAddr,
}

mod request;

pub use request::{authorize_request, Allowed, RequestAttributes, RequestAuth};

/// Why a connection or request was denied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Denied {
    /// Human-readable reason, as in ztunnel's logs.
    pub reason: String,
    /// The denying policy (`namespace/name`), for a DENY match.
    pub policy: Option<String>,
    /// The DENY rule that matched (none: ALLOW policies exist and none matched).
    pub matched_rule: Option<MatchedRule>,
}

impl Denied {
    /// Envoy's response code details for this denial:
    /// `rbac_access_denied_matched_policy[ns[<ns>]-policy[<name>]-rule[<i>]]` when a DENY
    /// rule matched, `rbac_access_denied_matched_policy[none]` otherwise.
    pub fn details(&self) -> String {
        match &self.matched_rule {
            Some(r) => format!("rbac_access_denied_matched_policy[{}]", r.envoy_name()),
            None => "rbac_access_denied_matched_policy[none]".into(),
        }
    }
}

/// One rule of a policy: the policy's namespace and name, and the rule's index in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchedRule {
    pub namespace: String,
    pub name: String,
    pub rule: usize,
}

impl MatchedRule {
    fn of(p: &Authorization, rule: usize) -> Self {
        MatchedRule {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            rule,
        }
    }

    /// The policy's key, `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The name Istio gives this rule's Envoy RBAC policy: `ns[<ns>]-policy[<name>]-rule[<i>]`.
    pub fn envoy_name(&self) -> String {
        format!(
            "ns[{}]-policy[{}]-rule[{}]",
            self.namespace, self.name, self.rule
        )
    }

    /// Orders by [`MatchedRule::envoy_name`], byte for byte (so `rule[10]` before `rule[2]`).
    fn cmp_envoy_name(&self, other: &MatchedRule) -> std::cmp::Ordering {
        self.envoy_name().cmp(&other.envoy_name())
    }
}

/// The reason when ALLOW policies exist and none matched.
const DENIED_BY_ALLOW: &str = "allow policies exist, but none allowed";

/// Told of what an authorization saw that is not its verdict: each dry-run policy that
/// matched (logged, never enforced). Passed to each call, so that every proxy counts its
/// own (two in one process do not share a counter).
pub trait RbacObserver {
    /// `policy`, a dry-run policy, matched the connection.
    fn dry_run_matched(&self, policy: &Authorization);
}

/// Any `Fn(&Authorization)` observes dry-run matches.
impl<F: Fn(&Authorization)> RbacObserver for F {
    fn dry_run_matched(&self, policy: &Authorization) {
        self(policy)
    }
}

impl std::fmt::Debug for dyn RbacObserver + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RbacObserver")
    }
}

impl std::fmt::Debug for dyn RbacObserver + Send + Sync + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RbacObserver")
    }
}

/// Observes nothing: for callers that count no dry-run matches (benchmarks, tools).
#[derive(Debug, Clone, Copy, Default)]
pub struct Unobserved;

impl RbacObserver for Unobserved {
    fn dry_run_matched(&self, _: &Authorization) {}
}

impl ProxyState {
    /// Authorizes a connection to `dst_workload` against the policies that apply to it
    /// (see [`ProxyState::policies_for`]); `observer` is told of matching dry-run policies.
    pub fn authorize(
        &self,
        ctx: &RbacContext,
        dst_workload: &Workload,
        observer: &dyn RbacObserver,
    ) -> Result<(), Denied> {
        let mut applying: Vec<&Authorization> = Vec::with_capacity(16);
        self.each_policy_for(dst_workload, |p| applying.push(p));
        authorize_observed(&applying, ctx, observer)
    }
}

/// Evaluates a set of policies (already selected for the destination) against `ctx`.
/// Matching dry-run policies are logged and told to `observer`, never enforced.
pub fn authorize_observed<P: Borrow<Authorization>>(
    policies: &[P],
    ctx: &RbacContext,
    observer: &dyn RbacObserver,
) -> Result<(), Denied> {
    let policies = policies.iter().map(Borrow::borrow);
    let peer = Peer::new(ctx);
    for p in policies.clone().filter(|p| p.action == PolicyAction::Deny) {
        if let Some(rule) = matching_rule(p, &peer) {
            if p.dry_run {
                tracing::info!(policy = %p.key(), ctx = ?ctx, "dry-run DENY policy matched (not enforced)");
                observer.dry_run_matched(p);
            } else {
                tracing::debug!(policy = %p.key(), ctx = ?ctx, "denied by policy");
                return Err(Denied {
                    reason: format!("explicitly denied by: {}", p.key()),
                    policy: Some(p.key()),
                    matched_rule: Some(MatchedRule::of(p, rule)),
                });
            }
        }
    }
    let mut enforced_allow = false;
    let mut allowed = false;
    for p in policies.filter(|p| p.action == PolicyAction::Allow) {
        if p.dry_run {
            if matches_peer(p, &peer) {
                tracing::info!(policy = %p.key(), ctx = ?ctx, "dry-run ALLOW policy matched (not enforced)");
                observer.dry_run_matched(p);
            }
            continue;
        }
        enforced_allow = true;
        if matches_peer(p, &peer) {
            tracing::debug!(policy = %p.key(), ctx = ?ctx, "allowed by policy");
            allowed = true;
            break;
        }
    }
    if !enforced_allow || allowed {
        return Ok(());
    }
    Err(Denied {
        reason: DENIED_BY_ALLOW.into(),
        policy: None,
        matched_rule: None,
    })
}

/// A policy matches if any rule matches; a rule if all its clauses match (no clauses ⇒
/// match); a clause if any of its match objects matches (no match objects ⇒ match).
/// A policy without rules never matches.
///
/// L7 attributes (see [`crate::policy::L7_ATTRIBUTES`]) cannot be seen here: a rule of an
/// ALLOW policy that uses one never matches; in a DENY policy they are ignored, and a
/// match object left with no L4 field matches everything (deny more, never less).
pub fn matches(p: &Authorization, ctx: &RbacContext) -> bool {
    matches_peer(p, &Peer::new(ctx))
}

/// The connection as the match fields see it, derived once per decision.
struct Peer<'a> {
    ctx: &'a RbacContext,
    /// The peer's SPIFFE id without `spiffe://`, made on first use.
    principal: std::cell::OnceCell<Option<String>>,
}

impl<'a> Peer<'a> {
    fn new(ctx: &'a RbacContext) -> Self {
        Peer {
            ctx,
            principal: std::cell::OnceCell::new(),
        }
    }

    fn principal(&self) -> Option<&str> {
        self.principal
            .get_or_init(|| self.ctx.source_identity.as_ref().map(ident::principal))
            .as_deref()
    }
}

fn matches_peer(p: &Authorization, ctx: &Peer<'_>) -> bool {
    matching_rule(p, ctx).is_some()
}

/// The index of the first rule of `p` that matches on L4 fields alone (see [`matches`]).
fn matching_rule(p: &Authorization, ctx: &Peer<'_>) -> Option<usize> {
    let deny = p.action == PolicyAction::Deny;
    p.rules.iter().position(|rule| {
        if !deny && rule.iter().flatten().any(RbacMatch::has_l7) {
            return false;
        }
        rule_matches(rule, |m| {
            if deny && m.has_l7() {
                m.has_no_l4_field() || match_fields(m, ctx)
            } else {
                match_object(m, ctx)
            }
        })
    })
}

/// A rule matches if every clause does; a clause if it is empty or one of its match
/// objects does (`object`, each mode's own).
fn rule_matches(rule: &Rule, object: impl Fn(&RbacMatch) -> bool) -> bool {
    rule.iter()
        .all(|clause| clause.is_empty() || clause.iter().any(&object))
}

/// One field family: the positive list (if any) must contain a match, and the negative
/// list (if any) must contain none.
fn family<T>(pos: &[T], neg: &[T], f: impl Fn(&T) -> bool) -> bool {
    (pos.is_empty() || pos.iter().any(&f)) && !neg.iter().any(&f)
}

fn match_object(m: &RbacMatch, ctx: &Peer<'_>) -> bool {
    !m.has_no_l4_field() && match_fields(m, ctx)
}

/// Every L4 field family of the match object passes.
fn match_fields(m: &RbacMatch, peer: &Peer<'_>) -> bool {
    let ctx = peer.ctx;
    let id = ctx.source_identity.as_ref();
    let namespace = id.map(|i| i.namespace()).unwrap_or("");
    let dst_ip = ctx.destination.ip();
    let dst_port = ctx.destination.port();
    family(&m.destination_ips, &m.not_destination_ips, |n| {
        n.contains(&dst_ip)
    }) && family(&m.source_ips, &m.not_source_ips, |n| {
        n.contains(&ctx.source_ip)
    }) && family(&m.destination_ports, &m.not_destination_ports, |p| {
        *p == dst_port
    }) && family(
        &m.service_accounts,
        &m.not_service_accounts,
        |sa: &ServiceAccountMatch| {
            id.is_some_and(|i| {
                i.namespace() == sa.namespace && i.service_account() == sa.service_account
            })
        },
    ) && family(&m.principals, &m.not_principals, |s: &StringMatch| {
        peer.principal().is_some_and(|p| s.matches(p))
    }) && family(&m.namespaces, &m.not_namespaces, |s: &StringMatch| {
        s.matches(namespace)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_schema::parse_local_config;
    use crate::policy::PolicyScope;

    fn id(s: &str) -> Option<SpiffeId> {
        Some(SpiffeId::parse(s).unwrap())
    }

    fn ctx(identity: Option<SpiffeId>, src: &str, dst: &str) -> RbacContext {
        RbacContext {
            source_identity: identity,
            source_ip: src.parse().unwrap(),
            destination: dst.parse().unwrap(),
        }
    }

    fn client() -> RbacContext {
        ctx(
            id("spiffe://cluster.local/ns/default/sa/client"),
            "10.0.0.2",
            "10.0.0.3:8080",
        )
    }

    /// Parses policies from YAML (the `rules` of one policy per entry).
    fn policy(action: &str, dry_run: bool, rules: &str) -> Authorization {
        let yaml = format!(
            "policies:\n- {{name: p, namespace: default, scope: Global, action: {action}, dryRun: {dry_run}, rules: {rules}}}\n"
        );
        parse_local_config("t", &yaml).unwrap().policies.remove(0)
    }

    /// One match object, as YAML, against the context.
    fn m(obj: &str, c: &RbacContext) -> bool {
        matches(&policy("Allow", false, &format!("[[[{obj}]]]")), c)
    }

    #[test]
    fn match_object_table() {
        let c = client();
        let anon = ctx(None, "10.0.0.2", "10.0.0.3:8080");
        let cases: &[(&str, &RbacContext, bool)] = &[
            ("{}", &c, false),
            ("{namespaces: [{exact: default}]}", &c, true),
            ("{namespaces: [{exact: other}]}", &c, false),
            ("{namespaces: [{exact: other}, {prefix: def}]}", &c, true),
            ("{notNamespaces: [{exact: default}]}", &c, false),
            ("{notNamespaces: [{exact: other}]}", &c, true),
            ("{namespaces: [{presence: {}}]}", &c, true),
            ("{namespaces: [{presence: {}}]}", &anon, false),
            ("{namespaces: [{exact: \"\"}]}", &anon, true),
            ("{notNamespaces: [{presence: {}}]}", &anon, true),
            (
                "{principals: [{exact: \"cluster.local/ns/default/sa/client\"}]}",
                &c,
                true,
            ),
            // A principal written with `spiffe://` never matches; the loader refuses it
            // (config::tests::error_table).
            ("{principals: [{prefix: \"cluster.local/\"}]}", &c, true),
            ("{principals: [{suffix: \"/sa/client\"}]}", &c, true),
            ("{principals: [{suffix: \"/sa/other\"}]}", &c, false),
            ("{principals: [{presence: {}}]}", &c, true),
            ("{principals: [{presence: {}}]}", &anon, false),
            ("{principals: [{prefix: \"\"}]}", &anon, false),
            ("{notPrincipals: [{presence: {}}]}", &anon, true),
            ("{notPrincipals: [{Prefix: \"cluster.local/\"}]}", &c, false),
            (
                "{serviceAccounts: [{namespace: default, serviceAccount: client}]}",
                &c,
                true,
            ),
            (
                "{serviceAccounts: [{namespace: default, serviceAccount: other}]}",
                &c,
                false,
            ),
            (
                "{serviceAccounts: [{namespace: other, serviceAccount: client}]}",
                &c,
                false,
            ),
            (
                "{serviceAccounts: [{namespace: default, serviceAccount: client}]}",
                &anon,
                false,
            ),
            (
                "{notServiceAccounts: [{namespace: default, serviceAccount: client}]}",
                &c,
                false,
            ),
            (
                "{notServiceAccounts: [{namespace: default, serviceAccount: client}]}",
                &anon,
                true,
            ),
            ("{sourceIps: [\"10.0.0.0/24\"]}", &c, true),
            ("{sourceIps: [\"10.0.0.2\"]}", &c, true),
            ("{sourceIps: [\"10.0.1.0/24\"]}", &c, false),
            ("{sourceIps: [\"fd00::/8\"]}", &c, false),
            ("{notSourceIps: [\"10.0.0.0/8\"]}", &c, false),
            ("{destinationIps: [\"10.0.0.3/32\"]}", &c, true),
            ("{destinationIps: [\"10.0.0.4/32\"]}", &c, false),
            ("{notDestinationIps: [\"10.0.0.4/32\"]}", &c, true),
            ("{destinationPorts: [8080]}", &c, true),
            ("{destinationPorts: [80, 8080]}", &c, true),
            ("{destinationPorts: [80]}", &c, false),
            ("{notDestinationPorts: [8080]}", &c, false),
            (
                "{destinationPorts: [8080], notDestinationPorts: [8080]}",
                &c,
                false,
            ),
            // Fields AND together.
            (
                "{namespaces: [{exact: default}], destinationPorts: [8080]}",
                &c,
                true,
            ),
            (
                "{namespaces: [{exact: default}], destinationPorts: [9090]}",
                &c,
                false,
            ),
            (
                "{namespaces: [{exact: default}], sourceIps: [\"192.168.0.0/16\"]}",
                &c,
                false,
            ),
        ];
        let mut failures = Vec::new();
        for (obj, c, want) in cases {
            if m(obj, c) != *want {
                failures.push(format!(
                    "{obj} (identity {:?}): want {want}",
                    c.source_identity
                ));
            }
        }
        assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    }

    /// Every match field and its negation, each against a context it admits and one it
    /// does not: (match object, context, want).
    #[test]
    fn every_field_and_negation() {
        let c = client();
        let v6 = ctx(
            id("spiffe://cluster.local/ns/default/sa/client"),
            "fd00::2",
            "[fd00::3]:8080",
        );
        let anon = ctx(None, "10.0.0.2", "10.0.0.3:8080");
        // Identities with '.' and '*' are compared byte for byte: no glob, no regex.
        let dotted = ctx(
            id("spiffe://example.org/ns/a.b/sa/x.y"),
            "10.0.0.2",
            "10.0.0.3:8080",
        );
        let other_td = ctx(
            id("spiffe://examplexorg/ns/axb/sa/xxy"),
            "10.0.0.2",
            "10.0.0.3:8080",
        );
        let cases: &[(&str, &RbacContext, bool)] = &[
            ("{destinationIps: [\"10.0.0.0/24\"]}", &c, true),
            ("{destinationIps: [\"10.0.1.0/24\"]}", &c, false),
            ("{destinationIps: [\"fd00::/64\"]}", &v6, true),
            ("{destinationIps: [\"fd00::3\"]}", &v6, true),
            ("{notDestinationIps: [\"10.0.0.3\"]}", &c, false),
            ("{notDestinationIps: [\"10.0.1.0/24\"]}", &c, true),
            ("{sourceIps: [\"10.0.0.2\"]}", &c, true),
            ("{sourceIps: [\"10.0.0.3\"]}", &c, false),
            ("{sourceIps: [\"fd00::2/128\"]}", &v6, true),
            ("{notSourceIps: [\"10.0.0.0/30\"]}", &c, false),
            ("{notSourceIps: [\"10.0.0.4/30\"]}", &c, true),
            ("{destinationPorts: [8080]}", &c, true),
            ("{destinationPorts: [8081]}", &c, false),
            ("{notDestinationPorts: [8080]}", &c, false),
            ("{notDestinationPorts: [8081]}", &c, true),
            (
                "{principals: [{exact: \"cluster.local/ns/default/sa/client\"}]}",
                &c,
                true,
            ),
            (
                "{principals: [{exact: \"cluster.local/ns/default/sa/clien\"}]}",
                &c,
                false,
            ),
            (
                "{principals: [{exact: \"cluster.local/ns/default/sa/client\"}]}",
                &anon,
                false,
            ),
            (
                "{notPrincipals: [{exact: \"cluster.local/ns/default/sa/client\"}]}",
                &c,
                false,
            ),
            (
                "{notPrincipals: [{exact: \"cluster.local/ns/default/sa/other\"}]}",
                &c,
                true,
            ),
            (
                "{notPrincipals: [{exact: \"cluster.local/ns/default/sa/client\"}]}",
                &anon,
                true,
            ),
            (
                "{principals: [{exact: \"example.org/ns/a.b/sa/x.y\"}]}",
                &dotted,
                true,
            ),
            (
                "{principals: [{exact: \"example.org/ns/a.b/sa/x.y\"}]}",
                &other_td,
                false,
            ),
            ("{principals: [{exact: \"*\"}]}", &c, false),
            (
                "{principals: [{exact: \"cluster.local/ns/default/sa/*\"}]}",
                &c,
                false,
            ),
            ("{principals: [{prefix: \"*\"}]}", &c, false),
            ("{principals: [{suffix: \"/sa/*\"}]}", &c, false),
            (
                "{principals: [{prefix: \"example.org/ns/a.b/\"}]}",
                &other_td,
                false,
            ),
            ("{notPrincipals: [{exact: \"*\"}]}", &c, true),
            ("{namespaces: [{exact: default}]}", &c, true),
            ("{namespaces: [{exact: a.b}]}", &dotted, true),
            ("{namespaces: [{exact: a.b}]}", &other_td, false),
            ("{namespaces: [{exact: \"*\"}]}", &c, false),
            ("{namespaces: [{suffix: ult}]}", &c, true),
            ("{notNamespaces: [{exact: default}]}", &c, false),
            ("{notNamespaces: [{prefix: x}]}", &c, true),
            (
                "{serviceAccounts: [{namespace: default, serviceAccount: client}]}",
                &c,
                true,
            ),
            (
                "{serviceAccounts: [{namespace: default, serviceAccount: \"*\"}]}",
                &c,
                false,
            ),
            (
                "{serviceAccounts: [{namespace: a.b, serviceAccount: x.y}]}",
                &dotted,
                true,
            ),
            (
                "{serviceAccounts: [{namespace: a.b, serviceAccount: x.y}]}",
                &other_td,
                false,
            ),
            (
                "{notServiceAccounts: [{namespace: default, serviceAccount: client}]}",
                &c,
                false,
            ),
            (
                "{notServiceAccounts: [{namespace: default, serviceAccount: other}]}",
                &c,
                true,
            ),
            // Presence: any non-empty value.
            ("{principals: [{presence: {}}]}", &c, true),
            ("{principals: [{presence: {}}]}", &anon, false),
            ("{notPrincipals: [{presence: {}}]}", &c, false),
            ("{namespaces: [{presence: {}}]}", &anon, false),
            ("{notNamespaces: [{presence: {}}]}", &c, false),
            // The empty match object never matches.
            ("{}", &c, false),
            ("{}", &anon, false),
        ];
        let mut failures = Vec::new();
        for (obj, c, want) in cases {
            for action in ["Allow", "Deny"] {
                let p = policy(action, false, &format!("[[[{obj}]]]"));
                if matches(&p, c) != *want {
                    failures.push(format!(
                        "{action} {obj} ({:?}): want {want}",
                        c.source_identity
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    }

    /// L7 attributes: an ALLOW rule that uses one never matches; a DENY is enforced on its
    /// L4 fields alone (all traffic when it has none).
    #[test]
    fn l7_attributes_fail_closed() {
        let c = client();
        let cases: &[(&str, &str, bool)] = &[
            ("Allow", "[[[{paths: [\"/admin\"]}]]]", false),
            (
                "Allow",
                "[[[{namespaces: [{exact: default}], methods: [GET]}]]]",
                false,
            ),
            // The whole rule, even when another clause would have matched.
            (
                "Allow",
                "[[[{namespaces: [{exact: default}]}], [{hosts: [a.example]}]]]",
                false,
            ),
            // Another rule without L7 attributes still can.
            (
                "Allow",
                "[[[{requestPrincipals: [\"*\"]}]], [[{namespaces: [{exact: default}]}]]]",
                true,
            ),
            ("Deny", "[[[{paths: [\"/admin\"]}]]]", true),
            (
                "Deny",
                "[[[{when: [{key: \"request.headers[x]\", values: [y]}]}]]]",
                true,
            ),
            (
                "Deny",
                "[[[{namespaces: [{exact: default}], notMethods: [GET]}]]]",
                true,
            ),
            (
                "Deny",
                "[[[{namespaces: [{exact: other}], headers: {x: y}}]]]",
                false,
            ),
            (
                "Deny",
                "[[[{destinationPorts: [9090], notPaths: [\"/\"]}]]]",
                false,
            ),
        ];
        for (action, rules, want) in cases {
            let p = policy(action, false, rules);
            assert!(!p.l7_attributes().is_empty(), "{rules}");
            assert_eq!(matches(&p, &c), *want, "{action} {rules}");
        }
        // Every name is read (each with a value its matcher accepts).
        for name in crate::policy::L7_ATTRIBUTES {
            let v = l7_value(name);
            let p = policy("Allow", false, &format!("[[[{{{name}: {v}}}]]]"));
            assert_eq!(p.l7_attributes().into_iter().collect::<Vec<_>>(), [*name]);
        }
        // An ALLOW whose only rule is L7 leaves the workload with an ALLOW that admits
        // nobody: denied, never allowed.
        let only = policy("Allow", false, "[[[{methods: [GET]}]]]");
        assert!(authorize_observed(&[only], &c, &Unobserved).is_err());
    }

    /// A value each L7 attribute's typed matcher accepts.
    fn l7_value(name: &str) -> &'static str {
        match name {
            "paths" | "notPaths" => "[\"/x\"]",
            "methods" | "notMethods" => "[GET]",
            "headers" | "notHeaders" => "{x: y}",
            "remoteIps" | "notRemoteIps" => "[\"10.0.0.2\"]",
            "when" => "[{key: \"request.headers[x]\", values: [y]}]",
            _ => "[x]",
        }
    }

    /// What L4 evaluation does with each L7 attribute, and with conditions on keys an L4
    /// proxy could see (still L7 attributes: never evaluated): an ALLOW rule using one
    /// never matches, a DENY is enforced on its L4 fields alone (everything when it has
    /// none).
    #[test]
    fn every_l7_attribute_is_unseen_by_l4() {
        let c = client();
        let mut attributes: Vec<(String, &str)> = crate::policy::L7_ATTRIBUTES
            .iter()
            .map(|n| (n.to_string(), l7_value(n)))
            .collect();
        // Conditions the client meets, had they been evaluated.
        for cond in [
            "[{key: source.ip, values: [\"10.0.0.2\"]}]",
            "[{key: source.namespace, values: [default]}]",
            "[{key: source.principal, values: [\"cluster.local/ns/default/sa/client\"]}]",
            "[{key: destination.ip, values: [\"10.0.0.3\"]}]",
            "[{key: destination.port, values: [\"8080\"]}]",
            "[{key: destination.port, notValues: [\"9090\"]}]",
        ] {
            attributes.push(("when".into(), cond));
        }
        let rows: &[(&str, &str, bool, Result<(), &str>)] = &[
            (
                "Allow",
                "",
                false,
                Err("allow policies exist, but none allowed"),
            ),
            (
                "Allow",
                "namespaces: [{exact: default}], ",
                false,
                Err("allow policies exist, but none allowed"),
            ),
            ("Deny", "", true, Err("explicitly denied by: default/p")),
            (
                "Deny",
                "namespaces: [{exact: default}], ",
                true,
                Err("explicitly denied by: default/p"),
            ),
            ("Deny", "namespaces: [{exact: other}], ", false, Ok(())),
        ];
        let mut failures = Vec::new();
        for (name, value) in &attributes {
            for (action, l4, want_match, want_verdict) in rows {
                let rules = format!("[[[{{{l4}{name}: {value}}}]]]");
                let p = policy(action, false, &rules);
                if p.l7_attributes().into_iter().collect::<Vec<_>>() != [name.as_str()] {
                    failures.push(format!("{rules}: attributes {:?}", p.l7_attributes()));
                }
                if matches(&p, &c) != *want_match {
                    failures.push(format!("{action} {rules}: want match {want_match}"));
                }
                let verdict = authorize_observed(&[p], &c, &Unobserved).map_err(|d| d.reason);
                if verdict.as_ref().map(|_| ()).map_err(String::as_str) != *want_verdict {
                    failures.push(format!(
                        "{action} {rules}: {verdict:?}, want {want_verdict:?}"
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    }

    #[test]
    fn dry_run_is_counted_not_enforced() {
        let c = client();
        let yes = "[[[{namespaces: [{exact: default}]}]]]";
        let no = "[[[{namespaces: [{exact: other}]}]]]";
        let named = |mut p: Authorization, n: &str| {
            p.name = n.into();
            p
        };
        let policies = vec![
            named(policy("Deny", true, yes), "dry-deny"),
            named(policy("Deny", true, no), "dry-deny-miss"),
            named(policy("Allow", true, yes), "dry-allow"),
            named(policy("Allow", false, yes), "allow"),
        ];
        let seen = std::cell::RefCell::new(Vec::new());
        let verdict = authorize_observed(&policies, &c, &|p: &Authorization| {
            seen.borrow_mut().push((p.key(), p.action))
        });
        assert!(verdict.is_ok());
        assert_eq!(
            seen.into_inner(),
            [
                ("default/dry-deny".to_string(), PolicyAction::Deny),
                ("default/dry-allow".to_string(), PolicyAction::Allow),
            ]
        );
    }

    /// Two proxies in one process, each with its own observer: each counts only the
    /// dry-run matches of its own decisions.
    #[test]
    fn two_observers_count_their_own_dry_runs() {
        #[derive(Default)]
        struct Counter(std::sync::Mutex<Vec<String>>);
        impl RbacObserver for Counter {
            fn dry_run_matched(&self, p: &Authorization) {
                self.0.lock().unwrap().push(p.key());
            }
        }
        let yaml = |name: &str| {
            format!(
                "workloads:\n- {{name: server, namespace: default, workloadIps: [\"10.0.0.3\"]}}\npolicies:\n- {{name: {name}, namespace: default, scope: Namespace, action: Deny, dryRun: true, rules: [[]]}}\n"
            )
        };
        let proxy = |name: &str| {
            let s = ProxyState::from_yaml("t", &yaml(name)).unwrap();
            let w = s
                .workload_by_uid("Kubernetes//v1/Pod/default/server")
                .unwrap();
            (s, w)
        };
        let (a, a_dst) = proxy("dry-a");
        let (b, b_dst) = proxy("dry-b");
        let (count_a, count_b) = (Counter::default(), Counter::default());
        for _ in 0..2 {
            assert!(a.authorize(&client(), &a_dst, &count_a).is_ok());
        }
        assert!(b.authorize(&client(), &b_dst, &count_b).is_ok());
        assert_eq!(
            *count_a.0.lock().unwrap(),
            ["default/dry-a", "default/dry-a"]
        );
        assert_eq!(*count_b.0.lock().unwrap(), ["default/dry-b"]);
    }

    #[test]
    fn rule_structure_table() {
        let c = client();
        let yes = "{namespaces: [{exact: default}]}";
        let no = "{namespaces: [{exact: other}]}";
        let cases: Vec<(String, bool)> = vec![
            ("[]".into(), false),       // no rules: never matches
            ("[[]]".into(), true),      // rule without clauses: matches
            ("[[[]]]".into(), true),    // clause without matches: matches
            ("[[[{}]]]".into(), false), // empty match object
            (format!("[[[{yes}]]]"), true),
            (format!("[[[{no}]]]"), false),
            (format!("[[[{no}, {yes}]]]"), true), // clause = OR
            (format!("[[[{yes}], [{no}]]]"), false), // rule = AND
            (format!("[[[{yes}], [{yes}]]]"), true),
            (format!("[[[{no}]], [[{yes}]]]"), true), // rules = OR
            (format!("[[[{no}]], [[{no}]]]"), false),
        ];
        for (rules, want) in cases {
            assert_eq!(
                matches(&policy("Allow", false, &rules), &c),
                want,
                "{rules}"
            );
        }
    }

    #[test]
    fn decision_table() {
        let c = client();
        let yes = "[[[{namespaces: [{exact: default}]}]]]";
        let no = "[[[{namespaces: [{exact: other}]}]]]";
        let allow = |r| policy("Allow", false, r);
        let deny = |r| policy("Deny", false, r);
        let named = |mut p: Authorization, n: &str| {
            p.name = n.into();
            p
        };
        let cases: Vec<(&str, Vec<Authorization>, Result<(), &str>)> = vec![
            ("no policies", vec![], Ok(())),
            ("allow matches", vec![allow(yes)], Ok(())),
            (
                "allow misses",
                vec![allow(no)],
                Err("allow policies exist, but none allowed"),
            ),
            (
                "allow without rules",
                vec![allow("[]")],
                Err("allow policies exist, but none allowed"),
            ),
            (
                "one of two allows",
                vec![allow(no), named(allow(yes), "q")],
                Ok(()),
            ),
            (
                "deny matches",
                vec![deny(yes)],
                Err("explicitly denied by: default/p"),
            ),
            ("deny misses", vec![deny(no)], Ok(())),
            (
                "deny beats allow",
                vec![named(allow(yes), "a"), named(deny(yes), "d")],
                Err("explicitly denied by: default/d"),
            ),
            (
                "deny misses, allow misses",
                vec![named(deny(no), "d"), allow(no)],
                Err("allow policies exist, but none allowed"),
            ),
            (
                "dry-run deny not enforced",
                vec![policy("Deny", true, yes)],
                Ok(()),
            ),
            (
                "dry-run allow only",
                vec![policy("Allow", true, no)],
                Ok(()),
            ),
            (
                "dry-run allow does not allow",
                vec![policy("Allow", true, yes), named(allow(no), "q")],
                Err("allow policies exist, but none allowed"),
            ),
            ("deny with no rules never matches", vec![deny("[]")], Ok(())),
            (
                "deny with empty rule matches all",
                vec![deny("[[]]")],
                Err("explicitly denied by: default/p"),
            ),
        ];
        for (name, policies, want) in cases {
            let got = authorize_observed(&policies, &c, &Unobserved);
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(d), Err(w)) => assert_eq!(d.reason, w, "{name}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn attachment_through_store() {
        let yaml = r#"
workloads:
- {name: server, namespace: default, workloadIps: ["10.0.0.3"], authorizationPolicies: ["default/sel"]}
- {name: other, namespace: other, workloadIps: ["10.0.0.4"]}
policies:
- {name: root-deny, namespace: istio-system, scope: Global, action: Deny, rules: [[[{namespaces: [{exact: evil}]}]]]}
- {name: ns-allow, namespace: default, scope: Namespace, action: Allow, rules: [[[{principals: [{suffix: /sa/client}]}]]]}
- {name: sel, namespace: default, scope: WorkloadSelector, action: Allow, rules: [[[{destinationPorts: [9090]}]]]}
"#;
        let cfg = parse_local_config("t", yaml).unwrap();
        assert_eq!(cfg.policies[0].scope, PolicyScope::Global);
        let s = ProxyState::from_config(cfg).unwrap();
        let server = s
            .workload_by_uid("Kubernetes//v1/Pod/default/server")
            .unwrap();
        let other = s.workload_by_uid("Kubernetes//v1/Pod/other/other").unwrap();

        // Namespace policy allows the client.
        assert!(s.authorize(&client(), &server, &Unobserved).is_ok());
        // Someone else is denied by the namespace allow...
        let stranger = ctx(
            id("spiffe://cluster.local/ns/x/sa/y"),
            "10.0.0.9",
            "10.0.0.3:8080",
        );
        assert_eq!(
            s.authorize(&stranger, &server, &Unobserved)
                .unwrap_err()
                .reason,
            "allow policies exist, but none allowed"
        );
        // ...unless the workload-selected policy allows the port.
        let stranger9090 = ctx(
            id("spiffe://cluster.local/ns/x/sa/y"),
            "10.0.0.9",
            "10.0.0.3:9090",
        );
        assert!(s.authorize(&stranger9090, &server, &Unobserved).is_ok());
        // The global deny applies to every namespace.
        let evil = ctx(
            id("spiffe://cluster.local/ns/evil/sa/y"),
            "10.0.0.9",
            "10.0.0.4:80",
        );
        let d = s.authorize(&evil, &other, &Unobserved).unwrap_err();
        assert_eq!(d.reason, "explicitly denied by: istio-system/root-deny");
        assert_eq!(d.policy.as_deref(), Some("istio-system/root-deny"));
        // No allow policies in namespace "other": allowed.
        assert!(s.authorize(&stranger, &other, &Unobserved).is_ok());
    }
}
