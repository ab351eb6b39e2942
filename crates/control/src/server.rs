//! The sockets: one TLS listener serving the delta ADS stream and the CA over gRPC, the
//! mesh and tokens watcher, and the serving certificate's renewal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ambit_grpc::server::{self, RequestLimits};
use ambit_proto::istio::v1::auth::istio_certificate_service_server::IstioCertificateServiceServer;
use ambit_runtime::file_watch::Watched;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::Status;

use crate::ads::sotw_unimplemented;
use crate::ca_service::CaService;
use crate::config::{
    ControlConfig, ControlError, ADS_PATH, CA_BODY_DEADLINE, CA_PATH, DEBUG_MAX_VERSIONS,
    MAX_CA_REQUEST_BYTES, SOTW_PATH,
};
use crate::mesh::{self, MeshError};
use crate::reload::watch_loop;
use crate::reload::Watches;
use crate::serving::ServingCert;
use crate::serving::{issue_serving, load_ca, renew_loop, server_config, serving_ips};
use crate::session::{Session, SessionDebug, SERVED_TYPES};
use crate::shared::{lock, stopped, Shared};
use crate::tokens::Tokens;

/// A running control server. Dropping it stops its tasks.
pub struct Control {
    pub(crate) shared: Arc<Shared>,
    pub(crate) local_addr: SocketAddr,
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) shutdown: watch::Sender<bool>,
}

impl Control {
    /// Loads the CA, the tokens and the mesh, listens, and serves.
    pub async fn start(config: ControlConfig) -> Result<Control, ControlError> {
        let ca = load_ca(&config)?;
        // Stamped before the first read: a change made after it is seen.
        let watched = Watches {
            mesh: Watched::new(&config.mesh_dir, config.poll_interval),
            tokens: Watched::new(&config.tokens_file, config.poll_interval),
        };
        let tokens = Tokens::load(&config.tokens_file)?;
        let mesh_dir = config.mesh_dir.clone();
        let files = tokio::task::spawn_blocking(move || mesh::read_dir(&mesh_dir))
            .await
            .map_err(|e| MeshError::ReadDir {
                dir: config.mesh_dir.clone(),
                source: std::io::Error::other(e),
            })??;
        let first = mesh::build(&files, &config.manifests)?;
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
        let ips = serving_ips(local_addr.ip());
        let (cert, renew_at) = issue_serving(&ca, &config, &ips)?;
        let resolver = Arc::new(ServingCert {
            current: RwLock::new(cert),
        });

        let shared = Arc::new(Shared::new(config, Some(ca), None, tokens));
        shared.publish(first);
        ambit_runtime::memory::release_freed();

        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let ads = crate::ads::Ads::service(&shared);
        let ca_service = IstioCertificateServiceServer::new(CaService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(MAX_CA_REQUEST_BYTES);
        let routes = tonic::service::Routes::new(ads).add_service(ca_service);
        let options = shared.serve_options();
        let gatekeeper = {
            let shared = shared.clone();
            Arc::new(move |head: &http::request::Parts| {
                server::Admission::Now(admit_request(&shared, head))
            })
        };
        let mut stop = shutdown_rx.clone();
        tasks.push(tokio::spawn(server::serve(
            listener,
            server_config(resolver.clone()),
            routes,
            options,
            gatekeeper,
            async move { stopped(&mut stop).await },
        )));
        tasks.push(tokio::spawn(watch_loop(
            shared.clone(),
            watched,
            files,
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(renew_loop(
            shared.clone(),
            resolver,
            ips,
            renew_at,
            shutdown_rx,
        )));
        shared.listening.store(true, Ordering::Release);
        tracing::info!(
            "ambit control serving delta xDS and the CA on {local_addr} (TLS, names {:?})",
            shared.config.serving_names
        );
        Ok(Control {
            shared,
            local_addr,
            tasks: Mutex::new(tasks),
            shutdown,
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The CA's trust anchors (what clients verify the serving certificate with); none
    /// with `--kubernetes`, where istiod's root is.
    pub fn root_pem(&self) -> Option<String> {
        self.shared.ca.as_ref().map(|ca| ca.root_pem())
    }

    /// True once the CA and mesh are loaded and the listener is up; with `--kubernetes`,
    /// once every watch has listed too.
    pub fn is_ready(&self) -> bool {
        self.shared.listening.load(Ordering::Acquire)
            && self
                .shared
                .kube
                .as_ref()
                .is_none_or(|k| k.synced.load(Ordering::Acquire))
    }

    /// The generation of the mesh served.
    pub fn mesh_generation(&self) -> u64 {
        self.shared.mesh_tx.borrow().snapshot.generation
    }

    /// Why the newest mesh files are refused, while they are.
    pub fn mesh_error(&self) -> Option<String> {
        lock(&self.shared.status).mesh_error.clone()
    }

    /// Prometheus text for `/metrics`.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.shared.metrics.registry)
            .is_err()
        {
            out.clear();
        }
        out
    }

    /// The JSON for `/debug`.
    pub fn debug_json(&self) -> serde_json::Value {
        let mesh = self.shared.mesh();
        let status = lock(&self.shared.status).clone();
        let sessions: Vec<(Option<SocketAddr>, Arc<Mutex<Session>>)> = lock(&self.shared.clients)
            .values()
            .map(|c| (c.peer, c.session.clone()))
            .collect();
        let clients: Vec<ClientDebug> = sessions
            .into_iter()
            .map(|(peer, s)| ClientDebug {
                peer: peer.map(|p| p.to_string()),
                session: lock(&s).debug(DEBUG_MAX_VERSIONS),
            })
            .collect();
        let resources: BTreeMap<&str, usize> = SERVED_TYPES
            .iter()
            .map(|t| (*t, mesh.snapshot.resources(t).map_or(0, |r| r.len())))
            .collect();
        serde_json::json!({
            "mesh": {
                "generation": mesh.snapshot.generation,
                "files": mesh.mesh.files,
                "resources": resources,
                "skipped": mesh.mesh.skipped,
                "error": status.mesh_error,
            },
            "tokens": {
                "count": self.shared.tokens().len(),
                "error": status.tokens_error,
            },
            "clients": clients,
        })
    }

    /// Stops serving and waits (at most 5 s per task) for the tasks to end.
    pub async fn shutdown(&self) {
        self.shutdown.send_replace(true);
        let tasks = std::mem::take(&mut *lock(&self.tasks));
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        for t in lock(&self.tasks).iter() {
            t.abort();
        }
    }
}

#[derive(Serialize)]
pub(crate) struct ClientDebug {
    pub(crate) peer: Option<String>,
    #[serde(flatten)]
    pub(crate) session: SessionDebug,
}

/// Decides a request from its head: a served path, and a token the tokens file lists
/// (for xDS as for the CA, as istiod requires by default). Nothing of the request's
/// body is read, and no stream counted, before this passes.
pub(crate) fn admit_request(
    shared: &Shared,
    head: &http::request::Parts,
) -> Result<RequestLimits, Box<Status>> {
    let path = head.uri.path();
    let limits = match path {
        ADS_PATH => RequestLimits::default(),
        CA_PATH => RequestLimits {
            body_deadline: Some(CA_BODY_DEADLINE),
        },
        SOTW_PATH => return Err(Box::new(sotw_unimplemented())),
        _ => {
            return Err(Box::new(Status::unimplemented(format!(
                "no service at {path}"
            ))))
        }
    };
    let authorization = head
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    let known = crate::ca_service::bearer(authorization).and_then(|token| {
        match shared.tokens().lookup(token) {
            Some(_) => Ok(()),
            None => Err(crate::ca_service::Refusal::Unauthenticated(format!(
                "unknown token (sha256 {}…); it is not in the control server's tokens file",
                crate::tokens::token_tag(token)
            ))),
        }
    });
    if let Err(refusal) = known {
        shared.metrics.unauthenticated.inc();
        if path == CA_PATH {
            shared.metrics.csr_refused.inc();
        }
        if shared
            .refusal_reports
            .due(std::time::Instant::now(), Duration::from_secs(10))
        {
            tracing::warn!(
                "refused an unauthenticated request for {path}: {refusal:?} (more are counted in ambit_control_unauthenticated_requests_total, reported at most every 10 s)"
            );
        }
        return Err(Box::new(refusal.into()));
    }
    Ok(limits)
}
