//! The lab's Kubernetes mode: a test API server ([`ambit_fake_apiserver`]) standing in for
//! kube-apiserver, reachable from every node, and the kubelet's part done by the lab: a pod
//! object exists (with `spec.nodeName`) before the runtime calls CNI, and gets its IP and
//! `Running` phase after. The node agents run in Kubernetes mode against it and the CNI
//! chain ends with `istio-cni` (the plugin in Kubernetes mode, Istio's plugin keys).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};

use ambit_fake_apiserver::{ApiServer, Resource, ServerOptions, User};
use anyhow::Context;
use serde_json::{json, Value};

use super::Lab;

/// Where the API server listens inside the first node.
pub const API_PORT: u16 = 6443;
/// The agent's service account, as the cni chart names it.
pub const AGENT_NAMESPACE: &str = "istio-system";
/// The label that puts pods into ambient mode.
pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";
/// The annotation the agent writes on captured pods.
pub const REDIRECTION: &str = "ambient.istio.io/redirection";

pub struct KubeLab {
    pub api: ApiServer,
    /// The address every node reaches the API server at.
    pub addr: SocketAddr,
    /// The agent's token (bound to `system:serviceaccount:istio-system:istio-cni`).
    pub token: String,
    // Declared last: the server's tasks run on it, so it must outlive `api`.
    runtime: tokio::runtime::Runtime,
}

impl KubeLab {
    /// Starts the API server on `ns` (the first node), listening on all its addresses;
    /// the other nodes reach it at `ip`. Namespace `default` is labelled ambient.
    pub fn start(ns: &str, ip: Ipv4Addr, nodes: &[String]) -> anyhow::Result<KubeLab> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .thread_name("lab-apiserver")
            .build()?;
        let listener = Lab::in_netns(ns, || {
            let l =
                std::net::TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, API_PORT))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })?;
        let api = runtime.block_on(ApiServer::start_on(listener, ServerOptions::default()))?;
        let token = format!("lab-agent-{}", rand::random::<u64>());
        api.add_token(&token, User::service_account(AGENT_NAMESPACE, "istio-cni"));
        api.create(ambit_fake_apiserver::namespace(AGENT_NAMESPACE, &[]))?;
        for name in nodes {
            api.create(ambit_fake_apiserver::node(name))?;
        }
        let lab = KubeLab {
            api,
            addr: SocketAddr::from((ip, API_PORT)),
            token,
            runtime,
        };
        lab.label_namespace("default", Some("ambient"))?;
        Ok(lab)
    }

    /// A kubeconfig for the nodes: the node-reachable address, the server's certificate
    /// checked under the name it was issued for.
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_for(&self.token)
    }

    /// [`KubeLab::kubeconfig`] with another user's token.
    pub fn kubeconfig_for(&self, token: &str) -> String {
        self.api.kubeconfig(token).replace(
            &format!("server: \"{}\"", self.api.url()),
            &format!(
                "server: \"https://{}\"\n    tls-server-name: localhost",
                self.addr
            ),
        )
    }

    pub fn write_kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, self.kubeconfig())
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Sets (or, with `None`, removes) a namespace's `istio.io/dataplane-mode` label.
    pub fn label_namespace(&self, name: &str, mode: Option<&str>) -> anyhow::Result<()> {
        self.api.update(Resource::Namespaces, None, name, |ns| {
            let labels = &mut ns["metadata"]["labels"];
            if !labels.is_object() {
                *labels = json!({});
            }
            match mode {
                Some(m) => labels[DATAPLANE_MODE] = json!(m),
                None => {
                    if let Some(map) = labels.as_object_mut() {
                        map.remove(DATAPLANE_MODE);
                    }
                }
            }
        })?;
        Ok(())
    }

    /// The kubelet's first step: the pod object, scheduled to `node`, not started yet.
    /// Returns its UID.
    pub fn create_pod(
        &self,
        name: &str,
        node: &str,
        service_account: &str,
    ) -> anyhow::Result<String> {
        let mut pod = ambit_fake_apiserver::pod("default", name, node);
        pod["spec"]["serviceAccountName"] = json!(service_account);
        pod["status"] = json!({"phase": "Pending"});
        let created = self.api.create(pod)?;
        created["metadata"]["uid"]
            .as_str()
            .map(str::to_owned)
            .context("the API server gave the pod no uid")
    }

    /// The kubelet's step after the sandbox is up: the pod's IP and phase.
    pub fn start_pod(&self, name: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
        self.api
            .update(Resource::Pods, Some("default"), name, |pod| {
                pod["status"] = json!({
                    "phase": "Running",
                    "podIP": ip.to_string(),
                    "podIPs": [{"ip": ip.to_string()}],
                });
            })?;
        Ok(())
    }

    pub fn delete_pod(&self, name: &str) -> anyhow::Result<()> {
        self.api.delete(Resource::Pods, Some("default"), name)
    }

    pub fn pod(&self, name: &str) -> Option<Value> {
        self.api.get(Resource::Pods, Some("default"), name)
    }

    /// The pod's `ambient.istio.io/redirection` annotation.
    pub fn redirection(&self, name: &str) -> Option<String> {
        self.pod(name)?["metadata"]["annotations"][REDIRECTION]
            .as_str()
            .map(str::to_owned)
    }

    /// The plugin's entry in the chain, with Istio's keys, as the installer writes it.
    pub fn plugin_conf(run_dir: &Path) -> Value {
        json!({
            "type": "istio-cni",
            "cni_agent_run_dir": run_dir.display().to_string(),
            "ambient_enabled": true,
            "enablement_selectors": [
                {"podSelector": {"matchLabels": {DATAPLANE_MODE: "ambient"}}},
                {
                    "podSelector": {"matchExpressions": [{"key": DATAPLANE_MODE, "operator": "NotIn", "values": ["none"]}]},
                    "namespaceSelector": {"matchLabels": {DATAPLANE_MODE: "ambient"}}
                }
            ],
            "exclude_namespaces": ["kube-system"],
            "pod_namespace": AGENT_NAMESPACE,
            "plugin_log_level": "info",
        })
    }

    /// The agent's environment on `node`, as the cni chart sets it (host namespace: the
    /// agent's own, the node's).
    pub fn agent_env(node: &str, run_dir: &Path, zds_socket: &Path) -> Vec<(&'static str, String)> {
        vec![
            ("AMBIENT_ENABLED", "true".into()),
            ("AMBIENT_IPV6", "false".into()),
            ("NODE_NAME", node.into()),
            ("POD_NAME", format!("istio-cni-node-{node}")),
            ("POD_NAMESPACE", AGENT_NAMESPACE.into()),
            ("CNI_AGENT_RUN_DIR", run_dir.display().to_string()),
            ("ZTUNNEL_UDS_ADDRESS", zds_socket.display().to_string()),
            ("AMBIT_HOST_ROOT", "/".into()),
            ("AMBIT_HOST_PROC", "/proc".into()),
        ]
    }

    /// Runs `f` on the server's runtime (for async clients in tests).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }
}

/// The node's run directory (`CNI_AGENT_RUN_DIR`): the plugin's kubeconfig and the
/// agent's `pluginevent.sock`.
pub fn run_dir(node_dir: &Path) -> PathBuf {
    node_dir.join("istio-cni")
}

/// A pod's "container" as the kubelet leaves it: a process in the pod's netns, in a cgroup
/// whose path names the pod UID (`/kubepods/pod<uid>/<container>`), which is how the agent
/// finds the netns of pods it did not see through CNI. Killed and its cgroup removed on drop.
pub struct PodSandbox {
    child: std::process::Child,
    cgroup: PathBuf,
}

impl PodSandbox {
    pub fn start(netns: &str, uid: &str, container_id: &str) -> anyhow::Result<PodSandbox> {
        // cgroup v2 where the unified hierarchy is the root, else v1's pids controller.
        let root = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/pids")
        };
        let cgroup = root
            .join("ambit-lab-kubepods")
            .join(format!("pod{uid}"))
            .join(container_id);
        std::fs::create_dir_all(&cgroup).with_context(|| {
            format!(
                "creating the pod's cgroup {} (the lab needs a writable cgroup hierarchy to play the kubelet)",
                cgroup.display()
            )
        })?;
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", netns, "sleep", "infinity"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting the pod's process")?;
        let sandbox = PodSandbox { child, cgroup };
        std::fs::write(
            sandbox.cgroup.join("cgroup.procs"),
            sandbox.child.id().to_string(),
        )
        .with_context(|| format!("moving the pod's process into {}", sandbox.cgroup.display()))?;
        Ok(sandbox)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PodSandbox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The container's cgroup, then the pod's; the shared parent may still be in use.
        let _ = std::fs::remove_dir(&self.cgroup);
        if let Some(pod) = self.cgroup.parent() {
            let _ = std::fs::remove_dir(pod);
            if let Some(parent) = pod.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}
