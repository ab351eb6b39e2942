//! Peer certificates (DER): the SPIFFE ids in their URI SANs and the `/config_dump` view.
//!
//! Input: one DER certificate.
#![no_main]

use ambit_identity::{spiffe_ids_of, svid_identity, CertInfo, SpiffeId};
use libfuzzer_sys::fuzz_target;
use rustls::pki_types::CertificateDer;

fuzz_target!(|data: &[u8]| {
    let der = CertificateDer::from(data);
    for id in spiffe_ids_of(&der) {
        let shown = id.to_string();
        assert_eq!(SpiffeId::parse(&shown).as_ref(), Ok(&id));
    }
    // An SVID's one id is the only valid id among its URIs (other schemes never parse).
    if let Ok(id) = svid_identity(&der) {
        assert_eq!(spiffe_ids_of(&der), [id]);
    }
    let info = CertInfo::of(&der);
    assert!(!info.pem.is_empty());
    assert!(info.serial_number.bytes().all(|c| c.is_ascii_hexdigit()));
});
