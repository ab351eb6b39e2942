//! In-pod mode end to end, as root: nodes with the node agent and a node proxy in shared
//! mode, pods created through a real CNI chain (bridge + host-local + ambit-cni).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ambit_netns_lab::cluster::{Cluster, PodSpec};
use ambit_netns_lab::mesh::{metric_sum, EchoMode};
use ambit_netns_lab::wait_until;

const APP_PORT: u16 = 8080;

fn ambit() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ambit"))
}

fn exchange(
    cluster: &Cluster,
    from: &str,
    dst: SocketAddr,
    payload: &[u8],
) -> std::io::Result<Vec<u8>> {
    let mut conn = cluster
        .connect_from(from, dst)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    conn.write_all(payload)?;
    conn.shutdown(Shutdown::Write)?;
    let mut back = Vec::new();
    conn.read_to_end(&mut back)?;
    Ok(back)
}

fn app_addr(cluster: &Cluster, pod: &str) -> SocketAddr {
    SocketAddr::from((cluster.pod(pod).ip, APP_PORT))
}

#[test]
fn pods_reach_each_other_on_one_node_and_across_nodes_only_in_hbone() {
    let cluster = Cluster::start(
        ambit(),
        "inpod-wire",
        2,
        &[
            PodSpec::new("a", 0),
            PodSpec::new("b", 0),
            PodSpec::new("c", 1),
        ],
    )
    .unwrap();
    let seen_by_b = cluster.serve_app("b", APP_PORT, EchoMode::Double).unwrap();
    let seen_by_c = cluster.serve_app("c", APP_PORT, EchoMode::Double).unwrap();
    let bridge = cluster.lab.capture(&cluster.nodes[0].ns, "cni0").unwrap();

    for (target, seen) in [("b", &seen_by_b), ("c", &seen_by_c)] {
        let back = exchange(&cluster, "a", app_addr(&cluster, target), b"hello world").unwrap();
        assert_eq!(back, b"hello worldhello world", "a -> {target}");
        // The app sees the real client pod IP, not the proxy's.
        let peer = seen.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(peer.ip(), cluster.pod("a").ip, "source seen by {target}");
    }

    let wire = bridge.finish(&cluster.lab).unwrap();
    assert!(!wire.tcp.is_empty());
    assert_eq!(
        wire.tcp_ports().into_iter().collect::<Vec<_>>(),
        vec![15008]
    );
    assert!(
        !wire.payload_contains(b"hello world"),
        "plaintext crossed the bridge"
    );

    let labels = [
        ("reporter", "source"),
        ("source_principal", "spiffe://cluster.local/ns/default/sa/a"),
        ("connection_security_policy", "mutual_tls"),
    ];
    wait_until(
        "both connections to be counted",
        Duration::from_secs(5),
        || {
            let text = cluster.metrics(0).unwrap();
            metric_sum(&text, "istio_tcp_connections_closed_total", &labels) == 2
        },
    )
    .unwrap();
    let text = cluster.metrics(0).unwrap();
    assert_eq!(
        metric_sum(&text, "istio_tcp_received_bytes_total", &labels),
        22
    );
    assert_eq!(metric_sum(&text, "istio_tcp_sent_bytes_total", &labels), 44);
    assert!(
        text.contains("workload_manager_active_proxy_count 2"),
        "{text}"
    );
}

#[test]
fn enrolled_pod_fails_closed_without_its_node_proxy_and_recovers_without_reenrolling() {
    let mut cluster = Cluster::start(
        ambit(),
        "inpod-closed",
        2,
        &[PodSpec::new("a", 0), PodSpec::new("c", 1)],
    )
    .unwrap();
    let _seen_by_c = cluster.serve_app("c", APP_PORT, EchoMode::Mirror).unwrap();
    let _seen_by_a = cluster.serve_app("a", APP_PORT, EchoMode::Mirror).unwrap();
    assert_eq!(
        exchange(&cluster, "a", app_addr(&cluster, "c"), b"ok").unwrap(),
        b"ok"
    );

    cluster.kill_ztunnel(1).unwrap();
    // Inbound to c over HBONE: nothing serves c's 15008 any more.
    let inbound = exchange(&cluster, "a", app_addr(&cluster, "c"), b"secret");
    assert!(
        !matches!(&inbound, Ok(b) if !b.is_empty()),
        "inbound reached c without its proxy: {inbound:?}"
    );
    // Plain TCP from outside the mesh is redirected to c's 15006: refused, never bypassed.
    let plain = cluster
        .connect_from_node(0, app_addr(&cluster, "c"))
        .and_then(|mut s| {
            s.write_all(b"secret")?;
            let mut b = [0u8; 6];
            s.read_exact(&mut b)?;
            Ok(b)
        });
    assert!(plain.is_err(), "plaintext reached c without its proxy");
    // Outbound from c is redirected to its 15001: refused.
    let outbound = exchange(&cluster, "c", app_addr(&cluster, "a"), b"secret");
    assert!(
        !matches!(&outbound, Ok(b) if !b.is_empty()),
        "c went out without its proxy: {outbound:?}"
    );

    cluster.start_ztunnel(1).unwrap();
    assert_eq!(
        exchange(&cluster, "a", app_addr(&cluster, "c"), b"back").unwrap(),
        b"back"
    );
    assert_eq!(
        exchange(&cluster, "c", app_addr(&cluster, "a"), b"again").unwrap(),
        b"again"
    );
}

#[test]
fn agent_restart_keeps_rules_and_traffic_and_the_proxy_reconciles() {
    let mut cluster = Cluster::start(
        ambit(),
        "inpod-restart",
        1,
        &[PodSpec::new("a", 0), PodSpec::new("b", 0)],
    )
    .unwrap();
    let _seen = cluster.serve_app("b", APP_PORT, EchoMode::Mirror).unwrap();
    let before = cluster.iptables_save("a").unwrap();
    assert!(before.contains("-j REDIRECT --to-ports 15001"), "{before}");
    let host_before = cluster
        .node_exec(0, &["iptables-save", "-t", "nat"])
        .unwrap();

    cluster.stop_agent(0).unwrap();
    cluster.start_agent(0).unwrap();
    // The proxy reconnects and receives the replayed snapshot.
    cluster.wait_ztunnel_ready(0).unwrap();

    assert_eq!(
        cluster.iptables_save("a").unwrap(),
        before,
        "pod rules changed across the restart"
    );
    let host_after = cluster
        .node_exec(0, &["iptables-save", "-t", "nat"])
        .unwrap();
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with(':'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        strip(&host_after),
        strip(&host_before),
        "host rules changed across the restart"
    );
    assert_eq!(
        exchange(&cluster, "a", app_addr(&cluster, "b"), b"still here").unwrap(),
        b"still here"
    );
    let text = cluster.metrics(0).unwrap();
    // Same pods, same namespaces: the replayed Adds did not restart any pod proxy.
    assert!(
        text.contains("workload_manager_proxies_started_total 2"),
        "{text}"
    );
    assert!(
        text.contains("workload_manager_active_proxy_count 2"),
        "{text}"
    );
}

#[test]
fn cni_del_removes_rules_probe_entry_and_listeners() {
    let cluster = Cluster::start(
        ambit(),
        "inpod-del",
        1,
        &[PodSpec::new("a", 0), PodSpec::new("b", 0)],
    )
    .unwrap();
    let b_ip = cluster.pod("b").ip.to_string();
    let listeners = |pod: &str| {
        cluster
            .lab
            .exec(&cluster.pod(pod).ns, &["ss", "-ltnH"])
            .unwrap()
    };
    assert!(listeners("b").contains(":15008"));
    assert!(cluster
        .node_exec(0, &["ipset", "list", "istio-inpod-probes-v4"])
        .unwrap()
        .contains(&b_ip));

    let b = cluster.pods.iter().position(|p| p.name == "b").unwrap();
    cluster.del_pod(b).unwrap();

    assert!(
        !cluster.iptables_save("b").unwrap().contains("ISTIO_"),
        "rules left in b"
    );
    assert!(!cluster
        .node_exec(0, &["ipset", "list", "istio-inpod-probes-v4"])
        .unwrap()
        .contains(&b_ip));
    wait_until("b's listeners to close", Duration::from_secs(5), || {
        !listeners("b").contains(":150")
    })
    .unwrap();
    assert!(listeners("a").contains(":15008"), "a lost its listeners");
    let text = cluster.metrics(0).unwrap();
    assert!(
        text.contains("workload_manager_active_proxy_count 1"),
        "{text}"
    );
    assert!(
        text.contains("workload_manager_proxies_stopped_total 1"),
        "{text}"
    );
    // DEL again (the runtime retries): still fine.
    cluster.del_pod(b).unwrap();
}

#[test]
fn host_probe_reaches_the_pod_from_the_probe_address() {
    let cluster = Cluster::start(ambit(), "inpod-probe", 1, &[PodSpec::new("a", 0)]).unwrap();
    let seen = cluster.serve_app("a", APP_PORT, EchoMode::Mirror).unwrap();
    let mut probe = cluster
        .connect_from_node(0, app_addr(&cluster, "a"))
        .unwrap();
    probe.write_all(b"healthz").unwrap();
    let mut back = [0u8; 7];
    probe.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"healthz");
    let peer = seen.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(
        peer.ip(),
        std::net::IpAddr::V4(Ipv4Addr::new(169, 254, 7, 127))
    );
}

#[test]
fn plaintext_from_outside_the_mesh_is_authorized_without_identity() {
    // Deny anything from node2's own address; mesh pods are not affected.
    let policy = r#"policies:
- name: no-node2-host
  namespace: default
  scope: Namespace
  action: Deny
  rules: [[[ {sourceIps: ["10.78.0.2/32"]} ]]]
"#;
    let cluster = Cluster::start_with(
        ambit(),
        "inpod-plain",
        2,
        &[PodSpec::new("a", 0), PodSpec::new("c", 1)],
        policy,
    )
    .unwrap();
    let seen = cluster.serve_app("a", APP_PORT, EchoMode::Mirror).unwrap();
    // From node2's host to pod a on node1: plaintext from outside the mesh (not a probe:
    // only node1's own host traffic is SNATed), captured on a's 15006 and denied.
    let denied = cluster
        .connect_from_node(1, app_addr(&cluster, "a"))
        .and_then(|mut s| {
            s.write_all(b"plain")?;
            s.shutdown(Shutdown::Write)?;
            let mut back = Vec::new();
            let _ = s.read_to_end(&mut back);
            Ok(back)
        });
    assert!(
        matches!(&denied, Ok(b) if b.is_empty()) || denied.is_err(),
        "{denied:?}"
    );
    assert!(seen.try_recv().is_err(), "the app saw denied plaintext");
    let labels = [("reporter", "destination"), ("response_flags", "DENY")];
    wait_until("the denial to be counted", Duration::from_secs(5), || {
        let text = cluster.metrics(0).unwrap();
        metric_sum(&text, "istio_tcp_connections_failed_total", &labels) == 1
    })
    .unwrap();
    // The mesh pod on node2 still gets through (its source is its pod IP, over HBONE).
    assert_eq!(
        exchange(&cluster, "c", app_addr(&cluster, "a"), b"mesh").unwrap(),
        b"mesh"
    );
    assert_eq!(
        seen.recv_timeout(Duration::from_secs(5)).unwrap().ip(),
        cluster.pod("c").ip
    );
}
