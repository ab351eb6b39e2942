//! The agent side of ZDS (reference §3): node proxies connect to our `SOCK_SEQPACKET` socket,
//! say hello, get a snapshot of every enrolled pod (an `AddWorkload` with the pod's netns fd,
//! or a `KeepWorkload` when the netns cannot be opened), then `SnapshotSent`; after that,
//! adds and deletes go to the proxy being served.
//!
//! This module is the driver: sockets, the clock, the pod list and who is served. What is
//! said on one connection, and when, is decided by the sans-IO [`crate::zds_session`].
//!
//! Who may connect:
//! - The socket is created 0600 in a directory created 0700 ([`ZdsListener::bind`]), and
//!   every accepted peer is checked with `SO_PEERCRED` ([`PeerPolicy`]: uid 0, our own uid,
//!   or the configured node proxy uid); any other uid is closed at once, with a warning.
//! - **One node proxy is served at a time.** The first connection to say hello is served
//!   until it disconnects (or breaks the protocol, or stops acking). A second proxy that says
//!   hello meanwhile is closed before it is sent anything, with a warning naming both; it
//!   gets no pods, so it cannot take new pods from the one already running them. Node
//!   proxies reconnect with a backoff, so during an upgrade the new proxy is served (and
//!   gets the full snapshot) as soon as the old one exits. Istio's agent instead sends new
//!   pods to the newest connection, which lets any second client quietly take them over.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ambit_cni::api::PodInfo;
use ambit_zds::proto::WorkloadInfo;
use ambit_zds::{Netns, PeerCredentials, PeerPolicy, PeerRole, WireError, ZdsListener, ZdsSocket};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::zds_session::{
    CloseReason, Event, Request, RequestError, RequestId, Session, SessionOptions, SnapshotEntry,
};
pub use crate::zds_session::{ACK_TIMEOUT, MAX_OWED_ACKS};

/// Where node proxies connect unless configured otherwise (ztunnel's `INPOD_UDS` default).
pub const DEFAULT_ZDS_SOCKET: &str = ambit_wellknown::paths::ZDS_SOCKET;
/// Requests queued per connection.
const QUEUE_DEPTH: usize = 100;
/// Accept at most 5 connections per second (burst 1), as Istio's agent does.
const ACCEPT_INTERVAL: Duration = Duration::from_millis(200);

/// Timeouts of the server (tests shorten them).
#[derive(Clone, Copy, Debug)]
pub struct ZdsOptions {
    /// Time for the proxy's hello after it connects.
    pub hello_timeout: Duration,
    /// Time for each ack (and each write).
    pub ack_timeout: Duration,
}

impl Default for ZdsOptions {
    fn default() -> Self {
        ZdsOptions {
            hello_timeout: ACK_TIMEOUT,
            ack_timeout: ACK_TIMEOUT,
        }
    }
}

impl ZdsOptions {
    fn session(&self) -> SessionOptions {
        SessionOptions {
            hello_timeout: self.hello_timeout,
            ack_timeout: self.ack_timeout,
            max_owed_acks: MAX_OWED_ACKS,
        }
    }
}

/// Why a pod could not be handed to (or taken from) a node proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZdsError {
    /// No node proxy is served (or it went away before answering): nobody to tell. The pod
    /// is recorded and goes out in the next proxy's snapshot.
    #[error("no node proxy is connected to the ZDS socket")]
    NoProxy,
    /// The proxy answered with an error.
    #[error("the node proxy rejected the request: {0}")]
    Nack(String),
    /// The proxy did not ack in time (it may still be working on it).
    #[error("the node proxy did not acknowledge within {0:?}")]
    AckTimeout(Duration),
    /// The pod's netns could not be opened (it is needed for the fd).
    #[error("cannot open the network namespace of pod {uid} ({path}): {source}")]
    Netns {
        uid: String,
        path: String,
        #[source]
        source: io::Error,
    },
}

impl From<RequestError> for ZdsError {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::Nack(m) => ZdsError::Nack(m),
            RequestError::AckTimeout(d) => ZdsError::AckTimeout(d),
            // The pod stays recorded: the next proxy gets it in its snapshot.
            RequestError::Disconnected => ZdsError::NoProxy,
        }
    }
}

/// The `WorkloadInfo` of a pod.
pub fn workload_info(pod: &PodInfo) -> WorkloadInfo {
    WorkloadInfo {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        service_account: pod.service_account.clone(),
    }
}

/// One request for the served connection, with the channel its result goes back on.
struct Job {
    request: Request<Netns>,
    reply: oneshot::Sender<Result<(), RequestError>>,
}

/// The connection being served.
struct Served {
    id: u64,
    peer: PeerCredentials,
    tx: mpsc::Sender<Job>,
}

#[derive(Default)]
struct State {
    pods: BTreeMap<String, PodInfo>,
    served: Option<Served>,
    /// The pid last refused as a second proxy: its retries are logged at debug only.
    last_refused: Option<i32>,
}

struct Shared {
    state: Mutex<State>,
    opts: ZdsOptions,
    peer_policy: PeerPolicy,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The ZDS server: accepts node proxies and hands pods to the one it serves.
pub struct ZdsServer {
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
    path: PathBuf,
}

impl std::fmt::Debug for ZdsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZdsServer")
            .field("path", &self.path)
            .field("served", &self.served_proxy())
            .finish()
    }
}

impl ZdsServer {
    /// Listens at `path` (mode 0600; a missing directory is created 0700; a stale socket
    /// file is replaced) with the enrolled `pods` as the snapshot for the first proxy, and
    /// the default peer policy (root or our own uid). Must run inside a tokio runtime.
    /// Dropping the server stops it and closes every connection.
    pub fn bind(
        path: impl AsRef<Path>,
        pods: impl IntoIterator<Item = PodInfo>,
    ) -> io::Result<ZdsServer> {
        ZdsServer::bind_with(path, pods, ZdsOptions::default(), PeerPolicy::default())
    }

    /// [`ZdsServer::bind`] with explicit timeouts and the uids node proxies may run as.
    pub fn bind_with(
        path: impl AsRef<Path>,
        pods: impl IntoIterator<Item = PodInfo>,
        opts: ZdsOptions,
        peer_policy: PeerPolicy,
    ) -> io::Result<ZdsServer> {
        let path = path.as_ref().to_owned();
        let listener = ZdsListener::bind(&path)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pods: pods.into_iter().map(|p| (p.uid.clone(), p)).collect(),
                ..State::default()
            }),
            opts,
            peer_policy,
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        tracing::info!(path = %path.display(), "ZDS server listening");
        Ok(ZdsServer {
            shared,
            accept,
            path,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Node proxies served (0 or 1: one at a time).
    pub fn connected_proxies(&self) -> usize {
        usize::from(self.shared.lock().served.is_some())
    }

    /// Who the served node proxy is.
    pub fn served_proxy(&self) -> Option<PeerCredentials> {
        self.shared.lock().served.as_ref().map(|s| s.peer)
    }

    /// The UIDs of the pods the next snapshot will carry.
    pub fn pod_uids(&self) -> Vec<String> {
        self.shared.lock().pods.keys().cloned().collect()
    }

    /// Records `pod` (for future snapshots) and sends `AddWorkload` with its netns fd to the
    /// served proxy, waiting for the ack. [`ZdsError::NoProxy`] when none is served (or it
    /// leaves before answering); the pod is still recorded and will be in the next proxy's
    /// snapshot.
    pub async fn add_pod(&self, pod: &PodInfo) -> Result<(), ZdsError> {
        let netns = open_netns(pod).map_err(|source| ZdsError::Netns {
            uid: pod.uid.clone(),
            path: pod.netns.clone(),
            source,
        })?;
        let target = {
            let mut state = self.shared.lock();
            state.pods.insert(pod.uid.clone(), pod.clone());
            state.served.as_ref().map(|s| s.tx.clone())
        };
        let request = Request::Add {
            uid: pod.uid.clone(),
            info: workload_info(pod),
            netns,
        };
        ask(target, request).await
    }

    /// Forgets the pod and sends `DelWorkload` to the served proxy, waiting for its ack.
    /// With no proxy served (or one that leaves before answering) there is nobody to tell:
    /// `Ok`, and the next snapshot leaves the pod out.
    pub async fn remove_pod(&self, uid: &str) -> Result<(), ZdsError> {
        let target = {
            let mut state = self.shared.lock();
            state.pods.remove(uid);
            state.served.as_ref().map(|s| s.tx.clone())
        };
        match ask(
            target,
            Request::Del {
                uid: uid.to_owned(),
            },
        )
        .await
        {
            Err(ZdsError::NoProxy) => Ok(()),
            other => other,
        }
    }
}

/// Hands `request` to the served connection and waits for its outcome.
async fn ask(target: Option<mpsc::Sender<Job>>, request: Request<Netns>) -> Result<(), ZdsError> {
    let tx = target.ok_or(ZdsError::NoProxy)?;
    let (reply, answer) = oneshot::channel();
    tx.send(Job { request, reply })
        .await
        .map_err(|_| ZdsError::NoProxy)?;
    match answer.await {
        Ok(result) => result.map_err(ZdsError::from),
        // The connection ended with the request still queued.
        Err(_) => Err(ZdsError::NoProxy),
    }
}

impl Drop for ZdsServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Opens a pod's netns and checks it really is one (a leftover bind-mount target is a plain
/// file).
fn open_netns(pod: &PodInfo) -> io::Result<Netns> {
    let ns = Netns::open(&pod.netns)?;
    if !ns.is_net_namespace() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a network namespace", pod.netns),
        ));
    }
    Ok(ns)
}

/// The snapshot entry of a pod: `Add` with its netns, or `Keep` when it cannot be opened.
fn snapshot_entry(conn: u64, pod: &PodInfo) -> SnapshotEntry<Netns> {
    match open_netns(pod) {
        Ok(netns) => SnapshotEntry::Add {
            uid: pod.uid.clone(),
            info: workload_info(pod),
            netns,
        },
        Err(e) => {
            tracing::info!(conn, uid = %pod.uid, error = %e, "netns not found; sending KeepWorkload");
            SnapshotEntry::Keep {
                uid: pod.uid.clone(),
            }
        }
    }
}

async fn accept_loop(listener: ZdsListener, shared: Arc<Shared>) {
    // Owning the connection tasks here means aborting this task stops them all.
    let mut tasks = tokio::task::JoinSet::new();
    let mut next_id = 0u64;
    loop {
        while tasks.try_join_next().is_some() {}
        let sock = match listener.accept().await {
            Ok(sock) => sock,
            Err(e) => {
                tracing::warn!(error = %e, "ZDS accept failed");
                tokio::time::sleep(ACCEPT_INTERVAL).await;
                continue;
            }
        };
        next_id += 1;
        let checked = sock.peer_credentials().and_then(|peer| {
            shared
                .peer_policy
                .check(PeerRole::NodeProxy, peer)
                .map(|()| peer)
                .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))
        });
        match checked {
            Ok(peer) => {
                tracing::info!(conn = next_id, %peer, "node proxy connected");
                tasks.spawn(serve_connection(shared.clone(), sock, next_id, peer));
            }
            Err(e) => {
                tracing::warn!(conn = next_id, "closing a ZDS connection: {e}");
                drop(sock);
            }
        }
        tokio::time::sleep(ACCEPT_INTERVAL).await;
    }
}

/// Stops serving the connection when its task ends, however it ends.
struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        if state.served.as_ref().is_some_and(|s| s.id == self.id) {
            state.served = None;
            state.last_refused = None;
        }
        tracing::info!(conn = self.id, "served node proxy connection closed");
    }
}

async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

/// Drives one connection's [`Session`]: events first (the hello is answered with the
/// one-proxy rule and the snapshot), then one datagram out, then wait for the socket, a
/// request or the session's deadline.
async fn serve_connection(shared: Arc<Shared>, sock: ZdsSocket, id: u64, peer: PeerCredentials) {
    let (tx, mut rx) = mpsc::channel::<Job>(QUEUE_DEPTH);
    let mut tx = Some(tx);
    let mut session: Session<Netns> =
        Session::new(shared.opts.session(), std::time::Instant::now());
    let mut replies: HashMap<RequestId, oneshot::Sender<Result<(), RequestError>>> = HashMap::new();
    let mut _registration = None;
    loop {
        while let Some(event) = session.poll_event() {
            match event {
                Event::Hello { version } => {
                    // Decide and take the snapshot under one lock: a pod added concurrently
                    // is either in the snapshot or queued for this connection, never missed.
                    let mut state = shared.lock();
                    if let Some(served) = &state.served {
                        let served = format!("{}", served.peer);
                        let repeat = state.last_refused == Some(peer.pid);
                        state.last_refused = Some(peer.pid);
                        drop(state);
                        let reason = CloseReason::AnotherProxyServed { served };
                        if repeat {
                            tracing::debug!(conn = id, %peer, "refused again: {reason}");
                        } else {
                            tracing::warn!(conn = id, %peer, "refusing a node proxy: {reason}");
                        }
                        session.close(reason);
                        continue;
                    }
                    let Some(tx) = tx.take() else { continue };
                    state.served = Some(Served { id, peer, tx });
                    let pods: Vec<PodInfo> = state.pods.values().cloned().collect();
                    drop(state);
                    _registration = Some(Registration {
                        shared: shared.clone(),
                        id,
                    });
                    tracing::info!(
                        conn = id,
                        version,
                        pods = pods.len(),
                        "node proxy said hello; sending the snapshot"
                    );
                    session.begin_snapshot(pods.iter().map(|p| snapshot_entry(id, p)));
                }
                Event::SnapshotEntryFailed { kind, uid, error } => {
                    tracing::warn!(
                        conn = id,
                        uid = uid.as_deref().unwrap_or(""),
                        "snapshot {kind} failed: {error}"
                    )
                }
                Event::SnapshotDone { entries, failed } => {
                    tracing::info!(conn = id, pods = entries, failed, "snapshot sent")
                }
                Event::Done { id: rid, result } => {
                    if let Err(e) = &result {
                        tracing::warn!(conn = id, "ZDS request failed: {e}");
                    }
                    if let Some(reply) = replies.remove(&rid) {
                        let _ = reply.send(result);
                    }
                }
                Event::LateAck { error } => {
                    tracing::debug!(
                        conn = id,
                        ?error,
                        "late ack for an earlier timed-out request"
                    )
                }
                Event::Closed(CloseReason::PeerClosed) => {
                    tracing::info!(conn = id, "node proxy disconnected");
                    return;
                }
                Event::Closed(CloseReason::AnotherProxyServed { .. }) => return,
                Event::Closed(reason) => {
                    tracing::warn!(conn = id, "dropping the ZDS connection: {reason}");
                    return;
                }
            }
        }
        if let Some(out) = session.poll_transmit(std::time::Instant::now()) {
            let send = sock.send(&out.bytes, out.fd.as_ref().map(|n| n.as_fd()));
            let sent = tokio::time::timeout(shared.opts.ack_timeout, send).await;
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(e)) => session.close(CloseReason::Transport(format!(
                    "cannot send {}: {e}",
                    out.kind
                ))),
                Err(_) => session.close(CloseReason::Transport(format!(
                    "sending {} timed out after {:?}",
                    out.kind, shared.opts.ack_timeout
                ))),
            }
            continue;
        }
        let deadline = session.poll_timeout();
        tokio::select! {
            received = sock.recv() => match received {
                // A ZDS client never sends fds; dropping them closes them.
                Ok((bytes, _fds)) => session.on_datagram(&bytes),
                Err(WireError::PeerClosed) => session.on_peer_closed(),
                Err(e) => session.close(CloseReason::Transport(e.to_string())),
            },
            job = rx.recv() => match job {
                Some(job) => {
                    let rid = session.submit(job.request);
                    replies.insert(rid, job.reply);
                }
                None => session.close(CloseReason::Shutdown),
            },
            () = sleep_until(deadline) => session.on_timeout(std::time::Instant::now()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_zds::protocol::{decode_request, encode_ack, encode_hello};
    use ambit_zds::Incoming;
    use tokio::time::Instant;

    /// The test's own netns: openable without privileges.
    const SELF_NETNS: &str = "/proc/self/ns/net";

    fn pod(uid: &str, netns: &str) -> PodInfo {
        PodInfo {
            uid: uid.into(),
            name: format!("name-{uid}"),
            namespace: "ns".into(),
            service_account: "sa".into(),
            netns: netns.into(),
            ips: vec!["10.0.0.1".parse().unwrap()],
            container_id: String::new(),
        }
    }

    fn fast() -> ZdsOptions {
        ZdsOptions {
            hello_timeout: Duration::from_millis(500),
            ack_timeout: Duration::from_millis(300),
        }
    }

    /// A node proxy played by the test.
    struct FakeProxy {
        sock: ZdsSocket,
    }

    impl FakeProxy {
        async fn connect(path: &Path) -> FakeProxy {
            let sock = ZdsSocket::connect(path).await.unwrap();
            sock.send(&encode_hello(), None).await.unwrap();
            FakeProxy { sock }
        }

        async fn recv(&self) -> Incoming {
            let (bytes, fds) = tokio::time::timeout(Duration::from_secs(5), self.sock.recv())
                .await
                .expect("nothing from the agent within 5 s")
                .unwrap();
            decode_request(&bytes, fds).unwrap()
        }

        async fn ack(&self) {
            self.sock.send(&encode_ack(None), None).await.unwrap();
        }

        async fn nack(&self, msg: &str) {
            self.sock.send(&encode_ack(Some(msg)), None).await.unwrap();
        }

        /// Receives the whole snapshot, acking everything; returns (kind, uid) in order.
        async fn take_snapshot(&self) -> Vec<(&'static str, String)> {
            let mut seen = Vec::new();
            loop {
                let msg = self.recv().await;
                let entry = (msg.kind(), msg.uid().unwrap_or_default().to_owned());
                if let Incoming::Add { netns, .. } = &msg {
                    let ns = Netns::from_fd(netns.try_clone().unwrap()).unwrap();
                    assert!(ns.is_net_namespace(), "AddWorkload fd is not a netns");
                }
                self.ack().await;
                seen.push(entry);
                if matches!(msg, Incoming::SnapshotSent) {
                    return seen;
                }
            }
        }

        async fn assert_silent(&self) {
            let r = tokio::time::timeout(Duration::from_millis(100), self.sock.recv()).await;
            assert!(r.is_err(), "unexpected message: {r:?}");
        }
    }

    async fn wait_for_proxies(server: &ZdsServer, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.connected_proxies() != n {
            assert!(
                Instant::now() < deadline,
                "expected {n} proxies, have {}",
                server.connected_proxies()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn snapshot_with_fd_and_keep_then_snapshot_sent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ztunnel.sock");
        let server = ZdsServer::bind_with(
            &path,
            [pod("a", SELF_NETNS), pod("b", "/nonexistent/netns")],
            fast(),
            PeerPolicy::default(),
        )
        .unwrap();
        assert_eq!(server.connected_proxies(), 0);

        let proxy = FakeProxy::connect(&path).await;
        let first = proxy.recv().await;
        match &first {
            Incoming::Add { uid, info, netns } => {
                assert_eq!(uid, "a");
                assert_eq!(info, &workload_info(&pod("a", SELF_NETNS)));
                let ns = Netns::from_fd(netns.try_clone().unwrap()).unwrap();
                assert_eq!(ns.id(), Netns::open(SELF_NETNS).unwrap().id());
            }
            other => panic!("expected AddWorkload, got {other:?}"),
        }
        // A NACK during the snapshot is logged and the snapshot goes on.
        proxy.nack("cannot start a proxy for a").await;
        let rest = proxy.take_snapshot().await;
        assert_eq!(
            rest,
            [
                ("KeepWorkload", "b".into()),
                ("SnapshotSent", String::new())
            ]
        );
        wait_for_proxies(&server, 1).await;
        proxy.assert_silent().await;

        drop(proxy);
        wait_for_proxies(&server, 0).await;
    }

    #[tokio::test]
    async fn socket_is_0600_in_a_new_0700_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel/ztunnel.sock");
        let _server = ZdsServer::bind(&path, []).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.path().join("ztunnel")), 0o700);
    }

    #[tokio::test]
    async fn one_proxy_is_served_a_second_is_refused_until_the_first_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel.sock");
        let server =
            Arc::new(ZdsServer::bind_with(&path, [], fast(), PeerPolicy::default()).unwrap());

        // Nobody connected: NoProxy, but the pod is remembered for the snapshot.
        let err = server.add_pod(&pod("early", SELF_NETNS)).await.unwrap_err();
        assert!(matches!(err, ZdsError::NoProxy), "{err}");
        server.remove_pod("nobody").await.unwrap();

        let first = FakeProxy::connect(&path).await;
        assert_eq!(
            first.take_snapshot().await,
            [
                ("AddWorkload", "early".into()),
                ("SnapshotSent", String::new())
            ]
        );
        wait_for_proxies(&server, 1).await;
        assert_eq!(
            server.served_proxy().map(|p| p.pid),
            Some(std::process::id() as i32)
        );

        // A second proxy says hello: it is closed without a single message.
        let second = FakeProxy::connect(&path).await;
        let r = tokio::time::timeout(Duration::from_secs(5), second.sock.recv()).await;
        assert!(matches!(r, Ok(Err(WireError::PeerClosed))), "{r:?}");
        assert_eq!(server.connected_proxies(), 1);

        // New pods still go to the first one; its ack is the result.
        let s = server.clone();
        let add = tokio::spawn(async move { s.add_pod(&pod("p1", SELF_NETNS)).await });
        match first.recv().await {
            Incoming::Add { uid, .. } => assert_eq!(uid, "p1"),
            other => panic!("expected AddWorkload, got {other:?}"),
        }
        first.ack().await;
        add.await.unwrap().unwrap();

        // A NACK is the caller's error.
        let s = server.clone();
        let add = tokio::spawn(async move { s.add_pod(&pod("p2", SELF_NETNS)).await });
        assert_eq!(first.recv().await.uid(), Some("p2"));
        first.nack("no room").await;
        let err = add.await.unwrap().unwrap_err();
        assert!(matches!(&err, ZdsError::Nack(m) if m == "no room"), "{err}");

        // Delete: the served proxy hears it.
        let s = server.clone();
        let del = tokio::spawn(async move { s.remove_pod("p1").await });
        match first.recv().await {
            Incoming::Del { uid } => assert_eq!(uid, "p1"),
            other => panic!("expected DelWorkload, got {other:?}"),
        }
        first.ack().await;
        del.await.unwrap().unwrap();

        // The first leaves: the next proxy to connect is served, with the whole snapshot.
        drop(first);
        wait_for_proxies(&server, 0).await;
        let next = FakeProxy::connect(&path).await;
        assert_eq!(
            next.take_snapshot().await,
            [
                ("AddWorkload", "early".into()),
                ("AddWorkload", "p2".into()),
                ("SnapshotSent", String::new())
            ]
        );
        wait_for_proxies(&server, 1).await;
        let s = server.clone();
        let add = tokio::spawn(async move { s.add_pod(&pod("p3", SELF_NETNS)).await });
        assert_eq!(next.recv().await.uid(), Some("p3"));
        next.ack().await;
        add.await.unwrap().unwrap();

        assert_eq!(server.pod_uids(), ["early", "p2", "p3"]);
    }

    #[tokio::test]
    async fn a_proxy_that_has_not_said_hello_does_not_block_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel.sock");
        let opts = ZdsOptions {
            hello_timeout: Duration::from_secs(5),
            ..fast()
        };
        let server = ZdsServer::bind_with(&path, [], opts, PeerPolicy::default()).unwrap();
        let start = Instant::now();
        let silent = ZdsSocket::connect(&path).await.unwrap();
        let proxy = FakeProxy::connect(&path).await;
        proxy.take_snapshot().await;
        wait_for_proxies(&server, 1).await;
        // The silent one says hello late: the served one keeps its place.
        silent.send(&encode_hello(), None).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), silent.recv()).await;
        assert!(matches!(r, Ok(Err(WireError::PeerClosed))), "{r:?}");
        assert!(
            start.elapsed() < opts.hello_timeout,
            "closed by the hello timeout, not refused"
        );
        assert_eq!(server.connected_proxies(), 1);
    }

    #[tokio::test]
    async fn ack_timeout_is_reported_and_late_acks_are_not_misattributed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel.sock");
        let server =
            Arc::new(ZdsServer::bind_with(&path, [], fast(), PeerPolicy::default()).unwrap());
        let proxy = FakeProxy::connect(&path).await;
        proxy.take_snapshot().await;
        wait_for_proxies(&server, 1).await;

        // The proxy never answers the first add in time.
        let slow = pod("slow", SELF_NETNS);
        let err = tokio::join!(server.add_pod(&slow), proxy.recv())
            .0
            .unwrap_err();
        assert!(matches!(err, ZdsError::AckTimeout(_)), "{err}");

        // Its late NACK must not be taken for the answer to the next request.
        proxy.nack("late answer to slow").await;
        let s = server.clone();
        let add = tokio::spawn(async move { s.add_pod(&pod("next", SELF_NETNS)).await });
        assert_eq!(proxy.recv().await.uid(), Some("next"));
        proxy.ack().await;
        add.await.unwrap().unwrap();
        assert_eq!(server.connected_proxies(), 1);
    }

    #[tokio::test]
    async fn unsolicited_messages_and_missing_hello_drop_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel.sock");
        let server = ZdsServer::bind_with(&path, [], fast(), PeerPolicy::default()).unwrap();
        let proxy = FakeProxy::connect(&path).await;
        proxy.take_snapshot().await;
        wait_for_proxies(&server, 1).await;
        proxy.ack().await;
        wait_for_proxies(&server, 0).await;

        // A proxy that never says hello is never registered and gets closed.
        let silent = ZdsSocket::connect(&path).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), silent.recv()).await;
        assert!(matches!(r, Ok(Err(WireError::PeerClosed))), "{r:?}");
        assert_eq!(server.connected_proxies(), 0);
    }

    #[tokio::test]
    async fn add_with_a_missing_netns_fails_before_sending() {
        let dir = tempfile::tempdir().unwrap();
        let server =
            ZdsServer::bind_with(dir.path().join("z.sock"), [], fast(), PeerPolicy::default())
                .unwrap();
        let err = server
            .add_pod(&pod("x", "/nonexistent/netns"))
            .await
            .unwrap_err();
        assert!(matches!(err, ZdsError::Netns { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/netns"), "{err}");
        let file = dir.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        let err = server
            .add_pod(&pod("y", file.to_str().unwrap()))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not a network namespace"), "{err}");
    }
}
