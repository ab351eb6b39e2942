//! In-pod mode on one machine: "nodes" as network namespaces joined by a veth pair, each
//! running the node agent and a node proxy in shared mode; "pods" as network namespaces
//! wired by a real CNI chain (containernetworking-plugins `bridge` + `host-local`, then
//! `ambit-cni`) driven the way a container runtime drives it. [`waypoint`] adds a waypoint
//! pod; `http` serves and sends HTTP in the pods.

pub mod http;
pub mod istiod_pod;
pub mod waypoint;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::control::{ControlPlane, CONTROL_PORT};
use super::kube::{run_dir as kube_run_dir, KubeLab, PodSandbox};
use super::mesh::EchoMode;
use super::peer::{write_lab_ca, NodeProxy};
use super::{http_get, wait_until, Lab, Process};

/// Where Debian's containernetworking-plugins live.
pub const CNI_PLUGIN_DIR: &str = "/usr/lib/cni";

#[derive(Clone, Debug)]
pub struct PodSpec {
    pub name: String,
    pub service_account: String,
    /// Index into the cluster's nodes.
    pub node: usize,
    /// The services this pod is an endpoint of: `namespace/hostname` → (service port,
    /// target port) pairs (none: the service's own target ports apply).
    pub services: Vec<(String, Vec<(u16, u16)>)>,
}

impl PodSpec {
    pub fn new(name: &str, node: usize) -> PodSpec {
        PodSpec {
            name: name.into(),
            service_account: name.into(),
            node,
            services: Vec::new(),
        }
    }

    /// Makes the pod an endpoint of `service` (`namespace/hostname`), with a port map.
    pub fn endpoint_of(mut self, service: &str, ports: &[(u16, u16)]) -> PodSpec {
        self.services.push((service.into(), ports.to_vec()));
        self
    }
}

pub struct Node {
    pub name: String,
    pub ns: String,
    pub ip: Ipv4Addr,
    pub dir: PathBuf,
    pub agent: Option<Process>,
    pub ztunnel: Option<Process>,
    next_pod: u8,
}

impl Node {
    pub fn zds_socket(&self) -> PathBuf {
        self.dir.join("ztunnel.sock")
    }

    pub fn events_socket(&self) -> PathBuf {
        self.dir.join("cni.sock")
    }

    pub fn pod_subnet(index: usize) -> String {
        format!("10.88.{}.0/24", index + 1)
    }
}

pub struct Pod {
    pub name: String,
    pub ns: String,
    pub ip: Ipv4Addr,
    pub uid: String,
    pub container_id: String,
    pub node: usize,
    pub service_account: String,
    /// The chain's result from ADD, replayed to DEL as the runtime would.
    result: Value,
    /// How long each step of [`Cluster::add_pod`] took: creating the netns, then each
    /// plugin of the chain (for the benchmark).
    pub add_timings: Vec<(String, Duration)>,
    /// Kubernetes mode: the pod's process, in a cgroup naming the pod (the kubelet's).
    pub sandbox: Option<PodSandbox>,
}

impl Pod {
    pub fn netns_path(&self) -> PathBuf {
        Lab::netns_path(&self.ns)
    }
}

pub struct Cluster {
    pub lab: Lab,
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
    ambit: PathBuf,
    cni_bin: PathBuf,
    network: String,
    pub config_path: PathBuf,
    pub ca_dir: PathBuf,
    /// The node proxy each node runs.
    pub node_proxies: Vec<NodeProxy>,
    /// Extra environment for every node proxy.
    pub proxy_env: Vec<(String, String)>,
    /// The control server configuring the node proxies, when the spec asked for one.
    pub control: Option<ControlPlane>,
    /// Kubernetes mode ([`Cluster::launch_kubernetes`]): the API server the agents watch.
    pub kube: Option<KubeLab>,
    /// Runs the HTTP apps and clients (`http`), made on first use.
    rt: std::sync::OnceLock<tokio::runtime::Runtime>,
}

/// What a [`Cluster`] runs: the nodes' proxies (one per node; the agent and the CNI plugin
/// are always ambit's), the pods of the mesh and how many of them to create at start.
pub struct ClusterSpec<'a> {
    pub ambit: &'a Path,
    pub tag: &'a str,
    pub node_proxies: Vec<NodeProxy>,
    pub pods: &'a [PodSpec],
    pub create: usize,
    pub extra_yaml: &'a str,
    /// Extra environment for every node proxy.
    pub proxy_env: &'a [(&'a str, String)],
    /// Run `ambit control` (from this binary) on the last node and configure every node
    /// proxy from it over xDS, with certificates from its CA, instead of a local file.
    pub control: Option<&'a Path>,
}

/// The address the n-th pod (from 0) of node `index` gets from host-local.
pub fn predicted_ip(node: usize, nth: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, node as u8 + 1, 10 + nth)
}

fn mesh_yaml(specs: &[PodSpec]) -> String {
    let mut counts = std::collections::HashMap::new();
    let mut out = String::from("workloads:\n");
    for spec in specs {
        let nth = counts.entry(spec.node).or_insert(0u8);
        let ip = predicted_ip(spec.node, *nth);
        *nth += 1;
        out.push_str(&format!(
            "- uid: cluster1//v1/Pod/default/{name}\n  name: {name}\n  namespace: default\n  serviceAccount: {sa}\n  trustDomain: cluster.local\n  workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: node{node}\n  canonicalName: {name}\n  workloadName: {name}\n  services: {{{services}}}\n",
            name = spec.name,
            sa = spec.service_account,
            node = spec.node + 1,
            services = spec
                .services
                .iter()
                .map(|(key, ports)| {
                    let ports: Vec<String> =
                        ports.iter().map(|(p, t)| format!("{p}: {t}")).collect();
                    format!("\"{key}\": {{{}}}", ports.join(", "))
                })
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    out
}

impl Cluster {
    /// Builds `node_count` nodes with their agents and node proxies, then creates `pods`
    /// through the CNI chain in the order given.
    pub fn start(
        ambit: &Path,
        tag: &str,
        node_count: usize,
        pods: &[PodSpec],
    ) -> anyhow::Result<Cluster> {
        Self::start_with(ambit, tag, node_count, pods, "")
    }

    /// Like [`Cluster::start`], with `extra_yaml` (e.g. a `policies:` section) appended to
    /// the mesh the node proxies load.
    pub fn start_with(
        ambit: &Path,
        tag: &str,
        node_count: usize,
        pods: &[PodSpec],
        extra_yaml: &str,
    ) -> anyhow::Result<Cluster> {
        Self::start_configured(ambit, tag, node_count, pods, pods.len(), extra_yaml)
    }

    /// Like [`Cluster::start_with`], but creates only the first `create` of `pods`; the
    /// others are in the mesh configuration only, for [`Cluster::add_pod`] later. Create
    /// them in the order given (per node): host-local hands out addresses in order, and
    /// the mesh expects each pod at the address its place in `pods` predicts.
    pub fn start_configured(
        ambit: &Path,
        tag: &str,
        node_count: usize,
        pods: &[PodSpec],
        create: usize,
        extra_yaml: &str,
    ) -> anyhow::Result<Cluster> {
        Self::launch(ClusterSpec {
            ambit,
            tag,
            node_proxies: vec![NodeProxy::Ambit(ambit.to_path_buf()); node_count],
            pods,
            create,
            extra_yaml,
            proxy_env: &[],
            control: None,
        })
    }

    /// Builds the nodes of `spec` with their agents and node proxies, then creates the
    /// first `spec.create` pods.
    pub fn launch(spec: ClusterSpec) -> anyhow::Result<Cluster> {
        Self::launch_mode(spec, false)
    }

    /// Like [`Cluster::launch`], on "Kubernetes": a test API server on the first node, the
    /// agents in Kubernetes mode watching it, the chain ending with `istio-cni` (the plugin
    /// in Kubernetes mode), and every pod an API object before CNI sees it (namespace
    /// `default` is labelled ambient).
    pub fn launch_kubernetes(spec: ClusterSpec) -> anyhow::Result<Cluster> {
        Self::launch_mode(spec, true)
    }

    fn launch_mode(spec: ClusterSpec, kubernetes: bool) -> anyhow::Result<Cluster> {
        let ClusterSpec {
            ambit,
            tag,
            node_proxies,
            pods,
            create,
            extra_yaml,
            proxy_env,
            control,
        } = spec;
        let node_count = node_proxies.len();
        let lab = Lab::new(tag)?;
        for (tool, package) in [("iptables", "iptables"), ("ipset", "ipset")] {
            super::require_tool(tool, package)?;
        }
        if !Path::new(CNI_PLUGIN_DIR).join("bridge").exists() {
            bail!("the CNI plugins are missing from {CNI_PLUGIN_DIR}: install the Debian package containernetworking-plugins");
        }
        let cni_bin = lab.dir.path().join("cni-bin");
        std::fs::create_dir_all(&cni_bin)?;
        std::os::unix::fs::symlink(ambit, cni_bin.join("ambit-cni"))?;
        std::os::unix::fs::symlink(ambit, cni_bin.join("istio-cni"))?;
        let ca_dir = lab.dir.path().join("ca");
        // Under a control server every certificate comes from it, with a root of its own.
        let lab_ca_users: Vec<&NodeProxy> = if control.is_some() {
            Vec::new()
        } else {
            node_proxies.iter().collect()
        };
        write_lab_ca(&ca_dir, &lab_ca_users)?;
        let config_path = lab.dir.path().join("mesh.yaml");
        std::fs::write(&config_path, mesh_yaml(pods) + extra_yaml)?;

        let mut nodes = Vec::new();
        for i in 0..node_count {
            let name = format!("node{}", i + 1);
            let ns = lab.netns(&name)?;
            let dir = lab.dir.path().join(&name);
            std::fs::create_dir_all(&dir)?;
            for sysctl in [
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ] {
                lab.exec(&ns, &["sysctl", "-q", "-w", sysctl])?;
            }
            nodes.push(Node {
                name,
                ns,
                ip: Ipv4Addr::new(10, 78, 0, i as u8 + 1),
                dir,
                agent: None,
                ztunnel: None,
                next_pod: 0,
            });
        }
        if node_count > 2 {
            bail!("the lab joins at most two nodes");
        }
        if node_count == 2 {
            lab.link(
                &nodes[0].ns,
                "10.78.0.1/24",
                &nodes[1].ns,
                "10.78.0.2/24",
                "eth0",
            )?;
            lab.exec(
                &nodes[0].ns,
                &[
                    "ip",
                    "route",
                    "add",
                    &Node::pod_subnet(1),
                    "via",
                    "10.78.0.2",
                ],
            )?;
            lab.exec(
                &nodes[1].ns,
                &[
                    "ip",
                    "route",
                    "add",
                    &Node::pod_subnet(0),
                    "via",
                    "10.78.0.1",
                ],
            )?;
        }
        let control = match control {
            Some(ambit) => {
                let host = nodes.last().context("a cluster needs a node")?;
                let ip = if node_count == 2 {
                    host.ip
                } else {
                    Ipv4Addr::LOCALHOST
                };
                let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
                let mesh = std::fs::read_to_string(&config_path)?;
                let mut plane = ControlPlane::prepare(
                    &lab,
                    &host.ns,
                    SocketAddr::from((ip, CONTROL_PORT)),
                    ambit,
                    &ca_dir,
                    &names,
                    &mesh,
                )?;
                plane.start(&lab)?;
                Some(plane)
            }
            None => None,
        };
        let kube = if kubernetes {
            let api_ip = if node_count == 2 {
                nodes[0].ip
            } else {
                Ipv4Addr::LOCALHOST
            };
            let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
            let kube = KubeLab::start(&nodes[0].ns, api_ip, &names)?;
            for n in &nodes {
                let dir = kube_run_dir(&n.dir);
                std::fs::create_dir_all(&dir)?;
                // The installer's job on a real node: the plugin's kubeconfig.
                kube.write_kubeconfig(&dir.join("istio-cni-kubeconfig"))?;
            }
            Some(kube)
        } else {
            None
        };
        let network = lab.prefix().to_string();
        let mut cluster = Cluster {
            lab,
            nodes,
            pods: Vec::new(),
            ambit: ambit.to_path_buf(),
            cni_bin,
            network,
            config_path,
            ca_dir,
            node_proxies,
            proxy_env: proxy_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            control,
            kube,
            rt: std::sync::OnceLock::new(),
        };
        for i in 0..node_count {
            cluster.start_agent(i)?;
            cluster.start_ztunnel(i)?;
        }
        for spec in &pods[..create.min(pods.len())] {
            cluster.add_pod(spec)?;
        }
        Ok(cluster)
    }

    pub fn start_agent(&mut self, node: usize) -> anyhow::Result<()> {
        if self.kube.is_some() {
            return self.start_kube_agent(node);
        }
        let n = &self.nodes[node];
        let args = [
            "agent".to_string(),
            "--zds-socket".into(),
            n.zds_socket().display().to_string(),
            "--events-socket".into(),
            n.events_socket().display().to_string(),
            "--state-dir".into(),
            n.dir.join("agent-state").display().to_string(),
            "--ipv6=false".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let proc = self.lab.spawn(
            &n.ns,
            &format!("agent-{}", n.name),
            &self.ambit,
            &args,
            &[("RUST_LOG", "info".to_string())],
        )?;
        let events = n.events_socket();
        let pid = proc.pid;
        let log = proc.log.clone();
        wait_until("the node agent to listen", Duration::from_secs(15), || {
            !self.lab.is_running(pid) || events.exists()
        })?;
        if !self.lab.is_running(pid) {
            bail!(
                "the node agent exited; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        self.nodes[node].agent = Some(proc);
        Ok(())
    }

    /// The agent in Kubernetes mode, configured as the cni chart configures it.
    fn start_kube_agent(&mut self, node: usize) -> anyhow::Result<()> {
        let n = &self.nodes[node];
        let run_dir = kube_run_dir(&n.dir);
        let kubeconfig = run_dir.join("istio-cni-kubeconfig");
        let mut env = KubeLab::agent_env(&n.name, &run_dir, &n.zds_socket());
        env.push(("RUST_LOG", "info".to_string()));
        let proc = self.lab.spawn(
            &n.ns,
            &format!("agent-{}-{}", n.name, rand::random::<u16>()),
            &self.ambit,
            &["agent", "--kubeconfig", &kubeconfig.display().to_string()],
            &env,
        )?;
        let (pid, log, ns) = (proc.pid, proc.log.clone(), n.ns.clone());
        let ready = wait_until(
            "the node agent to be ready",
            Duration::from_secs(20),
            || {
                !self.lab.is_running(pid)
                    || matches!(
                        http_get(&ns, "127.0.0.1:8000".parse().expect("addr"), "/readyz"),
                        Ok((200, _))
                    )
            },
        );
        if ready.is_err() || !self.lab.is_running(pid) {
            bail!(
                "the node agent on {} did not become ready; its log:\n{}",
                n.name,
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        self.nodes[node].agent = Some(proc);
        Ok(())
    }

    /// The API server of a Kubernetes-mode cluster.
    pub fn kube(&self) -> &KubeLab {
        self.kube
            .as_ref()
            .expect("not a Kubernetes-mode cluster (Cluster::launch_kubernetes)")
    }

    pub fn stop_agent(&mut self, node: usize) -> anyhow::Result<()> {
        if let Some(p) = self.nodes[node].agent.take() {
            self.lab.signal_and_wait(
                p.pid,
                nix::sys::signal::Signal::SIGTERM,
                Duration::from_secs(10),
            )?;
        }
        Ok(())
    }

    pub fn start_ztunnel(&mut self, node: usize) -> anyhow::Result<()> {
        let n = &self.nodes[node];
        let proxy = &self.node_proxies[node];
        let mut env = match &self.control {
            Some(plane) => plane.proxy_env(&n.name)?,
            None => proxy.env(&self.config_path, &self.ca_dir),
        };
        env.extend([
            ("PROXY_MODE", "shared".to_string()),
            ("INPOD_UDS", n.zds_socket().display().to_string()),
            ("NODE_NAME", n.name.clone()),
            ("IPV6_ENABLED", "false".to_string()),
        ]);
        env.extend(self.proxy_env.iter().map(|(k, v)| (k.as_str(), v.clone())));
        let (program, args) = proxy.command();
        let proc = self.lab.spawn(
            &n.ns,
            &format!("ztunnel-{}-{}", n.name, rand::random::<u16>()),
            program,
            args,
            &env,
        )?;
        self.nodes[node].ztunnel = Some(proc);
        self.wait_ztunnel_ready(node)
    }

    pub fn wait_ztunnel_ready(&self, node: usize) -> anyhow::Result<()> {
        let n = &self.nodes[node];
        let proc = n.ztunnel.as_ref().context("no node proxy started")?;
        let ready = wait_until(
            "the node proxy to be ready",
            Duration::from_secs(20),
            || {
                !self.lab.is_running(proc.pid)
                    || matches!(
                        http_get(
                            &n.ns,
                            "127.0.0.1:15021".parse().expect("addr"),
                            "/healthz/ready"
                        ),
                        Ok((200, _))
                    )
            },
        );
        if ready.is_err() || !self.lab.is_running(proc.pid) {
            bail!(
                "node proxy on {} did not become ready; its log:\n{}",
                n.name,
                std::fs::read_to_string(&proc.log).unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Kills the node proxy at once (no drain), as a crash would.
    pub fn kill_ztunnel(&mut self, node: usize) -> anyhow::Result<()> {
        if let Some(p) = self.nodes[node].ztunnel.take() {
            self.lab.signal_and_wait(
                p.pid,
                nix::sys::signal::Signal::SIGKILL,
                Duration::from_secs(10),
            )?;
        }
        Ok(())
    }

    fn conflist(&self, node: usize) -> Value {
        let n = &self.nodes[node];
        let plugin = match &self.kube {
            Some(_) => KubeLab::plugin_conf(&kube_run_dir(&n.dir)),
            None => json!({
                "type": "ambit-cni",
                "agent_socket": n.events_socket().display().to_string(),
            }),
        };
        json!({
            "cniVersion": "1.0.0",
            "name": self.network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": Node::pod_subnet(node), "rangeStart": predicted_ip(node, 0).to_string()}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": n.dir.join("ipam").display().to_string(),
                    }
                },
                plugin,
            ]
        })
    }

    fn cni_args(pod: &Pod) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={};AMBIT_SERVICE_ACCOUNT={}",
            pod.name, pod.container_id, pod.uid, pod.service_account
        )
    }

    /// Runs one plugin the way a runtime does; returns (exit success, stdout).
    pub fn exec_plugin(
        &self,
        node: usize,
        command: &str,
        pod: &Pod,
        conf: &Value,
    ) -> anyhow::Result<(bool, String)> {
        let kind = conf["type"].as_str().context("plugin without type")?;
        let program = if kind == "ambit-cni" || kind == "istio-cni" {
            self.cni_bin.join(kind)
        } else {
            Path::new(CNI_PLUGIN_DIR).join(kind)
        };
        let cni_path = format!("{}:{}", CNI_PLUGIN_DIR, self.cni_bin.display());
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.nodes[node].ns])
            .arg(&program)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &pod.container_id)
            .env("CNI_NETNS", pod.netns_path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_ARGS", Self::cni_args(pod))
            .env("CNI_PATH", cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running CNI plugin {}", program.display()))?;
        child
            .stdin
            .take()
            .context("plugin stdin")?
            .write_all(conf.to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ))
    }

    /// The chain: each plugin gets the network name and version, and the previous result.
    fn run_chain(
        &self,
        node: usize,
        command: &str,
        pod: &Pod,
        prev: Option<&Value>,
        timings: &mut Vec<(String, Duration)>,
    ) -> anyhow::Result<Value> {
        let list = self.conflist(node);
        let mut plugins: Vec<Value> = list["plugins"].as_array().cloned().unwrap_or_default();
        if command == "DEL" {
            plugins.reverse();
        }
        let mut result = prev.cloned();
        for mut conf in plugins {
            conf["name"] = list["name"].clone();
            conf["cniVersion"] = list["cniVersion"].clone();
            if let Some(r) = &result {
                conf["prevResult"] = r.clone();
            }
            let started = Instant::now();
            let (ok, stdout) = self.exec_plugin(node, command, pod, &conf)?;
            timings.push((
                conf["type"].as_str().unwrap_or_default().to_string(),
                started.elapsed(),
            ));
            if !ok {
                bail!("CNI {command} failed in plugin {}: {stdout}", conf["type"]);
            }
            if command == "ADD" {
                result = Some(
                    serde_json::from_str(&stdout)
                        .with_context(|| format!("plugin {} printed {stdout:?}", conf["type"]))?,
                );
            }
        }
        Ok(result.unwrap_or(Value::Null))
    }

    /// Creates a pod's network namespace and runs CNI ADD for it.
    pub fn add_pod(&mut self, spec: &PodSpec) -> anyhow::Result<usize> {
        let started = Instant::now();
        let ns = self.lab.netns(&format!("pod-{}", spec.name))?;
        let mut timings = vec![("netns".to_string(), started.elapsed())];
        let nth = self.nodes[spec.node].next_pod;
        self.nodes[spec.node].next_pod += 1;
        let mut pod = Pod {
            name: spec.name.clone(),
            ns,
            ip: predicted_ip(spec.node, nth),
            uid: format!("uid-{}-{}", spec.name, rand::random::<u32>()),
            container_id: format!("ctr-{}-{}", spec.name, rand::random::<u32>()),
            node: spec.node,
            service_account: spec.service_account.clone(),
            result: Value::Null,
            add_timings: Vec::new(),
            sandbox: None,
        };
        if let Some(kube) = &self.kube {
            // The kubelet creates the sandbox of a pod the API server already has.
            pod.uid = kube.create_pod(
                &spec.name,
                &self.nodes[spec.node].name,
                &spec.service_account,
            )?;
        }
        let result = self.run_chain(spec.node, "ADD", &pod, None, &mut timings)?;
        let got = result["ips"][0]["address"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !got.starts_with(&format!("{}/", pod.ip)) {
            bail!(
                "host-local gave {} the address {got}, the mesh expects {}",
                pod.name,
                pod.ip
            );
        }
        if let Some(kube) = &self.kube {
            pod.sandbox = Some(PodSandbox::start(&pod.ns, &pod.uid, &pod.container_id)?);
            kube.start_pod(&pod.name, pod.ip)?;
        }
        pod.result = result;
        pod.add_timings = timings;
        self.pods.push(pod);
        Ok(self.pods.len() - 1)
    }

    /// Runs CNI DEL for a pod (the namespace stays, as a runtime removes it afterwards).
    pub fn del_pod(&self, pod: usize) -> anyhow::Result<()> {
        let p = &self.pods[pod];
        self.run_chain(p.node, "DEL", p, Some(&p.result), &mut Vec::new())?;
        if let Some(kube) = &self.kube {
            kube.delete_pod(&p.name)?;
        }
        Ok(())
    }

    pub fn pod(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .expect("no such pod")
    }

    /// An app listening on `port` inside the pod; each connection's peer address is sent
    /// on the returned channel.
    pub fn serve_app(
        &self,
        pod: &str,
        port: u16,
        mode: EchoMode,
    ) -> anyhow::Result<mpsc::Receiver<SocketAddr>> {
        let listener = Lab::in_netns(&self.pod(pod).ns, move || {
            TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))
        })?;
        Ok(super::mesh::serve_echo(listener, mode))
    }

    /// A plain TCP connection made by an app in `pod` (captured by its rules).
    pub fn connect_from(&self, pod: &str, dst: SocketAddr) -> anyhow::Result<TcpStream> {
        let s = Lab::in_netns(&self.pod(pod).ns, move || {
            TcpStream::connect_timeout(&dst, Duration::from_secs(5))
        })
        .with_context(|| format!("connecting from {pod} to {dst}"))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(s)
    }

    /// A connection from a node's own network namespace (kubelet-style probes).
    pub fn connect_from_node(&self, node: usize, dst: SocketAddr) -> anyhow::Result<TcpStream> {
        let s = Lab::in_netns(&self.nodes[node].ns, move || {
            TcpStream::connect_timeout(&dst, Duration::from_secs(5))
        })?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(s)
    }

    pub fn metrics(&self, node: usize) -> anyhow::Result<String> {
        let (status, body) =
            http_get(&self.nodes[node].ns, "127.0.0.1:15020".parse()?, "/metrics")?;
        if status != 200 {
            bail!("metrics answered {status}");
        }
        Ok(body)
    }

    /// `iptables-save` inside a pod (counters stripped, so two runs compare equal; it cannot
    /// tell rules kept from rules deleted and added again: [`Cluster::iptables_counted`] can).
    pub fn iptables_save(&self, pod: &str) -> anyhow::Result<String> {
        let out = self.lab.exec(&self.pod(pod).ns, &["iptables-save"])?;
        Ok(out
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                if l.starts_with(':') {
                    l.split(' ').take(2).collect::<Vec<_>>().join(" ")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n"))
    }

    /// `iptables-save -c` inside a pod: the rules with their packet and byte counters (a
    /// rule deleted and added again counts from zero; see [`rules_kept`]).
    pub fn iptables_counted(&self, pod: &str) -> anyhow::Result<String> {
        let out = self.lab.exec(&self.pod(pod).ns, &["iptables-save", "-c"])?;
        Ok(out
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect())
    }

    pub fn node_exec(&self, node: usize, args: &[&str]) -> anyhow::Result<String> {
        self.lab.exec(&self.nodes[node].ns, args)
    }
}

/// A line of `iptables-save -c` split into its counters (packets, bytes; none for table and
/// COMMIT lines) and the rest (a rule, or a chain with its policy).
fn counted_line(line: &str) -> (Option<(u64, u64)>, &str) {
    let parse = |c: &str| {
        let (p, b) = c.trim_matches(['[', ']']).split_once(':')?;
        Some((p.parse().ok()?, b.parse().ok()?))
    };
    if line.starts_with('[') {
        if let Some((c, rest)) = line.split_once(' ') {
            return (parse(c), rest);
        }
    }
    if line.starts_with(':') {
        if let Some((rest, c)) = line.rsplit_once(' ') {
            return (parse(c), rest);
        }
    }
    (None, line)
}

/// The packets counted by the rules of `saved` ([`Cluster::iptables_counted`]) that
/// contain `rule`.
pub fn counted_packets(saved: &str, rule: &str) -> u64 {
    saved
        .lines()
        .map(counted_line)
        .filter(|(_, r)| r.contains(rule))
        .filter_map(|(c, _)| c.map(|(p, _)| p))
        .sum()
}

/// Whether the rules of `before` are still those of `after`, none deleted and added again
/// (both from [`Cluster::iptables_counted`]): the same rules in the same order, and no
/// counter lower than it was. The error names what changed.
pub fn rules_kept(before: &str, after: &str) -> anyhow::Result<()> {
    let (b, a): (Vec<_>, Vec<_>) = (
        before.lines().map(counted_line).collect(),
        after.lines().map(counted_line).collect(),
    );
    if b.iter().map(|(_, r)| r).ne(a.iter().map(|(_, r)| r)) {
        bail!("the rules changed:\n{before}\n----\n{after}");
    }
    let reset: Vec<String> = b
        .iter()
        .zip(&a)
        .filter_map(|((cb, rule), (ca, _))| match (cb, ca) {
            (Some((pb, bb)), Some((pa, ba))) if pa < pb || ba < bb => {
                Some(format!("[{pb}:{bb}] -> [{pa}:{ba}] {rule}"))
            }
            _ => None,
        })
        .collect();
    if !reset.is_empty() {
        bail!(
            "rules deleted and added again (their counters went back):\n{}",
            reset.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "*nat\n:OUTPUT ACCEPT [5:300]\n:ISTIO_OUTPUT - [0:0]\n[3:180] -A OUTPUT -j ISTIO_OUTPUT\n[0:0] -A ISTIO_OUTPUT -o lo -j ACCEPT\nCOMMIT\n";

    #[test]
    fn rules_kept_sees_counters_go_back_and_changed_rules() {
        assert_eq!(counted_packets(BEFORE, "-j ISTIO_OUTPUT"), 3);
        rules_kept(BEFORE, BEFORE).unwrap();
        let more = BEFORE.replace("[3:180]", "[4:240]");
        rules_kept(BEFORE, &more).unwrap();
        let reinstalled = BEFORE.replace("[3:180]", "[0:0]");
        let e = rules_kept(BEFORE, &reinstalled).unwrap_err().to_string();
        assert!(
            e.contains("[3:180] -> [0:0] -A OUTPUT -j ISTIO_OUTPUT"),
            "{e}"
        );
        let changed = BEFORE.replace("-o lo", "-o eth0");
        let e = rules_kept(BEFORE, &changed).unwrap_err().to_string();
        assert!(e.contains("the rules changed"), "{e}");
    }
}
