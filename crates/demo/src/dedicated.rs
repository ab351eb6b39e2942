//! The dedicated-mode demo: two nodes, one workload each, a node proxy per node configured
//! by `ambit control`, a pod IP and a service VIP dialled through them.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;

use ambit_netns_lab::mesh::{
    metric_sum, EchoMode, TwoNodes, TwoNodesSpec, APP_PORT, CLIENT_IP, SERVER_IP, SERVICE_PORT,
    SERVICE_VIP,
};
use ambit_netns_lab::peer::NodeProxy;

use crate::report::{control_summary, doubled_echo};
use crate::DemoArgs;

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    let ambit = std::env::current_exe().context("locating the ambit binary")?;
    println!("building two nodes in network namespaces (dedicated mode)...");
    let extra_env: Vec<(&str, String)> = args
        .proxy_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let nodes = TwoNodes::launch(TwoNodesSpec {
        env: &extra_env,
        // Config over delta xDS and certificates from its CA: no node holds the CA key.
        control: Some(ambit.clone()),
        ..TwoNodesSpec::pair("demo", &NodeProxy::Ambit(ambit.clone()))
    })?;
    ambit_netns_lab::remove_on_signal(nodes.lab.cleanup_handle());
    let accepted = nodes.start_app_server(EchoMode::Double)?;
    let capture = nodes.capture_link().ok();
    if capture.is_none() {
        println!("(tcpdump not found: the wire will not be inspected; apt-get install tcpdump)");
    }

    let secret = b"the quick brown fox: plaintext that must never cross the link".to_vec();
    let mut rows = Vec::new();
    for (what, dst) in [
        ("pod IP", SocketAddr::from((SERVER_IP, APP_PORT))),
        ("service VIP", SocketAddr::from((SERVICE_VIP, SERVICE_PORT))),
    ] {
        let conn = nodes.connect_from_client(dst)?;
        let (received, peer) = doubled_echo(what, conn, &secret, &accepted)?;
        rows.push((what, dst, secret.len(), received, peer));
    }

    let wire = match capture {
        Some(c) => {
            let cap = c.finish(&nodes.lab)?;
            let ports: Vec<String> = cap.tcp_ports().iter().map(u16::to_string).collect();
            let clear = cap.payload_contains(&secret[..20]);
            Some((cap.tcp.len(), ports.join(","), clear))
        }
        None => None,
    };
    let client_metrics = nodes.metrics(&nodes.client_ns)?;
    let server_metrics = nodes.metrics(&nodes.server_ns)?;

    println!();
    println!("  client: spiffe://cluster.local/ns/default/sa/client  at {CLIENT_IP} (node1)");
    println!("  server: spiffe://cluster.local/ns/default/sa/server  at {SERVER_IP} (node2)");
    println!();
    println!(
        "  {:<12} {:<18} {:>6} {:>9}  server app saw",
        "dialed", "address", "sent", "received"
    );
    for (what, dst, sent, recv, peer) in &rows {
        println!("  {what:<12} {dst:<18} {sent:>6} {recv:>9}  {peer}");
    }
    println!();
    match wire {
        Some((segments, ports, clear)) => println!(
            "  wire (node1 eth0): {segments} TCP segments, ports seen: {ports}; plaintext seen: {}",
            if clear { "YES (bad!)" } else { "no, only TLS" }
        ),
        None => println!("  wire: not inspected"),
    }
    for (side, text, reporter) in [
        ("node1", &client_metrics, "source"),
        ("node2", &server_metrics, "destination"),
    ] {
        let labels = [
            ("reporter", reporter),
            ("connection_security_policy", "mutual_tls"),
        ];
        println!(
            "  {side} metrics (reporter={reporter}): opened {} closed {} received_bytes {} sent_bytes {}",
            metric_sum(text, "istio_tcp_connections_opened_total", &labels),
            metric_sum(text, "istio_tcp_connections_closed_total", &labels),
            metric_sum(text, "istio_tcp_received_bytes_total", &labels),
            metric_sum(text, "istio_tcp_sent_bytes_total", &labels),
        );
    }
    if let Some(plane) = &nodes.control {
        println!("{}", control_summary(plane)?);
    }
    println!();

    if args.keep {
        println!("The mesh keeps running. Try:");
        println!(
            "  ip netns exec {} curl -v http://{SERVER_IP}:{APP_PORT}/   # the app echoes twice",
            nodes.client_ns
        );
        println!(
            "  ip netns exec {} curl -s 127.0.0.1:15020/metrics | grep istio_tcp",
            nodes.client_ns
        );
        println!(
            "  ip netns exec {} curl -s 127.0.0.1:15000/config_dump",
            nodes.server_ns
        );
        println!("  logs: {}", nodes.lab.dir.path().display());
        println!("Press Ctrl-C to remove everything.");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    println!("removing the demo's namespaces");
    Ok(())
}
