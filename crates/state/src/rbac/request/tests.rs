//! Request authorization: every L7 attribute and its negation against requests it admits and
//! requests it does not, as ALLOW and as DENY; the decision (DENY first, dry runs, which rule
//! is reported); and the node proxy's L4 verdicts on the same policies, unchanged.

use std::cell::RefCell;
use std::net::IpAddr;

use ambit_identity::SpiffeId;
use http::{HeaderMap, HeaderValue};

use super::*;
use crate::local_schema::parse_local_config;
use crate::rbac::{authorize_observed, Unobserved};

/// A request and its connection, owned, for the tables.
struct Req {
    ctx: RbacContext,
    method: &'static str,
    path: &'static str,
    query: Option<&'static str>,
    host: &'static str,
    headers: HeaderMap,
    remote_ip: IpAddr,
    auth: Option<RequestAuth>,
    sni: Option<&'static str>,
}

impl Req {
    /// `GET Example.com:8080 /api/v1/items?x=1` from `default/client` (10.0.0.2) to
    /// 10.0.0.3:8080, on behalf of 192.168.1.7 (the remote client): headers `x-a: one`,
    /// `x-a: two`, `user-agent: curl/8.0`, `x-bin` (not UTF-8), `x-empty` (empty).
    fn base() -> Req {
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("one"));
        headers.append("x-a", HeaderValue::from_static("two"));
        headers.append("user-agent", HeaderValue::from_static("curl/8.0"));
        headers.append("x-bin", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        headers.append("x-empty", HeaderValue::from_static(""));
        Req {
            ctx: RbacContext {
                source_identity: Some(
                    SpiffeId::parse("spiffe://cluster.local/ns/default/sa/client").unwrap(),
                ),
                source_ip: "10.0.0.2".parse().unwrap(),
                destination: "10.0.0.3:8080".parse().unwrap(),
            },
            method: "GET",
            path: "/api/v1/items",
            query: Some("x=1"),
            host: "Example.com:8080",
            headers,
            remote_ip: "192.168.1.7".parse().unwrap(),
            auth: None,
            sni: None,
        }
    }

    /// [`Req::base`] with a validated JWT.
    fn authed() -> Req {
        let claims = serde_json::json!({
            "sub": "alice",
            "groups": ["dev", "ops"],
            "org": {"team": "core"},
            "num": 7,
        });
        Req {
            auth: Some(RequestAuth {
                principal: "https://issuer.example/alice".into(),
                audiences: vec!["a1".into(), "a2".into()],
                presenter: Some("web".into()),
                claims: claims.as_object().unwrap().clone(),
            }),
            ..Req::base()
        }
    }

    /// A JWT without `azp`.
    fn no_presenter() -> Req {
        let mut r = Req::authed();
        if let Some(a) = r.auth.as_mut() {
            a.presenter = None;
        }
        r
    }

    /// [`Req::base`] over plaintext: no peer identity.
    fn anon() -> Req {
        let mut r = Req::base();
        r.ctx.source_identity = None;
        r
    }

    /// [`Req::base`] on a TLS connection with SNI `api.example.com`.
    fn sni() -> Req {
        Req {
            sni: Some("api.example.com"),
            ..Req::base()
        }
    }

    /// [`Req::base`] whose remote address came as an IPv4-mapped IPv6 address.
    fn mapped_remote() -> Req {
        Req {
            remote_ip: "::ffff:192.168.1.7".parse().unwrap(),
            ..Req::base()
        }
    }

    /// `POST /admin` with `Host: admin.example.com` and no query.
    fn admin_post() -> Req {
        Req {
            method: "POST",
            path: "/admin",
            query: None,
            host: "admin.example.com",
            ..Req::base()
        }
    }

    fn attrs(&self) -> RequestAttributes<'_> {
        RequestAttributes {
            method: self.method,
            path: self.path,
            query: self.query,
            host: self.host,
            headers: &self.headers,
            remote_ip: self.remote_ip,
            auth: self.auth.as_ref(),
            sni: self.sni,
        }
    }

    fn check(&self, policies: &[Authorization]) -> Result<Allowed, Denied> {
        authorize_request(policies, &self.ctx, &self.attrs(), &Unobserved)
    }
}

/// One policy `default/<name>` from its rules (flow YAML).
fn named(name: &str, namespace: &str, action: &str, dry_run: bool, rules: &str) -> Authorization {
    let yaml = format!(
        "policies:\n- {{name: {name}, namespace: {namespace}, scope: Global, action: {action}, dryRun: {dry_run}, rules: {rules}}}\n"
    );
    parse_local_config("t", &yaml)
        .unwrap_or_else(|e| panic!("{rules}: {e}"))
        .policies
        .remove(0)
}

fn policy(action: &str, rules: &str) -> Authorization {
    named("p", "default", action, false, rules)
}

/// One rule of one clause of one match object.
fn one(obj: &str) -> String {
    format!("[[[{obj}]]]")
}

/// (match object, request, matches as ALLOW, matches as DENY).
type FieldRow = (&'static str, fn() -> Req, bool, bool);

/// Every L7 attribute and its negation, every `when` key, with the L4 fields beside them:
/// (match object, request, matches as ALLOW, matches as DENY). Each row is checked as the
/// only rule of an ALLOW policy (allowed iff it matches) and of a DENY policy (denied iff it
/// matches).
fn field_table() -> Vec<FieldRow> {
    let b: fn() -> Req = Req::base;
    type Row = (&'static str, fn() -> Req, bool);
    let rows: Vec<Row> = vec![
        // Paths: the normalised path without its query; string forms and templates.
        (r#"{paths: ["/api/v1/items"]}"#, b, true),
        (r#"{paths: ["/api/v1/items/"]}"#, b, false),
        (r#"{paths: ["/api/*"]}"#, b, true),
        (r#"{paths: ["/API/*"]}"#, b, false),
        (r#"{paths: ["*/items"]}"#, b, true),
        (r#"{paths: ["*"]}"#, b, true),
        (r#"{paths: ["/api"]}"#, b, false),
        (r#"{paths: ["/admin", "/api/*"]}"#, b, true),
        (r#"{notPaths: ["/api/*"]}"#, b, false),
        (r#"{notPaths: ["/admin*"]}"#, b, true),
        (r#"{paths: ["/api/{*}/items"]}"#, b, true),
        (r#"{paths: ["/{*}/items"]}"#, b, false),
        (r#"{paths: ["/api/{**}"]}"#, b, true),
        (r#"{paths: ["/{**}/items"]}"#, b, true),
        (r#"{paths: ["/api/v1/items/{*}"]}"#, b, false),
        (r#"{notPaths: ["/api/{**}"]}"#, b, false),
        (r#"{notPaths: ["/admin/{**}"]}"#, b, true),
        // Methods, case-sensitive.
        ("{methods: [GET]}", b, true),
        ("{methods: [POST, PUT]}", b, false),
        (r#"{methods: ["G*"]}"#, b, true),
        ("{notMethods: [GET]}", b, false),
        ("{notMethods: [POST, PUT]}", b, true),
        // Hosts: case-insensitive, the request's port stripped (and also as received).
        ("{hosts: [example.com]}", b, true),
        ("{hosts: [EXAMPLE.COM]}", b, true),
        (r#"{hosts: ["*.com"]}"#, b, true),
        (r#"{hosts: ["EXAMPLE.*"]}"#, b, true),
        (r#"{hosts: ["*.example.com"]}"#, b, false),
        ("{hosts: [other.com]}", b, false),
        (r#"{hosts: ["example.com:8080"]}"#, b, true),
        (r#"{hosts: ["example.com:9090"]}"#, b, false),
        ("{notHosts: [example.com]}", b, false),
        ("{notHosts: [other.com]}", b, true),
        ("{hosts: [admin.example.com]}", Req::admin_post, true),
        // Request principals: `<iss>/<sub>` of the JWT; none without one.
        (r#"{requestPrincipals: ["*"]}"#, b, false),
        (r#"{notRequestPrincipals: ["*"]}"#, b, true),
        (r#"{requestPrincipals: ["*"]}"#, Req::authed, true),
        (
            r#"{requestPrincipals: ["https://issuer.example/alice"]}"#,
            Req::authed,
            true,
        ),
        (
            r#"{requestPrincipals: ["https://issuer.example/*"]}"#,
            Req::authed,
            true,
        ),
        (r#"{requestPrincipals: ["*/bob"]}"#, Req::authed, false),
        (r#"{notRequestPrincipals: ["*/alice"]}"#, Req::authed, false),
        (r#"{notRequestPrincipals: ["*/bob"]}"#, Req::authed, true),
        // Headers: names in any case, repeated values joined with ',', bytes compared.
        (r#"{headers: {x-a: "one,two"}}"#, b, true),
        ("{headers: {x-a: one}}", b, false),
        ("{headers: {x-a: two}}", b, false),
        (r#"{headers: {x-a: "one*"}}"#, b, true),
        (r#"{headers: {X-A: "*,two"}}"#, b, true),
        (r#"{headers: {User-Agent: "curl/*"}}"#, b, true),
        (r#"{headers: {x-missing: "*"}}"#, b, false),
        (r#"{notHeaders: {x-missing: "*"}}"#, b, true),
        (r#"{notHeaders: {x-a: "*"}}"#, b, false),
        (r#"{notHeaders: {x-a: "one"}}"#, b, true),
        (r#"{headers: {x-bin: "*"}}"#, b, true),
        (r#"{headers: {x-empty: "*"}}"#, b, false),
        // Entries OR.
        (r#"{headers: {x-a: nope, user-agent: "curl*"}}"#, b, true),
        (r#"{headers: {x-a: nope, user-agent: nope}}"#, b, false),
        // Pseudo-headers; `host` is the authority however it came.
        (r#"{headers: {":authority": "Example.com:8080"}}"#, b, true),
        (r#"{headers: {host: "Example.com*"}}"#, b, true),
        (r#"{headers: {":method": GET}}"#, b, true),
        (r#"{headers: {":path": "/api/v1/items?x=1"}}"#, b, true),
        (r#"{headers: {":path": "/admin"}}"#, Req::admin_post, true),
        (r#"{headers: {":scheme": "*"}}"#, b, false),
        // Remote IPs: the original client, not the peer.
        (r#"{remoteIps: ["192.168.1.0/24"]}"#, b, true),
        (r#"{remoteIps: ["192.168.1.7"]}"#, b, true),
        (r#"{remoteIps: ["10.0.0.2"]}"#, b, false),
        (r#"{notRemoteIps: ["192.168.0.0/16"]}"#, b, false),
        (r#"{notRemoteIps: ["10.0.0.0/8"]}"#, b, true),
        (
            r#"{remoteIps: ["192.168.1.0/24"]}"#,
            Req::mapped_remote,
            true,
        ),
        // L4 fields are evaluated as the node proxy evaluates them, and AND with L7 ones.
        (r#"{sourceIps: ["10.0.0.2"]}"#, b, true),
        (r#"{sourceIps: ["192.168.1.7"]}"#, b, false),
        ("{namespaces: [{exact: default}], methods: [GET]}", b, true),
        ("{namespaces: [{exact: other}], methods: [GET]}", b, false),
        (
            "{namespaces: [{exact: default}], methods: [POST]}",
            b,
            false,
        ),
        (
            "{destinationPorts: [8080], notPaths: [\"/admin\"]}",
            b,
            true,
        ),
        (
            "{destinationPorts: [9090], notPaths: [\"/admin\"]}",
            b,
            false,
        ),
        // Empty lists constrain nothing; a match object with no entry never matches.
        ("{paths: []}", b, false),
        ("{paths: [], when: []}", b, false),
        ("{paths: [], methods: [GET]}", b, true),
        ("{notMethods: [], namespaces: [{exact: default}]}", b, true),
        // when: request.headers.
        (
            r#"{when: [{key: "request.headers[x-a]", values: ["one,two"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: "request.headers[X-A]", values: ["one"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: "request.headers[x-a]", notValues: ["one,two"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: "request.headers[x-missing]", values: ["*"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: "request.headers[x-missing]", notValues: ["*"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: "request.headers[:authority]", values: ["example.com*"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: "request.headers[:authority]", values: ["Example.com*"]}]}"#,
            b,
            true,
        ),
        // when: IPs.
        (
            r#"{when: [{key: source.ip, values: ["10.0.0.0/8"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: source.ip, values: ["192.168.1.7"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: remote.ip, values: ["192.168.1.7"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: remote.ip, notValues: ["192.168.0.0/16"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: destination.ip, values: ["10.0.0.3"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: destination.ip, values: ["10.0.0.4"]}]}"#,
            b,
            false,
        ),
        // when: the destination port.
        (
            r#"{when: [{key: destination.port, values: ["8080"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: destination.port, values: ["80", "443"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: destination.port, notValues: ["8080"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: destination.port, notValues: ["80"]}]}"#,
            b,
            true,
        ),
        // when: the peer's identity.
        (
            "{when: [{key: source.namespace, values: [default]}]}",
            b,
            true,
        ),
        (
            "{when: [{key: source.namespace, values: [other]}]}",
            b,
            false,
        ),
        (
            r#"{when: [{key: source.namespace, values: ["*"]}]}"#,
            Req::anon,
            false,
        ),
        (
            r#"{when: [{key: source.namespace, notValues: ["*"]}]}"#,
            Req::anon,
            true,
        ),
        (
            r#"{when: [{key: source.serviceAccount, values: ["default/client"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: source.serviceAccount, values: ["default/*"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: source.serviceAccount, values: [client]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: source.serviceAccount, values: ["*"]}]}"#,
            Req::anon,
            false,
        ),
        (
            "{when: [{key: source.trustDomain, values: [cluster.local]}]}",
            b,
            true,
        ),
        (
            "{when: [{key: source.trustDomain, values: [other.td]}]}",
            b,
            false,
        ),
        (
            r#"{when: [{key: source.trustDomain, notValues: ["*"]}]}"#,
            Req::anon,
            true,
        ),
        (
            r#"{when: [{key: source.principal, values: ["cluster.local/ns/default/sa/client"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: source.principal, values: ["*/sa/other"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: source.principal, values: ["*"]}]}"#,
            Req::anon,
            false,
        ),
        // when: request.auth.* (no JWT: values never match, notValues pass).
        (
            r#"{when: [{key: request.auth.principal, values: ["*"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: request.auth.principal, notValues: ["*"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: request.auth.principal, values: ["https://issuer.example/alice"]}]}"#,
            Req::authed,
            true,
        ),
        (
            "{when: [{key: request.auth.audiences, values: [a2]}]}",
            Req::authed,
            true,
        ),
        (
            "{when: [{key: request.auth.audiences, values: [a3]}]}",
            Req::authed,
            false,
        ),
        (
            "{when: [{key: request.auth.audiences, notValues: [a1]}]}",
            Req::authed,
            false,
        ),
        (
            r#"{when: [{key: request.auth.audiences, values: ["*"]}]}"#,
            b,
            false,
        ),
        (
            "{when: [{key: request.auth.presenter, values: [web]}]}",
            Req::authed,
            true,
        ),
        (
            r#"{when: [{key: request.auth.presenter, values: ["*"]}]}"#,
            Req::no_presenter,
            false,
        ),
        (
            r#"{when: [{key: request.auth.presenter, notValues: ["*"]}]}"#,
            Req::no_presenter,
            true,
        ),
        (
            r#"{when: [{key: "request.auth.claims[groups]", values: [ops]}]}"#,
            Req::authed,
            true,
        ),
        (
            r#"{when: [{key: "request.auth.claims[groups]", values: [admin]}]}"#,
            Req::authed,
            false,
        ),
        (
            r#"{when: [{key: "request.auth.claims[groups]", notValues: [dev]}]}"#,
            Req::authed,
            false,
        ),
        (
            r#"{when: [{key: "request.auth.claims[sub]", values: [alice]}]}"#,
            Req::authed,
            true,
        ),
        (
            r#"{when: [{key: "request.auth.claims[org][team]", values: [core]}]}"#,
            Req::authed,
            true,
        ),
        (
            r#"{when: [{key: "request.auth.claims[org][team]", values: [edge]}]}"#,
            Req::authed,
            false,
        ),
        (
            r#"{when: [{key: "request.auth.claims[org]", values: ["*"]}]}"#,
            Req::authed,
            false,
        ),
        (
            r#"{when: [{key: "request.auth.claims[num]", values: ["7"]}]}"#,
            Req::authed,
            false,
        ),
        (
            r#"{when: [{key: "request.auth.claims[missing]", notValues: ["*"]}]}"#,
            Req::authed,
            true,
        ),
        (
            r#"{when: [{key: "request.auth.claims[sub]", values: ["*"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: "request.auth.claims[sub]", notValues: ["*"]}]}"#,
            b,
            true,
        ),
        // when: connection.sni.
        (
            r#"{when: [{key: connection.sni, values: ["*"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: connection.sni, notValues: ["*"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: connection.sni, values: ["*.example.com"]}]}"#,
            Req::sni,
            true,
        ),
        (
            r#"{when: [{key: connection.sni, notValues: [api.example.com]}]}"#,
            Req::sni,
            false,
        ),
        // Conditions AND; values and notValues of one condition AND.
        (
            r#"{when: [{key: source.namespace, values: [default]}, {key: destination.port, values: ["80"]}]}"#,
            b,
            false,
        ),
        (
            r#"{when: [{key: source.namespace, values: [default]}, {key: destination.port, values: ["8080"]}]}"#,
            b,
            true,
        ),
        (
            r#"{when: [{key: destination.port, values: ["8080"], notValues: ["8080"]}]}"#,
            b,
            false,
        ),
    ];
    let mut table: Vec<FieldRow> = rows.into_iter().map(|(o, r, w)| (o, r, w, w)).collect();
    // Envoy's filter metadata cannot be evaluated: an ALLOW never matches, a DENY always.
    for obj in [
        r#"{when: [{key: "experimental.envoy.filters.network.mysql_proxy[db.table]", values: ["[update]"]}]}"#,
        r#"{when: [{key: "experimental.envoy.filters.a.b[c]", notValues: ["*"]}]}"#,
        r#"{methods: [GET], when: [{key: "experimental.envoy.filters.a.b[c]", values: [x]}]}"#,
    ] {
        table.push((obj, b, false, true));
    }
    // ...but the rest of the match object still decides.
    table.push((
        r#"{methods: [POST], when: [{key: "experimental.envoy.filters.a.b[c]", values: [x]}]}"#,
        b,
        false,
        false,
    ));
    table
}

#[test]
fn every_field_and_its_negation() {
    let mut failures = Vec::new();
    for (obj, req, want_allow, want_deny) in field_table() {
        let req = req();
        let rules = one(obj);
        let allowed = req.check(&[policy("Allow", &rules)]).is_ok();
        if allowed != want_allow {
            failures.push(format!("ALLOW {obj}: allowed {allowed}, want {want_allow}"));
        }
        let denied = req.check(&[policy("Deny", &rules)]).is_err();
        if denied != want_deny {
            failures.push(format!("DENY {obj}: denied {denied}, want {want_deny}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Rules OR, clauses AND, the match objects of a clause OR, as the L4 evaluation has them.
#[test]
fn rule_structure() {
    let yes = "{methods: [GET]}";
    let no = "{methods: [POST]}";
    let req = Req::base();
    let cases: Vec<(String, bool)> = vec![
        ("[]".into(), false),
        ("[[]]".into(), true),
        ("[[[]]]".into(), true),
        ("[[[{}]]]".into(), false),
        (format!("[[[{no}, {yes}]]]"), true),
        (format!("[[[{yes}], [{no}]]]"), false),
        (format!("[[[{yes}], [{yes}]]]"), true),
        (format!("[[[{no}]], [[{yes}]]]"), true),
        (format!("[[[{no}]], [[{no}]]]"), false),
    ];
    for (rules, want) in cases {
        assert_eq!(
            req.check(&[policy("Allow", &rules)]).is_ok(),
            want,
            "{rules}"
        );
    }
}

/// A rule whose index is `i` of `n` rules, only that one matching `req`.
fn rules_matching_only(n: usize, matching: &[usize]) -> String {
    let rules: Vec<String> = (0..n)
        .map(|i| {
            let m = if matching.contains(&i) { "GET" } else { "PUT" };
            format!("[[{{methods: [{m}]}}]]")
        })
        .collect();
    format!("[{}]", rules.join(", "))
}

type Verdict = Result<Allowed, (&'static str, String)>;

fn verdict(r: Result<Allowed, Denied>) -> Result<Allowed, (String, String)> {
    r.map_err(|d| (d.reason.clone(), d.details()))
}

/// The decision: DENY before ALLOW, what an allow and a denial carry, which DENY rule a
/// denial names when several match (Envoy's: the name that sorts first, byte for byte).
#[test]
fn decision_and_details() {
    let req = Req::base();
    let yes = one("{methods: [GET]}");
    let no = one("{methods: [POST]}");
    let allow = |name: &str, rules: &str| named(name, "default", "Allow", false, rules);
    let deny = |name: &str, ns: &str, rules: &str| named(name, ns, "Deny", false, rules);
    let by_rule = |name: &str, rule| {
        Ok(Allowed::ByRule(MatchedRule {
            namespace: "default".into(),
            name: name.into(),
            rule,
        }))
    };
    let none: Verdict = Err((
        "allow policies exist, but none allowed",
        "rbac_access_denied_matched_policy[none]".into(),
    ));
    let denied = |key: &'static str, envoy: &str| -> Verdict {
        Err((key, format!("rbac_access_denied_matched_policy[{envoy}]")))
    };
    let cases: Vec<(&str, Vec<Authorization>, Verdict)> = vec![
        ("no policies", vec![], Ok(Allowed::NoAllowPolicy)),
        ("allow matches", vec![allow("a", &yes)], by_rule("a", 0)),
        (
            "the second rule of an allow matches",
            vec![allow("a", &rules_matching_only(3, &[1, 2]))],
            by_rule("a", 1),
        ),
        (
            "the first allow that matches, in the order given",
            vec![allow("z", &no), allow("y", &yes), allow("x", &yes)],
            by_rule("y", 0),
        ),
        ("allow misses", vec![allow("a", &no)], none.clone()),
        ("allow without rules", vec![allow("a", "[]")], none.clone()),
        (
            "deny misses",
            vec![deny("d", "default", &no)],
            Ok(Allowed::NoAllowPolicy),
        ),
        (
            "deny matches",
            vec![deny("d", "default", &yes)],
            denied(
                "explicitly denied by: default/d",
                "ns[default]-policy[d]-rule[0]",
            ),
        ),
        (
            "deny beats allow",
            vec![allow("a", &yes), deny("d", "default", &yes)],
            denied(
                "explicitly denied by: default/d",
                "ns[default]-policy[d]-rule[0]",
            ),
        ),
        (
            "deny misses, allow matches",
            vec![deny("d", "default", &no), allow("a", &yes)],
            by_rule("a", 0),
        ),
        (
            "the index of the deny rule that matched",
            vec![deny("d", "default", &rules_matching_only(3, &[2]))],
            denied(
                "explicitly denied by: default/d",
                "ns[default]-policy[d]-rule[2]",
            ),
        ),
        (
            "of two deny rules, rule[10] sorts before rule[2]",
            vec![deny("d", "default", &rules_matching_only(11, &[2, 10]))],
            denied(
                "explicitly denied by: default/d",
                "ns[default]-policy[d]-rule[10]",
            ),
        ),
        (
            "of two deny policies, the name that sorts first, not the first given",
            vec![deny("b", "default", &yes), deny("a", "default", &yes)],
            denied(
                "explicitly denied by: default/a",
                "ns[default]-policy[a]-rule[0]",
            ),
        ),
        (
            "names sort as Envoy's strings: ns[x-y] before ns[x]",
            vec![deny("d", "x", &yes), deny("d", "x-y", &yes)],
            denied("explicitly denied by: x-y/d", "ns[x-y]-policy[d]-rule[0]"),
        ),
        (
            "a deny that misses does not take the report",
            vec![deny("a", "default", &no), deny("b", "default", &yes)],
            denied(
                "explicitly denied by: default/b",
                "ns[default]-policy[b]-rule[0]",
            ),
        ),
    ];
    let mut failures = Vec::new();
    for (name, policies, want) in cases {
        let got = verdict(req.check(&policies));
        let want = want.map_err(|(r, d)| (r.to_string(), d));
        if got != want {
            failures.push(format!("{name}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// The denial names the policy and rule it matched.
#[test]
fn a_deny_match_carries_its_rule() {
    let p = named(
        "block",
        "shop",
        "Deny",
        false,
        &rules_matching_only(2, &[1]),
    );
    let d = Req::base().check(&[p]).unwrap_err();
    assert_eq!(d.policy.as_deref(), Some("shop/block"));
    assert_eq!(
        d.matched_rule,
        Some(MatchedRule {
            namespace: "shop".into(),
            name: "block".into(),
            rule: 1
        })
    );
    assert_eq!(
        d.details(),
        "rbac_access_denied_matched_policy[ns[shop]-policy[block]-rule[1]]"
    );
    assert_eq!(d.to_string(), "explicitly denied by: shop/block");
}

/// Dry-run policies: every one that matches is told to the observer, in the order given,
/// whatever the verdict (even when an enforced DENY refuses); none changes the verdict.
#[test]
fn dry_run_is_reported_not_enforced() {
    let req = Req::base();
    let yes = one("{paths: [\"/api/*\"]}");
    let no = one("{paths: [\"/admin\"]}");
    let dry = |name: &str, action: &str, rules: &str| named(name, "default", action, true, rules);
    let enforced = |name: &str, action: &str, rules: &str| policy_named(name, action, rules);
    let cases: Vec<(&str, Vec<Authorization>, bool, Vec<&str>)> = vec![
        (
            "a dry-run deny that matches allows",
            vec![dry("dd", "Deny", &yes)],
            true,
            vec!["default/dd"],
        ),
        (
            "a dry-run allow alone is no allow policy",
            vec![dry("da", "Allow", &no)],
            true,
            vec![],
        ),
        (
            "a dry-run allow that matches does not allow",
            vec![dry("da", "Allow", &yes), enforced("a", "Allow", &no)],
            false,
            vec!["default/da"],
        ),
        (
            "dry runs are reported when an enforced deny refuses",
            vec![
                dry("da", "Allow", &yes),
                enforced("d", "Deny", &yes),
                dry("dd", "Deny", &yes),
                dry("miss", "Deny", &no),
            ],
            false,
            vec!["default/da", "default/dd"],
        ),
        (
            "and when an enforced allow admits",
            vec![
                enforced("a", "Allow", &yes),
                dry("dd", "Deny", &yes),
                dry("da", "Allow", &yes),
            ],
            true,
            vec!["default/dd", "default/da"],
        ),
        (
            "envoy filter conditions in dry runs: a deny matches, an allow does not",
            vec![
                dry(
                    "dd",
                    "Deny",
                    &one("{when: [{key: \"experimental.envoy.filters.a[b]\", values: [x]}]}"),
                ),
                dry(
                    "da",
                    "Allow",
                    &one("{when: [{key: \"experimental.envoy.filters.a[b]\", values: [x]}]}"),
                ),
            ],
            true,
            vec!["default/dd"],
        ),
    ];
    for (name, policies, want_allowed, want_seen) in cases {
        let seen = RefCell::new(Vec::new());
        let got = authorize_request(&policies, &req.ctx, &req.attrs(), &|p: &Authorization| {
            seen.borrow_mut().push(p.key())
        });
        assert_eq!(got.is_ok(), want_allowed, "{name}: {got:?}");
        assert_eq!(seen.into_inner(), want_seen, "{name}");
    }
}

fn policy_named(name: &str, action: &str, rules: &str) -> Authorization {
    named(name, "default", action, false, rules)
}

/// The node proxy's L4 evaluation of the same policies is unchanged: it cannot see L7
/// attributes and fails closed (an ALLOW rule using one never matches; a DENY is enforced
/// on its L4 fields alone), where the request evaluation decides on them.
#[test]
fn l4_evaluation_of_the_same_policies_is_unchanged() {
    let req = Req::base();
    let deny = |key: &'static str| Err(format!("explicitly denied by: {key}"));
    let none: Result<(), String> = Err("allow policies exist, but none allowed".into());
    // (action, rules, L4 verdict, request verdict)
    type Case = (&'static str, String, Result<(), String>, Result<(), String>);
    let cases: Vec<Case> = vec![
        ("Allow", one("{paths: [\"/api/*\"]}"), none.clone(), Ok(())),
        (
            "Allow",
            one("{methods: [POST]}"),
            none.clone(),
            none.clone(),
        ),
        (
            "Allow",
            one("{namespaces: [{exact: default}], hosts: [example.com]}"),
            none.clone(),
            Ok(()),
        ),
        (
            "Allow",
            one("{namespaces: [{exact: default}]}"),
            Ok(()),
            Ok(()),
        ),
        (
            "Deny",
            one("{paths: [\"/admin\"]}"),
            deny("default/p"),
            Ok(()),
        ),
        (
            "Deny",
            one("{paths: [\"/api/*\"]}"),
            deny("default/p"),
            deny("default/p"),
        ),
        (
            "Deny",
            one("{namespaces: [{exact: other}], paths: [\"/api/*\"]}"),
            Ok(()),
            Ok(()),
        ),
        (
            "Deny",
            one("{namespaces: [{exact: default}], notMethods: [GET]}"),
            deny("default/p"),
            Ok(()),
        ),
        (
            "Deny",
            one("{when: [{key: source.namespace, values: [other]}]}"),
            deny("default/p"),
            Ok(()),
        ),
    ];
    let mut failures = Vec::new();
    for (action, rules, want_l4, want_req) in cases {
        let p = [policy(action, &rules)];
        let l4 = authorize_observed(&p, &req.ctx, &Unobserved).map_err(|d| d.reason);
        let by_req = req.check(&p).map(drop).map_err(|d| d.reason);
        if l4 != want_l4 || by_req != want_req {
            failures.push(format!(
                "{action} {rules}: L4 {l4:?} (want {want_l4:?}), request {by_req:?} (want {want_req:?})"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// The L4 evaluation's denial names its DENY rule too (the first that matched).
#[test]
fn an_l4_deny_carries_its_rule() {
    let req = Req::base();
    let rules = "[[[{namespaces: [{exact: other}]}]], [[{namespaces: [{exact: default}]}]]]";
    let d = authorize_observed(&[policy("Deny", rules)], &req.ctx, &Unobserved).unwrap_err();
    assert_eq!(
        d.details(),
        "rbac_access_denied_matched_policy[ns[default]-policy[p]-rule[1]]"
    );
    let d =
        authorize_observed(&[policy("Allow", rules)], &Req::anon().ctx, &Unobserved).unwrap_err();
    assert_eq!(d.details(), "rbac_access_denied_matched_policy[none]");
}

#[test]
fn host_port_is_stripped() {
    for (host, want) in [
        ("example.com", "example.com"),
        ("example.com:8080", "example.com"),
        ("example.com:", "example.com"),
        ("[fd00::1]:8080", "[fd00::1]"),
        ("[fd00::1]", "[fd00::1]"),
        ("10.0.0.1:80", "10.0.0.1"),
        ("fd00::1", "fd00::1"),
        ("example.com:http", "example.com:http"),
        ("[fd00::1", "[fd00::1"),
    ] {
        assert_eq!(host_without_port(host), want, "{host}");
    }
}
