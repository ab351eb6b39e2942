//! The L7 waypoint, `ambit waypoint` (also the multi-call name `waypoint`): what a service
//! or namespace opts into for HTTP-aware policy and telemetry in ambient mode. Any ztunnel
//! (ambit's or Istio's) sends it traffic unchanged.
//!
//! - [`config`]: Istio's environment (`POD_NAMESPACE`, `SERVICE_ACCOUNT`, `XDS_ADDRESS`, …);
//! - [`run`]: the process: certificates, mesh state, policies, the HBONE listener on 15008
//!   with the node proxy's admission limits, the operator ports, the drain;
//! - [`tunnel`]: one CONNECT: [`front`] decides whether this waypoint serves its authority,
//!   then the port's protocol (or the first bytes) decides between [`http`] and [`tcp`];
//!   [`downstream`] is what every request of the tunnel shares;
//! - [`policies`]: what a policy load comes to, failing closed on a refused document;
//! - [`authn`]: RequestAuthentication's JWT rules that apply to a request (decided by
//!   `ambit_jwt`: 401 for a bad token, the identity to authorization for a good one);
//! - [`request_plan`]: what the HTTPRoutes and GRPCRoutes attached to the dialled Service make
//!   of a request (404, 500, a redirect, or a backend with filters, timeouts and
//!   retries); [`replay`]: request bodies kept for retries and fed to mirrors;
//! - [`head`]: what a request head becomes before any decision (one authority, no
//!   hop-by-hop or forged identity header, only an allowed upgrade);
//! - [`http`]: HTTP/1.1 and HTTP/2 requests, each normalised, authorized ([`authz`]),
//!   balanced on its own ([`balance`]) and sent on a pooled onward connection
//!   ([`upstream`]);
//! - [`metrics`]: Istio's request and TCP metrics with `reporter="waypoint"`, and
//!   [`access`]: the access log;
//! - [`admin`]: `/config_dump` on localhost, with [`route_status`]: the routes each
//!   Service and port uses, in evaluation order, and those refused and why.
#![forbid(unsafe_code)]

pub mod access;
pub mod admin;
pub mod authn;
pub mod authz;
pub mod balance;
pub mod balancing;
pub mod config;
pub mod destination_rules;
pub mod downstream;
pub mod exchange;
pub mod front;
pub mod head;
pub mod http;
pub mod istio_pod;
pub mod local_reply;
pub mod metrics;
pub mod policies;
pub mod replay;
pub mod request_plan;
pub mod resolver;
pub mod retry_budget;
pub mod route_status;
pub mod run;
pub mod tcp;
pub mod tls_origin;
pub mod tunnel;
pub mod upstream;
pub mod workers;

use std::process::ExitCode;
use std::sync::Arc;

use ambit_identity::SpiffeId;
use ambit_runtime::shared::Shared;
use ambit_state::{ProxyState, Workload};
use ambit_telemetry::dry_run::DryRunMatches;

use crate::authz::PolicySet;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::upstream::Upstream;

/// Istio's root namespace (MeshConfig `rootNamespace`'s default).
pub const ROOT_NAMESPACE: &str = "istio-system";

/// The most mirrored requests in flight at once.
pub const MAX_MIRRORS: usize = 256;

/// What every stream and request of the running waypoint reads.
pub struct Waypoint {
    pub cfg: Arc<Config>,
    pub state: Shared<ProxyState>,
    pub policies: Shared<PolicySet>,
    /// RequestAuthentications (JWT rules) attached to this waypoint or its Services.
    pub authns: Shared<authn::AuthnSet>,
    /// HTTPRoutes and GRPCRoutes attached to the Services this waypoint fronts.
    pub routes: Shared<request_plan::Routes>,
    /// DestinationRules, and the state of the destinations they apply to.
    pub destination_rules: Shared<destination_rules::DestinationRules>,
    pub balancers: Arc<balancing::Balancers>,
    /// Resolves endpoints known by hostname; `None` when the resolv.conf is unusable
    /// (then those endpoints are never chosen).
    pub resolver: Option<Arc<resolver::HostResolver>>,
    /// Mirrored requests in flight: past the bound, a mirror is skipped.
    pub mirrors: Arc<tokio::sync::Semaphore>,
    /// The onward connection pools: one per worker thread ([`workers`]), so a request
    /// uses connections driven on its own thread, and the last for any other thread.
    pub upstreams: Vec<Arc<Upstream>>,
    /// Requests and retries in flight per destination: the retry budget.
    pub retry_budgets: Arc<retry_budget::Budgets>,
    pub metrics: Metrics,
    pub dry_run: Arc<DryRunMatches>,
    pub identity: SpiffeId,
    pub certs: Arc<ambit_identity::CertManager>,
    /// This waypoint's Gateway (`POD_NAMESPACE`/`GATEWAY_NAME`), for the routes attached
    /// to it.
    pub gateway: Arc<ambit_gateway_routes::ServiceKey>,
}

impl std::fmt::Debug for Waypoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waypoint")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl Waypoint {
    /// The onward connection pool of the calling thread.
    pub fn upstream(&self) -> &Arc<Upstream> {
        let last = self.upstreams.len() - 1;
        &self.upstreams[workers::current().map_or(last, |w| w.min(last))]
    }

    /// The DestinationRule balancer of `target`, if a rule applies to it.
    pub fn balancer_for(&self, target: &front::Fronted) -> Option<Arc<balancing::Balancer>> {
        let rules = self.destination_rules.get();
        let viewer = destination_rules::Viewer {
            namespace: &self.cfg.namespace,
            root_namespace: ROOT_NAMESPACE,
            cluster_domain: &self.cfg.cluster_domain,
        };
        self.balancers.for_target(&rules, viewer, target)
    }

    /// This waypoint's own workload in the mesh state (by namespace, pod name and
    /// service account), if it has arrived.
    pub fn me(&self, state: &ProxyState) -> Option<Arc<Workload>> {
        state.find_local_workload(
            &self.cfg.namespace,
            &self.cfg.pod_name,
            &self.cfg.service_account,
            None,
        )
    }
}

/// `ambit waypoint`: reads the environment, then serves until told to stop. Exit status
/// 2 for a configuration that does not hold, 1 for a failure while running.
pub fn main() -> ExitCode {
    let (logs, _flush_logs) = match ambit_runtime::logging::init() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("ambit waypoint: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = match Config::from_process_env() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("invalid configuration: {e}");
            eprintln!("ambit waypoint: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    // The control plane, accepting and the operator ports: the data path runs on
    // `AMBIT_WORKER_THREADS` workers of its own ([`workers`]).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ambit-waypoint-main")
        .worker_threads(1)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ambit waypoint: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run::run(cfg, Some(logs))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ambit waypoint: {e:#}");
            ExitCode::FAILURE
        }
    }
}
