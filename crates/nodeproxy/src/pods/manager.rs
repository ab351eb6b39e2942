//! The ZDS client: connects to the node agent, follows its snapshot and updates, and keeps
//! one running proxy per announced pod.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_zds::protocol::{decode_request, encode_ack, encode_hello};
use ambit_zds::state::RETRY_INTERVAL;
use ambit_zds::{Action, PeerPolicy, WireError, WorkloadStates, ZdsSocket};

use crate::connections::OpenConnections;
use ambit_runtime::drain::DrainWatcher;

use super::factory::{PodProxyFactory, RunningPod};
use super::metrics::InpodMetrics;

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The agent broke the protocol in a way that leaves our view of the pods unreliable.
    #[error("node agent protocol error: {0}; restart the node agent and the node proxy")]
    Protocol(String),
}

/// One pod as `/config_dump` shows it under `workloadState`: its state, who it is, and the
/// connections it has open when the dump is read.
#[derive(Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodDump {
    pub state: &'static str,
    pub info: PodInfoDump,
    #[serde(serialize_with = "serialize_connections")]
    pub connections: Option<Arc<OpenConnections>>,
}

/// A pending pod has none: empty lists, as ztunnel shows them.
fn serialize_connections<S: serde::Serializer>(
    c: &Option<Arc<OpenConnections>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    match c {
        Some(c) => c.dump().serialize(s),
        None => OpenConnections::default().dump().serialize(s),
    }
}

impl std::fmt::Debug for PodDump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodDump")
            .field("state", &self.state)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInfoDump {
    pub name: String,
    pub namespace: String,
    pub service_account: String,
}

pub type WorkloadStateDump = Arc<Mutex<BTreeMap<String, PodDump>>>;

pub struct WorkloadManager {
    uds: PathBuf,
    factory: PodProxyFactory,
    metrics: InpodMetrics,
    states: WorkloadStates,
    pods: HashMap<String, RunningPod>,
    dump: WorkloadStateDump,
    on_ready: Box<dyn Fn(bool) + Send + Sync>,
    drain_deadline: Duration,
    /// Who may be the agent at the other end (`SO_PEERCRED`).
    peer_policy: PeerPolicy,
}

enum StreamEnd {
    Disconnected(String),
    /// We hung up on a message we could not read: the agent will likely send it again, so
    /// the next connection waits a growing delay instead of starting a tight loop.
    Unreadable(String),
    /// The agent hung up before sending anything: most likely it serves another node proxy
    /// (ambit's agent serves one at a time). Retried with a growing delay.
    ClosedBeforeSnapshot,
    Shutdown,
}

const BACKOFF_START: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(15);

impl WorkloadManager {
    pub fn new(
        uds: PathBuf,
        factory: PodProxyFactory,
        metrics: InpodMetrics,
        on_ready: Box<dyn Fn(bool) + Send + Sync>,
        drain_deadline: Duration,
    ) -> WorkloadManager {
        WorkloadManager {
            uds,
            factory,
            metrics,
            states: WorkloadStates::new(),
            pods: HashMap::new(),
            dump: WorkloadStateDump::default(),
            on_ready,
            drain_deadline,
            peer_policy: PeerPolicy::default(),
        }
    }

    /// The uids the node agent may run as (default: root or our own uid).
    pub fn with_peer_policy(mut self, policy: PeerPolicy) -> WorkloadManager {
        self.peer_policy = policy;
        self
    }

    pub fn dump_handle(&self) -> WorkloadStateDump {
        self.dump.clone()
    }

    /// Runs until draining starts (then stops every pod's proxy gracefully) or the agent
    /// breaks the protocol.
    pub async fn run(mut self, drain: DrainWatcher) -> Result<(), ManagerError> {
        let mut backoff = BACKOFF_START;
        let mut unreadable_backoff = BACKOFF_START;
        let result = loop {
            (self.on_ready)(false);
            let connected = tokio::select! {
                _ = drain.draining() => break Ok(()),
                c = self.connect() => c,
            };
            let socket = match connected {
                Ok(s) => {
                    backoff = BACKOFF_START;
                    s
                }
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    // A listener run by a uid we do not trust, or a socket we may not open:
                    // never quiet, an operator has to fix it.
                    tracing::warn!(uds = %self.uds.display(), "not talking to the node agent: {e}; retrying in {backoff:?}");
                    tokio::select! {
                        _ = drain.draining() => break Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
                Err(e) => {
                    tracing::debug!(uds = %self.uds.display(), "node agent not reachable: {e}; retrying in {backoff:?}");
                    tokio::select! {
                        _ = drain.draining() => break Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            };
            tracing::info!(uds = %self.uds.display(), "connected to the node agent");
            self.states.on_connect();
            self.publish();
            match self.serve(&socket, &drain).await {
                Ok(StreamEnd::Shutdown) => break Ok(()),
                Ok(StreamEnd::Disconnected(why)) => {
                    unreadable_backoff = BACKOFF_START;
                    tracing::warn!("node agent connection ended: {why}; reconnecting");
                }
                Ok(StreamEnd::ClosedBeforeSnapshot) => {
                    tracing::warn!(
                        "the node agent closed the connection before sending anything: another \
                         node proxy is probably connected to it (the agent serves one at a \
                         time, see its log); retrying in {unreadable_backoff:?}"
                    );
                    tokio::select! {
                        _ = drain.draining() => break Ok(()),
                        _ = tokio::time::sleep(unreadable_backoff) => {}
                    }
                    unreadable_backoff = (unreadable_backoff * 2).min(BACKOFF_MAX);
                }
                Ok(StreamEnd::Unreadable(why)) => {
                    tracing::warn!(
                        "node agent connection ended: {why}; reconnecting in {unreadable_backoff:?}"
                    );
                    tokio::select! {
                        _ = drain.draining() => break Ok(()),
                        _ = tokio::time::sleep(unreadable_backoff) => {}
                    }
                    unreadable_backoff = (unreadable_backoff * 2).min(BACKOFF_MAX);
                }
                Err(e) => break Err(e),
            }
        };
        (self.on_ready)(false);
        let deadline = self.drain_deadline;
        let stops = self
            .pods
            .drain()
            .map(|(_, pod)| pod.stop_gracefully(deadline));
        futures_join_all(stops).await;
        result
    }

    async fn connect(&self) -> std::io::Result<ZdsSocket> {
        let socket = ZdsSocket::connect_to_agent(&self.uds, &self.peer_policy).await?;
        socket.send(&encode_hello(), None).await?;
        Ok(socket)
    }

    async fn serve(
        &mut self,
        socket: &ZdsSocket,
        drain: &DrainWatcher,
    ) -> Result<StreamEnd, ManagerError> {
        let mut retry = tokio::time::interval(RETRY_INTERVAL);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        retry.tick().await;
        let mut received_any = false;
        loop {
            let received = tokio::select! {
                _ = drain.draining() => return Ok(StreamEnd::Shutdown),
                _ = retry.tick() => {
                    let actions = self.states.retry_pending();
                    if !actions.is_empty() {
                        let errors = self.apply(actions).await;
                        for e in errors {
                            tracing::warn!("retrying pod proxy: {e}");
                        }
                        self.publish();
                    }
                    continue;
                }
                r = socket.recv() => r,
            };
            let (bytes, fds) = match received {
                Ok(m) => m,
                Err(WireError::PeerClosed) if !received_any => {
                    return Ok(StreamEnd::ClosedBeforeSnapshot)
                }
                Err(WireError::PeerClosed) => {
                    return Ok(StreamEnd::Disconnected(
                        "the agent closed the connection".into(),
                    ))
                }
                Err(e) => {
                    // Unreadable datagram: say so, then start over with a fresh snapshot.
                    let _ = socket.send(&encode_ack(Some(&e.to_string())), None).await;
                    return Ok(StreamEnd::Unreadable(format!("unreadable message: {e}")));
                }
            };
            received_any = true;
            let reply = match decode_request(&bytes, fds) {
                Err(e @ ambit_zds::ProtocolError::MissingWorkloadInfo { .. }) => {
                    // An Add that cannot name its workload: ztunnel treats it as fatal.
                    let _ = socket.send(&encode_ack(Some(&e.to_string())), None).await;
                    return Err(ManagerError::Protocol(e.to_string()));
                }
                Err(e) => {
                    // Unreadable (a bad protobuf, a missing or unexpected fd): NACK, then
                    // start over with a fresh snapshot, as ztunnel does.
                    tracing::warn!("malformed message from the node agent: {e}");
                    let _ = socket.send(&encode_ack(Some(&e.to_string())), None).await;
                    return Ok(StreamEnd::Unreadable(format!("malformed message: {e}")));
                }
                Ok(msg) => {
                    tracing::debug!(kind = msg.kind(), uid = ?msg.uid(), "node agent message");
                    match self.states.on_message(msg) {
                        Err(e) if e.is_fatal() => {
                            let _ = socket.send(&encode_ack(Some(&e.to_string())), None).await;
                            return Err(ManagerError::Protocol(e.to_string()));
                        }
                        Err(e) => Some(e.to_string()),
                        Ok(actions) => {
                            let errors = self.apply(actions).await;
                            (!errors.is_empty()).then(|| errors.join("; "))
                        }
                    }
                }
            };
            self.publish();
            if let Err(e) = socket.send(&encode_ack(reply.as_deref()), None).await {
                return Ok(StreamEnd::Disconnected(format!(
                    "cannot answer the agent: {e}"
                )));
            }
        }
    }

    /// Carries out start/stop actions; returns the start failures (the pods go pending).
    async fn apply(&mut self, actions: Vec<Action>) -> Vec<String> {
        let mut errors = Vec::new();
        for action in actions {
            match action {
                Action::Stop { uid } => {
                    if let Some(pod) = self.pods.remove(&uid) {
                        tracing::info!(%uid, pod = %pod.info.name, "stopping pod proxy");
                        self.metrics.proxies_stopped.inc();
                        // The last pod with this identity is gone: stop renewing its cert.
                        if !self.pods.values().any(|p| p.identity == pod.identity) {
                            self.factory.certs.forget(&pod.identity);
                        }
                        tokio::spawn(pod.stop_now());
                    }
                }
                Action::Start { uid, info, netns } => match self.factory.start(&info, netns) {
                    Ok(pod) => {
                        tracing::info!(%uid, pod = %info.name, namespace = %info.namespace, "pod proxy started");
                        self.metrics.proxies_started.inc();
                        self.states.on_start_result(&uid, true);
                        if let Some(old) = self.pods.insert(uid, pod) {
                            tokio::spawn(old.stop_now());
                        }
                    }
                    Err(e) => {
                        tracing::warn!(%uid, pod = %info.name, "failure to start proxy: {e}");
                        self.states.on_start_result(&uid, false);
                        errors.push(format!("failure to start proxy : {e}"));
                    }
                },
            }
        }
        errors
    }

    /// Updates metrics, readiness and the admin view after every change.
    fn publish(&self) {
        self.metrics.active_proxy_count.set(self.pods.len() as i64);
        self.metrics
            .pending_proxy_count
            .set(self.states.pending_count() as i64);
        (self.on_ready)(self.states.is_ready());
        let mut dump = self.dump.lock().unwrap_or_else(|p| p.into_inner());
        dump.clear();
        for (uid, pod) in &self.pods {
            dump.insert(
                uid.clone(),
                pod_dump("Up", &pod.info, Some(pod.connections.clone())),
            );
        }
        for (uid, info) in self.states.pending() {
            dump.entry(uid.to_string())
                .or_insert_with(|| pod_dump("Pending", info, None));
        }
    }
}

fn pod_dump(
    state: &'static str,
    info: &ambit_zds::proto::WorkloadInfo,
    connections: Option<Arc<OpenConnections>>,
) -> PodDump {
    PodDump {
        state,
        connections,
        info: PodInfoDump {
            name: info.name.clone(),
            namespace: info.namespace.clone(),
            service_account: info.service_account.clone(),
        },
    }
}

async fn futures_join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    futures: impl Iterator<Item = F>,
) {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    for h in handles {
        let _ = h.await;
    }
}
