//! The `hbone_server` target: ambit's HBONE server driven by bytes from a client that owes
//! us nothing, where the TLS ClientHello should be or (past TLS) as HTTP/2 frames.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ambit_hbone::{H2Settings, PeerInfo};
use ambit_identity::{CertificateAuthority, SpiffeId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The client connection preface (RFC 9113 §3.4), which `Mode::Http2` puts in front of the
/// input so the fuzzer spends its time on frames.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Debug, PartialEq, Eq)]
pub enum Mode {
    /// The bytes arrive where the TLS ClientHello should.
    Tls,
    /// The bytes arrive after TLS, as HTTP/2 frames (the preface is added).
    Http2,
}

/// What the server made of the input.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The `:authority` of every CONNECT the server handed to the handler, and whether it
    /// validated.
    pub connects: Vec<(String, bool)>,
    /// How the connection ended.
    pub ended: Option<Result<(), String>>,
}

fn tls_config() -> Arc<rustls::ServerConfig> {
    static CONFIG: OnceLock<Arc<rustls::ServerConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let ca = CertificateAuthority::ephemeral("cluster.local").expect("an ephemeral CA");
            let id = SpiffeId::new("cluster.local", "default", "server").expect("an id");
            let cert = ca
                .issue(&id, Duration::from_secs(86_400))
                .expect("a certificate");
            ambit_identity::server_config(&cert).expect("a server config")
        })
        .clone()
}

/// The target's body: byte 0 picks the mode (even: TLS, odd: HTTP/2, the client preface
/// added), the rest is what the client sends; it then only reads until the server closes.
///
/// Checks: whatever the bytes, the connection ends (time is virtual, every wait is
/// bounded), and without a TLS handshake no request reaches the handler.
pub fn run(data: &[u8]) -> Outcome {
    let outcome = drive(data);
    if !data.is_empty() {
        assert!(outcome.ended.is_some(), "the connection never ended");
    }
    if data.first().is_some_and(|m| m % 2 == 0) {
        assert!(outcome.connects.is_empty(), "{:?}", outcome.connects);
    }
    outcome
}

/// Serves `data` (laid out as for [`run`]). Time is virtual (tokio's paused clock), so the
/// server's timeouts end a connection the input leaves hanging without slowing the fuzzer.
fn drive(data: &[u8]) -> Outcome {
    let Some((&mode, input)) = data.split_first() else {
        return Outcome::default();
    };
    let mode = if mode % 2 == 0 {
        Mode::Tls
    } else {
        Mode::Http2
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(serve(mode, input))
}

async fn serve(mode: Mode, input: &[u8]) -> Outcome {
    let (server_io, mut client) = tokio::io::duplex(64 * 1024);
    let bytes = match mode {
        Mode::Tls => input.to_vec(),
        Mode::Http2 => [PREFACE, input].concat(),
    };
    // The client writes everything, then reads whatever the server says until the server
    // closes: the server's own timeouts (idle, PING, handshake) end what the input leaves
    // open.
    let client_task = tokio::spawn(async move {
        let _ = client.write_all(&bytes).await;
        let mut sink = vec![0u8; 16 * 1024];
        while let Ok(n) = client.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    });
    let addr: SocketAddr = "10.0.0.1:40000".parse().expect("an address");
    let local_addr: SocketAddr = "10.0.0.2:15008".parse().expect("an address");
    let settings = H2Settings::default();
    let connects = Arc::new(Mutex::new(Vec::new()));
    let seen = connects.clone();
    let handler = move |incoming: ambit_hbone::IncomingConnect| {
        let seen = seen.clone();
        async move {
            let authority = incoming
                .request()
                .uri
                .authority()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let valid = incoming.validate().is_ok();
            seen.lock().expect("not poisoned").push((authority, valid));
            if valid {
                // A tunnel the client may write into; dropping it ends the stream.
                if let Ok(mut stream) = incoming.accept(http::HeaderMap::new()) {
                    let mut buf = [0u8; 1024];
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await;
                }
            } else {
                incoming.reject(http::StatusCode::BAD_REQUEST);
            }
        }
    };
    let (_shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
    let ended = match mode {
        Mode::Tls => {
            ambit_hbone::serve(
                server_io,
                addr,
                local_addr,
                tls_config(),
                settings,
                shutdown,
                handler,
            )
            .await
        }
        Mode::Http2 => {
            let peer = Arc::new(PeerInfo {
                addr,
                local_addr,
                certificates: Vec::new(),
            });
            let deadline = tokio::time::Instant::now() + ambit_hbone::tls::HANDSHAKE_TIMEOUT;
            match ambit_hbone::accept_h2(server_io, peer, settings, deadline).await {
                Ok(accepted) => accepted.serve(shutdown, handler).await,
                Err(e) => Err(e),
            }
        }
    };
    // Let the handlers the connection spawned run to their end (virtual time).
    tokio::time::sleep(Duration::from_secs(2)).await;
    client_task.abort();
    let connects = std::mem::take(&mut *connects.lock().expect("not poisoned"));
    Outcome {
        connects,
        ended: Some(ended.map_err(|e| e.to_string())),
    }
}
