//! The node agent runtime: host setup, the enrolled-pod store, the ZDS server and the pod
//! events socket the CNI plugin (and the CLI) talk to.
//!
//! Startup (reference §1.2, without Kubernetes): create the probe ipsets and install the
//! host probe SNAT rules; load the pod store; for every stored pod whose netns still exists,
//! re-assert its in-pod rules (idempotent: nothing changes when they are in place) and, once
//! all are known, flush and refill the ipsets; pods whose netns is gone are forgotten. Then
//! the ZDS server starts (its first snapshot carries the stored pods) and the events socket
//! opens.
//!
//! Pod events (one JSON request per connection, [`ambit_cni::api`]):
//!
//! - `add`: in-pod rules, ipset entries, persist, then `AddWorkload` to the newest node
//!   proxy and wait for its ack. A NACK (or timeout) is an error, so the runtime retries
//!   the sandbox. With **no** proxy connected the add succeeds: the pod is captured and
//!   fails closed until a proxy connects and receives it in its snapshot.
//! - `remove`: ipset entries (only those still carrying the pod's UID), in-pod rules (if the
//!   netns still exists), `DelWorkload` to every proxy, forget. Unknown pods are fine.
//! - `check`: ok iff enrolled. `list`: every enrolled pod.
//!
//! On shutdown the sockets are closed and removed; in-pod rules, host rules and ipsets stay
//! (an upgrade must not open a capture gap; see [`uninstall_host`] for a full removal).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ambit_cni::api::{self, AgentRequest, AgentResponse, PodInfo};
use ambit_zds::sockfile::bind_private;
use ambit_zds::{Netns, PeerPolicy};
use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::ipset::ProbeSets;
use crate::iptables::{self, ProbeSetNames};
use crate::rules::{unmap, PodRuleOptions};
use crate::store::{PodStore, DEFAULT_STATE_DIR};
use crate::zds::{ZdsError, ZdsOptions, ZdsServer, DEFAULT_ZDS_SOCKET};

/// How long a client has to send its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Host rule installation attempts at startup (the host's iptables may be busy at boot).
const HOST_RULE_ATTEMPTS: u32 = 5;
const HOST_RULE_RETRY: Duration = Duration::from_secs(1);

/// What the agent needs to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// The ZDS socket node proxies connect to (ztunnel's `INPOD_UDS`).
    pub zds_socket: PathBuf,
    /// The pod events socket ([`ambit_cni::api::DEFAULT_AGENT_SOCKET`]).
    pub events_socket: PathBuf,
    /// Where the enrolled pods are persisted.
    pub state_dir: PathBuf,
    /// Install IPv6 rules and the v6 probe set too.
    pub ipv6: bool,
    /// Redirect pod DNS to the node proxy (15053).
    pub dns_capture: bool,
    /// The uid the node proxy runs as, if not root (or ours): any other peer on the ZDS
    /// socket is refused (`SO_PEERCRED`).
    pub zds_proxy_uid: Option<u32>,
}

impl Default for AgentConfig {
    /// The default paths; IPv6 and DNS capture on (Istio's chart defaults).
    fn default() -> Self {
        AgentConfig {
            zds_socket: DEFAULT_ZDS_SOCKET.into(),
            events_socket: api::DEFAULT_AGENT_SOCKET.into(),
            state_dir: DEFAULT_STATE_DIR.into(),
            ipv6: true,
            dns_capture: true,
            zds_proxy_uid: None,
        }
    }
}

impl AgentConfig {
    /// The in-pod rule options this configuration implies.
    pub fn rule_options(&self) -> PodRuleOptions {
        PodRuleOptions {
            dns_capture: self.dns_capture,
            ipv6: self.ipv6,
            bypass_inbound: false,
        }
    }
}

/// Knobs beyond [`AgentConfig`], mostly for tests and demos.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The netns that gets the host probe rules and ipsets (`None`: the agent's own, which
    /// is the host's when the agent runs on the host).
    pub host_netns: Option<PathBuf>,
    /// The probe ipset names (Istio's by default).
    pub probe_sets: ProbeSetNames,
    /// ZDS timeouts.
    pub zds: ZdsOptions,
}

/// Runs the agent until `shutdown` completes. See the module docs.
pub async fn run(cfg: AgentConfig, shutdown: impl Future) -> anyhow::Result<()> {
    run_with(cfg, RunOptions::default(), shutdown).await
}

/// [`run`] with [`RunOptions`].
pub async fn run_with(
    cfg: AgentConfig,
    opts: RunOptions,
    shutdown: impl Future,
) -> anyhow::Result<()> {
    let agent = Agent::start(&cfg, &opts, None).await?;
    let listener = bind_events_socket(&cfg.events_socket)?;
    tracing::info!(
        events = %cfg.events_socket.display(),
        zds = %cfg.zds_socket.display(),
        pods = agent.store().len(),
        "node agent ready"
    );

    let mut handlers = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    handlers.spawn(serve_events_connection(agent.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "events socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = handlers.join_next(), if !handlers.is_empty() => {}
        }
    }

    tracing::info!("node agent shutting down (rules and ipsets stay in place)");
    drop(listener);
    handlers.shutdown().await;
    drop(agent);
    remove_socket_file(&cfg.events_socket);
    remove_socket_file(&cfg.zds_socket);
    Ok(())
}

/// Removes the host probe rules and destroys the probe ipsets: a full uninstall (never done
/// on a plain shutdown, so that an upgrade leaves no gap).
pub async fn uninstall_host(ipv6: bool, opts: &RunOptions) -> anyhow::Result<()> {
    let sets = ProbeSets::new(opts.probe_sets.clone(), opts.host_netns.clone(), ipv6);
    let netns = opts.host_netns.clone();
    let names = opts.probe_sets.clone();
    blocking(move || {
        iptables::remove_host(netns.as_deref(), ipv6, &names)?;
        sets.destroy()?;
        Ok(())
    })
    .await
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("blocking task panicked")?
}

async fn setup_host(sets: &ProbeSets, opts: &RunOptions, ipv6: bool) -> anyhow::Result<()> {
    let s = sets.clone();
    blocking(move || s.ensure().context("create the probe ipsets")).await?;
    let mut attempt = 1;
    loop {
        let netns = opts.host_netns.clone();
        let names = opts.probe_sets.clone();
        let result = blocking(move || {
            iptables::apply_host(netns.as_deref(), ipv6, &names)
                .context("install the host probe SNAT rules")
        })
        .await;
        match result {
            Ok(outcomes) => {
                tracing::info!(?outcomes, "host probe rules in place");
                return Ok(());
            }
            Err(e) if attempt < HOST_RULE_ATTEMPTS => {
                tracing::warn!(attempt, error = %format!("{e:#}"), "host rules failed; retrying");
                attempt += 1;
                tokio::time::sleep(HOST_RULE_RETRY).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether `path` is an existing network namespace.
pub(crate) fn netns_exists(path: &str) -> bool {
    !path.is_empty() && Netns::open(path).is_ok_and(|ns| ns.is_net_namespace())
}

/// The startup pass over the stored pods.
async fn reconcile_pods(
    store: PodStore,
    sets: ProbeSets,
    rule_opts: PodRuleOptions,
    reassert: bool,
) -> anyhow::Result<PodStore> {
    blocking(move || {
        let mut store = store;
        let (alive, gone): (Vec<PodInfo>, Vec<PodInfo>) =
            store.pods().cloned().partition(|p| netns_exists(&p.netns));
        for pod in &gone {
            tracing::info!(uid = %pod.uid, netns = %pod.netns, "netns gone while the agent was away; forgetting the pod");
            store.remove(&pod.uid).context("update the pod store")?;
        }
        for pod in alive.iter().filter(|_| reassert) {
            match iptables::apply_inpod(Path::new(&pod.netns), &rule_opts) {
                Ok(o) if o.unchanged() => {
                    tracing::debug!(uid = %pod.uid, "in-pod rules in place")
                }
                Ok(o) => tracing::info!(uid = %pod.uid, outcome = ?o, "in-pod rules repaired"),
                Err(e) => tracing::error!(uid = %pod.uid, error = %e, "cannot re-assert in-pod rules"),
            }
        }
        let members: Vec<(IpAddr, String)> = alive
            .iter()
            .flat_map(|p| p.ips.iter().map(|ip| (*ip, p.uid.clone())))
            .collect();
        let members = members.iter().map(|(ip, uid)| (*ip, uid.as_str()));
        if alive.iter().any(|p| p.ips.is_empty()) {
            // A pod whose IPs are not known yet may still own entries: add, do not prune
            // (Istio's rule, so a kubelet restart does not evict live pods' probes).
            for (ip, uid) in members {
                sets.add(ip, uid).context("refill the probe ipsets")?;
            }
        } else {
            sets.refill(members).context("refill the probe ipsets")?;
        }
        Ok(store)
    })
    .await
}

/// The events socket: 0600 from the moment it exists (bound under a private name, then
/// renamed), so no other user can slip in between bind and chmod; a missing directory is
/// created 0700.
fn bind_events_socket(path: &Path) -> anyhow::Result<UnixListener> {
    let listener = bind_private(path, |tmp| {
        let l = std::os::unix::net::UnixListener::bind(tmp)?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .with_context(|| format!("listen on the events socket {}", path.display()))?;
    UnixListener::from_std(listener)
        .with_context(|| format!("register the events socket {}", path.display()))
}

pub(crate) fn remove_socket_file(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

async fn serve_events_connection(agent: Arc<Agent>, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read).take(api::MAX_REQUEST_BYTES as u64 + 2);
    let mut line = Vec::new();
    let response =
        match tokio::time::timeout(REQUEST_TIMEOUT, reader.read_until(b'\n', &mut line)).await {
            Err(_) => AgentResponse::error(format!("no request within {REQUEST_TIMEOUT:?}")),
            Ok(Err(e)) => AgentResponse::error(format!("cannot read the request: {e}")),
            Ok(Ok(_)) => match api::parse_request(&line) {
                Ok(request) => agent.handle(request).await,
                Err(e) => AgentResponse::error(e.to_string()),
            },
        };
    if let Err(e) = write.write_all(&api::encode_response(&response)).await {
        tracing::debug!(error = %e, "client went away before the answer");
    }
    let _ = write.shutdown().await;
}

/// The enrollment machinery both front ends drive: the events socket and, in Kubernetes
/// mode, the controller and the plugin's `cmdadd` server.
pub(crate) struct Agent {
    rule_opts: PodRuleOptions,
    sets: ProbeSets,
    store: Mutex<PodStore>,
    zds: ZdsServer,
    /// One lock per pod UID, so that events for one pod are handled in order while different
    /// pods proceed in parallel.
    pod_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// How an add ended when the pod is captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProxyOutcome {
    /// The node proxy acked the pod.
    Took,
    /// No node proxy is connected: the pod fails closed until one connects.
    NoProxy,
}

/// Why an add failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AddError {
    /// The pod could not be captured (no netns, rules refused): retrying the same request
    /// will not help (Istio's non-retryable errors).
    #[error("{0:#}")]
    Capture(anyhow::Error),
    /// The ipsets or the store could not be updated: may be transient.
    #[error("{0:#}")]
    Host(anyhow::Error),
    /// The rules are in place but the node proxy refused the pod or did not answer.
    #[error("{0:#}")]
    Proxy(anyhow::Error),
}

impl AddError {
    pub(crate) fn retryable(&self) -> bool {
        !matches!(self, AddError::Capture(_))
    }
}

impl Agent {
    /// Host setup, the store (replaced by `snapshot` when given: Kubernetes mode rebuilds
    /// it from the API), the startup pass over the stored pods (rules re-asserted when
    /// `reassert`), then the ZDS server with those pods as its first snapshot.
    pub(crate) async fn start(
        cfg: &AgentConfig,
        opts: &RunOptions,
        snapshot: Option<(Vec<PodInfo>, bool)>,
    ) -> anyhow::Result<Arc<Agent>> {
        let sets = ProbeSets::new(opts.probe_sets.clone(), opts.host_netns.clone(), cfg.ipv6);
        setup_host(&sets, opts, cfg.ipv6).await?;

        let mut store = PodStore::open(&cfg.state_dir).context("load the enrolled pods")?;
        let reassert = match snapshot {
            None => true,
            Some((pods, reassert)) => {
                let stale: Vec<String> = store
                    .pods()
                    .filter(|p| !pods.iter().any(|s| s.uid == p.uid))
                    .map(|p| p.uid.clone())
                    .collect();
                for uid in stale {
                    store.remove(&uid).context("update the pod store")?;
                }
                for pod in pods {
                    store.upsert(pod).context("update the pod store")?;
                }
                reassert
            }
        };
        let store = reconcile_pods(store, sets.clone(), cfg.rule_options(), reassert).await?;

        let peers = PeerPolicy::new(cfg.zds_proxy_uid);
        let zds = ZdsServer::bind_with(&cfg.zds_socket, store.pods().cloned(), opts.zds, peers)
            .context("start the ZDS server")?;
        Ok(Arc::new(Agent {
            rule_opts: cfg.rule_options(),
            sets,
            store: Mutex::new(store),
            zds,
            pod_locks: Mutex::new(HashMap::new()),
        }))
    }

    /// The agent's record of `uid`.
    pub(crate) fn held(&self, uid: &str) -> Option<PodInfo> {
        self.store().get(uid).cloned()
    }

    /// Every pod held.
    pub(crate) fn held_pods(&self) -> Vec<PodInfo> {
        self.store().pods().cloned().collect()
    }

    /// The UIDs of every pod held.
    pub(crate) fn held_uids(&self) -> Vec<String> {
        self.store().pods().map(|p| p.uid.clone()).collect()
    }

    fn store(&self) -> MutexGuard<'_, PodStore> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn lock_pod(&self, uid: &str) -> PodLock<'_> {
        let lock = self
            .pod_locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid.to_owned())
            .or_default()
            .clone();
        let guard = lock.clone().lock_owned().await;
        PodLock {
            agent: self,
            uid: uid.to_owned(),
            lock,
            guard: Some(guard),
        }
    }

    async fn handle(&self, request: AgentRequest) -> AgentResponse {
        match request {
            AgentRequest::Add(pod) => match self.add(pod).await {
                Ok(_) => AgentResponse::ok(),
                Err(e) => AgentResponse::error(format!("{e:#}")),
            },
            AgentRequest::Remove { uid } => match self.remove(&uid).await {
                Ok(()) => AgentResponse::ok(),
                Err(e) => AgentResponse::error(format!("{e:#}")),
            },
            AgentRequest::Check { uid } => match self.store().get(&uid) {
                Some(pod) => AgentResponse::with_pods(vec![pod.clone()]),
                None => AgentResponse::error(format!("pod {uid} is not enrolled")),
            },
            AgentRequest::List => AgentResponse::with_pods(self.store().pods().cloned().collect()),
        }
    }

    /// Enrolls `pod` (idempotent). With no node proxy connected the pod is captured and
    /// `Ok(NoProxy)`; a NACK or a timeout is [`AddError::Proxy`].
    pub(crate) async fn add(&self, mut pod: PodInfo) -> Result<ProxyOutcome, AddError> {
        let capture = |m: String| AddError::Capture(anyhow::anyhow!(m));
        if pod.uid.is_empty() {
            return Err(capture("add: the pod uid is empty".into()));
        }
        if pod.netns.is_empty() {
            return Err(capture(format!("add: pod {} has no netns path", pod.uid)));
        }
        for ip in &mut pod.ips {
            *ip = unmap(*ip);
        }
        let _lock = self.lock_pod(&pod.uid).await;
        let uid = pod.uid.clone();
        if !netns_exists(&pod.netns) {
            return Err(capture(format!(
                "pod {uid}: {} is not a network namespace (sandbox gone?)",
                pod.netns
            )));
        }

        let (netns, opts) = (pod.netns.clone(), self.rule_opts);
        let outcome = blocking(move || {
            iptables::apply_inpod(Path::new(&netns), &opts).map_err(anyhow::Error::from)
        })
        .await
        .with_context(|| format!("pod {uid}: install the in-pod rules"))
        .map_err(AddError::Capture)?;
        tracing::info!(%uid, ?outcome, "in-pod rules in place");

        // IPs the pod had before (a re-added sandbox) and no longer has.
        let stale: Vec<IpAddr> = self
            .store()
            .get(&uid)
            .map(|old| {
                old.ips
                    .iter()
                    .filter(|ip| !pod.ips.contains(ip))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        let (sets, ips, u) = (self.sets.clone(), pod.ips.clone(), uid.clone());
        blocking(move || {
            for ip in stale {
                sets.remove(ip, &u)?;
            }
            for ip in ips {
                sets.add(ip, &u)?;
            }
            Ok(())
        })
        .await
        .with_context(|| format!("pod {uid}: update the probe ipsets"))
        .map_err(AddError::Host)?;

        self.store()
            .upsert(pod.clone())
            .with_context(|| format!("pod {uid}: persist"))
            .map_err(AddError::Host)?;

        match self.zds.add_pod(&pod).await {
            Ok(()) => {
                tracing::info!(%uid, name = %pod.name, namespace = %pod.namespace, "pod enrolled");
                Ok(ProxyOutcome::Took)
            }
            Err(ZdsError::NoProxy) => {
                tracing::warn!(
                    %uid,
                    "pod captured but no node proxy is connected: its traffic fails closed \
                     until a proxy connects and receives it in the snapshot"
                );
                Ok(ProxyOutcome::NoProxy)
            }
            Err(e) => Err(AddError::Proxy(anyhow::Error::new(e).context(format!(
                "pod {uid}: rules are in place but the node proxy did not take the pod"
            )))),
        }
    }

    /// Re-asserts the probe ipset entries of a held pod for `ips` (its IPs changed) and
    /// records them. Unknown pods are left alone.
    pub(crate) async fn sync_ipset(&self, uid: &str, ips: Vec<IpAddr>) -> anyhow::Result<()> {
        let _lock = self.lock_pod(uid).await;
        let Some(mut pod) = self.store().get(uid).cloned() else {
            return Ok(());
        };
        let ips: Vec<IpAddr> = ips.into_iter().map(unmap).collect();
        let stale: Vec<IpAddr> = pod
            .ips
            .iter()
            .filter(|ip| !ips.contains(ip))
            .copied()
            .collect();
        let (sets, add, u) = (self.sets.clone(), ips.clone(), uid.to_owned());
        blocking(move || {
            for ip in stale {
                sets.remove(ip, &u)?;
            }
            for ip in add {
                sets.add(ip, &u)?;
            }
            Ok(())
        })
        .await
        .with_context(|| format!("pod {uid}: re-sync the probe ipsets"))?;
        pod.ips = ips;
        self.store()
            .upsert(pod)
            .with_context(|| format!("pod {uid}: persist"))
    }

    /// Takes the pod out of the mesh (unknown pods are fine).
    pub(crate) async fn remove(&self, uid: &str) -> anyhow::Result<()> {
        let _lock = self.lock_pod(uid).await;
        let Some(pod) = self.store().get(uid).cloned() else {
            tracing::debug!(uid, "remove: pod not enrolled");
            return Ok(());
        };

        let (sets, ips, u) = (self.sets.clone(), pod.ips.clone(), uid.to_owned());
        if let Err(e) = blocking(move || {
            for ip in ips {
                sets.remove(ip, &u)?;
            }
            Ok(())
        })
        .await
        {
            tracing::warn!(uid, error = %format!("{e:#}"), "cannot remove the probe ipset entries");
        }

        if netns_exists(&pod.netns) {
            let (netns, opts) = (pod.netns.clone(), self.rule_opts);
            blocking(move || {
                iptables::remove_inpod(Path::new(&netns), &opts).map_err(anyhow::Error::from)
            })
            .await
            .with_context(|| format!("pod {uid}: remove the in-pod rules"))?;
        }

        if let Err(e) = self.zds.remove_pod(uid).await {
            tracing::warn!(uid, error = %e, "DelWorkload not acknowledged");
        }
        self.store()
            .remove(uid)
            .with_context(|| format!("pod {uid}: persist"))?;
        tracing::info!(uid, "pod removed from the mesh");
        Ok(())
    }
}

/// Holds a pod's lock; drops the map entry when nobody else is waiting for it.
struct PodLock<'a> {
    agent: &'a Agent,
    uid: String,
    lock: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for PodLock<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut locks = self
            .agent
            .pod_locks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Ours and the map's: nobody else holds or waits for it.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn events_socket_is_0600_in_a_new_0700_directory_and_replaces_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/istio-cni/pluginevent.sock");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        drop(bind_events_socket(&path).unwrap());
        let listener = bind_events_socket(&path).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.path().join("run/istio-cni")), 0o700);
        assert_eq!(mode(&dir.path().join("run")), 0o700);
        let (_client, accepted) = tokio::join!(UnixStream::connect(&path), listener.accept());
        accepted.unwrap();

        let file = dir.path().join("plain");
        std::fs::write(&file, b"keep").unwrap();
        let err = bind_events_socket(&file).unwrap_err();
        assert!(format!("{err:#}").contains("not a socket"), "{err:#}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    }
}
