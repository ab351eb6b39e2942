//! `ambit waypoint` wired together from the process kit (`ambit-process`): its
//! certificate, the mesh (the local mesh file or delta xDS), its policies (a watched file
//! or directory of Kubernetes-shaped documents), the HBONE listener with admission limits,
//! the operator ports; then serving until SIGTERM, SIGINT or `/quitquitquit`, and a bounded
//! drain (GOAWAY, in-flight requests finish).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use prometheus_client::registry::Registry;

use ambit_admission::{Gate, Limits, ReportThrottle};
use ambit_grpc::GrpcChannel;
use ambit_hbone::{H2Settings, HboneError};
use ambit_identity::SpiffeId;
use ambit_process::certs::CertSettings;
use ambit_process::lifecycle::Lifecycle;
use ambit_process::mesh_file::{self, LocalConfigSource};
use ambit_process::operator::{OperatorAddrs, OperatorPorts};
use ambit_runtime::drain::DrainWatcher;
use ambit_runtime::file_watch::Watched;
use ambit_runtime::logging::LogHandle;
use ambit_runtime::readiness::{BlockReady, Ready};
use ambit_runtime::shared::Shared;
use ambit_state::ProxyState;
use ambit_waypoint_xds::{
    DocumentStore, WaypointAuthns, WaypointDestinationRules, WaypointPolicies, WaypointRoutes,
};

use crate::authn::AuthnSet;
use crate::authz::PolicySet;
use crate::config::{Config, L7Source, MeshSource};
use crate::destination_rules::DestinationRules;
use crate::metrics::Metrics;
use crate::request_plan::Routes;
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
    let l7_ready = ready.register("L7 configuration");

    let mut registry = ambit_process::lifecycle::registry();
    let metrics = Metrics::register(&mut registry);
    let dry_run = Arc::new(ambit_telemetry::dry_run::DryRunMatches::register(
        &mut registry,
    ));
    let certs = ambit_process::certs::cert_manager(&CertSettings {
        source: &cfg.ca,
        trust_domain: &cfg.trust_domain,
        cluster_id: &cfg.cluster_id,
        secret_ttl: cfg.secret_ttl,
        impersonate: false,
    })?;
    certs.register_metrics(&mut registry);
    let xds_metrics = ambit_xds::XdsMetrics::register(&mut registry);

    let state = Shared::new(ProxyState::new());
    let policies = Shared::new(PolicySet::default());
    let routes = Shared::new(Routes::default());
    let authns = Shared::new(AuthnSet::default());
    let destination_rules = Shared::new(DestinationRules::default());
    let balancers = Arc::new(crate::balancing::Balancers::default());
    let resolver = match crate::resolver::HostResolver::from_resolv_conf(&cfg.resolv_conf) {
        Ok(r) => {
            r.register(&mut registry);
            Some(Arc::new(r))
        }
        Err(e) => {
            tracing::warn!(
                "{e}: endpoints known by hostname (ServiceEntry resolution DNS) are not reachable"
            );
            None
        }
    };
    let jwks = Arc::new(jwks_cache()?);
    let l7 = L7Sinks {
        policies: policies.clone(),
        routes: routes.clone(),
        authns: authns.clone(),
        destination_rules: destination_rules.clone(),
        balancers: balancers.clone(),
        jwks: jwks.clone(),
    };
    start_l7(&cfg, l7, xds_metrics.clone(), l7_ready)?;
    start_mesh(&cfg, &state, xds_metrics, state_ready, &mut registry)?;

    let workers = Arc::new(
        crate::workers::Workers::start(cfg.worker_threads)
            .context("cannot start the worker threads")?,
    );
    let wp = Arc::new(Waypoint {
        cfg: cfg.clone(),
        state: state.clone(),
        policies,
        authns,
        routes,
        destination_rules,
        balancers,
        resolver,
        mirrors: Arc::new(tokio::sync::Semaphore::new(crate::MAX_MIRRORS)),
        upstreams: (0..=workers.count())
            .map(|_| Upstream::new(certs.clone(), identity.clone(), cfg.instance_ip))
            .collect(),
        retry_budgets: Arc::default(),
        metrics: metrics.clone(),
        dry_run,
        identity: identity.clone(),
        certs: certs.clone(),
        gateway: Arc::new(ambit_gateway_routes::ServiceKey::new(
            cfg.namespace.clone(),
            cfg.gateway.clone(),
        )),
    });

    let mut lifecycle = Lifecycle::default();
    let watcher = lifecycle.drain.clone();
    // Bind everything before serving anything, so a conflict fails start-up cleanly.
    let hbone = ambit_process::operator::reserve(cfg.hbone_addr, "HBONE")?;
    let operator = OperatorPorts::bind(&OperatorAddrs {
        admin: cfg.admin_addr,
        admin_ipv6_twin: false,
        stats: cfg.stats_addr,
        readiness: cfg.readiness_addr,
    })
    .await?;
    tracing::info!(
        identity = %identity,
        hbone = %cfg.hbone_addr,
        admin = %cfg.admin_addr,
        stats = %cfg.stats_addr,
        readiness = %cfg.readiness_addr,
        "waypoint listening"
    );
    operator.serve(
        crate::admin::admin_handler(wp.clone(), certs.clone(), logs, lifecycle.quit.clone()),
        Arc::new(registry),
        ready.clone(),
        &watcher,
    );
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
    // Nothing is served before the workloads, the certificate and a first L7 snapshot are
    // held: a waypoint without its policies would let every request through.
    let server = {
        let (wp, ready, drain) = (wp.clone(), ready.clone(), watcher.clone());
        let data_path = workers.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = ready.until_only(&["proxy"]) => {}
                _ = drain.draining() => return,
            }
            let hbone = match hbone.listen() {
                Ok(listener) => listener,
                Err(e) => return tracing::error!("HBONE: {e:#}"),
            };
            drop(proxy_ready);
            tracing::info!("ready: serving HBONE");
            serve_hbone(wp, hbone, gate, data_path, drain).await
        })
    };
    drop(watcher);

    lifecycle.shutdown_requested().await;
    lifecycle
        .drain(
            cfg.drain_deadline,
            "GOAWAY sent, in-flight requests may finish",
        )
        .await;
    renewal.abort();
    let _ = server.await;
    // Only now: what the workers still run was drained, or is past its deadline.
    drop(workers);
    tracing::info!("shutdown complete");
    Ok(())
}

/// The mesh state: ztunnel's local config file (re-read when it changes; a bad file keeps
/// the last good state) or delta xDS, subscribed to `istio.workload.Address` only. Nothing
/// of ambit's goes on that stream: it may be istiod's.
fn start_mesh(
    cfg: &Arc<Config>,
    state: &Shared<ProxyState>,
    metrics: ambit_xds::XdsMetrics,
    ready: BlockReady,
    registry: &mut Registry,
) -> anyhow::Result<()> {
    match &cfg.mesh {
        MeshSource::File(path) => {
            // As the node proxy takes its file: a refused policy keeps its last good
            // version on every reload.
            let source = LocalConfigSource::File(path.clone());
            let loaded = mesh_file::load_at_start(&source)?;
            state.replace(loaded.state);
            drop(ready);
            let report = mesh_file::PolicyReport::default();
            report.set_rejected(&loaded.rejected);
            mesh_file::register_metrics(registry, state.clone(), report.clone());
            mesh_file::spawn_watch(path.clone(), state.clone(), Arc::new(loaded.file), report);
            Ok(())
        }
        MeshSource::Xds(xds) => {
            let channel = GrpcChannel::new(xds.channel.clone())
                .with_context(|| format!("XDS_ADDRESS={}", xds.channel.address))?;
            tracing::info!(address = %xds.channel.address, node = %xds.node.node_id(), "xDS: connecting to the control plane for workloads");
            let limits = ambit_xds::Limits::default();
            let delta = ambit_xds::DeltaClient::subscribing(xds.node.to_node(), limits).subscribe(
                ambit_xds::Addresses {
                    budget: limits.max_held_addresses,
                },
            );
            let client = ambit_xds::XdsClient::new(channel, delta)
                .with_metrics(metrics)
                .on_ready(move || {
                    drop(ready);
                    // What decoding the initial sync used goes back to the system.
                    ambit_runtime::memory::release_freed();
                });
            let mesh = state.clone();
            tokio::spawn(client.run(move |batch| mesh.update(|s| batch.apply(s))));
            Ok(())
        }
    }
}

/// Where the L7 configuration lands.
struct L7Sinks {
    policies: Shared<PolicySet>,
    routes: Shared<Routes>,
    authns: Shared<AuthnSet>,
    destination_rules: Shared<DestinationRules>,
    balancers: Arc<crate::balancing::Balancers>,
    jwks: Arc<ambit_jwt::JwksCache>,
}

/// The L7 configuration: a watched file or directory, or a delta xDS stream of its own to
/// `ambit control` for the `ambit.waypoint.v1.*` types. What a stream delivered stays
/// when the server goes away (the client reconnects with what it holds), and `ready` is
/// released on the first snapshot of every type.
fn start_l7(
    cfg: &Arc<Config>,
    sinks: L7Sinks,
    metrics: ambit_xds::XdsMetrics,
    ready: BlockReady,
) -> anyhow::Result<()> {
    match &cfg.l7 {
        L7Source::File(path) => {
            let loaded = load_config(path, None, &sinks.jwks);
            sinks.apply(loaded);
            // What reading the documents used goes back to the system now, not as
            // jemalloc's pages decay seconds later.
            ambit_runtime::memory::release_freed();
            spawn_config_watch(path.clone(), sinks);
            drop(ready);
        }
        L7Source::Nothing => {
            tracing::warn!(
                "AMBIT_WAYPOINT_NO_L7_POLICY=true: no AuthorizationPolicy, route or \
                 RequestAuthentication is enforced (L4 policy still is, by the node proxies)"
            );
            drop(ready);
        }
        L7Source::Control(control) => {
            let L7Sinks {
                policies,
                routes,
                authns,
                destination_rules,
                balancers,
                jwks,
            } = sinks;
            let channel = GrpcChannel::new(control.channel.clone())
                .with_context(|| format!("AMBIT_CONTROL_ADDRESS={}", control.channel.address))?;
            tracing::info!(
                address = %control.channel.address,
                server = ?control.channel.server_identity.as_ref().map(ToString::to_string),
                "xDS: connecting to ambit's control server for the L7 configuration"
            );
            let limits = ambit_xds::Limits::default();
            let delta = ambit_xds::DeltaClient::subscribing(control.node.to_node(), limits)
                .subscribe(WaypointPolicies::default())
                .subscribe(WaypointRoutes::default())
                .subscribe(WaypointAuthns::default())
                .subscribe(WaypointDestinationRules::default());
            let client = ambit_xds::XdsClient::new(channel, delta)
                .with_metrics(metrics)
                .on_ready(move || {
                    tracing::info!("L7 configuration: a first snapshot of every type held");
                    drop(ready);
                    ambit_runtime::memory::release_freed();
                });
            let mut held = DocumentStore::default();
            let mut held_routes = DocumentStore::default();
            let mut held_authns = DocumentStore::default();
            let mut held_rules = DocumentStore::default();
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
                            table: ambit_gateway_routes::RouteTable::new(held_routes.to_vec()),
                            ..Routes::default()
                        });
                    }
                    Err(other) => other,
                };
                let batch = match batch.downcast::<WaypointAuthns>() {
                    Ok(typed) => {
                        typed.apply(&mut held_authns);
                        let all = held_authns.to_vec().iter().map(|a| (**a).clone()).collect();
                        return authns.replace(AuthnSet::new(all, &jwks));
                    }
                    Err(other) => other,
                };
                match batch.downcast::<WaypointDestinationRules>() {
                    Ok(typed) => {
                        typed.apply(&mut held_rules);
                        let all = held_rules.to_vec().iter().map(|r| (**r).clone()).collect();
                        let rules = DestinationRules::new(all);
                        balancers.retain_rules(&rules);
                        destination_rules.replace(rules);
                    }
                    Err(_) => {
                        tracing::warn!("L7 stream: a batch of a type not subscribed, ignored")
                    }
                }
            }));
        }
    }
    Ok(())
}

/// Reads the policy and route documents after `previous`: each bad one is reported with
/// its file, line and field and stands at its last good version; a bad policy without
/// one fails closed ([`crate::policies::merge`], [`crate::request_plan::merge_routes`]).
pub fn load_config(
    path: &Path,
    previous: Option<Previous<'_>>,
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
    let routes = crate::request_plan::merge_routes(
        routes,
        &parsed.errors,
        previous.as_ref().map(|p| p.routes),
    );
    let rules = std::mem::take(&mut parsed.destination_rules)
        .into_iter()
        .map(|r| r.value)
        .collect();
    let destination_rules = crate::destination_rules::merge_rules(
        rules,
        &parsed.errors,
        previous.as_ref().map(|p| p.destination_rules),
    );
    for key in &destination_rules.kept {
        tracing::warn!(destination_rule = %key, "a refused version: the last good one stays");
    }
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
    let (set, outcome) = crate::policies::merge(parsed, previous.as_ref().map(|p| p.policies));
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
        destination_rules = destination_rules.rules().len(),
        refused,
        fail_closed = set.fail_closed.is_some(),
        "policies, routes, request authentications and destination rules loaded"
    );
    Loaded {
        policies: set,
        routes,
        authns,
        destination_rules,
    }
}

/// The versions in force, for a load to keep those of refused documents.
#[derive(Clone, Copy)]
pub struct Previous<'a> {
    pub policies: &'a PolicySet,
    pub routes: &'a Routes,
    pub destination_rules: &'a DestinationRules,
}

/// What a load of the config comes to.
pub struct Loaded {
    pub policies: PolicySet,
    pub routes: Routes,
    pub authns: AuthnSet,
    pub destination_rules: DestinationRules,
}

impl L7Sinks {
    /// Puts a load in force. Each request reads each once, at its start: one in flight
    /// keeps the versions it began with.
    fn apply(&self, loaded: Loaded) {
        self.routes.replace(loaded.routes);
        self.authns.replace(loaded.authns);
        self.balancers.retain_rules(&loaded.destination_rules);
        self.destination_rules.replace(loaded.destination_rules);
        self.policies.replace(loaded.policies);
    }
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

/// Watches the policy file or directory ([`Watched`]) and loads each change after the
/// last good versions.
fn spawn_config_watch(path: PathBuf, sinks: L7Sinks) {
    // Stamped now, not when the task first runs: a change made in between is seen.
    let mut watched = Watched::new(&path, WATCH_EVERY);
    tokio::spawn(async move {
        loop {
            watched.changed().await;
            let (policies, routes, destination_rules) = (
                sinks.policies.get(),
                sinks.routes.get(),
                sinks.destination_rules.get(),
            );
            let previous = Previous {
                policies: &policies,
                routes: &routes,
                destination_rules: &destination_rules,
            };
            let loaded = load_config(&path, Some(previous), &sinks.jwks);
            sinks.apply(loaded);
            ambit_runtime::memory::release_freed();
        }
    });
}

/// Accepts HBONE connections within the admission gate until the drain starts.
async fn serve_hbone(
    wp: Arc<Waypoint>,
    listener: tokio::net::TcpListener,
    gate: Arc<Gate>,
    workers: Arc<crate::workers::Workers>,
    drain: DrainWatcher,
) {
    let reports = ReportThrottle::default();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = drain.draining() => return,
            a = ambit_admission::accept(&listener, &gate, &reports, "HBONE port") => a,
        };
        // The connection moves to a worker's event loop: registered there, its
        // wake-ups stay on that thread.
        let ambit_admission::Accepted {
            stream,
            peer,
            ticket,
        } = accepted;
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%peer, "HBONE: cannot hand the connection to a worker: {e}");
                continue;
            }
        };
        let (wp, drain) = (wp.clone(), drain.clone());
        workers.spawn(async move {
            match tokio::net::TcpStream::from_std(stream) {
                Ok(stream) => {
                    let accepted = ambit_admission::Accepted {
                        stream,
                        peer,
                        ticket,
                    };
                    serve_connection(wp, accepted, drain).await
                }
                Err(e) => tracing::warn!(%peer, "HBONE: a worker cannot take the connection: {e}"),
            }
        });
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
