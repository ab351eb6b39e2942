//! End-to-end benchmark driver: two lab "nodes" (network namespaces joined by a veth pair),
//! a release-build node proxy in dedicated mode in each, and the same workloads measured in
//! ONE run both through the two proxies (HBONE over the veth) and directly over the same
//! veth between the same namespaces (a destination port exempted from the capture rule).
//!
//! ```text
//! bench_e2e --ambit target/release/ambit --out bench-results.md [--seconds 5] [--round-trips 5000]
//! ```
//!
//! Usually started by `scripts/bench` (which builds everything in release mode first).
//! Needs root (network namespaces, iptables) and iperf3. Everything it creates is removed
//! when it ends (the lab removes its namespaces and kills its processes on drop).
//!
//! Figures (see BENCHMARKS.md):
//! - throughput with iperf3, 1 and 4 parallel streams, client node → server node;
//! - request/response latency of 64 B and 1 KiB exchanges on one reused connection;
//! - new-connection rate, one 64 B exchange per connection, at concurrency 1 and 8;
//! - CPU seconds of each node proxy per phase, idle RSS right after start, peak RSS;
//! - the ceiling of the path for any two-hop user-space proxy: one iperf3 stream through two
//!   plain TCP relays (socat: read/write, no TLS, no HTTP/2) where the node proxies sit.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::path::PathBuf;

use ambit::lab::mesh::{serve_echo, EchoMode, TwoNodes, APP_PORT, SERVER_IP};
use ambit::lab::Lab;
use anyhow::{bail, Context};
use common::{mib, yes, Columns, Proxies, Report, Target};

/// The echo app through the mesh is `APP_PORT` (8080); the same app, direct, listens here.
const DIRECT_ECHO_PORT: u16 = 9080;
/// iperf3 servers: captured (through the proxies) and exempted (direct).
const MESH_IPERF_PORT: u16 = 5201;
const DIRECT_IPERF_PORT: u16 = 5202;
/// The relay ceiling: the client dials this port, redirected to the client node's relay...
const RELAY_DIAL_PORT: u16 = 5301;
const CLIENT_RELAY_PORT: u16 = 16001;
/// ...which connects (uncaptured) to the server node's relay, which connects to iperf3.
const SERVER_RELAY_PORT: u16 = 16008;
/// socat's buffer: as large as the node proxy's largest reads.
const RELAY_BUFFER: &str = "262144";

struct Args {
    ambit: PathBuf,
    out: PathBuf,
    seconds: u64,
    round_trips: usize,
    /// Extra environment for both node proxies (`--proxy-env K=V`, repeatable).
    proxy_env: Vec<(String, String)>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut ambit = None;
    let mut out = None;
    let mut seconds = 5;
    let mut round_trips = 5000;
    let mut proxy_env = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--ambit" => ambit = Some(PathBuf::from(val()?)),
            "--out" => out = Some(PathBuf::from(val()?)),
            "--seconds" => seconds = val()?.parse().context("--seconds")?,
            "--round-trips" => round_trips = val()?.parse().context("--round-trips")?,
            "--proxy-env" => {
                proxy_env.push(ambit::lab::parse_env_pair(&val()?).map_err(anyhow::Error::msg)?);
            }
            "-h" | "--help" => {
                println!(
                    "usage: bench_e2e --ambit PATH --out FILE [--seconds N (5)] [--round-trips N (5000)] [--proxy-env KEY=VALUE]..."
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (see --help)"),
        }
    }
    let seconds = seconds.clamp(1, 60);
    let round_trips = round_trips.clamp(100, 1_000_000);
    Ok(Args {
        ambit: ambit.context("--ambit PATH (the release build of ambit) is required")?,
        out: out.context("--out FILE is required")?,
        seconds,
        round_trips,
        proxy_env,
    })
}

// ---------------------------------------------------------------------------------------

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let ambit = std::fs::canonicalize(&args.ambit)
        .with_context(|| format!("no ambit binary at {}", args.ambit.display()))?;
    ambit::lab::require_tool("iperf3", "iperf3")?;
    ambit::lab::require_tool("socat", "socat")?;
    ambit::lab::require_tool("ss", "iproute2")?;
    let machine = common::machine();
    println!("machine: {machine}");
    println!("node proxy: {}", ambit.display());

    let extra_env: Vec<(&str, String)> = args
        .proxy_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    for (k, v) in &extra_env {
        println!("node proxy environment: {k}={v}");
    }
    let nodes =
        TwoNodes::start(&ambit, "bench", &extra_env).context("starting the two-node lab")?;
    // Ctrl-C or SIGTERM: remove the namespaces and processes, then exit.
    ambit::demo::remove_on_signal(nodes.lab.cleanup_handle());

    let proxies = Proxies {
        client: nodes.client_proxy.pid,
        server: nodes.server_proxy.pid,
    };
    for pid in [proxies.client, proxies.server] {
        common::check_is_ambit(pid)?;
    }
    let idle = proxies.status_kib("VmRSS")?;
    let idle_anon = proxies.status_kib("RssAnon")?;
    let idle_file = proxies.status_kib("RssFile")?;
    println!(
        "idle RSS: client node proxy {} KiB, server node proxy {} KiB",
        idle.0, idle.1
    );

    // The direct path: the same veth between the same namespaces, with the destination
    // ports exempted from the capture rule (inserted above it).
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

    let _mesh_app = nodes.start_app_server(EchoMode::Mirror)?;
    let direct_listener = Lab::in_netns(&nodes.server_ns, || {
        TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, DIRECT_ECHO_PORT))
    })?;
    let _direct_app = serve_echo(direct_listener, EchoMode::Mirror);
    common::start_iperf_server(&nodes.lab, &nodes.server_ns, MESH_IPERF_PORT)?;
    common::start_iperf_server(&nodes.lab, &nodes.server_ns, DIRECT_IPERF_PORT)?;

    let target = Target {
        client_ns: &nodes.client_ns,
        server_ip: SERVER_IP,
        mesh_echo_port: APP_PORT,
        direct_echo_port: DIRECT_ECHO_PORT,
        mesh_iperf_port: MESH_IPERF_PORT,
        direct_iperf_port: DIRECT_IPERF_PORT,
    };
    // Warm the HBONE pool (and check both paths work) before measuring.
    for dst in [target.mesh_echo(), target.direct_echo()] {
        common::round_trips(&nodes.client_ns, dst, 64, 100)
            .with_context(|| format!("echo through {dst}"))?;
    }

    let mut report = Report::default();
    let secs = args.seconds;
    let summary = common::run_suite(&target, &proxies, secs, args.round_trips, &mut report)?;

    let (ceiling_direct, ceiling_relays) = relay_ceiling(&nodes, secs)?;
    let (single_d, single_m) = summary.single;
    report.notes.push(format!(
        "Ceiling of this path for two user-space proxies: one iperf3 stream through two plain TCP relays (socat, read/write with {RELAY_BUFFER}-byte buffers, no TLS, no HTTP/2) in place of the node proxies: {:.2} Gbit/s, {} of direct ({:.2} Gbit/s, measured right before it). The node proxies' single stream ({:.2} Gbit/s) is {} of the relays'.",
        ceiling_relays / 1e9,
        common::pct(ceiling_relays, ceiling_direct),
        ceiling_direct / 1e9,
        single_m / 1e9,
        common::pct(single_m, ceiling_relays),
    ));

    let peak = proxies.status_kib("VmHWM")?;
    let end = proxies.status_kib("VmRSS")?;
    for (what, v) in [
        ("RSS right after start (idle)", idle),
        ("  of which anonymous (heap, stacks)", idle_anon),
        ("  of which file-backed (binary, libraries)", idle_file),
        ("peak RSS (VmHWM)", peak),
        ("RSS at the end", end),
    ] {
        report.resources.push([what.into(), mib(v.0), mib(v.1)]);
    }

    // The targets of the issue.
    let ratio1 = single_m / single_d;
    report.targets.push([
        "single-stream throughput".into(),
        "≥ 45 % of direct".into(),
        format!("{:.0} %", 100.0 * ratio1),
        yes(ratio1 >= 0.45),
    ]);
    for (label, added) in &summary.rr_p50_added {
        report.targets.push([
            format!("added p50 latency, {label}, reused connection (2 hops)"),
            "< 80 µs".into(),
            format!("+{added:.0} µs"),
            yes(*added < 80.0),
        ]);
    }
    let ratio8 = summary.rate8.1.per_second / summary.rate8.0.per_second;
    report.targets.push([
        "new-connection rate, concurrency 8".into(),
        "≥ 25 % of direct".into(),
        format!("{:.0} %", 100.0 * ratio8),
        yes(ratio8 >= 0.25),
    ]);
    let worst_idle = idle.0.max(idle.1);
    report.targets.push([
        "idle RSS per node proxy".into(),
        "< 10 MiB".into(),
        format!("{} / {}", mib(idle.0), mib(idle.1)),
        yes((worst_idle as f64) < 10.0 * 1024.0),
    ]);

    let header = format!(
        "## Dedicated mode (`bench_e2e`)\n\nMachine: {machine}.\nRun: {secs} s per throughput and connection-rate run, {} round trips per latency run; every proxied figure was measured in the same run as its direct counterpart.\n",
        args.round_trips
    );
    let columns = Columns {
        direct: "direct (same veth)",
        mesh: "through 2 node proxies",
        client_proxy: "client node proxy",
        server_proxy: "server node proxy",
    };
    let text = report.render(&header, &columns);
    println!("\n{text}");
    std::fs::write(&args.out, &text).with_context(|| format!("writing {}", args.out.display()))?;
    println!("written to {}", args.out.display());
    drop(nodes);
    Ok(())
}

/// One iperf3 stream direct, then through two plain TCP relays standing where the node
/// proxies stand (client node: a redirected port; server node: reached over the veth,
/// uncaptured): what any two-hop user-space proxy could reach here before TLS and HTTP/2.
/// Returns (direct, relays) in bits per second.
fn relay_ceiling(nodes: &TwoNodes, secs: u64) -> anyhow::Result<(f64, f64)> {
    let (dial, hop) = (RELAY_DIAL_PORT.to_string(), SERVER_RELAY_PORT.to_string());
    let to_relay = CLIENT_RELAY_PORT.to_string();
    // Inserted above the capture rule: the relays' hop is not captured, the dialed port is
    // redirected to the relay instead of the node proxy.
    for rule in [
        &["--dport", &hop, "-j", "RETURN"][..],
        &["--dport", &dial, "-j", "REDIRECT", "--to-ports", &to_relay][..],
    ] {
        let mut args = vec!["iptables", "-w", "-t", "nat", "-I", "OUTPUT", "-p", "tcp"];
        args.extend_from_slice(rule);
        nodes.lab.exec(&nodes.client_ns, &args)?;
    }
    let socat = std::path::Path::new("socat");
    let server_relay = [
        format!("TCP-LISTEN:{SERVER_RELAY_PORT},fork,reuseaddr"),
        format!("TCP:127.0.0.1:{DIRECT_IPERF_PORT}"),
    ];
    let client_relay = [
        format!("TCP-LISTEN:{CLIENT_RELAY_PORT},fork,reuseaddr"),
        format!("TCP:{SERVER_IP}:{SERVER_RELAY_PORT}"),
    ];
    for (ns, name, ends, port) in [
        (
            &nodes.server_ns,
            "relay-server",
            &server_relay,
            SERVER_RELAY_PORT,
        ),
        (
            &nodes.client_ns,
            "relay-client",
            &client_relay,
            CLIENT_RELAY_PORT,
        ),
    ] {
        let args = ["-b", RELAY_BUFFER, ends[0].as_str(), ends[1].as_str()];
        nodes.lab.spawn(ns, name, socat, &args, &[])?;
        let filter = format!("sport = :{port}");
        ambit::lab::wait_until(
            "socat to listen",
            std::time::Duration::from_secs(10),
            || {
                nodes
                    .lab
                    .exec(ns, &["ss", "-Hltn", &filter])
                    .is_ok_and(|o| !o.trim().is_empty())
            },
        )?;
    }
    let direct = common::iperf(&nodes.client_ns, SERVER_IP, DIRECT_IPERF_PORT, 1, secs)?;
    let relays = common::iperf(&nodes.client_ns, SERVER_IP, RELAY_DIAL_PORT, 1, secs)
        .context("iperf3 through the two socat relays")?;
    println!(
        "relay ceiling: direct {:.2} Gbit/s, two plain relays {:.2} Gbit/s",
        direct / 1e9,
        relays / 1e9
    );
    Ok((direct, relays))
}
