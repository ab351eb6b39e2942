//! Table tests of the decision: tokens signed in the test with keys generated in the test,
//! against rules built as the waypoint builds them.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::{json, Value};

use super::*;
use crate::fetch::{FetchConfig, RemoteJwks};
use crate::jwks::Alg;
use crate::rule::{JwtSpec, KeySource, RuleError};
use crate::testkeys::{jwks, TestKey};

const NOW: u64 = 1_700_000_000;
const ISS: &str = "https://issuer.example";

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

fn spec() -> JwtSpec {
    JwtSpec {
        issuer: ISS.into(),
        ..JwtSpec::default()
    }
}

fn rule_with(spec: JwtSpec, keys: &[Value]) -> JwtRule {
    JwtRule::new(spec, KeySource::inline(&jwks(keys))).unwrap()
}

/// A rule for [`ISS`] trusting the RS256 test key.
fn rs_rule(spec: JwtSpec) -> JwtRule {
    rule_with(spec, &[rs().jwk()])
}

fn rs() -> TestKey {
    TestKey::new(Alg::RS256, "k1")
}

fn claims() -> Value {
    json!({"iss": ISS, "sub": "alice", "exp": NOW + 3600, "iat": NOW})
}

fn with(mut base: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn bearer(token: &str) -> HeaderMap {
    headers(&[("authorization", &format!("Bearer {token}"))])
}

fn run(rules: &[JwtRule], h: &HeaderMap, query: Option<&str>) -> Outcome {
    authenticate(rules, h, query, now())
}

fn refused(outcome: &Outcome) -> Reason {
    match outcome {
        Outcome::Refused(r) => r.reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn authenticated(outcome: Outcome) -> (RequestAuth, HeaderEdits) {
    match outcome {
        Outcome::Authenticated { auth, edits } => (auth, edits),
        other => panic!("expected authenticated, got {other:?}"),
    }
}

fn is_no_token(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::NoToken { .. })
}

const ALL_ALGS: [Alg; 9] = [
    Alg::RS256,
    Alg::RS384,
    Alg::RS512,
    Alg::PS256,
    Alg::PS384,
    Alg::PS512,
    Alg::ES256,
    Alg::ES384,
    Alg::EdDSA,
];

#[test]
fn every_algorithm_family_verifies_and_a_forgery_does_not() {
    for alg in ALL_ALGS {
        let key = TestKey::new(alg, "k");
        for jwk in [key.jwk(), key.jwk_with_alg()] {
            let rules = [rule_with(spec(), std::slice::from_ref(&jwk))];
            let token = key.token(&claims());
            let (auth, _) = authenticated(run(&rules, &bearer(&token), None));
            assert_eq!(auth.principal, format!("{ISS}/alice"), "{alg}");

            // The same token with its last signature byte changed.
            let (signed, sig) = token.rsplit_once('.').unwrap();
            let mut sig = crate::b64::decode(sig.as_bytes()).unwrap();
            *sig.last_mut().unwrap() ^= 1;
            let forged = format!("{signed}.{}", crate::b64::encode(&sig));
            assert_eq!(
                refused(&run(&rules, &bearer(&forged), None)),
                Reason::VerificationFailed,
                "{alg}"
            );
        }
    }
}

#[test]
fn refusals_name_envoys_reason() {
    let key = rs();
    let good_header = crate::b64::encode(br#"{"alg":"RS256","kid":"k1"}"#);
    let good_payload = crate::b64::encode(claims().to_string().as_bytes());
    let part = |s: &str| crate::b64::encode(s.as_bytes());
    let signed_header = |h: Value| key.token_with_header(&h, &claims());
    let signed_claims = |c: Value| key.token(&c);
    let cases: Vec<(&str, String, Reason)> = vec![
        ("one section", "abc".into(), Reason::BadFormat),
        ("two sections", "abc.def".into(), Reason::BadFormat),
        ("four sections", "a.b.c.d".into(), Reason::BadFormat),
        (
            "an empty signature",
            format!("{good_header}.{good_payload}."),
            Reason::BadFormat,
        ),
        (
            "header not base64",
            format!("a!.{good_payload}.c2ln"),
            Reason::HeaderBadBase64,
        ),
        (
            "header not JSON",
            format!("{}.{good_payload}.c2ln", part("{x")),
            Reason::HeaderBadJson,
        ),
        (
            "header a JSON list",
            format!("{}.{good_payload}.c2ln", part("[1]")),
            Reason::HeaderBadJson,
        ),
        (
            "no alg",
            format!("{}.{good_payload}.c2ln", part("{}")),
            Reason::HeaderBadAlg,
        ),
        (
            "alg not a string",
            signed_header(json!({"alg": 1})),
            Reason::HeaderBadAlg,
        ),
        (
            "alg none",
            signed_header(json!({"alg": "none"})),
            Reason::HeaderAlgNotImplemented,
        ),
        (
            "alg HS256",
            signed_header(json!({"alg": "HS256"})),
            Reason::HeaderAlgNotImplemented,
        ),
        (
            "kid a number",
            signed_header(json!({"alg": "RS256", "kid": 7})),
            Reason::HeaderBadKid,
        ),
        (
            "payload not base64",
            format!("{good_header}.!!.c2ln"),
            Reason::PayloadBadBase64,
        ),
        (
            "payload not JSON",
            format!("{good_header}.{}.c2ln", part("nope")),
            Reason::PayloadBadJson,
        ),
        (
            "iss a number",
            signed_claims(with(claims(), json!({"iss": 1}))),
            Reason::IssNotString,
        ),
        (
            "sub a list",
            signed_claims(with(claims(), json!({"sub": []}))),
            Reason::SubNotString,
        ),
        (
            "iat a string",
            signed_claims(with(claims(), json!({"iat": "x"}))),
            Reason::IatNotInteger,
        ),
        (
            "nbf negative",
            signed_claims(with(claims(), json!({"nbf": -1}))),
            Reason::NbfOutOfRange,
        ),
        (
            "exp a string",
            signed_claims(with(claims(), json!({"exp": "soon"}))),
            Reason::ExpNotInteger,
        ),
        (
            "exp past 2^64",
            signed_claims(with(claims(), json!({"exp": 1e20}))),
            Reason::ExpOutOfRange,
        ),
        (
            "jti a number",
            signed_claims(with(claims(), json!({"jti": 3}))),
            Reason::JtiNotString,
        ),
        (
            "aud a list with a number",
            signed_claims(with(claims(), json!({"aud": ["a", 1]}))),
            Reason::AudNotString,
        ),
        (
            "signature not base64",
            format!("{good_header}.{good_payload}.!!"),
            Reason::SignatureBadBase64,
        ),
        (
            "another issuer",
            signed_claims(with(claims(), json!({"iss": "https://other"}))),
            Reason::UnknownIssuer,
        ),
        (
            "no issuer",
            signed_claims(json!({"sub": "x"})),
            Reason::UnknownIssuer,
        ),
        (
            "expired past the skew",
            signed_claims(with(claims(), json!({"exp": NOW - 61}))),
            Reason::Expired,
        ),
        (
            "not yet valid past the skew",
            signed_claims(with(claims(), json!({"nbf": NOW + 61}))),
            Reason::NotYetValid,
        ),
        (
            "a kid not in the set",
            TestKey::new(Alg::RS256, "k9").token(&claims()),
            Reason::KidAlgMismatch,
        ),
        (
            "signed by another key",
            TestKey::other_rsa(Alg::RS256, "k1").token(&claims()),
            Reason::VerificationFailed,
        ),
        (
            "a payload changed after signing",
            {
                let t = key.token(&claims());
                let parts: Vec<&str> = t.split('.').collect();
                let p = crate::b64::encode(
                    with(claims(), json!({"sub": "mallory"}))
                        .to_string()
                        .as_bytes(),
                );
                format!("{}.{p}.{}", parts[0], parts[2])
            },
            Reason::VerificationFailed,
        ),
        (
            "ES256 header on an RSA key",
            TestKey::new(Alg::ES256, "k1").token(&claims()),
            Reason::VerificationFailed,
        ),
        (
            "too large",
            format!("{good_header}.{}.c2ln", "A".repeat(MAX_TOKEN_BYTES)),
            Reason::TokenTooLarge,
        ),
    ];
    let rules = [rs_rule(spec())];
    for (name, token, want) in cases {
        let outcome = run(&rules, &bearer(&token), None);
        assert_eq!(refused(&outcome), want, "{name}");
        let Outcome::Refused(r) = outcome else {
            unreachable!()
        };
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{name}");
    }
}

#[test]
fn clock_skew_is_allowed_both_ways() {
    let rules = [rs_rule(spec())];
    let key = rs();
    for c in [
        json!({"exp": NOW - 59}),
        json!({"nbf": NOW + 59}),
        json!({"exp": NOW}),
    ] {
        authenticated(run(&rules, &bearer(&key.token(&with(claims(), c))), None));
    }
    // No exp at all is no expiry (as Envoy).
    authenticated(run(
        &rules,
        &bearer(&key.token(&json!({"iss": ISS, "sub": "s"}))),
        None,
    ));
    // A rule's own skew.
    let strict = [rs_rule(JwtSpec {
        clock_skew: Some(Duration::ZERO),
        ..spec()
    })];
    let t = key.token(&with(claims(), json!({"exp": NOW - 1})));
    assert_eq!(refused(&run(&strict, &bearer(&t), None)), Reason::Expired);
}

#[test]
fn alg_and_kid_pick_the_key() {
    let rs256 = TestKey::new(Alg::RS256, "k1");
    let ps256 = TestKey::new(Alg::PS256, "k1");
    // A key pinned to RS256 does not serve a PS256 token: no key matches.
    let pinned = [rule_with(spec(), &[rs256.jwk_with_alg()])];
    assert_eq!(
        refused(&run(&pinned, &bearer(&ps256.token(&claims())), None)),
        Reason::KidAlgMismatch
    );
    // Unpinned, the same RSA key serves both.
    let open = [rule_with(spec(), &[rs256.jwk()])];
    authenticated(run(&open, &bearer(&ps256.token(&claims())), None));
    // A token without kid tries every key; a key without kid matches any kid.
    let es = TestKey::new(Alg::ES256, "e1");
    let both = [rule_with(spec(), &[rs256.jwk(), es.jwk()])];
    let no_kid = es.token_with_header(&json!({"alg": "ES256"}), &claims());
    authenticated(run(&both, &bearer(&no_kid), None));
    let mut kidless = es.jwk();
    kidless.as_object_mut().unwrap().remove("kid");
    let anon = [rule_with(spec(), &[kidless])];
    authenticated(run(&anon, &bearer(&es.token(&claims())), None));
    // An Ed25519 signature of the wrong length.
    let ed = TestKey::new(Alg::EdDSA, "d1");
    let short = format!(
        "{}.{}",
        ed.token(&claims()).rsplit_once('.').unwrap().0,
        crate::b64::encode(&[0; 63])
    );
    let ed_rules = [rule_with(spec(), &[ed.jwk()])];
    assert_eq!(
        refused(&run(&ed_rules, &bearer(&short), None)),
        Reason::Ed25519SignatureWrongLength
    );
}

#[test]
fn audiences() {
    let key = rs();
    let rules = [rs_rule(JwtSpec {
        audiences: vec!["api".into(), "https://svc.example/".into()],
        ..spec()
    })];
    for aud in [
        json!("api"),
        json!(["x", "api"]),
        json!("svc.example"),
        json!("http://api/"),
    ] {
        authenticated(run(
            &rules,
            &bearer(&key.token(&with(claims(), json!({"aud": aud})))),
            None,
        ));
    }
    for aud in [json!("other"), json!([]), json!(["apis"])] {
        let outcome = run(
            &rules,
            &bearer(&key.token(&with(claims(), json!({"aud": aud})))),
            None,
        );
        assert_eq!(refused(&outcome), Reason::AudienceNotAllowed);
        let Outcome::Refused(r) = outcome else {
            unreachable!()
        };
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }
    // No audience in the token and audiences configured: refused.
    assert_eq!(
        refused(&run(&rules, &bearer(&key.token(&claims())), None)),
        Reason::AudienceNotAllowed
    );
    // No audiences configured: any (or none) passes.
    let any = [rs_rule(spec())];
    authenticated(run(
        &any,
        &bearer(&key.token(&with(claims(), json!({"aud": "z"})))),
        None,
    ));
}

#[test]
fn the_identity_is_what_rbac_reads() {
    let rules = [rs_rule(JwtSpec {
        space_delimited_claims: vec!["roles".into()],
        ..spec()
    })];
    let c = with(
        claims(),
        json!({"aud": ["a", "b"], "azp": "web", "scope": "read  write", "roles": "x y",
               "permission": ["p"], "groups": "g h"}),
    );
    let (auth, _) = authenticated(run(&rules, &bearer(&rs().token(&c)), None));
    assert_eq!(auth.principal, format!("{ISS}/alice"));
    assert_eq!(auth.audiences, vec!["a", "b"]);
    assert_eq!(auth.presenter.as_deref(), Some("web"));
    assert_eq!(auth.claims["scope"], json!(["read", "write"]));
    assert_eq!(auth.claims["roles"], json!(["x", "y"]));
    assert_eq!(auth.claims["permission"], json!(["p"]));
    assert_eq!(auth.claims["groups"], json!("g h"));
    assert_eq!(auth.claims["sub"], json!("alice"));
}

#[test]
fn no_token_passes_without_identity() {
    let rules = [rs_rule(spec())];
    let t = rs().token(&claims());
    for h in [
        HeaderMap::new(),
        headers(&[("authorization", "Basic dXNlcjpwdw==")]),
        headers(&[("authorization", &format!("bearer {t}"))]),
        headers(&[("x-other", &format!("Bearer {t}"))]),
    ] {
        assert!(is_no_token(&run(&rules, &h, Some("a=1&token=x"))), "{h:?}");
    }
    // No rules at all: nothing to check.
    assert!(is_no_token(&run(&[], &bearer(&t), None)));
}

#[test]
fn from_headers_and_prefixes() {
    let t = rs().token(&claims());
    let custom = [rs_rule(JwtSpec {
        from_headers: vec![("x-jwt".into(), "Token ".into())],
        ..spec()
    })];
    authenticated(run(
        &custom,
        &headers(&[("x-jwt", &format!("Token {t}"))]),
        None,
    ));
    // The prefix may stand after other text, and spaces after it are skipped.
    authenticated(run(
        &custom,
        &headers(&[("x-jwt", &format!("a, Token   {t}"))]),
        None,
    ));
    // Without the prefix the header holds no token.
    assert!(is_no_token(&run(&custom, &headers(&[("x-jwt", &t)]), None)));
    // Once fromHeaders is given, the defaults are not looked at.
    assert!(is_no_token(&run(
        &custom,
        &bearer(&t),
        Some(&format!("access_token={t}"))
    )));
    // No prefix: the whole value.
    let bare = [rs_rule(JwtSpec {
        from_headers: vec![("x-jwt".into(), String::new())],
        ..spec()
    })];
    authenticated(run(&bare, &headers(&[("x-jwt", &t)]), None));
    assert_eq!(
        refused(&run(
            &bare,
            &headers(&[("x-jwt", &format!("Bearer {t}"))]),
            None
        )),
        Reason::HeaderBadBase64
    );
}

#[test]
fn from_params_and_cookies() {
    let t = rs().token(&claims());
    let default = [rs_rule(spec())];
    let (_, edits) = authenticated(run(
        &default,
        &HeaderMap::new(),
        Some(&format!("a=1&access_token={t}&b=2")),
    ));
    assert_eq!(edits.remove_params, vec!["access_token"]);
    assert_eq!(
        edits
            .strip_query(&format!("a=1&access_token={t}&b=2"))
            .as_deref(),
        Some("a=1&b=2")
    );
    let params = [rs_rule(JwtSpec {
        from_params: vec!["jwt".into()],
        ..spec()
    })];
    authenticated(run(&params, &HeaderMap::new(), Some(&format!("jwt={t}"))));
    assert!(is_no_token(&run(
        &params,
        &HeaderMap::new(),
        Some(&format!("access_token={t}"))
    )));
    assert!(is_no_token(&run(&params, &bearer(&t), None)));
    let cookies = [rs_rule(JwtSpec {
        from_cookies: vec!["session".into()],
        ..spec()
    })];
    let (_, edits) = authenticated(run(
        &cookies,
        &headers(&[("cookie", &format!("a=b; session=\"{t}\""))]),
        None,
    ));
    // Envoy leaves a cookie in place.
    assert!(edits.remove.is_empty() && edits.remove_params.is_empty());
}

#[test]
fn forward_original_token() {
    let t = rs().token(&claims());
    let mut h = bearer(&t);
    h.append("x-keep", HeaderValue::from_static("1"));
    let (_, edits) = authenticated(run(&[rs_rule(spec())], &h, None));
    assert_eq!(edits.remove, vec![http::header::AUTHORIZATION]);
    let mut forwarded = h.clone();
    edits.apply(&mut forwarded);
    assert!(forwarded.get("authorization").is_none());
    assert_eq!(forwarded.get("x-keep").unwrap(), "1");

    let keep = [rs_rule(JwtSpec {
        forward_original_token: true,
        ..spec()
    })];
    let query = format!("access_token={t}");
    let (_, edits) = authenticated(run(&keep, &h, Some(&query)));
    assert!(edits.remove.is_empty() && edits.remove_params.is_empty());
    assert_eq!(edits.strip_query(&query).as_deref(), Some(query.as_str()));
    let mut forwarded = h.clone();
    edits.apply(&mut forwarded);
    assert_eq!(forwarded, h);
}

#[test]
fn output_payload_to_header() {
    let t = rs().token(&claims());
    let payload = t.split('.').nth(1).unwrap().to_string();
    let rules = [rs_rule(JwtSpec {
        output_payload_to_header: "x-jwt-payload".into(),
        ..spec()
    })];
    let mut h = bearer(&t);
    h.append("x-jwt-payload", HeaderValue::from_static("forged"));
    let (_, edits) = authenticated(run(&rules, &h, None));
    edits.apply(&mut h);
    let values: Vec<_> = h.get_all("x-jwt-payload").iter().collect();
    assert_eq!(values, vec![payload.as_str()]);
    // Without a token, the forged header is still removed.
    let mut h = headers(&[("x-jwt-payload", "forged")]);
    let Outcome::NoToken { edits } = run(&rules, &h, None) else {
        panic!("no token expected")
    };
    edits.apply(&mut h);
    assert!(h.get("x-jwt-payload").is_none());
}

#[test]
fn output_claim_to_headers() {
    let pairs = [
        ("x-sub", "sub"),
        ("x-n", "n"),
        ("x-f", "f"),
        ("x-neg", "neg"),
        ("x-b", "b"),
        ("x-nested", "org.team"),
        ("x-obj", "org"),
        ("x-list", "list"),
        ("x-missing", "nope"),
        ("x-empty", "empty"),
        ("x-newline", "nl"),
    ];
    let rules = [rs_rule(JwtSpec {
        output_claim_to_headers: pairs
            .iter()
            .map(|(h, c)| (h.to_string(), c.to_string()))
            .collect(),
        ..spec()
    })];
    let c = with(
        claims(),
        json!({"n": 42, "f": 1.5, "neg": -3, "b": true, "org": {"team": "core"},
               "list": ["a"], "empty": "", "nl": "a\nb"}),
    );
    let (_, edits) = authenticated(run(&rules, &bearer(&rs().token(&c)), None));
    let added: Vec<(String, String)> = edits
        .add
        .iter()
        .map(|(h, v)| (h.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let want: Vec<(String, String)> = [
        ("x-sub", "alice"),
        ("x-n", "42"),
        ("x-f", "1.500000"),
        ("x-neg", "-3.000000"),
        ("x-b", "true"),
        ("x-nested", "core"),
    ]
    .iter()
    .map(|(h, v)| (h.to_string(), v.to_string()))
    .collect();
    assert_eq!(added, want);
    // Every output header is sanitised, written or not.
    assert_eq!(edits.sanitize.len(), pairs.len());
}

#[test]
fn every_token_of_a_rule_must_be_valid() {
    let key = rs();
    let good = key.token(&claims());
    let expired = key.token(&with(claims(), json!({"exp": NOW - 3600})));
    let rules = [rs_rule(spec())];
    // A good header token and a bad query token: refused.
    assert_eq!(
        refused(&run(
            &rules,
            &bearer(&good),
            Some(&format!("access_token={expired}"))
        )),
        Reason::Expired
    );
    // Two good tokens: both stripped, the identity from the first found.
    let other = key.token(&with(claims(), json!({"sub": "bob"})));
    let (auth, edits) = authenticated(run(
        &rules,
        &bearer(&good),
        Some(&format!("access_token={other}")),
    ));
    assert_eq!(auth.principal, format!("{ISS}/alice"));
    assert_eq!(edits.remove, vec![http::header::AUTHORIZATION]);
    assert_eq!(edits.remove_params, vec!["access_token"]);
    // Two Authorization headers, one bad.
    let mut h = bearer(&good);
    h.append(
        "authorization",
        HeaderValue::from_str("Bearer garbage").unwrap(),
    );
    assert_eq!(refused(&run(&rules, &h, None)), Reason::BadFormat);
    // More tokens than the bound.
    let mut h = HeaderMap::new();
    for _ in 0..=MAX_TOKENS {
        h.append(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {good}")).unwrap(),
        );
    }
    assert_eq!(refused(&run(&rules, &h, None)), Reason::TooManyTokens);
}

#[test]
fn several_rules_match_tokens_by_issuer_and_location() {
    let a = TestKey::new(Alg::RS256, "a");
    let b = TestKey::new(Alg::ES256, "b");
    let spec_for = |iss: &str| JwtSpec {
        issuer: iss.into(),
        ..JwtSpec::default()
    };
    let claims_for = |iss: &str| json!({"iss": iss, "sub": "s", "exp": NOW + 60});
    let rules = [
        rule_with(spec_for("iss-b"), &[b.jwk()]),
        rule_with(spec_for("iss-a"), &[a.jwk()]),
    ];
    let (auth, _) = authenticated(run(&rules, &bearer(&b.token(&claims_for("iss-b"))), None));
    assert_eq!(auth.principal, "iss-b/s");
    let (auth, _) = authenticated(run(&rules, &bearer(&a.token(&claims_for("iss-a"))), None));
    assert_eq!(auth.principal, "iss-a/s");
    assert_eq!(
        refused(&run(&rules, &bearer(&a.token(&claims_for("iss-c"))), None)),
        Reason::UnknownIssuer
    );
    // A known issuer's failure wins over the other rule's "unknown issuer".
    let expired = a.token(&json!({"iss": "iss-a", "exp": NOW - 3600}));
    assert_eq!(
        refused(&run(&rules, &bearer(&expired), None)),
        Reason::Expired
    );
    // A token signed by b's key but claiming a's issuer.
    assert_eq!(
        refused(&run(&rules, &bearer(&b.token(&claims_for("iss-a"))), None)),
        Reason::KidAlgMismatch
    );
    assert!(is_no_token(&run(&rules, &HeaderMap::new(), None)));

    // Rules at their own headers: a valid token for one rule is enough (Istio's
    // requirement is "any rule valid, or each valid-or-absent").
    let split = [
        rule_with(
            JwtSpec {
                from_headers: vec![("x-a".into(), String::new())],
                ..spec_for("iss-a")
            },
            &[a.jwk()],
        ),
        rule_with(
            JwtSpec {
                from_headers: vec![("x-b".into(), String::new())],
                ..spec_for("iss-b")
            },
            &[b.jwk()],
        ),
    ];
    let good_a = a.token(&claims_for("iss-a"));
    let (auth, edits) = authenticated(run(
        &split,
        &headers(&[("x-a", &good_a), ("x-b", "garbage")]),
        None,
    ));
    assert_eq!(auth.principal, "iss-a/s");
    assert_eq!(edits.remove, vec![http::HeaderName::from_static("x-a")]);
    // a's token at b's header: b does not know the issuer, a finds nothing.
    assert_eq!(
        refused(&run(&split, &headers(&[("x-b", &good_a)]), None)),
        Reason::UnknownIssuer
    );
    // A bad token at b's header alone.
    assert_eq!(
        refused(&run(&split, &headers(&[("x-b", "garbage")]), None)),
        Reason::BadFormat
    );
}

#[test]
fn the_combined_reason_follows_envoys_requirement_tree() {
    use Verdict::{Invalid as I, Missing as M};
    let u = Reason::UnknownIssuer;
    let cases: Vec<(Vec<Verdict>, Option<Reason>)> = vec![
        (vec![M], None),
        (vec![I(u)], Some(u)),
        (vec![I(Reason::Expired)], Some(Reason::Expired)),
        (vec![M, M, M], None),
        (vec![M, I(u)], Some(u)),
        (vec![I(u), I(u)], Some(u)),
        (vec![I(u), I(Reason::Expired)], Some(Reason::Expired)),
        (vec![I(Reason::Expired), I(u)], Some(Reason::Expired)),
        // The `all` reports the first present rule; the outer `any` keeps the last real
        // failure it saw, which is that `all`.
        (
            vec![I(Reason::Expired), I(Reason::BadFormat)],
            Some(Reason::Expired),
        ),
        (
            vec![I(u), I(Reason::BadFormat), I(Reason::Expired)],
            Some(Reason::Expired),
        ),
        (vec![M, I(Reason::BadFormat), M], Some(Reason::BadFormat)),
    ];
    for (verdicts, want) in cases {
        assert_eq!(combine(&verdicts), want, "{verdicts:?}");
    }
}

#[test]
fn key_sources_without_keys_refuse() {
    let t = rs().token(&claims());
    let invalid = [JwtRule::new(spec(), KeySource::inline("{\"keys\": []}")).unwrap()];
    assert!(matches!(invalid[0].keys(), KeySource::Invalid(_)));
    assert_eq!(
        refused(&run(&invalid, &bearer(&t), None)),
        Reason::JwksNoValidKeys
    );
    let config = FetchConfig::new(rustls::RootCertStore::empty()).unwrap();
    let remote = RemoteJwks::new("https://127.0.0.1:1/jwks", config).unwrap();
    let pending = [JwtRule::new(spec(), KeySource::Remote(Arc::clone(&remote))).unwrap()];
    assert_eq!(
        refused(&run(&pending, &bearer(&t), None)),
        Reason::JwksFetchFailed
    );
    // Without a token nothing is fetched or refused.
    assert!(is_no_token(&run(&pending, &HeaderMap::new(), None)));
}

#[test]
fn rules_are_validated() {
    let keys = || KeySource::inline(&jwks(&[rs().jwk()]));
    let bad: Vec<(JwtSpec, RuleError)> = vec![
        (JwtSpec::default(), RuleError::NoIssuer),
        (
            JwtSpec {
                from_headers: vec![("bad header".into(), String::new())],
                ..spec()
            },
            RuleError::BadHeader {
                field: "fromHeaders",
                name: "bad header".into(),
            },
        ),
        (
            JwtSpec {
                output_payload_to_header: ":path".into(),
                ..spec()
            },
            RuleError::BadHeader {
                field: "outputPayloadToHeader",
                name: ":path".into(),
            },
        ),
        (
            JwtSpec {
                output_claim_to_headers: vec![("x".into(), String::new())],
                ..spec()
            },
            RuleError::EmptyName("outputClaimToHeaders claim"),
        ),
        (
            JwtSpec {
                from_params: vec![String::new()],
                ..spec()
            },
            RuleError::EmptyName("fromParams"),
        ),
    ];
    for (s, want) in bad {
        assert_eq!(JwtRule::new(s, keys()).unwrap_err(), want);
    }
}

/// A preflight passes unchecked whatever token it carries (none, good, forged), but on
/// every path the rules' output headers a client sent are removed before forwarding.
#[test]
fn a_preflight_passes_unchecked_and_its_forged_output_headers_are_removed() {
    let rules = [rs_rule(JwtSpec {
        output_claim_to_headers: vec![("x-jwt-group".into(), "group".into())],
        output_payload_to_header: "x-jwt-payload".into(),
        ..spec()
    })];
    let forged = [("x-jwt-group", "admins"), ("x-jwt-payload", "e30")];
    let preflight = [
        ("origin", "https://a"),
        ("access-control-request-method", "DELETE"),
    ];
    let good = rs().token(&with(claims(), json!({"group": "users"})));
    let cases: &[(&str, http::Method, Option<String>, bool)] = &[
        ("preflight, no token", http::Method::OPTIONS, None, true),
        (
            "preflight, forged token",
            http::Method::OPTIONS,
            Some("Bearer x.y.z".into()),
            true,
        ),
        (
            "preflight, good token",
            http::Method::OPTIONS,
            Some(format!("Bearer {good}")),
            true,
        ),
        (
            "plain OPTIONS, no token",
            http::Method::OPTIONS,
            None,
            false,
        ),
        ("GET, no token", http::Method::GET, None, false),
    ];
    for (what, method, token, is_preflight) in cases {
        let mut pairs: Vec<(&str, &str)> = forged.to_vec();
        if *is_preflight {
            pairs.extend(preflight);
        } else if *method == http::Method::OPTIONS {
            pairs.push(("origin", "https://a"));
        }
        if let Some(t) = token {
            pairs.push(("authorization", t));
        }
        let mut h = headers(&pairs);
        let outcome = authenticate_request(&rules, method, &h, None, now());
        let Outcome::NoToken { edits } = outcome else {
            panic!("{what}: {outcome:?}");
        };
        edits.apply(&mut h);
        assert!(h.get("x-jwt-group").is_none(), "{what}: {h:?}");
        assert!(h.get("x-jwt-payload").is_none(), "{what}: {h:?}");
        // A preflight's token is neither checked nor stripped.
        assert_eq!(h.contains_key("authorization"), token.is_some(), "{what}");
    }
    // Not a preflight: the forged token is checked and refused.
    let h = headers(&[("authorization", "Bearer x.y.z")]);
    let outcome = authenticate_request(&rules, &http::Method::OPTIONS, &h, None, now());
    assert!(matches!(outcome, Outcome::Refused(_)), "{outcome:?}");
}

#[test]
fn cors_preflight() {
    let pre = headers(&[
        ("origin", "https://a"),
        ("access-control-request-method", "GET"),
    ]);
    assert!(is_cors_preflight(&http::Method::OPTIONS, &pre));
    assert!(!is_cors_preflight(&http::Method::GET, &pre));
    assert!(!is_cors_preflight(
        &http::Method::OPTIONS,
        &headers(&[("origin", "https://a")])
    ));
}
