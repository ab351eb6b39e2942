//! One token's bytes read as Envoy's jwt_verify_lib reads them, each fault with Envoy's
//! reason (sans-IO): three base64url sections, a JSON-object header with a string `alg`
//! ambit implements and an optional string `kid`, a JSON-object payload whose registered
//! claims have the types RFC 7519 gives them, and a base64url signature. Then the checks
//! against a rule's clock and key set.
//!
//! Stricter than Envoy on malformed input only: a token must have exactly three non-empty
//! sections (Envoy skips empty ones, so it reads `h.p.s.` as `h.p.s`), and an `alg` ambit
//! does not implement (`HS*`, `ES512`, `none`) is refused as not supported.

use serde_json::{Map, Value};

use crate::b64;
use crate::jwks::{Alg, Jwks};
use crate::reason::Reason;

/// A token that parsed.
#[derive(Debug, Clone)]
pub(crate) struct Token<'a> {
    /// `<header>.<payload>`, the bytes the signature covers.
    pub signed: &'a [u8],
    /// The payload section as received (for `outputPayloadToHeader`).
    pub payload_b64: &'a [u8],
    pub alg: Alg,
    /// `kid`, when present and not empty.
    pub kid: Option<String>,
    /// `iss` (empty when absent, as in Envoy).
    pub iss: String,
    /// `sub` (empty when absent).
    pub sub: String,
    /// `nbf` (0 when absent).
    pub nbf: u64,
    /// `exp` (0 when absent: no expiry, as in Envoy).
    pub exp: u64,
    /// `aud`, a string or a list of strings.
    pub aud: Vec<String>,
    pub signature: Vec<u8>,
    /// The whole payload.
    pub claims: Map<String, Value>,
}

/// Reads a token (see the module docs).
pub(crate) fn parse(token: &[u8]) -> Result<Token<'_>, Reason> {
    let mut parts = token.split(|&b| b == b'.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Reason::BadFormat);
    };
    if h.is_empty() || p.is_empty() || s.is_empty() {
        return Err(Reason::BadFormat);
    }

    let header = b64::decode(h).ok_or(Reason::HeaderBadBase64)?;
    let header = json_object(&header).ok_or(Reason::HeaderBadJson)?;
    let alg = match header.get("alg") {
        Some(Value::String(a)) => Alg::from_name(a).ok_or(Reason::HeaderAlgNotImplemented)?,
        _ => return Err(Reason::HeaderBadAlg),
    };
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(k)) if k.is_empty() => None,
        Some(Value::String(k)) => Some(k.clone()),
        Some(_) => return Err(Reason::HeaderBadKid),
    };

    let payload = b64::decode(p).ok_or(Reason::PayloadBadBase64)?;
    let claims = json_object(&payload).ok_or(Reason::PayloadBadJson)?;
    let iss = string_claim(&claims, "iss", Reason::IssNotString)?;
    let sub = string_claim(&claims, "sub", Reason::SubNotString)?;
    time_claim(&claims, "iat", Reason::IatNotInteger, Reason::IatOutOfRange)?;
    let nbf = time_claim(&claims, "nbf", Reason::NbfNotInteger, Reason::NbfOutOfRange)?;
    let exp = time_claim(&claims, "exp", Reason::ExpNotInteger, Reason::ExpOutOfRange)?;
    string_claim(&claims, "jti", Reason::JtiNotString)?;
    let aud = match claims.get("aud") {
        None => Vec::new(),
        Some(Value::String(a)) => vec![a.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or(Reason::AudNotString)?,
        Some(_) => return Err(Reason::AudNotString),
    };
    let signature = b64::decode(s).ok_or(Reason::SignatureBadBase64)?;

    Ok(Token {
        signed: &token[..h.len() + 1 + p.len()],
        payload_b64: p,
        alg,
        kid,
        iss,
        sub,
        nbf,
        exp,
        aud,
        signature,
        claims,
    })
}

fn json_object(bytes: &[u8]) -> Option<Map<String, Value>> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

fn string_claim(claims: &Map<String, Value>, name: &str, wrong: Reason) -> Result<String, Reason> {
    match claims.get(name) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(wrong),
    }
}

/// A NumericDate as Envoy reads it: any JSON number, truncated to whole seconds; negative
/// or at least 2^64 is out of range.
fn time_claim(
    claims: &Map<String, Value>,
    name: &str,
    wrong: Reason,
    range: Reason,
) -> Result<u64, Reason> {
    match claims.get(name) {
        None => Ok(0),
        Some(Value::Number(n)) => {
            let f = n.as_f64().ok_or(range)?;
            if !(0.0..u64::MAX as f64).contains(&f) {
                return Err(range);
            }
            // Truncation toward zero is Envoy's reading of a fractional date.
            Ok(f as u64)
        }
        Some(_) => Err(wrong),
    }
}

impl Token<'_> {
    /// `nbf` and `exp` against `now` (Unix seconds), each allowed `skew` seconds (Envoy:
    /// not yet valid when `now + skew < nbf`; expired when `exp` is set and
    /// `now > exp + skew`).
    pub fn check_time(&self, now: u64, skew: u64) -> Result<(), Reason> {
        if now.saturating_add(skew) < self.nbf {
            return Err(Reason::NotYetValid);
        }
        if self.exp != 0 && now > self.exp.saturating_add(skew) {
            return Err(Reason::Expired);
        }
        Ok(())
    }

    /// The signature against a key set, choosing keys as Envoy does: a key whose `kid`
    /// differs from the token's (both present) or whose `alg` differs is passed over; the
    /// token verifies if any remaining key of its algorithm verifies it. No remaining key
    /// ⇒ [`Reason::KidAlgMismatch`]; remaining keys, none verifying (or none of the
    /// token's algorithm family) ⇒ [`Reason::VerificationFailed`].
    pub fn verify(&self, jwks: &Jwks) -> Result<(), Reason> {
        let mut matched = false;
        for key in jwks.keys() {
            if let (Some(want), Some(have)) = (&self.kid, key.kid()) {
                if want != have {
                    continue;
                }
            }
            if key.alg().is_some_and(|a| a != self.alg) {
                continue;
            }
            matched = true;
            let Some(verifier) = key.verifier(self.alg) else {
                continue;
            };
            if self.alg == Alg::EdDSA && self.signature.len() != 64 {
                return Err(Reason::Ed25519SignatureWrongLength);
            }
            if verifier.verify_sig(self.signed, &self.signature).is_ok() {
                return Ok(());
            }
        }
        Err(if matched {
            Reason::VerificationFailed
        } else {
            Reason::KidAlgMismatch
        })
    }
}
