//! The in-pod (shared mode) demo: two nodes, each with the node agent and a node proxy in
//! shared mode; four pods created through a real CNI chain; real traffic within a node
//! and across nodes, and what crossed the wires; then HTTP through a real waypoint
//! (`ambit waypoint`, this same binary): an L7 policy, each request balanced over a
//! service's endpoints on both nodes, and what the destinations and the waypoint counted.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use anyhow::{bail, Context};

use ambit_netns_lab::cluster::{Cluster, ClusterSpec, PodSpec};
use ambit_netns_lab::mesh::{metric_sum, EchoMode};
use ambit_netns_lab::peer::NodeProxy;

use crate::report::{control_summary, doubled_echo};
use crate::waypoint::{
    REVIEWS_APP_PORT, REVIEWS_HOST, REVIEWS_POLICY, REVIEWS_POLICY_FILE, REVIEWS_PORT, REVIEWS_VIP,
    V1_HOST, V2_HOST, WAYPOINT_IP,
};

const APP_PORT: u16 = 8080;
const ECHO_HOST: &str = "echo.default.svc.cluster.local";
const ECHO_VIP: [u8; 4] = [10, 96, 0, 10];
const ECHO_PORT: u16 = 80;
/// How many connections the client sends to the service VIP.
const VIP_CONNECTIONS: usize = 20;

/// What the demo adds to the pods' workloads: the waypoint pod, two services backed by a
/// pod on each node (`reviews` behind the waypoint), and a DENY policy for one client.
fn semantics_yaml() -> String {
    let vip = std::net::Ipv4Addr::from(ECHO_VIP);
    // The second waypoint's pod and `ratings`, served by `reviews`' apps.
    let (k8s_workload, k8s_service) = crate::kubernetes::mesh_parts(REVIEWS_APP_PORT);
    format!(
        r#"{k8s_workload}- uid: cluster1//v1/Pod/default/waypoint
  name: waypoint
  namespace: default
  serviceAccount: waypoint
  trustDomain: cluster.local
  workloadIps: ["{WAYPOINT_IP}"]
  protocol: HBONE
  node: node2
  canonicalName: waypoint
  workloadName: waypoint
services:
{k8s_service}- name: echo
  namespace: default
  hostname: {ECHO_HOST}
  vips: ["/{vip}"]
  ports: {{{ECHO_PORT}: {APP_PORT}}}
- name: reviews
  namespace: default
  hostname: {REVIEWS_HOST}
  vips: ["/{REVIEWS_VIP}"]
  ports: {{{REVIEWS_PORT}: {REVIEWS_APP_PORT}}}
  waypoint: {{destination: "/{WAYPOINT_IP}", hboneMtlsPort: 15008}}
- name: reviews-v1
  namespace: default
  hostname: {V1_HOST}
  vips: ["/10.96.0.21"]
  ports: {{{REVIEWS_PORT}: {REVIEWS_APP_PORT}}}
- name: reviews-v2
  namespace: default
  hostname: {V2_HOST}
  vips: ["/10.96.0.22"]
  ports: {{{REVIEWS_PORT}: {REVIEWS_APP_PORT}}}
policies:
- name: deny-intruder
  namespace: default
  scope: Namespace
  action: Deny
  rules: [[[ {{principals: [{{exact: "cluster.local/ns/default/sa/intruder"}}]}} ]]]
"#
    )
}

/// Sends `payload`, half-closes and reads the answer (empty when the mesh refused it).
fn exchange(conn: &mut std::net::TcpStream, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
    conn.write_all(payload)?;
    conn.shutdown(Shutdown::Write)?;
    let mut back = Vec::new();
    match conn.read_to_end(&mut back) {
        Ok(_) => Ok(back),
        // A refused tunnel may reach the app as a reset.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(back),
        Err(e) => Err(e.into()),
    }
}

pub fn run(keep: bool) -> anyhow::Result<()> {
    let ambit = std::env::current_exe().context("locating the ambit binary")?;
    println!(
        "building two nodes (agent + node proxy each), `ambit control` on node2, and four pods through the CNI chain..."
    );
    let echo_key = format!("default/{ECHO_HOST}");
    let reviews_key = format!("default/{REVIEWS_HOST}");
    let (v1_key, v2_key) = (format!("default/{V1_HOST}"), format!("default/{V2_HOST}"));
    let ratings_key = format!("default/{}", crate::kubernetes::RATINGS_HOST);
    let pods = [
        PodSpec::new("client", 0),
        PodSpec::new("neighbour", 0)
            .endpoint_of(&echo_key, &[])
            .endpoint_of(&reviews_key, &[])
            .endpoint_of(&ratings_key, &[])
            .endpoint_of(&v1_key, &[]),
        PodSpec::new("server", 1)
            .endpoint_of(&echo_key, &[])
            .endpoint_of(&reviews_key, &[])
            .endpoint_of(&ratings_key, &[])
            .endpoint_of(&v2_key, &[]),
        PodSpec::new("intruder", 0),
    ];
    let extra_yaml = semantics_yaml();
    let cluster = Cluster::launch(ClusterSpec {
        ambit: &ambit,
        tag: "demo",
        node_proxies: vec![NodeProxy::Ambit(ambit.clone()); 2],
        pods: &pods,
        create: pods.len(),
        extra_yaml: &extra_yaml,
        // The DNS proxy in every pod (the lab's default is off).
        proxy_env: &[("ISTIO_META_DNS_CAPTURE", "true".to_string())],
        // Config over delta xDS and certificates from its CA: no node holds the CA key.
        control: Some(&ambit),
    })?;
    ambit_netns_lab::remove_on_signal(cluster.lab.cleanup_handle());
    let seen_server = cluster.serve_app("server", APP_PORT, EchoMode::Double)?;
    let seen_neighbour = cluster.serve_app("neighbour", APP_PORT, EchoMode::Double)?;
    for pod in ["neighbour", "server"] {
        cluster.serve_http(pod, REVIEWS_APP_PORT)?;
    }
    let bridge = cluster.lab.capture(&cluster.nodes[0].ns, "cni0").ok();
    let link = cluster.lab.capture(&cluster.nodes[0].ns, "eth0").ok();
    if bridge.is_none() || link.is_none() {
        println!("(tcpdump not found: the wires will not be inspected; apt-get install tcpdump)");
    }

    let secret = b"the quick brown fox: plaintext that must never leave a pod".to_vec();
    let mut rows = Vec::new();
    for (target, seen) in [("neighbour", &seen_neighbour), ("server", &seen_server)] {
        let dst = SocketAddr::from((cluster.pod(target).ip, APP_PORT));
        let conn = cluster.connect_from("client", dst)?;
        let (received, peer) = doubled_echo(target, conn, &secret, seen)?;
        rows.push((target, dst, secret.len(), received, peer));
    }

    // The service: connections to its VIP spread over the pods on both nodes.
    let vip = SocketAddr::from((ECHO_VIP, ECHO_PORT));
    let (mut on_neighbour, mut on_server) = (0, 0);
    for _ in 0..VIP_CONNECTIONS {
        let mut conn = cluster.connect_from("client", vip)?;
        let back = exchange(&mut conn, b"lb")?;
        if back != b"lblb" {
            bail!("{ECHO_HOST} ({vip}): expected the echo back, got {back:?}");
        }
        // Exactly one of the two endpoints saw it.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if seen_neighbour.try_recv().is_ok() {
                on_neighbour += 1;
                break;
            }
            if seen_server.try_recv().is_ok() {
                on_server += 1;
                break;
            }
            if std::time::Instant::now() > deadline {
                bail!("no endpoint of {ECHO_HOST} saw the connection");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // The DNS proxy: the pod's DNS traffic is captured into its node proxy, which answers
    // mesh names from the mesh (any nameserver address works: port 53 is redirected).
    let answer = cluster.lab.exec(
        &cluster.pod("client").ns,
        &[
            "dig",
            "+noall",
            "+answer",
            "+time=3",
            "+tries=1",
            "@10.88.1.1",
            "echo",
        ],
    )?;
    let dns_record = answer
        .lines()
        .find(|l| l.contains("\tA\t") || l.split_whitespace().nth(3) == Some("A"))
        .with_context(|| format!("dig echo: no A record in {answer:?}"))?
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let resolved: std::net::IpAddr = dns_record
        .rsplit(' ')
        .next()
        .and_then(|ip| ip.parse().ok())
        .with_context(|| format!("dig echo: {dns_record}"))?;
    if resolved != vip.ip() {
        bail!("dig echo answered {resolved}, not the VIP {}", vip.ip());
    }
    let mut conn = cluster.connect_from("client", SocketAddr::new(resolved, ECHO_PORT))?;
    if exchange(&mut conn, b"by name")? != b"by nameby name" {
        bail!("the resolved VIP {resolved} did not echo");
    }
    // The DENY policy: the intruder's connection is refused at the server's node proxy.
    let mut conn = cluster.connect_from("intruder", vip)?;
    let denied = exchange(&mut conn, &secret)?;
    if !denied.is_empty() {
        bail!("the intruder got an answer past the DENY policy: {denied:?}");
    }

    // The waypoint: HTTP to `reviews` goes through `ambit waypoint`, which authorizes
    // each request and balances it over the service's endpoints on both nodes.
    // Its policy is served by ambit control, as istiod serves a waypoint's.
    cluster.serve_manifests(REVIEWS_POLICY_FILE, REVIEWS_POLICY)?;
    let waypoint = cluster.start_waypoint(1, "waypoint", WAYPOINT_IP, None)?;
    let l7 = crate::waypoint::through(&cluster, &waypoint)?;
    let routed = crate::waypoint::routed(&cluster)?;
    let authenticated = crate::waypoint::authenticated(&cluster)?;
    let on_kubernetes = crate::kubernetes::run(&cluster, &ambit)?;

    let mut wires = Vec::new();
    for (name, capture) in [("node1 bridge cni0", bridge), ("node1 link eth0", link)] {
        if let Some(c) = capture {
            let cap = c.finish(&cluster.lab)?;
            let ports: Vec<String> = cap.tcp_ports().iter().map(u16::to_string).collect();
            wires.push((
                name,
                cap.tcp.len(),
                ports.join(","),
                cap.payload_contains(&secret[..20]),
            ));
        }
    }

    println!();
    for pod in &cluster.pods {
        println!(
            "  pod {:<10} {:<12} node{}  spiffe://cluster.local/ns/default/sa/{}",
            pod.name,
            pod.ip,
            pod.node + 1,
            pod.service_account
        );
    }
    println!();
    println!(
        "  {:<22} {:<18} {:>6} {:>9}  app saw source",
        "client ->", "address", "sent", "received"
    );
    for (target, dst, sent, recv, peer) in &rows {
        println!(
            "  {:<22} {dst:<18} {sent:>6} {recv:>9}  {}",
            format!("{target}"),
            peer.ip()
        );
    }
    println!();
    println!(
        "  client -> {ECHO_HOST} ({vip}), {VIP_CONNECTIONS} connections: {on_neighbour} to neighbour (node1), {on_server} to server (node2)"
    );
    let denials: u64 = (0..cluster.nodes.len())
        .map(|i| {
            let text = cluster.metrics(i).unwrap_or_default();
            metric_sum(
                &text,
                "istio_tcp_connections_failed_total",
                &[("reporter", "destination"), ("response_flags", "DENY")],
            )
        })
        .sum();
    println!(
        "  intruder -> {ECHO_HOST} ({vip}): refused by DENY policy default/deny-intruder (denials counted: {denials})"
    );
    println!(
        "  client: dig echo -> {dns_record} (the DNS proxy in the pod: `echo` expanded to {ECHO_HOST}); connected to {resolved}:{ECHO_PORT}"
    );
    println!();
    l7.print(&waypoint);
    routed.print();
    authenticated.print();
    on_kubernetes.print();
    println!();
    for (name, segments, ports, clear) in &wires {
        println!(
            "  wire {name}: {segments} TCP segments, ports: {ports}; plaintext seen: {}",
            if *clear { "YES (bad!)" } else { "no, only TLS" }
        );
    }
    for (i, node) in cluster.nodes.iter().enumerate() {
        let text = cluster.metrics(i)?;
        let mtls = [("connection_security_policy", "mutual_tls")];
        let src = [("reporter", "source"), mtls[0]];
        let dst = [("reporter", "destination"), mtls[0]];
        println!(
            "  {} metrics: source opened {} closed {}, destination opened {} closed {}, pods proxied {}",
            node.name,
            metric_sum(&text, "istio_tcp_connections_opened_total", &src),
            metric_sum(&text, "istio_tcp_connections_closed_total", &src),
            metric_sum(&text, "istio_tcp_connections_opened_total", &dst),
            metric_sum(&text, "istio_tcp_connections_closed_total", &dst),
            text.lines()
                .find_map(|l| l.strip_prefix("workload_manager_active_proxy_count "))
                .unwrap_or("?"),
        );
    }
    if let Some(plane) = &cluster.control {
        println!();
        println!("{}", control_summary(plane)?);
    }
    println!();
    if keep {
        let client = &cluster.pod("client").ns;
        let server = cluster.pod("server");
        println!("The mesh keeps running. Try:");
        println!(
            "  ip netns exec {client} curl -v http://{}:{APP_PORT}/   # the app echoes twice",
            server.ip
        );
        println!(
            "  ip netns exec {client} iptables-save -t nat            # the in-pod capture rules"
        );
        println!("  ip netns exec {client} dig @10.88.1.1 echo         # answered by the DNS proxy in the pod");
        println!("  ip netns exec {} curl -s 127.0.0.1:15020/metrics | grep -e istio_tcp -e workload_manager", cluster.nodes[0].ns);
        println!(
            "  ip netns exec {} curl -s 127.0.0.1:15000/config_dump",
            cluster.nodes[1].ns
        );
        println!(
            "  ambit agent --events-socket {} list",
            cluster.nodes[0].events_socket().display()
        );
        let reviews = format!("http://{REVIEWS_VIP}{}", "/reviews/1");
        println!("  ip netns exec {client} curl -s {reviews}             # through the waypoint: allowed");
        println!(
            "  ip netns exec {client} curl -s -X DELETE {reviews}   # refused by its policy: 403"
        );
        println!(
            "  ip netns exec {client} curl -s -H 'x-version: v2' {reviews}   # the header route: always v2 (server)"
        );
        println!(
            "  ip netns exec {} curl -s 127.0.0.1:{}/stats/prometheus | grep 'reporter=\"waypoint\"'",
            cluster.nodes[waypoint.node].ns,
            ambit_netns_lab::l7::WAYPOINT_STATS
        );
        if let Some(plane) = &cluster.control {
            println!(
                "  edit {}   # the waypoint's policy, served by ambit control",
                plane.mesh_dir.join(REVIEWS_POLICY_FILE).display()
            );
            println!(
                "  edit {}   # the route (weights, matches), applied live",
                plane
                    .mesh_dir
                    .join(crate::waypoint::REVIEWS_ROUTE_FILE)
                    .display()
            );
            println!(
                "  ip netns exec {} curl -s {}/debug   # what ambit control sent each node proxy",
                plane.ns,
                ambit_netns_lab::control::CONTROL_ADMIN
            );
            println!(
                "  edit {}/mesh.yaml                     # pushed to the node proxies as a delta",
                plane.mesh_dir.display()
            );
        }
        println!("  logs: {}", cluster.lab.dir.path().display());
        println!("Press Ctrl-C to remove everything.");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    println!("removing the demo's namespaces");
    Ok(())
}
