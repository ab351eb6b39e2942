//! Connection pool behaviour against a real server over loopback.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ambit_hbone::{parse_authority, ClientSettings, ConnectRequest, H2Stream, HboneError, Pool};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn request() -> ConnectRequest {
    ConnectRequest::new(parse_authority("127.0.0.1:80").unwrap())
}

async fn round_trip(s: &mut H2Stream, msg: &[u8]) {
    s.write_all(msg).await.unwrap();
    let mut buf = vec![0u8; msg.len()];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(buf, msg);
}

async fn wait_until(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..200 {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    f()
}

/// 100 open streams share one connection; the 101st opens a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_streams_per_connection() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let k = key(&c, server.addr);
    let mut streams = Vec::new();
    for _ in 0..100 {
        let cfg = c.client_config();
        let s = pool
            .connect(
                k.clone(),
                || dial(server.addr, cfg, dials.clone()),
                &request(),
            )
            .await
            .unwrap();
        streams.push(s);
    }
    assert_eq!(pool.connection_count(), 1);
    assert_eq!(dials.load(Ordering::SeqCst), 1);
    let cfg = c.client_config();
    let mut extra = pool
        .connect(
            k.clone(),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    assert_eq!(pool.connection_count(), 2);
    assert_eq!(dials.load(Ordering::SeqCst), 2);
    // Every stream works.
    round_trip(&mut extra, b"101").await;
    round_trip(&mut streams[0], b"first").await;
    round_trip(&mut streams[99], b"last").await;
    // When a stream on the first connection ends, its slot is reused instead of dialing.
    drop(streams.pop());
    let cfg = c.client_config();
    let mut again = pool
        .connect(
            k.clone(),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    round_trip(&mut again, b"again").await;
    assert_eq!(dials.load(Ordering::SeqCst), 2);
}

/// A smaller peer SETTINGS_MAX_CONCURRENT_STREAMS caps the streams per connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_max_concurrent_streams_caps_connection() {
    let c = certs();
    let settings = ambit_hbone::H2Settings {
        max_concurrent_streams: 3,
        ..fast_settings()
    };
    let server = TestServer::start(c.server_config(), settings, echo).await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let k = key(&c, server.addr);
    let mut streams = Vec::new();
    for _ in 0..7 {
        let cfg = c.client_config();
        let mut s = pool
            .connect(
                k.clone(),
                || dial(server.addr, cfg, dials.clone()),
                &request(),
            )
            .await
            .unwrap();
        round_trip(&mut s, b"x").await;
        streams.push(s);
    }
    // 3 + 3 + 1 (the first stream may be opened before the server's SETTINGS arrive, so
    // allow one extra connection of slack on the first).
    let n = dials.load(Ordering::SeqCst);
    assert!((3..=4).contains(&n), "dials = {n}");
    assert_eq!(pool.connection_count(), n);
}

/// 20 concurrent first connects for one key dial exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_flight_dial() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let k = key(&c, server.addr);
    let mut tasks = Vec::new();
    for i in 0..20u32 {
        let pool = pool.clone();
        let k = k.clone();
        let cfg = c.client_config();
        let dials = dials.clone();
        let addr = server.addr;
        tasks.push(tokio::spawn(async move {
            let slow_dial = || async move {
                // Widen the race window.
                tokio::time::sleep(Duration::from_millis(100)).await;
                dial(addr, cfg, dials).await
            };
            let mut s = pool.connect(k, slow_dial, &request()).await.unwrap();
            round_trip(&mut s, format!("task {i}").as_bytes()).await;
            s
        }));
    }
    let mut streams = Vec::new();
    for t in tasks {
        streams.push(t.await.unwrap());
    }
    assert_eq!(dials.load(Ordering::SeqCst), 1);
    assert_eq!(pool.connection_count(), 1);
}

/// Every caller waiting on a failed dial gets that dial's error; the next call dials again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_flight_failure_is_shared() {
    let c = certs();
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let k = key(&c, "127.0.0.1:9".parse().unwrap());
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let pool = pool.clone();
        let k = k.clone();
        let dials = dials.clone();
        tasks.push(tokio::spawn(async move {
            let failing = || async move {
                dials.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err::<tokio::net::TcpStream, _>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "refused",
                ))
            };
            pool.connect(k, failing, &request()).await
        }));
    }
    for t in tasks {
        let e = t.await.unwrap().unwrap_err();
        assert!(
            matches!(&e, HboneError::Connect(io) if io.kind() == std::io::ErrorKind::ConnectionRefused),
            "{e}"
        );
    }
    assert_eq!(dials.load(Ordering::SeqCst), 1);
    assert_eq!(pool.connection_count(), 0);
}

/// A dialer that is cancelled hands the dial over to a waiter. Both callers are polled by
/// hand, so each is known to be where the test needs it: the first dialing (its connect
/// function called and pending), the second waiting on that dial, before the first is
/// dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_dialer_hands_over() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let pool = Pool::new(ClientSettings::default());
    let k = key(&c, server.addr);
    let req = request();
    let mut cx = Context::from_waker(Waker::noop());

    let first_called = Arc::new(AtomicUsize::new(0));
    let called = first_called.clone();
    let mut first = Box::pin(pool.connect(
        k.clone(),
        move || {
            called.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<tokio::net::TcpStream, std::io::Error>>()
        },
        &req,
    ));
    assert!(first.as_mut().poll(&mut cx).is_pending());
    assert_eq!(
        first_called.load(Ordering::SeqCst),
        1,
        "the first caller dials"
    );

    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let addr = server.addr;
    let second_dials = dials.clone();
    let mut second = Box::pin(pool.connect(k, move || dial(addr, cfg, second_dials), &req));
    // One poll runs up to its first wait: the first caller's dial, still pending.
    assert!(second.as_mut().poll(&mut cx).is_pending());
    assert!(second.as_mut().poll(&mut cx).is_pending());
    assert_eq!(dials.load(Ordering::SeqCst), 0, "the second caller waits");

    // The dialer is cancelled: the waiter takes the dial over.
    drop(first);
    let mut s = match tokio::time::timeout(Duration::from_secs(5), second).await {
        Ok(r) => r.unwrap(),
        Err(_) => panic!("the waiter never took the dial over"),
    };
    round_trip(&mut s, b"took over").await;
    assert_eq!(dials.load(Ordering::SeqCst), 1);
    assert_eq!(first_called.load(Ordering::SeqCst), 1);
}

/// Distinct keys never share connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_keys_do_not_share() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let k1 = key(&c, server.addr);
    let mut k2 = k1.clone();
    k2.src_ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let mut k3 = k1.clone();
    k3.dst_identities
        .push("spiffe://cluster.local/ns/default/sa/other".into());
    let mut k4 = k1.clone();
    k4.src_identity = "spiffe://cluster.local/ns/other/sa/client".into();
    let mut streams = Vec::new();
    for k in [&k1, &k2, &k3, &k4, &k1] {
        let cfg = c.client_config();
        let mut s = pool
            .connect(
                k.clone(),
                || dial(server.addr, cfg, dials.clone()),
                &request(),
            )
            .await
            .unwrap();
        round_trip(&mut s, b"k").await;
        streams.push(s);
    }
    assert_eq!(dials.load(Ordering::SeqCst), 4);
    assert_eq!(pool.connection_count(), 4);
}

/// After the server sends GOAWAY, the connection keeps serving its open stream but is never
/// reused: the next connect dials again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_connection_not_reused() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let k = key(&c, server.addr);
    let cfg = c.client_config();
    let mut old = pool
        .connect(
            k.clone(),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    round_trip(&mut old, b"before").await;

    server.goaway_existing();
    // Give the client time to process the GOAWAY.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let cfg = c.client_config();
    let mut new = pool
        .connect(
            k.clone(),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    assert_eq!(dials.load(Ordering::SeqCst), 2);
    round_trip(&mut new, b"new").await;
    // The in-flight stream on the draining connection still works...
    round_trip(&mut old, b"after goaway").await;
    // ...and when it finishes, the draining connection closes cleanly.
    old.shutdown().await.unwrap();
    let mut rest = Vec::new();
    old.read_to_end(&mut rest).await.unwrap();
    drop(old);
    server.next_result().await.unwrap();
    assert!(wait_until(|| pool.connection_count() == 1).await);
}

/// Even without waiting for the GOAWAY to be processed, a new connect never fails because
/// of it: a refused stream is retried on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_race_is_retried() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let k = key(&c, server.addr);
    for i in 0..5 {
        let cfg = c.client_config();
        let mut s = pool
            .connect(
                k.clone(),
                || dial(server.addr, cfg, dials.clone()),
                &request(),
            )
            .await
            .unwrap();
        round_trip(&mut s, format!("round {i}").as_bytes()).await;
        server.goaway_existing();
    }
    assert!(dials.load(Ordering::SeqCst) >= 2);
}

/// A connection unused for `idle_timeout` leaves the pool and closes; the next connect dials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connection_released() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let pool = Pool::new(ClientSettings {
        idle_timeout: Duration::from_millis(200),
        ..Default::default()
    });
    let dials = Arc::new(AtomicUsize::new(0));
    let k = key(&c, server.addr);
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            k.clone(),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    // Not released while a stream is open, even past the idle timeout.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(pool.connection_count(), 1);
    round_trip(&mut s, b"busy").await;
    s.shutdown().await.unwrap();
    s.read_to_end(&mut Vec::new()).await.unwrap();
    drop(s);
    assert!(
        wait_until(|| pool.connection_count() == 0).await,
        "idle connection not released"
    );
    // The released connection actually closes (server side ends cleanly).
    server.next_result().await.unwrap();
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            k.clone(),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    round_trip(&mut s, b"fresh").await;
    assert_eq!(dials.load(Ordering::SeqCst), 2);
}

/// A connection that dies (its transport is cut) leaves the pool; the next connect dials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_connection_not_reused() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let fwd = Forwarder::start(server.addr).await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let k = key(&c, server.addr);
    let cfg = c.client_config();
    let mut s = pool
        .connect(k.clone(), || dial(fwd.addr, cfg, dials.clone()), &request())
        .await
        .unwrap();
    round_trip(&mut s, b"x").await;
    fwd.cut();
    // The open stream fails rather than hanging...
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut [0u8; 8]))
        .await
        .unwrap();
    assert!(matches!(r, Err(_) | Ok(0)), "{r:?}");
    // ...and the connection leaves the pool.
    assert!(wait_until(|| pool.connection_count() == 0).await);
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            k.clone(),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    round_trip(&mut s, b"y").await;
    assert_eq!(dials.load(Ordering::SeqCst), 2);
}

/// Dropping every handle to the pool does not kill tunnels that are still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_outlive_the_pool() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let pool = Pool::new(ClientSettings {
        idle_timeout: Duration::from_millis(50),
        ..Default::default()
    });
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap();
    drop(pool);
    tokio::time::sleep(Duration::from_millis(300)).await;
    round_trip(&mut s, b"still here").await;
    s.shutdown().await.unwrap();
    s.read_to_end(&mut Vec::new()).await.unwrap();
    drop(s);
    // With the pool and the stream gone, the connection closes.
    server.next_result().await.unwrap();
}

/// Out-of-range settings are clamped or saturated, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_settings_do_not_panic() {
    let c = certs();
    let extreme = ambit_hbone::H2Settings {
        stream_window: u32::MAX,
        connection_window: 0,
        frame_size: u32::MAX,
        max_concurrent_streams: 0,
        ping_interval: Duration::MAX,
        ping_timeout: Duration::MAX,
        idle_timeout: Duration::MAX,
        max_stream_rate: u32::MAX,
        stream_burst: u32::MAX,
    };
    let server = TestServer::start(
        c.server_config(),
        ambit_hbone::H2Settings {
            max_concurrent_streams: 10,
            ..extreme.clone()
        },
        echo,
    )
    .await;
    let pool = Pool::new(ClientSettings {
        h2: extreme,
        max_streams_per_connection: 0,
        idle_timeout: Duration::MAX,
        connect_timeout: Duration::MAX,
        response_timeout: Duration::MAX,
    });
    let dials = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let cfg = c.client_config();
        let mut s = pool
            .connect(
                key(&c, server.addr),
                || dial(server.addr, cfg, dials.clone()),
                &request(),
            )
            .await
            .unwrap();
        round_trip(&mut s, b"extreme").await;
    }
}

/// A peer that takes the CONNECT stream but never answers it does not hang the caller: the
/// connect fails with the response timeout while the peer still holds the stream (until the
/// caller has its answer, a minute at most to end a hang), not with the stream's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_connect_times_out() {
    let c = certs();
    let answered = Arc::new(tokio::sync::Notify::new());
    let held = answered.clone();
    let server = TestServer::start(
        c.server_config(),
        fast_settings(),
        move |inc: ambit_hbone::IncomingConnect| {
            let held = held.clone();
            async move {
                let _ = tokio::time::timeout(Duration::from_secs(60), held.notified()).await;
                drop(inc);
            }
        },
    )
    .await;
    let pool = Pool::new(ClientSettings {
        response_timeout: Duration::from_millis(300),
        ..Default::default()
    });
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let err = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(),
        )
        .await
        .unwrap_err();
    answered.notify_one();
    assert!(matches!(err, HboneError::ResponseTimeout(_)), "{err}");
}
