//! Table tests of reading RequestAuthentications: every field of a JWT rule into the model
//! with its defaults, the targets (as an AuthorizationPolicy's), what is skipped, and the
//! refusals with their exact line, column and field.

use std::time::Duration;

use http::header::HeaderName;

use super::*;

fn parse(text: &str) -> Parsed {
    parse_documents("a.yaml", text, &ParseOptions::default())
}

/// The one RequestAuthentication `text` holds (no refusal, nothing skipped).
fn authn(text: &str) -> WaypointAuthn {
    let p = parse(text);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    assert!(p.policies.is_empty(), "{:?}", p.policies);
    assert_eq!(p.authns.len(), 1, "{text}");
    p.authns.into_iter().next().unwrap().value
}

/// The one rule of a RequestAuthentication of [`HEAD`] and the rule `rule`.
fn rule(rule: &str) -> JwtRuleSpec {
    let a = authn(&with_rule(rule));
    assert_eq!(a.rules.len(), 1);
    a.rules.into_iter().next().unwrap()
}

fn refusal(text: &str) -> String {
    let p = parse(text);
    assert!(p.authns.is_empty(), "{:?}", p.authns);
    assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
    p.errors[0].to_string()
}

const HEAD: &str = "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: jwt, namespace: shop}\nspec:\n  targetRefs: [{kind: Service, group: \"\", name: reviews}]\n";

/// A RequestAuthentication of `HEAD` and one rule written as the YAML flow map `rule`
/// (on line 7).
fn with_rule(rule: &str) -> String {
    format!("{HEAD}  jwtRules:\n  - {rule}\n")
}

fn name(s: &'static str) -> HeaderName {
    HeaderName::from_static(s)
}

fn svc(name: &str) -> PolicyTarget {
    PolicyTarget::Service {
        namespace: "shop".into(),
        name: name.into(),
    }
}

#[test]
fn a_request_authentication_with_every_field() {
    let text = "\
apiVersion: security.istio.io/v1beta1
kind: RequestAuthentication
metadata:
  name: reviews-jwt
  namespace: shop
  labels: {app: reviews}
spec:
  targetRefs:
  - {kind: Service, group: \"\", name: reviews}
  - {kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}
  jwtRules:
  - issuer: https://issuer.example.com
    audiences: [reviews, \"api.example.com\"]
    jwksUri: https://issuer.example.com:8443/.well-known/jwks.json
    fromHeaders:
    - {name: X-Jwt-Assertion, prefix: \"Bearer \"}
    - {name: x-raw-token}
    fromParams: [token, jwt]
    fromCookies: [session]
    forwardOriginalToken: true
    outputPayloadToHeader: X-Jwt-Payload
    outputClaimToHeaders:
    - {header: x-jwt-sub, claim: sub}
    - {header: X_Group, claim: nested.key.group}
    timeout: 1.5s
  - issuer: other@example.com
    jwks: '{\"keys\": []}'
";
    let a = authn(text);
    assert_eq!(
        (a.namespace.as_str(), a.name.as_str()),
        ("shop", "reviews-jwt")
    );
    assert_eq!(a.key(), "shop/reviews-jwt");
    assert_eq!(
        a.targets,
        vec![
            svc("reviews"),
            PolicyTarget::Gateway {
                namespace: "shop".into(),
                name: "waypoint".into()
            }
        ]
    );
    assert_eq!(a.rules.len(), 2);
    let r = &a.rules[0];
    assert_eq!(r.issuer, "https://issuer.example.com");
    assert_eq!(r.audiences, ["reviews", "api.example.com"]);
    assert_eq!(
        r.jwks,
        JwksSource::Uri(
            "https://issuer.example.com:8443/.well-known/jwks.json"
                .parse()
                .unwrap()
        )
    );
    // Header names lower-cased; a prefix kept as written, none is empty.
    assert_eq!(
        r.from_headers,
        vec![
            JwtHeader {
                name: name("x-jwt-assertion"),
                prefix: "Bearer ".into()
            },
            JwtHeader {
                name: name("x-raw-token"),
                prefix: String::new()
            },
        ]
    );
    assert_eq!(r.from_params, ["token", "jwt"]);
    assert_eq!(r.from_cookies, ["session"]);
    assert!(!r.uses_default_locations());
    assert!(r.forward_original_token);
    assert_eq!(r.output_payload_to_header, Some(name("x-jwt-payload")));
    assert_eq!(
        r.output_claim_to_headers,
        vec![
            ClaimToHeader {
                header: name("x-jwt-sub"),
                claim: "sub".into()
            },
            ClaimToHeader {
                header: name("x_group"),
                claim: "nested.key.group".into()
            },
        ]
    );
    assert_eq!(r.timeout, Duration::from_millis(1500));
    assert_eq!(a.rules[1].issuer, "other@example.com");
    assert_eq!(a.rules[1].jwks, JwksSource::Inline("{\"keys\": []}".into()));
}

/// What is left out takes Istio's defaults: the default token locations, no audiences (the
/// service's name), keys found through the issuer's discovery document, the token
/// removed before the request goes upstream, no output headers, a 5 s JWKS fetch.
#[test]
fn defaults() {
    let r = rule("{issuer: iss}");
    assert_eq!(
        r,
        JwtRuleSpec {
            issuer: "iss".into(),
            audiences: vec![],
            jwks: JwksSource::Discovery,
            from_headers: vec![],
            from_params: vec![],
            from_cookies: vec![],
            forward_original_token: false,
            output_payload_to_header: None,
            output_claim_to_headers: vec![],
            timeout: Duration::from_secs(5),
        }
    );
    assert!(r.uses_default_locations());
    assert_eq!(DEFAULT_JWKS_TIMEOUT, Duration::from_secs(5));
    // Any one location written replaces the defaults.
    assert!(!rule("{issuer: iss, fromCookies: [c]}").uses_default_locations());
    assert!(!rule("{issuer: iss, fromParams: [p]}").uses_default_locations());
    // The CRD's other name for jwksUri; plain http is allowed (as in Istio).
    assert_eq!(
        rule("{issuer: iss, jwks_uri: \"http://keys.shop:8080/jwks\"}").jwks,
        JwksSource::Uri("http://keys.shop:8080/jwks".parse().unwrap())
    );
    // No rules: attached, and checks nothing.
    assert!(authn(HEAD).rules.is_empty());
    let a = authn(&format!("{HEAD}  jwtRules: []\n"));
    assert_eq!((a.targets.len(), a.rules.len()), (1, 0));
}

/// Targets are read as an AuthorizationPolicy's: the namespace's own, GatewayClass only
/// from the root namespace, the deprecated singular form.
#[test]
fn targets() {
    let doc = |ns: &str, refs: &str| {
        format!("apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: a, namespace: {ns}}}\nspec:\n  {refs}\n  jwtRules: [{{issuer: iss}}]\n")
    };
    let table: Vec<(&str, &str, Vec<PolicyTarget>)> = vec![
        (
            "shop",
            "targetRefs: [{kind: Service, name: a}, {kind: Service, group: core, name: b}]",
            vec![svc("a"), svc("b")],
        ),
        (
            "shop",
            "targetRefs: [{kind: ServiceEntry, group: networking.istio.io, name: egress}]",
            vec![PolicyTarget::ServiceEntry {
                namespace: "shop".into(),
                name: "egress".into(),
            }],
        ),
        ("shop", "targetRef: {kind: Service, name: a}", vec![svc("a")]),
        (
            "istio-system",
            "targetRefs: [{kind: GatewayClass, group: gateway.networking.k8s.io, name: istio-waypoint}]",
            vec![PolicyTarget::GatewayClass {
                name: "istio-waypoint".into(),
            }],
        ),
    ];
    for (ns, refs, want) in table {
        assert_eq!(authn(&doc(ns, refs)).targets, want, "{refs}");
    }
    // Without metadata.namespace: the default namespace.
    let a = authn("apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: a}\nspec: {targetRefs: [{kind: Service, name: web}]}\n");
    assert_eq!(a.namespace, "default");
    assert_eq!(
        a.targets,
        vec![PolicyTarget::Service {
            namespace: "default".into(),
            name: "web".into()
        }]
    );
    let refused = [
        (
            doc(
                "shop",
                "targetRefs: [{kind: GatewayClass, group: gateway.networking.k8s.io, name: istio-waypoint}]",
            ),
            "a.yaml:5:23: spec.targetRefs[0].kind: a GatewayClass target is honoured only in the root namespace (\"istio-system\"), and this policy is in \"shop\"",
        ),
        (
            doc("shop", "targetRefs: [{kind: Service, name: a, namespace: other}]"),
            "a.yaml:5:52: spec.targetRefs[0].namespace: must not be set: a policy attaches only to targets in its own namespace (Istio refuses cross-namespace targetRefs)",
        ),
        (
            doc("shop", "targetRefs: [{kind: Deployment, group: apps, name: a}]"),
            "a.yaml:5:23: spec.targetRefs[0].kind: a waypoint's policy cannot target a \"Deployment\"; the kinds are Gateway and GatewayClass (gateway.networking.k8s.io), Service (core group, \"\") and ServiceEntry (networking.istio.io)",
        ),
        (
            doc("shop", "selector: {matchLabels: {app: a}}\n  targetRef: {kind: Service, name: a}"),
            "a.yaml:5:13: spec.selector: set either selector (a workload's policy) or targetRefs (a waypoint's), not both",
        ),
    ];
    for (text, want) in refused {
        assert_eq!(refusal(&text), want, "{text}");
    }
}

/// A RequestAuthentication with a selector, or neither selector nor targets, is for
/// sidecars and gateways: skipped, not refused; its rules are still checked.
#[test]
fn selector_and_namespace_wide_ones_are_skipped() {
    let text = "\
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: by-selector, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  jwtRules: [{issuer: iss, jwksUri: \"https://keys.example.com/jwks\"}]
---
apiVersion: security.istio.io/v1beta1
kind: RequestAuthentication
metadata: {name: whole-namespace, namespace: shop}
spec:
  jwtRules: [{issuer: iss}]
";
    let p = parse(text);
    assert!(p.authns.is_empty() && p.errors.is_empty(), "{p:?}");
    let shown: Vec<(String, SkipReason, usize)> = p
        .skipped
        .iter()
        .map(|s| (s.value.to_string(), s.value.reason, s.origin.line))
        .collect();
    assert_eq!(
        shown,
        [
            (
                "security.istio.io/v1 RequestAuthentication shop/by-selector: selects workloads (spec.selector): for their sidecars and gateways, not for a waypoint".to_string(),
                SkipReason::AuthnSelector,
                1
            ),
            (
                "security.istio.io/v1beta1 RequestAuthentication shop/whole-namespace: has no targetRefs: it applies to the namespace's sidecars and gateways, not to a waypoint".to_string(),
                SkipReason::AuthnNamespaceWide,
                8
            ),
        ]
    );
    let bad = text.replace("issuer: iss, jwksUri", "issuer: \"\", jwksUri");
    assert_eq!(
        refusal(&bad),
        "a.yaml:6:23: spec.jwtRules[0].issuer: must not be empty: a token's iss must equal it"
    );
}

/// A RequestAuthentication and an AuthorizationPolicy may share a name; two
/// RequestAuthentications may not (v1 and v1beta1 are one object).
#[test]
fn duplicates_are_per_kind() {
    let ra = |version: &str, target: &str| {
        format!("apiVersion: security.istio.io/{version}\nkind: RequestAuthentication\nmetadata: {{name: same, namespace: shop}}\nspec: {{targetRefs: [{{kind: Service, name: {target}}}]}}\n")
    };
    let ap = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: same, namespace: shop}\nspec: {targetRefs: [{kind: Service, name: web}]}\n";
    let text = [ra("v1", "a"), ap.into(), ra("v1beta1", "b")].join("---\n");
    let p = parse(&text);
    assert_eq!(p.policies.len(), 1);
    assert_eq!(p.authns.len(), 1);
    assert_eq!(p.authns[0].value.targets, vec![svc("a")]);
    assert_eq!(
        p.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["a.yaml:13:18: metadata.name: RequestAuthentication shop/same is defined again; the first definition (a.yaml:1) is kept"]
    );
    assert_eq!(p.errors[0].kind, ErrorKind::Duplicate);
}

/// A refused RequestAuthentication says what it is, so that the waypoint can fail closed
/// for what it would have attached to; an AuthorizationPolicy or a route is not one.
#[test]
fn a_refusal_names_a_request_authentication() {
    let p = parse(&with_rule("{issuer: iss, fromParams: [\"\"]}"));
    assert_eq!(p.errors.len(), 1);
    let object = p.errors[0].object.as_ref().expect("names its object");
    assert_eq!(object.kind.as_deref(), Some("RequestAuthentication"));
    assert_eq!(object.key.as_deref(), Some("shop/jwt"));
    assert!(object.is_authn() && !object.is_route());
    // Refused before its name is read: still known by its kind.
    let p = parse("apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: Bad_Name}\n");
    let object = p.errors[0].object.as_ref().unwrap();
    assert!(object.is_authn(), "{object:?}");
    for other in [
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {bogus: 1}\n",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec: {bogus: 1}\n",
        "kind: [\n",
    ] {
        let p = parse(other);
        assert_eq!(p.errors.len(), 1, "{other}");
        assert!(
            !p.errors[0].object.as_ref().is_some_and(ObjectRef::is_authn),
            "{other}"
        );
    }
}

/// An inline key set of 256 KiB is read; one byte more is refused.
#[test]
fn inline_key_sets_are_bounded() {
    let doc = |len: usize| with_rule(&format!("{{issuer: iss, jwks: \"{}\"}}", "k".repeat(len)));
    assert_eq!(
        rule(&format!(
            "{{issuer: iss, jwks: \"{}\"}}",
            "k".repeat(MAX_INLINE_JWKS_BYTES)
        ))
        .jwks,
        JwksSource::Inline("k".repeat(MAX_INLINE_JWKS_BYTES))
    );
    assert_eq!(MAX_INLINE_JWKS_BYTES, 256 * 1024);
    assert_eq!(
        refusal(&doc(MAX_INLINE_JWKS_BYTES + 1)),
        "a.yaml:7:25: spec.jwtRules[0].jwks: is 262145 bytes; an inline key set is at most 262144 bytes (256 KiB): serve a larger one at a jwksUri"
    );
}

/// Istio's checks (its CRD's and its webhook's), and this reader's stricter ones, each
/// refused at its field's line and column.
#[test]
fn refusals_name_the_field() {
    let table: Vec<(String, &str)> = vec![
        (
            with_rule("{issuer: iss, jwksUri: \"https://a.example/k\", jwks: \"{}\"}"),
            "a.yaml:7:57: spec.jwtRules[0].jwks: set only one of jwksUri and jwks; jwksUri is set too",
        ),
        (
            with_rule("{issuer: iss, jwks_uri: \"https://a.example/k\", jwksUri: \"https://a.example/k\"}"),
            "a.yaml:7:29: spec.jwtRules[0].jwks_uri: set only one of jwksUri and jwks; jwksUri is set too",
        ),
        (
            with_rule("{issuer: iss, jwksUri: \"ftp://a.example/k\"}"),
            "a.yaml:7:28: spec.jwtRules[0].jwksUri: \"ftp://a.example/k\" must be an http:// or https:// URL",
        ),
        (
            with_rule("{issuer: iss, jwksUri: \"/jwks.json\"}"),
            "a.yaml:7:28: spec.jwtRules[0].jwksUri: \"/jwks.json\" must be an http:// or https:// URL",
        ),
        (
            with_rule("{issuer: iss, jwksUri: \"https://a b/k\"}"),
            "a.yaml:7:28: spec.jwtRules[0].jwksUri: \"https://a b/k\" is not a URL: invalid uri character",
        ),
        (
            with_rule("{issuer: iss, jwksUri: \"\"}"),
            "a.yaml:7:28: spec.jwtRules[0].jwksUri: must be 1-2048 characters",
        ),
        (
            with_rule(&format!("{{issuer: iss, jwksUri: \"https://a.example/{}\"}}", "k".repeat(2031))),
            "a.yaml:7:28: spec.jwtRules[0].jwksUri: must be 1-2048 characters",
        ),
        (
            with_rule("{issuer: iss, jwks: \"\"}"),
            "a.yaml:7:25: spec.jwtRules[0].jwks: must not be empty; leave it out to find the keys through the issuer's OpenID discovery",
        ),
        (
            with_rule("{audiences: [a]}"),
            "a.yaml:7:5: spec.jwtRules[0]: missing field `issuer`",
        ),
        (
            with_rule("{issuer: iss, audiences: [a, \"\"]}"),
            "a.yaml:7:34: spec.jwtRules[0].audiences[1]: must not be empty",
        ),
        (
            with_rule("{issuer: iss, audiences: [1]}"),
            "a.yaml:7:31: spec.jwtRules[0].audiences[0]: invalid type: integer `1`, expected a string (a string: quote numbers and booleans)",
        ),
        (
            with_rule("{issuer: iss, fromHeaders: [{prefix: \"Bearer \"}]}"),
            "a.yaml:7:33: spec.jwtRules[0].fromHeaders[0]: missing field `name`",
        ),
        (
            with_rule("{issuer: iss, fromHeaders: [{name: \"\"}]}"),
            "a.yaml:7:40: spec.jwtRules[0].fromHeaders[0].name: \"\" is not a header name: 1-256 letters, digits or !#$%&'*+-.^_`|~ (no ':' pseudo-headers)",
        ),
        (
            with_rule("{issuer: iss, fromHeaders: [{name: \":authority\"}]}"),
            "a.yaml:7:40: spec.jwtRules[0].fromHeaders[0].name: \":authority\" is not a header name: 1-256 letters, digits or !#$%&'*+-.^_`|~ (no ':' pseudo-headers)",
        ),
        (
            with_rule("{issuer: iss, fromHeaders: [{name: a, prefix: \"Bearer\\x01\"}]}"),
            "a.yaml:7:51: spec.jwtRules[0].fromHeaders[0].prefix: \"Bearer\\u{1}\" has a control character, which no header value holds, so no token would be found",
        ),
        (
            with_rule("{issuer: iss, fromHeaders: [{name: a, perfix: x}]}"),
            "a.yaml:7:43: spec.jwtRules[0].fromHeaders[0].perfix: unknown field `perfix`, expected `name` or `prefix`",
        ),
        (
            with_rule("{issuer: iss, fromParams: [\"\"]}"),
            "a.yaml:7:32: spec.jwtRules[0].fromParams[0]: must not be empty",
        ),
        (
            with_rule("{issuer: iss, fromCookies: [ok, \"\"]}"),
            "a.yaml:7:37: spec.jwtRules[0].fromCookies[1]: must not be empty",
        ),
        (
            with_rule("{issuer: iss, fromCookies: [\"a;b\"]}"),
            "a.yaml:7:33: spec.jwtRules[0].fromCookies[0]: \"a;b\" is not a cookie name (letters, digits or !#$%&'*+-.^_`|~)",
        ),
        (
            with_rule("{issuer: iss, forwardOriginalToken: \"true\"}"),
            "a.yaml:7:41: spec.jwtRules[0].forwardOriginalToken: invalid type: string \"true\", expected a boolean",
        ),
        (
            with_rule("{issuer: iss, outputPayloadToHeader: \"x y\"}"),
            "a.yaml:7:42: spec.jwtRules[0].outputPayloadToHeader: \"x y\" is not a header name: 1-256 letters, digits or !#$%&'*+-.^_`|~ (no ':' pseudo-headers)",
        ),
        (
            with_rule("{issuer: iss, outputPayloadToHeader: \"\"}"),
            "a.yaml:7:42: spec.jwtRules[0].outputPayloadToHeader: must not be empty; leave it out to send no payload upstream",
        ),
        (
            with_rule("{issuer: iss, outputPayloadToHeader: Content-Length}"),
            "a.yaml:7:42: spec.jwtRules[0].outputPayloadToHeader: \"Content-Length\" frames or routes the request; a token's payload or claims cannot set it",
        ),
        (
            with_rule("{issuer: iss, outputClaimToHeaders: [{header: x.sub, claim: sub}]}"),
            "a.yaml:7:51: spec.jwtRules[0].outputClaimToHeaders[0].header: \"x.sub\" is not a header name here: letters, digits, '-' and '_'",
        ),
        (
            with_rule("{issuer: iss, outputClaimToHeaders: [{header: host, claim: sub}]}"),
            "a.yaml:7:51: spec.jwtRules[0].outputClaimToHeaders[0].header: \"host\" frames or routes the request; a token's payload or claims cannot set it",
        ),
        (
            with_rule("{issuer: iss, outputClaimToHeaders: [{header: x-a, claim: a}, {header: X-A, claim: b}]}"),
            "a.yaml:7:76: spec.jwtRules[0].outputClaimToHeaders[1].header: \"X-A\" is named twice; each claim goes to its own header",
        ),
        (
            with_rule("{issuer: iss, outputClaimToHeaders: [{header: x-a, claim: \"\"}]}"),
            "a.yaml:7:63: spec.jwtRules[0].outputClaimToHeaders[0].claim: must not be empty",
        ),
        (
            with_rule("{issuer: iss, outputClaimToHeaders: [{header: x-a}]}"),
            "a.yaml:7:42: spec.jwtRules[0].outputClaimToHeaders[0]: missing field `claim`",
        ),
        (
            with_rule("{issuer: iss, timeout: 5}"),
            "a.yaml:7:28: spec.jwtRules[0].timeout: invalid type: integer `5`, expected a string (a string: quote numbers and booleans)",
        ),
        (
            with_rule("{issuer: iss, timeout: 5sec}"),
            "a.yaml:7:28: spec.jwtRules[0].timeout: \"5sec\" is not a duration (unknown unit); write numbers with a unit h, m, s, ms, us or ns, like 5s, 1.5s, 1m30s or 250ms",
        ),
        (
            with_rule("{issuer: iss, timeout: 500us}"),
            "a.yaml:7:28: spec.jwtRules[0].timeout: \"500us\" is shorter than 1ms",
        ),
        (
            with_rule("{issuer: iss, presence: REQUIRED}"),
            "a.yaml:7:29: spec.jwtRules[0].presence: is not supported by this waypoint, and it changes which requests pass; remove it (the RequestAuthentication is refused while it is there)",
        ),
        (
            with_rule("{issuer: iss, spaceDelimitedClaims: [scope]}"),
            "a.yaml:7:41: spec.jwtRules[0].spaceDelimitedClaims: is not supported by this waypoint, and it changes which requests pass; remove it (the RequestAuthentication is refused while it is there)",
        ),
        (
            with_rule("{issuer: iss, jwksURI: \"https://a.example/k\"}"),
            "a.yaml:7:19: spec.jwtRules[0].jwksURI: unknown field `jwksURI`, expected one of `issuer`, `audiences`, `jwksUri`, `jwks_uri`, `jwks`, `fromHeaders`, `fromParams`, `fromCookies`, `forwardOriginalToken`, `outputPayloadToHeader`, `outputClaimToHeaders`, `timeout`, `spaceDelimitedClaims`, `presence`, `failedStatusInMetadata`",
        ),
        (
            format!("{HEAD}  jwtRule: [{{issuer: iss}}]\n"),
            "a.yaml:6:3: spec.jwtRule: unknown field `jwtRule`, expected one of `selector`, `targetRef`, `targetRefs`, `jwtRules`",
        ),
        (
            format!("{HEAD}  jwtRules:\n  - ~\n"),
            "a.yaml:7:5: spec.jwtRules[0]: invalid type: unit value, expected struct JwtRuleFields",
        ),
        (
            format!("{HEAD}  jwtRules:\n{}", "  - {issuer: i}\n".repeat(4097)),
            "a.yaml:7:3: spec.jwtRules: at most 4096 rules",
        ),
        (
            "apiVersion: security.istio.io/v1alpha1\nkind: RequestAuthentication\nmetadata: {name: a}\n".into(),
            "a.yaml:1:13: apiVersion: RequestAuthentication has no version \"v1alpha1\"; the versions are v1, v1beta1",
        ),
        (
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: a, namespace: Shop}\n".into(),
            "a.yaml:3:32: metadata.namespace: \"Shop\" is not a Kubernetes name: 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit",
        ),
    ];
    let wrong: Vec<String> = table
        .iter()
        .filter_map(|(text, want)| {
            let p = parse(text);
            let errors: Vec<String> = p.errors.iter().map(ToString::to_string).collect();
            let got = format!("{} read, refused: {}", p.authns.len(), errors.join(" | "));
            let want = format!("0 read, refused: {want}");
            (got != want).then(|| format!("got  {got}\nwant {want}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
