//! A JSON Web Key Set (RFC 7517) read from outside (an inline `jwks` or a `jwksUri`
//! answer), bounded, and its keys parsed once into verifiers.
//!
//! As Envoy, a key that cannot be used is skipped and the others kept; a set with no usable
//! key is refused. Unlike Envoy, each skipped key is named ([`KeyIssue`]: which entry,
//! which field, what is wrong) so the operator can see it, and ambit is stricter where
//! Envoy guesses: a `kid` or `alg` that is not a string skips the key (Envoy treats it as
//! absent, which would let the key match any token), and a key marked `"use": "enc"` is
//! for encryption and never verifies a signature.
//!
//! Supported: `RSA` (`n`, `e`; 2048 to 8192 bits; `e` 3 or 65537, as Envoy), `EC` P-256
//! and P-384 (`crv`, `x`, `y`; the point must be on the curve), `OKP` Ed25519 (`x`).
//! Not supported (skipped, named): `oct` (HMAC) keys, P-521, X.509-only sets.

use std::fmt;

use aws_lc_rs::signature::{self as sig, ParsedPublicKey, RsaPublicKeyComponents};
use serde_json::{Map, Value};

use crate::b64;

/// The largest JWKS document read.
pub const MAX_JWKS_BYTES: usize = 256 * 1024;
/// The most keys one set may list (usable or not).
pub const MAX_KEYS: usize = 64;
/// The smallest RSA modulus accepted (what aws-lc verifies with).
pub const MIN_RSA_BITS: usize = 2048;
/// The largest RSA modulus accepted: verification cost grows with it, and a peer's key set
/// must not make every request expensive.
pub const MAX_RSA_BITS: usize = 8192;

/// A signature algorithm ambit verifies (the `alg` of a token's header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
pub enum Alg {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    RS256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    RS384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    RS512,
    /// RSASSA-PSS with SHA-256.
    PS256,
    /// RSASSA-PSS with SHA-384.
    PS384,
    /// RSASSA-PSS with SHA-512.
    PS512,
    /// ECDSA P-256 with SHA-256.
    ES256,
    /// ECDSA P-384 with SHA-384.
    ES384,
    /// Ed25519.
    EdDSA,
}

const RSA_ALGS: [Alg; 6] = [
    Alg::RS256,
    Alg::RS384,
    Alg::RS512,
    Alg::PS256,
    Alg::PS384,
    Alg::PS512,
];

impl Alg {
    /// The algorithm a JOSE name stands for, if ambit implements it (`none`, `HS*` and
    /// `ES512` are not).
    pub fn from_name(name: &str) -> Option<Alg> {
        Some(match name {
            "RS256" => Alg::RS256,
            "RS384" => Alg::RS384,
            "RS512" => Alg::RS512,
            "PS256" => Alg::PS256,
            "PS384" => Alg::PS384,
            "PS512" => Alg::PS512,
            "ES256" => Alg::ES256,
            "ES384" => Alg::ES384,
            "EdDSA" => Alg::EdDSA,
            _ => return None,
        })
    }

    /// The JOSE name.
    pub fn name(self) -> &'static str {
        match self {
            Alg::RS256 => "RS256",
            Alg::RS384 => "RS384",
            Alg::RS512 => "RS512",
            Alg::PS256 => "PS256",
            Alg::PS384 => "PS384",
            Alg::PS512 => "PS512",
            Alg::ES256 => "ES256",
            Alg::ES384 => "ES384",
            Alg::EdDSA => "EdDSA",
        }
    }

    fn rsa_params(self) -> Option<&'static sig::RsaParameters> {
        Some(match self {
            Alg::RS256 => &sig::RSA_PKCS1_2048_8192_SHA256,
            Alg::RS384 => &sig::RSA_PKCS1_2048_8192_SHA384,
            Alg::RS512 => &sig::RSA_PKCS1_2048_8192_SHA512,
            Alg::PS256 => &sig::RSA_PSS_2048_8192_SHA256,
            Alg::PS384 => &sig::RSA_PSS_2048_8192_SHA384,
            Alg::PS512 => &sig::RSA_PSS_2048_8192_SHA512,
            _ => return None,
        })
    }
}

impl fmt::Display for Alg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One usable key: its id, the algorithm it is pinned to (if any), and a verifier for each
/// algorithm it can serve.
#[derive(Clone)]
pub struct Key {
    kid: Option<String>,
    alg: Option<Alg>,
    verifiers: Vec<(Alg, ParsedPublicKey)>,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .field(
                "serves",
                &self.verifiers.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Key {
    /// The key's `kid`, if it has a non-empty one.
    pub fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    /// The key's `alg`, if it names one.
    pub fn alg(&self) -> Option<Alg> {
        self.alg
    }

    pub(crate) fn verifier(&self, alg: Alg) -> Option<&ParsedPublicKey> {
        self.verifiers
            .iter()
            .find_map(|(a, k)| (*a == alg).then_some(k))
    }
}

/// A parsed key set: its usable keys, in document order, and the entries it skipped.
#[derive(Debug, Clone)]
pub struct Jwks {
    keys: Vec<Key>,
    skipped: Vec<KeyIssue>,
}

/// Why one entry of `keys` was skipped: which entry (its index), which field, what is
/// wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyIssue {
    /// The entry's index in `keys`.
    pub index: usize,
    /// The field at fault (`""` for the entry as a whole).
    pub field: &'static str,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for KeyIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "keys[{}]: {}", self.index, self.problem)
        } else {
            write!(f, "keys[{}].{}: {}", self.index, self.field, self.problem)
        }
    }
}

/// A key set that cannot be used at all (the fault of whoever wrote or serves it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwksError {
    /// Larger than [`MAX_JWKS_BYTES`].
    #[error("the JWKS is {size} bytes, over the limit of {limit}")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Not JSON.
    #[error("the JWKS is not valid JSON: {0}")]
    NotJson(String),
    /// JSON, but not an object with a `keys` list.
    #[error("the JWKS {0}")]
    Shape(&'static str),
    /// More entries in `keys` than [`MAX_KEYS`].
    #[error("the JWKS lists {count} keys, over the limit of {limit}")]
    TooManyKeys {
        /// How many it lists.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// No entry is a usable key; each one's issue is listed.
    #[error("the JWKS has no usable key{}", issues_text(.0))]
    NoUsableKey(Vec<KeyIssue>),
}

fn issues_text(issues: &[KeyIssue]) -> String {
    if issues.is_empty() {
        return " (its keys list is empty)".into();
    }
    let mut s = String::from(": ");
    for (i, issue) in issues.iter().enumerate() {
        if i > 0 {
            s.push_str("; ");
        }
        s.push_str(&issue.to_string());
    }
    s
}

impl Jwks {
    /// Parses a JWKS document (see the module docs for what is accepted and skipped).
    pub fn parse(document: &[u8]) -> Result<Jwks, JwksError> {
        if document.len() > MAX_JWKS_BYTES {
            return Err(JwksError::TooLarge {
                size: document.len(),
                limit: MAX_JWKS_BYTES,
            });
        }
        // serde_json bounds nesting (128 levels), so a hostile document cannot exhaust
        // the stack.
        let value: Value =
            serde_json::from_slice(document).map_err(|e| JwksError::NotJson(e.to_string()))?;
        let Value::Object(top) = value else {
            return Err(JwksError::Shape("is not a JSON object"));
        };
        let keys = match top.get("keys") {
            None => return Err(JwksError::Shape("has no [keys] field")),
            Some(Value::Array(keys)) => keys,
            Some(_) => return Err(JwksError::Shape("[keys] field is not a list")),
        };
        if keys.len() > MAX_KEYS {
            return Err(JwksError::TooManyKeys {
                count: keys.len(),
                limit: MAX_KEYS,
            });
        }
        let mut set = Jwks {
            keys: Vec::with_capacity(keys.len()),
            skipped: Vec::new(),
        };
        for (index, entry) in keys.iter().enumerate() {
            match parse_key(entry) {
                Ok(key) => set.keys.push(key),
                Err((field, problem)) => set.skipped.push(KeyIssue {
                    index,
                    field,
                    problem,
                }),
            }
        }
        if set.keys.is_empty() {
            return Err(JwksError::NoUsableKey(set.skipped));
        }
        Ok(set)
    }

    /// The usable keys, in document order.
    pub fn keys(&self) -> &[Key] {
        &self.keys
    }

    /// The entries that were skipped, and why.
    pub fn skipped(&self) -> &[KeyIssue] {
        &self.skipped
    }
}

type Issue = (&'static str, String);

fn issue(field: &'static str, problem: impl Into<String>) -> Issue {
    (field, problem.into())
}

/// An optional string member: absent, or a string (an empty one counts as absent, as in
/// Envoy); any other JSON type is an issue.
fn opt_str<'a>(key: &'a Map<String, Value>, field: &'static str) -> Result<Option<&'a str>, Issue> {
    match key.get(field) {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(issue(field, "is not a string")),
    }
}

fn req_str<'a>(key: &'a Map<String, Value>, field: &'static str) -> Result<&'a str, Issue> {
    opt_str(key, field)?.ok_or_else(|| issue(field, "is missing"))
}

fn decode(field: &'static str, s: &str) -> Result<Vec<u8>, Issue> {
    b64::decode(s.as_bytes()).ok_or_else(|| issue(field, "is not base64url"))
}

fn parse_key(entry: &Value) -> Result<Key, Issue> {
    let Value::Object(key) = entry else {
        return Err(issue("", "is not a JSON object"));
    };
    let kty = req_str(key, "kty")?;
    if let Some(u) = opt_str(key, "use")? {
        if u == "enc" {
            return Err(issue(
                "use",
                "is \"enc\": an encryption key, not for signatures",
            ));
        }
    }
    let kid = opt_str(key, "kid")?.map(str::to_owned);
    let alg_name = opt_str(key, "alg")?;
    let alg = match alg_name {
        None => None,
        Some(name) => Some(
            Alg::from_name(name)
                .ok_or_else(|| issue("alg", format!("{name:?} is not a supported algorithm")))?,
        ),
    };
    let verifiers = match kty {
        "RSA" => rsa_key(key, alg)?,
        "EC" => ec_key(key, alg)?,
        "OKP" => okp_key(key, alg)?,
        "oct" => return Err(issue("kty", "\"oct\" (HMAC) keys are not supported")),
        other => {
            return Err(issue(
                "kty",
                format!("{other:?} is not a supported key type"),
            ))
        }
    };
    Ok(Key {
        kid,
        alg,
        verifiers,
    })
}

fn rsa_key(
    key: &Map<String, Value>,
    alg: Option<Alg>,
) -> Result<Vec<(Alg, ParsedPublicKey)>, Issue> {
    if alg.is_some_and(|a| a.rsa_params().is_none()) {
        return Err(issue("alg", "is not RS* or PS* for an RSA key"));
    }
    let n = decode("n", req_str(key, "n")?)?;
    let e = decode("e", req_str(key, "e")?)?;
    let n = strip_zeros(&n);
    let e = strip_zeros(&e);
    let bits = bit_len(n);
    if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
        return Err(issue(
            "n",
            format!("is a {bits}-bit modulus; {MIN_RSA_BITS} to {MAX_RSA_BITS} bits are accepted"),
        ));
    }
    // Envoy's rule: only the two exponents in use; an odd one marks a crafted key.
    if e != [3] && e != [1, 0, 1] {
        return Err(issue("e", "is not 3 or 65537"));
    }
    let components = RsaPublicKeyComponents { n, e };
    let algs: &[Alg] = match &alg {
        Some(a) => std::slice::from_ref(a),
        None => &RSA_ALGS,
    };
    algs.iter()
        .filter_map(|a| a.rsa_params().map(|params| (*a, params)))
        .map(|(a, params)| {
            components
                .to_parsed_public_key(params)
                .map(|k| (a, k))
                .map_err(|e| issue("n", format!("is not a valid RSA public key ({e})")))
        })
        .collect()
}

fn ec_key(
    key: &Map<String, Value>,
    alg: Option<Alg>,
) -> Result<Vec<(Alg, ParsedPublicKey)>, Issue> {
    if alg.is_some_and(|a| !matches!(a, Alg::ES256 | Alg::ES384)) {
        return Err(issue("alg", "is not ES256 or ES384 for an EC key"));
    }
    let crv = opt_str(key, "crv")?;
    // Envoy's rules: `alg` and `crv` must agree when both are given; either picks the
    // curve; neither means P-256.
    let alg = match (alg, crv) {
        (Some(a), None) => a,
        (Some(Alg::ES256), Some("P-256")) | (None, Some("P-256")) | (None, None) => Alg::ES256,
        (Some(Alg::ES384), Some("P-384")) | (None, Some("P-384")) => Alg::ES384,
        (Some(a), Some(c @ ("P-256" | "P-384"))) => {
            return Err(issue("crv", format!("{c:?} does not fit alg {a}")))
        }
        (_, Some(c)) => return Err(issue("crv", format!("{c:?} is not a supported curve"))),
    };
    let (verify, size): (&'static sig::EcdsaVerificationAlgorithm, usize) = match alg {
        Alg::ES256 => (&sig::ECDSA_P256_SHA256_FIXED, 32),
        _ => (&sig::ECDSA_P384_SHA384_FIXED, 48),
    };
    let x = decode("x", req_str(key, "x")?)?;
    let y = decode("y", req_str(key, "y")?)?;
    for (field, v) in [("x", &x), ("y", &y)] {
        if v.len() != size {
            return Err(issue(
                field,
                format!("is {} bytes; the curve's coordinates are {size}", v.len()),
            ));
        }
    }
    let mut point = Vec::with_capacity(1 + 2 * size);
    point.push(0x04);
    point.extend_from_slice(&x);
    point.extend_from_slice(&y);
    let parsed = ParsedPublicKey::new(verify, point)
        .map_err(|_| issue("x", "x and y are not a point on the curve"))?;
    Ok(vec![(alg, parsed)])
}

fn okp_key(
    key: &Map<String, Value>,
    alg: Option<Alg>,
) -> Result<Vec<(Alg, ParsedPublicKey)>, Issue> {
    if alg.is_some_and(|a| a != Alg::EdDSA) {
        return Err(issue("alg", "is not EdDSA for an OKP key"));
    }
    match req_str(key, "crv")? {
        "Ed25519" => {}
        c => {
            return Err(issue(
                "crv",
                format!("{c:?} is not supported (only Ed25519)"),
            ))
        }
    }
    let x = decode("x", req_str(key, "x")?)?;
    if x.len() != 32 {
        return Err(issue(
            "x",
            format!("is {} bytes; an Ed25519 key is 32", x.len()),
        ));
    }
    let parsed = ParsedPublicKey::new(&sig::ED25519, x)
        .map_err(|_| issue("x", "is not a valid Ed25519 public key"))?;
    Ok(vec![(Alg::EdDSA, parsed)])
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let first = b.iter().position(|&x| x != 0).unwrap_or(b.len());
    &b[first..]
}

fn bit_len(n: &[u8]) -> usize {
    match n.first() {
        None => 0,
        Some(&top) => n.len() * 8 - top.leading_zeros() as usize,
    }
}

#[cfg(test)]
mod tests;
