//! HTTP/2 PING keepalive on both sides: a peer that stops answering is dropped.

mod common;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use ambit_hbone::{parse_authority, ClientSettings, ConnectRequest, H2Settings, HboneError, Pool};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn request() -> ConnectRequest {
    ConnectRequest::new(parse_authority("127.0.0.1:80").unwrap())
}

fn quick_pings() -> H2Settings {
    H2Settings {
        ping_interval: Duration::from_millis(100),
        ping_timeout: Duration::from_millis(300),
        ..Default::default()
    }
}

/// The client tears a connection down when its PINGs go unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_drops_unresponsive_server() {
    let c = certs();
    // The server itself never pings, so only the client's keepalive is in play.
    let no_pings = H2Settings {
        ping_interval: Duration::ZERO,
        ..Default::default()
    };
    let server = TestServer::start(c.server_config(), no_pings, echo).await;
    let fwd = Forwarder::start(server.addr).await;
    let pool = Pool::new(ClientSettings {
        h2: quick_pings(),
        ..Default::default()
    });
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            key(&c, server.addr),
            || dial(fwd.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    s.write_all(b"x").await.unwrap();
    s.read_exact(&mut [0u8; 1]).await.unwrap();
    // Healthy pings for a while: the connection stays.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(pool.connection_count(), 1);
    fwd.freeze_down();
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut [0u8; 1])).await;
    assert!(
        matches!(r, Ok(Err(_))),
        "stream should fail once the connection is torn down: {r:?}"
    );
    assert_eq!(pool.connection_count(), 0);
}

/// The server closes a connection whose client stops answering PINGs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_drops_unresponsive_client() {
    let c = certs();
    let server = TestServer::start(c.server_config(), quick_pings(), echo).await;
    let fwd = Forwarder::start(server.addr).await;
    let pool = Pool::new(ClientSettings {
        h2: H2Settings {
            ping_interval: Duration::ZERO,
            ..Default::default()
        },
        ..Default::default()
    });
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            key(&c, server.addr),
            || dial(fwd.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    s.write_all(b"x").await.unwrap();
    s.read_exact(&mut [0u8; 1]).await.unwrap();
    fwd.freeze_up();
    let e = server.next_result().await.unwrap_err();
    assert!(matches!(e, HboneError::PingTimeout(_)), "{e}");
}
