//! Key sets: every supported kind parsed, every unusable entry named by index and field,
//! every bound enforced.

use serde_json::{json, Value};

use super::*;
use crate::testkeys::{jwks, TestKey};

fn parse(keys: &[Value]) -> Result<Jwks, JwksError> {
    Jwks::parse(jwks(keys).as_bytes())
}

#[test]
fn every_supported_kind_parses() {
    let keys: Vec<Value> = [Alg::RS256, Alg::ES256, Alg::ES384, Alg::EdDSA]
        .iter()
        .map(|a| TestKey::new(*a, "k").jwk())
        .collect();
    let set = parse(&keys).unwrap();
    assert_eq!(set.keys().len(), 4);
    assert!(set.skipped().is_empty());
    // An unpinned RSA key serves every RSA algorithm; an EC key its curve's.
    let rsa = &set.keys()[0];
    assert_eq!(rsa.kid(), Some("k"));
    assert_eq!(rsa.alg(), None);
    for alg in RSA_ALGS {
        assert!(rsa.verifier(alg).is_some(), "{alg}");
    }
    assert!(rsa.verifier(Alg::ES256).is_none());
    assert!(set.keys()[1].verifier(Alg::ES256).is_some());
    assert!(set.keys()[1].verifier(Alg::ES384).is_none());
    assert!(set.keys()[2].verifier(Alg::ES384).is_some());
    assert!(set.keys()[3].verifier(Alg::EdDSA).is_some());
    // Pinned: only its algorithm.
    let pinned = parse(&[TestKey::new(Alg::PS384, "p").jwk_with_alg()]).unwrap();
    assert_eq!(pinned.keys()[0].alg(), Some(Alg::PS384));
    assert!(pinned.keys()[0].verifier(Alg::RS256).is_none());
}

#[test]
fn unusable_entries_are_skipped_and_named() {
    let rsa = TestKey::new(Alg::RS256, "r").jwk();
    let ec = TestKey::new(Alg::ES256, "e").jwk();
    let ed = TestKey::new(Alg::EdDSA, "d").jwk();
    let edit = |base: &Value, f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut v = base.clone();
        f(v.as_object_mut().unwrap());
        v
    };
    let b64 = crate::b64::encode;
    let mut small_n = vec![0xff; 128];
    small_n[127] = 1;
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!("a string"), "", "is not a JSON object"),
        (
            edit(&rsa, &|m| {
                m.remove("kty");
            }),
            "kty",
            "is missing",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("kty".into(), json!(1));
            }),
            "kty",
            "is not a string",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("kty".into(), json!("oct"));
            }),
            "kty",
            "HMAC",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("kty".into(), json!("XYZ"));
            }),
            "kty",
            "not a supported key type",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("use".into(), json!("enc"));
            }),
            "use",
            "encryption",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("kid".into(), json!(5));
            }),
            "kid",
            "is not a string",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("alg".into(), json!("HS256"));
            }),
            "alg",
            "not a supported algorithm",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("alg".into(), json!("ES256"));
            }),
            "alg",
            "RS* or PS*",
        ),
        (
            edit(&rsa, &|m| {
                m.remove("n");
            }),
            "n",
            "is missing",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("n".into(), json!("!!"));
            }),
            "n",
            "base64url",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("n".into(), json!(b64(&small_n)));
            }),
            "n",
            "1024-bit",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("n".into(), json!(b64(&[0xff; 1025])));
            }),
            "n",
            "8200-bit",
        ),
        (
            edit(&rsa, &|m| {
                m.insert("e".into(), json!(b64(&[5])));
            }),
            "e",
            "3 or 65537",
        ),
        (
            edit(&ec, &|m| {
                m.insert("crv".into(), json!("P-521"));
            }),
            "crv",
            "not a supported curve",
        ),
        (
            edit(&ec, &|m| {
                m.insert("alg".into(), json!("ES384"));
            }),
            "crv",
            "does not fit",
        ),
        (
            edit(&ec, &|m| {
                m.insert("alg".into(), json!("RS256"));
            }),
            "alg",
            "ES256 or ES384",
        ),
        (
            edit(&ec, &|m| {
                m.insert("x".into(), json!(b64(&[1; 31])));
            }),
            "x",
            "31 bytes",
        ),
        (
            edit(&ec, &|m| {
                m.remove("y");
            }),
            "y",
            "is missing",
        ),
        (
            edit(&ec, &|m| {
                m.insert("y".into(), json!(b64(&[7; 32])));
            }),
            "x",
            "not a point on the curve",
        ),
        (
            edit(&ed, &|m| {
                m.insert("crv".into(), json!("X25519"));
            }),
            "crv",
            "only Ed25519",
        ),
        (
            edit(&ed, &|m| {
                m.remove("crv");
            }),
            "crv",
            "is missing",
        ),
        (
            edit(&ed, &|m| {
                m.insert("x".into(), json!(b64(&[1; 33])));
            }),
            "x",
            "33 bytes",
        ),
        (
            edit(&ed, &|m| {
                m.insert("alg".into(), json!("ES256"));
            }),
            "alg",
            "EdDSA",
        ),
    ];
    for (i, (bad, field, words)) in cases.into_iter().enumerate() {
        // Beside a good key the set is usable, and the bad entry is named.
        let set = parse(&[bad.clone(), rsa.clone()]).unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(set.keys().len(), 1, "case {i}");
        let issue = &set.skipped()[0];
        assert_eq!((issue.index, issue.field), (0, field), "case {i}: {issue}");
        assert!(issue.problem.contains(words), "case {i}: {issue}");
        // Alone, the set is refused with the same issue.
        match parse(&[bad]) {
            Err(JwksError::NoUsableKey(issues)) => assert_eq!(&issues[0], issue, "case {i}"),
            other => panic!("case {i}: {other:?}"),
        }
    }
}

#[test]
fn documents_that_are_not_key_sets() {
    let too_big = vec![b' '; MAX_JWKS_BYTES + 1];
    assert_eq!(
        Jwks::parse(&too_big).unwrap_err(),
        JwksError::TooLarge {
            size: MAX_JWKS_BYTES + 1,
            limit: MAX_JWKS_BYTES
        }
    );
    assert!(matches!(Jwks::parse(b"{"), Err(JwksError::NotJson(_))));
    assert!(matches!(Jwks::parse(b"\xff"), Err(JwksError::NotJson(_))));
    for (doc, words) in [
        ("[]", "is not a JSON object"),
        ("{}", "has no [keys] field"),
        ("{\"keys\": {}}", "[keys] field is not a list"),
    ] {
        let e = Jwks::parse(doc.as_bytes()).unwrap_err();
        assert_eq!(e, JwksError::Shape(words), "{doc}");
    }
    let many = vec![json!({}); MAX_KEYS + 1];
    assert_eq!(
        parse(&many).unwrap_err(),
        JwksError::TooManyKeys {
            count: MAX_KEYS + 1,
            limit: MAX_KEYS
        }
    );
    let e = parse(&[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the JWKS has no usable key (its keys list is empty)"
    );
    let e = parse(&[json!({"kty": "oct"}), json!(1)]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the JWKS has no usable key: keys[0].kty: \"oct\" (HMAC) keys are not supported; \
         keys[1]: is not a JSON object"
    );
    // Deep nesting is an error, not a stack overflow.
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert!(matches!(
        Jwks::parse(deep.as_bytes()),
        Err(JwksError::NotJson(_))
    ));
}
