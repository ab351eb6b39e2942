//! TLS edges: identity checks on both sides, missing client certificates, garbage input.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ambit_hbone::{parse_authority, ClientSettings, ConnectRequest, Fault, HboneError, Pool};
use ambit_identity::SpiffeId;
use common::*;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn request() -> ConnectRequest {
    ConnectRequest::new(parse_authority("127.0.0.1:80").unwrap())
}

/// The client refuses a server whose SPIFFE identity is not one it expects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_refuses_unexpected_server_identity() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let someone_else = SpiffeId::new(TD, "default", "someone-else").unwrap();
    let cfg = ambit_identity::client_config(&c.client, &[someone_else]).unwrap();
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let e = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, HboneError::Tls(_)), "{e}");
    assert_eq!(e.fault(), Fault::Peer);
    assert!(!e.is_retryable());
    assert_eq!(pool.connection_count(), 0);
    // The server saw the handshake fail too.
    assert!(server.next_result().await.is_err());
}

/// The server refuses a client whose certificate (same root!) is from another trust domain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_refuses_other_trust_domain() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let foreign = c.issue(&SpiffeId::new("evil.example", "default", "client").unwrap());
    let cfg = ambit_identity::client_config(&foreign, std::slice::from_ref(&c.server_id)).unwrap();
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let r = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await;
    assert!(r.is_err(), "a foreign trust domain must not get a tunnel");
    let e = server.next_result().await.unwrap_err();
    assert!(matches!(e, HboneError::Tls(_)), "{e}");
}

/// Accepts any server certificate: lets a client without a certificate reach the server.
#[derive(Debug)]
struct AcceptAnyServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn anonymous_client_config(alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let provider = ambit_identity::crypto_provider();
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider)))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(cfg)
}

/// The server refuses a client that presents no certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_refuses_client_without_certificate() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let cfg = anonymous_client_config(b"h2");
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let r = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await;
    assert!(r.is_err(), "an anonymous client must not get a tunnel");
    let e = server.next_result().await.unwrap_err();
    assert!(matches!(e, HboneError::Tls(_)), "{e}");
}

/// Defence in depth: even with a server config that does not ask for client certificates,
/// `serve` refuses anonymous clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_requires_client_certificate_even_if_config_does_not() {
    let c = certs();
    let mut lax = rustls::ServerConfig::builder_with_provider(ambit_identity::crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            c.server.chain.clone(),
            rustls::pki_types::PrivateKeyDer::Pkcs8(c.server.key.clone_key()),
        )
        .unwrap();
    lax.alpn_protocols = vec![b"h2".to_vec()];
    let server = TestServer::start(Arc::new(lax), fast_settings(), echo).await;
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let _tls = ambit_hbone::tls::connect(tcp, anonymous_client_config(b"h2")).await;
    let e = server.next_result().await.unwrap_err();
    assert!(matches!(e, HboneError::NoClientCertificate), "{e}");
}

/// A client that does not offer ALPN h2 is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_requires_alpn_h2() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    // Offering only http/1.1 makes rustls's server fail ALPN negotiation or complete without
    // ALPN; either way no HTTP/2 connection is served.
    let client =
        ambit_identity::client_config(&c.client, std::slice::from_ref(&c.server_id)).unwrap();
    let mut client = (*client).clone();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    let r = ambit_hbone::tls::connect(tcp, Arc::new(client)).await;
    assert!(
        matches!(r, Err(HboneError::Tls(_) | HboneError::Alpn(_))),
        "{r:?}"
    );
    assert!(server.next_result().await.is_err());
}

/// Garbage bytes make `serve_connection` return an error (no panic), and the next, good
/// connection works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_then_good_connection() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;

    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\x01\x02garbage")
        .await
        .unwrap();
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut sink)).await;
    let e = server.next_result().await.unwrap_err();
    assert!(matches!(e, HboneError::Tls(_)), "{e}");

    // Random bytes that look like a TLS record header.
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    let mut junk = vec![0x16, 0x03, 0x01, 0x40, 0x00];
    junk.extend(payload(20_000, 9));
    let _ = tcp.write_all(&junk).await;
    drop(tcp);
    assert!(server.next_result().await.is_err());

    // A connection that closes before saying anything.
    drop(TcpStream::connect(server.addr).await.unwrap());
    assert!(server.next_result().await.is_err());

    // TLS fine, then garbage instead of the HTTP/2 preface.
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let mut tls = ambit_hbone::tls::connect(tcp, c.client_config())
        .await
        .unwrap();
    tls.write_all(b"this is not an HTTP/2 connection preface at all")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut Vec::new())).await;
    let e = server.next_result().await.unwrap_err();
    assert!(matches!(e, HboneError::H2(_)), "{e}");

    // And now a good one.
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    s.write_all(b"still alive").await.unwrap();
    s.shutdown().await.unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"still alive");
    assert_eq!(dials.load(Ordering::SeqCst), 1);
}

/// A dial that hangs hits the connect timeout with the NetworkPolicy hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_applies_to_dial() {
    let c = certs();
    let pool = Pool::new(ClientSettings {
        connect_timeout: Duration::from_millis(100),
        ..Default::default()
    });
    let addr = "127.0.0.1:1".parse().unwrap();
    let e = pool
        .connect(
            key(&c, addr),
            std::future::pending::<Result<TcpStream, std::io::Error>>,
            &request(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, HboneError::ConnectTimeout(_)), "{e}");
    assert!(e.to_string().contains("NetworkPolicy"), "{e}");
    assert_eq!(e.fault(), Fault::Network);
    // A refused TCP connect surfaces as Connect.
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let e = pool
        .connect(key(&c, addr), || dial(addr, cfg, dials.clone()), &request())
        .await
        .unwrap_err();
    assert!(matches!(e, HboneError::Connect(_)), "{e}");
    assert_eq!(pool.connection_count(), 0);
}

/// One `write` of 1 MiB into each side of a fresh connection whose transport holds only
/// 4 KiB and is never read: what rustls accepts is what it buffers for the socket.
#[tokio::test]
async fn a_blocked_connection_buffers_a_bounded_large_piece_each_way() {
    let certs = certs();
    let (client_io, server_io) = tokio::io::duplex(4096);
    let (client, server) = tokio::join!(
        ambit_hbone::tls::connect(client_io, certs.client_config()),
        ambit_hbone::tls::accept(server_io, certs.server_config()),
    );
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    let bulk = vec![7u8; 1 << 20];
    for (side, accepted) in [
        ("client", client.write(&bulk).await.unwrap()),
        ("server", server.write(&bulk).await.unwrap()),
    ] {
        // rustls' own default stops at 64 KiB of records; ours at 256 KiB.
        assert!(
            (192 * 1024..=256 * 1024).contains(&accepted),
            "{side} accepted {accepted} bytes in one write"
        );
    }
}
