//! `ambit demo`: a two-node mesh in network namespaces on this machine, real traffic
//! through two node proxies over HBONE, and a short report of what crossed the wire.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};

use ambit_lab::control::ControlPlane;
use ambit_lab::mesh::{
    metric_sum, EchoMode, TwoNodes, TwoNodesSpec, APP_PORT, CLIENT_IP, SERVER_IP, SERVICE_PORT,
    SERVICE_VIP,
};
use ambit_lab::peer::NodeProxy;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Leave the mesh running and print commands to try by hand; Ctrl-C removes it.
    #[arg(long)]
    pub keep: bool,
    /// Run the node proxies in dedicated mode (one workload per node, no agent) instead of
    /// in-pod mode.
    #[arg(long)]
    pub dedicated: bool,
    /// Extra environment for both node proxies, e.g. `RUST_LOG=debug` (repeatable;
    /// dedicated mode).
    #[arg(long = "proxy-env", value_name = "KEY=VALUE", requires = "dedicated", value_parser = ambit_lab::parse_env_pair)]
    pub proxy_env: Vec<(String, String)>,
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.dedicated {
        run_dedicated(args)
    } else {
        crate::demo_inpod::run(args.keep)
    }
}

/// Removes the lab's namespaces and processes on Ctrl-C or SIGTERM, then exits.
pub fn remove_on_signal(cleanup: ambit_lab::Cleanup) {
    remove_all_on_signal(vec![cleanup]);
}

/// [`remove_on_signal`] for several labs. One process-wide handler removes every lab ever
/// registered, so a program that builds labs in phases cleans up all of them, whichever
/// phase the signal finds it in.
pub fn remove_all_on_signal(cleanups: Vec<ambit_lab::Cleanup>) {
    use std::sync::{Mutex, OnceLock};
    static REGISTERED: OnceLock<Mutex<Vec<ambit_lab::Cleanup>>> = OnceLock::new();
    let mut first = false;
    let registered = REGISTERED.get_or_init(|| {
        first = true;
        Mutex::new(Vec::new())
    });
    registered
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(cleanups);
    if !first {
        return;
    }
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = runtime {
            rt.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let (Ok(mut int), Ok(mut term)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) else {
                    return;
                };
                tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
            });
            eprintln!("\ninterrupted: removing the lab's namespaces");
            for cleanup in registered.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                cleanup.run();
            }
            std::process::exit(130);
        }
    });
}

/// Two lines on the control plane: where it runs and what its clients acknowledged.
pub fn control_summary(plane: &ControlPlane) -> anyhow::Result<String> {
    let metrics = plane.metrics()?;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Ok(format!(
        "  control plane: ambit control at {} (delta xDS + CA; no node holds the CA key)\n  control metrics: clients {} pushes {} acks {} nacks {} certificates signed {}",
        plane.listen,
        value("ambit_control_xds_clients"),
        value("ambit_control_xds_pushes_total"),
        value("ambit_control_xds_acks_total"),
        value("ambit_control_xds_nacks_total"),
        value("ambit_control_csr_signed_total"),
    ))
}

fn run_dedicated(args: DemoArgs) -> anyhow::Result<()> {
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
    remove_on_signal(nodes.lab.cleanup_handle());
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
        let mut conn = nodes.connect_from_client(dst)?;
        conn.write_all(&secret)?;
        conn.shutdown(std::net::Shutdown::Write)?;
        let mut back = Vec::new();
        conn.read_to_end(&mut back)?;
        if back.len() != secret.len() * 2 {
            bail!(
                "{what}: expected {} bytes back, got {}",
                secret.len() * 2,
                back.len()
            );
        }
        let peer = accepted
            .recv_timeout(Duration::from_secs(5))
            .context("the server app saw no connection")?;
        rows.push((
            what,
            dst,
            secret.len(),
            back.len(),
            ambit_nodeproxy::socket::canonical(peer),
        ));
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
