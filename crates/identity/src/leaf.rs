//! The shape of a workload leaf certificate (and of its CSR): empty subject, exactly one
//! URI SAN holding the SPIFFE id in a *critical* SubjectAltName extension (RFC 5280 requires
//! criticality when the subject is empty), ECDSA P-256 key, and a critical basicConstraints
//! that is an empty SEQUENCE (not a CA, in DER: the DEFAULT `cA FALSE` is left out, as Go's
//! x509, hence Istio's CA, writes it; strict parsers refuse it spelled out).

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
/// OID of the BasicConstraints extension (2.5.29.19).
const BASIC_CONSTRAINTS: &[u64] = &[2, 5, 29, 19];

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
    end_entity(&mut params);
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

/// Marks `params` as an end entity: a critical basicConstraints holding an empty SEQUENCE.
/// rcgen's `IsCa::ExplicitNoCa` encodes `cA BOOLEAN FALSE`, which is not DER.
pub(crate) fn end_entity(params: &mut CertificateParams) {
    params.is_ca = IsCa::NoCa;
    let mut ext = CustomExtension::from_oid_content(BASIC_CONSTRAINTS, vec![0x30, 0x00]);
    ext.set_criticality(true);
    params.custom_extensions.push(ext);
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

    /// Every end-entity certificate ambit makes: a CA-signed leaf, a CSR-signed leaf (the
    /// answer of `CreateCertificate`) and a control-plane server certificate.
    fn end_entities() -> Vec<(&'static str, rustls::pki_types::CertificateDer<'static>)> {
        use std::time::Duration;
        let ca = crate::CertificateAuthority::ephemeral("cluster.local").unwrap();
        let id = SpiffeId::parse("spiffe://cluster.local/ns/a/sa/b").unwrap();
        let hour = Duration::from_secs(3600);
        let now = SystemTime::now();
        let leaf = ca.issue(&id, hour).unwrap().chain.remove(0);
        let csr = crate::CertificateRequest::new(&id).unwrap();
        let signed = ca.sign_request(&csr.pem, hour, now).unwrap();
        let answered = crate::pem::parse_certs(signed.cert_chain[0].as_bytes())
            .unwrap()
            .remove(0);
        let (mut server, _, _) = ca
            .issue_server_cert(
                &["istiod.istio-system.svc".to_string()],
                &["127.0.0.1".parse().unwrap()],
                None,
                hour,
                now,
            )
            .unwrap();
        vec![
            ("leaf", leaf),
            ("CSR-signed leaf", answered),
            ("server certificate", server.remove(0)),
        ]
    }

    /// DER omits a DEFAULT value: basicConstraints of an end entity is an empty SEQUENCE
    /// (cA FALSE left out), never `cA BOOLEAN FALSE` spelled out.
    #[test]
    fn basic_constraints_of_end_entities_are_der() {
        for (what, der) in end_entities() {
            let cert = crate::x509::parse(&der).unwrap();
            let bc: Vec<_> = cert
                .extensions()
                .iter()
                .filter(|e| e.oid.to_id_string() == "2.5.29.19")
                .collect();
            assert_eq!(bc.len(), 1, "{what}: one basicConstraints extension");
            assert!(bc[0].critical, "{what}: basicConstraints is critical");
            // BOOLEAN (tag 1, length 1) FALSE (0).
            assert!(
                !bc[0].value.windows(3).any(|w| w == [0x01, 0x01, 0x00]),
                "{what}: basicConstraints spells out cA FALSE: {:02x?}",
                bc[0].value
            );
            assert_eq!(bc[0].value, [0x30, 0x00], "{what}: an empty SEQUENCE");
            assert!(!cert.is_ca(), "{what}");
        }
    }

    /// A strict DER parser (Python's `cryptography`, Debian's python3-cryptography) loads
    /// each certificate and reads every extension. Fails, never skips, without it.
    #[test]
    fn a_strict_der_parser_reads_our_certificates() {
        const PYTHON: &str = "/usr/bin/python3";
        let script = r#"
import sys
from cryptography import x509
for arg in sys.argv[1:]:
    what, hexder = arg.split("=", 1)
    cert = x509.load_der_x509_certificate(bytes.fromhex(hexder))
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and not bc.value.ca, (what, bc)
    print(what, len(cert.extensions), "extensions")
"#;
        let args: Vec<String> = end_entities()
            .into_iter()
            .map(|(what, der)| {
                let hex: String = der.iter().map(|b| format!("{b:02x}")).collect();
                format!("{what}={hex}")
            })
            .collect();
        let out = std::process::Command::new(PYTHON)
            .arg("-c")
            .arg(script)
            .args(&args)
            .output()
            .unwrap_or_else(|e| {
                panic!("this test needs {PYTHON} with the cryptography module (apt-get install python3-cryptography): {e}")
            });
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("No module named 'cryptography'"),
            "this test needs Python's cryptography module (apt-get install python3-cryptography): {stderr}"
        );
        assert!(
            out.status.success(),
            "cryptography refused a certificate: {stderr}"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.lines().count(), 3, "{stdout}");
    }
}
