//! Relaying a proxied connection: the drain-aware relays the listeners use, and the
//! bidirectional byte copy between two sockets, keeping TCP
//! half-close: EOF on one side becomes a write shutdown on the other. An error in either
//! direction ends both, so a reset on one leg is never left hanging on the other.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use ambit_hbone::H2Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::Error;
use crate::telemetry::ConnectionResult;
use ambit_runtime::drain::DrainWatcher;

/// Relays `client` <-> `server` until both finish, or the drain deadline forces a close;
/// bytes are counted into the connection's record as they move. A failure on one leg
/// resets both, so a reset reaches the other app as a reset, not as a clean close.
pub(crate) async fn proxy_bytes(
    result: &ConnectionResult,
    mut client: TcpStream,
    mut server: TcpStream,
    drain: &DrainWatcher,
) -> Result<(), Error> {
    let bytes = &result.bytes;
    let copy = relay_tcp(
        &mut client,
        &mut server,
        &bytes.client_to_server,
        &bytes.server_to_client,
    );
    classify(until_forced(copy, drain).await?)
}

/// [`copy_bidirectional`] between two TCP connections, both reset when it fails.
async fn relay_tcp(
    client: &mut TcpStream,
    server: &mut TcpStream,
    client_to_server: &AtomicU64,
    server_to_client: &AtomicU64,
) -> io::Result<()> {
    let copied = copy_bidirectional(
        &mut *client,
        &mut *server,
        client_to_server,
        server_to_client,
    )
    .await;
    if copied.is_err() {
        crate::socket::reset_on_close(client);
        crate::socket::reset_on_close(server);
    }
    copied
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
/// A failure resets the stream (`CONNECT_ERROR`) and the app's connection.
pub(crate) async fn proxy_tunnel(
    result: &ConnectionResult,
    tunnel: &mut H2Stream,
    mut app: TcpStream,
    side: TunnelSide,
    drain: &DrainWatcher,
) -> Result<(), Error> {
    let bytes = &result.bytes;
    let (to_tunnel, from_tunnel) = match side {
        TunnelSide::Server => (&bytes.client_to_server, &bytes.server_to_client),
        TunnelSide::Client => (&bytes.server_to_client, &bytes.client_to_server),
    };
    let copied = until_forced(tunnel.splice(&mut app, to_tunnel, from_tunnel), drain).await?;
    if copied.is_err() {
        crate::socket::reset_on_close(&app);
    }
    classify(copied)
}

/// The copy's own result, or the drain deadline's error.
async fn until_forced<T>(
    copy: impl std::future::Future<Output = T>,
    drain: &DrainWatcher,
) -> Result<T, Error> {
    tokio::select! {
        r = copy => Ok(r),
        _ = drain.forced() => Err(Error::DrainDeadline),
    }
}

/// A peer that went away ends the connection; any other error fails it.
fn classify(copied: io::Result<()>) -> Result<(), Error> {
    match copied {
        Ok(()) => Ok(()),
        Err(e) if peer_went_away(&e) => {
            tracing::debug!(error = %e, "a peer went away mid-connection");
            Ok(())
        }
        Err(e) => Err(Error::Relay(e)),
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
        // A read error is reported as is: no write shutdown first, or the other side would
        // read a clean end of stream before the caller's reset.
        let n = reader.read(&mut buf).await?;
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
    use tokio::net::TcpListener;

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

    /// Aborts `stream`: the peer reads ECONNRESET.
    fn abort(stream: TcpStream) {
        crate::socket::reset_on_close(&stream);
        drop(stream);
    }

    /// What the app reads next: bytes, a clean end of stream, or a reset.
    async fn next_read(app: &mut TcpStream) -> io::Result<usize> {
        let mut buf = [0u8; 16];
        tokio::time::timeout(Duration::from_secs(5), app.read(&mut buf))
            .await
            .expect("the app's connection was closed, not left hanging")
    }

    #[tokio::test]
    async fn a_reset_on_one_leg_resets_the_other() {
        for upstream_resets in [true, false] {
            let (app, mut proxy_client_side) = tcp_pair().await;
            let (mut proxy_server_side, upstream) = tcp_pair().await;
            let relay = tokio::spawn(async move {
                let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
                relay_tcp(&mut proxy_client_side, &mut proxy_server_side, &up, &down).await
            });
            // One side aborts while the other is idle and would otherwise wait forever.
            let mut survivor = if upstream_resets {
                abort(upstream);
                app
            } else {
                abort(app);
                upstream
            };
            let result = tokio::time::timeout(Duration::from_secs(5), relay)
                .await
                .expect("the relay ended")
                .unwrap();
            assert!(result.is_err(), "a reset is reported as an error");
            let read = next_read(&mut survivor).await;
            assert_eq!(
                read.map_err(|e| e.kind()),
                Err(io::ErrorKind::ConnectionReset),
                "the other side sees a reset, not a clean end (upstream reset: {upstream_resets})"
            );
        }
    }

    #[tokio::test]
    async fn a_clean_close_stays_clean() {
        let (mut app, mut proxy_client_side) = tcp_pair().await;
        let (mut proxy_server_side, mut upstream) = tcp_pair().await;
        let relay = tokio::spawn(async move {
            let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
            relay_tcp(&mut proxy_client_side, &mut proxy_server_side, &up, &down).await
        });
        upstream.write_all(b"bye").await.unwrap();
        drop(upstream);
        assert_eq!(next_read(&mut app).await.unwrap(), 3);
        assert_eq!(next_read(&mut app).await.unwrap(), 0, "a FIN, not a reset");
        app.shutdown().await.unwrap();
        relay.await.unwrap().unwrap();
    }

    #[test]
    fn a_peer_that_went_away_closes_the_connection_without_failing_it() {
        for kind in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::UnexpectedEof,
        ] {
            assert!(classify(Err(io::Error::from(kind))).is_ok(), "{kind:?}");
        }
        let error = classify(Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad record",
        )))
        .unwrap_err();
        assert_eq!(error.response_flag(), crate::telemetry::ResponseFlag::None);
        assert_eq!(error.to_string(), "io error: bad record");
    }

    #[tokio::test]
    async fn the_drain_deadline_ends_a_relay() {
        let (trigger, watcher) = ambit_runtime::drain::new();
        let forever = std::future::pending::<io::Result<()>>();
        let forced = tokio::spawn(async move { until_forced(forever, &watcher).await });
        trigger.drain_now().await;
        let error = forced.await.unwrap().unwrap_err();
        assert!(matches!(error, Error::DrainDeadline), "{error}");
    }

    #[test]
    fn buffers_grow_with_the_traffic() {
        assert_eq!(buffer_size_for(0), 8 * 1024);
        assert_eq!(buffer_size_for(256 * 1024), 64 * 1024);
        assert_eq!(buffer_size_for(100 << 20), 256 * 1024);
    }
}
