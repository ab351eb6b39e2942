//! The cost of authenticating one request with a cached key set: `authenticate` on a
//! request carrying a valid `Authorization: Bearer` token, per algorithm family, and on a
//! request without a token (what every request pays once a RequestAuthentication
//! applies). `cargo bench -p ambit-jwt --features testing`.

use std::time::SystemTime;

use ambit_jwt::testkeys::{jwks, TestKey};
use ambit_jwt::{authenticate, Alg, JwtRule, JwtSpec, KeySource, Outcome};
use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue};
use serde_json::json;

fn bench(c: &mut Criterion) {
    let now = SystemTime::now();
    let exp = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let mut group = c.benchmark_group("authenticate");
    for (name, alg) in [
        ("EdDSA", Alg::EdDSA),
        ("ES256", Alg::ES256),
        ("RS256 (2048)", Alg::RS256),
        ("PS256 (2048)", Alg::PS256),
    ] {
        let key = TestKey::new(alg, "k1");
        let spec = JwtSpec {
            issuer: "https://idp.example.com".into(),
            audiences: vec!["reviews".into()],
            ..JwtSpec::default()
        };
        let rule = JwtRule::new(spec, KeySource::inline(&jwks(&[key.jwk()]))).unwrap();
        let rules = [rule];
        let token = key.token(&json!({
            "iss": "https://idp.example.com",
            "sub": "alice",
            "aud": "reviews",
            "exp": exp,
            "groups": ["a", "b"],
        }));
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        assert!(matches!(
            authenticate(&rules, &headers, None, now),
            Outcome::Authenticated { .. }
        ));
        group.bench_function(format!("valid token, {name}"), |b| {
            b.iter(|| authenticate(&rules, &headers, None, now))
        });
        if alg == Alg::EdDSA {
            let none = HeaderMap::new();
            group.bench_function("no token", |b| {
                b.iter(|| authenticate(&rules, &none, None, now))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
