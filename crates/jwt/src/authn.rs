//! The decision for one request (sans-IO): which tokens it carries, whether they are valid
//! for the rules that apply, and what to do to the request when they are.
//!
//! Istio gives Envoy one provider per rule (sorted by issuer) and the requirement
//! "any provider valid, or, for every provider, its token valid or absent". ambit evaluates
//! that requirement directly:
//!
//! - A rule looks at its own locations only. No token there ⇒ *missing*. Otherwise every
//!   token there must be valid for the rule: `iss` equal to the rule's issuer (else "Jwt
//!   issuer is not configured"), `nbf`/`exp` within the clock skew, an allowed audience,
//!   a key of the set matching `kid`/`alg`, and the signature.
//! - One rule: valid ⇒ authenticated; missing ⇒ passes without identity; else refused.
//! - Several rules: the first valid rule (in issuer order) authenticates the request;
//!   when every rule is missing the request passes without identity; otherwise it is
//!   refused, with the reason Envoy's requirement tree reports (the first real failure,
//!   where an unknown issuer counts only when nothing else failed).
//!
//! A valid rule's tokens are then stripped (unless `forwardOriginalToken`), its payload and
//! claims written to the headers it names, and the request's identity taken from its first
//! token (the one Envoy records last). Every rule's output headers are removed from the
//! incoming request first, so a client cannot forge them.

use std::time::{SystemTime, UNIX_EPOCH};

use ambit_state::RequestAuth;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use crate::extract::{self, Found};
use crate::reason::{Reason, Refusal};
use crate::rule::{JwtRule, Location};
use crate::token::{self, Token};

/// The longest token read; a longer one is refused before it is decoded. Envoy has no such
/// bound of its own (only its 60 KiB header limit); identity providers' tokens, groups
/// claims included, stay well under it.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The most tokens one rule reads from a request; more is refused (each must be verified).
pub const MAX_TOKENS: usize = 8;

/// What to do with a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// No rule found a token: the request goes on without a request identity
    /// (authorization decides; `requestPrincipals: ["*"]` requires one).
    NoToken {
        /// Edits to apply before forwarding (forged output headers removed).
        edits: HeaderEdits,
    },
    /// A valid token.
    Authenticated {
        /// The identity RBAC reads (`requestPrincipals`, `request.auth.*`).
        auth: RequestAuth,
        /// Edits to apply before forwarding.
        edits: HeaderEdits,
    },
    /// A token that is not valid: answer with [`Refusal::status`], its body and
    /// `www-authenticate`.
    Refused(Refusal),
}

/// Changes to the request before it is forwarded, applied in Envoy's order by
/// [`HeaderEdits::apply`]: `sanitize` removed, then `add` appended, then `remove` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderEdits {
    /// The rules' output headers, as a client may have sent them.
    pub sanitize: Vec<HeaderName>,
    /// `outputPayloadToHeader` and `outputClaimToHeaders` values (appended).
    pub add: Vec<(HeaderName, HeaderValue)>,
    /// Headers that carried a token not to forward (every value removed).
    pub remove: Vec<HeaderName>,
    /// Query parameters that carried a token not to forward (see
    /// [`HeaderEdits::strip_query`]).
    pub remove_params: Vec<String>,
}

impl HeaderEdits {
    /// Applies the header edits.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.sanitize {
            headers.remove(name);
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
        for name in &self.remove {
            headers.remove(name);
        }
    }

    /// The query to forward when [`HeaderEdits::remove_params`] is not empty: `query`
    /// (without `?`) less every pair of those parameters, the other pairs byte for byte;
    /// `None` when no pair is left. `query` itself when there is nothing to remove.
    pub fn strip_query(&self, query: &str) -> Option<String> {
        if self.remove_params.is_empty() {
            return Some(query.to_string());
        }
        extract::strip_params(query, &self.remove_params)
    }
}

/// One rule's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Missing,
    Invalid(Reason),
}

/// Authenticates a request against the rules that apply to it (see the module docs).
/// `query` is the request's query without `?`; `now` is the time to check `exp`/`nbf`
/// against.
pub fn authenticate(
    rules: &[JwtRule],
    headers: &HeaderMap,
    query: Option<&str>,
    now: SystemTime,
) -> Outcome {
    let now = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Istio sorts the rules by issuer (stably) before handing them to Envoy.
    let mut order: Vec<&JwtRule> = rules.iter().collect();
    order.sort_by(|a, b| a.issuer.cmp(&b.issuer));

    let mut verdicts = Vec::with_capacity(order.len());
    for rule in &order {
        let found = extract::tokens(rule, headers, query);
        match check_rule(rule, &found, now) {
            Ok(Some(valid)) => return authenticated(rules, rule, &found, &valid),
            Ok(None) => verdicts.push(Verdict::Missing),
            Err(reason) => verdicts.push(Verdict::Invalid(reason)),
        }
    }
    match combine(&verdicts) {
        Some(reason) => Outcome::Refused(Refusal { reason }),
        None => Outcome::NoToken {
            edits: HeaderEdits {
                sanitize: sanitized(rules),
                ..HeaderEdits::default()
            },
        },
    }
}

/// The reason Envoy's requirement reports when no rule is valid, or `None` when the
/// request passes (every rule missing). One rule: its own failure. Several: Istio's
/// `any(P1..Pn, all(any(Pi, allow_missing)))`, where the `all` fails with the first rule
/// that is not missing, and the outer `any` keeps the last failure that is neither
/// "missing" nor "unknown issuer", else "unknown issuer", else "missing".
fn combine(verdicts: &[Verdict]) -> Option<Reason> {
    let first_present = verdicts.iter().find_map(|v| match v {
        Verdict::Invalid(r) => Some(*r),
        _ => None,
    })?;
    if verdicts.len() == 1 {
        return Some(first_present);
    }
    let mut chosen: Option<Reason> = None;
    let children = verdicts
        .iter()
        .filter_map(|v| match v {
            Verdict::Invalid(r) => Some(*r),
            _ => None,
        })
        .chain(std::iter::once(first_present));
    for r in children {
        if r != Reason::UnknownIssuer || chosen.is_none() {
            chosen = Some(r);
        }
    }
    chosen
}

/// Checks every token a rule found: `Ok(None)` when it found none, `Ok(Some(tokens))` when
/// all are valid (in the order found), else the first failure in the order Envoy checks
/// them (the last found first).
fn check_rule<'a>(
    rule: &JwtRule,
    found: &'a [Found<'a>],
    now: u64,
) -> Result<Option<Vec<Token<'a>>>, Reason> {
    if found.is_empty() {
        return Ok(None);
    }
    if found.len() > MAX_TOKENS {
        return Err(Reason::TooManyTokens);
    }
    let mut valid = Vec::with_capacity(found.len());
    for f in found.iter().rev() {
        valid.push(check_token(rule, &f.token, now)?);
    }
    valid.reverse();
    Ok(Some(valid))
}

fn check_token<'a>(rule: &JwtRule, token: &'a [u8], now: u64) -> Result<Token<'a>, Reason> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Reason::TokenTooLarge);
    }
    let t = token::parse(token)?;
    if t.iss != rule.issuer {
        return Err(Reason::UnknownIssuer);
    }
    t.check_time(now, rule.skew_secs)?;
    if !rule.audience_allowed(&t.aud) {
        return Err(Reason::AudienceNotAllowed);
    }
    let keys = rule.keys.current()?;
    t.verify(&keys)?;
    Ok(t)
}

fn sanitized(rules: &[JwtRule]) -> Vec<HeaderName> {
    let mut names: Vec<HeaderName> = Vec::new();
    for name in rules.iter().flat_map(JwtRule::output_headers) {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

fn authenticated(
    rules: &[JwtRule],
    rule: &JwtRule,
    found: &[Found<'_>],
    valid: &[Token<'_>],
) -> Outcome {
    let mut edits = HeaderEdits {
        sanitize: sanitized(rules),
        ..HeaderEdits::default()
    };
    // Envoy handles the tokens last found first; each adds its outputs and, unless
    // forwarded, removes its location.
    for (f, t) in found.iter().zip(valid).rev() {
        if let Some(h) = &rule.payload_header {
            if let Ok(v) = HeaderValue::from_bytes(t.payload_b64) {
                edits.add.push((h.clone(), v));
            }
        }
        for (h, claim) in &rule.claim_headers {
            if let Some(v) = claim_header_value(&t.claims, claim) {
                edits.add.push((h.clone(), v));
            }
        }
        if !rule.forward {
            match f.location {
                Location::Header { name, .. } => {
                    if !edits.remove.contains(name) {
                        edits.remove.push(name.clone());
                    }
                }
                Location::Param(p) => {
                    if !edits.remove_params.contains(p) {
                        edits.remove_params.push(p.clone());
                    }
                }
                // Envoy leaves a cookie in place.
                Location::Cookie(_) => {}
            }
        }
    }
    match valid.first() {
        Some(first) => Outcome::Authenticated {
            auth: request_auth(rule, first),
            edits,
        },
        // Unreachable: a rule is valid only with a token.
        None => Outcome::NoToken { edits },
    }
}

fn request_auth(rule: &JwtRule, t: &Token<'_>) -> RequestAuth {
    let mut claims = t.claims.clone();
    for name in &rule.space_delimited {
        if let Some(Value::String(s)) = claims.get(name) {
            let list = s
                .split(' ')
                .filter(|p| !p.is_empty())
                .map(|p| Value::String(p.to_string()))
                .collect();
            claims.insert(name.clone(), Value::Array(list));
        }
    }
    RequestAuth {
        principal: format!("{}/{}", t.iss, t.sub),
        audiences: t.aud.clone(),
        presenter: match t.claims.get("azp") {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            _ => None,
        },
        claims,
    }
}

/// A claim as Envoy writes it to a header: a string as is, a whole non-negative number
/// below 2^64 as an integer, another number with six decimals (C++'s `to_string`), a
/// boolean as `true`/`false`; anything else (or an empty string, or a value a header
/// cannot hold) writes nothing. A claim may name a nested member (`a.b`).
fn claim_header_value(claims: &Map<String, Value>, path: &str) -> Option<HeaderValue> {
    let mut names = path.split('.');
    let mut value = claims.get(names.next()?)?;
    for name in names {
        value = value.as_object()?.get(name)?;
    }
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            let f = n.as_f64()?;
            if f >= 0.0 && f < u64::MAX as f64 && f.fract() == 0.0 {
                (f as u64).to_string()
            } else {
                format!("{f:.6}")
            }
        }
        _ => return None,
    };
    if text.is_empty() {
        return None;
    }
    HeaderValue::from_str(&text).ok()
}

/// [`authenticate`] for any request: a CORS preflight ([`is_cors_preflight`]) carries no
/// credentials and passes without a token check, as Istio configures Envoy
/// (`bypass_cors_preflight`), but the rules' output headers are removed from it like from
/// every other request, so a client cannot forge a claim header on an `OPTIONS`.
pub fn authenticate_request(
    rules: &[JwtRule],
    method: &http::Method,
    headers: &HeaderMap,
    query: Option<&str>,
    now: SystemTime,
) -> Outcome {
    if is_cors_preflight(method, headers) {
        return Outcome::NoToken {
            edits: HeaderEdits {
                sanitize: sanitized(rules),
                ..HeaderEdits::default()
            },
        };
    }
    authenticate(rules, headers, query, now)
}

/// Whether a request is a CORS preflight (`OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`), which Istio lets through without authentication
/// (`bypass_cors_preflight`); [`authenticate_request`] decides it.
pub fn is_cors_preflight(method: &http::Method, headers: &HeaderMap) -> bool {
    let present = |name| headers.get(name).is_some_and(|v| !v.is_empty());
    method == http::Method::OPTIONS
        && present(http::header::ORIGIN)
        && present(http::header::ACCESS_CONTROL_REQUEST_METHOD)
}

#[cfg(test)]
mod tests;
