//! The agent in Kubernetes mode against the test API server (root only): a "host" and a pod
//! as throwaway network namespaces, the pod's process played by a fake `/proc` entry (its
//! `ns/net` a link to the pod's netns, its `cgroup` naming the pod UID), the kubelet's part
//! (pod creation, status) done by the test, a node proxy played by the test.

mod common;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ambit_agent::k8s::{run_with, K8sConfig, Options};
use ambit_agent::zds::ZdsOptions;
use ambit_inpod::protocol::{decode_request, encode_ack, encode_hello};
use ambit_inpod::{Incoming, ZdsSocket};
use ambit_k8s::client::{connect, ClientSource};
use ambit_testapi::{namespace, pod, ApiServer, Resource, ServerOptions, User};
use common::{ip, require_root, TestNetns};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

const NODE: &str = "node-1";
const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");
const WAIT: Duration = Duration::from_secs(20);

/// A node proxy that acks everything and reports what it got (uid, kind).
struct FakeProxy {
    seen: mpsc::UnboundedReceiver<(String, String)>,
    task: JoinHandle<()>,
}

impl FakeProxy {
    async fn connect(path: &Path) -> FakeProxy {
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

    async fn next(&mut self) -> (String, String) {
        tokio::time::timeout(WAIT, self.seen.recv())
            .await
            .expect("nothing from the agent in time")
            .expect("proxy connection closed")
    }

    /// The snapshot's adds.
    async fn snapshot(&mut self) -> Vec<String> {
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

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Polls `f` until it holds (the agent works asynchronously), failing after [`WAIT`].
async fn until(what: &str, mut f: impl FnMut() -> bool) {
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
async fn http<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
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

async fn get(addr: SocketAddr, path: &str) -> u16 {
    match tokio::net::TcpStream::connect(addr).await {
        Ok(s) => http(s, "GET", path, "").await.0,
        Err(_) => 0,
    }
}

struct Env {
    dir: tempfile::TempDir,
    api: ApiServer,
    host: TestNetns,
    cfg: K8sConfig,
    kubeconfig: PathBuf,
}

impl Env {
    async fn new(opts: ServerOptions, token: Option<&str>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let api = ApiServer::start(opts).await.unwrap();
        let host = TestNetns::new();
        let proc_root = dir.path().join("proc");
        std::fs::create_dir_all(proc_root.join("1/ns")).unwrap();
        symlink("/proc/self/ns/net", proc_root.join("1/ns/net")).unwrap();
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

    async fn start(&self) -> Running {
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

    async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while get(self.cfg.health_addr, "/readyz").await != 200 {
            assert!(tokio::time::Instant::now() < deadline, "never ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(get(self.cfg.health_addr, "/healthz").await, 200);
    }

    /// A pod on this node as the kubelet registers it, running with `ip`, its sandbox
    /// process listed in the fake `/proc` as `pid`. Returns its UID.
    fn kubelet_pod(&self, ns: &str, name: &str, netns: &TestNetns, ip: &str, pid: u32) -> String {
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

    fn annotation(&self, ns: &str, name: &str) -> Option<String> {
        self.api.get(Resource::Pods, Some(ns), name)?["metadata"]["annotations"]
            ["ambient.istio.io/redirection"]
            .as_str()
            .map(str::to_owned)
    }

    fn label_namespace(&self, name: &str, ambient: bool) {
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

    fn probes(&self) -> String {
        self.host
            .exec(&["ipset", "save", "istio-inpod-probes-v4"])
            .lines()
            .filter(|l| l.starts_with("add "))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn patches(&self) -> Vec<ambit_testapi::RecordedRequest> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.method == "PATCH")
            .collect()
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("agent did not stop")
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_path_label_watch_faults_restart_and_delete() {
    require_root("informer_path_label_watch_faults_restart_and_delete");
    let env = Env::new(ServerOptions::default(), None).await;
    let pod_ns = TestNetns::new();
    ip(&[
        "-n",
        &pod_ns.name,
        "addr",
        "add",
        "10.55.0.5/32",
        "dev",
        "lo",
    ]);
    env.api.create(namespace("shop", &[])).unwrap();
    let uid = env.kubelet_pod("shop", "web", &pod_ns, "10.55.0.5", 4242);

    let agent = env.start().await;
    let mut proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    assert!(proxy.snapshot().await.is_empty());
    env.wait_ready().await;
    assert_eq!(env.annotation("shop", "web"), None, "not selected yet");

    // Namespace labelled later: the running pod is enrolled.
    env.label_namespace("shop", true);
    assert_eq!(proxy.next().await, (uid.clone(), "add".into()));
    until("annotation enabled", || {
        env.annotation("shop", "web").as_deref() == Some("enabled")
    })
    .await;
    let rules = pod_ns.saved(false);
    assert!(rules.contains("--to-ports 15001"), "{rules}");
    assert!(
        env.probes()
            .contains(&format!("10.55.0.5 comment \"{uid}\"")),
        "{}",
        env.probes()
    );
    let patches = env.patches();
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(patches[0].path, "/api/v1/namespaces/shop/pods/web/status");
    assert_eq!(
        patches[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        patches[0].body.as_deref(),
        Some(r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}"#)
    );
    let metrics = reqwest_free_get_body(env.cfg.metrics_addr, "/metrics").await;
    assert!(
        metrics.contains("nodeagent_reconcile_events_total{type=\"namespace\"}"),
        "{metrics}"
    );

    // Watches cut and the history compacted (410 on resume): the label removal made
    // meanwhile is not lost.
    env.api.faults().compact();
    env.api.faults().drop_watches();
    env.label_namespace("shop", false);
    assert_eq!(proxy.next().await, (uid.clone(), "del".into()));
    until("annotation removed", || {
        env.annotation("shop", "web").is_none()
    })
    .await;
    until("probe entry removed", || env.probes().is_empty()).await;
    let rules = pod_ns.saved(false);
    assert!(!rules.contains("ISTIO"), "{rules}");

    // Labelled again, then the agent restarts: nothing is disturbed.
    env.label_namespace("shop", true);
    assert_eq!(proxy.next().await, (uid.clone(), "add".into()));
    until("annotation enabled again", || {
        env.annotation("shop", "web").as_deref() == Some("enabled")
    })
    .await;
    let rules = pod_ns.saved(false);
    let probes = env.probes();
    drop(proxy);
    agent.stop().await;
    env.api.clear_requests();

    let agent = env.start().await;
    let mut proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    assert_eq!(
        proxy.snapshot().await,
        vec![uid.clone()],
        "the snapshot carries the pod"
    );
    env.wait_ready().await;
    assert_eq!(pod_ns.saved(false), rules, "rules untouched");
    assert_eq!(env.probes(), probes);

    // The pod is deleted: it leaves the mesh.
    env.api.delete(Resource::Pods, Some("shop"), "web").unwrap();
    assert_eq!(proxy.next().await, (uid.clone(), "del".into()));
    until("probe entry removed", || env.probes().is_empty()).await;
    assert!(
        env.patches().is_empty(),
        "no annotation churn after the restart: {:?}",
        env.patches()
    );
    agent.stop().await;
    drop(env.dir);
}

async fn reqwest_free_get_body(addr: SocketAddr, path: &str) -> String {
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    http(s, "GET", path, "").await.1
}

const ROLE_WITHOUT_STATUS: &str = "\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: istio-cni}
rules:
- apiGroups: ['']
  resources: [pods, nodes, namespaces]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: istio-cni}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: istio-cni}
subjects:
- {kind: ServiceAccount, name: istio-cni, namespace: istio-system}
";

const STATUS_RULE: &str = "\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: istio-cni-status}
rules:
- apiGroups: ['']
  resources: [pods/status]
  verbs: [patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: istio-cni-status}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: istio-cni-status}
subjects:
- {kind: ServiceAccount, name: istio-cni, namespace: istio-system}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmdadd_enrolls_and_a_missing_permission_is_named() {
    require_root("cmdadd_enrolls_and_a_missing_permission_is_named");
    let opts = ServerOptions {
        rbac: true,
        ..Default::default()
    };
    let env = Env::new(opts, Some("cni-token")).await;
    env.api.add_token(
        "cni-token",
        User::service_account("istio-system", "istio-cni"),
    );
    env.api.apply_yaml(ROLE_WITHOUT_STATUS).unwrap();
    env.api.create(namespace("shop", &[AMBIENT])).unwrap();
    let pod_ns = TestNetns::new();
    ip(&[
        "-n",
        &pod_ns.name,
        "addr",
        "add",
        "10.55.1.5/32",
        "dev",
        "lo",
    ]);
    // At CNI ADD time the pod exists but its status has no IP yet.
    let created = env.api.create(pod("shop", "web", NODE)).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();

    let agent = env.start().await;
    let mut proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    assert!(proxy.snapshot().await.is_empty());
    env.wait_ready().await;
    let socket = env.cfg.plugin_socket();
    let mode = std::fs::metadata(&socket).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o666
    );

    let call = |body: String| {
        let socket = socket.clone();
        async move {
            let s = tokio::net::UnixStream::connect(&socket).await.unwrap();
            http(s, "POST", "/cmdadd", &body).await
        }
    };
    let (code, body) = call("{".into()).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = call(r#"{"PodNamespace":"shop"}"#.into()).await;
    assert_eq!(code, 400);
    assert!(body.contains("PodName"), "{body}");

    let request = ambit_cni::istio_api::CmdAddRequest {
        netns: pod_ns.path().display().to_string(),
        pod_name: "web".into(),
        pod_namespace: "shop".into(),
        ips: vec![ambit_cni::istio_api::IpConfig::new(
            "10.55.1.5".parse().unwrap(),
            24,
        )],
    };
    let body = String::from_utf8(request.encode()).unwrap();
    let (code, text) = call(body.clone()).await;
    assert_eq!(code, 500, "{text}");
    assert!(
        text.contains("pods/status") && text.contains("patch") && text.contains("shop/web"),
        "{text}"
    );
    assert_eq!(
        proxy.next().await,
        (uid.clone(), "add".into()),
        "captured before the patch"
    );

    // With the permission granted the same call succeeds.
    env.api.apply_yaml(STATUS_RULE).unwrap();
    let (code, text) = call(body).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(env.annotation("shop", "web").as_deref(), Some("enabled"));
    assert!(pod_ns.saved(false).contains("--to-ports 15001"));
    let metrics = reqwest_free_get_body(env.cfg.metrics_addr, "/metrics").await;
    for line in [
        "istio_cni_plugin_requests_total{response_code=\"400\"} 2",
        "istio_cni_plugin_requests_total{response_code=\"200\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    agent.stop().await;
}

/// Taking over from Istio's agent: a pod already captured (the in-pod rule set, which
/// ambit's rules reproduce byte for byte, is installed before ambit's agent starts) and
/// annotated `enabled`. The agent adopts it: the node proxy gets it in the snapshot, the
/// rules are not touched and the API sees no write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_already_captured_annotated_pod_is_adopted_without_changes() {
    require_root("an_already_captured_annotated_pod_is_adopted_without_changes");
    let env = Env::new(ServerOptions::default(), None).await;
    let pod_ns = TestNetns::new();
    ip(&[
        "-n",
        &pod_ns.name,
        "addr",
        "add",
        "10.55.2.5/32",
        "dev",
        "lo",
    ]);
    env.api.create(namespace("shop", &[AMBIENT])).unwrap();
    let uid = env.kubelet_pod("shop", "web", &pod_ns, "10.55.2.5", 777);
    env.api
        .update(Resource::Pods, Some("shop"), "web", |p| {
            p["metadata"]["annotations"] = json!({"ambient.istio.io/redirection": "enabled"});
        })
        .unwrap();
    // The previous agent's work.
    let opts = ambit_agent::InpodRuleOptions {
        dns_capture: true,
        ipv6: true,
        bypass_inbound: false,
    };
    ambit_agent::iptables::apply_inpod(&pod_ns.path(), &opts).unwrap();
    let (v4, v6) = (pod_ns.saved(false), pod_ns.saved(true));
    env.api.clear_requests();

    let agent = env.start().await;
    let mut proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    assert_eq!(proxy.snapshot().await, vec![uid.clone()]);
    env.wait_ready().await;
    assert!(
        env.probes()
            .contains(&format!("10.55.2.5 comment \"{uid}\"")),
        "{}",
        env.probes()
    );

    // A later change to the pod proves its reconcile ran: still nothing to do.
    env.api
        .update(Resource::Pods, Some("shop"), "web", |p| {
            p["metadata"]["labels"]["touched"] = json!("yes");
        })
        .unwrap();
    until("the pod update seen", || {
        let m = blocking_metrics(env.cfg.metrics_addr);
        m.contains("nodeagent_reconcile_events_total{type=\"update\"}")
    })
    .await;
    assert_eq!(
        (pod_ns.saved(false), pod_ns.saved(true)),
        (v4, v6),
        "rules untouched"
    );
    assert!(env.patches().is_empty(), "{:?}", env.patches());
    assert!(
        !env.api.requests().iter().any(|r| r.method != "GET"),
        "only reads"
    );
    agent.stop().await;
}

fn blocking_metrics(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// No node proxy yet: the pod is captured (rules in place, traffic fails closed) and
/// annotated `pending`; once a proxy connects the retry takes it to `enabled`. Then the pod
/// completes (a Job) and its terminal status, without IPs, takes it out of the mesh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_without_a_proxy_then_enabled_then_a_completed_pod_is_cleaned_up() {
    require_root("pending_without_a_proxy_then_enabled_then_a_completed_pod_is_cleaned_up");
    let env = Env::new(ServerOptions::default(), None).await;
    let pod_ns = TestNetns::new();
    ip(&[
        "-n",
        &pod_ns.name,
        "addr",
        "add",
        "10.55.3.5/32",
        "dev",
        "lo",
    ]);
    env.api.create(namespace("jobs", &[AMBIENT])).unwrap();
    let uid = env.kubelet_pod("jobs", "task", &pod_ns, "10.55.3.5", 900);

    let agent = env.start().await;
    until("annotation pending", || {
        env.annotation("jobs", "task").as_deref() == Some("pending")
    })
    .await;
    assert!(
        pod_ns.saved(false).contains("--to-ports 15001"),
        "captured while pending"
    );

    let mut proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    let snapshot = proxy.snapshot().await;
    assert_eq!(snapshot, vec![uid.clone()]);
    until("annotation enabled", || {
        env.annotation("jobs", "task").as_deref() == Some("enabled")
    })
    .await;

    env.api
        .update(Resource::Pods, Some("jobs"), "task", |p| {
            p["status"] = json!({"phase": "Succeeded"});
        })
        .unwrap();
    loop {
        match proxy.next().await {
            (u, k) if u == uid && k == "del" => break,
            (u, k) if u == uid && k == "add" => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
    until("probe entry removed", || env.probes().is_empty()).await;
    agent.stop().await;
}
