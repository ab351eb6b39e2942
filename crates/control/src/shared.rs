//! What every part of the control server shares: the mesh being served, the clients, the
//! tokens, the reload status and the metrics.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use ambit_identity::CertificateAuthority;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::{watch, Semaphore};

use crate::config::ControlConfig;
use crate::mesh::Mesh;
use crate::session::{Session, Snapshot};
use crate::tokens::Tokens;

pub(crate) struct MeshState {
    pub(crate) mesh: Mesh,
    pub(crate) snapshot: Snapshot,
}

#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct ReloadStatus {
    /// The error of the newest mesh files, while they are refused (the last good mesh is
    /// served meanwhile).
    pub(crate) mesh_error: Option<String>,
    pub(crate) tokens_error: Option<String>,
}

pub(crate) struct Metrics {
    pub(crate) registry: Registry,
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
    /// `--kubernetes`: streams refused because the token's service account runs no
    /// waypoint.
    pub(crate) not_a_waypoint: Counter,
    /// `--kubernetes`: object versions refused by the readers.
    pub(crate) objects_refused: Counter,
    /// `--kubernetes`: Events about refusals that could not be written (or were dropped
    /// because too many were waiting).
    pub(crate) events_failed: Counter,
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
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ambit_control");
        let m = Metrics {
            // With the process's own metrics, as every ambit process reports them.
            registry: ambit_process::lifecycle::registry(),
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
            not_a_waypoint: Counter::default(),
            objects_refused: Counter::default(),
            events_failed: Counter::default(),
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
        registry.register(
            "xds_not_a_waypoint",
            "Streams refused (--kubernetes) because the token's service account runs no waypoint Gateway",
            m.not_a_waypoint.clone(),
        );
        registry.register(
            "kubernetes_objects_refused",
            "Object versions read from the API server (--kubernetes) and refused; a refused version's last accepted one stays",
            m.objects_refused.clone(),
        );
        registry.register(
            "kubernetes_events_failed",
            "Warning Events about refused objects not written (the API server refused them, or too many were waiting)",
            m.events_failed.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Counts what `session` did since it was last accounted: its high-water mark of
    /// names (a refused request's names included) and the names it looked at.
    pub(crate) fn account(&self, session: &mut Session) {
        let most = i64::try_from(session.most_names()).unwrap_or(i64::MAX);
        self.most_names.inner().fetch_max(most, Ordering::Relaxed);
        self.names_examined.inc_by(session.take_names_examined());
    }
}

pub(crate) struct ClientEntry {
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) session: Arc<Mutex<Session>>,
}

pub(crate) struct Shared {
    pub(crate) config: ControlConfig,
    /// The CA (none with `--kubernetes`: istiod signs).
    pub(crate) ca: Option<CertificateAuthority>,
    /// `--kubernetes`: who may follow, and whether the watches have listed once.
    pub(crate) kube: Option<Arc<crate::kubernetes::KubeShared>>,
    pub(crate) mesh_tx: watch::Sender<Arc<MeshState>>,
    pub(crate) tokens: RwLock<Arc<Tokens>>,
    pub(crate) status: Mutex<ReloadStatus>,
    pub(crate) clients: Mutex<BTreeMap<u64, ClientEntry>>,
    pub(crate) next_session: AtomicU64,
    pub(crate) metrics: Metrics,
    pub(crate) client_slots: Arc<Semaphore>,
    pub(crate) listening: AtomicBool,
    pub(crate) refusal_reports: ambit_admission::ReportThrottle,
}

/// Locks a mutex, taking the data of a poisoned one (every critical section here leaves
/// the data consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// The state of a server about to listen: an empty mesh, no client, no reload error.
    pub(crate) fn new(
        config: ControlConfig,
        ca: Option<CertificateAuthority>,
        kube: Option<Arc<crate::kubernetes::KubeShared>>,
        tokens: Tokens,
    ) -> Shared {
        let (mesh_tx, _) = watch::channel(Arc::new(MeshState {
            mesh: Mesh::default(),
            snapshot: crate::session::Snapshot::new(0),
        }));
        Shared {
            client_slots: Arc::new(Semaphore::new(config.max_clients)),
            config,
            ca,
            kube,
            mesh_tx,
            tokens: RwLock::new(Arc::new(tokens)),
            status: Mutex::new(ReloadStatus::default()),
            clients: Mutex::new(BTreeMap::new()),
            next_session: AtomicU64::new(1),
            metrics: Metrics::new(),
            listening: AtomicBool::new(false),
            refusal_reports: Default::default(),
        }
    }

    /// What one connection and one source may hold, from the configuration.
    pub(crate) fn serve_options(&self) -> ambit_grpc::server::ServeOptions {
        ambit_grpc::server::ServeOptions {
            connections: ambit_admission::Limits {
                total: self.config.max_clients + crate::config::EXTRA_CONNECTIONS,
                per_source: self.config.max_per_source,
            },
            auth_timeout: self.config.auth_timeout,
            idle_timeout: self.config.idle_timeout,
            // One connection may carry many xDS streams (tests, proxies multiplexing) but
            // not an unbounded number of calls.
            max_streams_per_connection: crate::config::MAX_STREAMS_PER_CONNECTION,
            max_streams_per_source: self.config.max_per_source,
            ..ambit_grpc::server::ServeOptions::default()
        }
    }

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
    pub(crate) fn set_tokens(&self, tokens: Tokens, error: Option<String>) {
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tokens);
        lock(&self.status).tokens_error = error;
    }

    pub(crate) fn publish(&self, mesh: Mesh) {
        self.publish_as(mesh, false)
    }

    /// [`Shared::publish`]; with `views_changed` (what some clients may be shown changed),
    /// every session compares everything instead of the resources that changed.
    pub(crate) fn publish_as(&self, mesh: Mesh, views_changed: bool) {
        let previous = self.mesh_tx.borrow().clone();
        let generation = previous.snapshot.generation + 1;
        // What changed is worked out here once, not by every session.
        let snapshot = mesh.snapshot(generation);
        let snapshot = if views_changed {
            snapshot.without_changes()
        } else {
            snapshot.with_changes_from(&previous.snapshot)
        };
        drop(previous);
        self.metrics.mesh_generation.set(generation as i64);
        self.metrics.mesh_resources.set(snapshot.len() as i64);
        tracing::info!(
            generation,
            resources = snapshot.len(),
            files = mesh.files.len(),
            waypoint_policies = mesh.waypoint_resources.len(),
            routes = mesh.route_resources.len(),
            request_authentications = mesh.authn_resources.len(),
            "serving the mesh"
        );
        // With `--kubernetes` a skipped object was reported when it arrived.
        if self.kube.is_none() {
            for skipped in &mesh.skipped {
                tracing::info!("not served: {skipped}");
            }
        }
        // With `--kubernetes` there are no workloads or Services here to check routes
        // against: each waypoint reports its routes' status from its own mesh.
        if self.kube.is_none() {
            for line in mesh.route_status() {
                tracing::warn!("route: {line}");
            }
        }
        self.mesh_tx
            .send_replace(Arc::new(MeshState { mesh, snapshot }));
    }
}

/// Resolves once shutdown is asked for (or the control server is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
