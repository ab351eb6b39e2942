//! The `x509_cert` target: peer certificates (DER), the SPIFFE ids in their URI SANs and
//! the `/config_dump` view.

use ambit_identity::{spiffe_ids_of, svid_identity, CertInfo, SpiffeId};
use rustls::pki_types::CertificateDer;

/// What the certificate came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Every SPIFFE id among its URI SANs.
    pub ids: Vec<SpiffeId>,
    /// Its identity as an SVID, if it is one.
    pub svid: Option<SpiffeId>,
}

/// Input: one DER certificate.
///
/// Checks: every id found round-trips through `SpiffeId::parse`; `svid_identity` accepts
/// only a certificate whose one valid id is all `spiffe_ids_of` finds; `CertInfo` shows a
/// PEM and a hex serial.
pub fn run(data: &[u8]) -> Outcome {
    let der = CertificateDer::from(data);
    let ids = spiffe_ids_of(&der);
    for id in &ids {
        let shown = id.to_string();
        assert_eq!(SpiffeId::parse(&shown).as_ref(), Ok(id));
    }
    // An SVID's one id is the only valid id among its URIs (other schemes never parse).
    let svid = svid_identity(&der).ok();
    if let Some(id) = &svid {
        assert_eq!(ids, std::slice::from_ref(id));
    }
    let info = CertInfo::of(&der);
    assert!(!info.pem.is_empty());
    assert!(info.serial_number.bytes().all(|c| c.is_ascii_hexdigit()));
    Outcome { ids, svid }
}
