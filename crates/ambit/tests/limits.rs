//! What an unauthenticated client can make a node proxy hold, end to end as root: a flood
//! of connections that never finish their handshake on 15008 is shed beyond its share,
//! while another client's real connection is still served at once and the proxy's memory
//! stays bounded; in shared mode a flooded pod leaves the node's other pods served.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use ambit_netns_lab::cluster::{Cluster, ClusterSpec, PodSpec};
use ambit_netns_lab::mesh::{EchoMode, TwoNodes, APP_PORT, CLIENT_IP, SERVER_IP};
use ambit_netns_lab::peer::NodeProxy;
use ambit_netns_lab::{wait_until, Lab};
use socket2::{Domain, Socket, Type};

fn ambit() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ambit"))
}

/// A second address on the client node for the flood, so it is another source than the
/// client proxy's.
const FLOOD_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 9);
const FLOOD: usize = 2000;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// Lets this test hold the flood's sockets.
fn raise_fd_limit(want: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < want {
        assert!(
            hard >= want,
            "RLIMIT_NOFILE hard limit {hard} is below the {want} this test needs"
        );
        setrlimit(Resource::RLIMIT_NOFILE, want, hard).unwrap();
    }
}

/// Opens `n` connections from `from` to port 15008 of `target`; every other one sends a
/// single byte. None ever sends a ClientHello.
fn flood(ns: &str, from: Ipv4Addr, target: Ipv4Addr, n: usize) -> Vec<TcpStream> {
    let hbone = SocketAddr::from((target, 15008));
    Lab::in_netns(ns, move || {
        let mut held = Vec::with_capacity(n);
        for i in 0..n {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
            // Past the node's capture rule, straight to the server's port 15008.
            s.set_mark(ambit_wellknown::marks::PROXY)?;
            s.bind(&SocketAddrV4::new(from, 0).into())?;
            // The server may shed one so fast that even the connect sees the reset.
            match s.connect_timeout(&hbone.into(), Duration::from_secs(5)) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => continue,
                r => r?,
            }
            let mut s = TcpStream::from(s);
            // A connection already shed may refuse the byte; it still counts as one offered.
            if i % 2 == 1 {
                match s.write_all(&[0x16]) {
                    Err(e) if e.kind() != std::io::ErrorKind::ConnectionReset => return Err(e),
                    _ => {}
                }
            }
            held.push(s);
        }
        Ok(held)
    })
    .unwrap()
}

/// Connections the server still holds open (reads would block), against those it shed.
fn still_open(conns: &[TcpStream]) -> usize {
    conns
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 1];
            matches!((&**s).read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count()
}

#[test]
fn a_handshake_flood_is_shed_while_a_real_client_is_served() {
    raise_fd_limit(8192);
    let nodes = TwoNodes::start(ambit(), "e2e-flood", &[]).unwrap();
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    nodes
        .lab
        .exec(
            &nodes.client_ns,
            &[
                "ip",
                "addr",
                "add",
                &format!("{FLOOD_IP}/24"),
                "dev",
                "eth0",
            ],
        )
        .unwrap();
    let dst = SocketAddr::from((SERVER_IP, APP_PORT));
    let exchange = |payload: &[u8]| {
        let mut conn = nodes.connect_from_client(dst).unwrap();
        conn.write_all(payload).unwrap();
        conn.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        conn.read_to_end(&mut back).unwrap();
        back
    };
    // No exchange before the flood: the real client's first connection must itself pass
    // admission (a pooled one would need no handshake).
    let rss_before = rss_kib(nodes.server_proxy.pid);

    let flooded = flood(&nodes.client_ns, FLOOD_IP, SERVER_IP, FLOOD);
    // The source's share (a quarter of the node's 1024) is held; the rest is shed.
    let mut open = 0;
    wait_until("the flood to be shed", Duration::from_secs(5), || {
        open = still_open(&flooded);
        open <= 256
    })
    .unwrap_or_else(|e| panic!("{e}: {open} of {FLOOD} connections still held"));
    assert!(
        open > 0,
        "the flood's share was not held at all: admission refused everything"
    );

    // Another client, through both proxies, is answered (the exchange's own timeouts
    // only catch a hang; how long it took is printed, not asserted).
    let started = Instant::now();
    assert_eq!(exchange(b"during the flood"), b"during the flood");
    let took = started.elapsed();

    // What was shed is counted for the operator.
    let text = nodes.metrics(&nodes.server_ns).unwrap();
    let shed: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("ambit_hbone_handshakes_shed_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no shed count in the metrics:\n{text}"));
    // Most of the flood, and never one still held. Not exactly the rest: opening 2,000
    // connections takes seconds here, so the first share may reach its 10 s handshake
    // timeout and free its slots for later ones while the flood is still arriving.
    assert!(
        (FLOOD / 2..=FLOOD - open).contains(&shed),
        "{shed} counted shed of {FLOOD} offered, {open} held"
    );
    // What the held share costs in memory is a figure, not a test: printed here, and
    // measured in the benchmarks. The bound itself is asserted above, as connections held.
    let rss_during = rss_kib(nodes.server_proxy.pid);
    eprintln!(
        "flood: {open} of {FLOOD} held; real exchange {took:?}; server RSS {rss_before} -> {rss_during} KiB"
    );
    drop(flooded);
}

/// Stalled connections from the client's own address, opened one every 2 ms for as long
/// as `stop` is unset; returns how many were offered.
fn flood_until(
    ns: &str,
    from: Ipv4Addr,
    target: Ipv4Addr,
    stop: &std::sync::atomic::AtomicBool,
) -> usize {
    let hbone = SocketAddr::from((target, 15008));
    Lab::in_netns(ns, || {
        let mut held = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
            s.set_mark(ambit_wellknown::marks::PROXY)?;
            s.bind(&SocketAddrV4::new(from, 0).into())?;
            if s.connect_timeout(&hbone.into(), Duration::from_secs(5))
                .is_err()
            {
                continue;
            }
            let mut s = TcpStream::from(s);
            let _ = s.write_all(&[0x16]);
            held.push(s);
            // Paced, so the flood is a steady stream of newcomers (hundreds a second) and
            // not a measure of how fast this machine's two cores can open connections.
            std::thread::sleep(Duration::from_millis(2));
            // Keep the descriptors bounded: the oldest were evicted long ago.
            if held.len() > 3000 {
                held.drain(..1000);
            }
        }
        Ok(held.len())
    })
    .unwrap()
}

#[test]
fn a_flood_from_the_clients_own_address_does_not_shed_its_handshake() {
    raise_fd_limit(8192);
    let nodes = TwoNodes::start(ambit(), "e2e-selfflood", &[]).unwrap();
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let dst = SocketAddr::from((SERVER_IP, APP_PORT));
    // The share of the client node's address is filled with connections that never
    // finish a handshake, and newcomers keep arriving while the real client connects.
    let stalled = flood(&nodes.client_ns, CLIENT_IP, SERVER_IP, 400);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (answers, offered) = std::thread::scope(|scope| {
        let flooding = scope.spawn(|| flood_until(&nodes.client_ns, CLIENT_IP, SERVER_IP, &stop));
        // Several real connections, each through the client proxy to the server's: the
        // first opens an HBONE connection whose handshake meets the flood.
        let answers: Vec<_> = (0..3)
            .map(|i| {
                let payload = format!("during the flood {i}");
                let got = (|| -> anyhow::Result<Vec<u8>> {
                    let mut conn = nodes.connect_from_client(dst)?;
                    conn.set_read_timeout(Some(Duration::from_secs(20)))?;
                    conn.write_all(payload.as_bytes())?;
                    conn.shutdown(Shutdown::Write)?;
                    let mut back = Vec::new();
                    conn.read_to_end(&mut back)?;
                    Ok(back)
                })();
                (payload, got)
            })
            .collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (answers, flooding.join().unwrap())
    });
    for (payload, got) in &answers {
        let got = got.as_ref().unwrap_or_else(|e| {
            let log =
                |p: &ambit_netns_lab::Process| std::fs::read_to_string(&p.log).unwrap_or_default();
            panic!(
                "{payload:?}: {e}\nclient proxy:\n{}\nserver proxy:\n{}",
                log(&nodes.client_proxy),
                log(&nodes.server_proxy)
            )
        });
        assert_eq!(
            String::from_utf8_lossy(got),
            *payload,
            "the real client's connection was not served during the flood"
        );
    }
    // The flood was really there: the server closed its stalled connections for newer ones.
    let text = nodes.metrics(&nodes.server_ns).unwrap();
    let shed: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("ambit_hbone_handshakes_shed_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no shed count in the metrics:\n{text}"));
    assert!(shed >= 144, "only {shed} stalled handshakes were closed");
    eprintln!(
        "flood from the client's address: {offered} more offered while it connected, {shed} shed"
    );
    drop(stalled);
}

/// Offers `n` keep-alive connections from `from` to `port` of `to`, each left idle after
/// one request answered: what a scraper that never lets go holds. Those the server turns
/// away are skipped.
fn hold_keepalive(ns: &str, from: Ipv4Addr, to: Ipv4Addr, port: u16, n: usize) -> Vec<TcpStream> {
    let dst = SocketAddr::from((to, port));
    Lab::in_netns(ns, move || {
        let mut held = Vec::new();
        for _ in 0..n {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
            // Past the client node's capture, as a scraper on the node would be.
            s.set_mark(ambit_wellknown::marks::PROXY)?;
            s.bind(&SocketAddrV4::new(from, 0).into())?;
            s.connect_timeout(&dst.into(), Duration::from_secs(5))?;
            let mut s = TcpStream::from(s);
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let answered = s
                .write_all(b"GET /nothing HTTP/1.1\r\nhost: x\r\n\r\n")
                .and_then(|()| {
                    let mut buf = [0u8; 4096];
                    let n = s.read(&mut buf)?;
                    Ok(buf[..n].starts_with(b"HTTP/1.1"))
                });
            if matches!(answered, Ok(true)) {
                held.push(s);
            }
        }
        Ok(held)
    })
    .unwrap()
}

/// One request on a new connection from `from`; its status (0 when refused or reset).
fn probe(ns: &str, from: Ipv4Addr, to: Ipv4Addr, port: u16, path: &str) -> u16 {
    let dst = SocketAddr::from((to, port));
    let path = path.to_string();
    let answer = Lab::in_netns(ns, move || {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        s.set_mark(ambit_wellknown::marks::PROXY)?;
        s.bind(&SocketAddrV4::new(from, 0).into())?;
        s.connect_timeout(&dst.into(), Duration::from_secs(5))?;
        let mut s = TcpStream::from(s);
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    });
    match answer {
        Ok(text) => text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0),
        Err(_) => 0,
    }
}

#[test]
fn held_keepalive_connections_do_not_starve_probes_and_scrapes() {
    let nodes = TwoNodes::start(ambit(), "e2e-opports", &[]).unwrap();
    let other = Ipv4Addr::new(10, 78, 0, 9);
    nodes
        .lab
        .exec(
            &nodes.client_ns,
            &["ip", "addr", "add", &format!("{other}/24"), "dev", "eth0"],
        )
        .unwrap();
    // One peer holds 64 keep-alive connections on each port, as many as a port serves.
    let mut held = Vec::new();
    for port in [15021, 15020] {
        held.extend(hold_keepalive(
            &nodes.client_ns,
            CLIENT_IP,
            SERVER_IP,
            port,
            64,
        ));
    }
    // Kubelet-style probes and scrapes, from the holder's address and from another.
    for from in [CLIENT_IP, other] {
        for _ in 0..20 {
            assert_eq!(
                probe(&nodes.client_ns, from, SERVER_IP, 15021, "/healthz/ready"),
                200,
                "a probe from {from}"
            );
            assert_eq!(
                probe(&nodes.client_ns, from, SERVER_IP, 15020, "/metrics"),
                200,
                "a scrape from {from}"
            );
        }
    }
    drop(held);
}

#[test]
fn in_shared_mode_a_flooded_pod_leaves_the_others_served() {
    raise_fd_limit(8192);
    // Small limits so a few hundred connections spend them: the node admits 100
    // handshakes, one pod 60, one source 40. Three sources could take 120, more than the
    // node has: only the pod's cap leaves room for its neighbours.
    let env = [
        ("AMBIT_MAX_HBONE_HANDSHAKES", "100".to_string()),
        ("AMBIT_MAX_HBONE_HANDSHAKES_PER_POD", "60".to_string()),
        ("AMBIT_MAX_HBONE_HANDSHAKES_PER_SOURCE", "40".to_string()),
    ];
    let pods = [
        PodSpec::new("client", 0),
        PodSpec::new("victim", 1),
        PodSpec::new("other", 1),
    ];
    let ambit = ambit();
    let cluster = Cluster::launch(ClusterSpec {
        ambit,
        tag: "inpod-flood",
        node_proxies: vec![NodeProxy::Ambit(ambit.to_path_buf()); 2],
        pods: &pods,
        create: pods.len(),
        extra_yaml: "",
        proxy_env: &env,
        control: None,
    })
    .unwrap();
    let _victim_app = cluster
        .serve_app("victim", APP_PORT, EchoMode::Mirror)
        .unwrap();
    let _other_app = cluster
        .serve_app("other", APP_PORT, EchoMode::Mirror)
        .unwrap();

    // Three flooding sources on the first node, outside every pod.
    let sources = [21, 22, 23].map(|n| Ipv4Addr::new(10, 78, 0, n));
    for ip in sources {
        cluster
            .lab
            .exec(
                &cluster.nodes[0].ns,
                &["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"],
            )
            .unwrap();
    }
    let victim = cluster.pod("victim").ip;
    let flooded: Vec<TcpStream> = sources
        .into_iter()
        .flat_map(|from| flood(&cluster.nodes[0].ns, from, victim, 100))
        .collect();
    let mut open = 0;
    wait_until("the flood to be shed", Duration::from_secs(5), || {
        open = still_open(&flooded);
        open <= 60
    })
    .unwrap_or_else(|e| panic!("{e}: {open} of 300 connections to the victim still held"));
    assert!(open > 0, "the victim's share was not held at all");

    // The victim's neighbour on the same node proxy still takes a new connection, which
    // needs a new handshake: the client pod has never reached it.
    let started = Instant::now();
    let mut conn = cluster
        .connect_from(
            "client",
            SocketAddr::from((cluster.pod("other").ip, APP_PORT)),
        )
        .unwrap();
    conn.write_all(b"next door").unwrap();
    conn.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    conn.read_to_end(&mut back).unwrap();
    let took = started.elapsed();
    assert_eq!(back, b"next door");
    eprintln!("flood: {open} of 300 held by the victim; its neighbour answered in {took:?}");
    drop(flooded);
}
