//! The node agent on Kubernetes: istio-cni's node agent, driven by the API server.
//!
//! Startup (reference §1.2, §1.7): health and metrics servers; list the pods on this node and
//! take the ones annotated `ambient.istio.io/redirection=enabled` (not terminal, not
//! ztunnel) as the snapshot, their netns found in the host's `/proc`; host setup, rules
//! re-asserted if `AMBIENT_RECONCILE_POD_RULES_ON_STARTUP` (unchanged rules stay
//! untouched), ipsets refilled; the ZDS server serves the snapshot; the plugin's `cmdadd`
//! socket opens; then the watches (pods on this node, all namespaces) feed the level-
//! triggered reconcile ([`reconcile`]) through the work queue ([`queue`]). `/readyz` turns
//! 200 once both watches have synced and the installer says it is ready.
//!
//! - [`config`]: the environment (the chart's names), sans IO.
//! - [`reconcile`]: what to do about one pod, sans IO.
//! - [`queue`]: per-pod dedupe and backoff, sans IO.
//! - [`procscan`]: a pod's netns from `/proc`.
//! - [`plugin`]: the `POST /cmdadd` server Istio's CNI plugin calls.
//! - [`netns_check`]: whether the netns a `/cmdadd` names may be captured, sans IO.
//! - [`controller`]: the watches, the worker and the annotation patches; [`run`] wires it
//!   to the plugin's server.

pub mod controller;
pub mod http;
pub mod metrics;
pub mod netns_check;
pub mod plugin;
pub mod pods;
pub mod procscan;
pub mod queue;
pub mod reconcile;
pub mod settings;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use hyper::{Method, StatusCode};

pub use controller::Options;
pub use settings::{ConfigError, K8sConfig};

use metrics::Metrics;

/// Runs the agent in Kubernetes mode until `shutdown` completes. `install_ready` is the
/// installer's half of `/readyz` (pass `true` when no installer runs in this process).
pub async fn run(
    config: K8sConfig,
    client: kube::Client,
    install_ready: Arc<AtomicBool>,
    shutdown: impl Future,
) -> anyhow::Result<()> {
    run_with(config, client, install_ready, Options::default(), shutdown).await
}

/// The controller started, the plugin's `cmdadd` socket served, then the watches and the
/// worker until `shutdown`.
async fn run_ambient(
    config: K8sConfig,
    client: kube::Client,
    metrics: Arc<Metrics>,
    synced: Arc<AtomicBool>,
    opts: Options,
    shutdown: impl Future,
) -> anyhow::Result<()> {
    let plugin_socket = config.plugin_socket();
    let ctl = controller::start(config, client, metrics, opts).await?;
    let plugin_listener = plugin::bind(&plugin_socket)?;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(plugin::serve(plugin_listener, ctl.clone()));
    controller::serve(ctl, synced, tasks, shutdown).await
}

/// [`run`] with test knobs.
pub async fn run_with(
    config: K8sConfig,
    client: kube::Client,
    install_ready: Arc<AtomicBool>,
    opts: Options,
    shutdown: impl Future,
) -> anyhow::Result<()> {
    if !config.ambient_enabled {
        tracing::warn!("AMBIENT_ENABLED is not true: the node agent serves health only");
    }
    let metrics = Arc::new(Metrics::default());
    let synced = Arc::new(AtomicBool::new(false));

    let health = tokio::net::TcpListener::bind(config.health_addr)
        .await
        .with_context(|| format!("listen for health checks on {}", config.health_addr))?;
    let metrics_listener = tokio::net::TcpListener::bind(config.metrics_addr)
        .await
        .with_context(|| format!("listen for metrics on {}", config.metrics_addr))?;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(http::serve_tcp(
        health,
        health_handler(synced.clone(), install_ready),
        1024,
    ));
    let m = metrics.clone();
    tasks.spawn(http::serve_tcp(
        metrics_listener,
        http::handler(move |_, path, _| {
            let m = m.clone();
            async move {
                match path.as_str() {
                    "/metrics" => (StatusCode::OK, "text/plain; version=0.0.4", m.render()),
                    _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
                }
            }
        }),
        1024,
    ));

    let result = if config.ambient_enabled {
        run_ambient(config, client, metrics, synced, opts, shutdown).await
    } else {
        shutdown.await;
        Ok(())
    };
    tasks.shutdown().await;
    result
}

fn health_handler(synced: Arc<AtomicBool>, install_ready: Arc<AtomicBool>) -> http::Handler {
    http::handler(move |method: Method, path: String, _body: Bytes| {
        let ready = synced.load(Ordering::SeqCst) && install_ready.load(Ordering::SeqCst);
        let watching = synced.load(Ordering::SeqCst);
        async move {
            match (method, path.as_str()) {
                (Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".into()),
                (Method::GET, "/readyz") if ready => (StatusCode::OK, "text/plain", "ok\n".into()),
                (Method::GET, "/readyz") => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    if watching {
                        "the CNI installer is not ready\n".into()
                    } else {
                        "the watches have not synced yet\n".into()
                    },
                ),
                _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
            }
        }
    })
}
