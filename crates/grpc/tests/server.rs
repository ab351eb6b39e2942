//! `ambit_grpc::server::incoming` on loopback with a plain rustls client: the peer address,
//! skipped handshakes, the handshake timeout, the connection cap, and stopping.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambit_grpc::server::{incoming, incoming_until, test_pki, AcceptOptions, TestPki};
use ambit_grpc::RootCa;
use futures_util::StreamExt;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;

async fn listen() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// Only a hang fails on this: a server that closes, accepts or refuses does so long before.
const HANG: Duration = Duration::from_secs(60);

/// A TLS client trusting the test root: the stream and its local address, or the handshake's
/// error (a refused connection).
async fn try_client(
    pki: &TestPki,
    addr: SocketAddr,
) -> std::io::Result<(TlsStream<TcpStream>, SocketAddr)> {
    let roots = RootCa::Inline(pki.root_pem.clone()).load().unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    let local = tcp.local_addr()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tls = tokio::time::timeout(
        HANG,
        connector.connect(ServerName::try_from("localhost").unwrap(), tcp),
    )
    .await
    .expect("the TLS handshake neither finished nor failed")?;
    Ok((tls, local))
}

/// A client the server must take.
async fn client(pki: &TestPki, addr: SocketAddr) -> (TlsStream<TcpStream>, SocketAddr) {
    try_client(pki, addr).await.expect("the handshake failed")
}

/// Waits for the server to close `tcp` (reading past a TLS alert).
async fn wait_closed(mut tcp: TcpStream) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(HANG, tcp.read_to_end(&mut rest))
        .await
        .expect("the server never closed the connection");
    assert!(rest.len() < 64, "{read:?} {rest:?}");
}

#[tokio::test]
async fn a_failed_handshake_is_skipped_and_a_connection_carries_its_peer_address() {
    let pki = test_pki(&["localhost"]);
    let (listener, addr) = listen().await;
    let mut conns = incoming(listener, pki.acceptor(), AcceptOptions::default());

    let mut junk = TcpStream::connect(addr).await.unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let (mut tls, local) = client(&pki, addr).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    tls.write_all(b"ping").await.unwrap();

    let mut conn = tokio::time::timeout(Duration::from_secs(5), conns.next())
        .await
        .expect("no connection")
        .expect("the stream ended")
        .unwrap();
    assert_eq!(conn.peer_addr(), Some(local));
    assert_eq!(conn.local_addr(), Some(addr));
    let info = tonic::transport::server::Connected::connect_info(&conn);
    assert_eq!(info.remote_addr(), Some(local));
    let mut buf = [0u8; 4];
    conn.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    conn.write_all(b"pong").await.unwrap();
    conn.flush().await.unwrap();
    tls.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"pong");
    wait_closed(junk).await;
}

/// The handshake timeout of [`a_silent_client_times_out_and_holds_the_only_slot_until_then`].
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// A client over the cap is refused without a handshake (one within the cap would have
/// it); the silent client is closed by the handshake timeout, not before it; then its slot
/// is free. Outcomes only, and the one time checked is a lower bound (a loaded machine only
/// makes it later).
#[tokio::test]
async fn a_silent_client_times_out_and_holds_the_only_slot_until_then() {
    let pki = test_pki(&["localhost"]);
    let (listener, addr) = listen().await;
    let options = AcceptOptions {
        handshake_timeout: Some(HANDSHAKE_TIMEOUT),
        max_connections: Some(1),
    };
    let mut conns = incoming(listener, pki.acceptor(), options);

    let silent = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    // Over the cap while the silent one handshakes: closed with no handshake.
    let refused = try_client(&pki, addr).await;
    assert!(refused.is_err(), "a client over the cap got a handshake");
    wait_closed(silent).await;
    let waited = started.elapsed();
    assert!(
        waited >= HANDSHAKE_TIMEOUT - Duration::from_millis(100),
        "the silent client was closed before its handshake timeout, after {waited:?}"
    );

    // Its slot is free again: the next client gets through.
    let (_tls, local) = client(&pki, addr).await;
    let conn = tokio::time::timeout(HANG, conns.next())
        .await
        .expect("no connection")
        .expect("the stream ended")
        .unwrap();
    assert_eq!(conn.peer_addr(), Some(local));
    // While it is open it holds the slot.
    let refused = try_client(&pki, addr).await;
    assert!(refused.is_err(), "a client over the cap got a handshake");
    drop(conn);
    let (_tls, _) = client(&pki, addr).await;
    assert!(tokio::time::timeout(HANG, conns.next())
        .await
        .expect("no connection after the slot was freed")
        .is_some());
}

#[tokio::test]
async fn stopping_closes_the_listener_and_ends_the_stream() {
    let pki = test_pki(&["localhost"]);
    let (listener, addr) = listen().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut conns = incoming_until(listener, pki.acceptor(), AcceptOptions::default(), async {
        let _ = stopped.await;
    });
    client(&pki, addr).await;
    assert!(conns.next().await.is_some());
    stop.send(()).unwrap();
    assert!(tokio::time::timeout(Duration::from_secs(5), conns.next())
        .await
        .expect("the stream did not end")
        .is_none());
    let err = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
}
