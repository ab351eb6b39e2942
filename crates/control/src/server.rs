//! The sockets: one TLS listener serving the delta ADS stream and the CA over gRPC, the
//! mesh and tokens watcher, and the serving certificate's renewal.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use ambit_grpc::server::{self, RequestLimits, ServeOptions};
use ambit_identity::{CaError, CertificateAuthority};
use ambit_manifests::ParseOptions;
use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use ambit_proto::istio::v1::auth::istio_certificate_service_server::IstioCertificateServiceServer;
use ambit_proto::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::ca_service::CaService;
use crate::mesh::{self, Mesh, MeshError};
use crate::session::{Session, SessionDebug, SessionLimits, Snapshot, SERVED_TYPES};
use crate::tokens::{Tokens, TokensError};

/// The default xDS/CA port, istiod's.
pub const DEFAULT_LISTEN: &str = "[::]:15012";
/// The default serving name, istiod's in-cluster name.
pub const DEFAULT_SERVING_NAME: &str = "istiod.istio-system.svc";
/// Bytes of one xDS request decoded at most (an ACK is small; a subscription to many
/// names is not).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Bytes of one certificate request decoded at most: a CSR is a few hundred bytes (the
/// CSR itself is refused over `MAX_CSR_BYTES`), so 64 unfinished ones pin 4 MiB, not 256.
pub const MAX_CA_REQUEST_BYTES: usize = 64 * 1024;
/// Time a certificate request's body has to arrive once its headers have.
const CA_BODY_DEADLINE: Duration = Duration::from_secs(10);
/// Responses queued for one client before its task waits for it to read.
const CLIENT_QUEUE: usize = 16;
/// Connections (beyond the xDS clients) that may be open at once: CA callers, handshakes.
const EXTRA_CONNECTIONS: usize = 64;
/// HTTP/2 streams (xDS streams and CA calls) one connection may have open at once.
const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// The gRPC paths served; anything else is refused before authentication matters.
const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
const CA_PATH: &str = "/istio.v1.auth.IstioCertificateService/CreateCertificate";
const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// Versions shown per type and client in `/debug`.
const DEBUG_MAX_VERSIONS: usize = 1000;

/// How to run the control server.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    pub mesh_dir: PathBuf,
    pub ca_dir: PathBuf,
    pub tokens_file: PathBuf,
    pub listen: SocketAddr,
    /// DNS names of the serving certificate.
    pub serving_names: Vec<String>,
    /// The trust domain the CA signs for (and an ephemeral root is named after).
    pub trust_domain: String,
    /// xDS streams served at once.
    pub max_clients: usize,
    /// Connections and streams one source IP may hold at once (each).
    pub max_per_source: usize,
    /// Time a connection has, after its TLS handshake, to make an authenticated request.
    pub auth_timeout: Duration,
    /// An authenticated connection without an open stream this long is closed.
    pub idle_timeout: Duration,
    /// How often the mesh directory and tokens file are checked for changes.
    pub poll_interval: Duration,
    /// Lifetime of a workload certificate when the request names none.
    pub default_cert_ttl: Duration,
    /// The longest workload certificate signed, whatever the request asks.
    pub max_cert_ttl: Duration,
    /// Lifetime of the serving certificate (renewed at half of it).
    pub serving_cert_ttl: Duration,
    pub limits: SessionLimits,
    /// How manifest files of the mesh directory are read: Istio's root namespace (the
    /// only one whose policies may target a GatewayClass) and the namespace of an object
    /// that names none. A waypoint must use the same root namespace, or it refuses the
    /// GatewayClass policies served (a NACK says so).
    pub manifests: ParseOptions,
}

impl ControlConfig {
    /// The defaults: istiod's port and name, `cluster.local`, 1024 clients (a quarter of
    /// them per source), 10 s to authenticate, 5 min idle, 1 s polling, 24 h workload
    /// certificates (at most 7 days), 24 h serving certificate.
    pub fn new(mesh_dir: PathBuf, ca_dir: PathBuf, tokens_file: PathBuf) -> Self {
        ControlConfig {
            mesh_dir,
            ca_dir,
            tokens_file,
            listen: SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 15012),
            serving_names: vec![DEFAULT_SERVING_NAME.to_string()],
            trust_domain: "cluster.local".to_string(),
            max_clients: 1024,
            max_per_source: 256,
            auth_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            poll_interval: Duration::from_secs(1),
            default_cert_ttl: Duration::from_secs(24 * 3600),
            max_cert_ttl: Duration::from_secs(7 * 24 * 3600),
            serving_cert_ttl: Duration::from_secs(24 * 3600),
            limits: SessionLimits::default(),
            manifests: ParseOptions::default(),
        }
    }
}

/// Why the control server did not start. The operator's to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("the CA in {dir}: {source}")]
    Ca { dir: PathBuf, source: CaError },
    #[error("the serving certificate: {0}")]
    ServingCert(#[source] CaError),
    #[error("the serving certificate's key: {0}")]
    ServingKey(#[source] rustls::Error),
    #[error("the mesh: {0}")]
    Mesh(#[from] MeshError),
    #[error("the tokens: {0}")]
    Tokens(#[from] TokensError),
    #[error(
        "cannot listen on {addr}: {source} (another control server or istiod there? on a host without IPv6, use --listen 0.0.0.0:15012)"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

pub(crate) struct MeshState {
    pub(crate) mesh: Mesh,
    pub(crate) snapshot: Snapshot,
}

#[derive(Debug, Default, Clone, Serialize)]
struct ReloadStatus {
    /// The error of the newest mesh files, while they are refused (the last good mesh is
    /// served meanwhile).
    mesh_error: Option<String>,
    tokens_error: Option<String>,
}

pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) clients: Gauge,
    pub(crate) pushes: Counter,
    pub(crate) acks: Counter,
    pub(crate) nacks: Counter,
    pub(crate) csr_signed: Counter,
    pub(crate) csr_refused: Counter,
    pub(crate) unauthenticated: Counter,
    pub(crate) mesh_generation: Gauge,
    pub(crate) mesh_resources: Gauge,
    pub(crate) reload_errors: Counter,
    /// Names clients subscribed to by name (on-demand clients), per type.
    pub(crate) names_subscribed: Family<TypeLabel, Counter>,
    /// Streams ended because a request broke a per-client bound, per reason.
    pub(crate) requests_refused: Family<ReasonLabel, Counter>,
    /// The most names one client has held subscribed of one type (the cap's high-water
    /// mark, kept on every request).
    pub(crate) most_names: Gauge,
    /// Names sessions looked at to answer requests and snapshot changes.
    pub(crate) names_examined: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TypeLabel {
    pub(crate) type_url: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub(crate) reason: &'static str,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ambit_control");
        let m = Metrics {
            registry: Registry::default(),
            clients: Gauge::default(),
            pushes: Counter::default(),
            acks: Counter::default(),
            nacks: Counter::default(),
            csr_signed: Counter::default(),
            csr_refused: Counter::default(),
            unauthenticated: Counter::default(),
            mesh_generation: Gauge::default(),
            mesh_resources: Gauge::default(),
            reload_errors: Counter::default(),
            names_subscribed: Family::default(),
            requests_refused: Family::default(),
            most_names: Gauge::default(),
            names_examined: Counter::default(),
        };
        registry.register(
            "xds_clients",
            "Connected delta xDS streams",
            m.clients.clone(),
        );
        registry.register("xds_pushes", "Delta xDS responses sent", m.pushes.clone());
        registry.register("xds_acks", "Responses ACKed by clients", m.acks.clone());
        registry.register("xds_nacks", "Responses NACKed by clients", m.nacks.clone());
        registry.register(
            "csr_signed",
            "Certificate requests signed",
            m.csr_signed.clone(),
        );
        registry.register(
            "csr_refused",
            "Certificate requests refused",
            m.csr_refused.clone(),
        );
        registry.register(
            "unauthenticated_requests",
            "Requests refused before their body was read: no token, or one the tokens file does not list",
            m.unauthenticated.clone(),
        );
        registry.register(
            "mesh_generation",
            "Generation of the mesh served (bumped on every accepted change)",
            m.mesh_generation.clone(),
        );
        registry.register(
            "mesh_resources",
            "xDS resources served",
            m.mesh_resources.clone(),
        );
        registry.register(
            "mesh_reload_errors",
            "Changes of the mesh directory or tokens file that were refused",
            m.reload_errors.clone(),
        );
        registry.register(
            "xds_names_subscribed",
            "Resource names clients subscribed to by name (not the wildcard), by type",
            m.names_subscribed.clone(),
        );
        registry.register(
            "xds_requests_refused",
            "xDS streams ended because a request broke a per-client bound or was malformed, by reason",
            m.requests_refused.clone(),
        );
        registry.register(
            "xds_client_names_peak",
            "The most resource names one client has held subscribed by name, of one type, since the server started (never above the per-client cap)",
            m.most_names.clone(),
        );
        registry.register(
            "xds_names_examined",
            "Resource names looked at to work out what clients follow and what to send them (grows with what clients ask and what changes)",
            m.names_examined.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Counts what `session` did since it was last accounted: its high-water mark of
    /// names (a refused request's names included) and the names it looked at.
    fn account(&self, session: &mut Session) {
        let most = i64::try_from(session.most_names()).unwrap_or(i64::MAX);
        self.most_names.inner().fetch_max(most, Ordering::Relaxed);
        self.names_examined.inc_by(session.take_names_examined());
    }
}

struct ClientEntry {
    peer: Option<SocketAddr>,
    session: Arc<Mutex<Session>>,
}

pub(crate) struct Shared {
    pub(crate) config: ControlConfig,
    pub(crate) ca: CertificateAuthority,
    mesh_tx: watch::Sender<Arc<MeshState>>,
    tokens: RwLock<Arc<Tokens>>,
    status: Mutex<ReloadStatus>,
    clients: Mutex<BTreeMap<u64, ClientEntry>>,
    next_session: AtomicU64,
    pub(crate) metrics: Metrics,
    client_slots: Arc<Semaphore>,
    listening: AtomicBool,
    refusal_reports: ambit_admission::ReportThrottle,
}

/// Locks a mutex, taking the data of a poisoned one (every critical section here leaves
/// the data consistent).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(crate) fn mesh(&self) -> Arc<MeshState> {
        self.mesh_tx.borrow().clone()
    }

    pub(crate) fn tokens(&self) -> Arc<Tokens> {
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the tokens granted, and the error shown in `/debug`.
    fn set_tokens(&self, tokens: Tokens, error: Option<String>) {
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tokens);
        lock(&self.status).tokens_error = error;
    }

    /// Decides a request from its head: a served path, and a token the tokens file lists
    /// (for xDS as for the CA, as istiod requires by default). Nothing of the request's
    /// body is read, and no stream counted, before this passes.
    fn admit_request(&self, head: &http::request::Parts) -> Result<RequestLimits, Box<Status>> {
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
            match self.tokens().lookup(token) {
                Some(_) => Ok(()),
                None => Err(crate::ca_service::Refusal::Unauthenticated(format!(
                    "unknown token (sha256 {}…); it is not in the control server's tokens file",
                    crate::tokens::token_tag(token)
                ))),
            }
        });
        if let Err(refusal) = known {
            self.metrics.unauthenticated.inc();
            if path == CA_PATH {
                self.metrics.csr_refused.inc();
            }
            if self
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

    fn publish(&self, mesh: Mesh) {
        let previous = self.mesh_tx.borrow().clone();
        let generation = previous.snapshot.generation + 1;
        // What changed is worked out here once, not by every session.
        let snapshot = mesh
            .snapshot(generation)
            .with_changes_from(&previous.snapshot);
        drop(previous);
        self.metrics.mesh_generation.set(generation as i64);
        self.metrics.mesh_resources.set(snapshot.len() as i64);
        tracing::info!(
            generation,
            resources = snapshot.len(),
            files = mesh.files.len(),
            waypoint_policies = mesh.waypoint_policies.len(),
            routes = mesh.routes.len(),
            "serving the mesh"
        );
        for skipped in &mesh.skipped {
            tracing::info!("not served: {skipped}");
        }
        for line in mesh.route_status() {
            tracing::warn!("route: {line}");
        }
        self.mesh_tx
            .send_replace(Arc::new(MeshState { mesh, snapshot }));
    }
}

/// A running control server. Dropping it stops its tasks.
pub struct Control {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    shutdown: watch::Sender<bool>,
}

impl Control {
    /// Loads the CA, the tokens and the mesh, listens, and serves.
    pub async fn start(config: ControlConfig) -> Result<Control, ControlError> {
        let ca = load_ca(&config)?;
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

        let (mesh_tx, _) = watch::channel(Arc::new(MeshState {
            mesh: Mesh::default(),
            snapshot: Snapshot::new(0),
        }));
        let shared = Arc::new(Shared {
            client_slots: Arc::new(Semaphore::new(config.max_clients)),
            config,
            ca,
            mesh_tx,
            tokens: RwLock::new(Arc::new(tokens)),
            status: Mutex::new(ReloadStatus::default()),
            clients: Mutex::new(BTreeMap::new()),
            next_session: AtomicU64::new(1),
            metrics: Metrics::new(),
            listening: AtomicBool::new(false),
            refusal_reports: Default::default(),
        });
        shared.publish(first);
        ambit_runtime::memory::release_freed();

        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let ads = AggregatedDiscoveryServiceServer::new(Ads {
            shared: shared.clone(),
        })
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(ambit_proto::MAX_XDS_MESSAGE);
        let ca_service = IstioCertificateServiceServer::new(CaService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(MAX_CA_REQUEST_BYTES);
        let routes = tonic::service::Routes::new(ads).add_service(ca_service);
        let options = ServeOptions {
            connections: ambit_admission::Limits {
                total: shared.config.max_clients + EXTRA_CONNECTIONS,
                per_source: shared.config.max_per_source,
            },
            auth_timeout: shared.config.auth_timeout,
            idle_timeout: shared.config.idle_timeout,
            // One connection may carry many xDS streams (tests, proxies multiplexing) but
            // not an unbounded number of calls.
            max_streams_per_connection: MAX_STREAMS_PER_CONNECTION,
            max_streams_per_source: shared.config.max_per_source,
            ..ServeOptions::default()
        };
        let gatekeeper = {
            let shared = shared.clone();
            Arc::new(move |head: &http::request::Parts| shared.admit_request(head))
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

    /// The CA's trust anchors (what clients verify the serving certificate with).
    pub fn root_pem(&self) -> String {
        self.shared.ca.root_pem()
    }

    /// True once the CA and mesh are loaded and the listener is up.
    pub fn is_ready(&self) -> bool {
        self.shared.listening.load(Ordering::Acquire)
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
struct ClientDebug {
    peer: Option<String>,
    #[serde(flatten)]
    session: SessionDebug,
}

/// The CA: the plug-in directory, or an ephemeral root written there when it holds none
/// of the plug-in files.
fn load_ca(config: &ControlConfig) -> Result<CertificateAuthority, ControlError> {
    let dir = &config.ca_dir;
    let err = |source| ControlError::Ca {
        dir: dir.clone(),
        source,
    };
    let any = [
        "ca-cert.pem",
        "ca-key.pem",
        "root-cert.pem",
        "cert-chain.pem",
    ]
    .iter()
    .any(|f| dir.join(f).exists());
    if any {
        return CertificateAuthority::from_plugin_dir(dir).map_err(err);
    }
    let ca = CertificateAuthority::ephemeral(&config.trust_domain).map_err(err)?;
    ca.write_plugin_dir(dir).map_err(err)?;
    tracing::info!(
        "no CA in {}: made an ephemeral root and wrote it there (clients trust {}/root-cert.pem)",
        dir.display(),
        dir.display()
    );
    Ok(ca)
}

/// The IPs in the serving certificate: the one listened on, or loopback for a wildcard.
fn serving_ips(listen: IpAddr) -> Vec<IpAddr> {
    if listen.is_unspecified() {
        vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ]
    } else {
        vec![listen]
    }
}

fn issue_serving(
    ca: &CertificateAuthority,
    config: &ControlConfig,
    ips: &[IpAddr],
) -> Result<(Arc<CertifiedKey>, SystemTime), ControlError> {
    let now = SystemTime::now();
    let (chain, key, not_after) = ca
        .issue_server_cert(&config.serving_names, ips, config.serving_cert_ttl, now)
        .map_err(ControlError::ServingCert)?;
    let signing = ambit_identity::crypto_provider()
        .key_provider
        .load_private_key(key.into())
        .map_err(ControlError::ServingKey)?;
    let half = not_after.duration_since(now).unwrap_or_default() / 2;
    Ok((Arc::new(CertifiedKey::new(chain, signing)), now + half))
}

#[derive(Debug)]
struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

fn server_config(resolver: Arc<ServingCert>) -> Arc<rustls::ServerConfig> {
    // The provider's safe defaults cannot fail to build with its own protocol versions.
    let builder = rustls::ServerConfig::builder_with_provider(ambit_identity::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|_| {
            rustls::ServerConfig::builder_with_protocol_versions(rustls::DEFAULT_VERSIONS)
        });
    let mut cfg = builder.with_no_client_auth().with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

/// Reissues the serving certificate at half its life.
async fn renew_loop(
    shared: Arc<Shared>,
    resolver: Arc<ServingCert>,
    ips: Vec<IpAddr>,
    mut renew_at: SystemTime,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let wait = renew_at
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = tokio::time::sleep(wait) => {}
        }
        match issue_serving(&shared.ca, &shared.config, &ips) {
            Ok((cert, next)) => {
                *resolver.current.write().unwrap_or_else(|p| p.into_inner()) = cert;
                renew_at = next;
                tracing::info!("renewed the serving certificate");
            }
            Err(e) => {
                tracing::warn!("cannot renew the serving certificate (retrying in 60 s): {e}");
                renew_at = SystemTime::now() + Duration::from_secs(60);
            }
        }
    }
}

/// Watches the mesh directory (notified) and the tokens file (polled); a change that loads replaces what is
/// served, one that does not is reported and the last good state stays.
async fn watch_loop(
    shared: Arc<Shared>,
    mut last_files: Vec<(PathBuf, String)>,
    mut stop: watch::Receiver<bool>,
) {
    let mut last_tokens = tokens_text(&shared).await.ok();
    let mut last_read_error: Option<String> = None;
    // The mesh directory on the kernel's notification, and everything (the tokens file
    // too) on the poll.
    let mut watch = ambit_runtime::file_watch::FileWatch::new(
        &shared.config.mesh_dir,
        shared.config.poll_interval,
    );
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = watch.changed() => {}
        }
        let dir = shared.config.mesh_dir.clone();
        let read = tokio::task::spawn_blocking(move || mesh::read_dir(&dir)).await;
        match read {
            Ok(Ok(files)) if files != last_files => {
                last_read_error = None;
                match mesh::build(&files, &shared.config.manifests) {
                    Ok(m) => {
                        lock(&shared.status).mesh_error = None;
                        shared.publish(m);
                        // The previous mesh and what decoding this one used go back.
                        ambit_runtime::memory::release_freed();
                    }
                    Err(e) => {
                        shared.metrics.reload_errors.inc();
                        tracing::error!(
                            "mesh change refused, still serving the last good mesh: {e}"
                        );
                        lock(&shared.status).mesh_error = Some(e.to_string());
                    }
                }
                last_files = files;
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let text = e.to_string();
                if last_read_error.as_deref() != Some(&text) {
                    shared.metrics.reload_errors.inc();
                    tracing::error!("still serving the last good mesh: {text}");
                    lock(&shared.status).mesh_error = Some(text.clone());
                    last_read_error = Some(text);
                }
            }
            Err(e) => tracing::error!("mesh reader task failed: {e}"),
        }
        match tokens_text(&shared).await {
            Ok(text) if last_tokens.as_deref() != Some(&text) => {
                match Tokens::parse(&shared.config.tokens_file, &text) {
                    Ok(t) => {
                        tracing::info!(tokens = t.len(), "loaded the tokens file");
                        shared.set_tokens(t, None);
                    }
                    Err(e) => {
                        shared.metrics.reload_errors.inc();
                        tracing::error!(
                            "the tokens file no longer loads: refusing every request until it does (no token is valid meanwhile): {e}"
                        );
                        shared.set_tokens(Tokens::default(), Some(e.to_string()));
                    }
                }
                last_tokens = Some(text);
            }
            Ok(_) => {}
            Err(e) => {
                // Deleted or unreadable: the tokens it listed are no longer granted. A
                // revoked credential must not outlive the file that revoked it.
                let text = e.to_string();
                let already = lock(&shared.status).tokens_error.as_deref() == Some(&text);
                if !already {
                    shared.metrics.reload_errors.inc();
                    tracing::error!(
                        "cannot read the tokens file: refusing every request until it can be read (no token is valid meanwhile): {text}"
                    );
                    shared.set_tokens(Tokens::default(), Some(text));
                }
                last_tokens = None;
            }
        }
    }
}

async fn tokens_text(shared: &Shared) -> Result<String, TokensError> {
    let path = shared.config.tokens_file.clone();
    tokio::task::spawn_blocking(move || crate::tokens::read(&path))
        .await
        .unwrap_or_else(|e| {
            Err(TokensError::Read {
                path: shared.config.tokens_file.clone(),
                source: std::io::Error::other(e),
            })
        })
}

/// Resolves once shutdown is asked for (or the control server is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn sotw_unimplemented() -> Status {
    Status::unimplemented("ambit control serves incremental xDS only: use DeltaAggregatedResources")
}

/// The delta ADS service.
struct Ads {
    shared: Arc<Shared>,
}

type SotwStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        Err(sotw_unimplemented())
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let shared = self.shared.clone();
        let Ok(slot) = shared.client_slots.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(format!(
                "ambit control already serves {} xDS clients (raise --max-clients)",
                shared.config.max_clients
            )));
        };
        let peer = request.remote_addr();
        let id = shared.next_session.fetch_add(1, Ordering::Relaxed);
        let session = Arc::new(Mutex::new(Session::new(id, shared.config.limits)));
        lock(&shared.clients).insert(
            id,
            ClientEntry {
                peer,
                session: session.clone(),
            },
        );
        shared.metrics.clients.inc();
        let (tx, rx) = mpsc::channel(CLIENT_QUEUE);
        let stream = request.into_inner();
        tokio::spawn(async move {
            let _slot = slot;
            let _registered = Registered {
                shared: shared.clone(),
                id,
            };
            serve_client(&shared, &session, stream, tx).await;
            let node = lock(&session).node_id().map(str::to_string);
            tracing::info!(id, ?peer, ?node, "xDS client gone");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Removes a client from the registry however its task ends.
struct Registered {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.shared.clients).remove(&self.id);
        self.shared.metrics.clients.dec();
    }
}

async fn serve_client(
    shared: &Shared,
    session: &Mutex<Session>,
    mut requests: Streaming<DeltaDiscoveryRequest>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) {
    let mut mesh_rx = shared.mesh_tx.subscribe();
    loop {
        let responses = tokio::select! {
            msg = requests.message() => match msg {
                Ok(Some(req)) => {
                    // Not `borrow_and_update`: a request (an ACK, say) that arrives just
                    // after a publish must not mark that snapshot seen, or its changes
                    // would never be pushed to this client.
                    let mesh = mesh_rx.borrow().clone();
                    let type_url = req.type_url.clone();
                    let step = {
                        let mut s = lock(session);
                        let step = s.on_request(req, &mesh.snapshot);
                        shared.metrics.account(&mut s);
                        step
                    };
                    match step {
                        Ok(step) => {
                            if step.subscribed > 0 {
                                shared
                                    .metrics
                                    .names_subscribed
                                    .get_or_create(&TypeLabel { type_url })
                                    .inc_by(step.subscribed);
                            }
                            if step.acked {
                                shared.metrics.acks.inc();
                            }
                            if step.nacked {
                                shared.metrics.nacks.inc();
                                let s = lock(session);
                                tracing::warn!(node = ?s.node_id(), "a client rejected resources (see /debug)");
                            }
                            step.responses
                        }
                        Err(e) => {
                            shared
                                .metrics
                                .requests_refused
                                .get_or_create(&ReasonLabel { reason: e.reason() })
                                .inc();
                            let node = lock(session).node_id().map(str::to_string);
                            tracing::warn!(?node, "xDS stream refused: {e}");
                            let _ = tx.send(Err(Status::invalid_argument(e.to_string()))).await;
                            return;
                        }
                    }
                }
                Ok(None) => return,
                Err(status) => {
                    if status.code() == tonic::Code::OutOfRange {
                        // Over MAX_REQUEST_BYTES: tell the client why its stream ends.
                        tracing::warn!("xDS request refused: {}", status.message());
                        shared
                            .metrics
                            .requests_refused
                            .get_or_create(&ReasonLabel { reason: "too_large" })
                            .inc();
                        let _ = tx.send(Err(status)).await;
                    } else {
                        tracing::debug!("xDS stream ended: {status}");
                    }
                    return;
                }
            },
            changed = mesh_rx.changed() => {
                if changed.is_err() {
                    return;
                }
                let mesh = mesh_rx.borrow_and_update().clone();
                let mut s = lock(session);
                let out = s.on_snapshot(&mesh.snapshot);
                shared.metrics.account(&mut s);
                out
            }
            _ = tx.closed() => return,
        };
        for r in responses {
            shared.metrics.pushes.inc();
            if tx.send(Ok(r)).await.is_err() {
                return;
            }
        }
    }
}
