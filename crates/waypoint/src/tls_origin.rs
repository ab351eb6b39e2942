//! TLS originated by the waypoint to endpoints outside the mesh (a DestinationRule's
//! `tls` in mode `SIMPLE` or `MUTUAL`): the client configuration built once per rule and
//! port from the files it names, checking the server's certificate against the roots
//! given (or the system's), and its name against `subjectAltNames` (or the SNI sent).
//! Any TLS version and suite aws-lc-rs offers (the origin is not ambit's peer), ALPN
//! `http/1.1`.

use std::sync::Arc;

use ambit_traffic_policy::ClientTls;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// A rule's TLS origination, ready to connect.
#[derive(Debug)]
pub struct TlsOrigin {
    /// Names this origin in pools and logs: the rule and port.
    pub id: String,
    pub config: Arc<ClientConfig>,
    /// `sni`, when the rule fixes it.
    pub sni: Option<String>,
}

impl PartialEq for TlsOrigin {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for TlsOrigin {}

impl std::hash::Hash for TlsOrigin {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state)
    }
}

/// Why a rule's TLS cannot be set up: a fault of the rule or of the files it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TLS origination for {id}: {reason}")]
pub struct TlsSetupError {
    pub id: String,
    pub reason: String,
}

impl TlsOrigin {
    /// Builds the client configuration `tls` asks for; `id` names it. Each build is a
    /// new origin (its `id` numbered): connections pooled under a rule's earlier version
    /// are never used under its next one.
    pub fn build(id: String, tls: &ClientTls) -> Result<TlsOrigin, TlsSetupError> {
        static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{id} (#{n})");
        let fail = |reason: String| TlsSetupError {
            id: id.clone(),
            reason,
        };
        let provider = Arc::new(aws_lc_rs::default_provider());
        let verifier: Arc<dyn ServerCertVerifier> = if tls.insecure_skip_verify {
            Arc::new(AnyServer(provider.clone()))
        } else {
            let roots = roots(tls).map_err(fail)?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| fail(format!("the roots cannot verify: {e}")))?;
            let names = tls
                .subject_alt_names
                .iter()
                .map(|n| {
                    ServerName::try_from(n.clone()).map_err(|_| {
                        fail(format!(
                            "subjectAltNames {n:?}: only DNS names and IP addresses are checked"
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            if names.is_empty() {
                webpki
            } else {
                Arc::new(OneOf { webpki, names })
            }
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match &tls.client_identity {
            None => builder.with_no_client_auth(),
            Some(identity) => {
                let chain: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_file_iter(&identity.certificate)
                        .and_then(|i| i.collect())
                        .map_err(|e| {
                            fail(format!(
                                "clientCertificate {}: {e}",
                                identity.certificate.display()
                            ))
                        })?;
                if chain.is_empty() {
                    return Err(fail(format!(
                        "clientCertificate {}: no certificate in it",
                        identity.certificate.display()
                    )));
                }
                let key = PrivateKeyDer::from_pem_file(&identity.private_key).map_err(|e| {
                    fail(format!(
                        "privateKey {}: {e}",
                        identity.private_key.display()
                    ))
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| fail(format!("the client certificate and key: {e}")))?
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsOrigin {
            id,
            config: Arc::new(config),
            sni: tls.sni.clone(),
        })
    }
}

fn roots(tls: &ClientTls) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match &tls.ca_certificates {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|i| i.collect())
                .map_err(|e| format!("caCertificates {}: {e}", path.display()))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!(
                    "caCertificates {}: no usable certificate in it",
                    path.display()
                ));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err("no caCertificates written and the system trust store holds no usable certificate".into());
            }
        }
    }
    Ok(store)
}

/// `subjectAltNames`: the chain checked as for a server of one of these names (the SNI
/// sent is not what is checked).
#[derive(Debug)]
struct OneOf {
    webpki: Arc<WebPkiServerVerifier>,
    names: Vec<ServerName<'static>>,
}

impl ServerCertVerifier for OneOf {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _sni: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut last = None;
        for name in &self.names {
            match self.webpki.verify_server_cert(
                end_entity,
                intermediates,
                name,
                ocsp_response,
                now,
            ) {
                Ok(v) => return Ok(v),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(rustls::Error::General("no subjectAltNames".into())))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// `insecureSkipVerify`: any certificate (the handshake's signatures are still checked,
/// so the server holds the key of the certificate it sent).
#[derive(Debug)]
struct AnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _sni: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
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
            &self.0.signature_verification_algorithms,
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
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
