//! The `csr_request` target: certificate signing requests as `ambit control`'s CA receives
//! them from its callers: `requested_identity` (the CSR's signature and its single SPIFFE
//! URI SAN), then signing.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use ambit_identity::{requested_identity, CertificateAuthority, SpiffeId};

fn ca() -> &'static CertificateAuthority {
    static CA: OnceLock<CertificateAuthority> = OnceLock::new();
    CA.get_or_init(|| CertificateAuthority::ephemeral("cluster.local").expect("a CA"))
}

/// What the request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Signed for this identity.
    Signed(String),
    /// Refused by the checks (the error as it reads).
    Refused(String),
}

/// Input: PEM text; input that is not UTF-8 is wrapped as a PEM `CERTIFICATE REQUEST`.
///
/// Checks: the identity round-trips through `SpiffeId::parse`; a CSR that passes the checks
/// always signs, for exactly that identity, with a chain up to the CA.
pub fn run(data: &[u8]) -> Outcome {
    let pem = match std::str::from_utf8(data) {
        Ok(text) => text.to_string(),
        Err(_) => ambit_identity::pem::encode("CERTIFICATE REQUEST", data),
    };
    let id = match requested_identity(&pem) {
        Ok((id, _)) => id,
        Err(e) => return Outcome::Refused(e.to_string()),
    };
    assert_eq!(SpiffeId::parse(&id.to_string()).as_ref(), Ok(&id));
    // Whatever passed the checks signs, for exactly the identity it asked.
    let signed = ca()
        .sign_request(&pem, Duration::from_secs(60), SystemTime::now())
        .expect("a checked CSR signs");
    assert_eq!(signed.identity, id);
    assert!(signed.cert_chain.len() >= 2);
    Outcome::Signed(id.to_string())
}
