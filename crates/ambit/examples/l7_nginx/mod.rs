//! `bench_waypoint --nginx`: the waypoint in front of a fast backend the project did not
//! write (nginx from Debian, in the lab's server node), beside the lab's own echo app, in
//! interleaved rounds, counting both kinds of CPU figure:
//!
//! - the waypoint process alone (`/proc/<pid>/stat` utime + stime over the window), and
//! - the whole path: both node proxies, the waypoint and the backend, each listed.
//!
//! At 1000 requests/s (HTTP/1.1, 4 keep-alive connections, the driver `l7_load::paced`)
//! through the waypoint and directly (the same endpoints without it): the echo app (the
//! backend `bench_waypoint` measures against; it runs inside this driver's process, so its
//! CPU is the driver's excess over the nginx run of the same round); nginx behind the same
//! two endpoints (the server pod over HBONE, the plaintext pod straight), with the same
//! requests (POST, 1 KiB body) and with GETs; nginx behind the plaintext pod only (no HBONE
//! leg after the waypoint). Then closed-loop requests/s per waypoint core with 16
//! keep-alive connections, HTTP/1.1 and h2c, POST and GET (see [`CLOSED`] on an h2c
//! POST to nginx).
//!
//! nginx: one process (`master_process off`: the same event loop as one worker, and
//! nothing outlives the lab when it is killed), access log off, keep-alive without a
//! request limit, `return 200` of a 1 KiB body. Debian 12's nginx (1.22) speaks h2c with
//! prior knowledge only on a port of its own (`listen ... http2` refuses HTTP/1.1 there),
//! so it listens on two ports, each behind a Service of its own.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ambit_netns_lab::l7::{L7Lab, DIRECT_HOST};
use ambit_netns_lab::mesh::{APP_PORT, SERVICE_PORT};
use ambit_netns_lab::waypoint::{WAYPOINT_IP, WAYPOINT_PORT};
use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::common;
use crate::l7_load::{fmt, load_as, p50_p99, paced_as, request, Path, Shape};

/// nginx's HTTP/1.1 port and its h2c port (prior knowledge only) in the server node.
pub const H1_PORT: u16 = 8082;
pub const H2C_PORT: u16 = 8083;
/// The size of nginx's answer.
pub const BODY_BYTES: usize = 1024;

/// A Service in front of nginx.
struct Service {
    host: &'static str,
    vip: Ipv4Addr,
    port: u16,
    /// Behind the lab's waypoint.
    waypoint: bool,
    /// Only the plaintext pod is its endpoint (else the server pod, over HBONE, too).
    plain_only: bool,
}

impl Service {
    const fn path(&self) -> Path {
        Path::Other {
            vip: self.vip,
            host: self.host,
        }
    }
}

const NGINX: Service = Service {
    host: "nginx.default.svc.cluster.local",
    vip: Ipv4Addr::new(10, 96, 0, 20),
    port: H1_PORT,
    waypoint: true,
    plain_only: false,
};
const NGINX_DIRECT: Service = Service {
    host: "nginx-direct.default.svc.cluster.local",
    vip: Ipv4Addr::new(10, 96, 0, 21),
    port: H1_PORT,
    waypoint: false,
    plain_only: false,
};
const NGINX_H2C: Service = Service {
    host: "nginx-h2c.default.svc.cluster.local",
    vip: Ipv4Addr::new(10, 96, 0, 22),
    port: H2C_PORT,
    waypoint: true,
    plain_only: false,
};
const NGINX_PLAIN: Service = Service {
    host: "nginx-plain.default.svc.cluster.local",
    vip: Ipv4Addr::new(10, 96, 0, 24),
    port: H1_PORT,
    waypoint: true,
    plain_only: true,
};
const NGINX_PLAIN_DIRECT: Service = Service {
    host: "nginx-plain-direct.default.svc.cluster.local",
    vip: Ipv4Addr::new(10, 96, 0, 25),
    port: H1_PORT,
    waypoint: false,
    plain_only: true,
};
const SERVICES: [&Service; 5] = [
    &NGINX,
    &NGINX_DIRECT,
    &NGINX_H2C,
    &NGINX_PLAIN,
    &NGINX_PLAIN_DIRECT,
];

/// A backend measured at the fixed rate: through the waypoint and without it.
struct Variant {
    name: &'static str,
    through: Path,
    direct: Path,
    nginx: bool,
    shape: Shape,
}

/// The echo app, then nginx behind the same endpoints with the same requests (the first
/// two must stay first: the echo app's CPU is read from them).
const VARIANTS: [Variant; 4] = [
    Variant {
        name: "echo",
        through: Path::Waypoint,
        direct: Path::Direct,
        nginx: false,
        shape: Shape::Post,
    },
    Variant {
        name: "nginx",
        through: NGINX.path(),
        direct: NGINX_DIRECT.path(),
        nginx: true,
        shape: Shape::Post,
    },
    Variant {
        name: "nginx, GET",
        through: NGINX.path(),
        direct: NGINX_DIRECT.path(),
        nginx: true,
        shape: Shape::Get,
    },
    Variant {
        name: "nginx, plaintext pod only",
        through: NGINX_PLAIN.path(),
        direct: NGINX_PLAIN_DIRECT.path(),
        nginx: true,
        shape: Shape::Post,
    },
];

/// A closed-loop run through the waypoint.
struct ClosedRun {
    backend: &'static str,
    h2c: bool,
    shape: Shape,
    path: Path,
}

/// The h2c POSTs to nginx can fail: nginx answers `return` before it has read a request
/// body, and resets the stream when the body is still to come (after the headers, as the
/// waypoint forwards them); after 256 such streams the waypoint's HTTP/2 connection ends
/// (its log: h2's "locally-reset streams reached limit (256)"). Seen with a client whose
/// body lagged its headers (without `TCP_NODELAY`); a failed run is listed, not fatal.
const CLOSED: [ClosedRun; 6] = [
    ClosedRun {
        backend: "echo",
        h2c: false,
        shape: Shape::Post,
        path: Path::Waypoint,
    },
    ClosedRun {
        backend: "echo",
        h2c: true,
        shape: Shape::Post,
        path: Path::Waypoint,
    },
    ClosedRun {
        backend: "nginx",
        h2c: false,
        shape: Shape::Post,
        path: NGINX.path(),
    },
    ClosedRun {
        backend: "nginx",
        h2c: true,
        shape: Shape::Post,
        path: NGINX_H2C.path(),
    },
    ClosedRun {
        backend: "nginx",
        h2c: false,
        shape: Shape::Get,
        path: NGINX.path(),
    },
    ClosedRun {
        backend: "nginx",
        h2c: true,
        shape: Shape::Get,
        path: NGINX_H2C.path(),
    },
];

impl ClosedRun {
    fn name(&self) -> String {
        let proto = if self.h2c { "h2c" } else { "HTTP/1.1" };
        format!("{}, {proto}, {}", self.backend, self.shape.name())
    }
}

/// The processes counted.
struct Pids {
    waypoint: u32,
    client: u32,
    server: u32,
    nginx: u32,
    driver: u32,
}

/// CPU seconds (or, over a window, vCPU) of each process counted.
#[derive(Clone, Copy, Default)]
struct Usage {
    waypoint: f64,
    client: f64,
    server: f64,
    nginx: f64,
    /// This process: the load generator, and the echo app.
    driver: f64,
}

impl Usage {
    fn now(p: &Pids) -> anyhow::Result<Usage> {
        Ok(Usage {
            waypoint: common::cpu_seconds(p.waypoint)?,
            client: common::cpu_seconds(p.client)?,
            server: common::cpu_seconds(p.server)?,
            nginx: common::cpu_seconds(p.nginx)?,
            driver: common::cpu_seconds(p.driver)?,
        })
    }

    /// What each used per second since `before`, `secs` ago.
    fn rate_since(self, before: Usage, secs: f64) -> Usage {
        let per = |a: f64, b: f64| (a - b) / secs;
        Usage {
            waypoint: per(self.waypoint, before.waypoint),
            client: per(self.client, before.client),
            server: per(self.server, before.server),
            nginx: per(self.nginx, before.nginx),
            driver: per(self.driver, before.driver),
        }
    }

    /// Runs `f` and returns its result with the vCPU each used meanwhile.
    fn measure<T>(p: &Pids, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, Usage)> {
        let before = Usage::now(p)?;
        let t = Instant::now();
        let out = f()?;
        let after = Usage::now(p)?;
        Ok((out, after.rate_since(before, t.elapsed().as_secs_f64())))
    }
}

/// One window at the fixed rate.
#[derive(Clone, Copy)]
struct Window {
    cpu: Usage,
    waypoint_rss_mib: f64,
    p50: f64,
    p99: f64,
}

/// One closed-loop run: requests/s and the vCPU each used.
struct Closed {
    rate: f64,
    cpu: Usage,
}

/// The nginx binary: on the PATH, or where Debian puts it.
fn nginx_binary() -> anyhow::Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
        .context("nginx is not installed: install the Debian package nginx (scripts/bench does)")
}

/// nginx's version line (`nginx version: nginx/1.22.1`).
fn nginx_version(nginx: &std::path::Path) -> String {
    std::process::Command::new(nginx)
        .arg("-v")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stderr)
                .trim()
                .trim_start_matches("nginx version: ")
                .to_string()
        })
        .unwrap_or_else(|_| "nginx".into())
}

/// nginx's configuration, everything under `dir`.
fn nginx_conf(dir: &std::path::Path) -> String {
    let d = dir.display();
    let body = "x".repeat(BODY_BYTES);
    format!(
        "worker_processes 1;\nmaster_process off;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_timeout 300s;\n  keepalive_requests 100000000;\n  \
         client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  \
         uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  default_type text/plain;\n  \
         server {{\n    listen {H1_PORT};\n    listen {H2C_PORT} http2;\n    \
         location / {{ return 200 \"{body}\"; }}\n  }}\n}}\n"
    )
}

/// The lab's mesh with the nginx Services: both pods (or the plaintext one only) are
/// their endpoints, on nginx's ports.
fn mesh_with_nginx(mesh: &str) -> anyhow::Result<String> {
    let plain_at = mesh
        .find("- uid: cluster1//v1/Pod/default/plain\n")
        .context("no plaintext pod in the lab's mesh")?;
    let (server_part, plain_part) = mesh.split_at(plain_at);
    // Each pod's entry for `echo-direct`; the nginx Services' go after it.
    let anchor = format!("    default/{DIRECT_HOST}:\n      {SERVICE_PORT}: {APP_PORT}\n");
    let entries = |plain: bool| -> String {
        SERVICES
            .iter()
            .filter(|s| plain || !s.plain_only)
            .map(|s| {
                format!(
                    "    default/{}:\n      {SERVICE_PORT}: {}\n",
                    s.host, s.port
                )
            })
            .collect()
    };
    if !server_part.contains(&anchor) || !plain_part.contains(&anchor) {
        bail!("the lab's mesh has no `{DIRECT_HOST}` entry in both pods");
    }
    let mut out = server_part.replacen(&anchor, &format!("{anchor}{}", entries(false)), 1);
    out += &plain_part.replacen(&anchor, &format!("{anchor}{}", entries(true)), 1);
    for s in SERVICES {
        let name = s.host.split('.').next().unwrap_or(s.host);
        out += &format!(
            "- name: {name}\n  namespace: default\n  hostname: {}\n  vips: [\"/{}\"]\n  ports: {{{SERVICE_PORT}: {}}}\n",
            s.host, s.vip, s.port
        );
        if s.waypoint {
            out += &format!(
                "  waypoint: {{destination: \"/{WAYPOINT_IP}\", hboneMtlsPort: {WAYPOINT_PORT}}}\n"
            );
        }
    }
    Ok(out)
}

/// One h2c request on a connection of its own: (status, body length).
fn h2c_once(lab: &L7Lab, path: Path) -> anyhow::Result<(u16, usize)> {
    let io = lab.connect_to(path.dst())?;
    io.set_nodelay(true)?;
    lab.rt.block_on(async move {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io)).await?;
        tokio::spawn(conn);
        let r = sender
            .send_request(request(path, &Bytes::from_static(b"x")))
            .await?;
        let status = r.status().as_u16();
        let body = r.into_body().collect().await?.to_bytes();
        Ok((status, body.len()))
    })
}

/// Starts nginx in the server node, adds its Services to the mesh, and waits until each
/// answers `return 200` of [`BODY_BYTES`] through the waypoint and directly. Returns
/// nginx's pid and version.
fn start(lab: &L7Lab) -> anyhow::Result<(u32, String)> {
    let nodes = &lab.nodes;
    let nginx = nginx_binary()?;
    let version = nginx_version(&nginx);
    let dir = nodes.lab.dir.path().join("nginx");
    std::fs::create_dir_all(&dir)?;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(&dir))?;
    let (prefix, conf_arg, err_log) = (
        dir.display().to_string(),
        conf.display().to_string(),
        dir.join("error.log").display().to_string(),
    );
    let p = nodes.lab.spawn(
        &nodes.server_ns,
        "nginx",
        &nginx,
        &["-p", &prefix, "-e", &err_log, "-c", &conf_arg],
        &[],
    )?;
    let mesh = std::fs::read_to_string(&nodes.config_path)?;
    std::fs::write(&nodes.config_path, mesh_with_nginx(&mesh)?)?;
    let answers = |path: Path, h2c: bool| -> bool {
        if h2c {
            return matches!(h2c_once(lab, path), Ok((200, BODY_BYTES)));
        }
        let req = request(path, &Bytes::from_static(b"x"));
        lab.send_http1_to(path.dst(), vec![req])
            .is_ok_and(|r| r[0].status == 200 && r[0].body.len() == BODY_BYTES)
    };
    for (s, h2c) in [
        (&NGINX, false),
        (&NGINX_DIRECT, false),
        (&NGINX_H2C, true),
        (&NGINX_PLAIN, false),
        (&NGINX_PLAIN_DIRECT, false),
    ] {
        let up = ambit_netns_lab::wait_until(
            &format!("nginx to answer through {}", s.host),
            Duration::from_secs(20),
            || !nodes.lab.is_running(p.pid) || answers(s.path(), h2c),
        );
        if up.is_err() || !nodes.lab.is_running(p.pid) {
            let log = std::fs::read_to_string(&p.log).unwrap_or_default();
            let err = std::fs::read_to_string(&err_log).unwrap_or_default();
            bail!(
                "nginx did not answer through {} ({}); its output:\n{log}\nits error log:\n{err}",
                s.host,
                up.err().map_or("it exited".to_string(), |e| e.to_string())
            );
        }
    }
    Ok((p.pid, version))
}

/// The figures of a column; "—" where the column has none.
fn cell(v: &[f64], unit: &str, digits: usize) -> String {
    if v.is_empty() || v.iter().all(|x| x.is_nan()) {
        return "—".into();
    }
    fmt(v, unit, digits)
}

/// Runs the nginx comparison on a launched lab; returns its markdown.
pub fn run(
    lab: &L7Lab,
    rounds: usize,
    secs: u64,
    workers: Option<usize>,
) -> anyhow::Result<String> {
    let (nginx, version) = start(lab)?;
    let pids = Pids {
        waypoint: lab.waypoint.pid,
        client: lab.nodes.client_proxy.pid,
        server: lab.nodes.server_proxy.pid,
        nginx,
        driver: std::process::id(),
    };
    // The fixed-rate window: as long as bench_waypoint's own CPU-at-1000 figure.
    let window = secs.max(10);
    // [variant][0 through the waypoint, 1 direct], one window a round.
    let mut fixed: Vec<[Vec<Window>; 2]> = VARIANTS.iter().map(|_| Default::default()).collect();
    // [closed-loop run], one a round.
    let mut closed: Vec<Vec<Closed>> = CLOSED.iter().map(|_| Vec::new()).collect();
    let mut failures = Vec::new();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..VARIANTS.len()).collect();
        let paths = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        if round % 2 == 1 {
            order.reverse();
        }
        for &v in &order {
            for p in paths {
                let path = if p == 0 {
                    VARIANTS[v].through
                } else {
                    VARIANTS[v].direct
                };
                let shape = VARIANTS[v].shape;
                let (lat, cpu) =
                    Usage::measure(&pids, || paced_as(lab, path, shape, 1000, 4, window))?;
                let (p50, p99) = p50_p99(&lat);
                fixed[v][p].push(Window {
                    cpu,
                    waypoint_rss_mib: common::status_kib(pids.waypoint, "VmRSS")? as f64 / 1024.0,
                    p50,
                    p99,
                });
            }
        }
        let mut order: Vec<usize> = (0..CLOSED.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for k in order {
            let run = &CLOSED[k];
            let streams = usize::from(run.h2c);
            let measured = Usage::measure(&pids, || {
                load_as(lab, run.path, run.shape, run.h2c, 16, streams, secs)
            });
            match measured {
                Ok((rate, cpu)) => {
                    eprintln!(
                        "  {}: {rate:.0} requests/s, the waypoint {:.2} vCPU",
                        run.name(),
                        cpu.waypoint
                    );
                    closed[k].push(Closed { rate, cpu });
                }
                // One failed run leaves a gap and a note, not a lost benchmark.
                Err(e) => {
                    eprintln!("  {}: failed: {e:#}", run.name());
                    failures.push(format!("round {}, {}: {e:#}", round + 1, run.name()));
                }
            }
        }
        eprintln!("nginx: round {}/{rounds} done", round + 1);
    }
    let mut out = render(&fixed, &closed, rounds, secs, window, workers, &version);
    if !failures.is_empty() {
        out.push_str("\nFailed runs (left out of the table):\n\n");
        for f in failures {
            out.push_str(&format!("- {f}\n"));
        }
    }
    Ok(out)
}

fn render(
    fixed: &[[Vec<Window>; 2]],
    closed: &[Vec<Closed>],
    rounds: usize,
    secs: u64,
    window: u64,
    workers: Option<usize>,
    version: &str,
) -> String {
    use std::fmt::Write as _;
    let col = |v: usize, p: usize, f: &dyn Fn(&Window) -> f64| -> Vec<f64> {
        fixed[v][p].iter().map(f).collect()
    };
    // The echo app's CPU: the driver's excess over the nginx run (both endpoints) of the
    // same round and path, whose load generator did the same work.
    let echo_app = |p: usize| -> Vec<f64> {
        fixed[0][p]
            .iter()
            .zip(&fixed[1][p])
            .map(|(e, n)| e.cpu.driver - n.cpu.driver)
            .collect()
    };
    let backend = |v: usize, p: usize| -> Vec<f64> {
        if VARIANTS[v].nginx {
            col(v, p, &|w| w.cpu.nginx)
        } else {
            echo_app(p)
        }
    };
    let path_total = |v: usize, p: usize| -> Vec<f64> {
        col(v, p, &|w| w.cpu.waypoint + w.cpu.client + w.cpu.server)
            .iter()
            .zip(backend(v, p))
            .map(|(a, b)| a + b)
            .collect()
    };
    let mut out = String::new();
    let _ = write!(
        out,
        "## The waypoint in front of nginx (`bench_waypoint --nginx`)\n\n\
         The waypoint's worker threads: {}. Backends: the lab's echo app (HTTP/1.1 and h2c, in this driver's process: its CPU is the driver's excess over the nginx run of the same round), and {version} in the server node (one process, access log off, keep-alive, `return 200` of {BODY_BYTES} B; h2c with prior knowledge on a port of its own), behind both pods as echo is (the server pod over HBONE through its node proxy, the plaintext pod straight from the waypoint) or behind the plaintext pod only. {rounds} interleaved rounds (the order alternates); medians (lowest–highest). CPU from /proc/<pid>/stat (utime + stime) over each window, in vCPU.\n\n\
         ### At 1000 requests/s (HTTP/1.1, 4 keep-alive connections, {window} s; POST with a 1 KiB body unless GET is named)\n\n",
        workers.map_or("its default".to_string(), |n| n.to_string()),
    );
    out.push_str("| figure |");
    for v in &VARIANTS {
        let _ = write!(
            out,
            " {}: through the waypoint | {}: without it |",
            v.name, v.name
        );
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(VARIANTS.len() * 2));
    out.push('\n');
    type Row<'a> = (
        &'a str,
        Box<dyn Fn(usize, usize) -> Vec<f64> + 'a>,
        &'a str,
        usize,
    );
    let rows: Vec<Row> = vec![
        (
            "**the waypoint process**",
            Box::new(|v, p| col(v, p, &|w| w.cpu.waypoint)),
            "vCPU",
            3,
        ),
        (
            "the client's node proxy",
            Box::new(|v, p| col(v, p, &|w| w.cpu.client)),
            "vCPU",
            3,
        ),
        (
            "the server's node proxy",
            Box::new(|v, p| col(v, p, &|w| w.cpu.server)),
            "vCPU",
            3,
        ),
        (
            "the backend (nginx; echo: the driver's excess)",
            Box::new(&backend),
            "vCPU",
            3,
        ),
        (
            "**the whole path** (node proxies + waypoint + backend)",
            Box::new(&path_total),
            "vCPU",
            3,
        ),
        (
            "the driver (load generator; with echo, the echo app too)",
            Box::new(|v, p| col(v, p, &|w| w.cpu.driver)),
            "vCPU",
            3,
        ),
        (
            "the waypoint's RSS after the window",
            Box::new(|v, p| {
                if p == 0 {
                    col(v, p, &|w| w.waypoint_rss_mib)
                } else {
                    Vec::new()
                }
            }),
            "MiB",
            1,
        ),
        ("p50", Box::new(|v, p| col(v, p, &|w| w.p50)), "µs", 0),
        ("p99", Box::new(|v, p| col(v, p, &|w| w.p99)), "µs", 0),
    ];
    for (name, f, unit, digits) in &rows {
        let _ = write!(out, "| {name} |");
        for v in 0..VARIANTS.len() {
            for p in 0..2 {
                let _ = write!(out, " {} |", cell(&f(v, p), unit, *digits));
            }
        }
        out.push('\n');
    }
    // Added latency: through the waypoint less without it, round by round.
    for (name, f) in [
        ("added p50", (|w: &Window| w.p50) as fn(&Window) -> f64),
        ("added p99", |w: &Window| w.p99),
    ] {
        let _ = write!(out, "| {name} (through less without, a round each) |");
        for [through, direct] in fixed {
            let added: Vec<f64> = through
                .iter()
                .zip(direct)
                .map(|(t, d)| f(t) - f(d))
                .collect();
            let _ = write!(out, " {} | |", cell(&added, "µs", 0));
        }
        out.push('\n');
    }
    let _ = write!(
        out,
        "\n### Closed loop through the waypoint (16 keep-alive connections, one request at a time on each, {secs} s)\n\nThe clients set `TCP_NODELAY`. nginx answers `return` before it has read a request body and resets the stream when the body is still to come; after 256 such streams the waypoint's HTTP/2 connection ends (its log: h2's \"locally-reset streams reached limit (256)\"), so an h2c POST run to nginx can fail: failed runs are listed under the table.\n\n| figure |"
    );
    for run in &CLOSED {
        let _ = write!(out, " {} |", run.name());
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(CLOSED.len()));
    out.push('\n');
    type ClosedRow = (&'static str, fn(&Closed) -> f64, &'static str, usize);
    let closed_rows: [ClosedRow; 7] = [
        ("requests/s", |r| r.rate, "", 0),
        (
            "**requests/s per waypoint core**",
            |r| r.rate / r.cpu.waypoint,
            "",
            0,
        ),
        ("the waypoint process", |r| r.cpu.waypoint, "vCPU", 2),
        ("the client's node proxy", |r| r.cpu.client, "vCPU", 2),
        ("the server's node proxy", |r| r.cpu.server, "vCPU", 2),
        ("nginx", |r| r.cpu.nginx, "vCPU", 2),
        (
            "the driver (with echo, the echo app too)",
            |r| r.cpu.driver,
            "vCPU",
            2,
        ),
    ];
    for (name, f, unit, digits) in closed_rows {
        let _ = write!(out, "| {name} |");
        for (k, run) in CLOSED.iter().enumerate() {
            let v: Vec<f64> = if name == "nginx" && run.backend != "nginx" {
                Vec::new()
            } else {
                closed[k].iter().map(f).collect()
            };
            let _ = write!(out, " {} |", cell(&v, unit, digits));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_mesh_gains_the_nginx_services_on_the_right_pods() {
        let mesh = super::mesh_with_nginx(&ambit_netns_lab::l7::l7_mesh()).unwrap();
        let plain_at = mesh.find("name: plain\n").unwrap();
        let (server, plain) = mesh.split_at(plain_at);
        assert!(server.contains("default/nginx.default.svc.cluster.local:\n      80: 8082\n"));
        assert!(!server.contains("nginx-plain"));
        assert!(plain.contains("default/nginx-plain.default.svc.cluster.local:\n      80: 8082\n"));
        assert!(plain.contains("default/nginx-h2c.default.svc.cluster.local:\n      80: 8083\n"));
        assert!(mesh.contains("- name: nginx-h2c\n"));
    }
}
