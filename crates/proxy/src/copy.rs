//! Bidirectional byte copy between the two legs of a proxied connection, keeping TCP
//! half-close: EOF on one side becomes a write shutdown on the other.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Per-direction buffer. Large enough for line-rate copies over loopback and veth, small
/// enough that an idle connection costs little (buffers exist only while copying).
const BUFFER_SIZE: usize = 64 * 1024;

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
    let (up, down) = tokio::join!(upstream, downstream);
    up.and(down)
}

async fn copy_one_way<R, W>(reader: &mut R, writer: &mut W, counter: &AtomicU64) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUFFER_SIZE];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            // Pass the half-close on; the other direction keeps going.
            return writer.shutdown().await;
        }
        writer.write_all(&buf[..n]).await?;
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

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
}
