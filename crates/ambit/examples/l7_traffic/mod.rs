//! `bench_waypoint --traffic-policy`: what a DestinationRule and the egress path cost at
//! the waypoint, in interleaved rounds on one lab:
//!
//! - `echo` through the waypoint without a rule (today's pick: capacity-weighted at
//!   random), with a rule hashing on the source address (ring hash) and tracking outliers,
//!   and with `LEAST_REQUEST` (Istio's default once any rule applies): the rule is put in
//!   the waypoint's file before each run and waited for in `/config_dump`;
//! - the egress path: a ServiceEntry with `resolution: DNS` behind the waypoint, resolved
//!   through dnsmasq (TTL 300 s) to the lab's plaintext pod, the same echo app;
//! - `echo-direct`, the same endpoints without a waypoint.
//!
//! Each: requests/s of 1 KiB HTTP/1.1 (8 keep-alive connections) and HTTP/2 (one
//! connection, 16 streams), closed loop, and requests/s per waypoint core.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path as FsPath;
use std::time::Duration;

use ambit_netns_lab::l7::{l7_mesh, L7Lab, PLAIN_POD_IP};
use ambit_netns_lab::mesh::APP_PORT;
use ambit_netns_lab::waypoint::{WAYPOINT_IP, WAYPOINT_PORT};
use anyhow::Context;

use crate::common;
use crate::l7_load::{fmt, load, Path};

/// The egress ServiceEntry.
pub const EGRESS_HOST: &str = "plain.example.test";
pub const EGRESS_VIP: Ipv4Addr = Ipv4Addr::new(240, 240, 0, 12);
/// dnsmasq's address in the waypoint's node.
pub const DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 53);

/// The lab's mesh with the ServiceEntry as WDS carries it.
pub fn mesh() -> String {
    let base = l7_mesh();
    let at = base.find("\nservices:\n").map_or(base.len(), |i| i + 1);
    format!(
        "{}- uid: cluster1/networking.istio.io/ServiceEntry/default/plain/{EGRESS_HOST}
  name: plain-egress
  namespace: default
  hostname: {EGRESS_HOST}
  protocol: NONE
  serviceAccount: default
  trustDomain: cluster.local
  services:
    default/{EGRESS_HOST}:
      80: {APP_PORT}
{}- name: plain-egress
  namespace: default
  hostname: {EGRESS_HOST}
  vips: [\"/{EGRESS_VIP}\"]
  ports:
    80: {APP_PORT}
  waypoint: {{destination: \"/{WAYPOINT_IP}\", hboneMtlsPort: {WAYPOINT_PORT}}}
",
        &base[..at],
        &base[at..]
    )
}

/// A resolv.conf naming dnsmasq, in `dir`.
pub fn resolv_conf(dir: &FsPath) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.join("bench-resolv.conf");
    std::fs::write(&path, format!("nameserver {DNS_IP}\n"))?;
    Ok(path)
}

fn start_dns(lab: &L7Lab) -> anyhow::Result<()> {
    lab.nodes.lab.exec(
        &lab.nodes.server_ns,
        &["ip", "addr", "add", &format!("{DNS_IP}/32"), "dev", "lo"],
    )?;
    let args = [
        "--keep-in-foreground".to_string(),
        "--conf-file=/dev/null".into(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        "--no-poll".into(),
        "--bind-interfaces".into(),
        format!("--listen-address={DNS_IP}"),
        "--port=53".into(),
        "--local-ttl=300".into(),
        "--pid-file=".into(),
        "--user=root".into(),
        format!("--host-record={EGRESS_HOST},{PLAIN_POD_IP}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    lab.nodes
        .lab
        .spawn(
            &lab.nodes.server_ns,
            "dnsmasq",
            FsPath::new("dnsmasq"),
            &args,
            &[],
        )
        .context("dnsmasq (Debian's dnsmasq-base)")?;
    std::thread::sleep(Duration::from_millis(300));
    Ok(())
}

/// The rules compared, by name: the policy text (empty: no rule) and the load balancer
/// `/config_dump` shows when it is in force.
const RULES: [(&str, &str, &str); 3] = [
    ("no rule", "", ""),
    (
        "ring hash + outliers",
        "{loadBalancer: {consistentHash: {useSourceIp: true}}, outlierDetection: {consecutive5xxErrors: 5, interval: 10s, baseEjectionTime: 30s}}",
        "consistentHash",
    ),
    ("LEAST_REQUEST", "{loadBalancer: {simple: LEAST_REQUEST}}", "LEAST_REQUEST"),
];

fn put_rule(lab: &L7Lab, policy: &str, shows: &str) -> anyhow::Result<()> {
    let text = if policy.is_empty() {
        String::new()
    } else {
        format!("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: echo, namespace: default}}\nspec:\n  host: echo\n  trafficPolicy: {policy}\n")
    };
    let fresh = lab.policies.with_extension("new");
    std::fs::write(&fresh, text)?;
    std::fs::rename(&fresh, &lab.policies)?;
    ambit_netns_lab::wait_until("the rule in force", Duration::from_secs(10), || {
        lab.waypoint_config_dump().is_ok_and(|d| {
            let rules = &d["waypointDestinationRules"]["rules"];
            match shows {
                "" => rules.as_array().is_some_and(|r| r.is_empty()),
                s => rules[0]["trafficPolicy"]["loadBalancer"]
                    .to_string()
                    .contains(s),
            }
        })
    })
}

pub fn run(lab: &L7Lab, rounds: usize, secs: u64) -> anyhow::Result<String> {
    start_dns(lab)?;
    let egress = Path::Other {
        vip: EGRESS_VIP,
        host: EGRESS_HOST,
    };
    // Rows: the three rules on echo, egress, direct.
    let names: Vec<String> = RULES
        .iter()
        .map(|(n, _, _)| format!("`echo` through the waypoint, {n}"))
        .chain([
            format!("egress (`{EGRESS_HOST}`, DNS, plaintext) through the waypoint"),
            "`echo-direct`, no waypoint".to_string(),
        ])
        .collect();
    let mut h1 = vec![Vec::new(); names.len()];
    let mut h2 = vec![Vec::new(); names.len()];
    let mut h1_core = vec![Vec::new(); names.len()];
    let mut h2_core = vec![Vec::new(); names.len()];
    let wp = lab.waypoint.pid;
    let measure = |path: Path, h2: bool| -> anyhow::Result<(f64, f64)> {
        let before = common::cpu_seconds(wp)?;
        let (conns, streams) = if h2 { (1, 16) } else { (8, 0) };
        let rate = load(lab, path, h2, conns, streams, secs)?;
        let cpu = common::cpu_seconds(wp)? - before;
        Ok((rate, rate * secs as f64 / cpu.max(1e-9)))
    };
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..names.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let path = match i {
                0..=2 => {
                    let (_, policy, shows) = RULES[i];
                    put_rule(lab, policy, shows)?;
                    Path::Waypoint
                }
                3 => {
                    put_rule(lab, "", "")?;
                    egress
                }
                _ => Path::Direct,
            };
            let (rate, core) = measure(path, false)?;
            h1[i].push(rate);
            h1_core[i].push(core);
            let (rate, core) = measure(path, true)?;
            h2[i].push(rate);
            h2_core[i].push(core);
        }
        eprintln!("round {}/{rounds} done", round + 1);
    }
    let ratio =
        |v: &[f64], base: &[f64]| -> Vec<f64> { v.iter().zip(base).map(|(a, b)| a / b).collect() };
    let mut out = format!(
        "## A DestinationRule and the egress path (`bench_waypoint --traffic-policy`)\n\n{rounds} interleaved rounds (the order reversed every other round), {secs} s per load run, 1 KiB request bodies, closed loop; HTTP/1.1 over 8 keep-alive connections, HTTP/2 with 16 streams on one connection. The rule is swapped in the waypoint's file before each run. Per core: requests/s per second of the waypoint's CPU. Medians (lowest–highest); \"/ no rule\" is the ratio to the same round's run without a rule.\n\n| path | HTTP/1.1 req/s | per core | HTTP/2 req/s | per core | per core, HTTP/1.1 / no rule | per core, HTTP/2 / no rule |\n|---|---:|---:|---:|---:|---:|---:|\n"
    );
    for (i, name) in names.iter().enumerate() {
        let (r1, r2) = if i == 4 {
            ("–".to_string(), "–".to_string())
        } else {
            (
                fmt(&ratio(&h1_core[i], &h1_core[0]), "", 2),
                fmt(&ratio(&h2_core[i], &h2_core[0]), "", 2),
            )
        };
        let core = |v: &[f64]| {
            if i == 4 {
                "–".to_string()
            } else {
                fmt(v, "", 0)
            }
        };
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {r1} | {r2} |\n",
            fmt(&h1[i], "", 0),
            core(&h1_core[i]),
            fmt(&h2[i], "", 0),
            core(&h2_core[i]),
        ));
    }
    Ok(out)
}

/// The address the egress path is dialled at.
#[allow(dead_code)]
pub fn egress_dst() -> SocketAddr {
    SocketAddr::from((EGRESS_VIP, 80))
}
