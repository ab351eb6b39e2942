//! Keys generated in the test process (aws-lc-rs), each kind once per test binary, and
//! tokens signed with them: the signing side of the tests, independent of the verifying
//! code under test. Also built with the `testing` feature, for the benchmark.

use std::sync::OnceLock;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{
    self as sig, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair, RsaPublicKeyComponents,
};
use serde_json::{json, Value};

use crate::b64;
use crate::jwks::Alg;

fn rsa() -> &'static RsaKeyPair {
    static KEY: OnceLock<RsaKeyPair> = OnceLock::new();
    KEY.get_or_init(|| RsaKeyPair::generate(KeySize::Rsa2048).unwrap())
}

/// A second RSA key, for "signed by another key".
fn rsa_other() -> &'static RsaKeyPair {
    static KEY: OnceLock<RsaKeyPair> = OnceLock::new();
    KEY.get_or_init(|| RsaKeyPair::generate(KeySize::Rsa2048).unwrap())
}

fn p256() -> &'static EcdsaKeyPair {
    static KEY: OnceLock<EcdsaKeyPair> = OnceLock::new();
    KEY.get_or_init(|| EcdsaKeyPair::generate(&sig::ECDSA_P256_SHA256_FIXED_SIGNING).unwrap())
}

fn p384() -> &'static EcdsaKeyPair {
    static KEY: OnceLock<EcdsaKeyPair> = OnceLock::new();
    KEY.get_or_init(|| EcdsaKeyPair::generate(&sig::ECDSA_P384_SHA384_FIXED_SIGNING).unwrap())
}

fn ed() -> &'static Ed25519KeyPair {
    static KEY: OnceLock<Ed25519KeyPair> = OnceLock::new();
    KEY.get_or_init(|| Ed25519KeyPair::generate().unwrap())
}

/// A signing key for one algorithm, with a `kid`.
#[derive(Clone, Copy)]
pub struct TestKey {
    pub alg: Alg,
    pub kid: &'static str,
    /// The second RSA key instead of the first (RSA algorithms only).
    pub other: bool,
}

impl TestKey {
    pub fn new(alg: Alg, kid: &'static str) -> TestKey {
        TestKey {
            alg,
            kid,
            other: false,
        }
    }

    /// The same algorithm and kid, another RSA key.
    pub fn other_rsa(alg: Alg, kid: &'static str) -> TestKey {
        TestKey {
            alg,
            kid,
            other: true,
        }
    }

    /// The public JWK (no `alg`).
    pub fn jwk(&self) -> Value {
        match self.alg {
            Alg::ES256 | Alg::ES384 => {
                let (pair, crv, n) = if self.alg == Alg::ES256 {
                    (p256(), "P-256", 32)
                } else {
                    (p384(), "P-384", 48)
                };
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "kid": self.kid, "crv": crv,
                       "x": b64::encode(&point[1..1 + n]), "y": b64::encode(&point[1 + n..])})
            }
            Alg::EdDSA => json!({"kty": "OKP", "kid": self.kid, "crv": "Ed25519",
                                 "x": b64::encode(ed().public_key().as_ref())}),
            _ => {
                let pair = if self.other { rsa_other() } else { rsa() };
                let c = RsaPublicKeyComponents::<Vec<u8>>::from(pair.public_key());
                json!({"kty": "RSA", "kid": self.kid, "n": b64::encode(&c.n), "e": b64::encode(&c.e)})
            }
        }
    }

    /// The public JWK pinned to its algorithm.
    pub fn jwk_with_alg(&self) -> Value {
        let mut jwk = self.jwk();
        jwk["alg"] = json!(self.alg.name());
        jwk
    }

    /// A signature of `message` by this key, with its algorithm.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let rng = SystemRandom::new();
        match self.alg {
            Alg::ES256 => p256().sign(&rng, message).unwrap().as_ref().to_vec(),
            Alg::ES384 => p384().sign(&rng, message).unwrap().as_ref().to_vec(),
            Alg::EdDSA => ed().sign(message).as_ref().to_vec(),
            alg => {
                let pair = if self.other { rsa_other() } else { rsa() };
                let padding: &'static dyn sig::RsaEncoding = match alg {
                    Alg::RS256 => &sig::RSA_PKCS1_SHA256,
                    Alg::RS384 => &sig::RSA_PKCS1_SHA384,
                    Alg::RS512 => &sig::RSA_PKCS1_SHA512,
                    Alg::PS256 => &sig::RSA_PSS_SHA256,
                    Alg::PS384 => &sig::RSA_PSS_SHA384,
                    _ => &sig::RSA_PSS_SHA512,
                };
                let mut out = vec![0; pair.public_modulus_len()];
                pair.sign(padding, &rng, message, &mut out).unwrap();
                out
            }
        }
    }

    /// A token: `header` and `payload` as JSON, signed by this key.
    pub fn token_with_header(&self, header: &Value, payload: &Value) -> String {
        let signed = format!(
            "{}.{}",
            b64::encode(header.to_string().as_bytes()),
            b64::encode(payload.to_string().as_bytes())
        );
        let signature = self.sign(signed.as_bytes());
        format!("{signed}.{}", b64::encode(&signature))
    }

    /// A token with the usual header (`alg`, `kid`, `typ`).
    pub fn token(&self, payload: &Value) -> String {
        self.token_with_header(
            &json!({"alg": self.alg.name(), "kid": self.kid, "typ": "JWT"}),
            payload,
        )
    }
}

/// A JWKS document of these JWKs.
pub fn jwks(keys: &[Value]) -> String {
    json!({ "keys": keys }).to_string()
}
