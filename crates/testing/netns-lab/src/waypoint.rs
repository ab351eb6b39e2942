//! A test waypoint: a small HBONE server standing in for a waypoint pod. It records what
//! each CONNECT carried (authority, the client's SPIFFE id, headers) and forwards the
//! stream as a real waypoint would: it picks the destination from the authority (a VIP it
//! is told about, or a pod address), opens HBONE to that pod's node proxy at
//! `pod-ip:15008` with its own identity, and copies bytes both ways.
//!
//! It runs on its own thread inside a network namespace, with one current-thread tokio
//! runtime, so every socket it opens (the listener and the onward connections) is in that
//! namespace. Dropping the handle stops it.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ambit_hbone::headers::Authority;
use ambit_hbone::server::IncomingConnect;
use ambit_hbone::{ClientSettings, ConnectRequest, H2Settings, Pool, PoolKey};
use ambit_identity::{SpiffeId, WorkloadCertificate};
use anyhow::Context;
use tokio::sync::watch;

use super::Lab;

/// The HBONE port of the node proxies the waypoint forwards to.
pub const NODE_HBONE_PORT: u16 = 15008;

/// Where the waypoint sends what it is asked for.
#[derive(Clone, Debug)]
pub struct WaypointRoute {
    /// The `:authority` this route serves: a service `VIP:port` or a pod `ip:port`.
    pub authority: SocketAddr,
    /// The pod and port it reaches (`pod-ip:target-port`).
    pub pod: SocketAddr,
    /// The identity the pod's node proxy must present for it.
    pub pod_identity: SpiffeId,
    /// The node proxy to dial when it is not at the pod's own IP: only to make a
    /// misdirected request (authority for one IP, sent to another), which must be refused.
    pub via: Option<IpAddr>,
}

/// What one CONNECT carried, and what became of it.
#[derive(Clone, Debug)]
pub struct ConnectRecord {
    pub authority: String,
    /// The client certificate's SPIFFE id.
    pub peer_identity: Option<String>,
    pub peer: SocketAddr,
    /// Every request header, names lower-case, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The pod the stream was forwarded to (`None`: no route).
    pub forwarded_to: Option<SocketAddr>,
    /// The onward CONNECT's outcome: `Ok` or why it failed.
    pub onward: Result<(), String>,
}

/// A running test waypoint.
pub struct TestWaypoint {
    /// The HBONE address it listens on.
    pub addr: SocketAddr,
    records: Arc<Mutex<Vec<ConnectRecord>>>,
    shutdown: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl TestWaypoint {
    /// Listens on `listen` (an address of `netns`) as the pod holding `cert`, forwarding
    /// by `routes`. Onward connections leave from `listen`'s IP.
    pub fn start(
        _lab: &Lab,
        netns: &str,
        listen: SocketAddr,
        cert: WorkloadCertificate,
        routes: Vec<WaypointRoute>,
    ) -> anyhow::Result<TestWaypoint> {
        let records = Arc::new(Mutex::new(Vec::new()));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let server_tls = ambit_identity::tls::server_config(&cert)
            .context("the test waypoint's server TLS config")?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let recs = records.clone();
        // The thread is created inside the namespace, so it (and its runtime) stays there.
        let thread = Lab::in_netns(netns, move || {
            Ok(std::thread::spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::bind(listen).await {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("bind {listen}: {e}")));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    let shared = Arc::new(Shared {
                        cert,
                        routes,
                        records: recs,
                        pool: Pool::new(ClientSettings::default()),
                        source_ip: listen.ip(),
                    });
                    serve(listener, server_tls, shared, shutdown_rx).await;
                });
            }))
        })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => anyhow::bail!("test waypoint in {netns}: {e}"),
            Err(_) => anyhow::bail!("test waypoint in {netns} stopped before listening"),
        }
        Ok(TestWaypoint {
            addr: listen,
            records,
            shutdown,
            thread: Some(thread),
        })
    }

    /// Everything seen so far, in arrival order.
    pub fn records(&self) -> Vec<ConnectRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for TestWaypoint {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Shared {
    cert: WorkloadCertificate,
    routes: Vec<WaypointRoute>,
    records: Arc<Mutex<Vec<ConnectRecord>>>,
    pool: Pool,
    source_ip: IpAddr,
}

async fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(_) => continue,
            },
            _ = shutdown.changed() => return,
        };
        let (tls, shared, shutdown) = (tls.clone(), shared.clone(), shutdown.clone());
        tokio::spawn(async move {
            let handler = move |incoming: IncomingConnect| {
                let shared = shared.clone();
                async move { handle(shared, incoming).await }
            };
            let _ = ambit_hbone::server::serve_connection(
                tcp,
                tls,
                H2Settings::default(),
                shutdown,
                handler,
            )
            .await;
        });
    }
}

async fn handle(shared: Arc<Shared>, incoming: IncomingConnect) {
    let request = incoming.request();
    let authority = request
        .uri
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let headers = request
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let peer = incoming.peer().clone();
    let peer_identity =
        ambit_identity::tls::peer_identity(Some(&peer.certificates)).map(|i| i.to_string());
    let route = authority
        .parse::<SocketAddr>()
        .ok()
        .and_then(|a| shared.routes.iter().find(|r| r.authority == a).cloned());
    let mut record = ConnectRecord {
        authority,
        peer_identity,
        peer: peer.addr,
        headers,
        forwarded_to: route.as_ref().map(|r| r.pod),
        onward: Err("no route for this authority".into()),
    };
    let Some(route) = route else {
        push(&shared, record);
        return incoming.reject(http::StatusCode::SERVICE_UNAVAILABLE);
    };
    let onward = open_onward(&shared, &route).await;
    record.onward = onward.as_ref().map(|_| ()).map_err(|e| e.to_string());
    push(&shared, record);
    let mut onward = match onward {
        Ok(s) => s,
        Err(_) => return incoming.reject(http::StatusCode::SERVICE_UNAVAILABLE),
    };
    let Ok(mut downstream) = incoming.accept(http::HeaderMap::new()) else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut downstream, &mut onward).await;
}

fn push(shared: &Shared, record: ConnectRecord) {
    shared
        .records
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(record);
}

/// HBONE to the pod's node proxy with the waypoint's own identity.
async fn open_onward(
    shared: &Arc<Shared>,
    route: &WaypointRoute,
) -> Result<ambit_hbone::H2Stream, ambit_hbone::HboneError> {
    let next_hop = SocketAddr::new(route.via.unwrap_or(route.pod.ip()), NODE_HBONE_PORT);
    let tls =
        ambit_identity::tls::client_config(&shared.cert, std::slice::from_ref(&route.pod_identity))
            .map_err(|e| ambit_hbone::HboneError::Tls(Arc::new(std::io::Error::other(e))))?;
    let key = PoolKey {
        src_identity: shared.cert.identity.to_string(),
        dst_identities: vec![route.pod_identity.to_string()],
        dst: next_hop,
        src_ip: shared.source_ip,
    };
    let source_ip = shared.source_ip;
    let connector = move || async move {
        let socket = if next_hop.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }?;
        // Leave from the waypoint pod's address, as its own connections would.
        socket.bind(SocketAddr::new(source_ip, 0))?;
        let tcp = socket.connect(next_hop).await?;
        ambit_hbone::tls::connect(tcp, tls).await
    };
    shared
        .pool
        .connect(
            key,
            connector,
            &ConnectRequest::new(Authority::Addr(route.pod)),
        )
        .await
}

/// The waypoint pod of [`observe_waypoint`]: another address of the server node.
pub const WAYPOINT_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 78, 0, 3);
/// Its HBONE port (the server node's proxy has 15008 on the same node).
pub const WAYPOINT_PORT: u16 = 15009;
pub const WAYPOINT_ID: &str = "spiffe://cluster.local/ns/default/sa/waypoint";
/// The service port the waypoint misdirects (see [`observe_waypoint`]).
pub const MISDIRECTED_PORT: u16 = 81;
/// The pod of no workload the misdirected request names.
pub const STRAY_POD: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 78, 0, 77);

/// The two-node mesh with a waypoint pod (in the server node) for the echo service.
pub fn waypoint_mesh() -> String {
    use super::mesh::{
        APP_PORT, CLIENT_IP, CLIENT_IP6, SERVER_IP, SERVER_IP6, SERVICE_HOST, SERVICE_PORT,
        SERVICE_VIP,
    };
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
  waypoint: {{destination: "/{WAYPOINT_IP}", hboneMtlsPort: {WAYPOINT_PORT}}}
"#
    )
}

/// What [`observe_waypoint`] saw.
pub struct WaypointObserved {
    /// What the echo app sent back through the waypoint.
    pub echo: Vec<u8>,
    /// The waypoint's records: the client's connection to the VIP, then the misdirected one.
    pub records: Vec<ConnectRecord>,
    pub client_metrics: String,
    pub server_metrics: String,
    /// The client node proxy's log (access lines included).
    pub client_log: String,
}

/// Two nodes running `client` and `server` and the test waypoint in the server node.
/// The client dials the echo VIP (through the waypoint, which forwards to the server pod),
/// then the VIP's port [`MISDIRECTED_PORT`], which the waypoint forwards to the server's
/// node with the authority of [`STRAY_POD`], a pod that node does not serve.
pub fn observe_waypoint(
    tag: &str,
    client: &super::peer::NodeProxy,
    server: &super::peer::NodeProxy,
) -> anyhow::Result<WaypointObserved> {
    use super::mesh::{
        metric_sum, EchoMode, TwoNodes, TwoNodesSpec, APP_PORT, SERVER_IP, SERVICE_PORT,
        SERVICE_VIP,
    };
    use std::io::{Read, Write};
    use std::time::Duration;
    let mesh = waypoint_mesh();
    let nodes = TwoNodes::launch(TwoNodesSpec {
        mesh: Some(&mesh),
        ..TwoNodesSpec::of(tag, client.clone(), server.clone())
    })?;
    nodes.lab.exec(
        &nodes.server_ns,
        &[
            "ip",
            "addr",
            "add",
            &format!("{WAYPOINT_IP}/24"),
            "dev",
            super::mesh::LINK_DEV,
        ],
    )?;
    let _app = nodes.start_app_server(EchoMode::Mirror)?;
    let ca = ambit_identity::CertificateAuthority::from_plugin_dir(&nodes.ca_dir)?;
    let cert = ca.issue(&SpiffeId::parse(WAYPOINT_ID)?, Duration::from_secs(3600))?;
    let server_id = SpiffeId::parse("spiffe://cluster.local/ns/default/sa/server")?;
    let vip = SocketAddr::from((SERVICE_VIP, SERVICE_PORT));
    let misdirected = SocketAddr::from((SERVICE_VIP, MISDIRECTED_PORT));
    let waypoint = TestWaypoint::start(
        &nodes.lab,
        &nodes.server_ns,
        SocketAddr::from((WAYPOINT_IP, WAYPOINT_PORT)),
        cert,
        vec![
            WaypointRoute {
                authority: vip,
                pod: SocketAddr::from((SERVER_IP, APP_PORT)),
                pod_identity: server_id.clone(),
                via: None,
            },
            WaypointRoute {
                authority: misdirected,
                pod: SocketAddr::from((STRAY_POD, APP_PORT)),
                pod_identity: server_id,
                via: Some(SERVER_IP.into()),
            },
        ],
    )?;
    let mut conn = nodes.connect_from_client(vip)?;
    conn.write_all(b"through the waypoint")?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut echo = Vec::new();
    conn.read_to_end(&mut echo)?;
    drop(conn);
    let closed = |ns: &str, n: u64| {
        nodes
            .metrics(ns)
            .is_ok_and(|m| metric_sum(&m, "istio_tcp_connections_closed_total", &[]) >= n)
    };
    super::wait_until(
        "both nodes to count the close",
        Duration::from_secs(10),
        || closed(&nodes.client_ns, 1) && closed(&nodes.server_ns, 1),
    )?;
    // The misdirected one: the waypoint refuses the stream it could not forward, so the
    // client sees its connection end without data.
    let mut conn = nodes.connect_from_client(misdirected)?;
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
    drop(conn);
    super::wait_until(
        "the waypoint to record both",
        Duration::from_secs(10),
        || waypoint.records().len() >= 2,
    )?;
    // Let the counters and logs of the refusal settle.
    std::thread::sleep(Duration::from_millis(500));
    Ok(WaypointObserved {
        echo,
        records: waypoint.records(),
        client_metrics: nodes.metrics(&nodes.client_ns)?,
        server_metrics: nodes.metrics(&nodes.server_ns)?,
        client_log: std::fs::read_to_string(&nodes.client_proxy.log)?,
    })
}

/// The port the server pod's PROXY application tunnel listens on, on loopback.
pub const APP_TUNNEL_PORT: u16 = 15088;

/// Two nodes running `client` and `server`, the server pod taking a PROXY application
/// tunnel on loopback port [`APP_TUNNEL_PORT`]. The client sends `payload` to the server
/// pod's app port and half-closes; returns every byte the tunnel's app received (the
/// PROXY v2 header, then the payload).
pub fn observe_app_tunnel(
    tag: &str,
    client: &super::peer::NodeProxy,
    server: &super::peer::NodeProxy,
    payload: &[u8],
) -> anyhow::Result<Vec<u8>> {
    use super::mesh::{TwoNodes, TwoNodesSpec, APP_PORT, SERVER_IP};
    use std::io::{Read, Write};
    use std::time::Duration;
    let mesh = waypoint_mesh().replace(
        "  workloadName: server\n",
        &format!(
            "  workloadName: server\n  applicationTunnel: {{protocol: PROXY, port: {APP_TUNNEL_PORT}}}\n"
        ),
    );
    let nodes = TwoNodes::launch(TwoNodesSpec {
        mesh: Some(&mesh),
        ..TwoNodesSpec::of(tag, client.clone(), server.clone())
    })?;
    let listener = Lab::in_netns(&nodes.server_ns, || {
        std::net::TcpListener::bind(("127.0.0.1", APP_TUNNEL_PORT))
    })?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let got = (|| -> std::io::Result<Vec<u8>> {
            let (mut s, _) = listener.accept()?;
            s.set_read_timeout(Some(Duration::from_secs(20)))?;
            let mut got = Vec::new();
            s.read_to_end(&mut got)?;
            s.write_all(b"ok")?;
            Ok(got)
        })();
        let _ = tx.send(got);
    });
    let mut conn = nodes.connect_from_client(SocketAddr::from((SERVER_IP, APP_PORT)))?;
    conn.write_all(payload)?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut back = Vec::new();
    conn.read_to_end(&mut back)?;
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .context("the application tunnel's app got no connection")??;
    anyhow::ensure!(
        back == b"ok",
        "the client got {back:?} back, not the app's answer"
    );
    Ok(got)
}
