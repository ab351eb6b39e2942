//! The waypoint's benchmark driver: the L7 lab (`ambit_netns_lab::l7`: two nodes with a node
//! proxy each, `ambit waypoint` in the server node, the `echo` service behind it and
//! `echo-direct`, the same endpoints without a waypoint), measured in interleaved rounds:
//!
//! - requests/s of 1 KiB HTTP/1.1 (8 keep-alive connections) and HTTP/2 (one connection,
//!   16 streams), closed loop, through the waypoint and without it, and the waypoint's CPU
//!   per request (requests/s per waypoint core);
//! - latency of 1 KiB requests paced at a fixed rate on one keep-alive connection, p50 and
//!   p99, through the waypoint and without it;
//! - the waypoint's CPU and RSS at 1000 requests/s (HTTP/1.1, 4 connections);
//! - RSS of a waypoint holding 5,000 services and 5,000 policies.
//!
//! With `--traffic-policy`, instead: a DestinationRule's cost and the egress path's
//! (`l7_traffic`). With `--nginx`, instead: the waypoint in front of nginx (from Debian) and in front of
//! the echo app, at 1000 requests/s and closed loop, counting the waypoint process alone
//! and the whole path (both node proxies, the waypoint, the backend), see `l7_nginx`.
//!
//! ```text
//! bench_waypoint --ambit target/release/ambit --out FILE [--rounds 3] [--seconds 5] [--workers N] [--nginx]
//! ```
//! Needs root (network namespaces). Everything it creates is removed when it ends.

mod bare_l7;
mod common;
mod l7_load;
mod l7_nginx;
mod l7_traffic;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ambit_netns_lab::l7::L7Lab;
use ambit_netns_lab::mesh::SERVICE_PORT;
use anyhow::Context;
use bytes::Bytes;
use l7_load::{fmt, load, p50_p99, paced, request, Path, BARE_HOST, BARE_VIP};

/// The bare proxy's address in the server node.
const BARE_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 78, 0, 6);

struct Args {
    ambit: PathBuf,
    out: PathBuf,
    rounds: usize,
    seconds: u64,
    /// The waypoint's `AMBIT_WORKER_THREADS` (its own default when unset).
    workers: Option<usize>,
    /// `--waypoint-env K=V`: more environment for every waypoint the run starts (an
    /// allocator setting, say).
    waypoint_env: Vec<(String, String)>,
    /// The nginx comparison (`l7_nginx`) instead of the waypoint's own figures.
    nginx: bool,
    /// A DestinationRule's and the egress path's cost (`l7_traffic`) instead.
    traffic_policy: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        ambit: PathBuf::from("target/release/ambit"),
        out: PathBuf::from("target/bench-waypoint.md"),
        rounds: 3,
        seconds: 5,
        workers: None,
        waypoint_env: Vec::new(),
        nginx: false,
        traffic_policy: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().with_context(|| format!("{k} needs a value"));
        match k.as_str() {
            "--ambit" => a.ambit = v()?.into(),
            "--out" => a.out = v()?.into(),
            "--rounds" => a.rounds = v()?.parse()?,
            "--seconds" => a.seconds = v()?.parse()?,
            "--workers" => a.workers = Some(v()?.parse()?),
            "--waypoint-env" => {
                let kv = v()?;
                let (k, val) = kv.split_once('=').context("--waypoint-env takes K=V")?;
                a.waypoint_env.push((k.to_string(), val.to_string()));
            }
            "--nginx" => a.nginx = true,
            "--traffic-policy" => a.traffic_policy = true,
            "-h" | "--help" => {
                println!(
                    "bench_waypoint --ambit PATH --out FILE [--rounds N] [--seconds N] [--workers N] [--nginx | --traffic-policy] [--waypoint-env K=V]..."
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

/// A waypoint holding `n` services (each behind it) and `n` policies (one per service),
/// started beside the lab's: its RSS once ready.
fn rss_at_scale(
    lab: &L7Lab,
    ambit: &std::path::Path,
    n: usize,
    extra_env: &[(String, String)],
) -> anyhow::Result<(u64, u64)> {
    use std::fmt::Write;
    let mut mesh = ambit_netns_lab::l7::l7_mesh();
    for i in 0..n {
        let (a, b) = (i / 250, i % 250);
        let _ = write!(
            mesh,
            "- name: s{i}\n  namespace: default\n  hostname: s{i}.default.svc.cluster.local\n  vips: [\"/10.97.{a}.{}\"]\n  ports: {{80: 8080}}\n  waypoint: {{destination: \"/{}\", hboneMtlsPort: 15009}}\n",
            b + 1,
            ambit_netns_lab::waypoint::WAYPOINT_IP
        );
    }
    let mut policies = String::new();
    for i in 0..n {
        let _ = write!(
            policies,
            "---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: p{i}, namespace: default}}\nspec:\n  targetRefs: [{{kind: Service, group: \"\", name: s{i}}}]\n  action: ALLOW\n  rules: [{{from: [{{source: {{principals: [\"cluster.local/ns/default/sa/client\"]}}}}], to: [{{operation: {{methods: [\"GET\"], paths: [\"/api/{i}/*\"]}}}}]}}]\n"
        );
    }
    let dir = lab.policies.parent().context("the lab's directory")?;
    let mesh_path = dir.join("scale-mesh.yaml");
    let policies_path = dir.join("scale-policies.yaml");
    std::fs::write(&mesh_path, mesh)?;
    std::fs::write(&policies_path, policies)?;
    let mut env: Vec<(&str, String)> = vec![
        ("POD_NAME", "waypoint".into()),
        ("POD_NAMESPACE", "default".into()),
        ("SERVICE_ACCOUNT", "waypoint".into()),
        ("LOCAL_XDS_PATH", mesh_path.display().to_string()),
        ("LOCAL_CA_DIR", lab.nodes.ca_dir.display().to_string()),
        ("AMBIT_WAYPOINT_CONFIG", policies_path.display().to_string()),
        ("AMBIT_HBONE_ADDR", "127.0.0.1:25008".into()),
        ("AMBIT_ADMIN_ADDR", "127.0.0.1:25000".into()),
        ("AMBIT_STATS_ADDR", "127.0.0.1:25020".into()),
        ("AMBIT_READINESS_ADDR", "127.0.0.1:25021".into()),
    ];
    env.extend(extra_env.iter().map(|(k, v)| (k.as_str(), v.clone())));
    let p = lab.nodes.lab.spawn(
        &lab.nodes.server_ns,
        "waypoint-scale",
        ambit,
        &["waypoint"],
        &env,
    )?;
    let ready: SocketAddr = ([127, 0, 0, 1], 25021).into();
    ambit_netns_lab::wait_until(
        "the scale waypoint to be ready",
        Duration::from_secs(60),
        || {
            matches!(
                ambit_netns_lab::http_get(&lab.nodes.server_ns, ready, "/healthz/ready"),
                Ok((200, _))
            )
        },
    )?;
    // Right after loading, and once the allocator has returned what the load freed
    // (jemalloc gives dirty pages back after about 10 s).
    std::thread::sleep(Duration::from_secs(2));
    let loaded = common::status_kib(p.pid, "VmRSS")?;
    std::thread::sleep(Duration::from_secs(15));
    let settled = common::status_kib(p.pid, "VmRSS")?;
    // Checked after the measures: building the dump allocates (and frees) more than the
    // data it shows.
    let dump = ambit_netns_lab::http_get(
        &lab.nodes.server_ns,
        ([127, 0, 0, 1], 25000).into(),
        "/config_dump",
    )?
    .1;
    let v: serde_json::Value = serde_json::from_str(&dump)?;
    anyhow::ensure!(
        v["waypointPolicies"].as_array().map_or(0, |a| a.len()) == n,
        "the scale waypoint holds {} policies, not {n}",
        v["waypointPolicies"].as_array().map_or(0, |a| a.len())
    );
    Ok((loaded, settled))
}

/// `bench_waypoint --bare-proxy LISTEN CA_DIR`: the bare proxy as its own process, with
/// the waypoint's identity, to the lab's two endpoints.
fn bare_proxy(listen: &str, ca_dir: &str) -> anyhow::Result<()> {
    use ambit_netns_lab::l7::PLAIN_POD_IP;
    use ambit_netns_lab::mesh::{APP_PORT, SERVER_IP};
    let ca = ambit_identity::CertificateAuthority::from_plugin_dir(std::path::Path::new(ca_dir))?;
    let cert = ca.issue(
        &ambit_identity::SpiffeId::parse(ambit_netns_lab::l7::WAYPOINT_ID)?,
        Duration::from_secs(86400),
    )?;
    let endpoints = vec![
        bare_l7::Endpoint {
            target: SocketAddr::from((SERVER_IP, APP_PORT)),
            identity: Some(ambit_identity::SpiffeId::parse(
                "spiffe://cluster.local/ns/default/sa/server",
            )?),
        },
        bare_l7::Endpoint {
            target: SocketAddr::from((PLAIN_POD_IP, APP_PORT)),
            identity: None,
        },
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bare_l7::run(listen.parse()?, cert, endpoints))
}

/// Puts the bare proxy where a waypoint would stand for `echo-bare`, and waits until a
/// request through it is answered.
fn start_bare(lab: &L7Lab) -> anyhow::Result<u32> {
    use ambit_netns_lab::waypoint::WAYPOINT_PORT;
    let nodes = &lab.nodes;
    nodes.lab.exec(
        &nodes.server_ns,
        &[
            "ip",
            "addr",
            "add",
            &format!("{BARE_IP}/24"),
            "dev",
            ambit_netns_lab::mesh::LINK_DEV,
        ],
    )?;
    let me = std::env::current_exe()?;
    let listen = SocketAddr::from((BARE_IP, WAYPOINT_PORT)).to_string();
    let ca = nodes.ca_dir.display().to_string();
    let p = nodes.lab.spawn(
        &nodes.server_ns,
        "bare-proxy",
        &me,
        &["--bare-proxy", &listen, &ca],
        &[],
    )?;
    let mesh = std::fs::read_to_string(&nodes.config_path)?;
    let workload = format!(
        "- uid: cluster1//v1/Pod/default/bare\n  name: bare\n  namespace: default\n  serviceAccount: waypoint\n  trustDomain: cluster.local\n  workloadIps: [\"{BARE_IP}\"]\n  protocol: HBONE\n  node: node2\n  workloadName: bare\n  services: {{}}\nservices:\n"
    );
    let service = format!(
        "- name: echo-bare\n  namespace: default\n  hostname: {BARE_HOST}\n  vips: [\"/{BARE_VIP}\"]\n  ports: {{{SERVICE_PORT}: 8080}}\n  waypoint: {{destination: \"/{BARE_IP}\", hboneMtlsPort: {WAYPOINT_PORT}}}\n"
    );
    // The top-level `services:` (a workload's own, indented, come before it).
    let mesh = mesh.replacen("\nservices:\n", &format!("\n{workload}"), 1) + &service;
    std::fs::write(&nodes.config_path, mesh)?;
    let through = ambit_netns_lab::wait_until(
        "a request through the bare proxy",
        Duration::from_secs(20),
        || {
            let req = request(Path::Bare, &Bytes::from_static(b"x"));
            lab.send_http1_to(Path::Bare.dst(), vec![req])
                .is_ok_and(|r| r[0].status == 200)
        },
    );
    if let Err(e) = through {
        let log = std::fs::read_to_string(&p.log).unwrap_or_default();
        anyhow::bail!("{e}; the bare proxy's log:\n{log}");
    }
    Ok(p.pid)
}

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--bare-proxy") {
        let usage = "--bare-proxy LISTEN CA_DIR";
        return bare_proxy(argv.get(2).context(usage)?, argv.get(3).context(usage)?);
    }
    let a = args()?;
    let ambit = std::fs::canonicalize(&a.ambit).with_context(|| a.ambit.display().to_string())?;
    // No access log: Istio's waypoints write none unless asked.
    let mut env = vec![("AMBIT_ACCESS_LOG", "false".to_string())];
    env.extend(a.waypoint_env.iter().map(|(k, v)| (k.as_str(), v.clone())));
    if let Some(n) = a.workers {
        env.push(("AMBIT_WORKER_THREADS", n.to_string()));
    }
    if a.traffic_policy {
        let dir = std::env::temp_dir();
        let resolv = l7_traffic::resolv_conf(&dir)?;
        env.push(("AMBIT_RESOLV_CONF", resolv.display().to_string()));
        let lab = L7Lab::launch_with_mesh("bench-tp", &ambit, "", &env, &l7_traffic::mesh())?;
        let out = l7_traffic::run(&lab, a.rounds, a.seconds)?;
        println!("{out}");
        std::fs::write(&a.out, &out)?;
        eprintln!("written to {}", a.out.display());
        return Ok(());
    }
    let lab = L7Lab::launch_with_env("bench-wp", &ambit, "", &env)?;
    if a.nginx {
        let out = l7_nginx::run(&lab, a.rounds, a.seconds, a.workers)?;
        println!("{out}");
        std::fs::write(&a.out, &out)?;
        eprintln!("written to {}", a.out.display());
        return Ok(());
    }
    let wp = lab.waypoint.pid;
    let idle_rss = common::status_kib(wp, "VmRSS")?;
    let secs = a.seconds;

    let bare = start_bare(&lab)?;
    let mut h1 = [Vec::new(), Vec::new(), Vec::new()];
    let mut h2 = [Vec::new(), Vec::new(), Vec::new()];
    let mut bare_h1_per_core = Vec::new();
    let mut bare_h2_per_core = Vec::new();
    let mut h1_per_core = Vec::new();
    let mut h2_per_core = Vec::new();
    let mut p50 = [Vec::new(), Vec::new(), Vec::new()];
    let mut p99 = [Vec::new(), Vec::new(), Vec::new()];
    let mut cpu_1000 = Vec::new();
    let mut bare_cpu_1000 = Vec::new();
    let mut rss_1000 = Vec::new();
    let mut anon_1000 = Vec::new();
    for round in 0..a.rounds {
        // Alternate which path goes first.
        let order = if round % 2 == 0 {
            [Path::Waypoint, Path::Bare, Path::Direct]
        } else {
            [Path::Direct, Path::Bare, Path::Waypoint]
        };
        for path in order {
            let i = match path {
                Path::Waypoint => 0,
                Path::Direct => 1,
                _ => 2,
            };
            // The CPU of whichever proxy stands in the path.
            let pid = if path == Path::Bare { bare } else { wp };
            let before = common::cpu_seconds(pid)?;
            let rate = load(&lab, path, false, 8, 0, secs)?;
            let cpu = common::cpu_seconds(pid)? - before;
            h1[i].push(rate);
            match path {
                Path::Waypoint => h1_per_core.push(rate * secs as f64 / cpu),
                Path::Bare => bare_h1_per_core.push(rate * secs as f64 / cpu),
                _ => {}
            }
            let before = common::cpu_seconds(pid)?;
            let rate = load(&lab, path, true, 1, 16, secs)?;
            let cpu = common::cpu_seconds(pid)? - before;
            h2[i].push(rate);
            match path {
                Path::Waypoint => h2_per_core.push(rate * secs as f64 / cpu),
                Path::Bare => bare_h2_per_core.push(rate * secs as f64 / cpu),
                _ => {}
            }
            let (lat50, lat99) = p50_p99(&paced(&lab, path, 500, 1, secs)?);
            p50[i].push(lat50);
            p99[i].push(lat99);
        }
        let before = common::cpu_seconds(wp)?;
        let t = Instant::now();
        paced(&lab, Path::Waypoint, 1000, 4, secs.max(10))?;
        cpu_1000.push((common::cpu_seconds(wp)? - before) / t.elapsed().as_secs_f64());
        rss_1000.push(common::status_kib(wp, "VmRSS")? as f64 / 1024.0);
        anon_1000.push(common::status_kib(wp, "RssAnon")? as f64 / 1024.0);
        // The same load through the bare proxy: the design's floor for that figure.
        let before = common::cpu_seconds(bare)?;
        let t = Instant::now();
        paced(&lab, Path::Bare, 1000, 4, secs.max(10))?;
        bare_cpu_1000.push((common::cpu_seconds(bare)? - before) / t.elapsed().as_secs_f64());
        eprintln!("round {}/{} done", round + 1, a.rounds);
    }
    let peak = common::status_kib(wp, "VmHWM")?;
    let (scale_loaded, scale_settled) = rss_at_scale(&lab, &ambit, 5000, &a.waypoint_env)?;
    // What path `i` adds over the direct one, round by round.
    let added = |v: &[Vec<f64>; 3], i: usize| -> Vec<f64> {
        v[i].iter().zip(&v[1]).map(|(w, d)| w - d).collect()
    };
    let ratio =
        |v: &[Vec<f64>; 3]| -> Vec<f64> { v[0].iter().zip(&v[1]).map(|(w, d)| w / d).collect() };
    let to_bare =
        |v: &[Vec<f64>; 3]| -> Vec<f64> { v[0].iter().zip(&v[2]).map(|(w, b)| w / b).collect() };
    let mut out = String::new();
    out.push_str(&format!(
        "## Waypoint (`bench_waypoint`)\n\nThe waypoint's worker threads: {}. {} interleaved rounds, {secs} s per load run; client pod → node proxy → `ambit waypoint` → node proxy → server (HBONE both sides), against `echo-direct` (the same endpoints, no waypoint) and `echo-bare` (a bare reverse proxy on the same HBONE stack where the waypoint stands, its own process: the design's ceiling). 1 KiB request bodies; HTTP/1.1 over 8 keep-alive connections, HTTP/2 with 16 streams on one connection, closed loop. Medians (lowest–highest).\n\n",
        a.workers
            .map_or("its default".to_string(), |n| n.to_string()),
        a.rounds
    ));
    out.push_str("| figure | through the waypoint | without it | through the bare proxy | waypoint / without | waypoint / bare |\n|---|---:|---:|---:|---:|---:|\n");
    out.push_str(&format!(
        "| HTTP/1.1 requests/s | {} | {} | {} | {} | {} |\n",
        fmt(&h1[0], "", 0),
        fmt(&h1[1], "", 0),
        fmt(&h1[2], "", 0),
        fmt(&ratio(&h1), "×", 2),
        fmt(&to_bare(&h1), "×", 2)
    ));
    out.push_str(&format!(
        "| HTTP/2 requests/s | {} | {} | {} | {} | {} |\n",
        fmt(&h2[0], "", 0),
        fmt(&h2[1], "", 0),
        fmt(&h2[2], "", 0),
        fmt(&ratio(&h2), "×", 2),
        fmt(&to_bare(&h2), "×", 2)
    ));
    for (name, v) in [("p50", &p50), ("p99", &p99)] {
        out.push_str(&format!(
            "| {name} at 500 requests/s, one connection | {} | {} | {} | added {} | bare added {} |\n",
            fmt(&v[0], "µs", 0),
            fmt(&v[1], "µs", 0),
            fmt(&v[2], "µs", 0),
            fmt(&added(v, 0), "µs", 0),
            fmt(&added(v, 2), "µs", 0)
        ));
    }
    out.push_str("\n| the waypoint itself | figure |\n|---|---:|\n");
    out.push_str(&format!(
        "| HTTP/1.1 requests/s per waypoint core | {} |\n",
        fmt(&h1_per_core, "", 0)
    ));
    out.push_str(&format!(
        "| HTTP/2 requests/s per waypoint core | {} |\n",
        fmt(&h2_per_core, "", 0)
    ));
    out.push_str(&format!(
        "| HTTP/1.1 / HTTP/2 requests/s per bare-proxy core | {} / {} |\n",
        fmt(&bare_h1_per_core, "", 0),
        fmt(&bare_h2_per_core, "", 0)
    ));
    out.push_str(&format!(
        "| CPU at 1000 requests/s (HTTP/1.1, 4 connections) | {} |\n",
        fmt(&cpu_1000, "vCPU", 3)
    ));
    out.push_str(&format!(
        "| the bare proxy's CPU at the same load | {} |\n",
        fmt(&bare_cpu_1000, "vCPU", 3)
    ));
    out.push_str(&format!(
        "| RSS at 1000 requests/s | {} |\n",
        fmt(&rss_1000, "MiB", 1)
    ));
    out.push_str(&format!(
        "| of which anonymous (heap, stacks; the rest is the binary's pages) | {} |\n",
        fmt(&anon_1000, "MiB", 1)
    ));
    out.push_str(&format!(
        "| RSS idle after start | {:.1} MiB |\n",
        idle_rss as f64 / 1024.0
    ));
    out.push_str(&format!(
        "| peak RSS (VmHWM) over the run | {:.1} MiB |\n",
        peak as f64 / 1024.0
    ));
    out.push_str(&format!(
        "| RSS holding 5,000 services and 5,000 policies, 2 s after ready | {:.1} MiB |\n",
        scale_loaded as f64 / 1024.0
    ));
    out.push_str(&format!(
        "| the same, 17 s after ready (freed pages returned) | {:.1} MiB |\n",
        scale_settled as f64 / 1024.0
    ));
    println!("{out}");
    std::fs::write(&a.out, &out)?;
    eprintln!("written to {}", a.out.display());
    Ok(())
}
