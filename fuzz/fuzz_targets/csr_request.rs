//! Certificate signing requests as `ambit control`'s CA receives them from its callers:
//! `requested_identity` (the CSR's signature and its single SPIFFE URI SAN), then signing.
//!
//! Input: PEM text, or DER wrapped in PEM when it is not text.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use ambit_identity::{requested_identity, CertificateAuthority, SpiffeId};
use libfuzzer_sys::fuzz_target;

fn ca() -> &'static CertificateAuthority {
    static CA: OnceLock<CertificateAuthority> = OnceLock::new();
    CA.get_or_init(|| CertificateAuthority::ephemeral("cluster.local").expect("a CA"))
}

fuzz_target!(|data: &[u8]| {
    let pem = match std::str::from_utf8(data) {
        Ok(text) => text.to_string(),
        Err(_) => ambit_identity::pem::encode("CERTIFICATE REQUEST", data),
    };
    let Ok((id, _)) = requested_identity(&pem) else {
        return;
    };
    assert_eq!(SpiffeId::parse(&id.to_string()).as_ref(), Ok(&id));
    // Whatever passed the checks signs, for exactly the identity it asked.
    let signed = ca()
        .sign_request(&pem, Duration::from_secs(60), SystemTime::now())
        .expect("a checked CSR signs");
    assert_eq!(signed.identity, id);
    assert!(signed.cert_chain.len() >= 2);
});
