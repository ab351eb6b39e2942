//! TCP and TLS for the channel: rustls verification by host name or the alternative name,
//! TCP keepalive, ALPN h2.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::GrpcError;

const KEEPALIVE_TIME: Duration = Duration::from_secs(300);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(75);
const KEEPALIVE_RETRIES: u32 = 9;

/// Verifies the server's chain with webpki, accepting a certificate valid for either the
/// address's host or the configured alternative name.
#[derive(Debug)]
struct HostOrAlt {
    webpki: Arc<WebPkiServerVerifier>,
    alt: Option<ServerName<'static>>,
}

impl ServerCertVerifier for HostOrAlt {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let first =
            self.webpki
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        match (&first, &self.alt) {
            (Err(rustls::Error::InvalidCertificate(e)), Some(alt)) if wrong_name(e) => self
                .webpki
                .verify_server_cert(end_entity, intermediates, alt, ocsp, now),
            _ => first,
        }
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

fn wrong_name(e: &CertificateError) -> bool {
    matches!(
        e,
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
    )
}

/// `host` as the name a server certificate is checked against (a DNS name or an IP).
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, GrpcError> {
    ServerName::try_from(host.to_string()).map_err(|_| GrpcError::Address {
        address: host.to_string(),
        reason: "the host is not a valid DNS name or IP".into(),
    })
}

pub(crate) fn client_config(
    roots: RootCertStore,
    alt: Option<&str>,
) -> Result<Arc<ClientConfig>, GrpcError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| GrpcError::Tls(e.to_string()))?;
    let alt = match alt {
        Some(a) => Some(
            ServerName::try_from(a.to_string()).map_err(|_| GrpcError::Address {
                address: a.to_string(),
                reason: "the alternative host name is not a valid DNS name or IP".into(),
            })?,
        ),
        None => None,
    };
    verified_by(provider, Arc::new(HostOrAlt { webpki, alt }))
}

/// TLS 1.3 and ALPN h2, the server checked by `verifier`, no client certificate.
fn verified_by(
    provider: Arc<rustls::crypto::CryptoProvider>,
    verifier: Arc<dyn ServerCertVerifier>,
) -> Result<Arc<ClientConfig>, GrpcError> {
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| GrpcError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A client that accepts only a server proving `expected` (see
/// [`ambit_identity::spiffe_server_verifier`]).
pub(crate) fn spiffe_client_config(
    roots: RootCertStore,
    expected: ambit_identity::SpiffeId,
) -> Result<Arc<ClientConfig>, GrpcError> {
    verified_by(
        Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        ambit_identity::spiffe_server_verifier(roots, expected),
    )
}

/// Dials the server for tonic: TCP with keepalive, then TLS.
#[derive(Clone)]
pub(crate) struct TlsConnector {
    tls: tokio_rustls::TlsConnector,
    host: String,
    /// The host as the name the server is checked against (the verifier also accepts
    /// the alternative name).
    name: ServerName<'static>,
    port: u16,
}

impl TlsConnector {
    pub(crate) fn new(
        config: Arc<ClientConfig>,
        host: String,
        name: ServerName<'static>,
        port: u16,
    ) -> Self {
        TlsConnector {
            tls: tokio_rustls::TlsConnector::from(config),
            host,
            name,
            port,
        }
    }
}

type Connecting =
    Pin<Box<dyn Future<Output = Result<TokioIo<TlsStream<TcpStream>>, std::io::Error>> + Send>>;

impl tower_service::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect((this.host.as_str(), this.port)).await?;
            tcp.set_nodelay(true)?;
            let keepalive = socket2::TcpKeepalive::new()
                .with_time(KEEPALIVE_TIME)
                .with_interval(KEEPALIVE_INTERVAL)
                .with_retries(KEEPALIVE_RETRIES);
            socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive)?;
            let tls = this.tls.connect(this.name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}
