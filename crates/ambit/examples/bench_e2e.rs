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
//! - CPU seconds of each node proxy per phase, idle RSS right after start, peak RSS.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ambit::lab::mesh::{serve_echo, EchoMode, TwoNodes, APP_PORT, SERVER_IP};
use ambit::lab::{wait_until, Lab};
use anyhow::{bail, Context};

/// The echo app through the mesh is `APP_PORT` (8080); the same app, direct, listens here.
const DIRECT_ECHO_PORT: u16 = 9080;
/// iperf3 servers: captured (through the proxies) and exempted (direct).
const MESH_IPERF_PORT: u16 = 5201;
const DIRECT_IPERF_PORT: u16 = 5202;
/// Upper bound on connections per connection-rate run, whatever the duration.
const MAX_CONNECTIONS_PER_RUN: usize = 200_000;
/// Round trips before the measured ones (connection and caches warm).
const WARMUP_ROUND_TRIPS: usize = 200;

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
                let kv = val()?;
                let (k, v) = kv.split_once('=').context("--proxy-env takes KEY=VALUE")?;
                proxy_env.push((k.to_string(), v.to_string()));
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
// Process accounting from /proc.

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a whole process (all threads), in seconds.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = stat.rsplit_once(')').context("malformed stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let utime: f64 = f.get(11).context("no utime")?.parse()?;
    let stime: f64 = f.get(12).context("no stime")?.parse()?;
    Ok((utime + stime) / clock_ticks())
}

/// A `Vm*:` line of /proc/<pid>/status, in KiB.
fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// Machine-wide CPU time from /proc/stat: (busy, steal, total) in ticks, all cores.
fn machine_ticks() -> anyhow::Result<(u64, u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal [guest guest_nice, already in user]
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    let steal = v.get(7).copied().unwrap_or(0);
    Ok((total - idle - steal, steal, total))
}

/// How busy the whole machine was while `f` ran: (busy %, steal %) of all cores.
fn machine_busy<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, (f64, f64))> {
    let a = machine_ticks()?;
    let t = f()?;
    let b = machine_ticks()?;
    let total = (b.2 - a.2).max(1) as f64;
    Ok((
        t,
        (
            100.0 * (b.0 - a.0) as f64 / total,
            100.0 * (b.1 - a.1) as f64 / total,
        ),
    ))
}

#[derive(Clone, Copy)]
struct Proxies {
    client: u32,
    server: u32,
}

#[derive(Clone, Copy, Default)]
struct Cpu {
    client: f64,
    server: f64,
}

impl Proxies {
    fn cpu(&self) -> anyhow::Result<Cpu> {
        Ok(Cpu {
            client: cpu_seconds(self.client)?,
            server: cpu_seconds(self.server)?,
        })
    }

    /// Runs `f` and returns its result with the CPU the proxies used meanwhile.
    fn measure<T>(&self, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, Cpu)> {
        let before = self.cpu()?;
        let t = f()?;
        let after = self.cpu()?;
        Ok((
            t,
            Cpu {
                client: after.client - before.client,
                server: after.server - before.server,
            },
        ))
    }
}

// ---------------------------------------------------------------------------------------
// Workloads.

/// Starts an iperf3 server on `port` in the server node and waits until it listens.
fn start_iperf_server(nodes: &TwoNodes, port: u16) -> anyhow::Result<()> {
    let p = port.to_string();
    nodes.lab.spawn(
        &nodes.server_ns,
        &format!("iperf3-{port}"),
        Path::new("iperf3"),
        &["-s", "-p", &p],
        &[],
    )?;
    let filter = format!("sport = :{port}");
    wait_until("iperf3 to listen", Duration::from_secs(10), || {
        nodes
            .lab
            .exec(&nodes.server_ns, &["ss", "-Hltn", &filter])
            .is_ok_and(|o| !o.trim().is_empty())
    })
}

/// One iperf3 run from the client node; returns received bits per second.
fn iperf(nodes: &TwoNodes, port: u16, streams: u32, seconds: u64) -> anyhow::Result<f64> {
    let server = SERVER_IP.to_string();
    let (p, t, n) = (port.to_string(), seconds.to_string(), streams.to_string());
    // `timeout` bounds the run even if a connection hangs.
    let limit = (seconds + 20).to_string();
    let out = Command::new("ip")
        .args(["netns", "exec", &nodes.client_ns, "timeout", &limit])
        .args(["iperf3", "-c", &server, "-p", &p, "-J", "-t", &t, "-P", &n])
        .output()
        .context("running iperf3")?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "iperf3 gave no JSON ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(e) = json.get("error") {
        bail!("iperf3 to port {port}: {e}");
    }
    json.pointer("/end/sum_received/bits_per_second")
        .and_then(|v| v.as_f64())
        .context("iperf3 JSON has no end.sum_received.bits_per_second")
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Default)]
struct Pcts {
    p50: f64,
    p90: f64,
    p99: f64,
}

fn percentiles(mut samples: Vec<Duration>) -> Pcts {
    if samples.is_empty() {
        return Pcts::default();
    }
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1e6
    };
    Pcts {
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
    }
}

/// `round_trips` request/response exchanges of `size` bytes on one connection.
fn round_trips(
    nodes: &TwoNodes,
    dst: SocketAddr,
    size: usize,
    count: usize,
) -> anyhow::Result<Pcts> {
    let mut s = nodes.connect_from_client(dst)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let req = vec![0xa5u8; size];
    let mut resp = vec![0u8; size];
    let mut samples = Vec::with_capacity(count);
    for i in 0..WARMUP_ROUND_TRIPS + count {
        let t0 = Instant::now();
        s.write_all(&req)?;
        s.read_exact(&mut resp)?;
        if i >= WARMUP_ROUND_TRIPS {
            samples.push(t0.elapsed());
        }
    }
    Ok(percentiles(samples))
}

struct Rate {
    per_second: f64,
    latency: Pcts,
    errors: usize,
}

/// New connections, each carrying one 64 B exchange, from `concurrency` threads in the
/// client node for `seconds`.
fn connection_rate(
    nodes: &TwoNodes,
    dst: SocketAddr,
    concurrency: usize,
    seconds: u64,
) -> anyhow::Result<Rate> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let per_thread_max = MAX_CONNECTIONS_PER_RUN / concurrency;
    let results: Vec<anyhow::Result<(Vec<Duration>, usize)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let ns = nodes.client_ns.clone();
                scope.spawn(move || {
                    // The whole loop runs on a thread inside the client node.
                    Lab::in_netns(&ns, move || {
                        let req = [0x5au8; 64];
                        let mut resp = [0u8; 64];
                        let mut lat = Vec::new();
                        let mut errors = 0usize;
                        while Instant::now() < deadline && lat.len() < per_thread_max {
                            let t0 = Instant::now();
                            let r = (|| -> std::io::Result<()> {
                                let mut s =
                                    TcpStream::connect_timeout(&dst, Duration::from_secs(5))?;
                                s.set_nodelay(true)?;
                                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                                s.write_all(&req)?;
                                s.read_exact(&mut resp)?;
                                Ok(())
                            })();
                            match r {
                                Ok(()) => lat.push(t0.elapsed()),
                                Err(_) => {
                                    errors += 1;
                                    if errors > 1000 {
                                        break;
                                    }
                                    std::thread::sleep(Duration::from_millis(1));
                                }
                            }
                        }
                        Ok((lat, errors))
                    })
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("connection worker panicked"))
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut all = Vec::new();
    let mut errors = 0;
    for r in results {
        let (lat, e) = r?;
        all.extend(lat);
        errors += e;
    }
    Ok(Rate {
        per_second: all.len() as f64 / elapsed,
        latency: percentiles(all),
        errors,
    })
}

// ---------------------------------------------------------------------------------------
// Report.

struct Report {
    rows: Vec<[String; 5]>,
    resources: Vec<[String; 3]>,
    busy: Vec<[String; 3]>,
    targets: Vec<[String; 4]>,
    notes: Vec<String>,
}

fn pct(mesh: f64, direct: f64) -> String {
    if direct > 0.0 {
        format!("{:.0} %", 100.0 * mesh / direct)
    } else {
        "n/a".into()
    }
}

impl Report {
    fn throughput(&mut self, what: &str, direct: f64, mesh: f64) {
        self.rows.push([
            what.into(),
            format!("{:.2} Gbit/s", direct / 1e9),
            format!("{:.2} Gbit/s", mesh / 1e9),
            pct(mesh, direct),
            String::new(),
        ]);
    }

    fn latency(&mut self, what: &str, direct: Pcts, mesh: Pcts) {
        self.quantiles(what, direct, mesh, &["p50", "p90", "p99"]);
    }

    fn quantiles(&mut self, what: &str, direct: Pcts, mesh: Pcts, which: &[&str]) {
        for (q, d, m) in [
            ("p50", direct.p50, mesh.p50),
            ("p90", direct.p90, mesh.p90),
            ("p99", direct.p99, mesh.p99),
        ] {
            if !which.contains(&q) {
                continue;
            }
            self.rows.push([
                format!("{what} {q}"),
                format!("{d:.0} µs"),
                format!("{m:.0} µs"),
                if d > 0.0 {
                    format!("{:.1}×", m / d)
                } else {
                    "n/a".into()
                },
                format!("{:+.0} µs", m - d),
            ]);
        }
    }

    fn rate(&mut self, what: &str, direct: &Rate, mesh: &Rate) {
        self.rows.push([
            format!("{what}: connections/s"),
            format!("{:.0}", direct.per_second),
            format!("{:.0}", mesh.per_second),
            pct(mesh.per_second, direct.per_second),
            String::new(),
        ]);
        self.quantiles(
            &format!("{what}: connect + 64 B exchange"),
            direct.latency,
            mesh.latency,
            &["p50", "p99"],
        );
        if direct.errors + mesh.errors > 0 {
            self.notes.push(format!(
                "{what}: {} failed connections direct, {} through the proxies",
                direct.errors, mesh.errors
            ));
        }
    }

    fn cpu(&mut self, phase: &str, cpu: Cpu, per: f64, unit: &str) {
        let f = |s: f64| {
            if per > 0.0 {
                format!("{s:.2} s ({:.2} {unit})", s / per)
            } else {
                format!("{s:.2} s")
            }
        };
        self.resources
            .push([phase.into(), f(cpu.client), f(cpu.server)]);
    }

    fn busy(&mut self, phase: &str, direct: (f64, f64), mesh: (f64, f64)) {
        let f = |(b, st): (f64, f64)| format!("{b:.0} % (steal {st:.0} %)");
        self.busy.push([phase.into(), f(direct), f(mesh)]);
    }

    fn render(&self, header: &str) -> String {
        let mut s = String::new();
        s.push_str(header);
        s.push_str("\n| figure | direct (same veth) | through 2 node proxies | proxied / direct | added |\n|---|---:|---:|---:|---:|\n");
        for r in &self.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                r[0], r[1], r[2], r[3], r[4]
            );
        }
        s.push_str("\n| node proxy CPU during the proxied run, and memory | client node proxy | server node proxy |\n|---|---:|---:|\n");
        for r in &self.resources {
            let _ = writeln!(s, "| {} | {} | {} |", r[0], r[1], r[2]);
        }
        s.push_str("\n| whole machine busy (all cores, every process) | direct run | proxied run |\n|---|---:|---:|\n");
        for r in &self.busy {
            let _ = writeln!(s, "| {} | {} | {} |", r[0], r[1], r[2]);
        }
        s.push_str("\n| target | threshold | measured | met? |\n|---|---|---|---|\n");
        for t in &self.targets {
            let _ = writeln!(s, "| {} | {} | {} | {} |", t[0], t[1], t[2], t[3]);
        }
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        s
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")?
                    .split_once(':')
                    .map(|x| x.1.trim().to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let load = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    format!("{cores} cores, {cpu}, Linux {kernel}, load average before the run {load}")
}

// ---------------------------------------------------------------------------------------

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let ambit = std::fs::canonicalize(&args.ambit)
        .with_context(|| format!("no ambit binary at {}", args.ambit.display()))?;
    ambit::lab::require_tool("iperf3", "iperf3")?;
    ambit::lab::require_tool("ss", "iproute2")?;
    let machine = machine();
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
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "ambit" {
            bail!("pid {pid} is {comm:?}, not the node proxy");
        }
    }
    let idle = (
        status_kib(proxies.client, "VmRSS")?,
        status_kib(proxies.server, "VmRSS")?,
    );
    let idle_anon = (
        status_kib(proxies.client, "RssAnon")?,
        status_kib(proxies.server, "RssAnon")?,
    );
    let idle_file = (
        status_kib(proxies.client, "RssFile")?,
        status_kib(proxies.server, "RssFile")?,
    );
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
    start_iperf_server(&nodes, MESH_IPERF_PORT)?;
    start_iperf_server(&nodes, DIRECT_IPERF_PORT)?;

    let mesh_echo = SocketAddr::from((SERVER_IP, APP_PORT));
    let direct_echo = SocketAddr::from((SERVER_IP, DIRECT_ECHO_PORT));
    // Warm the HBONE pool (and check both paths work) before measuring.
    for dst in [mesh_echo, direct_echo] {
        round_trips(&nodes, dst, 64, 100).with_context(|| format!("echo through {dst}"))?;
    }

    let mut report = Report {
        rows: Vec::new(),
        resources: Vec::new(),
        busy: Vec::new(),
        targets: Vec::new(),
        notes: Vec::new(),
    };
    let secs = args.seconds;

    // Throughput.
    let mut single = (0.0, 0.0);
    for streams in [1u32, 4] {
        println!("iperf3, {streams} stream(s), {secs} s each way ...");
        let (direct, busy_d) = machine_busy(|| iperf(&nodes, DIRECT_IPERF_PORT, streams, secs))?;
        let ((mesh, cpu), busy_m) =
            machine_busy(|| proxies.measure(|| iperf(&nodes, MESH_IPERF_PORT, streams, secs)))?;
        println!(
            "  direct {:.2} Gbit/s, proxied {:.2} Gbit/s",
            direct / 1e9,
            mesh / 1e9
        );
        let what = format!(
            "throughput, {streams} stream{}",
            if streams > 1 { "s" } else { "" }
        );
        report.throughput(&what, direct, mesh);
        let gbytes = mesh * secs as f64 / 8.0 / 1e9;
        report.cpu(&what, cpu, gbytes, "s/GB");
        report.busy(&what, busy_d, busy_m);
        if streams == 1 {
            single = (direct, mesh);
        }
    }

    // Request/response latency on one reused connection.
    let mut rr_p50 = Vec::new();
    for size in [64usize, 1024] {
        let label = if size == 64 { "64 B" } else { "1 KiB" };
        println!("{} round trips of {label} ...", args.round_trips);
        let (direct, busy_d) =
            machine_busy(|| round_trips(&nodes, direct_echo, size, args.round_trips))?;
        let ((mesh, cpu), busy_m) = machine_busy(|| {
            proxies.measure(|| round_trips(&nodes, mesh_echo, size, args.round_trips))
        })?;
        println!(
            "  p50 direct {:.0} µs, proxied {:.0} µs",
            direct.p50, mesh.p50
        );
        let what = format!("request/response {label}, reused connection");
        report.latency(&what, direct, mesh);
        let per_req = (args.round_trips + WARMUP_ROUND_TRIPS) as f64 / 1e6;
        report.cpu(&format!("{label} round trips"), cpu, per_req, "µs/request");
        report.busy(&format!("{label} round trips"), busy_d, busy_m);
        rr_p50.push((label, mesh.p50 - direct.p50));
    }

    // New-connection rate.
    let mut rate8 = (0.0, 0.0);
    for concurrency in [1usize, 8] {
        println!("new connections, concurrency {concurrency}, {secs} s each way ...");
        let (direct, busy_d) =
            machine_busy(|| connection_rate(&nodes, direct_echo, concurrency, secs))?;
        let ((mesh, cpu), busy_m) = machine_busy(|| {
            proxies.measure(|| connection_rate(&nodes, mesh_echo, concurrency, secs))
        })?;
        println!(
            "  direct {:.0}/s, proxied {:.0}/s",
            direct.per_second, mesh.per_second
        );
        let what = format!("new connections, concurrency {concurrency}");
        report.rate(&what, &direct, &mesh);
        let conns_m = mesh.per_second * secs as f64 / 1e6;
        report.cpu(&what, cpu, conns_m, "µs/connection");
        report.busy(&what, busy_d, busy_m);
        if concurrency == 8 {
            rate8 = (direct.per_second, mesh.per_second);
        }
    }

    let peak = (
        status_kib(proxies.client, "VmHWM")?,
        status_kib(proxies.server, "VmHWM")?,
    );
    let end = (
        status_kib(proxies.client, "VmRSS")?,
        status_kib(proxies.server, "VmRSS")?,
    );
    let mib = |k: u64| format!("{:.1} MiB", k as f64 / 1024.0);
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
    let yes = |ok: bool| if ok { "yes" } else { "**no**" }.to_string();
    let ratio1 = single.1 / single.0;
    report.targets.push([
        "single-stream throughput".into(),
        "≥ 45 % of direct".into(),
        format!("{:.0} %", 100.0 * ratio1),
        yes(ratio1 >= 0.45),
    ]);
    for (label, added) in &rr_p50 {
        report.targets.push([
            format!("added p50 latency, {label}, reused connection (2 hops)"),
            "< 80 µs".into(),
            format!("+{added:.0} µs"),
            yes(*added < 80.0),
        ]);
    }
    let ratio8 = rate8.1 / rate8.0;
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
        "Machine: {machine}.\nRun: {secs} s per throughput and connection-rate run, {} round trips per latency run; every proxied figure was measured in the same run as its direct counterpart.\n",
        args.round_trips
    );
    let text = report.render(&header);
    println!("\n{text}");
    std::fs::write(&args.out, &text).with_context(|| format!("writing {}", args.out.display()))?;
    println!("written to {}", args.out.display());
    drop(nodes);
    Ok(())
}
