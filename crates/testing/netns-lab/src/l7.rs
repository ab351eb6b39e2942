//! A mesh with a real `ambit waypoint`: the two lab nodes (a node proxy each, dedicated
//! mode), the waypoint pod in the server node, and the `echo` service behind it with two
//! endpoints: the server pod (HBONE, through its node proxy) and a second pod outside
//! the mesh (plaintext), both HTTP/1.1 and h2c servers that say which pod answered. Port
//! 3306 of the service is declared TCP and server-first (a banner before any byte from
//! the client).
//!
//! Clients run in the client node, as unmodified apps: real HTTP/1.1 and HTTP/2
//! connections to the service's VIP, captured by the client's node proxy.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::mesh::{TwoNodes, TwoNodesSpec, APP_PORT, LINK_DEV, SERVER_IP, SERVICE_PORT};
use super::peer::NodeProxy;
use super::waypoint::{WAYPOINT_IP, WAYPOINT_PORT};
use super::{http_get, wait_until, Lab, Process};

/// The second endpoint of `echo`: a pod outside the mesh, in the server node.
pub const PLAIN_POD_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 4);
/// `echo-direct`: the same endpoints as `echo` without a waypoint (the path the waypoint
/// is measured against).
pub const DIRECT_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
pub const DIRECT_HOST: &str = "echo-direct.default.svc.cluster.local";
/// `flaky`: behind the waypoint, one good endpoint (the plaintext pod) and one whose
/// address refuses every connection ([`DEAD_POD_IP`]).
pub const FLAKY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 12);
pub const FLAKY_HOST: &str = "flaky.default.svc.cluster.local";
pub const DEAD_POD_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 5);
/// `empty`: behind the waypoint, no endpoint at all.
pub const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 13);
pub const EMPTY_HOST: &str = "empty.default.svc.cluster.local";
/// `echo-v1` and `echo-v2`: no waypoint, one endpoint each (the server pod and the plain
/// pod): the backends routes split `echo` between.
pub const V1_HOST: &str = "echo-v1.default.svc.cluster.local";
pub const V2_HOST: &str = "echo-v2.default.svc.cluster.local";
/// `grpc-echo`: behind the waypoint, both pods, for GRPCRoutes (which never share a
/// frontend with HTTPRoutes).
pub const GRPC_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 17);
pub const GRPC_HOST: &str = "grpc-echo.default.svc.cluster.local";
/// The service port declared TCP (and its target port).
pub const TCP_PORT: u16 = 3306;
/// The waypoint's operator ports (the server node's proxy has the usual ones).
pub const WAYPOINT_STATS: u16 = 15120;
pub const WAYPOINT_READY: u16 = 15121;
pub const WAYPOINT_ADMIN: u16 = 15100;
pub const WAYPOINT_ID: &str = "spiffe://cluster.local/ns/default/sa/waypoint";
/// What the app answers with, by pod.
pub const SERVER_POD: &str = "server";
pub const PLAIN_POD: &str = "plain";

/// The mesh: [`super::waypoint::waypoint_mesh`]'s client, server and waypoint pods, a
/// plaintext pod, and `echo` (VIP port 80 undeclared, 3306 declared TCP) behind the
/// waypoint.
pub fn l7_mesh() -> String {
    use super::mesh::{CLIENT_IP, CLIENT_IP6, SERVER_IP6, SERVICE_HOST, SERVICE_VIP};
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
      {TCP_PORT}: {TCP_PORT}
    default/{DIRECT_HOST}:
      {SERVICE_PORT}: {APP_PORT}
    default/{V1_HOST}:
      {SERVICE_PORT}: {APP_PORT}
    default/{GRPC_HOST}:
      {SERVICE_PORT}: {APP_PORT}
- uid: cluster1//v1/Pod/default/plain
  name: plain
  namespace: default
  serviceAccount: plain
  trustDomain: cluster.local
  workloadIps: ["{PLAIN_POD_IP}"]
  protocol: NONE
  node: node2
  canonicalName: plain
  canonicalRevision: v1
  workloadName: plain
  services:
    default/{SERVICE_HOST}:
      {SERVICE_PORT}: {APP_PORT}
      {TCP_PORT}: {TCP_PORT}
    default/{DIRECT_HOST}:
      {SERVICE_PORT}: {APP_PORT}
    default/{FLAKY_HOST}:
      {SERVICE_PORT}: {APP_PORT}
    default/{V2_HOST}:
      {SERVICE_PORT}: {APP_PORT}
    default/{GRPC_HOST}:
      {SERVICE_PORT}: {APP_PORT}
- uid: cluster1//v1/Pod/default/dead
  name: dead
  namespace: default
  serviceAccount: dead
  trustDomain: cluster.local
  workloadIps: ["{DEAD_POD_IP}"]
  protocol: NONE
  node: node2
  canonicalName: dead
  canonicalRevision: v1
  workloadName: dead
  services:
    default/{FLAKY_HOST}:
      {SERVICE_PORT}: {APP_PORT}
- uid: cluster1//v1/Pod/default/waypoint
  name: waypoint
  namespace: default
  serviceAccount: waypoint
  trustDomain: cluster.local
  workloadIps: ["{WAYPOINT_IP}"]
  protocol: HBONE
  node: node2
  canonicalName: waypoint
  canonicalRevision: v1
  workloadName: waypoint
  services: {{}}
services:
- name: echo
  namespace: default
  hostname: {SERVICE_HOST}
  vips: ["/{SERVICE_VIP}"]
  ports:
    {SERVICE_PORT}: {APP_PORT}
    {TCP_PORT}: {TCP_PORT}
  appProtocols:
    {TCP_PORT}: TCP
  waypoint: {{destination: "/{WAYPOINT_IP}", hboneMtlsPort: {WAYPOINT_PORT}}}
- name: flaky
  namespace: default
  hostname: {FLAKY_HOST}
  vips: ["/{FLAKY_VIP}"]
  ports:
    {SERVICE_PORT}: {APP_PORT}
  waypoint: {{destination: "/{WAYPOINT_IP}", hboneMtlsPort: {WAYPOINT_PORT}}}
- name: empty
  namespace: default
  hostname: {EMPTY_HOST}
  vips: ["/{EMPTY_VIP}"]
  ports:
    {SERVICE_PORT}: {APP_PORT}
  waypoint: {{destination: "/{WAYPOINT_IP}", hboneMtlsPort: {WAYPOINT_PORT}}}
- name: echo-direct
  namespace: default
  hostname: {DIRECT_HOST}
  vips: ["/{DIRECT_VIP}"]
  ports:
    {SERVICE_PORT}: {APP_PORT}
- name: echo-v1
  namespace: default
  hostname: {V1_HOST}
  vips: ["/10.96.0.15"]
  ports:
    {SERVICE_PORT}: {APP_PORT}
- name: echo-v2
  namespace: default
  hostname: {V2_HOST}
  vips: ["/10.96.0.16"]
  ports:
    {SERVICE_PORT}: {APP_PORT}
- name: grpc-echo
  namespace: default
  hostname: {GRPC_HOST}
  vips: ["/{GRPC_VIP}"]
  ports:
    {SERVICE_PORT}: {APP_PORT}
  appProtocols:
    {SERVICE_PORT}: GRPC
  waypoint: {{destination: "/{WAYPOINT_IP}", hboneMtlsPort: {WAYPOINT_PORT}}}
"#
    )
}

/// One HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
}

impl Reply {
    /// The pod that answered (the first word of an app's body), if an app did.
    pub fn pod(&self) -> Option<&str> {
        self.body
            .split(' ')
            .next()
            .filter(|p| *p == SERVER_POD || *p == PLAIN_POD)
    }
}

/// The running lab.
pub struct L7Lab {
    pub nodes: TwoNodes,
    pub waypoint: Process,
    pub policies: std::path::PathBuf,
    /// Runs the apps and the clients.
    pub rt: tokio::runtime::Runtime,
    /// What the apps saw and keep.
    pub app: Arc<AppState>,
    ambit: std::path::PathBuf,
    env: Vec<(String, String)>,
    starts: usize,
}

/// Starts `ambit waypoint` in the server node with `env`, its log named `name`, and waits
/// until it reports ready.
fn start_waypoint(
    nodes: &TwoNodes,
    ambit: &Path,
    env: &[(String, String)],
    name: &str,
) -> anyhow::Result<Process> {
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let waypoint = nodes
        .lab
        .spawn(&nodes.server_ns, name, ambit, &["waypoint"], &env)?;
    let ready: SocketAddr = ([127, 0, 0, 1], WAYPOINT_READY).into();
    let up = wait_until(
        "the waypoint to report ready",
        Duration::from_secs(20),
        || {
            !nodes.lab.is_running(waypoint.pid)
                || matches!(
                    http_get(&nodes.server_ns, ready, "/healthz/ready"),
                    Ok((200, _))
                )
        },
    );
    if up.is_err() || !nodes.lab.is_running(waypoint.pid) {
        let log = std::fs::read_to_string(&waypoint.log).unwrap_or_default();
        bail!("the waypoint did not become ready; its log:\n{log}");
    }
    Ok(waypoint)
}

impl L7Lab {
    /// Starts the nodes, the apps and `ambit waypoint` (from `ambit`) with `policies` (a
    /// YAML file of AuthorizationPolicy documents), and waits until the waypoint is ready.
    pub fn launch(tag: &str, ambit: &Path, policies: &str) -> anyhow::Result<L7Lab> {
        Self::launch_with_env(tag, ambit, policies, &[])
    }

    /// [`L7Lab::launch`] with more environment for the waypoint (overriding the lab's).
    pub fn launch_with_env(
        tag: &str,
        ambit: &Path,
        policies: &str,
        extra_env: &[(&str, String)],
    ) -> anyhow::Result<L7Lab> {
        Self::launch_with_mesh(tag, ambit, policies, extra_env, &l7_mesh())
    }

    /// [`L7Lab::launch_with_env`] with `mesh` (the local config both node proxies and the
    /// waypoint read: [`l7_mesh`] with more in it, say) in place of [`l7_mesh`].
    pub fn launch_with_mesh(
        tag: &str,
        ambit: &Path,
        policies: &str,
        extra_env: &[(&str, String)],
        mesh: &str,
    ) -> anyhow::Result<L7Lab> {
        let proxy = NodeProxy::Ambit(ambit.to_path_buf());
        let nodes = TwoNodes::launch(TwoNodesSpec {
            mesh: Some(mesh),
            ..TwoNodesSpec::pair(tag, &proxy)
        })?;
        // The dead pod's address is there, with nothing listening: connections to it are
        // refused at once.
        for ip in [WAYPOINT_IP, PLAIN_POD_IP, DEAD_POD_IP] {
            nodes.lab.exec(
                &nodes.server_ns,
                &["ip", "addr", "add", &format!("{ip}/24"), "dev", LINK_DEV],
            )?;
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let app = Arc::new(AppState::default());
        for (ip, name) in [(SERVER_IP, SERVER_POD), (PLAIN_POD_IP, PLAIN_POD)] {
            let http = bind(&nodes.server_ns, SocketAddr::from((ip, APP_PORT)))?;
            let tcp = bind(&nodes.server_ns, SocketAddr::from((ip, TCP_PORT)))?;
            let _guard = rt.enter();
            let http = tokio::net::TcpListener::from_std(http)?;
            let tcp = tokio::net::TcpListener::from_std(tcp)?;
            rt.spawn(serve_app(http, name.into(), app.clone()));
            rt.spawn(serve_banner(tcp, name));
        }
        let policies_path = nodes.lab.dir.path().join("policies.yaml");
        std::fs::write(&policies_path, policies)?;
        let env: Vec<(&str, String)> = vec![
            ("POD_NAME", "waypoint".into()),
            ("POD_NAMESPACE", "default".into()),
            ("SERVICE_ACCOUNT", "waypoint".into()),
            ("INSTANCE_IP", WAYPOINT_IP.to_string()),
            ("LOCAL_XDS_PATH", nodes.config_path.display().to_string()),
            ("LOCAL_CA_DIR", nodes.ca_dir.display().to_string()),
            ("AMBIT_WAYPOINT_CONFIG", policies_path.display().to_string()),
            (
                "AMBIT_HBONE_ADDR",
                SocketAddr::from((WAYPOINT_IP, WAYPOINT_PORT)).to_string(),
            ),
            ("AMBIT_ADMIN_ADDR", format!("127.0.0.1:{WAYPOINT_ADMIN}")),
            ("AMBIT_STATS_ADDR", format!("127.0.0.1:{WAYPOINT_STATS}")),
            (
                "AMBIT_READINESS_ADDR",
                format!("127.0.0.1:{WAYPOINT_READY}"),
            ),
            ("TERMINATION_GRACE_PERIOD_SECONDS", "15".into()),
            ("RUST_LOG", "info".into()),
            ("AMBIT_ACCESS_LOG", "true".into()),
        ];
        let mut env: Vec<(String, String)> =
            env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        env.extend(extra_env.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let waypoint = start_waypoint(&nodes, ambit, &env, "waypoint")?;
        Ok(L7Lab {
            nodes,
            waypoint,
            policies: policies_path,
            rt,
            app,
            ambit: ambit.to_path_buf(),
            env,
            starts: 1,
        })
    }

    /// Stops the waypoint (SIGTERM, then its drain) and starts it again with the same
    /// environment, waiting until it is ready: what survives a restart is what the
    /// configuration and the mesh state make, nothing held in memory.
    pub fn restart_waypoint(&mut self) -> anyhow::Result<()> {
        self.nodes.lab.signal_and_wait(
            self.waypoint.pid,
            nix::sys::signal::Signal::SIGTERM,
            Duration::from_secs(30),
        )?;
        self.starts += 1;
        let name = format!("waypoint-{}", self.starts);
        self.waypoint = start_waypoint(&self.nodes, &self.ambit, &self.env, &name)?;
        Ok(())
    }

    /// The waypoint's Prometheus text.
    pub fn waypoint_metrics(&self) -> anyhow::Result<String> {
        let (status, body) = http_get(
            &self.nodes.server_ns,
            ([127, 0, 0, 1], WAYPOINT_STATS).into(),
            "/stats/prometheus",
        )?;
        anyhow::ensure!(status == 200, "waypoint metrics: {status}");
        Ok(body)
    }

    /// The waypoint's `/config_dump`.
    pub fn waypoint_config_dump(&self) -> anyhow::Result<serde_json::Value> {
        let (status, body) = http_get(
            &self.nodes.server_ns,
            ([127, 0, 0, 1], WAYPOINT_ADMIN).into(),
            "/config_dump",
        )?;
        anyhow::ensure!(status == 200, "waypoint config dump: {status}");
        Ok(serde_json::from_str(&body)?)
    }

    /// The waypoint's log so far.
    pub fn waypoint_log(&self) -> String {
        std::fs::read_to_string(&self.waypoint.log).unwrap_or_default()
    }

    /// A connection from the client node to the service's VIP at `port`, as an app makes
    /// it (the client's node proxy captures it).
    pub fn connect(&self, port: u16) -> anyhow::Result<tokio::net::TcpStream> {
        self.connect_to(SocketAddr::from((super::mesh::SERVICE_VIP, port)))
    }

    /// A connection from the client node to `dst`, as an app makes it.
    pub fn connect_to(&self, dst: SocketAddr) -> anyhow::Result<tokio::net::TcpStream> {
        let s = self.nodes.connect_from_client(dst)?;
        s.set_nonblocking(true)?;
        let _guard = self.rt.enter();
        Ok(tokio::net::TcpStream::from_std(s)?)
    }

    /// Requests on one HTTP/1.1 connection, one after the other (keep-alive).
    pub fn http1(&self, requests: &[(&str, &str)]) -> anyhow::Result<Vec<Reply>> {
        let requests = requests
            .iter()
            .map(|(m, p)| request(m, p))
            .collect::<anyhow::Result<Vec<_>>>()?;
        self.send_http1(requests)
    }

    /// [`L7Lab::http1`] with requests built by the caller ([`request`] makes one to the
    /// service; add headers to it).
    pub fn send_http1(
        &self,
        requests: Vec<http::Request<Full<Bytes>>>,
    ) -> anyhow::Result<Vec<Reply>> {
        self.send_http1_to(
            SocketAddr::from((super::mesh::SERVICE_VIP, SERVICE_PORT)),
            requests,
        )
    }

    /// [`L7Lab::send_http1`] on a connection to `dst`.
    pub fn send_http1_to(
        &self,
        dst: SocketAddr,
        requests: Vec<http::Request<Full<Bytes>>>,
    ) -> anyhow::Result<Vec<Reply>> {
        let stream = self.connect_to(dst)?;
        self.rt.block_on(async move {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .context("HTTP/1.1 handshake")?;
            tokio::spawn(conn);
            let mut replies = Vec::new();
            for req in requests {
                sender.ready().await.context("connection ready")?;
                let resp = sender.send_request(req).await.context("HTTP/1.1 request")?;
                replies.push(reply(resp).await?);
            }
            Ok(replies)
        })
    }

    /// `n` requests (`concurrency` at a time) on ONE HTTP/2 connection.
    pub fn h2(&self, method: &str, path: &str, n: usize) -> anyhow::Result<Vec<Reply>> {
        let stream = self.connect(SERVICE_PORT)?;
        let (method, path) = (method.to_string(), path.to_string());
        self.rt.block_on(async move {
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .context("HTTP/2 handshake")?;
            tokio::spawn(conn);
            let mut tasks = Vec::new();
            for _ in 0..n {
                let mut sender = sender.clone();
                let req = request(&method, &path)?;
                tasks.push(tokio::spawn(async move {
                    let resp = sender.send_request(req).await.context("HTTP/2 request")?;
                    reply(resp).await
                }));
            }
            let mut replies = Vec::new();
            for t in tasks {
                replies.push(t.await??);
            }
            Ok(replies)
        })
    }
}

impl L7Lab {
    /// The `SETTINGS_MAX_CONCURRENT_STREAMS` the waypoint's HBONE listener advertises, read
    /// by an HTTP/2 client presenting `identity`, after one CONNECT has been answered.
    pub fn hbone_max_streams(&self, identity: &str, authority: &str) -> anyhow::Result<usize> {
        let ca = ambit_identity::CertificateAuthority::from_plugin_dir(&self.nodes.ca_dir)?;
        let id = ambit_identity::SpiffeId::parse(identity)?;
        let cert = ca.issue(&id, Duration::from_secs(3600))?;
        let waypoint_id = ambit_identity::SpiffeId::parse(WAYPOINT_ID)?;
        let tls = ambit_identity::tls::client_config(&cert, std::slice::from_ref(&waypoint_id))?;
        let dst = SocketAddr::from((WAYPOINT_IP, WAYPOINT_PORT));
        let tcp = Lab::in_netns(&self.nodes.server_ns, || {
            std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(10))
        })?;
        tcp.set_nonblocking(true)?;
        let authority = authority.to_string();
        self.rt.block_on(async move {
            let tcp = tokio::net::TcpStream::from_std(tcp)?;
            let tls = ambit_hbone::tls::connect(tcp, tls).await?;
            let (mut send, conn) = h2::client::handshake(tls).await?;
            tokio::spawn(conn);
            let req = http::Request::builder()
                .method(http::Method::CONNECT)
                .uri(authority)
                .body(())?;
            let (response, _stream) = send.send_request(req, false)?;
            let status = response.await?.status();
            anyhow::ensure!(status == 200, "CONNECT answered {status}");
            Ok(send.current_max_send_streams())
        })
    }

    /// Opens a CONNECT with `authority` straight to the waypoint's HBONE port, from the
    /// server node, presenting `identity` (a certificate of the lab's CA): the answer's
    /// status (200 when it is taken).
    pub fn hbone_connect(&self, identity: &str, authority: &str) -> anyhow::Result<u16> {
        use ambit_hbone::{ClientSettings, ConnectRequest, HboneError, Pool, PoolKey};
        let ca = ambit_identity::CertificateAuthority::from_plugin_dir(&self.nodes.ca_dir)?;
        let id = ambit_identity::SpiffeId::parse(identity)?;
        let cert = ca.issue(&id, Duration::from_secs(3600))?;
        let waypoint_id = ambit_identity::SpiffeId::parse(WAYPOINT_ID)?;
        let tls = ambit_identity::tls::client_config(&cert, std::slice::from_ref(&waypoint_id))?;
        let dst = SocketAddr::from((WAYPOINT_IP, WAYPOINT_PORT));
        let tcp = Lab::in_netns(&self.nodes.server_ns, || {
            std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(10))
        })?;
        tcp.set_nonblocking(true)?;
        let authority = ambit_hbone::parse_authority(authority)?;
        self.rt.block_on(async move {
            let tcp = tokio::net::TcpStream::from_std(tcp)?;
            let pool = Pool::new(ClientSettings::default());
            let key = PoolKey {
                src_identity: id.to_string(),
                dst_identities: vec![waypoint_id.to_string()],
                dst,
                src_ip: dst.ip(),
            };
            let connect = move || async move { ambit_hbone::tls::connect(tcp, tls).await };
            match pool
                .connect(key, connect, &ConnectRequest::new(authority))
                .await
            {
                Ok(_) => Ok(200),
                Err(HboneError::Status(s)) => Ok(s.as_u16()),
                Err(e) => Err(anyhow::anyhow!("HBONE to the waypoint: {e}")),
            }
        })
    }
}

fn bind(ns: &str, addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let l = Lab::in_netns(ns, || std::net::TcpListener::bind(addr))
        .with_context(|| format!("binding {addr} in {ns}"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// A request to the `echo` service (body `ping`).
pub fn request(method: &str, path: &str) -> anyhow::Result<http::Request<Full<Bytes>>> {
    Ok(http::Request::builder()
        .method(method)
        .uri(format!(
            "http://{}:{SERVICE_PORT}{path}",
            super::mesh::SERVICE_HOST
        ))
        .header(
            "host",
            format!("{}:{SERVICE_PORT}", super::mesh::SERVICE_HOST),
        )
        .body(Full::new(Bytes::from_static(b"ping")))?)
}

/// An answer read whole.
pub(crate) async fn reply(resp: http::Response<hyper::body::Incoming>) -> anyhow::Result<Reply> {
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(Reply {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        headers,
    })
}

/// What the apps share: counts, what they saw, and the state of `/flaky/` paths.
#[derive(Debug, Default)]
pub struct AppState {
    /// `/slow` requests begun.
    pub slow_started: AtomicUsize,
    /// `/delay/<ms>/` requests whose delay ran out, so that the app went on to answer: a
    /// proxy's answer that comes while this has not moved came before the app's.
    pub delays_ended: AtomicUsize,
    /// Every request answered: `<pod> <method> <path> host=<host>`.
    pub seen: std::sync::Mutex<Vec<String>>,
    /// Connections the apps accepted (both pods): a proxy that reuses its onward
    /// connections keeps this still across requests.
    pub connections: AtomicUsize,
    /// Requests so far per `/flaky/<key>/<n>` key.
    flaky: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

impl AppState {
    /// The requests seen whose line contains `needle`.
    pub fn seen_with(&self, needle: &str) -> Vec<String> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }
}

type AppBody =
    http_body_util::combinators::UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// The app: HTTP/1.1 or h2c (prior knowledge, or by an `Upgrade: h2c`), answering
/// `<pod> <method> <path>` and the request body's length, with each `x-` request header
/// and the host sent back as `echo-<name>`; `Upgrade: websocket` (or `echo`) switches to a
/// byte echo. A path segment `/delay/<ms>/` waits first, `/status/<code>` answers
/// with that code, `/flaky/<key>/<n>` answers 503 to the first `n` requests for `key`,
/// `/close/<key>/<n>` closes the connection unanswered on the first `n`;
/// `/slow` answers after a second. A gRPC request (`application/grpc`) is answered by a
/// real gRPC server: a unary method that replies `<pod> <path> <message>`.
pub(crate) async fn serve_app(
    listener: tokio::net::TcpListener,
    name: Arc<str>,
    state: Arc<AppState>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        state.connections.fetch_add(1, Ordering::SeqCst);
        let (name, state) = (name.clone(), state.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req| answer(name.clone(), req, state.clone()));
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The app's way to end a connection without answering (`/close/<key>/<n>`): hyper closes
/// an HTTP/1.1 connection, or resets an HTTP/2 stream, when a service fails.
#[derive(Debug)]
pub(crate) struct ClosedUnanswered;

impl std::fmt::Display for ClosedUnanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("closed without an answer, as asked")
    }
}

impl std::error::Error for ClosedUnanswered {}

fn full(b: impl Into<Bytes>) -> AppBody {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The number after `/<word>/` in `path`.
fn segment_after<'p>(path: &'p str, word: &str) -> Option<&'p str> {
    let at = path.find(&format!("/{word}/"))? + word.len() + 2;
    Some(path[at..].split(['/', '?']).next().unwrap_or_default())
}

type AnswerFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<http::Response<AppBody>, ClosedUnanswered>> + Send>,
>;

/// [`answer`] boxed: the requests of an upgraded connection are answered by the function
/// that upgraded it.
fn answer_boxed(
    name: Arc<str>,
    req: http::Request<hyper::body::Incoming>,
    state: Arc<AppState>,
) -> AnswerFuture {
    Box::pin(answer(name, req, state))
}

async fn answer(
    name: Arc<str>,
    mut req: http::Request<hyper::body::Incoming>,
    state: Arc<AppState>,
) -> Result<http::Response<AppBody>, ClosedUnanswered> {
    let upgrade = req
        .headers()
        .get("upgrade")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).to_ascii_lowercase());
    // `Upgrade: h2c`, as a backend that takes HTTP/2 by upgrade: 101, then HTTP/2 on the
    // same connection (the requests on it are answered as any other).
    if upgrade.as_deref() == Some("h2c") {
        let upgraded = hyper::upgrade::on(&mut req);
        state
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!(
                "{name} {} {} upgrade=h2c",
                req.method(),
                req.uri().path()
            ));
        let (name, state) = (name.clone(), state.clone());
        tokio::spawn(async move {
            if let Ok(io) = upgraded.await {
                let service = hyper::service::service_fn(move |req| {
                    answer_boxed(name.clone(), req, state.clone())
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(io, service)
                    .await;
            }
        });
        let mut resp = http::Response::new(full(Bytes::new()));
        *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
        resp.headers_mut()
            .insert("upgrade", http::HeaderValue::from_static("h2c"));
        resp.headers_mut()
            .insert("connection", http::HeaderValue::from_static("upgrade"));
        return Ok(resp);
    }
    // `Upgrade: websocket` (or `echo`): 101 with the same protocol, then every byte echoed
    // after the pod's name.
    if let Some(protocol) = upgrade.filter(|u| u == "websocket" || u == "echo") {
        let upgraded = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            if let Ok(io) = upgraded.await {
                let mut io = TokioIo::new(io);
                let _ = io.write_all(format!("{name} upgraded\n").as_bytes()).await;
                let (mut r, mut w) = tokio::io::split(io);
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
        });
        let mut resp = http::Response::new(full(Bytes::new()));
        *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
        if let Ok(v) = http::HeaderValue::from_str(&protocol) {
            resp.headers_mut().insert("upgrade", v);
        }
        resp.headers_mut()
            .insert("connection", http::HeaderValue::from_static("upgrade"));
        return Ok(resp);
    }
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let host = req
        .headers()
        .get("host")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    state
        .seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(format!("{name} {method} {path} host={host}"));
    let grpc = req
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        return Ok(answer_grpc(name, req).await);
    }
    if path.starts_with("/slow") {
        state.slow_started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if let Some(ms) = segment_after(&path, "delay").and_then(|m| m.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        state.delays_ended.fetch_add(1, Ordering::SeqCst);
    }
    let mut status = segment_after(&path, "status")
        .and_then(|c| c.parse().ok())
        .and_then(|c| http::StatusCode::from_u16(c).ok())
        .unwrap_or(http::StatusCode::OK);
    if let Some(key) = segment_after(&path, "close") {
        let times: u32 = segment_after(&path, key)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let mut closed = state.flaky.lock().unwrap_or_else(|p| p.into_inner());
        let count = closed.entry(format!("close:{key}")).or_default();
        *count += 1;
        if *count <= times {
            // The request was read whole; the connection ends without an answer.
            return Err(ClosedUnanswered);
        }
    }
    // `/fail-on/<pod>/`: the named pod answers 503, the others as usual.
    if segment_after(&path, "fail-on") == Some(&*name) {
        status = http::StatusCode::SERVICE_UNAVAILABLE;
    }
    if let Some(key) = segment_after(&path, "flaky") {
        let fails: u32 = segment_after(&path, key)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let mut flaky = state.flaky.lock().unwrap_or_else(|p| p.into_inner());
        let count = flaky.entry(key.to_string()).or_default();
        *count += 1;
        if *count <= fails {
            status = http::StatusCode::SERVICE_UNAVAILABLE;
        }
    }
    let request_id = req
        .headers()
        .get("x-request-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let echoed: Vec<(http::HeaderName, http::HeaderValue)> = req
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-") || *k == http::header::HOST)
        .filter_map(|(k, v)| {
            let name = http::HeaderName::from_bytes(format!("echo-{k}").as_bytes()).ok()?;
            Some((name, v.clone()))
        })
        .collect();
    let body = req.into_body().collect().await.map(|b| b.to_bytes().len());
    let text = format!("{name} {method} {path} {} {request_id}", body.unwrap_or(0));
    let mut resp = http::Response::new(full(text));
    *resp.status_mut() = status;
    for (k, v) in echoed {
        resp.headers_mut().append(k, v);
    }
    Ok(resp)
}

/// A unary gRPC method served by tonic: replies `<pod> <path> <message>`; the method
/// `Fail` answers UNAVAILABLE.
async fn answer_grpc(
    name: Arc<str>,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<AppBody> {
    struct Hello {
        reply: String,
        fail: bool,
    }
    impl tonic::server::UnaryService<String> for Hello {
        type Response = String;
        type Future = std::future::Ready<Result<tonic::Response<String>, tonic::Status>>;
        fn call(&mut self, request: tonic::Request<String>) -> Self::Future {
            if self.fail {
                return std::future::ready(Err(tonic::Status::unavailable("asked to fail")));
            }
            let reply = format!("{} {}", self.reply, request.into_inner());
            std::future::ready(Ok(tonic::Response::new(reply)))
        }
    }
    let path = req.uri().path().to_string();
    let hello = Hello {
        fail: path.ends_with("/Fail"),
        reply: format!("{name} {path}"),
    };
    let mut server =
        tonic::server::Grpc::new(tonic::codec::ProstCodec::<String, String>::default());
    let response = server.unary(hello, req).await;
    response.map(|b| {
        b.map_err(|s| Box::new(s) as Box<dyn std::error::Error + Send + Sync>)
            .boxed_unsync()
    })
}

/// A server-first protocol: a banner naming the pod, then an echo.
async fn serve_banner(listener: tokio::net::TcpListener, name: &'static str) {
    use tokio::io::AsyncWriteExt;
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            if stream
                .write_all(format!("{name} banner\n").as_bytes())
                .await
                .is_ok()
            {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
        });
    }
}
