//! Relaying a proxied connection: the drain-aware relays the listeners use, and the
//! bidirectional byte copy between two sockets, keeping TCP
//! half-close: EOF on one side becomes a write shutdown on the other. An error in either
//! direction ends both, so a reset on one leg is never left hanging on the other.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use ambit_hbone::H2Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::drain::DrainWatcher;
use crate::telemetry::{ConnectionResult, ResponseFlag};

/// Relays `client` <-> `server` until both finish, or the drain deadline forces a close;
/// bytes are counted into the connection's record as they move.
pub(crate) async fn proxy_bytes<C, S>(
    result: &ConnectionResult,
    client: C,
    server: S,
    drain: &DrainWatcher,
) -> Result<(), (ResponseFlag, String)>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let bytes = &result.bytes;
    let copy = copy_bidirectional(
        client,
        server,
        &bytes.client_to_server,
        &bytes.server_to_client,
    );
    until_forced(copy, drain).await
}

/// Which end of the connection an HBONE tunnel leads to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum TunnelSide {
    /// Outbound: the tunnel leads to the server, `io` is the client.
    Server,
    /// Inbound: the tunnel comes from the client, `io` is the server (the app).
    Client,
}

/// Like [`proxy_bytes`] for a leg that is an HBONE tunnel: spliced without extra copies.
pub(crate) async fn proxy_tunnel<S>(
    result: &ConnectionResult,
    tunnel: &mut H2Stream,
    io: S,
    side: TunnelSide,
    drain: &DrainWatcher,
) -> Result<(), (ResponseFlag, String)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let bytes = &result.bytes;
    let (to_tunnel, from_tunnel) = match side {
        TunnelSide::Server => (&bytes.client_to_server, &bytes.server_to_client),
        TunnelSide::Client => (&bytes.server_to_client, &bytes.client_to_server),
    };
    until_forced(tunnel.splice(io, to_tunnel, from_tunnel), drain).await
}

async fn until_forced(
    copy: impl std::future::Future<Output = io::Result<()>>,
    drain: &DrainWatcher,
) -> Result<(), (ResponseFlag, String)> {
    tokio::select! {
        r = copy => match r {
            Ok(()) => Ok(()),
            Err(e) if peer_went_away(&e) => {
                tracing::debug!(error = %e, "a peer went away mid-connection");
                Ok(())
            }
            Err(e) => Err((ResponseFlag::None, format!("io error: {e}"))),
        },
        _ = drain.forced() => Err((ResponseFlag::None, "closed by drain deadline".into())),
    }
}

/// A reset, a broken pipe or an abrupt EOF from a peer ends the connection as ztunnel ends
/// it: closed, not failed (access log at info, no error).
fn peer_went_away(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::NotConnected
    )
}

/// Buffers grow with the traffic: an idle or chatty connection keeps a small one, a bulk
/// transfer gets a large one for fewer syscalls and larger TLS records.
const BUFFER_STEPS: [(u64, usize); 3] = [
    (0, 8 * 1024),
    (256 * 1024, 64 * 1024),
    (16 << 20, 256 * 1024),
];

fn buffer_size_for(copied: u64) -> usize {
    BUFFER_STEPS
        .iter()
        .rev()
        .find(|(after, _)| copied >= *after)
        .map_or(BUFFER_STEPS[0].1, |(_, size)| *size)
}

/// Copies `client` <-> `server` until both directions finished. Counts bytes into
/// `client_to_server` and `server_to_client` as they move.
pub async fn copy_bidirectional<C, S>(
    client: C,
    server: S,
    client_to_server: &AtomicU64,
    server_to_client: &AtomicU64,
) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut server_r, mut server_w) = tokio::io::split(server);
    let upstream = copy_one_way(&mut client_r, &mut server_w, client_to_server);
    let downstream = copy_one_way(&mut server_r, &mut client_w, server_to_client);
    // The first error drops both directions (and with them both connections).
    tokio::try_join!(upstream, downstream).map(|_| ())
}

async fn copy_one_way<R, W>(reader: &mut R, writer: &mut W, counter: &AtomicU64) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut copied = 0u64;
    let mut buf = vec![0u8; buffer_size_for(0)];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                // Tell the other side we are done before reporting the failure.
                let _ = writer.shutdown().await;
                return Err(e);
            }
        };
        if n == 0 {
            // Pass the half-close on; the other direction keeps going.
            return match writer.shutdown().await {
                Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
                other => other,
            };
        }
        writer.write_all(&buf[..n]).await?;
        counter.fetch_add(n as u64, Ordering::Relaxed);
        copied += n as u64;
        let wanted = buffer_size_for(copied);
        if wanted > buf.len() {
            buf.resize(wanted, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::duplex;
    use tokio::net::{TcpListener, TcpStream};

    #[tokio::test]
    async fn half_close_passes_through_and_bytes_are_counted() {
        let (mut app, proxy_client_side) = duplex(1024);
        let (proxy_server_side, mut upstream) = duplex(1024);
        let up = AtomicU64::new(0);
        let down = AtomicU64::new(0);
        let copier = async {
            copy_bidirectional(proxy_client_side, proxy_server_side, &up, &down)
                .await
                .unwrap()
        };
        let peers = async {
            app.write_all(b"hello").await.unwrap();
            app.shutdown().await.unwrap();
            let mut got = Vec::new();
            upstream.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"hello");
            // The upstream still answers after the client's half-close.
            upstream.write_all(b"world!").await.unwrap();
            upstream.shutdown().await.unwrap();
            let mut back = Vec::new();
            app.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, b"world!");
        };
        tokio::join!(copier, peers);
        assert_eq!(up.load(Ordering::Relaxed), 5);
        assert_eq!(down.load(Ordering::Relaxed), 6);
    }

    async fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn a_reset_on_one_leg_closes_the_other() {
        let (app, proxy_client_side) = tcp_pair().await;
        let (proxy_server_side, upstream) = tcp_pair().await;
        let up = AtomicU64::new(0);
        let down = AtomicU64::new(0);
        let copier = tokio::spawn(async move {
            copy_bidirectional(proxy_client_side, proxy_server_side, &up, &down).await
        });
        // The upstream aborts (RST) while the app is idle and would otherwise wait forever.
        socket2::SockRef::from(&upstream)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(upstream);
        let result = tokio::time::timeout(Duration::from_secs(5), copier)
            .await
            .expect("the copy ended")
            .unwrap();
        assert!(result.is_err(), "a reset is reported as an error");
        let mut app = app;
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), app.read(&mut buf))
            .await
            .expect("the app's connection was closed, not left hanging");
        assert!(matches!(read, Ok(0) | Err(_)));
    }

    #[tokio::test]
    async fn a_peer_reset_closes_the_connection_without_failing_it() {
        let (app, proxy_client_side) = tcp_pair().await;
        let (proxy_server_side, upstream) = tcp_pair().await;
        let (_trigger, watcher) = crate::drain::new();
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let copy = copy_bidirectional(proxy_client_side, proxy_server_side, &up, &down);
        socket2::SockRef::from(&upstream)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(upstream);
        let outcome = tokio::time::timeout(Duration::from_secs(5), until_forced(copy, &watcher))
            .await
            .expect("the copy ended");
        assert_eq!(outcome, Ok(()));
        drop(app);
    }

    #[tokio::test]
    async fn other_io_errors_fail_the_connection() {
        let (_trigger, watcher) = crate::drain::new();
        let copy = async { Err(io::Error::new(io::ErrorKind::InvalidData, "bad record")) };
        let (flag, message) = until_forced(copy, &watcher).await.unwrap_err();
        assert_eq!(flag, ResponseFlag::None);
        assert!(message.contains("bad record"), "{message}");
    }

    #[test]
    fn buffers_grow_with_the_traffic() {
        assert_eq!(buffer_size_for(0), 8 * 1024);
        assert_eq!(buffer_size_for(256 * 1024), 64 * 1024);
        assert_eq!(buffer_size_for(100 << 20), 256 * 1024);
    }
}
