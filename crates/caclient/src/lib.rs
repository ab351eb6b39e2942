//! ambit's client of Istio's certificate service, `IstioCertificateService/CreateCertificate`,
//! as an [`Issuer`] for [`ambit_identity::CertManager`]; and the node-local prefetch.
//!
//! A crate of its own so that `ambit-identity` (used by the HBONE data path, benches and
//! fuzz targets) stays free of tonic/prost/gRPC, and because the prefetch reads
//! `ambit-state`, which itself depends on `ambit-identity`.
//!
//! Per request: a new ECDSA P-256 key and CSR; `validity_duration` = the manager's TTL in
//! seconds; in shared (in-pod) mode `metadata = {"ImpersonatedIdentity": "<spiffe id>"}`
//! because the node proxy asks on behalf of pods. The answer is checked before it is
//! used: the leaf must be an SVID for the requested identity carrying our key; the last
//! chain element's root(s) become the trust anchors. The certificate manager then refuses
//! a leaf that is expired or not yet valid, a CA, or does not verify up to those roots.
#![forbid(unsafe_code)]

pub mod prefetch;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use ambit_grpc::GrpcChannel;
use ambit_identity::{
    CertError, CertificateRequest, IssueError, IssueFuture, Issuer, SpiffeId, WorkloadCertificate,
};
use ambit_proto::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use ambit_proto::{IstioCertificateRequest, IstioCertificateResponse};

pub use prefetch::{local_identities, NodePrefetch, PrefetchPlan};

/// How long one `CreateCertificate` may take before the CA counts as unreachable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer accepted (a chain is a few KiB; this leaves room for big root sets).
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// The most chain elements accepted in one answer.
pub const MAX_CHAIN_ELEMENTS: usize = 16;
/// The metadata key by which the node proxy asks for a pod's identity.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// Fetches workload certificates from an Istio CA (istiod or `ambit control`).
#[derive(Debug, Clone)]
pub struct RemoteIssuer {
    channel: GrpcChannel,
    address: String,
    impersonate: bool,
}

impl RemoteIssuer {
    /// A client of the CA behind `channel` (`address` is only for messages). With
    /// `impersonate` (shared mode) each request names the pod identity it is for.
    pub fn new(channel: GrpcChannel, address: impl Into<String>, impersonate: bool) -> Self {
        RemoteIssuer {
            channel,
            address: address.into(),
            impersonate,
        }
    }

    async fn create(
        &self,
        id: &SpiffeId,
        ttl: Duration,
    ) -> Result<WorkloadCertificate, IssueError> {
        let csr = CertificateRequest::new(id)?;
        let message = request_message(&csr, ttl, self.impersonate);
        let channel_error = |e: ambit_grpc::GrpcError| IssueError::Channel {
            reason: e.to_string(),
        };
        let channel = self.channel.channel().map_err(channel_error)?;
        let request = self.channel.request(message).map_err(channel_error)?;
        let mut client = IstioCertificateServiceClient::new(channel)
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        let response = tokio::time::timeout(REQUEST_TIMEOUT, client.create_certificate(request))
            .await
            .map_err(|_| IssueError::Unreachable {
                address: self.address.clone(),
                reason: format!("no answer within {REQUEST_TIMEOUT:?}"),
            })?
            .map_err(|status| status_error(&self.address, &status))?;
        certificate_from_response(csr, &response.into_inner())
    }
}

impl Issuer for RemoteIssuer {
    fn issue<'a>(&'a self, id: &'a SpiffeId, ttl: Duration, _now: SystemTime) -> IssueFuture<'a> {
        Box::pin(self.create(id, ttl))
    }
}

/// The `CreateCertificate` request for `csr`.
pub fn request_message(
    csr: &CertificateRequest,
    ttl: Duration,
    impersonate: bool,
) -> IstioCertificateRequest {
    let metadata = impersonate.then(|| prost_types::Struct {
        fields: BTreeMap::from([(
            IMPERSONATED_IDENTITY.to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(
                    csr.identity.to_string(),
                )),
            },
        )]),
    });
    IstioCertificateRequest {
        csr: csr.pem.clone(),
        validity_duration: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
        metadata,
    }
}

/// Whose fault a gRPC status is: transport-level codes mean no answer from the CA.
pub fn status_error(address: &str, status: &tonic::Status) -> IssueError {
    use tonic::Code;
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => IssueError::Unreachable {
            address: address.to_string(),
            reason: format!("{:?}: {}", status.code(), status.message()),
        },
        code => IssueError::Refused {
            code: format!("{code:?} ({})", code as i32),
            message: status.message().to_string(),
        },
    }
}

/// Checks the CA's answer to `csr` and pairs it with the key.
pub fn certificate_from_response(
    csr: CertificateRequest,
    response: &IstioCertificateResponse,
) -> Result<WorkloadCertificate, IssueError> {
    let bad = |reason: String| IssueError::BadChain { reason };
    let chain = &response.cert_chain;
    if chain.len() > MAX_CHAIN_ELEMENTS {
        return Err(bad(format!(
            "{} chain elements, more than the {MAX_CHAIN_ELEMENTS} accepted",
            chain.len()
        )));
    }
    let expected = csr.identity.to_string();
    let cert = WorkloadCertificate::from_ca_response(csr.identity, csr.key, chain).map_err(
        |e| match e {
            CertError::IdentityMismatch { expected, found } => {
                IssueError::WrongIdentity { expected, found }
            }
            CertError::NoSpiffeId { found } => IssueError::WrongIdentity {
                expected: expected.clone(),
                found: format!("no SPIFFE id (URI SANs {found:?})"),
            },
            CertError::KeyMismatch => {
                bad("the leaf certificate is not for the key of our request".into())
            }
            other => bad(other.to_string()),
        },
    )?;
    Ok(cert)
}

#[cfg(test)]
mod tests;
