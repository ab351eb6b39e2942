//! `ambit waypoint` wired together: its certificate, the mesh (a local file or delta
//! xDS), its policies (a watched file or directory of Kubernetes-shaped documents), the
//! HBONE listener with admission limits, the operator ports; then serving until SIGTERM,
//! SIGINT or `/quitquitquit`, and a bounded drain (GOAWAY, in-flight requests finish).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use ambit_admission::{Gate, Limits, ReportThrottle};
use ambit_caclient::RemoteIssuer;
use ambit_grpc::{ChannelConfig, GrpcChannel, RootCa, Token};
use ambit_hbone::{H2Settings, HboneError};
use ambit_identity::{CertManager, CertificateAuthority, SpiffeId};
use ambit_meshenv::ca::CaSource;
use ambit_runtime::drain::DrainWatcher;
use ambit_runtime::logging::LogHandle;
use ambit_runtime::readiness::{BlockReady, Ready};
use ambit_runtime::shared::Shared;
use ambit_state::ProxyState;
use ambit_waypoint_xds::{DocumentStore, WaypointAuthns, WaypointPolicies, WaypointRoutes};

use crate::authn::AuthnSet;
use crate::authz::PolicySet;
use crate::config::{Config, MeshSource};
use crate::metrics::Metrics;
use crate::routing::Routes;
use crate::upstream::Upstream;
use crate::Waypoint;

/// How often the local files are looked at for changes.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How often series of workloads that left the mesh are dropped.
const FORGET_EVERY: Duration = Duration::from_secs(60);

pub async fn run(cfg: Config, logs: Option<LogHandle>) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let identity = cfg.identity();
    let ready = Ready::default();
    let proxy_ready = ready.register("proxy");
    let state_ready = ready.register("state manager");
    let cert_ready = ready.register("certificate");

    let mut registry = Registry::default();
    registry.register_collector(Box::new(
        ambit_runtime::process_metrics::ProcessAndRuntime {
            runtime: tokio::runtime::Handle::current(),
        },
    ));
    let metrics = Metrics::register(&mut registry);
    let dry_run = Arc::new(ambit_telemetry::dry_run::DryRunMatches::register(
        &mut registry,
    ));
    let certs = cert_manager(&cfg)?;
    certs.register_metrics(&mut registry);
    let xds_metrics = ambit_xds::XdsMetrics::register(&mut registry);

    let state = Shared::new(ProxyState::new());
    let policies = Shared::new(PolicySet::default());
    let routes = Shared::new(Routes::default());
    let authns = Shared::new(AuthnSet::default());
    let jwks = Arc::new(jwks_cache()?);
    if let Some(path) = &cfg.policy_path {
        let loaded = load_config(path, None, None, &jwks);
        policies.replace(loaded.policies);
        routes.replace(loaded.routes);
        authns.replace(loaded.authns);
        spawn_config_watch(
            path.clone(),
            policies.clone(),
            routes.clone(),
            authns.clone(),
            jwks.clone(),
        );
    }
    start_mesh(
        &cfg,
        &state,
        (&policies, &routes, &authns, &jwks),
        xds_metrics,
        state_ready,
    )?;

    let wp = Arc::new(Waypoint {
        cfg: cfg.clone(),
        state: state.clone(),
        policies,
        authns,
        routes,
        mirrors: Arc::new(tokio::sync::Semaphore::new(crate::MAX_MIRRORS)),
        upstream: Upstream::new(certs.clone(), identity.clone(), cfg.instance_ip),
        retry_budgets: Arc::default(),
        metrics: metrics.clone(),
        dry_run,
        identity: identity.clone(),
        certs: certs.clone(),
    });

    let (shutdown_tx, mut shutdown_rx) = mpsc::channel::<()>(1);
    let (trigger, watcher) = ambit_runtime::drain::new();
    // Bind everything before serving anything, so a conflict fails start-up cleanly.
    let hbone = bind(cfg.hbone_addr, "HBONE").await?;
    let admin = bind(cfg.admin_addr, "admin").await?;
    let stats = bind(cfg.stats_addr, "metrics").await?;
    let readiness = bind(cfg.readiness_addr, "readiness").await?;
    tracing::info!(
        identity = %identity,
        hbone = %cfg.hbone_addr,
        admin = %cfg.admin_addr,
        stats = %cfg.stats_addr,
        readiness = %cfg.readiness_addr,
        "waypoint listening"
    );
    let registry = Arc::new(registry);
    tokio::spawn(ambit_runtime::http::serve(
        admin,
        crate::admin::admin_handler(wp.clone(), certs.clone(), logs, shutdown_tx),
        watcher.clone(),
    ));
    tokio::spawn(ambit_runtime::http::serve(
        stats,
        ambit_runtime::operator::metrics_handler(registry),
        watcher.clone(),
    ));
    // Readiness keeps answering during the drain, so it gets no watcher of its own.
    let (_readiness_trigger, readiness_watcher) = ambit_runtime::drain::new();
    tokio::spawn(ambit_runtime::http::serve(
        readiness,
        ambit_runtime::operator::readiness_handler(ready.clone()),
        readiness_watcher,
    ));
    let renewal = certs.spawn_renewal();
    {
        let (certs, identity) = (certs.clone(), identity.clone());
        tokio::spawn(async move {
            match certs.fetch(&identity).await {
                Ok(_) => drop(cert_ready),
                Err(e) => tracing::error!("no certificate for {identity}: {e}"),
            }
        });
    }
    {
        let (metrics, state) = (metrics.clone(), state.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(FORGET_EVERY);
            loop {
                tick.tick().await;
                let s = state.get();
                metrics.forget_gone(|ns, name| {
                    s.workloads()
                        .any(|w| w.namespace == ns && w.workload_name == name)
                });
            }
        });
    }
    let gate = Gate::new(Limits::quarter_per_source(cfg.max_handshakes));
    let server = tokio::spawn(serve_hbone(wp.clone(), hbone, gate, watcher.clone()));
    drop(watcher);
    drop(proxy_ready);

    ambit_runtime::drain::shutdown_requested(&mut shutdown_rx).await;
    tracing::info!(deadline = ?cfg.drain_deadline, "draining: GOAWAY sent, in-flight requests may finish");
    if !trigger.drain(cfg.drain_deadline).await {
        tracing::warn!("drain deadline passed: closed the remaining connections");
    }
    renewal.abort();
    let _ = server.await;
    tracing::info!("shutdown complete");
    Ok(())
}

async fn bind(addr: std::net::SocketAddr, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({what})"))
}

/// The certificate manager for the configured issuer: the CA at `CA_ADDRESS` (istiod or
/// `ambit control`), a local CA directory, or an ephemeral root for a one-machine mesh.
fn cert_manager(cfg: &Config) -> anyhow::Result<Arc<CertManager>> {
    match &cfg.ca {
        CaSource::Remote(remote) => {
            let channel = GrpcChannel::new(ChannelConfig {
                address: remote.address.clone(),
                root: RootCa::from_env_value(remote.root.as_deref()),
                alt_hostname: remote.alt_hostname.clone(),
                token: Token::from_env_value(remote.token.as_deref()),
                cluster_id: cfg.cluster_id.clone(),
                headers: remote.headers.clone(),
            })
            .with_context(|| {
                format!(
                    "the CA channel to {} (CA_ADDRESS, CA_ROOT_CA, AUTH_TOKEN)",
                    remote.address
                )
            })?;
            let issuer = RemoteIssuer::new(channel, remote.address.clone(), false);
            Ok(CertManager::with_issuer(
                Arc::new(issuer),
                cfg.secret_ttl,
                Arc::new(SystemTime::now),
            ))
        }
        CaSource::LocalDir(dir) => {
            let ca = CertificateAuthority::from_plugin_dir(dir)
                .with_context(|| format!("LOCAL_CA_DIR={}", dir.display()))?;
            Ok(CertManager::new(Arc::new(ca), cfg.secret_ttl))
        }
        CaSource::Ephemeral => {
            tracing::warn!(
                "neither CA_ADDRESS nor LOCAL_CA_DIR is set: an ephemeral root CA for trust \
                 domain {}; only peers that share it can reach this waypoint",
                cfg.trust_domain
            );
            let ca = CertificateAuthority::ephemeral(&cfg.trust_domain)?;
            Ok(CertManager::new(Arc::new(ca), cfg.secret_ttl))
        }
    }
}

/// The mesh state: ztunnel's local config file (re-read when it changes; a bad file keeps
/// the last good state) or delta xDS. Over xDS, without a local policy path, the policies
/// come from the control plane too (ambit's own type, `ambit.waypoint.v1.AuthorizationPolicy`,
/// which `ambit control` serves).
fn start_mesh(
    cfg: &Arc<Config>,
    state: &Shared<ProxyState>,
    (policies, routes, authns, jwks): (
        &Shared<PolicySet>,
        &Shared<Routes>,
        &Shared<AuthnSet>,
        &Arc<ambit_jwt::JwksCache>,
    ),
    metrics: ambit_xds::XdsMetrics,
    ready: BlockReady,
) -> anyhow::Result<()> {
    match &cfg.mesh {
        MeshSource::File(path) => {
            let first = read_mesh(path)?;
            state.replace(first);
            drop(ready);
            spawn_mesh_watch(path.clone(), state.clone());
            Ok(())
        }
        MeshSource::Xds(xds) => {
            let channel = GrpcChannel::new(xds.channel.clone())
                .with_context(|| format!("XDS_ADDRESS={}", xds.channel.address))?;
            tracing::info!(address = %xds.channel.address, node = %xds.node.node_id(), "xDS: connecting to the control plane");
            let limits = ambit_xds::Limits::default();
            let mut delta = ambit_xds::DeltaClient::subscribing(xds.node.to_node(), limits)
                .subscribe(ambit_xds::Addresses {
                    budget: limits.max_held_addresses,
                });
            let from_xds = cfg.policy_path.is_none();
            if from_xds {
                delta = delta
                    .subscribe(WaypointPolicies::default())
                    .subscribe(WaypointRoutes::default())
                    .subscribe(WaypointAuthns::default());
            }
            let client = ambit_xds::XdsClient::new(channel, delta)
                .with_metrics(metrics)
                .on_ready(move || drop(ready));
            let (mesh, policies, routes) = (state.clone(), policies.clone(), routes.clone());
            let (authns, jwks) = (authns.clone(), jwks.clone());
            let mut held = DocumentStore::default();
            let mut held_routes = DocumentStore::default();
            let mut held_authns = DocumentStore::default();
            tokio::spawn(client.run(move |batch| {
                let batch = match batch.downcast::<WaypointPolicies>() {
                    Ok(typed) => {
                        typed.apply(&mut held);
                        return policies.replace(PolicySet::new(held.to_vec(), None));
                    }
                    Err(other) => other,
                };
                let batch = match batch.downcast::<WaypointRoutes>() {
                    Ok(typed) => {
                        typed.apply(&mut held_routes);
                        return routes.replace(Routes {
                            table: ambit_routes::RouteTable::new(held_routes.to_vec()),
                            ..Routes::default()
                        });
                    }
                    Err(other) => other,
                };
                match batch.downcast::<WaypointAuthns>() {
                    Ok(typed) => {
                        typed.apply(&mut held_authns);
                        let all = held_authns.to_vec().iter().map(|a| (**a).clone()).collect();
                        authns.replace(AuthnSet::new(all, &jwks));
                    }
                    Err(batch) => mesh.update(|s| batch.apply(s)),
                }
            }));
            Ok(())
        }
    }
}

fn read_mesh(path: &Path) -> anyhow::Result<ProxyState> {
    let yaml = std::fs::read_to_string(path)
        .with_context(|| format!("LOCAL_XDS_PATH: cannot read {}", path.display()))?;
    let name = path.display().to_string();
    let load = ambit_state::load_local_config(&name, &yaml, None)?;
    for r in &load.rejected {
        tracing::warn!(policy = %r.key, "{name}: policy refused: {}", r.error);
    }
    Ok(ProxyState::from_config(load.config)?)
}

fn modified(path: &Path) -> Option<SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_dir() {
        // A directory changes when any file in it does.
        std::fs::read_dir(path)
            .ok()?
            .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
            .max()
            .max(meta.modified().ok())
    } else {
        meta.modified().ok()
    }
}

/// Calls `changed` whenever `path` (a file, or any file of a directory) changes: on the
/// kernel's notification, or at the latest on the next poll.
fn spawn_watch(path: PathBuf, mut changed: impl FnMut(&Path) + Send + 'static) {
    tokio::spawn(async move {
        let mut watch = ambit_runtime::file_watch::FileWatch::new(&path, WATCH_EVERY);
        let mut last = modified(&path);
        loop {
            watch.changed().await;
            let now = modified(&path);
            if now != last {
                last = now;
                changed(&path);
            }
        }
    });
}

fn spawn_mesh_watch(path: PathBuf, state: Shared<ProxyState>) {
    spawn_watch(path, move |path| match read_mesh(path) {
        Ok(s) => {
            state.replace(s);
            tracing::info!(path = %path.display(), "mesh reloaded");
        }
        Err(e) => tracing::error!("{e:#}; keeping the last good mesh"),
    });
}

/// Reads the policy and route documents after `previous`: each bad one is reported with
/// its file, line and field and stands at its last good version; a bad policy without
/// one fails closed ([`crate::policies::merge`], [`crate::routing::merge_routes`]).
pub fn load_config(
    path: &Path,
    previous: Option<&PolicySet>,
    previous_routes: Option<&Routes>,
    jwks: &ambit_jwt::JwksCache,
) -> Loaded {
    let mut parsed = ambit_manifests::load_path(path, &ambit_manifests::ParseOptions::default());
    for e in &parsed.errors {
        tracing::error!("document refused: {e}");
    }
    for s in &parsed.skipped {
        tracing::info!(
            "{}:{}: not for a waypoint, skipped: {:?}",
            s.origin.source,
            s.origin.line,
            s.value.reason
        );
    }
    let refused = parsed.errors.len();
    let routes = std::mem::take(&mut parsed.routes)
        .into_iter()
        .map(|r| r.value)
        .collect();
    let routes = crate::routing::merge_routes(routes, &parsed.errors, previous_routes);
    for key in &routes.kept {
        tracing::warn!(route = %key, "a refused version: the last good one stays");
    }
    let authns = AuthnSet::new(
        std::mem::take(&mut parsed.authns)
            .into_iter()
            .map(|a| a.value)
            .collect(),
        jwks,
    );
    let (set, outcome) = crate::policies::merge(parsed, previous);
    for key in &outcome.kept {
        tracing::warn!(policy = %key, "a refused version: the last good one stays");
    }
    if let Some(why) = &outcome.fail_closed {
        tracing::error!("every request is denied until the policies are fixed: {why}");
    }
    tracing::info!(
        path = %path.display(),
        policies = set.policies.len(),
        routes = routes.table.routes().len(),
        request_authentications = authns.authns().count(),
        refused,
        fail_closed = set.fail_closed.is_some(),
        "policies, routes and request authentications loaded"
    );
    Loaded {
        policies: set,
        routes,
        authns,
    }
}

/// What a load of the config comes to.
pub struct Loaded {
    pub policies: PolicySet,
    pub routes: Routes,
    pub authns: AuthnSet,
}

/// The JWKS fetcher, trusting the system's roots (as istiod fetches a `jwksUri`); without
/// any, an `https` key set cannot be fetched and its tokens are refused.
fn jwks_cache() -> anyhow::Result<ambit_jwt::JwksCache> {
    let config = ambit_jwt::FetchConfig::with_system_roots()
        .or_else(|e| {
            tracing::warn!("{e}: a jwksUri over https cannot be fetched (its tokens are refused)");
            ambit_jwt::FetchConfig::new(rustls::RootCertStore::empty())
        })
        .context("setting up the JWKS fetcher")?;
    Ok(ambit_jwt::JwksCache::new(config))
}

fn spawn_config_watch(
    path: PathBuf,
    policies: Shared<PolicySet>,
    routes: Shared<Routes>,
    authns: Shared<AuthnSet>,
    jwks: Arc<ambit_jwt::JwksCache>,
) {
    spawn_watch(path, move |path| {
        let (previous, previous_routes) = (policies.get(), routes.get());
        let loaded = load_config(path, Some(&previous), Some(&previous_routes), &jwks);
        // Each request reads each once, at its start: one in flight keeps the versions
        // it began with.
        routes.replace(loaded.routes);
        authns.replace(loaded.authns);
        policies.replace(loaded.policies);
    });
}

/// Accepts HBONE connections within the admission gate until the drain starts.
async fn serve_hbone(
    wp: Arc<Waypoint>,
    listener: tokio::net::TcpListener,
    gate: Arc<Gate>,
    drain: DrainWatcher,
) {
    let reports = ReportThrottle::default();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = drain.draining() => return,
            a = ambit_admission::accept(&listener, &gate, &reports, "HBONE port") => a,
        };
        tokio::spawn(serve_connection(wp.clone(), accepted, drain.clone()));
    }
}

async fn serve_connection(
    wp: Arc<Waypoint>,
    accepted: ambit_admission::Accepted,
    drain: DrainWatcher,
) {
    let ambit_admission::Accepted {
        stream,
        peer,
        ticket,
    } = accepted;
    let identity = wp.identity.clone();
    let certs = wp.certs.clone();
    let server_config = async move {
        match certs.server_config(&identity).await {
            Ok(tls) => Some(tls),
            Err(e) => {
                tracing::warn!(%peer, "HBONE connection refused: no certificate for {identity}: {e}");
                None
            }
        }
    };
    let progress = |step| {
        ticket.advance(match step {
            ambit_hbone::HandshakeStep::ClientHello => 1,
            ambit_hbone::HandshakeStep::Tls => 2,
        })
    };
    let handshake =
        ambit_hbone::accept_connection_reporting(stream, server_config, hbone_settings(), progress);
    let accepted = tokio::select! {
        r = handshake => r,
        _ = ticket.evicted() => return,
        _ = drain.forced() => return,
    };
    // Through TLS and the HTTP/2 preface: no longer a handshake holding a place.
    drop(ticket);
    let accepted = match accepted {
        Ok(Some(a)) => a,
        Ok(None) => return,
        Err(
            e @ (HboneError::Tls(_)
            | HboneError::HandshakeTimeout(_)
            | HboneError::NoClientCertificate),
        ) => return tracing::info!(%peer, "HBONE handshake failed: {e}"),
        Err(e) => return tracing::debug!(%peer, "HBONE connection ended: {e}"),
    };
    let peer_identity: Option<SpiffeId> =
        ambit_identity::tls::peer_identity(Some(&accepted.peer().certificates));
    let handler = {
        let (wp, drain) = (wp.clone(), drain.clone());
        move |incoming| {
            crate::tunnel::handle(wp.clone(), incoming, peer_identity.clone(), drain.clone())
        }
    };
    let started = Instant::now();
    tokio::select! {
        r = accepted.serve(drain.draining_signal(), handler) => {
            if let Err(e) = r {
                tracing::debug!(%peer, after = ?started.elapsed(), "HBONE connection ended: {e}");
            }
        }
        _ = drain.forced() => {}
    }
}

/// Streams one HBONE connection may have open at once: 100, as Istio's Envoy waypoint
/// advertises on its CONNECT listener (ztunnel's own server allows 200). A client's node
/// proxy pools 100 streams a connection and opens another past that, so a busy client
/// spreads over connections, and so over the waypoint's workers, instead of queueing
/// on one.
pub const HBONE_MAX_STREAMS: u32 = 100;

/// The HTTP/2 settings of the HBONE listener: the node proxy's, with
/// [`HBONE_MAX_STREAMS`].
pub fn hbone_settings() -> H2Settings {
    H2Settings {
        max_concurrent_streams: HBONE_MAX_STREAMS,
        ..H2Settings::default()
    }
}
