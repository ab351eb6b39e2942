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
//! - the ceiling of the path: one iperf3 stream through two plain TCP relays (socat), then
//!   through two bare TLS relays (the node proxies' TLS, no HTTP/2), where the node proxies
//!   sit, with each relay's CPU per GB (module `relays`).

mod common;
mod relays;

use std::path::PathBuf;

use ambit_netns_lab::mesh::{TwoNodes, APP_PORT};
use anyhow::{bail, Context};
use common::setup::{self, DIRECT_ECHO_PORT, DIRECT_IPERF_PORT, MESH_IPERF_PORT};
use common::{mib, yes, Columns, Proxies, Report};

/// The TLS relays of the ceiling run in this process and stand in for the node proxies:
/// they allocate as the proxies do (crates/ambit/src/main.rs).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
                proxy_env
                    .push(ambit_netns_lab::parse_env_pair(&val()?).map_err(anyhow::Error::msg)?);
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
    ambit_netns_lab::require_tool("iperf3", "iperf3")?;
    ambit_netns_lab::require_tool("socat", "socat")?;
    ambit_netns_lab::require_tool("ss", "iproute2")?;
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
    ambit_netns_lab::remove_on_signal(nodes.lab.cleanup_handle());

    let proxies = Proxies {
        client: nodes.client_proxy.pid,
        server: nodes.server_proxy.pid,
    };
    for pid in [proxies.client, proxies.server] {
        common::check_comm(pid, "ambit")?;
    }
    let idle = proxies.status_kib("VmRSS")?;
    let idle_anon = proxies.status_kib("RssAnon")?;
    let idle_file = proxies.status_kib("RssFile")?;
    println!(
        "idle RSS: client node proxy {} KiB, server node proxy {} KiB",
        idle.0, idle.1
    );

    // The direct path: the same veth between the same namespaces, with the destination
    // ports exempted from the capture rule; both checked (and the HBONE pool warmed).
    let target = setup::dedicated_paths(&nodes)?;

    let mut report = Report::default();
    let secs = args.seconds;
    let summary = common::run_suite(&target, &proxies, secs, args.round_trips, &mut report)?;

    let apps = relays::Apps {
        iperf: DIRECT_IPERF_PORT,
        echo: DIRECT_ECHO_PORT,
        mesh_iperf: MESH_IPERF_PORT,
        mesh_echo: APP_PORT,
        proxies: [proxies.client, proxies.server],
    };
    let ceiling = relays::measure(&nodes, &apps, secs, args.round_trips)?;
    report.notes.extend(ceiling_notes(&ceiling));
    let (single_d, single_m) = summary.single;

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

/// The ceiling rounds as notes under the tables.
fn ceiling_notes(c: &relays::Ceiling) -> Vec<String> {
    let rounds = relays::ROUNDS;
    let rate = |s: &relays::Streams| {
        format!(
            "{:.2} Gbit/s, {} of direct",
            s.bits_per_second / 1e9,
            common::pct(s.of_direct, 1.0)
        )
    };
    let cost = |s: &relays::Streams| {
        format!(
            "{:.2} + {:.2} s/GB, machine {}",
            s.cpu_per_gb.0,
            s.cpu_per_gb.1,
            common::busy_text(s.busy)
        )
    };
    let [direct, plain, tls, meshed] = c.round_trip_p50;
    vec![
        format!(
            "Ceiling of this path: {rounds} rounds, each one iperf3 stream direct, then through two relays in place of the node proxies, then through the node proxies, taken in turn (medians; each percentage is the median of the rounds' ratios to that round's direct stream). Direct {:.2} Gbit/s. Two plain TCP relays (socat, {} KiB reads, no TLS): {}. Two bare TLS relays (the node proxies' own rustls configuration, certificates and read-ahead, {}, same reads, no HTTP/2): {}. The node proxies: {}, {} of the TLS relays.",
            c.direct.bits_per_second / 1e9,
            relays::RELAY_BUFFER / 1024,
            rate(&c.plain),
            c.tls_suite,
            rate(&c.tls),
            rate(&c.proxies),
            common::pct(c.proxies_of_tls, 1.0),
        ),
        format!(
            "CPU per GB carried in those rounds (client node + server node) and the whole machine busy: plain relays {}; TLS relays {}; node proxies {}; direct: machine {}.",
            cost(&c.plain),
            cost(&c.tls),
            cost(&c.proxies),
            common::busy_text(c.direct.busy),
        ),
        format!(
            "64 B round trips on one reused connection, p50, median of {rounds} rounds of the four paths taken in turn: direct {direct:.0} µs; two plain relays {plain:.0} µs (+{:.0} µs); two TLS relays {tls:.0} µs (+{:.0} µs); the node proxies {meshed:.0} µs (+{:.0} µs).",
            plain - direct,
            tls - direct,
            meshed - direct,
        ),
    ]
}
