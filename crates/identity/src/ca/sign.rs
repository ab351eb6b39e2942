//! Signing a workload's CSR, as Istio's `CreateCertificate` does: the CA keeps no copy of
//! the key, the requester proves it holds it by the CSR's signature.

use std::time::{Duration, SystemTime};

use rcgen::{CertificateSigningRequestParams, SanType};

use super::CertificateAuthority;
use crate::error::CaError;
use crate::leaf;
use crate::pem;
use crate::spiffe::SpiffeId;

/// Why a CSR was refused. Always the requester's to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CsrError {
    #[error("the CSR is not a PEM certificate request with a valid signature")]
    Unparsable,
    #[error("the CSR carries {found} subject alternative names; it must carry exactly one URI (the SPIFFE id)")]
    SanCount { found: usize },
    #[error("the CSR's subject alternative name is not a URI: {found}")]
    NotUri { found: String },
    #[error("the CSR's URI SAN {uri:?} is not a SPIFFE id: {reason}")]
    NotSpiffe { uri: String, reason: String },
    #[error("the requested lifetime must be positive")]
    ZeroTtl,
    #[error("the CA's certificate expired; it cannot sign")]
    CaExpired,
    #[error("signing failed: {0}")]
    Sign(String),
}

/// A signed certificate in the shape of Istio's `IstioCertificateResponse.cert_chain`.
#[derive(Debug, Clone)]
pub struct SignedCertificate {
    pub identity: SpiffeId,
    /// The leaf PEM, each intermediate PEM, and last every root PEM concatenated.
    pub cert_chain: Vec<String>,
    pub not_after: SystemTime,
}

/// The SPIFFE id a CSR asks for: its one URI SAN. Checks the CSR's signature too.
pub fn requested_identity(
    csr_pem: &str,
) -> Result<(SpiffeId, CertificateSigningRequestParams), CsrError> {
    // rcgen verifies the CSR's self-signature while parsing.
    let csr =
        CertificateSigningRequestParams::from_pem(csr_pem).map_err(|_| CsrError::Unparsable)?;
    let sans = &csr.params.subject_alt_names;
    if sans.len() != 1 {
        return Err(CsrError::SanCount { found: sans.len() });
    }
    let uri = match &sans[0] {
        SanType::URI(uri) => uri.as_str().to_string(),
        other => {
            return Err(CsrError::NotUri {
                found: format!("{other:?}"),
            })
        }
    };
    let id = SpiffeId::parse(&uri).map_err(|e| CsrError::NotSpiffe {
        uri: uri.clone(),
        reason: e.to_string(),
    })?;
    Ok((id, csr))
}

impl CertificateAuthority {
    /// Signs `csr_pem` for the identity of its single URI SAN, valid for `ttl` from `now`
    /// (clamped to the CA's own expiry). Whether the caller may have that identity is the
    /// caller's to decide before calling ([`requested_identity`] tells which it is).
    pub fn sign_request(
        &self,
        csr_pem: &str,
        ttl: Duration,
        now: SystemTime,
    ) -> Result<SignedCertificate, CsrError> {
        let (identity, csr) = requested_identity(csr_pem)?;
        let (not_before, not_after) = self.validity(ttl, now).map_err(|e| match e {
            CaError::InvalidTtl { .. } => CsrError::ZeroTtl,
            CaError::Expired { .. } => CsrError::CaExpired,
            other => CsrError::Sign(other.to_string()),
        })?;
        // Only the key comes from the CSR; every other field is the CA's choice.
        let params = leaf::leaf_params(&identity, not_before, not_after, self.authority_key_id);
        let cert = params
            .signed_by(&csr.public_key, &self.issuer, &self.key)
            .map_err(|e| CsrError::Sign(e.to_string()))?;
        let mut cert_chain = Vec::with_capacity(2 + self.intermediates.len());
        cert_chain.push(pem::encode("CERTIFICATE", cert.der()));
        for der in &self.intermediates {
            cert_chain.push(pem::encode("CERTIFICATE", der));
        }
        cert_chain.push(pem::certs_pem(&self.roots));
        Ok(SignedCertificate {
            identity,
            cert_chain,
            not_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CertificateRequest, WorkloadCertificate};

    fn id(s: &str) -> SpiffeId {
        SpiffeId::parse(s).unwrap()
    }

    #[test]
    fn a_signed_csr_pairs_with_its_key_and_chains_to_the_root() {
        let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        let want = id("spiffe://cluster.local/ns/default/sa/web");
        let req = CertificateRequest::new(&want).unwrap();
        let now = SystemTime::now();
        let signed = ca
            .sign_request(&req.pem, Duration::from_secs(3600), now)
            .unwrap();
        assert_eq!(signed.identity, want);
        assert!(signed.cert_chain.len() >= 2);
        // The answer assembles into a usable certificate with the requester's key.
        let cert = WorkloadCertificate::from_ca_response(want.clone(), req.key, &signed.cert_chain)
            .unwrap();
        assert_eq!(cert.identity, want);
        assert_eq!(cert.roots, ca.roots());
        crate::tls::server_config(&cert).unwrap();
        let lifetime = cert.not_after.duration_since(now).unwrap();
        assert!(lifetime <= Duration::from_secs(3600), "{lifetime:?}");
    }

    #[test]
    fn csrs_without_exactly_one_spiffe_uri_are_refused() {
        let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let csr_with = |sans: Vec<SanType>| {
            let mut p = rcgen::CertificateParams::default();
            p.subject_alt_names = sans;
            p.serialize_request(&key).unwrap().pem().unwrap()
        };
        let uri = |s: &str| SanType::URI(s.try_into().unwrap());
        let ttl = Duration::from_secs(60);
        let now = SystemTime::now();
        let two = csr_with(vec![
            uri("spiffe://cluster.local/ns/a/sa/b"),
            uri("spiffe://cluster.local/ns/a/sa/c"),
        ]);
        assert!(matches!(
            ca.sign_request(&two, ttl, now),
            Err(CsrError::SanCount { found: 2 })
        ));
        let none = csr_with(vec![]);
        assert!(matches!(
            ca.sign_request(&none, ttl, now),
            Err(CsrError::SanCount { found: 0 })
        ));
        let dns = csr_with(vec![SanType::DnsName("web.example".try_into().unwrap())]);
        assert!(matches!(
            ca.sign_request(&dns, ttl, now),
            Err(CsrError::NotUri { .. })
        ));
        let https = csr_with(vec![uri("https://cluster.local/ns/a/sa/b")]);
        assert!(matches!(
            ca.sign_request(&https, ttl, now),
            Err(CsrError::NotSpiffe { .. })
        ));
        assert!(matches!(
            ca.sign_request("garbage", ttl, now),
            Err(CsrError::Unparsable)
        ));
        let ok = csr_with(vec![uri("spiffe://cluster.local/ns/a/sa/b")]);
        assert!(matches!(
            ca.sign_request(&ok, Duration::ZERO, now),
            Err(CsrError::ZeroTtl)
        ));
    }

    #[test]
    fn a_tampered_csr_is_refused() {
        let req = CertificateRequest::new(&id("spiffe://cluster.local/ns/a/sa/b")).unwrap();
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(req.pem.as_bytes())
            .map(|d: rustls::pki_types::CertificateSigningRequestDer<'_>| d.as_ref().to_vec())
            .unwrap();
        // Flip a byte inside the URI: the signature no longer matches.
        let mut bad = der.clone();
        let at = bad.windows(3).position(|w| w == b"/a/").unwrap();
        bad[at + 1] = b'z';
        let pem = pem::encode("CERTIFICATE REQUEST", &bad);
        assert!(matches!(
            requested_identity(&pem),
            Err(CsrError::Unparsable)
        ));
    }
}
