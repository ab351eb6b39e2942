//! `ambit control`: the control server (delta xDS and the CA from files) and its operator
//! port.
//!
//! The operator port (`--admin`, default 127.0.0.1:15014, istiod's monitoring port) serves
//! `/metrics` (Prometheus/OpenMetrics text), `/ready` (200 once the CA and the mesh are
//! loaded and the xDS/CA listener is up, else 503) and `/debug` (JSON: the mesh served and,
//! per connected xDS client, its node id and per type the versions sent, the last nonce,
//! the ACK/NACK state and the NACK messages).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use http::StatusCode;

use ambit_control::{Control, ControlConfig, DEFAULT_LISTEN, DEFAULT_SERVING_NAME};

use ambit_process::lifecycle::Lifecycle;
use ambit_runtime::http::{text, with_type, Handler};

#[derive(clap::Args, Debug)]
pub struct ControlArgs {
    /// Directory of mesh files (`*.yaml`/`*.yml` in ztunnel's local-config schema:
    /// workloads, services, policies), merged and watched for changes.
    #[arg(
        long,
        required_unless_present = "kubernetes",
        conflicts_with = "kubernetes"
    )]
    pub mesh: Option<PathBuf>,
    /// Istio plug-in CA directory (ca-cert.pem, ca-key.pem, root-cert.pem,
    /// cert-chain.pem). When it holds none of them, an ephemeral root is made and written
    /// there, so clients can trust its root-cert.pem.
    #[arg(
        long,
        required_unless_present = "kubernetes",
        conflicts_with = "kubernetes"
    )]
    pub ca: Option<PathBuf>,
    /// Tokens file: a YAML list of `{token, node}` (may ask for the identities of the
    /// workloads on that node) and `{token, identity}` (that identity only). Keep it 0600.
    #[arg(
        long,
        required_unless_present = "kubernetes",
        conflicts_with = "kubernetes"
    )]
    pub tokens: Option<PathBuf>,
    /// Serve the waypoints' L7 configuration (AuthorizationPolicy, RequestAuthentication,
    /// HTTPRoute, GRPCRoute) from the API server instead of files, beside istiod: streams
    /// only from waypoints' service accounts (TokenReview, audience istio-ca), no CA, the
    /// serving certificate from istiod's CA (CA_ADDRESS, CA_ROOT_CA, AUTH_TOKEN) for
    /// --identity.
    #[arg(long)]
    pub kubernetes: bool,
    /// With --kubernetes: a kubeconfig (default: the in-cluster service account).
    #[arg(long, conflicts_with_all = ["mesh", "ca", "tokens"])]
    pub kubeconfig: Option<PathBuf>,
    /// Where delta xDS and the CA are served (TLS, HTTP/2).
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// DNS name in the serving certificate (repeat for several); clients verify it, or
    /// ALT_XDS_HOSTNAME / ALT_CA_HOSTNAME, or the IP they dial.
    #[arg(long = "serving-name", default_value = DEFAULT_SERVING_NAME)]
    pub serving_names: Vec<String>,
    /// The server's SPIFFE id, put in its serving certificate: waypoints check it
    /// (AMBIT_CONTROL_IDENTITY) instead of a host name. Default:
    /// spiffe://<trust domain>/ns/istio-system/sa/ambit-control, as the chart installs it.
    #[arg(long)]
    pub identity: Option<String>,
    /// Operator port: /metrics, /ready, /debug. Loopback only: /debug shows the whole mesh.
    #[arg(long, default_value = "127.0.0.1:15014", value_parser = loopback_addr)]
    pub admin: SocketAddr,
    /// A second operator port that serves only /metrics and /ready (no /debug), on any
    /// address: for the kubelet's probes and Prometheus, as istiod's 15014 is scraped.
    #[arg(long)]
    pub monitoring: Option<SocketAddr>,
    /// The trust domain the CA signs identities of.
    #[arg(long, default_value = "cluster.local")]
    pub trust_domain: String,
    /// xDS clients served at once; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 1024)]
    pub max_clients: usize,
    /// Connections, and streams, one source IP may hold at once (each); default a quarter
    /// of --max-clients. Connections that have not authenticated yet are closed first when
    /// a share is spent.
    #[arg(long)]
    pub max_per_source: Option<usize>,
    /// The longest workload certificate signed, in seconds, whatever a request asks.
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    pub max_cert_ttl_secs: u64,
}

pub fn run(args: ControlArgs) -> anyhow::Result<()> {
    let (_logs, _flush) = ambit_runtime::logging::init().map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .thread_name("ambit-control")
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: ControlArgs) -> anyhow::Result<()> {
    let mut cfg = ControlConfig::new(
        args.mesh.clone().unwrap_or_default(),
        args.ca.clone().unwrap_or_default(),
        args.tokens.clone().unwrap_or_default(),
    );
    cfg.listen = args.listen;
    cfg.serving_names = args.serving_names;
    cfg.identity = match &args.identity {
        Some(id) => ambit_identity::SpiffeId::parse(id)
            .map_err(|e| anyhow::anyhow!("--identity {id}: {e}"))?,
        None => ambit_control::config::default_identity(&args.trust_domain)
            .map_err(|e| anyhow::anyhow!("--trust-domain {}: {e}", args.trust_domain))?,
    };
    cfg.trust_domain = args.trust_domain;
    cfg.max_clients = args.max_clients;
    cfg.max_per_source = args.max_per_source.unwrap_or((args.max_clients / 4).max(1));
    cfg.max_cert_ttl = Duration::from_secs(args.max_cert_ttl_secs);
    cfg.default_cert_ttl = cfg.default_cert_ttl.min(cfg.max_cert_ttl);
    let admin = ambit_process::operator::bind(args.admin, "operator").await?;
    let control = if args.kubernetes {
        Arc::new(start_kubernetes(cfg, args.kubeconfig.as_deref()).await?)
    } else {
        Arc::new(Control::start(cfg).await?)
    };
    let mut lifecycle = Lifecycle::default();
    tokio::spawn(ambit_runtime::http::serve(
        admin,
        handler(control.clone()),
        lifecycle.drain.clone(),
    ));
    tracing::info!("operator port on {} (/metrics, /ready, /debug)", args.admin);
    if let Some(addr) = args.monitoring {
        let listener = ambit_process::operator::bind(addr, "monitoring").await?;
        tokio::spawn(ambit_runtime::http::serve(
            listener,
            monitoring_handler(control.clone()),
            lifecycle.drain.clone(),
        ));
        tracing::info!("monitoring port on {addr} (/metrics, /ready)");
    }
    lifecycle.shutdown_requested().await;
    lifecycle
        .drain(Duration::from_secs(1), "the operator port closes")
        .await;
    control.shutdown().await;
    Ok(())
}

/// `--kubernetes`: the API client, and the certificate manager for the serving
/// certificate (istiod's CA, as a workload reaches it: CA_ADDRESS, CA_ROOT_CA, AUTH_TOKEN,
/// CLUSTER_ID).
async fn start_kubernetes(
    cfg: ControlConfig,
    kubeconfig: Option<&std::path::Path>,
) -> anyhow::Result<Control> {
    use ambit_k8s::client::{connect, ClientSource};
    let source = ClientSource::detect(kubeconfig).context(
        "--kubernetes: no --kubeconfig and not in a cluster (KUBERNETES_SERVICE_HOST is unset)",
    )?;
    let client = connect(&source)
        .await
        .with_context(|| format!("--kubernetes: the API client from {source}"))?;
    let env = ambit_process::env::ProcessEnv::capture();
    let (ca, cluster_id, secret_ttl) = env.read(|env| {
        Ok((
            ambit_process::ca::ca_source(env, None, false)?,
            env.get("CLUSTER_ID")
                .filter(|c| !c.is_empty())
                .unwrap_or("Kubernetes")
                .to_string(),
            ambit_process::ca::secret_ttl(env)?,
        ))
    })?;
    let certs = ambit_process::certs::cert_manager(&ambit_process::certs::CertSettings {
        source: &ca,
        trust_domain: &cfg.trust_domain,
        cluster_id: &cluster_id,
        secret_ttl,
        impersonate: false,
    })?;
    tracing::info!(api = %source, identity = %cfg.identity, "serving the L7 configuration from the API server");
    Ok(Control::start_kubernetes(cfg, client, certs).await?)
}

/// `--admin`: an address on loopback. `/debug` shows every workload, policy and client of
/// the mesh, so it is never served where the network can reach it.
fn loopback_addr(s: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = s
        .parse()
        .map_err(|e| format!("{s:?} is not an address (IP:PORT): {e}"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{addr} is not on loopback; the operator port serves /debug (the whole mesh) and listens on 127.0.0.1 or [::1] only (scrape /metrics through a local agent or proxy)"
        ));
    }
    Ok(addr)
}

/// `--monitoring`: what may be seen from the network.
fn monitoring_handler(control: Arc<Control>) -> Handler {
    let admin = handler(control);
    Arc::new(move |method, uri, headers| match uri.path() {
        "/metrics" | "/ready" => admin(method, uri, headers),
        _ => text(StatusCode::NOT_FOUND, "not found; try /metrics or /ready\n"),
    })
}

fn handler(control: Arc<Control>) -> Handler {
    Arc::new(move |_method, uri, _headers| match uri.path() {
        "/metrics" => with_type(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            control.metrics_text(),
        ),
        "/ready" if control.is_ready() => text(StatusCode::OK, "ready\n"),
        "/ready" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        "/debug" => with_type(
            StatusCode::OK,
            "application/json",
            serde_json::to_string_pretty(&control.debug_json()).unwrap_or_default() + "\n",
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /ready or /debug\n",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControlArgs,
    }

    #[test]
    fn defaults_and_repeated_serving_names() {
        let cli = Cli::parse_from(["x", "--mesh", "m", "--ca", "c", "--tokens", "t"]);
        let a = cli.args;
        assert_eq!(a.listen.to_string(), "[::]:15012");
        assert_eq!(a.serving_names, ["istiod.istio-system.svc"]);
        assert_eq!(a.admin.to_string(), "127.0.0.1:15014");
        let cli = Cli::parse_from([
            "x",
            "--mesh",
            "m",
            "--ca",
            "c",
            "--tokens",
            "t",
            "--serving-name",
            "a.example",
            "--serving-name",
            "b.example",
            "--listen",
            "127.0.0.1:15012",
        ]);
        assert_eq!(cli.args.serving_names, ["a.example", "b.example"]);
        assert!(Cli::try_parse_from(["x", "--mesh", "m"]).is_err());
    }

    /// `--kubernetes` needs no files, and takes none.
    #[test]
    fn kubernetes_mode_takes_no_files() {
        let cli = Cli::parse_from(["x", "--kubernetes", "--kubeconfig", "/k"]);
        assert!(cli.args.kubernetes && cli.args.mesh.is_none());
        assert_eq!(
            cli.args.kubeconfig.as_deref(),
            Some(std::path::Path::new("/k"))
        );
        for bad in [
            &["x", "--kubernetes", "--mesh", "m"][..],
            &[
                "x",
                "--kubeconfig",
                "/k",
                "--mesh",
                "m",
                "--ca",
                "c",
                "--tokens",
                "t",
            ],
            &["x"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_operator_port_is_loopback_only() {
        let with_admin = |a: &str| {
            Cli::try_parse_from([
                "x", "--mesh", "m", "--ca", "c", "--tokens", "t", "--admin", a,
            ])
            .map(|c| c.args.admin)
        };
        assert_eq!(with_admin("[::1]:9").unwrap().to_string(), "[::1]:9");
        assert_eq!(
            with_admin("127.0.0.2:9").unwrap().to_string(),
            "127.0.0.2:9"
        );
        for bad in ["0.0.0.0:15014", "[::]:15014", "10.0.0.1:15014"] {
            let err = with_admin(bad).unwrap_err().to_string();
            assert!(err.contains("not on loopback"), "{bad}: {err}");
        }
    }
}
