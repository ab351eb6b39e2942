//! Authorization of one HTTP request (an L7 proxy: the waypoint). The same policies as the
//! node proxy's L4 authorization, the same L4 fields evaluated by the same code, and every
//! L7 attribute evaluated too, with Istio's semantics:
//!
//! - Enforced DENY policies first: any matching rule refuses. Then enforced ALLOW policies:
//!   none ⇒ allowed; one matching rule ⇒ allowed; else refused.
//! - Dry-run policies (either action) are all evaluated and each match told to the
//!   observer, whatever the verdict; they never change it.
//! - Rules OR, clauses AND, the match objects of a clause OR; within a match object every
//!   field with entries must pass: a positive list when some entry matches, a negative
//!   list when none does. A match object with no entry in any field never matches.
//! - An attribute the request lacks (no JWT, no SNI, a header not sent) matches no entry:
//!   its positive list fails, its negative list passes.

use std::borrow::{Borrow, Cow};
use std::cmp::Ordering;
use std::net::IpAddr;

use http::HeaderMap;
use serde_json::{Map, Value};

use super::{family, match_fields, rule_matches, Denied, MatchedRule, Peer, RbacContext};
use super::{RbacObserver, DENIED_BY_ALLOW};
use crate::policy::{
    Authorization, Condition, IpKey, L7Attributes, PolicyAction, RbacMatch, StringMatch, TextKey,
    Values,
};

/// What a request looks like to RBAC, beside its connection ([`RbacContext`]: the peer's
/// identity and address, and the destination, whose port `destinationPorts` and
/// `destination.port` compare).
#[derive(Debug, Clone, Copy)]
pub struct RequestAttributes<'a> {
    /// The method, as received (methods compare case-sensitively).
    pub method: &'a str,
    /// The path, normalised ([`crate::normalize_path`]), without its query.
    pub path: &'a str,
    /// The query (without `?`), for the `:path` pseudo-header only.
    pub query: Option<&'a str>,
    /// The `Host` / `:authority` value, as received (with its port, if any).
    pub host: &'a str,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The original client (`remoteIps`, `remote.ip`): the address a trusted
    /// `X-Forwarded-For` or PROXY header names, else the peer's address.
    pub remote_ip: IpAddr,
    /// The request's validated JWT, if any.
    pub auth: Option<&'a RequestAuth>,
    /// The SNI of the TLS connection the request came on, if any (`connection.sni`).
    pub sni: Option<&'a str>,
}

/// What a validated JWT says about the request (`requestPrincipals`, `request.auth.*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestAuth {
    /// `<iss>/<sub>`.
    pub principal: String,
    /// `aud`.
    pub audiences: Vec<String>,
    /// `azp`, if present.
    pub presenter: Option<String>,
    /// The token's claims (`request.auth.claims[a][b]`: a string, or a list of strings,
    /// any of which may match; other kinds of value match nothing).
    pub claims: Map<String, Value>,
}

/// Why a request was allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// No enforced ALLOW policy applies (and no DENY matched).
    NoAllowPolicy,
    /// This ALLOW rule matched: the first one that did, in the order the policies were
    /// given (Envoy names the one whose name sorts first, in dynamic metadata only).
    ByRule(MatchedRule),
}

/// Authorizes a request against the policies that apply to its destination (see the module
/// docs); `observer` is told of every matching dry-run policy.
///
/// A denial says what Envoy reports ([`Denied::details`]): the DENY rule that matched (of
/// several, the one whose Envoy name, `ns[<ns>]-policy[<name>]-rule[<i>]`, sorts first, as
/// Envoy's RBAC filter keeps its policies in a sorted map), or none when ALLOW policies
/// exist and none matched.
pub fn authorize_request<P: Borrow<Authorization>>(
    policies: &[P],
    ctx: &RbacContext,
    req: &RequestAttributes<'_>,
    observer: &dyn RbacObserver,
) -> Result<Allowed, Denied> {
    let peer = Peer::new(ctx);
    let seen = Seen::new(&peer, req);
    let policies = policies.iter().map(Borrow::borrow);

    let mut denied_by: Option<MatchedRule> = None;
    for p in policies.clone() {
        if p.dry_run {
            if seen.first_rule(p).is_some() {
                tracing::info!(policy = %p.key(), action = %p.action, "dry-run policy matched the request (not enforced)");
                observer.dry_run_matched(p);
            }
            continue;
        }
        if p.action != PolicyAction::Deny {
            continue;
        }
        for (i, rule) in p.rules.iter().enumerate() {
            if !rule_matches(rule, |m| seen.object(m, true)) {
                continue;
            }
            let candidate = MatchedRule::of(p, i);
            if denied_by
                .as_ref()
                .is_none_or(|d| candidate.cmp_envoy_name(d) == Ordering::Less)
            {
                denied_by = Some(candidate);
            }
        }
    }
    if let Some(rule) = denied_by {
        tracing::debug!(policy = %rule.key(), rule = rule.rule, "request denied by policy");
        return Err(Denied {
            reason: format!("explicitly denied by: {}", rule.key()),
            policy: Some(rule.key()),
            matched_rule: Some(rule),
        });
    }

    let mut enforced_allow = false;
    for p in policies.filter(|p| p.action == PolicyAction::Allow && !p.dry_run) {
        enforced_allow = true;
        if let Some(i) = seen.first_rule(p) {
            tracing::debug!(policy = %p.key(), rule = i, "request allowed by policy");
            return Ok(Allowed::ByRule(MatchedRule::of(p, i)));
        }
    }
    if !enforced_allow {
        return Ok(Allowed::NoAllowPolicy);
    }
    Err(Denied {
        reason: DENIED_BY_ALLOW.into(),
        policy: None,
        matched_rule: None,
    })
}

/// The request and its connection as the match fields see them.
struct Seen<'a> {
    peer: &'a Peer<'a>,
    req: &'a RequestAttributes<'a>,
    /// The host without its port. A host is compared both without its port and as
    /// received: `example.com` matches `Example.com:8080`, and a host written with a port
    /// matches that port only.
    host: &'a str,
    /// The remote address, an IPv4-mapped IPv6 address as IPv4 (as IP blocks are).
    remote_ip: IpAddr,
}

impl<'a> Seen<'a> {
    fn new(peer: &'a Peer<'a>, req: &'a RequestAttributes<'a>) -> Self {
        Seen {
            peer,
            req,
            host: host_without_port(req.host),
            remote_ip: req.remote_ip.to_canonical(),
        }
    }

    /// The index of the first rule of `p` that matches.
    fn first_rule(&self, p: &Authorization) -> Option<usize> {
        let deny = p.action == PolicyAction::Deny;
        p.rules
            .iter()
            .position(|rule| rule_matches(rule, |m| self.object(m, deny)))
    }

    /// A match object: it has an entry, and its L4 fields (as the node proxy evaluates
    /// them) and its L7 attributes all pass. `deny`: the policy is a DENY (for what cannot
    /// be evaluated).
    fn object(&self, m: &RbacMatch, deny: bool) -> bool {
        let l7 = m.l7.as_deref();
        let has_entries = !m.has_no_l4_field() || l7.is_some_and(L7Attributes::has_entries);
        has_entries && match_fields(m, self.peer) && l7.is_none_or(|a| self.l7(a, deny))
    }

    fn l7(&self, a: &L7Attributes, deny: bool) -> bool {
        let req = self.req;
        opt_family(&a.paths, &a.not_paths, |p| p.matches(req.path))
            && opt_family(&a.methods, &a.not_methods, |m| m.matches(req.method))
            && opt_family(&a.hosts, &a.not_hosts, |m| {
                matches_ignore_case(m, self.host) || matches_ignore_case(m, req.host)
            })
            && opt_family(&a.request_principals, &a.not_request_principals, |m| {
                req.auth.is_some_and(|au| m.matches(&au.principal))
            })
            && opt_family(&a.headers, &a.not_headers, |h| {
                self.header(&h.name)
                    .is_some_and(|v| matches_bytes(&h.value, &v))
            })
            && opt_family(&a.remote_ips, &a.not_remote_ips, |b| {
                b.net().contains(&self.remote_ip)
            })
            && a.when.iter().flatten().all(|c| self.condition(c, deny))
    }

    /// A `when` condition: its values (some must match) and notValues (none may).
    fn condition(&self, c: &Condition, deny: bool) -> bool {
        let ctx = self.peer.ctx;
        match c {
            // Envoy's filter metadata: no proxy of ambit's has it, so the condition cannot
            // be evaluated. Fail closed: it never lets an ALLOW match (allow less), and it
            // always holds for a DENY (deny more).
            Condition::Text(TextKey::EnvoyFilter(_), _) => deny,
            Condition::Text(key, v) => self.text_condition(key, v),
            Condition::Ip(key, v) => {
                let ip = match key {
                    IpKey::SourceIp => ctx.source_ip,
                    IpKey::RemoteIp => self.remote_ip,
                    IpKey::DestinationIp => ctx.destination.ip(),
                };
                values(v, |b| b.net().contains(&ip))
            }
            Condition::DestinationPort(v) => values(v, |p| *p == ctx.destination.port()),
        }
    }

    fn text_condition(&self, key: &TextKey, v: &Values<StringMatch>) -> bool {
        let id = self.peer.ctx.source_identity.as_ref();
        let auth = self.req.auth;
        let one = |s: Option<&str>| values(v, |m| s.is_some_and(|s| m.matches(s)));
        match key {
            TextKey::RequestHeader(name) => {
                let value = self.header(name);
                values(v, |m| value.as_ref().is_some_and(|h| matches_bytes(m, h)))
            }
            TextKey::SourceNamespace => one(id.map(|i| i.namespace())),
            TextKey::SourceServiceAccount => {
                let sa = id.map(|i| format!("{}/{}", i.namespace(), i.service_account()));
                one(sa.as_deref())
            }
            TextKey::SourceTrustDomain => one(id.map(|i| i.trust_domain())),
            TextKey::SourcePrincipal => one(self.peer.principal()),
            TextKey::RequestAuthPrincipal => one(auth.map(|a| a.principal.as_str())),
            TextKey::RequestAuthAudiences => values(v, |m| {
                auth.is_some_and(|a| a.audiences.iter().any(|aud| m.matches(aud)))
            }),
            TextKey::RequestAuthPresenter => one(auth.and_then(|a| a.presenter.as_deref())),
            TextKey::RequestAuthClaim(path) => {
                let claim = auth.and_then(|a| claim(&a.claims, path));
                values(v, |m| {
                    claim.is_some_and(|c| claim_strings(c).any(|s| m.matches(s)))
                })
            }
            TextKey::ConnectionSni => one(self.req.sni),
            TextKey::EnvoyFilter(_) => false, // handled by `condition`
        }
    }

    /// A request header's value by name (any case); a repeated header's values joined with
    /// `,`. The pseudo-headers: `:authority` (and `host`, which is the same thing, however
    /// the request carried it) is the host as received, `:method` the method, `:path` the
    /// normalised path with its query; any other is absent.
    fn header(&self, name: &str) -> Option<Cow<'a, [u8]>> {
        let req = self.req;
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        if is(":authority") || is("host") {
            return Some(Cow::Borrowed(req.host.as_bytes()));
        }
        if is(":method") {
            return Some(Cow::Borrowed(req.method.as_bytes()));
        }
        if is(":path") {
            return Some(match req.query {
                None => Cow::Borrowed(req.path.as_bytes()),
                Some(q) => Cow::Owned(format!("{}?{q}", req.path).into_bytes()),
            });
        }
        if name.starts_with(':') {
            return None;
        }
        let mut all = req.headers.get_all(name).iter();
        let first = all.next()?;
        let Some(second) = all.next() else {
            return Some(Cow::Borrowed(first.as_bytes()));
        };
        let mut joined = [first, second].map(|v| v.as_bytes()).join(&b","[..]);
        for v in all {
            joined.push(b',');
            joined.extend_from_slice(v.as_bytes());
        }
        Some(Cow::Owned(joined))
    }
}

/// [`family`] for an L7 attribute (unset: no constraint, as an empty list).
fn opt_family<T>(pos: &Option<Vec<T>>, neg: &Option<Vec<T>>, f: impl Fn(&T) -> bool) -> bool {
    family(
        pos.as_deref().unwrap_or_default(),
        neg.as_deref().unwrap_or_default(),
        f,
    )
}

/// [`family`] for a condition's lists.
fn values<T>(v: &Values<T>, f: impl Fn(&T) -> bool) -> bool {
    opt_family(&v.values, &v.not_values, f)
}

/// `host[:port]` → `host`; `[v6]:port` → `[v6]`. Anything else is kept whole.
fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

/// A string match over bytes (a header value need not be UTF-8).
fn matches_bytes(m: &StringMatch, v: &[u8]) -> bool {
    match m {
        StringMatch::Exact(x) => v == x.as_bytes(),
        StringMatch::Prefix(x) => v.starts_with(x.as_bytes()),
        StringMatch::Suffix(x) => v.ends_with(x.as_bytes()),
        StringMatch::Presence => !v.is_empty(),
    }
}

/// A string match ignoring ASCII case (hosts).
fn matches_ignore_case(m: &StringMatch, v: &str) -> bool {
    let v = v.as_bytes();
    match m {
        StringMatch::Exact(x) => v.eq_ignore_ascii_case(x.as_bytes()),
        StringMatch::Prefix(x) => v
            .get(..x.len())
            .is_some_and(|h| h.eq_ignore_ascii_case(x.as_bytes())),
        StringMatch::Suffix(x) => v
            .len()
            .checked_sub(x.len())
            .is_some_and(|start| v[start..].eq_ignore_ascii_case(x.as_bytes())),
        StringMatch::Presence => !v.is_empty(),
    }
}

/// The claim at `path` (`[a][b]`: claim `a`, then its member `b`).
fn claim<'c>(claims: &'c Map<String, Value>, path: &[String]) -> Option<&'c Value> {
    let (first, rest) = path.split_first()?;
    rest.iter()
        .try_fold(claims.get(first)?, |v, k| v.as_object()?.get(k))
}

/// The strings a claim holds: itself, or the strings of a list.
fn claim_strings(v: &Value) -> impl Iterator<Item = &str> {
    let (one, list) = match v {
        Value::String(s) => (Some(s.as_str()), None),
        Value::Array(l) => (None, Some(l.iter().filter_map(Value::as_str))),
        _ => (None, None),
    };
    one.into_iter().chain(list.into_iter().flatten())
}

#[cfg(test)]
mod tests;
