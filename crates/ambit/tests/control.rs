//! End to end, as root: `ambit control` in the server node, two node proxies configured by
//! it over delta xDS and holding certificates from its CA (no node holds a CA key), real
//! traffic between two network namespaces.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use ambit_netns_lab::mesh::{
    mesh_yaml, metric_sum, EchoMode, TwoNodes, TwoNodesSpec, APP_PORT, SERVER_IP, SERVICE_PORT,
};
use ambit_netns_lab::peer::NodeProxy;
use ambit_netns_lab::{http_get, wait_until};

fn ambit() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ambit"))
}

const CLIENT_ID: &str = "spiffe://cluster.local/ns/default/sa/client";
const SECOND_VIP: &str = "10.96.0.11";

fn launch(tag: &str, env: &[(&str, String)]) -> TwoNodes {
    let ambit = ambit();
    TwoNodes::launch(TwoNodesSpec {
        env,
        control: Some(ambit.clone()),
        ..TwoNodesSpec::pair(tag, &NodeProxy::Ambit(ambit.clone()))
    })
    .unwrap()
}

fn config_dump(ns: &str) -> serde_json::Value {
    let (status, body) = http_get(ns, "127.0.0.1:15000".parse().unwrap(), "/config_dump").unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn has_service(dump: &serde_json::Value, hostname: &str) -> bool {
    dump["services"]
        .as_array()
        .is_some_and(|s| s.iter().any(|s| s["hostname"] == hostname))
}

fn has_policy(dump: &serde_json::Value, name: &str) -> bool {
    dump["policies"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p["name"] == name))
}

/// Connections the server node's proxy closed because policy denied them.
fn denied_closes(metrics: &str) -> u64 {
    metric_sum(
        metrics,
        "istio_tcp_connections_closed_total",
        &[("reporter", "destination"), ("response_flags", "DENY")],
    )
}

/// The server node's proxy took the client's connections over mutual TLS from the
/// client's identity (so they crossed in HBONE, not in the clear).
fn assert_tunnelled(nodes: &TwoNodes) {
    let text = nodes.metrics(&nodes.server_ns).unwrap();
    let opened = metric_sum(
        &text,
        "istio_tcp_connections_opened_total",
        &[
            ("reporter", "destination"),
            ("connection_security_policy", "mutual_tls"),
            ("source_principal", CLIENT_ID),
        ],
    );
    assert!(opened >= 1, "no mTLS connection from the client: {text}");
}

/// One round trip on a new connection from the client node.
fn round_trip(nodes: &TwoNodes, dst: SocketAddr, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut conn = nodes.connect_from_client(dst)?;
    conn.write_all(payload)?;
    conn.shutdown(Shutdown::Write)?;
    let mut back = Vec::new();
    conn.read_to_end(&mut back)?;
    Ok(back)
}

/// A connection kept open, used again later to prove it still carries bytes.
fn open_and_echo(nodes: &TwoNodes, dst: SocketAddr) -> TcpStream {
    let mut conn = nodes.connect_from_client(dst).unwrap();
    echo_once(&mut conn, b"first").unwrap();
    conn
}

fn echo_once(conn: &mut TcpStream, payload: &[u8]) -> std::io::Result<()> {
    conn.write_all(payload)?;
    let mut buf = vec![0u8; payload.len()];
    conn.read_exact(&mut buf)?;
    if buf != payload {
        return Err(std::io::Error::other("echo mismatch"));
    }
    Ok(())
}

fn second_service() -> String {
    format!(
        r#"- name: echo2
  namespace: default
  hostname: echo2.default.svc.cluster.local
  vips: ["/{SECOND_VIP}"]
  ports:
    {SERVICE_PORT}: {APP_PORT}
"#
    )
}

/// The lab mesh with the server also behind `echo2`, and `extra` appended.
fn mesh_with(second: bool, extra: &str) -> String {
    let mut mesh = mesh_yaml();
    if second {
        mesh = mesh.replace(
            "  services:\n    default/echo.default.svc.cluster.local:",
            "  services:\n    default/echo2.default.svc.cluster.local:\n      80: 8080\n    default/echo.default.svc.cluster.local:",
        );
        mesh.push_str(&second_service());
    }
    mesh + extra
}

const DENY_CLIENT: &str = r#"policies:
- name: deny-client
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - principals: [!Exact "cluster.local/ns/default/sa/client"]
"#;

#[test]
fn the_mesh_follows_the_watched_files_and_policy_changes_close_open_connections() {
    let nodes = launch("cp-follow", &[]);
    let plane = nodes.control.as_ref().unwrap();
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let direct = SocketAddr::from((SERVER_IP, APP_PORT));

    // Certificates came from the control server's CA: no node was given a CA directory.
    assert_eq!(round_trip(&nodes, direct, b"hello").unwrap(), b"hello");
    assert_tunnelled(&nodes);
    let dump = config_dump(&nodes.client_ns);
    let certs = dump["certificates"].as_array().unwrap();
    assert!(certs.iter().any(|c| c["identity"] == CLIENT_ID), "{dump}");
    assert!(dump["workloads"].as_array().unwrap().len() >= 2, "{dump}");

    // Add a service: it shows in /config_dump and routes.
    plane.write_mesh(&mesh_with(true, "")).unwrap();
    wait_until(
        "echo2 to reach the client proxy",
        Duration::from_secs(15),
        || {
            has_service(
                &config_dump(&nodes.client_ns),
                "echo2.default.svc.cluster.local",
            )
        },
    )
    .unwrap();
    let vip: SocketAddr = format!("{SECOND_VIP}:{SERVICE_PORT}").parse().unwrap();
    assert_eq!(round_trip(&nodes, vip, b"via echo2").unwrap(), b"via echo2");

    // A DENY for the client while a connection is open: the server closes it, counted
    // with response_flags DENY, and new connections are refused.
    let mut open = open_and_echo(&nodes, direct);
    plane.write_mesh(&mesh_with(true, DENY_CLIENT)).unwrap();
    wait_until(
        "the policy to reach the server proxy",
        Duration::from_secs(15),
        || has_policy(&config_dump(&nodes.server_ns), "deny-client"),
    )
    .unwrap();
    open.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 16];
    // Closed by the proxy: an end of stream or a reset, not a read that timed out.
    let closed = match open.write_all(b"after") {
        Err(_) => true,
        Ok(()) => match open.read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        },
    };
    assert!(closed, "the open connection survived a DENY");
    wait_until(
        "the close to be counted as DENY",
        Duration::from_secs(10),
        || {
            let text = nodes.metrics(&nodes.server_ns).unwrap();
            denied_closes(&text) == 1
        },
    )
    .unwrap();
    assert!(
        !matches!(round_trip(&nodes, direct, b"denied"), Ok(b) if b == b"denied"),
        "a new connection passed a DENY"
    );
    // Refused by the policy at the server, not lost on the way.
    wait_until(
        "the new connection to be counted as DENY",
        Duration::from_secs(10),
        || denied_closes(&nodes.metrics(&nodes.server_ns).unwrap()) == 2,
    )
    .unwrap();

    // Remove the policy and the service: both go, and traffic flows again.
    plane.write_mesh(&mesh_with(false, "")).unwrap();
    wait_until(
        "the policy and echo2 to be removed",
        Duration::from_secs(15),
        || {
            let server = config_dump(&nodes.server_ns);
            let client = config_dump(&nodes.client_ns);
            !has_policy(&server, "deny-client")
                && !has_service(&client, "echo2.default.svc.cluster.local")
        },
    )
    .unwrap();
    assert_eq!(round_trip(&nodes, direct, b"again").unwrap(), b"again");
}

#[test]
fn a_bad_file_is_reported_and_the_last_good_mesh_keeps_being_served() {
    let nodes = launch("cp-badfile", &[]);
    let plane = nodes.control.as_ref().unwrap();
    let generation = |d: &serde_json::Value| d["mesh"]["generation"].as_u64();
    let before = generation(&plane.debug().unwrap()).expect("a mesh generation");
    plane
        .write_mesh(&(mesh_yaml() + "workloads: [this is not a workload]\n"))
        .unwrap();
    // The server says what is wrong and where, and keeps serving what it had.
    let mut debug = serde_json::Value::Null;
    wait_until(
        "the bad file to be reported",
        Duration::from_secs(15),
        || {
            debug = plane.debug().unwrap();
            let error = debug["mesh"]["error"].as_str().unwrap_or_default();
            error.contains("mesh.yaml") && error.contains("line")
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{debug}\n{}", plane.log()));
    assert_eq!(
        generation(&debug),
        Some(before),
        "a bad file changed the mesh served: {debug}"
    );
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let direct = SocketAddr::from((SERVER_IP, APP_PORT));
    assert_eq!(round_trip(&nodes, direct, b"still").unwrap(), b"still");
    // Fixed: the next good file is served and pushed.
    plane.write_mesh(&mesh_with(true, "")).unwrap();
    wait_until(
        "the fixed mesh to reach the client proxy",
        Duration::from_secs(15),
        || {
            has_service(
                &config_dump(&nodes.client_ns),
                "echo2.default.svc.cluster.local",
            )
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", plane.log()));
}

#[test]
fn a_control_server_restart_keeps_state_and_traffic() {
    let mut nodes = launch("cp-restart", &[]);
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let direct = SocketAddr::from((SERVER_IP, APP_PORT));
    let mut open = open_and_echo(&nodes, direct);

    let mut plane = nodes.control.take().unwrap();
    plane.stop(&nodes.lab).unwrap();
    // While it is down: the state stays, the proxies stay ready, traffic keeps flowing.
    for i in 0..3u8 {
        assert_eq!(
            round_trip(&nodes, direct, &[b'a' + i]).unwrap(),
            vec![b'a' + i]
        );
        echo_once(&mut open, b"during").unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    let (status, _) = http_get(
        &nodes.client_ns,
        "127.0.0.1:15021".parse().unwrap(),
        "/healthz/ready",
    )
    .unwrap();
    assert_eq!(
        status, 200,
        "a proxy that synced once stays ready while the server is away"
    );
    assert!(
        config_dump(&nodes.client_ns)["workloads"]
            .as_array()
            .unwrap()
            .len()
            >= 2
    );

    // Back, with a change made meanwhile: the proxies reconnect and receive it.
    plane.write_mesh(&mesh_with(true, "")).unwrap();
    plane.start(&nodes.lab).unwrap();
    wait_until(
        "the proxies to reconnect and sync",
        Duration::from_secs(30),
        || {
            has_service(
                &config_dump(&nodes.client_ns),
                "echo2.default.svc.cluster.local",
            )
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", plane.log()));
    echo_once(&mut open, b"after").unwrap();
    // Each proxy reconnects on its own backoff: the second may come a little after the
    // first has synced.
    let mut debug = String::new();
    wait_until(
        "both proxies to be connected again",
        Duration::from_secs(30),
        || {
            debug = plane.debug().map(|d| d.to_string()).unwrap_or_default();
            debug.contains("ztunnel-node1") && debug.contains("ztunnel-node2")
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{debug}"));
    nodes.control = Some(plane);
}

/// The client's certificate for `CLIENT_ID`: its leaf serial, as /config_dump shows it.
fn client_serial(nodes: &TwoNodes) -> Option<String> {
    let dump = config_dump(&nodes.client_ns);
    dump["certificates"]
        .as_array()?
        .iter()
        .find(|c| c["identity"] == CLIENT_ID)?["certChain"][0]["serialNumber"]
        .as_str()
        .map(str::to_string)
}

#[test]
fn certificates_rotate_under_an_open_tunnel_and_outlive_a_ca_outage() {
    // 30 s certificates: renewed at half life.
    let mut nodes = launch("cp-rotate", &[("SECRET_TTL", "30s".to_string())]);
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let direct = SocketAddr::from((SERVER_IP, APP_PORT));
    let mut open = open_and_echo(&nodes, direct);
    let first = client_serial(&nodes).expect("a client certificate");
    wait_until(
        "the client certificate to rotate",
        Duration::from_secs(40),
        || client_serial(&nodes).is_some_and(|s| s != first),
    )
    .unwrap();
    echo_once(&mut open, b"after rotation").unwrap();
    assert_eq!(round_trip(&nodes, direct, b"new").unwrap(), b"new");

    // The CA goes away: the next renewal fails, is counted, and the valid certificate
    // keeps serving.
    let unreachable = |text: &str| {
        metric_sum(
            text,
            "ambit_certificate_fetch_failures_total",
            &[("cause", "unreachable")],
        )
    };
    let before = unreachable(&nodes.metrics(&nodes.client_ns).unwrap());
    let mut plane = nodes.control.take().unwrap();
    plane.stop(&nodes.lab).unwrap();
    let mut text = String::new();
    wait_until(
        "a failed renewal to be counted",
        Duration::from_secs(40),
        || {
            text = nodes.metrics(&nodes.client_ns).unwrap();
            unreachable(&text) > before
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    echo_once(&mut open, b"during the outage").unwrap();
    assert_eq!(round_trip(&nodes, direct, b"outage").unwrap(), b"outage");
    nodes.control = Some(plane);
}

#[test]
fn the_proxy_is_not_ready_before_its_first_sync() {
    let ambit = ambit();
    let lab = ambit_netns_lab::Lab::new("cp-ready").unwrap();
    let ns = lab.netns("node").unwrap();
    let ca_dir = lab.dir.path().join("ca");
    ambit_identity::CertificateAuthority::ephemeral("cluster.local")
        .unwrap()
        .write_plugin_dir(&ca_dir)
        .unwrap();
    let listen: SocketAddr = "127.0.0.1:15012".parse().unwrap();
    let mut plane = ambit_netns_lab::control::ControlPlane::prepare(
        &lab,
        &ns,
        listen,
        &ambit,
        &ca_dir,
        &["node1"],
        &mesh_yaml(),
    )
    .unwrap();
    let mut env = plane.proxy_env("node1").unwrap();
    env.extend([
        ("PROXY_MODE", "dedicated".to_string()),
        ("PROXY_WORKLOAD_INFO", "default/client/client".to_string()),
        ("NODE_NAME", "node1".to_string()),
    ]);
    let proxy = lab.spawn(&ns, "proxy", &ambit, &["ztunnel"], &env).unwrap();
    let ready = |lab: &ambit_netns_lab::Lab| {
        assert!(
            lab.is_running(proxy.pid),
            "{}",
            std::fs::read_to_string(&proxy.log).unwrap_or_default()
        );
        http_get(&ns, "127.0.0.1:15021".parse().unwrap(), "/healthz/ready").map(|(s, _)| s)
    };
    // Give it time to try (and fail) to reach the missing server.
    std::thread::sleep(Duration::from_secs(2));
    let before = ready(&lab).unwrap();
    assert_ne!(before, 200, "ready without any xDS state");
    plane.start(&lab).unwrap();
    wait_until(
        "readiness after the first sync",
        Duration::from_secs(20),
        || matches!(ready(&lab), Ok(200)),
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n{}",
            std::fs::read_to_string(&proxy.log).unwrap_or_default()
        )
    });
}
