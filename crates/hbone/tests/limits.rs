//! What a client can make the server hold: idle connections are closed, and a client that
//! opens streams too fast is told to calm down.

mod common;

use std::time::Duration;

use ambit_hbone::{H2Settings, HboneError};
use bytes::Bytes;
use common::*;
use http::StatusCode;

/// A raw HTTP/2 client over HBONE's TLS: the request sender and the connection's end.
async fn raw_client(
    c: &Certs,
    addr: std::net::SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = ambit_hbone::tls::connect(tcp, c.client_config())
        .await
        .unwrap();
    let (send, conn) = h2::client::handshake(tls).await.unwrap();
    (send, tokio::spawn(conn))
}

fn connect() -> http::Request<()> {
    http::Request::builder()
        .method("CONNECT")
        .uri("127.0.0.1:80")
        .body(())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_streams_is_closed_once_idle() {
    let c = certs();
    let settings = H2Settings {
        idle_timeout: Duration::from_millis(300),
        ..fast_settings()
    };
    let server = TestServer::start(c.server_config(), settings, echo).await;

    // A stream held open longer than the idle timeout keeps the connection.
    let (send, conn) = raw_client(&c, server.addr).await;
    let mut send = send.ready().await.unwrap();
    let (resp, mut body) = send.send_request(connect(), false).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut up = resp.into_body();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        !conn.is_finished(),
        "a connection with an open stream was closed"
    );
    body.send_data(Bytes::from_static(b"ping"), true).unwrap();
    let echoed = up.data().await.unwrap().unwrap();
    assert_eq!(&echoed[..], b"ping");
    while up.data().await.is_some() {}

    // Without streams, it is closed with GOAWAY NO_ERROR: a clean end for both.
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the idle connection was closed")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
    assert!(server.next_result().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_opening_streams_too_fast_gets_enhance_your_calm() {
    let c = certs();
    let settings = H2Settings {
        max_stream_rate: 1,
        stream_burst: 5,
        ..fast_settings()
    };
    let server = TestServer::start(c.server_config(), settings, echo).await;
    let (mut send, conn) = raw_client(&c, server.addr).await;
    // The burst is served.
    for _ in 0..5 {
        send = send.ready().await.unwrap();
        let (resp, _body) = send.send_request(connect(), false).unwrap();
        assert_eq!(resp.await.unwrap().status(), StatusCode::OK);
    }
    // The next stream at once is one too many: the whole connection goes.
    send = send.ready().await.unwrap();
    let _ = send.send_request(connect(), false);
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the abusive connection was closed")
        .unwrap();
    let e = ended.expect_err("closed with an error code");
    assert!(e.is_go_away(), "{e}");
    assert_eq!(e.reason(), Some(h2::Reason::ENHANCE_YOUR_CALM), "{e}");
    assert!(matches!(
        server.next_result().await,
        Err(HboneError::StreamRate(1))
    ));
}
