//! The Kubernetes-mode agent against the test API server: a "host" and pods as throwaway
//! network namespaces, each pod's process played by a fake `/proc` entry (its `ns/net` a
//! link to the pod's netns, its `cgroup` naming the pod UID; the host's init, pid 1, in the
//! host's netns), the kubelet's part (pod creation, status) done by the test, a node proxy
//! played by the test.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ambit_agent::k8s::{run_with, K8sConfig, Options};
use ambit_agent::zds::ZdsOptions;
use ambit_fake_apiserver::{pod, ApiServer, Resource, ServerOptions};
use ambit_k8s::client::{connect, ClientSource};
use ambit_zds::protocol::{decode_request, encode_ack, encode_hello};
use ambit_zds::{Incoming, ZdsSocket};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::TestNetns;

pub const NODE: &str = "node-1";
pub const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");
pub const WAIT: Duration = Duration::from_secs(20);

/// A node proxy that acks everything and reports what it got (uid, kind).
pub struct FakeProxy {
    pub seen: mpsc::UnboundedReceiver<(String, String)>,
    pub task: JoinHandle<()>,
}

impl FakeProxy {
    pub async fn connect(path: &Path) -> FakeProxy {
        let sock = ZdsSocket::connect(path).await.unwrap();
        sock.send(&encode_hello(), None).await.unwrap();
        let (tx, seen) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((bytes, fds)) = sock.recv().await {
                let Ok(msg) = decode_request(&bytes, fds) else {
                    return;
                };
                let kind = match &msg {
                    Incoming::Add { .. } => "add",
                    Incoming::Keep { .. } => "keep",
                    Incoming::Del { .. } => "del",
                    Incoming::SnapshotSent => "snapshot-sent",
                };
                let uid = msg.uid().unwrap_or_default().to_owned();
                if sock.send(&encode_ack(None), None).await.is_err() {
                    return;
                }
                let _ = tx.send((uid, kind.to_owned()));
            }
        });
        FakeProxy { seen, task }
    }

    pub async fn next(&mut self) -> (String, String) {
        tokio::time::timeout(WAIT, self.seen.recv())
            .await
            .expect("nothing from the agent in time")
            .expect("proxy connection closed")
    }

    /// The snapshot's adds.
    pub async fn snapshot(&mut self) -> Vec<String> {
        let mut adds = Vec::new();
        loop {
            match self.next().await {
                (_, k) if k == "snapshot-sent" => return adds,
                (uid, k) if k == "add" => adds.push(uid),
                other => panic!("unexpected {other:?} in the snapshot"),
            }
        }
    }
}

impl Drop for FakeProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Polls `f` until it holds (the agent works asynchronously), failing after [`WAIT`].
pub async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One raw HTTP/1.1 request; returns (status, body).
pub async fn http<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: unix\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

pub async fn get(addr: SocketAddr, path: &str) -> u16 {
    match tokio::net::TcpStream::connect(addr).await {
        Ok(s) => http(s, "GET", path, "").await.0,
        Err(_) => 0,
    }
}

pub struct Env {
    pub dir: tempfile::TempDir,
    pub api: ApiServer,
    pub host: TestNetns,
    pub cfg: K8sConfig,
    pub kubeconfig: PathBuf,
}

impl Env {
    pub async fn new(opts: ServerOptions, token: Option<&str>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let api = ApiServer::start(opts).await.unwrap();
        let host = TestNetns::new();
        let proc_root = dir.path().join("proc");
        std::fs::create_dir_all(proc_root.join("1/ns")).unwrap();
        // The host's init lives in the netns standing for the host.
        symlink(host.path(), proc_root.join("1/ns/net")).unwrap();
        let vars: HashMap<&str, String> = HashMap::from([
            ("AMBIENT_ENABLED", "true".into()),
            ("NODE_NAME", NODE.into()),
            (
                "CNI_AGENT_RUN_DIR",
                dir.path().join("run").display().to_string(),
            ),
            (
                "ZTUNNEL_UDS_ADDRESS",
                dir.path()
                    .join("ztunnel/ztunnel.sock")
                    .display()
                    .to_string(),
            ),
            ("AMBIT_HOST_PROC", proc_root.display().to_string()),
            ("AMBIT_HOST_ROOT", "/".into()),
        ]);
        let mut cfg = K8sConfig::from_lookup(|k| vars.get(k).cloned(), "unused").unwrap();
        cfg.health_addr = free_port();
        cfg.metrics_addr = free_port();
        cfg.state_dir = dir.path().join("state");
        cfg.host_netns = Some(host.path());
        let kubeconfig = dir.path().join("kubeconfig");
        let token = token
            .map(str::to_owned)
            .unwrap_or_else(|| api.admin_token());
        api.write_kubeconfig(&kubeconfig, &token).unwrap();
        Env {
            dir,
            api,
            host,
            cfg,
            kubeconfig,
        }
    }

    pub async fn start(&self) -> Running {
        let client = connect(&ClientSource::Kubeconfig(self.kubeconfig.clone()))
            .await
            .unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let opts = Options {
            zds: ZdsOptions {
                hello_timeout: Duration::from_secs(2),
                ack_timeout: Duration::from_secs(2),
            },
            ..Options::default()
        };
        let task = tokio::spawn(run_with(
            self.cfg.clone(),
            client,
            Arc::new(AtomicBool::new(true)),
            opts,
            async {
                let _ = stopped.await;
            },
        ));
        let deadline = tokio::time::Instant::now() + WAIT;
        while !self.cfg.zds_socket.exists() {
            if task.is_finished() {
                panic!("agent exited: {:?}", task.await);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "agent did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Running { stop, task }
    }

    pub async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while get(self.cfg.health_addr, "/readyz").await != 200 {
            assert!(tokio::time::Instant::now() < deadline, "never ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(get(self.cfg.health_addr, "/healthz").await, 200);
    }

    /// A pod on this node as the kubelet registers it, running with `ip`, its sandbox
    /// process listed in the fake `/proc` as `pid`. Returns its UID.
    pub fn kubelet_pod(
        &self,
        ns: &str,
        name: &str,
        netns: &TestNetns,
        ip: &str,
        pid: u32,
    ) -> String {
        let created = self.api.create(pod(ns, name, NODE)).unwrap();
        let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
        self.api
            .update(Resource::Pods, Some(ns), name, |p| {
                p["status"] = json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]});
            })
            .unwrap();
        let dir = self.cfg.proc_root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        symlink(netns.path(), dir.join("ns/net")).unwrap();
        std::fs::write(
            dir.join("cgroup"),
            format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-1.scope\n",
                uid.replace('-', "_")
            ),
        )
        .unwrap();
        uid
    }

    pub fn annotation(&self, ns: &str, name: &str) -> Option<String> {
        self.api.get(Resource::Pods, Some(ns), name)?["metadata"]["annotations"]
            ["ambient.istio.io/redirection"]
            .as_str()
            .map(str::to_owned)
    }

    pub fn label_namespace(&self, name: &str, ambient: bool) {
        self.api
            .update(Resource::Namespaces, None, name, |n| {
                n["metadata"]["labels"] = if ambient {
                    json!({AMBIENT.0: AMBIENT.1})
                } else {
                    json!({})
                };
            })
            .unwrap();
    }

    pub fn probes(&self) -> String {
        self.host
            .exec(&["ipset", "save", "istio-inpod-probes-v4"])
            .lines()
            .filter(|l| l.starts_with("add "))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until the agent has counted at least `n` watch events of `kind`
    /// (`nodeagent_reconcile_events_total{type}`) and finished acting on all of them: one
    /// scrape shows them and no pod pending. An event is counted only once its pod is
    /// queued, and the pending gauge is read after the counters, so that scrape comes after
    /// the reconcile of the event's pod ended.
    pub async fn settled(&self, kind: &str, n: u64) {
        let events = format!("nodeagent_reconcile_events_total{{type=\"{kind}\"}}");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let last = get_body(self.cfg.metrics_addr, "/metrics").await;
            let seen = sample(&last, &events).unwrap_or(0);
            if seen >= n && sample(&last, "ambit_agent_reconcile_pending_pods") == Some(0) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the agent did not act on {n} {kind} event(s) in time:\n{last}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn patches(&self) -> Vec<ambit_fake_apiserver::RecordedRequest> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.method == "PATCH")
            .collect()
    }
}

pub struct Running {
    pub stop: oneshot::Sender<()>,
    pub task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    pub async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("agent did not stop")
            .unwrap()
            .unwrap();
    }
}

pub async fn get_body(addr: SocketAddr, path: &str) -> String {
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    http(s, "GET", path, "").await.1
}

/// The value of the sample `name` (labels included, as exposed) in a metrics text.
pub fn sample(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
