//! Istio's `RequestAuthentication` at the waypoint: the documents loaded, each rule built
//! once (inline key sets parsed, `jwksUri` sets shared and refreshed by the JWKS cache),
//! and the rules that apply to a request: those of every RequestAuthentication attached
//! (by `targetRefs`, as AuthorizationPolicy attaches) to this waypoint or to the Service
//! the client dialled. The decision itself is `ambit_jwt::authenticate`.
//!
//! A rule whose keys cannot be had (a `jwksUri` that is not a URL the fetcher takes) is
//! kept with no key, and logged: a token of its issuer is then refused ("Jwks doesn't
//! have any valid public key"), never let through. A rule with neither `jwks` nor
//! `jwksUri` finds its keys by OpenID Connect discovery from its issuer, as Istio does.

use std::borrow::Cow;
use std::sync::Arc;

use ambit_jwt::{JwksCache, JwtRule, JwtSpec, KeySource};
use ambit_manifests::{JwksSource, JwtRuleSpec, WaypointAuthn};

use crate::authz::Attachment;
use crate::front::Fronted;

/// The RequestAuthentications loaded, with their rules built.
#[derive(Debug, Clone, Default)]
pub struct AuthnSet {
    entries: Vec<(Arc<WaypointAuthn>, Vec<JwtRule>)>,
}

impl AuthnSet {
    /// Builds every rule of `authns`; `jwks` fetches and shares the remote key sets.
    pub fn new(authns: Vec<WaypointAuthn>, jwks: &JwksCache) -> AuthnSet {
        let entries = authns
            .into_iter()
            .map(|a| {
                let rules = a
                    .rules
                    .iter()
                    .filter_map(|r| build_rule(&a, r, jwks))
                    .collect();
                (Arc::new(a), rules)
            })
            .collect();
        AuthnSet { entries }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The documents held, for `/config_dump`.
    pub fn authns(&self) -> impl Iterator<Item = &WaypointAuthn> {
        self.entries.iter().map(|(a, _)| &**a)
    }

    /// The rules of every RequestAuthentication attached to what `fronted` is, for the
    /// waypoint `me`, in load order: borrowed when one applies (the usual case), so a
    /// request copies no rule.
    pub fn rules_for(&self, me: &Attachment<'_>, fronted: &Fronted) -> Cow<'_, [JwtRule]> {
        let mut applying = self.entries.iter().filter(|(a, _)| {
            a.targets
                .iter()
                .any(|t| crate::authz::attaches(t, me, fronted))
        });
        let Some((_, first)) = applying.next() else {
            return Cow::Borrowed(&[]);
        };
        match applying.next() {
            None => Cow::Borrowed(first),
            Some((_, second)) => {
                let mut all = first.clone();
                all.extend(second.iter().cloned());
                all.extend(applying.flat_map(|(_, rules)| rules.iter().cloned()));
                Cow::Owned(all)
            }
        }
    }
}

/// A key source with no key: every token of its rule is refused.
fn no_keys() -> KeySource {
    KeySource::inline("")
}

fn build_rule(a: &WaypointAuthn, r: &JwtRuleSpec, jwks: &JwksCache) -> Option<JwtRule> {
    let keys = match &r.jwks {
        JwksSource::Inline(text) => KeySource::inline(text),
        JwksSource::Uri(uri) => match jwks.source(&uri.to_string(), r.timeout) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(authn = %a.key(), issuer = %r.issuer, "jwksUri {uri} cannot be fetched ({e}): tokens of this issuer are refused");
                no_keys()
            }
        },
        JwksSource::Discovery => match jwks.discovered(&r.issuer, r.timeout) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(authn = %a.key(), issuer = %r.issuer, "the issuer's OpenID Connect discovery cannot be used ({e}): tokens of this issuer are refused");
                no_keys()
            }
        },
    };
    let spec = JwtSpec {
        issuer: r.issuer.clone(),
        audiences: r.audiences.clone(),
        from_headers: r
            .from_headers
            .iter()
            .map(|h| (h.name.to_string(), h.prefix.clone()))
            .collect(),
        from_params: r.from_params.clone(),
        from_cookies: r.from_cookies.clone(),
        forward_original_token: r.forward_original_token,
        output_payload_to_header: r
            .output_payload_to_header
            .as_ref()
            .map_or_else(String::new, |h| h.to_string()),
        output_claim_to_headers: r
            .output_claim_to_headers
            .iter()
            .map(|c| (c.header.to_string(), c.claim.clone()))
            .collect(),
        ..JwtSpec::default()
    };
    match JwtRule::new(spec, keys) {
        Ok(rule) => Some(rule),
        Err(e) => {
            tracing::error!(authn = %a.key(), issuer = %r.issuer, "jwtRule refused ({e}): tokens of this issuer are refused");
            None
        }
    }
}
