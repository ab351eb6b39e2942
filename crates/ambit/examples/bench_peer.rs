//! Side-by-side benchmark driver: ambit's node proxy and Istio's ztunnel (the reference
//! peer) in the same run, on the same machine, the same lab and the same workloads, in
//! interleaved rounds. Two labs of each mode stand up at once, one per implementation; each
//! figure is measured round after round, each round the direct path first, then the two
//! proxies in an order that alternates from round to round, so drift over the run touches
//! both alike. Reported: the median of the per-round values and of the per-round ratios,
//! with their spread (lowest–highest).
//!
//! ```text
//! bench_peer --ambit target/release/ambit --peer ../shared/peers/istio-ztunnel --out FILE
//!     [--append] [--only dedicated|inpod] [--rounds 3] [--seconds 5] [--round-trips 2000]
//!     [--soak-seconds 30] [--soak-window 5] [--idle-pods 50] [--enroll-pods 10]
//!     [--proxy-env KEY=VALUE]... [--title TEXT]
//! ```
//!
//! Usually started by `scripts/bench` when the peer is present. `--proxy-env` goes to both
//! proxies (`ZTUNNEL_WORKER_THREADS=2` gives both the same worker threads). Needs root,
//! iperf3 and the containernetworking-plugins. Everything it creates is removed at the end.
//!
//! Figures (see BENCHMARKS.md): throughput with 1 and 4 iperf3 streams and each proxy's CPU
//! per GB; 64 B and 1 KiB round trips on one reused connection (added p50 and p99); new
//! connections per second at concurrency 1 and 8; idle and peak RSS; in-pod also between
//! two pods on one node, a new-connection soak with original source on (first and last
//! window), memory per idle enrolled pod and CNI ADD to first byte.
// Under `cargo test` only the verdicts are tested; the driver is unused.
#![cfg_attr(test, allow(dead_code))]

mod common;

use std::fmt::Write as _;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ambit_netns_lab::cluster::{Cluster, ClusterSpec};
use ambit_netns_lab::mesh::{EchoMode, TwoNodes, TwoNodesSpec, APP_PORT};
use ambit_netns_lab::peer::{IstioZtunnel, NodeProxy};
use ambit_netns_lab::wait_until;
use anyhow::{bail, Context};
use common::setup::{CLIENT, LOCAL, REMOTE, SOAK, SOAK_CLIENT};
use common::{setup, Cpu, Pcts, Proxies, Target};

/// The two implementations, in the order of every `[direct, ambit, Istio]` row. Both
/// allocate as they ship, with jemalloc; the driver itself uses the system allocator.
const IMPLS: [&str; 2] = ["ambit", "Istio"];

struct Args {
    ambit: PathBuf,
    peer: PathBuf,
    out: PathBuf,
    append: bool,
    only: Option<String>,
    rounds: usize,
    seconds: u64,
    round_trips: usize,
    soak_seconds: u64,
    soak_window: u64,
    idle_pods: usize,
    enroll_pods: usize,
    proxy_env: Vec<(String, String)>,
    title: String,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        ambit: PathBuf::new(),
        peer: PathBuf::new(),
        out: PathBuf::new(),
        append: false,
        only: None,
        rounds: 3,
        seconds: 5,
        round_trips: 2000,
        soak_seconds: 30,
        soak_window: 5,
        idle_pods: 50,
        enroll_pods: 10,
        proxy_env: Vec::new(),
        title: "each with its own defaults".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--ambit" => a.ambit = val()?.into(),
            "--peer" => a.peer = val()?.into(),
            "--out" => a.out = val()?.into(),
            "--append" => a.append = true,
            "--only" => a.only = Some(val()?),
            "--rounds" => a.rounds = val()?.parse().context("--rounds")?,
            "--seconds" => a.seconds = val()?.parse().context("--seconds")?,
            "--round-trips" => a.round_trips = val()?.parse().context("--round-trips")?,
            "--soak-seconds" => a.soak_seconds = val()?.parse().context("--soak-seconds")?,
            "--soak-window" => a.soak_window = val()?.parse().context("--soak-window")?,
            "--idle-pods" => a.idle_pods = val()?.parse().context("--idle-pods")?,
            "--enroll-pods" => a.enroll_pods = val()?.parse().context("--enroll-pods")?,
            "--proxy-env" => a
                .proxy_env
                .push(ambit_netns_lab::parse_env_pair(&val()?).map_err(anyhow::Error::msg)?),
            "--title" => a.title = val()?,
            "-h" | "--help" => {
                println!("usage: see the top of crates/ambit/examples/bench_peer.rs");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (see --help)"),
        }
    }
    if a.ambit.as_os_str().is_empty()
        || a.peer.as_os_str().is_empty()
        || a.out.as_os_str().is_empty()
    {
        bail!("--ambit PATH, --peer DIR and --out FILE are required");
    }
    if let Some(m) = &a.only {
        if m != "dedicated" && m != "inpod" {
            bail!("--only takes dedicated or inpod");
        }
    }
    a.rounds = a.rounds.clamp(1, 20);
    a.seconds = a.seconds.clamp(1, 60);
    a.round_trips = a.round_trips.clamp(100, 1_000_000);
    a.soak_seconds = a.soak_seconds.clamp(2, 600);
    a.soak_window = a.soak_window.clamp(1, a.soak_seconds / 2);
    a.idle_pods = a.idle_pods.clamp(1, 200);
    a.enroll_pods = a.enroll_pods.clamp(1, 40);
    Ok(a)
}

// ---------------------------------------------------------------------------------------
// Figures and their rounds.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// Higher is better (Gbit/s, connections/s); there is a direct value.
    Rate,
    /// Added latency in µs (proxied minus direct); lower is better.
    Added,
    /// A cost of the proxy alone (CPU s/GB, MiB, ms); lower is better; no direct value.
    Cost,
}

struct Figure {
    name: String,
    unit: &'static str,
    kind: Kind,
    /// Per round: [direct, ambit, Istio] (direct is NaN for costs; for added latency the
    /// direct latency itself, the others the proxied latency).
    rounds: Vec<[f64; 3]>,
    /// What the reader must know beside the figure (failed connections, a single sample).
    notes: Vec<String>,
}

/// The values a round had: NaN stands for one it did not have (direct, for a cost), or a
/// ratio that means nothing.
fn finite(v: &[f64]) -> Vec<f64> {
    v.iter().copied().filter(|x| x.is_finite()).collect()
}

/// The median of the finite values (`ambit_netns_lab::stats::median`); NaN for none.
fn median(v: Vec<f64>) -> f64 {
    ambit_netns_lab::stats::median(&finite(&v))
}

/// The lowest and highest of the finite values.
fn spread(v: &[f64]) -> (f64, f64) {
    ambit_netns_lab::stats::spread(&finite(v))
}

impl Figure {
    fn new(name: impl Into<String>, unit: &'static str, kind: Kind) -> Figure {
        Figure {
            name: name.into(),
            unit,
            kind,
            rounds: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Rounds whose ratio means nothing and is left out of the median, and why.
    fn left_out(&self) -> Option<String> {
        let out: Vec<usize> = self
            .ratios()
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_finite())
            .map(|(i, _)| i + 1)
            .collect();
        if out.is_empty() {
            return None;
        }
        let why = match self.kind {
            Kind::Added => "an added latency not above zero (either implementation's)",
            Kind::Rate | Kind::Cost => "Istio's value was zero",
        };
        Some(format!(
            "round(s) {out:?} of {} left out of the ratio: {why}",
            self.rounds.len()
        ))
    }

    /// The value a round shows for implementation `i` (0 ambit, 1 Istio).
    fn value(&self, r: &[f64; 3], i: usize) -> f64 {
        match self.kind {
            Kind::Added => r[1 + i] - r[0],
            _ => r[1 + i],
        }
    }

    fn values(&self, i: usize) -> Vec<f64> {
        self.rounds.iter().map(|r| self.value(r, i)).collect()
    }

    /// ambit / Istio, per round; NaN (left out of the median) where the ratio means nothing.
    fn ratios(&self) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|r| {
                let (a, b) = (self.value(r, 0), self.value(r, 1));
                // A round where Istio's rate fell to nothing (its connections failed
                // throughout the window) has no meaningful ratio; nor has one where either
                // added latency is not above zero (noise larger than the cost): both sides
                // are treated alike, so a negative ambit figure never counts in its favour.
                let too_small = match self.kind {
                    Kind::Added => a <= 0.0 || b <= 0.0,
                    Kind::Rate | Kind::Cost => b <= 0.0,
                };
                if too_small {
                    f64::NAN
                } else {
                    a / b
                }
            })
            .collect()
    }

    /// proxied / direct, per round, for implementation `i` (rates only).
    fn of_direct(&self, i: usize) -> Vec<f64> {
        self.rounds.iter().map(|r| r[1 + i] / r[0]).collect()
    }

    /// Whether ambit is at least as good as Istio, by the median of the per-round ratios.
    /// With every round left out there is no ratio to judge by: no verdict, never a pass
    /// (a ratio of the values' medians would be one of noise, and of a negative added
    /// latency a negative number, "better" whichever side it favours).
    fn verdict(&self) -> Verdict {
        let r = median(self.ratios());
        if !r.is_finite() {
            return Verdict::NoData;
        }
        let not_worse = match self.kind {
            Kind::Rate => r >= 1.0,
            Kind::Added | Kind::Cost => r <= 1.0,
        };
        if not_worse {
            Verdict::NotWorse
        } else {
            Verdict::Worse
        }
    }
}

/// What a figure says of ambit against Istio.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verdict {
    NotWorse,
    Worse,
    /// Every round was left out of the ratio ([`Figure::left_out`] says why).
    NoData,
}

impl Verdict {
    fn text(self) -> &'static str {
        match self {
            Verdict::NotWorse => "yes",
            Verdict::Worse => "**no**",
            Verdict::NoData => "**no data**",
        }
    }
}

fn num(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    match unit {
        "Gbit/s" => format!("{v:.2}"),
        "s/GB" | "MiB" => format!("{v:.2}"),
        _ => format!("{v:.0}"),
    }
}

fn with_spread(values: &[f64], fmt: impl Fn(f64) -> String) -> String {
    let (lo, hi) = spread(values);
    if values.len() < 2 || !lo.is_finite() {
        return fmt(median(values.to_vec()));
    }
    format!("{} ({}–{})", fmt(median(values.to_vec())), fmt(lo), fmt(hi))
}

fn ratio_text(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}×")
    } else {
        "n/a".into()
    }
}

fn pct_text(x: f64) -> String {
    if x.is_finite() {
        format!("{:.0} %", 100.0 * x)
    } else {
        "n/a".into()
    }
}

fn render(title: &str, figures: &[Figure]) -> String {
    let mut s = format!(
        "\n{title}\n\n| figure | direct | ambit | Istio | ambit / direct | Istio / direct | ambit / Istio | ambit not worse |\n|---|---:|---:|---:|---:|---:|---:|---|\n"
    );
    for f in figures {
        let unit = f.unit;
        let direct = match f.kind {
            Kind::Cost => "—".to_string(),
            _ => format!(
                "{} {unit}",
                num(median(f.rounds.iter().map(|r| r[0]).collect()), unit)
            ),
        };
        let shown = |i: usize| {
            let prefix = if f.kind == Kind::Added { "+" } else { "" };
            format!(
                "{prefix}{} {unit}",
                with_spread(&f.values(i), |v| num(v, unit))
            )
        };
        let (of_a, of_i) = match f.kind {
            Kind::Rate => (
                with_spread(&f.of_direct(0), pct_text),
                with_spread(&f.of_direct(1), pct_text),
            ),
            _ => ("—".into(), "—".into()),
        };
        let _ = writeln!(
            s,
            "| {} | {direct} | {} | {} | {of_a} | {of_i} | {} | {} |",
            f.name,
            shown(0),
            shown(1),
            with_spread(&f.ratios(), ratio_text),
            f.verdict().text()
        );
    }
    let notes: Vec<String> = figures
        .iter()
        .flat_map(|f| {
            f.left_out()
                .into_iter()
                .chain(f.notes.iter().cloned())
                .map(move |n| format!("- {}: {n}", f.name))
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(s, "\n{}", notes.join("\n"));
    }
    s
}

// ---------------------------------------------------------------------------------------
// The workloads, both implementations per round.

/// What the suite needs of one implementation's lab.
struct Side<'a> {
    target: Target<'a>,
    proxies: Proxies,
}

/// The order of the two implementations in round `r`: alternating.
fn order(r: usize) -> [usize; 2] {
    if r.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// Throughput, latency and connection rate for both, interleaved; `label` names the path.
/// `two_proxies`: the path crosses a second (server-side) proxy whose CPU counts.
fn suite(
    sides: &[Side; 2],
    label: &str,
    two_proxies: bool,
    args: &Args,
    figures: &mut Vec<Figure>,
) -> anyhow::Result<()> {
    let secs = args.seconds;
    for streams in [1u32, 4] {
        let what = format!(
            "{label}: throughput, {streams} stream{}",
            if streams > 1 { "s" } else { "" }
        );
        let mut tput = Figure::new(&what, "Gbit/s", Kind::Rate);
        let mut cpu_c = Figure::new(
            format!(
                "{what}: {} CPU",
                if two_proxies {
                    "client-side proxy"
                } else {
                    "the node proxy"
                }
            ),
            "s/GB",
            Kind::Cost,
        );
        let mut cpu_s = Figure::new(format!("{what}: server-side proxy CPU"), "s/GB", Kind::Cost);
        for r in 0..args.rounds {
            println!("{what}, round {} ...", r + 1);
            let t = &sides[0].target;
            let direct =
                common::iperf(t.client_ns, t.server_ip, t.direct_iperf_port, streams, secs)?;
            let mut row = [direct, 0.0, 0.0];
            let mut crow = [f64::NAN; 3];
            let mut srow = [f64::NAN; 3];
            for i in order(r) {
                let t = &sides[i].target;
                let (bps, cpu): (f64, Cpu) = sides[i].proxies.measure(|| {
                    common::iperf(t.client_ns, t.server_ip, t.mesh_iperf_port, streams, secs)
                })?;
                let gb = bps * secs as f64 / 8.0 / 1e9;
                row[1 + i] = bps / 1e9;
                crow[1 + i] = cpu.client / gb;
                srow[1 + i] = cpu.server / gb;
            }
            row[0] /= 1e9;
            println!(
                "  direct {:.2}, ambit {:.2}, Istio {:.2} Gbit/s",
                row[0], row[1], row[2]
            );
            tput.rounds.push(row);
            cpu_c.rounds.push(crow);
            cpu_s.rounds.push(srow);
        }
        figures.extend([tput, cpu_c]);
        if two_proxies {
            figures.push(cpu_s);
        }
    }
    for size in [64usize, 1024] {
        let what = format!(
            "{label}: request/response {}, reused connection",
            if size == 64 { "64 B" } else { "1 KiB" }
        );
        let mut p50 = Figure::new(format!("{what}, added p50"), "µs", Kind::Added);
        let mut p99 = Figure::new(format!("{what}, added p99"), "µs", Kind::Added);
        for r in 0..args.rounds {
            let t = &sides[0].target;
            let direct: Pcts =
                common::round_trips(t.client_ns, t.direct_echo(), size, args.round_trips)?;
            let mut r50 = [direct.p50, 0.0, 0.0];
            let mut r99 = [direct.p99, 0.0, 0.0];
            for i in order(r) {
                let t = &sides[i].target;
                let m = common::round_trips(t.client_ns, t.mesh_echo(), size, args.round_trips)?;
                r50[1 + i] = m.p50;
                r99[1 + i] = m.p99;
            }
            println!(
                "{what}, round {}: p50 direct {:.0}, ambit {:.0}, Istio {:.0} µs",
                r + 1,
                r50[0],
                r50[1],
                r50[2]
            );
            p50.rounds.push(r50);
            p99.rounds.push(r99);
        }
        figures.extend([p50, p99]);
    }
    for concurrency in [1usize, 8] {
        let what = format!("{label}: new connections, concurrency {concurrency}");
        let mut rate = Figure::new(&what, "/s", Kind::Rate);
        let mut failed = [0u64; 2];
        for r in 0..args.rounds {
            let t = &sides[0].target;
            let direct = common::connection_rate(t.client_ns, t.direct_echo(), concurrency, secs)?;
            let mut row = [direct.per_second, 0.0, 0.0];
            for i in order(r) {
                let t = &sides[i].target;
                let m = common::connection_rate(t.client_ns, t.mesh_echo(), concurrency, secs)?;
                if m.errors > 0 {
                    println!("  {}: {} failed connections", IMPLS[i], m.errors);
                }
                failed[i] += m.errors as u64;
                row[1 + i] = m.per_second;
            }
            println!(
                "{what}, round {}: direct {:.0}, ambit {:.0}, Istio {:.0}/s",
                r + 1,
                row[0],
                row[1],
                row[2]
            );
            rate.rounds.push(row);
        }
        if failed.iter().any(|n| *n > 0) {
            rate.notes.push(format!(
                "failed connections over the {} rounds (not counted in the rate): ambit {}, Istio {}",
                args.rounds, failed[0], failed[1]
            ));
        }
        figures.push(rate);
    }
    Ok(())
}

/// RSS of each side's two proxies, as cost figures: (client-side, server-side).
fn rss(
    sides: &[&Proxies; 2],
    field: &str,
    label: &str,
    figures: &mut Vec<Figure>,
) -> anyhow::Result<()> {
    let mut c = Figure::new(format!("{label}, client-side proxy"), "MiB", Kind::Cost);
    let mut s = Figure::new(format!("{label}, server-side proxy"), "MiB", Kind::Cost);
    let (a, i) = (sides[0].status_kib(field)?, sides[1].status_kib(field)?);
    c.rounds
        .push([f64::NAN, a.0 as f64 / 1024.0, i.0 as f64 / 1024.0]);
    s.rounds
        .push([f64::NAN, a.1 as f64 / 1024.0, i.1 as f64 / 1024.0]);
    for f in [&mut c, &mut s] {
        f.notes.push(format!(
            "one sample ({field} of each proxy), not a median of rounds"
        ));
    }
    figures.extend([c, s]);
    Ok(())
}

fn env_of(args: &Args) -> Vec<(&str, String)> {
    args.proxy_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect()
}

fn dedicated(impls: &[NodeProxy; 2], args: &Args) -> anyhow::Result<Vec<Figure>> {
    let env = env_of(args);
    let mut labs = Vec::new();
    for (proxy, tag) in impls.iter().zip(["bp-dedicated-a", "bp-dedicated-i"]) {
        labs.push(
            TwoNodes::launch(TwoNodesSpec {
                env: &env,
                ..TwoNodesSpec::pair(tag, proxy)
            })
            .with_context(|| format!("starting the {} pair", proxy.label()))?,
        );
    }
    ambit_netns_lab::remove_all_on_signal(labs.iter().map(|l| l.lab.cleanup_handle()).collect());
    let proxies: Vec<Proxies> = labs
        .iter()
        .map(|n| Proxies {
            client: n.client_proxy.pid,
            server: n.server_proxy.pid,
        })
        .collect();
    for (p, proxy) in proxies.iter().zip(impls) {
        common::check_comm(p.client, proxy.comm())?;
        common::check_comm(p.server, proxy.comm())?;
    }
    let mut figures = Vec::new();
    rss(
        &[&proxies[0], &proxies[1]],
        "VmRSS",
        "idle RSS right after start",
        &mut figures,
    )?;
    let mut sides = Vec::new();
    for (nodes, p) in labs.iter().zip(&proxies) {
        sides.push(Side {
            target: setup::dedicated_paths(nodes)?,
            proxies: *p,
        });
    }
    let sides: [Side; 2] = sides.try_into().map_err(|_| anyhow::anyhow!("two sides"))?;
    suite(&sides, "dedicated, two nodes", true, args, &mut figures)?;
    rss(
        &[&proxies[0], &proxies[1]],
        "VmHWM",
        "peak RSS (VmHWM)",
        &mut figures,
    )?;
    Ok(figures)
}

// ---------------------------------------------------------------------------------------
// In-pod mode.

fn inpod(
    ambit: &std::path::Path,
    impls: &[NodeProxy; 2],
    args: &Args,
) -> anyhow::Result<(Vec<Figure>, Vec<String>)> {
    let setup::InpodPods {
        specs,
        idle,
        enroll,
        running,
        running_node1,
    } = setup::inpod_pods(args.idle_pods, args.enroll_pods);
    let env = env_of(args);
    let mut clusters = Vec::new();
    for (proxy, tag) in impls.iter().zip(["bp-inpod-a", "bp-inpod-i"]) {
        let c = Cluster::launch(ClusterSpec {
            ambit,
            tag,
            node_proxies: vec![proxy.clone(), proxy.clone()],
            pods: &specs,
            create: running,
            extra_yaml: "",
            proxy_env: &env,
            control: None,
        })
        .with_context(|| format!("starting the {} cluster", proxy.label()))?;
        clusters.push(c);
    }
    ambit_netns_lab::remove_all_on_signal(
        clusters.iter().map(|c| c.lab.cleanup_handle()).collect(),
    );
    let pid = |c: &Cluster, node: usize| -> anyhow::Result<u32> {
        Ok(c.nodes[node].ztunnel.as_ref().context("no node proxy")?.pid)
    };
    let mut proxies = Vec::new();
    for (c, proxy) in clusters.iter().zip(impls) {
        let p = Proxies {
            client: pid(c, 0)?,
            server: pid(c, 1)?,
        };
        common::check_comm(p.client, proxy.comm())?;
        common::check_comm(p.server, proxy.comm())?;
        proxies.push(p);
    }
    let mut figures = Vec::new();
    let mut notes = Vec::new();
    rss(
        &[&proxies[0], &proxies[1]],
        "VmRSS",
        &format!("in-pod: idle RSS with {running} pods"),
        &mut figures,
    )?;

    // Memory per idle enrolled pod, node1 of each, before any traffic.
    let mut per_pod = Figure::new(
        format!(
            "in-pod: memory per idle enrolled pod ({} pods)",
            args.idle_pods
        ),
        "KiB",
        Kind::Cost,
    );
    let mut row = [f64::NAN; 3];
    for (i, c) in clusters.iter_mut().enumerate() {
        println!(
            "in-pod: enrolling {} idle pods with {} ...",
            args.idle_pods, IMPLS[i]
        );
        let before = common::status_kib(proxies[i].client, "VmRSS")?;
        for spec in &idle {
            c.add_pod(spec)?;
        }
        let expected = (running_node1 + args.idle_pods) as u64;
        wait_until(
            "the node proxy to serve every idle pod",
            Duration::from_secs(60),
            || setup::active_proxies(c, 0) == Some(expected),
        )?;
        std::thread::sleep(Duration::from_secs(2));
        let after = common::status_kib(proxies[i].client, "VmRSS")?;
        row[1 + i] = (after as f64 - before as f64) / args.idle_pods as f64;
    }
    per_pod.rounds.push(row);
    per_pod.notes.push(
        "one sample per implementation (the RSS growth of enrolling the pods once, divided by their number), not a median of rounds".into(),
    );
    figures.push(per_pod);

    for c in &clusters {
        setup::inpod_paths(c, CLIENT, &[LOCAL, REMOTE])?;
        for ns in [&c.pod(CLIENT).ns, &c.pod(SOAK_CLIENT).ns] {
            c.lab
                .exec(ns, &["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])?;
        }
    }

    // Enrollment: CNI ADD to the first byte through both proxies, one pod of each in turn.
    let mut enroll_fig = Figure::new(
        "in-pod: CNI ADD to the first byte proxied",
        "ms",
        Kind::Cost,
    );
    for (n, spec) in enroll.iter().enumerate() {
        let mut row = [f64::NAN; 3];
        for i in order(n) {
            let c = &mut clusters[i];
            let t0 = Instant::now();
            let idx = c.add_pod(spec)?;
            drop(c.serve_app(&spec.name, APP_PORT, EchoMode::Mirror)?);
            let dst = SocketAddr::from((c.pods[idx].ip, APP_PORT));
            let client_ns = c.pod(CLIENT).ns.clone();
            setup::first_byte(&client_ns, dst, t0)
                .with_context(|| format!("{}: first byte to {}", IMPLS[i], spec.name))?;
            row[1 + i] = t0.elapsed().as_secs_f64() * 1e3;
        }
        enroll_fig.rounds.push(row);
    }
    figures.push(enroll_fig);

    for (label, server, two_proxies) in [
        ("in-pod, one node", LOCAL, false),
        ("in-pod, two nodes", REMOTE, true),
    ] {
        let sides = [
            Side {
                target: setup::inpod_target(&clusters[0], CLIENT, server),
                proxies: proxies[0],
            },
            Side {
                target: setup::inpod_target(&clusters[1], CLIENT, server),
                proxies: proxies[1],
            },
        ];
        suite(&sides, label, two_proxies, args, &mut figures)?;
    }

    // Soak: concurrency 8, two nodes, original source on (the in-pod default of both).
    let windows = (args.soak_seconds / args.soak_window) as usize;
    let mut first = Figure::new(
        format!("in-pod soak, concurrency 8, first {} s", args.soak_window),
        "/s",
        Kind::Rate,
    );
    let mut last = Figure::new(
        format!("in-pod soak, concurrency 8, last {} s", args.soak_window),
        "/s",
        Kind::Rate,
    );
    for (i, c) in clusters.iter().enumerate() {
        // Original source: the soak app sees the client pod's own address.
        let seen = c.serve_app(SOAK, APP_PORT, EchoMode::Mirror)?;
        let dst = SocketAddr::from((c.pod(SOAK).ip, APP_PORT));
        common::round_trips(&c.pod(SOAK_CLIENT).ns, dst, 64, 10)?;
        let peer = seen
            .recv_timeout(Duration::from_secs(5))
            .context("the soak app saw nothing")?;
        if peer.ip() != std::net::IpAddr::from(c.pod(SOAK_CLIENT).ip) {
            notes.push(format!(
                "{}: original source NOT preserved in the soak (the app saw {})",
                IMPLS[i],
                peer.ip()
            ));
        }
    }
    // The direct baseline is taken between the soak's own two pods.
    let direct_soak = setup::direct_echo_between(&clusters[0], SOAK_CLIENT, SOAK)?;
    for r in 0..args.rounds.max(2) {
        let mut f = [f64::NAN; 3];
        let mut l = [f64::NAN; 3];
        for i in order(r) {
            let c = &clusters[i];
            let dst = SocketAddr::from((c.pod(SOAK).ip, APP_PORT));
            println!(
                "in-pod soak, round {}, {} ({} s) ...",
                r + 1,
                IMPLS[i],
                args.soak_seconds
            );
            let soak = common::sustained_connection_rate(
                &c.pod(SOAK_CLIENT).ns,
                dst,
                8,
                args.soak_seconds,
                args.soak_window,
                None,
            )?;
            if soak.errors > 0 {
                notes.push(format!(
                    "{} soak round {}: {} failed connections",
                    IMPLS[i],
                    r + 1,
                    soak.errors
                ));
            }
            f[1 + i] = soak.windows.first().map_or(f64::NAN, |w| w.per_second);
            l[1 + i] = soak
                .windows
                .get(windows.saturating_sub(1))
                .map_or(f64::NAN, |w| w.per_second);
            println!("  first {:.0}/s, last {:.0}/s", f[1 + i], l[1 + i]);
        }
        // The direct rate at concurrency 8 between the same two pods, for the ratio.
        let c = &clusters[0];
        let d = common::connection_rate(&c.pod(SOAK_CLIENT).ns, direct_soak, 8, args.seconds)?;
        f[0] = d.per_second;
        l[0] = d.per_second;
        first.rounds.push(f);
        last.rounds.push(l);
    }
    figures.extend([first, last]);
    rss(
        &[&proxies[0], &proxies[1]],
        "VmHWM",
        "in-pod: peak RSS (VmHWM)",
        &mut figures,
    )?;
    Ok((figures, notes))
}

// ---------------------------------------------------------------------------------------

fn targets(figures: &[Figure]) -> String {
    let find = |prefix: &str| figures.iter().find(|f| f.name.starts_with(prefix));
    let mut s = String::from("\n| aim (ambit / Istio, median of the per-round ratios) | threshold | measured | met? |\n|---|---|---|---|\n");
    let mut row = |what: &str, fig: Option<&Figure>, threshold: &str, ok: &dyn Fn(f64) -> bool| {
        if let Some(f) = fig {
            let r = median(f.ratios());
            let _ = writeln!(
                s,
                "| {what} | {threshold} | {} | {} |",
                ratio_text(r),
                if ok(r) { "yes" } else { "**no**" }
            );
        }
    };
    row(
        "single-stream throughput, dedicated",
        find("dedicated, two nodes: throughput, 1 stream"),
        "≥ 1.3×",
        &|r| r >= 1.3,
    );
    row(
        "added p50, 64 B, dedicated",
        find("dedicated, two nodes: request/response 64 B, reused connection, added p50"),
        "≤ 0.7×",
        &|r| r <= 0.7,
    );
    row(
        "new connections, concurrency 8, dedicated",
        find("dedicated, two nodes: new connections, concurrency 8"),
        "≥ 2×",
        &|r| r >= 2.0,
    );
    row(
        "client-side CPU per GB, 1 stream, dedicated",
        find("dedicated, two nodes: throughput, 1 stream: client-side"),
        "≤ 0.7×",
        &|r| r <= 0.7,
    );
    row(
        "server-side CPU per GB, 1 stream, dedicated",
        find("dedicated, two nodes: throughput, 1 stream: server-side"),
        "≤ 0.7×",
        &|r| r <= 0.7,
    );
    row(
        "idle RSS, dedicated (client-side proxy)",
        find("idle RSS right after start, client-side"),
        "≤ 0.5×",
        &|r| r <= 0.5,
    );
    let count = |v: Verdict| figures.iter().filter(|f| f.verdict() == v).count();
    let (worse, no_data) = (count(Verdict::Worse), count(Verdict::NoData));
    let _ = writeln!(
        s,
        "| no figure worse than Istio's | every ratio ≥ 1 (rates) or ≤ 1 (latency, CPU, memory) | {worse} of {} figures worse, {no_data} without a ratio | {} |",
        figures.len(),
        if worse == 0 && no_data == 0 { "yes" } else { "**no**" }
    );
    s
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let ambit = std::fs::canonicalize(&args.ambit)
        .with_context(|| format!("no ambit binary at {}", args.ambit.display()))?;
    let peer = IstioZtunnel::find(&args.peer)?;
    ambit_netns_lab::require_tool("iperf3", "iperf3")?;
    ambit_netns_lab::require_tool("ss", "iproute2")?;
    let machine = common::machine();
    let peer_version = std::process::Command::new(&peer.bin)
        .arg("version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default();
    println!(
        "machine: {machine}\nambit: {}\nIstio's ztunnel: {} ({peer_version})",
        ambit.display(),
        peer.bin.display()
    );
    let impls = [NodeProxy::Ambit(ambit.clone()), NodeProxy::Istio(peer)];
    let mut text = String::new();
    if args.append {
        text.push('\n');
    }
    let env_text = if args.proxy_env.is_empty() {
        "no extra environment: ambit's default worker threads (a quarter of the CPUs, at least one) and Istio's (a quarter, at least two)".to_string()
    } else {
        format!(
            "both with {}",
            args.proxy_env
                .iter()
                .map(|(k, v)| format!("`{k}={v}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let _ = write!(
        text,
        "## ambit beside Istio's ztunnel ({})\n\nMachine: {machine}.\nIstio's ztunnel: {peer_version}; ambit {}; both with jemalloc; {env_text}. Both in the same lab layout, one lab per implementation up at once; every figure in {} interleaved rounds (direct first, then the two proxies, the order alternating) unless a note under its table says otherwise (the memory figures are single samples; the soak runs at least two rounds), {} s per throughput and connection-rate run, {} round trips per latency run. Each cell: the median of the rounds, (lowest–highest).\n",
        args.title,
        ambit_runtime::version::VERSION,
        args.rounds,
        args.seconds,
        args.round_trips
    );
    let mut all = Vec::new();
    if args.only.as_deref() != Some("inpod") {
        let figures = dedicated(&impls, &args)?;
        text.push_str(&render("### Dedicated mode, two nodes", &figures));
        all.extend(figures);
    }
    if args.only.as_deref() != Some("dedicated") {
        let (figures, notes) = inpod(&ambit, &impls, &args)?;
        text.push_str(&render(
            &format!("### In-pod mode (ambit's node agent and CNI plugin on both; a {} s soak in windows of {} s)", args.soak_seconds, args.soak_window),
            &figures,
        ));
        for n in notes {
            let _ = writeln!(text, "- {n}");
        }
        all.extend(figures);
    }
    text.push_str("\n### Aims\n");
    text.push_str(&targets(&all));
    println!("\n{text}");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(args.append)
        .truncate(!args.append)
        .open(&args.out)
        .with_context(|| format!("opening {}", args.out.display()))?;
    file.write_all(text.as_bytes())?;
    println!("written to {}", args.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(kind: Kind, rounds: &[[f64; 3]]) -> Figure {
        Figure {
            rounds: rounds.to_vec(),
            ..Figure::new("f", "µs", kind)
        }
    }

    #[test]
    fn the_median_ratio_decides() {
        let added = |ambit: f64, istio: f64| [100.0, 100.0 + ambit, 100.0 + istio];
        let f = figure(
            Kind::Added,
            &[added(10.0, 20.0), added(30.0, 20.0), added(5.0, 20.0)],
        );
        assert_eq!(f.verdict(), Verdict::NotWorse);
        let f = figure(Kind::Added, &[added(30.0, 20.0), added(40.0, 20.0)]);
        assert_eq!(f.verdict(), Verdict::Worse);
        let f = figure(
            Kind::Rate,
            &[[10.0, 9.0, 8.0], [10.0, 7.0, 8.0], [10.0, 9.0, 8.5]],
        );
        assert_eq!(f.verdict(), Verdict::NotWorse);
        // A round left out does not count; the others decide.
        let f = figure(Kind::Added, &[added(-3.0, 20.0), added(30.0, 20.0)]);
        assert_eq!(f.verdict(), Verdict::Worse);
    }

    #[test]
    fn every_round_left_out_is_no_data_never_not_worse() {
        let added = |ambit: f64, istio: f64| [100.0, 100.0 + ambit, 100.0 + istio];
        // ambit's added latency below zero (noise): left out, a ratio of -0.5 once.
        let f = figure(Kind::Added, &[added(-10.0, 20.0), added(-5.0, 20.0)]);
        assert_eq!(f.verdict(), Verdict::NoData);
        // Istio's below zero while ambit adds 40 µs: a negative ratio, again not a pass.
        let f = figure(Kind::Added, &[added(40.0, -5.0), added(40.0, -1.0)]);
        assert_eq!(f.verdict(), Verdict::NoData);
        // Istio's rate zero every round.
        let f = figure(Kind::Rate, &[[10.0, 9.0, 0.0], [10.0, 9.0, 0.0]]);
        assert_eq!(f.verdict(), Verdict::NoData);
        assert!(f
            .left_out()
            .is_some_and(|w| w.contains("round(s) [1, 2] of 2")));
        // The aims table counts it against "no figure worse".
        let table = targets(&[f]);
        assert!(
            table.contains("0 of 1 figures worse, 1 without a ratio | **no** |"),
            "{table}"
        );
    }
}
