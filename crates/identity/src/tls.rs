//! rustls configurations for HBONE: TLS 1.3 only, AES-GCM suites only, ALPN `h2`, no SNI,
//! no session resumption, SPIFFE peer checks (see [`crate::verify`]).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, OnceLock};

use rustls::client::Resumption;
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::cert::{svid_identity, WorkloadCertificate};
use crate::error::TlsError;
use crate::spiffe::SpiffeId;
use crate::verify::{ExpectedServerVerifier, TrustDomainClientVerifier};

/// The only ALPN protocol spoken on HBONE.
pub const ALPN_H2: &[u8] = b"h2";

/// aws-lc-rs with exactly `TLS13_AES_256_GCM_SHA384` and `TLS13_AES_128_GCM_SHA256`, in
/// ztunnel's order (key exchange groups: the provider's defaults). The client's order
/// decides, so two ambit or ztunnel peers agree on AES-256, which regimes that require
/// 256-bit keys (CNSA) expect; AES-128 remains for peers that offer only it.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let mut provider = aws_lc_rs::default_provider();
            provider.cipher_suites = vec![
                aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
                aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
            ];
            Arc::new(provider)
        })
        .clone()
}

/// A root store from DER certificates.
pub(crate) fn root_store(roots: &[CertificateDer<'static>]) -> Result<RootCertStore, TlsError> {
    if roots.is_empty() {
        return Err(TlsError::NoRoots);
    }
    let mut store = RootCertStore::empty();
    for (index, root) in roots.iter().enumerate() {
        store
            .add(root.clone())
            .map_err(|source| TlsError::BadRoot { index, source })?;
    }
    Ok(store)
}

/// Server side of HBONE: presents `cert.chain`; requires a client certificate chaining to
/// `cert.roots` (clientAuth) with a SPIFFE URI SAN in `cert.identity`'s trust domain.
pub fn server_config(cert: &WorkloadCertificate) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = crypto_provider();
    let roots = Arc::new(root_store(&cert.roots)?);
    let webpki = WebPkiClientVerifier::builder_with_provider(roots, provider.clone()).build()?;
    let verifier = Arc::new(TrustDomainClientVerifier::new(
        webpki,
        cert.identity.trust_domain(),
    ));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            cert.chain.clone(),
            PrivateKeyDer::Pkcs8(cert.key.clone_key()),
        )?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// Client side of HBONE: presents `cert.chain`; accepts a server chaining to `cert.roots`
/// (serverAuth, no name check) whose leaf has a SPIFFE URI SAN equal to one of `expected`.
pub fn client_config(
    cert: &WorkloadCertificate,
    expected: &[SpiffeId],
) -> Result<Arc<ClientConfig>, TlsError> {
    if expected.is_empty() {
        return Err(TlsError::NoExpectedIdentities);
    }
    let provider = crypto_provider();
    let roots = Arc::new(root_store(&cert.roots)?);
    let verifier = Arc::new(ExpectedServerVerifier::new(
        roots,
        expected.to_vec(),
        provider.clone(),
    ));
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(
            cert.chain.clone(),
            PrivateKeyDer::Pkcs8(cert.key.clone_key()),
        )?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.enable_sni = false;
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// A verifier for a server that must prove one SPIFFE identity, chaining to `roots`
/// (serverAuth; DNS names and IPs are not looked at): how a waypoint checks ambit's
/// control server, whose certificate comes from the mesh CA as a workload's does.
pub fn spiffe_server_verifier(
    roots: RootCertStore,
    expected: SpiffeId,
) -> Arc<dyn rustls::client::danger::ServerCertVerifier> {
    Arc::new(ExpectedServerVerifier::new(
        Arc::new(roots),
        vec![expected],
        crypto_provider(),
    ))
}

/// The server name to hand to `connect` (SNI is off, so it never goes on the wire): `0.0.0.0`.
pub fn placeholder_server_name() -> ServerName<'static> {
    ServerName::from(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// The SPIFFE id of the peer's leaf certificate (None unless it has exactly one).
pub fn peer_identity(peer_certs: Option<&[CertificateDer<'_>]>) -> Option<SpiffeId> {
    let leaf = peer_certs?.first()?;
    // The handshake refused leaves that are not SVIDs; stay strict here too.
    svid_identity(leaf).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::CertificateAuthority;
    use crate::testutil::{exchange, id};
    use crate::verify::ExpectedServerVerifier;
    use std::time::Duration;

    const DAY: Duration = Duration::from_secs(86400);

    fn pair() -> (WorkloadCertificate, WorkloadCertificate) {
        let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        let server = ca
            .issue(&id("spiffe://cluster.local/ns/default/sa/server"), DAY)
            .unwrap();
        let client = ca
            .issue(&id("spiffe://cluster.local/ns/default/sa/client"), DAY)
            .unwrap();
        (server, client)
    }

    #[test]
    fn provider_has_exactly_the_two_aes_gcm_suites() {
        let suites: Vec<_> = crypto_provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(
            suites,
            [
                rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
                rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
            ]
        );
    }

    #[test]
    fn placeholder_is_unspecified_ipv4() {
        assert_eq!(
            placeholder_server_name(),
            ServerName::IpAddress(IpAddr::V4(Ipv4Addr::UNSPECIFIED).into())
        );
        assert_eq!(peer_identity(None), None);
        assert_eq!(peer_identity(Some(&[])), None);
    }

    #[test]
    fn config_settings() {
        let (server, client) = pair();
        let s = server_config(&server).unwrap();
        assert_eq!(s.alpn_protocols, vec![b"h2".to_vec()]);
        assert_eq!(s.send_tls13_tickets, 0);
        assert!(!s.session_storage.can_cache());
        let c = client_config(&client, std::slice::from_ref(&server.identity)).unwrap();
        assert_eq!(c.alpn_protocols, vec![b"h2".to_vec()]);
        assert!(!c.enable_sni);
        assert!(matches!(
            client_config(&client, &[]),
            Err(TlsError::NoExpectedIdentities)
        ));
    }

    #[tokio::test]
    async fn mutual_tls_succeeds_and_reports_identities() {
        let (server, client) = pair();
        let s = server_config(&server).unwrap();
        let other = id("spiffe://cluster.local/ns/x/sa/y");
        let c = client_config(&client, &[other, server.identity.clone()]).unwrap();
        let out = exchange(s.clone(), c.clone()).await.unwrap();
        assert_eq!(out.client_id, Some(client.identity.clone()));
        assert_eq!(out.server_id, Some(server.identity.clone()));
        assert_eq!(out.alpn.as_deref(), Some(&b"h2"[..]));
        assert_eq!(out.version, Some(rustls::ProtocolVersion::TLSv1_3));
        // Both ends offer ztunnel's order, so they agree on AES-256.
        assert_eq!(
            out.suite,
            Some(rustls::CipherSuite::TLS13_AES_256_GCM_SHA384)
        );
        assert_eq!(out.sni, None, "SNI must not be sent");
        assert_eq!(out.client_kind, Some(rustls::HandshakeKind::Full));
        // A second connection with the same configs is a full handshake again: no resumption.
        let again = exchange(s, c).await.unwrap();
        assert_eq!(again.client_kind, Some(rustls::HandshakeKind::Full));
    }

    #[tokio::test]
    async fn client_refuses_unexpected_server_identity() {
        let (server, client) = pair();
        let c =
            client_config(&client, &[id("spiffe://cluster.local/ns/default/sa/other")]).unwrap();
        let err = exchange(server_config(&server).unwrap(), c)
            .await
            .unwrap_err();
        assert!(
            err.contains("client handshake") && err.contains("UnexpectedServer"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn expected_identity_is_byte_exact() {
        let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        let server = ca
            .issue(&id("spiffe://cluster.local/ns/default/sa/Ab"), DAY)
            .unwrap();
        let client = ca
            .issue(&id("spiffe://cluster.local/ns/default/sa/c"), DAY)
            .unwrap();
        // The path is case-sensitive: `Ab` is not `ab`.
        let c = client_config(&client, &[id("spiffe://cluster.local/ns/default/sa/ab")]).unwrap();
        let err = exchange(server_config(&server).unwrap(), c)
            .await
            .unwrap_err();
        assert!(
            err.contains("client handshake") && err.contains("UnexpectedServer"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn server_refuses_client_of_another_trust_domain_under_the_same_root() {
        let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        let server = ca
            .issue(&id("spiffe://cluster.local/ns/default/sa/server"), DAY)
            .unwrap();
        let client = ca
            .issue(&id("spiffe://evil.example/ns/default/sa/client"), DAY)
            .unwrap();
        let c = client_config(&client, std::slice::from_ref(&server.identity)).unwrap();
        let err = exchange(server_config(&server).unwrap(), c)
            .await
            .unwrap_err();
        assert!(
            err.contains("server handshake") && err.contains("ForeignTrustDomain"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn server_refuses_client_from_another_root() {
        let (server, _) = pair();
        let other_ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        let client = other_ca
            .issue(&id("spiffe://cluster.local/ns/default/sa/client"), DAY)
            .unwrap();
        // The client trusts the server's root so only the server's check can fail.
        let mut client = client;
        client.roots = server.roots.clone();
        let c = client_config(&client, std::slice::from_ref(&server.identity)).unwrap();
        let err = exchange(server_config(&server).unwrap(), c)
            .await
            .unwrap_err();
        // Same root name, other key: found by name, refused by signature.
        assert!(
            err.contains("server handshake: invalid peer certificate: BadSignature"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn client_refuses_server_from_another_root() {
        let (_, client) = pair();
        // A root with another name: the chain has no issuer at all.
        let other_ca = CertificateAuthority::ephemeral("other.local").unwrap();
        let mut server = other_ca
            .issue(&id("spiffe://cluster.local/ns/default/sa/server"), DAY)
            .unwrap();
        server.roots = client.roots.clone();
        let c = client_config(&client, std::slice::from_ref(&server.identity)).unwrap();
        let err = exchange(server_config(&server).unwrap(), c)
            .await
            .unwrap_err();
        assert!(
            err.contains("client handshake: invalid peer certificate: UnknownIssuer"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn server_refuses_client_without_certificate() {
        let (server, client) = pair();
        let verifier = Arc::new(ExpectedServerVerifier::new(
            Arc::new(root_store(&client.roots).unwrap()),
            vec![server.identity.clone()],
            crypto_provider(),
        ));
        let mut c = ClientConfig::builder_with_provider(crypto_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        c.alpn_protocols = vec![b"h2".to_vec()];
        let err = exchange(server_config(&server).unwrap(), Arc::new(c))
            .await
            .unwrap_err();
        assert!(err.contains("server handshake"), "{err}");
        assert!(err.to_lowercase().contains("no certificate"), "{err}");
    }

    #[tokio::test]
    async fn server_refuses_other_cipher_suites() {
        let (server, client) = pair();
        let mut provider = aws_lc_rs::default_provider();
        provider.cipher_suites = vec![aws_lc_rs::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256];
        let provider = Arc::new(provider);
        let verifier = Arc::new(ExpectedServerVerifier::new(
            Arc::new(root_store(&client.roots).unwrap()),
            vec![server.identity.clone()],
            provider.clone(),
        ));
        let c = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(
                client.chain.clone(),
                PrivateKeyDer::Pkcs8(client.key.clone_key()),
            )
            .unwrap();
        let err = exchange(server_config(&server).unwrap(), Arc::new(c))
            .await
            .unwrap_err();
        assert!(err.to_lowercase().contains("cipher"), "{err}");
    }
}
