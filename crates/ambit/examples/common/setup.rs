//! The two paths every driver measures, set up beside each other in a lab: the direct path
//! (the same namespaces, links and bridges, with ports exempted from capture) and the path
//! through the node proxies, with the apps (echo, iperf3) on both.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::time::Duration;

use ambit_netns_lab::cluster::{Cluster, PodSpec};
use ambit_netns_lab::mesh::{metric_sum, serve_echo, EchoMode, TwoNodes, APP_PORT, SERVER_IP};
use ambit_netns_lab::{wait_until, Lab};
use anyhow::{bail, Context};

use super::Target;

/// The echo app through the mesh is `APP_PORT` (8080); the same app, direct, listens here.
pub const DIRECT_ECHO_PORT: u16 = 9080;
/// iperf3 servers: captured (through the proxies) and exempted (direct).
pub const MESH_IPERF_PORT: u16 = 5201;
pub const DIRECT_IPERF_PORT: u16 = 5202;

/// Dedicated mode: the direct ports exempted from the client node's capture rule (a RETURN
/// above it), the echo app and iperf3 on both ports in the server node, `tcp_tw_reuse=1` in
/// both nodes, and both paths checked with a few round trips (which warms the HBONE pool).
pub fn dedicated_paths(nodes: &TwoNodes) -> anyhow::Result<Target<'_>> {
    for port in [DIRECT_ECHO_PORT, DIRECT_IPERF_PORT] {
        let p = port.to_string();
        nodes.lab.exec(
            &nodes.client_ns,
            &[
                "iptables", "-w", "-t", "nat", "-I", "OUTPUT", "-p", "tcp", "--dport", &p, "-j",
                "RETURN",
            ],
        )?;
    }
    // Many short connections leave TIME_WAIT behind at the side that closes first (the
    // client, and the server node proxy towards the app). Let connect() reuse those ports
    // after 1 s (the default only does so on loopback) so neither path runs out of ports.
    for ns in [&nodes.client_ns, &nodes.server_ns] {
        nodes
            .lab
            .exec(ns, &["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])?;
    }
    drop(nodes.start_app_server(EchoMode::Mirror)?);
    let direct_listener = Lab::in_netns(&nodes.server_ns, || {
        TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, DIRECT_ECHO_PORT))
    })?;
    drop(serve_echo(direct_listener, EchoMode::Mirror));
    super::start_iperf_server(&nodes.lab, &nodes.server_ns, MESH_IPERF_PORT)?;
    super::start_iperf_server(&nodes.lab, &nodes.server_ns, DIRECT_IPERF_PORT)?;
    let target = Target {
        client_ns: &nodes.client_ns,
        server_ip: SERVER_IP,
        mesh_echo_port: APP_PORT,
        direct_echo_port: DIRECT_ECHO_PORT,
        mesh_iperf_port: MESH_IPERF_PORT,
        direct_iperf_port: DIRECT_IPERF_PORT,
    };
    // The direct path must leave both node proxies' connection counts unchanged, and the
    // proxied one must move them, or the figures would compare the wrong paths.
    let opened = || -> anyhow::Result<u64> {
        let mut n = 0;
        for ns in [&nodes.client_ns, &nodes.server_ns] {
            n += metric_sum(
                &nodes.metrics(ns)?,
                "istio_tcp_connections_opened_total",
                &[],
            );
        }
        Ok(n)
    };
    let before = opened()?;
    super::round_trips(target.client_ns, target.direct_echo(), 64, 100)
        .with_context(|| format!("direct echo to {}", target.direct_echo()))?;
    std::thread::sleep(Duration::from_millis(300));
    if opened()? != before {
        bail!(
            "the direct path to {} went through a node proxy",
            target.direct_echo()
        );
    }
    super::round_trips(target.client_ns, target.mesh_echo(), 64, 100)
        .with_context(|| format!("echo through {}", target.mesh_echo()))?;
    wait_until(
        "the proxied connection to be counted",
        Duration::from_secs(5),
        || opened().is_ok_and(|n| n > before),
    )
    .with_context(|| {
        format!(
            "the proxied path to {} bypassed the node proxies",
            target.mesh_echo()
        )
    })?;
    Ok(target)
}

/// Connections the node proxies have opened (every node, every label).
pub fn opened(cluster: &Cluster) -> anyhow::Result<u64> {
    let mut n = 0;
    for node in 0..cluster.nodes.len() {
        n += metric_sum(
            &cluster.metrics(node)?,
            "istio_tcp_connections_opened_total",
            &[],
        );
    }
    Ok(n)
}

/// In-pod mode: the direct ports exempted from the in-pod capture (ACCEPT in the nat hooks,
/// above the jumps to ISTIO_*) outbound in `client` and inbound in each of `servers`, the
/// echo app and iperf3 on both ports in each server, and both paths checked: the direct one
/// must bypass the node proxies, the proxied one must go through them.
pub fn inpod_paths(cluster: &Cluster, client: &str, servers: &[&str]) -> anyhow::Result<()> {
    exempt_direct_ports(cluster, client, servers)?;
    let client_ns = cluster.pod(client).ns.clone();
    for pod in servers {
        drop(cluster.serve_app(pod, APP_PORT, EchoMode::Mirror)?);
        drop(cluster.serve_app(pod, DIRECT_ECHO_PORT, EchoMode::Mirror)?);
        let ns = cluster.pod(pod).ns.clone();
        super::start_iperf_server(&cluster.lab, &ns, MESH_IPERF_PORT)?;
        super::start_iperf_server(&cluster.lab, &ns, DIRECT_IPERF_PORT)?;
    }
    for pod in servers {
        let ip = cluster.pod(pod).ip;
        check_direct_bypasses(
            cluster,
            &client_ns,
            SocketAddr::from((ip, DIRECT_ECHO_PORT)),
        )?;
        let before = opened(cluster)?;
        super::round_trips(&client_ns, SocketAddr::from((ip, APP_PORT)), 64, 100)
            .with_context(|| format!("echo to {ip} through the proxies"))?;
        wait_until(
            "the proxied connection to be counted",
            Duration::from_secs(5),
            || opened(cluster).is_ok_and(|n| n > before),
        )
        .with_context(|| format!("the proxied path to {ip} bypassed the node proxies"))?;
    }
    Ok(())
}

/// The direct ports exempted from the in-pod capture outbound in `client` and inbound in
/// each of `servers`.
fn exempt_direct_ports(cluster: &Cluster, client: &str, servers: &[&str]) -> anyhow::Result<()> {
    let client_ns = cluster.pod(client).ns.clone();
    for port in [DIRECT_ECHO_PORT, DIRECT_IPERF_PORT] {
        let p = port.to_string();
        let exempt = |ns: &str, hook: &str| {
            cluster.lab.exec(
                ns,
                &[
                    "iptables", "-w", "-t", "nat", "-I", hook, "1", "-p", "tcp", "--dport", &p,
                    "-j", "ACCEPT",
                ],
            )
        };
        exempt(&client_ns, "OUTPUT")?;
        for pod in servers {
            exempt(&cluster.pod(pod).ns, "PREROUTING")?;
        }
    }
    Ok(())
}

/// Fails unless round trips from `client_ns` to `direct` leave every node proxy's
/// connection count unchanged.
fn check_direct_bypasses(
    cluster: &Cluster,
    client_ns: &str,
    direct: SocketAddr,
) -> anyhow::Result<()> {
    let before = opened(cluster)?;
    super::round_trips(client_ns, direct, 64, 100)
        .with_context(|| format!("direct echo to {direct}"))?;
    std::thread::sleep(Duration::from_millis(300));
    if opened(cluster)? != before {
        bail!("the direct path to {direct} went through a node proxy");
    }
    Ok(())
}

/// The direct echo between exactly `client` and `server` (its port exempted from capture
/// on both, checked to bypass the node proxies): the baseline of a figure measured
/// between those two pods.
pub fn direct_echo_between(
    cluster: &Cluster,
    client: &str,
    server: &str,
) -> anyhow::Result<SocketAddr> {
    exempt_direct_ports(cluster, client, &[server])?;
    drop(cluster.serve_app(server, DIRECT_ECHO_PORT, EchoMode::Mirror)?);
    let direct = SocketAddr::from((cluster.pod(server).ip, DIRECT_ECHO_PORT));
    check_direct_bypasses(cluster, &cluster.pod(client).ns, direct)?;
    Ok(direct)
}

/// In-pod targets: from `client` to `server` (the same ports as [`inpod_paths`]).
pub fn inpod_target<'a>(cluster: &'a Cluster, client: &str, server: &str) -> Target<'a> {
    Target {
        client_ns: &cluster.pod(client).ns,
        server_ip: cluster.pod(server).ip,
        mesh_echo_port: APP_PORT,
        direct_echo_port: DIRECT_ECHO_PORT,
        mesh_iperf_port: MESH_IPERF_PORT,
        direct_iperf_port: DIRECT_IPERF_PORT,
    }
}

/// `workload_manager_active_proxy_count` of a node's proxy.
pub fn active_proxies(cluster: &Cluster, node: usize) -> Option<u64> {
    cluster.metrics(node).ok()?.lines().find_map(|l| {
        l.strip_prefix("workload_manager_active_proxy_count ")?
            .trim()
            .parse::<f64>()
            .ok()
            .map(|v| v as u64)
    })
}

/// How long a new pod may take to serve its first byte before the run fails.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);

/// One connect + 1-byte exchange from `ns` to `dst`, repeated every 1 ms until it succeeds;
/// returns the number of attempts. Gives up `FIRST_BYTE_TIMEOUT` after `t0`.
pub fn first_byte(ns: &str, dst: SocketAddr, t0: std::time::Instant) -> anyhow::Result<usize> {
    Lab::in_netns(ns, move || {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let r = (|| -> std::io::Result<()> {
                let mut s = std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(1))?;
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(Duration::from_secs(1)))?;
                std::io::Write::write_all(&mut s, b"x")?;
                let mut b = [0u8; 1];
                std::io::Read::read_exact(&mut s, &mut b)?;
                Ok(())
            })();
            match r {
                Ok(()) => return Ok(attempts),
                Err(e) if t0.elapsed() > FIRST_BYTE_TIMEOUT => {
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("no byte from {dst} within {FIRST_BYTE_TIMEOUT:?} ({attempts} attempts), last error: {e}"),
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    })
}

/// The in-pod drivers' pods.
pub const CLIENT: &str = "client";
/// The server on the client's node.
pub const LOCAL: &str = "local";
/// The server on the other node.
pub const REMOTE: &str = "remote";
/// The soak's server on the other node, and its client on the client's node: pods of their
/// own, so the TIME_WAIT sockets in them are the soak's alone.
pub const SOAK: &str = "soak";
pub const SOAK_CLIENT: &str = "soak-client";

/// Every pod of an in-pod run, in the order they must be created (host-local hands out
/// addresses in order per node): the five that run from the start, then `idle` idle pods
/// on node1, then `enroll` pods on node2 for the enrollment phase.
pub struct InpodPods {
    pub specs: Vec<PodSpec>,
    pub idle: Vec<PodSpec>,
    pub enroll: Vec<PodSpec>,
    /// How many of `specs` run from the start, and how many of those are on node1.
    pub running: usize,
    pub running_node1: usize,
}

pub fn inpod_pods(idle: usize, enroll: usize) -> InpodPods {
    let idle: Vec<PodSpec> = (0..idle)
        .map(|i| PodSpec::new(&format!("idle-{i:03}"), 0))
        .collect();
    let enroll: Vec<PodSpec> = (0..enroll)
        .map(|i| PodSpec::new(&format!("enroll-{i:02}"), 1))
        .collect();
    let mut specs = vec![
        PodSpec::new(CLIENT, 0),
        PodSpec::new(LOCAL, 0),
        PodSpec::new(REMOTE, 1),
        PodSpec::new(SOAK, 1),
        PodSpec::new(SOAK_CLIENT, 0),
    ];
    let running = specs.len();
    let running_node1 = specs.iter().filter(|p| p.node == 0).count();
    specs.extend(idle.iter().cloned());
    specs.extend(enroll.iter().cloned());
    InpodPods {
        specs,
        idle,
        enroll,
        running,
        running_node1,
    }
}
