//! End to end, as root: two nodes in network namespaces, a node proxy in each (dedicated
//! mode), the capture rule in the client's node, an unmodified TCP client and server.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambit_identity::{CertificateAuthority, SpiffeId};
use ambit_netns_lab::mesh::{
    metric_sum, EchoMode, TwoNodes, APP_PORT, CLIENT_IP, SERVER_IP, SERVICE_HOST, SERVICE_PORT,
    SERVICE_VIP,
};
use ambit_netns_lab::{wait_until, Lab};

fn ambit() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ambit"))
}

const CLIENT_ID: &str = "spiffe://cluster.local/ns/default/sa/client";
const SERVER_ID: &str = "spiffe://cluster.local/ns/default/sa/server";

/// Sends `payload`, half-closes, and reads the whole answer.
fn exchange(nodes: &TwoNodes, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut conn = nodes.connect_from_client(dst).expect("connect");
    conn.write_all(payload).unwrap();
    conn.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    conn.read_to_end(&mut back).unwrap();
    back
}

#[test]
fn unmodified_client_reaches_server_and_only_tls_crosses_the_link() {
    let nodes = TwoNodes::start(ambit(), "e2e-wire", &[]).unwrap();
    let accepted = nodes.start_app_server(EchoMode::Double).unwrap();
    let capture = nodes.capture_link().unwrap();

    let back = exchange(
        &nodes,
        SocketAddr::from((SERVER_IP, APP_PORT)),
        b"hello world",
    );
    assert_eq!(back, b"hello worldhello world");
    accepted.recv_timeout(Duration::from_secs(5)).unwrap();

    let wire = capture.finish(&nodes.lab).unwrap();
    assert!(!wire.tcp.is_empty(), "the capture saw no TCP at all");
    let ports: Vec<u16> = wire.tcp_ports().into_iter().collect();
    assert_eq!(ports, vec![15008], "only HBONE may cross between nodes");
    assert!(
        !wire.payload_contains(b"hello world"),
        "plaintext crossed the link"
    );
    // TLS application-data records (type 23, version 3.3) carry the bytes.
    assert!(wire.payload_contains(&[0x17, 0x03, 0x03]));

    // Both sides count the connection, with Istio's byte orientation: received = 11
    // client-to-server bytes, sent = 22 server-to-client bytes, for both reporters.
    for (ns, reporter) in [
        (&nodes.client_ns, "source"),
        (&nodes.server_ns, "destination"),
    ] {
        let labels = [
            ("reporter", reporter),
            ("source_principal", CLIENT_ID),
            ("destination_principal", SERVER_ID),
            ("destination_workload", "server"),
            ("source_workload", "client"),
            ("connection_security_policy", "mutual_tls"),
        ];
        let mut text = String::new();
        wait_until("the close to be counted", Duration::from_secs(5), || {
            text = nodes.metrics(ns).unwrap();
            metric_sum(&text, "istio_tcp_connections_closed_total", &labels) == 1
        })
        .unwrap_or_else(|e| panic!("{reporter}: {e}\n{text}"));
        assert_eq!(
            metric_sum(&text, "istio_tcp_connections_opened_total", &labels),
            1
        );
        assert_eq!(
            metric_sum(&text, "istio_tcp_received_bytes_total", &labels),
            11,
            "{text}"
        );
        assert_eq!(
            metric_sum(&text, "istio_tcp_sent_bytes_total", &labels),
            22,
            "{text}"
        );
        assert!(text.contains("istio_build{component=\"ztunnel\""));
    }
}

#[test]
fn service_vip_reaches_an_endpoint_on_its_target_port() {
    let nodes = TwoNodes::start(ambit(), "e2e-vip", &[]).unwrap();
    let accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let back = exchange(
        &nodes,
        SocketAddr::from((SERVICE_VIP, SERVICE_PORT)),
        b"via the vip",
    );
    assert_eq!(back, b"via the vip");
    accepted.recv_timeout(Duration::from_secs(5)).unwrap();
    let labels = [
        ("reporter", "destination"),
        ("destination_service", SERVICE_HOST),
        ("destination_service_name", "echo"),
    ];
    wait_until("the service to be reported", Duration::from_secs(5), || {
        let text = nodes.metrics(&nodes.server_ns).unwrap();
        metric_sum(&text, "istio_tcp_connections_closed_total", &labels) == 1
    })
    .unwrap();
    let dump = ambit_netns_lab::http_get(
        &nodes.server_ns,
        "127.0.0.1:15000".parse().unwrap(),
        "/config_dump",
    )
    .unwrap();
    assert_eq!(dump.0, 200);
    let dump: serde_json::Value = serde_json::from_str(&dump.1).unwrap();
    for key in ["workloads", "services", "policies", "certificates"] {
        assert!(dump.get(key).is_some(), "config_dump lacks {key}: {dump}");
    }
    let certs = dump["certificates"].as_array().unwrap();
    assert!(certs.iter().any(|c| c["identity"] == SERVER_ID), "{dump}");
}

/// Only a hang fails on this (a proxy that exits, refuses or closes does so long before).
const HANG: Duration = Duration::from_secs(60);

/// Draining after SIGTERM: the open connection is served until it finishes, new ones are
/// refused, and the finished connection lets the proxy exit. Its drain deadline (an hour)
/// is far past the hang guard, so an exit within the guard is the connection's doing.
#[test]
fn open_connection_survives_sigterm_until_it_finishes() {
    let nodes = TwoNodes::start(
        ambit(),
        "e2e-drain",
        &[("CONNECTION_TERMINATION_DEADLINE", "1h".to_string())],
    )
    .unwrap();
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let dst = SocketAddr::from((SERVER_IP, APP_PORT));
    let mut conn = nodes.connect_from_client(dst).unwrap();
    conn.write_all(b"before").unwrap();
    let mut buf = [0u8; 6];
    conn.read_exact(&mut buf).unwrap();

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(nodes.client_proxy.pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    // New connections are refused once the proxy has taken the signal.
    let refused = || {
        let attempt = Lab::in_netns(&nodes.client_ns, move || {
            let mut s = std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            let _ = s.write_all(b"x");
            let mut b = [0u8; 1];
            Ok(s.read(&mut b).map(|n| n == 0).unwrap_or(true))
        });
        !matches!(attempt, Ok(false))
    };
    wait_until(
        "new connections to be refused while draining",
        HANG,
        refused,
    )
    .unwrap();
    assert!(
        nodes.lab.is_running(nodes.client_proxy.pid),
        "the proxy quit with a connection open"
    );
    // The open connection still carries data both ways.
    conn.write_all(b"during").unwrap();
    conn.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"during");
    // Finishing the connection lets the proxy exit, long before its drain deadline.
    conn.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).unwrap();
    let status = nodes.lab.wait_exit(nodes.client_proxy.pid, HANG).unwrap();
    assert!(status.success(), "{status}");
}

/// A connection still open at the drain deadline is closed by the proxy, which then exits;
/// not before the deadline (a lower bound only: a loaded machine only makes it later).
#[test]
fn drain_deadline_closes_what_is_still_open() {
    let nodes = TwoNodes::start(
        ambit(),
        "e2e-deadline",
        &[("CONNECTION_TERMINATION_DEADLINE", "1s".to_string())],
    )
    .unwrap();
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let mut conn = nodes
        .connect_from_client(SocketAddr::from((SERVER_IP, APP_PORT)))
        .unwrap();
    conn.set_read_timeout(Some(HANG)).unwrap();
    conn.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    conn.read_exact(&mut buf).unwrap();
    let started = Instant::now();
    let status = nodes
        .lab
        .signal_and_wait(
            nodes.client_proxy.pid,
            nix::sys::signal::Signal::SIGTERM,
            HANG,
        )
        .unwrap();
    assert!(status.success(), "{status}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "exited before the deadline: {waited:?}"
    );
    // The proxy closed the connection on its way out (an end or a reset, not a read that
    // timed out on a connection still open).
    let mut rest = Vec::new();
    match conn.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the connection is still open: {e}"
        ),
    }
}

/// A raw HBONE client in the client node with a certificate from the mesh's CA, to send
/// what a well-behaved proxy never would.
struct RawHbone {
    tls: Arc<rustls::ClientConfig>,
    ns: String,
}

impl RawHbone {
    fn new(nodes: &TwoNodes) -> RawHbone {
        let ca = CertificateAuthority::from_plugin_dir(&nodes.lab.dir.path().join("ca")).unwrap();
        let me = SpiffeId::new("cluster.local", "default", "client").unwrap();
        let cert = ca.issue(&me, Duration::from_secs(3600)).unwrap();
        let server = SpiffeId::parse(SERVER_ID).unwrap();
        RawHbone {
            tls: ambit_identity::tls::client_config(&cert, &[server]).unwrap(),
            ns: nodes.client_ns.clone(),
        }
    }

    fn tcp(&self) -> tokio::net::TcpStream {
        let addr = SocketAddr::from((SERVER_IP, 15008));
        // Marked like the proxy's own sockets, so the client node's capture rule lets it
        // reach the server node's HBONE port directly.
        let std = Lab::in_netns(&self.ns, move || {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            s.set_mark(0x539)?;
            s.connect_timeout(&addr.into(), Duration::from_secs(5))?;
            s.set_nonblocking(true)?;
            Ok(std::net::TcpStream::from(s))
        })
        .unwrap();
        tokio::net::TcpStream::from_std(std).unwrap()
    }

    /// Sends one request on a fresh connection and returns the response status.
    async fn status_of(&self, req: http::Request<()>) -> u16 {
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(ambit_identity::tls::placeholder_server_name(), self.tcp())
            .await
            .unwrap();
        let (mut client, conn) = h2::client::handshake(tls).await.unwrap();
        tokio::spawn(conn);
        let (resp, _send) = client.send_request(req, false).unwrap();
        resp.await.unwrap().status().as_u16()
    }
}

fn connect_request(authority: &str) -> http::Request<()> {
    http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(authority)
        .body(())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hbone_server_answers_bad_requests_with_ztunnel_status_codes() {
    let nodes = TwoNodes::start(ambit(), "e2e-status", &[]).unwrap();
    let raw = RawHbone::new(&nodes);

    // Not CONNECT.
    let get = http::Request::builder()
        .method(http::Method::GET)
        .uri(format!("https://{SERVER_IP}:{APP_PORT}/"))
        .body(())
        .unwrap();
    assert_eq!(raw.status_of(get).await, 400);
    // A loop-guard port.
    assert_eq!(
        raw.status_of(connect_request(&format!("{SERVER_IP}:15001")))
            .await,
        503
    );
    // Another IP than the one the connection arrived on.
    assert_eq!(
        raw.status_of(connect_request(&format!("{CLIENT_IP}:{APP_PORT}")))
            .await,
        400
    );
    // Nothing listens on the app port yet: the upstream refuses, so 503 (never 200 first).
    assert_eq!(
        raw.status_of(connect_request(&format!("{SERVER_IP}:{APP_PORT}")))
            .await,
        503
    );
    // With the app up, the same request succeeds.
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    assert_eq!(
        raw.status_of(connect_request(&format!("{SERVER_IP}:{APP_PORT}")))
            .await,
        200
    );
    // A hostname authority is translated through the service's port map.
    assert_eq!(
        raw.status_of(connect_request(&format!("{SERVICE_HOST}:{SERVICE_PORT}")))
            .await,
        200
    );

    // Garbage instead of TLS: that connection is closed, the proxy keeps serving others.
    let mut junk = raw.tcp();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    junk.write_all(&[0x42; 512]).await.unwrap();
    let mut sink = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), junk.read_to_end(&mut sink)).await;
    assert!(read.is_ok(), "the proxy kept a garbage connection open");
    assert_eq!(
        raw.status_of(connect_request(&format!("{SERVER_IP}:{APP_PORT}")))
            .await,
        200
    );
    assert!(nodes.lab.is_running(nodes.server_proxy.pid));
}

#[test]
fn ipv6_client_reaches_server_through_ip6t_original_destination() {
    use ambit_netns_lab::mesh::SERVER_IP6;
    let nodes = TwoNodes::start(ambit(), "e2e-v6", &[]).unwrap();
    let accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let capture = nodes.capture_link().unwrap();
    let back = exchange(
        &nodes,
        SocketAddr::from((SERVER_IP6, APP_PORT)),
        b"over ipv6",
    );
    assert_eq!(back, b"over ipv6");
    accepted.recv_timeout(Duration::from_secs(5)).unwrap();
    let wire = capture.finish(&nodes.lab).unwrap();
    assert_eq!(
        wire.tcp_ports().into_iter().collect::<Vec<_>>(),
        vec![15008]
    );
    assert!(!wire.payload_contains(b"over ipv6"));
    let labels = [("reporter", "destination"), ("source_principal", CLIENT_ID)];
    wait_until(
        "the v6 connection to be counted",
        Duration::from_secs(5),
        || {
            let text = nodes.metrics(&nodes.server_ns).unwrap();
            metric_sum(&text, "istio_tcp_connections_closed_total", &labels) == 1
        },
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_policy_denies_with_401_and_counts_deny() {
    // Only a service account nobody runs may reach the default namespace.
    let policy = r#"policies:
- name: only-nobody
  namespace: default
  scope: Namespace
  action: Allow
  rules: [[[ {principals: [{exact: "cluster.local/ns/default/sa/nobody"}]} ]]]
"#;
    let nodes = TwoNodes::start_with(ambit(), "e2e-rbac", &[], policy).unwrap();
    let accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let raw = RawHbone::new(&nodes);
    assert_eq!(
        raw.status_of(connect_request(&format!("{SERVER_IP}:{APP_PORT}")))
            .await,
        401
    );

    // Through the client's node proxy: the app never sees the connection.
    let back = tokio::task::spawn_blocking({
        let dst = SocketAddr::from((SERVER_IP, APP_PORT));
        let ns = nodes.client_ns.clone();
        move || {
            let mut s = Lab::in_netns(&ns, move || {
                std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(5))
            })
            .unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.write_all(b"let me in");
            let _ = s.shutdown(Shutdown::Write);
            let mut back = Vec::new();
            let _ = s.read_to_end(&mut back);
            back
        }
    })
    .await
    .unwrap();
    assert!(back.is_empty(), "denied traffic reached the app: {back:?}");
    assert!(
        accepted.try_recv().is_err(),
        "the app accepted a denied connection"
    );

    let labels = [("reporter", "destination"), ("response_flags", "DENY")];
    let mut text = String::new();
    wait_until("both denials to be counted", Duration::from_secs(5), || {
        text = nodes.metrics(&nodes.server_ns).unwrap();
        metric_sum(&text, "istio_tcp_connections_failed_total", &labels) == 2
    })
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(
        metric_sum(&text, "istio_tcp_connections_closed_total", &labels),
        2
    );
}

/// RFC 9113 §8.5 through both proxies: an app's TCP reset crosses the tunnel as
/// `RST_STREAM(CONNECT_ERROR)` and reaches the app at the other end as a reset, never as a
/// clean end of stream, whichever side resets.
#[test]
fn a_reset_reaches_the_other_app_as_a_reset() {
    use std::net::{Ipv6Addr, SocketAddrV6, TcpListener, TcpStream};
    let nodes = TwoNodes::start(ambit(), "e2e-reset", &[]).unwrap();
    let listener = Lab::in_netns(&nodes.server_ns, || {
        TcpListener::bind(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, APP_PORT, 0, 0))
    })
    .unwrap();
    fn abort(s: TcpStream) {
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    }
    // What the app reads after its first five bytes: more bytes, EOF, or an error kind.
    fn then_reads(s: &mut TcpStream) -> Result<usize, std::io::ErrorKind> {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf) {
                // A signal to this process (a child of another test exiting) is not how
                // the connection ended: read again.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => return r.map_err(|e| e.kind()),
            }
        }
    }
    let (server_saw_tx, server_saw) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // First connection: the server app resets after the request.
        let (mut conn, _) = listener.accept().unwrap();
        let mut hello = [0u8; 5];
        conn.read_exact(&mut hello).unwrap();
        abort(conn);
        // Second: the server app waits and reports how its connection ended.
        let (mut conn, _) = listener.accept().unwrap();
        conn.read_exact(&mut hello).unwrap();
        let _ = server_saw_tx.send(then_reads(&mut conn));
    });
    let dst = SocketAddr::from((SERVER_IP, APP_PORT));

    let mut client = nodes.connect_from_client(dst).unwrap();
    client.write_all(b"hello").unwrap();
    assert_eq!(
        then_reads(&mut client),
        Err(std::io::ErrorKind::ConnectionReset),
        "the client app must see the server app's reset"
    );

    let mut client = nodes.connect_from_client(dst).unwrap();
    client.write_all(b"hello").unwrap();
    // Let the request reach the server app before the client aborts.
    std::thread::sleep(Duration::from_millis(300));
    abort(client);
    assert_eq!(
        server_saw.recv_timeout(Duration::from_secs(10)).unwrap(),
        Err(std::io::ErrorKind::ConnectionReset),
        "the server app must see the client app's reset"
    );
}

/// `LOCAL_XDS_PATH` is watched: a DENY added to the file closes an open connection
/// (counted with `response_flags="DENY"`); a bad policy added later is reported (log and
/// metric) and the rest of the new file still applies.
#[test]
fn local_file_changes_apply_to_open_connections() {
    let nodes = TwoNodes::start(ambit(), "e2e-reload", &[]).unwrap();
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let direct = SocketAddr::from((SERVER_IP, APP_PORT));
    let echo = |conn: &mut std::net::TcpStream, payload: &[u8]| -> std::io::Result<()> {
        conn.write_all(payload)?;
        let mut buf = vec![0u8; payload.len()];
        conn.read_exact(&mut buf)?;
        assert_eq!(buf, payload);
        Ok(())
    };
    let mut open = nodes.connect_from_client(direct).unwrap();
    open.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    echo(&mut open, b"first").unwrap();

    let mesh = std::fs::read_to_string(&nodes.config_path).unwrap();
    let deny = "policies:\n- {name: deny-client, namespace: default, scope: Namespace, action: Deny, rules: [[[{principals: [{exact: \"cluster.local/ns/default/sa/client\"}]}]]]}\n";
    // Written whole under another name, then renamed over: the watcher never reads half.
    let write = |text: &str| {
        let tmp = nodes.config_path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &nodes.config_path).unwrap();
    };
    write(&format!("{mesh}{deny}"));
    // Closed by the proxy: an end of stream or a reset, not a read that timed out.
    let deadline = Instant::now() + Duration::from_secs(20);
    let closed = loop {
        let mut buf = [0u8; 16];
        let r = open.write_all(b"again").and_then(|()| open.read(&mut buf));
        match r {
            Ok(0) => break true,
            Err(e)
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break true
            }
            _ if Instant::now() > deadline => break false,
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    assert!(
        closed,
        "the open connection survived a DENY added to the file"
    );
    let labels = [("reporter", "destination"), ("response_flags", "DENY")];
    wait_until(
        "the close to be counted as DENY",
        Duration::from_secs(10),
        || {
            let text = nodes.metrics(&nodes.server_ns).unwrap();
            metric_sum(&text, "istio_tcp_connections_closed_total", &labels) >= 1
        },
    )
    .unwrap();

    // The DENY goes, and a bad policy (an invalid CIDR) comes: it is refused and
    // reported, the removal still applies.
    let bad = "policies:\n- {name: broken, namespace: elsewhere, scope: Namespace, action: Allow, rules: [[[{sourceIps: [\"10.0.0.0/33\"]}]]]}\n";
    write(&format!("{mesh}{bad}"));
    let mut text = String::new();
    wait_until(
        "the bad policy to be reported",
        Duration::from_secs(15),
        || {
            text = nodes.metrics(&nodes.server_ns).unwrap();
            metric_sum(
                &text,
                "ambit_local_config_rejected_policies",
                &[("policy", "elsewhere/broken")],
            ) == 1
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    wait_until(
        "the client to be admitted again",
        Duration::from_secs(15),
        || {
            let Ok(mut conn) = nodes.connect_from_client(direct) else {
                return false;
            };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            echo(&mut conn, b"back in").is_ok()
        },
    )
    .unwrap();
}

/// A service with an endpoint on each node, of capacities 1 (node1) and 4 (node2): the
/// client's connections to its VIP reach both, the heavier one more often.
#[test]
fn service_endpoints_on_two_nodes_share_connections_by_capacity() {
    // The client workload is the light endpoint (node1, served by its own node proxy's
    // HBONE inbound), the server the heavy one (node2).
    let endpoint =
        format!("  services:\n    default/{SERVICE_HOST}:\n      {SERVICE_PORT}: {APP_PORT}\n");
    let mesh = ambit_netns_lab::mesh::mesh_yaml()
        .replacen("  services: {}\n", &format!("  capacity: 1\n{endpoint}"), 1)
        .replacen("  node: node2\n", "  node: node2\n  capacity: 4\n", 1);
    assert!(
        mesh.contains("capacity: 1") && mesh.contains("capacity: 4"),
        "{mesh}"
    );
    let nodes = TwoNodes::launch(ambit_netns_lab::mesh::TwoNodesSpec {
        mesh: Some(&mesh),
        ..ambit_netns_lab::mesh::TwoNodesSpec::pair(
            "e2e-weights",
            &ambit_netns_lab::peer::NodeProxy::Ambit(ambit().to_path_buf()),
        )
    })
    .unwrap();
    // node2's app echoes once, node1's twice: the answer's length says who served it.
    let _server = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let listener = Lab::in_netns(&nodes.client_ns, || {
        std::net::TcpListener::bind(SocketAddr::from((CLIENT_IP, APP_PORT)))
    })
    .unwrap();
    let _local = ambit_netns_lab::mesh::serve_echo(listener, EchoMode::Double);
    let vip = SocketAddr::from((SERVICE_VIP, SERVICE_PORT));
    // 100 connections, not 50: with p = 1/5 for the light endpoint, 50 cannot make both
    // checks below fail by luck less than once in a million (0.8^50 = 1.4e-5 alone).
    // With 100: P(light = 0) = 0.8^100 = 2e-10; P(light >= heavy) = P(Bin(100, 0.2) >=
    // 50) < 1e-10; P(heavy = 0) = 0.2^100. Together under 1e-9.
    let (mut light, mut heavy) = (0u32, 0u32);
    for _ in 0..100 {
        match exchange(&nodes, vip, b"w").as_slice() {
            b"ww" => light += 1,
            b"w" => heavy += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert!(light > 0 && heavy > light, "light {light}, heavy {heavy}");
}
