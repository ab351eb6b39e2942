//! A small Istio CA for tests: a tonic server over TLS on 127.0.0.1 signing with
//! `CertificateAuthority::sign_request`, recording what each request carried; or, set
//! [`TestCa::rogue`], answering every request with a leaf that has that defect. Shared by
//! this crate's tests and the `ambit` binary's (through `#[path]`).
#![allow(dead_code)]

#[path = "../../../identity/tests/support/rogue_ca.rs"]
pub mod rogue_ca;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ambit_grpc::server::{incoming, test_pki, AcceptOptions};
use ambit_identity::{CertificateAuthority, SpiffeId};
use ambit_proto::istio::v1::auth::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ambit_proto::{IstioCertificateRequest, IstioCertificateResponse};
use tokio::net::TcpListener;

/// The name the server's TLS certificate is for.
pub const CA_NAME: &str = "istiod.istio-system.svc";
/// `ambit_caclient::IMPERSONATED_IDENTITY`.
const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// What the CA was sent: the headers of interest, the metadata Struct, the lifetime, and
/// when it arrived (by the wall clock, which a node's certificate backoff runs on).
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: SystemTime,
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
    /// When set, requests are answered by `rogue` with a leaf that has this defect.
    pub defect: Mutex<Option<rogue_ca::Defect>>,
    pub rogue: rogue_ca::RogueCa,
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
            at: SystemTime::now(),
            authorization: header("authorization"),
            clusterid: header("clusterid"),
            extra: header("x-extra"),
            impersonated,
            metadata_fields: fields.len(),
            validity: body.validity_duration,
        });
        let ttl = Duration::from_secs(body.validity_duration.max(1) as u64);
        let defect = *this.defect.lock().unwrap();
        if let Some(defect) = defect {
            let csr = rcgen::CertificateSigningRequestParams::from_pem(&body.csr)
                .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
            let uri = match csr.params.subject_alt_names.as_slice() {
                [rcgen::SanType::URI(uri)] => uri.as_str().to_string(),
                _ => return Err(tonic::Status::invalid_argument("one URI SAN expected")),
            };
            let issued = this
                .rogue
                .sign(&csr.public_key, &uri, defect, SystemTime::now());
            return Ok(tonic::Response::new(IstioCertificateResponse {
                cert_chain: issued.cert_chain(),
            }));
        }
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

pub struct Server {
    pub addr: SocketAddr,
    pub root_pem: String,
    pub ca: Arc<TestCa>,
}

pub async fn start_ca() -> Server {
    let pki = test_pki(&[CA_NAME]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = incoming(listener, pki.acceptor(), AcceptOptions::default());
    let ca = Arc::new(TestCa {
        ca: CertificateAuthority::ephemeral("cluster.local").unwrap(),
        mode: AtomicU8::new(SIGN),
        seen: Mutex::new(Vec::new()),
        defect: Mutex::new(None),
        rogue: rogue_ca::RogueCa::new(),
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IstioCertificateServiceServer::new(Svc(ca.clone())))
            .serve_with_incoming(incoming),
    );
    Server {
        addr,
        root_pem: pki.root_pem,
        ca,
    }
}
