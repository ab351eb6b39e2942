//! The shape of a workload leaf certificate (and of its CSR): empty subject, exactly one
//! URI SAN holding the SPIFFE id in a *critical* SubjectAltName extension (RFC 5280 requires
//! criticality when the subject is empty), ECDSA P-256 key.

use std::time::SystemTime;

use rcgen::{
    CertificateParams, CustomExtension, DistinguishedName, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SerialNumber,
};

use crate::error::CaError;
use crate::spiffe::SpiffeId;
use crate::x509::to_offset;

/// OID of the SubjectAltName extension (2.5.29.17).
const SUBJECT_ALT_NAME: &[u64] = &[2, 5, 29, 17];

/// A new ECDSA P-256 key pair for a workload.
pub(crate) fn new_key() -> Result<KeyPair, CaError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|source| CaError::Rcgen {
        context: "generating an ECDSA P-256 key",
        source,
    })
}

/// Parameters shared by the leaf certificate and the CSR: subject and SAN only.
pub(crate) fn base_params(id: &SpiffeId) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.custom_extensions = vec![san_extension(id)];
    params
}

/// Full leaf parameters: validity, serial, usages.
pub(crate) fn leaf_params(
    id: &SpiffeId,
    not_before: SystemTime,
    not_after: SystemTime,
    authority_key_id: bool,
) -> CertificateParams {
    let mut params = base_params(id);
    params.not_before = to_offset(not_before);
    params.not_after = to_offset(not_after);
    params.serial_number = Some(random_serial());
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = authority_key_id;
    params
}

/// A random positive 128-bit serial number.
pub(crate) fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    // The provider's RNG only fails when the OS has no entropy source at all; a
    // counter-free fallback is still unique enough combined with the time.
    if crate::tls::crypto_provider()
        .secure_random
        .fill(&mut bytes)
        .is_err()
    {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes = nanos.to_be_bytes();
    }
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01; // keep the full length: no leading zero byte
    SerialNumber::from_slice(&bytes)
}

/// A critical SubjectAltName extension holding one URI.
fn san_extension(id: &SpiffeId) -> CustomExtension {
    let uri = id.to_string();
    // GeneralNames ::= SEQUENCE OF GeneralName; uniformResourceIdentifier [6] IMPLICIT IA5String
    let mut general_name = vec![0x86];
    push_len(&mut general_name, uri.len());
    general_name.extend_from_slice(uri.as_bytes());
    let mut names = vec![0x30];
    push_len(&mut names, general_name.len());
    names.extend_from_slice(&general_name);
    let mut ext = CustomExtension::from_oid_content(SUBJECT_ALT_NAME, names);
    ext.set_criticality(true);
    ext
}

/// DER definite length.
fn push_len(out: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths() {
        let mut v = Vec::new();
        push_len(&mut v, 5);
        push_len(&mut v, 0x80);
        push_len(&mut v, 0x1234);
        assert_eq!(v, [5, 0x81, 0x80, 0x82, 0x12, 0x34]);
    }

    #[test]
    fn serials_are_positive_and_distinct() {
        let a = random_serial();
        let b = random_serial();
        assert_ne!(a, b);
        let bytes = a.to_bytes();
        assert_eq!(bytes.len(), 16);
        assert!(bytes[0] & 0x80 == 0 && bytes[0] != 0);
    }
}
