//! The ceiling of the benchmark's path: one iperf3 stream through two relays standing where
//! the node proxies stand (client node: a port redirected to the relay; server node: reached
//! over the veth, uncaptured), each pair measured right after a direct run:
//!
//! - two plain TCP relays (socat, read/write): what any two-hop user-space proxy could reach
//!   here before paying for encryption;
//! - two bare TLS relays: the node proxies' own TLS (their rustls configuration and
//!   certificates, `ambit_hbone::tls::{connect, accept}`, `ReadAhead` on the client side as
//!   in the proxies, mutual TLS 1.3),
//!   the same 256 KiB copies, no HTTP/2 and no proxy logic: what any proxy that encrypts
//!   with this TLS stack could reach here.
//!
//! The four paths (direct, both pairs, the node proxies) are measured in rounds taken in
//! turn, with the CPU each relay spent, how busy the machine was, and the p50 of 64 B round
//! trips on one reused connection (the latency any two user-space hops add here).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use ambit_identity::{CertificateAuthority, SpiffeId};
use ambit_netns_lab::mesh::{TwoNodes, SERVER_IP};
use ambit_netns_lab::stats::median;
use ambit_netns_lab::Lab;
use anyhow::Context;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::common;

/// The ports of one relay pair: the client dials `dial` (redirected to the client node's
/// relay on `client`), which connects uncaptured to the server node's relay on `server`,
/// which connects to the app.
#[derive(Clone, Copy)]
struct Hop {
    dial: u16,
    client: u16,
    server: u16,
}

impl Hop {
    const fn new(dial: u16, client: u16, server: u16) -> Hop {
        Hop {
            dial,
            client,
            server,
        }
    }
}

const PLAIN_IPERF: Hop = Hop::new(5301, 16001, 16008);
const TLS_IPERF: Hop = Hop::new(5302, 16002, 16009);
const PLAIN_ECHO: Hop = Hop::new(5303, 16003, 16010);
const TLS_ECHO: Hop = Hop::new(5304, 16004, 16011);

/// Bytes per read of every relay: as large as the node proxy's largest reads.
pub const RELAY_BUFFER: usize = 256 * 1024;
/// Where a TLS relay's copy buffer starts in its allocation: a quarter page in, as the node
/// proxy's bulk buffers do, so that rustls' copy of the payload into its record does not
/// hit the slow path of 4 KiB aliasing (BENCHMARKS.md, "4K aliasing").
const BUFFER_OFFSET: usize = 1024;

/// One path's single streams over the rounds.
#[derive(Default)]
pub struct Streams {
    /// Median rate, bits per second.
    pub bits_per_second: f64,
    /// Median over the rounds of (this path's rate / the round's direct rate).
    pub of_direct: f64,
    /// Whole machine busy during the runs, mean (busy, steal) in percent.
    pub busy: (f64, f64),
    /// CPU seconds per GB carried of the client node's and the server node's relay or node
    /// proxy (zero for the direct path).
    pub cpu_per_gb: (f64, f64),
}

pub struct Ceiling {
    pub direct: Streams,
    pub plain: Streams,
    pub tls: Streams,
    pub proxies: Streams,
    /// Median over the rounds of (node proxies' rate / the TLS relays' rate).
    pub proxies_of_tls: f64,
    /// The TLS 1.3 suite the TLS relays negotiated.
    pub tls_suite: String,
    /// p50 of 64 B round trips on one reused connection, µs: direct, plain relays, TLS
    /// relays, node proxies (each the median over the rounds).
    pub round_trip_p50: [f64; 4],
}

/// Rounds of the four paths (direct, plain relays, TLS relays, node proxies) taken in turn,
/// so that all four see the same moments of this machine, whose speed drifts within
/// minutes.
pub const ROUNDS: usize = 3;

/// What the rounds reach: uncaptured ports of an iperf3 server and of a mirroring echo app in
/// the server node, captured ports reaching the same through the node proxies, and the node
/// proxies' pids (client node's first).
pub struct Apps {
    pub iperf: u16,
    pub echo: u16,
    pub mesh_iperf: u16,
    pub mesh_echo: u16,
    pub proxies: [u32; 2],
}

/// Measures both relay pairs beside the direct path and the node proxies.
pub fn measure(
    nodes: &TwoNodes,
    apps: &Apps,
    secs: u64,
    round_trips: usize,
) -> anyhow::Result<Ceiling> {
    // Inserted above the capture rule: each pair's hop over the veth is not captured, and its
    // dialed port is redirected to its client relay instead of the node proxy.
    for hop in [PLAIN_IPERF, TLS_IPERF, PLAIN_ECHO, TLS_ECHO] {
        let (dial, to, server) = (
            hop.dial.to_string(),
            hop.client.to_string(),
            hop.server.to_string(),
        );
        for rule in [
            &["--dport", &server, "-j", "RETURN"][..],
            &["--dport", &dial, "-j", "REDIRECT", "--to-ports", &to][..],
        ] {
            let mut args = vec!["iptables", "-w", "-t", "nat", "-I", "OUTPUT", "-p", "tcp"];
            args.extend_from_slice(rule);
            nodes.lab.exec(&nodes.client_ns, &args)?;
        }
    }
    let socats = start_socat_relays(nodes, PLAIN_IPERF, apps.iperf)?;
    start_socat_relays(nodes, PLAIN_ECHO, apps.echo)?;
    let tls = TlsRelays::start(nodes, TLS_IPERF, apps.iperf)?;
    let _tls_echo = TlsRelays::start(nodes, TLS_ECHO, apps.echo)?;

    // CPU seconds so far of a path's two hops, client node's first (none for direct).
    let hop_cpu = |path: usize| -> anyhow::Result<[f64; 2]> {
        let mut cpu = [0.0; 2];
        for (side, c) in cpu.iter_mut().enumerate() {
            *c = match path {
                1 => {
                    // socat serves each connection in a child; the parent counts a child's
                    // CPU once it has reaped it.
                    wait_children_reaped(socats[side])?;
                    children_cpu_seconds(socats[side])?
                }
                2 => tls.cpu_seconds(side)?,
                3 => common::cpu_seconds(apps.proxies[side])?,
                _ => 0.0,
            };
        }
        Ok(cpu)
    };
    // Per path: rates, machine busy, CPU seconds of its two hops, bytes.
    let mut rates: [Vec<f64>; 4] = Default::default();
    let mut busy = [(0.0, 0.0); 4];
    let mut cpu = [[0.0; 2]; 4];
    let mut gbytes = [0.0; 4];
    let ports = [
        apps.iperf,
        PLAIN_IPERF.dial,
        TLS_IPERF.dial,
        apps.mesh_iperf,
    ];
    for round in 1..=ROUNDS {
        println!("ceiling round {round}/{ROUNDS}: one iperf3 stream direct, through the plain relays, the TLS relays, the node proxies ...");
        for path in 0..4 {
            let before = hop_cpu(path)?;
            let (bps, (b, st)) = common::machine_busy(|| {
                common::iperf(&nodes.client_ns, SERVER_IP, ports[path], 1, secs)
                    .with_context(|| format!("iperf3 via port {}", ports[path]))
            })?;
            let after = hop_cpu(path)?;
            rates[path].push(bps);
            busy[path].0 += b / ROUNDS as f64;
            busy[path].1 += st / ROUNDS as f64;
            for side in 0..2 {
                cpu[path][side] += after[side] - before[side];
            }
            gbytes[path] += bps * secs as f64 / 8e9;
        }
        println!(
            "  {:.2} / {:.2} / {:.2} / {:.2} Gbit/s",
            rates[0][round - 1] / 1e9,
            rates[1][round - 1] / 1e9,
            rates[2][round - 1] / 1e9,
            rates[3][round - 1] / 1e9,
        );
    }
    let tls_suite = tls.suite();
    drop(tls);

    let ratio_median = |num: &[f64], den: &[f64]| {
        median(&num.iter().zip(den).map(|(n, d)| n / d).collect::<Vec<_>>())
    };
    let streams = |path: usize| Streams {
        bits_per_second: median(&rates[path]),
        of_direct: ratio_median(&rates[path], &rates[0]),
        busy: busy[path],
        cpu_per_gb: (cpu[path][0] / gbytes[path], cpu[path][1] / gbytes[path]),
    };

    println!("{ROUNDS} x {round_trips} round trips of 64 B: direct, plain relays, TLS relays, node proxies ...");
    let ports = [apps.echo, PLAIN_ECHO.dial, TLS_ECHO.dial, apps.mesh_echo];
    let mut p50s: [Vec<f64>; 4] = Default::default();
    for _ in 0..ROUNDS {
        for (samples, port) in p50s.iter_mut().zip(ports) {
            let dst = SocketAddr::from((SERVER_IP, port));
            let pcts = common::round_trips(&nodes.client_ns, dst, 64, round_trips)
                .with_context(|| format!("64 B round trips via port {port}"))?;
            samples.push(pcts.p50);
        }
    }

    Ok(Ceiling {
        direct: streams(0),
        plain: streams(1),
        tls: streams(2),
        proxies: streams(3),
        proxies_of_tls: ratio_median(&rates[3], &rates[2]),
        tls_suite,
        round_trip_p50: p50s.map(|v| median(&v)),
    })
}

// ---------------------------------------------------------------------------------------
// Plain relays: socat.

/// Starts the two socat relays of `hop` towards `app_port`; returns their pids, client
/// node's first.
fn start_socat_relays(nodes: &TwoNodes, hop: Hop, app_port: u16) -> anyhow::Result<[u32; 2]> {
    let socat = std::path::Path::new("socat");
    let client_relay = [
        format!("TCP-LISTEN:{},fork,reuseaddr", hop.client),
        format!("TCP:{SERVER_IP}:{}", hop.server),
    ];
    let server_relay = [
        format!("TCP-LISTEN:{},fork,reuseaddr", hop.server),
        format!("TCP:127.0.0.1:{app_port}"),
    ];
    let buffer = RELAY_BUFFER.to_string();
    let mut pids = [0; 2];
    for (i, (ns, side, ends, port)) in [
        (&nodes.client_ns, "client", &client_relay, hop.client),
        (&nodes.server_ns, "server", &server_relay, hop.server),
    ]
    .into_iter()
    .enumerate()
    {
        let args = ["-b", buffer.as_str(), ends[0].as_str(), ends[1].as_str()];
        let name = format!("relay-{side}-{port}");
        pids[i] = nodes.lab.spawn(ns, &name, socat, &args, &[])?.pid;
        common::wait_listening(&nodes.lab, ns, port)?;
    }
    Ok(pids)
}

/// utime + stime of the reaped children of a process (fields 16 and 17 of its stat).
fn children_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let f = common::stat_fields(&format!("/proc/{pid}/stat"))?;
    // `stat_fields` starts at field 3.
    let cutime: f64 = f.get(13).context("no cutime")?.parse()?;
    let cstime: f64 = f.get(14).context("no cstime")?.parse()?;
    Ok((cutime + cstime) / common::clock_ticks())
}

fn wait_children_reaped(pid: u32) -> anyhow::Result<()> {
    ambit_netns_lab::wait_until(
        "socat to reap its children",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .is_ok_and(|c| c.trim().is_empty())
        },
    )
}

// ---------------------------------------------------------------------------------------
// Bare TLS relays: the node proxies' TLS stack without HTTP/2.

/// Two relays, each a current-thread tokio runtime on its own thread (as the node proxy runs
/// one worker here) inside its node's namespace. Stopped when dropped.
struct TlsRelays {
    /// Thread ids, client node's first.
    tids: [i32; 2],
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<anyhow::Result<()>>>,
    suite: Arc<std::sync::Mutex<Option<String>>>,
}

#[derive(Clone, Copy)]
enum Side {
    /// Accepts plaintext, dials the server relay with TLS.
    Client,
    /// Accepts TLS, dials the app in plaintext.
    Server,
}

impl TlsRelays {
    fn start(nodes: &TwoNodes, hop: Hop, app_port: u16) -> anyhow::Result<TlsRelays> {
        let td = "cluster.local";
        let ca = CertificateAuthority::ephemeral(td)?;
        let client_id = SpiffeId::new(td, "default", "relay-client")?;
        let server_id = SpiffeId::new(td, "default", "relay-server")?;
        let day = Duration::from_secs(86_400);
        let client_tls = ambit_identity::client_config(
            &ca.issue(&client_id, day)?,
            std::slice::from_ref(&server_id),
        )?;
        let server_tls = ambit_identity::server_config(&ca.issue(&server_id, day)?)?;
        let suite = Arc::new(std::sync::Mutex::new(None));

        let mut relays = TlsRelays {
            tids: [0; 2],
            stops: Vec::new(),
            threads: Vec::new(),
            suite: suite.clone(),
        };
        let upstream = |side| match side {
            Side::Client => SocketAddr::from((SERVER_IP, hop.server)),
            Side::Server => SocketAddr::from((Ipv4Addr::LOCALHOST, app_port)),
        };
        for (i, (side, ns, port)) in [
            (Side::Client, nodes.client_ns.clone(), hop.client),
            (Side::Server, nodes.server_ns.clone(), hop.server),
        ]
        .into_iter()
        .enumerate()
        {
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
            let (ready_tx, ready_rx) = mpsc::channel();
            let relay = Relay {
                side,
                upstream: upstream(side),
                client_tls: client_tls.clone(),
                server_tls: server_tls.clone(),
                suite: suite.clone(),
            };
            let thread = std::thread::spawn(move || {
                Lab::in_netns(&ns, || relay.run(port, ready_tx, stop_rx))?
            });
            relays.stops.push(stop_tx);
            relays.threads.push(thread);
            relays.tids[i] = ready_rx
                .recv_timeout(Duration::from_secs(10))
                .context("a TLS relay did not start listening")?;
        }
        Ok(relays)
    }

    /// CPU seconds the relay thread of `side` (0: client node, 1: server node) has spent.
    fn cpu_seconds(&self, side: usize) -> anyhow::Result<f64> {
        common::stat_cpu_seconds(&format!("/proc/self/task/{}/stat", self.tids[side]))
    }

    fn suite(&self) -> String {
        let suite = self.suite.lock().unwrap_or_else(|e| e.into_inner());
        suite.clone().unwrap_or_else(|| "no TLS connection".into())
    }
}

impl Drop for TlsRelays {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        for thread in self.threads.drain(..) {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("TLS relay: {e:#}"),
                Err(_) => eprintln!("TLS relay thread panicked"),
            }
        }
    }
}

struct Relay {
    side: Side,
    upstream: SocketAddr,
    client_tls: Arc<rustls::ClientConfig>,
    server_tls: Arc<rustls::ServerConfig>,
    suite: Arc<std::sync::Mutex<Option<String>>>,
}

impl Relay {
    /// Runs on a thread inside the relay's namespace until `stop` fires.
    fn run(
        self,
        port: u16,
        ready: mpsc::Sender<i32>,
        stop: tokio::sync::oneshot::Receiver<()>,
    ) -> std::io::Result<anyhow::Result<()>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let this = Arc::new(self);
        Ok(rt.block_on(async move {
            let listener =
                tokio::net::TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))
                    .await?;
            let _ = ready.send(nix::unistd::gettid().as_raw());
            tokio::pin!(stop);
            loop {
                tokio::select! {
                    _ = &mut stop => return Ok(()),
                    accepted = listener.accept() => {
                        let (tcp, _) = accepted?;
                        let relay = this.clone();
                        tokio::spawn(async move {
                            if let Err(e) = relay.serve(tcp).await {
                                eprintln!("TLS relay connection: {e:#}");
                            }
                        });
                    }
                }
            }
        }))
    }

    async fn serve(&self, accepted: tokio::net::TcpStream) -> anyhow::Result<()> {
        accepted.set_nodelay(true)?;
        let upstream = tokio::net::TcpStream::connect(self.upstream).await?;
        upstream.set_nodelay(true)?;
        match self.side {
            Side::Client => {
                let tls = ambit_hbone::tls::connect(
                    ambit_hbone::ReadAhead::new(upstream),
                    self.client_tls.clone(),
                )
                .await?;
                let suite = tls.get_ref().1.negotiated_cipher_suite();
                *self.suite.lock().unwrap_or_else(|e| e.into_inner()) =
                    suite.map(|s| format!("{:?}", s.suite()));
                relay(accepted, tls).await
            }
            Side::Server => {
                // As the node proxy's HBONE server: no read-ahead under TLS.
                let tls = ambit_hbone::tls::accept(accepted, self.server_tls.clone()).await?;
                relay(tls, upstream).await
            }
        }
    }
}

/// Copies both ways until both directions have ended, each end's write side shut down after
/// its reader's EOF (iperf3's control connection runs alongside the data stream).
async fn relay<A, B>(a: A, b: B) -> anyhow::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    tokio::try_join!(copy(ar, bw), copy(br, aw))?;
    Ok(())
}

async fn copy<R, W>(mut from: R, mut to: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut storage = vec![0u8; BUFFER_OFFSET + RELAY_BUFFER];
    let buf = &mut storage[BUFFER_OFFSET..];
    loop {
        let n = from.read(buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        // TLS holds records until flushed; a plain socket's flush does nothing.
        to.flush().await?;
    }
}
