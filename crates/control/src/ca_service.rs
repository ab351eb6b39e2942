//! Istio's `IstioCertificateService/CreateCertificate`: authenticate the bearer token,
//! decide the identity asked for, authorize it, sign.
//!
//! The decision ([`decide`]) is pure; [`CaService`] is the tonic edge.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ambit_identity::SpiffeId;
use ambit_proto::istio::v1::auth::istio_certificate_service_server::IstioCertificateService;
use ambit_proto::{IstioCertificateRequest, IstioCertificateResponse};
use tonic::{Request, Response, Status};

use crate::shared::Shared;
use crate::tokens::{token_tag, Binding, Tokens};

/// The metadata key ztunnel sets in shared mode: the identity it asks for on a pod's behalf.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";
/// Bytes of a CSR accepted.
pub const MAX_CSR_BYTES: usize = 16 * 1024;

pub use crate::bearer::{bearer, Refusal};

/// The identity a PEM CSR asks for (its one SPIFFE URI SAN; the signature is checked).
pub fn csr_identity(csr_pem: &str) -> Result<SpiffeId, Refusal> {
    if csr_pem.len() > MAX_CSR_BYTES {
        return Err(Refusal::InvalidArgument(format!(
            "the CSR is larger than {MAX_CSR_BYTES} bytes"
        )));
    }
    ambit_identity::requested_identity(csr_pem)
        .map(|(id, _)| id)
        .map_err(|e| Refusal::InvalidArgument(e.to_string()))
}

/// Decides the identity to sign: authenticates the token, checks the CSR and the
/// impersonation metadata, and authorizes the identity for the token's binding.
pub fn decide(
    authorization: Option<&str>,
    csr_pem: &str,
    impersonated: Option<&str>,
    tokens: &Tokens,
    node_identities: &BTreeMap<String, BTreeSet<String>>,
    trust_domain: &str,
) -> Result<(SpiffeId, Binding), Refusal> {
    let token = bearer(authorization)?;
    let binding = tokens.lookup(token).ok_or_else(|| {
        Refusal::Unauthenticated(format!(
            "unknown token (sha256 {}…); it is not in the control server's tokens file",
            token_tag(token)
        ))
    })?;
    let id = csr_identity(csr_pem)?;
    if let Some(asked) = impersonated {
        if asked != id.to_string() {
            return Err(Refusal::InvalidArgument(format!(
                "metadata {IMPERSONATED_IDENTITY} is {asked:?} but the CSR asks for {id}; they must be equal"
            )));
        }
    }
    if id.trust_domain() != trust_domain {
        return Err(Refusal::InvalidArgument(format!(
            "{id} is in trust domain {:?}; this CA signs only {trust_domain:?}",
            id.trust_domain()
        )));
    }
    let allowed = match binding {
        Binding::Identity(only) => *only == id,
        Binding::Node(node) => node_identities
            .get(node)
            .is_some_and(|ids| ids.contains(&id.to_string())),
    };
    if !allowed {
        let why = match binding {
            Binding::Identity(only) => format!("the token is bound to identity {only}"),
            Binding::Node(node) => format!(
                "the token is bound to node {node}, and no workload on node {node} has identity {id} in the mesh files"
            ),
        };
        return Err(Refusal::PermissionDenied(format!(
            "may not issue a certificate for {id}: {why}"
        )));
    }
    Ok((id, binding.clone()))
}

/// The lifetime to sign for: `requested` seconds (≤ 0: `default`), at most `max`.
pub fn ttl(requested: i64, default: Duration, max: Duration) -> Duration {
    let asked = if requested <= 0 {
        default
    } else {
        Duration::from_secs(requested.unsigned_abs())
    };
    asked.min(max)
}

/// The string value of `ImpersonatedIdentity` in the request metadata, if any.
fn impersonated(req: &IstioCertificateRequest) -> Result<Option<&str>, Refusal> {
    let Some(meta) = &req.metadata else {
        return Ok(None);
    };
    let Some(value) = meta.fields.get(IMPERSONATED_IDENTITY) else {
        return Ok(None);
    };
    match &value.kind {
        Some(prost_types::value::Kind::StringValue(s)) => Ok(Some(s)),
        _ => Err(Refusal::InvalidArgument(format!(
            "metadata {IMPERSONATED_IDENTITY} must be a string"
        ))),
    }
}

/// The tonic service.
pub struct CaService {
    pub(crate) shared: Arc<Shared>,
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let peer = request
            .remote_addr()
            .map_or_else(|| "?".to_string(), |a| a.to_string());
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = request.into_inner();
        let shared = &self.shared;
        let tokens = shared.tokens();
        let mesh = shared.mesh();
        let decided = impersonated(&body).and_then(|imp| {
            decide(
                authorization.as_deref(),
                &body.csr,
                imp,
                &tokens,
                &mesh.mesh.node_identities,
                &shared.config.trust_domain,
            )
        });
        let (id, binding) = match decided {
            Ok(d) => d,
            Err(refusal) => {
                shared.metrics.csr_refused.inc();
                tracing::warn!(%peer, "certificate request refused: {refusal:?}");
                return Err(refusal.into());
            }
        };
        let ttl = ttl(
            body.validity_duration,
            shared.config.default_cert_ttl,
            shared.config.max_cert_ttl,
        );
        let Some(ca) = shared.ca.as_ref() else {
            return Err(Status::unimplemented(
                "ambit control --kubernetes is not a CA: istiod signs the mesh's certificates",
            ));
        };
        match ca.sign_request(&body.csr, ttl, SystemTime::now()) {
            Ok(signed) => {
                shared.metrics.csr_signed.inc();
                tracing::info!(%peer, "signed {id} for {binding}, valid {}s", ttl.as_secs());
                Ok(Response::new(IstioCertificateResponse {
                    cert_chain: signed.cert_chain,
                }))
            }
            Err(e) => {
                shared.metrics.csr_refused.inc();
                tracing::warn!(%peer, "cannot sign {id} for {binding}: {e}");
                Err(Status::invalid_argument(format!(
                    "cannot sign the request: {e}"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tokens() -> Tokens {
        Tokens::parse(
            Path::new("t"),
            "- token: node1-token\n  node: node1\n- token: web-token\n  identity: spiffe://cluster.local/ns/default/sa/web\n",
        )
        .unwrap()
    }

    fn nodes() -> BTreeMap<String, BTreeSet<String>> {
        BTreeMap::from([(
            "node1".to_string(),
            BTreeSet::from(["spiffe://cluster.local/ns/default/sa/client".to_string()]),
        )])
    }

    fn csr(id: &str) -> String {
        ambit_identity::CertificateRequest::new(&SpiffeId::parse(id).unwrap())
            .unwrap()
            .pem
    }

    fn run(auth: Option<&str>, csr: &str, imp: Option<&str>) -> Result<SpiffeId, Refusal> {
        decide(auth, csr, imp, &tokens(), &nodes(), "cluster.local").map(|(id, _)| id)
    }

    const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
    const WEB: &str = "spiffe://cluster.local/ns/default/sa/web";

    #[test]
    fn a_node_token_gets_the_identities_of_its_node() {
        let id = run(Some("Bearer node1-token"), &csr(CLIENT), Some(CLIENT)).unwrap();
        assert_eq!(id.to_string(), CLIENT);
        // Dedicated mode: no impersonation metadata.
        run(Some("Bearer node1-token"), &csr(CLIENT), None).unwrap();
    }

    #[test]
    fn a_node_token_may_not_ask_for_another_nodes_identity() {
        let Err(Refusal::PermissionDenied(m)) =
            run(Some("Bearer node1-token"), &csr(WEB), Some(WEB))
        else {
            panic!("not refused");
        };
        assert!(m.contains(WEB) && m.contains("node1"), "{m}");
    }

    #[test]
    fn an_identity_token_gets_that_identity_only() {
        run(Some("Bearer web-token"), &csr(WEB), None).unwrap();
        let r = run(Some("Bearer web-token"), &csr(CLIENT), None);
        assert!(
            matches!(r, Err(Refusal::PermissionDenied(m)) if m.contains(CLIENT) && m.contains(WEB))
        );
    }

    #[test]
    fn missing_or_unknown_tokens_are_unauthenticated_and_not_echoed() {
        assert!(matches!(
            run(None, &csr(CLIENT), None),
            Err(Refusal::Unauthenticated(_))
        ));
        assert!(matches!(
            run(Some("Basic abc"), &csr(CLIENT), None),
            Err(Refusal::Unauthenticated(_))
        ));
        let Err(Refusal::Unauthenticated(m)) = run(Some("Bearer s3cret"), &csr(CLIENT), None)
        else {
            panic!("accepted");
        };
        assert!(!m.contains("s3cret"), "{m}");
    }

    #[test]
    fn bad_requests_are_invalid_arguments() {
        let auth = Some("Bearer node1-token");
        // Impersonation must match the CSR.
        assert!(matches!(
            run(auth, &csr(CLIENT), Some(WEB)),
            Err(Refusal::InvalidArgument(m)) if m.contains(IMPERSONATED_IDENTITY)
        ));
        // Foreign trust domain.
        assert!(matches!(
            run(auth, &csr("spiffe://other.td/ns/default/sa/client"), None),
            Err(Refusal::InvalidArgument(m)) if m.contains("other.td")
        ));
        // Not a CSR.
        assert!(matches!(
            run(auth, "hello", None),
            Err(Refusal::InvalidArgument(_))
        ));
        // Two SANs.
        let pem = two_san_csr();
        assert!(matches!(
            run(auth, &pem, None),
            Err(Refusal::InvalidArgument(m)) if m.contains("2 subject alternative names")
        ));
    }

    /// A CSR with a SPIFFE URI and a DNS name, made with rcgen.
    pub(crate) fn two_san_csr() -> String {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = vec![
            rcgen::SanType::URI(rcgen::Ia5String::try_from(CLIENT).unwrap()),
            rcgen::SanType::DnsName(rcgen::Ia5String::try_from("evil.example").unwrap()),
        ];
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    #[test]
    fn ttls_are_capped() {
        let day = Duration::from_secs(86400);
        let week = 7 * day;
        assert_eq!(ttl(0, day, week), day);
        assert_eq!(ttl(-5, day, week), day);
        assert_eq!(ttl(3600, day, week), Duration::from_secs(3600));
        assert_eq!(ttl(i64::MAX, day, week), week);
    }
}
