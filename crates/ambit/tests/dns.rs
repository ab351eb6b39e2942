//! The DNS proxy in-pod, as root: the agent captures the pods' DNS (on by default) to the
//! node proxy's 15053 in each pod; mesh names are answered, others forwarded to a test
//! resolver on the node (named in the proxy's resolv.conf); bad input and one pod's
//! flood are handled without harming another pod.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ambit_netns_lab::cluster::{Cluster, ClusterSpec, PodSpec};
use ambit_netns_lab::mesh::EchoMode;
use ambit_netns_lab::peer::NodeProxy;
use ambit_netns_lab::Lab;
use ambit_zds::Netns;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The node's bridge address, where the test resolver listens.
const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 88, 1, 1);

fn ambit() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ambit"))
}

/// A small upstream resolver: `example.org` ⇒ 192.0.2.1, `flood.example` never answered
/// (counted), anything else NXDOMAIN.
fn test_resolver(socket: UdpSocket, flood_seen: Arc<AtomicUsize>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        loop {
            let Ok((n, src)) = socket.recv_from(&mut buf) else {
                return;
            };
            let q = &buf[..n];
            if q.len() < 12 {
                continue;
            }
            let name = &q[12..];
            if name.starts_with(b"\x05flood") {
                flood_seen.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            // Header: same id, QR + RD + RA, one question.
            let mut r = q.to_vec();
            r[2] = 0x81;
            if name.starts_with(b"\x07example\x03org\x00") {
                r[3] = 0x80;
                r[6..8].copy_from_slice(&[0, 1]);
                r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 1]);
            } else {
                r[3] = 0x83;
            }
            let _ = socket.send_to(&r, src);
        }
    });
}

fn dig(cluster: &Cluster, pod: &str, args: &[&str]) -> String {
    let ns = &cluster.pod(pod).ns;
    let mut full = vec!["dig", "+short", "+time=3", "+tries=1"];
    let server = format!("@{GATEWAY}");
    full.push(&server);
    full.extend_from_slice(args);
    cluster.lab.exec(ns, &full).unwrap_or_else(|e| {
        let log = cluster.nodes[0]
            .ztunnel
            .as_ref()
            .and_then(|p| std::fs::read_to_string(&p.log).ok())
            .unwrap_or_default();
        panic!("dig {args:?} in {pod}: {e}\nnode proxy log:\n{log}")
    })
}

fn query(id: u16, name: &[u8]) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    q.extend_from_slice(name);
    q.extend_from_slice(&[0, 1, 0, 1]);
    q
}

fn label_name(labels: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in labels {
        out.push(l.len() as u8);
        out.extend_from_slice(l);
    }
    out.push(0);
    out
}

/// Response code of the reply to `bytes` sent from `socket`, or `None` when none came.
fn ask(socket: &UdpSocket, bytes: &[u8]) -> Option<u8> {
    socket
        .send_to(bytes, SocketAddr::from((GATEWAY, 53)))
        .unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match socket.recv(&mut buf) {
            Ok(n) if n >= 4 && buf[..2] == bytes[..2] => return Some(buf[3] & 0x0f),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

#[test]
fn pods_resolve_mesh_names_through_the_dns_proxy_and_forward_the_rest() {
    let dir =
        ambit_netns_lab::tempfile_dir::TempDir::new(&format!("ambit-dns-{}", std::process::id()))
            .unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {GATEWAY}\n")).unwrap();
    let b =
        PodSpec::new("b", 0).endpoint_of("default/echo.default.svc.cluster.local", &[(80, 8080)]);
    let pods = [PodSpec::new("a", 0), b, PodSpec::new("c", 0)];
    let extra = format!(
        "services:\n- {{name: echo, namespace: default, hostname: echo.default.svc.cluster.local, vips: [\"/{VIP}\"], ports: {{80: 8080}}}}\n"
    );
    let cluster = Cluster::launch(ClusterSpec {
        ambit: ambit(),
        tag: "dns",
        node_proxies: vec![NodeProxy::Ambit(ambit().to_path_buf())],
        pods: &pods,
        create: pods.len(),
        extra_yaml: &extra,
        proxy_env: &[
            // The lab's default is off; later settings win.
            ("ISTIO_META_DNS_CAPTURE", "true".to_string()),
            ("AMBIT_DNS_RESOLV_CONF", resolv.display().to_string()),
        ],
        control: None,
    })
    .unwrap();
    let flood_seen = Arc::new(AtomicUsize::new(0));
    let node_ns = Netns::open(Lab::netns_path(&cluster.nodes[0].ns)).unwrap();
    let upstream = node_ns
        .run_in(|| UdpSocket::bind((GATEWAY, 53)))
        .expect("the test resolver binds on the node's bridge");
    test_resolver(upstream, flood_seen.clone());

    // Mesh names: short, FQDN, and with a search domain appended (CNAME to the real name).
    let vip = VIP.to_string();
    assert_eq!(dig(&cluster, "a", &["echo"]).trim(), vip);
    assert_eq!(
        dig(&cluster, "a", &["echo.default.svc.cluster.local"]).trim(),
        vip
    );
    let searched = dig(
        &cluster,
        "a",
        &["echo.default.svc.cluster.local.default.svc.cluster.local"],
    );
    assert_eq!(
        searched.lines().collect::<Vec<_>>(),
        ["echo.default.svc.cluster.local.", vip.as_str()],
        "{searched}"
    );
    assert_eq!(dig(&cluster, "a", &["+tcp", "echo.default"]).trim(), vip);
    // The resolved VIP works.
    let _seen = cluster.serve_app("b", 8080, EchoMode::Double).unwrap();
    let mut conn = cluster
        .connect_from("a", SocketAddr::from((VIP, 80)))
        .unwrap();
    conn.write_all(b"ping").unwrap();
    conn.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    conn.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"pingping");

    // Not a mesh name: forwarded from the pod to the resolver of resolv.conf.
    assert_eq!(dig(&cluster, "a", &["example.org"]).trim(), "192.0.2.1");
    let nx = cluster
        .lab
        .exec(
            &cluster.pod("a").ns,
            &[
                "dig",
                "+time=3",
                "+tries=1",
                &format!("@{GATEWAY}"),
                "nx.example.org",
            ],
        )
        .unwrap();
    assert!(nx.contains("status: NXDOMAIN"), "{nx}");

    // Bad input from pod a, on a socket in its netns (captured like the app's).
    let a_ns = Netns::open(cluster.pod("a").netns_path()).unwrap();
    let a_sock = a_ns.run_in(|| UdpSocket::bind("0.0.0.0:0")).unwrap();
    a_sock
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let long: Vec<&[u8]> = vec![&[b'a'; 60]; 5];
    assert_eq!(
        ask(&a_sock, &query(0x0101, &label_name(&long))),
        Some(1),
        "300-byte name: FORMERR"
    );
    let full = query(
        0x0102,
        &label_name(&[b"echo", b"default", b"svc", b"cluster", b"local"]),
    );
    assert_eq!(ask(&a_sock, &full[..20]), Some(1), "truncated: FORMERR");
    assert_eq!(ask(&a_sock, &full[..4]), None, "no header: dropped");
    assert_eq!(
        ask(&a_sock, &full),
        Some(0),
        "the same query whole is answered"
    );

    // A flood of forwarded queries from pod a: bounded, and pod c still gets answers.
    let flood_name = label_name(&[b"flood", b"example"]);
    for id in 0..2000u16 {
        let _ = a_sock.send_to(&query(id, &flood_name), SocketAddr::from((GATEWAY, 53)));
    }
    assert_eq!(dig(&cluster, "c", &["example.org"]).trim(), "192.0.2.1");
    assert_eq!(dig(&cluster, "c", &["echo"]).trim(), vip);
    assert_eq!(
        dig(&cluster, "a", &["echo"]).trim(),
        vip,
        "mesh names need no slot"
    );
    let forwarded = flood_seen.load(Ordering::SeqCst);
    assert!(
        forwarded > 0 && forwarded <= ambit_dns::forward::MAX_IN_FLIGHT,
        "{forwarded} flood queries reached the upstream"
    );

    let text = cluster.metrics(0).unwrap();
    assert!(
        text.contains("istio_dns_requests_total{request_query_type=\"a\",request_protocol=\"udp\",source_canonical_service=\"a\""),
        "{text}"
    );
    assert!(
        text.contains("istio_dns_upstream_requests_total{"),
        "{text}"
    );
}
