//! A RequestAuthentication, as read ([`crate::authn_schema`]), checked as Istio checks it
//! (its CRD's rules and its validation webhook's) and translated into the waypoint's
//! model ([`WaypointAuthn`]). It attaches by `targetRefs` exactly as an AuthorizationPolicy
//! does ([`crate::translate::targets`]); one with a `selector`, or neither, is for
//! sidecars and gateways: skipped.
//!
//! Stricter than Istio, each where reading on would let through what the author did not
//! mean: the newer fields `spaceDelimitedClaims`, `presence` and `failedStatusInMetadata`
//! are refused by name (not implemented, and each changes which requests pass); an inline
//! `jwks` is at most [`MAX_INLINE_JWKS_BYTES`]; an output header may not be one that frames
//! or routes the request (a token's claim must not set `content-length`). Sans-IO.

use std::collections::HashSet;
use std::time::Duration;

use http::header::HeaderName;

use crate::authn_schema::{AuthnObject, ClaimToHeaderFields, JwtHeaderFields, JwtRuleFields};
use crate::go_duration::parse_go_duration;
use crate::locate::{field, FieldPath};
use crate::model::{
    ClaimToHeader, JwksSource, JwtHeader, JwtRuleSpec, SkipReason, WaypointAuthn,
    DEFAULT_JWKS_TIMEOUT,
};
use crate::route_translate::header_name;
use crate::translate::{namespace_and_name, targets, Invalid};
use crate::values::Text;
use crate::ParseOptions;

/// The versions of RequestAuthentication read (of [`crate::SECURITY_GROUP`]).
pub const REQUEST_AUTHENTICATION_VERSIONS: &[&str] = &["v1", "v1beta1"];

/// The largest inline `jwks` read: a key set is a few KiB; a larger one belongs at a URL.
pub const MAX_INLINE_JWKS_BYTES: usize = 256 << 10;

// The CRD's limits.
const MAX_JWT_RULES: usize = 4096;
const MAX_JWKS_URI: usize = 2048;
/// The shortest `timeout` (the CRD's).
const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// Headers a verified token's payload or claims must not set: they frame the request or
/// say where it goes, so a token's holder would choose them.
const RESERVED_OUTPUT_HEADERS: &[&str] = &[
    "connection",
    "content-length",
    "host",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn invalid(path: FieldPath, message: impl Into<String>) -> Invalid {
    Invalid {
        path,
        message: message.into(),
    }
}

/// What a RequestAuthentication came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AuthnOutcome {
    Authn(WaypointAuthn),
    Skipped(SkipReason),
}

/// Its namespace (defaulted) and name, and what it came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AuthnTranslation {
    pub namespace: String,
    pub name: String,
    pub outcome: AuthnOutcome,
}

/// Checks and translates a RequestAuthentication. One every check passes that has no
/// targets is not a waypoint's (skipped).
pub(crate) fn translate_authn(
    obj: AuthnObject,
    options: &ParseOptions,
) -> Result<AuthnTranslation, Invalid> {
    let (namespace, name) = namespace_and_name(&obj.metadata, options)?;
    let spec = obj.spec.unwrap_or_default();
    let targets = targets(
        spec.selector.is_some(),
        spec.target_ref.as_ref(),
        spec.target_refs.as_deref(),
        &namespace,
        options,
    )?;
    let rules_spec = spec.jwt_rules.unwrap_or_default();
    if rules_spec.len() > MAX_JWT_RULES {
        return Err(invalid(
            field!["spec", "jwtRules"],
            format!("at most {MAX_JWT_RULES} rules"),
        ));
    }
    let rules = rules_spec
        .into_iter()
        .enumerate()
        .map(|(i, r)| jwt_rule(field!["spec", "jwtRules", i], r))
        .collect::<Result<Vec<_>, _>>()?;
    let outcome = match (targets.is_empty(), spec.selector.is_some()) {
        (true, true) => AuthnOutcome::Skipped(SkipReason::AuthnSelector),
        (true, false) => AuthnOutcome::Skipped(SkipReason::AuthnNamespaceWide),
        (false, _) => AuthnOutcome::Authn(WaypointAuthn {
            namespace: namespace.clone(),
            name: name.clone(),
            targets,
            rules,
        }),
    };
    Ok(AuthnTranslation {
        namespace,
        name,
        outcome,
    })
}

fn jwt_rule(p: FieldPath, r: JwtRuleFields) -> Result<JwtRuleSpec, Invalid> {
    for (f, set) in [
        ("spaceDelimitedClaims", r.space_delimited_claims.is_some()),
        ("presence", r.presence.is_some()),
        (
            "failedStatusInMetadata",
            r.failed_status_in_metadata.is_some(),
        ),
    ] {
        if set {
            return Err(invalid(
                p.at(field![f]),
                "is not supported by this waypoint, and it changes which requests pass; remove it (the RequestAuthentication is refused while it is there)",
            ));
        }
    }
    let issuer = r.issuer.0;
    if issuer.is_empty() {
        return Err(invalid(
            p.at(field!["issuer"]),
            "must not be empty: a token's iss must equal it",
        ));
    }
    let audiences = non_empty(&p.at(field!["audiences"]), r.audiences, |_| Ok(()))?;
    let jwks = jwks(&p, r.jwks_uri, r.jwks_uri_snake, r.jwks)?;
    let from_headers = r
        .from_headers
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(j, h)| jwt_header(p.at(field!["fromHeaders", j]), h))
        .collect::<Result<Vec<_>, _>>()?;
    let from_params = non_empty(&p.at(field!["fromParams"]), r.from_params, |_| Ok(()))?;
    let from_cookies = non_empty(&p.at(field!["fromCookies"]), r.from_cookies, cookie_name)?;
    let output_payload_to_header = r
        .output_payload_to_header
        .map(|Text(h)| {
            let hp = p.at(field!["outputPayloadToHeader"]);
            if h.is_empty() {
                return Err(invalid(
                    hp,
                    "must not be empty; leave it out to send no payload upstream",
                ));
            }
            output_header(&h, header_name).map_err(|m| invalid(hp, m))
        })
        .transpose()?;
    let output_claim_to_headers = claim_headers(&p, r.output_claim_to_headers.unwrap_or_default())?;
    let timeout = match r.timeout {
        None => DEFAULT_JWKS_TIMEOUT,
        Some(Text(t)) => {
            let tp = p.at(field!["timeout"]);
            let d = parse_go_duration(&t).map_err(|m| invalid(tp.clone(), m))?;
            if d < MIN_TIMEOUT {
                return Err(invalid(tp, format!("{t:?} is shorter than 1ms")));
            }
            d
        }
    };
    Ok(JwtRuleSpec {
        issuer,
        audiences,
        jwks,
        from_headers,
        from_params,
        from_cookies,
        forward_original_token: r.forward_original_token.unwrap_or(false),
        output_payload_to_header,
        output_claim_to_headers,
        timeout,
    })
}

/// A list of strings, each non-empty and passing `check`.
fn non_empty(
    p: &FieldPath,
    list: Option<Vec<Text>>,
    check: impl Fn(&str) -> Result<(), String>,
) -> Result<Vec<String>, Invalid> {
    list.unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(j, Text(s))| {
            if s.is_empty() {
                return Err(invalid(p.at(field![j]), "must not be empty"));
            }
            check(&s).map_err(|m| invalid(p.at(field![j]), m))?;
            Ok(s)
        })
        .collect()
}

/// The key set's source: at most one of `jwksUri`, `jwks_uri` and `jwks`.
fn jwks(
    p: &FieldPath,
    uri: Option<Text>,
    uri_snake: Option<Text>,
    inline: Option<Text>,
) -> Result<JwksSource, Invalid> {
    let written: Vec<(&str, Text)> = [("jwksUri", uri), ("jwks_uri", uri_snake), ("jwks", inline)]
        .into_iter()
        .filter_map(|(f, v)| v.map(|v| (f, v)))
        .collect();
    let (f, Text(value)) = match <[_; 1]>::try_from(written) {
        Ok([one]) => one,
        Err(written) if written.is_empty() => return Ok(JwksSource::Discovery),
        Err(written) => {
            return Err(invalid(
                p.at(field![written[1].0]),
                format!(
                    "set only one of jwksUri and jwks; {} is set too",
                    written[0].0
                ),
            ))
        }
    };
    let fp = p.at(field![f]);
    if f == "jwks" {
        if value.is_empty() {
            return Err(invalid(
                fp,
                "must not be empty; leave it out to find the keys through the issuer's OpenID discovery",
            ));
        }
        if value.len() > MAX_INLINE_JWKS_BYTES {
            return Err(invalid(
                fp,
                format!(
                    "is {} bytes; an inline key set is at most {MAX_INLINE_JWKS_BYTES} bytes (256 KiB): serve a larger one at a jwksUri",
                    value.len()
                ),
            ));
        }
        return Ok(JwksSource::Inline(value));
    }
    jwks_uri(&value)
        .map(JwksSource::Uri)
        .map_err(|m| invalid(fp, m))
}

/// An absolute `http` or `https` URL with a host, at most [`MAX_JWKS_URI`] long.
fn jwks_uri(s: &str) -> Result<http::Uri, String> {
    if s.is_empty() || s.len() > MAX_JWKS_URI {
        return Err(format!("must be 1-{MAX_JWKS_URI} characters"));
    }
    let uri: http::Uri = s.parse().map_err(|e| format!("{s:?} is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!("{s:?} must be an http:// or https:// URL"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{s:?} names no host"));
    }
    Ok(uri)
}

fn jwt_header(p: FieldPath, h: JwtHeaderFields) -> Result<JwtHeader, Invalid> {
    let name = header_name(&h.name.0).map_err(|m| invalid(p.at(field!["name"]), m))?;
    let prefix = h.prefix.map(|t| t.0).unwrap_or_default();
    if http::HeaderValue::from_str(&prefix).is_err() {
        return Err(invalid(
            p.at(field!["prefix"]),
            format!("{prefix:?} has a control character, which no header value holds, so no token would be found"),
        ));
    }
    Ok(JwtHeader { name, prefix })
}

/// A cookie name: a token of RFC 6265 (any other can never be sent).
fn cookie_name(s: &str) -> Result<(), String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    match s.chars().all(token) {
        true => Ok(()),
        false => Err(format!(
            "{s:?} is not a cookie name (letters, digits or !#$%&'*+-.^_`|~)"
        )),
    }
}

/// An output header: read by `read`, and not one of [`RESERVED_OUTPUT_HEADERS`].
fn output_header(
    s: &str,
    read: impl Fn(&str) -> Result<HeaderName, String>,
) -> Result<HeaderName, String> {
    let name = read(s)?;
    if RESERVED_OUTPUT_HEADERS.contains(&name.as_str()) {
        return Err(format!(
            "{s:?} frames or routes the request; a token's payload or claims cannot set it"
        ));
    }
    Ok(name)
}

/// `outputClaimToHeaders`: each header named once, of the CRD's form.
fn claim_headers(
    p: &FieldPath,
    list: Vec<ClaimToHeaderFields>,
) -> Result<Vec<ClaimToHeader>, Invalid> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for (j, c) in list.into_iter().enumerate() {
        let cp = p.at(field!["outputClaimToHeaders", j]);
        let header = output_header(&c.header.0, claim_header_name)
            .map_err(|m| invalid(cp.at(field!["header"]), m))?;
        if !seen.insert(header.clone()) {
            return Err(invalid(
                cp.at(field!["header"]),
                format!(
                    "{:?} is named twice; each claim goes to its own header",
                    c.header.0
                ),
            ));
        }
        if c.claim.0.is_empty() {
            return Err(invalid(cp.at(field!["claim"]), "must not be empty"));
        }
        out.push(ClaimToHeader {
            header,
            claim: c.claim.0,
        });
    }
    Ok(out)
}

/// The CRD's form of an `outputClaimToHeaders` header: letters, digits, `-` and `_`.
fn claim_header_name(s: &str) -> Result<HeaderName, String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if s.is_empty() || !s.chars().all(ok) {
        return Err(format!(
            "{s:?} is not a header name here: letters, digits, '-' and '_'"
        ));
    }
    header_name(s)
}
