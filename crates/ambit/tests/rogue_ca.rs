//! `ambit ztunnel` against a rogue CA: one proxy per defect (an expired leaf, one not yet
//! valid, one with CA:TRUE, one with keyCertSign, one under a root the CA does not return,
//! one under an expired intermediate), each asked for its certificate by a connection to
//! its HBONE port every 50 ms. Each must refuse every leaf, name the cause in
//! `ambit_certificate_fetch_failures_total{cause}` once per CA request, show the identity as
//! unavailable in `/config_dump`, say when the node clock looks skewed and by how much, and
//! ask the CA no sooner than the backoff allows: watched over the first four CA requests
//! (however long they take to come), each retry comes at least the backoff's least delay
//! after the request before it, while connections were answered in between without
//! one. No root needed: dedicated mode on loopback.

#[path = "../../caclient/tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ambit_netns_lab::free_port;
use support::rogue_ca::Defect;

const SERVER_ID: &str = "spiffe://cluster.local/ns/default/sa/server";
/// CA requests watched: the first, then three retries.
const WATCHED: usize = 4;
/// The least wait before each retry, counted from the CA's receipt of the request before
/// it: the backoff's 1 s, doubled on each failure, less its 20 % jitter. The proxy cannot
/// ask sooner (its delay starts after that request failed), however slow the machine.
const LEAST_WAIT: [Duration; WATCHED - 1] = [
    Duration::from_millis(800),
    Duration::from_millis(1600),
    Duration::from_millis(3200),
];
/// Failure guard only.
const DEADLINE: Duration = Duration::from_secs(60);

struct Case {
    defect: Defect,
    cause: &'static str,
    /// A phrase of the error shown in `/config_dump`.
    says: &'static str,
    /// For the clock defects: the skew the warning must name, in seconds (inclusive range).
    skew: Option<(u64, u64)>,
}

const CASES: [Case; 6] = [
    Case {
        defect: Defect::Expired,
        cause: "expired",
        says: "before this node's clock",
        // Its end is 2 h before the CA's clock (whole seconds), a little more by ours.
        skew: Some((7200, 7260)),
    },
    Case {
        defect: Defect::NotYetValid,
        cause: "not_yet_valid",
        says: "after this node's clock",
        skew: Some((7140, 7200)),
    },
    Case {
        defect: Defect::CaTrue,
        cause: "ca_leaf",
        says: "CA:TRUE",
        skew: None,
    },
    Case {
        defect: Defect::KeyCertSign,
        cause: "ca_leaf",
        says: "keyCertSign",
        skew: None,
    },
    Case {
        defect: Defect::ForeignRoot,
        cause: "does_not_chain",
        says: "does not verify up to the root",
        skew: None,
    },
    Case {
        defect: Defect::ExpiredIntermediate,
        cause: "does_not_chain",
        says: "does not verify up to the root",
        skew: None,
    },
];

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The `certificates` of a `/config_dump` answer (its body is one JSON document).
fn certificates(response: &str) -> Option<Vec<serde_json::Value>> {
    let body = &response[response.find("\r\n\r\n")? + 4..];
    let start = body.find('{')?;
    let end = body.rfind('}')?;
    let v: serde_json::Value = serde_json::from_str(&body[start..=end]).ok()?;
    v["certificates"].as_array().cloned()
}

/// `ambit_certificate_fetch_failures_total` by cause, from a `/metrics` answer.
fn failures(metrics: &str) -> Vec<(String, usize)> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("ambit_certificate_fetch_failures_total{cause=\""))
        .filter_map(|l| {
            let (cause, n) = l.split_once("\"} ")?;
            Some((cause.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ambit ztunnel` for SERVER_ID against `ca`; returns it, its HBONE, admin and
/// stats addresses, and the lines it logs.
fn start_proxy(ca: &support::Server) -> (Kill, [SocketAddr; 3], Arc<Mutex<Vec<String>>>) {
    let (hbone, admin, stats) = (free_port(), free_port(), free_port());
    let yaml = "workloads:\n- {uid: s, name: server, namespace: default, serviceAccount: server, protocol: HBONE, workloadIps: [\"127.0.0.1\"]}\n";
    let mut child = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("ztunnel")
        .env_clear()
        .envs([
            ("PROXY_MODE", "dedicated"),
            ("PROXY_WORKLOAD_INFO", "default/server/server"),
            ("LOCAL_XDS", yaml),
            ("CA_ADDRESS", &format!("127.0.0.1:{}", ca.addr.port())),
            ("CA_ROOT_CA", &ca.root_pem),
            ("ALT_CA_HOSTNAME", support::CA_NAME),
            ("AUTH_TOKEN", "jwt-rogue"),
            ("SECRET_TTL", "2h"),
            ("IPV6_ENABLED", "false"),
            // Several proxies run at once: none takes the DNS proxy's fixed port.
            ("ISTIO_META_DNS_CAPTURE", "false"),
            ("AMBIT_HBONE_PORT", &hbone.to_string()),
            ("AMBIT_OUTBOUND_PORT", &free_port().to_string()),
            ("AMBIT_INBOUND_PLAINTEXT_PORT", &free_port().to_string()),
            ("AMBIT_ADMIN_ADDR", &format!("127.0.0.1:{admin}")),
            ("AMBIT_STATS_ADDR", &format!("127.0.0.1:{stats}")),
            (
                "AMBIT_READINESS_ADDR",
                &format!("127.0.0.1:{}", free_port()),
            ),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run ambit");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stdout = child.stdout.take().unwrap();
    {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
    }
    let local = |p| SocketAddr::from(([127, 0, 0, 1], p));
    (
        Kill(child),
        [local(hbone), local(admin), local(stats)],
        lines,
    )
}

/// Runs one proxy against `ca` (answering with `case.defect`) and checks what it did.
fn run(ca: &support::Server, case: &Case) -> Result<(), String> {
    let what = format!("{:?}", case.defect);
    let (_proxy, [hbone, admin, stats], lines) = start_proxy(ca);
    let requests = || ca.ca.seen.lock().unwrap().len();
    let poke = || drop(ambit_netns_lab::send_client_hello(hbone));
    // A TLS client makes the proxy fetch its certificate (the first attempts may come
    // before the listener is up).
    let deadline = Instant::now() + DEADLINE;
    while requests() == 0 {
        if Instant::now() > deadline {
            return Err(format!("{what}: the proxy never asked the CA"));
        }
        poke();
        std::thread::sleep(Duration::from_millis(50));
    }
    // Connections keep asking; only the backoff may let a request through. Counted: the
    // connections answered while the CA had seen k requests and saw none more.
    let mut quiet = [0usize; WATCHED + 1];
    let deadline = Instant::now() + DEADLINE;
    while requests() < WATCHED {
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: {} CA requests, not {WATCHED}: the proxy stopped retrying",
                requests()
            ));
        }
        let before = requests();
        poke();
        if requests() == before {
            quiet[before] += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let arrivals: Vec<SystemTime> = ca.ca.seen.lock().unwrap().iter().map(|s| s.at).collect();
    for (k, least) in LEAST_WAIT.iter().enumerate() {
        let waited = arrivals[k + 1]
            .duration_since(arrivals[k])
            .unwrap_or_default();
        if waited < *least {
            return Err(format!(
                "{what}: CA request {} came {waited:?} after request {}; the backoff allows no sooner than {least:?}",
                k + 2,
                k + 1
            ));
        }
        // Without connections during the backoff nothing was tried against it.
        if quiet[k + 1] == 0 {
            return Err(format!(
                "{what}: no connection came and went between CA requests {} and {}",
                k + 1,
                k + 2
            ));
        }
    }
    // Every request was refused under its cause (a request still being answered may
    // briefly make the two differ).
    let deadline = Instant::now() + DEADLINE;
    loop {
        let seen = get(stats, "/metrics").map(|m| failures(&m));
        let n = requests();
        if seen.as_deref() == Some(&[(case.cause.to_string(), n)][..]) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: ambit_certificate_fetch_failures_total is {seen:?}, expected {n} under cause {:?}",
                case.cause
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let dump = get(admin, "/config_dump")
        .and_then(|r| certificates(&r))
        .ok_or_else(|| format!("{what}: no certificates in /config_dump"))?;
    let cert = dump
        .iter()
        .find(|c| c["identity"] == SERVER_ID)
        .ok_or_else(|| format!("{what}: {SERVER_ID} not in /config_dump: {dump:?}"))?;
    let state = cert["state"].as_str().unwrap_or_default();
    if !state.starts_with("Unavailable: ") || !state.contains(case.says) {
        return Err(format!(
            "{what}: /config_dump state {state:?}, expected Unavailable naming {:?}",
            case.says
        ));
    }
    if cert["certChain"].as_array().is_some_and(|c| !c.is_empty()) {
        return Err(format!("{what}: a refused chain is shown: {cert}"));
    }
    let logged = lines.lock().unwrap().clone();
    let skews: Vec<u64> = logged
        .iter()
        .filter(|l| l.contains("node clock looks skewed"))
        .filter_map(|l| {
            let (_, rest) = l.split_once("skew_seconds=")?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    match case.skew {
        Some((low, high))
            if skews.is_empty() || skews.iter().any(|s| !(low..=high).contains(s)) =>
        {
            return Err(format!(
                "{what}: expected clock-skew warnings of {low}..={high} s, found {skews:?} in {logged:#?}"
            ));
        }
        Some(_) => {}
        None if !skews.is_empty() => {
            return Err(format!(
                "{what}: a clock-skew warning for a leaf inside its validity: {skews:?}"
            ));
        }
        None => {}
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogue_cas_leaves_are_refused_by_cause_and_asked_for_on_the_backoff() {
    let mut runs = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let ca = support::start_ca().await;
        *ca.ca.defect.lock().unwrap() = Some(case.defect);
        runs.push(tokio::task::spawn_blocking(move || run(&ca, &CASES[i])));
    }
    // Every proxy finishes (and is killed) before anything is asserted.
    let mut errors = Vec::new();
    for r in runs {
        match r.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(format!("a case panicked: {e}")),
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
