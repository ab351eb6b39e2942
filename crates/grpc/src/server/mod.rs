//! The server side: tonic served over our own TLS (tokio-rustls with aws-lc-rs; tonic's
//! `tls` feature stays off).
//!
//! - [`serve`] is the production server (`ambit control`): admission with per-source
//!   shares, handshake, authentication and idle deadlines, a gatekeeper that sees each
//!   request's head before anything is held, per-source stream shares.
//! - With the `testing` feature, [`incoming`] is a plain stream of TLS connections for
//!   test servers built on tonic's own `Server`, and [`test_pki`] mints a root and a
//!   server certificate.
//!
//! [`acceptor`] and [`server_config`] build the usual TLS configuration from one
//! certificate chain and key.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

#[cfg(feature = "testing")]
mod incoming;
mod serve;

#[cfg(feature = "testing")]
pub use incoming::{incoming, incoming_until, AcceptOptions, Incoming, TlsConnection};
pub use serve::{serve, Admission, Gatekeeper, RequestLimits, ServeOptions};

/// A TLS acceptor proving `chain` with `key`, offering HTTP/2 (ALPN `h2`) as gRPC wants,
/// with aws-lc-rs and its safe default protocol versions.
pub fn acceptor(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<TlsAcceptor, rustls::Error> {
    Ok(TlsAcceptor::from(server_config(chain, key)?))
}

/// The server configuration [`acceptor`] uses, for [`serve`].
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A root and a server certificate it signed, for tests.
#[cfg(feature = "testing")]
pub struct TestPki {
    /// The root, for the client's `RootCa::Inline`.
    pub root_pem: String,
    /// The server's certificate (the leaf alone).
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

#[cfg(feature = "testing")]
impl TestPki {
    /// [`acceptor`] with this chain and key.
    pub fn acceptor(&self) -> TlsAcceptor {
        acceptor(self.chain.clone(), self.key.clone_key()).expect("a freshly minted key pair")
    }
}

/// Mints a P-256 root and a leaf for the DNS names `names` signed by it. Panics if rcgen
/// fails, which it does not for valid names.
#[cfg(feature = "testing")]
pub fn test_pki(names: &[&str]) -> TestPki {
    use rustls::pki_types::PrivatePkcs8KeyDer;
    let alg = &rcgen::PKCS_ECDSA_P256_SHA256;
    let root_key = rcgen::KeyPair::generate_for(alg).expect("a P-256 key");
    let mut root = rcgen::CertificateParams::new(Vec::<String>::new()).expect("no names");
    root.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    root.distinguished_name
        .push(rcgen::DnType::CommonName, "ambit test root");
    let root = root.self_signed(&root_key).expect("a self-signed root");
    let key = rcgen::KeyPair::generate_for(alg).expect("a P-256 key");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let leaf = rcgen::CertificateParams::new(names)
        .expect("valid DNS names")
        .signed_by(&key, &root, &root_key)
        .expect("a leaf signed by the root");
    TestPki {
        root_pem: root.pem(),
        chain: vec![leaf.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    }
}
