//! RemoteIssuer and CertManager against a small Istio CA over TLS on 127.0.0.1: a tonic
//! server signing with `CertificateAuthority::sign_request`, recording what it was sent.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ambit_caclient::RemoteIssuer;
use ambit_grpc::{ChannelConfig, GrpcChannel, RootCa, Token};
use ambit_identity::{CertManager, IssueError, IssueFuture, Issuer, ManagerError, SpiffeId};
use support::rogue_ca::Defect;
use support::{start_ca, CA_NAME, REFUSE, WRONG_IDENTITY};
use tokio::net::TcpListener;

const DAY: Duration = Duration::from_secs(86400);

fn issuer(addr: SocketAddr, root_pem: &str, shared: bool) -> RemoteIssuer {
    let address = format!("https://{addr}");
    let channel = GrpcChannel::new(ChannelConfig {
        server_identity: None,
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

/// `ambit_certificate_fetch_failures_total{cause}` lines of the manager's metrics.
fn failure_lines(m: &CertManager) -> Vec<String> {
    let mut registry = prometheus_client::registry::Registry::default();
    m.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines()
        .filter(|l| l.starts_with("ambit_certificate_fetch_failures_total{"))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn each_bad_leaf_from_the_ca_is_refused_by_cause_and_never_cached() {
    let server = start_ca().await;
    let cases = [
        (Defect::Expired, "expired"),
        (Defect::NotYetValid, "not_yet_valid"),
        (Defect::CaTrue, "ca_leaf"),
        (Defect::KeyCertSign, "ca_leaf"),
        (Defect::ForeignRoot, "does_not_chain"),
        (Defect::ExpiredIntermediate, "does_not_chain"),
    ];
    assert_eq!(cases.map(|(d, _)| d), Defect::ALL_BAD);
    for (defect, cause) in cases {
        *server.ca.defect.lock().unwrap() = Some(defect);
        let m = CertManager::with_issuer(
            Arc::new(issuer(server.addr, &server.root_pem, true)),
            DAY,
            Arc::new(SystemTime::now),
        );
        let err = fetch(&m, &web()).await.unwrap_err();
        let ManagerError::Issue(e) = &err else {
            panic!("{defect:?}: {err:?}")
        };
        assert_eq!(e.cause(), cause, "{defect:?}: {e}");
        assert!(m.cached(&web()).is_none(), "{defect:?}");
        assert!(m.dump()[0].state.starts_with("Unavailable: "), "{defect:?}");
        // Asked again before the retry time: the same refusal, no second request.
        let before = server.ca.seen.lock().unwrap().len();
        assert_eq!(
            fetch(&m, &web()).await.unwrap_err().to_string(),
            err.to_string()
        );
        assert_eq!(server.ca.seen.lock().unwrap().len(), before, "{defect:?}");
        assert_eq!(
            failure_lines(&m),
            [format!(
                "ambit_certificate_fetch_failures_total{{cause=\"{cause}\"}} 1"
            )],
            "{defect:?}"
        );
    }
    // The same server's good leaves (the fixture itself is sound).
    for defect in [Defect::None, Defect::ViaIntermediate, Defect::SlightlyAhead] {
        *server.ca.defect.lock().unwrap() = Some(defect);
        let m = CertManager::with_issuer(
            Arc::new(issuer(server.addr, &server.root_pem, true)),
            DAY,
            Arc::new(SystemTime::now),
        );
        let cert = fetch(&m, &web())
            .await
            .unwrap_or_else(|e| panic!("{defect:?}: {e}"));
        assert_eq!(
            cert.roots[0].as_ref(),
            server.ca.rogue.root().der.as_slice()
        );
        m.server_config(&web()).await.unwrap();
    }
}
