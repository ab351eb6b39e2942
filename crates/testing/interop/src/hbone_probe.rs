//! Two HBONE observers built straight on rustls and h2 (not on `ambit-hbone`), so they see
//! a proxy from outside as any peer would:
//!
//! - [`RecordingServer`] stands where a node proxy's port 15008 would be and records what a
//!   client proxy sends: its ClientHello (offered suites, ALPN, SNI), the TLS version and
//!   suite it ends up with, its certificate's URI SANs, and each CONNECT's `:authority` and
//!   headers. It answers 200 and drains the stream.
//! - [`probe`] sends one raw request to a node proxy's 15008 with a chosen client
//!   certificate (or none) and reports how the proxy answered.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use ambit_identity::WorkloadCertificate;
use anyhow::Context;
use bytes::Bytes;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::ClientHello;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    // Every suite and group aws-lc-rs has: the observer must not limit what a peer can pick.
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The URI SANs of a DER certificate, as written (not only valid SPIFFE ids).
pub fn uri_sans(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return vec!["<unparsable certificate>".into()];
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
        .collect()
}

/// What one client proxy sent on one HBONE connection and stream.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    /// Offered in the ClientHello, as rustls names them.
    pub offered_suites: Vec<String>,
    pub offered_alpn: Vec<String>,
    pub sni: Option<String>,
    /// What the handshake settled on.
    pub tls_version: String,
    pub cipher_suite: String,
    pub alpn: String,
    /// The client certificate's URI SANs.
    pub client_ids: Vec<String>,
    pub method: String,
    pub authority: String,
    /// The request's `:scheme` and `:path`, which a CONNECT must not carry.
    pub scheme: Option<String>,
    pub path: Option<String>,
    /// Regular headers in the order received (names lower-case).
    pub headers: Vec<(String, String)>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What a ClientHello offers.
fn offered(hello: &ClientHello<'_>) -> Recorded {
    Recorded {
        offered_suites: hello
            .cipher_suites()
            .iter()
            .map(|s| format!("{s:?}"))
            .collect(),
        offered_alpn: hello
            .alpn()
            .map(|a| a.map(|p| String::from_utf8_lossy(p).into_owned()).collect())
            .unwrap_or_default(),
        sni: hello.server_name().map(str::to_string),
        ..Recorded::default()
    }
}

/// The signature checks both permissive verifiers still make: a peer must hold the key
/// of the certificate it shows, whatever the certificate says.
struct Signatures;

impl Signatures {
    fn tls12(
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            m,
            c,
            d,
            &provider().signature_verification_algorithms,
        )
    }

    fn tls13(
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            m,
            c,
            d,
            &provider().signature_verification_algorithms,
        )
    }

    fn schemes() -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Requires a client certificate and accepts any: the recorder reports what it got.
#[derive(Debug)]
struct AnyClientCert;

impl ClientCertVerifier for AnyClientCert {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Signatures::tls12(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Signatures::tls13(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        Signatures::schemes()
    }
}

/// Accepts any server certificate: the probe judges the server by its answers.
#[derive(Debug)]
struct AnyServerCert;

impl ServerCertVerifier for AnyServerCert {
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
        Signatures::tls12(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Signatures::tls13(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        Signatures::schemes()
    }
}

fn key_of(cert: &WorkloadCertificate) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(cert.key.clone_key())
}

/// An HBONE server that records each connection and request; stops when dropped.
pub struct RecordingServer {
    pub records: mpsc::Receiver<Recorded>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl RecordingServer {
    /// Listens on `addr` inside `ns`, presenting `cert` (the identity the client proxies
    /// expect at that address).
    pub fn start(
        ns: &str,
        addr: SocketAddr,
        cert: &WorkloadCertificate,
    ) -> anyhow::Result<RecordingServer> {
        let listener =
            ambit_netns_lab::Lab::in_netns(ns, move || std::net::TcpListener::bind(addr))
                .with_context(|| format!("binding the recording server on {addr} in {ns}"))?;
        listener.set_nonblocking(true)?;
        let (tx, records) = mpsc::channel();
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(Arc::new(AnyClientCert))
            .with_single_cert(cert.chain.clone(), key_of(cert))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        let config = Arc::new(config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let config = config.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    // Read this connection's ClientHello before answering it, so each record
                    // carries its own connection's offer.
                    let acceptor = tokio_rustls::LazyConfigAcceptor::new(
                        rustls::server::Acceptor::default(),
                        tcp,
                    );
                    let Ok(start) = acceptor.await else {
                        return;
                    };
                    let mut base = offered(&start.client_hello());
                    let Ok(tls) = start.into_stream(config).await else {
                        return;
                    };
                    {
                        let (_, conn) = tls.get_ref();
                        base.tls_version = conn
                            .protocol_version()
                            .map(|v| format!("{v:?}"))
                            .unwrap_or_default();
                        base.cipher_suite = conn
                            .negotiated_cipher_suite()
                            .map(|s| format!("{:?}", s.suite()))
                            .unwrap_or_default();
                        base.alpn = conn
                            .alpn_protocol()
                            .map(|p| String::from_utf8_lossy(p).into_owned())
                            .unwrap_or_default();
                        base.client_ids = conn
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .map(|c| uri_sans(c))
                            .unwrap_or_default();
                    }
                    let Ok(mut h2) = h2::server::handshake(tls).await else {
                        return;
                    };
                    while let Some(Ok((req, mut respond))) = h2.accept().await {
                        let mut rec = base.clone();
                        rec.method = req.method().to_string();
                        rec.authority = req
                            .uri()
                            .authority()
                            .map(|a| a.to_string())
                            .unwrap_or_default();
                        rec.scheme = req.uri().scheme_str().map(str::to_string);
                        rec.path = req.uri().path_and_query().map(|p| p.to_string());
                        rec.headers = req
                            .headers()
                            .iter()
                            .map(|(n, v)| {
                                (
                                    n.as_str().to_string(),
                                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                                )
                            })
                            .collect();
                        let _ = tx.send(rec);
                        let response = http::Response::builder().status(200).body(()).unwrap();
                        let Ok(mut send) = respond.send_response(response, false) else {
                            continue;
                        };
                        let mut body = req.into_body();
                        tokio::spawn(async move {
                            while let Some(Ok(chunk)) = body.data().await {
                                let _ = body.flow_control().release_capacity(chunk.len());
                            }
                            let _ = send.send_data(Bytes::new(), true);
                        });
                    }
                });
            }
        });
        Ok(RecordingServer {
            records,
            runtime: Some(runtime),
        })
    }

    /// The next record, waiting up to `timeout`.
    pub fn next(&self, timeout: Duration) -> anyhow::Result<Recorded> {
        self.records
            .recv_timeout(timeout)
            .context("the recording server saw no CONNECT")
    }
}

impl Drop for RecordingServer {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// One raw request to an HBONE server.
#[derive(Clone, Debug)]
pub struct ProbeRequest {
    pub method: http::Method,
    /// For CONNECT, the authority; otherwise the URI's authority.
    pub authority: String,
    pub headers: Vec<(String, String)>,
}

impl ProbeRequest {
    pub fn connect(authority: impl Into<String>) -> ProbeRequest {
        ProbeRequest {
            method: http::Method::CONNECT,
            authority: authority.into(),
            headers: Vec::new(),
        }
    }
}

/// How the server answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The TLS handshake (or the first read after it, where TLS 1.3 reports a rejected
    /// client certificate) failed.
    TlsRejected(String),
    /// TLS held but the HTTP/2 handshake or the request failed.
    H2Failed(String),
    /// An HTTP response: status and headers (names lower-case, sorted), and for a 200 to a
    /// CONNECT whether bytes sent came back through the tunnel (`echoed`).
    Response {
        status: u16,
        headers: Vec<(String, String)>,
        echoed: Option<bool>,
    },
}

impl Outcome {
    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Response { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Sends `request` from `ns` to `dst` over TLS with `cert` as the client certificate (or
/// none), and reports the answer. On a 200 to a CONNECT it sends `ping` and waits for it
/// to come back (the tunnel must reach an echo server).
pub fn probe(
    ns: &str,
    dst: SocketAddr,
    cert: Option<&WorkloadCertificate>,
    request: &ProbeRequest,
) -> anyhow::Result<Outcome> {
    let tcp = ambit_netns_lab::Lab::in_netns(ns, move || {
        std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(5))
    })
    .with_context(|| format!("connecting to {dst} from {ns}"))?;
    tcp.set_nonblocking(true)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServerCert));
    let mut config = match cert {
        Some(c) => builder.with_client_auth_cert(c.chain.clone(), key_of(c))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.enable_sni = false;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let request = request.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let tcp = tokio::net::TcpStream::from_std(tcp)?;
        let name = ServerName::IpAddress(dst.ip().into());
        let tls = match tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp))
            .await
        {
            Err(_) => return Ok(Outcome::TlsRejected("handshake timed out".into())),
            Ok(Err(e)) => return Ok(Outcome::TlsRejected(e.to_string())),
            Ok(Ok(tls)) => tls,
        };
        // TLS 1.3: a server that refuses our certificate says so after the client's
        // handshake is done, as an alert on the first read; h2's handshake surfaces it.
        let (client, conn) = match h2::client::handshake(tls).await {
            Ok(x) => x,
            Err(e) => return Ok(classify_h2_error(&e)),
        };
        let (conn_err_tx, mut conn_err_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _ = conn_err_tx.send(conn.await.err());
        });
        let uri = if request.method == http::Method::CONNECT {
            request.authority.clone()
        } else {
            format!("https://{}/", request.authority)
        };
        let mut builder = http::Request::builder()
            .method(request.method.clone())
            .uri(uri);
        for (n, v) in &request.headers {
            builder = builder.header(n, v);
        }
        let req = builder.body(()).context("building the probe request")?;
        let ready = tokio::time::timeout(Duration::from_secs(5), client.ready()).await;
        let mut client = match ready {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Ok(classify_h2_error(&e)),
            Err(_) => return Ok(Outcome::H2Failed("not ready within 5 s".into())),
        };
        let (response, mut send) = match client.send_request(req, false) {
            Ok(x) => x,
            Err(e) => return Ok(classify_h2_error(&e)),
        };
        let response = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(10), response) => match r {
                Err(_) => return Ok(Outcome::H2Failed("no response within 10 s".into())),
                Ok(Err(e)) => return Ok(classify_h2_error(&e)),
                Ok(Ok(r)) => r,
            },
            Ok(Some(e)) = &mut conn_err_rx => return Ok(classify_h2_error(&e)),
        };
        let status = response.status().as_u16();
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        headers.sort();
        let mut echoed = None;
        if status == 200 && request.method == http::Method::CONNECT {
            send.send_data(Bytes::from_static(b"ping"), true)?;
            let mut body = response.into_body();
            let mut got = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while let Some(Ok(chunk)) = body.data().await {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    got.extend_from_slice(&chunk);
                }
            })
            .await;
            echoed = Some(read.is_ok() && got == b"ping");
        }
        Ok(Outcome::Response {
            status,
            headers,
            echoed,
        })
    })
}

fn classify_h2_error(e: &h2::Error) -> Outcome {
    // An I/O error under h2 carrying a TLS alert is the server refusing the handshake.
    if let Some(io) = e.get_io() {
        let text = io.to_string();
        if text.contains("alert") || text.contains("certificate") || text.contains("handshake") {
            return Outcome::TlsRejected(text);
        }
        if matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::BrokenPipe
        ) {
            return Outcome::TlsRejected(format!("connection closed in the handshake: {text}"));
        }
    }
    Outcome::H2Failed(e.to_string())
}
