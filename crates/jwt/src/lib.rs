//! Istio's `RequestAuthentication` (JWT) as Envoy's `jwt_authn` filter does it at an Istio
//! waypoint, for ambit's waypoint.
//!
//! - [`Jwks`]: a JSON Web Key Set read from outside, bounded, its keys parsed once.
//! - [`JwtRule`]: one validated `jwtRule` ([`JwtSpec`] + [`KeySource`]).
//! - [`authenticate`]: the decision for one request (sans-IO): [`Outcome::NoToken`],
//!   [`Outcome::Authenticated`] (the [`ambit_state::RequestAuth`] RBAC reads, and the
//!   [`HeaderEdits`] to apply), or [`Outcome::Refused`] (a [`Refusal`] with Envoy's status,
//!   body, `www-authenticate` and response-code details).
//! - [`JwksCache`] / [`RemoteJwks`]: key sets fetched from a `jwksUri` (IO: tokio, hyper,
//!   rustls), refreshed, the last good set kept.
//!
//! A waypoint uses it as: build each rule with [`JwtRule::new`] (its keys from
//! [`KeySource::inline`] or [`JwksCache::source`]); per request, call
//! [`authenticate_request`] (which lets CORS preflights through unchecked, their forged
//! output headers still removed), answer a refusal, else apply the edits and hand the
//! identity to authorization.

mod authn;
mod b64;
mod extract;
mod fetch;
mod jwks;
mod keys;
mod reason;
mod rule;
/// Keys and tokens for tests and the benchmark (the `testing` feature).
#[cfg(any(test, feature = "testing"))]
pub mod testkeys;
mod token;

pub use authn::{
    authenticate, authenticate_request, is_cors_preflight, HeaderEdits, Outcome, MAX_TOKENS,
    MAX_TOKEN_BYTES,
};
pub use fetch::{
    discovery_uri, fetch_discovered, fetch_jwks, FetchConfig, FetchError, RemoteJwks, RemoteState,
    DEFAULT_FETCH_TIMEOUT, DEFAULT_REFRESH, DEFAULT_RETRY,
};
pub use jwks::{
    Alg, Jwks, JwksError, Key, KeyIssue, MAX_JWKS_BYTES, MAX_KEYS, MAX_RSA_BITS, MIN_RSA_BITS,
};
pub use keys::JwksCache;
pub use reason::{Reason, Refusal, MAX_REALM_PATH};
pub use rule::{
    keys_ready, JwtRule, JwtSpec, KeySource, RuleError, DEFAULT_CLOCK_SKEW,
    DEFAULT_SPACE_DELIMITED_CLAIMS,
};
