//! SOCKS5 (`UNSTABLE_ENABLE_SOCKS5=true`), as root: curl, which knows nothing of the mesh,
//! asks the client node's proxy on 127.0.0.1:15080 for a destination, and the connection
//! then crosses in HBONE like a captured one.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use ambit_netns_lab::mesh::{
    metric_sum, EchoMode, TwoNodes, APP_PORT, SERVER_IP, SERVICE_HOST, SERVICE_PORT,
};
use ambit_netns_lab::{wait_until, Lab};

fn ambit() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ambit"))
}

const CLIENT_ID: &str = "spiffe://cluster.local/ns/default/sa/client";

fn socks(nodes: &TwoNodes) -> TcpStream {
    let s = Lab::in_netns(&nodes.client_ns, || {
        TcpStream::connect_timeout(&"127.0.0.1:15080".parse().unwrap(), Duration::from_secs(5))
    })
    .expect("the SOCKS5 listener on 127.0.0.1:15080");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// curl in the client node through the SOCKS5 listener (`--socks5` or
/// `--socks5-hostname`); its output, or why it failed.
fn curl(nodes: &TwoNodes, how: &str, url: &str) -> anyhow::Result<String> {
    nodes.lab.exec(
        &nodes.client_ns,
        &[
            "curl",
            "-sS",
            "--max-time",
            "10",
            how,
            "127.0.0.1:15080",
            url,
        ],
    )
}

#[test]
fn curl_through_socks5_reaches_the_server_over_hbone() {
    // With the DNS proxy on (the lab turns it off by default): names go through it.
    let env = [
        ("UNSTABLE_ENABLE_SOCKS5", "true".to_string()),
        ("ISTIO_META_DNS_CAPTURE", "true".to_string()),
    ];
    let nodes = TwoNodes::start(ambit(), "e2e-socks", &env).unwrap();
    let _app = nodes.start_app_server(EchoMode::Http).unwrap();
    // Without the capture rule, only SOCKS5 can bring the connection to the proxy.
    nodes
        .lab
        .exec(
            &nodes.client_ns,
            &["iptables", "-w", "-t", "nat", "-F", "OUTPUT"],
        )
        .unwrap();

    let body = curl(
        &nodes,
        "--socks5",
        &format!("http://{SERVER_IP}:{APP_PORT}/"),
    )
    .unwrap();
    // Dedicated mode does not spoof the client's address by default: the app sees its
    // own node's proxy connect to it.
    assert!(
        body.starts_with(&format!("hello from [::ffff:{SERVER_IP}]:")),
        "curl got {body:?}"
    );
    // A mesh name, resolved by the client node's DNS proxy to the service VIP, then
    // load-balanced to the server's target port.
    let url = format!("http://{SERVICE_HOST}:{SERVICE_PORT}/");
    let body = curl(&nodes, "--socks5-hostname", &url).unwrap();
    assert!(body.starts_with("hello from "), "curl got {body:?}");
    let labels = [
        ("reporter", "destination"),
        ("source_principal", CLIENT_ID),
        ("connection_security_policy", "mutual_tls"),
    ];
    wait_until(
        "the server to count both connections",
        Duration::from_secs(5),
        || {
            let text = nodes.metrics(&nodes.server_ns).unwrap();
            metric_sum(&text, "istio_tcp_connections_closed_total", &labels) == 2
        },
    )
    .unwrap();
    // The client's node addressed one of them to the service (the name), one to the pod.
    let text = nodes.metrics(&nodes.client_ns).unwrap();
    assert_eq!(
        metric_sum(
            &text,
            "istio_tcp_connections_closed_total",
            &[
                ("reporter", "source"),
                ("destination_service", SERVICE_HOST)
            ]
        ),
        1,
        "the name went to the service: {text}"
    );
    // A name nobody knows: curl is told the host is unreachable.
    let err = curl(&nodes, "--socks5-hostname", "http://nowhere.invalid/");
    assert!(err.is_err(), "curl reached an unknown name: {err:?}");
}

#[test]
fn socks5_refusals_follow_rfc_1928_codes() {
    let env = [("UNSTABLE_ENABLE_SOCKS5", "true".to_string())];
    let nodes = TwoNodes::start(ambit(), "e2e-socks-bad", &env).unwrap();
    let read_all = |mut s: TcpStream| {
        let mut back = Vec::new();
        let _ = s.read_to_end(&mut back);
        back
    };

    // A client that only offers username/password gets "no acceptable methods".
    let mut s = socks(&nodes);
    s.write_all(&[5, 1, 2]).unwrap();
    assert_eq!(read_all(s), [5, 0xFF]);

    // BIND is not served: "command not supported", bound address 0.0.0.0:0.
    let mut s = socks(&nodes);
    s.write_all(&[5, 1, 0]).unwrap();
    s.write_all(&[5, 2, 0, 1, 10, 0, 0, 1, 0, 80]).unwrap();
    assert_eq!(read_all(s), [5, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0]);

    // The proxy's own ports are refused as a loop, after the success reply (the reply
    // comes before the upstream, as in ztunnel): the connection just closes.
    let mut s = socks(&nodes);
    s.write_all(&[5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0x3a, 0x98])
        .unwrap();
    assert_eq!(read_all(s), [5, 0, 5, 0, 0, 1, 0, 0, 0, 0, 0, 0]);

    // A name without a DNS proxy to resolve it: a general failure.
    let mut s = socks(&nodes);
    let mut req = vec![5, 1, 0, 5, 1, 0, 3, 4];
    req.extend(b"echo");
    req.extend([0, 80]);
    s.write_all(&req).unwrap();
    assert_eq!(read_all(s), [5, 0, 5, 1, 0, 1, 0, 0, 0, 0, 0, 0]);

    // The proxy still serves after all that.
    let _app = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let mut s = socks(&nodes);
    s.write_all(&[5, 1, 0]).unwrap();
    let dst: SocketAddr = SocketAddr::from((SERVER_IP, APP_PORT));
    let SocketAddr::V4(v4) = dst else {
        unreachable!()
    };
    let mut req = vec![5, 1, 0, 1];
    req.extend(v4.ip().octets());
    req.extend(v4.port().to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 12];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply, [5, 0, 5, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    s.write_all(b"ping").unwrap();
    let mut back = [0u8; 4];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping");
}
