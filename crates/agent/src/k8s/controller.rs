//! The Kubernetes controller: the startup snapshot, the two watches, the work queue's
//! worker, and the enroll/remove steps with their annotation patches (reference §1.3–§1.7).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ambit_cni::api::PodInfo;
use ambit_k8s::annotation::{set_redirection, Redirection};
use ambit_k8s::enablement::namespace_labels;
use ambit_k8s::k8s_openapi::api::core::v1::{Namespace, Pod};
use anyhow::Context as _;
use futures_util::StreamExt as _;
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use kube::Api;
use tokio::sync::{mpsc, Notify};

use super::metrics::Metrics;
use super::pods;
use super::procscan;
use super::queue::WorkQueue;
use super::reconcile::{decide, namespace_changed, Action, Held, PodView, Presence};
use super::settings::K8sConfig;
use crate::agent::{blocking, netns_exists, AddError, Agent, ProxyOutcome};
use crate::iptables::ProbeSetNames;
use crate::zds::ZdsOptions;
use crate::{AgentConfig, RunOptions};

/// Test knobs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The probe ipset names (Istio's by default).
    pub probe_sets: ProbeSetNames,
    /// ZDS timeouts.
    pub zds: ZdsOptions,
}

/// Reconciles running at once (each waits for at most one node proxy ack).
const MAX_IN_FLIGHT: usize = 16;
/// Cache look-ups of the plugin's pod, for a cache that lags the API server (Istio: 10 × 10 ms).
const PLUGIN_LOOKUP_ATTEMPTS: u32 = 10;
const PLUGIN_LOOKUP_INTERVAL: Duration = Duration::from_millis(10);

/// Labels of a namespace.
type Labels = BTreeMap<String, String>;

struct Entry {
    view: PodView,
    deleted: bool,
}

#[derive(Default)]
struct Cache {
    pods: HashMap<String, Entry>,
    by_name: HashMap<(String, String), String>,
    namespaces: HashMap<String, BTreeMap<String, String>>,
    /// UIDs listed since the pod watch (re)started; `None` outside a re-list.
    relist_pods: Option<HashSet<String>>,
    relist_ns: Option<HashSet<String>>,
    pods_synced: bool,
    ns_synced: bool,
}

pub(crate) struct Controller {
    cfg: K8sConfig,
    client: kube::Client,
    pub(crate) agent: Arc<Agent>,
    pub(crate) metrics: Arc<Metrics>,
    cache: Mutex<Cache>,
    queue: Mutex<WorkQueue<String>>,
    wake: Notify,
}

/// A failed reconcile step.
#[derive(Debug)]
pub(crate) struct StepError {
    pub retryable: bool,
    pub message: String,
}

impl StepError {
    fn retry(message: impl Into<String>) -> StepError {
        StepError {
            retryable: true,
            message: message.into(),
        }
    }
}

/// The controller, started: the pods of the startup snapshot enrolled and served over ZDS.
pub(crate) async fn start(
    cfg: K8sConfig,
    client: kube::Client,
    metrics: Arc<Metrics>,
    opts: Options,
) -> anyhow::Result<Arc<Controller>> {
    let snapshot = startup_snapshot(&cfg, &client).await?;
    let agent_cfg = AgentConfig {
        zds_socket: cfg.zds_socket.clone(),
        events_socket: Default::default(),
        state_dir: cfg.state_dir.clone(),
        ipv6: cfg.ipv6,
        dns_capture: cfg.dns_capture,
        zds_proxy_uid: cfg.zds_proxy_uid,
    };
    let run_opts = RunOptions {
        host_netns: cfg.host_netns.clone(),
        probe_sets: opts.probe_sets.clone(),
        zds: opts.zds,
    };
    let agent = Agent::start(
        &agent_cfg,
        &run_opts,
        Some((snapshot, cfg.reconcile_on_startup)),
    )
    .await?;
    metrics.set_enrolled(agent.held_uids().len());
    Ok(Arc::new(Controller {
        cfg,
        client,
        agent,
        metrics,
        cache: Mutex::new(Cache::default()),
        queue: Mutex::new(WorkQueue::default()),
        wake: Notify::new(),
    }))
}

/// Watches and reconciles until `shutdown`, beside `tasks` (the plugin's server), then
/// stops them and removes the sockets (rules and ipsets stay in place).
pub(crate) async fn serve(
    ctl: Arc<Controller>,
    synced: Arc<AtomicBool>,
    mut tasks: tokio::task::JoinSet<()>,
    shutdown: impl Future,
) -> anyhow::Result<()> {
    tasks.spawn(watch_pods(ctl.clone(), synced.clone()));
    tasks.spawn(watch_namespaces(ctl.clone(), synced.clone()));
    tracing::info!(
        node = %ctl.cfg.node_name,
        plugin = %ctl.cfg.plugin_socket().display(),
        zds = %ctl.cfg.zds_socket.display(),
        pods = ctl.agent.held_uids().len(),
        "node agent running in Kubernetes mode"
    );

    worker(ctl.clone(), shutdown).await;

    tracing::info!("node agent shutting down (rules and ipsets stay in place)");
    tasks.shutdown().await;
    crate::agent::remove_socket_file(&ctl.cfg.plugin_socket());
    crate::agent::remove_socket_file(&ctl.cfg.zds_socket);
    Ok(())
}

/// The pods on this node annotated `enabled` (not terminal, not ztunnel), with their netns
/// from `/proc`. Pods whose netns is not found are left out (the reconcile adds them once
/// found).
async fn startup_snapshot(cfg: &K8sConfig, client: &kube::Client) -> anyhow::Result<Vec<PodInfo>> {
    let api: Api<Pod> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", cfg.node_name)))
        .await
        .with_context(|| {
            format!(
                "list the pods on node {} (the agent needs list/watch on pods)",
                cfg.node_name
            )
        })?;
    let views: Vec<PodView> = list
        .items
        .iter()
        .filter_map(|p| pods::view(p, cfg))
        .filter(|v| v.annotation == Some(Redirection::Enabled) && !v.terminal && !v.ztunnel)
        .collect();
    let wanted: HashMap<String, Vec<IpAddr>> = views
        .iter()
        .map(|v| (v.uid.clone(), v.ips.clone()))
        .collect();
    let root = cfg.proc_root.clone();
    let found = blocking(move || {
        procscan::scan(&root, &wanted, procscan::netns_holds_ip)
            .with_context(|| format!("scan {} for pod network namespaces", root.display()))
    })
    .await?;
    let mut out = Vec::new();
    for v in views {
        match found.get(&v.uid) {
            Some(f) => out.push(pod_info(&v, v.ips.clone(), f.netns.display().to_string())),
            None => tracing::warn!(
                uid = %v.uid, pod = %format!("{}/{}", v.namespace, v.name),
                "pod annotated enabled but its netns is not in /proc (no IP yet, or gone); \
                 it is left out of the snapshot and retried by the reconcile"
            ),
        }
    }
    tracing::info!(pods = out.len(), "startup snapshot");
    Ok(out)
}

fn pod_info(v: &PodView, ips: Vec<IpAddr>, netns: String) -> PodInfo {
    PodInfo {
        uid: v.uid.clone(),
        name: v.name.clone(),
        namespace: v.namespace.clone(),
        service_account: v.service_account.clone(),
        netns,
        ips,
        container_id: String::new(),
    }
}

impl Controller {
    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enqueue(&self, uids: impl IntoIterator<Item = String>) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        for uid in uids {
            q.add(uid);
        }
        self.metrics.set_pending(q.pending());
        drop(q);
        self.wake.notify_one();
    }

    fn record(&self, pod: &Pod) -> Option<String> {
        let view = pods::view(pod, &self.cfg)?;
        let uid = view.uid.clone();
        let mut c = self.cache();
        c.by_name
            .insert((view.namespace.clone(), view.name.clone()), uid.clone());
        c.pods.insert(
            uid.clone(),
            Entry {
                view,
                deleted: false,
            },
        );
        Some(uid)
    }

    fn mark_deleted(&self, pod: &Pod) -> Option<String> {
        let fresh = pods::view(pod, &self.cfg);
        let uid = fresh.as_ref().map(|v| v.uid.clone())?;
        let mut c = self.cache();
        let view = match (fresh, c.pods.remove(&uid)) {
            // The cached one may carry IPs a terminal status dropped.
            (Some(mut v), Some(old)) if v.ips.is_empty() => {
                v.ips = old.view.ips;
                v
            }
            (Some(v), _) => v,
            (None, _) => return None,
        };
        let key = (view.namespace.clone(), view.name.clone());
        if c.by_name.get(&key) == Some(&uid) {
            c.by_name.remove(&key);
        }
        c.pods.insert(
            uid.clone(),
            Entry {
                view,
                deleted: true,
            },
        );
        Some(uid)
    }

    /// The pod's view and its namespace's labels, as cached.
    fn lookup(&self, uid: &str) -> Option<(PodView, bool, Option<Labels>)> {
        let c = self.cache();
        let e = c.pods.get(uid)?;
        let ns = c.namespaces.get(&e.view.namespace).cloned();
        Some((e.view.clone(), e.deleted, ns))
    }

    pub(crate) fn lookup_by_name(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<(PodView, Option<Labels>)> {
        let c = self.cache();
        let uid = c.by_name.get(&(namespace.to_owned(), name.to_owned()))?;
        let e = c.pods.get(uid).filter(|e| !e.deleted)?;
        Some((e.view.clone(), c.namespaces.get(namespace).cloned()))
    }

    /// Looks the plugin's pod up, waiting briefly for a lagging cache.
    pub(crate) async fn wait_for_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<(PodView, Option<Labels>)> {
        for attempt in 0..PLUGIN_LOOKUP_ATTEMPTS {
            if let Some(found) = self.lookup_by_name(namespace, name) {
                if found.1.is_some() {
                    return Some(found);
                }
            }
            if attempt + 1 < PLUGIN_LOOKUP_ATTEMPTS {
                tokio::time::sleep(PLUGIN_LOOKUP_INTERVAL).await;
            }
        }
        self.lookup_by_name(namespace, name)
    }

    pub(crate) fn enablement(&self) -> &ambit_k8s::Enablement {
        &self.cfg.enablement
    }

    pub(crate) fn config(&self) -> &K8sConfig {
        &self.cfg
    }

    /// Another live pod (`namespace/name`, or the UID of one only the agent still holds)
    /// that has `ip`: in the API server's view (not deleted, not terminal), or in the
    /// agent's records.
    pub(crate) fn ip_owner(&self, ip: IpAddr, except_uid: &str) -> Option<String> {
        let from_api = self
            .cache()
            .pods
            .iter()
            .find(|(uid, e)| {
                uid.as_str() != except_uid
                    && !e.deleted
                    && !e.view.terminal
                    && e.view.ips.contains(&ip)
            })
            .map(|(_, e)| format!("{}/{}", e.view.namespace, e.view.name));
        from_api.or_else(|| {
            self.agent
                .held_pods()
                .into_iter()
                .find(|p| p.uid != except_uid && p.ips.contains(&ip))
                .map(|p| format!("{}/{}", p.namespace, p.name))
        })
    }

    /// `<host root>` + the CNI netns path, as Istio opens it from inside its pod.
    pub(crate) fn host_path(&self, cni_netns: &str) -> String {
        let rel = cni_netns.trim_start_matches('/');
        self.cfg.host_root.join(rel).display().to_string()
    }

    /// One reconcile of `uid`.
    async fn reconcile(&self, uid: &str) -> Result<(), StepError> {
        let Some((view, deleted, ns)) = self.lookup(uid) else {
            return Ok(());
        };
        let held = self.agent.held(uid);
        let presence = if deleted {
            Presence::Deleted(&view)
        } else {
            Presence::Present(&view, ns.as_ref())
        };
        let action = decide(
            presence,
            &self.cfg.enablement,
            held.as_ref().map(|p| Held { ips: &p.ips }),
        );
        let pod = format!("{}/{}", view.namespace, view.name);
        tracing::debug!(%uid, %pod, ?action, "reconcile");
        let result = match action {
            Action::Nothing(_) => Ok(()),
            Action::SyncIpset { ips } => self
                .agent
                .sync_ipset(uid, ips)
                .await
                .map_err(|e| StepError::retry(format!("{e:#}"))),
            Action::Remove { deleting } => self.remove(&view, deleting, deleted).await,
            Action::Add { ips } => self.enroll(&view, ips, None).await,
        };
        if result.is_ok() && deleted {
            let mut c = self.cache();
            if c.pods.get(uid).is_some_and(|e| e.deleted) {
                c.pods.remove(uid);
            }
        }
        self.metrics.set_enrolled(self.agent.held_uids().len());
        result
    }

    async fn remove(&self, view: &PodView, deleting: bool, gone: bool) -> Result<(), StepError> {
        self.agent
            .remove(&view.uid)
            .await
            .map_err(|e| StepError::retry(format!("{e:#}")))?;
        // A pod gone from the API has no annotation to clear.
        if gone || view.annotation.is_none() {
            return Ok(());
        }
        match self.annotate(view, None).await {
            Ok(()) => Ok(()),
            Err(e) if deleting => {
                tracing::debug!(pod = %view.name, error = %e, "annotation of a terminating pod not removed");
                Ok(())
            }
            Err(e) => Err(StepError::retry(e)),
        }
    }

    /// Enrolls the pod and writes the annotation (`enabled`, or `pending` when the node
    /// proxy did not take it: the rules stay and its traffic fails closed; retried).
    /// `netns` is the host path of the CNI netns; `None`: the agent's record or `/proc`.
    pub(crate) async fn enroll(
        &self,
        view: &PodView,
        ips: Vec<IpAddr>,
        netns: Option<String>,
    ) -> Result<(), StepError> {
        let pod = format!("{}/{}", view.namespace, view.name);
        let netns = match netns {
            Some(n) => n,
            None => self.find_netns(view, &ips).await?,
        };
        let outcome = self.agent.add(pod_info(view, ips, netns)).await;
        let (want, err) = match outcome {
            Ok(ProxyOutcome::Took) => (Redirection::Enabled, None),
            Ok(ProxyOutcome::NoProxy) => (
                Redirection::Pending,
                Some(format!(
                    "pod {pod}: captured, but no node proxy (ztunnel) is connected; traffic fails closed until one takes it"
                )),
            ),
            Err(e @ AddError::Proxy(_)) => (Redirection::Pending, Some(e.to_string())),
            Err(e) => {
                return Err(StepError {
                    retryable: e.retryable(),
                    message: e.to_string(),
                })
            }
        };
        if view.annotation != Some(want) {
            self.annotate(view, Some(want))
                .await
                .map_err(StepError::retry)?;
        }
        match err {
            None => Ok(()),
            Some(e) => Err(StepError::retry(e)),
        }
    }

    async fn find_netns(&self, view: &PodView, ips: &[IpAddr]) -> Result<String, StepError> {
        if let Some(held) = self.agent.held(&view.uid) {
            if netns_exists(&held.netns) {
                return Ok(held.netns);
            }
        }
        let wanted = HashMap::from([(view.uid.clone(), ips.to_vec())]);
        let root = self.cfg.proc_root.clone();
        let found = blocking(move || {
            procscan::scan(&root, &wanted, procscan::netns_holds_ip).map_err(anyhow::Error::from)
        })
        .await
        .map_err(|e| StepError::retry(format!("scan /proc: {e:#}")))?;
        found
            .get(&view.uid)
            .map(|f| f.netns.display().to_string())
            .ok_or_else(|| {
                StepError::retry(format!(
                    "pod {}/{}: no process in {} is in a netns holding {ips:?} yet",
                    view.namespace,
                    view.name,
                    self.cfg.proc_root.display()
                ))
            })
    }

    /// Patches the redirection annotation on `pods/status`; errors name the pod and, for
    /// a refusal, the permission the agent's ServiceAccount lacks.
    async fn annotate(&self, view: &PodView, state: Option<Redirection>) -> Result<(), String> {
        match set_redirection(&self.client, &view.namespace, &view.name, state).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 403 => Err(format!(
                "cannot set the annotation {} on pod {}/{}: forbidden: the agent's service account \
                 needs `patch` on `pods/status` (ClusterRole istio-cni): {}",
                ambit_k8s::labels::REDIRECTION_ANNOTATION,
                view.namespace,
                view.name,
                s.message
            )),
            Err(e) => Err(format!(
                "cannot set the annotation {} on pod {}/{}: {e}",
                ambit_k8s::labels::REDIRECTION_ANNOTATION,
                view.namespace,
                view.name
            )),
        }
    }

    /// Queues a pod for another reconcile (the plugin path after a pending add).
    pub(crate) fn requeue(&self, uid: &str) {
        self.enqueue([uid.to_owned()]);
    }
}

async fn worker(ctl: Arc<Controller>, shutdown: impl Future) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, Result<(), StepError>)>();
    let mut in_flight = 0usize;
    tokio::pin!(shutdown);
    loop {
        let due = {
            let mut q = ctl.queue.lock().unwrap_or_else(|e| e.into_inner());
            while in_flight < MAX_IN_FLIGHT {
                let Some(uid) = q.pop(Instant::now()) else {
                    break;
                };
                in_flight += 1;
                let (ctl, tx) = (ctl.clone(), tx.clone());
                tokio::spawn(async move {
                    let r = ctl.reconcile(&uid).await;
                    let _ = tx.send((uid, r));
                });
            }
            q.next_due()
        };
        let sleep = async {
            match due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut shutdown => return,
            _ = ctl.wake.notified() => {}
            _ = sleep => {}
            Some((uid, result)) = rx.recv() => {
                in_flight -= 1;
                let mut q = ctl.queue.lock().unwrap_or_else(|e| e.into_inner());
                let counted = match result {
                    Ok(()) => {
                        q.done(&uid);
                        "ok"
                    }
                    Err(e) if e.retryable => {
                        let n = q.failures(&uid) + 1;
                        // Log the first failure and then every tenth: retries are forever.
                        if n == 1 || n.is_multiple_of(10) {
                            tracing::warn!(%uid, attempt = n, error = %e.message, "reconcile failed; retrying");
                        }
                        q.retry(&uid, Instant::now());
                        "retry"
                    }
                    Err(e) => {
                        tracing::error!(%uid, error = %e.message, "reconcile failed and cannot succeed by retrying; dropped");
                        q.done(&uid);
                        "dropped"
                    }
                };
                ctl.metrics.reconciled(counted);
                // Under the queue's lock, so the gauge never shows an older state.
                ctl.metrics.set_pending(q.pending());
            }
        }
    }
}

fn mark_synced(ctl: &Controller, synced: &AtomicBool) {
    let c = ctl.cache();
    if c.pods_synced && c.ns_synced && !synced.swap(true, Ordering::SeqCst) {
        tracing::info!("pod and namespace watches synced");
    }
}

async fn watch_pods(ctl: Arc<Controller>, synced: Arc<AtomicBool>) {
    let api: Api<Pod> = Api::all(ctl.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", ctl.cfg.node_name));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => ctl.cache().relist_pods = Some(HashSet::new()),
            Ok(Event::InitApply(pod)) => {
                if let Some(uid) = ctl.record(&pod) {
                    if let Some(seen) = ctl.cache().relist_pods.as_mut() {
                        seen.insert(uid.clone());
                    }
                    ctl.enqueue([uid]);
                }
            }
            Ok(Event::InitDone) => {
                // Pods that vanished while the watch was down were deleted: no Delete
                // event will come for them.
                let gone: Vec<String> = {
                    let mut c = ctl.cache();
                    let seen = c.relist_pods.take().unwrap_or_default();
                    let gone: Vec<String> = c
                        .pods
                        .iter()
                        .filter(|(uid, e)| !e.deleted && !seen.contains(*uid))
                        .map(|(uid, _)| uid.clone())
                        .collect();
                    for uid in &gone {
                        if let Some(e) = c.pods.get_mut(uid) {
                            e.deleted = true;
                        }
                    }
                    c.pods_synced = true;
                    gone
                };
                // Pods the agent holds that the API no longer lists at all.
                let held: Vec<String> = {
                    let c = ctl.cache();
                    ctl.agent
                        .held_uids()
                        .into_iter()
                        .filter(|u| !c.pods.contains_key(u))
                        .collect()
                };
                for uid in &held {
                    tracing::info!(%uid, "held pod is not on this node any more; removing");
                }
                ctl.enqueue(gone);
                for uid in held {
                    let (ctl2, uid2) = (ctl.clone(), uid.clone());
                    tokio::spawn(async move {
                        if let Err(e) = ctl2.agent.remove(&uid2).await {
                            tracing::warn!(uid = %uid2, error = %format!("{e:#}"), "cannot remove a pod gone from the API");
                        }
                    });
                }
                mark_synced(&ctl, &synced);
            }
            // Each event is counted once its pod is queued (see `metrics`).
            Ok(Event::Apply(pod)) => {
                if let Some(uid) = ctl.record(&pod) {
                    ctl.enqueue([uid]);
                }
                ctl.metrics.reconcile_event("update");
            }
            Ok(Event::Delete(pod)) => {
                if let Some(uid) = ctl.mark_deleted(&pod) {
                    ctl.enqueue([uid]);
                }
                ctl.metrics.reconcile_event("delete");
            }
            Err(e) => tracing::warn!(error = %e, "pod watch failed; it restarts with backoff"),
        }
    }
}

async fn watch_namespaces(ctl: Arc<Controller>, synced: Arc<AtomicBool>) {
    let api: Api<Namespace> = Api::all(ctl.client.clone());
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => ctl.cache().relist_ns = Some(HashSet::new()),
            Ok(Event::InitApply(ns)) | Ok(Event::Apply(ns)) => {
                let Some(name) = ns.metadata.name.clone() else {
                    continue;
                };
                let labels = namespace_labels(&ns);
                let pods: Vec<String> = {
                    let mut c = ctl.cache();
                    if let Some(seen) = c.relist_ns.as_mut() {
                        seen.insert(name.clone());
                    }
                    let old = c.namespaces.insert(name.clone(), labels.clone());
                    if !namespace_changed(&ctl.cfg.enablement, old.as_ref(), &labels) {
                        continue;
                    }
                    c.pods
                        .iter()
                        .filter(|(_, e)| e.view.namespace == name && !e.view.ztunnel)
                        .map(|(uid, _)| uid.clone())
                        .collect()
                };
                ctl.enqueue(pods);
                ctl.metrics.reconcile_event("namespace");
            }
            Ok(Event::InitDone) => {
                {
                    let mut c = ctl.cache();
                    let seen = c.relist_ns.take().unwrap_or_default();
                    c.namespaces.retain(|n, _| seen.contains(n));
                    c.ns_synced = true;
                }
                mark_synced(&ctl, &synced);
            }
            Ok(Event::Delete(ns)) => {
                if let Some(name) = ns.metadata.name.as_deref() {
                    ctl.cache().namespaces.remove(name);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "namespace watch failed; it restarts with backoff")
            }
        }
    }
}
