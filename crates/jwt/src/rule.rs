//! One Istio `jwtRule`, validated: the issuer it accepts, the audiences, where its tokens
//! are found, what happens to the request once one is valid, and its key set.
//!
//! Defaults as Istio and Envoy: no `fromHeaders`, `fromParams` or `fromCookies` ⇒ the
//! `Authorization: Bearer <token>` header and the `access_token` query parameter; no
//! `audiences` ⇒ the audience is not checked; `forwardOriginalToken` false ⇒ the header
//! (or query parameter) that carried the token is removed before forwarding; a clock skew
//! of 60 s (Envoy's default; Istio does not set it); the claims `scope` and `permission`
//! are read as space-delimited lists (Istio's `spaceDelimitedClaims` defaults).

use std::time::Duration;

use http::HeaderName;

pub use crate::keys::KeySource;

/// Envoy's default clock skew allowance for `exp` and `nbf`.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// The claims Istio always reads as space-delimited lists.
pub const DEFAULT_SPACE_DELIMITED_CLAIMS: [&str; 2] = ["permission", "scope"];

/// A `jwtRule` as written in a RequestAuthentication (the fields that are not the key
/// set's; `jwks` / `jwksUri` become a [`KeySource`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JwtSpec {
    /// `issuer` (required): the `iss` this rule accepts.
    pub issuer: String,
    /// `audiences`: one of them must be in the token's `aud`; empty ⇒ not checked.
    pub audiences: Vec<String>,
    /// `fromHeaders`: `(name, prefix)`; the token follows the prefix.
    pub from_headers: Vec<(String, String)>,
    /// `fromParams`: query parameter names.
    pub from_params: Vec<String>,
    /// `fromCookies`: cookie names.
    pub from_cookies: Vec<String>,
    /// `forwardOriginalToken`.
    pub forward_original_token: bool,
    /// `outputPayloadToHeader` (empty ⇒ none): the token's payload, base64url, in this
    /// header.
    pub output_payload_to_header: String,
    /// `outputClaimToHeaders`: `(header, claim)`; a claim may be nested (`a.b`).
    pub output_claim_to_headers: Vec<(String, String)>,
    /// `spaceDelimitedClaims`, added to [`DEFAULT_SPACE_DELIMITED_CLAIMS`].
    pub space_delimited_claims: Vec<String>,
    /// The clock skew allowed for `exp` / `nbf`; `None` ⇒ [`DEFAULT_CLOCK_SKEW`].
    pub clock_skew: Option<Duration>,
}

/// Where a token is looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// A header; the token follows `prefix` (anywhere in the value, as Envoy finds it).
    Header { name: HeaderName, prefix: String },
    /// A query parameter (its first occurrence).
    Param(String),
    /// A cookie (its first occurrence).
    Cookie(String),
}

impl Location {
    /// The order Envoy's extractor keeps locations in (its maps are keyed by the header
    /// name and prefix, the parameter, the cookie).
    fn sort_key(&self) -> (&str, &str) {
        match self {
            Location::Header { name, prefix } => (name.as_str(), prefix),
            Location::Param(p) | Location::Cookie(p) => (p, ""),
        }
    }
}

/// A validated `jwtRule` with its key set.
#[derive(Debug, Clone)]
pub struct JwtRule {
    pub(crate) issuer: String,
    /// Sanitised as Envoy compares them (see [`sanitize_audience`]).
    pub(crate) audiences: Vec<String>,
    /// Header locations (sorted by name then prefix, deduplicated, as Envoy's map keeps
    /// them), then parameters, then cookies (each sorted).
    pub(crate) locations: Vec<Location>,
    pub(crate) forward: bool,
    pub(crate) payload_header: Option<HeaderName>,
    pub(crate) claim_headers: Vec<(HeaderName, String)>,
    pub(crate) space_delimited: Vec<String>,
    pub(crate) skew_secs: u64,
    pub(crate) keys: KeySource,
}

/// A `jwtRule` that cannot be applied (the policy author's fault: fix the
/// RequestAuthentication).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// `issuer` is empty.
    #[error("jwtRule: issuer is required")]
    NoIssuer,
    /// A header name that is not a valid HTTP header name.
    #[error("jwtRule: {field} names {name:?}, which is not a valid HTTP header name")]
    BadHeader {
        /// The field (`fromHeaders`, `outputPayloadToHeader`, `outputClaimToHeaders`).
        field: &'static str,
        /// The name as written.
        name: String,
    },
    /// An empty parameter, cookie or claim name.
    #[error("jwtRule: {0} has an empty name")]
    EmptyName(&'static str),
}

impl JwtRule {
    /// Validates a rule.
    pub fn new(spec: JwtSpec, keys: KeySource) -> Result<JwtRule, RuleError> {
        if spec.issuer.is_empty() {
            return Err(RuleError::NoIssuer);
        }
        let header = |field: &'static str, name: &str| {
            HeaderName::from_bytes(name.as_bytes())
                .ok()
                .filter(|_| !name.starts_with(':'))
                .ok_or_else(|| RuleError::BadHeader {
                    field,
                    name: name.to_string(),
                })
        };
        let mut headers = Vec::new();
        for (name, prefix) in &spec.from_headers {
            headers.push(Location::Header {
                name: header("fromHeaders", name)?,
                prefix: prefix.clone(),
            });
        }
        let mut params = Vec::new();
        for p in &spec.from_params {
            if p.is_empty() {
                return Err(RuleError::EmptyName("fromParams"));
            }
            params.push(Location::Param(p.clone()));
        }
        let mut cookies = Vec::new();
        for c in &spec.from_cookies {
            if c.is_empty() {
                return Err(RuleError::EmptyName("fromCookies"));
            }
            cookies.push(Location::Cookie(c.clone()));
        }
        if headers.is_empty() && params.is_empty() && cookies.is_empty() {
            headers.push(Location::Header {
                name: http::header::AUTHORIZATION,
                prefix: "Bearer ".into(),
            });
            params.push(Location::Param("access_token".into()));
        }
        let mut locations = Vec::new();
        for mut group in [headers, params, cookies] {
            group.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
            group.dedup();
            locations.extend(group);
        }
        let payload_header = match spec.output_payload_to_header.as_str() {
            "" => None,
            name => Some(header("outputPayloadToHeader", name)?),
        };
        let mut claim_headers = Vec::new();
        for (h, claim) in &spec.output_claim_to_headers {
            if claim.is_empty() {
                return Err(RuleError::EmptyName("outputClaimToHeaders claim"));
            }
            claim_headers.push((header("outputClaimToHeaders", h)?, claim.clone()));
        }
        let mut space_delimited: Vec<String> = DEFAULT_SPACE_DELIMITED_CLAIMS
            .iter()
            .map(|s| s.to_string())
            .chain(spec.space_delimited_claims.iter().cloned())
            .collect();
        space_delimited.sort();
        space_delimited.dedup();
        Ok(JwtRule {
            issuer: spec.issuer,
            audiences: spec
                .audiences
                .iter()
                .map(|a| sanitize_audience(a))
                .collect(),
            locations,
            forward: spec.forward_original_token,
            payload_header,
            claim_headers,
            space_delimited,
            skew_secs: spec.clock_skew.unwrap_or(DEFAULT_CLOCK_SKEW).as_secs(),
            keys,
        })
    }

    /// The issuer this rule accepts.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The rule's key set.
    pub fn keys(&self) -> &KeySource {
        &self.keys
    }

    /// The headers this rule writes (`outputPayloadToHeader`, `outputClaimToHeaders`):
    /// removed from every request first, so a client cannot send them forged.
    pub(crate) fn output_headers(&self) -> impl Iterator<Item = &HeaderName> {
        self.payload_header
            .iter()
            .chain(self.claim_headers.iter().map(|(h, _)| h))
    }

    /// Whether the token's audiences pass this rule (Envoy's CheckAudience).
    pub(crate) fn audience_allowed(&self, aud: &[String]) -> bool {
        self.audiences.is_empty()
            || aud
                .iter()
                .any(|a| self.audiences.contains(&sanitize_audience(a)))
    }
}

/// An audience as Envoy compares it: without an `http://` or `https://` scheme and without
/// one trailing `/`.
pub(crate) fn sanitize_audience(aud: &str) -> String {
    let a = aud
        .strip_prefix("http://")
        .or_else(|| aud.strip_prefix("https://"))
        .unwrap_or(aud);
    a.strip_suffix('/').unwrap_or(a).to_string()
}

/// Resolves once every remote key set of `rules` has finished its first fetch, so the
/// first requests after a policy loads are not refused only because the fetch was still
/// in flight (bound it with a timeout; a set that failed resolves at once).
pub async fn keys_ready(rules: &[JwtRule]) {
    for rule in rules {
        if let KeySource::Remote(remote) = rule.keys() {
            remote.ready().await;
        }
    }
}
