//! The agent side of ZDS (reference §3): node proxies connect to our `SOCK_SEQPACKET` socket,
//! say hello, get a snapshot of every enrolled pod (an `AddWorkload` with the pod's netns fd,
//! or a `KeepWorkload` when the netns cannot be opened), then `SnapshotSent`; after that,
//! adds go to the newest connection and deletes to all of them.
//!
//! Acks are correlated with requests only by order, so one task per connection serializes
//! everything sent on it (requests queue on an mpsc channel) and waits for each ack
//! ([`ACK_TIMEOUT`]). Unlike Istio's agent, a timed-out request is not forgotten: its ack is
//! still owed, and the next ack(s) that arrive are matched to the timed-out requests first,
//! so a late ack is never taken for the answer to a later request. A connection that owes
//! more than [`MAX_OWED_ACKS`] acks is dropped (the proxy reconnects and resyncs from a new
//! snapshot). While idle, the task keeps reading: end-of-stream means the proxy is gone,
//! and an unsolicited message is a protocol error that drops the connection.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ambit_cni::api::PodInfo;
use ambit_inpod::proto::WorkloadInfo;
use ambit_inpod::protocol::{
    decode_hello, decode_response, encode_add, encode_del, encode_keep, encode_snapshot_sent,
};
use ambit_inpod::{Netns, ProtocolError, WireError, ZdsListener, ZdsSocket};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Where node proxies connect unless configured otherwise (ztunnel's `INPOD_UDS` default).
pub const DEFAULT_ZDS_SOCKET: &str = ambit_wellknown::paths::ZDS_SOCKET;
/// How long a proxy has to send its hello, and to ack each message.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection owing more acks than this (timed-out requests) is dropped.
pub const MAX_OWED_ACKS: usize = 3;
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

/// Why a pod could not be handed to (or taken from) a node proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZdsError {
    /// No node proxy is connected: nobody to tell.
    #[error("no node proxy is connected to the ZDS socket")]
    NoProxy,
    /// The proxy answered with an error.
    #[error("the node proxy rejected the request: {0}")]
    Nack(String),
    /// The proxy did not ack in time (it may still be working on it).
    #[error("the node proxy did not acknowledge within {0:?}")]
    AckTimeout(Duration),
    /// The proxy's connection went away before it answered.
    #[error("the node proxy disconnected before answering")]
    Disconnected,
    /// The pod's netns could not be opened (it is needed for the fd).
    #[error("cannot open the network namespace of pod {uid} ({path}): {source}")]
    Netns {
        uid: String,
        path: String,
        #[source]
        source: io::Error,
    },
    /// The socket failed.
    #[error("ZDS connection error: {0}")]
    Wire(#[from] WireError),
    /// The proxy answered something that is not a `WorkloadResponse`.
    #[error("ZDS protocol error: {0}")]
    Protocol(#[from] ProtocolError),
}

impl ZdsError {
    /// Whether the connection must be dropped after this error.
    fn is_fatal(&self) -> bool {
        matches!(
            self,
            ZdsError::Disconnected | ZdsError::Wire(_) | ZdsError::Protocol(_)
        )
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

/// One message for one connection, with the channel its result goes back on.
struct Request {
    what: &'static str,
    uid: String,
    bytes: Vec<u8>,
    netns: Option<Netns>,
    reply: oneshot::Sender<Result<(), ZdsError>>,
}

struct ConnHandle {
    id: u64,
    tx: mpsc::Sender<Request>,
}

#[derive(Default)]
struct State {
    pods: BTreeMap<String, PodInfo>,
    /// Connections that said hello, oldest first.
    conns: Vec<ConnHandle>,
}

struct Shared {
    state: Mutex<State>,
    opts: ZdsOptions,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The ZDS server: accepts node proxies and hands them pods.
pub struct ZdsServer {
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
    path: PathBuf,
}

impl std::fmt::Debug for ZdsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZdsServer")
            .field("path", &self.path)
            .field("connected_proxies", &self.connected_proxies())
            .finish()
    }
}

impl ZdsServer {
    /// Listens at `path` (creating its directory; a stale socket file is replaced) with the
    /// enrolled `pods` as the snapshot for the first proxies. Must run inside a tokio
    /// runtime. Dropping the server stops it and closes every connection.
    pub fn bind(
        path: impl AsRef<Path>,
        pods: impl IntoIterator<Item = PodInfo>,
    ) -> io::Result<ZdsServer> {
        ZdsServer::bind_with(path, pods, ZdsOptions::default())
    }

    /// [`ZdsServer::bind`] with explicit timeouts.
    pub fn bind_with(
        path: impl AsRef<Path>,
        pods: impl IntoIterator<Item = PodInfo>,
        opts: ZdsOptions,
    ) -> io::Result<ZdsServer> {
        let path = path.as_ref().to_owned();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("create ZDS socket directory {}: {e}", dir.display()),
                )
            })?;
        }
        let listener = ZdsListener::bind(&path)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pods: pods.into_iter().map(|p| (p.uid.clone(), p)).collect(),
                conns: Vec::new(),
            }),
            opts,
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

    /// Node proxies connected (that said hello).
    pub fn connected_proxies(&self) -> usize {
        self.shared.lock().conns.len()
    }

    /// The UIDs of the pods the next snapshot will carry.
    pub fn pod_uids(&self) -> Vec<String> {
        self.shared.lock().pods.keys().cloned().collect()
    }

    /// Records `pod` (for future snapshots) and sends `AddWorkload` with its netns fd to the
    /// newest connected proxy, waiting for the ack. If that connection goes away before
    /// answering, the next newest is tried. [`ZdsError::NoProxy`] when none is connected;
    /// the pod is still recorded and will be in the next proxy's snapshot.
    pub async fn add_pod(&self, pod: &PodInfo) -> Result<(), ZdsError> {
        let netns = open_netns(pod).map_err(|source| ZdsError::Netns {
            uid: pod.uid.clone(),
            path: pod.netns.clone(),
            source,
        })?;
        let bytes = encode_add(&pod.uid, &workload_info(pod));
        let targets: Vec<mpsc::Sender<Request>> = {
            let mut state = self.shared.lock();
            state.pods.insert(pod.uid.clone(), pod.clone());
            state.conns.iter().rev().map(|c| c.tx.clone()).collect()
        };
        for tx in targets {
            let (reply, answer) = oneshot::channel();
            let request = Request {
                what: "AddWorkload",
                uid: pod.uid.clone(),
                bytes: bytes.clone(),
                netns: Some(netns.try_clone().map_err(|source| ZdsError::Netns {
                    uid: pod.uid.clone(),
                    path: pod.netns.clone(),
                    source,
                })?),
                reply,
            };
            if tx.send(request).await.is_err() {
                continue;
            }
            match answer.await {
                Ok(Err(ZdsError::Disconnected)) | Err(_) => continue,
                Ok(result) => return result,
            }
        }
        Err(ZdsError::NoProxy)
    }

    /// Forgets the pod and sends `DelWorkload` to every connected proxy, waiting for all
    /// acks. With no proxy connected there is nobody to tell: `Ok`. Otherwise the first
    /// failure is returned (the others are logged).
    pub async fn remove_pod(&self, uid: &str) -> Result<(), ZdsError> {
        let targets: Vec<mpsc::Sender<Request>> = {
            let mut state = self.shared.lock();
            state.pods.remove(uid);
            state.conns.iter().map(|c| c.tx.clone()).collect()
        };
        let bytes = encode_del(uid);
        let mut answers = Vec::new();
        for tx in targets {
            let (reply, answer) = oneshot::channel();
            let request = Request {
                what: "DelWorkload",
                uid: uid.to_owned(),
                bytes: bytes.clone(),
                netns: None,
                reply,
            };
            if tx.send(request).await.is_ok() {
                answers.push(answer);
            }
        }
        let mut first_err = None;
        for answer in answers {
            match answer.await {
                Ok(Ok(())) | Err(_) | Ok(Err(ZdsError::Disconnected)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(uid, error = %e, "DelWorkload failed on one node proxy");
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
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
        tracing::info!(conn = next_id, "node proxy connected");
        tasks.spawn(serve_connection(shared.clone(), sock, next_id));
        tokio::time::sleep(ACCEPT_INTERVAL).await;
    }
}

/// Removes the connection from the list when its task ends, however it ends.
struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.conns.retain(|c| c.id != self.id);
        tracing::info!(
            conn = self.id,
            remaining = state.conns.len(),
            "node proxy connection closed"
        );
    }
}

struct Conn {
    sock: ZdsSocket,
    id: u64,
    /// Acks still owed for requests that timed out.
    owed: usize,
    ack_timeout: Duration,
}

impl Conn {
    /// Sends one message and waits for its ack (after the acks owed for earlier timeouts).
    async fn exchange(&mut self, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> Result<(), ZdsError> {
        let deadline = Instant::now() + self.ack_timeout;
        match tokio::time::timeout_at(deadline, self.sock.send(bytes, fd)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => {
                return Err(ZdsError::Disconnected)
            }
            Ok(Err(e)) => return Err(ZdsError::Wire(WireError::Io(e))),
            Err(_) => {
                return Err(ZdsError::Wire(WireError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "write timed out",
                ))))
            }
        }
        loop {
            let received = match tokio::time::timeout_at(deadline, self.sock.recv()).await {
                Err(_) => {
                    self.owed += 1;
                    return Err(ZdsError::AckTimeout(self.ack_timeout));
                }
                Ok(Err(WireError::PeerClosed)) => return Err(ZdsError::Disconnected),
                Ok(Err(e)) => return Err(ZdsError::Wire(e)),
                Ok(Ok((bytes, _fds))) => decode_response(&bytes)?,
            };
            if self.owed > 0 {
                self.owed -= 1;
                tracing::debug!(conn = self.id, "late ack for an earlier timed-out request");
                continue;
            }
            return received.map_err(ZdsError::Nack);
        }
    }
}

async fn serve_connection(shared: Arc<Shared>, sock: ZdsSocket, id: u64) {
    let opts = shared.opts;
    match tokio::time::timeout(opts.hello_timeout, sock.recv()).await {
        Ok(Ok((bytes, _fds))) => match decode_hello(&bytes) {
            Ok(hello) => {
                tracing::info!(conn = id, version = hello.version, "node proxy said hello")
            }
            Err(e) => {
                tracing::warn!(conn = id, error = %e, "bad ZDS hello; dropping the connection");
                return;
            }
        },
        Ok(Err(e)) => {
            tracing::warn!(conn = id, error = %e, "no ZDS hello; dropping the connection");
            return;
        }
        Err(_) => {
            tracing::warn!(
                conn = id,
                "no ZDS hello within {:?}; dropping the connection",
                opts.hello_timeout
            );
            return;
        }
    }

    // Register and take the snapshot under one lock: a pod added concurrently is either in
    // the snapshot or queued for this connection (after the snapshot), never missed.
    let (tx, mut rx) = mpsc::channel::<Request>(QUEUE_DEPTH);
    let snapshot: Vec<PodInfo> = {
        let mut state = shared.lock();
        state.conns.push(ConnHandle { id, tx });
        state.pods.values().cloned().collect()
    };
    let _registration = Registration {
        shared: shared.clone(),
        id,
    };
    let mut conn = Conn {
        sock,
        id,
        owed: 0,
        ack_timeout: opts.ack_timeout,
    };

    for pod in &snapshot {
        let (what, bytes, netns) = match open_netns(pod) {
            Ok(ns) => (
                "AddWorkload",
                encode_add(&pod.uid, &workload_info(pod)),
                Some(ns),
            ),
            Err(e) => {
                tracing::info!(conn = id, uid = %pod.uid, error = %e, "netns not found; sending KeepWorkload");
                ("KeepWorkload", encode_keep(&pod.uid), None)
            }
        };
        match conn
            .exchange(&bytes, netns.as_ref().map(|n| n.as_fd()))
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_fatal() || conn.owed > MAX_OWED_ACKS => {
                tracing::warn!(conn = id, uid = %pod.uid, error = %e, "snapshot {what} failed; dropping the connection");
                return;
            }
            Err(e) => {
                tracing::warn!(conn = id, uid = %pod.uid, error = %e, "snapshot {what} not acknowledged")
            }
        }
    }
    match conn.exchange(&encode_snapshot_sent(), None).await {
        Ok(()) => tracing::info!(conn = id, pods = snapshot.len(), "snapshot sent"),
        Err(e) if e.is_fatal() => {
            tracing::warn!(conn = id, error = %e, "SnapshotSent failed; dropping the connection");
            return;
        }
        Err(e) => tracing::warn!(conn = id, error = %e, "SnapshotSent not acknowledged"),
    }

    loop {
        tokio::select! {
            request = rx.recv() => {
                let Some(request) = request else { return };
                let result = conn
                    .exchange(&request.bytes, request.netns.as_ref().map(|n| n.as_fd()))
                    .await;
                let fatal = result.as_ref().is_err_and(ZdsError::is_fatal);
                if let Err(e) = &result {
                    tracing::warn!(conn = id, uid = %request.uid, error = %e, "{} failed", request.what);
                }
                let _ = request.reply.send(result);
                if fatal {
                    return;
                }
                if conn.owed > MAX_OWED_ACKS {
                    tracing::warn!(conn = id, owed = conn.owed, "node proxy stopped acknowledging; dropping the connection");
                    return;
                }
            }
            received = conn.sock.recv() => match received {
                Err(WireError::PeerClosed) => return,
                Err(e) => {
                    tracing::warn!(conn = id, error = %e, "ZDS connection error");
                    return;
                }
                Ok((bytes, _fds)) if conn.owed > 0 && decode_response(&bytes).is_ok() => {
                    conn.owed -= 1;
                    tracing::debug!(conn = id, "late ack for an earlier timed-out request");
                }
                Ok(_) => {
                    tracing::warn!(conn = id, "unsolicited message from the node proxy (protocol error); dropping the connection");
                    return;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_inpod::protocol::{decode_request, encode_ack, encode_hello};
    use ambit_inpod::Incoming;

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
    async fn adds_go_to_the_newest_deletes_to_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel.sock");
        let server = Arc::new(ZdsServer::bind_with(&path, [], fast()).unwrap());

        // Nobody connected: NoProxy, but the pod is remembered for the snapshot.
        let err = server.add_pod(&pod("early", SELF_NETNS)).await.unwrap_err();
        assert!(matches!(err, ZdsError::NoProxy), "{err}");
        server.remove_pod("nobody").await.unwrap();

        let old = FakeProxy::connect(&path).await;
        assert_eq!(
            old.take_snapshot().await,
            [
                ("AddWorkload", "early".into()),
                ("SnapshotSent", String::new())
            ]
        );
        let new = FakeProxy::connect(&path).await;
        new.take_snapshot().await;
        wait_for_proxies(&server, 2).await;

        // Add: only the newest hears it; its ack is the result.
        let s = server.clone();
        let add = tokio::spawn(async move { s.add_pod(&pod("p1", SELF_NETNS)).await });
        match new.recv().await {
            Incoming::Add { uid, .. } => assert_eq!(uid, "p1"),
            other => panic!("expected AddWorkload, got {other:?}"),
        }
        new.ack().await;
        add.await.unwrap().unwrap();
        old.assert_silent().await;

        // A NACK is the caller's error.
        let s = server.clone();
        let add = tokio::spawn(async move { s.add_pod(&pod("p2", SELF_NETNS)).await });
        assert_eq!(new.recv().await.uid(), Some("p2"));
        new.nack("no room").await;
        let err = add.await.unwrap().unwrap_err();
        assert!(matches!(&err, ZdsError::Nack(m) if m == "no room"), "{err}");

        // Delete: both hear it.
        let s = server.clone();
        let del = tokio::spawn(async move { s.remove_pod("p1").await });
        for proxy in [&old, &new] {
            match proxy.recv().await {
                Incoming::Del { uid } => assert_eq!(uid, "p1"),
                other => panic!("expected DelWorkload, got {other:?}"),
            }
            proxy.ack().await;
        }
        del.await.unwrap().unwrap();

        // The newest leaves: adds fall back to the older one.
        drop(new);
        wait_for_proxies(&server, 1).await;
        let s = server.clone();
        let add = tokio::spawn(async move { s.add_pod(&pod("p3", SELF_NETNS)).await });
        assert_eq!(old.recv().await.uid(), Some("p3"));
        old.ack().await;
        add.await.unwrap().unwrap();

        assert_eq!(server.pod_uids(), ["early", "p2", "p3"]);
    }

    #[tokio::test]
    async fn ack_timeout_is_reported_and_late_acks_are_not_misattributed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel.sock");
        let server = Arc::new(ZdsServer::bind_with(&path, [], fast()).unwrap());
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
        let server = ZdsServer::bind_with(&path, [], fast()).unwrap();
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
        let server = ZdsServer::bind_with(dir.path().join("z.sock"), [], fast()).unwrap();
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
