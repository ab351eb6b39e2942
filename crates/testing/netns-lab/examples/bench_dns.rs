//! DNS queries per second: through ambit's DNS proxy, through Istio's ztunnel's, and
//! against a direct resolver, in the same run.
//!
//! ```text
//! bench_dns --ambit target/release/ambit [--peer ../shared/peers/istio-ztunnel] --out FILE
//!     [--rounds 3] [--seconds 5] [--clients 8]
//! ```
//!
//! Each round starts each proxy (ambit, then Istio's; the order alternates round after
//! round) alone in a network namespace of its own, in dedicated mode with the DNS proxy on
//! 127.0.0.1:15053 and a local config holding the client workload and one service. Then
//! `--clients` closed-loop UDP clients (one query in flight each) ask for the service's
//! name (an authoritative mesh answer) for `--seconds`. The direct figure is the same load
//! against this driver's own minimal resolver (a fixed reply per query) in the same kind
//! of namespace. Reported: the median and the spread (min–max) over the rounds. Only a
//! NOERROR reply with an answer record counts as answered; any other reply to a query
//! (SERVFAIL, say) is counted apart and shown, never as throughput.
//!
//! Needs root (network namespaces). Everything it creates is removed at the end.
#![cfg_attr(test, allow(dead_code))]

use std::net::UdpSocket;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambit_netns_lab::peer::IstioZtunnel;
use ambit_netns_lab::Lab;
use anyhow::{bail, Context};

const DNS_ADDR: &str = "127.0.0.1:15053";
const READY_GUARD: Duration = Duration::from_secs(30);
const MESH: &str = r#"
workloads:
- {uid: w0, name: w0, namespace: ns0, serviceAccount: default, workloadIps: ["10.1.0.1"], services: {}}
services:
- {name: echo, namespace: ns0, hostname: echo.ns0.svc.cluster.local, vips: ["/10.96.0.1"], ports: {80: 80}}
"#;

struct Args {
    ambit: PathBuf,
    peer: Option<PathBuf>,
    out: PathBuf,
    rounds: usize,
    seconds: u64,
    clients: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        ambit: PathBuf::new(),
        peer: None,
        out: PathBuf::new(),
        rounds: 3,
        seconds: 5,
        clients: 8,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--ambit" => a.ambit = val()?.into(),
            "--peer" => a.peer = Some(val()?.into()),
            "--out" => a.out = val()?.into(),
            "--rounds" => a.rounds = val()?.parse().context("--rounds")?,
            "--seconds" => a.seconds = val()?.parse().context("--seconds")?,
            "--clients" => a.clients = val()?.parse().context("--clients")?,
            other => bail!("unknown argument {other} (see the top of bench_dns.rs)"),
        }
    }
    if a.ambit.as_os_str().is_empty() || a.out.as_os_str().is_empty() {
        bail!("--ambit PATH and --out FILE are required");
    }
    Ok(a)
}

/// A query for `echo.ns0.svc.cluster.local` A with this id.
fn query(id: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in ["echo", "ns0", "svc", "cluster", "local"] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// What a datagram is to the query with id `id`.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// A response, NOERROR, with at least one answer record.
    Answered,
    /// A response that answers nothing: another response code (SERVFAIL, NXDOMAIN,
    /// REFUSED, ...) or no answer record.
    Failed,
    /// Not a response to this query (a late one to an earlier query, or not DNS).
    Other,
}

fn classify(reply: &[u8], id: u16) -> Reply {
    if reply.len() < 12 || reply[..2] != id.to_be_bytes() || reply[2] & 0x80 == 0 {
        return Reply::Other;
    }
    let rcode = reply[3] & 0x0f;
    let answers = u16::from_be_bytes([reply[6], reply[7]]);
    if rcode == 0 && answers > 0 {
        Reply::Answered
    } else {
        Reply::Failed
    }
}

/// Queries per second a load answered, and how many replies answered nothing.
struct Load {
    qps: f64,
    failed: u64,
}

/// Closed-loop load from `clients` sockets made in `ns`.
fn load(ns: &str, clients: usize, seconds: u64) -> anyhow::Result<Load> {
    let sockets = Lab::in_netns(ns, || {
        (0..clients)
            .map(|_| {
                let s = UdpSocket::bind("127.0.0.1:0")?;
                s.connect(DNS_ADDR)?;
                s.set_read_timeout(Some(Duration::from_millis(500)))?;
                Ok(s)
            })
            .collect::<std::io::Result<Vec<_>>>()
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let stop = stop.clone();
            let answered = answered.clone();
            let failed = failed.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                let mut id = (i as u16).wrapping_mul(4099);
                while !stop.load(Ordering::Relaxed) {
                    id = id.wrapping_add(1);
                    if s.send(&query(id)).is_err() {
                        continue;
                    }
                    // Read until this query's answer or a timeout: a late answer to an
                    // earlier query is skipped (matched by id), so one slow reply costs
                    // that query alone, not every query after it.
                    while let Ok(n) = s.recv(&mut buf) {
                        match classify(&buf[..n], id) {
                            Reply::Answered => answered.fetch_add(1, Ordering::Relaxed),
                            Reply::Failed => failed.fetch_add(1, Ordering::Relaxed),
                            Reply::Other => continue,
                        };
                        break;
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    Ok(Load {
        qps: answered.load(Ordering::Relaxed) as f64 / seconds as f64,
        failed: failed.load(Ordering::Relaxed),
    })
}

/// Waits until something answers on 127.0.0.1:15053 in `ns`.
fn wait_ready(ns: &str) -> anyhow::Result<()> {
    let s = Lab::in_netns(ns, || {
        let s = UdpSocket::bind("127.0.0.1:0")?;
        s.connect(DNS_ADDR)?;
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        Ok(s)
    })?;
    let deadline = Instant::now() + READY_GUARD;
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        let _ = s.send(&query(7));
        if let Ok(n) = s.recv(&mut buf) {
            // An answer with one record: the mesh state is loaded.
            if n > 12 && buf[6..8] == [0, 1] {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("nothing answered the mesh name on {DNS_ADDR} within {READY_GUARD:?}")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Path3 {
    Direct,
    Ambit,
    Istio,
}

fn round(which: Path3, args: &Args, peer: Option<&IstioZtunnel>) -> anyhow::Result<Load> {
    let lab = Lab::new("bdns")?;
    let ns = lab.netns("node")?;
    lab.exec(&ns, &["ip", "link", "set", "lo", "up"])?;
    if which == Path3::Direct {
        // A fixed reply to every query: the cost of the client side and the kernel.
        let server = Lab::in_netns(&ns, || UdpSocket::bind(DNS_ADDR))?;
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, src)) = server.recv_from(&mut buf) {
                let mut r = buf[..n].to_vec();
                if r.len() < 12 {
                    continue;
                }
                r[2] |= 0x84;
                r[3] = 0x80;
                r[6..8].copy_from_slice(&[0, 1]);
                r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 96, 0, 1]);
                let _ = server.send_to(&r, src);
            }
        });
        wait_ready(&ns)?;
        return load(&ns, args.clients, args.seconds);
    }
    let config = lab.dir.path().join("mesh.yaml");
    std::fs::write(&config, MESH)?;
    let mut env: Vec<(&str, String)> = vec![
        ("LOCAL_XDS_PATH", config.display().to_string()),
        ("XDS_ADDRESS", String::new()),
        ("PROXY_MODE", "dedicated".into()),
        ("PROXY_WORKLOAD_INFO", "ns0/w0/default".into()),
        ("ISTIO_META_DNS_CAPTURE", "true".into()),
        ("ISTIO_META_DNS_PROXY_ADDR", DNS_ADDR.into()),
        ("RUST_LOG", "warn".into()),
    ];
    let (program, argv): (PathBuf, &[&str]) = match (which, peer) {
        (Path3::Istio, Some(p)) => {
            env.push(("FAKE_CA", "true".into()));
            (p.bin.clone(), &["proxy", "ztunnel"])
        }
        _ => (args.ambit.clone(), &["ztunnel"]),
    };
    let proc = lab.spawn(&ns, "proxy", &program, argv, &env)?;
    wait_ready(&ns).with_context(|| {
        format!(
            "the proxy's log:\n{}",
            std::fs::read_to_string(&proc.log).unwrap_or_default()
        )
    })?;
    load(&ns, args.clients, args.seconds)
}

/// Median (the mean of the middle two for an even count), minimum and maximum.
fn summary(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let median = if !n.is_multiple_of(2) {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (median, v[0], v[n - 1])
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let peer = match &args.peer {
        Some(dir) => Some(IstioZtunnel::find(dir)?),
        None => None,
    };
    let mut paths = vec![Path3::Direct, Path3::Ambit];
    if peer.is_some() {
        paths.push(Path3::Istio);
    }
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    let mut failed = vec![0u64; paths.len()];
    for r in 0..args.rounds {
        let mut order: Vec<usize> = (0..paths.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let load = round(paths[i], &args, peer.as_ref())?;
            results[i].push(load.qps);
            failed[i] += load.failed;
        }
    }
    let names = [
        "direct resolver",
        "ambit DNS proxy",
        "Istio ztunnel DNS proxy",
    ];
    let direct = summary(&mut results[0].clone()).0;
    let mut report = format!(
        "### DNS queries per second ({} clients, one query in flight each, {} s per run, {} interleaved rounds)\n\n\
         | path | median q/s | spread (min–max) | vs direct | replies answering nothing (all rounds) |\n|---|---|---|---|---|\n",
        args.clients, args.seconds, args.rounds
    );
    for (i, p) in paths.iter().enumerate() {
        let (med, lo, hi) = summary(&mut results[i]);
        report.push_str(&format!(
            "| {} | {med:.0} | {lo:.0}–{hi:.0} | {:.2} | {} |\n",
            names[*p as usize],
            med / direct,
            failed[i]
        ));
    }
    print!("{report}");
    std::fs::write(&args.out, report).with_context(|| format!("writing {}", args.out.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply to `query(id)` with this flags byte (RA, rcode) and answer count.
    fn reply(id: u16, flags: u8, answers: u16) -> Vec<u8> {
        let mut r = query(id);
        r[2] |= 0x80;
        r[3] = flags;
        r[6..8].copy_from_slice(&answers.to_be_bytes());
        r
    }

    #[test]
    fn only_a_noerror_answer_counts_as_answered() {
        assert_eq!(classify(&reply(7, 0x80, 1), 7), Reply::Answered);
        // SERVFAIL, NXDOMAIN and REFUSED, and a NOERROR without a record, answer nothing.
        for rcode in [2, 3, 5] {
            assert_eq!(classify(&reply(7, 0x80 | rcode, 0), 7), Reply::Failed);
            assert_eq!(classify(&reply(7, 0x80 | rcode, 1), 7), Reply::Failed);
        }
        assert_eq!(classify(&reply(7, 0x80, 0), 7), Reply::Failed);
        // Another query's reply, the query itself echoed, or a scrap: not this one's.
        assert_eq!(classify(&reply(6, 0x80, 1), 7), Reply::Other);
        assert_eq!(classify(&query(7), 7), Reply::Other);
        assert_eq!(classify(&[0, 7, 0x80], 7), Reply::Other);
    }
}
