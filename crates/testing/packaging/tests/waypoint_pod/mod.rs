//! What a waypoint pod of the image test meets: one network namespace standing for a node,
//! with `ambit control` as istiod (delta xDS and the CA on one port, a token bound to the
//! waypoint's identity), a plaintext app pod behind the `echo` service, and a client doing
//! what a source node proxy does: mutual TLS to the waypoint with the client's certificate,
//! a CONNECT to the service's `VIP:port`, then one HTTP/1.1 request in the tunnel.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ambit_hbone::{parse_authority, ClientSettings, ConnectRequest, Pool, PoolKey};
use ambit_identity::{CertificateAuthority, SpiffeId};
use ambit_netns_lab::{Lab, Process};
use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The node's address, where `ambit control` listens.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
pub const WAYPOINT_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
/// The app pod: outside the mesh (plaintext from the waypoint).
pub const APP_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 3);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 4);
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const SERVICE_PORT: u16 = 80;
pub const APP_PORT: u16 = 8080;
pub const SERVICE_HOST: &str = "echo.default.svc.cluster.local";
pub const WAYPOINT_ID: &str = "spiffe://cluster.local/ns/default/sa/waypoint";
pub const CLIENT_ID: &str = "spiffe://cluster.local/ns/default/sa/client";
pub const CONTROL_ADDR: &str = "10.79.0.1:15012";
const CONTROL_ADMIN: &str = "127.0.0.1:15014";

/// The waypoint's pod name (what `POD_NAME` says; it finds itself in the mesh by it).
pub const WAYPOINT_POD: &str = "waypoint-0";

/// The mesh `ambit control` serves: the client, the app (an endpoint of `echo`) and the
/// waypoint pods; `echo` behind the waypoint.
fn mesh_yaml() -> String {
    // Pod `pod` of workload (and service account) `name`.
    let workload = |pod: &str, name: &str, ip: Ipv4Addr, protocol: &str, services: &str| {
        format!(
            "- uid: cluster1//v1/Pod/default/{pod}\n  name: {pod}\n  namespace: default\n  serviceAccount: {name}\n  trustDomain: cluster.local\n  workloadIps: [\"{ip}\"]\n  protocol: {protocol}\n  node: node1\n  canonicalName: {name}\n  workloadName: {name}\n  services: {services}\n"
        )
    };
    format!(
        "workloads:\n{}{}{}services:\n- name: echo\n  namespace: default\n  hostname: {SERVICE_HOST}\n  vips: [\"/{VIP}\"]\n  ports: {{{SERVICE_PORT}: {APP_PORT}}}\n  waypoint: {{destination: \"/{WAYPOINT_IP}\", hboneMtlsPort: 15008}}\n",
        workload("client-0", "client", CLIENT_IP, "HBONE", "{}"),
        workload(
            "app-0",
            "app",
            APP_IP,
            "NONE",
            &format!("{{\"default/{SERVICE_HOST}\": {{{SERVICE_PORT}: {APP_PORT}}}}}")
        ),
        workload(WAYPOINT_POD, "waypoint", WAYPOINT_IP, "HBONE", "{}"),
    )
}

/// The node: its namespace, the control server, the app, and the CA (kept here only to
/// issue the client's certificate; the waypoint never sees its key).
pub struct Node {
    lab: Lab,
    pub ns: String,
    control: Process,
    mesh_dir: PathBuf,
    ca: CertificateAuthority,
    /// The token the waypoint presents (its projected service-account token).
    pub waypoint_token: String,
    /// The control server's root certificate (the `istio-ca-root-cert` ConfigMap's).
    pub root_cert: PathBuf,
    pub rt: tokio::runtime::Runtime,
}

impl Node {
    /// Builds the namespace, starts `ambit control` (from `ambit`, files under `work`) and
    /// the app, and waits until the control server is ready.
    pub fn start(ambit: &Path, work: &Path) -> anyhow::Result<Node> {
        let lab = Lab::new("img-wp")?;
        let ns = lab.netns("node")?;
        // A veth pair with both ends inside (no dummy module needed): the node's "eth0",
        // holding the node's and the pods' addresses.
        lab.exec(
            &ns,
            &[
                "ip",
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                "eth0-peer",
            ],
        )?;
        for ip in [NODE_IP, WAYPOINT_IP, APP_IP, CLIENT_IP] {
            lab.exec(
                &ns,
                &["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"],
            )?;
        }
        for dev in ["eth0-peer", "eth0"] {
            lab.exec(&ns, &["ip", "link", "set", dev, "up"])?;
        }

        let (mesh, ca_dir, tokens) = (work.join("mesh"), work.join("ca"), work.join("tokens.yaml"));
        std::fs::create_dir_all(&mesh)?;
        std::fs::write(mesh.join("mesh.yaml"), mesh_yaml())?;
        let ca = CertificateAuthority::ephemeral("cluster.local")?;
        ca.write_plugin_dir(&ca_dir)?;
        let waypoint_token = format!("img-waypoint-{:016x}", std::process::id());
        // Bound to the waypoint's identity, as a pod's service-account token is.
        std::fs::write(
            &tokens,
            format!("- token: {waypoint_token}\n  identity: {WAYPOINT_ID}\n"),
        )?;
        std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        let path = |p: &Path| p.display().to_string();
        let control = lab.spawn(
            &ns,
            "control",
            ambit,
            &[
                "control",
                "--mesh",
                &path(&mesh),
                "--ca",
                &path(&ca_dir),
                "--tokens",
                &path(&tokens),
                "--listen",
                CONTROL_ADDR,
                "--admin",
                CONTROL_ADMIN,
            ],
            &[("RUST_LOG", "info".to_string())],
        )?;
        let admin: SocketAddr = CONTROL_ADMIN.parse()?;
        let up = ambit_netns_lab::wait_until(
            "ambit control to be ready",
            Duration::from_secs(60),
            || {
                !lab.is_running(control.pid)
                    || matches!(
                        ambit_netns_lab::http_get(&ns, admin, "/ready"),
                        Ok((200, _))
                    )
            },
        );
        if up.is_err() || !lab.is_running(control.pid) {
            anyhow::bail!(
                "ambit control did not become ready; its log:\n{}",
                std::fs::read_to_string(&control.log).unwrap_or_default()
            );
        }

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let app = Lab::in_netns(&ns, || {
            std::net::TcpListener::bind(SocketAddr::from((APP_IP, APP_PORT)))
        })?;
        app.set_nonblocking(true)?;
        {
            let _guard = rt.enter();
            rt.spawn(serve_app(tokio::net::TcpListener::from_std(app)?));
        }
        Ok(Node {
            root_cert: ca_dir.join(ambit_identity::ca::ROOT_CERT_FILE),
            lab,
            ns,
            control,
            mesh_dir: mesh,
            ca,
            waypoint_token,
            rt,
        })
    }

    /// Adds an L7 document to the control server's mesh directory and waits until it is
    /// served (the mesh generation moves on).
    pub fn serve_policy(&self, file: &str, yaml: &str) -> anyhow::Result<()> {
        let generation = || -> anyhow::Result<u64> {
            let (status, body) =
                ambit_netns_lab::http_get(&self.ns, CONTROL_ADMIN.parse()?, "/debug")?;
            anyhow::ensure!(status == 200, "control /debug answered {status}");
            let debug: serde_json::Value = serde_json::from_str(&body)?;
            anyhow::ensure!(
                debug["mesh"]["error"].is_null(),
                "control refused it: {debug:#}"
            );
            debug["mesh"]["generation"]
                .as_u64()
                .context("/debug has no mesh.generation")
        };
        let before = generation()?;
        let tmp = self.mesh_dir.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, self.mesh_dir.join(file))?;
        ambit_netns_lab::wait_until(
            "ambit control to serve the policy",
            Duration::from_secs(20),
            || generation().map_or(true, |g| g > before),
        )?;
        generation().map(|_| ())
    }

    /// The control server's log, and whether it still runs.
    pub fn control_log(&self) -> String {
        let log = std::fs::read_to_string(&self.control.log).unwrap_or_default();
        if self.lab.is_running(self.control.pid) {
            log
        } else {
            format!("{log}(ambit control has exited)")
        }
    }

    /// The control server's Prometheus text.
    pub fn control_metrics(&self) -> anyhow::Result<String> {
        let (status, body) =
            ambit_netns_lab::http_get(&self.ns, CONTROL_ADMIN.parse()?, "/metrics")?;
        anyhow::ensure!(status == 200, "control /metrics answered {status}");
        Ok(body)
    }

    /// `GET`s `path` on a port of the namespace's loopback (the waypoint's operator ports).
    pub fn get(&self, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
        ambit_netns_lab::http_get(&self.ns, SocketAddr::from(([127, 0, 0, 1], port)), path)
    }

    /// One request to `echo` through the waypoint, as the client's node proxy sends it:
    /// HBONE from the client's address with the client's certificate, expecting the
    /// waypoint's identity (chained to the control server's root), CONNECT to the VIP,
    /// then `method path` over HTTP/1.1. Returns the status and the body.
    pub fn request(&self, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
        let cert = self
            .ca
            .issue(&SpiffeId::parse(CLIENT_ID)?, Duration::from_secs(3600))?;
        let tls = ambit_identity::tls::client_config(&cert, &[SpiffeId::parse(WAYPOINT_ID)?])?;
        // Created in the namespace; it stays there when connected from the runtime.
        let socket = Lab::in_netns(&self.ns, tokio::net::TcpSocket::new_v4)?;
        socket.bind(SocketAddr::from((CLIENT_IP, 0)))?;
        let waypoint = SocketAddr::from((WAYPOINT_IP, 15008));
        let key = PoolKey {
            src_identity: CLIENT_ID.into(),
            dst_identities: vec![WAYPOINT_ID.into()],
            dst: waypoint,
            src_ip: CLIENT_IP.into(),
        };
        let connect = ConnectRequest::new(parse_authority(&format!("{VIP}:{SERVICE_PORT}"))?);
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {SERVICE_HOST}\r\nconnection: close\r\n\r\n"
        );
        let raw = self.rt.block_on(async move {
            let pool = Pool::new(ClientSettings::default());
            let dial = move || async move {
                let tcp = socket.connect(waypoint).await?;
                ambit_hbone::tls::connect(tcp, tls).await
            };
            let mut tunnel =
                tokio::time::timeout(Duration::from_secs(30), pool.connect(key, dial, &connect))
                    .await
                    .context("HBONE to the waypoint: no answer in 30 s")?
                    .context("HBONE to the waypoint")?;
            tunnel.write_all(request.as_bytes()).await?;
            let mut raw = Vec::new();
            tokio::time::timeout(Duration::from_secs(30), tunnel.read_to_end(&mut raw))
                .await
                .context("the response did not end in 30 s")??;
            anyhow::Ok(raw)
        })?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .with_context(|| format!("not an HTTP response: {text:?}"))?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no status in {head:?}"))?;
        Ok((status, body.to_string()))
    }
}

/// The app: reads a request head and answers `app <method> <path>`, then closes.
async fn serve_app(listener: tokio::net::TcpListener) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 2048];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
                if head.len() > 64 * 1024 {
                    return;
                }
            }
            let text = String::from_utf8_lossy(&head);
            let mut words = text.split(' ');
            let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            let body = format!("app {method} {path}");
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(response.as_bytes()).await;
            let _ = s.shutdown().await;
        });
    }
}
