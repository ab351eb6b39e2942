//! An identity provider for tests and the demo: an Ed25519 key made at start, its JWKS,
//! and tokens it signs (or forges) with the claims given. Signing is aws-lc-rs's; the
//! waypoint verifies with its own code (`ambit_jwt`).

use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use serde_json::{json, Value};

/// A signing key and the issuer it signs as.
pub struct Issuer {
    pub iss: String,
    pub kid: String,
    key: Ed25519KeyPair,
}

impl Issuer {
    /// A new key for `iss`, named `kid`.
    pub fn new(iss: &str, kid: &str) -> anyhow::Result<Issuer> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| anyhow::anyhow!("cannot make an Ed25519 key"))?;
        let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
            .map_err(|_| anyhow::anyhow!("cannot read the Ed25519 key made"))?;
        Ok(Issuer {
            iss: iss.into(),
            kid: kid.into(),
            key,
        })
    }

    /// The JWKS with this key, as JSON text.
    pub fn jwks(&self) -> String {
        json!({"keys": [{
            "kty": "OKP",
            "crv": "Ed25519",
            "alg": "EdDSA",
            "use": "sig",
            "kid": self.kid,
            "x": B64.encode(self.key.public_key().as_ref()),
        }]})
        .to_string()
    }

    /// A token signed by this key with `claims` (the issuer's `iss` added unless given).
    pub fn token(&self, claims: &Value) -> String {
        let mut claims = claims.clone();
        if let Some(m) = claims.as_object_mut() {
            m.entry("iss").or_insert_with(|| json!(self.iss));
        }
        let header = json!({"alg": "EdDSA", "typ": "JWT", "kid": self.kid});
        let signing_input = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let signature = self.key.sign(signing_input.as_bytes());
        format!("{signing_input}.{}", B64.encode(signature.as_ref()))
    }

    /// A token this key did not sign: a good one with its last signature byte changed.
    pub fn forged(&self, claims: &Value) -> String {
        let good = self.token(claims);
        let (input, sig) = good.rsplit_once('.').unwrap_or((&good, ""));
        let mut raw = B64.decode(sig).unwrap_or_default();
        if let Some(b) = raw.last_mut() {
            *b ^= 0x01;
        }
        format!("{input}.{}", B64.encode(raw))
    }
}

/// Seconds since the epoch, for `exp` and `nbf`.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
