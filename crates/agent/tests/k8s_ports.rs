//! The agent's health (8000) and metrics (15014) ports listen on every address of the
//! node: a peer holding keep-alive connections must not starve the kubelet's probes or a
//! scrape, whether they come from its own address or another (root: the setting of
//! [`common::k8s`]).

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ambit_fake_apiserver::ServerOptions;
use common::k8s::{http, Env};
use common::require_root;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(from), 0))?;
    socket.connect(to).await
}

/// A connection from `from` left idle after one answered request, or `None` when refused.
async fn keepalive_from(from: Ipv4Addr, to: SocketAddr) -> Option<TcpStream> {
    let mut s = connect_from(from, to).await.ok()?;
    s.write_all(b"GET /nothing HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .ok()?;
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    buf[..n].starts_with(b"HTTP/1.1").then_some(s)
}

async fn probe_from(from: Ipv4Addr, to: SocketAddr, path: &str) -> u16 {
    match connect_from(from, to).await {
        Ok(s) => http(s, "GET", path, "").await.0,
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_keepalive_connections_do_not_starve_probes_and_scrapes() {
    require_root("held_keepalive_connections_do_not_starve_probes_and_scrapes");
    let env = Env::new(ServerOptions::default(), None).await;
    let running = env.start().await;
    env.wait_ready().await;
    let holder = Ipv4Addr::new(127, 0, 0, 1);
    let mut held = Vec::new();
    for port in [env.cfg.health_addr, env.cfg.metrics_addr] {
        for _ in 0..200 {
            held.extend(keepalive_from(holder, port).await);
        }
    }
    // What one peer holds is bounded: the server closed all but its share on each port.
    let mut open = 0;
    for s in &mut held {
        let mut b = [0u8; 1];
        let still = tokio::time::timeout(std::time::Duration::from_millis(100), s.read(&mut b))
            .await
            .is_err();
        open += usize::from(still);
    }
    assert!(
        open <= 2 * 16,
        "{open} keep-alive connections from one address still held on two ports"
    );
    for from in [holder, Ipv4Addr::new(127, 0, 0, 2)] {
        for _ in 0..20 {
            assert_eq!(
                probe_from(from, env.cfg.health_addr, "/readyz").await,
                200,
                "a probe from {from}"
            );
            assert_eq!(
                probe_from(from, env.cfg.metrics_addr, "/metrics").await,
                200,
                "a scrape from {from}"
            );
        }
    }
    drop(held);
    running.stop().await;
}
