use std::time::{Duration, SystemTime};

use ambit_identity::CertificateAuthority;

use super::*;

const DAY: Duration = Duration::from_secs(86400);

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

fn web() -> SpiffeId {
    id("spiffe://cluster.local/ns/default/sa/web")
}

/// What an Istio CA answers to `csr`.
fn answer(ca: &CertificateAuthority, csr_pem: &str) -> IstioCertificateResponse {
    let signed = ca.sign_request(csr_pem, DAY, SystemTime::now()).unwrap();
    IstioCertificateResponse {
        cert_chain: signed.cert_chain,
    }
}

#[test]
fn the_request_carries_the_csr_the_ttl_and_in_shared_mode_the_identity() {
    let csr = CertificateRequest::new(&web()).unwrap();
    let shared = request_message(&csr, DAY, true);
    assert_eq!(shared.csr, csr.pem);
    assert_eq!(shared.validity_duration, 86400);
    let fields = shared.metadata.unwrap().fields;
    assert_eq!(fields.len(), 1);
    assert_eq!(
        fields[IMPERSONATED_IDENTITY].kind,
        Some(prost_types::value::Kind::StringValue(
            "spiffe://cluster.local/ns/default/sa/web".into()
        ))
    );
    let dedicated = request_message(&csr, Duration::from_secs(3600), false);
    assert_eq!(dedicated.validity_duration, 3600);
    assert!(dedicated.metadata.is_none());
}

#[test]
fn a_good_answer_becomes_a_certificate_with_every_root_trusted() {
    let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
    let other = CertificateAuthority::ephemeral("cluster.local").unwrap();
    let csr = CertificateRequest::new(&web()).unwrap();
    let mut response = answer(&ca, &csr.pem);
    // A last element with two roots concatenated (a root rotation in progress).
    let last = response.cert_chain.last_mut().unwrap();
    last.push_str(&other.root_pem());
    let cert = certificate_from_response(csr, &response).unwrap();
    assert_eq!(cert.identity, web());
    assert_eq!(cert.roots.len(), 2);
    assert_eq!(cert.roots[0], ca.roots()[0]);
    assert_eq!(cert.roots[1], other.roots()[0]);
    assert!(cert.not_after > SystemTime::now() + DAY - Duration::from_secs(60));
    // It makes a working TLS configuration.
    ambit_identity::server_config(&cert).unwrap();
}

#[test]
fn an_answer_for_another_identity_is_rejected() {
    let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
    let csr = CertificateRequest::new(&web()).unwrap();
    // The CA signs our key for someone else.
    let other = CertificateRequest::new(&id("spiffe://cluster.local/ns/x/sa/admin")).unwrap();
    let response = answer(&ca, &other.pem);
    let err = certificate_from_response(csr, &response).unwrap_err();
    assert!(
        matches!(&err, IssueError::WrongIdentity { expected, found }
            if expected == "spiffe://cluster.local/ns/default/sa/web"
            && found == "spiffe://cluster.local/ns/x/sa/admin"),
        "{err:?}"
    );
    assert_eq!(err.cause(), "wrong_identity");
}

#[test]
fn an_answer_for_another_key_is_rejected() {
    let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
    let ours = CertificateRequest::new(&web()).unwrap();
    let theirs = CertificateRequest::new(&web()).unwrap();
    let err = certificate_from_response(ours, &answer(&ca, &theirs.pem)).unwrap_err();
    assert!(
        matches!(&err, IssueError::BadChain { reason } if reason.contains("key")),
        "{err:?}"
    );
}

#[test]
fn malformed_answers_are_the_cas_fault() {
    let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
    let csr = || CertificateRequest::new(&web()).unwrap();
    let good = answer(&ca, &csr().pem);
    for (what, chain) in [
        ("empty", vec![]),
        ("leaf only", vec![good.cert_chain[0].clone()]),
        (
            "garbage",
            vec!["not pem".to_string(), good.cert_chain[1].clone()],
        ),
        (
            "too long",
            vec![good.cert_chain[0].clone(); MAX_CHAIN_ELEMENTS + 1],
        ),
    ] {
        let err = certificate_from_response(csr(), &IstioCertificateResponse { cert_chain: chain })
            .unwrap_err();
        assert_eq!(err.cause(), "bad_chain", "{what}: {err}");
        assert!(
            err.to_string()
                .starts_with("the CA returned an unusable certificate chain"),
            "{err}"
        );
    }
}

#[test]
fn statuses_say_refused_or_unreachable() {
    let refused = status_error(
        "https://istiod:15012",
        &tonic::Status::permission_denied("token audience mismatch"),
    );
    assert_eq!(
        refused.to_string(),
        "the CA refused the certificate request with status PermissionDenied (7): token audience mismatch"
    );
    let down = status_error(
        "https://istiod:15012",
        &tonic::Status::unavailable("tcp connect error"),
    );
    assert_eq!(down.cause(), "unreachable");
    assert!(down.to_string().contains("https://istiod:15012"), "{down}");
}
