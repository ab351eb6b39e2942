//! End-to-end benchmark driver for in-pod mode: two lab "nodes" (network namespaces joined
//! by a veth pair), each running the node agent and a release-build node proxy in shared
//! mode, with pods created through the real CNI chain (`bridge` + `host-local` +
//! `ambit-cni`). Every proxied figure is measured in the same run as the direct path between
//! the same two pod namespaces over the same bridge(s) and veth, uncaptured.
//!
//! ```text
//! bench_inpod --ambit target/release/ambit --out bench-results.md [--append] [--seconds 5]
//!     [--round-trips 5000] [--idle-pods 100] [--enroll-pods 10] [--soak-seconds 60]
//!     [--soak-window 10] [--server-tw-reuse]
//! ```
//!
//! Usually started by `scripts/bench` after the dedicated-mode driver (`bench_e2e`), with
//! `--append`. Needs root (network namespaces, iptables), iperf3 and the Debian package
//! containernetworking-plugins. Everything it creates is removed when it ends.
//!
//! Phases, in this order (see BENCHMARKS.md):
//! 1. memory: node proxy RSS with the first pods, then with `--idle-pods` more idle pods
//!    enrolled through CNI ADD on the same node; the difference per pod;
//! 2. enrollment: for each of `--enroll-pods` new pods, the time from the start of CNI ADD
//!    to the first byte echoed by the new pod's app to a client in another pod (polled);
//! 3. the dedicated-mode suite (iperf3 1 and 4 streams, 64 B / 1 KiB round trips, new
//!    connections at concurrency 1 and 8) between two pods on ONE node (one node proxy),
//!    then between two pods on TWO nodes, each against the direct path;
//! 4. soak: new connections at concurrency 8 for `--soak-seconds` between two pods on two
//!    nodes, original-source preservation on (the in-pod default), the rate per window and
//!    the TIME_WAIT sockets in the server pod.

mod common;

use std::fmt::Write as _;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ambit_netns_lab::cluster::Cluster;
use ambit_netns_lab::mesh::{EchoMode, APP_PORT};
use ambit_netns_lab::wait_until;
use anyhow::{bail, Context};
use common::setup;
use common::setup::{CLIENT, LOCAL, REMOTE, SOAK, SOAK_CLIENT};
use common::{mib, pct, yes, Columns, Proxies, Report};

struct Args {
    ambit: PathBuf,
    out: PathBuf,
    append: bool,
    seconds: u64,
    round_trips: usize,
    idle_pods: usize,
    enroll_pods: usize,
    soak_seconds: u64,
    soak_window: u64,
    server_tw_reuse: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut ambit = None;
    let mut out = None;
    let mut append = false;
    let mut seconds = 5;
    let mut round_trips = 5000;
    let mut idle_pods = 100;
    let mut enroll_pods = 10;
    let mut soak_seconds = 60;
    let mut soak_window = 10;
    let mut server_tw_reuse = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--ambit" => ambit = Some(PathBuf::from(val()?)),
            "--out" => out = Some(PathBuf::from(val()?)),
            "--append" => append = true,
            "--seconds" => seconds = val()?.parse().context("--seconds")?,
            "--round-trips" => round_trips = val()?.parse().context("--round-trips")?,
            "--idle-pods" => idle_pods = val()?.parse().context("--idle-pods")?,
            "--enroll-pods" => enroll_pods = val()?.parse().context("--enroll-pods")?,
            "--soak-seconds" => soak_seconds = val()?.parse().context("--soak-seconds")?,
            "--soak-window" => soak_window = val()?.parse().context("--soak-window")?,
            "--server-tw-reuse" => server_tw_reuse = true,
            "-h" | "--help" => {
                println!(
                    "usage: bench_inpod --ambit PATH --out FILE [--append] [--seconds N (5)] [--round-trips N (5000)] [--idle-pods N (100)] [--enroll-pods N (10)] [--soak-seconds N (60)] [--soak-window N (10)] [--server-tw-reuse]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (see --help)"),
        }
    }
    let soak_seconds = soak_seconds.clamp(1, 600);
    Ok(Args {
        ambit: ambit.context("--ambit PATH (the release build of ambit) is required")?,
        out: out.context("--out FILE is required")?,
        append,
        seconds: seconds.clamp(1, 60),
        round_trips: round_trips.clamp(100, 1_000_000),
        // host-local hands out .10 to .254 of each node's /24; 4 pods run from the start.
        idle_pods: idle_pods.clamp(1, 200),
        enroll_pods: enroll_pods.clamp(1, 40),
        soak_seconds,
        soak_window: soak_window.clamp(1, soak_seconds),
        server_tw_reuse,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The median (`ambit_netns_lab::stats::median`) and the maximum of `v`.
fn p50_max(v: &[Duration]) -> (Duration, Duration) {
    if v.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    let secs: Vec<f64> = v.iter().map(Duration::as_secs_f64).collect();
    let median = Duration::from_secs_f64(ambit_netns_lab::stats::median(&secs));
    (median, v.iter().copied().max().unwrap_or_default())
}

/// TIME_WAIT sockets in a namespace, the way `ss -tan state time-wait | wc -l` counts them
/// (without the header line).
fn time_wait(cluster: &Cluster, ns: &str) -> anyhow::Result<usize> {
    let out = cluster
        .lab
        .exec(ns, &["ss", "-Htan", "state", "time-wait"])?;
    Ok(out.lines().filter(|l| !l.trim().is_empty()).count())
}

/// The kernel's TIME_WAIT count of a namespace (`tw` in /proc/net/sockstat): cheap enough
/// to sample during the soak.
fn sockstat_tw(cluster: &Cluster, ns: &str) -> Option<u64> {
    let text = cluster.lab.exec(ns, &["cat", "/proc/net/sockstat"]).ok()?;
    let tcp = text.lines().find(|l| l.starts_with("TCP:"))?;
    let words: Vec<&str> = tcp.split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "tw")
        .and_then(|i| words.get(i + 1)?.parse().ok())
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let ambit = std::fs::canonicalize(&args.ambit)
        .with_context(|| format!("no ambit binary at {}", args.ambit.display()))?;
    ambit_netns_lab::require_tool("iperf3", "iperf3")?;
    ambit_netns_lab::require_tool("ss", "iproute2")?;
    let machine = common::machine();
    println!("machine: {machine}");
    println!("node proxy: {}", ambit.display());

    // Every pod is in the mesh configuration from the start; only the first five are
    // created now. Per node, pods must be created in this order (host-local addresses).
    let setup::InpodPods {
        specs,
        idle,
        enroll,
        running,
        running_node1,
    } = setup::inpod_pods(args.idle_pods, args.enroll_pods);
    println!("starting two nodes (agent + node proxy each) and {running} pods ...");
    let mut cluster = Cluster::start_configured(&ambit, "bench-inpod", 2, &specs, running, "")
        .context("starting the in-pod lab")?;
    // Ctrl-C or SIGTERM: remove the namespaces and processes, then exit.
    ambit_netns_lab::remove_on_signal(cluster.lab.cleanup_handle());

    let pid = |node: usize| -> anyhow::Result<u32> {
        Ok(cluster.nodes[node]
            .ztunnel
            .as_ref()
            .context("no node proxy")?
            .pid)
    };
    let proxies = Proxies {
        client: pid(0)?,
        server: pid(1)?,
    };
    for pid in [proxies.client, proxies.server] {
        common::check_comm(pid, "ambit")?;
    }
    let idle_rss = proxies.status_kib("VmRSS")?;
    let idle_anon = proxies.status_kib("RssAnon")?;
    let idle_file = proxies.status_kib("RssFile")?;
    println!(
        "RSS with the first {running} pods: node1 proxy {} KiB, node2 proxy {} KiB",
        idle_rss.0, idle_rss.1
    );

    // ---- 1. Memory per idle enrolled pod (before any traffic).
    println!(
        "memory: enrolling {} idle pods on node1 ...",
        args.idle_pods
    );
    let before = (
        common::status_kib(proxies.client, "VmRSS")?,
        common::status_kib(proxies.client, "RssAnon")?,
    );
    let mut idle_adds = Vec::new();
    let t_idle = Instant::now();
    for spec in &idle {
        let t0 = Instant::now();
        cluster.add_pod(spec)?;
        idle_adds.push(t0.elapsed());
    }
    let idle_total = t_idle.elapsed();
    let expected = (running_node1 + args.idle_pods) as u64;
    wait_until(
        "node1's proxy to serve every idle pod",
        Duration::from_secs(30),
        || setup::active_proxies(&cluster, 0) == Some(expected),
    )?;
    // Let the listener tasks settle before reading the RSS.
    std::thread::sleep(Duration::from_secs(2));
    let after = (
        common::status_kib(proxies.client, "VmRSS")?,
        common::status_kib(proxies.client, "RssAnon")?,
    );
    let per_pod = (after.0 as f64 - before.0 as f64) / args.idle_pods as f64;
    let per_pod_anon = (after.1 as f64 - before.1 as f64) / args.idle_pods as f64;
    let (idle_add_p50, idle_add_max) = p50_max(&idle_adds);
    println!(
        "  node1 proxy RSS {} → {} KiB: {per_pod:.0} KiB per pod (CNI ADD p50 {}, max {})",
        before.0,
        after.0,
        ms(idle_add_p50),
        ms(idle_add_max)
    );

    // ---- Apps, the direct path, and checks.
    let client_ns = cluster.pod(CLIENT).ns.clone();
    // The load generator's own sockets (both paths) close first and stay in TIME_WAIT in
    // the client pod: let connect() reuse those ports after 1 s (the default only does so
    // on loopback), as in the dedicated-mode run. The server pods keep the kernel default
    // unless --server-tw-reuse: there only the node proxy's connections to the app (with
    // the client's address) wait in TIME_WAIT, and holding up under that is the point.
    let soak_client_ns = cluster.pod(SOAK_CLIENT).ns.clone();
    let mut tw_set = vec![client_ns.clone(), soak_client_ns.clone()];
    if args.server_tw_reuse {
        for pod in [LOCAL, REMOTE, SOAK] {
            tw_set.push(cluster.pod(pod).ns.clone());
        }
    }
    for ns in &tw_set {
        cluster
            .lab
            .exec(ns, &["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])?;
    }
    let default_tw = cluster
        .lab
        .exec(
            &cluster.pod(SOAK).ns,
            &["sysctl", "-n", "net.ipv4.tcp_tw_reuse"],
        )?
        .trim()
        .to_string();
    // The direct path: the same pods, links and bridges, with the direct ports exempted
    // from the in-pod capture; both paths checked (and the HBONE pools warmed).
    setup::inpod_paths(&cluster, CLIENT, &[LOCAL, REMOTE])?;
    let soak_seen = cluster.serve_app(SOAK, APP_PORT, EchoMode::Mirror)?;
    let soak_client_ip = cluster.pod(SOAK_CLIENT).ip;
    let local_ip = cluster.pod(LOCAL).ip;
    let remote_ip = cluster.pod(REMOTE).ip;
    let soak_dst = SocketAddr::from((cluster.pod(SOAK).ip, APP_PORT));

    common::round_trips(&soak_client_ns, soak_dst, 64, 100).context("echo to the soak pod")?;
    let soak_source = soak_seen
        .recv_timeout(Duration::from_secs(5))
        .context("the soak app saw no connection")?;
    drop(soak_seen);
    let orig_src = soak_source.ip() == std::net::IpAddr::V4(soak_client_ip);
    println!(
        "original source: the soak pod's app saw {} (client pod {soak_client_ip})",
        soak_source.ip()
    );

    // ---- 2. Enrollment: CNI ADD → first byte through the proxies to the new pod's app.
    println!("enrollment: {} pods on node2 ...", args.enroll_pods);
    let mut to_first_byte = Vec::new();
    let mut adds = Vec::new();
    let mut after_add = Vec::new();
    let mut attempts = Vec::new();
    // Each step of CNI ADD: creating the netns, then each plugin.
    let mut steps: Vec<(String, Vec<Duration>)> = Vec::new();
    for spec in &enroll {
        let t0 = Instant::now();
        let i = cluster.add_pod(spec)?;
        let added = t0.elapsed();
        // The app starts once the runtime has the pod's network, as a container would.
        drop(cluster.serve_app(&spec.name, APP_PORT, EchoMode::Mirror)?);
        let dst = SocketAddr::from((cluster.pods[i].ip, APP_PORT));
        for (step, took) in &cluster.pods[i].add_timings {
            match steps.iter_mut().find(|(s, _)| s == step) {
                Some((_, v)) => v.push(*took),
                None => steps.push((step.clone(), vec![*took])),
            }
        }
        let n = setup::first_byte(&client_ns, dst, t0)
            .with_context(|| format!("first byte to {}", spec.name))?;
        let total = t0.elapsed();
        println!(
            "  {}: CNI ADD {}, first byte at {} ({n} attempt{})",
            spec.name,
            ms(added),
            ms(total),
            if n == 1 { "" } else { "s" }
        );
        to_first_byte.push(total);
        adds.push(added);
        after_add.push(total - added);
        attempts.push(n);
    }
    let (fb_p50, fb_max) = p50_max(&to_first_byte);
    let (add_p50, add_max) = p50_max(&adds);
    let (aa_p50, aa_max) = p50_max(&after_add);

    // ---- 3. The suite, one node then two nodes.
    let secs = args.seconds;
    let mut reports = Vec::new();
    for (what, ip) in [
        ("two pods on one node", local_ip),
        ("two pods on two nodes", remote_ip),
    ] {
        println!("--- {what}");
        let target = common::Target {
            client_ns: &client_ns,
            server_ip: ip,
            ..setup::inpod_target(&cluster, CLIENT, LOCAL)
        };
        let mut report = Report::default();
        let summary = common::run_suite(&target, &proxies, secs, args.round_trips, &mut report)?;
        reports.push((report, summary));
    }

    // ---- 4. Soak: concurrency 8 for soak_seconds, two nodes, original source on.
    println!(
        "soak: new connections, concurrency 8, {} s, soak-client (node1) → soak (node2) ...",
        args.soak_seconds
    );
    let soak_ns = cluster.pod(SOAK).ns.clone();
    let tw_before = time_wait(&cluster, &soak_ns)?;
    let stop = AtomicBool::new(false);
    let window = args.soak_window;
    let ((soak, soak_cpu), soak_busy, tw_samples) = std::thread::scope(|scope| {
        // The server pod's TIME_WAIT count at the end of each window.
        let sampler = scope.spawn(|| {
            let start = Instant::now();
            let mut samples = Vec::new();
            let mut k = 1;
            while !stop.load(Ordering::Relaxed) {
                let at = Duration::from_secs(k * window);
                if start.elapsed() >= at {
                    samples.push(sockstat_tw(&cluster, &soak_ns));
                    k += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            samples
        });
        let r = common::machine_busy(|| {
            proxies.measure(|| {
                common::sustained_connection_rate(
                    &soak_client_ns,
                    soak_dst,
                    8,
                    args.soak_seconds,
                    window,
                    None,
                )
            })
        });
        stop.store(true, Ordering::Relaxed);
        let samples = sampler.join().expect("sampler panicked");
        r.map(|(a, b)| (a, b, samples))
    })?;
    let tw_end_server = time_wait(&cluster, &soak_ns)?;
    let tw_end_client = time_wait(&cluster, &soak_client_ns)?;
    println!(
        "  {:.0}/s over {} s, {} failed; TIME_WAIT at the end: {tw_end_server} in the server pod, {tw_end_client} in the client pod",
        soak.per_second, args.soak_seconds, soak.errors
    );

    let peak = proxies.status_kib("VmHWM")?;
    let end = proxies.status_kib("VmRSS")?;

    // ---- Report.
    let mut text = String::new();
    if args.append {
        text.push('\n');
    }
    let _ = write!(
        text,
        "## In-pod mode (`bench_inpod`)\n\nMachine: {machine}.\nRun: {secs} s per throughput and connection-rate run, {} round trips per latency run, {} idle pods, {} enrolled pods, a {} s soak; every proxied figure was measured in the same run as its direct counterpart. Node proxies: `ambit ztunnel`, shared mode, one per node; pods created through CNI ADD (bridge + host-local + ambit-cni).\n",
        args.round_trips, args.idle_pods, args.enroll_pods, args.soak_seconds
    );
    let _ = writeln!(
        text,
        "`net.ipv4.tcp_tw_reuse=1` in {}; the other pods keep the kernel default ({default_tw}).",
        if args.server_tw_reuse {
            "the client pods and the server pods"
        } else {
            "the client pods only (where the load generator's own sockets wait in TIME_WAIT, on both paths)"
        }
    );
    let columns = [
        Columns {
            direct: "direct (same pods and bridge, uncaptured)",
            mesh: "through the node proxy",
            client_proxy: "node1 proxy (both pods)",
            server_proxy: "node2 proxy (idle)",
        },
        Columns {
            direct: "direct (same pods, bridges and veth, uncaptured)",
            mesh: "through 2 node proxies",
            client_proxy: "node1 proxy (client pod)",
            server_proxy: "node2 proxy (server pod)",
        },
    ];
    let mut targets = Report::default();
    for (((report, summary), c), what) in reports.iter().zip(&columns).zip([
        "Two pods on one node, one node proxy",
        "Two pods on two nodes",
    ]) {
        let _ = write!(text, "\n### {what}\n");
        text.push_str(&report.render_tables(c));
        targets
            .notes
            .extend(report.notes.iter().map(|n| format!("{what}: {n}")));
        let (d, m) = (&summary.rate8.0, &summary.rate8.1);
        let ratio = m.per_second / d.per_second;
        targets.targets.push([
            format!("{what}: new-connection rate, concurrency 8"),
            "≥ 25 % of direct".into(),
            format!(
                "{:.0} % ({:.0} of {:.0}/s)",
                100.0 * ratio,
                m.per_second,
                d.per_second
            ),
            yes(ratio >= 0.25),
        ]);
        targets.targets.push([
            format!("{what}: p99 connect + 64 B exchange, concurrency 8"),
            "< 5 ms".into(),
            format!("{:.2} ms", m.latency.p99 / 1e3),
            yes(m.latency.p99 < 5000.0),
        ]);
    }

    let _ = write!(
        text,
        "\n### Enrollment: CNI ADD to the first byte proxied ({} pods on node2, polled from a pod on node1)\n\n| figure | p50 | max |\n|---|---:|---:|\n",
        args.enroll_pods
    );
    let _ = writeln!(
        text,
        "| CNI ADD started → first byte back from the new pod's app, through both node proxies | {} | {} |",
        ms(fb_p50),
        ms(fb_max)
    );
    let _ = writeln!(
        text,
        "| of which `Cluster::add_pod` (netns + the CNI chain) | {} | {} |",
        ms(add_p50),
        ms(add_max)
    );
    for (step, v) in &steps {
        let what = match step.as_str() {
            "netns" => "creating the pod's netns (`ip netns add`, lo up; a runtime does this before ADD)".to_string(),
            "bridge" => "plugin `bridge` (with `host-local`), run through `ip netns exec <node>`".to_string(),
            "ambit-cni" => "plugin `ambit-cni` → agent: in-pod rules, ipset, ZDS add acked by the node proxy; run through `ip netns exec <node>`".to_string(),
            other => format!("plugin `{other}`"),
        };
        let (p50, max) = p50_max(v);
        let _ = writeln!(text, "| &nbsp;&nbsp;{what} | {} | {} |", ms(p50), ms(max));
    }
    let _ = writeln!(
        text,
        "| of which ADD returned → first byte (app start, connect, HBONE handshake, exchange) | {} | {} |",
        ms(aa_p50),
        ms(aa_max)
    );
    let _ = writeln!(
        text,
        "| connection attempts until the first byte | {} | {} |",
        {
            let mut a = attempts.clone();
            a.sort_unstable();
            a.get((a.len().max(1) - 1) / 2).copied().unwrap_or(0)
        },
        attempts.iter().max().copied().unwrap_or(0)
    );

    let _ = write!(
        text,
        "\n### Node proxy memory per idle enrolled pod (node1, before any traffic)\n\n| figure | value |\n|---|---:|\n"
    );
    let kib = |k: u64| format!("{k} KiB");
    for (what, v) in [
        (
            format!("RSS with {running_node1} pods on the node"),
            kib(before.0),
        ),
        (
            format!("RSS with {} more idle pods enrolled", args.idle_pods),
            kib(after.0),
        ),
        (
            "per idle pod (RSS difference / pods)".into(),
            format!("{per_pod:.0} KiB"),
        ),
        (
            "  of which anonymous (RssAnon difference / pods)".into(),
            format!("{per_pod_anon:.0} KiB"),
        ),
        (
            format!("CNI ADD of the {} idle pods, p50 / max", args.idle_pods),
            format!("{} / {}", ms(idle_add_p50), ms(idle_add_max)),
        ),
        (
            format!("all {} idle pods enrolled in", args.idle_pods),
            format!("{:.1} s", idle_total.as_secs_f64()),
        ),
    ] {
        let _ = writeln!(text, "| {what} | {v} |");
    }

    let direct8 = reports[1].1.rate8.0.per_second;
    let _ = write!(
        text,
        "\n### Soak: new connections at concurrency 8 for {} s, two nodes, original source {}\n\n| window | connections/s | of direct (two nodes, concurrency 8, above) | p50 | p99 | failed | TIME_WAIT in the server pod at the window's end |\n|---|---:|---:|---:|---:|---:|---:|\n",
        args.soak_seconds,
        if orig_src {
            format!("preserved (the app saw the client pod's {soak_client_ip})")
        } else {
            format!("NOT preserved (the app saw {})", soak_source.ip())
        }
    );
    for (i, w) in soak.windows.iter().enumerate() {
        let from = i as u64 * window;
        let to = ((i as u64 + 1) * window).min(args.soak_seconds);
        // The last window ends with the run: the count taken right after it.
        let tw = if i + 1 == soak.windows.len() {
            tw_end_server.to_string()
        } else {
            tw_samples
                .get(i)
                .copied()
                .flatten()
                .map_or("n/a".into(), |n| n.to_string())
        };
        let _ = writeln!(
            text,
            "| {from}–{to} s | {:.0} | {} | {:.2} ms | {:.2} ms | {} | {tw} |",
            w.per_second,
            pct(w.per_second, direct8),
            w.latency.p50 / 1e3,
            w.latency.p99 / 1e3,
            w.errors
        );
    }
    let _ = writeln!(
        text,
        "| whole run | {:.0} | {} | {:.2} ms | {:.2} ms | {} | |",
        soak.per_second,
        pct(soak.per_second, direct8),
        soak.latency.p50 / 1e3,
        soak.latency.p99 / 1e3,
        soak.errors
    );
    let _ = write!(
        text,
        "\nTIME_WAIT sockets (`ss -Htan state time-wait`) at the end of the soak: {tw_end_server} in the server pod ({tw_before} before it), {tw_end_client} in the client pod. Node proxy CPU during the soak: node1 {:.2} s, node2 {:.2} s; whole machine {:.0} % busy (steal {:.0} %).\n",
        soak_cpu.client, soak_cpu.server, soak_busy.0, soak_busy.1
    );

    let _ = write!(
        text,
        "\n| node proxy memory | node1 proxy | node2 proxy |\n|---|---:|---:|\n"
    );
    for (what, v) in [
        ("RSS right after start (first pods, idle)", idle_rss),
        ("  of which anonymous (heap, stacks)", idle_anon),
        ("  of which file-backed (binary, libraries)", idle_file),
        ("peak RSS (VmHWM)", peak),
        ("RSS at the end", end),
    ] {
        let _ = writeln!(text, "| {what} | {} | {} |", mib(v.0), mib(v.1));
    }

    // The targets of the issue.
    targets.targets.push([
        "enrollment, CNI ADD → first byte, p50".into(),
        "< 50 ms".into(),
        ms(fb_p50),
        yes(fb_p50 < Duration::from_millis(50)),
    ]);
    targets.targets.push([
        "enrollment, CNI ADD → first byte, max".into(),
        "< 50 ms".into(),
        ms(fb_max),
        yes(fb_max < Duration::from_millis(50)),
    ]);
    targets.targets.push([
        "node proxy memory per idle enrolled pod".into(),
        "< 200 KiB".into(),
        format!("{per_pod:.0} KiB"),
        yes(per_pod < 200.0),
    ]);
    let rates: Vec<f64> = soak.windows.iter().map(|w| w.per_second).collect();
    let fastest = rates.iter().copied().fold(0.0, f64::max);
    let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let failed_share = soak.errors as f64
        / (soak.errors as f64 + soak.per_second * args.soak_seconds as f64).max(1.0);
    let holds = slowest >= 0.75 * fastest && failed_share < 0.01 && !soak.gave_up;
    targets.targets.push([
        format!(
            "new-connection rate holds for {} s (original source on)",
            args.soak_seconds
        ),
        "slowest window ≥ 75 % of the fastest, < 1 % failed".into(),
        format!(
            "{:.0} % ({slowest:.0} of {fastest:.0}/s), {:.2} % failed",
            if fastest > 0.0 {
                100.0 * slowest / fastest
            } else {
                0.0
            },
            100.0 * failed_share
        ),
        yes(holds),
    ]);
    let soak_ratio = soak.per_second / direct8;
    targets.targets.push([
        format!("soak rate, concurrency 8, {} s", args.soak_seconds),
        "≥ 25 % of direct".into(),
        format!("{:.0} %", 100.0 * soak_ratio),
        yes(soak_ratio >= 0.25),
    ]);
    if !orig_src {
        targets
            .notes
            .push("original source was not preserved in the soak".into());
    }
    text.push_str("\n### Targets (in-pod)\n");
    text.push_str(&targets.render_targets());

    println!("\n{text}");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(args.append)
        .truncate(!args.append)
        .open(&args.out)
        .with_context(|| format!("opening {}", args.out.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "{} {}",
        if args.append {
            "appended to"
        } else {
            "written to"
        },
        args.out.display()
    );
    drop(cluster);
    Ok(())
}
