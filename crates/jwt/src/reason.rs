//! Why a request's token was refused, in Envoy's words, and the answer Envoy's `jwt_authn`
//! filter sends for it: the status (401, or 403 for an audience not allowed), the reason as
//! the body, `www-authenticate: Bearer realm="<url>", error="invalid_token"` and the
//! response-code details `jwt_authn_access_denied{<reason with _ for spaces>}`.

use std::fmt;

use http::{HeaderValue, StatusCode};

/// The longest path (with its query) Envoy puts in the `realm` of `www-authenticate`.
pub const MAX_REALM_PATH: usize = 256;

/// Why a token was refused. [`Reason::as_str`] is Envoy's text (jwt_verify_lib's status
/// strings), except for the two limits of ambit's own ([`Reason::TokenTooLarge`],
/// [`Reason::TooManyTokens`]), which Envoy does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Not three non-empty sections separated by two dots.
    BadFormat,
    /// The header section is not base64url.
    HeaderBadBase64,
    /// The header is not a JSON object.
    HeaderBadJson,
    /// The header has no `alg`, or it is not a string.
    HeaderBadAlg,
    /// `alg` names an algorithm that is not implemented (`none` among them).
    HeaderAlgNotImplemented,
    /// `kid` is present and not a string.
    HeaderBadKid,
    /// The payload section is not base64url.
    PayloadBadBase64,
    /// The payload is not a JSON object.
    PayloadBadJson,
    /// `iss` is present and not a string.
    IssNotString,
    /// `sub` is present and not a string.
    SubNotString,
    /// `iat` is present and not a number.
    IatNotInteger,
    /// `iat` is negative or past 64 bits.
    IatOutOfRange,
    /// `nbf` is present and not a number.
    NbfNotInteger,
    /// `nbf` is negative or past 64 bits.
    NbfOutOfRange,
    /// `exp` is present and not a number.
    ExpNotInteger,
    /// `exp` is negative or past 64 bits.
    ExpOutOfRange,
    /// `jti` is present and not a string.
    JtiNotString,
    /// `aud` is present and neither a string nor a list of strings.
    AudNotString,
    /// The signature section is not base64url.
    SignatureBadBase64,
    /// No rule for this location names the token's issuer.
    UnknownIssuer,
    /// The rule lists audiences and the token has none of them (Envoy answers 403).
    AudienceNotAllowed,
    /// `nbf` is in the future, past the clock skew allowed.
    NotYetValid,
    /// `exp` is in the past, past the clock skew allowed.
    Expired,
    /// A key matched the token's `kid` and `alg` and the signature did not verify with any.
    VerificationFailed,
    /// An Ed25519 signature that is not 64 bytes.
    Ed25519SignatureWrongLength,
    /// No key of the set matches the token's `kid` and `alg`.
    KidAlgMismatch,
    /// The rule's key set holds no usable key (an inline `jwks` that did not parse).
    JwksNoValidKeys,
    /// The rule's `jwksUri` has never been fetched successfully.
    JwksFetchFailed,
    /// ambit's own bound: the token is longer than [`crate::MAX_TOKEN_BYTES`].
    TokenTooLarge,
    /// ambit's own bound: the request carries more than [`crate::MAX_TOKENS`] tokens.
    TooManyTokens,
}

impl Reason {
    /// The reason as Envoy words it (the body of its answer).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadFormat => {
                "Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections"
            }
            Reason::HeaderBadBase64 => "Jwt header is an invalid Base64url encoded",
            Reason::HeaderBadJson => "Jwt header is an invalid JSON",
            Reason::HeaderBadAlg => "Jwt header [alg] field is required and must be a string",
            Reason::HeaderAlgNotImplemented => "Jwt header [alg] is not supported",
            Reason::HeaderBadKid => "Jwt header [kid] field is not a string",
            Reason::PayloadBadBase64 => "Jwt payload is an invalid Base64url encoded",
            Reason::PayloadBadJson => "Jwt payload is an invalid JSON",
            Reason::IssNotString => "Jwt payload [iss] field is not a string",
            Reason::SubNotString => "Jwt payload [sub] field is not a string",
            Reason::IatNotInteger => "Jwt payload [iat] field is not an integer",
            Reason::IatOutOfRange => "Jwt payload [iat] field is not a positive 64 bit integer",
            Reason::NbfNotInteger => "Jwt payload [nbf] field is not an integer",
            Reason::NbfOutOfRange => "Jwt payload [nbf] field is not a positive 64 bit integer",
            Reason::ExpNotInteger => "Jwt payload [exp] field is not an integer",
            Reason::ExpOutOfRange => "Jwt payload [exp] field is not a positive 64 bit integer",
            Reason::JtiNotString => "Jwt payload [jti] field is not a string",
            Reason::AudNotString => "Jwt payload [aud] field is not a string or string list",
            Reason::SignatureBadBase64 => "Jwt signature is an invalid Base64url encoded",
            Reason::UnknownIssuer => "Jwt issuer is not configured",
            Reason::AudienceNotAllowed => "Audiences in Jwt are not allowed",
            Reason::NotYetValid => "Jwt not yet valid",
            Reason::Expired => "Jwt is expired",
            Reason::VerificationFailed => "Jwt verification fails",
            Reason::Ed25519SignatureWrongLength => "Jwt ED25519 signature is wrong length",
            Reason::KidAlgMismatch => "Jwks doesn't have key to match kid or alg from Jwt",
            Reason::JwksNoValidKeys => "Jwks doesn't have any valid public key",
            Reason::JwksFetchFailed => "Jwks remote fetch is failed",
            Reason::TokenTooLarge => "Jwt is larger than 16384 bytes",
            Reason::TooManyTokens => "Found more than 8 Jwt tokens",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused request: what Envoy's `jwt_authn` filter answers for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: Reason,
}

impl Refusal {
    /// 403 for an audience not allowed, 401 otherwise (as Envoy).
    pub fn status(&self) -> StatusCode {
        match self.reason {
            Reason::AudienceNotAllowed => StatusCode::FORBIDDEN,
            _ => StatusCode::UNAUTHORIZED,
        }
    }

    /// The body (`text/plain`): the reason.
    pub fn body(&self) -> &'static str {
        self.reason.as_str()
    }

    /// The `www-authenticate` value: `Bearer realm="<scheme>://<authority><path>",
    /// error="invalid_token"`, the path (with its query, as received) cut to
    /// [`MAX_REALM_PATH`] bytes as Envoy does. A path or authority byte that may not stand
    /// in a header value (or a `"`, which would end the realm early) is left out.
    pub fn www_authenticate(&self, scheme: &str, authority: &str, path: &str) -> HeaderValue {
        let path = &path.as_bytes()[..path.len().min(MAX_REALM_PATH)];
        let mut v = Vec::with_capacity(48 + authority.len() + path.len());
        v.extend_from_slice(b"Bearer realm=\"");
        for part in [scheme.as_bytes(), b"://", authority.as_bytes(), path] {
            v.extend(part.iter().copied().filter(|&b| realm_byte(b)));
        }
        v.extend_from_slice(b"\", error=\"invalid_token\"");
        HeaderValue::from_bytes(&v).unwrap_or_else(|_| {
            // Unreachable: every byte was filtered to what a header value allows.
            HeaderValue::from_static("Bearer error=\"invalid_token\"")
        })
    }

    /// Envoy's response-code details: `jwt_authn_access_denied{<reason>}` with every space
    /// as `_`.
    pub fn details(&self) -> String {
        format!(
            "jwt_authn_access_denied{{{}}}",
            self.reason.as_str().replace(' ', "_")
        )
    }
}

/// A byte that may stand inside the quoted realm.
fn realm_byte(b: u8) -> bool {
    (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_answers() {
        let r = Refusal {
            reason: Reason::Expired,
        };
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.body(), "Jwt is expired");
        assert_eq!(r.details(), "jwt_authn_access_denied{Jwt_is_expired}");
        assert_eq!(
            r.www_authenticate("http", "svc.ns:8080", "/a/b?x=1"),
            "Bearer realm=\"http://svc.ns:8080/a/b?x=1\", error=\"invalid_token\""
        );
        let aud = Refusal {
            reason: Reason::AudienceNotAllowed,
        };
        assert_eq!(aud.status(), StatusCode::FORBIDDEN);
        // ambit's own limits say their numbers.
        let too_large = Reason::TokenTooLarge.as_str();
        assert!(too_large.contains(&crate::MAX_TOKEN_BYTES.to_string()));
        let too_many = Reason::TooManyTokens.as_str();
        assert!(too_many.contains(&crate::MAX_TOKENS.to_string()));
    }

    #[test]
    fn realm_path_is_cut_and_cleaned() {
        let r = Refusal {
            reason: Reason::VerificationFailed,
        };
        let long = format!("/{}", "a".repeat(400));
        let v = r.www_authenticate("https", "h", &long);
        let s = v.to_str().unwrap();
        assert_eq!(
            s,
            format!(
                "Bearer realm=\"https://h/{}\", error=\"invalid_token\"",
                "a".repeat(MAX_REALM_PATH - 1)
            )
        );
        let v = r.www_authenticate("http", "h\"x", "/p\"q\n");
        assert_eq!(
            v.to_str().unwrap(),
            "Bearer realm=\"http://hx/pq\", error=\"invalid_token\""
        );
    }
}
