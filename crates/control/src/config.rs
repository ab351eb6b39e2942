//! How the control server runs: its settings ([`ControlConfig`]), the limits it holds
//! every client to, the paths it serves, and why it cannot start ([`ControlError`]).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ambit_identity::{CaError, SpiffeId};
use ambit_manifests::ParseOptions;

use crate::mesh::MeshError;
use crate::session::SessionLimits;
use crate::tokens::TokensError;

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
pub(crate) const CA_BODY_DEADLINE: Duration = Duration::from_secs(10);
/// Responses queued for one client before its task waits for it to read.
pub(crate) const CLIENT_QUEUE: usize = 16;
/// Connections (beyond the xDS clients) that may be open at once: CA callers, handshakes.
pub(crate) const EXTRA_CONNECTIONS: usize = 64;
/// HTTP/2 streams (xDS streams and CA calls) one connection may have open at once.
pub(crate) const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// The gRPC paths served; anything else is refused before authentication matters.
pub(crate) const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
pub(crate) const CA_PATH: &str = "/istio.v1.auth.IstioCertificateService/CreateCertificate";
pub(crate) const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// Versions shown per type and client in `/debug`.
pub(crate) const DEBUG_MAX_VERSIONS: usize = 1000;

/// How to run the control server.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    pub mesh_dir: PathBuf,
    pub ca_dir: PathBuf,
    pub tokens_file: PathBuf,
    pub listen: SocketAddr,
    /// DNS names of the serving certificate.
    pub serving_names: Vec<String>,
    /// The server's own SPIFFE id, the one URI SAN of its serving certificate: waypoints
    /// verify this id, not a host name (default
    /// `spiffe://cluster.local/ns/istio-system/sa/ambit-control`, the chart's).
    pub identity: SpiffeId,
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

/// The chart's identity for the control server in `trust_domain` (an error names a trust
/// domain that cannot be in a SPIFFE id).
pub fn default_identity(trust_domain: &str) -> Result<SpiffeId, ambit_identity::SpiffeError> {
    SpiffeId::new(trust_domain, DEFAULT_NAMESPACE, DEFAULT_SERVICE_ACCOUNT)
}

/// Where the chart installs the control server, and its service account.
pub const DEFAULT_NAMESPACE: &str = "istio-system";
pub const DEFAULT_SERVICE_ACCOUNT: &str = "ambit-control";

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
            identity: default_identity("cluster.local").expect("cluster.local is a trust domain"),
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
    #[error("the serving certificate for {identity} from the mesh CA (CA_ADDRESS): {source}")]
    ServingFromCa {
        identity: String,
        source: ambit_identity::ManagerError,
    },
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
