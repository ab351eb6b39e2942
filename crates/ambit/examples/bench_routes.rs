//! The waypoint's routes benchmark: the L7 lab (`ambit_netns_lab::l7`), `echo` behind
//! `ambit waypoint` with HTTPRoutes from its config file, measured in interleaved rounds
//! against the same waypoint with no route and against `echo-direct` (no waypoint):
//!
//! - requests/s of 1 KiB HTTP/1.1 (8 keep-alive connections, closed loop) and the
//!   waypoint's requests/s per core, with 1, 100 and 5,000 routes attached (one on `echo`
//!   whose catch-all rule serves the requests, the rest on other Services), and with
//!   5,000 matches on `echo` itself, every one evaluated before the catch-all (the worst
//!   case of a linear scan);
//! - p50 and p99 at 500 requests/s on one connection, for the same configurations;
//! - the time from a route change written to the waypoint's config file to the first
//!   request served by it, and the responses other than 200 seen meanwhile;
//! - RSS with no route and with 5,000 routes, once freed pages are returned.
//!
//! ```text
//! bench_routes --ambit target/release/ambit --out FILE [--rounds 3] [--seconds 5] [--changes 20]
//! ```
//! Needs root (network namespaces). Everything it creates is removed when it ends.

mod common;
mod l7_load;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ambit_netns_lab::l7::L7Lab;
use ambit_netns_lab::mesh::SERVICE_PORT;
use ambit_netns_lab::stats::{median, percentile, spread};
use anyhow::Context;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use l7_load::{fmt, load, p50_p99, paced, Path};

struct Args {
    ambit: PathBuf,
    out: PathBuf,
    rounds: usize,
    seconds: u64,
    changes: usize,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        ambit: PathBuf::from("target/release/ambit"),
        out: PathBuf::from("target/bench-routes.md"),
        rounds: 3,
        seconds: 5,
        changes: 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().with_context(|| format!("{k} needs a value"));
        match k.as_str() {
            "--ambit" => a.ambit = v()?.into(),
            "--out" => a.out = v()?.into(),
            "--rounds" => a.rounds = v()?.parse()?,
            "--seconds" => a.seconds = v()?.parse()?,
            "--changes" => a.changes = v()?.parse()?,
            "-h" | "--help" => {
                println!(
                    "bench_routes --ambit PATH --out FILE [--rounds N] [--seconds N] [--changes N]"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

/// A routes configuration measured.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Config {
    None,
    /// `n` routes: the catch-all on `echo`, the others on other Services.
    Spread(usize),
    /// `n` routes all on `echo`: `n - 1` exact matches evaluated before the catch-all.
    OnEcho(usize),
}

impl Config {
    fn name(self) -> String {
        match self {
            Config::None => "no route".into(),
            Config::Spread(1) => "1 route".into(),
            Config::Spread(n) => format!("{n} routes (one on echo)"),
            Config::OnEcho(n) => format!("{n} routes, all on echo (worst case)"),
        }
    }

    /// The config file's text; `marker` is set on every response of the catch-all rule.
    fn text(self, marker: &str) -> String {
        let (n, on_echo) = match self {
            Config::None => return String::new(),
            Config::Spread(n) => (n, false),
            Config::OnEcho(n) => (n, true),
        };
        let mut out = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: catch-all, namespace: default}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: echo, port: {SERVICE_PORT}}}]\n  rules:\n  - filters: [{{type: ResponseHeaderModifier, responseHeaderModifier: {{set: [{{name: x-routes, value: \"{marker}\"}}]}}}}]\n    backendRefs: [{{name: echo, port: {SERVICE_PORT}}}]\n"
        );
        for i in 1..n {
            let parent = if on_echo {
                "echo".to_string()
            } else {
                format!("s{i}")
            };
            let _ = write!(
                out,
                "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{i}, namespace: default}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: {parent}}}]\n  rules:\n  - matches: [{{path: {{type: Exact, value: /r{i}}}, headers: [{{name: x-tenant, value: t{i}}}]}}]\n    backendRefs: [{{name: echo, port: {SERVICE_PORT}}}]\n"
            );
        }
        out
    }
}

/// One request on `sender`: its status and `x-routes` value.
async fn probe(
    sender: &mut hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
) -> anyhow::Result<(u16, Option<String>)> {
    sender.ready().await?;
    let req = l7_load::request(Path::Waypoint, &bytes::Bytes::from_static(b"x"));
    let r = sender.send_request(req).await?;
    let status = r.status().as_u16();
    let marker = r
        .headers()
        .get("x-routes")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    r.into_body().collect().await?;
    Ok((status, marker))
}

/// Writes `text` as the waypoint's config and waits until a request is served with
/// `marker` (or, for no route, without any): the time that took, and the responses
/// other than 200 seen meanwhile.
fn apply(lab: &L7Lab, text: &str, marker: Option<&str>) -> anyhow::Result<(Duration, u64)> {
    let connect = || -> anyhow::Result<_> { lab.connect_to(Path::Waypoint.dst()) };
    let io = connect()?;
    let mut spare = Some(connect()?);
    lab.rt.block_on(async {
        let handshake = |io| async move {
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
            tokio::spawn(conn);
            anyhow::Ok(sender)
        };
        let mut sender = handshake(io).await?;
        let written = Instant::now();
        std::fs::write(&lab.policies, text)?;
        let mut bad = 0;
        loop {
            match probe(&mut sender).await {
                Ok((status, seen)) => {
                    if status != 200 {
                        bad += 1;
                    }
                    if seen.as_deref() == marker && status == 200 {
                        return Ok((written.elapsed(), bad));
                    }
                }
                // A connection that ends is counted as a failed request, and the spare
                // one (made beforehand, outside the timing) takes over.
                Err(e) => {
                    eprintln!("a probe failed ({e:#}); going on on a new connection");
                    bad += 1;
                    let io = spare.take().context("a second probe connection failed")?;
                    sender = handshake(io).await?;
                }
            }
            anyhow::ensure!(
                written.elapsed() < Duration::from_secs(60),
                "the waypoint did not apply the change within 60 s"
            );
        }
    })
}

fn main() -> anyhow::Result<()> {
    let a = args()?;
    let ambit = std::fs::canonicalize(&a.ambit).with_context(|| a.ambit.display().to_string())?;
    let env = vec![("AMBIT_ACCESS_LOG", "false".to_string())];
    let lab = L7Lab::launch_with_env("bench-rt", &ambit, "", &env)?;
    let wp = lab.waypoint.pid;
    let secs = a.seconds;
    let configs = [
        Config::None,
        Config::Spread(1),
        Config::Spread(100),
        Config::Spread(5000),
        Config::OnEcho(5000),
    ];
    let mut rate = vec![Vec::new(); configs.len()];
    let mut per_core = vec![Vec::new(); configs.len()];
    let mut p50 = vec![Vec::new(); configs.len()];
    let mut p99 = vec![Vec::new(); configs.len()];
    let (mut direct_rate, mut direct_p50, mut direct_p99) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..a.rounds {
        let mut order: Vec<usize> = (0..configs.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let marker = format!("{round}-{i}");
            let marker = (configs[i] != Config::None).then_some(marker.as_str());
            apply(&lab, &configs[i].text(marker.unwrap_or_default()), marker)?;
            let before = common::cpu_seconds(wp)?;
            let r = load(&lab, Path::Waypoint, false, 8, 0, secs)?;
            let cpu = common::cpu_seconds(wp)? - before;
            rate[i].push(r);
            per_core[i].push(r * secs as f64 / cpu);
            let (lat50, lat99) = p50_p99(&paced(&lab, Path::Waypoint, 500, 1, secs)?);
            p50[i].push(lat50);
            p99[i].push(lat99);
        }
        direct_rate.push(load(&lab, Path::Direct, false, 8, 0, secs)?);
        let (lat50, lat99) = p50_p99(&paced(&lab, Path::Direct, 500, 1, secs)?);
        direct_p50.push(lat50);
        direct_p99.push(lat99);
        eprintln!("round {}/{} done", round + 1, a.rounds);
    }

    // Route changes: the 100-route configuration with a new marker each time.
    let mut change_ms = Vec::new();
    let mut bad_during_changes = 0;
    for k in 0..a.changes {
        let marker = format!("change-{k}");
        let (took, bad) = apply(&lab, &Config::Spread(100).text(&marker), Some(&marker))?;
        change_ms.push(took.as_secs_f64() * 1000.0);
        bad_during_changes += bad;
        // Changes land at random points of the watch period.
        std::thread::sleep(Duration::from_millis(137 * (k as u64 % 7)));
    }
    let p99_change = percentile(&change_ms, 99.0);

    // Memory: settled RSS with no route, then with 5,000.
    apply(&lab, "", None)?;
    std::thread::sleep(Duration::from_secs(17));
    let rss_none = common::status_kib(wp, "VmRSS")? as f64 / 1024.0;
    apply(&lab, &Config::Spread(5000).text("mem"), Some("mem"))?;
    std::thread::sleep(Duration::from_secs(17));
    let rss_5000 = common::status_kib(wp, "VmRSS")? as f64 / 1024.0;

    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Waypoint routes (`bench_routes`)\n\n{} interleaved rounds, {secs} s per run; client pod → node proxy → `ambit waypoint` → node proxy → server, 1 KiB HTTP/1.1 requests over 8 keep-alive connections (closed loop), latency at 500 requests/s on one connection. Routes from the waypoint's config file. Medians (lowest–highest).\n",
        a.rounds
    );
    out.push_str("| routes | requests/s | / no route | / direct | requests/s per waypoint core | p50 | p99 |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (i, c) in configs.iter().enumerate() {
        let to_none: Vec<f64> = rate[i].iter().zip(&rate[0]).map(|(r, n)| r / n).collect();
        let to_direct: Vec<f64> = rate[i]
            .iter()
            .zip(&direct_rate)
            .map(|(r, d)| r / d)
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            c.name(),
            fmt(&rate[i], "", 0),
            fmt(&to_none, "×", 2),
            fmt(&to_direct, "×", 2),
            fmt(&per_core[i], "", 0),
            fmt(&p50[i], "µs", 0),
            fmt(&p99[i], "µs", 0)
        );
    }
    let _ = writeln!(
        out,
        "| direct (no waypoint) | {} | | | | {} | {} |",
        fmt(&direct_rate, "", 0),
        fmt(&direct_p50, "µs", 0),
        fmt(&direct_p99, "µs", 0)
    );
    let _ = writeln!(
        out,
        "\n| route change (100 routes, config file) | figure |\n|---|---:|\n| changes | {} |\n| from the write to the first request served by the new route, median / p99 / max | {:.0} / {:.0} / {:.0} ms |\n| responses other than 200 during the changes | {bad_during_changes} |\n| RSS with no route / 5,000 routes, 17 s after the change | {rss_none:.1} / {rss_5000:.1} MiB |",
        a.changes,
        median(&change_ms),
        p99_change,
        spread(&change_ms).1
    );
    println!("{out}");
    std::fs::write(&a.out, &out)?;
    eprintln!("written to {}", a.out.display());
    Ok(())
}
