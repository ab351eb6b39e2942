//! The `jwt` target: outside bytes as a token (in a request, through every location) and
//! as a JWKS document, through `ambit_jwt`'s decision, with an oracle of its own (the token
//! split and decoded here, its signature verified here).
//!
//! The rules' keys are Ed25519 keys from fixed seeds, so the seed corpus can hold tokens
//! that really verify (made with any Ed25519 implementation from the same seeds; see
//! fuzz/README.md), and the clock is fixed.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::signature::{self as sig, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use http::{HeaderMap, HeaderValue};
use serde_json::{json, Value};

use ambit_jwt::{
    authenticate, Jwks, JwksError, JwtRule, JwtSpec, KeySource, Outcome, Reason, MAX_JWKS_BYTES,
    MAX_KEYS,
};
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// base64url as JOSE uses it: encoded unpadded, decoded with or without padding.
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

mod b64 {
    use base64::Engine;

    pub fn encode(bytes: &[u8]) -> String {
        super::B64.encode(bytes)
    }
}

/// What this oracle reads of a compact JWS: the signed part, the signature, `iss`, `sub`.
struct Token<'a> {
    signed: &'a [u8],
    signature: Vec<u8>,
    iss: String,
    sub: String,
}

/// The oracle's own reading of a token (three parts, the payload a JSON object whose
/// `iss` and `sub` are strings): what an authenticated token must be.
fn read_token(token: &[u8]) -> Option<Token<'_>> {
    let text = std::str::from_utf8(token).ok()?;
    let mut parts = text.split('.');
    let (header, payload, signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let claims: Value = serde_json::from_slice(&B64.decode(payload).ok()?).ok()?;
    Some(Token {
        signed: &token[..header.len() + 1 + payload.len()],
        signature: B64.decode(signature).ok()?,
        iss: claims.get("iss")?.as_str()?.to_string(),
        sub: claims.get("sub")?.as_str()?.to_string(),
    })
}

/// The seed of the key of issuer [`ISSUER_A`] (kid `fuzz-a`).
pub const SEED_A: [u8; 32] = [7; 32];
/// The seed of the key of issuer [`ISSUER_B`] (kid `fuzz-b`).
pub const SEED_B: [u8; 32] = [9; 32];
/// The first rule's issuer: default locations, audience `fuzz`, payload and claims output.
pub const ISSUER_A: &str = "https://a.fuzz";
/// The second rule's issuer: header `x-jwt` without prefix.
pub const ISSUER_B: &str = "https://b.fuzz";
/// The fuzz target's clock.
pub const NOW: u64 = 1_700_000_000;

struct Fixture {
    rules: Vec<JwtRule>,
    a: Ed25519KeyPair,
    b: Ed25519KeyPair,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let a = Ed25519KeyPair::from_seed_unchecked(&SEED_A).expect("a 32-byte seed");
        let b = Ed25519KeyPair::from_seed_unchecked(&SEED_B).expect("a 32-byte seed");
        let jwk = |pair: &Ed25519KeyPair, kid: &str| {
            json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": kid,
                             "x": b64::encode(pair.public_key().as_ref())}]})
            .to_string()
        };
        let rule_a = JwtRule::new(
            JwtSpec {
                issuer: ISSUER_A.into(),
                audiences: vec!["fuzz".into()],
                output_payload_to_header: "x-payload".into(),
                output_claim_to_headers: vec![
                    ("x-sub".into(), "sub".into()),
                    ("x-team".into(), "org.team".into()),
                ],
                ..JwtSpec::default()
            },
            KeySource::inline(&jwk(&a, "fuzz-a")),
        )
        .expect("a valid rule");
        let rule_b = JwtRule::new(
            JwtSpec {
                issuer: ISSUER_B.into(),
                from_headers: vec![("x-jwt".into(), String::new())],
                forward_original_token: true,
                ..JwtSpec::default()
            },
            KeySource::inline(&jwk(&b, "fuzz-b")),
        )
        .expect("a valid rule");
        Fixture {
            rules: vec![rule_a, rule_b],
            a,
            b,
        }
    })
}

/// Byte 0: bit 0 set ⇒ the rest is a JWKS document ([`jwks_document`]); clear ⇒ the rest
/// is a token ([`token_in_request`]) placed by bits 1-2: 0 `Authorization: Bearer`, 1 the
/// `access_token` parameter, 2 the `x-jwt` header, 3 all three. Returns what was reached.
pub fn run(data: &[u8]) -> String {
    let Some((&selector, rest)) = data.split_first() else {
        return "empty".into();
    };
    if selector & 1 == 1 {
        jwks_document(rest)
    } else {
        token_in_request(rest, (selector >> 1) & 3)
    }
}

/// A token in a request, through [`authenticate`] with two rules. Checks: the parser and
/// the decision agree; a refusal's answer is well formed (403 exactly for audiences); an
/// authenticated request carries a token whose signature the fixed key verifies (checked
/// here independently), whose identity is its `iss`/`sub`, and whose edits apply.
pub fn token_in_request(token: &[u8], place: u8) -> String {
    let f = fixture();
    let mut headers = HeaderMap::new();
    let mut query = None;
    let header_value = HeaderValue::from_bytes(&[b"Bearer ".as_slice(), token].concat()).ok();
    if matches!(place, 0 | 3) {
        if let Some(v) = &header_value {
            headers.append(http::header::AUTHORIZATION, v.clone());
        }
    }
    if matches!(place, 1 | 3) {
        query = Some(format!("a=1&access_token={}", percent_encode(token)));
    }
    if matches!(place, 2 | 3) {
        if let Ok(v) = HeaderValue::from_bytes(token) {
            headers.append("x-jwt", v);
        }
    }
    let parsed = read_token(token);
    let now = UNIX_EPOCH + Duration::from_secs(NOW);
    let outcome = authenticate(&f.rules, &headers, query.as_deref(), now);
    match outcome {
        Outcome::NoToken { edits } => {
            assert!(headers.is_empty() && query.is_none(), "a token was sent");
            edits.apply(&mut headers);
            "no token".into()
        }
        Outcome::Refused(r) => {
            assert_eq!(
                r.status() == http::StatusCode::FORBIDDEN,
                r.reason == Reason::AudienceNotAllowed
            );
            let www = r.www_authenticate("http", "svc:80", "/p?q");
            assert!(www.to_str().is_ok_and(|s| s.starts_with("Bearer realm=\"")));
            assert!(!r.details().contains(' '));
            format!("refused: {}", r.reason)
        }
        Outcome::Authenticated { auth, edits } => {
            let t = parsed.expect("an authenticated token parses");
            let pair = match t.iss.as_str() {
                ISSUER_A => &f.a,
                ISSUER_B => &f.b,
                other => panic!("authenticated with issuer {other:?}"),
            };
            UnparsedPublicKey::new(&sig::ED25519, pair.public_key().as_ref())
                .verify(t.signed, &t.signature)
                .expect("authenticated, so signed by the rule's key");
            assert_eq!(auth.principal, format!("{}/{}", t.iss, t.sub));
            let mut forwarded = headers.clone();
            edits.apply(&mut forwarded);
            if let Some(q) = &query {
                let _ = edits.strip_query(q);
            }
            format!("authenticated: {}", auth.principal)
        }
    }
}

fn percent_encode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// A JWKS document through [`Jwks::parse`], then a token signed by the fixed key of issuer
/// A checked against the set. Checks: the bounds hold; every skipped entry names an index
/// within the list; the token verifies only if the set holds that key.
pub fn jwks_document(document: &[u8]) -> String {
    let f = fixture();
    let parsed = Jwks::parse(document);
    match &parsed {
        Err(JwksError::TooLarge { size, .. }) => assert!(*size > MAX_JWKS_BYTES),
        _ => assert!(document.len() <= MAX_JWKS_BYTES),
    }
    let set = match parsed {
        Ok(set) => set,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return format!("jwks error: {}", variant(&e));
        }
    };
    assert!(!set.keys().is_empty());
    assert!(set.keys().len() + set.skipped().len() <= MAX_KEYS);
    for issue in set.skipped() {
        assert!(issue.index < MAX_KEYS);
    }
    let rule = JwtRule::new(
        JwtSpec {
            issuer: ISSUER_A.into(),
            ..JwtSpec::default()
        },
        KeySource::Inline(Arc::new(set.clone())),
    )
    .expect("a valid rule");
    let mut headers = HeaderMap::new();
    let token = signed_token_a(&f.a);
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).expect("base64url is a header value"),
    );
    let verdict = match authenticate(&[rule], &headers, None, SystemTime::UNIX_EPOCH) {
        Outcome::Authenticated { .. } => {
            let x = b64::encode(f.a.public_key().as_ref());
            assert!(
                document.windows(x.len()).any(|w| w == x.as_bytes()),
                "verified without the key in the document"
            );
            "verifies".to_string()
        }
        Outcome::Refused(r) => format!("refuses: {}", r.reason),
        Outcome::NoToken { .. } => panic!("a token was sent"),
    };
    format!(
        "jwks: {} keys, {} skipped; the fixed token {verdict}",
        set.keys().len(),
        set.skipped().len()
    )
}

/// A token of issuer A (`sub` `fuzz`, no `exp`) signed by its fixed key.
fn signed_token_a(pair: &Ed25519KeyPair) -> String {
    let header: Value = json!({"alg": "EdDSA", "kid": "fuzz-a"});
    let payload: Value = json!({"iss": ISSUER_A, "sub": "fuzz"});
    let signed = format!(
        "{}.{}",
        b64::encode(header.to_string().as_bytes()),
        b64::encode(payload.to_string().as_bytes())
    );
    let signature = pair.sign(signed.as_bytes());
    format!("{signed}.{}", b64::encode(signature.as_ref()))
}

fn variant(e: &JwksError) -> &'static str {
    match e {
        JwksError::TooLarge { .. } => "TooLarge",
        JwksError::NotJson(_) => "NotJson",
        JwksError::Shape(_) => "Shape",
        JwksError::TooManyKeys { .. } => "TooManyKeys",
        JwksError::NoUsableKey(_) => "NoUsableKey",
    }
}
