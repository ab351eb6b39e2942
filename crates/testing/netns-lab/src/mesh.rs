//! Two "nodes" (network namespaces joined by a veth pair), each with a node proxy in
//! dedicated mode, one shared root CA, the capture rule in the client node, and helpers
//! to run an app server and an unmodified client there.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};

use super::control::{ControlPlane, CONTROL_PORT};
use super::peer::{write_lab_ca, NodeProxy};
use super::{http_get, wait_until, Lab, PacketCapture, Process};

pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
pub const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x78, 0, 0, 0, 0, 0, 1);
pub const SERVER_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x78, 0, 0, 0, 0, 0, 2);
pub const SERVICE_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const SERVICE_HOST: &str = "echo.default.svc.cluster.local";
pub const APP_PORT: u16 = 8080;
pub const SERVICE_PORT: u16 = 80;
pub const LINK_DEV: &str = "eth0";

/// The mesh both nodes load: two HBONE workloads and a service in front of the server.
pub fn mesh_yaml() -> String {
    format!(
        r#"workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  trustDomain: cluster.local
  workloadIps: ["{CLIENT_IP}", "{CLIENT_IP6}"]
  protocol: HBONE
  node: node1
  canonicalName: client
  canonicalRevision: v1
  workloadName: client
  services: {{}}
- uid: cluster1//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  trustDomain: cluster.local
  workloadIps: ["{SERVER_IP}", "{SERVER_IP6}"]
  protocol: HBONE
  node: node2
  canonicalName: server
  canonicalRevision: v1
  workloadName: server
  services:
    default/{SERVICE_HOST}:
      {SERVICE_PORT}: {APP_PORT}
services:
- name: echo
  namespace: default
  hostname: {SERVICE_HOST}
  vips: ["/{SERVICE_VIP}"]
  ports:
    {SERVICE_PORT}: {APP_PORT}
"#
    )
}

pub struct TwoNodes {
    pub lab: Lab,
    pub client_ns: String,
    pub server_ns: String,
    pub client_proxy: Process,
    pub server_proxy: Process,
    pub config_path: PathBuf,
    /// The plug-in CA directory both proxies trust.
    pub ca_dir: PathBuf,
    pub client_impl: NodeProxy,
    pub server_impl: NodeProxy,
    /// The control server, when the spec asked for one.
    pub control: Option<ControlPlane>,
}

/// The dedicated-mode capture rule (iptables arguments after the program): the client
/// node's outbound TCP goes to 15001, except what the proxy itself sends (marked 0x539).
pub const DEDICATED_CAPTURE: &[&str] = &[
    "-w",
    "-t",
    "nat",
    "-A",
    "OUTPUT",
    "-p",
    "tcp",
    "!",
    "-o",
    "lo",
    "-m",
    "mark",
    "!",
    "--mark",
    "0x539/0xfff",
    "-j",
    "REDIRECT",
    "--to-ports",
    "15001",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EchoMode {
    /// Writes back what it reads.
    Mirror,
    /// Writes back every chunk twice, so the two directions carry different byte counts.
    Double,
    /// Answers one HTTP/1.1 request (for clients such as curl) with 200 and a body naming
    /// the address the client came from: `hello from <ip:port>`.
    Http,
}

/// What a [`TwoNodes`] lab runs: which node proxy on each node, extra environment for both,
/// and extra YAML for the mesh they load.
pub struct TwoNodesSpec<'a> {
    pub tag: &'a str,
    pub client: NodeProxy,
    pub server: NodeProxy,
    pub env: &'a [(&'a str, String)],
    pub extra_yaml: &'a str,
    /// The mesh both nodes load instead of [`mesh_yaml`] (then `extra_yaml` is appended to
    /// it); it must keep the client and server workloads at their addresses.
    pub mesh: Option<&'a str>,
    /// Leave `ENABLE_ORIG_SRC` unset for Istio's ztunnel too (its default tries the
    /// client's address, which this lab cannot route back); ambit's is never set.
    pub orig_src_unset: bool,
    /// Run `ambit control` (from this binary) in the server node and configure both
    /// proxies from it over xDS, with certificates from its CA, instead of a local file.
    pub control: Option<PathBuf>,
}

impl<'a> TwoNodesSpec<'a> {
    /// `client` on node1, `server` on node2, the lab's mesh, nothing extra.
    pub fn of(tag: &'a str, client: NodeProxy, server: NodeProxy) -> TwoNodesSpec<'a> {
        TwoNodesSpec {
            tag,
            client,
            server,
            env: &[],
            extra_yaml: "",
            mesh: None,
            orig_src_unset: false,
            control: None,
        }
    }

    /// The same implementation on both nodes.
    pub fn pair(tag: &'a str, proxy: &NodeProxy) -> TwoNodesSpec<'a> {
        Self::of(tag, proxy.clone(), proxy.clone())
    }
}

impl TwoNodes {
    /// Builds the nodes and starts both proxies; returns once both report ready.
    pub fn start(
        ambit: &Path,
        tag: &str,
        extra_env: &[(&str, String)],
    ) -> anyhow::Result<TwoNodes> {
        Self::start_with(ambit, tag, extra_env, "")
    }

    /// Like [`TwoNodes::start`], with `extra_yaml` (e.g. a `policies:` section) appended to
    /// the mesh both nodes load.
    pub fn start_with(
        ambit: &Path,
        tag: &str,
        extra_env: &[(&str, String)],
        extra_yaml: &str,
    ) -> anyhow::Result<TwoNodes> {
        Self::launch(TwoNodesSpec {
            env: extra_env,
            extra_yaml,
            ..TwoNodesSpec::pair(tag, &NodeProxy::Ambit(ambit.to_path_buf()))
        })
    }

    /// Builds the nodes and starts the node proxy `spec` names on each.
    pub fn launch(spec: TwoNodesSpec) -> anyhow::Result<TwoNodes> {
        let lab = Lab::new(spec.tag)?;
        super::require_tool("iptables", "iptables")?;
        let client_ns = lab.netns("node1")?;
        let server_ns = lab.netns("node2")?;
        lab.link(
            &client_ns,
            &format!("{CLIENT_IP}/24"),
            &server_ns,
            &format!("{SERVER_IP}/24"),
            LINK_DEV,
        )?;
        // Dual stack: IPv6 too, without duplicate address detection so it is usable at once.
        for (ns, ip) in [(&client_ns, CLIENT_IP6), (&server_ns, SERVER_IP6)] {
            lab.exec(
                ns,
                &[
                    "ip",
                    "-6",
                    "addr",
                    "add",
                    &format!("{ip}/64"),
                    "dev",
                    LINK_DEV,
                    "nodad",
                ],
            )?;
        }
        // Service VIPs are not on any link: route them out so connect() gets as far as the
        // capture rule.
        lab.exec(
            &client_ns,
            &["ip", "route", "add", "default", "dev", LINK_DEV],
        )?;

        let ca_dir = lab.dir.path().join("ca");
        // Under a control server every certificate comes from it, so it gets a root of its
        // own (never the peer's test root, which Istio's FAKE_CA would also sign with).
        let lab_ca_users: &[&NodeProxy] = if spec.control.is_some() {
            &[]
        } else {
            &[&spec.client, &spec.server]
        };
        write_lab_ca(&ca_dir, lab_ca_users)?;
        let config_path = lab.dir.path().join("mesh.yaml");
        let mesh = spec.mesh.map_or_else(mesh_yaml, str::to_string);
        std::fs::write(&config_path, mesh + spec.extra_yaml)?;

        // The dedicated-mode capture rule, IPv4 and IPv6: the client's outbound TCP goes to
        // 15001, except what the proxy itself sends (marked 0x539).
        for iptables in ["iptables", "ip6tables"] {
            let mut args = vec![iptables];
            args.extend_from_slice(DEDICATED_CAPTURE);
            lab.exec(&client_ns, &args)?;
        }
        // With a control server in the server node, the client node's proxy must reach it
        // uncaptured (on Kubernetes the node proxy runs outside the pods' capture).
        let mut control = None;
        if let Some(ambit) = &spec.control {
            let port = CONTROL_PORT.to_string();
            let server_ip = SERVER_IP.to_string();
            lab.exec(
                &client_ns,
                &[
                    "iptables", "-w", "-t", "nat", "-I", "OUTPUT", "-p", "tcp", "-d", &server_ip,
                    "--dport", &port, "-j", "RETURN",
                ],
            )?;
            let mesh = std::fs::read_to_string(&config_path)?;
            let mut plane = ControlPlane::prepare(
                &lab,
                &server_ns,
                SocketAddr::from((SERVER_IP, CONTROL_PORT)),
                ambit,
                &ca_dir,
                &["node1", "node2"],
                &mesh,
            )?;
            plane.start(&lab)?;
            control = Some(plane);
        }

        let env = |proxy: &NodeProxy, workload: &str, node: &str| -> Vec<(&str, String)> {
            let mut env = match &control {
                Some(plane) => plane.proxy_env(node).unwrap_or_default(),
                None => proxy.env(&config_path, &ca_dir),
            };
            env.extend([
                ("PROXY_MODE", "dedicated".to_string()),
                (
                    "PROXY_WORKLOAD_INFO",
                    format!("default/{workload}/{workload}"),
                ),
                ("PACKET_MARK", "1337".to_string()),
                ("NODE_NAME", node.to_string()),
            ]);
            // The server's app shares the proxy's netns and nothing routes replies to a
            // spoofed source back to the proxy. ambit's default in dedicated mode connects
            // from its own address; Istio's would try the client's, so it is told not to
            // (unless the lab is asked for each one's default).
            if proxy.is_istio() && !spec.orig_src_unset {
                env.push(("ENABLE_ORIG_SRC", "false".to_string()));
            }
            env.extend(spec.env.iter().cloned());
            env
        };
        let start = |ns: &str, node: &str, proxy: &NodeProxy, workload: &str| {
            let (program, args) = proxy.command();
            lab.spawn(
                ns,
                &format!("proxy-{node}"),
                program,
                args,
                &env(proxy, workload, node),
            )
        };
        let client_proxy = start(&client_ns, "node1", &spec.client, "client")?;
        let server_proxy = start(&server_ns, "node2", &spec.server, "server")?;
        let nodes = TwoNodes {
            lab,
            client_ns,
            server_ns,
            client_proxy,
            server_proxy,
            config_path,
            ca_dir,
            client_impl: spec.client,
            server_impl: spec.server,
            control,
        };
        nodes.wait_ready(&nodes.client_ns, &nodes.client_proxy)?;
        nodes.wait_ready(&nodes.server_ns, &nodes.server_proxy)?;
        Ok(nodes)
    }

    fn wait_ready(&self, ns: &str, proxy: &Process) -> anyhow::Result<()> {
        let ready_addr: SocketAddr = "127.0.0.1:15021".parse()?;
        let result = wait_until(
            "the node proxy to report ready",
            Duration::from_secs(20),
            || {
                if !self.lab.is_running(proxy.pid) {
                    return true;
                }
                matches!(http_get(ns, ready_addr, "/healthz/ready"), Ok((200, _)))
            },
        );
        if !self.lab.is_running(proxy.pid) || result.is_err() {
            let log = std::fs::read_to_string(&proxy.log).unwrap_or_default();
            bail!("node proxy in {ns} did not become ready; its log:\n{log}");
        }
        Ok(())
    }

    /// The proxy's Prometheus text from inside its node.
    pub fn metrics(&self, ns: &str) -> anyhow::Result<String> {
        let (status, body) = http_get(ns, "127.0.0.1:15020".parse()?, "/metrics")?;
        if status != 200 {
            bail!("metrics answered {status}");
        }
        Ok(body)
    }

    /// An app server listening on `APP_PORT` in the server node. Each accepted
    /// connection's peer address is sent on the returned channel.
    pub fn start_app_server(&self, mode: EchoMode) -> anyhow::Result<mpsc::Receiver<SocketAddr>> {
        // `[::]` takes IPv4 too (mapped addresses).
        let listener = Lab::in_netns(&self.server_ns, || {
            TcpListener::bind(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, APP_PORT, 0, 0))
        })?;
        Ok(serve_echo(listener, mode))
    }

    /// A TCP connection made from the client node, the way an unmodified app makes it.
    pub fn connect_from_client(&self, dst: SocketAddr) -> anyhow::Result<TcpStream> {
        let s = Lab::in_netns(&self.client_ns, move || {
            TcpStream::connect_timeout(&dst, Duration::from_secs(10))
        })
        .with_context(|| format!("connecting to {dst} from the client node"))?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(s)
    }

    /// Starts `tcpdump` on the client node's link; stop it with [`PacketCapture::finish`].
    pub fn capture_link(&self) -> anyhow::Result<PacketCapture> {
        self.lab.capture(&self.client_ns, LINK_DEV)
    }
}

/// Serves `listener` with the echo app on background threads; each accepted connection's
/// peer address is sent on the returned channel.
pub fn serve_echo(listener: TcpListener, mode: EchoMode) -> mpsc::Receiver<SocketAddr> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            if let Ok(peer) = conn.peer_addr() {
                let _ = tx.send(peer);
            }
            std::thread::spawn(move || echo(conn, mode));
        }
    });
    rx
}

fn echo(mut conn: TcpStream, mode: EchoMode) {
    if mode == EchoMode::Http {
        return answer_http(conn);
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let times = if mode == EchoMode::Double { 2 } else { 1 };
                for _ in 0..times {
                    if conn.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            }
        }
    }
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

fn answer_http(mut conn: TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 64 * 1024 {
            return;
        }
    }
    let peer = conn
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let body = format!("hello from {peer}\n");
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(response.as_bytes());
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

/// Sums the samples of `name` whose labels contain every `label="value"` in `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}
