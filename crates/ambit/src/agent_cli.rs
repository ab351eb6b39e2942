//! `ambit agent`: the node agent, and the commands that talk to a running one.
//!
//! Without Kubernetes the agent is configured by its flags; in Kubernetes mode by
//! istio-cni's environment, and a flag of the other mode is refused by name, with the
//! variable that applies instead ([`kubernetes_mode_conflicts`]), before anything starts.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::parser::ValueSource;
use clap::ArgMatches;

use ambit_cni::api::{self, AgentRequest, PodInfo};

#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    #[command(subcommand)]
    pub action: Option<AgentAction>,
    /// The ZDS socket the node proxies connect to (ztunnel's `INPOD_UDS`).
    #[arg(
        long,
        env = "INPOD_UDS",
        default_value = ambit_wellknown::paths::ZDS_SOCKET,
        global = true
    )]
    pub zds_socket: PathBuf,
    /// The socket the CNI plugin and these commands use to reach the agent.
    #[arg(long, default_value = api::DEFAULT_AGENT_SOCKET, global = true)]
    pub events_socket: PathBuf,
    /// Where the agent keeps its enrolled pods across restarts.
    #[arg(long, default_value = ambit_wellknown::paths::AGENT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Also capture IPv6 (ip6tables rules, the v6 probe set).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub ipv6: bool,
    /// Redirect pods' DNS (UDP and TCP 53) to the node proxy's DNS proxy on 15053, as
    /// istio-cni does by default; `--dns-capture false` leaves pods' DNS alone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub dns_capture: bool,
    /// The uid the node proxy runs as, when not root: it may use the ZDS socket too (the
    /// agent checks every peer's uid with SO_PEERCRED; root and the agent's own uid always
    /// pass).
    #[arg(long, env = "AMBIT_ZDS_PROXY_UID")]
    pub zds_proxy_uid: Option<u32>,
    /// Kubernetes mode: the uid the CNI plugin runs as, when not root: it may call the
    /// plugin socket too (SO_PEERCRED; root and the agent's own uid always pass).
    #[arg(long, env = "AMBIT_CNI_PLUGIN_UID")]
    pub cni_plugin_uid: Option<u32>,
    /// Kubernetes mode: watch this API server (also when `KUBERNETES_SERVICE_HOST` is set,
    /// with the in-cluster service account). Configured then from istio-cni's environment
    /// (AMBIENT_ENABLED, NODE_NAME, CNI_AGENT_RUN_DIR, ZTUNNEL_UDS_ADDRESS, ...).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
pub enum AgentAction {
    /// Enroll a pod whose network namespace exists (hosts that run containers without CNI).
    Enroll {
        /// Path of the pod's network namespace, e.g. /var/run/netns/web or /proc/<pid>/ns/net.
        #[arg(long)]
        netns: PathBuf,
        #[arg(long)]
        uid: String,
        #[arg(long)]
        name: String,
        #[arg(long, default_value = "default")]
        namespace: String,
        #[arg(long, default_value = "default")]
        service_account: String,
        /// The pod's IP addresses (repeat for several).
        #[arg(long = "ip", required = true)]
        ips: Vec<IpAddr>,
    },
    /// Remove a pod from capture.
    Remove {
        #[arg(long)]
        uid: String,
    },
    /// List the enrolled pods.
    List,
}

const CALL_TIMEOUT: Duration = Duration::from_secs(15);

pub fn run(args: AgentArgs, matches: Option<&ArgMatches>) -> anyhow::Result<()> {
    let request = match args.action {
        None => return run_agent(args, matches),
        Some(AgentAction::Enroll {
            netns,
            uid,
            name,
            namespace,
            service_account,
            ips,
        }) => AgentRequest::Add(PodInfo {
            uid,
            name,
            namespace,
            service_account,
            netns: netns.display().to_string(),
            ips,
            container_id: String::new(),
        }),
        Some(AgentAction::Remove { uid }) => AgentRequest::Remove { uid },
        Some(AgentAction::List) => AgentRequest::List,
    };
    let response = api::call(&args.events_socket, &request, CALL_TIMEOUT)
        .with_context(|| format!("asking the node agent at {}", args.events_socket.display()))?;
    if !response.ok {
        bail!(
            "the node agent refused: {}",
            response.error.unwrap_or_else(|| "no reason given".into())
        );
    }
    for pod in response.pods {
        println!(
            "{}\t{}/{}\t{}\t{}",
            pod.uid,
            pod.namespace,
            pod.name,
            pod.ips
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            pod.netns
        );
    }
    Ok(())
}

/// The agent's runtime, in either mode: two workers are plenty for its control work.
fn agent_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("ambit-agent")
        .build()
}

/// The flags of the agent without Kubernetes: the flag (and its variable), and what
/// Kubernetes mode reads instead (istio-cni's names).
const LOCAL_MODE_FLAGS: &[(&str, &str, &str)] = &[
    (
        "zds_socket",
        "--zds-socket (INPOD_UDS)",
        "set ZTUNNEL_UDS_ADDRESS",
    ),
    (
        "events_socket",
        "--events-socket",
        "the CNI plugin calls <CNI_AGENT_RUN_DIR>/pluginevent.sock: set CNI_AGENT_RUN_DIR",
    ),
    (
        "state_dir",
        "--state-dir",
        "the pods are kept in <CNI_AGENT_RUN_DIR>/ambit-pods: set CNI_AGENT_RUN_DIR",
    ),
    ("ipv6", "--ipv6", "set AMBIENT_IPV6"),
    ("dns_capture", "--dns-capture", "set AMBIENT_DNS_CAPTURE"),
];

/// The flags given (`given(id)`: on the command line or from their variable) that do not
/// apply in Kubernetes mode, each with what applies instead; `Err` names them all.
pub fn kubernetes_mode_conflicts(given: impl Fn(&str) -> bool) -> Result<(), String> {
    let wrong: Vec<String> = LOCAL_MODE_FLAGS
        .iter()
        .filter(|(id, _, _)| given(id))
        .map(|(_, flag, instead)| format!("{flag} does not apply in Kubernetes mode: {instead}"))
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}\n(Kubernetes mode is on because of --kubeconfig, KUBECONFIG or \
         KUBERNETES_SERVICE_HOST; it is configured from istio-cni's environment)",
        wrong.join("\n")
    ))
}

fn run_agent(args: AgentArgs, matches: Option<&ArgMatches>) -> anyhow::Result<()> {
    let given = |id: &str| {
        matches.is_some_and(|m| {
            matches!(
                m.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
    };
    if ambit_k8s::client::ClientSource::detect(args.kubeconfig.as_deref()).is_some() {
        kubernetes_mode_conflicts(given).map_err(anyhow::Error::msg)?;
        let (_logs, _flush_logs) = ambit_runtime::logging::init().map_err(anyhow::Error::msg)?;
        let uids = Uids {
            zds_proxy: args.zds_proxy_uid,
            cni_plugin: args.cni_plugin_uid,
        };
        return run_kubernetes(args.kubeconfig, None, uids);
    }
    if given("cni_plugin_uid") {
        bail!(
            "--cni-plugin-uid (AMBIT_CNI_PLUGIN_UID) applies in Kubernetes mode only (the \
             plugin socket); without Kubernetes the events socket is root's alone (0600)"
        );
    }
    let (_logs, _flush_logs) = ambit_runtime::logging::init().map_err(anyhow::Error::msg)?;
    let cfg = ambit_agent::AgentConfig {
        zds_socket: args.zds_socket,
        events_socket: args.events_socket,
        state_dir: args.state_dir,
        ipv6: args.ipv6,
        dns_capture: args.dns_capture,
        zds_proxy_uid: args.zds_proxy_uid,
    };
    let runtime = agent_runtime()?;
    runtime.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            tracing::info!("node agent shutting down; pods stay enrolled and captured");
        };
        ambit_agent::run(cfg, shutdown).await
    })
}

/// Uids from the command line that override the environment's in Kubernetes mode.
#[derive(Debug, Clone, Copy, Default)]
pub struct Uids {
    pub zds_proxy: Option<u32>,
    pub cni_plugin: Option<u32>,
}

/// The node agent in Kubernetes mode (logging already set up): the API client from
/// `kubeconfig` or the in-cluster service account, the config from istio-cni's environment
/// (`uids` given override its `AMBIT_ZDS_PROXY_UID` and `AMBIT_CNI_PLUGIN_UID`).
/// With `installer` (the `install-cni` entry) the CNI plugin's installer runs beside it:
/// `/readyz` waits for it, and on SIGTERM its safe-upgrade rule decides whether the plugin,
/// its config and the host rules stay (an upgrade) or go (an uninstall).
pub fn run_kubernetes(
    kubeconfig: Option<PathBuf>,
    installer: Option<ambit_agent::install::InstallConfig>,
    uids: Uids,
) -> anyhow::Result<()> {
    use ambit_k8s::client::{connect, ClientSource};
    let source = ClientSource::detect(kubeconfig.as_deref()).context(
        "Kubernetes mode needs an API server: --kubeconfig, KUBECONFIG or KUBERNETES_SERVICE_HOST",
    )?;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let mut cfg = ambit_agent::k8s::K8sConfig::from_env(&hostname)?;
    cfg.zds_proxy_uid = uids.zds_proxy.or(cfg.zds_proxy_uid);
    cfg.plugin_uid = uids.cni_plugin.or(cfg.plugin_uid);
    if !cfg.ambient_enabled {
        tracing::warn!(
            "AMBIENT_ENABLED is not true: no pod will be captured (the node agent serves \
             /healthz and /readyz only); set AMBIENT_ENABLED=true for ambient mode"
        );
    }
    let runtime = agent_runtime()?;
    runtime.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let client = connect(&source).await?;
        tracing::info!(api = %source, node = %cfg.node_name, "node agent in Kubernetes mode");
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            let _ = stop_tx.send(true);
        });
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let installer = installer.map(|c| Arc::new(ambit_agent::install::Installer::new(c)));
        let install_ready = Arc::new(AtomicBool::new(installer.is_none()));
        let install_task = installer.clone().map(|i| {
            tokio::spawn(i.run(install_ready.clone(), stopped(stop_rx.clone())))
        });
        let (host_netns, ipv6) = (cfg.host_netns.clone(), cfg.ipv6);
        let result = ambit_agent::k8s::run(cfg, client.clone(), install_ready, stopped(stop_rx)).await;
        if let (Some(installer), Some(task)) = (installer, install_task) {
            let _ = task.await;
            let (decision, removed) = installer.shutdown(Some(&client)).await;
            tracing::info!(action = ?decision.action, reason = %decision.reason, "CNI plugin on shutdown");
            if decision.action == ambit_agent::install::upgrade::ShutdownAction::Cleanup {
                if let Err(e) = removed {
                    tracing::error!("cannot remove the CNI plugin: {e}");
                }
                let opts = ambit_agent::RunOptions {
                    host_netns,
                    ..Default::default()
                };
                if let Err(e) = ambit_agent::uninstall_host(ipv6, &opts).await {
                    tracing::error!(error = %format!("{e:#}"), "cannot remove the host probe rules");
                }
            }
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_flags_in_kubernetes_mode_name_what_applies() {
        assert_eq!(kubernetes_mode_conflicts(|_| false), Ok(()));
        for (id, flag, instead) in [
            ("zds_socket", "--zds-socket", "ZTUNNEL_UDS_ADDRESS"),
            ("events_socket", "--events-socket", "CNI_AGENT_RUN_DIR"),
            ("state_dir", "--state-dir", "CNI_AGENT_RUN_DIR"),
            ("ipv6", "--ipv6", "AMBIENT_IPV6"),
            ("dns_capture", "--dns-capture", "AMBIENT_DNS_CAPTURE"),
        ] {
            let e = kubernetes_mode_conflicts(|g| g == id).unwrap_err();
            assert!(
                e.contains(&format!("{flag} ")) && e.contains(instead),
                "{id}: {e}"
            );
        }
        let e = kubernetes_mode_conflicts(|g| g == "ipv6" || g == "state_dir").unwrap_err();
        assert!(e.contains("--ipv6") && e.contains("--state-dir"), "{e}");
        assert!(kubernetes_mode_conflicts(|g| g == "kubeconfig").is_ok());
    }
}
