//! Measurement code shared by the end-to-end benchmark drivers (`bench_e2e`, dedicated
//! mode, and `bench_inpod`, in-pod mode): process and machine accounting from /proc, the
//! workloads (iperf3, request/response round trips, new-connection rate) run from inside a
//! network namespace, the suite that measures them directly and through the proxies in one
//! run, and the markdown report. See BENCHMARKS.md.

// `sysconf(_SC_CLK_TCK)` is `unsafe` in libc; the CPU figures need it.
#![allow(unsafe_code)]
// Each driver includes this module and uses most, not all, of it.
#![allow(dead_code)]

pub mod setup;

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ambit_netns_lab::{wait_until, Lab};
use anyhow::{bail, Context};

/// Upper bound on connections per second of a connection-rate run (bounds the memory the
/// latency samples take: 5 s allow 200,000 connections).
pub const MAX_CONNECTIONS_PER_SECOND: usize = 40_000;
/// Round trips before the measured ones (connection and caches warm).
pub const WARMUP_ROUND_TRIPS: usize = 200;

// ---------------------------------------------------------------------------------------
// Process accounting from /proc.

pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The fields of a `/proc/.../stat` file after the command name (which is in parentheses
/// and may contain spaces): index 0 is field 3 (state).
pub fn stat_fields(path: &str) -> anyhow::Result<Vec<String>> {
    let stat = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let rest = stat
        .rsplit_once(')')
        .with_context(|| format!("malformed {path}"))?
        .1;
    Ok(rest.split_whitespace().map(str::to_owned).collect())
}

/// utime + stime (fields 14 and 15) of a process's or a thread's stat file, in seconds.
pub fn stat_cpu_seconds(path: &str) -> anyhow::Result<f64> {
    let f = stat_fields(path)?;
    let utime: f64 = f.get(11).context("no utime")?.parse()?;
    let stime: f64 = f.get(12).context("no stime")?.parse()?;
    Ok((utime + stime) / clock_ticks())
}

/// utime + stime of a whole process (all threads), in seconds.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

/// A `Vm*:` / `Rss*:` line of /proc/<pid>/status, in KiB.
pub fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// Fails unless `pid` is a process named `comm` (the node proxy we mean to measure:
/// `ambit`, or `ztunnel` for Istio's).
pub fn check_comm(pid: u32, comm: &str) -> anyhow::Result<()> {
    let found = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if found.trim() != comm {
        bail!("pid {pid} is {found:?}, not the node proxy ({comm})");
    }
    Ok(())
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
pub fn machine_busy<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, (f64, f64))> {
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

/// The two node proxies of a run: the one on the client's side and the one on the server's
/// side (in-pod mode with both pods on one node: the second node's proxy, which stays idle).
#[derive(Clone, Copy)]
pub struct Proxies {
    pub client: u32,
    pub server: u32,
}

#[derive(Clone, Copy, Default)]
pub struct Cpu {
    pub client: f64,
    pub server: f64,
}

impl Proxies {
    pub fn cpu(&self) -> anyhow::Result<Cpu> {
        Ok(Cpu {
            client: cpu_seconds(self.client)?,
            server: cpu_seconds(self.server)?,
        })
    }

    /// Runs `f` and returns its result with the CPU the proxies used meanwhile.
    pub fn measure<T>(&self, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, Cpu)> {
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

    /// A `/proc/<pid>/status` field of both, in KiB.
    pub fn status_kib(&self, field: &str) -> anyhow::Result<(u64, u64)> {
        Ok((
            status_kib(self.client, field)?,
            status_kib(self.server, field)?,
        ))
    }
}

// ---------------------------------------------------------------------------------------
// Workloads, each run from inside a network namespace.

/// Starts an iperf3 server on `port` in `ns` and waits until it listens.
pub fn start_iperf_server(lab: &Lab, ns: &str, port: u16) -> anyhow::Result<()> {
    let p = port.to_string();
    // The log name must be unique in the lab: several namespaces may run one.
    let tag = ns.rsplit('-').next().unwrap_or("ns");
    lab.spawn(
        ns,
        &format!("iperf3-{tag}-{port}"),
        Path::new("iperf3"),
        &["-s", "-p", &p],
        &[],
    )?;
    wait_listening(lab, ns, port)
}

/// Waits until something listens on TCP `port` in `ns`.
pub fn wait_listening(lab: &Lab, ns: &str, port: u16) -> anyhow::Result<()> {
    let filter = format!("sport = :{port}");
    wait_until(
        &format!("a listener on port {port} in {ns}"),
        Duration::from_secs(10),
        || {
            lab.exec(ns, &["ss", "-Hltn", &filter])
                .is_ok_and(|o| !o.trim().is_empty())
        },
    )
}

/// One iperf3 run from `ns` to `server`:`port`; returns received bits per second.
pub fn iperf(
    ns: &str,
    server: Ipv4Addr,
    port: u16,
    streams: u32,
    seconds: u64,
) -> anyhow::Result<f64> {
    let server = server.to_string();
    let (p, t, n) = (port.to_string(), seconds.to_string(), streams.to_string());
    // `timeout` bounds the run even if a connection hangs.
    let limit = (seconds + 20).to_string();
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "timeout", &limit])
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
pub struct Pcts {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// The p50 (the true median) and the p90 and p99 (nearest rank) of `samples`; zeros for none.
pub fn percentiles(samples: Vec<Duration>) -> Pcts {
    use ambit_netns_lab::stats::{median, percentile};
    if samples.is_empty() {
        return Pcts::default();
    }
    let us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    Pcts {
        p50: median(&us),
        p90: percentile(&us, 90.0),
        p99: percentile(&us, 99.0),
    }
}

/// A TCP connection made from inside `ns`, the way an unmodified app makes it.
pub fn connect_in(ns: &str, dst: SocketAddr) -> anyhow::Result<TcpStream> {
    let s = Lab::in_netns(ns, move || {
        TcpStream::connect_timeout(&dst, Duration::from_secs(10))
    })
    .with_context(|| format!("connecting to {dst} from {ns}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    Ok(s)
}

/// `count` request/response exchanges of `size` bytes on one connection from `ns`.
pub fn round_trips(ns: &str, dst: SocketAddr, size: usize, count: usize) -> anyhow::Result<Pcts> {
    let mut s = connect_in(ns, dst)?;
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

/// One slice of a connection-rate run.
#[derive(Clone, Copy, Default)]
pub struct Window {
    pub per_second: f64,
    pub connections: usize,
    pub errors: usize,
    pub latency: Pcts,
}

pub struct Rate {
    pub per_second: f64,
    pub latency: Pcts,
    pub errors: usize,
    /// Whether a worker gave up after too many failed connections before the end.
    pub gave_up: bool,
    /// The run cut into consecutive windows (one window unless asked otherwise).
    pub windows: Vec<Window>,
}

/// New connections, each carrying one 64 B exchange, from `concurrency` threads in `ns`
/// for `seconds`; a worker gives up after 1,000 failed connections.
pub fn connection_rate(
    ns: &str,
    dst: SocketAddr,
    concurrency: usize,
    seconds: u64,
) -> anyhow::Result<Rate> {
    sustained_connection_rate(ns, dst, concurrency, seconds, seconds, Some(1000))
}

/// Like [`connection_rate`], reporting each `window` seconds separately; with
/// `give_up_after` None the workers keep going through failures until the end (1 ms pause
/// after each failure).
pub fn sustained_connection_rate(
    ns: &str,
    dst: SocketAddr,
    concurrency: usize,
    seconds: u64,
    window: u64,
    give_up_after: Option<usize>,
) -> anyhow::Result<Rate> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let per_thread_max = MAX_CONNECTIONS_PER_SECOND * seconds as usize / concurrency;
    type Samples = (Vec<(Duration, Duration)>, Vec<Duration>, bool);
    let results: Vec<anyhow::Result<Samples>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                scope.spawn(move || {
                    // The whole loop runs on a thread inside `ns`.
                    Lab::in_netns(ns, move || {
                        let req = [0x5au8; 64];
                        let mut resp = [0u8; 64];
                        // (end of the exchange since the start, connect + exchange time)
                        let mut done = Vec::new();
                        let mut failed = Vec::new();
                        let mut gave_up = false;
                        while Instant::now() < deadline && done.len() < per_thread_max {
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
                                Ok(()) => done.push((start.elapsed(), t0.elapsed())),
                                Err(_) => {
                                    failed.push(start.elapsed());
                                    if give_up_after.is_some_and(|n| failed.len() > n) {
                                        gave_up = true;
                                        break;
                                    }
                                    std::thread::sleep(Duration::from_millis(1));
                                }
                            }
                        }
                        Ok((done, failed, gave_up))
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
    let window = window.clamp(1, seconds.max(1));
    let n_windows = seconds.div_ceil(window).max(1) as usize;
    let index = |at: Duration| ((at.as_secs() / window) as usize).min(n_windows - 1);
    let mut per_window: Vec<(Vec<Duration>, usize)> = vec![(Vec::new(), 0); n_windows];
    let mut all = Vec::new();
    let mut errors = 0;
    let mut gave_up = false;
    for r in results {
        let (done, failed, g) = r?;
        gave_up |= g;
        errors += failed.len();
        for at in failed {
            per_window[index(at)].1 += 1;
        }
        for (at, lat) in done {
            per_window[index(at)].0.push(lat);
            all.push(lat);
        }
    }
    let windows = per_window
        .into_iter()
        .enumerate()
        .map(|(i, (lat, errors))| {
            // The last window also holds the exchanges that finished after the deadline.
            let from = (i as u64 * window) as f64;
            let to = if i + 1 == n_windows {
                elapsed
            } else {
                ((i as u64 + 1) * window) as f64
            };
            Window {
                per_second: lat.len() as f64 / (to - from).max(1e-3),
                connections: lat.len(),
                errors,
                latency: percentiles(lat),
            }
        })
        .collect();
    Ok(Rate {
        per_second: all.len() as f64 / elapsed,
        latency: percentiles(all),
        errors,
        gave_up,
        windows,
    })
}

// ---------------------------------------------------------------------------------------
// The suite: the same workloads directly and through the proxies, in one run.

/// Where the suite's traffic goes. Direct and proxied share the client namespace, the
/// server namespace and everything between them; only the ports differ (the direct ones
/// are exempted from capture by the driver).
pub struct Target<'a> {
    /// Where the load (iperf3 client, echo clients) runs.
    pub client_ns: &'a str,
    pub server_ip: Ipv4Addr,
    pub mesh_echo_port: u16,
    pub direct_echo_port: u16,
    pub mesh_iperf_port: u16,
    pub direct_iperf_port: u16,
}

impl Target<'_> {
    pub fn mesh_echo(&self) -> SocketAddr {
        SocketAddr::from((self.server_ip, self.mesh_echo_port))
    }

    pub fn direct_echo(&self) -> SocketAddr {
        SocketAddr::from((self.server_ip, self.direct_echo_port))
    }
}

/// The figures the targets are checked against.
pub struct Summary {
    /// (direct, proxied) bits per second, one stream.
    pub single: (f64, f64),
    /// Added p50 latency (µs) per request size label.
    pub rr_p50_added: Vec<(&'static str, f64)>,
    /// Concurrency 8: (direct, proxied).
    pub rate8: (Rate, Rate),
}

/// iperf3 with 1 and 4 streams, 64 B and 1 KiB round trips, new connections at
/// concurrency 1 and 8: each direct, then through the proxies, into `report`.
pub fn run_suite(
    t: &Target,
    proxies: &Proxies,
    secs: u64,
    count: usize,
    report: &mut Report,
) -> anyhow::Result<Summary> {
    // Throughput.
    let mut single = (0.0, 0.0);
    for streams in [1u32, 4] {
        println!("iperf3, {streams} stream(s), {secs} s each way ...");
        let (direct, busy_d) =
            machine_busy(|| iperf(t.client_ns, t.server_ip, t.direct_iperf_port, streams, secs))?;
        let ((mesh, cpu), busy_m) = machine_busy(|| {
            proxies.measure(|| iperf(t.client_ns, t.server_ip, t.mesh_iperf_port, streams, secs))
        })?;
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
    let mut rr_p50_added = Vec::new();
    for size in [64usize, 1024] {
        let label = if size == 64 { "64 B" } else { "1 KiB" };
        println!("{count} round trips of {label} ...");
        let (direct, busy_d) =
            machine_busy(|| round_trips(t.client_ns, t.direct_echo(), size, count))?;
        let ((mesh, cpu), busy_m) = machine_busy(|| {
            proxies.measure(|| round_trips(t.client_ns, t.mesh_echo(), size, count))
        })?;
        println!(
            "  p50 direct {:.0} µs, proxied {:.0} µs",
            direct.p50, mesh.p50
        );
        let what = format!("request/response {label}, reused connection");
        report.latency(&what, direct, mesh);
        let per_req = (count + WARMUP_ROUND_TRIPS) as f64 / 1e6;
        report.cpu(&format!("{label} round trips"), cpu, per_req, "µs/request");
        report.busy(&format!("{label} round trips"), busy_d, busy_m);
        rr_p50_added.push((label, mesh.p50 - direct.p50));
    }

    // New-connection rate.
    let mut rate8 = None;
    for concurrency in [1usize, 8] {
        println!("new connections, concurrency {concurrency}, {secs} s each way ...");
        let (direct, busy_d) =
            machine_busy(|| connection_rate(t.client_ns, t.direct_echo(), concurrency, secs))?;
        let ((mesh, cpu), busy_m) = machine_busy(|| {
            proxies.measure(|| connection_rate(t.client_ns, t.mesh_echo(), concurrency, secs))
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
            rate8 = Some((direct, mesh));
        }
    }
    Ok(Summary {
        single,
        rr_p50_added,
        rate8: rate8.expect("concurrency 8 ran"),
    })
}

// ---------------------------------------------------------------------------------------
// Report.

/// Column headings of the figure and CPU tables.
pub struct Columns<'a> {
    pub direct: &'a str,
    pub mesh: &'a str,
    pub client_proxy: &'a str,
    pub server_proxy: &'a str,
}

#[derive(Default)]
pub struct Report {
    pub rows: Vec<[String; 5]>,
    pub resources: Vec<[String; 3]>,
    pub busy: Vec<[String; 3]>,
    pub targets: Vec<[String; 4]>,
    pub notes: Vec<String>,
}

/// A `machine_busy` figure: "80 % busy (steal 2 %)".
pub fn busy_text((busy, steal): (f64, f64)) -> String {
    format!("{busy:.0} % (steal {steal:.0} %)")
}

pub fn pct(mesh: f64, direct: f64) -> String {
    if direct > 0.0 {
        format!("{:.0} %", 100.0 * mesh / direct)
    } else {
        "n/a".into()
    }
}

pub fn yes(ok: bool) -> String {
    if ok { "yes" } else { "**no**" }.to_string()
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

impl Report {
    pub fn throughput(&mut self, what: &str, direct: f64, mesh: f64) {
        self.rows.push([
            what.into(),
            format!("{:.2} Gbit/s", direct / 1e9),
            format!("{:.2} Gbit/s", mesh / 1e9),
            pct(mesh, direct),
            String::new(),
        ]);
    }

    pub fn latency(&mut self, what: &str, direct: Pcts, mesh: Pcts) {
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

    pub fn rate(&mut self, what: &str, direct: &Rate, mesh: &Rate) {
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

    pub fn cpu(&mut self, phase: &str, cpu: Cpu, per: f64, unit: &str) {
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

    pub fn busy(&mut self, phase: &str, direct: (f64, f64), mesh: (f64, f64)) {
        self.busy
            .push([phase.into(), busy_text(direct), busy_text(mesh)]);
    }

    /// The figure, CPU/memory and machine-busy tables.
    pub fn render_tables(&self, c: &Columns) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "\n| figure | {} | {} | proxied / direct | added |\n|---|---:|---:|---:|---:|\n",
            c.direct, c.mesh
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                r[0], r[1], r[2], r[3], r[4]
            );
        }
        let _ = write!(
            s,
            "\n| node proxy CPU during the proxied run, and memory | {} | {} |\n|---|---:|---:|\n",
            c.client_proxy, c.server_proxy
        );
        for r in &self.resources {
            let _ = writeln!(s, "| {} | {} | {} |", r[0], r[1], r[2]);
        }
        s.push_str("\n| whole machine busy (all cores, every process) | direct run | proxied run |\n|---|---:|---:|\n");
        for r in &self.busy {
            let _ = writeln!(s, "| {} | {} | {} |", r[0], r[1], r[2]);
        }
        s
    }

    /// The targets table and the notes.
    pub fn render_targets(&self) -> String {
        let mut s = String::new();
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

    pub fn render(&self, header: &str, c: &Columns) -> String {
        let mut s = String::from(header);
        s.push_str(&self.render_tables(c));
        s.push_str(&self.render_targets());
        s
    }
}

pub fn machine() -> String {
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
