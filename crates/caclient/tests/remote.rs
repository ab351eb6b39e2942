//! RemoteIssuer and CertManager against a small Istio CA over TLS on 127.0.0.1: a tonic
//! server signing with `CertificateAuthority::sign_request`, recording what it was sent.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use ambit_caclient::{RemoteIssuer, IMPERSONATED_IDENTITY};
use ambit_grpc::{ChannelConfig, GrpcChannel, RootCa, Token};
use ambit_identity::{
    CertManager, CertificateAuthority, IssueError, IssueFuture, Issuer, ManagerError, SpiffeId,
};
use ambit_proto::istio::v1::auth::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ambit_proto::{IstioCertificateRequest, IstioCertificateResponse};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

const DAY: Duration = Duration::from_secs(86400);
const CA_NAME: &str = "istiod.istio-system.svc";

/// What the CA was sent: the headers of interest, the metadata Struct, the lifetime.
#[derive(Debug, Clone)]
struct Seen {
    authorization: Option<String>,
    clusterid: Option<String>,
    extra: Option<String>,
    impersonated: Option<String>,
    metadata_fields: usize,
    validity: i64,
}

const SIGN: u8 = 0;
const WRONG_IDENTITY: u8 = 1;
const REFUSE: u8 = 2;

struct TestCa {
    ca: CertificateAuthority,
    mode: AtomicU8,
    seen: Mutex<Vec<Seen>>,
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

struct Server {
    addr: SocketAddr,
    root_pem: String,
    ca: Arc<TestCa>,
}

async fn start_ca() -> Server {
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

fn issuer(addr: SocketAddr, root_pem: &str, shared: bool) -> RemoteIssuer {
    let address = format!("https://{addr}");
    let channel = GrpcChannel::new(ChannelConfig {
        address: address.clone(),
        root: RootCa::Inline(root_pem.to_string()),
        alt_hostname: Some(CA_NAME.to_string()),
        token: Token::Literal("jwt-abc".into()),
        cluster_id: "cluster-7".into(),
        headers: vec![("x-extra".into(), "yes".into())],
    })
    .unwrap();
    RemoteIssuer::new(channel, address, shared)
}

fn web() -> SpiffeId {
    SpiffeId::parse("spiffe://cluster.local/ns/default/sa/web").unwrap()
}

/// Failure guard only.
const GUARD: Duration = Duration::from_secs(30);

async fn fetch(
    m: &CertManager,
    id: &SpiffeId,
) -> Result<Arc<ambit_identity::WorkloadCertificate>, ManagerError> {
    tokio::time::timeout(GUARD, m.fetch(id))
        .await
        .expect("fetch hung")
}

#[tokio::test]
async fn shared_mode_asks_on_behalf_of_the_pod() {
    let server = start_ca().await;
    let m = CertManager::with_issuer(
        Arc::new(issuer(server.addr, &server.root_pem, true)),
        DAY,
        Arc::new(SystemTime::now),
    );
    let cert = fetch(&m, &web()).await.unwrap();
    assert_eq!(cert.identity, web());
    assert_eq!(cert.roots, server.ca.ca.roots());
    let seen = server.ca.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(s.authorization.as_deref(), Some("Bearer jwt-abc"));
    assert_eq!(s.clusterid.as_deref(), Some("cluster-7"));
    assert_eq!(s.extra.as_deref(), Some("yes"));
    assert_eq!(
        s.impersonated.as_deref(),
        Some("spiffe://cluster.local/ns/default/sa/web")
    );
    assert_eq!(s.metadata_fields, 1);
    assert_eq!(s.validity, 86400);
    // The certificate works for HBONE.
    m.server_config(&web()).await.unwrap();
}

#[tokio::test]
async fn dedicated_mode_sends_no_metadata() {
    let server = start_ca().await;
    let issuer = issuer(server.addr, &server.root_pem, false);
    let cert = issuer
        .issue(&web(), Duration::from_secs(3600), SystemTime::now())
        .await
        .unwrap();
    assert_eq!(cert.identity, web());
    let seen = server.ca.seen.lock().unwrap().clone();
    assert_eq!(seen[0].metadata_fields, 0);
    assert_eq!(seen[0].impersonated, None);
    assert_eq!(seen[0].validity, 3600);
}

#[tokio::test]
async fn a_certificate_for_another_identity_is_rejected() {
    let server = start_ca().await;
    server.ca.mode.store(WRONG_IDENTITY, SeqCst);
    let m = CertManager::with_issuer(
        Arc::new(issuer(server.addr, &server.root_pem, true)),
        DAY,
        Arc::new(SystemTime::now),
    );
    let err = fetch(&m, &web()).await.unwrap_err();
    let ManagerError::Issue(e) = &err else {
        panic!("{err:?}")
    };
    assert!(matches!(**e, IssueError::WrongIdentity { .. }), "{e:?}");
    assert!(
        err.to_string()
            .contains("spiffe://cluster.local/ns/x/sa/admin"),
        "{err}"
    );
    assert!(m.cached(&web()).is_none());
}

#[tokio::test]
async fn a_refusal_names_the_status() {
    let server = start_ca().await;
    server.ca.mode.store(REFUSE, SeqCst);
    let issuer = issuer(server.addr, &server.root_pem, true);
    let err = issuer
        .issue(&web(), DAY, SystemTime::now())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the CA refused the certificate request with status PermissionDenied (7): this token may not ask for that identity"
    );
}

/// The live CA until `down`, then an address nothing listens on.
struct Switch {
    live: RemoteIssuer,
    dead: RemoteIssuer,
    down: AtomicBool,
}

impl Issuer for Switch {
    fn issue<'a>(&'a self, id: &'a SpiffeId, ttl: Duration, now: SystemTime) -> IssueFuture<'a> {
        if self.down.load(SeqCst) {
            self.dead.issue(id, ttl, now)
        } else {
            self.live.issue(id, ttl, now)
        }
    }
}

#[tokio::test]
async fn with_the_ca_down_the_valid_certificate_keeps_serving() {
    let server = start_ca().await;
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let switch = Arc::new(Switch {
        live: issuer(server.addr, &server.root_pem, true),
        dead: issuer(closed, &server.root_pem, true),
        down: AtomicBool::new(false),
    });
    let now = Arc::new(Mutex::new(SystemTime::now()));
    let clock = {
        let now = now.clone();
        Arc::new(move || *now.lock().unwrap())
    };
    let m = CertManager::with_issuer(switch.clone(), DAY, clock);
    let first = fetch(&m, &web()).await.unwrap();
    switch.down.store(true, SeqCst);
    // Past half life: the renewal fails, connections keep getting the valid certificate.
    *now.lock().unwrap() = first.renew_at() + Duration::from_secs(1);
    assert!(Arc::ptr_eq(&fetch(&m, &web()).await.unwrap(), &first));
    tokio::time::timeout(GUARD, m.wait_idle()).await.unwrap();
    assert!(Arc::ptr_eq(&fetch(&m, &web()).await.unwrap(), &first));
    m.server_config(&web()).await.unwrap();
    let next = m.renew_due().unwrap();
    assert!(
        next > *now.lock().unwrap() && next <= first.not_after,
        "a retry is scheduled"
    );
    // An identity without a certificate gets the CA's failure, saying it is unreachable.
    let other = SpiffeId::parse("spiffe://cluster.local/ns/default/sa/other").unwrap();
    let err = fetch(&m, &other).await.unwrap_err();
    assert!(err.to_string().contains("is unreachable"), "{err}");
    assert!(err.to_string().contains(&closed.to_string()), "{err}");
    // The CA is back: the retry renews.
    switch.down.store(false, SeqCst);
    *now.lock().unwrap() = next;
    m.renew_due();
    tokio::time::timeout(GUARD, m.wait_idle()).await.unwrap();
    let renewed = m.cached(&web()).unwrap();
    assert!(!Arc::ptr_eq(&renewed, &first));
}
