//! The bearer token of a request, and why a request is refused (as the gRPC status the
//! client gets): shared by the CA, the file mode's gatekeeper and `--kubernetes`'s.

use tonic::Status;

/// Why a certificate request is refused, as the gRPC status the client gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No token, or one the tokens file does not list.
    Unauthenticated(String),
    /// The token may not ask for this identity.
    PermissionDenied(String),
    /// The request itself is malformed (CSR, metadata, trust domain).
    InvalidArgument(String),
}

impl From<Refusal> for Status {
    fn from(r: Refusal) -> Status {
        match r {
            Refusal::Unauthenticated(m) => Status::unauthenticated(m),
            Refusal::PermissionDenied(m) => Status::permission_denied(m),
            Refusal::InvalidArgument(m) => Status::invalid_argument(m),
        }
    }
}

/// The token of an `authorization: Bearer <token>` header value.
pub fn bearer(value: Option<&str>) -> Result<&str, Refusal> {
    let value = value.ok_or_else(|| {
        Refusal::Unauthenticated(
            "no `authorization: Bearer <token>` metadata; set AUTH_TOKEN to a token listed in the control server's tokens file".into(),
        )
    })?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Refusal::Unauthenticated("the authorization metadata is not `Bearer <token>`".into())
        })?;
    Ok(token)
}
