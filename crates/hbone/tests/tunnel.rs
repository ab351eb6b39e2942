//! Byte transport through real HBONE tunnels over loopback TCP + mTLS.

mod common;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use ambit_hbone::headers::{forwarded_value, BAGGAGE};
use ambit_hbone::{
    parse_authority, Baggage, ClientSettings, ConnectRequest, HboneError, Pool, TraceParent,
};
use common::*;
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

const MIB: usize = 1024 * 1024;

fn request(port: u16) -> ConnectRequest {
    ConnectRequest::new(parse_authority(&format!("127.0.0.1:{port}")).unwrap())
}

/// Client writes 1 MiB and half-closes; the server reads it all (EOF), then still sends 1 MiB
/// and half-closes; both sides compare bytes exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_half_close_then_server_sends() {
    let c = certs();
    let up = payload(MIB, 1);
    let down = payload(MIB, 2);
    let (seen_tx, seen_rx) = oneshot::channel::<Vec<u8>>();
    let seen_tx = Arc::new(std::sync::Mutex::new(Some(seen_tx)));
    let down_srv = down.clone();
    let server = TestServer::start(c.server_config(), fast_settings(), move |inc| {
        let seen_tx = seen_tx.clone();
        let down = down_srv.clone();
        async move {
            let mut s = inc.accept(HeaderMap::new()).unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            s.write_all(&down).await.unwrap();
            s.shutdown().await.unwrap();
            assert_eq!(s.bytes_received(), MIB as u64);
            assert_eq!(s.bytes_sent(), MIB as u64);
            let _ = seen_tx.lock().unwrap().take().unwrap().send(got);
        }
    })
    .await;

    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(80),
        )
        .await
        .unwrap();
    s.write_all(&up).await.unwrap();
    s.shutdown().await.unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    assert!(got == down, "server→client bytes differ");
    assert!(seen_rx.await.unwrap() == up, "client→server bytes differ");
    assert_eq!(s.bytes_sent(), MIB as u64);
    assert_eq!(s.bytes_received(), MIB as u64);
    // Writing after shutdown is a broken pipe, not a panic.
    assert_eq!(
        s.write(b"x").await.unwrap_err().kind(),
        std::io::ErrorKind::BrokenPipe
    );
    drop(s);
}

/// The server sends 1 MiB and half-closes first; the client reads to EOF and then still
/// sends 1 MiB and half-closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_half_close_then_client_sends() {
    let c = certs();
    let up = payload(MIB, 3);
    let down = payload(MIB, 4);
    let (seen_tx, seen_rx) = oneshot::channel::<Vec<u8>>();
    let seen_tx = Arc::new(std::sync::Mutex::new(Some(seen_tx)));
    let down_srv = down.clone();
    let server = TestServer::start(c.server_config(), fast_settings(), move |inc| {
        let seen_tx = seen_tx.clone();
        let down = down_srv.clone();
        async move {
            let mut s = inc.accept(HeaderMap::new()).unwrap();
            s.write_all(&down).await.unwrap();
            s.shutdown().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            let _ = seen_tx.lock().unwrap().take().unwrap().send(got);
        }
    })
    .await;

    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(80),
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    assert!(got == down, "server→client bytes differ");
    s.write_all(&up).await.unwrap();
    s.shutdown().await.unwrap();
    assert!(seen_rx.await.unwrap() == up, "client→server bytes differ");
}

/// Both directions at once through an echo server, with small windows so flow control and
/// capacity release are exercised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_both_ways_small_windows() {
    let c = certs();
    let small = ambit_hbone::H2Settings {
        stream_window: 65_535,
        connection_window: 65_535,
        frame_size: 16_384,
        ..fast_settings()
    };
    let server = TestServer::start(c.server_config(), small.clone(), echo).await;
    let pool = Pool::new(ClientSettings {
        h2: small,
        ..Default::default()
    });
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let s = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(80),
        )
        .await
        .unwrap();
    let data = payload(4 * MIB, 5);
    let (mut r, mut w) = tokio::io::split(s);
    let to_send = data.clone();
    let writer = async move {
        // Odd-sized writes.
        for chunk in to_send.chunks(7_777) {
            w.write_all(chunk).await.unwrap();
        }
        w.shutdown().await.unwrap();
        w
    };
    let reader = async move {
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        (r, got)
    };
    let (w, (r, got)) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(writer, reader)
    })
    .await
    .expect("no stall");
    assert!(got == data, "echoed bytes differ");
    let s = r.unsplit(w);
    assert_eq!(s.bytes_sent(), 4 * MIB as u64);
    assert_eq!(s.bytes_received(), 4 * MIB as u64);
}

/// The server sees a classic CONNECT (no :scheme, no :path), the telemetry headers, and the
/// client's SPIFFE identity; the client sees the response headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_metadata_and_identity_arrive() {
    let c = certs();
    let client_id = c.client_id.clone();
    let (tx, rx) = oneshot::channel();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    let server = TestServer::start(c.server_config(), fast_settings(), move |inc| {
        let tx = tx.clone();
        async move {
            let req = inc.request();
            let classic = req.uri.scheme().is_none() && req.uri.path_and_query().is_none();
            let v = inc.validate().unwrap();
            let who = ambit_identity::peer_identity(Some(&inc.peer().certificates));
            let peer = inc.peer().clone();
            let mut h = HeaderMap::new();
            h.insert(
                BAGGAGE,
                HeaderValue::from_static("k8s.namespace.name=dst-ns"),
            );
            let mut s = inc.accept(h).unwrap();
            let _ = tx
                .lock()
                .unwrap()
                .take()
                .unwrap()
                .send((classic, v, who, peer));
            s.shutdown().await.unwrap();
            let _ = s.read_to_end(&mut Vec::new()).await;
        }
    })
    .await;
    let tp = TraceParent::random();
    let baggage = Baggage {
        cluster_id: Some("Kubernetes".into()),
        namespace: Some("default".into()),
        workload_type: Some("deployment".into()),
        workload_name: Some("client".into()),
        ..Default::default()
    };
    let req = ConnectRequest {
        authority: parse_authority("[ff06::c3]:8080").unwrap(),
        baggage: Some(baggage.clone()),
        forwarded: Some(forwarded_value(
            "10.0.0.9:5555".parse().unwrap(),
            Some("svc.ns.svc.cluster.local"),
        )),
        traceparent: Some(tp),
    };
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let s = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &req,
        )
        .await
        .unwrap();
    assert_eq!(s.response_headers()[BAGGAGE], "k8s.namespace.name=dst-ns");
    let (classic, v, who, peer) = rx.await.unwrap();
    assert!(classic, "CONNECT must carry no :scheme and no :path");
    assert_eq!(v.authority, req.authority);
    assert_eq!(v.baggage, Some(baggage));
    assert_eq!(v.traceparent, Some(tp));
    assert_eq!(
        v.forwarded_host.as_deref(),
        Some("svc.ns.svc.cluster.local")
    );
    assert_eq!(who, Some(client_id));
    assert_eq!(peer.local_addr, server.addr);
    assert!(peer.addr.ip().is_loopback());
    assert!(!peer.certificates.is_empty());
}

/// Non-200 answers surface as `HboneError::Status`; a handler that drops the request answers
/// 503; the connection stays usable afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_200_surfaces_as_status() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), |inc| async move {
        match inc.validate().map(|v| v.authority.port()) {
            Ok(1) => inc.reject(StatusCode::SERVICE_UNAVAILABLE),
            Ok(2) => inc.reject(StatusCode::UNAUTHORIZED),
            Ok(3) => drop(inc),
            _ => echo(inc).await,
        }
    })
    .await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let k = key(&c, server.addr);
    let cfg = c.client_config();
    let connect = |port| {
        let cfg = cfg.clone();
        let dials = dials.clone();
        let pool = pool.clone();
        let k = k.clone();
        async move {
            pool.connect(k, || dial(server.addr, cfg, dials), &request(port))
                .await
        }
    };
    let e = connect(1).await.unwrap_err();
    assert!(
        matches!(e, HboneError::Status(s) if s == StatusCode::SERVICE_UNAVAILABLE),
        "{e}"
    );
    assert_eq!(e.fault(), ambit_hbone::Fault::Upstream);
    assert!(e.is_retryable());
    assert_eq!(e.to_string(), "http status: 503 Service Unavailable");
    let e = connect(2).await.unwrap_err();
    assert!(
        matches!(e, HboneError::Status(s) if s == StatusCode::UNAUTHORIZED),
        "{e}"
    );
    assert!(!e.is_retryable());
    let e = connect(3).await.unwrap_err();
    assert!(
        matches!(e, HboneError::Status(s) if s == StatusCode::SERVICE_UNAVAILABLE),
        "{e}"
    );
    let mut s = connect(80).await.unwrap();
    s.write_all(b"hello").await.unwrap();
    s.shutdown().await.unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"hello");
    assert_eq!(dials.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Dropping a tunnel mid-stream resets it: the other side reads EOF (CANCEL) rather than
/// hanging; reading after a RST is EOF, writing is a broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_resets_with_cancel() {
    let c = certs();
    let (tx, rx) = oneshot::channel();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    let server = TestServer::start(c.server_config(), fast_settings(), move |inc| {
        let tx = tx.clone();
        async move {
            let mut s = inc.accept(HeaderMap::new()).unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(b"ok").await.unwrap();
            // The client drops without a half-close: we see EOF.
            let mut rest = Vec::new();
            let r = s.read_to_end(&mut rest).await;
            // Then writes fail (the stream is reset).
            tokio::time::sleep(Duration::from_millis(50)).await;
            let w = s.write_all(&[0u8; 100_000]).await;
            let _ = tx
                .lock()
                .unwrap()
                .take()
                .unwrap()
                .send((r.map(|_| rest.len()), w.map_err(|e| e.kind())));
        }
    })
    .await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(80),
        )
        .await
        .unwrap();
    s.write_all(b"hello").await.unwrap();
    let mut ok = [0u8; 2];
    s.read_exact(&mut ok).await.unwrap();
    drop(s);
    let (read, write) = tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.unwrap(), 0);
    assert_eq!(write.unwrap_err(), std::io::ErrorKind::BrokenPipe);
}

/// A raw HTTP/2 client sending a GET (not CONNECT) gets 400 from a handler that uses
/// `validate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_connect_gets_400_over_the_wire() {
    let c = certs();
    let server = TestServer::start(c.server_config(), fast_settings(), echo).await;
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let tls = ambit_hbone::tls::connect(tcp, c.client_config())
        .await
        .unwrap();
    let (mut send, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method("GET")
        .uri("https://127.0.0.1:80/")
        .body(())
        .unwrap();
    let (resp, _body) = send.send_request(req, true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // A CONNECT on the same connection still works.
    let req = http::Request::builder()
        .method("CONNECT")
        .uri("127.0.0.1:80")
        .body(())
        .unwrap();
    let (resp, _body) = send.send_request(req, false).unwrap();
    assert_eq!(resp.await.unwrap().status(), StatusCode::OK);
    let _ = HboneError::Status(StatusCode::OK);
}

/// `H2Stream::splice` joins a tunnel to an app stream without copies: 1 MiB each way, the
/// app half-closes first, the tunnel's END_STREAM reaches the app as EOF, and both sides
/// count every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn splice_carries_both_directions_with_half_close() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let c = certs();
    let up = payload(MIB, 3);
    let down = payload(MIB, 4);
    let (counts_tx, counts_rx) = oneshot::channel::<(u64, u64, Vec<u8>)>();
    let counts_tx = Arc::new(std::sync::Mutex::new(Some(counts_tx)));
    let down_app = down.clone();
    let server = TestServer::start(c.server_config(), fast_settings(), move |inc| {
        let counts_tx = counts_tx.clone();
        let down = down_app.clone();
        async move {
            let mut tunnel = inc.accept(HeaderMap::new()).unwrap();
            // The "app": reads everything, then answers and closes.
            let (proxy_side, mut app) = tokio::io::duplex(64 * 1024);
            let app_task = tokio::spawn(async move {
                let mut got = Vec::new();
                app.read_to_end(&mut got).await.unwrap();
                app.write_all(&down).await.unwrap();
                app.shutdown().await.unwrap();
                got
            });
            let to_tunnel = AtomicU64::new(0);
            let from_tunnel = AtomicU64::new(0);
            tunnel
                .splice(proxy_side, &to_tunnel, &from_tunnel)
                .await
                .unwrap();
            let got = app_task.await.unwrap();
            let _ = counts_tx.lock().unwrap().take().unwrap().send((
                to_tunnel.load(Ordering::Relaxed),
                from_tunnel.load(Ordering::Relaxed),
                got,
            ));
        }
    })
    .await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let mut s = pool
        .connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(80),
        )
        .await
        .unwrap();
    s.write_all(&up).await.unwrap();
    s.shutdown().await.unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).await.unwrap();
    assert!(back == down, "the app's answer arrived intact");
    let (to_tunnel, from_tunnel, got) = tokio::time::timeout(Duration::from_secs(10), counts_rx)
        .await
        .unwrap()
        .unwrap();
    assert!(got == up, "the client's bytes reached the app intact");
    assert_eq!(from_tunnel, MIB as u64);
    assert_eq!(to_tunnel, MIB as u64);
}

/// RFC 9113 §8.5: an app's TCP reset becomes `RST_STREAM(CONNECT_ERROR)`, which the client
/// reads as an aborted connection, not as a clean end of stream; and a client's
/// `CONNECT_ERROR` ends the server's splice with an error, so its caller can reset the app.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_cross_the_tunnel_as_connect_error() {
    use std::sync::atomic::AtomicU64;
    use tokio::net::{TcpListener, TcpStream};
    let c = certs();
    let (splices_tx, mut splices) = tokio::sync::mpsc::unbounded_channel::<std::io::Result<()>>();
    let server = TestServer::start(c.server_config(), fast_settings(), move |inc| {
        let splices_tx = splices_tx.clone();
        async move {
            let app_resets = inc.request().uri.port_u16() == Some(1);
            let mut tunnel = inc.accept(HeaderMap::new()).unwrap();
            // A real TCP "app" that, for port 1, aborts once it has read a request.
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let proxy_side = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let (mut app, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 5];
                app.read_exact(&mut buf).await.unwrap();
                if app_resets {
                    socket2::SockRef::from(&app)
                        .set_linger(Some(Duration::ZERO))
                        .unwrap();
                    drop(app);
                } else {
                    let mut rest = Vec::new();
                    let _ = app.read_to_end(&mut rest).await;
                }
            });
            let (a, b) = (AtomicU64::new(0), AtomicU64::new(0));
            let _ = splices_tx.send(tunnel.splice(proxy_side, &a, &b).await);
        }
    })
    .await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let open = |port: u16| {
        let (pool, cfg, dials, key) = (
            pool.clone(),
            cfg.clone(),
            dials.clone(),
            key(&c, server.addr),
        );
        let addr = server.addr;
        async move {
            pool.connect(key, || dial(addr, cfg, dials), &request(port))
                .await
                .unwrap()
        }
    };

    // The app resets: the client reads an abort.
    let mut s = open(1).await;
    s.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("the reset arrived");
    let e = read.expect_err("an aborted stream is no clean end of stream");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted, "{e}");
    let reason = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<h2::Error>())
        .and_then(h2::Error::reason);
    assert_eq!(reason, Some(h2::Reason::CONNECT_ERROR), "{e}");
    let r = next_splice(&mut splices).await;
    assert!(r.is_err(), "the server's splice reports the app's reset");

    // The client aborts: the server's splice ends in an error, not a clean close.
    let mut s = open(2).await;
    s.write_all(b"hello").await.unwrap();
    s.abort(h2::Reason::CONNECT_ERROR);
    let r = next_splice(&mut splices).await;
    let e = r.expect_err("a CONNECT_ERROR from the client fails the splice");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted, "{e}");
    drop(s);
}

async fn next_splice(
    splices: &mut tokio::sync::mpsc::UnboundedReceiver<std::io::Result<()>>,
) -> std::io::Result<()> {
    tokio::time::timeout(Duration::from_secs(5), splices.recv())
        .await
        .expect("the server's splice ended")
        .unwrap()
}

/// A client that gives up before its CONNECT is answered resets the stream, and the
/// server's handler learns it while it is still busy (dialing the app, in the proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_giving_up_before_the_answer_is_seen_by_the_server() {
    let c = certs();
    let (tx, rx) = oneshot::channel();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    let server = TestServer::start(c.server_config(), fast_settings(), move |mut inc| {
        let tx = tx.clone();
        async move {
            // A dial that never completes, raced against the client's reset.
            let outcome = tokio::select! {
                reason = inc.client_reset() => Some(reason),
                _ = std::future::pending::<()>() => None,
            };
            let _ = tx.lock().unwrap().take().unwrap().send(outcome);
        }
    })
    .await;
    let pool = Pool::new(ClientSettings::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let cfg = c.client_config();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        pool.connect(
            key(&c, server.addr),
            || dial(server.addr, cfg, dials.clone()),
            &request(80),
        ),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the server answered a CONNECT it never accepted"
    );
    let reason = tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .expect("the handler never learned that the client gave up")
        .unwrap();
    assert_eq!(reason, Some(h2::Reason::CANCEL));
}
