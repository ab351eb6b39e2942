//! Peer certificate verifiers for HBONE mTLS.
//!
//! Security posture:
//! - both sides verify the peer chain against the roots that came with *our own* workload
//!   certificate, with the EKU of the peer's role (serverAuth / clientAuth);
//! - the leaf must be an SVID: exactly one URI SAN with the `spiffe` scheme (any case), and
//!   a valid id ([`svid_identity`]);
//! - the client never looks at DNS names or IPs: it accepts a server only when that id
//!   equals (byte for byte) one of the identities it expected;
//! - the server requires a client certificate and accepts it only when that id is in the
//!   server's own trust domain. Authorization beyond that is the
//!   caller's job (RBAC on the peer identity).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::ParsedCertificate;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, RootCertStore,
    SignatureScheme,
};

use crate::cert::svid_identity;
use crate::error::PeerError;
use crate::spiffe::SpiffeId;

fn refuse(e: PeerError) -> rustls::Error {
    tracing::debug!(error = %e, "refusing TLS peer");
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
}

fn strings(ids: &[SpiffeId]) -> Vec<String> {
    ids.iter().map(ToString::to_string).collect()
}

/// Client side: chain to our roots (serverAuth), then a SPIFFE SAN among `expected`.
#[derive(Debug)]
pub(crate) struct ExpectedServerVerifier {
    roots: Arc<RootCertStore>,
    expected: Vec<SpiffeId>,
    provider: Arc<CryptoProvider>,
}

impl ExpectedServerVerifier {
    pub(crate) fn new(
        roots: Arc<RootCertStore>,
        expected: Vec<SpiffeId>,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        ExpectedServerVerifier {
            roots,
            expected,
            provider,
        }
    }
}

impl ServerCertVerifier for ExpectedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let found = svid_identity(end_entity).map_err(refuse)?;
        if self.expected.contains(&found) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(refuse(PeerError::UnexpectedServer {
                found: vec![found.to_string()],
                expected: strings(&self.expected),
            }))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Server side: rustls' WebPKI client verifier (mandatory client cert, clientAuth EKU),
/// then a SPIFFE SAN in our trust domain.
#[derive(Debug)]
pub(crate) struct TrustDomainClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    trust_domain: String,
}

impl TrustDomainClientVerifier {
    pub(crate) fn new(inner: Arc<dyn ClientCertVerifier>, trust_domain: &str) -> Self {
        TrustDomainClientVerifier {
            inner,
            trust_domain: trust_domain.to_owned(),
        }
    }
}

impl ClientCertVerifier for TrustDomainClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let found = svid_identity(end_entity).map_err(refuse)?;
        if found.trust_domain() == self.trust_domain {
            Ok(ClientCertVerified::assertion())
        } else {
            Err(refuse(PeerError::ForeignTrustDomain {
                found: vec![found.to_string()],
                trust_domain: self.trust_domain.clone(),
            }))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
