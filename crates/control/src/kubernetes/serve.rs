//! The server of `--kubernetes`: delta xDS for the L7 types only (no CA: istiod is the
//! CA), streams admitted once a TokenReview says the token is a waypoint's service
//! account, the serving certificate issued by the mesh CA for the server's own SPIFFE id
//! and swapped in as it is renewed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ambit_grpc::server::{self, Admission, RequestLimits};
use ambit_identity::{CertManager, WorkloadCertificate};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::Status;

use super::review::{self, Reviewed, Reviewer};
use super::KubeShared;
use crate::config::{ControlConfig, ControlError, ADS_PATH, CA_PATH};
use crate::mesh::Mesh;
use crate::serving::{server_config, ServingCert};
use crate::shared::{stopped, Shared};
use crate::tokens::Tokens;
use crate::Control;

/// How often the certificate manager is asked for the current certificate.
const CERT_CHECK_EVERY: Duration = Duration::from_secs(30);

impl Control {
    /// Serves the L7 configuration the API server holds: watches with `client`, reviews
    /// tokens with it, and serves with a certificate `certs` gets for `config.identity`.
    pub async fn start_kubernetes(
        config: ControlConfig,
        client: kube::Client,
        certs: Arc<CertManager>,
    ) -> Result<Control, ControlError> {
        let identity = config.identity.clone();
        let first = certs
            .fetch(&identity)
            .await
            .map_err(|source| ControlError::ServingFromCa {
                identity: identity.to_string(),
                source,
            })?;
        let resolver = Arc::new(ServingCert {
            current: RwLock::new(certified(&first)?),
        });
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| ControlError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let local_addr = listener.local_addr().map_err(|source| ControlError::Bind {
            addr: config.listen,
            source,
        })?;
        let kube = Arc::new(KubeShared::new(Reviewer::new(client.clone())));
        let shared = Arc::new(Shared::new(
            config,
            None,
            Some(kube.clone()),
            Tokens::default(),
        ));
        shared.publish(Mesh::default());

        let (shutdown, shutdown_rx) = watch::channel(false);
        let ads = crate::ads::Ads::service(&shared);
        let options = shared.serve_options();
        let gatekeeper = {
            let (shared, kube) = (shared.clone(), kube.clone());
            Arc::new(move |head: &http::request::Parts| gatekeep(&shared, &kube, head))
        };
        let mut tasks = Vec::new();
        let mut stop = shutdown_rx.clone();
        tasks.push(tokio::spawn(server::serve(
            listener,
            server_config(resolver.clone()),
            tonic::service::Routes::new(ads),
            options,
            gatekeeper,
            async move { stopped(&mut stop).await },
        )));
        tasks.push(tokio::spawn(super::watch::run(
            shared.clone(),
            client,
            kube,
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(follow_certificate(
            certs,
            identity,
            first,
            resolver,
            shutdown_rx,
        )));
        shared.listening.store(true, Ordering::Release);
        tracing::info!(
            "ambit control serving the waypoints' L7 configuration from the API server on {local_addr} (TLS as {})",
            shared.config.identity
        );
        Ok(Control {
            shared,
            local_addr,
            tasks: Mutex::new(tasks),
            shutdown,
        })
    }
}

/// A workload certificate as rustls serves it.
fn certified(cert: &WorkloadCertificate) -> Result<Arc<CertifiedKey>, ControlError> {
    let key = ambit_identity::crypto_provider()
        .key_provider
        .load_private_key(cert.key.clone_key().into())
        .map_err(ControlError::ServingKey)?;
    Ok(Arc::new(CertifiedKey::new(cert.chain.clone(), key)))
}

/// Swaps in each certificate the manager renews (it renews at half-life).
async fn follow_certificate(
    certs: Arc<CertManager>,
    identity: ambit_identity::SpiffeId,
    mut current: Arc<WorkloadCertificate>,
    resolver: Arc<ServingCert>,
    mut stop: watch::Receiver<bool>,
) {
    let _renewal = certs.spawn_renewal();
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = tokio::time::sleep(CERT_CHECK_EVERY) => {}
        }
        match certs.fetch(&identity).await {
            Ok(cert) if cert.chain != current.chain => match certified(&cert) {
                Ok(key) => {
                    *resolver.current.write().unwrap_or_else(|p| p.into_inner()) = key;
                    current = cert;
                    tracing::info!("serving certificate renewed by the mesh CA");
                }
                Err(e) => tracing::warn!("a renewed serving certificate is unusable: {e}"),
            },
            Ok(_) => {}
            Err(e) => tracing::warn!(
                "cannot renew the serving certificate (still serving the current one): {e}"
            ),
        }
    }
}

/// Admits a delta xDS stream whose token a TokenReview says is a waypoint's service
/// account; the CA is not served here.
fn gatekeep(
    shared: &Arc<Shared>,
    kube: &Arc<KubeShared>,
    head: &http::request::Parts,
) -> Admission {
    let path = head.uri.path();
    if path == CA_PATH {
        return Admission::Now(Err(Box::new(Status::unimplemented(
            "ambit control --kubernetes is not a CA: istiod signs the mesh's certificates",
        ))));
    }
    if path != ADS_PATH {
        return Admission::Now(Err(Box::new(Status::unimplemented(format!(
            "no service at {path} (ambit control --kubernetes serves delta xDS only)"
        )))));
    }
    let authorization = head
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    let token = match crate::bearer::bearer(authorization) {
        Ok(t) => t.to_string(),
        Err(refusal) => {
            shared.metrics.unauthenticated.inc();
            return Admission::Now(Err(Box::new(refusal.into())));
        }
    };
    if let Some(reviewed) = kube.reviewer.cached(&token) {
        return Admission::Now(decide(shared, kube, Ok(reviewed)));
    }
    let (shared, kube) = (shared.clone(), kube.clone());
    Admission::Later(Box::pin(async move {
        let reviewed = kube.reviewer.review(&token).await;
        decide(&shared, &kube, reviewed)
    }))
}

fn decide(
    shared: &Shared,
    kube: &KubeShared,
    reviewed: Result<Reviewed, String>,
) -> Result<RequestLimits, Box<Status>> {
    let reviewed = reviewed.map_err(|e| Box::new(Status::unavailable(e)))?;
    let verdict = review::admit(&reviewed, &kube.visibility().waypoints);
    let status = match verdict {
        Ok(()) => return Ok(RequestLimits::default()),
        Err(review::Refusal::Unauthenticated(m)) => {
            shared.metrics.unauthenticated.inc();
            Status::unauthenticated(m)
        }
        Err(review::Refusal::NotAWaypoint(m)) => {
            shared.metrics.not_a_waypoint.inc();
            Status::permission_denied(m)
        }
    };
    if shared
        .refusal_reports
        .due(std::time::Instant::now(), Duration::from_secs(10))
    {
        tracing::warn!(
            "refused an xDS stream: {} (more are counted, reported at most every 10 s)",
            status.message()
        );
    }
    Err(Box::new(status))
}
