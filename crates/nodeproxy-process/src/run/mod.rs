//! `ambit ztunnel`: wires configuration, state, certificates, listeners and the operator
//! endpoints together, then runs until SIGTERM/SIGINT or `/quitquitquit`. What differs by
//! mode is in [`dedicated`] and [`shared`]; where the mesh and certificates come from is in
//! [`sources`]; the operator listeners in [`operator`].

mod dedicated;
mod shared;
mod sources;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::bail;

use ambit_identity::CertManager;
use ambit_nodeproxy::admission::NodeHandshakes;
use ambit_nodeproxy::SharedState;
use ambit_process::mesh_file;
use ambit_runtime::drain::DrainWatcher;
use ambit_runtime::logging::LogHandle;
use ambit_runtime::readiness::{BlockReady, Ready};
use ambit_state::ProxyState;

use ambit_process::lifecycle::Lifecycle;
use ambit_process::operator::{OperatorAddrs, OperatorPorts};

use crate::admin::{admin_handler, AdminContext};
use crate::config::{Config, LocalConfigSource, ProxyMode};

/// What either mode's data plane is built from.
struct Wiring {
    cfg: Arc<Config>,
    state: SharedState,
    certs: Arc<CertManager>,
    metrics: ambit_nodeproxy::metrics::Metrics,
    node_handshakes: Arc<NodeHandshakes>,
    dns: Option<Arc<ambit_dns::DnsConfig>>,
    dns_metrics: Option<ambit_dns::DnsMetrics>,
    /// Held until the DNS proxy serves.
    dns_ready: Option<BlockReady>,
    /// Shared mode's per-pod metrics.
    pods_metrics: Option<ambit_nodeproxy::pods::InpodMetrics>,
    ready: Ready,
    /// Turns true once the first mesh state is in.
    xds_synced: tokio::sync::watch::Receiver<bool>,
    watcher: DrainWatcher,
    /// On-demand xDS, for the data path's lookups.
    on_demand: Option<Arc<dyn ambit_nodeproxy::on_demand::OnDemandLookups>>,
}

/// A mode's data plane: the task that serves it, and (shared mode) the per-pod state
/// `/config_dump` shows.
struct DataPlane {
    task: Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>,
    workload_state: Option<ambit_nodeproxy::pods::WorkloadStateDump>,
}

pub async fn run(cfg: Config, logs: Option<LogHandle>) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let ready = Ready::default();
    let proxy_ready = ready.register("proxy");
    let state_ready = ready.register("state manager");

    let (state, static_config, rejected) = match &cfg.local_config {
        Some(source) => {
            let loaded = mesh_file::load_at_start(source)?;
            (loaded.state, Arc::new(loaded.file), loaded.rejected)
        }
        // xDS only: the mesh arrives from the control plane.
        None => (ProxyState::new(), Arc::default(), Vec::new()),
    };
    if let (ProxyMode::Dedicated, Some(w)) = (cfg.proxy_mode, &cfg.workload) {
        // With xDS the workload may not have arrived yet: checked once it has (below).
        if cfg.xds.is_none() && !sources::has_local_workload(&state, &cfg, w) {
            bail!(
                "PROXY_WORKLOAD_INFO={}/{}/{} matches no workload in the local config: add a \
                 workload with that namespace, name and serviceAccount",
                w.namespace,
                w.name,
                w.service_account
            );
        }
    }
    let state = SharedState::new(state);

    let certs = sources::cert_manager(&cfg)?;

    let mut registry = ambit_process::lifecycle::registry();
    let mut metrics =
        ambit_nodeproxy::metrics::Metrics::register(&mut registry, &cfg.istio_version);
    certs.register_metrics(&mut registry);
    // One node-wide handshake count, whichever mode; its sheds are ambit's own metric.
    let node_handshakes = NodeHandshakes::new(cfg.proxy.handshakes.node);
    registry.register(
        "ambit_hbone_handshakes_shed",
        "Connections to the HBONE port reset before their handshake because a source, pod or node limit was reached",
        node_handshakes.shed_counter(),
    );
    let policy_report = mesh_file::PolicyReport::default();
    policy_report.set_rejected(&rejected);
    metrics.rbac = Arc::new(ambit_nodeproxy::dry_run::DryRunMatches::register(
        &mut registry,
    ));
    mesh_file::register_metrics(&mut registry, state.clone(), policy_report.clone());
    if let Some(LocalConfigSource::File(path)) = &cfg.local_config {
        mesh_file::spawn_watch(
            path.clone(),
            state.clone(),
            static_config.clone(),
            policy_report,
        );
    }
    let xds_metrics = ambit_xds::XdsMetrics::register(&mut registry);
    let dns = sources::dns_config(&cfg)?;
    let dns_metrics = dns
        .as_ref()
        .map(|_| ambit_dns::DnsMetrics::register(&mut registry));
    let dns_ready = dns.as_ref().map(|_| ready.register("dns proxy"));
    let pods_metrics = (cfg.proxy_mode == ProxyMode::Shared)
        .then(|| ambit_nodeproxy::pods::InpodMetrics::register(&mut registry));
    let registry = Arc::new(registry);
    let on_demand = sources::on_demand(&cfg);
    let xds_synced = sources::start_xds(&cfg, &state, xds_metrics, state_ready, on_demand.clone())?;

    let mut lifecycle = Lifecycle::default();
    let watcher = lifecycle.drain.clone();

    // Bind everything before serving anything, so a conflict fails start-up cleanly.
    let operator = OperatorPorts::bind(&OperatorAddrs {
        admin: cfg.admin_addr,
        admin_ipv6_twin: cfg.proxy.ipv6_enabled,
        stats: cfg.stats_addr,
        readiness: cfg.readiness_addr,
    })
    .await?;

    let wiring = Wiring {
        cfg: cfg.clone(),
        state: state.clone(),
        certs: certs.clone(),
        metrics,
        node_handshakes,
        dns,
        dns_metrics,
        dns_ready,
        pods_metrics,
        ready: ready.clone(),
        xds_synced,
        watcher: watcher.clone(),
        on_demand: on_demand.clone().map(|od| {
            Arc::new(sources::XdsLookups(od))
                as Arc<dyn ambit_nodeproxy::on_demand::OnDemandLookups>
        }),
    };
    let DataPlane {
        task: data_plane,
        workload_state,
    } = match cfg.proxy_mode {
        ProxyMode::Dedicated => dedicated::start(wiring)?,
        ProxyMode::Shared => shared::start(wiring)?,
    };
    tracing::info!(
        admin = %cfg.admin_addr,
        stats = %cfg.stats_addr,
        readiness = %cfg.readiness_addr,
        "operator endpoints bound"
    );

    let renewal = certs.spawn_renewal();
    let admin_ctx = AdminContext {
        config: cfg.clone(),
        state,
        certs,
        logs,
        shutdown: lifecycle.quit.clone(),
        static_config,
        workload_state,
        on_demand,
    };
    operator.serve(admin_handler(admin_ctx), registry, ready.clone(), &watcher);
    let mut data_plane = tokio::spawn(data_plane);
    drop(watcher);
    drop(proxy_ready);

    tokio::select! {
        _ = lifecycle.shutdown_requested() => {}
        finished = &mut data_plane => {
            // Only a broken agent protocol ends the data plane on its own: exit non-zero,
            // like ztunnel, so the supervisor restarts us with a clean slate.
            renewal.abort();
            return match finished {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(anyhow::anyhow!("data plane task failed: {e}")),
            };
        }
    }
    lifecycle
        .drain(
            cfg.termination_deadline,
            "no new connections, open ones may finish",
        )
        .await;
    renewal.abort();
    let _ = data_plane.await;
    tracing::info!("shutdown complete");
    Ok(())
}

/// Waits for the first xDS sync; false if the drain began first (nothing to serve then).
async fn wait_for_sync(
    synced: &mut tokio::sync::watch::Receiver<bool>,
    watcher: &ambit_runtime::drain::DrainWatcher,
) -> bool {
    tokio::select! {
        r = synced.wait_for(|s| *s) => r.is_ok(),
        _ = watcher.draining() => false,
    }
}
