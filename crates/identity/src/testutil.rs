//! Test helpers: a real TLS exchange over an in-memory pipe.

use std::sync::Arc;
use std::time::Duration;

use rustls::{ClientConfig, HandshakeKind, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::spiffe::SpiffeId;
use crate::tls::{peer_identity, placeholder_server_name};

/// What each side saw in a successful exchange.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The client identity as seen by the server.
    pub client_id: Option<SpiffeId>,
    /// The server identity as seen by the client.
    pub server_id: Option<SpiffeId>,
    pub alpn: Option<Vec<u8>>,
    pub version: Option<rustls::ProtocolVersion>,
    pub suite: Option<rustls::CipherSuite>,
    pub sni: Option<String>,
    pub client_kind: Option<HandshakeKind>,
}

/// Handshakes, then sends "ping" one way and "pong" back. `Err` carries both sides' errors.
pub(crate) async fn exchange(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
) -> Result<Outcome, String> {
    let (c, s) = tokio::io::duplex(64 * 1024);
    let server_side = async move {
        let mut tls = TlsAcceptor::from(server)
            .accept(s)
            .await
            .map_err(|e| format!("server handshake: {e}"))?;
        let conn = tls.get_ref().1;
        let seen = (
            peer_identity(conn.peer_certificates()),
            conn.server_name().map(str::to_owned),
        );
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf)
            .await
            .map_err(|e| format!("server read: {e}"))?;
        assert_eq!(&buf, b"ping");
        tls.write_all(b"pong")
            .await
            .map_err(|e| format!("server write: {e}"))?;
        tls.shutdown().await.ok();
        Ok::<_, String>(seen)
    };
    let client_side = async move {
        let mut tls = TlsConnector::from(client)
            .connect(placeholder_server_name(), c)
            .await
            .map_err(|e| format!("client handshake: {e}"))?;
        let conn = tls.get_ref().1;
        let seen = (
            peer_identity(conn.peer_certificates()),
            conn.alpn_protocol().map(<[u8]>::to_vec),
            conn.protocol_version(),
            conn.negotiated_cipher_suite().map(|s| s.suite()),
            conn.handshake_kind(),
        );
        tls.write_all(b"ping")
            .await
            .map_err(|e| format!("client write: {e}"))?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf)
            .await
            .map_err(|e| format!("client read: {e}"))?;
        assert_eq!(&buf, b"pong");
        Ok::<_, String>(seen)
    };
    let both = async { tokio::join!(server_side, client_side) };
    let (s, c) = tokio::time::timeout(Duration::from_secs(10), both)
        .await
        .map_err(|_| "exchange timed out".to_owned())?;
    match (s, c) {
        (Ok((client_id, sni)), Ok((server_id, alpn, version, suite, client_kind))) => Ok(Outcome {
            client_id,
            server_id,
            alpn,
            version,
            suite,
            sni,
            client_kind,
        }),
        (s, c) => Err(format!("{:?} / {:?}", s.err(), c.err())),
    }
}

pub(crate) fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

/// The CA of bad leaves shared with ambit-caclient's and the `ambit` binary's tests.
#[path = "../tests/support/rogue_ca.rs"]
pub(crate) mod rogue_ca;

/// A workload certificate for `id` from `ca`, with `defect`, assembled as an issuer would
/// (our key, the leaf and any intermediate, the root the CA returned).
pub(crate) fn rogue_certificate(
    ca: &rogue_ca::RogueCa,
    id: &SpiffeId,
    defect: rogue_ca::Defect,
    now: std::time::SystemTime,
) -> crate::WorkloadCertificate {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let issued = ca.sign(&key, &id.to_string(), defect, now);
    let der = |c: &rogue_ca::Cert| rustls::pki_types::CertificateDer::from(c.der.clone());
    crate::WorkloadCertificate::new(
        id.clone(),
        issued.chain.iter().map(der).collect(),
        rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()),
        issued.roots.iter().map(der).collect(),
    )
    .unwrap()
}
