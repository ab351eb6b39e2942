//! Certificate signing requests for an external CA (Istio's `CreateCertificate`):
//! a fresh ECDSA P-256 key, empty subject, one critical URI SAN with the SPIFFE id.

use std::fmt;

use rustls::pki_types::PrivatePkcs8KeyDer;

use crate::error::CaError;
use crate::leaf;
use crate::spiffe::SpiffeId;

/// A PEM CSR and the PKCS#8 key that signed it (keep the key to pair it with the answer).
pub struct CertificateRequest {
    pub identity: SpiffeId,
    /// `-----BEGIN CERTIFICATE REQUEST-----` text.
    pub pem: String,
    pub key: PrivatePkcs8KeyDer<'static>,
}

impl CertificateRequest {
    /// Generates a key and a CSR for `id`.
    pub fn new(id: &SpiffeId) -> Result<CertificateRequest, CaError> {
        let key = leaf::new_key()?;
        let csr = leaf::base_params(id)
            .serialize_request(&key)
            .map_err(|source| CaError::Rcgen {
                context: "building the certificate signing request",
                source,
            })?;
        Ok(CertificateRequest {
            identity: id.clone(),
            pem: crate::pem::encode("CERTIFICATE REQUEST", csr.der()),
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        })
    }
}

impl fmt::Debug for CertificateRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateRequest")
            .field("identity", &self.identity)
            .field("pem", &self.pem)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateSigningRequestDer;
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::prelude::FromDer;

    #[test]
    fn csr_has_empty_subject_and_one_critical_uri_san() {
        let id = SpiffeId::parse("spiffe://cluster.local/ns/default/sa/web").unwrap();
        let req = CertificateRequest::new(&id).unwrap();
        assert!(req.pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----\n"));
        let der = CertificateSigningRequestDer::from_pem_slice(req.pem.as_bytes()).unwrap();
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
                .unwrap();
        assert_eq!(csr.certification_request_info.subject.iter().count(), 0);
        let exts: Vec<_> = csr.requested_extensions().unwrap().collect();
        assert_eq!(exts.len(), 1);
        let ParsedExtension::SubjectAlternativeName(san) = exts[0] else {
            panic!("not a SAN: {:?}", exts[0]);
        };
        assert_eq!(
            san.general_names,
            vec![GeneralName::URI("spiffe://cluster.local/ns/default/sa/web")]
        );
        // Criticality is in the raw extension; check the DER of the attribute.
        let raw = csr.certification_request_info.raw;
        let san_oid_critical = [0x06, 0x03, 0x55, 0x1d, 0x11, 0x01, 0x01, 0xff];
        assert!(raw.windows(8).any(|w| w == san_oid_critical));
        // The key is P-256 and pairs with the CSR.
        let kp = rcgen::KeyPair::try_from(req.key.secret_pkcs8_der()).unwrap();
        assert_eq!(kp.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(
            csr.certification_request_info
                .subject_pki
                .subject_public_key
                .data
                .as_ref(),
            kp.public_key_raw()
        );
    }
}
