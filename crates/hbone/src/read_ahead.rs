//! [`ReadAhead`]: the socket under TLS, read in large chunks that grow with the traffic.
//!
//! rustls asks its transport for at most a few KiB at a time, so without a buffer in between a
//! bulk transfer costs one `recv` per TLS record or less. A fixed buffer is a trade between
//! syscalls and memory, and an extra copy of every byte: every pooled (client-side) HBONE
//! connection keeps one; the server reads its sockets directly, where the copy cost more
//! than the system calls it saved. This one starts small and doubles whenever a read fills
//! it, up to `MAX_READ_AHEAD`; an idle or chatty connection never grows it. Writes pass
//! straight through.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Size of the first buffer: about two full TLS records (16,406 bytes each on the wire).
const MIN_READ_AHEAD: usize = 32 * 1024;

/// Largest buffer. Measured end to end (BENCHMARKS.md): 256 KiB reads cut the receiving node
/// proxy's CPU per GB by 3-10 % against a fixed 64 KiB buffer; 128 KiB gained nothing
/// measurable.
const MAX_READ_AHEAD: usize = 256 * 1024;

/// A transport whose reads go through a buffer that grows from 32 KiB to 256 KiB while reads
/// keep filling it.
#[derive(Debug)]
pub struct ReadAhead<IO> {
    io: IO,
    /// Allocated on the first read that needs it; its length is the current read size.
    buf: Vec<u8>,
    /// Unread bytes are `buf[pos..filled]`.
    pos: usize,
    filled: usize,
}

impl<IO> ReadAhead<IO> {
    /// Wraps `io`; no buffer is allocated until the first read.
    pub fn new(io: IO) -> ReadAhead<IO> {
        ReadAhead {
            io,
            buf: Vec::new(),
            pos: 0,
            filled: 0,
        }
    }

    /// The current read size (0 before the first buffered read).
    pub fn read_size(&self) -> usize {
        self.buf.len()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for ReadAhead<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pos == this.filled {
            // Nothing buffered: a caller asking for at least a buffer's worth reads directly.
            let size = this.buf.len().max(MIN_READ_AHEAD);
            if out.remaining() >= size {
                return Pin::new(&mut this.io).poll_read(cx, out);
            }
            if this.buf.is_empty() {
                this.buf = vec![0; MIN_READ_AHEAD];
            }
            let mut into = ReadBuf::new(&mut this.buf);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut into))?;
            let n = into.filled().len();
            this.pos = 0;
            this.filled = n;
            if n == this.buf.len() && n < MAX_READ_AHEAD {
                // The socket had more than we could take: read more at a time from now on.
                this.buf.resize((n * 2).min(MAX_READ_AHEAD), 0);
            }
        }
        let n = (this.filled - this.pos).min(out.remaining());
        out.put_slice(&this.buf[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for ReadAhead<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt};

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[tokio::test]
    async fn bytes_arrive_intact_whatever_the_read_sizes() {
        let data = pattern(3 << 20);
        let (mut tx, rx) = duplex(1 << 20);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            for chunk in sent.chunks(100_003) {
                tx.write_all(chunk).await.unwrap();
            }
        });
        let mut reader = ReadAhead::new(rx);
        let mut got = Vec::new();
        // Small asks (like rustls'), then a large one, in turn.
        let mut small = [0u8; 4096];
        let mut large = vec![0u8; 512 * 1024];
        let mut turn = 0usize;
        while got.len() < data.len() {
            let buf: &mut [u8] = if turn % 5 == 4 {
                &mut large
            } else {
                &mut small
            };
            let n = reader.read(buf).await.unwrap();
            assert!(n > 0, "EOF before all bytes arrived");
            got.extend_from_slice(&buf[..n]);
            turn += 1;
        }
        writer.await.unwrap();
        assert_eq!(got, data);
    }

    #[tokio::test]
    async fn the_buffer_grows_only_while_reads_fill_it() {
        let (mut tx, rx) = duplex(4 << 20);
        let mut reader = ReadAhead::new(rx);
        assert_eq!(
            reader.read_size(),
            0,
            "nothing allocated before the first read"
        );

        // A chatty peer: small messages never grow the buffer.
        let mut small = [0u8; 1024];
        for _ in 0..20 {
            tx.write_all(&[1u8; 100]).await.unwrap();
            let n = reader.read(&mut small).await.unwrap();
            assert_eq!(n, 100);
        }
        assert_eq!(reader.read_size(), MIN_READ_AHEAD);

        // Bulk: with plenty waiting, every fill is full and the size doubles up to the cap.
        tx.write_all(&vec![2u8; 3 << 20]).await.unwrap();
        let mut sizes = vec![reader.read_size()];
        let mut left = 3 << 20;
        while left > 0 {
            left -= reader.read(&mut small).await.unwrap();
            if *sizes.last().unwrap() != reader.read_size() {
                sizes.push(reader.read_size());
            }
        }
        assert_eq!(
            sizes,
            [32, 64, 128, 256].map(|k| k * 1024),
            "doubling from the first size to the cap, never beyond"
        );
    }

    #[tokio::test]
    async fn a_large_read_with_nothing_buffered_goes_straight_to_the_transport() {
        let (mut tx, rx) = duplex(1 << 20);
        let mut reader = ReadAhead::new(rx);
        tx.write_all(&pattern(300 * 1024)).await.unwrap();
        let mut large = vec![0u8; 512 * 1024];
        let n = reader.read(&mut large).await.unwrap();
        // More than the largest buffer could have handed over, and no buffer was made.
        assert_eq!(n, 300 * 1024);
        assert_eq!(&large[..n], &pattern(300 * 1024)[..]);
        assert_eq!(reader.read_size(), 0);
    }

    #[tokio::test]
    async fn writes_and_shutdown_pass_through() {
        let (a, mut b) = duplex(1024);
        let mut wrapped = ReadAhead::new(a);
        wrapped.write_all(b"hello").await.unwrap();
        wrapped.shutdown().await.unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello");
    }
}
