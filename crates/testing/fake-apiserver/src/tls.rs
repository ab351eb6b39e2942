//! The server's PKI: a fresh CA and a serving certificate for the names clients use.

use std::net::IpAddr;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

/// The names in the serving certificate besides the listener's own address.
const NAMES: [&str; 7] = [
    "127.0.0.1",
    "::1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

pub(crate) struct Pki {
    pub ca_pem: String,
    pub acceptor: TlsAcceptor,
}

/// Mints a P-256 CA and a leaf for [`NAMES`] and `ip`, offering HTTP/1.1 only.
pub(crate) fn mint(ip: IpAddr) -> anyhow::Result<Pki> {
    let alg = &rcgen::PKCS_ECDSA_P256_SHA256;
    let ca_key = rcgen::KeyPair::generate_for(alg)?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "ambit-fake-apiserver-ca");
    let ca = ca.self_signed(&ca_key)?;
    let mut names: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
    if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
        names.push(ip.to_string());
    }
    let key = rcgen::KeyPair::generate_for(alg)?;
    let mut params = rcgen::CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    let leaf = params.signed_by(&key, &ca, &ca_key)?;
    let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Pki {
        ca_pem: ca.pem(),
        acceptor: TlsAcceptor::from(Arc::new(config)),
    })
}
