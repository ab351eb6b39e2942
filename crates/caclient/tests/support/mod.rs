//! A small Istio CA for tests: a tonic server over TLS on 127.0.0.1 signing with
//! `CertificateAuthority::sign_request`, recording what each request carried. Shared by
//! this crate's tests and the `ambit` binary's (through `#[path]`).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use ambit_identity::{CertificateAuthority, SpiffeId};
use ambit_proto::istio::v1::auth::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ambit_proto::{IstioCertificateRequest, IstioCertificateResponse};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The name the server's TLS certificate is for.
pub const CA_NAME: &str = "istiod.istio-system.svc";
/// `ambit_caclient::IMPERSONATED_IDENTITY`.
const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// What the CA was sent: the headers of interest, the metadata Struct, the lifetime.
#[derive(Debug, Clone)]
pub struct Seen {
    pub authorization: Option<String>,
    pub clusterid: Option<String>,
    pub extra: Option<String>,
    pub impersonated: Option<String>,
    pub metadata_fields: usize,
    pub validity: i64,
}

pub const SIGN: u8 = 0;
pub const WRONG_IDENTITY: u8 = 1;
pub const REFUSE: u8 = 2;

pub struct TestCa {
    pub ca: CertificateAuthority,
    pub mode: AtomicU8,
    pub seen: Mutex<Vec<Seen>>,
}

struct Svc(Arc<TestCa>);

#[tonic::async_trait]
impl IstioCertificateService for Svc {
    async fn create_certificate(
        &self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> Result<tonic::Response<IstioCertificateResponse>, tonic::Status> {
        let header = |name: &str| {
            request
                .metadata()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let body = request.get_ref();
        let fields = body
            .metadata
            .as_ref()
            .map(|m| m.fields.clone())
            .unwrap_or_default();
        let impersonated = fields
            .get(IMPERSONATED_IDENTITY)
            .and_then(|v| match &v.kind {
                Some(prost_types::value::Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            });
        let this = &self.0;
        this.seen.lock().unwrap().push(Seen {
            authorization: header("authorization"),
            clusterid: header("clusterid"),
            extra: header("x-extra"),
            impersonated,
            metadata_fields: fields.len(),
            validity: body.validity_duration,
        });
        let ttl = Duration::from_secs(body.validity_duration.max(1) as u64);
        let csr = match this.mode.load(SeqCst) {
            REFUSE => {
                return Err(tonic::Status::permission_denied(
                    "this token may not ask for that identity",
                ))
            }
            // Sign a request of our own for another identity instead.
            WRONG_IDENTITY => {
                let other = SpiffeId::parse("spiffe://cluster.local/ns/x/sa/admin").unwrap();
                ambit_identity::CertificateRequest::new(&other).unwrap().pem
            }
            _ => body.csr.clone(),
        };
        let signed = this
            .ca
            .sign_request(&csr, ttl, SystemTime::now())
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        Ok(tonic::Response::new(IstioCertificateResponse {
            cert_chain: signed.cert_chain,
        }))
    }
}

/// A server-side TLS stream tonic can serve.
struct Tls(tokio_rustls::server::TlsStream<TcpStream>);

impl tonic::transport::server::Connected for Tls {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for Tls {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tls {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// The server's TLS identity: a root (PEM) and a leaf for [`CA_NAME`] signed by it.
fn server_pki() -> (String, CertificateDer<'static>, PrivateKeyDer<'static>) {
    let root_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut root = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    root.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    root.distinguished_name
        .push(rcgen::DnType::CommonName, "test CA server root");
    let root = root.self_signed(&root_key).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf = rcgen::CertificateParams::new(vec![CA_NAME.to_string()])
        .unwrap()
        .signed_by(&key, &root, &root_key)
        .unwrap();
    (
        root.pem(),
        leaf.der().clone(),
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
}

pub struct Server {
    pub addr: SocketAddr,
    pub root_pem: String,
    pub ca: Arc<TestCa>,
}

pub async fn start_ca() -> Server {
    let (root_pem, leaf, key) = server_pki();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf], key)
        .unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = futures_util::stream::unfold((listener, acceptor), |(l, a)| async move {
        loop {
            let tcp = match l.accept().await {
                Ok((tcp, _)) => tcp,
                Err(e) => return Some((Err(e), (l, a))),
            };
            if let Ok(tls) = a.accept(tcp).await {
                return Some((Ok::<_, std::io::Error>(Tls(tls)), (l, a)));
            }
        }
    });
    let ca = Arc::new(TestCa {
        ca: CertificateAuthority::ephemeral("cluster.local").unwrap(),
        mode: AtomicU8::new(SIGN),
        seen: Mutex::new(Vec::new()),
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IstioCertificateServiceServer::new(Svc(ca.clone())))
            .serve_with_incoming(incoming),
    );
    Server { addr, root_pem, ca }
}
